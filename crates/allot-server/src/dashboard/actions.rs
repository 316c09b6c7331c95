//! Suspend, resume and cancel from the dashboard: plain HTML forms posting to
//! `/workload/{id}/{cancel|suspend|resume}`, which take the API's path (`Ask::Act` on
//! the main loop, the same role rules: members only on their projects, viewers never) and then
//! send the browser back to the page it came from.
//!
//! Cross-site requests: the session cookie is `SameSite=Strict`, and every dashboard POST must
//! also carry an `Origin` (or, without one, a `Referer`) naming this host (`same_origin`),
//! unless it is a script's, with the API's bearer header instead of the cookie.

use allot_api::{Role, Workload, WorkloadState};
use axum::body::Body;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::{error_page, http_error_page, who};
use crate::ask::{self, Ask};
use crate::state::AppState;

/// Refuses a POST whose `Origin` (else `Referer`) is not this host (`Host`), or that names
/// neither, unless it carries a bearer header: a form on another site cannot act with the
/// user's cookie.
pub(crate) async fn same_origin(request: Request<Body>, next: Next) -> Response {
    let authority = request.uri().authority().map(|a| a.as_str().to_string());
    // A bearer header is all a request is then authenticated by (the cookie is not read), and
    // another site's form cannot set one: scripts posting with it need no Origin.
    let scripted = super::bearer_token(request.headers()).is_some();
    if request.method() == Method::POST
        && !scripted
        && !is_same_origin(request.headers(), authority.as_deref())
    {
        return error_page(
            403,
            "cross-origin request refused: dashboard forms must be posted from this site \
             (the Origin or Referer header must name this host)",
        );
    }
    next.run(request).await
}

/// The `Origin` (or `Referer`) header's host and port equal the `Host` header (or, over
/// HTTP/2, the request's authority).
pub(crate) fn is_same_origin(headers: &HeaderMap, authority: Option<&str>) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).or(authority);
    let Some(host) = host else { return false };
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|v| v.to_str().ok());
    let Some(source) = source else { return false };
    // `scheme://host[:port][/path]`: the authority part.
    let Some((_, rest)) = source.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    !authority.is_empty() && authority.eq_ignore_ascii_case(host)
}

#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    /// Where to go afterwards: a path on this site (default: the workload's page).
    back: Option<String>,
}

/// What a button does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Cancel,
    Suspend,
    Resume,
}

impl Action {
    fn parse(text: &str) -> Option<Action> {
        match text {
            "cancel" => Some(Action::Cancel),
            "suspend" => Some(Action::Suspend),
            "resume" => Some(Action::Resume),
            _ => None,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Suspend => "suspend",
            Action::Resume => "resume",
        }
    }

    fn asked(self) -> ask::Action {
        match self {
            Action::Cancel => ask::Action::Cancel,
            Action::Suspend => ask::Action::Suspend,
            Action::Resume => ask::Action::Resume,
        }
    }

    /// Whether the button is offered for a workload in this state (the loop checks again).
    fn offered(self, state: WorkloadState) -> bool {
        match self {
            Action::Cancel => !state.is_final(),
            Action::Suspend => matches!(
                state,
                WorkloadState::Pending | WorkloadState::Starting | WorkloadState::Running
            ),
            Action::Resume => state == WorkloadState::Suspended,
        }
    }
}

pub(crate) async fn act(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(u64, String)>, axum::extract::rejection::PathRejection>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let Ok(Path((id, word))) = path else {
        return error_page(400, "post to /workload/ID/cancel, /suspend or /resume");
    };
    let Some(action) = Action::parse(&word) else {
        return error_page(404, &format!("no action {word:?}: use cancel, suspend or resume"));
    };
    if principal.role == Role::Viewer {
        return error_page(
            403,
            &format!("{} has a viewer token: it changes nothing", principal.name),
        );
    }
    let back = form
        .ok()
        .and_then(|Form(f)| f.back)
        .filter(|b| b.starts_with('/') && !b.starts_with("//") && !b.contains('\\'))
        .unwrap_or_else(|| format!("/workload/{id}"));
    match state.handle.act(Ask::Act { principal, id, action: action.asked() }).await {
        Ok(_) => (StatusCode::SEE_OTHER, [(header::LOCATION, back)]).into_response(),
        Err(e) => http_error_page(&e),
    }
}

/// The buttons this principal may use on this workload now; nothing for viewers and for
/// members outside its project. `back`: the page to return to.
pub(crate) fn buttons(
    w: &Workload,
    principal_may_act: bool,
    back: &str,
    only: &[Action],
) -> Markup {
    html! {
        @if principal_may_act {
            @for action in only.iter().copied().filter(|a| a.offered(w.state)) {
                form.inline.action method="post" action={ "/workload/" (w.id) "/" (action.word()) } {
                    input type="hidden" name="back" value=(back);
                    button type="submit" name="do" value=(action.word())
                        data-action=(action.word()) data-workload=(w.id) { (action.word()) }
                }
                " "
            }
        }
    }
}

pub(crate) const ALL: [Action; 3] = [Action::Suspend, Action::Resume, Action::Cancel];
pub(crate) const CANCEL: [Action; 1] = [Action::Cancel];
