//! Slurm's accounting database through `sacct`, for the same cross-checks as [`crate::jobcomp`]
//! on a cluster that runs slurmdbd: every run of every job (`--duplicates` keeps a requeued
//! job's earlier runs, state `REQUEUED`), with the GPUs Slurm allocated in `AllocTRES`
//! (`gres/gpu=N`, when `AccountingStorageTRES` names `gres/gpu`) and times as seconds since
//! the epoch (`SLURM_TIME_FORMAT=%s`), so no time zone is guessed.

use crate::jobcomp::{JobcompError, JobcompRecord};

/// The fields [`parse_sacct`] reads, in order: the job name last, so a `|` in a name cannot
/// shift the other fields.
pub const SACCT_FORMAT: &str = "JobID,User,State,Partition,Account,NodeList,NNodes,WorkDir,Start,End,AllocTRES,ExitCode,JobName";

/// The `sacct` arguments for every job allocation (no steps) of every user whose runs
/// touch the last `seconds` seconds, each run of a requeued job on its own line. Run it
/// with `SLURM_TIME_FORMAT=%s` in the environment.
pub fn sacct_args(seconds: u64) -> Vec<String> {
    [
        "--allusers",
        "--allocations",
        "--duplicates",
        "--parsable2",
        "--noheader",
        &format!("--starttime=now-{seconds}seconds"),
        "--endtime=now",
        &format!("--format={SACCT_FORMAT}"),
    ]
    .map(String::from)
    .to_vec()
}

/// Parses `sacct --parsable2 --noheader --format=SACCT_FORMAT` printed with
/// `SLURM_TIME_FORMAT=%s`. Job ids that are not plain numbers (array tasks `12_3`,
/// heterogeneous components `12+1`) are skipped: allot submits neither. A line with too few
/// fields, or a time that is neither a number nor `Unknown`/`None`, is an error naming it.
pub fn parse_sacct(text: &str) -> Result<Vec<JobcompRecord>, JobcompError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| JobcompError { line: i + 1, message };
        let f: Vec<&str> = line.splitn(13, '|').collect();
        let [
            id,
            user,
            state,
            partition,
            account,
            nodes,
            node_count,
            dir,
            start,
            end,
            tres,
            exit,
            name,
        ] = f[..]
        else {
            return Err(bad(format!(
                "{} field(s), not 13; run sacct with --parsable2 --format={SACCT_FORMAT}",
                f.len()
            )));
        };
        let Ok(job_id) = id.parse::<u64>() else { continue };
        let time = |k: &str, v: &str| match v.trim() {
            "" | "Unknown" | "None" => Ok(None),
            t => t.parse::<i64>().map(Some).map_err(|_| {
                bad(format!("job {job_id}: {k} {t:?} is not seconds; set SLURM_TIME_FORMAT=%s"))
            }),
        };
        out.push(JobcompRecord {
            job_id,
            user: user.to_string(),
            name: name.to_string(),
            // `CANCELLED by 0` → CANCELLED, as the job completion log writes it.
            state: state.split(' ').next().unwrap_or_default().to_string(),
            partition: partition.to_string(),
            account: account.to_string(),
            node_list: nodes.to_string(),
            node_count: node_count.parse().unwrap_or(0),
            work_dir: dir.to_string(),
            start: time("Start", start)?,
            end: time("End", end)?,
            tres: tres.to_string(),
            exit_code: exit.to_string(),
        });
    }
    Ok(out)
}
