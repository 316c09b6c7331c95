//! The parsers on payloads recorded from the test cluster (`tests/data/record.sh`), and on
//! arbitrary input (no panic).

use allot_backend_slurm::parse::{
    Gres, exit_code_of, expand_hostlist, parse_gres_list, parse_job_details, parse_partitions,
    parse_sbatch_job_id, parse_sinfo, parse_squeue, parse_squeue_format,
};
use allot_backend_slurm::{JobcompRecord, jobcomp_gpu_hours, node_state_words, parse_jobcomp};
use proptest::prelude::*;

fn data(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn job(jobs: &[allot_backend_slurm::SqueueJob], id: u64) -> &allot_backend_slurm::SqueueJob {
    jobs.iter().find(|j| j.job_id == id).unwrap_or_else(|| panic!("job {id} in the payload"))
}

#[test]
fn squeue_jobs_of_every_state() {
    let jobs = parse_squeue(&data("squeue-states.json")).expect("recorded squeue parses");
    assert_eq!(jobs.len(), 17);

    let completed = job(&jobs, 10);
    assert_eq!((completed.name.as_str(), completed.state.as_str()), ("allot-1.1", "COMPLETED"));
    assert!(completed.is_terminal() && completed.ran());
    assert_eq!(completed.exit_code(), Some(0));
    assert_eq!(completed.comment, "allot:1.1");
    assert_eq!(completed.account, "research");

    let failed = job(&jobs, 11);
    assert_eq!(failed.state, "FAILED");
    assert_eq!(failed.exit_status, 768);
    assert_eq!(failed.exit_code(), Some(3));
    assert_eq!(failed.exit_signal(), None);

    let running = job(&jobs, 12);
    assert!(running.is_running());
    assert_eq!(running.nodes, ["node1", "node2"]);
    let gpus = running.gpus_per_node();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].0, "node1");
    assert_eq!(gpus[0].1.gres_type.as_deref(), Some("h100"));
    assert_eq!(gpus[0].1.count, 4);
    assert_eq!(gpus[0].1.indices, [3, 4, 5, 6]);
    assert_eq!(gpus[1].1.indices, [0, 1, 2, 3]);
    assert_eq!(running.tres_per_node, "gres:gpu:h100:4");

    let held = job(&jobs, 13);
    assert!(held.is_pending() && held.is_held() && !held.ran());
    assert_eq!(held.required_nodes, ["node3"]);

    let requeued = job(&jobs, 14);
    assert!(requeued.is_pending() && !requeued.is_held());
    assert_eq!((requeued.reason.as_str(), requeued.restarts), ("BeginTime", 1));

    let cancelled = job(&jobs, 15);
    assert_eq!(cancelled.state, "CANCELLED");
    assert_eq!(cancelled.exit_code(), None);
    assert_eq!(cancelled.exit_signal(), Some(15));

    // A job cancelled while pending never ran.
    let cancelled_pending = job(&jobs, 5);
    assert!(cancelled_pending.is_terminal() && !cancelled_pending.ran());

    let foreign = job(&jobs, 16);
    assert_eq!(
        (foreign.name.as_str(), foreign.account.as_str(), foreign.partition.as_str()),
        ("train-llm", "nlp", "unmanaged")
    );
    assert_eq!(foreign.user, "root");
    assert!(foreign.start_time > 0);
}

#[test]
fn squeue_format_lines_of_every_state() {
    let jobs = parse_squeue_format(&data("squeue-format.txt"));
    assert_eq!(jobs.len(), 11);
    let running = job(&jobs, 15420);
    assert_eq!((running.name.as_str(), running.comment.as_str()), ("allot-77.1", "allot:77.1"));
    assert!(running.is_running() && running.ran());
    assert_eq!(running.nodes, ["node1", "node2"]);
    assert_eq!((running.node_count, running.tres_per_node.as_str()), (2, "gres:gpu:h100:4"));
    assert_eq!((running.account.as_str(), running.user.as_str()), ("vision", "root"));
    assert_eq!((running.partition.as_str(), running.batch_host.as_str()), ("batch", "node1"));
    // A `|` in the comment shifts it into the name, as documented; the fields before stay.
    let held = job(&jobs, 15421);
    assert_eq!((held.comment.as_str(), held.name.as_str()), ("a", "comment|odd|name"));
    assert!(held.is_held() && !held.ran());
    assert_eq!(held.tres_per_node, "gres:gpu:h100:8");
    let requeue_held = job(&jobs, 15422);
    assert!(requeue_held.is_held() && requeue_held.restarts == 1, "{requeue_held:?}");
    let foreign_pending = job(&jobs, 15423);
    assert!(foreign_pending.is_pending() && !foreign_pending.is_held());
    assert_eq!((foreign_pending.comment.as_str(), foreign_pending.node_count), ("", 2));
    let failed = job(&jobs, 15416);
    assert_eq!((failed.state.as_str(), failed.exit_code()), ("FAILED", Some(3)));
    assert_eq!(failed.tres_per_node, "", "N/A is no request");
    let cancelled = job(&jobs, 15417);
    assert_eq!((cancelled.exit_code(), cancelled.exit_signal()), (None, Some(15)));
    let requeued_then_cancelled = job(&jobs, 15419);
    assert_eq!(requeued_then_cancelled.restarts, 1);
    assert_eq!(requeued_then_cancelled.tasks, 0, "NO_VAL is no count");
    let trapped_term = job(&jobs, 15418);
    assert_eq!(trapped_term.exit_code(), Some(143));
    assert_eq!(parse_squeue_format("garbage\n1|2|3\n"), Vec::new());
}

/// `--gpus` and `--gpus-per-task` are spread evenly over the job's nodes, or refused with the
/// fix when they do not split into the same whole number per node.
#[test]
fn gpu_requests_per_node_per_job_and_per_task() {
    let check = |tres: [&str; 3],
                 nodes: u64,
                 tasks: u64,
                 expected: Result<Option<(u64, Option<&str>)>, &str>| {
        let job = allot_backend_slurm::SqueueJob {
            tres_per_node: tres[0].to_string(),
            tres_per_job: tres[1].to_string(),
            tres_per_task: tres[2].to_string(),
            node_count: nodes,
            tasks,
            ..Default::default()
        };
        let got = job.gpu_request_per_node();
        // Typed exactly when the request names a type: a refused split still has one.
        let typed = tres.iter().any(|t| t.starts_with("gres:gpu:h100"));
        let asks_gpu = tres.iter().any(|t| t.starts_with("gres:gpu"));
        assert_eq!(job.asks_typed_gpus(), asks_gpu.then_some(typed), "{tres:?}");
        match expected {
            Ok(want) => {
                let got = got.unwrap_or_else(|e| panic!("{tres:?} on {nodes}: {e}"));
                let got = got.map(|g| (g.count, g.gres_type));
                assert_eq!(
                    got,
                    want.map(|(n, t)| (n, t.map(str::to_string))),
                    "{tres:?} on {nodes}"
                );
            }
            Err(part) => {
                let why = got.err().unwrap_or_else(|| panic!("{tres:?} on {nodes} refused"));
                assert!(why.contains(part) && why.contains("--gpus-per-node"), "{why}");
            }
        }
    };
    check(["gres:gpu:h100:4", "", ""], 2, 2, Ok(Some((4, Some("h100")))));
    check(["", "gres:gpu:4", ""], 1, 1, Ok(Some((4, None))));
    check(["", "gres:gpu:h100:4", ""], 2, 1, Ok(Some((2, Some("h100")))));
    check(["", "gres:gpu:3", ""], 2, 1, Err("--gpus=3 (3 GPUs) on 2 nodes"));
    check(["", "", "gres:gpu:1"], 1, 3, Ok(Some((3, None))));
    check(["", "", "gres:gpu:2"], 2, 4, Ok(Some((4, None))));
    check(["", "", "gres:gpu:1"], 2, 3, Err("3 tasks on 2 nodes"));
    check(["", "", ""], 1, 1, Ok(None));
    check(["gres:shard:2", "", ""], 1, 1, Ok(None));
    // Recorded: `--gpus=h100:4 -N 2` and `-n 3 --gpus-per-task=1`.
    let jobs = parse_squeue_format(&data("squeue-format.txt"));
    let per_job = jobs.iter().find(|j| j.name == "per-job").expect("per-job recorded");
    let per_job = per_job.gpu_request_per_node().expect("splits").expect("gpus");
    assert_eq!((per_job.count, per_job.gres_type.as_deref()), (2, Some("h100")));
    let per_task = jobs.iter().find(|j| j.name == "per-task").expect("per-task recorded");
    assert_eq!(per_task.tasks, 3, "{per_task:?}");
    let per_task = per_task.gpu_request_per_node().expect("splits").expect("gpus");
    assert_eq!(per_task.count, 3);
}

#[test]
fn job_details_give_the_gpus_bound_on_each_node() {
    let details = parse_job_details(&data("scontrol-job-details.txt")).expect("a job");
    assert_eq!(details.state, "RUNNING");
    let jobs = parse_squeue_format(&data("squeue-format.txt"));
    let running = jobs.iter().find(|j| j.name == "allot-77.1").expect("the two-node job");
    assert_eq!(details.job_id, running.job_id);
    let per_node: Vec<(&str, u64, usize)> = details
        .gpus_per_node
        .iter()
        .map(|(node, g)| (node.as_str(), g.count, g.indices.len()))
        .collect();
    assert_eq!(per_node, [("node1", 4, 4), ("node2", 4, 4)]);
    let made_up = "JobId=5 JobState=RUNNING NodeList=n[1-3] Nodes=n[1-2] CPU_IDs=0 Mem=0 \
                   GRES=gpu:a100:1(IDX:3) Nodes=n3 CPU_IDs=0 Mem=0 GRES= JOB_GRES=gpu:2";
    let made_up = parse_job_details(made_up).expect("a job");
    let indices: Vec<(&str, Vec<u32>)> =
        made_up.gpus_per_node.iter().map(|(n, g)| (n.as_str(), g.indices.clone())).collect();
    assert_eq!(indices, [("n1", vec![3]), ("n2", vec![3]), ("n3", vec![])]);
    assert_eq!(parse_job_details("slurm_load_jobs error: Invalid job id specified"), None);
    assert_eq!(parse_job_details(""), None);
}

#[test]
fn jobcomp_lines_of_every_state() {
    let records = parse_jobcomp(&data("jobcomp.log")).expect("recorded jobcomp log parses");
    assert_eq!(records.len(), 11);
    let two_nodes = records.iter().find(|r| r.job_id == 15037).expect("job 15037");
    assert_eq!(
        (two_nodes.name.as_str(), two_nodes.state.as_str(), two_nodes.account.as_str()),
        ("allot-77.1", "CANCELLED", "vision")
    );
    assert_eq!((two_nodes.node_list.as_str(), two_nodes.node_count), ("node[1-2]", 2));
    assert_eq!(two_nodes.elapsed_seconds(), 5);
    assert_eq!(two_nodes.tres_gpus(), None, "no GPUs in Tres without slurmdbd");
    // A requeued job has one line per run: the requeued run says PENDING.
    let runs: Vec<&str> =
        records.iter().filter(|r| r.job_id == 15036).map(|r| r.state.as_str()).collect();
    assert_eq!(runs, ["PENDING", "CANCELLED"]);
    let odd = records.iter().find(|r| r.job_id == 15038).expect("job 15038");
    assert_eq!((odd.name.as_str(), odd.elapsed_seconds()), ("odd|name", 0));
}

#[test]
fn jobcomp_gpu_hours_per_account() {
    // Tres without GPUs: the caller's counts (2 GPUs per node of allot's jobs here).
    let gpus = |r: &JobcompRecord| r.name.starts_with("allot-").then_some(2 * r.node_count);
    let hours = jobcomp_gpu_hours(&data("jobcomp.log"), gpus).expect("parses");
    // vision: 77.1 ran 5 s on 2 nodes (4 GPUs), 5.1's first run 2 s, 6.1's first run 1 s.
    let vision = (5.0 * 4.0 + 2.0 * 2.0 + 1.0 * 2.0) / 3600.0;
    assert!((hours.by_account["vision"] - vision).abs() < 1e-12, "{hours:?}");
    // research: 3.1 ran 2 s; 1.1 and 2.1 ended within their start second.
    assert!((hours.by_account["research"] - 4.0 / 3600.0).abs() < 1e-12, "{hours:?}");
    assert_eq!(hours.unknown_gpus, [15035], "the foreign job: no count given");
    // GPUs in Tres (a site with slurmdbd) win over the caller's.
    let line = "JobId=7 UserId=a(1) Name=x y JobState=COMPLETED StartTime=2026-02-28T23:00:00 \
                EndTime=2026-03-01T01:00:00 NodeCnt=1 WorkDir=/a b Tres=cpu=1,gres/gpu=4 Account=nlp";
    let hours = jobcomp_gpu_hours(line, |_| Some(1)).expect("parses");
    assert_eq!(hours.by_account["nlp"], 8.0, "2 h across midnight × 4 GPUs");
    let record = &parse_jobcomp(line).expect("parses")[0];
    assert_eq!((record.name.as_str(), record.work_dir.as_str()), ("x y", "/a b"));
    // Errors name the line.
    let err = jobcomp_gpu_hours("\nJobId=x StartTime=a", |_| None).expect_err("bad JobId");
    assert!(err.to_string().starts_with("jobcomp log line 2: no numeric JobId"), "{err}");
    let err = parse_jobcomp("JobId=3 StartTime=2026-13-01T00:00:00").expect_err("bad month");
    assert!(err.to_string().contains("line 1: job 3: StartTime"), "{err}");
}

#[test]
fn node_state_words_for_the_operator() {
    let nodes = parse_sinfo(&data("sinfo-drained-down.json")).expect("recorded sinfo parses");
    let words = |name: &str| {
        node_state_words(nodes.iter().find(|n| n.name == name).expect("node in payload"))
    };
    // Drained while jobs still run there.
    assert_eq!(words("node3"), "DRAINING: allot test: drained");
    assert!(words("node4").starts_with("DOWN"), "{}", words("node4"));
    assert!(words("node4").ends_with(": allot test: down"), "{}", words("node4"));
    assert_eq!(words("node1"), "MIXED");
}

#[test]
fn squeue_after_a_node_went_down_shows_the_requeued_job() {
    let jobs = parse_squeue(&data("squeue-after-down.json")).expect("recorded squeue parses");
    let foreign = job(&jobs, 16);
    assert_eq!((foreign.state.as_str(), foreign.restarts), ("PENDING", 1));
    assert!(foreign.nodes.is_empty());
}

#[test]
fn sinfo_nodes_with_typed_gpus() {
    let nodes = parse_sinfo(&data("sinfo-idle-mixed.json")).expect("recorded sinfo parses");
    assert_eq!(nodes.len(), 4);
    for n in &nodes {
        assert!(n.usable(), "{n:?}");
        assert_eq!(n.cpus, 8);
        assert_eq!(n.real_memory_mib, 4000);
        let gpus = n.gpus();
        assert_eq!(gpus.len(), 1);
        assert_eq!((gpus[0].gres_type.as_deref(), gpus[0].count), (Some("h100"), 8));
    }
    let node1 = &nodes[0];
    assert_eq!(node1.state, "mixed");
    assert_eq!(node1.gres_used[0].count, 4);
    assert_eq!(node1.gres_used[0].indices, [3, 4, 5, 6]);
    let node4 = &nodes[3];
    assert_eq!(node4.partitions, ["batch", "unmanaged"]);
}

#[test]
fn sinfo_drained_and_down_nodes_are_not_usable() {
    let nodes = parse_sinfo(&data("sinfo-drained-down.json")).expect("recorded sinfo parses");
    let by = |name: &str| nodes.iter().find(|n| n.name == name).expect("node in payload");
    assert!(by("node1").usable() && by("node2").usable());
    let drained = by("node3");
    assert_eq!(
        (drained.state.as_str(), drained.state_flags.as_slice()),
        ("mixed", &["DRAIN".to_string()][..])
    );
    assert_eq!(drained.reason, "allot test: drained");
    assert!(!drained.usable());
    let down = by("node4");
    assert_eq!(down.state, "down");
    assert_eq!(down.reason, "allot test: down");
    assert!(!down.usable());
}

#[test]
fn scontrol_partitions() {
    let parts = parse_partitions(&data("scontrol-partitions.txt"));
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].name, "batch");
    assert!(parts[0].default);
    assert_eq!(parts[0].state, "UP");
    assert_eq!(parts[0].nodes, ["node1", "node2", "node3", "node4"]);
    assert_eq!(
        (parts[1].name.as_str(), parts[1].nodes.as_slice()),
        ("unmanaged", &["node4".to_string()][..])
    );
}

#[test]
fn host_lists() {
    assert_eq!(
        expand_hostlist("node[1-3,7]").expect("valid"),
        ["node1", "node2", "node3", "node7"]
    );
    assert_eq!(
        expand_hostlist("gpu-a[01-02],login").expect("valid"),
        ["gpu-a01", "gpu-a02", "login"]
    );
    assert_eq!(expand_hostlist("").expect("empty is valid"), Vec::<String>::new());
    assert!(expand_hostlist("node[3-1]").is_err());
    assert!(expand_hostlist("node[1-999999999]").is_err(), "huge lists are refused");
    assert!(expand_hostlist("node[1-").is_err());
}

#[test]
fn gres_strings() {
    assert_eq!(
        parse_gres_list("gpu:h100:2(IDX:0,3),shard:4"),
        [
            Gres {
                name: "gpu".into(),
                gres_type: Some("h100".into()),
                count: 2,
                indices: vec![0, 3]
            },
            Gres { name: "shard".into(), gres_type: None, count: 4, indices: vec![] },
        ]
    );
    assert_eq!(parse_gres_list("gpu:8")[0].count, 8);
    assert_eq!(parse_gres_list("gres:gpu:a100:1")[0].gres_type.as_deref(), Some("a100"));
    assert!(parse_gres_list("gpu:h100:0(IDX:N/A)")[0].indices.is_empty());
    assert!(parse_gres_list("(null)").is_empty());
    assert!(parse_gres_list("N/A").is_empty());
}

#[test]
fn wait_statuses_and_sbatch_output() {
    assert_eq!(exit_code_of(0), Some(0));
    assert_eq!(exit_code_of(768), Some(3));
    assert_eq!(exit_code_of(15), None);
    assert_eq!(exit_code_of(9 | 0x80), None);
    assert_eq!(parse_sbatch_job_id("123\n"), Some(123));
    assert_eq!(parse_sbatch_job_id("45;cluster\n"), Some(45));
    assert_eq!(parse_sbatch_job_id("sbatch: error"), None);
}

#[test]
fn errors_and_wrong_documents_are_reported() {
    assert!(parse_squeue("not json").is_err());
    assert!(parse_squeue("{}").is_err());
    let e =
        parse_squeue(r#"{"errors":[{"error":"Unable to contact slurm controller"}],"jobs":[]}"#)
            .expect_err("errors[] is an error");
    assert!(e.0.contains("Unable to contact"), "{e}");
    assert!(parse_sinfo(r#"{"jobs":[]}"#).is_err());
    // Jobs with odd fields still parse; a job without an id is skipped.
    let jobs = parse_squeue(r#"{"jobs":[{"job_id":7,"nodes":42,"gres_detail":"x"},{"name":"x"}]}"#)
        .expect("lenient");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].job_id, 7);
}

proptest! {
    #[test]
    fn no_parser_panics_on_any_text(text in ".{0,200}") {
        let _ = parse_squeue(&text);
        let _ = parse_sinfo(&text);
        let _ = parse_partitions(&text);
        let _ = expand_hostlist(&text);
        let _ = parse_gres_list(&text);
        let _ = parse_sbatch_job_id(&text);
        let _ = parse_squeue_format(&text);
        let _ = parse_job_details(&text);
        let _ = jobcomp_gpu_hours(&text, |_| Some(1));
    }

    #[test]
    fn no_parser_panics_on_slurm_like_text(
        text in "[a-z0-9:,()\\[\\]\\-=/ A-Z_]{0,80}"
    ) {
        let _ = expand_hostlist(&text);
        let _ = parse_gres_list(&text);
        let _ = parse_partitions(&text);
        let _ = parse_squeue_format(&text);
        let _ = parse_job_details(&format!("JobId=1 {text}"));
        for tres in ["tres_per_node", "tres_per_job", "tres_per_task"] {
            let line = format!(r#"{{"jobs":[{{"job_id":1,"node_count":2,"tasks":3,"{tres}":{text:?}}}]}}"#);
            for job in parse_squeue(&line).unwrap_or_default() {
                let _ = job.gpu_request_per_node();
            }
        }
        let doc = format!(
            r#"{{"jobs":[{{"job_id":1,"nodes":{n:?},"gres_detail":[{n:?}],"tres_per_node":{n:?}}}],"nodes":[{{"name":"a","gres":{n:?},"gres_used":{n:?}}}]}}"#,
            n = text
        );
        let _ = parse_squeue(&doc);
        let _ = parse_sinfo(&doc);
    }

    #[test]
    fn mutated_recorded_payloads_never_panic(cut in 0usize..33_000, byte in any::<u8>()) {
        let mut text = data("squeue-states.json").into_bytes();
        if cut < text.len() {
            text[cut] = byte;
        }
        let text = String::from_utf8_lossy(&text);
        let _ = parse_squeue(&text);
        if let Some(prefix) = text.get(..cut) {
            let _ = parse_squeue(prefix);
        }
    }
}

/// `sacct` of the test cluster (slurmdbd with `AccountingStorageTRES=gres/gpu`), recorded with
/// `SLURM_TIME_FORMAT=%s sacct -a -X -D -P -n --format=SACCT_FORMAT`: a requeued job's two runs,
/// an array job, a job cancelled before it started, a job whose account did not exist (Slurm
/// put it in the user's default, `root`), and a name with a `|`.
#[test]
fn sacct_runs_with_slurms_gpu_counts() {
    use allot_backend_slurm::{SACCT_FORMAT, parse_sacct, sacct_args};
    let records = parse_sacct(&data("sacct.txt")).expect("recorded sacct output parses");
    let ids: Vec<u64> = records.iter().map(|r| r.job_id).collect();
    assert_eq!(ids, [85, 86, 146, 146, 149, 110], "array tasks (147_1) are left out");
    let requeued: Vec<(&str, u64, Option<u64>)> = records
        .iter()
        .filter(|r| r.job_id == 146)
        .map(|r| (r.state.as_str(), r.elapsed_seconds(), r.tres_gpus()))
        .collect();
    assert_eq!(requeued, [("REQUEUED", 2, Some(2)), ("CANCELLED", 1, Some(2))]);
    assert_eq!(records[2].name, "req|uned job");
    assert_eq!((records[2].account.as_str(), records[2].start), ("nlp", Some(1_796_407_730)));
    assert_eq!((records[1].account.as_str(), records[1].tres_gpus()), ("root", None));
    assert_eq!((records[4].node_list.as_str(), records[4].elapsed_seconds()), ("None assigned", 0));
    assert_eq!(records[5].exit_code, "1:0");
    // Seconds since the epoch, or nothing: a local time is refused with the fix.
    let err = parse_sacct("7|u|COMPLETED|b|a|n1|1|/|2026-12-04T18:00:00|Unknown|cpu=1|0:0|x")
        .expect_err("a local time");
    assert!(err.to_string().contains("SLURM_TIME_FORMAT=%s"), "{err}");
    let err = parse_sacct("7|u|COMPLETED").expect_err("too few fields");
    assert!(err.to_string().contains("line 1: 3 field(s)"), "{err}");
    let unknown = parse_sacct("7|u|PENDING|b|a|None assigned|1|/|Unknown|Unknown||0:0|x")
        .expect("Unknown times");
    assert_eq!((unknown[0].start, unknown[0].end), (None, None));
    let args = sacct_args(90);
    assert!(args.contains(&"--starttime=now-90seconds".to_string()), "{args:?}");
    assert!(args.contains(&format!("--format={SACCT_FORMAT}")), "{args:?}");
}
