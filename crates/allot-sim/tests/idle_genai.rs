//! The idle-reclaim experiment on real telemetry: a hand-checked endpoint under each policy
//! and the oracle, the books on the shared GenAI trace, and determinism.

use std::path::{Path, PathBuf};

use allot_sim::BadRows;
use allot_sim::genai::{GenaiTrace, load_genai, parse_genai};
use allot_sim::idle::genai::{
    GRID_QUIET_BELOW_PCT, GRID_QUIET_MIN, GenaiConfig, GenaiMetrics, SWEEP_TIMERS_MIN, SweepPoint,
    endpoint_rule, frontier, genai_json, genai_oracle, genai_policy, genai_text,
    run_genai_experiment, run_genai_policy, with_endpoint_timer,
};
use allot_sim::idle::idle_policies;

const STEP: u64 = 57;

/// A trace of containers given per slot as (duty %, requests); `None` duty: a gap. Slot 0 of
/// every container is the trace's slot `first`.
/// One slot of a hand-made container: duty cycle (`None`: a gap) and requests.
type Slot = (Option<f64>, u32);

fn trace(containers: &[(u32, Vec<Slot>)]) -> GenaiTrace {
    let mut duty = String::from("value,timestamp_anon,container_ip\n");
    let mut memory = String::from("timestamp_anon,value,container_ip\n");
    let mut qps = String::from("timestamp_anon,value,container_ip,request_type\n");
    let predict = String::from("timestamp_anon,value,container_ip\n1000,5,0a\n");
    for (k, (first, slots)) in containers.iter().enumerate() {
        let ip = format!("{k}a");
        for (i, (d, r)) in slots.iter().enumerate() {
            let t = 1000 + (u64::from(*first) + i as u64) * STEP;
            memory.push_str(&format!("{t},2e10,{ip}\n"));
            if let Some(d) = d {
                duty.push_str(&format!("{d},{t},{ip}\n"));
            }
            if *r > 0 {
                qps.push_str(&format!("{t},{},{ip},Generative Requests\n", 0.09 * f64::from(*r)));
            }
        }
    }
    parse_genai(Path::new("hand"), [&duty, &memory, &qps, &predict], BadRows::Fail).expect("parses")
}

fn config() -> GenaiConfig {
    GenaiConfig { audit: true, ..GenaiConfig::default() }
}

fn run(t: &GenaiTrace, label: &str, cfg: &GenaiConfig) -> GenaiMetrics {
    let (_, oracle) = genai_oracle(t, cfg);
    let (_, policy) =
        idle_policies().into_iter().find(|(l, _)| l == label).expect("a shipped policy");
    let policy = genai_policy(&policy, t.containers.len());
    run_genai_policy(t, label, &policy, cfg, &oracle).expect("runs")
}

/// One endpoint: busy in slot 0, then 30 idle slots (28.5 min), then a request in slot 31 at
/// low duty (as 20 % of the trace's request slots are), busy again in 32, idle to the end.
fn one_endpoint() -> GenaiTrace {
    let mut slots = vec![(Some(50.0), 1)];
    slots.extend((1..=30).map(|_| (Some(0.0), 0)));
    slots.push((Some(3.0), 1));
    slots.push((Some(60.0), 2));
    slots.extend((33..40).map(|_| (Some(0.0), 0)));
    trace(&[(0, slots)])
}

#[test]
fn amd_reclaims_the_idle_endpoint_and_delays_its_next_requests() {
    let t = one_endpoint();
    let cfg = config();
    let amd = run(&t, "amd_rm", &cfg);
    // Idle from its first reading of slot 1 (57 s); 15 minutes later (957 s) the timer has run
    // out; the next cycle, at slot 17 (969 s), AMD's pressure check (the backfill job waits)
    // deletes it. Needed again at slot 31 (1,767 s): 798 s reclaimed. Slot 39 is idle, but
    // the 60-s cold start and AMD's 15-minute timer leave no second reclaim before the end.
    assert_eq!((amd.reclaims, amd.cold_starts, amd.redeployed), (1, 1, 1));
    assert!((amd.reclaimed_gpu_hours - 798.0 / 3600.0).abs() < 1e-9, "{amd:?}");
    // Needed 798 s after the reclaim, within 15 minutes: false.
    assert_eq!(amd.false_reclaims, 1);
    // Slot 31's request (1,767 s) and slot 32's two (1,824 s) arrive before it is warm again
    // at 1,767 + 60 = 1,827 s.
    assert_eq!(amd.delayed_requests, 3);
    assert_eq!(amd.backfill_preemptions, 1);
    // The oracle: the idle run of slots 1–30 (57 … 1,767 s) less the cold start, and the
    // tail from slot 33 to the end (1,881 … 2,280 s) with no restart.
    let (oracle, _) = genai_oracle(&t, &cfg);
    let expected = (1767.0 - 60.0 - 57.0) + (2280.0 - 1881.0);
    assert!((oracle.reclaimed_gpu_hours - expected / 3600.0).abs() < 1e-9, "{oracle:?}");
    assert_eq!((oracle.reclaims, oracle.cold_starts, oracle.delayed_requests), (2, 1, 0));
    // AMD reclaimed 969 … 1,767 s of the oracle's 57 … 1,707 s and 1,881 … 2,280 s.
    let missed = (969.0 - 57.0) + (2280.0 - 1881.0);
    assert!((amd.missed_gpu_hours - missed / 3600.0).abs() < 1e-9, "{amd:?}");
}

#[test]
fn allots_hour_and_runais_missing_rule_reclaim_nothing_here() {
    let t = one_endpoint();
    let cfg = config();
    // allot's serving rule waits an hour; Run:ai has no rule for inference.
    for label in ["allot", "runai"] {
        let m = run(&t, label, &cfg);
        assert_eq!((m.reclaims, m.delayed_requests, m.cold_starts), (0, 0, 0), "{label}");
        let (oracle, _) = genai_oracle(&t, &cfg);
        assert!((m.missed_gpu_hours - oracle.reclaimed_gpu_hours).abs() < 1e-9, "{label}");
        // It held its GPU for its whole life: 40 slots.
        assert!((m.endpoint_gpu_hours - 40.0 * 57.0 / 3600.0).abs() < 1e-9, "{label}");
    }
}

#[test]
fn a_shorter_allot_timer_suspends_and_the_request_brings_it_back() {
    let t = one_endpoint();
    let cfg = config();
    let (_, allot) = idle_policies().into_iter().find(|(l, _)| l == "allot").expect("allot");
    let p = with_endpoint_timer(&allot, 15).expect("has a serving rule");
    let p = genai_policy(&p, 1);
    let (_, oracle) = genai_oracle(&t, &cfg);
    let m = run_genai_policy(&t, "allot", &p, &cfg, &oracle).expect("runs");
    // allot: the slot-0 request caps the idle time; a start-up grace of 5 min (to 300 s), then
    // idle from its first reading after it (313.5 s); warned at the first cycle past 10 min
    // idle (slot 17, 969 s), ready once 15 min idle and warned 5 min ago (1,269 s), taken by
    // the arbiter for the backfill job at the next cycle (slot 23, 1,311 s), suspended. The
    // slot-31 request is a probe of the suspended endpoint: it queues again and takes its
    // GPU back from the borrowing backfill job, with a 60 s cold start.
    assert_eq!((m.reclaims, m.cold_starts, m.redeployed, m.warnings), (1, 1, 0, 1));
    assert!((m.reclaimed_gpu_hours - (1767.0 - 1311.0) / 3600.0).abs() < 1e-9, "{m:?}");
    assert_eq!((m.false_reclaims, m.delayed_requests), (1, 3));
    assert_eq!(m.backfill_preemptions, 1);
}

#[test]
fn runais_sweep_puts_its_rule_on_the_endpoints() {
    let (_, runai) = idle_policies().into_iter().find(|(l, _)| l == "runai").expect("runai");
    assert_eq!(endpoint_rule(&runai), None);
    let p = with_endpoint_timer(&runai, 30).expect("a rule to copy");
    assert_eq!(endpoint_rule(&p), Some(0));
    assert_eq!(p.idle[0].name, "workspaces-endpoints");
    assert_eq!(p.idle[0].rule.idle_timer_ms, 30 * 60_000);
    assert_eq!(p.idle.len(), runai.idle.len() + 1);
    let (_, amd) = idle_policies().into_iter().find(|(l, _)| l == "amd_rm").expect("amd");
    let p = with_endpoint_timer(&amd, 45).expect("amd's rule covers every kind");
    assert_eq!((p.idle.len(), p.idle[0].rule.idle_timer_ms), (1, 45 * 60_000));
}

#[test]
fn a_telemetry_gap_is_idle_for_amd_and_held_by_allot() {
    // Busy, then 25 slots of gap (no duty rows, memory still reported), then busy.
    let mut slots = vec![(Some(50.0), 1); 3];
    slots.extend((0..25).map(|_| (None, 0)));
    slots.extend(vec![(Some(50.0), 1); 3]);
    let t = trace(&[(0, slots)]);
    let cfg = config();
    let amd = run(&t, "amd_rm", &cfg);
    assert_eq!(amd.reclaims, 1, "AMD counts missing samples as 0 %: {amd:?}");
    let (_, allot) = idle_policies().into_iter().find(|(l, _)| l == "allot").expect("allot");
    let p = genai_policy(&with_endpoint_timer(&allot, 15).expect("rule"), 1);
    let (_, oracle) = genai_oracle(&t, &cfg);
    let m = run_genai_policy(&t, "allot", &p, &cfg, &oracle).expect("runs");
    assert_eq!(m.reclaims, 0, "allot holds its timer in a gap: {m:?}");
}

fn shared() -> GenaiTrace {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/alibaba-genai-2026");
    load_genai(&dir, BadRows::Fail).expect("the shared trace loads")
}

/// The shared trace cut to its first `n` containers.
fn first(n: usize) -> GenaiTrace {
    let mut t = shared();
    t.containers.truncate(n);
    t
}

#[test]
fn the_books_hold_on_the_shared_trace_and_the_report_is_deterministic() {
    let t = first(12);
    let cfg = config();
    let report = run_genai_experiment(&t, &idle_policies(), &cfg, false, &|| 0).expect("runs");
    let json = genai_json(&report);
    assert_eq!(
        json,
        genai_json(&run_genai_experiment(&t, &idle_policies(), &cfg, false, &|| 0).expect("runs"))
    );
    let labels: Vec<&str> = report.policies.0.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["amd_rm", "runai", "allot", "oracle"]);
    let oracle = &report.policies.0[3].1;
    let lifetime_h: f64 = t.containers.iter().map(|c| c.slots() as f64 * 57.0 / 3600.0).sum();
    assert!(oracle.reclaimed_gpu_hours > 0.0 && oracle.reclaimed_gpu_hours < lifetime_h);
    for (label, m) in &report.policies.0 {
        assert!(m.cold_starts <= m.reclaims, "{label}");
        assert!(m.false_reclaims <= m.reclaims, "{label}");
        assert!(m.missed_gpu_hours <= oracle.reclaimed_gpu_hours + 1e-9, "{label}");
        // A reclaim frees at most its own run: beyond the oracle by a cold start each at most.
        assert!(
            m.reclaimed_gpu_hours <= oracle.reclaimed_gpu_hours + m.reclaims as f64 * 60.0 / 3600.0,
            "{label}"
        );
        // What it held and what it gave back stay within the lifetimes.
        assert!(m.endpoint_gpu_hours + m.reclaimed_gpu_hours <= lifetime_h + 1e-9, "{label}");
        assert!(m.interrupted_requests <= m.delayed_requests, "{label}");
        assert!((0.0..=1.5).contains(&m.reclaimed_share_of_oracle), "{label}");
    }
    let amd = &report.policies.0[0].1;
    assert!(amd.reclaims > 0 && amd.delayed_requests > 0, "{amd:?}");
    let runai = &report.policies.0[1].1;
    assert_eq!(runai.reclaims, 0);
    assert!(report.notes.iter().any(|n| n.starts_with("runai:")), "{:?}", report.notes);
    let goal = report.goal.as_ref().expect("allot and amd_rm");
    assert_eq!(goal.amd_rm_delayed_requests, amd.delayed_requests);
    let text = genai_text(&report);
    assert!(text.contains("goal 1") && text.contains("oracle"), "{text}");
}

#[test]
fn the_sweep_runs_every_timer_and_the_allot_grid_and_judges_dominance() {
    let t = first(3);
    let report = run_genai_experiment(&t, &idle_policies(), &config(), true, &|| 0).expect("runs");
    let sweep = report.sweep.as_ref().expect("swept");
    let family = |label: &str| -> &Vec<SweepPoint> {
        &sweep.0.iter().find(|(l, _)| l == label).expect(label).1
    };
    let timers =
        |label: &str| -> Vec<u64> { family(label).iter().map(|p| p.idle_timer_min).collect() };
    assert_eq!(timers("allot"), [5, 10, 15, 20, 25, 30, 40, 45, 60, 90, 120]);
    assert_eq!(timers("amd_rm"), [15, 20, 25, 30, 40, 45, 60, 90, 120]);
    assert_eq!(timers("runai").len(), 11);
    // allot's timer sweep keeps its quiet timer (cut to the timer); the grid adds every quiet
    // timer shorter than the timer at every share, and the timer alone.
    assert_eq!(family("allot")[0].setting, "idle_timer 5m, quiet_timer 5m, quiet_below 50%");
    assert_eq!(family("allot")[8].setting, "idle_timer 60m, quiet_timer 5m, quiet_below 50%");
    let grid = family("allot_grid");
    let expected: usize = SWEEP_TIMERS_MIN
        .iter()
        .map(|&t| {
            1 + GRID_QUIET_BELOW_PCT.len() * GRID_QUIET_MIN.iter().filter(|&&q| q < t).count()
        })
        .sum();
    assert_eq!(grid.len(), expected);
    assert!(grid.iter().any(|p| p.setting == "idle_timer 120m, quiet_timer 30m, quiet_below 70%"));
    let d = report.dominance.as_ref().expect("judged");
    assert_eq!(d.points.len(), 9 + 11);
    assert_eq!(d.dominated, d.points.iter().filter(|p| p.by.is_some()).count());
    for p in &d.points {
        if let Some(q) = &p.by {
            assert!(
                q.reclaimed_gpu_hours >= p.reclaimed_gpu_hours
                    && q.delayed_requests < p.delayed_requests
            );
        }
    }
    // The frontier: more delayed, more GPU-hours, strictly, point by point; nothing in the
    // allot sweeps beats a frontier point.
    let f = report.allot_frontier.as_ref().expect("frontier");
    for w in f.windows(2) {
        assert!(w[0].delayed_requests < w[1].delayed_requests, "{w:?}");
        assert!(w[0].reclaimed_gpu_hours < w[1].reclaimed_gpu_hours, "{w:?}");
    }
    for q in family("allot").iter().chain(grid) {
        let covered = f.iter().any(|p| {
            p.reclaimed_gpu_hours >= q.reclaimed_gpu_hours
                && p.delayed_requests <= q.delayed_requests
        });
        assert!(covered, "{q:?}");
    }
    // A 5-minute timer delays at least as many as a 2-hour one and reclaims at least as much.
    for label in ["amd_rm", "runai", "allot"] {
        let points = family(label);
        let (a, b) = (&points[0], &points[points.len() - 1]);
        assert!(a.delayed_requests >= b.delayed_requests, "{label}");
        assert!(a.reclaimed_gpu_hours >= b.reclaimed_gpu_hours, "{label}");
    }
}

#[test]
fn the_frontier_keeps_only_unbeaten_points() {
    let p = |s: &str, r: f64, d: u64| SweepPoint {
        setting: s.into(),
        idle_timer_min: 0,
        reclaimed_gpu_hours: r,
        delayed_requests: d,
        false_reclaims: 0,
        cold_starts: 0,
        missed_gpu_hours: 0.0,
    };
    let points = [
        p("a", 10.0, 5),
        p("b", 8.0, 5),
        p("c", 12.0, 9),
        p("d", 11.0, 9),
        p("e", 9.0, 2),
        p("f", 9.0, 7),
    ];
    let f: Vec<String> = frontier(&points).into_iter().map(|q| q.setting).collect();
    assert_eq!(f, ["e", "a", "c"]);
}

#[test]
fn quiet_peers_shorten_allots_timer_and_a_busy_peer_keeps_the_hour() {
    let cfg = config();
    let quiet = || {
        let mut slots = vec![(Some(50.0), 1)];
        slots.extend((1..40).map(|_| (Some(0.0), 0)));
        slots
    };
    // Two endpoints idle after slot 0 (after the 5-min start-up grace, from the reading at
    // 313.5 s). A peer counts as active until it has been idle 15 min (the quiet window), so
    // each sees its peer active, and is judged by the hour, until 1,213.5 s; from then on it
    // sees 0 of 1 peers active (below 50 %) and the 5-minute quiet timer judges it: warned at
    // the next cycle (slot 22, 1,254 s; the warning is as long as the quiet timer), ready once
    // warned 5 min ago (1,554 s), taken for backfill jobs at slot 28 (1,596 s), never needed
    // again: 684 s each.
    let t = trace(&[(0, quiet()), (0, quiet())]);
    let m = run(&t, "allot", &cfg);
    assert_eq!((m.reclaims, m.cold_starts, m.delayed_requests, m.warnings), (2, 0, 0, 2), "{m:?}");
    assert!((m.reclaimed_gpu_hours - 2.0 * (2280.0 - 1596.0) / 3600.0).abs() < 1e-9, "{m:?}");
    // A third endpoint busy throughout: each idle one sees 1 of 2 peers active (50 %, not
    // below it), so the 60-minute timer judges them, and 38 idle minutes are not enough.
    let busy: Vec<Slot> = (0..40).map(|_| (Some(80.0), 1)).collect();
    let t = trace(&[(0, quiet()), (0, quiet()), (0, busy)]);
    let m = run(&t, "allot", &cfg);
    assert_eq!(m.reclaims, 0, "{m:?}");
}

#[test]
fn the_predictor_buckets_partition_the_points() {
    let t = first(20);
    let rows = allot_sim::idle::genai::return_predictors(&t, &config());
    let all = rows.iter().find(|r| r.signal == "all").expect("all");
    assert!(all.points > 0 && all.returned <= all.points);
    let sum = |signal: &str| -> (u64, u64) {
        rows.iter()
            .filter(|r| r.signal == signal)
            .fold((0, 0), |(n, k), r| (n + r.points, k + r.returned))
    };
    // Every point has an own rhythm and a memory bucket; the peer share needs other
    // containers alive (20 here, always).
    for signal in [
        "own needed slots in the last hour",
        "GPU memory during the idle run",
        "other endpoints active in the last 15 min",
    ] {
        assert_eq!(sum(signal), (all.points, all.returned), "{signal}");
    }
    // A point is an endpoint 15 min (16 slots of 57 s) into an idle run with 16 slots after.
    let one = one_endpoint();
    let rows = allot_sim::idle::genai::return_predictors(&one, &config());
    // Slots 1–30 idle: the 16th idle slot is slot 16, and slot 31 (needed) is 15 slots later.
    assert_eq!((rows[0].points, rows[0].returned), (1, 1));
}
