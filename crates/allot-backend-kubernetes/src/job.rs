//! Jobs that queue for allot, the way Kueue holds them: a `batch/v1` Job labelled
//! `allot.dev/queue` (or Kueue's `kueue.x-k8s.io/queue-name`) and created with
//! `spec.suspend: true`, so that the job controller makes no pod until allot admits it. Its
//! pods ask for `schedulerName: allot` (in the template), so that no other scheduler places
//! them. Pure, no I/O: what such a Job is as work, which node each of its pods goes to, and
//! how its run starts and ends.
//!
//! A Job is one piece of work of as many members as pods run at once (`parallelism`, at most
//! `completions`), placed all or none. Admitting it sets `suspend: false` and records the
//! placement in the annotation `allot.dev/placement`; the backend binds each pod the job
//! controller makes to a node of the placement with room. Stopping it (a pre-emption, an idle
//! reclaim, a suspension) sets `suspend: true` again: the job controller deletes its pods
//! (each gets its grace period: the checkpoint path), and the Job waits, suspended, to be
//! admitted again.

use std::collections::BTreeMap;

use allot_backend::{ForeignWork, MemberLaunch, Observation, RunId};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::map::{self, GpuAsk, IndexGuess};

/// The label that queues a Job for allot (its value names no queue yet: projects are
/// namespaces).
pub const QUEUE_LABEL: &str = "allot.dev/queue";
/// Kueue's queue label, read too, so that Jobs written for Kueue move over unchanged.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Where allot records the nodes it admitted a Job onto (one per member, comma-separated).
pub const PLACEMENT_ANNOTATION: &str = "allot.dev/placement";

/// Whether the Job queues for allot.
pub fn queues_for_allot(job: &Job) -> bool {
    job.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(QUEUE_LABEL) || l.contains_key(KUEUE_QUEUE_LABEL))
}

pub fn job_namespace(job: &Job) -> &str {
    job.metadata.namespace.as_deref().unwrap_or("default")
}

/// `"namespace/name"`.
pub fn job_key(job: &Job) -> String {
    format!("{}/{}", job_namespace(job), job.metadata.name.as_deref().unwrap_or_default())
}

/// A Job's handle: `namespace/job:name@uid`.
pub fn job_handle(job: &Job) -> String {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    match job.metadata.uid.as_deref() {
        Some(uid) => format!("{}/job:{name}@{uid}", job_namespace(job)),
        None => format!("{}/job:{name}", job_namespace(job)),
    }
}

pub fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// How the Job finished, once it has: `Ok` with the Complete condition's words, `Err` with
/// the Failed condition's.
pub fn finished(job: &Job) -> Option<Result<String, String>> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().filter(|c| c.status == "True").find_map(|c| {
        let words = c.message.clone().or_else(|| c.reason.clone()).unwrap_or_default();
        match c.type_.as_str() {
            "Complete" => Some(Ok(words)),
            "Failed" => Some(Err(words)),
            _ => None,
        }
    })
}

/// The uid of the Job that controls the pod, if a Job does.
pub fn owner_job_uid(pod: &Pod) -> Option<&str> {
    pod.metadata.owner_references.as_ref()?.iter().find_map(|o| {
        (o.controller == Some(true) && o.kind == "Job" && o.api_version == "batch/v1")
            .then_some(o.uid.as_str())
    })
}

/// The pod the Job's template makes, named and placed as the Job (for reading what it asks:
/// GPUs, model, scheduler). Its annotations are the template's with the Job's over them: the
/// intent annotations may be written on either.
pub fn template_pod(job: &Job) -> Pod {
    let template = job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let mut metadata = template.metadata.unwrap_or_default();
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    annotations.extend(job.metadata.annotations.clone().unwrap_or_default());
    metadata.annotations = Some(annotations);
    metadata.name.clone_from(&job.metadata.name);
    metadata.namespace.clone_from(&job.metadata.namespace);
    metadata.uid.clone_from(&job.metadata.uid);
    let mut labels = metadata.labels.take().unwrap_or_default();
    labels.extend(job.metadata.labels.clone().unwrap_or_default());
    metadata.labels = Some(labels);
    Pod { metadata, spec: template.spec, status: None }
}

/// Pods that run at once: `parallelism` (1 when unset), at most `completions` when set.
pub fn width(job: &Job) -> u32 {
    let spec = job.spec.as_ref();
    let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
    let width = match spec.and_then(|s| s.completions) {
        Some(completions) => parallelism.min(completions),
        None => parallelism,
    };
    u32::try_from(width).unwrap_or(0)
}

/// The Job as work, `None` when there is nothing to run (finished, or no pod runs at once).
/// `pods`: its pods that have not finished. Bound pods with no run of allot's holding the Job
/// (a daemon that lost its log, or a Job created without `suspend` and placed by hand) are
/// running work, taken as they run. A Job whose template allot cannot place is refused, the
/// reason naming the field and the fix.
pub fn job_work(
    job: &Job,
    pods: &[&Pod],
    fleet: &map::Fleet,
    guess: &mut IndexGuess,
) -> Option<ForeignWork> {
    if finished(job).is_some() {
        return None;
    }
    let nodes = width(job);
    if nodes == 0 {
        return None;
    }
    let template = template_pod(job);
    let ask = map::gpu_ask(&template);
    let asked = ask.clone().unwrap_or_else(|_| GpuAsk::none());
    let intent = map::pod_intent(&template);
    let models = ask.clone().and_then(|a| map::acceptable_models(&template, &a, fleet));
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
    let name = job.metadata.name.clone().unwrap_or_default();
    let refusal = if !running.is_empty() {
        None
    } else if !map::asks_allot(&template) {
        let asked = template.spec.as_ref().and_then(|s| s.scheduler_name.clone());
        Some(format!(
            "spec.template.spec.schedulerName is {}: a Job queued for allot (label {QUEUE_LABEL}) \
             must ask for schedulerName: {} in its pod template, or another scheduler would \
             place its pods; delete the Job and create it again with it",
            asked.map_or_else(
                || "not set (the default scheduler)".to_string(),
                |s| format!("{s:?}")
            ),
            map::SCHEDULER_NAME
        ))
    } else {
        match (&ask, &intent, &models) {
            (Err(why), _, _) | (Ok(_), Err(why), _) | (Ok(_), Ok(_), Err(why)) => Some(format!(
                "{}; the Job stays suspended (correct it, or delete it and create it again)",
                why.replace("spec.containers", "spec.template.spec.containers")
                    .replace("spec.nodeSelector", "spec.template.spec.nodeSelector")
            )),
            _ => None,
        }
    };
    let mut work = ForeignWork {
        handle: job_handle(job),
        name,
        project: job_namespace(job).to_string(),
        user: map::pod_user(&template),
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
    job: Option<&Job>,
    pods: &[&Pod],
    stopped_by_allot: bool,
) -> (bool, Option<Observation>) {
    let job = job.filter(|j| job_run.uid.is_none() || j.metadata.uid == job_run.uid);
    let ran = pods.iter().any(|p| matches!(map::phase(p), "Running" | "Succeeded" | "Failed"));
    let Some(job) = job else {
        let end = if stopped_by_allot {
            Observation::Exited {
                run,
                code: None,
                detail: format!("job {} deleted while allot stopped it", job_run.key),
            }
        } else {
            Observation::Cancelled {
                run,
                detail: format!("job {} deleted outside allot (kubectl delete)", job_run.key),
            }
        };
        return (ran, Some(end));
    };
    if let Some(result) = finished(job) {
        let end = match result {
            Ok(words) => Observation::Exited {
                run,
                code: Some(0),
                detail: format!("job {} Complete{}", job_run.key, suffix(&words)),
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
                            "job {} Failed{}: pod {}: {detail}",
                            job_run.key,
                            suffix(&words),
                            pod.metadata.name.as_deref().unwrap_or_default()
                        ),
                    },
                    None => Observation::Exited {
                        run,
                        code: None,
                        detail: format!("job {} Failed{}", job_run.key, suffix(&words)),
                    },
                }
            }
        };
        return (ran, Some(end));
    }
    if !is_suspended(job) {
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
            detail: format!(
                "job {} suspended by allot (it waits to be admitted again)",
                job_run.key
            ),
        }
    } else {
        Observation::Cancelled {
            run,
            detail: format!("job {} suspended outside allot (spec.suspend: true)", job_run.key),
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

    fn job(extra: serde_json::Value) -> Job {
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
        serde_json::from_value(base).expect("a Job")
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
        assert!(queues_for_allot(&j));
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
        assert!(!queues_for_allot(&kueue));
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
}
