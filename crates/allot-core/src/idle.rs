//! Idle evaluation: is a running workload idle, since how long, and on what evidence.
//!
//! Pure and per workload: the caller feeds an [`IdleTracker`] the activity samples attributed to
//! the workload's allocation (one value per allocated device, from whichever signal the device
//! reports), the times telemetry was missing, and application probes' "last activity at"; the
//! tracker keeps the idle time and says whether the workload may be reclaimed. The engine's
//! engine keeps one per running workload that an idle rule covers (`engine/idle.rs`).
//!
//! Three models, chosen per rule ([`IdleModel`]):
//!
//! - **`Allot`** (the default). A device's activity comes from the best signal it reports —
//!   SM-active, else engine-active, else utilisation ([`Signal`], recorded) — and is normalised
//!   by the allocated share (250 shares at 10 % device activity is 40 % of its share). A member's
//!   activity is the share-weighted mean of its devices; the workload's is the *busiest* member's
//!   (one busy member keeps a gang, since reclaiming it would stop that member too). The idle
//!   time grows between samples below the threshold. It resets only on **sustained** activity:
//!   the samples of the last `sustain_ms` cover that window, their mean is at or above the
//!   threshold and more than half of them are — one noisy spike does not reset it, short dips do
//!   not keep a busy job "idle". Missing telemetry follows [`MissingTelemetry`] (default `Hold`:
//!   the time neither advances nor resets, and the gap is reported). Nothing is judged during
//!   `min_runtime_ms` after the start. A probe's last-activity time caps the idle time at the
//!   time since that activity (a notebook whose user typed a minute ago is not idle for an hour).
//! - **`AmdRm`**: AMD Resource Manager 1.1.9 as documented (`shared/docs/reference/products.md`
//!   §2.1): per member the mean of its devices, across members the maximum (Kaiwo's default
//!   `Max`), raw utilisation against the threshold; **one** sample at or above it resets the
//!   timer; missing samples count as 0 % (idle); no start-up grace, no probes.
//! - **`RunAi`**: Run:ai's idle GPU time (§2.2): time is cut into 30 s windows from the start;
//!   a window whose samples are all exactly 0 adds 30 s, any non-zero sample resets the count to
//!   0. A window without any sample adds nothing and resets nothing (undocumented; our choice).
//!
//! Activities are in permille (0..=1000) of a device or of a share, so the core stays integer.

use std::collections::VecDeque;

use crate::ids::{SHARES_PER_GPU, Timestamp};

/// A device activity signal, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// DCGM `PROF_SM_ACTIVE`, NVML GPM SM activity: the fraction of SMs busy.
    SmActive,
    /// DCGM `PROF_GR_ENGINE_ACTIVE`, AMD `gpu_gfx_activity`: the graphics/compute engine busy.
    EngineActive,
    /// NVML/DCGM `GPU_UTIL`, AMD `gpu_busy_percent`: "a kernel ran", which overstates activity.
    Utilisation,
}

/// One allocated device's reading at one time. Each signal is optional: absent is not 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeviceReading {
    /// Gang member the device belongs to.
    pub member: u32,
    /// Shares of the device allocated to this workload (1..=1000).
    pub shares: u32,
    pub sm_active: Option<u16>,
    pub engine_active: Option<u16>,
    pub utilisation: Option<u16>,
}

impl DeviceReading {
    /// The best signal present and its value in permille of the device.
    pub fn best_signal(&self) -> Option<(Signal, u16)> {
        let clamp = |v: u16| v.min(1000);
        if let Some(v) = self.sm_active {
            Some((Signal::SmActive, clamp(v)))
        } else if let Some(v) = self.engine_active {
            Some((Signal::EngineActive, clamp(v)))
        } else {
            self.utilisation.map(|v| (Signal::Utilisation, clamp(v)))
        }
    }
}

/// Which rules judge idleness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdleModel {
    #[default]
    Allot,
    AmdRm,
    RunAi,
}

impl IdleModel {
    /// The name policy files use: `allot`, `amd_rm`, `runai`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleModel::Allot => "allot",
            IdleModel::AmdRm => "amd_rm",
            IdleModel::RunAi => "runai",
        }
    }
}

/// What a time without telemetry means (model `Allot`; the baselines have their own rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MissingTelemetry {
    /// The idle time neither advances nor resets; the gap is reported.
    #[default]
    Hold,
    /// The gap counts as idle time.
    Idle,
    /// The gap resets the idle time.
    Active,
}

/// How one workload is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleRule {
    pub model: IdleModel,
    /// Below this activity (permille of the allocated share) a sample is idle.
    pub threshold_permille: u16,
    /// Idle time after which the workload may be reclaimed.
    pub idle_timer_ms: u64,
    /// Window over which activity must be sustained to reset the idle time (`Allot`).
    pub sustain_ms: u64,
    pub missing: MissingTelemetry,
    /// No judgement this long after the start (`Allot`).
    pub min_runtime_ms: u64,
    /// `Allot`: the timer while the rule's *other* workloads in the same project are quiet —
    /// fewer than `quiet_below_permille` of them active — instead of `idle_timer_ms`; 0: none.
    /// Replicas of one service share their traffic, so when most of them are idle the service
    /// is in a quiet period and an idle one is likely to stay idle (the engine judges the
    /// peers, `engine/idle.rs`; the tracker itself does not use these three fields).
    pub quiet_timer_ms: u64,
    /// The share of the other workloads (permille) below which they are quiet.
    pub quiet_below_permille: u16,
    /// A workload counts as active while its idle time is below this; one stopped for
    /// idleness and waiting to be needed counts as quiet.
    pub quiet_window_ms: u64,
}

/// Run:ai's accounting window.
pub const RUNAI_WINDOW_MS: u64 = 30_000;
/// `IdleRule::quiet_window_ms` by default: 15 minutes.
pub const QUIET_WINDOW_DEFAULT_MS: u64 = 15 * 60_000;
/// `IdleRule::quiet_below_permille` by default: 25 %.
pub const QUIET_BELOW_DEFAULT_PERMILLE: u16 = 250;

impl IdleRule {
    /// allot's defaults: 10 %, 15 min, sustained over 60 s, hold on gaps, 5 min start-up grace.
    pub fn allot_default() -> IdleRule {
        IdleRule {
            model: IdleModel::Allot,
            threshold_permille: 100,
            idle_timer_ms: 15 * 60_000,
            sustain_ms: 60_000,
            missing: MissingTelemetry::Hold,
            min_runtime_ms: 5 * 60_000,
            quiet_timer_ms: 0,
            quiet_below_permille: QUIET_BELOW_DEFAULT_PERMILLE,
            quiet_window_ms: QUIET_WINDOW_DEFAULT_MS,
        }
    }

    /// AMD Resource Manager's rule: `threshold_permille` of raw utilisation, one sample at or
    /// above it resets, missing samples are 0 %, no grace, no sustain window.
    pub fn amd_rm(threshold_permille: u16, idle_timer_ms: u64) -> IdleRule {
        IdleRule {
            model: IdleModel::AmdRm,
            threshold_permille,
            idle_timer_ms,
            sustain_ms: 0,
            missing: MissingTelemetry::Idle,
            min_runtime_ms: 0,
            // No quiet timer: the baselines have none.
            ..IdleRule::allot_default()
        }
    }

    /// Run:ai's idle GPU time limit: 30 s windows of exactly 0 % utilisation.
    pub fn runai(idle_timer_ms: u64) -> IdleRule {
        IdleRule {
            model: IdleModel::RunAi,
            threshold_permille: 1,
            idle_timer_ms,
            sustain_ms: 0,
            missing: MissingTelemetry::Hold,
            min_runtime_ms: 0,
            // No quiet timer: the baselines have none.
            ..IdleRule::allot_default()
        }
    }
}

/// What the tracker says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStatus {
    /// Inside the start-up grace: not judged.
    Grace,
    /// Not idle now (idle time 0).
    Active,
    /// Idle for `idle_ms` (accumulated by the model's rules).
    Idle { idle_ms: u64 },
}

/// The idle state of one running workload.
#[derive(Clone, Debug)]
pub struct IdleTracker {
    rule: IdleRule,
    started_at: Timestamp,
    idle_ms: u64,
    /// Time of the last observation (sample or missing), once past the grace.
    last_at: Option<Timestamp>,
    /// Whether the time since `last_at` counts as idle when the next observation comes.
    accruing: bool,
    /// `Allot`: (time, activity) of the recent samples, oldest first, for the sustain test.
    window: VecDeque<(Timestamp, u16)>,
    /// Telemetry has been missing since then (reported; `Hold` stops the clock).
    gap_since: Option<Timestamp>,
    /// The weakest signal any device needed in the last sample.
    last_signal: Option<Signal>,
    /// `RunAi`: the current 30 s window's index and whether a non-zero sample fell in it.
    runai_window: Option<(u64, bool)>,
    /// Activity that resets the idle time has been seen (by the model's own rule).
    active_seen: bool,
}

impl IdleTracker {
    pub fn new(rule: IdleRule, started_at: Timestamp) -> IdleTracker {
        IdleTracker {
            rule,
            started_at,
            idle_ms: 0,
            last_at: None,
            accruing: false,
            window: VecDeque::new(),
            gap_since: None,
            last_signal: None,
            runai_window: None,
            active_seen: false,
        }
    }

    /// Whether activity that resets the idle time (by the model's rule) has been seen.
    pub fn active_seen(&self) -> bool {
        self.active_seen
    }

    /// Idle time accumulated so far.
    pub fn idle_ms(&self) -> u64 {
        self.idle_ms
    }

    /// When telemetry went missing, if it still is.
    pub fn telemetry_gap_since(&self) -> Option<Timestamp> {
        self.gap_since
    }

    /// The weakest signal the last sample had to use (`Utilisation` when any device lacked
    /// both profiling signals).
    pub fn signal_used(&self) -> Option<Signal> {
        self.last_signal
    }

    fn in_grace(&self, at: Timestamp) -> bool {
        self.rule.model == IdleModel::Allot && at.since(self.started_at) < self.rule.min_runtime_ms
    }

    /// The workload's activity (permille of its allocation) from one reading per device, and
    /// the weakest signal used; `None` when no device reported anything.
    pub fn activity(&self, devices: &[DeviceReading]) -> Option<(u16, Signal)> {
        // Per member: (sum of activity × shares, sum of shares, weakest signal).
        let mut members: Vec<(u32, u64, u64)> = Vec::new();
        let mut weakest = Signal::SmActive;
        let mut any = false;
        for d in devices {
            let Some((signal, raw)) = (match self.rule.model {
                IdleModel::Allot => d.best_signal(),
                IdleModel::AmdRm | IdleModel::RunAi => {
                    d.utilisation.map(|v| (Signal::Utilisation, v.min(1000)))
                }
            }) else {
                continue;
            };
            any = true;
            weakest = weakest.max(signal);
            let shares = u64::from(d.shares.clamp(1, SHARES_PER_GPU as u32));
            let value = match self.rule.model {
                // Normalised by the allocated share: activity of the device / share held.
                IdleModel::Allot => (u64::from(raw) * SHARES_PER_GPU / shares).min(1000),
                IdleModel::AmdRm | IdleModel::RunAi => u64::from(raw),
            };
            let weight = match self.rule.model {
                IdleModel::Allot => shares,
                IdleModel::AmdRm | IdleModel::RunAi => 1,
            };
            match members.iter_mut().find(|(m, _, _)| *m == d.member) {
                Some((_, sum, w)) => {
                    *sum += value * weight;
                    *w += weight;
                }
                None => members.push((d.member, value * weight, weight)),
            }
        }
        if !any {
            return None;
        }
        let busiest = members.iter().map(|&(_, sum, w)| sum / w.max(1)).max().unwrap_or(0);
        Some((u16::try_from(busiest.min(1000)).unwrap_or(1000), weakest))
    }

    /// Feed one sample at `at`: one reading per allocated device. An empty list, or readings
    /// without any signal, is missing telemetry.
    pub fn observe(&mut self, at: Timestamp, devices: &[DeviceReading]) {
        match self.activity(devices) {
            Some((value, signal)) => {
                self.last_signal = Some(signal);
                self.observe_value(at, value);
            }
            None => self.observe_missing(at),
        }
    }

    fn advance(&mut self, at: Timestamp) {
        if let Some(last) = self.last_at
            && self.accruing
        {
            self.idle_ms = self.idle_ms.saturating_add(at.since(last));
        }
        self.last_at = Some(at.max(self.last_at.unwrap_or(at)));
    }

    fn observe_value(&mut self, at: Timestamp, value: u16) {
        if self.in_grace(at) {
            return;
        }
        self.gap_since = None;
        let idle = value < self.rule.threshold_permille;
        match self.rule.model {
            IdleModel::Allot => {
                self.advance(at);
                self.window.push_back((at, value));
                let horizon = Timestamp(at.0.saturating_sub(self.rule.sustain_ms));
                // Keep one sample at or before the horizon: it shows the window is covered.
                while self.window.len() > 1
                    && self.window.get(1).is_some_and(|&(t, _)| t <= horizon)
                {
                    self.window.pop_front();
                }
                if !idle && self.sustained(horizon) {
                    self.idle_ms = 0;
                    self.active_seen = true;
                }
                // The time to the next observation is idle unless the idle time was just reset
                // (or never started): a busy but unsustained sample keeps the clock running.
                self.accruing = idle || self.idle_ms > 0;
            }
            IdleModel::AmdRm => {
                self.advance(at);
                if idle {
                    self.accruing = true;
                } else {
                    self.idle_ms = 0;
                    self.accruing = false;
                    self.active_seen = true;
                }
            }
            IdleModel::RunAi => self.runai_sample(at, value == 0),
        }
    }

    /// `Allot`: the samples cover the sustain window, their mean reaches the threshold and more
    /// than half of them do.
    fn sustained(&self, horizon: Timestamp) -> bool {
        let covered = self.window.front().is_some_and(|&(t, _)| t <= horizon);
        if !covered {
            return false;
        }
        let n = self.window.len() as u64;
        let threshold = self.rule.threshold_permille;
        let sum: u64 = self.window.iter().map(|&(_, v)| u64::from(v)).sum();
        let above = self.window.iter().filter(|&&(_, v)| v >= threshold).count() as u64;
        sum >= u64::from(threshold) * n && 2 * above > n
    }

    fn runai_sample(&mut self, at: Timestamp, zero: bool) {
        let index = at.since(self.started_at) / RUNAI_WINDOW_MS;
        match self.runai_window {
            Some((current, nonzero)) if index > current => {
                // The window closed: settle it, then open this sample's window.
                if nonzero {
                    self.idle_ms = 0;
                    self.active_seen = true;
                } else {
                    self.idle_ms = self.idle_ms.saturating_add(RUNAI_WINDOW_MS);
                }
                self.runai_window = Some((index, !zero));
            }
            Some((current, nonzero)) => self.runai_window = Some((current, nonzero || !zero)),
            None => self.runai_window = Some((index, !zero)),
        }
    }

    /// Telemetry was expected at `at` and did not come.
    pub fn observe_missing(&mut self, at: Timestamp) {
        if self.in_grace(at) {
            return;
        }
        self.gap_since.get_or_insert(at);
        match self.rule.model {
            IdleModel::Allot => match self.rule.missing {
                MissingTelemetry::Hold => {
                    // Stop the clock: the time since the last observation does not count.
                    self.last_at = Some(at);
                }
                MissingTelemetry::Idle => {
                    self.advance(at);
                    self.accruing = true;
                }
                MissingTelemetry::Active => {
                    self.advance(at);
                    self.idle_ms = 0;
                    self.accruing = false;
                    self.window.clear();
                }
            },
            // AMD counts a missing sample as 0 % (the gap is still reported).
            IdleModel::AmdRm => {
                let gap = self.gap_since;
                self.observe_value(at, 0);
                self.gap_since = gap;
            }
            // Run:ai: a missing sample is no evidence either way.
            IdleModel::RunAi => {}
        }
    }

    /// An application probe saw activity at `last_activity` (`Allot` only: the baselines have
    /// no probes). The idle time is capped at the time since then.
    pub fn probe(&mut self, now: Timestamp, last_activity: Timestamp) {
        if self.rule.model != IdleModel::Allot {
            return;
        }
        self.advance(now);
        self.idle_ms = self.idle_ms.min(now.since(last_activity));
    }

    /// The status at `now` (without advancing the clock: idle time is counted at observations).
    pub fn status(&self, now: Timestamp) -> IdleStatus {
        if self.in_grace(now) {
            IdleStatus::Grace
        } else if self.idle_ms == 0 {
            IdleStatus::Active
        } else {
            IdleStatus::Idle { idle_ms: self.idle_ms }
        }
    }

    /// Whether the idle timer has run out.
    pub fn timer_expired(&self, now: Timestamp) -> bool {
        self.expired_after(now, self.rule.idle_timer_ms)
    }

    /// Whether a timer of `timer_ms` has run out (the engine's timer may be the quiet one).
    pub fn expired_after(&self, now: Timestamp, timer_ms: u64) -> bool {
        !self.in_grace(now) && self.idle_ms >= timer_ms
    }
}

// Snapshot encoding (`codec.rs`).
crate::codec::codec_unit_enum!(Signal { SmActive, EngineActive, Utilisation });
crate::codec::codec_unit_enum!(IdleModel { Allot, AmdRm, RunAi });
crate::codec::codec_unit_enum!(MissingTelemetry { Hold, Idle, Active });
// The quiet-timer fields are not encoded: the tracker does not use them, the engine reads them
// from its rule (`Engine::from_state` puts them back), and snapshots written before they
// existed still decode.
impl crate::codec::Codec for IdleRule {
    fn encode(&self, out: &mut Vec<u8>) {
        self.model.encode(out);
        self.threshold_permille.encode(out);
        self.idle_timer_ms.encode(out);
        self.sustain_ms.encode(out);
        self.missing.encode(out);
        self.min_runtime_ms.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, crate::codec::CodecError> {
        Ok(IdleRule {
            model: crate::codec::Codec::decode(input)?,
            threshold_permille: crate::codec::Codec::decode(input)?,
            idle_timer_ms: crate::codec::Codec::decode(input)?,
            sustain_ms: crate::codec::Codec::decode(input)?,
            missing: crate::codec::Codec::decode(input)?,
            min_runtime_ms: crate::codec::Codec::decode(input)?,
            ..IdleRule::allot_default()
        })
    }
}

impl IdleTracker {
    /// After a restore: the quiet-timer fields of the rule the tracker was made from.
    pub(crate) fn restore_quiet(&mut self, from: &IdleRule) {
        self.rule.quiet_timer_ms = from.quiet_timer_ms;
        self.rule.quiet_below_permille = from.quiet_below_permille;
        self.rule.quiet_window_ms = from.quiet_window_ms;
    }
}
crate::codec::codec_struct!(IdleTracker {
    rule,
    started_at,
    idle_ms,
    last_at,
    accruing,
    window,
    gap_since,
    last_signal,
    runai_window,
    active_seen,
});
