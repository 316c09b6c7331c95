//! A policy's life through the daemon: every applied policy is a version kept with who applied
//! it and when, listed and read back by number, and an earlier one can be brought back under
//! the same checks as an apply; a candidate runs in shadow beside the active policy, its
//! decisions counted per project and never executed. The restart side is in `recovery.rs`.

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
    /// `PUT /api/v1/policy/shadow?source=SOURCE` with this text.
    Shadow { source: &'a str, text: String },
    /// `GET /api/v1/policy/shadow`.
    ShadowReport,
    /// `DELETE /api/v1/policy/shadow`.
    StopShadow,
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
        Step::Shadow { source, text } => {
            let uri = format!("/api/v1/policy/shadow?source={source}");
            d.call("PUT", &uri, Some(token), Some(&text)).await
        }
        Step::ShadowReport => d.call("GET", "/api/v1/policy/shadow", Some(token), None).await,
        Step::StopShadow => d.call("DELETE", "/api/v1/policy/shadow", Some(token), None).await,
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

/// The example policy without project `vision`: refused while vision has live work.
fn without_vision() -> String {
    let cut = POLICY.find("  - name: vision").expect("vision");
    let end = POLICY.find("  - name: speech").expect("speech");
    format!("{}{}", &POLICY[..cut], &POLICY[end..])
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
    let without_vision = without_vision();
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

/// The shadow report's row of `project`.
fn shadow_row(report: &Value, project: &str) -> Value {
    let rows = report["projects"].as_array().cloned().unwrap_or_default();
    rows.into_iter().find(|r| r["project"] == project).unwrap_or(Value::Null)
}

/// Waits (up to 5 s) until the shadow's report satisfies `done`; returns it.
async fn wait_shadow(d: &TestDaemon, done: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    for _ in 0..500 {
        last = check(d, &d.admin, Step::ShadowReport, StatusCode::OK).await;
        if done(&last) {
            return last;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the shadow's report never got there: {last}");
}

/// A candidate that guarantees vision 10 H100 instead of 8, in shadow: the 2-GPU job the
/// active policy keeps waiting (vision at its reach of 12) the candidate would start now.
/// Nothing of it is executed; the report says so per project, survives being asked again,
/// and ends with the shadow (or when the candidate is applied).
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_in_shadow_counts_what_it_would_do_differently_and_executes_nothing() {
    let d = TestDaemon::new();
    check(&d, &d.admin, Step::ShadowReport, StatusCode::NOT_FOUND).await;
    let a = submit(&d, "vision", 8).await;
    let b = submit(&d, "vision", 4).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    let generous = POLICY.replacen(
        "{model: H100, guaranteed: 8, borrow_limit: 8, lend_limit: 4}",
        "{model: H100, guaranteed: 10, borrow_limit: 8, lend_limit: 4}",
        1,
    );
    assert_ne!(generous, POLICY, "the example policy's vision quota line");
    let viewer = d.token("viewer", &[]).await;
    check(
        &d,
        &viewer,
        Step::Shadow { source: "c.yaml", text: generous.clone() },
        StatusCode::FORBIDDEN,
    )
    .await;
    let bad = "projects: [".to_string();
    check(
        &d,
        &d.admin,
        Step::Shadow { source: "bad.yaml", text: bad },
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    let started = check(
        &d,
        &d.admin,
        Step::Shadow { source: "c.yaml", text: generous.clone() },
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (started["source"].as_str(), started["by"].as_str()),
        (Some("c.yaml"), Some("admin"))
    );
    assert_eq!(started["idle_compared"], true, "the candidate's idle rules are the active ones");

    let waiting = submit(&d, "vision", 2).await;
    let report = wait_shadow(&d, |r| shadow_row(r, "vision")["sooner"] == 1).await;
    let vision = shadow_row(&report, "vision");
    assert_eq!(
        (vision["admitted_since"].as_u64(), vision["held_back"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );
    assert!(report["cycles"].as_u64().is_some_and(|c| c >= 1), "{report}");
    assert_eq!(report["failed_cycles"], 0, "{report}");
    // Only counted: the job still waits, and the backend started nothing for it.
    let (_, w) = d.call("GET", &format!("/api/v1/workloads/{waiting}"), Some(&d.admin), None).await;
    assert_eq!(w["state"], "pending", "{w}");
    assert!(d.control.run(allot_backend::RunId { workload: waiting, attempt: 1 }).is_none());
    // Viewers read it; members do not (it covers every project).
    check(&d, &viewer, Step::ShadowReport, StatusCode::OK).await;
    let member = d.token("member", &["vision"]).await;
    check(&d, &member, Step::ShadowReport, StatusCode::FORBIDDEN).await;

    // The active policy admits it once room frees up: the candidate would have been sooner.
    assert!(d.control.finish(allot_backend::RunId { workload: b, attempt: 1 }, 0));
    d.wait_state(waiting, "running").await;
    let report = wait_shadow(&d, |r| shadow_row(r, "vision")["admitted_since"] == 1).await;
    assert!(shadow_row(&report, "vision")["wait_saved_ms"].as_u64().is_some(), "{report}");
    let stopped = check(&d, &d.admin, Step::StopShadow, StatusCode::OK).await;
    assert_eq!(shadow_row(&stopped, "vision")["sooner"], 1, "{stopped}");
    check(&d, &d.admin, Step::ShadowReport, StatusCode::NOT_FOUND).await;
    check(&d, &d.admin, Step::StopShadow, StatusCode::NOT_FOUND).await;

    // Applying the candidate itself ends its shadow: it is the policy in effect now.
    check(&d, &d.admin, Step::Shadow { source: "c.yaml", text: generous.clone() }, StatusCode::OK)
        .await;
    check(&d, &d.admin, Step::Apply { source: "c.yaml", text: generous }, StatusCode::OK).await;
    check(&d, &d.admin, Step::ShadowReport, StatusCode::NOT_FOUND).await;
}

/// A candidate that cannot take the live work over (it drops a project with running work) is
/// refused in shadow too, every problem named.
#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_live_work_cannot_move_to_is_refused_by_name() {
    let d = TestDaemon::new();
    let id = submit(&d, "vision", 1).await;
    d.wait_state(id, "running").await;
    let without_vision = without_vision();
    let v = check(
        &d,
        &d.admin,
        Step::Shadow { source: "b.yaml", text: without_vision },
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("vision")), "{v}");
    check(&d, &d.admin, Step::ShadowReport, StatusCode::NOT_FOUND).await;
}

/// The active policy's own text in shadow decides as the active policy does: through waits,
/// a pre-emption for a guarantee and ends, every figure of both sides agrees.
#[tokio::test(flavor = "multi_thread")]
async fn the_active_policy_in_shadow_finds_no_difference() {
    let d = TestDaemon::new();
    d.control.support_requeue();
    check(
        &d,
        &d.admin,
        Step::Shadow { source: "same.yaml", text: POLICY.to_string() },
        StatusCode::OK,
    )
    .await;
    let a = submit(&d, "vision", 8).await;
    let b = submit(&d, "vision", 4).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    let waiting = submit(&d, "vision", 2).await;
    // speech claims its guarantee: vision's borrowed job is pre-empted (requeued).
    let s = submit(&d, "speech", 4).await;
    d.wait_state(s, "running").await;
    d.wait_state(b, "pending").await;
    assert!(d.control.finish(allot_backend::RunId { workload: a, attempt: 1 }, 0));
    d.wait_state(waiting, "running").await;
    let report = wait_shadow(&d, |r| shadow_row(r, "vision")["preempted_active"] == 1).await;
    assert!(report["cycles"].as_u64().is_some_and(|c| c >= 3), "{report}");
    for row in report["projects"].as_array().expect("rows") {
        assert_eq!(
            (&row["sooner"], &row["held_back"]),
            (&Value::from(0), &Value::from(0)),
            "{report}"
        );
        assert_eq!(row["preempted_active"], row["preempted_candidate"], "{report}");
        assert_eq!(row["reclaimed_active"], row["reclaimed_candidate"], "{report}");
    }
}

/// A scoped rollout is refused, by name and with nothing changed, when its scope, its
/// conditions or their place are wrong.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_with_a_wrong_scope_or_condition_is_refused_by_name() {
    let d = TestDaemon::new();
    let candidate = POLICY.replacen("    weight: 1.5\n", "    weight: 3\n", 1);
    for (query, status, says) in [
        (
            "rollback_if=failure_rate%3E0.5",
            StatusCode::UNPROCESSABLE_ENTITY,
            "belong to a scoped rollout",
        ),
        ("scope=project%3Dphysics", StatusCode::UNPROCESSABLE_ENTITY, "no project `physics`"),
        ("scope=team%3Dnlp", StatusCode::UNPROCESSABLE_ENTITY, "unknown scope `team`"),
        (
            "scope=project%3Dvision",
            StatusCode::UNPROCESSABLE_ENTITY,
            "changes nothing in project=vision",
        ),
        (
            "scope=project%3Dnlp&rollback_if=wait%3E2",
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown metric `wait`",
        ),
        (
            "scope=project%3Dnlp&baseline=forever",
            StatusCode::UNPROCESSABLE_ENTITY,
            "not a duration",
        ),
        ("scope=&baseline=", StatusCode::UNPROCESSABLE_ENTITY, "baseline window"),
    ] {
        let uri = format!("/api/v1/policy?source=c.yaml&{query}");
        let (got, v) = d.call("PUT", &uri, Some(&d.admin), Some(&candidate)).await;
        assert_eq!(got, status, "{query}: {v}");
        assert!(v.to_string().contains(says), "{query}: {v}");
    }
    let uri = "/api/v1/policy/shadow?source=c.yaml&scope=project%3Dnlp";
    let (got, v) = d.call("PUT", uri, Some(&d.admin), Some(&candidate)).await;
    assert_eq!(got, StatusCode::BAD_REQUEST, "{v}");
    let (versions, active) = history(&d).await;
    assert_eq!((versions.len(), active), (1, 1), "nothing was applied");
}

/// A rollout that starves its scope rolls itself back on `p95_wait` although nothing of the
/// scope is admitted: work still waiting counts with its wait so far.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_that_starves_its_scope_rolls_back_on_the_wait_of_work_still_waiting() {
    let d = TestDaemon::new();
    let starved = POLICY
        .replacen(
            "{model: A100, guaranteed: 4, borrow_limit: 2, lend_limit: 2}",
            "{model: A100, guaranteed: 0, borrow_limit: 0}",
            1,
        )
        .replacen("{model: H100, guaranteed: 2}", "{model: H100, guaranteed: 0}", 1);
    assert_ne!(starved, POLICY);
    let uri = "/api/v1/policy?source=starve-nlp.yaml&scope=project%3Dnlp\
               &rollback_if=p95_wait%3E1&min_sample=2";
    let (status, v) = d.call("PUT", uri, Some(&d.admin), Some(&starved)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], 2, "{v}");
    let waiting = [submit(&d, "nlp", 1).await, submit(&d, "nlp", 1).await];
    for id in waiting {
        let (_, w) = d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&d.admin), None).await;
        assert_eq!(w["state"], "pending", "{w}");
    }
    // Conditions are judged every 5 s: 200 tries of 100 ms are 20 s.
    let mut policy = Value::Null;
    for _ in 0..200 {
        policy = d.call("GET", "/api/v1/policy", Some(&d.admin), None).await.1;
        if policy["version"] == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(policy["version"], 3, "rolled back by itself: {policy}");
    assert_eq!(policy["text"], POLICY, "version 1's text is back");
    let ended = policy["rollout"]["ended"].as_str().unwrap_or_default();
    assert!(ended.contains("p95_wait>1") && ended.contains("2 observations"), "{ended}");
    // Under version 1 again, nlp's waiting work is admitted.
    for id in waiting {
        d.wait_state(id, "running").await;
    }
}
