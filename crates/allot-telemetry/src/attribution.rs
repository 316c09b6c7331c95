//! From samples to workloads (pure): which device, MIG instance or partition each allocation
//! holds, and which processes belong to which workload.
//!
//! An allocation is found by its device index, or, on Kubernetes, by its pod: there the node's
//! device plugin, not allot, picks the GPUs a pod gets, and the exporters (dcgm-exporter in
//! Kubernetes mode, AMD's device-metrics-exporter) label each GPU's series with the pod that
//! holds it. A pod allocation takes only samples labelled with its pod's namespace *and* name
//! on its node: a name is unique only within its namespace, and allot cannot see whether a pod
//! of another scheduler on the node has the same name in another namespace, so a sample whose
//! pod label comes without a namespace matches no pod (missing telemetry, which is never idle,
//! rather than perhaps another pod's reading).

use std::collections::BTreeMap;

use allot_core::Event;
use allot_core::WorkloadId;
use allot_core::idle::DeviceReading;

use crate::sample::Sample;

/// One allocated device (or slice) of a running workload, as the engine placed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Node name; matched against the sample's hostname.
    pub node: String,
    pub device_index: u32,
    /// MIG GPU instance id, when the allocation is a MIG instance.
    pub mig_instance: Option<u32>,
    /// AMD partition id, when the allocation is one partition of a partitioned GPU.
    pub amd_partition: Option<u32>,
    pub workload: WorkloadId,
    pub member: u32,
    /// Shares of the device allocated (1..=1000).
    pub shares: u32,
    /// The pod the member is, where the backend knows it (Kubernetes): the allocation is then
    /// matched by pod, not by `device_index`, which is allot's guess and not the real GPU.
    pub pod: Option<PodRef>,
}

/// A Kubernetes pod by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// Whether the exporter labels `sample`'s device as held by `pod` (namespace and name; see the
/// module's documentation for why a name alone is not enough). A device several pods share
/// (time-slicing) is held by each: its activity bounds each one's from above.
pub fn held_by(sample: &Sample, pod: &PodRef) -> bool {
    sample
        .jobs
        .pods
        .iter()
        .any(|p| p.pod == pod.name && p.namespace.as_deref() == Some(pod.namespace.as_str()))
}

/// A device's place among a pod's devices on a node: index, MIG instance, AMD partition (an
/// unpartitioned AMD GPU is reported as partition 0 or not at all).
type PodDevice = (Option<u32>, Option<u32>, Option<u32>);

/// The newest sample of each device `pod` holds on `node`, by device index.
fn pod_samples<'a>(samples: &'a [Sample], node: &str, pod: &PodRef) -> Vec<&'a Sample> {
    let mut newest: BTreeMap<PodDevice, &Sample> = BTreeMap::new();
    let on_node = samples.iter().filter(|s| s.identity.hostname.as_deref() == Some(node));
    for s in on_node.filter(|s| held_by(s, pod)) {
        let id = &s.identity;
        let device = (id.gpu_index, id.mig_instance, id.amd_partition.filter(|p| *p != 0));
        // The later one in `samples` wins a tie, as for device allocations.
        if newest.get(&device).is_none_or(|old| old.at_ms <= s.at_ms) {
            newest.insert(device, s);
        }
    }
    newest.into_values().collect()
}

fn matches(sample: &Sample, allocation: &Allocation) -> bool {
    let id = &sample.identity;
    id.hostname.as_deref() == Some(allocation.node.as_str())
        && id.gpu_index == Some(allocation.device_index)
        && id.mig_instance == allocation.mig_instance
        // An unpartitioned AMD GPU is reported as partition "NA" or as partition 0 (SPX).
        && id.amd_partition.unwrap_or(0) == allocation.amd_partition.unwrap_or(0)
}

/// One reading per allocation, grouped by workload, in allocation order. Each allocation takes
/// the newest matching sample (by `at_ms`; the later one in `samples` on a tie); an allocation
/// without one gets a reading with no signal, which the idle tracker treats as missing telemetry.
/// The allocations of a member with a pod take, in order, one device each of those the pod
/// holds on the member's node, by device index: the pod's GPUs are interchangeable to allot,
/// and a device is never read twice for one member.
pub fn attribute(
    samples: &[Sample],
    allocations: &[Allocation],
) -> BTreeMap<WorkloadId, Vec<DeviceReading>> {
    let mut out: BTreeMap<WorkloadId, Vec<DeviceReading>> = BTreeMap::new();
    // Per member with a pod: its pod's samples, and how many of them its allocations took.
    let mut pods: BTreeMap<(WorkloadId, u32), (Vec<&Sample>, usize)> = BTreeMap::new();
    for allocation in allocations {
        let newest = match &allocation.pod {
            None => samples.iter().filter(|s| matches(s, allocation)).max_by_key(|s| s.at_ms),
            Some(pod) => {
                let (held, taken) = pods
                    .entry((allocation.workload, allocation.member))
                    .or_insert_with(|| (pod_samples(samples, &allocation.node, pod), 0));
                *taken += 1;
                held.get(*taken - 1).copied()
            }
        };
        let reading = match newest {
            Some(sample) => sample.device_reading(allocation.member, allocation.shares),
            None => DeviceReading {
                member: allocation.member,
                shares: allocation.shares,
                ..DeviceReading::default()
            },
        };
        out.entry(allocation.workload).or_default().push(reading);
    }
    out
}

/// The engine events for attributed readings: one `ActivitySampled` per workload.
pub fn activity_events(readings: BTreeMap<WorkloadId, Vec<DeviceReading>>) -> Vec<Event> {
    readings
        .into_iter()
        .map(|(workload, readings)| Event::ActivitySampled { workload, readings })
        .collect()
}

/// What a workload's own processes do on the GPUs (from NVML's process lists).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessSummary {
    /// The workload's PIDs seen on a GPU, sorted.
    pub pids: Vec<u32>,
    /// GPU memory its processes hold, summed over devices.
    pub memory_used_mib: u64,
    /// The highest per-process SM utilisation seen (permille); `None` when NVML had no
    /// utilisation sample for any of them (no activity in the last sample period).
    pub sm_util_permille_max: Option<u16>,
}

/// Per-workload process activity. `owner_of` maps a host PID to its workload (the local
/// backend knows each member's process group; a PID whose group is a member's belongs to it).
pub fn attribute_processes(
    samples: &[Sample],
    owner_of: impl Fn(u32) -> Option<WorkloadId>,
) -> BTreeMap<WorkloadId, ProcessSummary> {
    let mut out: BTreeMap<WorkloadId, ProcessSummary> = BTreeMap::new();
    for process in samples.iter().flat_map(|s| &s.processes) {
        let Some(workload) = owner_of(process.pid) else { continue };
        let summary = out.entry(workload).or_default();
        if let Err(at) = summary.pids.binary_search(&process.pid) {
            summary.pids.insert(at, process.pid);
        }
        summary.memory_used_mib =
            summary.memory_used_mib.saturating_add(process.memory_used_mib.unwrap_or(0));
        if let Some(util) = process.sm_util_permille {
            summary.sm_util_permille_max =
                Some(summary.sm_util_permille_max.map_or(util, |m| m.max(util)));
        }
    }
    out
}
