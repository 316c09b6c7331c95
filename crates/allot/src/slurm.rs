//! `allot slurm reconcile`: the goodput ledger's GPU-hours per project next to what Slurm's
//! own books say each account used — its accounting database through `sacct` (slurmdbd), or
//! its job completion log (`JobCompType=jobcomp/filetxt`) on a cluster without one. `allot
//! slurm gate-script`: the submit-time gate (job_submit/lua) with a cluster's settings.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_api::{Report, WorkloadList};
use allot_backend_slurm::jobcomp::{JobcompRecord, parse_jobcomp};
use allot_backend_slurm::sacct::{parse_sacct, sacct_args};
use anyhow::Result;

use crate::client::Client;
use crate::{EXIT_INVALID, Failure, RemoteArgs};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum SlurmCommand {
    /// Compare the ledger's allocated GPU-hours per project with Slurm's accounting (`sacct`)
    /// or its job completion log. Runs are matched to allot's workloads by name
    /// (`<prefix>-W.A`) or, imported ones, by job id; each run's GPUs are Slurm's (`gres/gpu`
    /// in its TRES), or allot's record of them where Slurm does not account GPUs. Viewer or
    /// admin token.
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
#[group(id = "source", required = true, multiple = false, args = ["jobcomp", "sacct"])]
pub(crate) struct ReconcileArgs {
    /// The job completion log (`JobCompLoc` in slurm.conf).
    #[arg(long, value_name = "FILE")]
    jobcomp: Option<PathBuf>,
    /// Read Slurm's accounting database with `sacct` (a cluster with slurmdbd; `sacct` on
    /// PATH, SLURM_CONF as for the daemon).
    #[arg(long)]
    sacct: bool,
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

/// Slurm's records of every run, from the job completion log or `sacct`, back to
/// `since_ms` (the daemon's first start).
fn slurm_records(args: &ReconcileArgs, since_ms: u64) -> Result<(Vec<JobcompRecord>, String)> {
    if let Some(path) = &args.jobcomp {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::new(
                EXIT_INVALID,
                format!(
                    "{}: cannot read the job completion log: {e}\nset JobCompType=jobcomp/filetxt \
                     and pass its JobCompLoc\n",
                    path.display()
                ),
            )
        })?;
        let records = parse_jobcomp(&text)
            .map_err(|e| Failure::new(EXIT_INVALID, format!("{}: {e}\n", path.display())))?;
        return Ok((records, "Slurm's job completion log".into()));
    }
    // Whole seconds since the daemon's first start, and a minute before it: a run that
    // started then is filtered out below by its start time.
    let now_ms = crate::render::now_ms();
    let seconds = now_ms.saturating_sub(since_ms) / 1000 + 60;
    let out = std::process::Command::new("sacct")
        .args(sacct_args(seconds))
        .env("SLURM_TIME_FORMAT", "%s")
        .output()
        .map_err(|e| {
            Failure::new(
                EXIT_INVALID,
                format!("sacct: cannot run it: {e}\ninstall Slurm's client commands, or pass --jobcomp FILE\n"),
            )
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::new(
            EXIT_INVALID,
            format!(
                "sacct: {}\nit needs slurmdbd (AccountingStorageType=accounting_storage/slurmdbd); \
                 on a cluster without it pass --jobcomp FILE\n",
                stderr.trim()
            ),
        )
        .into());
    }
    let records = parse_sacct(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| Failure::new(EXIT_INVALID, format!("sacct output: {e}\n")))?;
    Ok((records, "Slurm's accounting (sacct)".into()))
}

fn reconcile(remote: &RemoteArgs, args: &ReconcileArgs) -> Result<String> {
    let client = Client::new(remote)?;
    let report = client.get::<Report>("/report")?.value;
    let workloads = client.get::<WorkloadList>("/workloads")?.value;
    let ours = Ours::from_list(&workloads);
    let (records, source) = slurm_records(args, report.since_ms)?;
    // Both sides over the same work: allot's workloads that have ended (the log holds only
    // finished runs), every run of each.
    let mut slurm: BTreeMap<&str, f64> = BTreeMap::new();
    let (mut matched, mut requeued) = (0usize, 0usize);
    // Runs that held an allocation but whose GPUs Slurm did not account (no gres/gpu in its
    // TRES): they take allot's count, and are named.
    let mut unaccounted: Vec<u64> = Vec::new();
    // Runs that started before this daemon's first start are another daemon's (whose jobs
    // have names of the same shape). The jobcomp log's times are the controller's local time,
    // read as UTC; sacct's are seconds since the epoch.
    let since_s = i64::try_from(report.since_ms / 1000).unwrap_or(i64::MAX);
    for r in records.iter().filter(|r| r.start.is_some_and(|s| s >= since_s)) {
        let Some((project, allot_gpus)) = ours.of(r) else { continue };
        matched += 1;
        // Slurm's own count where it accounts GPUs (slurmdbd with gres/gpu in its TRES).
        let gpus = r.tres_gpus().unwrap_or_else(|| {
            if r.elapsed_seconds() > 0 && allot_gpus > 0 {
                unaccounted.push(r.job_id);
            }
            allot_gpus
        });
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
        "GPU-hours of the {} ended workload(s) ({} run(s) in {source}, {} of them ended by a \
         requeue): allot's ledger (allocated, from admission to release) against {source} \
         (elapsed × the GPUs Slurm accounted)\n",
        ours.ended.len(),
        matched,
        requeued,
    );
    if !unaccounted.is_empty() {
        let ids: Vec<String> = unaccounted.iter().map(u64::to_string).collect();
        out.push_str(&format!(
            "{} run(s) without GPUs in Slurm's TRES (AccountingStorageTRES=gres/gpu needs \
             slurmdbd) count allot's GPUs: job(s) {}\n",
            ids.len(),
            ids.join(", ")
        ));
    }
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
