//! No parser panics, on arbitrary input or on mutated real outputs. (Errors are fine; the
//! property is "returns".) The generated cases also check that whatever parses keeps its
//! invariants: permille values within 0..=1000, and a signal only with a value behind it.

use std::path::PathBuf;

use allot_telemetry::amd::{self, SysfsFiles};
use allot_telemetry::probe::{last_activity_from_json, parse_rfc3339_ms};
use allot_telemetry::prometheus::{Exporter, samples_from_query_answer};
use allot_telemetry::{Format, Sample, dcgm, parse, promtext};
use proptest::prelude::*;

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn corpus() -> Vec<(Format, String)> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixtures = manifest.join("../../../shared/fixtures");
    let data = manifest.join("tests/data");
    vec![
        (Format::DcgmExporter, read(fixtures.join("dcgm-exporter-sample.txt"))),
        (Format::AmdExporter, read(fixtures.join("amd-device-metrics-exporter-sample.txt"))),
        (Format::DcgmExporter, read(data.join("dcgm-hostname-profiling.txt"))),
        (Format::DcgmExporter, read(data.join("dcgm-mig.txt"))),
        (Format::AmdExporter, read(data.join("amd-exporter-cpx.txt"))),
        (Format::AmdSmi, read(data.join("amd-smi-usage.json"))),
        (Format::RocmSmi, read(data.join("rocm-smi.json"))),
    ]
}

/// 256 by default; the slow tier raises it (`ALLOT_PROPTEST_CASES=2048`).
fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

const FORMATS: [Format; 4] =
    [Format::DcgmExporter, Format::AmdExporter, Format::AmdSmi, Format::RocmSmi];

fn check_invariants(samples: &[Sample]) {
    for s in samples {
        for v in [s.utilisation, s.sm_active, s.engine_active, s.tensor_active, s.dram_active] {
            assert!(v.is_none_or(|v| v <= 1000), "{s:?}");
        }
        assert_eq!(s.signal.is_some(), s.signal_value().is_some(), "{s:?}");
        if s.identity.mig_instance.is_some() {
            assert_eq!(s.utilisation, None);
        }
    }
}

/// A mutation of a text: replace, insert or delete bytes at some positions (kept valid UTF-8
/// by working on chars).
fn mutate(text: &str, edits: &[(usize, u8, char)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for &(at, op, c) in edits {
        if chars.is_empty() {
            chars.push(c);
            continue;
        }
        let at = at % chars.len();
        match op % 3 {
            0 => chars[at] = c,
            1 => chars.insert(at, c),
            _ => {
                chars.remove(at);
            }
        }
    }
    chars.into_iter().collect()
}

fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        Just('"'),
        Just('\\'),
        Just('{'),
        Just('}'),
        Just(','),
        Just('='),
        Just(' '),
        Just('\n'),
        Just('#'),
        Just('9'),
        Just('-'),
        Just('.'),
        Just('e'),
        Just('['),
        Just(']'),
        Just(':'),
        any::<char>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC*") {
        for format in FORMATS {
            if let Ok(samples) = parse(format, &text) {
                check_invariants(&samples);
            }
        }
        let _ = promtext::parse(&text);
        let _ = samples_from_query_answer(Exporter::Dcgm, &text);
        let _ = samples_from_query_answer(Exporter::Amd, &text);
        let _ = parse_rfc3339_ms(&text);
        let _ = last_activity_from_json(&text, "/last_activity");
        let files = SysfsFiles {
            gpu_index: 0,
            gpu_busy_percent: Some(text.clone()),
            mem_busy_percent: Some(text.clone()),
            mem_info_vram_used: Some(text.clone()),
            mem_info_vram_total: Some(text),
        };
        let _ = amd::parse_sysfs(&files);
    }

    #[test]
    fn exposition_like_lines_never_panic(
        lines in prop::collection::vec(
            "[a-zA-Z_:]{1,12}(\\{([a-zA-Z_]{1,8}=\"[^\"\\n]{0,8}\",? ?){0,4}\\})? ?[-+0-9.eEInfNa]{0,12}( [0-9-]{0,14})?",
            0..20,
        )
    ) {
        let text = lines.join("\n");
        for format in [Format::DcgmExporter, Format::AmdExporter] {
            if let Ok(samples) = parse(format, &text) {
                check_invariants(&samples);
            }
        }
    }

    #[test]
    fn dcgm_like_series_keep_invariants(
        rows in prop::collection::vec(
            (
                prop::sample::select(vec!["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "dcgm_gpu_utilization"]),
                0u32..4,
                prop::option::of(0u32..3),
                prop_oneof![any::<f64>(), 0.0..1.5f64, 0.0..120.0f64, Just(9_223_372_036_854_775_794u64 as f64)],
            ),
            0..40,
        )
    ) {
        let text: String = rows
            .iter()
            .map(|(name, gpu, mig, value)| {
                let mig = mig.map(|m| format!(",GPU_I_ID=\"{m}\",GPU_I_PROFILE=\"1g.10gb\"")).unwrap_or_default();
                format!("{name}{{gpu=\"{gpu}\",UUID=\"GPU-{gpu}\"{mig}}} {value:?}\n")
            })
            .collect();
        let samples = dcgm::parse(&text).expect("well-formed lines parse");
        check_invariants(&samples);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        pick in 0usize..7,
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), interesting_char()), 1..12),
    ) {
        let corpus = corpus();
        let (format, text) = &corpus[pick % corpus.len()];
        let mutated = mutate(text, &edits);
        if let Ok(samples) = parse(*format, &mutated) {
            check_invariants(&samples);
        }
    }
}
