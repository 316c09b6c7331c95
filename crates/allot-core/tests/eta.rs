//! `Engine::etas`: estimated admission times, one named scenario per case, all through `check`.
//!
//! A scenario is a few lines: `gpus N` (one node of N A100s), `project NAME GUARANTEE`
//! (one cohort `c`), `run ID PROJECT GPUS [max=MS] [high]` (submitted, admitted and started at
//! t=0) and `pend ID PROJECT GPUS [max=MS] [high]` (submitted at t=1000). The estimate is taken
//! at t=2000 and written one line per pending workload.

use std::collections::BTreeMap;

use allot_core::{
    DeviceSpec, ETA_WORKLOADS_MAX, Engine, Eta, EtaCause, EtaUnknown, Event, GpuRequest, NodeSpec,
    PolicySpec, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec,
    Shares, Timestamp, WorkloadSpec,
};

const NOW: u64 = 2_000;

fn engine(script: &str) -> Engine {
    let mut gpus = 0;
    let mut projects = Vec::new();
    let mut runs = Vec::new();
    let mut pends = Vec::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "gpus" => gpus = words[1].parse().expect("gpus N"),
            "project" => projects.push(ProjectSpec {
                name: words[1].into(),
                cohort: Some("c".into()),
                department: None,
                quotas: vec![QuotaSpec {
                    model: QuotaModel::Any,
                    guaranteed: Shares::from_gpus(words[2].parse().expect("guarantee")),
                    borrow_limit: None,
                    lend_limit: None,
                }],
                weight_milli: 1000,
                queueing: Queueing::BestEffortFifo,
                preemption_mode: None,
                preempt_within_project: Default::default(),
                borrow_within_cohort: None,
            }),
            "run" | "pend" => {
                let id: u64 = words[1].parse().expect("id");
                let n: u32 = words[3].parse().expect("gpus");
                let mut spec =
                    WorkloadSpec::new(id, &format!("w{id}"), words[2], GpuRequest::Whole(n));
                for extra in &words[4..] {
                    match extra.split_once('=') {
                        Some(("max", ms)) => {
                            spec.max_runtime_ms = Some(ms.parse().expect("max=MS"))
                        }
                        _ if *extra == "high" => spec.priority_class = Some("high".into()),
                        _ => panic!("unknown option {extra:?} in {line:?}"),
                    }
                }
                if words[0] == "run" { runs.push(spec) } else { pends.push(spec) }
            }
            other => panic!("unknown line {other:?}"),
        }
    }
    let nodes = vec![NodeSpec {
        name: "n0".into(),
        cpu_millis: 1_000_000,
        memory_mib: 64 * 1024 * 1024,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: "A100".into(), memory_mib: 81920, island: 0, mig: false })
            .collect(),
    }];
    let policy = PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "normal".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "high".into(), value: 10, preemptible: true },
        ],
        default_priority_class: "normal".into(),
        projects,
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
    let mut e = Engine::new(&nodes, &policy).expect("valid scenario");
    for spec in runs {
        e.apply(Timestamp(0), Event::WorkloadSubmitted(spec));
    }
    for d in e.decide(Timestamp(0)) {
        if let allot_core::Decision::Admit { workload, .. } = d {
            e.apply(Timestamp(0), Event::AllocationStarted { workload });
        }
    }
    for spec in pends {
        e.apply(Timestamp(1_000), Event::WorkloadSubmitted(spec));
    }
    e
}

fn render(etas: &BTreeMap<allot_core::WorkloadId, Eta>) -> String {
    let reason = |r: &Option<allot_core::DeferReason>| {
        r.as_ref().map_or("none".to_string(), |r| {
            let text = format!("{r:?}");
            text.split([' ', '(', '{']).next().unwrap_or_default().to_string()
        })
    };
    etas.iter()
        .map(|(id, eta)| {
            let what = match eta {
                Eta::At { at, after: EtaCause::NextCycle } => format!("at {} (next cycle)", at.0),
                Eta::At { at, after: EtaCause::MaxRuntime(w) } => {
                    format!("at {} after w{}'s max runtime", at.0, w.0)
                }
                Eta::At { at, after: EtaCause::BackoffEnds(w) } => {
                    format!("at {} after w{}'s backoff", at.0, w.0)
                }
                Eta::Unknown(EtaUnknown::NotEstimated { limit }) => {
                    format!("unknown: not among the first {limit}")
                }
                Eta::Unknown(EtaUnknown::NoMaxRuntime { count, example, reason: r }) => format!(
                    "unknown: {count} running without max runtime (w{}), {}",
                    example.0,
                    reason(r)
                ),
                Eta::Unknown(EtaUnknown::NeverFits { reason: r }) => {
                    format!("unknown: never fits, {}", reason(r))
                }
                Eta::Unknown(EtaUnknown::Never { reason: r }) => {
                    format!("never, {}", reason(&Some(r.clone())))
                }
                Eta::Unknown(EtaUnknown::AwaitingUse) => "unknown: awaiting use".to_string(),
                Eta::Unknown(EtaUnknown::BeyondHorizon { ends }) => {
                    format!("unknown: still waiting after {ends} ends")
                }
            };
            format!("w{}: {what}\n", id.0)
        })
        .collect()
}

/// The estimate at `NOW` for `script`, rendered, must be `expected`; and the engine it was
/// taken from must not have changed.
fn check(script: &str, expected: &str) {
    let e = engine(script);
    let before = format!("{e:?}");
    let got = render(&e.etas(Timestamp(NOW)));
    assert_eq!(format!("{e:?}"), before, "etas changed the engine");
    let want: String = expected
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(got, want, "scenario:\n{script}");
}

/// Issue 25: a gang larger than its project may ever hold (guarantee 4 in a cohort of 8) said
/// "unknown: it waits for running work"; it is never, with the reason.
#[test]
fn work_larger_than_its_project_may_ever_hold_never_starts() {
    check("gpus 8\nproject a 4\nproject b 4\nrun 1 b 2\npend 2 a 16", "w2: never, ExceedsMaxQuota");
}

#[test]
fn free_room_is_taken_by_the_next_cycle() {
    check("gpus 4\nproject a 4\npend 1 a 2", "w1: at 2000 (next cycle)");
}

#[test]
fn a_full_cluster_frees_at_the_running_work_max_runtime() {
    check(
        "gpus 4\nproject a 4\nrun 1 a 4 max=3600000\npend 2 a 4",
        "w2: at 3600000 after w1's max runtime",
    );
}

#[test]
fn queued_work_follows_in_a_chain_of_ends() {
    check(
        "gpus 4\nproject a 4\nrun 1 a 4 max=3600000\npend 2 a 4 max=1800000\npend 3 a 2",
        "w2: at 3600000 after w1's max runtime
         w3: at 5400000 after w2's max runtime",
    );
}

#[test]
fn the_earliest_end_that_makes_room_is_named() {
    check(
        "gpus 4\nproject a 4\nrun 1 a 2 max=1000000\nrun 2 a 2 max=7200000\npend 3 a 4",
        "w3: at 7200000 after w2's max runtime",
    );
}

#[test]
fn running_work_without_a_max_runtime_makes_it_unknown() {
    check(
        "gpus 4\nproject a 4\nrun 1 a 4\npend 2 a 2",
        "w2: unknown: 1 running without max runtime (w1), QuotaExhausted",
    );
}

#[test]
fn work_over_its_quota_on_an_empty_cluster_never_fits() {
    check("gpus 8\nproject a 2\npend 1 a 4", "w1: never, ExceedsMaxQuota");
}

#[test]
fn higher_priority_work_preempts_and_goes_now() {
    check(
        "gpus 4\nproject a 4\nrun 1 a 4\npend 2 a 4 high",
        // w1 was running, not pending: it has no estimate.
        "w2: at 2000 (next cycle)",
    );
}

#[test]
fn only_the_first_workloads_are_estimated() {
    let extra = ETA_WORKLOADS_MAX + 2;
    let mut script = "gpus 4\nproject a 4\nrun 1 a 4 max=1000\n".to_string();
    let mut expected = String::new();
    for k in 0..extra as u64 {
        let id = k + 2;
        script.push_str(&format!("pend {id} a 4 max=1000\n"));
        if (k as usize) < ETA_WORKLOADS_MAX {
            // w1 ends at 1000, before NOW: w2 starts at NOW, each next one 1000 later.
            let cause = if k == 0 {
                "(next cycle)".to_string()
            } else {
                format!("after w{}'s max runtime", id - 1)
            };
            expected.push_str(&format!("w{id}: at {} {cause}\n", NOW + k * 1000));
        } else {
            expected
                .push_str(&format!("w{id}: unknown: not among the first {ETA_WORKLOADS_MAX}\n"));
        }
    }
    check(&script, &expected);
}

#[test]
fn more_ends_than_the_bound_leave_it_unknown() {
    let running = allot_core::ETA_ENDS_MAX + 20;
    let mut script = format!("gpus {running}\nproject a {running}\n");
    for k in 0..running {
        script.push_str(&format!("run {} a 1 max={}\n", k + 1, 10_000 + k as u64 * 1000));
    }
    script.push_str(&format!("pend {} a {running}\n", running + 1));
    check(
        &script,
        &format!(
            "w{}: unknown: still waiting after {} ends",
            running + 1,
            allot_core::ETA_ENDS_MAX
        ),
    );
}
