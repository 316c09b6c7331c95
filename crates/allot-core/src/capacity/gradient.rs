//! Where one member goes: `allot`'s placement policy — FGD's fragmentation gradient plus the
//! GPU shares a placement strands by CPU — through the same scoring function `sim pack` runs
//! (`packing::allot_score`), measured against the target mix the engine learns from what is
//! submitted (`engine/demand.rs`).
//!
//! A node's score for a member depends only on the node's free state and the member's shape,
//! so scores are cached per shape and node and recomputed only for nodes whose version moved
//! since (every take, give and availability change moves it; a reservation's hold that
//! returns a node to a state it had gives back the version it had, `NodeVersions`). A
//! placement then costs one pass over the nodes of the model with a comparison each, plus a
//! rescore of the few nodes that changed. Equal scores go to the tighter node (fewer free
//! shares of the model after), then to the lower node id.
//!
//! Whether a request fits at all does not depend on the policy (members of one shape fit
//! node by node whatever the order), so feasibility checks keep the indexed best fit and only
//! the placement that is kept is refined here.

use std::collections::BTreeMap;

use super::{Capacity, FULL, MemberShape, NodeCap, pick_whole_devices};
use crate::decision::{DeviceShare, MemberPlacement, Placement};
use crate::ids::{ModelId, NodeId};
use crate::model::GpuRequest;
use crate::packing::{GradientNode, MILLI, ModelSet, PodShape, TargetMix, allot_score};

/// Cached scores kept at most (about 50 MB); past this the cache starts over (shapes differ by
/// CPU too, and a fleet of odd sizes must not grow it without bound).
const ENTRIES_MAX: usize = 2_000_000;

/// (model, GPUs, share per GPU, CPU) of a member; model `None` for CPU-only. Memory is no
/// part of the score, so it is checked beside the cache, not keyed.
type ShapeKey = (Option<ModelId>, u8, u16, u64);

#[derive(Clone, Copy, Debug, Default)]
struct Cached {
    /// The node version the entry was computed at; 0 never matches.
    version: u32,
    /// (score, tie-break), higher wins; `None` when the member does not fit there.
    rank: Option<(i64, i64)>,
    /// The device a GPU-sharing member takes.
    device: u16,
}

/// The target mix and the cached scores. Cloning keeps the mix and drops the cache (an
/// engine copied for a what-if rescores what it touches); `Debug` shows the mix only, as the
/// cache is no part of the state.
#[derive(Default)]
pub(crate) struct Gradient {
    mix: Option<TargetMix>,
    /// Per shape, one entry per node of its model (per node for CPU-only work), in the order
    /// of `Capacity::model_nodes`.
    scores: BTreeMap<ShapeKey, Vec<Cached>>,
    entries: usize,
}

impl std::fmt::Debug for Gradient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gradient").field("mix", &self.mix).finish_non_exhaustive()
    }
}

/// Per node, a number that names what is free there: the cache's key, no part of the state
/// (so not in `Debug`, which tests compare engines by). Every change issues a new number,
/// except a hold that `hold_memo` has seen before: GPUs held for a reservation are taken and
/// given back every cycle and around every workload that may use them, and a node that goes
/// back to what it was gets back the number it had, so its cached scores still hold.
#[derive(Clone, Default)]
pub(crate) struct NodeVersions {
    /// Per node: its number now.
    pub now: Vec<u32>,
    /// Per node: the last number issued (`now` may be an older one, given back by the memo).
    issued: Vec<u32>,
    /// Per node: recent holds, (number before, taken (else given), devices) → number after.
    memo: Vec<Vec<HoldStep>>,
}

/// One remembered hold: (version before, taken, device mask, version after).
type HoldStep = (u32, bool, u64, u32);

/// Holds remembered per node: a reservation's take and give, for the node's last states.
const HOLD_MEMO_MAX: usize = 8;

impl NodeVersions {
    pub(super) fn new(nodes: usize) -> NodeVersions {
        NodeVersions { now: vec![1; nodes], issued: vec![1; nodes], memo: vec![Vec::new(); nodes] }
    }

    /// Issues node `n` a new number: what is free there changed.
    fn bump(&mut self, n: usize) {
        if let (Some(v), Some(i)) = (self.now.get_mut(n), self.issued.get_mut(n)) {
            *i = i.wrapping_add(1).max(1);
            *v = *i;
        }
    }

    /// Node `n` was at `before` when whole devices `mask` were held (`take`) or given back, and
    /// the change issued it a new number: if the same step from the same number was seen, the
    /// node is as it was then, and gets that number back. Else the step is remembered, with
    /// its inverse when `invertible` (the give exactly undoes the take, or the take the give).
    fn hold_step(&mut self, n: usize, before: u32, take: bool, mask: u64, invertible: bool) {
        let (Some(now), Some(memo)) = (self.now.get_mut(n), self.memo.get_mut(n)) else { return };
        if let Some(&(.., after)) =
            memo.iter().find(|&&(b, t, m, _)| b == before && t == take && m == mask)
        {
            *now = after;
            return;
        }
        if memo.len() + 2 > HOLD_MEMO_MAX {
            memo.drain(..2);
        }
        memo.push((before, take, mask, *now));
        if invertible {
            memo.push((*now, !take, mask, before));
        }
    }
}

impl std::fmt::Debug for NodeVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeVersions")
    }
}

impl Clone for Gradient {
    fn clone(&self) -> Gradient {
        Gradient { mix: self.mix.clone(), scores: BTreeMap::new(), entries: 0 }
    }
}

impl Capacity {
    /// The target mix placement measures fragmentation against; `None`: best fit.
    pub fn set_target_mix(&mut self, mix: Option<TargetMix>) {
        self.gradient = Gradient { mix, scores: BTreeMap::new(), entries: 0 };
    }

    /// Whether placement rates by the gradient (a target mix is set).
    pub fn gradient_active(&self) -> bool {
        self.gradient.mix.is_some()
    }

    /// How the gradient rates `placement` (of members of `shape` on `model`) now: its first
    /// member's node's (score, tie-break), to weigh placements on different models against
    /// each other. `None` without a mix or where the gradient does not apply.
    pub fn placement_rank(
        &self,
        model: Option<ModelId>,
        shape: MemberShape,
        placement: &Placement,
    ) -> Option<(i64, i64)> {
        let mix = self.gradient.mix.as_ref()?;
        let (pod, model) = member_pod(model, shape)?;
        let node = self.nodes.get(placement.members.first()?.node.0 as usize)?;
        if node.free_mem < shape.mem {
            return None;
        }
        rate_node(node, model, &pod, mix).0
    }

    /// Marks a node changed: its cached scores are stale.
    pub(super) fn touch(&mut self, node: NodeId) {
        self.node_version.bump(node.0 as usize);
    }

    /// Holds (`take`) or gives back whole free devices for a reservation, as `take` and
    /// `give` with no CPU or memory, keeping the nodes' cached scores where a node returns to
    /// a state it had (`NodeVersions::hold_step`).
    pub fn hold(&mut self, part: &Placement, take: bool) {
        for member in &part.members {
            let n = member.node.0 as usize;
            let Some(node) = self.nodes.get(n) else { continue };
            // The devices as a mask, when each is a whole device (the memo's key).
            let mask = member.devices.iter().try_fold(0u64, |mask, d| {
                let bit = 1u64.checked_shl(u32::from(d.device))?;
                (d.mig.is_none() && d.shares == FULL && mask & bit == 0).then_some(mask | bit)
            });
            // Exactly undone by the opposite step: every device wholly free (to take) or
            // wholly taken (to give) on a usable node.
            let invertible = !node.unavailable
                && member.devices.iter().all(|d| {
                    node.devices
                        .get(d.device as usize)
                        .is_some_and(|dev| !dev.occupied && dev.free == if take { FULL } else { 0 })
                });
            let before = self.node_version.now.get(n).copied().unwrap_or(0);
            if take {
                self.take_member(member, 0, 0);
            } else {
                self.give_member(member, 0, 0);
            }
            if let Some(mask) = mask {
                self.node_version.hold_step(n, before, take, mask, invertible);
            }
        }
    }

    /// Where the gradient puts one member: `None` when it does not apply (no mix yet, a MIG
    /// request, a model the mix cannot name), so the caller places by best fit; else the
    /// placement, or `Some(None)` when nothing fits.
    pub(super) fn gradient_member(
        &mut self,
        model: Option<ModelId>,
        shape: MemberShape,
    ) -> Option<Option<MemberPlacement>> {
        let (pod, model_and_bit) = member_pod(model, shape)?;
        let model = model_and_bit.map(|(m, _)| m);
        let Capacity { nodes, node_version, gradient, model_nodes, .. } = self;
        let Gradient { mix, scores, entries } = gradient;
        let mix = mix.as_ref()?;
        let key: ShapeKey = (model, pod.gpus, pod.gpu_milli, shape.cpu);
        let candidates = match model {
            Some(m) => model_nodes.get(m.0 as usize).map_or(0, Vec::len),
            None => nodes.len(),
        };
        if *entries + candidates > ENTRIES_MAX && !scores.contains_key(&key) {
            scores.clear();
            *entries = 0;
        }
        let cache = scores.entry(key).or_insert_with(|| {
            *entries += candidates;
            vec![Cached::default(); candidates]
        });
        // The first node with the highest rank wins; memory, not part of the rank, is only
        // read for a node that would win, so most nodes cost a cache entry and a version.
        let mut best: Option<((i64, i64), NodeId, u16)> = None;
        let mut visit = |position: usize, n: NodeId| {
            let i = n.0 as usize;
            let (Some(entry), Some(&version)) = (cache.get_mut(position), node_version.now.get(i))
            else {
                return;
            };
            if entry.version != version {
                let (rank, device) = rate_node(&nodes[i], model_and_bit, &pod, mix);
                *entry = Cached { version, rank, device };
            }
            let Some(rank) = entry.rank else { return };
            if best.is_some_and(|(b, _, _)| rank <= b) || nodes[i].free_mem < shape.mem {
                return;
            }
            best = Some((rank, n, entry.device));
        };
        match model {
            Some(m) => {
                let of_model = model_nodes.get(m.0 as usize).map_or(&[][..], Vec::as_slice);
                for (position, &n) in of_model.iter().enumerate() {
                    visit(position, n);
                }
            }
            None => {
                for n in 0..nodes.len() {
                    visit(n, NodeId(n as u32));
                }
            }
        }
        let Some((_, node_id, device)) = best else { return Some(None) };
        let node = &nodes[node_id.0 as usize];
        let devices = match (model, shape.gpus) {
            (Some(m), GpuRequest::Whole(k)) if k > 0 => pick_whole_devices(node, m, k),
            (Some(_), GpuRequest::Shares(s)) => vec![DeviceShare { device, shares: s, mig: None }],
            _ => Vec::new(),
        };
        Some(Some(MemberPlacement { node: node_id, devices }))
    }
}

/// A member as the packing scorer sees it, with its model and the model's bit (`None` for
/// CPU-only work); `None` where the gradient does not apply (MIG, a model beyond the mix's
/// reach).
fn member_pod(
    model: Option<ModelId>,
    shape: MemberShape,
) -> Option<(PodShape, Option<(ModelId, u8)>)> {
    let (gpus, gpu_milli) = match (model, shape.gpus) {
        (None, _) | (_, GpuRequest::Whole(0)) => (0u8, 0u16),
        (Some(_), GpuRequest::Whole(k)) => (u8::try_from(k).ok()?, MILLI),
        (Some(_), GpuRequest::Shares(s)) => (1, u16::try_from(s).ok().filter(|&s| s < MILLI)?),
        (Some(_), GpuRequest::Mig(_)) => return None,
    };
    let model = match model {
        Some(m) if gpus > 0 => {
            let bit = u8::try_from(m.0).ok().filter(|&b| usize::from(b) < ModelSet::MODELS_MAX)?;
            Some((m, bit))
        }
        _ => None,
    };
    let pod = PodShape {
        cpu_milli: shape.cpu,
        memory_mib: shape.mem,
        gpus,
        gpu_milli,
        models: ModelSet::ANY,
        class: 0,
    };
    Some((pod, model))
}

/// One node's (score, tie-break) for `pod` and the device a sharing pod takes there, or
/// `None` when it does not fit (memory aside: the caller checks it). `model`: the GPU model and its bit; `None` for CPU-only.
fn rate_node(
    node: &NodeCap,
    model: Option<(ModelId, u8)>,
    pod: &PodShape,
    mix: &TargetMix,
) -> (Option<(i64, i64)>, u16) {
    if node.unavailable || node.free_cpu < pod.cpu_milli {
        return (None, 0);
    }
    // The node's GPUs of the model (for CPU-only work: of its first model) that may take
    // whole or fractional work, with their device numbers.
    let view_model = model.map(|(m, _)| m).or_else(|| node.devices.first().map(|d| d.model));
    let mut free: Vec<u16> = Vec::with_capacity(node.devices.len());
    let mut index: Vec<u16> = Vec::with_capacity(node.devices.len());
    for (i, d) in node.devices.iter().enumerate() {
        if Some(d.model) == view_model && !d.mig_in_use() {
            free.push(u16::try_from(d.free.min(FULL)).unwrap_or(MILLI));
            index.push(i as u16);
        }
    }
    let fits = pod.is_cpu_only()
        || if pod.gpu_milli == MILLI {
            free.iter().filter(|&&f| f == MILLI).count() >= usize::from(pod.gpus)
        } else {
            free.iter().any(|&f| f >= pod.gpu_milli)
        };
    if !fits {
        return (None, 0);
    }
    let bit = match model {
        Some((_, bit)) => bit,
        // CPU-only: the view's model when the mix can name it; a node of another model
        // scores on its CPU alone (its GPUs count as no class's).
        None => view_model.and_then(|m| u8::try_from(m.0).ok()).unwrap_or(u8::MAX),
    };
    let fragment = mix.node_fragment(node.free_cpu, bit, &free);
    let view = GradientNode { cpu_free: node.free_cpu, model: bit, gpu_free: &free, fragment };
    let (score, gpu) = allot_score(view, pod, mix);
    let free_after: i64 = free.iter().map(|&f| i64::from(f)).sum::<i64>()
        - i64::try_from(pod.total_milli()).unwrap_or(i64::MAX);
    let tie_break = if pod.is_cpu_only() {
        -i64::try_from(node.free_cpu.saturating_sub(pod.cpu_milli)).unwrap_or(i64::MAX)
    } else {
        -free_after
    };
    let device = index.get(usize::from(gpu)).copied().unwrap_or(0);
    (Some((score, tie_break)), device)
}
