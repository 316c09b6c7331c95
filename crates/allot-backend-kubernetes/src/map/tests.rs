//! The mapping on objects written from the Kubernetes API's documented shapes (core/v1 Node and
//! Pod, as `kubectl get -o json` prints them).

use super::*;
use serde_json::json;

fn node(value: serde_json::Value) -> Node {
    serde_json::from_value(value).expect("a Node object")
}

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).expect("a Pod object")
}

fn h100_node() -> Node {
    node(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-a",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "topology.kubernetes.io/zone": "zone-1",
                "allot.dev/rack": "r7"
            }
        },
        "spec": {},
        "status": {
            "capacity": { "cpu": "64", "memory": "1056Gi", "nvidia.com/gpu": "8", "pods": "110" },
            "allocatable": { "cpu": "63500m", "memory": "1048576Mi", "nvidia.com/gpu": "8" },
            "conditions": [
                { "type": "MemoryPressure", "status": "False" },
                { "type": "Ready", "status": "True", "reason": "KubeletReady" }
            ]
        }
    }))
}

#[test]
fn a_gpu_node_becomes_a_node_spec() {
    let spec = node_spec(&h100_node()).expect("a GPU node");
    assert_eq!(spec.name, "gpu-a");
    assert_eq!(spec.cpu_millis, 63_500);
    assert_eq!(spec.memory_mib, 1_048_576);
    assert_eq!(spec.pool.as_deref(), Some("zone-1"));
    assert_eq!(spec.rack.as_deref(), Some("r7"));
    assert_eq!(spec.devices.len(), 8);
    assert!(
        spec.devices
            .iter()
            .all(|d| d.model == "NVIDIA-H100-80GB-HBM3" && d.memory_mib == 81_559 && !d.mig)
    );
    assert_eq!(
        spec.labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3")
    );
}

#[test]
fn nodes_without_gpus_are_not_governed() {
    let cpu_only = node(json!({
        "metadata": { "name": "cpu-1" },
        "status": { "capacity": { "cpu": "8", "memory": "32Gi", "nvidia.com/mig-": "7" } }
    }));
    assert_eq!(node_spec(&cpu_only), None, "a resource named like no MIG profile is not one");
    // MIG slices alone: a GPU node (of slices).
    let mig = node(json!({
        "metadata": { "name": "mig-1" },
        "status": { "capacity": { "nvidia.com/mig-1g.10gb": "7" } }
    }));
    let models = node_spec(&mig).map(|s| s.devices.iter().map(|d| d.model.clone()).collect());
    assert_eq!(models, Some(vec!["nvidia-gpu-MIG-1g.10gb".to_string(); 7]));
}

#[test]
fn an_amd_node_without_product_label_gets_the_fallback_model() {
    let amd = node(json!({
        "metadata": { "name": "mi-1" },
        "status": { "capacity": { "amd.com/gpu": "4" }, "allocatable": { "memory": "1e3" } }
    }));
    let spec = node_spec(&amd).expect("an AMD GPU node");
    assert_eq!(spec.devices.len(), 4);
    assert_eq!(spec.devices[0].model, "amd-gpu");
    // An exponent is not a form allot reads: 0, not a panic.
    assert_eq!(spec.memory_mib, 0);
}

#[test]
fn quantities_in_kubernetes_notation() {
    let q = |s: &str| Quantity(s.to_string());
    assert_eq!(quantity_scaled(&q("2"), 1000.0), Some(2000));
    assert_eq!(quantity_scaled(&q("250m"), 1000.0), Some(250));
    assert_eq!(quantity_scaled(&q("0.5"), 1000.0), Some(500));
    assert_eq!(quantity_scaled(&q("2Gi"), 1.0 / (1024.0 * 1024.0)), Some(2048));
    assert_eq!(quantity_scaled(&q("131072Ki"), 1.0 / (1024.0 * 1024.0)), Some(128));
    assert_eq!(quantity_scaled(&q("lots"), 1.0), None);
    assert_eq!(quantity_scaled(&q(""), 1.0), None);
}

#[test]
fn node_status_names_why_a_node_is_unusable() {
    let ready = node_status(&h100_node());
    assert!(ready.usable);
    assert_eq!(ready.reason, "Ready");

    let mut cordoned = h100_node();
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    let status = node_status(&cordoned);
    assert!(!status.usable);
    assert!(status.reason.contains("cordoned"), "{}", status.reason);

    let not_ready = node(json!({
        "metadata": { "name": "gpu-b" },
        "status": { "conditions": [
            { "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
              "message": "Kubelet stopped posting node status." }
        ]}
    }));
    let status = node_status(&not_ready);
    assert!(!status.usable);
    assert_eq!(status.reason, "NotReady: Kubelet stopped posting node status.");
}

fn allot_pod(gpus: &str) -> Pod {
    pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "train", "namespace": "vision", "uid": "u-1",
                      "labels": { "allot.dev/user": "alice" } },
        "spec": {
            "schedulerName": "allot",
            "serviceAccountName": "trainer",
            "nodeSelector": { "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" },
            "containers": [
                { "name": "main", "image": "busybox",
                  "resources": { "limits": { "nvidia.com/gpu": gpus, "cpu": "4" } } },
                { "name": "sidecar", "image": "busybox",
                  "resources": { "limits": { "nvidia.com/gpu": "1" } } }
            ]
        },
        "status": { "phase": "Pending" }
    }))
}

#[test]
fn a_pending_allot_pod_is_foreign_work_of_its_namespace() {
    let work = foreign_work(&allot_pod("2"), &tests_fleet(), &mut IndexGuess::default());
    assert_eq!(work.handle, "vision/train@u-1");
    assert_eq!(work.project, "vision");
    assert_eq!(work.user, "alice");
    assert_eq!(work.nodes, 1);
    assert_eq!(work.gpus_per_node, 3, "summed over containers");
    assert_eq!(work.models, ["NVIDIA-H100-80GB-HBM3"]);
    assert!(work.running.is_empty());
    assert_eq!(work.refusal, None);
    assert!(asks_allot(&allot_pod("2")));
}

#[test]
fn the_user_falls_back_to_the_service_account() {
    let mut p = allot_pod("1");
    p.metadata.labels = None;
    assert_eq!(pod_user(&p), "trainer");
}

#[test]
fn a_fractional_gpu_request_is_refused_naming_the_field() {
    let work = foreign_work(&allot_pod("500m"), &tests_fleet(), &mut IndexGuess::default());
    let refusal = work.refusal.expect("refused");
    assert!(
        refusal.contains("spec.containers[0].resources.limits[nvidia.com/gpu] is \"500m\""),
        "{refusal}"
    );
    assert!(refusal.contains("whole number"), "{refusal}");
}

/// An A100 node of the GPU operator's mixed MIG strategy: 2 whole GPUs, and 2 GPUs split into
/// 7 × 1g.10gb and 2 × 3g.40gb slices in all.
fn mig_node() -> Node {
    node(json!({
        "metadata": { "name": "gpu-m", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920" } },
        "status": { "capacity": {
            "nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"
        } }
    }))
}

#[test]
fn mig_slices_are_devices_of_their_own_model_as_kubernetes_counts_them() {
    let spec = node_spec(&mig_node()).expect("a GPU node");
    let models: Vec<(&str, u64)> =
        spec.devices.iter().map(|d| (d.model.as_str(), d.memory_mib)).collect();
    let a100 = ("NVIDIA-A100-SXM4-80GB", 81_920);
    let small = ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 10_240);
    let big = ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 40_960);
    assert_eq!(models, [[a100; 2].as_slice(), &[small; 7], &[big; 2]].concat());
    assert!(spec.devices.iter().all(|d| !d.mig), "fixed slices, not split by allot");
    let resource = |i| device_resource(&mig_node(), i);
    assert_eq!(resource(1).as_deref(), Some("nvidia.com/gpu"));
    assert_eq!(resource(2).as_deref(), Some("nvidia.com/mig-1g.10gb"));
    assert_eq!(resource(10).as_deref(), Some("nvidia.com/mig-3g.40gb"));
    assert_eq!(resource(11), None);
}

#[test]
fn a_pod_asking_for_mig_slices_takes_slices_of_that_profile_only() {
    let fleet = Fleet::of([&mig_node()]);
    let work = |limits, selector| {
        foreign_work(&pending_pod(limits, selector), &fleet, &mut IndexGuess::default())
    };
    let slices = work(json!({ "nvidia.com/mig-1g.10gb": "2" }), json!({}));
    assert_eq!((slices.gpus_per_node, slices.refusal.as_deref()), (2, None));
    assert_eq!(slices.models, ["NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"]);
    let selected = json!({ "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB" });
    let slices = work(json!({ "nvidia.com/mig-3g.40gb": "1" }), selected);
    assert_eq!(slices.models, ["NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"]);
    // Whole GPUs never land on slices, though the cluster has one vendor.
    let whole = work(json!({ "nvidia.com/gpu": "1" }), json!({}));
    assert_eq!(whole.models, ["NVIDIA-A100-SXM4-80GB"]);
    // A profile no node offers is refused, naming it.
    let why = work(json!({ "nvidia.com/mig-2g.20gb": "1" }), json!({})).refusal.expect("refused");
    assert!(why.contains("asks for nvidia.com/mig-2g.20gb: no node"), "{why}");
    // A bound slice pod is counted on the node's slices of its profile.
    let mut bound = pending_pod(json!({ "nvidia.com/mig-3g.40gb": "1" }), json!({}));
    bound.spec.get_or_insert_default().node_name = Some("gpu-m".into());
    let mut guess = IndexGuess::of_nodes([&mig_node()]);
    let running = foreign_work(&bound, &fleet, &mut guess).running;
    assert_eq!(running[0].devices.iter().map(|d| d.index).collect::<Vec<_>>(), [9]);
}

#[test]
fn mixed_gpu_kinds_in_one_pod_are_refused() {
    let mixed_mig = pod(json!({
        "metadata": { "name": "m", "namespace": "ns" },
        "spec": { "schedulerName": "allot", "containers": [
            { "name": "c", "resources": { "limits": {
                "nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1" } } }
        ]}
    }));
    let why = gpu_ask(&mixed_mig).expect_err("two kinds refused");
    assert!(why.contains("both nvidia.com/gpu and nvidia.com/mig-1g.10gb"), "{why}");

    let mixed = pod(json!({
        "metadata": { "name": "m", "namespace": "ns" },
        "spec": { "containers": [
            { "name": "a", "resources": { "limits": { "nvidia.com/gpu": "1" } } },
            { "name": "b", "resources": { "limits": { "amd.com/gpu": "1" } } }
        ]}
    }));
    assert!(gpu_ask(&mixed).expect_err("mixed refused").contains("both"));
}

/// A cluster of both vendors: the H100 node and an AMD node labelled as AMD's GPU operator
/// labels it.
fn two_vendor_fleet() -> Fleet {
    let mi300x = node(json!({
        "metadata": { "name": "gpu-m", "labels": { "amd.com/gpu.product": "MI300X" } },
        "status": { "capacity": { "amd.com/gpu": "8" } }
    }));
    let h100 = h100_node();
    Fleet::of([&h100, &mi300x])
}

fn pending_pod(limits: serde_json::Value, selector: serde_json::Value) -> Pod {
    pod(json!({
        "metadata": { "name": "p", "namespace": "ns", "uid": "u-p" },
        "spec": { "schedulerName": "allot", "nodeSelector": selector, "containers": [
            { "name": "c", "resources": { "limits": limits } }
        ]}
    }))
}

#[test]
fn a_pod_runs_only_on_models_of_its_gpu_vendor() {
    let check = |limits, selector, fleet: &Fleet, models: &[&str]| {
        let work = foreign_work(&pending_pod(limits, selector), fleet, &mut IndexGuess::default());
        assert_eq!(work.refusal, None);
        assert_eq!(work.models, models, "{work:?}");
    };
    let both = two_vendor_fleet();
    // Two vendors: each pod its own vendor's models, whatever it selects of them.
    check(json!({ "amd.com/gpu": "1" }), json!({}), &both, &["MI300X"]);
    check(json!({ "nvidia.com/gpu": "2" }), json!({}), &both, &["NVIDIA-H100-80GB-HBM3"]);
    let selected = json!({ "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" });
    check(json!({ "nvidia.com/gpu": "1" }), selected, &both, &["NVIDIA-H100-80GB-HBM3"]);
    // One vendor: any model, so that a node of a new model is used as soon as it joins.
    check(json!({ "nvidia.com/gpu": "1" }), json!({}), &tests_fleet(), &[]);
    // No GPU asked: nothing to choose.
    check(json!({ "cpu": "1" }), json!({}), &both, &[]);
}

#[test]
fn a_pod_no_node_can_take_is_refused_naming_the_field() {
    let refusal = |limits, selector, fleet: &Fleet| {
        let work = foreign_work(&pending_pod(limits, selector), fleet, &mut IndexGuess::default());
        work.refusal.expect("refused")
    };
    let why = refusal(json!({ "amd.com/gpu": "1" }), json!({}), &tests_fleet());
    assert!(why.contains("asks for amd.com/gpu: no node of this cluster has"), "{why}");
    assert!(why.contains("its GPU resources: nvidia.com/gpu"), "{why}");
    let selected = json!({ "nvidia.com/gpu.product": "NVIDIA-B200" });
    let why = refusal(json!({ "nvidia.com/gpu": "1" }), selected, &two_vendor_fleet());
    assert!(
        why.contains("spec.nodeSelector[nvidia.com/gpu.product] is \"NVIDIA-B200\"")
            && why.contains("its models: NVIDIA-H100-80GB-HBM3")
            && why.contains("stays unbound"),
        "{why}"
    );
    // An AMD product selected for an NVIDIA request: no NVIDIA GPU of that model.
    let selected = json!({ "amd.com/gpu.product": "MI300X" });
    let why = refusal(json!({ "nvidia.com/gpu": "1" }), selected, &two_vendor_fleet());
    assert!(why.contains("spec.nodeSelector[amd.com/gpu.product] is \"MI300X\""), "{why}");
    // Bound already: taken as it runs, wherever that is.
    let mut bound = pending_pod(json!({ "amd.com/gpu": "1" }), json!({}));
    bound.spec.get_or_insert_default().node_name = Some("gpu-a".into());
    let work = foreign_work(&bound, &tests_fleet(), &mut IndexGuess::default());
    assert_eq!((work.refusal, work.models.len()), (None, 0));
}

#[test]
fn a_request_without_a_limit_counts() {
    let p = pod(json!({
        "metadata": { "name": "r", "namespace": "ns" },
        "spec": { "containers": [
            { "name": "a", "resources": { "requests": { "amd.com/gpu": "2" } } }
        ]}
    }));
    assert_eq!(gpu_ask(&p), Ok(GpuAsk { gpus: 2, vendor: Vendor::Amd, resource: AMD_GPU.into() }));
}

#[test]
fn bound_pods_get_the_lowest_indices_not_taken() {
    let mut guess = IndexGuess::default();
    guess.take("gpu-a", 0);
    guess.take("gpu-a", 2);
    let mut bound = allot_pod("2");
    bound.spec.get_or_insert_default().node_name = Some("gpu-a".into());
    let work = foreign_work(&bound, &tests_fleet(), &mut guess);
    let indices: Vec<u32> = work.running[0].devices.iter().map(|d| d.index).collect();
    assert_eq!(indices, vec![1, 3, 4], "3 GPUs around allot's 0 and 2");
    assert_eq!(work.running[0].node, "gpu-a");
    // Running work is taken as it runs: no refusal even if its request were odd.
    assert_eq!(work.refusal, None);
}

#[test]
fn handles_parse_as_pods_and_groups() {
    let pod = |namespace, name, uid| Some(Handle::Pod { namespace, name, uid });
    let group = |namespace, group, uid| Some(Handle::Group { namespace, group, uid });
    assert_eq!(parse_handle("ns/pod"), pod("ns", "pod", None));
    assert_eq!(parse_handle("ns/pod@u-1"), pod("ns", "pod", Some("u-1")));
    assert_eq!(parse_handle("ns/group:g@u-2"), group("ns", "g", Some("u-2")));
    assert_eq!(parse_handle("ns/group:g"), group("ns", "g", None));
    // A pod named "group" is a pod.
    assert_eq!(parse_handle("ns/group"), pod("ns", "group", None));
    assert_eq!(parse_handle("ns/pod@u-1~0a1b2c3d"), pod("ns", "pod", Some("u-1")), "refused");
    for bad in ["pod", "/pod", "a/b/c", "ns/pod@", "ns/other:g", "ns/group:", "ns/group:a:b"] {
        assert_eq!(parse_handle(bad), None, "{bad}");
    }
    assert_eq!(group_handle("ns", "g", Some("u")), "ns/group:g@u");
}

fn finished(phase: &str, statuses: serde_json::Value) -> Pod {
    pod(json!({
        "metadata": { "name": "p", "namespace": "ns" },
        "spec": { "containers": [{ "name": "main" }, { "name": "side" }] },
        "status": { "phase": phase, "containerStatuses": statuses }
    }))
}

#[test]
fn exit_codes_come_from_the_first_failing_container() {
    let terminated = |name: &str, code: i32| {
        json!({ "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" } } } })
    };
    let ok = finished("Succeeded", json!([terminated("main", 0), terminated("side", 0)]));
    assert_eq!(exit_status(&ok).0, Some(0));

    let failed = finished("Failed", json!([terminated("main", 0), terminated("side", 3)]));
    let (code, detail) = exit_status(&failed);
    assert_eq!(code, Some(3));
    assert_eq!(detail, "container side exited 3 (Error)");

    let succeeded_bare = finished("Succeeded", json!([]));
    assert_eq!(exit_status(&succeeded_bare).0, Some(0));

    let mut evicted = finished("Failed", json!([]));
    if let Some(status) = evicted.status.as_mut() {
        status.reason = Some("Evicted".into());
        status.message = Some("The node was low on resource: memory.".into());
    }
    let (code, detail) = exit_status(&evicted);
    assert_eq!(code, None);
    assert_eq!(detail, "pod Failed: The node was low on resource: memory.");
}

/// A pod of group `group` (size annotation `size`, `None`: none) asking for `gpus` GPUs.
fn member(name: &str, group: &str, size: Option<&str>, gpus: &str) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    if let Some(size) = size {
        annotations.insert(GROUP_SIZE_ANNOTATION.into(), json!(size));
    }
    json!({
        "metadata": { "name": name, "namespace": "vision", "uid": format!("uid-{name}"),
                      "creationTimestamp": format!("2026-01-01T00:00:0{}Z", name.len() % 10),
                      "labels": { GROUP_LABEL: group, "allot.dev/user": "alice" },
                      "annotations": annotations },
        "spec": {
            "schedulerName": "allot",
            "containers": [{ "name": "main", "image": "busybox",
                             "resources": { "limits": { "nvidia.com/gpu": gpus } } }]
        },
        "status": { "phase": "Pending" }
    })
}

fn work_of(values: Vec<serde_json::Value>) -> (Vec<ForeignWork>, Vec<Note>) {
    let pods: Vec<Pod> = values.into_iter().map(pod).collect();
    let refs: Vec<&Pod> = pods.iter().collect();
    allot_work(&refs, &tests_fleet(), &mut IndexGuess::default())
}

#[test]
fn a_complete_group_is_one_work_of_one_member_per_pod() {
    let (works, notes) = work_of(vec![
        member("w-1", "llm", Some("2"), "8"),
        member("w-0", "llm", Some("2"), "8"),
        allot_pod_value(),
    ]);
    assert_eq!(notes, Vec::new());
    assert_eq!(works.len(), 2, "{works:?}");
    let group = works.iter().find(|w| w.name == "llm").expect("the group");
    let id = group.handle.strip_prefix("vision/group:llm@").expect("a group handle");
    assert_eq!(id.len(), 16, "{id}");
    // The same pods in another order: the same group; a pod replaced: another.
    let (again, _) =
        work_of(vec![member("w-0", "llm", Some("2"), "8"), member("w-1", "llm", Some("2"), "8")]);
    assert_eq!(again[0].handle, group.handle);
    let mut replaced = member("w-1", "llm", Some("2"), "8");
    replaced["metadata"]["uid"] = json!("uid-w-1-again");
    let (other, _) = work_of(vec![member("w-0", "llm", Some("2"), "8"), replaced]);
    assert_ne!(other[0].handle, group.handle);
    assert_eq!((group.nodes, group.gpus_per_node), (2, 8));
    assert_eq!(group.project, "vision");
    assert_eq!(group.user, "alice");
    assert_eq!(group.refusal, None);
    assert!(group.running.is_empty());
}

fn allot_pod_value() -> serde_json::Value {
    serde_json::to_value(allot_pod("1")).expect("a pod as JSON")
}

#[test]
fn a_group_missing_a_pod_is_not_offered_and_says_why_on_its_pods() {
    let (works, notes) = work_of(vec![member("w-0", "llm", Some("2"), "8")]);
    assert_eq!(works, Vec::new());
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].pod, "vision/w-0");
    assert_eq!(notes[0].reason, "AllotWaiting");
    assert_eq!(
        notes[0].message,
        "pod group llm has 1 of its 2 pods (allot.dev/pod-group-size); allot places none of them \
         until all exist"
    );
}

/// The refusal of the one work made of `values`, which must be refused.
fn refusal_of(values: Vec<serde_json::Value>) -> String {
    let (works, notes) = work_of(values);
    let [work] = works.as_slice() else { panic!("one work: {works:?}") };
    let why = work.refusal.clone().expect("refused");
    assert!(notes.iter().all(|n| n.reason == "AllotRefused" && n.message == why), "{notes:?}");
    why
}

#[test]
fn groups_whose_pods_disagree_or_cannot_be_placed_are_refused_naming_the_field() {
    let why = refusal_of(vec![
        member("w-0", "llm", Some("2"), "8"),
        member("w-1", "llm", Some("3"), "8"),
    ]);
    assert_eq!(
        why,
        "the pods of group llm disagree on allot.dev/pod-group-size (w-0: 2, w-1: 3): give every \
         pod the same size, the number of pods in the group; no pod of the group is bound"
    );
    let why = refusal_of(vec![
        member("w-0", "llm", Some("2"), "8"),
        member("w-1", "llm", Some("2"), "4"),
    ]);
    assert!(why.contains("disagree on the GPUs each asks for"), "{why}");
    assert!(why.contains("w-0: 8, w-1: 4"), "{why}");
    let why = refusal_of(vec![member("w-0", "llm", None, "8")]);
    assert!(why.contains("annotation allot.dev/pod-group-size is missing"), "{why}");
    for bad in ["0", "two", "-1", "1025", ""] {
        let why = refusal_of(vec![member("w-0", "llm", Some(bad), "8")]);
        assert!(why.contains(&format!("allot.dev/pod-group-size is {bad:?}")), "{why}");
    }
    let why = refusal_of(vec![
        member("w-0", "llm", Some("1"), "8"),
        member("w-1", "llm", Some("1"), "8"),
    ]);
    assert!(why.contains("has 2 pods but its allot.dev/pod-group-size is 1"), "{why}");
    let why = refusal_of(vec![member("w-0", "llm", Some("1"), "0.5")]);
    assert!(why.contains("pod w-0 of group llm: spec.containers[0].resources.limits"), "{why}");
    let mut kind = member("w-1", "llm", Some("2"), "8");
    kind["metadata"]["annotations"][KIND_ANNOTATION] = json!("inference");
    let why = refusal_of(vec![member("w-0", "llm", Some("2"), "8"), kind]);
    assert!(why.contains("disagree on their allot.dev/* annotations (pod w-1"), "{why}");
}

#[test]
fn kueue_group_names_are_read_and_must_agree_with_allots() {
    let mut a = member("w-0", "x", None, "2");
    a["metadata"]["labels"] = json!({ KUEUE_GROUP_LABEL: "llm" });
    a["metadata"]["annotations"] = json!({ KUEUE_GROUP_SIZE_ANNOTATION: "1" });
    let (works, _) = work_of(vec![a.clone()]);
    assert_eq!(works.len(), 1);
    assert!(works[0].handle.starts_with("vision/group:llm@"), "{}", works[0].handle);
    assert_eq!(works[0].refusal, None);
    a["metadata"]["labels"][GROUP_LABEL] = json!("other");
    let why = refusal_of(vec![a]);
    assert!(why.contains("name different groups"), "{why}");
}

#[test]
fn a_bound_group_no_run_holds_runs_where_it_is_and_a_partly_bound_one_is_refused() {
    let mut a = member("w-0", "llm", Some("2"), "8");
    let mut b = member("w-1", "llm", Some("2"), "8");
    a["spec"]["nodeName"] = json!("n1");
    let why = refusal_of(vec![a.clone(), b.clone()]);
    assert!(why.contains("partly bound (w-0 on n1, w-1 unbound)"), "{why}");
    b["spec"]["nodeName"] = json!("n2");
    let (works, notes) = work_of(vec![a, b]);
    assert_eq!(notes, Vec::new());
    let running: Vec<(&str, usize)> =
        works[0].running.iter().map(|m| (m.node.as_str(), m.devices.len())).collect();
    assert_eq!(running, vec![("n1", 8), ("n2", 8)]);
}

fn annotated(annotations: serde_json::Value) -> Pod {
    let mut value = allot_pod_value();
    value["metadata"]["annotations"] = annotations;
    value["spec"]["terminationGracePeriodSeconds"] = json!(120);
    pod(value)
}

#[test]
fn intent_comes_from_annotations() {
    assert_eq!(pod_intent(&allot_pod("1")), Ok(ForeignIntent::default()));
    let intent = pod_intent(&annotated(json!({
        KIND_ANNOTATION: "training",
        PRIORITY_CLASS_ANNOTATION: "high",
        PREEMPTIBLE_ANNOTATION: "false",
        CHECKPOINTABLE_ANNOTATION: "true",
        MIN_RUNTIME_ANNOTATION: "30m",
        MAX_RUNTIME_ANNOTATION: "1d2h",
    })));
    assert_eq!(
        intent,
        Ok(ForeignIntent {
            kind: Some("training".into()),
            priority_class: Some("high".into()),
            preemptible: Some(false),
            checkpoint_grace_s: Some(120),
            min_runtime_s: Some(1800),
            max_runtime_s: Some(93_600),
        })
    );
    let default_grace = pod_intent(&pod({
        let mut v = allot_pod_value();
        v["metadata"]["annotations"] = json!({ CHECKPOINTABLE_ANNOTATION: "true" });
        v
    }));
    assert_eq!(default_grace.map(|i| i.checkpoint_grace_s), Ok(Some(30)));
}

#[test]
fn a_malformed_intent_annotation_is_refused_naming_it_and_the_fix() {
    let cases = [
        (
            KIND_ANNOTATION,
            "trainig",
            "annotation allot.dev/kind is \"trainig\": write one of training, batch, notebook, inference, service",
        ),
        (
            PREEMPTIBLE_ANNOTATION,
            "yes",
            "annotation allot.dev/preemptible is \"yes\": write \"true\" or \"false\"",
        ),
        (CHECKPOINTABLE_ANNOTATION, "1", "annotation allot.dev/checkpointable is \"1\""),
        (MAX_RUNTIME_ANNOTATION, "90", "annotation allot.dev/max-runtime is \"90\": no unit"),
        (
            MAX_RUNTIME_ANNOTATION,
            "2 weeks",
            "annotation allot.dev/max-runtime is \"2 weeks\": not a duration",
        ),
        (MIN_RUNTIME_ANNOTATION, "1500ms", "not a whole number of seconds"),
        (MIN_RUNTIME_ANNOTATION, "0s", "not a whole number of seconds"),
        (PRIORITY_CLASS_ANNOTATION, " ", "annotation allot.dev/priority-class is empty"),
    ];
    for (key, value, want) in cases {
        let pod = annotated(json!({ key: value }));
        let why = pod_intent(&pod).expect_err(value);
        assert!(why.contains(want), "{key}={value}: {why}");
        let work = foreign_work(&pod, &tests_fleet(), &mut IndexGuess::default());
        let refusal = work.refusal.expect("refused");
        assert!(refusal.starts_with(&why), "{refusal}");
        assert!(
            refusal
                .ends_with("the pod stays unbound (correct it, or delete it and create it again)")
        );
    }
    // A pod already bound runs as it is: its malformed intent is left at the defaults.
    let mut bound = annotated(json!({ KIND_ANNOTATION: "x" }));
    if let Some(spec) = bound.spec.as_mut() {
        spec.node_name = Some("n1".into());
    }
    let work = foreign_work(&bound, &tests_fleet(), &mut IndexGuess::default());
    assert_eq!((work.refusal, work.intent), (None, ForeignIntent::default()));
}

#[test]
fn refused_work_corrected_in_place_is_new_work() {
    let mut value = allot_pod_value();
    value["metadata"]["annotations"] = json!({ KIND_ANNOTATION: "trainig" });
    let (refused, _) = work_of(vec![value.clone()]);
    let (typo_again, _) = work_of(vec![value.clone()]);
    assert!(refused[0].handle.starts_with("vision/train@u-1~"), "{}", refused[0].handle);
    assert_eq!(refused[0].handle, typo_again[0].handle, "the same refusal: the same work");
    value["metadata"]["annotations"][KIND_ANNOTATION] = json!("training");
    let (corrected, _) = work_of(vec![value]);
    assert_eq!(corrected[0].handle, "vision/train@u-1");
    assert_eq!(corrected[0].refusal, None);
}
