//! The workloads file (YAML, or JSON lines) and its checks against a policy and a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use allot_core::{
    Checkpointing, GpuRequest, MigGpu, MigProfile, NodeSpec, PolicySpec, WorkloadKind, WorkloadSpec,
};
use allot_core::{Timestamp, WorkloadId};

use crate::decode::{self, Ctx, fields, index, list};
use crate::diagnostic::Diagnostic;
use crate::tree::{self, Node, Pos, Value};

/// Most workloads in one file.
const WORKLOADS_MAX: usize = 1_000_000;
/// Most members in one gang, and most whole GPUs per member: the engine's own limits.
const MEMBERS_MAX: u64 = allot_core::MEMBERS_MAX as u64;
const GPUS_PER_MEMBER_MAX: u64 = allot_core::WHOLE_GPUS_PER_MEMBER_MAX as u64;

const TOP_FIELDS: [&str; 1] = ["workloads"];
const WORKLOAD_FIELDS: [&str; 19] = [
    "id",
    "name",
    "kind",
    "project",
    "user",
    "priority_class",
    "members",
    "gpus",
    "gpu_models",
    "cpu",
    "memory",
    "same_node",
    "topology",
    "preemptible",
    "checkpoint",
    "min_runtime",
    "max_runtime",
    "deadline",
    "running",
];
const RUNNING_FIELDS: [&str; 5] = ["node", "devices", "members", "since", "last_checkpoint"];
const RUNNING_MEMBER_FIELDS: [&str; 2] = ["node", "devices"];
const RUNNING_EXAMPLE: &str = "`running: {node: gpu-1, devices: [0, 1], since: 2h}`, or for a gang \
     `running: {members: [{node: gpu-1}, {node: gpu-2}], since: 30m}`";
/// `topology:` values: (same_node, prefer_same_node).
const TOPOLOGIES: [(&str, (bool, bool)); 3] = [
    ("required_same_node", (true, false)),
    ("prefer_same_node", (false, true)),
    ("spread_ok", (false, false)),
];
const CHECKPOINT_FIELDS: [&str; 2] = ["grace", "last_checkpoint_at"];
pub(crate) const KINDS: [(&str, WorkloadKind); 5] = [
    ("training", WorkloadKind::Training),
    ("batch", WorkloadKind::Batch),
    ("notebook", WorkloadKind::Notebook),
    ("inference", WorkloadKind::Inference),
    ("service", WorkloadKind::Service),
];

const WORKLOAD_EXAMPLE: &str = "`- {name: resnet, project: vision, gpus: 4}`";

/// Where a workload's fields were written, for [`check_workloads`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Source {
    path: String,
    pos: Pos,
    project: Pos,
    priority_class: Pos,
    gpus: Pos,
    gpu_models: Vec<Pos>,
    cpu: Pos,
    memory: Pos,
    running: Pos,
}

/// Work a plan file states is already running: where, since how long, its last checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    /// One per member, in member order.
    pub members: Vec<RunningMember>,
    /// How long ago it started (0: it starts now).
    pub since_ms: u64,
    /// How long ago it last checkpointed (at most `since_ms`); `None`: never.
    pub last_checkpoint_ago_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningMember {
    pub node: String,
    /// Device indices on the node; `None`: the first free ones of an accepted model.
    pub devices: Option<Vec<u32>>,
}

/// A parsed workloads file: the workloads in file order, and where each was written, so that
/// [`check_workloads`] can point at the line of a project or model the policy or cluster lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFile {
    file: String,
    workloads: Vec<WorkloadSpec>,
    sources: Vec<Source>,
    /// Per workload, in file order: whether the file says it runs already.
    running: Vec<Option<Running>>,
}

impl WorkloadFile {
    /// The file name the workloads were parsed from.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The workloads, in file order.
    pub fn specs(&self) -> &[WorkloadSpec] {
        &self.workloads
    }

    pub fn into_specs(self) -> Vec<WorkloadSpec> {
        self.workloads
    }

    /// Whether the `index`-th workload (0-based, file order) is stated as running, and how.
    pub fn running(&self, index: usize) -> Option<&Running> {
        self.running.get(index).and_then(Option::as_ref)
    }

    /// Where the `index`-th workload's `running` field was written: (line, field path).
    pub fn running_source(&self, index: usize) -> Option<(usize, String)> {
        self.sources.get(index).map(|s| (s.running.line, decode::join(&s.path, "running")))
    }

    /// The 1-based line where the `index`-th workload (0-based, file order) starts.
    pub fn line_of(&self, index: usize) -> Option<usize> {
        self.sources.get(index).map(|s| s.pos.line)
    }
}

/// Whether `text` is JSON lines: by extension (`.jsonl`, `.ndjson`), else when the first
/// non-blank line is a complete `{…}` object on its own (a pretty-printed JSON document's
/// first line, `{`, is not).
fn is_json_lines(file: &str, text: &str) -> bool {
    match Path::new(file).extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "ndjson") => return true,
        Some("yaml" | "yml") => return false,
        _ => {}
    }
    let Some(first) = text.lines().map(str::trim).find(|l| !l.is_empty()) else { return false };
    if !first.starts_with('{') {
        return false;
    }
    let mut probe = Ctx::new(file);
    matches!(tree::parse(&mut probe, first), Some(Node { value: Value::Map(_), .. }))
        && !probe.has_errors()
}

/// Parses a workloads file: YAML with a `workloads:` list, or JSON lines with one workload
/// object per line (see the crate docs). In JSON lines, a broken line does not hide errors on
/// the lines after it.
pub fn parse_workloads(file: &str, text: &str) -> Result<WorkloadFile, Vec<Diagnostic>> {
    let mut ctx = Ctx::new(file);
    let mut out = WorkloadFile {
        file: file.to_string(),
        workloads: Vec::new(),
        sources: Vec::new(),
        running: Vec::new(),
    };
    let mut decoded_all = true;
    let mut ids: BTreeMap<u64, Pos> = BTreeMap::new();
    if is_json_lines(file, text) {
        let mut count = 0usize;
        for (line_index, line) in text.split('\n').enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if count >= WORKLOADS_MAX {
                ctx.report(
                    Pos { line: line_index + 1, column: 1 },
                    "",
                    format!("more than {WORKLOADS_MAX} workloads"),
                    "split the file",
                );
                decoded_all = false;
                break;
            }
            let path = index("workloads", count);
            count += 1;
            let Some(node) = tree::parse_line(&mut ctx, line, line_index, &path) else {
                decoded_all = false;
                continue;
            };
            if !matches!(node.value, Value::Map(_)) {
                ctx.report(
                    node.pos,
                    &path,
                    format!("expected a JSON object, got {}", node.kind()),
                    "write one object per line, \
                     e.g. {\"name\": \"resnet\", \"project\": \"vision\", \"gpus\": 4}",
                );
                decoded_all = false;
                continue;
            }
            decoded_all &= decode_into(&mut ctx, &node, &path, count, &mut ids, &mut out);
        }
    } else {
        decoded_all = tree::parse(&mut ctx, text)
            .map(|root| decode_yaml(&mut ctx, &root, &mut ids, &mut out))
            .unwrap_or(false);
    }
    ctx.finish(decoded_all.then_some(out))
}

fn decode_yaml(
    ctx: &mut Ctx,
    root: &Node,
    ids: &mut BTreeMap<u64, Pos>,
    out: &mut WorkloadFile,
) -> bool {
    let Some(top) = fields(
        ctx,
        root,
        "",
        "the workloads file",
        &TOP_FIELDS,
        &format!("`workloads:` followed by a list like {WORKLOAD_EXAMPLE}"),
    ) else {
        return false;
    };
    let Some(items) = top
        .required(
            ctx,
            "workloads",
            &format!("add `workloads:` with a list like {WORKLOAD_EXAMPLE}"),
        )
        .and_then(|n| list(ctx, n, "workloads", WORKLOAD_EXAMPLE))
    else {
        return false;
    };
    if items.len() > WORKLOADS_MAX {
        ctx.report(
            top.pos,
            "workloads",
            format!("more than {WORKLOADS_MAX} workloads"),
            "split the file",
        );
        return false;
    }
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        ok &= decode_into(ctx, item, &index("workloads", i), i + 1, ids, out);
    }
    ok
}

/// Decodes one workload and appends it; `false` when it had errors. `ordinal` is its 1-based
/// position, the default id.
fn decode_into(
    ctx: &mut Ctx,
    item: &Node,
    path: &str,
    ordinal: usize,
    ids: &mut BTreeMap<u64, Pos>,
    out: &mut WorkloadFile,
) -> bool {
    let (decoded, id) = decode_workload(ctx, item, path, ordinal);
    // Ids are checked even when other fields are broken, so that all errors show at once.
    if let Some((id, id_pos)) = id {
        if let Some(first) = ids.get(&id) {
            ctx.report(
                id_pos,
                &decode::join(path, "id"),
                format!("workload id {id} is already used at line {}", first.line),
                "give every workload a different id \
                 (a workload without `id` gets its 1-based position in the file)",
            );
            return false;
        }
        ids.insert(id, id_pos);
    }
    let Some((spec, source, running)) = decoded else { return false };
    out.workloads.push(spec);
    out.sources.push(source);
    out.running.push(running);
    true
}

/// The workload, if it has no errors, and its id with where it was written, if that is valid.
type Decoded = (Option<(WorkloadSpec, Source, Option<Running>)>, Option<(u64, Pos)>);

fn decode_workload(ctx: &mut Ctx, item: &Node, path: &str, ordinal: usize) -> Decoded {
    let Some(f) = fields(ctx, item, path, "a workload", &WORKLOAD_FIELDS, WORKLOAD_EXAMPLE) else {
        return (None, None);
    };
    let pos_of = |key: &str| f.get(key).map_or(f.pos, |n| n.pos);
    let id = match f.get("id") {
        None => Some(u64::try_from(ordinal).unwrap_or(u64::MAX)),
        Some(n) => decode::uint(ctx, n, &f.path("id"), 0, u64::MAX, "7"),
    };
    let name = f.get("name").map(|n| decode::text(ctx, n, &f.path("name"), "`resnet-50`"));
    let kind = match f.get("kind") {
        None => Some(WorkloadKind::default()),
        Some(n) => decode::one_of(ctx, n, &f.path("kind"), &KINDS),
    };
    let project = f
        .required(ctx, "project", "name the project that pays for it, e.g. `project: vision`")
        .and_then(|n| decode::name(ctx, n, &f.path("project"), "`vision`"));
    let user = f.get("user").map(|n| decode::text(ctx, n, &f.path("user"), "`alice`"));
    let priority_class =
        f.get("priority_class").map(|n| decode::name(ctx, n, &f.path("priority_class"), "`high`"));
    let members = match f.get("members") {
        None => Some(1),
        Some(n) => decode::uint(ctx, n, &f.path("members"), 1, MEMBERS_MAX, "4"),
    };
    let gpus = f
        .required(ctx, "gpus", "say how many GPUs each member needs, e.g. `gpus: 4` or `gpus: 0.5`")
        .and_then(|n| decode::gpu_request(ctx, n, &f.path("gpus"), GPUS_PER_MEMBER_MAX));
    let gpu_models = match f.get("gpu_models") {
        None => Some((Vec::new(), Vec::new())),
        Some(n) => gpu_models(ctx, n, &f.path("gpu_models")),
    };
    let cpu = f.get("cpu").map_or(Some(0), |n| decode::cpu_millis(ctx, n, &f.path("cpu")));
    let memory = f.get("memory").map_or(Some(0), |n| decode::memory_mib(ctx, n, &f.path("memory")));
    let same_node =
        f.get("same_node").map_or(Some(false), |n| decode::boolean(ctx, n, &f.path("same_node")));
    let topology = f.get("topology").map(|n| {
        let t = decode::one_of(ctx, n, &f.path("topology"), &TOPOLOGIES)?;
        // `same_node` is the older spelling of `topology: required_same_node`; both may be
        // written only when they agree.
        if let (Some(sn), Some(true)) = (f.get("same_node"), same_node)
            && !t.0
        {
            ctx.report(
                sn.pos,
                &f.path("same_node"),
                "`same_node: true` contradicts the `topology` of this workload".to_string(),
                "keep one: `topology: required_same_node`, or remove `same_node`",
            );
            return None;
        }
        Some(t)
    });
    let preemptible = f.get("preemptible").map(|n| decode::boolean(ctx, n, &f.path("preemptible")));
    let checkpointing = f.get("checkpoint").map(|n| checkpoint(ctx, n, &f.path("checkpoint")));
    let min_runtime = f
        .get("min_runtime")
        .map_or(Some(0), |n| decode::duration_ms(ctx, n, &f.path("min_runtime")));
    let max_runtime =
        f.get("max_runtime").map(|n| decode::duration_ms(ctx, n, &f.path("max_runtime")));
    let deadline = f.get("deadline").map(|n| decode::duration_ms(ctx, n, &f.path("deadline")));
    let running = f.get("running").map(|n| running(ctx, n, &f.path("running")));

    let id_at = id.map(|id| (id, pos_of("id")));
    let spec = (|| {
        let (gpu_models, model_positions) = gpu_models?;
        let id = id?;
        let spec = WorkloadSpec {
            id: WorkloadId(id),
            name: name.unwrap_or_else(|| Some(format!("workload-{id}")))?,
            kind: kind?,
            project: project?,
            user: user.unwrap_or(Some(String::new()))?,
            priority_class: decode::optional(priority_class)?,
            members: u32::try_from(members?).ok()?,
            gpus_per_member: gpus?,
            gpu_models,
            cpu_millis_per_member: cpu?,
            memory_mib_per_member: memory?,
            same_node: same_node? || topology.is_some_and(|t| t.is_some_and(|t| t.0)),
            prefer_same_node: decode::optional(topology)?.is_some_and(|t| t.1),
            preemptible: decode::optional(preemptible)?,
            checkpointing: decode::optional(checkpointing)?,
            min_runtime_ms: min_runtime?,
            max_runtime_ms: decode::optional(max_runtime)?,
            deadline: decode::optional(deadline)?.map(Timestamp),
        };
        let source = Source {
            path: path.to_string(),
            pos: f.pos,
            project: pos_of("project"),
            priority_class: pos_of("priority_class"),
            gpus: pos_of("gpus"),
            gpu_models: model_positions,
            cpu: pos_of("cpu"),
            memory: pos_of("memory"),
            running: pos_of("running"),
        };
        Some((spec, source, decode::optional(running)?))
    })();
    (spec, id_at)
}

/// `[A100, H100]` or `"A100|H100"`; `any` (or an empty list) means any model.
fn gpu_models(ctx: &mut Ctx, node: &Node, path: &str) -> Option<(Vec<String>, Vec<Pos>)> {
    let mut models = Vec::new();
    let mut positions = Vec::new();
    let mut ok = true;
    match &node.value {
        Value::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                match crate::cluster::model_name(ctx, item, &index(path, i)) {
                    Some(m) => {
                        models.push(m);
                        positions.push(item.pos);
                    }
                    None => ok = false,
                }
            }
        }
        _ => {
            let text = decode::text(ctx, node, path, "`[A100, H100]` or `A100|H100`")?;
            if text.trim() == "any" {
                return Some((Vec::new(), Vec::new()));
            }
            for part in text.split('|') {
                let part = part.trim();
                let valid = !part.is_empty()
                    && !part.eq_ignore_ascii_case("any")
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if valid {
                    models.push(part.to_string());
                    positions.push(node.pos);
                } else {
                    let message = if part.is_empty() {
                        format!("empty GPU model name in `{}`", text.trim())
                    } else {
                        format!("`{part}` is not a GPU model name")
                    };
                    ctx.report(
                        node.pos,
                        path,
                        message,
                        "list models separated by `|` (e.g. `V100M16|V100M32`), \
                         or as a list `[V100M16, V100M32]`",
                    );
                    ok = false;
                }
            }
        }
    }
    let mut seen = BTreeSet::new();
    for (model, pos) in models.iter().zip(&positions) {
        if !seen.insert(model) {
            ctx.report(*pos, path, format!("`{model}` is listed twice"), "list each model once");
            ok = false;
        }
    }
    ok.then_some((models, positions))
}

/// `running: {node, devices, since, last_checkpoint}`, or `{members: [{node, devices}, ...],
/// since, last_checkpoint}` for a gang; `since` and `last_checkpoint` are how long ago.
fn running(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Running> {
    let f = fields(ctx, node, path, "running", &RUNNING_FIELDS, RUNNING_EXAMPLE)?;
    let member =
        |ctx: &mut Ctx, f: &decode::Fields<'_>, node_key: &Node| -> Option<RunningMember> {
            let name = decode::name(ctx, node_key, &f.path("node"), "`gpu-1`");
            let devices = f.get("devices").map(|n| devices(ctx, n, &f.path("devices")));
            Some(RunningMember { node: name?, devices: decode::optional(devices)? })
        };
    let members = match (f.get("node"), f.get("members")) {
        (Some(n), None) => member(ctx, &f, n).map(|m| vec![m]),
        (None, Some(list_node)) => {
            if let Some(d) = f.get("devices") {
                ctx.report(
                    d.pos,
                    &f.path("devices"),
                    "`devices` beside `members` has no meaning".to_string(),
                    "give each member its own: `members: [{node: gpu-1, devices: [0, 1]}]`",
                );
                return None;
            }
            let items = list(ctx, list_node, &f.path("members"), RUNNING_EXAMPLE)?;
            let mut out = Some(Vec::new());
            for (i, item) in items.iter().enumerate() {
                let mpath = index(&f.path("members"), i);
                let m = fields(
                    ctx,
                    item,
                    &mpath,
                    "a running member",
                    &RUNNING_MEMBER_FIELDS,
                    "`{node: gpu-1, devices: [0, 1]}`",
                )
                .and_then(|mf| {
                    let n =
                        mf.required(ctx, "node", "name the node it runs on, e.g. `node: gpu-1`")?;
                    member(ctx, &mf, n)
                });
                match (m, out.as_mut()) {
                    (Some(m), Some(v)) => v.push(m),
                    _ => out = None,
                }
            }
            out
        }
        (Some(_), Some(m)) => {
            ctx.report(
                m.pos,
                &f.path("members"),
                "`node` and `members` both given".to_string(),
                "use `node` for one member, `members` for a gang",
            );
            None
        }
        (None, None) => {
            ctx.report(
                f.pos,
                path,
                "a running workload must say where it runs".to_string(),
                format!("write it as {RUNNING_EXAMPLE}"),
            );
            None
        }
    };
    let since = f.get("since").map_or(Some(0), |n| decode::duration_ms(ctx, n, &f.path("since")));
    let last =
        f.get("last_checkpoint").map(|n| decode::duration_ms(ctx, n, &f.path("last_checkpoint")));
    let (members, since, last) = (members?, since?, decode::optional(last)?);
    if let (Some(l), Some(n)) = (last, f.get("last_checkpoint"))
        && l > since
    {
        ctx.report(
            n.pos,
            &f.path("last_checkpoint"),
            format!(
                "its last checkpoint ({} ago) is before it started ({} ago)",
                decode::format_duration(l),
                decode::format_duration(since)
            ),
            "give a last checkpoint no longer ago than `since`",
        );
        return None;
    }
    Some(Running { members, since_ms: since, last_checkpoint_ago_ms: last })
}

/// `[0, 1]`: device indices on a node, each once.
fn devices(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Vec<u32>> {
    let items = list(ctx, node, path, "`devices: [0, 1]`")?;
    let mut out = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let d = decode::uint(ctx, item, &index(path, i), 0, u64::from(u16::MAX), "0");
        match (d, out.as_mut()) {
            (Some(d), Some(v)) => {
                let d = d as u32;
                if v.contains(&d) {
                    ctx.report(
                        item.pos,
                        &index(path, i),
                        format!("device {d} is listed twice"),
                        "list each device once",
                    );
                    out = None;
                } else {
                    v.push(d);
                }
            }
            _ => out = None,
        }
    }
    out
}

fn checkpoint(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Checkpointing> {
    let f = fields(
        ctx,
        node,
        path,
        "checkpoint",
        &CHECKPOINT_FIELDS,
        "`checkpoint: {grace: 30s, last_checkpoint_at: 0}`",
    )?;
    let grace = f
        .required(
            ctx,
            "grace",
            "say how long the workload needs to checkpoint after being asked, e.g. `grace: 30s`",
        )
        .and_then(|n| decode::duration_ms(ctx, n, &f.path("grace")));
    let last = f
        .get("last_checkpoint_at")
        .map(|n| decode::duration_ms(ctx, n, &f.path("last_checkpoint_at")));
    Some(Checkpointing {
        grace_ms: grace?,
        last_checkpoint_at: decode::optional(last)?.map(Timestamp),
    })
}

/// A MIG request needs a MIG-enabled device of an accepted model whose table has the profile;
/// a same-node gang, that many instances' room on one node (`max_count` per device).
fn check_mig(
    ctx: &mut Ctx,
    spec: &WorkloadSpec,
    source: &Source,
    profile: MigProfile,
    nodes: &[NodeSpec],
    acceptable: &dyn Fn(&&str) -> bool,
    which: &str,
) {
    let path = decode::join(&source.path, "gpus");
    // (instances one node holds when empty, node) at best.
    let mut best: Option<(u64, &str)> = None;
    let mut offered: BTreeSet<String> = BTreeSet::new();
    for node in nodes {
        let mut room = 0u64;
        for d in node.devices.iter().filter(|d| d.mig && acceptable(&d.model.as_str())) {
            let Some(gpu) = MigGpu::from_model(&d.model) else { continue };
            offered.extend(gpu.profiles().iter().map(|p| format!("{} ({})", p.profile, d.model)));
            if let Some(p) = gpu.profile(profile) {
                room += u64::from(p.max_count);
            }
        }
        if room > 0 && best.is_none_or(|(r, _)| room > r) {
            best = Some((room, node.name.as_str()));
        }
    }
    match best {
        None => {
            let fix = if offered.is_empty() {
                format!("enable MIG on GPUs of {which} in the cluster file (`mig: true`)")
            } else {
                let list: Vec<&str> = offered.iter().map(String::as_str).collect();
                format!("ask for one of {}", list.join(", "))
            };
            ctx.report(
                source.gpus,
                &path,
                format!("no MIG-enabled GPU of {which} offers {profile}"),
                fix,
            );
        }
        Some((room, node)) if spec.same_node && u64::from(spec.members) > room => {
            ctx.report(
                source.gpus,
                &path,
                format!(
                    "same_node needs {} × {profile} on one node; the most one node holds is \
                     {room} ({node})",
                    spec.members
                ),
                "set `same_node: false`, or ask for fewer members",
            );
        }
        Some(_) => {}
    }
}

/// Checks parsed workloads against a policy and a cluster: unknown projects, priority classes
/// and GPU models, and requests no node could ever hold (more GPUs, CPU or memory per member
/// than the largest node has; a `same_node` gang larger than any node). Empty when all is well.
pub fn check_workloads(
    workloads: &WorkloadFile,
    policy: &PolicySpec,
    nodes: &[NodeSpec],
) -> Vec<Diagnostic> {
    let mut ctx = Ctx::new(&workloads.file);
    let projects: Vec<&str> = policy.projects.iter().map(|p| p.name.as_str()).collect();
    let classes: Vec<&str> = policy.priority_classes.iter().map(|c| c.name.as_str()).collect();
    // Per model: the most devices on one node, and that node.
    let mut most: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for node in nodes {
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for device in &node.devices {
            *counts.entry(device.model.as_str()).or_default() += 1;
        }
        for (model, count) in counts {
            let best = most.entry(model).or_insert((0, node.name.as_str()));
            if count > best.0 {
                *best = (count, node.name.as_str());
            }
        }
    }
    let cpu_max = nodes.iter().map(|n| n.cpu_millis).max().unwrap_or(0);
    let memory_max = nodes.iter().map(|n| n.memory_mib).max().unwrap_or(0);

    // Whole devices stated as running, for overlaps: (node, device) → workload name.
    let mut taken: BTreeMap<(&str, u32), &str> = BTreeMap::new();
    for ((spec, source), running) in
        workloads.workloads.iter().zip(&workloads.sources).zip(&workloads.running)
    {
        if let Some(running) = running {
            check_running(&mut ctx, spec, source, running, nodes, &mut taken);
        }
    }

    for (spec, source) in workloads.workloads.iter().zip(&workloads.sources) {
        let path = |key: &str| decode::join(&source.path, key);
        if !projects.contains(&spec.project.as_str()) {
            ctx.report(
                source.project,
                &path("project"),
                format!("unknown project `{}`", spec.project),
                decode::did_you_mean(
                    &spec.project,
                    projects.iter().copied(),
                    "add it to the policy's projects, or use one of",
                ),
            );
        }
        if let Some(class) = &spec.priority_class
            && !classes.contains(&class.as_str())
        {
            ctx.report(
                source.priority_class,
                &path("priority_class"),
                format!("unknown priority class `{class}`"),
                decode::did_you_mean(
                    class,
                    classes.iter().copied(),
                    "define it in the policy's priority_classes, or use one of",
                ),
            );
        }
        let mut known_models = Vec::new();
        for (i, (model, pos)) in spec.gpu_models.iter().zip(&source.gpu_models).enumerate() {
            if most.contains_key(model.as_str()) {
                known_models.push(model.as_str());
            } else {
                ctx.report(
                    *pos,
                    &index(&path("gpu_models"), i),
                    format!("no node has GPU model `{model}`"),
                    decode::did_you_mean(
                        model,
                        most.keys().copied(),
                        "use one of the cluster's models:",
                    ),
                );
            }
        }
        if !spec.gpu_models.is_empty() && known_models.is_empty() {
            continue; // Nothing more to say until the models are fixed.
        }
        let acceptable = |model: &&str| spec.gpu_models.is_empty() || known_models.contains(model);
        let best = most
            .iter()
            .filter(|(m, _)| acceptable(m))
            .map(|(_, b)| *b)
            .max_by_key(|(count, _)| *count);
        let which = if spec.gpu_models.is_empty() {
            "any model".to_string()
        } else {
            known_models.join("|")
        };
        if let GpuRequest::Mig(profile) = spec.gpus_per_member {
            check_mig(&mut ctx, spec, source, profile, nodes, &acceptable, &which);
        } else if let GpuRequest::Whole(per_member) = spec.gpus_per_member {
            let per_member = u64::from(per_member);
            let (count, node) = best.unwrap_or((0, "none"));
            let gang = per_member.saturating_mul(u64::from(spec.members));
            if per_member > count {
                ctx.report(
                    source.gpus,
                    &path("gpus"),
                    format!(
                        "no node has {per_member} GPUs of {which} for one member; \
                         the most on one node is {count} ({node})"
                    ),
                    format!(
                        "ask for at most {count} GPUs per member and use more members, \
                         or accept more GPU models"
                    ),
                );
            } else if spec.same_node && gang > count {
                ctx.report(
                    source.gpus,
                    &path("gpus"),
                    format!(
                        "same_node needs all {} members × {per_member} GPUs = {gang} on one node; \
                         the most of {which} on one node is {count} ({node})",
                        spec.members
                    ),
                    "set `same_node: false`, or ask for fewer members or GPUs",
                );
            }
        } else if best.is_none() {
            ctx.report(
                source.gpus,
                &path("gpus"),
                format!("the cluster has no GPU of {which}"),
                "add GPUs to the cluster file",
            );
        }
        if spec.cpu_millis_per_member > cpu_max {
            ctx.report(
                source.cpu,
                &path("cpu"),
                format!(
                    "each member asks for {} cores; the largest node has {}",
                    decode::thousandths(spec.cpu_millis_per_member),
                    decode::thousandths(cpu_max)
                ),
                "ask for less CPU per member, or use more members",
            );
        }
        if spec.memory_mib_per_member > memory_max {
            ctx.report(
                source.memory,
                &path("memory"),
                format!(
                    "each member asks for {} MiB; the largest node has {memory_max} MiB",
                    spec.memory_mib_per_member
                ),
                "ask for less memory per member, or use more members",
            );
        }
    }
    ctx.into_diagnostics()
}

/// Work stated as running must run where the cluster has room for it: one placement per
/// member, on nodes that exist, devices that exist, of a model it accepts, as many as it asks,
/// no whole device held twice.
fn check_running<'a>(
    ctx: &mut Ctx,
    spec: &'a WorkloadSpec,
    source: &Source,
    running: &'a Running,
    nodes: &'a [NodeSpec],
    taken: &mut BTreeMap<(&'a str, u32), &'a str>,
) {
    let path = decode::join(&source.path, "running");
    let pos = source.running;
    if running.members.len() as u64 != u64::from(spec.members) {
        ctx.report(
            pos,
            &path,
            format!(
                "it has {} member(s) but `running` places {}",
                spec.members,
                running.members.len()
            ),
            "give one `members` entry per member",
        );
        return;
    }
    let wanted = match spec.gpus_per_member {
        GpuRequest::Whole(k) => k,
        GpuRequest::Shares(_) => 1,
        GpuRequest::Mig(_) => {
            ctx.report(
                pos,
                &path,
                "running MIG work cannot be stated in a plan file yet".to_string(),
                "leave `running` out (it is then planned as pending)",
            );
            return;
        }
    };
    for (i, m) in running.members.iter().enumerate() {
        let mpath = if spec.members == 1 {
            path.clone()
        } else {
            index(&decode::join(&path, "members"), i)
        };
        let Some(node) = nodes.iter().find(|n| n.name == m.node) else {
            ctx.report(
                pos,
                &decode::join(&mpath, "node"),
                format!("no node `{}` in the cluster", m.node),
                decode::did_you_mean(&m.node, nodes.iter().map(|n| n.name.as_str()), "use one of"),
            );
            continue;
        };
        let accepts =
            |model: &str| spec.gpu_models.is_empty() || spec.gpu_models.iter().any(|g| g == model);
        let Some(devices) = &m.devices else {
            let free = node.devices.iter().filter(|d| accepts(&d.model)).count() as u32;
            if free < wanted {
                ctx.report(
                    pos,
                    &decode::join(&mpath, "node"),
                    format!("{} has {free} GPU(s) it accepts; it asks {wanted}", node.name),
                    "name another node, or the devices it runs on",
                );
            }
            continue;
        };
        if devices.len() as u32 != wanted {
            ctx.report(
                pos,
                &decode::join(&mpath, "devices"),
                format!("{} device(s) listed; each member asks {wanted}", devices.len()),
                format!("list {wanted} device(s)"),
            );
            continue;
        }
        let mut models = BTreeSet::new();
        for &d in devices {
            let Some(dev) = node.devices.get(d as usize) else {
                ctx.report(
                    pos,
                    &decode::join(&mpath, "devices"),
                    format!("{} has no GPU {d} (it has {})", node.name, node.devices.len()),
                    format!("use indices 0 to {}", node.devices.len().saturating_sub(1)),
                );
                continue;
            };
            models.insert(dev.model.as_str());
            if !accepts(&dev.model) {
                ctx.report(
                    pos,
                    &decode::join(&mpath, "devices"),
                    format!("GPU {d} of {} is {}, which it does not accept", node.name, dev.model),
                    "list devices of a model in its `gpu_models`",
                );
            }
            if let GpuRequest::Whole(_) = spec.gpus_per_member
                && let Some(&other) = taken.get(&(node.name.as_str(), d))
            {
                ctx.report(
                    pos,
                    &decode::join(&mpath, "devices"),
                    format!("GPU {d} of {} is already stated as running `{other}`", node.name),
                    "give each running workload its own devices",
                );
            } else if let GpuRequest::Whole(_) = spec.gpus_per_member {
                taken.insert((node.name.as_str(), d), spec.name.as_str());
            }
        }
        if models.len() > 1 {
            ctx.report(
                pos,
                &decode::join(&mpath, "devices"),
                format!(
                    "the devices are of several models ({})",
                    models.into_iter().collect::<Vec<_>>().join(", ")
                ),
                "one workload runs on one GPU model",
            );
        }
    }
}
