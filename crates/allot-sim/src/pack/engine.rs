//! The packing experiment run through allot's engine (`allot sim pack --engine`): each pod is
//! submitted to an [`Engine`] as a one-member workload, one cycle runs, and its `Admit` is
//! booked — the placement code the daemon, `plan` and the backends act through, with the
//! target mix the engine learns from the submissions (it is not given the trace's). A pod the
//! cycle defers fits nowhere: it is cancelled and counted failed, as the experiment skips it.
//! Allocation and fragmentation are measured on a [`PackCluster`] that books the engine's
//! placements, with the trace's mix, exactly as for the other policies.
//!
//! With a migration budget (`--migrate PCT`), pods are preemptible, their project suspends
//! (a move), and the engine's defragmentation runs with `consolidate_shares`: a pod that fits
//! nowhere may have placed pods moved out of its way, by the engine's own plan, which it
//! carries out only when every moved pod can restart elsewhere at once (the pod waited 0 ms,
//! so its gain never beats a cost). The budget is the engine's `victims_max`, set before each
//! pod to what is left of PCT % of the pods placed so far, so no plan can pass it.

use std::collections::BTreeMap;

use allot_core::packing::{ModelSet, PackCluster, PackNodeSpec, PackPlacement, PodShape};
use allot_core::{
    Decision, Defragmentation, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec,
    PreemptReason, PreemptionGuard, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Shares, Timestamp, WorkloadId, WorkloadSpec,
};

use super::{MigrationStats, PackInput, SeedRun, arrivals, node_order, run_sequence};

/// The one project every pod belongs to; its guarantee is the whole fleet.
const PROJECT: &str = "pods";

/// One seed's run through the engine.
pub fn run_seed_engine(input: &PackInput, inflate: f64, seed: u64) -> Result<SeedRun, String> {
    run_seed_engine_migrating(input, inflate, seed, None)
}

/// One seed's run through the engine, with a migration budget of `migrate_pct` % of the pods
/// placed so far (module docs); `None`: no pod is ever moved (the plain run).
pub fn run_seed_engine_migrating(
    input: &PackInput,
    inflate: f64,
    seed: u64,
    migrate_pct: Option<f64>,
) -> Result<SeedRun, String> {
    let sequence = arrivals(input, inflate, seed);
    let order = node_order(input, seed);
    let policy = engine_policy(&order, migrate_pct.is_some());
    let mut engine = Engine::new(&engine_nodes(input, &order), &policy)
        .map_err(|e| format!("the engine refused the node list: {e}"))?;
    let mut run =
        Placer { input, pods: BTreeMap::new(), migrate_pct, stats: MigrationStats::default() };
    run.stats.budget_pct = migrate_pct.unwrap_or(0.0);
    let mut next_id = 0u64;
    let mut error = None;
    let mut seed_run = run_sequence(input, seed, &order, &sequence, inflate, |pod, cluster| {
        next_id += 1;
        match run.place(&mut engine, pod, next_id, cluster) {
            Ok(placed) => placed,
            Err(e) => {
                error.get_or_insert(e);
                false
            }
        }
    });
    if let Some(e) = error {
        return Err(e);
    }
    if migrate_pct.is_some() {
        let stats = &mut run.stats;
        stats.pods_placed = run.pods.len();
        stats.moved_pct = pct(stats.pods_moved, stats.pods_placed);
        stats.move_cost_gpu_hours = round4(stats.move_cost_gpu_ms as f64 / 3_600_000.0);
        seed_run.migration = Some(run.stats);
    }
    Ok(seed_run)
}

fn pct(part: usize, whole: usize) -> f64 {
    (10_000.0 * part as f64 / whole.max(1) as f64).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The pods the engine placed, and the books of the moves it made.
struct Placer<'a> {
    input: &'a PackInput,
    /// Every placed pod: its shape and where it is booked, to book it again when it moves.
    pods: BTreeMap<WorkloadId, (PodShape, PackPlacement)>,
    migrate_pct: Option<f64>,
    stats: MigrationStats,
}

impl Placer<'_> {
    /// Submits one pod, runs a cycle and books what it decided; false when the pod fits
    /// nowhere. A defragmentation plan for it: its victims stop, and a second cycle places it
    /// and restarts them.
    fn place(
        &mut self,
        engine: &mut Engine,
        pod: &PodShape,
        id: u64,
        cluster: &mut PackCluster,
    ) -> Result<bool, String> {
        let now = Timestamp(id);
        let workload = WorkloadId(id);
        if let Some(pct) = self.migrate_pct {
            // What is left of the budget bounds the plan (the engine's `victims_max`).
            let allowed = (pct * self.pods.len() as f64 / 100.0 + 1e-9).floor() as usize;
            let left = allowed.saturating_sub(self.stats.pods_moved);
            engine.set_defragmentation((left > 0).then(|| Defragmentation {
                consolidate_shares: true,
                victims_max: Some(u32::try_from(left).unwrap_or(u32::MAX)),
                ..Defragmentation::default()
            }));
        }
        engine.apply(now, Event::WorkloadSubmitted(workload_spec(self.input, pod, id)));
        let mut placed = false;
        let mut moving: Vec<WorkloadId> = Vec::new();
        let mut plan_cost_gpu_ms = 0;
        for decision in engine.decide_changes(now) {
            match decision {
                Decision::Admit { workload: w, placement, .. } if w == workload => {
                    self.book(engine, now, w, *pod, &placement, cluster)?;
                    placed = true;
                }
                Decision::Admit { workload: w, .. } => {
                    return Err(format!("pod {id}: the engine admitted workload {} again", w.0));
                }
                Decision::Preempt {
                    victim,
                    for_workload,
                    reason: PreemptReason::Defragment { cost_gpu_ms, .. },
                    ..
                } if for_workload == workload && self.migrate_pct.is_some() => {
                    moving.push(victim);
                    // Every victim's reason carries the whole plan's cost.
                    plan_cost_gpu_ms = cost_gpu_ms;
                }
                Decision::Preempt { .. } | Decision::Reclaim { .. } | Decision::Stop { .. } => {
                    return Err(format!("pod {id}: the engine stopped running work: {decision:?}"));
                }
                Decision::Defer { .. } | Decision::Reject { .. } | Decision::Warn { .. } => {}
            }
        }
        if !moving.is_empty() {
            placed = self.carry_out_moves(engine, now, workload, *pod, &moving, cluster)?;
            self.stats.plans += 1;
            self.stats.pods_moved += moving.len();
            self.stats.move_cost_gpu_ms =
                self.stats.move_cost_gpu_ms.saturating_add(plan_cost_gpu_ms);
        }
        if !placed {
            engine.apply(now, Event::WorkloadCancelled { workload });
            engine.decide_changes(now);
        }
        Ok(placed)
    }

    /// The victims of a plan for `workload` stop; the next cycle places `workload` and
    /// restarts them where it says. A victim it does not restart is lost: cancelled and
    /// counted (`pods_lost`). Whether `workload` was placed.
    fn carry_out_moves(
        &mut self,
        engine: &mut Engine,
        now: Timestamp,
        workload: WorkloadId,
        pod: PodShape,
        moving: &[WorkloadId],
        cluster: &mut PackCluster,
    ) -> Result<bool, String> {
        let mut shapes = BTreeMap::new();
        for &v in moving {
            engine.apply(now, Event::WorkloadStopped { workload: v });
            let Some((shape, at)) = self.pods.remove(&v) else {
                return Err(format!("workload {} moved but was never placed", v.0));
            };
            cluster.release(&shape, &at);
            shapes.insert(v, shape);
        }
        let mut placed = false;
        for decision in engine.decide_changes(now) {
            match decision {
                Decision::Admit { workload: w, placement, .. } if w == workload => {
                    self.book(engine, now, w, pod, &placement, cluster)?;
                    placed = true;
                }
                Decision::Admit { workload: w, placement, .. } => {
                    let Some(shape) = shapes.remove(&w) else {
                        return Err(format!("workload {}: admitted while no move waits", w.0));
                    };
                    self.book(engine, now, w, shape, &placement, cluster)?;
                }
                Decision::Defer { .. } | Decision::Reject { .. } | Decision::Warn { .. } => {}
                other => {
                    return Err(format!("a move for {}: unexpected {other:?}", workload.0));
                }
            }
        }
        for (v, _) in shapes {
            engine.apply(now, Event::WorkloadCancelled { workload: v });
            self.stats.pods_lost += 1;
        }
        Ok(placed)
    }

    /// Books an admission in the measuring cluster and tells the engine it started.
    fn book(
        &mut self,
        engine: &mut Engine,
        now: Timestamp,
        workload: WorkloadId,
        pod: PodShape,
        placement: &allot_core::Placement,
        cluster: &mut PackCluster,
    ) -> Result<(), String> {
        let Some(member) = placement.members.first() else {
            return Err(format!("workload {}: an admission with no member", workload.0));
        };
        let gpus = member.devices.iter().map(|d| d.device as u8).collect();
        let at = PackPlacement { node: member.node.0 as usize, gpus };
        cluster.commit(&pod, &at);
        engine.apply(now, Event::AllocationStarted { workload });
        self.pods.insert(workload, (pod, at));
        Ok(())
    }
}

/// Node `i` of the seed's order becomes engine node `i`, so that node ids break ties in the
/// seed's order as the other policies' node order does.
fn engine_nodes(input: &PackInput, order: &[PackNodeSpec]) -> Vec<NodeSpec> {
    order
        .iter()
        .enumerate()
        .map(|(i, spec)| NodeSpec {
            name: format!("node-{i}"),
            cpu_millis: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..spec.gpus)
                .map(|_| DeviceSpec {
                    model: input.models[usize::from(spec.model)].clone(),
                    memory_mib: 0,
                    island: 0,
                    mig: false,
                })
                .collect(),
        })
        .collect()
}

/// One project over the whole fleet. Migrating: its pods are preemptible and suspend (a move);
/// defragmentation is set per pod (`Placer::place`).
fn engine_policy(order: &[PackNodeSpec], migrating: bool) -> PolicySpec {
    let gpus: u64 = order.iter().map(|n| u64::from(n.gpus)).sum();
    PolicySpec {
        priority_classes: vec![PriorityClassSpec {
            name: "normal".into(),
            value: 0,
            preemptible: migrating,
        }],
        default_priority_class: "normal".into(),
        projects: vec![ProjectSpec {
            name: PROJECT.into(),
            cohort: None,
            department: None,
            quotas: vec![QuotaSpec {
                model: QuotaModel::Any,
                guaranteed: Shares::from_gpus(gpus),
                borrow_limit: None,
                lend_limit: None,
            }],
            weight_milli: 1000,
            queueing: Queueing::BestEffortFifo,
            preemption_mode: None,
            preempt_within_project: Default::default(),
            borrow_within_cohort: None,
        }],
        fair_share_half_life_ms: 0,
        preemption_mode: PreemptionMode::Suspend,
        preemption_guard: PreemptionGuard::DEFAULT,
        defragmentation: None,
        idle: Vec::new(),
        restart_cost_ms: 0,
        idle_resume_backoff_ms: 0,
        cohorts: Vec::new(),
        fair_sharing: None,
        reservations: None,
    }
}

fn workload_spec(input: &PackInput, pod: &PodShape, id: u64) -> WorkloadSpec {
    let request = if pod.is_cpu_only() {
        GpuRequest::Whole(0)
    } else if pod.gpus == 1 && pod.gpu_milli < 1000 {
        GpuRequest::Shares(u32::from(pod.gpu_milli))
    } else {
        GpuRequest::Whole(u32::from(pod.gpus))
    };
    let mut spec = WorkloadSpec::new(id, &format!("pod-{id}"), PROJECT, request);
    spec.cpu_millis_per_member = pod.cpu_milli;
    spec.memory_mib_per_member = pod.memory_mib;
    if pod.models != ModelSet::ANY && !pod.is_cpu_only() {
        spec.gpu_models = (0..input.models.len())
            .filter(|&m| pod.models.contains(m as u8))
            .map(|m| input.models[m].clone())
            .collect();
    }
    spec
}
