//! The cluster's shape and reachability under a live log. The inventory may change while
//! work runs (a node's labels or devices change, a node is added or removed) and the backend
//! may stop answering for a while: both are entries the engine is told of, never a reason to
//! refuse a start or to fail work.
//!
//! Which nodes take no new work is decided in one place (`sync_availability`): a node is
//! withheld while the backend is unreachable, while the backend reports it down or drained
//! (`Entry::NodeState`), or while it keeps an old shape for live work
//! (`InventoryChange::kept`), with the first of those reasons.

use std::collections::BTreeMap;

use allot_core::{Event, NodeId, NodeSpec};

use super::daemon::Daemon;
use super::wire::{Unreachable, saved};

impl Daemon {
    /// `Entry::InventoryReported`: the backend's inventory now. Taken as far as live work
    /// allows; nodes kept in an old shape are looked at again as work ends.
    pub(crate) fn inventory_reported(&mut self, now: u64, nodes: Vec<NodeSpec>) {
        self.reported_nodes = Some(nodes);
        self.take_inventory(now);
    }

    /// Moves the engine to the reported inventory where live work allows (a function of the
    /// state alone, so a replay moves at the same points).
    pub(crate) fn take_inventory(&mut self, now: u64) {
        let Some(reported) = self.reported_nodes.take() else { return };
        let change = self.engine.inventory_change(&self.nodes, &reported);
        if !change.is_empty() {
            match self.engine.with_inventory(&change, &self.policy) {
                Ok(engine) => {
                    self.engine = engine;
                    self.nodes = change.nodes.clone();
                    self.nodes_generation += 1;
                    self.known = super::daemon::known(&self.nodes, &self.policy);
                    self.inventory_note = Some(change_note(&change));
                    self.changed.extend(self.workloads.keys().copied());
                    self.dirty = true;
                }
                // `inventory_change` keeps every node live work holds, so the carry-over
                // cannot miss one; if it fails anyway the engine stays as it was.
                Err(e) => self.inventory_note = Some(format!("not taken: {e}")),
            }
        }
        self.kept_nodes = change.kept.into_iter().collect();
        // Nodes still kept in an old shape wait for their work: look again later.
        if !self.kept_nodes.is_empty() {
            self.reported_nodes = Some(reported);
        }
        self.sync_availability(now);
    }

    /// The entry that tells the engine of `nodes` (the backend's inventory now), when it
    /// differs from the last one taken or reported.
    pub(crate) fn inventory_entry(&self, nodes: &[NodeSpec]) -> Option<super::entry::Entry> {
        let latest = self.reported_nodes.as_deref().unwrap_or(&self.nodes);
        (latest != nodes).then(|| super::entry::Entry::InventoryReported { nodes: saved(nodes) })
    }

    /// `Entry::BackendUnreachable` / `Entry::BackendReachable`.
    pub(crate) fn backend_health(&mut self, now: u64, unreachable: Option<&str>) {
        self.backend_down = unreachable.map(|error| Unreachable {
            since_ms: self.backend_down.as_ref().map_or(now, |d| d.since_ms),
            error: error.to_string(),
        });
        self.sync_availability(now);
        self.dirty = true;
    }

    /// Why a node takes no new work now, if it does not.
    pub(crate) fn withheld_reason(&self, node: &str) -> Option<String> {
        if let Some(down) = &self.backend_down {
            return Some(format!(
                "the backend is unreachable since {} ({}); new work waits, running work runs on",
                crate::views::utc(down.since_ms),
                down.error
            ));
        }
        if let Some(reason) = self.unusable_nodes.get(node) {
            return Some(reason.clone());
        }
        self.kept_nodes.get(node).cloned()
    }

    /// Every node that takes no new work now, with why.
    pub(crate) fn withheld_nodes(&self) -> BTreeMap<String, String> {
        self.nodes
            .iter()
            .filter_map(|n| Some((n.name.clone(), self.withheld_reason(&n.name)?)))
            .collect()
    }

    /// Tells the engine which nodes take no new work, and why, where that changed.
    pub(crate) fn sync_availability(&mut self, now: u64) {
        let engine_has: BTreeMap<String, String> = self
            .engine
            .unavailable_nodes()
            .map(|(n, reason)| (self.engine.node_name(n).to_string(), reason.to_string()))
            .collect();
        for index in 0..self.nodes.len() {
            let name = self.nodes[index].name.clone();
            let node = NodeId(index as u32);
            match (self.withheld_reason(&name), engine_has.get(&name)) {
                (Some(reason), had) if had != Some(&reason) => {
                    self.event(now, Event::NodeUnavailable { node, reason });
                }
                (None, Some(_)) => self.event(now, Event::NodeAvailable { node }),
                _ => {}
            }
        }
    }
}

/// One line for the operator: what an inventory change did.
fn change_note(change: &allot_core::InventoryChange) -> String {
    let mut parts = Vec::new();
    for (what, names) in
        [("added", &change.added), ("removed", &change.removed), ("changed", &change.changed)]
    {
        if !names.is_empty() {
            parts.push(format!("{what} {}", names.join(", ")));
        }
    }
    for (name, why) in &change.kept {
        parts.push(format!("{name} kept: {why}"));
    }
    parts.join("; ")
}
