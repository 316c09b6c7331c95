//! What the dashboard derives from the daemon's state at most every `DERIVE_MS`, on the main
//! loop but outside the view's lock (`refresh`, called by `Loop::refresh_view`): estimated
//! starts of pending work (`Engine::etas`), fair-share standings (`Engine::standings`) and the
//! ledger per period. Pages read the latest copy from the view and never compute these.

use std::collections::BTreeMap;
use std::sync::RwLock;

use allot_core::ledger::{Books, Scope};
use allot_core::{Decision, Eta, EtaCause, EtaUnknown, Timestamp, WorkloadId};

use super::daemon::Daemon;
use crate::view::{DERIVE_MS, Derived, EtaView, PERIODS_MAX, PeriodRow, View};

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
                        EtaUnknown::Never { reason } => format!(
                            "never under this policy: {}",
                            crate::views::humanize_times(
                                &engine.render_reason(&Decision::Defer { workload: id, reason })
                            )
                        ),
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
    let period_ms = super::daemon::LEDGER_PERIOD_MS;
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

#[cfg(test)]
mod tests {
    use allot_api::SubmitRequest;

    use super::derive;
    use crate::machine::entry::Entry;
    use crate::machine::{Daemon, LEDGER_PERIOD_MS};

    const CLUSTER: &str = include_str!("../../../../examples/cluster.yaml");
    const POLICY: &str = include_str!("../../../../examples/policy.yaml");
    /// 2026-11-30 12:00:00 UTC.
    const T0: u64 = 1_796_040_000_000;

    fn daemon(cluster: &str, policy_text: &str) -> Daemon {
        let nodes = allot_config::parse_cluster("cluster.yaml", cluster).expect("cluster");
        let policy = allot_config::parse_policy("policy.yaml", policy_text).expect("policy");
        let dir = std::env::temp_dir().join("allot-derived-test");
        Daemon::new(nodes, &policy, ("policy.yaml".into(), policy_text.into()), dir)
            .expect("daemon")
    }

    fn submit(d: &mut Daemon, at: u64, id: u64, json: serde_json::Value) {
        let request: SubmitRequest = serde_json::from_value(json).expect("request");
        d.apply(at, &Entry::Submitted { id, user: "alice".into(), request });
    }

    fn v100(name: &str, max_runtime_s: Option<u64>) -> serde_json::Value {
        serde_json::json!({"name": name, "project": "research", "gpus": 4,
            "gpu_models": ["V100M32"], "command": ["sleep", "1"], "max_runtime_s": max_runtime_s})
    }

    /// Starts what the last cycle admitted.
    fn start_admitted(d: &mut Daemon, at: u64) {
        let starting: Vec<(u64, u32)> = d
            .workloads
            .iter()
            .filter(|(_, r)| r.state == allot_api::WorkloadState::Starting)
            .map(|(id, r)| (*id, r.attempt))
            .collect();
        for (id, attempt) in starting {
            d.apply(at, &Entry::Started { id, attempt, pids: vec![] });
        }
    }

    #[test]
    fn estimates_name_what_they_wait_for_and_periods_split_by_day() {
        let mut d = daemon(CLUSTER, POLICY);
        submit(&mut d, T0, 1, v100("first", Some(3600)));
        d.apply(T0, &Entry::Decided);
        start_admitted(&mut d, T0);
        submit(&mut d, T0 + 1000, 2, v100("second", None));
        submit(&mut d, T0 + 1000, 3, v100("third", None));
        d.apply(T0 + 1000, &Entry::Decided);
        // `second` starts when `first` reaches its max runtime, an hour after it started;
        // `third` then waits for `second`, which has none.
        let now = T0 + 2000;
        let derived = derive(&d, now);
        let second = &derived.etas[&2];
        assert_eq!(second.at_ms, Some(T0 + 3_600_000));
        assert_eq!(second.note, "after #1 first reaches its max runtime");
        let third = &derived.etas[&3];
        assert_eq!(third.at_ms, None);
        assert_eq!(third.note, "it waits for running work that has no max runtime (#2 second)");
        assert!(!derived.etas.contains_key(&1), "running work has no estimate");
        let research = derived.standings.iter().find(|s| s.name == "research").expect("research");
        assert_eq!((research.pending, research.rank), (2, Some(1)));
        assert_eq!(research.allocated, allot_core::Shares::from_gpus(4));

        let later = T0 + LEDGER_PERIOD_MS;
        let derived = derive(&d, later);
        let rows: Vec<(&str, u64, f64)> = derived
            .periods
            .iter()
            .filter(|r| r.scope == "project:research")
            .map(|r| (r.scope.as_str(), r.start_ms, r.allocated))
            .collect();
        let day = |ms: u64| ms / LEDGER_PERIOD_MS * LEDGER_PERIOD_MS;
        // 4 GPUs from 12:00 to midnight (12 h), then 12 h of the next day: newest first.
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].1, rows[1].1), (day(later), day(T0)));
        assert!((rows[0].2 - 48.0).abs() < 0.01 && (rows[1].2 - 48.0).abs() < 0.01, "{rows:?}");
        assert!(derived.periods.iter().any(|r| r.scope == "cluster"));
    }

    /// What a derivation costs the main loop with 10,000 workloads on 500 devices (every
    /// workload with a max runtime, so the estimate simulates up to its bound of ends).
    /// Figures only, behind `ALLOT_DASHBOARD_BENCH=1` (with `--release`).
    #[test]
    fn derive_with_ten_thousand_workloads_on_500_devices() {
        if std::env::var_os("ALLOT_DASHBOARD_BENCH").is_none() {
            return;
        }
        let cluster = "nodes:\n  - name: gpu\n    count: 62\n    cpu: 192\n    memory: 2048Gi\n    gpus:\n      - {model: H100, count: 8, memory: 80Gi}\n  - name: small\n    cpu: 64\n    memory: 512Gi\n    gpus:\n      - {model: H100, count: 4, memory: 80Gi}\n";
        let mut policy = String::from(
            "priority_classes:\n  - {name: medium, value: 0, preemptible: true}\ndefault_priority_class: medium\nprojects:\n",
        );
        for p in 0..10 {
            policy.push_str(&format!(
                "  - name: p{p}\n    cohort: all\n    quotas:\n      - {{model: H100, guaranteed: 40, borrow_limit: 100}}\n"
            ));
        }
        let mut d = daemon(cluster, &policy);
        for i in 0..10_000u64 {
            let json = serde_json::json!({"project": format!("p{}", i % 10), "gpus": 1 + i % 4,
                "command": ["sleep", "1"], "max_runtime_s": 600 + (i * 37) % 7200});
            submit(&mut d, T0, i + 1, json);
        }
        d.apply(T0 + 1, &Entry::Decided);
        start_admitted(&mut d, T0 + 2);
        d.apply(T0 + 3, &Entry::Decided);
        let runs = 5;
        let mut ms = Vec::new();
        let mut last = None;
        for k in 0..runs {
            #[allow(clippy::disallowed_methods)] // a benchmark measures real time
            let start = std::time::Instant::now();
            last = Some(derive(&d, T0 + 10 + k));
            ms.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        let derived = last.expect("derived");
        #[allow(clippy::disallowed_methods)] // a benchmark measures real time
        let part = |f: &dyn Fn()| {
            let start = std::time::Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1000.0
        };
        let clone_ms = part(&|| drop(d.engine.clone()));
        let etas_ms = part(&|| drop(d.engine.etas(allot_core::Timestamp(T0 + 20))));
        let periods_ms = part(&|| drop(super::periods(&d, T0 + 20)));
        let known = derived.etas.values().filter(|e| e.at_ms.is_some()).count();
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "derive, 10,000 workloads ({} pending) on 500 devices: median {:.1} ms, max {:.1} ms \
                 ({known} estimates with a time, {} period rows); of one: estimates {etas_ms:.1} ms \
                 (the engine's clone alone {clone_ms:.1} ms), ledger periods {periods_ms:.1} ms",
                derived.etas.len(),
                ms[runs as usize / 2],
                ms[runs as usize - 1],
                derived.periods.len()
            );
        }
    }
}
