//! `allot telemetry parse` on the real exporter outputs in `../shared/fixtures/`, and its errors.

mod common;

use common::{allot, text};

use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures").join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path.display().to_string()
}

fn parse_json(format: &str, file: &str) -> Vec<serde_json::Value> {
    let out = allot(&["telemetry", "parse", "--format", format, file, "--output", "json"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("a JSON list")
}

#[test]
fn dcgm_fixture_as_json_has_signal_and_confidence_per_device() {
    let list = parse_json("dcgm-exporter", &fixture("dcgm-exporter-sample.txt"));
    assert_eq!(list.len(), 15, "one entry per GPU or MIG instance");
    for entry in &list {
        assert!(entry["confidence"].is_string(), "{entry}");
        assert!(entry.get("signal").is_some(), "{entry}");
        assert!(entry["reason"].as_str().is_some_and(|r| !r.is_empty()), "{entry}");
    }
    let a30 =
        list.iter().find(|e| e["hostname"] == "dcgm-exporter-sn5rp").expect("the A30 MIG instance");
    assert_eq!(a30["mig_instance"], 1);
    assert_eq!(a30["mig_profile"], "2g.12gb");
    assert_eq!(a30["signal"], "engine_active");
    assert_eq!(a30["signal_permille"], 381);
    assert_eq!(a30["confidence"], "medium");
    assert_eq!(a30["utilisation_permille"], serde_json::Value::Null);
    let sentinel = list
        .iter()
        .find(|e| e["uuid"] == "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52")
        .expect("the README sample GPU");
    assert_eq!(sentinel["confidence"], "unknown");
    assert_eq!(sentinel["activity"], "unknown");
}

#[test]
fn amd_fixture_as_json_and_text() {
    let list = parse_json("amd-exporter", &fixture("amd-device-metrics-exporter-sample.txt"));
    assert_eq!(list.len(), 3);
    assert_eq!(list[2]["engine_active_permille"], 830);
    assert_eq!(list[2]["confidence"], "medium");
    assert_eq!(list[2]["processes"][0]["pid"], 2_912_425);
    let out = allot(&[
        "telemetry",
        "parse",
        "--format",
        "amd-exporter",
        &fixture("amd-device-metrics-exporter-sample.txt"),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(stdout.contains("signal=engine_active 83.0%  confidence=medium"), "{stdout}");
}

#[test]
fn a_bad_file_names_the_file_and_line_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("allot-telemetry-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "# ok\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\"} 5\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 5\n")
        .expect("write");
    let bad = bad.display().to_string();
    let out = allot(&["telemetry", "parse", "--format", "dcgm-exporter", &bad]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with(&format!("{bad}:3: gpu:")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = allot(&["telemetry", "parse", "--format", "amd-smi", &bad]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(&format!("{bad}:1: amd-smi: invalid JSON")),
        "{}",
        text(&out.stderr)
    );
    let missing = dir.join("missing.json").display().to_string();
    let out = allot(&["telemetry", "parse", "--format", "rocm-smi", &missing]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(&format!("{missing}: cannot read")),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn watch_without_an_nvidia_driver_fails_cleanly() {
    // On a GPU machine this collects for a second instead; both are fine, a panic is not.
    let out = allot(&["telemetry", "watch", "--source", "nvml", "--seconds", "1"]);
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success() || out.status.code() == Some(6), "stderr: {err}");
}
