//! The cluster file: nodes and their GPUs.

use std::collections::BTreeMap;

use allot_core::{DeviceSpec, MigGpu, NodeSpec};

use crate::decode::{self, Ctx, fields, index, list};
use crate::diagnostic::Diagnostic;
use crate::tree::{self, Node, Pos};

/// Most nodes one `count:` may stamp out, and most nodes in a file.
const NODES_MAX: u64 = 100_000;
/// Most devices on one node (8 GPUs × 8 compute partitions is 64; leave room).
const DEVICES_PER_NODE_MAX: u64 = 1024;
/// Most distinct NVLink/xGMI islands on one node.
const ISLAND_MAX: u64 = 1024;

const TOP_FIELDS: [&str; 1] = ["nodes"];
const NODE_FIELDS: [&str; 8] = ["name", "count", "cpu", "memory", "labels", "pool", "rack", "gpus"];
const GPU_FIELDS: [&str; 6] = ["model", "count", "memory", "island", "mig", "partition"];
const PARTITION_FIELDS: [&str; 2] = ["compute", "memory"];
const PARTITION_EXAMPLE: &str = "`partition: {compute: CPX, memory: NPS4}`";

/// AMD MI300X compute partition modes: (name, logical devices per GPU).
const COMPUTE_MODES: [(&str, u64); 4] = [("SPX", 1), ("DPX", 2), ("QPX", 4), ("CPX", 8)];
/// The memory (NPS) modes each compute mode works with on MI300X, from the amdgpu driver's
/// `aqua_vanjaram` partition table (`compatible_nps_modes`; `docs/reference/
/// telemetry-and-crates.md` §2.6): SPX→NPS1; DPX→NPS1 (NPS2 on newer kernels and parts);
/// QPX→NPS1|NPS4; CPX→NPS1|NPS4 (NPS2 only on virtual functions, so not accepted here).
const MI300X_PAIRS: [(&str, &[&str]); 4] = [
    ("SPX", &["NPS1"]),
    ("DPX", &["NPS1", "NPS2"]),
    ("QPX", &["NPS1", "NPS4"]),
    ("CPX", &["NPS1", "NPS4"]),
];
const MEMORY_MODES: [(&str, &str); 3] = [("NPS1", "NPS1"), ("NPS2", "NPS2"), ("NPS4", "NPS4")];

const NODE_EXAMPLE: &str =
    "`- {name: gpu-1, cpu: 64, memory: 512Gi, gpus: [{model: A100, count: 8, memory: 80Gi}]}`";
const GPU_EXAMPLE: &str = "`- {model: A100, count: 8, memory: 80Gi, island: 0}`";

/// Parses a cluster file (see the crate docs for the schema) into nodes, in file order.
pub fn parse_cluster(file: &str, text: &str) -> Result<Vec<NodeSpec>, Vec<Diagnostic>> {
    let mut ctx = Ctx::new(file);
    let nodes = tree::parse(&mut ctx, text).and_then(|root| decode_cluster(&mut ctx, &root));
    ctx.finish(nodes)
}

fn decode_cluster(ctx: &mut Ctx, root: &Node) -> Option<Vec<NodeSpec>> {
    let top = fields(
        ctx,
        root,
        "",
        "the cluster file",
        &TOP_FIELDS,
        &format!("`nodes:` followed by a list like {NODE_EXAMPLE}"),
    )?;
    let nodes_node =
        top.required(ctx, "nodes", &format!("add `nodes:` with a list like {NODE_EXAMPLE}"))?;
    let items = list(ctx, nodes_node, "nodes", NODE_EXAMPLE)?;
    if items.is_empty() {
        ctx.report(
            top.pos,
            "nodes",
            "the cluster has no nodes",
            format!("add at least one node, e.g. {NODE_EXAMPLE}"),
        );
        return None;
    }
    let mut nodes = Vec::new();
    // Where each node name was defined, to report duplicates.
    let mut seen: BTreeMap<String, Pos> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let path = index("nodes", i);
        let Some((node, count, name_pos)) = decode_node(ctx, item, &path) else { continue };
        let stamped: Vec<String> = match count {
            None => vec![node.name.clone()],
            Some(n) => (0..n).map(|k| format!("{}-{k}", node.name)).collect(),
        };
        if u64::try_from(nodes.len() + stamped.len()).map_or(true, |total| total > NODES_MAX) {
            ctx.report(
                name_pos,
                &path,
                format!("the cluster has more than {NODES_MAX} nodes"),
                "split the cluster into pools managed separately, or lower `count`",
            );
            return None;
        }
        for name in stamped {
            if let Some(first) = seen.get(&name) {
                let how = if count.is_some() {
                    format!(" (made by `count` from `{}`)", node.name)
                } else {
                    String::new()
                };
                ctx.report(
                    name_pos,
                    &decode::join(&path, "name"),
                    format!("node `{name}`{how} is already defined at line {}", first.line),
                    "give every node a different name",
                );
                continue;
            }
            seen.insert(name.clone(), name_pos);
            nodes.push(NodeSpec { name, ..node.clone() });
        }
    }
    Some(nodes)
}

/// One node entry; `count` is `Some(n)` when it stamps out `n` copies.
fn decode_node(ctx: &mut Ctx, item: &Node, path: &str) -> Option<(NodeSpec, Option<u64>, Pos)> {
    let f = fields(ctx, item, path, "a node", &NODE_FIELDS, NODE_EXAMPLE)?;
    let name_node = f.required(ctx, "name", "name the node, e.g. `name: gpu-1`");
    let name_pos = name_node.map_or(f.pos, |n| n.pos);
    let name = name_node.and_then(|n| decode::name(ctx, n, &f.path("name"), "`gpu-1`"));
    let count = f.get("count").map(|n| decode::uint(ctx, n, &f.path("count"), 1, NODES_MAX, "4"));
    let cpu = f
        .required(ctx, "cpu", "give the node's CPU as cores or millicores, e.g. `cpu: 64`")
        .and_then(|n| decode::cpu_millis(ctx, n, &f.path("cpu")));
    let memory = f
        .required(ctx, "memory", "give the node's memory, e.g. `memory: 512Gi`")
        .and_then(|n| decode::memory_mib(ctx, n, &f.path("memory")));
    let labels = f.get("labels").map(|n| decode_labels(ctx, n, &f.path("labels")));
    let pool = f.get("pool").map(|n| decode::name(ctx, n, &f.path("pool"), "`training`"));
    let rack = f.get("rack").map(|n| decode::name(ctx, n, &f.path("rack"), "`r1`"));
    let devices = match f.get("gpus") {
        None => Some(Vec::new()),
        Some(n) => decode_gpus(ctx, n, &f.path("gpus")),
    };
    let node = NodeSpec {
        name: name?,
        cpu_millis: cpu?,
        memory_mib: memory?,
        labels: labels.unwrap_or(Some(BTreeMap::new()))?,
        pool: decode::optional(pool)?,
        rack: decode::optional(rack)?,
        devices: devices?,
    };
    let count = match count {
        None => None,
        Some(c) => Some(c?),
    };
    Some((node, count, name_pos))
}

fn decode_labels(ctx: &mut Ctx, node: &Node, path: &str) -> Option<BTreeMap<String, String>> {
    let crate::tree::Value::Map(entries) = &node.value else {
        // Let `fields` report the wrong type.
        fields(ctx, node, path, "labels", &[], "`labels: {vendor: nvidia}`");
        return None;
    };
    let mut labels = BTreeMap::new();
    let mut ok = true;
    for entry in entries {
        let key_path = decode::join(path, &entry.key);
        if matches!(entry.key.as_str(), "pool" | "rack") {
            ctx.report(
                entry.key_pos,
                &key_path,
                format!("`{}` is a node field, not a label", entry.key),
                format!("move it out of `labels` to the node's `{}:` field", entry.key),
            );
            ok = false;
            continue;
        }
        if entry.value.value == crate::tree::Value::Null {
            labels.insert(entry.key.clone(), String::new());
            continue;
        }
        match decode::text(ctx, &entry.value, &key_path, "`nvidia`") {
            Some(value) => {
                labels.insert(entry.key.clone(), value);
            }
            None => ok = false,
        }
    }
    ok.then_some(labels)
}

fn decode_gpus(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Vec<DeviceSpec>> {
    let items = list(ctx, node, path, GPU_EXAMPLE)?;
    let mut devices = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index(path, i);
        let Some(f) = fields(ctx, item, &path, "a GPU group", &GPU_FIELDS, GPU_EXAMPLE) else {
            ok = false;
            continue;
        };
        let model = f
            .required(ctx, "model", "name the GPU model, e.g. `model: A100`")
            .and_then(|n| model_name(ctx, n, &f.path("model")));
        let count = f
            .required(ctx, "count", "say how many GPUs of this model, e.g. `count: 8`")
            .and_then(|n| decode::uint(ctx, n, &f.path("count"), 1, DEVICES_PER_NODE_MAX, "8"));
        let memory = f
            .required(ctx, "memory", "give each GPU's memory, e.g. `memory: 80Gi`")
            .and_then(|n| decode::memory_mib(ctx, n, &f.path("memory")));
        let island = match f.get("island") {
            None => Some(0),
            Some(n) => decode::uint(ctx, n, &f.path("island"), 0, ISLAND_MAX, "0"),
        };
        let mig = match f.get("mig") {
            None => Some(false),
            Some(n) => decode::boolean(ctx, n, &f.path("mig")),
        };
        let partition = f.get("partition").map(|n| (n, partition(ctx, n, &f.path("partition"))));
        let (Some(model), Some(count), Some(memory_mib), Some(island), Some(mig)) =
            (model, count, memory, island, mig)
        else {
            ok = false;
            continue;
        };
        if mig && let Some(n) = f.get("mig") {
            if partition.is_some() {
                ctx.report(
                    n.pos,
                    &f.path("mig"),
                    "`mig` and `partition` cannot both be set",
                    "MIG is NVIDIA's partitioning, `partition` AMD's: keep the one of this model",
                );
                ok = false;
                continue;
            }
            if MigGpu::from_model(&model).is_none() {
                ctx.report(
                    n.pos,
                    &f.path("mig"),
                    format!("GPU model `{model}` has no MIG table"),
                    format!(
                        "name the model as one of {} (MIG profiles depend on the memory size), \
                         or drop `mig`",
                        MigGpu::known_models().join(", ")
                    ),
                );
                ok = false;
                continue;
            }
        }
        // An AMD partition: each GPU becomes `per_gpu` devices named `<model>-<mode>`, with an
        // equal part of the memory, all in the GPU group's island.
        let (model, count, memory_mib) = match partition {
            None => (model, count, memory_mib),
            Some((_, None)) => {
                ok = false;
                continue;
            }
            Some((n, Some((compute, per_gpu)))) => {
                if !model.eq_ignore_ascii_case("MI300X") {
                    ctx.report(
                        n.pos,
                        &f.path("partition"),
                        format!(
                            "compute and memory partitions are only known for MI300X, not `{model}`"
                        ),
                        "drop `partition`, or declare the partitions as devices of their own",
                    );
                    ok = false;
                    continue;
                }
                (format!("{model}-{compute}"), count.saturating_mul(per_gpu), memory_mib / per_gpu)
            }
        };
        if u64::try_from(devices.len()).map_or(true, |have| have + count > DEVICES_PER_NODE_MAX) {
            ctx.report(
                f.pos,
                &f.path("count"),
                format!("the node has more than {DEVICES_PER_NODE_MAX} GPUs"),
                "check the counts; split very large machines into several nodes",
            );
            return None;
        }
        let island = u32::try_from(island).unwrap_or(u32::MAX);
        for _ in 0..count {
            devices.push(DeviceSpec { model: model.clone(), memory_mib, island, mig });
        }
    }
    ok.then_some(devices)
}

/// `partition: {compute: CPX, memory: NPS4}` of an MI300X group: the compute mode and the
/// number of logical devices per GPU, once the pair is one the driver accepts.
fn partition(ctx: &mut Ctx, node: &Node, path: &str) -> Option<(&'static str, u64)> {
    let f = fields(ctx, node, path, "a partition", &PARTITION_FIELDS, PARTITION_EXAMPLE)?;
    let compute = f
        .required(ctx, "compute", "give the compute partition mode, e.g. `compute: CPX`")
        .and_then(|n| {
            decode::one_of(ctx, n, &f.path("compute"), &COMPUTE_MODES.map(|(m, _)| (m, m)))
        });
    let memory = f
        .required(ctx, "memory", "give the memory partition (NPS) mode, e.g. `memory: NPS4`")
        .and_then(|n| decode::one_of(ctx, n, &f.path("memory"), &MEMORY_MODES));
    let (compute, memory) = (compute?, memory?);
    let valid = MI300X_PAIRS.iter().find(|(c, _)| *c == compute).map_or(&[][..], |(_, v)| *v);
    if !valid.contains(&memory) {
        let pos = f.get("memory").map_or(f.pos, |n| n.pos);
        ctx.report(
            pos,
            &f.path("memory"),
            format!("MI300X in {compute} does not work with memory mode {memory}"),
            format!("with `compute: {compute}` use `memory:` {}", valid.join(" or ")),
        );
        return None;
    }
    let per_gpu = COMPUTE_MODES.iter().find(|(c, _)| *c == compute).map_or(1, |(_, n)| *n);
    Some((compute, per_gpu))
}

/// A GPU model name: a name, not `any` (reserved for quotas) and without `|`.
pub(crate) fn model_name(ctx: &mut Ctx, node: &Node, path: &str) -> Option<String> {
    let model = decode::name(ctx, node, path, "`A100`")?;
    if model.eq_ignore_ascii_case("any") {
        ctx.report(
            node.pos,
            path,
            "`any` is not a GPU model name (it means every model in quotas)",
            "use the model's name, e.g. `A100`",
        );
        return None;
    }
    Some(model)
}
