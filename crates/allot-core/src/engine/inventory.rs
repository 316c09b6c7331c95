//! The inventory changing under live work: a node added, removed, relabelled or given other
//! devices is an input like any other, never a reason to stop governing the cluster.
//!
//! `inventory_change` decides which shape of each node the engine takes: the reported one,
//! unless live work holds devices there that the reported shape changes or lacks (or the node
//! is gone from the report): then the node keeps the shape its work was placed on until that
//! work ends, and the caller should keep it out of new placements. `with_inventory` carries
//! the live work into an engine over the result (`carry_over`, the same path as a policy
//! change, with idle timers kept: the rules did not change).

use std::collections::{BTreeMap, BTreeSet};

use super::Engine;
use super::state::{CarryIdle, StateError};
use crate::ids::WorkloadId;
use crate::model::{NodeSpec, PolicySpec};

/// The engine's nodes after an inventory report, and how they differ from before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InventoryChange {
    /// The nodes to build the engine over: the reported ones in their order, then nodes gone
    /// from the report that live work still holds.
    pub nodes: Vec<NodeSpec>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Nodes whose reported shape (devices, CPU, memory, labels, pool, rack) was taken.
    pub changed: Vec<String>,
    /// Nodes kept in their old shape while live work holds them, with why: the report drops
    /// them or changes devices their work holds. Report them again once the work ended.
    pub kept: Vec<(String, String)>,
}

impl InventoryChange {
    /// Nothing changes for the engine.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// What live work holds on one node: per device index the shares, and the CPU and memory.
#[derive(Default)]
struct Held {
    devices: BTreeSet<usize>,
    cpu_millis: u64,
    memory_mib: u64,
    workloads: BTreeSet<WorkloadId>,
}

impl Engine {
    /// How `reported` (the backend's inventory now) becomes the engine's nodes, given the
    /// nodes it has (`current`, as the caller built it). Pure: nothing changes.
    pub fn inventory_change(&self, current: &[NodeSpec], reported: &[NodeSpec]) -> InventoryChange {
        let mut held: BTreeMap<&str, Held> = BTreeMap::new();
        for (id, w) in &self.workloads {
            let Some(a) = &w.allocation else { continue };
            for member in &a.placement.members {
                let h = held.entry(self.node_name(member.node)).or_default();
                h.devices.extend(member.devices.iter().map(|d| usize::from(d.device)));
                h.cpu_millis = h.cpu_millis.saturating_add(w.spec.cpu_millis_per_member);
                h.memory_mib = h.memory_mib.saturating_add(w.spec.memory_mib_per_member);
                h.workloads.insert(*id);
            }
        }
        let holders = |h: &Held| {
            let ids: Vec<String> = h.workloads.iter().take(3).map(|w| w.0.to_string()).collect();
            let more = h.workloads.len().saturating_sub(3);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("workload {}{more}", ids.join(", "))
        };
        let old: BTreeMap<&str, &NodeSpec> = current.iter().map(|n| (n.name.as_str(), n)).collect();
        let new_names: BTreeSet<&str> = reported.iter().map(|n| n.name.as_str()).collect();
        let mut change = InventoryChange::default();
        for node in reported {
            let Some(before) = old.get(node.name.as_str()) else {
                change.added.push(node.name.clone());
                change.nodes.push(node.clone());
                continue;
            };
            if *before == node {
                change.nodes.push(node.clone());
                continue;
            }
            match held.get(node.name.as_str()) {
                Some(h) if !holds_still(before, node, h) => {
                    change.kept.push((
                        node.name.clone(),
                        format!(
                            "its devices changed in the inventory; the new shape applies once \
                             {} no longer runs there",
                            holders(h)
                        ),
                    ));
                    change.nodes.push((*before).clone());
                }
                _ => {
                    change.changed.push(node.name.clone());
                    change.nodes.push(node.clone());
                }
            }
        }
        for node in current.iter().filter(|n| !new_names.contains(n.name.as_str())) {
            match held.get(node.name.as_str()) {
                Some(h) => {
                    change.kept.push((
                        node.name.clone(),
                        format!("no longer in the inventory; kept while {} runs there", holders(h)),
                    ));
                    change.nodes.push(node.clone());
                }
                None => change.removed.push(node.name.clone()),
            }
        }
        change
    }

    /// This engine's live work carried into an engine over `change.nodes` (from
    /// [`Engine::inventory_change`]) under the same `policy`: every allocation keeps its
    /// devices (nodes are matched by name), pending work its queue place, idle timers,
    /// backoffs and fair-share usage run on, unavailable nodes stay unavailable.
    pub fn with_inventory(
        &self,
        change: &InventoryChange,
        policy: &PolicySpec,
    ) -> Result<Engine, StateError> {
        self.carry_over(&change.nodes, policy, CarryIdle::Keep)
    }
}

/// Whether the reported shape of a node still holds what live work has there: the same model
/// (and MIG mode) on every device it uses, and enough CPU and memory.
fn holds_still(before: &NodeSpec, after: &NodeSpec, held: &Held) -> bool {
    held.devices.iter().all(|&i| match (before.devices.get(i), after.devices.get(i)) {
        (Some(b), Some(a)) => a.model == b.model && a.mig == b.mig,
        _ => false,
    }) && after.cpu_millis >= held.cpu_millis
        && after.memory_mib >= held.memory_mib
}
