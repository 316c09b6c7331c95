//! Placement speed of the packing policies at scale: `cargo bench -p allot-sim --bench placement`.
//!
//! The Alibaba openb GPU node list and `default` pod list, replicated to `--nodes` nodes
//! (default 5,000, ×4.1 of the trace) with the pod list scaled by the same factor, one
//! arrival-only run to 130 % of capacity per policy. Prints placement decisions per second
//! (every arriving pod is one decision: placed or failed) and the allocation reached. Figures,
//! not assertions: the machine is shared. Options: `-- --nodes N --seed N --policy NAME`.
//! Policy `engine` (also run by default, last) is the experiment through allot's engine
//! (`pack::run_seed_engine`: a submission and a cycle per pod); its time includes the cycle
//! and the measuring cluster beside it.

#![allow(clippy::print_stdout, clippy::disallowed_methods, clippy::unwrap_used)]

use std::path::Path;
use std::time::Instant;

use allot_core::packing::PackPolicy;
use allot_sim::BadRows;
use allot_sim::openb::{self, OpenbNode, OpenbPod};
use allot_sim::pack::{self, ArrivalOrder, PackInput};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
    };
    let nodes_wanted: usize = flag("--nodes").and_then(|v| v.parse().ok()).unwrap_or(5000);
    let seed: u64 = flag("--seed").and_then(|v| v.parse().ok()).unwrap_or(42);
    let engine = flag("--policy").is_none_or(|name| name == pack::ENGINE_PLACEMENT);
    let policies: Vec<PackPolicy> = match flag("--policy") {
        Some(name) => PackPolicy::parse(name).into_iter().collect(),
        None => PackPolicy::ALL.to_vec(),
    };

    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/alibaba-gpu-v2023-openb");
    let (base_nodes, _) =
        openb::load_nodes(&dir.join("openb_node_list_gpu_node.csv"), BadRows::Fail).unwrap();
    let (base_pods, _) =
        openb::load_pods(&dir.join("openb_pod_list_default.csv"), BadRows::Fail).unwrap();
    let nodes: Vec<OpenbNode> = (0..nodes_wanted)
        .map(|i| {
            let mut n = base_nodes[i % base_nodes.len()].clone();
            n.name = format!("{}-{}", n.name, i / base_nodes.len());
            n
        })
        .collect();
    let pods_wanted = base_pods.len() * nodes_wanted / base_nodes.len();
    let pods: Vec<OpenbPod> = (0..pods_wanted)
        .map(|i| {
            let mut p = base_pods[i % base_pods.len()].clone();
            p.name = format!("{}-{}", p.name, i / base_pods.len());
            p
        })
        .collect();
    let input = PackInput::new(&nodes, &pods).unwrap();
    println!(
        "{} nodes, {:.0} GPUs, {} pods in the scaled trace, inflate 1.3, seed {seed}",
        input.node_count(),
        input.capacity_milli as f64 / 1000.0,
        input.pod_count()
    );
    println!(
        "{:>11} {:>10} {:>10} {:>14} {:>12}",
        "policy", "decisions", "seconds", "decisions/s", "alloc % @end"
    );
    let row = |name: &str, run: &pack::SeedRun, seconds: f64| {
        println!(
            "{:>11} {:>10} {:>10.3} {:>14.0} {:>12.2}",
            name,
            run.pods_arrived,
            seconds,
            run.pods_arrived as f64 / seconds,
            run.final_allocation_pct
        );
    };
    for policy in policies {
        let started = Instant::now();
        let run = pack::run_seed(&input, policy, 1.3, seed, ArrivalOrder::Online);
        row(policy.name(), &run, started.elapsed().as_secs_f64());
    }
    if engine {
        let started = Instant::now();
        let run = pack::run_seed_engine(&input, 1.3, seed).unwrap();
        row(pack::ENGINE_PLACEMENT, &run, started.elapsed().as_secs_f64());
    }
}
