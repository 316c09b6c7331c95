//! Jobs and JobSets that queue for allot, the way Kueue holds them: a `batch/v1` Job, or a
//! JobSet (`jobset.x-k8s.io`, see the `jobset` module), labelled `allot.dev/queue` (or Kueue's
//! `kueue.x-k8s.io/queue-name`) and created with `spec.suspend: true`, so that no pod is made
//! until allot admits it. Its pods ask for `schedulerName: allot` (in the template), so that no
//! other scheduler places them. Pure, no I/O: what such a Job is as work, which node each of
//! its pods goes to, and how its run starts and ends.
//!
//! A Job is one piece of work of as many members as pods run at once (`parallelism`, at most
//! `completions`), placed all or none; a JobSet is one of as many members as all its Jobs run
//! at once (each replicated Job's `replicas` times its Jobs' width), its Jobs' pods alike (the
//! same GPUs each: the engine places a gang of like members). Admitting it sets `suspend:
//! false` and records the placement in the annotation `allot.dev/placement`; the backend binds
//! each pod the job controller makes to a node of the placement with room. Stopping it (a
//! pre-emption, an idle reclaim, a suspension) sets `suspend: true` again: the pods are deleted
//! (each gets its grace period: the checkpoint path), and the Job waits, suspended, to be
//! admitted again. A JobSet's pods are found through its Jobs (pod → Job → JobSet, by the
//! controllers' owner references), its Jobs are the JobSet's and never queue by themselves.

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_backend::{ForeignWork, MemberLaunch, Observation, RunId};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::jobset::{self, JobSet};
use crate::map::{self, GpuAsk, IndexGuess};

/// The label that queues a Job for allot (its value names no queue yet: projects are
/// namespaces).
pub const QUEUE_LABEL: &str = "allot.dev/queue";
/// Kueue's queue label, read too, so that Jobs written for Kueue move over unchanged.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Where allot records the nodes it admitted a Job onto (one per member, comma-separated).
pub const PLACEMENT_ANNOTATION: &str = "allot.dev/placement";

/// What kind of object queues: it decides the API path, the handle's word and the fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QueuedKind {
    Job,
    JobSet,
}

impl QueuedKind {
    /// The handle's word (`namespace/job:name`, `namespace/jobset:name`) and the one in
    /// messages (`job ns/name`).
    pub fn word(self) -> &'static str {
        match self {
            QueuedKind::Job => "job",
            QueuedKind::JobSet => "jobset",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            QueuedKind::Job => "batch/v1",
            QueuedKind::JobSet => jobset::API_VERSION,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            QueuedKind::Job => "Job",
            QueuedKind::JobSet => jobset::KIND,
        }
    }

    /// Where its pods' spec is, for the words of a refusal.
    fn pod_spec_path(self) -> &'static str {
        match self {
            QueuedKind::Job => "spec.template.spec",
            QueuedKind::JobSet => "spec.replicatedJobs[*].template.spec.template.spec",
        }
    }

    /// The fields that make its width, for the words when the width changed.
    pub fn width_fields(self) -> &'static str {
        match self {
            QueuedKind::Job => "spec.parallelism, at most spec.completions",
            QueuedKind::JobSet => {
                "spec.replicatedJobs[*].replicas and their Jobs' parallelism and completions"
            }
        }
    }
}

/// A Job or JobSet (cheap to clone: the view's objects are shared).
#[derive(Clone, Debug)]
pub enum Queued {
    Job(Arc<Job>),
    JobSet(Arc<JobSet>),
}

impl Queued {
    pub fn kind(&self) -> QueuedKind {
        match self {
            Queued::Job(_) => QueuedKind::Job,
            Queued::JobSet(_) => QueuedKind::JobSet,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Queued::Job(j) => &j.metadata,
            Queued::JobSet(j) => &j.metadata,
        }
    }

    pub fn namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or("default")
    }

    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> Option<&str> {
        self.meta().uid.as_deref()
    }

    /// `"namespace/name"`.
    pub fn key(&self) -> String {
        map::object_key(self.meta())
    }

    /// The object of `kind` named `key` (`namespace/name`) in a view's Jobs and JobSets.
    pub(crate) fn find(
        kind: QueuedKind,
        key: &str,
        jobs: &BTreeMap<String, Arc<Job>>,
        jobsets: &BTreeMap<String, Arc<JobSet>>,
    ) -> Option<Queued> {
        match kind {
            QueuedKind::Job => jobs.get(key).cloned().map(Queued::Job),
            QueuedKind::JobSet => jobsets.get(key).cloned().map(Queued::JobSet),
        }
    }

    /// `"job namespace/name"` / `"jobset namespace/name"`, for messages.
    pub fn what(&self) -> String {
        format!("{} {}", self.kind().word(), self.key())
    }

    /// Its handle: `namespace/job:name@uid` or `namespace/jobset:name@uid`.
    pub fn handle(&self) -> String {
        let (namespace, word, name) = (self.namespace(), self.kind().word(), self.name());
        match self.uid() {
            Some(uid) => format!("{namespace}/{word}:{name}@{uid}"),
            None => format!("{namespace}/{word}:{name}"),
        }
    }

    /// Whether it queues for allot (a Job a JobSet controls is the JobSet's, never queued).
    pub fn queues_for_allot(&self) -> bool {
        let labelled = self
            .meta()
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(QUEUE_LABEL) || l.contains_key(KUEUE_QUEUE_LABEL));
        labelled && !matches!(self, Queued::Job(j) if jobset_owner(j).is_some())
    }

    pub fn is_suspended(&self) -> bool {
        match self {
            Queued::Job(j) => j.spec.as_ref().and_then(|s| s.suspend) == Some(true),
            Queued::JobSet(j) => j.spec.as_ref().and_then(|s| s.suspend) == Some(true),
        }
    }

    /// How it finished, once it has: `Ok` with the words of its Complete (a Job) or Completed
    /// (a JobSet) condition, `Err` with those of its Failed one.
    pub fn finished(&self) -> Option<Result<String, String>> {
        let true_conditions: Vec<(&str, Option<&String>, Option<&String>)> = match self {
            Queued::Job(j) => j
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.status == "True")
                .map(|c| (c.type_.as_str(), c.message.as_ref(), c.reason.as_ref()))
                .collect(),
            Queued::JobSet(j) => j
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default()
                .iter()
                .filter(|c| c.status == "True")
                .map(|c| (c.type_.as_str(), c.message.as_ref(), c.reason.as_ref()))
                .collect(),
        };
        true_conditions.into_iter().find_map(|(type_, message, reason)| {
            let words = message.or(reason).cloned().unwrap_or_default();
            match type_ {
                "Complete" | "Completed" => Some(Ok(words)),
                "Failed" => Some(Err(words)),
                _ => None,
            }
        })
    }

    /// Pods that run at once (see [`spec_width`]); a JobSet's, over all its Jobs.
    pub fn width(&self) -> u32 {
        match self {
            Queued::Job(j) => spec_width(j.spec.as_ref()),
            Queued::JobSet(j) => replicated_jobs(j)
                .iter()
                .map(|r| {
                    let replicas = u32::try_from(r.replicas.unwrap_or(1)).unwrap_or(0);
                    replicas.saturating_mul(spec_width(r.template.spec.as_ref()))
                })
                .fold(0, u32::saturating_add),
        }
    }

    /// The pod its template makes, named and placed as the object (for reading what it asks:
    /// GPUs, model, scheduler). Its annotations and labels are the pod template's with the
    /// object's over them (the intent annotations may be written on either); a JobSet's, its
    /// first replicated Job's. `Err`: a JobSet whose replicated Jobs ask for different GPUs or
    /// schedulers, which allot does not place (why, naming the fields and the fix).
    pub fn template_pod(&self) -> Result<Pod, String> {
        match self {
            Queued::Job(j) => {
                let template = j.spec.as_ref().map(|s| &s.template);
                Ok(pod_of(&j.metadata, None, template))
            }
            Queued::JobSet(j) => {
                // JobSet's webhook makes its Jobs Indexed, which the API server refuses without
                // `completions` once `parallelism` is set: the controller would make no Job and
                // say so only in its log, and the JobSet, admitted, would hold its GPUs idle.
                let unmade = replicated_jobs(j).iter().find(|r| {
                    r.template.spec.as_ref().is_some_and(|s| {
                        s.completion_mode.as_deref() == Some("Indexed")
                            && s.parallelism.is_some()
                            && s.completions.is_none()
                    })
                });
                if let Some(r) = unmade {
                    return Err(format!(
                        "spec.replicatedJobs[{:?}].template.spec sets parallelism without \
                         completions: its Jobs are Indexed, which need completions, so the \
                         JobSet controller would make none; set completions too (or neither)",
                        r.name
                    ));
                }
                let pods: Vec<(String, Pod)> = replicated_jobs(j)
                    .iter()
                    .filter(|r| r.replicas != Some(0))
                    .map(|r| {
                        let template = r.template.spec.as_ref().map(|s| &s.template);
                        let job_meta = r.template.metadata.as_ref();
                        (r.name.clone(), pod_of(&j.metadata, job_meta, template))
                    })
                    .collect();
                let Some((first_name, first)) = pods.first() else {
                    return Err("spec.replicatedJobs is empty: a JobSet of no Job runs nothing;                                 add a replicated Job"
                        .to_string());
                };
                let shape = |pod: &Pod| (map::gpu_ask(pod).ok(), map::asks_allot(pod));
                let first_shape = shape(first);
                if let Some((name, pod)) = pods.iter().find(|(_, p)| shape(p) != first_shape) {
                    let asks = |pod: &Pod| match map::gpu_ask(pod) {
                        Ok(ask) => format!("{} {}", ask.gpus, ask.resource),
                        Err(_) => "an unreadable GPU request".to_string(),
                    };
                    return Err(format!(
                        "spec.replicatedJobs: replicated Job {name:?} asks for {} a pod                          (schedulerName {:?}), {first_name:?} for {} (schedulerName {:?}): allot                          places a JobSet as one gang of like pods; give every replicated Job the                          same GPU request and schedulerName: {}, or queue the others as a                          JobSet or Job of their own",
                        asks(pod),
                        scheduler_of(pod),
                        asks(first),
                        scheduler_of(first),
                        map::SCHEDULER_NAME
                    ));
                }
                Ok(first.clone())
            }
        }
    }
}

fn scheduler_of(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()).unwrap_or("default-scheduler")
}

fn replicated_jobs(j: &JobSet) -> &[jobset::ReplicatedJob] {
    j.spec.as_ref().map(|s| s.replicated_jobs.as_slice()).unwrap_or_default()
}

/// A pod of `template`, named and placed as `owner`, its annotations and labels the
/// template's with the middle layer's (a JobSet's Job template) and then the owner's over them.
fn pod_of(
    owner: &ObjectMeta,
    middle: Option<&ObjectMeta>,
    template: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>,
) -> Pod {
    let template = template.cloned().unwrap_or_default();
    let mut metadata = template.metadata.unwrap_or_default();
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    let mut labels = metadata.labels.take().unwrap_or_default();
    for layer in middle.into_iter().chain([owner]) {
        annotations.extend(layer.annotations.clone().unwrap_or_default());
        labels.extend(layer.labels.clone().unwrap_or_default());
    }
    metadata.annotations = Some(annotations);
    metadata.labels = Some(labels);
    metadata.name.clone_from(&owner.name);
    metadata.namespace.clone_from(&owner.namespace);
    metadata.uid.clone_from(&owner.uid);
    Pod { metadata, spec: template.spec, status: None }
}

/// The object's controller reference of `kind`, if it has one.
fn controller(
    references: Option<&Vec<OwnerReference>>,
    kind: QueuedKind,
) -> Option<&OwnerReference> {
    references?.iter().find(|o| {
        o.controller == Some(true) && o.kind == kind.kind() && o.api_version == kind.api_version()
    })
}

/// The JobSet that controls the Job: (name, uid).
pub fn jobset_owner(job: &Job) -> Option<(&str, &str)> {
    controller(job.metadata.owner_references.as_ref(), QueuedKind::JobSet)
        .map(|o| (o.name.as_str(), o.uid.as_str()))
}

/// The uid of the Job that controls the pod, if a Job does.
pub fn owner_job_uid(pod: &Pod) -> Option<&str> {
    controller(pod.metadata.owner_references.as_ref(), QueuedKind::Job).map(|o| o.uid.as_str())
}

/// The uid of the object that queued the pod's work: the JobSet of its Job, where `jobs` (by
/// `namespace/name`) show the Job and a JobSet controls it, else its Job.
pub fn queued_owner_uid<'a>(pod: &'a Pod, jobs: &'a BTreeMap<String, Arc<Job>>) -> Option<&'a str> {
    let owner = controller(pod.metadata.owner_references.as_ref(), QueuedKind::Job)?;
    let key = format!("{}/{}", map::pod_namespace(pod), owner.name);
    let job = jobs.get(&key).filter(|j| j.metadata.uid.as_deref() == Some(owner.uid.as_str()));
    match job.and_then(|j| jobset_owner(j)) {
        Some((_, jobset_uid)) => Some(jobset_uid),
        None => Some(owner.uid.as_str()),
    }
}

/// The JobSet (`namespace/name`) whose Jobs made the pod, by the label the JobSet controller
/// puts on them (for a pod whose Job the view does not show yet).
pub fn labelled_jobset(pod: &Pod) -> Option<String> {
    let name = pod.metadata.labels.as_ref()?.get(jobset::NAME_LABEL)?;
    Some(format!("{}/{name}", map::pod_namespace(pod)))
}

/// Pods that run at once of a Job of `spec`: `parallelism` (1 when unset), at most
/// `completions` when set.
pub fn spec_width(spec: Option<&JobSpec>) -> u32 {
    let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
    let width = match spec.and_then(|s| s.completions) {
        Some(completions) => parallelism.min(completions),
        None => parallelism,
    };
    u32::try_from(width).unwrap_or(0)
}

/// The object as work, `None` when there is nothing to run (finished, or no pod runs at once).
/// `pods`: its pods that have not finished. Bound pods with no run of allot's holding it (a
/// daemon that lost its log, or one created without `suspend` and placed by hand) are running
/// work, taken as they run. One whose template allot cannot place is refused, the reason
/// naming the field and the fix.
pub fn job_work(
    queued: &Queued,
    pods: &[&Pod],
    fleet: &map::Fleet,
    guess: &mut IndexGuess,
) -> Option<ForeignWork> {
    if queued.finished().is_some() {
        return None;
    }
    let nodes = queued.width();
    if nodes == 0 {
        return None;
    }
    let kind = queued.kind();
    let template = queued.template_pod();
    let pod = template.clone().unwrap_or_default();
    let ask = template.clone().and_then(|_| map::gpu_ask(&pod));
    let asked = ask.clone().unwrap_or_else(|_| GpuAsk::none());
    let intent = map::pod_intent(&pod);
    let models = ask.clone().and_then(|a| map::acceptable_models(&pod, &a, fleet));
    let mut running: Vec<MemberLaunch> = Vec::new();
    let mut started_ms: Option<u64> = None;
    for pod in pods.iter().filter(|p| !map::is_terminal(p)) {
        if let Some(node) = map::bound_node(pod) {
            running.push(map::running_member(node, &asked, guess));
            started_ms = match (started_ms, map::started_ms(pod)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    let path = kind.pod_spec_path();
    let refusal = if !running.is_empty() {
        None
    } else if let Err(why) = &template {
        Some(format!("{why}; the {} stays suspended", kind.kind()))
    } else if !map::asks_allot(&pod) {
        let asked = pod.spec.as_ref().and_then(|s| s.scheduler_name.clone());
        Some(format!(
            "{path}.schedulerName is {}: a {} queued for allot (label {QUEUE_LABEL}) must ask              for schedulerName: {} in its pod template, or another scheduler would place its              pods; delete it and create it again with it",
            asked.map_or_else(
                || "not set (the default scheduler)".to_string(),
                |s| format!("{s:?}")
            ),
            kind.kind(),
            map::SCHEDULER_NAME
        ))
    } else {
        match (&ask, &intent, &models) {
            (Err(why), _, _) | (Ok(_), Err(why), _) | (Ok(_), Ok(_), Err(why)) => Some(format!(
                "{}; the {} stays suspended (correct it, or delete it and create it again)",
                why.replace("spec.containers", &format!("{path}.containers"))
                    .replace("spec.nodeSelector", &format!("{path}.nodeSelector")),
                kind.kind()
            )),
            _ => None,
        }
    };
    let mut work = ForeignWork {
        handle: queued.handle(),
        name: queued.name().to_string(),
        project: queued.namespace().to_string(),
        user: map::pod_user(&pod),
        nodes,
        gpus_per_node: asked.gpus,
        // Running work is taken where it runs: no model to choose.
        models: if running.is_empty() { models.unwrap_or_default() } else { Vec::new() },
        started_ms: started_ms.filter(|_| !running.is_empty()),
        running,
        refusal,
        intent: intent.unwrap_or_default(),
    };
    if !work.running.is_empty() {
        work.nodes = u32::try_from(work.running.len()).unwrap_or(u32::MAX);
    }
    Some(work)
}

/// The nodes of a placement as the annotation writes them.
pub fn placement_text(members: &[MemberLaunch]) -> String {
    members.iter().map(|m| m.node.as_str()).collect::<Vec<_>>().join(",")
}

/// Where each of the Job's unbound pods goes: a node of `members` with room (a member is a
/// place for one pod; pods bound there and not finished, terminating ones too, fill them),
/// pods by name. Pods that find no room wait (a pod replacing one that finished takes its
/// place once that one is gone).
pub fn assign<'p>(members: &[MemberLaunch], pods: &[&'p Pod]) -> Vec<(&'p Pod, String)> {
    let mut room: BTreeMap<&str, i64> = BTreeMap::new();
    for m in members {
        *room.entry(m.node.as_str()).or_default() += 1;
    }
    for pod in pods.iter().filter(|p| !map::is_terminal(p)) {
        if let Some(node) = map::bound_node(pod)
            && let Some(r) = room.get_mut(node)
        {
            *r -= 1;
        }
    }
    let mut waiting: Vec<&'p Pod> = pods
        .iter()
        .copied()
        .filter(|p| map::bound_node(p).is_none())
        .filter(|p| !map::is_terminal(p) && !map::is_terminating(p) && !map::is_gated(p))
        .filter(|p| map::asks_allot(p))
        .collect();
    waiting.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for pod in waiting {
        let Some((node, r)) = room.iter_mut().find(|(_, r)| **r > 0) else { break };
        *r -= 1;
        out.push((pod, (*node).to_string()));
    }
    out
}

/// A Job's run: which Job, and what was seen of it.
#[derive(Clone, Debug)]
pub(crate) struct JobRun {
    pub(crate) kind: QueuedKind,
    pub(crate) name: String,
    /// `namespace/name`, for the words.
    pub(crate) key: String,
    pub(crate) uid: Option<String>,
    /// The view showed the Job resumed (`suspend` false) since allot admitted it: a Job
    /// suspended after that was suspended by someone (allot, on a stop, or its user).
    pub(crate) seen_resumed: bool,
}

/// What the Job's run is now, judged from the Job (`None`: gone) and its pods (not finished
/// ones and finished ones alike). `started`: the run was reported started already;
/// `stopped_by_allot`: allot suspended it. Returns whether it runs now (a pod ran), and its
/// end once it ended.
pub(crate) fn observe(
    run: RunId,
    job_run: &mut JobRun,
    job: Option<&Queued>,
    pods: &[&Pod],
    stopped_by_allot: bool,
) -> (bool, Option<Observation>) {
    let job = job.filter(|j| job_run.uid.is_none() || j.uid() == job_run.uid.as_deref());
    let what = format!("{} {}", job_run.kind.word(), job_run.key);
    let ran = pods.iter().any(|p| matches!(map::phase(p), "Running" | "Succeeded" | "Failed"));
    let Some(job) = job else {
        let end = if stopped_by_allot {
            Observation::Exited {
                run,
                code: None,
                detail: format!("{what} deleted while allot stopped it"),
            }
        } else {
            Observation::Cancelled {
                run,
                detail: format!("{what} deleted outside allot (kubectl delete)"),
            }
        };
        return (ran, Some(end));
    };
    if let Some(result) = job.finished() {
        let end = match result {
            Ok(words) => Observation::Exited {
                run,
                code: Some(0),
                detail: format!("{what} Complete{}", suffix(&words)),
            },
            Err(words) => {
                // The code of a pod that failed with one, else none known.
                let failed = pods
                    .iter()
                    .filter(|p| map::phase(p) == "Failed")
                    .map(|p| (p, map::exit_status(p)))
                    .find(|(_, (code, _))| code.is_some_and(|c| c != 0));
                match failed {
                    Some((pod, (code, detail))) => Observation::Exited {
                        run,
                        code,
                        detail: format!(
                            "{what} Failed{}: pod {}: {detail}",
                            suffix(&words),
                            pod.metadata.name.as_deref().unwrap_or_default()
                        ),
                    },
                    None => Observation::Exited {
                        run,
                        code: None,
                        detail: format!("{what} Failed{}", suffix(&words)),
                    },
                }
            }
        };
        return (ran, Some(end));
    }
    if !job.is_suspended() {
        job_run.seen_resumed = true;
        return (ran, None);
    }
    let active = pods.iter().any(|p| !map::is_terminal(p));
    if active || !(stopped_by_allot || job_run.seen_resumed) {
        // Pods still stopping; or the view does not show allot's resume yet.
        return (ran, None);
    }
    let end = if stopped_by_allot {
        Observation::Exited {
            run,
            code: None,
            detail: format!("{what} suspended by allot (it waits to be admitted again)"),
        }
    } else {
        Observation::Cancelled {
            run,
            detail: format!("{what} suspended outside allot (spec.suspend: true)"),
        }
    };
    (ran, Some(end))
}

fn suffix(words: &str) -> String {
    if words.is_empty() { String::new() } else { format!(" ({words})") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RUN: RunId = RunId { workload: 3, attempt: 1 };

    fn job(extra: serde_json::Value) -> Queued {
        let mut base = json!({
            "metadata": { "name": "train", "namespace": "team-a", "uid": "u-1",
                          "labels": { "allot.dev/queue": "default" },
                          "annotations": { "allot.dev/kind": "training" } },
            "spec": {
                "suspend": true,
                "parallelism": 2,
                "completions": 4,
                "template": { "spec": {
                    "schedulerName": "allot",
                    "restartPolicy": "Never",
                    "nodeSelector": { "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" },
                    "containers": [{ "name": "main", "image": "x",
                                     "resources": { "limits": { "nvidia.com/gpu": "4" } } }]
                } }
            }
        });
        merge(&mut base, extra);
        Queued::Job(Arc::new(serde_json::from_value(base).expect("a Job")))
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    fn pod(name: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "team-a",
                          "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job",
                                                "name": "train", "uid": "u-1",
                                                "controller": true }] },
            "spec": { "schedulerName": "allot", "nodeName": node,
                      "containers": [{ "name": "main" }] },
            "status": { "phase": phase }
        }))
        .expect("a pod")
    }

    fn members(nodes: &[&str]) -> Vec<MemberLaunch> {
        nodes.iter().map(|n| MemberLaunch { node: (*n).to_string(), devices: Vec::new() }).collect()
    }

    #[test]
    fn a_suspended_job_is_pending_work_as_wide_as_its_parallelism() {
        let j = job(json!({}));
        assert!(j.queues_for_allot());
        let work =
            job_work(&j, &[], &map::tests_fleet(), &mut IndexGuess::default()).expect("work");
        assert_eq!(work.handle, "team-a/job:train@u-1");
        assert_eq!((work.nodes, work.gpus_per_node), (2, 4));
        assert_eq!(work.models, ["NVIDIA-H100-80GB-HBM3"]);
        assert_eq!(work.refusal, None);
        assert!(work.running.is_empty());
        assert_eq!(work.intent.kind.as_deref(), Some("training"), "the Job's annotation");
        let narrow = job(json!({ "spec": { "parallelism": 8, "completions": 1 } }));
        assert_eq!(
            job_work(&narrow, &[], &map::tests_fleet(), &mut IndexGuess::default())
                .map(|w| w.nodes),
            Some(1)
        );
        let none = job(json!({ "spec": { "parallelism": 0 } }));
        assert!(job_work(&none, &[], &map::tests_fleet(), &mut IndexGuess::default()).is_none());
        let kueue = job(json!({ "metadata": { "labels": null } }));
        assert!(!kueue.queues_for_allot());
    }

    #[test]
    fn a_job_whose_pods_would_go_to_another_scheduler_is_refused_naming_the_field() {
        let j = job(json!({ "spec": { "template": { "spec": { "schedulerName": null } } } }));
        let work =
            job_work(&j, &[], &map::tests_fleet(), &mut IndexGuess::default()).expect("work");
        let why = work.refusal.expect("refused");
        assert!(why.contains("spec.template.spec.schedulerName"), "{why}");
        assert!(why.contains("schedulerName: allot"), "{why}");
        let bad = job(json!({ "metadata": { "annotations": { "allot.dev/max-runtime": "5" } } }));
        let why = job_work(&bad, &[], &map::tests_fleet(), &mut IndexGuess::default())
            .and_then(|w| w.refusal);
        assert!(why.is_some_and(|w| w.contains("allot.dev/max-runtime")));
        let other_model = json!({ "spec": { "template": { "spec": {
            "nodeSelector": { "nvidia.com/gpu.product": "NVIDIA-B200" } } } } });
        let j = job(other_model);
        let why = job_work(&j, &[], &map::tests_fleet(), &mut IndexGuess::default())
            .and_then(|w| w.refusal)
            .expect("refused");
        assert!(why.contains("spec.template.spec.nodeSelector[nvidia.com/gpu.product]"), "{why}");
        assert!(why.contains("stays suspended"), "{why}");
    }

    #[test]
    fn a_finished_job_is_no_work_and_a_running_one_is_taken_as_it_runs() {
        let done = job(json!({ "status": { "conditions": [
            { "type": "Complete", "status": "True" } ] } }));
        assert!(job_work(&done, &[], &map::tests_fleet(), &mut IndexGuess::default()).is_none());
        let running = job(json!({ "spec": { "suspend": false } }));
        let a = pod("train-a", Some("n1"), "Running");
        let b = pod("train-b", Some("n2"), "Running");
        let work = job_work(&running, &[&a, &b], &map::tests_fleet(), &mut IndexGuess::default())
            .expect("work");
        assert_eq!(work.running.len(), 2);
        assert_eq!(work.running[0].devices.len(), 4);
    }

    #[test]
    fn pods_go_to_nodes_with_room_by_name_and_wait_when_none_is_left() {
        let placed = members(&["n1", "n2"]);
        let a = pod("train-a", Some("n1"), "Running");
        let b = pod("train-b", None, "Pending");
        let c = pod("train-c", None, "Pending");
        let got = assign(&placed, &[&c, &a, &b]);
        let names: Vec<(&str, &str)> = got
            .iter()
            .map(|(p, n)| (p.metadata.name.as_deref().unwrap_or_default(), n.as_str()))
            .collect();
        assert_eq!(names, vec![("train-b", "n2")]);
        // A pod that finished leaves its place to the next.
        let done = pod("train-a", Some("n1"), "Succeeded");
        let got = assign(&placed, &[&done, &b, &c]);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn a_job_run_ends_complete_failed_suspended_or_deleted() {
        let mut r = JobRun {
            kind: QueuedKind::Job,
            name: "train".into(),
            key: "team-a/train".into(),
            uid: Some("u-1".into()),
            seen_resumed: false,
        };
        let resumed = job(json!({ "spec": { "suspend": false } }));
        let a = pod("train-a", Some("n1"), "Running");
        assert_eq!(observe(RUN, &mut r, Some(&resumed), &[&a], false), (true, None));
        assert!(r.seen_resumed);
        let complete = job(json!({ "status": { "conditions": [
            { "type": "Complete", "status": "True" } ] } }));
        let (_, end) = observe(RUN, &mut r, Some(&complete), &[], false);
        assert!(matches!(end, Some(Observation::Exited { code: Some(0), .. })), "{end:?}");
        // Suspended by allot: ends once its pods are gone.
        let suspended = job(json!({}));
        assert_eq!(observe(RUN, &mut r, Some(&suspended), &[&a], true).1, None);
        let (_, end) = observe(RUN, &mut r, Some(&suspended), &[], true);
        assert!(matches!(end, Some(Observation::Exited { code: None, .. })), "{end:?}");
        // Not yet seen resumed and not stopped: the view is behind allot's resume.
        let mut fresh = JobRun {
            kind: QueuedKind::Job,
            name: "train".into(),
            key: "team-a/train".into(),
            uid: Some("u-1".into()),
            seen_resumed: false,
        };
        assert_eq!(observe(RUN, &mut fresh, Some(&suspended), &[], false).1, None);
        let (_, end) = observe(RUN, &mut fresh, None, &[], false);
        assert!(matches!(end, Some(Observation::Cancelled { .. })), "{end:?}");
        let failed = job(json!({ "status": { "conditions": [
            { "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded" } ] } }));
        let mut bad: Pod = pod("train-b", Some("n1"), "Failed");
        bad.status = serde_json::from_value(json!({ "phase": "Failed", "containerStatuses": [
            { "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
              "state": { "terminated": { "exitCode": 3 } } } ] }))
        .ok();
        let (_, end) = observe(RUN, &mut r, Some(&failed), &[&bad], false);
        assert!(matches!(end, Some(Observation::Exited { code: Some(3), .. })), "{end:?}");
    }

    fn jobset(extra: serde_json::Value) -> Queued {
        let worker = |parallelism: i32, gpus: &str| {
            json!({ "spec": { "parallelism": parallelism, "template": {
                "metadata": { "annotations": { "allot.dev/preemptible": "true" } },
                "spec": { "schedulerName": "allot", "restartPolicy": "Never",
                          "containers": [{ "name": "main", "image": "x",
                                           "resources": { "limits": { "nvidia.com/gpu": gpus } } }] }
            } } })
        };
        let mut base = json!({
            "metadata": { "name": "llm", "namespace": "team-a", "uid": "u-js",
                          "labels": { "allot.dev/queue": "default" },
                          "annotations": { "allot.dev/kind": "training" } },
            "spec": { "suspend": true, "replicatedJobs": [
                { "name": "workers", "replicas": 2, "template": worker(2, "8") },
                { "name": "leader", "template": worker(1, "8") } ] }
        });
        merge(&mut base, extra);
        Queued::JobSet(Arc::new(serde_json::from_value(base).expect("a JobSet")))
    }

    #[test]
    fn a_suspended_jobset_is_one_gang_as_wide_as_all_its_jobs() {
        let js = jobset(json!({}));
        assert!(js.queues_for_allot());
        assert_eq!(js.width(), 5, "2 Jobs of 2 pods and one of 1");
        let work =
            job_work(&js, &[], &map::tests_fleet(), &mut IndexGuess::default()).expect("work");
        assert_eq!(work.handle, "team-a/jobset:llm@u-js");
        assert_eq!((work.nodes, work.gpus_per_node), (5, 8));
        assert_eq!(work.refusal, None);
        // The intent from the JobSet's annotations and its pod templates' alike.
        assert_eq!(work.intent.kind.as_deref(), Some("training"));
        assert_eq!(work.intent.preemptible, Some(true));
        let handle = js.handle();
        assert!(matches!(
            map::parse_handle(&handle),
            Some(map::Handle::Job { kind: QueuedKind::JobSet, name: "llm", .. })
        ));
    }

    #[test]
    fn a_jobset_of_unlike_pods_or_of_no_job_is_refused_naming_the_fields() {
        let unlike = jobset(json!({ "spec": { "replicatedJobs": [
            { "name": "workers", "replicas": 2, "template": { "spec": { "template": { "spec": {
                "schedulerName": "allot", "containers": [{ "name": "main",
                "resources": { "limits": { "nvidia.com/gpu": "8" } } }] } } } } },
            { "name": "driver", "template": { "spec": { "template": { "spec": {
                "schedulerName": "allot", "containers": [{ "name": "main" }] } } } } } ] } }));
        let why = job_work(&unlike, &[], &map::tests_fleet(), &mut IndexGuess::default())
            .and_then(|w| w.refusal)
            .expect("refused");
        assert!(why.contains("\"driver\" asks for 0 nvidia.com/gpu"), "{why}");
        assert!(why.contains("same GPU request"), "{why}");
        let other_scheduler = jobset(json!({ "spec": { "replicatedJobs": [
            { "name": "workers", "template": { "spec": { "template": { "spec": {
                "containers": [{ "name": "main" }] } } } } } ] } }));
        let why = job_work(&other_scheduler, &[], &map::tests_fleet(), &mut IndexGuess::default())
            .and_then(|w| w.refusal)
            .expect("refused");
        assert!(why.contains("spec.replicatedJobs[*].template.spec.template.spec.schedulerName"));
        let indexed = jobset(json!({ "spec": { "replicatedJobs": [
            { "name": "workers", "template": { "spec": { "parallelism": 2,
                "completionMode": "Indexed", "template": { "spec": {
                "schedulerName": "allot", "containers": [{ "name": "main" }] } } } } } ] } }));
        let why = job_work(&indexed, &[], &map::tests_fleet(), &mut IndexGuess::default())
            .and_then(|w| w.refusal)
            .expect("refused");
        assert!(why.contains("parallelism without completions"), "{why}");
        let empty = jobset(json!({ "spec": { "replicatedJobs": [] } }));
        assert!(job_work(&empty, &[], &map::tests_fleet(), &mut IndexGuess::default()).is_none());
    }

    #[test]
    fn a_jobsets_pods_are_its_through_its_jobs_which_never_queue_by_themselves() {
        let child: Job = serde_json::from_value(json!({
            "metadata": { "name": "llm-workers-0", "namespace": "team-a", "uid": "u-job",
                          "labels": { "allot.dev/queue": "default" },
                          "ownerReferences": [{ "apiVersion": "jobset.x-k8s.io/v1alpha2",
                                                "kind": "JobSet", "name": "llm", "uid": "u-js",
                                                "controller": true }] } }))
        .expect("a Job");
        assert!(!Queued::Job(Arc::new(child.clone())).queues_for_allot());
        let jobs: BTreeMap<String, Arc<Job>> =
            [("team-a/llm-workers-0".to_string(), Arc::new(child))].into_iter().collect();
        let mut p = pod("llm-workers-0-0", None, "Pending");
        p.metadata.owner_references = serde_json::from_value(json!([{ "apiVersion": "batch/v1",
            "kind": "Job", "name": "llm-workers-0", "uid": "u-job", "controller": true }]))
        .ok();
        assert_eq!(queued_owner_uid(&p, &jobs), Some("u-js"));
        // Its Job not in the view yet: the Job's uid, and the JobSet by its label.
        assert_eq!(queued_owner_uid(&p, &BTreeMap::new()), Some("u-job"));
        p.metadata.labels =
            Some([(jobset::NAME_LABEL.to_string(), "llm".to_string())].into_iter().collect());
        assert_eq!(labelled_jobset(&p).as_deref(), Some("team-a/llm"));
    }

    #[test]
    fn a_jobset_run_ends_completed_or_failed_in_its_own_words() {
        let mut r = JobRun {
            kind: QueuedKind::JobSet,
            name: "llm".into(),
            key: "team-a/llm".into(),
            uid: Some("u-js".into()),
            seen_resumed: true,
        };
        let done = jobset(json!({ "spec": { "suspend": false }, "status": { "conditions": [
            { "type": "Completed", "status": "True", "message": "jobset completed successfully" }
        ] } }));
        assert!(done.finished().is_some_and(|f| f.is_ok()));
        let (_, end) = observe(RUN, &mut r, Some(&done), &[], false);
        let Some(Observation::Exited { code: Some(0), detail, .. }) = end else {
            panic!("{end:?}")
        };
        assert_eq!(detail, "jobset team-a/llm Complete (jobset completed successfully)");
        let failed = jobset(json!({ "status": { "conditions": [
            { "type": "Failed", "status": "True", "reason": "FailedJobs" } ] } }));
        let (_, end) = observe(RUN, &mut r, Some(&failed), &[], false);
        assert!(matches!(end, Some(Observation::Exited { code: None, .. })), "{end:?}");
    }
}
