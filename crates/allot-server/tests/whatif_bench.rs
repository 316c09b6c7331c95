//! What-if time on the exported history of 10,000 workloads on 500 devices: the export
//! (`GET /api/v1/history`), and the dashboard's what-if from the upload of a candidate policy to
//! its result (two replays side by side on their own threads), and how soon a newer candidate
//! stops a what-if running. Figures only, no timing assertions; behind an env var:
//!
//!   ALLOT_WHATIF_BENCH=1 cargo test --release -p allot-server --test whatif_bench -- --nocapture

use std::time::Duration;

use allot_backend::FakeBackend;
use allot_server::{Parts, start};
use allot_store::MemoryStore;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;

const WORKLOADS: usize = 10_000;
const PROJECTS: usize = 10;
const WAVE: usize = 500;

fn cluster() -> String {
    // 62 nodes of 8 H100 and one of 4: 500 devices (as the dashboard bench).
    "nodes:\n  - name: gpu\n    count: 62\n    cpu: 192\n    memory: 2048Gi\n    gpus:\n      - {model: H100, count: 8, memory: 80Gi}\n  - name: small\n    cpu: 64\n    memory: 512Gi\n    gpus:\n      - {model: H100, count: 4, memory: 80Gi}\n".to_string()
}

/// Ten projects in one cohort, each guaranteed `guaranteed(p)` H100s.
fn policy_text(guaranteed: impl Fn(usize) -> u32) -> String {
    let mut text = String::from(
        "priority_classes:\n  - {name: medium, value: 0, preemptible: true}\ndefault_priority_class: medium\nprojects:\n",
    );
    for p in 0..PROJECTS {
        text.push_str(&format!(
            "  - name: p{p}\n    cohort: all\n    quotas:\n      - {{model: H100, guaranteed: {}, borrow_limit: 200}}\n",
            guaranteed(p)
        ));
    }
    text
}

#[allow(clippy::disallowed_methods)] // a benchmark measures real time
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whatif_on_ten_thousand_workloads_on_500_devices() {
    if std::env::var_os("ALLOT_WHATIF_BENCH").is_none() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipped: set ALLOT_WHATIF_BENCH=1 (and build with --release)");
        }
        return;
    }
    let nodes = allot_config::parse_cluster("bench-cluster.yaml", &cluster()).expect("cluster");
    assert_eq!(nodes.iter().map(|n| n.devices.len()).sum::<usize>(), 500);
    let active = policy_text(|_| 40);
    let policy = allot_config::parse_policy("bench-policy.yaml", &active).expect("policy");
    let (backend, control) = FakeBackend::new(nodes.clone());
    let dir = std::env::temp_dir().join(format!("allot-whatif-bench-{}", std::process::id()));
    let started = start(Parts {
        store: Box::new(MemoryStore::default()),
        token_store: Box::new(MemoryStore::default()),
        backend: Box::new(backend),
        declared: nodes,
        inventory_source: "bench-cluster.yaml".into(),
        policy,
        policy_source: "bench-policy.yaml".into(),
        policy_text: active,
        workload_dir: dir.clone(),
        decide_interval_ms: 50,
        telemetry_round_ms: Some(5_000),
        cluster_watch_ms: None,
        snapshot_every: None,
        telemetry_sources: Vec::new(),
        policy_webhook: None,
    })
    .expect("daemon starts");
    let token = started.admin_token.clone().expect("admin token").token;
    let router = started.router.clone();
    let send = |request: Request<Body>| {
        let router = router.clone();
        async move {
            let response = router.oneshot(request).await.expect("answer");
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let get = |path: &str, htmx: bool| {
        let mut r = Request::builder().uri(path).header("authorization", format!("Bearer {token}"));
        if htmx {
            r = r.header("hx-request", "true");
        }
        r.body(Body::empty()).expect("request")
    };
    // Waves of 500 submissions; after each, most running work ends, so the history holds
    // ended work (real run times), running work (lower bounds) and pending work (max runtimes).
    for wave in 0..WORKLOADS / WAVE {
        let mut tasks = Vec::new();
        for k in 0..WAVE {
            let i = wave * WAVE + k;
            let gpus = [1.0, 0.5, 2.0, 1.0, 4.0][i % 5];
            let body = format!(
                r#"{{"project": "p{}", "gpus": {gpus}, "kind": "{}", "name": "job-{i}", "max_runtime_s": {}, "command": ["sleep", "600"]}}"#,
                i % PROJECTS,
                ["batch", "training", "notebook"][i % 3],
                600 + (i * 7919) % 7200
            );
            let request = Request::builder()
                .method("POST")
                .uri("/api/v1/workloads")
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("request");
            tasks.push(tokio::spawn(send(request)));
        }
        for t in tasks {
            let (status, body) = t.await.expect("task");
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        // `finish` does nothing to a run that has ended already.
        for (n, run) in control.runs().iter().enumerate() {
            if n % 4 != 0 {
                control.finish(run.launch.run, 0);
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // With ALLOT_WHATIF_DRAIN=1 all work runs to its end first: a history of ended work only,
    // the one the fidelity of the what-if is measured on.
    if std::env::var_os("ALLOT_WHATIF_DRAIN").is_some() {
        for _ in 0..2_000 {
            let (_, body) = send(get("/api/v1/history", false)).await;
            let export: allot_api::HistoryExport = serde_json::from_str(&body).expect("export");
            if export.counts.ended == WORKLOADS {
                break;
            }
            for run in control.runs() {
                control.finish(run.launch.run, 0);
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    let mut lines = vec![format!(
        "what-if, {WORKLOADS} workloads on 500 devices (server time through the router):"
    )];
    let t = now();
    let (status, body) = send(get("/api/v1/history", false)).await;
    let export_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(status, StatusCode::OK);
    let export: allot_api::HistoryExport = serde_json::from_str(&body).expect("export");
    let c = &export.counts;
    lines.push(format!(
        "GET /api/v1/history: {export_ms:.1} ms, {} bytes, {} jobs ({} ended, {} running, {} pending estimated; left out {} pending, {} never ran)",
        body.len(),
        export.jobs.len(),
        c.ended,
        c.running,
        c.pending_estimated,
        c.pending_skipped,
        c.never_ran
    ));

    // Fidelity: the active policy's replay of this history against what the daemon recorded.
    let jobs = allot_server::whatif::trace_jobs(&export);
    let nodes = allot_config::parse_cluster("exported.yaml", &export.cluster_yaml).expect("nodes");
    let policy = allot_config::parse_policy("active", &export.policy_text).expect("policy");
    let config = allot_server::whatif::whatif_config(&export, &jobs);
    let report =
        allot_sim::replay::replay(&nodes, &policy, "active", &jobs, &config).expect("replay");
    lines.push("fidelity (recorded / replayed): project, jobs, wait p50 s, wait p95 s, GPU-h allocated, pre-emptions, largest gap".into());
    for f in allot_server::whatif::fidelity(&export, &report) {
        lines.push(format!(
            "  {:<4} {:>5}  {:.1} / {:.1}  {:.1} / {:.1}  {:.2} / {:.2}  {} / {}  {:.1} %",
            f.project,
            f.jobs,
            f.wait_p50_s.0,
            f.wait_p50_s.1,
            f.wait_p95_s.0,
            f.wait_p95_s.1,
            f.allocated_gpu_hours.0,
            f.allocated_gpu_hours.1,
            f.preemptions.0,
            f.preemptions.1,
            f.worst_gap() * 100.0
        ));
    }

    // How much of a pre-emption gap is the replay's own noise: the same history replayed with
    // every submission moved by less than one decision interval (a deterministic jitter per
    // seed), which no record can pin down: the daemon's own cycles fall where its wall clock
    // puts them.
    let interval_s = config.decide_every_s.max(0.001);
    let mut jittered = Vec::new();
    for seed in 1..=5u64 {
        let moved: Vec<_> = jobs
            .iter()
            .map(|j| {
                let mut j = j.clone();
                let hash = (j.id ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
                let unit = hash as f64 / (1u64 << 53) as f64; // [0, 1)
                j.submit_s = (j.submit_s + (unit - 0.5) * interval_s).max(0.0);
                j
            })
            .collect();
        let r = allot_sim::replay::replay(&nodes, &policy, "active", &moved, &config)
            .expect("jittered replay");
        let all = &allot_server::whatif::fidelity(&export, &r)[0];
        jittered.push(format!(
            "{} (wait p95 {:.1} s, {:.2} GPU-h)",
            r.preemptions, all.wait_p95_s.1, all.allocated_gpu_hours.1
        ));
    }
    lines.push(format!(
        "replayed pre-emptions with submissions moved by under one decision interval ({:.0} ms), 5 jitters: {}",
        interval_s * 1000.0,
        jittered.join(", ")
    ));

    // Which modelled delay the waits answer to: the replay again without the measured
    // start-up delay, with cycles at every event, and with cycles on the interval's grid
    // instead of the daemon's rule.
    for (what, changed) in [
        (
            "no start-up delay",
            allot_sim::replay::ReplayConfig {
                launch_delay_s: 0.0,
                restart_delay_s: 0.0,
                ..config.clone()
            },
        ),
        (
            "cycles at every event",
            allot_sim::replay::ReplayConfig { decide_every_s: 0.0, ..config.clone() },
        ),
        (
            "cycles on the interval's grid (sim replay --decide-every)",
            allot_sim::replay::ReplayConfig { decide_on_grid: true, ..config.clone() },
        ),
    ] {
        let r =
            allot_sim::replay::replay(&nodes, &policy, "active", &jobs, &changed).expect("replay");
        let all = &allot_server::whatif::fidelity(&export, &r)[0];
        lines.push(format!(
            "replayed with {what}: wait p50 {:.1} s, p95 {:.1} s, {:.2} GPU-h, {} pre-emptions",
            all.wait_p50_s.1, all.wait_p95_s.1, all.allocated_gpu_hours.1, r.preemptions
        ));
    }
    lines.push(format!(
        "the replay's settings: start-up delay {:.3} s, decision interval {:.3} s",
        config.launch_delay_s, config.decide_every_s
    ));

    // The candidate moves guarantees: p0 gets 200 GPUs, the others 20.
    let candidate = policy_text(|p| if p == 0 { 200 } else { 20 });
    let boundary = "benchBoundary";
    let upload = |candidate: &str| {
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"policy_file\"; filename=\"candidate.yaml\"\r\n\r\n{candidate}\r\n--{boundary}--\r\n"
        );
        Request::builder()
            .method("POST")
            .uri("/policy/upload")
            .header("authorization", format!("Bearer {token}"))
            // Dashboard posts must come from the dashboard's own origin.
            .header(header::HOST, "allot.test")
            .header(header::ORIGIN, "http://allot.test")
            .header(header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
            .body(Body::from(body))
            .expect("request")
    };
    let poll_of = |page: &str| {
        page.split("hx-get=\"/policy/whatif/")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("the page polls its what-if: {page}"))
    };
    let t = now();
    let (status, page) = send(upload(&candidate)).await;
    let upload_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(status, StatusCode::OK);
    let poll = format!("/policy/whatif/{}", poll_of(&page));
    let mut result = String::new();
    let mut polls = 0;
    let mut poll_ms_max = 0.0_f64;
    for _ in 0..6000 {
        let p = now();
        let (_, body) = send(get(&poll, true)).await;
        poll_ms_max = poll_ms_max.max(p.elapsed().as_secs_f64() * 1000.0);
        polls += 1;
        if !body.contains("hx-get") {
            result = body;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total_s = t.elapsed().as_secs_f64();
    assert!(result.contains("What-if: the active policy"), "{result}");
    let replays = result
        .split("Replays took ")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap_or("?")
        .to_string();
    let wall = allot_server::whatif::WHATIF_JOBS_MAX;
    lines.push(format!(
        "upload + validation + history read: {upload_ms:.1} ms; upload to result: {total_s:.1} s \
         (both replays: {replays}; {polls} polls, slowest {poll_ms_max:.1} ms); result page {} bytes; job cap {wall}",
        result.len()
    ));
    // The figures, to show the replays differ.
    for figure in ["queueing delay p95", "pre-emptions", "GPU-hours allocated"] {
        if let Some(row) = result.split(&format!("<td>{figure}</td>")).nth(1) {
            let cells: Vec<&str> = row
                .split("<td class=\"num\">")
                .skip(1)
                .take(3)
                .map(|c| c.split('<').next().unwrap_or(""))
                .collect();
            lines.push(format!("  {figure}: {}", cells.join(" | ")));
        }
    }
    // A newer candidate stops the what-if running: from its upload until both replays of the
    // replaced one have ended (its thread `allot-whatif-N` is gone).
    let (_, page) = send(upload(&candidate)).await;
    let replaced = poll_of(&page);
    // Halfway through a what-if as long as the first one took.
    let into = Duration::from_secs_f64(total_s / 2.0);
    tokio::time::sleep(into).await;
    let thread_of = |id: &str| {
        let name = format!("allot-whatif-{id}");
        std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten().any(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim() == name)
        })
    };
    assert!(thread_of(&replaced), "what-if #{replaced} still runs {into:?} into it");
    let t = now();
    let (_, page) = send(upload(&policy_text(|p| if p == 1 { 200 } else { 20 }))).await;
    let newer = poll_of(&page);
    while thread_of(&replaced) {
        assert!(t.elapsed() < Duration::from_secs(120), "what-if #{replaced} never stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stop_ms = t.elapsed().as_secs_f64() * 1000.0;
    let (_, shown) = send(get(&format!("/policy/whatif/{replaced}"), true)).await;
    assert!(shown.contains(&format!("what-if #{newer} replaced it")), "{shown}");
    lines.push(format!(
        "a newer candidate, {:.1} s into what-if #{replaced}: its replays ended {stop_ms:.0} ms after the upload",
        into.as_secs_f64()
    ));
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{}", lines.join("\n"));
    }
    let _ = started.stop();
    let _ = std::fs::remove_dir_all(dir);
}
