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
fn nodes_without_whole_gpus_are_not_governed() {
    let cpu_only = node(json!({
        "metadata": { "name": "cpu-1" },
        "status": { "capacity": { "cpu": "8", "memory": "32Gi" } }
    }));
    assert_eq!(node_spec(&cpu_only), None);
    // MIG resources alone: not supported yet.
    let mig = node(json!({
        "metadata": { "name": "mig-1" },
        "status": { "capacity": { "nvidia.com/mig-1g.10gb": "7" } }
    }));
    assert_eq!(node_spec(&mig), None);
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
    let work = foreign_work(&allot_pod("2"), &mut IndexGuess::default());
    assert_eq!(work.handle, "vision/train");
    assert_eq!(work.project, "vision");
    assert_eq!(work.user, "alice");
    assert_eq!(work.nodes, 1);
    assert_eq!(work.gpus_per_node, 3, "summed over containers");
    assert_eq!(work.model.as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
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
    let work = foreign_work(&allot_pod("500m"), &mut IndexGuess::default());
    let refusal = work.refusal.expect("refused");
    assert!(
        refusal.contains("spec.containers[0].resources.limits[nvidia.com/gpu] is \"500m\""),
        "{refusal}"
    );
    assert!(refusal.contains("whole number"), "{refusal}");
}

#[test]
fn mig_and_mixed_vendor_requests_are_refused() {
    let mig = pod(json!({
        "metadata": { "name": "m", "namespace": "ns" },
        "spec": { "schedulerName": "allot", "containers": [
            { "name": "c", "resources": { "limits": { "nvidia.com/mig-1g.10gb": "1" } } }
        ]}
    }));
    let why = gpu_ask(&mig).expect_err("MIG refused");
    assert!(
        why.contains("limits[nvidia.com/mig-1g.10gb]") && why.contains("not supported"),
        "{why}"
    );

    let mixed = pod(json!({
        "metadata": { "name": "m", "namespace": "ns" },
        "spec": { "containers": [
            { "name": "a", "resources": { "limits": { "nvidia.com/gpu": "1" } } },
            { "name": "b", "resources": { "limits": { "amd.com/gpu": "1" } } }
        ]}
    }));
    assert!(gpu_ask(&mixed).expect_err("mixed refused").contains("both"));
}

#[test]
fn a_request_without_a_limit_counts() {
    let p = pod(json!({
        "metadata": { "name": "r", "namespace": "ns" },
        "spec": { "containers": [
            { "name": "a", "resources": { "requests": { "amd.com/gpu": "2" } } }
        ]}
    }));
    assert_eq!(gpu_ask(&p), Ok(GpuAsk { gpus: 2, vendor: Vendor::Amd }));
}

#[test]
fn bound_pods_get_the_lowest_indices_not_taken() {
    let mut guess = IndexGuess::default();
    guess.take("gpu-a", 0);
    guess.take("gpu-a", 2);
    let mut bound = allot_pod("2");
    bound.spec.get_or_insert_default().node_name = Some("gpu-a".into());
    let work = foreign_work(&bound, &mut guess);
    let indices: Vec<u32> = work.running[0].devices.iter().map(|d| d.index).collect();
    assert_eq!(indices, vec![1, 3, 4], "3 GPUs around allot's 0 and 2");
    assert_eq!(work.running[0].node, "gpu-a");
    // Running work is taken as it runs: no refusal even if its request were odd.
    assert_eq!(work.refusal, None);
}

#[test]
fn handles_parse_as_namespace_and_name() {
    assert_eq!(parse_handle("ns/pod"), Some(("ns", "pod")));
    assert_eq!(parse_handle("pod"), None);
    assert_eq!(parse_handle("/pod"), None);
    assert_eq!(parse_handle("a/b/c"), None);
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
