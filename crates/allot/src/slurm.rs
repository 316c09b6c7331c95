//! `allot slurm reconcile`: the goodput ledger's GPU-hours per project next to what Slurm's
//! own job completion log (`JobCompType=jobcomp/filetxt`) says each account used — a
//! cross-check of allot's books against the workload manager's, without slurmdbd. `allot
//! slurm gate-script`: the submit-time gate (job_submit/lua) with a cluster's settings.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_api::{Report, WorkloadList};
use allot_backend_slurm::jobcomp::{JobcompRecord, parse_jobcomp};
use anyhow::Result;

use crate::client::Client;
use crate::{EXIT_INVALID, Failure, RemoteArgs};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SlurmCommand {
    /// Compare the ledger's allocated GPU-hours per project with Slurm's job completion log
    /// per account. Jobs the log gives no GPU count for (no slurmdbd TRES) take theirs from
    /// allot's records: its own jobs by name (`<prefix>-W.A`), imported ones by job id.
    /// Viewer or admin token.
    Reconcile(ReconcileArgs),
    /// Print allot's submit-time gate for Slurm's job_submit/lua plugin: save it as
    /// job_submit.lua beside slurm.conf, set `JobSubmitPlugins=lua` and run `scontrol
    /// reconfigure`. Every job of a managed partition is then held as slurmctld accepts it,
    /// so none starts before allot admits it, even while allot is down. Needs no daemon.
    GateScript(GateScriptArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct GateScriptArgs {
    /// The partition allot manages (its `--slurm-partition`); without it, every partition
    /// not named by `--unmanaged-partition`.
    #[arg(long, value_name = "NAME")]
    partition: Option<String>,
    /// A partition allot leaves alone (its `--slurm-unmanaged-partition`); repeatable.
    #[arg(long, value_name = "NAME")]
    unmanaged_partition: Vec<String>,
    /// A uid besides root's that may release held jobs: the user allot runs as, if not
    /// root; repeatable.
    #[arg(long, value_name = "UID")]
    releaser_uid: Vec<u32>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReconcileArgs {
    /// The job completion log (`JobCompLoc` in slurm.conf).
    #[arg(long, value_name = "FILE")]
    jobcomp: PathBuf,
}

pub(crate) fn run(remote: &RemoteArgs, command: &SlurmCommand) -> Result<String> {
    match command {
        SlurmCommand::Reconcile(args) => reconcile(remote, args),
        SlurmCommand::GateScript(args) => Ok(allot_backend_slurm::gate_script(
            args.partition.as_deref(),
            &args.unmanaged_partition.iter().cloned().collect(),
            &args.releaser_uid.iter().copied().collect(),
        )),
    }
}

fn reconcile(remote: &RemoteArgs, args: &ReconcileArgs) -> Result<String> {
    let text = std::fs::read_to_string(&args.jobcomp).map_err(|e| {
        Failure::new(
            EXIT_INVALID,
            format!(
                "{}: cannot read the job completion log: {e}\nset JobCompType=jobcomp/filetxt \
                 and pass its JobCompLoc\n",
                args.jobcomp.display()
            ),
        )
    })?;
    let client = Client::new(remote)?;
    let report = client.get::<Report>("/report")?.value;
    let workloads = client.get::<WorkloadList>("/workloads")?.value;
    let ours = Ours::from_list(&workloads);
    let records = parse_jobcomp(&text)
        .map_err(|e| Failure::new(EXIT_INVALID, format!("{}: {e}\n", args.jobcomp.display())))?;
    // Both sides over the same work: allot's workloads that have ended (the log holds only
    // finished runs), every run of each.
    let mut slurm: BTreeMap<&str, f64> = BTreeMap::new();
    let (mut matched, mut requeued) = (0usize, 0usize);
    // Runs that started before this daemon's first start are another daemon's (whose jobs
    // have names of the same shape). The log's times are the controller's local time, read
    // as UTC.
    let since_s = i64::try_from(report.since_ms / 1000).unwrap_or(i64::MAX);
    for r in records.iter().filter(|r| r.start.is_some_and(|s| s >= since_s)) {
        let Some((project, gpus)) = ours.of(r) else { continue };
        matched += 1;
        // A requeue ends the run's line with the job pending again: an attempt like another.
        requeued += usize::from(matches!(r.state.as_str(), "PENDING" | "REQUEUED"));
        let hours = r.elapsed_seconds() as f64 * gpus as f64 / 3600.0;
        *slurm.entry(project).or_default() += hours;
    }
    let mut allot: BTreeMap<&str, f64> = BTreeMap::new();
    for row in &report.rows {
        let Some(id) = row.scope.strip_prefix("workload:").and_then(|i| i.parse::<u64>().ok())
        else {
            continue;
        };
        if let Some(w) = ours.ended.get(&id) {
            *allot.entry(w.0.as_str()).or_default() += row.allocated_gpu_hours;
        }
    }
    let mut names: Vec<&str> = allot.keys().chain(slurm.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let mut out = format!(
        "GPU-hours of the {} ended workload(s) ({} run(s) in the log, {} of them ended by a \
         requeue): allot's ledger (allocated, from admission to release) against Slurm's job \
         completion log (elapsed × GPUs)\n",
        ours.ended.len(),
        matched,
        requeued
    );
    out.push_str(&format!("{:<24} {:>10} {:>10} {:>9}\n", "PROJECT", "ALLOT", "SLURM", "DIFF"));
    for name in names {
        let a = allot.get(name).copied().unwrap_or(0.0);
        let s = slurm.get(name).copied().unwrap_or(0.0);
        let diff = if s > 0.0 { format!("{:+.1}%", (a - s) / s * 100.0) } else { "-".into() };
        out.push_str(&format!("{name:<24} {a:>10.3} {s:>10.3} {diff:>9}\n"));
    }
    out.push_str(
        "running and pending work is left out; allot counts from admission (the job's launch \
         and Slurm's start delay included), Slurm from the job's start\n",
    );
    Ok(out)
}

/// allot's ended workloads: (project, total whole GPUs) by workload id, and the imported
/// ones by Slurm job id.
struct Ours {
    ended: BTreeMap<u64, (String, u64)>,
    by_job: BTreeMap<u64, u64>,
}

impl Ours {
    fn from_list(list: &WorkloadList) -> Ours {
        let mut ended = BTreeMap::new();
        let mut by_job = BTreeMap::new();
        for w in list.workloads.iter().filter(|w| w.state.is_final()) {
            // Whole GPUs per member; a share or a MIG profile is not a Slurm GRES count.
            let Ok(per_member) = w.gpus.parse::<u64>() else { continue };
            ended.insert(w.id, (w.project.clone(), per_member * u64::from(w.members)));
            if let [tag, job] = w.command.as_slice()
                && tag == "foreign"
                && let Ok(job) = job.parse()
            {
                by_job.insert(job, w.id);
            }
        }
        Ours { ended, by_job }
    }

    /// The project and GPUs of a logged run that is one of allot's ended workloads': an
    /// imported job by its id, one of allot's own by the `W` of its name `allot…-W.A`.
    fn of(&self, r: &JobcompRecord) -> Option<(&str, u64)> {
        let id = match self.by_job.get(&r.job_id) {
            Some(id) => *id,
            None => {
                let (prefix, run) = r.name.rsplit_once('-')?;
                if !prefix.starts_with("allot") {
                    return None;
                }
                run.split_once('.')?.0.parse().ok()?
            }
        };
        self.ended.get(&id).map(|(p, g)| (p.as_str(), *g))
    }
}
