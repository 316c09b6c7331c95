//! The idle-reclaim experiment: a hand-checked notebook under each policy (AMD's timer resets
//! on a short kernel, allot's does not), determinism, the books and the metrics' ranges, and
//! the real Philly cluster for a few hours.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_core::{DeviceSpec, NodeSpec, WorkloadKind};
use allot_sim::BadRows;
use allot_sim::activity::ActivityParams;
use allot_sim::idle::{
    IdleReport, IdleSimConfig, IdleWorkload, KIND_MIX, PolicyMetrics, TelemetryModel,
    generate_workloads, idle_json, idle_policies, idle_text, run_idle_experiment, run_policy,
};
use allot_sim::trace::{load_philly_machines, philly_nodes};

fn node(name: &str, gpus: usize) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_millis: 0,
        memory_mib: 0,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: "12GB".into(), memory_mib: 0, island: 0, mig: false })
            .collect(),
    }
}

fn workload(
    id: u64,
    kind: WorkloadKind,
    project: &str,
    submit_s: f64,
    duration_s: f64,
) -> IdleWorkload {
    IdleWorkload {
        id,
        kind,
        project: project.into(),
        priority_class: None,
        members: 1,
        gpus_per_member: 1,
        submit_s,
        duration_s,
        checkpoint_interval_s: (kind == WorkloadKind::Training).then_some(1800.0),
    }
}

/// The books balance and every figure is in range.
fn check_books(label: &str, m: &PolicyMetrics) {
    let parts = m.useful_gpu_hours + m.idle_allocated_gpu_hours + m.lost_gpu_hours;
    assert!(
        (m.allocated_gpu_hours - parts).abs() < 1e-6,
        "{label}: allocated {} ≠ useful + idle + lost {parts}",
        m.allocated_gpu_hours
    );
    assert!((0.0..=1.0).contains(&m.goodput), "{label}: goodput {}", m.goodput);
    assert!(m.reclaimed_idle_gpu_hours_gross >= 0.0 && m.reclaimed_idle_gpu_hours >= 0.0);
    assert!(m.reclaimed_idle_gpu_hours <= m.reclaimed_idle_gpu_hours_gross + 1e-9, "{label}");
    // Reused: held by other work inside the reclaimed windows, so never more than reclaimed.
    assert!(m.reused_gpu_hours >= 0.0, "{label}");
    assert!(m.reused_gpu_hours <= m.reclaimed_idle_gpu_hours + 1e-9, "{label}");
    let reused: f64 = m.by_kind.values().map(|k| k.reused_gpu_hours).sum();
    assert!((reused - m.reused_gpu_hours).abs() < 1e-9, "{label}");
    assert!(m.lost_gpu_hours >= 0.0 && m.idle_allocated_gpu_hours >= -1e-9, "{label}");
    assert!(m.active_gpu_hours <= m.allocated_gpu_hours + 1e-9, "{label}");
    assert!(m.useful_gpu_hours <= m.active_gpu_hours + 1e-9, "{label}");
    assert!(m.false_reclaims <= m.idle_reclaims && m.idle_reclaims <= m.preemptions, "{label}");
    assert!(m.idle_reclaimed_workloads <= m.idle_reclaims, "{label}");
    assert_eq!(m.idle_reclaimed_workloads == 0, m.idle_reclaims == 0, "{label}");
    assert!(m.deleted <= m.preemptions && m.redeployed <= m.deleted, "{label}");
    assert!(m.pending_wait_s_p95 >= 0.0);
    let by_kind: u64 = m.by_kind.values().map(|k| k.idle_reclaims).sum();
    assert_eq!(by_kind, m.idle_reclaims, "{label}");
    // The core's goodput ledger, folded over the same events and decisions, agrees with the
    // simulator's own books on what was allocated, and its projects add up to the cluster.
    let cluster = &m.ledger["cluster"];
    assert!(
        (cluster.allocated_gpu_hours - m.allocated_gpu_hours).abs()
            < 1e-6 * m.allocated_gpu_hours.max(1.0),
        "{label}: ledger {} ≠ sim {}",
        cluster.allocated_gpu_hours,
        m.allocated_gpu_hours
    );
    let projects: f64 =
        m.ledger.iter().filter(|(s, _)| *s != "cluster").map(|(_, r)| r.allocated_gpu_hours).sum();
    assert!((projects - cluster.allocated_gpu_hours).abs() < 1e-6 * projects.max(1.0), "{label}");
    assert!(cluster.fragmented_gpu_hours <= cluster.free_gpu_hours + 1e-9, "{label}");
    assert!(
        (cluster.allocated_gpu_hours + cluster.free_gpu_hours - cluster.capacity_gpu_hours).abs()
            < 0.01 * cluster.capacity_gpu_hours.max(1.0),
        "{label}: allocated + free ≠ capacity"
    );
}

/// A two-node cluster: an abandoned notebook (no user ever) next to a busy, exempt batch job;
/// at 1 h a training job arrives and there is no free GPU. A health check runs a short kernel
/// every 10 minutes: utilisation reads 100 % in that sample, SM-active stays at 0.
fn hand_checked(spikes: bool) -> BTreeMap<String, PolicyMetrics> {
    let nodes = vec![node("a", 1), node("b", 1)];
    let config = IdleSimConfig {
        hours: 3.0,
        activity: ActivityParams {
            hung_share: 0.0,
            notebook_session_share: 0.0,
            batch_base: (0.8, 0.9),
            training_stall_share: 0.0,
            ..ActivityParams::default()
        },
        telemetry: TelemetryModel {
            spike_share: 0.0,
            spike_every_s: spikes.then_some(600.0),
            outage_mean_interval_s: None,
            ..TelemetryModel::default()
        },
        audit: true,
        ..IdleSimConfig::default()
    };
    let mut busy = workload(2, WorkloadKind::Batch, "nlp", 0.0, 36_000.0);
    busy.priority_class = Some("high".into());
    let workloads = vec![
        workload(1, WorkloadKind::Notebook, "vision", 0.0, 9000.0),
        busy,
        workload(3, WorkloadKind::Training, "speech", 3600.0, 36_000.0),
    ];
    idle_policies()
        .iter()
        .map(|(label, p)| {
            let m = run_policy(&nodes, label, p, &workloads, &config).expect("runs");
            check_books(label, &m);
            (label.clone(), m)
        })
        .collect()
}

#[test]
fn a_short_kernel_resets_amd_and_runai_timers_but_not_allot() {
    let m = hand_checked(true);
    // allot judges SM-active (0 %), so the 10-minute kernel never resets its timer: idle from
    // the end of the 5-minute start-up grace, warned at 10 min idle, ready at 15; reclaimed
    // (suspended) when the training job arrives at 1 h and finds no GPU. It would have stayed
    // idle to the end of its session at 2.5 h: 1.5 GPU-hours.
    let allot = &m["allot"];
    assert_eq!((allot.idle_reclaims, allot.idle_reclaimed_workloads), (1, 1));
    assert_eq!(allot.false_reclaims, 0);
    assert_eq!(allot.warnings, 1);
    assert_eq!(allot.deleted, 0);
    assert!((allot.reclaimed_idle_gpu_hours_gross - 1.5).abs() < 1e-9, "{allot:?}");
    // The training job takes the GPU at the next tick (15 s later) and holds it to the end:
    // all of the reclaimed 1.5 GPU-hours but those 15 s are reused.
    assert!((allot.reclaimed_idle_gpu_hours - 1.5).abs() < 1e-9, "{allot:?}");
    assert!((allot.reused_gpu_hours - (1.5 - 15.0 / 3600.0)).abs() < 1e-9, "{allot:?}");
    // It never ran anything, so nothing was lost; it waits until its session ends.
    assert!(allot.lost_gpu_hours.abs() < 1e-9);
    assert_eq!(allot.notebooks_ended_pending, 1);
    // AMD's and Run:ai's rules read utilisation: every 10 minutes one sample reads 100 % and
    // resets the 15-minute timer. Neither ever reclaims; the training job waits.
    for label in ["amd_rm", "runai"] {
        assert_eq!(m[label].idle_reclaims, 0, "{label}");
        assert_eq!(m[label].warnings, 0, "{label}");
    }
    // It starts when the notebook's session ends at 2.5 h, after the 30 s launch delay.
    assert_eq!(m["amd_rm"].pending_wait_s_p95, 9000.0 + 30.0 - 3600.0);
}

#[test]
fn without_the_short_kernel_amd_deletes_and_runai_suspends_over_and_over() {
    let m = hand_checked(false);
    // AMD: idle 15 min (no grace), then on pressure at 1 h: deleted, and never redeployed
    // (its user never comes back). Same idle future as allot's reclaim.
    let amd = &m["amd_rm"];
    assert_eq!((amd.idle_reclaims, amd.deleted, amd.redeployed), (1, 1, 0));
    assert!((amd.reclaimed_idle_gpu_hours_gross - 1.5).abs() < 1e-9, "{amd:?}");
    // Run:ai: `always`, 15 min of zero windows: reclaimed at 15 min, resumed after the
    // backoff, reclaimed again; the training job finds the GPU free at some point.
    let runai = &m["runai"];
    assert!(runai.idle_reclaims >= 2, "{runai:?}");
    assert_eq!(runai.idle_reclaimed_workloads, 1);
    assert_eq!(runai.deleted, 0);
    // allot does the same as with the kernel.
    assert_eq!(m["allot"].idle_reclaims, 1);
}

fn small_config(seed: u64) -> IdleSimConfig {
    IdleSimConfig { seed, hours: 8.0, offered_load: 1.6, audit: true, ..IdleSimConfig::default() }
}

fn small_cluster() -> Vec<NodeSpec> {
    (0..6).map(|i| node(&format!("n{i}"), if i % 2 == 0 { 8 } else { 2 })).collect()
}

fn run_small(seed: u64) -> IdleReport {
    run_idle_experiment(&small_cluster(), &idle_policies(), &small_config(seed), &|| 0)
        .expect("runs")
}

#[test]
fn same_seed_same_bytes_and_another_seed_other_numbers() {
    let a = idle_json(&run_small(7));
    assert_eq!(a, idle_json(&run_small(7)));
    assert_ne!(a, idle_json(&run_small(8)));
    let report: serde_json::Value = serde_json::from_str(&a).expect("JSON");
    let policies = report["policies"].as_object().expect("policies");
    // In the order given (serde_json's map sorts keys, so look at the text).
    let at = |label: &str| a.find(&format!("\"{label}\": {{")).expect(label);
    assert!(at("amd_rm") < at("runai") && at("runai") < at("allot"));
    assert!(a.trim_start().starts_with("{\n  \"policies\""));
    for key in [
        "reclaimed_idle_gpu_hours_gross",
        "false_reclaims",
        "lost_gpu_hours",
        "pending_wait_s_p95",
        "goodput",
        "idle_reclaims",
        "warnings",
        "deleted",
        "redeployed",
        "allocated_gpu_hours",
        "active_gpu_hours",
        "idle_allocated_gpu_hours",
        "jobs_finished",
        "telemetry_gap_samples",
        "wall_ms",
    ] {
        assert!(policies["allot"].get(key).is_some(), "{key}");
    }
    for key in ["seed", "hours", "cluster_gpus", "mix", "goal"] {
        assert!(report.get(key).is_some(), "{key}");
    }
    assert!(report["goal"]["holds"].is_boolean());
}

#[test]
fn books_balance_and_figures_are_in_range_under_pressure() {
    let report = run_small(11);
    for (label, m) in &report.policies.0 {
        check_books(label, m);
        assert!(m.allocated_gpu_hours > 0.0 && m.allocated_gpu_hours <= 36.0 * 8.0 + 1e-6);
        assert!(m.telemetry_gap_samples > 0, "{label}: outages are on by default");
    }
    // Under 1.6 × capacity every policy's AMD/Run:ai/allot rules find idle work to reclaim.
    let m: BTreeMap<&str, &PolicyMetrics> =
        report.policies.0.iter().map(|(l, m)| (l.as_str(), m)).collect();
    assert!(m["allot"].idle_reclaims > 0 && m["runai"].idle_reclaims > 0);
    assert!(m["allot"].deleted == 0 && m["runai"].deleted == 0);
    assert_eq!(m["amd_rm"].deleted, m["amd_rm"].idle_reclaims);
    let text = idle_text(&report);
    assert!(text.contains("allot") && text.contains("goal"), "{text}");
}

#[test]
fn the_generated_mix_is_the_documented_one() {
    let config = IdleSimConfig { hours: 48.0, ..IdleSimConfig::default() };
    let (workloads, mix) = generate_workloads(2490, &config);
    let total = mix.iter().find(|(k, _)| k == "total").expect("total").1.clone();
    let target = 1.15 * 2490.0 * 48.0;
    assert!((total.offered_gpu_hours / target - 1.0).abs() < 0.01, "{}", total.offered_gpu_hours);
    for (kind, share) in KIND_MIX {
        let e = &mix.iter().find(|(k, _)| k == kind.as_str()).expect("kind").1;
        assert!((e.share - share).abs() < 0.005, "{kind:?}: {}", e.share);
    }
    // Ids follow submission; endpoints first, at t = 0, in project platform.
    assert!(workloads.windows(2).all(|w| w[0].submit_s <= w[1].submit_s && w[0].id < w[1].id));
    for w in &workloads {
        if w.endpoint() {
            assert_eq!((w.submit_s, w.project.as_str()), (0.0, "platform"));
        } else {
            assert_ne!(w.project, "platform");
            assert!(w.submit_s < 48.0 * 3600.0);
        }
    }
    let high = workloads.iter().filter(|w| w.priority_class.is_some()).count() as f64;
    assert!((high / workloads.len() as f64 - 0.05).abs() < 0.01);
    let gangs = workloads.iter().filter(|w| w.members == 2 && w.gpus_per_member == 8).count();
    assert!(gangs > 0);
}

fn philly() -> Vec<NodeSpec> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/philly-machines/cluster_machine_list");
    let (machines, _) = load_philly_machines(&path, BadRows::Fail).expect("machine list");
    philly_nodes(&machines)
}

#[test]
fn the_philly_cluster_for_three_hours() {
    let nodes = philly();
    // The cluster is still filling up in the first hours (no pressure yet: the small cluster
    // above has it); this runs the real machine list, its two GPU models and 8-GPU gangs.
    let config = IdleSimConfig { hours: 3.0, ..IdleSimConfig::default() };
    let report = run_idle_experiment(&nodes, &idle_policies(), &config, &|| 0).expect("runs");
    assert_eq!((report.cluster_machines, report.cluster_gpus), (552, 2490));
    for (label, m) in &report.policies.0 {
        check_books(label, m);
        assert!(m.allocated_gpu_hours > 2490.0, "{label}: {m:?}");
        assert!(m.jobs_finished > 0 && m.telemetry_gap_samples > 0, "{label}");
        assert!(m.warnings > 0, "{label}: idle endpoints at night, abandoned notebooks");
    }
}
