//! What `watch_cluster` costs on a busy cluster: the first call (which holds every pending
//! foreign job it sees in one `scontrol hold`), then steady calls, then the call after a new
//! foreign job started running (which reads `squeue --json` once for its GPU indices).
//!
//!   # e.g. 1,000 foreign jobs waiting: for i in $(seq 1000); do
//!   #   sbatch --begin=now+7200 -A load -o /dev/null --gres=gpu:h100:1 --wrap true; done
//!   SLURM_CONF=/tmp/allot-slurm/etc/slurm.conf \
//!     cargo run --release -p allot-backend-slurm --example watch_cost -- 20

#![allow(clippy::disallowed_methods, clippy::print_stdout)] // a benchmark: real time, a report

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use allot_backend::Backend;
use allot_backend_slurm::{SlurmBackend, SlurmConfig};

fn slurm_conf() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/allot-slurm/etc/slurm.conf"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let calls: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let mut config = SlurmConfig::new();
    config.runner.slurm_conf = Some(slurm_conf());
    let mut backend = SlurmBackend::new(config);
    let timed = |backend: &mut SlurmBackend| {
        let start = Instant::now();
        let news = backend.watch_cluster().expect("watch_cluster");
        (ms(start.elapsed()), news)
    };
    let (first, news) = timed(&mut backend);
    let pending = news.foreign.iter().filter(|w| w.running.is_empty()).count();
    println!(
        "first call: {first:.0} ms ({} nodes, {} foreign jobs, {pending} pending and held)",
        news.nodes.len(),
        news.foreign.len()
    );
    let mut steady: Vec<f64> = (0..calls).map(|_| timed(&mut backend).0).collect();
    steady.sort_by(f64::total_cmp);
    println!(
        "steady calls: median {:.0} ms, max {:.0} ms over {calls}",
        steady[steady.len() / 2],
        steady[steady.len() - 1]
    );
    let out = Command::new("sbatch")
        .env("SLURM_CONF", slurm_conf())
        .args(["--parsable", "-A", "load", "-o", "/dev/null", "--gres=gpu:h100:1"])
        .args(["--wrap", "sleep 30"])
        .output()
        .expect("sbatch");
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let start = Instant::now();
    loop {
        let state = Command::new("squeue")
            .env("SLURM_CONF", slurm_conf())
            .args(["-h", "-j", &job, "-o", "%T"])
            .output()
            .expect("squeue");
        if String::from_utf8_lossy(&state.stdout).trim() == "RUNNING" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "job {job} never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (after_start, _) = timed(&mut backend);
    let (next, _) = timed(&mut backend);
    println!("a foreign job started: {after_start:.0} ms (squeue --json once), then {next:.0} ms");
    let _ = Command::new("scancel").env("SLURM_CONF", slurm_conf()).arg(&job).status();
}
