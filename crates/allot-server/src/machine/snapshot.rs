//! The daemon's state as of one log record, so that a restart replays only what came after
//! it (and the log before it can be dropped).
//!
//! A snapshot is taken only right after a decision cycle (`Entry::Decided` last in its batch):
//! the engine then holds no undecided fact (`Engine::state`). The body is JSON: the records,
//! stops and counters as they are, the engine's and the ledger's state as base64 of their own
//! encoding, and the policy in effect (which may be one applied since the log began). A
//! workload's `WorkloadSpec` is not stored: it is made again from its request, as at submit.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_api::{SubmitRequest, WorkloadState};
use allot_backend::Launch;
use allot_core::ledger::Ledger;
use allot_core::{Engine, NodeSpec};
use anyhow::{Context, anyhow};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use super::daemon::{Counters, Daemon, Intent, PolicyVersion, Record, StopPlan};
use super::shadow::Shadow;
use super::submit;
use super::wire::{self, SavedNode};

/// Bumped when the body's meaning changes; another version's snapshot is not read. Version 3
/// adds the inventory the engine was over (it may have changed since the log began), the
/// reported inventory still waiting for live work, and the backend's reachability; version 2
/// (over the log's first inventory) is still read.
const SNAPSHOT_VERSION: u32 = 3;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    version: u32,
    policy_source: String,
    policy_text: String,
    engine: String,
    ledger: String,
    workloads: Vec<SavedRecord>,
    stops: BTreeMap<u64, StopPlan>,
    counters: Counters,
    next_id: u64,
    last_now: u64,
    first_ms: Option<u64>,
    dirty: bool,
    last_cycle_ms: u64,
    #[serde(default)]
    unusable_nodes: BTreeMap<String, String>,
    /// `None` in version 2: the log's first inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nodes: Option<Vec<SavedNode>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reported_nodes: Option<Vec<SavedNode>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    kept_nodes: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backend_down: Option<super::wire::Unreachable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    inventory_note: Option<String>,
    /// Absent in snapshots written before policies were versioned: the history then starts
    /// with the policy in effect as version 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    policy_versions: Vec<PolicyVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shadow: Option<Shadow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rollout: Option<super::rollout::Rollout>,
    #[serde(default)]
    outcomes: allot_config::rollout::Outcomes,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRecord {
    id: u64,
    user: String,
    request: SubmitRequest,
    state: WorkloadState,
    submitted_ms: u64,
    started_ms: Option<u64>,
    ended_ms: Option<u64>,
    exit_code: Option<i32>,
    attempt: u32,
    reason: Option<(String, String)>,
    intent: Option<Intent>,
    placement: Vec<String>,
    launch: Option<Launch>,
    pids: Vec<u32>,
    last_checkpoint_ms: Option<u64>,
    last_activity_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_admitted_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    foreign: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    devices: Option<Vec<allot_backend::MemberLaunch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kept: Option<u32>,
    /// Absent in snapshots written before timelines were kept.
    #[serde(default)]
    steps: Vec<crate::view::Step>,
    /// Its request did not make a spec when it was logged (kept as rejected): restored so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    spec_rejected: bool,
}

impl Daemon {
    /// The state as a snapshot body; `None` when the engine is between an event and a cycle.
    pub(crate) fn snapshot(&self) -> anyhow::Result<Option<String>> {
        let Ok(engine) = self.engine.state() else { return Ok(None) };
        let workloads = self
            .workloads
            .iter()
            .map(|(id, r)| SavedRecord {
                id: *id,
                user: r.spec.user.clone(),
                request: r.request.clone(),
                state: r.state,
                submitted_ms: r.submitted_ms,
                started_ms: r.started_ms,
                ended_ms: r.ended_ms,
                exit_code: r.exit_code,
                attempt: r.attempt,
                reason: r.reason.clone(),
                intent: r.intent,
                placement: r.placement.clone(),
                launch: r.launch.clone(),
                pids: r.pids.clone(),
                last_checkpoint_ms: r.last_checkpoint_ms,
                last_activity_ms: r.last_activity_ms,
                first_admitted_ms: r.first_admitted_ms,
                foreign: r.foreign.clone(),
                devices: r.devices.clone(),
                kept: r.kept,
                steps: r.steps.clone(),
                spec_rejected: r.spec
                    == super::submit::rejected_spec(*id, &r.spec.user, &r.request),
            })
            .collect();
        let body = Body {
            version: SNAPSHOT_VERSION,
            policy_source: self.policy_source.clone(),
            policy_text: self.policy_text.clone(),
            engine: BASE64.encode(engine),
            ledger: BASE64.encode(self.ledger.state()),
            workloads,
            stops: self.stops.clone(),
            counters: self.counters.clone(),
            next_id: self.next_id,
            last_now: self.last_now,
            first_ms: self.first_ms,
            dirty: self.dirty,
            last_cycle_ms: self.last_cycle_ms,
            unusable_nodes: self.unusable_nodes.clone(),
            nodes: Some(wire::saved(&self.nodes)),
            reported_nodes: self.reported_nodes.as_deref().map(wire::saved),
            kept_nodes: self.kept_nodes.clone(),
            backend_down: self.backend_down.clone(),
            inventory_note: self.inventory_note.clone(),
            policy_versions: self.policy_versions.clone(),
            shadow: self.shadow.clone(),
            rollout: self.rollout.clone(),
            outcomes: self.outcomes.clone(),
        };
        Ok(Some(serde_json::to_string(&body)?))
    }

    /// The daemon a snapshot body describes, over `nodes`. Errors say what is wrong; the
    /// caller decides whether the log can be replayed instead.
    pub(crate) fn from_snapshot(
        nodes: Vec<NodeSpec>,
        workload_dir: PathBuf,
        body: &str,
    ) -> anyhow::Result<Daemon> {
        let body: Body = serde_json::from_str(body).context("the snapshot cannot be read")?;
        if !(2..=SNAPSHOT_VERSION).contains(&body.version) {
            return Err(anyhow!(
                "the snapshot is version {} (this allot reads 2 to {SNAPSHOT_VERSION})",
                body.version
            ));
        }
        let nodes = body.nodes.as_deref().map_or(nodes, wire::specs);
        let policy = allot_config::parse_policy(&body.policy_source, &body.policy_text)
            .map_err(|d| anyhow!("the snapshot's policy: {}", allot_config::render(&d)))?;
        let mut daemon = Daemon::new(
            nodes,
            &policy,
            (body.policy_source.clone(), body.policy_text.clone()),
            workload_dir,
        )
        .map_err(|e| anyhow!("the snapshot's policy: {e}"))?;
        let engine_bytes = BASE64.decode(&body.engine).context("the snapshot's engine state")?;
        daemon.engine = Engine::from_state(&daemon.nodes, &policy, &engine_bytes)
            .map_err(|e| anyhow!("the snapshot's engine state: {e}"))?;
        let ledger_bytes = BASE64.decode(&body.ledger).context("the snapshot's ledger state")?;
        daemon.ledger = Ledger::from_state(&ledger_bytes)
            .map_err(|e| anyhow!("the snapshot's ledger state: {e}"))?;
        for saved in body.workloads {
            if let Some(handle) = &saved.foreign {
                daemon.foreign_ids.insert(handle.clone(), saved.id);
            }
            // The spec as it was made at submission: the names the request uses count as
            // known even if the policy in effect has since dropped them (an ended workload of
            // a removed project keeps its name and shape; live work's names the policy keeps).
            let known = daemon.known.with_names_of(&saved.request);
            let rejected = || super::submit::rejected_spec(saved.id, &saved.user, &saved.request);
            let spec = if saved.spec_rejected {
                rejected()
            } else {
                submit::to_spec(saved.id, &saved.user, &saved.request, &known)
                    .unwrap_or_else(|_| rejected())
            };
            daemon.workloads.insert(
                saved.id,
                Record {
                    request: saved.request,
                    spec,
                    state: saved.state,
                    submitted_ms: saved.submitted_ms,
                    started_ms: saved.started_ms,
                    ended_ms: saved.ended_ms,
                    exit_code: saved.exit_code,
                    attempt: saved.attempt,
                    reason: saved.reason,
                    intent: saved.intent,
                    placement: saved.placement,
                    launch: saved.launch,
                    pids: saved.pids,
                    last_checkpoint_ms: saved.last_checkpoint_ms,
                    last_activity_ms: saved.last_activity_ms,
                    first_admitted_ms: saved.first_admitted_ms,
                    foreign: saved.foreign,
                    devices: saved.devices,
                    kept: saved.kept,
                    steps: saved.steps,
                },
            );
        }
        daemon.stops = body.stops;
        daemon.counters = body.counters;
        daemon.next_id = body.next_id;
        daemon.last_now = body.last_now;
        daemon.first_ms = body.first_ms;
        daemon.dirty = body.dirty;
        daemon.last_cycle_ms = body.last_cycle_ms;
        daemon.unusable_nodes = body.unusable_nodes;
        daemon.reported_nodes = body.reported_nodes.as_deref().map(wire::specs);
        daemon.kept_nodes = body.kept_nodes;
        daemon.backend_down = body.backend_down;
        daemon.inventory_note = body.inventory_note;
        if !body.policy_versions.is_empty() {
            daemon.policy_versions = body.policy_versions;
        }
        daemon.rollout = body.rollout;
        daemon.outcomes = body.outcomes;
        // The candidate's parsed policy is not saved: parsed again from its text.
        daemon.shadow = body.shadow.map(|mut shadow| {
            match allot_config::parse_policy(&shadow.source, &shadow.text) {
                Ok(policy) => shadow.policy = Some(policy),
                Err(d) => {
                    shadow.last_failure = Some(format!(
                        "the candidate no longer parses: {}",
                        allot_config::render(&d)
                    ));
                }
            }
            shadow
        });
        Ok(daemon)
    }
}

#[cfg(test)]
mod tests {
    //! Every snapshot field survives the store: arbitrary bodies, written as the daemon writes
    //! them (`Store::put_snapshot`) and read back, decode to equal bodies.

    use allot_api::WorkloadState;
    use allot_backend::{Launch, RunId};
    use allot_store::{Snapshot, Store};
    use proptest::prelude::*;

    use super::super::daemon::PolicyVersion;
    use super::super::roundtrip::{TempStore, members, nodes, request, text};
    use super::super::shadow::Shadow;
    use super::{Body, SavedRecord};
    use crate::machine::daemon::{Counters, Intent, StopPlan};
    use crate::machine::wire::Unreachable;
    use crate::view::Step;

    fn state() -> impl Strategy<Value = WorkloadState> {
        prop::sample::select(vec![
            WorkloadState::Pending,
            WorkloadState::Starting,
            WorkloadState::Running,
            WorkloadState::Stopping,
            WorkloadState::Suspended,
            WorkloadState::Succeeded,
            WorkloadState::Failed,
            WorkloadState::Cancelled,
            WorkloadState::Rejected,
        ])
    }

    fn run() -> impl Strategy<Value = RunId> {
        (any::<u64>(), any::<u32>()).prop_map(|(workload, attempt)| RunId { workload, attempt })
    }

    fn launch() -> impl Strategy<Value = Launch> {
        (
            run(),
            prop::collection::vec(text(), 0..3),
            prop::collection::btree_map(text(), text(), 0..3),
            members(),
            text(),
            prop::option::of(text()),
            (any::<u64>(), any::<u64>()),
        )
            .prop_map(
                |(run, command, env, members, dir, adopt, (cpu_millis, memory_mib))| Launch {
                    run,
                    command,
                    env,
                    members,
                    log_dir: dir.into(),
                    adopt,
                    resources: allot_backend::MemberResources { cpu_millis, memory_mib },
                },
            )
    }

    fn step() -> impl Strategy<Value = Step> {
        (any::<u64>(), state(), text(), prop::option::of(text()), prop::option::of(text()))
            .prop_map(|(at_ms, state, what, code, detail)| Step {
                at_ms,
                state,
                what,
                code,
                detail,
            })
    }

    fn record() -> impl Strategy<Value = SavedRecord> {
        let a = (any::<u64>(), text(), request(), state(), any::<u64>());
        let b = (
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<i32>()),
            any::<u32>(),
            prop::option::of((text(), text())),
            prop::option::of(prop::sample::select(vec![Intent::Cancel, Intent::Suspend])),
        );
        let c = (
            prop::collection::vec(text(), 0..3),
            prop::option::of(launch()),
            prop::collection::vec(any::<u32>(), 0..3),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u64>()),
        );
        let d = (
            prop::option::of(text()),
            prop::option::of(members()),
            prop::option::of(any::<u32>()),
            prop::collection::vec(step(), 0..3),
            (any::<bool>(), prop::option::of(any::<u64>())),
        );
        (a, b, c, d).prop_map(
            |(
                (id, user, request, state, submitted_ms),
                (started_ms, ended_ms, exit_code, attempt, reason, intent),
                (placement, launch, pids, last_checkpoint_ms, last_activity_ms),
                (foreign, devices, kept, steps, (spec_rejected, first_admitted_ms)),
            )| SavedRecord {
                first_admitted_ms,
                id,
                user,
                request,
                state,
                submitted_ms,
                started_ms,
                ended_ms,
                exit_code,
                attempt,
                reason,
                intent,
                placement,
                launch,
                pids,
                last_checkpoint_ms,
                last_activity_ms,
                foreign,
                devices,
                kept,
                steps,
                spec_rejected,
            },
        )
    }

    fn stop_plan() -> impl Strategy<Value = StopPlan> {
        (run(), any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>(), prop::option::of(run()))
            .prop_map(|(run, term_at, kill_at, term_sent, kill_sent, requeue_as)| StopPlan {
                run,
                term_at,
                kill_at,
                term_sent,
                kill_sent,
                requeue_as,
            })
    }

    fn body() -> impl Strategy<Value = Body> {
        let a =
            (any::<u32>(), text(), text(), text(), text(), prop::collection::vec(record(), 0..3));
        let b = (
            prop::collection::btree_map(any::<u64>(), stop_plan(), 0..3),
            (
                prop::collection::btree_map(text(), any::<u64>(), 0..3),
                any::<u64>(),
                any::<u64>(),
                (any::<u64>(), any::<u64>()),
            )
                .prop_map(|(preemptions, cycles, submitted, (sampled, rollbacks))| {
                    Counters { preemptions, cycles, submitted, sampled, rollbacks }
                }),
            any::<u64>(),
            any::<u64>(),
            prop::option::of(any::<u64>()),
            any::<bool>(),
            any::<u64>(),
        );
        let c = (
            prop::collection::btree_map(text(), text(), 0..3),
            prop::option::of(nodes()),
            prop::option::of(nodes()),
            prop::collection::btree_map(text(), text(), 0..3),
            prop::option::of(
                (any::<u64>(), text())
                    .prop_map(|(since_ms, error)| Unreachable { since_ms, error }),
            ),
            prop::option::of(text()),
        );
        let d = prop::collection::vec(
            (
                1u32..50,
                prop::option::of(any::<u64>()),
                text(),
                prop::option::of(text()),
                prop::option::of(1u32..50),
                text(),
                (
                    prop::option::of(text()),
                    prop::option::of(text()),
                    prop::option::of(super::super::roundtrip::whatif_shown()),
                ),
            )
                .prop_map(
                    |(version, at_ms, source, by, rollback_of, text, (scope, why, whatif))| {
                        PolicyVersion {
                            version,
                            at_ms,
                            source,
                            by,
                            rollback_of,
                            text,
                            scope,
                            why,
                            whatif,
                        }
                    },
                ),
            0..3,
        );
        let ids = || prop::collection::btree_set(any::<u64>(), 0..3);
        let times = || prop::collection::btree_map(any::<u64>(), any::<u64>(), 0..3);
        let e = prop::option::of(
            (
                (text(), text(), text(), any::<u64>(), any::<bool>()),
                (any::<u64>(), any::<u64>(), prop::option::of(text())),
                (times(), times(), ids()),
                (ids(), ids(), ids(), ids()),
            )
                .prop_map(
                    |(
                        (source, text, by, since_ms, keep_idle),
                        (cycles, failed_cycles, last_failure),
                        (sooner, saved, held_back),
                        (
                            preempted_active,
                            preempted_candidate,
                            reclaimed_active,
                            reclaimed_candidate,
                        ),
                    )| Shadow {
                        source,
                        text,
                        by,
                        since_ms,
                        keep_idle,
                        cycles,
                        failed_cycles,
                        last_failure,
                        sooner,
                        saved,
                        held_back,
                        preempted_active,
                        preempted_candidate,
                        reclaimed_active,
                        reclaimed_candidate,
                        policy: None,
                    },
                ),
        );
        let f = (prop::option::of(rollout()), outcomes());
        (a, b, c, (d, e, f)).prop_map(
            |(
                (version, policy_source, policy_text, engine, ledger, workloads),
                (stops, counters, next_id, last_now, first_ms, dirty, last_cycle_ms),
                (unusable_nodes, nodes, reported_nodes, kept_nodes, backend_down, inventory_note),
                (policy_versions, shadow, (rollout, outcomes)),
            )| Body {
                shadow,
                rollout,
                outcomes,
                version,
                policy_source,
                policy_text,
                engine,
                ledger,
                workloads,
                stops,
                counters,
                next_id,
                last_now,
                first_ms,
                dirty,
                last_cycle_ms,
                unusable_nodes,
                nodes,
                reported_nodes,
                kept_nodes,
                backend_down,
                inventory_note,
                policy_versions,
            },
        )
    }

    fn rollout() -> impl Strategy<Value = super::super::rollout::Rollout> {
        (
            (1u32..50, 1u32..50, prop::option::of(text()), any::<u64>()),
            super::super::roundtrip::rollout_plan(),
            prop::option::of((any::<u64>(), text())),
        )
            .prop_map(|((version, base_version, by, started_ms), plan, ended)| {
                super::super::rollout::Rollout {
                    version,
                    base_version,
                    by,
                    started_ms,
                    plan,
                    ended,
                }
            })
    }

    fn outcomes() -> impl Strategy<Value = allot_config::rollout::Outcomes> {
        use allot_config::rollout::{Fact, Outcome, Outcomes};
        let fact = prop_oneof![
            any::<u64>().prop_map(|wait_ms| Fact::Admitted { wait_ms }),
            (any::<bool>(), any::<u64>())
                .prop_map(|(failed, share_ms)| Fact::Finished { failed, share_ms }),
            any::<u64>().prop_map(|share_ms| Fact::Lost { share_ms }),
            Just(Fact::IdleReclaimed),
            any::<u64>().prop_map(|after_ms| Fact::Returned { after_ms }),
        ];
        let kinds = [
            allot_core::WorkloadKind::Training,
            allot_core::WorkloadKind::Notebook,
            allot_core::WorkloadKind::Service,
        ];
        let outcome = (any::<u64>(), text(), 0usize..3, prop::collection::vec(text(), 0..2), fact)
            .prop_map(move |(at_ms, project, k, models, fact)| Outcome {
                at_ms,
                project,
                kind: kinds[k],
                models,
                fact,
            });
        (
            prop::collection::vec_deque(outcome, 0..4),
            prop::collection::btree_map(any::<u64>(), any::<u64>(), 0..3),
            prop::collection::btree_map(text(), any::<u64>(), 0..3),
        )
            .prop_map(|(facts, reclaimed, reclaimed_names)| Outcomes {
                facts,
                reclaimed,
                reclaimed_names,
            })
    }

    fn cases() -> u32 {
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn every_snapshot_field_reads_back_equal_through_the_store(body in body()) {
            let mut t = TempStore::new("snapshot");
            // A snapshot is taken at a log record.
            let decided = allot_store::NewRecord { at_ms: 1, kind: "decided", body: "{\"kind\":\"decided\"}" };
            t.store.append(&[decided]).expect("append");
            let text = serde_json::to_string(&body).expect("encodes");
            t.store.put_snapshot(&Snapshot { seq: 1, at_ms: 1, body: text }).expect("put");
            let read = t.store.latest_snapshot().expect("read").expect("the snapshot");
            let back: Body = serde_json::from_str(&read.body)
                .map_err(|e| TestCaseError::fail(format!("does not read back: {e}")))?;
            prop_assert_eq!(back, body);
        }
    }
}
