//! `allot submit`: a `SubmitRequest` from a YAML/JSON file or from flags, posted to the daemon.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use allot_api::{SubmitRequest, SubmitResponse, limits};
use anyhow::Result;
use clap::ValueEnum;
use yaml_rust2::{Yaml, YamlLoader};

use crate::client::Client;
use crate::{EXIT_INVALID, Failure, Output, RemoteArgs};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  allot submit job.yaml\n  \
    allot submit --project vision --gpus 4 --kind training --checkpoint-grace 60s -- python train.py --epochs 10")]
pub(crate) struct SubmitArgs {
    /// A SubmitRequest as YAML (.yaml, .yml) or JSON (.json); `-` reads YAML or JSON from
    /// stdin. Exclusive with the flags below.
    #[arg(
        value_name = "FILE",
        conflicts_with_all = [
            "project", "gpus", "mig", "kind", "name", "members", "gpu_models", "priority_class",
            "cpu_millis", "memory_mib", "same_node", "non_preemptible", "checkpoint_grace",
            "min_runtime", "max_runtime", "env", "command", "probe_http", "probe_exec",
        ]
    )]
    pub(crate) file: Option<PathBuf>,
    /// The project whose quota the workload uses.
    #[arg(long, required_unless_present = "file")]
    pub(crate) project: Option<String>,
    /// GPUs per member: a whole number, a fraction below 1 (a share of one device), or 0.
    #[arg(long, conflicts_with = "mig")]
    pub(crate) gpus: Option<f64>,
    /// A MIG profile per member (e.g. 1g.10gb) instead of --gpus.
    #[arg(long)]
    pub(crate) mig: Option<String>,
    /// What kind of work it is (policies treat kinds differently; default batch).
    #[arg(long, value_enum)]
    pub(crate) kind: Option<KindArg>,
    /// Shown in lists (default: the program's name).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Gang size: all members start together or none does.
    #[arg(long)]
    pub(crate) members: Option<u32>,
    /// An acceptable GPU model; repeat in order of preference (default: any).
    #[arg(long = "gpu-model", value_name = "MODEL")]
    pub(crate) gpu_models: Vec<String>,
    /// A priority class from the policy.
    #[arg(long)]
    pub(crate) priority_class: Option<String>,
    /// CPU per member, thousandths of a core.
    #[arg(long)]
    pub(crate) cpu_millis: Option<u64>,
    /// Memory per member, MiB.
    #[arg(long)]
    pub(crate) memory_mib: Option<u64>,
    /// Place all members on one node.
    #[arg(long)]
    pub(crate) same_node: bool,
    /// Never pre-empt it (a preemptible priority class cannot be granted this).
    #[arg(long)]
    pub(crate) non_preemptible: bool,
    /// Checkpointable: time between the checkpoint signal and the stop (e.g. 30s, 5m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s)]
    pub(crate) checkpoint_grace: Option<u64>,
    /// Do not pre-empt it before it has run this long (e.g. 10m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s)]
    pub(crate) min_runtime: Option<u64>,
    /// Stop it after this long (e.g. 2h, 1d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_s)]
    pub(crate) max_runtime: Option<u64>,
    /// An environment variable for every member; repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_env)]
    pub(crate) env: Vec<(String, String)>,
    /// An HTTP probe: allot asks this URL every 15 s while the workload runs and reads its
    /// last activity at --probe-pointer (e.g. a Jupyter server's /api/status).
    #[arg(long, value_name = "URL", conflicts_with = "probe_exec")]
    pub(crate) probe_http: Option<String>,
    /// JSON pointer to the last-activity time in the --probe-http answer.
    #[arg(long, value_name = "POINTER", default_value = "/last_activity", requires = "probe_http")]
    pub(crate) probe_pointer: String,
    /// An exec probe: a command (split at spaces) run every 15 s on the daemon's host; exit 0
    /// means the workload is in use.
    #[arg(long, value_name = "COMMAND")]
    pub(crate) probe_exec: Option<String>,
    /// Print the request that would be sent (JSON) and send nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Output format: the id alone (text) or the API's SubmitResponse (json).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    /// The program and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND", required_unless_present = "file")]
    pub(crate) command: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KindArg {
    Training,
    Batch,
    Notebook,
    Inference,
    Service,
}

impl KindArg {
    fn as_str(self) -> &'static str {
        match self {
            KindArg::Training => "training",
            KindArg::Batch => "batch",
            KindArg::Notebook => "notebook",
            KindArg::Inference => "inference",
            KindArg::Service => "service",
        }
    }
}

pub(crate) fn run(remote: &RemoteArgs, args: SubmitArgs) -> Result<String> {
    let output = args.output;
    let dry_run = args.dry_run;
    let request = request(args)?;
    if dry_run {
        let mut text = serde_json::to_string_pretty(&request)?;
        text.push('\n');
        return Ok(text);
    }
    let response = Client::new(remote)?.post::<SubmitResponse>("/workloads", Some(&request))?;
    Ok(match output {
        Output::Json => response.pretty(),
        Output::Text => format!("{}\n", response.value.id),
    })
}

/// The request the arguments describe: the file's, or the flags'.
pub(crate) fn request(args: SubmitArgs) -> Result<SubmitRequest> {
    if let Some(file) = &args.file {
        return load(file);
    }
    Ok(SubmitRequest {
        name: args.name,
        project: args.project.unwrap_or_default(),
        kind: args.kind.map(|k| k.as_str().to_string()),
        gpus: args.gpus,
        mig: args.mig,
        members: args.members,
        gpu_models: args.gpu_models,
        priority_class: args.priority_class,
        cpu_millis: args.cpu_millis,
        memory_mib: args.memory_mib,
        same_node: args.same_node,
        preemptible: args.non_preemptible.then_some(false),
        checkpoint_grace_s: args.checkpoint_grace,
        min_runtime_s: args.min_runtime,
        max_runtime_s: args.max_runtime,
        command: args.command,
        env: args.env.into_iter().collect::<BTreeMap<_, _>>(),
        probe: match (args.probe_http, args.probe_exec) {
            (Some(url), _) => Some(allot_api::Probe::Http { url, pointer: args.probe_pointer }),
            (None, Some(command)) => Some(allot_api::Probe::Exec {
                command: command.split_whitespace().map(str::to_string).collect(),
            }),
            (None, None) => None,
        },
    })
}

fn invalid(message: String) -> anyhow::Error {
    Failure::new(EXIT_INVALID, message).into()
}

/// Reads a SubmitRequest from a YAML or JSON file (`-`: stdin, YAML or JSON). Unknown and
/// missing fields are errors naming the field, the file and, for YAML, the line.
pub(crate) fn load(path: &Path) -> Result<SubmitRequest> {
    let stdin = path == Path::new("-");
    let name = if stdin { "<stdin>".to_string() } else { path.display().to_string() };
    let mut text = String::new();
    let read = if stdin {
        std::io::stdin()
            .take(limits::BODY_BYTES_MAX as u64 + 1)
            .read_to_string(&mut text)
            .map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| invalid(format!("{name}: cannot read the file: {e}\n")))?;
    if text.len() > limits::BODY_BYTES_MAX {
        return Err(invalid(format!(
            "{name}: larger than {} KiB — fix: a workload's description is small; move data out of it\n",
            limits::BODY_BYTES_MAX / 1024
        )));
    }
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let value = match extension {
        "json" => serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
            invalid(format!(
                "{name}:{}:{}: JSON syntax error: {e} — fix: check the brackets, quotes and commas there\n",
                e.line(),
                e.column()
            ))
        })?,
        "yaml" | "yml" => yaml_value(&name, &text)?,
        _ if stdin => yaml_value(&name, &text)?,
        _ => {
            return Err(invalid(format!(
                "{name}: unknown file type — fix: name it .yaml, .yml or .json\n"
            )));
        }
    };
    serde_json::from_value::<SubmitRequest>(value).map_err(|e| {
        let message = e.to_string();
        let (field, fix) = if let Some(field) = backquoted(&message, "unknown field `") {
            (Some(field), "remove it or correct its spelling".to_string())
        } else if let Some(field) = backquoted(&message, "missing field `") {
            (Some(field), format!("add `{field}`"))
        } else {
            (None, "see `allot submit --help` and the API's SubmitRequest schema".to_string())
        };
        let line = field.and_then(|f| line_of_key(&text, f));
        let at = line.map(|l| format!(":{l}")).unwrap_or_default();
        invalid(format!("{name}{at}: {message} — fix: {fix}\n"))
    })
}

/// The text between `prefix` and the next backquote in a serde message.
fn backquoted<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let start = message.find(prefix)? + prefix.len();
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// The 1-based line where `key` is written as a mapping key (YAML `key:` or JSON `"key":`).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start().trim_start_matches(['{', ',', ' ']);
            [format!("{key}:"), format!("\"{key}\":"), format!("\"{key}\" :"), format!("'{key}':")]
                .iter()
                .any(|k| line.starts_with(k.as_str()))
        })
        .map(|i| i + 1)
}

fn yaml_value(name: &str, text: &str) -> Result<serde_json::Value> {
    let documents = YamlLoader::load_from_str(text).map_err(|e| {
        invalid(format!(
            "{name}:{}:{}: YAML syntax error: {} — fix: check indentation, quotes and brackets there\n",
            e.marker().line(),
            e.marker().col() + 1,
            e.info()
        ))
    })?;
    match documents.as_slice() {
        [document] => to_json(name, document),
        [] => Err(invalid(format!(
            "{name}: the file is empty — fix: describe the workload (project, command, …)\n"
        ))),
        _ => Err(invalid(format!(
            "{name}: more than one YAML document — fix: one workload per file\n"
        ))),
    }
}

fn to_json(name: &str, yaml: &Yaml) -> Result<serde_json::Value> {
    use serde_json::Value;
    Ok(match yaml {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(text) => match text.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
            Some(n) => Value::Number(n),
            None => return Err(invalid(format!("{name}: {text:?} is not a finite number\n"))),
        },
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => {
            Value::Array(items.iter().map(|i| to_json(name, i)).collect::<Result<_>>()?)
        }
        Yaml::Hash(entries) => {
            let mut map = serde_json::Map::new();
            for (key, value) in entries {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    _ => {
                        return Err(invalid(format!(
                            "{name}: a mapping key is not a plain name ({key:?}) — fix: use names as keys\n"
                        )));
                    }
                };
                map.insert(key, to_json(name, value)?);
            }
            Value::Object(map)
        }
        Yaml::Alias(_) => {
            return Err(invalid(format!(
                "{name}: aliases (`*name`) are not supported — fix: write the value out\n"
            )));
        }
        Yaml::BadValue => {
            return Err(invalid(format!(
                "{name}: a value could not be read — fix: check the YAML\n"
            )));
        }
    })
}

/// `30` (seconds), `30s`, `5m`, `2h`, `1d`, or a sum such as `1h30m`.
pub(crate) fn parse_duration_s(text: &str) -> Result<u64, String> {
    let fix = "write a duration such as 30s, 5m, 2h, 1d or 1h30m";
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(seconds);
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(format!("{text:?}: unknown unit {c:?} — {fix}")),
        };
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{text:?}: a number must come before {c:?} — {fix}"))?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .filter(|&s| s <= limits::DURATION_S_MAX)
            .ok_or_else(|| format!("{text:?}: longer than 10 years — {fix}"))?;
    }
    if !number.is_empty() || text.is_empty() {
        return Err(format!("{text:?}: a unit must follow every number — {fix}"));
    }
    Ok(total)
}

fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE — write e.g. --env CUDA_LAUNCH_BLOCKING=1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_sums() {
        assert_eq!(parse_duration_s("30"), Ok(30));
        assert_eq!(parse_duration_s("30s"), Ok(30));
        assert_eq!(parse_duration_s("5m"), Ok(300));
        assert_eq!(parse_duration_s("2h"), Ok(7200));
        assert_eq!(parse_duration_s("1h30m"), Ok(5400));
        assert_eq!(parse_duration_s("1d"), Ok(86_400));
        assert!(parse_duration_s("").is_err());
        assert!(parse_duration_s("h").is_err());
        assert!(parse_duration_s("5x").is_err());
        assert!(parse_duration_s("1h30").is_err());
        assert!(parse_duration_s("99999999999d").is_err());
    }

    #[test]
    fn env_pairs_split_at_the_first_equals() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".to_string(), "b=c".to_string())));
        assert_eq!(parse_env("A="), Ok(("A".to_string(), String::new())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("A").is_err());
    }

    #[test]
    fn keys_are_found_on_their_line() {
        let text = "project: a\ngpu: 4\ncommand: [x]\n";
        assert_eq!(line_of_key(text, "gpu"), Some(2));
        assert_eq!(line_of_key("{\n  \"project\": \"a\",\n  \"gpu\": 1\n}", "gpu"), Some(3));
        assert_eq!(line_of_key(text, "name"), None);
    }
}
