//! Versioned policies through the daemon: every applied policy is kept with who applied it and
//! when, listed and read back by number, and an earlier one can be brought back as a new
//! version under the same checks as an apply. The restart side is in `recovery.rs`.

mod common;

use axum::http::StatusCode;
use common::{POLICY, TestDaemon, submit_body};
use serde_json::Value;

/// One step of a policy scenario and what the daemon must answer.
enum Step<'a> {
    /// `PUT /api/v1/policy?source=SOURCE` with this text.
    Apply { source: &'a str, text: String },
    /// `POST /api/v1/policy/rollback[?version=N]`.
    Rollback(Option<u32>),
}

/// Runs `step` with `token` and checks the status; returns the answer.
async fn check(d: &TestDaemon, token: &str, step: Step<'_>, status: StatusCode) -> Value {
    let (got, v) = match step {
        Step::Apply { source, text } => {
            let uri = format!("/api/v1/policy?source={source}");
            d.call("PUT", &uri, Some(token), Some(&text)).await
        }
        Step::Rollback(version) => {
            let uri = match version {
                Some(n) => format!("/api/v1/policy/rollback?version={n}"),
                None => "/api/v1/policy/rollback".to_string(),
            };
            d.call("POST", &uri, Some(token), None).await
        }
    };
    assert_eq!(got, status, "{v}");
    v
}

async fn submit(d: &TestDaemon, project: &str, gpus: u32) -> u64 {
    let body = submit_body(project, gpus);
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

/// The history as (version, source, by, rollback_of), and the active version.
async fn history(d: &TestDaemon) -> (Vec<(u64, String, Option<String>, Option<u64>)>, u64) {
    let (status, v) = d.call("GET", "/api/v1/policy/versions", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let versions = v["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|x| {
            (
                x["version"].as_u64().expect("version"),
                x["source"].as_str().expect("source").to_string(),
                x["by"].as_str().map(str::to_string),
                x["rollback_of"].as_u64(),
            )
        })
        .collect();
    (versions, v["active"].as_u64().expect("active"))
}

async fn text_of(d: &TestDaemon, version: u32) -> String {
    let uri = format!("/api/v1/policy/versions/{version}");
    let (status, v) = d.call("GET", &uri, Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["text"].as_str().expect("text").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn applied_policies_are_versions_with_who_and_when_and_one_can_be_brought_back() {
    let d = TestDaemon::new();
    let (versions, active) = history(&d).await;
    assert_eq!(versions, [(1, "policy.yaml".to_string(), None, None)]);
    assert_eq!(active, 1);

    let one_day = POLICY.replacen("half_life: 7d", "half_life: 1d", 1);
    let v = check(
        &d,
        &d.admin,
        Step::Apply { source: "a.yaml", text: one_day.clone() },
        StatusCode::OK,
    )
    .await;
    assert_eq!((v["version"].as_u64(), v["source"].as_str()), (Some(2), Some("a.yaml")), "{v}");
    // The same text again is no new version.
    check(&d, &d.admin, Step::Apply { source: "a.yaml", text: one_day.clone() }, StatusCode::OK)
        .await;
    // A policy live work cannot move to is refused and leaves no version.
    let workload = submit(&d, "vision", 2).await;
    d.wait_state(workload, "running").await;
    let (cut, end) = (
        POLICY.find("  - name: vision").expect("vision"),
        POLICY.find("  - name: speech").expect("speech"),
    );
    let without_vision = format!("{}{}", &POLICY[..cut], &POLICY[end..]);
    let v = check(
        &d,
        &d.admin,
        Step::Apply { source: "b.yaml", text: without_vision },
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("vision")), "{v}");
    // Viewers read the history but change nothing.
    let viewer = d.token("viewer", &[]).await;
    check(&d, &viewer, Step::Rollback(None), StatusCode::FORBIDDEN).await;
    let (versions, active) = history(&d).await;
    assert_eq!(versions.len(), 2, "{versions:?}");
    assert_eq!(versions[1], (2, "a.yaml".to_string(), Some("admin".to_string()), None));
    assert_eq!(active, 2);
    let (_, v) = d.call("GET", "/api/v1/policy/versions", Some(&viewer), None).await;
    assert!(v["versions"][1]["at_ms"].as_u64().is_some_and(|t| t > 1_700_000_000_000), "{v}");
    assert_eq!(text_of(&d, 2).await, one_day);

    // Rollback without a number: the version before the active one, as a new version.
    let v = check(&d, &d.admin, Step::Rollback(None), StatusCode::OK).await;
    assert_eq!(v["version"].as_u64(), Some(3), "{v}");
    assert_eq!(v["text"].as_str(), Some(POLICY));
    let (versions, active) = history(&d).await;
    assert_eq!(
        versions[2],
        (3, "rollback to version 1 (policy.yaml)".to_string(), Some("admin".to_string()), Some(1))
    );
    assert_eq!(active, 3);
    let (_, policy) = d.call("GET", "/api/v1/policy", Some(&d.admin), None).await;
    assert_eq!((policy["text"].as_str(), policy["version"].as_u64()), (Some(POLICY), Some(3)));
    // Back to 2 by number; then 2 again is the text in effect: refused, as is a version that
    // does not exist.
    check(&d, &d.admin, Step::Rollback(Some(2)), StatusCode::OK).await;
    let v = check(&d, &d.admin, Step::Rollback(Some(2)), StatusCode::CONFLICT).await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("in effect")), "{v}");
    let v = check(&d, &d.admin, Step::Rollback(Some(9)), StatusCode::NOT_FOUND).await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("1 to 4")), "{v}");
    let (status, _) = d.call("GET", "/api/v1/policy/versions/9", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(text_of(&d, 4).await, one_day);
    // The running workload ran through all of it.
    let (_, w) =
        d.call("GET", &format!("/api/v1/workloads/{workload}"), Some(&d.admin), None).await;
    assert_eq!(w["state"], "running", "{w}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_live_work_cannot_move_to_is_refused_by_name_and_changes_nothing() {
    let d = TestDaemon::new();
    // Version 1 has no project `physics`; version 2 adds it and physics work runs.
    let physics = "  - name: physics\n    quotas:\n      - {model: H100, guaranteed: 2}\n";
    let with_physics = POLICY.replacen("projects:\n", &format!("projects:\n{physics}"), 1);
    check(&d, &d.admin, Step::Apply { source: "physics.yaml", text: with_physics }, StatusCode::OK)
        .await;
    let id = submit(&d, "physics", 1).await;
    d.wait_state(id, "running").await;
    let v = check(&d, &d.admin, Step::Rollback(None), StatusCode::UNPROCESSABLE_ENTITY).await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("physics")), "{v}");
    let (versions, active) = history(&d).await;
    assert_eq!((versions.len(), active), (2, 2), "{versions:?}");
    // Version 1 in effect: nothing to roll back to.
    let d = TestDaemon::new();
    let v = check(&d, &d.admin, Step::Rollback(None), StatusCode::CONFLICT).await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("version 1 is in effect")), "{v}");
}
