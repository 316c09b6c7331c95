//! The `allot` command line: definitions and glue over the library crates.
//!
//! Exit codes: 0 success; 1 the input is invalid (every problem printed, nothing changed);
//! 2 the command line itself is wrong (clap's usage error); 3 an internal error.

mod plan;
mod sim;
mod sim_idle;
mod sim_pack;
mod sim_replay;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// GPU capacity orchestrator: quotas, borrowing, pre-emption and explanations for shared GPUs.
#[derive(Debug, Parser)]
#[command(name = "allot", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check policy files before they apply.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Run the engine once on a cluster, a policy and a list of workloads submitted at t=0,
    /// to a fixed point, and print every decision with its reason. Without files, runs on
    /// the embedded examples.
    Plan(PlanArgs),
    /// What-if simulation on real cluster traces: the FGD packing experiment and time-based
    /// replay with quotas, pre-emption and an activity model.
    Sim {
        #[command(subcommand)]
        command: sim::SimCommand,
    },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Report every error in a policy file at once (file, line, field, fix); exit 1 if any.
    Validate {
        /// The policy YAML file.
        file: PathBuf,
        /// Also check the policy against this cluster file (GPU models, capacity).
        #[arg(long)]
        cluster: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct PlanArgs {
    /// Cluster inventory YAML (default: the embedded examples/cluster.yaml).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Policy YAML (default: the embedded examples/policy.yaml).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Workloads as YAML or JSON lines (default: the embedded examples/workloads.yaml).
    #[arg(long)]
    workloads: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Also explain every workload still pending at the end (`why`).
    #[arg(long)]
    explain: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    Text,
    Json,
}

/// An error that is the user's input, already rendered: exit 1.
#[derive(Debug)]
pub(crate) struct InvalidInput(pub String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Policy { command: PolicyCommand::Validate { file, cluster } } => {
            plan::validate(&file, cluster.as_deref())
        }
        Command::Plan(args) => plan::plan(&args),
        Command::Sim { command } => sim::run(command),
    };
    match result {
        Ok(text) => {
            print_out(&text);
            ExitCode::SUCCESS
        }
        Err(e) => match e.downcast::<InvalidInput>() {
            Ok(InvalidInput(text)) => {
                print_err(&text);
                ExitCode::from(1)
            }
            Err(e) => {
                print_err(&format!("error: {e:#}\n"));
                ExitCode::from(3)
            }
        },
    }
}

#[allow(clippy::print_stdout)]
fn print_out(text: &str) {
    print!("{text}");
}

#[allow(clippy::print_stderr)]
pub(crate) fn print_err(text: &str) {
    eprint!("{text}");
}

impl std::fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidInput {}
