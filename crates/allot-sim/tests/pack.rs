//! The openb loaders on the real shared files (counts from their SOURCE.md) and the packing
//! experiment's method: inflation, paired arrivals, determinism, the metric columns.

use std::path::{Path, PathBuf};

use allot_core::packing::PackPolicy;
use allot_sim::BadRows;
use allot_sim::openb::{self, OpenbNode, OpenbPod};
use allot_sim::pack::{self, PackInput, PublishedResults};

fn openb_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/alibaba-gpu-v2023-openb")
}

fn nodes() -> Vec<OpenbNode> {
    let path = openb_dir().join("openb_node_list_gpu_node.csv");
    openb::load_nodes(&path, BadRows::Fail).map(|(n, _)| n).unwrap_or_else(|e| panic!("{e}"))
}

fn pods(list: &str) -> Vec<OpenbPod> {
    let path = openb_dir().join(format!("openb_pod_list_{list}.csv"));
    openb::load_pods(&path, BadRows::Fail).map(|(p, _)| p).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn node_lists_match_their_source_notes() {
    let gpu_nodes = nodes();
    assert_eq!(gpu_nodes.len(), 1213);
    assert_eq!(gpu_nodes.iter().map(|n| n.gpus).sum::<u32>(), 6212);
    let g2x8 = gpu_nodes.iter().filter(|n| n.model == "G2" && n.gpus == 8).count();
    assert_eq!(g2x8, 549);
    let all = openb::load_nodes(&openb_dir().join("openb_node_list_all_node.csv"), BadRows::Fail)
        .map(|(n, _)| n)
        .unwrap_or_default();
    assert_eq!(all.len(), 1523);
    assert_eq!(all.iter().filter(|n| n.gpus == 0).count(), 310);
}

#[test]
fn the_default_pod_list_matches_its_source_notes() {
    let pods = pods("default");
    assert_eq!(pods.len(), 8152);
    let count = |f: &dyn Fn(&OpenbPod) -> bool| pods.iter().filter(|p| f(p)).count();
    assert_eq!(count(&|p| p.num_gpu == 0), 1088);
    assert_eq!(count(&|p| p.num_gpu == 1 && p.gpu_milli < 1000), 3078);
    assert_eq!(count(&|p| p.num_gpu == 1 && p.gpu_milli >= 1000), 3911);
    assert_eq!(count(&|p| p.num_gpu == 2), 16);
    assert_eq!(count(&|p| p.num_gpu == 4), 15);
    assert_eq!(count(&|p| p.num_gpu == 8), 44);
    // Every column is read: times where present, empty scheduled_time for pending pods.
    assert_eq!(pods[1].creation_time, Some(427_061));
    assert_eq!(pods[1].qos.as_deref(), Some("LS"));
    assert!(pods.iter().any(|p| p.scheduled_time.is_none() && p.creation_time.is_some()));
}

/// The shared openb pod lists besides `default`.
const OTHER_POD_LISTS: [&str; 10] = [
    "cpu0",
    "cpu037",
    "cpu050",
    "cpu072",
    "cpu100",
    "gpushare20",
    "gpushare40",
    "gpushare60",
    "gpuspec05",
    "gpuspec10",
];

#[test]
fn every_shared_pod_list_loads() {
    for list in OTHER_POD_LISTS {
        let pods = pods(list);
        assert!(pods.len() >= 7000, "{list}: {}", pods.len());
    }
    let spec10 = pods("gpuspec10");
    assert!(spec10.iter().any(|p| p.gpu_spec.len() > 1));
}

#[test]
fn the_empty_cluster_fragmentation_matches_the_papers_column_0() {
    // fgd-method.md §8: the empty cluster's F is 13.94 % of capacity for `default`, 19.00 %
    // for gpuspec10 (the published column 0 is 13.88–14.08 and 18.93–19.11).
    let input = PackInput::new(&nodes(), &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(input.target_classes().len(), 35);
    assert!((input.empty_fragmentation_pct() - 13.94).abs() < 0.005);
    let spec = PackInput::new(&nodes(), &pods("gpuspec10")).unwrap_or_else(|e| panic!("{e}"));
    assert!((spec.empty_fragmentation_pct() - 19.00).abs() < 0.005);
}

#[test]
fn inflation_stops_at_the_target_and_every_policy_sees_the_same_arrivals() {
    let input = PackInput::new(&nodes(), &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    let a = pack::arrivals(&input, 1.3, 42);
    let b = pack::arrivals(&input, 1.3, 42);
    assert_eq!(a, b);
    let demand: u64 = a.iter().map(|p| p.total_milli()).sum();
    let target = 1.3 * input.capacity_milli as f64;
    // The artifact's stop test adds one GPU's share, so a multi-GPU copy may overshoot by
    // up to 7 GPUs.
    assert!(demand as f64 <= target + 7000.0, "{demand} vs {target}");
    assert!(demand as f64 > target - 1000.0, "{demand} vs {target}");
    assert!(a.len() > 10_000 && a.len() < 11_500, "{}", a.len());
    assert_ne!(a, pack::arrivals(&input, 1.3, 43));
}

#[test]
fn a_run_is_deterministic_and_its_columns_are_sane() {
    let input = PackInput::new(&nodes(), &pods("gpushare40")).unwrap_or_else(|e| panic!("{e}"));
    let first = pack::run(&input, PackPolicy::BestFit, 1.3, &[7]);
    let second = pack::run(&input, PackPolicy::BestFit, 1.3, &[7]);
    let json = |r| serde_json::to_string(&r).unwrap_or_default();
    assert_eq!(json(first.clone()), json(second));
    assert_eq!(first.allocation_pct.len(), 131);
    let values: Vec<f64> = first.allocation_pct.iter().map(|v| v.unwrap_or(f64::NAN)).collect();
    // Below saturation every arriving pod fits, so allocation follows arrival closely.
    assert!((values[50] - 50.0).abs() < 0.5, "{}", values[50]);
    // Allocation never falls as pods arrive and never passes capacity.
    assert!(values.windows(2).all(|w| w[1] >= w[0] - 0.01), "{values:?}");
    assert!(values[130] <= 100.0 && values[130] > 85.0, "{}", values[130]);
    let run = &first.per_seed[0];
    assert!(run.pods_failed > 0 && run.pods_failed < run.pods_arrived);
    // Fragmentation ratio is a share of idle: within 0..=100.
    assert!(first.fragmentation_ratio_pct.iter().flatten().all(|r| (0.0..=100.0).contains(r)));
}

#[test]
fn published_results_are_read_per_workload_and_policy() {
    let path = openb_dir().join("fgd-expected-results/analysis_allo_discrete.csv");
    let published = PublishedResults::load(&path, "130").unwrap_or_else(|e| panic!("{e}"));
    let fgd = published.mean("openb_pod_list_default", PackPolicy::Fgd, &[]);
    // performance.md §B.1: 95.39 for FGD on default, mean of 10 seeds.
    assert!(fgd.is_some_and(|v| (v - 95.39).abs() < 0.006), "{fgd:?}");
    assert!(published.mean("openb_pod_list_default", PackPolicy::Random, &[42]).is_some());
    assert!(published.mean("no_such_list", PackPolicy::Fgd, &[]).is_none());
}

#[test]
fn degenerate_clusters_are_refused_or_packed_without_trouble() {
    let path = Path::new("nodes.csv");
    let no_gpus = "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,100,0,\n";
    let (nodes0, _) = openb::parse_nodes(path, no_gpus, BadRows::Fail).unwrap_or_default();
    let err = PackInput::new(&nodes0, &pods("default")).err().unwrap_or_default();
    assert!(err.contains("no GPUs"), "{err}");
    // One GPU against the whole trace: arrivals reach ~600,000 % of capacity at once.
    let one_gpu = "sn,cpu_milli,memory_mib,gpu,model\nn0,128000,1048576,1,T4\n";
    let (nodes1, _) = openb::parse_nodes(path, one_gpu, BadRows::Fail).unwrap_or_default();
    let input = PackInput::new(&nodes1, &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    let report = pack::run(&input, PackPolicy::Fgd, 1.3, &[1]);
    assert_eq!(report.allocation_pct.len(), 131);
    assert!(report.per_seed[0].final_allocation_pct <= 100.0);
}

/// Issue 4's acceptance: allot's policy allocates more than FGD at 130 % on every shared openb
/// pod list (10-seed means, the paper's seeds). Every list and policy is a full run, so the
/// test is in the slow tier (`ALLOT_SLOW_TESTS=1`; `.ci/run` runs it in release mode).
#[test]
#[allow(clippy::print_stderr)] // the figures belong in CI's log
fn allot_allocates_more_than_fgd_on_every_shared_pod_list() {
    if std::env::var_os("ALLOT_SLOW_TESTS").is_none() {
        return;
    }
    let gpu_nodes = nodes();
    let seeds: Vec<u64> = (42..52).collect();
    let mut lines = Vec::new();
    for list in std::iter::once("default").chain(OTHER_POD_LISTS) {
        let input = PackInput::new(&gpu_nodes, &pods(list)).unwrap_or_else(|e| panic!("{e}"));
        let at_end = |policy| {
            let report = pack::run(&input, policy, 1.3, &seeds);
            report.allocation_pct.last().copied().flatten().unwrap_or(0.0)
        };
        let (allot, fgd) = (at_end(PackPolicy::Allot), at_end(PackPolicy::Fgd));
        lines.push(format!("{list}: allot {allot:.2} fgd {fgd:.2}"));
        assert!(allot > fgd, "{}", lines.join("\n"));
    }
    eprintln!("{}", lines.join("\n"));
}

/// Issue 20's acceptance for one placement: the experiment run through the engine (each pod
/// submitted and admitted by a cycle, the target mix learned from the submissions) reaches
/// `allot`'s figure on `default`: ≥ 95.85 % at 130 % (10-seed mean). Slow tier.
#[test]
#[allow(clippy::print_stderr)] // the figure belongs in CI's log
fn the_engine_packs_default_as_well_as_the_allot_policy() {
    if std::env::var_os("ALLOT_SLOW_TESTS").is_none() {
        return;
    }
    let input = PackInput::new(&nodes(), &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    let seeds: Vec<u64> = (42..52).collect();
    let report = pack::run_engine_with_progress(&input, 1.3, &seeds, &|| {})
        .unwrap_or_else(|e| panic!("{e}"));
    let at_end = report.allocation_pct.last().copied().flatten().unwrap_or(0.0);
    eprintln!("engine on default: {at_end:.2} % at 130 %");
    assert!(at_end >= 95.85, "{at_end}");
}

#[test]
fn an_engine_run_books_only_what_fits_and_is_deterministic() {
    let input = PackInput::new(&nodes(), &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    // The trace alone (98 % of capacity), no copies.
    let run = pack::run_seed_engine(&input, 0.4, 42).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run.pods_arrived, input.pod_count());
    let policy = pack::run_seed(&input, PackPolicy::Allot, 0.4, 42, pack::ArrivalOrder::Online);
    assert!(run.final_allocation_pct <= 100.0);
    assert!(
        (run.final_allocation_pct - policy.final_allocation_pct).abs() < 0.5,
        "engine {} vs allot {}",
        run.final_allocation_pct,
        policy.final_allocation_pct
    );
    assert_eq!(pack::run_seed_engine(&input, 0.4, 42), Ok(run));
}

/// Four one-GPU nodes and pods of 700 and 300 shares that fill them exactly: in an arrival
/// order where 300s share a GPU early, a 700 later finds 300 + 300 free on two GPUs and fails
/// — unless a 300 moves. The moves come from the engine's defragmentation alone.
fn sliver_case() -> PackInput {
    let path = Path::new("case.csv");
    let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for n in 0..4 {
        nodes.push_str(&format!("n{n},32000,65536,1,T4\n"));
    }
    let mut pods = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n");
    for i in 0..4 {
        pods.push_str(&format!("big{i},1000,1024,1,700\nsmall{i},1000,1024,1,300\n"));
    }
    let (nodes, _) = openb::parse_nodes(path, &nodes, BadRows::Fail).unwrap_or_default();
    let (pods, _) = openb::parse_pods(path, &pods, BadRows::Fail).unwrap_or_default();
    PackInput::new(&nodes, &pods).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_move_makes_room_that_plain_placement_cannot() {
    let input = sliver_case();
    let mut helped = 0;
    for seed in 0..40 {
        // Inflate 1.0: the trace alone fills capacity; no copies arrive.
        let plain = pack::run_seed_engine(&input, 1.0, seed).unwrap_or_else(|e| panic!("{e}"));
        let moving = pack::run_seed_engine_migrating(&input, 1.0, seed, Some(50.0))
            .unwrap_or_else(|e| panic!("{e}"));
        let stats = moving.migration.clone().unwrap_or_default();
        assert!(stats.pods_moved * 2 <= stats.pods_placed, "seed {seed}: {stats:?}");
        assert_eq!(stats.pods_lost, 0, "seed {seed}: a moved pod was not restarted");
        assert!(moving.final_allocation_pct >= plain.final_allocation_pct, "seed {seed}");
        if moving.final_allocation_pct > plain.final_allocation_pct {
            assert!(stats.pods_moved > 0 && stats.move_cost_gpu_ms > 0, "seed {seed}");
            helped += 1;
        }
    }
    assert!(helped > 0, "no seed where a move made room");
}

#[test]
fn a_zero_budget_is_the_plain_engine_run() {
    let input = PackInput::new(&nodes(), &pods("default")).unwrap_or_else(|e| panic!("{e}"));
    let plain = pack::run_seed_engine(&input, 0.4, 42).unwrap_or_else(|e| panic!("{e}"));
    let mut zero = pack::run_seed_engine_migrating(&input, 0.4, 42, Some(0.0))
        .unwrap_or_else(|e| panic!("{e}"));
    let stats = zero.migration.take().unwrap_or_default();
    assert_eq!((stats.pods_moved, stats.plans, stats.move_cost_gpu_ms), (0, 0, 0));
    assert_eq!(zero, plain);
    let small = sliver_case();
    for seed in 0..8 {
        let plain = pack::run_seed_engine(&small, 1.0, seed).unwrap_or_else(|e| panic!("{e}"));
        let mut zero = pack::run_seed_engine_migrating(&small, 1.0, seed, Some(0.0))
            .unwrap_or_else(|e| panic!("{e}"));
        zero.migration = None;
        assert_eq!(zero, plain, "seed {seed}");
    }
}
