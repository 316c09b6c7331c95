//! Free capacity per node and device, with indexes for best-fit placement.
//!
//! Invariant: for every device, `free` + shares held by allocations = 1000; for every node,
//! free CPU and memory + what allocations hold = the node's size. `Engine::audit` checks both.

use std::collections::BTreeSet;

use crate::decision::{DeviceShare, MemberPlacement, Placement};
use crate::ids::{ModelId, NodeId, SHARES_PER_GPU};
use crate::model::GpuRequest;
use crate::topology::Domains;

const FULL: u32 = SHARES_PER_GPU as u32;

#[derive(Clone, Debug)]
pub(crate) struct DeviceCap {
    pub model: ModelId,
    pub island: u32,
    pub free: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct NodeCap {
    pub cpu_total: u64,
    pub mem_total: u64,
    pub free_cpu: u64,
    pub free_mem: u64,
    pub devices: Vec<DeviceCap>,
}

impl NodeCap {
    pub(crate) fn whole_free(&self, model: ModelId) -> u32 {
        self.devices.iter().filter(|d| d.model == model && d.free == FULL).count() as u32
    }
    pub(crate) fn fits_host(&self, cpu: u64, mem: u64) -> bool {
        self.free_cpu >= cpu && self.free_mem >= mem
    }
}

/// How a gang's members may be laid out over nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Layout {
    /// All members on one node.
    SameNode,
    /// One node when one has room, else as `Spread`.
    PreferSameNode,
    /// Any nodes; spread minimised (one rack, else one pool) together with fragmentation
    /// (`Capacity::find_spread`).
    Spread,
}

impl Layout {
    pub(crate) fn of(same_node: bool, prefer_same_node: bool) -> Layout {
        match (same_node, prefer_same_node) {
            (true, _) => Layout::SameNode,
            (false, true) => Layout::PreferSameNode,
            (false, false) => Layout::Spread,
        }
    }
}

/// One member's shape, as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct MemberShape {
    pub gpus: GpuRequest,
    pub cpu: u64,
    pub mem: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Capacity {
    pub nodes: Vec<NodeCap>,
    /// Per model: (whole free devices, node) for every node that has the model.
    whole_index: Vec<BTreeSet<(u32, NodeId)>>,
    /// Per model: (free shares, node, device) for every device with some free shares.
    share_index: Vec<BTreeSet<(u32, NodeId, u16)>>,
    /// Per model: (whole devices, node) with the node's size when empty, for "never fits" checks.
    pub max_devices_per_node: Vec<u32>,
    pub free_whole: Vec<u64>,
    pub free_shares: Vec<u64>,
    /// Racks and pools with their free capacity, for gang spread (`topology.rs`).
    pub domains: Domains,
}

impl Capacity {
    pub fn new(nodes: Vec<NodeCap>, model_count: usize) -> Capacity {
        let mut cap = Capacity {
            nodes,
            whole_index: vec![BTreeSet::new(); model_count],
            share_index: vec![BTreeSet::new(); model_count],
            max_devices_per_node: vec![0; model_count],
            free_whole: vec![0; model_count],
            free_shares: vec![0; model_count],
            domains: Domains::default(),
        };
        for (n, node) in cap.nodes.iter().enumerate() {
            let node_id = NodeId(n as u32);
            let mut models: BTreeSet<ModelId> = BTreeSet::new();
            for (d, dev) in node.devices.iter().enumerate() {
                models.insert(dev.model);
                let m = dev.model.0 as usize;
                if dev.free > 0 {
                    cap.share_index[m].insert((dev.free, node_id, d as u16));
                }
                cap.free_shares[m] += u64::from(dev.free);
                if dev.free == FULL {
                    cap.free_whole[m] += 1;
                }
            }
            for model in models {
                let m = model.0 as usize;
                let count = node.devices.iter().filter(|d| d.model == model).count() as u32;
                cap.max_devices_per_node[m] = cap.max_devices_per_node[m].max(count);
                cap.whole_index[m].insert((node.whole_free(model), node_id));
            }
        }
        cap
    }

    /// Largest whole free block of `model`: (devices, node).
    pub fn largest_block(&self, model: ModelId) -> Option<(u32, NodeId)> {
        self.whole_index.get(model.0 as usize).and_then(|s| s.last().copied())
    }

    pub fn nodes_with_free(&self, model: ModelId) -> u32 {
        self.whole_index
            .get(model.0 as usize)
            .map(|s| s.range((1, NodeId(0))..).count() as u32)
            .unwrap_or(0)
    }

    /// Most shares a single device of `model` has free.
    pub fn largest_share_gap(&self, model: ModelId) -> u32 {
        self.share_index.get(model.0 as usize).and_then(|s| s.last()).map(|e| e.0).unwrap_or(0)
    }

    fn set_device_free(&mut self, node: NodeId, device: u16, new_free: u32) {
        let (model, old_free) = {
            let dev = &self.nodes[node.0 as usize].devices[device as usize];
            (dev.model, dev.free)
        };
        if old_free == new_free {
            return;
        }
        let m = model.0 as usize;
        let old_whole = self.nodes[node.0 as usize].whole_free(model);
        if old_free > 0 {
            self.share_index[m].remove(&(old_free, node, device));
        }
        if new_free > 0 {
            self.share_index[m].insert((new_free, node, device));
        }
        self.free_shares[m] = self.free_shares[m] + u64::from(new_free) - u64::from(old_free);
        self.nodes[node.0 as usize].devices[device as usize].free = new_free;
        self.domains.shares_changed(node, model, old_free, new_free);
        if old_free == FULL || new_free == FULL {
            let new_whole = self.nodes[node.0 as usize].whole_free(model);
            self.domains.whole_changed(node, model, old_whole, new_whole);
            self.whole_index[m].remove(&(old_whole, node));
            self.whole_index[m].insert((new_whole, node));
            if new_free == FULL {
                self.free_whole[m] += 1;
            } else {
                self.free_whole[m] -= 1;
            }
        }
    }

    /// Takes what a placement holds. The caller guarantees it was found free.
    pub fn take(&mut self, placement: &Placement, cpu: u64, mem: u64) {
        for member in &placement.members {
            let node = &mut self.nodes[member.node.0 as usize];
            node.free_cpu = node.free_cpu.saturating_sub(cpu);
            node.free_mem = node.free_mem.saturating_sub(mem);
            for ds in &member.devices {
                let free = self.nodes[member.node.0 as usize].devices[ds.device as usize].free;
                self.set_device_free(member.node, ds.device, free.saturating_sub(ds.shares));
            }
        }
    }

    /// Gives back what `take` took; an exact inverse.
    pub fn give(&mut self, placement: &Placement, cpu: u64, mem: u64) {
        for member in &placement.members {
            let node = &mut self.nodes[member.node.0 as usize];
            node.free_cpu = (node.free_cpu + cpu).min(node.cpu_total);
            node.free_mem = (node.free_mem + mem).min(node.mem_total);
            for ds in &member.devices {
                let free = self.nodes[member.node.0 as usize].devices[ds.device as usize].free;
                self.set_device_free(member.node, ds.device, (free + ds.shares).min(FULL));
            }
        }
    }

    /// Placement of a gang on `model` (or CPU-only when the request is zero GPUs) in the given
    /// layout: one node (`find_same_node`), or spread as little as possible
    /// (`find_spread`). Nothing is kept: the capacity is unchanged when this returns.
    pub fn find(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        layout: Layout,
    ) -> Option<Placement> {
        if members <= 1 {
            return self.find_each(model, shape, members);
        }
        match layout {
            Layout::SameNode => self.find_same_node(model, shape, members),
            Layout::PreferSameNode => self
                .find_same_node(model, shape, members)
                .or_else(|| self.find_spread(model, shape, members)),
            Layout::Spread => self.find_spread(model, shape, members),
        }
    }

    /// Whether `find` would succeed, without refining where: a spread gang fits exactly when
    /// its members fit one by one (`find_each`), whatever racks they land in.
    pub fn can_place(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
        layout: Layout,
    ) -> bool {
        match layout {
            Layout::SameNode if members > 1 => self.find_same_node(model, shape, members).is_some(),
            _ => self.find_each(model, shape, members).is_some(),
        }
    }

    /// Best-fit placement, member by member: each on the tightest node that fits, with the
    /// earlier members' devices taken, so that a gang never double-counts a device. For
    /// members of one size this places a gang whenever any placement exists (device-wise):
    /// a node with `f` free fits `f / k` members whatever the order.
    pub(crate) fn find_each(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
    ) -> Option<Placement> {
        let mut placed: Vec<MemberPlacement> = Vec::new();
        let mut ok = true;
        for _ in 0..members {
            match self.find_member(model, shape) {
                Some(member) => {
                    let one = Placement { model, members: vec![member.clone()] };
                    self.take(&one, shape.cpu, shape.mem);
                    placed.push(member);
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        let partial = Placement { model, members: placed };
        self.give(&partial, shape.cpu, shape.mem);
        ok.then_some(partial)
    }

    fn find_member(&self, model: Option<ModelId>, shape: MemberShape) -> Option<MemberPlacement> {
        match (model, shape.gpus) {
            (None, _) | (_, GpuRequest::Whole(0)) => self.find_host_only(shape.cpu, shape.mem),
            (Some(model), GpuRequest::Whole(k)) => {
                let index = self.whole_index.get(model.0 as usize)?;
                index.range((k, NodeId(0))..).find_map(|&(_, node_id)| {
                    let node = &self.nodes[node_id.0 as usize];
                    node.fits_host(shape.cpu, shape.mem).then(|| MemberPlacement {
                        node: node_id,
                        devices: pick_whole_devices(node, model, k),
                    })
                })
            }
            (Some(model), GpuRequest::Shares(s)) => {
                let index = self.share_index.get(model.0 as usize)?;
                index.range((s, NodeId(0), 0)..).find_map(|&(_, node_id, device)| {
                    let node = &self.nodes[node_id.0 as usize];
                    node.fits_host(shape.cpu, shape.mem).then(|| MemberPlacement {
                        node: node_id,
                        devices: vec![DeviceShare { device, shares: s }],
                    })
                })
            }
        }
    }

    fn find_host_only(&self, cpu: u64, mem: u64) -> Option<MemberPlacement> {
        // Tightest node by free CPU; CPU-only workloads are rare, so a scan is acceptable.
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.fits_host(cpu, mem))
            .min_by_key(|(i, n)| (n.free_cpu, *i))
            .map(|(i, _)| MemberPlacement { node: NodeId(i as u32), devices: Vec::new() })
    }

    fn find_same_node(
        &self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
    ) -> Option<Placement> {
        let cpu = shape.cpu.saturating_mul(u64::from(members));
        let mem = shape.mem.saturating_mul(u64::from(members));
        match (model, shape.gpus) {
            (None, _) | (_, GpuRequest::Whole(0)) => {
                let node = self.find_host_only(cpu, mem)?.node;
                let member = MemberPlacement { node, devices: Vec::new() };
                Some(Placement { model: None, members: vec![member; members as usize] })
            }
            (Some(model), GpuRequest::Whole(k)) => {
                let total = k.saturating_mul(members);
                let index = self.whole_index.get(model.0 as usize)?;
                index.range((total, NodeId(0))..).find_map(|&(_, node_id)| {
                    let node = &self.nodes[node_id.0 as usize];
                    if !node.fits_host(cpu, mem) {
                        return None;
                    }
                    let members = pick_members_on_node(node, model, k, members)
                        .into_iter()
                        .map(|devices| MemberPlacement { node: node_id, devices })
                        .collect();
                    Some(Placement { model: Some(model), members })
                })
            }
            (Some(model), GpuRequest::Shares(s)) => {
                // Try nodes in order of their tightest fitting device; pack members onto devices
                // of that node, tightest first.
                let index = self.share_index.get(model.0 as usize)?;
                let mut tried: BTreeSet<NodeId> = BTreeSet::new();
                for &(_, node_id, _) in index.range((s, NodeId(0), 0)..) {
                    if !tried.insert(node_id) {
                        continue;
                    }
                    let node = &self.nodes[node_id.0 as usize];
                    if !node.fits_host(cpu, mem) {
                        continue;
                    }
                    if let Some(members) = pack_shares(node, node_id, model, s, members) {
                        return Some(Placement { model: Some(model), members });
                    }
                }
                None
            }
        }
    }
}

/// Chooses the devices of `members` members of `k` whole devices each on one node that has
/// `k × members` free: all in the tightest island that holds the whole gang; else member by
/// member, each in the tightest island that holds it (so that a member straddles islands only
/// when no island has `k` left).
pub(crate) fn pick_members_on_node(
    node: &NodeCap,
    model: ModelId,
    k: u32,
    members: u32,
) -> Vec<Vec<DeviceShare>> {
    let total = k.saturating_mul(members);
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    let whole_gang =
        free_by_island(node, model, &taken).values().any(|v| v.len() >= total as usize);
    if whole_gang || k == 0 {
        let devices = pick_whole_devices(node, model, total);
        return devices.chunks(k.max(1) as usize).map(<[DeviceShare]>::to_vec).collect();
    }
    let mut out = Vec::with_capacity(members as usize);
    for _ in 0..members {
        let devices = pick_from(free_by_island(node, model, &taken), k);
        taken.extend(devices.iter().map(|d| d.device));
        out.push(devices);
    }
    out
}

/// Whole free devices of `model` on a node by island, leaving out `taken`.
fn free_by_island(
    node: &NodeCap,
    model: ModelId,
    taken: &BTreeSet<u16>,
) -> std::collections::BTreeMap<u32, Vec<u16>> {
    let mut by_island: std::collections::BTreeMap<u32, Vec<u16>> = Default::default();
    for (i, d) in node.devices.iter().enumerate() {
        if d.model == model && d.free == FULL && !taken.contains(&(i as u16)) {
            by_island.entry(d.island).or_default().push(i as u16);
        }
    }
    by_island
}

/// Chooses `k` whole free devices of `model` on a node, preferring one interconnect island:
/// the tightest island that holds all `k`, else the largest islands first.
pub(crate) fn pick_whole_devices(node: &NodeCap, model: ModelId, k: u32) -> Vec<DeviceShare> {
    pick_from(free_by_island(node, model, &BTreeSet::new()), k)
}

fn pick_from(by_island: std::collections::BTreeMap<u32, Vec<u16>>, k: u32) -> Vec<DeviceShare> {
    let k = k as usize;
    if let Some(devices) =
        by_island.values().filter(|v| v.len() >= k).min_by_key(|v| (v.len(), v[0]))
    {
        return devices[..k].iter().map(|&device| DeviceShare { device, shares: FULL }).collect();
    }
    let mut islands: Vec<&Vec<u16>> = by_island.values().collect();
    islands.sort_by_key(|v| (std::cmp::Reverse(v.len()), v[0]));
    islands
        .into_iter()
        .flatten()
        .take(k)
        .map(|&device| DeviceShare { device, shares: FULL })
        .collect()
}

/// Packs `members` slices of `s` shares onto devices of one node, tightest device first.
fn pack_shares(
    node: &NodeCap,
    node_id: NodeId,
    model: ModelId,
    s: u32,
    members: u32,
) -> Option<Vec<MemberPlacement>> {
    let mut free: Vec<(u32, u16)> = node
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.model == model && d.free >= s)
        .map(|(i, d)| (d.free, i as u16))
        .collect();
    let mut out = Vec::with_capacity(members as usize);
    for _ in 0..members {
        free.sort();
        let slot = free.iter_mut().find(|(f, _)| *f >= s)?;
        slot.0 -= s;
        out.push(MemberPlacement {
            node: node_id,
            devices: vec![DeviceShare { device: slot.1, shares: s }],
        });
    }
    Some(out)
}
