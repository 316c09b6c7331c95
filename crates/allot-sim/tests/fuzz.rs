//! No panic on any input: every trace parser gets arbitrary text, and text that is almost a
//! valid file (a real header with random fields), and must answer `Ok` or an error that names
//! the file — never panic. The packer must then run on whatever parsed.

use std::path::Path;

use allot_core::packing::PackPolicy;
use allot_sim::BadRows;
use allot_sim::genai::parse_genai;
use allot_sim::openb::{parse_nodes, parse_pods};
use allot_sim::pack::{self, PackInput};
use allot_sim::trace::{
    parse_allot_trace, parse_philly_jobs, parse_philly_machines, parse_philly_vcs,
};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// A field: mostly numbers near the edges of what parsers expect, some junk.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..3000).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just(String::new()),
        Just("-1".to_owned()),
        Just("1e309".to_owned()),
        Just("NaN".to_owned()),
        Just("T4|G2||V100M32".to_owned()),
        Just("\"quoted, with comma\"".to_owned()),
        "[a-zA-Z0-9 .:|{}\"-]{0,12}",
    ]
}

fn rows(header: &'static str, width: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::collection::vec(field(), 0..width + 2), 0..12).prop_map(
        move |rows| {
            let mut text = format!("{header}\n");
            for row in rows {
                text.push_str(&row.join(","));
                text.push('\n');
            }
            text
        },
    )
}

fn check<T, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(e) = result {
        assert!(e.to_string().contains("fuzz"), "error does not name the file: {e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}", lossy in prop::collection::vec(any::<u8>(), 0..300)) {
        let path = Path::new("fuzz.csv");
        let bytes = String::from_utf8_lossy(&lossy).into_owned();
        for t in [&text, &bytes] {
            for mode in [BadRows::Fail, BadRows::Skip] {
                check(parse_nodes(path, t, mode));
                check(parse_pods(path, t, mode));
                check(parse_philly_jobs(path, t, mode));
                check(parse_philly_machines(path, t, mode));
                check(parse_allot_trace(path, t, mode));
            }
            check(parse_philly_vcs(path, t));
            check(parse_genai(Path::new("fuzz"), [t, t, t, t], BadRows::Fail));
        }
    }

    #[test]
    fn almost_valid_genai_folders_parse_or_fail_cleanly(
        duty in rows("value,timestamp_anon,container_ip", 3),
        memory in rows("timestamp_anon,value,container_ip", 3),
        qps in rows("timestamp_anon,value,container_ip,request_type", 4),
        predict in rows("timestamp_anon,value,container_ip", 3),
    ) {
        for mode in [BadRows::Fail, BadRows::Skip] {
            let parsed = parse_genai(Path::new("fuzz"), [&duty, &memory, &qps, &predict], mode);
            if let Ok(t) = &parsed {
                for c in &t.containers {
                    prop_assert!(c.first_slot <= c.last_slot && c.last_slot < t.slots);
                    prop_assert_eq!(c.slots(), (c.last_slot - c.first_slot + 1) as usize);
                }
            }
            check(parsed);
        }
    }

    #[test]
    fn almost_valid_openb_files_parse_or_fail_cleanly_and_pack(
        nodes in rows("sn,cpu_milli,memory_mib,gpu,model", 5),
        pods in rows("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time", 11),
        seed in 0u64..100,
    ) {
        let path = Path::new("fuzz.csv");
        let parsed_nodes = parse_nodes(path, &nodes, BadRows::Skip);
        let parsed_pods = parse_pods(path, &pods, BadRows::Skip);
        check(parsed_nodes.clone());
        check(parsed_pods.clone());
        if let (Ok((n, _)), Ok((p, _))) = (parsed_nodes, parsed_pods)
            && let Ok(input) = PackInput::new(&n, &p)
        {
            for policy in PackPolicy::ALL {
                let report = pack::run(&input, policy, 1.3, &[seed]);
                prop_assert_eq!(report.allocation_pct.len(), 131);
            }
        }
    }

    #[test]
    fn almost_valid_philly_and_allot_files_parse_or_fail_cleanly(
        jobs in rows("timestamp,duration,num_gpus,gpu_time,cluster", 5),
        machines in rows("machineId, number of GPUs, single GPU mem", 3),
        trace in rows("id,submit_s,duration_s,project,gpus,members,gpu_milli,gpu_model,kind", 9),
    ) {
        let path = Path::new("fuzz.csv");
        check(parse_philly_jobs(path, &jobs, BadRows::Skip));
        check(parse_philly_machines(path, &machines, BadRows::Skip));
        check(parse_allot_trace(path, &trace, BadRows::Skip));
        check(parse_allot_trace(path, &trace, BadRows::Fail));
    }
}
