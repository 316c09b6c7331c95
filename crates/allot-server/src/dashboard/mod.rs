//! The web dashboard at `/`: server-rendered HTML (maud) with htmx polling page fragments, and
//! charts drawn as SVG by the simulator's plotting code (`allot_sim::charts`).
//!
//! Each page is two parts: a handler that gathers plain data (from the readers' `View`, or by
//! asking the main loop, as the API does) already filtered by the principal's role, and a
//! `render` function of that data alone, so that the templates are snapshot-tested with fixed
//! data (`snapshots.rs`). A request with `HX-Request` gets only the page's live fragment.
//!
//! Authentication: the API's bearer header, or the `allot_session` cookie set by the login form
//! (HttpOnly, SameSite=Strict, Secure under TLS) holding the same token; the role rules are the
//! API's (`Principal::can_see`). Without either, pages redirect to `/login`. GET requests to the
//! API also accept the cookie (`cookie_as_bearer`), so that the links behind every number open
//! in the browser; anything that changes state still needs the header.

mod actions;
mod fleet;
mod idle;
mod policy;
mod projects;
mod queue;
#[cfg(test)]
mod snapshots;
mod workload;

use std::sync::OnceLock;

use allot_api::Role;
use axum::Router;
use axum::body::Body;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;

use crate::auth::Principal;
use crate::os::wall_ms;
use crate::state::AppState;
use crate::view::{HttpError, View};

/// The session cookie: the token itself (the server keeps no session table, so a revoked token
/// ends every session that holds it).
pub(crate) const COOKIE: &str = "allot_session";
/// How often live fragments are fetched again.
pub(crate) const POLL_SECONDS: u32 = 5;
/// The vendored htmx (see `assets/README.md`).
const HTMX_VERSION: &str = "2.0.11";
const HTMX: &[u8] = include_bytes!("../../assets/htmx.min.js");
const CSS: &str = include_str!("../../assets/dashboard.css");
/// Assets are named by version or content, so they can be cached for a year.
const ASSET_CACHE: &str = "public, max-age=31536000, immutable";
/// Figures that need telemetry say so instead of showing 0 when no source reported readings.
pub(crate) const NO_TELEMETRY: &str = "no telemetry";

/// Under TLS the session cookie is `Secure`; `run` adds this to the router when it serves HTTPS.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SecureCookies;

/// Marks the dashboard's session cookies `Secure` (sent over HTTPS only): for a router served
/// over TLS (`run` does this itself).
pub fn secure_cookies(router: Router) -> Router {
    router.layer(axum::Extension(SecureCookies))
}

fn htmx_path() -> String {
    format!("/assets/htmx-{HTMX_VERSION}.min.js")
}

fn css_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        // FNV-1a of the style sheet: a new name whenever it changes.
        let hash = CSS.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("/assets/dashboard-{hash:016x}.css")
    })
}

/// The dashboard's routes (merged into the API's router by `api::router`).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(fleet::page))
        .route("/fleet", get(fleet::page))
        .route("/queue", get(queue::page))
        .route("/workload/{id}", get(workload::page))
        .route("/projects", get(projects::page))
        .route("/idle", get(idle::page))
        .merge(policy::routes())
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(asset))
        .route("/workload/{id}/{action}", post(actions::act))
        // Every dashboard POST (forms) must come from this site.
        .route_layer(axum::middleware::from_fn(actions::same_origin))
}

/// Lets a browser that logged in read the API (GET and HEAD only) with its session cookie: the
/// cookie becomes the bearer header when the request has none.
pub(crate) async fn cookie_as_bearer(mut request: Request<Body>, next: Next) -> Response {
    let safe = matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    if safe
        && !request.headers().contains_key(header::AUTHORIZATION)
        && let Some(token) = cookie_token(request.headers())
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|t| !t.is_empty())
}

pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(|t| t.trim().to_string())
}

fn is_fragment(headers: &HeaderMap) -> bool {
    headers.get("hx-request").is_some_and(|v| v.as_bytes() == b"true")
}

/// Who is asking: the bearer header first, then the session cookie. Unknown: a redirect to the
/// login page (for htmx, `HX-Redirect`, so a fragment never swaps the login form into a page).
pub(crate) fn who(state: &AppState, headers: &HeaderMap) -> Result<Principal, Box<Response>> {
    let token = bearer_token(headers).or_else(|| cookie_token(headers));
    if let Some(p) = token.and_then(|t| state.tokens.principal(&t)) {
        return Ok(p);
    }
    if is_fragment(headers) {
        return Err(Box::new(
            (StatusCode::UNAUTHORIZED, [("hx-redirect", "/login")]).into_response(),
        ));
    }
    Err(Box::new((StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response()))
}

pub(crate) fn read_view(
    state: &AppState,
) -> Result<std::sync::RwLockReadGuard<'_, View>, Box<Response>> {
    state
        .handle
        .view
        .read()
        .map_err(|_| Box::new(error_page(500, "the daemon's view lock is poisoned")))
}

/// What every page shows around its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub tab: Tab,
    pub user: String,
    pub role: Role,
    /// Said above every page while it holds (the backend does not answer).
    pub alert: Option<String>,
}

impl Frame {
    pub(crate) fn of(tab: Tab, p: &Principal, state: &AppState) -> Frame {
        let alert = state.handle.view.read().ok().and_then(|view| backend_alert(&view.backend));
        Frame { tab, user: p.name.clone(), role: p.role.clone(), alert }
    }
}

/// The banner for a backend that does not answer.
pub(crate) fn backend_alert(backend: &allot_api::BackendStatus) -> Option<String> {
    (!backend.reachable).then(|| {
        format!(
            "The {} backend is unreachable since {} ({}): no new work is placed; running work \
             runs on.",
            backend.name,
            backend.unreachable_since_ms.map_or_else(|| "?".to_string(), crate::views::utc),
            backend.error.as_deref().unwrap_or("no answer")
        )
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tab {
    Fleet,
    Queue,
    Workload,
    Projects,
    Idle,
    Policy,
}

const TABS: [(Tab, &str, &str); 5] = [
    (Tab::Fleet, "/fleet", "Fleet"),
    (Tab::Queue, "/queue", "Queue"),
    (Tab::Projects, "/projects", "Projects"),
    (Tab::Idle, "/idle", "Idle"),
    (Tab::Policy, "/policy", "Policy"),
];

/// A whole page: header with navigation and who is logged in, then `body`.
pub(crate) fn layout(title: &str, frame: &Frame, body: &Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · allot" }
                link rel="stylesheet" href=(css_path());
                script src=(htmx_path()) defer {}
            }
            body {
                header {
                    span.brand { "allot" }
                    nav {
                        @for (tab, href, label) in TABS {
                            a href=(href) class=[(tab == frame.tab).then_some("here")] { (label) }
                        }
                    }
                    span.who {
                        (frame.user) " (" (frame.role.as_str()) ") "
                        form.inline method="post" action="/logout" { button type="submit" { "Log out" } }
                    }
                }
                main {
                    @if let Some(alert) = &frame.alert { p.error role="alert" { (alert) } }
                    (body)
                }
            }
        }
    }
}

/// A fragment that htmx fetches again every few seconds (`url` returns it alone).
pub(crate) fn live(url: &str, content: &Markup) -> Markup {
    html! {
        div #live hx-get=(url) hx-trigger={ "every " (POLL_SECONDS) "s" } hx-swap="outerHTML" {
            (content)
        }
    }
}

/// The page, or only its live fragment when htmx asks.
pub(crate) fn respond(
    headers: &HeaderMap,
    title: &str,
    frame: &Frame,
    live_url: &str,
    content: Markup,
) -> Response {
    let content = html! {
        @if let Some(alert) = &frame.alert { p.error role="alert" { (alert) } }
        (content)
    };
    let fragment = live(live_url, &content);
    if is_fragment(headers) {
        return html_response(StatusCode::OK, &fragment);
    }
    // The alert is in the live fragment (it comes and goes with the polls), not above it.
    let frame = Frame { alert: None, ..frame.clone() };
    html_response(StatusCode::OK, &layout(title, &frame, &fragment))
}

pub(crate) fn html_response(status: StatusCode, markup: &Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
        markup.0.clone(),
    )
        .into_response()
}

/// A plain page for an error (no navigation: the principal may be unknown).
pub(crate) fn error_page(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "allot: " (status.as_u16()) } link rel="stylesheet" href=(css_path()); }
            body { main {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p.error { (message) }
                p { a href="/fleet" { "Back to the fleet" } }
            } }
        }
    };
    html_response(status, &page)
}

pub(crate) fn http_error_page(e: &HttpError) -> Response {
    let mut text = e.body.error.clone();
    if let Some(fix) = &e.body.fix {
        text.push_str(" — ");
        text.push_str(fix);
    }
    error_page(e.status, &text)
}

// ---------------------------------------------------------------------------------------------
// Login

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

pub(crate) fn login_markup(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Log in · allot" }
                link rel="stylesheet" href=(css_path());
            }
            body { main.login {
                h1 { "allot" }
                p { "Paste an allot token (" code { "allot_…" } "): the admin token " code { "allot serve" }
                    " printed at its first start, or one from " code { "allot token create" } "." }
                @if let Some(e) = error { p.error role="alert" { (e) } }
                form method="post" action="/login" {
                    label for="token" { "Token" }
                    br;
                    input #token type="password" name="token" autocomplete="current-password" required autofocus;
                    p { button type="submit" { "Log in" } }
                }
                p.note { "The token is kept in an HttpOnly cookie for this site only. Scripts may send "
                    code { "Authorization: Bearer TOKEN" } " instead." }
            } }
        }
    }
}

async fn login_page() -> Response {
    html_response(StatusCode::OK, &login_markup(None))
}

async fn login(
    State(state): State<AppState>,
    secure: Option<axum::Extension<SecureCookies>>,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return html_response(
            StatusCode::BAD_REQUEST,
            &login_markup(Some("send the form with a token")),
        );
    };
    let token = form.token.trim().to_string();
    // Only the token's own characters go into the cookie (it is `allot_<hex>_<hex>`).
    let plain = token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let tokens = state.tokens.clone();
    let checked = token.clone();
    let principal =
        tokio::task::spawn_blocking(move || tokens.principal(&checked)).await.ok().flatten();
    match principal {
        Some(_) if plain => {
            let secure = if secure.is_some() { "; Secure" } else { "" };
            let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
            (
                StatusCode::SEE_OTHER,
                [(header::SET_COOKIE, cookie), (header::LOCATION, "/fleet".to_string())],
            )
                .into_response()
        }
        _ => html_response(
            StatusCode::UNAUTHORIZED,
            &login_markup(Some(
                "unknown or revoked token: check it, or create one with `allot token create`",
            )),
        ),
    }
}

async fn logout(secure: Option<axum::Extension<SecureCookies>>) -> Response {
    let secure = if secure.is_some() { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
    (
        StatusCode::SEE_OTHER,
        [(header::SET_COOKIE, cookie), (header::LOCATION, "/login".to_string())],
    )
        .into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    if name == htmx_path().trim_start_matches("/assets/") {
        return (
            [
                (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                (header::CACHE_CONTROL, ASSET_CACHE),
            ],
            HTMX,
        )
            .into_response();
    }
    if name == css_path().trim_start_matches("/assets/") {
        return (
            [
                (header::CONTENT_TYPE, "text/css; charset=utf-8"),
                (header::CACHE_CONTROL, ASSET_CACHE),
            ],
            CSS,
        )
            .into_response();
    }
    error_page(404, &format!("no asset {name:?}"))
}

// ---------------------------------------------------------------------------------------------
// Small shared pieces

/// `3 s`, `4 min`, `2 h 5 min`, `3 d 4 h`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// GPUs with up to two decimals (`3`, `0.5`, `12.25`).
pub(crate) fn gpus(value: f64) -> String {
    if !value.is_finite() {
        return "?".into();
    }
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// GPU-hours with two decimals.
pub(crate) fn hours(value: f64) -> String {
    if value.is_finite() { format!("{value:.2}") } else { "?".into() }
}

/// A reason code as a labelled chip, followed by its sentence.
pub(crate) fn reason(code: Option<&str>, sentence: Option<&str>) -> Markup {
    html! {
        @if let Some(c) = code { span.code title="reason code" { (c) } " " }
        @if let Some(s) = sentence { (s) } @else { span.nodata { "no decision yet" } }
    }
}

/// A query-string value, percent-encoded.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn chart(svg: Result<String, allot_sim::charts::ChartError>) -> Markup {
    match svg {
        Ok(svg) => html! { div.chart { (PreEscaped(svg)) } },
        Err(e) => html! { p.error { "chart not drawn: " (e.to_string()) } },
    }
}

pub(crate) fn now_ms() -> u64 {
    wall_ms()
}

#[derive(Debug, Deserialize)]
pub(crate) struct ProjectQuery {
    pub project: Option<String>,
    pub offset: Option<usize>,
}

pub(crate) type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;
