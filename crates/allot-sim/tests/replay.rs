//! Replay invariants on hand-made traces (hand-computed pre-emption costs), GPU-hour
//! conservation, determinism, and the first 2,000 Philly jobs (all 65,797 with
//! `ALLOT_SLOW_TESTS=1`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use allot_core::{
    DeviceSpec, NodeSpec, PolicySpec, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Shares, WorkloadKind,
};
use allot_sim::BadRows;
use allot_sim::outcome::ReplayReport;
use allot_sim::replay::{ReplayConfig, add_unlisted_projects, replay};
use allot_sim::trace::{
    TraceJob, load_philly_jobs, load_philly_machines, load_philly_vcs, philly_nodes,
};

fn node(name: &str, gpus: usize) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_millis: 0,
        memory_mib: 0,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: "G".into(), memory_mib: 0, island: 0, mig: false })
            .collect(),
    }
}

fn project(name: &str, guaranteed_gpus: u64) -> ProjectSpec {
    ProjectSpec {
        name: name.into(),
        cohort: Some("c".into()),
        department: None,
        quotas: vec![QuotaSpec {
            model: QuotaModel::Any,
            guaranteed: Shares::from_gpus(guaranteed_gpus),
            borrow_limit: None,
            lend_limit: None,
        }],
        weight_milli: 1000,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    }
}

fn policy(mode: PreemptionMode) -> PolicySpec {
    policy_with(mode, 2)
}

/// Projects `a` and `b` in one cohort, each guaranteed `gpus`.
fn policy_with(mode: PreemptionMode, gpus: u64) -> PolicySpec {
    PolicySpec {
        priority_classes: vec![PriorityClassSpec {
            name: "normal".into(),
            value: 0,
            preemptible: true,
        }],
        default_priority_class: "normal".into(),
        projects: vec![project("a", gpus), project("b", gpus)],
        preemption_mode: mode,
        ..PolicySpec::minimal()
    }
}

fn job(id: u64, project: &str, submit_s: f64, duration_s: f64, gpus: u32) -> TraceJob {
    TraceJob::whole(id, project, submit_s, duration_s, 1, gpus)
}

fn config() -> ReplayConfig {
    ReplayConfig {
        restart_delay_s: 60.0,
        checkpoint_grace_s: 30.0,
        audit: true,
        ..ReplayConfig::default()
    }
}

/// allocated = useful + lost + idle, for the cluster and every project; the project ledgers
/// add up to the cluster's; every job is finished, pending or cancelled.
fn assert_books_balance(r: &ReplayReport) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    let sum = r.useful_gpu_hours + r.lost_gpu_hours + r.idle_gpu_hours;
    assert!(close(r.allocated_gpu_hours, sum), "{} != {sum}", r.allocated_gpu_hours);
    for p in &r.projects {
        let sum = p.useful_gpu_hours + p.lost_gpu_hours + p.idle_gpu_hours;
        assert!(
            close(p.allocated_gpu_hours, sum),
            "{}: {} != {sum}",
            p.project,
            p.allocated_gpu_hours
        );
        assert!(p.active_gpu_hours <= p.allocated_gpu_hours + 1e-9);
    }
    let projects: f64 = r.projects.iter().map(|p| p.allocated_gpu_hours).sum();
    assert!(close(projects, r.allocated_gpu_hours));
    let lost: f64 = r.projects.iter().map(|p| p.lost_gpu_hours).sum();
    assert!(close(lost, r.lost_gpu_hours));
    assert_eq!(r.jobs_finished + r.jobs_pending + r.jobs_cancelled, r.jobs_total);
    // Jobs of a project the policy lacks were rejected and belong to no ledger.
    assert!(r.projects.iter().map(|p| p.jobs_total).sum::<usize>() <= r.jobs_total);
    assert!(r.queue_delays_s.windows(2).all(|w| w[0] <= w[1]));
    assert!(r.goodput >= 0.0 && r.goodput <= 1.0);
}

fn ledger<'a>(r: &'a ReplayReport, name: &str) -> &'a allot_sim::outcome::ProjectLedger {
    r.projects.iter().find(|p| p.project == name).expect("project")
}

#[test]
fn a_reclaimed_job_without_checkpoints_loses_its_whole_run_and_its_restart() {
    // b borrows a's two GPUs at t=0; a asks for its guarantee at t=100 and reclaims them.
    let nodes = [node("n0", 4)];
    let jobs = [job(1, "b", 0.0, 1000.0, 4), job(2, "a", 100.0, 100.0, 2)];
    let r = replay(&nodes, &policy(PreemptionMode::Suspend), "p", &jobs, &config()).expect("runs");
    assert_eq!((r.jobs_finished, r.preemptions), (2, 1));
    // b: 4 GPUs × 100 s of work thrown away + 4 × 60 s restart.
    let b = ledger(&r, "b");
    assert!((b.lost_gpu_hours * 3600.0 - (400.0 + 240.0)).abs() < 1e-6, "{}", b.lost_gpu_hours);
    // b held 4 GPUs for 0..100 and, after a's 100..200, 200..1260 (60 s restart + 1000 s).
    assert!((b.allocated_gpu_hours * 3600.0 - 4.0 * (100.0 + 1060.0)).abs() < 1e-6);
    assert_eq!(ledger(&r, "a").lost_gpu_hours, 0.0);
    // Queue delays: a starts at once (after the stop), b first started at 0.
    assert_eq!(r.queue_delays_s, vec![0.0, 0.0]);
    // JCT: b ends at 1260, a at 200: mean (1260 + 100) / 2.
    assert!((r.jct_s_mean - 680.0).abs() < 1e-6, "{}", r.jct_s_mean);
    assert_books_balance(&r);
}

#[test]
fn a_checkpointing_job_loses_only_the_work_since_its_last_checkpoint() {
    let nodes = [node("n0", 4)];
    let mut b = job(1, "b", 0.0, 1000.0, 4);
    b.checkpoint_interval_s = Some(30.0);
    let jobs = [b, job(2, "a", 100.0, 100.0, 2)];
    let r = replay(&nodes, &policy(PreemptionMode::Suspend), "p", &jobs, &config()).expect("runs");
    assert_eq!((r.jobs_finished, r.preemptions), (2, 1));
    // Told to stop at 100 with 30 s grace: stops at 130, last checkpoint at 120 → 4 × 10 s
    // lost, plus 4 × 60 s restart.
    let lost = ledger(&r, "b").lost_gpu_hours * 3600.0;
    assert!((lost - (40.0 + 240.0)).abs() < 1e-6, "{lost}");
    // a waits for the grace: queue delay 30 s.
    assert_eq!(r.queue_delays_s, vec![0.0, 30.0]);
    assert_books_balance(&r);
}

#[test]
fn checkpoints_at_fractional_start_times_do_not_stall_virtual_time() {
    // Started at 2.001 s, the first checkpoint falls at 32.001 s, where 32.001 − 2.001 is
    // 29.999999999999996 in floating point: the checkpoint must not be rescheduled at the same
    // millisecond forever (a hang seen with `--load 3`).
    let nodes = [node("n0", 4)];
    let mut j = job(1, "a", 2.001, 100.0, 1);
    j.checkpoint_interval_s = Some(30.0);
    let r = replay(&nodes, &policy(PreemptionMode::Suspend), "p", &[j], &config()).expect("runs");
    assert_eq!(r.jobs_finished, 1);
    assert_books_balance(&r);
}

#[test]
fn requeue_throws_away_checkpoints_and_delete_cancels() {
    let nodes = [node("n0", 4)];
    let mut b = job(1, "b", 0.0, 1000.0, 4);
    b.checkpoint_interval_s = Some(30.0);
    let jobs = [b, job(2, "a", 100.0, 100.0, 2)];
    let r = replay(&nodes, &policy(PreemptionMode::Requeue), "p", &jobs, &config()).expect("runs");
    // 130 s of b's work (checkpointed or not) is redone, plus the restart.
    let lost = ledger(&r, "b").lost_gpu_hours * 3600.0;
    assert!((lost - 4.0 * (130.0 + 60.0)).abs() < 1e-6, "{lost}");
    assert_books_balance(&r);

    let r = replay(&nodes, &policy(PreemptionMode::Delete), "p", &jobs, &config()).expect("runs");
    assert_eq!((r.jobs_finished, r.jobs_cancelled), (1, 1));
    assert!((ledger(&r, "b").lost_gpu_hours * 3600.0 - 4.0 * 130.0).abs() < 1e-6);
    assert_books_balance(&r);
}

#[test]
fn impossible_jobs_are_cancelled_and_until_leaves_work_pending() {
    let nodes = [node("n0", 4), node("n1", 4)];
    let mut gang = job(3, "a", 0.0, 50.0, 4);
    gang.members = 2; // 2 × 4 GPUs: fits the two nodes
    let jobs = [
        job(1, "a", 0.0, 100.0, 16), // more than a node holds → never placeable
        job(2, "b", 0.0, 10_000.0, 1),
        gang,
        job(4, "zz", 0.0, 10.0, 1), // a project the policy lacks → rejected
    ];
    let policy = policy_with(PreemptionMode::Suspend, 4);
    let r = replay(&nodes, &policy, "p", &jobs, &config()).expect("runs");
    assert_eq!((r.jobs_finished, r.jobs_cancelled, r.jobs_pending), (2, 2, 0));
    assert_books_balance(&r);
    // With 2 + 2 guaranteed, the 8-GPU gang exceeds what project a could ever hold.
    let r = replay(&nodes, &policy_with(PreemptionMode::Suspend, 2), "p", &jobs, &config())
        .expect("runs");
    assert_eq!((r.jobs_finished, r.jobs_cancelled), (1, 3));

    let until = ReplayConfig { until_s: Some(1000.0), ..config() };
    let r = replay(&nodes, &policy, "p", &jobs, &until).expect("runs");
    // Job 2 took one GPU at t=0, so the 8-GPU gang waits for its end at 10,000 s.
    assert_eq!((r.jobs_finished, r.jobs_cancelled, r.jobs_pending), (0, 2, 2));
    assert_eq!(r.span_s, 1000.0);
    assert!((r.allocated_gpu_hours * 3600.0 - 1000.0).abs() < 1e-6);
    assert_books_balance(&r);
}

#[test]
fn unlisted_projects_get_no_guarantee_and_only_borrow() {
    let jobs = [job(1, "zz", 0.0, 10.0, 1), job(2, "a", 0.0, 10.0, 1), job(3, "zz", 5.0, 1.0, 1)];
    let (p, added) = add_unlisted_projects(&policy(PreemptionMode::Suspend), &jobs);
    assert_eq!(added, vec!["zz".to_string()]);
    let zz = p.projects.iter().find(|p| p.name == "zz").expect("added");
    assert_eq!(zz.cohort.as_deref(), Some("c"));
    assert_eq!(zz.quotas[0].guaranteed, Shares::ZERO);
    let r = replay(&[node("n0", 4)], &p, "p", &jobs, &config()).expect("runs");
    assert_eq!(r.jobs_finished, 3);
}

fn report_json(r: &ReplayReport) -> String {
    serde_json::to_string(r).expect("serialises")
}

/// The first `limit` Philly jobs on the whole cluster, or on `small` × (8-GPU, 2-GPU)
/// machines with the example policy's guarantees scaled to what is kept.
fn philly(
    limit: usize,
    small: Option<(usize, usize)>,
) -> (Vec<NodeSpec>, PolicySpec, Vec<TraceJob>) {
    let traces = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    let (machines, _) =
        load_philly_machines(&traces.join("philly-machines/cluster_machine_list"), BadRows::Fail)
            .expect("machines");
    let machines: Vec<_> = match small {
        None => machines,
        Some((big, little)) => {
            let big = machines.iter().filter(|m| m.gpus == 8).take(big);
            let little = machines.iter().filter(|m| m.gpus == 2).take(little);
            big.chain(little).cloned().collect()
        }
    };
    let nodes = philly_nodes(&machines);
    let per_node = nodes.iter().map(|n| n.devices.len() as u32).max().unwrap_or(0);
    let loaded =
        load_philly_jobs(&traces.join("philly-pollux/philly.csv"), BadRows::Fail).expect("jobs");
    let jobs: Vec<TraceJob> = loaded.jobs[..limit.min(loaded.jobs.len())]
        .iter()
        .enumerate()
        .map(|(i, j)| j.to_trace_job(i as u64 + 1, per_node))
        .collect();
    let vcs = load_philly_vcs(&traces.join("philly-machines/philly_vc.csv")).expect("vcs");
    let policy_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/philly-policy.yaml");
    let policy = allot_config::load_policy(&policy_path).expect("example policy");
    for vc in &vcs {
        assert!(policy.projects.iter().any(|p| p.name == vc.name), "{} not in the policy", vc.name);
    }
    // Guarantees are shares of the whole cluster: scale them to the machines kept.
    let gpus: u64 = nodes.iter().map(|n| n.devices.len() as u64).sum();
    let mut policy = policy;
    for p in &mut policy.projects {
        for q in &mut p.quotas {
            q.guaranteed = Shares(q.guaranteed.0 * gpus / 2490);
        }
    }
    let (policy, _) = add_unlisted_projects(&policy, &jobs);
    (nodes, policy, jobs)
}

#[test]
fn the_first_2000_philly_jobs_replay_deterministically_with_balanced_books() {
    let (nodes, policy, jobs) = philly(2000, None);
    let r = replay(&nodes, &policy, "philly", &jobs, &config()).expect("runs");
    assert_eq!((r.jobs_total, r.jobs_finished), (2000, 2000));
    assert_eq!(r.capacity_gpus, 2490.0);
    assert_books_balance(&r);
    let again = replay(&nodes, &policy, "philly", &jobs, &config()).expect("runs");
    assert_eq!(report_json(&r), report_json(&again));
    let other_seed = ReplayConfig { seed: 7, ..config() };
    let r7 = replay(&nodes, &policy, "philly", &jobs, &other_seed).expect("runs");
    assert_ne!(r.gpu_active_pct, r7.gpu_active_pct, "the seed drives the activity model");
    assert_eq!(r.gpu_allocated_pct, r7.gpu_allocated_pct, "no pre-emption: same allocation");
}

#[test]
fn philly_on_a_small_cluster_queues_reclaims_and_still_balances() {
    // 400 jobs on 5 8-GPU and 10 2-GPU machines (60 GPUs): queues build up and quota
    // reclaim fires.
    let (nodes, policy, jobs) = philly(400, Some((5, 10)));
    let cfg =
        ReplayConfig { default_checkpoint_interval_s: Some(1800.0), audit: false, ..config() };
    let r = replay(&nodes, &policy, "philly-small", &jobs, &cfg).expect("runs");
    assert!(r.preemptions > 0, "no pre-emption on a small cluster");
    assert!(r.queue_delay_s_p95 > 0.0);
    assert!(r.lost_gpu_hours > 0.0);
    assert_eq!(r.jobs_finished + r.jobs_cancelled, 400);
    assert_eq!(r.capacity_gpus, 60.0);
    assert_books_balance(&r);
    let again = replay(&nodes, &policy, "philly-small", &jobs, &cfg).expect("runs");
    assert_eq!(report_json(&r), report_json(&again));
}

#[test]
fn the_policys_cap_bounds_how_often_one_job_is_preempted_in_a_replay() {
    // The small-cluster Philly replay above, with the guard off and with a cap of one
    // pre-emption per job per year: the cap holds for every job, and the books still balance.
    let (nodes, mut policy, jobs) = philly(400, Some((5, 10)));
    let cfg =
        ReplayConfig { default_checkpoint_interval_s: Some(1800.0), audit: false, ..config() };
    policy.preemption_guard = allot_core::PreemptionGuard::OFF;
    let off = replay(&nodes, &policy, "off", &jobs, &cfg).expect("runs");
    assert!(off.preemptions_per_job_max > 1, "no job pre-empted twice: the test shows nothing");
    policy.preemption_guard = allot_core::PreemptionGuard {
        exempt_after_restart_ms: 0,
        limit: Some(allot_core::PreemptionLimit { count: 1, window_ms: 365 * 86_400_000 }),
        reclaim_after_ms: 0,
    };
    let capped = replay(&nodes, &policy, "capped", &jobs, &cfg).expect("runs");
    assert!(capped.preemptions > 0);
    assert_eq!(capped.preemptions_per_job_max, 1);
    assert_eq!(capped.jobs_preempted as u64, capped.preemptions);
    assert!(off.jobs_preempted as u64 <= off.preemptions);
    assert_eq!(capped.jobs_finished + capped.jobs_cancelled, 400);
    assert_books_balance(&off);
    assert_books_balance(&capped);
}

#[test]
fn the_whole_philly_trace_replays_when_slow_tests_are_on() {
    if std::env::var_os("ALLOT_SLOW_TESTS").is_none() {
        return;
    }
    let (nodes, policy, jobs) = philly(usize::MAX, None);
    let cfg = ReplayConfig { audit: false, ..config() };
    let r = replay(&nodes, &policy, "philly", &jobs, &cfg).expect("runs");
    assert_eq!((r.jobs_total, r.jobs_finished), (65_797, 65_797));
    assert_books_balance(&r);
}

mod random_traces {
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    }

    /// (project b?, submit ms, duration ms, GPUs, checkpoint interval ms or 0, kind)
    type JobShape = (bool, u64, u64, u32, u64, u8);

    fn traces() -> impl Strategy<Value = Vec<JobShape>> {
        prop::collection::vec(
            (any::<bool>(), 0u64..600_000, 1u64..3_000_000, 1u32..=6, 0u64..400_000, 0u8..6),
            1..30,
        )
    }

    fn build(shapes: &[JobShape]) -> Vec<TraceJob> {
        let kinds = [
            None,
            Some(WorkloadKind::Notebook),
            Some(WorkloadKind::Inference),
            Some(WorkloadKind::Service),
            Some(WorkloadKind::Training),
            Some(WorkloadKind::Batch),
        ];
        shapes
            .iter()
            .enumerate()
            .map(|(i, &(b, submit, duration, gpus, interval, kind))| {
                let mut j = job(
                    i as u64 + 1,
                    if b { "b" } else { "a" },
                    submit as f64 / 1000.0,
                    duration as f64 / 1000.0,
                    gpus,
                );
                j.checkpoint_interval_s = (interval > 0).then(|| interval as f64 / 1000.0);
                j.kind = kinds[usize::from(kind) % kinds.len()];
                j
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Any trace on a small contended cluster: the replay ends (time never stalls), every
        /// job is finished, pending or cancelled, the GPU-hour books balance, the engine's
        /// invariants hold after every cycle, and the same inputs give the same report.
        #[test]
        fn any_trace_ends_with_balanced_books(
            shapes in traces(),
            mode in 0usize..3,
            guaranteed in 0u64..=4,
        ) {
            let mode = [PreemptionMode::Suspend, PreemptionMode::Requeue, PreemptionMode::Delete][mode];
            let nodes = [node("n0", 4), node("n1", 2)];
            let policy = policy_with(mode, guaranteed);
            let jobs = build(&shapes);
            let first = replay(&nodes, &policy, "p", &jobs, &config());
            let first = first.map_err(|e| TestCaseError::fail(e.to_string()))?;
            assert_books_balance(&first);
            prop_assert_eq!(first.jobs_total, jobs.len());
            let again = replay(&nodes, &policy, "p", &jobs, &config())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(report_json(&first), report_json(&again));
        }
    }
}

/// A rollout rehearsed on a replay: from its time the scoped policy decides, its conditions
/// are judged on the replay's own outcomes at each check, and one that trips ends it there
/// with the figures that tripped it; one that holds leaves it in place to the end.
#[test]
fn a_rehearsed_rollout_rolls_back_when_its_condition_trips_and_not_otherwise() {
    use allot_config::rollout::{Condition, RollbackRules};
    let nodes = vec![node("n0", 4)];
    let active = policy(PreemptionMode::Suspend);
    let mut candidate = active.clone();
    candidate.projects[0].weight_milli = 3000;
    let scope = allot_config::Scope::Project("a".into());
    let scoped = allot_config::scoped_policy(&active, &candidate, &scope).expect("scoped");
    // One 1-GPU job of each project every 100 s, 60 s long: 40 jobs over 2,000 s.
    let jobs: Vec<TraceJob> = (0..40)
        .map(|i| job(i + 1, if i % 2 == 0 { "a" } else { "b" }, (i / 2) as f64 * 100.0, 60.0, 1))
        .collect();
    let rehearse = |condition: &str| {
        let rules = RollbackRules {
            conditions: vec![Condition::parse(condition).expect("condition")],
            baseline_ms: 1_000_000,
            false_reclaim_within_ms: 1_800_000,
            min_sample: 3,
        };
        let rehearsal = allot_sim::replay::Rehearsal {
            at_s: 500.0,
            policy: scoped.policy.clone(),
            scope: scope.clone(),
            rules,
            check_every_s: 100.0,
        };
        let config = ReplayConfig { rehearsal: Some(rehearsal), ..config() };
        replay(&nodes, &active, "rehearsed", &jobs, &config).expect("replay")
    };
    // Every finished job of `a` had 60 s on a GPU: 0.0167 GPU-h each, above 0.01.
    let tripped = rehearse("gpu_hours_per_finished>0.01");
    let h = tripped.rehearsal.as_ref().expect("rehearsal report");
    assert_eq!(h.scope, "project=a");
    assert_eq!(h.started_s, 500.0);
    let at = h.rolled_back_s.expect("rolled back");
    // Three of a's jobs (at 500, 600, 700 s) finish by 760 s: judged at the check after it.
    assert_eq!(at, 800.0, "{h:?}");
    assert!(h.why.as_deref().unwrap_or("").contains("gpu_hours_per_finished>0.01"), "{h:?}");
    assert_eq!((h.conditions[0].state.as_str(), h.conditions[0].samples), ("tripped", 3));
    assert_books_balance(&tripped);
    // A limit no job reaches: the rollout stays to the end, judged on all of a's jobs after it.
    let held = rehearse("gpu_hours_per_finished>1");
    let h = held.rehearsal.as_ref().expect("rehearsal report");
    assert_eq!(h.rolled_back_s, None);
    assert_eq!((h.conditions[0].state.as_str(), h.conditions[0].samples), ("ok", 15), "{h:?}");
    assert_eq!(held.jobs_finished, 40);
    // Without a rehearsal the report has none, and the figures are the replay's own.
    let plain = replay(&nodes, &active, "plain", &jobs, &config()).expect("replay");
    assert!(plain.rehearsal.is_none());
    assert_eq!(plain.jobs_finished, held.jobs_finished);
}

/// With a cadence, cycles on its grid group arrivals: a job arriving after a quiet spell waits
/// for the next grid point. Under the daemon's rule (`decide_on_grid: false`) it is decided at
/// once, and the next cycle comes no sooner than the cadence after that one.
#[test]
fn the_daemons_cadence_decides_at_once_after_a_quiet_spell_and_then_waits_the_interval() {
    let nodes = vec![node("n", 4)];
    let policy = policy(PreemptionMode::Requeue);
    // 1 arrives at 10.3 s after nothing; 2 arrives at 10.4 s, 100 ms into the next interval.
    let jobs = vec![job(1, "a", 10.3, 5.0, 1), job(2, "a", 10.4, 5.0, 1)];
    let wait = |on_grid: bool| {
        let cfg = ReplayConfig { decide_every_s: 1.0, decide_on_grid: on_grid, ..config() };
        let r = replay(&nodes, &policy, "p", &jobs, &cfg).expect("runs");
        let w = |id: u64| r.by_job[&id].first_wait_s.expect("admitted");
        ((w(1) * 1000.0).round(), (w(2) * 1000.0).round())
    };
    assert_eq!(wait(true), (700.0, 600.0), "both wait for the grid point at 11 s");
    assert_eq!(wait(false), (0.0, 900.0), "1 at once at 10.3 s, 2 a cadence later at 11.3 s");
}
