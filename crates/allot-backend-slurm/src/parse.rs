//! Pure parsers for what Slurm 22.05 prints: `squeue --json` and `sinfo --json` (data_parser
//! `openapi/v0.0.38`), `scontrol show partition -o`, host lists (`node[1-3,7]`) and GRES strings
//! (`gpu:h100:4(IDX:0-3)`). Missing or mistyped fields take neutral defaults: a payload from a
//! slightly different Slurm still parses, and no input panics.

use serde_json::Value;

/// Host lists longer than this are refused rather than expanded (a malformed `node[0-999999999]`
/// must not exhaust memory).
const MAX_HOSTS: usize = 100_000;

/// One job of `squeue --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqueueJob {
    pub job_id: u64,
    pub name: String,
    pub comment: String,
    pub account: String,
    pub partition: String,
    pub user: String,
    /// `job_state`: PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, …
    pub state: String,
    /// `state_reason`: JobHeldUser, BeginTime, NonZeroExitCode, None, …
    pub reason: String,
    /// The raw wait status (`exit_code`): code in bits 8–15, signal in bits 0–6.
    pub exit_status: i64,
    /// How often Slurm requeued the job (`restart_cnt`).
    pub restarts: u64,
    /// Nodes the job holds (expanded `nodes`); empty while pending.
    pub nodes: Vec<String>,
    /// Nodes it holds while running, nodes it asks for while pending (`node_count`).
    pub node_count: u64,
    /// Nodes the job asked for (`required_nodes`, expanded).
    pub required_nodes: Vec<String>,
    /// Per allocated node, in the order of `nodes`: the GPUs it holds there (`gres_detail`).
    pub gres_detail: Vec<Gres>,
    /// What the job asked for per node (`tres_per_node`, e.g. `gres:gpu:h100:4`).
    pub tres_per_node: String,
    /// What it asked for in all (`tres_per_job`: `--gpus=4` is `gres:gpu:4`).
    pub tres_per_job: String,
    /// What it asked for per task (`tres_per_task`: `--gpus-per-task`), and its task count.
    pub tres_per_task: String,
    pub tasks: u64,
    /// Where the batch script runs (or ran); empty if the job never ran.
    pub batch_host: String,
    /// Seconds since the epoch; for a pending job, Slurm's estimate (0 when none).
    pub start_time: u64,
    pub submit_time: u64,
}

/// Job states after which a job never runs again by itself.
const TERMINAL_STATES: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

impl SqueueJob {
    pub fn is_terminal(&self) -> bool {
        TERMINAL_STATES.contains(&self.state.as_str())
    }

    /// Running in Slurm's sense: the allocation exists and the batch script runs (or is being
    /// torn down).
    pub fn is_running(&self) -> bool {
        matches!(self.state.as_str(), "RUNNING" | "COMPLETING" | "SUSPENDED" | "STOPPED")
    }

    pub fn is_pending(&self) -> bool {
        matches!(self.state.as_str(), "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "CONFIGURING")
    }

    /// Whether the job got an allocation at some point (a job cancelled while pending did not).
    pub fn ran(&self) -> bool {
        !self.batch_host.is_empty() || !self.nodes.is_empty()
    }

    /// Held by a user or an administrator (`sbatch --hold`, `scontrol hold`, `scontrol
    /// requeuehold`: squeue's JSON says JobHeldUser for that, its `--Format` the description).
    pub fn is_held(&self) -> bool {
        self.is_pending()
            && matches!(
                self.reason.as_str(),
                "JobHeldUser" | "JobHeldAdmin" | "job requeued in held state"
            )
    }

    /// The program's exit code, or `None` when it ended by a signal.
    pub fn exit_code(&self) -> Option<i32> {
        exit_code_of(self.exit_status)
    }

    /// The signal that ended the program, if any.
    pub fn exit_signal(&self) -> Option<i32> {
        i32::try_from(self.exit_status & 0x7f).ok().filter(|s| *s != 0)
    }

    /// The GPUs it asks for on each of its `node_count` nodes, whichever way it asked:
    /// `--gres`/`--gpus-per-node` (per node), `--gpus` (per job) or `--gpus-per-task`, spread
    /// evenly. `Ok(None)`: no GPU. `Err`: a request that does not split into the same whole
    /// number of GPUs on every node — how many land where would be Slurm's choice, which allot
    /// cannot place — with the fix.
    pub fn gpu_request_per_node(&self) -> Result<Option<Gres>, String> {
        let gpu = |s: &str| parse_gres_list(s).into_iter().find(|g| g.name == "gpu");
        if let Some(g) = gpu(&self.tres_per_node) {
            return Ok(Some(g));
        }
        let nodes = self.node_count.max(1);
        let (g, total, how) = if let Some(g) = gpu(&self.tres_per_job) {
            let how = format!("--gpus={}", g.count);
            (g.clone(), g.count, how)
        } else if let Some(g) = gpu(&self.tres_per_task) {
            let tasks = self.tasks.max(1);
            if !tasks.is_multiple_of(nodes) {
                return Err(format!(
                    "it asks --gpus-per-task={} for {tasks} tasks on {nodes} nodes, which Slurm \
                     does not spread evenly; ask --gpus-per-node instead",
                    g.count
                ));
            }
            let how = format!("--gpus-per-task={} with {tasks} tasks", g.count);
            (g.clone(), g.count.saturating_mul(tasks), how)
        } else {
            return Ok(None);
        };
        if !total.is_multiple_of(nodes) {
            return Err(format!(
                "it asks {how} ({total} GPUs) on {nodes} nodes, which does not split into the \
                 same whole number per node; ask --gpus-per-node instead"
            ));
        }
        Ok(Some(Gres { count: total / nodes, indices: Vec::new(), ..g }))
    }

    /// Whether its GPU request names a type (`gpu:h100:2`): `Some(false)` for an untyped
    /// one (`--gres gpu:2`, `--gpus-per-node 2`, `--gpus 2`), `None` when it asks no GPU.
    /// Slurm refuses an update of `TresPerNode` whose typedness differs from the job's own
    /// request ("Invalid GRES specification (with and without type identification)").
    pub fn asks_typed_gpus(&self) -> Option<bool> {
        [&self.tres_per_node, &self.tres_per_job, &self.tres_per_task]
            .into_iter()
            .find_map(|tres| parse_gres_list(tres).into_iter().find(|g| g.name == "gpu"))
            .map(|g| g.gres_type.is_some())
    }

    /// GPUs held per node, `(node, gres)` (empty while pending or after the end).
    pub fn gpus_per_node(&self) -> Vec<(String, Gres)> {
        self.nodes.iter().cloned().zip(self.gres_detail.iter().cloned()).collect()
    }
}

/// The exit code in a wait status; `None` when a signal ended the process.
pub fn exit_code_of(status: i64) -> Option<i32> {
    if status & 0x7f != 0 {
        return None;
    }
    i32::try_from((status >> 8) & 0xff).ok()
}

/// One node of `sinfo --json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinfoNode {
    pub name: String,
    /// Base state, lower case: idle, mixed, allocated, down, …
    pub state: String,
    /// DRAIN, NOT_RESPONDING, MAINTENANCE, …
    pub state_flags: Vec<String>,
    pub reason: String,
    pub partitions: Vec<String>,
    pub cpus: u64,
    pub real_memory_mib: u64,
    /// Configured GRES (`gres`), one entry per name/type.
    pub gres: Vec<Gres>,
    /// GRES in use (`gres_used`).
    pub gres_used: Vec<Gres>,
}

impl SinfoNode {
    /// Whether Slurm will start work on the node: not down, drained, draining, failing or
    /// powered off.
    pub fn usable(&self) -> bool {
        let bad_state = ["down", "drained", "fail", "failing", "unknown", "future", "error"];
        let bad_flags = ["DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING", "POWERED_DOWN"];
        !bad_state.contains(&self.state.as_str())
            && !self.state_flags.iter().any(|f| bad_flags.contains(&f.as_str()))
    }

    /// GPUs configured on the node (every `gpu` GRES, any type).
    pub fn gpus(&self) -> Vec<&Gres> {
        self.gres.iter().filter(|g| g.name == "gpu").collect()
    }
}

/// One GRES entry: `gpu:h100:4(IDX:0-3)`, `gpu:8`, `gpu:h100:0(IDX:N/A)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gres {
    pub name: String,
    pub gres_type: Option<String>,
    pub count: u64,
    /// Device indices when Slurm names them (`IDX:`), else empty.
    pub indices: Vec<u32>,
}

/// One partition of `scontrol show partition -o`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    /// UP, DOWN, DRAIN, INACTIVE.
    pub state: String,
    pub nodes: Vec<String>,
    pub default: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or_default()
}

fn i64_of(v: &Value, key: &str) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or_default()
}

fn strings_of(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn document(text: &str, what: &str) -> Result<Value, ParseError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ParseError(format!("{what}: not JSON ({e}); is this Slurm 22.05?")))?;
    if let Some(errors) = v.get("errors").and_then(Value::as_array)
        && let Some(first) = errors.first()
    {
        let message = first
            .get("error")
            .or_else(|| first.get("description"))
            .and_then(Value::as_str)
            .unwrap_or("unknown error");
        return Err(ParseError(format!("{what}: Slurm reported an error: {message}")));
    }
    Ok(v)
}

/// Parses `squeue --json`. Jobs without a numeric `job_id` are skipped.
pub fn parse_squeue(text: &str) -> Result<Vec<SqueueJob>, ParseError> {
    let v = document(text, "squeue --json")?;
    let jobs = v
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or_else(|| ParseError("squeue --json: no \"jobs\" array".to_string()))?;
    Ok(jobs.iter().filter_map(job_of).collect())
}

fn job_of(j: &Value) -> Option<SqueueJob> {
    let job_id = j.get("job_id")?.as_u64()?;
    let nodes = expand_hostlist(&str_of(j, "nodes")).unwrap_or_default();
    let required_nodes = expand_hostlist(&str_of(j, "required_nodes")).unwrap_or_default();
    let gres_detail = strings_of(j, "gres_detail")
        .iter()
        .map(|d| parse_gres_list(d).into_iter().find(|g| g.name == "gpu"))
        .map(|g| {
            g.unwrap_or(Gres { name: "gpu".into(), gres_type: None, count: 0, indices: vec![] })
        })
        .collect();
    Some(SqueueJob {
        job_id,
        name: str_of(j, "name"),
        comment: str_of(j, "comment"),
        account: str_of(j, "account"),
        partition: str_of(j, "partition"),
        user: str_of(j, "user_name"),
        state: str_of(j, "job_state"),
        reason: str_of(j, "state_reason"),
        exit_status: i64_of(j, "exit_code"),
        restarts: u64_of(j, "restart_cnt"),
        nodes,
        node_count: u64_of(j, "node_count"),
        required_nodes,
        gres_detail,
        tres_per_node: str_of(j, "tres_per_node"),
        tres_per_job: str_of(j, "tres_per_job"),
        tres_per_task: str_of(j, "tres_per_task"),
        tasks: u64_of(j, "tasks"),
        batch_host: str_of(j, "batch_host"),
        start_time: u64_of(j, "start_time"),
        submit_time: u64_of(j, "submit_time"),
    })
}

/// The `squeue --Format` fields [`parse_squeue_format`] reads, in order: the job name last, so
/// a `|` in a name cannot shift the other fields.
pub const SQUEUE_FORMAT: &str = "JobID:|,State:|,Reason:|,exit_code:|,RestartCnt:|,BatchHost:|,\
     NodeList:|,NumNodes:|,tres-per-node:|,tres-per-job:|,tres-per-task:|,NumTasks:|,\
     Account:|,UserName:|,Partition:|,Comment:|,Name:";

/// Parses `squeue --noheader --states=all --Format=SQUEUE_FORMAT`: the fields observation and
/// the foreign-work listing need (id, name, comment, state, reason, wait status, restarts,
/// nodes, node count, GPU request per node, job and task, task count, account, user,
/// partition), at a tenth of the cost of `squeue --json` (which always lists every field of
/// every job). GPU indices, times and the required nodes stay empty. A `|` in a comment shifts it into the name: [`SqueueJob::comment`]
/// is then cut short and the name starts with the rest of it. Lines that do not parse are
/// skipped.
pub fn parse_squeue_format(text: &str) -> Vec<SqueueJob> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.splitn(17, '|').collect();
            let [
                id,
                state,
                reason,
                status,
                restarts,
                batch_host,
                nodes,
                node_count,
                tres_per_node,
                tres_per_job,
                tres_per_task,
                tasks,
                account,
                user,
                partition,
                comment,
                name,
            ] = f.as_slice()
            else {
                return None;
            };
            let unset = |v: &str| {
                if v == "(null)" || v.eq_ignore_ascii_case("n/a") {
                    String::new()
                } else {
                    v.to_string()
                }
            };
            Some(SqueueJob {
                job_id: id.trim().parse().ok()?,
                name: name.to_string(),
                comment: unset(comment),
                account: unset(account.trim()),
                partition: unset(partition.trim()),
                user: unset(user.trim()),
                state: state.trim().to_string(),
                reason: reason.trim().to_string(),
                exit_status: status.trim().parse().unwrap_or_default(),
                restarts: restarts.trim().parse().unwrap_or_default(),
                nodes: expand_hostlist(&unset(nodes.trim())).unwrap_or_default(),
                node_count: node_count.trim().parse().unwrap_or_default(),
                required_nodes: Vec::new(),
                gres_detail: Vec::new(),
                tres_per_node: unset(tres_per_node.trim()),
                tres_per_job: unset(tres_per_job.trim()),
                tres_per_task: unset(tres_per_task.trim()),
                // NO_VAL (4294967294) where Slurm has no count: unknown, 0.
                tasks: tasks.trim().parse().ok().filter(|&t| t < 0xFFFF_FFFE).unwrap_or_default(),
                batch_host: unset(batch_host.trim()),
                start_time: 0,
                submit_time: 0,
            })
        })
        .collect()
}

/// What `scontrol --oneliner show job --details ID` says of a job's allocation: its state and,
/// per node, the GPUs it holds there (the `Nodes=… GRES=gpu:TYPE:N(IDX:…)` groups).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobDetails {
    pub job_id: u64,
    pub state: String,
    pub gpus_per_node: Vec<(String, Gres)>,
}

/// Parses `scontrol -o show job -d ID` (one line per job; the first job is taken). A node
/// group without a GPU entry holds no GPU there. `None` when no `JobId=` is found.
pub fn parse_job_details(text: &str) -> Option<JobDetails> {
    let line = text.lines().find(|l| l.trim_start().starts_with("JobId="))?;
    let mut details = JobDetails::default();
    let mut group: Vec<String> = Vec::new();
    let flush = |group: &mut Vec<String>, gres: Option<Gres>, out: &mut Vec<(String, Gres)>| {
        let gres =
            gres.unwrap_or(Gres { name: "gpu".into(), gres_type: None, count: 0, indices: vec![] });
        out.extend(group.drain(..).map(|node| (node, gres.clone())));
    };
    for token in line.split_whitespace() {
        let Some((key, value)) = token.split_once('=') else { continue };
        match key {
            "JobId" => details.job_id = value.parse().ok()?,
            "JobState" => details.state = value.to_string(),
            "Nodes" => {
                flush(&mut group, None, &mut details.gpus_per_node);
                group = expand_hostlist(value).unwrap_or_default();
            }
            "GRES" if !group.is_empty() => {
                let gpu = parse_gres_list(value).into_iter().find(|g| g.name == "gpu");
                flush(&mut group, gpu, &mut details.gpus_per_node);
            }
            _ => {}
        }
    }
    flush(&mut group, None, &mut details.gpus_per_node);
    Some(details)
}

/// Parses `sinfo --json`. Nodes without a name are skipped.
pub fn parse_sinfo(text: &str) -> Result<Vec<SinfoNode>, ParseError> {
    let v = document(text, "sinfo --json")?;
    let nodes = v
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or_else(|| ParseError("sinfo --json: no \"nodes\" array".to_string()))?;
    Ok(nodes
        .iter()
        .filter_map(|n| {
            let name = n.get("name")?.as_str()?.to_string();
            Some(SinfoNode {
                name,
                state: str_of(n, "state").to_ascii_lowercase(),
                state_flags: strings_of(n, "state_flags"),
                reason: str_of(n, "reason"),
                partitions: strings_of(n, "partitions"),
                cpus: u64_of(n, "cpus"),
                real_memory_mib: u64_of(n, "real_memory"),
                gres: parse_gres_list(&str_of(n, "gres")),
                gres_used: parse_gres_list(&str_of(n, "gres_used")),
            })
        })
        .collect())
}

/// Parses `scontrol show partition -o` (one `Key=Value …` line per partition).
pub fn parse_partitions(text: &str) -> Vec<Partition> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<(&str, &str)> =
                line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
            let get = |k: &str| fields.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
            let name = get("PartitionName")?.to_string();
            Some(Partition {
                name,
                state: get("State").unwrap_or_default().to_string(),
                nodes: get("Nodes").and_then(|n| expand_hostlist(n).ok()).unwrap_or_default(),
                default: get("Default") == Some("YES"),
            })
        })
        .collect()
}

/// Splits at commas outside parentheses and brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth <= 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

/// Parses a GRES list such as `gpu:h100:8,shard:4` or `gpu:h100:2(IDX:0,3)`. `(null)`, `N/A`
/// and unparsable entries are dropped.
pub fn parse_gres_list(s: &str) -> Vec<Gres> {
    split_top_level(s).into_iter().filter_map(parse_gres).collect()
}

fn parse_gres(entry: &str) -> Option<Gres> {
    let entry = entry.strip_prefix("gres:").unwrap_or(entry);
    let (head, detail) = match entry.split_once('(') {
        Some((h, d)) => (h, Some(d.trim_end_matches(')'))),
        None => (entry, None),
    };
    let parts: Vec<&str> = head.split(':').collect();
    let (name, gres_type, count) = match parts.as_slice() {
        [name] => (*name, None, 1),
        [name, count] if count.parse::<u64>().is_ok() => (*name, None, count.parse().ok()?),
        [name, t] => (*name, Some(*t), 1),
        [name, t, count] => (*name, Some(*t), count.parse().ok()?),
        _ => return None,
    };
    if name.is_empty() || name == "(null)" || name == "N/A" {
        return None;
    }
    let indices = detail
        .and_then(|d| d.strip_prefix("IDX:"))
        .filter(|i| *i != "N/A")
        .and_then(|i| expand_ranges(i).ok())
        .unwrap_or_default();
    Some(Gres { name: name.to_string(), gres_type: gres_type.map(str::to_string), count, indices })
}

/// `0-3,5` → [0, 1, 2, 3, 5].
fn expand_ranges(s: &str) -> Result<Vec<u32>, ParseError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let bad = || ParseError(format!("bad index range {part:?}"));
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        if b < a || out.len() + (b - a) as usize >= MAX_HOSTS {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Expands a Slurm host list: `node[1-3,7],gpu-a[01-02]` → node1 node2 node3 node7 gpu-a01
/// gpu-a02 (zero padding kept). One bracket group per host name, as Slurm prints them.
pub fn expand_hostlist(s: &str) -> Result<Vec<String>, ParseError> {
    let mut hosts = Vec::new();
    for part in split_top_level(s) {
        let Some(open) = part.find('[') else {
            hosts.push(part.to_string());
            continue;
        };
        let bad = || ParseError(format!("bad host list {part:?}"));
        let close = part.rfind(']').filter(|c| *c > open).ok_or_else(bad)?;
        let (prefix, suffix) = (&part[..open], &part[close + 1..]);
        for range in part[open + 1..close].split(',') {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let width = a.len();
            let lo: u64 = a.parse().map_err(|_| bad())?;
            let hi: u64 = b.parse().map_err(|_| bad())?;
            if hi < lo || hosts.len() as u64 + (hi - lo) >= MAX_HOSTS as u64 {
                return Err(bad());
            }
            for i in lo..=hi {
                hosts.push(format!("{prefix}{i:0width$}{suffix}"));
            }
        }
    }
    Ok(hosts)
}

/// Parses `sbatch --parsable` output: `123` or `123;cluster`.
pub fn parse_sbatch_job_id(stdout: &str) -> Option<u64> {
    stdout.trim().split(';').next()?.trim().parse().ok()
}
