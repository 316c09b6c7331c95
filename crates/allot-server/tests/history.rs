//! `GET /api/v1/history` on a running daemon: the workloads as a trace that the simulator reads
//! back and replays on the exported inventory under the exported policy.

mod common;

use std::path::Path;

use allot_api::{DurationBasis, HistoryExport};
use axum::http::StatusCode;
use common::{TestDaemon, submit_body};

#[tokio::test(flavor = "multi_thread")]
async fn the_exported_history_replays_on_the_exported_inventory() {
    let d = TestDaemon::new();
    let mut ids = Vec::new();
    for (project, gpus) in [("vision", 2), ("nlp", 1), ("vision", 1)] {
        let (status, v) = d
            .call("POST", "/api/v1/workloads", Some(&d.admin), Some(&submit_body(project, gpus)))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
    }
    for id in &ids {
        d.wait_state(*id, "running").await;
    }
    // One ends (its real run time is exported), two keep running (lower bounds).
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{}/cancel", ids[1]), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(ids[1], "cancelled").await;

    let (status, v) = d.call("GET", "/api/v1/history", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let export: HistoryExport = serde_json::from_value(v).expect("a history export");
    assert_eq!(export.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), ids);
    let basis: Vec<DurationBasis> = export.jobs.iter().map(|j| j.duration_basis).collect();
    assert_eq!(
        basis,
        [DurationBasis::ElapsedLowerBound, DurationBasis::Ran, DurationBasis::ElapsedLowerBound]
    );
    assert_eq!(
        export.jobs.iter().map(|j| (j.project.as_str(), j.gpus)).collect::<Vec<_>>(),
        [("vision", 2), ("nlp", 1), ("vision", 1)]
    );
    assert_eq!(export.jobs[0].submit_s, 0.0);
    assert!(export.jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
    assert_eq!((export.counts.ended, export.counts.running), (1, 2));

    // What `allot history export` writes, read back as `allot sim replay` reads it.
    let jobs = allot_server::whatif::trace_jobs(&export);
    let text = allot_sim::trace::allot_trace_jsonl(&jobs);
    let trace = allot_sim::trace::parse_allot_trace(
        Path::new("history.jsonl"),
        &text,
        allot_sim::BadRows::Fail,
    )
    .expect("the trace reads back");
    let nodes = allot_config::parse_cluster("cluster.yaml", &export.cluster_yaml)
        .expect("the cluster file reads back");
    let declared = allot_config::parse_cluster("cluster.yaml", common::CLUSTER).expect("example");
    assert_eq!(nodes, declared);
    let policy =
        allot_config::parse_policy(&export.policy_source, &export.policy_text).expect("policy");
    let report = allot_sim::replay::replay(
        &nodes,
        &policy,
        "exported",
        &trace.jobs,
        &allot_sim::replay::ReplayConfig::default(),
    )
    .expect("the replay runs");
    assert_eq!((report.jobs_total, report.jobs_finished), (3, 3));

    // The limit keeps the newest; a bad one names the field.
    let (_, v) = d.call("GET", "/api/v1/history?limit=1", Some(&d.admin), None).await;
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["jobs"][0]["id"], ids[2]);
    assert_eq!(v["counts"]["older_left_out"], 2);
    let (status, v) = d.call("GET", "/api/v1/history?limit=0", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["field"], "limit", "{v}");
}
