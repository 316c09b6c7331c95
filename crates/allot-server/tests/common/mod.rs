//! A daemon over an in-memory store and the fake backend, driven through its router.

#![allow(dead_code)]

use std::path::PathBuf;

use allot_backend::{FakeBackend, FakeControl};
use allot_server::{Parts, Started, start};
use allot_store::MemoryStore;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

pub const CLUSTER: &str = include_str!("../../../../examples/cluster.yaml");
pub const POLICY: &str = include_str!("../../../../examples/policy.yaml");

pub struct TestDaemon {
    pub started: Option<Started>,
    pub control: FakeControl,
    pub admin: String,
    pub dir: PathBuf,
}

impl TestDaemon {
    pub fn new() -> TestDaemon {
        TestDaemon::with_policy(POLICY)
    }

    pub fn with_policy(policy_text: &str) -> TestDaemon {
        let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("example cluster");
        let policy = allot_config::parse_policy("policy.yaml", policy_text).expect("test policy");
        let (backend, control) = FakeBackend::new(nodes.clone());
        let dir = std::env::temp_dir().join(format!(
            "allot-server-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let started = start(Parts {
            store: Box::new(MemoryStore::default()),
            token_store: Box::new(MemoryStore::default()),
            backend: Box::new(backend),
            declared: nodes,
            inventory_source: "cluster.yaml".into(),
            policy,
            policy_source: "policy.yaml".into(),
            policy_text: policy_text.into(),
            workload_dir: dir.clone(),
            decide_interval_ms: 0,
            telemetry_round_ms: Some(100),
            cluster_watch_ms: Some(50),
            snapshot_every: None,
            telemetry_sources: Vec::new(),
            policy_webhook: None,
        })
        .expect("daemon starts");
        let admin = started.admin_token.clone().expect("first start makes an admin token").token;
        TestDaemon { started: Some(started), control, admin, dir }
    }

    pub fn wrap(started: Started, control: FakeControl, admin: String, dir: PathBuf) -> TestDaemon {
        TestDaemon { started: Some(started), control, admin, dir }
    }

    /// Stops the main loop and leaves the data directory for the next start.
    pub fn stop_keeping_dir(mut self) {
        self.stop();
        self.dir = PathBuf::new();
    }

    /// Stops the main loop (as a clean shutdown would).
    pub fn stop(&mut self) {
        if let Some(s) = self.started.take() {
            s.stop().expect("main loop ends cleanly");
        }
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .expect("request");
        let router = self.started.as_ref().expect("running").router.clone();
        let response = router.oneshot(request).await.expect("router answers");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    /// Makes a token through the API with the admin token.
    pub async fn token(&self, role: &str, projects: &[&str]) -> String {
        let body = serde_json::json!({"role": role, "name": format!("{role}-{}", projects.join("-")), "projects": projects});
        let (status, v) =
            self.call("POST", "/api/v1/tokens", Some(&self.admin), Some(&body.to_string())).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["token"].as_str().expect("token").to_string()
    }

    /// Waits (up to 5 s) until workload `id` is in `state`.
    pub async fn wait_state(&self, id: u64, state: &str) -> Value {
        let mut last = Value::Null;
        for _ in 0..500 {
            let (_, v) =
                self.call("GET", &format!("/api/v1/workloads/{id}"), Some(&self.admin), None).await;
            if v["state"] == state {
                return v;
            }
            last = v;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("workload {id} never reached {state}: {last}");
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(s) = self.started.take() {
            let _ = s.stop();
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn submit_body(project: &str, gpus: u32) -> String {
    serde_json::json!({"project": project, "gpus": gpus, "kind": "batch", "command": ["sleep", "30"]}).to_string()
}
