//! The FGD packing experiment (Weng et al., USENIX ATC'23), run on `allot-core`'s placement
//! policies. The method, as `shared/docs/reference/fgd-method.md` describes the authors'
//! artifact:
//!
//! 1. Pods arrive one after another and never leave: first the trace's own pods (sorted by
//!    name, then shuffled by the seed), then seeded random copies of them (uniform, with
//!    replacement) until the requested GPU shares would pass `inflate` × capacity.
//! 2. Each pod goes where the policy says; a pod that fits nowhere fails and is skipped.
//! 3. After every pod, the allocated shares, FGD's fragmentation and the arrived demand are
//!    recorded; column k of a curve is the mean over the pods whose arrived demand rounds to
//!    k % of capacity (or, when none does, over k−1..=k+1).
//! 4. Node ties go to a seeded random node order fixed for the whole run.
//!
//! Every random draw comes from [`SimRng`] streams forked per purpose, so the six policies see
//! the same arrivals and node order for a seed (paired comparison), and a seed gives the same
//! numbers on every machine. They are not the Go artifact's streams, so single seeds differ
//! from the paper's; means over seeds are what compare.

use std::collections::BTreeMap;
use std::path::Path;

use allot_core::packing::{
    ModelSet, PackCluster, PackNodeSpec, PackPolicy, PodShape, RandomSource, TargetClass, TargetMix,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::bound::BoundProblem;
use crate::csv::CsvFile;
use crate::error::TraceError;
use crate::openb::{OpenbNode, OpenbPod};
use crate::rng::SimRng;

mod engine;
pub use engine::{run_seed_engine, run_seed_engine_migrating};

/// The name `sim pack --engine` reports its runs under.
pub const ENGINE_PLACEMENT: &str = "engine";

/// FGD's target workload keeps the most common pod classes until they cover this share of pods.
const TARGET_COVERAGE: f64 = 0.95;
/// A run never appends more copies than this many times the trace (guards a trace whose GPU
/// pods all ask for 0 shares, where the artifact's loop would never end).
const CLONES_PER_POD_MAX: usize = 100;

/// A trace made ready for packing: nodes, pods in name order, score classes, the target mix.
#[derive(Clone, Debug)]
pub struct PackInput {
    nodes: Vec<PackNodeSpec>,
    /// Pods sorted by name.
    pods: Vec<PodShape>,
    mix: TargetMix,
    pub capacity_milli: u64,
    pub models: Vec<String>,
}

impl PackInput {
    /// Turn loaded node and pod lists into packing input. Fails only when the trace names more
    /// GPU models than a run can tell apart.
    pub fn new(nodes: &[OpenbNode], pods: &[OpenbPod]) -> Result<PackInput, String> {
        let mut models: Vec<String> = Vec::new();
        let mut model_index = |name: &str| -> Result<u8, String> {
            if let Some(i) = models.iter().position(|m| m == name) {
                return Ok(i as u8);
            }
            if models.len() >= ModelSet::MODELS_MAX {
                return Err(format!(
                    "more than {} distinct GPU models; a packing run tells at most that many apart",
                    ModelSet::MODELS_MAX
                ));
            }
            models.push(name.to_owned());
            Ok((models.len() - 1) as u8)
        };
        let mut sorted_nodes: Vec<&OpenbNode> = nodes.iter().collect();
        sorted_nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut node_specs = Vec::with_capacity(nodes.len());
        for node in sorted_nodes {
            node_specs.push(PackNodeSpec {
                cpu_milli: node.cpu_milli,
                memory_mib: node.memory_mib,
                gpus: node.gpus.min(u32::from(u8::MAX)) as u8,
                model: model_index(&node.model)?,
            });
        }
        let mut sorted_pods: Vec<&OpenbPod> = pods.iter().collect();
        sorted_pods.sort_by(|a, b| a.name.cmp(&b.name));
        let mut classes: BTreeMap<(u64, u8, u16, ModelSet), u32> = BTreeMap::new();
        let mut shapes = Vec::with_capacity(pods.len());
        let mut census: BTreeMap<ClassKey, usize> = BTreeMap::new();
        for pod in sorted_pods {
            let milli = pod.gpu_milli.min(1000) as u16;
            let cpu_only = pod.num_gpu == 0 || milli == 0;
            let (gpus, milli) = if cpu_only { (0, 0) } else { (pod.num_gpu as u8, milli) };
            let mut allowed = if pod.gpu_spec.is_empty() { ModelSet::ANY } else { ModelSet(0) };
            for model in &pod.gpu_spec {
                allowed = allowed.with(model_index(model)?);
            }
            let next = classes.len() as u32;
            let class = *classes.entry((pod.cpu_milli, gpus, milli, allowed)).or_insert(next);
            shapes.push(PodShape {
                cpu_milli: pod.cpu_milli,
                memory_mib: pod.memory_mib,
                gpus,
                gpu_milli: milli,
                models: allowed,
                class,
            });
            let spec = if cpu_only { String::new() } else { pod.gpu_spec.join("|") };
            *census.entry((pod.cpu_milli, milli, gpus, spec)).or_default() += 1;
        }
        let mix = target_mix(&census, pods.len(), |name| {
            models.iter().position(|m| m == name).map(|i| i as u8)
        });
        let capacity_milli: u64 = node_specs.iter().map(|n| u64::from(n.gpus) * 1000).sum();
        if capacity_milli == 0 {
            return Err("the node list has no GPUs: the experiment measures GPU allocation, \
                        so give at least one GPU node"
                .to_owned());
        }
        Ok(PackInput { nodes: node_specs, pods: shapes, mix, capacity_milli, models })
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn target_classes(&self) -> &[TargetClass] {
        self.mix.classes()
    }

    /// FGD's fragmentation of the empty cluster, % of capacity.
    pub fn empty_fragmentation_pct(&self) -> f64 {
        let cluster = PackCluster::new(&self.nodes, self.mix.clone());
        100.0 * cluster.fragment_total() / self.capacity_milli.max(1) as f64
    }
}

/// A pod class of FGD's target workload: (CPU millicores, share per GPU, GPU count, model list
/// as written). Memory is not part of it.
type ClassKey = (u64, u16, u8, String);

/// FGD's target workload: pod classes (CPU, share, GPU count, model list) by popularity, the
/// most common first, until they cover [`TARGET_COVERAGE`] of the pods.
fn target_mix(
    census: &BTreeMap<ClassKey, usize>,
    pod_count: usize,
    model: impl Fn(&str) -> Option<u8>,
) -> TargetMix {
    let mut ranked: Vec<(&ClassKey, &usize)> = census.iter().collect();
    // Most pods first; equal counts: larger CPU, share and count first, then the model list.
    ranked.sort_by(|(ka, ca), (kb, cb)| {
        cb.cmp(ca)
            .then(kb.0.cmp(&ka.0))
            .then(kb.1.cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
            .then(ka.3.cmp(&kb.3))
    });
    let mut kept = Vec::new();
    let mut covered = 0usize;
    for (key, &count) in ranked {
        if covered as f64 >= TARGET_COVERAGE * pod_count as f64 {
            break;
        }
        covered += count;
        kept.push((key, count));
    }
    let classes = kept
        .into_iter()
        .map(|((cpu, milli, gpus, spec), count)| {
            let models = if spec.is_empty() {
                ModelSet::ANY
            } else {
                spec.split('|').filter_map(&model).fold(ModelSet(0), ModelSet::with)
            };
            TargetClass {
                cpu_milli: *cpu,
                gpus: *gpus,
                gpu_milli: *milli,
                models,
                popularity: count as f64 / covered.max(1) as f64,
            }
        })
        .collect();
    TargetMix::new(classes)
}

/// One seed's run of one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedRun {
    pub seed: u64,
    pub pods_arrived: usize,
    pub pods_failed: usize,
    /// Allocated GPU shares / capacity at the end of the run, %.
    pub final_allocation_pct: f64,
    /// Arrived GPU demand at the end, % of capacity.
    pub final_arrived_pct: f64,
    pub allocation_pct: Vec<Option<f64>>,
    pub fragmentation_pct: Vec<Option<f64>>,
    pub fragmentation_ratio_pct: Vec<Option<f64>>,
    /// The moves of a run with a migration budget (`sim pack --engine --migrate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStats>,
}

/// What a migration budget let the engine's defragmentation do in one seed's run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MigrationStats {
    /// At most this % of the pods placed so far may have been moved.
    pub budget_pct: f64,
    /// Pods placed at the end of the run.
    pub pods_placed: usize,
    /// Moves made (a pod moved twice counts twice).
    pub pods_moved: usize,
    /// `pods_moved` as % of `pods_placed`.
    pub moved_pct: f64,
    /// Defragmentation plans carried out.
    pub plans: usize,
    /// The plans' cost as `defrag.rs` charges it: each moved pod's GPUs × (time since its
    /// checkpoint, or start) + its GPUs × the restart cost.
    pub move_cost_gpu_ms: u64,
    pub move_cost_gpu_hours: f64,
    /// Moved pods the engine did not restart at once (cancelled); 0 when every plan held.
    pub pods_lost: usize,
}

/// Means over seeds of [`MigrationStats`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MigrationMean {
    pub budget_pct: f64,
    pub pods_moved: f64,
    pub moved_pct: f64,
    pub plans: f64,
    pub move_cost_gpu_hours: f64,
    pub pods_lost: f64,
}

/// One policy over several seeds: per-column means over seeds and each seed's run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PackReport {
    pub placement: String,
    /// `online` (the experiment) or `decreasing` (the hindsight reference).
    pub arrival_order: String,
    pub inflate: f64,
    pub seeds: Vec<u64>,
    pub nodes: usize,
    pub capacity_gpus: f64,
    pub pods_in_trace: usize,
    /// Column k: allocated GPU shares as % of capacity when arrived demand is k % of capacity.
    pub allocation_pct: Vec<Option<f64>>,
    /// Column k: FGD's fragmentation as % of capacity.
    pub fragmentation_pct: Vec<Option<f64>>,
    /// Column k: fragmentation as % of idle GPU shares.
    pub fragmentation_ratio_pct: Vec<Option<f64>>,
    pub per_seed: Vec<SeedRun>,
    pub wall_ms: u64,
    /// Means of the seeds' moves, for a run with a migration budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationMean>,
}

struct Draws(SimRng);

impl RandomSource for Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
}

/// Stream labels for [`SimRng::fork`].
const STREAM_ORDER: u64 = 1;
const STREAM_TUNE: u64 = 2;
const STREAM_NODES: u64 = 3;
const STREAM_POLICY: u64 = 4;

/// The arrival sequence of one seed: the trace shuffled, then copies up to `inflate`.
pub fn arrivals(input: &PackInput, inflate: f64, seed: u64) -> Vec<PodShape> {
    let root = SimRng::new(seed);
    let mut sequence = input.pods.clone();
    root.fork(STREAM_ORDER).shuffle(&mut sequence);
    let target = (inflate * input.capacity_milli as f64).round() as u64;
    let mut total: u64 = input.pods.iter().map(PodShape::total_milli).sum();
    if total == 0 || input.pods.is_empty() {
        return sequence;
    }
    let mut tune = root.fork(STREAM_TUNE);
    let limit = input.pods.len() * CLONES_PER_POD_MAX;
    for _ in 0..limit {
        let pod = input.pods[tune.below(input.pods.len() as u64) as usize];
        // The artifact's stop test adds one GPU's share, but the total grows by all of them.
        let per_gpu = if pod.is_cpu_only() { 0 } else { u64::from(pod.gpu_milli) };
        if total + per_gpu > target {
            break;
        }
        total += pod.total_milli();
        sequence.push(pod);
    }
    sequence
}

/// The packing problem of one seed's arrived pods (see [`crate::bound`]): its solution bounds
/// the final allocation of every policy on that seed.
pub fn bound_problem(input: &PackInput, inflate: f64, seed: u64) -> BoundProblem {
    BoundProblem::new(&input.nodes, &arrivals(input, inflate, seed))
}

/// The order pods arrive in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ArrivalOrder {
    /// The experiment's: the shuffled trace, then the copies.
    #[default]
    Online,
    /// The same pods sorted by GPU demand, largest first (then CPU): an offline hindsight
    /// reference (first-fit/best-fit-decreasing style), not something an online scheduler can
    /// do. The gap between the two separates the loss to arrival order from packing loss.
    Decreasing,
}

/// Run one policy for one seed.
pub fn run_seed(
    input: &PackInput,
    policy: PackPolicy,
    inflate: f64,
    seed: u64,
    order: ArrivalOrder,
) -> SeedRun {
    let root = SimRng::new(seed);
    let mut sequence = arrivals(input, inflate, seed);
    if order == ArrivalOrder::Decreasing {
        // Stable: equal pods keep their seeded order.
        sequence.sort_by_key(|p| std::cmp::Reverse((p.total_milli(), p.cpu_milli)));
    }
    let order = node_order(input, seed);
    let mut draws = Draws(root.fork(STREAM_POLICY));
    run_sequence(input, seed, &order, &sequence, inflate, |pod, cluster| {
        match cluster.choose(policy, pod, &mut draws) {
            Some(placement) => {
                cluster.commit(pod, &placement);
                true
            }
            None => false,
        }
    })
}

/// The nodes in one seed's tie-break order (the order node ids are given in).
fn node_order(input: &PackInput, seed: u64) -> Vec<PackNodeSpec> {
    let mut order = input.nodes.clone();
    SimRng::new(seed).fork(STREAM_NODES).shuffle(&mut order);
    order
}

/// Runs `sequence` over the nodes `order`: `place` puts each pod (booking it in the
/// cluster it is given, which measures allocation and fragmentation) or says it fits nowhere.
fn run_sequence(
    input: &PackInput,
    seed: u64,
    order: &[PackNodeSpec],
    sequence: &[PodShape],
    inflate: f64,
    mut place: impl FnMut(&PodShape, &mut PackCluster) -> bool,
) -> SeedRun {
    let mut cluster = PackCluster::new(order, input.mix.clone());
    let capacity_gpus = input.capacity_milli as f64 / 1000.0;
    let columns = column_count(inflate);
    let mut bins = Bins::new(columns + 2);
    let mut arrived: u64 = 0;
    let mut failed = 0;
    for pod in sequence {
        arrived += pod.total_milli();
        if !place(pod, &mut cluster) {
            failed += 1;
        }
        let used = cluster.used_milli();
        let fragment = cluster.fragment_total();
        let idle = input.capacity_milli - used;
        let arrive = round_half_even(arrived as f64 / capacity_gpus / 10.0);
        let ratio = if idle > 0 { Some(round2(100.0 * fragment / idle as f64)) } else { None };
        bins.add(arrive, round2(used as f64 / capacity_gpus / 10.0), fragment, ratio);
    }
    let final_used = cluster.used_milli() as f64;
    SeedRun {
        seed,
        pods_arrived: sequence.len(),
        pods_failed: failed,
        final_allocation_pct: round2(100.0 * final_used / input.capacity_milli.max(1) as f64),
        final_arrived_pct: round2(100.0 * arrived as f64 / input.capacity_milli.max(1) as f64),
        allocation_pct: bins.columns(columns, |b| b.alloc_sum / b.rows as f64, round2),
        fragmentation_pct: bins.columns(
            columns,
            |b| b.fragment_sum / b.rows as f64,
            |mean| round2(100.0 * mean / 1000.0 / capacity_gpus),
        ),
        fragmentation_ratio_pct: bins.ratio_columns(columns),
        migration: None,
    }
}

/// Run one policy over several seeds, in parallel; results are in seed order.
pub fn run(input: &PackInput, policy: PackPolicy, inflate: f64, seeds: &[u64]) -> PackReport {
    run_with_progress(input, policy, inflate, seeds, ArrivalOrder::Online, &|| {})
}

/// [`run`], calling `seed_done` as each seed's run ends (from any thread).
pub fn run_with_progress(
    input: &PackInput,
    policy: PackPolicy,
    inflate: f64,
    seeds: &[u64],
    order: ArrivalOrder,
    seed_done: &(dyn Fn() + Sync),
) -> PackReport {
    let per_seed: Vec<SeedRun> = seeds
        .par_iter()
        .map(|&seed| {
            let run = run_seed(input, policy, inflate, seed, order);
            seed_done();
            run
        })
        .collect();
    report(input, policy.name(), order, inflate, seeds, per_seed)
}

/// The experiment run through allot's engine ([`run_seed_engine`]) over several seeds, in
/// parallel; reported as placement [`ENGINE_PLACEMENT`].
pub fn run_engine_with_progress(
    input: &PackInput,
    inflate: f64,
    seeds: &[u64],
    seed_done: &(dyn Fn() + Sync),
) -> Result<PackReport, String> {
    let per_seed: Vec<SeedRun> = seeds
        .par_iter()
        .map(|&seed| {
            let run = run_seed_engine(input, inflate, seed);
            seed_done();
            run
        })
        .collect::<Result<_, _>>()?;
    Ok(report(input, ENGINE_PLACEMENT, ArrivalOrder::Online, inflate, seeds, per_seed))
}

/// [`run_engine_with_progress`] with a migration budget of `migrate_pct` % of the pods placed
/// so far ([`run_seed_engine_migrating`]); reported as placement `engine migrate PCT%`.
pub fn run_engine_migrating_with_progress(
    input: &PackInput,
    inflate: f64,
    seeds: &[u64],
    migrate_pct: f64,
    seed_done: &(dyn Fn() + Sync),
) -> Result<PackReport, String> {
    let per_seed: Vec<SeedRun> = seeds
        .par_iter()
        .map(|&seed| {
            let run = run_seed_engine_migrating(input, inflate, seed, Some(migrate_pct));
            seed_done();
            run
        })
        .collect::<Result<_, _>>()?;
    let runs = per_seed.len().max(1) as f64;
    let stats: Vec<&MigrationStats> =
        per_seed.iter().filter_map(|r| r.migration.as_ref()).collect();
    let mean =
        |f: fn(&MigrationStats) -> f64| round2(stats.iter().map(|s| f(s)).sum::<f64>() / runs);
    let migration = MigrationMean {
        budget_pct: migrate_pct,
        pods_moved: mean(|s| s.pods_moved as f64),
        moved_pct: mean(|s| s.moved_pct),
        plans: mean(|s| s.plans as f64),
        move_cost_gpu_hours: round4(
            stats.iter().map(|s| s.move_cost_gpu_hours).sum::<f64>() / runs,
        ),
        pods_lost: mean(|s| s.pods_lost as f64),
    };
    let name = format!("{ENGINE_PLACEMENT} migrate {migrate_pct}%");
    let mut report = report(input, &name, ArrivalOrder::Online, inflate, seeds, per_seed);
    report.migration = Some(migration);
    Ok(report)
}

/// Per-column means over the seeds' runs.
fn report(
    input: &PackInput,
    placement: &str,
    order: ArrivalOrder,
    inflate: f64,
    seeds: &[u64],
    per_seed: Vec<SeedRun>,
) -> PackReport {
    let columns = column_count(inflate);
    let mean = |pick: fn(&SeedRun) -> &Vec<Option<f64>>| -> Vec<Option<f64>> {
        (0..=columns)
            .map(|k| {
                let values: Vec<f64> =
                    per_seed.iter().filter_map(|r| pick(r).get(k).copied().flatten()).collect();
                (!values.is_empty())
                    .then(|| round2(values.iter().sum::<f64>() / values.len() as f64))
            })
            .collect()
    };
    PackReport {
        placement: placement.to_owned(),
        arrival_order: match order {
            ArrivalOrder::Online => "online",
            ArrivalOrder::Decreasing => "decreasing",
        }
        .to_owned(),
        inflate,
        seeds: seeds.to_vec(),
        nodes: input.nodes.len(),
        capacity_gpus: input.capacity_milli as f64 / 1000.0,
        pods_in_trace: input.pods.len(),
        allocation_pct: mean(|r| &r.allocation_pct),
        fragmentation_pct: mean(|r| &r.fragmentation_pct),
        fragmentation_ratio_pct: mean(|r| &r.fragmentation_ratio_pct),
        per_seed,
        wall_ms: 0,
        migration: None,
    }
}

/// The last column: arrived demand of `inflate` × 100 %.
pub fn column_count(inflate: f64) -> usize {
    (inflate * 100.0 + 1e-9).floor().max(0.0) as usize
}

#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    rows: usize,
    alloc_sum: f64,
    fragment_sum: f64,
    ratio_rows: usize,
    ratio_sum: f64,
}

impl Bin {
    fn merge(self, other: Bin) -> Bin {
        Bin {
            rows: self.rows + other.rows,
            alloc_sum: self.alloc_sum + other.alloc_sum,
            fragment_sum: self.fragment_sum + other.fragment_sum,
            ratio_rows: self.ratio_rows + other.ratio_rows,
            ratio_sum: self.ratio_sum + other.ratio_sum,
        }
    }
}

/// Pod events grouped by rounded arrived-demand percent.
struct Bins(Vec<Bin>);

impl Bins {
    fn new(size: usize) -> Bins {
        Bins(vec![Bin::default(); size])
    }

    fn add(&mut self, arrive: i64, alloc: f64, fragment: f64, ratio: Option<f64>) {
        // Rows past the last column + 1 feed no column (a tiny cluster can see arrivals of
        // millions of % of capacity; growing the bins for them would only waste memory).
        let Some(bin) = usize::try_from(arrive).ok().and_then(|i| self.0.get_mut(i)) else {
            return;
        };
        bin.rows += 1;
        bin.alloc_sum += alloc;
        bin.fragment_sum += fragment;
        if let Some(r) = ratio {
            bin.ratio_rows += 1;
            bin.ratio_sum += r;
        }
    }

    /// Column k's rows: bin k, or bins k−1..=k+1 when bin k is empty.
    fn column(&self, k: usize) -> Bin {
        let at = |i: usize| self.0.get(i).copied().unwrap_or_default();
        let own = at(k);
        if own.rows > 0 {
            return own;
        }
        let below = if k > 0 { at(k - 1) } else { Bin::default() };
        below.merge(own).merge(at(k + 1))
    }

    fn columns(
        &self,
        last: usize,
        mean: impl Fn(&Bin) -> f64,
        finish: impl Fn(f64) -> f64,
    ) -> Vec<Option<f64>> {
        (0..=last)
            .map(|k| {
                let bin = self.column(k);
                (bin.rows > 0).then(|| finish(mean(&bin)))
            })
            .collect()
    }

    fn ratio_columns(&self, last: usize) -> Vec<Option<f64>> {
        (0..=last)
            .map(|k| {
                let bin = self.column(k);
                (bin.ratio_rows > 0).then(|| round4(bin.ratio_sum / bin.ratio_rows as f64))
            })
            .collect()
    }
}

fn round_half_even(x: f64) -> i64 {
    x.round_ties_even() as i64
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round_ties_even() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The FGD authors' published results: `analysis_allo_discrete.csv` and its siblings, one row
/// per (workload, policy, seed), columns `0..130`.
#[derive(Clone, Debug, Default)]
pub struct PublishedResults {
    /// (workload, policy) → (seed, value at the column asked for)
    rows: BTreeMap<(String, PackPolicy), Vec<(u64, f64)>>,
}

impl PublishedResults {
    /// Read the value at `column` (e.g. "130") of every row.
    pub fn load(path: &Path, column: &str) -> Result<PublishedResults, TraceError> {
        let file = CsvFile::read(path)?;
        let workload = file.column(&["workload"])?;
        let policy = file.column(&["sc_policy"])?;
        let seed = file.column(&["seed"])?;
        let value = file.column(&[column])?;
        let mut rows: BTreeMap<(String, PackPolicy), Vec<(u64, f64)>> = BTreeMap::new();
        for row in file.rows() {
            let name = row.text(policy, "sc_policy")?;
            let Some(parsed) = published_policy(name) else {
                return Err(row.error(
                    "sc_policy",
                    format!("unknown policy '{name}'"),
                    "expected one of 01-Random … 06-FGD",
                ));
            };
            let key = (row.text(workload, "workload")?.to_owned(), parsed);
            rows.entry(key)
                .or_default()
                .push((row.number(seed, "seed")?, row.number(value, column)?));
        }
        Ok(PublishedResults { rows })
    }

    /// The mean over the seeds given (all seeds when `seeds` is empty).
    pub fn mean(&self, workload: &str, policy: PackPolicy, seeds: &[u64]) -> Option<f64> {
        let values: Vec<f64> = self
            .rows
            .get(&(workload.to_owned(), policy))?
            .iter()
            .filter(|(s, _)| seeds.is_empty() || seeds.contains(s))
            .map(|&(_, v)| v)
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }
}

fn published_policy(name: &str) -> Option<PackPolicy> {
    let bare = name.split_once('-').map_or(name, |(_, rest)| rest);
    match bare {
        "Random" => Some(PackPolicy::Random),
        "DotProd" => Some(PackPolicy::DotProd),
        "GpuClustering" => Some(PackPolicy::Clustering),
        "GpuPacking" => Some(PackPolicy::Packing),
        "BestFit" => Some(PackPolicy::BestFit),
        "FGD" => Some(PackPolicy::Fgd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_follows_python() {
        assert_eq!(round_half_even(0.5), 0);
        assert_eq!(round_half_even(1.5), 2);
        assert_eq!(round_half_even(129.5), 130);
        assert_eq!(round2(1.005_000_1), 1.01);
    }

    #[test]
    fn an_empty_column_borrows_its_neighbours() {
        let mut bins = Bins::new(4);
        bins.add(0, 1.0, 0.0, None);
        bins.add(2, 3.0, 0.0, None);
        let cols = bins.columns(3, |b| b.alloc_sum / b.rows as f64, |x| x);
        assert_eq!(cols, vec![Some(1.0), Some(2.0), Some(3.0), Some(3.0)]);
    }
}
