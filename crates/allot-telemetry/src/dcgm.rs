//! NVIDIA dcgm-exporter: Prometheus text, or the same series read back through a Prometheus
//! query, into one [`Sample`] per GPU or MIG instance (and per timestamp, for range queries).
//!
//! Labels accepted: `Hostname` or `hostname` (renamed in dcgm-exporter PR #655), `UUID` or `uuid`
//! (`--use-old-namespace`), `gpu`, `modelName`, `GPU_I_ID`/`GPU_I_PROFILE` (MIG), Kubernetes
//! `namespace`/`pod`/`container` (or the relabelled `pod_namespace`/`pod_name`/`container_name`,
//! or Prometheus' `exported_namespace`/`exported_pod`/`exported_container`, which win),
//! and `hpc_job` (HPC job mapping). Metric names are matched without regard to case, so the old
//! lower-case `dcgm_fi_*` exports work too, as do the 1.x names `dcgm_gpu_utilization`,
//! `dcgm_fb_used`, `dcgm_fb_free`. Any other `DCGM_FI_*`/`dcgm_*` series still makes the device
//! known (it then appears with confidence Unknown); other families are ignored.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::ParseError;
use crate::promtext::{self, Series};
use crate::sample::{
    DeviceIdentity, PodLabels, Sample, Vendor, amount, percent_to_permille, ratio_to_permille,
};

/// Parses dcgm-exporter's `/metrics` text.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut grouper = Grouper::default();
    promtext::for_each_series(text, |series| grouper.add(series))?;
    Ok(grouper.finish())
}

/// DCGM's "blank / not found / not supported / no permission" values: int64 sentinels start at
/// 0x7ffffffffffffff0, FP64 ones at 2^47 (`DCGM_FP64_BLANK`), int32 ones at 0x7ffffff0.
pub fn is_dcgm_sentinel(value: f64) -> bool {
    const FP64_BLANK: f64 = 140_737_488_355_328.0;
    const INT32_BLANK: f64 = 2_147_483_632.0;
    value >= FP64_BLANK || (INT32_BLANK..=2_147_483_647.0).contains(&value)
}

#[derive(Clone, Copy)]
enum Field {
    Utilisation,
    SmActive,
    EngineActive,
    TensorActive,
    DramActive,
    FbUsed,
    FbFree,
    FbReserved,
    FbTotal,
    /// Known family, no activity or memory meaning: identifies the device only.
    Other,
}

fn field_of(name: &str) -> Option<Field> {
    const FIELDS: [(&str, Field); 12] = [
        ("DCGM_FI_DEV_GPU_UTIL", Field::Utilisation),
        ("dcgm_gpu_utilization", Field::Utilisation),
        ("DCGM_FI_PROF_SM_ACTIVE", Field::SmActive),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", Field::EngineActive),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Field::TensorActive),
        ("DCGM_FI_PROF_DRAM_ACTIVE", Field::DramActive),
        ("DCGM_FI_DEV_FB_USED", Field::FbUsed),
        ("dcgm_fb_used", Field::FbUsed),
        ("DCGM_FI_DEV_FB_FREE", Field::FbFree),
        ("dcgm_fb_free", Field::FbFree),
        ("DCGM_FI_DEV_FB_RESERVED", Field::FbReserved),
        ("DCGM_FI_DEV_FB_TOTAL", Field::FbTotal),
    ];
    // Exact names first (one comparison per line in a big scrape), then any case.
    if let Some((_, f)) = FIELDS.iter().find(|(n, _)| *n == name) {
        return Some(*f);
    }
    if let Some((_, f)) = FIELDS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
        return Some(*f);
    }
    let lower_prefix = name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("dcgm_"));
    lower_prefix.then_some(Field::Other)
}

/// Grouping key: host, GPU index, UUID, MIG instance, timestamp. Borrowed from the input unless
/// a label value had escapes.
type Key<'a> = (Option<Cow<'a, str>>, Option<u32>, Option<Cow<'a, str>>, Option<u32>, Option<i64>);

#[derive(Default)]
struct Memory {
    used: Option<u64>,
    free: Option<u64>,
    reserved: Option<u64>,
    total: Option<u64>,
}

/// Turns dcgm-exporter series (from text or a Prometheus query) into samples, sorted by host,
/// GPU index, UUID, MIG instance and time.
pub fn samples_from_series<'a>(series: &[Series<'a>]) -> Result<Vec<Sample>, ParseError> {
    let mut grouper = Grouper::default();
    for s in series {
        grouper.add(s)?;
    }
    Ok(grouper.finish())
}

/// A label value that lives as long as the input.
fn keep<'a>(value: &Cow<'a, str>) -> Cow<'a, str> {
    match value {
        Cow::Borrowed(s) => Cow::Borrowed(s),
        Cow::Owned(s) => Cow::Owned(s.clone()),
    }
}

/// Collects series into one sample per key. Exporters print each family's series in the same
/// device order, so the group after the last one matched is tried before the index: a scrape
/// costs one key comparison per line instead of a tree search.
#[derive(Default)]
struct Grouper<'a> {
    groups: Vec<(Key<'a>, Sample, Memory)>,
    index: BTreeMap<Key<'a>, usize>,
    cursor: usize,
}

impl<'a> Grouper<'a> {
    fn add(&mut self, s: &Series<'a>) -> Result<(), ParseError> {
        let Some(field) = field_of(s.name) else { return Ok(()) };
        let labels = DcgmLabels::of(s);
        let gpu = parse_u32(s, "gpu", labels.gpu.map(|i| s.labels[i].1.as_ref()))?;
        let uuid = labels.uuid.map(|i| keep(&s.labels[i].1));
        if gpu.is_none() && uuid.is_none() {
            return Err(ParseError {
                line: s.line,
                field: "gpu".into(),
                message: format!("{} has neither a gpu nor a UUID label", s.name),
            });
        }
        let mig = parse_u32(s, "GPU_I_ID", labels.mig_instance.map(|i| s.labels[i].1.as_ref()))?;
        let host = labels.hostname.map(|i| keep(&s.labels[i].1));
        let key = (host, gpu, uuid, mig, s.timestamp_ms);
        let at = if self.groups.get(self.cursor).is_some_and(|g| g.0 == key) {
            self.cursor
        } else if let Some(&at) = self.index.get(&key) {
            at
        } else {
            let mut identity = DeviceIdentity::new(Vendor::Nvidia);
            identity.hostname = key.0.as_deref().map(str::to_string);
            identity.gpu_index = gpu;
            identity.uuid = key.2.as_deref().map(str::to_string);
            identity.mig_instance = mig;
            let text = |at: Option<usize>| at.map(|i| s.labels[i].1.to_string());
            identity.mig_profile = text(labels.mig_profile);
            identity.model = text(labels.model);
            let mut sample = Sample::new(identity);
            sample.at_ms = s.timestamp_ms.and_then(|t| u64::try_from(t).ok());
            self.index.insert(key.clone(), self.groups.len());
            self.groups.push((key, sample, Memory::default()));
            self.groups.len() - 1
        };
        self.cursor = at + 1;
        let (_, sample, memory) = &mut self.groups[at];
        if labels.has_job_labels {
            add_job_labels(sample, s);
        }
        let value = Some(s.value).filter(|v| !is_dcgm_sentinel(*v));
        match field {
            Field::Utilisation => sample.utilisation = value.and_then(percent_to_permille),
            Field::SmActive => sample.sm_active = value.and_then(ratio_to_permille),
            Field::EngineActive => sample.engine_active = value.and_then(ratio_to_permille),
            Field::TensorActive => sample.tensor_active = value.and_then(ratio_to_permille),
            Field::DramActive => sample.dram_active = value.and_then(ratio_to_permille),
            Field::FbUsed => memory.used = value.and_then(amount),
            Field::FbFree => memory.free = value.and_then(amount),
            Field::FbReserved => memory.reserved = value.and_then(amount),
            Field::FbTotal => memory.total = value.and_then(amount),
            Field::Other => {}
        }
        Ok(())
    }

    /// The samples in key order, classified.
    fn finish(self) -> Vec<Sample> {
        let mut groups: Vec<Option<(Sample, Memory)>> =
            self.groups.into_iter().map(|(_, sample, memory)| Some((sample, memory))).collect();
        self.index
            .into_values()
            .filter_map(|at| groups.get_mut(at).and_then(Option::take))
            .map(|(mut sample, memory)| {
                sample.memory_used_mib = memory.used;
                sample.memory_total_mib = memory.total.or_else(|| {
                    let (used, free) = (memory.used?, memory.free?);
                    Some(used.saturating_add(free).saturating_add(memory.reserved.unwrap_or(0)))
                });
                sample.classify();
                sample
            })
            .collect()
    }
}

/// The labels dcgm-exporter series are grouped by, read in one pass over the label list (the
/// 10,000-GPU parse does this 120,000 times). Empty values count as absent.
struct DcgmLabels {
    gpu: Option<usize>,
    uuid: Option<usize>,
    hostname: Option<usize>,
    mig_instance: Option<usize>,
    mig_profile: Option<usize>,
    model: Option<usize>,
    has_job_labels: bool,
}

impl DcgmLabels {
    /// Positions in `s.labels` of the labels that matter.
    fn of(s: &Series<'_>) -> DcgmLabels {
        let mut l = DcgmLabels {
            gpu: None,
            uuid: None,
            hostname: None,
            mig_instance: None,
            mig_profile: None,
            model: None,
            has_job_labels: false,
        };
        for (at, (key, value)) in s.labels.iter().enumerate() {
            if value.is_empty() {
                continue;
            }
            let slot = match *key {
                "gpu" => &mut l.gpu,
                // `UUID` wins over the old `uuid` if both appear; the same for hostname.
                "UUID" => &mut l.uuid,
                "uuid" if l.uuid.is_none() => &mut l.uuid,
                "Hostname" => &mut l.hostname,
                "hostname" if l.hostname.is_none() => &mut l.hostname,
                "GPU_I_ID" => &mut l.mig_instance,
                "GPU_I_PROFILE" => &mut l.mig_profile,
                "modelName" => &mut l.model,
                "pod" | "pod_name" | "exported_pod" | "hpc_job" | "job_id" => {
                    l.has_job_labels = true;
                    continue;
                }
                _ => continue,
            };
            *slot = Some(at);
        }
        l
    }
}

fn parse_u32(s: &Series<'_>, name: &str, value: Option<&str>) -> Result<Option<u32>, ParseError> {
    match value {
        None => Ok(None),
        Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| ParseError {
            line: s.line,
            field: name.to_string(),
            message: format!("{v:?} is not a non-negative integer (in {})", s.name),
        }),
    }
}

/// Adds the series' pod and HPC job labels to the sample (empty labels mean "no owner").
/// Prometheus renames a scraped label that collides with a target label of the same name
/// (`pod`, `namespace`, `container` of the exporter's own pod, from Kubernetes service
/// discovery) to `exported_…`: where those are present they name the workload's pod, and the
/// plain ones the exporter's.
pub(crate) fn add_job_labels(sample: &mut Sample, s: &Series<'_>) {
    if let Some(pod) = s.label_any(&["exported_pod", "pod", "pod_name"]) {
        let exported = s.label_any(&["exported_pod"]).is_some();
        let namespace = if exported {
            s.label_any(&["exported_namespace"])
        } else {
            s.label_any(&["namespace", "pod_namespace"])
        };
        let container = if exported {
            s.label_any(&["exported_container"])
        } else {
            s.label_any(&["container", "container_name"])
        };
        // Every family repeats the owner: compare before allocating.
        let known = sample.jobs.pods.iter().any(|p| {
            p.pod == pod
                && p.namespace.as_deref() == namespace
                && p.container.as_deref() == container
        });
        if !known {
            let labels = PodLabels {
                namespace: namespace.map(str::to_string),
                pod: pod.to_string(),
                container: container.map(str::to_string),
            };
            if let Err(at) = sample.jobs.pods.binary_search(&labels) {
                sample.jobs.pods.insert(at, labels);
            }
        }
    }
    for label in ["hpc_job", "job_id"] {
        if let Some(job) = s.label_any(&[label])
            && let Err(at) = sample.jobs.hpc_jobs.binary_search_by(|j| j.as_str().cmp(job))
        {
            sample.jobs.hpc_jobs.insert(at, job.to_string());
        }
    }
}
