//! The cluster beyond allot's own runs (`Backend::watch_cluster`): node states become engine
//! events, and work submitted to the cluster directly (a plain `sbatch`, a pod that asks for
//! allot as its scheduler) is imported under the same policy. Running foreign work is adopted
//! where it runs, charged to the project the backend names (a Slurm account, a Kubernetes
//! namespace); pending foreign work (held by the backend) queues like a submission and starts
//! only when allot admits it, on the nodes allot chose. Work allot must not govern (work
//! beside allot on shared nodes: jobs of unmanaged Slurm partitions, pods of other
//! schedulers; foreign work it refused and left running) occupies the devices it holds: the
//! engine is told, and offers them to no one. The words here are the backend's neutral ones
//! (work, project); the backend's handle says which kind of work it is.

use allot_api::{SubmitRequest, WorkloadState};
use allot_backend::{ClusterNews, ForeignWork, Launch, MemberLaunch, RunId, Waiting};
use allot_core::{
    DeviceShare, Event, MemberPlacement, NodeId, Placement, SHARES_PER_GPU, Stage, WorkloadId,
};

use super::daemon::{Command, Daemon, Record};
use super::entry::Entry;
use super::submit;

/// Reason code of an adoption the engine refused (the work went back to the queue, held).
const REFUSED_ADOPTION: &str = "cannot_adopt";

/// What the backend said of one piece of foreign work, as `Entry::Imported` logged it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found<'a> {
    pub handle: &'a str,
    pub running: &'a [MemberLaunch],
    pub started_ms: Option<u64>,
    pub refusal: Option<&'a str>,
}

impl Daemon {
    /// What a watch of the cluster changes, as entries to log and apply in order: node state
    /// changes, foreign work not imported yet, and imported pending work that left. (A new
    /// inventory, `inventory_entry`, is applied before these are made.)
    pub(crate) fn cluster_entries(&self, news: &ClusterNews) -> Vec<Entry> {
        let mut out = Vec::new();
        for status in &news.nodes {
            if !self.nodes.iter().any(|n| n.name == status.node) {
                continue;
            }
            // Logged when usability or the reason for being unusable changes.
            let unusable = self.unusable_nodes.get(&status.node);
            let changed =
                if status.usable { unusable.is_some() } else { unusable != Some(&status.reason) };
            if changed {
                out.push(Entry::NodeState {
                    node: status.node.clone(),
                    usable: status.usable,
                    reason: status.reason.clone(),
                });
            }
        }
        let mut next_id = self.next_id;
        for work in &news.foreign {
            if !self.should_import(work) {
                continue;
            }
            out.push(Entry::Imported {
                id: next_id,
                user: if work.user.is_empty() { "unknown".into() } else { work.user.clone() },
                request: foreign_request(work),
                handle: work.handle.clone(),
                running: work.running.clone(),
                started_ms: work.started_ms,
                refusal: work.refusal.clone(),
            });
            next_id += 1;
        }
        // Pending imports never admitted whose work is no longer listed: cancelled outside.
        // (Work allot launched is the backend's own run and is not listed as foreign.)
        let listed: std::collections::BTreeSet<&str> =
            news.foreign.iter().map(|w| w.handle.as_str()).collect();
        for (handle, id) in &self.foreign_ids {
            let Some(r) = self.workloads.get(id) else { continue };
            if r.state == WorkloadState::Pending && r.attempt == 0 && !listed.contains(&**handle) {
                out.push(Entry::ForeignGone { id: *id });
            }
        }
        out
    }

    /// The `Entry::Occupied` entries a watch calls for (after its imports are applied, so
    /// that work refused just now counts): per node, the devices held by work allot does not
    /// govern, where that differs from what the engine holds.
    pub(crate) fn occupancy_entries(&self, news: &ClusterNews) -> Vec<Entry> {
        use std::collections::{BTreeMap, BTreeSet};
        let refused_running = news.foreign.iter().filter(|w| {
            !w.running.is_empty()
                && self
                    .foreign_ids
                    .get(&w.handle)
                    .and_then(|id| self.workloads.get(id))
                    .is_some_and(|r| r.state.is_final())
        });
        let mut held: BTreeMap<&str, (BTreeSet<u32>, Vec<String>)> = BTreeMap::new();
        for (work, why) in news
            .beside
            .iter()
            .map(|w| (w, "run beside allot"))
            .chain(refused_running.map(|w| (w, "not governed by allot")))
        {
            for m in work.running.iter().filter(|m| !m.devices.is_empty()) {
                let (devices, by) = held.entry(m.node.as_str()).or_default();
                devices.extend(m.devices.iter().map(|d| d.index));
                let who =
                    if work.user.is_empty() { String::new() } else { format!(" of {}", work.user) };
                by.push(format!("work {}{who} (project {}, {why})", work.handle, work.project));
            }
        }
        let engine_has: BTreeMap<&str, (Vec<u32>, &str)> = self
            .engine
            .occupied_devices()
            .map(|(n, o)| {
                let devices = o.devices.iter().map(|&d| u32::from(d)).collect();
                (self.engine.node_name(n), (devices, o.by.as_str()))
            })
            .collect();
        let mut out = Vec::new();
        for node in &self.nodes {
            let now = held.get(node.name.as_str());
            let had = engine_has.get(node.name.as_str());
            // Indices past the node's devices name nothing (the engine would drop them).
            let count = node.devices.len() as u32;
            let devices: Vec<u32> = now
                .map(|(d, _)| d.iter().copied().filter(|&i| i < count).collect())
                .unwrap_or_default();
            let by = if devices.is_empty() {
                String::new()
            } else {
                now.map(|(_, by)| by.join("; ")).unwrap_or_default()
            };
            let same = match had {
                Some((d, b)) => *d == devices && *b == by,
                None => devices.is_empty(),
            };
            if !same {
                out.push(Entry::Occupied { node: node.name.clone(), devices, by });
            }
        }
        out
    }

    /// Applies `Entry::Occupied`: the engine is told (a node allot does not know is ignored).
    pub(crate) fn occupied(&mut self, now: u64, node: &str, devices: &[u32], by: &str) {
        let Some(index) = self.nodes.iter().position(|n| n.name == node) else { return };
        let devices = devices.iter().filter_map(|&d| u16::try_from(d).ok()).collect();
        self.event(
            now,
            Event::DevicesOccupied { node: NodeId(index as u32), devices, by: by.into() },
        );
        self.dirty = true;
    }

    /// Foreign work is imported once while it lives: again only when an adoption the engine
    /// refused sent it back to the queue and it is listed pending now.
    fn should_import(&self, work: &ForeignWork) -> bool {
        let Some(r) = self.foreign_ids.get(&work.handle).and_then(|id| self.workloads.get(id))
        else {
            return true;
        };
        r.state.is_final()
            && work.running.is_empty()
            && r.reason.as_ref().is_some_and(|(code, _)| code == REFUSED_ADOPTION)
    }

    /// Applies `Entry::Imported`.
    pub(crate) fn imported(&mut self, now: u64, entry: &Entry) -> Vec<Command> {
        let Entry::Imported { id, user, request, handle, running, started_ms, refusal } = entry
        else {
            return Vec::new();
        };
        let found = Found { handle, running, started_ms: *started_ms, refusal: refusal.as_deref() };
        self.import(now, *id, user, request, &found)
    }

    fn import(
        &mut self,
        now: u64,
        id: u64,
        user: &str,
        request: &SubmitRequest,
        found: &Found<'_>,
    ) -> Vec<Command> {
        let Found { handle, running, started_ms, refusal } = *found;
        self.next_id = self.next_id.max(id.saturating_add(1));
        self.counters.submitted += 1;
        self.foreign_ids.insert(handle.to_string(), id);
        let checked = submit::to_spec(id, user, request, &self.known);
        let placement = match (&checked, running.is_empty(), refusal) {
            (_, _, Some(why)) => Err(why.to_string()),
            (Ok(_), false, None) => self.placement_of(running).map(Some),
            _ => Ok(None),
        };
        let adopt_at = placement.as_ref().ok().cloned().flatten();
        let (spec, state, reason) = match (checked, placement) {
            (Ok(spec), Ok(placement)) => {
                let (state, text) = match placement {
                    Some(_) => {
                        (WorkloadState::Starting, format!("adopted from the cluster ({handle})"))
                    }
                    None => (
                        WorkloadState::Pending,
                        format!("imported from the cluster ({handle}); held there until admitted"),
                    ),
                };
                (spec, state, ("imported".to_string(), text))
            }
            (Err(e), _) => (
                super::submit::rejected_spec(id, user, request),
                WorkloadState::Rejected,
                (
                    "invalid_import".to_string(),
                    format!(
                        "{handle} cannot be governed: {}: {}; it is left as it is on the cluster \
                         (add its project to the policy — a Slurm account, a Kubernetes \
                         namespace — or run it where allot does not govern)",
                        e.field.unwrap_or_default(),
                        e.error
                    ),
                ),
            ),
            (Ok(_), Err(why)) => (
                super::submit::rejected_spec(id, user, request),
                WorkloadState::Rejected,
                ("invalid_import".to_string(), format!("{handle} cannot be governed: {why}")),
            ),
        };
        let launch = (state == WorkloadState::Starting).then(|| Launch {
            run: RunId { workload: id, attempt: 1 },
            command: request.command.clone(),
            env: request.env.clone(),
            members: running.to_vec(),
            log_dir: self.log_dir(id, 1),
            adopt: Some(handle.to_string()),
            resources: Default::default(),
        });
        self.workloads.insert(
            id,
            Record {
                request: request.clone(),
                spec: spec.clone(),
                state,
                submitted_ms: now,
                started_ms: launch.as_ref().map(|_| started_ms.unwrap_or(now).min(now)),
                ended_ms: (state == WorkloadState::Rejected).then_some(now),
                exit_code: None,
                attempt: u32::from(launch.is_some()),
                reason: Some(reason),
                intent: None,
                placement: Vec::new(),
                launch: launch.clone(),
                pids: Vec::new(),
                last_checkpoint_ms: None,
                last_activity_ms: None,
                foreign: Some(handle.to_string()),
                devices: None,
                kept: None,
                steps: Vec::new(),
                first_admitted_ms: launch.as_ref().map(|_| now),
            },
        );
        self.changed.insert(id);
        match state {
            WorkloadState::Pending => {
                self.event(now, Event::WorkloadSubmitted(spec));
                self.dirty = true;
                Vec::new()
            }
            WorkloadState::Starting => {
                let Some(placement) = adopt_at else { return Vec::new() };
                if let Some(r) = self.workloads.get_mut(&id) {
                    r.placement = crate::views::placement_lines(&self.engine, &placement);
                }
                self.event(now, Event::WorkloadAdopted { spec, placement });
                // The engine says at the next cycle why it refused (its Reject decision).
                self.dirty = true;
                if self.engine.stage(WorkloadId(id)) == Some(Stage::Running) {
                    launch.map(Command::Launch).into_iter().collect()
                } else {
                    if let Some(r) = self.workloads.get_mut(&id) {
                        r.state = WorkloadState::Rejected;
                        r.ended_ms = Some(now);
                        r.launch = None;
                        r.attempt = 0;
                        r.reason = Some((
                            REFUSED_ADOPTION.to_string(),
                            format!("{handle} was not adopted; it goes back to the queue, held"),
                        ));
                    }
                    vec![Command::ReturnForeign(handle.to_string())]
                }
            }
            // Pending work refused here (an unknown project, a request the policy cannot
            // take) stays held on the cluster: say why there, where its user looks. A refusal
            // the backend made is its own to show.
            WorkloadState::Rejected if running.is_empty() && refusal.is_none() => {
                let text = self.workloads.get(&id).and_then(|r| r.reason.clone());
                text.map(|(_, text)| {
                    Command::ExplainWaiting(vec![(Waiting::Foreign(handle.to_string()), text)])
                })
                .into_iter()
                .collect()
            }
            _ => Vec::new(),
        }
    }

    /// The devices a run holds as the backend reported them (one entry per node), laid over
    /// the launch's members in order; `None` when they are what was launched, when the run is
    /// not the current one, or when they do not cover the launch's members.
    pub(crate) fn bound_members(
        &self,
        run: RunId,
        reported: &[MemberLaunch],
    ) -> Option<Vec<MemberLaunch>> {
        let r = self.workloads.get(&run.workload).filter(|r| r.attempt == run.attempt)?;
        let launched = &r.launch.as_ref()?.members;
        let mut left: std::collections::BTreeMap<&str, std::collections::VecDeque<_>> = reported
            .iter()
            .map(|m| (m.node.as_str(), m.devices.iter().cloned().collect()))
            .collect();
        let mut out = Vec::with_capacity(launched.len());
        for m in launched {
            let pool = left.get_mut(m.node.as_str())?;
            let devices: Vec<_> =
                (0..m.devices.len()).map(|_| pool.pop_front()).collect::<Option<_>>()?;
            out.push(MemberLaunch { node: m.node.clone(), devices });
        }
        let same = out
            .iter()
            .zip(launched)
            .all(|(a, b)| a.devices.iter().map(|d| d.index).eq(b.devices.iter().map(|d| d.index)));
        (!same).then_some(out)
    }

    /// The engine's placement of foreign members (node by name, device by index, whole GPUs).
    fn placement_of(&self, members: &[MemberLaunch]) -> Result<Placement, String> {
        let mut model = None;
        let mut placed = Vec::new();
        for m in members {
            let Some(index) = self.nodes.iter().position(|n| n.name == m.node) else {
                return Err(format!("it runs on node {:?}, which allot does not govern", m.node));
            };
            let node = &self.nodes[index];
            let mut devices = Vec::new();
            for d in &m.devices {
                let Some(dev) = node.devices.get(d.index as usize) else {
                    return Err(format!("{} has no GPU {} in allot's inventory", m.node, d.index));
                };
                let Some(id) = self.engine.model_id(&dev.model) else {
                    return Err(format!("GPU model {:?} is not in allot's inventory", dev.model));
                };
                model = Some(id);
                devices.push(DeviceShare {
                    device: u16::try_from(d.index).unwrap_or(u16::MAX),
                    shares: SHARES_PER_GPU as u32,
                    mig: None,
                });
            }
            placed.push(MemberPlacement { node: NodeId(index as u32), devices });
        }
        Ok(Placement { model, members: placed })
    }
}

/// The submission foreign work amounts to: its nodes as members of `gpus_per_node` whole
/// GPUs each, the models it may run on (one allot does not know is refused with its name,
/// not dropped: placed on any model, the work would not start there), the intent it declares (kind,
/// priority class, runtimes …; checked as a submission's), its name as the command (it is
/// never run: the backend takes the work over).
fn foreign_request(work: &ForeignWork) -> SubmitRequest {
    let (members, gpus) = if work.running.is_empty() {
        (work.nodes.max(1), work.gpus_per_node)
    } else {
        let most = work.running.iter().map(|m| m.devices.len()).max().unwrap_or(0);
        (u32::try_from(work.running.len()).unwrap_or(u32::MAX), most as u32)
    };
    let intent = &work.intent;
    SubmitRequest {
        kind: intent.kind.clone(),
        priority_class: intent.priority_class.clone(),
        preemptible: intent.preemptible,
        checkpoint_grace_s: intent.checkpoint_grace_s,
        min_runtime_s: intent.min_runtime_s,
        max_runtime_s: intent.max_runtime_s,
        name: Some(if work.name.is_empty() {
            format!("job-{}", work.handle)
        } else {
            work.name.clone()
        }),
        project: work.project.clone(),
        gpus: Some(f64::from(gpus)),
        members: Some(members),
        gpu_models: work.models.clone(),
        command: vec!["foreign".into(), work.handle.clone()],
        ..SubmitRequest::default()
    }
}
