//! Telemetry attribution, pure: the machine keeps the newest sample per device and, every
//! telemetry round, attributes them to the running workloads' devices by node and device
//! index, or, for a run the backend named pods for (Kubernetes), by node and the exporters'
//! pod labels (`allot_telemetry::attribution` says why). What it attributes is logged
//! (`Entry::Sampled`) before the engine sees it, so a replay judges idleness on the same
//! readings.

use std::collections::BTreeMap;

use allot_core::WorkloadId;
use allot_core::idle::DeviceReading;
use allot_telemetry::Sample;
use allot_telemetry::attribution::{self, Allocation, PodRef};
use serde::{Deserialize, Serialize};

/// A device's sample older than this is not attributed (its source stopped answering).
pub(crate) const SAMPLE_FRESH_MS: u64 = 30_000;

/// One allocated device's reading as the log keeps it (the engine's `DeviceReading`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Reading {
    pub member: u32,
    pub shares: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_active: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilisation: Option<u16>,
}

impl From<DeviceReading> for Reading {
    fn from(r: DeviceReading) -> Reading {
        Reading {
            member: r.member,
            shares: r.shares,
            sm_active: r.sm_active,
            engine_active: r.engine_active,
            utilisation: r.utilisation,
        }
    }
}

impl From<Reading> for DeviceReading {
    fn from(r: Reading) -> DeviceReading {
        DeviceReading {
            member: r.member,
            shares: r.shares,
            sm_active: r.sm_active,
            engine_active: r.engine_active,
            utilisation: r.utilisation,
        }
    }
}

/// A device's key among the newest samples.
pub(crate) type DeviceKey = (String, u32, Option<u32>, Option<u32>);

/// The newest sample of every device heard from, and what the last round attributed.
#[derive(Debug, Default)]
pub(crate) struct Latest {
    pub samples: BTreeMap<DeviceKey, Sample>,
    /// Per running workload, the readings of the last round (for `/metrics`).
    pub readings: BTreeMap<u64, Vec<DeviceReading>>,
}

impl Latest {
    /// Keeps each device's newest sample; samples without a hostname or index cannot be
    /// attributed and are dropped.
    pub(crate) fn take(&mut self, samples: Vec<Sample>) {
        for s in samples {
            let id = &s.identity;
            let (Some(host), Some(index)) = (id.hostname.clone(), id.gpu_index) else { continue };
            let key = device_key(host, index, id.mig_instance, id.amd_partition);
            let newer = self.samples.get(&key).is_none_or(|old| old.at_ms <= s.at_ms);
            if newer {
                self.samples.insert(key, s);
            }
        }
    }

    /// Readings per workload for `allocations`, from samples at most `SAMPLE_FRESH_MS` old;
    /// a workload with no reading carrying a signal is left out (its telemetry is missing).
    /// On a device several workloads share, the device's activity says nothing of each: where
    /// the source lists the device's processes (NVML), each workload is judged on its own
    /// processes' SM utilisation (`owner_of`: process id → workload), 0 if it has none there.
    pub(crate) fn attribute(
        &mut self,
        now_ms: u64,
        allocations: &[Allocation],
        owner_of: impl Fn(u32) -> Option<u64>,
    ) -> BTreeMap<u64, Vec<DeviceReading>> {
        self.samples.retain(|_, s| s.at_ms.is_some_and(|t| t + SAMPLE_FRESH_MS >= now_ms));
        let device = |a: &Allocation| {
            device_key(a.node.clone(), a.device_index, a.mig_instance, a.amd_partition)
        };
        let mut sharers: BTreeMap<DeviceKey, usize> = BTreeMap::new();
        for a in allocations.iter().filter(|a| a.pod.is_none()) {
            *sharers.entry(device(a)).or_default() += 1;
        }
        // Per member with a pod: the devices its pod holds on its node, and how many its
        // allocations took (each takes the next, by device index).
        let mut pods: BTreeMap<(WorkloadId, u32), (Vec<DeviceKey>, usize)> = BTreeMap::new();
        // One lookup per allocation in the newest-sample index (no scan of every sample; a
        // pod's, a scan of its node's devices).
        let mut readings: BTreeMap<u64, Vec<DeviceReading>> = BTreeMap::new();
        for a in allocations {
            let key = match &a.pod {
                None => Some(device(a)),
                Some(pod) => {
                    let (held, taken) = pods
                        .entry((a.workload, a.member))
                        .or_insert_with(|| (self.held_by(&a.node, pod), 0));
                    *taken += 1;
                    held.get(*taken - 1).cloned()
                }
            };
            let sample = key.as_ref().and_then(|k| self.samples.get(k));
            let mut reading = sample.map_or(
                DeviceReading { member: a.member, shares: a.shares, ..DeviceReading::default() },
                |s| s.device_reading(a.member, a.shares),
            );
            // Pods sharing a device (time-slicing) each take the device's reading: exporters
            // list no processes to split it by, and it bounds each pod's activity from above.
            let shared = key.as_ref().and_then(|k| sharers.get(k)).is_some_and(|n| *n > 1);
            if let Some(s) = sample.filter(|s| shared && s.processes_listed) {
                let own = s
                    .processes
                    .iter()
                    .filter(|p| owner_of(p.pid) == Some(a.workload.0))
                    .filter_map(|p| p.sm_util_permille)
                    .max()
                    .unwrap_or(0);
                // Permille of the device, as every reading; the idle rule weighs it by share.
                reading.sm_active = None;
                reading.engine_active = None;
                reading.utilisation = Some(own.min(1000));
            }
            readings.entry(a.workload.0).or_default().push(reading);
        }
        readings.retain(|_, r| r.iter().any(|r| r.best_signal().is_some()));
        self.readings.clone_from(&readings);
        readings
    }

    /// The devices on `node` whose newest sample the exporter labels with `pod`, by index.
    fn held_by(&self, node: &str, pod: &PodRef) -> Vec<DeviceKey> {
        let from = (node.to_string(), 0, None, None);
        self.samples
            .range(from..)
            .take_while(|(k, _)| k.0 == node)
            .filter(|(_, s)| attribution::held_by(s, pod))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Whether a reading shows at least `threshold` permille of its share busy.
pub(crate) fn busy(r: &DeviceReading, threshold: u16) -> bool {
    r.best_signal()
        .is_some_and(|(_, v)| u64::from(v) * 1000 >= u64::from(threshold) * u64::from(r.shares))
}

/// A device's key; an unpartitioned AMD GPU is reported as partition 0 or not at all.
fn device_key(host: String, index: u32, mig: Option<u32>, partition: Option<u32>) -> DeviceKey {
    (host, index, mig, partition.filter(|p| *p != 0))
}

impl Latest {
    /// Shares whose last reading shows at least `threshold` permille of the share busy;
    /// `None` when no running workload had a reading (no telemetry is not 0).
    pub(crate) fn active_shares(&self, threshold: u16) -> Option<u64> {
        if self.readings.is_empty() {
            return None;
        }
        Some(
            self.readings
                .values()
                .flatten()
                .filter(|r| busy(r, threshold))
                .map(|r| u64::from(r.shares))
                .sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_telemetry::ProcessUsage;
    use allot_telemetry::{DeviceIdentity, Vendor};

    fn allocation(workload: u64, shares: u32) -> Allocation {
        Allocation {
            node: "n0".into(),
            device_index: 0,
            mig_instance: None,
            amd_partition: None,
            workload: WorkloadId(workload),
            member: 0,
            shares,
            pod: None,
        }
    }

    fn sample(processes: Vec<(u32, Option<u16>)>) -> Sample {
        let mut identity = DeviceIdentity::new(Vendor::Nvidia);
        identity.hostname = Some("n0".into());
        identity.gpu_index = Some(0);
        let mut s = Sample::new(identity);
        s.at_ms = Some(1_000);
        s.utilisation = Some(1000);
        s.processes_listed = true;
        s.processes = processes
            .into_iter()
            .map(|(pid, sm)| ProcessUsage {
                pid,
                memory_used_mib: Some(1024),
                sm_util_permille: sm,
                last_seen_us: None,
            })
            .collect();
        s.classify();
        s
    }

    #[test]
    fn a_shared_device_is_split_by_each_workloads_own_processes() {
        let mut latest = Latest::default();
        latest.take(vec![sample(vec![(100, Some(800)), (200, None)])]);
        let owner = |pid: u32| match pid {
            100 => Some(1),
            200 => Some(2),
            _ => None,
        };
        let shared = [allocation(1, 500), allocation(2, 500)];
        let r = latest.attribute(2_000, &shared, owner);
        assert_eq!(r[&1][0].utilisation, Some(800), "its process is busy");
        assert_eq!(r[&2][0].utilisation, Some(0), "its process holds memory only");
        // A device of one workload keeps the device's own reading.
        let alone = latest.attribute(2_000, &[allocation(1, 1000)], owner);
        assert_eq!(alone[&1][0].utilisation, Some(1000));
    }

    #[test]
    fn stale_samples_are_not_attributed() {
        let mut latest = Latest::default();
        latest.take(vec![sample(Vec::new())]);
        let r = latest.attribute(1_000 + SAMPLE_FRESH_MS + 1, &[allocation(1, 1000)], |_| None);
        assert!(r.is_empty(), "{r:?}");
    }

    /// GPU `index` of n0, labelled with pod `ns/name` where given, engine-active `engine`.
    fn pod_sample(index: u32, pod: Option<(&str, &str)>, engine: u16) -> Sample {
        let mut identity = DeviceIdentity::new(Vendor::Nvidia);
        identity.hostname = Some("n0".into());
        identity.gpu_index = Some(index);
        let mut s = Sample::new(identity);
        s.at_ms = Some(1_000);
        s.engine_active = Some(engine);
        s.jobs.pods = pod
            .into_iter()
            .map(|(namespace, name)| allot_telemetry::PodLabels {
                namespace: Some(namespace.into()),
                pod: name.into(),
                container: Some("main".into()),
            })
            .collect();
        s.classify();
        s
    }

    fn pod_allocation(workload: u64, guess: u32, name: &str) -> Allocation {
        Allocation {
            device_index: guess,
            pod: Some(PodRef { namespace: "ml".into(), name: name.into() }),
            ..allocation(workload, 1000)
        }
    }

    #[test]
    fn a_pod_is_read_on_the_devices_its_labels_name_not_on_allots_guess() {
        let mut latest = Latest::default();
        latest.take(vec![
            pod_sample(0, Some(("ml", "busy")), 900),
            pod_sample(1, None, 800),
            pod_sample(2, Some(("ml", "nb")), 0),
            pod_sample(3, Some(("ml", "nb")), 50),
        ]);
        // allot guessed GPUs 0 and 1 for nb, and 2 for busy: the pods hold others.
        let allocations = [
            pod_allocation(1, 0, "nb"),
            pod_allocation(1, 1, "nb"),
            pod_allocation(2, 2, "busy"),
            // A pod the exporter does not label (yet): no reading, not GPU 1's.
            pod_allocation(3, 1, "new"),
        ];
        let r = latest.attribute(2_000, &allocations, |_| None);
        let engine =
            |id: u64| -> Vec<Option<u16>> { r[&id].iter().map(|r| r.engine_active).collect() };
        assert_eq!(engine(1), [Some(0), Some(50)]);
        assert_eq!(engine(2), [Some(900)]);
        assert!(!r.contains_key(&3), "telemetry missing: {r:?}");
    }
}
