//! The daemon's workloads as a job trace (`GET /api/v1/history`, `allot history export`) and
//! its inventory as a cluster file, for what-ifs (`whatif.rs`) and `allot sim replay`.
//!
//! Durations (`HistoryJob::duration_basis`): ended work its last run's time (start to end);
//! running work the time so far, a lower bound; pending (and suspended) work its max runtime,
//! else the median run time of its project's ended work, else it is left out and counted.
//! Work that never ran and has ended (cancelled while queued, rejected) is left out and counted.
//! A MIG request becomes a share of one GPU equal to the instance's compute share (the trace
//! format has no MIG profiles). The daemon records reported checkpoints, not an interval, so
//! no job carries one: a replay treats them as not checkpointing unless `--checkpoint-every`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use allot_api::{DurationBasis, HistoryCounts, HistoryExport, HistoryJob, WorkloadState, limits};
use allot_core::{GpuRequest, NodeSpec};

use super::daemon::{Daemon, Record};

/// What the daemon's books say happened to workload `id`.
fn recorded(daemon: &Daemon, id: u64, r: &Record) -> allot_api::RecordedOutcome {
    let books =
        daemon.ledger.total(&allot_core::ledger::Scope::Workload(allot_core::WorkloadId(id)));
    allot_api::RecordedOutcome {
        queue_delay_s: r.first_admitted_ms.map(|at| seconds(at.saturating_sub(r.submitted_ms))),
        allocated_gpu_hours: allot_core::ledger::Books::gpu_hours(books.allocated),
        preemptions: books.preemptions,
    }
}

/// The daemon's workloads (the newest `limit`) as a job trace, with its inventory and policy.
/// Called on the main loop: one pass over the records, no I/O.
pub(crate) fn export(daemon: &Daemon, now_ms: u64, limit: usize) -> HistoryExport {
    let limit = limit.min(limits::HISTORY_JOBS_MAX);
    let run_ms = |r: &Record| match (r.started_ms, r.ended_ms) {
        (Some(s), Some(e)) => Some(e.saturating_sub(s)),
        _ => None,
    };
    // Median run time of each project's ended work, for pending work without a max runtime.
    let mut runs: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in daemon.workloads.values() {
        if is_ended(r.state)
            && let Some(ms) = run_ms(r)
        {
            runs.entry(r.spec.project.as_str()).or_default().push(ms);
        }
    }
    let medians: BTreeMap<&str, u64> = runs
        .into_iter()
        .map(|(p, mut v)| {
            v.sort_unstable();
            (p, v[v.len() / 2])
        })
        .collect();

    let mut counts = HistoryCounts::default();
    let total = daemon.workloads.len();
    counts.older_left_out = total.saturating_sub(limit);
    // Ids are given in submission order: the newest are the last.
    let newest = daemon.workloads.iter().skip(counts.older_left_out);
    let mut rows = Vec::with_capacity(total.min(limit));
    for (&id, r) in newest {
        let (duration_ms, basis) = match r.state {
            s if is_ended(s) => match run_ms(r) {
                Some(ms) => (ms, DurationBasis::Ran),
                None => {
                    counts.never_ran += 1;
                    continue;
                }
            },
            WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping => {
                let started = r.started_ms.unwrap_or(now_ms);
                (now_ms.saturating_sub(started), DurationBasis::ElapsedLowerBound)
            }
            _ => match (r.spec.max_runtime_ms, medians.get(r.spec.project.as_str())) {
                (Some(max), _) => (max, DurationBasis::MaxRuntime),
                (None, Some(&median)) => (median, DurationBasis::ProjectMedian),
                (None, None) => {
                    counts.pending_skipped += 1;
                    continue;
                }
            },
        };
        match basis {
            DurationBasis::Ran => counts.ended += 1,
            DurationBasis::ElapsedLowerBound => counts.running += 1,
            DurationBasis::MaxRuntime | DurationBasis::ProjectMedian => {
                counts.pending_estimated += 1;
            }
        }
        rows.push((id, r, duration_ms, basis));
    }
    let first = rows.iter().map(|(_, r, _, _)| r.submitted_ms).min();
    let jobs = rows
        .into_iter()
        .map(|(id, r, duration_ms, basis)| {
            let (gpus, gpu_milli) = match r.spec.gpus_per_member {
                GpuRequest::Whole(n) => (n, 1000),
                GpuRequest::Shares(s) => (1, s),
                GpuRequest::Mig(p) => (1, p.shares().0.clamp(1, 1000) as u32),
            };
            HistoryJob {
                id,
                name: r.spec.name.clone(),
                state: r.state,
                submit_s: seconds(r.submitted_ms.saturating_sub(first.unwrap_or(0))),
                duration_s: seconds(duration_ms.min(limits::DURATION_S_MAX * 1000)),
                duration_basis: basis,
                project: r.spec.project.clone(),
                kind: r.spec.kind.as_str().to_string(),
                gpus,
                gpu_milli,
                members: r.spec.members,
                gpu_models: r.spec.gpu_models.clone(),
                priority_class: r.spec.priority_class.clone(),
                checkpoint_interval_s: None,
                cpu_milli: r.spec.cpu_millis_per_member,
                memory_mib: r.spec.memory_mib_per_member,
                recorded: Some(recorded(daemon, id, r)),
            }
        })
        .collect();
    HistoryExport {
        exported_ms: now_ms,
        first_submit_ms: first,
        jobs,
        counts,
        cluster_yaml: cluster_yaml(&daemon.nodes),
        policy_source: daemon.policy_source.clone(),
        policy_text: daemon.policy_text.clone(),
        startup_delay_s: {
            let books = daemon.ledger.total(&allot_core::ledger::Scope::Cluster);
            (books.starts > 0).then(|| books.startup_delay_ms as f64 / books.starts as f64 / 1000.0)
        },
        decide_interval_s: None,
    }
}

fn is_ended(state: WorkloadState) -> bool {
    matches!(
        state,
        WorkloadState::Succeeded
            | WorkloadState::Failed
            | WorkloadState::Cancelled
            | WorkloadState::Rejected
    )
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// The nodes as a cluster file that `allot_config::parse_cluster` (`allot sim replay
/// --cluster`) reads back as the same nodes: one entry per node, one GPU group per device.
pub fn cluster_yaml(nodes: &[NodeSpec]) -> String {
    // JSON strings are YAML double-quoted scalars: names and labels need no escaping rules here.
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string());
    let mut out = String::from(
        "# The daemon's inventory, exported by allot (`allot history export --cluster-output`).\n",
    );
    if nodes.is_empty() {
        out.push_str("nodes: []\n");
        return out;
    }
    out.push_str("nodes:\n");
    for n in nodes {
        let _ = writeln!(out, "  - name: {}", q(&n.name));
        let _ = writeln!(out, "    cpu: {}m", n.cpu_millis);
        let _ = writeln!(out, "    memory: {}", n.memory_mib);
        if let Some(pool) = &n.pool {
            let _ = writeln!(out, "    pool: {}", q(pool));
        }
        if let Some(rack) = &n.rack {
            let _ = writeln!(out, "    rack: {}", q(rack));
        }
        let labels: Vec<String> = n
            .labels
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "pool" | "rack"))
            .map(|(k, v)| format!("{}: {}", q(k), q(v)))
            .collect();
        if !labels.is_empty() {
            let _ = writeln!(out, "    labels: {{{}}}", labels.join(", "));
        }
        if !n.devices.is_empty() {
            out.push_str("    gpus:\n");
            for d in &n.devices {
                let _ = write!(
                    out,
                    "      - {{model: {}, count: 1, memory: {}, island: {}",
                    q(&d.model),
                    d.memory_mib,
                    d.island
                );
                out.push_str(if d.mig { ", mig: true}\n" } else { "}\n" });
            }
        }
    }
    out
}
