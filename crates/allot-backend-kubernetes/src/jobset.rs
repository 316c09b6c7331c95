//! The JobSet (`jobset.x-k8s.io/v1alpha2`, kubernetes-sigs/jobset) as allot reads it: only the
//! fields allot uses, everything else ignored, so that a newer JobSet API with more fields
//! still reads. A JobSet is a group of Jobs (`spec.replicatedJobs`, each `replicas` Jobs of one
//! template) that its controller creates and suspends or resumes together; allot queues one
//! the way it queues a Job (see the `job` module).

use std::borrow::Cow;

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "jobset.x-k8s.io";
pub const VERSION: &str = "v1alpha2";
pub const API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";
pub const KIND: &str = "JobSet";
/// The label the JobSet controller puts on its Jobs and their pods: the JobSet's name.
pub const NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<JobSetStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(default)]
    pub replicated_jobs: Vec<ReplicatedJob>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    #[serde(default)]
    pub name: String,
    /// Jobs of this template (1 when unset, as the JobSet API defaults it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub template: JobTemplateSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobSetStatus {
    #[serde(default)]
    pub conditions: Vec<JobSetCondition>,
}

/// A `metav1.Condition`, its optional parts optional (allot reads objects it did not write).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobSetCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl kube::Resource for JobSet {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("jobsets")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn a_jobset_reads_with_the_fields_allot_does_not_use_ignored() {
        let js: JobSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": { "name": "train", "namespace": "team-a" },
            "spec": { "suspend": true, "network": { "enableDNSHostnames": true },
                      "replicatedJobs": [{ "name": "workers", "replicas": 2,
                                           "template": { "spec": { "parallelism": 1,
                                               "template": { "spec": { "containers": [] } } } } }] },
            "status": { "conditions": [{ "type": "Completed", "status": "True",
                                         "lastTransitionTime": "2026-12-05T00:00:00Z" }],
                        "replicatedJobsStatus": [] }
        }))
        .expect("a JobSet");
        assert_eq!(js.spec.as_ref().map(|s| s.replicated_jobs.len()), Some(1));
        assert_eq!(js.status.map(|s| s.conditions[0].type_.clone()).as_deref(), Some("Completed"));
        assert_eq!(
            JobSet::url_path(&(), Some("ns")),
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets"
        );
    }
}
