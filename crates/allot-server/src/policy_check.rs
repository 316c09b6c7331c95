//! A candidate policy checked against the inventory, as `POST /policy/validate` and the
//! dashboard's policy page answer.

use allot_api::{ApiError, PolicyValidation};
use allot_core::{Engine, NodeSpec};

/// Checks a policy text against `nodes`, as `POST /policy/validate` answers.
pub(crate) fn validate_policy_text(name: &str, text: &str, nodes: &[NodeSpec]) -> PolicyValidation {
    match allot_config::parse_policy(name, text) {
        Err(diagnostics) => PolicyValidation {
            ok: false,
            summary: format!("{}: {} problem(s)", name, diagnostics.len()),
            problems: diagnostics
                .iter()
                .map(|d| ApiError {
                    error: format!("{}:{}:{}: {}", name, d.line, d.column, d.message),
                    field: Some(d.field.clone()),
                    fix: Some(d.fix.clone()),
                })
                .collect(),
        },
        Ok(policy) => match Engine::new(nodes, &policy) {
            Err(e) => PolicyValidation {
                ok: false,
                summary: format!("{name}: 1 problem"),
                problems: vec![ApiError { error: e.to_string(), field: None, fix: None }],
            },
            Ok(_) => PolicyValidation {
                ok: true,
                summary: format!(
                    "{name}: ok — {} projects, {} priority classes, {} idle rules",
                    policy.projects.len(),
                    policy.priority_classes.len(),
                    policy.idle.len()
                ),
                problems: Vec::new(),
            },
        },
    }
}
