//! The plain-Slurm baseline (`allot_sim::slurm`): hand-made traces with the start times worked
//! out by hand from Slurm's rules (FIFO, a reservation for every blocked job, backfill that
//! never delays one), and a property over random traces.
//!
//! Time limits in these traces: a duration of 600 s plans as 660 s (10 minutes, plus one),
//! 1,200 s as 1,260 s, 300 s as 360 s, 900 s as 960 s.

use std::collections::BTreeMap;

use allot_core::{DeviceSpec, NodeSpec, PolicySpec};
use allot_sim::replay::{ReplayConfig, time_limit_ms};
use allot_sim::slurm::{SlurmBackfill, SlurmSchedule, replay_slurm, schedule};
use allot_sim::trace::TraceJob;

fn node(name: &str, gpus: usize) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_millis: 0,
        memory_mib: 0,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: (0..gpus)
            .map(|_| DeviceSpec { model: "G".into(), memory_mib: 0, island: 0, mig: false })
            .collect(),
    }
}

/// Job `id` submitted at `submit_s`, running `duration_s`, `members` × `gpus`.
fn job(id: u64, submit_s: f64, duration_s: f64, members: u32, gpus: u32) -> TraceJob {
    TraceJob::whole(id, "a", submit_s, duration_s, members, gpus)
}

/// Slurm's defaults, but a backfill pass at every arrival and end (`bf_interval` 0), so that
/// starts fall at those instants.
fn instant() -> SlurmBackfill {
    SlurmBackfill { interval_s: 0.0, ..SlurmBackfill::default() }
}

fn run(nodes: &[NodeSpec], jobs: &[TraceJob]) -> SlurmSchedule {
    schedule(nodes, jobs, &instant(), None).expect("schedules")
}

/// Each job's (start s, nodes).
fn starts(s: &SlurmSchedule) -> Vec<(f64, Vec<u32>)> {
    s.runs
        .iter()
        .map(|r| {
            let r = r.as_ref().expect("every job runs");
            assert!(r.finished);
            (r.start_ms as f64 / 1000.0, r.nodes.clone())
        })
        .collect()
}

#[test]
fn time_limits_are_minutes_plus_one() {
    assert_eq!(time_limit_ms(600.0), 660_000);
    assert_eq!(time_limit_ms(599.5), 660_000);
    assert_eq!(time_limit_ms(600.5), 720_000);
    assert_eq!(time_limit_ms(0.0), 60_000);
}

/// One node of 4. A (3 GPUs) runs to 600 s, planned to 660 s; B (4 GPUs) blocks at the head
/// and is reserved 660 s; C (1 GPU, planned 360 s) ends before that: backfilled at once.
/// A really ends at 600 s, and B starts then.
#[test]
fn a_small_job_that_ends_before_the_reservation_is_backfilled() {
    let nodes = [node("n0", 4)];
    let jobs = [job(1, 0.0, 600.0, 1, 3), job(2, 1.0, 600.0, 1, 4), job(3, 2.0, 300.0, 1, 1)];
    let s = starts(&run(&nodes, &jobs));
    assert_eq!(s, [(0.0, vec![0]), (600.0, vec![0]), (2.0, vec![0])]);
}

/// With Slurm's `bf_interval` of 30 s, the main scheduler at C's arrival stops at B (strict
/// FIFO); C waits for the backfill pass at 30 s.
#[test]
fn between_backfill_passes_the_main_scheduler_is_strict_fifo() {
    let nodes = [node("n0", 4)];
    let jobs = [job(1, 0.0, 600.0, 1, 3), job(2, 1.0, 600.0, 1, 4), job(3, 2.0, 300.0, 1, 1)];
    let s = schedule(&nodes, &jobs, &SlurmBackfill::default(), None).expect("schedules");
    assert_eq!(starts(&s), [(0.0, vec![0]), (600.0, vec![0]), (30.0, vec![0])]);
    // A's end at 600 s is an event: the main scheduler starts B at once.
}

/// The same, but C plans 960 s: started at 2 s it would hold its GPU past B's reservation at
/// 660 s, so it waits — behind B, which starts at 600 s and ends at 1,200 s.
#[test]
fn a_small_job_that_would_delay_the_reservation_waits() {
    let nodes = [node("n0", 4)];
    let jobs = [job(1, 0.0, 600.0, 1, 3), job(2, 1.0, 600.0, 1, 4), job(3, 2.0, 900.0, 1, 1)];
    let s = starts(&run(&nodes, &jobs));
    assert_eq!(s, [(0.0, vec![0]), (600.0, vec![0]), (1200.0, vec![0])]);
}

/// Two nodes of 4. A (4) takes n0 to 600 s, B (3) n1 to 1,200 s; C (4) is reserved on n0 at
/// 660 s. D (1 GPU, 6,000 s: far past the reservation) fits n1's last GPU, which C does not
/// need: backfilled at once.
#[test]
fn a_job_on_nodes_the_reservation_does_not_need_is_backfilled() {
    let nodes = [node("n0", 4), node("n1", 4)];
    let jobs = [
        job(1, 0.0, 600.0, 1, 4),
        job(2, 1.0, 1200.0, 1, 3),
        job(3, 2.0, 600.0, 1, 4),
        job(4, 3.0, 6000.0, 1, 1),
    ];
    let s = starts(&run(&nodes, &jobs));
    assert_eq!(s, [(0.0, vec![0]), (1.0, vec![1]), (600.0, vec![0]), (3.0, vec![1])]);
}

/// Three nodes of 2. A takes n0 (to 600 s, planned 660 s), B n1 (to 1,201 s, planned
/// 1,261 s). G, two members of 2 GPUs on two nodes, has n2 free now but needs a second node:
/// reserved at 660 s on n0 + n2. S (2 GPUs, planned 360 s) backfills n2 until 303 s. T (1 GPU,
/// 3,000 s) fits nowhere that would not delay G. A ends at 600 s: G starts on n0 and n2, and
/// ends at 1,200 s, a second before B: T takes n0 (the first of the two emptied nodes).
#[test]
fn a_gang_spans_distinct_nodes_and_is_reserved_for() {
    let nodes = [node("n0", 2), node("n1", 2), node("n2", 2)];
    let jobs = [
        job(1, 0.0, 600.0, 1, 2),
        job(2, 1.0, 1200.0, 1, 2),
        job(3, 2.0, 600.0, 2, 2),
        job(4, 3.0, 300.0, 1, 2),
        job(5, 4.0, 3000.0, 1, 1),
    ];
    let s = starts(&run(&nodes, &jobs));
    assert_eq!(
        s,
        [(0.0, vec![0]), (1.0, vec![1]), (600.0, vec![0, 2]), (3.0, vec![2]), (1200.0, vec![0]),]
    );
}

/// A gang of 2 × 8 on nodes of 4 can never run: cancelled, not left pending; FIFO does not
/// stall behind it.
#[test]
fn a_job_the_cluster_can_never_hold_is_cancelled() {
    let nodes = [node("n0", 4), node("n1", 4)];
    let jobs = [job(1, 0.0, 600.0, 2, 8), job(2, 1.0, 60.0, 1, 4)];
    let s = run(&nodes, &jobs);
    assert_eq!(s.cancelled, [true, false]);
    assert!(s.runs[0].is_none());
    assert_eq!(s.runs[1].as_ref().map(|r| r.start_ms), Some(1000));
}

/// Without bounds every blocked job is reserved for; with `bf_window` shorter than the wait,
/// the blocked head gets no reservation and a long job behind it takes its GPU first.
#[test]
fn beyond_the_window_a_blocked_job_gets_no_reservation() {
    let nodes = [node("n0", 2)];
    // A holds one GPU for 10,000 s; B needs both; C (1 GPU, long) arrives behind B.
    let jobs = [job(1, 0.0, 10_000.0, 1, 1), job(2, 1.0, 600.0, 1, 2), job(3, 2.0, 20_000.0, 1, 1)];
    let unbounded = schedule(&nodes, &jobs, &SlurmBackfill::unbounded(), None).expect("runs");
    let start = |s: &SlurmSchedule, i: usize| s.runs[i].as_ref().map(|r| r.start_ms / 1000);
    assert_eq!((start(&unbounded, 1), start(&unbounded, 2)), (Some(10_000), Some(10_600)));
    let short = SlurmBackfill { window_s: 3_600.0, ..instant() };
    let windowed = schedule(&nodes, &jobs, &short, None).expect("runs");
    assert_eq!((start(&windowed, 1), start(&windowed, 2)), (Some(20_002), Some(2)));
}

#[test]
fn the_report_has_no_preemptions_and_balanced_books() {
    let nodes = [node("n0", 4)];
    let jobs = [job(1, 0.0, 600.0, 1, 3), job(2, 1.0, 600.0, 1, 4), job(3, 2.0, 300.0, 1, 1)];
    let policy = PolicySpec::minimal();
    let r =
        replay_slurm(&nodes, &policy, &jobs, &ReplayConfig::default(), &instant()).expect("runs");
    assert_eq!((r.jobs_finished, r.preemptions, r.lost_gpu_hours), (3, 0, 0.0));
    assert_eq!(r.policy, "slurm-backfill");
    // Delays 0, 599 and 0 s; span 0 → 1,200 s.
    assert_eq!(r.queue_delays_s, [0.0, 0.0, 599.0]);
    assert_eq!(r.span_s, 1200.0);
    let gpu_h = (3.0 * 600.0 + 4.0 * 600.0 + 300.0) / 3600.0;
    assert!((r.allocated_gpu_hours - gpu_h).abs() < 1e-9);
    assert!((r.allocated_gpu_hours - r.useful_gpu_hours - r.idle_gpu_hours).abs() < 1e-9);
    let pct = 100.0 * gpu_h * 3600.0 / (4.0 * 1200.0);
    assert!((r.gpu_allocated_pct - pct).abs() < 1e-9);
    // Stopped at 700 s: B runs, unfinished; C finished.
    let until = ReplayConfig { until_s: Some(700.0), ..ReplayConfig::default() };
    let r = replay_slurm(&nodes, &policy, &jobs, &until, &instant()).expect("runs");
    assert_eq!((r.jobs_finished, r.jobs_pending), (2, 1));
}

/// Two nodes of 8. A (a gang of 2 × 8) holds both to 600 s; B (8) then takes n0, after 599 s;
/// C (2 × 4, a member a node) needs room on both, so it waits for B's end: 1,198 s. D (1 GPU,
/// planned 180 s) is backfilled at 600 s, after 597 s. The big jobs (≥ 8 GPUs in all) are A, B
/// and C; D is not one.
#[test]
fn the_report_shows_the_waits_of_big_jobs_apart() {
    let nodes = [node("n0", 8), node("n1", 8)];
    let jobs = [
        job(1, 0.0, 600.0, 2, 8),
        job(2, 1.0, 600.0, 1, 8),
        job(3, 2.0, 600.0, 2, 4),
        job(4, 3.0, 100.0, 1, 1),
    ];
    let r =
        replay_slurm(&nodes, &PolicySpec::minimal(), &jobs, &ReplayConfig::default(), &instant())
            .expect("runs");
    assert_eq!(r.queue_delays_s, [0.0, 597.0, 599.0, 1198.0]);
    assert_eq!(r.big_jobs, 3);
    assert_eq!(r.big_queue_delay_s_mean, (599.0 + 1198.0) / 3.0);
    assert_eq!(
        (r.big_queue_delay_s_p50, r.big_queue_delay_s_p95, r.big_queue_delay_s_max),
        (599.0, 1198.0, 1198.0)
    );
}

mod random_traces {
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    }

    /// (submit ms, duration ms, members, GPUs per member)
    type JobShape = (u64, u64, u32, u32);

    fn traces() -> impl Strategy<Value = Vec<JobShape>> {
        prop::collection::vec((0u64..900_000, 1u64..2_000_000, 1u32..=3, 1u32..=5), 1..40)
    }

    fn build(shapes: &[JobShape]) -> Vec<TraceJob> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, &(submit, duration, members, gpus))| {
                job(i as u64 + 1, submit as f64 / 1000.0, duration as f64 / 1000.0, members, gpus)
            })
            .collect()
    }

    /// Priority order: submit time, then id (the order of `jobs` breaks ties here).
    fn earlier(jobs: &[TraceJob], a: usize, b: usize) -> bool {
        (jobs[a].submit_s, jobs[a].id) < (jobs[b].submit_s, jobs[b].id)
    }

    /// Where job `j` would start if it were first in line at `t0`, with what runs at `t0`
    /// holding its GPUs to its planned end (start + limit): the first of `t0` and those ends
    /// at which `members` distinct nodes have `gpus` free (only ends follow, so free at an
    /// instant stays free after it).
    fn planned_start(
        caps: &[u32],
        jobs: &[TraceJob],
        s: &SlurmSchedule,
        j: usize,
        t0: u64,
    ) -> Option<u64> {
        let running: Vec<(u64, &allot_sim::slurm::SlurmRun)> = s
            .runs
            .iter()
            .enumerate()
            .filter_map(|(k, r)| r.as_ref().map(|r| (k, r)))
            .filter(|(k, r)| {
                (r.start_ms < t0 || (r.start_ms == t0 && earlier(jobs, *k, j))) && r.end_ms > t0
            })
            .map(|(k, r)| (r.start_ms + time_limit_ms(jobs[k].duration_s), r))
            .collect();
        let mut candidates: Vec<u64> =
            std::iter::once(t0).chain(running.iter().map(|(e, _)| *e)).collect();
        candidates.sort_unstable();
        candidates.into_iter().find(|&c| {
            let fit = (0..caps.len())
                .filter(|&n| {
                    let used: u32 = running
                        .iter()
                        .filter(|(e, _)| *e > c)
                        .map(|(_, r)| {
                            r.nodes.iter().filter(|&&m| m as usize == n).count() as u32
                                * r.gpus_per_node
                        })
                        .sum();
                    caps[n] - used >= jobs[j].gpus
                })
                .count();
            fit >= jobs[j].members as usize
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Any trace on nodes of 2, 4 and 8 GPUs, conservative backfill without Slurm's
        /// bounds, passes at every instant or on a grid: no node ever holds more GPUs than it has; each job starts at or after its
        /// submission, on `members` distinct nodes with its GPUs on each; every job that fits
        /// the cluster finishes, the rest are cancelled; and a job never starts later than
        /// where it was planned when it became first in line (the reservation backfill
        /// promises it: no later job ever delays it). Deterministic.
        #[test]
        fn backfill_never_overallocates_or_delays_the_head(
            shapes in traces(),
            interval_s in prop_oneof![Just(0.0), Just(30.0), Just(600.0)],
        ) {
            let caps = [2u32, 4, 8];
            let nodes: Vec<NodeSpec> =
                caps.iter().enumerate().map(|(i, &c)| node(&format!("n{i}"), c as usize)).collect();
            let jobs = build(&shapes);
            let slurm = SlurmBackfill { interval_s, ..SlurmBackfill::unbounded() };
            let s = schedule(&nodes, &jobs, &slurm, None).expect("runs");
            prop_assert_eq!(&s, &schedule(&nodes, &jobs, &slurm, None).expect("runs"));
            // Per node: (time, +1 start / -1 end sorted ends first, GPUs).
            let mut changes: Vec<Vec<(u64, i8, u32)>> = vec![Vec::new(); caps.len()];
            for (i, j) in jobs.iter().enumerate() {
                let fits = (0..caps.len()).filter(|&n| caps[n] >= j.gpus).count()
                    >= j.members as usize;
                prop_assert_eq!(s.cancelled[i], !fits, "job {}", j.id);
                let Some(r) = &s.runs[i] else {
                    prop_assert!(!fits, "job {} never ran", j.id);
                    continue;
                };
                prop_assert!(r.finished, "job {} did not finish", j.id);
                prop_assert!(r.start_ms >= (j.submit_s * 1000.0).round() as u64);
                prop_assert_eq!(r.end_ms - r.start_ms, (j.duration_s * 1000.0).round() as u64);
                prop_assert_eq!(r.gpus_per_node, j.gpus);
                let mut distinct = r.nodes.clone();
                distinct.sort_unstable();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), j.members as usize, "job {}", j.id);
                for &n in &r.nodes {
                    changes[n as usize].push((r.start_ms, 1, j.gpus));
                    changes[n as usize].push((r.end_ms, -1, j.gpus));
                }
            }
            for (n, list) in changes.iter_mut().enumerate() {
                list.sort_unstable();
                let mut used: i64 = 0;
                for &(t, sign, g) in list.iter() {
                    used += i64::from(sign) * i64::from(g);
                    prop_assert!(used <= i64::from(caps[n]), "node {} over at {} ms", n, t);
                }
            }
            for j in 0..jobs.len() {
                let Some(r) = &s.runs[j] else { continue };
                // First in line: submitted, and every earlier job that runs has started.
                let t0 = (0..jobs.len())
                    .filter(|&k| earlier(&jobs, k, j))
                    .filter_map(|k| s.runs[k].as_ref().map(|r| r.start_ms))
                    .fold((jobs[j].submit_s * 1000.0).round() as u64, u64::max);
                if let Some(planned) = planned_start(&caps, &jobs, &s, j, t0) {
                    prop_assert!(
                        r.start_ms <= planned,
                        "job {} planned at {} ms when first in line at {} ms, started {} ms",
                        jobs[j].id, planned, t0, r.start_ms
                    );
                }
            }
        }
    }
}
