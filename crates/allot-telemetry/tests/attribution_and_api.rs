//! Attribution of samples to workloads, and the Prometheus query API answer path (pure: the
//! answer is built here from the fixture as Prometheus would return it).

use std::path::PathBuf;

use allot_core::idle::DeviceReading;
use allot_core::{Event, WorkloadId};
use allot_telemetry::attribution::{Allocation, activity_events, attribute, attribute_processes};
use allot_telemetry::prometheus::{Exporter, samples_from_query_answer};
use allot_telemetry::{DeviceIdentity, ProcessUsage, Sample, Vendor, amd, dcgm, promtext};
use serde_json::json;

fn fixture(name: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn allocation(
    node: &str,
    device: u32,
    mig: Option<u32>,
    workload: u64,
    member: u32,
    shares: u32,
) -> Allocation {
    Allocation {
        node: node.into(),
        device_index: device,
        mig_instance: mig,
        amd_partition: None,
        workload: WorkloadId(workload),
        member,
        shares,
        pod: None,
    }
}

#[test]
fn allocations_take_their_device_or_instance_sample() {
    let samples = dcgm::parse(&fixture("dcgm-exporter-sample.txt")).expect("parses");
    let allocations = [
        allocation("k8s-dra-driver-cluster-worker", 0, Some(9), 1, 0, 142),
        allocation("k8s-dra-driver-cluster-worker", 0, Some(8), 1, 1, 142),
        allocation("r6i3n0", 0, None, 2, 0, 1000),
        allocation("r6i3n0", 1, None, 2, 0, 1000),
        // A whole-GPU allocation does not take a MIG instance's sample, and vice versa.
        allocation("gsrh100-074", 0, None, 3, 0, 1000),
        allocation("nowhere", 0, None, 4, 0, 1000),
    ];
    let readings = attribute(&samples, &allocations);
    let reading = |member, shares, engine, util| DeviceReading {
        member,
        shares,
        sm_active: None,
        engine_active: engine,
        utilisation: util,
    };
    assert_eq!(
        readings[&WorkloadId(1)],
        [reading(0, 142, Some(34), None), reading(1, 142, Some(29), None)]
    );
    assert_eq!(
        readings[&WorkloadId(2)],
        [reading(0, 1000, None, Some(0)), reading(0, 1000, None, None)]
    );
    assert_eq!(
        readings[&WorkloadId(3)],
        [reading(0, 1000, None, None)],
        "missing telemetry, not idle"
    );
    assert_eq!(readings[&WorkloadId(4)], [reading(0, 1000, None, None)]);
    let events = activity_events(readings);
    assert_eq!(events.len(), 4);
    assert!(
        matches!(&events[0], Event::ActivitySampled { workload: WorkloadId(1), readings } if readings.len() == 2)
    );
}

#[test]
fn the_newest_sample_wins_and_amd_partition_zero_is_the_whole_gpu() {
    let mut old = Sample::new(DeviceIdentity {
        hostname: Some("n".into()),
        gpu_index: Some(0),
        amd_partition: Some(0),
        ..DeviceIdentity::new(Vendor::Amd)
    });
    old.at_ms = Some(1_000);
    old.engine_active = Some(900);
    old.classify();
    let mut new = old.clone();
    new.at_ms = Some(2_000);
    new.engine_active = Some(10);
    new.classify();
    let allocations = [Allocation {
        node: "n".into(),
        device_index: 0,
        mig_instance: None,
        amd_partition: None,
        workload: WorkloadId(7),
        member: 0,
        shares: 1000,
        pod: None,
    }];
    let readings = attribute(&[new, old], &allocations);
    assert_eq!(readings[&WorkloadId(7)][0].engine_active, Some(10));
}

/// `line` (a sample line of an exporter page) with label `key` set to `value`, or dropped with
/// `None`; added at the end if it was not there.
fn set_label(line: &str, key: &str, value: Option<&str>) -> String {
    let (labels, number) = line.rsplit_once(' ').expect("a sample line");
    let (name, labels) = labels.split_once('{').expect("labels");
    let labels = labels.strip_suffix('}').expect("closing brace");
    let mut kept: Vec<String> = labels
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty() && l.split_once('=').is_none_or(|(k, _)| k != key))
        .map(str::to_string)
        .collect();
    if let Some(value) = value {
        kept.push(format!("{key}=\"{value}\""));
    }
    format!("{name}{{{}}} {number}", kept.join(","))
}

fn pod(namespace: &str, name: &str) -> allot_telemetry::attribution::PodRef {
    allot_telemetry::attribution::PodRef { namespace: namespace.into(), name: name.into() }
}

fn pod_allocation(
    node: &str,
    guess: u32,
    workload: u64,
    member: u32,
    who: (&str, &str),
) -> Allocation {
    Allocation {
        pod: Some(pod(who.0, who.1)),
        ..allocation(node, guess, None, workload, member, 1000)
    }
}

#[test]
fn a_pod_takes_the_samples_the_exporter_labels_with_it_not_allots_device_guess() {
    // The fixture as captured: an L40S whose GPU 0 is pod redacted/tensorflow-0 ([E]), and two
    // MIG instances of an H100 held by two kserve pods ([D]).
    let samples = dcgm::parse(&fixture("dcgm-exporter-sample.txt")).expect("parses");
    let allocations = [
        // allot guessed GPU 3; the device plugin gave GPU 0.
        pod_allocation("l40s.example.com", 3, 1, 0, ("redacted", "tensorflow-0")),
        // The same name in another namespace is another pod.
        pod_allocation("l40s.example.com", 0, 2, 0, ("team-b", "tensorflow-0")),
        // The right pod, another node (a pod of the name that lived there before): not it.
        pod_allocation("gsrh100-074", 0, 3, 0, ("redacted", "tensorflow-0")),
        // A MIG instance: found by its pod, whichever instance it is.
        pod_allocation(
            "gsrh100-074",
            5,
            4,
            0,
            ("model-playground-stg", "tts-predictor-00011-deployment-5554f75554-8j8pl"),
        ),
    ];
    let readings = attribute(&samples, &allocations);
    let engine = |id: u64| readings[&WorkloadId(id)][0].engine_active;
    assert_eq!(engine(1), Some(0), "GPU 0's GR_ENGINE_ACTIVE 0.000000");
    assert_eq!(readings[&WorkloadId(2)][0].best_signal(), None, "missing, not another pod's");
    assert_eq!(readings[&WorkloadId(3)][0].best_signal(), None);
    assert_eq!(engine(4), Some(0));
    // Without its pod the same L40S allocation reads GPU 3, which the page does not have.
    let unlabelled = [Allocation { pod: None, ..allocations[0].clone() }];
    assert_eq!(attribute(&samples, &unlabelled)[&WorkloadId(1)][0].best_signal(), None);
}

#[test]
fn a_pod_with_several_gpus_takes_one_device_each_in_index_order() {
    // The real L40S line ([E]) as a 4-GPU node: GPUs 1 and 3 are pod ml/nb's, GPU 0 another
    // pod's, GPU 2 free (the exporter's empty pod labels).
    let fixture = fixture("dcgm-exporter-sample.txt");
    let line = fixture
        .lines()
        .find(|l| l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains("l40s.example.com"))
        .expect("the L40S line");
    let gpu = |index: u32, owner: Option<(&str, &str)>, value: &str| {
        let l = set_label(line, "gpu", Some(&index.to_string()));
        let l = set_label(&l, "UUID", Some(&format!("GPU-{index}")));
        let l = set_label(&l, "namespace", Some(owner.map_or("", |o| o.0)));
        let l = set_label(&l, "pod", Some(owner.map_or("", |o| o.1)));
        let (labels, _) = l.rsplit_once(' ').expect("a sample line");
        format!("{labels} {value}")
    };
    let page = [
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge".to_string(),
        gpu(3, Some(("ml", "nb")), "0.750000"),
        gpu(0, Some(("ml", "other")), "0.900000"),
        gpu(1, Some(("ml", "nb")), "0.000000"),
        gpu(2, None, "0.500000"),
    ]
    .join("\n");
    let samples = dcgm::parse(&page).expect("parses");
    assert_eq!(samples.len(), 4);
    let nb = ("ml", "nb");
    // Three allocations for a pod the page shows on two GPUs: the third has no signal.
    let allocations = [
        pod_allocation("l40s.example.com", 0, 1, 0, nb),
        pod_allocation("l40s.example.com", 1, 1, 0, nb),
        pod_allocation("l40s.example.com", 2, 1, 0, nb),
    ];
    let readings = attribute(&samples, &allocations);
    let engine: Vec<Option<u16>> =
        readings[&WorkloadId(1)].iter().map(|r| r.engine_active).collect();
    assert_eq!(engine, [Some(0), Some(750), None], "GPU 1, GPU 3, then nothing");

    // Relabelled `pod_name`/`pod_namespace` read the same; a pod label without a namespace
    // matches nothing.
    let relabelled = page.replace("namespace=", "pod_namespace=").replace(",pod=", ",pod_name=");
    assert!(!relabelled.contains(",pod=") && relabelled.contains(",pod_name=\"nb\""));
    let samples = dcgm::parse(&relabelled).expect("parses");
    let engine: Vec<Option<u16>> =
        attribute(&samples, &allocations)[&WorkloadId(1)].iter().map(|r| r.engine_active).collect();
    assert_eq!(engine, [Some(0), Some(750), None]);
    let no_namespace: Vec<String> = page
        .lines()
        .map(|l| if l.starts_with('#') { l.to_string() } else { set_label(l, "namespace", None) })
        .collect();
    let samples = dcgm::parse(&no_namespace.join("\n")).expect("parses");
    assert!(samples.iter().any(|s| s.jobs.pods.iter().any(|p| p.pod == "nb")));
    let readings = attribute(&samples, &allocations);
    assert!(readings[&WorkloadId(1)].iter().all(|r| r.best_signal().is_none()), "{readings:?}");
    // Scraped through Prometheus without honor_labels: the exporter's labels are renamed
    // exported_*, and pod/namespace name the exporter's own pod.
    let through_prometheus: Vec<String> = page
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                return l.to_string();
            }
            let l =
                l.replace("namespace=", "exported_namespace=").replace(",pod=", ",exported_pod=");
            let l = set_label(&l, "namespace", Some("gpu-operator"));
            set_label(&l, "pod", Some("nvidia-dcgm-exporter-x7k2p"))
        })
        .collect();
    let samples = dcgm::parse(&through_prometheus.join("\n")).expect("parses");
    let engine: Vec<Option<u16>> =
        attribute(&samples, &allocations)[&WorkloadId(1)].iter().map(|r| r.engine_active).collect();
    assert_eq!(engine, [Some(0), Some(750), None], "the workload's pod, not the exporter's");
}

#[test]
fn an_amd_exporter_pod_label_attributes_its_gpu() {
    // The real MI325X line ([C], gfx activity 83 %), its empty pod labels set as the
    // exporter sets them for a GPU a pod holds.
    let fixture = fixture("amd-device-metrics-exporter-sample.txt");
    let line = fixture.lines().find(|l| l.starts_with("amd_gpu_gfx_activity{")).expect("gfx line");
    let held = set_label(&set_label(line, "pod", Some("train-0")), "namespace", Some("ml"));
    let samples = amd::parse_exporter(&held).expect("parses");
    let host = samples[0].identity.hostname.clone().expect("hostname");
    let allocations = [pod_allocation(&host, 6, 1, 0, ("ml", "train-0"))];
    assert_eq!(attribute(&samples, &allocations)[&WorkloadId(1)][0].engine_active, Some(830));
    // As captured (no pod): nothing for the pod.
    let samples = amd::parse_exporter(line).expect("parses");
    assert_eq!(attribute(&samples, &allocations)[&WorkloadId(1)][0].best_signal(), None);
}

#[test]
fn processes_attributed_by_pid() {
    let mut sample = Sample::new(DeviceIdentity::new(Vendor::Nvidia));
    sample.processes = vec![
        ProcessUsage {
            pid: 10,
            memory_used_mib: Some(2_000),
            sm_util_permille: Some(870),
            last_seen_us: Some(5),
        },
        ProcessUsage {
            pid: 11,
            memory_used_mib: Some(500),
            sm_util_permille: None,
            last_seen_us: None,
        },
        ProcessUsage {
            pid: 20,
            memory_used_mib: Some(30_000),
            sm_util_permille: None,
            last_seen_us: None,
        },
        ProcessUsage {
            pid: 99,
            memory_used_mib: Some(1),
            sm_util_permille: Some(10),
            last_seen_us: None,
        },
    ];
    let owner = |pid: u32| match pid {
        10 | 11 => Some(WorkloadId(1)),
        20 => Some(WorkloadId(2)),
        _ => None,
    };
    let summary = attribute_processes(&[sample.clone(), sample], owner);
    assert_eq!(summary.len(), 2);
    assert_eq!(summary[&WorkloadId(1)].pids, [10, 11]);
    assert_eq!(summary[&WorkloadId(1)].memory_used_mib, 5_000);
    assert_eq!(summary[&WorkloadId(1)].sm_util_permille_max, Some(870));
    assert_eq!(summary[&WorkloadId(2)].sm_util_permille_max, None, "holds memory, no activity");
}

/// The answer Prometheus gives for the exporter's selector after scraping `text`: every series
/// with `job` and `instance` added, at one evaluation time.
fn vector_answer(text: &str, time_s: f64) -> String {
    let series = promtext::parse(text).expect("fixture parses");
    let result: Vec<_> = series
        .iter()
        .map(|s| {
            let mut metric = serde_json::Map::new();
            metric.insert("__name__".into(), json!(s.name));
            for (k, v) in &s.labels {
                metric.insert((*k).into(), json!(v));
            }
            metric.insert("job".into(), json!("fixtures"));
            metric.insert("instance".into(), json!("127.0.0.1:19101"));
            json!({"metric": metric, "value": [time_s, format!("{}", s.value)]})
        })
        .collect();
    json!({"status": "success", "data": {"resultType": "vector", "result": result}}).to_string()
}

fn without_time(mut samples: Vec<Sample>) -> Vec<Sample> {
    for s in &mut samples {
        s.at_ms = None;
    }
    samples
}

#[test]
fn query_answers_give_the_direct_parsers_samples() {
    let text = fixture("dcgm-exporter-sample.txt");
    let from_api =
        samples_from_query_answer(Exporter::Dcgm, &vector_answer(&text, 1_796_012_509.319))
            .expect("answer parses");
    assert!(from_api.iter().all(|s| s.at_ms == Some(1_796_012_509_319)));
    assert_eq!(without_time(from_api), dcgm::parse(&text).expect("parses"));
    let text = fixture("amd-device-metrics-exporter-sample.txt");
    let from_api = samples_from_query_answer(Exporter::Amd, &vector_answer(&text, 10.0))
        .expect("answer parses");
    assert_eq!(without_time(from_api), amd::parse_exporter(&text).expect("parses"));
}

#[test]
fn range_answers_give_one_sample_per_step() {
    let answer = json!({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_PROF_SM_ACTIVE", "gpu": "0", "UUID": "GPU-a", "Hostname": "h", "job": "j", "instance": "i"},
         "values": [[100, "0.5"], [115, "0.25"], [130, "NaN"]]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": "GPU-a", "Hostname": "h", "job": "j", "instance": "i"},
         "values": [[100, "100"], [130, "9223372036854775794"]]}
    ]}});
    let samples = samples_from_query_answer(Exporter::Dcgm, &answer.to_string()).expect("parses");
    let got: Vec<_> = samples.iter().map(|s| (s.at_ms, s.sm_active, s.utilisation)).collect();
    assert_eq!(
        got,
        [
            (Some(100_000), Some(500), Some(1000)),
            (Some(115_000), Some(250), None),
            (Some(130_000), None, None)
        ]
    );
}

#[test]
fn query_errors_are_clear() {
    let e = samples_from_query_answer(
        Exporter::Dcgm,
        r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#,
    )
    .expect_err("error answer");
    assert!(e.to_string().contains("parse error at char 3"), "{e}");
    let e = samples_from_query_answer(
        Exporter::Dcgm,
        r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#,
    )
    .expect_err("scalar");
    assert_eq!(e.field, "data.resultType");
    let e = samples_from_query_answer(Exporter::Dcgm, r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0"},"value":[1]}]}}"#).expect_err("bad point");
    assert_eq!(e.field, "data.result[0].value");
    assert!(samples_from_query_answer(Exporter::Dcgm, "<html>").is_err());
}

#[test]
fn prometheus_source_refuses_bad_urls_and_reports_unreachable_servers() {
    use allot_telemetry::prometheus::{PrometheusError, PrometheusSource};
    use std::time::Duration;
    assert!(matches!(
        PrometheusSource::new("localhost:9090", Duration::from_secs(1)),
        Err(PrometheusError::BadUrl(_))
    ));
    // A port nothing listens on: bind one, then drop it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let source =
        PrometheusSource::new(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(2))
            .expect("valid URL");
    let e = source.instant(Exporter::Dcgm, None).expect_err("nothing listens");
    assert!(matches!(e, PrometheusError::Transport { .. }), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}/api/v1/query")), "{e}");
}
