//! The dashboard through the daemon's router: login and the session cookie, redirects, the
//! role rules on pages (the API's), htmx fragments, assets, and the policy form.

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

/// One request; `auth` is a full `Cookie` or `Authorization` header (name, value).
async fn send(
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
}
