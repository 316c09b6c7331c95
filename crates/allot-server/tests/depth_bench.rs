//! The daemon with a deep queue (issue 20): N workloads pending on 500 devices (or on
//! `ALLOT_DEPTH_NODES` nodes of 8 GPUs), then 100 probes submitted one after the other by a
//! project within its guarantee. Prints each probe's acknowledgement time and submit-to-running
//! time (p50 / p99), and the daemon's cycles meanwhile (`decision_cycle_seconds` of
//! `/metrics`): mean, p99 as a bucket bound, how many took over 50 ms; and its snapshots.
//! Figures only, no assertions on time; behind an env var (N, default 20,000):
//!
//!   ALLOT_DEPTH_BENCH=20000 cargo test --release -p allot-server --test depth_bench -- --nocapture

#![allow(clippy::disallowed_methods, reason = "a benchmark measures real time")]

use std::time::{Duration, Instant};

use axum::http::StatusCode;

mod common;
use common::TestDaemon;

const PROJECTS: usize = 10;
const PROBES: usize = 100;

/// The cluster: the tests' 500 devices, or `nodes` nodes of 8 GPUs (`ALLOT_DEPTH_NODES`),
/// and its device count.
fn cluster(nodes: Option<usize>) -> (String, usize) {
    match nodes {
        None => (common::CLUSTER_500_DEVICES.to_string(), 500),
        Some(n) => (
            format!(
                "nodes:\n  - name: gpu\n    count: {n}\n    cpu: 192\n    memory: 2048Gi\n    gpus:\n      - {{model: H100, count: 8, memory: 80Gi}}\n"
            ),
            n * 8,
        ),
    }
}

/// Ten projects of one cohort guaranteed 9.6 % of the devices each and allowed to borrow
/// 20 % more (48 and 100 on 500), and the probes' project.
fn policy(devices: usize) -> String {
    let mut text = String::from(
        "priority_classes:\n  - {name: medium, value: 0, preemptible: true}\ndefault_priority_class: medium\nprojects:\n",
    );
    let (guaranteed, borrow) = (devices * 96 / 1000, devices / 5);
    for p in 0..PROJECTS {
        text.push_str(&format!(
            "  - name: p{p}\n    cohort: all\n    quotas:\n      - {{model: H100, guaranteed: {guaranteed}, borrow_limit: {borrow}}}\n"
        ));
    }
    // The probes' project: its guarantee is free, so a probe is admitted (reclaiming from
    // borrowers if it must) as soon as a cycle sees it.
    text.push_str(
        "  - name: probe\n    cohort: all\n    quotas:\n      - {model: H100, guaranteed: 8, borrow_limit: 0}\n",
    );
    text
}

/// One of the daemon's time histograms in a `/metrics` text: its sum, and its cumulative
/// buckets as (upper bound in seconds, count), the last one `+Inf`.
struct Histogram {
    sum: f64,
    buckets: Vec<(f64, f64)>,
}

impl Histogram {
    fn read(metrics: &str, name: &str) -> Histogram {
        let mut histogram = Histogram { sum: 0.0, buckets: Vec::new() };
        for line in metrics.lines().filter(|l| l.starts_with(&format!("allot_{name}"))) {
            let (name, value) = line.rsplit_once(' ').unwrap_or((line, ""));
            let Ok(value) = value.parse::<f64>() else { continue };
            if name.ends_with("_sum") {
                histogram.sum = value;
            } else if let Some(le) = name.split("le=\"").nth(1) {
                let bound = le.trim_end_matches("\"}");
                let bound =
                    if bound == "+Inf" { f64::INFINITY } else { bound.parse().unwrap_or(0.0) };
                histogram.buckets.push((bound, value));
            }
        }
        histogram
    }

    fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// The cycles between `earlier` and this reading: how many, their mean (s), the bucket
    /// bound (s) under which `q` of them fall, and how many took longer than `limit` (s,
    /// a bucket bound).
    fn since(&self, earlier: &Histogram, q: f64, limit: f64) -> (f64, f64, f64, f64) {
        let cycles = self.count() - earlier.count();
        let mean = if cycles > 0.0 { (self.sum - earlier.sum) / cycles } else { 0.0 };
        let delta = |i: usize| self.buckets[i].1 - earlier.buckets.get(i).map_or(0.0, |b| b.1);
        let quantile = (0..self.buckets.len())
            .find(|&i| delta(i) >= q * cycles)
            .map_or(f64::INFINITY, |i| self.buckets[i].0);
        let within =
            (0..self.buckets.len()).find(|&i| self.buckets[i].0 >= limit).map_or(cycles, delta);
        (cycles, mean, quantile, cycles - within)
    }
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
    let nodes = std::env::var("ALLOT_DEPTH_NODES").ok().and_then(|v| v.parse().ok());
    let (cluster_text, devices) = cluster(nodes);
    let daemon = std::sync::Arc::new(TestDaemon::paced(&cluster_text, &policy(devices)));
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
    // The queue: 1-GPU work, `depth` beyond the devices, in waves of 500 concurrent requests.
    let fill = Instant::now();
    common::in_waves(depth + devices, 500, |i| {
        let body = format!(
            r#"{{"project": "p{}", "gpus": 1, "kind": "batch", "name": "job-{i}", "command": ["sleep", "600"]}}"#,
            i % PROJECTS
        );
        let answer = call("/api/v1/workloads".into(), Some(body));
        async move {
            let (status, text) = answer.await;
            assert_eq!(status, StatusCode::CREATED, "{text}");
        }
    })
    .await;
    let fill_s = fill.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = call("/metrics".into(), None).await.1;
    let before = Histogram::read(&metrics, "decision_cycle_seconds");
    let snapshots_before = Histogram::read(&metrics, "snapshot_seconds");
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
    let metrics = call("/metrics".into(), None).await.1;
    let after = Histogram::read(&metrics, "decision_cycle_seconds");
    let (cycles, mean, p99, over) = after.since(&before, 0.99, 0.05);
    let (snapshots, snapshot_mean, _, _) =
        Histogram::read(&metrics, "snapshot_seconds").since(&snapshots_before, 0.5, 1.0);
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "depth {depth} pending on {devices} devices (filled in {fill_s:.1} s): {PROBES} probes, \
             ack p50 {:.1} / p99 {:.1} ms, submit to running p50 {:.1} / p99 {:.1} ms; \
             {cycles} cycles meanwhile, mean {:.1} ms, p99 <= {:.1} ms (bucket bound), \
             {over} over 50 ms; {snapshots} snapshots, mean {:.0} ms (not in the cycle)",
            percentile(&mut acks, 0.5),
            percentile(&mut acks, 0.99),
            percentile(&mut admits, 0.5),
            percentile(&mut admits, 0.99),
            mean * 1e3,
            p99 * 1e3,
            snapshot_mean * 1e3,
        );
    }
}
