//! Free capacity per node and device, with indexes for best-fit placement.
//!
//! Invariant: for every device, `free` + `withheld` + shares held by allocations = 1000; for
//! every node, free + withheld CPU and memory + what allocations hold = the node's size.
//! `Engine::audit` checks both.
//!
//! A node the cluster reports down or drained is *unavailable*: everything on it that no
//! allocation holds is withheld instead of free (so it is in no index, no free count and no
//! rack or pool total), what its allocations give back is withheld too, and nothing new is
//! placed there until it is available again (`Capacity::set_unavailable`/`set_available`).
//! On an unavailable node nothing is free; on an available one nothing is withheld.
//!
//! A device held by work allot does not govern (a Slurm job of an unmanaged partition, say)
//! is *occupied*: the same holds for that one device — what no allocation holds is withheld,
//! what allocations give back is withheld too (`Capacity::set_occupied`) — so nothing new is
//! placed on it while the node's other devices stay usable. Nothing is free on an occupied
//! device; on an available node only occupied devices withhold anything.
//!
//! A MIG-enabled device also carries its MIG slot state (`MigState`); a MIG instance holds
//! its charge in shares like any slice, plus its slot. A device holding instances is in no
//! whole or share index (it takes no whole or fractional request), and a device holding whole
//! or fractional work is not in the MIG index; an empty MIG-enabled device is in all of them.

use std::collections::BTreeSet;

mod gradient;

use crate::decision::{DeviceShare, MemberPlacement, MigSlot, Placement};
use crate::ids::{ModelId, NodeId, SHARES_PER_GPU};
use crate::mig::{MigGpu, MigProfile, MigState};
use crate::model::GpuRequest;
use crate::topology::Domains;

const FULL: u32 = SHARES_PER_GPU as u32;

#[derive(Clone, Debug)]
pub(crate) struct DeviceCap {
    pub model: ModelId,
    pub island: u32,
    pub free: u32,
    /// Shares no allocation holds while the node is unavailable or the device occupied (not
    /// free, not usable).
    pub withheld: u32,
    /// Held by work allot does not govern: see the module docs.
    pub occupied: bool,
    /// The MIG slot state of a MIG-enabled device.
    pub mig: Option<MigDevice>,
}

/// A MIG-enabled device's instances, and its key in `Capacity::mig_index`.
#[derive(Clone, Debug)]
pub(crate) struct MigDevice {
    pub state: MigState,
    indexed: Option<u8>,
}

impl MigDevice {
    pub fn new(gpu: MigGpu) -> MigDevice {
        MigDevice { state: MigState::new(gpu), indexed: None }
    }
}

impl DeviceCap {
    /// Holds at least one MIG instance (and so takes no whole or fractional request).
    pub fn mig_in_use(&self) -> bool {
        self.mig.as_ref().is_some_and(|m| !m.state.is_empty())
    }

    /// The device's key in the MIG index: its free memory slices, when it may take a MIG
    /// instance (MIG-enabled, and either holding instances or entirely free).
    fn mig_key(&self) -> Option<u8> {
        let m = self.mig.as_ref()?;
        (!m.state.is_empty() || self.free == FULL).then(|| m.state.free_memory_slices())
    }

    /// Whether a MIG instance of `profile` could start at `start` now.
    pub fn mig_fits_at(&self, slot: MigSlot) -> bool {
        self.mig_key().is_some()
            && self.free >= slot.profile.shares().0 as u32
            && self.mig.as_ref().is_some_and(|m| m.state.fits_at(slot.profile, slot.start))
    }
}

#[derive(Clone, Debug)]
pub(crate) struct NodeCap {
    pub cpu_total: u64,
    pub mem_total: u64,
    pub free_cpu: u64,
    pub free_mem: u64,
    pub devices: Vec<DeviceCap>,
    /// Down or drained: nothing new is placed here; see the module docs.
    pub unavailable: bool,
    /// CPU and memory no allocation holds while the node is unavailable.
    pub withheld_cpu: u64,
    pub withheld_mem: u64,
}

impl NodeCap {
    pub(crate) fn whole_free(&self, model: ModelId) -> u32 {
        self.devices.iter().filter(|d| d.model == model && d.free == FULL).count() as u32
    }
    pub(crate) fn fits_host(&self, cpu: u64, mem: u64) -> bool {
        self.free_cpu >= cpu && self.free_mem >= mem
    }
}

/// Which placement `find_each` runs: the policy's gradient where it applies (the placement
/// that is kept), or the indexed best fit (a feasibility check: whether members fit does not
/// depend on where each goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refine {
    Gradient,
    BestFit,
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
    /// Per model: the most CPU (millicores) and memory (MiB) of a node with the model, for the
    /// same checks: a member asking more host than any such node has never fits.
    pub max_host_per_node: Vec<(u64, u64)>,
    pub free_whole: Vec<u64>,
    pub free_shares: Vec<u64>,
    /// Per model: (free memory slices, node, device) for every MIG-enabled device that may take
    /// a MIG instance now (holding instances, or entirely free): best fit is the first entry
    /// where the profile fits.
    mig_index: Vec<BTreeSet<(u8, NodeId, u16)>>,
    /// Per model: how many MIG-enabled devices it has in all.
    mig_devices: Vec<u32>,
    /// Per model: its MIG table, when it has MIG-enabled devices, and the most MIG-enabled
    /// devices on one node.
    mig_gpu: Vec<Option<MigGpu>>,
    max_mig_devices_per_node: Vec<u32>,
    /// Racks and pools with their free capacity, for gang spread (`topology.rs`).
    pub domains: Domains,
    /// The demand's CPU per whole GPU (millicores per 1000 shares), from what was submitted;
    /// 0 until a GPU workload asks CPU. Placement uses it to avoid stranding GPUs on a node
    /// whose CPU is gone (the `allot` packing policy's term, `packing::TargetMix::cpu_stranded`).
    pub cpu_per_gpu: u64,
    /// Per node: bumped by every change of what is free there (`gradient.rs`'s cache key).
    node_version: gradient::NodeVersions,
    /// Per model: the nodes that have it, in id order.
    model_nodes: Vec<Vec<NodeId>>,
    /// The placement gradient: target mix and cached scores (`capacity/gradient.rs`).
    gradient: gradient::Gradient,
}

/// How many best-fit candidates placement weighs by CPU stranding: enough to step past a
/// node whose CPU the request would exhaust, few enough to keep placement O(log n).
const STRANDING_SHORTLIST: usize = 8;

impl Capacity {
    pub fn new(nodes: Vec<NodeCap>, model_count: usize) -> Capacity {
        let mut cap = Capacity {
            nodes,
            whole_index: vec![BTreeSet::new(); model_count],
            share_index: vec![BTreeSet::new(); model_count],
            max_devices_per_node: vec![0; model_count],
            max_host_per_node: vec![(0, 0); model_count],
            free_whole: vec![0; model_count],
            free_shares: vec![0; model_count],
            mig_index: vec![BTreeSet::new(); model_count],
            mig_devices: vec![0; model_count],
            mig_gpu: vec![None; model_count],
            max_mig_devices_per_node: vec![0; model_count],
            domains: Domains::default(),
            cpu_per_gpu: 0,
            node_version: gradient::NodeVersions::default(),
            model_nodes: vec![Vec::new(); model_count],
            gradient: gradient::Gradient::default(),
        };
        cap.node_version = gradient::NodeVersions::new(cap.nodes.len());
        cap.index_mig_devices();
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
                cap.model_nodes[m].push(node_id);
                let count = node.devices.iter().filter(|d| d.model == model).count() as u32;
                cap.max_devices_per_node[m] = cap.max_devices_per_node[m].max(count);
                let host = &mut cap.max_host_per_node[m];
                *host = (host.0.max(node.cpu_total), host.1.max(node.mem_total));
                cap.whole_index[m].insert((node.whole_free(model), node_id));
            }
        }
        cap
    }

    /// Whether `members` members of `k` whole GPUs of model `m`, each with `cpu` millicores
    /// and `mem` MiB, spread over nodes, fit the cluster when empty: per node of the model, as
    /// many members as its GPUs, CPU and memory allow. O(nodes of the model × their devices).
    pub(crate) fn spread_ever_fits(
        &self,
        m: ModelId,
        k: u32,
        cpu: u64,
        mem: u64,
        members: u32,
    ) -> bool {
        let Some(nodes) = self.model_nodes.get(m.0 as usize) else { return false };
        let mut slots: u64 = 0;
        for &n in nodes {
            let node = &self.nodes[n.0 as usize];
            let devices = node.devices.iter().filter(|d| d.model == m).count() as u64;
            let by_gpu = devices / u64::from(k.max(1));
            let by_cpu = node.cpu_total.checked_div(cpu).unwrap_or(u64::MAX);
            let by_mem = node.mem_total.checked_div(mem).unwrap_or(u64::MAX);
            slots += by_gpu.min(by_cpu).min(by_mem);
            if slots >= u64::from(members) {
                return true;
            }
        }
        false
    }

    fn index_mig_devices(&mut self) {
        for n in 0..self.nodes.len() {
            let mut per_model: std::collections::BTreeMap<ModelId, u32> = Default::default();
            for d in 0..self.nodes[n].devices.len() {
                let dev = &self.nodes[n].devices[d];
                if let Some(m) = &dev.mig {
                    self.mig_gpu[dev.model.0 as usize] = Some(m.state.gpu());
                    *per_model.entry(dev.model).or_default() += 1;
                }
                self.sync_mig_index(NodeId(n as u32), d as u16);
            }
            for (model, count) in per_model {
                let most = &mut self.max_mig_devices_per_node[model.0 as usize];
                *most = (*most).max(count);
                self.mig_devices[model.0 as usize] += count;
            }
        }
    }

    /// Puts a device under its current key in the MIG index (or takes it out).
    fn sync_mig_index(&mut self, node: NodeId, device: u16) {
        let dev = &mut self.nodes[node.0 as usize].devices[device as usize];
        let key = dev.mig_key();
        let model = dev.model.0 as usize;
        let Some(m) = dev.mig.as_mut() else { return };
        if m.indexed == key {
            return;
        }
        let old = std::mem::replace(&mut m.indexed, key);
        if let Some(old) = old {
            self.mig_index[model].remove(&(old, node, device));
        }
        if let Some(key) = key {
            self.mig_index[model].insert((key, node, device));
        }
    }

    /// Whether some node could ever hold `members` instances of `profile` on `model` (all on
    /// one node with `same_node`): the model has MIG-enabled devices whose table has the
    /// profile, and for a same-node gang one node has room for that many when empty.
    pub fn mig_ever_placeable(
        &self,
        model: ModelId,
        profile: MigProfile,
        members: u32,
        same_node: bool,
    ) -> bool {
        let m = model.0 as usize;
        let Some(spec) = self.mig_gpu.get(m).copied().flatten().and_then(|g| g.profile(profile))
        else {
            return false;
        };
        let per_node = self.max_mig_devices_per_node.get(m).copied().unwrap_or(0);
        // A gang spread over nodes has every MIG device of the model, each holding at most
        // `max_count` such instances when empty.
        let devices = if same_node {
            u64::from(per_node)
        } else {
            u64::from(self.mig_devices.get(m).copied().unwrap_or(0))
        };
        per_node > 0 && u64::from(members) <= devices * u64::from(spec.max_count)
    }

    /// Whether `model` has MIG-enabled devices that offer `profile` at all.
    pub fn offers_mig(&self, model: ModelId, profile: MigProfile) -> bool {
        self.mig_ever_placeable(model, profile, 1, false)
    }

    /// Best-fit MIG placement of one member: the MIG-enabled device of `model` where the
    /// instance fits with the fewest free memory slices left (then lowest node, device), on a
    /// node with the CPU and memory; the start by `MigState::best_start`.
    fn find_mig(
        &self,
        model: ModelId,
        profile: MigProfile,
        cpu: u64,
        mem: u64,
    ) -> Option<MemberPlacement> {
        let size = self.mig_gpu.get(model.0 as usize).copied().flatten()?.profile(profile)?;
        let index = self.mig_index.get(model.0 as usize)?;
        // Devices with fewer free memory slices than the instance takes are skipped unseen.
        index.range((size.memory_slices, NodeId(0), 0)..).find_map(|&(_, node_id, device)| {
            let node = &self.nodes[node_id.0 as usize];
            let dev = &node.devices[device as usize];
            if !node.fits_host(cpu, mem) || dev.free < profile.shares().0 as u32 {
                return None;
            }
            let start = dev.mig.as_ref()?.state.best_start(profile)?;
            Some(MemberPlacement {
                node: node_id,
                devices: vec![mig_share(device, profile, start)],
            })
        })
    }

    /// A same-node gang of MIG instances: nodes in the order of their tightest MIG device,
    /// members placed one by one on that node, each best fit on a copy of its devices' slots.
    fn find_mig_same_node(
        &self,
        model: ModelId,
        profile: MigProfile,
        members: u32,
        cpu: u64,
        mem: u64,
    ) -> Option<Placement> {
        let index = self.mig_index.get(model.0 as usize)?;
        let mut tried: BTreeSet<NodeId> = BTreeSet::new();
        let charge = profile.shares().0 as u32;
        for &(_, node_id, _) in index {
            if !tried.insert(node_id) {
                continue;
            }
            let node = &self.nodes[node_id.0 as usize];
            if !node.fits_host(cpu, mem) {
                continue;
            }
            // (free slices, device, state, free shares) of this node's eligible devices.
            let mut devices: Vec<(u8, u16, MigState, u32)> = node
                .devices
                .iter()
                .enumerate()
                .filter(|(_, dev)| dev.model == model)
                .filter_map(|(d, dev)| {
                    Some((dev.mig_key()?, d as u16, dev.mig.as_ref()?.state, dev.free))
                })
                .collect();
            let mut placed = Vec::with_capacity(members as usize);
            for _ in 0..members {
                devices.sort_by_key(|e| (e.0, e.1));
                let Some(slot) = devices.iter_mut().find(|e| e.3 >= charge && e.2.fits(profile))
                else {
                    break;
                };
                let Some(start) = slot.2.place(profile) else { break };
                slot.0 = slot.2.free_memory_slices();
                slot.3 -= charge;
                placed.push(MemberPlacement {
                    node: node_id,
                    devices: vec![mig_share(slot.1, profile, start)],
                });
            }
            if placed.len() == members as usize {
                return Some(Placement { model: Some(model), members: placed });
            }
        }
        None
    }

    /// Takes one MIG instance (exact inverse: `give_mig`).
    fn take_mig(&mut self, node: NodeId, ds: &DeviceShare, slot: MigSlot) {
        let dev = &mut self.nodes[node.0 as usize].devices[ds.device as usize];
        if let Some(m) = dev.mig.as_mut() {
            m.state.occupy(slot.profile, slot.start);
        }
        self.take_shares(node, ds.device, ds.shares);
        self.sync_mig_index(node, ds.device);
    }

    fn give_mig(&mut self, node: NodeId, ds: &DeviceShare, slot: MigSlot) {
        let dev = &mut self.nodes[node.0 as usize].devices[ds.device as usize];
        if let Some(m) = dev.mig.as_mut()
            && m.state.instances().any(|(s, p)| s == slot.start && p == slot.profile)
        {
            m.state.free(slot.start);
        }
        self.give_shares(node, ds.device, ds.shares);
        self.sync_mig_index(node, ds.device);
    }

    /// The MIG index holds exactly the devices that may take an instance, under their free
    /// memory slices (checked by `Engine::audit`).
    pub fn check_mig_index(&self) -> Result<(), String> {
        let mut expect = vec![BTreeSet::new(); self.mig_index.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            for (d, dev) in node.devices.iter().enumerate() {
                if let Some(key) = dev.mig_key() {
                    expect[dev.model.0 as usize].insert((key, NodeId(n as u32), d as u16));
                }
            }
        }
        if expect != self.mig_index {
            return Err("the MIG index is out of step with the devices".into());
        }
        Ok(())
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
        self.touch(node);
        let m = model.0 as usize;
        let old_whole = self.nodes[node.0 as usize].whole_free(model);
        if old_free > 0 {
            self.share_index[m].remove(&(old_free, node, device));
        }
        // A device holding MIG instances takes no fractional request.
        if new_free > 0 && !self.nodes[node.0 as usize].devices[device as usize].mig_in_use() {
            self.share_index[m].insert((new_free, node, device));
        }
        self.free_shares[m] = self.free_shares[m] + u64::from(new_free) - u64::from(old_free);
        self.nodes[node.0 as usize].devices[device as usize].free = new_free;
        self.sync_mig_index(node, device);
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

    /// Takes what a placement holds. The caller guarantees it was found free (or, on an
    /// unavailable node, withheld: work adopted where it runs, or an allocation booked again).
    pub fn take(&mut self, placement: &Placement, cpu: u64, mem: u64) {
        for member in &placement.members {
            self.take_member(member, cpu, mem);
        }
    }

    fn take_member(&mut self, member: &MemberPlacement, cpu: u64, mem: u64) {
        self.touch(member.node);
        let node = &mut self.nodes[member.node.0 as usize];
        if node.unavailable {
            node.withheld_cpu = node.withheld_cpu.saturating_sub(cpu);
            node.withheld_mem = node.withheld_mem.saturating_sub(mem);
        } else {
            node.free_cpu = node.free_cpu.saturating_sub(cpu);
            node.free_mem = node.free_mem.saturating_sub(mem);
        }
        for ds in &member.devices {
            if let Some(slot) = ds.mig {
                self.take_mig(member.node, ds, slot);
            } else {
                self.take_shares(member.node, ds.device, ds.shares);
            }
        }
    }

    /// Gives back what `take` took; an exact inverse. On an unavailable node it is withheld,
    /// not freed.
    pub fn give(&mut self, placement: &Placement, cpu: u64, mem: u64) {
        for member in &placement.members {
            self.give_member(member, cpu, mem);
        }
    }

    fn give_member(&mut self, member: &MemberPlacement, cpu: u64, mem: u64) {
        self.touch(member.node);
        let node = &mut self.nodes[member.node.0 as usize];
        if node.unavailable {
            node.withheld_cpu = (node.withheld_cpu + cpu).min(node.cpu_total);
            node.withheld_mem = (node.withheld_mem + mem).min(node.mem_total);
        } else {
            node.free_cpu = (node.free_cpu + cpu).min(node.cpu_total);
            node.free_mem = (node.free_mem + mem).min(node.mem_total);
        }
        for ds in &member.devices {
            if let Some(slot) = ds.mig {
                self.give_mig(member.node, ds, slot);
            } else {
                self.give_shares(member.node, ds.device, ds.shares);
            }
        }
    }

    /// Takes `shares` of a device: free ones, or withheld ones on an unavailable node or an
    /// occupied device.
    fn take_shares(&mut self, node: NodeId, device: u16, shares: u32) {
        let n = &mut self.nodes[node.0 as usize];
        let dev = &mut n.devices[device as usize];
        if n.unavailable || dev.occupied {
            dev.withheld = dev.withheld.saturating_sub(shares);
        } else {
            let free = dev.free.saturating_sub(shares);
            self.set_device_free(node, device, free);
        }
    }

    /// Gives `shares` of a device back: free, or withheld on an unavailable node or an
    /// occupied device.
    fn give_shares(&mut self, node: NodeId, device: u16, shares: u32) {
        let n = &mut self.nodes[node.0 as usize];
        let dev = &mut n.devices[device as usize];
        if n.unavailable || dev.occupied {
            dev.withheld = (dev.withheld + shares).min(FULL);
        } else {
            let free = (dev.free + shares).min(FULL);
            self.set_device_free(node, device, free);
        }
    }

    /// The node is down or drained: withholds everything free on it, through the same path
    /// as `take`, so that the indexes, free counts and rack and pool totals leave it out.
    /// Idempotent; an unknown node is ignored.
    pub fn set_unavailable(&mut self, node: NodeId) {
        let Some(n) = self.nodes.get_mut(node.0 as usize) else { return };
        if n.unavailable {
            return;
        }
        self.touch(node);
        let n = &mut self.nodes[node.0 as usize];
        n.withheld_cpu = std::mem::take(&mut n.free_cpu);
        n.withheld_mem = std::mem::take(&mut n.free_mem);
        for d in 0..n.devices.len() {
            let dev = &mut self.nodes[node.0 as usize].devices[d];
            // An occupied device has nothing free: what it withholds stays.
            dev.withheld += dev.free;
            self.set_device_free(node, d as u16, 0);
        }
        // Flagged last: `set_device_free` above must see the free shares go.
        self.nodes[node.0 as usize].unavailable = true;
    }

    /// The node is usable again: frees what was withheld (the exact inverse of
    /// `set_unavailable` plus what ended there meanwhile). Idempotent; an unknown node is
    /// ignored.
    pub fn set_available(&mut self, node: NodeId) {
        let Some(n) = self.nodes.get_mut(node.0 as usize) else { return };
        if !n.unavailable {
            return;
        }
        self.touch(node);
        let n = &mut self.nodes[node.0 as usize];
        n.unavailable = false;
        n.free_cpu = (n.free_cpu + std::mem::take(&mut n.withheld_cpu)).min(n.cpu_total);
        n.free_mem = (n.free_mem + std::mem::take(&mut n.withheld_mem)).min(n.mem_total);
        for d in 0..n.devices.len() {
            let dev = &mut self.nodes[node.0 as usize].devices[d];
            if dev.occupied {
                continue;
            }
            let free = (dev.free + std::mem::take(&mut dev.withheld)).min(FULL);
            self.set_device_free(node, d as u16, free);
        }
    }

    /// Marks a device held (`true`) or no longer held by work allot does not govern: what no
    /// allocation holds there is withheld, or freed again (unless the node is unavailable,
    /// which keeps it withheld). Idempotent; an unknown node or device is ignored.
    pub fn set_occupied(&mut self, node: NodeId, device: u16, occupied: bool) {
        let Some(n) = self.nodes.get(node.0 as usize) else { return };
        let Some(dev) = n.devices.get(device as usize) else { return };
        if dev.occupied == occupied {
            return;
        }
        let unavailable = n.unavailable;
        self.touch(node);
        if occupied {
            let dev = &mut self.nodes[node.0 as usize].devices[device as usize];
            dev.withheld += dev.free;
            self.set_device_free(node, device, 0);
            // Flagged last: `set_device_free` above must see the free shares go.
            self.nodes[node.0 as usize].devices[device as usize].occupied = true;
        } else {
            let dev = &mut self.nodes[node.0 as usize].devices[device as usize];
            dev.occupied = false;
            if !unavailable {
                let free = (dev.free + std::mem::take(&mut dev.withheld)).min(FULL);
                self.set_device_free(node, device, free);
            }
        }
    }

    /// Runs `f` as if `nodes` were available (their withheld capacity free), then makes them
    /// unavailable again: for "would it fit if these nodes were back" questions. `f` must
    /// leave the capacity as it found it (as `find` does).
    pub fn with_nodes_usable<T>(
        &mut self,
        nodes: &[NodeId],
        f: impl FnOnce(&mut Capacity) -> T,
    ) -> T {
        let down: Vec<NodeId> = nodes
            .iter()
            .copied()
            .filter(|n| self.nodes.get(n.0 as usize).is_some_and(|n| n.unavailable))
            .collect();
        for &n in &down {
            self.set_available(n);
        }
        let out = f(self);
        for &n in &down {
            self.set_unavailable(n);
        }
        out
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
            return self.find_each(model, shape, members, Refine::Gradient);
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
            _ => self.find_each(model, shape, members, Refine::BestFit).is_some(),
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
        refine: Refine,
    ) -> Option<Placement> {
        let mut placed: Vec<MemberPlacement> = Vec::new();
        let mut ok = true;
        for index in 0..members {
            let found = match refine {
                Refine::Gradient => self.gradient_member(model, shape),
                Refine::BestFit => None,
            };
            match found.unwrap_or_else(|| self.find_member(model, shape)) {
                Some(member) => {
                    // Taken only for the members after it to see; the last is not (a take
                    // and give would mark the node changed for placement's cached scores).
                    if index + 1 < members {
                        let one = Placement { model, members: vec![member.clone()] };
                        self.take(&one, shape.cpu, shape.mem);
                    }
                    placed.push(member);
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        let last_taken = if ok { placed.len().saturating_sub(1) } else { placed.len() };
        let taken = Placement { model, members: placed[..last_taken].to_vec() };
        self.give(&taken, shape.cpu, shape.mem);
        ok.then_some(Placement { model, members: placed })
    }

    /// GPU shares on `node` that the demand could not feed with CPU if the node had `cpu_free`
    /// millicores and `gpu_free` shares free: those beyond `cpu_free` / `cpu_per_gpu` GPUs.
    fn cpu_stranded(&self, cpu_free: u64, gpu_free: u64) -> u64 {
        if self.cpu_per_gpu == 0 {
            return 0;
        }
        let fed = u128::from(cpu_free) * u128::from(SHARES_PER_GPU) / u128::from(self.cpu_per_gpu);
        u64::try_from(u128::from(gpu_free).saturating_sub(fed)).unwrap_or(u64::MAX)
    }

    /// How many GPU shares taking `cpu` millicores and `shares` GPU shares on `node` would
    /// newly strand (see [`Capacity::cpu_stranded`]).
    fn stranding_growth(&self, node: NodeId, cpu: u64, shares: u64) -> u64 {
        let n = &self.nodes[node.0 as usize];
        let gpu_free: u64 = n.devices.iter().map(|d| u64::from(d.free)).sum();
        let before = self.cpu_stranded(n.free_cpu, gpu_free);
        let after =
            self.cpu_stranded(n.free_cpu.saturating_sub(cpu), gpu_free.saturating_sub(shares));
        after.saturating_sub(before)
    }

    /// Of the first host-fitting best-fit candidates, the one that strands the fewest GPU
    /// shares (the earliest, i.e. the tightest, among equals). With no CPU in the demand every
    /// growth is 0 and this is plain best fit.
    fn least_stranding<T: Copy>(
        &self,
        candidates: impl Iterator<Item = (NodeId, T)>,
        shape: MemberShape,
        shares: u64,
    ) -> Option<(NodeId, T)> {
        let mut best: Option<(u64, NodeId, T)> = None;
        for (node, extra) in candidates
            .filter(|&(node, _)| self.nodes[node.0 as usize].fits_host(shape.cpu, shape.mem))
            .take(STRANDING_SHORTLIST)
        {
            let growth = self.stranding_growth(node, shape.cpu, shares);
            if best.is_none_or(|(g, _, _)| growth < g) {
                best = Some((growth, node, extra));
            }
            if growth == 0 {
                break;
            }
        }
        best.map(|(_, node, extra)| (node, extra))
    }

    fn find_member(&self, model: Option<ModelId>, shape: MemberShape) -> Option<MemberPlacement> {
        match (model, shape.gpus) {
            (None, _) | (_, GpuRequest::Whole(0)) => self.find_host_only(shape.cpu, shape.mem),
            (Some(model), GpuRequest::Whole(k)) => {
                let index = self.whole_index.get(model.0 as usize)?;
                let candidates = index.range((k, NodeId(0))..).map(|&(_, node)| (node, ()));
                let shares = u64::from(k) * SHARES_PER_GPU;
                let (node_id, ()) = self.least_stranding(candidates, shape, shares)?;
                let node = &self.nodes[node_id.0 as usize];
                Some(MemberPlacement { node: node_id, devices: pick_whole_devices(node, model, k) })
            }
            (Some(model), GpuRequest::Shares(s)) => {
                let index = self.share_index.get(model.0 as usize)?;
                let candidates =
                    index.range((s, NodeId(0), 0)..).map(|&(_, node, device)| (node, device));
                let (node, device) = self.least_stranding(candidates, shape, u64::from(s))?;
                Some(MemberPlacement {
                    node,
                    devices: vec![DeviceShare { device, shares: s, mig: None }],
                })
            }
            (Some(model), GpuRequest::Mig(profile)) => {
                self.find_mig(model, profile, shape.cpu, shape.mem)
            }
        }
    }

    fn find_host_only(&self, cpu: u64, mem: u64) -> Option<MemberPlacement> {
        // The node where the CPU taken strands the fewest GPU shares, then the tightest by
        // free CPU; CPU-only workloads are rare, so a scan is acceptable.
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.unavailable && n.fits_host(cpu, mem))
            .min_by_key(|(i, n)| (self.stranding_growth(NodeId(*i as u32), cpu, 0), n.free_cpu, *i))
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
            (Some(model), GpuRequest::Mig(profile)) => {
                self.find_mig_same_node(model, profile, members, cpu, mem)
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
        return devices[..k]
            .iter()
            .map(|&device| DeviceShare { device, shares: FULL, mig: None })
            .collect();
    }
    let mut islands: Vec<&Vec<u16>> = by_island.values().collect();
    islands.sort_by_key(|v| (std::cmp::Reverse(v.len()), v[0]));
    islands
        .into_iter()
        .flatten()
        .take(k)
        .map(|&device| DeviceShare { device, shares: FULL, mig: None })
        .collect()
}

/// One MIG instance of `profile` at `start` on `device`, charged its shares.
fn mig_share(device: u16, profile: MigProfile, start: u8) -> DeviceShare {
    DeviceShare { device, shares: profile.shares().0 as u32, mig: Some(MigSlot { profile, start }) }
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
        .filter(|(_, d)| d.model == model && d.free >= s && !d.mig_in_use())
        .map(|(i, d)| (d.free, i as u16))
        .collect();
    let mut out = Vec::with_capacity(members as usize);
    for _ in 0..members {
        free.sort();
        let slot = free.iter_mut().find(|(f, _)| *f >= s)?;
        slot.0 -= s;
        out.push(MemberPlacement {
            node: node_id,
            devices: vec![DeviceShare { device: slot.1, shares: s, mig: None }],
        });
    }
    Some(out)
}
