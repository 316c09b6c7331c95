//! No input makes the parsers panic: arbitrary text, and the example files mutated by random
//! byte deletions, insertions and truncations.

use std::sync::OnceLock;

use allot_config::{Diagnostic, check_workloads, parse_cluster, parse_policy, parse_workloads};
use allot_core::{NodeSpec, PolicySpec};
use proptest::prelude::*;

const CLUSTER: &str = include_str!("../../../examples/cluster.yaml");
const POLICY: &str = include_str!("../../../examples/policy.yaml");
const WORKLOADS: &str = include_str!("../../../examples/workloads.yaml");
const IDLE_POLICIES: [&str; 3] = [
    include_str!("../../../examples/idle/allot.yaml"),
    include_str!("../../../examples/idle/amd_rm.yaml"),
    include_str!("../../../examples/idle/runai.yaml"),
];

/// Characters that matter to YAML and to our value formats, to reach deeper than random bytes.
const INTERESTING: &[u8] = b" \n\t-:{}[],'\"#&*!|>%@`~.0123456789eEmMGgiKkhds?";

#[derive(Clone, Debug)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, byte: u8 },
    TruncateLine { line: usize, keep: usize },
    DuplicateLine { line: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1usize..8).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), prop_oneof![any::<u8>(), prop::sample::select(INTERESTING)])
            .prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        (any::<usize>(), 0usize..40).prop_map(|(line, keep)| Mutation::TruncateLine { line, keep }),
        any::<usize>().prop_map(|line| Mutation::DuplicateLine { line }),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for m in mutations {
        match *m {
            Mutation::Delete { at, len } if !bytes.is_empty() => {
                let at = at % bytes.len();
                let end = (at + len).min(bytes.len());
                bytes.drain(at..end);
            }
            Mutation::Insert { at, byte } => {
                let at = at % (bytes.len() + 1);
                bytes.insert(at, byte);
            }
            Mutation::TruncateLine { line, keep } => {
                let mut lines: Vec<Vec<u8>> =
                    bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
                let i = line % lines.len();
                lines[i].truncate(keep);
                bytes = lines.join(&b'\n');
            }
            Mutation::DuplicateLine { line } => {
                let mut lines: Vec<Vec<u8>> =
                    bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
                let i = line % lines.len();
                lines.insert(i, lines[i].clone());
                bytes = lines.join(&b'\n');
            }
            Mutation::Delete { .. } => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Which parsers to run on a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Cluster,
    Policy,
    Workloads,
    All,
}

fn example_cluster() -> &'static [NodeSpec] {
    static NODES: OnceLock<Vec<NodeSpec>> = OnceLock::new();
    NODES.get_or_init(|| parse_cluster("c.yaml", CLUSTER).unwrap_or_default())
}

fn example_policy() -> Option<&'static PolicySpec> {
    static POLICY_SPEC: OnceLock<Option<PolicySpec>> = OnceLock::new();
    POLICY_SPEC.get_or_init(|| parse_policy("p.yaml", POLICY).ok()).as_ref()
}

fn check_diagnostics(result: Result<(), Vec<Diagnostic>>) {
    if let Err(diagnostics) = result {
        assert!(!diagnostics.is_empty());
        for d in &diagnostics {
            assert!(!d.message.is_empty());
            let _ = d.to_string();
        }
    }
}

/// Runs the entry points for `target`; any panic fails the property.
fn exercise(text: &str, target: Target) {
    let all = target == Target::All;
    if all || target == Target::Cluster {
        check_diagnostics(parse_cluster("c.yaml", text).map(|_| ()));
    }
    if all || target == Target::Policy {
        check_diagnostics(parse_policy("p.yaml", text).map(|_| ()));
    }
    if all || target == Target::Workloads {
        for name in ["w.yaml", "w.jsonl"] {
            let parsed = parse_workloads(name, text);
            if let (Ok(file), Some(policy)) = (&parsed, example_policy()) {
                let _ = check_workloads(file, policy, example_cluster());
            }
            check_diagnostics(parsed.map(|_| ()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        exercise(&text, Target::All);
    }

    #[test]
    fn yaml_shaped_text_never_panics(bytes in prop::collection::vec(prop::sample::select(INTERESTING), 0..200)) {
        exercise(&String::from_utf8_lossy(&bytes), Target::All);
    }

    #[test]
    fn mutated_examples_never_panic(
        which in 0usize..6,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let (base, target) = [
            (CLUSTER, Target::Cluster),
            (POLICY, Target::Policy),
            (WORKLOADS, Target::Workloads),
            (IDLE_POLICIES[0], Target::Policy),
            (IDLE_POLICIES[1], Target::Policy),
            (IDLE_POLICIES[2], Target::Policy),
        ][which];
        exercise(&mutate(base, &mutations), target);
    }
}

#[test]
fn pathological_inputs_are_reported_not_crashed_on() {
    let long_scalar = "a".repeat(100_000);
    let inputs = [
        "[".repeat(100_000),
        "{".repeat(100_000),
        "- ".repeat(10_000),
        format!("nodes: [{{name: {long_scalar}, cpu: 1, memory: 1}}]"),
        "nodes:\n  - {name: n, count: 100001, cpu: 1, memory: 1}\n".to_string(),
        "nodes: [{name: n, cpu: 1e9999, memory: 99999999999999999999Ti}]".to_string(),
        "\u{feff}nodes: []".to_string(),
        "\0\0\0".to_string(),
        "workloads: [{project: a, gpus: 1e-9999}]".to_string(),
    ];
    for text in &inputs {
        exercise(text, Target::All);
        assert!(parse_cluster("c.yaml", text).is_err());
    }
}
