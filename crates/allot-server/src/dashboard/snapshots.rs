//! HTML snapshots: each page's template rendered inside the layout with fixed data and compared
//! with `tests/snapshots/dashboard/<page>.html` (one tag per line, so that a diff reads).
//! `ALLOT_UPDATE_SNAPSHOTS=1 cargo test -p allot-server snapshot` rewrites the files; review the
//! diff before committing it.

use std::path::PathBuf;

use allot_api::{
    ApiError, Device, LedgerRow, Node, PolicyValidation, PolicyView, Project, QuotaLine, Role, Why,
    Workload, WorkloadState,
};
use maud::Markup;

use super::{Frame, Tab, fleet, idle, layout, live, policy, projects, queue, workload};
use crate::auth::Principal;
use crate::view::{EtaView, PeriodRow};
use crate::view::{FleetSample, Step};

/// 2026-11-30 12:00:00 UTC.
const NOW: u64 = 1_796_040_000_000;
const MIN: u64 = 60_000;

fn frame(tab: Tab) -> Frame {
    Frame { tab, user: "alice".into(), role: Role::Admin, alert: None }
}

fn workload(id: u64, project: &str, state: WorkloadState, code: &str, reason: &str) -> Workload {
    Workload {
        id,
        name: format!("job-{id}"),
        project: project.into(),
        user: "alice".into(),
        kind: "batch".into(),
        state,
        gpus: if id.is_multiple_of(2) { "0.5".into() } else { "2".into() },
        members: 1,
        command: vec!["python".into(), "train.py".into()],
        submitted_ms: NOW - id * 7 * MIN,
        started_ms: (state == WorkloadState::Running).then_some(NOW - id * MIN),
        ended_ms: None,
        exit_code: None,
        attempt: u32::from(state == WorkloadState::Running),
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        reason_code: (!code.is_empty()).then(|| code.to_string()),
        placement: if state == WorkloadState::Running {
            vec!["a100-0: 0,1".into()]
        } else {
            vec![]
        },
        pids: vec![],
        last_checkpoint_ms: None,
        last_activity_ms: None,
    }
}

fn project(name: &str, used: f64, guaranteed: f64) -> Project {
    Project {
        name: name.into(),
        cohort: Some("research".into()),
        department: None,
        quota: vec![QuotaLine {
            model: "A100".into(),
            used_gpus: used,
            guaranteed_gpus: guaranteed,
            borrow_limit_gpus: Some(4.0),
            lend_limit_gpus: None,
        }],
        pending: 2,
        running: 1,
        preempt_within_project: "lower_priority".into(),
        borrow_within_cohort: None,
    }
}

fn row(scope: &str, allocated: f64, lost: f64) -> LedgerRow {
    LedgerRow {
        scope: scope.into(),
        allocated_gpu_hours: allocated,
        active_gpu_hours: 0.0,
        measured_gpu_hours: 0.0,
        idle_allocated_gpu_hours: allocated,
        lost_gpu_hours: lost,
        useful_gpu_hours: 0.0,
        goodput: Some(0.0),
        unmanaged_gpu_hours: 0.0,
    }
}

/// A ledger period `days_ago` before `NOW`'s day.
fn period(scope: &str, days_ago: u64, allocated: f64, lost: f64) -> PeriodRow {
    let day = 24 * 60 * MIN;
    let start_ms = (NOW / day - days_ago) * day;
    PeriodRow {
        scope: scope.into(),
        start_ms,
        end_ms: start_ms + day,
        allocated,
        active: 0.0,
        idle: allocated,
        useful: 0.0,
        lost,
    }
}

fn warned() -> Workload {
    workload(
        3,
        "vision",
        WorkloadState::Running,
        "idle_warning",
        "idle 25 min (timer 30 min, below 5.0 % by SM-active; rule \"notebooks\", on_pressure); \
         will suspend at 2026-11-30 12:05:00 UTC unless active again",
    )
}

/// Compares with the committed file, or rewrites it under `ALLOT_UPDATE_SNAPSHOTS=1`.
/// A history of two versions: the first start's file, then one an admin applied.
fn versions() -> Vec<allot_api::PolicyVersion> {
    let version = |version: u32, at_ms: Option<u64>, by: Option<&str>| allot_api::PolicyVersion {
        version,
        at_ms,
        source: format!("policy-{version}.yaml"),
        by: by.map(str::to_string),
        rollback_of: None,
        text: "projects:\n  - name: vision\n".into(),
        scope: None,
        why: None,
        whatif: None,
    };
    let mut applied = version(2, Some(1_796_046_291_054), Some("alice"));
    let figures = |p95_ms: u64, milli_gpu_h: u64, preemptions: u64| allot_api::WhatIfFigures {
        wait_p50_ms: 0,
        wait_p95_ms: p95_ms,
        allocated_milli_gpu_hours: milli_gpu_h,
        lost_milli_gpu_hours: 0,
        preemptions,
        finished: 120,
    };
    applied.whatif = Some(allot_api::WhatIfShown {
        run: 3,
        at_ms: 1_796_046_200_000,
        active_version: 1,
        jobs: 120,
        active: figures(95_000, 41_250, 2),
        candidate: figures(12_500, 41_250, 5),
        fidelity_gap_pct: Some(4),
    });
    vec![version(1, None, None), applied]
}

/// Version 2 rolls a candidate out to nlp, one condition judged and one waiting for data.
fn rollout() -> allot_api::RolloutView {
    let condition =
        |condition: &str, baseline, current, samples, state: &str| allot_api::RolloutCondition {
            condition: condition.into(),
            baseline,
            baseline_samples: 40,
            current,
            samples,
            state: state.into(),
        };
    allot_api::RolloutView {
        version: 2,
        base_version: 1,
        scope: "project=nlp".into(),
        candidate: "nlp-weight.yaml".into(),
        by: Some("alice".into()),
        since_ms: 1_796_046_291_054,
        baseline_ms: 7 * 86_400_000,
        false_reclaim_within_ms: 30 * 60_000,
        min_sample: 5,
        carried: vec!["project nlp".into()],
        left_out: vec!["defragmentation".into()],
        conditions: vec![
            condition("p95_wait>1.5x", Some(120.0), Some(95.5), 12, "ok"),
            condition(
                "failure_rate>0.2",
                Some(0.05),
                None,
                0,
                "not judged: 0 of 5 observations since the rollout",
            ),
        ],
        ended: None,
        ended_ms: None,
    }
}

/// A candidate in shadow for an hour: vision's jobs would have started sooner.
fn shadow() -> allot_api::ShadowReport {
    let row = |project: &str, sooner: u64, preempted: (u64, u64)| allot_api::ShadowProject {
        project: project.into(),
        sooner,
        admitted_since: sooner.saturating_sub(1),
        wait_saved_ms: 90_000 * sooner.saturating_sub(1),
        held_back: 0,
        preempted_active: preempted.0,
        preempted_candidate: preempted.1,
        reclaimed_active: 1,
        reclaimed_candidate: 1,
    };
    allot_api::ShadowReport {
        source: "generous.yaml".into(),
        by: "alice".into(),
        since_ms: NOW - 3_600_000,
        now_ms: NOW,
        cycles: 412,
        failed_cycles: 0,
        last_failure: None,
        idle_compared: true,
        text: "projects: []\n".into(),
        projects: vec![row("speech", 0, (2, 3)), row("vision", 3, (0, 0))],
    }
}

fn check(name: &str, tab: Tab, content: &Markup) {
    let page = layout(name, &frame(tab), &live(&format!("/{name}"), content));
    let text = page.into_string().replace("><", ">\n<") + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots/dashboard")
        .join(format!("{name}.html"));
    if std::env::var_os("ALLOT_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("snapshot folder")).expect("snapshot folder");
        std::fs::write(&path, &text).expect("snapshot written");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run with ALLOT_UPDATE_SNAPSHOTS=1 to write it", path.display())
    });
    if want != text {
        let line = want.lines().zip(text.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{} differs from the page rendered now, first at line {}:\n  want: {}\n  got:  {}\n\
             rerun with ALLOT_UPDATE_SNAPSHOTS=1 if the change is intended",
            path.display(),
            line + 1,
            want.lines().nth(line).unwrap_or("(end)"),
            text.lines().nth(line).unwrap_or("(end)")
        );
    }
}

#[test]
fn snapshot_fleet() {
    let samples = (0..6)
        .map(|k| FleetSample {
            at_ms: NOW - (5 - k) * MIN,
            capacity_shares: 8000,
            allocated_shares: 2000 + k * 500,
            free_shares: 6000 - k * 500,
            stranded_shares: 500,
            warned_idle_shares: if k > 3 { 2000 } else { 0 },
            active_shares: None,
        })
        .collect();
    let device = |index, used, workloads: &[u64]| Device {
        index,
        model: "A100".into(),
        used_shares: used,
        workloads: workloads.to_vec(),
    };
    let data = fleet::FleetData {
        now_ms: NOW,
        inventory_source: "cluster.yaml".into(),
        samples,
        nodes: vec![
            Node {
                unusable: None,
                unmanaged: None,
                name: "a100-0".into(),
                devices: vec![
                    device(0, 1000, &[3]),
                    device(1, 1000, &[3]),
                    device(2, 500, &[2]),
                    device(3, 0, &[]),
                ],
            },
            Node {
                unusable: None,
                unmanaged: None,
                name: "a100-1".into(),
                devices: vec![
                    device(0, 250, &[4]),
                    device(1, 1000, &[5]),
                    device(2, 1000, &[5]),
                    device(3, 1000, &[5]),
                ],
            },
            Node { name: "cpu-0".into(), devices: vec![], unusable: None, unmanaged: None },
        ],
        warned: [3].into_iter().collect(),
        show_metrics: true,
    };
    check("fleet", Tab::Fleet, &fleet::render(&data));
}

#[test]
fn snapshot_queue() {
    let pending = [
        workload(
            1,
            "vision",
            WorkloadState::Pending,
            "quota_exhausted",
            "vision uses 8 of 8 A100 guaranteed",
        ),
        workload(2, "nlp", WorkloadState::Pending, "no_placement", "no node has 2 free A100"),
        workload(4, "vision", WorkloadState::Pending, "", ""),
        // A gang of 2 members of 4 GPUs: "2×4", as `allot ls` writes it.
        Workload {
            members: 2,
            gpus: "4".into(),
            ..workload(6, "nlp", WorkloadState::Pending, "", "")
        },
    ];
    let principal = Principal {
        token_id: "t".into(),
        name: "alice".into(),
        role: Role::Admin,
        projects: vec![],
    };
    let projects = [project("nlp", 1.0, 2.0), project("vision", 8.0, 8.0)];
    let etas = [
        (
            1,
            EtaView {
                at_ms: Some(NOW + 130 * MIN),
                note: "after #5 job-5 reaches its max runtime".into(),
            },
        ),
        (
            2,
            EtaView {
                at_ms: None,
                note: "it waits for running work that has no max runtime (#3 job-3)".into(),
            },
        ),
    ]
    .into_iter()
    .collect();
    let data =
        queue::build(NOW, pending.iter(), &projects, &principal, None, None).with_etas(&etas);
    assert_eq!(data.rows.iter().map(|r| r.position).collect::<Vec<_>>(), [1, 1, 2, 2]);
    assert!(data.rows.iter().all(|r| r.can_act), "an admin may cancel anything");
    let text = queue::render(&data).into_string();
    assert!(text.contains("≈ in 2 h 10 min (after #5 job-5 reaches its max runtime)"), "{text}");
    assert!(text.contains("unknown: it waits for running work that has no max runtime"));
    assert!(text.contains("title=\"members × GPUs each\">2×4</a>"), "{text}");
    let viewer = Principal { role: Role::Viewer, ..principal.clone() };
    let seen = queue::build(NOW, pending.iter(), &projects, &viewer, None, None);
    assert!(!queue::render(&seen).into_string().contains("<form"), "a viewer gets no buttons");
    check("queue", Tab::Queue, &queue::render(&data));
    let filtered =
        queue::build(NOW, pending.iter(), &projects, &principal, Some("vision".into()), None);
    assert_eq!(filtered.total, 2);
    assert!(filtered.rows.iter().all(|r| r.workload.project == "vision"));
}

#[test]
fn snapshot_workload() {
    let w = warned();
    let data = workload::WorkloadData {
        telemetry: false,
        now_ms: NOW,
        why: Why {
            id: 3,
            name: w.name.clone(),
            state: w.state,
            lines: vec![
                "job-3 is running on a100-0: 0,1.".into(),
                w.reason.clone().unwrap_or_default(),
            ],
            decision: Some(
                serde_json::json!({"action": "warn", "reason_code": "idle_warning", "id": 3}),
            ),
        },
        timeline: vec![
            Step {
                at_ms: w.submitted_ms,
                state: WorkloadState::Pending,
                what: "submitted".into(),
                code: None,
                detail: None,
            },
            Step {
                at_ms: w.submitted_ms + MIN,
                state: WorkloadState::Starting,
                what: "admitted".into(),
                code: Some("within_guarantee".into()),
                detail: Some("within vision's guarantee".into()),
            },
            Step {
                at_ms: NOW - MIN,
                state: WorkloadState::Running,
                what: "warned".into(),
                code: w.reason_code.clone(),
                detail: w.reason.clone(),
            },
        ],
        ledger: Some(row("workload:3", 0.75, 0.0)),
        workload: w,
        eta: None,
        can_act: true,
    };
    check("workload", Tab::Workload, &workload::render(&data));
    let text = workload::render(&data).into_string();
    assert!(text.contains("/workload/3/suspend") && text.contains("/workload/3/cancel"));
    assert!(!text.contains("/workload/3/resume"), "a running workload is not resumed");
    let pending = workload::WorkloadData {
        workload: workload(4, "vision", WorkloadState::Pending, "", ""),
        eta: Some(EtaView {
            at_ms: Some(NOW + 5 * MIN),
            note: "after #3 job-3 reaches its max runtime".into(),
        }),
        can_act: false,
        ..data
    };
    let text = workload::render(&pending).into_string();
    assert!(
        text.contains("Estimated start: <span class=\"eta\">≈ in 5 min (after #3 job-3"),
        "{text}"
    );
    assert!(!text.contains("<form class=\"inline action\""), "no buttons without the right to act");
}

#[test]
fn snapshot_projects() {
    let data = projects::ProjectsData {
        telemetry: false,
        since_ms: NOW - 60 * MIN,
        now_ms: NOW,
        projects: vec![project("nlp", 1.0, 2.0), project("vision", 10.0, 8.0)],
        rows: vec![
            row("cluster", 12.5, 1.25),
            row("project:nlp", 2.0, 0.0),
            row("project:vision", 10.5, 1.25),
        ],
        warned: vec![("nlp".into(), vec![]), ("vision".into(), vec![warned()])],
        standings: vec![
            allot_core::Standing {
                project: allot_core::ProjectId(0),
                name: "nlp".into(),
                cohort: Some("research".into()),
                weight_milli: 1000,
                weight_fraction: 0.5,
                fair_share_shares: 5000.0,
                allocated: allot_core::Shares::from_gpus(1),
                decayed_shares: 500.0,
                usage_fraction: Some(0.1),
                standing: Some(0.3),
                head_within_guarantee: Some(true),
                rank: Some(1),
                pending: 2,
            },
            allot_core::Standing {
                project: allot_core::ProjectId(1),
                name: "vision".into(),
                cohort: Some("research".into()),
                weight_milli: 1000,
                weight_fraction: 0.5,
                fair_share_shares: 5000.0,
                allocated: allot_core::Shares::from_gpus(10),
                decayed_shares: 3500.0,
                usage_fraction: Some(0.9),
                standing: Some(2.7),
                head_within_guarantee: Some(false),
                rank: Some(2),
                pending: 2,
            },
        ],
        periods: vec![
            period("cluster", 1, 4.5, 0.25),
            period("cluster", 0, 8.0, 1.0),
            period("project:nlp", 1, 1.0, 0.0),
            period("project:vision", 1, 3.5, 0.25),
            period("project:vision", 0, 7.0, 1.0),
        ],
        project: None,
        derived_at_ms: Some(NOW),
    };
    check("projects", Tab::Projects, &projects::render(&data));
    let text = projects::render(&data).into_string();
    assert!(text.contains("Fair-share standing") && text.contains("2.70"), "{text}");
    assert_eq!(text.matches("no telemetry").count(), 3 * 5 + 5 * 3 + 1, "ledger, periods, note");
}

#[test]
fn snapshot_idle() {
    let data = idle::IdleData {
        now_ms: NOW,
        workloads: vec![
            warned(),
            workload(
                6,
                "nlp",
                WorkloadState::Pending,
                "idle_backoff",
                "reclaimed for idleness 2 times in a row; may resume at 2026-11-30 12:10:00 UTC",
            ),
        ],
    };
    check("idle", Tab::Idle, &idle::render(&data));
}

#[test]
fn snapshot_policy() {
    let active = PolicyView {
        source: "policy.yaml".into(),
        text: "projects:\n  - name: vision\n".into(),
        version: 2,
        rollout: Some(rollout()),
    };
    let bad = PolicyValidation {
        ok: false,
        summary: "candidate policy: 1 problem(s)".into(),
        problems: vec![ApiError {
            error: "candidate policy:3:5: unknown field \"gpu\"".into(),
            field: Some("projects[0].quota[0].gpu".into()),
            fix: Some("did you mean \"gpus\"?".into()),
        }],
    };
    let data = policy::PolicyData {
        active,
        versions: versions(),
        shadow: None,
        candidate: Some(("projects: <x>\n".into(), bad)),
        whatif: None,
    };
    check("policy", Tab::Policy, &policy::render(&data));
}

/// A replay report with round figures: `scale` changes every figure so that the two policies
/// differ.
fn replay_report(label: &str, scale: f64, preemptions: u64) -> allot_sim::outcome::ReplayReport {
    use allot_sim::outcome::{ProjectLedger, ReplayReport, TimelinePoint};
    let ledger = |project: &str, allocated: f64| ProjectLedger {
        project: project.into(),
        allocated_gpu_hours: allocated,
        active_gpu_hours: allocated * 0.7,
        useful_gpu_hours: allocated * 0.6,
        lost_gpu_hours: allocated * 0.1,
        idle_gpu_hours: allocated * 0.3,
        jobs_finished: 3,
        jobs_total: 4,
        preemptions: preemptions / 2,
    };
    ReplayReport {
        policy: label.into(),
        seed: 42,
        jobs_total: 8,
        jobs_finished: 6,
        jobs_pending: 2,
        jobs_cancelled: 0,
        jct_s_mean: 5400.0 * scale,
        queue_delay_s_p50: 120.0 * scale,
        queue_delay_s_p95: 3600.0 * scale,
        queue_delay_s_p99: 4000.0 * scale,
        big_jobs: 2,
        big_queue_delay_s_mean: 900.0,
        big_queue_delay_s_p50: 600.0,
        big_queue_delay_s_p95: 1200.0,
        big_queue_delay_s_max: 1200.0,
        gpu_allocated_pct: 61.5 / scale,
        gpu_active_pct: 40.25 / scale,
        preemptions,
        jobs_preempted: (preemptions / 2) as usize,
        preemptions_per_job_max: 2,
        lost_gpu_hours: 1.5 * scale,
        goodput: 0.6,
        wall_ms: 0,
        timeline: (0..5)
            .map(|k| TimelinePoint {
                t_s: f64::from(k) * 1800.0,
                allocated_gpus: f64::from(k * 2) / scale,
                active_gpus: f64::from(k) / scale,
                pending_jobs: 4 - k as usize,
            })
            .collect(),
        queue_delays_s: vec![0.0, 60.0 * scale, 120.0 * scale, 3600.0 * scale],
        projects: vec![ledger("vision", 10.0 * scale), ledger("nlp", 4.0 / scale)],
        capacity_gpus: 8.0,
        span_s: 7200.0,
        allocated_gpu_hours: 14.0,
        active_gpu_hours: 9.8,
        useful_gpu_hours: 8.4,
        idle_gpu_hours: 4.2,
        decide_calls: 30,
        bad_rows_skipped: 0,
        rehearsal: None,
        by_job: Default::default(),
    }
}

#[test]
fn snapshot_policy_whatif() {
    let active = PolicyView {
        source: "policy.yaml".into(),
        text: "projects:\n  - name: vision\n".into(),
        version: 2,
        rollout: None,
    };
    let ok = PolicyValidation {
        ok: true,
        summary: "team.yaml: ok — 2 projects, 3 priority classes, 0 idle rules".into(),
        problems: vec![],
    };
    let result = crate::whatif::WhatIfResult {
        active: replay_report("active", 1.0, 0),
        candidate: replay_report("candidate", 2.0, 4),
        counts: allot_api::HistoryCounts {
            ended: 5,
            running: 2,
            pending_estimated: 1,
            pending_skipped: 1,
            never_ran: 1,
            older_left_out: 0,
        },
        jobs: 8,
        nodes: 2,
        gpus: 8,
        seed: 42,
        restart_delay_s: 60.0,
        added_active: vec![],
        added_candidate: vec!["nlp".into()],
        fidelity: vec![
            crate::whatif::FidelityRow {
                project: "all".into(),
                jobs: 7,
                wait_p50_s: (12.0, 12.5),
                wait_p95_s: (300.0, 410.0),
                allocated_gpu_hours: (20.0, 19.2),
                preemptions: (3, 3),
            },
            crate::whatif::FidelityRow {
                project: "vision".into(),
                jobs: 4,
                wait_p50_s: (10.0, 10.0),
                wait_p95_s: (40.0, 42.0),
                allocated_gpu_hours: (12.0, 11.9),
                preemptions: (0, 0),
            },
        ],
        wall_ms: 1500,
    };
    let data = policy::PolicyData {
        active,
        versions: versions(),
        shadow: Some(shadow()),
        candidate: Some(("projects: []\n".into(), ok)),
        whatif: Some(policy::WhatIf::Done(Box::new(result))),
    };
    check("policy_whatif", Tab::Policy, &policy::render(&data));
    // While it runs, the section asks for itself again.
    let running =
        policy::whatif_section(&policy::WhatIf::Running { id: 3, jobs: 8, elapsed_ms: 2000 })
            .into_string();
    assert!(
        running.contains("hx-get=\"/policy/whatif/3\"") && running.contains("every 2s"),
        "{running}"
    );
}

#[test]
fn snapshot_login() {
    let text = super::login_markup(Some("unknown or revoked token")).into_string();
    assert!(text.contains("type=\"password\"") && text.contains("unknown or revoked token"));
}

/// The fleet page at its heaviest: a full sample series and 500 devices. Figures only, behind
/// `ALLOT_DASHBOARD_BENCH=1` (with `--release`), next to `tests/dashboard_bench.rs`.
#[test]
fn fleet_with_a_full_series_on_500_devices() {
    if std::env::var_os("ALLOT_DASHBOARD_BENCH").is_none() {
        return;
    }
    let samples = (0..crate::view::SAMPLES_MAX as u64)
        .map(|k| FleetSample {
            at_ms: NOW - k * crate::view::SAMPLE_MS,
            capacity_shares: 500_000,
            allocated_shares: 300_000 + (k * 7919) % 150_000,
            free_shares: 200_000 - (k * 7919) % 150_000,
            stranded_shares: (k * 104_729) % 20_000,
            warned_idle_shares: (k * 31) % 9000,
            active_shares: None,
        })
        .collect();
    let nodes = (0..63u64)
        .map(|n| Node {
            unusable: None,
            unmanaged: None,
            name: format!("gpu-{n}"),
            devices: (0..if n == 62 { 4 } else { 8 })
                .map(|i| Device {
                    index: i,
                    model: "H100".into(),
                    used_shares: (n * 8 + u64::from(i)) * 250 % 1250,
                    workloads: vec![n * 8 + u64::from(i) + 1],
                })
                .collect(),
        })
        .collect();
    let data = fleet::FleetData {
        now_ms: NOW,
        inventory_source: "bench".into(),
        samples,
        nodes,
        warned: (1..40).collect(),
        show_metrics: true,
    };
    #[allow(clippy::disallowed_methods)] // a benchmark measures real time
    let start = std::time::Instant::now();
    let page = layout("fleet", &frame(Tab::Fleet), &live("/fleet", &fleet::render(&data)));
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "fleet page, {} samples × 4 series, 500 devices: {ms:.1} ms to render, {} bytes",
            crate::view::SAMPLES_MAX,
            page.0.len()
        );
    }
}
