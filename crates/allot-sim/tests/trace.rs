//! Trace loaders on the real Philly files (counts from their SOURCE.md) and on small allot
//! traces with broken variants: every error names file, line, field and fix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allot_core::WorkloadKind;
use allot_sim::trace::{
    TraceJob, load_allot_trace, load_philly_jobs, load_philly_machines, load_philly_vcs,
    parse_philly_jobs, philly_nodes,
};
use allot_sim::{BadRows, TraceError};

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

#[test]
fn philly_jobs_load_with_the_documented_counts() {
    let path = traces().join("philly-pollux/philly.csv");
    let philly = load_philly_jobs(&path, BadRows::Fail).expect("philly.csv loads");
    // SOURCE.md: this copy keeps 65,797 jobs submitted before 2017-11-16 07:24:03.
    assert_eq!(philly.jobs.len(), 65_797);
    assert_eq!(philly.skipped.count, 0);
    // SOURCE.md's GPU histogram (1: 76,627; 2: 1,818 …) counts the upstream 82,247 jobs; this
    // is the histogram of the 65,797 kept, counted from the file (`cut -d, -f3 | uniq -c`).
    let mut histogram: BTreeMap<u32, usize> = BTreeMap::new();
    for job in &philly.jobs {
        *histogram.entry(job.num_gpus).or_default() += 1;
    }
    let expected: BTreeMap<u32, usize> =
        [(1, 61_751), (2, 1_238), (4, 1_474), (8, 1_183), (12, 7), (16, 109), (24, 4), (32, 31)]
            .into_iter()
            .collect();
    assert_eq!(histogram, expected);
    // First job 2017-09-04 10:30:41, last 2017-11-16 07:24:01.
    assert_eq!(philly.epoch_unix_s, 1_504_521_041);
    assert_eq!(philly.jobs[0].submit_s, 0);
    assert_eq!(philly.jobs[0].line, 2);
    let last = philly.jobs.last().expect("jobs");
    assert_eq!(last.submit_s, 1_510_817_041 - 1_504_521_041);
    assert_eq!((last.num_gpus, last.vc.as_str(), last.duration_s), (1, "6214e9", 306.0));
    let vcs: std::collections::BTreeSet<&str> = philly.jobs.iter().map(|j| j.vc.as_str()).collect();
    assert_eq!(vcs.len(), 14);
    // gpu_time is GPUs × duration on every row.
    assert!(philly.jobs.iter().all(|j| j.gpu_time_s == j.duration_s * f64::from(j.num_gpus)));
}

#[test]
fn philly_machines_and_vcs_load_with_the_documented_counts() {
    let dir = traces().join("philly-machines");
    let (machines, skipped) =
        load_philly_machines(&dir.join("cluster_machine_list"), BadRows::Fail).expect("loads");
    assert_eq!(skipped.count, 0);
    assert_eq!(machines.len(), 552);
    assert_eq!(machines.iter().map(|m| m.gpus).sum::<u32>(), 2_490);
    let small = machines.iter().filter(|m| (m.gpus, m.gpu_memory_gb) == (2, 12)).count();
    let big = machines.iter().filter(|m| (m.gpus, m.gpu_memory_gb) == (8, 24)).count();
    assert_eq!((small, big), (321, 231));
    let nodes = philly_nodes(&machines);
    assert_eq!(nodes.iter().map(|n| n.devices.len()).sum::<usize>(), 2_490);
    assert_eq!(nodes[0].devices[0].model, "12GB");

    let vcs = load_philly_vcs(&dir.join("philly_vc.csv")).expect("loads");
    assert_eq!(vcs.len(), 11);
    assert_eq!(vcs.iter().map(|v| v.nodes).sum::<u32>(), 352);
    assert_eq!((vcs[0].name.as_str(), vcs[0].nodes, vcs[0].line), ("6214e9", 64, 2));
}

#[test]
fn broken_philly_rows_name_the_line_or_are_skipped_and_counted() {
    let path = Path::new("philly.csv");
    let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                2017-09-04 10:30:41,10.0,1,10.0,a\n\
                2017-09-04 10:31:41,ten,1,10.0,a\n\
                2017-09-04 10:32:41,10.0,2,20.0,a\n";
    let err = parse_philly_jobs(path, text, BadRows::Fail).expect_err("bad duration");
    assert_eq!((err.line, err.field.as_str()), (3, "duration"));
    assert!(err.to_string().starts_with("philly.csv:3: duration: `ten` is not a number"), "{err}");
    let ok = parse_philly_jobs(path, text, BadRows::Skip).expect("skips");
    assert_eq!((ok.jobs.len(), ok.skipped.count), (2, 1));
    assert_eq!(ok.jobs[1].submit_s, 120);

    let unsorted = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                    2017-09-04 10:30:41,10.0,1,10.0,a\n\
                    2017-09-03 10:30:41,10.0,1,10.0,a\n";
    let err = parse_philly_jobs(path, unsorted, BadRows::Fail).expect_err("unsorted");
    assert_eq!((err.line, err.field.as_str()), (3, "timestamp"));
    let err = parse_philly_jobs(path, "a,b\n", BadRows::Fail).expect_err("header");
    assert_eq!((err.line, err.field.as_str()), (1, "header"));
}

fn without_lines(mut jobs: Vec<TraceJob>) -> Vec<TraceJob> {
    for j in &mut jobs {
        j.line = 0;
    }
    jobs
}

#[test]
fn allot_trace_csv_and_json_lines_read_the_same_jobs() {
    let csv = load_allot_trace(&data("small.csv"), BadRows::Fail).expect("csv loads");
    let jsonl = load_allot_trace(&data("small.jsonl"), BadRows::Fail).expect("jsonl loads");
    assert_eq!(without_lines(csv.jobs.clone()), without_lines(jsonl.jobs.clone()));
    let jobs = csv.jobs;
    assert_eq!(jobs.len(), 4);
    let train = &jobs[0];
    assert_eq!((train.gpus, train.members, train.gpu_milli), (4, 2, 1000));
    assert_eq!(train.gpu_models, vec!["A100".to_string(), "H100".to_string()]);
    assert_eq!(train.kind, Some(WorkloadKind::Training));
    assert_eq!(train.checkpoint_interval_s, Some(600.0));
    assert_eq!((train.cpu_milli, train.memory_mib), (8000, 65536));
    assert_eq!(train.total_shares(), 8000);
    let nb = &jobs[1];
    assert_eq!((nb.submit_s, nb.gpu_milli, nb.total_shares()), (30.5, 500, 500));
    assert_eq!(nb.priority_class.as_deref(), Some("low"));
    assert_eq!(jobs[3].kind, None);
    assert_eq!(jobs[3].name, "batch");
    assert_eq!(jobs[3].total_shares(), 0);
    assert_eq!(jsonl.jobs[2].line, 4);
}

fn broken(name: &str) -> TraceError {
    load_allot_trace(&data(name), BadRows::Fail).expect_err(name)
}

#[test]
fn broken_allot_traces_name_file_line_field_and_fix() {
    let cases = [
        ("broken-kind.csv", 3, "kind", "`jupyter` is not a workload kind"),
        ("broken-duplicate-id.jsonl", 2, "id", "id 1 is used already on line 1"),
        (
            "broken-missing-column.csv",
            1,
            "duration_s",
            "the required column `duration_s` is missing",
        ),
        ("broken-negative-duration.csv", 4, "duration_s", "`-5` is not a number of seconds"),
        ("broken-fraction.jsonl", 1, "gpu_milli", "a fraction of a GPU (500/1000) with gpus = 2"),
        ("broken-unknown-key.jsonl", 1, "gpu", "unknown key `gpu`"),
    ];
    for (file, line, field, message) in cases {
        let err = broken(file);
        assert_eq!((err.line, err.field.as_str(), err.message.as_str()), (line, field, message));
        assert!(err.file.ends_with(file));
        assert!(!err.fix.is_empty(), "{file}: no fix");
        let shown = err.to_string();
        assert!(shown.contains(&format!("{file}:{line}: {field}: ")), "{shown}");
    }
    // Skipping keeps the good rows and counts the bad one.
    let skipped =
        load_allot_trace(&data("broken-negative-duration.csv"), BadRows::Skip).expect("skip mode");
    assert_eq!((skipped.jobs.len(), skipped.skipped.count), (2, 1));
    // A missing file is an error naming it.
    let err = broken("no-such-file.csv");
    assert_eq!(err.line, 0);
    assert!(err.to_string().contains("no-such-file.csv: cannot read"));
}

/// `allot_trace_jsonl` writes what the loader reads back as the same jobs: every field, the
/// defaults left out, odd names and fractional times kept.
#[test]
fn the_jsonl_writer_round_trips_through_the_loader() {
    let base = TraceJob {
        id: 7,
        name: "train \"a\", v2".into(),
        submit_s: 0.0,
        duration_s: 3600.5,
        project: "vision".into(),
        gpus: 4,
        members: 2,
        gpu_milli: 1000,
        gpu_models: vec!["A100".into(), "H100".into()],
        kind: Some(WorkloadKind::Training),
        priority_class: Some("high".into()),
        checkpoint_interval_s: Some(600.0),
        cpu_milli: 8000,
        memory_mib: 65_536,
        line: 1,
    };
    let shared = TraceJob {
        id: 9,
        name: "nb".into(),
        submit_s: 30.125,
        duration_s: 0.0,
        project: "speech".into(),
        gpus: 1,
        members: 1,
        gpu_milli: 250,
        gpu_models: vec![],
        kind: None,
        priority_class: None,
        checkpoint_interval_s: None,
        cpu_milli: 0,
        memory_mib: 0,
        line: 2,
    };
    let jobs = vec![base, shared];
    let text = allot_sim::trace::allot_trace_jsonl(&jobs);
    assert_eq!(text.lines().count(), 2);
    assert!(!text.lines().nth(1).unwrap_or("").contains("members"), "defaults are left out");
    let back = allot_sim::trace::parse_allot_trace(Path::new("out.jsonl"), &text, BadRows::Fail)
        .expect("the written trace loads");
    assert_eq!(back.jobs, jobs);
}
