//! Projects: quota lines (guarantee, use, borrowing, lendable), fair-share standing (who goes
//! next, `Engine::standings`), the ledger's rows per project and per period (`?project=NAME`:
//! that project's periods only), GPU-hours lost to pre-emption, and the workloads an idle rule
//! warned about.

use allot_api::{LedgerRow, Project, Workload};
use allot_core::Standing;
use allot_sim::charts::bar_chart_svg;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::{
    Frame, NO_TELEMETRY, ProjectQuery, QueryResult, Tab, chart, encode, gpus, hours,
    http_error_page, read_view, respond, who,
};
use crate::ask::Ask;
use crate::state::AppState;
use crate::view::PeriodRow;
use crate::view::is_warned;

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
    /// Fair-share standing of the visible projects (empty until first derived).
    pub standings: Vec<Standing>,
    /// The ledger per period: the cluster's and the visible projects' rows, newest first per
    /// scope (only `project`'s with a filter).
    pub periods: Vec<PeriodRow>,
    /// `?project=NAME`: the periods shown are this project's.
    pub project: Option<String>,
    /// When the periods (and standings) were derived: they trail the totals by up to 5 s.
    pub derived_at_ms: Option<u64>,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: QueryResult<ProjectQuery>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let Ok(Query(query)) = query else {
        return super::error_page(400, "bad query: use ?project=NAME");
    };
    let filter = query.project.filter(|p| principal.can_see(p));
    let report = {
        let principal = principal.clone();
        match state.handle.report(Ask::Report { principal }).await {
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
            standings: view
                .dashboard
                .derived
                .standings
                .iter()
                .filter(|s| principal.can_see(&s.name))
                .cloned()
                .collect(),
            periods: view
                .dashboard
                .derived
                .periods
                .iter()
                .filter(|r| match (r.scope.strip_prefix("project:"), &filter) {
                    (Some(p), Some(f)) => p == f,
                    (Some(p), None) => principal.can_see(p),
                    (None, f) => f.is_none(),
                })
                .cloned()
                .collect(),
            project: filter,
            derived_at_ms: view.dashboard.derived.at_ms,
        }
    };
    let url = match &data.project {
        Some(p) => format!("/projects?project={}", encode(p)),
        None => "/projects".to_string(),
    };
    respond(
        &headers,
        "Projects",
        &Frame::of(Tab::Projects, &principal, &state),
        &url,
        render(&data),
    )
}

/// A borrow or lend limit: a number of GPUs, unlimited, or nothing to limit without a cohort
/// (such a project neither borrows nor lends).
fn limit(in_cohort: bool, gpus: Option<f64>) -> String {
    match (in_cohort, gpus) {
        (false, _) => "– (no cohort)".to_string(),
        (true, Some(g)) => g.to_string(),
        (true, None) => "unlimited".to_string(),
    }
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
                    @let (used, guaranteed) = (q.used_gpus, q.guaranteed_gpus);
                    tr {
                        @if i == 0 {
                            td rowspan=(p.quota.len()) { a href={ "/queue?project=" (encode(&p.name)) } { (p.name) } }
                            td rowspan=(p.quota.len()) { (p.cohort.as_deref().unwrap_or("–")) }
                        }
                        td { (q.model) }
                        td.num { a href="/api/v1/projects" { (guaranteed) } }
                        td.num { a href="/api/v1/projects" { (used) } }
                        td.num { a href="/api/v1/projects" { (gpus((used - guaranteed).max(0.0))) } }
                        td.num { a href="/api/v1/projects" { (gpus((guaranteed - used).max(0.0))) } }
                        td.num { (limit(p.cohort.is_some(), q.borrow_limit_gpus)) }
                        td.num { (limit(p.cohort.is_some(), q.lend_limit_gpus)) }
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
        (standing(data))
        h2 { "Ledger " a.note href="/api/v1/report" { "(JSON)" } }
        div.scroll { table {
            tr { th { "scope" } th.num { "allocated GPU-h" } th.num { "lost to pre-emption GPU-h" } th.num { "active GPU-h" } th.num { "measured GPU-h" } th.num { "idle GPU-h" } th.num { "useful GPU-h" } th.num { "goodput" } }
            @for r in &data.rows {
                tr {
                    td { (r.scope) }
                    td.num { a href="/api/v1/report" { (hours(r.allocated_gpu_hours)) } }
                    td.num { a href="/api/v1/report" { (hours(r.lost_gpu_hours)) } }
                    @if data.telemetry {
                        td.num { a href="/api/v1/report" { (hours(r.active_gpu_hours)) } }
                        td.num title="allocated time telemetry covered; the rest went unmeasured" { a href="/api/v1/report" { (hours(r.measured_gpu_hours)) } }
                        td.num { a href="/api/v1/report" { (hours(r.idle_allocated_gpu_hours)) } }
                        td.num { a href="/api/v1/report" { (hours(r.useful_gpu_hours)) } }
                        td.num { (r.goodput.map_or("–".to_string(), |g| format!("{:.0} %", g * 100.0))) }
                    } @else {
                        td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) }
                    }
                }
            }
        } }
        (chart(bars))
        (periods(data))
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

fn standing(data: &ProjectsData) -> Markup {
    let share = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.0} %", v * 100.0));
    html! {
        h2 #standing { "Fair-share standing" }
        p.note {
            "Who goes next: each cycle looks at one pending workload per project at a time. Projects whose next workload fits in their guarantee come first, then those that would borrow; within each group the lowest "
            strong { "standing" } " first. Standing = usage ÷ fair share, where usage is the GPUs held now plus the decayed average of the GPUs held lately (recent use counts most), and the fair share is the cohort's guarantee split by weight. "
            "Standing 1 means a project uses exactly its fair share; a project that used little lately goes before one that used much. Rank 1 is looked at first in the next cycle."
        }
        @if data.standings.is_empty() { p.nodata { "not computed yet (the daemon computes it every few seconds)" } } @else {
            div.scroll { table.standing {
                tr { th { "project" } th { "cohort" } th.num { "weight" } th.num { "fair share GPUs" } th.num { "held GPUs" } th.num { "decayed usage GPUs" }
                     th.num { "share of cohort usage" } th.num { "standing" } th { "next workload" } th.num { "rank in the next cycle" } }
                @for s in &data.standings {
                    tr {
                        td { a href={ "/queue?project=" (encode(&s.name)) } { (s.name) } }
                        td { (s.cohort.as_deref().unwrap_or("–")) }
                        td.num { (gpus(s.weight_milli as f64 / 1000.0)) " (" (share(Some(s.weight_fraction))) ")" }
                        td.num { (gpus(s.fair_share_shares / 1000.0)) }
                        td.num { a href="/api/v1/projects" { (gpus(s.allocated.0 as f64 / 1000.0)) } }
                        td.num { (gpus(s.decayed_shares / 1000.0)) }
                        td.num { (share(s.usage_fraction)) }
                        td.num { (s.standing.map_or("last (weight 0)".to_string(), |v| format!("{v:.2}"))) }
                        td { @match s.head_within_guarantee {
                            Some(true) => "fits its guarantee",
                            Some(false) if s.cohort.is_some() => "would borrow",
                            Some(false) => "waits for its own quota (no cohort to borrow from)",
                            None => span.nodata { "nothing pending" },
                        } }
                        td.num { @if let Some(rank) = s.rank { a href={ "/queue?project=" (encode(&s.name)) } { (rank) } } @else { "–" } }
                    }
                }
            } }
        }
    }
}

fn periods(data: &ProjectsData) -> Markup {
    let day = |ms: u64| crate::views::utc(ms).get(..10).unwrap_or_default().to_string();
    html! {
        h2 #periods { "Ledger per period" @if let Some(p) = &data.project { " — project " (p) } }
        p.note { "GPU-hours in each of the daemon's ledger periods (one UTC day), newest first, the last "
            (crate::view::PERIODS_MAX) " per scope, as of "
            @if let Some(at) = data.derived_at_ms { (crate::views::utc(at)) } @else { "–" }
            " (recomputed every 5 s, so today's row can trail the totals above by that much use). "
            @if data.project.is_some() { a href="/projects#periods" { "All projects" } } @else { "Pick a project to see only its periods." } }
        @if data.periods.is_empty() { p.nodata { "no periods yet" } } @else {
            div.scroll { table.periods {
                tr { th { "scope" } th { "period (UTC)" } th.num { "allocated GPU-h" } th.num { "active GPU-h" } th.num { "idle GPU-h" } th.num { "useful GPU-h" } th.num { "lost to pre-emption GPU-h" } }
                @for r in &data.periods {
                    tr {
                        td { @if let Some(p) = r.scope.strip_prefix("project:") {
                            a href={ "/projects?project=" (encode(p)) "#periods" } { (r.scope) }
                        } @else { (r.scope) } }
                        td { (day(r.start_ms)) }
                        td.num { a href="/api/v1/report" { (hours(r.allocated)) } }
                        @if data.telemetry {
                            td.num { (hours(r.active)) } td.num { (hours(r.idle)) } td.num { (hours(r.useful)) }
                        } @else {
                            td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) } td.num.nodata { (NO_TELEMETRY) }
                        }
                        td.num { (hours(r.lost)) }
                    }
                }
            } }
        }
    }
}
