//! The verbs that read from or act on a running daemon through its REST API.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use allot_api::{
    NodeList, PolicyHistory, PolicyValidation, PolicyVersion, PolicyView, ProjectList, Report,
    ShadowReport, Why, Workload, WorkloadList, WorkloadState,
};
use anyhow::Result;

use crate::client::{Client, encode};
use crate::{EXIT_INVALID, Failure, Output, RemoteArgs, diff, render};

#[derive(Debug, clap::Args)]
pub(crate) struct OutputArgs {
    /// Output format: text for people, json for programs (the API's answer as received).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
}

#[derive(Debug, clap::Args)]
pub(crate) struct IdArgs {
    /// The workload's id (from `allot submit` or `allot ls`); a Slurm job id as
    /// `slurm:JOBID` (a job allot imported, or one of its own, named `<prefix>-W.A`); or a
    /// Kubernetes pod, pod group, Job or JobSet allot imported as `NAMESPACE/POD`,
    /// `NAMESPACE/group:NAME`, `NAMESPACE/job:NAME` or `NAMESPACE/jobset:NAME`.
    pub(crate) id: WorkloadRef,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// A workload named by allot's id, by the Slurm job that runs it (`slurm:JOBID`), or by the
/// Kubernetes object it is (`namespace/pod`, `namespace/group:NAME`, `namespace/job:NAME`,
/// `namespace/jobset:NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WorkloadRef {
    Id(u64),
    SlurmJob(u64),
    Kubernetes(String),
}

impl std::str::FromStr for WorkloadRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let number = |t: &str| t.parse::<u64>().ok();
        let kubernetes = |t: &str| {
            let (namespace, name) = t.split_once('/')?;
            let plain = |x: &str| !x.is_empty() && !x.contains(['/', '@', '~', ' ']);
            let name = ["job:", "jobset:", "group:"]
                .iter()
                .find_map(|prefix| name.strip_prefix(prefix))
                .unwrap_or(name);
            (plain(namespace) && plain(name)).then(|| WorkloadRef::Kubernetes(t.to_string()))
        };
        match s.strip_prefix("slurm:") {
            Some(job) => number(job)
                .map(WorkloadRef::SlurmJob)
                .ok_or_else(|| format!("{s:?}: a Slurm job id is a number, as in slurm:1234")),
            None => number(s).map(WorkloadRef::Id).or_else(|| kubernetes(s)).ok_or_else(|| {
                format!(
                    "{s:?}: give a workload id (a number), a Slurm job id as slurm:1234, or a \
                     Kubernetes pod, Job or JobSet as namespace/pod, namespace/job:name or \
                     namespace/jobset:name"
                )
            }),
        }
    }
}

/// The allot id of the workload `r` names. A Slurm job id is looked up among the workloads
/// allot imported (`foreign JOBID`), then, through `squeue` on this host, by the job's name:
/// allot's own jobs are named `<prefix>-W.A` (workload W, attempt A).
pub(crate) fn resolve(client: &Client, r: WorkloadRef) -> Result<u64> {
    let job = match r {
        WorkloadRef::Id(id) => return Ok(id),
        WorkloadRef::SlurmJob(job) => job,
        WorkloadRef::Kubernetes(name) => return resolve_kubernetes(client, &name),
    };
    let list = client.get::<WorkloadList>("/workloads")?.value;
    let handle = job.to_string();
    let imported = list
        .workloads
        .iter()
        .find(|w| matches!(w.command.as_slice(), [tag, h] if tag == "foreign" && *h == handle));
    if let Some(w) = imported {
        return Ok(w.id);
    }
    let squeue = std::process::Command::new("squeue")
        .args(["--noheader", "--states=all", "--format=%j", "--jobs", &handle])
        .output();
    let name = match &squeue {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => String::new(),
    };
    let own = name
        .rsplit_once('-')
        .filter(|(prefix, _)| prefix.starts_with("allot"))
        .and_then(|(_, run)| run.split_once('.')?.0.parse::<u64>().ok())
        .filter(|id| list.workloads.iter().any(|w| w.id == *id));
    own.ok_or_else(|| {
        let seen = match (&squeue, name.is_empty()) {
            (Err(e), _) => format!("squeue could not run here ({e})"),
            (Ok(out), _) if !out.status.success() => format!(
                "squeue failed here ({})",
                String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("no message").trim()
            ),
            (Ok(_), true) => "squeue does not list it (ended longer ago than MinJobAge?)".into(),
            (Ok(_), false) => format!("squeue names it {name:?}, not an allot job <prefix>-W.A"),
        };
        Failure::new(
            crate::EXIT_NOT_FOUND,
            format!(
                "Slurm job {job}: no workload allot imported has it, and {seen}; find the \
                 workload with `allot ls`\n"
            ),
        )
        .into()
    })
}

/// The newest workload allot imported from the Kubernetes object `namespace/name` (its
/// handle is the name with the object's uid after `@`, or a refusal's mark after `~`; a pod
/// deleted and created again under the name is another workload, the newest is meant).
fn resolve_kubernetes(client: &Client, name: &str) -> Result<u64> {
    let list = client.get::<WorkloadList>("/workloads")?.value;
    let of_object = |handle: &str| {
        handle
            .strip_prefix(name)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['@', '~']))
    };
    let found = list
        .workloads
        .iter()
        .filter(|w| matches!(w.command.as_slice(), [tag, h] if tag == "foreign" && of_object(h)))
        .map(|w| w.id)
        .max();
    found.ok_or_else(|| {
        Failure::new(
            crate::EXIT_NOT_FOUND,
            format!(
                "{name}: no workload allot imported is that pod, Job or JobSet (allot imports \
                 pods that ask for schedulerName: allot in a namespace the policy names, and \
                 Jobs and JobSets labelled allot.dev/queue); find the workload with `allot ls`\n"
            ),
        )
        .into()
    })
}

#[derive(Debug, clap::Args)]
pub(crate) struct ActArgs {
    /// The workloads' ids (from `allot submit` or `allot ls`). With several, each is looked up
    /// first: one that does not exist or is not yours changes nothing; then each is acted on in
    /// order (`--output json`: `{"workloads": […]}`).
    #[arg(required = true, num_args = 1..)]
    pub(crate) ids: Vec<u64>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LsArgs {
    /// Only this project's workloads.
    #[arg(long)]
    pub(crate) project: Option<String>,
    /// Only workloads in this state.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(WorkloadState::ALL.map(WorkloadState::as_str)))]
    pub(crate) state: Option<String>,
    /// Hide workloads that have ended (succeeded, failed, cancelled, rejected).
    #[arg(long, conflicts_with = "state")]
    pub(crate) active: bool,
    /// Only the workload this Slurm job runs (see `allot why slurm:JOBID`).
    #[arg(long, value_name = "JOBID")]
    pub(crate) slurm_job: Option<u64>,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LogsArgs {
    /// The workload's id.
    pub(crate) id: u64,
    /// Which gang member's output (0-based).
    #[arg(long, default_value_t = 0)]
    pub(crate) member: u32,
    /// Only the last B bytes (the daemon's default when absent).
    #[arg(long, value_name = "B")]
    pub(crate) tail_bytes: Option<u64>,
    /// Which run's output: 1 for the first (default: the latest). A requeue, pre-emption or
    /// resume starts the next run; each keeps its own output.
    #[arg(long, value_name = "N")]
    pub(crate) attempt: Option<u32>,
    /// Keep printing new output, polling every second, until the workload ends (or Ctrl-C).
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
}

pub(crate) fn ls(remote: &RemoteArgs, args: &LsArgs) -> Result<String> {
    let client = Client::new(remote)?;
    let mut query = Vec::new();
    if let Some(project) = &args.project {
        query.push(format!("project={}", encode(project)));
    }
    if let Some(state) = &args.state {
        query.push(format!("state={state}"));
    }
    let path = if query.is_empty() {
        "/workloads".to_string()
    } else {
        format!("/workloads?{}", query.join("&"))
    };
    let mut list = client.get::<WorkloadList>(&path)?;
    if let Some(job) = args.slurm_job {
        let id = resolve(&client, WorkloadRef::SlurmJob(job))?;
        list.value.workloads.retain(|w| w.id == id);
        list.edited = true;
        if let Some(items) = list.raw.get_mut("workloads").and_then(|w| w.as_array_mut()) {
            items.retain(|w| w.get("id").and_then(serde_json::Value::as_u64) == Some(id));
        }
    }
    if args.active {
        list.value.workloads.retain(|w| !w.state.is_final());
        list.edited = true;
        if let Some(items) = list.raw.get_mut("workloads").and_then(|w| w.as_array_mut()) {
            items.retain(|w| {
                w.get("state")
                    .and_then(|s| serde_json::from_value::<WorkloadState>(s.clone()).ok())
                    .is_none_or(|s| !s.is_final())
            });
        }
    }
    Ok(match args.output.output {
        Output::Json => list.pretty(),
        Output::Text => render::workloads(&list.value, render::now_ms()),
    })
}

pub(crate) fn why(remote: &RemoteArgs, args: &IdArgs) -> Result<String> {
    let client = Client::new(remote)?;
    let id = resolve(&client, args.id.clone())?;
    let why = client.get::<Why>(&format!("/workloads/{id}/why"))?;
    Ok(match args.output.output {
        Output::Json => why.pretty(),
        Output::Text => render::why(&why.value),
    })
}

/// `cancel`, `suspend` or `resume`.
pub(crate) fn act(remote: &RemoteArgs, args: &ActArgs, action: &str) -> Result<String> {
    let client = Client::new(remote)?;
    let ids = &args.ids;
    if ids.len() > 1 {
        // An unknown or forbidden id refuses the whole command before anything changed.
        for id in ids {
            client.get::<Workload>(&format!("/workloads/{id}"))?;
        }
    }
    let mut done = Vec::new();
    for id in ids {
        match client.post::<Workload>(&format!("/workloads/{id}/{action}"), None::<&()>) {
            Ok(workload) => done.push(workload),
            Err(e) => {
                // What was done stays said (as kill(1) does), then the error.
                if args.output.output == Output::Text {
                    let lines: String =
                        done.iter().map(|w| render::workload_line(&w.value)).collect();
                    crate::print_out(&lines);
                }
                return Err(e);
            }
        }
    }
    Ok(match (args.output.output, done.as_slice()) {
        (Output::Json, [one]) => one.pretty(),
        (Output::Json, all) => {
            let raw: Vec<&serde_json::Value> = all.iter().map(|w| &w.raw).collect();
            let mut text = serde_json::to_string_pretty(&serde_json::json!({ "workloads": raw }))
                .unwrap_or_default();
            text.push('\n');
            text
        }
        (Output::Text, all) => all.iter().map(|w| render::workload_line(&w.value)).collect(),
    })
}

/// How much of the log each `--follow` poll reads back; output beyond this in one second is
/// reported as skipped.
const FOLLOW_WINDOW_BYTES: u64 = 256 * 1024;
const FOLLOW_POLL: Duration = Duration::from_secs(1);

pub(crate) fn logs(remote: &RemoteArgs, args: &LogsArgs) -> Result<String> {
    let client = Client::new(remote)?;
    let path = |tail: Option<u64>| {
        let mut p = format!("/workloads/{}/logs?member={}", args.id, args.member);
        if let Some(attempt) = args.attempt {
            let _ = write!(p, "&attempt={attempt}");
        }
        if let Some(tail) = tail {
            let _ = write!(p, "&tail_bytes={tail}");
        }
        p
    };
    let first = client.get_text(&path(args.tail_bytes))?;
    if !args.follow {
        return Ok(first);
    }
    crate::print_out(&first);
    // The endpoint serves the tail of the log, not an offset: each poll reads a window and
    // prints what follows the previous window's end.
    let mut window = client.get_text(&path(Some(FOLLOW_WINDOW_BYTES)))?;
    loop {
        let ended =
            client.get::<Workload>(&format!("/workloads/{}", args.id))?.value.state.is_final();
        std::thread::sleep(if ended { Duration::ZERO } else { FOLLOW_POLL });
        let next = client.get_text(&path(Some(FOLLOW_WINDOW_BYTES)))?;
        match appended(&window, &next) {
            Some(new) => crate::print_out(new),
            None => {
                crate::print_out(
                    "\n[allot: output skipped: more than the follow window arrived in one poll]\n",
                );
                crate::print_out(&next);
            }
        }
        window = next;
        if ended {
            return Ok(String::new());
        }
    }
}

/// What `next` adds after `previous`, where both are tails of one growing log: `previous`
/// without its first k bytes is a prefix of `next` for the smallest such k. `None` when they do
/// not overlap (more arrived than one window holds).
fn appended<'a>(previous: &str, next: &'a str) -> Option<&'a str> {
    if previous.is_empty() {
        return Some(next);
    }
    (0..previous.len())
        .filter(|&k| previous.is_char_boundary(k))
        .find(|&k| next.starts_with(&previous[k..]))
        .map(|k| &next[previous.len() - k..])
}

pub(crate) fn projects(remote: &RemoteArgs, output: Output) -> Result<String> {
    let list = Client::new(remote)?.get::<ProjectList>("/projects")?;
    Ok(match output {
        Output::Json => list.pretty(),
        Output::Text => render::projects(&list.value),
    })
}

pub(crate) fn nodes(remote: &RemoteArgs, output: Output) -> Result<String> {
    let list = Client::new(remote)?.get::<NodeList>("/nodes")?;
    Ok(match output {
        Output::Json => list.pretty(),
        Output::Text => render::nodes(&list.value),
    })
}

pub(crate) fn report(remote: &RemoteArgs, output: Output) -> Result<String> {
    let report = Client::new(remote)?.get::<Report>("/report")?;
    Ok(match output {
        Output::Json => report.pretty(),
        Output::Text => render::report(&report.value),
    })
}

pub(crate) fn read_local(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        Failure::new(EXIT_INVALID, format!("{}: cannot read the file: {e}\n", path.display()))
            .into()
    })
}

/// What the daemon calls the policy text `POST /policy/validate` is sent.
const CANDIDATE: &str = "candidate policy";

/// `policy validate --remote`: the daemon checks the file against its inventory.
pub(crate) fn policy_validate(remote: &RemoteArgs, file: &Path, output: Output) -> Result<String> {
    let text = read_local(file)?;
    let validation =
        Client::new(remote)?.post_text::<PolicyValidation>("/policy/validate", &text)?;
    let rendered = match output {
        Output::Json => validation.pretty(),
        Output::Text => validation_text(file, &validation.value),
    };
    if validation.value.ok {
        Ok(rendered)
    } else {
        Err(Failure::new(EXIT_INVALID, rendered).into())
    }
}

/// `policy validate --remote`'s text: each problem at `file:line:col`, then the summary.
fn validation_text(file: &Path, validation: &PolicyValidation) -> String {
    let mut out = String::new();
    for p in &validation.problems {
        let field = p.field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default();
        let fix = p.fix.as_deref().map(|f| format!(" — fix: {f}")).unwrap_or_default();
        // The daemon names the text it was sent "candidate policy"; here it is this file, so
        // its problems read file:line:col as a local validate's do.
        let located = p
            .error
            .strip_prefix(CANDIDATE)
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.split_once(": "));
        match located {
            Some((at, message)) => {
                let _ = writeln!(out, "{}:{at}: {field}{message}{fix}", file.display());
            }
            None => {
                let _ = writeln!(out, "{}: {field}{}{fix}", file.display(), p.error);
            }
        }
    }
    let summary = validation.summary.trim_end();
    let summary = match summary.strip_prefix(CANDIDATE) {
        Some(rest) => format!("{}{rest}", file.display()),
        None => summary.to_string(),
    };
    let _ = writeln!(out, "{summary}");
    out
}

#[derive(Debug, clap::Args)]
pub(crate) struct PolicyShowArgs {
    /// A version of `allot policy history` instead of the active policy.
    #[arg(long, value_name = "N")]
    pub(crate) version: Option<u32>,
    /// Print the version's line diff against the version before it instead of its text.
    #[arg(long, requires = "version")]
    pub(crate) diff: bool,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

pub(crate) fn policy_show(remote: &RemoteArgs, args: &PolicyShowArgs) -> Result<String> {
    let client = Client::new(remote)?;
    let Some(version) = args.version else {
        let view = client.get::<PolicyView>("/policy")?;
        return Ok(match args.output.output {
            Output::Json => view.pretty(),
            Output::Text => with_newline(view.value.text),
        });
    };
    if args.diff {
        let history = client.get::<PolicyHistory>("/policy/versions")?.value;
        let Some(this) = history.versions.iter().find(|v| v.version == version) else {
            return Err(Failure::new(
                crate::EXIT_NOT_FOUND,
                format!("no policy version {version}; `allot policy history` lists them\n"),
            )
            .into());
        };
        let before = history.versions.iter().rev().find(|v| v.version < version);
        let (old, old_name) = match before {
            Some(b) => (b.text.as_str(), format!("version {} ({})", b.version, b.source)),
            None => ("", "nothing (the first version)".to_string()),
        };
        let new_name = format!("version {version} ({})", this.source);
        return diff::unified(old, &this.text, &old_name, &new_name)
            .map_err(|e| Failure::new(EXIT_INVALID, format!("{e}\n")).into());
    }
    let v = client.get::<PolicyVersion>(&format!("/policy/versions/{version}"))?;
    Ok(match args.output.output {
        Output::Json => v.pretty(),
        Output::Text => with_newline(v.value.text),
    })
}

fn with_newline(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// `policy history`: a line per version, the active one marked.
pub(crate) fn policy_history(remote: &RemoteArgs, output: Output) -> Result<String> {
    let history = Client::new(remote)?.get::<PolicyHistory>("/policy/versions")?;
    if output == Output::Json {
        return Ok(history.pretty());
    }
    let versions = &history.value.versions;
    let rows: Vec<Vec<String>> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let before = i.checked_sub(1).map_or("", |b| versions[b].text.as_str());
            let change = match diff::counts(before, &v.text) {
                Ok((added, removed)) if i > 0 => format!("+{added} -{removed} lines"),
                Ok(_) => "first".to_string(),
                Err(_) => "too large to compare".to_string(),
            };
            let mark = if v.version == history.value.active { "*" } else { "" };
            let source = match v.rollback_of {
                Some(n) => format!("{} (back to {n})", v.source),
                None => v.source.clone(),
            };
            vec![
                format!("{}{mark}", v.version),
                v.at_ms.map_or("first start".to_string(), render::utc),
                v.by.clone().unwrap_or_else(|| "policy file at start".to_string()),
                source,
                change,
            ]
        })
        .collect();
    let mut out = render::table(&["VERSION", "APPLIED", "BY", "SOURCE", "CHANGE"], &rows);
    for v in versions {
        if let Some(w) = &v.whatif {
            out.push_str(&whatif_line(v.version, w));
        }
    }
    out.push_str("* in effect; `allot policy show --version N [--diff]` prints one, `allot policy rollback [N]` brings one back\n");
    Ok(out)
}

/// The what-if shown before a version was applied, on one line: the version it was compared
/// with first, this version second.
fn whatif_line(version: u32, w: &allot_api::WhatIfShown) -> String {
    let (a, c) = (&w.active, &w.candidate);
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    let hours = |milli: u64| format!("{:.2}", milli as f64 / 1000.0);
    let fidelity = match w.fidelity_gap_pct {
        Some(pct) => format!(
            "; the replay of version {} was within {pct} % of what was recorded",
            w.active_version
        ),
        None => String::new(),
    };
    format!(
        "version {version} was shown what-if #{} ({} workloads, against version {}): wait p50 {} → {}, \
         p95 {} → {}; GPU-h {} → {}; lost GPU-h {} → {}; pre-emptions {} → {}{fidelity}\n",
        w.run,
        w.jobs,
        w.active_version,
        secs(a.wait_p50_ms),
        secs(c.wait_p50_ms),
        secs(a.wait_p95_ms),
        secs(c.wait_p95_ms),
        hours(a.allocated_milli_gpu_hours),
        hours(c.allocated_milli_gpu_hours),
        hours(a.lost_milli_gpu_hours),
        hours(c.lost_milli_gpu_hours),
        a.preemptions,
        c.preemptions,
    )
}

/// `policy apply FILE --shadow`: the candidate decides beside the active policy from now on.
pub(crate) fn shadow_start(remote: &RemoteArgs, file: &Path, output: Output) -> Result<String> {
    let text = read_local(file)?;
    let source = file.display().to_string();
    let path = format!("/policy/shadow?source={}", percent_encode(&source));
    let report = Client::new(remote)?.put_text::<ShadowReport>(&path, &text)?;
    Ok(match output {
        Output::Json => report.pretty(),
        Output::Text => format!(
            "in shadow: {} decides beside the active policy at every cycle, nothing of it \
             executed; `allot policy shadow` shows what it would have done differently{}\n",
            report.value.source,
            if report.value.idle_compared {
                ""
            } else {
                " (idle reclaims are not compared: its idle rules differ from the active ones)"
            }
        ),
    })
}

/// `policy shadow [--stop]`: the shadow's report, per project.
pub(crate) fn shadow_report(remote: &RemoteArgs, stop: bool, output: Output) -> Result<String> {
    let client = Client::new(remote)?;
    let report = if stop {
        client.delete::<ShadowReport>("/policy/shadow")?
    } else {
        client.get::<ShadowReport>("/policy/shadow")?
    };
    if output == Output::Json {
        return Ok(report.pretty());
    }
    let r = &report.value;
    let mut out = format!(
        "{} in shadow since {} (by {}): {} cycle(s) compared",
        r.source,
        render::utc(r.since_ms),
        r.by,
        r.cycles
    );
    if r.failed_cycles > 0 {
        let why = r.last_failure.as_deref().unwrap_or("unknown");
        out.push_str(&format!(
            ", {} not (it could not take the live work: {why})",
            r.failed_cycles
        ));
    }
    out.push_str(if stop { "; stopped\n" } else { "\n" });
    let rows: Vec<Vec<String>> = r
        .projects
        .iter()
        .map(|p| {
            let saved = (p.wait_saved_ms / 1000)
                .checked_div(p.admitted_since)
                .map_or_else(|| "-".to_string(), |s| format!("{s} s"));
            vec![
                p.project.clone(),
                p.sooner.to_string(),
                p.admitted_since.to_string(),
                saved,
                p.held_back.to_string(),
                format!("{} / {}", p.preempted_active, p.preempted_candidate),
                if r.idle_compared {
                    format!("{} / {}", p.reclaimed_active, p.reclaimed_candidate)
                } else {
                    "not compared".to_string()
                },
            ]
        })
        .collect();
    out.push_str(&render::table(
        &[
            "PROJECT",
            "SOONER",
            "ADMITTED SINCE",
            "MEAN SAVED",
            "HELD BACK",
            "PREEMPTED A/C",
            "RECLAIMED A/C",
        ],
        &rows,
    ));
    out.push_str(
        "SOONER: workloads the candidate would have started while the active policy kept them \
         waiting (ADMITTED SINCE of them the active policy started later, MEAN SAVED sooner on \
         average); HELD BACK: started by the active policy, kept waiting by the candidate; A/C: \
         distinct workloads stopped by the active policy / by the candidate\n",
    );
    Ok(out)
}

/// `policy rollback`: an earlier version becomes the policy in effect, as a new version.
pub(crate) fn policy_rollback(
    remote: &RemoteArgs,
    version: Option<u32>,
    output: Output,
) -> Result<String> {
    let path = match version {
        Some(v) => format!("/policy/rollback?version={v}"),
        None => "/policy/rollback".to_string(),
    };
    let view = Client::new(remote)?.post::<PolicyView>(&path, None::<&()>)?;
    Ok(match output {
        Output::Json => view.pretty(),
        Output::Text => format!(
            "rolled back: the daemon's policy is now version {}, {}\n",
            view.value.version, view.value.source
        ),
    })
}

/// `policy apply`: the daemon moves its live work to the policy in FILE, or names every
/// problem (exit 1) and changes nothing.
pub(crate) fn policy_apply(
    remote: &RemoteArgs,
    file: &Path,
    rollout: &RolloutArgs,
    output: Output,
) -> Result<String> {
    let text = read_local(file)?;
    let source = file.display().to_string();
    let mut path = format!("/policy?source={}", percent_encode(&source));
    if let Some(scope) = &rollout.scope {
        let _ = write!(path, "&scope={}", percent_encode(scope));
        if !rollout.rollback_if.is_empty() {
            let _ = write!(path, "&rollback_if={}", percent_encode(&rollout.rollback_if.join(",")));
        }
        for (key, value) in [
            ("baseline", &rollout.baseline),
            ("false_reclaim_within", &rollout.false_reclaim_within),
        ] {
            if let Some(v) = value {
                let _ = write!(path, "&{key}={}", percent_encode(v));
            }
        }
        if let Some(n) = rollout.min_sample {
            let _ = write!(path, "&min_sample={n}");
        }
    }
    let view = Client::new(remote)?.put_text::<PolicyView>(&path, &text)?;
    Ok(match output {
        Output::Json => view.pretty(),
        Output::Text => {
            let mut out = format!(
                "applied: the daemon's policy is now version {}, {}\n",
                view.value.version, view.value.source
            );
            if let Some(r) = view.value.rollout.as_ref().filter(|_| rollout.scope.is_some()) {
                out.push_str(&rollout_text(r));
            }
            out
        }
    })
}

/// `policy apply … --scope`: a scoped rollout and its rollback conditions.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct RolloutArgs {
    /// Apply the candidate's rules to one scope only, the active policy's elsewhere:
    /// `project=NAME` (its quotas and settings, and idle rules for its work), `pool=MODEL`
    /// (every project's quota line for that GPU model) or `kind=KIND` (idle rules for that
    /// kind of work).
    #[arg(long)]
    pub scope: Option<String>,
    /// Roll the scope back by itself when this holds for the scope's work since the rollout
    /// (repeatable): `METRIC>LIMIT` or `METRIC>FACTORx` (against the baseline). Metrics:
    /// failure_rate, p95_wait (s), lost_gpu_hours_per_day, gpu_hours_per_finished,
    /// false_idle_reclaims.
    #[arg(long = "rollback-if", requires = "scope", value_name = "CONDITION")]
    pub rollback_if: Vec<String>,
    /// The window before the rollout its figures are compared with (default 7d).
    #[arg(long, requires = "scope", value_name = "DURATION")]
    pub baseline: Option<String>,
    /// An idle reclaim its user undoes (resume, or the same name submitted again) within
    /// this long counts as false (default 30m).
    #[arg(long, requires = "scope", value_name = "DURATION")]
    pub false_reclaim_within: Option<String>,
    /// Observations a window needs before an average or percentile is judged (default 5).
    #[arg(long, requires = "scope", value_name = "N")]
    pub min_sample: Option<u64>,
}

/// A rollout as lines for a person.
fn rollout_text(r: &allot_api::RolloutView) -> String {
    let mut out = format!(
        "rollout: version {} applies {} to {} (since {}; a rollback brings back version {})\n",
        r.version,
        r.candidate,
        r.scope,
        render::utc(r.since_ms),
        r.base_version
    );
    let _ = writeln!(out, "  carried: {}", r.carried.join(", "));
    let left_out =
        if r.left_out.is_empty() { "nothing".to_string() } else { r.left_out.join(", ") };
    let _ = writeln!(out, "  left out (as version {} has them): {left_out}", r.base_version);
    match &r.ended {
        Some(how) => {
            let _ = writeln!(out, "  ended: {how}");
        }
        None => out.push_str("  in effect\n"),
    }
    if r.conditions.is_empty() {
        out.push_str("  no rollback conditions: only an admin ends it\n");
        return out;
    }
    let _ = writeln!(out, "  baseline: the {} before the rollout", render::duration(r.baseline_ms));
    let figure = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let rows: Vec<Vec<String>> = r
        .conditions
        .iter()
        .map(|c| {
            vec![
                c.condition.clone(),
                format!("{} ({})", figure(c.baseline), c.baseline_samples),
                format!("{} ({})", figure(c.current), c.samples),
                c.state.clone(),
            ]
        })
        .collect();
    out.push_str(&render::table(&["CONDITION", "BASELINE (N)", "SINCE (N)", "STATE"], &rows));
    out
}

/// `policy rollout`: the rollout in effect, or the last one.
pub(crate) fn policy_rollout(remote: &RemoteArgs, output: Output) -> Result<String> {
    let view = Client::new(remote)?.get::<PolicyView>("/policy")?;
    match (&view.value.rollout, output) {
        (None, _) => Err(Failure::new(
            EXIT_INVALID,
            "no scoped rollout: start one with `allot policy apply FILE --scope project=NAME \
             --rollback-if 'p95_wait>1.5x'`\n",
        )
        .into()),
        (Some(r), Output::Json) => Ok(serde_json::to_string_pretty(r)? + "\n"),
        (Some(r), Output::Text) => Ok(rollout_text(r)),
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986), for a query value.
fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub(crate) fn policy_diff(remote: &RemoteArgs, file: &Path) -> Result<String> {
    let local = read_local(file)?;
    let view = Client::new(remote)?.get::<PolicyView>("/policy")?;
    let active = format!("active ({})", view.value.source);
    diff::unified(&view.value.text, &local, &active, &file.display().to_string())
        .map_err(|e| Failure::new(EXIT_INVALID, format!("{}: {e}\n", file.display())).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_validation_problems_read_file_line_col() {
        let validation = PolicyValidation {
            ok: false,
            summary: "candidate policy: 1 problem(s)".into(),
            problems: vec![allot_api::ApiError {
                error: "candidate policy:7:5: unknown field `gpu`".into(),
                field: Some("projects[0].quota".into()),
                fix: Some("write `gpus`".into()),
            }],
        };
        let text = validation_text(Path::new("policy.yaml"), &validation);
        assert_eq!(
            text,
            "policy.yaml:7:5: projects[0].quota: unknown field `gpu` — fix: write `gpus`\n\
             policy.yaml: 1 problem(s)\n"
        );
    }

    #[test]
    fn follow_prints_only_what_was_appended() {
        assert_eq!(appended("", "abc"), Some("abc"));
        // The log is shorter than the window: the new window extends the old one.
        assert_eq!(appended("abc", "abcdef"), Some("def"));
        // The window slid: its start dropped off.
        assert_eq!(appended("abcdef", "cdefgh"), Some("gh"));
        assert_eq!(appended("abc", "abc"), Some(""));
        assert_eq!(appended("abcdef", "xyz"), None);
    }
}
