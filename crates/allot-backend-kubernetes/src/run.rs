//! A run as the pods it is (one, or a group's), and how it starts and ends, judged from pods
//! as the API lists them: pure, no I/O (the backend lists, this decides).

use std::collections::BTreeMap;
use std::sync::Arc;

use allot_backend::{MemberLaunch, Observation, PodRef, RunId};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use crate::job::{JobRun, Queued};
use crate::jobset::JobSet;
use crate::map;

/// One pod of a run.
#[derive(Clone, Debug)]
pub(crate) struct PodRun {
    pub(crate) name: String,
    /// The pod's uid when the run took it: a pod deleted and created again under the same
    /// name is not this run's.
    pub(crate) uid: Option<String>,
    /// Seen running (or ended after it was bound).
    pub(crate) ran: bool,
    pub(crate) end: Option<PodEnd>,
}

/// How one pod of a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PodEnd {
    /// Its phase is Succeeded or Failed: the exit code and words of [`map::exit_status`].
    Finished(Option<i32>, String),
    /// It is gone (deleted or evicted).
    Gone,
}

/// A run and the pods it is (one, or a group's).
#[derive(Clone, Debug)]
pub(crate) struct Tracked {
    pub(crate) namespace: String,
    /// The pod group, for a group's run.
    pub(crate) group: Option<String>,
    pub(crate) pods: Vec<PodRun>,
    pub(crate) members: Vec<MemberLaunch>,
    pub(crate) started: bool,
    pub(crate) ended: bool,
    /// Set once allot asked it to stop, for the exit's words.
    pub(crate) stopped_by_allot: bool,
    /// The Job, for a Job's run (its pods come and go: `pods` is empty, they are found by
    /// owner in the view).
    pub(crate) job: Option<JobRun>,
}

impl Tracked {
    pub(crate) fn key(&self, pod: &PodRun) -> String {
        format!("{}/{}", self.namespace, pod.name)
    }

    pub(crate) fn what(&self) -> String {
        if let Some(job) = &self.job {
            return format!("{} {}", job.kind.word(), job.key);
        }
        match &self.group {
            Some(group) => format!("pod group {}/{group}", self.namespace),
            None => format!("pod {}/{}", self.namespace, self.pods.first().map_or("", |p| &p.name)),
        }
    }

    /// How the run ended, once every pod has: the first pod that failed with a code, else
    /// cancelled when a pod was deleted outside allot, else evicted, else succeeded.
    pub(crate) fn exit(&self, run: RunId) -> Observation {
        let label = |p: &PodRun| {
            if self.group.is_some() { format!("pod {}: ", p.name) } else { String::new() }
        };
        let finished = self.pods.iter().filter_map(|p| match &p.end {
            Some(PodEnd::Finished(code, detail)) => Some((p, *code, detail)),
            _ => None,
        });
        let failed = finished.clone().find(|(_, code, _)| *code != Some(0));
        if let Some((p, Some(code), detail)) = failed {
            return Observation::Exited { run, code: Some(code), detail: label(p) + detail };
        }
        let gone: Vec<&str> = self
            .pods
            .iter()
            .filter(|p| p.end == Some(PodEnd::Gone))
            .map(|p| p.name.as_str())
            .collect();
        if !gone.is_empty() {
            let pods = if self.group.is_some() {
                format!("pods {} of {}", gone.join(", "), self.what())
            } else {
                "pod".to_string()
            };
            return if self.stopped_by_allot {
                Observation::Exited { run, code: None, detail: format!("{pods} evicted by allot") }
            } else {
                Observation::Cancelled {
                    run,
                    detail: format!("{pods} deleted outside allot (kubectl delete)"),
                }
            };
        }
        if let Some((p, None, detail)) = failed {
            return Observation::Exited { run, code: None, detail: label(p) + detail };
        }
        let detail = match &self.group {
            Some(_) => format!("every pod of {} Succeeded", self.what()),
            None => finished.map(|(_, _, d)| d.clone()).next().unwrap_or_default(),
        };
        Observation::Exited { run, code: Some(0), detail }
    }

    /// What happened to the run's pods, judged from `pods` (by `namespace/name`); updates the run.
    /// Started once every pod ran; ended once every pod ended (see [`Tracked::exit`]).
    pub(crate) fn observe<P: std::borrow::Borrow<Pod>>(
        &mut self,
        run: RunId,
        pods: &BTreeMap<String, P>,
    ) -> Vec<Observation> {
        let mut out = Vec::new();
        for i in 0..self.pods.len() {
            if self.pods[i].end.is_some() {
                continue;
            }
            let key = self.key(&self.pods[i]);
            let p = &mut self.pods[i];
            let pod = pods
                .get(&key)
                .map(|pod| pod.borrow())
                .filter(|pod| p.uid.is_none() || pod.metadata.uid == p.uid);
            let Some(pod) = pod else {
                p.end = Some(PodEnd::Gone);
                continue;
            };
            // A pod that ended before it was seen running ran all the same (it was bound).
            if matches!(map::phase(pod), "Running" | "Succeeded" | "Failed") {
                p.ran = true;
            }
            if map::is_terminal(pod) {
                let (code, detail) = map::exit_status(pod);
                p.end = Some(PodEnd::Finished(code, detail));
            }
        }
        let all_ended = self.pods.iter().all(|p| p.end.is_some());
        let ran = if all_ended {
            self.pods.iter().any(|p| p.ran)
        } else {
            self.pods.iter().all(|p| p.ran)
        };
        if ran && !self.started {
            self.started = true;
            out.push(Observation::Started { run, pids: Vec::new() });
        }
        if all_ended {
            self.ended = true;
            out.push(self.exit(run));
        }
        out
    }
}

impl Tracked {
    /// A Job's run judged from the view's Jobs and pods (by `namespace/name`): started once a
    /// pod of it ran, ended as [`crate::job::observe`] says. Returns the observations and the
    /// Job's unbound pods with the node each goes to ([`crate::job::assign`]).
    pub(crate) fn observe_job(
        &mut self,
        run: RunId,
        jobs: &BTreeMap<String, Arc<Job>>,
        jobsets: &BTreeMap<String, Arc<JobSet>>,
        pods: &BTreeMap<String, Arc<Pod>>,
    ) -> (Vec<Observation>, Vec<(Arc<Pod>, String)>) {
        let Some(job_run) = self.job.as_mut() else { return (Vec::new(), Vec::new()) };
        let job = Queued::find(job_run.kind, &job_run.key, jobs, jobsets);
        let prefix = format!("{}/", self.namespace);
        let uid = job.as_ref().and_then(Queued::uid);
        let owned: Vec<&Arc<Pod>> = pods
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, p)| p)
            .filter(|p| uid.is_some() && crate::job::queued_owner_uid(p, jobs) == uid)
            .collect();
        let borrowed: Vec<&Pod> = owned.iter().map(|p| &***p).collect();
        let (ran, end) =
            crate::job::observe(run, job_run, job.as_ref(), &borrowed, self.stopped_by_allot);
        let mut out = Vec::new();
        if ran && !self.started {
            self.started = true;
            out.push(Observation::Started { run, pids: Vec::new() });
        }
        if let Some(end) = end {
            self.ended = true;
            out.push(end);
            return (out, Vec::new());
        }
        let binds = if self.stopped_by_allot || job.as_ref().is_some_and(Queued::is_suspended) {
            Vec::new()
        } else {
            let by_name: BTreeMap<&str, &Arc<Pod>> = owned
                .iter()
                .map(|p| (p.metadata.name.as_deref().unwrap_or_default(), *p))
                .collect();
            crate::job::assign(&self.members, &borrowed)
                .into_iter()
                .filter_map(|(pod, node)| {
                    let name = pod.metadata.name.as_deref().unwrap_or_default();
                    by_name.get(name).map(|p| (Arc::clone(p), node))
                })
                .collect()
        };
        (out, binds)
    }

    /// The pod each member is, by member, judged from `pods` (by `namespace/name`): a member
    /// takes a pod bound to its node; members left over take the pods left over in the order
    /// the run took them (the order `bind_all` binds a fresh group in). Cut at the first member
    /// without a pod (the run has fewer pods than members; it cannot, once bound).
    pub(crate) fn member_pods<P: std::borrow::Borrow<Pod>>(
        &self,
        pods: &BTreeMap<String, P>,
        jobs: &BTreeMap<String, Arc<Job>>,
    ) -> Vec<PodRef> {
        if let Some(job) = &self.job {
            return self.job_member_pods(job, pods, jobs);
        }
        let node_of = |p: &PodRun| {
            pods.get(&self.key(p)).and_then(|pod| map::bound_node(pod.borrow()).map(str::to_string))
        };
        let mut free: Vec<Option<&PodRun>> = self.pods.iter().map(Some).collect();
        let mut chosen: Vec<Option<&PodRun>> = self
            .members
            .iter()
            .map(|m| {
                let on_node = free
                    .iter_mut()
                    .find(|p| p.is_some_and(|p| node_of(p).is_some_and(|node| node == m.node)))?;
                on_node.take()
            })
            .collect();
        let mut rest = free.into_iter().flatten();
        for slot in chosen.iter_mut().filter(|s| s.is_none()) {
            *slot = rest.next();
        }
        chosen
            .into_iter()
            .map_while(|p| p)
            .map(|p| PodRef { namespace: self.namespace.clone(), name: p.name.clone() })
            .collect()
    }
}

impl Tracked {
    /// A Job's members' pods: each member takes a pod of the Job, running on its node, not
    /// finished (by name). A Job's pods come and go: this is who they are now.
    fn job_member_pods<P: std::borrow::Borrow<Pod>>(
        &self,
        job: &JobRun,
        pods: &BTreeMap<String, P>,
        jobs: &BTreeMap<String, Arc<Job>>,
    ) -> Vec<PodRef> {
        let prefix = format!("{}/", self.namespace);
        let mut live: Vec<&Pod> = pods
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, p)| p.borrow())
            .filter(|p| {
                job.uid.is_some() && crate::job::queued_owner_uid(p, jobs) == job.uid.as_deref()
            })
            .filter(|p| !map::is_terminal(p) && map::bound_node(p).is_some())
            .collect();
        self.members
            .iter()
            .map_while(|m| {
                let at = live.iter().position(|p| map::bound_node(p) == Some(m.node.as_str()))?;
                let pod = live.remove(at);
                let name = pod.metadata.name.clone().unwrap_or_default();
                Some(PodRef { namespace: self.namespace.clone(), name })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: RunId = RunId { workload: 7, attempt: 1 };

    fn run_of(group: Option<&str>, ends: &[Option<PodEnd>]) -> Tracked {
        Tracked {
            namespace: "ns".into(),
            group: group.map(str::to_string),
            pods: ends
                .iter()
                .enumerate()
                .map(|(i, end)| PodRun {
                    name: format!("p-{i}"),
                    uid: None,
                    ran: true,
                    end: end.clone(),
                })
                .collect(),
            members: Vec::new(),
            started: true,
            ended: false,
            stopped_by_allot: false,
            job: None,
        }
    }

    fn done(code: i32) -> Option<PodEnd> {
        Some(PodEnd::Finished(Some(code), format!("container main exited {code}")))
    }

    #[test]
    fn a_group_ends_failed_if_a_pod_failed_cancelled_if_its_user_deleted_one() {
        let failed = run_of(Some("g"), &[done(0), done(3), Some(PodEnd::Gone)]).exit(RUN);
        assert_eq!(
            failed,
            Observation::Exited {
                run: RUN,
                code: Some(3),
                detail: "pod p-1: container main exited 3".into()
            }
        );
        let cancelled = run_of(Some("g"), &[done(0), Some(PodEnd::Gone)]).exit(RUN);
        assert_eq!(
            cancelled,
            Observation::Cancelled {
                run: RUN,
                detail: "pods p-1 of pod group ns/g deleted outside allot (kubectl delete)".into()
            }
        );
        let mut evicted = run_of(Some("g"), &[Some(PodEnd::Gone), Some(PodEnd::Gone)]);
        evicted.stopped_by_allot = true;
        assert_eq!(
            evicted.exit(RUN),
            Observation::Exited {
                run: RUN,
                code: None,
                detail: "pods p-0, p-1 of pod group ns/g evicted by allot".into()
            }
        );
        let succeeded = run_of(Some("g"), &[done(0), done(0)]).exit(RUN);
        assert_eq!(
            succeeded,
            Observation::Exited {
                run: RUN,
                code: Some(0),
                detail: "every pod of pod group ns/g Succeeded".into()
            }
        );
    }

    #[test]
    fn a_single_pod_keeps_its_own_words() {
        let deleted = run_of(None, &[Some(PodEnd::Gone)]).exit(RUN);
        assert_eq!(
            deleted,
            Observation::Cancelled {
                run: RUN,
                detail: "pod deleted outside allot (kubectl delete)".into()
            }
        );
        let unknown = Some(PodEnd::Finished(None, "pod Failed: Evicted".into()));
        assert_eq!(
            run_of(None, &[unknown]).exit(RUN),
            Observation::Exited { run: RUN, code: None, detail: "pod Failed: Evicted".into() }
        );
    }

    #[test]
    fn a_group_starts_once_every_pod_ran_and_ends_once_every_pod_ended() {
        let mut t = run_of(Some("g"), &[None, None]);
        t.started = false;
        for p in &mut t.pods {
            p.ran = false;
        }
        let pod = |name: &str, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": "ns" },
                "spec": { "containers": [{ "name": "main" }] },
                "status": { "phase": phase }
            }))
            .expect("a pod")
        };
        let listed = |pods: Vec<Pod>| -> BTreeMap<String, Pod> {
            pods.into_iter().map(|p| (map::pod_key(&p), p)).collect()
        };
        let one_runs = listed(vec![pod("p-0", "Running"), pod("p-1", "Pending")]);
        assert_eq!(t.observe(RUN, &one_runs), Vec::new());
        let both_run = listed(vec![pod("p-0", "Running"), pod("p-1", "Running")]);
        assert_eq!(
            t.observe(RUN, &both_run),
            vec![Observation::Started { run: RUN, pids: Vec::new() }]
        );
        let one_done = listed(vec![pod("p-0", "Succeeded"), pod("p-1", "Running")]);
        assert_eq!(t.observe(RUN, &one_done), Vec::new());
        let both_done = listed(vec![pod("p-1", "Succeeded")]);
        let end = t.observe(RUN, &both_done);
        assert_eq!(
            end,
            vec![Observation::Exited {
                run: RUN,
                code: Some(0),
                detail: "every pod of pod group ns/g Succeeded".into()
            }],
            "p-0 Succeeded before it went: its end stands"
        );
        assert!(t.ended);
    }

    #[test]
    fn members_are_the_pods_bound_to_their_nodes_else_the_pods_in_order() {
        let member = |node: &str| MemberLaunch { node: node.into(), devices: Vec::new() };
        let mut t = run_of(Some("g"), &[None, None, None]);
        t.members = vec![member("n-a"), member("n-b"), member("n-c")];
        let bound = |name: &str, node: Option<&str>| -> (String, Pod) {
            let pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": "ns" },
                "spec": { "containers": [{ "name": "main" }], "nodeName": node },
            }))
            .expect("a pod");
            (format!("ns/{name}"), pod)
        };
        let names = |pods: Vec<PodRef>| -> Vec<String> {
            assert!(pods.iter().all(|p| p.namespace == "ns"));
            pods.into_iter().map(|p| p.name).collect()
        };
        // p-0 runs on n-b, p-2 on n-a; p-1 is not in the view yet: it is what is left.
        let view: BTreeMap<String, Pod> =
            [bound("p-0", Some("n-b")), bound("p-2", Some("n-a"))].into_iter().collect();
        assert_eq!(names(t.member_pods(&view, &BTreeMap::new())), ["p-2", "p-0", "p-1"]);
        // Nothing known of the nodes: the order the run took them.
        assert_eq!(
            names(t.member_pods(&BTreeMap::<String, Pod>::new(), &BTreeMap::new())),
            ["p-0", "p-1", "p-2"]
        );
        // A member more than there are pods has none (and none after it is guessed).
        t.members.push(member("n-d"));
        assert_eq!(names(t.member_pods(&view, &BTreeMap::new())).len(), 3);

        // A Job's members are its running pods on their nodes (its own pods only).
        let mut job = run_of(None, &[]);
        job.members = vec![member("n-a"), member("n-b")];
        job.job = Some(JobRun {
            kind: crate::job::QueuedKind::Job,
            name: "train".into(),
            key: "ns/train".into(),
            uid: Some("u-1".into()),
            seen_resumed: true,
        });
        let owned = |name: &str, node: &str, owner: &str, phase: &str| -> (String, Pod) {
            let pod = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": "ns", "ownerReferences": [
                    { "apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": owner,
                      "controller": true } ] },
                "spec": { "containers": [{ "name": "main" }], "nodeName": node },
                "status": { "phase": phase },
            }))
            .expect("a pod");
            (format!("ns/{name}"), pod)
        };
        let view: BTreeMap<String, Pod> = [
            owned("train-0", "n-a", "u-1", "Succeeded"),
            owned("train-1", "n-b", "u-1", "Running"),
            owned("train-2", "n-a", "u-1", "Running"),
            owned("other-0", "n-a", "u-9", "Running"),
        ]
        .into_iter()
        .collect();
        assert_eq!(names(job.member_pods(&view, &BTreeMap::new())), ["train-2", "train-1"]);
    }
}
