//! The goodput ledger: one history computed by hand, and a property over random histories
//! driven through the real engine: the books add up (allocated + free = capacity × time,
//! workloads sum to their projects and to the cluster, periods sum to the total), also while
//! nodes are drained at random (capacity is then what no drained node withholds).

use std::collections::{BTreeMap, BTreeSet};

use allot_core::idle::DeviceReading;
use allot_core::ledger::{Books, Ledger, SHARE_MS_PER_GPU_HOUR, Scope};
use allot_core::{
    Checkpointing, Decision, DeviceSpec, Engine, Event, GpuRequest, MemberPlacement, NodeId,
    NodeSpec, Placement, PolicySpec, PreemptReason, PreemptionMode, PriorityClassSpec, ProjectSpec,
    Queueing, QuotaModel, QuotaSpec, Shares, Timestamp, WorkloadId, WorkloadSpec,
};
use proptest::prelude::*;

const GPU_S: u128 = 1000 * 1000; // one GPU-second in share-ms

fn reading(sm_permille: u16) -> Vec<DeviceReading> {
    vec![DeviceReading {
        member: 0,
        shares: 1000,
        sm_active: Some(sm_permille),
        ..Default::default()
    }]
}

fn admit(id: u64) -> Decision {
    Decision::Admit {
        workload: WorkloadId(id),
        placement: Placement {
            model: None,
            members: vec![MemberPlacement {
                node: allot_core::NodeId(0),
                devices: vec![allot_core::DeviceShare { device: 0, shares: 1000, mig: None }],
            }],
        },
        reason: allot_core::AdmitReason::NoGpuRequested,
    }
}

#[test]
fn one_history_by_hand() {
    // Submitted at 0 s; admitted 10 s; started 20 s at 50 %; 0 % from 60 s; checkpoint 80 s;
    // pre-empted (suspend, checkpoint grace) at 100 s; stopped 110 s; re-admitted 200 s at
    // 100 %; finished 300 s. Periods of 150 s.
    let mut l = Ledger::new(150_000);
    let w = WorkloadId(1);
    let mut spec = WorkloadSpec::new(1, "w", "lab", GpuRequest::Whole(1));
    spec.user = "ada".into();
    let t = |s: u64| Timestamp(s * 1000);
    l.event(t(0), &Event::WorkloadSubmitted(spec));
    l.decision(t(10), &admit(1));
    l.event(t(20), &Event::AllocationStarted { workload: w });
    l.event(t(20), &Event::ActivitySampled { workload: w, readings: reading(500) });
    l.event(t(60), &Event::ActivitySampled { workload: w, readings: reading(0) });
    l.event(t(80), &Event::CheckpointSaved { workload: w });
    l.decision(
        t(100),
        &Decision::Preempt {
            victim: w,
            for_workload: WorkloadId(2),
            mode: PreemptionMode::Suspend,
            reason: PreemptReason::Priority {
                project: allot_core::ProjectId(0),
                victim_priority: 0,
                preemptor_priority: 1,
            },
            checkpoint_grace_ms: Some(10_000),
        },
    );
    l.event(t(110), &Event::WorkloadStopped { workload: w });
    l.decision(t(200), &admit(1));
    l.event(t(200), &Event::AllocationStarted { workload: w });
    l.event(t(200), &Event::ActivitySampled { workload: w, readings: reading(1000) });
    l.event(t(300), &Event::WorkloadFinished { workload: w });
    l.close(t(300));

    for scope in [Scope::Cluster, Scope::Project("lab".into()), Scope::User("ada".into())] {
        let b = l.total(&scope);
        assert_eq!(b.allocated, 200 * GPU_S, "{scope:?}");
        assert_eq!(b.active, 20 * GPU_S + 100 * GPU_S);
        assert_eq!(b.idle_allocated(), 80 * GPU_S);
        assert_eq!(b.measured, 190 * GPU_S, "the 10 s before the first sample went unmeasured");
        assert_eq!(
            b.measured_idle(),
            70 * GPU_S,
            "seen idle: half of 40 s at 50 % and 50 s at 0 %"
        );
        assert_eq!(b.lost_to_preemption, 30 * GPU_S, "since the checkpoint at 80 s");
        assert_eq!(b.lost_active, 0);
        assert_eq!(b.checkpoint_overhead, 10 * GPU_S);
        assert_eq!(b.queue_delay_ms, 100_000, "10 s + 90 s after the requeue");
        assert_eq!(b.admissions, 2);
        assert_eq!(b.startup_delay_ms, 10_000);
        assert_eq!(b.starts, 2);
        assert_eq!(b.preemptions, 1);
        assert!((b.goodput() - 0.6).abs() < 1e-12);
    }
    // Split by period: [0, 150 s) holds 100 s of the first run; [150, 300 s) 100 s.
    let rows = l.rows();
    assert_eq!(rows[&(Scope::Workload(w), 0)].allocated, 100 * GPU_S);
    assert_eq!(rows[&(Scope::Workload(w), 1)].allocated, 100 * GPU_S);
    assert!((Books::gpu_hours(3600 * GPU_S) - 1.0).abs() < 1e-12);
    assert_eq!(SHARE_MS_PER_GPU_HOUR, 3600 * GPU_S);
}

#[test]
fn requeue_loses_the_whole_run_and_delete_too() {
    for mode in [PreemptionMode::Requeue, PreemptionMode::Delete] {
        let mut l = Ledger::new(3_600_000);
        let w = WorkloadId(1);
        let t = |s: u64| Timestamp(s * 1000);
        l.event(
            t(0),
            &Event::WorkloadSubmitted(WorkloadSpec::new(1, "w", "p", GpuRequest::Whole(1))),
        );
        l.decision(t(0), &admit(1));
        l.event(t(0), &Event::ActivitySampled { workload: w, readings: reading(1000) });
        l.event(t(30), &Event::CheckpointSaved { workload: w });
        l.decision(
            t(60),
            &Decision::Reclaim {
                workload: w,
                mode,
                idle: allot_core::IdleFacts {
                    rule: 0,
                    model: allot_core::idle::IdleModel::Allot,
                    idle_ms: 0,
                    idle_timer_ms: 0,
                    threshold_permille: 100,
                    signal: None,
                    when: allot_core::IdleWhen::Always,
                    action: mode,
                    telemetry_gap_since: None,
                },
                checkpoint_grace_ms: None,
            },
        );
        l.event(t(60), &Event::WorkloadStopped { workload: w });
        l.close(t(60));
        let b = l.total(&Scope::Cluster);
        assert_eq!(b.lost_to_preemption, 60 * GPU_S, "{mode:?}: the checkpoint does not help");
        assert_eq!(b.lost_active, 60 * GPU_S);
        assert_eq!(b.useful(), 0);
    }
}

// ----- property: books add up over random histories through the real engine ---------------

fn cluster() -> Vec<NodeSpec> {
    (0..3)
        .map(|n| NodeSpec {
            name: format!("n{n}"),
            cpu_millis: 64_000,
            memory_mib: 512 * 1024,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..4)
                .map(|_| DeviceSpec {
                    model: "A100".into(),
                    memory_mib: 81920,
                    island: 0,
                    mig: false,
                })
                .collect(),
        })
        .collect()
}

fn policy() -> PolicySpec {
    let project = |name: &str, g: u64| ProjectSpec {
        name: name.into(),
        cohort: Some("c".into()),
        department: None,
        quotas: vec![QuotaSpec {
            model: QuotaModel::Any,
            guaranteed: Shares::from_gpus(g),
            borrow_limit: None,
            lend_limit: None,
        }],
        weight_milli: 1000,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    };
    PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "low".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "high".into(), value: 10, preemptible: true },
        ],
        default_priority_class: "low".into(),
        projects: vec![project("a", 6), project("b", 6)],
        ..PolicySpec::minimal()
    }
}

#[derive(Clone, Debug)]
enum Step {
    Submit {
        project: bool,
        gpus: u32,
        shares: bool,
        high: bool,
        checkpoint: bool,
    },
    Decide,
    Act,
    Sample {
        pick: usize,
        permille: u16,
    },
    Checkpoint {
        pick: usize,
    },
    Finish {
        pick: usize,
    },
    Wait {
        ms: u64,
    },
    /// Node `pick % 3` is reported unavailable, or available again (`up`).
    Node {
        pick: usize,
        up: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (any::<bool>(), 1u32..=4, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(project, gpus, shares, high, checkpoint)| Step::Submit {
                project,
                gpus,
                shares,
                high,
                checkpoint
            }
        ),
        3 => Just(Step::Decide),
        3 => Just(Step::Act),
        3 => (any::<usize>(), 0u16..=1000).prop_map(|(pick, permille)| Step::Sample { pick, permille }),
        1 => any::<usize>().prop_map(|pick| Step::Checkpoint { pick }),
        2 => any::<usize>().prop_map(|pick| Step::Finish { pick }),
        3 => (1u64..200_000).prop_map(|ms| Step::Wait { ms }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, up)| Step::Node { pick, up }),
    ]
}

/// The usable capacity by the test's own count: every device, less what no allocation holds
/// on the drained nodes (4 devices each).
fn usable_shares(engine: &Engine, down: &BTreeSet<NodeId>) -> u128 {
    let mut held_on_down: u128 = 0;
    for w in engine.workload_ids() {
        for m in engine.placement(w).map_or(&[][..], |p| &p.members[..]) {
            if down.contains(&m.node) {
                held_on_down += m.devices.iter().map(|d| u128::from(d.shares)).sum::<u128>();
            }
        }
    }
    12_000 - (down.len() as u128 * 4000 - held_on_down)
}

fn run_history(steps: &[Step], period_ms: u64) -> Result<(), String> {
    let mut engine = Engine::new(&cluster(), &policy()).map_err(|e| e.to_string())?;
    let mut ledger = Ledger::new(period_ms);
    let mut now = Timestamp(0);
    let mut next = 1u64;
    // Decisions the "backend" has yet to carry out, and what is running.
    let mut to_start: Vec<WorkloadId> = Vec::new();
    let mut to_stop: Vec<WorkloadId> = Vec::new();
    let mut running: Vec<WorkloadId> = Vec::new();
    let mut down: BTreeSet<NodeId> = BTreeSet::new();
    let mut capacity_expected: u128 = 0;
    ledger.cluster(now, engine.cluster_snapshot());
    let apply = |engine: &mut Engine, ledger: &mut Ledger, now: Timestamp, e: Event| {
        ledger.event(now, &e);
        engine.apply(now, e);
        ledger.cluster(now, engine.cluster_snapshot());
    };
    for s in steps {
        match s {
            Step::Submit { project, gpus, shares, high, checkpoint } => {
                let request =
                    if *shares { GpuRequest::Shares(250 * gpus) } else { GpuRequest::Whole(*gpus) };
                let mut spec = WorkloadSpec::new(
                    next,
                    &format!("w{next}"),
                    if *project { "a" } else { "b" },
                    request,
                );
                spec.user = format!("u{}", next % 3);
                spec.priority_class = Some(if *high { "high" } else { "low" }.into());
                spec.checkpointing = checkpoint
                    .then_some(Checkpointing { grace_ms: 5_000, last_checkpoint_at: None });
                next += 1;
                apply(&mut engine, &mut ledger, now, Event::WorkloadSubmitted(spec));
            }
            Step::Decide => {
                for d in engine.decide(now) {
                    ledger.decision(now, &d);
                    match d {
                        Decision::Admit { workload, .. } => to_start.push(workload),
                        Decision::Preempt { victim, .. } => to_stop.push(victim),
                        Decision::Stop { workload, .. } | Decision::Reclaim { workload, .. } => {
                            to_stop.push(workload)
                        }
                        _ => {}
                    }
                }
                ledger.cluster(now, engine.cluster_snapshot());
                // A snapshot point: go on with the ledger read back from its saved state.
                let restored = Ledger::from_state(&ledger.state()).map_err(|e| e.to_string())?;
                if format!("{restored:?}") != format!("{ledger:?}") {
                    return Err("the ledger read back from its state differs".into());
                }
                ledger = restored;
            }
            Step::Act => {
                for w in std::mem::take(&mut to_start) {
                    apply(&mut engine, &mut ledger, now, Event::AllocationStarted { workload: w });
                    running.push(w);
                }
                for w in std::mem::take(&mut to_stop) {
                    running.retain(|r| *r != w);
                    apply(&mut engine, &mut ledger, now, Event::WorkloadStopped { workload: w });
                }
            }
            Step::Sample { pick, permille } => {
                if let Some(&w) = running.get(pick % running.len().max(1))
                    && let Some(p) = engine.placement(w)
                {
                    let readings = p
                        .members
                        .iter()
                        .enumerate()
                        .flat_map(|(m, mp)| {
                            mp.devices.iter().map(move |d| DeviceReading {
                                member: m as u32,
                                shares: d.shares,
                                sm_active: Some(*permille),
                                ..Default::default()
                            })
                        })
                        .collect();
                    apply(
                        &mut engine,
                        &mut ledger,
                        now,
                        Event::ActivitySampled { workload: w, readings },
                    );
                }
            }
            Step::Checkpoint { pick } => {
                if let Some(&w) = running.get(pick % running.len().max(1)) {
                    apply(&mut engine, &mut ledger, now, Event::CheckpointSaved { workload: w });
                }
            }
            Step::Finish { pick } => {
                if !running.is_empty() {
                    let w = running.remove(pick % running.len());
                    to_stop.retain(|s| *s != w);
                    apply(&mut engine, &mut ledger, now, Event::WorkloadFinished { workload: w });
                }
            }
            Step::Wait { ms } => {
                capacity_expected += usable_shares(&engine, &down) * u128::from(*ms);
                now = Timestamp(now.0 + ms);
            }
            Step::Node { pick, up } => {
                let node = NodeId((pick % 3) as u32);
                let event = if *up {
                    down.remove(&node);
                    Event::NodeAvailable { node }
                } else {
                    down.insert(node);
                    Event::NodeUnavailable { node, reason: "drained".into() }
                };
                apply(&mut engine, &mut ledger, now, event);
            }
        }
        engine.audit()?;
    }
    ledger.close(now);

    let cluster = ledger.total(&Scope::Cluster);
    let span = u128::from(now.0);
    if cluster.capacity != capacity_expected {
        return Err(format!(
            "capacity {} ≠ {capacity_expected} usable share-ms over {span} ms",
            cluster.capacity
        ));
    }
    if cluster.allocated + cluster.free != cluster.capacity {
        return Err(format!(
            "allocated {} + free {} ≠ capacity {}",
            cluster.allocated, cluster.free, cluster.capacity
        ));
    }
    if cluster.fragmented > cluster.free || cluster.active > cluster.allocated {
        return Err("fragmented > free or active > allocated".into());
    }
    // Activity is only ever known from telemetry: what was active was measured.
    if cluster.active > cluster.measured || cluster.measured > cluster.allocated {
        return Err(format!(
            "active {} ≤ measured {} ≤ allocated {} broken",
            cluster.active, cluster.measured, cluster.allocated
        ));
    }
    if cluster.lost_active > cluster.lost_to_preemption || cluster.useful() > cluster.active {
        return Err("lost/useful out of bounds".into());
    }
    // Workloads, users and projects each partition the cluster's allocated and active.
    let mut sums: BTreeMap<u8, (u128, u128, u128)> = BTreeMap::new();
    for scope in ledger.scopes() {
        let kind = match scope {
            Scope::Cluster => continue,
            Scope::Project(_) => 0,
            Scope::User(_) => 1,
            Scope::Workload(_) => 2,
        };
        let b = ledger.total(&scope);
        let e = sums.entry(kind).or_default();
        e.0 += b.allocated;
        e.1 += b.active;
        e.2 += b.lost_to_preemption;
    }
    for (kind, (alloc, active, lost)) in sums {
        if (alloc, active, lost) != (cluster.allocated, cluster.active, cluster.lost_to_preemption)
        {
            return Err(format!(
                "scope kind {kind}: {alloc}/{active}/{lost} ≠ cluster {}/{}/{}",
                cluster.allocated, cluster.active, cluster.lost_to_preemption
            ));
        }
    }
    // Periods sum to the total, and each cluster period's capacity is its share of time.
    let per_period: u128 = ledger
        .rows()
        .iter()
        .filter(|((s, _), _)| *s == Scope::Cluster)
        .map(|(_, b)| b.allocated + b.free)
        .sum();
    if per_period != cluster.capacity {
        return Err("periods do not add up to the total".into());
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn ledger_books_add_up(
        steps in proptest::collection::vec(step(), 1..120),
        period_ms in 1u64..500_000,
    ) {
        if let Err(e) = run_history(&steps, period_ms) {
            prop_assert!(false, "{e}");
        }
    }
}
