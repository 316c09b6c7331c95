//! `allot sim replay`: load a job trace, a cluster and one or more policies, replay the trace
//! through the engine under each policy, print the reports side by side.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use allot_core::{NodeSpec, PolicySpec};
use allot_sim::charts;
use allot_sim::progress::Progress;
use allot_sim::replay::{ReplayConfig, add_unlisted_projects, replay_with_progress};
use allot_sim::trace::{
    TraceJob, VirtualCluster, load_allot_trace, load_philly_jobs, load_philly_machines,
    load_philly_vcs, philly_nodes,
};
use allot_sim::{BadRows, report};
use anyhow::Result;

use crate::InvalidInput;
use crate::sim::trace_error;

/// Another scheduler's model, replayed on the same trace as an extra column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Baseline {
    /// Plain Slurm: FIFO priority, `sched/backfill` with a reservation for every blocked job,
    /// time limits = duration rounded up to minutes + 1 minute, no quotas, no pre-emption
    /// (`allot_sim::slurm`).
    SlurmBackfill,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReplayOutput {
    Text,
    Json,
    Csv,
}

/// The command's arguments, boxed: the sub-command enum stays small whatever it grows to.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    options: Box<ReplayOptions>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReplayOptions {
    /// Philly job list (`timestamp,duration,num_gpus,gpu_time,cluster`).
    #[arg(long, conflicts_with = "trace", required_unless_present = "trace")]
    jobs: Option<PathBuf>,
    /// A trace in the allot trace format, CSV or JSON lines (docs/design/trace-format.md).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Philly machine list (`machineId, number of GPUs, single GPU mem`).
    #[arg(long, conflicts_with = "cluster", required_unless_present = "cluster")]
    machines: Option<PathBuf>,
    /// A cluster YAML file, instead of `--machines`.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Philly VC sizes (`vc,node num`): every listed VC must be a project of each policy.
    #[arg(long)]
    vcs: Option<PathBuf>,
    /// Policy YAML; repeat to compare several policies side by side.
    #[arg(long, required = true)]
    policy: Vec<PathBuf>,
    /// Seed of the activity model and kind assignment.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Stop at this virtual time (seconds since the first job); later work counts as pending.
    #[arg(long)]
    until: Option<f64>,
    /// Replay only the first N jobs of the trace.
    #[arg(long)]
    limit_jobs: Option<usize>,
    /// Offered-load multiplier: submit times are divided by this factor (durations kept), so
    /// `--load 6` asks what the same jobs do when they arrive six times as fast — how queues,
    /// borrowing and pre-emption behave as the cluster gets busier.
    #[arg(long, default_value_t = 1.0)]
    load: f64,
    /// Skip malformed trace rows (counted in the report) instead of stopping at the first.
    #[arg(long)]
    skip_bad_rows: bool,
    /// Refuse jobs whose project (VC) the policy does not name, instead of adding a project
    /// with no guarantee for it.
    #[arg(long)]
    strict_vcs: bool,
    /// Put every job in this one project, whatever its trace says (its VC): one queue, as a
    /// plain Slurm partition has with FIFO priority and no accounts' limits. Every policy must
    /// name the project; `--vcs` and `--strict-vcs` do not apply.
    #[arg(long, value_name = "PROJECT", conflicts_with_all = ["vcs", "strict_vcs"])]
    one_queue: Option<String>,
    /// Seconds of virtual time between scheduling cycles; 0 (default): a cycle at every
    /// instant where something happened that can change the engine's answer.
    #[arg(long, default_value_t = 0.0)]
    decide_every: f64,
    /// Checkpoint interval (seconds) for training and batch jobs whose trace gives none;
    /// without it they do not checkpoint.
    #[arg(long)]
    checkpoint_every: Option<f64>,
    /// Seconds a pre-empted job needs to restart (allocated, counted as lost).
    #[arg(long, default_value_t = 60.0)]
    restart_delay: f64,
    /// Give every job a max runtime, as a Slurm user gives a time limit: its duration rounded
    /// up to whole minutes, plus one minute (what `scripts/bench-slurm-vs-allot.py` asks of
    /// Slurm). Reservations let only work with a max runtime backfill.
    #[arg(long)]
    time_limits: bool,
    /// Also replay the trace under another scheduler's model and show it as a column after
    /// the policies: `slurm-backfill` is plain Slurm (FIFO + backfill with reservations).
    #[arg(long, value_enum, value_name = "SCHEDULER")]
    compare_with: Option<Baseline>,
    /// Slurm's `bf_max_job_test` for `--compare-with slurm-backfill`: jobs one backfill pass
    /// tests. Raising it (and `--bf-window`, or `--bf-interval 0`) slows the model on deep
    /// queues: Philly at `--load 6` with all three unbounded took 272 s instead of 8 s.
    #[arg(long, requires = "compare_with", default_value_t = 500, value_name = "JOBS")]
    bf_max_job_test: usize,
    /// Slurm's `bf_window`, minutes: how far ahead a backfill reservation may start.
    #[arg(long, requires = "compare_with", default_value_t = 1440.0, value_name = "MINUTES")]
    bf_window: f64,
    /// Slurm's `bf_interval`, seconds between backfill passes; 0: a pass at every arrival
    /// and end.
    #[arg(long, requires = "compare_with", default_value_t = 30.0, value_name = "SECONDS")]
    bf_interval: f64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReplayOutput::Text)]
    output: ReplayOutput,
    /// Also write charts (allocation over time, queue-delay CDF, goodput per project) here.
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Report `wall_ms` as 0 so that the whole output is byte-identical between runs.
    #[arg(long)]
    no_timing: bool,
    /// Rehearse a scoped rollout of this candidate policy on the trace: replayed once under
    /// the active `--policy` alone and once with the candidate's rules for `--scope` from
    /// `--rehearse-at`, its `--rollback-if` conditions judged as the daemon judges them.
    #[arg(long, requires = "scope", value_name = "CANDIDATE")]
    rehearse: Option<PathBuf>,
    /// The rollout's scope: `project=NAME`, `pool=MODEL` or `kind=KIND`.
    #[arg(long, requires = "rehearse")]
    scope: Option<String>,
    /// Virtual time the rollout starts (a duration after the first job, e.g. 12h).
    #[arg(long, requires = "rehearse", default_value = "0s", value_name = "DURATION")]
    rehearse_at: String,
    /// A rollback condition (repeatable): `METRIC>LIMIT` or `METRIC>FACTORx`.
    #[arg(long = "rollback-if", requires = "rehearse", value_name = "CONDITION")]
    rollback_if: Vec<String>,
    /// The window before the rollout its figures are compared with.
    #[arg(long, requires = "rehearse", default_value = "7d", value_name = "DURATION")]
    baseline: String,
    /// Observations a window needs before an average or percentile is judged.
    #[arg(long, requires = "rehearse", default_value_t = 5)]
    min_sample: u64,
    /// Virtual seconds between judgements of the conditions.
    #[arg(long, requires = "rehearse", default_value_t = 60.0)]
    check_every: f64,
}

fn positive(flag: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(InvalidInput(format!("{flag}: {value} is not a positive number of seconds\n")).into())
    }
}

pub(crate) fn run(args: &ReplayArgs) -> Result<String> {
    let args = &*args.options;
    if !(args.decide_every.is_finite() && args.decide_every >= 0.0) {
        return Err(InvalidInput("--decide-every: must be 0 or more seconds\n".into()).into());
    }
    if let Some(c) = args.checkpoint_every {
        positive("--checkpoint-every", c)?;
    }
    if let Some(u) = args.until {
        positive("--until", u)?;
    }
    if !(args.restart_delay.is_finite() && args.restart_delay >= 0.0) {
        return Err(InvalidInput("--restart-delay: must be 0 or more seconds\n".into()).into());
    }
    let bad_rows = if args.skip_bad_rows { BadRows::Skip } else { BadRows::Fail };
    let slurm = match args.compare_with {
        Some(Baseline::SlurmBackfill) => Some(slurm_backfill(args)?),
        None => None,
    };

    let nodes = load_nodes(args, bad_rows)?;
    let gpus_per_node_max = nodes.iter().map(|n| n.devices.len() as u32).max().unwrap_or(0);
    let (mut jobs, skipped, jobs_file) = load_jobs(args, bad_rows, gpus_per_node_max)?;
    if let Some(n) = args.limit_jobs {
        jobs.truncate(n);
    }
    if let Some(project) = &args.one_queue {
        for job in &mut jobs {
            job.project.clone_from(project);
        }
    }
    if !(args.load.is_finite() && args.load > 0.0 && args.load <= 1000.0) {
        return Err(InvalidInput("--load: give a factor in (0, 1000], e.g. 4\n".into()).into());
    }
    if args.load != 1.0 {
        for job in &mut jobs {
            // Whole milliseconds, the engine's clock resolution.
            job.submit_s = (job.submit_s / args.load * 1000.0).round() / 1000.0;
        }
    }
    let vcs = args.vcs.as_deref().map(load_philly_vcs).transpose().map_err(trace_error)?;

    let mut policies = Vec::new();
    for path in &args.policy {
        let policy = allot_config::load_policy(path).map_err(|d| {
            let mut text = allot_config::render(&d);
            let _ = writeln!(text, "{} problem(s) found; nothing was changed.", d.len());
            anyhow::Error::from(InvalidInput(text))
        })?;
        check_projects(
            path,
            &policy,
            vcs.as_ref().zip(args.vcs.as_deref()),
            &jobs,
            &jobs_file,
            args.strict_vcs,
        )?;
        if let Some(project) = &args.one_queue
            && !policy.projects.iter().any(|p| &p.name == project)
        {
            return Err(InvalidInput(format!(
                "--one-queue: `{project}` is not a project in {} — name one of its projects, or \
                 add `{{name: {project}, quotas: [{{model: any, guaranteed: N}}]}}` to its \
                 projects\n",
                path.display()
            ))
            .into());
        }
        policies.push((path.clone(), policy));
    }

    let config = ReplayConfig {
        seed: args.seed,
        until_s: args.until,
        decide_every_s: args.decide_every,
        restart_delay_s: args.restart_delay,
        default_checkpoint_interval_s: args.checkpoint_every,
        time_limits: args.time_limits,
        ..ReplayConfig::default()
    };
    let mut labels = labels(&args.policy);
    let rehearsal = rehearsal(args, &policies, &jobs)?;
    if let Some((_, policy)) = &rehearsal {
        // The same active policy twice: alone, then with the rollout.
        let (path, _) = policies[0].clone();
        labels.push(format!("{} rehearsed", labels[0]));
        policies.push((path, policy.clone()));
    }
    let rehearsal = rehearsal.map(|(r, _)| r);
    let mut reports = Vec::with_capacity(policies.len());
    let progress = Progress::new((jobs.len() * policies.len()) as u64, "replaying jobs");
    for ((path, policy), label) in policies.iter().zip(labels) {
        let (policy, _added) = add_unlisted_projects(policy, &jobs);
        #[allow(clippy::disallowed_methods)] // the CLI measures wall time; the replay does not
        let started = std::time::Instant::now();
        let tick = || progress.inc(1);
        let rehearsed = label.ends_with(" rehearsed") && rehearsal.is_some();
        let config = ReplayConfig {
            rehearsal: if rehearsed { rehearsal.clone() } else { None },
            ..config.clone()
        };
        let mut report = replay_with_progress(&nodes, &policy, &label, &jobs, &config, &tick)
            .map_err(|e| anyhow::Error::from(InvalidInput(format!("{}: {e}\n", path.display()))))?;
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        report.bad_rows_skipped = skipped;
        reports.push(report);
    }
    progress.finish();
    if let Some(slurm) = &slurm {
        // The first policy's projects (with the trace's unlisted ones) label the ledger.
        let (policy, _added) = add_unlisted_projects(&policies[0].1, &jobs);
        #[allow(clippy::disallowed_methods)] // the CLI measures wall time; the replay does not
        let started = std::time::Instant::now();
        let mut report = allot_sim::slurm::replay_slurm(&nodes, &policy, &jobs, &config, slurm)
            .map_err(|e| anyhow::Error::from(InvalidInput(format!("--compare-with: {e}\n"))))?;
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        report.bad_rows_skipped = skipped;
        reports.push(report);
    }

    if let Some(dir) = &args.charts {
        crate::sim::charts_written(charts::write_replay_charts(dir, &reports))?;
    }
    Ok(match args.output {
        ReplayOutput::Text => report::replay_text(&reports),
        ReplayOutput::Json => report::replay_json(&reports),
        ReplayOutput::Csv => report::replay_csv(&reports),
    })
}

/// Slurm's backfill parameters from the `--bf-*` flags.
fn slurm_backfill(args: &ReplayOptions) -> Result<allot_sim::slurm::SlurmBackfill> {
    let bad = |text: &str| Err(InvalidInput(format!("{text}\n")).into());
    if args.bf_max_job_test == 0 {
        return bad("--bf-max-job-test: give at least 1 job (Slurm's default: 500)");
    }
    if !(args.bf_window.is_finite() && args.bf_window > 0.0) {
        return bad("--bf-window: give a positive number of minutes (Slurm's default: 1440)");
    }
    if !(args.bf_interval.is_finite() && args.bf_interval >= 0.0) {
        return bad("--bf-interval: give 0 or more seconds (Slurm's default: 30)");
    }
    Ok(allot_sim::slurm::SlurmBackfill {
        jobs_tested_max: args.bf_max_job_test,
        window_s: args.bf_window * 60.0,
        interval_s: args.bf_interval,
    })
}

/// The rollout `--rehearse` asks for, and the active policy to run it on (the one `--policy`,
/// with the trace's unlisted projects added as the replay adds them).
fn rehearsal(
    args: &ReplayOptions,
    policies: &[(PathBuf, PolicySpec)],
    jobs: &[TraceJob],
) -> Result<Option<(allot_sim::replay::Rehearsal, PolicySpec)>> {
    let (Some(candidate_path), Some(scope)) = (&args.rehearse, &args.scope) else {
        return Ok(None);
    };
    let bad = |text: String| anyhow::Error::from(InvalidInput(text));
    if policies.len() != 1 {
        return Err(bad("--rehearse: give exactly one --policy, the active one\n".into()));
    }
    let candidate = allot_config::load_policy(candidate_path).map_err(|d| {
        bad(format!("{}{} problem(s) found; nothing was run.\n", allot_config::render(&d), d.len()))
    })?;
    let (active, _) = add_unlisted_projects(&policies[0].1, jobs);
    let (candidate, _) = add_unlisted_projects(&candidate, jobs);
    let scope = allot_config::Scope::parse(scope).map_err(|e| bad(format!("--scope: {e}\n")))?;
    let scoped = allot_config::scoped_policy(&active, &candidate, &scope)
        .map_err(|e| bad(format!("--rehearse {}: {e}\n", candidate_path.display())))?;
    let conditions = args
        .rollback_if
        .iter()
        .map(|c| allot_config::rollout::Condition::parse(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("--rollback-if: {e}\n")))?;
    let duration = |flag: &str, text: &str| {
        allot_config::duration_ms(text).map_err(|e| bad(format!("{flag}: {e}\n")))
    };
    positive("--check-every", args.check_every)?;
    let rules = allot_config::rollout::RollbackRules {
        conditions,
        baseline_ms: duration("--baseline", &args.baseline)?,
        false_reclaim_within_ms: 30 * 60_000,
        min_sample: args.min_sample,
    };
    let rehearsal = allot_sim::replay::Rehearsal {
        at_s: duration("--rehearse-at", &args.rehearse_at)? as f64 / 1000.0,
        policy: scoped.policy,
        scope,
        rules,
        check_every_s: args.check_every,
    };
    Ok(Some((rehearsal, active)))
}

fn load_nodes(args: &ReplayOptions, bad_rows: BadRows) -> Result<Vec<NodeSpec>> {
    if let Some(path) = &args.machines {
        let (machines, _skipped) = load_philly_machines(path, bad_rows).map_err(trace_error)?;
        return Ok(philly_nodes(&machines));
    }
    let Some(path) = &args.cluster else {
        return Err(InvalidInput("give --machines FILE or --cluster FILE\n".into()).into());
    };
    allot_config::load_cluster(path).map_err(|d| {
        let mut text = allot_config::render(&d);
        let _ = writeln!(text, "{} problem(s) found; nothing was changed.", d.len());
        InvalidInput(text).into()
    })
}

fn load_jobs(
    args: &ReplayOptions,
    bad_rows: BadRows,
    gpus_per_node_max: u32,
) -> Result<(Vec<TraceJob>, usize, PathBuf)> {
    if let Some(path) = &args.jobs {
        let philly = load_philly_jobs(path, bad_rows).map_err(trace_error)?;
        let jobs = philly
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| j.to_trace_job(i as u64 + 1, gpus_per_node_max))
            .collect();
        return Ok((jobs, philly.skipped.count, path.clone()));
    }
    let Some(path) = &args.trace else {
        return Err(InvalidInput("give --jobs FILE (Philly) or --trace FILE\n".into()).into());
    };
    let trace = load_allot_trace(path, bad_rows).map_err(trace_error)?;
    Ok((trace.jobs, trace.skipped.count, path.clone()))
}

/// Every VC listed in the VC file must be a project of the policy (its guarantee lives
/// there); with `strict`, every project a job names must be too.
fn check_projects(
    policy_file: &Path,
    policy: &PolicySpec,
    vcs: Option<(&Vec<VirtualCluster>, &Path)>,
    jobs: &[TraceJob],
    jobs_file: &Path,
    strict: bool,
) -> Result<()> {
    let names: BTreeSet<&str> = policy.projects.iter().map(|p| p.name.as_str()).collect();
    if let Some((vcs, vc_file)) = vcs {
        for vc in vcs {
            if !names.contains(vc.name.as_str()) {
                return Err(InvalidInput(format!(
                    "{}:{}: vc: `{}` has no project in {} — add a project named {} with its \
                     guarantee (see examples/philly-policy.yaml)\n",
                    vc_file.display(),
                    vc.line,
                    vc.name,
                    policy_file.display(),
                    vc.name
                ))
                .into());
            }
        }
    }
    if strict && let Some(job) = jobs.iter().find(|j| !names.contains(j.project.as_str())) {
        return Err(InvalidInput(format!(
            "{}:{}: project: `{}` is not a project in {} — add it to the policy, or drop \
             --strict-vcs to give it a project with no guarantee\n",
            jobs_file.display(),
            job.line,
            job.project,
            policy_file.display()
        ))
        .into());
    }
    Ok(())
}

/// Each policy's label: its file stem, or its whole path where stems repeat.
fn labels(paths: &[PathBuf]) -> Vec<String> {
    let stem = |p: &PathBuf| {
        p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned())
    };
    paths
        .iter()
        .map(|p| {
            let s = stem(p);
            if paths.iter().filter(|q| stem(q) == s).count() > 1 {
                p.display().to_string()
            } else {
                s
            }
        })
        .collect()
}
