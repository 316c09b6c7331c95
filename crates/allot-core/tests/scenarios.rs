//! Scenario tests: every `tests/scenarios/*.scn` file is a small script (cluster, policy,
//! events, `decide`/`explain` steps) followed by `== expect ==` and the output it must print.
//! One `check` helper runs them all; `UPDATE_EXPECT=1 cargo test -p allot-core --test
//! scenarios` rewrites the expectations (read the diff before committing it).
//!
//! Script lines (one per line; `#` starts a comment):
//! ```text
//! node NAME MODELxN[@ISLAND][+mig] ... [cpu=CORES] [mem=GIB] [rack=R] [pool=P]   # +mig: MIG-enabled
//! class NAME VALUE [fixed]             # `fixed`: not preemptible
//! default CLASS                        # default priority class (first class if absent)
//! half-life MS                         # fair-share half-life (default 0)
//! mode suspend|requeue|delete          # default pre-emption mode
//! defrag [restart=MS]                  # defragmentation on (restart cost per GPU, default 2 min)
//! reserve after=MS [max=N]             # reservations on: after this wait, at most N per model
//!                                      # (default 2)
//! restart-cost MS                      # the arbiter's restart cost per victim GPU (default 2 min)
//! backoff MS                           # first idle resume backoff (default 5 min)
//! guard [after-restart=MS] [cap=COUNT/WINDOW_MS] [reclaim-after=MS]
//!                                      # protection from pre-emption thrash;
//!                                      # without this line the policy file's default
//!                                      # (2 min after a restart, no cap, reclaim at once);
//!                                      # given: 0, none, 0
//! idle-rule NAME [projects=A|B] [kinds=notebook|..] [exempt=CLASS|..]
//!              [model=allot|amd_rm|runai] [threshold=PCT] [timer=MS] [sustain=MS]
//!              [missing=hold|idle|active] [grace=MS] [when=on_pressure|always|report_only]
//!              [action=suspend|requeue|delete] [warn=MS]   # defaults: allot's (10 %, 15 min,
//!                                      # 60 s, hold, 5 min grace, on_pressure, suspend, warn 0)
//!              [quiet=MS] [quiet-below=PCT] [quiet-window=MS]  # allot's quiet timer (none,
//!                                      # 25 %, 15 min)
//! project NAME [cohort=C] [dept=D] [weight=W] [fifo=strict] [mode=M]
//!              [quota=MODEL:G,...] [borrow=MODEL:B,...] [lend=MODEL:L,...]
//! fair-sharing [strategies=final,initial]  # fair-sharing pre-emption (Kueue's S2-a, S2-b)
//! cohort NAME [parent=P] [quota=MODEL:G,...] [borrow=..] [lend=..]  # quota of its own, a
//!                                      # parent cohort (hierarchical quota)
//!              [within=lower|lower-or-newer-equal|never]   # in-project pre-emption (lower)
//!              [borrow-within=lower|THRESHOLD]  # reclaim while borrowing, from work below
//!                                      # the claimant (and at most THRESHOLD)
//! submit NAME PROJECT gpus=N|0.5|3g.40gb [members=N] [class=C] [models=A|B]
//!              [same-node|prefer-same-node]
//!              [cpu=CORES] [mem=GIB] [min-runtime=MS] [max-runtime=MS] [fixed]
//!              [checkpoint=GRACE_MS] [deadline=MS] [kind=notebook|..] at=MS
//! start|fail|stop|finish|cancel|checkpoint NAME|id:N at=MS  # id:N: a raw id, maybe unknown
//! sample NAME [util=P,..] [sm=P,..] [engine=P,..] at=MS  # telemetry, percent per allocated
//!                                      # device in placement order (one value: every device);
//!                                      # no value at all: telemetry missing
//! samples NAME from=MS to=MS every=MS [util=..] [sm=..] [engine=..]  # the same, repeated
//! probe NAME last=MS at=MS             # an application probe saw activity at `last`
//! decide at=MS                         # prints each decision
//! news at=MS                           # the simulator's cycle (`decide_news`, kinds only):
//!                                      # prints what is new to each workload
//! settle at=MS                         # decide, then start every admit and stop every
//!                                      # victim, until nothing changes; prints it all
//! explain NAME at=MS                   # prints `why`
//! usage PROJECT                        # prints the project's quota lines
//! ```
//! `gpus=N` (an integer) asks N whole GPUs per member; a number with a decimal point asks that
//! fraction of one device (`gpus=3g.40gb`: one MIG instance of that profile), rounded to shares (`gpus=0.25` is 250 shares, `gpus=0.0001` is 0
//! shares and `gpus=1.5` is 1500 shares, both invalid). `gpus=0` is a CPU-only workload.
//!
//! The engine's invariants (`Engine::audit`) are checked after every step.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use allot_core::idle::{DeviceReading, IdleRule, MissingTelemetry};
use allot_core::{
    BorrowWithinCohort, Checkpointing, CohortSpec, Decision, Defragmentation, DeviceSpec, Engine,
    Event, FairShareStrategy, FairSharing, GpuRequest, IdlePolicySpec, IdleWhen, MigProfile,
    NodeSpec, PolicySpec, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing, QuotaModel,
    QuotaSpec, Refresh, Shares, Timestamp, WithinProject, WorkloadId, WorkloadKind, WorkloadSpec,
};

const EXPECT_MARK: &str = "== expect ==";

#[test]
fn scenarios() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("scenario dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "scn"))
        .collect();
    files.sort();
    let update = std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for file in &files {
        if let Err(msg) = check(file, update) {
            failures.push(format!("{}: {msg}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(files.len() >= 45, "expected at least 45 scenarios, found {}", files.len());
}

/// Runs one scenario file and compares (or, with `update`, rewrites) its expectation.
fn check(file: &Path, update: bool) -> Result<(), String> {
    let text = fs::read_to_string(file).map_err(|e| e.to_string())?;
    let (script, expected) = match text.split_once(EXPECT_MARK) {
        Some((s, e)) => (s, e.trim_start_matches('\n')),
        None => (text.as_str(), ""),
    };
    let actual = run(script)?;
    if actual == expected {
        return Ok(());
    }
    if update {
        let blessed = format!("{}{EXPECT_MARK}\n{actual}", script.trim_end().to_string() + "\n\n");
        fs::write(file, blessed).map_err(|e| e.to_string())?;
        return Ok(());
    }
    Err(format!(
        "output differs (UPDATE_EXPECT=1 to bless)\n--- expected\n{expected}--- actual\n{actual}"
    ))
}

#[derive(Default)]
struct Setup {
    nodes: Vec<NodeSpec>,
    classes: Vec<PriorityClassSpec>,
    default_class: Option<String>,
    half_life_ms: u64,
    mode: PreemptionMode,
    projects: Vec<ProjectSpec>,
    defrag: Option<Defragmentation>,
    idle: Vec<IdlePolicySpec>,
    restart_cost_ms: Option<u64>,
    backoff_ms: Option<u64>,
    cohorts: Vec<CohortSpec>,
    fair_sharing: Option<FairSharing>,
    guard: allot_core::PreemptionGuard,
    reservations: Option<allot_core::Reservations>,
}

struct Run {
    engine: Engine,
    ids: BTreeMap<String, WorkloadId>,
    next_id: u64,
    out: String,
}

fn run(script: &str) -> Result<String, String> {
    let mut setup = Setup::default();
    let mut state: Option<Run> = None;
    for (n, raw) in script.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let ctx = |e: String| format!("line {}: {e}: {raw}", n + 1);
        let is_setup = matches!(
            words[0],
            "node"
                | "class"
                | "default"
                | "half-life"
                | "mode"
                | "project"
                | "cohort"
                | "fair-sharing"
                | "defrag"
                | "restart-cost"
                | "backoff"
                | "guard"
                | "idle-rule"
                | "reserve"
        );
        if is_setup {
            if state.is_some() {
                return Err(ctx("setup lines must come before events".into()));
            }
            setup_line(&mut setup, &words).map_err(ctx)?;
            continue;
        }
        if state.is_none() {
            state = Some(build(&setup).map_err(ctx)?);
        }
        let run = state.as_mut().ok_or("no engine")?;
        step(run, &words).map_err(ctx)?;
        run.engine.audit().map_err(|e| ctx(format!("invariant broken: {e}")))?;
    }
    Ok(state.map(|s| s.out).unwrap_or_default())
}

fn kv<'a>(words: &'a [&'a str]) -> BTreeMap<&'a str, &'a str> {
    words.iter().filter_map(|w| w.split_once('=')).collect()
}

fn flag(words: &[&str], name: &str) -> bool {
    words.contains(&name)
}

fn num(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("not a number: {s}"))
}

fn gpus(s: &str) -> Result<Shares, String> {
    let v: f64 = s.parse().map_err(|_| format!("not a GPU count: {s}"))?;
    Ok(Shares((v * 1000.0).round() as u64))
}

fn setup_line(setup: &mut Setup, words: &[&str]) -> Result<(), String> {
    let args = kv(words);
    match words[0] {
        "node" => {
            let name = words.get(1).ok_or("node needs a name")?.to_string();
            let mut devices = Vec::new();
            for w in &words[2..] {
                if w.contains('=') {
                    continue;
                }
                let (w, mig) = match w.strip_suffix("+mig") {
                    Some(w) => (w, true),
                    None => (*w, false),
                };
                let (model, rest) = w.split_once('x').ok_or(format!("bad device group {w}"))?;
                let (count, island) = match rest.split_once('@') {
                    Some((c, i)) => (num(c)?, num(i)? as u32),
                    None => (num(rest)?, 0),
                };
                for _ in 0..count {
                    devices.push(DeviceSpec {
                        model: model.to_string(),
                        memory_mib: 81920,
                        island,
                        mig,
                    });
                }
            }
            setup.nodes.push(NodeSpec {
                name,
                cpu_millis: args.get("cpu").map_or(Ok(128), |c| num(c))? * 1000,
                memory_mib: args.get("mem").map_or(Ok(1024), |m| num(m))? * 1024,
                labels: BTreeMap::new(),
                pool: args.get("pool").map(|s| s.to_string()),
                rack: args.get("rack").map(|s| s.to_string()),
                devices,
            });
        }
        "class" => setup.classes.push(PriorityClassSpec {
            name: words.get(1).ok_or("class needs a name")?.to_string(),
            value: words.get(2).ok_or("class needs a value")?.parse().map_err(|_| "bad value")?,
            preemptible: !flag(words, "fixed"),
        }),
        "default" => {
            setup.default_class = Some(words.get(1).ok_or("default needs a class")?.to_string())
        }
        "half-life" => setup.half_life_ms = num(words.get(1).ok_or("half-life needs ms")?)?,
        "mode" => setup.mode = mode(words.get(1).ok_or("mode needs a value")?)?,
        "defrag" => {
            setup.defrag = Some(Defragmentation {
                restart_cost_ms: args
                    .get("restart")
                    .map_or(Ok(Defragmentation::DEFAULT_RESTART_COST_MS), |r| num(r))?,
                consolidate_shares: args.get("consolidate").is_some_and(|v| *v == "yes"),
                victims_max: args
                    .get("victims-max")
                    .map(|v| num(v).map(|n| n as u32))
                    .transpose()?,
            })
        }
        "fair-sharing" => {
            setup.fair_sharing = Some(match args.get("strategies") {
                None => FairSharing::default(),
                Some(list) => FairSharing {
                    strategies: list
                        .split(',')
                        .map(|s| match s {
                            "final" => Ok(FairShareStrategy::LessThanOrEqualToFinalShare),
                            "initial" => Ok(FairShareStrategy::LessThanInitialShare),
                            other => Err(format!("unknown strategy {other}: final or initial")),
                        })
                        .collect::<Result<_, _>>()?,
                },
            })
        }
        "cohort" => {
            setup.cohorts.push(CohortSpec {
                name: words.get(1).ok_or("cohort needs a name")?.to_string(),
                parent: args.get("parent").map(|s| s.to_string()),
                quotas: quota_lines(&args)?,
            });
        }
        "project" => {
            let quotas = quota_lines(&args)?;
            setup.projects.push(ProjectSpec {
                name: words.get(1).ok_or("project needs a name")?.to_string(),
                cohort: args.get("cohort").map(|s| s.to_string()),
                department: args.get("dept").map(|s| s.to_string()),
                quotas,
                weight_milli: args.get("weight").map_or(Ok(1000), |w| gpus(w).map(|s| s.0))?,
                queueing: if args.get("fifo") == Some(&"strict") {
                    Queueing::StrictFifo
                } else {
                    Queueing::BestEffortFifo
                },
                preemption_mode: args.get("mode").map(|m| mode(m)).transpose()?,
                preempt_within_project: match args.get("within").copied() {
                    None | Some("lower") => WithinProject::LowerPriority,
                    Some("lower-or-newer-equal") => WithinProject::LowerOrNewerEqualPriority,
                    Some("never") => WithinProject::Never,
                    Some(other) => return Err(format!("unknown within={other}")),
                },
                borrow_within_cohort: match args.get("borrow-within").copied() {
                    None => None,
                    Some("lower") => Some(BorrowWithinCohort { max_priority_threshold: None }),
                    Some(t) => Some(BorrowWithinCohort {
                        max_priority_threshold: Some(
                            t.parse()
                                .map_err(|_| format!("borrow-within={t}: lower or a number"))?,
                        ),
                    }),
                },
            });
        }
        "restart-cost" => {
            setup.restart_cost_ms = Some(num(words.get(1).ok_or("restart-cost needs ms")?)?)
        }
        "backoff" => setup.backoff_ms = Some(num(words.get(1).ok_or("backoff needs ms")?)?),
        // `guard after-restart=MS [cap=COUNT/WINDOW_MS] [reclaim-after=MS]`: the policy's
        // protection from thrash, and a claimant's reclaim delay.
        "guard" => {
            setup.guard.exempt_after_restart_ms =
                args.get("after-restart").map_or(Ok(0), |ms| num(ms))?;
            setup.guard.reclaim_after_ms = args.get("reclaim-after").map_or(Ok(0), |ms| num(ms))?;
            setup.guard.limit = match args.get("cap") {
                None => None,
                Some(cap) => {
                    let (count, window) = cap.split_once('/').ok_or("cap=COUNT/WINDOW_MS")?;
                    Some(allot_core::PreemptionLimit {
                        count: num(count)? as u32,
                        window_ms: num(window)?,
                    })
                }
            };
        }
        "idle-rule" => setup.idle.push(idle_rule(words, &args)?),
        "reserve" => {
            setup.reservations = Some(allot_core::Reservations {
                after_ms: num(args.get("after").ok_or("reserve needs after=MS")?)?,
                per_model_max: args.get("max").map_or(Ok(2), |n| num(n))? as u32,
                hold_quota: args.get("hold_quota").is_some_and(|v| *v == "1"),
            })
        }
        other => return Err(format!("unknown setup {other}")),
    }
    Ok(())
}

/// `quota=MODEL:G,... borrow=MODEL:B,... lend=MODEL:L,...` of a project or cohort line.
fn quota_lines(args: &BTreeMap<&str, &str>) -> Result<Vec<QuotaSpec>, String> {
    let mut quotas: BTreeMap<String, QuotaSpec> = BTreeMap::new();
    for (field, slot) in [("quota", 0), ("borrow", 1), ("lend", 2)] {
        let Some(list) = args.get(field) else { continue };
        for item in list.split(',') {
            let (model, amount) = item.split_once(':').ok_or(format!("bad {field} {item}"))?;
            let q = quotas.entry(model.to_string()).or_insert_with(|| QuotaSpec {
                model: if model == "any" {
                    QuotaModel::Any
                } else {
                    QuotaModel::Model(model.to_string())
                },
                guaranteed: Shares::ZERO,
                borrow_limit: None,
                lend_limit: None,
            });
            let v = gpus(amount)?;
            match slot {
                0 => q.guaranteed = v,
                1 => q.borrow_limit = Some(v),
                _ => q.lend_limit = Some(v),
            }
        }
    }
    Ok(quotas.into_values().collect())
}

fn idle_rule(words: &[&str], args: &BTreeMap<&str, &str>) -> Result<IdlePolicySpec, String> {
    let list = |key: &str| -> Vec<String> {
        args.get(key).map(|v| v.split('|').map(String::from).collect()).unwrap_or_default()
    };
    let timer = args.get("timer").map(|t| num(t)).transpose()?;
    // Per model, the defaults a policy file gets: AMD deletes on pressure, Run:ai suspends
    // always, allot suspends on pressure.
    let (mut rule, default_when, default_action) =
        match args.get("model").copied().unwrap_or("allot") {
            "allot" => (IdleRule::allot_default(), "on_pressure", "suspend"),
            "amd_rm" => (IdleRule::amd_rm(100, 15 * 60_000), "on_pressure", "delete"),
            "runai" => (IdleRule::runai(15 * 60_000), "always", "suspend"),
            other => return Err(format!("unknown idle model {other}")),
        };
    if let Some(t) = timer {
        rule.idle_timer_ms = t;
    }
    if let Some(p) = args.get("threshold") {
        rule.threshold_permille = (num(p)? * 10) as u16;
    }
    if let Some(s) = args.get("sustain") {
        rule.sustain_ms = num(s)?;
    }
    if let Some(g) = args.get("grace") {
        rule.min_runtime_ms = num(g)?;
    }
    if let Some(q) = args.get("quiet") {
        rule.quiet_timer_ms = num(q)?;
    }
    if let Some(b) = args.get("quiet-below") {
        rule.quiet_below_permille = (num(b)? * 10) as u16;
    }
    if let Some(w) = args.get("quiet-window") {
        rule.quiet_window_ms = num(w)?;
    }
    if let Some(m) = args.get("missing") {
        rule.missing = match *m {
            "hold" => MissingTelemetry::Hold,
            "idle" => MissingTelemetry::Idle,
            "active" => MissingTelemetry::Active,
            other => return Err(format!("unknown missing mode {other}")),
        };
    }
    let kinds = list("kinds").iter().map(|k| kind(k)).collect::<Result<Vec<_>, _>>()?;
    Ok(IdlePolicySpec {
        name: words.get(1).ok_or("idle-rule needs a name")?.to_string(),
        projects: list("projects"),
        kinds,
        exempt_classes: list("exempt"),
        rule,
        when: match args.get("when").copied().unwrap_or(default_when) {
            "on_pressure" => IdleWhen::OnPressure,
            "always" => IdleWhen::Always,
            "report_only" => IdleWhen::ReportOnly,
            other => return Err(format!("unknown when {other}")),
        },
        action: mode(args.get("action").copied().unwrap_or(default_action))?,
        warn_before_ms: args.get("warn").map_or(Ok(0), |w| num(w))?,
    })
}

fn kind(s: &str) -> Result<WorkloadKind, String> {
    match s {
        "training" => Ok(WorkloadKind::Training),
        "batch" => Ok(WorkloadKind::Batch),
        "notebook" => Ok(WorkloadKind::Notebook),
        "inference" => Ok(WorkloadKind::Inference),
        "service" => Ok(WorkloadKind::Service),
        other => Err(format!("unknown kind {other}")),
    }
}

/// One reading per device of the workload's placement; values in percent, one per device in
/// placement order or one for all. No values at all: every device reports nothing.
fn readings(
    run: &Run,
    id: WorkloadId,
    args: &BTreeMap<&str, &str>,
) -> Result<Vec<DeviceReading>, String> {
    let placement = run.engine.placement(id).ok_or("workload holds no placement")?;
    let parse = |key: &str| -> Result<Option<Vec<u16>>, String> {
        args.get(key)
            .map(|v| v.split(',').map(|p| num(p).map(|p| (p * 10) as u16)).collect())
            .transpose()
    };
    let (util, sm, engine) = (parse("util")?, parse("sm")?, parse("engine")?);
    let pick = |values: &Option<Vec<u16>>, i: usize| -> Option<u16> {
        values.as_ref().and_then(|v| v.get(i).or(v.first()).copied())
    };
    let mut out = Vec::new();
    let mut i = 0;
    for (member, m) in placement.members.iter().enumerate() {
        for d in &m.devices {
            out.push(DeviceReading {
                member: member as u32,
                shares: d.shares,
                sm_active: pick(&sm, i),
                engine_active: pick(&engine, i),
                utilisation: pick(&util, i),
            });
            i += 1;
        }
    }
    Ok(out)
}

fn mode(s: &str) -> Result<PreemptionMode, String> {
    match s {
        "suspend" => Ok(PreemptionMode::Suspend),
        "requeue" => Ok(PreemptionMode::Requeue),
        "delete" => Ok(PreemptionMode::Delete),
        _ => Err(format!("unknown mode {s}")),
    }
}

fn build(setup: &Setup) -> Result<Run, String> {
    let mut classes = setup.classes.clone();
    if classes.is_empty() {
        classes.push(PriorityClassSpec { name: "normal".into(), value: 0, preemptible: true });
    }
    let policy = PolicySpec {
        default_priority_class: setup
            .default_class
            .clone()
            .unwrap_or_else(|| classes[0].name.clone()),
        priority_classes: classes,
        projects: setup.projects.clone(),
        fair_share_half_life_ms: setup.half_life_ms,
        preemption_mode: setup.mode,
        preemption_guard: setup.guard,
        defragmentation: setup.defrag,
        idle: setup.idle.clone(),
        restart_cost_ms: setup.restart_cost_ms.unwrap_or(PolicySpec::DEFAULT_RESTART_COST_MS),
        idle_resume_backoff_ms: setup
            .backoff_ms
            .unwrap_or(PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS),
        cohorts: setup.cohorts.clone(),
        fair_sharing: setup.fair_sharing.clone(),
        reservations: setup.reservations,
    };
    let engine = Engine::new(&setup.nodes, &policy).map_err(|e| e.to_string())?;
    Ok(Run { engine, ids: BTreeMap::new(), next_id: 1, out: String::new() })
}

fn at(words: &[&str]) -> Result<Timestamp, String> {
    kv(words).get("at").map(|t| num(t).map(Timestamp)).ok_or("missing at=MS")?
}

/// A submitted workload's id by name; `id:N` names the raw id N, for events about workloads the
/// engine never saw.
fn id_of(run: &Run, name: &str) -> Result<WorkloadId, String> {
    if let Some(raw) = name.strip_prefix("id:") {
        return num(raw).map(WorkloadId);
    }
    run.ids.get(name).copied().ok_or(format!("unknown workload {name}"))
}

fn step(run: &mut Run, words: &[&str]) -> Result<(), String> {
    let untimed = matches!(words[0], "usage" | "samples");
    let now = at(words).or_else(|e| if untimed { Ok(Timestamp(0)) } else { Err(e) })?;
    let name = words.get(1).copied().unwrap_or("");
    match words[0] {
        "submit" => {
            let args = kv(words);
            let project = words.get(2).ok_or("submit needs a project")?;
            let text = args.get("gpus").ok_or("submit needs gpus=")?;
            let request = if let Some(profile) = MigProfile::parse(text) {
                GpuRequest::Mig(profile)
            } else if text.contains('.') {
                GpuRequest::Shares(gpus(text)?.0 as u32)
            } else {
                GpuRequest::Whole(num(text)? as u32)
            };
            let id = run.next_id;
            run.next_id += 1;
            let mut spec = WorkloadSpec::new(id, name, project, request);
            spec.members = args.get("members").map_or(Ok(1), |m| num(m))? as u32;
            spec.priority_class = args.get("class").map(|s| s.to_string());
            spec.gpu_models = args
                .get("models")
                .map(|m| m.split('|').map(String::from).collect())
                .unwrap_or_default();
            spec.same_node = flag(words, "same-node");
            spec.prefer_same_node = flag(words, "prefer-same-node");
            spec.cpu_millis_per_member = args.get("cpu").map_or(Ok(0), |c| num(c))? * 1000;
            spec.memory_mib_per_member = args.get("mem").map_or(Ok(0), |m| num(m))? * 1024;
            spec.min_runtime_ms = args.get("min-runtime").map_or(Ok(0), |m| num(m))?;
            spec.max_runtime_ms = args.get("max-runtime").map(|m| num(m)).transpose()?;
            spec.deadline = args.get("deadline").map(|d| num(d).map(Timestamp)).transpose()?;
            spec.preemptible = flag(words, "fixed").then_some(false);
            spec.kind = args.get("kind").map_or(Ok(WorkloadKind::Training), |k| kind(k))?;
            spec.checkpointing = args
                .get("checkpoint")
                .map(|g| {
                    num(g).map(|grace_ms| Checkpointing { grace_ms, last_checkpoint_at: None })
                })
                .transpose()?;
            run.ids.insert(name.to_string(), WorkloadId(id));
            run.engine.apply(now, Event::WorkloadSubmitted(spec));
        }
        "start" | "fail" | "stop" | "finish" | "cancel" | "checkpoint" => {
            let workload = id_of(run, name)?;
            let event = match words[0] {
                "start" => Event::AllocationStarted { workload },
                "fail" => Event::AllocationFailed { workload, reason: "scenario".into() },
                "stop" => Event::WorkloadStopped { workload },
                "finish" => Event::WorkloadFinished { workload },
                "cancel" => Event::WorkloadCancelled { workload },
                _ => Event::CheckpointSaved { workload },
            };
            run.engine.apply(now, event);
        }
        "sample" => {
            let workload = id_of(run, name)?;
            let readings = readings(run, workload, &kv(words))?;
            run.engine.apply(now, Event::ActivitySampled { workload, readings });
        }
        "samples" => {
            let workload = id_of(run, name)?;
            let args = kv(words);
            let from = num(args.get("from").ok_or("samples needs from=")?)?;
            let to = num(args.get("to").ok_or("samples needs to=")?)?;
            let every = num(args.get("every").ok_or("samples needs every=")?)?.max(1);
            let readings = readings(run, workload, &args)?;
            let mut t = from;
            while t <= to {
                let event = Event::ActivitySampled { workload, readings: readings.clone() };
                run.engine.apply(Timestamp(t), event);
                t += every;
            }
        }
        "probe" => {
            let workload = id_of(run, name)?;
            let last = num(kv(words).get("last").ok_or("probe needs last=")?)?;
            run.engine
                .apply(now, Event::ActivityProbed { workload, last_activity: Timestamp(last) });
        }
        "decide" => {
            let decisions = run.engine.decide(now);
            print_decisions(run, now, &decisions);
        }
        // The simulator's cycle: `decide` less what each pending workload was told already
        // (a deferral of the kind it was last told counts as told).
        "news" => {
            let decisions = run.engine.decide_news(now, Refresh::KINDS_ONLY);
            print_decisions(run, now, &decisions);
        }
        "settle" => {
            for _round in 0..20 {
                let decisions = run.engine.decide(now);
                print_decisions(run, now, &decisions);
                let mut acted = false;
                for d in &decisions {
                    match d {
                        Decision::Admit { workload, .. } => {
                            run.engine.apply(now, Event::AllocationStarted { workload: *workload });
                            acted = true;
                        }
                        Decision::Preempt { victim, .. }
                        | Decision::Reclaim { workload: victim, .. }
                        | Decision::Stop { workload: victim, .. } => {
                            run.engine.apply(now, Event::WorkloadStopped { workload: *victim });
                            acted = true;
                        }
                        _ => {}
                    }
                }
                run.engine.audit()?;
                if !acted {
                    break;
                }
            }
        }
        "explain" => {
            let id = id_of(run, name)?;
            let text = match run.engine.explain(now, id) {
                Some(e) => run.engine.render_explanation(&e),
                None => format!("{name}: not held by the engine"),
            };
            let _ = writeln!(run.out, "explain {name} at={}\n{text}", now.0);
        }
        "usage" => {
            let project = run.engine.project_id(name).ok_or(format!("unknown project {name}"))?;
            for (key, used, guaranteed, _, _) in run.engine.project_lines(project) {
                let _ = writeln!(
                    run.out,
                    "usage {name} {}: {used}/{guaranteed}",
                    run.engine.key_name(key)
                );
            }
        }
        other => return Err(format!("unknown step {other}")),
    }
    Ok(())
}

fn print_decisions(run: &mut Run, now: Timestamp, decisions: &[Decision]) {
    let _ = writeln!(run.out, "decide at={}", now.0);
    for d in decisions {
        let _ = writeln!(run.out, "  {}", run.engine.render(d));
    }
}
