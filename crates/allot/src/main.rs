//! The `allot` command line: definitions and glue over the library crates.
//!
//! Exit codes are listed in [`EXIT_CODES`] (shown by `allot --help`); every failure path maps to
//! one of them through [`Failure`] or [`InvalidInput`].

mod agent;
mod client;
mod daemon;
mod diff;
mod history;
mod plan;
mod remote;
mod render;
mod sim;
mod sim_idle;
mod sim_pack;
mod sim_replay;
mod slurm;
mod submit;
mod telemetry;
mod top;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

/// Shown at the end of `allot --help`; the README repeats it.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  invalid input: a bad local file, or the daemon refused the request (400, 409, 422)
  2  usage: the command line is wrong, or `top` has no terminal
  3  internal error (including the daemon's 5xx)
  4  not found (404: no such workload)
  5  not allowed (401/403: missing, wrong or insufficient token)
  6  the daemon is unreachable (connection refused or timed out)

Environment:
  ALLOT_URL      the daemon's address (default http://127.0.0.1:7380); --url overrides it
  ALLOT_TOKEN    the bearer token sent to the daemon; --token overrides it
  ALLOT_CA_CERT  PEM CA certificate to trust for an https:// daemon; --ca-cert overrides it
";

pub(crate) const EXIT_INVALID: u8 = 1;
pub(crate) const EXIT_USAGE: u8 = 2;
pub(crate) const EXIT_INTERNAL: u8 = 3;
pub(crate) const EXIT_NOT_FOUND: u8 = 4;
pub(crate) const EXIT_NOT_ALLOWED: u8 = 5;
pub(crate) const EXIT_UNREACHABLE: u8 = 6;

/// GPU capacity orchestrator: quotas, borrowing, pre-emption and explanations for shared GPUs.
#[derive(Debug, Parser)]
#[command(name = "allot", version, about, after_long_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where the daemon is and who is asking; used by every verb that talks to it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RemoteArgs {
    /// The daemon's base address (http:// or https://).
    #[arg(
        long,
        global = true,
        env = "ALLOT_URL",
        default_value = "http://127.0.0.1:7380",
        value_name = "URL"
    )]
    pub(crate) url: String,
    /// Bearer token for the daemon's API (`allot token create` makes one).
    #[arg(long, global = true, env = "ALLOT_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub(crate) token: Option<String>,
    /// PEM file of the certificate authority to trust for an https:// daemon with a private
    /// certificate (e.g. the `--tls-cert` it serves).
    #[arg(long, global = true, env = "ALLOT_CA_CERT", value_name = "FILE")]
    pub(crate) ca_cert: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: the scheduling loop, the REST API, /metrics and the dashboard.
    Serve(daemon::ServeArgs),
    /// Submit a workload: from a YAML or JSON file, or from flags and `-- COMMAND ARGS…`.
    /// Prints the new workload's id.
    Submit(submit::SubmitArgs),
    /// List workloads: ID NAME PROJECT STATE GPUS AGE REASON.
    Ls(remote::LsArgs),
    /// Explain why a workload waits, or why it was stopped.
    Why(remote::IdArgs),
    /// Cancel workloads (stops them if they run): `allot cancel 4 7 9`.
    Cancel(remote::ActArgs),
    /// Suspend workloads: stop each (checkpointing if it can) and keep it until `resume`.
    Suspend(remote::ActArgs),
    /// Queue suspended workloads again.
    Resume(remote::ActArgs),
    /// Print a workload's output (stdout and stderr of one member).
    Logs(remote::LogsArgs),
    /// Projects with their quotas and what they use.
    Projects(remote::OutputArgs),
    /// Nodes and devices, with the share of each device in use and by whom.
    Nodes(remote::OutputArgs),
    /// The goodput ledger: allocated, active, idle and lost GPU-hours per scope.
    Report(remote::OutputArgs),
    /// The daemon's history: its workloads as a job trace for `allot sim replay`.
    History {
        #[command(subcommand)]
        command: history::HistoryCommand,
    },
    /// Slurm: compare allot's ledger with Slurm's own job completion log.
    Slurm {
        #[command(subcommand)]
        command: slurm::SlurmCommand,
    },
    /// Policies: validate a file (offline or against the daemon), show or diff the active one.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// A live view of the cluster: device shares per node, running and pending work with the
    /// reasons. Refreshes every 2 s; q quits.
    Top,
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
    /// Node agent: collect GPU activity on this host and forward it to the daemon
    /// (`ALLOT_URL`, with an admin `ALLOT_TOKEN`), e.g. on every node of a Slurm cluster.
    Agent(agent::AgentArgs),
    /// GPU telemetry as allot reads it: parse captured exporter/smi output, or watch a live
    /// source (NVML, amdgpu sysfs, Prometheus) and classify devices and processes.
    Telemetry {
        #[command(subcommand)]
        command: telemetry::TelemetryCommand,
    },
    /// Print a shell completion script (e.g. `allot completions bash > /etc/bash_completion.d/allot`).
    Completions {
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the man page (roff) to stdout (e.g. `allot man > allot.1`).
    Man,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Report every error in a policy file at once (file, line, field, fix); exit 1 if any.
    Validate {
        /// The policy YAML file.
        file: PathBuf,
        /// Also check the policy against this cluster file (GPU models, capacity).
        #[arg(long, conflicts_with = "remote")]
        cluster: Option<PathBuf>,
        /// Validate against the running daemon's inventory instead (nothing is changed).
        #[arg(long)]
        remote: bool,
        /// Output format of the daemon's answer (with --remote).
        #[arg(long, value_enum, default_value_t = Output::Text, requires = "remote")]
        output: Output,
    },
    /// Move the daemon's live work to the policy in FILE (admins): running work keeps its GPUs,
    /// pending work its place; refused with every problem named (exit 1) if live work cannot
    /// move, and then nothing changes. Check first with `allot policy diff FILE`.
    Apply {
        /// The policy YAML file.
        file: PathBuf,
        /// Run it in shadow instead: beside the active policy, deciding over the same live
        /// work at every cycle, its decisions counted (`allot policy shadow`), never executed.
        #[arg(long, conflicts_with = "scope")]
        shadow: bool,
        #[command(flatten)]
        rollout: remote::RolloutArgs,
        #[command(flatten)]
        output: remote::OutputArgs,
    },
    /// The scoped rollout in effect (or the last one): its scope, what it carries, and each
    /// rollback condition's figure against its baseline.
    Rollout(remote::OutputArgs),
    /// Print the daemon's active policy (its YAML text), or an earlier version of it.
    Show(remote::PolicyShowArgs),
    /// What the policy in shadow would have done differently so far, per project (viewer or
    /// admin); `--stop` ends the shadow (admins) with its last report.
    Shadow {
        #[arg(long)]
        stop: bool,
        #[command(flatten)]
        output: remote::OutputArgs,
    },
    /// Every policy the daemon ran under: version, when, who applied it, from where, and the
    /// lines it changed from the version before.
    History(remote::OutputArgs),
    /// Bring back an earlier policy (admins) as a new version, with the same checks as
    /// `policy apply`: refused with every problem named (exit 1) if live work cannot move.
    Rollback {
        /// The version to bring back (default: the one before the active version).
        version: Option<u32>,
        #[command(flatten)]
        output: remote::OutputArgs,
    },
    /// Line diff between the daemon's active policy and FILE; exit 0 whether or not they differ.
    Diff {
        /// The policy YAML file to compare with the active one.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token. With --data-dir: offline, straight into the daemon's store (works while
    /// it runs; for the first tokens). Without: through the API, as an admin token.
    Create(daemon::TokenCreateArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
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

/// A failure with its exit code and the text to print on stderr (already rendered).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let remote = cli.remote;
    let result = match cli.command {
        Command::Serve(args) => daemon::serve(args),
        Command::Submit(args) => submit::run(&remote, args),
        Command::Ls(args) => remote::ls(&remote, &args),
        Command::Why(args) => remote::why(&remote, &args),
        Command::Cancel(args) => remote::act(&remote, &args, "cancel"),
        Command::Suspend(args) => remote::act(&remote, &args, "suspend"),
        Command::Resume(args) => remote::act(&remote, &args, "resume"),
        Command::Logs(args) => remote::logs(&remote, &args),
        Command::Projects(args) => remote::projects(&remote, args.output),
        Command::Nodes(args) => remote::nodes(&remote, args.output),
        Command::Report(args) => remote::report(&remote, args.output),
        Command::History { command } => history::run(&remote, &command),
        Command::Slurm { command } => slurm::run(&remote, &command),
        Command::Policy { command } => match command {
            PolicyCommand::Validate { file, cluster: _, remote: true, output } => {
                remote::policy_validate(&remote, &file, output)
            }
            PolicyCommand::Validate { file, cluster, remote: false, output: _ } => {
                plan::validate(&file, cluster.as_deref())
            }
            PolicyCommand::Apply { file, shadow: false, rollout, output } => {
                remote::policy_apply(&remote, &file, &rollout, output.output)
            }
            PolicyCommand::Apply { file, shadow: true, rollout: _, output } => {
                remote::shadow_start(&remote, &file, output.output)
            }
            PolicyCommand::Rollout(args) => remote::policy_rollout(&remote, args.output),
            PolicyCommand::Shadow { stop, output } => {
                remote::shadow_report(&remote, stop, output.output)
            }
            PolicyCommand::Show(args) => remote::policy_show(&remote, &args),
            PolicyCommand::History(args) => remote::policy_history(&remote, args.output),
            PolicyCommand::Rollback { version, output } => {
                remote::policy_rollback(&remote, version, output.output)
            }
            PolicyCommand::Diff { file } => remote::policy_diff(&remote, &file),
        },
        Command::Token { command: TokenCommand::Create(args) } => {
            daemon::token_create(&remote, &args)
        }
        Command::Top => top::run(&remote),
        Command::Plan(args) => plan::plan(&args),
        Command::Sim { command } => sim::run(command),
        Command::Telemetry { command } => telemetry::run(command),
        Command::Agent(args) => agent::run(&remote, args),
        Command::Completions { shell } => Ok(completions(shell)),
        Command::Man => man_page(),
    };
    match result {
        Ok(text) => {
            print_out(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            let e = match e.downcast::<InvalidInput>() {
                Ok(InvalidInput(text)) => {
                    print_err(&text);
                    return ExitCode::from(EXIT_INVALID);
                }
                Err(e) => e,
            };
            match e.downcast::<Failure>() {
                Ok(Failure { code, message }) => {
                    print_err(&message);
                    ExitCode::from(code)
                }
                Err(e) => {
                    print_err(&format!("error: {e:#}\n"));
                    ExitCode::from(EXIT_INTERNAL)
                }
            }
        }
    }
}

fn completions(shell: CompletionShell) -> String {
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "allot", &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

fn man_page() -> anyhow::Result<String> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page)?;
    Ok(String::from_utf8_lossy(&page).into_owned())
}

#[allow(clippy::print_stdout)]
pub(crate) fn print_out(text: &str) {
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

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
