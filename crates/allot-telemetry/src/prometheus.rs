//! The Prometheus HTTP query API as a source, for sites that already scrape dcgm-exporter or the
//! AMD device-metrics-exporter: instant (`/api/v1/query`) and range (`/api/v1/query_range`)
//! queries, whose vector or matrix goes through the same series-to-sample code as the direct
//! parsers. The labels Prometheus adds (`job`, `instance`) are not read.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::Value;

use crate::promtext::Series;
use crate::sample::Sample;
use crate::{ParseError, amd, dcgm};

/// Which exporter's series to ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exporter {
    Dcgm,
    Amd,
}

impl Exporter {
    /// The selector for every series of this exporter.
    pub fn selector(self) -> &'static str {
        match self {
            Exporter::Dcgm => r#"{__name__=~"DCGM_FI_.*|dcgm_.*"}"#,
            Exporter::Amd => r#"{__name__=~"(amd_)?gpu_.*"}"#,
        }
    }

    fn samples(self, series: &[Series<'_>]) -> Result<Vec<Sample>, ParseError> {
        match self {
            Exporter::Dcgm => dcgm::samples_from_series(series),
            Exporter::Amd => amd::exporter_samples_from_series(series),
        }
    }
}

/// Why a query gave no samples.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The base URL is not http:// or https://.
    #[error("Prometheus URL {0:?} is not an http:// or https:// address")]
    BadUrl(String),
    /// Connection refused, timeout, TLS, reading the body.
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
    /// Prometheus answered with an error (bad query, overload) or a non-2xx status.
    #[error("{url}: Prometheus answered {status}: {message}")]
    Api { url: String, status: u16, message: String },
    /// The answer is not the query API's JSON, or its series are not the exporter's.
    #[error("{url}: {source}")]
    Answer { url: String, source: ParseError },
}

/// A Prometheus server's query API.
#[derive(Clone, Debug)]
pub struct PrometheusSource {
    base: String,
    agent: ureq::Agent,
}

impl PrometheusSource {
    /// `base_url` like `http://127.0.0.1:9090`; `timeout` bounds each whole request.
    pub fn new(base_url: &str, timeout: Duration) -> Result<PrometheusSource, PrometheusError> {
        let base = base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(PrometheusError::BadUrl(base_url.to_string()));
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .user_agent(concat!("allot-telemetry/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Ok(PrometheusSource { base, agent })
    }

    /// The exporter's samples at `time_s` (seconds since the epoch; `None`: now).
    pub fn instant(
        &self,
        exporter: Exporter,
        time_s: Option<f64>,
    ) -> Result<Vec<Sample>, PrometheusError> {
        let mut params = vec![("query", exporter.selector().to_string())];
        if let Some(t) = time_s {
            params.push(("time", format!("{t:.3}")));
        }
        self.query("/api/v1/query", &params, exporter)
    }

    /// The exporter's samples every `step_s` seconds from `start_s` to `end_s`: one sample per
    /// device and step.
    pub fn range(
        &self,
        exporter: Exporter,
        start_s: f64,
        end_s: f64,
        step_s: f64,
    ) -> Result<Vec<Sample>, PrometheusError> {
        let params = vec![
            ("query", exporter.selector().to_string()),
            ("start", format!("{start_s:.3}")),
            ("end", format!("{end_s:.3}")),
            ("step", format!("{step_s:.3}")),
        ];
        self.query("/api/v1/query_range", &params, exporter)
    }

    fn query(
        &self,
        path: &str,
        params: &[(&str, String)],
        exporter: Exporter,
    ) -> Result<Vec<Sample>, PrometheusError> {
        let url = format!("{}{path}", self.base);
        let transport = |message: String| PrometheusError::Transport { url: url.clone(), message };
        let mut request = self.agent.get(&url);
        for (k, v) in params {
            request = request.query(*k, v);
        }
        let mut response = request.call().map_err(|e| transport(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(512 << 20)
            .read_to_string()
            .map_err(|e| transport(format!("reading the answer: {e}")))?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| body.chars().take(200).collect());
            return Err(PrometheusError::Api { url, status, message });
        }
        samples_from_query_answer(exporter, &body)
            .map_err(|source| PrometheusError::Answer { url, source })
    }
}

fn answer_error(field: &str, message: impl Into<String>) -> ParseError {
    ParseError { line: 0, field: field.to_string(), message: message.into() }
}

/// Samples from a query API answer (`{"status":"success","data":{"resultType":"vector"|"matrix",
/// "result":[…]}}`). Pure: the HTTP part is [`PrometheusSource`].
pub fn samples_from_query_answer(
    exporter: Exporter,
    body: &str,
) -> Result<Vec<Sample>, ParseError> {
    let root: Value = serde_json::from_str(body).map_err(|e| ParseError {
        line: e.line(),
        field: "answer".into(),
        message: format!("not JSON: {e}"),
    })?;
    if root.get("status").and_then(Value::as_str) != Some("success") {
        let message = root.get("error").and_then(Value::as_str).unwrap_or("no error message");
        return Err(answer_error("status", format!("the query failed: {message}")));
    }
    let data = root.get("data").ok_or_else(|| answer_error("data", "missing"))?;
    let kind = data.get("resultType").and_then(Value::as_str).unwrap_or("");
    if kind != "vector" && kind != "matrix" {
        return Err(answer_error(
            "data.resultType",
            format!("{kind:?}: expected vector or matrix (query a selector, not a scalar)"),
        ));
    }
    let result = data
        .get("result")
        .and_then(Value::as_array)
        .ok_or_else(|| answer_error("data.result", "missing or not a list"))?;
    let mut series = Vec::new();
    for (i, item) in result.iter().enumerate() {
        let field = |name: &str| format!("data.result[{i}].{name}");
        let metric = item
            .get("metric")
            .and_then(Value::as_object)
            .ok_or_else(|| answer_error(&field("metric"), "missing or not an object"))?;
        let name = metric
            .get("__name__")
            .and_then(Value::as_str)
            .ok_or_else(|| answer_error(&field("metric.__name__"), "missing"))?;
        let labels: Vec<(&str, Cow<'_, str>)> = metric
            .iter()
            .filter(|(k, _)| k.as_str() != "__name__")
            .filter_map(|(k, v)| Some((k.as_str(), Cow::Borrowed(v.as_str()?))))
            .collect();
        let points: Vec<&Value> = match kind {
            "vector" => {
                vec![item.get("value").ok_or_else(|| answer_error(&field("value"), "missing"))?]
            }
            _ => item
                .get("values")
                .and_then(Value::as_array)
                .ok_or_else(|| answer_error(&field("values"), "missing or not a list"))?
                .iter()
                .collect(),
        };
        for point in points {
            let (time_s, value) = match point.as_array().map(Vec::as_slice) {
                Some([t, v]) => (t.as_f64(), v.as_str().and_then(parse_value)),
                _ => (None, None),
            };
            let (Some(time_s), Some(value)) = (time_s, value) else {
                return Err(answer_error(&field("value"), "expected [time, \"value\"]"));
            };
            series.push(Series {
                name,
                labels: labels.clone(),
                value,
                timestamp_ms: Some((time_s * 1_000.0).round() as i64),
                line: 0,
            });
        }
    }
    exporter.samples(&series)
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}
