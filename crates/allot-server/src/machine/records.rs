//! The daemon's records as the API shows them: workloads, projects, nodes and the ledger as
//! `allot-api` types.

use allot_api::{BorrowWithinCohortView, Device, LedgerRow, Node, Project, QuotaLine, Workload};
use allot_core::ledger::{Books, Ledger, Scope};
use allot_core::{Engine, ProjectId, Shares, Timestamp, WithinProject};

use super::daemon::Record;
use super::submit::gpus_text;

pub(crate) fn workload(id: u64, r: &Record) -> Workload {
    Workload {
        id,
        name: r.spec.name.clone(),
        project: r.spec.project.clone(),
        user: r.spec.user.clone(),
        kind: r.spec.kind.as_str().to_string(),
        state: r.state,
        gpus: gpus_text(&r.spec.gpus_per_member),
        members: r.spec.members,
        command: r.request.command.clone(),
        submitted_ms: r.submitted_ms,
        started_ms: r.started_ms,
        ended_ms: r.ended_ms,
        exit_code: r.exit_code,
        attempt: r.attempt,
        reason: r.reason.as_ref().map(|(_, text)| text.clone()),
        reason_code: r.reason.as_ref().map(|(code, _)| code.clone()),
        // Pending again (requeued, resumed) or suspended, it holds no devices: the last run's
        // placement is history, not where it runs (its `started_ms` stays that run's start).
        placement: match r.state {
            allot_api::WorkloadState::Pending | allot_api::WorkloadState::Suspended => Vec::new(),
            _ => r.placement.clone(),
        },
        pids: r.pids.clone(),
        last_checkpoint_ms: r.last_checkpoint_ms,
        last_activity_ms: r.last_activity_ms,
    }
}

pub(crate) fn projects<'a>(
    engine: &Engine,
    records: impl Iterator<Item = &'a Record>,
) -> Vec<Project> {
    let mut counts = vec![(0u64, 0u64); engine.project_count()];
    for r in records {
        if let Some(p) = engine.project_id(&r.spec.project) {
            let c = &mut counts[p.0 as usize];
            match r.state {
                allot_api::WorkloadState::Pending => c.0 += 1,
                allot_api::WorkloadState::Starting
                | allot_api::WorkloadState::Running
                | allot_api::WorkloadState::Stopping => c.1 += 1,
                _ => {}
            }
        }
    }
    (0..engine.project_count())
        .map(|p| {
            let id = ProjectId(p as u32);
            let rules = engine.project_preemption_rules(id);
            Project {
                name: engine.project_name(id).to_string(),
                cohort: engine.project_declared_cohort(id).map(str::to_string),
                department: engine.project_department(id).map(str::to_string),
                quota: engine
                    .project_lines(id)
                    .into_iter()
                    .map(|(k, used, g, b, l)| QuotaLine {
                        model: engine.key_name(k).to_string(),
                        used_gpus: used.as_gpus(),
                        guaranteed_gpus: g.as_gpus(),
                        borrow_limit_gpus: b.map(Shares::as_gpus),
                        lend_limit_gpus: l.map(Shares::as_gpus),
                    })
                    .collect(),
                pending: counts[p].0,
                running: counts[p].1,
                preempt_within_project: rules
                    .map_or(WithinProject::default(), |r| r.0)
                    .as_str()
                    .to_string(),
                borrow_within_cohort: rules.and_then(|r| r.1).map(|b| BorrowWithinCohortView {
                    max_priority_threshold: b.max_priority_threshold,
                }),
            }
        })
        .collect()
}

/// A policy of the daemon's history as the API shows it.
pub(crate) fn policy_version(v: &super::daemon::PolicyVersion) -> allot_api::PolicyVersion {
    allot_api::PolicyVersion {
        version: v.version,
        at_ms: v.at_ms,
        source: v.source.clone(),
        by: v.by.clone(),
        rollback_of: v.rollback_of,
        text: v.text.clone(),
        scope: v.scope.clone(),
        why: v.why.clone(),
        whatif: v.whatif.clone(),
    }
}

/// What one live workload holds in the node view: (node index, device index, shares).
pub(crate) type Held = Vec<(usize, usize, u64)>;

/// Nodes and devices with what runs on them (the devices the backend bound where it picked
/// them itself, Slurm's GRES indices, `Record::devices`; else the engine's placement), and
/// what each live workload holds there, for [`move_work`] to undo.
pub(crate) fn nodes<'a>(
    engine: &Engine,
    nodes: &[allot_core::NodeSpec],
    unusable: &std::collections::BTreeMap<String, String>,
    records: impl Iterator<Item = (&'a u64, &'a Record)>,
) -> (Vec<Node>, std::collections::BTreeMap<u64, Held>) {
    let mut out: Vec<Node> = nodes
        .iter()
        .map(|n| Node {
            unusable: None,
            unmanaged: None,
            name: n.name.clone(),
            devices: n
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| Device {
                    index: i as u32,
                    model: d.model.clone(),
                    used_shares: 0,
                    workloads: Vec::new(),
                })
                .collect(),
        })
        .collect();
    mark_withheld(&mut out, engine, unusable);
    let index = node_index(nodes);
    let mut held = std::collections::BTreeMap::new();
    for (id, record) in records {
        let h = held_by(engine, &index, *id, record);
        for &(node, device, shares) in &h {
            let Some(dev) = out.get_mut(node).and_then(|n| n.devices.get_mut(device)) else {
                continue;
            };
            dev.used_shares += shares;
            // Records come in id order: the list stays sorted.
            if dev.workloads.last() != Some(id) {
                dev.workloads.push(*id);
            }
        }
        if !h.is_empty() {
            held.insert(*id, h);
        }
    }
    (out, held)
}

/// Node name → its index in the view.
pub(crate) fn node_index(
    nodes: &[allot_core::NodeSpec],
) -> std::collections::BTreeMap<&str, usize> {
    nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect()
}

/// What `record` holds now (nothing unless it is live and placed).
pub(crate) fn held_by(
    engine: &Engine,
    index: &std::collections::BTreeMap<&str, usize>,
    id: u64,
    record: &Record,
) -> Held {
    let mut held = Vec::new();
    let Some(placement) = engine.placement(allot_core::WorkloadId(id)) else { return held };
    if let Some(bound) = &record.devices {
        for m in bound {
            let Some(&node) = index.get(m.node.as_str()) else { continue };
            held.extend(m.devices.iter().map(|d| (node, d.index as usize, d.shares)));
        }
    } else {
        for m in &placement.members {
            let node = m.node.0 as usize;
            held.extend(
                m.devices.iter().map(|d| (node, usize::from(d.device), u64::from(d.shares))),
            );
        }
    }
    held
}

/// Moves `id` in the node view from what it held (in `held`) to `now`: the view changes for
/// the devices it left and entered alone. Devices the view lacks are skipped, as in [`nodes`].
pub(crate) fn move_work(
    view: &mut [Node],
    held: &mut std::collections::BTreeMap<u64, Held>,
    id: u64,
    now: Held,
) {
    for (node, d, shares) in held.remove(&id).unwrap_or_default() {
        if let Some(dev) = view.get_mut(node).and_then(|n| n.devices.get_mut(d)) {
            dev.used_shares = dev.used_shares.saturating_sub(shares);
            dev.workloads.retain(|w| *w != id);
        }
    }
    for &(node, d, shares) in &now {
        if let Some(dev) = view.get_mut(node).and_then(|n| n.devices.get_mut(d)) {
            dev.used_shares += shares;
            if let Err(at) = dev.workloads.binary_search(&id) {
                dev.workloads.insert(at, id);
            }
        }
    }
    if !now.is_empty() {
        held.insert(id, now);
    }
}

/// Sets each node's `unusable` reason and the devices work allot does not govern holds.
pub(crate) fn mark_withheld(
    view: &mut [Node],
    engine: &Engine,
    unusable: &std::collections::BTreeMap<String, String>,
) {
    for n in view.iter_mut() {
        n.unusable = unusable.get(&n.name).cloned();
        n.unmanaged = None;
    }
    for (node, occupied) in engine.occupied_devices() {
        if let Some(n) = view.get_mut(node.0 as usize) {
            n.unmanaged = Some(allot_api::UnmanagedDevices {
                devices: occupied.devices.iter().map(|&d| u32::from(d)).collect(),
                by: occupied.by.clone(),
            });
        }
    }
}

fn ledger_row(scope: String, b: &Books) -> LedgerRow {
    let hours = |v: u128| Books::gpu_hours(v);
    LedgerRow {
        scope,
        allocated_gpu_hours: hours(b.allocated),
        active_gpu_hours: hours(b.active),
        measured_gpu_hours: hours(b.measured),
        idle_allocated_gpu_hours: hours(b.idle_allocated()),
        lost_gpu_hours: hours(b.lost_to_preemption),
        useful_gpu_hours: hours(b.useful()),
        goodput: (b.allocated > 0).then(|| b.goodput()),
        unmanaged_gpu_hours: hours(b.unmanaged),
    }
}

/// The ledger's totals per scope (cluster first, then projects, users, workloads) as of `now`:
/// open books are closed on a copy.
pub(crate) fn report(ledger: &Ledger, now: u64) -> Vec<LedgerRow> {
    let mut closed = ledger.clone();
    closed.close(Timestamp(now));
    closed
        .scopes()
        .into_iter()
        .map(|scope| {
            let name = match &scope {
                Scope::Cluster => "cluster".to_string(),
                Scope::Project(p) => format!("project:{p}"),
                Scope::User(u) => format!("user:{u}"),
                Scope::Workload(w) => format!("workload:{}", w.0),
            };
            ledger_row(name, &closed.total(&scope))
        })
        .collect()
}
