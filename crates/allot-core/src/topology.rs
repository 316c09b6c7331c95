//! Topology domains and gang spread: where the members of a gang that may span nodes go.
//!
//! Spread levels, closest first: one interconnect island of one node, one node, one rack
//! (`NodeSpec.rack`, within its pool), one pool (`NodeSpec.pool`), the cluster. Within a node
//! whole-device members prefer one island (`capacity::pick_members_on_node`). Across nodes,
//! `Capacity::find_spread` places the members best-fit (each on the tightest node with room,
//! so free blocks are used up exactly and empty nodes stay whole for later gangs) and keeps
//! that placement when it lands in one rack; otherwise it looks for the tightest rack that
//! can hold the gang (least free GPUs of the model), then the tightest pool, each searched
//! best-fit again. Fragmentation and spread are thus minimised together: the domain is chosen
//! for spread, the nodes inside it for fit.
//!
//! Each domain keeps a histogram of its nodes by whole free devices per model, updated in
//! O(1) on every device change, so "can this rack hold m members of k GPUs" is
//! Σ_{f≥k} nodes(f)·⌊f/k⌋, a few additions, without visiting the rack's nodes.

use std::collections::BTreeSet;

use crate::capacity::{Capacity, MemberShape, Refine, pick_whole_devices};
use crate::decision::{DeviceShare, MemberPlacement, Placement};
use crate::ids::{ModelId, NodeId};
use crate::model::GpuRequest;

/// Most domains of one level tried for one gang after the histogram said they fit (CPU,
/// memory or partial-device shapes can still make a try fail).
const DOMAIN_TRIES_MAX: usize = 8;

/// A level of grouping above the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Rack = 0,
    Pool = 1,
}

const LEVELS: [Level; 2] = [Level::Rack, Level::Pool];

/// Nodes grouped by rack and by pool, with free capacity per domain and model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Domains {
    /// Per level, per node: its domain there (`None`: the node has no rack or no pool).
    of_node: [Vec<Option<u32>>; 2],
    /// Per level, per domain: its nodes, in id order.
    nodes: [Vec<Vec<NodeId>>; 2],
    /// Per level, per model, per domain: number of nodes with `f` whole free devices, at `f`.
    hist: [Vec<Vec<Vec<u32>>>; 2],
    /// Per level, per model, per domain: free shares, partial devices included.
    shares: [Vec<Vec<u64>>; 2],
}

impl Domains {
    /// Domain of each node per level (`[rack, pool]`), with the capacity as it is now.
    pub(crate) fn build(cap: &Capacity, of_node: [Vec<Option<u32>>; 2]) -> Domains {
        let models = cap.max_devices_per_node.len();
        let mut d = Domains { of_node, ..Domains::default() };
        for level in LEVELS {
            let l = level as usize;
            let count = d.of_node[l].iter().flatten().map(|&x| x as usize + 1).max().unwrap_or(0);
            d.nodes[l] = vec![Vec::new(); count];
            d.hist[l] = (0..models)
                .map(|m| vec![vec![0; cap.max_devices_per_node[m] as usize + 1]; count])
                .collect();
            d.shares[l] = vec![vec![0; count]; models];
            for (n, node) in cap.nodes.iter().enumerate() {
                let Some(Some(dom)) = d.of_node[l].get(n).copied() else { continue };
                let dom = dom as usize;
                d.nodes[l][dom].push(NodeId(n as u32));
                let mut models_here: BTreeSet<ModelId> = BTreeSet::new();
                for dev in &node.devices {
                    models_here.insert(dev.model);
                    d.shares[l][dev.model.0 as usize][dom] += u64::from(dev.free);
                }
                for m in models_here {
                    let f = node.whole_free(m) as usize;
                    if let Some(slot) = d.hist[l][m.0 as usize][dom].get_mut(f) {
                        *slot += 1;
                    }
                }
            }
        }
        d
    }

    /// The same domains recounted from the capacity as it is now (`Engine::audit` compares).
    pub(crate) fn recount(&self, cap: &Capacity) -> Domains {
        Domains::build(cap, self.of_node.clone())
    }

    /// A device of `model` on `node` went from `old` to `new` free shares.
    pub(crate) fn shares_changed(&mut self, node: NodeId, model: ModelId, old: u32, new: u32) {
        for l in 0..2 {
            let Some(Some(dom)) = self.of_node[l].get(node.0 as usize).copied() else { continue };
            if let Some(s) =
                self.shares[l].get_mut(model.0 as usize).and_then(|v| v.get_mut(dom as usize))
            {
                *s = (*s + u64::from(new)).saturating_sub(u64::from(old));
            }
        }
    }

    /// `node`'s whole free devices of `model` went from `old` to `new`.
    pub(crate) fn whole_changed(&mut self, node: NodeId, model: ModelId, old: u32, new: u32) {
        for l in 0..2 {
            let Some(Some(dom)) = self.of_node[l].get(node.0 as usize).copied() else { continue };
            let Some(h) =
                self.hist[l].get_mut(model.0 as usize).and_then(|v| v.get_mut(dom as usize))
            else {
                continue;
            };
            if let Some(slot) = h.get_mut(old as usize) {
                *slot = slot.saturating_sub(1);
            }
            if let Some(slot) = h.get_mut(new as usize) {
                *slot += 1;
            }
        }
    }

    fn domain_of(&self, level: Level, node: NodeId) -> Option<u32> {
        self.of_node[level as usize].get(node.0 as usize).copied().flatten()
    }

    /// Domains of `level` that may hold `members` members of `shape` on `model`, tightest
    /// (least free) first: (free, domain).
    fn candidates(
        &self,
        level: Level,
        model: ModelId,
        shape: MemberShape,
        members: u32,
    ) -> Vec<(u64, u32)> {
        let l = level as usize;
        let m = model.0 as usize;
        let (Some(hist), Some(shares)) = (self.hist[l].get(m), self.shares[l].get(m)) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u32)> = Vec::new();
        for (dom, h) in hist.iter().enumerate() {
            let fits = match shape.gpus {
                GpuRequest::Whole(k) if k > 0 => {
                    let slots: u64 = h
                        .iter()
                        .enumerate()
                        .skip(k as usize)
                        .map(|(f, &n)| u64::from(n) * (f as u64 / u64::from(k)))
                        .sum();
                    slots >= u64::from(members)
                }
                GpuRequest::Shares(s) => {
                    shares.get(dom).copied().unwrap_or(0) >= u64::from(s) * u64::from(members)
                }
                GpuRequest::Whole(_) | GpuRequest::Mig(_) => false,
            };
            if fits {
                let free: u64 = match shape.gpus {
                    GpuRequest::Whole(_) => {
                        h.iter().enumerate().map(|(f, &n)| f as u64 * u64::from(n)).sum()
                    }
                    GpuRequest::Shares(_) | GpuRequest::Mig(_) => {
                        shares.get(dom).copied().unwrap_or(0)
                    }
                };
                out.push((free, dom as u32));
            }
        }
        out.sort_unstable();
        out
    }
}

impl Capacity {
    /// Groups the nodes by rack and pool: `rack[n]` and `pool[n]` are node `n`'s domain ids
    /// (a rack id is unique across pools).
    pub(crate) fn set_domains(&mut self, rack: Vec<Option<u32>>, pool: Vec<Option<u32>>) {
        self.domains = Domains::build(self, [rack, pool]);
    }

    /// A gang whose members may span nodes (see the module docs): best-fit member by member;
    /// kept if it lands in one rack, else the tightest rack, then pool, that holds it.
    pub(crate) fn find_spread(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
        members: u32,
    ) -> Option<Placement> {
        let global = self.find_each(model, shape, members, Refine::Gradient)?;
        let Some(model) = model else { return Some(global) };
        // MIG gangs keep their best-fit placement: their slots are not counted per domain.
        if matches!(shape.gpus, GpuRequest::Whole(0) | GpuRequest::Mig(_)) {
            return Some(global);
        }
        let spread = self.spread_level(&global);
        for level in LEVELS {
            if spread <= Spread::Within(level) {
                break;
            }
            let candidates = self.domains.candidates(level, model, shape, members);
            for &(_, dom) in candidates.iter().take(DOMAIN_TRIES_MAX) {
                let nodes = self.domains.nodes[level as usize][dom as usize].clone();
                if let Some(p) = self.find_within(model, shape, members, &nodes) {
                    return Some(p);
                }
            }
        }
        Some(global)
    }

    /// How far a placement's members are spread.
    pub(crate) fn spread_level(&self, p: &Placement) -> Spread {
        let Some(first) = p.members.first().map(|m| m.node) else { return Spread::OneNode };
        if p.members.iter().all(|m| m.node == first) {
            return Spread::OneNode;
        }
        for level in LEVELS {
            let dom = self.domains.domain_of(level, first);
            if dom.is_some()
                && p.members.iter().all(|m| self.domains.domain_of(level, m.node) == dom)
            {
                return Spread::Within(level);
            }
        }
        Spread::Cluster
    }

    /// Best-fit placement of the gang on `nodes` only. The capacity is unchanged on return.
    fn find_within(
        &mut self,
        model: ModelId,
        shape: MemberShape,
        members: u32,
        nodes: &[NodeId],
    ) -> Option<Placement> {
        let (cpu, mem) = (shape.cpu, shape.mem);
        let mut placed: Vec<MemberPlacement> = Vec::new();
        let mut ok = true;
        match shape.gpus {
            GpuRequest::Whole(k) => {
                let mut index: BTreeSet<(u32, NodeId)> = nodes
                    .iter()
                    .map(|&n| (self.nodes[n.0 as usize].whole_free(model), n))
                    .filter(|e| e.0 >= k)
                    .collect();
                for _ in 0..members {
                    let pick = index
                        .range((k, NodeId(0))..)
                        .find(|&&(_, n)| self.nodes[n.0 as usize].fits_host(cpu, mem))
                        .copied();
                    let Some((f, n)) = pick else {
                        ok = false;
                        break;
                    };
                    let devices = pick_whole_devices(&self.nodes[n.0 as usize], model, k);
                    let member = MemberPlacement { node: n, devices };
                    self.take(
                        &Placement { model: Some(model), members: vec![member.clone()] },
                        cpu,
                        mem,
                    );
                    placed.push(member);
                    index.remove(&(f, n));
                    if f - k >= k {
                        index.insert((f - k, n));
                    }
                }
            }
            GpuRequest::Shares(s) => {
                let mut index: BTreeSet<(u32, NodeId, u16)> = BTreeSet::new();
                for &n in nodes {
                    for (d, dev) in self.nodes[n.0 as usize].devices.iter().enumerate() {
                        if dev.model == model && dev.free >= s {
                            index.insert((dev.free, n, d as u16));
                        }
                    }
                }
                for _ in 0..members {
                    let pick = index
                        .range((s, NodeId(0), 0)..)
                        .find(|&&(_, n, _)| self.nodes[n.0 as usize].fits_host(cpu, mem))
                        .copied();
                    let Some((f, n, d)) = pick else {
                        ok = false;
                        break;
                    };
                    let member = MemberPlacement {
                        node: n,
                        devices: vec![DeviceShare { device: d, shares: s, mig: None }],
                    };
                    self.take(
                        &Placement { model: Some(model), members: vec![member.clone()] },
                        cpu,
                        mem,
                    );
                    placed.push(member);
                    index.remove(&(f, n, d));
                    if f - s >= s {
                        index.insert((f - s, n, d));
                    }
                }
            }
            // Not reached: `find_spread` keeps MIG gangs' best-fit placement.
            GpuRequest::Mig(_) => ok = false,
        }
        let partial = Placement { model: Some(model), members: placed };
        self.give(&partial, cpu, mem);
        ok.then_some(partial)
    }
}

/// How far a gang is spread, closest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Spread {
    OneNode,
    Within(Level),
    Cluster,
}
