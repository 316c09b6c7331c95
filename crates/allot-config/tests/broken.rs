//! Broken inputs: each mistake is reported with its line, field path and a fix — all at once.

use allot_config::{
    Diagnostic, check_workloads, parse_cluster, parse_policy, parse_workloads, render,
};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Cluster,
    Policy,
    Workloads,
}

fn diagnostics(kind: Kind, text: &str) -> Vec<Diagnostic> {
    let result = match kind {
        Kind::Cluster => parse_cluster("c.yaml", text).map(|_| ()),
        Kind::Policy => parse_policy("p.yaml", text).map(|_| ()),
        Kind::Workloads => parse_workloads("w.yaml", text).map(|_| ()),
    };
    match result {
        Ok(()) => Vec::new(),
        Err(diagnostics) => diagnostics,
    }
}

const POLICY_HEAD: &str = "\
priority_classes:
  - {name: low, value: -100}
  - {name: high, value: 100, preemptible: false}
default_priority_class: low
projects:
";

/// `(line, field)` of every diagnostic, and one message fragment, per case.
struct Case {
    name: &'static str,
    kind: Kind,
    text: String,
    want: Vec<(usize, &'static str, &'static str)>,
}

fn cases() -> Vec<Case> {
    let policy = |projects: &str| format!("{POLICY_HEAD}{projects}");
    vec![
        Case {
            name: "truncated file (unterminated flow mapping)",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    quotas:\n      - {model: A100, guaranteed: 4\n"),
            want: vec![(8, "projects[0].quotas[0]", "YAML syntax error")],
        },
        Case {
            name: "truncated file (unterminated quote)",
            kind: Kind::Cluster,
            text: "nodes:\n  - name: \"gpu-1\n    cpu: 4\n".to_string(),
            want: vec![(2, "nodes[0].name", "YAML syntax error")],
        },
        Case {
            name: "wrong type",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    weight: [1, 2]\n"),
            want: vec![(7, "projects[0].weight", "expected a single value, got a list")],
        },
        Case {
            name: "wrong type (boolean)",
            kind: Kind::Policy,
            text: policy("  - name: vision\n").replace("preemptible: false", "preemptible: no"),
            want: vec![(3, "priority_classes[1].preemptible", "expected true or false")],
        },
        Case {
            name: "negative quota",
            kind: Kind::Policy,
            text: policy("  - name: vision\n  - name: nlp\n    quotas:\n      - model: A100\n        guaranteed: -4\n"),
            want: vec![(10, "projects[1].quotas[0].guaranteed", "must be ≥ 0, got -4")],
        },
        Case {
            name: "unknown default priority class",
            kind: Kind::Policy,
            text: policy("  - name: vision\n").replace("default_priority_class: low", "default_priority_class: hgih"),
            want: vec![(4, "default_priority_class", "unknown priority class `hgih`")],
        },
        Case {
            name: "duplicate project",
            kind: Kind::Policy,
            text: policy("  - name: vision\n  - name: nlp\n  - name: vision\n"),
            want: vec![(8, "projects[2].name", "project `vision` is already defined at line 6")],
        },
        Case {
            name: "duplicate priority class",
            kind: Kind::Policy,
            text: policy("  - name: vision\n").replace("name: high", "name: low"),
            want: vec![(3, "priority_classes[1].name", "already defined at line 2")],
        },
        Case {
            name: "duplicate quota model",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    quotas:\n      - {model: any, guaranteed: 1}\n      - {model: any, guaranteed: 2}\n"),
            want: vec![(9, "projects[0].quotas[1].model", "already has a quota for `any`")],
        },
        Case {
            name: "unknown key with a suggestion",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    cohrt: perception\n"),
            want: vec![(7, "projects[0].cohrt", "unknown field `cohrt`")],
        },
        Case {
            name: "bad duration",
            kind: Kind::Policy,
            text: format!("fair_share: {{half_life: 7days}}\n{}", policy("  - name: vision\n")),
            want: vec![(1, "fair_share.half_life", "unknown unit `days`")],
        },
        Case {
            name: "lend limit above guarantee",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    cohort: c\n    quotas: [{model: A100, guaranteed: 2, lend_limit: 3}]\n"),
            want: vec![(8, "projects[0].quotas[0].lend_limit", "lend_limit 3 is more than guaranteed 2")],
        },
        Case {
            name: "limits without a cohort",
            kind: Kind::Policy,
            text: policy("  - name: research\n    quotas:\n      - {model: A100, guaranteed: 2, borrow_limit: 2, lend_limit: 1}\n"),
            want: vec![
                (8, "projects[0].quotas[0].borrow_limit", "nobody to borrow from"),
                (8, "projects[0].quotas[0].lend_limit", "nobody to lend to"),
            ],
        },
        Case {
            name: "pre-emption rules: unknown mode, reclaim while borrowing without a cohort",
            kind: Kind::Policy,
            text: policy("  - name: research\n    preempt_within_project: lower\n    borrow_within_cohort: lower_priority\n"),
            want: vec![
                (7, "projects[0].preempt_within_project", "`lower` is not one of lower_priority, lower_or_newer_equal_priority, never"),
                (8, "projects[0].borrow_within_cohort", "nobody to reclaim from"),
            ],
        },
        Case {
            name: "borrow_within_cohort: a threshold with policy never, a threshold that is no integer",
            kind: Kind::Policy,
            text: policy("  - name: a\n    cohort: c\n    borrow_within_cohort: {policy: never, max_priority_threshold: 0}\n  - name: b\n    cohort: c\n    borrow_within_cohort: {policy: lower_priority, max_priority_threshold: 0.5, polcy: x}\n"),
            want: vec![
                (8, "projects[0].borrow_within_cohort", "with `policy: never` has no meaning"),
                (11, "projects[1].borrow_within_cohort.max_priority_threshold", "whole number"),
                (11, "projects[1].borrow_within_cohort.polcy", "unknown field `polcy`"),
            ],
        },
        Case {
            name: "cohorts: unknown parent, a circle, limits without a parent, a duplicate",
            kind: Kind::Policy,
            text: format!(
                "{}cohorts:\n  - {{name: org, quotas: [{{model: A100, guaranteed: 2, borrow_limit: 1}}]}}\n  - {{name: research, parent: orgg}}\n  - {{name: a, parent: b}}\n  - {{name: b, parent: a}}\n  - {{name: org}}\n",
                policy("  - name: vision\n")
            ),
            want: vec![
                (8, "cohorts[0].quotas[0].borrow_limit", "cohort `org` has no parent"),
                (9, "cohorts[1].parent", "unknown parent cohort `orgg`"),
                (10, "cohorts[2].parent", "cohort `a` is inside itself"),
                (11, "cohorts[3].parent", "cohort `b` is inside itself"),
                (12, "cohorts[4].name", "cohort `org` is already defined at line 8"),
            ],
        },
        Case {
            name: "fair_sharing: an unknown strategy, one twice",
            kind: Kind::Policy,
            text: format!(
                "preemption:\n  fair_sharing: {{strategies: [less_than_initial_share, less_than_initial_share, lowest_share]}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![
                (2, "preemption.fair_sharing.strategies[1]", "`less_than_initial_share` is listed twice"),
                (2, "preemption.fair_sharing.strategies[2]", "`lowest_share` is not one of"),
            ],
        },
        Case {
            name: "negative weight and missing name",
            kind: Kind::Policy,
            text: policy("  - weight: -1\n"),
            want: vec![(6, "projects[0].name", "missing required field `name`"), (6, "projects[0].weight", "must be > 0, got -1")],
        },
        Case {
            name: "GPUs finer than a share",
            kind: Kind::Policy,
            text: policy("  - name: vision\n    quotas: [{model: A100, guaranteed: 0.0005}]\n"),
            want: vec![(7, "projects[0].quotas[0].guaranteed", "finer than 1/1000")],
        },
        Case {
            name: "missing sections",
            kind: Kind::Policy,
            text: "fair_share: {half_life: 1h}\n".to_string(),
            want: vec![
                (1, "default_priority_class", "missing required field"),
                (1, "priority_classes", "missing required field"),
                (1, "projects", "missing required field"),
            ],
        },
        Case {
            name: "duplicate node after count expansion",
            kind: Kind::Cluster,
            text: "nodes:\n  - {name: gpu, count: 2, cpu: 4, memory: 8Gi}\n  - {name: gpu-1, cpu: 4, memory: 8Gi}\n".to_string(),
            want: vec![(3, "nodes[1].name", "node `gpu-1` is already defined at line 2")],
        },
        Case {
            name: "bad cluster numbers",
            kind: Kind::Cluster,
            text: "nodes:\n  - name: gpu-1\n    cpu: -4\n    memory: 512GB\n    gpus:\n      - {model: A100, count: 0, memory: 80Gi, island: x}\n".to_string(),
            want: vec![
                (3, "nodes[0].cpu", "must be ≥ 0"),
                (4, "nodes[0].memory", "unknown memory unit `GB`"),
                (6, "nodes[0].gpus[0].count", "must be between 1 and 1024, got 0"),
                (6, "nodes[0].gpus[0].island", "expected a whole number, got `x`"),
            ],
        },
        Case {
            name: "workload field errors",
            kind: Kind::Workloads,
            text: "workloads:\n  - {project: vision, gpus: 1.5}\n  - {project: vision, gpus: 1, kind: trainng, members: 0}\n  - {id: 1, project: vision, gpus: 1}\n".to_string(),
            want: vec![
                (2, "workloads[0].gpus", "fractions are only allowed below one GPU"),
                (3, "workloads[1].kind", "`trainng` is not one of"),
                (3, "workloads[1].members", "must be between 1 and 4096, got 0"),
                (4, "workloads[2].id", "workload id 1 is already used at line 2"),
            ],
        },
        Case {
            name: "two documents",
            kind: Kind::Workloads,
            text: "workloads: []\n---\nworkloads: []\n".to_string(),
            want: vec![(2, "", "a second YAML document")],
        },
        Case {
            name: "unknown topology, and same_node contradicting topology",
            kind: Kind::Workloads,
            text: "workloads:\n  - {project: vision, gpus: 1, members: 2, topology: same_rack}\n  - {project: vision, gpus: 1, members: 2, same_node: true, topology: spread_ok}\n".to_string(),
            want: vec![
                (2, "workloads[0].topology", "`same_rack` is not one of"),
                (3, "workloads[1].same_node", "contradicts the `topology`"),
            ],
        },
        Case {
            name: "preemption guard: bad duration, cap without a window, count out of range",
            kind: Kind::Policy,
            text: format!(
                "preemption:\n  exempt_after_restart: soon\n  max_per_workload: {{count: 40}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![
                (2, "preemption.exempt_after_restart", "`soon` is not a duration"),
                (3, "preemption.max_per_workload.window", "missing required field `window`"),
                (3, "preemption.max_per_workload.count", "must be between 1 and 16"),
            ],
        },
        Case {
            name: "preemption guard: a cap of true",
            kind: Kind::Policy,
            text: format!(
                "preemption: {{max_per_workload: true}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![(1, "preemption.max_per_workload", "does not say how many")],
        },
        Case {
            name: "preemption guard: a zero window",
            kind: Kind::Policy,
            text: format!(
                "preemption: {{max_per_workload: {{count: 2, window: 0s}}}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![(1, "preemption.max_per_workload.window", "a window of 0 counts nothing")],
        },
        Case {
            name: "defragmentation neither a boolean nor a map",
            kind: Kind::Policy,
            text: format!(
                "defragmentation: sometimes\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![(1, "defragmentation", "expected true or false")],
        },
        Case {
            name: "defragmentation map with a bad field",
            kind: Kind::Policy,
            text: format!(
                "defragmentation: {{enabled: true, restart_cost: soon, budget: 3}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![
                (1, "defragmentation.restart_cost", "`soon` is not a duration"),
                (1, "defragmentation.budget", "unknown field `budget`"),
            ],
        },
        Case {
            name: "reservations switched on without a wait",
            kind: Kind::Policy,
            text: format!("reservations: true\n{}", policy("  - name: vision\n")),
            want: vec![(1, "reservations", "does not say how long a request waits")],
        },
        Case {
            name: "reservations with a zero wait, a bad limit and an unknown field",
            kind: Kind::Policy,
            text: format!(
                "reservations: {{after: 0s, per_model_max: 65, nodes: 2}}\n{}",
                policy("  - name: vision\n")
            ),
            want: vec![
                (1, "reservations.after", "a wait of 0"),
                (1, "reservations.per_model_max", "must be between 1 and 64"),
                (1, "reservations.nodes", "unknown field `nodes`"),
            ],
        },
        Case {
            name: "reservations without `after`",
            kind: Kind::Policy,
            text: format!("reservations: {{per_model_max: 2}}\n{}", policy("  - name: vision\n")),
            want: vec![(1, "reservations.after", "missing")],
        },
    ]
}

#[test]
fn each_broken_input_names_line_field_and_fix() {
    for case in cases() {
        let got = diagnostics(case.kind, &case.text);
        let rendered = render(&got);
        assert_eq!(got.len(), case.want.len(), "{}: got\n{rendered}", case.name);
        for (d, (line, field, fragment)) in got.iter().zip(&case.want) {
            assert_eq!(
                (d.line, d.field.as_str()),
                (*line, *field),
                "{}: got\n{rendered}",
                case.name
            );
            assert!(
                d.message.contains(fragment),
                "{}: want `{fragment}` in\n{rendered}",
                case.name
            );
            assert!(!d.fix.is_empty(), "{}: no fix in\n{rendered}", case.name);
            assert!(d.column > 0, "{}: no column in\n{rendered}", case.name);
        }
    }
}

#[test]
fn suggestions_name_the_likely_intent() {
    let policy = format!(
        "{POLICY_HEAD}  - name: vision\n    cohrt: perception\n    queueing: strict-fifo\n"
    );
    let got = diagnostics(Kind::Policy, &policy);
    assert_eq!(got.len(), 2, "{}", render(&got));
    assert_eq!(got[0].fix, "did you mean `cohort`?");
    assert_eq!(got[1].fix, "did you mean `strict_fifo`?");
}

#[test]
fn display_reads_like_a_compiler_error() {
    let text = format!(
        "{POLICY_HEAD}  - name: vision\n  - name: nlp\n    quotas:\n      - model: A100\n        guaranteed: -4\n"
    );
    let got = diagnostics(Kind::Policy, &text);
    assert_eq!(
        render(&got),
        "p.yaml:10:21: projects[1].quotas[0].guaranteed: must be ≥ 0, got -4 — fix: set a non-negative \
         number of GPUs (e.g. 4 or 0.5)\n"
    );
}

/// One file with many independent mistakes: all are reported in one run, in file order.
#[test]
fn all_errors_in_a_file_are_reported_at_once() {
    let text = "\
fair_share: {half_life: soon}
preemption: {mode: kill}
priority_classes:
  - {name: low, value: -100}
  - {name: low, value: 1.5}
default_priority_class: urgent
projects:
  - name: vision
    cohort: perception
    weight: -2
    quotas:
      - {model: A100, guaranteed: -4}
      - {model: H100, guaranteed: 2, lend_limit: 3}
  - name: vision
    quotas:
      - {model: any, guaranteed: 1, borrow_limit: 1}
    colour: blue
";
    let got = diagnostics(Kind::Policy, text);
    let lines: Vec<(usize, &str)> = got.iter().map(|d| (d.line, d.field.as_str())).collect();
    assert_eq!(
        lines,
        [
            (1, "fair_share.half_life"),
            (2, "preemption.mode"),
            (5, "priority_classes[1].value"),
            (10, "projects[0].weight"),
            (12, "projects[0].quotas[0].guaranteed"),
            (13, "projects[0].quotas[1].lend_limit"),
            (16, "projects[1].quotas[0].borrow_limit"),
            (17, "projects[1].colour"),
        ],
        "{}",
        render(&got)
    );
}

#[test]
fn workloads_are_checked_against_policy_and_cluster() {
    let nodes = parse_cluster(
        "c.yaml",
        "nodes:\n  - {name: n, cpu: 8, memory: 64Gi, gpus: [{model: A100, count: 4, memory: 80Gi}]}\n",
    )
    .expect("cluster parses");
    let policy =
        parse_policy("p.yaml", &format!("{POLICY_HEAD}  - name: vision\n")).expect("policy parses");
    let text = "\
workloads:
  - {project: visoin, gpus: 1}
  - {project: vision, gpus: 1, priority_class: urgent}
  - {project: vision, gpus: 1, gpu_models: [A100, A10O]}
  - {project: vision, gpus: 8}
  - {project: vision, gpus: 2, members: 3, same_node: true}
  - {project: vision, gpus: 1, cpu: 16, memory: 1Ti}
  - {project: vision, gpus: 0.5, gpu_models: H100}
";
    let file = parse_workloads("w.yaml", text).expect("workloads parse");
    let got = check_workloads(&file, &policy, &nodes);
    let lines: Vec<(usize, &str)> = got.iter().map(|d| (d.line, d.field.as_str())).collect();
    assert_eq!(
        lines,
        [
            (2, "workloads[0].project"),
            (3, "workloads[1].priority_class"),
            (4, "workloads[2].gpu_models[1]"),
            (5, "workloads[3].gpus"),
            (6, "workloads[4].gpus"),
            (7, "workloads[5].cpu"),
            (7, "workloads[5].memory"),
            (8, "workloads[6].gpu_models[0]"),
        ],
        "{}",
        render(&got)
    );
    assert_eq!(got[0].fix, "did you mean `vision`?");
    assert_eq!(got[2].fix, "did you mean `A100`?");
}

#[test]
fn json_lines_report_every_broken_line() {
    let text = "{\"project\": \"a\", \"gpus\": 1}\n{\"project\": \"a\", \"gpus\": \n{\"project\": \"a\", \"gpus\": -1}\n[1, 2]\n";
    let got = diagnostics_of_jsonl(text);
    let lines: Vec<(usize, &str)> = got.iter().map(|d| (d.line, d.field.as_str())).collect();
    assert_eq!(
        lines,
        [(2, "workloads[1].gpus"), (3, "workloads[2].gpus"), (4, "workloads[3]")],
        "{}",
        render(&got)
    );
}

fn diagnostics_of_jsonl(text: &str) -> Vec<Diagnostic> {
    parse_workloads("t.jsonl", text).err().unwrap_or_default()
}

#[test]
fn a_flood_of_errors_is_capped() {
    let mut text = String::from("workloads:\n");
    for _ in 0..1000 {
        text.push_str("  - {project: a, gpus: -1}\n");
    }
    let got = diagnostics(Kind::Workloads, &text);
    assert_eq!(got.len(), 201);
    assert!(got[200].message.contains("800 more problems not shown"), "{}", got[200]);
}
