//! The view readers see and the gauges `/metrics` shows, published from the machine's state
//! after each turn (by whoever drives it). Readers never ask the machine for these: the API
//! and the dashboard read the `View`; a scrape only encodes the registry.

use std::collections::BTreeMap;
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
        // Whether work was placed, moved or ended: the node view must not lag the workloads
        // (a reader who sees a run on a node sees that node as it is now).
        let mut placed = false;
        for id in changed {
            if let Some(r) = self.daemon.workloads.get(&id) {
                let new = records::workload(id, r);
                let fields = &mut *view;
                placed |= fields.workloads.get(&id).is_none_or(|old| {
                    (is_live(old.state) || is_live(new.state))
                        && (old.state != new.state || old.placement != new.placement)
                });
                fields.dashboard.observe(&new, &r.steps);
                fields.workloads.insert(id, new);
            }
        }
        if !full {
            if placed {
                view.nodes = self.nodes_view();
            }
            return;
        }
        self.last_view_ms = now;
        if policy_changed {
            self.view_policy.clone_from(&self.daemon.policy_text);
        }
        let daemon = &self.daemon;
        let engine = &daemon.engine;
        view.projects = records::projects(engine, daemon.workloads.values());
        view.nodes = self.nodes_view();
        if view.node_specs != daemon.nodes {
            view.node_specs.clone_from(&daemon.nodes);
        }
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

    /// The readers' node view: devices, what runs there, what is withheld and occupied.
    fn nodes_view(&self) -> Vec<allot_api::Node> {
        let daemon = &self.daemon;
        let live = daemon.workloads.iter().filter(|(_, r)| is_live(r.state));
        let withheld: BTreeMap<String, String> = daemon
            .nodes
            .iter()
            .filter_map(|n| Some((n.name.clone(), daemon.withheld_reason(&n.name)?)))
            .collect();
        records::nodes(&daemon.engine, &daemon.nodes, &withheld, live)
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

/// Whether work in `state` holds devices (its node view lists it).
fn is_live(state: WorkloadState) -> bool {
    matches!(state, WorkloadState::Starting | WorkloadState::Running | WorkloadState::Stopping)
}
