//! Work found on the cluster that allot did not start (a plain `sbatch` on Slurm), node states,
//! and pre-emption by requeue, through the daemon over the fake backend (the same fake the
//! simulator uses; the Slurm backend's side runs against a real cluster in its own tests).

mod common;

use allot_backend::{DeviceAssignment, ForeignWork, MemberLaunch, RunId, Vendor};
use axum::http::StatusCode;
use common::{TestDaemon, submit_body};

fn gpus(node: &str, indices: &[u32]) -> MemberLaunch {
    MemberLaunch {
        node: node.to_string(),
        devices: indices
            .iter()
            .map(|&index| DeviceAssignment {
                index,
                uuid: None,
                vendor: Vendor::Nvidia,
                shares: 1000,
            })
            .collect(),
    }
}

fn foreign(
    handle: &str,
    project: &str,
    running: Vec<MemberLaunch>,
    gpus_per_node: u32,
) -> ForeignWork {
    ForeignWork {
        handle: handle.to_string(),
        name: format!("sbatch-{handle}"),
        project: project.to_string(),
        user: "bob".to_string(),
        nodes: running.len().max(1) as u32,
        gpus_per_node,
        models: vec!["H100".to_string()],
        started_ms: (!running.is_empty()).then_some(1_000),
        running,
        refusal: None,
        intent: Default::default(),
    }
}

fn run(workload: u64, attempt: u32) -> RunId {
    RunId { workload, attempt }
}

/// Waits (up to 5 s) until the project's H100 line shows `used` GPUs (the view catches up).
async fn wait_used_h100(d: &TestDaemon, project: &str, used: &str) {
    let mut last = String::new();
    for _ in 0..500 {
        let (status, v) = d.call("GET", "/api/v1/projects", Some(&d.admin), None).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let p = v["projects"].as_array().expect("projects").iter().find(|p| p["name"] == project);
        let line =
            p.and_then(|p| p["quota"].as_array()?.iter().find(|l| l["model"] == "H100").cloned());
        last = line.as_ref().map(|l| l["used_gpus"].to_string()).unwrap_or_default();
        if line.and_then(|l| l["used_gpus"].as_f64()) == used.parse::<f64>().ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{project} never used {used} H100: {last}");
}

async fn submit(d: &TestDaemon, body: &str) -> u64 {
    let (status, v) = d.call("POST", "/api/v1/workloads", Some(&d.admin), Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    v["id"].as_u64().expect("id")
}

#[tokio::test(flavor = "multi_thread")]
async fn running_foreign_work_is_adopted_where_it_runs_charged_and_followed_to_its_end() {
    let d = TestDaemon::new();
    d.control.add_foreign(foreign("101", "vision", vec![gpus("h100-0", &[2, 3])], 2));
    let v = d.wait_state(1, "running").await;
    assert_eq!(v["project"], "vision", "{v}");
    assert_eq!(v["user"], "bob", "{v}");
    assert_eq!(v["started_ms"], 1_000, "the cluster's start time is kept: {v}");
    let placement = v["placement"].to_string();
    assert!(
        placement.contains("h100-0") && placement.contains('2') && placement.contains('3'),
        "{v}"
    );
    wait_used_h100(&d, "vision", "2").await;
    // The backend took it over as run 1.1: no longer foreign, watched like allot's own.
    assert!(d.control.foreign().is_empty());
    let taken = d.control.run(run(1, 1)).expect("adopted as run 1.1");
    assert_eq!(taken.launch.adopt.as_deref(), Some("101"));
    // allot does not place other work on the devices it holds.
    let id = submit(&d, &submit_body("vision", 8)).await;
    d.wait_state(id, "running").await;
    let other = d.control.run(run(id, 1)).expect("launched");
    assert_ne!(other.launch.members[0].node, "h100-0", "h100-0 has only 6 GPUs free");
    assert!(d.control.finish(run(1, 1), 3));
    let v = d.wait_state(1, "failed").await;
    assert_eq!(v["exit_code"], 3, "{v}");
    // Imported once: the next watches do not import it again.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, list) = d.call("GET", "/api/v1/workloads", Some(&d.admin), None).await;
    assert_eq!(list["workloads"].as_array().map(Vec::len), Some(2), "{list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_foreign_work_starts_only_when_admitted_on_the_nodes_allot_chose() {
    let d = TestDaemon::new();
    // vision holds its whole H100 reach (8 guaranteed + 4 its cohort lends): new vision work
    // waits.
    let a = submit(&d, &submit_body("vision", 8)).await;
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    d.control.add_foreign(foreign("202", "vision", Vec::new(), 4));
    let v = d.wait_state(3, "pending").await;
    assert_eq!(v["gpus"], "4", "{v}");
    assert_eq!(v["command"], serde_json::json!(["foreign", "202"]), "{v}");
    assert!(d.control.run(run(3, 1)).is_none(), "held: nothing started");
    // Room frees up: allot admits it and the backend takes the held job over there.
    assert!(d.control.finish(run(a, 1), 0));
    d.wait_state(3, "running").await;
    let taken = d.control.run(run(3, 1)).expect("run 3.1");
    assert_eq!(taken.launch.adopt.as_deref(), Some("202"));
    assert_eq!(taken.launch.members.len(), 1);
    assert_eq!(taken.launch.members[0].devices.len(), 4);
    // The launch names the project (Slurm account) and the user (whom a job may run as).
    let env = |key: &str| taken.launch.env.get(key).cloned().unwrap_or_default();
    assert_eq!((env("ALLOT_PROJECT"), env("ALLOT_USER")), ("vision".into(), "bob".into()));
    assert!(d.control.foreign().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_foreign_work_cancelled_outside_is_cancelled_here() {
    let d = TestDaemon::new();
    let a = submit(&d, &submit_body("vision", 8)).await;
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    d.control.add_foreign(foreign("303", "vision", Vec::new(), 2));
    d.wait_state(3, "pending").await;
    assert!(d.control.end_foreign("303"));
    let v = d.wait_state(3, "cancelled").await;
    assert_eq!(v["reason_code"], "foreign_gone", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_work_on_devices_allot_holds_is_refused_and_sent_back_to_the_queue_held() {
    let d = TestDaemon::new();
    let a = submit(&d, &submit_body("vision", 8)).await;
    d.wait_state(a, "running").await;
    let node = d.control.run(run(a, 1)).expect("run").launch.members[0].node.clone();
    d.control.add_foreign(foreign("404", "speech", vec![gpus(&node, &[0])], 1));
    let v = d.wait_state(2, "rejected").await;
    assert_eq!(v["reason_code"], "cannot_adopt", "{v}");
    // Back in the queue, held: imported again as pending work, to be admitted like any other.
    d.wait_state(3, "running").await;
    let taken = d.control.run(run(3, 1)).expect("run 3.1");
    assert_eq!(taken.launch.adopt.as_deref(), Some("404"));
    assert_ne!(taken.launch.members[0].node, node, "placed where allot has room");
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_work_of_an_unknown_account_is_left_alone_with_the_reason() {
    let d = TestDaemon::new();
    d.control.add_foreign(foreign("505", "physics", vec![gpus("a100-0", &[0])], 1));
    let v = d.wait_state(1, "rejected").await;
    assert_eq!(v["reason_code"], "invalid_import", "{v}");
    assert!(v["reason"].as_str().unwrap_or_default().contains("physics"), "{v}");
    assert!(d.control.run(run(1, 1)).is_none(), "not taken over");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, list) = d.call("GET", "/api/v1/workloads", Some(&d.admin), None).await;
    assert_eq!(list["workloads"].as_array().map(Vec::len), Some(1), "imported once: {list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn foreign_work_the_backend_cannot_express_per_node_is_left_held_with_its_reason() {
    let d = TestDaemon::new();
    let why = "it asks --gpus=3 (3 GPUs) on 2 nodes, which does not split into the same whole \
               number per node; ask --gpus-per-node instead";
    d.control.add_foreign(ForeignWork {
        nodes: 2,
        refusal: Some(why.to_string()),
        ..foreign("707", "vision", Vec::new(), 0)
    });
    let v = d.wait_state(1, "rejected").await;
    assert_eq!(v["reason_code"], "invalid_import", "{v}");
    assert!(v["reason"].as_str().unwrap_or_default().contains(why), "{v}");
    assert_eq!(v["name"], "sbatch-707", "refused work keeps its name: {v}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(d.control.run(run(1, 1)).is_none(), "never launched");
    assert_eq!(d.control.foreign().len(), 1, "left held on the cluster");
    let (_, list) = d.call("GET", "/api/v1/workloads", Some(&d.admin), None).await;
    assert_eq!(list["workloads"].as_array().map(Vec::len), Some(1), "imported once: {list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_suspension_requeues_the_run_on_a_backend_that_keeps_work() {
    let d = TestDaemon::new();
    d.control.support_requeue();
    let id = submit(&d, &submit_body("vision", 2)).await;
    d.wait_state(id, "running").await;
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/suspend"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(id, "suspended").await;
    assert_eq!(d.control.requeues(), vec![(run(id, 1), run(id, 2))]);
    assert!(d.control.signals(run(id, 1)).is_empty(), "requeued, not terminated");
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/resume"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let v = d.wait_state(id, "running").await;
    assert_eq!(v["attempt"], 2, "{v}");
    // A cancel does not requeue: the work is not coming back.
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/cancel"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(id, "cancelled").await;
    assert_eq!(d.control.requeues().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_requeue_support_a_suspension_terminates_the_run() {
    let d = TestDaemon::new();
    let id = submit(&d, &submit_body("vision", 2)).await;
    d.wait_state(id, "running").await;
    let (status, v) =
        d.call("POST", &format!("/api/v1/workloads/{id}/suspend"), Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(id, "suspended").await;
    assert!(d.control.requeues().is_empty());
    assert_eq!(d.control.signals(run(id, 1)), vec![allot_backend::StopSignal::Terminate]);
}

#[tokio::test(flavor = "multi_thread")]
async fn telemetry_follows_the_devices_the_backend_bound_not_the_launched_ones() {
    let d = TestDaemon::new();
    // The cluster binds GPUs 6 and 7 of h100-0 to the first run, whatever allot launched.
    d.control.bind_devices(run(1, 1), vec![gpus("h100-0", &[6, 7])]);
    let id = submit(&d, &submit_body("vision", 2)).await;
    assert_eq!(id, 1);
    for _ in 0..500 {
        if d.control.run(run(id, 1)).is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let launched = d.control.run(run(id, 1)).expect("launched").launch;
    let launched_node = launched.members[0].node.clone();
    let indices: Vec<u32> = launched.members[0].devices.iter().map(|g| g.index).collect();
    // The engine's first choice on an empty cluster; the cluster bound two other GPUs.
    assert_eq!(launched_node, "h100-0");
    assert!(!indices.contains(&6) && !indices.contains(&7), "{indices:?}");
    d.wait_state(id, "running").await;
    let at = std::time::SystemTime::UNIX_EPOCH.elapsed().expect("clock").as_millis() as u64;
    let sample = |node: &str, index: u32, sm: u32| serde_json::json!({"hostname": node, "gpu_index": index, "at_ms": at, "sm_active": sm});
    // The launched devices look idle, the bound ones busy: the workload is busy.
    let body = serde_json::json!({"samples": [
        sample(&launched_node, indices[0], 0), sample(&launched_node, indices[1], 0),
        sample("h100-0", 6, 900), sample("h100-0", 7, 900)
    ]});
    let mut text = String::new();
    for _ in 0..300 {
        let (status, v) =
            d.call("POST", "/api/v1/telemetry", Some(&d.admin), Some(&body.to_string())).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        let (_, metrics) = d.call("GET", "/metrics", Some(&d.admin), None).await;
        text = metrics.as_str().unwrap_or("").to_string();
        if text.contains("allot_active_gpus{project=\"vision\"} 2.0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(text.contains("allot_active_gpus{project=\"vision\"} 2.0"), "{text}");
    // `allot nodes` shows it on the GPUs the cluster bound.
    let (_, v) = d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await;
    let node = v["nodes"].as_array().and_then(|n| n.iter().find(|n| n["name"] == "h100-0"));
    let devices = node.and_then(|n| n["devices"].as_array()).expect("h100-0's devices");
    let on: Vec<u64> = devices
        .iter()
        .filter(|g| g["workloads"].as_array().is_some_and(|w| w.contains(&id.into())))
        .filter_map(|g| g["index"].as_u64())
        .collect();
    assert_eq!(on, [6, 7], "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn telemetry_of_a_run_in_pods_follows_the_exporters_pod_labels() {
    // A dcgm-exporter in Kubernetes mode on h100-0: the device plugin gave pod vision/train
    // GPUs 6 and 7 (busy); the others are another pod's (idle).
    let source = common::pod_exporter("h100-0", "vision", "train", &[6, 7]);
    let d = TestDaemon::with_sources(common::POLICY, vec![source]);
    let train = allot_backend::PodRef { namespace: "vision".into(), name: "train".into() };
    d.control.set_member_pods(run(1, 1), vec![train]);
    let id = submit(&d, &submit_body("vision", 2)).await;
    assert_eq!(id, 1);
    d.wait_state(id, "running").await;
    let launched = d.control.run(run(id, 1)).expect("launched").launch;
    assert_eq!(launched.members[0].node, "h100-0");
    let indices: Vec<u32> = launched.members[0].devices.iter().map(|g| g.index).collect();
    assert!(!indices.contains(&6) && !indices.contains(&7), "{indices:?}");
    // By index, the launched GPUs read idle; by pod, the pod's two GPUs read busy.
    common::wait_active_gpus(&d, "vision", "2.0").await;
}

/// Waits (up to 5 s) until `/api/v1/nodes` says `node` is unusable for `reason` (`None`: usable).
async fn wait_node(d: &TestDaemon, node: &str, reason: Option<&str>) {
    let mut last = serde_json::Value::Null;
    for _ in 0..500 {
        let (_, v) = d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await;
        let n = v["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == node).cloned();
        if let Some(n) = n {
            if n["unusable"].as_str() == reason {
                return;
            }
            last = n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{node} never became {reason:?}: {last}");
}

#[tokio::test(flavor = "multi_thread")]
async fn node_states_from_the_backend_are_shown_and_new_work_avoids_an_unusable_node() {
    let d = TestDaemon::new();
    d.control.set_node_unusable("h100-0", Some("DRAIN: fan failure"));
    wait_node(&d, "h100-0", Some("DRAIN: fan failure")).await;
    // Two 8-GPU H100 jobs: one fits on h100-1; the other waits while h100-0 is drained.
    let a = submit(&d, &submit_body("vision", 8)).await;
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(a, "running").await;
    let v = d.wait_state(b, "pending").await;
    assert_eq!(d.control.run(run(a, 1)).expect("run").launch.members[0].node, "h100-1", "{v}");
    d.control.set_node_unusable("h100-0", None);
    wait_node(&d, "h100-0", None).await;
    d.wait_state(b, "running").await;
    assert_eq!(d.control.run(run(b, 1)).expect("run").launch.members[0].node, "h100-0");
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_foreign_work_cancelled_through_allot_is_cancelled_on_the_cluster() {
    let d = TestDaemon::new();
    let a = submit(&d, &submit_body("vision", 8)).await;
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    d.control.add_foreign(foreign("606", "vision", Vec::new(), 2));
    d.wait_state(3, "pending").await;
    let (status, v) = d.call("POST", "/api/v1/workloads/3/cancel", Some(&d.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    d.wait_state(3, "cancelled").await;
    for _ in 0..500 {
        if d.control.foreign().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(d.control.foreign().is_empty(), "the held job was cancelled where it waited");
    // Gone from the cluster, and not imported again.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (_, list) = d.call("GET", "/api/v1/workloads", Some(&d.admin), None).await;
    assert_eq!(list["workloads"].as_array().map(Vec::len), Some(3), "{list}");
}

/// Waits (up to 5 s) until `/api/v1/nodes` says foreign work holds `devices` of `node`.
async fn wait_unmanaged(d: &TestDaemon, node: &str, devices: &[u32]) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..500 {
        let (_, v) = d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await;
        let n = v["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == node).cloned();
        if let Some(n) = n {
            let held: Vec<u64> = n["unmanaged"]["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_u64)
                .collect();
            if held.iter().copied().eq(devices.iter().map(|&d| u64::from(d))) {
                return n;
            }
            last = n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{node} never showed {devices:?} held by foreign work: {last}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gpus_of_work_allot_does_not_govern_are_offered_to_no_allot_work_until_it_ends() {
    let d = TestDaemon::new();
    // A job of an unmanaged partition runs on six of h100-0's GPUs.
    d.control.set_beside(
        "7001",
        Some(foreign("7001", "physics", vec![gpus("h100-0", &[0, 1, 2, 3, 4, 5])], 6)),
    );
    let n = wait_unmanaged(&d, "h100-0", &[0, 1, 2, 3, 4, 5]).await;
    assert!(n["unmanaged"]["by"].as_str().unwrap_or_default().contains("work 7001 of bob"), "{n}");
    // An 8-GPU job goes to h100-1; a second waits (h100-0 has two GPUs allot may use).
    let a = submit(&d, &submit_body("vision", 8)).await;
    d.wait_state(a, "running").await;
    assert_eq!(d.control.run(run(a, 1)).expect("run").launch.members[0].node, "h100-1");
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(b, "pending").await;
    // The ledger's cluster row counts the held GPUs as unmanaged, not capacity.
    let mut unmanaged = 0.0;
    for _ in 0..500 {
        let (_, report) = d.call("GET", "/api/v1/report", Some(&d.admin), None).await;
        let cluster =
            report["rows"].as_array().into_iter().flatten().find(|r| r["scope"] == "cluster");
        unmanaged = cluster.and_then(|r| r["unmanaged_gpu_hours"].as_f64()).unwrap_or(0.0);
        if unmanaged > 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(unmanaged > 0.0, "the cluster row never counted unmanaged GPU-hours");
    // The job ends: h100-0 is allot's again and the waiting work starts there.
    d.control.set_beside("7001", None);
    d.wait_state(b, "running").await;
    assert_eq!(d.control.run(run(b, 1)).expect("run").launch.members[0].node, "h100-0");
    // The node view does not lag: whoever sees the run sees h100-0 as it is now.
    let (_, v) = d.call("GET", "/api/v1/nodes", Some(&d.admin), None).await;
    let n = v["nodes"].as_array().into_iter().flatten().find(|n| n["name"] == "h100-0");
    let n = n.expect("h100-0 in the node view");
    assert!(n["unmanaged"].is_null(), "nothing held outside allot once the job ended: {n}");
    let on: Vec<&serde_json::Value> = n["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["workloads"].as_array().is_some_and(|w| w.contains(&b.into())))
        .collect();
    assert_eq!(on.len(), 4, "the waiting work on four of h100-0's GPUs: {n}");
}

#[tokio::test(flavor = "multi_thread")]
async fn running_work_allot_refused_occupies_its_gpus_until_it_ends() {
    let d = TestDaemon::new();
    d.control.add_foreign(foreign("7002", "physics", vec![gpus("h100-1", &[4, 5, 6, 7])], 4));
    d.wait_state(1, "rejected").await;
    let n = wait_unmanaged(&d, "h100-1", &[4, 5, 6, 7]).await;
    assert!(n["unmanaged"]["by"].as_str().unwrap_or_default().contains("not governed"), "{n}");
    let a = submit(&d, &submit_body("vision", 8)).await;
    d.wait_state(a, "running").await;
    assert_eq!(d.control.run(run(a, 1)).expect("run").launch.members[0].node, "h100-0");
    assert!(d.control.end_foreign("7002"));
    wait_unmanaged(&d, "h100-1", &[]).await;
}

/// Waits (up to 5 s) for the reason the backend was told for `waiting`.
async fn wait_explained(d: &TestDaemon, waiting: &allot_backend::Waiting) -> String {
    for _ in 0..500 {
        if let Some(text) = d.control.explained().get(waiting) {
            return text.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{waiting:?} was never explained: {:?}", d.control.explained());
}

/// Work that waits on the cluster for allot (imported and never launched, or kept by a
/// requeue) is told allot's reason there (Slurm: its admin comment), the one `allot why`
/// gives; work allot holds nowhere on the cluster (its own, not yet submitted) is not.
#[tokio::test(flavor = "multi_thread")]
async fn work_waiting_on_the_cluster_is_told_allots_reason_there() {
    use allot_backend::Waiting;
    let d = TestDaemon::new();
    d.control.support_requeue();
    let a = submit(&d, &submit_body("vision", 8)).await;
    let b = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(a, "running").await;
    d.wait_state(b, "running").await;
    d.control.add_foreign(foreign("202", "vision", Vec::new(), 4));
    d.wait_state(3, "pending").await;
    let text = wait_explained(&d, &Waiting::Foreign("202".into())).await;
    let (_, v) = d.call("GET", "/api/v1/workloads/3", Some(&d.admin), None).await;
    assert_eq!(v["reason"].as_str(), Some(text.as_str()), "{v}");
    assert!(text.contains("vision"), "{text}");
    // vision's own next job waits in allot only: nothing of it is on the cluster.
    let own = submit(&d, &submit_body("vision", 4)).await;
    d.wait_state(own, "pending").await;
    // speech claims its guarantee: vision's borrowed job is requeued, kept, and told why.
    let s = submit(&d, &submit_body("speech", 4)).await;
    d.wait_state(s, "running").await;
    let v = d.wait_state(b, "pending").await;
    assert_eq!(v["attempt"], 1, "{v}");
    let kept = wait_explained(&d, &Waiting::Kept(run(b, 2))).await;
    assert!(!kept.is_empty());
    let told: Vec<Waiting> = d.control.explained().into_keys().collect();
    assert_eq!(told, [Waiting::Foreign("202".into()), Waiting::Kept(run(b, 2))], "{told:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_intent_foreign_work_declares_is_its_workload_and_is_checked_as_a_submission() {
    let d = TestDaemon::new();
    d.control.add_foreign(ForeignWork {
        intent: allot_backend::ForeignIntent {
            kind: Some("inference".into()),
            max_runtime_s: Some(3600),
            ..Default::default()
        },
        ..foreign("ns/serve", "vision", Vec::new(), 1)
    });
    d.control.add_foreign(ForeignWork {
        intent: allot_backend::ForeignIntent {
            priority_class: Some("vip".into()),
            ..Default::default()
        },
        ..foreign("ns/vip", "vision", Vec::new(), 1)
    });
    let served = d.wait_state(1, "running").await;
    assert_eq!(served["kind"], "inference", "{served}");
    let vip = d.wait_state(2, "rejected").await;
    let reason = vip["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("priority_class"), "{vip}");
    assert!(reason.contains("Kubernetes namespace"), "the neutral fix: {vip}");
    // Held on the cluster, refused: the reason is said there too.
    let told = wait_explained(&d, &allot_backend::Waiting::Foreign("ns/vip".into())).await;
    assert_eq!(told, reason);
}

/// Foreign work pre-empted on a backend that cannot keep it (a Kubernetes pod, evicted) is
/// gone from the cluster: its workload ends, and is never launched again by its old handle.
#[tokio::test(flavor = "multi_thread")]
async fn foreign_work_the_backend_cannot_keep_ends_when_pre_empted() {
    let d = TestDaemon::new();
    let a = submit(&d, &submit_body("vision", 8)).await;
    d.wait_state(a, "running").await;
    // A pod of vision's that borrows 4 of speech's H100s.
    d.control.add_foreign(foreign("ns/train@u1", "vision", Vec::new(), 4));
    let pod = 2;
    d.wait_state(pod, "running").await;
    // speech claims its guarantee: the pod is reclaimed, terminated (no requeue), and ends.
    let s = submit(&d, &submit_body("speech", 4)).await;
    d.wait_state(s, "running").await;
    let v = d.wait_state(pod, "failed").await;
    assert_eq!(v["reason_code"], "deleted", "{v}");
    assert!(v["reason"].as_str().unwrap_or_default().contains("could not keep it"), "{v}");
    assert_eq!(d.control.signals(run(pod, 1)), vec![allot_backend::StopSignal::Terminate]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(d.control.run(run(pod, 2)).is_none(), "not launched again");
}
