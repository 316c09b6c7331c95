//! The HTTP API through its router: the acceptance flow, the authorisation matrix (every role
//! × every endpoint), and bad input (4xx JSON naming the field, nothing changed, no panic).

mod common;

use axum::http::StatusCode;
use common::{TestDaemon, submit_body};
use serde_json::Value;

async fn submit(d: &TestDaemon, token: &str, project: &str) -> u64 {
    let (status, v) =
        d.call("POST", "/api/v1/workloads", Some(token), Some(&submit_body(project, 1))).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

async fn count(d: &TestDaemon) -> usize {
    let (_, v) = d.call("GET", "/api/v1/workloads", Some(&d.admin), None).await;
    v["workloads"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_submission_is_admitted_started_explained_and_in_the_ledger() {
    let d = TestDaemon::new();
    let id = submit(&d, &d.admin, "vision").await;
    let running = d.wait_state(id, "running").await;
    assert_eq!(running["project"], "vision");
    assert_eq!(running["attempt"], 1);
    // The admission's usage figures are dated, not passed off as today's (issue 25).
    assert!(
        running["reason"].as_str().is_some_and(|r| r.starts_with("at admission: ")),
        "{running}"
    );
    assert!(!running["placement"].as_array().expect("placement").is_empty(), "{running}");
    let (status, why) =
        d.call("GET", &format!("/api/v1/workloads/{id}/why"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{why}");
    assert!(why["lines"].as_array().is_some_and(|l| !l.is_empty()), "{why}");
    // A member it does not have: said so, without the daemon's paths (issue 25).
    let (status, v) =
        d.call("GET", &format!("/api/v1/workloads/{id}/logs?member=5"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v["fix"].as_str().is_some_and(|f| f.contains("numbered 0 to 0")), "{v}");
    assert!(!v.to_string().contains('/'), "no path in {v}");
    // The header (`name`, `state`) is not repeated as the first line (issue 25).
    let first = why["lines"][0].as_str().unwrap_or_default();
    assert!(!first.ends_with(": running"), "{why}");
    assert!(first.starts_with("placed on"), "{why}");
    let (status, report) = d.call("GET", "/api/v1/report", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        report["rows"].as_array().expect("rows").iter().any(|r| r["scope"] == "project:vision"),
        "{report}"
    );
    // Gauges are refreshed by the main loop a few times a second.
    let mut text = String::new();
    for _ in 0..100 {
        let (status, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
        assert_eq!(status, StatusCode::OK);
        text = metrics.as_str().expect("text").to_string();
        if text.contains("allot_allocated_gpus{project=\"vision\"} 1.0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(text.contains("allot_allocated_gpus{project=\"vision\"} 1.0"), "{text}");
    assert!(text.contains("allot_workloads{state=\"running\"} 1"), "{text}");
    assert!(text.contains("allot_decision_cycle_seconds_bucket"), "{text}");
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    let (status, doc) = d.call("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["paths"]["/api/v1/workloads"]["post"].is_object(), "{doc}");
    // The document's example submission is one the default policy takes.
    let example = &doc["paths"]["/api/v1/workloads"]["post"]["requestBody"]["content"]["application/json"]
        ["example"];
    let (status, v) =
        d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(&example.to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "{example}: {v}");
    let (status, v) = d
        .call("POST", &format!("/api/v1/workloads/{}/cancel", v["id"]), Some(&d.admin), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");

    // Cancel a running workload: it is stopped through the backend, then cancelled.
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/cancel"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(id, "cancelled").await;
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/cancel"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn suspend_and_resume_start_a_new_attempt() {
    let d = TestDaemon::new();
    let id = submit(&d, &d.admin, "vision").await;
    d.wait_state(id, "running").await;
    // What each run wrote (the fake backend runs no process: the test writes its output
    // where the local backend's members write theirs).
    let write_log = |attempt: u32, text: &str| {
        let dir = allot_backend::files::WorkloadFiles::new(&d.dir, id).dir.join("logs");
        let dir = dir.join(attempt.to_string());
        std::fs::create_dir_all(&dir).expect("log dir");
        std::fs::write(dir.join("member-0.log"), text).expect("log");
    };
    let d = &d;
    let logs = |query: &str| {
        let path = format!("/api/v1/workloads/{id}/logs{query}");
        async move { d.call("GET", &path, Some(&d.admin), None).await }
    };
    write_log(1, "run 1\n");
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/suspend"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let v = d.wait_state(id, "suspended").await;
    // Said as a suspension, not as the cancel the engine sees (issue 25).
    assert_eq!(v["reason_code"], "suspended", "{v}");
    assert!(v["reason"].as_str().is_some_and(|r| r.contains("suspended by its user")), "{v}");
    // It holds no devices: no placement shown (the last run's is history).
    assert!(v["placement"].is_null(), "{v}");
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/resume"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let v = d.wait_state(id, "running").await;
    assert_eq!(v["attempt"], 2, "{v}");
    write_log(2, "run 2\n");
    // Each run keeps its output: the latest by default, an earlier one by `?attempt=`.
    assert_eq!(logs("").await, (StatusCode::OK, Value::from("run 2\n")));
    assert_eq!(logs("?attempt=1").await, (StatusCode::OK, Value::from("run 1\n")));
    let (status, v) = logs("?attempt=3").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("it has had 2 runs")), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn authorisation_matrix() {
    let d = TestDaemon::new();
    let member = d.token("member", &["vision"]).await;
    let other = d.token("member", &["nlp"]).await;
    let viewer = d.token("viewer", &[]).await;
    let roles: [(&str, Option<&str>); 5] = [
        ("none", None),
        ("admin", Some(&d.admin)),
        ("member", Some(&member)),
        ("other", Some(&other)),
        ("viewer", Some(&viewer)),
    ];
    let target = submit(&d, &d.admin, "vision").await;
    // (method, path, body, expected status per role: none, admin, member of vision, member of nlp, viewer)
    let w = format!("/api/v1/workloads/{target}");
    let sub = submit_body("vision", 1);
    let token_body = r#"{"role": "viewer", "name": "x"}"#;
    let policy = common::POLICY;
    let reads: Vec<(&str, String, Option<&str>, [u16; 5])> = vec![
        ("GET", "/api/v1/workloads".into(), None, [401, 200, 200, 200, 200]),
        ("GET", w.clone(), None, [401, 200, 200, 403, 200]),
        ("GET", format!("{w}/why"), None, [401, 200, 200, 403, 200]),
        ("GET", "/api/v1/projects".into(), None, [401, 200, 200, 200, 200]),
        ("GET", "/api/v1/nodes".into(), None, [401, 200, 200, 200, 200]),
        ("GET", "/api/v1/report".into(), None, [401, 200, 200, 200, 200]),
        // Every project's workloads: viewers and admins.
        ("GET", "/api/v1/history".into(), None, [401, 200, 403, 403, 200]),
        ("GET", "/api/v1/policy".into(), None, [401, 200, 200, 200, 200]),
        ("POST", "/api/v1/policy/validate".into(), Some(policy), [401, 200, 200, 200, 200]),
        // The policy in effect again: changes nothing, so every role sees the same state.
        ("PUT", "/api/v1/policy".into(), Some(policy), [401, 200, 403, 403, 403]),
        ("GET", "/metrics".into(), None, [401, 200, 403, 403, 200]),
        ("GET", "/api/v1/openapi.json".into(), None, [200, 200, 200, 200, 200]),
        ("POST", "/api/v1/workloads".into(), Some(&sub), [401, 201, 201, 403, 403]),
        ("POST", "/api/v1/tokens".into(), Some(token_body), [401, 201, 403, 403, 403]),
    ];
    for (method, path, body, want) in &reads {
        for ((role, token), want) in roles.iter().zip(want) {
            let (status, v) = d.call(method, path, *token, *body).await;
            assert_eq!(status.as_u16(), *want, "{role} {method} {path}: {v}");
            if status.as_u16() >= 400 {
                assert!(v["error"].is_string(), "{role} {method} {path}: error body {v}");
            }
        }
    }
    // Actions, each on a fresh workload so that one role's success does not change the next.
    for action in ["cancel", "suspend", "resume"] {
        for ((role, token), want) in roles.iter().zip([401u16, 200, 200, 403, 403]) {
            let id = submit(&d, &d.admin, "vision").await;
            if action == "resume" {
                let (s, _) = d
                    .call("POST", &format!("/api/v1/workloads/{id}/suspend"), Some(&d.admin), None)
                    .await;
                assert_eq!(s, StatusCode::OK);
                d.wait_state(id, "suspended").await;
            }
            let (status, v) =
                d.call("POST", &format!("/api/v1/workloads/{id}/{action}"), *token, None).await;
            assert_eq!(status.as_u16(), want, "{role} {action}: {v}");
        }
    }
    // A member lists only its own projects' workloads.
    let nlp = submit(&d, &d.admin, "nlp").await;
    let (_, v) = d.call("GET", "/api/v1/workloads", Some(&member), None).await;
    let ids: Vec<u64> =
        v["workloads"].as_array().expect("list").iter().filter_map(|w| w["id"].as_u64()).collect();
    assert!(!ids.contains(&nlp) && ids.contains(&target), "{ids:?}");
    // A revoked or made-up token is 401.
    let (status, _) =
        d.call("GET", "/api/v1/workloads", Some("allot_00000000_deadbeef"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_a_4xx_json_error_naming_the_field_and_changes_nothing() {
    let d = TestDaemon::new();
    let before = count(&d).await;
    let big = format!(r#"{{"project": "vision", "command": ["{}"]}}"#, "x".repeat(300 * 1024));
    // 400: the request breaks the OpenAPI schema (shape, type, a stated bound); 422: it is
    // well-formed but names what this cluster does not have or combines fields wrongly.
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{".into(), 400, None),
        ("[]".into(), 400, None),
        // A missing field is named (issue 25: it had no field).
        (r#"{"command": ["true"]}"#.into(), 400, Some("project")),
        (r#"{"project": "vision", "command": ["true"], "gpu": 1}"#.into(), 400, None),
        (r#"{"project": "vision", "command": ["true"], "gpus": -1}"#.into(), 400, Some("gpus")),
        (r#"{"project": "vision", "command": ["true"], "gpus": 1e12}"#.into(), 400, Some("gpus")),
        (r#"{"project": "vision", "command": ["true"], "gpus": 1.5}"#.into(), 422, Some("gpus")),
        (
            r#"{"project": "vision", "command": ["true"], "members": 0}"#.into(),
            400,
            Some("members"),
        ),
        (
            r#"{"project": "vision", "command": ["true"], "members": -3}"#.into(),
            400,
            Some("members"),
        ),
        (
            r#"{"project": "vision", "command": ["true"], "max_runtime_s": 99999999999}"#.into(),
            400,
            Some("max_runtime_s"),
        ),
        (r#"{"project": "nope", "command": ["true"]}"#.into(), 422, Some("project")),
        (r#"{"project": "vision", "command": []}"#.into(), 400, Some("command")),
        (
            r#"{"project": "vision", "command": ["true"], "kind": "party"}"#.into(),
            400,
            Some("kind"),
        ),
        (
            r#"{"project": "vision", "command": ["true"], "gpu_models": ["Z9"]}"#.into(),
            422,
            Some("gpu_models[0]"),
        ),
        (
            r#"{"project": "vision", "command": ["true"], "priority_class": "vip"}"#.into(),
            422,
            Some("priority_class"),
        ),
        (
            r#"{"project": "vision", "command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}"#
                .into(),
            422,
            Some("env.CUDA_VISIBLE_DEVICES"),
        ),
        (r#"{"project": "vision", "command": ["true"], "mig": "9g.1tb"}"#.into(), 422, Some("mig")),
        (r#"{"project": 7, "command": ["true"]}"#.into(), 400, Some("project")),
        (big, 413, None),
    ];
    for (body, want, field) in &cases {
        let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(body)).await;
        let shown: String = body.chars().take(80).collect();
        assert_eq!(status.as_u16(), *want, "{shown}: {v}");
        assert!(v["error"].is_string(), "{shown}: not a JSON error: {v}");
        if let Some(f) = field {
            assert_eq!(v["field"].as_str(), Some(*f), "{shown}: {v}");
        }
        // Never a placeholder for "unknown" (issue 25: malformed JSON said "field": "?").
        assert_ne!(v["field"], "?", "{shown}: {v}");
    }
    let (status, v) = d
        .call(
            "POST",
            "/api/v1/workloads",
            Some(&d.admin),
            Some(r#"{"project": "vision", "command": ["true"], "gpu": 1}"#),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().expect("error").contains("gpu"), "names the unknown field: {v}");
    for (path, want) in [
        ("/api/v1/workloads/abc", 400),
        ("/api/v1/workloads/99999", 404),
        ("/api/v1/nope", 404),
        ("/api/v1/workloads?bogus=1", 400),
    ] {
        let (status, v) = d.call("GET", path, Some(&d.admin), None).await;
        assert_eq!(status.as_u16(), want, "{path}: {v}");
        assert!(v["error"].is_string(), "{path}: {v}");
    }
    let (status, v) = d
        .call("POST", "/api/v1/tokens", Some(&d.admin), Some(r#"{"role": "root", "name": "x"}"#))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = d
        .call(
            "POST",
            "/api/v1/tokens",
            Some(&d.admin),
            Some(r#"{"role": "member", "name": "x", "projects": ["nope"]}"#),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["field"], "projects[0]");
    let (status, v) =
        d.call("POST", "/api/v1/policy/validate", Some(&d.admin), Some("projects: [")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["ok"], Value::Bool(false), "{v}");
    assert_eq!(count(&d).await, before, "nothing was submitted");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_notebook_is_reclaimed_and_one_touching_its_heartbeat_is_not() {
    // The example's research-notebooks rule, with seconds instead of minutes.
    let policy = common::POLICY
        .replacen("idle_timer: 2m", "idle_timer: 2s", 1)
        .replacen("warn_before: 1m", "warn_before: 1s", 1)
        .replacen("idle_resume_backoff: 5m", "idle_resume_backoff: 2s", 1);
    assert!(policy.contains("idle_resume_backoff: 2s"), "the edits apply to the example");
    let d = TestDaemon::with_policy(&policy);
    let notebook =
        r#"{"project": "research", "kind": "notebook", "gpus": 1, "command": ["sleep", "600"]}"#;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(notebook)).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
    }
    let (busy, idle) = (ids[0], ids[1]);
    d.wait_state(busy, "running").await;
    d.wait_state(idle, "running").await;
    let heartbeat = allot_backend::files::WorkloadFiles::new(&d.dir, busy).heartbeat();
    std::fs::create_dir_all(heartbeat.parent().expect("dir")).expect("dir");
    let mut reclaimed = None;
    for _ in 0..100 {
        std::fs::write(&heartbeat, b"").expect("touch the heartbeat");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let (_, v) =
            d.call("GET", &format!("/api/v1/workloads/{idle}"), Some(&d.admin), None).await;
        if v["state"] != "running" && v["state"] != "stopping" {
            reclaimed = Some(v);
            break;
        }
    }
    let reclaimed = reclaimed.expect("the idle notebook was reclaimed within 10 s");
    assert_eq!(reclaimed["state"], "pending", "suspended work queues again: {reclaimed}");
    let (_, busy_now) =
        d.call("GET", &format!("/api/v1/workloads/{busy}"), Some(&d.admin), None).await;
    assert_eq!(busy_now["state"], "running", "{busy_now}");
    let (_, why) =
        d.call("GET", &format!("/api/v1/workloads/{idle}/why"), Some(&d.admin), None).await;
    assert!(why.to_string().contains("idle"), "{why}");
    assert!(why["lines"][0] == "reclaimed for idleness", "not \"pre-empted\": {why}");

    // Suspended by hand while it backs off: it says so, not "may resume at …", even after
    // that time and later cycles.
    let path = format!("/api/v1/workloads/{idle}/suspend");
    let (status, v) = d.call("POST", &path, Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let suspended = d.wait_state(idle, "suspended").await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (_, later) =
        d.call("GET", &format!("/api/v1/workloads/{idle}"), Some(&d.admin), None).await;
    for v in [&suspended, &later] {
        assert_eq!(v["reason_code"], "suspended", "{v}");
        assert!(!v["reason"].to_string().contains("may resume"), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_apply_moves_live_work_or_names_what_stops_it() {
    let d = TestDaemon::new();
    let running = submit(&d, &d.admin, "translation").await;
    d.wait_state(running, "running").await;
    let edited = common::POLICY.replacen("half_life: 7d", "half_life: 1d", 1).replacen(
        "{model: H100, guaranteed: 8, borrow_limit: 8, lend_limit: 4}",
        "{model: H100, guaranteed: 6, borrow_limit: 8, lend_limit: 4}",
        1,
    );
    assert!(edited.contains("{model: H100, guaranteed: 6,"), "the edit applies to the example");
    let viewer = d.token("viewer", &[]).await;
    let member = d.token("member", &["translation"]).await;
    for token in [&viewer, &member] {
        let (status, v) = d.call("PUT", "/api/v1/policy", Some(token), Some(&edited)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }

    // Without the project the running workload belongs to: refused, nothing changes.
    let cut = common::POLICY.find("  - name: translation").expect("translation");
    let end = common::POLICY[cut..].find("\n\n").map_or(common::POLICY.len(), |e| cut + e);
    let without = format!("{}{}", &common::POLICY[..cut], &common::POLICY[end..]);
    let (status, v) = d.call("PUT", "/api/v1/policy", Some(&d.admin), Some(&without)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains(&format!("workload {running}"))), "{v}");
    assert_eq!(v["field"], "policy");
    // A file that does not parse: every diagnostic, by line.
    let (status, v) =
        d.call("PUT", "/api/v1/policy", Some(&d.admin), Some("projects: [oops")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (_, active) = d.call("GET", "/api/v1/policy", Some(&d.admin), None).await;
    assert_eq!(active["text"], common::POLICY, "a refused policy changes nothing");

    let (status, v) =
        d.call("PUT", "/api/v1/policy?source=edited.yaml", Some(&d.admin), Some(&edited)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["source"], "edited.yaml");
    // The next read shows the new quota (it read the old one for up to 5 s).
    let (_, projects) = d.call("GET", "/api/v1/projects", Some(&d.admin), None).await;
    let vision =
        projects["projects"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "vision"));
    let h100 = vision.and_then(|p| p["quota"].as_array()?.iter().find(|l| l["model"] == "H100"));
    assert_eq!(
        h100.map(|l| l["guaranteed_gpus"].clone()),
        Some(serde_json::json!(6.0)),
        "{projects}"
    );
    let (_, active) = d.call("GET", "/api/v1/policy", Some(&d.admin), None).await;
    assert_eq!(active["text"], edited.as_str());
    assert_eq!(d.wait_state(running, "running").await["attempt"], 1, "not restarted");
    // Work goes on under it.
    let next = submit(&d, &d.admin, "vision").await;
    d.wait_state(next, "running").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_workload_reports_checkpoints_by_api_or_file() {
    let d = TestDaemon::new();
    let id = submit(&d, &d.admin, "vision").await;
    d.wait_state(id, "running").await;
    let other = d.token("member", &["nlp"]).await;
    let path = format!("/api/v1/workloads/{id}/checkpoint");
    let (status, v) = d.call("POST", &path, Some(&other), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = d.call("POST", &path, Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let by_api = v["last_checkpoint_ms"].as_u64().expect("checkpoint time");

    // The file the workload was given: a newer modification time is a newer checkpoint.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let file = allot_backend::files::WorkloadFiles::new(&d.dir, id).checkpoint();
    std::fs::create_dir_all(file.parent().expect("dir")).expect("dir");
    std::fs::write(&file, b"").expect("touch");
    let mut seen = by_api;
    for _ in 0..300 {
        let (_, w) = d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&d.admin), None).await;
        seen = w["last_checkpoint_ms"].as_u64().unwrap_or(0);
        if seen > by_api {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(seen > by_api, "the checkpoint file was not seen");

    // Only running work checkpoints.
    let (status, _) =
        d.call("POST", &format!("/api/v1/workloads/{id}/cancel"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK);
    d.wait_state(id, "cancelled").await;
    let (status, v) = d.call("POST", &path, Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn node_agents_post_telemetry_that_reaches_running_workloads() {
    let d = TestDaemon::new();
    let id = submit(&d, &d.admin, "vision").await;
    d.wait_state(id, "running").await;
    // The nodes view is refreshed a few times a second.
    let mut found = None;
    for _ in 0..200 {
        let (_, nodes) = d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await;
        found = nodes["nodes"].as_array().into_iter().flatten().find_map(|n| {
            n["devices"].as_array()?.iter().find(|dev| dev["used_shares"] == 1000).map(|dev| {
                (n["name"].as_str().unwrap_or("").to_string(), dev["index"].as_u64().unwrap_or(0))
            })
        });
        if found.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (node, index) = found.expect("the workload's device");
    let at = std::time::SystemTime::UNIX_EPOCH.elapsed().expect("clock").as_millis() as u64;
    let post = |sm: u32| {
        serde_json::json!({"samples": [{"hostname": node, "gpu_index": index, "at_ms": at, "sm_active": sm}]})
            .to_string()
    };
    let member = d.token("member", &["vision"]).await;
    let (status, v) = d.call("POST", "/api/v1/telemetry", Some(&member), Some(&post(800))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = d.call("POST", "/api/v1/telemetry", Some(&d.admin), Some(&post(2000))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "samples[0].sm_active", "{v}");
    let (status, v) = d.call("POST", "/api/v1/telemetry", Some(&d.admin), Some(&post(800))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let mut text = String::new();
    for _ in 0..200 {
        let (_, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
        text = metrics.as_str().unwrap_or("").to_string();
        if text.contains("allot_active_gpus{project=\"vision\"} 1.0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(text.contains("allot_active_gpus{project=\"vision\"} 1.0"), "{text}");
    assert!(text.contains("allot_measured_gpus{project=\"vision\"} 1.0"), "{text}");
    assert!(
        text.contains(&format!("allot_device_activity{{node=\"{node}\",device=\"{index}\"")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn application_probes_report_when_a_workload_was_last_used() {
    // A status page in the shape of Jupyter's /api/status.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let status_url = format!("http://{}/api/status", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let body =
                r#"{"started": "2026-11-29T08:00:00Z", "last_activity": "2026-11-30T10:00:00Z"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let d = TestDaemon::new();
    let submit_with = |probe: serde_json::Value| {
        serde_json::json!({"project": "vision", "gpus": 1, "kind": "notebook",
            "command": ["sleep", "30"], "probe": probe})
        .to_string()
    };
    let bad = submit_with(serde_json::json!({"http": {"url": "ftp://x", "pointer": "/a"}}));
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(&bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "probe.http.url", "{v}");

    let http =
        submit_with(serde_json::json!({"http": {"url": status_url, "pointer": "/last_activity"}}));
    let exec = submit_with(serde_json::json!({"exec": {"command": ["true"]}}));
    let mut ids = Vec::new();
    for body in [http, exec] {
        let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(&body)).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
    }
    let mut seen = Vec::new();
    for id in &ids {
        let mut last = serde_json::Value::Null;
        for _ in 0..400 {
            let (_, w) =
                d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&d.admin), None).await;
            last = w["last_activity_ms"].clone();
            if !last.is_null() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        seen.push(last.as_u64().unwrap_or_else(|| panic!("no probe report for workload {id}")));
    }
    assert_eq!(seen[0], 1_796_032_800_000, "the status page's last_activity");
    let now = std::time::SystemTime::UNIX_EPOCH.elapsed().expect("clock").as_millis() as u64;
    assert!(now.abs_diff(seen[1]) < 60_000, "exec probe: in use now ({} vs {now})", seen[1]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_integer_written_with_a_zero_fraction_is_that_integer() {
    // JSON Schema (and so the OpenAPI document) counts 600.0 as the integer 600; schemathesis
    // sends such numbers, and a client in a language with one number type may too.
    let d = TestDaemon::new();
    let body =
        r#"{"project": "vision", "command": ["true"], "max_runtime_s": 600.0, "members": 1.0}"#;
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    // A real fraction is still refused, naming the field.
    let body = r#"{"project": "vision", "command": ["true"], "max_runtime_s": 600.5}"#;
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "max_runtime_s", "{v}");
}
