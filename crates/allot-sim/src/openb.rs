//! Alibaba cluster-trace-gpu-v2023 ("openb", the FGD paper's traces): node lists and pod lists.
//!
//! Node lists: `sn,cpu_milli,memory_mib,gpu,model`. Pod lists:
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
//! deletion_time,scheduled_time`; the `multigpu*` lists have only the first five columns, and
//! the time columns may be empty (a pod never scheduled). Columns are found by header name, so
//! their order does not matter; unknown columns are ignored.

use std::path::Path;

use crate::csv::{CsvFile, Row};
use crate::error::{BadRows, Skipped, TraceError};

/// One GPU node of an openb node list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenbNode {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    /// GPU model code (`G2`, `T4`, `V100M32`, …); empty for CPU-only nodes.
    pub model: String,
}

/// One pod of an openb pod list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenbPod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Share of each GPU, 1000 = a whole GPU (as written in the file; may exceed 1000).
    pub gpu_milli: u32,
    /// Acceptable GPU models (`|`-separated in the file, empty parts dropped); empty = any.
    pub gpu_spec: Vec<String>,
    pub qos: Option<String>,
    pub pod_phase: Option<String>,
    pub creation_time: Option<u64>,
    pub deletion_time: Option<u64>,
    pub scheduled_time: Option<u64>,
}

/// GPUs on one node above which a node list is surely wrong (and the packer's GPU indexes
/// would not fit).
pub const GPUS_PER_NODE_MAX: u32 = 64;

/// Read an openb node list.
pub fn load_nodes(path: &Path, mode: BadRows) -> Result<(Vec<OpenbNode>, Skipped), TraceError> {
    nodes_from(&CsvFile::read(path)?, path, mode)
}

/// Parse the text of an openb node list; `path` names it in errors.
pub fn parse_nodes(
    path: &Path,
    text: &str,
    mode: BadRows,
) -> Result<(Vec<OpenbNode>, Skipped), TraceError> {
    nodes_from(&CsvFile::parse(path, text)?, path, mode)
}

fn nodes_from(
    file: &CsvFile,
    path: &Path,
    mode: BadRows,
) -> Result<(Vec<OpenbNode>, Skipped), TraceError> {
    let name = file.column(&["sn", "name"])?;
    let cpu = file.column(&["cpu_milli"])?;
    let memory = file.column(&["memory_mib"])?;
    let gpus = file.column(&["gpu", "num_gpu"])?;
    let model = file.optional_column(&["model"]);
    let mut skipped = Skipped::default();
    let mut nodes = Vec::new();
    for row in file.rows() {
        let parsed = (|| {
            let node = OpenbNode {
                name: row.text(name, "sn")?.to_owned(),
                cpu_milli: row.number(cpu, "cpu_milli")?,
                memory_mib: row.number(memory, "memory_mib")?,
                gpus: row.number(gpus, "gpu")?,
                model: model.map(|m| row.get(m).trim().to_owned()).unwrap_or_default(),
            };
            if node.gpus > GPUS_PER_NODE_MAX {
                return Err(row.error(
                    "gpu",
                    format!("{} GPUs on one node", node.gpus),
                    "a node has at most 64 GPUs; check the column",
                ));
            }
            if node.gpus > 0 && node.model.is_empty() {
                return Err(row.error(
                    "model",
                    "empty for a GPU node".into(),
                    "give the GPU model",
                ));
            }
            Ok(node)
        })();
        match parsed {
            Ok(node) => nodes.push(node),
            Err(e) => skipped.record(mode, e)?,
        }
    }
    if nodes.is_empty() {
        return Err(TraceError::new(path, 0, "", "no nodes".into(), "the node list has no rows"));
    }
    Ok((nodes, skipped))
}

/// Read an openb pod list.
pub fn load_pods(path: &Path, mode: BadRows) -> Result<(Vec<OpenbPod>, Skipped), TraceError> {
    pods_from(&CsvFile::read(path)?, path, mode)
}

/// Parse the text of an openb pod list; `path` names it in errors.
pub fn parse_pods(
    path: &Path,
    text: &str,
    mode: BadRows,
) -> Result<(Vec<OpenbPod>, Skipped), TraceError> {
    pods_from(&CsvFile::parse(path, text)?, path, mode)
}

fn pods_from(
    file: &CsvFile,
    path: &Path,
    mode: BadRows,
) -> Result<(Vec<OpenbPod>, Skipped), TraceError> {
    let name = file.column(&["name"])?;
    let cpu = file.column(&["cpu_milli"])?;
    let memory = file.column(&["memory_mib"])?;
    let num_gpu = file.column(&["num_gpu"])?;
    let gpu_milli = file.column(&["gpu_milli"])?;
    let spec = file.optional_column(&["gpu_spec"]);
    let qos = file.optional_column(&["qos"]);
    let phase = file.optional_column(&["pod_phase"]);
    let created = file.optional_column(&["creation_time"]);
    let deleted = file.optional_column(&["deletion_time"]);
    let scheduled = file.optional_column(&["scheduled_time"]);
    let mut skipped = Skipped::default();
    let mut pods = Vec::new();
    for row in file.rows() {
        let parsed = (|| {
            let text = |col: Option<usize>| {
                col.map(|c| row.get(c).trim()).filter(|v| !v.is_empty()).map(str::to_owned)
            };
            let pod = OpenbPod {
                name: row.text(name, "name")?.to_owned(),
                cpu_milli: row.number(cpu, "cpu_milli")?,
                memory_mib: row.number(memory, "memory_mib")?,
                num_gpu: row.number(num_gpu, "num_gpu")?,
                gpu_milli: row.number(gpu_milli, "gpu_milli")?,
                gpu_spec: spec
                    .map(|c| {
                        row.get(c)
                            .split('|')
                            .map(str::trim)
                            .filter(|m| !m.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
                qos: text(qos),
                pod_phase: text(phase),
                creation_time: row.optional_number(created, "creation_time")?,
                deletion_time: row.optional_number(deleted, "deletion_time")?,
                scheduled_time: row.optional_number(scheduled, "scheduled_time")?,
            };
            if pod.num_gpu > GPUS_PER_NODE_MAX {
                return Err(row.error(
                    "num_gpu",
                    format!("{} GPUs for one pod", pod.num_gpu),
                    "a pod asks for at most 64 GPUs",
                ));
            }
            Ok(pod)
        })();
        match parsed {
            Ok(pod) => pods.push(pod),
            Err(e) => skipped.record(mode, e)?,
        }
    }
    if pods.is_empty() {
        return Err(TraceError::new(path, 0, "", "no pods".into(), "the pod list has no rows"));
    }
    Ok((pods, skipped))
}

impl Row<'_> {
    fn optional_number<T: std::str::FromStr>(
        &self,
        column: Option<usize>,
        field: &str,
    ) -> Result<Option<T>, TraceError> {
        match column {
            Some(c) if !self.get(c).trim().is_empty() => self.number(c, field).map(Some),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("allot-openb-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(name);
        let _ = std::fs::write(&path, text);
        path
    }

    #[test]
    fn a_bad_number_names_file_line_and_field() {
        let path = write(
            "pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,1,500\np1,lots,10,1,500\n",
        );
        let err = load_pods(&path, BadRows::Fail).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("pods.csv:3: cpu_milli: "), "{err}");
        let (pods, skipped) = load_pods(&path, BadRows::Skip).unwrap_or_default();
        assert_eq!((pods.len(), skipped.count), (1, 1));
    }

    #[test]
    fn a_missing_column_is_named_with_the_header_line() {
        let path = write("nodes.csv", "sn,cpu_milli,gpu,model\nn0,1000,1,T4\n");
        let err = load_nodes(&path, BadRows::Fail).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("nodes.csv:1: memory_mib: missing column"), "{err}");
    }
}
