//! Scheduling benchmark: `cargo bench -p allot-core --bench schedule`.
//!
//! 5,000 nodes × 8 GPUs, 50,000 pending workloads (1, 2, 4, 8 whole GPUs and 0.25/0.5 shares,
//! some 2-member gangs), 20 projects in 4 cohorts, 3 priority classes. Prints placements per
//! second for the first (filling) cycle, the time of a full `decide` over a saturated queue,
//! a churn cycle after 5 % of running work finishes, and the process's peak memory. It then
//! repeats the fill at 100,000 workloads for the memory goal. Then a daemon's life on the
//! saturated queue: `--ticks N` cycles 1 s apart (`decide_news` with `Refresh::default()`, as
//! the daemon calls it), before each 10 running workloads finish, 10 new ones arrive and one
//! high-priority 1-GPU probe is submitted in a project within its guarantee (it finishes once
//! admitted); decisions take effect at once (admitted work starts, victims stop). It prints the
//! cycles' p50 / p99 / max, how many probes were admitted (or had their victims chosen) in the
//! very next cycle, and the deferrals reported a cycle. Figures, not assertions: the machine is
//! shared. Options: `-- --nodes N
//! --workloads N --seed N --ticks N --quick --defrag` (`--defrag`: the policy has
//! defragmentation on, default restart cost).

#![allow(clippy::print_stdout, clippy::disallowed_methods, clippy::unwrap_used)]

use std::time::Instant;

use allot_core::{
    Decision, Defragmentation, DeviceSpec, Engine, Event, GpuRequest, NodeSpec, PolicySpec,
    PriorityClassSpec, ProjectSpec, Queueing, QuotaModel, QuotaSpec, Refresh, Shares, Timestamp,
    WorkloadSpec,
};

const MODELS: [&str; 2] = ["H100", "A100"];
const PROJECTS: usize = 20;
const COHORTS: usize = 4;

/// xorshift64*: a tiny seeded generator so the workload mix is the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cluster(nodes: usize) -> Vec<NodeSpec> {
    (0..nodes)
        .map(|i| {
            let model = MODELS[i % MODELS.len()];
            NodeSpec {
                name: format!("node-{i:05}"),
                cpu_millis: 224_000,
                memory_mib: 2_048 * 1024,
                labels: Default::default(),
                pool: Some(format!("pool-{}", i % 4)),
                rack: Some(format!("rack-{}", i / 32)),
                devices: (0..8)
                    .map(|d| DeviceSpec {
                        model: model.into(),
                        memory_mib: 81_920,
                        island: d / 4,
                        mig: false,
                    })
                    .collect(),
            }
        })
        .collect()
}

fn policy(nodes: usize, defrag: bool) -> PolicySpec {
    // Each model's capacity is split evenly as guarantees; half of every guarantee is lendable.
    let per_model_gpus = (nodes / MODELS.len() * 8) as u64;
    let per_project = per_model_gpus * 1000 / PROJECTS as u64;
    PolicySpec {
        priority_classes: vec![
            PriorityClassSpec { name: "low".into(), value: -100, preemptible: true },
            PriorityClassSpec { name: "normal".into(), value: 0, preemptible: true },
            PriorityClassSpec { name: "high".into(), value: 100, preemptible: false },
        ],
        default_priority_class: "normal".into(),
        projects: (0..PROJECTS)
            .map(|p| ProjectSpec {
                name: format!("project-{p:02}"),
                cohort: Some(format!("cohort-{}", p % COHORTS)),
                department: Some(format!("dept-{}", p % 2)),
                quotas: MODELS
                    .iter()
                    .map(|m| QuotaSpec {
                        model: QuotaModel::Model((*m).into()),
                        guaranteed: Shares(per_project),
                        borrow_limit: Some(Shares(per_project)),
                        lend_limit: Some(Shares(per_project / 2)),
                    })
                    .collect(),
                weight_milli: 1000 + (p as u64 % 3) * 500,
                queueing: if p % 5 == 0 { Queueing::StrictFifo } else { Queueing::BestEffortFifo },
                preemption_mode: None,
                preempt_within_project: Default::default(),
                borrow_within_cohort: None,
            })
            .chain(std::iter::once(probe_project()))
            .collect(),
        fair_share_half_life_ms: 7 * 24 * 3_600_000,
        defragmentation: defrag.then(Defragmentation::default),
        ..PolicySpec::minimal()
    }
}

/// The project of the daemon-life probes: 8 GPUs of each model guaranteed in the first
/// cohort, none borrowed, so that a probe is within its guarantee and may reclaim what the
/// cohort's borrowers hold.
const PROBE_PROJECT: &str = "probe";

fn probe_project() -> ProjectSpec {
    ProjectSpec {
        name: PROBE_PROJECT.into(),
        cohort: Some("cohort-0".into()),
        department: None,
        quotas: MODELS
            .iter()
            .map(|m| QuotaSpec {
                model: QuotaModel::Model((*m).into()),
                guaranteed: Shares(8_000),
                borrow_limit: Some(Shares(0)),
                lend_limit: None,
            })
            .collect(),
        weight_milli: 1000,
        queueing: Queueing::BestEffortFifo,
        preemption_mode: None,
        preempt_within_project: Default::default(),
        borrow_within_cohort: None,
    }
}

fn workload(rng: &mut Rng, id: u64) -> WorkloadSpec {
    let project = format!("project-{:02}", rng.below(PROJECTS as u64));
    let gpus = match rng.below(100) {
        0..=39 => GpuRequest::Whole(1),
        40..=59 => GpuRequest::Whole(2),
        60..=74 => GpuRequest::Whole(4),
        75..=84 => GpuRequest::Whole(8),
        85..=92 => GpuRequest::Shares(500),
        _ => GpuRequest::Shares(250),
    };
    let mut spec = WorkloadSpec::new(id, "", &project, gpus);
    spec.members = if matches!(gpus, GpuRequest::Whole(8)) && rng.below(4) == 0 { 2 } else { 1 };
    spec.cpu_millis_per_member = 4_000;
    spec.memory_mib_per_member = 32 * 1024;
    spec.priority_class = Some(["low", "normal", "normal", "high"][rng.below(4) as usize].into());
    if rng.below(3) == 0 {
        spec.gpu_models = vec![MODELS[rng.below(2) as usize].into()];
    }
    spec
}

fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib / 1024)
}

fn count(decisions: &[Decision], action: &str) -> usize {
    decisions.iter().filter(|d| d.action() == action).count()
}

fn run(nodes: usize, workloads: usize, seed: u64, defrag: bool, ticks: usize) {
    println!(
        "== {nodes} nodes × 8 GPUs, {workloads} pending workloads, seed {seed}{}",
        if defrag { ", defragmentation on" } else { "" }
    );
    let build = Instant::now();
    let mut engine = Engine::new(&cluster(nodes), &policy(nodes, defrag)).unwrap();
    let mut rng = Rng(seed | 1);
    for id in 1..=workloads as u64 {
        engine.apply(Timestamp(id), Event::WorkloadSubmitted(workload(&mut rng, id)));
    }
    println!("build + submit: {:.1} ms", build.elapsed().as_secs_f64() * 1e3);

    let t = Instant::now();
    let first = engine.decide(Timestamp(1_000_000));
    let first_s = t.elapsed().as_secs_f64();
    let admitted = count(&first, "admit");
    println!(
        "fill cycle: {:.1} ms, {admitted} admitted, {} deferred → {:.0} placements/s ({:.2} µs per workload decided)",
        first_s * 1e3,
        count(&first, "defer"),
        admitted as f64 / first_s,
        first_s * 1e6 / first.len().max(1) as f64
    );
    for d in &first {
        if let Decision::Admit { workload, .. } = d {
            engine.apply(Timestamp(1_000_001), Event::AllocationStarted { workload: *workload });
        }
    }

    let t = Instant::now();
    let saturated = engine.decide(Timestamp(2_000_000));
    println!(
        "saturated cycle: {:.1} ms over {} pending ({} admitted, {} pre-emptions)",
        t.elapsed().as_secs_f64() * 1e3,
        count(&saturated, "defer") + count(&saturated, "admit"),
        count(&saturated, "admit"),
        count(&saturated, "preempt")
    );

    // Churn: 5 % of running work finishes; the next cycle refills.
    let running: Vec<_> = first
        .iter()
        .filter_map(
            |d| if let Decision::Admit { workload, .. } = d { Some(*workload) } else { None },
        )
        .collect();
    for w in running.iter().step_by(20) {
        engine.apply(Timestamp(3_000_000), Event::WorkloadFinished { workload: *w });
    }
    let t = Instant::now();
    let churn = engine.decide(Timestamp(3_000_001));
    let churn_s = t.elapsed().as_secs_f64();
    println!(
        "churn cycle after {} finished: {:.1} ms, {} admitted, {} pre-emptions",
        running.len().div_ceil(20),
        churn_s * 1e3,
        count(&churn, "admit"),
        count(&churn, "preempt")
    );
    // A cycle with nothing new since the last: what a deep queue costs a daemon per tick.
    let t = Instant::now();
    let quiet = engine.decide(Timestamp(3_000_002));
    println!(
        "quiet cycle (no event since): {:.1} ms over {} pending",
        t.elapsed().as_secs_f64() * 1e3,
        count(&quiet, "defer")
    );
    // What a caller of `decide` that shows every reason does with them: the words of each.
    let t = Instant::now();
    let words: usize = quiet.iter().map(|d| engine.render_reason(d).len()).sum();
    println!(
        "the words of every decision of that cycle: {:.1} ms ({} decisions, {words} bytes)",
        t.elapsed().as_secs_f64() * 1e3,
        quiet.len()
    );
    // A policy in shadow: each daemon cycle also takes the live work over into the candidate
    // (here the same policy) and decides there.
    let t = Instant::now();
    let mut shadow =
        engine.shadow_of(&cluster(nodes), &policy(nodes, defrag), true).expect("shadow take-over");
    let take_over_s = t.elapsed().as_secs_f64();
    let shadow_decisions = shadow.decide(Timestamp(3_000_002));
    println!(
        "shadow cycle: {:.1} ms ({:.1} ms of it the take-over), {} decisions",
        t.elapsed().as_secs_f64() * 1e3,
        take_over_s * 1e3,
        shadow_decisions.len()
    );
    if let Some(id) = churn.iter().find(|d| d.action() == "defer").map(Decision::workload) {
        let t = Instant::now();
        let e = engine.explain(Timestamp(3_000_002), id);
        println!(
            "explain one deferred workload: {:.1} ms ({} counterfactuals)",
            t.elapsed().as_secs_f64() * 1e3,
            e.map_or(0, |e| e.counterfactuals.len())
        );
    }
    let running: Vec<_> = first
        .iter()
        .chain(&churn)
        .filter_map(
            |d| if let Decision::Admit { workload, .. } = d { Some(*workload) } else { None },
        )
        .collect();
    daemon_life(&mut engine, &mut rng, running, workloads as u64, ticks);
    engine.audit().unwrap();
    if let Some(mib) = peak_rss_mib() {
        println!("peak RSS so far: {mib} MiB");
    }
}

/// `ticks` daemon cycles on the engine's queue (see the module's documentation).
fn daemon_life(
    engine: &mut Engine,
    rng: &mut Rng,
    mut running: Vec<allot_core::WorkloadId>,
    last_id: u64,
    ticks: usize,
) {
    if ticks == 0 {
        return;
    }
    let mut next_id = last_id + 1_000_000;
    let mut cycle_ms = Vec::with_capacity(ticks);
    let (mut probe_admitted, mut probe_victims) = (0, 0);
    let mut reported = Vec::with_capacity(ticks);
    for tick in 0..ticks {
        let now = 4_000_000 + tick as u64 * 1_000;
        for _ in 0..10.min(running.len()) {
            let w = running.swap_remove(rng.below(running.len() as u64) as usize);
            engine.apply(Timestamp(now), Event::WorkloadFinished { workload: w });
        }
        for _ in 0..10 {
            next_id += 1;
            engine.apply(Timestamp(now), Event::WorkloadSubmitted(workload(rng, next_id)));
        }
        next_id += 1;
        let probe_id = next_id;
        let mut probe = WorkloadSpec::new(probe_id, "probe", PROBE_PROJECT, GpuRequest::Whole(1));
        probe.priority_class = Some("high".into());
        engine.apply(Timestamp(now), Event::WorkloadSubmitted(probe));
        let mut victims_for_probe = false;
        let t = Instant::now();
        let decisions = engine.decide_news(Timestamp(now + 1), Refresh::default());
        cycle_ms.push(t.elapsed().as_secs_f64() * 1e3);
        reported.push(count(&decisions, "defer"));
        for d in &decisions {
            match d {
                Decision::Admit { workload, .. } => {
                    let started = Event::AllocationStarted { workload: *workload };
                    engine.apply(Timestamp(now + 2), started);
                    if workload.0 == probe_id {
                        // It ends at once: the probe project stays within its guarantee.
                        probe_admitted += 1;
                        let finished = Event::WorkloadFinished { workload: *workload };
                        engine.apply(Timestamp(now + 3), finished);
                    } else {
                        running.push(*workload);
                    }
                }
                Decision::Preempt { victim, .. } | Decision::Stop { workload: victim, .. } => {
                    if matches!(d, Decision::Preempt { for_workload, .. } if for_workload.0 == probe_id)
                    {
                        victims_for_probe = true;
                    }
                    running.retain(|w| w != victim);
                    engine.apply(Timestamp(now + 2), Event::WorkloadStopped { workload: *victim });
                }
                _ => {}
            }
        }
        probe_victims += usize::from(victims_for_probe);
    }
    reported.sort_unstable();
    let mut sorted = cycle_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    println!(
        "daemon life, {ticks} cycles (10 finish, 10 + 1 probe arrive before each): p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms; probes admitted in the next cycle {probe_admitted}, \
         victims chosen for one {probe_victims}, of {ticks}; deferrals reported a cycle: p50 {}, \
         max {}",
        at(0.5),
        at(0.99),
        sorted[sorted.len() - 1],
        reported[reported.len() / 2],
        reported[reported.len() - 1],
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let quick = args.iter().any(|a| a == "--quick");
    let nodes = opt("--nodes", if quick { 500 } else { 5_000 });
    let workloads = opt("--workloads", if quick { 5_000 } else { 50_000 });
    let seed = opt("--seed", 42) as u64;
    let defrag = args.iter().any(|a| a == "--defrag");
    let ticks = opt("--ticks", if quick { 20 } else { 200 });
    run(nodes, workloads, seed, defrag, ticks);
    if !quick && !args.iter().any(|a| a == "--workloads") {
        run(nodes, 100_000, seed, defrag, ticks);
    }
}
