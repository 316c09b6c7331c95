//! Read-outs of the whole state, recomputed from scratch: `audit`, the invariants every
//! cycle relies on (ARCHITECTURE.md, "Invariants"), and `cluster_snapshot`, the ledger's
//! capacity, allocated, free and fragmented shares.

use std::collections::{BTreeMap, BTreeSet};

use super::book::adjust_line_total;
use super::{Engine, Stage};
use crate::capacity::MemberShape;
use crate::decision::QuotaKey;
use crate::ids::{ModelId, NodeId, ProjectId, SHARES_PER_GPU, Shares};
use crate::model::GpuRequest;
use crate::quota::QuotaBook;

impl Engine {
    /// Checks the invariants every cycle relies on, recomputing them from the allocations:
    /// no device share or CPU held twice (free + withheld + held = capacity on every device
    /// and node; nothing free on an unavailable node or an occupied device, nothing withheld
    /// on an available node's other devices, the unavailable nodes and occupied devices those
    /// the events named);
    /// quota `used` = the sum of charged allocations; cohort pools agree with their lines;
    /// no line above guarantee + borrow limit; stages agree with allocations and queues.
    pub fn audit(&self) -> Result<(), String> {
        let mut held: Vec<Vec<u64>> =
            self.capacity.nodes.iter().map(|n| vec![0; n.devices.len()]).collect();
        let mut cpu_held = vec![0u64; self.capacity.nodes.len()];
        let mut mem_held = vec![0u64; self.capacity.nodes.len()];
        let mut charged: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        let mut stopping: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        let mut allocated = vec![Shares::ZERO; self.projects.len()];
        for (id, w) in &self.workloads {
            let queued = self.queues[w.project.0 as usize].contains_key(&w.queue_key());
            match (w.stage, &w.allocation) {
                (Stage::Pending, None) if queued => {}
                (Stage::Pending, _) => {
                    return Err(format!("pending {id} holds devices or is not queued"));
                }
                (_, None) => return Err(format!("{id} is {:?} without an allocation", w.stage)),
                (_, Some(a)) => {
                    if queued {
                        return Err(format!("{id} is admitted and still queued"));
                    }
                    if a.placement.members.len() != w.spec.members as usize {
                        return Err(format!(
                            "{id} placed {} of {} members",
                            a.placement.members.len(),
                            w.spec.members
                        ));
                    }
                    for m in &a.placement.members {
                        let n = m.node.0 as usize;
                        cpu_held[n] += w.spec.cpu_millis_per_member;
                        mem_held[n] += w.spec.memory_mib_per_member;
                        for d in &m.devices {
                            held[n][d.device as usize] += u64::from(d.shares);
                            if self.capacity.nodes[n].devices[d.device as usize].model
                                != a.placement.model.unwrap_or(ModelId(u16::MAX))
                            {
                                return Err(format!("{id} holds a device of another model"));
                            }
                        }
                    }
                    if let Some(key) = a.key {
                        let c = charged.entry((w.project, key)).or_default();
                        *c = c.saturating_add(a.shares);
                        if w.stage == Stage::Stopping {
                            let st = stopping.entry((w.project, key)).or_default();
                            *st = st.saturating_add(a.shares);
                        }
                    }
                    allocated[w.project.0 as usize] =
                        allocated[w.project.0 as usize].saturating_add(a.shares);
                }
            }
        }
        if !self.held.is_empty() {
            return Err("room still held for pre-emptors between cycles".into());
        }
        if !self.reserve_held.is_empty()
            || !self.reserved.is_empty()
            || !self.quota_holds.is_empty()
        {
            return Err("reservations kept between cycles".into());
        }
        if self.planned.keys().any(|p| !self.preemptors.contains(p))
            || self.reservations.keys().any(|p| !self.preemptors.contains(p))
        {
            return Err("a plan or reservation for a workload that waits for no victim".into());
        }
        let mut reserved: BTreeMap<(ProjectId, QuotaKey), Shares> = BTreeMap::new();
        for &(p, k, shares) in self.reservations.values() {
            adjust_line_total(&mut reserved, (p, k), |t| t.saturating_add(shares));
        }
        if reserved != self.reserved_by_line {
            return Err(format!(
                "reserved per line {:?} but reservations sum to {reserved:?}",
                self.reserved_by_line
            ));
        }
        if stopping != self.stopping_shares {
            return Err(format!(
                "stopping shares {:?} but stopping workloads hold {stopping:?}",
                self.stopping_shares
            ));
        }
        for (n, node) in self.capacity.nodes.iter().enumerate() {
            for (d, dev) in node.devices.iter().enumerate() {
                if u64::from(dev.free) + u64::from(dev.withheld) + held[n][d] != SHARES_PER_GPU {
                    return Err(format!(
                        "node {} device {d}: free {} + withheld {} + held {} != {SHARES_PER_GPU}",
                        self.node_names[n], dev.free, dev.withheld, held[n][d]
                    ));
                }
            }
            if node.free_cpu + node.withheld_cpu + cpu_held[n] != node.cpu_total
                || node.free_mem + node.withheld_mem + mem_held[n] != node.mem_total
            {
                return Err(format!("node {}: CPU or memory double-counted", self.node_names[n]));
            }
            let named = self.unavailable.contains_key(&NodeId(n as u32));
            let (free, withheld) = if node.unavailable {
                (node.free_cpu + node.free_mem, 0)
            } else {
                (0, node.withheld_cpu + node.withheld_mem)
            };
            let devices_wrong = node
                .devices
                .iter()
                .any(|d| if node.unavailable || d.occupied { d.free > 0 } else { d.withheld > 0 });
            let occupied: BTreeSet<u16> = (0..node.devices.len() as u16)
                .filter(|&d| node.devices[usize::from(d)].occupied)
                .collect();
            let said = self.occupied.get(&NodeId(n as u32)).map(|o| &o.devices);
            if said.map_or(!occupied.is_empty(), |s| *s != occupied || s.is_empty()) {
                return Err(format!(
                    "node {}: occupied devices {occupied:?} but the events said {said:?}",
                    self.node_names[n]
                ));
            }
            if named != node.unavailable || free > 0 || withheld > 0 || devices_wrong {
                return Err(format!(
                    "node {}: unavailable {} (events say {named}) but free and withheld \
                     capacity disagree",
                    self.node_names[n], node.unavailable
                ));
            }
        }
        if self.unavailable.keys().any(|n| n.0 as usize >= self.capacity.nodes.len()) {
            return Err("an unavailable node that does not exist".into());
        }
        if self.occupied.keys().any(|n| n.0 as usize >= self.capacity.nodes.len()) {
            return Err("an occupied node that does not exist".into());
        }
        if self.capacity.domains.recount(&self.capacity) != self.capacity.domains {
            return Err("rack or pool free counts out of step with the devices".into());
        }
        for (p, lines) in self.quota.lines.iter().enumerate() {
            let project = ProjectId(p as u32);
            for (key, line) in lines {
                let expect = charged.get(&(project, *key)).copied().unwrap_or_default();
                if line.used != expect {
                    return Err(format!(
                        "{} {:?}: used {} but allocations hold {}",
                        self.projects[p].name, key, line.used, expect
                    ));
                }
                if let Some(view) = self.quota.view(project, *key)
                    && line.used > view.max
                {
                    return Err(format!(
                        "{} {:?}: used {} above its maximum {}",
                        self.projects[p].name, key, line.used, view.max
                    ));
                }
            }
            if allocated[p] != self.projects[p].allocated {
                return Err(format!("{}: allocated total out of step", self.projects[p].name));
            }
        }
        self.audit_mig()?;
        // Every pool's subtree and usage are what its lines and child pools give it now, and
        // no root is used beyond what it holds.
        let own = self
            .quota
            .pools
            .iter()
            .map(|pools| pools.iter().map(|(k, p)| (*k, p.own)).collect())
            .collect();
        let fresh = QuotaBook::new(
            self.quota.lines.clone(),
            self.quota.cohort_of.clone(),
            self.quota.parent.clone(),
            own,
        );
        for (c, pools) in self.quota.pools.iter().enumerate() {
            for (key, pool) in pools {
                let want = fresh.pools[c].get(key);
                let over = self.quota.parent[c].is_none() && pool.used > pool.subtree;
                if want != Some(pool) || over {
                    return Err(format!(
                        "cohort {}: pool {:?} is {pool:?}; its lines say {want:?}",
                        self.cohort_names[c], key
                    ));
                }
            }
        }
        for (p, queue) in self.queues.iter().enumerate() {
            queue
                .check_runs(&self.reasons)
                .map_err(|e| format!("project {}'s queue: {e}", self.projects[p].name))?;
        }
        Ok(())
    }

    /// The cluster now, for the ledger: capacity, allocated and free shares, and the free
    /// shares no pending request could use (fragmented: on a device or node where no pending
    /// member fits — wrong model, too few whole devices or shares, or the host's CPU or memory
    /// gone). Capacity is what is usable: shares withheld on unavailable nodes (down or
    /// drained, held by no allocation) are neither capacity nor free, so allocated + free =
    /// capacity still holds; work still running on such a node counts as allocated. Shares
    /// withheld on occupied devices (held by work allot does not govern) are neither capacity
    /// nor free either: they are `unmanaged`.
    /// Costs O(pending + devices × distinct pending shapes).
    pub fn cluster_snapshot(&self) -> crate::ledger::ClusterSnapshot {
        // One workload read per distinct queued shape (the queue files each under its
        // shape's number): a deep queue holds few shapes, and this runs every cycle.
        let mut shapes: BTreeSet<(Vec<ModelId>, MemberShape)> = BTreeSet::new();
        let mut seen: BTreeSet<super::queue::ShapeId> = BTreeSet::new();
        for queue in &self.queues {
            for (&(_, _, id), entry) in queue.iter() {
                if !seen.insert(entry.shape) {
                    continue;
                }
                if let Some(w) = self.workloads.get(&id)
                    && w.spec.total_shares() > Shares::ZERO
                {
                    shapes.insert((self.candidate_models(w).to_vec(), w.shape()));
                }
            }
        }
        let (mut capacity, mut free, mut fragmented, mut unmanaged) = (0u64, 0u64, 0u64, 0u64);
        for node in &self.capacity.nodes {
            for d in &node.devices {
                capacity += SHARES_PER_GPU - u64::from(d.withheld);
                if d.occupied {
                    unmanaged += u64::from(d.withheld);
                }
                let f = u64::from(d.free);
                free += f;
                if f == 0 {
                    continue;
                }
                let usable = shapes.iter().any(|(models, shape)| {
                    models.contains(&d.model)
                        && node.fits_host(shape.cpu, shape.mem)
                        && match shape.gpus {
                            GpuRequest::Whole(k) => {
                                f == SHARES_PER_GPU && node.whole_free(d.model) >= k
                            }
                            GpuRequest::Shares(s) => f >= u64::from(s),
                            GpuRequest::Mig(p) => d.mig.is_some() && f >= p.shares().0,
                        }
                });
                if !usable {
                    fragmented += f;
                }
            }
        }
        crate::ledger::ClusterSnapshot {
            capacity_shares: capacity,
            allocated_shares: capacity - free,
            free_shares: free,
            fragmented_shares: fragmented,
            unmanaged_shares: unmanaged,
        }
    }
}
