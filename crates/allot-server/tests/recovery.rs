//! A restart replays the log: every acknowledged workload comes back exactly once, in the same
//! state, and the backend's live runs are re-adopted, not started again.

mod common;

use allot_backend::FakeBackend;
use allot_server::{Parts, start};
use allot_store::SqliteStore;
use allot_store::Store;
use axum::http::StatusCode;
use common::{CLUSTER, POLICY, TestDaemon};
use serde_json::Value;

fn parts(dir: &std::path::Path, backend: FakeBackend) -> Parts {
    let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("cluster");
    let policy = allot_config::parse_policy("policy.yaml", POLICY).expect("policy");
    Parts {
        store: Box::new(SqliteStore::open(dir).expect("store")),
        token_store: Box::new(SqliteStore::open_unlocked(dir).expect("token store")),
        backend: Box::new(backend),
        declared: nodes,
        inventory_source: "cluster.yaml".into(),
        policy,
        policy_source: "policy.yaml".into(),
        policy_text: POLICY.into(),
        workload_dir: dir.to_path_buf(),
        decide_interval_ms: 0,
        telemetry_round_ms: Some(100),
        cluster_watch_ms: Some(50),
        snapshot_every: None,
        telemetry_sources: Vec::new(),
        policy_webhook: None,
    }
}

/// A first start on a fresh data directory for the test `name` (with `snapshot_every`, if
/// given): the directory, the fake cluster's control, the daemon and its admin token.
fn first_start(
    name: &str,
    snapshot_every: Option<u64>,
) -> (std::path::PathBuf, allot_backend::FakeControl, TestDaemon, String) {
    let dir = std::env::temp_dir().join(format!("allot-recovery-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nodes = allot_config::parse_cluster("cluster.yaml", CLUSTER).expect("cluster");
    let (backend, control) = FakeBackend::new(nodes);
    let mut first = parts(&dir, backend);
    first.snapshot_every = snapshot_every;
    let started = start(first).expect("first start");
    let admin = started.admin_token.clone().expect("admin token").token;
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    (dir, control, d, admin)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_brings_every_workload_back_once_and_readopts_running_ones() {
    let (dir, control, mut d, admin) = first_start("basic", None);
    let mut ids = Vec::new();
    for i in 0..40 {
        let project = ["vision", "nlp", "research"][i % 3];
        let (status, v) = d
            .call(
                "POST",
                "/api/v1/workloads",
                Some(&admin),
                Some(&common::submit_body(project, 1 + (i % 4) as u32)),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
    }
    d.wait_state(ids[0], "running").await;
    // Let the loop settle, then remember what the API says.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, before) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let launches_before = control.runs().len();
    d.stop();

    let started = start(parts(&dir, control.backend())).expect("second start");
    assert!(started.admin_token.is_none(), "tokens survive a restart");
    assert!(started.replayed > 40, "replayed {}", started.replayed);
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, after) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let key = |v: &Value| -> Vec<(u64, String, u64)> {
        v["workloads"]
            .as_array()
            .expect("list")
            .iter()
            .map(|w| {
                (
                    w["id"].as_u64().unwrap_or(0),
                    w["state"].as_str().unwrap_or("").to_string(),
                    w["attempt"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    assert_eq!(key(&before), key(&after), "same workloads, states and attempts after the restart");
    assert_eq!(control.runs().len(), launches_before, "nothing was launched twice");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restart_with_an_edited_policy_applies_it_or_is_refused_by_name() {
    let (dir, control, mut d, admin) = first_start("policy", None);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let (status, v) = rt.block_on(d.call(
        "POST",
        "/api/v1/workloads",
        Some(&admin),
        Some(&common::submit_body("translation", 1)),
    ));
    assert_eq!(status, StatusCode::CREATED);
    let id = v["id"].as_u64().expect("id");
    rt.block_on(d.wait_state(id, "running"));
    d.stop();

    // A policy without the project of the running workload: refused, naming it.
    let mut without = parts(&dir, control.backend());
    let cut = POLICY.find("  - name: translation").expect("translation project");
    let end = POLICY[cut..].find("\n\n").map_or(POLICY.len(), |e| cut + e);
    without.policy_text = format!("{}{}", &POLICY[..cut], &POLICY[end..]);
    without.policy =
        allot_config::parse_policy("policy.yaml", &without.policy_text).expect("policy");
    let err = start(without).expect_err("live work in a removed project");
    assert!(err.to_string().contains(&format!("workload {id}")), "{err:#}");

    // An edited policy the live work fits: applied at start; the workload runs on.
    let mut edited = parts(&dir, control.backend());
    edited.policy_text = POLICY.replacen("half_life: 7d", "half_life: 1d", 1);
    edited.policy = allot_config::parse_policy("policy.yaml", &edited.policy_text).expect("policy");
    let expected = edited.policy_text.clone();
    let started = start(edited).expect("an edited policy the live work fits");
    let mut d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let (_, policy) = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None));
    assert_eq!(policy["text"], expected.as_str());
    let (_, w) = rt.block_on(d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&admin), None));
    assert_eq!(w["state"], "running", "{w}");
    d.stop();
    // Its replay switches policy at the same point: the original file now applies back.
    let started = start(parts(&dir, control.backend())).expect("the original policy again");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let (_, policy) = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None));
    assert_eq!(policy["text"], POLICY);
    assert_eq!(control.runs().len(), 1, "nothing was launched twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_from_a_snapshot_rebuilds_the_same_state_and_the_log_is_compacted() {
    let (dir, control, mut d, admin) = first_start("snap", Some(15));
    let mut ids = Vec::new();
    for i in 0..60 {
        let project = ["vision", "nlp", "research", "speech"][i % 4];
        let (status, v) = d
            .call(
                "POST",
                "/api/v1/workloads",
                Some(&admin),
                Some(&common::submit_body(project, 1 + (i % 3) as u32)),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_u64().expect("id"));
        if i % 10 == 9 {
            // Cancel some, so the snapshot holds ended, running and pending work.
            d.call("POST", &format!("/api/v1/workloads/{}/cancel", ids[i - 5]), Some(&admin), None)
                .await;
        }
    }
    d.wait_state(ids[0], "running").await;
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (_, before) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let (_, projects_before) = d.call("GET", "/api/v1/projects", Some(&admin), None).await;
    let (_, why_before) =
        d.call("GET", &format!("/api/v1/workloads/{}/why", ids[59]), Some(&admin), None).await;
    let launches_before = control.runs().len();
    d.stop();

    let store = SqliteStore::open_unlocked(&dir).expect("store");
    let snapshot = store.latest_snapshot().expect("read").expect("a snapshot was taken");
    let first_kept = store.read_after(0, 1).expect("read").first().map_or(0, |r| r.seq);
    assert!(first_kept > 1, "the log before the previous snapshot was dropped");
    let last = store.last_seq().expect("last seq");
    drop(store);

    let mut second = parts(&dir, control.backend());
    second.snapshot_every = Some(15);
    let started = start(second).expect("second start");
    assert_eq!(started.replayed, last - snapshot.seq, "only the log after the snapshot");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let (_, after) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let (_, projects_after) = d.call("GET", "/api/v1/projects", Some(&admin), None).await;
    let (_, why_after) =
        d.call("GET", &format!("/api/v1/workloads/{}/why", ids[59]), Some(&admin), None).await;
    assert_eq!(before, after, "same workloads after a restart from the snapshot");
    assert_eq!(projects_before, projects_after);
    assert_eq!(why_before, why_after);
    assert_eq!(control.runs().len(), launches_before, "nothing was launched twice");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn imported_work_survives_a_restart_once_and_stays_taken_over() {
    use allot_backend::{DeviceAssignment, ForeignWork, MemberLaunch, RunId, Vendor};
    let (dir, control, mut d, admin) = first_start("foreign", None);
    let work = |handle: &str, running: Vec<MemberLaunch>| ForeignWork {
        handle: handle.into(),
        name: format!("sbatch-{handle}"),
        project: "nlp".into(),
        user: "carla".into(),
        nodes: 1,
        gpus_per_node: 8,
        models: vec!["H100".into()],
        started_ms: None,
        running,
        refusal: None,
        intent: Default::default(),
    };
    let gpu = |index| DeviceAssignment { index, uuid: None, vendor: Vendor::Nvidia, shares: 1000 };
    // Running on an A100: adopted. Pending, 8 H100 beyond nlp's H100 reach: waits, held.
    control.add_foreign(ForeignWork {
        running: vec![MemberLaunch { node: "a100-0".into(), devices: vec![gpu(1)] }],
        gpus_per_node: 1,
        models: vec!["A100".into()],
        ..work("7", Vec::new())
    });
    control.add_foreign(work("8", Vec::new()));
    d.wait_state(1, "running").await;
    d.wait_state(2, "pending").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, before) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    d.stop();

    let started = start(parts(&dir, control.backend())).expect("second start");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    d.wait_state(1, "running").await;
    // Several watches later: still the same two workloads, the running one re-adopted, not
    // launched again, and the pending one still waiting (imported once).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, after) = d.call("GET", "/api/v1/workloads", Some(&admin), None).await;
    let states = |v: &Value| -> Vec<(u64, String)> {
        v["workloads"]
            .as_array()
            .expect("list")
            .iter()
            .map(|w| (w["id"].as_u64().unwrap_or(0), w["state"].as_str().unwrap_or("").into()))
            .collect()
    };
    assert_eq!(states(&before), states(&after));
    assert_eq!(states(&after), vec![(1, "running".into()), (2, "pending".into())]);
    assert_eq!(control.runs().len(), 1, "the adopted run was not launched again");
    // Watched to its end (a re-adopted run's exit code is unknown, as on the local backend).
    assert!(control.finish(RunId { workload: 1, attempt: 1 }, 0));
    d.wait_state(1, "failed").await;
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 18, defect 1: a `Sampled` entry (telemetry readings per workload) must be readable
/// again, or a daemon with telemetry cannot restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_that_logged_telemetry_restarts() {
    let (dir, control, mut d, admin) = first_start("sampled", None);
    let (status, v) = d
        .call("POST", "/api/v1/workloads", Some(&admin), Some(&common::submit_body("vision", 1)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_u64().expect("id");
    d.wait_state(id, "running").await;
    let run = control.runs().into_iter().find(|r| r.launch.run.workload == id).expect("its run");
    let member = &run.launch.members[0];
    let at = std::time::SystemTime::UNIX_EPOCH.elapsed().expect("clock").as_millis() as u64;
    let body = serde_json::json!({"samples": [{"hostname": member.node,
        "gpu_index": member.devices[0].index, "at_ms": at, "sm_active": 700}]});
    let (status, v) =
        d.call("POST", "/api/v1/telemetry", Some(&admin), Some(&body.to_string())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    // Telemetry rounds run every 100 ms here: wait until one logged the reading.
    let mut sampled = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let store = SqliteStore::open_unlocked(&dir).expect("store");
        sampled = store.read_after(0, 100_000).expect("read").iter().any(|r| r.kind == "sampled");
        if sampled {
            break;
        }
    }
    assert!(sampled, "a telemetry round logged the reading");
    let (_, before) = d.call("GET", &format!("/api/v1/workloads/{id}"), Some(&admin), None).await;
    d.stop();

    let started = start(parts(&dir, control.backend())).expect("a restart after telemetry");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let after = d.wait_state(id, "running").await;
    assert_eq!(before["attempt"], after["attempt"], "{before} vs {after}");
    assert_eq!(control.runs().len(), 1, "nothing was launched twice");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run's pods (Kubernetes) are not logged: after a restart the daemon asks the backend
/// again for the runs it re-adopts, so their telemetry is still found by pod.
#[tokio::test(flavor = "multi_thread")]
async fn pods_of_a_readopted_run_are_asked_again_after_a_restart() {
    let (dir, control, mut d, admin) = first_start("pods", None);
    let id = submit_vision_2(&d, &admin).await;
    d.wait_state(id, "running").await;
    let run = allot_backend::RunId { workload: id, attempt: 1 };
    let member = control.run(run).expect("its run").launch.members[0].clone();
    let indices: Vec<u32> = member.devices.iter().map(|g| g.index).collect();
    assert!(!indices.contains(&6) && !indices.contains(&7), "{indices:?}");
    let node = member.node;
    // The first daemon heard of no pods; the restarted one must ask.
    let train = allot_backend::PodRef { namespace: "vision".into(), name: "train".into() };
    control.set_member_pods(run, vec![train]);
    d.stop();

    let mut second = parts(&dir, control.backend());
    second.telemetry_sources = vec![common::pod_exporter(&node, "vision", "train", &[6, 7])];
    let started = start(second).expect("second start");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    d.wait_state(id, "running").await;
    common::wait_active_gpus(&d, "vision", "2.0").await;
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn submit_vision_2(d: &TestDaemon, admin: &str) -> u64 {
    let body = common::submit_body("vision", 2);
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(admin), Some(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

/// Issue 18, defect 4: a policy applied through the API stays in effect after a restart with
/// the same (unchanged) policy file; only a file edited since the last start is applied. The
/// policy history survives too, from the log alone and from a snapshot.
#[test]
fn an_applied_policy_survives_a_restart_with_the_unchanged_file() {
    applied_policy_across_restarts("applied", None);
    applied_policy_across_restarts("applied-snap", Some(1));
}

fn applied_policy_across_restarts(name: &str, snapshot_every: Option<u64>) {
    let (dir, control, mut d, admin) = first_start(name, snapshot_every);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let applied = POLICY.replacen("half_life: 7d", "half_life: 2d", 1);
    let uri = "/api/v1/policy?source=edited.yaml";
    let request = axum::http::Request::builder()
        .method("PUT")
        .uri(uri)
        .header("authorization", format!("Bearer {admin}"))
        .header("content-type", "application/yaml")
        .body(axum::body::Body::from(applied.clone()))
        .expect("request");
    let router = d.started.as_ref().expect("running").router.clone();
    let response = rt.block_on(tower::ServiceExt::oneshot(router, request)).expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    // A workload and its cycles, so that a snapshot is taken after the apply.
    let body = common::submit_body("vision", 1);
    let (status, v) = rt.block_on(d.call("POST", "/api/v1/workloads", Some(&admin), Some(&body)));
    assert_eq!(status, StatusCode::CREATED, "{v}");
    rt.block_on(d.wait_state(v["id"].as_u64().expect("id"), "running"));
    d.stop();
    let versions = |d: &TestDaemon| {
        let (_, v) = rt.block_on(d.call("GET", "/api/v1/policy/versions", Some(&admin), None));
        let list = v["versions"].as_array().cloned().unwrap_or_default();
        let rows: Vec<(u64, String, Option<String>)> = list
            .iter()
            .map(|x| {
                let source = x["source"].as_str().unwrap_or_default().to_string();
                (x["version"].as_u64().unwrap_or(0), source, x["by"].as_str().map(str::to_string))
            })
            .collect();
        (rows, v["active"].as_u64())
    };
    let two = vec![
        (1, "policy.yaml".to_string(), None),
        (2, "edited.yaml".to_string(), Some("admin".to_string())),
    ];

    for _ in 0..2 {
        let mut again = parts(&dir, control.backend());
        again.snapshot_every = snapshot_every;
        let started = start(again).expect("restart, same file");
        let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
        let (_, policy) = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None));
        assert_eq!(policy["text"], applied.as_str(), "the applied policy is still in effect");
        assert_eq!(policy["source"], "edited.yaml");
        assert_eq!(versions(&d), (two.clone(), Some(2)), "{name}: the history survives");
        d.stop_keeping_dir();
    }
    if snapshot_every.is_some() {
        let store = SqliteStore::open(&dir).expect("store");
        assert!(store.latest_snapshot().expect("read").is_some(), "{name}: a snapshot was taken");
    }
    // The file edited since the last start: that edit is applied, as a version of its own.
    let mut edited = parts(&dir, control.backend());
    edited.policy_text = POLICY.replacen("half_life: 7d", "half_life: 1d", 1);
    edited.policy = allot_config::parse_policy("policy.yaml", &edited.policy_text).expect("policy");
    let expected = edited.policy_text.clone();
    let started = start(edited).expect("an edited file");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let (_, policy) = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None));
    assert_eq!(policy["text"], expected.as_str());
    let mut three = two;
    three.push((3, "policy.yaml".to_string(), None));
    assert_eq!(versions(&d), (three, Some(3)), "{name}");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The node the workload's run is on.
fn node_of(control: &allot_backend::FakeControl, id: u64) -> String {
    let run = control.runs().into_iter().rfind(|r| r.launch.run.workload == id).expect("its run");
    run.launch.members[0].node.clone()
}

async fn nodes_view(d: &TestDaemon) -> Value {
    d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await.1
}

fn find_node<'a>(nodes: &'a Value, name: &str) -> Option<&'a Value> {
    nodes["nodes"].as_array()?.iter().find(|n| n["name"] == name)
}

/// Issue 18, defect 2: the inventory changing (labels, as a node's Slurm state; a node added,
/// one removed; devices changed under live work) is an input, never a reason to refuse a
/// start. Live work keeps its devices; the busy node keeps its old shape until its work ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_inventory_is_taken_at_restart_and_while_running() {
    let (dir, control, mut d, admin) = first_start("inventory", None);
    let body = serde_json::json!({"project": "vision", "gpus": 8, "kind": "training",
        "gpu_models": ["H100"], "command": ["sleep", "30"]});
    let (status, v) =
        d.call("POST", "/api/v1/workloads", Some(&admin), Some(&body.to_string())).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_u64().expect("id");
    d.wait_state(id, "running").await;
    let busy = node_of(&control, id);
    d.stop();

    // While it was down: every node relabelled (as Slurm's state label idle → mixed), a new
    // H100 node, v100-0 gone, and the busy node now reports 4 GPUs (4 drained).
    let nodes = control.nodes();
    let mut changed = nodes.clone();
    for n in &mut changed {
        n.labels.insert("state".into(), "mixed".into());
    }
    changed.retain(|n| n.name != "v100-0");
    let mut added = changed.iter().find(|n| n.name == busy).expect("busy node").clone();
    added.name = "h100-9".into();
    changed.push(added);
    if let Some(n) = changed.iter_mut().find(|n| n.name == busy) {
        n.devices.truncate(4);
    }
    control.set_nodes(changed.clone());

    let started = start(parts(&dir, control.backend())).expect("a start with a changed inventory");
    let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
    let w = d.wait_state(id, "running").await;
    assert_eq!(w["attempt"], 1, "{w}");
    assert_eq!(control.runs().len(), 1, "nothing was launched twice");
    let view = nodes_view(&d).await;
    assert!(find_node(&view, "h100-9").is_some(), "the added node: {view}");
    assert!(find_node(&view, "v100-0").is_none(), "the removed idle node: {view}");
    let kept = find_node(&view, &busy).expect("the busy node stays while its work runs");
    assert_eq!(kept["devices"].as_array().map(Vec::len), Some(8), "old shape: {kept}");
    assert!(
        kept["unusable"].as_str().is_some_and(|r| r.contains("devices changed")),
        "no new work there: {kept}"
    );

    // Its work ends (re-adopted, so its exit status is unknown): the new shape is taken at
    // the next cycle.
    assert!(control.finish(allot_backend::RunId { workload: id, attempt: 1 }, 0));
    d.wait_state(id, "failed").await;
    let mut taken = false;
    for _ in 0..200 {
        let view = nodes_view(&d).await;
        let n = find_node(&view, &busy).expect("node");
        if n["devices"].as_array().map(Vec::len) == Some(4) && n["unusable"].is_null() {
            taken = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(taken, "the busy node took its new shape once its work ended");

    // While running: a node added is seen by the cluster watch and takes work.
    let mut more = changed.clone();
    let mut extra = more.iter().find(|n| n.name == "h100-9").expect("h100-9").clone();
    extra.name = "h100-10".into();
    more.push(extra);
    control.set_nodes(more);
    let mut seen = false;
    for _ in 0..200 {
        if find_node(&nodes_view(&d).await, "h100-10").is_some() {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(seen, "a node added while the daemon runs is taken");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 18, defect 3: a backend that does not answer fails nothing. A launch it cannot take
/// queues again with a reason that says so; `/metrics`, the nodes view and the dashboard say
/// the backend is unreachable; a stop asked meanwhile is delivered once it answers; then the
/// queued work starts.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_backend_fails_nothing_and_says_so() {
    let d = TestDaemon::new();
    let (status, v) = d
        .call("POST", "/api/v1/workloads", Some(&d.admin), Some(&common::submit_body("vision", 1)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let running = v["id"].as_u64().expect("id");
    d.wait_state(running, "running").await;
    d.control.set_unreachable(Some("Unable to contact slurm controller (connect failure)"));
    // Seen by the next poll.
    let mut down = false;
    for _ in 0..200 {
        if nodes_view(&d).await["backend"]["reachable"] == false {
            down = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(down, "the nodes view says the backend is unreachable");
    let (status, v) = d
        .call("POST", "/api/v1/workloads", Some(&d.admin), Some(&common::submit_body("vision", 1)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let queued = v["id"].as_u64().expect("id");
    let (status, _) =
        d.call("POST", &format!("/api/v1/workloads/{running}/cancel"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let w = d.wait_state(queued, "pending").await;
    let why =
        d.call("GET", &format!("/api/v1/workloads/{queued}/why"), Some(&d.admin), None).await.1;
    assert!(
        why.to_string().contains("unreachable"),
        "its reason says the backend is unreachable: {w} {why}"
    );
    let (_, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
    assert!(metrics.as_str().unwrap_or("").contains("allot_backend_up 0"), "{metrics}");
    let (_, page) = d.call("GET", "/fleet", Some(&d.admin), None).await;
    assert!(
        page.as_str().unwrap_or("").contains("backend is unreachable since"),
        "dashboard banner"
    );
    let run = allot_backend::RunId { workload: running, attempt: 1 };
    assert!(d.control.run(run).is_some_and(|r| r.is_running()), "nothing was stopped meanwhile");

    d.control.set_unreachable(None);
    d.wait_state(running, "cancelled").await;
    d.wait_state(queued, "running").await;
    let (_, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
    assert!(metrics.as_str().unwrap_or("").contains("allot_backend_up 1"), "{metrics}");
    let states: Vec<String> = d.control.runs().iter().map(|r| format!("{:?}", r.state)).collect();
    assert!(!states.iter().any(|s| s.contains("LaunchFailed")), "{states:?}");
}

/// A policy in shadow keeps running across restarts, its figures rebuilt the same from the
/// log alone and from a snapshot.
#[test]
fn a_shadow_survives_a_restart_with_its_figures() {
    for (name, snapshot_every) in [("shadow", None), ("shadow-snap", Some(1))] {
        let (dir, control, mut d, admin) = first_start(name, snapshot_every);
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        let submit = |d: &TestDaemon, gpus: u32| {
            let body = common::submit_body("vision", gpus);
            let (status, v) =
                rt.block_on(d.call("POST", "/api/v1/workloads", Some(&admin), Some(&body)));
            assert_eq!(status, StatusCode::CREATED, "{v}");
            v["id"].as_u64().expect("id")
        };
        for gpus in [8, 4] {
            let id = submit(&d, gpus);
            rt.block_on(d.wait_state(id, "running"));
        }
        let generous = POLICY.replacen(
            "{model: H100, guaranteed: 8, borrow_limit: 8, lend_limit: 4}",
            "{model: H100, guaranteed: 10, borrow_limit: 8, lend_limit: 4}",
            1,
        );
        let (status, v) = rt.block_on(d.call(
            "PUT",
            "/api/v1/policy/shadow?source=c.yaml",
            Some(&admin),
            Some(&generous),
        ));
        assert_eq!(status, StatusCode::OK, "{v}");
        submit(&d, 2);
        let sooner = |d: &TestDaemon| {
            let (status, v) =
                rt.block_on(d.call("GET", "/api/v1/policy/shadow", Some(&admin), None));
            assert_eq!(status, StatusCode::OK, "{name}: {v}");
            let rows = v["projects"].as_array().cloned().unwrap_or_default();
            let vision = rows.iter().find(|r| r["project"] == "vision").cloned();
            (vision.map(|r| r["sooner"].clone()), v["source"].clone())
        };
        for _ in 0..500 {
            if sooner(&d).0 == Some(serde_json::json!(1)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(sooner(&d), (Some(serde_json::json!(1)), serde_json::json!("c.yaml")), "{name}");
        d.stop();
        let mut again = parts(&dir, control.backend());
        again.snapshot_every = snapshot_every;
        let started = start(again).expect("restart");
        let d = TestDaemon::wrap(started, control.clone(), admin.clone(), dir.clone());
        assert_eq!(
            sooner(&d),
            (Some(serde_json::json!(1)), serde_json::json!("c.yaml")),
            "{name}: after a restart"
        );
        drop(d);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A scoped rollout survives restarts (log alone, and from a snapshot) with its scope, plan
/// and the outcomes its conditions measure, and rolls itself back after one when its
/// condition trips on work of its scope.
#[test]
fn a_rollout_survives_a_restart_and_rolls_itself_back_after_it() {
    rollout_across_a_restart("rollout", None);
    rollout_across_a_restart("rollout-snap", Some(1));
}

fn rollout_across_a_restart(name: &str, snapshot_every: Option<u64>) {
    use allot_backend::RunId;
    let (dir, control, d, admin) = first_start(name, snapshot_every);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let submit = |d: &TestDaemon, project: &str| {
        let body = common::submit_body(project, 1);
        let (status, v) =
            rt.block_on(d.call("POST", "/api/v1/workloads", Some(&admin), Some(&body)));
        assert_eq!(status, StatusCode::CREATED, "{v}");
        let id = v["id"].as_u64().expect("id");
        rt.block_on(d.wait_state(id, "running"));
        id
    };
    // The baseline: three nlp workloads that succeed.
    for _ in 0..3 {
        let id = submit(&d, "nlp");
        assert!(control.finish(RunId { workload: id, attempt: 1 }, 0));
        rt.block_on(d.wait_state(id, "succeeded"));
    }
    let candidate = POLICY.replacen("    weight: 1.5\n", "    weight: 3\n", 1);
    assert_ne!(candidate, POLICY);
    let uri = "/api/v1/policy?source=nlp-weight.yaml&scope=project%3Dnlp\
               &rollback_if=failure_rate%3E0.5&min_sample=2&baseline=1d";
    let (status, v) = rt.block_on(d.call("PUT", uri, Some(&admin), Some(&candidate)));
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], 2, "{v}");
    assert_eq!(v["rollout"]["scope"], "project=nlp", "{v}");
    assert_eq!(v["rollout"]["carried"], serde_json::json!(["project nlp"]), "{v}");
    assert_eq!(v["rollout"]["conditions"][0]["baseline_samples"], 3, "{v}");
    let text = v["text"].as_str().expect("text").to_string();
    let scoped = allot_config::parse_policy("v2.yaml", &text).expect("the version parses");
    let weight = |p: &allot_core::PolicySpec, n: &str| {
        p.projects.iter().find(|x| x.name == n).map(|x| x.weight_milli)
    };
    assert_eq!((weight(&scoped, "nlp"), weight(&scoped, "vision")), (Some(3000), Some(2000)));
    // A second rollout while this one is in effect is refused.
    let (status, v) = rt.block_on(d.call("PUT", uri, Some(&admin), Some(&candidate)));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().unwrap_or("").contains("rolls out"), "{v}");
    // One failure in scope before the restart: 1 of 2 observations, not judged yet.
    let failed = submit(&d, "nlp");
    assert!(control.finish(RunId { workload: failed, attempt: 1 }, 1));
    rt.block_on(d.wait_state(failed, "failed"));
    d.stop_keeping_dir();

    let (hook_url, hook) = webhook_receiver();
    let mut again = parts(&dir, control.backend());
    again.snapshot_every = snapshot_every;
    again.policy_webhook = Some(hook_url);
    let d = TestDaemon::wrap(start(again).expect("restart"), control.clone(), admin.clone(), dir);
    let (_, policy) = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None));
    assert_eq!(
        (policy["version"].as_u64(), policy["text"].as_str()),
        (Some(2), Some(text.as_str()))
    );
    let condition = &policy["rollout"]["conditions"][0];
    assert_eq!(
        (condition["samples"].as_u64(), condition["baseline_samples"].as_u64()),
        (Some(1), Some(3)),
        "{policy}"
    );
    assert!(policy["rollout"]["ended"].is_null(), "{name}: still in effect: {policy}");
    // Work of another project failing does not count; a second nlp failure trips it.
    let other = submit(&d, "vision");
    assert!(control.finish(RunId { workload: other, attempt: 1 }, 1));
    let second = submit(&d, "nlp");
    assert!(control.finish(RunId { workload: second, attempt: 1 }, 1));
    // Conditions are judged every 5 s: 200 tries of 100 ms are 20 s.
    let mut policy = Value::Null;
    for _ in 0..200 {
        policy = rt.block_on(d.call("GET", "/api/v1/policy", Some(&admin), None)).1;
        if policy["version"] == 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(policy["version"], 3, "{name}: rolled back by itself: {policy}");
    assert_eq!(policy["text"], POLICY, "version 1's text is back");
    let ended = policy["rollout"]["ended"].as_str().unwrap_or_default();
    assert!(ended.starts_with("rolled back by allot as version 3"), "{ended}");
    assert!(ended.contains("failure_rate>0.5"), "{ended}");
    let (_, history) = rt.block_on(d.call("GET", "/api/v1/policy/versions", Some(&admin), None));
    let three = &history["versions"][2];
    assert_eq!((three["by"].as_str(), three["rollback_of"].as_u64()), (Some("allot"), Some(1)));
    assert!(three["why"].as_str().unwrap_or("").contains("2 observations"), "{three}");
    assert_eq!(history["versions"][1]["scope"], "project=nlp");
    let (_, metrics) = rt.block_on(d.call("GET", "/metrics", Some(&admin), None));
    let metrics = metrics.as_str().map(str::to_string).unwrap_or_else(|| metrics.to_string());
    assert!(metrics.contains("allot_policy_rollbacks 1"), "{metrics}");
    let event = hook.recv_timeout(std::time::Duration::from_secs(20)).expect("webhook posted");
    let event: Value = serde_json::from_str(&event).expect("JSON");
    assert_eq!(event["event"], "policy_rolled_back", "{event}");
    assert_eq!(
        (event["scope"].as_str(), event["restored_version"].as_u64()),
        (Some("project=nlp"), Some(1))
    );
    assert!(event["why"].as_str().unwrap_or("").contains("failure_rate>0.5"), "{event}");
}

/// A one-request HTTP server on loopback: its URL, and the body it received.
fn webhook_receiver() -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("address"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // Headers, then as many body bytes as Content-Length says.
        loop {
            let Ok(n) = stream.read(&mut buf) else { return };
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&got[end + 4..end + 4 + length]).to_string();
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                    let _ = tx.send(body);
                    return;
                }
            }
        }
    });
    (url, rx)
}
