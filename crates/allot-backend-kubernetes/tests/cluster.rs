//! The backend against a real API server: the test control plane of `scripts/k8s-cluster.sh up`
//! (kube-apiserver, kube-controller-manager, kwok playing the kubelets). Runs only with
//! `ALLOT_K8S=1`. The backend uses the least-privilege `allot` user; fixtures are made with the
//! admin kubeconfig. Each test makes its own namespace and nodes (named after the test) and
//! deletes them at the end, so tests run in parallel.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use allot_backend::contract::{self, Harness};
use allot_backend::{
    Backend, BackendError, ClusterNews, DeviceAssignment, ForeignWork, Launch, MemberLaunch,
    MemberResources, Observation, RunId, StopSignal, Vendor, Waiting,
};
use allot_backend_kubernetes::{KubernetesBackend, KubernetesConfig, own};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const H100: &str = "NVIDIA-H100-80GB-HBM3";

fn state_dir() -> PathBuf {
    PathBuf::from(std::env::var("ALLOT_K8S_DIR").unwrap_or_else(|_| "/tmp/allot-k8s".into()))
}

/// Whether to run; says why not.
#[allow(clippy::print_stderr, reason = "the skip must be visible in the test output")]
fn enabled() -> bool {
    let on = std::env::var("ALLOT_K8S").is_ok_and(|v| v == "1");
    if !on {
        eprintln!(
            "skipped: set ALLOT_K8S=1 after `bash scripts/k8s-cluster.sh up` to run the \
             Kubernetes backend against the test control plane"
        );
    }
    on
}

/// A backend that runs work submitted through allot, in the image `busybox`.
fn own_backend() -> KubernetesBackend {
    KubernetesBackend::connect(KubernetesConfig {
        kubeconfig: Some(state_dir().join("allot.kubeconfig")),
        image: Some("busybox".to_string()),
        ..KubernetesConfig::default()
    })
    .expect("the allot kubeconfig of the test cluster")
}

fn backend() -> KubernetesBackend {
    KubernetesBackend::connect(KubernetesConfig {
        kubeconfig: Some(state_dir().join("allot.kubeconfig")),
        ..KubernetesConfig::default()
    })
    .expect("the allot kubeconfig of the test cluster")
}

/// The admin's client, for fixtures; deletes its namespace and nodes when dropped.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    namespace: String,
    nodes: Vec<String>,
}

impl Fixture {
    fn new(test: &str) -> Fixture {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let path = state_dir().join("kubeconfig");
        let client = runtime.block_on(async {
            let file = kube::config::Kubeconfig::read_from(&path).expect("the admin kubeconfig");
            let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .expect("a client config");
            kube::Client::try_from(config).expect("a client")
        });
        let fixture = Fixture {
            runtime,
            client,
            // Unique per run: a namespace being deleted by an earlier run takes seconds to go.
            namespace: format!("t-{test}-{}", std::process::id()),
            nodes: Vec::new(),
        };
        let namespaces: Api<Namespace> = Api::all(fixture.client.clone());
        let ns = serde_json::from_value(json!({ "metadata": { "name": fixture.namespace } }))
            .expect("a Namespace");
        fixture
            .runtime
            .block_on(namespaces.create(&PostParams::default(), &ns))
            .expect("the test's namespace");
        fixture
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A kwok GPU node with `gpus` H100s, named `<namespace>-<suffix>`.
    fn gpu_node(&mut self, suffix: &str, gpus: u32) -> String {
        self.node_with(suffix, H100, json!({ "nvidia.com/gpu": gpus.to_string() }))
    }

    /// A kwok node of GPU product `product` with the GPU resources `gpus` (a JSON object of
    /// quantities), named `<namespace>-<suffix>`.
    fn node_with(&mut self, suffix: &str, product: &str, gpus: serde_json::Value) -> String {
        let name = format!("{}-{suffix}", self.namespace);
        let mut capacity = json!({ "cpu": "64", "memory": "512Gi", "pods": "110" });
        if let (Some(c), Some(g)) = (capacity.as_object_mut(), gpus.as_object()) {
            c.extend(g.clone());
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": { "kwok.x-k8s.io/node": "fake" },
                "labels": { "type": "kwok", "kubernetes.io/hostname": name,
                            "nvidia.com/gpu.product": product,
                            "topology.kubernetes.io/zone": "zone-a" }
            },
            "status": { "capacity": capacity, "allocatable": capacity }
        }))
        .expect("a Node");
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.runtime.block_on(nodes.create(&PostParams::default(), &node)).expect("node created");
        self.nodes.push(name.clone());
        name
    }

    fn cordon(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({ "spec": { "unschedulable": true } });
        self.runtime
            .block_on(nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)))
            .expect("node cordoned");
    }

    fn create_pod(&self, pod: serde_json::Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).expect("a Pod");
        self.runtime
            .block_on(self.pods().create(&PostParams::default(), &pod))
            .expect("pod created")
    }

    fn create_job(&self, job: serde_json::Value) {
        let job: Job = serde_json::from_value(job).expect("a Job");
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        self.runtime.block_on(jobs.create(&PostParams::default(), &job)).expect("job created");
    }

    fn pod(&self, name: &str) -> Option<Pod> {
        self.runtime.block_on(self.pods().get_opt(name)).expect("pod read")
    }

    /// The node the pod is bound to, once it is (at most 10 s).
    fn bound_node(&self, name: &str) -> String {
        wait_for(&format!("pod {name} bound"), Duration::from_secs(10), || {
            self.pod(name).and_then(|p| p.spec?.node_name)
        })
    }

    fn delete_pod(&self, name: &str) {
        let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        self.runtime.block_on(self.pods().delete(name, &params)).expect("pod deleted");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let nodes: Api<Node> = Api::all(self.client.clone());
        // Pods first, at once: a pod left on a deleted node has no kubelet (kwok) to finish it
        // and would hold its namespace in Terminating.
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::background() };
        let _ = self.runtime.block_on(self.pods().delete_collection(&now, &Default::default()));
        let params = DeleteParams::background();
        let _ = self.runtime.block_on(namespaces.delete(&self.namespace, &params));
        for node in &self.nodes {
            let _ = self.runtime.block_on(nodes.delete(node, &params));
        }
    }
}

/// Asks `probe` every 200 ms until it answers, at most `limit`.
#[allow(clippy::disallowed_methods, reason = "waits on a real cluster, in real time")]
fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < until, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn news(backend: &mut KubernetesBackend) -> ClusterNews {
    backend.watch_cluster().expect("watch_cluster")
}

fn foreign_in(news: &ClusterNews, namespace: &str) -> Vec<ForeignWork> {
    news.foreign.iter().filter(|w| w.project == namespace).cloned().collect()
}

fn launch_adopting(workload: u64, handle: &str, node: &str, gpus: u32) -> Launch {
    Launch {
        run: RunId { workload, attempt: 1 },
        command: Vec::new(),
        env: BTreeMap::new(),
        members: vec![MemberLaunch {
            node: node.to_string(),
            devices: (0..gpus)
                .map(|index| DeviceAssignment {
                    index,
                    uuid: None,
                    vendor: Vendor::Nvidia,
                    shares: 1000,
                })
                .collect(),
        }],
        log_dir: std::env::temp_dir(),
        adopt: Some(handle.to_string()),
        resources: MemberResources::default(),
    }
}

/// Polls until `want` matches an observation, collecting everything seen.
fn poll_until(
    backend: &mut KubernetesBackend,
    seen: &mut Vec<Observation>,
    what: &str,
    want: impl Fn(&Observation) -> bool,
) {
    wait_for(what, Duration::from_secs(30), || {
        seen.extend(backend.poll().expect("poll"));
        seen.iter().any(&want).then_some(())
    });
}

fn allot_pod(name: &str, gpus: &str) -> serde_json::Value {
    json!({
        "metadata": { "name": name, "labels": { "allot.dev/user": "alice" } },
        "spec": {
            "schedulerName": "allot",
            "nodeSelector": { "nvidia.com/gpu.product": H100 },
            "containers": [{ "name": "main", "image": "busybox",
                             "resources": { "limits": { "nvidia.com/gpu": gpus } } }]
        }
    })
}

#[test]
fn inventory_and_node_states() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("inventory");
    let nodes = [fx.gpu_node("gpu-0", 8), fx.gpu_node("gpu-1", 8)];
    let mut backend = backend();
    let ours = |specs: &[allot_core::NodeSpec]| -> Vec<allot_core::NodeSpec> {
        specs.iter().filter(|n| nodes.contains(&n.name)).cloned().collect()
    };
    let specs = ours(&backend.inventory().expect("inventory"));
    assert_eq!(specs.len(), 2);
    assert_eq!(specs.iter().map(|n| n.devices.len()).sum::<usize>(), 16);
    assert!(specs.iter().flat_map(|n| &n.devices).all(|d| d.model == H100));
    assert_eq!(specs[0].pool.as_deref(), Some("zone-a"));
    assert_eq!(specs[0].cpu_millis, 64_000);
    assert_eq!(specs[0].memory_mib, 512 * 1024);

    // kwok reports the nodes Ready; then one is cordoned.
    wait_for("both nodes usable", Duration::from_secs(30), || {
        let states = news(&mut backend).nodes;
        let usable = states.iter().filter(|s| nodes.contains(&s.node) && s.usable).count();
        (usable == 2).then_some(())
    });
    fx.cordon(&nodes[1]);
    let state = wait_for("the cordoned node unusable", Duration::from_secs(10), || {
        news(&mut backend).nodes.into_iter().find(|s| s.node == nodes[1] && !s.usable)
    });
    assert!(state.reason.contains("cordoned"), "{}", state.reason);
}

#[test]
fn an_allot_pod_is_adopted_bound_and_reported_until_it_completes() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("adopt");
    let node = fx.gpu_node("gpu-0", 8);
    let mut backend = backend();
    wait_for("the node usable", Duration::from_secs(30), || {
        news(&mut backend).nodes.into_iter().find(|s| s.node == node && s.usable)
    });
    // A Job's pod: kwok completes it 2 s after it runs.
    fx.create_job(json!({
        "metadata": { "name": "train" },
        "spec": { "backoffLimit": 0, "template": {
            "metadata": { "annotations": { "pod-complete.stage.kwok.x-k8s.io/delay": "2s" } },
            "spec": {
                "schedulerName": "allot",
                "restartPolicy": "Never",
                "containers": [{ "name": "main", "image": "busybox",
                                 "resources": { "limits": { "nvidia.com/gpu": "2" } } }]
            }
        }}
    }));
    let work = wait_for("the Job's pod as foreign work", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    assert_eq!(work.gpus_per_node, 2);
    assert_eq!(work.nodes, 1);
    assert_eq!(work.user, "default", "no allot.dev/user label: the service account");
    assert!(work.running.is_empty());
    assert_eq!(work.refusal, None);

    let launch = launch_adopting(1, &work.handle, &node, 2);
    backend.launch(&launch).expect("launch");
    backend.launch(&launch).expect("a second launch of the same run does nothing");
    // A single pod's bind is sent by the launch and answered in the background.
    assert_eq!(fx.bound_node(&work.name), node);
    // Adopted: no longer foreign.
    assert!(foreign_in(&news(&mut backend), &fx.namespace).is_empty());

    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    // A restarted daemon finds the run through the pod (still running, or already done).
    let mut restarted = self::backend();
    let recovered = restarted.recover(std::slice::from_ref(&launch)).expect("recover");
    assert!(
        matches!(recovered.first(), Some(Observation::Started { run, .. }) if *run == launch.run),
        "{recovered:?}"
    );
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    let exits: Vec<_> =
        seen.iter().filter(|o| matches!(o, Observation::Exited { .. })).cloned().collect();
    assert_eq!(seen.iter().filter(|o| matches!(o, Observation::Started { .. })).count(), 1);
    assert!(matches!(&exits[..], [Observation::Exited { code: Some(0), .. }]), "{seen:?}");
}

#[test]
fn a_pod_deleted_by_its_user_is_cancelled_and_one_evicted_or_killed_an_exit_without_code() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("stop");
    let node = fx.gpu_node("gpu-0", 8);
    let mut backend = backend();
    for name in ["deleted", "evicted"] {
        fx.create_pod(allot_pod(name, "1"));
    }
    let handle = |name: &str| format!("{}/{name}", fx.namespace);
    let deleted = launch_adopting(1, &handle("deleted"), &node, 1);
    let evicted = launch_adopting(2, &handle("evicted"), &node, 1);
    let mut evicted_launch = evicted.clone();
    evicted_launch.members[0].devices[0].index = 1;
    backend.launch(&deleted).expect("launch");
    backend.launch(&evicted_launch).expect("launch");
    let mut seen = Vec::new();
    wait_for("both Started", Duration::from_secs(30), || {
        seen.extend(backend.poll().expect("poll"));
        let started = seen.iter().filter(|o| matches!(o, Observation::Started { .. })).count();
        (started == 2).then_some(())
    });
    // A pod that takes 60 s to go once evicted: Kill does not wait for it.
    let mut slow = allot_pod("slow", "1");
    slow["metadata"]["annotations"] = json!({ "pod-delete.stage.kwok.x-k8s.io/delay": "60s" });
    slow["spec"]["terminationGracePeriodSeconds"] = json!(60);
    fx.create_pod(slow);
    let mut killed = launch_adopting(3, &handle("slow"), &node, 1);
    killed.members[0].devices[0].index = 2;
    backend.launch(&killed).expect("launch");
    poll_until(
        &mut backend,
        &mut seen,
        "the slow pod Started",
        |o| matches!(o, Observation::Started { run, .. } if *run == killed.run),
    );
    backend.signal(killed.run, StopSignal::Terminate).expect("eviction");
    std::thread::sleep(Duration::from_secs(1));
    let terminating = fx.pod("slow").expect("still there: its grace is 60 s");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    backend.signal(killed.run, StopSignal::Kill).expect("kill");
    poll_until(
        &mut backend,
        &mut seen,
        "the killed pod Exited",
        |o| matches!(o, Observation::Exited { run, .. } if *run == killed.run),
    );

    fx.delete_pod("deleted");
    backend.signal(evicted.run, StopSignal::Checkpoint).expect("checkpoint: nothing to deliver");
    backend.signal(evicted.run, StopSignal::Terminate).expect("eviction");
    wait_for("both Exited", Duration::from_secs(30), || {
        seen.extend(backend.poll().expect("poll"));
        let exited = |r: RunId| {
            seen.iter().any(|o| {
                matches!(o, Observation::Exited { run, .. } | Observation::Cancelled { run, .. }
                    if *run == r)
            })
        };
        (exited(deleted.run) && exited(evicted.run)).then_some(())
    });
    let exit_of = |run: RunId| {
        seen.iter()
            .find_map(|o| match o {
                Observation::Exited { run: r, code, detail } if *r == run => {
                    Some((*code, detail.clone()))
                }
                _ => None,
            })
            .expect("an exit")
    };
    let cancelled = seen.iter().find_map(|o| match o {
        Observation::Cancelled { run, detail } if *run == deleted.run => Some(detail.clone()),
        _ => None,
    });
    assert_eq!(cancelled.as_deref(), Some("pod deleted outside allot (kubectl delete)"));
    assert_eq!(exit_of(evicted.run), (None, "pod evicted by allot".to_string()));
    // Signals to a run that ended do nothing.
    backend.signal(evicted.run, StopSignal::Kill).expect("kill after the end");
    assert!(matches!(
        backend.signal(RunId { workload: 99, attempt: 1 }, StopSignal::Kill),
        Err(BackendError::UnknownRun { .. })
    ));
}

#[test]
fn gpu_pods_of_other_schedulers_are_occupied_capacity() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("beside");
    let node = fx.gpu_node("gpu-0", 8);
    fx.create_pod(json!({
        "metadata": { "name": "inference" },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "main", "image": "busybox",
                             "resources": { "limits": { "nvidia.com/gpu": "4" } } }]
        }
    }));
    // allot's pod bound without a launch (by a daemon before its restart): running foreign work.
    let mut orphan = allot_pod("orphan", "2");
    orphan["spec"]["nodeName"] = json!(node);
    fx.create_pod(orphan);
    let mut backend = backend();
    let news = news(&mut backend);
    let orphan = foreign_in(&news, &fx.namespace);
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    assert_eq!(orphan[0].running.len(), 1);
    let indices: Vec<u32> = orphan[0].running[0].devices.iter().map(|d| d.index).collect();
    assert_eq!(indices, vec![4, 5], "after the 4 the other scheduler's pod holds");
    let beside = news
        .beside
        .iter()
        .find(|w| w.handle.starts_with(&format!("{}/inference@", fx.namespace)))
        .expect("the pod beside allot");
    assert_eq!(beside.running.len(), 1);
    assert_eq!(beside.running[0].node, node);
    let indices: Vec<u32> = beside.running[0].devices.iter().map(|d| d.index).collect();
    assert_eq!(indices, vec![0, 1, 2, 3]);
}

#[test]
fn waiting_reasons_show_on_the_pod_and_cancel_deletes_it() {
    if !enabled() {
        return;
    }
    let fx = Fixture::new("explain");
    fx.create_pod(allot_pod("waiting", "2"));
    let handle = format!("{}/waiting", fx.namespace);
    let mut backend = backend();
    let reason = "quota: the project has 0 of 2 GPUs free".to_string();
    backend
        .explain_waiting(&[(Waiting::Foreign(handle.clone()), reason.clone())])
        .expect("explain_waiting");
    let pod = fx.pod("waiting").expect("the pod");
    let condition = pod
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .expect("a PodScheduled condition");
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason.as_deref(), Some("AllotWaiting"));
    assert_eq!(condition.message, Some(format!("allot: {reason}")));
    let events = fx.events_of("waiting");
    assert_eq!(
        events,
        vec![("Normal".to_string(), "AllotWaiting".to_string(), format!("allot: {reason}"))]
    );
    // A pod gone meanwhile is skipped.
    backend
        .explain_waiting(&[(Waiting::Foreign(format!("{}/gone", fx.namespace)), reason)])
        .expect("a gone pod is skipped");

    assert!(backend.cancel_foreign(&handle).expect("cancel"));
    wait_for("the pod deleted", Duration::from_secs(30), || {
        fx.pod("waiting").is_none().then_some(())
    });
    assert!(!backend.cancel_foreign(&handle).expect("cancel of a gone pod"));
}

#[test]
fn mig_slices_are_inventory_a_slice_pod_asks_for_them_and_two_kinds_are_refused() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("mig");
    let a100 = "NVIDIA-A100-SXM4-80GB";
    let gpus = json!({ "nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7" });
    let node = fx.node_with("gpu-m", a100, gpus);
    let mut backend = backend();
    let inventory = backend.inventory().expect("inventory");
    let spec = inventory.iter().find(|n| n.name == node).expect("the MIG node");
    let slice = format!("{a100}-MIG-1g.10gb");
    assert_eq!(spec.devices.iter().filter(|d| d.model == slice).count(), 7, "{spec:?}");
    assert_eq!(spec.devices[0].model, a100);

    let mut pod = allot_pod("slices", "1");
    pod["spec"]["nodeSelector"] = json!({ "nvidia.com/gpu.product": a100 });
    pod["spec"]["containers"][0]["resources"]["limits"] = json!({ "nvidia.com/mig-1g.10gb": "2" });
    fx.create_pod(pod.clone());
    pod["metadata"]["name"] = json!("both");
    pod["spec"]["containers"][0]["resources"]["limits"] =
        json!({ "nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1" });
    fx.create_pod(pod);
    let work = wait_for("both pods as work", Duration::from_secs(30), || {
        Some(foreign_in(&news(&mut backend), &fx.namespace)).filter(|w| w.len() == 2)
    });
    let by_name = |name: &str| work.iter().find(|w| w.name == name).expect("the pod's work");
    let slices = by_name("slices");
    assert_eq!((slices.gpus_per_node, slices.refusal.as_deref()), (2, None));
    assert_eq!(slices.models, [slice]);
    let refusal = by_name("both").refusal.clone().expect("refused");
    assert!(refusal.contains("both nvidia.com/gpu and nvidia.com/mig-1g.10gb"), "{refusal}");

    // Admitted onto two slices: the pod is bound. A run of allot's own placed on slices asks
    // for the slices' resource.
    let slice_devices = |indices: &[u32]| -> Vec<DeviceAssignment> {
        let gpu =
            |&index| DeviceAssignment { index, uuid: None, vendor: Vendor::Nvidia, shares: 1000 };
        indices.iter().map(gpu).collect()
    };
    let mut launch = launch_members(1, &slices.handle, &[&node], 0);
    launch.members[0].devices = slice_devices(&[3, 4]);
    backend.launch(&launch).expect("launch");
    assert_eq!(fx.bound_node("slices"), node);
    let mut submitted = launch_members(2, "", &[&node], 0);
    submitted.adopt = None;
    submitted.command = vec!["sleep".into(), "60".into()];
    submitted.env.insert("ALLOT_PROJECT".into(), fx.namespace.clone());
    submitted.members[0].devices = slice_devices(&[5]);
    let mut own = own_backend();
    own.launch(&submitted).expect("launch");
    let pod = fx.pod(&own::pod_name(submitted.run, 0)).expect("allot's pod");
    let limits = pod.spec.and_then(|s| s.containers[0].resources.clone()?.limits);
    let asked = limits.and_then(|l| l.get("nvidia.com/mig-1g.10gb").cloned());
    assert_eq!(asked.map(|q| q.0), Some("1".to_string()));
}

#[test]
fn submitted_work_without_an_image_and_gangs_of_one_pod_fail_to_launch_with_the_reason() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("refused-launch");
    let node = fx.gpu_node("gpu-0", 8);
    let mut backend = backend();
    let mut submitted = launch_adopting(1, "", &node, 1);
    submitted.adopt = None;
    let mut gang = launch_adopting(2, &format!("{}/x", fx.namespace), &node, 1);
    gang.members.push(gang.members[0].clone());
    backend.launch(&submitted).expect("launch");
    backend.launch(&gang).expect("launch");
    let failed = backend.poll().expect("poll");
    let errors: Vec<&str> = failed
        .iter()
        .filter_map(|o| match o {
            Observation::LaunchFailed { error, .. } => Some(error.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2, "{failed:?}");
    assert!(errors[0].contains("--kubernetes-image IMAGE"), "{}", errors[0]);
    assert!(errors[1].contains("a gang is a pod group"), "{}", errors[1]);
}

#[test]
fn an_api_server_that_does_not_answer_is_unreachable() {
    if !enabled() {
        return;
    }
    // The test cluster's credentials, a port where nothing listens.
    let dir = tempfile_dir("unreachable");
    let text = std::fs::read_to_string(state_dir().join("allot.kubeconfig")).expect("kubeconfig");
    let path = dir.join("kubeconfig");
    let port = std::env::var("API_PORT").unwrap_or_else(|_| "16443".into());
    std::fs::write(&path, text.replace(&format!(":{port}"), ":1")).expect("kubeconfig written");
    let mut backend = KubernetesBackend::connect(KubernetesConfig {
        kubeconfig: Some(path),
        call_timeout: Duration::from_secs(2),
        image: None,
    })
    .expect("credentials read without contacting the server");
    let error = backend.inventory().expect_err("nobody answers");
    assert!(matches!(error, BackendError::Unreachable(_)), "{error:?}");
    assert!(error.is_transient());
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allot-k8s-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    dir
}

/// A pod of group `group` of `size` pods, asking for `gpus` GPUs.
fn group_pod(name: &str, group: &str, size: u32, gpus: &str) -> serde_json::Value {
    let mut pod = allot_pod(name, gpus);
    pod["metadata"]["labels"]["allot.dev/pod-group"] = json!(group);
    pod["metadata"]["annotations"] = json!({ "allot.dev/pod-group-size": size.to_string() });
    pod
}

fn launch_members(workload: u64, handle: &str, nodes: &[&str], gpus: u32) -> Launch {
    let mut launch = launch_adopting(workload, handle, nodes[0], gpus);
    launch.members = nodes
        .iter()
        .map(|n| MemberLaunch { node: n.to_string(), ..launch.members[0].clone() })
        .collect();
    launch
}

impl Fixture {
    /// The Events of pod `name`: (type, reason, message), oldest first.
    fn events_of(&self, name: &str) -> Vec<(String, String, String)> {
        self.events("Pod", name)
    }

    /// The Events of the object `kind`/`name`: (type, reason, message), oldest first.
    fn events(&self, kind: &str, name: &str) -> Vec<(String, String, String)> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let params = kube::api::ListParams::default()
            .fields(&format!("involvedObject.kind={kind},involvedObject.name={name}"));
        let list = self.runtime.block_on(events.list(&params)).expect("events listed");
        list.items
            .into_iter()
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// The pod's PodScheduled condition: (reason, message).
fn scheduled_condition(pod: &Pod) -> Option<(String, String)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
    Some((c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

#[test]
fn a_pod_group_is_bound_all_or_none_and_waits_for_its_missing_pods() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("gang");
    let nodes = [fx.gpu_node("gpu-0", 8), fx.gpu_node("gpu-1", 8), fx.gpu_node("gpu-2", 8)];
    // Another scheduler's pod holds 4 of gpu-2's GPUs.
    fx.create_pod(json!({
        "metadata": { "name": "other" },
        "spec": { "nodeName": nodes[2],
                  "containers": [{ "name": "main", "image": "busybox",
                                   "resources": { "limits": { "nvidia.com/gpu": "4" } } }] }
    }));
    let mut backend = backend();
    // One of two pods: not offered; the pod says why.
    fx.create_pod(group_pod("llm-0", "llm", 2, "8"));
    let waiting = wait_for("the missing pod's reason", Duration::from_secs(10), || {
        let news = news(&mut backend);
        assert!(foreign_in(&news, &fx.namespace).is_empty(), "offered before it is whole");
        fx.pod("llm-0").as_ref().and_then(scheduled_condition)
    });
    assert_eq!(waiting.0, "AllotWaiting");
    assert!(waiting.1.contains("pod group llm has 1 of its 2 pods"), "{}", waiting.1);

    fx.create_pod(group_pod("llm-1", "llm", 2, "8"));
    let work = wait_for("the whole group offered", Duration::from_secs(10), || {
        let work = foreign_in(&news(&mut backend), &fx.namespace);
        (!work.is_empty()).then_some(work)
    });
    let [group] = work.as_slice() else { panic!("one work: {work:?}") };
    assert!(group.handle.starts_with(&format!("{}/group:llm@", fx.namespace)), "{}", group.handle);
    assert_eq!((group.nodes, group.gpus_per_node, group.refusal.as_deref()), (2, 8, None));

    // All: both pods bound to the launch's nodes, started once both run.
    let launch = launch_members(1, &group.handle, &[&nodes[0], &nodes[1]], 8);
    backend.launch(&launch).expect("launch");
    let bound: Vec<Option<String>> = ["llm-0", "llm-1"]
        .iter()
        .map(|n| fx.pod(n).and_then(|p| p.spec).and_then(|s| s.node_name))
        .collect();
    assert_eq!(bound, vec![Some(nodes[0].clone()), Some(nodes[1].clone())]);
    assert!(foreign_in(&news(&mut backend), &fx.namespace).is_empty(), "held by the run");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    // A restarted daemon finds the group's run through its pods.
    let recovered = self::backend().recover(std::slice::from_ref(&launch)).expect("recover");
    assert!(matches!(recovered.as_slice(), [Observation::Started { .. }]), "{recovered:?}");
    // Stopping the run evicts every pod of it.
    backend.signal(launch.run, StopSignal::Terminate).expect("evict the group");
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert!(
        seen.iter().any(|o| matches!(o, Observation::Exited { code: None, detail, .. }
            if detail.contains("llm-0, llm-1") && detail.contains("evicted by allot"))),
        "{seen:?}"
    );

    // None: a second group whose second bind fails (a member placed on no node: the API
    // server refuses that Binding, with a 500 that might as well have been a lost answer) ends
    // with neither pod running: the first, bound, is deleted, and the second with it.
    fx.create_pod(group_pod("big-0", "big", 2, "8"));
    fx.create_pod(group_pod("big-1", "big", 2, "8"));
    let work = wait_for("the second group", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().find(|w| w.name == "big")
    });
    let broken = launch_members(2, &work.handle, &[&nodes[0], ""], 8);
    backend.launch(&broken).expect("launch");
    let failed = backend.poll().expect("poll");
    let error = failed
        .iter()
        .find_map(|o| match o {
            Observation::LaunchFailed { run, error } if *run == broken.run => Some(error.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the launch failed: {failed:?}"));
    assert!(error.contains("bind pod") && error.contains("big-1"), "{error}");
    let deleted = format!("deleted {0}/big-0, {0}/big-1 (bound, or perhaps bound", fx.namespace);
    assert!(error.contains(&deleted), "{error}");
    assert!(error.contains("so that none of the group runs"), "{error}");
    wait_for("the group's pods deleted", Duration::from_secs(30), || {
        (fx.pod("big-0").is_none() && fx.pod("big-1").is_none()).then_some(())
    });
}

#[test]
fn pods_that_disagree_or_carry_a_malformed_intent_are_refused_on_the_pod() {
    if !enabled() {
        return;
    }
    let fx = Fixture::new("intent");
    let mut good = allot_pod("serve", "1");
    good["metadata"]["annotations"] = json!({
        "allot.dev/kind": "inference", "allot.dev/max-runtime": "2h",
        "allot.dev/checkpointable": "true", "allot.dev/preemptible": "false"
    });
    good["spec"]["terminationGracePeriodSeconds"] = json!(45);
    fx.create_pod(good);
    let mut bad = allot_pod("typo", "1");
    bad["metadata"]["annotations"] = json!({ "allot.dev/max-runtime": "2 hours" });
    fx.create_pod(bad);
    fx.create_pod(group_pod("mixed-0", "mixed", 2, "8"));
    fx.create_pod(group_pod("mixed-1", "mixed", 2, "4"));
    let mut backend = backend();
    let work = foreign_in(&news(&mut backend), &fx.namespace);
    let find = |name: &str| work.iter().find(|w| w.name == name).cloned().expect(name);
    let serve = find("serve");
    assert_eq!(serve.refusal, None);
    assert_eq!(serve.intent.kind.as_deref(), Some("inference"));
    assert_eq!(serve.intent.max_runtime_s, Some(7200));
    assert_eq!(serve.intent.checkpoint_grace_s, Some(45));
    assert_eq!(serve.intent.preemptible, Some(false));
    let typo = find("typo").refusal.expect("refused");
    assert!(
        typo.starts_with("annotation allot.dev/max-runtime is \"2 hours\": not a duration"),
        "{typo}"
    );
    let mixed = find("mixed").refusal.expect("refused");
    assert!(mixed.contains("disagree on the GPUs each asks for"), "{mixed}");
    for (pod, want) in [("typo", typo), ("mixed-0", mixed.clone()), ("mixed-1", mixed)] {
        let shown = fx.pod(pod).as_ref().and_then(scheduled_condition).expect("a condition");
        assert_eq!(shown, ("AllotRefused".to_string(), format!("allot: {want}")), "{pod}");
    }
    assert_eq!(fx.pod("serve").as_ref().and_then(scheduled_condition), None, "nothing to say");
    // The same as a Warning Event of the pod, once (a later watch finds it said).
    let _ = news(&mut backend);
    let events = fx.events_of("typo");
    let [(kind, reason, message)] = events.as_slice() else { panic!("one event: {events:?}") };
    assert_eq!((kind.as_str(), reason.as_str()), ("Warning", "AllotRefused"));
    assert!(message.starts_with("allot: annotation allot.dev/max-runtime"), "{message}");
}

/// kubectl of the test cluster's cache (scripts/k8s-cluster.sh builds it there).
fn kubectl_path() -> PathBuf {
    let cache = PathBuf::from(
        std::env::var("ALLOT_K8S_CACHE").unwrap_or_else(|_| "/var/cache/allot-k8s".into()),
    );
    std::fs::read_dir(cache.join("bin"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join("kubectl"))
        .find(|p| p.exists())
        .expect("kubectl under $ALLOT_K8S_CACHE/bin (scripts/k8s-cluster.sh build)")
}

/// kubectl as the admin: (exit success, stdout, stderr).
fn kubectl(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(kubectl_path())
        .arg(format!("--kubeconfig={}", state_dir().join("kubeconfig").display()))
        .args(args)
        .output()
        .expect("kubectl runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Removes what deploy/kubernetes made, but the ClusterRole (the test user holds it too).
struct Deployed;

impl Drop for Deployed {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "namespace", "allot", "--wait=false"]);
        let _ = kubectl(&["delete", "clusterrolebinding", "allot", "--ignore-not-found"]);
    }
}

#[test]
fn the_deployment_manifests_are_accepted_and_grant_allot_exactly_what_it_calls() {
    if !enabled() {
        return;
    }
    let manifests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes");
    // A namespace an earlier run deleted may still be terminating: nothing can be made in it.
    wait_for("namespace allot of an earlier run gone", Duration::from_secs(90), || {
        let (exists, _, _) = kubectl(&["get", "namespace", "allot"]);
        (!exists).then_some(())
    });
    let _deployed = Deployed;
    let (ok, out, err) = kubectl(&["apply", "-k", &manifests.display().to_string()]);
    assert!(ok, "kubectl apply -k deploy/kubernetes: {out}\n{err}");
    for object in [
        "serviceaccount/allot",
        "configmap/allot-policy",
        "persistentvolumeclaim/allot-data",
        "deployment/allot",
        "service/allot",
    ] {
        let (ok, _, err) = kubectl(&["-n", "allot", "get", object]);
        assert!(ok, "{object}: {err}");
    }
    // What the backend calls (lib.rs), and a sample of what it must not be able to do.
    let allowed: &[&[&str]] = &[
        &["list", "nodes"],
        &["watch", "nodes"],
        &["get", "pods", "-n", "research"],
        &["list", "pods", "--all-namespaces"],
        &["watch", "pods", "--all-namespaces"],
        &["delete", "pods", "-n", "research"],
        &["create", "pods", "-n", "research"],
        &["create", "pods", "--subresource=binding", "-n", "research"],
        &["create", "pods", "--subresource=eviction", "-n", "research"],
        &["patch", "pods", "--subresource=status", "-n", "research"],
        &["create", "events", "-n", "research"],
        &["list", "jobs.batch", "--all-namespaces"],
        &["watch", "jobs.batch", "--all-namespaces"],
        &["get", "jobs.batch", "-n", "research"],
        &["patch", "jobs.batch", "-n", "research"],
        &["delete", "jobs.batch", "-n", "research"],
        &["list", "jobsets.jobset.x-k8s.io", "--all-namespaces"],
        &["watch", "jobsets.jobset.x-k8s.io", "--all-namespaces"],
        &["get", "jobsets.jobset.x-k8s.io", "-n", "research"],
        &["patch", "jobsets.jobset.x-k8s.io", "-n", "research"],
        &["delete", "jobsets.jobset.x-k8s.io", "-n", "research"],
    ];
    let denied: &[&[&str]] = &[
        &["delete", "nodes"],
        &["patch", "nodes"],
        &["update", "pods", "-n", "research"],
        &["patch", "pods", "-n", "research"],
        &["create", "pods", "--subresource=exec", "-n", "research"],
        &["get", "secrets", "-n", "research"],
        &["list", "secrets", "--all-namespaces"],
        &["get", "configmaps", "-n", "research"],
        &["patch", "events", "-n", "research"],
        &["create", "deployments", "-n", "research"],
        &["create", "jobs.batch", "-n", "research"],
        &["update", "jobs.batch", "-n", "research"],
        &["create", "jobsets.jobset.x-k8s.io", "-n", "research"],
        &["create", "clusterrolebindings"],
    ];
    // The deployment's ServiceAccount and the test user hold the same ClusterRole.
    for who in ["system:serviceaccount:allot:allot", "allot"] {
        for (check, want) in
            allowed.iter().map(|c| (c, "yes")).chain(denied.iter().map(|c| (c, "no")))
        {
            let mut args = vec!["auth", "can-i", "--as", who];
            args.extend_from_slice(check);
            let (_, answer, err) = kubectl(&args);
            assert_eq!(answer, want, "{who} {check:?}: {err}");
        }
    }
}

#[test]
fn a_restarted_daemon_binds_the_rest_of_a_group_it_had_bound_in_part() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("regang");
    let nodes = [fx.gpu_node("gpu-0", 8), fx.gpu_node("gpu-1", 8)];
    fx.create_pod(group_pod("w-0", "job", 2, "8"));
    fx.create_pod(group_pod("w-1", "job", 2, "8"));
    let mut backend = backend();
    let work = wait_for("the group", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    let launch = launch_members(1, &work.handle, &[&nodes[0], &nodes[1]], 8);
    // The daemon bound w-1 to its member's node and stopped before it bound w-0.
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": "w-1" },
        "target": { "apiVersion": "v1", "kind": "Node", "name": nodes[1] }
    });
    fx.runtime
        .block_on(fx.pods().create_subresource::<_, serde_json::Value>(
            "binding",
            "w-1",
            &PostParams::default(),
            &binding,
        ))
        .expect("w-1 bound");
    let mut restarted = self::backend();
    let recovered = restarted.recover(std::slice::from_ref(&launch)).expect("recover");
    assert!(recovered.is_empty(), "neither pod runs yet: {recovered:?}");
    let node_of = |name: &str| fx.pod(name).and_then(|p| p.spec).and_then(|s| s.node_name);
    assert_eq!(node_of("w-0"), Some(nodes[0].clone()));
    assert_eq!(node_of("w-1"), Some(nodes[1].clone()));
    let mut seen = Vec::new();
    poll_until(&mut restarted, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
}

#[test]
fn a_pod_with_scheduling_gates_waits_for_them_to_be_removed() {
    if !enabled() {
        return;
    }
    let fx = Fixture::new("gated");
    let mut gated = allot_pod("gated", "1");
    gated["spec"]["schedulingGates"] = json!([{ "name": "example.com/quota-check" }]);
    fx.create_pod(gated);
    let mut backend = backend();
    assert!(foreign_in(&news(&mut backend), &fx.namespace).is_empty(), "not offered while gated");
    let shown = fx.pod("gated").as_ref().and_then(scheduled_condition);
    assert_eq!(shown.map(|(reason, _)| reason).as_deref(), Some("SchedulingGated"), "left as is");
    // Whoever set the gate removes it: the pod is allot's to place.
    let patch = json!({ "spec": { "schedulingGates": [] } });
    fx.runtime
        .block_on(fx.pods().patch("gated", &PatchParams::default(), &Patch::Merge(&patch)))
        .expect("gate removed");
    // The view sees the change through its watch, a moment later.
    let work = wait_for("the pod offered once ungated", Duration::from_secs(10), || {
        let work = foreign_in(&news(&mut backend), &fx.namespace);
        (!work.is_empty()).then_some(work)
    });
    assert_eq!(work.len(), 1, "{work:?}");
    assert_eq!(work[0].refusal, None);
}

#[test]
fn the_view_sees_pods_come_and_go_through_its_watch_without_listing_again() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("watchview");
    let node = fx.gpu_node("gpu-0", 8);
    let mut backend = backend();
    wait_for("the node usable", Duration::from_secs(30), || {
        news(&mut backend).nodes.into_iter().find(|s| s.node == node && s.usable)
    });
    let lists = backend.lists();
    assert_eq!(lists, 4, "one LIST each of nodes, pods, Jobs and JobSets");
    // Nothing changed since the last read: no news, not an empty cluster.
    let quiet = news(&mut backend);
    assert!(quiet.inventory.is_none() && quiet.nodes.is_empty(), "{quiet:?}");

    fx.create_pod(allot_pod("fresh", "1"));
    let work = wait_for("the new pod as foreign work", Duration::from_secs(10), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    assert_eq!(work.name, "fresh");
    fx.delete_pod("fresh");
    wait_for("the deleted pod gone from the news", Duration::from_secs(10), || {
        let news = news(&mut backend);
        (news.inventory.is_some() && foreign_in(&news, &fx.namespace).is_empty()).then_some(())
    });
    assert_eq!(backend.lists(), lists, "seen through the watch, not a new LIST");
}

#[test]
fn a_view_whose_watch_was_down_lists_again_and_forgets_no_pod_nor_binds_one_twice() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("resync");
    let node = fx.gpu_node("gpu-0", 8);
    fx.create_pod(allot_pod("bound", "1"));
    fx.create_pod(allot_pod("deleted", "1"));
    let mut backend = backend();
    let work = wait_for("both pods as foreign work", Duration::from_secs(30), || {
        let work = foreign_in(&news(&mut backend), &fx.namespace);
        (work.len() == 2).then_some(work)
    });
    let bound = work.iter().find(|w| w.name == "bound").expect("the pod to bind");
    let launch = launch_adopting(1, &bound.handle, &node, 1);
    backend.launch(&launch).expect("launch");
    assert_eq!(fx.bound_node("bound"), node);

    // The watch goes down: reads say so instead of answering from nothing.
    backend.stop_watching();
    let error = backend.watch_cluster().expect_err("no view");
    assert!(matches!(error, BackendError::Unreachable(_)), "{error:?}");
    let lists = backend.lists();
    fx.delete_pod("deleted");
    fx.create_pod(allot_pod("created", "1"));
    backend.start_watching();

    // Listed again: the pod deleted meanwhile is gone, the one created meanwhile is there,
    // the bound one is the run's (not foreign, not bound again).
    let names = wait_for("the pod created meanwhile", Duration::from_secs(30), || {
        let news = backend.watch_cluster().ok()?;
        let names: Vec<String> =
            foreign_in(&news, &fx.namespace).into_iter().map(|w| w.name).collect();
        names.contains(&"created".to_string()).then_some(names)
    });
    assert_eq!(names, ["created"]);
    assert!(backend.lists() > lists, "listed again");
    backend.launch(&launch).expect("the same launch again does nothing");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    assert_eq!(seen.iter().filter(|o| matches!(o, Observation::Started { .. })).count(), 1);
    assert!(!seen.iter().any(|o| matches!(o, Observation::LaunchFailed { .. })), "{seen:?}");
}

#[test]
fn a_bind_names_the_pods_uid_so_a_pod_created_again_under_the_name_is_not_bound() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("rebind");
    let node = fx.gpu_node("gpu-0", 8);
    fx.create_pod(allot_pod("again", "1"));
    let mut backend = backend();
    let work = wait_for("the pod as foreign work", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    // Deleted and created again before the view shows it: the launch (from the view's pod,
    // the old uid) must not bind the new pod.
    backend.stop_watching();
    fx.delete_pod("again");
    fx.create_pod(allot_pod("again", "1"));
    backend.start_watching();
    let launch = launch_adopting(1, &work.handle, &node, 1);
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "LaunchFailed", |o| {
        matches!(o, Observation::LaunchFailed { .. })
    });
    let pod = fx.pod("again").expect("the new pod");
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.clone()), None, "not bound");

    // What the backend relies on when its view is behind: the API server refuses a Binding
    // whose uid is not the pod's (409), and binds none.
    let stale = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": { "name": "again", "namespace": fx.namespace, "uid": work.handle.rsplit('@').next() },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    let answer = fx.runtime.block_on(fx.pods().create_subresource::<_, serde_json::Value>(
        "binding",
        "again",
        &PostParams::default(),
        &stale,
    ));
    assert!(matches!(&answer, Err(kube::Error::Api(s)) if s.code == 409), "{answer:?}");
    let pod = fx.pod("again").expect("the new pod");
    assert_eq!(pod.spec.and_then(|s| s.node_name), None, "still not bound");
}

#[test]
fn a_bind_answered_in_the_background_that_fails_defers_the_launch_and_the_pod_is_offered_again() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("bindfail");
    let _node = fx.gpu_node("gpu-0", 8);
    fx.create_pod(allot_pod("lone", "1"));
    let mut backend = backend();
    let work = wait_for("the pod as foreign work", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    // A member placed on no node: the API server refuses the Binding with a 500, which the
    // backend cannot tell from a lost answer: the launch is deferred, not failed.
    let launch = launch_adopting(1, &work.handle, "", 1);
    backend.launch(&launch).expect("the bind is sent");
    assert!(foreign_in(&news(&mut backend), &fx.namespace).is_empty(), "held while in flight");
    let mut seen = Vec::new();
    poll_until(
        &mut backend,
        &mut seen,
        "LaunchDeferred",
        |o| matches!(o, Observation::LaunchDeferred { run, .. } if *run == launch.run),
    );
    assert!(!seen.iter().any(|o| matches!(o, Observation::Started { .. })), "{seen:?}");
    let again = foreign_in(&news(&mut backend), &fx.namespace);
    assert_eq!(again.len(), 1, "offered again: {again:?}");
    assert_eq!(fx.pod("lone").and_then(|p| p.spec?.node_name), None);
}

#[test]
fn a_view_of_more_pods_than_one_list_page_holds_lists_them_all() {
    if !enabled() {
        return;
    }
    let fx = Fixture::new("pages");
    // More than one page of the view's LIST (500).
    let count = 620;
    for i in 0..count {
        fx.create_pod(allot_pod(&format!("p{i:04}"), "1"));
    }
    let mut backend = backend();
    let work = foreign_in(&news(&mut backend), &fx.namespace);
    assert_eq!(work.len(), count, "every pod, from every page");
    assert_eq!(backend.lists(), 4, "one (paged) LIST of nodes, pods, Jobs and JobSets each");
}

/// A Job queued for allot: labelled, suspended, its pods asking for allot; `width` pods at
/// once of `gpus` GPUs each, each done `delay` after it runs (kwok).
fn queued_job(
    name: &str,
    width: u32,
    completions: u32,
    gpus: &str,
    delay: &str,
) -> serde_json::Value {
    json!({
        "metadata": { "name": name, "labels": { "allot.dev/queue": "default" },
                      "annotations": { "allot.dev/kind": "training" } },
        "spec": { "suspend": true, "parallelism": width, "completions": completions,
                  "backoffLimit": 0, "template": {
            "metadata": { "annotations": { "pod-complete.stage.kwok.x-k8s.io/delay": delay } },
            "spec": {
                "schedulerName": "allot",
                "restartPolicy": "Never",
                "containers": [{ "name": "main", "image": "busybox",
                                 "resources": { "limits": { "nvidia.com/gpu": gpus } } }]
            }
        }}
    })
}

impl Fixture {
    fn job(&self, name: &str) -> Option<Job> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        self.runtime.block_on(jobs.get_opt(name)).expect("job read")
    }

    /// The Job's pods that have not finished: (name, node), by name.
    fn job_pods(&self, job: &str) -> Vec<(String, Option<String>)> {
        self.live_pods(&format!("job-name={job}"))
    }

    /// The pods of label selector `selector` that have not finished: (name, node), by name.
    fn live_pods(&self, selector: &str) -> Vec<(String, Option<String>)> {
        let params = kube::api::ListParams::default().labels(selector);
        let list = self.runtime.block_on(self.pods().list(&params)).expect("pods listed");
        let mut out: Vec<(String, Option<String>)> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .map(|p| (p.metadata.name.unwrap_or_default(), p.spec.and_then(|s| s.node_name)))
            .collect();
        out.sort();
        out
    }
}

fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

#[test]
fn a_queued_job_waits_suspended_is_placed_whole_where_allot_chose_and_completes() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("job");
    let a = fx.gpu_node("gpu-0", 8);
    let b = fx.gpu_node("gpu-1", 8);
    let mut backend = backend();
    // Two pods at once, four in all: the first two finish, the job controller makes two more,
    // and they go where the first ones were.
    fx.create_job(queued_job("train", 2, 4, "4", "2s"));
    let mut refused = queued_job("elsewhere", 1, 1, "1", "2s");
    refused["spec"]["template"]["spec"]["schedulerName"] = json!("default-scheduler");
    fx.create_job(refused);
    let works = wait_for("both Jobs as work", Duration::from_secs(30), || {
        let works = foreign_in(&news(&mut backend), &fx.namespace);
        (works.len() == 2).then_some(works)
    });
    let work = works.iter().find(|w| w.name == "train").expect("train");
    assert!(work.handle.starts_with(&format!("{}/job:train@", fx.namespace)), "{}", work.handle);
    assert_eq!((work.nodes, work.gpus_per_node, work.refusal.as_deref()), (2, 4, None));
    assert_eq!(work.intent.kind.as_deref(), Some("training"));
    let other = works.iter().find(|w| w.name == "elsewhere").expect("elsewhere");
    let why = other.refusal.as_deref().expect("refused");
    assert!(why.contains("spec.template.spec.schedulerName"), "{why}");
    wait_for("the refusal as an Event of the Job", Duration::from_secs(10), || {
        fx.events("Job", "elsewhere")
            .into_iter()
            .find(|(t, r, _)| t == "Warning" && r == "AllotRefused")
    });
    // Suspended: the job controller made no pod.
    assert!(fx.job_pods("train").is_empty());

    let launch = launch_members(1, &work.handle, &[&a, &b], 4);
    backend.launch(&launch).expect("launch");
    let job = fx.job("train").expect("job");
    assert!(!suspended(&job), "resumed");
    let placed = job.metadata.annotations.as_ref().and_then(|a| a.get("allot.dev/placement"));
    assert_eq!(placed, Some(&format!("{a},{b}")));
    assert!(
        !foreign_in(&news(&mut backend), &fx.namespace).iter().any(|w| w.name == "train"),
        "held by the run: not work any more"
    );
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    let exits: Vec<_> =
        seen.iter().filter(|o| matches!(o, Observation::Exited { .. })).cloned().collect();
    assert!(matches!(&exits[..], [Observation::Exited { code: Some(0), .. }]), "{seen:?}");
    // Every pod ran on a node of the placement, at most two on each... one on each at once.
    let params = kube::api::ListParams::default().labels("job-name=train");
    let pods = fx.runtime.block_on(fx.pods().list(&params)).expect("pods").items;
    assert_eq!(pods.len(), 4, "four completions");
    let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
    for p in &pods {
        *per_node
            .entry(p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default())
            .or_default() += 1;
    }
    assert_eq!(per_node, BTreeMap::from([(a.clone(), 2), (b.clone(), 2)]));
}

#[test]
fn a_queued_job_preempted_is_suspended_kept_and_resumed_by_the_next_run() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("jobrq");
    let a = fx.gpu_node("gpu-0", 8);
    let b = fx.gpu_node("gpu-1", 8);
    let mut backend = backend();
    fx.create_job(queued_job("long", 1, 2, "2", "600s"));
    let work = wait_for("the Job as work", Duration::from_secs(30), || {
        foreign_in(&news(&mut backend), &fx.namespace).into_iter().next()
    });
    let first = launch_members(1, &work.handle, &[&a], 2);
    backend.launch(&first).expect("launch");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    assert_eq!(fx.job_pods("long").first().and_then(|(_, n)| n.clone()), Some(a.clone()));

    // Pre-empted with requeue: the Job is suspended (its pod deleted) and kept for run 2.
    let next = RunId { workload: 1, attempt: 2 };
    assert!(backend.requeue(first.run, next).expect("requeue"), "a Job can be kept");
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert!(
        matches!(seen.last(), Some(Observation::Exited { code: None, detail, .. })
            if detail.contains("suspended by allot")),
        "{seen:?}"
    );
    assert!(suspended(&fx.job("long").expect("job")));
    wait_for("its pod gone", Duration::from_secs(30), || {
        fx.job_pods("long").is_empty().then_some(())
    });
    // allot's reason for the wait reaches the kept Job as an Event.
    let why = "waits for 2 GPUs: project over its quota".to_string();
    backend.explain_waiting(&[(Waiting::Kept(next), why.clone())]).expect("explained");
    let events = fx.events("Job", "long");
    assert!(
        events.iter().any(|(t, r, m)| t == "Normal" && r == "AllotWaiting" && m.contains(&why)),
        "{events:?}"
    );

    // Its user widens it while it waits: the admitted size no longer fits; the launch fails
    // and the Job is told why (an Event), staying suspended.
    let jobs: Api<Job> = Api::namespaced(fx.client.clone(), &fx.namespace);
    let widen = |width: u32| {
        let patch = Patch::Merge(json!({ "spec": { "parallelism": width } }));
        fx.runtime
            .block_on(jobs.patch("long", &PatchParams::default(), &patch))
            .expect("parallelism patched");
    };
    let in_view = |backend: &mut KubernetesBackend, width: u32| {
        wait_for("the Job's width in the view", Duration::from_secs(10), || {
            foreign_in(&news(backend), &fx.namespace).into_iter().find(|w| w.nodes == width)
        });
    };
    widen(2);
    in_view(&mut backend, 2);
    let mut second = launch_members(1, &work.handle, &[&b], 2);
    second.run = next;
    backend.launch(&second).expect("launch");
    let failed = backend.poll().expect("poll");
    assert!(matches!(failed.as_slice(), [Observation::LaunchFailed { .. }]), "{failed:?}");
    assert!(suspended(&fx.job("long").expect("job")));
    let events = fx.events("Job", "long");
    assert!(
        events.iter().any(|(t, r, m)| t == "Warning"
            && r == "AllotRefused"
            && m.contains("allot admitted 1 pods, but it now runs 2")),
        "{events:?}"
    );
    widen(1);
    in_view(&mut backend, 1);

    // Run 2 resumes it elsewhere.
    backend.launch(&second).expect("launch again");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    assert_eq!(fx.job_pods("long").first().and_then(|(_, n)| n.clone()), Some(b.clone()));

    // A restarted daemon finds run 2 through the Job; a stop suspends it again.
    let mut restarted = self::backend();
    let recovered = restarted.recover(std::slice::from_ref(&second)).expect("recover");
    assert!(
        matches!(recovered.first(), Some(Observation::Started { run, .. }) if *run == next),
        "{recovered:?}"
    );
    restarted.signal(next, StopSignal::Terminate).expect("stop");
    let mut seen = Vec::new();
    poll_until(&mut restarted, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert!(suspended(&fx.job("long").expect("job")));
    // Cancelled through allot while no run holds it: the Job is deleted.
    assert!(restarted.cancel_foreign(&work.handle).expect("cancel"));
    wait_for("the Job gone", Duration::from_secs(30), || fx.job("long").is_none().then_some(()));
}

/// A JobSet queued for allot: labelled, suspended, one replicated Job `workers` of `replicas`
/// Jobs of one pod each asking for `gpus` GPUs and allot, each done `delay` after it runs.
fn queued_jobset(name: &str, replicas: u32, gpus: &str, delay: &str) -> serde_json::Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": { "name": name, "labels": { "allot.dev/queue": "default" },
                      "annotations": { "allot.dev/kind": "training" } },
        "spec": { "suspend": true, "replicatedJobs": [{ "name": "workers", "replicas": replicas,
            "template": { "spec": { "parallelism": 1, "completions": 1, "backoffLimit": 0,
                "template": {
                    "metadata": { "annotations": {
                        "pod-complete.stage.kwok.x-k8s.io/delay": delay } },
                    "spec": { "schedulerName": "allot", "restartPolicy": "Never",
                              "containers": [{ "name": "main", "image": "busybox",
                                  "resources": { "limits": { "nvidia.com/gpu": gpus } } }] }
                } } } }] }
    })
}

impl Fixture {
    fn jobsets(&self) -> Api<kube::api::DynamicObject> {
        let resource =
            kube::api::ApiResource::erase::<allot_backend_kubernetes::jobset::JobSet>(&());
        Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
    }

    fn create_jobset(&self, jobset: serde_json::Value) {
        let object: kube::api::DynamicObject = serde_json::from_value(jobset).expect("a JobSet");
        self.runtime
            .block_on(self.jobsets().create(&PostParams::default(), &object))
            .expect("jobset created (is the JobSet controller up? scripts/k8s-cluster.sh up)");
    }

    /// `spec.suspend` of the JobSet, `None` once it is gone.
    fn jobset_suspended(&self, name: &str) -> Option<bool> {
        let got = self.runtime.block_on(self.jobsets().get_opt(name)).expect("jobset read")?;
        Some(got.data["spec"]["suspend"].as_bool() == Some(true))
    }

    /// The JobSet's pods that have not finished: (name, node), by name.
    fn jobset_pods(&self, jobset: &str) -> Vec<(String, Option<String>)> {
        self.live_pods(&format!("jobset.sigs.k8s.io/jobset-name={jobset}"))
    }
}

#[test]
fn a_queued_jobset_is_one_gang_placed_whole_completed_preempted_kept_and_resumed() {
    if !enabled() {
        return;
    }
    let mut fx = Fixture::new("jobset");
    let a = fx.gpu_node("gpu-0", 8);
    let b = fx.gpu_node("gpu-1", 8);
    let mut backend = backend();
    fx.create_jobset(queued_jobset("quick", 2, "4", "2s"));
    fx.create_jobset(queued_jobset("long", 2, "4", "600s"));
    let mut unlike = queued_jobset("unlike", 1, "4", "2s");
    let mut driver = unlike["spec"]["replicatedJobs"][0].clone();
    driver["name"] = json!("driver");
    driver["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    unlike["spec"]["replicatedJobs"].as_array_mut().expect("jobs").push(driver);
    fx.create_jobset(unlike);
    let works = wait_for("the three JobSets as work", Duration::from_secs(30), || {
        let works = foreign_in(&news(&mut backend), &fx.namespace);
        (works.len() == 3).then_some(works)
    });
    let by_name = |name: &str| works.iter().find(|w| w.name == name).expect(name).clone();
    let (quick, long) = (by_name("quick"), by_name("long"));
    assert!(quick.handle.starts_with(&format!("{}/jobset:quick@", fx.namespace)));
    assert_eq!((quick.nodes, quick.gpus_per_node, quick.refusal.as_deref()), (2, 4, None));
    assert_eq!(quick.intent.kind.as_deref(), Some("training"));
    let why = by_name("unlike").refusal.expect("refused");
    assert!(why.contains("same GPU request"), "{why}");
    wait_for("the refusal as an Event of the JobSet", Duration::from_secs(10), || {
        fx.events("JobSet", "unlike")
            .into_iter()
            .find(|(t, r, m)| t == "Warning" && r == "AllotRefused" && m.contains("driver"))
    });
    // Suspended: its Jobs are suspended too, and no pod is made.
    assert!(fx.jobset_pods("quick").is_empty());

    // Admitted onto both nodes: resumed, its two pods bound one on each, and it completes.
    let first = launch_members(1, &quick.handle, &[&a, &b], 4);
    backend.launch(&first).expect("launch");
    assert_eq!(fx.jobset_suspended("quick"), Some(false));
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    let placed: Vec<Option<String>> = wait_for("both pods bound", Duration::from_secs(10), || {
        let pods = fx.jobset_pods("quick");
        (pods.len() == 2 && pods.iter().all(|(_, n)| n.is_some()))
            .then(|| pods.into_iter().map(|(_, n)| n).collect::<Vec<_>>())
    });
    let mut placed: Vec<String> = placed.into_iter().flatten().collect();
    placed.sort();
    assert_eq!(placed, [a.clone(), b.clone()]);
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert!(
        matches!(seen.last(), Some(Observation::Exited { code: Some(0), detail, .. })
            if detail.contains("Complete")),
        "{seen:?}"
    );

    // The long one, pre-empted with requeue: suspended, its pods deleted, kept for run 2.
    let run = launch_members(2, &long.handle, &[&a, &b], 4);
    backend.launch(&run).expect("launch");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    let next = RunId { workload: 2, attempt: 2 };
    assert!(backend.requeue(run.run, next).expect("requeue"), "a JobSet can be kept");
    poll_until(&mut backend, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert!(
        matches!(seen.last(), Some(Observation::Exited { code: None, detail, .. })
            if detail.contains("jobset") && detail.contains("suspended by allot")),
        "{seen:?}"
    );
    assert_eq!(fx.jobset_suspended("long"), Some(true));
    wait_for("its pods gone", Duration::from_secs(30), || {
        fx.jobset_pods("long").is_empty().then_some(())
    });
    let why = "waits for 8 GPUs: project over its quota".to_string();
    backend.explain_waiting(&[(Waiting::Kept(next), why.clone())]).expect("explained");
    let events = fx.events("JobSet", "long");
    assert!(
        events.iter().any(|(t, r, m)| t == "Normal" && r == "AllotWaiting" && m.contains(&why)),
        "{events:?}"
    );
    // Run 2 resumes it, both pods on node b this time.
    let mut second = launch_members(2, &long.handle, &[&b, &b], 4);
    second.run = next;
    backend.launch(&second).expect("launch again");
    let mut seen = Vec::new();
    poll_until(&mut backend, &mut seen, "Started", |o| matches!(o, Observation::Started { .. }));
    wait_for("both pods on b", Duration::from_secs(10), || {
        let pods = fx.jobset_pods("long");
        (pods.len() == 2 && pods.iter().all(|(_, n)| n.as_deref() == Some(b.as_str())))
            .then_some(())
    });

    // A restarted daemon finds run 2 through the JobSet; a stop suspends it again; cancelled
    // through allot while no run holds it, it is deleted.
    let mut restarted = self::backend();
    let recovered = restarted.recover(std::slice::from_ref(&second)).expect("recover");
    assert!(
        matches!(recovered.first(), Some(Observation::Started { run, .. }) if *run == next),
        "{recovered:?}"
    );
    restarted.signal(next, StopSignal::Terminate).expect("stop");
    let mut seen = Vec::new();
    poll_until(&mut restarted, &mut seen, "Exited", |o| matches!(o, Observation::Exited { .. }));
    assert_eq!(fx.jobset_suspended("long"), Some(true));
    assert!(restarted.cancel_foreign(&long.handle).expect("cancel"));
    wait_for("the JobSet gone", Duration::from_secs(30), || {
        fx.jobset_suspended("long").is_none().then_some(())
    });
}

// The backend contract suite on the pods allot makes for work submitted through it (`own`),
// one namespace and kwok node per rule. The "programs" are kwok stages keyed on the pod's
// command (scripts/k8s/program-stages.yaml): `allot-test-exit CODE`, `allot-test-sleep S`.

static HARNESSES: AtomicU32 = AtomicU32::new(0);

struct KubeHarness {
    fx: Fixture,
    node: String,
    dir: tempfile::TempDir,
}

impl KubeHarness {
    fn new() -> KubeHarness {
        let n = HARNESSES.fetch_add(1, Ordering::SeqCst);
        let mut fx = Fixture::new(&format!("contract{n}"));
        let node = fx.gpu_node("gpu", 8);
        // Pods need the namespace's default ServiceAccount, which the controller manager makes.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(fx.client.clone(), &fx.namespace);
        wait_for("the namespace's default ServiceAccount", Duration::from_secs(30), || {
            fx.runtime.block_on(accounts.get_opt("default")).ok().flatten()
        });
        KubeHarness { fx, node, dir: tempfile::tempdir().expect("a temp dir") }
    }
}

impl Harness for KubeHarness {
    type B = KubernetesBackend;

    fn backend(&mut self) -> KubernetesBackend {
        own_backend()
    }
    fn node(&self) -> String {
        self.node.clone()
    }
    fn launch_env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("ALLOT_PROJECT".to_string(), self.fx.namespace.clone())])
    }
    fn program_sleep(&self, seconds: u32) -> Vec<String> {
        vec!["allot-test-sleep".to_string(), seconds.to_string()]
    }
    fn program_exit(&self, code: i32) -> Vec<String> {
        vec!["allot-test-exit".to_string(), code.to_string()]
    }
    fn settle(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
    }
    fn tmp_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

// Not here, because Kubernetes has no such thing: `missing_program_fails_launch` (the
// kubelet finds the program missing, and no kubelet runs here), `checkpoint_reaches_program`
// (Kubernetes delivers no signal to a running pod: its checkpoint is its preStop hook within
// the grace of the eviction), `kill_ends_run_that_ignores_terminate` (there is no process to
// ignore it: an evicted pod goes when its grace ends). `recover_after_restart` is replaced by
// `recover_after_restart_with_the_pods_exit_codes` below.
allot_backend::contract_tests!(KubeHarness::new(), |_: &str| enabled();
    launch_reports_started_once,
    launch_twice_is_idempotent,
    exit_code_is_reported,
    terminate_ends_sleeping_run,
    signal_after_exit_is_ok,
    signal_unknown_run_is_an_error,
    poll_reports_each_observation_once,
    recover_reports_learned_exit_code,
    launch_after_restart_adopts,
);

#[test]
fn every_contract_rule_is_run_or_said_why_not() {
    // 9 above, 3 that Kubernetes has no way to keep, and `recover_after_restart`'s variant.
    assert_eq!(contract::rules::<KubeHarness>().len(), 13, "a rule was added: run it here");
}

fn run_id(workload: u64) -> RunId {
    RunId { workload, attempt: 1 }
}

fn own_launch(h: &KubeHarness, run: RunId, command: Vec<String>) -> Launch {
    Launch {
        run,
        command,
        env: h.launch_env(),
        members: vec![MemberLaunch { node: h.node(), devices: Vec::new() }],
        log_dir: h.tmp_dir(),
        adopt: None,
        resources: MemberResources::default(),
    }
}

/// Polls until `done` holds for what was observed; panics after 20 s.
fn poll_seen_until(
    backend: &mut KubernetesBackend,
    seen: &mut Vec<Observation>,
    what: &str,
    done: impl Fn(&[Observation]) -> bool,
) {
    wait_for(what, Duration::from_secs(20), || {
        seen.extend(backend.poll().expect("poll"));
        done(seen).then_some(())
    });
}

fn started(seen: &[Observation], run: RunId) -> bool {
    seen.iter().any(|o| matches!(o, Observation::Started { run: r, .. } if *r == run))
}

/// The contract's `recover_after_restart`, except that a run that ended while the daemon was
/// down is reported with the exit code its pod keeps, not `None` and "unknown" as a backend
/// that cannot learn it must.
#[test]
fn recover_after_restart_with_the_pods_exit_codes() {
    if !enabled() {
        return;
    }
    let mut h = KubeHarness::new();
    let (running, ending, never, unnamed) =
        (run_id(1100), run_id(1101), run_id(1102), run_id(1103));
    let running_launch = own_launch(&h, running, h.program_sleep(60));
    let ending_launch = own_launch(&h, ending, h.program_sleep(3));
    let never_launch = own_launch(&h, never, h.program_sleep(60));
    {
        let mut backend = h.backend();
        for l in [&running_launch, &ending_launch, &own_launch(&h, unnamed, h.program_sleep(3))] {
            backend.launch(l).expect("launch");
        }
        let mut seen = Vec::new();
        poll_seen_until(&mut backend, &mut seen, "three runs Started", |s| {
            started(s, running) && started(s, ending) && started(s, unnamed)
        });
        assert!(seen.iter().all(|o| matches!(o, Observation::Started { .. })), "{seen:#?}");
    }
    h.pass_time(5);
    let mut backend = h.backend();
    let mut seen =
        backend.recover(&[running_launch, ending_launch, never_launch]).expect("recover");
    assert!(
        matches!(seen.as_slice(), [
            Observation::Started { run: a, pids },
            Observation::Exited { run: b, code: Some(0), detail },
            Observation::LaunchFailed { run: c, error },
        ] if *a == running && pids.is_empty() && *b == ending && detail.contains("Succeeded")
            && *c == never && error.contains("never made")),
        "{seen:#?}"
    );
    for _ in 0..10 {
        h.settle();
        seen.extend(backend.poll().expect("poll"));
    }
    assert_eq!(seen.len(), 3, "nothing new before a signal: {seen:#?}");
    backend.signal(running, StopSignal::Terminate).expect("terminate");
    poll_seen_until(&mut backend, &mut seen, "the recovered run to end", |s| s.len() == 4);
    assert!(
        matches!(&seen[3], Observation::Exited { run, code: None, .. } if *run == running),
        "{seen:#?}"
    );
}

/// allot's own pods, as `allot submit` makes them: bound where allot placed them, asking for
/// the member's GPUs, never offered back as foreign work, and, to a daemon that lost track of
/// them, occupied capacity; a pod its user deletes cancels the run; where a pod's name is taken
/// by another pod, the launch fails saying why.
#[test]
fn submitted_work_runs_as_pods_allot_makes_on_the_nodes_it_chose() {
    if !enabled() {
        return;
    }
    let mut h = KubeHarness::new();
    let second = h.fx.gpu_node("gpu-b", 8);
    let gpu = |index| DeviceAssignment { index, uuid: None, vendor: Vendor::Nvidia, shares: 1000 };
    let mut gang = own_launch(&h, run_id(1), h.program_sleep(60));
    gang.members = vec![
        MemberLaunch { node: h.node(), devices: vec![gpu(0), gpu(1)] },
        MemberLaunch { node: second.clone(), devices: vec![gpu(4), gpu(5)] },
    ];
    gang.resources = MemberResources { cpu_millis: 2000, memory_mib: 1024 };
    let mut backend = h.backend();
    backend.launch(&gang).expect("launch");
    let mut seen = Vec::new();
    poll_seen_until(&mut backend, &mut seen, "the gang Started", |s| started(s, gang.run));
    for (member, node) in [(0, h.node()), (1, second.clone())] {
        let pod = h.fx.pod(&own::pod_name(gang.run, member)).expect("the member's pod");
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.clone()), Some(node));
        let limits = pod.spec.as_ref().and_then(|s| s.containers[0].resources.clone());
        let gpus = limits.and_then(|r| r.limits).and_then(|l| l.get("nvidia.com/gpu").cloned());
        assert_eq!(gpus.map(|q| q.0), Some("2".to_string()));
    }
    let on_cluster = news(&mut backend);
    assert!(foreign_in(&on_cluster, &h.fx.namespace).is_empty(), "{on_cluster:#?}");
    assert!(on_cluster.beside.iter().all(|w| w.project != h.fx.namespace), "{on_cluster:#?}");
    // A daemon that has not recovered the run yet counts its pods as occupied GPUs.
    let mut fresh = h.backend();
    let held: Vec<ForeignWork> =
        news(&mut fresh).beside.into_iter().filter(|w| w.project == h.fx.namespace).collect();
    assert_eq!(held.len(), 2, "{held:#?}");
    assert_eq!(held.iter().map(|w| w.running[0].devices.len()).sum::<usize>(), 4);
    drop(fresh);
    // Stopped by allot: both pods evicted, an exit without code.
    backend.signal(gang.run, StopSignal::Terminate).expect("terminate");
    poll_seen_until(&mut backend, &mut seen, "the gang's end", |s| s.len() == 2);
    assert!(matches!(&seen[1], Observation::Exited { code: None, .. }), "{seen:#?}");
    // A pod its user deletes: the run is cancelled.
    let single = own_launch(&h, run_id(4), h.program_sleep(60));
    backend.launch(&single).expect("launch");
    poll_seen_until(&mut backend, &mut seen, "the single run Started", |s| started(s, single.run));
    h.fx.delete_pod(&own::pod_name(single.run, 0));
    poll_seen_until(&mut backend, &mut seen, "the single run's end", |s| s.len() == 4);
    assert!(matches!(&seen[3], Observation::Cancelled { .. }), "{seen:#?}");

    // A pod's name taken by a pod that is not the run's: the launch fails, naming it.
    let run = run_id(2);
    let mut squatter =
        own::pod_for(&own_launch(&h, run_id(3), vec![]), 0, &h.fx.namespace, "x", None);
    squatter.metadata.name = Some(own::pod_name(run, 0));
    h.fx.runtime
        .block_on(h.fx.pods().create(&PostParams::default(), &squatter))
        .expect("the squatter");
    backend.launch(&own_launch(&h, run, h.program_sleep(5))).expect("launch");
    let failed = backend.poll().expect("poll");
    assert!(
        matches!(failed.as_slice(), [Observation::LaunchFailed { error, .. }]
            if error.contains("not this run's")),
        "{failed:#?}"
    );
}
