//! Against a real Prometheus that scrapes the fixture files (scripts/prometheus-check.sh sets it
//! up): the samples read back through the query API equal the direct parser's, apart from the
//! query time. Runs only with ALLOT_PROMETHEUS_URL set; the script's jobs are `dcgm` and `amd`.

use std::path::PathBuf;
use std::time::Duration;

use allot_telemetry::prometheus::{Exporter, PrometheusSource};
use allot_telemetry::{Sample, amd, dcgm};

fn fixture(name: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn without_time(mut samples: Vec<Sample>) -> Vec<Sample> {
    for s in &mut samples {
        s.at_ms = None;
    }
    samples
}

#[allow(clippy::print_stderr)]
fn source() -> Option<PrometheusSource> {
    let Ok(url) = std::env::var("ALLOT_PROMETHEUS_URL") else {
        eprintln!("ALLOT_PROMETHEUS_URL is not set: run scripts/prometheus-check.sh for this test");
        return None;
    };
    Some(PrometheusSource::new(&url, Duration::from_secs(10)).expect("a valid URL"))
}

#[test]
fn instant_and_range_queries_read_back_the_fixtures() {
    let Some(source) = source() else { return };
    for (exporter, direct) in [
        (Exporter::Dcgm, dcgm::parse(&fixture("dcgm-exporter-sample.txt")).expect("parses")),
        (
            Exporter::Amd,
            amd::parse_exporter(&fixture("amd-device-metrics-exporter-sample.txt"))
                .expect("parses"),
        ),
    ] {
        assert!(!direct.is_empty());
        let instant = source.instant(exporter, None).expect("instant query");
        assert!(instant.iter().all(|s| s.at_ms.is_some()), "{exporter:?}: query time is set");
        assert_eq!(without_time(instant), direct, "{exporter:?}: instant query");

        // The last 10 s at 5 s steps: every step holds the same samples (the fixture is static).
        let end_s = now_s();
        let range = source.range(exporter, end_s - 10.0, end_s, 5.0).expect("range query");
        let mut times: Vec<u64> = range.iter().filter_map(|s| s.at_ms).collect();
        times.sort();
        times.dedup();
        assert!(!times.is_empty(), "{exporter:?}: the range query returned no steps");
        report(&format!(
            "{exporter:?}: {} samples from the instant query and at each of {} range steps equal the direct parser's",
            direct.len(),
            times.len()
        ));
        for t in times {
            let step: Vec<Sample> = range.iter().filter(|s| s.at_ms == Some(t)).cloned().collect();
            assert_eq!(without_time(step), direct, "{exporter:?}: range step at {t} ms");
        }
    }
}

#[allow(clippy::print_stderr)]
fn report(line: &str) {
    eprintln!("{line}");
}

/// Seconds since the epoch: the range query must end at the server's "now".
#[allow(clippy::disallowed_methods)] // a live server: its "now" is the real clock
fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
