//! What the dashboard derives from the daemon's state at most every `DERIVE_MS`, on the main
//! loop but outside the view's lock (`refresh`, called by `Loop::refresh_view`): estimated
//! starts of pending work (`Engine::etas`), fair-share standings (`Engine::standings`) and the
//! ledger per period. Pages read the latest copy from the view and never compute these.

use std::collections::BTreeMap;
use std::sync::RwLock;

use allot_core::ledger::{Books, Scope};
use allot_core::{Decision, Eta, EtaCause, EtaUnknown, Standing, Timestamp, WorkloadId};

use crate::daemon::Daemon;
use crate::runtime::View;

/// At most one derivation per this many ms.
pub(crate) const DERIVE_MS: u64 = 5_000;
/// Periods kept per scope (newest first): two weeks of the daemon's one-day periods.
pub(crate) const PERIODS_MAX: usize = 14;

/// An estimated start, ready to show: `at_ms` `None` is "unknown", and `note` says why (or
/// what the start waits for).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtaView {
    pub at_ms: Option<u64>,
    pub note: String,
}

/// One scope's books in one ledger period, in GPU-hours.
#[derive(Clone, Debug, PartialEq)]
pub struct PeriodRow {
    /// `cluster` or `project:NAME`.
    pub scope: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub allocated: f64,
    pub active: f64,
    pub idle: f64,
    pub useful: f64,
    pub lost: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Derived {
    /// When this was derived (`None`: not yet).
    pub at_ms: Option<u64>,
    pub etas: BTreeMap<u64, EtaView>,
    pub standings: Vec<Standing>,
    /// Cluster and project rows, per scope newest period first, `PERIODS_MAX` per scope.
    pub periods: Vec<PeriodRow>,
}

/// Derives again if the last one is `DERIVE_MS` old: computed without the view's lock, then
/// stored under it.
pub(crate) fn refresh(view: &RwLock<View>, daemon: &Daemon, now: u64) {
    let due = view.read().is_ok_and(|v| {
        v.dashboard.derived.at_ms.is_none_or(|at| now.saturating_sub(at) >= DERIVE_MS)
    });
    if !due {
        return;
    }
    let derived = derive(daemon, now);
    if let Ok(mut v) = view.write() {
        v.dashboard.derived = derived;
    }
}

pub(crate) fn derive(daemon: &Daemon, now: u64) -> Derived {
    let engine = &daemon.engine;
    let name = |id: WorkloadId| {
        daemon
            .workloads
            .get(&id.0)
            .map_or_else(|| format!("#{}", id.0), |r| format!("#{} {}", id.0, r.spec.name))
    };
    let etas = engine
        .etas(Timestamp(now))
        .into_iter()
        .map(|(id, eta)| {
            let view = match eta {
                Eta::At { at, after } => EtaView {
                    at_ms: Some(at.0),
                    note: match after {
                        EtaCause::NextCycle => "room is free now: the next cycle".to_string(),
                        EtaCause::MaxRuntime(w) => {
                            format!("after {} reaches its max runtime", name(w))
                        }
                        EtaCause::BackoffEnds(w) if w == id => {
                            "after its idle backoff ends".to_string()
                        }
                        EtaCause::BackoffEnds(w) => {
                            format!("after the idle backoff of {} ends", name(w))
                        }
                    },
                },
                Eta::Unknown(why) => EtaView {
                    at_ms: None,
                    note: match why {
                        EtaUnknown::NotEstimated { limit } => {
                            format!("only the first {limit} in the queue are estimated")
                        }
                        EtaUnknown::NoMaxRuntime { count, example, .. } => {
                            let more = if count > 1 {
                                format!(" and {} more", count - 1)
                            } else {
                                String::new()
                            };
                            format!(
                                "it waits for running work that has no max runtime ({}{more})",
                                name(example)
                            )
                        }
                        EtaUnknown::NeverFits { reason: Some(reason) } => format!(
                            "it does not fit even after all running work ends: {}",
                            crate::views::humanize_times(
                                &engine.render_reason(&Decision::Defer { workload: id, reason })
                            )
                        ),
                        EtaUnknown::NeverFits { reason: None } => {
                            "it does not fit even after all running work ends".to_string()
                        }
                        EtaUnknown::AwaitingUse => {
                            "it waits for its user to come back (idle-suspended)".to_string()
                        }
                        EtaUnknown::BeyondHorizon { ends } => {
                            format!("still waiting after {ends} simulated ends (the limit)")
                        }
                    },
                },
            };
            (id.0, view)
        })
        .collect();
    Derived { at_ms: Some(now), etas, standings: engine.standings(), periods: periods(daemon, now) }
}

/// The cluster's and every project's rows per ledger period, newest first, bounded per scope.
fn periods(daemon: &Daemon, now: u64) -> Vec<PeriodRow> {
    let period_ms = crate::daemon::LEDGER_PERIOD_MS;
    let mut closed = daemon.ledger.clone();
    closed.close(Timestamp(now));
    let mut by_scope: BTreeMap<String, Vec<PeriodRow>> = BTreeMap::new();
    // Scopes sort cluster, projects, users, workloads: stop at the first user row.
    for ((scope, period), books) in closed.rows() {
        let name = match scope {
            Scope::Cluster => "cluster".to_string(),
            Scope::Project(p) => format!("project:{p}"),
            Scope::User(_) | Scope::Workload(_) => break,
        };
        by_scope.entry(name.clone()).or_default().push(row(name, *period, period_ms, books));
    }
    by_scope.into_values().flat_map(|rows| rows.into_iter().rev().take(PERIODS_MAX)).collect()
}

fn row(scope: String, period: u64, period_ms: u64, b: &Books) -> PeriodRow {
    let hours = |v: u128| Books::gpu_hours(v);
    let start_ms = period.saturating_mul(period_ms);
    PeriodRow {
        scope,
        start_ms,
        end_ms: start_ms.saturating_add(period_ms),
        allocated: hours(b.allocated),
        active: hours(b.active),
        idle: hours(b.idle_allocated()),
        useful: hours(b.useful()),
        lost: hours(b.lost_to_preemption),
    }
}
