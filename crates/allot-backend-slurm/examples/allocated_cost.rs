//! What reading the GPUs Slurm bound costs (`Backend::allocated_devices`, called by the daemon
//! after every poll that saw starts): for a few new starts one `scontrol show job -d` per job
//! (up to 8, or one per 40 jobs in the queue), beyond that one `squeue --json` of the whole
//! queue. Launches 24 one-GPU runs on node1–node3, times the call for 1, 4, 8, 16 and 24 of
//! them, and times one `squeue --json` (what the call costs beyond the limit).
//!
//!   # e.g. with 1,000 foreign jobs waiting (see watch_cost.rs), then:
//!   SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf \
//!     cargo run --release -p allot-backend-slurm --example allocated_cost -- 10

#![allow(clippy::disallowed_methods, clippy::print_stdout)] // a benchmark: real time, a report

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use allot_backend::{Backend, DeviceAssignment, Launch, MemberLaunch, RunId, StopSignal, Vendor};
use allot_backend_slurm::{SlurmBackend, SlurmConfig};

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let conf = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/allot-slurm/etc/slurm.conf"));
    let logs = std::env::temp_dir().join(format!("allot-allocated-cost-{}", std::process::id()));
    let mut config = SlurmConfig::new();
    config.runner.slurm_conf = Some(conf.clone());
    config.job_prefix = format!("allotcost{}", std::process::id());
    config.default_account = Some("research".to_string());
    let mut backend = SlurmBackend::new(config);
    backend.inventory().expect("inventory");
    let runs: Vec<RunId> = (1..=24).map(|workload| RunId { workload, attempt: 1 }).collect();
    for (i, run) in runs.iter().enumerate() {
        let node = format!("node{}", i / 8 + 1);
        let launch = Launch {
            run: *run,
            command: vec!["sleep".into(), "300".into()],
            env: BTreeMap::new(),
            members: vec![MemberLaunch {
                node,
                devices: vec![DeviceAssignment {
                    index: 0,
                    uuid: None,
                    vendor: Vendor::Nvidia,
                    shares: 1000,
                }],
            }],
            log_dir: logs.join(run.to_string()),
            adopt: None,
            resources: Default::default(),
        };
        backend.launch(&launch).expect("launch");
    }
    let start = Instant::now();
    let mut started = 0;
    while started < runs.len() {
        started += backend
            .poll()
            .expect("poll")
            .iter()
            .filter(|o| matches!(o, allot_backend::Observation::Started { .. }))
            .count();
        assert!(start.elapsed() < Duration::from_secs(90), "only {started} of 24 started");
        std::thread::sleep(Duration::from_millis(200));
    }
    let slurm = |args: &[&str]| {
        let out = std::process::Command::new(args[0])
            .env("SLURM_CONF", &conf)
            .args(&args[1..])
            .output()
            .expect("a Slurm command");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let queued = slurm(&["squeue", "-h", "--states=all", "-o", "%i"]).lines().count();
    println!("{queued} jobs in the queue");
    let median_max = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        (times[times.len() / 2], times[times.len() - 1])
    };
    for n in [1, 4, 8, 16, 24] {
        let (median, max) = median_max(
            (0..rounds)
                .map(|_| {
                    let t = Instant::now();
                    let bound = backend.allocated_devices(&runs[..n]).expect("allocated_devices");
                    assert_eq!(bound.len(), n, "{bound:?}");
                    t.elapsed().as_secs_f64() * 1000.0
                })
                .collect(),
        );
        let how = if n <= 8.max(queued / 40) { "per job" } else { "one squeue --json" };
        println!("{n} started runs ({how}): median {median:.0} ms, max {max:.0} ms over {rounds}");
    }
    let (median, max) = median_max(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                let _ = slurm(&["squeue", "--json"]);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    );
    println!("squeue --json alone: median {median:.0} ms, max {max:.0} ms over {rounds}");
    for run in &runs {
        let _ = backend.signal(*run, StopSignal::Kill);
    }
    let _ = std::fs::remove_dir_all(&logs);
}
