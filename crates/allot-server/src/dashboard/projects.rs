//! Projects: quota lines (guarantee, use, borrowing, lendable), the ledger's rows per project,
//! GPU-hours lost to pre-emption, and the workloads an idle rule warned about.

use allot_api::{LedgerRow, Project, Workload};
use allot_sim::charts::bar_chart_svg;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::track::is_warned;
use super::{
    Frame, NO_TELEMETRY, Tab, chart, encode, gpus, hours, http_error_page, read_view, respond, who,
};
use crate::api::AppState;
use crate::runtime::Request;

/// Warned workloads listed per project at most.
const WARNED_SHOWN: usize = 10;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProjectsData {
    pub since_ms: u64,
    pub now_ms: u64,
    pub projects: Vec<Project>,
    /// The report's `project:NAME` rows (and `cluster`).
    pub rows: Vec<LedgerRow>,
    /// Per project, running workloads an idle rule warned about.
    pub warned: Vec<(String, Vec<Workload>)>,
    /// Telemetry has had readings: active, idle and useful hours are shown, not "no telemetry".
    pub telemetry: bool,
}

pub(crate) async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let report = {
        let principal = principal.clone();
        match state.handle.ask(|reply| Request::Report { principal, reply }).await {
            Ok(r) => r,
            Err(e) => return http_error_page(&e),
        }
    };
    let data = {
        let view = match read_view(&state) {
            Ok(v) => v,
            Err(r) => return *r,
        };
        let projects: Vec<Project> =
            view.projects.iter().filter(|p| principal.can_see(&p.name)).cloned().collect();
        let warned = projects
            .iter()
            .map(|p| {
                let list: Vec<Workload> = view
                    .workloads
                    .values()
                    .filter(|w| w.project == p.name && is_warned(w))
                    .take(WARNED_SHOWN)
                    .cloned()
                    .collect();
                (p.name.clone(), list)
            })
            .collect();
        ProjectsData {
            since_ms: report.since_ms,
            now_ms: report.now_ms,
            projects,
            rows: report
                .rows
                .into_iter()
                .filter(|r| r.scope == "cluster" || r.scope.starts_with("project:"))
                .collect(),
            telemetry: view.telemetry_seen,
            warned,
        }
    };
    respond(&headers, "Projects", &Frame::of(Tab::Projects, &principal), "/projects", render(&data))
}

fn parse(text: &str) -> f64 {
    text.parse::<f64>().unwrap_or(0.0)
}

pub(crate) fn render(data: &ProjectsData) -> Markup {
    let row = |name: &str| data.rows.iter().find(|r| r.scope == format!("project:{name}"));
    let names: Vec<String> = data.projects.iter().map(|p| p.name.clone()).collect();
    let values: Vec<Vec<f64>> = names
        .iter()
        .map(|n| row(n).map_or(vec![0.0, 0.0], |r| vec![r.allocated_gpu_hours, r.lost_gpu_hours]))
        .collect();
    let bars = bar_chart_svg(
        "projects",
        "GPU-hours per project: allocated, lost to pre-emption",
        "GPU-hours",
        &["allocated", "lost to pre-emption"],
        &names,
        &values,
    );
    html! {
        h1 { "Projects" }
        p.note { "Ledger since " (crate::views::utc(data.since_ms)) " (the daemon's first start) to " (crate::views::utc(data.now_ms))
            ". Active, idle and useful GPU-hours need GPU telemetry: " span.nodata { (NO_TELEMETRY) } "." }
        h2 { "Quota" }
        div.scroll { table {
            tr { th { "project" } th { "cohort" } th { "GPU model" } th.num { "guaranteed" } th.num { "in use" }
                 th.num { "borrowing" } th.num { "unused guarantee (lendable)" } th.num { "borrow limit" } th.num { "lend limit" }
                 th.num { "pending" } th.num { "running" } }
            @for p in &data.projects {
                @for (i, q) in p.quota.iter().enumerate() {
                    @let used = parse(&q.used_gpus);
                    @let guaranteed = parse(&q.guaranteed_gpus);
                    tr {
                        @if i == 0 {
                            td rowspan=(p.quota.len()) { a href={ "/queue?project=" (encode(&p.name)) } { (p.name) } }
                            td rowspan=(p.quota.len()) { (p.cohort.as_deref().unwrap_or("–")) }
                        }
                        td { (q.model) }
                        td.num { a href="/api/v1/projects" { (q.guaranteed_gpus) } }
                        td.num { a href="/api/v1/projects" { (q.used_gpus) } }
                        td.num { a href="/api/v1/projects" { (gpus((used - guaranteed).max(0.0))) } }
                        td.num { a href="/api/v1/projects" { (gpus((guaranteed - used).max(0.0))) } }
                        td.num { a href="/api/v1/projects" { (q.borrow_limit_gpus.as_deref().unwrap_or("none")) } }
                        td.num { a href="/api/v1/projects" { (q.lend_limit_gpus.as_deref().unwrap_or("none")) } }
                        @if i == 0 {
                            td.num rowspan=(p.quota.len()) { a href={ "/queue?project=" (encode(&p.name)) } { (p.pending) } }
                            td.num rowspan=(p.quota.len()) { a href={ "/api/v1/workloads?project=" (encode(&p.name)) "&state=running" } { (p.running) } }
                        }
                    }
                }
                @if p.quota.is_empty() {
                    tr { td { (p.name) } td { (p.cohort.as_deref().unwrap_or("–")) } td.nodata colspan="7" { "no quota lines" }
                         td.num { (p.pending) } td.num { (p.running) } }
                }
            }
        } }
        h2 { "Ledger " a.note href="/api/v1/report" { "(JSON)" } }
        div.scroll { table {
            tr { th { "scope" } th.num { "allocated GPU-h" } th.num { "lost to pre-emption GPU-h" } th.num { "active GPU-h" } th.num { "idle GPU-h" } th.num { "useful GPU-h" } th.num { "goodput" } }
            @for r in &data.rows {
                tr {
                    td { (r.scope) }
                    td.num { a href="/api/v1/report" { (hours(r.allocated_gpu_hours)) } }
                    td.num { a href="/api/v1/report" { (hours(r.lost_gpu_hours)) } }
                    @if data.telemetry {
                        td.num { a href="/api/v1/report" { (hours(r.active_gpu_hours)) } }
                        td.num { a href="/api/v1/report" { (hours(r.idle_allocated_gpu_hours)) } }
                        td.num { a href="/api/v1/report" { (hours(r.useful_gpu_hours)) } }
                        td.num { (r.goodput.map_or("–".to_string(), |g| format!("{:.0} %", g * 100.0))) }
                    } @else {
                        td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) }
                    }
                }
            }
        } }
        (chart(bars))
        h2 { "Warned idle workloads" }
        p.note { "Running work an idle rule has warned about (by GPU telemetry, probes or missing readings, as each rule says)." }
        @for (project, list) in &data.warned {
            @if !list.is_empty() {
                p { strong { (project) } ": "
                    @for (i, w) in list.iter().enumerate() {
                        @if i > 0 { ", " } a href={ "/workload/" (w.id) } { "#" (w.id) " " (w.name) } " (" (w.gpus) " GPUs)"
                    }
                }
            }
        }
        @if data.warned.iter().all(|(_, l)| l.is_empty()) { p.nodata { "none" } }
    }
}
