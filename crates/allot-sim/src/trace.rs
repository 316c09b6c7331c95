//! Job traces for time-based replay: the Philly job list, machine list and virtual-cluster
//! sizes, and the allot trace format (CSV and JSON lines, `docs/design/trace-format.md`).
//!
//! Every loader returns typed rows or a [`TraceError`] naming the file, the 1-based line, the
//! field and the fix; under [`BadRows::Skip`] malformed rows are skipped and counted instead.
//! Nothing here panics on any input.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use allot_core::{DeviceSpec, MEMBERS_MAX, NodeSpec, WHOLE_GPUS_PER_MEMBER_MAX, WorkloadKind};

use crate::csv::numbered_lines;
use crate::error::{BadRows, Skipped, TraceError};

/// Largest trace file read; the Philly job list is 2.8 MB, openb pod lists a few MB.
const TRACE_BYTES_MAX: u64 = 1024 * 1024 * 1024;

/// Longest job accepted, in seconds (10 years): larger values are typos, and they keep the
/// millisecond clock far from overflow.
const DURATION_S_MAX: f64 = 10.0 * 365.0 * 86_400.0;

/// Reads a whole trace file as UTF-8 text.
pub fn read_text(path: &Path) -> Result<String, TraceError> {
    let meta = std::fs::metadata(path).map_err(|e| TraceError::io(path, &e))?;
    if meta.len() > TRACE_BYTES_MAX {
        return Err(TraceError::new(
            path,
            0,
            "",
            format!("the file is larger than {} MiB", TRACE_BYTES_MAX / (1024 * 1024)),
            "split the trace into smaller files",
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, &e))?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
        TraceError::new(path, line, "", "the file is not UTF-8 text".into(), "save it as UTF-8")
    })
}

// ----- one job, whatever trace it came from ----------------------------------------------------

/// One job as the replay consumes it, from any trace format.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    /// Unique in the trace; also the engine's `WorkloadId`.
    pub id: u64,
    pub name: String,
    /// Submit time, seconds since the start of the trace.
    pub submit_s: f64,
    /// Run time the job needs when it runs uninterrupted, seconds.
    pub duration_s: f64,
    pub project: String,
    /// Whole GPUs per member (0 for a CPU-only job); with `gpu_milli` < 1000 it is 1.
    pub gpus: u32,
    /// Gang size, ≥ 1.
    pub members: u32,
    /// Shares of each GPU, 1..=1000; below 1000 the member asks for a fraction of one GPU.
    pub gpu_milli: u32,
    /// Acceptable GPU models in order of preference; empty: any.
    pub gpu_models: Vec<String>,
    /// `None`: assigned by the activity model's documented seeded rule.
    pub kind: Option<WorkloadKind>,
    pub priority_class: Option<String>,
    /// Run time between periodic checkpoints; `None`: not checkpointable.
    pub checkpoint_interval_s: Option<f64>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// The line in its file, for messages.
    pub line: usize,
}

impl TraceJob {
    /// A job of `members` × `gpus` whole GPUs in `project`, submitted at `submit_s` and
    /// running `duration_s`: training, on any model, not checkpointable, no CPU or memory
    /// asked, named `j{id}` on line `id + 1`. For tests and benchmarks, which set any other
    /// field with `TraceJob { .., ..TraceJob::whole(..) }`.
    pub fn whole(
        id: u64,
        project: &str,
        submit_s: f64,
        duration_s: f64,
        members: u32,
        gpus: u32,
    ) -> TraceJob {
        TraceJob {
            id,
            name: format!("j{id}"),
            submit_s,
            duration_s,
            project: project.into(),
            gpus,
            members,
            gpu_milli: 1000,
            gpu_models: Vec::new(),
            kind: Some(WorkloadKind::Training),
            priority_class: None,
            checkpoint_interval_s: None,
            cpu_milli: 0,
            memory_mib: 0,
            line: id as usize + 1,
        }
    }

    /// GPUs the whole gang holds, in 1/1000 GPU.
    pub fn total_shares(&self) -> u64 {
        let per_member = if self.gpu_milli < 1000 {
            u64::from(self.gpu_milli)
        } else {
            u64::from(self.gpus) * 1000
        };
        per_member * u64::from(self.members)
    }
}

// ----- Philly ------------------------------------------------------------------------------------

/// One row of `philly.csv` (Pollux artifact): `timestamp,duration,num_gpus,gpu_time,cluster`.
#[derive(Clone, Debug, PartialEq)]
pub struct PhillyJob {
    /// Seconds since the first row's timestamp (rows are sorted by submit time; an earlier
    /// row later in the file is an error, as the replay relies on the published order).
    pub submit_s: u64,
    pub duration_s: f64,
    pub num_gpus: u32,
    pub gpu_time_s: f64,
    /// The virtual cluster (a hash such as `6214e9`): the job's project.
    pub vc: String,
    pub line: usize,
}

/// The Philly job list and what was skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhillyJobs {
    pub jobs: Vec<PhillyJob>,
    /// Unix seconds of the first job's submit time (UTC as written in the file).
    pub epoch_unix_s: i64,
    pub skipped: Skipped,
}

const PHILLY_HEADER: [&str; 5] = ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"];

/// Reads `philly.csv`.
pub fn load_philly_jobs(path: &Path, bad_rows: BadRows) -> Result<PhillyJobs, TraceError> {
    parse_philly_jobs(path, &read_text(path)?, bad_rows)
}

/// Parses the text of `philly.csv`; `path` names it in errors.
pub fn parse_philly_jobs(
    path: &Path,
    text: &str,
    bad_rows: BadRows,
) -> Result<PhillyJobs, TraceError> {
    let mut lines = numbered_lines(text);
    let Some((header_line, header)) = lines.next() else {
        return Err(TraceError::new(
            path,
            1,
            "header",
            "the file is empty".into(),
            "expected the header `timestamp,duration,num_gpus,gpu_time,cluster`",
        ));
    };
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    if names != PHILLY_HEADER {
        return Err(TraceError::new(
            path,
            header_line,
            "header",
            format!("unexpected columns `{header}`"),
            "expected the header `timestamp,duration,num_gpus,gpu_time,cluster`",
        ));
    }
    let mut out = PhillyJobs::default();
    let mut first_unix: Option<i64> = None;
    let mut last_unix = i64::MIN;
    for (line, row) in lines {
        let parsed = parse_philly_row(path, line, row).and_then(|(unix, job)| {
            if unix < last_unix {
                return Err(TraceError::new(
                    path,
                    line,
                    "timestamp",
                    format!("submit time is earlier than the row before ({})", row_cell(row, 0)),
                    "sort the file by timestamp",
                ));
            }
            Ok((unix, job))
        });
        match parsed {
            Ok((unix, mut job)) => {
                last_unix = unix;
                let epoch = *first_unix.get_or_insert(unix);
                job.submit_s = u64::try_from(unix - epoch).unwrap_or(0);
                out.jobs.push(job);
            }
            Err(e) => out.skipped.record(bad_rows, e)?,
        }
    }
    out.epoch_unix_s = first_unix.unwrap_or(0);
    Ok(out)
}

fn row_cell(row: &str, i: usize) -> &str {
    row.split(',').nth(i).unwrap_or("").trim()
}

fn parse_philly_row(path: &Path, line: usize, row: &str) -> Result<(i64, PhillyJob), TraceError> {
    let cells: Vec<&str> = row.split(',').map(str::trim).collect();
    if cells.len() != PHILLY_HEADER.len() {
        return Err(TraceError::new(
            path,
            line,
            "row",
            format!("{} columns, expected 5", cells.len()),
            "each row is `timestamp,duration,num_gpus,gpu_time,cluster`",
        ));
    }
    let unix = parse_datetime(cells[0]).ok_or_else(|| {
        TraceError::new(
            path,
            line,
            "timestamp",
            format!("`{}` is not a date and time", cells[0]),
            "write it as YYYY-MM-DD HH:MM:SS",
        )
    })?;
    let duration_s = seconds(path, line, "duration", cells[1])?;
    let num_gpus = cells[2].parse::<u32>().ok().filter(|&n| n <= WHOLE_GPUS_PER_MEMBER_MAX);
    let num_gpus = num_gpus.ok_or_else(|| {
        TraceError::new(
            path,
            line,
            "num_gpus",
            format!("`{}` is not a GPU count", cells[2]),
            "write a whole number of GPUs between 0 and 1024",
        )
    })?;
    let gpu_time_s = seconds(path, line, "gpu_time", cells[3])?;
    if !is_name(cells[4]) {
        return Err(TraceError::new(
            path,
            line,
            "cluster",
            format!("`{}` is not a virtual-cluster name", cells[4]),
            "use 1-253 letters, digits, `-`, `_` or `.`",
        ));
    }
    let job =
        PhillyJob { submit_s: 0, duration_s, num_gpus, gpu_time_s, vc: cells[4].to_owned(), line };
    Ok((unix, job))
}

/// A non-negative, finite number of seconds, at most `DURATION_S_MAX`.
fn seconds(path: &Path, line: usize, field: &str, cell: &str) -> Result<f64, TraceError> {
    match cell.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=DURATION_S_MAX).contains(&v) => Ok(v),
        _ => Err(TraceError::new(
            path,
            line,
            field,
            format!("`{cell}` is not a number of seconds"),
            "write a number between 0 and 315360000 (10 years)",
        )),
    }
}

/// Names of projects, VCs, models and classes: what the policy file accepts.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) → Unix seconds; `None` if malformed or out of range.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b' ' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(range)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if !(1..=12).contains(&month) || day < 1 || day > month_days[(month - 1) as usize] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(
        allot_core::days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second,
    )
}

impl PhillyJob {
    /// The job as the replay runs it. A job with more GPUs than the largest node holds becomes
    /// a gang: each member takes the largest divisor of `num_gpus` that fits one node, so
    /// 16 → 2 × 8, 12 → 2 × 6 and 24 → 3 × 8 on Philly's 8-GPU machines; a job that fits
    /// one node stays one member. Philly jobs carry no kind, class or checkpoint facts.
    pub fn to_trace_job(&self, id: u64, gpus_per_node_max: u32) -> TraceJob {
        let per_member = (1..=gpus_per_node_max.max(1))
            .rev()
            .find(|d| self.num_gpus.is_multiple_of(*d))
            .unwrap_or(1)
            .min(self.num_gpus.max(1));
        let (gpus, members) = if self.num_gpus == 0 {
            (0, 1)
        } else if self.num_gpus <= gpus_per_node_max {
            (self.num_gpus, 1)
        } else {
            (per_member, self.num_gpus / per_member)
        };
        TraceJob {
            id,
            name: format!("philly-{id}"),
            submit_s: self.submit_s as f64,
            duration_s: self.duration_s,
            project: self.vc.clone(),
            gpus,
            members,
            gpu_milli: 1000,
            gpu_models: Vec::new(),
            kind: None,
            priority_class: None,
            checkpoint_interval_s: None,
            cpu_milli: 0,
            memory_mib: 0,
            line: self.line,
        }
    }
}

/// One row of Philly's `cluster_machine_list`: `machineId, number of GPUs, single GPU mem`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhillyMachine {
    pub id: String,
    pub gpus: u32,
    /// Per-GPU memory, GiB (`12GB` → 12).
    pub gpu_memory_gb: u32,
    pub line: usize,
}

/// Reads `cluster_machine_list`.
pub fn load_philly_machines(
    path: &Path,
    bad_rows: BadRows,
) -> Result<(Vec<PhillyMachine>, Skipped), TraceError> {
    parse_philly_machines(path, &read_text(path)?, bad_rows)
}

pub fn parse_philly_machines(
    path: &Path,
    text: &str,
    bad_rows: BadRows,
) -> Result<(Vec<PhillyMachine>, Skipped), TraceError> {
    let mut lines = numbered_lines(text);
    let expected = "expected the header `machineId, number of GPUs, single GPU mem`";
    match lines.next() {
        Some((_, h))
            if h.split(',').map(str::trim).eq([
                "machineId",
                "number of GPUs",
                "single GPU mem",
            ]) => {}
        Some((line, h)) => {
            return Err(TraceError::new(
                path,
                line,
                "header",
                format!("unexpected `{h}`"),
                expected,
            ));
        }
        None => {
            return Err(TraceError::new(path, 1, "header", "the file is empty".into(), expected));
        }
    }
    let mut machines = Vec::new();
    let mut skipped = Skipped::default();
    let mut seen = BTreeSet::new();
    for (line, row) in lines {
        match parse_machine_row(path, line, row, &mut seen) {
            Ok(m) => machines.push(m),
            Err(e) => skipped.record(bad_rows, e)?,
        }
    }
    if machines.is_empty() {
        return Err(TraceError::new(
            path,
            0,
            "",
            "no machines".into(),
            "list at least one machine",
        ));
    }
    Ok((machines, skipped))
}

fn parse_machine_row(
    path: &Path,
    line: usize,
    row: &str,
    seen: &mut BTreeSet<String>,
) -> Result<PhillyMachine, TraceError> {
    let cells: Vec<&str> = row.split(',').map(str::trim).collect();
    if cells.len() != 3 {
        return Err(TraceError::new(
            path,
            line,
            "row",
            format!("{} columns, expected 3", cells.len()),
            "each row is `machineId, number of GPUs, single GPU mem` (e.g. `m0,2, 12GB`)",
        ));
    }
    if !is_name(cells[0]) {
        return Err(TraceError::new(
            path,
            line,
            "machineId",
            format!("`{}` is not a machine name", cells[0]),
            "use 1-253 letters, digits, `-`, `_` or `.`",
        ));
    }
    if !seen.insert(cells[0].to_owned()) {
        return Err(TraceError::new(
            path,
            line,
            "machineId",
            format!("machine `{}` is listed twice", cells[0]),
            "remove the duplicate row",
        ));
    }
    let gpus =
        cells[1].parse::<u32>().ok().filter(|n| (1..=1024).contains(n)).ok_or_else(|| {
            TraceError::new(
                path,
                line,
                "number of GPUs",
                format!("`{}` is not a GPU count", cells[1]),
                "write a whole number between 1 and 1024",
            )
        })?;
    let memory = cells[2].strip_suffix("GB").and_then(|n| n.trim().parse::<u32>().ok());
    let gpu_memory_gb = memory.filter(|&m| (1..=4096).contains(&m)).ok_or_else(|| {
        TraceError::new(
            path,
            line,
            "single GPU mem",
            format!("`{}` is not a memory size", cells[2]),
            "write whole gigabytes with the unit, e.g. `12GB`",
        )
    })?;
    Ok(PhillyMachine { id: cells[0].to_owned(), gpus, gpu_memory_gb, line })
}

/// The GPU model name the replay gives a Philly machine's GPUs: the list names no model, only
/// the memory, so the model is named by it (`12GB`, `24GB`).
pub fn philly_model_name(gpu_memory_gb: u32) -> String {
    format!("{gpu_memory_gb}GB")
}

/// The machines as engine nodes: one device per GPU, all on one interconnect island (the list
/// says nothing of topology), no CPU or memory limits (the trace asks for none).
pub fn philly_nodes(machines: &[PhillyMachine]) -> Vec<NodeSpec> {
    machines
        .iter()
        .map(|m| NodeSpec {
            name: m.id.clone(),
            cpu_millis: 0,
            memory_mib: 0,
            labels: BTreeMap::new(),
            pool: None,
            rack: None,
            devices: (0..m.gpus)
                .map(|_| DeviceSpec {
                    model: philly_model_name(m.gpu_memory_gb),
                    memory_mib: u64::from(m.gpu_memory_gb) * 1024,
                    island: 0,
                    mig: false,
                })
                .collect(),
        })
        .collect()
}

/// One row of `philly_vc.csv`: a virtual cluster and its size in nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualCluster {
    pub name: String,
    pub nodes: u32,
    pub line: usize,
}

/// Reads `philly_vc.csv` (`vc,node num`).
pub fn load_philly_vcs(path: &Path) -> Result<Vec<VirtualCluster>, TraceError> {
    parse_philly_vcs(path, &read_text(path)?)
}

pub fn parse_philly_vcs(path: &Path, text: &str) -> Result<Vec<VirtualCluster>, TraceError> {
    let mut lines = numbered_lines(text);
    let expected = "expected the header `vc,node num`";
    match lines.next() {
        Some((_, h)) if h.split(',').map(str::trim).eq(["vc", "node num"]) => {}
        Some((line, h)) => {
            return Err(TraceError::new(
                path,
                line,
                "header",
                format!("unexpected `{h}`"),
                expected,
            ));
        }
        None => {
            return Err(TraceError::new(path, 1, "header", "the file is empty".into(), expected));
        }
    }
    let mut out: Vec<VirtualCluster> = Vec::new();
    for (line, row) in lines {
        let cells: Vec<&str> = row.split(',').map(str::trim).collect();
        let [name, nodes] = cells[..] else {
            return Err(TraceError::new(
                path,
                line,
                "row",
                format!("{} columns, expected 2", cells.len()),
                "each row is `vc,node num`",
            ));
        };
        if !is_name(name) {
            return Err(TraceError::new(
                path,
                line,
                "vc",
                format!("`{name}` is not a virtual-cluster name"),
                "use 1-253 letters, digits, `-`, `_` or `.`",
            ));
        }
        if out.iter().any(|v| v.name == name) {
            return Err(TraceError::new(
                path,
                line,
                "vc",
                format!("`{name}` is listed twice"),
                "remove the duplicate row",
            ));
        }
        let nodes = nodes.parse::<u32>().ok().filter(|n| (1..=1_000_000).contains(n));
        let Some(nodes) = nodes else {
            return Err(TraceError::new(
                path,
                line,
                "node num",
                format!("`{}` is not a node count", cells[1]),
                "write a whole number of nodes, at least 1",
            ));
        };
        out.push(VirtualCluster { name: name.to_owned(), nodes, line });
    }
    Ok(out)
}

// ----- the allot trace format --------------------------------------------------------------------

/// An allot trace and what was skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllotTrace {
    pub jobs: Vec<TraceJob>,
    pub skipped: Skipped,
}

/// The columns (CSV) or keys (JSON lines) of the allot trace format.
const FIELDS: [&str; 15] = [
    "id",
    "name",
    "submit_s",
    "duration_s",
    "project",
    "gpus",
    "members",
    "gpu_milli",
    "gpu_model",
    "kind",
    "priority_class",
    "checkpoint_interval_s",
    "cpu_milli",
    "memory_mib",
    "user",
];
const REQUIRED: [&str; 5] = ["id", "submit_s", "duration_s", "project", "gpus"];

/// Writes jobs in the allot trace format as JSON lines, one object per job in the given
/// order, that [`parse_allot_trace`] reads back as the same jobs (but for `line`): defaults
/// (`members` 1, `gpu_milli` 1000, no models, no class, no checkpoints, no CPU or memory) are
/// left out, and an absent `kind` stays absent (the activity model assigns one).
pub fn allot_trace_jsonl(jobs: &[TraceJob]) -> String {
    let mut out = String::with_capacity(jobs.len() * 128);
    for job in jobs {
        let mut row = serde_json::Map::new();
        row.insert("id".into(), job.id.into());
        row.insert("name".into(), job.name.clone().into());
        row.insert("submit_s".into(), job.submit_s.into());
        row.insert("duration_s".into(), job.duration_s.into());
        row.insert("project".into(), job.project.clone().into());
        row.insert("gpus".into(), job.gpus.into());
        if job.members != 1 {
            row.insert("members".into(), job.members.into());
        }
        if job.gpu_milli != 1000 {
            row.insert("gpu_milli".into(), job.gpu_milli.into());
        }
        if !job.gpu_models.is_empty() {
            row.insert("gpu_model".into(), job.gpu_models.clone().into());
        }
        if let Some(kind) = job.kind {
            row.insert("kind".into(), kind.as_str().into());
        }
        if let Some(class) = &job.priority_class {
            row.insert("priority_class".into(), class.clone().into());
        }
        if let Some(interval) = job.checkpoint_interval_s {
            row.insert("checkpoint_interval_s".into(), interval.into());
        }
        if job.cpu_milli != 0 {
            row.insert("cpu_milli".into(), job.cpu_milli.into());
        }
        if job.memory_mib != 0 {
            row.insert("memory_mib".into(), job.memory_mib.into());
        }
        out.push_str(&serde_json::Value::Object(row).to_string());
        out.push('\n');
    }
    out
}

/// Reads an allot trace: JSON lines when the file ends in `.jsonl`/`.ndjson` or its first
/// non-blank line starts with `{`, CSV with a header row otherwise.
pub fn load_allot_trace(path: &Path, bad_rows: BadRows) -> Result<AllotTrace, TraceError> {
    parse_allot_trace(path, &read_text(path)?, bad_rows)
}

pub fn parse_allot_trace(
    path: &Path,
    text: &str,
    bad_rows: BadRows,
) -> Result<AllotTrace, TraceError> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let first = numbered_lines(text).next().map(|(_, l)| l.trim_start());
    let json = matches!(ext, "jsonl" | "ndjson") || first.is_some_and(|l| l.starts_with('{'));
    let mut out = AllotTrace::default();
    let mut ids: BTreeMap<u64, usize> = BTreeMap::new();
    let mut accept = |row: Result<TraceJob, TraceError>, out: &mut AllotTrace| {
        let row = row.and_then(|job| match ids.get(&job.id) {
            Some(&earlier) => Err(TraceError::new(
                path,
                job.line,
                "id",
                format!("id {} is used already on line {earlier}", job.id),
                "give every job its own id",
            )),
            None => {
                ids.insert(job.id, job.line);
                Ok(job)
            }
        });
        match row {
            Ok(job) => {
                out.jobs.push(job);
                Ok(())
            }
            Err(e) => out.skipped.record(bad_rows, e),
        }
    };
    if json {
        for (line, row) in numbered_lines(text) {
            accept(json_row(path, line, row), &mut out)?;
        }
    } else {
        let mut lines = numbered_lines(text);
        let Some((header_line, header)) = lines.next() else {
            return Err(TraceError::new(
                path,
                1,
                "header",
                "the file is empty".into(),
                "start with a header row, e.g. `id,submit_s,duration_s,project,gpus`",
            ));
        };
        let columns = csv_header(path, header_line, header)?;
        for (line, row) in lines {
            accept(csv_row(path, line, row, &columns), &mut out)?;
        }
    }
    Ok(out)
}

fn csv_header<'a>(path: &Path, line: usize, header: &'a str) -> Result<Vec<&'a str>, TraceError> {
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    for (i, c) in columns.iter().enumerate() {
        if !FIELDS.contains(c) {
            return Err(TraceError::new(
                path,
                line,
                c,
                format!("unknown column `{c}`"),
                &format!("columns are {}", FIELDS.join(", ")),
            ));
        }
        if columns[..i].contains(c) {
            return Err(TraceError::new(
                path,
                line,
                c,
                format!("column `{c}` appears twice"),
                "keep one",
            ));
        }
    }
    for r in REQUIRED {
        if !columns.contains(&r) {
            return Err(TraceError::new(
                path,
                line,
                r,
                format!("the required column `{r}` is missing"),
                &format!("the header needs {}", REQUIRED.join(", ")),
            ));
        }
    }
    Ok(columns)
}

fn csv_row(path: &Path, line: usize, row: &str, columns: &[&str]) -> Result<TraceJob, TraceError> {
    if row.contains('"') {
        return Err(TraceError::new(
            path,
            line,
            "row",
            "quoted cells are not supported".into(),
            "remove the quotes: no value in this format contains a comma",
        ));
    }
    let cells: Vec<&str> = row.split(',').map(str::trim).collect();
    if cells.len() != columns.len() {
        return Err(TraceError::new(
            path,
            line,
            "row",
            format!("{} cells, the header has {}", cells.len(), columns.len()),
            "write one cell per column (leave optional ones empty)",
        ));
    }
    let fields: BTreeMap<&str, Cell<'_>> = columns
        .iter()
        .zip(&cells)
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (*k, Cell::Text(v)))
        .collect();
    build_job(path, line, &fields)
}

fn json_row(path: &Path, line: usize, row: &str) -> Result<TraceJob, TraceError> {
    let value: serde_json::Value = serde_json::from_str(row).map_err(|e| {
        TraceError::new(
            path,
            line,
            "row",
            format!("not a JSON object: {e}"),
            "write one JSON object per line",
        )
    })?;
    let Some(object) = value.as_object() else {
        return Err(TraceError::new(
            path,
            line,
            "row",
            "not a JSON object".into(),
            "write one JSON object per line",
        ));
    };
    let mut fields: BTreeMap<&str, Cell<'_>> = BTreeMap::new();
    for (key, v) in object {
        let Some(&known) = FIELDS.iter().find(|f| **f == key.as_str()) else {
            return Err(TraceError::new(
                path,
                line,
                key,
                format!("unknown key `{key}`"),
                &format!("keys are {}", FIELDS.join(", ")),
            ));
        };
        let cell = match v {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => Cell::Text(s.as_str()),
            serde_json::Value::Number(n) => Cell::Number(n.as_f64().unwrap_or(f64::NAN)),
            serde_json::Value::Array(items) if known == "gpu_model" => {
                let names: Option<Vec<&str>> = items.iter().map(|i| i.as_str()).collect();
                match names {
                    Some(names) => Cell::List(names),
                    None => return Err(field_error(path, line, key, "a list of model names")),
                }
            }
            _ => return Err(field_error(path, line, key, "a string or a number")),
        };
        fields.insert(known, cell);
    }
    for r in REQUIRED {
        if !fields.contains_key(r) {
            return Err(TraceError::new(
                path,
                line,
                r,
                format!("the required key `{r}` is missing"),
                &format!("every row needs {}", REQUIRED.join(", ")),
            ));
        }
    }
    build_job(path, line, &fields)
}

fn field_error(path: &Path, line: usize, field: &str, expected: &str) -> TraceError {
    TraceError::new(
        path,
        line,
        field,
        format!("expected {expected}"),
        "see docs/design/trace-format.md",
    )
}

/// One value of a row, before it is checked.
#[derive(Clone, Debug)]
enum Cell<'a> {
    Text(&'a str),
    Number(f64),
    List(Vec<&'a str>),
}

impl Cell<'_> {
    fn number(&self) -> Option<f64> {
        match self {
            Cell::Text(t) => t.parse::<f64>().ok(),
            Cell::Number(n) => Some(*n),
            Cell::List(_) => None,
        }
    }
    fn text(&self) -> Option<String> {
        match self {
            Cell::Text(t) => Some((*t).to_owned()),
            Cell::Number(n) => Some(format!("{n}")),
            Cell::List(_) => None,
        }
    }
}

fn build_job(
    path: &Path,
    line: usize,
    fields: &BTreeMap<&str, Cell<'_>>,
) -> Result<TraceJob, TraceError> {
    let err =
        |field: &str, message: String, fix: &str| TraceError::new(path, line, field, message, fix);
    let shown = |field: &str| match fields.get(field) {
        Some(Cell::Text(t)) => format!("`{t}`"),
        Some(Cell::Number(n)) => format!("{n}"),
        Some(Cell::List(l)) => format!("{l:?}"),
        None => "nothing".into(),
    };
    let integer =
        |field: &str, min: u64, max: u64, default: Option<u64>| -> Result<u64, TraceError> {
            match fields.get(field) {
                None => default.ok_or_else(|| {
                    err(field, format!("`{field}` is required"), "see docs/design/trace-format.md")
                }),
                Some(cell) => cell
                    .number()
                    .filter(|v| v.fract() == 0.0 && *v >= min as f64 && *v <= max as f64)
                    .map(|v| v as u64)
                    .ok_or_else(|| {
                        err(
                            field,
                            format!("{} is not a whole number in {min}..={max}", shown(field)),
                            &format!("write a whole number between {min} and {max}"),
                        )
                    }),
            }
        };
    let secs = |field: &str, required: bool| -> Result<Option<f64>, TraceError> {
        match fields.get(field) {
            None if required => {
                Err(err(field, format!("`{field}` is required"), "write a number of seconds"))
            }
            None => Ok(None),
            Some(cell) => cell
                .number()
                .filter(|v| v.is_finite() && (0.0..=DURATION_S_MAX).contains(v))
                .map(Some)
                .ok_or_else(|| {
                    err(
                        field,
                        format!("{} is not a number of seconds", shown(field)),
                        "write a number between 0 and 315360000 (10 years)",
                    )
                }),
        }
    };
    let name_field = |field: &str| -> Result<Option<String>, TraceError> {
        match fields.get(field).map(Cell::text) {
            None => Ok(None),
            Some(Some(t)) if is_name(&t) => Ok(Some(t)),
            Some(_) => Err(err(
                field,
                format!("{} is not a valid name", shown(field)),
                "use 1-253 letters, digits, `-`, `_` or `.`",
            )),
        }
    };

    let id = integer("id", 0, u64::MAX >> 11, None)?;
    let submit_s = secs("submit_s", true)?.unwrap_or(0.0);
    let duration_s = secs("duration_s", true)?.unwrap_or(0.0);
    let project = name_field("project")?.ok_or_else(|| {
        err("project", "`project` is required".into(), "name the project that owns the job")
    })?;
    let gpus = integer("gpus", 0, u64::from(WHOLE_GPUS_PER_MEMBER_MAX), None)? as u32;
    let members = integer("members", 1, u64::from(MEMBERS_MAX), Some(1))? as u32;
    let gpu_milli = integer("gpu_milli", 1, 1000, Some(1000))? as u32;
    if gpu_milli < 1000 && gpus != 1 {
        return Err(err(
            "gpu_milli",
            format!("a fraction of a GPU ({gpu_milli}/1000) with gpus = {gpus}"),
            "a fractional member asks for one GPU: set gpus to 1, or gpu_milli to 1000",
        ));
    }
    let gpu_models = match fields.get("gpu_model") {
        None => Vec::new(),
        Some(Cell::List(names)) => names.iter().map(|n| (*n).to_owned()).collect(),
        Some(cell) => cell
            .text()
            .map(|t| t.split('|').map(|m| m.trim().to_owned()).collect())
            .unwrap_or_default(),
    };
    if let Some(bad) = gpu_models.iter().find(|m| !is_name(m) || m.as_str() == "any") {
        return Err(err(
            "gpu_model",
            format!("`{bad}` is not a GPU model name"),
            "list model names separated by `|`, e.g. `A100|H100`; leave empty for any",
        ));
    }
    let kind = match fields.get("kind").and_then(Cell::text) {
        None => None,
        Some(k) => Some(parse_kind(&k).ok_or_else(|| {
            err(
                "kind",
                format!("`{k}` is not a workload kind"),
                "write notebook, inference, service, training or batch (or leave it empty)",
            )
        })?),
    };
    let checkpoint_interval_s = secs("checkpoint_interval_s", false)?;
    if checkpoint_interval_s == Some(0.0) {
        return Err(err(
            "checkpoint_interval_s",
            "a checkpoint interval of 0 s".into(),
            "write a positive number of seconds, or leave it empty if the job never checkpoints",
        ));
    }
    let name = match fields.get("name").and_then(Cell::text) {
        Some(n) if !n.is_empty() && n.len() <= 253 => n,
        Some(_) => {
            return Err(err("name", "the name is too long".into(), "use at most 253 characters"));
        }
        None => format!("job-{id}"),
    };
    Ok(TraceJob {
        id,
        name,
        submit_s,
        duration_s,
        project,
        gpus,
        members,
        gpu_milli,
        gpu_models,
        kind,
        priority_class: name_field("priority_class")?,
        checkpoint_interval_s,
        cpu_milli: integer("cpu_milli", 0, 1 << 40, Some(0))?,
        memory_mib: integer("memory_mib", 0, 1 << 40, Some(0))?,
        line,
    })
}

/// The kind names of the trace format (the product's words).
pub fn parse_kind(s: &str) -> Option<WorkloadKind> {
    match s {
        "notebook" => Some(WorkloadKind::Notebook),
        "inference" => Some(WorkloadKind::Inference),
        "service" => Some(WorkloadKind::Service),
        "training" => Some(WorkloadKind::Training),
        "batch" => Some(WorkloadKind::Batch),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_matches_known_unix_times() {
        assert_eq!(parse_datetime("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_datetime("2017-09-04 10:30:41"), Some(1_504_521_041));
        assert_eq!(parse_datetime("2000-02-29 00:00:00"), Some(951_782_400));
        assert_eq!(parse_datetime("2017-02-29 00:00:00"), None);
        assert_eq!(parse_datetime("2017-9-4 10:30:41"), None);
        assert_eq!(parse_datetime("2017-09-04T10:30:41"), None);
    }

    #[test]
    fn philly_gangs_take_the_largest_divisor_that_fits_a_node() {
        let job = |n| PhillyJob {
            submit_s: 0,
            duration_s: 1.0,
            num_gpus: n,
            gpu_time_s: 1.0,
            vc: "v".into(),
            line: 2,
        };
        let shape = |n| {
            let t = job(n).to_trace_job(1, 8);
            (t.gpus, t.members)
        };
        assert_eq!(shape(1), (1, 1));
        assert_eq!(shape(8), (8, 1));
        assert_eq!(shape(12), (6, 2));
        assert_eq!(shape(16), (8, 2));
        assert_eq!(shape(24), (8, 3));
        assert_eq!(shape(128), (8, 16));
        assert_eq!(shape(0), (0, 1));
    }
}
