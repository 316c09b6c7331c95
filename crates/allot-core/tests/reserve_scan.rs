//! How deep the cycle looks for requests to reserve for: at least `RESERVE_SCAN_MAX` queue
//! entries per project, and `RESERVE_SCAN_PER_RESERVATION` for each reservation the policy
//! allows a model, so that a policy asking many reservations (one FIFO queue, as plain
//! Slurm's) finds a big request behind a long run of one-GPU work.

use std::collections::BTreeMap;

use allot_core::{
    DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec, PreemptionMode, PriorityClassSpec,
    ProjectSpec, Queueing, QuotaModel, QuotaSpec, RESERVE_SCAN_MAX, RESERVE_SCAN_PER_RESERVATION,
    Reservations, Shares, Timestamp, WorkloadId, WorkloadSpec,
};

/// One node of 8 GPUs full of 1-GPU work; then `ones` 1-GPU requests and, behind them, one
/// 8-GPU request (id 9999). Returns the workloads reserved for at t=2000.
fn reserved(ones: u64, per_model_max: u32) -> Vec<WorkloadId> {
    let nodes = vec![NodeSpec {
        name: "n0".into(),
        cpu_millis: 1_000_000,
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
        projects: vec![ProjectSpec {
            name: "all".into(),
            cohort: None,
            department: None,
            // Quota never blocks: the reservation is for room, not quota.
            quotas: vec![QuotaSpec {
                model: QuotaModel::Any,
                guaranteed: Shares::from_gpus(10_000),
                borrow_limit: None,
                lend_limit: None,
            }],
            weight_milli: 1000,
            queueing: Queueing::BestEffortFifo,
            preemption_mode: None,
            preempt_within_project: Default::default(),
            borrow_within_cohort: None,
        }],
        fair_share_half_life_ms: 3_600_000,
        preemption_mode: PreemptionMode::Requeue,
        preemption_guard: allot_core::PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: Vec::new(),
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: 120_000,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: Some(Reservations { after_ms: 1, per_model_max, hold_quota: false }),
    };
    let mut e = Engine::new(&nodes, &policy).expect("valid policy");
    for id in 0..8 {
        e.apply(
            Timestamp(0),
            Event::WorkloadSubmitted(WorkloadSpec::new(
                id,
                &format!("run{id}"),
                "all",
                GpuRequest::Whole(1),
            )),
        );
    }
    for d in e.decide(Timestamp(0)) {
        if let allot_core::Decision::Admit { workload, .. } = d {
            e.apply(Timestamp(0), Event::AllocationStarted { workload });
        }
    }
    for id in 100..100 + ones {
        let spec = WorkloadSpec::new(id, &format!("one{id}"), "all", GpuRequest::Whole(1));
        e.apply(Timestamp(1_000), Event::WorkloadSubmitted(spec));
    }
    let big = WorkloadSpec::new(9999, "big", "all", GpuRequest::Whole(8));
    e.apply(Timestamp(1_000), Event::WorkloadSubmitted(big));
    e.reservations(Timestamp(2_000)).into_iter().map(|(id, _)| id).collect()
}

#[test]
fn a_big_request_behind_the_scan_gets_no_reservation() {
    let ones = RESERVE_SCAN_MAX as u64;
    assert_eq!(reserved(ones - 1, 2), vec![WorkloadId(9999)], "within the scan");
    assert_eq!(reserved(ones, 2), Vec::<WorkloadId>::new(), "just past the scan");
}

#[test]
fn a_policy_asking_more_reservations_looks_deeper() {
    let per_model_max = 8;
    let scan = RESERVE_SCAN_PER_RESERVATION * per_model_max as usize;
    assert!(scan > RESERVE_SCAN_MAX);
    let ones = RESERVE_SCAN_MAX as u64 + 10;
    assert_eq!(reserved(ones, per_model_max), vec![WorkloadId(9999)]);
    assert_eq!(reserved(scan as u64, per_model_max), Vec::<WorkloadId>::new());
}
