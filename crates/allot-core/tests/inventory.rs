//! The inventory changing under live work (`Engine::inventory_change`,
//! `Engine::with_inventory`): nodes added, removed, relabelled or given other devices. Live
//! work keeps its devices; a node whose shape its work no longer fits keeps its old shape
//! until that work ends. Named cases through one `check`, then a property over random
//! histories and random reports.

use std::collections::BTreeMap;

use allot_core::{
    Decision, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec, PreemptionMode,
    PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Shares, Stage, Timestamp,
    WorkloadId, WorkloadSpec,
};
use proptest::prelude::*;

fn node(name: &str, gpus: usize, model: &str) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_millis: 64_000,
        memory_mib: 512 * 1024,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: model.into(), memory_mib: 81920, island: 0, mig: false })
            .collect(),
    }
}

fn policy() -> PolicySpec {
    PolicySpec {
        priority_classes: vec![PriorityClassSpec {
            name: "normal".into(),
            value: 0,
            preemptible: true,
        }],
        default_priority_class: "normal".into(),
        projects: ["a", "b"]
            .iter()
            .map(|name| ProjectSpec {
                name: (*name).into(),
                cohort: Some("c".into()),
                department: None,
                quotas: vec![QuotaSpec {
                    model: QuotaModel::Any,
                    guaranteed: Shares::from_gpus(8),
                    borrow_limit: None,
                    lend_limit: None,
                }],
                weight_milli: 1000,
                queueing: Queueing::BestEffortFifo,
                preemption_mode: None,
                preempt_within_project: Default::default(),
                borrow_within_cohort: None,
            })
            .collect(),
        fair_share_half_life_ms: 3_600_000,
        preemption_mode: PreemptionMode::Suspend,
        preemption_guard: allot_core::PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: Vec::new(),
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: 120_000,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: None,
    }
}

fn submit(engine: &mut Engine, at: u64, id: u64, project: &str, gpus: u32) {
    let spec = WorkloadSpec::new(id, &format!("w{id}"), project, GpuRequest::Whole(gpus));
    engine.apply(Timestamp(at), Event::WorkloadSubmitted(spec));
}

/// Decides and starts what was admitted.
fn cycle(engine: &mut Engine, at: u64) -> Vec<Decision> {
    let decisions = engine.decide(Timestamp(at));
    for d in &decisions {
        if let Decision::Admit { workload, .. } = d {
            engine.apply(Timestamp(at), Event::AllocationStarted { workload: *workload });
        }
    }
    decisions
}

/// Where each allocated workload runs, by node name and device index.
fn placements(engine: &Engine) -> BTreeMap<u64, Vec<(String, Vec<u16>)>> {
    let mut out = BTreeMap::new();
    for id in 1..=64 {
        let Some(p) = engine.placement(WorkloadId(id)) else { continue };
        let members = p
            .members
            .iter()
            .map(|m| {
                (
                    engine.node_name(m.node).to_string(),
                    m.devices.iter().map(|d| d.device).collect::<Vec<_>>(),
                )
            })
            .collect();
        out.insert(id, members);
    }
    out
}

/// Runs `history` (one workload per entry: project, GPUs) on `before`, reports `after`, and
/// compares a summary of the change with `expect`: what was added, removed, changed and kept,
/// and that every allocation is where it was.
fn check(before: &[NodeSpec], history: &[(&str, u32)], after: &[NodeSpec], expect: &str) {
    let mut engine = Engine::new(before, &policy()).expect("valid");
    for (i, (project, gpus)) in history.iter().enumerate() {
        submit(&mut engine, i as u64, i as u64 + 1, project, *gpus);
    }
    cycle(&mut engine, 1_000);
    let change = engine.inventory_change(before, after);
    let next = engine.with_inventory(&change, &policy()).expect("carried over");
    next.audit().expect("the carried engine audits");
    assert_eq!(placements(&next), placements(&engine), "live work keeps its devices");
    let names: Vec<&str> = change.nodes.iter().map(|n| n.name.as_str()).collect();
    let got = format!(
        "nodes {names:?}\nadded {:?}\nremoved {:?}\nchanged {:?}\nkept {:?}",
        change.added,
        change.removed,
        change.changed,
        change.kept.iter().map(|(n, why)| format!("{n}: {why}")).collect::<Vec<_>>()
    );
    assert_eq!(got, expect, "\n--- got ---\n{got}\n--- expected ---\n{expect}");
}

#[test]
fn a_node_added_is_usable_for_new_work() {
    let before = [node("n0", 4, "A100")];
    let after = [node("n0", 4, "A100"), node("n1", 8, "H100")];
    check(
        &before,
        &[("a", 4)],
        &after,
        "nodes [\"n0\", \"n1\"]\nadded [\"n1\"]\nremoved []\nchanged []\nkept []",
    );
    let mut engine = Engine::new(&before, &policy()).expect("valid");
    submit(&mut engine, 0, 1, "a", 4);
    cycle(&mut engine, 1_000);
    submit(&mut engine, 2_000, 2, "b", 8);
    let change = engine.inventory_change(&before, &after);
    let mut next = engine.with_inventory(&change, &policy()).expect("carried");
    let decisions = cycle(&mut next, 3_000);
    assert!(
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Admit { workload, .. } if *workload == WorkloadId(2))),
        "the new node's H100s take the pending 8-GPU workload: {decisions:?}"
    );
}

#[test]
fn labels_and_state_changes_are_taken_even_under_live_work() {
    let before = [node("n0", 4, "A100")];
    let mut after = before.clone();
    after[0].labels.insert("slurm.partitions".into(), "gpu,debug".into());
    after[0].rack = Some("r1".into());
    check(
        &before,
        &[("a", 4)],
        &after,
        "nodes [\"n0\"]\nadded []\nremoved []\nchanged [\"n0\"]\nkept []",
    );
}

#[test]
fn a_removed_idle_node_goes_and_a_removed_busy_one_stays_until_its_work_ends() {
    let before = [node("n0", 4, "A100"), node("n1", 4, "A100"), node("n2", 4, "A100")];
    // Workload 1 (4 GPUs) lands on one node; n0 and n1 are identical, so see where.
    let mut probe = Engine::new(&before, &policy()).expect("valid");
    submit(&mut probe, 0, 1, "a", 4);
    cycle(&mut probe, 1_000);
    let busy = placements(&probe)[&1][0].0.clone();
    let after: Vec<NodeSpec> = before.iter().filter(|n| n.name == "n2").cloned().collect();
    let mut removed: Vec<String> =
        ["n0", "n1"].iter().filter(|n| **n != busy).map(|n| n.to_string()).collect();
    removed.sort();
    let names = if busy == "n2" { "[\"n2\"]".to_string() } else { format!("[\"n2\", \"{busy}\"]") };
    let kept = if busy == "n2" {
        "[]".to_string()
    } else {
        format!("[\"{busy}: no longer in the inventory; kept while workload 1 runs there\"]")
    };
    let removed = if busy == "n2" { vec!["n0".to_string(), "n1".to_string()] } else { removed };
    check(
        &before,
        &[("a", 4)],
        &after,
        &format!("nodes {names}\nadded []\nremoved {removed:?}\nchanged []\nkept {kept}"),
    );
}

#[test]
fn devices_changed_under_live_work_keep_the_old_shape_and_apply_once_it_ended() {
    let before = [node("n0", 4, "A100")];
    let after = [node("n0", 2, "A100")];
    check(
        &before,
        &[("a", 4)],
        &after,
        "nodes [\"n0\"]\nadded []\nremoved []\nchanged []\nkept [\"n0: its devices changed in \
         the inventory; the new shape applies once workload 1 no longer runs there\"]",
    );
    // Once the work ended, the same report is taken.
    let mut engine = Engine::new(&before, &policy()).expect("valid");
    submit(&mut engine, 0, 1, "a", 4);
    cycle(&mut engine, 1_000);
    engine.apply(Timestamp(2_000), Event::WorkloadFinished { workload: WorkloadId(1) });
    cycle(&mut engine, 2_000);
    let change = engine.inventory_change(&before, &after);
    assert_eq!(change.changed, vec!["n0".to_string()]);
    assert!(change.kept.is_empty());
    let next = engine.with_inventory(&change, &policy()).expect("carried");
    next.audit().expect("audits");
}

#[test]
fn devices_added_beside_live_work_are_taken_at_once() {
    let before = [node("n0", 4, "A100")];
    let after = [node("n0", 8, "A100")];
    check(
        &before,
        &[("a", 4)],
        &after,
        "nodes [\"n0\"]\nadded []\nremoved []\nchanged [\"n0\"]\nkept []",
    );
}

#[test]
fn a_pending_workload_keeps_its_place_and_a_cancel_still_reaches_the_cycle() {
    let before = [node("n0", 4, "A100")];
    let mut engine = Engine::new(&before, &policy()).expect("valid");
    submit(&mut engine, 0, 1, "a", 4);
    cycle(&mut engine, 1_000);
    submit(&mut engine, 1_500, 2, "a", 4);
    submit(&mut engine, 1_600, 3, "b", 4);
    engine.apply(Timestamp(1_700), Event::WorkloadCancelled { workload: WorkloadId(1) });
    let after = [node("n0", 4, "A100"), node("n1", 4, "A100")];
    let change = engine.inventory_change(&before, &after);
    let mut next = engine.with_inventory(&change, &policy()).expect("carried");
    let decisions = next.decide(Timestamp(2_000));
    assert!(
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Stop { workload, .. } if *workload == WorkloadId(1))),
        "the cancel made before the change is decided: {decisions:?}"
    );
    // b has used nothing yet, so by fair share its workload takes the new node; a's waits.
    assert!(
        decisions
            .iter()
            .any(|d| matches!(d, Decision::Admit { workload, .. } if *workload == WorkloadId(3))),
        "a pending workload takes the new node: {decisions:?}"
    );
    assert_eq!(next.stage(WorkloadId(2)), Some(Stage::Pending));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    /// Whatever the history and the report: the carried engine audits, every allocation is on
    /// the same node names and devices, the engine's nodes are exactly the report plus the
    /// kept nodes, and it goes on deciding (audited) afterwards.
    #[test]
    fn any_report_keeps_live_work_where_it_runs(
        shape in prop::collection::vec((0usize..5, 0usize..3), 1..5),
        reported in prop::collection::vec((0usize..7, 0usize..5, 0usize..3), 0..6),
        work in prop::collection::vec((0usize..2, 1u32..5), 0..10),
        ends in prop::collection::vec(0u64..10, 0..4),
    ) {
        let models = ["A100", "H100", "L4"];
        let before: Vec<NodeSpec> = shape
            .iter()
            .enumerate()
            .map(|(i, (gpus, model))| node(&format!("n{i}"), *gpus, models[*model]))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let after: Vec<NodeSpec> = reported
            .iter()
            .filter(|(i, _, _)| seen.insert(*i))
            .map(|(i, gpus, model)| node(&format!("n{i}"), *gpus, models[*model]))
            .collect();
        let mut engine = Engine::new(&before, &policy()).expect("valid");
        for (i, (project, gpus)) in work.iter().enumerate() {
            submit(&mut engine, i as u64, i as u64 + 1, ["a", "b"][*project], *gpus);
        }
        cycle(&mut engine, 1_000);
        for id in &ends {
            engine.apply(Timestamp(1_500), Event::WorkloadFinished { workload: WorkloadId(id + 1) });
        }
        cycle(&mut engine, 2_000);
        let change = engine.inventory_change(&before, &after);
        let mut next = engine.with_inventory(&change, &policy()).expect("carried over");
        prop_assert!(next.audit().is_ok(), "{:?}", next.audit());
        prop_assert_eq!(placements(&next), placements(&engine));
        let mut expected: Vec<&str> = after.iter().map(|n| n.name.as_str()).collect();
        for (name, _) in &change.kept {
            if !expected.contains(&name.as_str()) {
                expected.push(name);
            }
        }
        let names: Vec<&str> = change.nodes.iter().map(|n| n.name.as_str()).collect();
        prop_assert_eq!(names, expected);
        cycle(&mut next, 3_000);
        prop_assert!(next.audit().is_ok());
    }
}
