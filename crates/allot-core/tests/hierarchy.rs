//! Hierarchical quota as a property over random histories: random trees of cohorts (an
//! organisation, departments with quota of their own and limits toward it, projects in either),
//! random submissions of three priorities, finishes, and cycles whose admissions start and
//! whose victims stop at once. After every step the engine's invariants hold (`Engine::audit`:
//! every pool's subtree and usage are what its lines give it, no root is used beyond what it
//! holds, no line beyond its maximum) and the engine rebuilt from its saved state is the same;
//! after every cycle, every quota reclaim is one the tree allows:
//!
//! - for the claimant's own guarantee (`for_cohort` none): the borrower is in its cohort or
//!   in a cohort under it;
//! - for a cohort's quota: the claimant is under that cohort and the borrower is not;
//! - by fair sharing (on in half the cases): the borrower borrowed and the strategy's test
//!   holds on the shares reported.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::{
    CohortSpec, Decision, DeviceSpec, Engine, Event, FairShareStrategy, FairSharing, GpuRequest,
    NodeSpec, PolicySpec, PreemptReason, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Shares, Timestamp, WorkloadId, WorkloadSpec,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct RawLimits {
    guaranteed: u64,
    borrow: Option<u64>,
    lend: Option<u64>,
}

fn limits(max: u64) -> impl Strategy<Value = RawLimits> {
    (0..=max, prop::option::weighted(0.3, 0u64..=4), prop::option::weighted(0.3, 0u64..=4))
        .prop_map(|(guaranteed, borrow, lend)| RawLimits { guaranteed, borrow, lend })
}

#[derive(Clone, Debug)]
enum Step {
    Submit { project: u8, gpus: u8, class: u8 },
    Finish { pick: usize },
    Settle,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..5, 1u8..=4, 0u8..3).prop_map(|(project, gpus, class)| Step::Submit { project, gpus, class }),
        1 => any::<usize>().prop_map(|pick| Step::Finish { pick }),
        2 => Just(Step::Settle),
    ]
}

/// Departments d0, d1 in org; five projects, each in d0, d1 or org.
fn policy(depts: &[RawLimits], projects: &[(u8, RawLimits)], fair: bool) -> PolicySpec {
    let quota = |l: &RawLimits, subtree: bool| QuotaSpec {
        model: QuotaModel::Any,
        guaranteed: Shares::from_gpus(l.guaranteed),
        borrow_limit: l.borrow.map(Shares::from_gpus),
        // A project lends at most its guarantee; a cohort's limit is on its subtree.
        lend_limit: l
            .lend
            .map(|x| Shares::from_gpus(if subtree { x } else { x.min(l.guaranteed) })),
    };
    let mut cohorts = vec![CohortSpec { name: "org".into(), parent: None, quotas: Vec::new() }];
    for (i, d) in depts.iter().enumerate() {
        cohorts.push(CohortSpec {
            name: format!("d{i}"),
            parent: Some("org".into()),
            quotas: vec![quota(d, true)],
        });
    }
    let projects = projects
        .iter()
        .enumerate()
        .map(|(i, (home, l))| ProjectSpec {
            name: format!("p{i}"),
            cohort: Some(["d0", "d1", "org"][*home as usize % 3].to_string()),
            department: None,
            quotas: vec![quota(l, false)],
            weight_milli: 1000,
            queueing: Queueing::BestEffortFifo,
            preemption_mode: None,
            preempt_within_project: Default::default(),
            borrow_within_cohort: None,
        })
        .collect();
    PolicySpec {
        priority_classes: ["low", "normal", "high"]
            .iter()
            .enumerate()
            .map(|(i, n)| PriorityClassSpec {
                name: (*n).into(),
                value: i as i32,
                preemptible: true,
            })
            .collect(),
        default_priority_class: "normal".into(),
        projects,
        fair_share_half_life_ms: 0,
        preemption_mode: PreemptionMode::Suspend,
        preemption_guard: allot_core::PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: Vec::new(),
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS,
        cohorts,
        fair_sharing: fair.then(FairSharing::default),
        reservations: None,
    }
}

fn nodes(gpus: u8) -> Vec<NodeSpec> {
    (0..2)
        .map(|n| NodeSpec {
            name: format!("n{n}"),
            cpu_millis: 256_000,
            memory_mib: 1 << 20,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..gpus)
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

fn run(
    gpus: u8,
    depts: &[RawLimits],
    projects: &[(u8, RawLimits)],
    fair: bool,
    steps: &[Step],
) -> Result<(), String> {
    let (nodes, policy) = (nodes(gpus), policy(depts, projects, fair));
    let mut engine = Engine::new(&nodes, &policy).map_err(|e| e.to_string())?;
    // Project → its cohort and that cohort's ancestors.
    let above: BTreeMap<String, BTreeSet<String>> = policy
        .projects
        .iter()
        .map(|p| {
            let home = p.cohort.clone().expect("every project has a cohort");
            (p.name.clone(), [home, "org".to_string()].into())
        })
        .collect();
    let home: BTreeMap<String, String> = policy
        .projects
        .iter()
        .map(|p| (p.name.clone(), p.cohort.clone().expect("every project has a cohort")))
        .collect();
    let mut project_of: BTreeMap<WorkloadId, String> = BTreeMap::new();
    let mut running: BTreeSet<WorkloadId> = BTreeSet::new();
    let mut now = Timestamp(0);
    let mut next = 1u64;
    for (i, step) in steps.iter().enumerate() {
        now = Timestamp(now.0 + 1000);
        match step {
            Step::Submit { project, gpus, class } => {
                let name = format!("p{}", project % 5);
                let mut spec = WorkloadSpec::new(
                    next,
                    &format!("w{next}"),
                    &name,
                    GpuRequest::Whole(u32::from(*gpus)),
                );
                spec.priority_class = Some(["low", "normal", "high"][*class as usize % 3].into());
                project_of.insert(spec.id, name);
                next += 1;
                engine.apply(now, Event::WorkloadSubmitted(spec));
            }
            Step::Finish { pick } => {
                let ids: Vec<WorkloadId> = running.iter().copied().collect();
                if let Some(&id) = ids.get(pick % ids.len().max(1)) {
                    running.remove(&id);
                    engine.apply(now, Event::WorkloadFinished { workload: id });
                }
            }
            Step::Settle => {
                for _ in 0..20 {
                    let decisions = engine.decide(now);
                    let mut acted = false;
                    for d in &decisions {
                        match d {
                            Decision::Admit { workload, .. } => {
                                engine.apply(now, Event::AllocationStarted { workload: *workload });
                                running.insert(*workload);
                                acted = true;
                            }
                            Decision::Preempt { victim, for_workload, reason, .. } => {
                                if let PreemptReason::FairShare {
                                    claimant_share,
                                    borrower_share,
                                    borrower_share_after,
                                    strategy,
                                    ..
                                } = reason
                                {
                                    let holds = match strategy {
                                        FairShareStrategy::LessThanOrEqualToFinalShare => {
                                            claimant_share <= borrower_share_after
                                        }
                                        FairShareStrategy::LessThanInitialShare => {
                                            claimant_share < borrower_share
                                        }
                                    };
                                    if !fair || *borrower_share == 0 || !holds {
                                        return Err(format!(
                                            "step {i}: {victim} taken by {strategy:?} ({claimant_share}, {borrower_share} → {borrower_share_after})"
                                        ));
                                    }
                                }
                                if let PreemptReason::QuotaReclaim { for_cohort, .. } = reason {
                                    let (v, c) = (&project_of[victim], &project_of[for_workload]);
                                    let ok = match for_cohort {
                                        None => above[v].contains(&home[c]),
                                        Some(cohort) => {
                                            above[c].contains(cohort) && !above[v].contains(cohort)
                                        }
                                    };
                                    if !ok {
                                        return Err(format!(
                                            "step {i}: {victim} ({v}) reclaimed for {for_workload} ({c}) for {for_cohort:?}"
                                        ));
                                    }
                                }
                                engine.apply(now, Event::WorkloadStopped { workload: *victim });
                                running.remove(victim);
                                acted = true;
                            }
                            _ => {}
                        }
                    }
                    engine.audit().map_err(|e| format!("step {i}: audit: {e}"))?;
                    if !acted {
                        break;
                    }
                }
                let bytes = engine.state().map_err(|e| format!("state: {e}"))?;
                let restored = Engine::from_state(&nodes, &policy, &bytes)
                    .map_err(|e| format!("from_state: {e}"))?;
                if format!("{restored:?}") != format!("{engine:?}") {
                    return Err(format!("step {i}: the engine rebuilt from its state differs"));
                }
            }
        }
        engine.audit().map_err(|e| format!("step {i} ({step:?}): audit: {e}"))?;
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn reclaims_follow_the_tree(
        gpus in 2u8..=6,
        depts in prop::collection::vec(limits(3), 2),
        projects in prop::collection::vec((0u8..3, limits(4)), 5),
        fair in any::<bool>(),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        if let Err(e) = run(gpus, &depts, &projects, fair, &steps) {
            prop_assert!(false, "{e}");
        }
    }
}
