//! allot as the scheduler of a real Kubernetes control plane (`scripts/k8s-cluster.sh up`:
//! kube-apiserver, kube-controller-manager, kwok), end to end through
//! `allot serve --backend kubernetes`: a pod that asks for `schedulerName: allot` in a
//! namespace the policy names as a project is imported, admitted, bound to a GPU node, and
//! `allot ls` lists it running; a pod group waits for its missing pod, then is placed whole on
//! the nodes another scheduler's pod leaves free; a pod's intent annotations reach its
//! workload, deleting the pod cancels it, and a pod refused for a typo in an annotation is
//! placed once the annotation is corrected in place; a notebook pod that dcgm-exporter's pod
//! labels show idle is reclaimed by the policy's idle rule, its busy neighbour is not; a Job
//! queued for allot borrows in a cohort, survives a `kill -9` and restart of allot, is
//! suspended when the lender claims its guarantee (allot's reason an Event of the Job), and is
//! resumed by its next run when the lender's pod goes; in a cluster of NVIDIA and AMD nodes a
//! pod that names no model gets GPUs of the vendor it asks for, and one that selects a model no
//! node has is refused with the field; MIG slices are placed as devices of their own model,
//! for pods and for work submitted with `allot submit`; work submitted with `allot submit` runs as pods allot
//! makes on the nodes it chose, survives a `kill -9` of allot, and ends with its pods' exit.
//!
//! Runs only with `ALLOT_K8S=1`. Fixtures are made with kubectl and the admin kubeconfig; the
//! daemon uses the least-privilege `allot` user.

#![allow(clippy::print_stderr)] // the skip must be visible in the test output
#![allow(clippy::disallowed_methods)] // waits on a real cluster: real time is the point

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_allot");
const H100: &str = "NVIDIA-H100-80GB-HBM3";
/// The gang test's GPUs: each test's daemon sees every node of the cluster (tests run in
/// parallel), so each test asks for a model only its own nodes have.
const A100: &str = "NVIDIA-A100-SXM4-80GB";
/// The idle test's GPUs.
const L40S: &str = "NVIDIA-L40S";
/// The cohort test's GPUs.
const H200: &str = "NVIDIA-H200";
/// The vendor test's GPUs: an NVIDIA model and an AMD one (a model named `AMD…` is given as
/// `amd.com/gpu` with AMD's product label, see `scene_of`).
const L4: &str = "NVIDIA-L4";
const MI300X: &str = "AMD-Instinct-MI300X";
/// The submit test's GPUs.
const B200: &str = "NVIDIA-B200";
/// The MIG test's GPUs: an A30 node split into 4 × 1g.6gb slices (a model named `P-MIG-PROFILE`
/// is given as `nvidia.com/mig-PROFILE` of product P, see `scene_of`).
const A30_SLICE: &str = "NVIDIA-A30-MIG-1g.6gb";

fn state_dir() -> PathBuf {
    PathBuf::from(std::env::var("ALLOT_K8S_DIR").unwrap_or_else(|_| "/tmp/allot-k8s".into()))
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

/// Runs kubectl as the admin, `stdin` piped in; its stdout.
fn kubectl(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(kubectl_path())
        .arg(format!("--kubeconfig={}", state_dir().join("kubeconfig").display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(text) = stdin
        && let Some(mut pipe) = child.stdin.take()
    {
        pipe.write_all(text.as_bytes()).expect("kubectl's stdin");
    }
    let out = child.wait_with_output().expect("kubectl ends");
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The daemon, and the cluster objects of the test; all gone when dropped.
struct Scene {
    daemon: Option<Child>,
    namespace: String,
    /// The policy's other projects' namespaces.
    others: Vec<String>,
    nodes: Vec<String>,
    data_dir: PathBuf,
    /// `allot serve`'s `--telemetry`.
    telemetry: String,
}

impl Scene {
    /// Starts `allot serve --backend kubernetes` as the least-privilege user on the scene's
    /// data directory and policy: its address, and the admin token on a first start.
    fn serve(&mut self) -> (String, Option<String>) {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--backend", "kubernetes", "--listen", "127.0.0.1:0"])
            .args(["--telemetry", &self.telemetry])
            .args(["--kubernetes-image", "busybox"])
            .arg("--kubeconfig")
            .arg(state_dir().join("allot.kubeconfig"))
            .arg("--data-dir")
            .arg(self.data_dir.join("data"))
            .arg("--policy")
            .arg(self.data_dir.join("policy.yaml"));
        let (child, addr, token) = common::spawn_serve(command, "http");
        self.daemon = Some(child);
        (addr, token)
    }

    /// `kill -9` of the daemon.
    fn kill(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
        let kube = |args: &[&str]| {
            let _ = Command::new(kubectl_path())
                .arg(format!("--kubeconfig={}", state_dir().join("kubeconfig").display()))
                .args(args)
                .output();
        };
        for namespace in std::iter::once(&self.namespace).chain(&self.others) {
            kube(&["-n", namespace, "delete", "jobsets,jobs", "--all", "--wait=false"]);
            kube(&["-n", namespace, "delete", "pods", "--all", "--grace-period=0", "--force"]);
            kube(&["delete", "namespace", namespace, "--wait=false"]);
        }
        for node in &self.nodes {
            kube(&["delete", "node", node, "--wait=false"]);
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn enabled() -> bool {
    let on = std::env::var("ALLOT_K8S").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped: set ALLOT_K8S=1 with the test cluster up (scripts/k8s-cluster.sh up)");
    }
    on
}

/// `nodes` kwok nodes of 8 GPUs of `model`, a namespace the policy names as a project (8 of
/// them per node guaranteed), and `allot serve --backend kubernetes` as the least-privilege
/// user: the scene, the daemon's address and its admin token.
fn scene(test: &str, nodes: usize, model: &str) -> (Scene, String, String) {
    scene_with(test, nodes, model, "none", "")
}

/// `scene` with `--telemetry telemetry` and `policy_tail` appended to the policy (idle rules).
fn scene_with(
    test: &str,
    nodes: usize,
    model: &str,
    telemetry: &str,
    policy_tail: &str,
) -> (Scene, String, String) {
    let policy = |namespace: &str| {
        format!(
            "projects:
  - name: {namespace}
    quotas:
      - {{model: {model}, guaranteed: {}}}
{policy_tail}",
            8 * nodes
        )
    };
    scene_of(test, nodes, &[model], telemetry, &[], &policy)
}

/// The scene's nodes (node i of 8 GPUs of `models[i % models.len()]`), its namespace and the
/// `others`, the policy (its priority classes, then `policy(namespace)`: the projects are
/// namespaces; quotas by the GPU product label), and the daemon started.
fn scene_of(
    test: &str,
    nodes: usize,
    models: &[&str],
    telemetry: &str,
    others: &[String],
    policy: &dyn Fn(&str) -> String,
) -> (Scene, String, String) {
    let id = std::process::id();
    let mut scene = Scene {
        daemon: None,
        namespace: format!("e2e-{test}-{id}"),
        others: others.to_vec(),
        nodes: (0..nodes).map(|i| format!("e2e-{test}-{id}-gpu-{i}")).collect(),
        data_dir: std::env::temp_dir().join(format!("allot-k8s-e2e-{test}-{id}")),
        telemetry: telemetry.to_string(),
    };
    let mut objects = String::new();
    for namespace in std::iter::once(&scene.namespace).chain(&scene.others) {
        objects.push_str(&format!(
            "---
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
"
        ));
    }
    for (i, node) in scene.nodes.iter().enumerate() {
        let model = models[i % models.len()];
        let vendor = if model.starts_with("AMD") { "amd.com" } else { "nvidia.com" };
        let (product, gpus) = match model.split_once("-MIG-") {
            Some((product, profile)) => (product, format!("nvidia.com/mig-{profile}: \"4\"")),
            None => (model, format!("{vendor}/gpu: \"8\"")),
        };
        objects.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata:
  name: {node}
  annotations: {{kwok.x-k8s.io/node: fake}}
  labels: {{type: kwok, kubernetes.io/hostname: {node}, {vendor}/gpu.product: {product}}}
status:
  capacity: {{cpu: \"64\", memory: 512Gi, pods: \"110\", {gpus}}}
  allocatable: {{cpu: \"64\", memory: 512Gi, pods: \"110\", {gpus}}}
"
        ));
    }
    kubectl(&["apply", "-f", "-"], Some(&objects));
    for node in &scene.nodes {
        kubectl(&["wait", "--for=condition=Ready", &format!("node/{node}"), "--timeout=60s"], None);
    }
    let _ = std::fs::remove_dir_all(&scene.data_dir);
    std::fs::create_dir_all(&scene.data_dir).expect("data dir");
    std::fs::write(
        scene.data_dir.join("policy.yaml"),
        format!(
            "priority_classes:
  - {{name: normal, value: 0, preemptible: true}}
default_priority_class: normal
{}",
            policy(&scene.namespace)
        ),
    )
    .expect("policy written");
    let (addr, token) = scene.serve();
    let token = token.expect("admin token on a first start");
    (scene, addr, token)
}

/// `allot ls --output json`: the workloads.
fn listed(addr: &str, token: &str) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["ls", "--output", "json", "--url", &format!("http://{addr}"), "--token", token])
        .output()
        .expect("allot ls runs");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    listed["workloads"].as_array().cloned().unwrap_or_default()
}

/// The workload whose foreign handle starts with `handle`.
fn foreign<'a>(workloads: &'a [Value], handle: &str) -> Option<&'a Value> {
    workloads.iter().find(|w| {
        w["command"][0] == "foreign"
            && w["command"][1].as_str().is_some_and(|h| h.starts_with(handle))
    })
}

#[test]
fn allot_binds_a_pod_that_asks_for_it_and_lists_it() {
    if !enabled() {
        return;
    }
    let (scene, addr, token) = scene("vision", 1, H100);
    let (namespace, node) = (scene.namespace.clone(), scene.nodes[0].clone());

    kubectl(
        &["-n", &namespace, "apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: train, labels: {{allot.dev/user: alice}}}}
spec:
  schedulerName: allot
  nodeSelector: {{nvidia.com/gpu.product: {H100}}}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{nvidia.com/gpu: \"2\"}}}}
"
        )),
    );
    let started = Instant::now();
    let bound = wait_for("the pod bound by allot", Duration::from_secs(60), || {
        let name = kubectl(
            &["-n", &namespace, "get", "pod", "train", "-o", "jsonpath={.spec.nodeName}"],
            None,
        );
        (!name.is_empty()).then_some(name)
    });
    eprintln!("pod bound by allot {:.1} s after it was created", started.elapsed().as_secs_f64());
    assert_eq!(bound, node);

    // The handle is the pod's, with its uid (a pod created again under the name is new work).
    let handle = format!("{namespace}/train@");
    let work = wait_for("allot ls lists it running", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
    });
    assert_eq!(work["project"], namespace.as_str(), "{work}");
    assert_eq!(work["user"], "alice", "{work}");
}

/// `allot nodes --output json`: the nodes.
fn nodes(addr: &str, token: &str) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["nodes", "--output", "json", "--url", &format!("http://{addr}"), "--token", token])
        .output()
        .expect("allot nodes runs");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    listed["nodes"].as_array().cloned().unwrap_or_default()
}

fn node_of(namespace: &str, pod: &str) -> String {
    kubectl(&["-n", namespace, "get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"], None)
}

/// A pod asking allot for `gpus` A100s, with extra metadata lines (labels, annotations).
fn pod_yaml(name: &str, gpus: u32, metadata: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
{metadata}spec:
  schedulerName: allot
  nodeSelector: {{nvidia.com/gpu.product: {A100}}}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{nvidia.com/gpu: \"{gpus}\"}}}}
"
    )
}

#[test]
fn a_pod_group_is_placed_whole_on_free_nodes_and_intent_and_deletion_reach_allot() {
    if !enabled() {
        return;
    }
    let (scene, addr, token) = scene("gang", 3, A100);
    let namespace = scene.namespace.clone();
    let busy = scene.nodes[1].clone();
    // Another scheduler's pod holds 4 of the middle node's 8 GPUs.
    kubectl(
        &["-n", &namespace, "apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: other}}
spec:
  nodeName: {busy}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{nvidia.com/gpu: \"4\"}}}}
"
        )),
    );
    wait_for("allot sees the other scheduler's GPUs", Duration::from_secs(30), || {
        nodes(&addr, &token)
            .iter()
            .any(|n| {
                n["name"] == busy.as_str()
                    && n["unmanaged"]["devices"].as_array().is_some_and(|d| d.len() == 4)
            })
            .then_some(())
    });

    // A gang of 2 x 8 GPUs: one pod first, then the second; bound together on the free nodes.
    let group =
        "  labels: {allot.dev/pod-group: llm}\n  annotations: {allot.dev/pod-group-size: \"2\"}\n";
    kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&pod_yaml("llm-0", 8, group)));
    let waiting = wait_for("the lone pod's reason", Duration::from_secs(30), || {
        let text = kubectl(
            &[
                "-n",
                &namespace,
                "get",
                "pod",
                "llm-0",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}",
            ],
            None,
        );
        (!text.is_empty()).then_some(text)
    });
    assert!(waiting.contains("has 1 of its 2 pods"), "{waiting}");
    assert_eq!(node_of(&namespace, "llm-0"), "", "not bound alone");
    kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&pod_yaml("llm-1", 8, group)));
    let placed = wait_for("the group bound", Duration::from_secs(60), || {
        let placed = [node_of(&namespace, "llm-0"), node_of(&namespace, "llm-1")];
        placed.iter().all(|n| !n.is_empty()).then_some(placed)
    });
    let mut placed = placed.to_vec();
    placed.sort();
    assert_eq!(placed, vec![scene.nodes[0].clone(), scene.nodes[2].clone()], "not on {busy}");
    let gang = wait_for("the group running in allot", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &format!("{namespace}/group:llm@"))
            .filter(|w| w["state"] == "running")
            .cloned()
    });
    assert_eq!(gang["members"], 2, "{gang}");

    // Intent from annotations; then the user deletes the pod: cancelled, not failed.
    let intent = "  annotations: {allot.dev/kind: inference, allot.dev/max-runtime: 2h}\n";
    kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&pod_yaml("serve", 2, intent)));
    let serve = wait_for("the annotated pod running", Duration::from_secs(60), || {
        foreign(&listed(&addr, &token), &format!("{namespace}/serve@"))
            .filter(|w| w["state"] == "running")
            .cloned()
    });
    assert_eq!(serve["kind"], "inference", "{serve}");
    kubectl(&["-n", &namespace, "delete", "pod", "serve", "--wait=false"], None);
    let gone = wait_for("the deleted pod cancelled", Duration::from_secs(60), || {
        let all = listed(&addr, &token);
        foreign(&all, &format!("{namespace}/serve@")).filter(|w| w["state"] != "running").cloned()
    });
    assert_eq!(gone["state"], "cancelled", "{gone}");
    // The same name again is new work (it was never imported again before handles had uids).
    wait_for("the pod gone", Duration::from_secs(60), || {
        kubectl(&["-n", &namespace, "get", "pods", "-o", "name"], None)
            .lines()
            .all(|l| l != "pod/serve")
            .then_some(())
    });
    // kwok may repeat its delete of the old pod a second later, by name: let it pass.
    std::thread::sleep(Duration::from_secs(3));
    kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&pod_yaml("serve", 2, intent)));
    wait_for("the new pod of the same name bound", Duration::from_secs(60), || {
        (!node_of(&namespace, "serve").is_empty()).then_some(())
    });

    // A typo in an annotation refuses the pod, on the pod; corrected in place, it is placed.
    let typo = "  annotations: {allot.dev/kind: trainig}\n";
    kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&pod_yaml("typo", 1, typo)));
    let refused = wait_for("the refusal on the pod", Duration::from_secs(30), || {
        let text = kubectl(
            &[
                "-n",
                &namespace,
                "get",
                "pod",
                "typo",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}",
            ],
            None,
        );
        (!text.is_empty()).then_some(text)
    });
    assert!(refused.contains("annotation allot.dev/kind is \"trainig\""), "{refused}");
    kubectl(
        &["-n", &namespace, "annotate", "pod", "typo", "allot.dev/kind=training", "--overwrite"],
        None,
    );
    wait_for("the corrected pod bound", Duration::from_secs(60), || {
        (!node_of(&namespace, "typo").is_empty()).then_some(())
    });
}

/// A notebook pod asking allot for one L40S.
fn notebook_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{allot.dev/kind: notebook}}
spec:
  schedulerName: allot
  nodeSelector: {{nvidia.com/gpu.product: {L40S}}}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{nvidia.com/gpu: \"1\"}}}}
"
    )
}

#[test]
fn an_idle_notebook_pod_is_found_by_its_exporter_pod_labels_and_reclaimed() {
    if !enabled() {
        return;
    }
    // A dcgm-exporter page, filled in once the pods run.
    let page = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let url = common::serve_page(page.clone());
    let idle = "idle:
  - name: notebooks
    kinds: [notebook]
    threshold: 10%
    idle_timer: 10s
    missing_telemetry: hold # no reading for the pod: nothing happens
    min_runtime: 0s
    policy: always
    action: suspend
    warn_before: 2s
";
    let telemetry = format!("dcgm-exporter={url}");
    let (scene, addr, token) = scene_with("idle", 1, L40S, &telemetry, idle);
    let (namespace, node) = (scene.namespace.clone(), scene.nodes[0].clone());
    for name in ["nb", "busy"] {
        kubectl(&["-n", &namespace, "apply", "-f", "-"], Some(&notebook_yaml(name)));
    }
    let running = |name: &str| {
        let handle = format!("{namespace}/{name}@");
        wait_for(&format!("{name} running in allot"), Duration::from_secs(60), || {
            foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
        })
    };
    let (nb, busy) = (running("nb"), running("busy"));
    let (nb_id, busy_id) = (nb["id"].as_u64().expect("id"), busy["id"].as_u64().expect("id"));

    // dcgm-exporter in Kubernetes mode, from the real pod-labelled L40S line of the shared
    // fixture: the device plugin gave nb GPU 5 (idle) and busy GPU 2 (busy). allot's own
    // guesses, the lowest indices, show busy GPUs no pod holds: read by index, neither
    // notebook would look idle.
    let fixture =
        std::fs::read_to_string(common::repo().join("../shared/fixtures/dcgm-exporter-sample.txt"))
            .expect("the shared dcgm-exporter fixture");
    let line = fixture
        .lines()
        .find(|l| {
            l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains("pod=\"tensorflow-0\"")
        })
        .expect("the fixture's pod-labelled L40S line");
    let mut text = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for gpu in 0..8u32 {
        let (pod, value) = match gpu {
            5 => ("nb", "0.000000"),
            2 => ("busy", "0.900000"),
            0 | 1 => ("", "0.900000"),
            _ => ("", "0.000000"),
        };
        let l = common::set_label(line, "gpu", &gpu.to_string());
        let l = common::set_label(&l, "UUID", &format!("GPU-e2e-{gpu}"));
        let l = common::set_label(&l, "device", &format!("nvidia{gpu}"));
        let l = common::set_label(&l, "Hostname", &node);
        let l = common::set_label(&l, "namespace", if pod.is_empty() { "" } else { &namespace });
        let l = common::set_label(&l, "container", if pod.is_empty() { "" } else { "main" });
        let l = common::set_label(&l, "pod", pod);
        let (labels, _) = l.rsplit_once(' ').expect("a sample line");
        text.push_str(&format!("{labels} {value}\n"));
    }
    *page.lock().expect("page") = text;

    let started = Instant::now();
    let reclaimed = wait_for("the idle notebook reclaimed", Duration::from_secs(90), || {
        let all = listed(&addr, &token);
        all.iter().find(|w| w["id"] == nb_id).filter(|w| w["state"] != "running").cloned()
    });
    eprintln!(
        "idle notebook reclaimed {:.1} s after its pod's telemetry was served: {reclaimed}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(reclaimed["reason_code"], "idle", "{reclaimed}");
    let why = Command::new(BIN)
        .args(["why", &nb_id.to_string(), "--url", &format!("http://{addr}"), "--token", &token])
        .output()
        .expect("allot why runs");
    let why = String::from_utf8_lossy(&why.stdout).into_owned();
    assert!(why.contains("idle"), "{why}");
    // Evicted through the Eviction API: the pod is gone or going.
    wait_for("the notebook's pod evicted", Duration::from_secs(60), || {
        let left = kubectl(
            &[
                "-n",
                &namespace,
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
            ],
            None,
        );
        left.lines().all(|l| l.split_whitespace().collect::<Vec<_>>() != ["nb"]).then_some(())
    });
    // `allot ls` says why once the run ended: reclaimed for idleness, and gone (an evicted pod
    // cannot run again: its controller, if any, makes a new pod, which is new work).
    let ended = wait_for("the reclaimed notebook's run ended", Duration::from_secs(60), || {
        let all = listed(&addr, &token);
        let w = all.iter().find(|w| w["id"] == nb_id)?;
        (!matches!(w["state"].as_str(), Some("running" | "stopping"))).then(|| w.clone())
    });
    eprintln!("after the eviction: {ended}");
    assert_eq!(ended["state"], "failed", "{ended}");
    assert_eq!(ended["reason_code"], "deleted", "{ended}");
    assert!(ended["reason"].to_string().contains("suspend: idle"), "{ended}");
    // Its busy neighbour, on GPUs allot reads by its pod, keeps running.
    let busy_now = listed(&addr, &token).into_iter().find(|w| w["id"] == busy_id);
    assert_eq!(
        busy_now.as_ref().map(|w| w["state"].clone()),
        Some("running".into()),
        "{busy_now:?}"
    );
}

/// A Job's pods that have not finished: (name, node), by name.
fn job_pods(namespace: &str, job: &str) -> Vec<(String, String)> {
    live_pods(namespace, &format!("job-name={job}"))
}

/// The pods of label selector `selector` that have not finished: (name, node), by name.
fn live_pods(namespace: &str, selector: &str) -> Vec<(String, String)> {
    let text = kubectl(
        &[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.metadata.deletionTimestamp} {.spec.nodeName}{\"\\n\"}{end}",
        ],
        None,
    );
    let mut pods: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words[..] {
                [name, "Pending" | "Running", node] => Some((name.to_string(), node.to_string())),
                [name, "Pending"] => Some((name.to_string(), String::new())),
                _ => None,
            }
        })
        .collect();
    pods.sort();
    pods
}

fn job_suspended(namespace: &str, job: &str) -> bool {
    kubectl(&["-n", namespace, "get", "job", job, "-o", "jsonpath={.spec.suspend}"], None) == "true"
}

/// `allot why REF`: its text.
fn why(addr: &str, token: &str, reference: &str) -> String {
    let out = Command::new(BIN)
        .args(["why", reference, "--url", &format!("http://{addr}"), "--token", token])
        .output()
        .expect("allot why runs");
    assert!(
        out.status.success(),
        "allot why {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_queued_job_borrowing_in_a_cohort_survives_a_restart_yields_to_the_lender_and_resumes() {
    if !enabled() {
        return;
    }
    let lender = format!("e2e-lender-{}", std::process::id());
    let policy = |borrower: &str| {
        format!(
            "projects:
  - name: {borrower}
    cohort: e2e
    quotas:
      - {{model: {H200}, guaranteed: 8, borrow_limit: 8}}
  - name: {lender}
    cohort: e2e
    quotas:
      - {{model: {H200}, guaranteed: 8}}
"
        )
    };
    let (mut scene, addr, token) =
        scene_of("cohort", 2, &[H200], "none", std::slice::from_ref(&lender), &policy);
    let borrower = scene.namespace.clone();

    // A Job of two 8-GPU pods, queued for allot: 16 GPUs, 8 of them borrowed from the lender.
    kubectl(
        &["-n", &borrower, "apply", "-f", "-"],
        Some(&format!(
            "apiVersion: batch/v1
kind: Job
metadata:
  name: finetune
  labels: {{allot.dev/queue: default}}
  annotations: {{allot.dev/kind: training}}
spec:
  suspend: true
  parallelism: 2
  completions: 2
  backoffLimit: 0
  template:
    metadata:
      annotations: {{pod-complete.stage.kwok.x-k8s.io/delay: 600s}}
    spec:
      schedulerName: allot
      restartPolicy: Never
      nodeSelector: {{nvidia.com/gpu.product: {H200}}}
      containers:
      - name: main
        image: busybox
        resources: {{limits: {{nvidia.com/gpu: \"8\"}}}}
"
        )),
    );
    let created = Instant::now();
    let first = wait_for("the Job's two pods bound by allot", Duration::from_secs(60), || {
        let pods = job_pods(&borrower, "finetune");
        (pods.len() == 2 && pods.iter().all(|(_, node)| !node.is_empty())).then_some(pods)
    });
    eprintln!("the Job's pods bound {:.1} s after it was created", created.elapsed().as_secs_f64());
    let nodes: std::collections::BTreeSet<&str> = first.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(nodes.len(), 2, "one pod on each node: {first:?}");
    let handle = format!("{borrower}/job:finetune@");
    let job = wait_for("allot ls lists the Job running", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
    });
    assert_eq!(job["kind"], "training", "{job}");
    let reference = format!("{borrower}/job:finetune");
    assert!(why(&addr, &token, &reference).starts_with(&format!("{} ", job["id"])));

    // kill -9 and a restart mid-way: the Job is found running where it is, nothing rebound.
    scene.kill();
    let (addr, token_again) = scene.serve();
    assert_eq!(token_again, None, "not a first start");
    let again = wait_for("the Job running after the restart", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
    });
    assert_eq!(again["id"], job["id"], "the same workload: {again}");
    assert_eq!(job_pods(&borrower, "finetune"), first, "the same pods on the same nodes");

    // The lender claims its guarantee: the Job is suspended (its pods deleted), kept, and told
    // why; the notebook is bound once the GPUs are free.
    kubectl(
        &["-n", &lender, "apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: nb, annotations: {{allot.dev/kind: notebook}}}}
spec:
  schedulerName: allot
  nodeSelector: {{nvidia.com/gpu.product: {H200}}}
  containers:
  - name: main
    image: busybox
    resources: {{limits: {{nvidia.com/gpu: \"8\"}}}}
"
        )),
    );
    let claimed = Instant::now();
    wait_for("the Job suspended by allot", Duration::from_secs(60), || {
        job_suspended(&borrower, "finetune").then_some(())
    });
    let notebook_node = wait_for("the notebook bound", Duration::from_secs(60), || {
        let node = node_of(&lender, "nb");
        (!node.is_empty()).then_some(node)
    });
    assert!(nodes.contains(notebook_node.as_str()));
    eprintln!(
        "the lender's notebook bound {:.1} s after it was created (the Job suspended first)",
        claimed.elapsed().as_secs_f64()
    );
    let waiting = wait_for("the Job pending again", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "pending").cloned()
    });
    assert_eq!(waiting["id"], job["id"], "kept: the same workload, {waiting}");
    let events = wait_for("allot's reason as an Event of the Job", Duration::from_secs(30), || {
        let text = kubectl(
            &[
                "-n",
                &borrower,
                "get",
                "events",
                "--field-selector",
                "involvedObject.kind=Job,involvedObject.name=finetune,reason=AllotWaiting",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        (!text.is_empty()).then_some(text)
    });
    assert!(events.contains("allot:"), "{events}");
    eprintln!("the suspended Job's Event: {events}");

    // The notebook goes: the Job is resumed by its next run, two new pods bound.
    kubectl(&["-n", &lender, "delete", "pod", "nb", "--wait=false"], None);
    let gone = Instant::now();
    let resumed = wait_for("the Job resumed and its pods bound", Duration::from_secs(90), || {
        let pods = job_pods(&borrower, "finetune");
        let bound = pods.len() == 2 && pods.iter().all(|(_, node)| !node.is_empty());
        (bound && !job_suspended(&borrower, "finetune")).then_some(pods)
    });
    assert!(resumed.iter().all(|p| !first.contains(p)), "new pods: {resumed:?}");
    eprintln!("the Job resumed {:.1} s after the notebook went", gone.elapsed().as_secs_f64());
    let running = wait_for("allot ls lists it running again", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
    });
    assert_eq!(running["attempt"], 2, "{running}");
}

/// The pods of a JobSet (by the label its controller sets) that have not finished:
/// (name, node), by name.
fn jobset_pods(namespace: &str, jobset: &str) -> Vec<(String, String)> {
    live_pods(namespace, &format!("jobset.sigs.k8s.io/jobset-name={jobset}"))
}

#[test]
fn a_queued_jobset_is_placed_as_one_gang_survives_a_restart_and_completes() {
    if !enabled() {
        return;
    }
    let (mut scene, addr, token) = scene("jobset", 2, H100);
    let namespace = scene.namespace.clone();
    // A JobSet of a leader and a worker Job, one 8-GPU pod each: one gang of two members.
    let job = |name: &str| {
        format!(
            "  - name: {name}
    template:
      spec:
        backoffLimit: 0
        template:
          metadata:
            annotations: {{pod-complete.stage.kwok.x-k8s.io/delay: 20s}}
          spec:
            schedulerName: allot
            restartPolicy: Never
            containers:
            - name: main
              image: busybox
              resources: {{limits: {{nvidia.com/gpu: \"8\"}}}}
"
        )
    };
    kubectl(
        &["-n", &namespace, "apply", "-f", "-"],
        Some(&format!(
            "apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: pretrain
  labels: {{allot.dev/queue: default}}
  annotations: {{allot.dev/kind: training}}
spec:
  suspend: true
  replicatedJobs:
{}{}",
            job("leader"),
            job("workers")
        )),
    );
    let created = Instant::now();
    let first = wait_for("the JobSet's two pods bound by allot", Duration::from_secs(60), || {
        let pods = jobset_pods(&namespace, "pretrain");
        (pods.len() == 2 && pods.iter().all(|(_, node)| !node.is_empty())).then_some(pods)
    });
    eprintln!(
        "the JobSet's pods bound {:.1} s after it was created",
        created.elapsed().as_secs_f64()
    );
    let nodes: std::collections::BTreeSet<&str> = first.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(nodes.len(), 2, "one pod on each node: {first:?}");
    let handle = format!("{namespace}/jobset:pretrain@");
    let listed_once =
        wait_for("allot ls lists the JobSet running", Duration::from_secs(30), || {
            foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
        });
    assert_eq!(listed_once["kind"], "training", "{listed_once}");
    let reference = format!("{namespace}/jobset:pretrain");
    assert!(why(&addr, &token, &reference).starts_with(&format!("{} ", listed_once["id"])));

    // kill -9 and a restart mid-way: found running where it is, nothing rebound.
    scene.kill();
    let (addr, _) = scene.serve();
    let again = wait_for("the JobSet running after the restart", Duration::from_secs(30), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "running").cloned()
    });
    assert_eq!(again["id"], listed_once["id"], "the same workload: {again}");
    assert_eq!(jobset_pods(&namespace, "pretrain"), first, "the same pods on the same nodes");
    let done = wait_for("the JobSet succeeded", Duration::from_secs(60), || {
        foreign(&listed(&addr, &token), &handle).filter(|w| w["state"] == "succeeded").cloned()
    });
    assert_eq!(done["id"], listed_once["id"]);
}

/// `kubectl apply` of a pod asking allot for `gpus` of `resource`, with `spec` lines added.
fn apply_gpu_pod(namespace: &str, name: &str, resource: &str, gpus: u32, spec: &str) {
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  schedulerName: allot
{spec}  containers:
  - name: main
    image: busybox
    resources: {{limits: {{{resource}: \"{gpus}\"}}}}
"
    );
    kubectl(&["-n", namespace, "apply", "-f", "-"], Some(&yaml));
}

/// A policy of the scene's namespace alone, guaranteed `quotas` (model, GPUs).
fn quotas_of(quotas: &[(&str, u32)]) -> impl Fn(&str) -> String {
    let lines: String = quotas
        .iter()
        .map(|(model, gpus)| format!("      - {{model: {model}, guaranteed: {gpus}}}\n"))
        .collect();
    move |namespace| format!("projects:\n  - name: {namespace}\n    quotas:\n{lines}")
}

fn scheduled_message(namespace: &str, pod: &str) -> String {
    let path = "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}";
    kubectl(&["-n", namespace, "get", "pod", pod, "-o", path], None)
}

#[test]
fn in_a_cluster_of_two_gpu_vendors_each_pod_gets_its_vendors_gpus() {
    if !enabled() {
        return;
    }
    let policy = quotas_of(&[(L4, 8), (MI300X, 8)]);
    let (scene, _addr, _token) = scene_of("vendors", 2, &[L4, MI300X], "none", &[], &policy);
    let namespace = scene.namespace.clone();
    let (nvidia_node, amd_node) = (scene.nodes[0].clone(), scene.nodes[1].clone());
    let bound = |pod: &str| {
        wait_for(&format!("pod {pod} bound"), Duration::from_secs(60), || {
            Some(node_of(&namespace, pod)).filter(|n| !n.is_empty())
        })
    };

    // Half of the L4 node taken: packing alone would put the next 4-GPU pod there.
    let l4 = format!("  nodeSelector: {{nvidia.com/gpu.product: {L4}}}\n");
    apply_gpu_pod(&namespace, "cuda", "nvidia.com/gpu", 4, &l4);
    assert_eq!(bound("cuda"), nvidia_node);
    // A pod that names no model but asks for AMD GPUs goes to the AMD node.
    apply_gpu_pod(&namespace, "rocm", "amd.com/gpu", 4, "");
    assert_eq!(bound("rocm"), amd_node, "amd.com/gpu on the AMD node");
    // And an NVIDIA pod that names no model goes to the NVIDIA node, though the AMD one has
    // as much room.
    apply_gpu_pod(&namespace, "cuda-any", "nvidia.com/gpu", 4, "");
    assert_eq!(bound("cuda-any"), nvidia_node);

    // A model no node has: refused, the pod told which field and what the cluster has.
    let mi250 = "  nodeSelector: {amd.com/gpu.product: AMD-Instinct-MI250X}\n";
    apply_gpu_pod(&namespace, "old", "amd.com/gpu", 1, mi250);
    let why = wait_for("the refused pod's reason", Duration::from_secs(30), || {
        Some(scheduled_message(&namespace, "old")).filter(|m| !m.is_empty())
    });
    assert!(
        why.contains("spec.nodeSelector[amd.com/gpu.product] is \"AMD-Instinct-MI250X\"")
            && why.contains(MI300X),
        "{why}"
    );
    assert_eq!(node_of(&namespace, "old"), "", "never bound");
}

/// `allot CMD…` against the scene's daemon: its stdout; panics on failure.
fn cli(addr: &str, token: &str, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env("ALLOT_URL", format!("http://{addr}"))
        .env("ALLOT_TOKEN", token)
        .output()
        .expect("allot runs");
    assert!(out.status.success(), "allot {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn workload(addr: &str, token: &str, id: u64) -> Option<Value> {
    listed(addr, token).into_iter().find(|w| w["id"] == id)
}

/// `kubectl get pod` of the scene's namespace: (node, uid, GPU limit) of `pod`.
fn pod_facts(namespace: &str, pod: &str) -> (String, String, String) {
    let path = "jsonpath={.spec.nodeName} {.metadata.uid} \
                {.spec.containers[0].resources.limits.nvidia\\.com/gpu}";
    let text = kubectl(&["-n", namespace, "get", "pod", pod, "-o", path], None);
    let mut words = text.split_whitespace().map(str::to_string);
    let mut next = || words.next().unwrap_or_default();
    (next(), next(), next())
}

#[test]
fn work_submitted_through_allot_runs_as_pods_it_makes_and_survives_a_restart() {
    if !enabled() {
        return;
    }
    let (mut scene, addr, token) = scene("submit", 2, B200);
    let namespace = scene.namespace.clone();
    // 2 members of 8 GPUs: one pod on each node, made bound by allot.
    let submit = [
        &["submit", "--project", &namespace, "--gpus", "8", "--members", "2"][..],
        &["--", "allot-test-sleep", "600"],
    ]
    .concat();
    let submitted = Instant::now();
    let id: u64 = cli(&addr, &token, &submit).trim().parse().expect("the workload id");
    wait_for("the submitted work running", Duration::from_secs(60), || {
        workload(&addr, &token, id).filter(|w| w["state"] == "running")
    });
    eprintln!(
        "allot submit of 2 x 8 GPUs to running (both pods made and Running under kwok): {:.1} s",
        submitted.elapsed().as_secs_f64()
    );
    let pods = [format!("allot-{id}-1-0"), format!("allot-{id}-1-1")];
    let before: Vec<(String, String, String)> =
        pods.iter().map(|p| pod_facts(&namespace, p)).collect();
    let nodes: std::collections::BTreeSet<&str> = before.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(nodes, scene.nodes.iter().map(String::as_str).collect(), "{before:?}");
    assert!(before.iter().all(|f| f.2 == "8"), "8 GPUs each: {before:?}");

    // kill -9 and a restart: the same run, the same pods, nothing made twice.
    scene.kill();
    let (addr, again) = scene.serve();
    assert_eq!(again, None, "not a first start");
    let after = wait_for("the work running after the restart", Duration::from_secs(30), || {
        workload(&addr, &token, id).filter(|w| w["state"] == "running")
    });
    assert_eq!(after["attempt"], 1, "{after}");
    let now: Vec<(String, String, String)> =
        pods.iter().map(|p| pod_facts(&namespace, p)).collect();
    assert_eq!(now, before, "the same pods on the same nodes");

    // Cancelled through allot: its pods are evicted, the work ends cancelled.
    cli(&addr, &token, &["cancel", &id.to_string()]);
    let ended = wait_for("the work cancelled", Duration::from_secs(60), || {
        workload(&addr, &token, id).filter(|w| w["state"] == "cancelled")
    });
    assert_eq!(ended["state"], "cancelled");

    // A program that fails: the work ends failed with the container's exit code.
    let failing = ["submit", "--project", &namespace, "--gpus", "1", "--", "allot-test-exit", "3"];
    let id: u64 = cli(&addr, &token, &failing).trim().parse().expect("the workload id");
    let failed = wait_for("the failing work's end", Duration::from_secs(60), || {
        workload(&addr, &token, id).filter(|w| w["state"] == "failed")
    });
    assert_eq!(failed["exit_code"], 3, "{failed}");
}

#[test]
fn mig_slices_are_placed_for_pods_and_submitted_work_and_counted_against_their_quota() {
    if !enabled() {
        return;
    }
    let policy = quotas_of(&[(A30_SLICE, 4)]);
    let (scene, addr, token) = scene_of("mig", 1, &[A30_SLICE], "none", &[], &policy);
    let (namespace, node) = (scene.namespace.clone(), scene.nodes[0].clone());
    // A pod asking for 2 slices: bound to the slices' node.
    apply_gpu_pod(&namespace, "small", "nvidia.com/mig-1g.6gb", 2, "");
    let bound = wait_for("the slice pod bound", Duration::from_secs(60), || {
        Some(node_of(&namespace, "small")).filter(|n| !n.is_empty())
    });
    assert_eq!(bound, node);
    // Submitted work on the slice model: allot's pod asks for the slice resource.
    let submit = ["submit", "--project", &namespace, "--gpus", "1", "--gpu-model", A30_SLICE, "--"];
    let id: u64 = cli(&addr, &token, &[&submit[..], &["allot-test-sleep", "600"]].concat())
        .trim()
        .parse()
        .expect("the workload id");
    wait_for("the submitted work running", Duration::from_secs(60), || {
        workload(&addr, &token, id).filter(|w| w["state"] == "running")
    });
    let path = "jsonpath={.spec.containers[0].resources.limits.nvidia\\.com/mig-1g\\.6gb}";
    let pod = format!("allot-{id}-1-0");
    assert_eq!(kubectl(&["-n", &namespace, "get", "pod", &pod, "-o", path], None), "1");
    // 3 of the 4 slices taken: a pod asking for 2 more waits, and says why in an Event. (Its
    // PodScheduled condition may be overwritten by the daemons of the tests running beside
    // this one, which do not know the namespace; the Events keep every daemon's word.)
    apply_gpu_pod(&namespace, "more", "nvidia.com/mig-1g.6gb", 2, "");
    let selector = "involvedObject.name=more";
    wait_for("the waiting pod's reason", Duration::from_secs(30), || {
        let path = "jsonpath={.items[*].message}";
        let events = kubectl(
            &["-n", &namespace, "get", "events", "--field-selector", selector, "-o", path],
            None,
        );
        events.contains(A30_SLICE).then_some(())
    });
    assert_eq!(node_of(&namespace, "more"), "", "not bound");
}
