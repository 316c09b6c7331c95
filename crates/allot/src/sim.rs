//! `allot sim …`: the simulator's commands.

use clap::Subcommand;

use allot_sim::TraceError;

use crate::{InvalidInput, sim_idle, sim_pack, sim_replay};

#[derive(Debug, Subcommand)]
pub(crate) enum SimCommand {
    /// The FGD packing experiment (ATC'23): pods arrive and never leave, the trace is inflated
    /// with seeded copies of its own pods, metrics at every 1 % of arrived GPU demand.
    Pack(sim_pack::PackArgs),
    /// Time-based replay of a job trace through the engine: quotas, priorities, pre-emption
    /// with its real costs, and the activity model; several policies side by side.
    Replay(sim_replay::ReplayArgs),
    /// The packing experiment on every shared openb pod list that has the FGD authors'
    /// published results: ours vs theirs at 130 % arrived demand, per placement policy.
    FgdCompare(sim_pack::CompareArgs),
    /// The idle-reclaim experiment: AMD Resource Manager's, Run:ai's and allot's idle rules
    /// on the same seeded workload and telemetry over the Philly machine list.
    Idle(sim_idle::IdleArgs),
}

pub(crate) fn run(command: SimCommand) -> anyhow::Result<String> {
    match command {
        SimCommand::Pack(args) => sim_pack::run(&args),
        SimCommand::Replay(args) => sim_replay::run(&args),
        SimCommand::FgdCompare(args) => sim_pack::compare(&args),
        SimCommand::Idle(args) => sim_idle::run(&args),
    }
}

/// What `--charts` made of its directory: without a TrueType font the SVGs are written and the
/// missing PNGs are a warning; any other failure is the flag's error.
pub(crate) fn charts_written(
    result: Result<Vec<std::path::PathBuf>, allot_sim::charts::ChartError>,
) -> anyhow::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(allot_sim::charts::ChartError::NoFont { written, .. }) => {
            crate::print_err(&format!(
                "warning: {} SVG chart(s) written, no PNG: no TrueType font found (install \
                 fonts-dejavu-core)\n",
                written.len()
            ));
            Ok(())
        }
        Err(e) => Err(InvalidInput(format!("--charts: {e}\n")).into()),
    }
}

/// A trace file the user gave is wrong: exit 1 with file, line, field and fix.
pub(crate) fn trace_error(e: TraceError) -> anyhow::Error {
    InvalidInput(format!("{e}\nnothing was run.\n")).into()
}
