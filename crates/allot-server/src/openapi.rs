//! The OpenAPI document as the API's contract. utoipa builds it from the handlers' and types'
//! annotations; this module adds what those cannot say, from the same `limits` the handlers
//! check: every bound a request is refused for with a 400, and the error responses every
//! operation can give (401 without a valid token, 400 for a malformed request, 404/403 on a
//! workload, 413 for a body too large). What only the live policy can judge (an unknown
//! project, a policy that fails validation) is a 422 and no bound here.
//! `schemathesis` checks the document against the running server in `.ci/run`.

use std::sync::OnceLock;

use allot_api::limits;
use serde_json::{Value, json};
use utoipa::OpenApi;

/// No C0 or C1 control character (Rust's `char::is_control`), said without `$`: a pattern
/// anchored with `$` also matches before a trailing newline in the checkers' regex engines.
/// (Under `not`, typed: a pattern alone would also hold for `null`, and `not` refuse it.)
fn printable() -> Value {
    json!({"type": "string", "pattern": "[\u{0}-\u{1f}\u{7f}-\u{9f}]"})
}

fn no_nul() -> Value {
    json!({"type": "string", "pattern": "\u{0}"})
}

/// Keywords added to a schema: `(pointer below the document, keywords)`.
fn bounds() -> Vec<(String, Value)> {
    let name = json!({"maxLength": limits::NAME_CHARS_MAX, "not": printable()});
    let duration = json!({"maximum": limits::DURATION_S_MAX});
    let index = json!({"maximum": limits::DEVICE_INDEX_MAX});
    let permille = json!({"maximum": 1000});
    let memory = json!({"maximum": limits::MEMORY_MIB_MAX});
    let submit = "/components/schemas/SubmitRequest/properties";
    let sample = "/components/schemas/TelemetrySample/properties";
    let http = "/components/schemas/Probe/oneOf/0/properties/http/properties";
    let exec = "/components/schemas/Probe/oneOf/1/properties/exec/properties";
    let at = |base: &str, field: &str| format!("{base}/{field}");
    let probe = |variant: usize| format!("/components/schemas/Probe/oneOf/{variant}");
    let closed = || json!({"additionalProperties": false});
    vec![
        (at(submit, "name"), name.clone()),
        (at(submit, "project"), name.clone()),
        (
            at(submit, "kind"),
            json!({"enum": ["training", "batch", "notebook", "inference", "service", null]}),
        ),
        (at(submit, "gpus"), json!({"minimum": 0, "maximum": limits::GPUS_PER_MEMBER_MAX})),
        (at(submit, "members"), json!({"minimum": 1, "maximum": limits::MEMBERS_MAX})),
        (at(submit, "cpu_millis"), json!({"maximum": limits::CPU_MILLIS_MAX})),
        (at(submit, "memory_mib"), memory.clone()),
        (at(submit, "checkpoint_grace_s"), duration.clone()),
        (at(submit, "min_runtime_s"), duration.clone()),
        (at(submit, "max_runtime_s"), json!({"minimum": 1, "maximum": limits::DURATION_S_MAX})),
        (at(submit, "command"), json!({"minItems": 1, "maxItems": limits::COMMAND_ARGS_MAX})),
        (at(submit, "command/items"), json!({"not": no_nul()})),
        (at(submit, "env"), json!({"maxProperties": limits::ENV_VARS_MAX})),
        // A letter or `_` first, then letters, digits and `_` only.
        (
            at(submit, "env/propertyNames"),
            json!({"pattern": "^[A-Za-z_]", "not": {"type": "string", "pattern": "[^A-Za-z0-9_]"}}),
        ),
        (at(submit, "env/additionalProperties"), json!({"not": no_nul()})),
        // A probe is one of its kinds, each with its fields only (serde's `deny_unknown_fields`
        // on the enum, which utoipa does not say for an enum's variants).
        (probe(0), closed()),
        (probe(1), closed()),
        (at(probe(0).as_str(), "properties/http"), closed()),
        (at(probe(1).as_str(), "properties/exec"), closed()),
        (at(http, "url"), json!({"pattern": "^https?://", "maxLength": limits::URL_CHARS_MAX})),
        // Empty, or starting with `/`.
        (
            at(http, "pointer"),
            json!({"not": {"type": "string", "pattern": "^[^/]"}, "maxLength": limits::POINTER_CHARS_MAX}),
        ),
        (at(exec, "command"), json!({"minItems": 1, "maxItems": limits::PROBE_ARGS_MAX})),
        (at(exec, "command/items"), json!({"not": no_nul()})),
        (at(sample, "hostname"), json!({"minLength": 1, "maxLength": limits::NAME_CHARS_MAX})),
        (at(sample, "gpu_index"), index.clone()),
        (at(sample, "mig_instance"), index.clone()),
        (at(sample, "amd_partition"), index),
        (at(sample, "at_ms"), json!({"maximum": limits::TIME_MS_MAX})),
        (at(sample, "utilisation"), permille.clone()),
        (at(sample, "sm_active"), permille.clone()),
        (at(sample, "engine_active"), permille),
        (at(sample, "memory_used_mib"), memory.clone()),
        (at(sample, "memory_total_mib"), memory),
        (
            "/components/schemas/TelemetryPost/properties/samples".to_string(),
            json!({"maxItems": limits::TELEMETRY_SAMPLES_MAX}),
        ),
        (
            "/components/schemas/TokenRequest/properties/name".to_string(),
            json!({"minLength": 1, "maxLength": limits::NAME_CHARS_MAX, "not": printable()}),
        ),
    ]
}

/// Query parameters' bounds: `(path, parameter, keywords)`.
fn parameter_bounds() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("/api/v1/history", "limit", json!({"minimum": 1, "maximum": limits::HISTORY_JOBS_MAX})),
        (
            "/api/v1/workloads/{id}/logs",
            "tail_bytes",
            json!({"maximum": limits::LOG_TAIL_BYTES_MAX}),
        ),
        ("/api/v1/workloads/{id}/logs", "member", json!({"maximum": limits::MEMBERS_MAX - 1})),
        ("/api/v1/workloads/{id}/logs", "attempt", json!({"minimum": 1})),
    ]
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiError"}}}
    })
}

/// The error responses every operation of its kind can give, where its annotation left them out.
fn add_error_responses(path: &str, operation: &mut Value) {
    let secured = operation.get("security").is_some();
    let has_input = operation.get("requestBody").is_some()
        || operation.get("parameters").and_then(Value::as_array).is_some_and(|p| !p.is_empty());
    let has_body = operation.get("requestBody").is_some();
    let on_workload = path.contains("{id}");
    let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    let mut add = |status: &str, description: &str| {
        let response = responses.entry(status).or_insert_with(|| error_response(description));
        if response["description"] == "" {
            response["description"] = description.into();
        }
    };
    if secured {
        add("401", "no token, or an unknown or revoked one");
    }
    if has_input {
        add("400", "a malformed request: the error names the field and the fix");
    }
    if on_workload {
        add("403", "the workload is another project's");
        add("404", "no such workload (or member, or log)");
    }
    if has_body {
        add("413", "the body is larger than the server accepts");
    }
}

/// The document with the bounds and error responses added; the pointers that matched nothing
/// (a renamed field), which the tests require to be none.
pub(crate) fn build() -> (Value, Vec<String>) {
    let mut doc = serde_json::to_value(crate::api::ApiDoc::openapi()).unwrap_or(Value::Null);
    let mut missing = Vec::new();
    for (pointer, keywords) in bounds() {
        match (doc.pointer_mut(&pointer), keywords) {
            (Some(Value::Object(schema)), Value::Object(keywords)) => schema.extend(keywords),
            _ => missing.push(pointer),
        }
    }
    for (path, name, keywords) in parameter_bounds() {
        let parameters = doc.pointer_mut(&format!("/paths/{}/get/parameters", escape(path)));
        let schema = parameters.and_then(Value::as_array_mut).and_then(|list| {
            list.iter_mut().find(|p| p["name"] == name).and_then(|p| p.get_mut("schema"))
        });
        match (schema, keywords) {
            (Some(Value::Object(schema)), Value::Object(keywords)) => schema.extend(keywords),
            _ => missing.push(format!("{path} ?{name}")),
        }
    }
    // What a submission's answer leads to: the workload's own operations, by its id.
    let submitted = "/paths/~1api~1v1~1workloads/post/responses/201";
    match doc.pointer_mut(submitted).and_then(Value::as_object_mut) {
        Some(response) => {
            response.insert("description".into(), "submitted: the workload's id and state".into());
            response.insert("links".into(), workload_links());
        }
        None => missing.push(submitted.to_string()),
    }
    // One request that the embedded default policy admits, for clients and test generators.
    let body = "/paths/~1api~1v1~1workloads/post/requestBody/content/application~1json";
    match doc.pointer_mut(body).and_then(Value::as_object_mut) {
        Some(media) => {
            media.insert(
                "example".into(),
                json!({"project": "vision", "kind": "batch", "gpus": 1, "command": ["sleep", "30"]}),
            );
        }
        None => missing.push(body.to_string()),
    }
    // A policy travels as YAML text but is a mapping of fields: anything else is a 400.
    for operation in [
        "/paths/~1api~1v1~1policy/put",
        "/paths/~1api~1v1~1policy~1validate/post",
        "/paths/~1api~1v1~1policy~1shadow/put",
    ] {
        let pointer = format!("{operation}/requestBody/content/application~1yaml/schema");
        match doc.pointer_mut(&pointer) {
            Some(schema) => *schema = json!({"type": "object"}),
            None => missing.push(pointer),
        }
    }
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            if let Some(methods) = item.as_object_mut() {
                for operation in methods.values_mut() {
                    add_error_responses(path, operation);
                }
            }
        }
    }
    (doc, missing)
}

/// OpenAPI links from a submission's answer to every operation on the workload it made.
fn workload_links() -> Value {
    let by_id = |operation: &str| json!({"operationId": operation, "parameters": {"id": "$response.body#/id"}});
    let operations = ["get_workload", "why", "logs", "cancel", "suspend", "resume", "checkpoint"];
    Value::Object(operations.iter().map(|op| ((*op).to_string(), by_id(op))).collect())
}

/// A JSON pointer's escaping of one path segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Where the document is served (`lib.rs` routes it beside the API).
pub(crate) const PATH: &str = "/api/v1/openapi.json";

/// The document as served (built once).
pub(crate) fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| serde_json::to_string_pretty(&build().0).unwrap_or_default())
}

/// `GET /api/v1/openapi.json`: no token needed, like `/healthz`.
pub(crate) async fn serve() -> axum::response::Response {
    use axum::response::IntoResponse;
    ([(axum::http::header::CONTENT_TYPE, "application/json")], document()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bound_finds_its_field() {
        let (doc, missing) = build();
        assert!(missing.is_empty(), "bounds for fields the document does not have: {missing:?}");
        assert_eq!(
            doc["paths"]["/api/v1/workloads"]["post"]["responses"]["401"]["description"],
            "no token, or an unknown or revoked one"
        );
    }

    #[test]
    fn every_link_leads_to_an_operation() {
        let (doc, _) = build();
        let operations: Vec<&Value> = doc["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(_, item)| {
                item.as_object().into_iter().flatten().map(|(_, o)| &o["operationId"])
            })
            .collect();
        let links = &doc["paths"]["/api/v1/workloads"]["post"]["responses"]["201"]["links"];
        let links = links.as_object().expect("links");
        assert_eq!(links.len(), 7);
        for link in links.values() {
            assert!(operations.contains(&&link["operationId"]), "{link}");
        }
    }

    #[test]
    fn query_parameters_are_in_the_query() {
        let (doc, _) = build();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for operation in item.as_object().into_iter().flatten().map(|(_, o)| o) {
                for p in operation["parameters"].as_array().into_iter().flatten() {
                    let expected =
                        if path.contains(&format!("{{{}}}", p["name"].as_str().unwrap_or(""))) {
                            "path"
                        } else {
                            "query"
                        };
                    assert_eq!(p["in"], expected, "{path}: {p}");
                }
            }
        }
    }
}
