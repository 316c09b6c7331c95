//! `Engine::standings`: fair-share standing per project, the order step 4 visits them in.

use std::collections::BTreeMap;

use allot_core::{
    Decision, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec, PreemptionMode,
    PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Shares, Timestamp,
    WorkloadSpec,
};

fn project(name: &str, cohort: Option<&str>, gpus: u64, weight_milli: u64) -> ProjectSpec {
    ProjectSpec {
        name: name.into(),
        cohort: cohort.map(str::to_string),
        department: None,
        quotas: vec![QuotaSpec {
            model: QuotaModel::Any,
            guaranteed: Shares::from_gpus(gpus),
            borrow_limit: None,
            lend_limit: None,
        }],
        weight_milli,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    }
}

fn engine() -> Engine {
    let nodes = vec![NodeSpec {
        name: "n0".into(),
        cpu_millis: 256_000,
        memory_mib: 1024 * 1024,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..8)
            .map(|_| DeviceSpec { model: "A100".into(), memory_mib: 81920, island: 0, mig: false })
            .collect(),
    }];
    let policy = PolicySpec {
        priority_classes: vec![PriorityClassSpec {
            name: "normal".into(),
            value: 0,
            preemptible: true,
        }],
        default_priority_class: "normal".into(),
        projects: vec![
            project("a", Some("c"), 4, 1000),
            project("b", Some("c"), 4, 3000),
            project("solo", None, 0, 1000),
        ],
        fair_share_half_life_ms: 3_600_000,
        preemption_mode: PreemptionMode::Requeue,
        preemption_guard: allot_core::PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: Vec::new(),
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: 120_000,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: None,
    };
    Engine::new(&nodes, &policy).expect("valid")
}

fn submit(e: &mut Engine, at: u64, id: u64, project: &str, gpus: u32) {
    let spec = WorkloadSpec::new(id, &format!("w{id}"), project, GpuRequest::Whole(gpus));
    e.apply(Timestamp(at), Event::WorkloadSubmitted(spec));
}

#[test]
fn standing_is_usage_over_fair_share_and_ranks_the_next_cycle() {
    let mut e = engine();
    submit(&mut e, 0, 1, "a", 4);
    for d in e.decide(Timestamp(0)) {
        if let Decision::Admit { workload, .. } = d {
            e.apply(Timestamp(0), Event::AllocationStarted { workload });
        }
    }
    // One half-life later `a` has held 4 GPUs throughout: decayed usage is half of it.
    submit(&mut e, 3_600_000, 2, "a", 1);
    submit(&mut e, 3_600_000, 3, "b", 1);
    let s = e.standings();
    let names: Vec<&str> = s.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "solo"]);
    let (a, b, solo) = (&s[0], &s[1], &s[2]);
    assert_eq!(a.allocated, Shares::from_gpus(4));
    assert!((a.decayed_shares - 2000.0).abs() < 1.0, "{}", a.decayed_shares);
    // Fair share: the cohort's 8 GPUs split 1:3.
    assert!((a.fair_share_shares - 2000.0).abs() < 1e-6);
    assert!((b.fair_share_shares - 6000.0).abs() < 1e-6);
    assert!((a.weight_fraction - 0.25).abs() < 1e-9);
    assert_eq!(a.usage_fraction, Some(1.0), "b uses nothing");
    assert!((a.standing.unwrap_or_default() - 3.0).abs() < 0.01, "(4000 + 2000) / 2000");
    assert_eq!(b.standing, Some(0.0));
    // a's next workload would borrow (4 of 4 used), b's fits its guarantee: b goes first.
    assert_eq!((b.rank, b.head_within_guarantee), (Some(1), Some(true)));
    assert_eq!((a.rank, a.head_within_guarantee), (Some(2), Some(false)));
    assert_eq!((a.pending, b.pending), (1, 1));
    assert_eq!(solo.cohort, None, "a cohort of one is no cohort");
    assert_eq!(a.cohort.as_deref(), Some("c"));
    assert_eq!((solo.rank, solo.usage_fraction), (None, None));
}
