//! The packing experiment run through allot's engine (`allot sim pack --engine`): each pod is
//! submitted to an [`Engine`] as a one-member workload, one cycle runs, and its `Admit` is
//! booked — the placement code the daemon, `plan` and the backends act through, with the
//! target mix the engine learns from the submissions (it is not given the trace's). A pod the
//! cycle defers fits nowhere: it is cancelled and counted failed, as the experiment skips it.
//! Allocation and fragmentation are measured on a [`PackCluster`] that books the engine's
//! placements, with the trace's mix, exactly as for the other policies.

use std::collections::BTreeMap;

use allot_core::packing::{ModelSet, PackCluster, PackNodeSpec, PackPlacement, PodShape};
use allot_core::{
    Decision, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec, PreemptionGuard,
    PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Shares,
    Timestamp, WorkloadId, WorkloadSpec,
};

use super::{PackInput, SeedRun, arrivals, node_order, run_sequence};

/// The one project every pod belongs to; its guarantee is the whole fleet.
const PROJECT: &str = "pods";

/// One seed's run through the engine.
pub fn run_seed_engine(input: &PackInput, inflate: f64, seed: u64) -> Result<SeedRun, String> {
    let sequence = arrivals(input, inflate, seed);
    let order = node_order(input, seed);
    let mut engine = Engine::new(&engine_nodes(input, &order), &engine_policy(&order))
        .map_err(|e| format!("the engine refused the node list: {e}"))?;
    let mut next_id = 0u64;
    let mut error = None;
    let run = run_sequence(input, seed, &order, &sequence, inflate, |pod, cluster| {
        next_id += 1;
        match place(&mut engine, input, pod, next_id, cluster) {
            Ok(placed) => placed,
            Err(e) => {
                error.get_or_insert(e);
                false
            }
        }
    });
    match error {
        Some(e) => Err(e),
        None => Ok(run),
    }
}

/// Submits one pod, runs a cycle and books what it decided; false when the pod fits nowhere.
fn place(
    engine: &mut Engine,
    input: &PackInput,
    pod: &PodShape,
    id: u64,
    cluster: &mut PackCluster,
) -> Result<bool, String> {
    let now = Timestamp(id);
    let workload = WorkloadId(id);
    engine.apply(now, Event::WorkloadSubmitted(workload_spec(input, pod, id)));
    let mut placed = false;
    for decision in engine.decide_changes(now) {
        match decision {
            Decision::Admit { workload: w, placement, .. } if w == workload => {
                let Some(member) = placement.members.first() else {
                    return Err(format!("pod {id}: an admission with no member"));
                };
                let gpus = member.devices.iter().map(|d| d.device as u8).collect();
                cluster.commit(pod, &PackPlacement { node: member.node.0 as usize, gpus });
                engine.apply(now, Event::AllocationStarted { workload });
                placed = true;
            }
            Decision::Admit { workload: w, .. } => {
                return Err(format!("pod {id}: the engine admitted workload {} again", w.0));
            }
            Decision::Preempt { .. } | Decision::Reclaim { .. } | Decision::Stop { .. } => {
                return Err(format!("pod {id}: the engine stopped running work: {decision:?}"));
            }
            Decision::Defer { .. } | Decision::Reject { .. } | Decision::Warn { .. } => {}
        }
    }
    if !placed {
        engine.apply(now, Event::WorkloadCancelled { workload });
        engine.decide_changes(now);
    }
    Ok(placed)
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

fn engine_policy(order: &[PackNodeSpec]) -> PolicySpec {
    let gpus: u64 = order.iter().map(|n| u64::from(n.gpus)).sum();
    PolicySpec {
        priority_classes: vec![PriorityClassSpec {
            name: "normal".into(),
            value: 0,
            preemptible: false,
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
