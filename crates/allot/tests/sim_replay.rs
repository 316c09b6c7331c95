//! `allot sim replay`: the acceptance command (on the first jobs of the trace), its
//! determinism, several policies side by side, and bad input → exit 1 with file:line.

mod common;

use common::{allot, repo, text};

use std::process::Output;

fn traces() -> String {
    repo().join("../shared/traces").display().to_string()
}

fn acceptance(extra: &[&str]) -> Output {
    acceptance_as("json", extra)
}

fn acceptance_as(output: &str, extra: &[&str]) -> Output {
    let vcs = format!("{}/philly-machines/philly_vc.csv", traces());
    let mut args = vec!["--vcs", &vcs, "--policy", "examples/philly-policy.yaml"];
    args.extend_from_slice(extra);
    philly(output, &args)
}

/// `allot sim replay` of the shared Philly jobs on its machines, with `args` after.
fn philly(output: &str, args: &[&str]) -> Output {
    let t = traces();
    let jobs = format!("{t}/philly-pollux/philly.csv");
    let machines = format!("{t}/philly-machines/cluster_machine_list");
    let mut all =
        vec!["sim", "replay", "--jobs", &jobs, "--machines", &machines, "--output", output];
    all.extend_from_slice(args);
    allot(&all)
}

#[test]
fn the_acceptance_command_prints_the_documented_keys_byte_identically() {
    let out = acceptance(&["--limit-jobs", "300", "--no-timing"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for key in [
        "jobs_total",
        "jobs_finished",
        "jct_s_mean",
        "queue_delay_s_p50",
        "queue_delay_s_p95",
        "queue_delay_s_p99",
        "gpu_allocated_pct",
        "gpu_active_pct",
        "preemptions",
        "lost_gpu_hours",
        "goodput",
        "wall_ms",
        "timeline",
        "queue_delays_s",
        "projects",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["jobs_total"], 300);
    assert_eq!(json["jobs_finished"], 300);
    assert_eq!(json["wall_ms"], 0);
    assert_eq!(json["policy"], "philly-policy");
    let again = acceptance(&["--limit-jobs", "300", "--no-timing"]);
    assert_eq!(out.stdout, again.stdout, "same inputs and seed, different output");
    let other = acceptance(&["--limit-jobs", "300", "--no-timing", "--seed", "7"]);
    assert_ne!(out.stdout, other.stdout, "the seed changes nothing");
}

#[test]
fn several_policies_give_one_report_each_and_text_and_csv_render() {
    let out = acceptance(&[
        "--limit-jobs",
        "100",
        "--policy",
        "examples/philly-policy.yaml",
        "--no-timing",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["policies"].as_array().map(Vec::len), Some(2));
    let csv = acceptance_as("csv", &["--limit-jobs", "100"]);
    let csv = text(&csv.stdout);
    assert!(csv.starts_with("policy,seed,jobs_total,"), "{csv}");
    assert_eq!(csv.lines().count(), 2);
    let table = acceptance_as("text", &["--limit-jobs", "100"]);
    assert!(text(&table.stdout).contains("gpu_allocated_pct"));
}

#[test]
fn bad_input_exits_1_naming_file_line_and_field() {
    let out = acceptance(&["--policy", "no/such-policy.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no/such-policy.yaml"), "{}", text(&out.stderr));

    let out = acceptance(&["--limit-jobs", "10", "--load", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--load: give a factor"), "{}", text(&out.stderr));

    let dir = std::env::temp_dir().join(format!("allot-sim-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let broken = dir.join("jobs.csv");
    std::fs::write(
        &broken,
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-09-04 10:30:41,10.0,one,10.0,a\n",
    )
    .expect("write");
    let t = traces();
    let out = allot(&[
        "sim",
        "replay",
        "--jobs",
        &broken.display().to_string(),
        "--machines",
        &format!("{t}/philly-machines/cluster_machine_list"),
        "--policy",
        "examples/philly-policy.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("jobs.csv:2: num_gpus: `one` is not a GPU count — "), "{err}");

    // The Pollux copy has jobs of VCs that philly_vc.csv does not list (first: line 1867).
    let out = acceptance(&["--limit-jobs", "2000", "--strict-vcs"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("philly.csv:1867: project: `23dbec` is not a project"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_allot_trace_format_replays_on_a_cluster_file() {
    let out = allot(&[
        "sim",
        "replay",
        "--trace",
        "crates/allot-sim/tests/data/small.csv",
        "--cluster",
        "examples/cluster.yaml",
        "--policy",
        "examples/policy.yaml",
        "--output",
        "json",
        "--no-timing",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["jobs_total"], 4);
    assert_eq!(
        json["jobs_finished"].as_u64().unwrap_or(0) + json["jobs_cancelled"].as_u64().unwrap_or(0),
        4
    );
}

/// `--compare-with slurm-backfill` adds plain Slurm's column after the policies: no
/// pre-emption, nothing lost, every job finished, deterministic; bad `--bf-*` values and an
/// unknown scheduler are refused with the flag named.
#[test]
fn the_slurm_baseline_is_a_column_after_the_policies() {
    let args = ["--limit-jobs", "2000", "--load", "6", "--no-timing"];
    let out = acceptance(&[&args[..], &["--compare-with", "slurm-backfill"]].concat());
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let policies = json["policies"].as_array().expect("two reports");
    assert_eq!(policies.len(), 2);
    let slurm = &policies[1];
    assert_eq!(slurm["policy"], "slurm-backfill");
    assert_eq!(
        (slurm["jobs_finished"].as_u64(), slurm["preemptions"].as_u64()),
        (Some(2000), Some(0))
    );
    assert_eq!(slurm["lost_gpu_hours"].as_f64(), Some(0.0));
    let again = acceptance(&[&args[..], &["--compare-with", "slurm-backfill"]].concat());
    assert_eq!(out.stdout, again.stdout, "the baseline is not deterministic");

    let out = acceptance(&["--limit-jobs", "10", "--compare-with", "slurm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("slurm-backfill"), "{}", text(&out.stderr));
    let out =
        acceptance(&["--limit-jobs", "10", "--compare-with", "slurm-backfill", "--bf-window", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--bf-window: give a positive"), "{}", text(&out.stderr));
    let out = acceptance(&["--limit-jobs", "10", "--bf-interval", "5"]);
    assert_eq!(out.status.code(), Some(2), "--bf-* without --compare-with");
}

#[test]
fn one_queue_puts_every_job_in_the_named_project() {
    let run = |project: &str| {
        philly(
            "json",
            &[
                "--policy",
                "examples/philly-one-queue-policy.yaml",
                "--one-queue",
                project,
                "--limit-jobs",
                "300",
                "--no-timing",
            ],
        )
    };
    let out = run("all");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let projects = json["projects"].as_array().expect("projects");
    assert_eq!(projects.len(), 1, "{projects:?}");
    assert_eq!(projects[0]["project"], "all");
    assert_eq!(projects[0]["jobs_total"], 300);

    let out = run("6214e9");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("--one-queue: `6214e9` is not a project in"), "{err}");
}
