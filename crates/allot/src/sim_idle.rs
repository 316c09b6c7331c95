//! `allot sim idle`: the idle-reclaim experiment — AMD Resource Manager's, Run:ai's and
//! allot's idle rules on the same seeded workload over the Philly machine list, or with
//! `--trace genai:DIR` on the real telemetry of Alibaba's GenAI serving trace
//! (`docs/design/idle-experiment.md`).

use std::path::PathBuf;

use allot_core::PolicySpec;
use allot_sim::BadRows;
use allot_sim::idle::genai::{
    COLD_START_MAX_S, GenaiConfig, genai_json, genai_text, run_genai_experiment, write_genai_chart,
};
use allot_sim::idle::{HOURS_MAX, IdleSimConfig, IdleSimError, idle_json, idle_text};
use allot_sim::trace::{load_philly_machines, philly_nodes};
use anyhow::Result;

use crate::{InvalidInput, Output};

/// The compared policies, as shipped in `examples/idle/` (embedded): label, file, text.
pub(crate) const EMBEDDED_POLICIES: [(&str, &str, &str); 3] = [
    (
        "amd_rm",
        "examples/idle/amd_rm.yaml (embedded)",
        include_str!("../../../examples/idle/amd_rm.yaml"),
    ),
    (
        "runai",
        "examples/idle/runai.yaml (embedded)",
        include_str!("../../../examples/idle/runai.yaml"),
    ),
    (
        "allot",
        "examples/idle/allot.yaml (embedded)",
        include_str!("../../../examples/idle/allot.yaml"),
    ),
];

/// The Philly machine list, relative to the directory `allot` runs in (the repository root).
pub(crate) const DEFAULT_MACHINES: &str = "../shared/traces/philly-machines/cluster_machine_list";

#[derive(Debug, clap::Args)]
pub(crate) struct IdleArgs {
    /// Seed of the workload, the activity model, the telemetry and the exporter outages.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Horizon, hours.
    #[arg(long, default_value_t = 48.0)]
    hours: f64,
    /// Philly machine list (`machineId, number of GPUs, single GPU mem`).
    #[arg(long, default_value = DEFAULT_MACHINES)]
    machines: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Report `wall_ms` as 0 so that the whole output is byte-identical between runs.
    #[arg(long)]
    no_timing: bool,
    /// A policy file to compare, labelled by its file name without `.yaml`; repeat for
    /// several. Default: `examples/idle/{amd_rm,runai,allot}.yaml` (embedded). The goal is
    /// computed when policies labelled `allot` and `amd_rm` are among them.
    #[arg(long)]
    policy: Vec<PathBuf>,
    /// Real telemetry instead of the activity model: `genai:DIR`, the folder of Alibaba's
    /// GenAI serving trace 2026 (its four files, upstream names and columns). Each container is
    /// an inference endpoint holding one GPU; `--seed`, `--hours` and `--machines` do not apply.
    #[arg(long, value_name = "genai:DIR")]
    trace: Option<String>,
    /// With --trace: a reclaimed endpoint's cold start when it is needed again (seconds, or
    /// with a unit: `90s`, `2m`); requests arriving meanwhile are delayed.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    cold_start: String,
    /// With --trace: also run every policy with its endpoint rule's timer at 5 … 120 min
    /// (AMD's from its 15-minute minimum) and judge goal 2.
    #[arg(long)]
    sweep: bool,
    /// With --trace --sweep: write the trade-off chart (reclaimed GPU-hours against delayed
    /// requests per policy) here as genai_tradeoff.svg and .png.
    #[arg(long, requires = "sweep", value_name = "DIR")]
    charts: Option<PathBuf>,
}

/// `90`, `90s`, `2m`, `1h` as seconds.
fn duration_s(flag: &str, text: &str) -> Result<f64> {
    let t = text.trim();
    let (number, unit) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1.0),
        Some((i, 'm')) => (&t[..i], 60.0),
        Some((i, 'h')) => (&t[..i], 3600.0),
        _ => (t, 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * unit <= COLD_START_MAX_S => Ok(v * unit),
        _ => Err(InvalidInput(format!(
            "{flag}: '{text}' is not a duration in [0, {COLD_START_MAX_S} s]; write seconds \
             (60, 60s) or minutes (2m)\n"
        ))
        .into()),
    }
}

/// The policies to compare: the files given, or the embedded examples.
fn policies(files: &[PathBuf]) -> Result<Vec<(String, PolicySpec)>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    if files.is_empty() {
        for (label, file, text) in EMBEDDED_POLICIES {
            match allot_config::parse_policy(file, text) {
                Ok(p) => out.push((label.to_owned(), p)),
                Err(d) => problems.extend(d),
            }
        }
    }
    for file in files {
        let label = file
            .file_stem()
            .map_or_else(|| file.display().to_string(), |s| s.to_string_lossy().into_owned());
        match allot_config::load_policy(file) {
            Ok(p) => out.push((label, p)),
            Err(d) => problems.extend(d),
        }
    }
    if !problems.is_empty() {
        return Err(crate::plan::invalid(&problems));
    }
    Ok(out)
}

pub(crate) fn run(args: &IdleArgs) -> Result<String> {
    if let Some(trace) = &args.trace {
        return run_genai(args, trace);
    }
    if args.sweep {
        return Err(InvalidInput(
            "--sweep: the timer sweep runs on real telemetry only; add --trace genai:DIR\n".into(),
        )
        .into());
    }
    if !(args.hours.is_finite() && args.hours > 0.0 && args.hours <= HOURS_MAX) {
        return Err(InvalidInput(format!(
            "--hours: {} is not a number of hours in (0, {HOURS_MAX}]\n",
            args.hours
        ))
        .into());
    }
    if !args.machines.is_file() {
        return Err(InvalidInput(format!(
            "{}: no such file: the Philly machine list (cluster_machine_list) is needed; run \
             from the repository root with the shared traces next to it, or give its path with \
             --machines PATH\n",
            args.machines.display()
        ))
        .into());
    }
    let (machines, _) =
        load_philly_machines(&args.machines, BadRows::Fail).map_err(crate::sim::trace_error)?;
    let nodes = philly_nodes(&machines);
    let config = IdleSimConfig { seed: args.seed, hours: args.hours, ..IdleSimConfig::default() };
    #[allow(clippy::disallowed_methods)] // the CLI measures wall time; the simulation does not
    let origin = std::time::Instant::now();
    let no_timing = args.no_timing;
    let now_ms = move || {
        if no_timing { 0 } else { u64::try_from(origin.elapsed().as_millis()).unwrap_or(0) }
    };
    let policies = policies(&args.policy)?;
    let report = allot_sim::idle::run_idle_experiment(&nodes, &policies, &config, &now_ms)
        .map_err(|e| match e {
            // A broken engine invariant is allot's bug (exit 3), not the user's input.
            IdleSimError::Invariant { .. } => anyhow::anyhow!("{e}"),
            IdleSimError::Config { .. } | IdleSimError::Input(_) => {
                InvalidInput(format!("{e}\n")).into()
            }
        })?;
    Ok(match args.output {
        Output::Text => idle_text(&report),
        Output::Json => idle_json(&report),
    })
}

/// The clock for `wall_ms`, or 0 with `--no-timing`.
fn wall_clock(no_timing: bool) -> impl Fn() -> u64 + Sync {
    #[allow(clippy::disallowed_methods)] // the CLI measures wall time; the simulation does not
    let origin = std::time::Instant::now();
    move || if no_timing { 0 } else { u64::try_from(origin.elapsed().as_millis()).unwrap_or(0) }
}

/// `--trace genai:DIR`: the policies on the GenAI trace's real telemetry.
fn run_genai(args: &IdleArgs, trace: &str) -> Result<String> {
    let Some(dir) = trace.strip_prefix("genai:") else {
        return Err(InvalidInput(format!(
            "--trace: '{trace}' is not a known trace; write genai:DIR (the folder of Alibaba's \
             GenAI serving trace, e.g. genai:../shared/traces/alibaba-genai-2026)\n"
        ))
        .into());
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        return Err(InvalidInput(format!(
            "--trace: {}: no such folder; give the folder that holds the GenTD26 files \
             (genai:../shared/traces/alibaba-genai-2026 from the repository root)\n",
            dir.display()
        ))
        .into());
    }
    let cold_start_s = duration_s("--cold-start", &args.cold_start)?;
    let trace =
        allot_sim::genai::load_genai(&dir, BadRows::Fail).map_err(crate::sim::trace_error)?;
    let config = GenaiConfig { cold_start_s, ..GenaiConfig::default() };
    let policies = policies(&args.policy)?;
    let now_ms = wall_clock(args.no_timing);
    let report = run_genai_experiment(&trace, &policies, &config, args.sweep, &now_ms).map_err(
        |e| match e {
            IdleSimError::Invariant { .. } => anyhow::anyhow!("{e}"),
            IdleSimError::Config { .. } | IdleSimError::Input(_) => {
                InvalidInput(format!("{e}\n")).into()
            }
        },
    )?;
    if let Some(dir) = &args.charts {
        crate::sim::charts_written(write_genai_chart(dir, &report))?;
    }
    Ok(match args.output {
        Output::Text => genai_text(&report),
        Output::Json => genai_json(&report),
    })
}
