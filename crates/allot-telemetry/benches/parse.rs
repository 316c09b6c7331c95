//! Telemetry benchmark: `cargo bench -p allot-telemetry --bench parse`.
//!
//! 1. Parse a 10,000-GPU dcgm-exporter scrape (1,250 hosts × 8 GPUs) generated from the shared
//!    fixture: every family of the fixture plus SM_ACTIVE, DRAM_ACTIVE, FB_USED and FB_FREE
//!    (12 families, 120,000 sample lines), each GPU with its own hostname/gpu/UUID/device labels.
//!    Goal: under 100 ms.
//! 2. The 8-GPU collection path at 1 Hz: parse one host's scrape, normalise, attribute to 8
//!    allocations and build the engine events; CPU time per collection as % of one core at 1 Hz.
//!    Goal: under 1 %. (The HTTP GET of the exporter's /metrics is not included.)
//!
//! Figures, not assertions: the machine is shared. Options: `-- --gpus N --runs N`.

#![allow(clippy::print_stdout, clippy::disallowed_methods, clippy::unwrap_used)]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use allot_core::WorkloadId;
use allot_telemetry::attribution::{Allocation, activity_events, attribute};
use allot_telemetry::{dcgm, promtext};

const GPUS_PER_HOST: usize = 8;

/// A metric family to replicate: name, template labels, value.
type Family = (String, Vec<(String, String)>, f64);

/// A scrape of `gpus` GPUs built from the fixture's families.
fn scrape(fixture: &str, gpus: usize) -> String {
    let series = promtext::parse(fixture).unwrap();
    // One template series per family, first seen wins; four profiling/memory families added
    // with the H100 label set so the scrape looks like a profiling-enabled exporter.
    let mut families: Vec<Family> = Vec::new();
    for s in &series {
        if families.iter().all(|(n, _, _)| n != s.name) {
            // MIG labels would make several samples of one GPU; the scrape is whole GPUs.
            let labels = s
                .labels
                .iter()
                .filter(|(k, _)| *k != "GPU_I_ID" && *k != "GPU_I_PROFILE")
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            families.push((s.name.to_string(), labels, s.value));
        }
    }
    let h100 = families.iter().find(|(n, _, _)| n == "DCGM_FI_PROF_GR_ENGINE_ACTIVE").unwrap();
    let h100_labels = h100.1.clone();
    for (name, value) in [
        ("DCGM_FI_PROF_SM_ACTIVE", 0.42),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0.13),
        ("DCGM_FI_DEV_FB_USED", 40_000.0),
        ("DCGM_FI_DEV_FB_FREE", 41_000.0),
    ] {
        families.push((name.to_string(), h100_labels.clone(), value));
    }
    let mut out = String::with_capacity(gpus * families.len() * 300);
    for (name, labels, value) in &families {
        writeln!(out, "# HELP {name} generated from the fixture.\n# TYPE {name} gauge").unwrap();
        for gpu in 0..gpus {
            let (host, index) = (gpu / GPUS_PER_HOST, gpu % GPUS_PER_HOST);
            out.push_str(name);
            out.push('{');
            write!(
                out,
                "gpu=\"{index}\",UUID=\"GPU-{gpu:08x}-0000-4000-8000-000000000000\",device=\"nvidia{index}\",Hostname=\"node-{host:05}\""
            )
            .unwrap();
            for (k, v) in labels {
                if !matches!(
                    k.as_str(),
                    "gpu" | "UUID" | "uuid" | "device" | "Hostname" | "hostname"
                ) {
                    write!(out, ",{k}=\"{v}\"").unwrap();
                }
            }
            writeln!(out, "}} {}", value + (gpu % 7) as f64 * 0.01).unwrap();
        }
    }
    out
}

/// This process's CPU time (user + system) in seconds, from /proc/self/stat (Linux, 100 Hz).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based in proc(5)).
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let gpus = option("--gpus", 10_000);
    let runs = option("--runs", 15);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/dcgm-exporter-sample.txt");
    let fixture = std::fs::read_to_string(&path).unwrap();

    let big = scrape(&fixture, gpus);
    let lines = big.lines().filter(|l| !l.starts_with('#')).count();
    let mut times_ms = Vec::new();
    let mut samples = 0;
    let cpu_start = cpu_seconds();
    for _ in 0..runs {
        let start = Instant::now();
        samples = dcgm::parse(&big).unwrap().len();
        times_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let parse_cpu_ms = (cpu_seconds() - cpu_start) / runs as f64 * 1e3;
    times_ms.sort_by(f64::total_cmp);
    println!(
        "dcgm-exporter scrape: {gpus} GPUs, {lines} sample lines, {:.1} MB -> {samples} samples",
        big.len() as f64 / 1e6
    );
    println!(
        "  parse: min {:.1} ms, median {:.1} ms, max {:.1} ms over {runs} runs (goal < 100 ms)",
        times_ms[0],
        times_ms[times_ms.len() / 2],
        times_ms[times_ms.len() - 1]
    );
    println!("  CPU time per parse (mean): {parse_cpu_ms:.1} ms");
    let cpu_start = cpu_seconds();
    for _ in 0..runs {
        std::hint::black_box(promtext::parse(&big).unwrap());
    }
    let text_cpu_ms = (cpu_seconds() - cpu_start) / runs as f64 * 1e3;
    println!("  of which the text format alone (promtext::parse): {text_cpu_ms:.1} ms CPU");

    // The 8-GPU node agent at 1 Hz.
    let node = scrape(&fixture, GPUS_PER_HOST);
    let allocations: Vec<Allocation> = (0..GPUS_PER_HOST as u32)
        .map(|i| Allocation {
            node: "node-00000".into(),
            device_index: i,
            mig_instance: None,
            amd_partition: None,
            workload: WorkloadId(u64::from(i / 2)),
            member: i % 2,
            shares: 1000,
            pod: None,
        })
        .collect();
    let iterations = 20_000;
    let cpu_start = cpu_seconds();
    let wall_start = Instant::now();
    let mut events = 0;
    for _ in 0..iterations {
        let samples = dcgm::parse(&node).unwrap();
        events += activity_events(attribute(&samples, &allocations)).len();
    }
    let wall_s = wall_start.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_start;
    let per_collection_us = cpu_s / f64::from(iterations) * 1e6;
    println!(
        "8-GPU collection (parse {} bytes + normalise + attribute to 8 allocations + events): \
         {iterations} collections, {events} events",
        node.len()
    );
    println!(
        "  CPU {per_collection_us:.1} µs per collection (wall {:.1} µs) = {:.4} % of one core at 1 Hz (goal < 1 %)",
        wall_s / f64::from(iterations) * 1e6,
        per_collection_us / 1e6 * 100.0
    );
}
