//! GPU activity telemetry for allot: pure parsers and thin collectors.
//!
//! Every source becomes the same [`Sample`]: one device, MIG instance or AMD partition at one
//! time, with each metric an `Option` (absent is not 0) in permille or MiB, the device's identity,
//! its processes and the job labels the exporter attached. [`Sample::device_reading`] turns it
//! into the [`allot_core::idle::DeviceReading`] the idle tracker takes; [`attribution`] maps
//! samples to workloads through their allocations.
//!
//! Parsers (no I/O, `&str` in, `Result<Vec<Sample>, ParseError>` out, errors name line and field):
//! [`dcgm::parse`], [`amd::parse_exporter`], [`amd::parse_amd_smi`], [`amd::parse_rocm_smi`],
//! [`amd::parse_sysfs`]; [`promtext`] is the Prometheus text parser under the exporter formats.
//! Collectors (thin, I/O): [`nvml::NvmlCollector`], [`prometheus::PrometheusSource`],
//! [`probe`] (HTTP, exec, heartbeat file), [`amd::read_sysfs`]; [`schedule`] paces them.
//!
//! # Signal and confidence
//!
//! [`Sample::classify`] picks the signal idleness is judged on, best first, and says how far it
//! can be trusted:
//!
//! | signal present | confidence | why |
//! |---|---|---|
//! | SM-active (DCGM `PROF_SM_ACTIVE`) | High | the fraction of SMs with work: a tiny kernel shows as tiny |
//! | engine-active (DCGM `PROF_GR_ENGINE_ACTIVE`, AMD gfx activity / per-XCC gfx busy) | Medium | the engine had *some* work; no SM coverage |
//! | utilisation only (NVML/DCGM `GPU_UTIL`, amdgpu `gpu_busy_percent`, rocm-smi `GPU use`) | Low | "a kernel ran": one single-thread kernel reads 100 % |
//! | none of them | Unknown | never idle: the reason says which pitfall applied |
//!
//! The pitfalls handled:
//! - **MIG**: `GPU_UTIL` is always 0 on a MIG instance (dcgm-exporter#50, #216), so it is dropped
//!   there; a MIG instance without profiling fields is Unknown, not idle.
//! - **Profiling off**: `PROF_*` series are absent, not 0, when the profiling module is off; the
//!   sample then falls back to utilisation with confidence Low.
//! - **DCGM sentinels** ("blank", "not supported", …: int64 ≥ 0x7ffffffffffffff0,
//!   FP64 ≥ 2^47, int32 0x7ffffff0..) are absent, see [`dcgm::is_dcgm_sentinel`].
//! - **AMD partitions**: the device-metrics-exporter reports activity for partition 0 only; a
//!   partition other than 0 without activity is Unknown, never idle.
//! - **Label renames**: `Hostname`/`hostname`, `UUID`/`uuid`, `pod`/`pod_name`…, the `amd_`
//!   prefix, and old lower-case DCGM names are all accepted.
//! - Ratios above 1 (SM-active on MIG, DCGM#152) are clamped to 1000 ‰; NaN and negative values
//!   are absent.
//!
//! [`Sample::activity`] turns the chosen signal into active / idle-with-memory / idle / unknown
//! against a threshold. Memory counts as held when a process holds some, or — for sources
//! without a process list (exporters) — when the device reports memory used; with NVML's
//! process list ([`Sample::processes_listed`]) the driver's own reservation does not count.
//!
//! Not read (yet): NVML GPM SM-activity (nvml-wrapper 0.11 has no GPM API and a raw call would
//! need `unsafe`), per-MIG-instance NVML activity, and the AMD exporter's optional `gpu_prof_*`
//! profiler fields (their units are not documented well enough to map them safely).
//!
//! # Why a hand-written Prometheus text parser
//!
//! See [`promtext`]: no maintained parsing crate fits (the official `prometheus-client` only
//! encodes; `prometheus-parse` drags regex and chrono in and reports no line numbers), and the
//! exporters' line-per-series format takes about 200 lines to parse with line and field in
//! every error.

pub mod amd;
pub mod attribution;
pub mod collect;
pub mod dcgm;
pub mod nvml;
pub mod probe;
pub mod prometheus;
pub mod promtext;
pub mod sample;
pub mod schedule;

pub use sample::{
    Activity, Confidence, DeviceIdentity, JobLabels, PodLabels, ProcessUsage, Sample, Vendor,
    process_activity, signal_name,
};

/// A source's output that cannot be read: where and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {field}: {message}")]
pub struct ParseError {
    /// 1-based line of the input (0 when the source has no lines to point at, e.g. a JSON path).
    pub line: usize,
    /// The metric, label, JSON path or file the problem is in.
    pub field: String,
    /// What is wrong and, where it helps, what to do.
    pub message: String,
}

/// The formats [`parse`] understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    DcgmExporter,
    AmdExporter,
    AmdSmi,
    RocmSmi,
}

/// Parses `text` in `format`.
pub fn parse(format: Format, text: &str) -> Result<Vec<Sample>, ParseError> {
    match format {
        Format::DcgmExporter => dcgm::parse(text),
        Format::AmdExporter => amd::parse_exporter(text),
        Format::AmdSmi => amd::parse_amd_smi(text),
        Format::RocmSmi => amd::parse_rocm_smi(text),
    }
}
