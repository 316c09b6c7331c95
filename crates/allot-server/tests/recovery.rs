//! A restart replays the log: every acknowledged workload comes back exactly once, in the same
//! state, and the backend's live runs are re-adopted, not started again.

mod common;

use allot_backend::FakeBackend;
use allot_server::{Parts, start};
use allot_store::SqliteStore;
use axum::http::StatusCode;
use common::{CLUSTER, POLICY, TestDaemon};
use serde_json::Value;

fn parts(dir: &std::path::Path, backend: FakeBackend) -> Parts {
    let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("cluster");
    let policy = allot_config::parse_policy("policy.yaml", POLICY).expect("policy");
    Parts {
        store: Box::new(SqliteStore::open(dir).expect("store")),
        token_store: Box::new(SqliteStore::open_unlocked(dir).expect("token store")),
        backend: Box::new(backend),
        declared: nodes,
        inventory_source: "cluster.yaml".into(),
        policy,
        policy_source: "policy.yaml".into(),
        policy_text: POLICY.into(),
        data_dir: dir.to_path_buf(),
        decide_interval_ms: 0,
        telemetry_round_ms: Some(100),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_brings_every_workload_back_once_and_readopts_running_ones() {
    let dir = std::env::temp_dir().join(format!("allot-recovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("cluster");
    let (backend, control) = FakeBackend::new(nodes);
    let started = start(parts(&dir, backend)).expect("first start");
    let admin = started.admin_token.clone().expect("admin token").token;
    let mut d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let mut ids = Vec::new();
    for i in 0..40 {
        let project = ["vision", "nlp", "research"][i % 3];
        let (status, v) = d
            .call(
                "POST",
                "/api/v1/workloads",
                Some(&admin),
                Some(&common::submit_body(project, 1 + (i % 4) as u32)),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
    }
    d.wait_state(ids[0], "running").await;
    // Let the loop settle, then remember what the API says.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, before) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let launches_before = control.runs().len();
    d.stop();

    let started = start(parts(&dir, control.backend())).expect("second start");
    assert!(started.admin_token.is_none(), "tokens survive a restart");
    assert!(started.replayed > 40, "replayed {}", started.replayed);
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, after) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let key = |v: &Value| -> Vec<(u64, String, u64)> {
        v["workloads"]
            .as_array()
            .expect("list")
            .iter()
            .map(|w| {
                (
                    w["id"].as_u64().unwrap_or(0),
                    w["state"].as_str().unwrap_or("").to_string(),
                    w["attempt"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    assert_eq!(key(&before), key(&after), "same workloads, states and attempts after the restart");
    assert_eq!(control.runs().len(), launches_before, "nothing was launched twice");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restart_with_another_policy_is_refused_and_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("allot-recovery-policy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("cluster");
    let (backend, control) = FakeBackend::new(nodes);
    let started = start(parts(&dir, backend)).expect("first start");
    let admin = started.admin_token.clone().expect("admin").token;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let mut d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let (status, _) = rt.block_on(d.call(
        "POST",
        "/api/v1/workloads",
        Some(&admin),
        Some(&common::submit_body("vision", 1)),
    ));
    assert_eq!(status, StatusCode::CREATED);
    d.stop();
    let mut other = parts(&dir, control.backend());
    other.policy_text = POLICY.replacen("half_life: 7d", "half_life: 1d", 1);
    other.policy = allot_config::parse_policy("policy.yaml", &other.policy_text).expect("policy");
    let err = start(other).expect_err("another policy under a live log is refused");
    assert!(err.to_string().contains("differs from the one"), "{err}");
    // The same files start fine, and the workload is still there.
    let started = start(parts(&dir, control.backend())).expect("same files start");
    let d = TestDaemon::wrap(started, control, admin.clone(), dir.clone());
    let (_, list) = rt.block_on(d.call("GET", "/api/v1/workloads", Some(&admin), None));
    assert_eq!(list["workloads"].as_array().map(Vec::len), Some(1), "{list}");
}
