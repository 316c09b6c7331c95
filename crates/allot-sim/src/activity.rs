//! The seeded activity model: how busy a job's GPUs are while it holds them.
//!
//! A job's activity is piecewise constant over slots of [`SLOT_S`] seconds and a pure function
//! of (seed, job id, kind, slot): no state, no draws shared between jobs, so replays are
//! byte-identical and the cost is one hash per slot touched. Slots are counted on the job's
//! *progress* clock (work done, which repeats after a pre-emption loses work) for notebooks,
//! training, batch and hung jobs, and on the trace's wall clock for inference and services
//! (their load follows the time of day). Parameters and what they rest on:
//! `docs/design/activity-model.md`.

use allot_core::WorkloadKind;

use crate::rng::SimRng;

/// Length of one activity slot, seconds: finer than the shortest idle timer the product
/// reasons about (15 min), coarse enough that a 37-day Philly job is ~10,700 slots.
pub const SLOT_S: f64 = 300.0;

/// The model's parameters. `Default` is the documented calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivityParams {
    /// Share of jobs (any kind) that hang: 0 % activity from a seeded point to their end.
    pub hung_share: f64,
    /// Training: per-job base activity drawn uniformly in this range.
    pub training_base: (f64, f64),
    /// Training: share of slots that are input stalls, and the activity left in one (× base).
    pub training_stall_share: f64,
    pub training_stall_level: (f64, f64),
    /// Batch: per-job base activity range (stalls as training).
    pub batch_base: (f64, f64),
    /// Notebooks: session windows of this many slots; share of windows with a user at work;
    /// share of slots in such a window that run something; activity of such a slot.
    pub notebook_session_slots: u64,
    pub notebook_session_share: f64,
    pub notebook_burst_share: f64,
    pub notebook_burst_level: (f64, f64),
    /// Notebooks: the abandoned tail, as a share of the run, drawn per job.
    pub notebook_abandoned_tail: (f64, f64),
    /// Inference and service: per-job daytime peak; night floor; hour of the trough.
    pub inference_peak: (f64, f64),
    pub service_peak: (f64, f64),
    pub diurnal_floor: f64,
    pub diurnal_trough_hour: f64,
    /// Seconds from the trace's t = 0 back to the previous local midnight (Philly's first job
    /// was submitted at 10:30:41, so 37,841).
    pub day_offset_s: f64,
}

impl Default for ActivityParams {
    fn default() -> ActivityParams {
        ActivityParams {
            hung_share: 0.02,
            training_base: (0.55, 0.95),
            training_stall_share: 0.15,
            training_stall_level: (0.05, 0.4),
            batch_base: (0.4, 0.9),
            notebook_session_slots: 6,
            notebook_session_share: 0.5,
            notebook_burst_share: 0.4,
            notebook_burst_level: (0.3, 0.9),
            notebook_abandoned_tail: (0.3, 0.8),
            inference_peak: (0.3, 0.7),
            service_peak: (0.1, 0.4),
            diurnal_floor: 0.02,
            diurnal_trough_hour: 4.0,
            day_offset_s: 0.0,
        }
    }
}

/// Purposes that keep each family of draws independent of the others (`SimRng::fork`).
const PURPOSE_KIND: u64 = 1;
const PURPOSE_JOB: u64 = 2;
const PURPOSE_SLOT: u64 = 3;

/// The kind a job gets when its trace names none: a documented, seeded assignment by shape.
/// Multi-GPU jobs are training (distributed work); single-GPU (or fractional) jobs are mostly
/// training too (Philly is a training cluster), with shares of notebooks and batch among short
/// jobs and of long-lived inference/service endpoints among long ones.
pub fn assign_kind(seed: u64, job_id: u64, total_gpus_milli: u64, duration_s: f64) -> WorkloadKind {
    if total_gpus_milli > 1000 {
        return WorkloadKind::Training;
    }
    let u = SimRng::new(seed).fork(PURPOSE_KIND).fork(job_id).unit();
    if duration_s <= 8.0 * 3600.0 {
        match u {
            u if u < 0.25 => WorkloadKind::Notebook,
            u if u < 0.40 => WorkloadKind::Batch,
            _ => WorkloadKind::Training,
        }
    } else {
        match u {
            u if u < 0.10 => WorkloadKind::Inference,
            u if u < 0.15 => WorkloadKind::Service,
            u if u < 0.25 => WorkloadKind::Notebook,
            _ => WorkloadKind::Training,
        }
    }
}

/// One job's activity schedule: the per-job draws, made once.
#[derive(Clone, Debug)]
pub struct JobActivity {
    kind: WorkloadKind,
    slot_rng: SimRng,
    /// Progress (s) from which a hung job shows 0 %; `None` if it never hangs.
    hung_from_s: Option<f64>,
    /// Training/batch base activity; inference/service peak.
    level: f64,
    /// Notebook: progress (s) from which the notebook is abandoned.
    abandoned_from_s: f64,
}

fn between(rng: &mut SimRng, range: (f64, f64)) -> f64 {
    range.0 + (range.1 - range.0) * rng.unit()
}

impl JobActivity {
    /// The schedule of job `job_id` of `kind` that runs `duration_s` seconds of work.
    pub fn new(
        params: &ActivityParams,
        seed: u64,
        job_id: u64,
        kind: WorkloadKind,
        duration_s: f64,
    ) -> JobActivity {
        let job_rng = SimRng::new(seed).fork(PURPOSE_JOB).fork(job_id);
        let mut rng = job_rng.clone();
        let hung = rng.unit() < params.hung_share;
        let hung_from = rng.unit() * 0.8 + 0.1;
        let level = match kind {
            WorkloadKind::Training => between(&mut rng, params.training_base),
            WorkloadKind::Batch => between(&mut rng, params.batch_base),
            WorkloadKind::Inference => between(&mut rng, params.inference_peak),
            WorkloadKind::Service => between(&mut rng, params.service_peak),
            WorkloadKind::Notebook => 0.0,
        };
        let tail = between(&mut rng, params.notebook_abandoned_tail);
        JobActivity {
            kind,
            slot_rng: job_rng.fork(PURPOSE_SLOT),
            hung_from_s: hung.then_some(duration_s * hung_from),
            level,
            abandoned_from_s: duration_s * (1.0 - tail),
        }
    }

    pub fn kind(&self) -> WorkloadKind {
        self.kind
    }

    /// Whether this job hangs at some point of its run.
    pub fn hangs(&self) -> bool {
        self.hung_from_s.is_some()
    }

    /// Whether activity follows the wall clock (time of day) rather than progress.
    fn diurnal(&self) -> bool {
        matches!(self.kind, WorkloadKind::Inference | WorkloadKind::Service)
    }

    /// Activity in [0, 1] at progress `progress_s` and trace time `abs_s`.
    pub fn at(&self, params: &ActivityParams, progress_s: f64, abs_s: f64) -> f64 {
        if self.hung_from_s.is_some_and(|h| progress_s >= h) {
            return 0.0;
        }
        let clock = if self.diurnal() { abs_s } else { progress_s };
        self.slot_value(params, (clock.max(0.0) / SLOT_S) as u64, progress_s)
    }

    /// The activity of slot `slot` (on the job's own clock).
    fn slot_value(&self, params: &ActivityParams, slot: u64, progress_s: f64) -> f64 {
        let mut rng = self.slot_rng.fork(slot);
        match self.kind {
            WorkloadKind::Training | WorkloadKind::Batch => {
                if rng.unit() < params.training_stall_share {
                    self.level * between(&mut rng, params.training_stall_level)
                } else {
                    self.level * between(&mut rng, (0.9, 1.0))
                }
            }
            WorkloadKind::Notebook => {
                if progress_s >= self.abandoned_from_s {
                    return 0.0;
                }
                if !self.window_present(params, slot) {
                    return 0.0;
                }
                if rng.unit() < params.notebook_burst_share {
                    between(&mut rng, params.notebook_burst_level)
                } else {
                    0.01 * rng.unit()
                }
            }
            WorkloadKind::Inference | WorkloadKind::Service => {
                let mid = (slot as f64 + 0.5) * SLOT_S + params.day_offset_s;
                let hour = (mid / 3600.0).rem_euclid(24.0);
                let phase = (hour - params.diurnal_trough_hour) / 24.0 * std::f64::consts::TAU;
                let load = 0.5 - 0.5 * phase.cos();
                let value = params.diurnal_floor + (self.level - params.diurnal_floor) * load;
                (value * between(&mut rng, (0.8, 1.2))).clamp(0.0, 1.0)
            }
        }
    }

    /// Notebooks: whether the user is at work at progress `progress_s` — inside a session
    /// window with the user present and before the abandoned tail. In such a window the
    /// notebook's slots are bursts or think time; outside it they are 0 %. A hang does not
    /// send the user away (the kernel is stuck, the user is still there). Always `false` for
    /// other kinds, which have no user session.
    pub fn user_present(&self, params: &ActivityParams, progress_s: f64) -> bool {
        self.kind == WorkloadKind::Notebook
            && progress_s < self.abandoned_from_s
            && self.window_present(params, (progress_s.max(0.0) / SLOT_S) as u64)
    }

    /// Whether the session window holding slot `slot` has the user present. The draw is the
    /// window's (not the slot's), so all slots of a window agree.
    fn window_present(&self, params: &ActivityParams, slot: u64) -> bool {
        let window = slot / params.notebook_session_slots.max(1);
        self.slot_rng.fork(u64::MAX - window).unit() < params.notebook_session_share
    }

    /// Activity-seconds over a stretch of `len_s` seconds of running that starts at progress
    /// `progress_s` and trace time `abs_s` (both advance together while a job runs).
    pub fn integral(
        &self,
        params: &ActivityParams,
        progress_s: f64,
        abs_s: f64,
        len_s: f64,
    ) -> f64 {
        if len_s <= 0.0 {
            return 0.0;
        }
        let diurnal = self.diurnal();
        let mut total = 0.0;
        let mut done = 0.0;
        // Walk the boundaries where the value can change: slot edges on the job's clock,
        // the hang point and the notebook's abandon point (both on the progress clock).
        while done < len_s {
            let p = progress_s + done;
            let clock = if diurnal { abs_s + done } else { p };
            let slot = (clock.max(0.0) / SLOT_S) as u64;
            let mut next = ((slot + 1) as f64 * SLOT_S - clock).max(1e-9);
            for edge in [self.hung_from_s, Some(self.abandoned_from_s)].into_iter().flatten() {
                if edge > p && edge - p < next {
                    next = edge - p;
                }
            }
            let step = next.min(len_s - done);
            let value = if self.hung_from_s.is_some_and(|h| p >= h) {
                0.0
            } else {
                self.slot_value(params, slot, p)
            };
            total += value * step;
            done += step;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(kind: WorkloadKind, seed: u64, jobs: u64, duration_s: f64) -> f64 {
        let params = ActivityParams { hung_share: 0.0, ..ActivityParams::default() };
        let total: f64 = (0..jobs)
            .map(|id| {
                JobActivity::new(&params, seed, id, kind, duration_s)
                    .integral(&params, 0.0, 0.0, duration_s)
            })
            .sum();
        total / (jobs as f64 * duration_s)
    }

    #[test]
    fn kinds_have_the_documented_mean_activity() {
        // Expected means follow from the defaults (docs/design/activity-model.md).
        let training = mean(WorkloadKind::Training, 42, 400, 86_400.0);
        assert!((0.62..0.72).contains(&training), "training {training}");
        let notebook = mean(WorkloadKind::Notebook, 42, 400, 86_400.0);
        assert!((0.03..0.10).contains(&notebook), "notebook {notebook}");
        let inference = mean(WorkloadKind::Inference, 42, 400, 7.0 * 86_400.0);
        assert!((0.2..0.3).contains(&inference), "inference {inference}");
    }

    #[test]
    fn integral_agrees_with_point_values_and_is_deterministic() {
        let params = ActivityParams { hung_share: 1.0, ..ActivityParams::default() };
        for kind in [WorkloadKind::Training, WorkloadKind::Notebook, WorkloadKind::Service] {
            let job = JobActivity::new(&params, 7, 11, kind, 20_000.0);
            let by_seconds: f64 =
                (0..20_000).map(|s| job.at(&params, s as f64 + 0.5, 1000.0 + s as f64 + 0.5)).sum();
            let integral = job.integral(&params, 0.0, 1000.0, 20_000.0);
            assert!((by_seconds - integral).abs() < 1e-6 * 20_000.0 + 1.0, "{kind:?}");
            let again = JobActivity::new(&params, 7, 11, kind, 20_000.0);
            assert_eq!(
                integral.to_bits(),
                again.integral(&params, 0.0, 1000.0, 20_000.0).to_bits()
            );
            // Hung from some point on: the last slot is idle.
            assert_eq!(job.at(&params, 19_999.0, 0.0), 0.0);
        }
    }

    #[test]
    fn a_notebook_is_busy_only_while_its_user_is_present() {
        let params = ActivityParams { hung_share: 0.0, ..ActivityParams::default() };
        let (mut present, mut absent) = (0, 0);
        for id in 0..50 {
            let job = JobActivity::new(&params, 3, id, WorkloadKind::Notebook, 36_000.0);
            for slot in 0..120 {
                let p = slot as f64 * SLOT_S + 1.0;
                if job.user_present(&params, p) {
                    present += 1;
                } else {
                    absent += 1;
                    assert_eq!(job.at(&params, p, p), 0.0, "job {id} slot {slot}");
                }
                // A window's slots agree (before the user leaves for good).
                let window_start = (slot / 6 * 6) as f64 * SLOT_S + 1.0;
                if p < job.abandoned_from_s {
                    assert_eq!(
                        job.user_present(&params, p),
                        job.user_present(&params, window_start)
                    );
                }
            }
            // The abandoned tail (at least the last 30 %) has nobody.
            assert!(!job.user_present(&params, 36_000.0 * 0.71));
        }
        assert!(present > 500 && absent > 1500, "{present} {absent}");
        let training = JobActivity::new(&params, 3, 1, WorkloadKind::Training, 36_000.0);
        assert!(!training.user_present(&params, 10.0));
    }

    #[test]
    fn kind_assignment_follows_shape() {
        assert_eq!(assign_kind(1, 5, 8000, 100.0), WorkloadKind::Training);
        let short: Vec<_> = (0..1000).map(|id| assign_kind(1, id, 1000, 600.0)).collect();
        let notebooks = short.iter().filter(|k| **k == WorkloadKind::Notebook).count();
        assert!((200..300).contains(&notebooks), "{notebooks}");
        assert!(!short.contains(&WorkloadKind::Inference));
    }
}
