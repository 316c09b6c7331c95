//! `allot sim pack` and `allot sim fgd-compare` as a user runs them.

mod common;

use common::{allot, text};

const NODES: &str = "../shared/traces/alibaba-gpu-v2023-openb/openb_node_list_gpu_node.csv";
const PODS: &str = "../shared/traces/alibaba-gpu-v2023-openb/openb_pod_list_default.csv";

/// `allot sim pack` on the shared default trace with `extra` flags.
fn pack(extra: &[&str]) -> std::process::Output {
    let mut args = vec!["sim", "pack", "--nodes", NODES, "--pods", PODS];
    args.extend_from_slice(extra);
    allot(&args)
}

#[test]
fn engine_runs_beside_the_policies_and_refuses_hindsight() {
    let out = pack(&["--engine", "--inflate", "0.3", "--output", "json", "--no-timing"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = json["placements"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["placement"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["allot", "engine"]);
    let out = pack(&["--engine", "--hindsight"]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--engine"), "{}", text(&out.stderr));
}

#[test]
fn the_acceptance_command_prints_the_curves_as_json() {
    // The command, with two seeds instead of ten to keep `cargo test` fast.
    let args = [
        "--placement",
        "fgd",
        "--inflate",
        "1.3",
        "--seeds",
        "42-43",
        "--output",
        "json",
        "--no-timing",
    ];
    let out = pack(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for key in ["allocation_pct", "fragmentation_pct", "fragmentation_ratio_pct"] {
        assert_eq!(json[key].as_array().map(Vec::len), Some(131), "{key}");
    }
    assert_eq!(json["per_seed"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["wall_ms"], 0);
    let at_130 = json["allocation_pct"][130].as_f64().unwrap_or(0.0);
    // FGD on default: the authors' 10-seed mean is 95.39 with a seed spread of ±0.08.
    assert!((at_130 - 95.39).abs() < 1.5, "{at_130}");
    // Byte-identical on a second run.
    assert_eq!(pack(&args).stdout, out.stdout);
}

#[test]
fn bad_input_names_the_file_line_and_field_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("allot-sim-pack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pods = dir.join("pods.csv");
    std::fs::write(&pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1,1,x\n")
        .expect("write");
    let pods = pods.to_string_lossy().into_owned();
    let out = allot(&["sim", "pack", "--nodes", NODES, "--pods", &pods]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("pods.csv:2: gpu_milli: 'x' is not a valid number"), "{err}");
    assert!(out.stdout.is_empty());

    let out = allot(&["sim", "pack", "--nodes", "nope.csv", "--pods", &pods]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("nope.csv: cannot read"), "{}", text(&out.stderr));

    let out = pack(&["--seeds", "51-42"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--seeds: '51-42'"), "{}", text(&out.stderr));

    let out = pack(&["--placement", "tetris"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("use random, dotprod"), "{}", text(&out.stderr));
}

#[test]
fn fgd_compare_prints_ours_against_the_published_means() {
    let out = allot(&[
        "sim",
        "fgd-compare",
        "--workloads",
        "openb_pod_list_cpu050",
        "--placement",
        "bestfit",
        "--seeds",
        "42",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("| cpu050 |"), "{table}");
    assert!(table.contains("0 outside ±1.5 points"), "{table}");
}

#[test]
fn charts_are_written_as_svg_and_png() {
    let dir = std::env::temp_dir().join(format!("allot-sim-pack-charts-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let out = pack(&["--placement", "bestfit,random", "--seeds", "42", "--charts", &dir_arg]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    for stem in ["pack_allocation", "pack_fragmentation", "pack_fragmentation_ratio"] {
        let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap_or_default();
        assert!(svg.contains("bestfit") && svg.contains("random"), "{stem}.svg");
        assert!(dir.join(format!("{stem}.png")).exists(), "{stem}.png");
    }
    // The text table lists both placements with the 130 % column.
    let table = text(&out.stdout);
    assert!(table.contains("130%") && table.contains("bestfit") && table.contains("random"));
}

#[test]
fn hindsight_packs_the_same_pods_largest_first() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["--placement", "bestfit", "--seeds", "42", "--output", "json", "--no-timing"];
        args.extend_from_slice(extra);
        let out = pack(&args);
        assert!(out.status.success(), "stderr: {}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let online = run(&[]);
    let hindsight = run(&["--hindsight"]);
    assert_eq!(online["arrival_order"], "online");
    assert_eq!(hindsight["arrival_order"], "decreasing");
    // The same multiset of pods arrives either way.
    assert_eq!(online["per_seed"][0]["pods_arrived"], hindsight["per_seed"][0]["pods_arrived"]);
    assert_eq!(
        online["per_seed"][0]["final_arrived_pct"],
        hindsight["per_seed"][0]["final_arrived_pct"]
    );
}

#[test]
fn bound_adds_an_upper_bound_and_the_gap_per_placement() {
    // Two nodes of two GPUs, ten 600-share pods: no GPU holds two, so every placement and the
    // bound both come to 4 × 600 of 4000 shares = 60 %.
    let dir = std::env::temp_dir().join(format!("allot-bound-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let nodes = dir.join("nodes.csv");
    let pods = dir.join("pods.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,T4\nn2,64000,262144,2,T4\n",
    )
    .expect("write nodes");
    let mut rows = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for i in 0..10 {
        rows.push_str(&format!("p{i},4000,8192,1,600,\n"));
    }
    std::fs::write(&pods, rows).expect("write pods");
    let (nodes, pods) = (nodes.to_string_lossy().into_owned(), pods.to_string_lossy().into_owned());
    let run = |output: &str| {
        let args = [
            "sim",
            "pack",
            "--nodes",
            &nodes,
            "--pods",
            &pods,
            "--placement",
            "fgd,bestfit",
            "--seeds",
            "42-43",
            "--bound",
            "--no-timing",
            "--output",
            output,
        ];
        let out = allot(&args);
        assert!(out.status.success(), "stderr: {}", text(&out.stderr));
        out.stdout
    };
    let json_bytes = run("json");
    let json: serde_json::Value = serde_json::from_slice(&json_bytes).expect("json");
    let bound = &json["bound"];
    assert_eq!(bound["mean_pct"], 60.0);
    assert_eq!(bound["per_seed"].as_array().map(Vec::len), Some(2));
    assert_eq!(bound["per_seed"][1]["seed"], 43);
    assert_eq!(bound["per_seed"][0]["bound_milli"], 2400);
    assert_eq!(bound["per_seed"][0]["wall_ms"], 0);
    assert_eq!(bound["gap_pct"]["fgd"], 0.0);
    assert_eq!(bound["gap_pct"]["bestfit"], 0.0);
    assert_eq!(run("json"), json_bytes, "byte-identical with --no-timing");
    let text_out = text(&run("text"));
    assert!(text_out.contains("mean over seeds: 60.00 %"), "{text_out}");
    assert!(text_out.contains("fgd 0.00, bestfit 0.00"), "{text_out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn migrate_budgets_are_validated_by_name() {
    for bad in ["-1", "101", "x", "1,,2"] {
        let out = pack(&["--engine", "--migrate", bad]);
        assert_eq!(out.status.code(), Some(1), "{bad}: stderr: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("--migrate") && err.contains("0 to 100"), "{bad}: {err}");
    }
    let out = pack(&["--migrate", "1"]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("add --engine"), "{}", text(&out.stderr));
}

#[test]
fn migrate_reports_each_budgets_moves() {
    let base = ["--engine", "--migrate", "0,5", "--placement", "fgd", "--inflate", "0.3"];
    let mut args = base.to_vec();
    args.extend(["--output", "json", "--no-timing"]);
    let out = pack(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let placements = json["placements"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = placements.iter().filter_map(|p| p["placement"].as_str()).collect();
    assert_eq!(names, ["fgd", "engine migrate 0%", "engine migrate 5%"]);
    assert!(placements[0].get("migration").is_none(), "no budget, no migration fields");
    for (run, budget) in placements[1..].iter().zip([0.0, 5.0]) {
        let mean = &run["migration"];
        assert_eq!(mean["budget_pct"].as_f64(), Some(budget));
        for key in ["pods_moved", "moved_pct", "plans", "move_cost_gpu_hours", "pods_lost"] {
            assert!(mean[key].is_number(), "{key}: {mean}");
        }
        let seed = &run["per_seed"][0]["migration"];
        assert!(seed["pods_placed"].as_u64().unwrap_or(0) > 0, "{seed}");
        assert!(seed["moved_pct"].as_f64().unwrap_or(100.0) <= budget, "{seed}");
    }
    let text_out = pack(&base);
    assert!(text_out.status.success(), "stderr: {}", text(&text_out.stderr));
    let printed = text(&text_out.stdout);
    for field in ["engine migrate 5%", "pods moved", "moved % of placed", "cost GPU-h", "mean"] {
        assert!(printed.contains(field), "{field}: {printed}");
    }
}
