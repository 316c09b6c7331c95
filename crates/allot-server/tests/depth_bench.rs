//! The daemon with a deep queue (issue 20): N workloads pending on 500 devices, then 100
//! probes submitted one after the other by a project within its guarantee. Prints each probe's
//! acknowledgement time and submit-to-running time (p50 / p99), and the daemon's mean cycle
//! time meanwhile (`decision_cycle_seconds` of `/metrics`). Figures only, no assertions on
//! time; behind an env var (N, default 20,000):
//!
//!   ALLOT_DEPTH_BENCH=20000 cargo test --release -p allot-server --test depth_bench -- --nocapture

#![allow(clippy::disallowed_methods, reason = "a benchmark measures real time")]

use std::time::{Duration, Instant};

use axum::http::StatusCode;

mod common;
use common::TestDaemon;

const PROJECTS: usize = 10;
const PROBES: usize = 100;

fn policy() -> String {
    let mut text = String::from(
        "priority_classes:\n  - {name: medium, value: 0, preemptible: true}\ndefault_priority_class: medium\nprojects:\n",
    );
    for p in 0..PROJECTS {
        text.push_str(&format!(
            "  - name: p{p}\n    cohort: all\n    quotas:\n      - {{model: H100, guaranteed: 48, borrow_limit: 100}}\n"
        ));
    }
    // The probes' project: its guarantee is free, so a probe is admitted (reclaiming from
    // borrowers if it must) as soon as a cycle sees it.
    text.push_str(
        "  - name: probe\n    cohort: all\n    quotas:\n      - {model: H100, guaranteed: 8, borrow_limit: 0}\n",
    );
    text
}

/// The sum and count of the daemon's cycle-time histogram in a `/metrics` text.
fn cycle_seconds(metrics: &str) -> (f64, f64) {
    let value = |suffix: &str| {
        metrics
            .lines()
            .find(|l| {
                l.contains("decision_cycle_seconds")
                    && l.split(' ').next().is_some_and(|n| n.ends_with(suffix))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("_sum"), value("_count"))
}

fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_through_a_deep_queue() {
    let Some(depth) = std::env::var("ALLOT_DEPTH_BENCH").ok().map(|v| v.parse().unwrap_or(20_000))
    else {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipped: set ALLOT_DEPTH_BENCH=N (and build with --release)");
        }
        return;
    };
    let depth: usize = depth;
    let daemon = std::sync::Arc::new(TestDaemon::paced(common::CLUSTER_500_DEVICES, &policy()));
    let call = |path: String, body: Option<String>| {
        let daemon = daemon.clone();
        async move {
            let method = if body.is_some() { "POST" } else { "GET" };
            let admin = Some(daemon.admin.as_str());
            let (status, value) = daemon.call(method, &path, admin, body.as_deref()).await;
            let text = match value {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
            (status, text)
        }
    };
    // The queue: 1-GPU work beyond the 500 devices, in waves of 500 concurrent requests.
    let fill = Instant::now();
    for wave in 0..depth.div_ceil(500) {
        let mut tasks = Vec::new();
        for k in 0..500.min(depth - wave * 500) {
            let i = wave * 500 + k;
            let body = format!(
                r#"{{"project": "p{}", "gpus": 1, "kind": "batch", "name": "job-{i}", "command": ["sleep", "600"]}}"#,
                i % PROJECTS
            );
            tasks.push(tokio::spawn(call("/api/v1/workloads".into(), Some(body))));
        }
        for t in tasks {
            let (status, text) = t.await.expect("task");
            assert_eq!(status, StatusCode::CREATED, "{text}");
        }
    }
    let fill_s = fill.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sum0, count0) = cycle_seconds(&call("/metrics".into(), None).await.1);
    let (mut acks, mut admits) = (Vec::new(), Vec::new());
    for i in 0..PROBES {
        let body = format!(
            r#"{{"project": "probe", "gpus": 1, "kind": "batch", "name": "probe-{i}", "command": ["sleep", "1"]}}"#
        );
        let sent = Instant::now();
        let (status, text) = call("/api/v1/workloads".into(), Some(body)).await;
        acks.push(sent.elapsed().as_secs_f64() * 1e3);
        assert_eq!(status, StatusCode::CREATED, "{text}");
        let id = serde_json::from_str::<serde_json::Value>(&text).expect("json")["id"]
            .as_u64()
            .expect("an id");
        loop {
            let (_, w) = call(format!("/api/v1/workloads/{id}"), None).await;
            let state = serde_json::from_str::<serde_json::Value>(&w).expect("json")["state"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if matches!(state.as_str(), "starting" | "running" | "succeeded") {
                break;
            }
            assert!(sent.elapsed() < Duration::from_secs(60), "probe {id} not admitted: {w}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        admits.push(sent.elapsed().as_secs_f64() * 1e3);
        // It ends, so that the probe project stays within its guarantee.
        let _ = call(format!("/api/v1/workloads/{id}/cancel"), Some(String::new())).await;
    }
    let (sum1, count1) = cycle_seconds(&call("/metrics".into(), None).await.1);
    let cycles = count1 - count0;
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "depth {depth} pending on 500 devices (filled in {fill_s:.1} s): {PROBES} probes, \
             ack p50 {:.1} / p99 {:.1} ms, submit to running p50 {:.1} / p99 {:.1} ms; \
             {cycles} cycles meanwhile, mean {:.1} ms",
            percentile(&mut acks, 0.5),
            percentile(&mut acks, 0.99),
            percentile(&mut admits, 0.5),
            percentile(&mut admits, 0.99),
            if cycles > 0.0 { (sum1 - sum0) / cycles * 1e3 } else { 0.0 },
        );
    }
}
