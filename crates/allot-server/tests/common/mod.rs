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
/// The benchmarks' cluster: 62 nodes of 8 H100 and one of 4, 500 devices.
pub const CLUSTER_500_DEVICES: &str = "nodes:\n  - name: gpu\n    count: 62\n    cpu: 192\n    memory: 2048Gi\n    gpus:\n      - {model: H100, count: 8, memory: 80Gi}\n  - name: small\n    cpu: 64\n    memory: 512Gi\n    gpus:\n      - {model: H100, count: 4, memory: 80Gi}\n";

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
        TestDaemon::with_sources(policy_text, Vec::new())
    }

    /// With telemetry read from `sources` (as `--telemetry` gives them).
    pub fn with_sources(
        policy_text: &str,
        sources: Vec<allot_telemetry::collect::Source>,
    ) -> TestDaemon {
        TestDaemon::start_with(CLUSTER, policy_text, sources, (0, Some(100), Some(50)))
    }

    /// On `cluster_text` and `policy_text`, paced as `allot serve` is (a 50 ms decide
    /// interval, telemetry rounds of 5 s, no cluster watch): for benchmarks.
    pub fn paced(cluster_text: &str, policy_text: &str) -> TestDaemon {
        TestDaemon::start_with(cluster_text, policy_text, Vec::new(), (50, Some(5_000), None))
    }

    /// `(decide interval, telemetry round, cluster watch)` in ms.
    fn start_with(
        cluster_text: &str,
        policy_text: &str,
        sources: Vec<allot_telemetry::collect::Source>,
        (decide_interval_ms, telemetry_round_ms, cluster_watch_ms): (u64, Option<u64>, Option<u64>),
    ) -> TestDaemon {
        let nodes = allot_config::parse_cluster("cluster.yaml", cluster_text).expect("cluster");
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
            decide_interval_ms,
            telemetry_round_ms,
            cluster_watch_ms,
            snapshot_every: None,
            telemetry_sources: sources,
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

/// `line` of an exporter page with label `key` set to `value`.
pub fn set_label(line: &str, key: &str, value: &str) -> String {
    let needle = format!("{key}=\"");
    let at = line.find(&needle).unwrap_or_else(|| panic!("no label {key} in {line}"));
    let from = at + needle.len();
    let to = from + line[from..].find('"').expect("a closing quote");
    format!("{}{value}{}", &line[..from], &line[to..])
}

/// Serves `page` as a dcgm-exporter's `/metrics` on loopback; its URL.
pub fn serve_page(page: String) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 2048];
            let _ = std::io::Read::read(&mut stream, &mut request);
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = std::io::Write::write_all(&mut stream, answer.as_bytes());
        }
    });
    url
}

/// A dcgm-exporter source in Kubernetes mode for `node`'s 8 GPUs: the real pod-labelled L40S
/// line of the shared fixture for each, GPUs `held` pod `namespace/pod`'s and busy (0.9), the
/// others pod `namespace/other`'s and idle.
pub fn pod_exporter(
    node: &str,
    namespace: &str,
    pod: &str,
    held: &[u32],
) -> allot_telemetry::collect::Source {
    let fixture = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/dcgm-exporter-sample.txt"),
    )
    .expect("the shared dcgm-exporter fixture");
    let line = fixture
        .lines()
        .find(|l| {
            l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains("pod=\"tensorflow-0\"")
        })
        .expect("the fixture's pod-labelled L40S line");
    let mut page = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for gpu in 0..8u32 {
        let mine = held.contains(&gpu);
        let l = set_label(line, "gpu", &gpu.to_string());
        let l = set_label(&l, "UUID", &format!("GPU-{gpu}"));
        let l = set_label(&l, "Hostname", node);
        let l = set_label(&l, "namespace", namespace);
        let l = set_label(&l, "pod", if mine { pod } else { "other" });
        let (labels, _) = l.rsplit_once(' ').expect("a sample line");
        page.push_str(&format!("{labels} {}\n", if mine { "0.9" } else { "0.0" }));
    }
    let spec = format!("dcgm-exporter={}", serve_page(page));
    allot_telemetry::collect::Source::from_spec(&spec, None).expect("a source")
}

/// Waits (up to 10 s) until `/metrics` says `project` has `gpus` active GPUs; the page.
pub async fn wait_active_gpus(d: &TestDaemon, project: &str, gpus: &str) -> String {
    let want = format!("allot_active_gpus{{project=\"{project}\"}} {gpus}");
    let mut text = String::new();
    for _ in 0..400 {
        let (_, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
        text = metrics.as_str().unwrap_or("").to_string();
        if text.contains(&want) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(text.contains(&want), "{text}");
    text
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes `count` calls, `wave` at a time at once (the daemon's loop batches what arrives
/// together), each made by `call(i)`, which checks its own answer.
pub async fn in_waves<F, Fut>(count: usize, wave: usize, call: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    for start in (0..count).step_by(wave.max(1)) {
        let tasks: Vec<_> =
            (start..count.min(start + wave.max(1))).map(|i| tokio::spawn(call(i))).collect();
        for t in tasks {
            t.await.expect("a call of the wave");
        }
    }
}

pub fn submit_body(project: &str, gpus: u32) -> String {
    serde_json::json!({"project": project, "gpus": gpus, "kind": "batch", "command": ["sleep", "30"]}).to_string()
}
