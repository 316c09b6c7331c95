//! The seeded workload.

use allot_core::WorkloadKind;

use super::IdleSimConfig;
use crate::rng::SimRng;

/// Share of the offered GPU-hours per kind.
pub const KIND_MIX: [(WorkloadKind, f64); 5] = [
    (WorkloadKind::Notebook, 0.30),
    (WorkloadKind::Inference, 0.15),
    (WorkloadKind::Service, 0.05),
    (WorkloadKind::Training, 0.35),
    (WorkloadKind::Batch, 0.15),
];
/// The projects and their guarantees (GPUs) of [`super::idle_policies`]. Notebooks, training and
/// batch go to the first three in proportion to their guarantees; endpoints to `platform`.
pub const PROJECTS: [(&str, u64); 4] =
    [("vision", 700), ("nlp", 700), ("speech", 500), ("platform", 590)];
/// The project of inference and service endpoints.
pub const ENDPOINT_PROJECT: &str = "platform";
/// Share of workloads (any kind) of the non-preemptible class `high`.
pub const HIGH_SHARE: f64 = 0.05;
/// Notebooks: share with 2 GPUs (else 1); lifetime (wall clock), log-uniform, seconds.
pub const NOTEBOOK_TWO_GPU_SHARE: f64 = 0.10;
pub const NOTEBOOK_LIFETIME_S: (f64, f64) = (3600.0, 12.0 * 3600.0);
/// Inference and service endpoints: share with 2 GPUs (else 1).
pub const ENDPOINT_TWO_GPU_SHARE: f64 = 0.10;
/// Training: (members, GPUs per member, share). 16 GPUs are a gang of 2 × 8.
pub const TRAINING_SHAPES: [(u32, u32, f64); 5] =
    [(1, 1, 0.40), (1, 2, 0.20), (1, 4, 0.20), (1, 8, 0.15), (2, 8, 0.05)];
/// Training: work, log-uniform, seconds; checkpoint interval (of work), seconds.
pub const TRAINING_DURATION_S: (f64, f64) = (3600.0, 24.0 * 3600.0);
pub const TRAINING_CHECKPOINT_EVERY_S: f64 = 1800.0;
/// Batch: share with 2 GPUs (else 1); work, log-uniform, seconds; no checkpoints.
pub const BATCH_TWO_GPU_SHARE: f64 = 0.20;
pub const BATCH_DURATION_S: (f64, f64) = (1200.0, 4.0 * 3600.0);

/// One workload of the experiment as its user submits it.
#[derive(Clone, Debug, PartialEq)]
pub struct IdleWorkload {
    /// Unique, > 0; also the activity model's job id.
    pub id: u64,
    pub kind: WorkloadKind,
    pub project: String,
    /// `None`: the policy's default class.
    pub priority_class: Option<String>,
    pub members: u32,
    pub gpus_per_member: u32,
    pub submit_s: f64,
    /// Training and batch: seconds of work (progress). Notebooks: lifetime from submission,
    /// wall clock (the user's session ends then, running or not). Endpoints: ignored (they
    /// live to the horizon).
    pub duration_s: f64,
    /// Training: checkpoint interval (of work); `None`: cannot checkpoint.
    pub checkpoint_interval_s: Option<f64>,
}

impl IdleWorkload {
    pub fn gpus(&self) -> u64 {
        u64::from(self.members) * u64::from(self.gpus_per_member)
    }

    /// Inference and service: long-lived, from t = 0 to the horizon.
    pub fn endpoint(&self) -> bool {
        matches!(self.kind, WorkloadKind::Inference | WorkloadKind::Service)
    }
}

/// What was generated of one kind.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct MixEntry {
    pub workloads: usize,
    /// GPUs × duration (lifetime for notebooks, the horizon for endpoints), hours.
    pub offered_gpu_hours: f64,
    /// The part that falls inside the horizon if each ran from its submission.
    pub in_horizon_gpu_hours: f64,
    /// `offered_gpu_hours` / all offered GPU-hours.
    pub share: f64,
}

/// Purposes of the generator's random streams (`SimRng::fork`).
const PURPOSE_GEN: u64 = 0x1D1E;

fn log_uniform(rng: &mut SimRng, (lo, hi): (f64, f64)) -> f64 {
    lo * (hi / lo).powf(rng.unit())
}

fn kind_index(kind: WorkloadKind) -> u64 {
    match kind {
        WorkloadKind::Training => 0,
        WorkloadKind::Batch => 1,
        WorkloadKind::Notebook => 2,
        WorkloadKind::Inference => 3,
        WorkloadKind::Service => 4,
    }
}

/// The seeded workload for a cluster of `capacity_gpus` (`docs/design/idle-experiment.md`,
/// "Workload"): endpoints present from t = 0; notebooks, training and batch drawn until their
/// kind's share of `offered_load × capacity × horizon` GPU-hours is reached, each arriving at
/// a uniform time in the horizon (a Poisson process given its count). Ids follow submission.
/// Returns the workloads and the mix per kind (in [`KIND_MIX`] order, then `total`).
pub fn generate_workloads(
    capacity_gpus: u64,
    config: &IdleSimConfig,
) -> (Vec<IdleWorkload>, Vec<(String, MixEntry)>) {
    let horizon_s = config.hours * 3600.0;
    let budget_total = config.offered_load * capacity_gpus as f64 * horizon_s;
    let root = SimRng::new(config.seed).fork(PURPOSE_GEN);
    // (submit, kind order, draw number) → sortable; then ids are assigned in that order.
    let mut drawn: Vec<(u64, u64, u64, IdleWorkload)> = Vec::new();
    let guaranteed: u64 = PROJECTS[..3].iter().map(|p| p.1).sum();
    for (kind, share) in KIND_MIX {
        let budget = budget_total * share;
        let mut rng = root.fork(kind_index(kind));
        let mut offered = 0.0;
        let mut n = 0u64;
        while offered < budget && horizon_s > 0.0 {
            n += 1;
            let high = rng.unit() < HIGH_SHARE;
            let (members, per_member, duration_s, checkpoint) = match kind {
                WorkloadKind::Notebook => {
                    let g = if rng.unit() < NOTEBOOK_TWO_GPU_SHARE { 2 } else { 1 };
                    (1, g, log_uniform(&mut rng, NOTEBOOK_LIFETIME_S), None)
                }
                WorkloadKind::Inference | WorkloadKind::Service => {
                    let g = if rng.unit() < ENDPOINT_TWO_GPU_SHARE { 2 } else { 1 };
                    (1, g, horizon_s, None)
                }
                WorkloadKind::Training => {
                    let u = rng.unit();
                    let mut acc = 0.0;
                    let mut shape = TRAINING_SHAPES[TRAINING_SHAPES.len() - 1];
                    for s in TRAINING_SHAPES {
                        acc += s.2;
                        if u < acc {
                            shape = s;
                            break;
                        }
                    }
                    let d = log_uniform(&mut rng, TRAINING_DURATION_S);
                    (shape.0, shape.1, d, Some(TRAINING_CHECKPOINT_EVERY_S))
                }
                WorkloadKind::Batch => {
                    let g = if rng.unit() < BATCH_TWO_GPU_SHARE { 2 } else { 1 };
                    (1, g, log_uniform(&mut rng, BATCH_DURATION_S), None)
                }
            };
            // Whole milliseconds: the engine's clock.
            let duration_s = (duration_s * 1000.0).round() / 1000.0;
            let endpoint = matches!(kind, WorkloadKind::Inference | WorkloadKind::Service);
            let submit_ms = if endpoint { 0 } else { (rng.unit() * horizon_s * 1000.0) as u64 };
            let project = if endpoint {
                ENDPOINT_PROJECT
            } else {
                let mut pick = rng.below(guaranteed);
                let mut name = PROJECTS[0].0;
                for &(p, g) in &PROJECTS[..3] {
                    if pick < g {
                        name = p;
                        break;
                    }
                    pick -= g;
                }
                name
            };
            let w = IdleWorkload {
                id: 0,
                kind,
                project: project.to_owned(),
                priority_class: high.then(|| "high".to_owned()),
                members,
                gpus_per_member: per_member,
                submit_s: submit_ms as f64 / 1000.0,
                duration_s,
                checkpoint_interval_s: checkpoint,
            };
            offered += w.gpus() as f64 * duration_s;
            drawn.push((submit_ms, kind_index(kind), n, w));
        }
    }
    drawn.sort_by_key(|d| (d.0, d.1, d.2));
    let mut workloads: Vec<IdleWorkload> = drawn.into_iter().map(|d| d.3).collect();
    for (i, w) in workloads.iter_mut().enumerate() {
        w.id = i as u64 + 1;
    }
    let mix = mix_of(&workloads, horizon_s);
    (workloads, mix)
}

/// GPU-hours offered per kind ([`KIND_MIX`] order, then `total`).
pub fn mix_of(workloads: &[IdleWorkload], horizon_s: f64) -> Vec<(String, MixEntry)> {
    let mut entries: Vec<(String, MixEntry)> =
        KIND_MIX.iter().map(|(k, _)| (k.as_str().to_owned(), MixEntry::default())).collect();
    let mut total = MixEntry::default();
    for w in workloads {
        let length = if w.endpoint() { horizon_s } else { w.duration_s };
        let offered = w.gpus() as f64 * length / 3600.0;
        let inside =
            w.gpus() as f64 * length.min((horizon_s - w.submit_s).max(0.0)).max(0.0) / 3600.0;
        if let Some((_, e)) = entries.iter_mut().find(|(k, _)| k == w.kind.as_str()) {
            e.workloads += 1;
            e.offered_gpu_hours += offered;
            e.in_horizon_gpu_hours += inside;
        }
        total.workloads += 1;
        total.offered_gpu_hours += offered;
        total.in_horizon_gpu_hours += inside;
    }
    for (_, e) in &mut entries {
        e.share = if total.offered_gpu_hours > 0.0 {
            e.offered_gpu_hours / total.offered_gpu_hours
        } else {
            0.0
        };
    }
    total.share = if total.offered_gpu_hours > 0.0 { 1.0 } else { 0.0 };
    entries.push(("total".to_owned(), total));
    entries
}
