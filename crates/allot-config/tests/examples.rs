//! The example files parse cleanly, and every schema field lands in the model where expected.

use allot_config::{
    Diagnostic, check_workloads, load_cluster, load_policy, load_workloads, parse_cluster,
    parse_policy, parse_workloads, render,
};
use allot_core::idle::IdleRule;
use allot_core::{
    Checkpointing, GpuRequest, IdleWhen, PolicySpec, PreemptionMode, Queueing, QuotaModel, Shares,
    Timestamp, WorkloadKind,
};

const CLUSTER: &str = include_str!("../../../examples/cluster.yaml");
const POLICY: &str = include_str!("../../../examples/policy.yaml");
const WORKLOADS: &str = include_str!("../../../examples/workloads.yaml");
const IDLE_ALLOT: &str = include_str!("../../../examples/idle/allot.yaml");
const IDLE_AMD_RM: &str = include_str!("../../../examples/idle/amd_rm.yaml");
const IDLE_RUNAI: &str = include_str!("../../../examples/idle/runai.yaml");

const MIN: u64 = 60_000;

fn ok<T>(result: Result<T, Vec<Diagnostic>>) -> T {
    match result {
        Ok(value) => value,
        Err(diagnostics) => panic!("unexpected diagnostics:\n{}", render(&diagnostics)),
    }
}

#[test]
fn example_cluster_parses() {
    let nodes = ok(parse_cluster("examples/cluster.yaml", CLUSTER));
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "h100-0",
            "h100-1",
            "a100-0",
            "a100-1",
            "v100-0",
            "l4-0",
            "cpu-0",
            "a100-mig-0",
            "mi300x-0"
        ]
    );
    let h100 = &nodes[1];
    assert_eq!(h100.cpu_millis, 192_000);
    assert_eq!(h100.memory_mib, 2048 * 1024);
    assert_eq!(h100.pool.as_deref(), Some("training"));
    assert_eq!(h100.rack.as_deref(), Some("r1"));
    assert_eq!(h100.labels.get("interconnect").map(String::as_str), Some("nvlink"));
    assert_eq!(h100.devices.len(), 8);
    assert_eq!(h100.devices.iter().filter(|d| d.island == 1).count(), 4);
    assert!(h100.devices.iter().all(|d| d.model == "H100" && d.memory_mib == 80 * 1024));
    assert_eq!(nodes[2].cpu_millis, 128_000);
    assert_eq!(nodes[2].memory_mib, 1024 * 1024);
    assert_eq!(nodes[4].memory_mib, 512 * 1024);
    assert!(nodes[6].devices.is_empty());
    assert_eq!(nodes[7].devices.len(), 2);
    assert!(nodes[7].devices.iter().all(|d| d.mig && d.model == "A100-80GB"));
    // 8 MI300X in CPX/NPS4: 8 logical devices each, 192Gi / 8 apiece.
    assert_eq!(nodes[8].devices.len(), 64);
    assert!(nodes[8].devices.iter().all(|d| d.model == "MI300X-CPX" && d.memory_mib == 24 * 1024));
}

#[test]
fn example_policy_parses() {
    let policy = ok(parse_policy("examples/policy.yaml", POLICY));
    assert_eq!(policy.fair_share_half_life_ms, 7 * 24 * 3600 * 1000);
    assert_eq!(policy.preemption_mode, PreemptionMode::Suspend);
    assert_eq!(policy.defragmentation.map(|d| d.restart_cost_ms), Some(120_000));
    assert_eq!(policy.default_priority_class, "medium");
    let classes: Vec<(&str, i32, bool)> =
        policy.priority_classes.iter().map(|c| (c.name.as_str(), c.value, c.preemptible)).collect();
    assert_eq!(classes, [("low", -100, true), ("medium", 0, true), ("high", 100, false)]);
    let names: Vec<&str> = policy.projects.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["vision", "speech", "nlp", "translation", "research"]);

    let vision = &policy.projects[0];
    assert_eq!(vision.cohort.as_deref(), Some("perception"));
    assert_eq!(vision.department.as_deref(), Some("ai-research"));
    assert_eq!(vision.weight_milli, 2000);
    assert_eq!(vision.queueing, Queueing::BestEffortFifo);
    assert_eq!(vision.preemption_mode, None);
    assert_eq!(vision.quotas[0].model, QuotaModel::Model("H100".into()));
    assert_eq!(vision.quotas[0].guaranteed, Shares(8000));
    assert_eq!(vision.quotas[0].borrow_limit, Some(Shares(8000)));
    assert_eq!(vision.quotas[0].lend_limit, Some(Shares(4000)));
    assert_eq!(vision.quotas[1].model, QuotaModel::Any);

    let speech = &policy.projects[1];
    assert_eq!(speech.weight_milli, 1000);
    assert_eq!(speech.quotas[1].guaranteed, Shares(500));

    assert_eq!(policy.projects[2].weight_milli, 1500);
    assert_eq!(policy.projects[2].preemption_mode, Some(PreemptionMode::Requeue));
    assert_eq!(policy.projects[3].queueing, Queueing::StrictFifo);

    let research = &policy.projects[4];
    assert_eq!(research.cohort, None);
    assert_eq!(research.weight_milli, 500);
    assert_eq!(research.preemption_mode, Some(PreemptionMode::Delete));
    assert_eq!(research.quotas[1].guaranteed, Shares(1500));
    assert_eq!(research.quotas[1].borrow_limit, None);

    assert_eq!(policy.restart_cost_ms, 2 * MIN);
    assert_eq!(policy.idle_resume_backoff_ms, 5 * MIN);
    let names: Vec<&str> = policy.idle.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["research-notebooks", "notebooks", "serving", "hung-jobs"]);
    let research_notebooks = &policy.idle[0];
    assert_eq!(research_notebooks.projects, ["research"]);
    assert_eq!(research_notebooks.kinds, [WorkloadKind::Notebook]);
    // The README's walkthrough: short, always, and without GPU telemetry only probes count.
    assert_eq!(research_notebooks.rule.idle_timer_ms, 2 * MIN);
    assert_eq!(research_notebooks.rule.missing, allot_core::idle::MissingTelemetry::Idle);
    assert_eq!(research_notebooks.rule.min_runtime_ms, 0);
    assert_eq!(
        (research_notebooks.when, research_notebooks.action),
        (IdleWhen::Always, PreemptionMode::Suspend)
    );
    assert_eq!(research_notebooks.warn_before_ms, MIN);
    let notebooks = &policy.idle[1];
    assert!(notebooks.projects.is_empty());
    assert_eq!(notebooks.rule, IdleRule::allot_default());
    assert_eq!((notebooks.when, notebooks.action), (IdleWhen::OnPressure, PreemptionMode::Suspend));
    assert_eq!(notebooks.warn_before_ms, 5 * MIN);
    let serving = &policy.idle[2];
    assert_eq!(serving.kinds, [WorkloadKind::Inference, WorkloadKind::Service]);
    assert_eq!(serving.exempt_classes, ["high"]);
    assert_eq!(serving.rule.idle_timer_ms, 60 * MIN);
    let hung = &policy.idle[3];
    assert_eq!(hung.kinds, [WorkloadKind::Training, WorkloadKind::Batch]);
    assert_eq!(hung.when, IdleWhen::ReportOnly);
    assert_eq!(
        (hung.rule.threshold_permille, hung.rule.idle_timer_ms, hung.rule.sustain_ms),
        (50, 120 * MIN, 5 * MIN)
    );
    assert_eq!(hung.warn_before_ms, 0);
    // Every rule field is written somewhere in the example.
    for field in [
        "name:",
        "projects:",
        "kinds:",
        "exempt_classes:",
        "model:",
        "threshold:",
        "idle_timer:",
        "sustain:",
        "missing_telemetry:",
        "min_runtime:",
        "policy:",
        "action:",
        "warn_before:",
    ] {
        let idle_section = &POLICY[POLICY.find("\nidle:").expect("idle section")..];
        assert!(idle_section.contains(field), "{field} is not exercised");
    }
}

/// The three policies of `allot sim idle`: each model's rules decode as written, and the files
/// differ in nothing but their `idle` section.
#[test]
fn idle_experiment_policies_differ_only_in_their_idle_rules() {
    let allot = ok(parse_policy("examples/idle/allot.yaml", IDLE_ALLOT));
    let amd_rm = ok(parse_policy("examples/idle/amd_rm.yaml", IDLE_AMD_RM));
    let runai = ok(parse_policy("examples/idle/runai.yaml", IDLE_RUNAI));

    // One line per rule: name, kinds, model, threshold, timer, sustain, missing telemetry,
    // start-up grace, when, action, warning, exempt classes (durations in seconds).
    fn rows(p: &PolicySpec) -> Vec<String> {
        p.idle
            .iter()
            .map(|r| {
                assert!(r.projects.is_empty(), "{}: every project", r.name);
                let kinds: Vec<&str> = r.kinds.iter().map(|k| k.as_str()).collect();
                format!(
                    "{} [{}] {:?} {}‰ timer={} sustain={} {:?} grace={} {} {} warn={} exempt=[{}]",
                    r.name,
                    kinds.join(","),
                    r.rule.model,
                    r.rule.threshold_permille,
                    r.rule.idle_timer_ms / 1000,
                    r.rule.sustain_ms / 1000,
                    r.rule.missing,
                    r.rule.min_runtime_ms / 1000,
                    r.when.as_str(),
                    r.action.as_str(),
                    r.warn_before_ms / 1000,
                    r.exempt_classes.join(","),
                )
            })
            .collect()
    }
    assert_eq!(
        rows(&allot),
        [
            "notebooks [notebook] Allot 100‰ timer=900 sustain=60 Hold grace=300 on_pressure \
             suspend warn=300 exempt=[high]",
            "serving [inference,service] Allot 100‰ timer=3600 sustain=60 Hold grace=300 \
             on_pressure suspend warn=300 exempt=[high]",
            "hung-jobs [training,batch] Allot 10‰ timer=3600 sustain=300 Hold grace=300 \
             on_pressure suspend warn=300 exempt=[high]",
        ]
    );
    // AMD RM: one rule for every kind, its fixed behaviour from the core's own constructor
    // (one sample resets, missing samples are idle, no grace).
    assert_eq!(
        rows(&amd_rm),
        ["amd-rm [] AmdRm 100‰ timer=900 sustain=0 Idle grace=0 on_pressure delete warn=0 \
          exempt=[]"]
    );
    assert_eq!(amd_rm.idle[0].rule, IdleRule::amd_rm(100, 15 * MIN));
    // Run:ai: workspaces and training only (no rule for inference), unconditional, suspend;
    // its "exactly 0 %" is a threshold of 1 ‰ in the core.
    assert_eq!(
        rows(&runai),
        [
            "workspaces [notebook] RunAi 1‰ timer=900 sustain=0 Hold grace=0 always suspend \
             warn=0 exempt=[]",
            "training [training,batch] RunAi 1‰ timer=1800 sustain=0 Hold grace=0 always \
             suspend warn=0 exempt=[]",
        ]
    );
    assert_eq!(runai.idle[0].rule, IdleRule::runai(15 * MIN));
    assert_eq!(runai.idle[1].rule, IdleRule::runai(30 * MIN));

    // Everything but the idle rules is the same.
    let without_idle = |p: &PolicySpec| PolicySpec { idle: Vec::new(), ..p.clone() };
    assert_eq!(without_idle(&allot), without_idle(&amd_rm));
    assert_eq!(without_idle(&allot), without_idle(&runai));
    let guarantees: Vec<(&str, Shares)> =
        allot.projects.iter().map(|p| (p.name.as_str(), p.quotas[0].guaranteed)).collect();
    assert_eq!(
        guarantees,
        [
            ("vision", Shares(700_000)),
            ("nlp", Shares(700_000)),
            ("speech", Shares(500_000)),
            ("platform", Shares(590_000)),
        ]
    );
    let total: u64 = guarantees.iter().map(|(_, s)| s.0).sum();
    assert_eq!(total, 2_490_000, "the Philly cluster's 2,490 GPUs");
    assert!(allot.projects.iter().all(|p| p.cohort.as_deref() == Some("lab")
        && p.quotas.len() == 1
        && p.quotas[0].model == QuotaModel::Any
        && p.quotas[0].borrow_limit.is_none()
        && p.quotas[0].lend_limit.is_none()));
    let classes: Vec<(&str, i32, bool)> =
        allot.priority_classes.iter().map(|c| (c.name.as_str(), c.value, c.preemptible)).collect();
    assert_eq!(classes, [("normal", 0, true), ("high", 100, false)]);
    assert_eq!(allot.default_priority_class, "normal");
    assert_eq!(allot.preemption_mode, PreemptionMode::Suspend);

    // The files' text, too, is the same up to `idle:` (comments aside).
    let head = |text: &'static str| -> Vec<&'static str> {
        text[..text.find("\nidle:").expect("idle section")]
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect()
    };
    assert_eq!(head(IDLE_ALLOT), head(IDLE_AMD_RM));
    assert_eq!(head(IDLE_ALLOT), head(IDLE_RUNAI));
}

#[test]
fn example_workloads_parse_and_check_cleanly() {
    let nodes = ok(parse_cluster("examples/cluster.yaml", CLUSTER));
    let policy = ok(parse_policy("examples/policy.yaml", POLICY));
    let file = ok(parse_workloads("examples/workloads.yaml", WORKLOADS));
    let problems = check_workloads(&file, &policy, &nodes);
    assert!(problems.is_empty(), "{}", render(&problems));

    let w = file.specs();
    assert_eq!(w.len(), 16);
    let ids: Vec<u64> = w.iter().map(|w| w.id.0).collect();
    assert_eq!(ids, [1, 2, 3, 4, 100, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
    assert_eq!(file.line_of(1), Some(33));

    let pretrain = &w[0];
    assert_eq!(pretrain.name, "vision-pretrain");
    assert_eq!(pretrain.kind, WorkloadKind::Training);
    assert_eq!(pretrain.user, "alice");
    assert_eq!(pretrain.priority_class, None);
    assert_eq!(pretrain.members, 1);
    assert_eq!(pretrain.gpus_per_member, GpuRequest::Whole(8));
    assert_eq!(pretrain.gpu_models, ["H100"]);
    assert_eq!(pretrain.cpu_millis_per_member, 96_000);
    assert_eq!(pretrain.memory_mib_per_member, 1024 * 1024);
    assert_eq!(
        pretrain.checkpointing,
        Some(Checkpointing { grace_ms: 120_000, last_checkpoint_at: Some(Timestamp(0)) })
    );
    assert_eq!(pretrain.min_runtime_ms, 30 * 60_000);
    assert_eq!(pretrain.max_runtime_ms, Some(3 * 24 * 3_600_000));

    assert_eq!(w[1].gpu_models, ["H100"]);
    assert_eq!(w[1].priority_class.as_deref(), Some("low"));
    assert!(w[1].prefer_same_node && !w[1].same_node);
    assert_eq!(w[2].members, 2);
    assert!(w[2].same_node);
    assert_eq!(
        w[2].checkpointing,
        Some(Checkpointing { grace_ms: 30_000, last_checkpoint_at: None })
    );
    assert_eq!(w[3].kind, WorkloadKind::Inference);
    assert_eq!(w[3].gpus_per_member, GpuRequest::Shares(250));
    assert_eq!(w[3].preemptible, Some(false));
    assert_eq!(w[4].kind, WorkloadKind::Notebook);
    assert_eq!(w[6].gpu_models, ["A100", "H100"]);
    assert_eq!(w[7].deadline, Some(Timestamp(6 * 3_600_000)));
    assert_eq!(w[10].gpu_models, ["V100M32", "A100"]);
    assert_eq!(w[12].kind, WorkloadKind::Service);
    assert_eq!(w[12].memory_mib_per_member, 4096);
    let mig = |s: &str| GpuRequest::Mig(allot_core::MigProfile::parse(s).expect("profile"));
    assert_eq!(w[13].gpus_per_member, mig("3g.40gb"));
    assert_eq!(w[14].gpus_per_member, mig("1g.10gb"));
    assert_eq!(w[15].gpu_models, ["MI300X-CPX"]);
}

#[test]
fn json_lines_carry_the_same_fields() {
    let text = concat!(
        "{\"name\": \"a\", \"project\": \"vision\", \"gpus\": 0.5, \"gpu_models\": \"H100|A100\"}\n",
        "\n",
        "{\"id\": 9, \"name\": \"b\", \"kind\": \"batch\", \"project\": \"nlp\", \"members\": 2, \"gpus\": 4,",
        " \"cpu\": \"500m\", \"memory\": \"2Gi\", \"same_node\": true, \"checkpoint\": {\"grace\": 30000}}\n",
    );
    for file in ["trace.jsonl", "trace.txt"] {
        let parsed = ok(parse_workloads(file, text));
        let w = parsed.specs();
        assert_eq!(w.len(), 2, "{file}");
        assert_eq!(w[0].id.0, 1);
        assert_eq!(w[0].gpus_per_member, GpuRequest::Shares(500));
        assert_eq!(w[0].gpu_models, ["H100", "A100"]);
        assert_eq!(w[1].id.0, 9);
        assert_eq!(w[1].members, 2);
        assert_eq!(w[1].cpu_millis_per_member, 500);
        assert_eq!(w[1].memory_mib_per_member, 2048);
        assert_eq!(parsed.line_of(1), Some(3));
    }
}

/// Model alternatives in order of preference, as a list or as the compact `A|B` string, in
/// YAML and in JSON lines: the same list.
#[test]
fn model_alternatives_in_every_form() {
    let forms = [
        ("w.yaml", "workloads:\n  - {project: p, gpus: 1, gpu_models: [V100M16, V100M32]}\n"),
        ("w.yaml", "workloads:\n  - {project: p, gpus: 1, gpu_models: V100M16|V100M32}\n"),
        ("w.yaml", "workloads:\n  - {project: p, gpus: 1, gpu_models: \"V100M16 | V100M32\"}\n"),
        (
            "w.jsonl",
            "{\"project\": \"p\", \"gpus\": 1, \"gpu_models\": [\"V100M16\", \"V100M32\"]}\n",
        ),
        ("w.jsonl", "{\"project\": \"p\", \"gpus\": 1, \"gpu_models\": \"V100M16|V100M32\"}\n"),
    ];
    for (file, text) in forms {
        let parsed = ok(parse_workloads(file, text));
        assert_eq!(parsed.specs()[0].gpu_models, ["V100M16", "V100M32"], "{text}");
    }
    let reversed = ok(parse_workloads(
        "w.yaml",
        "workloads:\n  - {project: p, gpus: 1, gpu_models: V100M32|V100M16}\n",
    ));
    assert_eq!(reversed.specs()[0].gpu_models, ["V100M32", "V100M16"]);
}

#[test]
fn load_reads_files_and_reports_missing_ones() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    ok(load_cluster(&root.join("cluster.yaml")));
    ok(load_policy(&root.join("policy.yaml")));
    ok(load_workloads(&root.join("workloads.yaml")));
    for model in ["allot", "amd_rm", "runai"] {
        ok(load_policy(&root.join(format!("idle/{model}.yaml"))));
    }
    let missing = root.join("no-such-file.yaml");
    let Err(diagnostics) = load_policy(&missing) else { panic!("a missing file must fail") };
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0].line, 0);
    assert!(diagnostics[0].message.starts_with("cannot read the file"), "{}", diagnostics[0]);
}

/// What this crate produces is what the engine accepts: the examples build an engine, and a
/// first cycle decides something for them.
#[test]
fn the_engine_accepts_the_examples() {
    let nodes = ok(parse_cluster("examples/cluster.yaml", CLUSTER));
    let policy = ok(parse_policy("examples/policy.yaml", POLICY));
    let file = ok(parse_workloads("examples/workloads.yaml", WORKLOADS));
    let mut engine = match allot_core::Engine::new(&nodes, &policy) {
        Ok(engine) => engine,
        Err(error) => panic!("the engine refuses the examples: {error}"),
    };
    for spec in file.into_specs() {
        engine.apply(Timestamp(0), allot_core::Event::WorkloadSubmitted(spec));
    }
    assert!(!engine.decide(Timestamp(0)).is_empty());
}

#[test]
fn topology_and_defragmentation_decode() {
    let w = ok(allot_config::parse_workloads(
        "w.yaml",
        "workloads:\n  - {project: v, gpus: 1, members: 2, topology: prefer_same_node}\n  \
         - {project: v, gpus: 1, members: 2, topology: required_same_node}\n  \
         - {project: v, gpus: 1, members: 2, topology: spread_ok}\n  \
         - {project: v, gpus: 1, members: 2, same_node: true, topology: required_same_node}\n  \
         - {project: v, gpus: 1, members: 2}\n",
    ));
    let flags: Vec<(bool, bool)> =
        w.specs().iter().map(|s| (s.same_node, s.prefer_same_node)).collect();
    assert_eq!(
        flags,
        vec![(false, true), (true, false), (false, false), (true, false), (false, false)]
    );

    let head = "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\n\
                projects: [{name: v}]\n";
    let off = ok(allot_config::parse_policy("p.yaml", head));
    assert_eq!(off.defragmentation, None);
    let on = ok(allot_config::parse_policy("p.yaml", &format!("defragmentation: true\n{head}")));
    assert_eq!(on.defragmentation, Some(allot_core::Defragmentation::default()));
    let custom = ok(allot_config::parse_policy(
        "p.yaml",
        &format!("defragmentation: {{restart_cost: 5m}}\n{head}"),
    ));
    assert_eq!(custom.defragmentation.map(|d| d.restart_cost_ms), Some(300_000));
    let disabled = ok(allot_config::parse_policy(
        "p.yaml",
        &format!("defragmentation: {{enabled: false, restart_cost: 5m}}\n{head}"),
    ));
    assert_eq!(disabled.defragmentation, None);
}

#[test]
fn reservations_decode_and_render_back() {
    let head = "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\n\
                projects: [{name: v}]\n";
    let off = ok(allot_config::parse_policy("p.yaml", head));
    assert_eq!(off.reservations, None);
    let off = ok(allot_config::parse_policy("p.yaml", &format!("reservations: false\n{head}")));
    assert_eq!(off.reservations, None);
    let on =
        ok(allot_config::parse_policy("p.yaml", &format!("reservations: {{after: 5m}}\n{head}")));
    assert_eq!(
        on.reservations,
        Some(allot_core::Reservations { after_ms: 300_000, per_model_max: 2, hold_quota: false })
    );
    let custom = ok(allot_config::parse_policy(
        "p.yaml",
        &format!("reservations: {{after: 90s, per_model_max: 4, hold_quota: true}}\n{head}"),
    ));
    assert_eq!(
        custom.reservations,
        Some(allot_core::Reservations { after_ms: 90_000, per_model_max: 4, hold_quota: true })
    );
    let text = allot_config::render_policy(&custom, "");
    assert_eq!(ok(allot_config::parse_policy("p.yaml", &text)), custom);
}

#[test]
fn preemption_rules_decode() {
    use allot_core::{BorrowWithinCohort, WithinProject};
    let policy = ok(allot_config::parse_policy(
        "p.yaml",
        "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\nprojects:\n  \
         - {name: a}\n  \
         - {name: b, cohort: c, preempt_within_project: never, borrow_within_cohort: lower_priority}\n  \
         - {name: d, cohort: c, preempt_within_project: lower_or_newer_equal_priority,\n     \
            borrow_within_cohort: {policy: lower_priority, max_priority_threshold: -5}}\n  \
         - {name: e, cohort: c, borrow_within_cohort: never}\n",
    ));
    let rules: Vec<(WithinProject, Option<BorrowWithinCohort>)> = policy
        .projects
        .iter()
        .map(|p| (p.preempt_within_project, p.borrow_within_cohort))
        .collect();
    assert_eq!(
        rules,
        vec![
            (WithinProject::LowerPriority, None),
            (WithinProject::Never, Some(BorrowWithinCohort { max_priority_threshold: None })),
            (
                WithinProject::LowerOrNewerEqualPriority,
                Some(BorrowWithinCohort { max_priority_threshold: Some(-5) })
            ),
            (WithinProject::LowerPriority, None),
        ]
    );
}

#[test]
fn cohorts_decode_into_a_tree() {
    let policy = ok(allot_config::parse_policy(
        "p.yaml",
        "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\n\
         cohorts:\n  - {name: org}\n  \
         - {name: research, parent: org, quotas: [{model: A100, guaranteed: 4, borrow_limit: 2, lend_limit: 6}]}\n\
         projects:\n  - {name: vision, cohort: research, quotas: [{model: A100, guaranteed: 2}]}\n",
    ));
    assert_eq!(policy.cohorts.len(), 2);
    let research = &policy.cohorts[1];
    assert_eq!(research.parent.as_deref(), Some("org"));
    // A cohort's lend limit is on its whole subtree, so it may exceed its own quota.
    assert_eq!(research.quotas[0].lend_limit, Some(Shares(6000)));
    assert_eq!(research.quotas[0].borrow_limit, Some(Shares(2000)));
    let nodes = ok(allot_config::parse_cluster(
        "c.yaml",
        "nodes:\n  - {name: n, cpu: 8, memory: 64Gi, gpus: [{model: A100, count: 8, memory: 80Gi}]}\n",
    ));
    allot_core::Engine::new(&nodes, &policy).expect("the engine takes the tree");
}

#[test]
fn fair_sharing_decodes() {
    use allot_core::{FairShareStrategy, FairSharing};
    let head = "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\n\
                projects: [{name: v}]\n";
    let parse = |pre: &str| ok(allot_config::parse_policy("p.yaml", &format!("{pre}{head}")));
    assert_eq!(parse("").fair_sharing, None);
    assert_eq!(
        parse("preemption: {fair_sharing: true}\n").fair_sharing,
        Some(FairSharing::default())
    );
    let one = parse(
        "preemption: {mode: requeue, fair_sharing: {strategies: [less_than_initial_share]}}\n",
    );
    assert_eq!(one.preemption_mode, allot_core::PreemptionMode::Requeue);
    assert_eq!(
        one.fair_sharing,
        Some(FairSharing { strategies: vec![FairShareStrategy::LessThanInitialShare] })
    );
}

#[test]
fn preemption_guard_decodes() {
    use allot_core::{PreemptionGuard, PreemptionLimit};
    let head = "priority_classes: [{name: low, value: 0}]\ndefault_priority_class: low\n\
                projects: [{name: v}]\n";
    let parse = |pre: &str| ok(allot_config::parse_policy("p.yaml", &format!("{pre}{head}")));
    assert_eq!(parse("").preemption_guard, PreemptionGuard::DEFAULT);
    assert_eq!(parse("preemption: {mode: requeue}\n").preemption_guard, PreemptionGuard::DEFAULT);
    let off = parse("preemption: {exempt_after_restart: 0, max_per_workload: false}\n");
    assert_eq!(off.preemption_guard, PreemptionGuard::OFF);
    assert_eq!(off.preemption_mode, allot_core::PreemptionMode::Suspend);
    let both = parse(
        "preemption: {exempt_after_restart: 90s, max_per_workload: {count: 3, window: 1h}}\n",
    );
    assert_eq!(
        both.preemption_guard,
        PreemptionGuard {
            exempt_after_restart_ms: 90_000,
            limit: Some(PreemptionLimit { count: 3, window_ms: 3_600_000 }),
            reclaim_after_ms: 0,
        }
    );
    let delayed = parse("preemption: {reclaim_after: 1m}\n");
    assert_eq!(
        delayed.preemption_guard,
        PreemptionGuard { reclaim_after_ms: 60_000, ..PreemptionGuard::DEFAULT }
    );
    assert_eq!(delayed.preemption_mode, allot_core::PreemptionMode::Suspend);
}
