//! GPU activity into the daemon, the I/O side: a collector thread reads this host's sources
//! (NVML, amdgpu sysfs, exporter pages, Prometheus), node agents post theirs
//! (`POST /api/v1/telemetry`, checked by `from_wire`), and a prober thread asks workloads'
//! HTTP and exec probes. The machine attributes what they read (`machine/attribution.rs`).

use std::collections::BTreeMap;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use allot_api::{ApiError, TelemetrySample, limits};
use allot_telemetry::collect::Source;
use allot_telemetry::schedule::CollectorSchedule;
use allot_telemetry::{DeviceIdentity, Sample, Vendor};

use crate::handle::Message;
use crate::machine::Input;
use crate::os::{tracing_log, wall_ms};

/// Time between two reads of one source (a failing one backs off to a minute).
pub(crate) const COLLECT_INTERVAL_MS: u64 = 2_000;

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
    let chars = w.hostname.chars().count();
    if chars == 0 || chars > limits::NAME_CHARS_MAX {
        return Err(ApiError {
            error: format!("hostname must be 1 to {} characters", limits::NAME_CHARS_MAX),
            field: Some("hostname".into()),
            fix: Some("send the node's name as the inventory has it".into()),
        });
    }
    let out_of_range = |field: &str, value: u64, max: u64, fix: &str| ApiError {
        error: format!("{field} {value} is above {max}"),
        field: Some(field.to_string()),
        fix: Some(fix.to_string()),
    };
    let index_max = u64::from(limits::DEVICE_INDEX_MAX);
    for (field, v) in [
        ("gpu_index", Some(w.gpu_index)),
        ("mig_instance", w.mig_instance),
        ("amd_partition", w.amd_partition),
    ] {
        if let Some(v) = v.filter(|v| u64::from(*v) > index_max) {
            return Err(out_of_range(
                field,
                v.into(),
                index_max,
                "send the index the driver reports",
            ));
        }
    }
    if w.at_ms > limits::TIME_MS_MAX {
        return Err(out_of_range(
            "at_ms",
            w.at_ms,
            limits::TIME_MS_MAX,
            "send milliseconds since the Unix epoch",
        ));
    }
    for (field, v) in
        [("memory_used_mib", w.memory_used_mib), ("memory_total_mib", w.memory_total_mib)]
    {
        if let Some(v) = v.filter(|v| *v > limits::MEMORY_MIB_MAX) {
            return Err(out_of_range(
                field,
                v,
                limits::MEMORY_MIB_MAX,
                "send the device's memory in MiB",
            ));
        }
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
pub(crate) fn run_collectors(mut sources: Vec<Source>, loop_tx: &SyncSender<Message>) {
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
                    let groups = process_groups(&samples);
                    match loop_tx.try_send(Message::Input(Input::Telemetry { samples, groups })) {
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
/// they report (`Input::Probed`) to the main loop, until it is gone. Off the loop: a probe
/// may take seconds.
pub(crate) fn run_probes(table: &ProbeTable, loop_tx: &SyncSender<Message>) {
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
                    let probed =
                        Message::Input(Input::Probed { id, last_activity_ms: at.min(wall_ms()) });
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

/// The process group of every process the samples list (read in `/proc` here, where the
/// collector runs): members run in their own process groups, so the machine can tell which
/// workload a process on a shared device belongs to.
fn process_groups(samples: &[Sample]) -> std::collections::BTreeMap<u32, u32> {
    samples
        .iter()
        .flat_map(|s| s.processes.iter())
        .filter_map(|p| Some((p.pid, crate::os::process_group(p.pid)?)))
        .collect()
}
