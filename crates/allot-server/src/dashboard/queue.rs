//! Queue: pending workloads with their stage, typed reason, position in their project's queue,
//! estimated start (`derived.rs`) and age, and a cancel button for those the principal may act
//! on; filtered by project (`?project=NAME`), a page of rows at a time (`?offset=N`).

use std::collections::BTreeMap;

use allot_api::{Workload, WorkloadState};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::{
    Frame, ProjectQuery, QueryResult, Tab, actions, duration, encode, read_view, reason, respond,
    who,
};
use crate::state::AppState;
use crate::view::EtaView;

/// Rows per page: the page stays light with tens of thousands pending.
pub(crate) const PAGE_ROWS: usize = 200;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QueueRow {
    pub workload: Workload,
    /// 1-based, in its project's queue by submission time.
    pub position: usize,
    /// `None`: not estimated yet (the daemon has just started).
    pub eta: Option<EtaView>,
    /// The principal may cancel it.
    pub can_act: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QueueData {
    pub now_ms: u64,
    pub project: Option<String>,
    /// Projects the principal may see, with their pending counts.
    pub projects: Vec<(String, usize)>,
    /// Matching pending workloads in total (all pages).
    pub total: usize,
    pub offset: usize,
    /// This page's rows.
    pub rows: Vec<QueueRow>,
    /// Pending per reason code (all pages).
    pub by_reason: Vec<(String, usize)>,
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
        return super::error_page(400, "bad query: use ?project=NAME&offset=N");
    };
    let data = {
        let view = match read_view(&state) {
            Ok(v) => v,
            Err(r) => return *r,
        };
        let pending = view
            .workloads
            .values()
            .filter(|w| w.state == WorkloadState::Pending && principal.can_see(&w.project));
        let etas = &view.dashboard.derived.etas;
        build(super::now_ms(), pending, &view.projects, &principal, query.project, query.offset)
            .with_etas(etas)
    };
    let url = match &data.project {
        Some(p) => format!("/queue?project={}&offset={}", encode(p), data.offset),
        None => format!("/queue?offset={}", data.offset),
    };
    respond(&headers, "Queue", &Frame::of(Tab::Queue, &principal, &state), &url, render(&data))
}

pub(crate) fn build<'a>(
    now_ms: u64,
    pending: impl Iterator<Item = &'a Workload>,
    projects: &[allot_api::Project],
    principal: &crate::auth::Principal,
    project: Option<String>,
    offset: Option<usize>,
) -> QueueData {
    let mut all: Vec<&Workload> = pending.collect();
    all.sort_by_key(|w| (w.submitted_ms, w.id));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for w in &all {
        let position = {
            let n = seen.entry(w.project.as_str()).or_default();
            *n += 1;
            *n
        };
        if project.as_ref().is_some_and(|p| p != &w.project) {
            continue;
        }
        *by_reason
            .entry(w.reason_code.clone().unwrap_or_else(|| "undecided".into()))
            .or_default() += 1;
        rows.push(QueueRow {
            workload: (*w).clone(),
            position,
            eta: None,
            can_act: principal.can_act(&w.project),
        });
    }
    let total = rows.len();
    let offset = offset.unwrap_or(0).min(total);
    let rows: Vec<QueueRow> = rows.into_iter().skip(offset).take(PAGE_ROWS).collect();
    let mut by_reason: Vec<(String, usize)> = by_reason.into_iter().collect();
    by_reason.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    QueueData {
        now_ms,
        project,
        projects: projects
            .iter()
            .filter(|p| principal.can_see(&p.name))
            .map(|p| (p.name.clone(), seen.get(p.name.as_str()).copied().unwrap_or(0)))
            .collect(),
        total,
        offset,
        rows,
        by_reason,
    }
}

impl QueueData {
    /// Fills this page's estimated starts.
    pub(crate) fn with_etas(mut self, etas: &BTreeMap<u64, EtaView>) -> QueueData {
        for row in &mut self.rows {
            row.eta = etas.get(&row.workload.id).cloned();
        }
        self
    }
}

/// `≈ in 2 h 10 min (after #4 train reaches its max runtime)`, `≈ now (…)` or
/// `unknown: <reason>`.
pub(crate) fn eta_text(now_ms: u64, eta: Option<&EtaView>) -> String {
    match eta {
        None => "not estimated yet".to_string(),
        Some(EtaView { at_ms: Some(at), note }) if *at <= now_ms => format!("≈ now ({note})"),
        Some(EtaView { at_ms: Some(at), note }) => {
            format!("≈ in {} ({note})", duration(at - now_ms))
        }
        Some(EtaView { at_ms: None, note }) => format!("unknown: {note}"),
    }
}

fn stage(w: &Workload) -> String {
    if w.attempt == 0 {
        "waiting for its first run".into()
    } else {
        format!("requeued after run {}", w.attempt)
    }
}

pub(crate) fn render(data: &QueueData) -> Markup {
    let filter =
        data.project.as_ref().map(|p| format!("project={}&", encode(p))).unwrap_or_default();
    let api = match &data.project {
        Some(p) => format!("/api/v1/workloads?state=pending&project={}", encode(p)),
        None => "/api/v1/workloads?state=pending".to_string(),
    };
    let back = format!("/queue?{filter}offset={}", data.offset);
    html! {
        h1 { "Queue" @if let Some(p) = &data.project { " — project " (p) } }
        p {
            "Projects: "
            a href="/queue" class=[data.project.is_none().then_some("here")] { "all" }
            @for (name, n) in &data.projects {
                " · " a href={ "/queue?project=" (encode(name)) } { (name) " (" (n) " pending)" }
            }
        }
        div.figures {
            div.figure { a href=(api) { span.n { (data.total) } } "pending" }
            @for (code, n) in &data.by_reason {
                div.figure { a href=(api) { span.n { (n) } } span.code { (code) } }
            }
        }
        @if data.rows.is_empty() {
            p.nodata { "Nothing is pending." }
        } @else {
            p.note { "Position: in its project's queue by submission time. The cycle orders projects by guarantee and fair share and, inside a project, by priority, then submission — see a workload's why for its exact place. "
                "Estimated start: what the next cycles would do if running work ended at its max runtime and nothing else changed (no new submissions, no idle reclaims); work without a max runtime has no known end." }
            div.scroll { table {
                tr { th { "workload" } th { "project" } th { "user" } th.num { "GPUs" } th { "stage" } th { "reason" } th.num { "position" } th { "estimated start" } th.num { "age" } th { "action" } }
                @for row in &data.rows {
                    @let w = &row.workload;
                    tr {
                        td { a href={ "/workload/" (w.id) } { "#" (w.id) " " (w.name) } }
                        td { a href={ "/queue?project=" (encode(&w.project)) } { (w.project) } }
                        td { (w.user) }
                        td.num { a href={ "/api/v1/workloads/" (w.id) } title=(if w.members > 1 { "members × GPUs each" } else { "GPUs" }) { (w.size()) } }
                        td { (stage(w)) }
                        td { (reason(w.reason_code.as_deref(), w.reason.as_deref())) " " a href={ "/api/v1/workloads/" (w.id) "/why" } { "why" } }
                        td.num { a href={ "/workload/" (w.id) } { (row.position) } }
                        td.eta { (eta_text(data.now_ms, row.eta.as_ref())) }
                        td.num { a href={ "/api/v1/workloads/" (w.id) } { (duration(data.now_ms.saturating_sub(w.submitted_ms))) } }
                        td { (actions::buttons(w, row.can_act, &back, &actions::CANCEL)) }
                    }
                }
            } }
            p.pager {
                "Rows " (data.offset + 1) "–" (data.offset + data.rows.len()) " of " (data.total) ". "
                @if data.offset > 0 { a href={ "/queue?" (filter) "offset=" (data.offset.saturating_sub(PAGE_ROWS)) } { "previous" } }
                @if data.offset + data.rows.len() < data.total { a href={ "/queue?" (filter) "offset=" (data.offset + PAGE_ROWS) } { "next" } }
            }
        }
    }
}
