//! The example files parse cleanly, and every schema field lands in the model where expected.

use allot_config::{
    Diagnostic, check_workloads, load_cluster, load_policy, load_workloads, parse_cluster,
    parse_policy, parse_workloads, render,
};
use allot_core::{
    Checkpointing, GpuRequest, PreemptionMode, Queueing, QuotaModel, Shares, Timestamp,
    WorkloadKind,
};

const CLUSTER: &str = include_str!("../../../examples/cluster.yaml");
const POLICY: &str = include_str!("../../../examples/policy.yaml");
const WORKLOADS: &str = include_str!("../../../examples/workloads.yaml");

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
