//! Idle evaluation (`allot_core::idle`): hand-computed cases for each rule of the three models,
//! and properties (idle time never exceeds the time observed; `Hold` never counts a gap).
//!
//! Samples come every 15 s (AMD's scrape interval) unless a case says otherwise; activities are
//! permille.

use allot_core::Timestamp;
use allot_core::idle::{
    DeviceReading, IdleModel, IdleRule, IdleStatus, IdleTracker, MissingTelemetry, Signal,
};
use proptest::prelude::*;

const S: u64 = 1000;
const MIN: u64 = 60 * S;

fn rule(model: IdleModel) -> IdleRule {
    IdleRule {
        model,
        threshold_permille: 100,
        idle_timer_ms: 15 * MIN,
        sustain_ms: 60 * S,
        missing: MissingTelemetry::Hold,
        min_runtime_ms: 0,
        ..IdleRule::allot_default()
    }
}

/// One whole device reporting utilisation only.
fn util(v: u16) -> Vec<DeviceReading> {
    vec![DeviceReading { member: 0, shares: 1000, utilisation: Some(v), ..Default::default() }]
}

/// Feed `values` (None = missing) every 15 s from `from_s`; returns the time after the last.
fn feed(t: &mut IdleTracker, from_s: u64, values: &[Option<u16>]) -> u64 {
    let mut at = from_s;
    for v in values {
        match v {
            Some(v) => t.observe(Timestamp(at * S), &util(*v)),
            None => t.observe_missing(Timestamp(at * S)),
        }
        at += 15;
    }
    at
}

#[test]
fn allot_ignores_one_spike_and_resets_on_sustained_activity() {
    let mut t = IdleTracker::new(rule(IdleModel::Allot), Timestamp(0));
    // Idle samples at 0, 15, …, 300 s: idle for 300 s.
    feed(&mut t, 0, &[Some(0); 21]);
    assert_eq!(t.idle_ms(), 300 * S);
    // One spike at 315 s (1000 ‰): the window [255, 315] holds 0,0,0,0,1000 — mean 200 ≥ 100,
    // but 1 of 5 above: not sustained. The clock runs on: 315 s.
    feed(&mut t, 315, &[Some(1000)]);
    assert_eq!(t.idle_ms(), 315 * S);
    // Idle again at 330 s: 330 s.
    feed(&mut t, 330, &[Some(0)]);
    assert_eq!(t.idle_ms(), 330 * S);
    // Busy (500 ‰) from 345 s. At 345 s the window [285, 345] is 0, 0, 1000, 0, 500: 2 of 5
    // above, not sustained: 345 s. At 360 s, [300, 360] is 0, 1000, 0, 500, 500: mean 400 and
    // 3 of 5 above: sustained → reset.
    feed(&mut t, 345, &[Some(500)]);
    assert_eq!(t.idle_ms(), 345 * S);
    feed(&mut t, 360, &[Some(500)]);
    assert_eq!(t.idle_ms(), 0);
    assert_eq!(t.status(Timestamp(360 * S)), IdleStatus::Active);
    // Busy stays busy: no idle time accrues between busy samples.
    feed(&mut t, 375, &[Some(500), Some(500)]);
    assert_eq!(t.idle_ms(), 0);
}

#[test]
fn amd_resets_on_a_single_sample_and_counts_missing_as_idle() {
    let mut t = IdleTracker::new(rule(IdleModel::AmdRm), Timestamp(0));
    feed(&mut t, 0, &[Some(0); 21]);
    assert_eq!(t.idle_ms(), 300 * S);
    feed(&mut t, 315, &[Some(100)]); // exactly the threshold: not idle → reset
    assert_eq!(t.idle_ms(), 0);
    // Missing samples are 0 %: 330 (stamp), 345, 360 → 30 s idle.
    feed(&mut t, 330, &[None, None, None]);
    assert_eq!(t.idle_ms(), 30 * S);
    assert_eq!(t.telemetry_gap_since(), Some(Timestamp(330 * S)));
}

#[test]
fn missing_telemetry_in_each_allot_mode() {
    let case = |missing: MissingTelemetry| {
        let mut t = IdleTracker::new(IdleRule { missing, ..rule(IdleModel::Allot) }, Timestamp(0));
        // Idle 0..60 s (60 s), missing 75..150 s, idle again 165, 180 s.
        feed(&mut t, 0, &[Some(0); 5]);
        feed(&mut t, 75, &[None; 6]);
        let gap = t.telemetry_gap_since();
        feed(&mut t, 165, &[Some(0), Some(0)]);
        (t.idle_ms(), gap, t.telemetry_gap_since())
    };
    // Hold: 60 s, then the gap stops the clock at each missing sample; 150 → 165 and 165 →
    // 180 count: 90 s. The gap is reported while it lasts and cleared by the next sample.
    assert_eq!(case(MissingTelemetry::Hold), (90 * S, Some(Timestamp(75 * S)), None));
    // Idle: everything from 0 to 180 s counts.
    assert_eq!(case(MissingTelemetry::Idle), (180 * S, Some(Timestamp(75 * S)), None));
    // Active: the gap resets; 150 → 165 is not idle (reset at 150), 165 → 180 is: 15 s.
    assert_eq!(case(MissingTelemetry::Active), (15 * S, Some(Timestamp(75 * S)), None));
}

#[test]
fn a_probe_caps_idle_time_at_the_last_application_activity() {
    let mut t = IdleTracker::new(rule(IdleModel::Allot), Timestamp(0));
    feed(&mut t, 0, &[Some(0); 61]); // 0..900 s: 900 s idle: the 15-minute timer has run out
    assert!(t.timer_expired(Timestamp(900 * S)));
    // A notebook server says its user typed at 840 s: idle only since then.
    t.probe(Timestamp(900 * S), Timestamp(840 * S));
    assert_eq!(t.idle_ms(), 60 * S);
    assert!(!t.timer_expired(Timestamp(900 * S)));
    // Probes do not exist for the baselines.
    let mut amd = IdleTracker::new(rule(IdleModel::AmdRm), Timestamp(0));
    feed(&mut amd, 0, &[Some(0); 61]);
    amd.probe(Timestamp(900 * S), Timestamp(840 * S));
    assert_eq!(amd.idle_ms(), 900 * S);
}

#[test]
fn nothing_is_judged_during_min_runtime() {
    let r = IdleRule { min_runtime_ms: 5 * MIN, ..rule(IdleModel::Allot) };
    let mut t = IdleTracker::new(r, Timestamp(0));
    feed(&mut t, 0, &[Some(0); 20]); // 0..285 s: all inside the grace
    assert_eq!(t.status(Timestamp(285 * S)), IdleStatus::Grace);
    assert_eq!(t.idle_ms(), 0);
    feed(&mut t, 300, &[Some(0); 3]); // 300, 315, 330: 30 s idle after the grace
    assert_eq!(t.status(Timestamp(330 * S)), IdleStatus::Idle { idle_ms: 30 * S });
    // AMD has no start-up grace.
    let mut amd = IdleTracker::new(IdleRule { model: IdleModel::AmdRm, ..r }, Timestamp(0));
    feed(&mut amd, 0, &[Some(0); 3]);
    assert_eq!(amd.idle_ms(), 30 * S);
}

#[test]
fn activity_uses_the_best_signal_normalised_by_share_and_the_busiest_member() {
    let t = IdleTracker::new(rule(IdleModel::Allot), Timestamp(0));
    // A 250-share slice of a device at 10 % SM-active (utilisation 90 %): 40 % of its share.
    let slice = DeviceReading {
        member: 0,
        shares: 250,
        sm_active: Some(100),
        engine_active: None,
        utilisation: Some(900),
    };
    assert_eq!(t.activity(&[slice]), Some((400, Signal::SmActive)));
    // Two members: member 0 has devices at 0 and 200 engine-active (mean 100), member 1 one
    // device with utilisation only at 50. The workload is as busy as member 0; the weakest
    // signal used is utilisation.
    let dev = |member, engine: Option<u16>, util: Option<u16>| DeviceReading {
        member,
        shares: 1000,
        sm_active: None,
        engine_active: engine,
        utilisation: util,
    };
    let gang = [dev(0, Some(0), None), dev(0, Some(200), None), dev(1, None, Some(50))];
    assert_eq!(t.activity(&gang), Some((100, Signal::Utilisation)));
    // No signal at all is missing telemetry, not 0.
    assert_eq!(t.activity(&[dev(0, None, None)]), None);
    // AMD reads utilisation only, not normalised by share: 900.
    let amd = IdleTracker::new(rule(IdleModel::AmdRm), Timestamp(0));
    assert_eq!(amd.activity(&[slice]), Some((900, Signal::Utilisation)));
}

#[test]
fn runai_counts_whole_30_second_windows_of_exact_zero() {
    let mut t = IdleTracker::new(rule(IdleModel::RunAi), Timestamp(0));
    // Windows [0,30) and [30,60) all zero; the sample at 60 s closes the second: 60 s.
    feed(&mut t, 0, &[Some(0), Some(0), Some(0), Some(0), Some(0)]);
    assert_eq!(t.idle_ms(), 60 * S);
    // 1 ‰ at 75 s makes [60,90) non-zero: closing it (at 90 s) resets to 0.
    feed(&mut t, 75, &[Some(1), Some(0)]);
    assert_eq!(t.idle_ms(), 0);
    // A missing sample is no evidence: [90,120) with one zero and one missing adds 30 s when
    // 120 s closes it.
    feed(&mut t, 105, &[None, Some(0)]);
    assert_eq!(t.idle_ms(), 30 * S);
}

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Idle time never exceeds the time since the grace ended; in `Hold` mode it never exceeds
    /// the time between consecutive *samples* (gaps do not count).
    #[test]
    fn idle_time_is_bounded_by_observed_time(
        steps in proptest::collection::vec((1u64..120, proptest::option::of(0u16..1200)), 1..80),
        model in 0u8..3,
        missing in 0u8..3,
        min_runtime_s in 0u64..120,
    ) {
        let model = [IdleModel::Allot, IdleModel::AmdRm, IdleModel::RunAi][model as usize];
        let missing = [MissingTelemetry::Hold, MissingTelemetry::Idle, MissingTelemetry::Active]
            [missing as usize];
        let r = IdleRule { missing, min_runtime_ms: min_runtime_s * S, ..rule(model) };
        let mut t = IdleTracker::new(r, Timestamp(0));
        let mut at = 0;
        let mut sampled_pairs = 0; // time between consecutive samples, both past the grace
        let mut last_sample: Option<u64> = None;
        for (dt, v) in steps {
            at += dt * S;
            match v {
                Some(v) => {
                    t.observe(Timestamp(at), &util(v));
                    if at >= min_runtime_s * S || model != IdleModel::Allot {
                        if let Some(prev) = last_sample {
                            sampled_pairs += at - prev;
                        }
                        last_sample = Some(at);
                    }
                }
                None => t.observe_missing(Timestamp(at)),
            }
            let since_grace = if model == IdleModel::Allot { at.saturating_sub(min_runtime_s * S) } else { at };
            // Run:ai counts whole windows, so it may round a started window up by < 30 s.
            let slack = if model == IdleModel::RunAi { 30 * S } else { 0 };
            prop_assert!(t.idle_ms() <= since_grace + slack, "idle {} > {}", t.idle_ms(), since_grace);
            if model == IdleModel::Allot && missing == MissingTelemetry::Hold {
                prop_assert!(t.idle_ms() <= sampled_pairs, "hold counted a gap: {} > {}", t.idle_ms(), sampled_pairs);
            }
        }
    }
}
