//! Slurm's job completion log (`JobCompType=jobcomp/filetxt`), for cross-checking allot's
//! ledger against what Slurm ran on a cluster without slurmdbd (no `sacct`).
//!
//! Slurm 22.05 writes one line per finished job, and one per run of a requeued job (the
//! requeued run's line says `JobState=PENDING` or `REQUEUED`), as `Key=Value` pairs separated
//! by spaces: `JobId=12964 UserId=root(0) … Name=fx JobState=COMPLETED Partition=batch …
//! StartTime=2026-11-30T19:27:25 EndTime=2026-11-30T19:27:28 NodeList=node3 NodeCnt=1
//! ProcCnt=2 WorkDir=/tmp … Tres=cpu=2,mem=8000M,node=1,billing=2 Account=nlp …`. Values are
//! not quoted: a value with spaces (a job name, a directory) runs on until the next known key.
//! Times are the controller's local time without a zone; elapsed time is their difference.
//!
//! GPUs appear in `Tres` (`gres/gpu=4`) only when `AccountingStorageTRES` names `gres/gpu`,
//! which Slurm refuses without slurmdbd (`fatal: slurmdbd is required to run with TRES
//! gres/gpu`). Without it the caller supplies each job's GPU count (allot knows its own runs'
//! and the foreign jobs it saw); jobs with neither are listed, not guessed.

use std::collections::BTreeMap;

/// One line of the job completion log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobcompRecord {
    pub job_id: u64,
    /// `UserId` as Slurm writes it: `name(uid)`.
    pub user: String,
    pub name: String,
    /// COMPLETED, FAILED, CANCELLED, TIMEOUT, …; PENDING or REQUEUED for a requeued run.
    pub state: String,
    pub partition: String,
    pub account: String,
    pub node_list: String,
    pub node_count: u64,
    pub work_dir: String,
    /// Seconds since the Unix epoch, reading the controller's local time as UTC (set the
    /// controller to UTC for exact comparisons); `None` for `Unknown`/`None`.
    pub start: Option<i64>,
    pub end: Option<i64>,
    /// The allocated TRES (`cpu=2,mem=8000M,node=1,billing=2[,gres/gpu=4]`).
    pub tres: String,
    pub exit_code: String,
}

impl JobcompRecord {
    /// Seconds the run held its allocation (0 when it never started).
    pub fn elapsed_seconds(&self) -> u64 {
        match (self.start, self.end) {
            (Some(s), Some(e)) if e > s => u64::try_from(e - s).unwrap_or(0),
            _ => 0,
        }
    }

    /// The job's GPUs from `Tres` (`gres/gpu=N`), when the site accounts them.
    pub fn tres_gpus(&self) -> Option<u64> {
        self.tres
            .split(',')
            .find_map(|t| t.strip_prefix("gres/gpu="))
            .and_then(|n| n.trim().parse().ok())
    }
}

/// A line that does not read as a job completion record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobcompError {
    /// 1-based line number.
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for JobcompError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "jobcomp log line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for JobcompError {}

/// The keys jobcomp/filetxt writes (22.05); a word that does not start with one of them
/// belongs to the previous value.
const KEYS: &[&str] = &[
    "JobId",
    "UserId",
    "GroupId",
    "Name",
    "JobState",
    "Partition",
    "TimeLimit",
    "StartTime",
    "EndTime",
    "NodeList",
    "NodeCnt",
    "ProcCnt",
    "WorkDir",
    "ReservationName",
    "Tres",
    "Account",
    "QOS",
    "WcKey",
    "Cluster",
    "SubmitTime",
    "EligibleTime",
    "ArrayJobId",
    "ArrayTaskId",
    "DerivedExitCode",
    "ExitCode",
];

/// Parses a job completion log. Blank lines are skipped; a line without a numeric `JobId`
/// or with an unreadable time is an error naming the line.
pub fn parse_jobcomp(text: &str) -> Result<Vec<JobcompRecord>, JobcompError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| JobcompError { line: i + 1, message };
        let fields = fields_of(line);
        let get = |k: &str| fields.get(k).cloned().unwrap_or_default();
        let job_id = get("JobId").parse::<u64>().map_err(|_| {
            bad(format!(
                "no numeric JobId ({:?}); is this a jobcomp/filetxt log?",
                fields.get("JobId")
            ))
        })?;
        let time =
            |k: &str| parse_time(&get(k)).map_err(|e| bad(format!("job {job_id}: {k}: {e}")));
        out.push(JobcompRecord {
            job_id,
            user: get("UserId"),
            name: get("Name"),
            state: get("JobState"),
            partition: get("Partition"),
            account: get("Account"),
            node_list: get("NodeList"),
            node_count: get("NodeCnt").parse().unwrap_or(0),
            work_dir: get("WorkDir"),
            start: time("StartTime")?,
            end: time("EndTime")?,
            tres: get("Tres"),
            exit_code: get("ExitCode"),
        });
    }
    Ok(out)
}

fn fields_of(line: &str) -> BTreeMap<&'static str, String> {
    let mut fields: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut current: Option<&'static str> = None;
    for word in line.split(' ') {
        let key = word
            .split_once('=')
            .and_then(|(k, _)| KEYS.iter().find(|known| **known == k).copied())
            .filter(|k| !fields.contains_key(k));
        match key {
            Some(k) => {
                let value = word.split_once('=').map_or("", |(_, v)| v);
                fields.insert(k, value.to_string());
                current = Some(k);
            }
            None => {
                if let Some(value) = current.and_then(|k| fields.get_mut(k)) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
        }
    }
    for value in fields.values_mut() {
        let trimmed = value.trim_end().len();
        value.truncate(trimmed);
    }
    fields
}

/// `2026-11-30T19:27:25` → seconds on a continuous local-time scale; `Unknown`, `None` and
/// an empty value → `None`.
fn parse_time(s: &str) -> Result<Option<i64>, String> {
    let s = s.trim();
    if s.is_empty() || s == "Unknown" || s == "None" {
        return Ok(None);
    }
    let bad = || format!("{s:?} is not a time like 2026-11-30T19:27:25");
    let (date, time) = s.split_once('T').ok_or_else(bad)?;
    let num = |p: Option<&str>| p.and_then(|v| v.parse::<i64>().ok()).ok_or_else(bad);
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next())?, num(d.next())?, num(d.next())?);
    let mut t = time.split(':');
    let (hh, mm, ss) = (num(t.next())?, num(t.next())?, num(t.next())?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    Ok(Some(allot_core::days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss))
}

/// GPU-hours per Slurm account in a job completion log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobcompGpuHours {
    /// Account → Σ elapsed × GPUs, in hours. Every run of a requeued job counts.
    pub by_account: BTreeMap<String, f64>,
    /// Jobs that held an allocation for some time but whose GPU count neither `Tres` nor the
    /// caller gave (not counted).
    pub unknown_gpus: Vec<u64>,
}

/// Sums GPU-hours per account: for every line, the elapsed time × the job's GPUs — from
/// `Tres` (`gres/gpu=N`) when the site accounts GPUs, else from `gpus_of` (the job's total
/// GPUs, e.g. from allot's records of the job id). Runs that never started count nothing.
pub fn jobcomp_gpu_hours(
    text: &str,
    gpus_of: impl Fn(&JobcompRecord) -> Option<u64>,
) -> Result<JobcompGpuHours, JobcompError> {
    let mut hours = JobcompGpuHours::default();
    for record in parse_jobcomp(text)? {
        let elapsed = record.elapsed_seconds();
        if elapsed == 0 {
            continue;
        }
        let Some(gpus) = record.tres_gpus().or_else(|| gpus_of(&record)) else {
            hours.unknown_gpus.push(record.job_id);
            continue;
        };
        *hours.by_account.entry(record.account.clone()).or_default() +=
            elapsed as f64 * gpus as f64 / 3600.0;
    }
    Ok(hours)
}

#[cfg(test)]
mod epoch_tests {
    #[test]
    fn times_are_seconds_since_the_unix_epoch() {
        assert_eq!(super::parse_time("1970-01-01T00:00:00"), Ok(Some(0)));
        assert_eq!(super::parse_time("2026-11-30T19:27:25"), Ok(Some(1_796_066_845)));
        assert_eq!(super::parse_time("2000-03-01T00:00:01"), Ok(Some(951_868_801)));
    }
}
