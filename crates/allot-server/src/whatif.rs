//! What-if: the replay of the daemon's history (`GET /api/v1/history`, exported by
//! `machine/history.rs`) under the active and a candidate policy on the daemon's nodes (the
//! dashboard's policy page), and the history as the simulator's trace jobs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use allot_api::{HistoryCounts, HistoryExport};
use allot_core::{NodeSpec, PolicySpec};
use allot_sim::outcome::ReplayReport;
use allot_sim::replay::{ReplayConfig, ReplayError, add_unlisted_projects, replay_until_stopped};
use allot_sim::trace::{TraceJob, parse_kind};

/// Newest workloads a dashboard what-if replays.
pub const WHATIF_JOBS_MAX: usize = 20_000;
/// The dashboard stops waiting for a what-if after this long and says so (its cost is bounded
/// by `WHATIF_JOBS_MAX`, and a newer candidate's what-if stops the one running).
pub const WHATIF_WAIT_MS: u64 = 10 * 60 * 1000;
/// Finished what-if results kept for polling; older ones are dropped.
const RESULTS_KEPT: usize = 8;
/// Timeline points a what-if aims for (the step is the span divided by this, at least 1 s).
const TIMELINE_POINTS: f64 = 500.0;

/// The exported jobs as the simulator's trace jobs (`line` is the job's position, 1-based).
pub fn trace_jobs(export: &HistoryExport) -> Vec<TraceJob> {
    export
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| TraceJob {
            id: j.id,
            name: j.name.clone(),
            submit_s: j.submit_s,
            duration_s: j.duration_s,
            project: j.project.clone(),
            gpus: j.gpus,
            members: j.members,
            gpu_milli: j.gpu_milli,
            gpu_models: j.gpu_models.clone(),
            kind: parse_kind(&j.kind),
            priority_class: j.priority_class.clone(),
            checkpoint_interval_s: j.checkpoint_interval_s,
            cpu_milli: j.cpu_milli,
            memory_mib: j.memory_mib,
            line: i + 1,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The replay of the history under two policies

/// What a what-if replayed and what came out.
#[derive(Clone, Debug, PartialEq)]
pub struct WhatIfResult {
    /// The active policy's replay (label `active`).
    pub active: ReplayReport,
    /// The candidate's replay (label `candidate`).
    pub candidate: ReplayReport,
    /// Where the replayed jobs came from and what was left out.
    pub counts: HistoryCounts,
    pub jobs: usize,
    pub nodes: usize,
    pub gpus: usize,
    /// The replay's seed (activity model, kind assignment).
    pub seed: u64,
    /// Seconds a pre-empted job needs to restart in the replay.
    pub restart_delay_s: f64,
    /// Projects of the history a policy lacks, added with no guarantee (per policy).
    pub added_active: Vec<String>,
    pub added_candidate: Vec<String>,
    /// Wall time of both replays (they run side by side).
    pub wall_ms: u64,
    /// How well the active policy's replay reproduces what was recorded, per project and in
    /// all ("all" first): the side-by-side is only as good as this.
    pub fidelity: Vec<FidelityRow>,
}

/// The active policy's replay against the recorded outcome, for one project (or `all`), over
/// the exported work that ended after running.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FidelityRow {
    pub project: String,
    /// Jobs admitted both in the daemon and in the replay (the waits compare these).
    pub jobs: usize,
    /// (recorded, replayed)
    pub wait_p50_s: (f64, f64),
    pub wait_p95_s: (f64, f64),
    pub allocated_gpu_hours: (f64, f64),
    pub preemptions: (u64, u64),
}

impl FidelityRow {
    /// The largest gap of the four figures, relative to the recorded one; a figure whose
    /// recorded and replayed values both stay under its floor (1 s of wait, 0.01 GPU-h, one
    /// pre-emption per hundred jobs, at least one) counts as matching, and gaps are taken
    /// against at least the floor: a relative gap of almost nothing says nothing.
    pub fn worst_gap(&self) -> f64 {
        let gap = |(recorded, replayed): (f64, f64), floor: f64| {
            if recorded.abs() < floor && replayed.abs() < floor {
                0.0
            } else {
                (replayed - recorded).abs() / recorded.abs().max(floor)
            }
        };
        let (a, b) = self.preemptions;
        [
            gap(self.wait_p50_s, 1.0),
            gap(self.wait_p95_s, 1.0),
            gap(self.allocated_gpu_hours, 0.01),
            gap((a as f64, b as f64), (self.jobs as f64 / 100.0).max(1.0)),
        ]
        .into_iter()
        .fold(0.0, f64::max)
    }
}

/// The active replay's figures against the recorded ones of `export`'s jobs that ended after
/// running (`DurationBasis::Ran`): for running and pending work the replay invents a future
/// the record does not have yet.
pub fn fidelity(export: &HistoryExport, active: &ReplayReport) -> Vec<FidelityRow> {
    let ended = |j: &&allot_api::HistoryJob| j.duration_basis == allot_api::DurationBasis::Ran;
    let mut projects: Vec<&str> =
        export.jobs.iter().filter(ended).map(|j| j.project.as_str()).collect();
    projects.sort_unstable();
    projects.dedup();
    let row = |name: &str, within: &dyn Fn(&str) -> bool| {
        let (mut recorded_waits, mut replayed_waits) = (Vec::new(), Vec::new());
        let (mut recorded_hours, mut replayed_hours) = (0.0, 0.0);
        let (mut recorded_preemptions, mut replayed_preemptions) = (0u64, 0u64);
        for j in export.jobs.iter().filter(ended).filter(|j| within(&j.project)) {
            let (Some(r), Some(o)) = (&j.recorded, active.by_job.get(&j.id)) else { continue };
            recorded_hours += r.allocated_gpu_hours;
            replayed_hours += o.allocated_gpu_hours;
            recorded_preemptions += r.preemptions;
            replayed_preemptions += u64::from(o.preemptions);
            if let (Some(recorded), Some(replayed)) = (r.queue_delay_s, o.first_wait_s) {
                recorded_waits.push(recorded);
                replayed_waits.push(replayed);
            }
        }
        recorded_waits.sort_by(f64::total_cmp);
        replayed_waits.sort_by(f64::total_cmp);
        let pct = allot_sim::replay::percentile;
        FidelityRow {
            project: name.to_string(),
            jobs: recorded_waits.len(),
            wait_p50_s: (pct(&recorded_waits, 50.0), pct(&replayed_waits, 50.0)),
            wait_p95_s: (pct(&recorded_waits, 95.0), pct(&replayed_waits, 95.0)),
            allocated_gpu_hours: (recorded_hours, replayed_hours),
            preemptions: (recorded_preemptions, replayed_preemptions),
        }
    };
    let known: std::collections::BTreeSet<&str> = projects.iter().copied().collect();
    let mut rows = vec![row("all", &|p| known.contains(p))];
    rows.extend(projects.iter().map(|p| row(p, &|q| q == *p)));
    rows
}

/// The replay settings a what-if uses: the simulator's defaults (as `allot sim replay` without
/// flags) with a timeline step fitted to the history's span, and, when the daemon measured one
/// (`HistoryExport::startup_delay_s`), its own start-up delay for first starts and restarts
/// (the default restart delay, 60 s, is a model: on work that restarts in milliseconds it
/// holds GPUs the daemon never held, and the replay's queues and pre-emptions drift), and its
/// decision interval under the daemon's rule, not on a grid (a grid delays each admission
/// after a quiet spell by up to an interval, and the delay compounds down a queue: waits came
/// out 6–9 % longer than recorded on 10,000 workloads, docs/benchmarks.md).
pub fn whatif_config(export: &HistoryExport, jobs: &[TraceJob]) -> ReplayConfig {
    let startup_delay_s = export.startup_delay_s;
    let span = jobs.iter().map(|j| j.submit_s + j.duration_s).fold(0.0_f64, f64::max);
    let defaults = ReplayConfig::default();
    let measured = startup_delay_s.filter(|d| d.is_finite() && *d >= 0.0);
    ReplayConfig {
        timeline_step_s: (span / TIMELINE_POINTS).max(1.0),
        launch_delay_s: measured.unwrap_or(defaults.launch_delay_s),
        restart_delay_s: measured.unwrap_or(defaults.restart_delay_s),
        decide_every_s: export
            .decide_interval_s
            .filter(|d| d.is_finite() && *d >= 0.0)
            .unwrap_or(0.0),
        decide_on_grid: false,
        ..defaults
    }
}

/// Replays `jobs` on `nodes` under both policies, on two threads, and returns both reports;
/// both replays end early once `stop` is set. Blocking: call it from a thread of its own,
/// never on the main loop or an async worker.
pub fn run_whatif(
    nodes: &[NodeSpec],
    active: &PolicySpec,
    candidate: &PolicySpec,
    jobs: &[TraceJob],
    config: &ReplayConfig,
    counts: HistoryCounts,
    stop: &AtomicBool,
) -> Result<WhatIfResult, String> {
    let (active, added_active) = add_unlisted_projects(active, jobs);
    let (candidate, added_candidate) = add_unlisted_projects(candidate, jobs);
    let started = wall_clock_ms();
    let (a, c) = std::thread::scope(|s| {
        let a = s.spawn(|| replay_until_stopped(nodes, &active, "active", jobs, config, stop));
        let c = replay_until_stopped(nodes, &candidate, "candidate", jobs, config, stop);
        (a.join(), c)
    });
    let a = a.map_err(|_| "the active policy's replay stopped unexpectedly".to_string())?;
    let why = |policy: &str, e: ReplayError| match e {
        ReplayError::Stopped { .. } => "stopped: a newer what-if replaced it".to_string(),
        e => format!("replay under the {policy} policy: {e}"),
    };
    let a = a.map_err(|e| why("active", e))?;
    let c = c.map_err(|e| why("candidate", e))?;
    Ok(WhatIfResult {
        active: a,
        candidate: c,
        counts,
        jobs: jobs.len(),
        nodes: nodes.len(),
        gpus: nodes.iter().map(|n| n.devices.len()).sum(),
        seed: config.seed,
        restart_delay_s: config.restart_delay_s,
        added_active,
        added_candidate,
        wall_ms: wall_clock_ms().saturating_sub(started),
        fidelity: Vec::new(),
    })
}

fn wall_clock_ms() -> u64 {
    crate::os::wall_ms()
}

/// Where one what-if stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RunState {
    Running { started_ms: u64, jobs: usize },
    Done(Box<WhatIfResult>),
    Failed(String),
}

/// The dashboard's what-if runs, by number: one running at a time (a newer one stops it),
/// the last few results kept for polling.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    inner: Mutex<RunsInner>,
}

#[derive(Debug, Default)]
struct RunsInner {
    next: u64,
    runs: BTreeMap<u64, RunState>,
    /// The stop flag of each run still running.
    stops: BTreeMap<u64, Arc<AtomicBool>>,
    /// What each kept run compared, and when it finished.
    compared: BTreeMap<u64, Compared>,
}

/// The two policies a what-if compared: the active one by version and text, the candidate by
/// text (an apply of the same text against the same active policy was shown this what-if).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compared {
    pub active_version: u32,
    pub active_text: String,
    pub candidate_text: String,
    /// When the run finished (ms since the epoch); 0 while it runs.
    pub done_ms: u64,
}

impl Runs {
    /// Starts `work` on a thread of its own; a what-if still running is told to stop and
    /// shown as replaced by this one. `work` ends early once its flag is set.
    pub(crate) fn start(
        self: &Arc<Self>,
        jobs: usize,
        compared: Compared,
        work: impl FnOnce(&AtomicBool) -> Result<WhatIfResult, String> + Send + 'static,
    ) -> Result<u64, RunStartError> {
        let stop = Arc::new(AtomicBool::new(false));
        let id = {
            let mut inner = self.inner.lock().map_err(|_| RunStartError::Poisoned)?;
            inner.next += 1;
            let id = inner.next;
            for (old, flag) in std::mem::take(&mut inner.stops) {
                flag.store(true, Ordering::Relaxed);
                inner.runs.insert(
                    old,
                    RunState::Failed(format!(
                        "stopped: what-if #{id} replaced it (a newer candidate was checked)"
                    )),
                );
            }
            inner.runs.insert(id, RunState::Running { started_ms: wall_clock_ms(), jobs });
            inner.stops.insert(id, Arc::clone(&stop));
            inner.compared.insert(id, compared);
            while inner.runs.len() > RESULTS_KEPT {
                if let Some((old, _)) = inner.runs.pop_first() {
                    inner.compared.remove(&old);
                }
            }
            id
        };
        let runs = Arc::clone(self);
        let spawned =
            std::thread::Builder::new().name(format!("allot-whatif-{id}")).spawn(move || {
                let outcome = match work(&stop) {
                    Ok(r) => RunState::Done(Box::new(r)),
                    Err(e) => RunState::Failed(e),
                };
                if let Ok(mut inner) = runs.inner.lock() {
                    // A replaced run already says so; only a run still listed as running ends here.
                    if inner.stops.remove(&id).is_some() {
                        inner.runs.insert(id, outcome);
                        if let Some(c) = inner.compared.get_mut(&id) {
                            c.done_ms = wall_clock_ms();
                        }
                    }
                }
            });
        if let Err(e) = spawned
            && let Ok(mut inner) = self.inner.lock()
        {
            inner.runs.insert(id, RunState::Failed(format!("no thread for the replay: {e}")));
        }
        Ok(id)
    }

    pub(crate) fn get(&self, id: u64) -> Option<RunState> {
        self.inner.lock().ok()?.runs.get(&id).cloned()
    }

    /// The newest finished what-if of `candidate_text` against `active_text`, as a version
    /// keeps it: what an admin saw before applying that text.
    pub(crate) fn shown_for(
        &self,
        active_text: &str,
        candidate_text: &str,
    ) -> Option<allot_api::WhatIfShown> {
        let inner = self.inner.lock().ok()?;
        inner.runs.iter().rev().find_map(|(id, state)| {
            let c = inner.compared.get(id)?;
            let RunState::Done(result) = state else { return None };
            (c.active_text == active_text && c.candidate_text == candidate_text)
                .then(|| shown(*id, c, result))
        })
    }
}

/// A finished what-if in whole units, as a policy version keeps it.
pub(crate) fn shown(run: u64, compared: &Compared, r: &WhatIfResult) -> allot_api::WhatIfShown {
    let milli = |v: f64| (v.max(0.0) * 1000.0).round() as u64;
    let figures = |r: &ReplayReport| allot_api::WhatIfFigures {
        wait_p50_ms: milli(r.queue_delay_s_p50),
        wait_p95_ms: milli(r.queue_delay_s_p95),
        allocated_milli_gpu_hours: milli(r.allocated_gpu_hours),
        lost_milli_gpu_hours: milli(r.lost_gpu_hours),
        preemptions: r.preemptions,
        finished: r.jobs_finished as u64,
    };
    let gap = r
        .fidelity
        .iter()
        .map(FidelityRow::worst_gap)
        .fold(None, |worst: Option<f64>, g| Some(worst.map_or(g, |w| w.max(g))));
    allot_api::WhatIfShown {
        run,
        at_ms: compared.done_ms,
        active_version: compared.active_version,
        jobs: r.jobs as u64,
        active: figures(&r.active),
        candidate: figures(&r.candidate),
        fidelity_gap_pct: gap
            .filter(|g| g.is_finite())
            .map(|g| (g * 100.0).round().min(u32::MAX as f64) as u32),
    }
}

/// Why a what-if did not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RunStartError {
    Poisoned,
}

#[cfg(test)]
mod tests {
    use allot_api::{DurationBasis, SubmitRequest, WorkloadState};
    use allot_sim::trace::{TraceJob, allot_trace_jsonl, parse_allot_trace};

    use super::{run_whatif, trace_jobs};
    use crate::machine::history::{cluster_yaml, export};
    use crate::machine::{Daemon, Entry};

    const CLUSTER: &str = "nodes:\n  - name: n0\n    cpu: 64\n    memory: 512Gi\n    gpus:\n      - {model: A100, count: 4, memory: 80Gi}\n";

    /// Three projects in one cohort; `vision` and `nlp` are guaranteed the given GPUs.
    fn policy(vision: u32, nlp: u32) -> String {
        format!(
            "priority_classes:\n  - {{name: normal, value: 0, preemptible: true}}\n\
             default_priority_class: normal\n\
             projects:\n\
             \x20 - {{name: vision, cohort: c, quotas: [{{model: any, guaranteed: {vision}}}]}}\n\
             \x20 - {{name: nlp, cohort: c, quotas: [{{model: any, guaranteed: {nlp}}}]}}\n\
             \x20 - {{name: research, cohort: c, quotas: [{{model: any, guaranteed: 0}}]}}\n"
        )
    }

    fn request(project: &str, gpus: f64, max_runtime_s: Option<u64>) -> SubmitRequest {
        SubmitRequest {
            name: Some(format!("{project}-{gpus}")),
            project: project.into(),
            kind: Some("training".into()),
            gpus: Some(gpus),
            max_runtime_s,
            command: vec!["sleep".into(), "1".into()],
            ..SubmitRequest::default()
        }
    }

    /// A known history: submit times, starts and ends at chosen milliseconds.
    fn history() -> Daemon {
        let nodes =
            allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("valid in this test");
        let text = policy(2, 2);
        let spec = allot_config::parse_policy("policy.yaml", &text).expect("valid in this test");
        let mut d = Daemon::new(
            nodes,
            &spec,
            ("policy.yaml".into(), text),
            std::env::temp_dir().join("allot-whatif-unit"),
        )
        .expect("valid in this test");
        let submit = |d: &mut Daemon, at: u64, id: u64, r: SubmitRequest| {
            d.apply(at, &Entry::Submitted { id, user: "alice".into(), request: r });
        };
        submit(&mut d, 10_000, 1, request("vision", 1.0, None));
        d.apply(10_000, &Entry::Decided);
        d.apply(12_000, &Entry::Started { id: 1, attempt: 1, pids: vec![1] });
        submit(&mut d, 15_000, 2, request("nlp", 0.5, None));
        d.apply(15_000, &Entry::Decided);
        d.apply(16_000, &Entry::Started { id: 2, attempt: 1, pids: vec![2] });
        // Too big to place now (3 GPUs are held or free: 1 + 0.5 held): these wait.
        submit(&mut d, 17_000, 3, request("vision", 4.0, Some(3600)));
        submit(&mut d, 18_500, 4, request("vision", 4.0, None));
        submit(&mut d, 19_000, 5, request("research", 4.0, None));
        submit(&mut d, 19_500, 6, request("research", 4.0, None));
        d.apply(19_500, &Entry::CancelRequested { id: 6 });
        d.apply(20_000, &Entry::Decided);
        d.apply(
            612_000,
            &Entry::Exited {
                id: 1,
                attempt: 1,
                code: Some(0),
                detail: String::new(),
                cancelled: false,
            },
        );
        d
    }

    #[test]
    fn the_export_has_each_jobs_submit_time_duration_and_basis() {
        let d = history();
        for (id, state) in [
            (1, WorkloadState::Succeeded),
            (2, WorkloadState::Running),
            (3, WorkloadState::Pending),
            (6, WorkloadState::Cancelled),
        ] {
            assert_eq!(d.workloads[&id].state, state, "workload {id}");
        }
        let e = export(&d, 716_000, 100);
        let got: Vec<(u64, &str, f64, f64, DurationBasis)> = e
            .jobs
            .iter()
            .map(|j| (j.id, j.project.as_str(), j.submit_s, j.duration_s, j.duration_basis))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "vision", 0.0, 600.0, DurationBasis::Ran),
                (2, "nlp", 5.0, 700.0, DurationBasis::ElapsedLowerBound),
                (3, "vision", 7.0, 3600.0, DurationBasis::MaxRuntime),
                (4, "vision", 8.5, 600.0, DurationBasis::ProjectMedian),
            ]
        );
        assert_eq!(e.first_submit_ms, Some(10_000));
        assert_eq!((e.jobs[1].gpus, e.jobs[1].gpu_milli), (1, 500));
        assert_eq!(e.jobs[0].kind, "training");
        let c = &e.counts;
        assert_eq!(
            (c.ended, c.running, c.pending_estimated, c.pending_skipped, c.never_ran),
            (1, 1, 2, 1, 1),
            "{c:?}"
        );
        // The newest only: the limit drops the oldest.
        let newest = export(&d, 716_000, 3);
        assert_eq!(newest.counts.older_left_out, 3);
        assert_eq!(newest.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![4]);
        assert_eq!(newest.jobs[0].submit_s, 0.0);
    }

    #[test]
    fn the_exported_trace_and_cluster_read_back_and_replay() {
        let d = history();
        let e = export(&d, 716_000, 100);
        let jobs = trace_jobs(&e);
        let text = allot_trace_jsonl(&jobs);
        let back = parse_allot_trace(
            std::path::Path::new("history.jsonl"),
            &text,
            allot_sim::BadRows::Fail,
        )
        .expect("valid in this test");
        assert_eq!(back.jobs, jobs);
        let nodes = allot_config::parse_cluster("exported.yaml", &e.cluster_yaml)
            .expect("valid in this test");
        assert_eq!(nodes, d.nodes);
        let policy = allot_config::parse_policy("p", &e.policy_text).expect("valid in this test");
        let report = allot_sim::replay::replay(
            &nodes,
            &policy,
            "p",
            &back.jobs,
            &allot_sim::replay::ReplayConfig::default(),
        )
        .expect("valid in this test");
        assert_eq!(report.jobs_total, 4);
        assert_eq!(report.jobs_finished, 4);
        // What was recorded travels with each job: job 1 was admitted as it came, held its
        // GPUs until it exited, and the replay of the policy that ran it admits it at once.
        let recorded = e.jobs[0].recorded.as_ref().expect("recorded");
        assert_eq!(recorded.queue_delay_s, Some(0.0));
        assert!(recorded.allocated_gpu_hours > 0.0, "{recorded:?}");
        assert_eq!(report.by_job.get(&1).and_then(|o| o.first_wait_s), Some(0.0));
        let rows = super::fidelity(&e, &report);
        assert_eq!(rows[0].project, "all");
        assert_eq!(rows.iter().map(|r| r.project.as_str()).collect::<Vec<_>>(), ["all", "vision"]);
        assert_eq!(rows[0].preemptions, (0, 0));
        assert_eq!(rows[0].jobs, 1, "job 1 alone ended after running");
    }

    #[test]
    fn the_example_inventory_survives_the_cluster_file() {
        let text = include_str!("../../../examples/cluster.yaml");
        let nodes = allot_config::parse_cluster("cluster.yaml", text).expect("valid in this test");
        let back = allot_config::parse_cluster("exported.yaml", &cluster_yaml(&nodes))
            .expect("valid in this test");
        assert_eq!(back, nodes);
    }

    fn job(id: u64, project: &str, submit_s: f64) -> TraceJob {
        TraceJob {
            name: format!("job-{id}"),
            line: id as usize,
            ..TraceJob::whole(id, project, submit_s, 3600.0, 1, 1)
        }
    }

    /// `vision` fills the cluster first, `nlp` arrives a minute later. Guaranteed to `vision`
    /// (active), `nlp` waits; guaranteed to `nlp` (candidate), it takes its GPUs back from the
    /// borrower: pre-emptions and lost work, shorter waits.
    #[test]
    fn a_guarantee_moved_to_the_late_project_preempts_and_shortens_its_wait() {
        let nodes =
            allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("valid in this test");
        let to_vision = allot_config::parse_policy("a", &policy(4, 0)).expect("valid in this test");
        let to_nlp = allot_config::parse_policy("b", &policy(0, 4)).expect("valid in this test");
        let jobs: Vec<TraceJob> = (1..=4)
            .map(|i| job(i, "vision", 0.0))
            .chain((5..=8).map(|i| job(i, "nlp", 60.0)))
            .collect();
        let go = std::sync::atomic::AtomicBool::new(false);
        let r = run_whatif(
            &nodes,
            &to_vision,
            &to_nlp,
            &jobs,
            &allot_sim::replay::ReplayConfig::default(),
            Default::default(),
            &go,
        )
        .expect("valid in this test");
        let (a, c) = (&r.active, &r.candidate);
        assert_eq!((a.jobs_finished, c.jobs_finished), (8, 8));
        assert_eq!(a.preemptions, 0, "{a:?}");
        assert!(c.preemptions > a.preemptions, "{} vs {}", c.preemptions, a.preemptions);
        assert!(c.lost_gpu_hours > a.lost_gpu_hours);
        assert!(c.queue_delay_s_p95 < a.queue_delay_s_p95, "{c:?}\n{a:?}");
        let nlp = |rep: &allot_sim::outcome::ReplayReport| {
            rep.projects.iter().find(|p| p.project == "nlp").map(|p| p.preemptions)
        };
        assert_eq!(nlp(a), Some(0));
        assert_eq!((r.jobs, r.nodes, r.gpus, r.seed), (8, 1, 4, 42));
        // Told to stop, both replays end at once and say why.
        let stop = std::sync::atomic::AtomicBool::new(true);
        let stopped = run_whatif(
            &nodes,
            &to_vision,
            &to_nlp,
            &jobs,
            &allot_sim::replay::ReplayConfig::default(),
            Default::default(),
            &stop,
        );
        assert_eq!(stopped.err().as_deref(), Some("stopped: a newer what-if replaced it"));
    }

    /// A newer what-if stops the one running, which is shown as replaced; the newer one runs
    /// to its end.
    #[test]
    fn a_newer_whatif_stops_and_replaces_the_one_running() {
        use std::sync::Arc;
        use std::sync::atomic::Ordering;

        use super::{RunState, Runs};
        let runs = Arc::new(Runs::default());
        let first = runs
            .start(10, compared("a", "b"), |stop: &std::sync::atomic::AtomicBool| {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err("the first replay saw its stop".to_string())
            })
            .expect("started");
        assert!(matches!(runs.get(first), Some(RunState::Running { jobs: 10, .. })));
        let second = runs
            .start(20, compared("a", "c"), |_| Err("the second ran to its end".to_string()))
            .expect("started");
        let replaced =
            format!("stopped: what-if #{second} replaced it (a newer candidate was checked)");
        assert_eq!(runs.get(first), Some(RunState::Failed(replaced.clone())));
        for _ in 0..500 {
            if !matches!(runs.get(second), Some(RunState::Running { .. })) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(runs.get(second), Some(RunState::Failed("the second ran to its end".into())));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            runs.get(first),
            Some(RunState::Failed(replaced)),
            "not overwritten when it ends"
        );
    }

    fn compared(active: &str, candidate: &str) -> super::Compared {
        super::Compared {
            active_version: 3,
            active_text: active.into(),
            candidate_text: candidate.into(),
            done_ms: 0,
        }
    }

    /// The what-if an apply keeps is the newest finished one of that very text against the
    /// policy in effect: another candidate's, one against another active policy, a failed
    /// one or one still running is not it.
    #[test]
    fn an_apply_keeps_the_newest_finished_whatif_of_its_text() {
        use std::sync::Arc;

        use super::{FidelityRow, Runs, WhatIfResult};
        let result = |p95: f64, gap_jobs: u64| {
            let mut r = WhatIfResult {
                active: Default::default(),
                candidate: Default::default(),
                counts: Default::default(),
                jobs: 40,
                nodes: 2,
                gpus: 16,
                seed: 42,
                restart_delay_s: 0.0,
                added_active: Vec::new(),
                added_candidate: Vec::new(),
                wall_ms: 5,
                fidelity: vec![FidelityRow {
                    project: "all".into(),
                    jobs: 40,
                    preemptions: (10, 10 + gap_jobs),
                    ..Default::default()
                }],
            };
            r.active.queue_delay_s_p95 = 12.5;
            r.candidate.queue_delay_s_p95 = p95;
            r.candidate.allocated_gpu_hours = 1.2345;
            r.candidate.preemptions = 4;
            Ok(r)
        };
        let runs = Arc::new(Runs::default());
        let wait = |id: u64| {
            for _ in 0..500 {
                if !matches!(runs.get(id), Some(super::RunState::Running { .. })) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        let older =
            runs.start(40, compared("active", "cand"), move |_| result(30.0, 0)).expect("started");
        wait(older);
        let newer =
            runs.start(40, compared("active", "cand"), move |_| result(20.0, 3)).expect("started");
        wait(newer);
        let other =
            runs.start(40, compared("active", "other"), move |_| result(1.0, 0)).expect("started");
        wait(other);
        let failed = runs
            .start(40, compared("active", "bad"), |_| Err("no history".to_string()))
            .expect("started");
        wait(failed);

        let shown = runs.shown_for("active", "cand").expect("shown");
        assert_eq!(shown.run, newer);
        assert_eq!((shown.active_version, shown.jobs), (3, 40));
        assert_eq!(shown.active.wait_p95_ms, 12_500);
        assert_eq!(shown.candidate.wait_p95_ms, 20_000);
        assert_eq!(shown.candidate.allocated_milli_gpu_hours, 1_235);
        assert_eq!(shown.candidate.preemptions, 4);
        assert_eq!(shown.fidelity_gap_pct, Some(30), "3 pre-emptions more than 10 recorded");
        assert!(shown.at_ms > 0, "when it finished");
        assert!(runs.shown_for("another active", "cand").is_none());
        assert!(runs.shown_for("active", "bad").is_none(), "a failed what-if showed nothing");
        assert!(runs.shown_for("active", "never checked").is_none());
    }
}
