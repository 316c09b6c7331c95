//! Every log entry and every snapshot field survives the log: arbitrary values of each entry
//! kind (and of a snapshot's body) are written through the real store (SQLite in a
//! temporary directory), read back and decoded, and must equal what was written. The
//! generator covers every kind in `ENTRY_KINDS`; `kind_index` has no wildcard arm, so a new
//! entry kind does not compile until it is generated here too.

use std::collections::{BTreeMap, BTreeSet};

use allot_api::{Probe, SubmitRequest};
use allot_backend::{DeviceAssignment, MemberLaunch, Vendor};
use allot_store::{NewRecord, SqliteStore, Store};
use proptest::prelude::*;

use super::attribution::Reading;
use super::entry::{ENTRY_KINDS, Entry};
use super::wire::{SavedDevice, SavedNode};

/// Position of an entry's kind in `ENTRY_KINDS` (exhaustive: no wildcard).
fn kind_index(e: &Entry) -> usize {
    match e {
        Entry::Submitted { .. } => 0,
        Entry::CancelRequested { .. } => 1,
        Entry::SuspendRequested { .. } => 2,
        Entry::ResumeRequested { .. } => 3,
        Entry::Started { .. } => 4,
        Entry::LaunchFailed { .. } => 5,
        Entry::Exited { .. } => 6,
        Entry::Probed { .. } => 7,
        Entry::CheckpointReported { .. } => 8,
        Entry::TelemetryMissing { .. } => 9,
        Entry::Sampled { .. } => 10,
        Entry::Decided => 11,
        Entry::PolicyApplied { .. } => 12,
        Entry::Imported { .. } => 13,
        Entry::ForeignGone { .. } => 14,
        Entry::NodeState { .. } => 15,
        Entry::DevicesReported { .. } => 16,
        Entry::Kept { .. } => 17,
        Entry::InventoryReported { .. } => 18,
        Entry::BackendUnreachable { .. } => 19,
        Entry::BackendReachable => 20,
        Entry::LaunchDeferred { .. } => 21,
        Entry::Occupied { .. } => 22,
        Entry::ShadowStarted { .. } => 23,
        Entry::ShadowStopped => 24,
    }
}

pub(super) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.-]{0,12}",
        "\\PC{0,16}",
        Just(String::new()),
        Just("\"quoted\" \\ back\nslash".to_string()),
    ]
}

fn finite() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(0.5), Just(1.0), Just(8.0), -1e9f64..1e9f64]
}

pub(super) fn request() -> impl Strategy<Value = SubmitRequest> {
    let names = (
        prop::option::of(text()),
        text(),
        prop::option::of(text()),
        prop::option::of(finite()),
        prop::option::of(text()),
        prop::option::of(any::<u32>()),
        prop::collection::vec(text(), 0..3),
        prop::option::of(text()),
    );
    let numbers = (
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::option::of(any::<bool>()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
    );
    let rest = (
        prop::collection::vec(text(), 0..4),
        prop::collection::btree_map(text(), text(), 0..3),
        prop::option::of(prop_oneof![
            (text(), text()).prop_map(|(url, pointer)| Probe::Http { url, pointer }),
            prop::collection::vec(text(), 0..3).prop_map(|command| Probe::Exec { command }),
        ]),
    );
    (names, numbers, rest).prop_map(
        |(
            (name, project, kind, gpus, mig, members, gpu_models, priority_class),
            (cpu_millis, memory_mib, same_node, preemptible, grace, min_rt, max_rt),
            (command, env, probe),
        )| SubmitRequest {
            name,
            project,
            kind,
            gpus,
            mig,
            members,
            gpu_models,
            priority_class,
            cpu_millis,
            memory_mib,
            same_node,
            preemptible,
            checkpoint_grace_s: grace,
            min_runtime_s: min_rt,
            max_runtime_s: max_rt,
            command,
            env,
            probe,
        },
    )
}

pub(super) fn members() -> impl Strategy<Value = Vec<MemberLaunch>> {
    let device = (any::<u32>(), prop::option::of(text()), any::<bool>(), 0u64..=1000).prop_map(
        |(index, uuid, amd, shares)| DeviceAssignment {
            index,
            uuid,
            vendor: if amd { Vendor::Amd } else { Vendor::Nvidia },
            shares,
        },
    );
    prop::collection::vec(
        (text(), prop::collection::vec(device, 0..3))
            .prop_map(|(node, devices)| MemberLaunch { node, devices }),
        0..3,
    )
}

pub(super) fn nodes() -> impl Strategy<Value = Vec<SavedNode>> {
    let device = (text(), any::<u64>(), any::<u32>(), any::<bool>()).prop_map(
        |(model, memory_mib, island, mig)| SavedDevice { model, memory_mib, island, mig },
    );
    let node =
        (
            text(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::btree_map(text(), text(), 0..3),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::collection::vec(device, 0..4),
        )
            .prop_map(|(name, cpu_millis, memory_mib, labels, pool, rack, devices)| {
                SavedNode { name, cpu_millis, memory_mib, labels, pool, rack, devices }
            });
    prop::collection::vec(node, 0..4)
}

fn reading() -> impl Strategy<Value = Reading> {
    (
        any::<u32>(),
        any::<u32>(),
        prop::option::of(any::<u16>()),
        prop::option::of(any::<u16>()),
        prop::option::of(any::<u16>()),
    )
        .prop_map(|(member, shares, sm_active, engine_active, utilisation)| Reading {
            member,
            shares,
            sm_active,
            engine_active,
            utilisation,
        })
}

/// Any entry, of every kind.
fn entry() -> impl Strategy<Value = Entry> {
    let id = any::<u64>();
    let attempt = any::<u32>();
    prop_oneof![
        (id, text(), request()).prop_map(|(id, user, request)| Entry::Submitted {
            id,
            user,
            request
        }),
        id.prop_map(|id| Entry::CancelRequested { id }),
        id.prop_map(|id| Entry::SuspendRequested { id }),
        id.prop_map(|id| Entry::ResumeRequested { id }),
        (id, attempt, prop::collection::vec(any::<u32>(), 0..4))
            .prop_map(|(id, attempt, pids)| Entry::Started { id, attempt, pids }),
        (id, attempt, text(), any::<bool>()).prop_map(|(id, attempt, error, requeue)| {
            Entry::LaunchFailed { id, attempt, error, requeue }
        }),
        (id, attempt, prop::option::of(any::<i32>()), text(), any::<bool>()).prop_map(
            |(id, attempt, code, detail, cancelled)| Entry::Exited {
                id,
                attempt,
                code,
                detail,
                cancelled
            }
        ),
        (id, any::<u64>())
            .prop_map(|(id, last_activity_ms)| Entry::Probed { id, last_activity_ms }),
        (id, any::<u64>()).prop_map(|(id, at_ms)| Entry::CheckpointReported { id, at_ms }),
        prop::collection::vec(id, 0..4).prop_map(|ids| Entry::TelemetryMissing { ids }),
        prop::collection::btree_map(id, prop::collection::vec(reading(), 0..3), 0..4)
            .prop_map(|workloads| Entry::Sampled { workloads }),
        Just(Entry::Decided),
        (
            (text(), text(), proptest::option::of(text()), proptest::option::of(1u32..100)),
            (
                proptest::option::of(rollout_plan()),
                proptest::option::of(text()),
                proptest::option::of(whatif_shown()),
            ),
        )
            .prop_map(|((source, text, by, rollback_of), (rollout, why, whatif))| {
                Entry::PolicyApplied { source, text, by, rollback_of, rollout, why, whatif }
            }),
        (
            id,
            text(),
            request(),
            text(),
            members(),
            prop::option::of(any::<u64>()),
            prop::option::of(text())
        )
            .prop_map(|(id, user, request, handle, running, started_ms, refusal)| {
                Entry::Imported { id, user, request, handle, running, started_ms, refusal }
            }),
        id.prop_map(|id| Entry::ForeignGone { id }),
        (text(), any::<bool>(), text()).prop_map(|(node, usable, reason)| Entry::NodeState {
            node,
            usable,
            reason
        }),
        (id, attempt, members()).prop_map(|(id, attempt, members)| Entry::DevicesReported {
            id,
            attempt,
            members
        }),
        (id, attempt).prop_map(|(id, attempt)| Entry::Kept { id, attempt }),
        nodes().prop_map(|nodes| Entry::InventoryReported { nodes }),
        text().prop_map(|error| Entry::BackendUnreachable { error }),
        Just(Entry::BackendReachable),
        (id, attempt, text()).prop_map(|(id, attempt, error)| Entry::LaunchDeferred {
            id,
            attempt,
            error
        }),
        (text(), prop::collection::vec(any::<u32>(), 0..4), text())
            .prop_map(|(node, devices, by)| Entry::Occupied { node, devices, by }),
        (text(), text(), text()).prop_map(|(source, text, by)| Entry::ShadowStarted {
            source,
            text,
            by
        }),
        Just(Entry::ShadowStopped),
    ]
}

/// A store in a fresh temporary directory (removed on drop).
pub(super) struct TempStore {
    pub dir: std::path::PathBuf,
    pub store: SqliteStore,
}

impl TempStore {
    pub(super) fn new(name: &str) -> TempStore {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("allot-roundtrip-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = SqliteStore::open(&dir).expect("a store in a temporary directory");
        TempStore { dir, store }
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn every_entry_reads_back_equal_through_the_store(
        entries in prop::collection::vec(entry(), 1..12)
    ) {
        let mut t = TempStore::new("entries");
        let bodies: Vec<String> =
            entries.iter().map(|e| serde_json::to_string(e).expect("encodes")).collect();
        let records: Vec<NewRecord<'_>> = entries
            .iter()
            .zip(&bodies)
            .map(|(e, b)| NewRecord { at_ms: 1, kind: e.kind(), body: b })
            .collect();
        t.store.append(&records).expect("append");
        let read = t.store.read_after(0, 1000).expect("read");
        prop_assert_eq!(read.len(), entries.len());
        for (record, original) in read.iter().zip(&entries) {
            prop_assert_eq!(&record.kind, original.kind());
            let back: Entry = serde_json::from_str(&record.body)
                .map_err(|e| TestCaseError::fail(format!("{} does not read back: {e}", record.body)))?;
            prop_assert_eq!(&back, original);
        }
    }
}

#[test]
fn the_generator_covers_every_entry_kind() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = entry();
    let mut seen = BTreeSet::new();
    for _ in 0..5_000 {
        let e = strategy.new_tree(&mut runner).expect("a value").current();
        assert_eq!(ENTRY_KINDS[kind_index(&e)], e.kind(), "ENTRY_KINDS is in declaration order");
        seen.insert(kind_index(&e));
    }
    let missing: Vec<&str> =
        (0..ENTRY_KINDS.len()).filter(|i| !seen.contains(i)).map(|i| ENTRY_KINDS[i]).collect();
    assert!(missing.is_empty(), "kinds the generator never made: {missing:?}");
}

/// Issue 18's first reproduction: a map keyed by ids inside the internally tagged enum.
#[test]
fn a_sampled_entry_with_ids_reads_back() {
    let mut workloads = BTreeMap::new();
    workloads.insert(
        1u64,
        vec![Reading {
            member: 0,
            shares: 1000,
            sm_active: Some(700),
            engine_active: None,
            utilisation: None,
        }],
    );
    let e = Entry::Sampled { workloads };
    let body = serde_json::to_string(&e).expect("encodes");
    assert_eq!(serde_json::from_str::<Entry>(&body).expect("reads back"), e);
}

/// A what-if shown before an apply, as logged with its version.
pub(super) fn whatif_shown() -> impl Strategy<Value = allot_api::WhatIfShown> {
    let figures = || {
        prop::array::uniform6(any::<u64>()).prop_map(|f| allot_api::WhatIfFigures {
            wait_p50_ms: f[0],
            wait_p95_ms: f[1],
            allocated_milli_gpu_hours: f[2],
            lost_milli_gpu_hours: f[3],
            preemptions: f[4],
            finished: f[5],
        })
    };
    (
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
        figures(),
        figures(),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(
            |((run, at_ms, active_version, jobs), active, candidate, fidelity_gap_pct)| {
                allot_api::WhatIfShown {
                    run,
                    at_ms,
                    active_version,
                    jobs,
                    active,
                    candidate,
                    fidelity_gap_pct,
                }
            },
        )
}

/// A rollout's plan, as logged with its version.
pub(super) fn rollout_plan() -> impl Strategy<Value = super::rollout::RolloutPlan> {
    use super::rollout::RolloutPlan;
    use allot_config::rollout::Condition;
    let condition =
        (0usize..5, any::<u64>(), any::<bool>()).prop_map(|(m, limit_milli, relative)| {
            let text = [
                "failure_rate>1",
                "p95_wait>1",
                "lost_gpu_hours_per_day>1",
                "gpu_hours_per_finished>1",
                "false_idle_reclaims>1",
            ][m];
            Condition { limit_milli, relative, ..Condition::parse(text).expect("metric") }
        });
    (
        (text(), text(), prop::collection::vec(condition, 0..3)),
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (prop::collection::vec(text(), 0..3), prop::collection::vec(text(), 0..3)),
    )
        .prop_map(
            |(
                (scope, candidate, conditions),
                (baseline_ms, false_reclaim_within_ms, min_sample),
                (carried, left_out),
            )| {
                RolloutPlan {
                    scope,
                    candidate,
                    conditions,
                    baseline_ms,
                    false_reclaim_within_ms,
                    min_sample,
                    carried,
                    left_out,
                }
            },
        )
}
