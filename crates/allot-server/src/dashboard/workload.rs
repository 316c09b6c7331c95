//! One workload: `why` in full (what `GET /api/v1/workloads/{id}/why` returns), its estimated
//! start while pending, suspend/resume/cancel buttons for those who may act on it, its
//! timeline (kept with its record, so it survives restarts), its ledger row and a link to its
//! logs.

use allot_api::{LedgerRow, Why, Workload};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::{
    Frame, NO_TELEMETRY, Tab, duration, gpus, hours, http_error_page, read_view, reason, respond,
    who,
};
use crate::ask::Ask;
use crate::state::AppState;
use crate::view::EtaView;
use crate::view::Step;
use crate::views::utc;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WorkloadData {
    pub now_ms: u64,
    pub workload: Workload,
    pub why: Why,
    pub timeline: Vec<Step>,
    pub ledger: Option<LedgerRow>,
    /// Telemetry has had readings: active and useful hours are shown.
    pub telemetry: bool,
    /// Its estimated start, while pending (`None`: not pending, or not estimated yet).
    pub eta: Option<EtaView>,
    /// The principal may suspend, resume or cancel it.
    pub can_act: bool,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let Ok(Path(id)) = id else {
        return super::error_page(400, "workload ids are whole numbers, as `allot ls` shows them");
    };
    let (workload, timeline, telemetry, eta) = {
        let view = match read_view(&state) {
            Ok(v) => v,
            Err(r) => return *r,
        };
        let Some(w) = view.workloads.get(&id) else {
            return super::error_page(404, &format!("no workload {id}"));
        };
        if !principal.can_see(&w.project) {
            return super::error_page(
                403,
                &format!("{} may not see project {:?}", principal.name, w.project),
            );
        }
        (
            w.clone(),
            view.dashboard.timelines.get(&id).cloned().unwrap_or_default(),
            view.telemetry_seen,
            view.dashboard.derived.etas.get(&id).cloned(),
        )
    };
    let can_act = principal.can_act(&workload.project);
    let why = {
        let principal = principal.clone();
        match state.handle.why(Ask::Why { principal, id }).await {
            Ok(w) => w,
            Err(e) => return http_error_page(&e),
        }
    };
    let scope = format!("workload:{id}");
    // The report closes a copy of the whole ledger on the main loop: not asked for work that
    // never held GPUs (it has no allocation to show).
    let ledger = if workload.attempt == 0 {
        None
    } else {
        let principal = principal.clone();
        match state.handle.report(Ask::Report { principal }).await {
            Ok(report) => report.rows.into_iter().find(|r| r.scope == scope),
            Err(e) => return http_error_page(&e),
        }
    };
    let eta = eta.filter(|_| workload.state == allot_api::WorkloadState::Pending);
    let data = WorkloadData {
        now_ms: super::now_ms(),
        workload,
        why,
        timeline,
        ledger,
        telemetry,
        eta,
        can_act,
    };
    let url = format!("/workload/{id}");
    respond(
        &headers,
        &format!("#{id}"),
        &Frame::of(Tab::Workload, &principal, &state),
        &url,
        render(&data),
    )
}

pub(crate) fn render(data: &WorkloadData) -> Markup {
    let w = &data.workload;
    let api = format!("/api/v1/workloads/{}", w.id);
    let decision =
        data.why.decision.as_ref().map(|d| {
            serde_json::to_string_pretty(d).unwrap_or_else(|e| format!("unprintable: {e}"))
        });
    html! {
        h1 { "#" (w.id) " " (w.name) }
        div.figures {
            div.figure { a href=(api) { span.n { (w.state.as_str()) } } "state" }
            div.figure { a href={ "/queue?project=" (super::encode(&w.project)) } { span.n { (w.project) } } "project" }
            div.figure { a href=(api) { span.n { (w.size()) } } @if w.members > 1 { "members × GPUs each" } @else { "GPUs" } }
            div.figure { a href=(api) { span.n { (w.attempt) } } "runs so far" }
            div.figure { a href=(api) { span.n { (duration(data.now_ms.saturating_sub(w.submitted_ms))) } } "since submitted" }
        }
        p { "Last decision: " (reason(w.reason_code.as_deref(), w.reason.as_deref())) }
        @if w.state == allot_api::WorkloadState::Pending {
            p { "Estimated start: " span.eta { (super::queue::eta_text(data.now_ms, data.eta.as_ref())) } }
        }
        @if data.can_act {
            p.actions { (super::actions::buttons(w, true, &format!("/workload/{}", w.id), &super::actions::ALL)) }
        }
        @if !w.placement.is_empty() { p { "Placement: " code { (w.placement.join("; ")) } } }
        p { "User " (w.user) ", " (w.kind) ", command " code { (w.command.join(" ")) } "." }
        @if w.attempt > 0 {
            p { "Logs: " a href={ (api) "/logs" } { "member 0 of run " (w.attempt) } " (" code { "allot logs " (w.id) } ")" }
        } @else { p.note { "No logs: it has not started." } }

        h2 { "Why " a.note href={ (api) "/why" } { "(JSON)" } }
        ul { @for line in &data.why.lines { li { (line) } } }
        @if let Some(d) = decision { p { "What a cycle run now would decide:" } pre { (d) } }

        h2 { "Timeline" }
        @if data.timeline.is_empty() { p.nodata { "no steps recorded" } } @else {
            table {
                tr { th { "when (UTC)" } th { "step" } th { "reason" } }
                @for s in &data.timeline {
                    tr { td { (utc(s.at_ms)) } td { (s.what) } td { @if s.code.is_some() || s.detail.is_some() { (reason(s.code.as_deref(), s.detail.as_deref())) } } }
                }
            }
        }
        p.note { "Steps are kept with the workload's record and survive restarts (the first and the latest " (crate::view::TIMELINE_MAX) ")." }

        h2 { "Ledger " a.note href="/api/v1/report" { "(JSON)" } }
        @if let Some(row) = &data.ledger {
            table {
                tr { th.num { "allocated GPU-h" } th.num { "lost to pre-emption GPU-h" } th.num { "active GPU-h" } th.num { "useful GPU-h" } th.num { "goodput" } }
                tr {
                    td.num { a href="/api/v1/report" { (hours(row.allocated_gpu_hours)) } }
                    td.num { a href="/api/v1/report" { (hours(row.lost_gpu_hours)) } }
                    @if data.telemetry {
                        td.num { a href="/api/v1/report" { (hours(row.active_gpu_hours)) } }
                        td.num { a href="/api/v1/report" { (hours(row.useful_gpu_hours)) } }
                        td.num { (row.goodput.map_or("–".to_string(), |g| format!("{:.0} %", g * 100.0))) }
                    } @else {
                        td.num.nodata { (NO_TELEMETRY) }
                        td.num.nodata { (NO_TELEMETRY) }
                        td.num.nodata { (NO_TELEMETRY) }
                    }
                }
            }
        } @else { p.nodata { "no ledger row yet (it has held no GPUs)" } }
        p.note { "GPU-hours are GPUs × hours held; " (gpus(1.0)) " GPU for one hour is 1." }
    }
}
