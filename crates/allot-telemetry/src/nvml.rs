//! NVIDIA GPUs of this host through NVML. `libnvidia-ml.so.1` is loaded when the collector is
//! made ([`NvmlCollector::init`]), not linked, so binaries start on hosts without the driver.
//!
//! Per GPU and call: utilisation (`nvmlDeviceGetUtilizationRates`), memory, running compute
//! processes with their memory, and per-process SM utilisation samples newer than the last one
//! seen (`nvmlDeviceGetProcessUtilization`; NVML lists only processes with some activity, and
//! answers NotFound when none had any: that is "no activity", not an error).
//!
//! Not read: GPM SM activity (Hopper) — nvml-wrapper 0.11 has no GPM API and this workspace
//! forbids the `unsafe` a raw call would need; per-MIG-instance activity (NVML has none without
//! GPM). On a MIG-enabled GPU utilisation is dropped (it is not per instance), so the sample is
//! Unknown unless another source (dcgm-exporter's profiling fields) is used.

use std::collections::BTreeMap;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

use crate::sample::{DeviceIdentity, ProcessUsage, Sample, Vendor};

/// Why NVML could not be used or read.
#[derive(Debug, thiserror::Error)]
#[error("NVML {what}: {source}")]
pub struct NvmlCollectError {
    /// The call that failed (`init`, `device 3 utilisation`, …).
    pub what: String,
    pub source: NvmlError,
}

/// Reads NVIDIA GPUs through NVML; keeps the last process-utilisation timestamp per GPU.
#[derive(Debug)]
pub struct NvmlCollector {
    nvml: Nvml,
    hostname: Option<String>,
    last_seen_us: BTreeMap<u32, u64>,
}

impl NvmlCollector {
    /// Loads NVML. Fails (does not panic) without the driver library.
    pub fn init(hostname: Option<String>) -> Result<NvmlCollector, NvmlCollectError> {
        let nvml =
            Nvml::init().map_err(|source| NvmlCollectError { what: "init".into(), source })?;
        Ok(NvmlCollector { nvml, hostname, last_seen_us: BTreeMap::new() })
    }

    /// One sample per GPU, stamped `now_ms`.
    pub fn collect(&mut self, now_ms: u64) -> Result<Vec<Sample>, NvmlCollectError> {
        let fail = |what: String| move |source| NvmlCollectError { what, source };
        let count = self.nvml.device_count().map_err(fail("device count".into()))?;
        let mut samples = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device =
                self.nvml.device_by_index(index).map_err(fail(format!("device {index}")))?;
            let mut identity = DeviceIdentity::new(Vendor::Nvidia);
            identity.hostname = self.hostname.clone();
            identity.gpu_index = Some(index);
            identity.uuid = device.uuid().ok();
            identity.model = device.name().ok();
            let mut sample = Sample::new(identity);
            sample.at_ms = Some(now_ms);
            let mig = device.mig_mode().is_ok_and(|m| m.current == 1);
            if !mig {
                let rates = device
                    .utilization_rates()
                    .map_err(fail(format!("device {index} utilisation")))?;
                sample.utilisation = crate::sample::percent_to_permille(f64::from(rates.gpu));
            }
            if let Ok(memory) = device.memory_info() {
                sample.memory_used_mib = Some(memory.used / (1024 * 1024));
                sample.memory_total_mib = Some(memory.total / (1024 * 1024));
            }
            let mut processes: BTreeMap<u32, ProcessUsage> = BTreeMap::new();
            for p in device.running_compute_processes().unwrap_or_default() {
                let memory_used_mib = match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes / (1024 * 1024)),
                    UsedGpuMemory::Unavailable => None,
                };
                processes.insert(
                    p.pid,
                    ProcessUsage {
                        pid: p.pid,
                        memory_used_mib,
                        sm_util_permille: None,
                        last_seen_us: None,
                    },
                );
            }
            let last_seen = self.last_seen_us.get(&index).copied();
            match device.process_utilization_stats(last_seen) {
                Ok(stats) => {
                    for stat in stats {
                        let entry = processes.entry(stat.pid).or_insert(ProcessUsage {
                            pid: stat.pid,
                            memory_used_mib: None,
                            sm_util_permille: None,
                            last_seen_us: None,
                        });
                        // Several samples per process may be buffered: keep the newest.
                        if entry.last_seen_us.is_none_or(|t| stat.timestamp >= t) {
                            entry.last_seen_us = Some(stat.timestamp);
                            entry.sm_util_permille =
                                crate::sample::percent_to_permille(f64::from(stat.sm_util));
                        }
                        let newest = self.last_seen_us.entry(index).or_insert(0);
                        *newest = (*newest).max(stat.timestamp);
                    }
                }
                // NotFound: no process had activity since `last_seen`; NotSupported: pre-Maxwell.
                Err(NvmlError::NotFound | NvmlError::NotSupported) => {}
                Err(source) => {
                    return Err(NvmlCollectError {
                        what: format!("device {index} process utilisation"),
                        source,
                    });
                }
            }
            sample.processes = processes.into_values().collect();
            sample.processes_listed = true;
            sample.classify();
            if mig {
                sample.reason = "MIG enabled: NVML has no per-instance activity without GPM; \
                                 use dcgm-exporter's profiling fields"
                    .into();
            }
            samples.push(sample);
        }
        Ok(samples)
    }
}
