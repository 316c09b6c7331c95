//! Policy: the active policy (as `GET /api/v1/policy`), a form that checks a candidate policy
//! against this daemon's inventory (as `POST /api/v1/policy/validate`; nothing changes) — pasted,
//! or uploaded as a file — and, for a valid candidate, a what-if: the daemon's history (as
//! `GET /api/v1/history`) replayed under the active policy and under the candidate on this
//! daemon's nodes, on a thread of its own (`crate::whatif`), polled by htmx until it is done.

use allot_api::{ApiError, PolicyValidation, PolicyView, Role};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use maud::{Markup, html};
use serde::Deserialize;

use super::{Frame, Tab, html_response, is_fragment, layout, read_view, who};
use crate::ask::Ask;
use crate::auth::Principal;
use crate::state::AppState;
use crate::whatif::{
    Compared, RunStartError, RunState, WHATIF_JOBS_MAX, WHATIF_WAIT_MS, WhatIfResult, run_whatif,
    trace_jobs,
};

/// Largest policy file the upload form takes.
pub(crate) const UPLOAD_BYTES_MAX: usize = 1024 * 1024;
/// The form around the file: its boundaries and part headers.
const UPLOAD_FORM_SLACK: usize = 16 * 1024;
/// The upload form's file field.
const FILE_FIELD: &str = "policy_file";
/// How often the page asks whether a what-if is done.
const WHATIF_POLL_SECONDS: u32 = 2;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PolicyData {
    pub active: PolicyView,
    /// Every policy the daemon ran under, oldest first (the last is `active`).
    pub versions: Vec<allot_api::PolicyVersion>,
    /// The policy in shadow and what it would have done differently (viewers and admins).
    pub shadow: Option<allot_api::ShadowReport>,
    /// The candidate's text and what validation said, after a POST.
    pub candidate: Option<(String, PolicyValidation)>,
    /// The what-if for a valid candidate.
    pub whatif: Option<WhatIf>,
}

/// Where the page's what-if stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WhatIf {
    /// Not run, and why.
    NotRun(String),
    Running {
        id: u64,
        jobs: usize,
        elapsed_ms: u64,
    },
    Done(Box<WhatIfResult>),
    Failed(String),
}

#[derive(Debug, Deserialize)]
pub(crate) struct CandidateForm {
    policy: String,
}

/// The policy page's routes (the what-if runs they share are `AppState::whatifs`).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/policy", get(page).post(validate))
        .route(
            "/policy/upload",
            post(upload).layer(DefaultBodyLimit::max(UPLOAD_BYTES_MAX + UPLOAD_FORM_SLACK)),
        )
        .route("/policy/whatif/{id}", get(whatif_poll))
}

/// The active policy, and every version of the history.
fn active(state: &AppState) -> Result<(PolicyView, Vec<allot_api::PolicyVersion>), Box<Response>> {
    let view = read_view(state)?;
    let active = PolicyView {
        source: view.policy_source.clone(),
        text: view.policy_text.clone(),
        version: view.policy_version(),
        rollout: view.rollout.clone(),
    };
    Ok((active, view.policy_versions.clone()))
}

fn page_response(
    state: &AppState,
    status: StatusCode,
    principal: &Principal,
    data: &PolicyData,
) -> Response {
    html_response(
        status,
        &layout("Policy", &Frame::of(Tab::Policy, principal, state), &render(data)),
    )
}

pub(crate) async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (active, versions) = match active(&state) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let shadow = shadow_of(&state, &principal).await;
    page_response(
        &state,
        StatusCode::OK,
        &principal,
        &PolicyData { active, versions, shadow, candidate: None, whatif: None },
    )
}

/// The policy in shadow, for a viewer or an admin (`None`: none runs, or a member asks).
async fn shadow_of(state: &AppState, principal: &Principal) -> Option<allot_api::ShadowReport> {
    if principal.role == Role::Member {
        return None;
    }
    state.handle.shadow(Ask::ShadowReport).await.ok()
}

pub(crate) async fn validate(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<CandidateForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let Ok(Form(form)) = form else {
        return super::error_page(400, "send the form's policy field (the YAML text)");
    };
    check(&state, &principal, "candidate policy".into(), form.policy).await
}

/// `POST /policy/upload`: the file field `policy_file` of a multipart form, checked as a pasted
/// policy is, its problems named by the file's name.
pub(crate) async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let refused = |status: StatusCode, name: &str, error: String, fix: &str| {
        let (active, versions) = match active(&state) {
            Ok(a) => a,
            Err(r) => return *r,
        };
        let validation = PolicyValidation {
            ok: false,
            summary: format!("{name}: not checked"),
            problems: vec![ApiError { error, field: None, fix: Some(fix.to_string()) }],
        };
        let data = PolicyData {
            active,
            versions,
            shadow: None,
            candidate: Some((String::new(), validation)),
            whatif: None,
        };
        page_response(&state, status, &principal, &data)
    };
    let too_large = || {
        format!(
            "the upload is larger than the {} MiB a policy file may have",
            UPLOAD_BYTES_MAX >> 20
        )
    };
    let fix_size = "choose the policy YAML file itself (a policy is a few KiB), or paste it";
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refused(StatusCode::PAYLOAD_TOO_LARGE, "upload", too_large(), fix_size);
        }
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "upload",
                format!("cannot read the upload: {e}"),
                "send the form again",
            );
        }
    };
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let (name, bytes) = match multipart_file(content_type, &body, FILE_FIELD) {
        Ok(found) => found,
        Err(message) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "upload",
                message,
                "choose a file in the upload form and send it (multipart/form-data)",
            );
        }
    };
    if bytes.len() > UPLOAD_BYTES_MAX {
        return refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            &name,
            format!("{name}: {} bytes: {}", bytes.len(), too_large()),
            fix_size,
        );
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return refused(
            StatusCode::BAD_REQUEST,
            &name,
            format!("{name}: the file is not UTF-8 text"),
            "upload the policy YAML file (UTF-8 text)",
        );
    };
    check(&state, &principal, name, text.to_string()).await
}

/// Validates the candidate and, if it is valid, starts its what-if; answers the page.
async fn check(state: &AppState, principal: &Principal, name: String, text: String) -> Response {
    let (active, versions) = match active(state) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let nodes = state.node_specs();
    let checked = text.clone();
    let checked_name = name.clone();
    let result = tokio::task::spawn_blocking(move || {
        crate::policy_check::validate_policy_text(&checked_name, &checked, &nodes)
    })
    .await;
    let Ok(validation) = result else {
        return super::error_page(500, "the policy check stopped unexpectedly");
    };
    let whatif = if validation.ok {
        Some(start_whatif(state, principal, &active, name, text.clone()).await)
    } else {
        None
    };
    let shadow = shadow_of(state, principal).await;
    let data = PolicyData { active, versions, shadow, candidate: Some((text, validation)), whatif };
    page_response(state, StatusCode::OK, principal, &data)
}

async fn start_whatif(
    state: &AppState,
    principal: &Principal,
    active: &PolicyView,
    name: String,
    text: String,
) -> WhatIf {
    if principal.role == Role::Member {
        return WhatIf::NotRun(
            "the what-if replays every project's history: it needs a viewer or admin token".into(),
        );
    }
    let export = match state.handle.history(Ask::History { limit: WHATIF_JOBS_MAX }).await {
        Ok(e) => e,
        Err(e) => {
            return WhatIf::Failed(format!("the history could not be read: {}", e.body.error));
        }
    };
    let jobs = trace_jobs(&export);
    if jobs.is_empty() {
        return WhatIf::NotRun(
            "there is no history to replay yet: no workload has run or has a known run time".into(),
        );
    }
    let count = jobs.len();
    let nodes = state.node_specs();
    let (active_source, active_text) = (active.source.clone(), active.text.clone());
    let compared = Compared {
        active_version: active.version,
        active_text: active.text.clone(),
        candidate_text: text.clone(),
        done_ms: 0,
    };
    let counts = export.counts.clone();
    let work = move |stop: &std::sync::atomic::AtomicBool| {
        let parse = |name: &str, text: &str| {
            allot_config::parse_policy(name, text).map_err(|d| {
                format!("{name} does not parse: {}", allot_config::render(&d).trim_end())
            })
        };
        let active = parse(&active_source, &active_text)?;
        let candidate = parse(&name, &text)?;
        let config = crate::whatif::whatif_config(&export, &jobs);
        let mut result = run_whatif(&nodes, &active, &candidate, &jobs, &config, counts, stop)?;
        result.fidelity = crate::whatif::fidelity(&export, &result.active);
        Ok(result)
    };
    match state.whatifs.start(count, compared, work) {
        Ok(id) => WhatIf::Running { id, jobs: count, elapsed_ms: 0 },
        Err(RunStartError::Poisoned) => WhatIf::Failed("the what-if table is poisoned".into()),
    }
}

/// `GET /policy/whatif/{id}`: the what-if's section (alone for htmx).
pub(crate) async fn whatif_poll(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let Ok(Path(id)) = id else {
        return super::error_page(400, "what-if numbers are whole numbers");
    };
    let whatif = if principal.role == Role::Member {
        WhatIf::NotRun(
            "what-if results cover every project: they need a viewer or admin token".into(),
        )
    } else {
        match state.whatifs.get(id) {
            None => WhatIf::NotRun(format!(
                "no what-if #{id}: only the last few are kept — check the candidate again"
            )),
            Some(RunState::Running { started_ms, jobs }) => {
                let elapsed_ms = super::now_ms().saturating_sub(started_ms);
                if elapsed_ms > WHATIF_WAIT_MS {
                    WhatIf::Failed(format!(
                        "the what-if has run for more than {} min; this page stopped waiting \
                         for it — replay the exported history with `allot sim replay` instead",
                        WHATIF_WAIT_MS / 60_000
                    ))
                } else {
                    WhatIf::Running { id, jobs, elapsed_ms }
                }
            }
            Some(RunState::Done(result)) => WhatIf::Done(result),
            Some(RunState::Failed(message)) => WhatIf::Failed(message),
        }
    };
    let section = whatif_section(&whatif);
    if is_fragment(&headers) {
        return html_response(StatusCode::OK, &section);
    }
    html_response(
        StatusCode::OK,
        &layout(
            "What-if",
            &Frame::of(Tab::Policy, &principal, &state),
            &html! { h1 { "What-if" } (section) },
        ),
    )
}

// ---------------------------------------------------------------------------------------------
// multipart/form-data, only what a browser's file upload sends

/// The file in field `field` of a `multipart/form-data` body: its name (the last path part,
/// control characters dropped, at most 200 characters; `uploaded policy` when empty) and its
/// bytes. Errors say what is missing.
pub(crate) fn multipart_file<'a>(
    content_type: &str,
    body: &'a [u8],
    field: &str,
) -> Result<(String, &'a [u8]), String> {
    let (mime, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(format!(
            "the upload is {:?}, not multipart/form-data",
            if mime.trim().is_empty() { "without a content type" } else { mime.trim() }
        ));
    }
    let boundary = params
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"'))
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or("the multipart upload names no boundary")?;
    let delimiter = format!("--{boundary}");
    let next_part = format!("\r\n--{boundary}");
    let mut at =
        find(body, delimiter.as_bytes(), 0).ok_or("the upload has no parts")? + delimiter.len();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            break;
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("the multipart upload is malformed (no line break after a boundary)".into());
        }
        let headers_start = at + 2;
        let headers_end = find(body, b"\r\n\r\n", headers_start)
            .ok_or("the multipart upload is malformed (a part without a blank line)")?;
        let content_start = headers_end + 4;
        let content_end = find(body, next_part.as_bytes(), content_start)
            .ok_or("the multipart upload is cut short (no closing boundary)")?;
        let part_headers = String::from_utf8_lossy(&body[headers_start..headers_end]);
        if let Some((name, filename)) = disposition(&part_headers)
            && name == field
        {
            return Ok((file_name(filename.as_deref()), &body[content_start..content_end]));
        }
        at = content_end + next_part.len();
    }
    Err(format!("the form has no file field `{field}`"))
}

/// `name` and `filename` of a part's `Content-Disposition: form-data` header.
fn disposition(headers: &str) -> Option<(String, Option<String>)> {
    let line = headers.split("\r\n").find_map(|l| {
        let (key, value) = l.split_once(':')?;
        key.trim().eq_ignore_ascii_case("content-disposition").then_some(value)
    })?;
    let mut name = None;
    let mut filename = None;
    for param in line.split(';').skip(1) {
        let Some((key, value)) = param.trim().split_once('=') else { continue };
        let value = value.trim().trim_matches('"').to_string();
        match key.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(value),
            "filename" => filename = Some(value),
            _ => {}
        }
    }
    Some((name?, filename))
}

fn file_name(sent: Option<&str>) -> String {
    let base = sent.unwrap_or("").rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    if clean.trim().is_empty() { "uploaded policy".into() } else { clean }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > haystack.len() {
        return None;
    }
    haystack[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}

// ---------------------------------------------------------------------------------------------
// Rendering

pub(crate) fn render(data: &PolicyData) -> Markup {
    let candidate_text = data.candidate.as_ref().map_or("", |(t, _)| t.as_str());
    html! {
        h1 { "Policy" }
        h2 { "Check a candidate policy" }
        p.note { "Checked against this daemon's inventory, as " code { "allot policy validate" } " does; nothing is changed. "
            "A valid candidate is then replayed against this daemon's history next to the active policy (what-if)." }
        @if let Some((_, v)) = &data.candidate {
            @if v.ok { p.ok role="status" { "✓ " (v.summary) } } @else {
                p.error role="alert" { "✗ " (v.summary) }
                table {
                    tr { th { "problem" } th { "field" } th { "fix" } }
                    @for p in &v.problems {
                        tr { td { (p.error) } td { code { (p.field.as_deref().unwrap_or("")) } } td { (p.fix.as_deref().unwrap_or("")) } }
                    }
                }
            }
        }
        @if let Some(w) = &data.whatif { (whatif_section(w)) }
        form method="post" action="/policy" {
            label for="policy" { "Candidate policy (YAML): paste the file" }
            textarea #policy name="policy" spellcheck="false" { (candidate_text) }
            p { button type="submit" { "Check" } }
        }
        form method="post" action="/policy/upload" enctype="multipart/form-data" {
            label for=(FILE_FIELD) { "…or upload the file (at most " (UPLOAD_BYTES_MAX >> 20) " MiB) " }
            input #(FILE_FIELD) type="file" name=(FILE_FIELD) accept=".yaml,.yml,application/yaml,text/yaml" required;
            " " button type="submit" { "Check file" }
        }
        h2 { "Active policy " a.note href="/api/v1/policy" { "(JSON)" } }
        p { "Version " (data.active.version) ", from " code { (data.active.source) } "." }
        pre { (data.active.text) }
        @if let Some(r) = &data.active.rollout { (rollout_section(r)) }
        @if let Some(s) = &data.shadow { (shadow_section(s)) }
        h2 { "Versions " a.note href="/api/v1/policy/versions" { "(JSON)" } }
        p.note { "Every policy this daemon ran under. " code { "allot policy show --version N --diff" }
            " prints what one changed; " code { "allot policy rollback N" } " (admins) brings one back." }
        table {
            tr { th { "version" } th { "applied" } th { "by" } th { "source" } th { "what-if shown" } }
            @for v in data.versions.iter().rev() {
                tr {
                    td { (v.version) @if v.version == data.active.version { " (in effect)" } }
                    td { @match v.at_ms { Some(ms) => (crate::views::utc(ms)), None => "first start" } }
                    td { (v.by.as_deref().unwrap_or("policy file at start")) }
                    td { code { (v.source) } @if let Some(n) = v.rollback_of { " — back to version " (n) }
                        @if let Some(why) = &v.why { br; span.note { (why) } } }
                    td { @match &v.whatif { Some(w) => (whatif_shown(w)), None => span.note { "none" } } }
                }
            }
        }
    }
}

/// The what-if kept with a version: the version it was compared with, then this one.
fn whatif_shown(w: &allot_api::WhatIfShown) -> Markup {
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    let hours = |milli: u64| format!("{:.2}", milli as f64 / 1000.0);
    let (a, c) = (&w.active, &w.candidate);
    html! {
        "#" (w.run) " vs version " (w.active_version) ", " (w.jobs) " workloads: "
        "p95 wait " (secs(a.wait_p95_ms)) " → " (secs(c.wait_p95_ms))
        ", GPU-h " (hours(a.allocated_milli_gpu_hours)) " → " (hours(c.allocated_milli_gpu_hours))
        ", pre-emptions " (a.preemptions) " → " (c.preemptions)
        @if let Some(pct) = w.fidelity_gap_pct { br; span.note { "replay within " (pct) " % of the record" } }
    }
}

/// The scoped rollout: its scope, what it carries, and each rollback condition's figures.
fn rollout_section(r: &allot_api::RolloutView) -> Markup {
    let figure = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.3}"));
    html! {
        h2 { "Rollout: " code { (r.candidate) } " to " code { (r.scope) } }
        p.note { "Version " (r.version) " since " (crate::views::utc(r.since_ms))
            @if let Some(by) = &r.by { " (by " (by) ")" } "; a rollback brings back version " (r.base_version)
            ". Carried: " (r.carried.join(", ")) ". Left out (as version " (r.base_version) " has them): "
            @if r.left_out.is_empty() { "nothing" } @else { (r.left_out.join(", ")) } ". Baseline: the "
            (super::duration(r.baseline_ms)) " before the rollout." }
        @match &r.ended {
            Some(how) => p role="status" { "Ended: " (how) "." },
            None => p role="status" { "In effect. " code { "allot policy rollback" } " ends it; "
                code { "allot policy apply " (r.candidate) } " promotes it to the whole fleet." },
        }
        @if r.conditions.is_empty() { p.note { "No rollback conditions: only an admin ends it." } }
        @else {
            table {
                tr { th { "condition" } th { "baseline" } th { "since the rollout" } th { "state" } }
                @for c in &r.conditions {
                    tr {
                        td { code { (c.condition) } }
                        td { (figure(c.baseline)) " (" (c.baseline_samples) ")" }
                        td { (figure(c.current)) " (" (c.samples) ")" }
                        td { (c.state) }
                    }
                }
            }
        }
    }
}

/// The policy in shadow: per project, what it would have done differently from the active one.
fn shadow_section(s: &allot_api::ShadowReport) -> Markup {
    html! {
        h2 { "In shadow: " code { (s.source) } " " a.note href="/api/v1/policy/shadow" { "(JSON)" } }
        p.note { "Started by " (s.by) " at " (crate::views::utc(s.since_ms)) "; " (s.cycles)
            " decision cycle(s) compared, nothing of it executed. "
            @if s.failed_cycles > 0 { (s.failed_cycles) " cycle(s) it could not take the live work: "
                (s.last_failure.as_deref().unwrap_or("")) ". " }
            @if !s.idle_compared { "Idle reclaims are not compared: its idle rules differ from the active ones. " }
            code { "allot policy shadow --stop" } " ends it." }
        table {
            tr { th { "project" } th { "sooner" } th { "admitted since" } th { "mean saved" }
                th { "held back" } th { "pre-empted (active / candidate)" } th { "reclaimed (active / candidate)" } }
            @for p in &s.projects {
                tr {
                    td { (p.project) } td { (p.sooner) } td { (p.admitted_since) }
                    td { @if p.admitted_since > 0 { (super::duration(p.wait_saved_ms / p.admitted_since)) } @else { "–" } }
                    td { (p.held_back) }
                    td { (p.preempted_active) " / " (p.preempted_candidate) }
                    td { @if s.idle_compared { (p.reclaimed_active) " / " (p.reclaimed_candidate) } @else { "not compared" } }
                }
            }
        }
    }
}

/// The what-if's section: polled while it runs, figures and charts once it is done.
pub(crate) fn whatif_section(w: &WhatIf) -> Markup {
    html! {
        @match w {
            WhatIf::NotRun(why) => div #whatif { h2 { "What-if" } p.note { "Not run: " (why) "." } },
            WhatIf::Failed(why) => div #whatif { h2 { "What-if" } p.error role="alert" { "The what-if failed: " (why) } },
            WhatIf::Running { id, jobs, elapsed_ms } => {
                div #whatif hx-get={ "/policy/whatif/" (id) } hx-trigger={ "every " (WHATIF_POLL_SECONDS) "s" } hx-swap="outerHTML" {
                    h2 { "What-if" }
                    p role="status" { "Replaying " (jobs) " jobs of this daemon's history under both policies… ("
                        (super::duration(*elapsed_ms)) " so far). "
                        a href={ "/policy/whatif/" (id) } { "Result" } " (this page updates itself)." }
                }
            }
            WhatIf::Done(result) => div #whatif { (whatif_result(result)) },
        }
    }
}

fn pct(v: f64) -> String {
    if v.is_finite() { format!("{v:.1} %") } else { "?".into() }
}

fn secs(v: f64) -> String {
    if v.is_finite() && v >= 0.0 { super::duration((v * 1000.0) as u64) } else { "?".into() }
}

/// A difference with its sign and `decimals` places, `=` when it rounds to nothing.
fn signed(v: f64, decimals: usize, unit: &str) -> String {
    if !v.is_finite() {
        return "?".into();
    }
    let text = format!("{v:+.decimals$}{unit}");
    if text
        .trim_start_matches(['+', '-'])
        .trim_end_matches(unit)
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        "=".into()
    } else {
        text
    }
}

/// A difference of durations: `+2 min`, `-1 h 5 min`, `=`.
fn signed_secs(v: f64) -> String {
    if !v.is_finite() {
        return "?".into();
    }
    let ms = (v.abs() * 1000.0) as u64;
    if ms < 1000 {
        return "=".into();
    }
    format!("{}{}", if v < 0.0 { "-" } else { "+" }, super::duration(ms))
}

fn whatif_result(r: &WhatIfResult) -> Markup {
    let (a, c) = (&r.active, &r.candidate);
    // (figure, active, candidate, candidate − active)
    let rows: Vec<(&str, String, String, String)> = vec![
        (
            "jobs finished",
            format!("{} of {}", a.jobs_finished, a.jobs_total),
            format!("{} of {}", c.jobs_finished, c.jobs_total),
            signed(c.jobs_finished as f64 - a.jobs_finished as f64, 0, ""),
        ),
        (
            "jobs cancelled (never placeable)",
            a.jobs_cancelled.to_string(),
            c.jobs_cancelled.to_string(),
            signed(c.jobs_cancelled as f64 - a.jobs_cancelled as f64, 0, ""),
        ),
        (
            "queueing delay p50",
            secs(a.queue_delay_s_p50),
            secs(c.queue_delay_s_p50),
            signed_secs(c.queue_delay_s_p50 - a.queue_delay_s_p50),
        ),
        (
            "queueing delay p95",
            secs(a.queue_delay_s_p95),
            secs(c.queue_delay_s_p95),
            signed_secs(c.queue_delay_s_p95 - a.queue_delay_s_p95),
        ),
        (
            "mean completion time",
            secs(a.jct_s_mean),
            secs(c.jct_s_mean),
            signed_secs(c.jct_s_mean - a.jct_s_mean),
        ),
        (
            "utilisation: GPUs allocated",
            pct(a.gpu_allocated_pct),
            pct(c.gpu_allocated_pct),
            signed(c.gpu_allocated_pct - a.gpu_allocated_pct, 1, " pt"),
        ),
        (
            "utilisation: GPUs active (modelled)",
            pct(a.gpu_active_pct),
            pct(c.gpu_active_pct),
            signed(c.gpu_active_pct - a.gpu_active_pct, 1, " pt"),
        ),
        (
            "GPU-hours allocated",
            super::hours(a.allocated_gpu_hours),
            super::hours(c.allocated_gpu_hours),
            signed(c.allocated_gpu_hours - a.allocated_gpu_hours, 2, ""),
        ),
        (
            "GPU-hours useful",
            super::hours(a.useful_gpu_hours),
            super::hours(c.useful_gpu_hours),
            signed(c.useful_gpu_hours - a.useful_gpu_hours, 2, ""),
        ),
        (
            "GPU-hours lost (redone work, restarts)",
            super::hours(a.lost_gpu_hours),
            super::hours(c.lost_gpu_hours),
            signed(c.lost_gpu_hours - a.lost_gpu_hours, 2, ""),
        ),
        (
            "GPU-hours idle",
            super::hours(a.idle_gpu_hours),
            super::hours(c.idle_gpu_hours),
            signed(c.idle_gpu_hours - a.idle_gpu_hours, 2, ""),
        ),
        (
            "pre-emptions",
            a.preemptions.to_string(),
            c.preemptions.to_string(),
            signed(c.preemptions as f64 - a.preemptions as f64, 0, ""),
        ),
        (
            "goodput (useful / allocated)",
            pct(a.goodput * 100.0),
            pct(c.goodput * 100.0),
            signed((c.goodput - a.goodput) * 100.0, 1, " pt"),
        ),
    ];
    let projects = project_rows(r);
    html! {
        h2 { "What-if: the active policy vs the candidate on this daemon's history" }
        p.note { (assumptions(r)) }
        div.scroll { table {
            tr { th { "figure" } th.num { "active" } th.num { "candidate" } th.num { "candidate − active" } }
            @for (label, av, cv, d) in &rows {
                tr { td { (label) } td.num { (av) } td.num { (cv) } td.num { (d) } }
            }
        } }
        h2 { "Per project" }
        div.scroll { table {
            tr {
                th { "project" }
                th.num { "GPU-h allocated" br; "active / candidate" }
                th.num { "GPU-h useful" br; "active / candidate" }
                th.num { "GPU-h lost" br; "active / candidate" }
                th.num { "pre-emptions" br; "active / candidate" }
                th.num { "jobs finished" br; "active / candidate" }
            }
            @for (name, pa, pc) in &projects {
                tr {
                    td { (name) }
                    td.num { (super::hours(pa.allocated_gpu_hours)) " / " (super::hours(pc.allocated_gpu_hours)) }
                    td.num { (super::hours(pa.useful_gpu_hours)) " / " (super::hours(pc.useful_gpu_hours)) }
                    td.num { (super::hours(pa.lost_gpu_hours)) " / " (super::hours(pc.lost_gpu_hours)) }
                    td.num { (pa.preemptions) " / " (pc.preemptions) }
                    td.num { (pa.jobs_finished) " of " (pa.jobs_total) " / " (pc.jobs_finished) " of " (pc.jobs_total) }
                }
            }
        } }
        (fidelity_section(&r.fidelity))
        (charts(r, &projects))
    }
}

/// How well the active policy's replay reproduces what was recorded: a side-by-side is only
/// worth what this is.
fn fidelity_section(rows: &[crate::whatif::FidelityRow]) -> Markup {
    let pair = |(recorded, replayed): (f64, f64), show: &dyn Fn(f64) -> String| {
        format!("{} / {}", show(recorded), show(replayed))
    };
    html! {
        @if !rows.is_empty() {
            h2 { "Can this what-if be trusted? The active policy's replay against what happened" }
            p.note { "Recorded / replayed, over the work that ended after running (for running and "
                "pending work the replay invents a future the record does not have yet). "
                "Off by more than 10 % on a figure, the side-by-side above overstates how sure it is "
                "there. Known causes: a pre-empted job's run time is its last run only, and the replay "
                "models activity, start-up and restarts rather than replaying them." }
            div.scroll { table {
                tr { th { "project" } th.num { "jobs" } th.num { "wait p50" } th.num { "wait p95" }
                    th.num { "GPU-h allocated" } th.num { "pre-emptions" } th.num { "largest gap" } }
                @for f in rows {
                    tr {
                        td { (f.project) } td.num { (f.jobs) }
                        td.num { (pair(f.wait_p50_s, &secs)) } td.num { (pair(f.wait_p95_s, &secs)) }
                        td.num { (pair(f.allocated_gpu_hours, &super::hours)) }
                        td.num { (f.preemptions.0) " / " (f.preemptions.1) }
                        td.num { @if f.worst_gap() <= 0.10 { "within 10 %" } @else { (pct(f.worst_gap() * 100.0)) } }
                    }
                }
            } }
        }
    }
}

type ProjectPair = (String, allot_sim::outcome::ProjectLedger, allot_sim::outcome::ProjectLedger);

/// Every project of either replay, by name, with its ledger under each (empty where absent).
fn project_rows(r: &WhatIfResult) -> Vec<ProjectPair> {
    let mut names: Vec<&str> =
        r.active.projects.iter().chain(&r.candidate.projects).map(|p| p.project.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let find = |list: &[allot_sim::outcome::ProjectLedger], name: &str| {
        list.iter().find(|p| p.project == name).cloned().unwrap_or_default()
    };
    names
        .into_iter()
        .map(|n| (n.to_string(), find(&r.active.projects, n), find(&r.candidate.projects, n)))
        .collect()
}

/// `20000` as `20,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn assumptions(r: &WhatIfResult) -> String {
    let n = &r.counts;
    let mut text = format!(
        "Replayed {} jobs of this daemon's history from its first submission, once under each \
         policy, on this daemon's {} nodes ({} GPUs): {} ended with their real run time, {} \
         running with their run time so far (a lower bound), {} pending with an estimated run \
         time (their max runtime, else their project's median). Left out: {} pending without an \
         estimate, {} that never ran, {} older than the newest {}. How busy each allocated GPU \
         is comes from the simulator's activity model (docs/design/activity-model.md, default \
         parameters) with seed {}; no job checkpoints (the daemon records no checkpoint \
         interval); a pre-empted job restarts after {:.3} s (the start-up delay this daemon \
         measured, else the simulator's). The same as `allot history export` \
         then `allot sim replay` with the exported trace and cluster and both policies. \
         Replays took {}.",
        r.jobs,
        r.nodes,
        r.gpus,
        n.ended,
        n.running,
        n.pending_estimated,
        n.pending_skipped,
        n.never_ran,
        n.older_left_out,
        thousands(WHATIF_JOBS_MAX),
        r.seed,
        r.restart_delay_s,
        super::duration(r.wall_ms),
    );
    for (which, added) in [("active policy", &r.added_active), ("candidate", &r.added_candidate)] {
        if !added.is_empty() {
            text.push_str(&format!(
                " Projects the {which} lacks, replayed with no guarantee: {}.",
                added.join(", ")
            ));
        }
    }
    text
}

fn charts(r: &WhatIfResult, projects: &[ProjectPair]) -> Markup {
    use allot_sim::charts::{Series, bar_chart_svg, line_chart_svg};
    let timeline = |rep: &allot_sim::outcome::ReplayReport, label: &str| Series {
        label: label.into(),
        points: rep.timeline.iter().map(|p| (p.t_s / 3600.0, p.allocated_gpus)).collect(),
    };
    let cdf = |rep: &allot_sim::outcome::ReplayReport, label: &str| {
        let n = rep.queue_delays_s.len().max(1) as f64;
        Series {
            label: label.into(),
            points: rep
                .queue_delays_s
                .iter()
                .enumerate()
                .map(|(i, d)| (d / 60.0, (i + 1) as f64 * 100.0 / n))
                .collect(),
        }
    };
    let rows: Vec<String> = projects.iter().map(|(n, _, _)| n.clone()).collect();
    let values: Vec<Vec<f64>> = projects
        .iter()
        .map(|(_, a, c)| {
            vec![
                a.allocated_gpu_hours,
                c.allocated_gpu_hours,
                a.useful_gpu_hours,
                c.useful_gpu_hours,
            ]
        })
        .collect();
    html! {
        h2 { "Charts" }
        (super::chart(line_chart_svg(
            "whatif-allocation",
            "Allocated GPUs over time",
            "hours since the first submission",
            "GPUs",
            &[timeline(&r.active, "active"), timeline(&r.candidate, "candidate")],
        )))
        (super::chart(line_chart_svg(
            "whatif-queue-delay",
            "Queueing delay: share of admitted jobs waiting at most x",
            "minutes from submission to first start",
            "% of admitted jobs",
            &[cdf(&r.active, "active"), cdf(&r.candidate, "candidate")],
        )))
        (super::chart(bar_chart_svg(
            "whatif-projects",
            "GPU-hours per project",
            "GPU-hours",
            &["active: allocated", "candidate: allocated", "active: useful", "candidate: useful"],
            &rows,
            &values,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::multipart_file;

    fn form(boundary: &str, parts: &[(&str, Option<&str>, &str)]) -> Vec<u8> {
        let mut body = String::new();
        for (name, filename, content) in parts {
            body.push_str(&format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\""
            ));
            if let Some(f) = filename {
                body.push_str(&format!("; filename=\"{f}\"\r\nContent-Type: application/yaml"));
            }
            body.push_str(&format!("\r\n\r\n{content}\r\n"));
        }
        body.push_str(&format!("--{boundary}--\r\n"));
        body.into_bytes()
    }

    #[test]
    fn the_file_part_is_found_by_field_name() {
        let body = form(
            "XyZ",
            &[
                ("other", None, "x"),
                ("policy_file", Some("C:\\a\\team.yaml"), "projects:\r\n  - a\n"),
            ],
        );
        let (name, bytes) =
            multipart_file("multipart/form-data; boundary=XyZ", &body, "policy_file")
                .expect("valid in this test");
        assert_eq!(name, "team.yaml");
        assert_eq!(bytes, b"projects:\r\n  - a\n");
    }

    #[test]
    fn missing_parts_and_wrong_types_are_named() {
        let body = form("b", &[("other", None, "x")]);
        let e = multipart_file("multipart/form-data; boundary=b", &body, "policy_file")
            .expect_err("an error");
        assert!(e.contains("no file field `policy_file`"), "{e}");
        let e = multipart_file("application/json", &body, "policy_file").expect_err("an error");
        assert!(e.contains("not multipart/form-data"), "{e}");
        let e = multipart_file("multipart/form-data", &body, "policy_file").expect_err("an error");
        assert!(e.contains("no boundary"), "{e}");
        let cut = &body[..body.len() - 8];
        let e = multipart_file("multipart/form-data; boundary=b", cut, "policy_file")
            .expect_err("an error");
        assert!(e.contains("no file field") || e.contains("cut short"), "{e}");
        let e = multipart_file("multipart/form-data; boundary=b", b"", "policy_file")
            .expect_err("an error");
        assert!(e.contains("no parts"), "{e}");
    }
}
