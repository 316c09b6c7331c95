//! A Kubernetes cluster as a backend: allot is the scheduler of the pods that ask for it.
//!
//! Pods with `spec.schedulerName: allot` wait unbound (no other scheduler binds them): they are
//! foreign work ([`ClusterNews::foreign`]) charged to their namespace (the policy's projects
//! are namespaces). The daemon admits one by a launch that adopts it (`Launch::adopt` =
//! `"namespace/name@uid"`); the backend binds the pod to the launch's node through the Binding
//! subresource and watches it from then on. A pod group (a gang: pods sharing the label
//! `allot.dev/pod-group`, as many as its annotation `allot.dev/pod-group-size` says) is one
//! piece of work of one member per pod, offered once all its pods exist and bound all or none
//! (see [`map`] for the labels, annotations and handles read). A Job or JobSet labelled
//! `allot.dev/queue` and created suspended is one piece of work too, as wide as the pods it
//! runs at once: admitting it resumes it, its pods are bound where allot placed it as the job
//! controller makes them, and a pre-emption suspends it again, keeping it for the next run
//! (see [`job`]; JobSets are read where the cluster serves them, see [`jobset`]). Pods of
//! other schedulers that hold GPUs on a GPU node are occupied capacity
//! ([`ClusterNews::beside`]). Work submitted through `allot submit` runs as pods allot makes,
//! bound to the nodes it chose, in the image the daemon was given (see [`own`]).
//!
//! A pod its user deletes while it runs ends the run as cancelled
//! ([`Observation::Cancelled`]); a pod allot evicted is an exit without code. A pod with
//! scheduling gates waits until they are removed. allot's reason for a pod it refuses or keeps
//! waiting is its `PodScheduled` condition and an Event of the pod.
//!
//! The cluster is read from a view kept in memory: Nodes and Pods listed once, then watched
//! (see the `cache` module); `watch_cluster`, `poll`, `inventory` and a launch read it and make
//! no API call, and `watch_cluster` says nothing new when nothing changed since its last read.
//! A bind is one call (the Binding names the pod's uid, so a pod deleted and created again
//! under the name is not bound by mistake).
//!
//! The [`Backend`] trait is synchronous: the backend owns a tokio runtime (one worker thread,
//! where the watches run) and blocks on each API call with a timeout; an API server that does
//! not answer in time, or a view that could not be listed, is [`BackendError::Unreachable`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_backend::{
    Backend, BackendError, ClusterNews, Launch, MemberLaunch, Observation, RunId, StopSignal,
    Waiting,
};
use allot_core::NodeSpec;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, ListParams, Patch, PatchParams,
    PostParams,
};

mod cache;
pub mod job;
pub mod jobset;
pub mod map;
pub mod own;
mod run;

use job::{Queued, QueuedKind};
use jobset::JobSet;
use map::{Handle, IndexGuess, parse_handle};
use run::{PodRun, Tracked};

/// The longest Event message allot writes, in bytes.
const EVENT_MESSAGE_BYTES_MAX: usize = 1024;

/// Where the backend's cluster is and how long it waits for it.
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// A kubeconfig file; `None`: `$KUBECONFIG`, else `~/.kube/config`, else the pod's
    /// in-cluster service account (kube's `Config::infer`).
    pub kubeconfig: Option<PathBuf>,
    /// The longest one API call may take before the cluster counts as unreachable.
    pub call_timeout: Duration,
    /// The container image of the pods allot makes for work submitted through allot (see
    /// [`own`]); `None`: such work fails to launch, saying so.
    pub image: Option<String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig { kubeconfig: None, call_timeout: Duration::from_secs(10), image: None }
    }
}

/// The Kubernetes backend (see the crate's documentation).
pub struct KubernetesBackend {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    call_timeout: Duration,
    /// The image of allot's own pods (`KubernetesConfig::image`).
    image: Option<String>,
    /// The watched view of nodes and pods.
    cache: cache::Cache,
    runs: BTreeMap<RunId, Tracked>,
    pending: Vec<Observation>,
    /// Bumped by every call that may change what `watch_cluster` says (a launch, a stop, a
    /// recovery, a cancel, a run that ended).
    local_changes: u64,
    /// The view's generation and `local_changes` at the last `watch_cluster` that read.
    last_news: Option<(u64, u64)>,
    /// The view's generation at the last `poll` that observed the runs (`None`: a run was
    /// tracked since, so observe again).
    last_observed: Option<u64>,
    /// Binds sent and not yet answered, by run (single pods only; see `bind_later`).
    binds: BTreeMap<RunId, tokio::task::JoinHandle<Option<BackendError>>>,
    /// The note last set on each pod (by handle: `reason\nmessage`), of the pods that have one.
    notes_shown: BTreeMap<String, String>,
    /// The refusal last recorded on each Job allot refuses, by handle.
    job_notes_shown: BTreeMap<String, String>,
    /// Jobs and JobSets suspended to be resumed by a later run (`requeue`), by that run, so
    /// that allot's reason for the wait reaches them. (After a restart the daemon still resumes
    /// them; only the words are lost.)
    kept: BTreeMap<RunId, Kept>,
}

/// A Job or JobSet suspended to be resumed by a later run.
#[derive(Clone, Debug)]
struct Kept {
    kind: QueuedKind,
    namespace: String,
    name: String,
    uid: Option<String>,
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
            "{what}: forbidden ({}); grant allot's account the verb on that resource (see the \
             ClusterRole in deploy/kubernetes/clusterrole.yaml)",
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

/// Binds one pod to `node` (what a scheduler does: `POST pods/{name}/binding`) and judges the
/// answer. The Binding names the pod's `uid`: the API server answers 409 if the pod under the
/// name has another (it was deleted and created again), and binds nothing. `None`: bound, or
/// found bound there already; `Some`: why not, transient where no answer came (the bind may
/// have happened).
async fn bind_checked(
    pods: Api<Pod>,
    name: String,
    uid: Option<String>,
    node: String,
    call_timeout: Duration,
) -> Option<BackendError> {
    let namespace = pods.namespace().unwrap_or_default().to_string();
    let what = format!("bind pod {namespace}/{name} to {node}");
    let binding = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": { "name": name, "namespace": namespace, "uid": uid },
        "target": { "apiVersion": "v1", "kind": "Node", "name": node },
    });
    let no_answer = || {
        Some(BackendError::Unreachable(format!(
            "{what}: the Kubernetes API server did not answer within {call_timeout:?}"
        )))
    };
    let params = PostParams::default();
    let sent = pods.create_subresource::<_, serde_json::Value>("binding", &name, &params, &binding);
    let error = match tokio::time::timeout(call_timeout, sent).await {
        Err(_) => return no_answer(),
        Ok(Ok(_)) => return None,
        Ok(Err(e)) => e,
    };
    if is_not_found(&error) {
        return Some(BackendError::Invalid(format!(
            "pod {namespace}/{name} is gone (deleted before allot bound it)"
        )));
    }
    if status_code(&error) != Some(409) {
        return Some(api_error(&what, error));
    }
    // Bound meanwhile (fine if where allot placed it), or another pod by the name.
    let pod = match tokio::time::timeout(call_timeout, pods.get_opt(&name)).await {
        Err(_) => return no_answer(),
        Ok(Err(e)) => return Some(api_error(&format!("get pod {namespace}/{name}"), e)),
        Ok(Ok(pod)) => pod,
    };
    match pod {
        Some(p) if uid.is_some() && p.metadata.uid != uid => Some(BackendError::Invalid(format!(
            "pod {namespace}/{name} was deleted and created again before allot bound it (the \
             new pod is new work)"
        ))),
        Some(p) if map::bound_node(&p) == Some(node.as_str()) => None,
        Some(_) => Some(BackendError::Invalid(format!(
            "pod {namespace}/{name} was bound elsewhere meanwhile"
        ))),
        None => Some(BackendError::Invalid(format!(
            "pod {namespace}/{name} is gone (deleted before allot bound it)"
        ))),
    }
}

/// The words for a Job's or JobSet's handle where pods were expected.
fn not_pods(kind: QueuedKind, namespace: &str, name: &str) -> String {
    format!(
        "{} {namespace}/{name} is a {}: its pods are the job controller's",
        kind.word(),
        kind.kind()
    )
}

/// Binds of single pods sent at once, at most (a group's are sent one by one, all or none).
const BINDS_IN_FLIGHT_MAX: usize = 32;

/// `pod`, the pod a handle names (from the view or the API server), if it is still the pod allot
/// admitted: `Err` with the words when it is gone or was created again under the name.
fn pod_as_admitted<P: std::borrow::Borrow<Pod>>(
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    pod: Option<P>,
) -> Result<P, String> {
    match pod {
        None => Err(format!("pod {namespace}/{name} is gone")),
        Some(pod) if uid.is_some() && pod.borrow().metadata.uid.as_deref() != uid => Err(format!(
            "pod {namespace}/{name} was deleted and created again since allot admitted it (the \
             new pod is new work)"
        )),
        Some(pod) => Ok(pod),
    }
}

/// Whether `pods` are the group a handle's id names (any pods, for a handle without one).
fn is_group<P: std::borrow::Borrow<Pod>>(uid: Option<&str>, pods: &[P]) -> bool {
    let refs: Vec<&Pod> = pods.iter().map(|p| p.borrow()).collect();
    uid.is_none_or(|id| map::group_id(&refs) == id)
}

/// `pods`, a group's pods now, if they are the group allot admitted: `Err` with the words when
/// none is left or one was added, removed or created again.
fn group_as_admitted<P: std::borrow::Borrow<Pod>>(
    namespace: &str,
    group: &str,
    uid: Option<&str>,
    pods: Vec<P>,
) -> Result<Vec<P>, String> {
    if pods.is_empty() {
        return Err(format!("pod group {namespace}/{group} has no pods left"));
    }
    if !is_group(uid, &pods) {
        return Err(format!(
            "pod group {namespace}/{group} changed since allot admitted it (a pod was added, \
             removed or created again; the group is new work)"
        ));
    }
    Ok(pods)
}

impl KubernetesBackend {
    /// Reads the cluster's credentials and starts watching the cluster in the background (a
    /// failure to reach it shows in the first read).
    pub fn connect(config: KubernetesConfig) -> Result<KubernetesBackend, BackendError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("allot-kubernetes")
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
        let cache = cache::Cache::start(&runtime, &client, config.call_timeout);
        Ok(KubernetesBackend {
            runtime,
            client,
            call_timeout: config.call_timeout,
            image: config.image,
            cache,
            runs: BTreeMap::new(),
            pending: Vec::new(),
            local_changes: 0,
            last_news: None,
            last_observed: None,
            binds: BTreeMap::new(),
            notes_shown: BTreeMap::new(),
            job_notes_shown: BTreeMap::new(),
            kept: BTreeMap::new(),
        })
    }

    /// Stops watching the cluster and forgets the view: reads are `Unreachable` until
    /// [`KubernetesBackend::start_watching`] (what a watch that drops for a while is; for
    /// tests of the resync).
    pub fn stop_watching(&mut self) {
        self.cache.stop();
    }

    /// Lists and watches the cluster again after [`KubernetesBackend::stop_watching`]; the
    /// first read waits for the lists.
    pub fn start_watching(&mut self) {
        self.cache.stop();
        self.cache = cache::Cache::start(&self.runtime, &self.client, self.call_timeout);
        self.last_news = None;
        self.last_observed = None;
    }

    /// LIST calls the view has made (nodes and pods; one each at the start and after each
    /// watch that failed): a view fed by its watches does not list again.
    pub fn lists(&self) -> u64 {
        self.cache.lists()
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

    /// The view, once listed (waits for the first lists up to the call timeout).
    fn view(&self) -> Result<std::sync::MutexGuard<'_, cache::View>, BackendError> {
        self.cache.read(self.call_timeout)
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

    /// Binds one pod to `node` now (see [`bind_checked`]).
    fn bind(&self, pod: &Pod, node: &str) -> Option<BackendError> {
        let namespace = map::pod_namespace(pod);
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.runtime.block_on(bind_checked(
            self.pods(namespace),
            name,
            pod.metadata.uid.clone(),
            node.to_string(),
            self.call_timeout,
        ))
    }

    /// Sends the bind of a single pod without waiting for its answer (at most
    /// `BINDS_IN_FLIGHT_MAX` at once: beyond, waits for the oldest); the run is tracked now,
    /// and the answer is taken in by [`KubernetesBackend::settle_binds`].
    fn bind_later(&mut self, run: RunId, pod: &Pod, node: &str) {
        while self.binds.len() >= BINDS_IN_FLIGHT_MAX {
            self.settle_binds(true);
        }
        let task = self.runtime.spawn(bind_checked(
            self.pods(map::pod_namespace(pod)),
            pod.metadata.name.clone().unwrap_or_default(),
            pod.metadata.uid.clone(),
            node.to_string(),
            self.call_timeout,
        ));
        self.binds.insert(run, task);
    }

    /// Takes in the answers of the binds sent (with `one`, waits for at least the oldest): a
    /// bind that failed ends its run's launch, failed or, where no answer came, deferred (the
    /// work queues again, as when a launch finds the API server down).
    fn settle_binds(&mut self, one: bool) {
        let mut done: Vec<RunId> =
            self.binds.iter().filter(|(_, t)| t.is_finished()).map(|(r, _)| *r).collect();
        if one && done.is_empty() {
            done.extend(self.binds.keys().next().copied());
        }
        for run in done {
            let Some(task) = self.binds.remove(&run) else { continue };
            let failure = match self.runtime.block_on(task) {
                Ok(failure) => failure,
                Err(e) => Some(BackendError::Unreachable(format!("the bind was not sent: {e}"))),
            };
            let Some(error) = failure else {
                // Bound: the run is observed from now on.
                self.last_observed = None;
                continue;
            };
            self.runs.remove(&run);
            self.local_changes += 1;
            let transient = error.is_transient();
            let error = error.to_string();
            self.pending.push(if transient {
                Observation::LaunchDeferred { run, error }
            } else {
                Observation::LaunchFailed { run, error }
            });
        }
    }

    fn fail_launch(&mut self, run: RunId, error: String) {
        self.pending.push(Observation::LaunchFailed { run, error });
    }

    /// allot's pods in `namespace` that belong to `group`, from the view (unbound pods with
    /// scheduling gates are not yet: see `watch_cluster`); finished ones are left out.
    fn cached_group_pods(
        &self,
        namespace: &str,
        group: &str,
    ) -> Result<Vec<Arc<Pod>>, BackendError> {
        let view = self.view()?;
        let prefix = format!("{namespace}/");
        let mut pods: Vec<Arc<Pod>> = view
            .pods
            .items
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, p)| p)
            .filter(|p| map::asks_allot(p) && !map::is_terminal(p))
            .filter(|p| !(map::is_gated(p) && map::bound_node(p).is_none()))
            .filter(|p| map::pod_group(p).is_some_and(|(g, _)| g == group))
            .cloned()
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// The pods `handle` names in the view; `Err` with the words when they are not what was
    /// admitted (see [`KubernetesBackend::pods_of`], which asks the API server).
    fn cached_pods_of(
        &self,
        handle: Handle<'_>,
    ) -> Result<Result<Vec<Arc<Pod>>, String>, BackendError> {
        match handle {
            Handle::Pod { namespace, name, uid } => {
                let pod = self.view()?.pods.items.get(&format!("{namespace}/{name}")).cloned();
                Ok(pod_as_admitted(namespace, name, uid, pod).map(|pod| vec![pod]))
            }
            Handle::Group { namespace, group, uid } => {
                let pods = self.cached_group_pods(namespace, group)?;
                Ok(group_as_admitted(namespace, group, uid, pods))
            }
            Handle::Job { kind, namespace, name, .. } => Ok(Err(not_pods(kind, namespace, name))),
        }
    }

    /// allot's pods in `namespace` that belong to `group`, as the API server lists them now
    /// (unbound pods with scheduling gates are not yet: see `watch_cluster`); those that
    /// finished too with `ended`.
    fn group_pods(
        &self,
        namespace: &str,
        group: &str,
        ended: bool,
    ) -> Result<Vec<Pod>, BackendError> {
        let params =
            ListParams::default().fields(&format!("spec.schedulerName={}", map::SCHEDULER_NAME));
        let what = format!("list the pods of group {namespace}/{group}");
        let list = self
            .call(&what, self.pods(namespace).list(&params))?
            .map_err(|e| api_error(&what, e))?;
        let mut pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| ended || !map::is_terminal(p))
            .filter(|p| !(map::is_gated(p) && map::bound_node(p).is_none()))
            .filter(|p| map::pod_group(p).is_some_and(|(g, _)| g == group))
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// The pods `handle` names now; `Err` with the words when they are not what was admitted.
    /// A group is its pods that have not finished; `recovering`, where they are not the group
    /// (a pod finished while the daemon was down), all its pods.
    fn pods_of(
        &self,
        handle: Handle<'_>,
        recovering: bool,
    ) -> Result<Result<Vec<Pod>, String>, BackendError> {
        match handle {
            Handle::Pod { namespace, name, uid } => {
                let pod = self.get_pod(namespace, name)?;
                Ok(pod_as_admitted(namespace, name, uid, pod).map(|pod| vec![pod]))
            }
            Handle::Group { namespace, group, uid } => {
                let mut pods = self.group_pods(namespace, group, false)?;
                if recovering && !is_group(uid, &pods) {
                    pods = self.group_pods(namespace, group, true)?;
                }
                Ok(group_as_admitted(namespace, group, uid, pods))
            }
            Handle::Job { kind, namespace, name, .. } => Ok(Err(not_pods(kind, namespace, name))),
        }
    }

    /// Binds `pods` (one, or a whole group) to `members`, all or none: everything is checked
    /// before the first bind (a bound pod cannot be unbound); pods already bound (an earlier
    /// try whose answer was lost, a restart mid-way) keep their node when a member is there.
    /// If a bind fails after others succeeded, the pods bound are deleted so that none of the
    /// group runs. `Ok(Err)`: the launch failed, with its reason; `Err`: transient, nothing
    /// was bound.
    fn bind_all<P: std::borrow::Borrow<Pod>>(
        &self,
        what: &str,
        pods: &[P],
        members: &[MemberLaunch],
    ) -> Result<Result<(), String>, BackendError> {
        let pods: Vec<&Pod> = pods.iter().map(|p| p.borrow()).collect();
        if let Some(p) = pods.iter().find(|p| map::is_terminating(p)) {
            return Ok(Err(format!("{what}: pod {} is being deleted", map::pod_key(p))));
        }
        if pods.len() != members.len() {
            return Ok(Err(format!(
                "{what} has {} pods, allot placed {} members: the group changed since it was \
                 admitted",
                pods.len(),
                members.len()
            )));
        }
        let mut free: Vec<Option<&MemberLaunch>> = members.iter().map(Some).collect();
        let mut already = Vec::new();
        for &pod in &pods {
            let Some(node) = map::bound_node(pod) else { continue };
            let Some(slot) = free.iter_mut().find(|m| m.is_some_and(|m| m.node == node)) else {
                return Ok(Err(format!(
                    "{what}: pod {} is already bound to {node}, where allot placed none of it",
                    map::pod_key(pod)
                )));
            };
            *slot = None;
            already.push(pod);
        }
        let mut free = free.into_iter().flatten();
        let mut plan = Vec::new();
        for &pod in pods.iter().filter(|p| map::bound_node(p).is_none()) {
            let Some(member) = free.next() else { break };
            plan.push((pod, member.node.as_str()));
        }
        let mut bound: Vec<&Pod> = already;
        for (pod, node) in plan {
            let failure = self.bind(pod, node);
            let Some(error) = failure else {
                bound.push(pod);
                continue;
            };
            if bound.is_empty() {
                if error.is_transient() {
                    return Err(error);
                }
                return Ok(Err(error.to_string()));
            }
            // No answer: the bind may have happened; the pod goes with the others.
            if error.is_transient() {
                bound.push(pod);
            }
            return Ok(Err(format!("{what}: {error}; {}", self.undo(&bound))));
        }
        Ok(Ok(()))
    }

    /// Deletes the pods of a group bound before a later bind failed, so none of it runs; says
    /// what was done.
    fn undo(&self, bound: &[&Pod]) -> String {
        let names: Vec<String> = bound.iter().map(|p| map::pod_key(p)).collect();
        let mut failed = Vec::new();
        for pod in bound {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            if let Err(e) = self.delete_pod(map::pod_namespace(pod), name, Some(0)) {
                failed.push(format!("{}: {e}", map::pod_key(pod)));
            }
        }
        if failed.is_empty() {
            format!(
                "deleted {} (bound, or perhaps bound by a call that got no answer) so that none \
                 of the group runs; create the group again (a Job or other controller does)",
                names.join(", ")
            )
        } else {
            format!(
                "deleting the pods bound failed ({}): delete them with kubectl delete pod, or \
                 the group runs in part",
                failed.join("; ")
            )
        }
    }

    /// Takes the work `handle` names as `launch.run`: binds its pods to the launch's nodes
    /// where they are not bound. `Ok(Err)`: the launch failed, with the reason.
    fn take(&mut self, launch: &Launch, handle: &str) -> Result<Result<(), String>, BackendError> {
        let Some(parsed) = parse_handle(handle) else {
            return Ok(Err(format!(
                "{handle:?} is not a handle of pods, a Job or a JobSet (namespace/name, \
                 namespace/group:name, namespace/job:name or namespace/jobset:name)"
            )));
        };
        if let Handle::Job { kind, namespace, name, uid } = parsed {
            return self.take_job(launch, kind, namespace, name, uid);
        }
        if matches!(parsed, Handle::Pod { .. }) && launch.members.len() != 1 {
            return Ok(Err(format!(
                "pod {handle}: {} members asked; a pod is one member (a gang is a pod group: \
                 label its pods {} and annotate them {})",
                launch.members.len(),
                map::GROUP_LABEL,
                map::GROUP_SIZE_ANNOTATION
            )));
        }
        // The view; where it does not show the pods admitted (it may be behind the API server,
        // e.g. a pod created just now), the API server's answer.
        let pods = match self.cached_pods_of(parsed)? {
            Ok(pods) => pods,
            Err(_) => match self.pods_of(parsed, false)? {
                Ok(pods) => pods.into_iter().map(Arc::new).collect(),
                Err(why) => return Ok(Err(format!("{why} (before allot bound it)"))),
            },
        };
        let group = match parsed {
            Handle::Group { group, .. } => Some(group.to_string()),
            Handle::Pod { .. } | Handle::Job { .. } => None,
        };
        let what = match &group {
            Some(g) => format!("pod group {}/{g}", parsed.namespace()),
            None => format!("pod {}", map::pod_key(&pods[0])),
        };
        // A single pod that can be bound as it is: the bind is sent and answered later, so
        // that several are in flight.
        if let ([pod], [member], None) = (&pods[..], &launch.members[..], &group)
            && map::bound_node(pod).is_none()
            && !map::is_terminating(pod)
        {
            let pod = pod.clone();
            self.bind_later(launch.run, &pod, &member.node);
            self.track(launch, parsed.namespace(), group, &[pod]);
            return Ok(Ok(()));
        }
        if let Err(why) = self.bind_all(&what, &pods, &launch.members)? {
            return Ok(Err(why));
        }
        self.track(launch, parsed.namespace(), group, &pods);
        Ok(Ok(()))
    }

    /// Watches `pods` as `launch.run` from now on.
    fn track<P: std::borrow::Borrow<Pod>>(
        &mut self,
        launch: &Launch,
        namespace: &str,
        group: Option<String>,
        pods: &[P],
    ) {
        self.last_observed = None;
        self.runs.insert(
            launch.run,
            Tracked {
                namespace: namespace.to_string(),
                group,
                pods: pods
                    .iter()
                    .map(|p| p.borrow())
                    .map(|p| PodRun {
                        name: p.metadata.name.clone().unwrap_or_default(),
                        uid: p.metadata.uid.clone(),
                        ran: false,
                        end: None,
                    })
                    .collect(),
                members: launch.members.clone(),
                started: false,
                ended: false,
                stopped_by_allot: false,
                job: None,
            },
        );
    }

    /// Work submitted through allot: creates its pods, one per member, bound to the members'
    /// nodes (see [`own`]), and watches them as the run. A pod of the run that exists already
    /// (an earlier launch of the run that got no answer, or a daemon restarted mid-launch) is
    /// taken as it is. `Ok(Err)`: the launch failed, with the reason, and the pods it made
    /// are deleted.
    fn launch_own(&mut self, launch: &Launch) -> Result<Result<(), String>, BackendError> {
        let Some(image) = self.image.clone() else {
            return Ok(Err("allot was started without --kubernetes-image: it has no image to \
                           run submitted work in. Start it with --kubernetes-image IMAGE, or \
                           create a pod that asks for schedulerName: allot with kubectl"
                .to_string()));
        };
        let namespace = match own::namespace_of(launch) {
            Ok(namespace) => namespace.to_string(),
            Err(why) => return Ok(Err(why)),
        };
        // Which resource each member's devices are (whole GPUs, or MIG slices of a profile),
        // as the node's devices are numbered.
        let resources: Vec<Option<String>> = {
            let view = self.view()?;
            launch
                .members
                .iter()
                .map(|m| {
                    let node = view.nodes.items.get(&m.node)?;
                    map::device_resource(node, m.devices.first()?.index)
                })
                .collect()
        };
        let mut made: Vec<Pod> = Vec::new();
        for (member, resource) in resources.iter().enumerate() {
            let pod = own::pod_for(launch, member, &namespace, &image, resource.as_deref());
            let name = own::pod_name(launch.run, member);
            let what = format!("create pod {namespace}/{name}");
            let created = match self
                .call(&what, self.pods(&namespace).create(&PostParams::default(), &pod))
            {
                Ok(result) => result,
                Err(unreachable) => {
                    // The retry takes the pods made so far (409 below).
                    return Err(unreachable);
                }
            };
            let why = match created {
                Ok(pod) => {
                    made.push(pod);
                    continue;
                }
                Err(e) if status_code(&e) == Some(409) => match self.get_pod(&namespace, &name)? {
                    Some(pod) if own::run_of(&pod) == Some(launch.run) => {
                        made.push(pod);
                        continue;
                    }
                    _ => format!("{what}: a pod of that name exists that is not this run's"),
                },
                Err(e) => api_error(&what, e).to_string(),
            };
            for pod in &made {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                let _ = self.delete_pod(&namespace, name, Some(0));
            }
            return Ok(Err(why));
        }
        let group = (made.len() > 1).then(|| own::pod_name(launch.run, 0));
        self.wait_for_view(&made);
        self.track(launch, &namespace, group, &made);
        Ok(Ok(()))
    }

    /// A run of allot's own pods after a restart, from its pods (by label): none is a launch
    /// that never made one (the work is pending again); pods missing from a launch cut short
    /// are made; an ended run reports only its end (the daemon may never have seen it start).
    fn recover_own(&mut self, launch: &Launch) -> Result<Vec<Observation>, BackendError> {
        let run = launch.run;
        let namespace = match own::namespace_of(launch) {
            Ok(namespace) => namespace.to_string(),
            Err(why) => return Ok(vec![Observation::LaunchFailed { run, error: why }]),
        };
        let what = format!("list pods of run {run} in {namespace}");
        let params =
            ListParams::default().labels(&format!("{}={}", own::RUN_LABEL, own::run_label(run)));
        let listed = self.call(&what, self.pods(&namespace).list(&params))?;
        let pods = match listed {
            Ok(list) => list.items,
            Err(e) if is_not_found(&e) => Vec::new(),
            Err(e) => return Err(api_error(&what, e)),
        };
        if pods.is_empty() {
            return Ok(vec![Observation::LaunchFailed {
                run,
                error: format!("no pod of run {run} in {namespace}: it was never made"),
            }]);
        }
        if pods.len() < launch.members.len() && !pods.iter().any(map::is_terminal) {
            // Made in full now; `poll` says when they run.
            return Ok(match self.launch_own(launch)? {
                Ok(()) => Vec::new(),
                Err(why) => vec![Observation::LaunchFailed { run, error: why }],
            });
        }
        let group = (launch.members.len() > 1).then(|| own::pod_name(run, 0));
        self.wait_for_view(&pods);
        self.track(launch, &namespace, group, &pods);
        let by_key: BTreeMap<String, Pod> =
            pods.into_iter().map(|p| (map::pod_key(&p), p)).collect();
        let Some(t) = self.runs.get_mut(&run) else { return Ok(Vec::new()) };
        let mut seen = t.observe(run, &by_key);
        if t.ended {
            seen.retain(|o| !matches!(o, Observation::Started { .. }));
        }
        Ok(seen)
    }

    /// Pods made or listed just now are watched from the view, which may not show them yet:
    /// a pod missing there is taken to be gone. Waits (up to the call timeout) until it does
    /// show them; one deleted meanwhile never shows, and is then gone indeed.
    fn wait_for_view(&self, pods: &[Pod]) {
        let keys: Vec<(String, Option<String>)> =
            pods.iter().map(|p| (map::pod_key(p), p.metadata.uid.clone())).collect();
        self.cache.wait_for_pods(&keys, self.call_timeout);
    }

    /// Asks a pod to go through the Eviction API (which keeps PodDisruptionBudgets).
    fn evict(&self, namespace: &str, name: &str) -> Result<(), kube::Error> {
        let what = format!("evict pod {namespace}/{name}");
        match self.call(&what, self.pods(namespace).evict(name, &EvictParams::default())) {
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

    /// `namespace/name` of the pods live runs hold, so that they are not foreign.
    fn live_pods(&self) -> BTreeSet<String> {
        self.runs
            .values()
            .filter(|t| !t.ended)
            .flat_map(|t| t.pods.iter().map(|p| t.key(p)))
            .collect()
    }

    /// Whether a live run holds the work `handle` names.
    fn is_live(&self, handle: Handle<'_>) -> bool {
        self.runs.values().filter(|t| !t.ended).any(|t| match handle {
            Handle::Pod { namespace, name, .. } => {
                t.group.is_none()
                    && t.namespace == namespace
                    && t.pods.iter().any(|p| p.name == name)
            }
            Handle::Group { namespace, group, .. } => {
                t.namespace == namespace && t.group.as_deref() == Some(group)
            }
            Handle::Job { kind, namespace, name, .. } => {
                t.namespace == namespace
                    && t.job.as_ref().is_some_and(|j| j.kind == kind && j.name == name)
            }
        })
    }

    /// Sets a pod's `PodScheduled` condition to `False` with allot's reason (through
    /// `pods/status`), and records the same as an Event of the pod (what `kubectl describe
    /// pod` lists, as it lists kube-scheduler's FailedScheduling): `Warning` for a refusal,
    /// `Normal` for a wait. A pod gone meanwhile is skipped.
    fn set_condition(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        text: &str,
        now: &str,
    ) -> Result<(), BackendError> {
        let message = format!("allot: {text}");
        let patch = serde_json::json!({
            "status": { "conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
            }]}
        });
        let what = format!("explain why pod {namespace}/{name} waits");
        let result = self.call(
            &what,
            self.pods(namespace).patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            ),
        )?;
        let pod = match result {
            Ok(pod) => pod,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(api_error(&what, e)),
        };
        let object = ("v1", "Pod", namespace, name, pod.metadata.uid);
        self.record_event(object, reason, message, now)
    }

    /// Records an Event of the object (`apiVersion`, `kind`, namespace, name, uid) with
    /// allot's reason: `Warning` for a refusal, `Normal` else.
    fn record_event(
        &self,
        (api_version, kind, namespace, name, uid): (&str, &str, &str, &str, Option<String>),
        reason: &str,
        message: String,
        now: &str,
    ) -> Result<(), BackendError> {
        // An Event's message is bounded (1 KiB for events.k8s.io); cut on a char boundary.
        let mut short = message;
        if short.len() > EVENT_MESSAGE_BYTES_MAX {
            let mut end = EVENT_MESSAGE_BYTES_MAX - 3;
            while !short.is_char_boundary(end) {
                end -= 1;
            }
            short.truncate(end);
            short.push_str("...");
        }
        let event = serde_json::json!({
            "metadata": { "generateName": format!("{name}."), "namespace": namespace },
            "involvedObject": { "apiVersion": api_version, "kind": kind, "name": name,
                                "namespace": namespace, "uid": uid },
            "reason": reason,
            "message": short,
            "type": if reason == map::REFUSED_REASON { "Warning" } else { "Normal" },
            "source": { "component": map::SCHEDULER_NAME },
            "reportingComponent": map::SCHEDULER_NAME,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        });
        let event: Event = serde_json::from_value(event)
            .map_err(|e| BackendError::Invalid(format!("an Event for {kind} {name}: {e}")))?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("record an Event for {kind} {namespace}/{name}");
        self.call(&what, events.create(&PostParams::default(), &event))?
            .map_err(|e| api_error(&what, e))?;
        Ok(())
    }

    /// Shows the notes (refusals, groups waiting for pods) on their pods, where the pod's
    /// condition does not say it already and allot did not set it (the view may not show
    /// allot's own change yet: an Event is recorded once). Best effort: the first error is
    /// returned after the rest were tried.
    fn show_notes(
        &mut self,
        pods: &BTreeMap<String, &Pod>,
        notes: &[map::Note],
    ) -> Result<(), BackendError> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut first_error = None;
        let handles: BTreeSet<String> = pods.values().map(|p| map::pod_handle(p)).collect();
        self.notes_shown.retain(|handle, _| handles.contains(handle));
        for note in notes {
            let Some(pod) = pods.get(&note.pod) else { continue };
            let message = format!("allot: {}", note.message);
            let shown = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .is_some_and(|c| {
                    c.reason.as_deref() == Some(note.reason)
                        && c.message.as_deref() == Some(&*message)
                });
            let handle = map::pod_handle(pod);
            let said = format!("{}\n{message}", note.reason);
            if shown || self.notes_shown.get(&handle) == Some(&said) {
                continue;
            }
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            match self.set_condition(
                map::pod_namespace(pod),
                name,
                note.reason,
                &note.message,
                &now,
            ) {
                Ok(()) => {
                    self.notes_shown.insert(handle, said);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Jobs and JobSets queued for allot (see the [`job`] module).
impl KubernetesBackend {
    /// The API of `kind` in `namespace`, untyped: a suspend, resume or delete reads nothing
    /// back.
    fn queued_api(&self, kind: QueuedKind, namespace: &str) -> Api<DynamicObject> {
        let (group, version) = match kind.api_version().split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", kind.api_version()),
        };
        let resource = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: kind.api_version().to_string(),
            kind: kind.kind().to_string(),
            plural: format!("{}s", kind.kind().to_lowercase()),
        };
        Api::namespaced_with(self.client.clone(), namespace, &resource)
    }

    /// Suspends or resumes a Job or JobSet (a resume records where allot placed it).
    /// `Ok(false)`: it is gone.
    fn set_suspended(
        &self,
        kind: QueuedKind,
        namespace: &str,
        name: &str,
        suspend: bool,
        placement: Option<&str>,
    ) -> Result<bool, BackendError> {
        let mut patch = serde_json::json!({ "spec": { "suspend": suspend } });
        if let Some(nodes) = placement {
            patch["metadata"] =
                serde_json::json!({ "annotations": { job::PLACEMENT_ANNOTATION: nodes } });
        }
        let verb = if suspend { "suspend" } else { "resume" };
        let what = format!("{verb} {} {namespace}/{name}", kind.word());
        let params = PatchParams::default();
        let api = self.queued_api(kind, namespace);
        match self.call(&what, api.patch(name, &params, &Patch::Merge(&patch)))? {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(api_error(&what, e)),
        }
    }

    /// The Job or JobSet `namespace/name` in the view, else as the API server has it (the
    /// view may be behind it: one created just now).
    fn job_now(
        &self,
        kind: QueuedKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Queued>, BackendError> {
        let key = format!("{namespace}/{name}");
        let view = self.view()?;
        if let Some(found) = Queued::find(kind, &key, &view.jobs.items, &view.jobsets.items) {
            return Ok(Some(found));
        }
        drop(view);
        let what = format!("get {} {key}", kind.word());
        let got = match kind {
            QueuedKind::Job => {
                let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
                self.call(&what, api.get_opt(name))?.map(|j| j.map(|j| Queued::Job(Arc::new(j))))
            }
            QueuedKind::JobSet => {
                let api: Api<JobSet> = Api::namespaced(self.client.clone(), namespace);
                let got = self.call(&what, api.get_opt(name))?;
                got.map(|j| j.map(|j| Queued::JobSet(Arc::new(j))))
            }
        };
        got.map_err(|e| api_error(&what, e))
    }

    /// Takes a Job or JobSet queued for allot as `launch.run`: resumes it, with the launch's
    /// nodes as its placement; `poll` binds its pods to them as the job controller makes them.
    fn take_job(
        &mut self,
        launch: &Launch,
        kind: QueuedKind,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Result<(), String>, BackendError> {
        let what = format!("{} {namespace}/{name}", kind.word());
        let job = match self.job_now(kind, namespace, name)? {
            Some(job) if uid.is_none() || job.uid() == uid => job,
            Some(_) => {
                return Ok(Err(format!(
                    "{what} was deleted and created again before allot admitted it (the new \
                     one is new work)"
                )));
            }
            None => {
                return Ok(Err(format!("{what} is gone (deleted before allot admitted it)")));
            }
        };
        if job.finished().is_some() {
            return Ok(Err(format!("{what} finished before allot admitted it")));
        }
        let width = job.width() as usize;
        if launch.members.len() != width {
            // Its width changed while it waited (a kept Job edited): allot admitted the size it
            // was. It stays suspended, and its user is told why where they look.
            let why = format!(
                "{what}: allot admitted {} pods, but it now runs {width} at once ({} changed \
                 while it waited): allot ends this workload; delete the {} and create it again \
                 to queue it anew",
                launch.members.len(),
                kind.width_fields(),
                kind.kind(),
            );
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let object =
                (kind.api_version(), kind.kind(), namespace, name, job.uid().map(str::to_string));
            // Best effort: the failed launch says the same.
            let _ = self.record_event(object, map::REFUSED_REASON, format!("allot: {why}"), &now);
            return Ok(Err(why));
        }
        // An earlier run of the work that still holds it (its pods still stopping) ends now:
        // this run takes it over.
        let key = job.key();
        for (run, t) in self.runs.iter_mut().filter(|(_, t)| !t.ended) {
            if t.job.as_ref().is_some_and(|j| j.kind == kind && j.key == key) {
                t.ended = true;
                self.pending.push(Observation::Exited {
                    run: *run,
                    code: None,
                    detail: format!("{what} resumed as run {}", launch.run),
                });
            }
        }
        self.kept.retain(|_, k| {
            (k.kind, k.namespace.as_str(), k.name.as_str()) != (kind, namespace, name)
        });
        let placement = job::placement_text(&launch.members);
        if !self.set_suspended(kind, namespace, name, false, Some(&placement))? {
            return Ok(Err(format!("{what} is gone (deleted before allot admitted it)")));
        }
        self.track_job(launch, &job, false);
        Ok(Ok(()))
    }

    fn track_job(&mut self, launch: &Launch, job: &Queued, seen_resumed: bool) {
        self.last_observed = None;
        let run = job::JobRun {
            kind: job.kind(),
            name: job.name().to_string(),
            key: job.key(),
            uid: job.uid().map(str::to_string),
            seen_resumed,
        };
        self.runs.insert(
            launch.run,
            Tracked {
                namespace: job.namespace().to_string(),
                group: None,
                pods: Vec::new(),
                members: launch.members.clone(),
                started: false,
                ended: false,
                stopped_by_allot: false,
                job: Some(run),
            },
        );
    }

    /// Stops a Job's or JobSet's run: suspends it (its pods are deleted, each with its grace
    /// period: the checkpoint path); a kill once that was asked deletes the pods left at once.
    fn stop_job(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        let Some(t) = self.runs.get(&run) else {
            return Err(BackendError::UnknownRun { run });
        };
        let Some(j) = &t.job else { return Ok(()) };
        if t.ended || signal == StopSignal::Checkpoint {
            return Ok(());
        }
        let (kind, namespace, name, uid) =
            (j.kind, t.namespace.clone(), j.name.clone(), j.uid.clone());
        let kill = signal == StopSignal::Kill && t.stopped_by_allot;
        self.local_changes += 1;
        self.set_suspended(kind, &namespace, &name, true, None)?;
        if let Some(t) = self.runs.get_mut(&run) {
            t.stopped_by_allot = true;
        }
        if kill {
            let prefix = format!("{namespace}/");
            let view = self.view()?;
            let left: Vec<String> = view
                .pods
                .items
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(_, p)| p)
                .filter(|p| {
                    uid.is_some() && job::queued_owner_uid(p, &view.jobs.items) == uid.as_deref()
                })
                .filter(|p| !map::is_terminal(p))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            drop(view);
            for pod in left {
                self.delete_pod(&namespace, &pod, Some(0))?;
            }
        }
        Ok(())
    }

    /// A recovered Job's or JobSet's run: one gone ended unknown; a suspended one was never
    /// resumed for this run (pending again); else it is watched again and judged from the view.
    fn recover_job(
        &mut self,
        launch: &Launch,
        kind: QueuedKind,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Vec<Observation>, BackendError> {
        let run = launch.run;
        let key = format!("{namespace}/{name}");
        let what = format!("{} {key}", kind.word());
        let view = self.view()?;
        let job = Queued::find(kind, &key, &view.jobs.items, &view.jobsets.items);
        drop(view);
        let Some(job) = job.filter(|j| uid.is_none() || j.uid() == uid) else {
            return Ok(vec![Observation::Exited {
                run,
                code: None,
                detail: format!(
                    "exit status unknown: {what} is gone (it ended while allot was not watching)"
                ),
            }]);
        };
        if job.is_suspended() && job.finished().is_none() {
            return Ok(vec![Observation::LaunchFailed {
                run,
                error: format!("{what} was never resumed"),
            }]);
        }
        self.track_job(launch, &job, true);
        let view = self.cache.read(self.call_timeout)?;
        let Some(t) = self.runs.get_mut(&run) else { return Ok(Vec::new()) };
        let (seen, binds) =
            t.observe_job(run, &view.jobs.items, &view.jobsets.items, &view.pods.items);
        drop(view);
        self.bind_job_pods(binds);
        Ok(seen)
    }

    /// Binds a Job's pods where `Tracked::observe_job` sent them; a bind that fails is tried
    /// again at the next poll.
    fn bind_job_pods(&mut self, binds: Vec<(Arc<Pod>, String)>) {
        for (pod, node) in binds {
            if self.bind(&pod, &node).is_some() {
                self.last_observed = None;
            }
        }
    }

    /// Records the refusal of each Job or JobSet allot refuses as a Warning Event of it (what
    /// `kubectl describe job` lists), once per object and reason.
    fn show_job_refusals(&mut self, refused: &[(Queued, String)]) -> Result<(), BackendError> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let handles: BTreeSet<String> = refused.iter().map(|(j, _)| j.handle()).collect();
        self.job_notes_shown.retain(|handle, _| handles.contains(handle));
        let mut first_error = None;
        for (j, why) in refused {
            let handle = j.handle();
            if self.job_notes_shown.get(&handle) == Some(why) {
                continue;
            }
            let kind = j.kind();
            let uid = j.uid().map(str::to_string);
            let object = (kind.api_version(), kind.kind(), j.namespace(), j.name(), uid);
            match self.record_event(object, map::REFUSED_REASON, format!("allot: {why}"), &now) {
                Ok(()) => {
                    self.job_notes_shown.insert(handle, why.clone());
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
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
            "runs as a pod (or a Job's or JobSet's pods): its containers get their GPUs from the \
             node's device plugin, and the kubelet holds it to its requests"
                .into(),
        )
    }

    /// Every Node with whole GPUs (see [`map::node_spec`]); nodes that are not Ready or are
    /// cordoned are included (their state comes through `watch_cluster`).
    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError> {
        Ok(self.view()?.nodes.items.values().filter_map(|n| map::node_spec(n)).collect())
    }

    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError> {
        self.local_changes += 1;
        if self.runs.contains_key(&launch.run) {
            return Ok(());
        }
        match launch.adopt.clone() {
            Some(handle) => {
                if let Err(why) = self.take(launch, &handle)? {
                    self.fail_launch(launch.run, why);
                }
                Ok(())
            }
            None => {
                if let Err(why) = self.launch_own(launch)? {
                    self.fail_launch(launch.run, why);
                }
                Ok(())
            }
        }
    }

    /// To every pod of the run. Terminate: the Eviction API (PodDisruptionBudgets apply; a
    /// budget that forbids it now is `Invalid`, not transient: the daemon logs it and its stop
    /// goes on to Kill after the grace, instead of retrying as if the API server were down).
    /// Kill: delete with no grace once the pods were asked to stop (what SIGKILL is to a
    /// process), else the eviction, and where a budget forbids it, delete: allot's decision to
    /// stop the run stands. Checkpoint: Kubernetes delivers no signal to a running pod; the
    /// pod's `preStop` hook and `terminationGracePeriodSeconds` are its checkpoint path when
    /// it is evicted.
    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        // A stop waits for the run's bind to be answered (a failed bind fails the launch).
        while self.binds.contains_key(&run) {
            self.settle_binds(true);
        }
        let Some(t) = self.runs.get(&run).cloned() else {
            return Err(BackendError::UnknownRun { run });
        };
        if t.job.is_some() {
            return self.stop_job(run, signal);
        }
        if t.ended || signal == StopSignal::Checkpoint {
            return Ok(());
        }
        self.local_changes += 1;
        let mut first_error = None;
        for pod in t.pods.iter().filter(|p| p.end.is_none()) {
            let (namespace, name) = (t.namespace.as_str(), pod.name.as_str());
            let result = if signal == StopSignal::Kill && t.stopped_by_allot {
                self.delete_pod(namespace, name, Some(0)).map(|_| ())
            } else {
                let what = format!("evict pod {namespace}/{name}");
                match self.evict(namespace, name) {
                    Ok(()) => Ok(()),
                    Err(e) if is_not_found(&e) => Ok(()),
                    Err(e) if status_code(&e) == Some(429) && signal == StopSignal::Kill => {
                        self.delete_pod(namespace, name, Some(0)).map(|_| ())
                    }
                    Err(e) if status_code(&e) == Some(429) => Err(BackendError::Invalid(format!(
                        "{what}: a PodDisruptionBudget forbids it now ({e}); allot deletes the \
                         pod when the stop's grace ends"
                    ))),
                    Err(e) => Err(api_error(&what, e)),
                }
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if let Some(t) = self.runs.get_mut(&run) {
            t.stopped_by_allot = true;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Every run watched, judged from the view's pods; nothing to judge while the view has
    /// not changed since the last poll and no run was added.
    fn poll(&mut self) -> Result<Vec<Observation>, BackendError> {
        self.settle_binds(false);
        if self.runs.values().any(|t| !t.ended) {
            let view = self.cache.read(self.call_timeout)?;
            if self.last_observed != Some(view.generation) {
                let mut seen = Vec::new();
                // A run whose bind is unanswered is judged once it is (its pod may be gone
                // because the bind failed: that is a failed launch, not an end).
                let binds = &self.binds;
                let watched =
                    self.runs.iter_mut().filter(|(r, t)| !t.ended && !binds.contains_key(r));
                let mut job_binds = Vec::new();
                for (run, t) in watched {
                    if t.job.is_some() {
                        let (observed, to_bind) = t.observe_job(
                            *run,
                            &view.jobs.items,
                            &view.jobsets.items,
                            &view.pods.items,
                        );
                        seen.extend(observed);
                        job_binds.extend(to_bind);
                    } else {
                        seen.extend(t.observe(*run, &view.pods.items));
                    }
                }
                self.last_observed = Some(view.generation);
                drop(view);
                self.bind_job_pods(job_binds);
                if seen.iter().any(|o| !matches!(o, Observation::Started { .. })) {
                    self.local_changes += 1;
                }
                self.pending.extend(seen);
            }
        }
        Ok(std::mem::take(&mut self.pending))
    }

    /// Runs whose pods are all gone end with an unknown status; runs none of whose pods was
    /// bound failed to launch (the work is pending again); a group bound in part (the daemon
    /// stopped mid-launch) is bound in full as launched, or, where that fails, deleted.
    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError> {
        self.local_changes += 1;
        let mut out = Vec::new();
        for launch in runs {
            let run = launch.run;
            let Some(adopt) = launch.adopt.as_deref() else {
                out.extend(self.recover_own(launch)?);
                continue;
            };
            let Some(handle) = parse_handle(adopt) else {
                out.push(Observation::LaunchFailed {
                    run,
                    error: format!("{adopt:?} is not a handle of pods, a Job or a JobSet"),
                });
                continue;
            };
            if let Handle::Job { kind, namespace, name, uid } = handle {
                out.extend(self.recover_job(launch, kind, namespace, name, uid)?);
                continue;
            }
            let pods = match self.pods_of(handle, true)? {
                Ok(pods) => pods,
                Err(why) => {
                    out.push(Observation::Exited {
                        run,
                        code: None,
                        detail: format!(
                            "exit status unknown: {why} (it ended while allot was not watching)"
                        ),
                    });
                    continue;
                }
            };
            if pods.iter().all(|p| map::bound_node(p).is_none()) {
                // Never bound: it is pending foreign work again.
                out.push(Observation::LaunchFailed {
                    run,
                    error: format!("{} was never bound", launch.adopt.as_deref().unwrap_or("")),
                });
                continue;
            }
            let (group, what) = match handle {
                Handle::Group { namespace, group, .. } => {
                    (Some(group.to_string()), format!("pod group {namespace}/{group}"))
                }
                Handle::Pod { namespace, name, .. } => (None, format!("pod {namespace}/{name}")),
                Handle::Job { kind, namespace, name, .. } => {
                    (None, format!("{} {namespace}/{name}", kind.word()))
                }
            };
            // A group bound in part (the daemon stopped mid-launch): bound in full as launched.
            let unbound = pods.iter().any(|p| map::bound_node(p).is_none());
            if unbound && let Err(why) = self.bind_all(&what, &pods, &launch.members)? {
                out.push(Observation::LaunchFailed { run, error: why });
                continue;
            }
            // Pods bound just now are not running yet: observed from the pods listed before.
            self.track(launch, handle.namespace(), group, &pods);
            let by_key: BTreeMap<String, Pod> =
                pods.into_iter().map(|p| (map::pod_key(&p), p)).collect();
            if let Some(t) = self.runs.get_mut(&run) {
                out.extend(t.observe(run, &by_key));
            }
        }
        Ok(out)
    }

    /// A Job's run is stopped by suspending its Job, which keeps it for `next`: `launch` of
    /// `next` resumes it (Kueue's way). Pods cannot be kept: `Ok(false)`.
    fn requeue(&mut self, run: RunId, next: RunId) -> Result<bool, BackendError> {
        let Some((namespace, j)) =
            self.runs.get(&run).and_then(|t| Some((t.namespace.clone(), t.job.clone()?)))
        else {
            return Ok(false);
        };
        self.stop_job(run, StopSignal::Terminate)?;
        self.kept.insert(next, Kept { kind: j.kind, namespace, name: j.name, uid: j.uid });
        Ok(true)
    }

    /// Node states, the inventory, allot's pods and groups no run holds (pending: to admit;
    /// bound: running foreign work; pods with scheduling gates wait for them to be removed),
    /// and the GPUs pods of other schedulers hold on GPU nodes. Jobs queued for allot that no
    /// run holds are work too (suspended: to admit); their pods are the Job's, never work by
    /// themselves.
    /// Pods allot refuses, and pods of a group that waits for the rest of its pods, get
    /// allot's reason in their `PodScheduled` condition.
    /// Nothing (an empty [`ClusterNews`]) when neither the view nor allot's runs changed
    /// since the last read.
    fn watch_cluster(&mut self) -> Result<ClusterNews, BackendError> {
        let view = self.cache.read(self.call_timeout)?;
        let now = (view.generation, self.local_changes);
        if self.last_news == Some(now) {
            return Ok(ClusterNews::default());
        }
        let inventory: Vec<NodeSpec> =
            view.nodes.items.values().filter_map(|n| map::node_spec(n)).collect();
        let fleet = map::Fleet::of(view.nodes.items.values().map(|n| &**n));
        let mut guess = IndexGuess::of_nodes(view.nodes.items.values().map(|n| &**n));
        let gpu_nodes: BTreeSet<&str> = inventory.iter().map(|n| n.name.as_str()).collect();
        let statuses = view
            .nodes
            .items
            .values()
            .filter(|n| n.metadata.name.as_deref().is_some_and(|name| gpu_nodes.contains(name)))
            .map(|n| map::node_status(n))
            .collect();
        let mut pods: Vec<Arc<Pod>> = view.pods.items.values().cloned().collect();
        // The Jobs of JobSets, for `queued_owner_uid` (a pod of any other Job is its Job's):
        // only these are copied out of the view.
        let jobset_jobs: BTreeMap<String, Arc<Job>> = (view.jobs.items.iter())
            .filter(|(_, j)| job::jobset_owner(j).is_some())
            .map(|(k, j)| (k.clone(), j.clone()))
            .collect();
        let jobs: Vec<Queued> = (view.jobs.items.values().cloned().map(Queued::Job))
            .chain(view.jobsets.items.values().cloned().map(Queued::JobSet))
            .filter(Queued::queues_for_allot)
            .collect();
        drop(view);
        let queued: BTreeSet<&str> = jobs.iter().filter_map(Queued::uid).collect();
        // A JobSet's pods whose Job the view does not show yet are the JobSet's all the same.
        let queued_jobsets: BTreeSet<String> =
            jobs.iter().filter(|j| j.kind() == QueuedKind::JobSet).map(Queued::key).collect();
        let mut job_pods: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
        pods.sort_by_cached_key(|p| map::pod_handle(p));
        let live = self.live_pods();
        for t in self.runs.values().filter(|t| !t.ended) {
            for member in &t.members {
                for device in &member.devices {
                    guess.take(&member.node, device.index);
                }
            }
        }
        let mut ours: Vec<&Pod> = Vec::new();
        let mut beside = Vec::new();
        for pod in pods.iter().map(|p| &**p).filter(|p| !map::is_terminal(p)) {
            if let Some(owner) =
                job::queued_owner_uid(pod, &jobset_jobs).filter(|o| queued.contains(o))
            {
                job_pods.entry(owner.to_string()).or_default().push(pod);
                continue;
            }
            if job::labelled_jobset(pod).is_some_and(|k| queued_jobsets.contains(&k)) {
                continue;
            }
            if own::run_of(pod).is_some() {
                // allot's own pods are its runs'. One that no run holds (a run allot lost track
                // of) holds its GPUs all the same.
                let bound = map::bound_node(pod).is_some_and(|n| gpu_nodes.contains(n));
                if bound && !live.contains(&map::pod_key(pod)) {
                    beside.push(map::foreign_work(pod, &fleet, &mut guess));
                }
                continue;
            }
            if map::asks_allot(pod) {
                // A gated pod unbound waits for its gates (a group of it waits with it).
                let gated = map::is_gated(pod) && map::bound_node(pod).is_none();
                if !map::is_terminating(pod) && !gated && !live.contains(&map::pod_key(pod)) {
                    ours.push(pod);
                }
                continue;
            }
            let on_gpu_node = map::bound_node(pod).is_some_and(|n| gpu_nodes.contains(n));
            if on_gpu_node && map::gpu_ask(pod).is_ok_and(|a| a.gpus > 0) {
                beside.push(map::foreign_work(pod, &fleet, &mut guess));
            }
        }
        let (mut foreign, notes) = map::allot_work(&ours, &fleet, &mut guess);
        let mut refused_jobs = Vec::new();
        for j in &jobs {
            let (kind, key, uid) = (j.kind(), j.key(), j.uid());
            let held = self.runs.values().any(|t| {
                !t.ended
                    && t.job
                        .as_ref()
                        .is_some_and(|r| r.kind == kind && r.key == key && r.uid.as_deref() == uid)
            });
            if held {
                continue;
            }
            let uid = uid.unwrap_or_default();
            let owned = job_pods.get(uid).map(Vec::as_slice).unwrap_or_default();
            let Some(mut work) = job::job_work(j, owned, &fleet, &mut guess) else { continue };
            if let Some(why) = &work.refusal {
                refused_jobs.push((j.clone(), why.clone()));
            }
            map::mark_refused(&mut work);
            foreign.push(work);
        }
        let _ = self.show_job_refusals(&refused_jobs);
        let by_key: BTreeMap<String, &Pod> = ours.iter().map(|p| (map::pod_key(p), *p)).collect();
        // Best effort: the news matter more than the words on the pods.
        let _ = self.show_notes(&by_key, &notes);
        self.last_news = Some(now);
        Ok(ClusterNews { inventory: Some(inventory), nodes: statuses, foreign, beside })
    }

    /// From the view (no API call): the pod each member of the runs is (see
    /// [`run::Tracked::member_pods`]), so that telemetry is attributed by the exporters' pod
    /// labels, not by the device indices allot guessed.
    fn member_pods(
        &mut self,
        runs: &[RunId],
    ) -> Result<Vec<(RunId, Vec<allot_backend::PodRef>)>, BackendError> {
        let view = self.view()?;
        let tracked = runs.iter().filter_map(|run| Some((*run, self.runs.get(run)?)));
        Ok(tracked
            .map(|(run, t)| (run, t.member_pods(&view.pods.items, &view.jobs.items)))
            .collect())
    }

    /// Deletes a pending pod of allot's that no run holds, or every unbound pod of such a
    /// group, or such a Job (its pods with it). `Ok(false)`: not such work.
    fn cancel_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        self.local_changes += 1;
        let Some(parsed) = parse_handle(handle) else { return Ok(false) };
        if self.is_live(parsed) {
            return Ok(false);
        }
        if let Handle::Job { kind, namespace, name, uid } = parsed {
            let Some(j) = self.job_now(kind, namespace, name)? else { return Ok(false) };
            if uid.is_some() && j.uid() != uid {
                return Ok(false);
            }
            let what = format!("delete {} {namespace}/{name}", kind.word());
            let params = DeleteParams::background();
            let api = self.queued_api(kind, namespace);
            return match self.call(&what, api.delete(name, &params))? {
                Ok(_) => Ok(true),
                Err(e) if is_not_found(&e) => Ok(false),
                Err(e) => Err(api_error(&what, e)),
            };
        }
        let pods = match self.pods_of(parsed, false)? {
            Ok(pods) => pods,
            Err(_) => return Ok(false),
        };
        let mut deleted = false;
        for pod in pods.iter().filter(|p| map::asks_allot(p) && map::bound_node(p).is_none()) {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            deleted |= self.delete_pod(map::pod_namespace(pod), name, None)?;
        }
        Ok(deleted)
    }

    /// Sets each waiting pod's `PodScheduled` condition to `False`, reason `AllotWaiting`, with
    /// allot's reason as its message (what `kubectl describe pod` shows under Conditions and
    /// `kubectl get pod -o json` in `status.conditions`), through `pods/status`; for a group,
    /// on every pod of it. Pods gone meanwhile are skipped.
    fn explain_waiting(&mut self, reasons: &[(Waiting, String)]) -> Result<(), BackendError> {
        // The condition's time is the API's wall-clock time, at the edge, not the engine's.
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut first_error = None;
        for (waiting, text) in reasons {
            let handle = match waiting {
                Waiting::Foreign(handle) => handle.clone(),
                Waiting::Kept(run) => match self.kept.get(run) {
                    Some(k) => {
                        let uid = k.uid.as_deref().map(|u| format!("@{u}")).unwrap_or_default();
                        format!("{}/{}:{}{uid}", k.namespace, k.kind.word(), k.name)
                    }
                    None => continue,
                },
            };
            let handle = &handle;
            let Some(parsed) = parse_handle(handle) else { continue };
            let names: Vec<String> = match parsed {
                Handle::Pod { name, .. } => vec![name.to_string()],
                Handle::Job { kind, namespace, name, .. } => {
                    // A suspended Job has no pod to carry a condition: an Event of the Job.
                    let uid = parsed.uid().map(str::to_string);
                    let object = (kind.api_version(), kind.kind(), namespace, name, uid);
                    let message = format!("allot: {text}");
                    if let Err(e) = self.record_event(object, map::WAITING_REASON, message, &now) {
                        first_error.get_or_insert(e);
                    }
                    continue;
                }
                Handle::Group { namespace, group, .. } => {
                    match self.cached_group_pods(namespace, group) {
                        Ok(pods) => pods.iter().filter_map(|p| p.metadata.name.clone()).collect(),
                        Err(e) => {
                            first_error.get_or_insert(e);
                            continue;
                        }
                    }
                }
            };
            for name in names {
                let result =
                    self.set_condition(parsed.namespace(), &name, map::WAITING_REASON, text, &now);
                if let Err(e) = result {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
