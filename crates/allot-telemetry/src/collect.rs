//! The live sources, behind one type the daemon, the node agent and `allot telemetry watch`
//! share: NVML, amdgpu sysfs, an exporter's `/metrics` scraped over HTTP, or a Prometheus
//! server's query API. Each call reads once; pacing and backoff are the caller's
//! (`schedule::CollectorSchedule`).

use std::path::PathBuf;
use std::time::Duration;

use crate::nvml::NvmlCollector;
use crate::prometheus::{Exporter, PrometheusSource};
use crate::sample::Sample;
use crate::{Format, amd, parse};

/// Bounds every HTTP read of a source.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest exporter page read (a 10,000-GPU dcgm-exporter page is about 30 MB).
const SCRAPE_BYTES_MAX: u64 = 64 << 20;

/// One place GPU activity is read from.
#[derive(Debug)]
pub enum Source {
    /// NVIDIA GPUs of this host.
    Nvml(Box<NvmlCollector>),
    /// AMD GPUs of this host (`ROOT/class/drm/card*/device`).
    Sysfs { root: PathBuf, hostname: Option<String> },
    /// An exporter's page (dcgm-exporter, AMD device-metrics-exporter) read directly.
    Scrape { url: String, format: Format, hostname: Option<String>, agent: ureq::Agent },
    /// A Prometheus server that scrapes such exporters.
    Prometheus { source: PrometheusSource, exporter: Exporter, url: String },
}

impl Source {
    /// A source from its spec: `nvml`, `sysfs[=ROOT]`, `dcgm-exporter=URL`,
    /// `amd-exporter=URL`, `prometheus-dcgm=URL` or `prometheus-amd=URL`. `hostname` names
    /// this host's devices (NVML, sysfs) and an exporter page's devices without a hostname
    /// label.
    pub fn from_spec(spec: &str, hostname: Option<String>) -> Result<Source, String> {
        let (kind, arg) = match spec.split_once('=') {
            Some((k, a)) => (k, Some(a)),
            None => (spec, None),
        };
        let url = |what: &str| -> Result<String, String> {
            match arg {
                Some(u) if u.starts_with("http://") || u.starts_with("https://") => {
                    Ok(u.to_string())
                }
                _ => Err(format!("{what} needs an http:// or https:// URL: {kind}=URL")),
            }
        };
        match kind {
            "nvml" => NvmlCollector::init(hostname)
                .map(|c| Source::Nvml(Box::new(c)))
                .map_err(|e| format!("{e} — is the NVIDIA driver installed?")),
            "sysfs" => Ok(Source::Sysfs { root: PathBuf::from(arg.unwrap_or("/sys")), hostname }),
            "dcgm-exporter" | "amd-exporter" => {
                let format = if kind == "dcgm-exporter" {
                    Format::DcgmExporter
                } else {
                    Format::AmdExporter
                };
                let agent = ureq::Agent::config_builder()
                    .timeout_global(Some(HTTP_TIMEOUT))
                    .user_agent(concat!("allot-telemetry/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .new_agent();
                Ok(Source::Scrape { url: url(kind)?, format, hostname, agent })
            }
            "prometheus-dcgm" | "prometheus-amd" => {
                let exporter =
                    if kind == "prometheus-dcgm" { Exporter::Dcgm } else { Exporter::Amd };
                let url = url(kind)?;
                let source =
                    PrometheusSource::new(&url, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
                Ok(Source::Prometheus { source, exporter, url })
            }
            _ => Err(format!(
                "unknown telemetry source {spec:?}: use nvml, sysfs[=ROOT], dcgm-exporter=URL, \
                 amd-exporter=URL, prometheus-dcgm=URL or prometheus-amd=URL"
            )),
        }
    }

    /// This host's own GPUs, if any can be read: NVML when the driver loads, else amdgpu
    /// sysfs when it lists a card with `gpu_busy_percent`.
    pub fn local(hostname: Option<String>) -> Option<Source> {
        if let Ok(c) = NvmlCollector::init(hostname.clone()) {
            return Some(Source::Nvml(Box::new(c)));
        }
        let root = PathBuf::from("/sys");
        let amd = amd::read_sysfs(&root)
            .map(|cards| cards.iter().any(|c| c.gpu_busy_percent.is_some()))
            .unwrap_or(false);
        amd.then_some(Source::Sysfs { root, hostname })
    }

    /// What the source is, for logs and errors.
    pub fn name(&self) -> String {
        match self {
            Source::Nvml(_) => "nvml".into(),
            Source::Sysfs { root, .. } => format!("sysfs={}", root.display()),
            Source::Scrape { url, format, .. } => match format {
                Format::AmdExporter => format!("amd-exporter={url}"),
                _ => format!("dcgm-exporter={url}"),
            },
            Source::Prometheus { exporter, url, .. } => match exporter {
                Exporter::Dcgm => format!("prometheus-dcgm={url}"),
                Exporter::Amd => format!("prometheus-amd={url}"),
            },
        }
    }

    /// One reading of every device the source covers, stamped `now_ms` where the source gives
    /// no time; problems with single devices come back as warnings beside the samples.
    pub fn collect(&mut self, now_ms: u64) -> Result<(Vec<Sample>, Vec<String>), String> {
        let mut warnings = Vec::new();
        let mut samples = match self {
            Source::Nvml(c) => c.collect(now_ms).map_err(|e| e.to_string())?,
            Source::Sysfs { root, hostname } => {
                let files = amd::read_sysfs(root)
                    .map_err(|e| format!("{}/class/drm: {e}", root.display()))?;
                let mut samples = Vec::new();
                for f in &files {
                    // One unreadable card must not hide the others.
                    match amd::parse_sysfs(f) {
                        Ok(mut sample) => {
                            sample.identity.hostname.clone_from(hostname);
                            samples.push(sample);
                        }
                        Err(e) => warnings.push(format!(
                            "{}/class/drm, AMD card {}: {e}",
                            root.display(),
                            f.gpu_index
                        )),
                    }
                }
                samples
            }
            Source::Scrape { url, format, hostname, agent } => {
                let mut response =
                    agent.get(url.as_str()).call().map_err(|e| format!("{url}: {e}"))?;
                let text = response
                    .body_mut()
                    .with_config()
                    .limit(SCRAPE_BYTES_MAX)
                    .read_to_string()
                    .map_err(|e| format!("{url}: {e}"))?;
                let mut samples = parse(*format, &text).map_err(|e| format!("{url}: {e}"))?;
                for s in &mut samples {
                    if s.identity.hostname.is_none() {
                        s.identity.hostname.clone_from(hostname);
                    }
                }
                samples
            }
            Source::Prometheus { source, exporter, .. } => {
                source.instant(*exporter, None).map_err(|e| e.to_string())?
            }
        };
        for s in &mut samples {
            s.at_ms.get_or_insert(now_ms);
        }
        Ok((samples, warnings))
    }
}

/// This host's name as the kernel has it (what NVML-discovered nodes are called).
pub fn local_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked_and_named() {
        let s = Source::from_spec("dcgm-exporter=http://127.0.0.1:9400/metrics", None)
            .expect("valid spec");
        assert_eq!(s.name(), "dcgm-exporter=http://127.0.0.1:9400/metrics");
        let s = Source::from_spec("prometheus-amd=http://p:9090", None).expect("valid spec");
        assert_eq!(s.name(), "prometheus-amd=http://p:9090");
        assert_eq!(Source::from_spec("sysfs", None).expect("valid").name(), "sysfs=/sys");
        for bad in ["dcgm-exporter", "amd-exporter=ftp://x", "gpu", "prometheus-dcgm="] {
            assert!(Source::from_spec(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_sysfs_tree_reads_with_the_hostname_and_time() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sysfs");
        let mut s = Source::Sysfs { root, hostname: Some("gpu-7".into()) };
        let (samples, _) = s.collect(42).expect("fixture tree");
        assert!(!samples.is_empty());
        assert!(samples.iter().all(|x| x.identity.hostname.as_deref() == Some("gpu-7")));
        assert!(samples.iter().all(|x| x.at_ms == Some(42)));
    }
}
