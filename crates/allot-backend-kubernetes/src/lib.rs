//! A Kubernetes cluster as a backend: allot is the scheduler of the pods that ask for it.
//!
//! Pods with `spec.schedulerName: allot` wait unbound (no other scheduler binds them): they are
//! foreign work ([`ClusterNews::foreign`]) charged to their namespace (the policy's projects
//! are namespaces). The daemon admits one by a launch that adopts it (`Launch::adopt` =
//! `"namespace/name"`); the backend binds the pod to the launch's node through the Binding
//! subresource and watches it from then on. Pods of other schedulers that hold GPUs on a GPU
//! node are occupied capacity ([`ClusterNews::beside`]). Work submitted through `allot submit`
//! has no pod and is refused: the backend does not create pods yet.
//!
//! The [`Backend`] trait is synchronous: the backend owns a current-thread tokio runtime and
//! blocks on each API call with a timeout; an API server that does not answer in time is
//! [`BackendError::Unreachable`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use allot_backend::{
    Backend, BackendError, ClusterNews, Launch, MemberLaunch, Observation, RunId, StopSignal,
    Waiting,
};
use allot_core::NodeSpec;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};

pub mod map;

use map::{IndexGuess, parse_handle};

/// Where the backend's cluster is and how long it waits for it.
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// A kubeconfig file; `None`: `$KUBECONFIG`, else `~/.kube/config`, else the pod's
    /// in-cluster service account (kube's `Config::infer`).
    pub kubeconfig: Option<PathBuf>,
    /// The longest one API call may take before the cluster counts as unreachable.
    pub call_timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig { kubeconfig: None, call_timeout: Duration::from_secs(10) }
    }
}

/// A run and the pod it is.
#[derive(Clone, Debug)]
struct Tracked {
    namespace: String,
    name: String,
    /// The pod's uid when the run took it: a pod deleted and created again under the same
    /// name is not this run.
    uid: Option<String>,
    members: Vec<MemberLaunch>,
    started: bool,
    ended: bool,
    /// Set once allot asked it to stop, for the exit's words.
    stopped_by_allot: bool,
}

impl Tracked {
    fn handle(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The Kubernetes backend (see the crate's documentation).
pub struct KubernetesBackend {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    call_timeout: Duration,
    runs: BTreeMap<RunId, Tracked>,
    pending: Vec<Observation>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesBackend")
            .field("call_timeout", &self.call_timeout)
            .field("runs", &self.runs)
            .finish_non_exhaustive()
    }
}

/// An API error as the backend's: no answer is transient; 403 names the RBAC rule to add.
fn api_error(what: &str, error: kube::Error) -> BackendError {
    match error {
        kube::Error::Api(status) if status.code == 403 => BackendError::Invalid(format!(
            "{what}: forbidden ({}); grant allot's account the verb on that resource (see \
             scripts/k8s/allot-rbac.yaml)",
            status.message
        )),
        kube::Error::Api(status) if status.code == 429 || status.code >= 500 => {
            BackendError::Unreachable(format!(
                "{what}: the API server answered {}: {}",
                status.code, status.message
            ))
        }
        kube::Error::Api(status) => {
            BackendError::Invalid(format!("{what}: {} ({})", status.message, status.code))
        }
        other => BackendError::Unreachable(format!(
            "{what}: the Kubernetes API server did not answer ({other}); check the kubeconfig's \
             server and that the API server runs"
        )),
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl KubernetesBackend {
    /// Reads the cluster's credentials; contacts nothing (the first call does).
    pub fn connect(config: KubernetesConfig) -> Result<KubernetesBackend, BackendError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BackendError::Io(format!("could not start the backend's runtime: {e}")))?;
        let client = runtime.block_on(async {
            let kube_config = match &config.kubeconfig {
                Some(path) => {
                    let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                        format!(
                            "kubeconfig {}: {e}; pass a readable kubeconfig file",
                            path.display()
                        )
                    })?;
                    kube::Config::from_custom_kubeconfig(file, &Default::default())
                        .await
                        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
                }
                None => kube::Config::infer().await.map_err(|e| {
                    format!(
                        "no Kubernetes credentials ({e}); pass --kubeconfig, set KUBECONFIG, or \
                         run the daemon in a pod"
                    )
                })?,
            };
            kube::Client::try_from(kube_config)
                .map_err(|e| format!("could not build the Kubernetes client: {e}"))
        });
        let client = client.map_err(BackendError::Invalid)?;
        Ok(KubernetesBackend {
            runtime,
            client,
            call_timeout: config.call_timeout,
            runs: BTreeMap::new(),
            pending: Vec::new(),
        })
    }

    /// Runs one API call to its end or the timeout.
    fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, BackendError> {
        self.runtime.block_on(async {
            tokio::time::timeout(self.call_timeout, call).await.map_err(|_| {
                BackendError::Unreachable(format!(
                    "{what}: the Kubernetes API server did not answer within {:?}",
                    self.call_timeout
                ))
            })
        })
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn list_nodes(&self) -> Result<Vec<Node>, BackendError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = self
            .call("list nodes", nodes.list(&ListParams::default()))?
            .map_err(|e| api_error("list nodes", e))?;
        let mut nodes = list.items;
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(nodes)
    }

    fn list_pods(&self, params: &ListParams) -> Result<Vec<Pod>, BackendError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list =
            self.call("list pods", pods.list(params))?.map_err(|e| api_error("list pods", e))?;
        let mut pods = list.items;
        pods.sort_by_key(map::pod_handle);
        Ok(pods)
    }

    /// The pod named `namespace/name`, `None` if there is none.
    fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, BackendError> {
        let what = format!("get pod {namespace}/{name}");
        match self.call(&what, self.pods(namespace).get(name))? {
            Ok(pod) => Ok(Some(pod)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(api_error(&what, e)),
        }
    }

    /// Binds the pod to `node` (what a scheduler does: `POST pods/{name}/binding`).
    fn bind(&self, namespace: &str, name: &str, node: &str) -> Result<(), kube::Error> {
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": name, "namespace": namespace },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        });
        let pods = self.pods(namespace);
        let what = format!("bind pod {namespace}/{name} to {node}");
        match self.call(
            &what,
            pods.create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            ),
        ) {
            Ok(result) => result.map(|_| ()),
            Err(timeout) => Err(kube::Error::Service(timeout.to_string().into())),
        }
    }

    fn fail_launch(&mut self, run: RunId, error: String) {
        self.pending.push(Observation::LaunchFailed { run, error });
    }

    /// Takes the pod `handle` as `launch.run`: binds it to the launch's node unless it is bound.
    fn adopt(&mut self, launch: &Launch, handle: &str) -> Result<(), BackendError> {
        let run = launch.run;
        let Some((namespace, name)) = parse_handle(handle) else {
            self.fail_launch(run, format!("{handle:?} is not a pod handle (namespace/name)"));
            return Ok(());
        };
        let [member] = launch.members.as_slice() else {
            self.fail_launch(
                run,
                format!(
                    "pod {handle}: {} members asked; the kubernetes backend runs one pod per \
                     workload (pod groups are not supported yet)",
                    launch.members.len()
                ),
            );
            return Ok(());
        };
        let Some(pod) = self.get_pod(namespace, name)? else {
            self.fail_launch(run, format!("pod {handle} is gone (deleted before allot bound it)"));
            return Ok(());
        };
        if map::is_terminating(&pod) {
            self.fail_launch(run, format!("pod {handle} is being deleted"));
            return Ok(());
        }
        if map::bound_node(&pod).is_none() {
            match self.bind(namespace, name, &member.node) {
                Ok(()) => {}
                // Bound meanwhile (an earlier call whose answer was lost): taken as it is.
                Err(e) if status_code(&e) == Some(409) => {}
                Err(e) if is_not_found(&e) => {
                    self.fail_launch(
                        run,
                        format!("pod {handle} is gone (deleted before allot bound it)"),
                    );
                    return Ok(());
                }
                Err(e) => {
                    let error = api_error(&format!("bind pod {handle} to {}", member.node), e);
                    if error.is_transient() {
                        return Err(error);
                    }
                    self.fail_launch(run, error.to_string());
                    return Ok(());
                }
            }
        }
        self.runs.insert(
            run,
            Tracked {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: pod.metadata.uid.clone(),
                members: launch.members.clone(),
                started: false,
                ended: false,
                stopped_by_allot: false,
            },
        );
        Ok(())
    }

    /// What happened to `t`'s pod, judged from `pod` (`None`: it is gone); updates `t`.
    fn observe(run: RunId, t: &mut Tracked, pod: Option<&Pod>) -> Vec<Observation> {
        let mut out = Vec::new();
        let pod = pod.filter(|p| t.uid.is_none() || p.metadata.uid == t.uid);
        let Some(pod) = pod else {
            t.ended = true;
            let detail = if t.stopped_by_allot { "pod evicted by allot" } else { "pod deleted" };
            out.push(Observation::Exited { run, code: None, detail: detail.to_string() });
            return out;
        };
        let phase = map::phase(pod);
        // A pod that ended before it was seen running ran all the same (it was bound): its
        // start is reported first, so that its exit belongs to a started run.
        if matches!(phase, "Running" | "Succeeded" | "Failed") && !t.started {
            t.started = true;
            out.push(Observation::Started { run, pids: Vec::new() });
        }
        if map::is_terminal(pod) {
            t.ended = true;
            let (code, detail) = map::exit_status(pod);
            out.push(Observation::Exited { run, code, detail });
        }
        out
    }

    /// Asks `t`'s pod to go through the Eviction API (which keeps PodDisruptionBudgets).
    fn evict(&self, t: &Tracked) -> Result<(), kube::Error> {
        let what = format!("evict pod {}", t.handle());
        match self.call(&what, self.pods(&t.namespace).evict(&t.name, &EvictParams::default())) {
            Ok(result) => result.map(|_| ()),
            Err(timeout) => Err(kube::Error::Service(timeout.to_string().into())),
        }
    }

    fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_s: Option<u32>,
    ) -> Result<bool, BackendError> {
        let what = format!("delete pod {namespace}/{name}");
        let params = DeleteParams { grace_period_seconds: grace_s, ..DeleteParams::default() };
        match self.call(&what, self.pods(namespace).delete(name, &params))? {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(api_error(&what, e)),
        }
    }

    /// Handles of the pods live runs hold, so that they are not foreign.
    fn live_handles(&self) -> std::collections::BTreeSet<String> {
        self.runs.values().filter(|t| !t.ended).map(Tracked::handle).collect()
    }
}

impl Backend for KubernetesBackend {
    fn name(&self) -> &str {
        "kubernetes"
    }

    fn gate(&mut self) -> Option<String> {
        Some(
            "pods with spec.schedulerName: allot stay unbound until allot binds them; pods of \
             other schedulers are outside allot, and the GPUs they hold count as occupied"
                .to_string(),
        )
    }

    fn isolation(&self) -> Option<String> {
        Some(
            "each run is a pod: its containers get their GPUs from the node's device plugin".into(),
        )
    }

    /// Every Node with whole GPUs (see [`map::node_spec`]); nodes that are not Ready or are
    /// cordoned are included (their state comes through `watch_cluster`).
    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError> {
        Ok(self.list_nodes()?.iter().filter_map(map::node_spec).collect())
    }

    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError> {
        if self.runs.contains_key(&launch.run) {
            return Ok(());
        }
        match launch.adopt.clone() {
            Some(handle) => self.adopt(launch, &handle),
            None => {
                self.fail_launch(
                    launch.run,
                    "the kubernetes backend runs pods that ask for schedulerName: allot; create \
                     the pod with kubectl (allot submit does not create pods yet)"
                        .to_string(),
                );
                Ok(())
            }
        }
    }

    /// Terminate: the Eviction API (PodDisruptionBudgets apply; a budget that forbids it now
    /// is `Invalid`, not transient: the daemon logs it and its stop goes on to Kill after the
    /// grace, instead of retrying as if the API server were down). Kill: delete with no grace
    /// once the pod was asked to stop (what SIGKILL is to a process), else the eviction, and
    /// where a budget forbids it, delete: allot's decision to stop the run stands.
    /// Checkpoint: Kubernetes delivers no signal to a running pod; the pod's `preStop` hook and
    /// `terminationGracePeriodSeconds` are its checkpoint path when it is evicted.
    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        let Some(t) = self.runs.get(&run).cloned() else {
            return Err(BackendError::UnknownRun { run });
        };
        if t.ended || signal == StopSignal::Checkpoint {
            return Ok(());
        }
        if signal == StopSignal::Kill && t.stopped_by_allot {
            self.delete_pod(&t.namespace, &t.name, Some(0))?;
            return Ok(());
        }
        let what = format!("evict pod {}", t.handle());
        match self.evict(&t) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) if status_code(&e) == Some(429) && signal == StopSignal::Kill => {
                self.delete_pod(&t.namespace, &t.name, Some(0))?;
            }
            Err(e) if status_code(&e) == Some(429) => {
                return Err(BackendError::Invalid(format!(
                    "{what}: a PodDisruptionBudget forbids it now ({e}); allot deletes the pod \
                     when the stop's grace ends"
                )));
            }
            Err(e) => return Err(api_error(&what, e)),
        }
        if let Some(t) = self.runs.get_mut(&run) {
            t.stopped_by_allot = true;
        }
        Ok(())
    }

    /// One list of allot's pods (field selector `spec.schedulerName=allot`) for every run
    /// watched.
    fn poll(&mut self) -> Result<Vec<Observation>, BackendError> {
        if self.runs.values().any(|t| !t.ended) {
            let params = ListParams::default()
                .fields(&format!("spec.schedulerName={}", map::SCHEDULER_NAME));
            let pods: BTreeMap<String, Pod> =
                self.list_pods(&params)?.into_iter().map(|p| (map::pod_handle(&p), p)).collect();
            let mut seen = Vec::new();
            for (run, t) in self.runs.iter_mut().filter(|(_, t)| !t.ended) {
                seen.extend(Self::observe(*run, t, pods.get(&t.handle())));
            }
            self.pending.extend(seen);
        }
        Ok(std::mem::take(&mut self.pending))
    }

    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError> {
        let mut out = Vec::new();
        for launch in runs {
            let run = launch.run;
            let Some((namespace, name)) = launch.adopt.as_deref().and_then(parse_handle) else {
                out.push(Observation::LaunchFailed {
                    run,
                    error: "no pod: the kubernetes backend only runs pods it took over".into(),
                });
                continue;
            };
            let pod = self.get_pod(namespace, name)?;
            if pod.as_ref().is_some_and(|p| map::bound_node(p).is_none()) {
                // Never bound: it is pending foreign work again.
                out.push(Observation::LaunchFailed {
                    run,
                    error: format!("pod {namespace}/{name} was never bound"),
                });
                continue;
            }
            let mut t = Tracked {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: pod.as_ref().and_then(|p| p.metadata.uid.clone()),
                members: launch.members.clone(),
                started: false,
                ended: false,
                stopped_by_allot: false,
            };
            out.extend(Self::observe(run, &mut t, pod.as_ref()));
            self.runs.insert(run, t);
        }
        Ok(out)
    }

    /// Node states, the inventory, allot's pods no run holds (pending: to admit; bound: running
    /// foreign work), and the GPUs pods of other schedulers hold on GPU nodes.
    fn watch_cluster(&mut self) -> Result<ClusterNews, BackendError> {
        let nodes = self.list_nodes()?;
        let inventory: Vec<NodeSpec> = nodes.iter().filter_map(map::node_spec).collect();
        let gpu_nodes: std::collections::BTreeSet<&str> =
            inventory.iter().map(|n| n.name.as_str()).collect();
        let statuses = nodes
            .iter()
            .filter(|n| n.metadata.name.as_deref().is_some_and(|name| gpu_nodes.contains(name)))
            .map(map::node_status)
            .collect();
        let pods = self.list_pods(&ListParams::default())?;
        let live = self.live_handles();
        let mut guess = IndexGuess::default();
        for t in self.runs.values().filter(|t| !t.ended) {
            for member in &t.members {
                for device in &member.devices {
                    guess.take(&member.node, device.index);
                }
            }
        }
        let mut foreign = Vec::new();
        let mut beside = Vec::new();
        for pod in pods.iter().filter(|p| !map::is_terminal(p)) {
            if map::asks_allot(pod) {
                if !map::is_terminating(pod) && !live.contains(&map::pod_handle(pod)) {
                    foreign.push(map::foreign_work(pod, &mut guess));
                }
                continue;
            }
            let on_gpu_node = map::bound_node(pod).is_some_and(|n| gpu_nodes.contains(n));
            if on_gpu_node && map::gpu_ask(pod).is_ok_and(|a| a.gpus > 0) {
                beside.push(map::foreign_work(pod, &mut guess));
            }
        }
        Ok(ClusterNews { inventory: Some(inventory), nodes: statuses, foreign, beside })
    }

    /// Deletes a pending pod of allot's that no run holds. `Ok(false)`: not such a pod.
    fn cancel_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        let Some((namespace, name)) = parse_handle(handle) else { return Ok(false) };
        if self.live_handles().contains(&format!("{namespace}/{name}")) {
            return Ok(false);
        }
        match self.get_pod(namespace, name)? {
            Some(pod) if map::asks_allot(&pod) && map::bound_node(&pod).is_none() => {
                self.delete_pod(namespace, name, None)
            }
            _ => Ok(false),
        }
    }

    /// Sets each waiting pod's `PodScheduled` condition to `False`, reason `AllotWaiting`, with
    /// allot's reason as its message (what `kubectl describe pod` shows under Conditions and
    /// `kubectl get pod -o json` in `status.conditions`), through `pods/status`. Pods gone
    /// meanwhile are skipped.
    fn explain_waiting(&mut self, reasons: &[(Waiting, String)]) -> Result<(), BackendError> {
        // The condition's time is the API's wall-clock time, at the edge, not the engine's.
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut first_error = None;
        for (waiting, text) in reasons {
            let Waiting::Foreign(handle) = waiting else { continue };
            let Some((namespace, name)) = parse_handle(handle) else { continue };
            let patch = serde_json::json!({
                "status": { "conditions": [{
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "AllotWaiting",
                    "message": format!("allot: {text}"),
                    "lastTransitionTime": now,
                }]}
            });
            let what = format!("explain why pod {handle} waits");
            let result = self.call(
                &what,
                self.pods(namespace).patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                ),
            )?;
            match result {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    first_error.get_or_insert(api_error(&what, e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
