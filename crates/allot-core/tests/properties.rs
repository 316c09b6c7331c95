//! Property tests: random small clusters, policies and event sequences, with the engine's
//! invariants checked after every step (STYLE.md, testing tier 3).
//!
//! After every step: `Engine::audit` holds (no device share or CPU held twice, free + held =
//! capacity, quota usage = allocations, usage ≤ guarantee + allowed borrowing).
//! After every `decide`:
//! - each pending workload gets exactly one `Admit` or `Defer`, each rejected submission one
//!   `Reject`, and nothing else gets one;
//! - every victim was running, is preemptible, has run its min runtime, is not within the
//!   policy's guard against thrash (restarted too recently, or pre-empted `count` times within
//!   the window), and goes once;
//! - a `Priority` pre-emption is inside one project and follows its `preempt_within_project`
//!   (strictly outranks its victim; or the same priority and the victim queued later; or
//!   never);
//! - a `ReclaimWhileBorrowing` victim's project borrows, as for `QuotaReclaim`, and the
//!   claimant's `borrow_within_cohort` allows it (below the claimant and the threshold);
//! - a `QuotaReclaim` victim's project was still borrowing (by its lasting usage: workloads
//!   told to stop do not count, waiting pre-emptors do) when its last victim was chosen, and
//!   the claimant ends within its guarantee;
//! - a `FairShare` victim (fair sharing on) is another borrower's of the claimant's cohort, by
//!   a strategy of the policy whose test its reported shares pass;
//! - a `Defragment` victim is of a priority no higher than its claimant's, is suspended or
//!   requeued (never deleted), and another project is left below its guarantee only by a plan
//!   whose every victim can restart elsewhere at once (a fifth of the generated histories are
//!   built to fragment the cluster, with defragmentation on, some with a node drained; as many
//!   again fill it with fractional work and consolidate shares), and a plan moves at most the
//!   policy's `victims_max`;
//! - no `Admit` places a member on a node the history made unavailable
//!   (`Event::NodeUnavailable`, flipped at random, sometimes for a node that does not exist),
//!   and a `NodesUnavailable` deferral names only such nodes;
//! - no `Admit` places a member on a device the history said foreign work holds
//!   (`Event::DevicesOccupied`, random device sets, sometimes past the node's devices);
//! - work held for a reservation (`HeldForReservation`, `QuotaHeldForReservation`) is never
//!   held for a workload that strict FIFO keeps behind its project's head;
//! - on an idle cluster (nothing admitted, running or stopping; every node up; no foreign
//!   work) a cycle that holds something for someone (those two, or `HeldForClaimant`) admits
//!   something: nothing waits on itself;
//! - replaying the same events on a fresh engine gives the same decisions, byte for byte.
//!
//! A second property builds random clusters (racks, pools, islands) with a settled mix, empties
//! one node, and checks that a gang that fits that node alone is admitted in every layout.
//!
//! The test keeps its own model of what it submitted (project, priority, preemptibility, min
//! runtime, start times) rather than asking the engine for it.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::{
    BorrowWithinCohort, Checkpointing, Decision, DeferReason, Defragmentation, DeviceSpec, Engine,
    Event, FairShareStrategy, FairSharing, GpuRequest, MigGpu, NodeId, NodeSpec, PolicySpec,
    PreemptReason, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec,
    Refresh, Shares, Stage, Timestamp, WithinProject, WorkloadId, WorkloadSpec,
};
use proptest::prelude::*;

// ----- raw, shrinkable inputs ------------------------------------------------------------------

#[derive(Clone, Debug)]
struct RawNode {
    /// (model index, island) per device.
    devices: Vec<(u8, u8)>,
    cpu_cores: u64,
}

#[derive(Clone, Debug)]
struct RawLine {
    /// `None`: the `any` line.
    model: Option<u8>,
    guaranteed: u64,
    borrow: Option<u64>,
    lend: Option<u64>,
}

#[derive(Clone, Debug)]
struct RawProject {
    cohort: Option<u8>,
    lines: Vec<RawLine>,
    weight_milli: u64,
    strict: bool,
    mode: Option<u8>,
    /// 0 lower priority (default), 1 lower or newer equal priority, 2 never.
    within: u8,
    /// `borrow_within_cohort`, with its threshold if any.
    borrow_within: Option<Option<i32>>,
}

#[derive(Clone, Debug)]
struct RawSubmit {
    /// An index modulo the project count; every tenth value names an unknown project.
    project: u8,
    /// An index modulo the class count; every twentieth value names an unknown class.
    class: Option<u8>,
    whole: Option<u32>,
    shares: u32,
    members: u32,
    /// Indexes modulo the model count; every sixteenth value names a model nobody has.
    models: Vec<u8>,
    same_node: bool,
    cpu_cores: u64,
    min_runtime_ms: u64,
    max_runtime_ms: Option<u64>,
    fixed: bool,
    checkpoint_grace_ms: Option<u64>,
    /// Reuse an earlier id (a duplicate submission) instead of a fresh one.
    duplicate: bool,
}

#[derive(Clone, Debug)]
enum RawOp {
    Submit(RawSubmit),
    /// kind 0..6: start, fail, stop, finish, cancel, checkpoint. `id` is taken modulo one more
    /// than the ids submitted so far, so that it may name a workload never submitted.
    Event {
        kind: u8,
        id: u64,
    },
    Decide,
    Settle,
    /// The cluster reports node `node` (modulo one more than the node count, so that it may
    /// name no node) unavailable, or available again (`up`).
    Node {
        node: u8,
        up: bool,
    },
    /// Work allot does not govern holds the devices of node `node` (taken as for `Node`)
    /// whose bits are set in `mask` (the whole set: 0 frees them all; bits past the node's
    /// devices name no device).
    Occupy {
        node: u8,
        mask: u8,
    },
}

#[derive(Clone, Debug)]
struct RawCase {
    models: u8,
    nodes: Vec<RawNode>,
    classes: Vec<(i32, bool)>,
    half_life_ms: u64,
    /// `% 3`: the pre-emption mode; `/ 3`: fair sharing (0 off, 1 both strategies, 2 the
    /// final-share test, 3 the initial-share test).
    mode: u8,
    projects: Vec<RawProject>,
    steps: Vec<(u64, RawOp)>,
    /// Defragmentation's restart cost per GPU, when on.
    defrag: Option<u64>,
    /// Defragmentation's `consolidate_shares` and `victims_max`.
    consolidate: bool,
    victims_max: Option<u32>,
    /// The guard against pre-emption thrash (`guard_of`): 0 off.
    guard: u8,
    /// Reservations (after ms, per model max), when on.
    reserve: Option<(u64, u32, bool)>,
}

fn raw_line() -> impl Strategy<Value = RawLine> {
    (
        prop::option::weighted(0.7, 0u8..3),
        prop_oneof![1 => Just(0u64), 6 => 1u64..=8],
        any::<bool>(),
        prop::option::of(0u64..=6),
        prop::option::of(0u64..=6),
    )
        .prop_map(|(model, g, half, borrow, lend)| RawLine {
            model,
            guaranteed: g * 1000 + if half { 500 } else { 0 },
            borrow: borrow.map(|b| b * 1000),
            lend: lend.map(|l| l * 1000),
        })
}

fn raw_project() -> impl Strategy<Value = RawProject> {
    (
        prop::option::weighted(0.8, prop_oneof![3 => Just(0u8), 1 => 1u8..3]),
        prop::collection::vec(raw_line(), 1..=3),
        prop_oneof![Just(1000u64), Just(500), Just(3000), Just(0)],
        prop::bool::weighted(0.3),
        prop::option::weighted(0.3, 0u8..3),
        (
            prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)],
            prop::option::weighted(0.2, prop::option::of(-2i32..=2)),
        ),
    )
        .prop_map(|(cohort, lines, weight_milli, strict, mode, (within, borrow_within))| {
            RawProject { cohort, lines, weight_milli, strict, mode, within, borrow_within }
        })
}

fn raw_submit() -> impl Strategy<Value = RawSubmit> {
    (
        (any::<u8>(), prop::option::weighted(0.6, any::<u8>())),
        (
            prop::option::weighted(0.8, prop_oneof![1 => Just(0u32), 6 => 1u32..=2, 2 => 3u32..=4]),
            1u32..=999,
            prop_oneof![4 => Just(1u32), 1 => 2u32..=3],
        ),
        (
            prop_oneof![2 => Just(Vec::new()), 1 => prop::collection::vec(any::<u8>(), 1..=2)],
            prop::bool::weighted(0.3),
            0u64..=24,
        ),
        (
            prop_oneof![3 => Just(0u64), 1 => Just(1000), 1 => Just(3000)],
            prop::option::weighted(0.2, 1u64..=10),
        ),
        (
            prop::bool::weighted(0.1),
            prop::option::weighted(0.2, 0u64..=2000),
            prop::bool::weighted(0.05),
        ),
    )
        .prop_map(
            |(
                (project, class),
                (whole, shares, members),
                (models, same_node, cpu_cores),
                (min_runtime_ms, max_runtime),
                (fixed, checkpoint_grace_ms, duplicate),
            )| RawSubmit {
                project,
                class,
                whole,
                shares,
                members,
                models,
                same_node,
                cpu_cores,
                min_runtime_ms,
                max_runtime_ms: max_runtime.map(|m| m * 1000),
                fixed,
                checkpoint_grace_ms,
                duplicate,
            },
        )
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    prop_oneof![
        9 => raw_submit().prop_map(RawOp::Submit),
        5 => (0u8..6, any::<u64>()).prop_map(|(kind, id)| RawOp::Event { kind, id }),
        3 => Just(RawOp::Decide),
        5 => Just(RawOp::Settle),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(node, up)| RawOp::Node { node, up }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(node, mask)| RawOp::Occupy { node, mask }),
    ]
}

/// Half the cases are dense: one model, one cohort, distinct priorities and small requests,
/// so that borrowing, reclaim and priority pre-emption happen often.
/// Two in five of them with reservations (a wait within the steps' spacing, 1 to 3 per
/// model, quota held too in half), so that reservations are made, held, opened for backfill
/// and dropped. Half of those give every other submission a max runtime (1 to 7 s) where it
/// has none: starts become known, so that backfill happens, and workloads of one shape differ
/// in whether they may backfill.
fn raw_case() -> impl Strategy<Value = RawCase> {
    (
        prop_oneof![
            2 => raw_case_general(),
            2 => raw_case_dense(),
            1 => raw_case_fragmented(),
            1 => raw_case_consolidating()
        ],
        prop::option::weighted(0.4, (1u64..=4000, 1u32..=3, any::<bool>())),
        any::<bool>(),
    )
        .prop_map(|(mut case, reserve, limits)| {
            if reserve.is_some() && limits {
                let submits = case.steps.iter_mut().filter_map(|(_, op)| match op {
                    RawOp::Submit(s) => Some(s),
                    _ => None,
                });
                for (i, s) in submits.enumerate() {
                    if i % 2 == 0 && s.max_runtime_ms.is_none() {
                        s.max_runtime_ms = Some(1000 * (1 + i as u64 % 7));
                    }
                }
            }
            case.reserve = reserve;
            case
        })
}

/// Defragmentation-heavy: one model, two projects in one cohort, small nodes filled with small
/// jobs (some checkpointable, some of a higher class), a random part of them finished or
/// checkpointed, then larger jobs and gangs that find the free GPUs enough in total but
/// scattered, decided after a long wait (so that gain often beats cost) and again later.
fn raw_case_fragmented() -> impl Strategy<Value = RawCase> {
    let small = (
        0u8..2,
        prop::option::weighted(0.3, 0u8..3),
        prop::option::weighted(0.6, 0u64..=500),
        prop_oneof![3 => Just(1u32), 1 => Just(2u32)],
    )
        .prop_map(|(project, class, checkpoint, whole)| RawSubmit {
            project,
            class,
            whole: Some(whole),
            shares: 500,
            members: 1,
            models: Vec::new(),
            same_node: false,
            cpu_cores: 0,
            min_runtime_ms: 0,
            max_runtime_ms: None,
            fixed: false,
            checkpoint_grace_ms: checkpoint,
            duplicate: false,
        });
    let big = (
        0u8..2,
        prop::option::weighted(0.5, 0u8..3),
        2u32..=4,
        prop_oneof![3 => Just(1u32), 1 => Just(2u32)],
        prop::bool::weighted(0.3),
    )
        .prop_map(|(project, class, whole, members, same_node)| RawSubmit {
            project,
            class,
            whole: Some(whole),
            shares: 500,
            members,
            models: Vec::new(),
            same_node,
            cpu_cores: 0,
            min_runtime_ms: 0,
            max_runtime_ms: None,
            fixed: false,
            checkpoint_grace_ms: None,
            duplicate: false,
        });
    let project = (4u64..=16, prop::option::of(0u64..=8)).prop_map(|(g, borrow)| RawProject {
        cohort: Some(0),
        lines: vec![RawLine {
            model: Some(0),
            guaranteed: g * 1000,
            borrow: borrow.map(|b| b * 1000),
            lend: None,
        }],
        weight_milli: 1000,
        strict: false,
        mode: None,
        within: 0,
        borrow_within: None,
    });
    (
        prop::collection::vec(
            (2usize..=4).prop_map(|n| RawNode { devices: vec![(0, 0); n], cpu_cores: 256 }),
            2..=5,
        ),
        (0u8..2, prop::collection::vec(project, 2..=2), 0u64..=300_000),
        prop::collection::vec(small, 4..=20),
        (prop::collection::vec(any::<u64>(), 1..=10), prop::collection::vec(any::<u64>(), 0..=6)),
        prop::collection::vec(big, 1..=3),
        (
            1u64..=1_000_000,
            prop::collection::vec(any::<u64>(), 0..=4),
            prop::option::weighted(0.4, any::<u8>()),
        ),
    )
        .prop_map(
            |(
                nodes,
                (mode, projects, restart),
                smalls,
                (finish, ckpt),
                bigs,
                (wait, later, drained),
            )| {
                let n_small = smalls.len() as u64;
                let mut steps: Vec<(u64, RawOp)> = Vec::new();
                steps.extend(smalls.into_iter().map(|s| (0, RawOp::Submit(s))));
                steps.push((0, RawOp::Settle));
                // Ids 1..=n_small are the small jobs: `Event { id }` names id + 1 while id < next.
                steps.extend(finish.iter().map(|f| (1, RawOp::Event { kind: 3, id: f % n_small })));
                steps
                    .extend(ckpt.iter().map(|c| (1000, RawOp::Event { kind: 5, id: c % n_small })));
                // Sometimes a node is drained while its work still runs.
                steps.extend(drained.map(|node| (0, RawOp::Node { node, up: false })));
                steps.extend(bigs.into_iter().map(|b| (1, RawOp::Submit(b))));
                steps.push((wait, RawOp::Settle));
                steps.extend(
                    later.iter().map(|f| (1000, RawOp::Event { kind: 3, id: f % n_small })),
                );
                steps.push((wait, RawOp::Settle));
                RawCase {
                    models: 1,
                    nodes,
                    classes: vec![(0, true), (1, true), (2, true)],
                    half_life_ms: 0,
                    mode,
                    projects,
                    steps,
                    defrag: Some(restart),
                    consolidate: false,
                    victims_max: None,
                    guard: 0,
                    reserve: None,
                }
            },
        )
}

fn raw_case_dense() -> impl Strategy<Value = RawCase> {
    let line = (
        prop::bool::weighted(0.5),
        1u64..=4,
        prop::option::of(0u64..=4),
        prop::option::of(0u64..=4),
    )
        .prop_map(|(any_line, g, borrow, lend)| RawLine {
            model: (!any_line).then_some(0),
            guaranteed: g * 1000,
            borrow: borrow.map(|b| b * 1000),
            lend: lend.map(|l| l * 1000),
        });
    let project = (
        line,
        prop::bool::weighted(0.2),
        prop::option::weighted(0.3, 0u8..3),
        (0u8..3, prop::option::weighted(0.3, prop::option::of(-1i32..=1))),
    )
        .prop_map(|(line, strict, mode, (within, borrow_within))| RawProject {
            cohort: Some(0),
            lines: vec![line],
            weight_milli: 1000,
            strict,
            mode,
            within,
            borrow_within,
        });
    (
        prop::collection::vec(
            (2usize..=6).prop_map(|n| RawNode { devices: vec![(0, 0); n], cpu_cores: 256 }),
            1..=3,
        ),
        2usize..=3,
        0u8..12,
        prop::collection::vec(project, 2..=4),
        prop::collection::vec((0u64..=3000, raw_op()), 20..=60),
        prop::option::weighted(0.5, 0u64..=2000),
        0u8..12,
    )
        .prop_map(|(nodes, n_classes, mode, projects, steps, defrag, guard)| RawCase {
            models: 1,
            nodes,
            classes: (0..n_classes).map(|c| (c as i32 - 1, true)).collect(),
            half_life_ms: 0,
            mode,
            projects,
            steps,
            defrag,
            consolidate: false,
            victims_max: None,
            guard,
            reserve: None,
        })
}

fn raw_case_general() -> impl Strategy<Value = RawCase> {
    (
        prop_oneof![2 => Just(1u8), 1 => 2u8..=3],
        prop::collection::vec(
            (
                prop::collection::vec((0u8..3, 0u8..2), 1..=8),
                prop_oneof![Just(16u64), Just(64), Just(256)],
            )
                .prop_map(|(devices, cpu_cores)| RawNode { devices, cpu_cores }),
            1..=6,
        ),
        prop::collection::vec((-2i32..=2, prop::bool::weighted(0.85)), 1..=3),
        prop_oneof![Just(0u64), Just(5000), Just(60_000)],
        0u8..12,
        prop::collection::vec(raw_project(), 1..=6),
        prop::collection::vec((0u64..=3000, raw_op()), 1..=60),
        prop::option::weighted(0.3, 0u64..=2000),
        0u8..6,
    )
        .prop_map(
            |(models, nodes, classes, half_life_ms, mode, projects, steps, defrag, guard)| {
                RawCase {
                    models,
                    nodes,
                    classes,
                    half_life_ms,
                    mode,
                    projects,
                    steps,
                    defrag,
                    // Half the cases with defragmentation consolidate shares too; a third cap
                    // the victims per plan (0–2).
                    consolidate: defrag.is_some_and(|r| r % 2 == 1),
                    victims_max: defrag.filter(|r| r % 3 == 0).map(|r| (r / 3 % 3) as u32),
                    guard,
                    reserve: None,
                }
            },
        )
}

/// `raw_case_fragmented` with consolidation on: most one-GPU jobs become fractional (250, 350
/// or 750 shares) and some claimants ask shares, so that plans move fractional work to open a
/// device; a third of the cases cap the victims per plan.
fn raw_case_consolidating() -> impl Strategy<Value = RawCase> {
    raw_case_fragmented().prop_map(|mut case| {
        let mut n = 0u32;
        for (_, op) in &mut case.steps {
            if let RawOp::Submit(s) = op
                && s.members == 1
                && s.whole.is_some_and(|w| w <= 2)
            {
                n += 1;
                if !n.is_multiple_of(4) {
                    s.whole = None;
                    s.shares = [250, 350, 750][n as usize % 3];
                }
            }
        }
        let restart = case.defrag.unwrap_or(0);
        case.consolidate = true;
        case.victims_max = (restart % 3 == 0).then_some((restart / 3 % 3) as u32);
        case
    })
}

/// Protections short enough to start and end within a case's steps (0–3 s apart); from 6 up,
/// with a claimant's reclaim delayed 1.5 s.
fn guard_of(raw: u8) -> allot_core::PreemptionGuard {
    use allot_core::{PreemptionGuard, PreemptionLimit};
    let reclaim_after_ms = if raw >= 6 { 1_500 } else { 0 };
    let raw = raw % 6;
    let exempt_after_restart_ms = [0, 2_000, 8_000][raw as usize % 3];
    // A short window (times leave it within a history) and a long one (the cap bites).
    let window_ms = if raw == 3 { 5_000 } else { 600_000 };
    let limit = (raw >= 3).then_some(PreemptionLimit { count: 1 + u32::from(raw % 2), window_ms });
    PreemptionGuard { exempt_after_restart_ms, limit, reclaim_after_ms }
}

// ----- a concrete case ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Submit(WorkloadSpec),
    Event(Event),
    Decide,
    Settle,
}

#[derive(Clone, Debug)]
struct Case {
    nodes: Vec<NodeSpec>,
    policy: PolicySpec,
    /// (time, step); times never go back.
    steps: Vec<(Timestamp, Step)>,
}

fn mode_of(m: u8) -> PreemptionMode {
    match m % 3 {
        0 => PreemptionMode::Suspend,
        1 => PreemptionMode::Requeue,
        _ => PreemptionMode::Delete,
    }
}

/// Model 0 is an A100-80GB, MIG-enabled on its island-1 devices.
fn model_name(m: u8) -> String {
    if m == 0 { "A100-80GB".into() } else { format!("M{m}") }
}

/// Turns raw input into a valid cluster and policy (lend ≤ guarantee, no limits without a
/// cohort, one line per key) and a step list with ids.
fn build(raw: &RawCase) -> Case {
    let n_models = raw.models;
    let nodes = raw
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: format!("n{i}"),
            cpu_millis: n.cpu_cores * 1000,
            memory_mib: 1024 * 1024,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: n
                .devices
                .iter()
                .map(|&(m, island)| DeviceSpec {
                    model: model_name(m % n_models),
                    memory_mib: 81920,
                    island: u32::from(island),
                    mig: m % n_models == 0 && island == 1,
                })
                .collect(),
        })
        .collect();
    let classes: Vec<PriorityClassSpec> = raw
        .classes
        .iter()
        .enumerate()
        .map(|(i, &(value, preemptible))| PriorityClassSpec {
            name: format!("c{i}"),
            value,
            preemptible,
        })
        .collect();
    let projects = raw
        .projects
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut quotas: BTreeMap<QuotaModel, QuotaSpec> = BTreeMap::new();
            for l in &p.lines {
                let model = match l.model {
                    Some(m) => QuotaModel::Model(model_name(m % n_models)),
                    None => QuotaModel::Any,
                };
                let in_cohort = p.cohort.is_some();
                quotas.entry(model.clone()).or_insert(QuotaSpec {
                    model,
                    guaranteed: Shares(l.guaranteed),
                    borrow_limit: l.borrow.filter(|_| in_cohort).map(Shares),
                    lend_limit: l.lend.filter(|_| in_cohort).map(|x| Shares(x.min(l.guaranteed))),
                });
            }
            ProjectSpec {
                name: format!("p{i}"),
                cohort: p.cohort.map(|c| format!("co{c}")),
                department: None,
                quotas: quotas.into_values().collect(),
                weight_milli: p.weight_milli,
                queueing: if p.strict { Queueing::StrictFifo } else { Queueing::BestEffortFifo },
                preemption_mode: p.mode.map(mode_of),
                preempt_within_project: [
                    WithinProject::LowerPriority,
                    WithinProject::LowerOrNewerEqualPriority,
                    WithinProject::Never,
                ][p.within as usize % 3],
                borrow_within_cohort: p
                    .borrow_within
                    .map(|max_priority_threshold| BorrowWithinCohort { max_priority_threshold }),
            }
        })
        .collect::<Vec<_>>();
    let n_projects = projects.len() as u8;
    let n_classes = classes.len() as u8;
    let policy = PolicySpec {
        default_priority_class: classes[0].name.clone(),
        priority_classes: classes,
        projects,
        fair_share_half_life_ms: raw.half_life_ms,
        preemption_mode: mode_of(raw.mode),
        preemption_guard: guard_of(raw.guard),
        defragmentation: raw.defrag.map(|restart_cost_ms| Defragmentation {
            restart_cost_ms,
            consolidate_shares: raw.consolidate,
            victims_max: raw.victims_max,
        }),
        idle: Vec::new(),
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS,
        cohorts: Vec::new(),
        fair_sharing: match raw.mode / 3 {
            0 => None,
            1 => Some(FairSharing::default()),
            2 => Some(FairSharing {
                strategies: vec![FairShareStrategy::LessThanOrEqualToFinalShare],
            }),
            _ => Some(FairSharing { strategies: vec![FairShareStrategy::LessThanInitialShare] }),
        },
        reservations: raw.reserve.map(|(after_ms, per_model_max, hold_quota)| {
            allot_core::Reservations { after_ms, per_model_max, hold_quota }
        }),
    };

    let mut now = 0u64;
    let mut next_id = 1u64;
    let mut steps = Vec::new();
    for (dt, op) in &raw.steps {
        now += dt;
        let step = match op {
            RawOp::Submit(s) => {
                let id = if s.duplicate && next_id > 1 {
                    next_id - 1
                } else {
                    next_id += 1;
                    next_id - 1
                };
                let project = if s.project % 10 == 9 {
                    "nope".into()
                } else {
                    format!("p{}", s.project % n_projects)
                };
                let gpus = match s.whole {
                    Some(n) => GpuRequest::Whole(n),
                    // Every fourth fractional request asks a MIG instance instead.
                    None if s.shares % 4 == 0 => {
                        let profiles = MigGpu::A100M80.profiles();
                        GpuRequest::Mig(profiles[(s.shares / 4) as usize % profiles.len()].profile)
                    }
                    None => GpuRequest::Shares(s.shares),
                };
                let mut spec = WorkloadSpec::new(id, &format!("w{id}"), &project, gpus);
                spec.members = s.members;
                spec.priority_class = s.class.map(|c| {
                    if c % 20 == 19 { "nope".into() } else { format!("c{}", c % n_classes) }
                });
                spec.gpu_models = s
                    .models
                    .iter()
                    .map(|&m| if m % 16 == 15 { "X".into() } else { model_name(m % n_models) })
                    .collect();
                spec.same_node = s.same_node;
                spec.cpu_millis_per_member = s.cpu_cores * 1000;
                spec.min_runtime_ms = s.min_runtime_ms;
                spec.max_runtime_ms = s.max_runtime_ms;
                spec.preemptible = s.fixed.then_some(false);
                spec.checkpointing = s
                    .checkpoint_grace_ms
                    .map(|grace_ms| Checkpointing { grace_ms, last_checkpoint_at: None });
                Step::Submit(spec)
            }
            &RawOp::Event { kind, id } => {
                let workload = WorkloadId(1 + id % next_id);
                Step::Event(match kind {
                    0 => Event::AllocationStarted { workload },
                    1 => Event::AllocationFailed { workload, reason: "property".into() },
                    2 => Event::WorkloadStopped { workload },
                    3 => Event::WorkloadFinished { workload },
                    4 => Event::WorkloadCancelled { workload },
                    _ => Event::CheckpointSaved { workload },
                })
            }
            RawOp::Decide => Step::Decide,
            RawOp::Settle => Step::Settle,
            &RawOp::Node { node, up } => {
                let node = NodeId(u32::from(node) % (raw.nodes.len() as u32 + 1));
                Step::Event(if up {
                    Event::NodeAvailable { node }
                } else {
                    Event::NodeUnavailable { node, reason: format!("drained at {now}") }
                })
            }
            &RawOp::Occupy { node, mask } => {
                let node = NodeId(u32::from(node) % (raw.nodes.len() as u32 + 1));
                let devices = (0..8u16).filter(|d| mask & (1 << d) != 0).collect();
                Step::Event(Event::DevicesOccupied { node, devices, by: format!("foreign {now}") })
            }
        };
        steps.push((Timestamp(now), step));
    }
    Case { nodes, policy, steps }
}

// ----- the test's own model of the workloads -----------------------------------------------------

/// What the test knows about a workload it submitted and the engine accepted.
#[derive(Clone, Debug)]
struct Known {
    project: String,
    priority: i32,
    preemptible: bool,
    min_runtime_ms: u64,
    total: Shares,
    submitted_at: Timestamp,
    /// Set when the engine moved it from admitted to running.
    started_at: Option<Timestamp>,
    /// Told to stop for other work, and not stopped yet.
    stopping_preempted: bool,
    /// When each of its pre-emptions took effect (its stop), oldest first.
    preempted_at: Vec<Timestamp>,
}

/// Quota line of a project by key name ("any" or a model name).
#[derive(Clone, Debug)]
struct Line {
    guaranteed: Shares,
}

struct Checker<'a> {
    case: &'a Case,
    engine: Engine,
    known: BTreeMap<WorkloadId, Known>,
    /// Per project: key name → line.
    lines: BTreeMap<String, BTreeMap<String, Line>>,
    cohort: BTreeMap<String, String>,
    /// Waiting pre-emptors: id → (project, key, shares).
    waiting: BTreeMap<WorkloadId, (String, String, Shares)>,
    /// Submissions since the last decide that the engine must reject, by id.
    rejects_due: Vec<WorkloadId>,
    transcript: Vec<String>,
    /// After every decide, save the engine's state and go on with the engine rebuilt from it
    /// (it must equal the original, field for field).
    restore_each_cycle: bool,
    /// Nodes the history made unavailable (and that exist), by the test's own count.
    down: BTreeSet<NodeId>,
    /// Devices held by work allot does not govern, as the history last said.
    occupied: BTreeMap<NodeId, BTreeSet<u16>>,
    /// With `engine` running reference cycles: the engine as production runs it, fed the
    /// same history and asked `decide_changes` (or, with a `Refresh`, `decide_news`), with
    /// the deferral last seen per workload and when. The simulator's replay asks
    /// `decide_news` with `Refresh::KINDS_ONLY`, the daemon with its default.
    incremental: Vec<Follower>,
}

/// An engine fed the checker's history and asked for changes only.
struct Follower {
    engine: Engine,
    refresh: Option<Refresh>,
    seen: BTreeMap<WorkloadId, (DeferReason, Timestamp)>,
}

/// `decide_news`'s limits in the property test: small enough that the history meets both.
const TEST_REFRESH: Refresh = Refresh { min_age_ms: 2_000, per_cycle: 2 };

impl Follower {
    fn new(engine: &Engine, refresh: Option<Refresh>) -> Follower {
        Follower { engine: engine.clone(), refresh, seen: BTreeMap::new() }
    }
}

/// Rounds of `settle`; each round admits or stops something, so this bounds a settle.
const SETTLE_ROUNDS_MAX: usize = 12;

impl<'a> Checker<'a> {
    fn new(case: &'a Case) -> Checker<'a> {
        let engine = Engine::new(&case.nodes, &case.policy).expect("generated config is valid");
        let mut lines = BTreeMap::new();
        let mut cohort = BTreeMap::new();
        for p in &case.policy.projects {
            let l: BTreeMap<String, Line> = p
                .quotas
                .iter()
                .map(|q| {
                    let key = match &q.model {
                        QuotaModel::Any => "any".to_string(),
                        QuotaModel::Model(m) => m.clone(),
                    };
                    (key, Line { guaranteed: q.guaranteed })
                })
                .collect();
            lines.insert(p.name.clone(), l);
            cohort.insert(
                p.name.clone(),
                p.cohort.clone().unwrap_or_else(|| format!("{}:solo", p.name)),
            );
        }
        Checker {
            case,
            engine,
            known: BTreeMap::new(),
            lines,
            cohort,
            waiting: BTreeMap::new(),
            rejects_due: Vec::new(),
            transcript: Vec::new(),
            restore_each_cycle: false,
            down: BTreeSet::new(),
            occupied: BTreeMap::new(),
            incremental: Vec::new(),
        }
    }

    /// The key name a project's workload on `model` is charged to.
    fn key_of(&self, project: &str, model: &str) -> Option<String> {
        let lines = self.lines.get(project)?;
        if lines.contains_key(model) {
            Some(model.to_string())
        } else if lines.contains_key("any") {
            Some("any".to_string())
        } else {
            None
        }
    }

    fn charged_key(&self, id: WorkloadId) -> Option<String> {
        let k = self.known.get(&id)?;
        let model = self.engine.placement(id)?.model?;
        self.key_of(&k.project, self.engine.model_name(model))
    }

    fn run(&mut self) -> Result<(), String> {
        for (i, (now, step)) in self.case.steps.iter().enumerate() {
            let now = *now;
            match step {
                Step::Submit(spec) => self.submit(now, spec),
                Step::Event(e) => self.event(now, e.clone()),
                Step::Decide => {
                    self.decide(now).map_err(|e| format!("step {i} (decide at {}): {e}", now.0))?;
                }
                Step::Settle => {
                    for round in 0..SETTLE_ROUNDS_MAX {
                        let decisions = self.decide(now).map_err(|e| {
                            format!("step {i} (settle round {round} at {}): {e}", now.0)
                        })?;
                        let mut acted = false;
                        for d in &decisions {
                            match d {
                                Decision::Admit { workload, .. } => {
                                    self.event(
                                        now,
                                        Event::AllocationStarted { workload: *workload },
                                    );
                                    acted = true;
                                }
                                Decision::Preempt { victim: workload, .. }
                                | Decision::Stop { workload, .. } => {
                                    self.event(now, Event::WorkloadStopped { workload: *workload });
                                    acted = true;
                                }
                                _ => {}
                            }
                        }
                        if !acted {
                            break;
                        }
                    }
                }
            }
            self.engine.audit().map_err(|e| format!("step {i} ({step:?}): audit: {e}"))?;
        }
        Ok(())
    }

    fn submit(&mut self, now: Timestamp, spec: &WorkloadSpec) {
        let held_before = self.engine.stage(spec.id).is_some();
        self.engine.apply(now, Event::WorkloadSubmitted(spec.clone()));
        for follower in &mut self.incremental {
            follower.engine.apply(now, Event::WorkloadSubmitted(spec.clone()));
        }
        if held_before || self.engine.stage(spec.id).is_none() {
            self.rejects_due.push(spec.id);
            return;
        }
        let class_name = spec
            .priority_class
            .clone()
            .unwrap_or_else(|| self.case.policy.default_priority_class.clone());
        let class = self
            .case
            .policy
            .priority_classes
            .iter()
            .find(|c| c.name == class_name)
            .expect("the engine accepted the class");
        self.known.insert(
            spec.id,
            Known {
                project: spec.project.clone(),
                priority: class.value,
                preemptible: class.preemptible && spec.preemptible != Some(false),
                min_runtime_ms: spec.min_runtime_ms,
                total: spec.total_shares(),
                submitted_at: now,
                started_at: None,
                stopping_preempted: false,
                preempted_at: Vec::new(),
            },
        );
    }

    fn event(&mut self, now: Timestamp, event: Event) {
        let Some(id) = event.workload() else {
            match &event {
                Event::NodeUnavailable { node, .. }
                    if (node.0 as usize) < self.case.nodes.len() =>
                {
                    self.down.insert(*node);
                }
                Event::NodeAvailable { node } => {
                    self.down.remove(node);
                }
                Event::DevicesOccupied { node, devices, .. } => {
                    self.occupied.insert(*node, devices.iter().copied().collect());
                }
                _ => {}
            }
            self.apply_both(now, event);
            return;
        };
        let before = self.engine.stage(id);
        let stops = matches!(event, Event::WorkloadStopped { .. });
        self.apply_both(now, event);
        let after = self.engine.stage(id);
        if stops
            && before == Some(Stage::Stopping)
            && let Some(k) = self.known.get_mut(&id)
            && std::mem::take(&mut k.stopping_preempted)
        {
            k.preempted_at.push(now);
        }
        if before == Some(Stage::Assumed)
            && after == Some(Stage::Running)
            && let Some(k) = self.known.get_mut(&id)
        {
            k.started_at = Some(now);
        }
        if after.is_none() {
            self.known.remove(&id);
            self.waiting.remove(&id);
        }
    }

    fn apply_both(&mut self, now: Timestamp, event: Event) {
        for follower in &mut self.incremental {
            let id = event.workload();
            follower.engine.apply(now, event.clone());
            // Work that left the engine is forgotten: a new submission of its id is reported
            // afresh (`decide_changes` forgets it too).
            if let Some(id) = id
                && follower.engine.stage(id).is_none()
            {
                follower.seen.remove(&id);
            }
        }
        self.engine.apply(now, event);
    }

    /// The incremental cycle hands out exactly the reference cycle's decisions, less the
    /// deferrals that repeat a workload's last one; under `decide_news`, also less those of
    /// the same kind as the last one told before it is `min_age_ms` old or once the cycle's
    /// `per_cycle` refreshes are spent (in the order of the decisions).
    fn check_incremental(&mut self, now: Timestamp, reference: &[Decision]) -> Result<(), String> {
        for follower in &mut self.incremental {
            let mut left = follower.refresh.map_or(0, |r| r.per_cycle);
            let mut expected = Vec::new();
            for d in reference {
                match d {
                    Decision::Defer { workload, reason } => {
                        let told = match (follower.seen.get(workload), follower.refresh) {
                            (None, _) => true,
                            (Some((last, _)), _) if last == reason => false,
                            (Some(_), None) => true,
                            (Some((last, at)), Some(refresh)) => {
                                if std::mem::discriminant(last) != std::mem::discriminant(reason) {
                                    true
                                } else if left > 0 && now.since(*at) >= refresh.min_age_ms {
                                    left -= 1;
                                    true
                                } else {
                                    false
                                }
                            }
                        };
                        if told {
                            follower.seen.insert(*workload, (reason.clone(), now));
                            expected.push(d.clone());
                        }
                    }
                    other => {
                        follower.seen.remove(&other.workload());
                        expected.push(other.clone());
                    }
                }
            }
            // Its own state holds too: the incremental cycle keeps caches (runs of its
            // queues) the reference cycle does not.
            follower.engine.audit().map_err(|e| format!("before an incremental cycle: {e}"))?;
            let got = match follower.refresh {
                Some(refresh) => follower.engine.decide_news(now, refresh),
                None => follower.engine.decide_changes(now),
            };
            follower.engine.audit().map_err(|e| format!("after an incremental cycle: {e}"))?;
            if got != expected {
                return Err(format!(
                    "the incremental cycle ({:?}) differs from the reference:\n{got:?}\n{expected:?}",
                    follower.refresh
                ));
            }
        }
        Ok(())
    }

    /// Runs one decide and checks its decisions against the state before it.
    fn decide(&mut self, now: Timestamp) -> Result<Vec<Decision>, String> {
        // State before the cycle.
        let ids: Vec<WorkloadId> = self.engine.workload_ids().collect();
        let stage_before: BTreeMap<WorkloadId, Stage> =
            ids.iter().filter_map(|&id| self.engine.stage(id).map(|s| (id, s))).collect();
        // Lasting usage: admitted or running, not told to stop. (project, key) → shares.
        let mut lasting: BTreeMap<WorkloadId, (String, String, Shares)> = BTreeMap::new();
        for (&id, &stage) in &stage_before {
            if matches!(stage, Stage::Assumed | Stage::Running)
                && let (Some(k), Some(key)) = (self.known.get(&id), self.charged_key(id))
            {
                lasting.insert(id, (k.project.clone(), key, k.total));
            }
        }
        self.waiting.retain(|id, _| stage_before.get(id) == Some(&Stage::Pending));

        // What `explain` says each pending workload would get now.
        let explained: BTreeMap<WorkloadId, Option<Decision>> = stage_before
            .iter()
            .filter(|(_, s)| **s == Stage::Pending)
            .map(|(&id, _)| (id, self.engine.explain(now, id).and_then(|e| e.decision)))
            .collect();

        let decisions = self.engine.decide(now);
        self.check_incremental(now, &decisions)?;
        self.transcript.push(format!("{decisions:?}"));
        if self.restore_each_cycle {
            let bytes = self.engine.state().map_err(|e| format!("state: {e}"))?;
            let restored = Engine::from_state(&self.case.nodes, &self.case.policy, &bytes)
                .map_err(|e| format!("from_state: {e}"))?;
            if format!("{restored:?}") != format!("{:?}", self.engine) {
                return Err(format!(
                    "the engine rebuilt from its state differs:\n{restored:?}\n{:?}",
                    self.engine
                ));
            }
            self.engine = restored;
        }

        // `explain` runs the same checks as `decide`, so they agree.
        for d in &decisions {
            if let Decision::Admit { workload, .. } | Decision::Defer { workload, .. } = d
                && let Some(said) = explained.get(workload)
                && said.as_ref() != Some(d)
            {
                return Err(format!("explain said {said:?} but decide said {d:?}"));
            }
        }

        // Work held for a reservation is held for one that can start once its GPUs free: never
        // for a workload strict FIFO keeps behind its project's head (the head could be the
        // held work, and the two would wait for each other for ever).
        let behind_head: BTreeMap<WorkloadId, WorkloadId> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Defer {
                    workload, reason: DeferReason::BlockedByFifo { head }, ..
                } => Some((*workload, *head)),
                _ => None,
            })
            .collect();
        for d in &decisions {
            if let Decision::Defer {
                workload,
                reason:
                    DeferReason::HeldForReservation { reservation, .. }
                    | DeferReason::QuotaHeldForReservation { reservation, .. },
                ..
            } = d
                && let Some(head) = behind_head.get(reservation)
            {
                return Err(format!(
                    "{workload} is held for {reservation}'s reservation, but {reservation} \
                     waits behind its project's head {head} (strict FIFO)"
                ));
            }
        }

        // On an idle cluster (nothing admitted, running or stopping; every node up, no
        // foreign work) a hold can only be for work that starts now: a cycle that holds
        // something for someone and admits nothing has work waiting on itself.
        let idle = stage_before
            .values()
            .all(|s| !matches!(s, Stage::Assumed | Stage::Running | Stage::Stopping))
            && self.down.is_empty()
            && self.occupied.values().all(BTreeSet::is_empty);
        let held = decisions.iter().find(|d| {
            matches!(
                d,
                Decision::Defer {
                    reason: DeferReason::HeldForReservation { .. }
                        | DeferReason::QuotaHeldForReservation { .. }
                        | DeferReason::HeldForClaimant { .. },
                    ..
                }
            )
        });
        if idle
            && let Some(held) = held
            && !decisions.iter().any(|d| matches!(d, Decision::Admit { .. }))
        {
            return Err(format!("idle cluster: {held:?}, and nothing admitted: {decisions:?}"));
        }

        // No new placement on an unavailable node; only unavailable nodes are named.
        for d in &decisions {
            match d {
                Decision::Admit { workload, placement, .. } => {
                    if let Some(m) = placement.members.iter().find(|m| self.down.contains(&m.node))
                    {
                        return Err(format!(
                            "{workload} admitted onto unavailable {}",
                            self.engine.node_name(m.node)
                        ));
                    }
                    for m in &placement.members {
                        let held = self.occupied.get(&m.node);
                        if let Some(d) =
                            m.devices.iter().find(|d| held.is_some_and(|h| h.contains(&d.device)))
                        {
                            return Err(format!(
                                "{workload} admitted onto {}[{}], held by foreign work",
                                self.engine.node_name(m.node),
                                d.device
                            ));
                        }
                    }
                }
                Decision::Defer {
                    workload,
                    reason: DeferReason::NodesUnavailable { nodes, .. },
                } if nodes.is_empty() || nodes.iter().any(|(n, _)| !self.down.contains(n)) => {
                    return Err(format!("{workload} deferred naming {nodes:?}"));
                }
                _ => {}
            }
        }

        // Exactly one Admit/Defer per pending workload; Rejects as due.
        let mut verdicts: BTreeMap<WorkloadId, usize> = BTreeMap::new();
        let mut rejects: Vec<WorkloadId> = Vec::new();
        for d in &decisions {
            match d {
                Decision::Admit { workload, .. } | Decision::Defer { workload, .. } => {
                    *verdicts.entry(*workload).or_default() += 1;
                }
                Decision::Reject { workload, .. } => rejects.push(*workload),
                _ => {}
            }
        }
        let mut due = std::mem::take(&mut self.rejects_due);
        due.sort();
        rejects.sort();
        if due != rejects {
            return Err(format!("rejects {rejects:?}, expected {due:?}"));
        }
        for (&id, &stage) in &stage_before {
            let n = verdicts.get(&id).copied().unwrap_or(0);
            if stage == Stage::Pending && n != 1 {
                return Err(format!("pending {id} got {n} admit/defer decisions"));
            }
        }
        for (&id, &n) in &verdicts {
            if stage_before.get(&id) != Some(&Stage::Pending) {
                return Err(format!("{id} was not pending but got {n} admit/defer decisions"));
            }
        }

        // Walk the decisions in order, keeping lasting usage and waiting pre-emptors as the
        // engine saw them at each point.
        let mut victims_seen: BTreeSet<WorkloadId> = BTreeSet::new();
        let mut i = 0;
        while i < decisions.len() {
            match &decisions[i] {
                Decision::Stop { workload, .. } => {
                    if !matches!(stage_before.get(workload), Some(Stage::Assumed | Stage::Running))
                    {
                        return Err(format!(
                            "stop of {workload}, which was {:?}",
                            stage_before.get(workload)
                        ));
                    }
                    lasting.remove(workload);
                    i += 1;
                }
                Decision::Admit { workload, placement, .. } => {
                    if let (Some(k), Some(model)) = (self.known.get(workload), placement.model)
                        && let Some(key) = self.key_of(&k.project, self.engine.model_name(model))
                    {
                        lasting.insert(*workload, (k.project.clone(), key, k.total));
                    }
                    self.waiting.remove(workload);
                    i += 1;
                }
                Decision::Defer { workload, reason } => {
                    if !matches!(reason, DeferReason::WaitingForPreemption { .. }) {
                        self.waiting.remove(workload);
                    }
                    i += 1;
                }
                Decision::Reject { .. } => i += 1,
                Decision::Warn { workload, .. } | Decision::Reclaim { workload, .. } => {
                    return Err(format!("idle decision for {workload} without idle rules"));
                }
                Decision::Preempt { for_workload, .. } => {
                    // One plan: the consecutive pre-emptions for one workload.
                    let claimant = *for_workload;
                    let mut end = i;
                    while let Some(Decision::Preempt { for_workload, .. }) = decisions.get(end)
                        && *for_workload == claimant
                    {
                        end += 1;
                    }
                    self.check_plan(
                        now,
                        &decisions[i..end],
                        &stage_before,
                        &lasting,
                        &mut victims_seen,
                    )?;
                    for d in &decisions[i..end] {
                        if let Some(k) = self.known.get_mut(&d.workload()) {
                            k.stopping_preempted = true;
                        }
                    }
                    match decisions.get(end) {
                        Some(Decision::Defer {
                            workload,
                            reason: DeferReason::WaitingForPreemption { .. },
                        }) if *workload == claimant => {}
                        other => {
                            return Err(format!(
                                "pre-emption for {claimant} not followed by its wait: {other:?}"
                            ));
                        }
                    }
                    let mut key = None;
                    for d in &decisions[i..end] {
                        let v = d.workload();
                        if let (Some(k), Some(model)) = (
                            self.known.get(&claimant),
                            self.engine.placement(v).and_then(|p| p.model),
                        ) {
                            key = key
                                .or_else(|| self.key_of(&k.project, self.engine.model_name(model)));
                        }
                        lasting.remove(&v);
                    }
                    if let (Some(k), Some(key)) = (self.known.get(&claimant), key) {
                        self.waiting.insert(claimant, (k.project.clone(), key, k.total));
                    }
                    i = end;
                }
            }
        }
        Ok(decisions)
    }

    /// Lasting usage of `project` on `key` (see `decide`), plus its waiting pre-emptors' but
    /// `except`'s.
    /// A victim taken from another project for quota (reclaim, reclaim while borrowing, fair
    /// sharing): the reason names the victim's and the claimant's projects and the victim's
    /// line, both projects are in one cohort, and the borrower borrows (by what it says).
    fn check_reclaim(
        &self,
        victim: WorkloadId,
        v: &Known,
        c: &Known,
        (vproject, vkey): (&str, &str),
        (borrower, claimant, key, borrowed): (
            allot_core::ProjectId,
            allot_core::ProjectId,
            allot_core::QuotaKey,
            Option<Shares>,
        ),
    ) -> Result<(), String> {
        if self.engine.project_name(borrower) != v.project
            || self.engine.project_name(claimant) != c.project
            || self.engine.key_name(key) != vkey
            || vproject != v.project
        {
            return Err(format!("reclaim of {victim} misnames its projects or line"));
        }
        if v.project == c.project || self.cohort[&v.project] != self.cohort[&c.project] {
            return Err(format!("reclaim of {victim} outside the claimant's cohort"));
        }
        if borrowed == Some(Shares::ZERO) {
            return Err(format!("reclaim of {victim} from a project that borrows nothing"));
        }
        Ok(())
    }

    fn project_spec(&self, name: &str) -> &ProjectSpec {
        self.case.policy.projects.iter().find(|p| p.name == name).expect("a known project")
    }

    fn committed(
        &self,
        lasting: &BTreeMap<WorkloadId, (String, String, Shares)>,
        project: &str,
        key: &str,
        except: WorkloadId,
    ) -> u64 {
        let held: u64 =
            lasting.values().filter(|l| l.0 == project && l.1 == key).map(|l| l.2.0).sum();
        let waiting: u64 = self
            .waiting
            .iter()
            .filter(|(w, l)| **w != except && l.0 == project && l.1 == key)
            .map(|(_, l)| l.2.0)
            .sum();
        held + waiting
    }

    fn check_plan(
        &self,
        now: Timestamp,
        plan: &[Decision],
        stage_before: &BTreeMap<WorkloadId, Stage>,
        lasting: &BTreeMap<WorkloadId, (String, String, Shares)>,
        victims_seen: &mut BTreeSet<WorkloadId>,
    ) -> Result<(), String> {
        let mut reclaimed: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        // Defragmentation victims of other projects, per (project, key), and whether the
        // plan says every victim can restart elsewhere at once.
        let mut moved: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut all_replaceable = true;
        let mut own_victims = 0u64;
        let mut claim: Option<(String, String, WorkloadId)> = None;
        // A defragmentation plan moves at most the policy's `victims_max`.
        let moves = plan
            .iter()
            .filter(|d| {
                matches!(d, Decision::Preempt { reason: PreemptReason::Defragment { .. }, .. })
            })
            .count();
        let cap = self.case.policy.defragmentation.and_then(|d| d.victims_max);
        if cap.is_some_and(|cap| moves > cap as usize) {
            return Err(format!("a defragmentation plan moves {moves}, past victims_max {cap:?}"));
        }
        for d in plan {
            let Decision::Preempt { victim, for_workload, reason, mode, .. } = d else {
                unreachable!()
            };
            if !victims_seen.insert(*victim) {
                return Err(format!("{victim} pre-empted twice in one cycle"));
            }
            if stage_before.get(victim) != Some(&Stage::Running) {
                return Err(format!(
                    "victim {victim} was {:?}, not running",
                    stage_before.get(victim)
                ));
            }
            let v = self.known.get(victim).ok_or(format!("victim {victim} unknown"))?;
            let c =
                self.known.get(for_workload).ok_or(format!("pre-emptor {for_workload} unknown"))?;
            if stage_before.get(for_workload) != Some(&Stage::Pending) {
                return Err(format!("pre-emptor {for_workload} was not pending"));
            }
            if !v.preemptible {
                return Err(format!("victim {victim} is not preemptible"));
            }
            let started = v.started_at.ok_or(format!("victim {victim} never started"))?;
            if now.since(started) < v.min_runtime_ms {
                return Err(format!(
                    "victim {victim} ran {} ms, less than its min runtime {} ms",
                    now.since(started),
                    v.min_runtime_ms
                ));
            }
            // The guard against thrash (no idle rules here: every victim is guarded).
            let guard = self.case.policy.preemption_guard;
            if !v.preempted_at.is_empty() && now.since(started) < guard.exempt_after_restart_ms {
                return Err(format!(
                    "victim {victim} restarted {} ms ago, within exempt_after_restart {} ms",
                    now.since(started),
                    guard.exempt_after_restart_ms
                ));
            }
            let reclaims = matches!(
                reason,
                PreemptReason::QuotaReclaim { .. } | PreemptReason::ReclaimWhileBorrowing { .. }
            );
            if reclaims && now.since(c.submitted_at) < guard.reclaim_after_ms {
                return Err(format!(
                    "{for_workload} reclaimed {victim} {} ms after its submission, within \
                     reclaim_after {} ms",
                    now.since(c.submitted_at),
                    guard.reclaim_after_ms
                ));
            }
            if let Some(limit) = guard.limit {
                let recent =
                    v.preempted_at.iter().filter(|t| now.since(**t) < limit.window_ms).count();
                if recent >= limit.count as usize {
                    return Err(format!(
                        "victim {victim} was pre-empted {recent} times within {} ms (cap {})",
                        limit.window_ms, limit.count
                    ));
                }
            }
            let (vproject, vkey, vshares) = match lasting.get(victim).cloned() {
                Some(line) => line,
                // Work that holds no GPU is moved only by a defragmentation that consolidates
                // (to open CPU or memory beside a device): it takes no quota from anyone.
                None if v.total.0 == 0
                    && matches!(reason, PreemptReason::Defragment { .. })
                    && self.case.policy.defragmentation.is_some_and(|d| d.consolidate_shares) =>
                {
                    (v.project.clone(), String::new(), Shares(0))
                }
                None => return Err(format!("victim {victim} holds no quota line")),
            };
            match reason {
                PreemptReason::Priority { project, victim_priority, preemptor_priority } => {
                    let pname = self.engine.project_name(*project);
                    if v.project != c.project || pname != c.project {
                        return Err(format!(
                            "priority pre-emption across projects: {victim} for {for_workload}"
                        ));
                    }
                    if *victim_priority != v.priority || *preemptor_priority != c.priority {
                        return Err(format!("priorities misreported for {victim}"));
                    }
                    let newer = (v.submitted_at, *victim) > (c.submitted_at, *for_workload);
                    let allowed = match self.project_spec(&c.project).preempt_within_project {
                        WithinProject::LowerPriority => preemptor_priority > victim_priority,
                        WithinProject::LowerOrNewerEqualPriority => {
                            preemptor_priority > victim_priority
                                || (preemptor_priority == victim_priority && newer)
                        }
                        WithinProject::Never => false,
                    };
                    if !allowed {
                        return Err(format!(
                            "{for_workload} ({preemptor_priority}) pre-empts {victim} ({victim_priority}, newer: {newer}) under {:?}",
                            self.project_spec(&c.project).preempt_within_project
                        ));
                    }
                    own_victims += vshares.0;
                }
                PreemptReason::QuotaReclaim { borrower, claimant, key, borrowed, for_cohort } => {
                    if for_cohort.is_some() {
                        return Err(format!(
                            "reclaim of {victim} for a cohort, with no tree of cohorts"
                        ));
                    }
                    let names = (*borrower, *claimant, *key, Some(*borrowed));
                    self.check_reclaim(*victim, v, c, (&vproject, &vkey), names)?;
                    reclaimed.entry((v.project.clone(), vkey.clone())).or_default().push(vshares.0);
                    claim = Some((c.project.clone(), vkey.clone(), *for_workload));
                }
                PreemptReason::ReclaimWhileBorrowing {
                    borrower,
                    claimant,
                    key,
                    borrowed,
                    victim_priority,
                    preemptor_priority,
                } => {
                    let names = (*borrower, *claimant, *key, Some(*borrowed));
                    self.check_reclaim(*victim, v, c, (&vproject, &vkey), names)?;
                    if *victim_priority != v.priority || *preemptor_priority != c.priority {
                        return Err(format!("priorities misreported for {victim}"));
                    }
                    let allows = self
                        .project_spec(&c.project)
                        .borrow_within_cohort
                        .is_some_and(|b| b.allows(v.priority, c.priority));
                    if !allows {
                        return Err(format!(
                            "{for_workload} reclaims {victim} while borrowing, which its project's \
                             borrow_within_cohort does not allow"
                        ));
                    }
                    reclaimed.entry((v.project.clone(), vkey.clone())).or_default().push(vshares.0);
                }
                PreemptReason::FairShare {
                    borrower,
                    claimant,
                    key,
                    claimant_share,
                    borrower_share,
                    borrower_share_after,
                    strategy,
                } => {
                    let Some(fs) = &self.case.policy.fair_sharing else {
                        return Err(format!("fair-sharing pre-emption of {victim} with it off"));
                    };
                    if !fs.strategies.contains(strategy) {
                        return Err(format!("{victim} taken by {strategy:?}, not in the policy"));
                    }
                    let names = (*borrower, *claimant, *key, None);
                    self.check_reclaim(*victim, v, c, (&vproject, &vkey), names)?;
                    let holds = match strategy {
                        FairShareStrategy::LessThanOrEqualToFinalShare => {
                            claimant_share <= borrower_share_after
                        }
                        FairShareStrategy::LessThanInitialShare => claimant_share < borrower_share,
                    };
                    if *borrower_share == 0 || borrower_share_after > borrower_share || !holds {
                        return Err(format!(
                            "fair share of {victim}: claimant {claimant_share}, borrower \
                             {borrower_share} → {borrower_share_after} under {strategy:?}"
                        ));
                    }
                    reclaimed.entry((v.project.clone(), vkey.clone())).or_default().push(vshares.0);
                }
                PreemptReason::Defragment { replaceable, .. } => {
                    // Never a higher priority, never a delete.
                    if v.priority > c.priority {
                        return Err(format!(
                            "defragmentation moves {victim} ({}) for {for_workload} ({})",
                            v.priority, c.priority
                        ));
                    }
                    if *mode == PreemptionMode::Delete {
                        return Err(format!("defragmentation deletes {victim}"));
                    }
                    all_replaceable &= *replaceable;
                    if v.project != c.project && vshares.0 > 0 {
                        *moved.entry((v.project.clone(), vkey.clone())).or_default() += vshares.0;
                    }
                }
                PreemptReason::Idle { .. } => {
                    return Err(format!("idle pre-emption of {victim} without idle rules"));
                }
            }
        }
        // The borrower still borrowed when its last victim was chosen.
        for ((project, key), shares) in &reclaimed {
            let committed = self.committed(lasting, project, key, WorkloadId(u64::MAX));
            let all: u64 = shares.iter().sum();
            let largest = shares.iter().copied().max().unwrap_or(0);
            let guaranteed = self.lines[project][key].guaranteed.0;
            if committed.saturating_sub(all) + largest <= guaranteed {
                return Err(format!(
                    "reclaimed {shares:?} from {project} {key}: lasting usage {committed} of guarantee {guaranteed}"
                ));
            }
        }
        // Defragmentation never leaves another project below its guarantee, unless every
        // victim can restart elsewhere at once.
        for ((project, key), shares) in &moved {
            let committed = self.committed(lasting, project, key, WorkloadId(u64::MAX));
            let guaranteed = self.lines[project][key].guaranteed.0;
            if committed.saturating_sub(*shares) < guaranteed && !all_replaceable {
                return Err(format!(
                    "defragmentation takes {shares} from {project} {key} (lasting {committed}, \
                     guarantee {guaranteed}) without re-placing it"
                ));
            }
        }
        // The claimant ends within its guarantee.
        if let Some((project, key, claimant)) = claim {
            let committed = self.committed(lasting, &project, &key, claimant);
            let total = self.known[&claimant].total.0;
            let guaranteed = self.lines[&project][&key].guaranteed.0;
            if committed.saturating_sub(own_victims) + total > guaranteed {
                return Err(format!(
                    "{claimant} reclaims but ends at {} of {project}'s {guaranteed} {key}",
                    committed.saturating_sub(own_victims) + total
                ));
            }
        }
        Ok(())
    }
}

/// Runs the case twice: once checking every property on reference cycles, with the
/// incremental cycle alongside, once more on a fresh engine to compare the decisions byte for
/// byte.
fn check_case(case: &Case) -> Result<(), String> {
    let mut first = Checker::new(case);
    // As the simulator's replay (`KINDS_ONLY`), the daemon (tight limits, so both bind) and
    // other callers of changes only ask.
    first.incremental = vec![
        Follower::new(&first.engine, None),
        Follower::new(&first.engine, Some(TEST_REFRESH)),
        Follower::new(&first.engine, Some(Refresh::KINDS_ONLY)),
    ];
    first.engine.reference_cycles();
    first.run()?;
    // The replay goes on from a saved state after every cycle: same decisions.
    let mut again = Checker::new(case);
    again.restore_each_cycle = true;
    again.run()?;
    for (n, (a, b)) in first.transcript.iter().zip(&again.transcript).enumerate() {
        if a != b {
            return Err(format!("decide #{n} differs on replay:\n{a}\n{b}"));
        }
    }
    if first.transcript.len() != again.transcript.len() {
        return Err("replay ran a different number of decides".into());
    }
    Ok(())
}

/// 256 cases by default; `.ci/run`'s slow tier sets `ALLOT_PROPTEST_CASES` higher.
fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2048, ..ProptestConfig::default() })]

    #[test]
    fn engine_invariants_hold_on_random_histories(raw in raw_case()) {
        let case = build(&raw);
        if let Err(e) = check_case(&case) {
            prop_assert!(false, "{}\ncase: {:#?}", e, case);
        }
    }
}

// ----- gangs: an empty node of the right shape is always used ---------------------------------

/// One node: (model 0..2, devices, island split, rack, pool, CPU cores).
type RawGangNode = (u8, u8, u8, Option<u8>, Option<u8>, u64);
/// One workload of the running mix: (whole GPUs or shares, members, layout 0..3, CPU cores).
type RawMixItem = (Result<u32, u32>, u32, u8, u64);

fn layout_flags(layout: u8) -> (bool, bool) {
    match layout % 3 {
        0 => (false, false),
        1 => (true, false),
        _ => (false, true),
    }
}

/// Random cluster (racks, pools, islands), a running mix settled on it, one node emptied by
/// finishing everything on it, then a gang that fits that node alone: the next cycle admits
/// it, whatever its layout (required or preferred same node, or spread). The audit holds after
/// every step.
fn check_gang_uses_empty_node(
    nodes: &[RawGangNode],
    mix: &[RawMixItem],
    empty: usize,
    gang: (u32, u32, u8, u64, bool),
) -> Result<(), String> {
    let specs: Vec<NodeSpec> = nodes
        .iter()
        .enumerate()
        .map(|(i, &(model, devices, split, rack, pool, cpu))| NodeSpec {
            name: format!("n{i}"),
            cpu_millis: cpu * 1000,
            memory_mib: 1 << 20,
            labels: BTreeMap::new(),
            pool: pool.map(|p| format!("p{p}")),
            rack: rack.map(|r| format!("r{r}")),
            devices: (0..devices)
                .map(|d| DeviceSpec {
                    model: model_name(model),
                    memory_mib: 81920,
                    island: u32::from(d < split),
                    mig: false,
                })
                .collect(),
        })
        .collect();
    let policy = PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "mix".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "gang".into(), value: 100, preemptible: false },
        ],
        default_priority_class: "mix".into(),
        projects: vec![ProjectSpec {
            name: "p".into(),
            cohort: None,
            department: None,
            quotas: vec![QuotaSpec {
                model: QuotaModel::Any,
                guaranteed: Shares(1_000_000),
                borrow_limit: None,
                lend_limit: None,
            }],
            weight_milli: 1000,
            queueing: Queueing::BestEffortFifo,
            preemption_mode: None,
            preempt_within_project: Default::default(),
            borrow_within_cohort: None,
        }],
        ..PolicySpec::minimal()
    };
    let mut engine = Engine::new(&specs, &policy).map_err(|e| e.to_string())?;
    let mut id = 0u64;
    for &(gpus, members, layout, cpu) in mix {
        id += 1;
        let request = match gpus {
            Ok(k) => GpuRequest::Whole(k),
            Err(s) => GpuRequest::Shares(s),
        };
        let mut spec = WorkloadSpec::new(id, &format!("m{id}"), "p", request);
        spec.members = members;
        (spec.same_node, spec.prefer_same_node) = layout_flags(layout);
        spec.cpu_millis_per_member = cpu * 1000;
        engine.apply(Timestamp(0), Event::WorkloadSubmitted(spec));
    }
    for round in 0..4 {
        let decisions = engine.decide(Timestamp(round));
        for d in &decisions {
            if let Decision::Admit { workload, .. } = d {
                engine.apply(Timestamp(round), Event::AllocationStarted { workload: *workload });
            }
        }
        engine.audit().map_err(|e| format!("mix round {round}: {e}"))?;
    }
    // Empty node `empty`: finish everything with a member there.
    let target = allot_core::NodeId(empty as u32);
    let on_target: Vec<WorkloadId> = engine
        .workload_ids()
        .filter(|&w| {
            engine.placement(w).is_some_and(|p| p.members.iter().any(|m| m.node == target))
        })
        .collect();
    for w in on_target {
        engine.apply(Timestamp(10), Event::WorkloadFinished { workload: w });
    }
    engine.audit()?;

    let (model, devices, _, _, _, cpu_cores) = nodes[empty];
    let (members, per, layout, cpu, whole) = gang;
    let members = members.clamp(1, u32::from(devices).max(1));
    let request = if whole {
        GpuRequest::Whole(
            (per % u32::from(devices)).max(1).min(u32::from(devices) / members).max(1),
        )
    } else {
        GpuRequest::Shares(per.clamp(1, 999))
    };
    // Shapes that do not fit the empty node are out of scope.
    let fits_gpus = match request {
        GpuRequest::Whole(k) => k * members <= u32::from(devices),
        GpuRequest::Shares(s) => members <= u32::from(devices) * (1000 / s),
        GpuRequest::Mig(_) => false,
    };
    let cpu = cpu.min(cpu_cores / u64::from(members));
    if !fits_gpus || devices == 0 {
        return Ok(());
    }
    let gang_id = WorkloadId(id + 1);
    let mut spec = WorkloadSpec::new(gang_id.0, "gang", "p", request);
    spec.members = members;
    spec.priority_class = Some("gang".into());
    spec.gpu_models = vec![model_name(model)];
    (spec.same_node, spec.prefer_same_node) = layout_flags(layout);
    spec.cpu_millis_per_member = cpu * 1000;
    let shown = format!("{spec:?}");
    engine.apply(Timestamp(20), Event::WorkloadSubmitted(spec));
    let decisions = engine.decide(Timestamp(20));
    engine.audit()?;
    match decisions.iter().find(|d| d.workload() == gang_id) {
        Some(Decision::Admit { .. }) => Ok(()),
        other => Err(format!("gang {shown} with n{empty} empty: {other:?}")),
    }
}

fn raw_gang_node() -> impl Strategy<Value = RawGangNode> {
    (
        0u8..2,
        1u8..=8,
        0u8..=8,
        prop::option::weighted(0.7, 0u8..3),
        prop::option::weighted(0.6, 0u8..2),
        prop_oneof![Just(8u64), Just(64)],
    )
}

fn raw_mix_item() -> impl Strategy<Value = RawMixItem> {
    (
        prop_oneof![3 => (1u32..=4).prop_map(Ok), 1 => (1u32..=999).prop_map(Err)],
        prop_oneof![3 => Just(1u32), 1 => 2u32..=4],
        0u8..3,
        0u64..=8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2048, ..ProptestConfig::default() })]

    #[test]
    fn a_gang_that_fits_an_empty_node_is_admitted(
        nodes in prop::collection::vec(raw_gang_node(), 1..=10),
        mix in prop::collection::vec(raw_mix_item(), 0..=30),
        empty in any::<prop::sample::Index>(),
        gang in (1u32..=4, 1u32..=999, 0u8..3, 0u64..=8, prop::bool::weighted(0.8)),
    ) {
        let empty = empty.index(nodes.len());
        if let Err(e) = check_gang_uses_empty_node(&nodes, &mix, empty, gang) {
            prop_assert!(false, "{}", e);
        }
    }
}
