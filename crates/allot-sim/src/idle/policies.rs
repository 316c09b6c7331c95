//! The compared policies.

use allot_core::idle::{IdleRule, MissingTelemetry};
use allot_core::{
    IdlePolicySpec, IdleWhen, PolicySpec, PreemptionGuard, PreemptionMode, PriorityClassSpec,
    ProjectSpec, Queueing, QuotaModel, QuotaSpec, Shares, WorkloadKind,
};

use super::PROJECTS;

/// The cohort every project of [`idle_policies`] is in.
const COHORT: &str = "lab";

fn minutes(m: u64) -> u64 {
    m * 60_000
}

/// The base policy every compared policy shares: one cohort, four projects, two classes,
/// suspend, the engine's default restart cost and idle backoff.
fn base_policy(idle: Vec<IdlePolicySpec>) -> PolicySpec {
    PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "normal".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "high".into(), value: 100, preemptible: false },
        ],
        default_priority_class: "normal".into(),
        projects: PROJECTS
            .iter()
            .map(|&(name, gpus)| ProjectSpec {
                name: name.into(),
                cohort: Some(COHORT.into()),
                department: None,
                quotas: vec![QuotaSpec {
                    model: QuotaModel::Any,
                    guaranteed: Shares::from_gpus(gpus),
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
        fair_share_half_life_ms: 0,
        preemption_mode: PreemptionMode::Suspend,
        preemption_guard: PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle,
        restart_cost_ms: 120_000,
        idle_resume_backoff_ms: 300_000,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: None,
    }
}

fn rule(
    name: &str,
    kinds: &[WorkloadKind],
    rule: IdleRule,
    when: IdleWhen,
    action: PreemptionMode,
    warn_before_ms: u64,
    exempt: &[&str],
) -> IdlePolicySpec {
    IdlePolicySpec {
        name: name.into(),
        projects: Vec::new(),
        kinds: kinds.to_vec(),
        exempt_classes: exempt.iter().map(|c| (*c).to_owned()).collect(),
        rule,
        when,
        action,
        warn_before_ms,
    }
}

/// The three compared policies, labelled `amd_rm`, `runai` and `allot`
/// (`docs/design/idle-experiment.md`, "Policies").
pub fn idle_policies() -> Vec<(String, PolicySpec)> {
    use WorkloadKind::{Batch, Inference, Notebook, Service, Training};
    let amd = rule(
        "amd-rm",
        &[],
        IdleRule::amd_rm(100, minutes(15)),
        IdleWhen::OnPressure,
        PreemptionMode::Delete,
        0,
        &[],
    );
    let runai = vec![
        rule(
            "workspaces",
            &[Notebook],
            IdleRule::runai(minutes(15)),
            IdleWhen::Always,
            PreemptionMode::Suspend,
            0,
            &[],
        ),
        rule(
            "training",
            &[Training, Batch],
            IdleRule::runai(minutes(30)),
            IdleWhen::Always,
            PreemptionMode::Suspend,
            0,
            &[],
        ),
    ];
    let allot_rule = |threshold_permille, timer_min, sustain_ms| IdleRule {
        threshold_permille,
        idle_timer_ms: minutes(timer_min),
        sustain_ms,
        missing: MissingTelemetry::Hold,
        min_runtime_ms: minutes(5),
        ..IdleRule::allot_default()
    };
    let allot = vec![
        rule(
            "notebooks",
            &[Notebook],
            allot_rule(100, 15, 60_000),
            IdleWhen::OnPressure,
            PreemptionMode::Suspend,
            minutes(5),
            &["high"],
        ),
        rule(
            "serving",
            &[Inference, Service],
            IdleRule {
                quiet_timer_ms: minutes(5),
                quiet_below_permille: 500,
                ..allot_rule(100, 60, 60_000)
            },
            IdleWhen::OnPressure,
            PreemptionMode::Suspend,
            minutes(5),
            &["high"],
        ),
        rule(
            "hung-jobs",
            &[Training, Batch],
            allot_rule(10, 60, minutes(5)),
            IdleWhen::OnPressure,
            PreemptionMode::Suspend,
            minutes(5),
            &["high"],
        ),
    ];
    vec![
        ("amd_rm".to_owned(), base_policy(vec![amd])),
        ("runai".to_owned(), base_policy(runai)),
        ("allot".to_owned(), base_policy(allot)),
    ]
}
