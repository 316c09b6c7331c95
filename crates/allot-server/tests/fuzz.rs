//! Fuzzing the request types through the router: any body, any field values — the answer is a
//! 201 or a 4xx with a JSON error, never a 5xx, never a panic. `ALLOT_PROPTEST_CASES` raises
//! the case count (CI's slow tier).

mod common;

use common::TestDaemon;
use proptest::prelude::*;
use serde_json::{Value, json};

const FIELDS: [&str; 20] = [
    "name",
    "project",
    "kind",
    "gpus",
    "mig",
    "members",
    "gpu_models",
    "priority_class",
    "cpu_millis",
    "memory_mib",
    "same_node",
    "preemptible",
    "checkpoint_grace_s",
    "min_runtime_s",
    "max_runtime_s",
    "command",
    "env",
    "role",
    "projects",
    "bogus",
];

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("JSON has no NaN", |f| f.is_finite()).prop_map(|f| json!(f)),
        prop_oneof![Just(0.5f64), Just(1.0), Just(-0.0), Just(1e-9), Just(7.0)]
            .prop_map(|f| json!(f)),
        "[a-z0-9.=_ -]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("vision"),
            Just("nlp"),
            Just("batch"),
            Just("1g.10gb"),
            Just("H100"),
            Just("sleep"),
            Just("\u{0}")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[A-Za-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::btree_map(prop::sample::select(FIELDS.to_vec()), value(), 0..8)
            .prop_map(|m| {
                let mut o: serde_json::Map<String, Value> = m.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                // Often a mostly valid request, so the checks past parsing are reached too.
                o.entry("project").or_insert(json!("vision"));
                o.entry("command").or_insert(json!(["true"]));
                Value::Object(o).to_string()
            }),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

#[test]
fn any_request_body_gets_a_201_or_a_4xx_json_error() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let d = TestDaemon::new();
    let paths = [
        "/api/v1/workloads",
        "/api/v1/tokens",
        "/api/v1/policy/validate",
        "/api/v1/workloads/1/cancel",
    ];
    proptest!(ProptestConfig::with_cases(cases()), |(body in body(), path in prop::sample::select(paths.to_vec()))| {
        let (status, v) = rt.block_on(d.call("POST", path, Some(&d.admin), Some(&body)));
        let code = status.as_u16();
        prop_assert!(code < 500, "{path} {body}: {code} {v}");
        if code >= 400 {
            prop_assert!(v["error"].is_string(), "{path} {body}: {code} {v}");
        }
    });
}
