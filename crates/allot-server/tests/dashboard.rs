//! The dashboard through the daemon's router: login and the session cookie, redirects, the
//! role rules on pages (the API's), htmx fragments, assets, the policy form, the workload
//! actions (roles, cross-origin refusal), estimated starts, fair-share standing, the ledger per
//! period, and timelines that survive a restart.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::{TestDaemon, submit_body};
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

/// The host the tests' requests name (`Host`, and `Origin` on POSTs from "this site").
const HOST: &str = "allot.test:8080";
const ORIGIN: &str = "http://allot.test:8080";

/// One request; `auth` is a full `Cookie` or `Authorization` header (name, value). POSTs come
/// from this site (`Origin` names the `Host`), as a browser sends them from the dashboard.
async fn send(
    d: &TestDaemon,
    method: &str,
    path: &str,
    auth: Option<(&str, String)>,
    extra: &[(&str, &str)],
    form: Option<String>,
) -> Answer {
    let mut headers = vec![("host", HOST)];
    if method == "POST" {
        headers.push(("origin", ORIGIN));
    }
    headers.extend_from_slice(extra);
    send_exactly(d, method, path, auth, &headers, form).await
}

/// One request with only the headers given.
async fn send_exactly(
    d: &TestDaemon,
    method: &str,
    path: &str,
    auth: Option<(&str, String)>,
    extra: &[(&str, &str)],
    form: Option<String>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(path);
    if let Some((name, value)) = auth {
        request = request.header(name, value);
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    if form.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let request = request.body(form.map_or_else(Body::empty, Body::from)).expect("request");
    let router = d.started.as_ref().expect("running").router.clone();
    answer(router, request).await
}

async fn answer(router: axum::Router, request: Request<Body>) -> Answer {
    let response = router.oneshot(request).await.expect("router answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

fn cookie(token: &str) -> Option<(&'static str, String)> {
    Some(("cookie", format!("allot_session={token}")))
}

fn bearer(token: &str) -> Option<(&'static str, String)> {
    Some(("authorization", format!("Bearer {token}")))
}

async fn submit(d: &TestDaemon, project: &str, gpus: u32) -> u64 {
    let (status, v) = d
        .call("POST", "/api/v1/workloads", Some(&d.admin), Some(&submit_body(project, gpus)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

fn header_text(a: &Answer, name: header::HeaderName) -> String {
    a.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn login_sets_a_strict_http_only_cookie_that_opens_every_page_and_logout_clears_it() {
    let d = TestDaemon::new();
    for path in ["/", "/fleet", "/queue", "/projects", "/idle", "/policy", "/workload/1"] {
        let a = send(&d, "GET", path, None, &[], None).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(header_text(&a, header::LOCATION), "/login", "{path}");
    }
    // An htmx poll after the session ended is told to go to the login page, not given it.
    let a = send(&d, "GET", "/fleet", None, &[("hx-request", "true")], None).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.headers.get("hx-redirect").and_then(|v| v.to_str().ok()), Some("/login"));
    let a = send(&d, "GET", "/login", None, &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("name=\"token\"") && a.body.contains("type=\"password\""));

    let wrong = send(&d, "POST", "/login", None, &[], Some("token=allot_00_11".into())).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("unknown or revoked token"), "{}", wrong.body);
    assert!(wrong.headers.get(header::SET_COOKIE).is_none());

    let ok = send(&d, "POST", "/login", None, &[], Some(format!("token={}", d.admin))).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    let set = header_text(&ok, header::SET_COOKIE);
    assert!(set.starts_with(&format!("allot_session={};", d.admin)), "{set}");
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"));
    assert!(!set.contains("Secure"), "no TLS here: {set}");

    let id = submit(&d, "vision", 1).await;
    for path in
        ["/", "/fleet", "/queue", "/projects", "/idle", "/policy", &format!("/workload/{id}")]
    {
        let a = send(&d, "GET", path, cookie(&d.admin), &[], None).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.body);
        assert!(a.body.starts_with("<!DOCTYPE html>"), "{path}");
        assert_eq!(header_text(&a, header::CACHE_CONTROL), "no-store", "{path}");
        // The bearer header works as well (scripts).
        let b = send(&d, "GET", path, bearer(&d.admin), &[], None).await;
        assert_eq!(b.status, StatusCode::OK, "{path}");
    }
    let fleet = send(&d, "GET", "/fleet", cookie(&d.admin), &[], None).await;
    assert!(fleet.body.contains("<svg"), "the fleet chart is inline SVG");
    assert!(fleet.body.contains("no telemetry"), "missing telemetry is said, not shown as 0");

    // Served over TLS, the cookie is Secure.
    let tls = allot_server::secure_cookies(d.started.as_ref().expect("running").router.clone());
    let request = Request::builder()
        .method("POST")
        .uri("/login")
        .header(header::HOST, HOST)
        .header(header::ORIGIN, ORIGIN)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={}", d.admin)))
        .expect("request");
    let secure = answer(tls, request).await;
    assert!(header_text(&secure, header::SET_COOKIE).ends_with("; Secure"));

    let out = send(&d, "POST", "/logout", cookie(&d.admin), &[], None).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(header_text(&out, header::SET_COOKIE).contains("Max-Age=0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_follow_the_api_role_rules() {
    let d = TestDaemon::new();
    let member = d.token("member", &["vision"]).await;
    let viewer = d.token("viewer", &[]).await;
    // Pending for good: more GPUs than the project may ever hold.
    let mine = submit(&d, "vision", 64).await;
    let theirs = submit(&d, "nlp", 64).await;
    let mine_why = format!("/workload/{mine}");
    let theirs_why = format!("/workload/{theirs}");

    let queue = send(&d, "GET", "/queue", cookie(&member), &[], None).await;
    assert_eq!(queue.status, StatusCode::OK);
    assert!(queue.body.contains(&format!("href=\"{mine_why}\"")), "{}", queue.body);
    assert!(
        !queue.body.contains(&format!("href=\"{theirs_why}\"")),
        "a member sees only its projects"
    );
    let a = send(&d, "GET", &theirs_why, cookie(&member), &[], None).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let a = send(&d, "GET", &mine_why, cookie(&member), &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("exceeds_max_quota") || a.body.contains("reason code"), "{}", a.body);
    let fleet = send(&d, "GET", "/fleet", cookie(&member), &[], None).await;
    assert!(!fleet.body.contains("href=\"/metrics\""), "members get no /metrics link");
    let projects = send(&d, "GET", "/projects", cookie(&member), &[], None).await;
    assert!(projects.body.contains("project:vision") || projects.body.contains(">vision<"));
    assert!(!projects.body.contains(">nlp<"), "a member sees only its projects");

    for token in [&viewer, &d.admin] {
        let queue = send(&d, "GET", "/queue", cookie(token), &[], None).await;
        assert!(queue.body.contains(&format!("href=\"{theirs_why}\"")));
        let fleet = send(&d, "GET", "/fleet", cookie(token), &[], None).await;
        assert!(fleet.body.contains("href=\"/metrics\""));
    }
    // Filter by project.
    let nlp = send(&d, "GET", "/queue?project=nlp", cookie(&viewer), &[], None).await;
    assert!(nlp.body.contains(&format!("href=\"{theirs_why}\"")));
    assert!(!nlp.body.contains(&format!("href=\"{mine_why}\"")));

    // The cookie reads the API (the links behind the numbers), but changes nothing there.
    let api = send(&d, "GET", "/api/v1/workloads", cookie(&member), &[], None).await;
    assert_eq!(api.status, StatusCode::OK);
    assert!(
        api.body.contains(&format!("\"id\":{mine}"))
            && !api.body.contains(&format!("\"id\":{theirs}"))
    );
    let metrics = send(&d, "GET", "/metrics", cookie(&member), &[], None).await;
    assert_eq!(metrics.status, StatusCode::FORBIDDEN, "the API's own rule for members");
    let post =
        send(&d, "POST", &format!("/api/v1/workloads/{mine}/cancel"), cookie(&d.admin), &[], None)
            .await;
    assert_eq!(post.status, StatusCode::UNAUTHORIZED, "state changes need the bearer header");
}

#[tokio::test(flavor = "multi_thread")]
async fn fragments_assets_and_the_policy_form() {
    let d = TestDaemon::new();
    let viewer = d.token("viewer", &[]).await;
    let a = send(&d, "GET", "/queue", cookie(&viewer), &[("hx-request", "true")], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.starts_with("<div id=\"live\""), "{}", a.body);
    assert!(!a.body.contains("<html"));

    let page = send(&d, "GET", "/fleet", cookie(&viewer), &[], None).await;
    let src = page
        .body
        .split("src=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page loads htmx")
        .to_string();
    let js = send(&d, "GET", &src, None, &[], None).await;
    assert_eq!(js.status, StatusCode::OK);
    assert!(header_text(&js, header::CONTENT_TYPE).starts_with("text/javascript"));
    assert!(header_text(&js, header::CACHE_CONTROL).contains("immutable"));
    assert!(js.body.starts_with("var htmx="));
    let css = page
        .body
        .split("href=\"/assets/")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page links its style sheet")
        .to_string();
    let css = send(&d, "GET", &format!("/assets/{css}"), None, &[], None).await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(header_text(&css, header::CONTENT_TYPE).starts_with("text/css"));
    assert_eq!(
        send(&d, "GET", "/assets/other.js", None, &[], None).await.status,
        StatusCode::NOT_FOUND
    );

    // A viewer may check a candidate policy (it changes nothing); problems are listed by field.
    let bad = "policy=projects%3A%0A  - name%3A x%0A    gpu%3A 3%0A";
    let a = send(&d, "POST", "/policy", cookie(&viewer), &[], Some(bad.into())).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("✗") && a.body.contains("problem"), "{}", a.body);
    let good = format!("policy={}", encode(common::POLICY));
    let a = send(&d, "POST", "/policy", cookie(&viewer), &[], Some(good)).await;
    assert!(a.body.contains("✓"), "{}", a.body);
    let a = send(&d, "POST", "/policy", None, &[], Some("policy=x".into())).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("%{b:02X}") }
        })
        .collect()
}

async fn state_of(d: &TestDaemon, id: u64) -> serde_json::Value {
    d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&d.admin), None).await.1["state"].clone()
}

fn v100_body(name: &str, max_runtime_s: Option<u64>) -> String {
    let mut body = serde_json::json!({
        "name": name, "project": "research", "gpus": 4, "gpu_models": ["V100M32"],
        "kind": "batch", "command": ["sleep", "30"],
    });
    if let Some(s) = max_runtime_s {
        body["max_runtime_s"] = s.into();
    }
    body.to_string()
}

async fn submit_body_as(d: &TestDaemon, body: &str) -> u64 {
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

/// Fetches `path` until its body contains `text` (the dashboard derives estimates and
/// standings every few seconds), at most 15 s.
async fn page_with(d: &TestDaemon, path: &str, token: &str, text: &str) -> String {
    let mut body = String::new();
    for _ in 0..150 {
        body = send(d, "GET", path, cookie(token), &[], None).await.body;
        if body.contains(text) {
            return body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{path} never showed {text:?}:\n{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn workload_actions_follow_the_role_rules_and_refuse_cross_origin_posts() {
    let d = TestDaemon::new();
    let member = d.token("member", &["vision"]).await;
    let outsider = d.token("member", &["nlp"]).await;
    let viewer = d.token("viewer", &[]).await;
    // Pending for good: more GPUs than the project may ever hold.
    let id = submit(&d, "vision", 64).await;
    let page = format!("/workload/{id}");
    let cancel = format!("/workload/{id}/cancel");

    // Who gets buttons: members of the project and admins; not viewers, not other members.
    let a = send(&d, "GET", &page, cookie(&member), &[], None).await;
    assert!(a.body.contains(&format!("action=\"{cancel}\"")), "{}", a.body);
    assert!(a.body.contains(&format!("action=\"/workload/{id}/suspend\"")));
    let q = send(&d, "GET", "/queue", cookie(&member), &[], None).await;
    assert!(q.body.contains(&format!("action=\"{cancel}\"")), "cancel on queue rows");
    let a = send(&d, "GET", &page, cookie(&viewer), &[], None).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(!a.body.contains("<form class=\"inline action\""), "no buttons for viewers");
    let q = send(&d, "GET", "/queue", cookie(&viewer), &[], None).await;
    assert!(q.body.contains(&page) && !q.body.contains(&cancel), "no cancel for viewers");

    // Posted anyway: refused by role, nothing changes.
    let a = send(&d, "POST", &cancel, cookie(&viewer), &[], Some(String::new())).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    let a = send(&d, "POST", &cancel, cookie(&outsider), &[], Some(String::new())).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert!(a.body.contains("may not act on project"), "{}", a.body);
    // Cross-origin: another site's form, or no Origin/Referer at all, is refused before
    // anything is asked of the loop, even with a valid cookie.
    let evil = [("host", HOST), ("origin", "https://evil.example")];
    let a = send_exactly(&d, "POST", &cancel, cookie(&member), &evil, Some(String::new())).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert!(a.body.contains("cross-origin request refused"), "{}", a.body);
    let bare = [("host", HOST)];
    let a = send_exactly(&d, "POST", &cancel, cookie(&member), &bare, Some(String::new())).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let lookalike = [("host", HOST), ("referer", "http://allot.test:8080.evil.example/queue")];
    let a =
        send_exactly(&d, "POST", &cancel, cookie(&member), &lookalike, Some(String::new())).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "the whole authority must match");
    assert_eq!(state_of(&d, id).await, "pending", "refused posts changed nothing");
    // A script with the API's bearer header needs no Origin: another site's form cannot set
    // that header, and the cookie is not read when it is there.
    for (action, state) in [("suspend", "suspended"), ("resume", "pending")] {
        let path = format!("/workload/{id}/{action}");
        let a = send_exactly(&d, "POST", &path, bearer(&member), &bare, None).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
        assert_eq!(state_of(&d, id).await, state);
    }

    // Allowed: suspend, resume (a Referer from this site is enough), then cancel from the queue.
    let a = send(&d, "POST", &format!("/workload/{id}/suspend"), cookie(&member), &[], None).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(header_text(&a, header::LOCATION), page);
    assert_eq!(state_of(&d, id).await, "suspended");
    let a = send(&d, "GET", &page, cookie(&member), &[], None).await;
    assert!(a.body.contains(&format!("action=\"/workload/{id}/resume\"")), "{}", a.body);
    assert!(!a.body.contains(&format!("action=\"/workload/{id}/suspend\"")));
    let from_page = [("host", HOST), ("referer", "http://allot.test:8080/workload/1")];
    let a = send_exactly(
        &d,
        "POST",
        &format!("/workload/{id}/resume"),
        cookie(&member),
        &from_page,
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(state_of(&d, id).await, "pending");
    // Resuming what is not suspended: the API's 409, as a page.
    let a = send(&d, "POST", &format!("/workload/{id}/resume"), cookie(&member), &[], None).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    let back = format!("back={}", encode("/queue?project=vision&offset=0"));
    let a = send(&d, "POST", &cancel, cookie(&member), &[], Some(back)).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(header_text(&a, header::LOCATION), "/queue?project=vision&offset=0");
    assert_eq!(state_of(&d, id).await, "cancelled");
    // Another site as the place to go back to is not followed.
    let other = submit(&d, "vision", 64).await;
    let a = send(
        &d,
        "POST",
        &format!("/workload/{other}/cancel"),
        bearer(&d.admin),
        &[],
        Some(format!("back={}", encode("//evil.example/"))),
    )
    .await;
    assert_eq!(header_text(&a, header::LOCATION), format!("/workload/{other}"));
    // The timeline shows what was done.
    let a = send(&d, "GET", &page, cookie(&member), &[], None).await;
    for step in ["submitted", "suspended", "resumed", "cancelled"] {
        assert!(a.body.contains(&format!("<td>{step}</td>")), "{step}: {}", a.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn estimated_starts_show_on_the_queue_and_workload_pages() {
    let d = TestDaemon::new();
    let first = submit_body_as(&d, &v100_body("first", Some(3600))).await;
    d.wait_state(first, "running").await;
    let second = submit_body_as(&d, &v100_body("second", None)).await;
    let third = submit_body_as(&d, &v100_body("third", None)).await;
    // `second` starts when `first` reaches its max runtime (an hour after it started);
    // `third` waits for `second`, which has none.
    let queue = page_with(&d, "/queue?project=research", &d.admin, "reaches its max runtime").await;
    let row = |id: u64| {
        queue
            .split("<tr>")
            .find(|r| r.contains(&format!("href=\"/workload/{id}\"")))
            .unwrap_or_default()
            .to_string()
    };
    let second_row = row(second);
    assert!(
        second_row.contains(&format!("≈ in 59 min (after #{first} first reaches its max runtime)"))
            || second_row.contains(&format!("≈ in 1 h 0 min (after #{first} first reaches")),
        "{second_row}"
    );
    assert!(
        row(third).contains(&format!(
            "unknown: it waits for running work that has no max runtime (#{second} second)"
        )),
        "{}",
        row(third)
    );
    let page = send(&d, "GET", &format!("/workload/{second}"), cookie(&d.admin), &[], None).await;
    assert!(page.body.contains("Estimated start: <span class=\"eta\">≈ in"), "{}", page.body);
    let page = send(&d, "GET", &format!("/workload/{first}"), cookie(&d.admin), &[], None).await;
    assert!(!page.body.contains("Estimated start"), "running work has no estimate");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_projects_page_shows_fair_share_standing_and_the_ledger_per_period() {
    let d = TestDaemon::new();
    let member = d.token("member", &["research"]).await;
    let running = submit_body_as(&d, &v100_body("held", None)).await;
    d.wait_state(running, "running").await;
    submit_body_as(&d, &v100_body("waiting", None)).await;
    // Derived every 5 s: wait for the table (not the explanation) to say it.
    // research has no cohort: its next workload cannot borrow, it waits for its own quota.
    let waits = "<td>waits for its own quota (no cohort to borrow from)</td>";
    let body = page_with(&d, "/projects", &d.admin, waits).await;
    assert!(body.contains("Fair-share standing") && body.contains("Who goes next"), "{body}");
    let standing_row = body
        .split("<tr>")
        .find(|r| r.contains("href=\"/queue?project=research\">research</a>") && r.contains(waits))
        .unwrap_or_else(|| {
            let table = body.split("id=\"standing\"").nth(1).unwrap_or_default();
            panic!(
                "no standing row for research: {}",
                table.split("</table>").next().unwrap_or_default()
            )
        });
    // research holds 4 V100s of its guarantee: the next is beyond it, and it is the only one
    // with pending work, so it is first in the next cycle.
    assert!(
        standing_row.contains("<td class=\"num\">\n<a href=\"/api/v1/projects\">4</a>")
            || standing_row.contains(">4</a>"),
        "{standing_row}"
    );
    assert!(standing_row.contains(">1</a>"), "rank 1: {standing_row}");

    let today = &allot_server_utc_today();
    assert!(body.contains("Ledger per period"), "{body}");
    let periods = body.split("id=\"periods\"").nth(1).unwrap_or_default();
    assert!(periods.contains("project:research") && periods.contains(today.as_str()), "{periods}");
    assert!(periods.contains("no telemetry"), "active hours need telemetry: {periods}");
    assert!(periods.contains("as of 20"), "the periods say when they were computed: {periods}");
    // Limits: research has no cohort (nothing to borrow or lend); nlp's cohort sets none.
    let quota = body.split("<h2>Quota</h2>").nth(1).unwrap_or_default();
    let quota = quota.split("</table>").next().unwrap_or_default();
    assert!(quota.contains("– (no cohort)") && quota.contains("unlimited"), "{quota}");
    assert!(!quota.contains(">none<"), "{quota}");
    let one = send(&d, "GET", "/projects?project=research", cookie(&member), &[], None).await;
    let periods = one.body.split("id=\"periods\"").nth(1).unwrap_or_default();
    assert!(periods.contains("project:research") && !periods.contains("<td>cluster</td>"));
    // A member sees only its projects' standing.
    assert!(!one.body.contains("href=\"/queue?project=nlp\">nlp</a>"), "{}", one.body);
}

/// Today's date (UTC) as the page writes it: the ledger's period of a workload started now.
fn allot_server_utc_today() -> String {
    #[allow(clippy::disallowed_methods)] // the test compares with the daemon's wall clock
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (now / 86_400) as i64;
    let (year, month, day) = allot_core::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workload_timeline_survives_a_restart() {
    // Replay only, and from a snapshot (the steps are in the snapshot's records).
    for snapshot_every in [None, Some(5)] {
        let dir = std::env::temp_dir().join(format!(
            "allot-dashboard-timeline-{}-{}",
            std::process::id(),
            snapshot_every.unwrap_or(0)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let nodes = allot_config::parse_cluster("cluster.yaml", common::CLUSTER).expect("cluster");
        let (backend, control) = allot_backend::FakeBackend::new(nodes);
        let started =
            allot_server::start(restart_parts(&dir, backend, snapshot_every)).expect("start");
        let admin = started.admin_token.clone().expect("admin token").token;
        let mut d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
        let id = submit(&d, "vision", 1).await;
        d.wait_state(id, "running").await;
        d.call("POST", &format!("/api/v1/workloads/{id}/suspend"), Some(&admin), None).await;
        d.wait_state(id, "suspended").await;
        d.call("POST", &format!("/api/v1/workloads/{id}/resume"), Some(&admin), None).await;
        d.wait_state(id, "running").await;
        // More entries, so that a snapshot is taken after the steps.
        for _ in 0..6 {
            submit(&d, "vision", 64).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let steps = |body: &str| -> Vec<String> {
            let timeline = body.split("<h2>Timeline</h2>").nth(1).unwrap_or_default();
            let timeline = timeline.split("</table>").next().unwrap_or_default();
            timeline
                .split("<tr>")
                .skip(2)
                .filter_map(|r| r.split("<td>").nth(2)?.split("</td>").next().map(str::to_string))
                .collect()
        };
        let before = steps(
            &send(&d, "GET", &format!("/workload/{id}"), bearer(&admin), &[], None).await.body,
        );
        assert_eq!(
            before,
            [
                "submitted",
                "admitted",
                "running",
                "stopping",
                "suspended",
                "resumed",
                "admitted",
                "running"
            ],
            "snapshot_every {snapshot_every:?}"
        );
        d.stop();
        if snapshot_every.is_some() {
            let store = allot_store::SqliteStore::open_unlocked(&dir).expect("store");
            use allot_store::Store;
            assert!(store.latest_snapshot().expect("read").is_some(), "a snapshot was taken");
        }
        let started = allot_server::start(restart_parts(&dir, control.backend(), snapshot_every))
            .expect("restart");
        let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
        let after = steps(
            &send(&d, "GET", &format!("/workload/{id}"), bearer(&admin), &[], None).await.body,
        );
        assert_eq!(
            before, after,
            "the same steps after the restart (snapshot_every {snapshot_every:?})"
        );
        drop(d);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn restart_parts(
    dir: &std::path::Path,
    backend: allot_backend::FakeBackend,
    snapshot_every: Option<u64>,
) -> allot_server::Parts {
    let nodes = allot_config::parse_cluster("cluster.yaml", common::CLUSTER).expect("cluster");
    let policy = allot_config::parse_policy("policy.yaml", common::POLICY).expect("policy");
    allot_server::Parts {
        store: Box::new(allot_store::SqliteStore::open(dir).expect("store")),
        token_store: Box::new(allot_store::SqliteStore::open_unlocked(dir).expect("token store")),
        backend: Box::new(backend),
        declared: nodes,
        inventory_source: "cluster.yaml".into(),
        policy,
        policy_source: "policy.yaml".into(),
        policy_text: common::POLICY.into(),
        workload_dir: dir.to_path_buf(),
        decide_interval_ms: 0,
        telemetry_round_ms: Some(100),
        cluster_watch_ms: None,
        snapshot_every,
        telemetry_sources: Vec::new(),
        policy_webhook: None,
    }
}

/// A `multipart/form-data` body with one file field, as a browser sends it.
fn upload_body(field: &str, file_name: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "----allotTestBoundary7MA4YWxkTrZu0gW";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; \
         filename=\"{file_name}\"\r\nContent-Type: application/yaml\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn upload(d: &TestDaemon, token: &str, file_name: &str, content: &[u8]) -> Answer {
    let (content_type, body) = upload_body("policy_file", file_name, content);
    let request = Request::builder()
        .method("POST")
        .uri("/policy/upload")
        .header("host", HOST)
        .header("origin", ORIGIN)
        .header("cookie", format!("allot_session={token}"))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .expect("request");
    answer(d.started.as_ref().expect("running").router.clone(), request).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_policy_file_upload_is_checked_and_a_valid_one_gets_a_what_if() {
    let d = TestDaemon::new();
    let viewer = d.token("viewer", &[]).await;
    let member = d.token("member", &["vision"]).await;
    for (project, gpus) in [("vision", 2), ("speech", 1), ("nlp", 1)] {
        let id = submit(&d, project, gpus).await;
        d.wait_state(id, "running").await;
    }

    // A bad file: the problem names the file, the line and the field.
    let bad = b"projects:\n  - name: x\n    gpu: 3\n";
    let a = upload(&d, &viewer, "team.yaml", bad).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("✗ team.yaml: "), "{}", a.body);
    assert!(a.body.contains("team.yaml:3:") && a.body.contains("projects[0]"), "{}", a.body);
    assert!(!a.body.contains("id=\"whatif\""), "no what-if for an invalid candidate");

    // Too large: refused with the limit named, in the form or before it is read whole.
    let big = vec![b'#'; 1024 * 1024 + 1];
    let a = upload(&d, &viewer, "big.yaml", &big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(a.body.contains("big.yaml") && a.body.contains("1 MiB"), "{}", a.body);
    let huge = vec![b'#'; 3 * 1024 * 1024];
    let a = upload(&d, &viewer, "huge.yaml", &huge).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(a.body.contains("1 MiB"), "{}", a.body);
    let a = upload(&d, &viewer, "latin1.yaml", b"projects: \xff\n").await;
    assert!(a.body.contains("latin1.yaml: the file is not UTF-8 text"), "{}", a.body);

    // A good file: checked, then replayed against the history next to the active policy.
    let candidate =
        common::POLICY.replace("guaranteed: 8, borrow_limit: 8", "guaranteed: 4, borrow_limit: 8");
    assert_ne!(candidate, common::POLICY);
    let a = upload(&d, &viewer, "smaller-vision.yaml", candidate.as_bytes()).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("✓ smaller-vision.yaml: ok"), "{}", a.body);
    let poll = a
        .body
        .split("hx-get=\"/policy/whatif/")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .map(|id| format!("/policy/whatif/{id}"))
        .unwrap_or_else(|| panic!("the page polls its what-if: {}", a.body));
    let mut result = String::new();
    for _ in 0..600 {
        let a = send(&d, "GET", &poll, cookie(&viewer), &[("hx-request", "true")], None).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(a.body.starts_with("<div id=\"whatif\""), "{}", a.body);
        if !a.body.contains("hx-get") {
            result = a.body;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(result.contains("What-if: the active policy vs the candidate"), "{result}");
    assert!(result.contains("Replayed 3 jobs") && result.contains("seed 42"), "{result}");
    assert!(result.contains("queueing delay p95") && result.contains("pre-emptions"), "{result}");
    assert_eq!(result.matches("<svg").count(), 3, "three charts");

    // A member may check the file but not replay every project's history.
    let a = upload(&d, &member, "smaller-vision.yaml", candidate.as_bytes()).await;
    assert!(a.body.contains("✓") && a.body.contains("needs a viewer or admin token"), "{}", a.body);
    let a = send(&d, "GET", &poll, cookie(&member), &[("hx-request", "true")], None).await;
    assert!(!a.body.contains("What-if: the active"), "{}", a.body);

    // Applied, the candidate's version keeps the what-if that was shown for its text.
    let run: u64 = poll.rsplit('/').next().and_then(|n| n.parse().ok()).expect("run number");
    let (status, v) = d
        .call("PUT", "/api/v1/policy?source=smaller-vision.yaml", Some(&d.admin), Some(&candidate))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, versions) = d.call("GET", "/api/v1/policy/versions", Some(&d.admin), None).await;
    let applied = &versions["versions"][1];
    assert_eq!(applied["whatif"]["run"], run, "{versions}");
    assert_eq!(applied["whatif"]["active_version"], 1, "{versions}");
    assert_eq!(applied["whatif"]["jobs"], 3, "{versions}");
    assert!(applied["whatif"]["candidate"]["wait_p95_ms"].is_u64(), "{versions}");
    assert!(versions["versions"][0].get("whatif").is_none(), "the first start was shown none");
    let a = send(&d, "GET", "/policy", cookie(&viewer), &[], None).await;
    assert!(a.body.contains(&format!("#{run} vs version 1, 3 workloads")), "{}", a.body);
    // A rollback to version 1 was shown no what-if of that text against version 2.
    let (status, v) = d.call("POST", "/api/v1/policy/rollback", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, versions) = d.call("GET", "/api/v1/policy/versions", Some(&d.admin), None).await;
    assert!(versions["versions"][2].get("whatif").is_none(), "{versions}");
}
