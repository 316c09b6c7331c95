//! Every parser on the real exporter outputs in `../shared/fixtures/` and on the recorded
//! variants in `tests/data/`.

use std::path::PathBuf;

use allot_core::idle::{DeviceReading, Signal};
use allot_telemetry::amd::{self, SysfsFiles};
use allot_telemetry::{Activity, Confidence, Sample, dcgm};

fn fixture(name: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn data(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One line per sample: identity, signal, confidence, key metrics — easy to compare whole.
fn summary(samples: &[Sample]) -> Vec<String> {
    samples
        .iter()
        .map(|s| {
            let id = &s.identity;
            format!(
                "{} gpu={:?} uuid={} mig={:?}/{} part={:?} signal={:?}:{:?} {:?} util={:?} sm={:?} eng={:?} tensor={:?} dram={:?} mem={:?}/{:?}",
                id.hostname.as_deref().unwrap_or("-"),
                id.gpu_index,
                id.uuid.as_deref().unwrap_or("-"),
                id.mig_instance,
                id.mig_profile.as_deref().unwrap_or("-"),
                id.amd_partition,
                s.signal,
                s.signal_value(),
                s.confidence,
                s.utilisation,
                s.sm_active,
                s.engine_active,
                s.tensor_active,
                s.dram_active,
                s.memory_used_mib,
                s.memory_total_mib,
            )
        })
        .collect()
}

#[test]
fn dcgm_fixture_every_device_and_instance() {
    let samples = dcgm::parse(&fixture("dcgm-exporter-sample.txt")).expect("the fixture parses");
    let got = summary(&samples);
    let expected = [
        "- gpu=Some(0) uuid=GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52 mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
        "- gpu=Some(0) uuid=GPU-6bf47ca9-ad3e-15db-beed-1079a7d74116 mig=None/- part=None signal=Some(Utilisation):Some(440) Low util=Some(440) sm=None eng=None tensor=None dram=None mem=None/None",
        "dcgm-exporter-lcxpl gpu=Some(0) uuid=GPU-55274b56-9033-f166-7723-77088b0ff94d mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
        "dcgm-exporter-lcxpl gpu=Some(1) uuid=GPU-dad58a68-8239-6bb7-1f07-539b85fabfee mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
        "dcgm-exporter-lcxpl gpu=Some(4) uuid=GPU-58fae45b-e5a5-0c62-d478-8ff7c485e74e mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
        "dcgm-exporter-sn5rp gpu=Some(0) uuid=GPU-603a8873-0edd-c157-ce48-2078e8b1a935 mig=Some(1)/2g.12gb part=None signal=Some(EngineActive):Some(381) Medium util=None sm=None eng=Some(381) tensor=Some(22) dram=None mem=None/None",
        "gsrh100-074 gpu=Some(0) uuid=GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77 mig=Some(7)/1g.10gb part=None signal=Some(EngineActive):Some(0) Medium util=None sm=None eng=Some(0) tensor=None dram=None mem=None/None",
        "gsrh100-074 gpu=Some(0) uuid=GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77 mig=Some(8)/1g.10gb part=None signal=Some(EngineActive):Some(0) Medium util=None sm=None eng=Some(0) tensor=None dram=None mem=None/None",
        "gsrh100-074 gpu=Some(0) uuid=GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77 mig=Some(9)/1g.10gb part=None signal=Some(EngineActive):Some(0) Medium util=None sm=None eng=Some(0) tensor=None dram=None mem=None/None",
        "k8s-dra-driver-cluster-worker gpu=Some(0) uuid=GPU-2c2f45e8-0886-e3cc-02be-a4181a13fc9b mig=Some(8)/1g.10gb part=None signal=Some(EngineActive):Some(29) Medium util=None sm=None eng=Some(29) tensor=None dram=None mem=None/None",
        "k8s-dra-driver-cluster-worker gpu=Some(0) uuid=GPU-2c2f45e8-0886-e3cc-02be-a4181a13fc9b mig=Some(9)/1g.10gb part=None signal=Some(EngineActive):Some(34) Medium util=None sm=None eng=Some(34) tensor=None dram=None mem=None/None",
        "l40s.example.com gpu=Some(0) uuid=GPU-585834da-79ca-0599-5140-4ffdb131ae93 mig=None/- part=None signal=Some(EngineActive):Some(0) Medium util=None sm=None eng=Some(0) tensor=None dram=None mem=None/None",
        "l40s.example.com gpu=Some(2) uuid=GPU-5bd39b62-f1d2-21f3-d9d5-24cf8d513c73 mig=None/- part=None signal=Some(EngineActive):Some(0) Medium util=None sm=None eng=Some(0) tensor=None dram=None mem=None/None",
        "r6i3n0 gpu=Some(0) uuid=GPU-a6158b59-2c1e-1e63-0068-9178c4298abd mig=None/- part=None signal=Some(Utilisation):Some(0) Low util=Some(0) sm=None eng=None tensor=None dram=None mem=None/None",
        "r6i3n0 gpu=Some(1) uuid=GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5 mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
    ];
    assert_eq!(got, expected);
    // Kubernetes labels: set on instance 7 and 9, absent on 8; empty labels are no owner.
    let pods: Vec<_> = samples
        .iter()
        .map(|s| s.jobs.pods.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>())
        .collect();
    assert_eq!(pods[6], ["text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"]);
    assert!(pods[7].is_empty());
    assert_eq!(samples[6].jobs.pods[0].namespace.as_deref(), Some("model-playground-stg"));
    assert_eq!(samples[6].jobs.pods[0].container.as_deref(), Some("kserve-container"));
    assert!(samples[5].jobs.pods.is_empty(), "empty pod labels are not an owner");
    assert_eq!(samples[6].identity.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert!(samples[0].reason.contains("no activity"), "{}", samples[0].reason);
}

#[test]
fn dcgm_hostname_profiling_and_jobs() {
    let samples = dcgm::parse(&data("dcgm-hostname-profiling.txt")).expect("parses");
    assert_eq!(samples.len(), 2, "HPC duplicates are one device");
    let (tiny, busy) = (&samples[0], &samples[1]);
    assert_eq!(tiny.identity.hostname.as_deref(), Some("gpu-node-07"));
    // The "one tiny kernel" case: utilisation 100 %, engine ~100 %, SMs < 1 %.
    assert_eq!(
        (tiny.utilisation, tiny.engine_active, tiny.sm_active),
        (Some(1000), Some(1000), Some(8))
    );
    assert_eq!((tiny.signal, tiny.confidence), (Some(Signal::SmActive), Confidence::High));
    assert_eq!(tiny.activity(100), Activity::IdleWithMemory);
    assert_eq!(tiny.jobs.hpc_jobs, ["4711", "4712"]);
    assert_eq!((tiny.memory_used_mib, tiny.memory_total_mib), (Some(1), Some(80_560)));
    assert_eq!(busy.activity(100), Activity::Active);
    assert_eq!((busy.tensor_active, busy.dram_active), (Some(412), Some(531)));
    assert_eq!(busy.jobs.pods[0].pod, "trainer-0");
    assert_eq!(busy.jobs.pods[0].namespace.as_deref(), Some("team-a"));
    assert_eq!(busy.jobs.pods[0].container.as_deref(), Some("main"));
    assert_eq!(busy.memory_total_mib, Some(80_559));
    assert_eq!(
        busy.device_reading(1, 500),
        DeviceReading {
            member: 1,
            shares: 500,
            sm_active: Some(871),
            engine_active: Some(962),
            utilisation: Some(970)
        }
    );
}

#[test]
fn dcgm_old_namespace() {
    let samples = dcgm::parse(&data("dcgm-old-namespace.txt")).expect("parses");
    let got: Vec<_> = samples
        .iter()
        .map(|s| {
            (
                s.identity.gpu_index,
                s.identity.uuid.is_some(),
                s.utilisation,
                s.memory_used_mib,
                s.memory_total_mib,
                s.confidence,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some(0), true, Some(440), Some(15_109), Some(16_160), Confidence::Low),
            (Some(1), true, Some(0), Some(0), Some(16_160), Confidence::Low),
            (Some(2), true, None, None, None, Confidence::Unknown),
        ]
    );
    assert_eq!(samples[1].activity(100), Activity::Idle);
}

#[test]
fn dcgm_mig_ignores_gpu_util_and_clamps_sm_active() {
    let samples = dcgm::parse(&data("dcgm-mig.txt")).expect("parses");
    assert_eq!(samples.len(), 2);
    let (with_prof, without) = (&samples[0], &samples[1]);
    assert_eq!(with_prof.identity.mig_instance, Some(1));
    assert_eq!(with_prof.identity.mig_profile.as_deref(), Some("3g.40gb"));
    assert_eq!(with_prof.utilisation, None, "GPU_UTIL is 0 on every MIG instance: not evidence");
    assert_eq!((with_prof.sm_active, with_prof.confidence), (Some(1000), Confidence::High));
    assert_eq!(without.identity.mig_instance, Some(13));
    assert_eq!((without.signal, without.confidence), (None, Confidence::Unknown));
    assert!(without.reason.contains("MIG"), "{}", without.reason);
    assert_eq!(without.activity(100), Activity::Unknown);
    assert_eq!(without.device_reading(0, 142).best_signal(), None);
    assert_eq!(without.memory_used_mib, Some(13));
}

#[test]
fn dcgm_sentinels_are_absent() {
    assert!(dcgm::is_dcgm_sentinel(9_223_372_036_854_775_794.0));
    assert!(dcgm::is_dcgm_sentinel(140_737_488_355_328.0));
    assert!(dcgm::is_dcgm_sentinel(2_147_483_632.0));
    assert!(!dcgm::is_dcgm_sentinel(4_335_301_032.0), "a large counter is not a sentinel");
    assert!(!dcgm::is_dcgm_sentinel(100.0));
    let samples = dcgm::parse(&data("dcgm-sentinels.txt")).expect("parses");
    assert_eq!(samples.len(), 2);
    assert_eq!((samples[0].utilisation, samples[0].memory_used_mib), (None, None));
    assert_eq!(samples[0].confidence, Confidence::Unknown);
    // Profiling "not supported": falls back to utilisation with low confidence.
    assert_eq!((samples[1].sm_active, samples[1].utilisation), (None, Some(30)));
    assert_eq!(
        (samples[1].signal, samples[1].confidence),
        (Some(Signal::Utilisation), Confidence::Low)
    );
    assert_eq!(samples[1].memory_used_mib, Some(512));
}

#[test]
fn dcgm_errors_name_line_and_field() {
    let e = dcgm::parse("DCGM_FI_DEV_GPU_UTIL{gpu=\"x\"} 1\n").expect_err("bad gpu");
    assert_eq!((e.line, e.field.as_str()), (1, "gpu"));
    let e = dcgm::parse("# c\nDCGM_FI_DEV_GPU_UTIL{modelName=\"m\"} 1\n").expect_err("no gpu");
    assert_eq!((e.line, e.field.as_str()), (2, "gpu"));
    let e = dcgm::parse("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} abc\n").expect_err("bad value");
    assert_eq!(
        e.to_string(),
        "line 1: DCGM_FI_DEV_GPU_UTIL: value \"abc\" is not a number (or NaN, +Inf, -Inf)"
    );
    // Other families are not ours and need no gpu label.
    assert_eq!(dcgm::parse("go_goroutines 12\n").expect("ignored"), Vec::new());
}

#[test]
fn amd_exporter_fixture() {
    let samples =
        amd::parse_exporter(&fixture("amd-device-metrics-exporter-sample.txt")).expect("parses");
    let got = summary(&samples);
    assert_eq!(
        got,
        [
            "cb76105c40d0 gpu=Some(0) uuid=- mig=None/- part=None signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
            "master-1 gpu=Some(0) uuid=17ff74b5-0000-1000-805c-37b0fbe69430 mig=None/- part=Some(0) signal=None:None Unknown util=None sm=None eng=None tensor=None dram=None mem=None/None",
            "mi325x8-110.atl1.do.cpe.ice.amd.com gpu=Some(0) uuid=00000000-0000-0000-0000-000000000000 mig=None/- part=None signal=Some(EngineActive):Some(830) Medium util=None sm=None eng=Some(830) tensor=None dram=None mem=None/None",
        ]
    );
    assert_eq!(samples[1].identity.model.as_deref(), Some("Aqua Vanjaram [Instinct MI300X VF]"));
    assert_eq!(samples[2].processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [2_912_425]);
    assert_eq!(samples[2].activity(100), Activity::Active);
}

#[test]
fn amd_exporter_partitions_other_than_zero_are_unknown() {
    let samples = amd::parse_exporter(&data("amd-exporter-cpx.txt")).expect("parses");
    assert_eq!(samples.len(), 8);
    let p0 = &samples[0];
    assert_eq!(p0.identity.amd_partition, Some(0));
    // Per-XCC busy (40 %) wins over the whole-GPU gfx activity (37 %).
    assert_eq!((p0.engine_active, p0.dram_active), (Some(400), Some(120)));
    assert_eq!((p0.memory_used_mib, p0.memory_total_mib), (Some(20_480), Some(24_560)));
    assert_eq!(p0.jobs.pods[0].pod, "llm-0");
    for p in &samples[1..] {
        assert_eq!((p.signal, p.confidence), (None, Confidence::Unknown), "{:?}", p.identity);
        assert!(p.reason.contains("partition 0 only"), "{}", p.reason);
        assert_ne!(p.activity(100), Activity::Idle);
        assert_ne!(p.activity(100), Activity::IdleWithMemory);
    }
    assert_eq!(samples[1].jobs.hpc_jobs, ["91234"]);
}

#[test]
fn amd_smi_values_and_na() {
    let samples = amd::parse_amd_smi(&data("amd-smi-usage.json")).expect("parses");
    assert_eq!(samples.len(), 2);
    assert_eq!((samples[0].engine_active, samples[0].dram_active), (Some(420), Some(70)));
    assert_eq!(samples[0].confidence, Confidence::Medium);
    assert_eq!(
        (samples[1].engine_active, samples[1].dram_active),
        (Some(750), None),
        "mean of the XCCs"
    );
    let na = amd::parse_amd_smi(&data("amd-smi-na.json")).expect("parses");
    assert_eq!((na[0].signal, na[0].confidence), (None, Confidence::Unknown));
    let e = amd::parse_amd_smi("[{\"gpu\":0}]").expect_err("no usage");
    assert_eq!(e.field, "[0].usage");
    let e = amd::parse_amd_smi("[\n{\"gpu\":0,\n").expect_err("truncated");
    assert!(e.line >= 2, "{e}");
    assert!(
        amd::parse_amd_smi(
            "{\"gpu_data\":[{\"gpu\":3,\"usage\":{\"gfx_activity\":{\"value\":5,\"unit\":\"%\"}}}]}"
        )
        .is_ok()
    );
}

#[test]
fn rocm_smi_strings() {
    let samples = amd::parse_rocm_smi(&data("rocm-smi.json")).expect("parses");
    let got: Vec<_> = samples
        .iter()
        .map(|s| {
            (
                s.identity.gpu_index,
                s.utilisation,
                s.dram_active,
                s.memory_used_mib,
                s.memory_total_mib,
                s.confidence,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some(0), Some(0), Some(0), Some(11), Some(24_560), Confidence::Low),
            (Some(1), Some(990), None, Some(53_248), Some(65_520), Confidence::Low),
        ]
    );
    assert!(amd::parse_rocm_smi("[]").is_err());
    assert_eq!(amd::parse_rocm_smi("{\"cardX\":{}}").expect_err("bad key").field, "cardX");
}

#[test]
fn sysfs_files_and_reader() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/sysfs");
    let cards = amd::read_sysfs(&root).expect("reads the fake sysfs");
    assert_eq!(cards.len(), 2, "the NVIDIA card and the connector are skipped: {cards:?}");
    let sample = amd::parse_sysfs(&cards[0]).expect("parses");
    assert_eq!(
        (sample.utilisation, sample.dram_active, sample.memory_used_mib, sample.memory_total_mib),
        (Some(630), Some(40), Some(1_024), Some(16_368))
    );
    assert_eq!((sample.signal, sample.confidence), (Some(Signal::Utilisation), Confidence::Low));
    let e = amd::parse_sysfs(&cards[1]).expect_err("garbage");
    assert_eq!(e.field, "gpu_busy_percent");
    let empty = amd::parse_sysfs(&SysfsFiles::default()).expect("nothing to read is not an error");
    assert_eq!(empty.confidence, Confidence::Unknown);
    assert!(amd::read_sysfs(&root.join("missing")).is_err());
}

#[test]
fn with_a_process_list_only_processes_hold_memory() {
    use allot_telemetry::{DeviceIdentity, ProcessUsage, Vendor};
    let mut sample = Sample::new(DeviceIdentity::new(Vendor::Nvidia));
    sample.utilisation = Some(0);
    sample.memory_used_mib = Some(450); // the driver's reservation on an empty GPU
    sample.classify();
    assert_eq!(sample.activity(100), Activity::IdleWithMemory, "an exporter's FB_USED counts");
    sample.processes_listed = true;
    assert_eq!(sample.activity(100), Activity::Idle, "NVML listed no process");
    sample.processes.push(ProcessUsage {
        pid: 7,
        memory_used_mib: Some(4096),
        sm_util_permille: None,
        last_seen_us: None,
    });
    assert_eq!(sample.activity(100), Activity::IdleWithMemory);
    assert_eq!(
        allot_telemetry::process_activity(&sample.processes[0], 100),
        Activity::IdleWithMemory
    );
    sample.processes[0].sm_util_permille = Some(850);
    sample.utilisation = Some(990);
    sample.classify();
    assert_eq!(sample.activity(100), Activity::Active);
    assert_eq!(allot_telemetry::process_activity(&sample.processes[0], 100), Activity::Active);
}
