//! Packing: GPU placement policies over nodes whose GPUs are split into 1/1000 shares, and the
//! fragmentation measure of FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23).
//!
//! A [`PackCluster`] holds the free CPU, memory and per-GPU shares of every node, in a fixed
//! tie-break order: when several nodes score the same, the earliest wins. [`PackCluster::choose`]
//! runs one policy for one pod; [`PackCluster::commit`] books the result. The six baselines are
//! written from the FGD paper's description and its artifact's documented behaviour (see
//! `shared/docs/reference/fgd-method.md`), including their integer truncations, because those
//! decide ties and ties decide results.
//!
//! allot's own policy, [`PackPolicy::Allot`], is FGD's gradient plus a second loss FGD only sees
//! through its class thresholds: GPUs stranded by a node's CPU. See [`allot_score`].
//!
//! Scores depend only on a node's state and the pod's *score class* (CPU, GPU count, share,
//! allowed models), so they are cached per (class, node) and recomputed only for nodes that
//! changed since: an arrival-only run recomputes a handful of nodes per pod, not all of them.

use std::fmt;

/// Shares per GPU.
pub const MILLI: u16 = 1000;
/// Normalising constants of the FGD artifact's scorers: the largest node's CPU (millicores)
/// and GPU shares (8 GPUs).
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: i64 = 8_000;

/// One of the placement policies a [`PackCluster`] can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PackPolicy {
    /// A uniformly random feasible node; for a shared GPU, a uniformly random fitting GPU.
    Random,
    /// Tetris-like: the smallest dot product of the node's free (CPU, GPU) with the request.
    DotProd,
    /// Nodes already hosting pods of the same GPU shape first.
    Clustering,
    /// Partly used GPUs first, then free GPUs on used nodes, then empty nodes.
    Packing,
    /// The least free CPU and GPU left after placement.
    BestFit,
    /// Fragmentation Gradient Descent: the smallest growth of expected fragmentation.
    Fgd,
    /// allot's: the smallest growth of expected fragmentation plus GPUs stranded by CPU.
    Allot,
}

impl PackPolicy {
    pub const ALL: [PackPolicy; 7] = [
        PackPolicy::Random,
        PackPolicy::DotProd,
        PackPolicy::Clustering,
        PackPolicy::Packing,
        PackPolicy::BestFit,
        PackPolicy::Fgd,
        PackPolicy::Allot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PackPolicy::Random => "random",
            PackPolicy::DotProd => "dotprod",
            PackPolicy::Clustering => "clustering",
            PackPolicy::Packing => "packing",
            PackPolicy::BestFit => "bestfit",
            PackPolicy::Fgd => "fgd",
            PackPolicy::Allot => "allot",
        }
    }

    pub fn parse(name: &str) -> Option<PackPolicy> {
        PackPolicy::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for PackPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of GPU models as a bit mask over model indexes 0..64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelSet(pub u64);

impl ModelSet {
    pub const ANY: ModelSet = ModelSet(u64::MAX);
    /// The most distinct GPU models a packing run can tell apart.
    pub const MODELS_MAX: usize = 64;

    pub fn contains(self, model: u8) -> bool {
        model < 64 && self.0 & (1u64 << model) != 0
    }

    pub fn with(self, model: u8) -> ModelSet {
        ModelSet(self.0 | (1u64 << (model % 64)))
    }
}

/// A node's capacity. `model` is an index below [`ModelSet::MODELS_MAX`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackNodeSpec {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u8,
    pub model: u8,
}

/// What a pod asks for. `gpus == 0` or `gpu_milli == 0` is a CPU-only pod. A pod with one GPU
/// and `gpu_milli < 1000` shares a GPU; otherwise each of its GPUs needs `gpu_milli` free.
/// `class` identifies the pod's score class — pods equal in everything but memory share one —
/// and indexes the score cache; the caller numbers classes densely from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodShape {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u8,
    pub gpu_milli: u16,
    pub models: ModelSet,
    pub class: u32,
}

impl PodShape {
    pub fn is_cpu_only(&self) -> bool {
        self.gpus == 0 || self.gpu_milli == 0
    }

    fn is_sharing(&self) -> bool {
        self.gpus == 1 && self.gpu_milli > 0 && self.gpu_milli < MILLI
    }

    /// GPU shares the pod takes in all.
    pub fn total_milli(&self) -> u64 {
        if self.is_cpu_only() { 0 } else { u64::from(self.gpus) * u64::from(self.gpu_milli) }
    }

    /// Clustering's tag: 0 for GPU-sharing pods, k for k whole GPUs, `None` for CPU-only.
    fn shape_tag(&self) -> Option<u8> {
        if self.is_cpu_only() {
            None
        } else if self.is_sharing() {
            Some(0)
        } else {
            Some(self.gpus)
        }
    }
}

/// One class of FGD's target workload with its popularity (the popularities sum to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetClass {
    pub cpu_milli: u64,
    pub gpus: u8,
    pub gpu_milli: u16,
    pub models: ModelSet,
    pub popularity: f64,
}

/// The target workload FGD measures fragmentation against. The per-class test "do `gpus` GPUs
/// with at least `gpu_milli` free exist, and how much free share sits on GPUs with less" only
/// depends on the share threshold, so it is computed once per distinct threshold per node.
#[derive(Clone, Debug, Default)]
pub struct TargetMix {
    classes: Vec<TargetClass>,
    /// Mean CPU millicores GPU-using classes ask per whole GPU (1000 shares), by popularity.
    cpu_per_gpu: f64,
    thresholds: Vec<u16>,
    threshold_of_class: Vec<usize>,
}

impl TargetMix {
    pub fn new(classes: Vec<TargetClass>) -> TargetMix {
        let mut thresholds: Vec<u16> =
            classes.iter().filter(|c| c.gpus > 0 && c.gpu_milli > 0).map(|c| c.gpu_milli).collect();
        thresholds.sort_unstable();
        thresholds.dedup();
        let threshold_of_class = classes
            .iter()
            .map(|c| thresholds.binary_search(&c.gpu_milli).unwrap_or(usize::MAX))
            .collect();
        let (mut cpu, mut shares) = (0.0, 0.0);
        for c in classes.iter().filter(|c| c.gpus > 0 && c.gpu_milli > 0) {
            cpu += c.popularity * c.cpu_milli as f64;
            shares += c.popularity * f64::from(c.gpus) * f64::from(c.gpu_milli);
        }
        let cpu_per_gpu = if shares > 0.0 { 1000.0 * cpu / shares } else { 0.0 };
        TargetMix { classes, cpu_per_gpu, thresholds, threshold_of_class }
    }

    pub fn classes(&self) -> &[TargetClass] {
        &self.classes
    }

    /// GPU shares on a node that the mix cannot use for lack of CPU there: free shares beyond
    /// what the free CPU feeds at the mix's CPU per GPU. 0 when the mix asks no CPU.
    pub fn cpu_stranded(&self, cpu_free: u64, gpu_free_total: u64) -> f64 {
        if self.cpu_per_gpu <= 0.0 {
            return 0.0;
        }
        (gpu_free_total as f64 - 1000.0 * cpu_free as f64 / self.cpu_per_gpu).max(0.0)
    }

    /// FGD's expected fragment of one node, in shares: for every target class, the free shares
    /// that class could not use here (all of them if it cannot run here at all, or is CPU-only;
    /// otherwise those on GPUs with less free than it needs), weighted by popularity.
    pub fn node_fragment(&self, cpu_free: u64, model: u8, gpu_free: &[u16]) -> f64 {
        let idle: u64 = gpu_free.iter().map(|&f| u64::from(f)).sum();
        if idle == 0 {
            return 0.0;
        }
        let mut count_at_least = [0u8; 64];
        let mut sum_below = [0u64; 64];
        let thresholds = &self.thresholds[..self.thresholds.len().min(64)];
        for (t, &threshold) in thresholds.iter().enumerate() {
            for &free in gpu_free {
                if free >= threshold {
                    count_at_least[t] = count_at_least[t].saturating_add(1);
                } else {
                    sum_below[t] += u64::from(free);
                }
            }
        }
        let idle_f = idle as f64;
        let mut fragment = 0.0;
        for (class, &t) in self.classes.iter().zip(&self.threshold_of_class) {
            // CPU-only classes count every idle share; so does a class that cannot run here.
            let runs_here = class.gpus > 0
                && class.gpu_milli > 0
                && t < thresholds.len()
                && class.models.contains(model)
                && cpu_free >= class.cpu_milli
                && count_at_least[t] >= class.gpus;
            let unusable = if runs_here { sum_below[t] as f64 } else { idle_f };
            fragment += class.popularity * unusable;
        }
        fragment
    }
}

/// Where a pod goes: a node (its index in tie-break order) and the GPUs it takes there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackPlacement {
    pub node: usize,
    pub gpus: Vec<u8>,
}

/// Random numbers for the `random` policy, supplied by the caller so the core stays pure.
pub trait RandomSource {
    /// Uniform in `0..n`; `n > 0`.
    fn below(&mut self, n: u64) -> u64;
}

#[derive(Clone, Debug)]
struct NodeState {
    cpu_free: u64,
    memory_free: u64,
    model: u8,
    gpu_free: Vec<u16>,
    /// The most free shares on one GPU, and how many GPUs are wholly free: with these, the
    /// feasibility test of one-GPU and whole-GPU pods (nearly all pods) is two comparisons.
    max_free: u16,
    fully_free: u8,
    /// Clustering's GPU-shape tags hosted here, with counts; few entries.
    tags: Vec<(u8, u32)>,
    /// Bumped on every change; cached scores remember the version they were computed at.
    version: u32,
    fragment: f64,
}

impl NodeState {
    fn free_total(&self) -> i64 {
        self.gpu_free.iter().map(|&f| i64::from(f)).sum()
    }

    fn fits(&self, pod: &PodShape) -> bool {
        if self.cpu_free < pod.cpu_milli || self.memory_free < pod.memory_mib {
            return false;
        }
        if pod.is_cpu_only() {
            return true;
        }
        if !pod.models.contains(self.model) {
            return false;
        }
        if pod.gpus == 1 {
            self.max_free >= pod.gpu_milli
        } else if pod.gpu_milli == MILLI {
            self.fully_free >= pod.gpus
        } else {
            self.gpu_free.iter().filter(|&&f| f >= pod.gpu_milli).count() >= usize::from(pod.gpus)
        }
    }

    fn refresh_summary(&mut self) {
        self.max_free = self.gpu_free.iter().copied().max().unwrap_or(0);
        let full = self.gpu_free.iter().filter(|&&f| f == MILLI).count();
        self.fully_free = u8::try_from(full).unwrap_or(u8::MAX);
    }

    fn exclusive_gpus(&self, pod: &PodShape) -> Vec<u8> {
        exclusive_gpus(&self.gpu_free, pod)
    }

    fn gradient_node(&self) -> GradientNode<'_> {
        GradientNode {
            cpu_free: self.cpu_free,
            model: self.model,
            gpu_free: &self.gpu_free,
            fragment: self.fragment,
        }
    }

    /// For a sharing pod: the fitting GPU with the least free, lowest index on ties.
    fn tightest_gpu(&self, pod: &PodShape) -> Option<u8> {
        (0..self.gpu_free.len() as u8)
            .filter(|&g| self.gpu_free[usize::from(g)] >= pod.gpu_milli)
            .min_by_key(|&g| (self.gpu_free[usize::from(g)], g))
    }
}

/// The GPUs a pod that does not share one takes: those with enough free, least free first,
/// lowest index among equals — for whole GPUs, the lowest-index fully free ones.
fn exclusive_gpus(gpu_free: &[u16], pod: &PodShape) -> Vec<u8> {
    let mut order: Vec<u8> =
        (0..gpu_free.len() as u8).filter(|&g| gpu_free[usize::from(g)] >= pod.gpu_milli).collect();
    order.sort_by_key(|&g| gpu_free[usize::from(g)]);
    order.truncate(usize::from(pod.gpus));
    order
}

/// A node as the fragmentation gradient sees it: free CPU, GPU model, free shares of each of
/// its GPUs, and its expected fragment now ([`TargetMix::node_fragment`] of the same state).
/// `sim pack`'s cluster and the engine's capacity both score through this.
#[derive(Clone, Copy, Debug)]
pub struct GradientNode<'a> {
    pub cpu_free: u64,
    pub model: u8,
    pub gpu_free: &'a [u16],
    pub fragment: f64,
}

impl GradientNode<'_> {
    fn free_total(&self) -> i64 {
        self.gpu_free.iter().map(|&f| i64::from(f)).sum()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct CachedScore {
    version: u32,
    score: i64,
    gpu: u8,
}

/// Nodes with free resources, in tie-break order, with the target mix fragmentation is
/// measured against and a score cache.
#[derive(Clone, Debug)]
pub struct PackCluster {
    nodes: Vec<NodeState>,
    mix: TargetMix,
    capacity_milli: u64,
    used_milli: u64,
    cache: Vec<ClassCache>,
    scratch: Vec<usize>,
}

/// Cached scores of one score class, with the shape they were computed for: a caller that
/// reuses a class number for another shape gets fresh scores, not wrong ones.
#[derive(Clone, Debug, Default)]
struct ClassCache {
    shape: Option<(u64, u8, u16, ModelSet)>,
    scores: Vec<CachedScore>,
}

impl PackCluster {
    /// Nodes in tie-break order: on equal scores the earlier node wins.
    pub fn new(nodes: &[PackNodeSpec], mix: TargetMix) -> PackCluster {
        let nodes: Vec<NodeState> = nodes
            .iter()
            .map(|spec| {
                let gpu_free = vec![MILLI; usize::from(spec.gpus)];
                let fragment = mix.node_fragment(spec.cpu_milli, spec.model, &gpu_free);
                let mut node = NodeState {
                    cpu_free: spec.cpu_milli,
                    memory_free: spec.memory_mib,
                    model: spec.model,
                    gpu_free,
                    max_free: 0,
                    fully_free: 0,
                    tags: Vec::new(),
                    version: 1,
                    fragment,
                };
                node.refresh_summary();
                node
            })
            .collect();
        let capacity_milli = nodes.iter().map(|n| n.gpu_free.len() as u64 * 1000).sum();
        PackCluster {
            nodes,
            mix,
            capacity_milli,
            used_milli: 0,
            cache: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn capacity_milli(&self) -> u64 {
        self.capacity_milli
    }

    /// Allocated GPU shares.
    pub fn used_milli(&self) -> u64 {
        self.used_milli
    }

    /// FGD's cluster fragmentation: the sum of the nodes' expected fragments, in shares.
    pub fn fragment_total(&self) -> f64 {
        self.nodes.iter().map(|n| n.fragment).sum()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Free shares of each GPU of a node.
    pub fn gpu_free(&self, node: usize) -> &[u16] {
        self.nodes.get(node).map_or(&[], |n| &n.gpu_free)
    }

    /// Where `policy` puts `pod`, or `None` when no node can take it.
    pub fn choose(
        &mut self,
        policy: PackPolicy,
        pod: &PodShape,
        random: &mut dyn RandomSource,
    ) -> Option<PackPlacement> {
        if policy == PackPolicy::Random {
            return self.choose_random(pod, random);
        }
        let class = pod.class as usize;
        if self.cache.len() <= class {
            self.cache.resize_with(class + 1, ClassCache::default);
        }
        let shape = Some((pod.cpu_milli, pod.gpus, pod.gpu_milli, pod.models));
        let entry = &mut self.cache[class];
        if entry.shape != shape || entry.scores.len() != self.nodes.len() {
            *entry = ClassCache { shape, scores: vec![CachedScore::default(); self.nodes.len()] };
        }
        let mut best: Option<(i64, usize, u8)> = None;
        for (index, node) in self.nodes.iter().enumerate() {
            if !node.fits(pod) {
                continue;
            }
            let cached = &mut self.cache[class].scores[index];
            if cached.version != node.version {
                let (score, gpu) = score(policy, node, pod, &self.mix);
                *cached = CachedScore { version: node.version, score, gpu };
            }
            if best.is_none_or(|(s, _, _)| cached.score > s) {
                best = Some((cached.score, index, cached.gpu));
            }
        }
        let (_, node, gpu) = best?;
        let gpus = if pod.is_cpu_only() {
            Vec::new()
        } else if pod.is_sharing() {
            vec![gpu]
        } else {
            self.nodes[node].exclusive_gpus(pod)
        };
        Some(PackPlacement { node, gpus })
    }

    fn choose_random(
        &mut self,
        pod: &PodShape,
        random: &mut dyn RandomSource,
    ) -> Option<PackPlacement> {
        self.scratch.clear();
        self.scratch
            .extend(self.nodes.iter().enumerate().filter(|(_, n)| n.fits(pod)).map(|(i, _)| i));
        if self.scratch.is_empty() {
            return None;
        }
        let node = self.scratch[random.below(self.scratch.len() as u64) as usize];
        let state = &self.nodes[node];
        let gpus = if pod.is_cpu_only() {
            Vec::new()
        } else if pod.is_sharing() {
            let fitting: Vec<u8> = (0..state.gpu_free.len() as u8)
                .filter(|&g| state.gpu_free[usize::from(g)] >= pod.gpu_milli)
                .collect();
            vec![fitting[random.below(fitting.len() as u64) as usize]]
        } else {
            state.exclusive_gpus(pod)
        };
        Some(PackPlacement { node, gpus })
    }

    /// Book a placement [`choose`](Self::choose) returned for the same pod.
    pub fn commit(&mut self, pod: &PodShape, placement: &PackPlacement) {
        let Some(node) = self.nodes.get_mut(placement.node) else { return };
        node.cpu_free = node.cpu_free.saturating_sub(pod.cpu_milli);
        node.memory_free = node.memory_free.saturating_sub(pod.memory_mib);
        for &gpu in &placement.gpus {
            if let Some(free) = node.gpu_free.get_mut(usize::from(gpu)) {
                let taken = (*free).min(pod.gpu_milli);
                *free -= taken;
                self.used_milli += u64::from(taken);
            }
        }
        if let Some(tag) = pod.shape_tag() {
            match node.tags.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, count)) => *count += 1,
                None => node.tags.push((tag, 1)),
            }
        }
        node.refresh_summary();
        node.version = node.version.wrapping_add(1).max(1);
        node.fragment = self.mix.node_fragment(node.cpu_free, node.model, &node.gpu_free);
    }
}

impl PackCluster {
    /// Give back what [`commit`](Self::commit) booked for the same pod and placement: a pod
    /// moved elsewhere (the experiment's migrations).
    pub fn release(&mut self, pod: &PodShape, placement: &PackPlacement) {
        let Some(node) = self.nodes.get_mut(placement.node) else { return };
        node.cpu_free = node.cpu_free.saturating_add(pod.cpu_milli);
        node.memory_free = node.memory_free.saturating_add(pod.memory_mib);
        for &gpu in &placement.gpus {
            if let Some(free) = node.gpu_free.get_mut(usize::from(gpu)) {
                let given = (1000 - (*free).min(1000)).min(pod.gpu_milli);
                *free += given;
                self.used_milli -= u64::from(given);
            }
        }
        if let Some(tag) = pod.shape_tag()
            && let Some(i) = node.tags.iter().position(|(t, _)| *t == tag)
        {
            node.tags[i].1 -= 1;
            if node.tags[i].1 == 0 {
                node.tags.remove(i);
            }
        }
        node.refresh_summary();
        node.version = node.version.wrapping_add(1).max(1);
        node.fragment = self.mix.node_fragment(node.cpu_free, node.model, &node.gpu_free);
    }
}

/// A node's score for a pod under a deterministic policy, and the GPU a sharing pod would take.
/// Higher wins. The node is known to fit the pod.
fn score(policy: PackPolicy, node: &NodeState, pod: &PodShape, mix: &TargetMix) -> (i64, u8) {
    let best_gpu = || if pod.is_sharing() { node.tightest_gpu(pod).unwrap_or(0) } else { 0 };
    match policy {
        PackPolicy::Random => (0, 0),
        PackPolicy::DotProd => {
            let node_cpu = node.cpu_free as f64 / MAX_SPEC_CPU;
            let node_gpu = node.free_total() as f64 / MAX_SPEC_GPU as f64;
            let pod_cpu = pod.cpu_milli as f64 / MAX_SPEC_CPU;
            let pod_gpu = pod.total_milli() as f64 / MAX_SPEC_GPU as f64;
            let dot = node_cpu * pod_cpu + node_gpu * pod_gpu;
            (truncate(100.0 * (1.0 - dot / 2.0)), best_gpu())
        }
        PackPolicy::BestFit => {
            // The artifact min-max normalises these over the feasible nodes with integer
            // division; only the maximum maps to 100, so the winner is the maximum raw score.
            let cpu_left = node.cpu_free as f64 - pod.cpu_milli as f64;
            let gpu_left = (node.free_total() - pod.total_milli() as i64) as f64;
            let waste = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU as f64;
            (truncate(100.0 * (1.0 - waste)), best_gpu())
        }
        PackPolicy::Clustering => {
            let Some(tag) = pod.shape_tag() else { return (0, 0) };
            let base = 25 * (MAX_SPEC_GPU - node.free_total()) / MAX_SPEC_GPU;
            let hosts_tag = node.tags.iter().any(|&(t, c)| t == tag && c > 0);
            let bonus = match (hosts_tag, node.tags.len()) {
                (true, 1) => 75,
                (true, _) => 50,
                (false, 0) => 25,
                (false, _) => 0,
            };
            (base + bonus, best_gpu())
        }
        PackPolicy::Packing => (packing_score(node, pod), best_gpu()),
        PackPolicy::Fgd => fgd_score(node.gradient_node(), pod, mix),
        PackPolicy::Allot => allot_score(node.gradient_node(), pod, mix),
    }
}

fn truncate(value: f64) -> i64 {
    value.trunc() as i64
}

/// GpuPacking: partly used GPUs first (fewer free shares on them is better), then fully free
/// GPUs on used nodes (fewer is better), then empty nodes (fewer GPUs is better).
fn packing_score(node: &NodeState, pod: &PodShape) -> i64 {
    if pod.is_cpu_only() {
        return 0;
    }
    let gpu_count = node.gpu_free.len() as i64;
    let fully_free = node.gpu_free.iter().filter(|&&f| f == MILLI).count() as i64;
    if fully_free == gpu_count {
        return (33 - fully_free).max(fully_free);
    }
    let mut order: Vec<usize> = (0..node.gpu_free.len()).collect();
    order.sort_by_key(|&g| node.gpu_free[g]);
    let chosen: Vec<usize> = order
        .into_iter()
        .filter(|&g| node.gpu_free[g] >= pod.gpu_milli)
        .take(usize::from(pod.gpus))
        .collect();
    let fully_free_used = chosen.iter().filter(|&&g| node.gpu_free[g] == MILLI).count() as i64;
    if fully_free_used > 0 {
        return (50 - fully_free_used).max(33);
    }
    let free_pct: i64 = chosen.iter().map(|&g| i64::from(node.gpu_free[g]) * 100 / 1000).sum();
    (100 - free_pct / 10).max(50)
}

/// FGD: score = trunc(100 · sigmoid((F_before − F_after) / 1000)), ties to the node order.
fn fgd_score(node: GradientNode<'_>, pod: &PodShape, mix: &TargetMix) -> (i64, u8) {
    let before = node.fragment;
    best_candidate(node, pod, mix, |after| truncate(100.0 * sigmoid((before - after) / 1000.0)))
}

/// allot: FGD's gradient with the growth of CPU-stranded GPU shares added to the fragment,
/// quantised as FGD's is: score = trunc(100 · sigmoid((F_before − F_after − ΔS) / 1000)).
///
/// FGD counts a node's free GPUs as fragment for a class only when the class's CPU does not
/// fit at all, so it happily leaves a node with 6 free GPUs and 8 free cores: the next pods
/// need about 11 cores per GPU, and most of those GPUs never run anything. ΔS charges that
/// loss as it is created, in the same unit (shares), with the mix's CPU per GPU — no tuned
/// weight. On the openb traces this removes almost all GPUs stranded on CPU-exhausted nodes.
/// (Two things that did not help and were left out: finer quantisation of the same sum, and
/// keeping whole nodes free for gangs; see docs/benchmarks.md.)
///
/// The node is known to fit the pod; the result is the score and, for a pod sharing a GPU,
/// the GPU it takes (an index into `node.gpu_free`).
pub fn allot_score(node: GradientNode<'_>, pod: &PodShape, mix: &TargetMix) -> (i64, u8) {
    let gpu_free = node.free_total().max(0) as u64;
    let cpu_after = node.cpu_free.saturating_sub(pod.cpu_milli);
    let stranded_before = mix.cpu_stranded(node.cpu_free, gpu_free);
    let stranded_after = mix.cpu_stranded(cpu_after, gpu_free.saturating_sub(pod.total_milli()));
    let growth = stranded_after - stranded_before;
    let before = node.fragment;
    best_candidate(node, pod, mix, |after| {
        truncate(100.0 * sigmoid((before - after - growth) / 1000.0))
    })
}

/// Rate the fragment left by every way `pod` can go on `node` and keep the best: a sharing pod tries each fitting
/// GPU (equal free shares rate equally, so each distinct value once; the lowest index wins
/// ties); other pods have one way (the lowest-index GPUs with enough free).
fn best_candidate(
    node: GradientNode<'_>,
    pod: &PodShape,
    mix: &TargetMix,
    rate: impl Fn(f64) -> i64,
) -> (i64, u8) {
    let cpu_free = node.cpu_free.saturating_sub(pod.cpu_milli);
    let rate_state = |gpus: &[u16]| rate(mix.node_fragment(cpu_free, node.model, gpus));
    if pod.is_cpu_only() {
        return (rate_state(node.gpu_free), 0);
    }
    let mut after = node.gpu_free.to_vec();
    if !pod.is_sharing() {
        for gpu in exclusive_gpus(node.gpu_free, pod) {
            let free = &mut after[usize::from(gpu)];
            *free -= (*free).min(pod.gpu_milli);
        }
        return (rate_state(&after), 0);
    }
    let mut best: Option<(i64, u8)> = None;
    let mut tried: [(u16, i64); 8] = [(u16::MAX, 0); 8];
    let mut tried_len = 0;
    for gpu in 0..node.gpu_free.len() {
        let free = node.gpu_free[gpu];
        if free < pod.gpu_milli {
            continue;
        }
        let gpu_score = match tried[..tried_len].iter().find(|(f, _)| *f == free) {
            Some(&(_, s)) => s,
            None => {
                after[gpu] = free - pod.gpu_milli;
                let s = rate_state(&after);
                after[gpu] = free;
                if tried_len < tried.len() {
                    tried[tried_len] = (free, s);
                    tried_len += 1;
                }
                s
            }
        };
        if best.is_none_or(|(s, _)| gpu_score > s) {
            best = Some((gpu_score, gpu as u8));
        }
    }
    best.unwrap_or((0, 0))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
