//! `Engine::audit`'s MIG part: the slot state of every MIG-enabled device is exactly what its
//! allocations' instances make it, and no device mixes MIG instances with other requests.

use std::collections::BTreeMap;

use crate::decision::MigSlot;
use crate::engine::Engine;
use crate::mig::MigState;

impl Engine {
    /// Recomputes every device's MIG instances from the allocations and compares them with the
    /// capacity's slot state; checks each instance's charge and that a device holding
    /// instances holds nothing else. Part of `audit`.
    pub(crate) fn audit_mig(&self) -> Result<(), String> {
        // (node, device) → (instances, other shares held).
        let mut held: BTreeMap<(usize, usize), (Vec<MigSlot>, u64)> = BTreeMap::new();
        for (id, w) in &self.workloads {
            let Some(a) = &w.allocation else { continue };
            for m in &a.placement.members {
                for d in &m.devices {
                    let entry = held.entry((m.node.0 as usize, d.device as usize)).or_default();
                    match d.mig {
                        Some(slot) => {
                            if u64::from(d.shares) != slot.profile.shares().0 {
                                return Err(format!(
                                    "{id} holds MIG instance {slot} charged {} shares",
                                    d.shares
                                ));
                            }
                            entry.0.push(slot);
                        }
                        None => entry.1 += u64::from(d.shares),
                    }
                }
            }
        }
        for (n, node) in self.capacity.nodes.iter().enumerate() {
            for (d, dev) in node.devices.iter().enumerate() {
                let (slots, other) = held.remove(&(n, d)).unwrap_or_default();
                let where_ = format!("node {} device {d}", self.node_names[n]);
                let Some(mig) = &dev.mig else {
                    if !slots.is_empty() {
                        return Err(format!("{where_}: MIG instances on a device without MIG"));
                    }
                    continue;
                };
                if !slots.is_empty() && other > 0 {
                    return Err(format!("{where_}: MIG instances and {other} other shares"));
                }
                let mut expect = MigState::new(mig.state.gpu());
                for slot in &slots {
                    if !expect.occupy(slot.profile, slot.start) {
                        return Err(format!("{where_}: instance {slot} overlaps another"));
                    }
                }
                if expect != mig.state {
                    return Err(format!(
                        "{where_}: slot state {:?} but allocations hold {slots:?}",
                        mig.state
                    ));
                }
            }
        }
        self.capacity.check_mig_index()
    }
}
