//! `allot sim idle`: the command from the repository root with its defaults (a short
//! horizon), byte-identical with `--no-timing`, text output, and bad input → exit 1 naming
//! the problem and the fix.

mod common;

use common::{allot, text};

#[test]
fn the_command_prints_every_policy_and_the_goal_byte_identically() {
    let args = ["sim", "idle", "--seed", "42", "--hours", "1", "--output", "json", "--no-timing"];
    let out = allot(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(out.stdout, allot(&args).stdout);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for label in ["amd_rm", "runai", "allot"] {
        let p = &json["policies"][label];
        for key in ["reclaimed_idle_gpu_hours_gross", "false_reclaims", "lost_gpu_hours", "goodput"]
        {
            assert!(p[key].is_number(), "{label}.{key}: {p}");
        }
        assert_eq!(p["wall_ms"], 0);
    }
    assert_eq!(json["seed"], 42);
    assert_eq!(json["cluster_gpus"], 2490);
    assert!(json["goal"]["holds"].is_boolean());
}

#[test]
fn text_is_a_table_with_one_row_per_policy() {
    let out = allot(&["sim", "idle", "--hours", "0.5"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| ["amd_rm ", "runai ", "allot "].iter().any(|p| l.starts_with(p)))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(stdout.contains("idle reclaims") && stdout.contains("goal"), "{stdout}");
}

#[test]
fn a_missing_machine_list_names_the_file_and_the_flag() {
    let out = allot(&["sim", "idle", "--machines", "no/such/cluster_machine_list"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no/such/cluster_machine_list"), "{stderr}");
    assert!(stderr.contains("--machines"), "{stderr}");
}

#[test]
fn a_bad_horizon_is_refused() {
    for hours in ["0", "-3", "NaN", "100000"] {
        let out = allot(&["sim", "idle", &format!("--hours={hours}")]);
        assert_eq!(out.status.code(), Some(1), "{hours}");
        assert!(text(&out.stderr).contains("--hours"), "{hours}");
    }
}

#[test]
fn the_example_policy_files_are_the_simulators_policies() {
    // `allot sim idle` compares the policies of examples/idle/*.yaml; the simulator's tests use
    // `allot_sim::idle::idle_policies()`. They must be the same policies.
    let built = allot_sim::idle::idle_policies();
    for (label, policy) in built {
        let path = common::repo().join(format!("examples/idle/{label}.yaml"));
        let text = std::fs::read_to_string(&path).expect("example policy");
        let parsed = allot_config::parse_policy(&label, &text).expect("parses");
        assert_eq!(
            parsed, policy,
            "{label}: examples/idle/{label}.yaml differs from idle_policies()"
        );
    }
}

const GENAI: &str = "genai:../shared/traces/alibaba-genai-2026";

#[test]
fn the_real_telemetry_mode_reports_every_policy_and_the_oracle_byte_identically() {
    let args = ["sim", "idle", "--trace", GENAI, "--output", "json", "--no-timing"];
    let out = allot(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(out.stdout, allot(&args).stdout);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for label in ["allot", "amd_rm", "runai", "oracle"] {
        let p = &json["policies"][label];
        for key in [
            "reclaimed_gpu_hours",
            "false_reclaims",
            "delayed_requests",
            "cold_starts",
            "missed_gpu_hours",
        ] {
            assert!(p[key].is_number(), "{label}.{key}: {p}");
        }
        assert_eq!(p["wall_ms"], 0, "{label}");
    }
    assert_eq!(json["trace"]["containers"], 96);
    assert_eq!(json["trace"]["requests"], 14_454);
    assert_eq!(json["cold_start_s"], 60.0);
    assert_eq!(json["policies"]["oracle"]["delayed_requests"], 0);
    assert!(json["goal"]["holds"].is_boolean());
    // Without --sweep there is no sweep.
    assert!(json["sweep"].is_null() && json["dominance"].is_null());
}

#[test]
fn the_real_telemetry_table_takes_the_cold_start_flag() {
    let out = allot(&["sim", "idle", "--trace", GENAI, "--cold-start", "2m"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows = stdout
        .lines()
        .filter(|l| ["amd_rm ", "runai ", "allot ", "oracle "].iter().any(|p| l.starts_with(p)))
        .count();
    assert_eq!(rows, 4, "{stdout}");
    assert!(stdout.contains("cold start 120 s") && stdout.contains("goal 1"), "{stdout}");
}

#[test]
fn bad_real_telemetry_options_are_refused_with_the_fix() {
    let cases: [(&[&str], &str); 5] = [
        (&["--trace", "philly:x"], "genai:DIR"),
        (&["--trace", "genai:no/such/folder"], "no such folder"),
        (&["--trace", GENAI, "--cold-start", "soon"], "--cold-start"),
        (&["--trace", GENAI, "--cold-start", "2h"], "--cold-start"),
        (&["--sweep"], "--trace genai:DIR"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["sim", "idle"];
        args.extend_from_slice(extra);
        let out = allot(&args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
    }
    // --charts needs --sweep (a usage error).
    let out = allot(&["sim", "idle", "--trace", GENAI, "--charts", "out"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn policy_validate_lists_the_quiet_timer() {
    let out = allot(&["policy", "validate", "examples/idle/allot.yaml"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let serving = stdout.lines().find(|l| l.starts_with("idle rule serving")).expect("serving");
    assert!(
        serving.contains(
            "after 60 min idle (5 min while fewer than 50.0 % of its other workloads in the \
             project were active in the last 15 min)"
        ),
        "{serving}"
    );
    let notebooks = stdout.lines().find(|l| l.starts_with("idle rule notebooks")).expect("nb");
    assert!(!notebooks.contains("while fewer than"), "{notebooks}");
}
