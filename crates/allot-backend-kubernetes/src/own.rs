//! Pods allot makes for work submitted through allot (`allot submit`): pure, no I/O.
//!
//! A run of such work is one pod per member, named `allot-W-A-M` (workload, attempt, member)
//! in the namespace of the work's project, labelled `allot.dev/run: W.A` and
//! `allot.dev/member: M`, created already bound (`spec.nodeName`: allot is the scheduler, the
//! node is its choice), `restartPolicy: Never`, one container `main` running the submitted
//! command in the image the daemon was started with (`--kubernetes-image`), asking for the
//! member's GPUs as the device plugin's resource and for its CPU and memory. The device plugin
//! picks the devices on the node, as it does for any pod. The pods are left when the run ends,
//! for `kubectl logs`: `kubectl delete pods -l allot.dev/run` removes them.

use std::collections::BTreeMap;

use allot_backend::{Launch, RunId, Vendor};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::map;

/// The label naming the run a pod of allot's own is: `W.A`.
pub const RUN_LABEL: &str = "allot.dev/run";
/// The label naming which member of its run the pod is.
pub const MEMBER_LABEL: &str = "allot.dev/member";
/// Variables of the launch that name files on the daemon's host, which a pod cannot reach.
const HOST_FILE_VARIABLES: [&str; 2] = ["ALLOT_HEARTBEAT_FILE", "ALLOT_CHECKPOINT_FILE"];

pub fn pod_name(run: RunId, member: usize) -> String {
    format!("allot-{}-{}-{member}", run.workload, run.attempt)
}

pub fn run_label(run: RunId) -> String {
    format!("{}.{}", run.workload, run.attempt)
}

/// The run a pod of allot's own is, from its label; `None` for any other pod.
pub fn run_of(pod: &Pod) -> Option<RunId> {
    let label = pod.metadata.labels.as_ref()?.get(RUN_LABEL)?;
    let (workload, attempt) = label.split_once('.')?;
    Some(RunId { workload: workload.parse().ok()?, attempt: attempt.parse().ok()? })
}

/// The namespace a launch's pods go to: its project's (`ALLOT_PROJECT`, which the daemon sets
/// on every launch).
pub fn namespace_of(launch: &Launch) -> Result<&str, String> {
    launch.env.get("ALLOT_PROJECT").map(String::as_str).filter(|p| !p.is_empty()).ok_or_else(|| {
        "the launch names no project (ALLOT_PROJECT): allot cannot tell its namespace".into()
    })
}

/// Member `member` of `launch` as the pod to create in `namespace`, running `image`, asking for
/// its devices as `resource` (`None`: its vendor's whole GPUs).
pub fn pod_for(
    launch: &Launch,
    member: usize,
    namespace: &str,
    image: &str,
    resource: Option<&str>,
) -> Pod {
    let m = &launch.members[member];
    let mut limits = BTreeMap::new();
    if !m.devices.is_empty() {
        let whole = match m.devices[0].vendor {
            Vendor::Nvidia => map::NVIDIA_GPU,
            Vendor::Amd => map::AMD_GPU,
        };
        limits.insert(resource.unwrap_or(whole), m.devices.len().to_string());
    }
    let mut requests = BTreeMap::new();
    if launch.resources.cpu_millis > 0 {
        requests.insert("cpu", format!("{}m", launch.resources.cpu_millis));
    }
    if launch.resources.memory_mib > 0 {
        requests.insert("memory", format!("{}Mi", launch.resources.memory_mib));
    }
    let env: Vec<serde_json::Value> = launch
        .env
        .iter()
        .filter(|(k, _)| !HOST_FILE_VARIABLES.contains(&k.as_str()))
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(launch.run, member),
            "namespace": namespace,
            "labels": { RUN_LABEL: run_label(launch.run), MEMBER_LABEL: member.to_string() },
        },
        "spec": {
            "nodeName": m.node,
            "schedulerName": map::SCHEDULER_NAME,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": image,
                "command": launch.command,
                "env": env,
                "resources": { "limits": limits, "requests": requests },
            }],
        },
    });
    // Every field above is of the Pod schema: this cannot fail.
    serde_json::from_value(pod).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_backend::{DeviceAssignment, MemberLaunch, MemberResources};

    fn launch() -> Launch {
        let gpu = |index| DeviceAssignment { index, uuid: None, vendor: Vendor::Amd, shares: 1000 };
        Launch {
            run: RunId { workload: 12, attempt: 3 },
            command: vec!["python".into(), "train.py".into()],
            env: BTreeMap::from([
                ("ALLOT_PROJECT".to_string(), "vision".to_string()),
                ("ALLOT_HEARTBEAT_FILE".to_string(), "/var/lib/allot/hb".to_string()),
                ("EPOCHS".to_string(), "3".to_string()),
            ]),
            members: vec![
                MemberLaunch { node: "n1".into(), devices: vec![gpu(0), gpu(1)] },
                MemberLaunch { node: "n2".into(), devices: vec![] },
            ],
            log_dir: "/tmp/logs".into(),
            adopt: None,
            resources: MemberResources { cpu_millis: 1500, memory_mib: 4096 },
        }
    }

    #[test]
    fn a_member_is_a_pod_bound_to_its_node_asking_for_its_gpus() {
        let l = launch();
        assert_eq!(namespace_of(&l), Ok("vision"));
        let pod = pod_for(&l, 0, "vision", "registry.example/trainer:1", None);
        assert_eq!(pod.metadata.name.as_deref(), Some("allot-12-3-0"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("vision"));
        assert_eq!(run_of(&pod), Some(l.run));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.scheduler_name.as_deref(), Some("allot"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/trainer:1"));
        assert_eq!(c.command.as_deref(), Some(&l.command[..]));
        let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect::<Vec<_>>();
        assert_eq!(names, ["ALLOT_PROJECT", "EPOCHS"], "no file of the daemon's host");
        let resources = c.resources.as_ref().expect("resources");
        let limit = resources.limits.as_ref().and_then(|l| l.get("amd.com/gpu"));
        assert_eq!(limit.map(|q| q.0.as_str()), Some("2"));
        assert_eq!(map::gpu_ask(&pod).map(|a| a.gpus), Ok(2), "read back as allot reads pods");
        let requests = resources.requests.as_ref().expect("requests");
        assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("1500m"));
        assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("4096Mi"));
        // A member without GPUs asks for none.
        let cpu_only = pod_for(&l, 1, "vision", "x", None);
        assert_eq!(map::gpu_ask(&cpu_only).map(|a| a.gpus), Ok(0));
    }

    #[test]
    fn only_allots_labels_name_a_run() {
        let mut pod = pod_for(&launch(), 0, "vision", "x", None);
        for bad in ["12", "12.x", "", ".3"] {
            pod.metadata.labels.get_or_insert_default().insert(RUN_LABEL.into(), bad.into());
            assert_eq!(run_of(&pod), None, "{bad:?}");
        }
        let mut l = launch();
        l.env.remove("ALLOT_PROJECT");
        assert!(namespace_of(&l).is_err());
    }
}
