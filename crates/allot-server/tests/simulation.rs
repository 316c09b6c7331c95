//! The whole-system simulation (`allot_server::simulation`): seeded runs of the daemon's
//! state machine with its real SQLite log, the real start sequence and executor, over the
//! fake backend, with API traffic, backend and telemetry faults, crashes and clock jumps, and
//! the invariants checked after every step.
//!
//! `cargo test` runs `ALLOT_SIM_SEEDS` seeds (default 8) of `ALLOT_SIM_STEPS` steps
//! (default 300); `.ci/run`'s slow tier runs thousands. A failing seed prints the command that
//! replays it: `ALLOT_SIM_SEED=N cargo test -p allot-server --test simulation -- one_seed`.

#![allow(clippy::print_stdout)] // the figures are the tier's output

use std::collections::BTreeMap;

use allot_server::simulation::{SimConfig, SimReport, mute_daemon_log, run};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn summary(reports: &[SimReport]) -> String {
    let mut injected: BTreeMap<String, u64> = BTreeMap::new();
    for r in reports {
        for (k, v) in &r.injected {
            *injected.entry(k.clone()).or_default() += v;
        }
    }
    let steps: u64 = reports.iter().map(|r| r.steps).sum();
    let acked: u64 = reports.iter().map(|r| r.acknowledged).sum();
    let entries: u64 = reports.iter().map(|r| r.entries).sum();
    let recoveries: u64 = reports.iter().map(|r| r.recoveries).sum();
    format!(
        "{} seeds, {steps} steps, {acked} submissions acknowledged, {entries} log entries, \
         {recoveries} recoveries from the log; injected: {injected:?}",
        reports.len()
    )
}

#[test]
fn seeded_runs_hold_every_invariant() {
    if std::env::var("ALLOT_SIM_SEED").is_ok() {
        return; // `one_seed` runs it
    }
    let seeds = env_u64("ALLOT_SIM_SEEDS", 8);
    let steps = env_u64("ALLOT_SIM_STEPS", 300);
    let first = env_u64("ALLOT_SIM_FIRST_SEED", 1);
    // Seeds are independent: `ALLOT_SIM_THREADS` (default 2) run side by side.
    let threads = env_u64("ALLOT_SIM_THREADS", 2).max(1);
    mute_daemon_log(); // `one_seed` keeps them
    let results: Vec<Result<SimReport, String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (first..first + seeds)
                        .filter(|seed| seed % threads == t)
                        .map(|seed| {
                            run(&SimConfig { seed, steps, dir: None }).map_err(|v| v.to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a simulation thread")).collect()
    });
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(report) => reports.push(report),
            Err(violation) => failures.push(violation),
        }
    }
    assert!(failures.is_empty(), "{} seed(s) failed:\n{}", failures.len(), failures.join("\n\n"));
    let total = summary(&reports);
    println!("simulation: {total}");
    // The scheduler reached every kind of happening it has.
    for kind in [
        "submit",
        "submit_invalid",
        "action",
        "policy_apply",
        "policy_apply_removing_a_project",
        "run_ends",
        "launch_refused",
        "controller_unreachable",
        "polls_fail",
        "inventory_changes",
        "telemetry",
        "telemetry_noise",
        "crash",
        "crash_mid_step",
        "clock_jump_backward",
        "work_beside",
        "work_beside_ends",
        "shadow_start",
        "shadow_stop",
    ] {
        assert!(total.contains(&format!("\"{kind}\"")), "no {kind} injected: {total}");
    }
}

#[test]
fn one_seed() {
    let Ok(seed) = std::env::var("ALLOT_SIM_SEED") else { return };
    let seed: u64 = seed.parse().expect("ALLOT_SIM_SEED is a number");
    let steps = env_u64("ALLOT_SIM_STEPS", 300);
    match run(&SimConfig { seed, steps, dir: None }) {
        Ok(report) => println!("seed {seed}: {}", summary(&[report])),
        Err(violation) => panic!("{violation}"),
    }
}

#[test]
fn a_seed_is_replayed_exactly() {
    let config = SimConfig { seed: 7, steps: 150, dir: None };
    let a = run(&config).map_err(|v| v.to_string()).expect("seed 7");
    let b = run(&config).map_err(|v| v.to_string()).expect("seed 7 again");
    assert_eq!(a, b, "the same seed, the same run");
}
