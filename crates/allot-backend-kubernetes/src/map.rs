//! Kubernetes objects as allot's model: pure functions over the API's types, no I/O.
//!
//! Label and resource names read here:
//! - GPUs: the extended resources `nvidia.com/gpu` and `amd.com/gpu` (device plugins). MIG
//!   resources (`nvidia.com/mig-1g.10gb`, …) are not supported yet: such devices are not in the
//!   inventory, and a pod that asks for one is refused.
//! - GPU model: the node label `nvidia.com/gpu.product` / `amd.com/gpu.product` (GPU feature
//!   discovery), else `nvidia-gpu` / `amd-gpu`; GPU memory: `nvidia.com/gpu.memory` (MiB).
//! - pool: `topology.kubernetes.io/zone`; rack: `allot.dev/rack` (Kubernetes has no standard
//!   rack label).
//! - a pod's user: its label `allot.dev/user`, else its service account; its project: its
//!   namespace.

use std::collections::{BTreeMap, BTreeSet};

use allot_backend::{DeviceAssignment, ForeignWork, MemberLaunch, NodeStatus, Vendor};
use allot_core::{DeviceSpec, NodeSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The `spec.schedulerName` of pods allot schedules.
pub const SCHEDULER_NAME: &str = "allot";
pub const USER_LABEL: &str = "allot.dev/user";
pub const RACK_LABEL: &str = "allot.dev/rack";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
pub const AMD_GPU: &str = "amd.com/gpu";
const NVIDIA_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
const AMD_PRODUCT_LABEL: &str = "amd.com/gpu.product";
const NVIDIA_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";

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

/// The node's GPUs as devices: one per unit of each GPU resource in its capacity.
fn devices_of(node: &Node) -> Vec<DeviceSpec> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let capacity = node.status.as_ref().and_then(|s| s.capacity.clone()).unwrap_or_default();
    let mut devices = Vec::new();
    for (resource, vendor, product_label) in GPU_RESOURCES {
        let Some(count) = capacity.get(resource).and_then(whole) else { continue };
        let model = labels.get(product_label).cloned().unwrap_or_else(|| match vendor {
            Vendor::Nvidia => "nvidia-gpu".to_string(),
            Vendor::Amd => "amd-gpu".to_string(),
        });
        let memory_mib = match vendor {
            Vendor::Nvidia => labels.get(NVIDIA_MEMORY_LABEL).and_then(|m| m.trim().parse().ok()),
            Vendor::Amd => None,
        }
        .unwrap_or(0);
        // A bound on a capacity no node has, so a corrupt object cannot exhaust memory.
        let count = usize::try_from(count).unwrap_or(0).min(1024);
        devices.extend(std::iter::repeat_n(
            DeviceSpec { model, memory_mib, island: 0, mig: false },
            count,
        ));
    }
    devices
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

/// `"namespace/name"`: a pod's handle, what [`allot_backend::Launch::adopt`] names.
pub fn pod_handle(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A handle as `(namespace, name)`; `None` if it is not `namespace/name`.
pub fn parse_handle(handle: &str) -> Option<(&str, &str)> {
    let (namespace, name) = handle.trim().split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then_some((namespace, name))
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

/// What a pod asks for: whole GPUs of one vendor, summed over its containers' limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuAsk {
    pub gpus: u32,
    pub vendor: Vendor,
}

/// The pod's GPU request, or why allot cannot place it (naming the field and the fix). Init
/// containers are not counted (they run before the containers, on the same devices).
pub fn gpu_ask(pod: &Pod) -> Result<GpuAsk, String> {
    let mut total: u64 = 0;
    let mut vendors = BTreeSet::new();
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
            if resource.starts_with("nvidia.com/mig-") {
                return Err(format!(
                    "{field}: MIG devices are not supported by allot's Kubernetes backend yet; \
                     ask for whole GPUs ({NVIDIA_GPU})"
                ));
            }
            let Some(&(_, vendor, _)) = GPU_RESOURCES.iter().find(|(r, _, _)| r == resource) else {
                continue;
            };
            let Some(count) = whole(quantity) else {
                return Err(format!(
                    "{field} is {:?}: allot places whole GPUs; ask for a whole number such as \"1\"",
                    quantity.0
                ));
            };
            vendors.insert(vendor == Vendor::Amd);
            total = total.saturating_add(count);
        }
    }
    if vendors.len() > 1 {
        return Err(format!(
            "spec.containers asks for both {NVIDIA_GPU} and {AMD_GPU}: one pod runs on one \
             node's GPUs of one vendor; ask for one of them"
        ));
    }
    let vendor = if vendors.contains(&true) { Vendor::Amd } else { Vendor::Nvidia };
    let gpus = u32::try_from(total).map_err(|_| {
        format!("spec.containers asks for {total} GPUs: more than any node has; ask for fewer")
    })?;
    Ok(GpuAsk { gpus, vendor })
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
/// its node (allot's own runs take theirs first), so the ledger's count per node is right even
/// though the indices are a guess.
#[derive(Debug, Default)]
pub struct IndexGuess {
    taken: BTreeMap<String, BTreeSet<u32>>,
}

impl IndexGuess {
    pub fn take(&mut self, node: &str, index: u32) {
        self.taken.entry(node.to_string()).or_default().insert(index);
    }

    /// `count` free indices on `node`, lowest first, now taken.
    pub fn lowest_free(&mut self, node: &str, count: u32) -> Vec<u32> {
        let taken = self.taken.entry(node.to_string()).or_default();
        let picked: Vec<u32> = (0..).filter(|i| !taken.contains(i)).take(count as usize).collect();
        taken.extend(&picked);
        picked
    }
}

/// A pod as foreign work: pending when unbound (what it asks for), else running on its node
/// with `indices` guessed by `guess`. A pod whose GPU request allot cannot place is refused;
/// one already bound is taken as it runs.
pub fn foreign_work(pod: &Pod, guess: &mut IndexGuess) -> ForeignWork {
    let ask = gpu_ask(pod);
    let (gpus, vendor) = ask.as_ref().map_or((0, Vendor::Nvidia), |a| (a.gpus, a.vendor));
    let running = match bound_node(pod) {
        Some(node) => vec![MemberLaunch {
            node: node.to_string(),
            devices: guess
                .lowest_free(node, gpus)
                .into_iter()
                .map(|index| DeviceAssignment { index, uuid: None, vendor, shares: 1000 })
                .collect(),
        }],
        None => Vec::new(),
    };
    let started_ms = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .filter(|_| !running.is_empty())
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok());
    let refusal = match ask {
        Err(why) if running.is_empty() => {
            Some(format!("{why}; the pod stays unbound (delete it and create it again)"))
        }
        _ => None,
    };
    ForeignWork {
        handle: pod_handle(pod),
        name: pod.metadata.name.clone().unwrap_or_default(),
        project: pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_string()),
        user: pod_user(pod),
        running,
        nodes: 1,
        gpus_per_node: gpus,
        model: asked_model(pod),
        started_ms,
        refusal,
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

#[cfg(test)]
mod tests;
