//! Kubernetes objects as allot's model: pure functions over the API's types, no I/O.
//!
//! Label and resource names read here:
//! - GPUs: the extended resources `nvidia.com/gpu` and `amd.com/gpu` (device plugins), and the
//!   MIG resources of the NVIDIA GPU operator's mixed strategy (`nvidia.com/mig-1g.10gb`, …):
//!   each unit one device, a MIG slice one of its own model `PRODUCT-MIG-PROFILE` (fixed by the
//!   operator, never split by allot). A pod asks for units of one of them; it is placed only on
//!   devices of that resource (and, in a cluster of several, on nothing else).
//! - GPU model: the node label `nvidia.com/gpu.product` / `amd.com/gpu.product` (GPU feature
//!   discovery), else `nvidia-gpu` / `amd-gpu`; GPU memory: `nvidia.com/gpu.memory` (MiB).
//! - pool: `topology.kubernetes.io/zone`; rack: `allot.dev/rack` (Kubernetes has no standard
//!   rack label).
//! - a pod's user: its label `allot.dev/user`, else its service account; its project: its
//!   namespace.
//! - a pod group (a gang: all its pods are bound together or none is): the label
//!   `allot.dev/pod-group` names it, the annotation `allot.dev/pod-group-size` says how many
//!   pods it has. Kueue's names for the same (`kueue.x-k8s.io/pod-group-name` label,
//!   `kueue.x-k8s.io/pod-group-total-count` annotation) are read too, so that pods written for
//!   Kueue's plain-pod groups run under allot by changing only `schedulerName`; where both are
//!   set, allot's win and must agree with Kueue's.
//! - a pod's intent (annotations; a group's pods must agree): `allot.dev/kind` (training,
//!   batch, notebook, inference, service), `allot.dev/priority-class`, `allot.dev/preemptible`
//!   (true/false), `allot.dev/checkpointable` (true: evicting the pod is its checkpoint, with
//!   its `terminationGracePeriodSeconds` as the grace), `allot.dev/min-runtime` and
//!   `allot.dev/max-runtime` (durations as in the policy file: `30m`, `2h`, `1h30m`, `1d`).
//!
//! Handles (what [`allot_backend::Launch::adopt`] names): a pod is `namespace/name@uid`, a
//! group `namespace/group:name@id`, `id` a digest of its pods' uids; refused work ends in
//! `~` and a digest of the refusal. A pod created again under the same name, a group whose
//! pods changed, or refused work corrected in place is new work (the daemon imports a handle
//! once); handles without the suffix (written by earlier versions) name the pod or group by
//! name alone.

use std::collections::{BTreeMap, BTreeSet};

use allot_backend::{
    DeviceAssignment, ForeignIntent, ForeignWork, MemberLaunch, NodeStatus, Vendor,
};
use allot_core::{DeviceSpec, NodeSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The `spec.schedulerName` of pods allot schedules.
pub const SCHEDULER_NAME: &str = "allot";
/// The reason of a PodScheduled condition (and Event) allot writes on a pod it will not place
/// as it is, and on one it keeps waiting.
pub const REFUSED_REASON: &str = "AllotRefused";
pub const WAITING_REASON: &str = "AllotWaiting";
pub const USER_LABEL: &str = "allot.dev/user";
pub const RACK_LABEL: &str = "allot.dev/rack";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
pub const AMD_GPU: &str = "amd.com/gpu";
/// The prefix of the MIG resources of the NVIDIA GPU operator's mixed strategy
/// (`nvidia.com/mig-1g.10gb`).
const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
const NVIDIA_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
const AMD_PRODUCT_LABEL: &str = "amd.com/gpu.product";
const NVIDIA_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
pub const GROUP_LABEL: &str = "allot.dev/pod-group";
pub const GROUP_SIZE_ANNOTATION: &str = "allot.dev/pod-group-size";
pub const KUEUE_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
pub const KUEUE_GROUP_SIZE_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";
/// The most pods one group may have (a bound on what one launch binds).
pub const GROUP_SIZE_MAX: u32 = 1024;
pub const KIND_ANNOTATION: &str = "allot.dev/kind";
pub const PRIORITY_CLASS_ANNOTATION: &str = "allot.dev/priority-class";
pub const PREEMPTIBLE_ANNOTATION: &str = "allot.dev/preemptible";
pub const CHECKPOINTABLE_ANNOTATION: &str = "allot.dev/checkpointable";
pub const MIN_RUNTIME_ANNOTATION: &str = "allot.dev/min-runtime";
pub const MAX_RUNTIME_ANNOTATION: &str = "allot.dev/max-runtime";
/// The workload kinds `allot.dev/kind` takes (those of `allot submit --kind`).
const KINDS: [&str; 5] = ["training", "batch", "notebook", "inference", "service"];
/// Kubernetes' default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE_S: u64 = 30;

/// The GPU resources allot governs, with their vendor and model label.
const GPU_RESOURCES: [(&str, Vendor, &str); 2] =
    [(NVIDIA_GPU, Vendor::Nvidia, NVIDIA_PRODUCT_LABEL), (AMD_GPU, Vendor::Amd, AMD_PRODUCT_LABEL)];

/// A quantity as a whole number (`"8"`), `None` for anything else (`"500m"`, `"1.5"`, `"2k"`).
fn whole(quantity: &Quantity) -> Option<u64> {
    let text = quantity.0.trim();
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok())?
}

/// A quantity in units of `1/scale` (`scale` 1000: millis), rounded down; `None` if it does
/// not parse. Handles the suffixes Kubernetes writes (`m`, `k`…`E`, `Ki`…`Ei`) and decimals.
pub fn quantity_scaled(quantity: &Quantity, scale: f64) -> Option<u64> {
    let text = quantity.0.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        _ => return None,
    };
    let value = number * factor * scale;
    // `as` saturates; a NaN cannot come out of digits.
    value.is_finite().then_some(value.floor() as u64)
}

/// One kind of GPU device a node has: `count` units of `resource`, each a device of `model`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GpuKind {
    resource: String,
    vendor: Vendor,
    model: String,
    /// MiB of GPU memory per device, 0 when unknown.
    memory_mib: u64,
    count: usize,
}

/// The MIG profile a resource is (`nvidia.com/mig-1g.10gb` → `1g.10gb`), if it is one.
fn mig_profile(resource: &str) -> Option<&str> {
    resource.strip_prefix(MIG_RESOURCE_PREFIX).filter(|p| !p.is_empty())
}

/// The model name of a MIG slice of `product`: `NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`, the name
/// GPU feature discovery gives such GPUs under the single strategy, so a quota is written the
/// same for both strategies.
pub fn mig_model(product: &str, profile: &str) -> String {
    format!("{product}-MIG-{profile}")
}

/// The memory of a MIG profile (`1g.10gb` → 10 GiB), in MiB.
fn mig_memory_mib(profile: &str) -> u64 {
    let gb = profile.split('.').nth(1).and_then(|m| m.strip_suffix("gb"));
    gb.and_then(|g| g.parse::<u64>().ok()).map_or(0, |g| g.saturating_mul(1024))
}

/// The node's GPUs by kind, in the order its devices are numbered: whole GPUs of each vendor,
/// then each MIG profile it offers (the GPU operator's mixed strategy), by name.
fn gpu_kinds(node: &Node) -> Vec<GpuKind> {
    let labels = node.metadata.labels.as_ref();
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    // A bound on a capacity no node has, so a corrupt object cannot exhaust memory.
    let units = |resource: &str| {
        let count = capacity.and_then(|c| c.get(resource)).and_then(whole)?;
        Some(usize::try_from(count).unwrap_or(0).min(1024)).filter(|&c| c > 0)
    };
    let nvidia_product = labels.and_then(|l| l.get(NVIDIA_PRODUCT_LABEL)).cloned();
    let mut kinds = Vec::new();
    for (resource, vendor, product_label) in GPU_RESOURCES {
        let Some(count) = units(resource) else { continue };
        let model =
            labels.and_then(|l| l.get(product_label)).cloned().unwrap_or_else(|| match vendor {
                Vendor::Nvidia => "nvidia-gpu".to_string(),
                Vendor::Amd => "amd-gpu".to_string(),
            });
        let memory_mib = match vendor {
            Vendor::Nvidia => labels
                .and_then(|l| l.get(NVIDIA_MEMORY_LABEL))
                .and_then(|m| m.trim().parse().ok())
                .unwrap_or(0),
            Vendor::Amd => 0,
        };
        kinds.push(GpuKind { resource: resource.to_string(), vendor, model, memory_mib, count });
    }
    for resource in capacity.into_iter().flat_map(|c| c.keys()) {
        let (Some(profile), Some(count)) = (mig_profile(resource), units(resource)) else {
            continue;
        };
        let product = nvidia_product.as_deref().unwrap_or("nvidia-gpu");
        kinds.push(GpuKind {
            resource: resource.clone(),
            vendor: Vendor::Nvidia,
            model: mig_model(product, profile),
            memory_mib: mig_memory_mib(profile),
            count,
        });
    }
    kinds
}

/// The node's GPUs as devices: one per unit of each GPU resource in its capacity (a MIG slice
/// is a device of its own model, as Kubernetes counts it).
fn devices_of(node: &Node) -> Vec<DeviceSpec> {
    let mut devices = Vec::new();
    for kind in gpu_kinds(node) {
        devices.extend(std::iter::repeat_n(
            DeviceSpec { model: kind.model, memory_mib: kind.memory_mib, island: 0, mig: false },
            kind.count,
        ));
    }
    devices
}

/// The resource whose unit device `index` of `node` is (`nvidia.com/gpu`,
/// `nvidia.com/mig-1g.10gb`, …), as [`node_spec`] numbers the devices.
pub fn device_resource(node: &Node, index: u32) -> Option<String> {
    let mut first = 0usize;
    for kind in gpu_kinds(node) {
        if (index as usize) < first + kind.count {
            return Some(kind.resource);
        }
        first += kind.count;
    }
    None
}

/// The GPU models of a cluster's nodes, by GPU resource: what a pending pod may be placed on
/// (see [`acceptable_models`]).
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    models: BTreeMap<String, BTreeSet<String>>,
}

impl Fleet {
    pub fn of<'n>(nodes: impl IntoIterator<Item = &'n Node>) -> Fleet {
        let mut fleet = Fleet::default();
        for node in nodes {
            for kind in gpu_kinds(node) {
                fleet.models.entry(kind.resource).or_default().insert(kind.model);
            }
        }
        fleet
    }
}

/// The GPU models a pending pod asking for `ask` may be placed on (empty: any), or why it
/// cannot be placed at all, naming the field and the fix. The model its node selector names
/// (for a MIG resource, that product's slices of the profile), if a node has it; else, in a
/// cluster of one kind of GPU resource, any model (so a node of a new model is usable as soon
/// as it joins), and in a cluster of several (both vendors, MIG slices beside whole GPUs),
/// the models of the resource it asks for: the device plugin would give it nothing else.
pub fn acceptable_models(pod: &Pod, ask: &GpuAsk, fleet: &Fleet) -> Result<Vec<String>, String> {
    if ask.gpus == 0 {
        return Ok(Vec::new());
    }
    let resource = ask.resource.as_str();
    let here = fleet.models.get(resource);
    let selected = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()).and_then(|s| {
        [NVIDIA_PRODUCT_LABEL, AMD_PRODUCT_LABEL].into_iter().find_map(|label| {
            let product = s.get(label)?;
            let model = match mig_profile(resource) {
                Some(profile) if label == NVIDIA_PRODUCT_LABEL => mig_model(product, profile),
                _ => product.clone(),
            };
            Some((label, model))
        })
    });
    match (selected, here) {
        (Some((_, model)), Some(models)) if models.contains(&model) => Ok(vec![model]),
        (Some((label, model)), Some(models)) => Err(format!(
            "spec.nodeSelector[{label}] is {model:?}: no node of this cluster has {resource} of              that model (its models: {}); select one of them, or remove the selector",
            models.iter().cloned().collect::<Vec<_>>().join(", ")
        )),
        (_, None) => Err(format!(
            "spec.containers asks for {resource}: no node of this cluster has that resource              (its GPU resources: {}); ask for one it has, or add a node with {resource}",
            if fleet.models.is_empty() {
                "none".to_string()
            } else {
                fleet.models.keys().cloned().collect::<Vec<_>>().join(", ")
            }
        )),
        (None, Some(_)) if fleet.models.len() == 1 => Ok(Vec::new()),
        (None, Some(models)) => Ok(models.iter().cloned().collect()),
    }
}

/// `node` as the engine's spec, `None` when it has no whole GPUs (allot governs GPU nodes only).
pub fn node_spec(node: &Node) -> Option<NodeSpec> {
    let name = node.metadata.name.clone()?;
    let devices = devices_of(node);
    if devices.is_empty() {
        return None;
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
    Some(NodeSpec {
        name,
        cpu_millis: allocatable.get("cpu").and_then(|q| quantity_scaled(q, 1000.0)).unwrap_or(0),
        memory_mib: allocatable
            .get("memory")
            .and_then(|q| quantity_scaled(q, 1.0 / (1024.0 * 1024.0)))
            .unwrap_or(0),
        pool: labels.get(ZONE_LABEL).cloned(),
        rack: labels.get(RACK_LABEL).cloned(),
        labels,
        devices,
    })
}

/// Whether new work may be placed on `node`: its `Ready` condition is `True` and it is not
/// cordoned (`spec.unschedulable`). The reason names whichever is not so. Taints are not read
/// yet: a pod that asks for allot is placed on a tainted node only if it tolerates the taint,
/// which allot does not check.
pub fn node_status(node: &Node) -> NodeStatus {
    let name = node.metadata.name.clone().unwrap_or_default();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let mut words = Vec::new();
    let is_ready = ready.is_some_and(|c| c.status == "True");
    if !is_ready {
        let detail = ready
            .and_then(|c| c.message.clone().or_else(|| c.reason.clone()))
            .unwrap_or_else(|| "no Ready condition reported".to_string());
        words.push(format!("NotReady: {detail}"));
    }
    if cordoned {
        words.push("cordoned (spec.unschedulable; kubectl uncordon to use it)".to_string());
    }
    let usable = is_ready && !cordoned;
    NodeStatus {
        node: name,
        usable,
        reason: if usable { "Ready".into() } else { words.join("; ") },
    }
}

/// `"namespace/name"`: which pod this is by name (pods gone and created again share it).
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod_namespace(pod), pod.metadata.name.as_deref().unwrap_or_default())
}

/// A namespaced object's `namespace/name`.
pub fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default())
}

pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// A pod's handle, what [`allot_backend::Launch::adopt`] names: `namespace/name@uid`
/// (`namespace/name` for an object without a uid, which the API server always sets).
pub fn pod_handle(pod: &Pod) -> String {
    match pod.metadata.uid.as_deref() {
        Some(uid) => format!("{}@{uid}", pod_key(pod)),
        None => pod_key(pod),
    }
}

/// A group's handle: `namespace/group:name@id` ([`group_id`]).
pub fn group_handle(namespace: &str, group: &str, uid: Option<&str>) -> String {
    match uid {
        Some(uid) => format!("{namespace}/group:{group}@{uid}"),
        None => format!("{namespace}/group:{group}"),
    }
}

/// What a handle names. (`:` and `@` are in no pod name, label value or namespace, so the
/// forms cannot be confused.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handle<'a> {
    Pod {
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    },
    Group {
        namespace: &'a str,
        group: &'a str,
        uid: Option<&'a str>,
    },
    /// A Job or JobSet queued for allot (see the `job` module): `namespace/job:name@uid`,
    /// `namespace/jobset:name@uid`.
    Job {
        kind: crate::job::QueuedKind,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    },
}

impl Handle<'_> {
    pub fn namespace(&self) -> &str {
        match self {
            Handle::Pod { namespace, .. }
            | Handle::Group { namespace, .. }
            | Handle::Job { namespace, .. } => namespace,
        }
    }

    pub fn uid(&self) -> Option<&str> {
        match self {
            Handle::Pod { uid, .. } | Handle::Group { uid, .. } | Handle::Job { uid, .. } => *uid,
        }
    }
}

/// A handle as what it names; `None` if it is none of the forms above.
pub fn parse_handle(handle: &str) -> Option<Handle<'_>> {
    let (namespace, rest) = handle.trim().split_once('/')?;
    // `~…`: the mark of refused work (see `allot_work`).
    let rest = rest.split_once('~').map_or(rest, |(rest, _)| rest);
    let (name, uid) = match rest.split_once('@') {
        Some((name, uid)) if !uid.is_empty() => (name, Some(uid)),
        Some(_) => return None,
        None => (rest, None),
    };
    let plain = |s: &str| !s.is_empty() && !s.contains(['/', ':', '@']);
    if !plain(namespace) {
        return None;
    }
    match name.split_once(':') {
        Some(("group", group)) if plain(group) => Some(Handle::Group { namespace, group, uid }),
        Some(("job", name)) if plain(name) => {
            Some(Handle::Job { kind: crate::job::QueuedKind::Job, namespace, name, uid })
        }
        Some(("jobset", name)) if plain(name) => {
            Some(Handle::Job { kind: crate::job::QueuedKind::JobSet, namespace, name, uid })
        }
        Some(_) => None,
        None if plain(name) => Some(Handle::Pod { namespace, name, uid }),
        None => None,
    }
}

pub fn asks_allot(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()) == Some(SCHEDULER_NAME)
}

pub fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether the pod still has scheduling gates (`spec.schedulingGates`): no scheduler may bind
/// it until whoever set them removes them (the API server refuses the Binding), and the API
/// server already says so in its PodScheduled condition (reason `SchedulingGated`).
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty())
}

/// What a pod asks for: units of one GPU resource (whole GPUs of one vendor, or MIG slices of
/// one profile), summed over its containers' limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuAsk {
    pub gpus: u32,
    pub vendor: Vendor,
    /// The resource asked for (`nvidia.com/gpu` when none is).
    pub resource: String,
}

impl GpuAsk {
    /// No GPU.
    pub fn none() -> GpuAsk {
        GpuAsk { gpus: 0, vendor: Vendor::Nvidia, resource: NVIDIA_GPU.to_string() }
    }
}

/// The pod's GPU request, or why allot cannot place it (naming the field and the fix). Init
/// containers are not counted (they run before the containers, on the same devices).
pub fn gpu_ask(pod: &Pod) -> Result<GpuAsk, String> {
    let mut total: u64 = 0;
    let mut kinds: BTreeMap<String, Vendor> = BTreeMap::new();
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    for (i, container) in containers.iter().enumerate() {
        let resources = container.resources.as_ref();
        let limits = resources.and_then(|r| r.limits.clone()).unwrap_or_default();
        let requests = resources.and_then(|r| r.requests.clone()).unwrap_or_default();
        // Extended resources are given in limits (requests, if set, must equal them): read the
        // limit, or the request where only that is set.
        let asked = limits.iter().map(|(r, q)| (r, q, "limits")).chain(
            requests
                .iter()
                .filter(|(r, _)| !limits.contains_key(*r))
                .map(|(r, q)| (r, q, "requests")),
        );
        for (resource, quantity, kind) in asked {
            let field = format!("spec.containers[{i}].resources.{kind}[{resource}]");
            let vendor = match GPU_RESOURCES.iter().find(|(r, _, _)| r == resource) {
                Some(&(_, vendor, _)) => vendor,
                None if mig_profile(resource).is_some() => Vendor::Nvidia,
                None => continue,
            };
            let Some(count) = whole(quantity) else {
                return Err(format!(
                    "{field} is {:?}: allot places whole GPUs; ask for a whole number such as \"1\"",
                    quantity.0
                ));
            };
            if count > 0 {
                kinds.insert(resource.clone(), vendor);
            }
            total = total.saturating_add(count);
        }
    }
    if kinds.len() > 1 {
        let names: Vec<&str> = kinds.keys().map(String::as_str).collect();
        return Err(format!(
            "spec.containers asks for both {}: one pod runs on one kind of GPU (whole GPUs of \
             one vendor, or MIG slices of one profile); ask for one of them",
            names.join(" and ")
        ));
    }
    let gpus = u32::try_from(total).map_err(|_| {
        format!("spec.containers asks for {total} GPUs: more than any node has; ask for fewer")
    })?;
    Ok(match kinds.into_iter().next() {
        Some((resource, vendor)) => GpuAsk { gpus, vendor, resource },
        None => GpuAsk { gpus, ..GpuAsk::none() },
    })
}

/// The GPU model a pod asks for through its node selector, if it names one.
pub fn asked_model(pod: &Pod) -> Option<String> {
    let selector = pod.spec.as_ref()?.node_selector.as_ref()?;
    selector.get(NVIDIA_PRODUCT_LABEL).or_else(|| selector.get(AMD_PRODUCT_LABEL)).cloned()
}

/// Who a pod belongs to: its label `allot.dev/user`, else its service account.
pub fn pod_user(pod: &Pod) -> String {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(USER_LABEL))
        .cloned()
        .or_else(|| pod.spec.as_ref().and_then(|s| s.service_account_name.clone()))
        .unwrap_or_else(|| "default".to_string())
}

/// Device indices for pods whose devices Kubernetes does not name: the device plugin picks them
/// on the node and the API does not expose them. Each gets the lowest indices not yet taken on
/// its node among the devices of the resource it asks for (allot's own runs take theirs
/// first), so the ledger's count per node and kind is right even though the indices are a
/// guess.
#[derive(Debug, Default)]
pub struct IndexGuess {
    taken: BTreeMap<String, BTreeSet<u32>>,
    /// The devices of each (node, resource), as `node_spec` numbers them: first..end. Unknown
    /// (a node not given): any index.
    ranges: BTreeMap<(String, String), (u32, u32)>,
}

impl IndexGuess {
    pub fn take(&mut self, node: &str, index: u32) {
        self.taken.entry(node.to_string()).or_default().insert(index);
    }

    /// A guess that knows which devices of `nodes` are of which resource.
    pub fn of_nodes<'n>(nodes: impl IntoIterator<Item = &'n Node>) -> IndexGuess {
        let mut guess = IndexGuess::default();
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else { continue };
            let mut first = 0u32;
            for kind in gpu_kinds(node) {
                let end = first.saturating_add(u32::try_from(kind.count).unwrap_or(u32::MAX));
                guess.ranges.insert((name.to_string(), kind.resource), (first, end));
                first = end;
            }
        }
        guess
    }

    /// `count` free indices of `resource` on `node`, lowest first, now taken (past the node's
    /// devices of the resource when they are all taken: the count stays right).
    pub fn lowest_free(&mut self, node: &str, resource: &str, count: u32) -> Vec<u32> {
        let first = self
            .ranges
            .get(&(node.to_string(), resource.to_string()))
            .map_or(0, |&(first, _)| first);
        let taken = self.taken.entry(node.to_string()).or_default();
        let picked: Vec<u32> =
            (first..).filter(|i| !taken.contains(i)).take(count as usize).collect();
        taken.extend(&picked);
        picked
    }
}

/// A pod as foreign work: pending when unbound (what it asks for), else running on its node
/// with `indices` guessed by `guess`. A pod whose GPU request or intent allot cannot take is
/// refused; one already bound is taken as it runs (with the policy's defaults for an intent
/// it cannot read). `fleet`: the cluster's GPU models, for the models a pending pod may take.
pub fn foreign_work(pod: &Pod, fleet: &Fleet, guess: &mut IndexGuess) -> ForeignWork {
    let ask = gpu_ask(pod);
    let asked = ask.clone().unwrap_or_else(|_| GpuAsk::none());
    let gpus = asked.gpus;
    let running = match bound_node(pod) {
        Some(node) => vec![running_member(node, &asked, guess)],
        None => Vec::new(),
    };
    let intent = pod_intent(pod);
    let models = ask.clone().and_then(|a| acceptable_models(pod, &a, fleet));
    let refusal = match (ask.as_ref(), intent.as_ref(), models.as_ref()) {
        _ if !running.is_empty() => None,
        (Err(why), _, _) | (Ok(_), Err(why), _) | (Ok(_), Ok(_), Err(why)) => Some(format!(
            "{why}; the pod stays unbound (correct it, or delete it and create it again)"
        )),
        _ => None,
    };
    // Running work is taken where it runs: no model to choose.
    let models = if running.is_empty() { models.unwrap_or_default() } else { Vec::new() };
    ForeignWork {
        handle: pod_handle(pod),
        name: pod.metadata.name.clone().unwrap_or_default(),
        project: pod_namespace(pod).to_string(),
        user: pod_user(pod),
        started_ms: started_ms(pod).filter(|_| !running.is_empty()),
        running,
        nodes: 1,
        gpus_per_node: gpus,
        models,
        refusal,
        intent: intent.unwrap_or_default(),
    }
}

pub(crate) fn running_member(node: &str, ask: &GpuAsk, guess: &mut IndexGuess) -> MemberLaunch {
    let vendor = ask.vendor;
    MemberLaunch {
        node: node.to_string(),
        devices: guess
            .lowest_free(node, &ask.resource, ask.gpus)
            .into_iter()
            .map(|index| DeviceAssignment { index, uuid: None, vendor, shares: 1000 })
            .collect(),
    }
}

pub(crate) fn started_ms(pod: &Pod) -> Option<u64> {
    let start = pod.status.as_ref()?.start_time.as_ref()?;
    u64::try_from(start.0.as_millisecond()).ok()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The intent a pod declares in its annotations (see the module's documentation), or what is
/// wrong with one of them, naming it and the fix.
pub fn pod_intent(pod: &Pod) -> Result<ForeignIntent, String> {
    let text = |key: &str| annotation(pod, key).map(str::trim);
    let kind = match text(KIND_ANNOTATION) {
        None => None,
        Some(k) if KINDS.contains(&k) => Some(k.to_string()),
        Some(k) => {
            return Err(format!(
                "annotation {KIND_ANNOTATION} is {k:?}: write one of {}",
                KINDS.join(", ")
            ));
        }
    };
    let priority_class = match text(PRIORITY_CLASS_ANNOTATION) {
        None => None,
        Some("") => {
            return Err(format!(
                "annotation {PRIORITY_CLASS_ANNOTATION} is empty: name one of the policy's \
                 priority classes, or remove the annotation for the default"
            ));
        }
        Some(c) => Some(c.to_string()),
    };
    let flag = |key: &str| match text(key) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(format!("annotation {key} is {other:?}: write \"true\" or \"false\"")),
    };
    let preemptible = flag(PREEMPTIBLE_ANNOTATION)?;
    let grace_s = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE_S, |g| u64::try_from(g).unwrap_or(0));
    let checkpoint_grace_s = flag(CHECKPOINTABLE_ANNOTATION)?.filter(|&c| c).map(|_| grace_s);
    let runtime = |key: &str| text(key).map(|t| duration_s(key, t)).transpose();
    Ok(ForeignIntent {
        kind,
        priority_class,
        preemptible,
        checkpoint_grace_s,
        min_runtime_s: runtime(MIN_RUNTIME_ANNOTATION)?,
        max_runtime_s: runtime(MAX_RUNTIME_ANNOTATION)?,
    })
}

/// A duration annotation in whole seconds, in the policy file's notation (a bare number is
/// refused: the policy reads it as milliseconds, `allot submit` as seconds).
fn duration_s(key: &str, text: &str) -> Result<u64, String> {
    let fix = "write a duration with its unit, such as 30m, 2h, 1h30m or 1d";
    if text.is_empty() || text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("annotation {key} is {text:?}: no unit; {fix}"));
    }
    let ms = allot_config::duration_ms(text)
        .map_err(|_| format!("annotation {key} is {text:?}: not a duration; {fix}"))?;
    if ms % 1000 != 0 || ms == 0 {
        return Err(format!("annotation {key} is {text:?}: not a whole number of seconds; {fix}"));
    }
    Ok(ms / 1000)
}

/// The group a pod belongs to by its labels, with the size its annotation says (or what is
/// wrong with it); `None` for a pod of no group.
pub fn pod_group(pod: &Pod) -> Option<(String, Result<u32, String>)> {
    let ours = label(pod, GROUP_LABEL).map(str::trim).filter(|g| !g.is_empty());
    let kueue = label(pod, KUEUE_GROUP_LABEL).map(str::trim).filter(|g| !g.is_empty());
    let name = ours.or(kueue)?.to_string();
    if let (Some(a), Some(b)) = (ours, kueue)
        && a != b
    {
        return Some((
            name,
            Err(format!(
                "labels {GROUP_LABEL}={a} and {KUEUE_GROUP_LABEL}={b} name different groups: \
                 remove one, or give both the same name"
            )),
        ));
    }
    let (key, size) = match (annotation(pod, GROUP_SIZE_ANNOTATION), ours) {
        (Some(size), _) => (GROUP_SIZE_ANNOTATION, Some(size)),
        (None, Some(_)) => (GROUP_SIZE_ANNOTATION, annotation(pod, KUEUE_GROUP_SIZE_ANNOTATION)),
        (None, None) => (KUEUE_GROUP_SIZE_ANNOTATION, annotation(pod, KUEUE_GROUP_SIZE_ANNOTATION)),
    };
    let size = match size.map(str::trim) {
        None => Err(format!(
            "pod group {name}: annotation {key} is missing: set it to the number of pods in the \
             group (e.g. \"2\")"
        )),
        Some(text) => {
            text.parse::<u32>().ok().filter(|n| (1..=GROUP_SIZE_MAX).contains(n)).ok_or_else(|| {
                format!(
                    "pod group {name}: annotation {key} is {text:?}: write the number of pods in \
                     the group, a whole number from 1 to {GROUP_SIZE_MAX}"
                )
            })
        }
    };
    Some((name, size))
}

/// What a PodScheduled condition should say on a pod allot does not place now, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The pod, `namespace/name`.
    pub pod: String,
    /// `AllotRefused` (the pod must be changed) or `AllotWaiting`.
    pub reason: &'static str,
    pub message: String,
}

/// allot's own pods (unbound or bound, none held by a run) as foreign work: a pod of no group
/// is work by itself; a group is one work of one member per pod, offered once all its pods
/// exist. Returns the work and the notes to show on pods that are refused or wait for their
/// group.
pub fn allot_work(
    pods: &[&Pod],
    fleet: &Fleet,
    guess: &mut IndexGuess,
) -> (Vec<ForeignWork>, Vec<Note>) {
    let mut works = Vec::new();
    let mut notes = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<&Pod>> = BTreeMap::new();
    for pod in pods {
        match pod_group(pod) {
            Some((group, _)) => {
                groups.entry((pod_namespace(pod).to_string(), group)).or_default().push(pod);
            }
            None => {
                let work = foreign_work(pod, fleet, guess);
                if let Some(why) = &work.refusal {
                    notes.push(Note {
                        pod: pod_key(pod),
                        reason: REFUSED_REASON,
                        message: why.clone(),
                    });
                }
                works.push(work);
            }
        }
    }
    for ((namespace, group), mut members) in groups {
        members.sort_by_key(|p| p.metadata.name.clone());
        let (work, note) = group_work(&namespace, &group, &members, fleet, guess);
        if let Some((reason, message)) = note {
            notes.extend(members.iter().map(|p| Note {
                pod: pod_key(p),
                reason,
                message: message.clone(),
            }));
        }
        works.extend(work);
    }
    for work in &mut works {
        mark_refused(work);
    }
    (works, notes)
}

/// Refused work is marked by its reason: work whose labels or annotations are corrected
/// (kubectl annotate --overwrite) is new work, not a handle the daemon already refused.
pub fn mark_refused(work: &mut ForeignWork) {
    if let Some(why) = &work.refusal {
        work.handle = format!("{}~{:08x}", work.handle, fnv64(why) >> 32);
    }
}

/// One group's pods (sorted by name) as work: `None` while pods are missing; refused (the
/// work carries the reason) when its pods disagree or one cannot be placed. The note is what
/// its pods should show.
fn group_work(
    namespace: &str,
    group: &str,
    members: &[&Pod],
    fleet: &Fleet,
    guess: &mut IndexGuess,
) -> (Option<ForeignWork>, Option<(&'static str, String)>) {
    let id = group_id(members);
    let handle = group_handle(namespace, group, Some(&id));
    let bound = members.iter().filter(|p| bound_node(p).is_some()).count();
    let checked = check_group(group, members, fleet);
    if bound > 0 && bound == members.len() {
        // Bound with no run of allot's holding it (a daemon that bound it and lost its log):
        // running work, taken as it runs.
        let mut work = group_base(&handle, group, namespace, members);
        for pod in members {
            let ask = gpu_ask(pod).unwrap_or_else(|_| GpuAsk::none());
            let node = bound_node(pod).unwrap_or_default();
            work.running.push(running_member(node, &ask, guess));
        }
        work.nodes = u32::try_from(members.len()).unwrap_or(u32::MAX);
        work.gpus_per_node = work.running.iter().map(|m| m.devices.len() as u32).max().unwrap_or(0);
        work.started_ms = members.iter().filter_map(|p| started_ms(p)).min();
        work.intent = checked.map(|c| c.intent).unwrap_or_default();
        return (Some(work), None);
    }
    let refuse = |why: String| {
        let mut work = group_base(&handle, group, namespace, members);
        let text = format!("{why}; no pod of the group is bound");
        work.refusal = Some(text.clone());
        (Some(work), Some((REFUSED_REASON, text)))
    };
    if bound > 0 {
        let names: Vec<String> = members
            .iter()
            .map(|p| {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                match bound_node(p) {
                    Some(node) => format!("{name} on {node}"),
                    None => format!("{name} unbound"),
                }
            })
            .collect();
        let mut work = group_base(&handle, group, namespace, members);
        let text = format!(
            "pod group {group} is partly bound ({}) and no run of allot's holds it: delete the \
             group's pods and create them again",
            names.join(", ")
        );
        work.refusal = Some(text.clone());
        return (Some(work), Some((REFUSED_REASON, text)));
    }
    let checked = match checked {
        Ok(c) => c,
        Err(why) => return refuse(why),
    };
    let have = members.len() as u64;
    if have > u64::from(checked.size) {
        return refuse(format!(
            "pod group {group} has {have} pods but its {GROUP_SIZE_ANNOTATION} is {}: delete the \
             extra pods or raise the size",
            checked.size
        ));
    }
    if have < u64::from(checked.size) {
        return (
            None,
            Some((
                WAITING_REASON,
                format!(
                    "pod group {group} has {have} of its {} pods ({GROUP_SIZE_ANNOTATION}); allot \
                     places none of them until all exist",
                    checked.size
                ),
            )),
        );
    }
    let mut work = group_base(&handle, group, namespace, members);
    work.nodes = checked.size;
    work.gpus_per_node = checked.gpus;
    work.models = checked.models;
    work.intent = checked.intent;
    (Some(work), None)
}

/// A group's identity: 16 hex digits of a 64-bit FNV-1a digest of its pods' uids, sorted
/// (stable across processes and versions, unlike std's hasher). Any pod replaced, added or
/// removed makes it another group.
pub fn group_id(members: &[&Pod]) -> String {
    let mut uids: Vec<&str> = members.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
    uids.sort_unstable();
    format!("{:016x}", fnv64(&uids.join(",")))
}

/// 64-bit FNV-1a.
fn fnv64(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// What every pod of a group agrees on.
struct GroupAsk {
    size: u32,
    gpus: u32,
    models: Vec<String>,
    intent: ForeignIntent,
}

/// Checks that a group's pods agree on size, GPUs, model and intent, and that each can be
/// placed; the error names the pods, the field and the fix.
fn check_group(group: &str, members: &[&Pod], fleet: &Fleet) -> Result<GroupAsk, String> {
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    let mut sizes = BTreeMap::new();
    let mut asks = BTreeMap::new();
    let mut models = BTreeMap::new();
    let mut intents: Vec<(String, ForeignIntent)> = Vec::new();
    for pod in members {
        if let Some((_, size)) = pod_group(pod) {
            sizes.insert(name(pod), size.map_err(|e| format!("pod {}: {e}", name(pod)))?);
        }
        let ask = gpu_ask(pod).map_err(|e| format!("pod {} of group {group}: {e}", name(pod)))?;
        asks.insert(name(pod), ask);
        models.insert(name(pod), asked_model(pod));
        let intent =
            pod_intent(pod).map_err(|e| format!("pod {} of group {group}: {e}", name(pod)))?;
        intents.push((name(pod), intent));
    }
    let disagree = |what: &str, fix: &str, values: Vec<String>| {
        format!("the pods of group {group} disagree on {what} ({}): {fix}", values.join(", "))
    };
    let distinct = |values: Vec<String>| values.iter().collect::<BTreeSet<_>>().len() > 1;
    let size_of: Vec<String> = sizes.iter().map(|(p, s)| format!("{p}: {s}")).collect();
    if distinct(sizes.values().map(u32::to_string).collect()) {
        return Err(disagree(
            GROUP_SIZE_ANNOTATION,
            "give every pod the same size, the number of pods in the group",
            size_of,
        ));
    }
    let gpus_of: Vec<String> = asks.iter().map(|(p, a)| format!("{p}: {}", a.gpus)).collect();
    if distinct(asks.values().map(|a| format!("{} {}", a.gpus, a.resource)).collect()) {
        return Err(disagree(
            "the GPUs each asks for (spec.containers[*].resources.limits)",
            "allot places a group as members of the same size; give every pod the same GPU \
             count and vendor",
            gpus_of,
        ));
    }
    let model_of: Vec<String> =
        models.iter().map(|(p, m)| format!("{p}: {}", m.as_deref().unwrap_or("any"))).collect();
    if distinct(models.values().map(|m| format!("{m:?}")).collect()) {
        return Err(disagree(
            "the GPU model (spec.nodeSelector)",
            "select the same GPU model in every pod",
            model_of,
        ));
    }
    let first = intents.first().map(|(_, i)| i.clone()).unwrap_or_default();
    if let Some((pod, _)) = intents.iter().find(|(_, i)| *i != first) {
        return Err(format!(
            "the pods of group {group} disagree on their allot.dev/* annotations (pod {pod} \
             differs from {}): give every pod the same kind, priority class, runtimes and flags",
            intents.first().map(|(p, _)| p.as_str()).unwrap_or_default()
        ));
    }
    let ask = asks.values().next().cloned().unwrap_or_else(GpuAsk::none);
    // The pods agree on the ask and the model: the first one's models are the group's.
    let models = match members.first() {
        Some(pod) => acceptable_models(pod, &ask, fleet)
            .map_err(|e| format!("pod {} of group {group}: {e}", name(pod)))?,
        None => Vec::new(),
    };
    Ok(GroupAsk {
        size: sizes.values().next().copied().unwrap_or(1),
        gpus: ask.gpus,
        models,
        intent: first,
    })
}

fn group_base(handle: &str, group: &str, namespace: &str, members: &[&Pod]) -> ForeignWork {
    ForeignWork {
        handle: handle.to_string(),
        name: group.to_string(),
        project: namespace.to_string(),
        user: members.first().map_or_else(|| "default".to_string(), |p| pod_user(p)),
        running: Vec::new(),
        nodes: u32::try_from(members.len()).unwrap_or(u32::MAX).max(1),
        gpus_per_node: 0,
        models: Vec::new(),
        started_ms: None,
        refusal: None,
        intent: ForeignIntent::default(),
    }
}

/// How a finished pod ended: the exit code of the first container that failed, else 0 when
/// every container ended with 0 (or the pod Succeeded); `None` with the pod's words when no
/// container reports an exit code.
pub fn exit_status(pod: &Pod) -> (Option<i32>, String) {
    let status = pod.status.as_ref();
    let terminated: Vec<_> = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| Some((c.name.as_str(), c.state.as_ref()?.terminated.as_ref()?)))
        .collect();
    if let Some((name, t)) = terminated.iter().find(|(_, t)| t.exit_code != 0) {
        let why = t.reason.as_deref().unwrap_or("Error");
        return (Some(t.exit_code), format!("container {name} exited {} ({why})", t.exit_code));
    }
    let phase = phase_of(status);
    if !terminated.is_empty() || phase == "Succeeded" {
        return (Some(0), format!("pod {phase}"));
    }
    let words = status
        .and_then(|s| s.message.clone().or_else(|| s.reason.clone()))
        .unwrap_or_else(|| "no container reported an exit code".to_string());
    (None, format!("pod {phase}: {words}"))
}

fn phase_of(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> &str {
    status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// One NVIDIA model, `NVIDIA-H100-80GB-HBM3`: the fleet of the unit tests' pods.
#[cfg(test)]
pub(crate) fn tests_fleet() -> Fleet {
    let models = BTreeSet::from(["NVIDIA-H100-80GB-HBM3".to_string()]);
    Fleet { models: BTreeMap::from([(NVIDIA_GPU.to_string(), models)]) }
}

#[cfg(test)]
mod tests;
