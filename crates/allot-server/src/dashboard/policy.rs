//! Policy: the active policy (as `GET /api/v1/policy`) and a form that checks a candidate
//! policy against this daemon's inventory (as `POST /api/v1/policy/validate`; nothing changes).

use allot_api::{PolicyValidation, PolicyView};
use axum::extract::{Form, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::{Frame, Tab, html_response, layout, read_view, who};
use crate::api::AppState;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PolicyData {
    pub active: PolicyView,
    /// The candidate's text and what validation said, after a POST.
    pub candidate: Option<(String, PolicyValidation)>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CandidateForm {
    policy: String,
}

fn active(state: &AppState) -> Result<PolicyView, Box<Response>> {
    let view = read_view(state)?;
    Ok(PolicyView { source: view.policy_source.clone(), text: view.policy_text.clone() })
}

pub(crate) async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let active = match active(&state) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let data = PolicyData { active, candidate: None };
    html_response(
        axum::http::StatusCode::OK,
        &layout("Policy", &Frame::of(Tab::Policy, &principal), &render(&data)),
    )
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
    let active = match active(&state) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let nodes = state.nodes.clone();
    let text = form.policy;
    let checked = text.clone();
    let result = tokio::task::spawn_blocking(move || {
        crate::validate_policy_text("candidate policy", &checked, &nodes)
    })
    .await;
    let Ok(validation) = result else {
        return super::error_page(500, "the policy check stopped unexpectedly");
    };
    let data = PolicyData { active, candidate: Some((text, validation)) };
    html_response(
        axum::http::StatusCode::OK,
        &layout("Policy", &Frame::of(Tab::Policy, &principal), &render(&data)),
    )
}

pub(crate) fn render(data: &PolicyData) -> Markup {
    let candidate_text = data.candidate.as_ref().map_or("", |(t, _)| t.as_str());
    html! {
        h1 { "Policy" }
        h2 { "Check a candidate policy" }
        p.note { "Checked against this daemon's inventory, as " code { "allot policy validate" } " does; nothing is changed." }
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
        form method="post" action="/policy" {
            label for="policy" { "Candidate policy (YAML): paste the file" }
            textarea #policy name="policy" spellcheck="false" { (candidate_text) }
            p { button type="submit" { "Check" } }
        }
        h2 { "Active policy " a.note href="/api/v1/policy" { "(JSON)" } }
        p { "From " code { (data.active.source) } "." }
        pre { (data.active.text) }
    }
}
