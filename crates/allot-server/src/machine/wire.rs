//! The wire forms the log and snapshots keep of core types that are not serialisable
//! (`NodeSpec`), and of the backend's reachability.

use std::collections::BTreeMap;

use allot_core::{DeviceSpec, NodeSpec};
use serde::{Deserialize, Serialize};

/// A node as the log and snapshots keep it (`NodeSpec` is the core's, not serialisable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedNode {
    pub name: String,
    pub cpu_millis: u64,
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    pub devices: Vec<SavedDevice>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedDevice {
    pub model: String,
    pub memory_mib: u64,
    #[serde(default)]
    pub island: u32,
    #[serde(default)]
    pub mig: bool,
}

impl From<&NodeSpec> for SavedNode {
    fn from(n: &NodeSpec) -> SavedNode {
        SavedNode {
            name: n.name.clone(),
            cpu_millis: n.cpu_millis,
            memory_mib: n.memory_mib,
            labels: n.labels.clone(),
            pool: n.pool.clone(),
            rack: n.rack.clone(),
            devices: n
                .devices
                .iter()
                .map(|d| SavedDevice {
                    model: d.model.clone(),
                    memory_mib: d.memory_mib,
                    island: d.island,
                    mig: d.mig,
                })
                .collect(),
        }
    }
}

impl From<&SavedNode> for NodeSpec {
    fn from(n: &SavedNode) -> NodeSpec {
        NodeSpec {
            name: n.name.clone(),
            cpu_millis: n.cpu_millis,
            memory_mib: n.memory_mib,
            labels: n.labels.clone(),
            pool: n.pool.clone(),
            rack: n.rack.clone(),
            devices: n
                .devices
                .iter()
                .map(|d| DeviceSpec {
                    model: d.model.clone(),
                    memory_mib: d.memory_mib,
                    island: d.island,
                    mig: d.mig,
                })
                .collect(),
        }
    }
}

pub(crate) fn saved(nodes: &[NodeSpec]) -> Vec<SavedNode> {
    nodes.iter().map(SavedNode::from).collect()
}

pub(crate) fn specs(nodes: &[SavedNode]) -> Vec<NodeSpec> {
    nodes.iter().map(NodeSpec::from).collect()
}

/// The backend stopped answering: since when, and what it said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Unreachable {
    pub since_ms: u64,
    pub error: String,
}
