//! The plain-Slurm baseline of `allot sim replay --compare-with slurm-backfill`: the same jobs on
//! the same nodes, scheduled as `SchedulerType=sched/backfill` with FIFO priority would, so
//! that allot's figures have a Slurm column beside them. This is a model of another
//! scheduler, kept apart from the engine on purpose; nothing in allot schedules with it.
//!
//! What is modelled (Slurm's `sched/backfill`, `select/cons_tres`, `priority/basic`):
//! - **Priority** is submit order, ties by job id (`priority/basic`; no fair share, no
//!   per-account limits or quotas: the policy's projects only label the ledger).
//! - **Shape**: a job of `members` × `gpus` asks for `members` distinct nodes with `gpus`
//!   GPUs each (`sbatch -N members --gres=gpu:gpus`, as `scripts/bench-slurm-vs-allot.py`
//!   submits), on nodes whose every device is a model the job accepts. A member asking for a
//!   fraction of a GPU gets a whole one (`gres/gpu` is whole devices; `gres/shard` is not
//!   modelled). CPU and memory are not modelled; a job that asks for no GPU never waits.
//! - **Time limit**: the duration rounded up to whole minutes plus one minute
//!   ([`crate::replay::time_limit_ms`], the `--time-limits` rule). Plans use limits; a job
//!   runs for its trace duration and ends before its limit.
//! - **The main scheduler**, at every instant where a job arrived or ended: pending jobs in
//!   priority order, each started now if it fits now for its whole limit, up to the first
//!   that does not (strict FIFO: nothing passes a job left pending).
//! - **The backfill pass**, every `bf_interval` ([`SlurmBackfill::interval_s`], 30 s: on that
//!   grid, when something changed since the last): pending jobs in priority order against a
//!   plan of the future in which running jobs hold their GPUs until start + limit. A job
//!   that fits now, for its whole limit, without touching what the plan holds, starts now on
//!   the tightest nodes (best fit, ties by node order). A job that does not gets a
//!   reservation in the plan: the earliest start at which enough nodes stay free for its
//!   whole limit, on the tightest such nodes. Every later job plans around all earlier
//!   reservations, so it starts now only if it ends (by its limit) before the reservations
//!   on the nodes it takes, or takes nodes and GPUs no reservation needs — what Slurm's
//!   backfill does: it reserves for every job it tests and cannot start, not only the first.
//!   The plan is rebuilt by every pass (jobs end before their limits, so reservations move
//!   earlier).
//! - **Slurm's limits on a pass** (defaults): `bf_max_job_test=500` jobs tested per pass
//!   ([`SlurmBackfill::jobs_tested_max`]) and `bf_window=1440` minutes
//!   ([`SlurmBackfill::window_s`]): a job whose earliest start lies further ahead gets no
//!   reservation, so later jobs may delay it. A pass also ends once no GPU is free now (no
//!   later job could start, and the next pass rebuilds the reservations anyway).
//! - **No pre-emption, no requeue, no idle reclaim**: a job runs once, for its duration.
//!
//! Not modelled: `sched_interval` (the main scheduler's periodic full run: it starts
//! nothing the event-driven runs did not) and `default_queue_depth` (its stop at the first
//! blocked job comes first on a busy cluster); `bf_resolution` (60 s rounding of the plan);
//! `bf_continue`, `bf_max_job_user`, `bf_max_time` and the other backfill limits; node
//! weights, topology and switches; the time a pass takes (Slurm's passes are not free on a
//! deep queue; here they are instantaneous); launch delays
//! (`ReplayConfig::launch_delay_s`: a job runs from its start). The plan holds a reservation's
//! GPUs per node (Slurm's plan holds the job's resources on those nodes); a plan that held
//! whole nodes would only make Slurm slower.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use allot_core::{NodeSpec, PolicySpec, SHARES_PER_GPU};

use crate::activity::{JobActivity, assign_kind};
use crate::outcome::{ReplayReport, TimelinePoint};
use crate::replay::{
    BookedFate, JobBook, ReplayConfig, ReplayError, RunTotals, TIMELINE_POINTS_MAX, build_report,
    ms, secs, time_limit_ms, timeline_step_ms,
};
use crate::trace::TraceJob;

/// The label of the baseline's column in a report.
pub const SLURM_BACKFILL_LABEL: &str = "slurm-backfill";

/// Slurm's backfill parameters the model keeps (`SchedulerParameters` in `slurm.conf`).
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmBackfill {
    /// `bf_max_job_test`: pending jobs one pass tests, in priority order (Slurm's default:
    /// 500). Later jobs wait for the next pass, however well they would fit.
    pub jobs_tested_max: usize,
    /// `bf_window`, seconds: how far ahead a reservation may start (Slurm's default: one
    /// day). A job that cannot start within it gets no reservation.
    pub window_s: f64,
    /// `bf_interval`, seconds: backfill passes fall on this grid (Slurm's default: 30), and
    /// between them the main scheduler starts jobs in strict FIFO order at every arrival and
    /// end, up to the first that does not fit. 0: a backfill pass at every such instant.
    pub interval_s: f64,
}

impl Default for SlurmBackfill {
    fn default() -> SlurmBackfill {
        SlurmBackfill { jobs_tested_max: 500, window_s: 86_400.0, interval_s: 30.0 }
    }
}

impl SlurmBackfill {
    /// Every pending job tested and reserved for, however far ahead, at every instant where
    /// a job arrived or ended: conservative backfill without Slurm's bounds and cadence
    /// (tests, and what Slurm does with them raised).
    pub fn unbounded() -> SlurmBackfill {
        SlurmBackfill { jobs_tested_max: usize::MAX, window_s: f64::INFINITY, interval_s: 0.0 }
    }
}

/// One job's run under the baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmRun {
    pub start_ms: u64,
    /// The real end (start + duration), or where the replay stopped (`until_s`).
    pub end_ms: u64,
    /// Ran to its end (not cut by `until_s`).
    pub finished: bool,
    /// One node per member, by index into the nodes.
    pub nodes: Vec<u32>,
    /// GPUs on each of those nodes.
    pub gpus_per_node: u32,
}

/// What the baseline did with each job (in the order of the jobs given).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlurmSchedule {
    /// `None`: never started (still pending at the end, or cancelled).
    pub runs: Vec<Option<SlurmRun>>,
    /// Asks for more than the cluster could ever give (too many nodes or GPUs per node).
    pub cancelled: Vec<bool>,
    /// Backfill passes run.
    pub passes: u64,
    /// The last instant replayed, ms.
    pub end_ms: u64,
}

/// A job's request as the model reads it.
struct Shape {
    members: usize,
    gpus: u32,
    limit_ms: u64,
    duration_ms: u64,
    /// Per node: whether the job may run there (`None`: everywhere).
    allowed: Option<Vec<bool>>,
}

impl Shape {
    fn of(job: &TraceJob, models: &[Option<&str>]) -> Shape {
        let allowed = (!job.gpu_models.is_empty()).then(|| {
            models
                .iter()
                .map(|m| m.is_some_and(|m| job.gpu_models.iter().any(|g| g == m)))
                .collect()
        });
        Shape {
            members: job.members.max(1) as usize,
            gpus: job.gpus,
            limit_ms: time_limit_ms(job.duration_s),
            duration_ms: ms(job.duration_s),
            allowed,
        }
    }

    fn may_use(&self, node: usize, capacity: u32) -> bool {
        capacity >= self.gpus && self.allowed.as_ref().is_none_or(|a| a[node])
    }
}

/// The scheduler's state: GPUs free now, running jobs' planned ends, and the reservations of
/// the pass under way.
struct Plan {
    capacity: Vec<u32>,
    free: Vec<u32>,
    free_total: u64,
    /// Per node: (planned end = start + limit, GPUs) of each running job there.
    node_ends: Vec<Vec<(u64, u32)>>,
    /// Every running job's planned end per node: (end, node, job, GPUs).
    ends: BTreeSet<(u64, u32, usize, u32)>,
    /// This pass: per node, (start, end, GPUs) of each reservation.
    node_holds: Vec<Vec<(u64, u64, u32)>>,
    /// This pass: (time, node, sequence, ±GPUs) at each reservation's start and end.
    hold_edges: BTreeSet<(u64, u32, u64, i64)>,
    held_nodes: Vec<u32>,
    /// Per GPU count g (index g − 1): (the first instant node n could have g GPUs free,
    /// holds aside — 0 when it has them now —, n). A lower bound of where a one-node job of
    /// g GPUs can start on n, kept as jobs start and end.
    first_free: Vec<BTreeSet<(u64, u32)>>,
    /// Each node's keys in `first_free`, by g − 1.
    first_free_keys: Vec<Vec<u64>>,
    /// Per node, its GPUs free from now on as a step function: (from, free) with the first
    /// step at 0 (= now: planned ends and holds all lie ahead); remade whenever the node's
    /// running jobs or holds change.
    steps: Vec<Vec<(u64, i64)>>,
}

impl Plan {
    /// GPUs the plan leaves free on `node` over [`from`, `to`): the least of its steps there.
    fn free_over(&self, node: usize, from: u64, to: u64) -> i64 {
        let steps = &self.steps[node];
        let i = steps.partition_point(|s| s.0 <= from).saturating_sub(1);
        let later = steps[i + 1..].iter().take_while(|s| s.0 < to);
        later.fold(steps[i].1, |least, s| least.min(s.1))
    }

    /// The first instant from `from` (no later than `horizon`) at which `node` keeps `gpus`
    /// free for `limit_ms`, with the least it leaves free then. One pass over the node's
    /// steps: a start inside a step whose window meets a step short of GPUs fails, and so does
    /// every start before that short step, so the search resumes after it.
    fn earliest_on(
        &self,
        node: usize,
        gpus: u32,
        limit_ms: u64,
        from: u64,
        horizon: u64,
    ) -> Option<(u64, i64)> {
        let steps = &self.steps[node];
        let need = i64::from(gpus);
        let mut i = steps.partition_point(|s| s.0 <= from).saturating_sub(1);
        while let Some(&(at, free)) = steps.get(i) {
            let t = at.max(from);
            if t > horizon {
                return None;
            }
            if free < need {
                i += 1;
                continue;
            }
            let mut least = free;
            let mut j = i + 1;
            while let Some(&(_, free)) = steps.get(j).filter(|s| s.0 < t + limit_ms) {
                if free < need {
                    break;
                }
                least = least.min(free);
                j += 1;
            }
            if steps.get(j).is_none_or(|s| s.0 >= t + limit_ms) {
                return Some((t, least));
            }
            i = j + 1;
        }
        None
    }

    /// Remakes `node`'s steps from its free GPUs now, running jobs' planned ends and holds.
    fn restep(&mut self, node: u32) {
        let i = node as usize;
        let mut changes: Vec<(u64, i64)> =
            self.node_ends[i].iter().map(|&(e, g)| (e, i64::from(g))).collect();
        for &(s, e, g) in &self.node_holds[i] {
            changes.push((s, -i64::from(g)));
            changes.push((e, i64::from(g)));
        }
        changes.sort_unstable();
        let steps = &mut self.steps[i];
        steps.clear();
        let mut free = i64::from(self.free[i]);
        steps.push((0, free));
        for (t, delta) in changes {
            free += delta;
            match steps.last_mut() {
                Some(last) if last.0 == t => last.1 = free,
                _ => steps.push((t, free)),
            }
        }
    }

    /// The tightest `shape.members` of `candidates` that stay free enough for the job's whole
    /// limit from `t` (best fit: least GPUs left free, ties by node order).
    fn choose(&self, shape: &Shape, t: u64, candidates: &[u32]) -> Option<Vec<u32>> {
        let mut fit: Vec<(i64, u32)> = candidates
            .iter()
            .map(|&n| (self.free_over(n as usize, t, t + shape.limit_ms), n))
            .filter(|(f, _)| *f >= i64::from(shape.gpus))
            .collect();
        if fit.len() < shape.members {
            return None;
        }
        fit.sort_unstable();
        fit.dedup_by_key(|(_, n)| *n);
        (fit.len() >= shape.members).then(|| fit[..shape.members].iter().map(|(_, n)| *n).collect())
    }

    /// The earliest start at or after `now`, no later than `horizon`, and its nodes. The
    /// earliest start of a node is `now` or an instant where its free GPUs grow (a planned end
    /// or a reservation's end): before such an instant a start could only be earlier. So the
    /// search sweeps those instants, keeping each node's free GPUs at the instant, and checks
    /// the whole limit only where enough nodes are free at the instant itself.
    fn earliest(&self, shape: &Shape, now: u64, horizon: u64) -> Option<(u64, Vec<u32>)> {
        let (g, m) = (shape.gpus, shape.members);
        if m == 1 {
            return self.earliest_on_one_node(shape, now, horizon);
        }
        let usable = |n: usize| shape.may_use(n, self.capacity[n]);
        let free_enough = |f: i64| f >= i64::from(g);
        let mut at_instant: Vec<i64> = self.free.iter().map(|&f| i64::from(f)).collect();
        // The nodes that may take a member at the instant, holds and limits aside.
        let open = |at_instant: &[i64]| -> Vec<u32> {
            (0..at_instant.len())
                .filter(|&n| usable(n) && free_enough(at_instant[n]))
                .map(|n| n as u32)
                .collect()
        };
        let mut count = open(&at_instant).len();
        if count >= m
            && let Some(nodes) = self.choose(shape, now, &open(&at_instant))
        {
            return Some((now, nodes));
        }
        let mut ends = self.ends.range((now + 1, 0, 0, 0)..).peekable();
        let mut edges = self.hold_edges.range((now + 1, 0, 0, i64::MIN)..).peekable();
        loop {
            let t = match (ends.peek(), edges.peek()) {
                (None, None) => return None,
                (Some(a), None) => a.0,
                (None, Some(b)) => b.0,
                (Some(a), Some(b)) => a.0.min(b.0),
            };
            if t > horizon {
                return None;
            }
            let mut grew = false;
            let mut change = |n: u32, delta: i64| {
                let i = n as usize;
                let before = free_enough(at_instant[i]);
                at_instant[i] += delta;
                let after = free_enough(at_instant[i]);
                if usable(i) && before != after {
                    if after { count += 1 } else { count -= 1 }
                }
                grew |= delta > 0;
            };
            while let Some(&&(_, n, _, gpus)) = ends.peek().filter(|e| e.0 == t) {
                change(n, i64::from(gpus));
                ends.next();
            }
            while let Some(&&(_, n, _, delta)) = edges.peek().filter(|e| e.0 == t) {
                change(n, delta);
                edges.next();
            }
            if grew
                && count >= m
                && let Some(nodes) = self.choose(shape, t, &open(&at_instant))
            {
                return Some((t, nodes));
            }
        }
    }

    /// [`Plan::earliest`] for a one-node job: nodes in the order of `first_free` (a lower
    /// bound of their earliest start) until that bound passes the best start found; on each,
    /// the first of its own growth instants from the bound where the job fits its limit.
    /// Ties at the same start go to the tightest node, then the first, as in `choose`.
    fn earliest_on_one_node(
        &self,
        shape: &Shape,
        now: u64,
        horizon: u64,
    ) -> Option<(u64, Vec<u32>)> {
        let g = shape.gpus;
        let set = self.first_free.get((g as usize).checked_sub(1)?)?;
        let mut best: Option<(u64, i64, u32)> = None;
        for &(bound, n) in set {
            let from = bound.max(now);
            if from > horizon || best.is_some_and(|b| from > b.0) {
                break;
            }
            let i = n as usize;
            if !shape.may_use(i, self.capacity[i]) {
                continue;
            }
            let found =
                self.earliest_on(i, g, shape.limit_ms, from, horizon).map(|(t, fit)| (t, fit, n));
            if let Some(f) = found
                && best.is_none_or(|b| f < b)
            {
                best = Some(f);
            }
        }
        best.map(|(t, _, n)| (t, vec![n]))
    }

    /// Recomputes node `n`'s keys in `first_free` after a job started or ended there.
    fn rekey(&mut self, n: u32) {
        let i = n as usize;
        let mut ends = self.node_ends[i].clone();
        ends.sort_unstable();
        for g in 1..=self.capacity[i] {
            let mut free = self.free[i];
            let mut key = 0;
            for &(end, gpus) in &ends {
                if free >= g {
                    break;
                }
                free += gpus;
                key = end;
            }
            let slot = &mut self.first_free_keys[i][g as usize - 1];
            self.first_free[g as usize - 1].remove(&(*slot, n));
            *slot = key;
            self.first_free[g as usize - 1].insert((key, n));
        }
    }

    fn hold(&mut self, seq: &mut u64, start: u64, end: u64, nodes: &[u32], gpus: u32) {
        for &n in nodes {
            self.node_holds[n as usize].push((start, end, gpus));
            self.restep(n);
            *seq += 1;
            self.hold_edges.insert((start, n, *seq, -i64::from(gpus)));
            *seq += 1;
            self.hold_edges.insert((end, n, *seq, i64::from(gpus)));
            self.held_nodes.push(n);
        }
    }

    fn release_holds(&mut self) {
        let mut held = std::mem::take(&mut self.held_nodes);
        held.sort_unstable();
        held.dedup();
        for &n in &held {
            self.node_holds[n as usize].clear();
        }
        for n in held {
            self.restep(n);
        }
        self.hold_edges.clear();
    }

    fn start(&mut self, job: usize, end: u64, nodes: &[u32], gpus: u32) {
        for &n in nodes {
            self.free[n as usize] -= gpus;
            self.free_total -= u64::from(gpus);
            self.node_ends[n as usize].push((end, gpus));
            self.ends.insert((end, n, job, gpus));
            self.rekey(n);
            self.restep(n);
        }
    }

    fn finish(&mut self, job: usize, end: u64, nodes: &[u32], gpus: u32) {
        for &n in nodes {
            self.free[n as usize] += gpus;
            self.free_total += u64::from(gpus);
            let list = &mut self.node_ends[n as usize];
            if let Some(i) = list.iter().position(|&e| e == (end, gpus)) {
                list.swap_remove(i);
            }
            self.ends.remove(&(end, n, job, gpus));
            self.rekey(n);
            self.restep(n);
        }
    }
}

/// Schedules `jobs` on `nodes` as the baseline does, up to `until_s` (all of them when
/// `None`). Deterministic. Fails only on a duplicate job id.
pub fn schedule(
    nodes: &[NodeSpec],
    jobs: &[TraceJob],
    slurm: &SlurmBackfill,
    until_s: Option<f64>,
) -> Result<SlurmSchedule, ReplayError> {
    let mut seen = BTreeSet::new();
    if let Some(dup) = jobs.iter().find(|j| !seen.insert(j.id)) {
        return Err(ReplayError::Job {
            line: dup.line,
            message: format!("job id {} appears twice", dup.id),
        });
    }
    // A node's model, where all its devices share one.
    let models: Vec<Option<&str>> = nodes
        .iter()
        .map(|n| {
            let first = n.devices.first().map(|d| d.model.as_str());
            first.filter(|f| n.devices.iter().all(|d| d.model == *f))
        })
        .collect();
    let capacity: Vec<u32> = nodes.iter().map(|n| n.devices.len() as u32).collect();
    let mut plan = Plan {
        free_total: capacity.iter().map(|&c| u64::from(c)).sum(),
        free: capacity.clone(),
        node_ends: vec![Vec::new(); nodes.len()],
        node_holds: vec![Vec::new(); nodes.len()],
        capacity,
        ends: BTreeSet::new(),
        hold_edges: BTreeSet::new(),
        held_nodes: Vec::new(),
        first_free: Vec::new(),
        first_free_keys: Vec::new(),
        steps: Vec::new(),
    };
    plan.steps = plan.capacity.iter().map(|&c| vec![(0, i64::from(c))]).collect();
    let gpus_max = plan.capacity.iter().copied().max().unwrap_or(0) as usize;
    plan.first_free = vec![BTreeSet::new(); gpus_max];
    plan.first_free_keys = plan.capacity.iter().map(|&c| vec![0; c as usize]).collect();
    for (n, &c) in plan.capacity.iter().enumerate() {
        for g in 1..=c as usize {
            plan.first_free[g - 1].insert((0, n as u32));
        }
    }
    let shapes: Vec<Shape> = jobs.iter().map(|j| Shape::of(j, &models)).collect();
    let mut out = SlurmSchedule {
        runs: vec![None; jobs.len()],
        cancelled: vec![false; jobs.len()],
        ..SlurmSchedule::default()
    };
    // (time, class: 0 end, 1 arrival, job): ends free GPUs before the instant's pass.
    let mut happenings: BinaryHeap<Reverse<(u64, u8, usize)>> =
        jobs.iter().enumerate().map(|(i, j)| Reverse((ms(j.submit_s), 1, i))).collect();
    let mut pending: BTreeSet<(u64, u64, usize)> = BTreeSet::new();
    let until_ms = until_s.map(ms);
    let window_ms = ms(slurm.window_s);
    let interval_ms = ms(slurm.interval_s);
    let mut changed = false;
    let mut backfill_due: Option<u64> = None;
    let mut backfill_now = false;
    let mut seq = 0u64;
    while let Some(Reverse((t, class, i))) = happenings.pop() {
        if until_ms.is_some_and(|u| t > u) {
            break;
        }
        out.end_ms = t;
        if class == 2 {
            // This pass takes in every change of the instant so far.
            (backfill_due, backfill_now, changed) = (None, true, false);
        } else {
            let shape = &shapes[i];
            if class == 0 {
                if let Some(run) = &mut out.runs[i] {
                    run.finished = true;
                    plan.finish(i, run.start_ms + shape.limit_ms, &run.nodes, run.gpus_per_node);
                }
                changed = true;
            } else if shape.gpus == 0 {
                // Asks for no GPU: nothing to wait for.
                launch(&mut plan, &mut out, &mut happenings, (i, shape), t, Vec::new());
            } else if (0..nodes.len()).filter(|&n| shape.may_use(n, plan.capacity[n])).count()
                < shape.members
            {
                out.cancelled[i] = true;
            } else {
                pending.insert((t, jobs[i].id, i));
                changed = true;
            }
        }
        if changed && interval_ms > 0 && backfill_due.is_none() && !pending.is_empty() {
            // The next backfill pass, on its grid (at `t` itself when `t` is on it).
            let at = t.div_ceil(interval_ms) * interval_ms;
            backfill_due = Some(at);
            happenings.push(Reverse((at, 2, usize::MAX)));
        }
        let instant_over = happenings.peek().is_none_or(|Reverse((next, _, _))| *next > t);
        if !instant_over {
            continue;
        }
        let backfill = backfill_now || (interval_ms == 0 && changed);
        let main = changed;
        (changed, backfill_now) = (false, false);
        if pending.is_empty() || !(backfill || main) {
            continue;
        }
        // The main scheduler (strict FIFO: up to the first job that does not start) or a
        // backfill pass (every tested job, a reservation for each one that does not start).
        let (tested_max, horizon) = if backfill {
            out.passes += 1;
            (slurm.jobs_tested_max, t.saturating_add(window_ms))
        } else {
            (usize::MAX, t)
        };
        let tested: Vec<(u64, u64, usize)> = pending.iter().take(tested_max).copied().collect();
        for key in tested {
            if plan.free_total == 0 {
                break;
            }
            let j = key.2;
            let shape = &shapes[j];
            match plan.earliest(shape, t, horizon) {
                Some((start, nodes)) if start == t => {
                    pending.remove(&key);
                    launch(&mut plan, &mut out, &mut happenings, (j, shape), t, nodes);
                }
                _ if !backfill => break,
                Some((start, nodes)) => {
                    plan.hold(&mut seq, start, start + shape.limit_ms, &nodes, shape.gpus);
                }
                None => {}
            }
        }
        plan.release_holds();
    }
    if let Some(u) = until_ms {
        out.end_ms = u;
    }
    for run in out.runs.iter_mut().flatten() {
        run.end_ms = run.end_ms.min(out.end_ms.max(run.start_ms));
    }
    Ok(out)
}

/// Starts job `j` at `t` on `nodes` (none: it asks for no GPU) and queues its end.
fn launch(
    plan: &mut Plan,
    out: &mut SlurmSchedule,
    happenings: &mut BinaryHeap<Reverse<(u64, u8, usize)>>,
    (j, shape): (usize, &Shape),
    t: u64,
    nodes: Vec<u32>,
) {
    plan.start(j, t + shape.limit_ms, &nodes, shape.gpus);
    happenings.push(Reverse((t + shape.duration_ms, 0, j)));
    out.runs[j] = Some(SlurmRun {
        start_ms: t,
        end_ms: t + shape.duration_ms,
        finished: false,
        nodes,
        gpus_per_node: shape.gpus,
    });
}

/// Replays `jobs` on `nodes` under the baseline and reports it as a replay is reported:
/// `policy` only names the ledger's projects (its quotas are not used), `config` gives the
/// seed and activity model (for the active and useful figures), `until_s` and the timeline
/// step; its other settings (cycles, checkpoints, pre-emption) have no meaning here. No
/// pre-emption: nothing is lost, and allocated = useful + idle.
pub fn replay_slurm(
    nodes: &[NodeSpec],
    policy: &PolicySpec,
    jobs: &[TraceJob],
    config: &ReplayConfig,
    slurm: &SlurmBackfill,
) -> Result<ReplayReport, ReplayError> {
    let sched = schedule(nodes, jobs, slurm, config.until_s)?;
    let params = &config.activity;
    let activity: Vec<JobActivity> = jobs
        .iter()
        .map(|j| {
            let shares = j.total_shares();
            let kind =
                j.kind.unwrap_or_else(|| assign_kind(config.seed, j.id, shares, j.duration_s));
            JobActivity::new(params, config.seed, j.id, kind, j.duration_s)
        })
        .collect();
    let project_of: BTreeMap<&str, usize> =
        policy.projects.iter().enumerate().map(|(i, p)| (p.name.as_str(), i)).collect();
    let books = jobs.iter().enumerate().map(|(i, j)| {
        let run = sched.runs[i].as_ref();
        let (gpus, start, ran) = run.map_or((0.0, 0.0, 0.0), |r| {
            (run_gpus(r), secs(r.start_ms), secs(r.end_ms - r.start_ms))
        });
        let active = gpus * activity[i].integral(params, 0.0, start, ran);
        JobBook {
            project: project_of.get(j.project.as_str()).copied().unwrap_or(usize::MAX),
            outcome: match run {
                Some(r) if r.finished => BookedFate::Finished,
                _ if sched.cancelled[i] => BookedFate::Cancelled,
                _ => BookedFate::Pending,
            },
            first_admit_s: run.map(|r| secs(r.start_ms)),
            finish_s: run.filter(|r| r.finished).map(|r| secs(r.end_ms)),
            preemptions: 0,
            allocated: gpus * ran,
            active,
            useful: active,
            idle: gpus * ran - active,
            lost: 0.0,
        }
    });
    let capacity_shares: u64 =
        nodes.iter().map(|n| n.devices.len() as u64).sum::<u64>() * SHARES_PER_GPU;
    let run = RunTotals {
        label: SLURM_BACKFILL_LABEL,
        seed: config.seed,
        jobs,
        projects: policy.projects.iter().map(|p| p.name.clone()).collect(),
        capacity_shares,
        end_s: secs(sched.end_ms),
        preemptions: 0,
        decide_calls: sched.passes,
        timeline: timeline(jobs, config, &sched, &activity),
    };
    Ok(build_report(run, books))
}

/// GPUs a run holds.
fn run_gpus(r: &SlurmRun) -> f64 {
    f64::from(r.gpus_per_node) * r.nodes.len() as f64
}

/// The baseline's allocation over time, sampled as the replay samples it.
fn timeline(
    jobs: &[TraceJob],
    config: &ReplayConfig,
    sched: &SlurmSchedule,
    activity: &[JobActivity],
) -> Vec<TimelinePoint> {
    let step_ms = timeline_step_ms(jobs, config).max(1);
    // (time, kind: 0 end, 1 arrival, 2 start, job): the state just after each instant.
    let mut changes: Vec<(u64, u8, usize)> = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        if ms(j.submit_s) <= sched.end_ms && !sched.cancelled[i] {
            changes.push((ms(j.submit_s), 1, i));
        }
        if let Some(r) = &sched.runs[i] {
            changes.push((r.start_ms, 2, i));
            if r.finished {
                changes.push((r.end_ms, 0, i));
            }
        }
    }
    changes.sort_unstable();
    let gpus_of = |i: usize| sched.runs[i].as_ref().map_or(0.0, run_gpus);
    let mut running: BTreeSet<usize> = BTreeSet::new();
    let (mut pending, mut allocated) = (0usize, 0.0);
    let mut points = Vec::new();
    let mut next = changes.iter().peekable();
    let mut t = 0u64;
    while t <= sched.end_ms && points.len() < TIMELINE_POINTS_MAX {
        // Sampled before what happens at `t`, as the replay samples before each instant.
        while let Some(&(_, kind, i)) = next.next_if(|c| c.0 < t) {
            match kind {
                0 => {
                    running.remove(&i);
                    allocated -= gpus_of(i);
                }
                1 => pending += 1,
                _ => {
                    running.insert(i);
                    allocated += gpus_of(i);
                    pending = pending.saturating_sub(1);
                }
            }
        }
        let t_s = secs(t);
        let active = running
            .iter()
            .filter_map(|&i| sched.runs[i].as_ref().map(|r| (i, r)))
            .map(|(i, r)| {
                run_gpus(r) * activity[i].at(&config.activity, t_s - secs(r.start_ms), t_s)
            })
            .sum();
        points.push(TimelinePoint {
            t_s,
            allocated_gpus: allocated,
            active_gpus: active,
            pending_jobs: pending,
        });
        t += step_ms;
    }
    points
}
