//! AMD sources: ROCm device-metrics-exporter text (or its series through a Prometheus query),
//! `amd-smi metric --usage --json`, `rocm-smi --showuse --showmemuse --showmeminfo vram --json`
//! and amdgpu sysfs files. All pure: text in, samples out.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ParseError;
use crate::dcgm::add_job_labels;
use crate::promtext::{self, Series};
use crate::sample::{DeviceIdentity, Sample, Vendor, amount, percent_to_permille};

// ---------------------------------------------------------------------------------------------
// device-metrics-exporter

/// Parses device-metrics-exporter `/metrics` text (with or without the `amd_` prefix).
pub fn parse_exporter(text: &str) -> Result<Vec<Sample>, ParseError> {
    exporter_samples_from_series(&promtext::parse(text)?)
}

#[derive(Clone, Copy)]
enum Field {
    GfxActivity,
    UmcActivity,
    GfxBusyInstant,
    UsedVram,
    FreeVram,
    TotalVram,
    Other,
}

fn exporter_field(name: &str) -> Option<Field> {
    let name = name.strip_prefix("amd_").unwrap_or(name);
    Some(match name {
        "gpu_gfx_activity" => Field::GfxActivity,
        "gpu_umc_activity" => Field::UmcActivity,
        "gpu_gfx_busy_instantaneous" => Field::GfxBusyInstant,
        "gpu_used_vram" => Field::UsedVram,
        "gpu_free_vram" => Field::FreeVram,
        "gpu_total_vram" => Field::TotalVram,
        _ if name.starts_with("gpu_") => Field::Other,
        _ => return None,
    })
}

/// Grouping key: host, GPU id, partition id, UUID, timestamp.
type Key<'a> = (Option<&'a str>, u32, Option<u32>, Option<&'a str>, Option<i64>);

#[derive(Default)]
struct Pending {
    busy_sum: f64,
    busy_count: u32,
    used: Option<u64>,
    free: Option<u64>,
    total: Option<u64>,
}

/// Turns device-metrics-exporter series into one sample per GPU or partition (and timestamp).
/// A partition other than 0 without activity series stays Unknown: the exporter reports activity
/// for partition 0 only (ROCm/device-metrics-exporter#495), so missing data is not idleness.
pub fn exporter_samples_from_series(series: &[Series<'_>]) -> Result<Vec<Sample>, ParseError> {
    let mut groups: BTreeMap<Key<'_>, (Sample, Pending)> = BTreeMap::new();
    for s in series {
        let Some(field) = exporter_field(s.name) else { continue };
        let gpu = match s.label_any(&["gpu_id"]) {
            Some(v) => v.trim().parse::<u32>().map_err(|_| ParseError {
                line: s.line,
                field: "gpu_id".into(),
                message: format!("{v:?} is not a non-negative integer (in {})", s.name),
            })?,
            None => {
                return Err(ParseError {
                    line: s.line,
                    field: "gpu_id".into(),
                    message: format!("{} has no gpu_id label", s.name),
                });
            }
        };
        let partition = match s.label_any(&["gpu_partition_id"]) {
            None => None,
            Some(v) if v.eq_ignore_ascii_case("NA") || v.eq_ignore_ascii_case("N/A") => None,
            Some(v) => Some(v.trim().parse::<u32>().map_err(|_| ParseError {
                line: s.line,
                field: "gpu_partition_id".into(),
                message: format!("{v:?} is neither an integer nor NA (in {})", s.name),
            })?),
        };
        let host = s.label_any(&["hostname"]);
        let uuid = s.label_any(&["gpu_uuid"]);
        let key = (host, gpu, partition, uuid, s.timestamp_ms);
        let (sample, pending) = groups.entry(key).or_insert_with(|| {
            let mut identity = DeviceIdentity::new(Vendor::Amd);
            identity.hostname = host.map(str::to_string);
            identity.gpu_index = Some(gpu);
            identity.uuid = uuid.map(str::to_string);
            identity.amd_partition = partition;
            identity.model = s.label_any(&["card_series", "card_model"]).map(str::to_string);
            let mut sample = Sample::new(identity);
            sample.at_ms = s.timestamp_ms.and_then(|t| u64::try_from(t).ok());
            (sample, Pending::default())
        });
        add_job_labels(sample, s);
        if let Some(pid) = s.label_any(&["kfd_process_id"]).and_then(|p| p.parse::<u32>().ok())
            && !sample.processes.iter().any(|p| p.pid == pid)
        {
            sample.processes.push(crate::sample::ProcessUsage {
                pid,
                memory_used_mib: None,
                sm_util_permille: None,
                last_seen_us: None,
            });
            sample.processes.sort_by_key(|p| p.pid);
        }
        let value = s.value;
        match field {
            Field::GfxActivity => sample.engine_active = percent_to_permille(value),
            Field::UmcActivity => sample.dram_active = percent_to_permille(value),
            Field::GfxBusyInstant => {
                if value.is_finite() && value >= 0.0 {
                    pending.busy_sum += value;
                    pending.busy_count += 1;
                }
            }
            // The exporter's "MB" are the driver's MiB.
            Field::UsedVram => pending.used = amount(value),
            Field::FreeVram => pending.free = amount(value),
            Field::TotalVram => pending.total = amount(value),
            Field::Other => {}
        }
    }
    Ok(groups
        .into_values()
        .map(|(mut sample, pending)| {
            // Per-XCC busy of the partition is better than the whole-GPU gfx activity, which
            // partition-capable parts retire (or report for XCP 0 only).
            if pending.busy_count > 0 {
                sample.engine_active =
                    percent_to_permille(pending.busy_sum / f64::from(pending.busy_count));
            }
            sample.memory_used_mib = pending.used;
            sample.memory_total_mib =
                pending.total.or_else(|| Some(pending.used?.saturating_add(pending.free?)));
            sample.classify();
            sample
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// amd-smi

fn json_error(field: &str, e: &serde_json::Error) -> ParseError {
    ParseError { line: e.line(), field: field.to_string(), message: format!("invalid JSON: {e}") }
}

/// A `{"value": 42, "unit": "%"}` object, a bare number or numeric string; "N/A" and anything
/// else is absent.
fn smi_value(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().trim_end_matches('%').trim().parse::<f64>().ok(),
        Value::Object(o) => o.get("value").and_then(smi_value),
        _ => None,
    }
}

/// Parses `amd-smi metric --usage --json`: a list of `{"gpu": N, "usage": {…}}` (or that list
/// under `gpu_data`). Engine-active is the mean of the per-XCC `gfx_busy_inst` values when any
/// is a number, else `gfx_activity`; DRAM-active is `umc_activity`. "N/A" is absent.
pub fn parse_amd_smi(text: &str) -> Result<Vec<Sample>, ParseError> {
    let root: Value = serde_json::from_str(text).map_err(|e| json_error("amd-smi", &e))?;
    let entries = match &root {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("gpu_data") {
            Some(Value::Array(a)) => a,
            _ => {
                return Err(ParseError {
                    line: 0,
                    field: "gpu_data".into(),
                    message: "expected a list of GPUs (or an object with a gpu_data list)".into(),
                });
            }
        },
        _ => {
            return Err(ParseError {
                line: 0,
                field: "amd-smi".into(),
                message: "expected a JSON list of GPUs".into(),
            });
        }
    };
    let mut samples = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let gpu = entry
            .get("gpu")
            .and_then(Value::as_u64)
            .and_then(|g| u32::try_from(g).ok())
            .ok_or_else(|| ParseError {
                line: 0,
                field: format!("[{i}].gpu"),
                message: "missing or not a non-negative integer".into(),
            })?;
        let usage = entry.get("usage").filter(|u| u.is_object()).ok_or_else(|| ParseError {
            line: 0,
            field: format!("[{i}].usage"),
            message: "missing: run `amd-smi metric --usage --json`".into(),
        })?;
        let mut identity = DeviceIdentity::new(Vendor::Amd);
        identity.gpu_index = Some(gpu);
        let mut sample = Sample::new(identity);
        let busy: Vec<f64> = match usage.get("gfx_busy_inst") {
            Some(Value::Object(xcps)) => xcps
                .values()
                .flat_map(|list| match list {
                    Value::Array(a) => a.iter().filter_map(smi_value).collect::<Vec<_>>(),
                    other => smi_value(other).into_iter().collect(),
                })
                .filter(|v| v.is_finite() && *v >= 0.0)
                .collect(),
            _ => Vec::new(),
        };
        sample.engine_active = if busy.is_empty() {
            usage.get("gfx_activity").and_then(smi_value).and_then(percent_to_permille)
        } else {
            percent_to_permille(busy.iter().sum::<f64>() / busy.len() as f64)
        };
        sample.dram_active =
            usage.get("umc_activity").and_then(smi_value).and_then(percent_to_permille);
        sample.classify();
        samples.push(sample);
    }
    Ok(samples)
}

// ---------------------------------------------------------------------------------------------
// rocm-smi

/// Parses rocm-smi JSON (`--showuse --showmemuse --showmeminfo vram --json`): an object of
/// `cardN` objects whose values are all strings. `GPU use (%)` is amdgpu's `gpu_busy_percent`
/// (time-based utilisation), `GPU Memory Read/Write Activity (%)` the memory interface's.
pub fn parse_rocm_smi(text: &str) -> Result<Vec<Sample>, ParseError> {
    let root: Value = serde_json::from_str(text).map_err(|e| json_error("rocm-smi", &e))?;
    let Value::Object(cards) = root else {
        return Err(ParseError {
            line: 0,
            field: "rocm-smi".into(),
            message: "expected a JSON object of cardN entries".into(),
        });
    };
    let mut samples = Vec::new();
    for (key, card) in &cards {
        let Some(index) = key.strip_prefix("card") else { continue };
        let index = index.parse::<u32>().map_err(|_| ParseError {
            line: 0,
            field: key.clone(),
            message: "a card key must be cardN with N an integer".into(),
        })?;
        let Value::Object(card) = card else {
            return Err(ParseError {
                line: 0,
                field: key.clone(),
                message: "expected an object of metrics".into(),
            });
        };
        let get = |name: &str| card.get(name).and_then(smi_value);
        let mut identity = DeviceIdentity::new(Vendor::Amd);
        identity.gpu_index = Some(index);
        identity.uuid = card.get("Unique ID").and_then(Value::as_str).map(str::to_string);
        identity.model = card.get("Card Series").and_then(Value::as_str).map(str::to_string);
        let mut sample = Sample::new(identity);
        sample.utilisation = get("GPU use (%)").and_then(percent_to_permille);
        sample.dram_active =
            get("GPU Memory Read/Write Activity (%)").and_then(percent_to_permille);
        const MIB: f64 = 1024.0 * 1024.0;
        sample.memory_total_mib = get("VRAM Total Memory (B)").and_then(|b| amount(b / MIB));
        sample.memory_used_mib = get("VRAM Total Used Memory (B)").and_then(|b| amount(b / MIB));
        sample.classify();
        samples.push(sample);
    }
    samples.sort_by_key(|s| s.identity.gpu_index);
    Ok(samples)
}

// ---------------------------------------------------------------------------------------------
// amdgpu sysfs

/// The contents of one card's amdgpu files (`/sys/class/drm/cardN/device/…`); a file that is
/// missing or unreadable is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SysfsFiles {
    /// Position among the AMD cards (the HIP ordinal when nothing is hidden).
    pub gpu_index: u32,
    pub gpu_busy_percent: Option<String>,
    pub mem_busy_percent: Option<String>,
    /// Bytes.
    pub mem_info_vram_used: Option<String>,
    /// Bytes.
    pub mem_info_vram_total: Option<String>,
}

/// Parses one card's sysfs files. `gpu_busy_percent` is time-based utilisation (confidence Low;
/// Raven APUs always read 100). An unparsable file is an error naming it.
pub fn parse_sysfs(files: &SysfsFiles) -> Result<Sample, ParseError> {
    fn number(name: &str, text: Option<&String>) -> Result<Option<f64>, ParseError> {
        let Some(text) = text else { return Ok(None) };
        let t = text.trim();
        t.parse::<u64>().map(|v| Some(v as f64)).map_err(|_| ParseError {
            line: 1,
            field: name.to_string(),
            message: format!("{t:?} is not a non-negative integer"),
        })
    }
    let mut identity = DeviceIdentity::new(Vendor::Amd);
    identity.gpu_index = Some(files.gpu_index);
    let mut sample = Sample::new(identity);
    sample.utilisation =
        number("gpu_busy_percent", files.gpu_busy_percent.as_ref())?.and_then(percent_to_permille);
    sample.dram_active =
        number("mem_busy_percent", files.mem_busy_percent.as_ref())?.and_then(percent_to_permille);
    const MIB: f64 = 1024.0 * 1024.0;
    sample.memory_used_mib = number("mem_info_vram_used", files.mem_info_vram_used.as_ref())?
        .and_then(|b| amount((b / MIB).floor()));
    sample.memory_total_mib = number("mem_info_vram_total", files.mem_info_vram_total.as_ref())?
        .and_then(|b| amount((b / MIB).floor()));
    sample.classify();
    Ok(sample)
}

/// Reads every AMD card under `sys_root` (normally `/sys`): `class/drm/cardN/device` with vendor
/// 0x1002, in card order. I/O only; [`parse_sysfs`] does the rest.
pub fn read_sysfs(sys_root: &std::path::Path) -> std::io::Result<Vec<SysfsFiles>> {
    let drm = sys_root.join("class/drm");
    let mut cards: Vec<(u32, std::path::PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&drm)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix("card")) else { continue };
        // `card0-DP-1` and the like are connectors, not cards.
        let Ok(n) = n.parse::<u32>() else { continue };
        cards.push((n, entry.path().join("device")));
    }
    cards.sort();
    let read = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let mut out = Vec::new();
    for (_, dir) in cards {
        if read(&dir, "vendor").is_none_or(|v| v.trim() != "0x1002") {
            continue;
        }
        out.push(SysfsFiles {
            gpu_index: out.len() as u32,
            gpu_busy_percent: read(&dir, "gpu_busy_percent"),
            mem_busy_percent: read(&dir, "mem_busy_percent"),
            mem_info_vram_used: read(&dir, "mem_info_vram_used"),
            mem_info_vram_total: read(&dir, "mem_info_vram_total"),
        });
    }
    Ok(out)
}
