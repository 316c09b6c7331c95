//! The REST API under `/api/v1` (axum), its OpenAPI document (utoipa), `/metrics` and
//! `/healthz`. Handlers authenticate, read the view or ask the main loop, and turn every
//! failure into an `ApiError` body with a 4xx/5xx status — never a panic, never a plain-text
//! rejection from the framework.

use allot_api::{
    API_PREFIX, ApiError, HistoryExport, NodeList, PolicyHistory, PolicyValidation, PolicyVersion,
    PolicyView, ProjectList, Report, ShadowReport, SubmitRequest, SubmitResponse, TelemetryPost,
    TokenCreated, TokenRequest, Why, Workload, WorkloadList, WorkloadState, limits,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use utoipa::OpenApi;

use crate::ask::{Action, Ask};
use crate::auth::Principal;
use crate::metrics::CONTENT_TYPE;
use crate::os::wall_ms;
use crate::state::AppState;
use crate::view::HttpError;

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body)).into_response()
    }
}

type ApiResult<T> = Result<T, HttpError>;

fn id_of(id: Result<Path<u64>, PathRejection>) -> ApiResult<u64> {
    id.map(|Path(id)| id).map_err(|e| {
        HttpError::new(
            400,
            ApiError {
                error: format!("bad workload id: {e}"),
                field: Some("id".into()),
                fix: Some("workload ids are whole numbers, as `allot ls` shows them".into()),
            },
        )
    })
}

fn bytes_of(body: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    body.map_err(|e| {
        let status = e.status().as_u16();
        let fix = if status == 413 {
            format!("send at most {} bytes", limits::BODY_BYTES_MAX)
        } else {
            "send the body again".to_string()
        };
        HttpError::plain(status, format!("cannot read the request body: {e}"), Some(fix.as_str()))
    })
}

fn principal(state: &AppState, headers: &HeaderMap) -> ApiResult<Principal> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(HttpError::plain(
            401,
            "no token",
            Some("send `Authorization: Bearer TOKEN` (ALLOT_TOKEN for the CLI)"),
        ));
    };
    let token = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    token.and_then(|t| state.tokens.principal(t)).ok_or_else(|| {
        HttpError::plain(
            401,
            "unknown or revoked token",
            Some("create one with `allot token create`"),
        )
    })
}

/// The field a JSON body error is about: serde's path, with a missing field's name added
/// (serde reports it at its parent); none for a syntax error (path `?`) or the whole body.
fn error_field(path: &str, message: &str) -> Option<String> {
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name);
    match (path, missing) {
        ("?", _) => None,
        (".", Some(name)) => Some(name.to_string()),
        (".", None) => None,
        (parent, Some(name)) => Some(format!("{parent}.{name}")),
        (path, None) => Some(path.to_string()),
    }
}

/// Parses a JSON body into `T`, naming the field at fault (serde's path) on failure.
fn json_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    let invalid = |error: String, field: Option<String>| {
        HttpError::new(
            400,
            ApiError {
                error: format!("invalid JSON body: {error}"),
                field,
                fix: Some("see /api/v1/openapi.json for the request's fields".into()),
            },
        )
    };
    let refuse = |e: serde_path_to_error::Error<serde_json::Error>| {
        let message = e.inner().to_string();
        invalid(message.clone(), error_field(&e.path().to_string(), &message))
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let direct: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = match direct {
        Ok(value) => value,
        Err(e) => {
            // JSON has one kind of number: `104.0` is the integer 104 to JSON Schema (and to
            // the OpenAPI document), so an integer field written with a fraction of zero is
            // read again with such numbers made integers. Only then: the first reading keeps
            // line and column in its errors and refuses duplicate fields.
            let tree = (e.inner().to_string())
                .starts_with("invalid type: floating point")
                .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
                .flatten()
                .and_then(|mut tree| integral_numbers_as_integers(&mut tree).then_some(tree));
            let Some(tree) = tree else { return Err(refuse(e)) };
            return serde_path_to_error::deserialize(tree).map_err(refuse);
        }
    };
    de.end().map_err(|e| invalid(e.to_string(), None))?;
    Ok(value)
}

/// Makes every number with no fractional part (and exact in an `f64`) an integer; true if
/// it changed any.
fn integral_numbers_as_integers(tree: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match tree {
        Value::Number(n) if n.is_f64() => {
            let Some(x) = n.as_f64().filter(|x| x.fract() == 0.0 && x.abs() <= EXACT) else {
                return false;
            };
            // Exact by the filter above: |x| <= 2^53 and whole.
            #[allow(clippy::cast_possible_truncation)]
            let whole = x as i64;
            *tree = Value::from(whole);
            true
        }
        Value::Array(items) => {
            items.iter_mut().fold(false, |c, v| integral_numbers_as_integers(v) | c)
        }
        Value::Object(fields) => {
            fields.values_mut().fold(false, |c, v| integral_numbers_as_integers(v) | c)
        }
        _ => false,
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only this project's workloads.
    project: Option<String>,
    /// Only workloads in this state.
    state: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogQuery {
    /// Gang member (default 0).
    member: Option<u32>,
    /// Only the last this many bytes (default 64 KiB, at most 16 MiB).
    tail_bytes: Option<u64>,
    /// Which run's output, 1 for the first (default: the latest). Each run keeps its own.
    attempt: Option<u32>,
}

#[utoipa::path(post, path = "/api/v1/workloads", request_body = SubmitRequest,
    responses((status = 201, body = SubmitResponse), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError),
        (status = 422, description = "the request names what the policy does not have (project, class, GPU model), or its fields disagree", body = ApiError)),
    security(("bearer" = [])))]
async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<SubmitResponse>)> {
    let body = bytes_of(body)?;
    let principal = principal(&state, &headers)?;
    let request: SubmitRequest = json_body(&body)?;
    if let Some(check) = &state.submitter_check {
        // Work runs as its submitter's Unix account here: refuse now what could never start.
        check(&principal.name).map_err(|e| {
            HttpError::plain(
                422,
                e,
                Some("an admin creates the account, or gives you a token named like yours"),
            )
        })?;
    }
    let ask = Ask::Submit { principal, request: Box::new(request), received_ms: wall_ms() };
    let response = state.handle.submit(ask).await?;
    Ok((StatusCode::CREATED, axum::Json(response)))
}

#[utoipa::path(get, path = "/api/v1/workloads", params(ListQuery),
    responses((status = 200, body = WorkloadList), (status = 401, body = ApiError)), security(("bearer" = [])))]
async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<axum::Json<WorkloadList>> {
    let principal = principal(&state, &headers)?;
    let Query(query) = query.map_err(|e| {
        HttpError::plain(400, format!("invalid query: {e}"), Some("use ?project=NAME&state=STATE"))
    })?;
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    let workloads = view
        .workloads
        .values()
        .filter(|w| principal.can_see(&w.project))
        .filter(|w| query.project.as_ref().is_none_or(|p| &w.project == p))
        .filter(|w| query.state.as_ref().is_none_or(|s| w.state.as_str() == s))
        .cloned()
        .collect();
    Ok(axum::Json(WorkloadList { workloads }))
}

fn visible(state: &AppState, principal: &Principal, id: u64) -> ApiResult<Workload> {
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    let Some(w) = view.workloads.get(&id) else {
        return Err(HttpError::plain(
            404,
            format!("no workload {id}"),
            Some("list workloads with `allot ls`"),
        ));
    };
    if !principal.can_see(&w.project) {
        return Err(HttpError::plain(
            403,
            format!("{} may not see project {:?}", principal.name, w.project),
            Some("use a token of that project's member"),
        ));
    }
    Ok(w.clone())
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 404, body = ApiError), (status = 403, body = ApiError)), security(("bearer" = [])))]
async fn get_workload(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Workload>> {
    let id = id_of(id)?;
    let principal = principal(&state, &headers)?;
    visible(&state, &principal, id).map(axum::Json)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/why", params(("id" = u64, Path)),
    responses((status = 200, body = Why), (status = 404, body = ApiError)), security(("bearer" = [])))]
async fn why(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Why>> {
    let id = id_of(id)?;
    let principal = principal(&state, &headers)?;
    let mut why = state.handle.why(Ask::Why { principal, id }).await?;
    let placed = matches!(
        why.state,
        WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping
    );
    if placed && let Some(isolation) = &state.isolation {
        why.lines.push(format!("Isolation: it {isolation}."));
        let gpus = state
            .handle
            .view
            .read()
            .ok()
            .and_then(|v| v.workloads.get(&id).map(|w| w.gpus.clone()));
        if gpus.is_some_and(|g| g.parse::<f64>().is_ok_and(|n| n.fract() != 0.0)) {
            why.lines.push(
                "It holds a time-sliced share of a GPU: the programs sharing that GPU are not \
                 isolated from each other's memory use or faults (a MIG instance would be)."
                    .to_string(),
            );
        }
    }
    Ok(axum::Json(why))
}

async fn act(
    state: AppState,
    headers: HeaderMap,
    id: u64,
    action: Action,
) -> ApiResult<axum::Json<Workload>> {
    let principal = principal(&state, &headers)?;
    if principal.role == allot_api::Role::Viewer {
        return Err(HttpError::plain(
            403,
            format!("{} has a viewer token: it changes nothing", principal.name),
            Some("use a member or admin token"),
        ));
    }
    state.handle.act(Ask::Act { principal, id, action }).await.map(axum::Json)
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/cancel", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 403, description = "a viewer token, or another project's workload", body = ApiError),
        (status = 409, description = "the workload's state does not allow it", body = ApiError)), security(("bearer" = [])))]
async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Workload>> {
    let id = id_of(id)?;
    act(state, headers, id, Action::Cancel).await
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/suspend", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 403, description = "a viewer token, or another project's workload", body = ApiError),
        (status = 409, description = "the workload's state does not allow it", body = ApiError)), security(("bearer" = [])))]
async fn suspend(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Workload>> {
    let id = id_of(id)?;
    act(state, headers, id, Action::Suspend).await
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/resume", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 403, description = "a viewer token, or another project's workload", body = ApiError),
        (status = 409, description = "the workload's state does not allow it", body = ApiError)), security(("bearer" = [])))]
async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Workload>> {
    let id = id_of(id)?;
    act(state, headers, id, Action::Resume).await
}

/// The workload reports a checkpoint made now (a program may instead touch the file in
/// `$ALLOT_CHECKPOINT_FILE`): a stop then loses only the work after it.
#[utoipa::path(post, path = "/api/v1/workloads/{id}/checkpoint", params(("id" = u64, Path)),
    responses((status = 200, body = Workload), (status = 403, description = "a viewer token, or another project's workload", body = ApiError),
        (status = 409, description = "the workload's state does not allow it", body = ApiError)), security(("bearer" = [])))]
async fn checkpoint(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
) -> ApiResult<axum::Json<Workload>> {
    let id = id_of(id)?;
    act(state, headers, id, Action::Checkpoint { at_ms: wall_ms() }).await
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/logs", params(("id" = u64, Path), LogQuery),
    responses((status = 200, body = String, content_type = "text/plain"), (status = 404, body = ApiError)), security(("bearer" = [])))]
async fn logs(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Result<Path<u64>, PathRejection>,
    query: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let id = id_of(id)?;
    let principal = principal(&state, &headers)?;
    let Query(query) = query.map_err(|e| {
        HttpError::plain(
            400,
            format!("invalid query: {e}"),
            Some("use ?member=N&tail_bytes=B&attempt=A"),
        )
    })?;
    let w = visible(&state, &principal, id)?;
    if w.attempt == 0 {
        return Err(HttpError::plain(
            404,
            format!("workload {id} has not started yet: no logs"),
            Some("see `allot why`"),
        ));
    }
    let member = query.member.unwrap_or(0);
    if member >= w.members {
        return Err(HttpError::plain(
            404,
            format!("workload {id} has no member {member}"),
            Some(&format!("its members are numbered 0 to {}", w.members.saturating_sub(1))),
        ));
    }
    // The attempt's directory is the workload's own: read through the daemon's `logs/` without
    // following any link the workload may have put there.
    let trusted =
        allot_backend::files::WorkloadFiles::new(&state.workload_dir, id).dir.join("logs");
    let attempt = query.attempt.unwrap_or(w.attempt);
    if !(1..=w.attempt).contains(&attempt) {
        let runs = if w.attempt == 1 { "1 run".to_string() } else { format!("{} runs", w.attempt) };
        return Err(HttpError::plain(
            404,
            format!("workload {id} has no attempt {attempt}: it has had {runs}"),
            Some(&format!("ask for an attempt from 1 to {}", w.attempt)),
        ));
    }
    let relative =
        std::path::PathBuf::from(attempt.to_string()).join(format!("member-{member}.log"));
    let tail = query.tail_bytes.unwrap_or(64 * 1024);
    if tail > limits::LOG_TAIL_BYTES_MAX {
        return Err(HttpError::new(
            400,
            ApiError {
                error: format!("tail_bytes {tail} is above {}", limits::LOG_TAIL_BYTES_MAX),
                field: Some("tail_bytes".into()),
                fix: Some(format!("ask for at most {} bytes (16 MiB)", limits::LOG_TAIL_BYTES_MAX)),
            },
        ));
    }
    // An earlier attempt did start (a later one exists); the latest may not have yet.
    let started = attempt < w.attempt || w.started_ms.is_some();
    let text = tokio::task::spawn_blocking(move || read_tail(&trusted, &relative, tail))
        .await
        .map_err(|e| HttpError::plain(500, format!("reading logs: {e}"), None))?
        .map_err(|_| {
            // Not the daemon's own path: the user cannot act on it, and it is not theirs.
            let fix = if started {
                "a member that has written nothing yet has no log".to_string()
            } else {
                format!("attempt {attempt} never started: see `allot why {id}`")
            };
            HttpError::plain(
                404,
                format!("no log for member {member} of workload {id}, attempt {attempt}"),
                Some(&fix),
            )
        })?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

fn read_tail(
    trusted: &std::path::Path,
    relative: &std::path::Path,
    tail: u64,
) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = allot_backend::files::open_workload_file(trusted, relative, None)?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(tail))).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    file.take(tail).read_to_end(&mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

#[utoipa::path(get, path = "/api/v1/projects", responses((status = 200, body = ProjectList)), security(("bearer" = [])))]
async fn projects(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<ProjectList>> {
    let principal = principal(&state, &headers)?;
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    let projects = view.projects.iter().filter(|p| principal.can_see(&p.name)).cloned().collect();
    Ok(axum::Json(ProjectList { projects }))
}

#[utoipa::path(get, path = "/api/v1/nodes", responses((status = 200, body = NodeList)), security(("bearer" = [])))]
async fn nodes(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<NodeList>> {
    let principal = principal(&state, &headers)?;
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    let mut nodes = view.nodes.clone();
    if principal.role == allot_api::Role::Member {
        // Members see the devices, not which other projects' workloads hold them.
        let mine: std::collections::BTreeSet<u64> = view
            .workloads
            .values()
            .filter(|w| principal.can_see(&w.project))
            .map(|w| w.id)
            .collect();
        for n in &mut nodes {
            for d in &mut n.devices {
                d.workloads.retain(|id| mine.contains(id));
            }
        }
    }
    Ok(axum::Json(NodeList {
        source: view.inventory_source.clone(),
        nodes,
        backend: view.backend.clone(),
        inventory_note: view.inventory_note.clone(),
    }))
}

#[utoipa::path(get, path = "/api/v1/report", responses((status = 200, body = Report)), security(("bearer" = [])))]
async fn report(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<Report>> {
    let principal = principal(&state, &headers)?;
    state.handle.report(Ask::Report { principal }).await.map(axum::Json)
}

#[utoipa::path(get, path = "/api/v1/policy", responses((status = 200, body = PolicyView)), security(("bearer" = [])))]
async fn policy(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<PolicyView>> {
    principal(&state, &headers)?;
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    Ok(axum::Json(PolicyView {
        source: view.policy_source.clone(),
        text: view.policy_text.clone(),
        version: view.policy_version(),
        rollout: view.rollout.clone(),
    }))
}

fn admin_only(principal: &Principal) -> ApiResult<()> {
    if principal.is_admin() {
        return Ok(());
    }
    Err(HttpError::plain(
        403,
        format!("{} is not an admin: only admins change the policy", principal.name),
        Some("ask an admin"),
    ))
}

/// Runs a candidate policy in shadow beside the active one (replacing a shadow already
/// running): at every decision cycle it decides over the same live work and what it would
/// have done differently is counted, never executed. 422 names every problem if it cannot
/// take the live work over now. Admins only.
#[utoipa::path(put, path = "/api/v1/policy/shadow", request_body(content = String, content_type = "application/yaml"),
    params(("source" = Option<String>, Query, description = "name of the candidate (its file)")),
    responses((status = 200, body = ShadowReport), (status = 403, body = ApiError), (status = 422, body = ApiError)),
    security(("bearer" = [])))]
async fn start_shadow(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ApplyQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<axum::Json<ShadowReport>> {
    let body = bytes_of(body)?;
    let principal = principal(&state, &headers)?;
    admin_only(&principal)?;
    let query = apply_query(query)?;
    let rollout_asked = query.scope.is_some()
        || query.rollback_if.is_some()
        || query.baseline.is_some()
        || query.false_reclaim_within.is_some()
        || query.min_sample.is_some();
    if rollout_asked {
        return Err(HttpError::plain(
            400,
            "a policy in shadow covers the whole fleet: it has no scope or rollback conditions",
            Some("drop `scope` and `rollback_if`, or apply it as a scoped rollout"),
        ));
    }
    let text = policy_text(&body)?.to_string();
    let source = query.source.unwrap_or_else(|| "shadow policy".to_string());
    let ask = Ask::StartShadow { source, text, by: principal.name.clone() };
    state.handle.shadow(ask).await.map(axum::Json)
}

/// What the policy in shadow would have done differently so far, per project. Viewers and
/// admins (it covers every project).
#[utoipa::path(get, path = "/api/v1/policy/shadow",
    responses((status = 200, body = ShadowReport), (status = 403, body = ApiError), (status = 404, body = ApiError)),
    security(("bearer" = [])))]
async fn shadow_report(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<ShadowReport>> {
    let principal = principal(&state, &headers)?;
    if principal.role == allot_api::Role::Member {
        return Err(HttpError::plain(
            403,
            format!(
                "{} is a project member: the shadow's report covers every project",
                principal.name
            ),
            Some("use a viewer or admin token"),
        ));
    }
    state.handle.shadow(Ask::ShadowReport).await.map(axum::Json)
}

/// Stops the policy in shadow; answers with its last report. Admins only.
#[utoipa::path(delete, path = "/api/v1/policy/shadow",
    responses((status = 200, body = ShadowReport), (status = 403, body = ApiError), (status = 404, body = ApiError)),
    security(("bearer" = [])))]
async fn stop_shadow(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<ShadowReport>> {
    let principal = principal(&state, &headers)?;
    admin_only(&principal)?;
    state.handle.shadow(Ask::StopShadow).await.map(axum::Json)
}

/// Every policy the daemon ran under, oldest first, with who applied each and when.
#[utoipa::path(get, path = "/api/v1/policy/versions", responses((status = 200, body = PolicyHistory)), security(("bearer" = [])))]
async fn policy_versions(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<axum::Json<PolicyHistory>> {
    principal(&state, &headers)?;
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    Ok(axum::Json(PolicyHistory {
        active: view.policy_version(),
        versions: view.policy_versions.clone(),
    }))
}

fn version_of(version: Result<Path<u32>, PathRejection>) -> ApiResult<u32> {
    version.map(|Path(v)| v).map_err(|e| {
        HttpError::new(
            400,
            ApiError {
                error: format!("bad policy version: {e}"),
                field: Some("version".into()),
                fix: Some(
                    "versions are whole numbers, as `allot policy history` shows them".into(),
                ),
            },
        )
    })
}

/// One policy of the history, by number.
fn stored_version(state: &AppState, version: u32) -> ApiResult<PolicyVersion> {
    let view =
        state.handle.view.read().map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
    let last = view.policy_version();
    view.policy_versions.iter().find(|v| v.version == version).cloned().ok_or_else(|| {
        HttpError::new(
            404,
            ApiError {
                error: format!("no policy version {version}: the versions are 1 to {last}"),
                field: Some("version".into()),
                fix: Some("pick one `allot policy history` lists".into()),
            },
        )
    })
}

#[utoipa::path(get, path = "/api/v1/policy/versions/{version}", params(("version" = u32, Path)),
    responses((status = 200, body = PolicyVersion), (status = 404, body = ApiError)), security(("bearer" = [])))]
async fn policy_version(
    State(state): State<AppState>,
    headers: HeaderMap,
    version: Result<Path<u32>, PathRejection>,
) -> ApiResult<axum::Json<PolicyVersion>> {
    let version = version_of(version)?;
    principal(&state, &headers)?;
    stored_version(&state, version).map(axum::Json)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackQuery {
    /// The version to bring back; default: the one before the active version.
    version: Option<u32>,
}

/// Brings back an earlier policy as a new version (live work moves to it as with `PUT
/// /api/v1/policy`, or 422 names every problem and nothing changes). Admins only.
#[utoipa::path(post, path = "/api/v1/policy/rollback",
    params(("version" = Option<u32>, Query, description = "the version to bring back (default: the one before the active version)")),
    responses((status = 200, body = PolicyView), (status = 403, body = ApiError), (status = 404, body = ApiError),
        (status = 409, body = ApiError), (status = 422, body = ApiError)),
    security(("bearer" = [])))]
async fn rollback_policy(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<RollbackQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<axum::Json<PolicyView>> {
    let principal = principal(&state, &headers)?;
    admin_only(&principal)?;
    let Query(query) = query.map_err(|e| {
        HttpError::new(
            400,
            ApiError {
                error: format!("bad query: {e}"),
                field: Some("version".into()),
                fix: Some(
                    "pass at most `?version=N`, N a version `allot policy history` lists".into(),
                ),
            },
        )
    })?;
    let active = {
        let view = state
            .handle
            .view
            .read()
            .map_err(|_| HttpError::plain(500, "view lock poisoned", None))?;
        view.policy_versions.last().cloned()
    };
    let active_version = active.as_ref().map_or(1, |v| v.version);
    let version = match query.version {
        Some(v) => v,
        None if active_version > 1 => active_version - 1,
        None => {
            return Err(HttpError::plain(
                409,
                "version 1 is in effect: there is no earlier policy to roll back to",
                Some("apply another policy with `allot policy apply FILE`"),
            ));
        }
    };
    let target = stored_version(&state, version)?;
    if active.as_ref().is_some_and(|a| a.text == target.text) {
        return Err(HttpError::plain(
            409,
            format!(
                "version {version} has the text of the policy in effect (version {active_version})"
            ),
            Some("pick another version from `allot policy history`"),
        ));
    }
    let whatif = state.whatifs.shown_for(&active.map(|a| a.text).unwrap_or_default(), &target.text);
    let ask = Ask::ApplyPolicy {
        source: format!("rollback to version {version} ({})", target.source),
        text: target.text,
        by: principal.name.clone(),
        rollback_of: Some(version),
        rollout: None,
        whatif,
    };
    state.handle.policy(ask).await.map(axum::Json)
}

/// Checks a candidate policy (its YAML text) as `allot policy validate` does: 200 with the
/// problems (file:line:col) whether or not it is valid; 400 if the body is not a mapping at all.
#[utoipa::path(post, path = "/api/v1/policy/validate", request_body(content = String, content_type = "application/yaml"),
    responses((status = 200, body = PolicyValidation)), security(("bearer" = [])))]
async fn validate_policy(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<axum::Json<PolicyValidation>> {
    let body = bytes_of(body)?;
    principal(&state, &headers)?;
    let text = policy_text(&body)?;
    Ok(axum::Json(crate::policy_check::validate_policy_text(
        "candidate policy",
        text,
        &state.node_specs(),
    )))
}

/// A policy body as text, if it is one at all: UTF-8, and a YAML mapping (or text whose syntax
/// error the validation reports with its position).
fn policy_text(body: &Bytes) -> ApiResult<&str> {
    let text = std::str::from_utf8(body).map_err(|_| {
        HttpError::plain(400, "the policy is not UTF-8 text", Some("send the YAML file as it is"))
    })?;
    if let Some(kind) = allot_config::not_a_mapping(text) {
        return Err(HttpError::new(
            400,
            ApiError {
                error: format!("the body is {kind}, not a policy"),
                field: Some("policy".into()),
                fix: Some(
                    "send the policy file: a YAML mapping with `priority_classes:`, \
                     `default_priority_class:` and `projects:` sections"
                        .into(),
                ),
            },
        ));
    }
    Ok(text)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyQuery {
    /// A name for the policy (the file it came from), shown by `allot policy show`.
    source: Option<String>,
    /// A scoped rollout: `project=NAME`, `pool=MODEL` or `kind=KIND`.
    scope: Option<String>,
    /// Rollback conditions, comma-separated: `p95_wait>1.5x,failure_rate>0.2`.
    rollback_if: Option<String>,
    /// The window before the rollout its figures are compared with (default 7d).
    baseline: Option<String>,
    /// An idle reclaim undone within this long was a false one (default 30m).
    false_reclaim_within: Option<String>,
    /// Observations a window needs before an average or percentile is judged (default 5).
    min_sample: Option<u64>,
}

/// The query of a policy upload (apply or shadow).
fn apply_query(
    query: Result<Query<ApplyQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<ApplyQuery> {
    let Query(query) = query.map_err(|e| {
        HttpError::new(
            400,
            ApiError {
                error: format!("bad query: {e}"),
                field: Some("source".into()),
                fix: Some(
                    "pass `?source=NAME`, and for a rollout `scope`, `rollback_if`, `baseline`, \
                     `false_reclaim_within`, `min_sample`"
                        .into(),
                ),
            },
        )
    })?;
    Ok(query)
}

/// The rollout a policy upload asks for, if any.
fn rollout_of(query: &ApplyQuery) -> ApiResult<Option<crate::ask::RolloutAsk>> {
    // Well-formed by the schema, wrong in meaning (a duration that is none, conditions without
    // a scope): a 422, as the daemon's own refusals of a rollout are.
    let bad = |field: &str, error: String, fix: &str| {
        HttpError::new(422, ApiError { error, field: Some(field.into()), fix: Some(fix.into()) })
    };
    let Some(scope) = query.scope.clone() else {
        if query.rollback_if.is_some()
            || query.baseline.is_some()
            || query.false_reclaim_within.is_some()
            || query.min_sample.is_some()
        {
            return Err(bad(
                "scope",
                "rollback conditions belong to a scoped rollout".into(),
                "add `scope=project=NAME` (or pool=MODEL, kind=KIND)",
            ));
        }
        return Ok(None);
    };
    let duration = |field: &str, text: Option<&String>, default: u64| match text {
        None => Ok(default),
        Some(t) => allot_config::duration_ms(t).map_err(|e| bad(field, e, "e.g. 7d, 24h or 30m")),
    };
    let conditions = query
        .rollback_if
        .as_deref()
        .map(|c| c.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect())
        .unwrap_or_default();
    let baseline_ms = duration("baseline", query.baseline.as_ref(), 7 * 86_400_000)?;
    if baseline_ms == 0 || baseline_ms > 30 * 86_400_000 {
        return Err(bad(
            "baseline",
            format!("baseline window must be in (0, 30d], got {}ms", baseline_ms),
            "e.g. 7d or 24h",
        ));
    }
    Ok(Some(crate::ask::RolloutAsk {
        scope,
        conditions,
        baseline_ms,
        false_reclaim_within_ms: duration(
            "false_reclaim_within",
            query.false_reclaim_within.as_ref(),
            30 * 60_000,
        )?,
        min_sample: query.min_sample.unwrap_or(5),
    }))
}

/// Applies a policy to the running daemon: live work moves to it (running work keeps its
/// devices), or, if it cannot, 422 names every problem and nothing changes. Admins only.
#[utoipa::path(put, path = "/api/v1/policy", request_body(content = String, content_type = "application/yaml"),
    params(("source" = Option<String>, Query, description = "name of the policy (its file)"),
        ("scope" = Option<String>, Query, description = "a scoped rollout: project=NAME, pool=MODEL or kind=KIND"),
        ("rollback_if" = Option<String>, Query, description = "rollback conditions, comma-separated: METRIC>LIMIT or METRIC>FACTORx"),
        ("baseline" = Option<String>, Query, description = "the window before the rollout to compare with (default 7d)"),
        ("false_reclaim_within" = Option<String>, Query, description = "an idle reclaim undone within this long is a false one (default 30m)"),
        ("min_sample" = Option<u64>, Query, description = "observations before an average or percentile is judged (default 5)")),
    responses((status = 200, body = PolicyView), (status = 403, body = ApiError), (status = 422, body = ApiError)),
    security(("bearer" = [])))]
async fn apply_policy(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ApplyQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<axum::Json<PolicyView>> {
    let body = bytes_of(body)?;
    let principal = principal(&state, &headers)?;
    admin_only(&principal)?;
    let query = apply_query(query)?;
    let rollout = rollout_of(&query)?;
    let text = policy_text(&body)?;
    let source = query.source.unwrap_or_else(|| "applied policy".to_string());
    let text = text.to_string();
    // What the dashboard showed for this text against the policy in effect stays with the
    // version it becomes.
    let active_text = state.handle.view.read().map(|v| v.policy_text.clone()).unwrap_or_default();
    let whatif = state.whatifs.shown_for(&active_text, &text);
    let ask = Ask::ApplyPolicy {
        source,
        text,
        by: principal.name.clone(),
        rollback_of: None,
        rollout,
        whatif,
    };
    state.handle.policy(ask).await.map(axum::Json)
}

/// Device readings from a node agent (`allot agent`); admins only (give agents an admin
/// token of their own). Attributed to running workloads at the next telemetry round.
#[utoipa::path(post, path = "/api/v1/telemetry", request_body = TelemetryPost,
    responses((status = 202), (status = 400, body = ApiError), (status = 403, body = ApiError)),
    security(("bearer" = [])))]
async fn post_telemetry(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let body = bytes_of(body)?;
    let principal = principal(&state, &headers)?;
    if !principal.is_admin() {
        return Err(HttpError::plain(
            403,
            format!("{} is not an admin: only admin tokens post telemetry", principal.name),
            Some("give the node agent an admin token (`allot token create --role admin`)"),
        ));
    }
    let post: TelemetryPost = json_body(&body)?;
    if post.samples.len() > limits::TELEMETRY_SAMPLES_MAX {
        return Err(HttpError::new(
            400,
            ApiError {
                error: format!(
                    "{} samples in one post, at most {}",
                    post.samples.len(),
                    limits::TELEMETRY_SAMPLES_MAX
                ),
                field: Some("samples".into()),
                fix: Some("post them in several requests".into()),
            },
        ));
    }
    let mut samples = Vec::with_capacity(post.samples.len());
    for (i, s) in post.samples.iter().enumerate() {
        samples.push(crate::telemetry::from_wire(s).map_err(|mut e| {
            e.field = e.field.map(|f| format!("samples[{i}].{f}"));
            HttpError::new(400, e)
        })?);
    }
    state.handle.post_samples(samples)?;
    Ok(StatusCode::ACCEPTED)
}

#[utoipa::path(post, path = "/api/v1/tokens", request_body = TokenRequest,
    responses((status = 201, body = TokenCreated), (status = 403, body = ApiError),
        (status = 422, description = "the projects do not fit the role, or name an unknown project", body = ApiError)), security(("bearer" = [])))]
async fn create_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<TokenCreated>)> {
    let body = bytes_of(body)?;
    let principal = principal(&state, &headers)?;
    if !principal.is_admin() {
        return Err(HttpError::plain(
            403,
            format!("{} is not an admin: only admins create tokens", principal.name),
            Some("ask an admin"),
        ));
    }
    let request: TokenRequest = json_body(&body)?;
    let projects: Vec<String> = state
        .handle
        .view
        .read()
        .map(|v| v.projects.iter().map(|p| p.name.clone()).collect())
        .unwrap_or_default();
    crate::auth::check_request(&request, &projects)?;
    let tokens = state.tokens.clone();
    let created = tokio::task::spawn_blocking(move || tokens.create(&request, wall_ms()))
        .await
        .map_err(|e| HttpError::plain(500, e.to_string(), None))?
        .map_err(|e| HttpError::plain(500, e.to_string(), None))?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let principal = principal(&state, &headers)?;
    if principal.role == allot_api::Role::Member {
        // The series name every project; a member sees only its own (GET /projects).
        return Err(HttpError::plain(
            403,
            format!("{} is a project member: /metrics covers every project", principal.name),
            Some("scrape with a viewer or admin token"),
        ));
    }
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], state.metrics.encode()).into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    /// Only the newest this many workloads (default and most: 100,000).
    limit: Option<usize>,
}

/// The workloads (ended, running, pending) as a job trace for `allot sim replay`, with the
/// inventory as a cluster file and the policy in effect. Viewers and admins: it covers every
/// project.
#[utoipa::path(get, path = "/api/v1/history", params(HistoryQuery),
    responses((status = 200, body = HistoryExport), (status = 403, body = ApiError)), security(("bearer" = [])))]
async fn history(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<axum::Json<HistoryExport>> {
    let principal = principal(&state, &headers)?;
    if principal.role == allot_api::Role::Member {
        return Err(HttpError::plain(
            403,
            format!("{} is a project member: the history covers every project", principal.name),
            Some("export with a viewer or admin token"),
        ));
    }
    let Query(query) = query.map_err(|e| {
        HttpError::new(
            400,
            ApiError {
                error: format!("invalid query: {e}"),
                field: Some("limit".into()),
                fix: Some(format!("use ?limit=N with N from 1 to {}", limits::HISTORY_JOBS_MAX)),
            },
        )
    })?;
    let limit = query.limit.unwrap_or(limits::HISTORY_JOBS_MAX);
    if limit == 0 || limit > limits::HISTORY_JOBS_MAX {
        return Err(HttpError::new(
            400,
            ApiError {
                error: format!("limit {limit} is out of range"),
                field: Some("limit".into()),
                fix: Some(format!("give 1 to {}", limits::HISTORY_JOBS_MAX)),
            },
        ));
    }
    state.handle.history(Ask::History { limit }).await.map(axum::Json)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn not_found() -> HttpError {
    HttpError::plain(404, "no such endpoint", Some("see /api/v1/openapi.json"))
}

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "allot", description = "GPU capacity orchestrator: quotas, queues, idle reclaim, goodput ledger."),
    paths(submit, list, get_workload, why, cancel, suspend, resume, checkpoint, logs, projects, nodes, report, policy, apply_policy, validate_policy, policy_versions, policy_version, rollback_policy, start_shadow, shadow_report, stop_shadow, post_telemetry, create_token, history),
    modifiers(&BearerScheme)
)]
pub(crate) struct ApiDoc;

/// The API's routes, `/metrics` and `/healthz`, with the JSON 404 for anything else (the
/// dashboard's pages and the OpenAPI document are merged beside them by `lib.rs`).
pub(crate) fn routes() -> Router<AppState> {
    let api = Router::new()
        .route("/workloads", post(submit).get(list))
        .route("/workloads/{id}", get(get_workload))
        .route("/workloads/{id}/why", get(why))
        .route("/workloads/{id}/cancel", post(cancel))
        .route("/workloads/{id}/suspend", post(suspend))
        .route("/workloads/{id}/resume", post(resume))
        .route("/workloads/{id}/checkpoint", post(checkpoint))
        .route("/workloads/{id}/logs", get(logs))
        .route("/projects", get(projects))
        .route("/nodes", get(nodes))
        .route("/report", get(report))
        .route("/history", get(history))
        .route("/policy", get(policy).put(apply_policy))
        .route("/policy/validate", post(validate_policy))
        .route("/policy/versions", get(policy_versions))
        .route("/policy/versions/{version}", get(policy_version))
        .route("/policy/rollback", post(rollback_policy))
        .route("/policy/shadow", get(shadow_report).put(start_shadow).delete(stop_shadow))
        .route("/tokens", post(create_token))
        .route("/telemetry", post(post_telemetry));
    Router::new()
        .nest(API_PREFIX, api)
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
}
