//! This host as a backend: each member is a child process in its own process group, its output
//! appended to `member-N.log`, its GPUs chosen by the `*_VISIBLE_DEVICES` variables.
//!
//! Crash safety: the daemon may be killed at any instant and must never lose or duplicate a
//! workload. Everything recovery needs is on disk under `state_dir/runs/<workload>.<attempt>/`:
//!
//! - `launch.json` — what was launched, written and fsynced before anything is spawned;
//! - `member-N.pid` — written by the forked member itself before it execs the program (and
//!   before it drops to its account), so it exists even if the daemon dies right after the fork;
//! - `member-N.start` — the process start time (`/proc/<pid>/stat` field 22), to tell our
//!   process from a later one that reused the pid;
//! - `exit` — the run's end as the daemon learned it (code and detail);
//! - `launch-failed` — why the launch failed.
//!
//! Exit codes come from `waitpid` on our own children. Runs re-adopted after a restart are not our
//! children; they are watched with `kill(pid, 0)` and `/proc`, and their end is reported with
//! code `None` (the status cannot be learned).

pub mod cgroup;
pub mod discover;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use allot_backend::account::{self, Account};
use allot_backend::{
    Backend, BackendError, DeviceAssignment, Launch, MemberLaunch, Observation, RunId, StopSignal,
    Vendor,
};
use allot_core::NodeSpec;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

/// Detail of a run whose end the daemon could not observe.
pub const DETAIL_UNKNOWN: &str =
    "exit status unknown: it ended while allot was restarting or after re-adoption";

/// Who local workloads run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// The daemon's own account (a personal machine, or `allot serve --single-user`).
    Daemon,
    /// The Unix account named like the allot user who submitted the workload (`ALLOT_USER`);
    /// never root. The daemon must run as root.
    Submitter,
}

/// What a refused account lookup tells the operator to do instead.
const ACCOUNT_FIX: &str =
    "start allot with --single-user to run every workload as allot's own account";

/// How long `recover` waits for a member's pid file that a shell may still be writing.
const PID_FILE_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// `runs/` lives inside.
    pub state_dir: PathBuf,
    /// Delivered for `StopSignal::Checkpoint`.
    pub checkpoint_signal: Signal,
    /// Used when no GPU is discovered (a CPU-only host, or GPUs the discovery cannot see).
    pub declared_inventory: Option<Vec<NodeSpec>>,
    /// This host's node name; members must be launched on it.
    pub node_name: String,
    /// Where AMD GPUs are looked for (`/sys`).
    pub sysfs_root: PathBuf,
    /// Ask NVML for NVIDIA GPUs (off in tests that must not see this host's GPUs).
    pub use_nvml: bool,
    pub run_as: RunAs,
    /// Enforce each member's CPU and memory request, a process limit and its GPU device nodes
    /// with these cgroups (`None`: not enforced).
    pub cgroups: Option<cgroup::Cgroups>,
    /// The GPUs' device nodes the filter knows (`None`: found under `/dev` and `sysfs_root`).
    pub gpu_device_nodes:
        Option<(Vec<discover::GpuDeviceNode>, Option<discover::SharedDeviceNode>)>,
}

impl LocalConfig {
    /// Defaults: SIGUSR1 for checkpoints, no declared inventory, `/sys`, NVML on, members run
    /// as the daemon's account, requests not enforced.
    pub fn new(state_dir: PathBuf, node_name: String) -> Self {
        LocalConfig {
            state_dir,
            checkpoint_signal: Signal::SIGUSR1,
            declared_inventory: None,
            node_name,
            sysfs_root: PathBuf::from("/sys"),
            use_nvml: true,
            run_as: RunAs::Daemon,
            cgroups: None,
            gpu_device_nodes: None,
        }
    }
}

/// The log file of one member inside a launch's `log_dir`.
pub fn member_log(log_dir: &Path, member: usize) -> PathBuf {
    log_dir.join(format!("member-{member}.log"))
}

/// The log directory the daemon should give a run (`Launch::log_dir`): `runs/<run>/logs`.
pub fn run_log_dir(state_dir: &Path, run: RunId) -> PathBuf {
    run_dir(state_dir, run).join("logs")
}

/// The log file of one member of a run launched with `run_log_dir`, for `allot logs`.
pub fn log_path(state_dir: &Path, run: RunId, member: usize) -> PathBuf {
    member_log(&run_log_dir(state_dir, run), member)
}

/// The state directory of one run.
pub fn run_dir(state_dir: &Path, run: RunId) -> PathBuf {
    state_dir.join("runs").join(run.to_string())
}

#[derive(Debug)]
pub struct LocalBackend {
    config: LocalConfig,
    runs: BTreeMap<RunId, LocalRun>,
    /// Observations decided in `launch`, reported by the next `poll` before anything else.
    pending: Vec<Observation>,
    /// NVIDIA UUIDs by index, from the last discovery.
    nvidia_uuids: BTreeMap<u32, String>,
    /// Nodes whose members run here: this host, or every node of a declared inventory (a host
    /// without GPUs stands in for the cluster it declares).
    hosted_nodes: std::collections::BTreeSet<String>,
    /// The GPUs' device nodes, for each member's device filter.
    device_nodes: (Vec<discover::GpuDeviceNode>, Option<discover::SharedDeviceNode>),
}

#[derive(Debug)]
struct LocalRun {
    dir: PathBuf,
    members: Vec<Member>,
    /// Set once the run's end is known and reported (or was reported by `recover`).
    ended: Option<Observation>,
    /// Order in which members ended, for "the first member that failed".
    end_order: Vec<usize>,
}

/// The cgroup of member `index` of `run` (`3f2a9c1e-12.1-m0`): one per member, for its own
/// devices, prefixed by a digest of the state directory: every daemon on a host numbers its
/// workloads from 1, and one must never remove (and kill) another's group.
fn group_name(state_dir: &Path, run: RunId, index: usize) -> String {
    // FNV-1a: stable across releases and restarts, unlike the standard library's hasher.
    let digest =
        state_dir.as_os_str().as_encoded_bytes().iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{:08x}-{run}-m{index}", digest >> 32)
}

/// Processes and threads one member may have: enough for data loaders and thread pools, a
/// stop for a fork bomb.
pub const PIDS_PER_MEMBER: u64 = 16_384;

#[derive(Debug)]
struct Member {
    pid: u32,
    /// Our child; `None` when re-adopted after a restart.
    child: Option<Child>,
    /// Start time of the process, when known, against pid reuse.
    start_time: Option<u64>,
    end: Option<MemberEnd>,
    /// Its cgroup, when requests are enforced: removed (and what is left in it killed) once
    /// the member ends.
    group: Option<cgroup::MemberGroup>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum MemberEnd {
    Code(i32),
    Signal(String),
    /// Failed after the kernel's OOM killer killed it or a process of it: it used more memory
    /// than its cgroup's limit, its request. `how`: "was killed by SIGKILL", "exited with …".
    OutOfMemory {
        code: Option<i32>,
        how: String,
    },
    Unknown,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::Io(format!("{what} {}: {e}", path.display()))
}

/// Writes `text` to `path` and fsyncs the file and its directory.
fn write_durably(path: &Path, text: &str) -> Result<(), BackendError> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(|e| io_error("cannot create", &tmp, e))?;
    file.write_all(text.as_bytes()).map_err(|e| io_error("cannot write", &tmp, e))?;
    file.sync_all().map_err(|e| io_error("cannot fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error("cannot rename into", path, e))?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("cannot fsync directory", dir, e))?;
    }
    Ok(())
}

/// Field 22 (start time in clock ticks since boot) of `/proc/<pid>/stat` text, and field 3
/// (state). The command name (field 2) may hold spaces and parentheses: parse after the last `)`.
pub fn parse_proc_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3; field 22 is fields[19].
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

fn proc_stat(pid: u32) -> Option<(char, u64)> {
    parse_proc_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn nix_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().filter(|p| *p > 0).map(Pid::from_raw)
}

/// Whether the process we started as `pid` still runs: it exists, is ours to signal, is not a
/// zombie, and (when we recorded it) started when ours did.
fn alive(pid: u32, start_time: Option<u64>) -> bool {
    let Some(p) = nix_pid(pid) else { return false };
    match kill(p, None) {
        Ok(()) => {}
        // EPERM: another user's process took the pid.
        Err(_) => return false,
    }
    match proc_stat(pid) {
        Some((state, start)) => {
            state != 'Z' && state != 'X' && start_time.is_none_or(|t| t == start)
        }
        // No /proc (not Linux): kill(pid, 0) is all there is.
        None => true,
    }
}

/// No process has this pid any more (its process group may still have members).
fn pid_gone(pid: u32) -> bool {
    nix_pid(pid).is_none_or(|p| kill(p, None) == Err(Errno::ESRCH))
}

/// Sends `signal` to the process group `pgid`; a group that is gone is fine.
fn signal_group(pgid: u32, signal: Signal) -> Result<(), BackendError> {
    let Some(p) = nix_pid(pgid) else { return Ok(()) };
    match killpg(p, signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => {
            Err(BackendError::Io(format!("cannot send {signal} to process group {pgid}: {e}")))
        }
    }
}

/// The device nodes a member must not open: every GPU's it was not given, and AMD's shared
/// compute node when it was given no AMD GPU. A MIG instance or a share of a GPU opens the whole
/// GPU's node (the driver fences MIG instances itself; a time-sliced share is not fenced).
fn denied_devices(
    (nodes, kfd): &(Vec<discover::GpuDeviceNode>, Option<discover::SharedDeviceNode>),
    member: &MemberLaunch,
) -> Vec<cgroup::DeniedDevice> {
    let given = |vendor: Vendor, index: u32| {
        member.devices.iter().any(|d| d.vendor == vendor && d.index == index)
    };
    let mut deny: Vec<cgroup::DeniedDevice> = nodes
        .iter()
        .filter(|n| !given(n.vendor, n.index))
        .map(|n| cgroup::DeniedDevice { major: n.major, minor: n.minor })
        .collect();
    if let Some(kfd) = kfd
        && !member.devices.iter().any(|d| d.vendor == Vendor::Amd)
    {
        deny.push(cgroup::DeniedDevice { major: kfd.major, minor: kfd.minor });
    }
    deny.sort();
    deny.dedup();
    deny
}

/// Opens (creating) a member's log for appending, for the member's stdout and stderr. Never
/// through a link: the attempt's directory may belong to the workload's account, who must not
/// point its log at a file the daemon may write. A log of another account is refused; a new
/// one is given to `account`.
fn open_log(log: &Path, account: &Account) -> Result<File, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)
        .map_err(|e| format!("cannot open log {}: {e}", log.display()))?;
    let meta = file.metadata().map_err(|e| format!("cannot open log {}: {e}", log.display()))?;
    let mine = nix::unistd::geteuid().as_raw();
    if !meta.is_file() || (meta.uid() != mine && meta.uid() != account.uid) {
        return Err(format!(
            "log {} is not a regular file of {} or the daemon: not written",
            log.display(),
            account.name
        ));
    }
    if meta.uid() != account.uid {
        std::os::unix::fs::fchown(&file, Some(account.uid), Some(account.gid))
            .map_err(|e| format!("cannot hand log {} to {}: {e}", log.display(), account.name))?;
    }
    Ok(file)
}

/// Writes this process's pid and a newline (the mark of a finished write) to `path`. For the
/// forked child before exec: no allocation, only open, write and close.
fn write_own_pid(path: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    let mut digits = [0u8; 24];
    let mut n = std::process::id();
    let mut at = digits.len() - 1;
    digits[at] = b'\n';
    loop {
        at -= 1;
        // A digit: n % 10 < 10 fits a byte.
        digits[at] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let fd = nix::fcntl::open(
        path,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )?;
    let bytes = &digits[at..];
    if nix::unistd::write(&fd, bytes)? != bytes.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

/// The device variables for one member. NVIDIA: UUIDs when every device has one, else indices
/// (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so indices mean what NVML means); a MIG instance is
/// only addressable by its `MIG-` UUID. AMD: indices in `HIP_VISIBLE_DEVICES` and
/// `ROCR_VISIBLE_DEVICES`; HIP also reads `CUDA_VISIBLE_DEVICES`, so a member with only AMD
/// devices gets the same indices there. No devices: every variable empty (sees no GPU).
pub fn device_env(devices: &[DeviceAssignment]) -> Result<BTreeMap<String, String>, String> {
    let nvidia: Vec<&DeviceAssignment> =
        devices.iter().filter(|d| d.vendor == Vendor::Nvidia).collect();
    let amd: Vec<&DeviceAssignment> = devices.iter().filter(|d| d.vendor == Vendor::Amd).collect();
    let all_uuids = nvidia.iter().all(|d| d.uuid.is_some());
    if !all_uuids
        && let Some(mig) =
            nvidia.iter().find(|d| d.uuid.as_deref().is_some_and(|u| u.starts_with("MIG-")))
    {
        return Err(format!(
            "device {} is a MIG instance ({}) but another device has no UUID; a MIG \
             instance is addressable only by UUID, so every device needs one",
            mig.index,
            mig.uuid.as_deref().unwrap_or_default()
        ));
    }
    let join = |ds: &[&DeviceAssignment], f: &dyn Fn(&DeviceAssignment) -> String| {
        ds.iter().map(|d| f(d)).collect::<Vec<_>>().join(",")
    };
    let nvidia_list = if all_uuids {
        join(&nvidia, &|d| d.uuid.clone().unwrap_or_default())
    } else {
        join(&nvidia, &|d| d.index.to_string())
    };
    let amd_list = join(&amd, &|d| d.index.to_string());
    let mut env = BTreeMap::new();
    let cuda = if nvidia.is_empty() && !amd.is_empty() { amd_list.clone() } else { nvidia_list };
    env.insert("CUDA_VISIBLE_DEVICES".to_string(), cuda);
    env.insert("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string());
    env.insert("HIP_VISIBLE_DEVICES".to_string(), amd_list.clone());
    env.insert("ROCR_VISIBLE_DEVICES".to_string(), amd_list);
    if devices.iter().any(|d| d.shares < 1000) {
        // In the order the program sees its devices (NVIDIA, then AMD).
        let shares: Vec<String> =
            nvidia.iter().chain(amd.iter()).map(|d| d.shares.to_string()).collect();
        env.insert("ALLOT_GPU_SHARE_PERMILLE".to_string(), shares.join(","));
    }
    Ok(env)
}

/// `launch.json`: what was launched, for people and tools (recovery needs only its presence).
fn launch_record(launch: &Launch) -> String {
    let members: Vec<serde_json::Value> = launch
        .members
        .iter()
        .map(|m| {
            let devices: Vec<serde_json::Value> = m
                .devices
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "index": d.index,
                        "uuid": d.uuid,
                        "vendor": match d.vendor { Vendor::Nvidia => "nvidia", Vendor::Amd => "amd" },
                        "shares": d.shares,
                    })
                })
                .collect();
            serde_json::json!({ "node": m.node, "devices": devices })
        })
        .collect();
    serde_json::json!({
        "workload": launch.run.workload,
        "attempt": launch.run.attempt,
        "command": launch.command,
        "env": launch.env,
        "members": members,
        "log_dir": launch.log_dir.to_string_lossy(),
    })
    .to_string()
}

fn exit_record(code: Option<i32>, detail: &str) -> String {
    serde_json::json!({ "code": code, "detail": detail }).to_string()
}

fn parse_exit_record(text: &str) -> Option<(Option<i32>, String)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let code = match v.get("code")? {
        serde_json::Value::Null => None,
        c => Some(i32::try_from(c.as_i64()?).ok()?),
    };
    Some((code, v.get("detail")?.as_str()?.to_string()))
}

impl LocalBackend {
    pub fn new(config: LocalConfig) -> Result<LocalBackend, BackendError> {
        let runs = config.state_dir.join("runs");
        std::fs::create_dir_all(&runs).map_err(|e| {
            io_error(
                "cannot create the runs directory (check --state-dir and its permissions)",
                &runs,
                e,
            )
        })?;
        let device_nodes = config
            .gpu_device_nodes
            .clone()
            .unwrap_or_else(|| discover::gpu_device_nodes(&config.sysfs_root, Path::new("/dev")));
        Ok(LocalBackend {
            device_nodes,
            config,
            runs: BTreeMap::new(),
            pending: Vec::new(),
            nvidia_uuids: BTreeMap::new(),
            hosted_nodes: std::collections::BTreeSet::new(),
        })
    }

    /// NVIDIA UUIDs by `(node, index)` from the last `inventory()`, for `DeviceAssignment.uuid`.
    /// `launch` fills a missing UUID from here itself.
    pub fn device_uuids(&self) -> BTreeMap<(String, u32), String> {
        self.nvidia_uuids
            .iter()
            .map(|(i, u)| ((self.config.node_name.clone(), *i), u.clone()))
            .collect()
    }

    fn pid_file(dir: &Path, member: usize) -> PathBuf {
        dir.join(format!("member-{member}.pid"))
    }

    fn start_file(dir: &Path, member: usize) -> PathBuf {
        dir.join(format!("member-{member}.start"))
    }

    /// Records a failed launch durably (best effort) and reports it.
    fn fail_launch(&mut self, run: RunId, dir: &Path, error: String) {
        if std::fs::create_dir_all(dir).is_ok() {
            // Without the record a restart reports "never launched": still a LaunchFailed.
            let _ = write_durably(&dir.join("launch-failed"), &error);
        }
        let observation = Observation::LaunchFailed { run, error };
        self.runs.insert(
            run,
            LocalRun {
                dir: dir.to_path_buf(),
                members: Vec::new(),
                ended: Some(observation.clone()),
                end_order: Vec::new(),
            },
        );
        self.pending.push(observation);
    }

    /// Why `launch` cannot start, checked before anything is written or spawned.
    fn refusal(&self, launch: &Launch) -> Option<String> {
        let Some(program) = launch.command.first() else {
            return Some("empty command: nothing to run".to_string());
        };
        if launch.members.is_empty() {
            return Some("no members to launch".to_string());
        }
        for (i, m) in launch.members.iter().enumerate() {
            if m.node != self.config.node_name && !self.hosted_nodes.contains(&m.node) {
                return Some(format!(
                    "member {i} is for node {:?} but this host is {:?}",
                    m.node, self.config.node_name
                ));
            }
        }
        let path_var = launch.env.get("PATH").map_or(account::DEFAULT_PATH, String::as_str);
        allot_backend::resolve_program(program, Some(path_var)).err()
    }

    /// The account `launch`'s members run as.
    fn account(&self, launch: &Launch) -> Result<Account, String> {
        match self.config.run_as {
            RunAs::Submitter => Account::of_user(
                launch.env.get(account::USER_ENV).map_or("", String::as_str),
                ACCOUNT_FIX,
            ),
            RunAs::Daemon => Ok(Account::current().unwrap_or_else(|_| Account {
                // An account without a passwd entry (a container's bare uid): no home.
                name: nix::unistd::geteuid().to_string(),
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                home: PathBuf::from("/"),
                groups: Vec::new(),
            })),
        }
    }

    /// Everything a member's process sees: the account's base environment, the launch's
    /// variables, the device variables and the member's ids — none of the daemon's own.
    fn member_env(
        &self,
        launch: &Launch,
        index: usize,
        member: &MemberLaunch,
        account: &Account,
    ) -> Result<BTreeMap<String, String>, String> {
        let mut env = account::base_env(account, &launch.env);
        env.extend(self.device_vars(member)?);
        env.insert("ALLOT_WORKLOAD_ID".to_string(), launch.run.workload.to_string());
        env.insert("ALLOT_ATTEMPT".to_string(), launch.run.attempt.to_string());
        env.insert("ALLOT_MEMBER".to_string(), index.to_string());
        Ok(env)
    }

    fn device_vars(&self, member: &MemberLaunch) -> Result<BTreeMap<String, String>, String> {
        let devices: Vec<DeviceAssignment> = member
            .devices
            .iter()
            .map(|d| {
                let mut d = d.clone();
                if d.uuid.is_none() && d.vendor == Vendor::Nvidia {
                    d.uuid = self.nvidia_uuids.get(&d.index).cloned();
                }
                d
            })
            .collect();
        device_env(&devices)
    }

    /// The cgroup member `index` of `launch` runs in, with its limits and device filter, when
    /// requests are enforced.
    fn member_group(
        &self,
        launch: &Launch,
        index: usize,
    ) -> Result<Option<cgroup::MemberGroup>, String> {
        let Some(cgroups) = &self.config.cgroups else { return Ok(None) };
        let Some(member) = launch.members.get(index) else { return Ok(None) };
        let limits = cgroup::Limits {
            cpu_millis: launch.resources.cpu_millis,
            memory_mib: launch.resources.memory_mib,
            pids_max: PIDS_PER_MEMBER,
        };
        let deny = denied_devices(&self.device_nodes, member);
        cgroups
            .create(&group_name(&self.config.state_dir, launch.run, index), &limits, &deny)
            .map(Some)
            .map_err(|e| format!("cannot make member {index}'s cgroup: {e}"))
    }

    /// Forks member `index` and execs its program, with the environment `env` only. Between
    /// the fork and the exec the child (still the daemon's account) writes its pid file and —
    /// unless a restarted daemon has meanwhile given the launch up (the marker `launch-failed`
    /// exists) — moves into its cgroup (`cgroup_procs`) and drops to `account` when that is not
    /// the daemon's: nothing of the program runs outside its limits or as the daemon. The marker
    /// check after the pid write closes the race with `recover`, which writes the marker before
    /// its last look at the pid files.
    fn spawn_member(
        &self,
        launch: &Launch,
        dir: &Path,
        index: usize,
        env: &BTreeMap<String, String>,
        account: &Account,
        cgroup_procs: Vec<File>,
    ) -> Result<Child, String> {
        use std::os::unix::process::CommandExt;
        let log = member_log(&launch.log_dir, index);
        let out = open_log(&log, account)?;
        let err = out.try_clone().map_err(|e| format!("cannot open log {}: {e}", log.display()))?;
        let (program, args) = launch.command.split_first().ok_or("empty command")?;
        let path_var = env.get("PATH").map_or(account::DEFAULT_PATH, String::as_str);
        let resolved = allot_backend::resolve_program(program, Some(path_var))?;
        let c_path = |p: PathBuf| {
            std::ffi::CString::new(p.into_os_string().into_encoded_bytes())
                .map_err(|_| "a state path holds a NUL byte".to_string())
        };
        let pid_file = c_path(Self::pid_file(dir, index))?;
        let marker = c_path(dir.join("launch-failed"))?;
        let drop_to = (!account.is_current()).then(|| {
            let groups: Vec<nix::unistd::Gid> =
                account.groups.iter().map(|g| nix::unistd::Gid::from_raw(*g)).collect();
            (
                groups,
                nix::unistd::Gid::from_raw(account.gid),
                nix::unistd::Uid::from_raw(account.uid),
            )
        });
        let mut command = Command::new(&resolved);
        command
            .arg0(program)
            .args(args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        if drop_to.is_some() {
            let home = &account.home;
            command.current_dir(if home.is_dir() { home.as_path() } else { Path::new("/") });
        }
        // SAFETY: the closure runs in the forked child before exec, so it must only make
        // async-signal-safe calls: it allocates nothing (every path, list and cgroup file was
        // made or opened above) and calls open, write, close, access, setgroups, setgid and
        // setuid.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                write_own_pid(&pid_file)?;
                if nix::unistd::access(marker.as_c_str(), nix::unistd::AccessFlags::F_OK).is_ok() {
                    return Err(std::io::Error::from_raw_os_error(libc::ECANCELED));
                }
                cgroup::enter(&cgroup_procs)?;
                if let Some((groups, gid, uid)) = &drop_to {
                    nix::unistd::setgroups(groups)?;
                    nix::unistd::setgid(*gid)?;
                    nix::unistd::setuid(*uid)?;
                }
                Ok(())
            });
        }
        command.spawn().map_err(|e| format!("cannot start member {index} ({program}): {e}"))
    }

    /// Removes the cgroups left by `run`'s `members` (killing what is in them), after a restart.
    fn remove_groups(&self, run: RunId, members: usize) {
        let Some(cgroups) = &self.config.cgroups else { return };
        for i in 0..members {
            if let Some(group) = cgroups.existing(&group_name(&self.config.state_dir, run, i)) {
                let _ = group.remove();
            }
        }
    }

    /// What a restarted daemon says about `launch` from the disk and the process table. Runs
    /// still whole are adopted (watched from now on).
    fn recover_one(&mut self, launch: &Launch) -> Observation {
        let run = launch.run;
        let dir = run_dir(&self.config.state_dir, run);
        if let Ok(error) = std::fs::read_to_string(dir.join("launch-failed")) {
            return Observation::LaunchFailed { run, error };
        }
        if let Some((code, detail)) =
            std::fs::read_to_string(dir.join("exit")).ok().and_then(|t| parse_exit_record(&t))
        {
            return Observation::Exited { run, code, detail };
        }
        if !dir.join("launch.json").exists() {
            return Observation::LaunchFailed {
                run,
                error: format!("never launched: no launch record in {}", dir.display()),
            };
        }
        let pids = self.read_pid_files(&dir, launch.members.len());
        let mut found: Vec<(usize, u32, Option<u64>)> = pids
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|pid| (i, pid, self.start_time_of(&dir, i))))
            .collect();
        if found.len() < launch.members.len() {
            // Give the launch up first, then look again: a member shell that wrote its pid
            // after our first look either shows up now (and is killed) or sees the marker and
            // exits before becoming the program.
            let error = "the daemon stopped while launching".to_string();
            let _ = write_durably(&dir.join("launch-failed"), &error);
            found = pids
                .iter()
                .enumerate()
                .filter_map(|(i, _)| {
                    let text = std::fs::read_to_string(Self::pid_file(&dir, i)).ok()?;
                    let pid = text.strip_suffix('\n')?.trim().parse().ok()?;
                    Some((i, pid, self.start_time_of(&dir, i)))
                })
                .collect();
            for (_, pid, start) in &found {
                if alive(*pid, *start) {
                    let _ = signal_group(*pid, Signal::SIGKILL);
                }
            }
            self.remove_groups(run, launch.members.len());
            return Observation::LaunchFailed { run, error };
        }
        let living: Vec<bool> = found.iter().map(|(_, pid, start)| alive(*pid, *start)).collect();
        if living.iter().all(|a| *a) {
            let members = found
                .iter()
                .map(|(i, pid, start)| Member {
                    pid: *pid,
                    child: None,
                    start_time: *start,
                    end: None,
                    group: self
                        .config
                        .cgroups
                        .as_ref()
                        .and_then(|c| c.existing(&group_name(&self.config.state_dir, run, *i))),
                })
                .collect();
            let pids: Vec<u32> = found.iter().map(|(_, pid, _)| *pid).collect();
            self.runs.insert(run, LocalRun { dir, members, ended: None, end_order: Vec::new() });
            return Observation::Started { run, pids };
        }
        let detail = if living.iter().any(|a| *a) {
            // A gang runs whole or not at all: the survivors cannot finish without the rest.
            for ((_, pid, start), is_alive) in found.iter().zip(&living) {
                if *is_alive && alive(*pid, *start) {
                    let _ = signal_group(*pid, Signal::SIGKILL);
                }
            }
            format!(
                "{DETAIL_UNKNOWN}; some members ended while allot was down and the rest were killed (a gang runs whole or not at all)"
            )
        } else {
            DETAIL_UNKNOWN.to_string()
        };
        self.remove_groups(run, launch.members.len());
        let _ = write_durably(&dir.join("exit"), &exit_record(None, &detail));
        Observation::Exited { run, code: None, detail }
    }

    /// Pid files of `count` members; waits up to `PID_FILE_WAIT` for any still being written.
    #[allow(clippy::disallowed_methods)] // a bounded real wait for a shell that may still run
    fn read_pid_files(&self, dir: &Path, count: usize) -> Vec<Option<u32>> {
        let read = || -> Vec<Option<u32>> {
            (0..count)
                .map(|i| {
                    let text = std::fs::read_to_string(Self::pid_file(dir, i)).ok()?;
                    // The shell's `echo` ends the line; without it the write is unfinished.
                    text.strip_suffix('\n')?.trim().parse().ok()
                })
                .collect()
        };
        let start = std::time::Instant::now();
        loop {
            let pids = read();
            if pids.iter().all(Option::is_some) || start.elapsed() >= PID_FILE_WAIT {
                return pids;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_time_of(&self, dir: &Path, member: usize) -> Option<u64> {
        std::fs::read_to_string(Self::start_file(dir, member)).ok()?.trim().parse().ok()
    }

    /// Checks each running member of `run`; returns the run's end once every member ended.
    fn observe(run_state: &mut LocalRun, run: RunId) -> Option<Observation> {
        for (i, member) in run_state.members.iter_mut().enumerate() {
            if member.end.is_some() {
                continue;
            }
            let end = match &mut member.child {
                Some(child) => {
                    let Some(p) = nix_pid(member.pid) else { continue };
                    // Peek without reaping: while the zombie exists its pid (and group id) cannot
                    // be reused, so the group's stragglers can be killed safely.
                    let peek = waitid(
                        Id::Pid(p),
                        WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
                    );
                    if let Ok(WaitStatus::StillAlive) = peek {
                        continue;
                    }
                    let _ = signal_group(member.pid, Signal::SIGKILL);
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            use std::os::unix::process::ExitStatusExt;
                            match (status.code(), status.signal()) {
                                (Some(code), _) => MemberEnd::Code(code),
                                (None, Some(sig)) => MemberEnd::Signal(
                                    Signal::try_from(sig)
                                        .map_or(format!("signal {sig}"), |s| s.to_string()),
                                ),
                                (None, None) => MemberEnd::Unknown,
                            }
                        }
                        Ok(None) => continue,
                        Err(_) => MemberEnd::Unknown,
                    }
                }
                None => {
                    if alive(member.pid, member.start_time) {
                        continue;
                    }
                    // Stragglers of its group may remain only if the pid is free; a pid
                    // taken by another process (start time differs) is not ours to signal.
                    if pid_gone(member.pid) {
                        let _ = signal_group(member.pid, Signal::SIGKILL);
                    }
                    MemberEnd::Unknown
                }
            };
            let end = match &member.group {
                Some(group) => {
                    let oom = group.oom_killed();
                    // What escaped the process group (a daemonised helper) ends with it.
                    let _ = group.remove();
                    match end {
                        MemberEnd::Signal(sig) if oom => MemberEnd::OutOfMemory {
                            code: None,
                            how: format!("was killed by {sig}"),
                        },
                        // A process under the member's program was the one killed.
                        MemberEnd::Code(c) if oom && c != 0 => MemberEnd::OutOfMemory {
                            code: Some(c),
                            how: format!("exited with code {c}"),
                        },
                        end => end,
                    }
                }
                None => end,
            };
            member.end = Some(end);
            run_state.end_order.push(i);
        }
        let failed = run_state.end_order.iter().any(|i| {
            matches!(run_state.members[*i].end, Some(MemberEnd::Code(c)) if c != 0)
                || matches!(
                    run_state.members[*i].end,
                    Some(MemberEnd::Signal(_) | MemberEnd::OutOfMemory { .. })
                )
        });
        if failed {
            // A gang runs whole or not at all: once one member failed, the rest cannot finish.
            for m in run_state.members.iter().filter(|m| m.end.is_none()) {
                let _ = signal_group(m.pid, Signal::SIGKILL);
            }
        }
        if run_state.members.iter().any(|m| m.end.is_none()) {
            return None;
        }
        // The first member that failed, in the order they ended, decides the code.
        let first_failure =
            run_state.end_order.iter().find_map(|i| match run_state.members[*i].end.as_ref()? {
                MemberEnd::Code(0) => None,
                end => Some((*i, end.clone())),
            });
        let (code, detail) = match first_failure {
            None => (Some(0), "every member exited with code 0".to_string()),
            Some((i, MemberEnd::Code(c))) => (Some(c), format!("member {i} exited with code {c}")),
            Some((i, MemberEnd::Signal(sig))) => (None, format!("member {i} was killed by {sig}")),
            Some((i, MemberEnd::OutOfMemory { code, how })) => (
                code,
                format!(
                    "member {i} {how}: out of memory — it used more than its memory request, \
                     its cgroup's limit, and the kernel's OOM killer ended it; ask for more \
                     (--memory-mib)"
                ),
            ),
            Some((_, MemberEnd::Unknown)) => (None, DETAIL_UNKNOWN.to_string()),
        };
        Some(Observation::Exited { run, code, detail })
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn isolation(&self) -> Option<String> {
        let who = match self.config.run_as {
            RunAs::Submitter => "as its submitter's Unix account, its files its own",
            RunAs::Daemon => "as the daemon's own Unix account, like every workload here",
        };
        let fence = if self.config.cgroups.is_some() {
            format!(
                "in its own cgroup: CPU and memory held to its request (none asked: not \
                 limited), at most {PIDS_PER_MEMBER} processes, and only its own GPUs' device \
                 nodes"
            )
        } else {
            "with its CPU and memory requests and GPU devices not enforced (no usable cgroup \
             on this host)"
                .to_string()
        };
        Some(format!("runs {who}, {fence}; its environment holds only its own variables"))
    }

    fn submitter_check(&self) -> Option<allot_backend::SubmitterCheck> {
        (self.config.run_as == RunAs::Submitter).then(|| {
            let check: allot_backend::SubmitterCheck =
                std::sync::Arc::new(|user: &str| Account::of_user(user, ACCOUNT_FIX).map(|_| ()));
            check
        })
    }

    fn inventory(&mut self) -> Result<Vec<NodeSpec>, BackendError> {
        let mut gpus = if self.config.use_nvml {
            discover::nvidia_gpus().unwrap_or_default()
        } else {
            Vec::new()
        };
        gpus.extend(discover::amd_gpus(&self.config.sysfs_root));
        self.nvidia_uuids = gpus
            .iter()
            .filter(|g| g.vendor == Vendor::Nvidia)
            .filter_map(|g| g.uuid.clone().map(|u| (g.index, u)))
            .collect();
        if !gpus.is_empty() {
            return Ok(vec![discover::node_spec(&self.config.node_name, &gpus)]);
        }
        match &self.config.declared_inventory {
            Some(nodes) => {
                self.hosted_nodes = nodes.iter().map(|n| n.name.clone()).collect();
                Ok(nodes.clone())
            }
            None => Err(BackendError::Invalid(format!(
                "no GPU found on this host (NVML: {}; no AMD GPU under {}/class/drm); pass \
                 --inventory FILE to declare this host's devices",
                if self.config.use_nvml {
                    discover::nvidia_gpus().err().unwrap_or_else(|| "no devices".to_string())
                } else {
                    "not asked".to_string()
                },
                self.config.sysfs_root.display()
            ))),
        }
    }

    fn launch(&mut self, launch: &Launch) -> Result<(), BackendError> {
        let run = launch.run;
        if self.runs.contains_key(&run) {
            return Ok(());
        }
        let dir = run_dir(&self.config.state_dir, run);
        if dir.join("launch.json").exists() || dir.join("launch-failed").exists() {
            // Launched by an earlier daemon life: adopt or report it, never start it twice.
            let observation = self.recover_one(launch);
            self.runs.entry(run).or_insert_with(|| LocalRun {
                dir,
                members: Vec::new(),
                ended: Some(observation.clone()),
                end_order: Vec::new(),
            });
            self.pending.push(observation);
            return Ok(());
        }
        if let Some(error) = self.refusal(launch) {
            self.fail_launch(run, &dir, error);
            return Ok(());
        }
        let account = match self.account(launch) {
            Ok(account) => account,
            Err(error) => {
                self.fail_launch(run, &dir, error);
                return Ok(());
            }
        };
        let envs: Result<Vec<_>, String> = launch
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| self.member_env(launch, i, m, &account))
            .collect();
        let envs = match envs {
            Ok(envs) => envs,
            Err(error) => {
                self.fail_launch(run, &dir, error);
                return Ok(());
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| io_error("cannot create run directory", &dir, e))?;
        write_durably(&dir.join("launch.json"), &launch_record(launch))?;
        let owner = (!account.is_current()).then_some(&account);
        if let Err(error) = allot_backend::files::prepare(launch, owner) {
            self.fail_launch(run, &dir, error);
            return Ok(());
        }
        let mut members: Vec<Member> = Vec::new();
        for (i, env) in envs.iter().enumerate() {
            let spawned = self.member_group(launch, i).and_then(|group| {
                let procs = match &group {
                    Some(g) => g.open_procs()?,
                    None => Vec::new(),
                };
                match self.spawn_member(launch, &dir, i, env, &account, procs) {
                    Ok(child) => Ok((child, group)),
                    Err(error) => {
                        if let Some(g) = &group {
                            let _ = g.remove();
                        }
                        Err(error)
                    }
                }
            });
            match spawned {
                Ok((child, group)) => {
                    let pid = child.id();
                    let start_time = proc_stat(pid).map(|(_, start)| start);
                    if let Some(start) = start_time {
                        // Best effort: without it, recovery trusts the pid alone.
                        let _ = write_durably(&Self::start_file(&dir, i), &start.to_string());
                    }
                    members.push(Member { pid, child: Some(child), start_time, end: None, group });
                }
                Err(error) => {
                    for m in &mut members {
                        let _ = signal_group(m.pid, Signal::SIGKILL);
                        if let Some(child) = &mut m.child {
                            let _ = child.wait();
                        }
                        if let Some(g) = &m.group {
                            let _ = g.remove();
                        }
                    }
                    self.fail_launch(run, &dir, error);
                    return Ok(());
                }
            }
        }
        let pids = members.iter().map(|m| m.pid).collect();
        self.runs.insert(run, LocalRun { dir, members, ended: None, end_order: Vec::new() });
        self.pending.push(Observation::Started { run, pids });
        Ok(())
    }

    fn signal(&mut self, run: RunId, signal: StopSignal) -> Result<(), BackendError> {
        let Some(state) = self.runs.get(&run) else {
            return Err(BackendError::UnknownRun { run });
        };
        if state.ended.is_some() {
            return Ok(());
        }
        let signal = match signal {
            StopSignal::Checkpoint => self.config.checkpoint_signal,
            StopSignal::Terminate => Signal::SIGTERM,
            StopSignal::Kill => Signal::SIGKILL,
        };
        for m in state.members.iter().filter(|m| m.end.is_none()) {
            // A re-adopted member (not our child) whose pid now names another process is
            // not signalled; the next poll reports it ended.
            if m.child.is_none() && !alive(m.pid, m.start_time) {
                continue;
            }
            signal_group(m.pid, signal)?;
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<Vec<Observation>, BackendError> {
        let mut observations = std::mem::take(&mut self.pending);
        for (run, state) in self.runs.iter_mut().filter(|(_, s)| s.ended.is_none()) {
            if let Some(end) = Self::observe(state, *run) {
                if let Observation::Exited { code, detail, .. } = &end {
                    // So that a restart reports what was learned; if this fails the restart
                    // reports the status as unknown, which is still honest.
                    let _ = write_durably(&state.dir.join("exit"), &exit_record(*code, detail));
                }
                state.ended = Some(end.clone());
                observations.push(end);
            }
        }
        Ok(observations)
    }

    fn recover(&mut self, runs: &[Launch]) -> Result<Vec<Observation>, BackendError> {
        let mut observations = Vec::new();
        for launch in runs {
            if let Some(state) = self.runs.get(&launch.run) {
                // Known to this daemon life: say where it stands.
                observations.push(state.ended.clone().unwrap_or_else(|| Observation::Started {
                    run: launch.run,
                    pids: state.members.iter().map(|m| m.pid).collect(),
                }));
                continue;
            }
            let observation = self.recover_one(launch);
            let dir = run_dir(&self.config.state_dir, launch.run);
            // Adopted runs are in the map already; every other answer is final.
            self.runs.entry(launch.run).or_insert_with(|| LocalRun {
                dir,
                members: Vec::new(),
                ended: Some(observation.clone()),
                end_order: Vec::new(),
            });
            observations.push(observation);
        }
        Ok(observations)
    }
}

#[cfg(test)]
mod tests;
