//! The boundary between the daemon and whatever runs workloads (this host, Slurm, …).
//!
//! The daemon owns decisions and timing; a backend only launches members, delivers signals and
//! reports what it observes. Every call is idempotent per `(workload, attempt)`, so the daemon
//! can repeat a call after a restart without starting anything twice. Backends know nothing of
//! HTTP, SQLite or policy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use allot_core::NodeSpec;

pub mod account;
#[cfg(any(test, feature = "contract"))]
pub mod contract;
mod fake;
pub mod files;

pub use fake::{FakeBackend, FakeControl};

/// One run of a workload. A workload suspended and resumed, or requeued, runs again as the next
/// attempt; observations always name the attempt they belong to.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct RunId {
    pub workload: u64,
    pub attempt: u32,
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.workload, self.attempt)
    }
}

/// What to start: every member of an admitted workload, on the devices the engine chose.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    pub run: RunId,
    /// argv; the first element is the program.
    pub command: Vec<String>,
    /// Extra environment for every member (the backend adds the device variables).
    pub env: BTreeMap<String, String>,
    pub members: Vec<MemberLaunch>,
    /// Where the members' stdout/stderr go (`member-N.log` inside).
    pub log_dir: PathBuf,
    /// Take over existing work instead of starting new: the handle of work the backend
    /// reported through [`Backend::watch_cluster`] (a Slurm job id). Running work is watched
    /// from now on as this run (`Started` is reported); pending work the backend held is moved
    /// onto `members`' nodes and released. `command` is then informational.
    #[serde(default)]
    pub adopt: Option<String>,
    /// What each member asked for besides GPUs, for a backend that enforces it (the local
    /// backend's cgroups). Zero: not limited.
    #[serde(default)]
    pub resources: MemberResources,
}

/// [`Backend::submitter_check`]: `Err` says why the user's work cannot run, and what to do.
pub type SubmitterCheck = std::sync::Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// CPU and memory of one member, as the workload requested them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberResources {
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberLaunch {
    pub node: String,
    pub devices: Vec<DeviceAssignment>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceAssignment {
    /// The device's index on its node (CUDA/HIP ordinal).
    pub index: u32,
    /// Vendor UUID when known (NVML `GPU-…`, a MIG instance's `MIG-…`).
    pub uuid: Option<String>,
    pub vendor: Vendor,
    /// Thousandths of the device (1000 = whole).
    pub shares: u64,
}

/// A Kubernetes pod by namespace and name: what a member of a run is on a cluster whose device
/// plugin, not allot, picks its GPUs (`Backend::member_pods`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// Signals the daemon asks for, in the order of a stop: checkpoint, then terminate, then kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// The configured checkpoint signal (SIGUSR1 by default on the local backend).
    Checkpoint,
    Terminate,
    Kill,
}

/// What a backend saw happen to a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Every member runs. `pids` are the members' process (group) ids where the backend has them.
    Started { run: RunId, pids: Vec<u32> },
    /// The run could not start; nothing of it runs.
    LaunchFailed { run: RunId, error: String },
    /// Every member ended. `code`: exit code of the first member that failed, else 0; `None` when
    /// a member ended by a signal or the backend could not learn the status (see `detail`).
    Exited { run: RunId, code: Option<i32>, detail: String },
    /// Every member ended, at least one because its owner ended it outside allot (a pod
    /// deleted with kubectl): the run is cancelled, not failed. `detail` says who ended what.
    Cancelled { run: RunId, detail: String },
    /// The backend could not take the launch now (its controller is unreachable,
    /// [`BackendError::Unreachable`]): nothing of it runs, and the same work may be launched
    /// again later. Not a verdict on the request.
    LaunchDeferred { run: RunId, error: String },
}

impl Observation {
    pub fn run(&self) -> RunId {
        match self {
            Observation::Started { run, .. }
            | Observation::LaunchFailed { run, .. }
            | Observation::LaunchDeferred { run, .. }
            | Observation::Exited { run, .. }
            | Observation::Cancelled { run, .. } => *run,
        }
    }
}

/// What a backend sees of its cluster beyond allot's own runs (see [`Backend::watch_cluster`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterNews {
    /// The inventory now (what [`Backend::inventory`] would return), where the backend reads it
    /// with the watch: nodes added, removed or given other devices reach the engine this way.
    /// `None`: not read (the inventory of a host does not change).
    pub inventory: Option<Vec<NodeSpec>>,
    /// Every node the backend governs, with its state now (not only changes).
    pub nodes: Vec<NodeStatus>,
    /// Every piece of work now on the cluster that allot did not start and no launch has taken
    /// over yet.
    pub foreign: Vec<ForeignWork>,
    /// Work running on the cluster's nodes that allot must not govern (Slurm: jobs of the
    /// unmanaged partitions, on nodes a managed partition shares): the devices it holds are
    /// occupied, never offered to allot's work, and the ledger counts them `unmanaged`.
    pub beside: Vec<ForeignWork>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub node: String,
    /// Whether new work may be placed there (Slurm: not down, drained, draining or failing).
    pub usable: bool,
    /// The backend's words for the state (`DRAIN: bad GPU 3`), for the operator.
    pub reason: String,
}

/// Work found on the cluster that allot did not start (a job submitted to Slurm directly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignWork {
    /// The backend's stable id for it (a Slurm job id): what [`Launch::adopt`] names.
    pub handle: String,
    pub name: String,
    /// The project it is charged to (the Slurm account).
    pub project: String,
    pub user: String,
    /// Running: its members where they run, with the devices they hold. Empty: pending — the
    /// backend holds it (it must not start on its own) until a launch adopts it.
    pub running: Vec<MemberLaunch>,
    /// What it asks for, for pending work: `nodes` members of `gpus_per_node` whole GPUs.
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// The GPU models it may run on, in order of preference (a Slurm GRES type; a pod's
    /// selected product, or its vendor's models in a cluster of two vendors). Empty: any.
    pub models: Vec<String>,
    /// When it started running (ms since the Unix epoch), if it runs.
    pub started_ms: Option<u64>,
    /// Why allot cannot govern it as it asks (pending work whose GPU request does not split
    /// into whole GPUs per node, say), with the fix: it is shown rejected with this reason
    /// and stays held.
    pub refusal: Option<String>,
    /// What the work says of itself beyond its size, where the backend reads it (a pod's
    /// `allot.dev/*` annotations); the default says nothing (the policy's defaults apply).
    pub intent: ForeignIntent,
}

/// The workload intent foreign work declares (what `allot submit` takes as flags): each
/// field `None` leaves the policy's default. The daemon checks the values as it checks a
/// submission's (an unknown priority class is refused there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForeignIntent {
    /// `training`, `batch`, `notebook`, `inference` or `service`.
    pub kind: Option<String>,
    pub priority_class: Option<String>,
    pub preemptible: Option<bool>,
    /// Seconds between the checkpoint request and the stop; `None`: not checkpointable.
    pub checkpoint_grace_s: Option<u64>,
    pub min_runtime_s: Option<u64>,
    pub max_runtime_s: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The daemon named a run this backend does not know.
    #[error("{run}: no such run on this backend")]
    UnknownRun { run: RunId },
    /// A local failure (a file, a program that would not start).
    #[error("{0}")]
    Io(String),
    /// The request cannot be carried out as asked (it names what is wrong).
    #[error("{0}")]
    Invalid(String),
    /// The cluster's controller did not answer (Slurm's slurmctld down or too slow): transient.
    /// Nothing was changed; the caller retries with backoff and keeps the work it was about.
    #[error("{0}")]
    Unreachable(String),
}

impl BackendError {
    /// Whether the failure is the cluster's passing state rather than a verdict on the request.
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Unreachable(_))
    }
}

/// A place where workloads run. Calls are synchronous and short (no call waits for a workload);
/// the daemon calls them from its executor task.
pub trait Backend: Send {
    /// A short name for logs and metrics (`local`, `slurm`, `fake`).
    fn name(&self) -> &str;

    /// Whether work of an allot user could run here at all, asked before a submission is
    /// accepted: a backend that runs work as its submitter's Unix account needs that account.
    /// `None` (the default): every user's can.
    fn submitter_check(&self) -> Option<SubmitterCheck> {
        None
    }

    /// What keeps work from starting on this backend's cluster without allot (the gate), in a
    /// sentence for `allot nodes`; read once at start. `None` (the default): nothing but allot
    /// starts work here.
    fn gate(&mut self) -> Option<String> {
        None
    }

    /// What keeps one running workload from another and from the daemon here, in a sentence
    /// for `allot why` (`None`, the default: nothing to say).
    fn isolation(&self) -> Option<String> {
        None
    }

    /// The nodes and GPUs this backend governs, as the engine's specs. The local backend
    /// discovers this host's GPUs (NVML, AMD sysfs) and falls back to a declared inventory.
    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError>;

    /// Start every member of `launch`. Returns once the start is under way; `Started` or
    /// `LaunchFailed` comes through `poll`. Launching a run that is already known does nothing.
    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError>;

    /// Deliver `signal` to every member of `run`. Signalling a run that already ended does
    /// nothing and is not an error.
    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError>;

    /// What happened since the last call, in the order it was seen.
    fn poll(&mut self) -> Result<Vec<Observation>, BackendError>;

    /// Whether work waits for GPUs, told before each `poll`: then an end of running work is
    /// news the daemon acts on at once (the freed GPUs have a taker), and a backend that has
    /// to look for ends (Slurm's `squeue`) looks more often. The default ignores it.
    fn set_work_waiting(&mut self, waiting: bool) {
        let _ = waiting;
    }

    /// After a daemon restart: the runs the daemon believes were launched and not yet ended.
    /// The backend re-adopts those still running (they are watched from now on; `Started` is
    /// reported for each) and reports every other one honestly (`Exited` with `code: None` and
    /// a detail saying the status is unknown, or `LaunchFailed` if it never started).
    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError>;

    /// Node states and foreign work now, for a daemon that governs a shared cluster. Called
    /// every few seconds; it may be slower than `poll`. Backends that own their host see
    /// nothing (the default).
    fn watch_cluster(&mut self) -> Result<ClusterNews, BackendError> {
        Ok(ClusterNews::default())
    }

    /// Stops `run` so that the same work continues later as `next` (pre-emption with requeue):
    /// the backend keeps it (Slurm: the same job, requeued and held) and `launch` of `next`
    /// restarts it on the launch's nodes. `run` is reported `Exited` once it stopped. Send the
    /// checkpoint signal and wait its grace first. `Ok(false)`: the backend cannot; the daemon
    /// terminates `run` and launches `next` afresh (the default).
    fn requeue(&mut self, run: RunId, next: RunId) -> Result<bool, BackendError> {
        let _ = (run, next);
        Ok(false)
    }

    /// Cancels foreign work no launch has taken over (imported pending work its user cancelled
    /// through allot; the backend holds it). `Ok(false)`: not there, or the backend cannot.
    fn cancel_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        let _ = handle;
        Ok(false)
    }

    /// The devices these started runs actually hold, where the backend's own scheduler picked
    /// them (Slurm binds GRES indices itself: they may differ from the launch's), so that
    /// telemetry is attributed to the right devices. Runs the backend placed exactly as
    /// launched are left out (the default: none).
    fn allocated_devices(
        &mut self,
        runs: &[RunId],
    ) -> Result<Vec<(RunId, Vec<MemberLaunch>)>, BackendError> {
        let _ = runs;
        Ok(Vec::new())
    }

    /// The pod each member of these started runs is (index = member), where the cluster's
    /// device plugin picked the GPUs: the launch's device indices are allot's guess, and the
    /// exporters label each GPU with the pod that holds it, so telemetry is attributed by pod.
    /// Asked once a run started or was re-adopted (a run's pods do not change while it runs);
    /// runs without pods are left out (the default: none).
    fn member_pods(&mut self, runs: &[RunId]) -> Result<Vec<(RunId, Vec<PodRef>)>, BackendError> {
        let _ = runs;
        Ok(Vec::new())
    }

    /// Puts running foreign work that allot refused to adopt (its devices are taken or its
    /// project is over quota) back in the queue, held, so that it comes back through
    /// `watch_cluster` as pending work to admit. `Ok(false)`: the backend cannot.
    fn return_foreign(&mut self, handle: &str) -> Result<bool, BackendError> {
        let _ = handle;
        Ok(false)
    }

    /// Says, where the cluster's own tools show it, why allot keeps each of this work waiting
    /// (Slurm: the job's admin comment, in `scontrol show job` and `squeue --json`). Sent when
    /// a reason changes; best effort (the default: nowhere to say it).
    fn explain_waiting(&mut self, reasons: &[(Waiting, String)]) -> Result<(), BackendError> {
        let _ = reasons;
        Ok(())
    }
}

/// Work that waits on the backend's own cluster for allot to admit it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Waiting {
    /// Imported foreign work no launch has taken yet, by its handle (a Slurm job id).
    Foreign(String),
    /// Work the backend keeps for this attempt (`requeue`'s `next`: a requeued job, held).
    Kept(RunId),
}

/// Finds `program` as a shell would: a path as given, else on `PATH` (`path_var`; `None`:
/// `/usr/local/bin:/usr/bin:/bin`). Backends check it before they start anything, so a missing
/// program is a failed launch with its reason, not a member that exits 127.
pub fn resolve_program(program: &str, path_var: Option<&str>) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(format!("program {program:?} does not exist or is not executable"))
        };
    }
    let path_var = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| executable(p))
        .ok_or_else(|| format!("program {program:?} not found on PATH ({path_var})"))
}
