//! Rollback conditions of a scoped policy rollout, judged on the outcomes of the scope's work
//! (`allot policy apply FILE --scope … --rollback-if …` in the daemon, and `allot sim replay
//! --rehearse` on history): the same figures, computed the same way, in both places.
//!
//! A condition is `METRIC>LIMIT` (an absolute figure) or `METRIC>FACTORx` (against the same
//! figure in the baseline window before the rollout). Figures are over the scope's outcomes in
//! a window; an average or a percentile is judged only once its window has `min_sample`
//! observations, a relative condition only once the baseline has them too.

use std::collections::{BTreeMap, VecDeque};

use allot_core::WorkloadKind;
use serde::{Deserialize, Serialize};

use crate::Scope;

/// Outcomes older than this are dropped: the longest baseline window.
pub const OUTCOMES_KEPT_MS: u64 = 30 * 86_400_000;
/// At most this many outcomes are kept (the oldest go first).
const OUTCOMES_MAX: usize = 200_000;
/// A per-day figure is taken over at least this long, so a rollout's first minutes do not
/// turn one pre-emption into a daily flood.
const DAY_FIGURE_MIN_MS: u64 = 3_600_000;

/// What a condition measures, over the scope's work in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Failed / (succeeded + failed), of the work that ended.
    FailureRate,
    /// The 95th percentile of queue waits (submission to first admission), in seconds.
    P95Wait,
    /// GPU-hours of work lost to pre-emption and reclaim (since the last checkpoint), per day.
    LostGpuHoursPerDay,
    /// GPU-hours allocated per workload that succeeded.
    GpuHoursPerFinished,
    /// Idle reclaims the user undid: the workload resumed by its user, or the same name
    /// submitted again, within `false_reclaim_within` of the reclaim.
    FalseIdleReclaims,
}

const METRICS: [(&str, Metric); 5] = [
    ("failure_rate", Metric::FailureRate),
    ("p95_wait", Metric::P95Wait),
    ("lost_gpu_hours_per_day", Metric::LostGpuHoursPerDay),
    ("gpu_hours_per_finished", Metric::GpuHoursPerFinished),
    ("false_idle_reclaims", Metric::FalseIdleReclaims),
];

impl Metric {
    pub fn as_str(self) -> &'static str {
        METRICS.iter().find(|(_, m)| *m == self).map_or("?", |(name, _)| name)
    }

    /// Figures that are an average or a percentile need some observations to mean anything;
    /// counts and amounts per day do not.
    fn needs_sample(self) -> bool {
        matches!(self, Metric::FailureRate | Metric::P95Wait | Metric::GpuHoursPerFinished)
    }
}

/// `METRIC>LIMIT` (an absolute figure) or `METRIC>FACTORx` (against the baseline).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub metric: Metric,
    /// The limit (or factor) in thousandths, exact.
    pub limit_milli: u64,
    /// The limit is a factor of the baseline's figure.
    pub relative: bool,
}

impl Condition {
    pub fn parse(text: &str) -> Result<Condition, String> {
        let names: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
        let fix = format!(
            "write METRIC>LIMIT or METRIC>FACTORx, e.g. `p95_wait>1.5x` or `failure_rate>0.2`; \
             metrics: {}",
            names.join(", ")
        );
        let Some((name, limit)) = text.split_once('>') else {
            return Err(format!("rollback condition `{text}` has no `>`: {fix}"));
        };
        let Some(metric) = METRICS.iter().find(|(n, _)| *n == name.trim()).map(|(_, m)| *m) else {
            return Err(format!(
                "rollback condition `{text}`: unknown metric `{}`: {fix}",
                name.trim()
            ));
        };
        let limit = limit.trim();
        let (number, relative) = match limit.strip_suffix('x') {
            Some(n) => (n, true),
            None => (limit, false),
        };
        let limit_milli = milli_of(number)
            .ok_or_else(|| format!("rollback condition `{text}`: `{limit}` is not a number ≥ 0 with at most 3 decimals: {fix}"))?;
        if relative && limit_milli < 1000 {
            return Err(format!(
                "rollback condition `{text}`: a factor below 1x would trip while things improve: {fix}"
            ));
        }
        Ok(Condition { metric, limit_milli, relative })
    }

    pub fn text(&self) -> String {
        let limit = self.limit_milli as f64 / 1000.0;
        format!("{}>{limit}{}", self.metric.as_str(), if self.relative { "x" } else { "" })
    }
}

/// A decimal with at most three places, in thousandths.
fn milli_of(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || frac.len() > 3
        || !whole.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<3}").parse().ok()? };
    whole.checked_mul(1000)?.checked_add(frac)
}

/// One condition's figures now.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    pub condition: Condition,
    pub baseline: Option<f64>,
    pub baseline_samples: u64,
    pub current: Option<f64>,
    pub samples: u64,
    /// `None`: not judged yet (why); `Some(tripped)`.
    pub verdict: Result<bool, String>,
}

/// The conditions of one rollout, with the windows they are judged over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackRules {
    pub conditions: Vec<Condition>,
    /// The window before the rollout its figures are compared with.
    pub baseline_ms: u64,
    /// A reclaim undone within this long was a false one.
    pub false_reclaim_within_ms: u64,
    /// Observations a window needs before an average or percentile is judged.
    pub min_sample: u64,
}

impl RollbackRules {
    /// Every condition judged on `outcomes` of `scope` for a rollout that started at
    /// `started_ms`, at `now`. `waiting_since_ms`: when each of the scope's workloads still
    /// waiting for its first admission was submitted. `p95_wait` counts them with their wait
    /// so far, so a scope the rollout starves trips it although nothing of it is admitted;
    /// each one's final wait is at least that, so the figure stays a lower bound and never
    /// trips early.
    pub fn judge(
        &self,
        scope: &Scope,
        outcomes: &Outcomes,
        waiting_since_ms: &[u64],
        started_ms: u64,
        now: u64,
    ) -> Vec<Judged> {
        let baseline_from = started_ms.saturating_sub(self.baseline_ms);
        let waited: Vec<u64> = waiting_since_ms.iter().map(|s| now.saturating_sub(*s)).collect();
        self.conditions
            .iter()
            .map(|c| {
                let figure = |from: u64, to: u64, waited: &[u64]| {
                    outcomes.figure(c.metric, scope, from, to, self.false_reclaim_within_ms, waited)
                };
                let (baseline, baseline_samples) = figure(baseline_from, started_ms, &[]);
                let (current, samples) = figure(started_ms, now.saturating_add(1), &waited);
                let min = self.min_sample;
                let limit = c.limit_milli as f64 / 1000.0;
                let verdict = if c.metric.needs_sample() && samples < min {
                    Err(format!("{samples} of {min} observations since the rollout"))
                } else if c.relative && baseline_samples < min {
                    Err(format!("{baseline_samples} of {min} observations in the baseline"))
                } else {
                    match (current, baseline, c.relative) {
                        (Some(now), _, false) => Ok(now > limit),
                        (Some(now), Some(before), true) => Ok(now > before * limit && now > before),
                        (Some(_), None, true) => Err("no baseline figure".into()),
                        (None, ..) => Err("no figure yet".into()),
                    }
                };
                Judged {
                    condition: c.clone(),
                    baseline,
                    baseline_samples,
                    current,
                    samples,
                    verdict,
                }
            })
            .collect()
    }

    /// The first tripped condition, as a sentence: what, where, and the figures.
    pub fn tripped(judged: &[Judged], scope: &Scope) -> Option<String> {
        let t = judged.iter().find(|j| j.verdict == Ok(true))?;
        let figure = |f: Option<f64>| f.map_or("none".to_string(), |v| format!("{v:.3}"));
        Some(format!(
            "rollback condition {} tripped in {scope}: {} since the rollout ({} observations), \
             {} in the baseline before it ({} observations)",
            t.condition.text(),
            figure(t.current),
            t.samples,
            figure(t.baseline),
            t.baseline_samples,
        ))
    }
}

/// What happened to one workload that a condition counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fact {
    /// First admission, after this long in the queue.
    Admitted {
        wait_ms: u64,
    },
    /// Ended for good; the GPU share-ms allocated to it over all its runs.
    Finished {
        failed: bool,
        share_ms: u64,
    },
    /// A run stopped by a pre-emption or reclaim lost this much work (share-ms).
    Lost {
        share_ms: u64,
    },
    IdleReclaimed,
    /// Its user undid an idle reclaim this long after it (a resume, or the same name
    /// submitted again).
    Returned {
        after_ms: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub at_ms: u64,
    pub project: String,
    #[serde(with = "kind_name")]
    pub kind: WorkloadKind,
    pub models: Vec<String>,
    pub fact: Fact,
}

/// The outcomes of the last `OUTCOMES_KEPT_MS`, oldest first, and the idle reclaims a user may
/// still undo.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes {
    pub facts: VecDeque<Outcome>,
    /// Per workload, when it was last reclaimed for idleness.
    pub reclaimed: BTreeMap<u64, u64>,
    /// Per `name_key(project, user, name)`, when work of that name was last reclaimed for
    /// idleness.
    pub reclaimed_names: BTreeMap<String, u64>,
}

/// One key for a (project, user, name): JSON map keys are text.
pub fn name_key(project: &str, user: &str, name: &str) -> String {
    format!("{project}\u{1f}{user}\u{1f}{name}")
}

impl Outcomes {
    pub fn push(&mut self, outcome: Outcome) {
        let oldest = outcome.at_ms.saturating_sub(OUTCOMES_KEPT_MS);
        while self.facts.front().is_some_and(|f| f.at_ms < oldest)
            || self.facts.len() >= OUTCOMES_MAX
        {
            self.facts.pop_front();
        }
        // The reclaim maps are swept once a day of outcomes, not on every push (this runs at
        // every admission and end); an entry kept a day longer only ever yields a `Returned`
        // that no condition's window reaches.
        const DAY_MS: u64 = 86_400_000;
        if self.facts.back().is_none_or(|last| last.at_ms / DAY_MS != outcome.at_ms / DAY_MS) {
            self.reclaimed.retain(|_, at| *at >= oldest);
            self.reclaimed_names.retain(|_, at| *at >= oldest);
        }
        self.facts.push_back(outcome);
    }

    /// The figure of `metric` for the scope's work in `[from, to)`, and how many observations
    /// it rests on; `None` when there is nothing to measure. `waited`: the waits so far of the
    /// scope's work not admitted yet, which `p95_wait` counts beside the admitted waits.
    pub fn figure(
        &self,
        metric: Metric,
        scope: &Scope,
        from: u64,
        to: u64,
        false_within_ms: u64,
        waited: &[u64],
    ) -> (Option<f64>, u64) {
        let facts = self
            .facts
            .iter()
            .filter(|o| {
                o.at_ms >= from && o.at_ms < to && scope.covers(&o.project, o.kind, &o.models)
            })
            .map(|o| &o.fact);
        let gpu_hours =
            |share_ms: u64| share_ms as f64 / allot_core::ledger::SHARE_MS_PER_GPU_HOUR as f64;
        match metric {
            Metric::FailureRate => {
                let (mut failed, mut ended) = (0u64, 0u64);
                for f in facts {
                    if let Fact::Finished { failed: bad, .. } = f {
                        ended += 1;
                        failed += u64::from(*bad);
                    }
                }
                ((ended > 0).then(|| failed as f64 / ended as f64), ended)
            }
            Metric::P95Wait => {
                let mut waits: Vec<u64> = facts
                    .filter_map(|f| match f {
                        Fact::Admitted { wait_ms } => Some(*wait_ms),
                        _ => None,
                    })
                    .chain(waited.iter().copied())
                    .collect();
                waits.sort_unstable();
                let n = waits.len() as u64;
                let p95 = (!waits.is_empty()).then(|| {
                    let rank = (waits.len() * 95).div_ceil(100).max(1) - 1;
                    waits[rank] as f64 / 1000.0
                });
                (p95, n)
            }
            Metric::LostGpuHoursPerDay => {
                let (mut lost, mut seen) = (0u64, 0u64);
                for f in facts {
                    seen += 1;
                    if let Fact::Lost { share_ms } = f {
                        lost += share_ms;
                    }
                }
                let days = (to.saturating_sub(from)).max(DAY_FIGURE_MIN_MS) as f64 / 86_400_000.0;
                (Some(gpu_hours(lost) / days), seen)
            }
            Metric::GpuHoursPerFinished => {
                let (mut total, mut done) = (0u64, 0u64);
                for f in facts {
                    if let Fact::Finished { failed: false, share_ms } = f {
                        total += share_ms;
                        done += 1;
                    }
                }
                ((done > 0).then(|| gpu_hours(total) / done as f64), done)
            }
            Metric::FalseIdleReclaims => {
                let (mut returned, mut seen) = (0u64, 0u64);
                for f in facts {
                    seen += 1;
                    if let Fact::Returned { after_ms } = f
                        && *after_ms <= false_within_ms
                    {
                        returned += 1;
                    }
                }
                (Some(returned as f64), seen)
            }
        }
    }
}

/// A workload kind by its name (`training`), as the API and policy files write it.
mod kind_name {
    use allot_core::WorkloadKind;
    use serde::{Deserialize, Deserializer, Serializer};

    const ALL: [WorkloadKind; 5] = [
        WorkloadKind::Training,
        WorkloadKind::Batch,
        WorkloadKind::Notebook,
        WorkloadKind::Inference,
        WorkloadKind::Service,
    ];

    pub(super) fn serialize<S: Serializer>(kind: &WorkloadKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<WorkloadKind, D::Error> {
        let name = String::deserialize(d)?;
        ALL.into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown workload kind `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_read_and_write_back() {
        for text in [
            "p95_wait>1.5x",
            "failure_rate>0.2",
            "false_idle_reclaims>3",
            "lost_gpu_hours_per_day>12.125",
        ] {
            assert_eq!(Condition::parse(text).expect(text).text(), text);
        }
        for bad in [
            "p95_wait",
            "wait>2",
            "p95_wait>0.5x",
            "failure_rate>-1",
            "failure_rate>0.0001",
            "p95_wait>x",
        ] {
            assert!(Condition::parse(bad).is_err(), "{bad}");
        }
    }

    fn outcome(at_ms: u64, project: &str, fact: Fact) -> Outcome {
        Outcome {
            at_ms,
            project: project.into(),
            kind: WorkloadKind::Training,
            models: Vec::new(),
            fact,
        }
    }

    /// A rollout to nlp at 100 s with a 100 s baseline.
    struct Rollout(RollbackRules);

    impl Rollout {
        fn judge(&self, o: &Outcomes, now: u64) -> Vec<Judged> {
            self.judge_waiting(o, &[], now)
        }

        fn judge_waiting(&self, o: &Outcomes, waiting: &[u64], now: u64) -> Vec<Judged> {
            self.0.judge(&Scope::Project("nlp".into()), o, waiting, 100_000, now)
        }
    }

    fn rollout(conditions: &[&str]) -> Rollout {
        Rollout(RollbackRules {
            conditions: conditions
                .iter()
                .map(|c| Condition::parse(c).expect("condition"))
                .collect(),
            baseline_ms: 100_000,
            false_reclaim_within_ms: 60_000,
            min_sample: 3,
        })
    }

    #[test]
    fn a_relative_condition_trips_on_the_scopes_figure_against_its_baseline() {
        let mut o = Outcomes::default();
        for (i, wait) in [10u64, 10, 10, 10].iter().enumerate() {
            o.push(outcome(10_000 + i as u64, "nlp", Fact::Admitted { wait_ms: wait * 1000 }));
        }
        // Another project's long waits after the rollout do not count.
        for i in 0..5 {
            o.push(outcome(120_000 + i, "vision", Fact::Admitted { wait_ms: 900_000 }));
        }
        let r = rollout(&["p95_wait>1.5x"]);
        o.push(outcome(130_000, "nlp", Fact::Admitted { wait_ms: 14_000 }));
        let judged = r.judge(&o, 200_000);
        assert_eq!(judged[0].verdict, Err("1 of 3 observations since the rollout".into()));
        o.push(outcome(131_000, "nlp", Fact::Admitted { wait_ms: 14_000 }));
        o.push(outcome(132_000, "nlp", Fact::Admitted { wait_ms: 14_000 }));
        let judged = r.judge(&o, 200_000);
        assert_eq!((judged[0].baseline, judged[0].current), (Some(10.0), Some(14.0)));
        assert_eq!(judged[0].verdict, Ok(false), "14 s is under 1.5 × 10 s");
        o.push(outcome(133_000, "nlp", Fact::Admitted { wait_ms: 40_000 }));
        assert_eq!(r.judge(&o, 200_000)[0].verdict, Ok(true));
    }

    #[test]
    fn false_reclaims_count_only_returns_within_the_window() {
        let mut o = Outcomes::default();
        o.push(outcome(110_000, "nlp", Fact::IdleReclaimed));
        o.push(outcome(150_000, "nlp", Fact::Returned { after_ms: 40_000 }));
        o.push(outcome(190_000, "nlp", Fact::Returned { after_ms: 80_000 }));
        let r = rollout(&["false_idle_reclaims>0", "failure_rate>0.5"]);
        let judged = r.judge(&o, 200_000);
        assert_eq!(judged[0].current, Some(1.0));
        assert_eq!(judged[0].verdict, Ok(true));
        assert!(judged[1].verdict.is_err(), "no work ended: nothing to judge");
    }

    #[test]
    fn work_starved_by_the_rollout_trips_p95_wait_with_its_wait_so_far() {
        let mut o = Outcomes::default();
        for i in 0..4 {
            o.push(outcome(10_000 + i, "nlp", Fact::Admitted { wait_ms: 10_000 }));
        }
        let r = rollout(&["p95_wait>2x"]);
        // Nothing of nlp is admitted after the rollout: without its waiting work there is no
        // figure at all.
        let judged = r.judge(&o, 200_000);
        assert_eq!(judged[0].verdict, Err("0 of 3 observations since the rollout".into()));
        // Three of its workloads wait: submitted at 110 s, 150 s and 190 s.
        let waiting = [110_000, 150_000, 190_000];
        let judged = r.judge_waiting(&o, &waiting, 200_000);
        assert_eq!((judged[0].current, judged[0].samples), (Some(90.0), 3));
        assert_eq!(judged[0].verdict, Ok(true), "90 s so far is past 2 x 10 s");
        // Work that has waited less than the limit does not trip it.
        let judged = r.judge_waiting(&o, &[110_000, 111_000, 112_000], 125_000);
        assert_eq!(judged[0].current, Some(15.0));
        assert_eq!(judged[0].verdict, Ok(false));
        // The baseline never counts today's waiting work.
        assert_eq!(judged[0].baseline, Some(10.0));
    }
}
