//! Idle reclaim through the engine, as a property over random histories: random idle rules
//! (every model, `when` and action, exemptions), workloads of every kind and class, telemetry
//! (values, gaps), probes, cycles and a backend that carries decisions out. After every step the
//! engine's invariants hold, and every idle reclaim is one the rules allow:
//!
//! - never an exempt class, never a non-preemptible workload, never one no rule covers;
//! - `Reclaim` only under an `always` rule, idle `Preempt` only under `on_pressure`;
//! - the idle time reported reached the rule's timer, and a `Warn` for the workload came at
//!   least `warn_before` earlier in its current run;
//! - the action is the rule's;
//! - a claimant of allot's `on_pressure` reclaim whose victims are all gone (stopped for it, or
//!   finished on their own) is admitted in the first cycle after that (it was placeable once
//!   they were gone: all or nothing), unless a node is drained then (nodes are drained and
//!   brought back at random: what a victim frees on a drained node is not usable);
//! - a victim is never claimed twice.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::idle::{DeviceReading, IdleModel, IdleRule, MissingTelemetry};
use allot_core::{
    Decision, DeferReason, DeviceSpec, Engine, Event, GpuRequest, IdlePolicySpec, IdleWhen, NodeId,
    NodeSpec, PolicySpec, PreemptReason, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Shares, Timestamp, WorkloadId, WorkloadKind, WorkloadSpec,
};
use proptest::prelude::*;

const KINDS: [WorkloadKind; 5] = [
    WorkloadKind::Training,
    WorkloadKind::Batch,
    WorkloadKind::Notebook,
    WorkloadKind::Inference,
    WorkloadKind::Service,
];
const CLASSES: [&str; 3] = ["low", "normal", "vip"];
const MODES: [PreemptionMode; 3] =
    [PreemptionMode::Suspend, PreemptionMode::Requeue, PreemptionMode::Delete];

#[derive(Clone, Debug)]
struct RawRule {
    model: u8,
    when: u8,
    action: u8,
    kinds: Vec<u8>,
    project: Option<bool>,
    exempt: Vec<u8>,
    timer_s: u64,
    warn_s: u64,
    sustain_s: u64,
    missing: u8,
    grace_s: u64,
}

fn raw_rule() -> impl Strategy<Value = RawRule> {
    (
        (0u8..3, 0u8..3, 0u8..3, proptest::collection::vec(0u8..5, 0..3)),
        (proptest::option::of(any::<bool>()), proptest::collection::vec(0u8..3, 0..2)),
        (1u64..8, 0u64..4, 0u64..120, 0u8..3, 0u64..300),
    )
        .prop_map(
            |((model, when, action, kinds), (project, exempt), (t, w, s, missing, g))| RawRule {
                model,
                when,
                action,
                kinds,
                project,
                exempt,
                timer_s: t * 60,
                warn_s: w * 60,
                sustain_s: s,
                missing,
                grace_s: g,
            },
        )
}

fn rule(r: &RawRule, i: usize) -> IdlePolicySpec {
    let timer = r.timer_s * 1000;
    let mut rule = match r.model {
        0 => IdleRule::allot_default(),
        1 => IdleRule::amd_rm(100, timer),
        _ => IdleRule::runai(timer),
    };
    rule.idle_timer_ms = timer;
    if rule.model == IdleModel::Allot {
        rule.sustain_ms = r.sustain_s * 1000;
        rule.min_runtime_ms = r.grace_s * 1000;
        rule.missing = [MissingTelemetry::Hold, MissingTelemetry::Idle, MissingTelemetry::Active]
            [r.missing as usize % 3];
        // Half of allot's rules (odd grace) also have a quiet timer of half the idle timer.
        if r.grace_s % 2 == 1 {
            rule.quiet_timer_ms = timer / 2;
            rule.quiet_below_permille = 500;
        }
    }
    IdlePolicySpec {
        name: format!("r{i}"),
        projects: r
            .project
            .map(|a| vec![if a { "a" } else { "b" }.to_string()])
            .unwrap_or_default(),
        kinds: r.kinds.iter().map(|&k| KINDS[k as usize % 5]).collect(),
        exempt_classes: r.exempt.iter().map(|&c| CLASSES[c as usize % 3].to_string()).collect(),
        rule,
        when: [IdleWhen::OnPressure, IdleWhen::Always, IdleWhen::ReportOnly][r.when as usize % 3],
        action: MODES[r.action as usize % 3],
        warn_before_ms: (r.warn_s * 1000).min(timer),
    }
}

fn nodes() -> Vec<NodeSpec> {
    (0..3)
        .map(|n| NodeSpec {
            name: format!("n{n}"),
            cpu_millis: 64_000,
            memory_mib: 512 * 1024,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..2)
                .map(|_| DeviceSpec {
                    model: "A100".into(),
                    memory_mib: 81920,
                    island: 0,
                    mig: false,
                })
                .collect(),
        })
        .collect()
}

fn policy(rules: Vec<IdlePolicySpec>) -> PolicySpec {
    let project = |name: &str| ProjectSpec {
        name: name.into(),
        cohort: Some("c".into()),
        department: None,
        quotas: vec![QuotaSpec {
            model: QuotaModel::Any,
            guaranteed: Shares::from_gpus(3),
            borrow_limit: None,
            lend_limit: None,
        }],
        weight_milli: 1000,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    };
    PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "low".into(), value: -10, preemptible: true },
            PriorityClassSpec { name: "normal".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "vip".into(), value: 10, preemptible: true },
        ],
        default_priority_class: "normal".into(),
        projects: vec![project("a"), project("b")],
        fair_share_half_life_ms: 0,
        preemption_mode: PreemptionMode::Suspend,
        preemption_guard: allot_core::PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: rules,
        restart_cost_ms: PolicySpec::DEFAULT_RESTART_COST_MS,
        idle_resume_backoff_ms: 120_000,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: None,
    }
}

#[derive(Clone, Debug)]
enum Step {
    Submit {
        project: bool,
        gpus: u8,
        members: u8,
        kind: u8,
        class: u8,
        fixed: bool,
    },
    Decide,
    Act,
    /// Every running workload reports this activity (permille; `None`: telemetry missing).
    SampleAll {
        permille: Option<u16>,
        spike: Option<usize>,
    },
    Probe {
        pick: usize,
        ago_s: u64,
    },
    Finish {
        pick: usize,
    },
    Wait {
        s: u64,
    },
    /// Node `pick % 3` is reported drained, or available again (`up`).
    Node {
        pick: usize,
        up: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (any::<bool>(), 1u8..=2, 1u8..=2, 0u8..5, 0u8..3, proptest::bool::weighted(0.15))
            .prop_map(|(project, gpus, members, kind, class, fixed)| Step::Submit {
                project, gpus, members, kind, class, fixed
            }),
        3 => Just(Step::Decide),
        3 => Just(Step::Act),
        6 => (proptest::option::weighted(0.9, prop_oneof![12 => Just(0u16), 1 => 0u16..=1000]),
              proptest::option::weighted(0.2, any::<usize>()))
            .prop_map(|(permille, spike)| Step::SampleAll { permille, spike }),
        1 => (any::<usize>(), 0u64..3600).prop_map(|(pick, ago_s)| Step::Probe { pick, ago_s }),
        1 => any::<usize>().prop_map(|pick| Step::Finish { pick }),
        4 => prop_oneof![3 => 1u64..120, 1 => 1u64..900].prop_map(|s| Step::Wait { s }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, up)| Step::Node { pick, up }),
    ]
}

struct World {
    engine: Engine,
    /// The same history through `decide_changes`, with what it should have reported last
    /// per workload: it must hand out `engine`'s decisions less the repeated deferrals.
    changes: Engine,
    reported: BTreeMap<WorkloadId, DeferReason>,
    rules: Vec<IdlePolicySpec>,
    specs: BTreeMap<WorkloadId, WorkloadSpec>,
    running: BTreeSet<WorkloadId>,
    started_at: BTreeMap<WorkloadId, Timestamp>,
    last_warn: BTreeMap<WorkloadId, Timestamp>,
    to_start: Vec<WorkloadId>,
    to_stop: Vec<WorkloadId>,
    /// allot `on_pressure` claimants and the idle victims they wait for.
    claims: BTreeMap<WorkloadId, BTreeSet<WorkloadId>>,
    /// Every victim each claimant waits for, idle or not: one with an idle victim gone may
    /// still wait for a borrower it reclaims from in the same plan.
    victims_of: BTreeMap<WorkloadId, BTreeSet<WorkloadId>>,
    claimed: BTreeSet<WorkloadId>,
}

impl World {
    fn apply(&mut self, now: Timestamp, event: Event) {
        self.changes.apply(now, event.clone());
        self.engine.apply(now, event);
    }

    /// `decide_changes` of the same history gives `decisions` less each deferral that
    /// repeats the one last reported for that workload.
    fn check_changes(&mut self, now: Timestamp, decisions: &[Decision]) -> Result<(), String> {
        let mut expected = Vec::new();
        for d in decisions {
            match d {
                Decision::Defer { workload, reason } => {
                    if self.reported.get(workload) != Some(reason) {
                        self.reported.insert(*workload, reason.clone());
                        expected.push(d.clone());
                    }
                }
                other => {
                    self.reported.remove(&other.workload());
                    expected.push(other.clone());
                }
            }
        }
        let got = self.changes.decide_changes(now);
        if got != expected {
            return Err(format!("decide_changes differs:\n{got:?}\n{expected:?}"));
        }
        Ok(())
    }

    fn covering(&self, w: &WorkloadSpec) -> Option<&IdlePolicySpec> {
        self.rules.iter().find(|r| r.covers(&w.project, w.kind))
    }

    fn check_victim(
        &mut self,
        now: Timestamp,
        victim: WorkloadId,
        idle: &allot_core::IdleFacts,
        mode: PreemptionMode,
        when: IdleWhen,
    ) -> Result<(), String> {
        let spec = self.specs.get(&victim).ok_or("unknown victim")?;
        let rule = self.covering(spec).ok_or(format!("{victim}: no rule covers it"))?;
        let class = spec.priority_class.as_deref().unwrap_or("normal");
        if rule.exempt_classes.iter().any(|c| c == class) {
            return Err(format!("{victim}: exempt class {class} reclaimed"));
        }
        if spec.preemptible == Some(false) {
            return Err(format!("{victim}: non-preemptible workload reclaimed"));
        }
        if rule.when != when {
            return Err(format!("{victim}: reclaimed as {when:?} under a {:?} rule", rule.when));
        }
        // Judged by the rule's idle timer, or by its quiet timer (while the rule's other
        // workloads in the project are quiet; the peer count itself is the scenarios' to check).
        let quiet = (rule.rule.quiet_timer_ms > 0).then_some(rule.rule.quiet_timer_ms);
        if idle.idle_timer_ms != rule.rule.idle_timer_ms && Some(idle.idle_timer_ms) != quiet {
            return Err(format!(
                "{victim}: judged by a {} ms timer; the rule has {} ms (quiet {quiet:?})",
                idle.idle_timer_ms, rule.rule.idle_timer_ms
            ));
        }
        if idle.idle_ms < idle.idle_timer_ms {
            return Err(format!("{victim}: idle {} ms < timer", idle.idle_ms));
        }
        if mode != rule.action {
            return Err(format!("{victim}: action {mode:?}, rule says {:?}", rule.action));
        }
        let warned = self.last_warn.get(&victim).copied();
        let started = self.started_at.get(&victim).copied().unwrap_or(Timestamp(0));
        match warned {
            Some(w) if w >= started && now.since(w) >= rule.warn_before_ms => {}
            other => {
                return Err(format!(
                    "{victim}: reclaimed at {now:?} without a warning {} ms before ({other:?})",
                    rule.warn_before_ms
                ));
            }
        }
        if !self.claimed.insert(victim) {
            return Err(format!("{victim} claimed twice"));
        }
        Ok(())
    }

    /// A cycle in which every claimant whose idle victims are all gone (stopped for it or
    /// finished on their own) is admitted. Each claim is judged in the first cycle after its
    /// victims are gone and then let go: if a node is drained then, the engine may release the
    /// claim (what the victims freed may be unusable), and later work may take the room.
    fn decide_holding_claims(&mut self, now: Timestamp, drained: bool) -> Result<(), String> {
        let ready: Vec<WorkloadId> = self
            .claims
            .iter()
            .filter(|(c, vs)| {
                let others = self.victims_of.get(c).into_iter().flatten();
                vs.iter().chain(others).all(|v| !self.running.contains(v))
            })
            .map(|(&c, _)| c)
            .collect();
        let decisions = self.decide(now)?;
        for c in ready {
            self.claims.remove(&c);
            let admitted = decisions
                .iter()
                .any(|d| matches!(d, Decision::Admit { workload, .. } if *workload == c));
            // Quota its project's waiting pre-emptors that outrank it reclaimed is theirs first
            // (the engine's rule against pre-emptors taking turns): then it may wait for them.
            let behind_outranking_preemptors = decisions.iter().any(|d| {
                matches!(d, Decision::Defer {
                    workload,
                    reason: DeferReason::QuotaExhausted { requested, available, held_for_preemptors, .. },
                } if *workload == c
                    && *held_for_preemptors > Shares::ZERO
                    && *requested <= available.saturating_add(*held_for_preemptors))
            });
            if !admitted && !drained && !behind_outranking_preemptors {
                return Err(format!(
                    "{c}: its idle victims are gone but it was not admitted: {:?}",
                    decisions.iter().find(|d| d.workload() == c)
                ));
            }
        }
        Ok(())
    }

    fn decide(&mut self, now: Timestamp) -> Result<Vec<Decision>, String> {
        let decisions = self.engine.decide(now);
        self.check_changes(now, &decisions)?;
        // Go on from the engine rebuilt from its saved state: idle trackers, warnings and
        // backoffs must survive a snapshot exactly.
        let bytes = self.engine.state().map_err(|e| format!("state: {e}"))?;
        let restored = Engine::from_state(&nodes(), &policy(self.rules.clone()), &bytes)
            .map_err(|e| format!("from_state: {e}"))?;
        if format!("{restored:?}") != format!("{:?}", self.engine) {
            return Err("the engine rebuilt from its state differs".into());
        }
        self.engine = restored;
        for d in &decisions {
            match d {
                Decision::Warn { workload, .. } => {
                    self.last_warn.insert(*workload, now);
                }
                Decision::Reclaim { workload, mode, idle, .. } => {
                    self.check_victim(now, *workload, idle, *mode, IdleWhen::Always)?;
                    self.to_stop.push(*workload);
                }
                Decision::Preempt { victim, for_workload, mode, reason, .. } => {
                    if let PreemptReason::Idle { idle, gpu_count_only } = reason {
                        self.check_victim(now, *victim, idle, *mode, IdleWhen::OnPressure)?;
                        let priority = |id: &WorkloadId| {
                            let class = self.specs.get(id).and_then(|s| s.priority_class.clone());
                            CLASSES.iter().position(|c| Some(c.to_string()) == class)
                        };
                        if !gpu_count_only && priority(victim) > priority(for_workload) {
                            return Err(format!(
                                "{victim} reclaimed for {for_workload} of lower priority"
                            ));
                        }
                        if !gpu_count_only {
                            self.claims.entry(*for_workload).or_default().insert(*victim);
                        }
                    } else {
                        self.claimed.insert(*victim);
                    }
                    self.victims_of.entry(*for_workload).or_default().insert(*victim);
                    self.to_stop.push(*victim);
                }
                Decision::Admit { workload, .. } => {
                    self.to_start.push(*workload);
                    self.claims.remove(workload);
                    self.victims_of.remove(workload);
                }
                Decision::Stop { workload, .. } => self.to_stop.push(*workload),
                Decision::Defer { .. } | Decision::Reject { .. } => {}
            }
        }
        Ok(decisions)
    }
}

fn run(rules: Vec<IdlePolicySpec>, steps: &[Step]) -> Result<(), String> {
    let engine = Engine::new(&nodes(), &policy(rules.clone())).map_err(|e| e.to_string())?;
    let mut w = World {
        changes: engine.clone(),
        engine,
        reported: BTreeMap::new(),
        rules,
        specs: BTreeMap::new(),
        running: BTreeSet::new(),
        started_at: BTreeMap::new(),
        last_warn: BTreeMap::new(),
        to_start: Vec::new(),
        to_stop: Vec::new(),
        claims: BTreeMap::new(),
        victims_of: BTreeMap::new(),
        claimed: BTreeSet::new(),
    };
    let mut now = Timestamp(0);
    let mut next = 1u64;
    let mut down: BTreeSet<NodeId> = BTreeSet::new();
    for s in steps {
        match s {
            Step::Submit { project, gpus, members, kind, class, fixed } => {
                let mut spec = WorkloadSpec::new(
                    next,
                    &format!("w{next}"),
                    if *project { "a" } else { "b" },
                    GpuRequest::Whole(u32::from(*gpus)),
                );
                spec.members = u32::from(*members);
                spec.kind = KINDS[*kind as usize % 5];
                spec.priority_class = Some(CLASSES[*class as usize % 3].to_string());
                spec.preemptible = fixed.then_some(false);
                next += 1;
                w.specs.insert(spec.id, spec.clone());
                w.apply(now, Event::WorkloadSubmitted(spec));
            }
            Step::Decide => {
                w.decide_holding_claims(now, !down.is_empty())?;
            }
            Step::Act => {
                let stopped = !w.to_stop.is_empty();
                for id in std::mem::take(&mut w.to_start) {
                    w.apply(now, Event::AllocationStarted { workload: id });
                    w.running.insert(id);
                    w.started_at.insert(id, now);
                }
                for id in std::mem::take(&mut w.to_stop) {
                    w.running.remove(&id);
                    w.claimed.remove(&id);
                    w.apply(now, Event::WorkloadStopped { workload: id });
                }
                if stopped {
                    w.decide_holding_claims(now, !down.is_empty())?;
                }
            }
            Step::SampleAll { permille, spike } => {
                let ids: Vec<WorkloadId> = w.running.iter().copied().collect();
                let spiking = spike.map(|i| ids.get(i % ids.len().max(1)).copied());
                for id in ids {
                    let Some(p) = w.engine.placement(id) else { continue };
                    let value = if spiking == Some(Some(id)) { Some(1000) } else { *permille };
                    let readings = p
                        .members
                        .iter()
                        .enumerate()
                        .flat_map(|(m, mp)| {
                            mp.devices.iter().map(move |d| DeviceReading {
                                member: m as u32,
                                shares: d.shares,
                                sm_active: value,
                                utilisation: value,
                                ..Default::default()
                            })
                        })
                        .collect();
                    w.apply(now, Event::ActivitySampled { workload: id, readings });
                }
            }
            Step::Probe { pick, ago_s } => {
                let ids: Vec<WorkloadId> = w.running.iter().copied().collect();
                if let Some(&id) = ids.get(pick % ids.len().max(1)) {
                    let last = Timestamp(now.0.saturating_sub(ago_s * 1000));
                    w.apply(now, Event::ActivityProbed { workload: id, last_activity: last });
                }
            }
            Step::Finish { pick } => {
                let ids: Vec<WorkloadId> = w.running.iter().copied().collect();
                if let Some(&id) = ids.get(pick % ids.len().max(1)) {
                    w.running.remove(&id);
                    w.to_stop.retain(|s| *s != id);
                    w.claimed.remove(&id);
                    w.apply(now, Event::WorkloadFinished { workload: id });
                }
            }
            Step::Wait { s } => now = Timestamp(now.0 + s * 1000),
            Step::Node { pick, up } => {
                let node = NodeId((pick % 3) as u32);
                if *up {
                    down.remove(&node);
                    w.apply(now, Event::NodeAvailable { node });
                } else {
                    down.insert(node);
                    w.apply(now, Event::NodeUnavailable { node, reason: "drained".into() });
                }
            }
        }
        w.engine.audit()?;
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn idle_reclaims_follow_the_rules(
        raw in proptest::collection::vec(raw_rule(), 1..4),
        steps in proptest::collection::vec(step(), 1..250),
    ) {
        let rules = raw.iter().enumerate().map(|(i, r)| rule(r, i)).collect();
        if let Err(e) = run(rules, &steps) {
            prop_assert!(false, "{e}");
        }
    }
}
