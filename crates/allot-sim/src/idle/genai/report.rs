//! The real-telemetry experiment as a whole: the shipped policies and the oracle, the timer
//! sweep, the goals, and the report as JSON, text and a chart.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use allot_core::idle::IdleModel;
use allot_core::{PolicySpec, WorkloadKind};
use rayon::prelude::*;

use super::{
    GenaiConfig, GenaiMetrics, PredictorRow, genai_oracle, genai_policy, return_predictors,
    run_genai_policy,
};
use crate::charts::{ChartError, Series, line_chart};
use crate::genai::GenaiTrace;
use crate::idle::{ENDPOINT_PROJECT, IdleSimError, Ordered};
use crate::report;

/// The timers of the sweep, minutes. AMD's rule takes whole minutes from 15 (its minimum).
pub const SWEEP_TIMERS_MIN: [u64; 11] = [5, 10, 15, 20, 25, 30, 40, 45, 60, 90, 120];
/// AMD Resource Manager's shortest idle timer, minutes.
pub const AMD_TIMER_MIN_MIN: u64 = 15;

/// What the trace is, for the report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceInfo {
    pub dir: String,
    pub containers: usize,
    pub containers_with_requests: usize,
    pub slots: u32,
    pub step_s: u64,
    pub hours: f64,
    pub requests: u64,
    /// Slots in which an endpoint is needed: a request, or duty ≥ the activity threshold.
    pub needed_slots: u64,
    pub gpus: usize,
    pub backfill_jobs: usize,
}

/// One point of a sweep: a policy with its endpoint rule's timer set.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SweepPoint {
    /// The rule's setting, as a label (`idle_timer 15m`).
    pub setting: String,
    pub idle_timer_min: u64,
    pub reclaimed_gpu_hours: f64,
    pub delayed_requests: u64,
    pub false_reclaims: u64,
    pub cold_starts: u64,
    pub missed_gpu_hours: f64,
}

impl SweepPoint {
    fn of(setting: String, idle_timer_min: u64, m: &GenaiMetrics) -> SweepPoint {
        SweepPoint {
            setting,
            idle_timer_min,
            reclaimed_gpu_hours: m.reclaimed_gpu_hours,
            delayed_requests: m.delayed_requests,
            false_reclaims: m.false_reclaims,
            cold_starts: m.cold_starts,
            missed_gpu_hours: m.missed_gpu_hours,
        }
    }
}

/// Goal 1: at its shipped defaults allot delays at most half as many requests as `amd_rm`'s
/// shipped rule, and reclaims at least 75 % of its GPU-hours.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenaiGoal {
    pub allot_delayed_requests: u64,
    pub amd_rm_delayed_requests: u64,
    /// allot's delayed ≤ amd_rm's / 2.
    pub delayed_holds: bool,
    pub allot_reclaimed_gpu_hours: f64,
    pub amd_rm_reclaimed_gpu_hours: f64,
    /// allot's reclaimed ≥ 0.75 × amd_rm's.
    pub reclaimed_holds: bool,
    pub holds: bool,
}

impl GenaiGoal {
    fn of(policies: &[(String, GenaiMetrics)]) -> Option<GenaiGoal> {
        let get = |l: &str| policies.iter().find(|(label, _)| label == l).map(|(_, m)| m);
        let (a, m) = (get("allot")?, get("amd_rm")?);
        let delayed_holds = 2 * a.delayed_requests <= m.delayed_requests;
        let reclaimed_holds = a.reclaimed_gpu_hours >= 0.75 * m.reclaimed_gpu_hours;
        Some(GenaiGoal {
            allot_delayed_requests: a.delayed_requests,
            amd_rm_delayed_requests: m.delayed_requests,
            delayed_holds,
            allot_reclaimed_gpu_hours: a.reclaimed_gpu_hours,
            amd_rm_reclaimed_gpu_hours: m.reclaimed_gpu_hours,
            reclaimed_holds,
            holds: delayed_holds && reclaimed_holds,
        })
    }
}

/// Goal 2 for one baseline point: the allot setting that reclaims at least as much with fewer
/// delayed requests (the one delaying fewest), if any.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Domination {
    pub policy: String,
    pub setting: String,
    pub reclaimed_gpu_hours: f64,
    pub delayed_requests: u64,
    /// The allot point, or `None`: no allot setting of the sweep does better.
    pub by: Option<SweepPoint>,
}

/// The sweep's verdict: every point of the baselines' sweeps dominated by some allot setting.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Dominance {
    pub points: Vec<Domination>,
    pub dominated: usize,
    pub holds: bool,
}

/// The whole real-telemetry report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GenaiReport {
    pub trace: TraceInfo,
    pub cold_start_s: f64,
    pub false_window_s: f64,
    pub active_pct: f64,
    pub readings_per_slot: u32,
    /// Per policy as shipped, then `oracle`.
    pub policies: Ordered<GenaiMetrics>,
    pub goal: Option<GenaiGoal>,
    /// Per policy, its sweep (with `--sweep`).
    pub sweep: Option<Ordered<Vec<SweepPoint>>>,
    pub dominance: Option<Dominance>,
    /// allot's settings no other allot setting of the sweep beats (reclaims at least as much
    /// with at most as many delayed requests), fewest delayed first.
    pub allot_frontier: Option<Vec<SweepPoint>>,
    /// What predicts a return (`predictors.rs`): per signal and bucket, the points where an
    /// endpoint has been unneeded for 15 min and the share needed within the next 15.
    pub predictors: Vec<PredictorRow>,
    /// What the reader must know about a policy (a rule that covers no endpoint, …).
    pub notes: Vec<String>,
}

/// The index of the rule that judges the experiment's endpoints (the first that covers
/// `platform`'s inference work).
pub fn endpoint_rule(policy: &PolicySpec) -> Option<usize> {
    policy.idle.iter().position(|r| r.covers(ENDPOINT_PROJECT, WorkloadKind::Inference))
}

/// `policy` with its endpoint rule's timer set to `timer_min`. A policy whose rules cover no
/// endpoint (Run:ai's: no rule for inference) gets a copy of its first rule for inference in
/// front; `None` without any rule. An `allot` rule keeps its quiet timer, cut to the new timer
/// if longer (and its warning to the quiet timer).
pub fn with_endpoint_timer(policy: &PolicySpec, timer_min: u64) -> Option<PolicySpec> {
    let mut p = policy.clone();
    let index = match endpoint_rule(&p) {
        Some(i) => i,
        None => {
            let mut rule = p.idle.first()?.clone();
            rule.name = format!("{}-endpoints", rule.name);
            rule.kinds = vec![WorkloadKind::Inference];
            rule.projects = Vec::new();
            p.idle.insert(0, rule);
            0
        }
    };
    let spec = &mut p.idle[index];
    spec.rule.idle_timer_ms = timer_min * 60_000;
    let quiet = spec.rule.quiet_timer_ms;
    if quiet > 0 {
        spec.rule.quiet_timer_ms = quiet.min(spec.rule.idle_timer_ms);
    }
    Some(p)
}

/// `policy` with its endpoint rule (model `allot`) set to `timer_min` and, with `quiet`, the
/// quiet timer (minutes) and share (percent); without, no quiet timer. The warning is cut to
/// the shorter timer.
pub fn with_endpoint_rule(
    policy: &PolicySpec,
    timer_min: u64,
    quiet: Option<(u64, u16)>,
) -> Option<PolicySpec> {
    let mut p = with_endpoint_timer(policy, timer_min)?;
    let index = endpoint_rule(&p)?;
    let spec = &mut p.idle[index];
    match quiet {
        Some((q, below)) => {
            spec.rule.quiet_timer_ms = q * 60_000;
            spec.rule.quiet_below_permille = below * 10;
        }
        None => spec.rule.quiet_timer_ms = 0,
    }
    let shortest = match spec.rule.quiet_timer_ms {
        0 => spec.rule.idle_timer_ms,
        q => q,
    };
    spec.warn_before_ms = spec.warn_before_ms.min(shortest);
    Some(p)
}

/// The grid of allot's settings goal 2 searches, besides its timer sweep: every timer of
/// [`SWEEP_TIMERS_MIN`], without a quiet timer and with each of [`GRID_QUIET_MIN`] shorter than
/// it at each share of [`GRID_QUIET_BELOW_PCT`].
pub const GRID_QUIET_MIN: [u64; 4] = [5, 10, 15, 30];
pub const GRID_QUIET_BELOW_PCT: [u16; 6] = [10, 25, 40, 50, 60, 70];

/// One run of the experiment: the policy's index, for a sweep point its family, setting and
/// timer (`None`: the policy as shipped), and the policy run.
type Run = (usize, Option<(usize, String, u64)>, PolicySpec);

/// One setting of a sweep: its label, timer, and quiet timer and share.
type Setting = (String, u64, Option<(u64, u16)>);

fn grid() -> Vec<Setting> {
    let mut out = Vec::new();
    for t in SWEEP_TIMERS_MIN {
        out.push((format!("idle_timer {t}m, no quiet_timer"), t, None));
        for q in GRID_QUIET_MIN.into_iter().filter(|&q| q < t) {
            for b in GRID_QUIET_BELOW_PCT {
                out.push((
                    format!("idle_timer {t}m, quiet_timer {q}m, quiet_below {b}%"),
                    t,
                    Some((q, b)),
                ));
            }
        }
    }
    out
}

/// A sweep point's label: the timer, and an `allot` rule's quiet timer and share if it has one.
fn setting_label(policy: &PolicySpec, timer_min: u64) -> String {
    let quiet =
        endpoint_rule(policy).map(|i| &policy.idle[i].rule).filter(|r| r.quiet_timer_ms > 0);
    match quiet {
        Some(r) => format!(
            "idle_timer {timer_min}m, quiet_timer {}m, quiet_below {}%",
            r.quiet_timer_ms / 60_000,
            f64::from(r.quiet_below_permille) / 10.0
        ),
        None => format!("idle_timer {timer_min}m"),
    }
}

/// The sweep's timers for a policy: AMD's from its 15-minute minimum.
fn timers_for(policy: &PolicySpec) -> Vec<u64> {
    let amd = endpoint_rule(policy)
        .or(if policy.idle.is_empty() { None } else { Some(0) })
        .is_some_and(|i| policy.idle[i].rule.model == IdleModel::AmdRm);
    SWEEP_TIMERS_MIN.iter().copied().filter(|&t| !amd || t >= AMD_TIMER_MIN_MIN).collect()
}

/// Whether a policy's endpoint rule is allot's (it gets the grid too).
fn allot_rule(policy: &PolicySpec) -> bool {
    endpoint_rule(policy).is_some_and(|i| policy.idle[i].rule.model == IdleModel::Allot)
}

/// Runs the shipped policies (labelled), the oracle and, with `sweep`, every policy at every
/// timer of [`SWEEP_TIMERS_MIN`] (a policy with an `allot` endpoint rule also over the grid of
/// quiet timers, as `LABEL_grid`), in parallel. `now_ms` is the caller's clock for `wall_ms`
/// (`&|| 0` for byte-identical output).
pub fn run_genai_experiment(
    trace: &GenaiTrace,
    policies: &[(String, PolicySpec)],
    config: &GenaiConfig,
    sweep: bool,
    now_ms: &(dyn Fn() -> u64 + Sync),
) -> Result<GenaiReport, IdleSimError> {
    let gpus = trace.containers.len();
    let (oracle_m, oracle) = genai_oracle(trace, config);
    let mut notes = Vec::new();
    // Sweep families: (label, policy index).
    let mut families: Vec<(String, usize)> = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    for (i, (label, policy)) in policies.iter().enumerate() {
        if endpoint_rule(policy).is_none() {
            notes.push(format!(
                "{label}: no idle rule covers inference endpoints, so it reclaims none as \
                 shipped; its sweep applies a copy of its first rule to them"
            ));
        }
        runs.push((i, None, genai_policy(policy, gpus)));
        if !sweep {
            continue;
        }
        let family = families.len();
        families.push((label.clone(), i));
        for t in timers_for(policy) {
            if let Some(p) = with_endpoint_timer(policy, t) {
                let setting = setting_label(&p, t);
                runs.push((i, Some((family, setting, t)), genai_policy(&p, gpus)));
            }
        }
        if allot_rule(policy) {
            let family = families.len();
            families.push((format!("{label}_grid"), i));
            for (setting, t, quiet) in grid() {
                if let Some(p) = with_endpoint_rule(policy, t, quiet) {
                    runs.push((i, Some((family, setting, t)), genai_policy(&p, gpus)));
                }
            }
        }
    }
    let results: Vec<Result<GenaiMetrics, IdleSimError>> = runs
        .par_iter()
        .map(|(i, _, policy)| {
            let started = now_ms();
            let mut m = run_genai_policy(trace, &policies[*i].0, policy, config, &oracle)?;
            m.wall_ms = now_ms().saturating_sub(started);
            Ok(m)
        })
        .collect();
    let mut shipped = Vec::new();
    let mut sweeps: Vec<(String, Vec<SweepPoint>)> =
        families.iter().map(|(l, _)| (l.clone(), Vec::new())).collect();
    for ((i, point, _), r) in runs.into_iter().zip(results) {
        let m = r?;
        match point {
            None => shipped.push((policies[i].0.clone(), m)),
            Some((family, setting, t)) => sweeps[family].1.push(SweepPoint::of(setting, t, &m)),
        }
    }
    let goal = GenaiGoal::of(&shipped);
    let dominance = sweep.then(|| dominance(&sweeps));
    let allot_frontier = sweep.then(|| {
        let points: Vec<SweepPoint> = sweeps
            .iter()
            .filter(|(l, _)| l == "allot" || l == "allot_grid")
            .flat_map(|(_, s)| s.iter().cloned())
            .collect();
        frontier(&points)
    });
    shipped.push(("oracle".to_owned(), oracle_m));
    Ok(GenaiReport {
        trace: trace_info(trace, config),
        cold_start_s: config.cold_start_s,
        false_window_s: config.false_window_s,
        active_pct: config.active_pct,
        readings_per_slot: config.readings_per_slot,
        policies: Ordered(shipped),
        goal,
        sweep: sweep.then_some(Ordered(sweeps)),
        dominance,
        allot_frontier,
        predictors: return_predictors(trace, config),
        notes,
    })
}

/// The points no other point beats (at least as many GPU-hours with at most as many delayed
/// requests, one of them strictly), fewest delayed first; ties keep the first listed.
pub fn frontier(points: &[SweepPoint]) -> Vec<SweepPoint> {
    let mut sorted: Vec<&SweepPoint> = points.iter().collect();
    sorted.sort_by(|a, b| {
        a.delayed_requests
            .cmp(&b.delayed_requests)
            .then(b.reclaimed_gpu_hours.total_cmp(&a.reclaimed_gpu_hours))
    });
    let mut out: Vec<SweepPoint> = Vec::new();
    for p in sorted {
        if out.last().is_none_or(|last| p.reclaimed_gpu_hours > last.reclaimed_gpu_hours) {
            out.push(p.clone());
        }
    }
    out
}

/// Goal 2: every point of the `amd_rm` and `runai` sweeps against allot's.
fn dominance(sweeps: &[(String, Vec<SweepPoint>)]) -> Dominance {
    let allot: Vec<&SweepPoint> = sweeps
        .iter()
        .filter(|(l, _)| l == "allot" || l == "allot_grid")
        .flat_map(|(_, s)| s)
        .collect();
    let mut points = Vec::new();
    for (label, sweep) in sweeps.iter().filter(|(l, _)| l == "amd_rm" || l == "runai") {
        for p in sweep {
            let by = allot
                .iter()
                .filter(|q| {
                    q.reclaimed_gpu_hours >= p.reclaimed_gpu_hours
                        && q.delayed_requests < p.delayed_requests
                })
                .min_by(|a, b| {
                    a.delayed_requests
                        .cmp(&b.delayed_requests)
                        .then(b.reclaimed_gpu_hours.total_cmp(&a.reclaimed_gpu_hours))
                })
                .map(|&q| q.clone());
            points.push(Domination {
                policy: label.clone(),
                setting: p.setting.clone(),
                reclaimed_gpu_hours: p.reclaimed_gpu_hours,
                delayed_requests: p.delayed_requests,
                by,
            });
        }
    }
    let dominated = points.iter().filter(|d| d.by.is_some()).count();
    Dominance { holds: !points.is_empty() && dominated == points.len(), dominated, points }
}

fn trace_info(trace: &GenaiTrace, config: &GenaiConfig) -> TraceInfo {
    let needed_slots = trace
        .containers
        .iter()
        .map(|c| (0..c.slots()).filter(|&i| super::needed(c, i, config.active_pct)).count() as u64)
        .sum();
    TraceInfo {
        dir: trace.dir.display().to_string(),
        containers: trace.containers.len(),
        containers_with_requests: trace
            .containers
            .iter()
            .filter(|c| c.requests.iter().any(|&r| r > 0))
            .count(),
        slots: trace.slots,
        step_s: trace.step_s,
        hours: f64::from(trace.slots) * trace.step_s as f64 / 3600.0,
        requests: trace.requests_total(),
        needed_slots,
        gpus: trace.containers.len(),
        backfill_jobs: trace.containers.len(),
    }
}

/// The report as pretty JSON with a trailing newline.
pub fn genai_json(report: &GenaiReport) -> String {
    let mut text = serde_json::to_string_pretty(report)
        .unwrap_or_else(|e| format!("{{\"error\": {}}}", serde_json::Value::String(e.to_string())));
    text.push('\n');
    text
}

/// The report as text: the trace, one row per policy (the oracle last), the goals, the sweep.
pub fn genai_text(report: &GenaiReport) -> String {
    let mut out = String::new();
    let t = &report.trace;
    let _ = writeln!(
        out,
        "idle reclaim on real telemetry: {} ({} containers, {} with request rows; {} slots of \
         {} s = {:.1} h; {} requests)\none GPU per endpoint, {} backfill jobs pending for the \
         GPUs they give back; cold start {} s; false = needed within {} s; activity = duty ≥ {} %\n",
        t.dir,
        t.containers,
        t.containers_with_requests,
        t.slots,
        t.step_s,
        t.hours,
        t.requests,
        t.backfill_jobs,
        report.cold_start_s,
        report.false_window_s,
        report.active_pct,
    );
    let headers = [
        "policy",
        "reclaimed GPU-h",
        "of oracle",
        "false reclaims",
        "delayed requests",
        "cold starts",
        "missed GPU-h",
        "reclaims",
        "delayed active slots",
        "warnings",
        "wall ms",
    ];
    let rows: Vec<Vec<String>> = report
        .policies
        .0
        .iter()
        .map(|(label, m)| {
            vec![
                label.clone(),
                format!("{:.1}", m.reclaimed_gpu_hours),
                format!("{:.0} %", 100.0 * m.reclaimed_share_of_oracle),
                m.false_reclaims.to_string(),
                m.delayed_requests.to_string(),
                m.cold_starts.to_string(),
                format!("{:.1}", m.missed_gpu_hours),
                m.reclaims.to_string(),
                m.delayed_active_slots.to_string(),
                m.warnings.to_string(),
                m.wall_ms.to_string(),
            ]
        })
        .collect();
    out.push_str(&report::table(&headers, &rows));
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    if let Some(g) = &report.goal {
        let yes = |b: bool| if b { "holds" } else { "does not hold" };
        let _ = writeln!(
            out,
            "\ngoal 1 ({}): delayed requests allot {} ≤ amd_rm {} / 2: {}; reclaimed GPU-h \
             allot {:.1} ≥ 75 % of amd_rm {:.1}: {}",
            yes(g.holds),
            g.allot_delayed_requests,
            g.amd_rm_delayed_requests,
            yes(g.delayed_holds),
            g.allot_reclaimed_gpu_hours,
            g.amd_rm_reclaimed_gpu_hours,
            yes(g.reclaimed_holds),
        );
    }
    let headers = ["signal", "bucket", "points", "needed within 15 min", "share"];
    let rows: Vec<Vec<String>> = report
        .predictors
        .iter()
        .map(|r| {
            vec![
                r.signal.clone(),
                r.bucket.clone(),
                r.points.to_string(),
                r.returned.to_string(),
                format!("{:.0} %", 100.0 * r.return_share),
            ]
        })
        .collect();
    out.push_str("\nwhat predicts a return (endpoints unneeded for 15 min):\n");
    out.push_str(&report::table(&headers, &rows));
    if let Some(sweep) = &report.sweep {
        let headers = [
            "policy",
            "setting",
            "reclaimed GPU-h",
            "delayed requests",
            "false",
            "cold starts",
            "missed GPU-h",
        ];
        let mut tables: Vec<(&str, &[SweepPoint])> = sweep
            .0
            .iter()
            .filter(|(label, _)| !label.ends_with("_grid"))
            .map(|(label, points)| (label.as_str(), points.as_slice()))
            .collect();
        if let Some(f) = &report.allot_frontier {
            tables.push(("allot frontier", f));
        }
        let rows: Vec<Vec<String>> = tables
            .iter()
            .flat_map(|&(label, points)| {
                points.iter().map(move |p| {
                    vec![
                        label.to_owned(),
                        p.setting.clone(),
                        format!("{:.1}", p.reclaimed_gpu_hours),
                        p.delayed_requests.to_string(),
                        p.false_reclaims.to_string(),
                        p.cold_starts.to_string(),
                        format!("{:.1}", p.missed_gpu_hours),
                    ]
                })
            })
            .collect();
        out.push_str(
            "\nsweep (the allot grid in the JSON; here its frontier: the settings no other \
             beats):\n",
        );
        out.push_str(&report::table(&headers, &rows));
    }
    if let Some(d) = &report.dominance {
        let _ = writeln!(
            out,
            "\ngoal 2 ({}): {} of {} baseline settings have an allot setting that reclaims at \
             least as much with fewer delayed requests",
            if d.holds { "holds" } else { "does not hold" },
            d.dominated,
            d.points.len()
        );
        for p in d.points.iter().filter(|p| p.by.is_none()) {
            let _ = writeln!(
                out,
                "  not dominated: {} {} ({:.1} GPU-h, {} delayed)",
                p.policy, p.setting, p.reclaimed_gpu_hours, p.delayed_requests
            );
        }
    }
    out
}

/// The trade-off chart: reclaimed GPU-hours against delayed requests, one line per policy's
/// sweep (in timer order), the shipped settings and the oracle as single points; written as
/// `genai_tradeoff.svg` and `.png` in `dir`.
pub fn write_genai_chart(dir: &Path, report: &GenaiReport) -> Result<Vec<PathBuf>, ChartError> {
    let mut series = Vec::new();
    let line = |points: &[SweepPoint]| -> Vec<(f64, f64)> {
        points.iter().map(|p| (p.delayed_requests as f64, p.reclaimed_gpu_hours)).collect()
    };
    if let Some(sweep) = &report.sweep {
        for (label, points) in &sweep.0 {
            if let Some(base) = label.strip_suffix("_grid") {
                // The grid's fixed timers are the rule without its quiet timer.
                let fixed: Vec<SweepPoint> = points
                    .iter()
                    .filter(|p| p.setting.ends_with("no quiet_timer"))
                    .cloned()
                    .collect();
                series.push(Series {
                    label: format!("{base}, no quiet timer"),
                    points: line(&fixed),
                });
            } else {
                series
                    .push(Series { label: format!("{label} (timer sweep)"), points: line(points) });
            }
        }
    }
    if let Some(f) = &report.allot_frontier {
        series.push(Series { label: "allot, best of grid".into(), points: line(f) });
    }
    for (label, m) in &report.policies.0 {
        series.push(Series {
            label: if label == "oracle" { "oracle".into() } else { format!("{label} as shipped") },
            points: vec![(m.delayed_requests as f64, m.reclaimed_gpu_hours)],
        });
    }
    line_chart(
        dir,
        "genai_tradeoff",
        "Idle reclaim on the GenAI trace: GPU-hours reclaimed vs requests delayed",
        "delayed requests (arrived while the endpoint was reclaimed or cold-starting)",
        "reclaimed GPU-hours",
        &series,
    )
}
