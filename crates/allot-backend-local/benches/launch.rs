//! What isolation costs a launch: `LocalBackend::launch` (fork, pid file, cgroup entry, account
//! drop, exec) and the time until the member's `true` has ended and been observed, for members
//! run plainly, in their own cgroups, and as another Unix account in their own cgroups.
//!
//! `cargo bench -p allot-backend-local --bench launch` (root for the cgroup and account rows;
//! the account row needs `allot-alice`, as the isolation tests do). `ALLOT_BENCH_LAUNCHES`
//! sets how many runs per row (default 300).

#![allow(clippy::print_stdout, clippy::disallowed_methods)] // a benchmark prints its timings

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use allot_backend::{Backend, Launch, MemberLaunch, Observation, RunId};
use allot_backend_local::{LocalBackend, LocalConfig, RunAs, cgroup};

const NODE: &str = "bench";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let last = sorted.len().saturating_sub(1);
    let at = (last as f64 * p).round() as usize;
    sorted[at.min(last)]
}

fn row(name: &str, config: LocalConfig, runs: u64, user: &str) {
    let logs = config.state_dir.join("workloads");
    let mut backend = match LocalBackend::new(config) {
        Ok(b) => b,
        Err(e) => {
            println!("{name:<30} skipped: {e}");
            return;
        }
    };
    let (mut launch_times, mut round_trips) = (Vec::new(), Vec::new());
    for workload in 1..=runs {
        let run = RunId { workload, attempt: 1 };
        let launch = Launch {
            run,
            command: vec!["true".to_string()],
            env: BTreeMap::from([("ALLOT_USER".to_string(), user.to_string())]),
            members: vec![MemberLaunch { node: NODE.to_string(), devices: Vec::new() }],
            log_dir: logs.join(workload.to_string()).join("logs").join("1"),
            adopt: None,
            resources: allot_backend::MemberResources { cpu_millis: 1000, memory_mib: 256 },
        };
        let start = Instant::now();
        if let Err(e) = backend.launch(&launch) {
            println!("{name:<30} launch failed: {e}");
            return;
        }
        launch_times.push(start.elapsed());
        loop {
            let seen = backend.poll().unwrap_or_default();
            if let Some(o) = seen.iter().find(|o| !matches!(o, Observation::Started { .. })) {
                if !matches!(o, Observation::Exited { code: Some(0), .. }) {
                    println!("{name:<30} a run did not succeed: {o:?}");
                    return;
                }
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        round_trips.push(start.elapsed());
    }
    launch_times.sort();
    round_trips.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<30} launch p50 {:>6.2} ms p99 {:>6.2} ms | launch to exit observed p50 {:>6.2} ms p99 {:>6.2} ms ({runs} runs)",
        ms(percentile(&launch_times, 0.5)),
        ms(percentile(&launch_times, 0.99)),
        ms(percentile(&round_trips, 0.5)),
        ms(percentile(&round_trips, 0.99)),
    );
}

fn main() {
    let runs: u64 =
        std::env::var("ALLOT_BENCH_LAUNCHES").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let Ok(base) = tempfile::tempdir() else {
        println!("no temporary directory");
        return;
    };
    // The account row's member must pass into its files.
    let _ =
        std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711));
    let config = |name: &str| {
        let mut c = LocalConfig::new(base.path().join(name), NODE.to_string());
        c.use_nvml = false;
        c.sysfs_root = base.path().join("no-sysfs");
        c.gpu_device_nodes = Some((Vec::new(), None));
        c
    };
    row("plain (the daemon's account)", config("plain"), runs, "");
    match cgroup::Cgroups::detect() {
        Ok(cgroups) => {
            let mut c = config("cgroup");
            c.cgroups = Some(cgroups.clone());
            row("own cgroup", c, runs, "");
            let mut c = config("account");
            c.cgroups = Some(cgroups);
            c.run_as = RunAs::Submitter;
            row("own cgroup, as allot-alice", c, runs, "allot-alice");
        }
        Err(e) => println!("cgroup rows skipped: {e}"),
    }
}
