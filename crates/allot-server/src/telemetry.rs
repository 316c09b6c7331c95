//! GPU activity into the daemon: a collector thread reads this host's sources (NVML, amdgpu
//! sysfs, exporter pages, Prometheus) and node agents post theirs (`POST /api/v1/telemetry`);
//! the main loop keeps the newest sample per device and, every telemetry round, attributes
//! them to the running workloads' devices by node and device index. What it attributes
//! is logged (`Entry::Sampled`) before the engine sees it, so a replay judges idleness on the
//! same readings.

use std::collections::BTreeMap;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use allot_api::{ApiError, TelemetrySample, limits};
use allot_core::idle::DeviceReading;
use allot_telemetry::attribution::Allocation;
use allot_telemetry::collect::Source;
use allot_telemetry::schedule::CollectorSchedule;
use allot_telemetry::{DeviceIdentity, Sample, Vendor};
use serde::{Deserialize, Serialize};

use crate::runtime::{Request, tracing_log, wall_ms};

/// Time between two reads of one source (a failing one backs off to a minute).
pub(crate) const COLLECT_INTERVAL_MS: u64 = 2_000;
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
        for a in allocations {
            *sharers.entry(device(a)).or_default() += 1;
        }
        // One lookup per allocation in the newest-sample index (no scan of every sample).
        let mut readings: BTreeMap<u64, Vec<DeviceReading>> = BTreeMap::new();
        for a in allocations {
            let key = device(a);
            let sample = self.samples.get(&key);
            let mut reading = sample.map_or(
                DeviceReading { member: a.member, shares: a.shares, ..DeviceReading::default() },
                |s| s.device_reading(a.member, a.shares),
            );
            let shared = sharers.get(&key).is_some_and(|n| *n > 1);
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

/// A posted sample, checked: values in range, names bounded.
pub(crate) fn from_wire(w: &TelemetrySample) -> Result<Sample, ApiError> {
    let bad = |field: &str, error: String| ApiError {
        error,
        field: Some(field.to_string()),
        fix: Some("activity values are permille of the device, 0 to 1000".into()),
    };
    for (field, v) in [
        ("utilisation", w.utilisation),
        ("sm_active", w.sm_active),
        ("engine_active", w.engine_active),
    ] {
        if v.is_some_and(|v| v > 1000) {
            return Err(bad(field, format!("{field} {} is above 1000", v.unwrap_or(0))));
        }
    }
    if w.hostname.is_empty() || w.hostname.len() > limits::NAME_CHARS_MAX {
        return Err(ApiError {
            error: "hostname must be 1 to 200 characters".into(),
            field: Some("hostname".into()),
            fix: Some("send the node's name as the inventory has it".into()),
        });
    }
    let mut identity = DeviceIdentity::new(Vendor::Nvidia);
    identity.hostname = Some(w.hostname.clone());
    identity.gpu_index = Some(w.gpu_index);
    identity.mig_instance = w.mig_instance;
    identity.amd_partition = w.amd_partition;
    let mut s = Sample::new(identity);
    s.at_ms = Some(w.at_ms);
    s.utilisation = w.utilisation;
    s.sm_active = w.sm_active;
    s.engine_active = w.engine_active;
    s.memory_used_mib = w.memory_used_mib;
    s.memory_total_mib = w.memory_total_mib;
    s.classify();
    Ok(s)
}

/// What a node agent posts of a sample (only what attribution and idleness use); `None` for a
/// sample without the device's node or index.
pub fn to_wire(s: &Sample) -> Option<TelemetrySample> {
    Some(TelemetrySample {
        hostname: s.identity.hostname.clone()?,
        gpu_index: s.identity.gpu_index?,
        mig_instance: s.identity.mig_instance,
        amd_partition: s.identity.amd_partition,
        at_ms: s.at_ms.unwrap_or(0),
        utilisation: s.utilisation,
        sm_active: s.sm_active,
        engine_active: s.engine_active,
        memory_used_mib: s.memory_used_mib,
        memory_total_mib: s.memory_total_mib,
    })
}

/// Reads `sources` on their schedules and sends what they read to the main loop until it is
/// gone. A full queue drops the batch (the next one replaces it); a failing source backs off.
pub(crate) fn run_collectors(mut sources: Vec<Source>, loop_tx: &SyncSender<Request>) {
    let start = wall_ms();
    let mut schedules: Vec<CollectorSchedule> = sources
        .iter()
        .map(|_| CollectorSchedule::new(COLLECT_INTERVAL_MS, 10_000, 60_000, start))
        .collect();
    loop {
        let now = wall_ms();
        for (source, schedule) in sources.iter_mut().zip(schedules.iter_mut()) {
            if !schedule.is_due(now) {
                continue;
            }
            match source.collect(now) {
                Ok((samples, warnings)) => {
                    schedule.record_success(now);
                    for w in warnings {
                        tracing_log(&format!("telemetry {}: {w}", source.name()));
                    }
                    match loop_tx.try_send(Request::Telemetry(samples)) {
                        Ok(()) | Err(TrySendError::Full(_)) => {}
                        Err(TrySendError::Disconnected(_)) => return,
                    }
                }
                Err(e) => {
                    schedule.record_failure(now);
                    // Said once per failure streak, not at every retry.
                    if schedule.consecutive_failures() == 1 {
                        tracing_log(&format!(
                            "telemetry {}: {e} (retrying with backoff)",
                            source.name()
                        ));
                    }
                }
            }
        }
        let next = schedules.iter().map(CollectorSchedule::next_due_ms).min().unwrap_or(now + 1000);
        std::thread::sleep(Duration::from_millis(next.saturating_sub(wall_ms()).clamp(10, 1000)));
    }
}

/// How often a running workload's application probe is asked.
pub(crate) const PROBE_INTERVAL_MS: u64 = 15_000;
/// Longest one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Running workloads' application probes, kept up to date by the main loop.
pub(crate) type ProbeTable = std::sync::Arc<std::sync::Mutex<BTreeMap<u64, allot_api::Probe>>>;

/// Asks every running workload's HTTP or exec probe every `PROBE_INTERVAL_MS` and sends what
/// they report (`Request::Probed`) to the main loop, until it is gone. Off the loop: a probe
/// may take seconds.
pub(crate) fn run_probes(table: &ProbeTable, loop_tx: &SyncSender<Request>) {
    use allot_telemetry::probe::{ExecProbe, HttpProbe};
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    let mut failing: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    loop {
        // The main loop holds the other handle: once it is gone, so is the prober.
        if std::sync::Arc::strong_count(table) < 2 {
            return;
        }
        let probes: Vec<(u64, allot_api::Probe)> = match table.lock() {
            Ok(t) => t.iter().map(|(id, p)| (*id, p.clone())).collect(),
            Err(_) => return,
        };
        last.retain(|id, _| probes.iter().any(|(p, _)| p == id));
        for (id, probe) in probes {
            let now = wall_ms();
            if last.get(&id).is_some_and(|t| now < t + PROBE_INTERVAL_MS) {
                continue;
            }
            last.insert(id, now);
            let result = match &probe {
                allot_api::Probe::Http { url, pointer } => HttpProbe {
                    url: url.clone(),
                    pointer: pointer.clone(),
                    timeout: PROBE_TIMEOUT,
                    token: None,
                }
                .probe()
                .map(Some),
                allot_api::Probe::Exec { command } => ExecProbe {
                    program: command.first().cloned().unwrap_or_default(),
                    args: command.iter().skip(1).cloned().collect(),
                    timeout: PROBE_TIMEOUT,
                }
                .probe(now),
            };
            match result {
                Ok(Some(at)) => {
                    failing.remove(&id);
                    let probed = Request::Probed { id, last_activity_ms: at.min(wall_ms()) };
                    if loop_tx.send(probed).is_err() {
                        return;
                    }
                }
                Ok(None) => {
                    failing.remove(&id);
                }
                Err(e) => {
                    // Said once per failure streak.
                    if failing.insert(id) {
                        tracing_log(&format!("probe of workload {id}: {e}"));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::WorkloadId;
    use allot_telemetry::ProcessUsage;

    fn allocation(workload: u64, shares: u32) -> Allocation {
        Allocation {
            node: "n0".into(),
            device_index: 0,
            mig_instance: None,
            amd_partition: None,
            workload: WorkloadId(workload),
            member: 0,
            shares,
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
}
