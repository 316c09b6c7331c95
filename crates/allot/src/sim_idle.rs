//! `allot sim idle`: the idle-reclaim experiment — AMD Resource Manager's, Run:ai's and
//! allot's idle rules on the same seeded workload over the Philly machine list
//! (`docs/design/idle-experiment.md`).

use std::path::PathBuf;

use allot_core::PolicySpec;
use allot_sim::BadRows;
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
