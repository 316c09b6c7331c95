//! Reservations measured in the simulator (figure benches, not tests of figures, house rule 8;
//! all read the shared traces and run only when asked):
//!
//! ```sh
//! ALLOT_SLICE_BENCH=1 cargo test --release -p allot-sim --test reserve_bench -- --nocapture
//! ALLOT_SLICE_BENCH=variants cargo test --release -p allot-sim --test reserve_bench -- --nocapture
//! ALLOT_SLICE_BENCH=tail cargo test --release -p allot-sim --test reserve_bench -- --nocapture
//! ALLOT_SLICE_STRICT=1 …   # the slice's projects under strict FIFO (`queueing: strict_fifo`)
//! ALLOT_PHILLY_BENCH=6 cargo test --release -p allot-sim --test reserve_bench -- --nocapture
//! ```
//!
//! `slurm_slice_figures`: the Slurm comparison's slice (`scripts/bench-slurm-vs-allot.py`: Philly rows 58500–58749,
//! 55× compressed, durations 3–90 s, accounts research 16 / team-a 8 / team-b 8 in one cohort,
//! 4 nodes × 8 GPUs) replayed in the simulator, with and without reservations and time limits:
//! the simulator starts admitted work at once and restarts pre-empted work with no delay
//! (`restart_delay_s: 0`), where the real cluster takes a second or two each way.
#![allow(clippy::print_stdout)] // a figure bench: its tables are what it is run for

use std::collections::BTreeMap;
use std::path::Path;

use allot_core::{DeviceSpec, NodeSpec};
use allot_sim::BadRows;
use allot_sim::replay::{ReplayConfig, add_unlisted_projects, replay};
use allot_sim::trace::{
    TraceJob, load_philly_jobs, load_philly_machines, parse_datetime, philly_nodes,
};

const FIRST: usize = 58_500;
const COUNT: usize = 250;
const COMPRESS: f64 = 55.0;
const GUARANTEED: [(&str, u32); 3] = [("research", 16), ("team-a", 8), ("team-b", 8)];

/// The slice as the bench script makes it.
fn slice() -> Vec<TraceJob> {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/philly-pollux/philly.csv");
    let text = std::fs::read_to_string(trace).expect("the shared Philly trace");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (ts, dur, gpus, vc) = (col("timestamp"), col("duration"), col("num_gpus"), col("cluster"));
    let rows: Vec<Vec<&str>> =
        lines.skip(FIRST).take(COUNT).map(|l| l.split(',').collect()).collect();
    // Accounts: the largest VC is research, the others alternately team-a and team-b.
    let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *sizes.entry(r[vc]).or_default() += 1;
    }
    let mut order: Vec<(&str, usize)> = sizes.into_iter().collect();
    order.sort_by_key(|&(name, n)| (std::cmp::Reverse(n), name));
    let account: BTreeMap<&str, &str> = order
        .iter()
        .enumerate()
        .map(|(i, &(name, _))| {
            (
                name,
                if i == 0 {
                    "research"
                } else if i % 2 == 1 {
                    "team-a"
                } else {
                    "team-b"
                },
            )
        })
        .collect();
    let t0 = parse_datetime(rows[0][ts]).expect("a timestamp");
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let g: u32 = r[gpus].parse().expect("num_gpus");
            let members = g.div_ceil(8).max(1);
            let at = parse_datetime(r[ts]).expect("a timestamp");
            let d: f64 = r[dur].parse().expect("duration");
            let duration_s = ((d / COMPRESS).clamp(3.0, 90.0) * 10.0).round() / 10.0;
            let submit_s = (at - t0) as f64 / COMPRESS;
            TraceJob {
                name: format!("job-{i}"),
                kind: None,
                line: FIRST + i + 2,
                ..TraceJob::whole(
                    i as u64 + 1,
                    account[r[vc]],
                    submit_s,
                    duration_s,
                    members,
                    g / members,
                )
            }
        })
        .collect()
}

fn policy(reserve: Option<&str>) -> allot_core::PolicySpec {
    policy_with(reserve, "")
}

/// The bench policy with `preemption` lines added (indented two spaces, e.g.
/// `  max_per_workload: {count: 1, window: 10m}\n`).
fn policy_with(reserve: Option<&str>, preemption: &str) -> allot_core::PolicySpec {
    policy_for(reserve, preemption, &GUARANTEED)
}

/// The bench policy for `projects` (name, guaranteed H100s), all of one cohort, each able to
/// borrow the rest of the 32 GPUs: the allot arm's policy in `bench-slurm-vs-allot.py`.
fn policy_for(
    reserve: Option<&str>,
    preemption: &str,
    projects: &[(&str, u32)],
) -> allot_core::PolicySpec {
    let mut text = String::new();
    if let Some(after) = reserve {
        text.push_str(&format!("reservations: {{after: {after}}}\n"));
    }
    text.push_str("preemption:\n  mode: requeue\n");
    text.push_str(preemption);
    text.push_str(
        "restart_cost: 1m\npriority_classes:\n  \
         - {name: normal, value: 0, preemptible: true}\ndefault_priority_class: normal\n\
         projects:\n",
    );
    for &(name, g) in projects {
        text.push_str(&format!(
            "  - name: {name}\n    cohort: lab\n    quotas:\n      \
             - {{model: h100, guaranteed: {g}, borrow_limit: {}}}\n",
            32 - g
        ));
        if std::env::var("ALLOT_SLICE_STRICT").is_ok() {
            text.push_str("    queueing: strict_fifo\n");
        }
    }
    allot_config::parse_policy("bench.yaml", &text).expect("the bench policy parses")
}

fn nodes() -> Vec<NodeSpec> {
    (0..4)
        .map(|i| NodeSpec {
            name: format!("n{i}"),
            cpu_millis: 64_000,
            memory_mib: 256 * 1024,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..8)
                .map(|_| DeviceSpec {
                    model: "h100".into(),
                    memory_mib: 81_920,
                    island: 0,
                    mig: false,
                })
                .collect(),
        })
        .collect()
}

/// The replay settings of the slice's Slurm comparisons: the Slurm arm's time limits as max
/// runtimes, and restarts at once.
fn slice_config() -> ReplayConfig {
    ReplayConfig { restart_delay_s: 0.0, time_limits: true, ..ReplayConfig::default() }
}

/// The Slurm model (`replay_slurm`, backfill every 30 s as Slurm's default) on the slice.
fn slurm_model(jobs: &[TraceJob], config: &ReplayConfig) -> allot_sim::outcome::ReplayReport {
    allot_sim::slurm::replay_slurm(
        &nodes(),
        &policy(None),
        jobs,
        config,
        &allot_sim::slurm::SlurmBackfill::default(),
    )
    .expect("the Slurm model runs the slice")
}

/// Job `id`'s wait for its first start in `r` (NaN if it never started).
fn wait(r: &allot_sim::outcome::ReplayReport, id: u64) -> f64 {
    r.by_job.get(&id).and_then(|j| j.first_wait_s).unwrap_or(f64::NAN)
}

/// The mean and the longest of the waits of jobs `ids` in `r`.
fn mean_max_wait(r: &allot_sim::outcome::ReplayReport, ids: &[u64]) -> (f64, f64) {
    let waits: Vec<f64> = ids.iter().map(|&id| wait(r, id)).collect();
    let mean = waits.iter().sum::<f64>() / waits.len() as f64;
    (mean, waits.iter().copied().fold(0.0, f64::max))
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 * p / 100.0).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[test]
fn slurm_slice_figures() {
    if std::env::var("ALLOT_SLICE_BENCH").ok().as_deref() != Some("1") {
        return;
    }
    let jobs = slice();
    let big: Vec<u64> = jobs.iter().filter(|j| j.gpus * j.members >= 8).map(|j| j.id).collect();
    println!(
        "| policy | time limits | wait p50 / p95 / p99 s | ≥8-GPU wait mean / max s | \
         pre-emptions | lost GPU-h | makespan s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for reserve in [None, Some("10s"), Some("30s"), Some("1m")] {
        for time_limits in [false, true] {
            let config =
                ReplayConfig { restart_delay_s: 0.0, time_limits, ..ReplayConfig::default() };
            let report = replay(&nodes(), &policy(reserve), "slice", &jobs, &config)
                .expect("the slice replays");
            let mut waits: Vec<f64> =
                report.by_job.values().filter_map(|o| o.first_wait_s).collect();
            waits.sort_by(f64::total_cmp);
            let big_waits: Vec<f64> = big
                .iter()
                .filter_map(|id| report.by_job.get(id).and_then(|o| o.first_wait_s))
                .collect();
            let mean = big_waits.iter().sum::<f64>() / big_waits.len().max(1) as f64;
            let max = big_waits.iter().copied().fold(0.0, f64::max);
            println!(
                "| {} | {} | {:.1} / {:.1} / {:.1} | {mean:.1} / {max:.1} | {} | {:.3} | {:.0} |",
                reserve.map_or("off".to_string(), |a| format!("after {a}")),
                if time_limits { "yes" } else { "no" },
                pct(&waits, 50.0),
                pct(&waits, 95.0),
                pct(&waits, 99.0),
                report.preemptions,
                report.lost_gpu_hours,
                report.span_s,
            );
        }
    }
}

/// `philly_big_job_waits`: the whole Philly trace at the load `ALLOT_PHILLY_BENCH` gives (as
/// `allot sim replay --load`), with `examples/philly-policy.yaml`, checkpoints every 30 min,
/// with and without `reservations: {after: 5m}` and time limits: waits of all jobs and of
/// jobs asking 8 GPUs or more, pre-emptions, lost GPU-hours and the replay's wall time.
#[test]
fn philly_big_job_waits() {
    let Some(load) = std::env::var("ALLOT_PHILLY_BENCH").ok().and_then(|v| v.parse::<f64>().ok())
    else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let traces = root.join("../shared/traces");
    let (machines, _) =
        load_philly_machines(&traces.join("philly-machines/cluster_machine_list"), BadRows::Fail)
            .expect("machines");
    let nodes = philly_nodes(&machines);
    let per_node = nodes.iter().map(|n| n.devices.len() as u32).max().unwrap_or(0);
    let loaded =
        load_philly_jobs(&traces.join("philly-pollux/philly.csv"), BadRows::Fail).expect("jobs");
    let jobs: Vec<TraceJob> = loaded
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let mut t = j.to_trace_job(i as u64 + 1, per_node);
            t.submit_s /= load;
            t
        })
        .collect();
    let base = allot_config::load_policy(&root.join("examples/philly-policy.yaml"))
        .expect("the example policy");
    println!(
        "| reservations | time limits | wait p50 / p95 / p99 s | ≥8-GPU wait mean / p95 / max s | \
         pre-emptions | lost GPU-h | wall s |"
    );
    println!("|---|---|---|---|---|---|---|");
    // `ALLOT_PHILLY_ARMS`: which arms run, as `off,on` × `no,yes` pairs (`off-no,on-no`);
    // all four when absent (one arm at 6× takes minutes).
    let arms = std::env::var("ALLOT_PHILLY_ARMS").ok();
    let wanted = |reserve: bool, limits: bool| {
        let name =
            format!("{}-{}", if reserve { "on" } else { "off" }, if limits { "yes" } else { "no" });
        arms.as_deref().is_none_or(|a| a.split(',').any(|x| x.trim() == name))
    };
    for reserve in [false, true] {
        let mut policy = base.clone();
        if reserve {
            policy.reservations = Some(allot_core::Reservations {
                after_ms: 300_000,
                per_model_max: 2,
                hold_quota: false,
            });
        }
        let (policy, _) = add_unlisted_projects(&policy, &jobs);
        for time_limits in [false, true] {
            if !wanted(reserve, time_limits) {
                continue;
            }
            let config = ReplayConfig {
                default_checkpoint_interval_s: Some(1800.0),
                time_limits,
                ..ReplayConfig::default()
            };
            #[allow(clippy::disallowed_methods)] // a figure bench reports its wall time
            let started = std::time::Instant::now();
            let report = replay(&nodes, &policy, "philly", &jobs, &config).expect("replays");
            let wall_s = started.elapsed().as_secs_f64();
            let mut waits: Vec<f64> =
                report.by_job.values().filter_map(|o| o.first_wait_s).collect();
            waits.sort_by(f64::total_cmp);
            let mut big: Vec<f64> = jobs
                .iter()
                .filter(|j| j.gpus * j.members >= 8)
                .filter_map(|j| report.by_job.get(&j.id).and_then(|o| o.first_wait_s))
                .collect();
            big.sort_by(f64::total_cmp);
            println!(
                "| {} | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} ({} jobs) | {} | {:.1} | {wall_s:.1} |",
                if reserve { "after 5m" } else { "off" },
                if time_limits { "yes" } else { "no" },
                pct(&waits, 50.0),
                pct(&waits, 95.0),
                pct(&waits, 99.0),
                big.iter().sum::<f64>() / big.len().max(1) as f64,
                pct(&big, 95.0),
                big.last().copied().unwrap_or(f64::NAN),
                big.len(),
                report.preemptions,
                report.lost_gpu_hours,
            );
        }
    }
}

/// `ALLOT_SLICE_BENCH=variants`: the slice under pre-emption guards and reservations, each with
/// the Slurm arm's time limits, and the Slurm model (`replay_slurm`, backfill every 30 s as
/// Slurm's default) on the same slice: the model's fidelity against the real cluster's arm.
#[test]
fn slurm_slice_variants() {
    if std::env::var("ALLOT_SLICE_BENCH").ok().as_deref() != Some("variants") {
        return;
    }
    let jobs = slice();
    let config = slice_config();
    println!(
        "| variant | wait p50 / p95 / p99 s | ≥8-GPU wait mean / max s | pre-emptions | \
         lost GPU-h | lost % | makespan s | finished |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let row = |label: &str, r: &allot_sim::outcome::ReplayReport| {
        println!(
            "| {label} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.3} | {:.1} | {:.0} | {} of {} |",
            r.queue_delay_s_p50,
            r.queue_delay_s_p95,
            r.queue_delay_s_p99,
            r.big_queue_delay_s_mean,
            r.big_queue_delay_s_max,
            r.preemptions,
            r.lost_gpu_hours,
            100.0 * r.lost_gpu_hours / r.allocated_gpu_hours.max(1e-9),
            r.span_s,
            r.jobs_finished,
            r.jobs_total,
        );
    };
    let slurm = slurm_model(&jobs, &config);
    row("Slurm model", &slurm);
    let guards = [
        ("", "default guard"),
        ("  max_per_workload: {count: 1, window: 10m}\n", "at most 1 pre-emption a job"),
        ("  exempt_after_restart: 5m\n", "exempt 5m after a restart"),
        ("  max_per_workload: false\n  exempt_after_restart: 0s\n", "no guard"),
        ("  reclaim_after: 30s\n", "reclaim after 30 s"),
        ("  reclaim_after: 1m\n", "reclaim after 1 m"),
        ("  reclaim_after: 2m\n", "reclaim after 2 m"),
    ];
    // `after` with the reservations' other options, if any.
    let reserves = [
        None,
        Some("10s"),
        Some("10s, per_model_max: 8"),
        Some("10s, hold_quota: true"),
        Some("30s"),
        Some("30s, hold_quota: true"),
    ];
    for reserve in reserves {
        for (lines, label) in guards {
            let report = replay(&nodes(), &policy_with(reserve, lines), "slice", &jobs, &config)
                .expect("the slice replays");
            let label = format!(
                "{}, {label}",
                reserve.map_or("no reservations".to_string(), |a| format!("reserve after {a}"))
            );
            row(&label, &report);
        }
    }
}

/// `ALLOT_SLICE_BENCH=tail`: who waits in the slice's tail — each project's waits under the
/// Slurm model and under allot (the real cluster's policy: reserve after 10 s, reclaim after
/// 1 m, time limits), and every job whose wait is at or past either run's p95, side by side.
#[test]
fn slurm_slice_tail() {
    if std::env::var("ALLOT_SLICE_BENCH").ok().as_deref() != Some("tail") {
        return;
    }
    let jobs = slice();
    let config = slice_config();
    let slurm = slurm_model(&jobs, &config);
    // `ALLOT_SLICE_RESERVE`: the reservations' options instead (e.g. `10s, per_model_max: 8`).
    let reserve = std::env::var("ALLOT_SLICE_RESERVE").unwrap_or_else(|_| "10s".into());
    let allot = replay(
        &nodes(),
        &policy_with(Some(&reserve), "  reclaim_after: 1m\n"),
        "slice",
        &jobs,
        &config,
    )
    .expect("the slice replays");
    println!("| project | GPUs | jobs | Slurm model wait mean / max s | allot wait mean / max s |");
    println!("|---|---|---|---|---|");
    let mut groups: BTreeMap<(String, u32), Vec<u64>> = BTreeMap::new();
    for j in &jobs {
        let gpus = j.members * j.gpus;
        groups.entry((j.project.clone(), gpus.min(8))).or_default().push(j.id);
    }
    for ((project, gpus), ids) in &groups {
        let stats = |r| mean_max_wait(r, ids);
        let (sm, sx) = stats(&slurm);
        let (am, ax) = stats(&allot);
        let g = if *gpus >= 8 { "≥ 8".to_string() } else { gpus.to_string() };
        println!("| {project} | {g} | {} | {sm:.1} / {sx:.1} | {am:.1} / {ax:.1} |", ids.len());
    }
    let (sp95, ap95) = (slurm.queue_delay_s_p95, allot.queue_delay_s_p95);
    println!("\nSlurm model p95 {sp95:.1} s, allot p95 {ap95:.1} s; jobs at or past either:");
    println!("| job | project | GPUs | submit s | Slurm model wait s | allot wait s |");
    println!("|---|---|---|---|---|---|");
    for j in &jobs {
        let (s, a) = (wait(&slurm, j.id), wait(&allot, j.id));
        if s >= sp95 || a >= ap95 {
            println!(
                "| {} | {} | {} | {:.1} | {s:.1} | {a:.1} |",
                j.id,
                j.project,
                j.members * j.gpus,
                j.submit_s
            );
        }
    }
}

/// The slice in one project guaranteed the 32 GPUs, and the reservations' options
/// (`ALLOT_SLICE_RESERVE`, default the real cluster's one-queue arm) with the policy they make.
fn one_queue_slice() -> (Vec<TraceJob>, String, allot_core::PolicySpec) {
    let jobs = slice().into_iter().map(|j| TraceJob { project: "research".into(), ..j }).collect();
    let reserve = std::env::var("ALLOT_SLICE_RESERVE")
        .unwrap_or_else(|_| "1s, per_model_max: 64, hold_quota: true".into());
    let policy = policy_for(Some(&reserve), "", &[("research", 32)]);
    (jobs, reserve, policy)
}

/// Prints a one-queue table row of `r` (p50 / p95 / p99 waits, the big jobs' mean and worst
/// wait, makespan) and returns those figures in that order.
fn one_queue_row(label: &str, r: &allot_sim::outcome::ReplayReport) -> [f64; 6] {
    let f = [
        r.queue_delay_s_p50,
        r.queue_delay_s_p95,
        r.queue_delay_s_p99,
        r.big_queue_delay_s_mean,
        r.big_queue_delay_s_max,
        r.span_s,
    ];
    println!(
        "| {label} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {:.0} |",
        f[0], f[1], f[2], f[3], f[4], f[5]
    );
    f
}

/// `ALLOT_SLICE_BENCH=one-queue`: the slice with every job in one project guaranteed the 32
/// GPUs (the real cluster's `bench-slurm-vs-allot.py --one-queue` arm: reserve after 1 s, up
/// to 64 per model, holding quota, time limits) against the Slurm model with backfill every
/// 5 s (the test cluster's `bf_interval`) and every 30 s; then each size's waits and the jobs
/// at or past either p95. `ALLOT_SLICE_RESERVE` changes the reservations' options;
/// `ALLOT_SLICE_LAUNCH_DELAY=S` puts S seconds between an admission and its start (the real
/// cluster's is about 1 s: `sbatch`, Slurm's start, allot's look at the queue; waits here run
/// to the admission); `ALLOT_SLICE_JOBS=FILE` writes every job's waits there (tab-separated).
#[test]
fn slurm_slice_one_queue() {
    if std::env::var("ALLOT_SLICE_BENCH").ok().as_deref() != Some("one-queue") {
        return;
    }
    let (jobs, reserve, policy) = one_queue_slice();
    let mut config = slice_config();
    if let Some(d) = std::env::var("ALLOT_SLICE_LAUNCH_DELAY").ok().and_then(|v| v.parse().ok()) {
        config.launch_delay_s = d;
    }
    let allot = replay(&nodes(), &policy, "slice", &jobs, &config).expect("the slice replays");
    println!("reservations: {reserve}; launch delay {} s", config.launch_delay_s);
    let model = |interval_s: f64| {
        allot_sim::slurm::replay_slurm(
            &nodes(),
            &policy,
            &jobs,
            &config,
            &allot_sim::slurm::SlurmBackfill { interval_s, ..Default::default() },
        )
        .expect("the Slurm model runs the slice")
    };
    let (slurm5, slurm30) = (model(5.0), model(30.0));
    println!("| run | wait p50 / p95 / p99 s | ≥8-GPU wait mean / max s | makespan s |");
    println!("|---|---|---|---|");
    for (label, r) in
        [("Slurm model, 5 s", &slurm5), ("Slurm model, 30 s", &slurm30), ("allot", &allot)]
    {
        one_queue_row(label, r);
    }
    println!("\n| GPUs | jobs | model 5 s wait mean / max s | allot wait mean / max s |");
    println!("|---|---|---|---|");
    let mut groups: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for j in &jobs {
        groups.entry((j.members * j.gpus).min(8)).or_default().push(j.id);
    }
    for (gpus, ids) in &groups {
        let stats = |r| mean_max_wait(r, ids);
        let ((sm, sx), (am, ax)) = (stats(&slurm5), stats(&allot));
        println!("| {gpus} | {} | {sm:.1} / {sx:.1} | {am:.1} / {ax:.1} |", ids.len());
    }
    // Every job's waits, to set beside a real run's (`bench-slurm-vs-allot.py --json`).
    if let Ok(file) = std::env::var("ALLOT_SLICE_JOBS") {
        let mut out = String::from("id\tgpus\tsubmit_s\tduration_s\tmodel_wait_s\tallot_wait_s\n");
        for j in &jobs {
            out += &format!(
                "{}\t{}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\n",
                j.id,
                j.members * j.gpus,
                j.submit_s,
                j.duration_s,
                wait(&slurm5, j.id),
                wait(&allot, j.id)
            );
        }
        std::fs::write(&file, out).expect("ALLOT_SLICE_JOBS names a writable file");
    }
    let (sp95, ap95) = (slurm5.queue_delay_s_p95, allot.queue_delay_s_p95);
    println!("\nmodel p95 {sp95:.1} s, allot p95 {ap95:.1} s; jobs at or past either:");
    println!("| job | GPUs | submit s | duration s | model 5 s wait s | allot wait s |");
    println!("|---|---|---|---|---|---|");
    for j in &jobs {
        let (s, a) = (wait(&slurm5, j.id), wait(&allot, j.id));
        if s >= sp95 || a >= ap95 {
            println!(
                "| {} | {} | {:.1} | {:.1} | {s:.1} | {a:.1} |",
                j.id,
                j.members * j.gpus,
                j.submit_s,
                j.duration_s
            );
        }
    }
}

/// `ALLOT_SLICE_BENCH=launch-delays`: the one-queue slice (as `slurm_slice_one_queue`) with
/// 0 to 2 s between an admission and its start, by quarter seconds. The real cluster's delay
/// is about 1 s; a rule whose figures swing across this range is judged by their spread, not
/// by the 0-s row. Waits run to the admission.
#[test]
fn slurm_slice_launch_delays() {
    if std::env::var("ALLOT_SLICE_BENCH").ok().as_deref() != Some("launch-delays") {
        return;
    }
    let (jobs, reserve, policy) = one_queue_slice();
    let model = allot_sim::slurm::replay_slurm(
        &nodes(),
        &policy,
        &jobs,
        &slice_config(),
        &allot_sim::slurm::SlurmBackfill { interval_s: 5.0, ..Default::default() },
    )
    .expect("the Slurm model runs the slice");
    println!("reservations: {reserve}");
    println!("| launch delay s | wait p50 / p95 / p99 s | ≥8-GPU wait mean / max s | makespan s |");
    println!("|---|---|---|---|");
    one_queue_row("Slurm model, 5 s", &model);
    let mut all: Vec<[f64; 6]> = Vec::new();
    for quarter in 0..=8 {
        let delay = f64::from(quarter) * 0.25;
        let config = ReplayConfig { launch_delay_s: delay, ..slice_config() };
        let r = replay(&nodes(), &policy, "slice", &jobs, &config).expect("the slice replays");
        all.push(one_queue_row(&format!("{delay:.2}"), &r));
    }
    let spread = |i: usize| {
        let mut v: Vec<f64> = all.iter().map(|f| f[i]).collect();
        v.sort_by(f64::total_cmp);
        format!("{:.1}–{:.1} (median {:.1})", v[0], v[v.len() - 1], v[v.len() / 2])
    };
    println!("\nacross the delays: p50 {}, p95 {}, p99 {}", spread(0), spread(1), spread(2));
    println!("big jobs' mean {}, max {}; makespan {}", spread(3), spread(4), spread(5));
}
