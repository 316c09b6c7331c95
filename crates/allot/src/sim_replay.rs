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
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReplayOutput::Text)]
    output: ReplayOutput,
    /// Also write charts (allocation over time, queue-delay CDF, goodput per project) here.
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Report `wall_ms` as 0 so that the whole output is byte-identical between runs.
    #[arg(long)]
    no_timing: bool,
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

    let nodes = load_nodes(args, bad_rows)?;
    let gpus_per_node_max = nodes.iter().map(|n| n.devices.len() as u32).max().unwrap_or(0);
    let (mut jobs, skipped, jobs_file) = load_jobs(args, bad_rows, gpus_per_node_max)?;
    if let Some(n) = args.limit_jobs {
        jobs.truncate(n);
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
        policies.push((path.clone(), policy));
    }

    let config = ReplayConfig {
        seed: args.seed,
        until_s: args.until,
        decide_every_s: args.decide_every,
        restart_delay_s: args.restart_delay,
        default_checkpoint_interval_s: args.checkpoint_every,
        ..ReplayConfig::default()
    };
    let labels = labels(&args.policy);
    let mut reports = Vec::with_capacity(policies.len());
    let progress = Progress::new((jobs.len() * policies.len()) as u64, "replaying jobs");
    for ((path, policy), label) in policies.iter().zip(labels) {
        let (policy, _added) = add_unlisted_projects(policy, &jobs);
        #[allow(clippy::disallowed_methods)] // the CLI measures wall time; the replay does not
        let started = std::time::Instant::now();
        let tick = || progress.inc(1);
        let mut report = replay_with_progress(&nodes, &policy, &label, &jobs, &config, &tick)
            .map_err(|e| anyhow::Error::from(InvalidInput(format!("{}: {e}\n", path.display()))))?;
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        report.bad_rows_skipped = skipped;
        reports.push(report);
    }
    progress.finish();

    if let Some(dir) = &args.charts {
        crate::sim::charts_written(charts::write_replay_charts(dir, &reports))?;
    }
    Ok(match args.output {
        ReplayOutput::Text => report::replay_text(&reports),
        ReplayOutput::Json => report::replay_json(&reports),
        ReplayOutput::Csv => report::replay_csv(&reports),
    })
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
