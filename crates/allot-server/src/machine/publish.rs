//! The view readers see and the gauges `/metrics` shows, published from the machine's state
//! after each turn (by whoever drives it). Readers never ask the machine for these: the API
//! and the dashboard read the `View`; a scrape only encodes the registry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;

use allot_api::WorkloadState;

use super::{Machine, records};
use crate::metrics::{
    ConditionLabel, DeviceLabels, Metrics, ProjectLabel, ReasonLabel, StateLabel,
};
use crate::view::View;

/// How often the readers' project and node views are rebuilt at most.
const VIEW_REFRESH_MS: u64 = 200;
/// Part of its share a device must have busy to count as active in `allot_active_gpus` (the
/// idle rules judge with their own thresholds).
pub(crate) const ACTIVE_PERMILLE: u16 = 100;

impl Machine {
    /// Publishes what changed: the changed workloads at once (readers see what was
    /// acknowledged before the acknowledgement arrives), everything else at most every
    /// `VIEW_REFRESH_MS` unless `force`.
    pub(crate) fn publish(
        &mut self,
        now: u64,
        force: bool,
        shared: &RwLock<View>,
        metrics: &Metrics,
    ) {
        let changed = std::mem::take(&mut self.daemon.changed);
        // A policy just applied is published whole at once: its answer goes out after this,
        // and the next read of /projects must show the new quota, not the old one.
        let policy_changed = self.view_policy != self.daemon.policy_text;
        let full =
            force || policy_changed || now.saturating_sub(self.last_view_ms) >= VIEW_REFRESH_MS;
        if changed.is_empty() && !full {
            return;
        }
        let Ok(mut view) = shared.write() else { return };
        if view.policy_text != self.daemon.policy_text
            || view.policy_versions.len() != self.daemon.policy_versions.len()
        {
            view.policy_text.clone_from(&self.daemon.policy_text);
            view.policy_source.clone_from(&self.daemon.policy_source);
            view.policy_versions =
                self.daemon.policy_versions.iter().map(records::policy_version).collect();
        }
        if policy_changed || full || view.rollout.is_none() != self.daemon.rollout.is_none() {
            view.rollout = self.daemon.rollout_view(now);
        }
        for &id in &changed {
            if let Some(r) = self.daemon.workloads.get(&id) {
                let new = records::workload(id, r);
                let fields = &mut *view;
                fields.dashboard.observe(&new, &r.steps);
                fields.workloads.insert(id, new);
            }
        }
        if !full {
            // Work placed, moved or ended: the node view must not lag the workloads (whoever
            // sees a run on a node sees that node as it is now).
            self.move_in_node_view(&mut view, &changed);
            return;
        }
        self.last_view_ms = now;
        if policy_changed {
            self.view_policy.clone_from(&self.daemon.policy_text);
        }
        self.rebuild_node_view(&mut view);
        let daemon = &self.daemon;
        let engine = &daemon.engine;
        view.projects = records::projects(engine, daemon.workloads.values());
        view.backend.reachable = daemon.backend_down.is_none();
        view.backend.unreachable_since_ms = daemon.backend_down.as_ref().map(|d| d.since_ms);
        view.backend.error = daemon.backend_down.as_ref().map(|d| d.error.clone());
        view.inventory_note.clone_from(&daemon.inventory_note);
        let fields = &mut *view;
        fields.telemetry_seen = daemon.counters.sampled > 0;
        let active = self.telemetry.active_shares(ACTIVE_PERMILLE);
        fields.dashboard.sample(now, || engine.cluster_snapshot(), &fields.workloads, active);
        drop(view);
        super::derived::refresh(shared, daemon, now);
        self.update_metrics(shared, metrics);
    }

    /// The node view between full rebuilds: of `ids` (changed workloads), those whose devices
    /// differ from what the view shows leave the devices they held and take those they hold
    /// now, and then each node's withheld state and unmanaged devices are set anew. A node
    /// list that changed since the last full rebuild is rebuilt whole.
    fn move_in_node_view(&mut self, view: &mut View, ids: &BTreeSet<u64>) {
        let daemon = &self.daemon;
        let mut index = None;
        let mut moves = Vec::new();
        for &id in ids {
            let now = match daemon.workloads.get(&id) {
                Some(r) if is_live(r.state) => {
                    let index = index.get_or_insert_with(|| records::node_index(&daemon.nodes));
                    records::held_by(&daemon.engine, index, id, r)
                }
                _ => Vec::new(),
            };
            if self.view_held.get(&id).map_or(!now.is_empty(), |held| *held != now) {
                moves.push((id, now));
            }
        }
        if moves.is_empty() {
            return;
        }
        if self.view_nodes_generation != Some(daemon.nodes_generation) {
            self.rebuild_node_view(view);
            return;
        }
        for (id, now) in moves {
            records::move_work(&mut view.nodes, &mut self.view_held, id, now);
        }
        records::mark_withheld(&mut view.nodes, &self.daemon.engine, &self.daemon.withheld_nodes());
    }

    /// Rebuilds the readers' node view whole: every node, what live work holds on it, and
    /// its withheld state.
    fn rebuild_node_view(&mut self, view: &mut View) {
        (view.nodes, self.view_held) = self.node_view(&self.daemon.withheld_nodes());
        if self.view_nodes_generation != Some(self.daemon.nodes_generation) {
            view.node_specs.clone_from(&self.daemon.nodes);
            self.view_nodes_generation = Some(self.daemon.nodes_generation);
        }
    }

    /// The node view as the daemon's state shows it now, with `withheld` nodes so marked,
    /// and what each live workload holds there.
    fn node_view(
        &self,
        withheld: &BTreeMap<String, String>,
    ) -> (Vec<allot_api::Node>, BTreeMap<u64, records::Held>) {
        let daemon = &self.daemon;
        let live = daemon.workloads.iter().filter(|(_, r)| is_live(r.state));
        records::nodes(&daemon.engine, &daemon.nodes, withheld, live)
    }

    /// Where the readers' node view shows other devices in use than the daemon holds now
    /// (for the simulation: the view may lag in its node list, withheld states and unmanaged
    /// devices until the next full rebuild, never in what allot's own work holds).
    pub(crate) fn node_view_lag(&self, view: &View) -> Option<String> {
        let (now, _) = self.node_view(&BTreeMap::new());
        let in_use = |nodes: &[allot_api::Node]| -> BTreeMap<(String, u32), (u64, Vec<u64>)> {
            nodes
                .iter()
                .flat_map(|n| n.devices.iter().map(move |d| (n, d)))
                .filter(|(_, d)| !d.workloads.is_empty() || d.used_shares > 0)
                .map(|(n, d)| ((n.name.clone(), d.index), (d.used_shares, d.workloads.clone())))
                .collect()
        };
        let (shown, held) = (in_use(&view.nodes), in_use(&now));
        (shown != held).then(|| format!("shown {shown:?}, held {held:?}"))
    }

    fn update_metrics(&self, view: &RwLock<View>, m: &Metrics) {
        let Ok(view) = view.read() else { return };
        for p in &view.projects {
            let label = ProjectLabel { project: p.name.clone() };
            let used: f64 = p.quota.iter().map(|q| q.used_gpus).sum();
            m.allocated_gpus.get_or_create(&label).set(used);
            m.queue_length.get_or_create(&label).set(p.pending as i64);
        }
        for n in &view.nodes {
            for d in &n.devices {
                m.device_allocated
                    .get_or_create(&DeviceLabels {
                        node: n.name.clone(),
                        device: d.index.to_string(),
                        model: d.model.clone(),
                    })
                    .set(d.used_shares as f64 / 1000.0);
            }
        }
        let mut by_state: BTreeMap<&str, i64> = BTreeMap::new();
        let mut by_reason: BTreeMap<String, i64> = BTreeMap::new();
        let mut idle: BTreeMap<String, f64> = BTreeMap::new();
        for r in self.daemon.workloads.values() {
            *by_state.entry(r.state.as_str()).or_default() += 1;
            let code = r.reason.as_ref().map(|(c, _)| c.clone()).unwrap_or_default();
            if r.state == WorkloadState::Pending {
                *by_reason.entry(code).or_default() += 1;
            } else if r.state == WorkloadState::Running && code == "idle_warning" {
                *idle.entry(r.spec.project.clone()).or_default() +=
                    r.spec.total_shares().0 as f64 / 1000.0;
            }
        }
        for state in [
            "pending",
            "starting",
            "running",
            "stopping",
            "suspended",
            "succeeded",
            "failed",
            "cancelled",
            "rejected",
        ] {
            m.workloads_by_state
                .get_or_create(&StateLabel { state: state.into() })
                .set(*by_state.get(state).unwrap_or(&0));
        }
        m.pending_by_reason.clear();
        for (reason, n) in by_reason {
            m.pending_by_reason.get_or_create(&ReasonLabel { reason }).set(n);
        }
        for p in &view.projects {
            m.idle_gpus
                .get_or_create(&ProjectLabel { project: p.name.clone() })
                .set(*idle.get(&p.name).unwrap_or(&0.0));
        }
        m.backend_up.set(i64::from(self.daemon.backend_down.is_none()));
        m.rollout_rollbacks.set(self.daemon.counters.rollbacks as i64);
        m.rollout_condition.clear();
        let live = view.rollout.as_ref().filter(|r| r.ended.is_none());
        m.rollout_active.set(i64::from(live.is_some()));
        if let Some(r) = live {
            for c in &r.conditions {
                let label =
                    ConditionLabel { scope: r.scope.clone(), condition: c.condition.clone() };
                m.rollout_condition.get_or_create(&label).set(c.current.unwrap_or(0.0));
            }
        }
        for (reason, n) in &self.daemon.counters.preemptions {
            m.preemptions.get_or_create(&ReasonLabel { reason: reason.clone() }).set(*n as i64);
        }
        // Active: allocated GPUs whose last reading shows at least ACTIVE_PERMILLE of the share
        // busy; only workloads with telemetry count (the rest is neither active nor idle).
        let mut active: BTreeMap<String, f64> = BTreeMap::new();
        let mut measured: BTreeMap<String, f64> = BTreeMap::new();
        for (id, readings) in &self.telemetry.readings {
            let Some(r) = self.daemon.workloads.get(id) else { continue };
            for reading in readings {
                let gpus = f64::from(reading.shares) / 1000.0;
                *measured.entry(r.spec.project.clone()).or_default() += gpus;
                if super::attribution::busy(reading, ACTIVE_PERMILLE) {
                    *active.entry(r.spec.project.clone()).or_default() += gpus;
                }
            }
        }
        for p in &view.projects {
            let label = ProjectLabel { project: p.name.clone() };
            m.active_gpus.get_or_create(&label).set(*active.get(&p.name).unwrap_or(&0.0));
            m.measured_gpus.get_or_create(&label).set(*measured.get(&p.name).unwrap_or(&0.0));
        }
        m.device_activity.clear();
        for s in self.telemetry.samples.values() {
            if let (Some(host), Some(index), Some(v)) =
                (&s.identity.hostname, s.identity.gpu_index, s.signal_value())
            {
                m.device_activity
                    .get_or_create(&DeviceLabels {
                        node: host.clone(),
                        device: index.to_string(),
                        model: s.identity.model.clone().unwrap_or_default(),
                    })
                    .set(f64::from(v) / 1000.0);
            }
        }
    }
}

/// Whether work in `state` holds devices (the node view lists it).
fn is_live(state: WorkloadState) -> bool {
    matches!(state, WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping)
}
