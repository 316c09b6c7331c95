//! The packing upper bound: hand-computed tiny clusters, an exhaustive optimum on random tiny
//! clusters (never above the bound), and the real openb lists (never below what a policy packs).

use std::path::{Path, PathBuf};

use allot_core::packing::{ModelSet, PackNodeSpec, PackPolicy, PodShape};
use allot_sim::BadRows;
use allot_sim::bound::{Bound, BoundProblem};
use allot_sim::openb;
use allot_sim::pack::{self, ArrivalOrder, PackInput};
use proptest::prelude::*;

fn node(cpu_milli: u64, memory_mib: u64, gpus: u8, model: u8) -> PackNodeSpec {
    PackNodeSpec { cpu_milli, memory_mib, gpus, model }
}

fn pod(cpu_milli: u64, memory_mib: u64, gpus: u8, gpu_milli: u16, models: ModelSet) -> PodShape {
    PodShape { cpu_milli, memory_mib, gpus, gpu_milli, models, class: 0 }
}

fn copies(n: usize, pod: PodShape) -> Vec<PodShape> {
    vec![pod; n]
}

fn solve(nodes: &[PackNodeSpec], pods: &[PodShape]) -> Bound {
    BoundProblem::new(nodes, pods).solve().unwrap_or_else(|e| panic!("{e}"))
}

const ANY: ModelSet = ModelSet::ANY;
const BIG: u64 = 1_000_000;

#[test]
fn two_nodes_of_two_gpus_hold_four_600_share_pods() {
    // Two 600-share pods never share a GPU: 4 GPUs × 600 of 4000 shares.
    let nodes = [node(BIG, BIG, 2, 0), node(BIG, BIG, 2, 0)];
    let b = solve(&nodes, &copies(10, pod(1000, 1000, 1, 600, ANY)));
    assert_eq!(b.bound_milli, 2400);
    assert_eq!(b.bound_pct, 60.0);
    assert_eq!(b.trivial_pct, 100.0);
    assert_eq!(b.model_pct, 100.0);
    assert!(b.converged);
}

#[test]
fn cpu_binds_two_whole_gpus_per_node() {
    // 10 cores fit two 4-core pods: 2 of 4 GPUs on each node.
    let nodes = [node(10_000, BIG, 4, 0), node(10_000, BIG, 4, 0)];
    let b = solve(&nodes, &copies(9, pod(4000, 1000, 1, 1000, ANY)));
    assert_eq!(b.bound_milli, 4000);
    assert_eq!(b.bound_pct, 50.0);
    assert_eq!(b.trivial_pct, 100.0);
}

#[test]
fn models_bind_where_only_node_boundaries_show_it() {
    // Node A (model 0) and node B (model 1), 2 GPUs each. Three 600-share pods run on model 0
    // only, two whole-GPU pods anywhere. Best: the whole pods on B (2000), two 600s on A (1200).
    // The LP agrees: prices y_whole = 400, y_600 = 0, π_A = π_B = 1200 prove 3200. Dropping node
    // boundaries (the model bound) lets model 0 take 1800 + 200 and model 1 1800: all 3800
    // arrived shares (95 %).
    let nodes = [node(BIG, BIG, 2, 0), node(BIG, BIG, 2, 1)];
    let mut pods = copies(3, pod(1000, 1000, 1, 600, ModelSet(0).with(0)));
    pods.extend(copies(2, pod(1000, 1000, 1, 1000, ANY)));
    let b = solve(&nodes, &pods);
    assert_eq!(b.bound_milli, 3200);
    assert_eq!(b.model_pct, 95.0);
    assert_eq!(b.trivial_pct, 95.0);
}

#[test]
fn sharing_pods_combine_on_one_gpu() {
    // One GPU; pods of 600, 300 and 300: the best GPU holds 600 + 300.
    let nodes = [node(BIG, BIG, 1, 0)];
    let mut pods = vec![pod(1000, 1000, 1, 600, ANY)];
    pods.extend(copies(2, pod(1000, 1000, 1, 300, ANY)));
    assert_eq!(solve(&nodes, &pods).bound_milli, 900);
}

#[test]
fn whole_and_shared_gpus_mix_on_one_node() {
    // Eight GPUs: a 4-GPU pod, then one 810-share pod on each of the other four GPUs.
    let nodes = [node(BIG, BIG, 8, 0)];
    let mut pods = vec![pod(1000, 1000, 4, 1000, ANY)];
    pods.extend(copies(6, pod(1000, 1000, 1, 810, ANY)));
    assert_eq!(solve(&nodes, &pods).bound_milli, 4000 + 4 * 810);
}

#[test]
fn memory_binds_per_node() {
    // 10 GiB and 2 GPUs per node; whole-GPU pods of 6 GiB: one pod per node.
    let nodes = [node(BIG, 10_240, 2, 0), node(BIG, 10_240, 2, 0)];
    let b = solve(&nodes, &copies(3, pod(1000, 6144, 1, 1000, ANY)));
    assert_eq!(b.bound_milli, 2000);
    assert_eq!(b.bound_pct, 50.0);
}

#[test]
fn cpu_only_pods_change_nothing() {
    let nodes = [node(8000, BIG, 2, 0)];
    let gpu_pods = copies(3, pod(2000, 1000, 1, 1000, ANY));
    let mut with_cpu = gpu_pods.clone();
    with_cpu.extend(copies(5, pod(4000, 1000, 0, 0, ANY)));
    assert_eq!(solve(&nodes, &gpu_pods), solve(&nodes, &with_cpu));
    assert_eq!(solve(&nodes, &gpu_pods).bound_milli, 2000);
}

#[test]
fn nothing_arrived_bounds_at_zero() {
    let nodes = [node(BIG, BIG, 2, 0)];
    let b = solve(&nodes, &[]);
    assert_eq!((b.bound_milli, b.trivial_pct), (0, 0.0));
}

// ---- the exhaustive optimum of tiny clusters ------------------------------------------------

#[derive(Clone, Debug)]
struct NodeState {
    cpu: u64,
    memory: u64,
    model: u8,
    free: Vec<u16>,
}

/// The most GPU shares any placement of `pods` allocates: every pod skipped or tried on every
/// node and every GPU (or pair of GPUs).
fn best_packing(nodes: &mut [NodeState], pods: &[PodShape]) -> u64 {
    let Some((pod, rest)) = pods.split_first() else { return 0 };
    let mut best = best_packing(nodes, rest);
    if pod.is_cpu_only() {
        return best;
    }
    for n in 0..nodes.len() {
        let state = &nodes[n];
        if state.cpu < pod.cpu_milli
            || state.memory < pod.memory_mib
            || !pod.models.contains(state.model)
        {
            continue;
        }
        let gpus = state.free.len();
        let choices: Vec<Vec<usize>> = match pod.gpus {
            1 => (0..gpus).map(|g| vec![g]).collect(),
            2 => (0..gpus).flat_map(|a| (a + 1..gpus).map(move |b| vec![a, b])).collect(),
            _ => Vec::new(),
        };
        for gpu_set in choices {
            if gpu_set.iter().any(|&g| nodes[n].free[g] < pod.gpu_milli) {
                continue;
            }
            nodes[n].cpu -= pod.cpu_milli;
            nodes[n].memory -= pod.memory_mib;
            for &g in &gpu_set {
                nodes[n].free[g] -= pod.gpu_milli;
            }
            let value = pod.total_milli() + best_packing(nodes, rest);
            best = best.max(value);
            nodes[n].cpu += pod.cpu_milli;
            nodes[n].memory += pod.memory_mib;
            for &g in &gpu_set {
                nodes[n].free[g] += pod.gpu_milli;
            }
        }
    }
    best
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

fn node_strategy() -> impl Strategy<Value = PackNodeSpec> {
    (prop::sample::select(vec![4000u64, 8000, 16_000]), 1u64..=4, 1u8..=3, 0u8..2)
        .prop_map(|(cpu, mem_gib, gpus, model)| node(cpu, mem_gib * 4096, gpus, model))
}

fn pod_strategy() -> impl Strategy<Value = PodShape> {
    (
        prop::sample::select(vec![500u64, 1000, 2500, 4000]),
        prop::sample::select(vec![1024u64, 4096, 8192]),
        prop::sample::select(vec![
            (0u8, 0u16),
            (1, 200),
            (1, 300),
            (1, 500),
            (1, 700),
            (1, 1000),
            (2, 1000),
            (2, 400),
        ]),
        prop::sample::select(vec![ModelSet::ANY, ModelSet(1), ModelSet(2)]),
    )
        .prop_map(|(cpu, mem, (gpus, milli), models)| pod(cpu, mem, gpus, milli, models))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// optimum ≤ bound ≤ min(trivial, model bound).
    #[test]
    fn the_bound_lies_between_the_optimum_and_the_simple_bounds(
        nodes in prop::collection::vec(node_strategy(), 1..=2),
        pods in prop::collection::vec(pod_strategy(), 0..=6),
    ) {
        let b = solve(&nodes, &pods);
        let mut states: Vec<NodeState> = nodes
            .iter()
            .map(|n| NodeState {
                cpu: n.cpu_milli,
                memory: n.memory_mib,
                model: n.model,
                free: vec![1000; usize::from(n.gpus)],
            })
            .collect();
        let optimum = best_packing(&mut states, &pods);
        let capacity: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
        prop_assert!(optimum <= b.bound_milli, "optimum {optimum} > bound {b:?}");
        let bound_pct = 100.0 * b.bound_milli as f64 / capacity as f64;
        prop_assert!(bound_pct <= b.trivial_pct + 1e-9, "{b:?}");
        prop_assert!(bound_pct <= b.model_pct + 1e-9, "{b:?}");
        // The master's value is the LP optimum at convergence; the bound is it floored.
        let one_share_pct = 100.0 / capacity as f64;
        prop_assert!(b.master_pct <= b.bound_pct + one_share_pct + 1e-6, "{b:?}");
    }
}

// ---- the real openb lists -----------------------------------------------------------------

fn openb_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/alibaba-gpu-v2023-openb")
}

fn openb_input(list: &str, nodes_step: usize, pods_step: usize) -> PackInput {
    let dir = openb_dir();
    let (mut nodes, _) =
        openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv"), BadRows::Fail)
            .unwrap_or_else(|e| panic!("{e}"));
    let (mut pods, _) =
        openb::load_pods(&dir.join(format!("openb_pod_list_{list}.csv")), BadRows::Fail)
            .unwrap_or_else(|e| panic!("{e}"));
    // A slice keeps debug-build tests fast: every `nodes_step`th node, `pods_step`th pod.
    nodes = nodes.into_iter().step_by(nodes_step).collect();
    pods = pods.into_iter().step_by(pods_step).collect();
    PackInput::new(&nodes, &pods).unwrap_or_else(|e| panic!("{e}"))
}

/// No policy packs more than the bound on the same seed's arrivals.
fn check_policies_below_bound(input: &PackInput, seed: u64) -> Bound {
    let b = pack::bound_problem(input, 1.3, seed).solve().unwrap_or_else(|e| panic!("{e}"));
    assert!(b.converged, "{b:?}");
    for policy in [PackPolicy::Fgd, PackPolicy::BestFit, PackPolicy::Random] {
        for order in [ArrivalOrder::Online, ArrivalOrder::Decreasing] {
            let run = pack::run_seed(input, policy, 1.3, seed, order);
            // final_allocation_pct is rounded to 2 places: allow that rounding.
            assert!(
                run.final_allocation_pct <= b.bound_pct + 0.005,
                "{policy} {order:?} packed {} % > bound {b:?}",
                run.final_allocation_pct
            );
        }
    }
    assert!(b.bound_pct <= b.trivial_pct + 1e-9 && b.bound_pct <= b.model_pct + 1e-9, "{b:?}");
    b
}

#[test]
fn a_slice_of_openb_never_packs_above_its_bound() {
    check_policies_below_bound(&openb_input("default", 16, 16), 42);
    check_policies_below_bound(&openb_input("gpuspec10", 16, 16), 43);
}

/// The whole default list, seed 42 (≈6 s optimised; run with `--release -- --ignored`).
#[test]
#[ignore = "slow unoptimised: run with cargo test --release -- --ignored"]
fn the_default_list_bound_is_above_every_packing_found() {
    let input = openb_input("default", 1, 1);
    let b = check_policies_below_bound(&input, 42);
    // An offline largest-first packing of this multiset reached 98.37 % (issue 4 notes).
    assert!(b.bound_pct >= 98.37, "{b:?}");
    assert!(b.bound_pct < 100.0, "{b:?}");
}
