//! Admission throughput on a Slurm cluster: N trivial jobs (`true`, one GPU each, spread over
//! the nodes round robin) either through the backend's launch path (submitted held, released
//! onto the given node, observed through `poll` until every run exited) or straight with
//! `sbatch --wrap true` onto the same nodes (observed with `squeue --json` until all ended).
//!
//!   SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf \
//!     cargo run --release -p allot-backend-slurm --example throughput -- backend 1000
//!   … -- direct 1000
//!   … -- backend-tick 1000 20   # a poll (which releases) after every 20 launches
//!
//! `ALLOT_SLURM_POLL=json` polls with `squeue --json` instead of `squeue --Format`.
//! Start each mode on a fresh cluster (`scripts/slurm-cluster.sh down; … up`): finished jobs
//! stay in squeue for MinJobAge and would slow the next run's polls.

#![allow(clippy::disallowed_methods, clippy::print_stdout)] // a benchmark: real time, a report

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use allot_backend::{Backend, DeviceAssignment, Launch, MemberLaunch, Observation, RunId, Vendor};
use allot_backend_slurm::{SlurmBackend, SlurmConfig, parse};

const NODES: u64 = 4;

fn slurm_conf() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/allot-slurm/etc/slurm.conf"))
}

fn node(i: u64) -> String {
    format!("node{}", i % NODES + 1)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// `tick`: poll after every `tick` launches, as a daemon interleaves admissions and polls (the
/// poll releases the jobs submitted since the last one); 0: launch all, then poll.
fn backend_mode(n: u64, held: bool, tick: u64) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut config = SlurmConfig::new();
    config.runner.slurm_conf = Some(slurm_conf());
    config.job_prefix = format!("bench{}", std::process::id());
    config.submit_held = held;
    if std::env::var("ALLOT_SLURM_POLL").is_ok_and(|v| v == "json") {
        config.poll_query = allot_backend_slurm::PollQuery::Json;
    }
    config.poll_min = Duration::from_millis(200);
    config.poll_max = Duration::from_millis(1000);
    let mut backend = SlurmBackend::new(config);
    backend.inventory().map_err(|e| e.to_string())?;
    let (mut exited, mut failed, mut polls) = (0u64, 0u64, 0u64);
    let mut poll_time = Duration::ZERO;
    let start = Instant::now();
    for i in 0..n {
        let run = RunId { workload: i + 1, attempt: 1 };
        let launch = Launch {
            run,
            command: vec!["true".to_string()],
            env: BTreeMap::new(),
            members: vec![MemberLaunch {
                node: node(i),
                devices: vec![DeviceAssignment {
                    index: 0,
                    uuid: None,
                    vendor: Vendor::Nvidia,
                    shares: 1000,
                }],
            }],
            log_dir: dir.path().join(run.to_string()),
            adopt: None,
            resources: Default::default(),
        };
        backend.launch(&launch).map_err(|e| e.to_string())?;
        if tick > 0 && (i + 1) % tick == 0 {
            let t = Instant::now();
            for o in backend.poll().map_err(|e| e.to_string())? {
                match o {
                    Observation::Exited { code: Some(0), .. } => exited += 1,
                    Observation::Exited { .. }
                    | Observation::Cancelled { .. }
                    | Observation::LaunchFailed { .. }
                    | Observation::LaunchDeferred { .. } => failed += 1,
                    Observation::Started { .. } => {}
                }
            }
            poll_time += t.elapsed();
            polls += 1;
        }
    }
    let submitted = start.elapsed();
    while exited + failed < n {
        let t = Instant::now();
        let seen = backend.poll().map_err(|e| e.to_string())?;
        poll_time += t.elapsed();
        polls += 1;
        for o in seen {
            match o {
                Observation::Exited { code: Some(0), .. } => exited += 1,
                Observation::Exited { .. }
                | Observation::Cancelled { .. }
                | Observation::LaunchFailed { .. }
                | Observation::LaunchDeferred { .. } => failed += 1,
                Observation::Started { .. } => {}
            }
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {exited} of {n} ended after 600 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let total = start.elapsed();
    let mode = format!(
        "backend ({}, poll {:?}, {})",
        if held { "held + released" } else { "not held" },
        backend.config().poll_query,
        if tick > 0 {
            format!("a poll every {tick} launches")
        } else {
            "polls after all launches".to_string()
        }
    );
    println!(
        "{mode}: {n} jobs; launch path {:.1} s ({:.1} jobs/s, {:.1} ms/job); all exited after \
         {:.1} s = {:.1} jobs/s end to end; {exited} exit 0, {failed} other; {polls} polls, \
         {:.1} ms per poll",
        secs(submitted),
        n as f64 / secs(submitted),
        secs(submitted) * 1000.0 / n as f64,
        secs(total),
        n as f64 / secs(total),
        secs(poll_time) * 1000.0 / polls.max(1) as f64,
    );
    Ok(())
}

fn direct_mode(n: u64) -> Result<(), String> {
    let name = format!("direct{}", std::process::id());
    let start = Instant::now();
    for i in 0..n {
        let out = Command::new("sbatch")
            .env("SLURM_CONF", slurm_conf())
            .args(["--parsable", "-J", &name, "-o", "/dev/null", "--gres=gpu:h100:1"])
            .arg(format!("--nodelist={}", node(i)))
            .args(["--wrap", "true"])
            .output()
            .map_err(|e| format!("sbatch: {e}"))?;
        if !out.status.success() {
            return Err(format!("sbatch: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let submitted = start.elapsed();
    loop {
        let out = Command::new("squeue")
            .env("SLURM_CONF", slurm_conf())
            .arg("--json")
            .output()
            .map_err(|e| format!("squeue: {e}"))?;
        let jobs = parse::parse_squeue(&String::from_utf8_lossy(&out.stdout))
            .map_err(|e| e.to_string())?;
        let ours: Vec<_> = jobs.iter().filter(|j| j.name == name).collect();
        let ended = ours.iter().filter(|j| j.is_terminal()).count();
        if ended as u64 >= n {
            let ok = ours.iter().filter(|j| j.state == "COMPLETED").count();
            let total = start.elapsed();
            println!(
                "direct sbatch: {n} jobs; submitted in {:.1} s ({:.1} jobs/s, {:.1} ms/job); all \
                 ended after {:.1} s = {:.1} jobs/s end to end; {ok} COMPLETED",
                secs(submitted),
                n as f64 / secs(submitted),
                secs(submitted) * 1000.0 / n as f64,
                secs(total),
                n as f64 / secs(total),
            );
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {ended} of {n} ended after 600 s"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let result =
        match args.get(1).map(String::as_str) {
            Some("backend") => backend_mode(n, true, 0),
            Some("backend-unheld") => backend_mode(n, false, 0),
            Some("backend-tick") => {
                let tick = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(20);
                backend_mode(n, true, tick)
            }
            Some("direct") => direct_mode(n),
            _ => Err("usage: throughput backend|backend-unheld|direct [N] | backend-tick N TICK"
                .to_string()),
        };
    if let Err(e) = result {
        println!("error: {e}");
        std::process::exit(1);
    }
}
