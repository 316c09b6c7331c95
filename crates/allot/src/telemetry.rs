//! `allot telemetry …`: what allot sees of GPU activity. `parse` reads a captured exporter or
//! smi output; `watch` collects from this host (NVML, amdgpu sysfs) or a Prometheus server for a
//! while and classifies every device and process.

use std::path::PathBuf;
use std::time::Duration;

use allot_telemetry::collect::{Source, local_hostname};
use allot_telemetry::nvml::NvmlCollector;
use allot_telemetry::prometheus::{Exporter, PrometheusSource};
use allot_telemetry::schedule::CollectorSchedule;
use allot_telemetry::{Activity, Format, Sample, process_activity, signal_name};
use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::{EXIT_UNREACHABLE, EXIT_USAGE, Failure, InvalidInput, Output, print_out};

#[derive(Debug, Subcommand)]
pub(crate) enum TelemetryCommand {
    /// Parse a captured output and print one entry per device, MIG instance or AMD partition,
    /// with the signal used for idleness and its confidence. Exit 1 on a file that does not
    /// parse (file, line and field are named).
    Parse(ParseArgs),
    /// Collect from a live source for a while and print the classification of every device
    /// (and, with NVML, every process): active, idle-with-memory, idle or unknown.
    Watch(WatchArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// dcgm-exporter /metrics text (Prometheus format).
    DcgmExporter,
    /// ROCm device-metrics-exporter /metrics text.
    AmdExporter,
    /// `amd-smi metric --usage --json`.
    AmdSmi,
    /// `rocm-smi --showuse --showmemuse --showmeminfo vram --json`.
    RocmSmi,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// The format of FILE.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// The captured output.
    file: PathBuf,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Activity at or above this (permille of the device) counts as active.
    #[arg(long, default_value_t = 100)]
    threshold_permille: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SourceArg {
    /// NVIDIA GPUs of this host through NVML (needs the driver).
    Nvml,
    /// AMD GPUs of this host through amdgpu sysfs.
    Sysfs,
    /// A Prometheus server that scrapes dcgm-exporter or the AMD exporter (--url).
    Prometheus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ExporterArg {
    Dcgm,
    Amd,
}

#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    #[arg(long, value_enum)]
    source: SourceArg,
    /// Prometheus base address (with --source prometheus), e.g. http://127.0.0.1:9090.
    #[arg(long, required_if_eq("source", "prometheus"))]
    url: Option<String>,
    /// Which exporter's series to query (with --source prometheus).
    #[arg(long, value_enum, default_value_t = ExporterArg::Dcgm)]
    exporter: ExporterArg,
    /// How long to collect.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Time between collections.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Activity at or above this (permille) counts as active.
    #[arg(long, default_value_t = 100)]
    threshold_permille: u16,
    /// sysfs root (with --source sysfs).
    #[arg(long, default_value = "/sys")]
    sys_root: PathBuf,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

pub(crate) fn run(command: TelemetryCommand) -> anyhow::Result<String> {
    match command {
        TelemetryCommand::Parse(args) => parse(&args),
        TelemetryCommand::Watch(args) => watch(&args),
    }
}

fn parse(args: &ParseArgs) -> anyhow::Result<String> {
    let file = args.file.display();
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| InvalidInput(format!("{file}: cannot read: {e}\n")))?;
    let format = match args.format {
        FormatArg::DcgmExporter => Format::DcgmExporter,
        FormatArg::AmdExporter => Format::AmdExporter,
        FormatArg::AmdSmi => Format::AmdSmi,
        FormatArg::RocmSmi => Format::RocmSmi,
    };
    let samples = allot_telemetry::parse(format, &text).map_err(|e| {
        let fix = match args.format {
            FormatArg::DcgmExporter | FormatArg::AmdExporter => {
                "fix: pass the exporter's /metrics text as served"
            }
            FormatArg::AmdSmi | FormatArg::RocmSmi => "fix: pass the command's --json output",
        };
        InvalidInput(format!("{file}:{}: {}: {} — {fix}\n", e.line, e.field, e.message))
    })?;
    Ok(render(&samples, args.output, args.threshold_permille)?)
}

fn render(samples: &[Sample], output: Output, threshold: u16) -> serde_json::Result<String> {
    match output {
        Output::Json => {
            let list: Vec<Value> = samples.iter().map(|s| sample_json(s, threshold)).collect();
            Ok(format!("{}\n", serde_json::to_string_pretty(&list)?))
        }
        Output::Text => {
            let mut out = String::new();
            for s in samples {
                out.push_str(&sample_line(s, threshold));
                out.push('\n');
            }
            if samples.is_empty() {
                out.push_str("no GPU series found\n");
            }
            Ok(out)
        }
    }
}

fn device_name(s: &Sample) -> String {
    let id = &s.identity;
    let mut name = format!(
        "{}/{}{}",
        id.hostname.as_deref().unwrap_or("-"),
        id.vendor.as_str(),
        id.gpu_index.map_or("?".to_string(), |i| i.to_string())
    );
    if let Some(mig) = id.mig_instance {
        name.push_str(&format!(" mig {mig} ({})", id.mig_profile.as_deref().unwrap_or("?")));
    }
    if let Some(p) = id.amd_partition {
        name.push_str(&format!(" partition {p}"));
    }
    name
}

fn permille(v: Option<u16>) -> String {
    v.map_or("-".to_string(), |v| format!("{:.1}%", f64::from(v) / 10.0))
}

fn sample_line(s: &Sample, threshold: u16) -> String {
    let signal = s.signal.map_or("none", signal_name);
    let memory = match (s.memory_used_mib, s.memory_total_mib) {
        (Some(u), Some(t)) => format!("{u}/{t} MiB"),
        (Some(u), None) => format!("{u} MiB"),
        _ => "-".to_string(),
    };
    format!(
        "{}  {}  signal={signal} {}  confidence={}  memory={memory}  ({})",
        device_name(s),
        s.activity(threshold).as_str(),
        permille(s.signal_value()),
        s.confidence.as_str(),
        s.reason
    )
}

fn sample_json(s: &Sample, threshold: u16) -> Value {
    let id = &s.identity;
    json!({
        "vendor": id.vendor.as_str(),
        "hostname": id.hostname,
        "gpu_index": id.gpu_index,
        "uuid": id.uuid,
        "model": id.model,
        "mig_instance": id.mig_instance,
        "mig_profile": id.mig_profile,
        "amd_partition": id.amd_partition,
        "at_ms": s.at_ms,
        "utilisation_permille": s.utilisation,
        "sm_active_permille": s.sm_active,
        "engine_active_permille": s.engine_active,
        "tensor_active_permille": s.tensor_active,
        "dram_active_permille": s.dram_active,
        "memory_used_mib": s.memory_used_mib,
        "memory_total_mib": s.memory_total_mib,
        "processes": s.processes.iter().map(|p| json!({
            "pid": p.pid,
            "memory_used_mib": p.memory_used_mib,
            "sm_util_permille": p.sm_util_permille,
            "last_seen_us": p.last_seen_us,
            "activity": process_activity(p, threshold).as_str(),
        })).collect::<Vec<_>>(),
        "pods": s.jobs.pods.iter().map(|p| json!({
            "namespace": p.namespace, "pod": p.pod, "container": p.container,
        })).collect::<Vec<_>>(),
        "processes_listed": s.processes_listed,
        "hpc_jobs": s.jobs.hpc_jobs,
        "signal": s.signal.map(signal_name),
        "signal_permille": s.signal_value(),
        "confidence": s.confidence.as_str(),
        "reason": s.reason,
        "activity": s.activity(threshold).as_str(),
    })
}

// ---------------------------------------------------------------------------------------------
// watch

/// What the window saw of one device.
#[derive(Default)]
struct DeviceWindow {
    name: String,
    values: Vec<u16>,
    last: Option<Sample>,
}

/// What the window saw of one process.
#[derive(Default)]
struct ProcessWindow {
    device: String,
    memory_used_mib_max: u64,
    sm_util_permille_max: Option<u16>,
}

#[allow(clippy::disallowed_methods)] // a live collector: real time is the point
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn watch(args: &WatchArgs) -> anyhow::Result<String> {
    let mut source = match args.source {
        SourceArg::Nvml => {
            Source::Nvml(Box::new(NvmlCollector::init(local_hostname()).map_err(|e| {
                Failure::new(
                    EXIT_UNREACHABLE,
                    format!("error: {e} — is the NVIDIA driver installed?\n"),
                )
            })?))
        }
        SourceArg::Sysfs => {
            Source::Sysfs { root: args.sys_root.clone(), hostname: local_hostname() }
        }
        SourceArg::Prometheus => {
            let url = args.url.as_deref().unwrap_or_default();
            let source = PrometheusSource::new(url, Duration::from_secs(10))
                .map_err(|e| Failure::new(EXIT_USAGE, format!("error: {e}\n")))?;
            let exporter = match args.exporter {
                ExporterArg::Dcgm => Exporter::Dcgm,
                ExporterArg::Amd => Exporter::Amd,
            };
            Source::Prometheus { source, exporter, url: url.to_string() }
        }
    };
    let threshold = args.threshold_permille;
    // A failed collection is retried with exponential backoff (up to 30 s), not fatal.
    let mut schedule = CollectorSchedule::new(args.interval_ms.max(100), 10_000, 30_000, now_ms());
    let mut failures = 0u64;
    let mut last_error = String::new();
    let mut devices: std::collections::BTreeMap<String, DeviceWindow> = Default::default();
    let mut processes: std::collections::BTreeMap<u32, ProcessWindow> = Default::default();
    let end_ms = now_ms().saturating_add(args.seconds.saturating_mul(1000));
    let mut ticks = 0u64;
    loop {
        let at = now_ms();
        if !schedule.is_due(at) {
            let wake = schedule.next_due_ms().min(end_ms.max(at));
            std::thread::sleep(Duration::from_millis(wake.saturating_sub(at).max(1)));
            if now_ms() >= end_ms && ticks + failures > 0 {
                break;
            }
            continue;
        }
        let samples = match source.collect(at) {
            Ok((samples, warnings)) => {
                schedule.record_success(at);
                for w in warnings {
                    crate::print_err(&format!("warning: {w}\n"));
                }
                samples
            }
            Err(e) => {
                schedule.record_failure(at);
                failures += 1;
                last_error = format!("{e:#}");
                crate::print_err(&format!(
                    "warning: collection failed ({last_error}); retrying in {} ms\n",
                    schedule.next_due_ms().saturating_sub(at)
                ));
                if now_ms() >= end_ms {
                    break;
                }
                continue;
            }
        };
        ticks += 1;
        if args.output == Output::Text {
            for s in &samples {
                print_out(&format!("t={at} {}\n", sample_line(s, threshold)));
            }
        }
        for s in samples {
            let name = device_name(&s);
            for p in &s.processes {
                let w = processes.entry(p.pid).or_default();
                w.device = name.clone();
                w.memory_used_mib_max = w.memory_used_mib_max.max(p.memory_used_mib.unwrap_or(0));
                if let Some(u) = p.sm_util_permille {
                    w.sm_util_permille_max = Some(w.sm_util_permille_max.map_or(u, |m| m.max(u)));
                }
            }
            let w = devices.entry(name.clone()).or_default();
            w.name = name;
            if let Some(v) = s.signal_value() {
                w.values.push(v);
            }
            w.last = Some(s);
        }
        if now_ms() >= end_ms {
            break;
        }
    }
    if ticks == 0 {
        return Err(Failure::new(
            EXIT_UNREACHABLE,
            format!("error: every collection failed ({failures}); the last: {last_error}\n"),
        )
        .into());
    }
    let mut out = String::new();
    let mut device_json = Vec::new();
    for w in devices.values() {
        let mean = (!w.values.is_empty())
            .then(|| w.values.iter().map(|v| u64::from(*v)).sum::<u64>() / w.values.len() as u64);
        let last = w.last.as_ref();
        let activity = match (mean, last) {
            (None, _) | (_, None) => Activity::Unknown,
            (Some(m), _) if m >= u64::from(threshold) => Activity::Active,
            // Below the threshold on average: idle, with or without memory held at the end.
            (Some(_), Some(s)) if s.holds_memory() => Activity::IdleWithMemory,
            (Some(_), Some(_)) => Activity::Idle,
        };
        let signal = last.and_then(|s| s.signal).map_or("none", signal_name);
        let confidence = last.map_or("unknown", |s| s.confidence.as_str());
        out.push_str(&format!(
            "device {}: {} (signal {signal}, mean {}, confidence {confidence}, {} samples)\n",
            w.name,
            activity.as_str(),
            permille(mean.map(|m| m as u16)),
            w.values.len()
        ));
        device_json.push(json!({"device": w.name, "activity": activity.as_str(), "signal": signal,
            "mean_permille": mean, "confidence": confidence, "samples": w.values.len()}));
    }
    let mut process_json = Vec::new();
    for (pid, w) in &processes {
        let activity = process_activity(
            &allot_telemetry::ProcessUsage {
                pid: *pid,
                memory_used_mib: Some(w.memory_used_mib_max),
                sm_util_permille: w.sm_util_permille_max,
                last_seen_us: None,
            },
            threshold,
        );
        out.push_str(&format!(
            "process {pid} on {}: {} (memory {} MiB, max SM util {})\n",
            w.device,
            activity.as_str(),
            w.memory_used_mib_max,
            permille(w.sm_util_permille_max)
        ));
        process_json.push(json!({"pid": pid, "device": w.device, "activity": activity.as_str(),
            "memory_used_mib_max": w.memory_used_mib_max, "sm_util_permille_max": w.sm_util_permille_max}));
    }
    match args.output {
        Output::Text => Ok(format!("summary over {ticks} collections ({failures} failed):\n{out}")),
        Output::Json => Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(
                &json!({"collections": ticks, "failed_collections": failures, "devices": device_json, "processes": process_json})
            )?
        )),
    }
}
