//! The cluster as the backend last saw it: Nodes, Pods, Jobs and JobSets (all namespaces) in
//! memory, kept
//! up to date by a list and then a watch of each, on the backend's runtime, in the
//! background. Reads (`watch_cluster`, `poll`, `inventory`, a launch's pods) take the view
//! and make no API call.
//!
//! Each kind is one loop: LIST (the whole view of that kind is replaced at once, so a pod
//! deleted while nothing watched is dropped and one created then is added), then WATCH from
//! the list's resourceVersion, applying each event; a watch that ends normally (the server's
//! timeout) is started again from the last resourceVersion seen (bookmarks keep it recent);
//! a watch that fails (410 Gone when the version was compacted away, a dropped connection)
//! lists again. While a list fails the view is *down*: reads say `Unreachable` (transient)
//! rather than answer from a view that may be old. Before its first list the view is not
//! synced: a read waits for it up to the call timeout, then says `Unreachable` too.
//!
//! JobSets are a custom resource that a cluster may not have: while the API server does not
//! serve them (404: the CRD is not installed) the view has none and is usable, and the list is
//! tried again every `ABSENT_RELIST`, so a CRD installed later is seen without a restart.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use allot_backend::BackendError;
use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use crate::jobset::JobSet;
use crate::map;

/// The longest a watch request asks the server to keep it open (the server ends it then;
/// it is started again from the last version seen). Below the API server's 5-minute cap.
const WATCH_TIMEOUT_S: u32 = 290;
/// A list that failed is tried again after this, doubling up to `RELIST_BACKOFF_MAX`.
const RELIST_BACKOFF_MIN: Duration = Duration::from_millis(200);
const RELIST_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Objects asked for in one LIST call (a list of many is several calls, each within the call
/// timeout).
const LIST_PAGE: u32 = 500;
/// How often a kind the API server does not serve (a CRD not installed) is listed again.
const ABSENT_RELIST: Duration = Duration::from_secs(15);
/// How often a read waiting for the first list looks again.
const SYNC_POLL: Duration = Duration::from_millis(20);

/// One kind's objects by key, and whether they can be trusted.
#[derive(Debug)]
pub(crate) struct Store<K> {
    pub(crate) items: BTreeMap<String, Arc<K>>,
    /// A list has succeeded.
    synced: bool,
    /// The last list failed, with this error: the view may be old.
    down: Option<String>,
    /// LIST calls that succeeded (for tests and the logs: a watch-fed view lists rarely).
    lists: u64,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store { items: BTreeMap::new(), synced: false, down: None, lists: 0 }
    }
}

impl<K> Store<K> {
    fn usable(&self, what: &str) -> Result<(), BackendError> {
        if let Some(error) = &self.down {
            return Err(BackendError::Unreachable(format!(
                "the view of the cluster's {what} is out of date: listing them failed ({error})"
            )));
        }
        if !self.synced {
            return Err(BackendError::Unreachable(format!(
                "the cluster's {what} have not been listed yet"
            )));
        }
        Ok(())
    }
}

/// The view: nodes by name, pods, Jobs and JobSets by `namespace/name`, and a count that
/// changes whenever anything in it does.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) nodes: Store<Node>,
    pub(crate) pods: Store<Pod>,
    pub(crate) jobs: Store<Job>,
    pub(crate) jobsets: Store<JobSet>,
    /// Bumped on every change (an event applied, a list that replaced a kind).
    pub(crate) generation: u64,
}

impl View {
    /// `Err(Unreachable)` unless every kind is listed and not down.
    pub(crate) fn usable(&self) -> Result<(), BackendError> {
        self.nodes.usable("nodes")?;
        self.pods.usable("pods")?;
        self.jobs.usable("Jobs")?;
        self.jobsets.usable("JobSets")
    }

    fn listed(&self) -> bool {
        self.nodes.synced && self.pods.synced && self.jobs.synced && self.jobsets.synced
    }
}

/// The shared view and the tasks that keep it.
#[derive(Debug)]
pub(crate) struct Cache {
    view: Arc<Mutex<View>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cache {
    /// Starts the list-and-watch loops on `runtime` (which must run tasks without being
    /// blocked on: a multi-thread runtime).
    pub(crate) fn start(
        runtime: &tokio::runtime::Runtime,
        client: &kube::Client,
        call_timeout: Duration,
    ) -> Cache {
        let view = Arc::new(Mutex::new(View::default()));
        let nodes = runtime.spawn(keep::<Node>(
            "nodes",
            Api::all(client.clone()),
            view.clone(),
            call_timeout,
            |n| n.metadata.name.clone().unwrap_or_default(),
            |v| &mut v.nodes,
            false,
        ));
        let pods = runtime.spawn(keep::<Pod>(
            "pods",
            Api::all(client.clone()),
            view.clone(),
            call_timeout,
            map::pod_key,
            |v| &mut v.pods,
            false,
        ));
        let jobs = runtime.spawn(keep::<Job>(
            "Jobs",
            Api::all(client.clone()),
            view.clone(),
            call_timeout,
            |j| map::object_key(&j.metadata),
            |v| &mut v.jobs,
            false,
        ));
        let jobsets = runtime.spawn(keep::<JobSet>(
            "JobSets",
            Api::all(client.clone()),
            view.clone(),
            call_timeout,
            |j| map::object_key(&j.metadata),
            |v| &mut v.jobsets,
            true,
        ));
        Cache { view, tasks: vec![nodes, pods, jobs, jobsets] }
    }

    /// Stops the loops and forgets the view (reads wait for a new start's first list).
    pub(crate) fn stop(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        *self.lock() = View::default();
    }

    fn lock(&self) -> MutexGuard<'_, View> {
        // A loop that panicked while holding the lock left a view that is still a view.
        self.view.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The view, once usable: waits up to `wait` for the first lists, then `Unreachable`.
    #[allow(clippy::disallowed_methods)] // waiting for the first list is real time
    pub(crate) fn read(&self, wait: Duration) -> Result<MutexGuard<'_, View>, BackendError> {
        let start = std::time::Instant::now();
        loop {
            let view = self.lock();
            let never_listed = !view.listed();
            match view.usable() {
                Ok(()) => return Ok(view),
                Err(e) if !never_listed || start.elapsed() >= wait => return Err(e),
                Err(_) => {}
            }
            drop(view);
            std::thread::sleep(SYNC_POLL);
        }
    }

    /// Waits (up to `wait`) until the view holds every one of `pods` (`namespace/name` and
    /// uid), so that a pod just made is not taken for one gone because its watch event has
    /// not arrived yet. Whether they all showed: a pod deleted before the view saw it never
    /// does.
    #[allow(clippy::disallowed_methods)] // waiting for a watch event is real time
    pub(crate) fn wait_for_pods(&self, pods: &[(String, Option<String>)], wait: Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            let view = self.lock();
            let all = pods.iter().all(|(key, uid)| {
                view.pods.items.get(key).is_some_and(|p| uid.is_none() || p.metadata.uid == *uid)
            });
            drop(view);
            if all || start.elapsed() >= wait {
                return all;
            }
            std::thread::sleep(SYNC_POLL);
        }
    }

    /// LIST calls made so far, every kind together.
    pub(crate) fn lists(&self) -> u64 {
        let view = self.lock();
        view.nodes.lists + view.pods.lists + view.jobs.lists + view.jobsets.lists
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What a watch's end asks for.
enum Next {
    /// Watch again from the last version seen.
    Rewatch,
    /// List again: the version is gone or the watch broke off (`None`), or the watch could
    /// not start (`Some`: the error, e.g. 403 where the role lacks the verb `watch`).
    Relist(Option<String>),
}

/// Keeps one kind's store: list, watch, apply, and list again when the watch fails.
/// `optional`: a kind the API server may not serve (see the module's documentation).
async fn keep<K>(
    what: &'static str,
    api: Api<K>,
    view: Arc<Mutex<View>>,
    call_timeout: Duration,
    key: fn(&K) -> String,
    store: fn(&mut View) -> &mut Store<K>,
    optional: bool,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let lock = || view.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut backoff = RELIST_BACKOFF_MIN;
    // The error of a watch that could not start: the view stays down until one starts.
    let mut watch_error: Option<String> = None;
    loop {
        let (items, mut version) = match list_all(what, &api, call_timeout, key).await {
            Ok(listed) => listed,
            Err(Unlisted::NotServed) if optional => {
                {
                    let mut v = lock();
                    let s = store(&mut v);
                    let changed = !s.items.is_empty() || !s.synced || s.down.is_some();
                    s.items.clear();
                    s.synced = true;
                    s.down = None;
                    if changed {
                        v.generation += 1;
                    }
                }
                tokio::time::sleep(ABSENT_RELIST).await;
                continue;
            }
            Err(error) => {
                let error = error.to_string();
                store(&mut lock()).down = Some(error);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RELIST_BACKOFF_MAX);
                continue;
            }
        };
        backoff = RELIST_BACKOFF_MIN;
        {
            let mut v = lock();
            let s = store(&mut v);
            s.items = items;
            s.synced = true;
            s.down.clone_from(&watch_error);
            s.lists += 1;
            v.generation += 1;
        }
        loop {
            match watch(what, &api, call_timeout, &view, &mut version, key, store).await {
                Next::Rewatch => {}
                Next::Relist(None) => {
                    watch_error = None;
                    tokio::time::sleep(RELIST_BACKOFF_MIN).await;
                    break;
                }
                Next::Relist(Some(error)) => {
                    store(&mut lock()).down = Some(error.clone());
                    watch_error = Some(error);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RELIST_BACKOFF_MAX);
                    break;
                }
            }
        }
    }
}

/// Why a list failed.
enum Unlisted {
    /// The API server does not serve the kind (404).
    NotServed,
    Failed(String),
}

impl std::fmt::Display for Unlisted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unlisted::NotServed => f.write_str("the API server does not serve this kind"),
            Unlisted::Failed(error) => f.write_str(error),
        }
    }
}

/// Every object of the kind, by key, in pages of `LIST_PAGE` (each page one call within the
/// call timeout, all from one snapshot), and the snapshot's resourceVersion to watch from.
async fn list_all<K>(
    what: &str,
    api: &Api<K>,
    call_timeout: Duration,
    key: fn(&K) -> String,
) -> Result<(BTreeMap<String, Arc<K>>, String), Unlisted>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut items = BTreeMap::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(LIST_PAGE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = match tokio::time::timeout(call_timeout, api.list(&params)).await {
            Ok(Ok(page)) => page,
            Ok(Err(e)) if crate::is_not_found(&e) => return Err(Unlisted::NotServed),
            Ok(Err(e)) => {
                return Err(Unlisted::Failed(
                    crate::api_error(&format!("list {what}"), e).to_string(),
                ));
            }
            Err(_) => {
                return Err(Unlisted::Failed(format!(
                    "list {what}: no answer within {call_timeout:?}"
                )));
            }
        };
        items.extend(page.items.into_iter().map(|o| (key(&o), Arc::new(slim(o)))));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok((items, page.metadata.resource_version.unwrap_or_default()));
        }
    }
}

/// One watch request from `version`, applied to the store until it ends.
async fn watch<K>(
    what: &str,
    api: &Api<K>,
    call_timeout: Duration,
    view: &Arc<Mutex<View>>,
    version: &mut String,
    key: fn(&K) -> String,
    store: fn(&mut View) -> &mut Store<K>,
) -> Next
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let lock = || view.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let params = WatchParams::default().timeout(WATCH_TIMEOUT_S);
    let stream = match tokio::time::timeout(call_timeout, api.watch(&params, version)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            return Next::Relist(Some(crate::api_error(&format!("watch {what}"), e).to_string()));
        }
        Err(_) => {
            return Next::Relist(Some(format!("watch {what}: no answer within {call_timeout:?}")));
        }
    };
    store(&mut lock()).down = None;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(_) => return Next::Relist(None),
        };
        let (object, deleted) = match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
            WatchEvent::Deleted(o) => (o, true),
            WatchEvent::Bookmark(b) => {
                *version = b.metadata.resource_version;
                continue;
            }
            // 410 Gone (the version was compacted away) or any other: list again.
            WatchEvent::Error(_) => return Next::Relist(None),
        };
        if let Some(v) = object.meta().resource_version.clone() {
            *version = v;
        }
        let k = key(&object);
        let mut v = lock();
        let s = store(&mut v);
        if deleted {
            s.items.remove(&k);
        } else {
            s.items.insert(k, Arc::new(slim(object)));
        }
        v.generation += 1;
    }
    Next::Rewatch
}

/// The object without its managed fields (bulky, never read).
fn slim<K: Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}
