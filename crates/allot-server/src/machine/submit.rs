//! A `SubmitRequest` checked and turned into the engine's `WorkloadSpec`. Everything the engine
//! would reject for good (unknown project, class or model; impossible sizes) is refused here,
//! naming the field, so a bad submission is never logged: a 400 where the API's schema states
//! the bound (`allot_api`'s `#[schema]` attributes, kept equal to these checks), a 422 where only
//! the live policy or a rule across fields can say it.

use allot_api::{ApiError, SubmitRequest, limits};
use allot_core::{Checkpointing, GpuRequest, WorkloadKind, WorkloadSpec};
use allot_core::{MigProfile, WorkloadId};

use crate::view::HttpError;

/// What a submission is checked against: the names the active policy and inventory know.
#[derive(Clone, Debug, Default)]
pub(crate) struct Known {
    pub projects: Vec<String>,
    pub classes: Vec<String>,
    pub models: Vec<String>,
}

impl Known {
    /// These names and those `request` uses (its project, class and models).
    pub(crate) fn with_names_of(&self, request: &SubmitRequest) -> Known {
        let mut known = self.clone();
        let add = |list: &mut Vec<String>, name: &str| {
            if !list.iter().any(|k| k == name) {
                list.push(name.to_string());
            }
        };
        add(&mut known.projects, &request.project);
        if let Some(class) = &request.priority_class {
            add(&mut known.classes, class);
        }
        for model in &request.gpu_models {
            add(&mut known.models, model);
        }
        known
    }
}

/// A request outside a bound the schema states (400).
fn bad(field: &str, error: impl Into<String>, fix: impl Into<String>) -> HttpError {
    let body =
        ApiError { error: error.into(), field: Some(field.to_string()), fix: Some(fix.into()) };
    HttpError::new(400, body)
}

/// A well-formed request that names what the policy does not have, or whose fields disagree (422).
fn refuse(field: &str, error: impl Into<String>, fix: impl Into<String>) -> HttpError {
    HttpError { status: 422, ..bad(field, error, fix) }
}

const KINDS: [(&str, WorkloadKind); 5] = [
    ("training", WorkloadKind::Training),
    ("batch", WorkloadKind::Batch),
    ("notebook", WorkloadKind::Notebook),
    ("inference", WorkloadKind::Inference),
    ("service", WorkloadKind::Service),
];

fn seconds_ms(field: &str, value: Option<u64>) -> Result<Option<u64>, HttpError> {
    match value {
        Some(s) if s > limits::DURATION_S_MAX => Err(bad(
            field,
            format!("{s} s is more than the limit of {} s (10 years)", limits::DURATION_S_MAX),
            "give a duration in seconds below the limit",
        )),
        Some(s) => Ok(Some(s * 1000)),
        None => Ok(None),
    }
}

/// The per-member GPU request from `gpus` / `mig`.
fn gpu_request(request: &SubmitRequest) -> Result<GpuRequest, HttpError> {
    match (request.gpus, &request.mig) {
        (Some(_), Some(_)) => Err(refuse(
            "mig",
            "both `gpus` and `mig` are given",
            "ask either for GPUs (`gpus`) or for a MIG instance (`mig`), not both",
        )),
        (None, Some(profile)) => MigProfile::parse(profile).map(GpuRequest::Mig).ok_or_else(|| {
            refuse(
                "mig",
                format!("{profile:?} is not a MIG profile"),
                "write a profile as NVIDIA names it, e.g. 1g.10gb, 3g.40gb, 1g.10gb+me",
            )
        }),
        (gpus, None) => {
            let gpus = gpus.unwrap_or(1.0);
            if !gpus.is_finite() || gpus < 0.0 {
                return Err(bad("gpus", format!("{gpus} GPUs"), "ask for 0 or more GPUs"));
            }
            if gpus >= 1.0 {
                if gpus.fract() != 0.0 {
                    return Err(refuse(
                        "gpus",
                        format!("{gpus} GPUs: more than one GPU must be a whole number"),
                        "ask for whole GPUs (2), or a share below 1 (0.5)",
                    ));
                }
                if gpus > f64::from(limits::GPUS_PER_MEMBER_MAX) {
                    return Err(bad(
                        "gpus",
                        format!(
                            "{gpus} GPUs per member is more than the limit of {}",
                            limits::GPUS_PER_MEMBER_MAX
                        ),
                        "use `members` for more GPUs across nodes",
                    ));
                }
                return Ok(GpuRequest::Whole(gpus as u32));
            }
            let shares = (gpus * 1000.0).round();
            if gpus > 0.0 && !(1.0..=999.0).contains(&shares) {
                return Err(refuse(
                    "gpus",
                    format!("{gpus} GPUs is less than a thousandth of a GPU"),
                    "ask for at least 0.001 of a GPU",
                ));
            }
            if gpus == 0.0 {
                return Ok(GpuRequest::Whole(0));
            }
            Ok(GpuRequest::Shares(shares as u32))
        }
    }
}

fn name_ok(field: &str, text: &str) -> Result<(), HttpError> {
    if text.chars().count() > limits::NAME_CHARS_MAX || text.chars().any(char::is_control) {
        return Err(bad(
            field,
            format!("{} characters or control characters", text.chars().count()),
            format!("use at most {} printable characters", limits::NAME_CHARS_MAX),
        ));
    }
    Ok(())
}

fn one_of(field: &str, value: &str, known: &[String], what: &str) -> Result<(), HttpError> {
    if known.iter().any(|k| k == value) {
        return Ok(());
    }
    Err(refuse(field, format!("no {what} {value:?}"), format!("known: {}", known.join(", "))))
}

/// Checks `request` and builds the spec the engine is told.
pub(crate) fn to_spec(
    id: u64,
    user: &str,
    request: &SubmitRequest,
    known: &Known,
) -> Result<WorkloadSpec, ApiError> {
    checked_spec(id, user, request, known).map_err(|e| e.body)
}

/// [`to_spec`] with the status its refusal answers with.
pub(crate) fn checked_spec(
    id: u64,
    user: &str,
    request: &SubmitRequest,
    known: &Known,
) -> Result<WorkloadSpec, HttpError> {
    name_ok("project", &request.project)?;
    one_of("project", &request.project, &known.projects, "project")?;
    if request.command.is_empty() {
        return Err(bad("command", "no command", "give the program and its arguments"));
    }
    if request.command[0].is_empty() {
        return Err(refuse(
            "command",
            "the program (its first element) is empty",
            "give the program and its arguments",
        ));
    }
    if request.command.len() > limits::COMMAND_ARGS_MAX {
        return Err(bad(
            "command",
            format!("{} arguments", request.command.len()),
            format!("use at most {} arguments", limits::COMMAND_ARGS_MAX),
        ));
    }
    if request.command.iter().any(|a| a.contains('\0')) {
        return Err(bad("command", "an argument contains a NUL byte", "remove it"));
    }
    match &request.probe {
        None => {}
        Some(allot_api::Probe::Http { url, pointer }) => {
            if !(url.starts_with("http://") || url.starts_with("https://"))
                || url.chars().count() > limits::URL_CHARS_MAX
            {
                return Err(bad(
                    "probe.http.url",
                    format!("{url:?} is not an http:// or https:// address"),
                    "give the URL of the application's status page",
                ));
            }
            if !(pointer.is_empty() || pointer.starts_with('/'))
                || pointer.chars().count() > limits::POINTER_CHARS_MAX
            {
                return Err(bad(
                    "probe.http.pointer",
                    format!("{pointer:?} is not a JSON pointer"),
                    "a JSON pointer starts with / (e.g. /last_activity)",
                ));
            }
        }
        Some(allot_api::Probe::Exec { command })
            if command.is_empty()
                || command.len() > limits::PROBE_ARGS_MAX
                || command.iter().any(|a| a.contains('\0')) =>
        {
            return Err(bad(
                "probe.exec.command",
                "the probe command is empty, too long or contains a NUL byte",
                format!("give the program and at most {} arguments", limits::PROBE_ARGS_MAX - 1),
            ));
        }
        Some(allot_api::Probe::Exec { command }) if command[0].is_empty() => {
            return Err(refuse(
                "probe.exec.command",
                "the probe's program (its first element) is empty",
                "give the program and its arguments",
            ));
        }
        Some(allot_api::Probe::Exec { .. }) => {}
    }
    if request.env.len() > limits::ENV_VARS_MAX {
        return Err(bad(
            "env",
            format!("{} variables", request.env.len()),
            format!("use at most {}", limits::ENV_VARS_MAX),
        ));
    }
    for (key, value) in &request.env {
        let key_ok = !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !key.starts_with(|c: char| c.is_ascii_digit());
        if !key_ok || value.contains('\0') {
            return Err(bad(
                &format!("env.{key}"),
                "not a valid environment variable",
                "names are letters, digits and _, not starting with a digit; values have no NUL",
            ));
        }
        if key.starts_with("ALLOT_")
            || ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"]
                .contains(&key.as_str())
        {
            return Err(refuse(
                &format!("env.{key}"),
                "set by allot for every member",
                "leave it out: allot sets the devices and its own variables",
            ));
        }
    }
    let name = match &request.name {
        Some(n) => {
            name_ok("name", n)?;
            n.clone()
        }
        None => {
            let program = request.command[0].rsplit('/').next().unwrap_or_default();
            program.chars().take(limits::NAME_CHARS_MAX).collect()
        }
    };
    let kind = match &request.kind {
        None => WorkloadKind::Batch,
        Some(k) => KINDS.iter().find(|(n, _)| n == k).map(|(_, kind)| *kind).ok_or_else(|| {
            bad(
                "kind",
                format!("no workload kind {k:?}"),
                "use training, batch, notebook, inference or service",
            )
        })?,
    };
    let members = request.members.unwrap_or(1);
    if members == 0 || members > limits::MEMBERS_MAX {
        return Err(bad(
            "members",
            format!("{members} members"),
            format!("a gang has 1 to {} members", limits::MEMBERS_MAX),
        ));
    }
    let gpus = gpu_request(request)?;
    if let Some(class) = &request.priority_class {
        one_of("priority_class", class, &known.classes, "priority class")?;
    }
    for (i, model) in request.gpu_models.iter().enumerate() {
        one_of(&format!("gpu_models[{i}]"), model, &known.models, "GPU model")?;
    }
    let cpu = request.cpu_millis.unwrap_or(0);
    if cpu > limits::CPU_MILLIS_MAX {
        return Err(bad("cpu_millis", format!("{cpu} millicores"), "ask for fewer CPUs"));
    }
    let memory = request.memory_mib.unwrap_or(0);
    if memory > limits::MEMORY_MIB_MAX {
        return Err(bad("memory_mib", format!("{memory} MiB"), "ask for less memory"));
    }
    let grace = seconds_ms("checkpoint_grace_s", request.checkpoint_grace_s)?;
    let min_runtime = seconds_ms("min_runtime_s", request.min_runtime_s)?;
    let max_runtime = seconds_ms("max_runtime_s", request.max_runtime_s)?;
    if max_runtime == Some(0) {
        return Err(bad("max_runtime_s", "0 s", "give a positive duration or leave it out"));
    }
    Ok(WorkloadSpec {
        id: WorkloadId(id),
        name,
        kind,
        project: request.project.clone(),
        user: user.to_string(),
        priority_class: request.priority_class.clone(),
        members,
        gpus_per_member: gpus,
        gpu_models: request.gpu_models.clone(),
        cpu_millis_per_member: cpu,
        memory_mib_per_member: memory,
        same_node: request.same_node,
        prefer_same_node: !request.same_node && members > 1,
        preemptible: request.preemptible,
        checkpointing: grace.map(|grace_ms| Checkpointing { grace_ms, last_checkpoint_at: None }),
        min_runtime_ms: min_runtime.unwrap_or(0),
        max_runtime_ms: max_runtime,
        deadline: None,
    })
}

/// The request's GPUs per member in words (`2`, `0.25`, `1g.10gb`).
pub(crate) fn gpus_text(request: &GpuRequest) -> String {
    match request {
        GpuRequest::Whole(n) => n.to_string(),
        GpuRequest::Shares(s) => format!("{}", f64::from(*s) / 1000.0),
        GpuRequest::Mig(p) => p.to_string(),
    }
}

/// The spec kept for a submission its policy no longer accepts (as `Daemon::apply` does).
pub(crate) fn rejected_spec(id: u64, user: &str, request: &SubmitRequest) -> WorkloadSpec {
    // Its name as asked, where that is a name (`allot ls` shows which work was refused).
    let name = request.name.as_deref().filter(|n| name_ok("name", n).is_ok()).unwrap_or("");
    let mut spec = WorkloadSpec::new(id, name, &request.project, allot_core::GpuRequest::Whole(0));
    spec.user = user.to_string();
    spec
}
