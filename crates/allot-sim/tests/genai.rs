//! The GenTD26 loader on the real shared files (counts from their SOURCE.md) and on small
//! texts with broken variants: every error names file, line, field and fix.

use std::path::{Path, PathBuf};

use allot_sim::BadRows;
use allot_sim::genai::{GenaiTrace, load_genai, parse_genai};

fn trace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/alibaba-genai-2026")
}

fn shared() -> GenaiTrace {
    load_genai(&trace_dir(), BadRows::Fail).expect("the shared GenTD26 folder loads")
}

#[test]
fn the_shared_trace_loads_with_the_documented_counts() {
    let t = shared();
    // SOURCE.md's table: rows per file in this folder.
    assert_eq!(t.rows.duty, 106_584);
    assert_eq!(t.rows.memory, 110_426);
    assert_eq!(t.rows.qps, 15_428);
    assert_eq!(t.rows.predict, 5_262);
    assert_eq!(t.skipped.count, 0);
    // 96 of the 143 upstream containers; one grid: t0 = 1662858720, step 57 s, 1,441 steps.
    assert_eq!(t.containers.len(), 96);
    assert_eq!((t.t0_s, t.step_s, t.slots), (1_662_858_720, 57, 1_441));
    assert!(t.containers.iter().all(|c| c.ip.starts_with(|ch: char| ch.is_ascii_digit())));
    assert!(t.containers.iter().all(|c| c.last_slot < t.slots));
    // The gateway rows name no container ("API Requests"); the rest are per container.
    assert_eq!(t.gateway_qps.len(), 1_114);
    let request_slots: usize =
        t.containers.iter().map(|c| c.requests.iter().filter(|&&r| r > 0).count()).sum();
    assert_eq!(request_slots, 15_428 - 1_114);
    let with_requests = t.containers.iter().filter(|c| c.requests.iter().any(|&r| r > 0)).count();
    assert_eq!(with_requests, 66);
    // One request = the smallest per-container rate (0.09 here); two rows are 3 units.
    assert!((t.request_unit_qps - 0.09).abs() < 1e-12);
    assert_eq!(t.requests_total(), 14_454);
    // Every duty row is in some container's lifetime, once.
    let duty_samples: usize =
        t.containers.iter().map(|c| c.duty_pct.iter().filter(|d| d.is_some()).count()).sum();
    assert_eq!(duty_samples, 106_584);
}

#[test]
fn the_shared_trace_shows_source_mds_facts() {
    let t = shared();
    let duty: Vec<f64> =
        t.containers.iter().flat_map(|c| c.duty_pct.iter().flatten()).copied().collect();
    let share =
        |f: &dyn Fn(f64) -> bool| duty.iter().filter(|&&d| f(d)).count() as f64 / duty.len() as f64;
    // Upstream (143 containers): 66.8 % exactly 0, 75.5 % below 10 %; this subset is close.
    assert!((share(&|d| d == 0.0) - 0.668).abs() < 0.01, "{}", share(&|d| d == 0.0));
    assert!((share(&|d| d < 10.0) - 0.755).abs() < 0.01, "{}", share(&|d| d < 10.0));
    // "20 % of the slots that carry requests read a duty cycle below 10 %."
    let (mut carrying, mut low) = (0usize, 0usize);
    for c in &t.containers {
        for (i, &r) in c.requests.iter().enumerate() {
            if r > 0 {
                carrying += 1;
                low += usize::from(c.duty_pct[i].is_some_and(|d| d < 10.0));
            }
        }
    }
    let low_share = low as f64 / carrying as f64;
    assert!((low_share - 0.20).abs() < 0.005, "{low_share}");
    // Requests only where a duty sample exists (the upstream collectors share a clock).
    for c in &t.containers {
        for (i, &r) in c.requests.iter().enumerate() {
            assert!(
                r == 0 || c.duty_pct[i].is_some(),
                "{} slot {}",
                c.ip,
                c.first_slot as usize + i
            );
        }
    }
}

const DUTY: &str =
    "value,timestamp_anon,container_ip\n0.0,1000.0,1a\n50.0,1057.0,1a\n0.0,1171.0,1a\n";
const MEMORY: &str = "timestamp_anon,value,container_ip\n1000.0,100.0,1a\n1057.0,100.0,2b\n";
const QPS: &str = "timestamp_anon,value,container_ip,request_type\n\
                   1057.0,0.09,1a,Generative Requests\n1057.0,0.18,2b,Generative Requests\n\
                   1000.0,0.5,,API Requests\n";
const PREDICT: &str = "timestamp_anon,value,container_ip\n1057.0,1200.0,1a\n";

fn parse(texts: [&str; 4], mode: BadRows) -> Result<GenaiTrace, allot_sim::TraceError> {
    parse_genai(Path::new("gen"), texts, mode)
}

#[test]
fn a_small_trace_is_read_slot_by_slot() {
    let t = parse([DUTY, MEMORY, QPS, PREDICT], BadRows::Fail).expect("parses");
    assert_eq!((t.t0_s, t.step_s, t.slots), (1000, 57, 4));
    assert_eq!(t.containers.len(), 2);
    let a = &t.containers[0];
    assert_eq!((a.ip.as_str(), a.first_slot, a.last_slot), ("1a", 0, 3));
    // Slot 2 has no duty row: a gap.
    assert_eq!(a.duty_pct, vec![Some(0.0), Some(50.0), None, Some(0.0)]);
    assert_eq!(a.requests, vec![0, 1, 0, 0]);
    assert_eq!(a.predict_ms[1], Some(1200.0));
    assert_eq!(a.memory_at(0), Some(100.0));
    let b = &t.containers[1];
    // Known only from memory and qps rows: alive in slot 1, no duty at all.
    assert_eq!((b.first_slot, b.last_slot), (1, 1));
    assert_eq!(b.duty_pct, vec![None]);
    assert_eq!(b.requests, vec![2]);
    assert_eq!(t.gateway_qps, vec![(0, 0.5)]);
    assert_eq!(t.requests_total(), 3);
}

/// The error of `texts`, rendered; asserts it names `file:line`, the field and a fix.
fn error_of(texts: [&str; 4], file: &str, line: usize, field: &str) -> String {
    let e = parse(texts, BadRows::Fail).expect_err("refused");
    assert!(e.file.ends_with(file), "{e}");
    assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
    assert!(!e.fix.is_empty(), "{e}");
    e.to_string()
}

#[test]
fn bad_rows_name_the_file_line_field_and_fix() {
    let off_grid =
        "value,timestamp_anon,container_ip\n0,1000,1a\n0,1057,1a\n0,1114,1a\n0,1150,1a\n";
    let e = error_of(
        [off_grid, MEMORY, QPS, PREDICT],
        "pod_gpu_duty_cycle_anon.csv",
        5,
        "timestamp_anon",
    );
    assert!(e.contains("not on the 57 s grid"), "{e}");
    let too_busy = "value,timestamp_anon,container_ip\n150,1000,1a\n";
    let e = error_of([too_busy, MEMORY, QPS, PREDICT], "pod_gpu_duty_cycle_anon.csv", 2, "value");
    assert!(e.contains("[0, 100]"), "{e}");
    let negative = "timestamp_anon,value,container_ip\n1000,-1,1a\n";
    error_of([DUTY, negative, QPS, PREDICT], "pod_gpu_memory_used_bytes_anon.csv", 2, "value");
    let not_a_number = "timestamp_anon,value,container_ip\n1000,lots,1a\n";
    error_of([DUTY, MEMORY, QPS, not_a_number], "model_predict_data_anon.csv", 2, "value");
    let fractional = "value,timestamp_anon,container_ip\n0,1000.5,1a\n";
    error_of(
        [fractional, MEMORY, QPS, PREDICT],
        "pod_gpu_duty_cycle_anon.csv",
        2,
        "timestamp_anon",
    );
    let twice = "value,timestamp_anon,container_ip\n0,1000,1a\n3,1000,1a\n";
    let e =
        error_of([twice, MEMORY, QPS, PREDICT], "pod_gpu_duty_cycle_anon.csv", 3, "container_ip");
    assert!(e.contains("a second row"), "{e}");
    let nameless = "value,timestamp_anon,container_ip\n0,1000,\n";
    error_of([nameless, MEMORY, QPS, PREDICT], "pod_gpu_duty_cycle_anon.csv", 2, "container_ip");
    let untyped = "timestamp_anon,value,container_ip,request_type\n1000,0.09,1a,\n";
    error_of([DUTY, MEMORY, untyped, PREDICT], "qps.csv", 2, "request_type");
    // A missing column is named with the header it found.
    let no_ip = "value,timestamp_anon\n0,1000\n";
    let e =
        error_of([no_ip, MEMORY, QPS, PREDICT], "pod_gpu_duty_cycle_anon.csv", 1, "container_ip");
    assert!(e.contains("header has: value,timestamp_anon"), "{e}");
    let no_type = "timestamp_anon,value,container_ip\n1000,0.09,1a\n";
    error_of([DUTY, MEMORY, no_type, PREDICT], "qps.csv", 1, "request_type");
}

#[test]
fn skip_mode_counts_bad_rows_and_keeps_the_rest() {
    let mixed = "value,timestamp_anon,container_ip\n0,1000,1a\n150,1057,1a\n0,1114,1a\n";
    let t = parse([mixed, MEMORY, QPS, PREDICT], BadRows::Skip).expect("parses");
    assert_eq!(t.skipped.count, 1);
    assert_eq!(t.skipped.first[0].line, 3);
    assert_eq!(t.containers[0].duty_pct[..3], [Some(0.0), None, Some(0.0)]);
}

#[test]
fn a_missing_file_or_an_empty_trace_is_refused() {
    let dir = std::env::temp_dir().join(format!("allot-genai-missing-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let e = load_genai(&dir, BadRows::Fail).expect_err("no files");
    assert!(e.to_string().contains("pod_gpu_duty_cycle_anon.csv: no such file"), "{e}");
    assert!(e.fix.contains("four GenTD26 files"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    let header_only = [
        "value,timestamp_anon,container_ip\n",
        "timestamp_anon,value,container_ip\n",
        "timestamp_anon,value,container_ip,request_type\n",
        "timestamp_anon,value,container_ip\n",
    ];
    let e = parse(header_only, BadRows::Fail).expect_err("empty");
    assert!(e.message.contains("no rows"), "{e}");
}
