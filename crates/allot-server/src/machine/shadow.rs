//! A candidate policy run in shadow beside the active one (`allot policy apply FILE
//! --shadow`). At every decision cycle the candidate takes over a copy of the live work as it
//! stands before the real cycle (`Engine::shadow_of`) and decides; its decisions are compared
//! with the real cycle's and kept per workload, never executed. The shadow's start and stop
//! are log entries and its figures are made by `apply`, so a replay or a restart from a
//! snapshot rebuilds the same report.
//!
//! Each cycle's candidate starts from the real state, not from its own earlier decisions:
//! it says what the candidate would do *now* with the work as it is, so its figures do not
//! drift from what can be observed, and work it would have started sooner is counted once,
//! from the first cycle it would have.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::{Decision, Engine, NodeSpec, PolicySpec, Timestamp};
use serde::{Deserialize, Serialize};

/// The report's row of `project` (`None`: a workload the daemon no longer knows).
fn row(
    rows: &mut BTreeMap<String, allot_api::ShadowProject>,
    project: Option<String>,
) -> &mut allot_api::ShadowProject {
    let name = project.unwrap_or_else(|| "(unknown)".to_string());
    rows.entry(name.clone())
        .or_insert_with(|| allot_api::ShadowProject { project: name, ..Default::default() })
}

/// The shadow's state: what it was started with and what it saw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Shadow {
    pub source: String,
    pub text: String,
    pub by: String,
    pub since_ms: u64,
    /// The candidate's idle rules are the active ones: idle timers carry over.
    pub keep_idle: bool,
    pub cycles: u64,
    pub failed_cycles: u64,
    pub last_failure: Option<String>,
    /// Pending workloads the candidate would have admitted, with the first cycle it would have.
    pub sooner: BTreeMap<u64, u64>,
    /// Of those, the ones the active policy has admitted since: how much sooner (ms).
    pub saved: BTreeMap<u64, u64>,
    /// Workloads the active policy admitted that the candidate would have kept waiting.
    pub held_back: BTreeSet<u64>,
    /// Distinct workloads pre-empted for other work, and reclaimed for idleness, by each.
    pub preempted_active: BTreeSet<u64>,
    pub preempted_candidate: BTreeSet<u64>,
    pub reclaimed_active: BTreeSet<u64>,
    pub reclaimed_candidate: BTreeSet<u64>,
    /// The candidate, parsed (from `text`; not saved).
    #[serde(skip)]
    pub policy: Option<PolicySpec>,
}

impl Shadow {
    pub(crate) fn new(
        source: &str,
        text: &str,
        by: &str,
        since_ms: u64,
        policy: PolicySpec,
        active: &PolicySpec,
    ) -> Shadow {
        Shadow {
            source: source.to_string(),
            text: text.to_string(),
            by: by.to_string(),
            since_ms,
            keep_idle: policy.idle == active.idle,
            cycles: 0,
            failed_cycles: 0,
            last_failure: None,
            sooner: BTreeMap::new(),
            saved: BTreeMap::new(),
            held_back: BTreeSet::new(),
            preempted_active: BTreeSet::new(),
            preempted_candidate: BTreeSet::new(),
            reclaimed_active: BTreeSet::new(),
            reclaimed_candidate: BTreeSet::new(),
            policy: Some(policy),
        }
    }

    /// The candidate's decisions for this cycle, from the live work as the real engine holds
    /// it before deciding; `None` (a failed cycle, its reason kept) if it cannot take it over.
    pub(crate) fn decide(
        &mut self,
        engine: &Engine,
        nodes: &[NodeSpec],
        now: u64,
    ) -> Option<Vec<Decision>> {
        let policy = self.policy.as_ref()?;
        match engine.shadow_of(nodes, policy, self.keep_idle) {
            Ok(mut candidate) => Some(candidate.decide(Timestamp(now))),
            Err(e) => {
                self.failed_cycles += 1;
                self.last_failure = Some(e.to_string());
                None
            }
        }
    }

    /// Compares one cycle's decisions: the real ones and the candidate's over the same work.
    pub(crate) fn compare(&mut self, now: u64, real: &[Decision], candidate: &[Decision]) {
        self.cycles += 1;
        let admitted = |ds: &[Decision]| -> BTreeSet<u64> {
            ds.iter()
                .filter(|d| matches!(d, Decision::Admit { .. }))
                .map(|d| d.workload().0)
                .collect()
        };
        let (real_admits, candidate_admits) = (admitted(real), admitted(candidate));
        for id in &real_admits {
            match self.sooner.remove(id) {
                Some(first) => {
                    self.saved.insert(*id, now.saturating_sub(first));
                }
                None if !candidate_admits.contains(id) => {
                    self.held_back.insert(*id);
                }
                None => {}
            }
        }
        for id in candidate_admits.difference(&real_admits) {
            self.sooner.entry(*id).or_insert(now);
        }
        for (decisions, preempted, reclaimed) in [
            (real, &mut self.preempted_active, &mut self.reclaimed_active),
            (candidate, &mut self.preempted_candidate, &mut self.reclaimed_candidate),
        ] {
            for d in decisions {
                match d {
                    Decision::Preempt { .. } => {
                        preempted.insert(d.workload().0);
                    }
                    Decision::Reclaim { .. } => {
                        reclaimed.insert(d.workload().0);
                    }
                    _ => {}
                }
            }
        }
    }

    /// A workload that ended without the active policy admitting it again: no longer sooner.
    pub(crate) fn ended(&mut self, id: u64) {
        self.sooner.remove(&id);
    }

    /// The report, per project (`project_of` names a workload's project).
    pub(crate) fn report(
        &self,
        now_ms: u64,
        project_of: impl Fn(u64) -> Option<String>,
    ) -> allot_api::ShadowReport {
        let mut rows: BTreeMap<String, allot_api::ShadowProject> = BTreeMap::new();
        for id in self.sooner.keys() {
            row(&mut rows, project_of(*id)).sooner += 1;
        }
        for (id, saved) in &self.saved {
            let r = row(&mut rows, project_of(*id));
            r.sooner += 1;
            r.admitted_since += 1;
            r.wait_saved_ms += saved;
        }
        for id in &self.held_back {
            row(&mut rows, project_of(*id)).held_back += 1;
        }
        for id in &self.preempted_active {
            row(&mut rows, project_of(*id)).preempted_active += 1;
        }
        for id in &self.preempted_candidate {
            row(&mut rows, project_of(*id)).preempted_candidate += 1;
        }
        for id in &self.reclaimed_active {
            row(&mut rows, project_of(*id)).reclaimed_active += 1;
        }
        for id in &self.reclaimed_candidate {
            row(&mut rows, project_of(*id)).reclaimed_candidate += 1;
        }
        allot_api::ShadowReport {
            source: self.source.clone(),
            by: self.by.clone(),
            since_ms: self.since_ms,
            now_ms,
            cycles: self.cycles,
            failed_cycles: self.failed_cycles,
            last_failure: self.last_failure.clone(),
            idle_compared: self.keep_idle,
            text: self.text.clone(),
            projects: rows.into_values().collect(),
        }
    }
}
