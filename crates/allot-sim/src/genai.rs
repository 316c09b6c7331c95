//! Alibaba's GenAI serving trace 2026 (GenTD26, `cluster-trace-v2026-GenAI`): per serving
//! container of a Stable-Diffusion service, its GPU duty cycle, GPU memory, the requests it
//! served and its inference latencies, on one shared clock.
//!
//! Four files in one folder, with the upstream columns (found by header name, so their order
//! does not matter; unknown columns are ignored):
//!
//! | file | columns |
//! |---|---|
//! | `pod_gpu_duty_cycle_anon.csv` | `value` (duty cycle, %), `timestamp_anon` (s), `container_ip` |
//! | `pod_gpu_memory_used_bytes_anon.csv` | `timestamp_anon`, `value` (bytes), `container_ip` |
//! | `qps.csv` | `timestamp_anon`, `value` (requests/s), `container_ip` (empty: gateway), `request_type` |
//! | `model_predict_data_anon.csv` | `timestamp_anon`, `value` (inference time, ms), `container_ip` |
//!
//! Every timestamp lies on one grid (`t0 + k × step`): the step is the most common gap between
//! consecutive distinct timestamps, and a timestamp off that grid is an error naming its file
//! and line. A *slot* is one grid step. A container lives from its first to its last row in any
//! file; a slot inside that span without a duty-cycle row is a telemetry gap. A container has a
//! `qps.csv` row only in slots where it served requests.
//!
//! **Requests.** The upstream anonymisation scales metric values, so `qps.csv` does not say how
//! many requests a row is. A slot's requests are its value in units of the smallest positive
//! per-container value in the file ([`GenaiTrace::request_unit_qps`]), rounded, at least 1: a
//! row at the smallest rate is one request. Ratios between policies do not depend on the unit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::csv::{CsvFile, Row};
use crate::error::{BadRows, Skipped, TraceError};

/// The upstream file names.
pub const DUTY_FILE: &str = "pod_gpu_duty_cycle_anon.csv";
pub const MEMORY_FILE: &str = "pod_gpu_memory_used_bytes_anon.csv";
pub const QPS_FILE: &str = "qps.csv";
pub const PREDICT_FILE: &str = "model_predict_data_anon.csv";
/// The most slots a trace may span (a week of minute slots and more): a limit on memory, and a
/// guard against a grid that came out far finer than the data.
pub const SLOTS_MAX: u64 = 100_000;
/// The most containers a trace may hold.
pub const CONTAINERS_MAX: usize = 10_000;
/// The most container-slots (the sum of all lifetimes) a trace may hold: the per-slot series
/// take about 50 bytes each.
pub const CONTAINER_SLOTS_MAX: u64 = 20_000_000;

/// One serving container: its samples per slot of its lifetime.
#[derive(Clone, Debug, PartialEq)]
pub struct GenaiContainer {
    /// `container_ip` as in the files (an MD5 hash upstream).
    pub ip: String,
    /// First and last slot with any row of this container, inclusive.
    pub first_slot: u32,
    pub last_slot: u32,
    /// Per slot of the lifetime (index 0 = `first_slot`): GPU duty cycle in percent; `None` is
    /// a telemetry gap.
    pub duty_pct: Vec<Option<f64>>,
    /// GPU memory used, bytes; `None` without a row.
    pub memory_bytes: Vec<Option<f64>>,
    /// Requests served in the slot (see the module comment); 0 without a `qps.csv` row.
    pub requests: Vec<u32>,
    /// The raw `qps.csv` value; 0 without a row.
    pub qps: Vec<f64>,
    /// Pure inference time, ms; `None` without a row.
    pub predict_ms: Vec<Option<f64>>,
}

impl GenaiContainer {
    /// Slots in its lifetime.
    pub fn slots(&self) -> usize {
        self.duty_pct.len()
    }

    /// The duty cycle of absolute slot `slot`; `None` outside the lifetime or in a gap.
    pub fn duty_at(&self, slot: u32) -> Option<f64> {
        self.index(slot).and_then(|i| self.duty_pct[i])
    }

    /// Requests in absolute slot `slot` (0 outside the lifetime).
    pub fn requests_at(&self, slot: u32) -> u32 {
        self.index(slot).map_or(0, |i| self.requests[i])
    }

    /// Memory in absolute slot `slot`.
    pub fn memory_at(&self, slot: u32) -> Option<f64> {
        self.index(slot).and_then(|i| self.memory_bytes[i])
    }

    fn index(&self, slot: u32) -> Option<usize> {
        (self.first_slot..=self.last_slot)
            .contains(&slot)
            .then(|| (slot - self.first_slot) as usize)
    }
}

/// Rows read per file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenaiRows {
    pub duty: usize,
    pub memory: usize,
    pub qps: usize,
    pub predict: usize,
}

/// The whole trace.
#[derive(Clone, Debug, PartialEq)]
pub struct GenaiTrace {
    pub dir: PathBuf,
    /// The first timestamp of any file, seconds (anonymised upstream).
    pub t0_s: u64,
    /// The grid step, seconds.
    pub step_s: u64,
    /// Slots from `t0_s` to the last timestamp, inclusive.
    pub slots: u32,
    /// By `container_ip`.
    pub containers: Vec<GenaiContainer>,
    /// Gateway rows of `qps.csv` (no container): (slot, value).
    pub gateway_qps: Vec<(u32, f64)>,
    /// The smallest positive per-container `qps.csv` value: one request.
    pub request_unit_qps: f64,
    pub rows: GenaiRows,
    /// Rows skipped under [`BadRows::Skip`], over all four files.
    pub skipped: Skipped,
}

impl GenaiTrace {
    /// Requests served by every container over the whole trace.
    pub fn requests_total(&self) -> u64 {
        self.containers.iter().flat_map(|c| &c.requests).map(|&r| u64::from(r)).sum()
    }
}

/// One row of any of the four files, parsed.
struct Sample {
    line: usize,
    t_s: u64,
    value: f64,
    ip: String,
}

/// Reads the four files of a GenTD26 folder.
pub fn load_genai(dir: &Path, mode: BadRows) -> Result<GenaiTrace, TraceError> {
    let read = |name: &str| {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(TraceError::new(
                &path,
                0,
                "",
                "no such file".into(),
                "give the folder that holds the four GenTD26 files (upstream names)",
            ));
        }
        CsvFile::read(&path)
    };
    let files = [read(DUTY_FILE)?, read(MEMORY_FILE)?, read(QPS_FILE)?, read(PREDICT_FILE)?];
    genai_from(dir, &files, mode)
}

/// Parses the four files' texts (duty, memory, qps, predict), named as in `dir`.
pub fn parse_genai(dir: &Path, texts: [&str; 4], mode: BadRows) -> Result<GenaiTrace, TraceError> {
    let names = [DUTY_FILE, MEMORY_FILE, QPS_FILE, PREDICT_FILE];
    let mut files = Vec::with_capacity(4);
    for (name, text) in names.iter().zip(texts) {
        files.push(CsvFile::parse(&dir.join(name), text)?);
    }
    let files: [CsvFile; 4] = files.try_into().map_err(|_| {
        TraceError::new(dir, 0, "", "four files expected".into(), "give all four files")
    })?;
    genai_from(dir, &files, mode)
}

/// Reads one file's rows: (line, timestamp, value, container) with the value checked by `check`
/// (`Err(message, fix)` on a bad value). `gateway` allows an empty `container_ip`.
fn samples(
    file: &CsvFile,
    mode: BadRows,
    skipped: &mut Skipped,
    check: &dyn Fn(f64) -> Result<(), (String, &'static str)>,
    extra: &dyn Fn(&Row<'_>) -> Result<(), TraceError>,
) -> Result<Vec<Sample>, TraceError> {
    let ts = file.column(&["timestamp_anon"])?;
    let value = file.column(&["value"])?;
    let ip = file.column(&["container_ip"])?;
    let mut out = Vec::with_capacity(file.len());
    for row in file.rows() {
        let parsed = (|| {
            let t: f64 = row.number(ts, "timestamp_anon")?;
            if !(t.is_finite() && t >= 0.0 && t.fract() == 0.0 && t < 1e15) {
                return Err(row.error(
                    "timestamp_anon",
                    format!("'{}' is not a whole number of seconds ≥ 0", row.get(ts).trim()),
                    "write the upstream timestamp (whole seconds)",
                ));
            }
            let v: f64 = row.number(value, "value")?;
            if let Err((message, fix)) = if v.is_finite() {
                check(v)
            } else {
                Err((
                    format!("'{}' is not a finite number", row.get(value).trim()),
                    "write a number",
                ))
            } {
                return Err(row.error("value", message, fix));
            }
            extra(&row)?;
            Ok(Sample {
                line: row.line,
                t_s: t as u64,
                value: v,
                ip: row.get(ip).trim().to_owned(),
            })
        })();
        match parsed {
            Ok(s) => out.push(s),
            Err(e) => skipped.record(mode, e)?,
        }
    }
    Ok(out)
}

/// The grid step: the most common gap between consecutive distinct timestamps (ties: the
/// smaller gap).
fn grid_step(all: &[u64]) -> Option<u64> {
    let mut ts: Vec<u64> = all.to_vec();
    ts.sort_unstable();
    ts.dedup();
    let mut gaps: BTreeMap<u64, usize> = BTreeMap::new();
    for w in ts.windows(2) {
        *gaps.entry(w[1] - w[0]).or_default() += 1;
    }
    let best = gaps.values().copied().max()?;
    gaps.into_iter().find(|&(_, n)| n == best).map(|(g, _)| g)
}

fn genai_from(dir: &Path, files: &[CsvFile; 4], mode: BadRows) -> Result<GenaiTrace, TraceError> {
    let mut skipped = Skipped::default();
    let none = |_: &Row<'_>| Ok(());
    let duty = samples(
        &files[0],
        mode,
        &mut skipped,
        &|v| {
            if (0.0..=100.0).contains(&v) {
                Ok(())
            } else {
                Err((format!("duty cycle {v} % is not in [0, 100]"), "write a percentage"))
            }
        },
        &none,
    )?;
    let non_negative = |v: f64| {
        if v >= 0.0 { Ok(()) } else { Err((format!("{v} is negative"), "write a number ≥ 0")) }
    };
    let memory = samples(&files[1], mode, &mut skipped, &non_negative, &none)?;
    // `request_type` is part of the upstream layout: required, any value.
    let request_type = files[2].column(&["request_type"])?;
    let qps = samples(&files[2], mode, &mut skipped, &non_negative, &|row| {
        row.text(request_type, "request_type").map(|_| ())
    })?;
    let predict = samples(&files[3], mode, &mut skipped, &non_negative, &none)?;

    let sets: [&[Sample]; 4] = [&duty, &memory, &qps, &predict];
    let all: Vec<u64> = sets.iter().flat_map(|s| s.iter().map(|x| x.t_s)).collect();
    let Some(t0_s) = all.iter().copied().min() else {
        return Err(TraceError::new(
            &dir.join(DUTY_FILE),
            0,
            "",
            "no rows in any of the four files".into(),
            "give a GenTD26 folder with samples",
        ));
    };
    let last_s = all.iter().copied().max().unwrap_or(t0_s);
    let step_s = grid_step(&all).unwrap_or(60);
    let span = (last_s - t0_s) / step_s + 1;
    if span > SLOTS_MAX {
        return Err(TraceError::new(
            &dir.join(DUTY_FILE),
            0,
            "timestamp_anon",
            format!("the trace spans {span} slots of {step_s} s, more than {SLOTS_MAX}"),
            "give at most that many slots (cut the trace)",
        ));
    }
    let slots = span as u32;

    // Every row on the grid, one per (file, container, slot); per file: container → slot → value.
    let mut per_file: [BTreeMap<String, BTreeMap<u32, f64>>; 4] = Default::default();
    let mut gateway_qps = Vec::new();
    let names = [DUTY_FILE, MEMORY_FILE, QPS_FILE, PREDICT_FILE];
    for (k, set) in sets.iter().enumerate() {
        let path = dir.join(names[k]);
        for s in set.iter() {
            let offset = s.t_s - t0_s;
            let bad = |field: &str, message: String, fix: &str| {
                TraceError::new(&path, s.line, field, message, fix)
            };
            if offset % step_s != 0 {
                let message =
                    format!("{} is not on the {step_s} s grid that starts at {t0_s}", s.t_s);
                let fix = "keep the upstream timestamps unchanged";
                skipped.record(mode, bad("timestamp_anon", message, fix))?;
                continue;
            }
            let slot = (offset / step_s) as u32;
            if s.ip.is_empty() {
                if k == 2 {
                    gateway_qps.push((slot, s.value));
                } else {
                    let fix = "give the container_ip of the sample";
                    skipped.record(mode, bad("container_ip", "empty".into(), fix))?;
                }
                continue;
            }
            let series = per_file[k].entry(s.ip.clone()).or_default();
            if series.insert(slot, s.value).is_some() {
                let message = format!("a second row for container {} at {}", s.ip, s.t_s);
                let fix = "keep one row per container and timestamp";
                skipped.record(mode, bad("container_ip", message, fix))?;
            }
        }
    }

    // Lifetimes from any file.
    let mut spans: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for map in &per_file {
        for (ip, series) in map {
            let (Some((&lo, _)), Some((&hi, _))) =
                (series.first_key_value(), series.last_key_value())
            else {
                continue;
            };
            let e = spans.entry(ip.as_str()).or_insert((lo, hi));
            e.0 = e.0.min(lo);
            e.1 = e.1.max(hi);
        }
    }
    if spans.len() > CONTAINERS_MAX {
        return Err(TraceError::new(
            &dir.join(DUTY_FILE),
            0,
            "container_ip",
            format!("{} containers, more than {CONTAINERS_MAX}", spans.len()),
            "give at most that many containers",
        ));
    }
    let cells: u64 = spans.values().map(|&(lo, hi)| u64::from(hi - lo) + 1).sum();
    if cells > CONTAINER_SLOTS_MAX {
        return Err(TraceError::new(
            &dir.join(DUTY_FILE),
            0,
            "container_ip",
            format!(
                "{cells} container-slots (lifetimes added up), more than {CONTAINER_SLOTS_MAX}"
            ),
            "give fewer containers or a shorter trace",
        ));
    }
    let request_unit_qps = per_file[2]
        .values()
        .flat_map(|s| s.values().copied())
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let request_unit_qps = if request_unit_qps.is_finite() { request_unit_qps } else { 1.0 };
    let empty = BTreeMap::new();
    let containers = spans
        .iter()
        .map(|(&ip, &(first, last))| {
            let series = |k: usize| -> Vec<Option<f64>> {
                let map = per_file[k].get(ip).unwrap_or(&empty);
                (first..=last).map(|s| map.get(&s).copied()).collect()
            };
            let qps: Vec<f64> = series(2).into_iter().map(|v| v.unwrap_or(0.0)).collect();
            let requests = qps
                .iter()
                .map(|&q| if q > 0.0 { ((q / request_unit_qps).round() as u32).max(1) } else { 0 })
                .collect();
            GenaiContainer {
                ip: ip.to_owned(),
                first_slot: first,
                last_slot: last,
                duty_pct: series(0),
                memory_bytes: series(1),
                requests,
                qps,
                predict_ms: series(3),
            }
        })
        .collect();
    gateway_qps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    Ok(GenaiTrace {
        dir: dir.to_path_buf(),
        t0_s,
        step_s,
        slots,
        containers,
        gateway_qps,
        request_unit_qps,
        rows: GenaiRows {
            duty: duty.len(),
            memory: memory.len(),
            qps: qps.len(),
            predict: predict.len(),
        },
        skipped,
    })
}
