//! `allot history export`: the daemon's workloads as a job trace (`GET /api/v1/history`) in the
//! allot trace format, for `allot sim replay --trace`, with the daemon's inventory and policy
//! written next to it on request (`--cluster-output`, `--policy-output`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use allot_api::HistoryExport;
use anyhow::Result;

use crate::client::Client;
use crate::{EXIT_INVALID, Failure, RemoteArgs};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum HistoryCommand {
    /// Write the workloads (ended, running, pending) as a job trace in the allot trace format
    /// (JSON lines; docs/design/trace-format.md). Ended work gets its real run time, running
    /// work its time so far (a lower bound), pending work its max runtime or else its
    /// project's median run time. A summary goes to stderr. Viewer or admin token.
    Export(ExportArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    /// Write the trace to this file instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Also write the daemon's inventory as a cluster file (for `sim replay --cluster`).
    #[arg(long, value_name = "FILE")]
    cluster_output: Option<PathBuf>,
    /// Also write the policy in effect (for `sim replay --policy`).
    #[arg(long, value_name = "FILE")]
    policy_output: Option<PathBuf>,
    /// Only the newest N workloads (1 to 100,000; default all, up to 100,000).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Write the API's JSON instead of the trace: each job with its state and where its
    /// duration comes from (`duration_basis`), the counts, the cluster file and the policy.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(remote: &RemoteArgs, command: &HistoryCommand) -> Result<String> {
    match command {
        HistoryCommand::Export(args) => export(remote, args),
    }
}

fn export(remote: &RemoteArgs, args: &ExportArgs) -> Result<String> {
    // Everywhere else `--output` names a format: a bare format name here is that mistake,
    // not a file the user wants created.
    if let Some(file) = &args.output
        && let Some(name) = file.to_str()
        && ["json", "text", "csv", "jsonl", "yaml"].contains(&name)
    {
        return Err(Failure::new(
            EXIT_INVALID,
            format!(
                "--output: '{name}' would be written as a file named {name}; here --output \
                 takes a FILE (the trace goes to stdout without it) — for the API's JSON add \
                 --json, and give a path such as ./{name} if a file of that name is meant\n"
            ),
        )
        .into());
    }
    let path = match args.limit {
        Some(n) => format!("/history?limit={n}"),
        None => "/history".to_string(),
    };
    let export = Client::new(remote)?.get::<HistoryExport>(&path)?;
    let body = if args.json {
        export.pretty()
    } else {
        allot_sim::trace::allot_trace_jsonl(&allot_server::whatif::trace_jobs(&export.value))
    };
    if let Some(file) = &args.cluster_output {
        write(file, &export.value.cluster_yaml)?;
    }
    if let Some(file) = &args.policy_output {
        write(file, &export.value.policy_text)?;
    }
    crate::print_err(&summary(&export.value, args));
    match &args.output {
        Some(file) => {
            write(file, &body)?;
            Ok(String::new())
        }
        None => Ok(body),
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| {
        Failure::new(EXIT_INVALID, format!("{}: cannot write the file: {e}\n", path.display()))
            .into()
    })
}

/// What was exported and left out, and the replay command for the files written.
fn summary(export: &HistoryExport, args: &ExportArgs) -> String {
    let c = &export.counts;
    let mut text = format!(
        "exported {} jobs: {} ended (real run time), {} running (time so far: a lower bound), {} \
         pending (estimated: max runtime, else the project's median run time)\n",
        export.jobs.len(),
        c.ended,
        c.running,
        c.pending_estimated
    );
    if c.pending_skipped + c.never_ran + c.older_left_out > 0 {
        let _ = writeln!(
            text,
            "left out: {} pending without an estimate, {} that never ran, {} older than the limit",
            c.pending_skipped, c.never_ran, c.older_left_out
        );
    }
    if !args.json {
        let shown = |p: &Option<PathBuf>, placeholder: &str| {
            p.as_ref().map_or_else(|| placeholder.to_string(), |p| p.display().to_string())
        };
        let _ = writeln!(
            text,
            "replay it: allot sim replay --trace {} --cluster {} --policy {} [--policy CANDIDATE.yaml]",
            shown(&args.output, "TRACE.jsonl"),
            shown(&args.cluster_output, "CLUSTER.yaml (--cluster-output)"),
            shown(&args.policy_output, "POLICY.yaml (--policy-output)"),
        );
    }
    text
}
