//! GPU partitions in config files: MIG-enabled NVIDIA GPUs (`mig: true`), AMD MI300X compute
//! and memory partitions expanded into logical devices, and MIG requests in workload files.

use allot_config::{Diagnostic, check_workloads, parse_cluster, parse_policy, parse_workloads};
use allot_core::{GpuRequest, MigProfile, NodeSpec};

fn cluster(gpus: &str) -> Result<Vec<NodeSpec>, Vec<Diagnostic>> {
    parse_cluster(
        "c.yaml",
        &format!("nodes:\n  - name: n\n    cpu: 64\n    memory: 1Ti\n    gpus:\n{gpus}"),
    )
}

/// (line, field, a fragment of the message, a fragment of the fix) of the only diagnostic.
fn one_error(result: Result<Vec<NodeSpec>, Vec<Diagnostic>>) -> (usize, String, String, String) {
    let diagnostics = result.expect_err("should fail");
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    let d = &diagnostics[0];
    assert_eq!(d.file, "c.yaml");
    (d.line, d.field.clone(), d.message.clone(), d.fix.clone())
}

#[test]
fn mi300x_cpx_nps4_is_eight_devices_per_gpu() {
    let nodes = cluster(
        "      - {model: MI300X, count: 8, memory: 192Gi, island: 3, partition: {compute: CPX, memory: NPS4}}\n",
    )
    .expect("parses");
    let devices = &nodes[0].devices;
    assert_eq!(devices.len(), 64);
    assert!(
        devices.iter().all(|d| d.model == "MI300X-CPX"
            && d.memory_mib == 24 * 1024
            && d.island == 3
            && !d.mig)
    );
}

#[test]
fn every_valid_pair_expands() {
    for (compute, memory, per_gpu) in [
        ("SPX", "NPS1", 1),
        ("DPX", "NPS1", 2),
        ("DPX", "NPS2", 2),
        ("QPX", "NPS1", 4),
        ("QPX", "NPS4", 4),
        ("CPX", "NPS1", 8),
        ("CPX", "NPS4", 8),
    ] {
        let nodes = cluster(&format!(
            "      - {{model: MI300X, count: 2, memory: 192Gi, partition: {{compute: {compute}, memory: {memory}}}}}\n"
        ))
        .unwrap_or_else(|e| panic!("{compute}/{memory}: {e:?}"));
        assert_eq!(nodes[0].devices.len(), 2 * per_gpu, "{compute}/{memory}");
        assert_eq!(nodes[0].devices[0].model, format!("MI300X-{compute}"));
        assert_eq!(nodes[0].devices[0].memory_mib, 192 * 1024 / per_gpu as u64);
    }
}

#[test]
fn invalid_pairs_name_the_valid_choices() {
    for (compute, memory, choices) in [
        ("SPX", "NPS4", "NPS1"),
        ("SPX", "NPS2", "NPS1"),
        ("DPX", "NPS4", "NPS1 or NPS2"),
        ("QPX", "NPS2", "NPS1 or NPS4"),
        ("CPX", "NPS2", "NPS1 or NPS4"),
    ] {
        let (line, field, message, fix) = one_error(cluster(&format!(
            "      - model: MI300X\n        count: 8\n        memory: 192Gi\n        partition:\n          compute: {compute}\n          memory: {memory}\n"
        )));
        assert_eq!(line, 11, "{compute}/{memory}");
        assert_eq!(field, "nodes[0].gpus[0].partition.memory");
        assert!(message.contains(compute) && message.contains(memory), "{message}");
        assert!(fix.contains(choices), "{compute}/{memory}: {fix}");
    }
}

#[test]
fn unknown_modes_and_models_are_refused() {
    let (line, field, message, _) = one_error(cluster(
        "      - {model: MI300X, count: 8, memory: 192Gi, partition: {compute: TPX, memory: NPS1}}\n",
    ));
    assert_eq!((line, field.as_str()), (6, "nodes[0].gpus[0].partition.compute"));
    assert!(message.contains("SPX, DPX, QPX, CPX"), "{message}");

    let (_, field, message, _) = one_error(cluster(
        "      - {model: H100, count: 8, memory: 80Gi, partition: {compute: CPX, memory: NPS4}}\n",
    ));
    assert_eq!(field, "nodes[0].gpus[0].partition");
    assert!(message.contains("only known for MI300X"), "{message}");

    let (_, field, _, fix) = one_error(cluster(
        "      - {model: MI300X, count: 8, memory: 192Gi, partition: {compute: CPX}}\n",
    ));
    assert_eq!(field, "nodes[0].gpus[0].partition.memory");
    assert!(fix.contains("NPS4"), "{fix}");
}

#[test]
fn mig_needs_a_model_with_a_table() {
    let nodes =
        cluster("      - {model: A100-80GB, count: 8, memory: 80Gi, mig: true}\n").expect("parses");
    assert!(nodes[0].devices.iter().all(|d| d.mig && d.model == "A100-80GB"));

    let (line, field, message, fix) =
        one_error(cluster("      - {model: A100, count: 8, memory: 80Gi, mig: true}\n"));
    assert_eq!((line, field.as_str()), (6, "nodes[0].gpus[0].mig"));
    assert!(message.contains("`A100` has no MIG table"), "{message}");
    assert!(fix.contains("A100-40GB") && fix.contains("H200-141GB"), "{fix}");

    let (_, field, message, _) = one_error(cluster(
        "      - {model: MI300X, count: 8, memory: 192Gi, mig: true, partition: {compute: CPX, memory: NPS4}}\n",
    ));
    assert_eq!(field, "nodes[0].gpus[0].mig");
    assert!(message.contains("cannot both"), "{message}");
}

const POLICY: &str = "\
priority_classes: [{name: normal, value: 0}]
default_priority_class: normal
projects:
  - name: vision
";

#[test]
fn workloads_ask_for_mig_instances() {
    let yaml = "workloads:\n  - {project: vision, gpus: 3g.40gb, gpu_models: [A100-80GB]}\n  - {project: vision, gpus: 1g.10gb+me}\n";
    let parsed = parse_workloads("w.yaml", yaml).expect("parses");
    let want = |s: &str| GpuRequest::Mig(MigProfile::parse(s).expect(s));
    assert_eq!(parsed.specs()[0].gpus_per_member, want("3g.40gb"));
    assert_eq!(parsed.specs()[1].gpus_per_member, want("1g.10gb+me"));
    let jsonl =
        "{\"project\": \"vision\", \"gpus\": \"2g.20gb\", \"gpu_models\": \"A100-80GB|H200\"}\n";
    let parsed_jsonl = parse_workloads("w.jsonl", jsonl).expect("parses");
    assert_eq!(parsed_jsonl.specs()[0].gpus_per_member, want("2g.20gb"));
    assert_eq!(parsed_jsonl.specs()[0].gpu_models, vec!["A100-80GB", "H200"]);

    let bad = parse_workloads("w.yaml", "workloads:\n  - {project: vision, gpus: 8g.40gb}\n")
        .expect_err("8 compute slices");
    assert_eq!(bad.len(), 1);
    assert_eq!((bad[0].line, bad[0].field.as_str()), (2, "workloads[0].gpus"));
    assert!(bad[0].message.contains("not a MIG profile"), "{}", bad[0].message);

    // Against a cluster: a MIG-enabled A100-80GB node and a plain one.
    let nodes = parse_cluster(
        "c.yaml",
        "nodes:\n  - {name: m, cpu: 8, memory: 64Gi, gpus: [{model: A100-80GB, count: 1, memory: 80Gi, mig: true}]}\n  - {name: p, cpu: 8, memory: 64Gi, gpus: [{model: H100, count: 2, memory: 80Gi}]}\n",
    )
    .expect("cluster");
    let policy = parse_policy("p.yaml", POLICY).expect("policy");
    assert!(check_workloads(&parsed, &policy, &nodes).is_empty());
    let wrong = parse_workloads(
        "w.yaml",
        "workloads:\n  - {project: vision, gpus: 3g.20gb}\n  - {project: vision, gpus: 1g.10gb, gpu_models: [H100]}\n  - {project: vision, gpus: 1g.10gb, members: 8, same_node: true}\n  - {project: vision, gpus: 1g.10gb, members: 7, same_node: true}\n",
    )
    .expect("parses");
    let found = check_workloads(&wrong, &policy, &nodes);
    let lines: Vec<(usize, &str)> = found.iter().map(|d| (d.line, d.field.as_str())).collect();
    assert_eq!(
        lines,
        vec![(2, "workloads[0].gpus"), (3, "workloads[1].gpus"), (4, "workloads[2].gpus")],
        "{found:?}"
    );
    assert!(found[0].message.contains("offers 3g.20gb"), "{}", found[0].message);
    assert!(found[0].fix.contains("3g.40gb (A100-80GB)"), "{}", found[0].fix);
    assert!(found[1].fix.contains("mig: true"), "{}", found[1].fix);
    assert!(found[2].message.contains("the most one node holds is 7 (m)"), "{}", found[2].message);
}
