//! Enforcing a member's request with Linux cgroups: v1, v2, and hybrid hosts (v1 controllers
//! plus a cgroup2 mount).
//!
//! Each member gets a group `allot/<name>` under the daemon's own group in every hierarchy that
//! holds a controller allot uses (cpu, memory, pids, devices). The spawner opens the groups'
//! `cgroup.procs` files ([`MemberGroup::open_procs`]) before the fork and the child writes `0`
//! into them ([`enter`]) before it execs, so nothing the member allocates escapes the limits.
//!
//! v1 controllers win where both exist (on a hybrid host the cgroup2 mount usually has none of
//! them). GPU isolation is v1 `devices.deny`, or on v2 an eBPF `BPF_PROG_TYPE_CGROUP_DEVICE`
//! program attached to the member's group, built here from raw instructions.
//!
//! On v2 the "no internal processes" rule means the daemon's own group cannot both hold
//! processes and delegate controllers, so the daemon moves itself into a leaf
//! `<own>/allot-daemon` when enabling them fails with `EBUSY` (under systemd the unit needs
//! `Delegate=yes` for that to stick).

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The parent of every member group, inside the daemon's own group.
const PARENT: &str = "allot";
/// The v2 leaf the daemon moves its own processes into (see the module docs).
const DAEMON_LEAF: &str = "allot-daemon";
/// `cpu.cfs_period_us` / the period in `cpu.max`: 100 ms, so 1 CPU = a quota of 100000.
const CPU_PERIOD_US: u64 = 100_000;
/// The kernel rejects quotas under 1 ms.
const CPU_MIN_QUOTA_US: u64 = 1_000;

/// A member's limits. 0 means "no limit" for each (a `pids_max` of 0 would leave the member
/// unable to fork at all, so it too means unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// CPU time in thousandths of a CPU (1500 = one and a half CPUs).
    pub cpu_millis: u64,
    pub memory_mib: u64,
    pub pids_max: u64,
}

/// A character device the member must not open (a GPU it was not given).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeniedDevice {
    pub major: u32,
    pub minor: u32,
}

/// The controllers allot uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ctl {
    Cpu,
    Memory,
    Pids,
    Devices,
}

impl Ctl {
    const ALL: [Ctl; 4] = [Ctl::Cpu, Ctl::Memory, Ctl::Pids, Ctl::Devices];
    /// Those v2 has as controllers (v2 devices are eBPF, not a controller).
    const RESOURCES: [Ctl; 3] = [Ctl::Cpu, Ctl::Memory, Ctl::Pids];

    fn name(self) -> &'static str {
        match self {
            Ctl::Cpu => "cpu",
            Ctl::Memory => "memory",
            Ctl::Pids => "pids",
            Ctl::Devices => "devices",
        }
    }
}

/// One v1 hierarchy holding at least one of allot's controllers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct V1Hierarchy {
    /// The daemon's own group in it: `<mount>/<path from /proc/self/cgroup>`.
    own: PathBuf,
    ctls: Vec<Ctl>,
}

/// The cgroup2 hierarchy, when allot uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct V2Hierarchy {
    mount: PathBuf,
    /// The daemon's own group (the parent of `allot-daemon` if it moved there earlier).
    own: PathBuf,
    /// The controllers allot enables and limits through v2 (those v1 lacks and v2 offers).
    ctls: Vec<Ctl>,
}

/// How devices are denied.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Devices {
    V1,
    Bpf,
    /// Not enforced, and why.
    Unavailable(String),
}

/// The cgroup hierarchy found on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    v1: Vec<V1Hierarchy>,
    v2: Option<V2Hierarchy>,
    devices: Devices,
    /// What is not enforced and why, for [`Cgroups::describe`].
    missing: Vec<String>,
}

/// A member's groups, one directory per hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberGroup {
    /// The v1 directories, then the v2 one.
    dirs: Vec<PathBuf>,
    v2: Option<PathBuf>,
    /// `memory.oom_control` (v1) or `memory.events` (v2): both have an `oom_kill N` line.
    oom_events: Option<PathBuf>,
}

/// A mount of a cgroup filesystem from `/proc/self/mountinfo`.
#[derive(Debug)]
struct Mount {
    /// The mount's root within the hierarchy (not `/` when a container bind-mounts a subtree).
    root: String,
    point: String,
    v2: bool,
    /// v1: the super options, which name the hierarchy's controllers.
    options: Vec<String>,
}

impl Cgroups {
    /// Reads `/proc/self/mountinfo` and `/proc/self/cgroup`. `Err` says what is missing when
    /// there is no usable hierarchy. Where devices would be eBPF, loading a program is tried
    /// once, so an unusable bpf(2) shows in [`Cgroups::describe`] rather than at each launch.
    pub fn detect() -> Result<Cgroups, String> {
        let mountinfo = read("/proc/self/mountinfo".as_ref())?;
        let self_cgroup = read("/proc/self/cgroup".as_ref())?;
        let mut found = Cgroups::from_texts(&mountinfo, &self_cgroup, Path::new("/"))?;
        if found.devices == Devices::Bpf {
            let probe = bpf::device_program(&[DeniedDevice { major: 195, minor: 255 }])
                .and_then(|insns| bpf::load(&insns));
            if let Err(e) = probe {
                found.devices = Devices::Unavailable(e.clone());
                found.missing.push(format!("devices ({e})"));
                // The cgroup2 group was there for the device program alone.
                if found.v2.as_ref().is_some_and(|h| h.ctls.is_empty()) {
                    found.v2 = None;
                    if found.v1.is_empty() {
                        return Err(format!("no usable cgroup hierarchy: {}", found.describe()));
                    }
                }
            }
        }
        Ok(found)
    }

    /// [`Cgroups::detect`] from given texts, with the mount points under `fs_root` (`/` on a
    /// real host), for tests on a plain directory tree. Reads the v2 group's
    /// `cgroup.controllers` below `fs_root`.
    pub fn from_texts(
        mountinfo: &str,
        self_cgroup: &str,
        fs_root: &Path,
    ) -> Result<Cgroups, String> {
        let mounts = parse_mountinfo(mountinfo);
        let memberships = parse_self_cgroup(self_cgroup);
        let mut notes = Vec::new();
        let mut have = BTreeSet::new();
        let mut v1 = Vec::new();
        for mount in mounts.iter().filter(|m| !m.v2) {
            let ctls: Vec<Ctl> = Ctl::ALL
                .into_iter()
                .filter(|c| !have.contains(c) && mount.options.iter().any(|o| o == c.name()))
                .collect();
            let Some(&first) = ctls.first() else { continue };
            let Some((_, path)) =
                memberships.iter().find(|(names, _)| names.iter().any(|n| n == first.name()))
            else {
                notes.push(format!("{} is mounted but not in /proc/self/cgroup", first.name()));
                continue;
            };
            let Some(own) = group_dir(fs_root, mount, path) else {
                notes.push(format!(
                    "the daemon's {} group {path} is outside the mount at {}",
                    first.name(),
                    mount.point
                ));
                continue;
            };
            have.extend(ctls.iter().copied());
            v1.push(V1Hierarchy { own, ctls });
        }

        let mut v2 = None;
        if let Some(mount) = mounts.iter().find(|m| m.v2) {
            match memberships.iter().find(|(names, _)| names.is_empty()) {
                None => {
                    notes.push("cgroup2 is mounted but /proc/self/cgroup has no 0:: line".into())
                }
                Some((_, path)) => {
                    // A daemon that moved itself into its leaf earlier keeps the same layout.
                    let path = path.strip_suffix(&format!("/{DAEMON_LEAF}")).unwrap_or(path);
                    match group_dir(fs_root, mount, path) {
                        None => notes.push(format!(
                            "the daemon's cgroup2 group {path} is outside the mount at {}",
                            mount.point
                        )),
                        Some(own) => {
                            let file = own.join("cgroup.controllers");
                            let offered = match read(&file) {
                                Ok(text) => text,
                                Err(e) => {
                                    notes.push(e);
                                    String::new()
                                }
                            };
                            let ctls = Ctl::RESOURCES
                                .into_iter()
                                .filter(|c| {
                                    !have.contains(c)
                                        && offered.split_whitespace().any(|o| o == c.name())
                                })
                                .collect();
                            v2 = Some(V2Hierarchy {
                                mount: fs_root.join(mount.point.trim_start_matches('/')),
                                own,
                                ctls,
                            });
                        }
                    }
                }
            }
        }

        let devices = if have.contains(&Ctl::Devices) {
            Devices::V1
        } else if v2.is_some() {
            Devices::Bpf
        } else {
            Devices::Unavailable("no v1 devices controller and no cgroup2 group".into())
        };
        // A cgroup2 mount with none of allot's controllers matters only for eBPF devices.
        if v2.as_ref().is_some_and(|h| h.ctls.is_empty()) && devices != Devices::Bpf {
            v2 = None;
        }
        if v1.is_empty() && v2.is_none() {
            let mut why = String::from(
                "no cgroup hierarchy: neither a cgroup2 mount nor a v1 mount of cpu, memory, pids \
                 or devices that this process is in",
            );
            for note in &notes {
                why.push_str("; ");
                why.push_str(note);
            }
            return Err(why);
        }
        let via_v2 = v2.as_ref().map_or(&[][..], |h| &h.ctls[..]);
        let mut missing: Vec<String> = Ctl::RESOURCES
            .into_iter()
            .filter(|c| !have.contains(c) && !via_v2.contains(c))
            .map(|c| c.name().to_string())
            .collect();
        if let Devices::Unavailable(why) = &devices {
            missing.push(format!("devices ({why})"));
        }
        if !missing.is_empty() && !notes.is_empty() {
            missing.push(notes.join("; "));
        }
        Ok(Cgroups { v1, v2, devices, missing })
    }

    /// Which version/mode, for a log line: e.g. `cgroup v1 (cpu, memory, pids, devices)` or
    /// `cgroup v2 at /sys/fs/cgroup (cpu, memory, pids; devices by eBPF)`, with what is not
    /// enforced after `not enforced:`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.v1.is_empty() {
            let names: Vec<&str> = Ctl::ALL
                .into_iter()
                .filter(|c| self.v1.iter().any(|h| h.ctls.contains(c)))
                .map(Ctl::name)
                .collect();
            parts.push(format!("cgroup v1 ({})", names.join(", ")));
        }
        if let Some(v2) = &self.v2 {
            let mut what = v2.ctls.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
            if self.devices == Devices::Bpf {
                if !what.is_empty() {
                    what.push_str("; ");
                }
                what.push_str("devices by eBPF");
            }
            parts.push(format!("cgroup v2 at {} ({what})", v2.mount.display()));
        }
        let mut text = parts.join(" + ");
        if !self.missing.is_empty() {
            text.push_str("; not enforced: ");
            text.push_str(&self.missing.join(", "));
        }
        text
    }

    /// Creates (or reuses: idempotent) the member's group `name` (e.g. `12.1-m0`) under
    /// `allot` inside the daemon's own group, and writes the limits and the device rules.
    /// Errors name the file and the errno. On an error the directories this call made are
    /// removed again.
    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        deny: &[DeniedDevice],
    ) -> Result<MemberGroup, String> {
        check_name(name)?;
        let mut made = Vec::new();
        let result = self.create_in(name, limits, deny, &mut made);
        if result.is_err() {
            // Fresh groups: nothing can be in them yet, nobody has their cgroup.procs.
            for dir in made.iter().rev() {
                let _ = fs::remove_dir(dir);
            }
        }
        result
    }

    fn create_in(
        &self,
        name: &str,
        limits: &Limits,
        deny: &[DeniedDevice],
        made: &mut Vec<PathBuf>,
    ) -> Result<MemberGroup, String> {
        let group = self.member_group(name);
        for (h, dir) in self.v1.iter().zip(&group.dirs) {
            make_dir(&h.own.join(PARENT))?;
            if make_dir(dir)? {
                made.push(dir.clone());
            }
            for &ctl in &h.ctls {
                match ctl {
                    Ctl::Cpu => write_v1_cpu(dir, limits.cpu_millis)?,
                    Ctl::Memory => write_v1_memory(dir, limits.memory_mib)?,
                    Ctl::Pids => write_value(&dir.join("pids.max"), &pids_value(limits.pids_max))?,
                    Ctl::Devices => write_v1_deny(dir, deny)?,
                }
            }
        }
        if let (Some(v2), Some(dir)) = (&self.v2, &group.v2) {
            let names: Vec<&str> = v2.ctls.iter().map(|c| c.name()).collect();
            if !names.is_empty() {
                enable_controllers(&v2.own, &names, true)?;
            }
            let parent = v2.own.join(PARENT);
            make_dir(&parent)?;
            if !names.is_empty() {
                enable_controllers(&parent, &names, false)?;
            }
            if make_dir(dir)? {
                made.push(dir.clone());
            }
            for &ctl in &v2.ctls {
                match ctl {
                    Ctl::Cpu => {
                        let quota = cpu_quota(limits.cpu_millis)
                            .map_or_else(|| "max".to_string(), |q| q.to_string());
                        write_value(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                    }
                    Ctl::Memory => write_v2_memory(dir, limits.memory_mib)?,
                    Ctl::Pids => write_value(&dir.join("pids.max"), &pids_value(limits.pids_max))?,
                    Ctl::Devices => {}
                }
            }
            if self.devices == Devices::Bpf && !deny.is_empty() {
                bpf::attach_deny(dir, deny)?;
            }
        }
        Ok(group)
    }

    /// The group of `name` if it exists (after a daemon restart), without changing it.
    pub fn existing(&self, name: &str) -> Option<MemberGroup> {
        check_name(name).ok()?;
        let group = self.member_group(name);
        group.dirs.iter().any(|d| d.is_dir()).then_some(group)
    }

    /// The paths of `name`'s groups, made or not.
    fn member_group(&self, name: &str) -> MemberGroup {
        let mut dirs: Vec<PathBuf> =
            self.v1.iter().map(|h| h.own.join(PARENT).join(name)).collect();
        let mut oom_events = self
            .v1
            .iter()
            .zip(&dirs)
            .find(|(h, _)| h.ctls.contains(&Ctl::Memory))
            .map(|(_, d)| d.join("memory.oom_control"));
        let v2 = self.v2.as_ref().map(|h| h.own.join(PARENT).join(name));
        if let (Some(h), Some(dir)) = (&self.v2, &v2) {
            if h.ctls.contains(&Ctl::Memory) {
                oom_events = Some(dir.join("memory.events"));
            }
            dirs.push(dir.clone());
        }
        MemberGroup { dirs, v2, oom_events }
    }
}

impl MemberGroup {
    /// The group's directories: one per v1 hierarchy, then the v2 one.
    pub fn paths(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The groups' `cgroup.procs` files (one per v1 hierarchy, one for v2), opened
    /// `O_WRONLY|O_CLOEXEC`, for the child to write `0` into before it execs ([`enter`]).
    pub fn open_procs(&self) -> Result<Vec<File>, String> {
        self.dirs
            .iter()
            .map(|dir| {
                let path = dir.join("cgroup.procs");
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(&path)
                    .map_err(|e| format!("opening {}: {}", path.display(), os_error(&e)))
            })
            .collect()
    }

    /// Whether the kernel OOM-killed a process in the group (the `oom_kill N` line of v1
    /// `memory.oom_control` or v2 `memory.events`). False without a memory controller.
    pub fn oom_killed(&self) -> bool {
        let Some(file) = &self.oom_events else { return false };
        let Ok(text) = fs::read_to_string(file) else { return false };
        text.lines().any(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some("oom_kill")
                && words.next().and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 0)
        })
    }

    /// Kills what remains (v2 `cgroup.kill` when present, SIGKILL to every pid in
    /// `cgroup.procs`) and removes the directories. Ok if they are already gone.
    pub fn remove(&self) -> Result<(), String> {
        if let Some(dir) = &self.v2 {
            let file = dir.join("cgroup.kill");
            // cgroup.kill (Linux 5.14) also catches processes forked while we kill.
            if file.exists() {
                match write_file(&file, "1") {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => {
                        return Err(format!("writing 1 to {}: {}", file.display(), os_error(&e)));
                    }
                }
            }
        }
        for dir in self.dirs.iter().rev() {
            remove_group(dir)?;
        }
        Ok(())
    }
}

/// Moves the calling process into the groups: writes `0` to each file from
/// [`MemberGroup::open_procs`]. Meant for a `pre_exec` closure: one write(2) per file, nothing
/// allocated.
pub fn enter(procs: &[File]) -> io::Result<()> {
    for mut file in procs {
        file.write_all(b"0")?;
    }
    Ok(())
}

/// rmdir, killing what is inside while the kernel says busy; 5 s at most.
fn remove_group(dir: &Path) -> Result<(), String> {
    for _ in 0..500 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                kill_all(dir)?;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("removing {}: {}", dir.display(), os_error(&e))),
        }
    }
    let left = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    Err(format!(
        "removing {}: still busy after 5 s of SIGKILL (pids: {})",
        dir.display(),
        left.split_whitespace().collect::<Vec<_>>().join(" ")
    ))
}

/// SIGKILL to every process in the group's `cgroup.procs`.
fn kill_all(dir: &Path) -> Result<(), String> {
    let file = dir.join("cgroup.procs");
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(format!("reading {}: {}", file.display(), os_error(&e))),
    };
    for pid in text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        match kill(Pid::from_raw(pid), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                return Err(format!(
                    "killing pid {pid} of {}: {e:?}: {}",
                    file.display(),
                    e.desc()
                ));
            }
        }
    }
    Ok(())
}

/// Enables `names` in `group`'s `cgroup.subtree_control`. For the daemon's own group
/// (`own`), `EBUSY` means it still holds processes: they move to the `allot-daemon` leaf.
fn enable_controllers(group: &Path, names: &[&str], own: bool) -> Result<(), String> {
    let file = group.join("cgroup.subtree_control");
    let enabled = read(&file)?;
    let enabled: Vec<&str> =
        enabled.split_whitespace().map(|w| w.trim_start_matches('+')).collect();
    let wanted: Vec<String> =
        names.iter().filter(|n| !enabled.contains(n)).map(|n| format!("+{n}")).collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let text = wanted.join(" ");
    // A process forked between the move and the write makes it busy again: a few rounds.
    for _ in 0..5 {
        match write_file(&file, &text) {
            Ok(()) => return Ok(()),
            Err(e) if own && e.raw_os_error() == Some(libc::EBUSY) => move_processes(group)?,
            Err(e) => {
                return Err(format!("writing {text:?} to {}: {}", file.display(), os_error(&e)));
            }
        }
    }
    Err(format!("writing {text:?} to {}: still EBUSY after moving its processes", file.display()))
}

/// Moves every process in `group` into its `allot-daemon` leaf.
fn move_processes(group: &Path) -> Result<(), String> {
    let leaf = group.join(DAEMON_LEAF);
    make_dir(&leaf)?;
    let target = leaf.join("cgroup.procs");
    let pids = read(&group.join("cgroup.procs"))?;
    for pid in pids.split_whitespace() {
        match write_file(&target, pid) {
            Ok(()) => {}
            // It exited meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                return Err(format!("writing {pid} to {}: {}", target.display(), os_error(&e)));
            }
        }
    }
    Ok(())
}

fn cpu_quota(cpu_millis: u64) -> Option<u64> {
    (cpu_millis > 0).then(|| cpu_millis.saturating_mul(CPU_PERIOD_US / 1000).max(CPU_MIN_QUOTA_US))
}

fn pids_value(pids_max: u64) -> String {
    if pids_max == 0 { "max".to_string() } else { pids_max.to_string() }
}

fn memory_bytes(memory_mib: u64) -> Option<u64> {
    (memory_mib > 0).then(|| memory_mib.saturating_mul(1 << 20))
}

fn write_v1_cpu(dir: &Path, cpu_millis: u64) -> Result<(), String> {
    write_value(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    let quota = cpu_quota(cpu_millis).map_or_else(|| "-1".to_string(), |q| q.to_string());
    write_value(&dir.join("cpu.cfs_quota_us"), &quota)
}

/// v1 memory, and memsw (memory + swap) to the same value where the kernel has it, so the
/// member cannot escape into swap. The kernel keeps limit <= memsw: lowering writes the limit
/// first, unlimiting (or raising a reused group) writes memsw first.
fn write_v1_memory(dir: &Path, memory_mib: u64) -> Result<(), String> {
    let limit = dir.join("memory.limit_in_bytes");
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let has_memsw = memsw.exists();
    let value = memory_bytes(memory_mib).map_or_else(|| "-1".to_string(), |b| b.to_string());
    if memory_mib == 0 {
        if has_memsw {
            write_value(&memsw, &value)?;
        }
        return write_value(&limit, &value);
    }
    match write_file(&limit, &value) {
        Ok(()) => {}
        // Raising the limit above a reused group's memsw.
        Err(e) if has_memsw && e.raw_os_error() == Some(libc::EINVAL) => {
            write_value(&memsw, &value)?;
            write_value(&limit, &value)?;
        }
        Err(e) => return Err(format!("writing {value} to {}: {}", limit.display(), os_error(&e))),
    }
    if has_memsw {
        write_value(&memsw, &value)?;
    }
    Ok(())
}

/// One rule per write(2), as v1 devices.deny parses them.
fn write_v1_deny(dir: &Path, deny: &[DeniedDevice]) -> Result<(), String> {
    if deny.is_empty() {
        return Ok(());
    }
    let path = dir.join("devices.deny");
    let mut file = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {}", path.display(), os_error(&e)))?;
    for d in deny {
        let rule = format!("c {}:{} rwm\n", d.major, d.minor);
        file.write_all(rule.as_bytes()).map_err(|e| {
            format!("writing {:?} to {}: {}", rule.trim(), path.display(), os_error(&e))
        })?;
    }
    Ok(())
}

/// v2 memory.max, and memory.swap.max 0 where it exists so the member cannot swap.
fn write_v2_memory(dir: &Path, memory_mib: u64) -> Result<(), String> {
    let value = memory_bytes(memory_mib).map_or_else(|| "max".to_string(), |b| b.to_string());
    write_value(&dir.join("memory.max"), &value)?;
    let swap = dir.join("memory.swap.max");
    if swap.exists() {
        write_value(&swap, if memory_mib == 0 { "max" } else { "0" })?;
    }
    Ok(())
}

fn write_value(path: &Path, value: &str) -> Result<(), String> {
    write_file(path, value)
        .map_err(|e| format!("writing {value} to {}: {}", path.display(), os_error(&e)))
}

/// One write(2) of `value` to an existing file (cgroup files cannot be created).
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    OpenOptions::new().write(true).truncate(true).open(path)?.write_all(value.as_bytes())
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("reading {}: {}", path.display(), os_error(&e)))
}

/// mkdir; `Ok(true)` if this call made it, `Ok(false)` if it was there.
fn make_dir(path: &Path) -> Result<bool, String> {
    match fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(format!("creating {}: {}", path.display(), os_error(&e))),
    }
}

/// `EACCES: Permission denied`, naming the errno as the kernel's headers do.
fn os_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let errno = Errno::from_raw(n);
            format!("{errno:?}: {}", errno.desc())
        }
        None => e.to_string(),
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("{name:?} is not a cgroup name"));
    }
    Ok(())
}

/// `<fs_root>/<mount point>/<the group's path below the mount's root>`, or `None` when the
/// group is not below the mount's root (a container that sees only a subtree).
fn group_dir(fs_root: &Path, mount: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else if path == mount.root {
        ""
    } else {
        path.strip_prefix(mount.root.as_str())?.strip_prefix('/')?
    };
    let mut dir = fs_root.join(mount.point.trim_start_matches('/'));
    let rel = rel.trim_matches('/');
    if !rel.is_empty() {
        dir.push(rel);
    }
    Some(dir)
}

/// The cgroup and cgroup2 mounts: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE
/// SOURCE SUPER_OPTIONS` (proc(5)).
fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            let (root, point) = (fields.get(3)?, fields.get(4)?);
            let fstype = *fields.get(dash + 1)?;
            let options = fields.get(dash + 3).copied().unwrap_or("");
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: unescape(root),
                point: unescape(point),
                v2: fstype == "cgroup2",
                options: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/proc/self/cgroup`: `ID:CONTROLLERS:PATH` per hierarchy; v2 is `0::PATH` (no controllers).
fn parse_self_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let names = parts.next()?;
            let path = parts.next()?;
            let names = names.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect();
            Some((names, path.to_string()))
        })
        .collect()
}

/// The v2 device filter: a `BPF_PROG_TYPE_CGROUP_DEVICE` program written as raw instructions
/// from the kernel's ABI (include/uapi/linux/bpf.h), loaded and attached with bpf(2).
mod bpf {
    use std::ffi::c_int;
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::path::Path;

    use nix::errno::Errno;

    use super::DeniedDevice;

    const BPF_PROG_LOAD: c_int = 5;
    const BPF_PROG_ATTACH: c_int = 8;
    const BPF_PROG_QUERY: c_int = 16;
    const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
    const BPF_CGROUP_DEVICE: u32 = 6;
    const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
    /// `bpf_cgroup_dev_ctx.access_type`'s low 16 bits: `BPF_DEVCG_DEV_CHAR`.
    const DEV_CHAR: i32 = 2;

    // Opcodes: class | operation/size | source.
    /// `BPF_LDX | BPF_MEM | BPF_W`: dst = *(u32 *)(src + off).
    pub(super) const LDX_W: u8 = 0x61;
    /// `BPF_ALU64 | BPF_AND | BPF_K`: dst &= imm.
    pub(super) const AND_K: u8 = 0x57;
    /// `BPF_ALU64 | BPF_MOV | BPF_K`: dst = imm.
    pub(super) const MOV_K: u8 = 0xb7;
    /// `BPF_JMP | BPF_JNE | BPF_K`: if dst != imm, skip `off` instructions.
    pub(super) const JNE_K: u8 = 0x55;
    /// `BPF_JMP | BPF_EXIT`: return r0.
    pub(super) const EXIT: u8 = 0x95;

    /// `struct bpf_insn`: the registers share a byte, dst in the low nibble on little-endian.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) struct Insn {
        pub(super) code: u8,
        regs: u8,
        pub(super) off: i16,
        pub(super) imm: i32,
    }

    impl Insn {
        pub(super) fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
            let regs =
                if cfg!(target_endian = "little") { dst | (src << 4) } else { (dst << 4) | src };
            Insn { code, regs, off, imm }
        }

        #[cfg(test)]
        pub(super) fn dst(self) -> u8 {
            if cfg!(target_endian = "little") { self.regs & 0xf } else { self.regs >> 4 }
        }

        #[cfg(test)]
        pub(super) fn src(self) -> u8 {
            if cfg!(target_endian = "little") { self.regs >> 4 } else { self.regs & 0xf }
        }
    }

    /// r1 = the context (`struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor;
    /// }`); r0 = the verdict: 0 denies, 1 allows.
    pub(super) fn device_program(deny: &[DeniedDevice]) -> Result<Vec<Insn>, String> {
        // Each rule is 4 instructions; the jump over all of them must fit the i16 offset.
        let skip_all = i16::try_from(deny.len() * 4)
            .map_err(|_| format!("{} denied devices are too many for one program", deny.len()))?;
        let mut p = vec![
            Insn::new(LDX_W, 2, 1, 0, 0),               // r2 = access_type
            Insn::new(AND_K, 2, 0, 0, 0xffff),          // r2 = device type
            Insn::new(LDX_W, 3, 1, 4, 0),               // r3 = major
            Insn::new(LDX_W, 4, 1, 8, 0),               // r4 = minor
            Insn::new(JNE_K, 2, 0, skip_all, DEV_CHAR), // block devices: allow
        ];
        for d in deny {
            // The compare is 64-bit against a sign-extended imm: values must be below 2^31.
            let major =
                i32::try_from(d.major).map_err(|_| format!("major {} too large", d.major))?;
            let minor =
                i32::try_from(d.minor).map_err(|_| format!("minor {} too large", d.minor))?;
            p.push(Insn::new(JNE_K, 3, 0, 3, major)); // other major: next rule
            p.push(Insn::new(JNE_K, 4, 0, 2, minor)); // other minor: next rule
            p.push(Insn::new(MOV_K, 0, 0, 0, 0));
            p.push(Insn::new(EXIT, 0, 0, 0, 0));
        }
        p.push(Insn::new(MOV_K, 0, 0, 0, 1));
        p.push(Insn::new(EXIT, 0, 0, 0, 0));
        Ok(p)
    }

    /// The `BPF_PROG_LOAD` part of `union bpf_attr`, up to `expected_attach_type`; no padding
    /// (the kernel treats the bytes we do not pass as zero).
    #[repr(C)]
    struct ProgLoadAttr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }

    /// The `BPF_PROG_ATTACH` part, up to `attach_flags`.
    #[repr(C)]
    struct ProgAttachAttr {
        target_fd: u32,
        attach_bpf_fd: u32,
        attach_type: u32,
        attach_flags: u32,
    }

    /// The `BPF_PROG_QUERY` part, up to `prog_cnt` (`pad` keeps the struct free of padding).
    #[repr(C)]
    struct ProgQueryAttr {
        target_fd: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        prog_cnt: u32,
        pad: u32,
    }

    /// The attr structs above: `#[repr(C)]`, no padding bytes, the size the kernel is told.
    trait Attr {}
    impl Attr for ProgLoadAttr {}
    impl Attr for ProgAttachAttr {}
    impl Attr for ProgQueryAttr {}

    #[allow(unsafe_code)]
    fn sys_bpf<A: Attr>(cmd: c_int, attr: &mut A) -> Result<c_int, Errno> {
        // SAFETY: `attr` is an exclusively borrowed, fully initialised #[repr(C)] prefix of
        // `union bpf_attr` (the `Attr` types only), and its size is what we pass, so the
        // kernel reads and writes only inside it. The pointers in it (instructions, license,
        // log buffer) are set by the callers to buffers that outlive this call.
        let ret =
            unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, std::mem::size_of::<A>()) };
        if ret < 0 {
            return Err(Errno::last());
        }
        c_int::try_from(ret).map_err(|_| Errno::EOVERFLOW)
    }

    /// BPF_PROG_LOAD: the new program's descriptor.
    #[allow(unsafe_code)]
    fn prog_load(attr: &mut ProgLoadAttr) -> Result<OwnedFd, Errno> {
        let fd = sys_bpf(BPF_PROG_LOAD, attr)?;
        // SAFETY: a successful BPF_PROG_LOAD returns a new descriptor (close-on-exec, as bpf
        // descriptors always are) that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn errno_text(e: Errno) -> String {
        format!("{e:?}: {}", e.desc())
    }

    /// Loads the program; a verifier rejection is retried with the log, which the error quotes.
    pub(super) fn load(insns: &[Insn]) -> Result<OwnedFd, String> {
        let license = c"Apache-2.0";
        let mut name = [0u8; 16];
        name[..13].copy_from_slice(b"allot_devices");
        let insn_cnt = u32::try_from(insns.len()).map_err(|_| "program too long".to_string())?;
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name,
            prog_ifindex: 0,
            expected_attach_type: BPF_CGROUP_DEVICE,
        };
        let first = match prog_load(&mut attr) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        let mut log = vec![0u8; 1 << 16];
        attr.log_level = 1;
        attr.log_size = 1 << 16;
        attr.log_buf = log.as_mut_ptr() as u64;
        match prog_load(&mut attr) {
            // The first failure was transient, not the verifier's.
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                let tail: Vec<&str> = text.lines().rev().take(4).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(format!(
                    "bpf(BPF_PROG_LOAD) of the device program: {}{}",
                    errno_text(first),
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", tail.join(" / "))
                    }
                ))
            }
        }
    }

    /// Attaches a program denying `deny` to the group at `dir`, unless a device program is
    /// attached there already (an earlier `create` of the same member: same list).
    pub(super) fn attach_deny(dir: &Path, deny: &[DeniedDevice]) -> Result<(), String> {
        let group = open_group(dir)?;
        let target_fd = fd_u32(group.as_raw_fd())?;
        if attached_to(dir, target_fd)? > 0 {
            return Ok(());
        }
        let prog = load(&device_program(deny)?)?;
        let mut attach = ProgAttachAttr {
            target_fd,
            attach_bpf_fd: fd_u32(prog.as_raw_fd())?,
            attach_type: BPF_CGROUP_DEVICE,
            attach_flags: BPF_F_ALLOW_MULTI,
        };
        sys_bpf(BPF_PROG_ATTACH, &mut attach)
            .map_err(|e| format!("bpf(BPF_PROG_ATTACH) to {}: {}", dir.display(), errno_text(e)))?;
        // The group holds the program from here on; dropping our fd leaves it attached until
        // the group is removed.
        Ok(())
    }

    fn open_group(dir: &Path) -> Result<File, String> {
        File::open(dir)
            .map_err(|e| format!("opening {} for bpf: {}", dir.display(), super::os_error(&e)))
    }

    /// How many device programs are attached to the group (BPF_PROG_QUERY).
    fn attached_to(dir: &Path, target_fd: u32) -> Result<u32, String> {
        let mut query = ProgQueryAttr {
            target_fd,
            attach_type: BPF_CGROUP_DEVICE,
            query_flags: 0,
            attach_flags: 0,
            prog_ids: 0,
            prog_cnt: 0,
            pad: 0,
        };
        sys_bpf(BPF_PROG_QUERY, &mut query)
            .map_err(|e| format!("bpf(BPF_PROG_QUERY) on {}: {}", dir.display(), errno_text(e)))?;
        Ok(query.prog_cnt)
    }

    #[cfg(test)]
    pub(super) fn attached(dir: &Path) -> Result<u32, String> {
        let group = open_group(dir)?;
        attached_to(dir, fd_u32(group.as_raw_fd())?)
    }

    fn fd_u32(fd: RawFd) -> Result<u32, String> {
        u32::try_from(fd).map_err(|_| format!("bad descriptor {fd}"))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Child, Command, Output, Stdio};
    use std::sync::Mutex;

    use super::bpf::{AND_K, EXIT, Insn, JNE_K, LDX_W, MOV_K, device_program};
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
24 1 253:1 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/1327a224
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";
    const V2_MOUNTINFO: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    fn touch(dir: &Path, files: &[(&str, &str)]) {
        fs::create_dir_all(dir).expect("test directory");
        for (name, text) in files {
            fs::write(dir.join(name), text).expect("test file");
        }
    }

    fn text(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn hybrid_v1_uses_the_v1_controllers_and_writes_the_limits() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let root = tmp.path();
        let cg = Cgroups::from_texts(HYBRID_MOUNTINFO, HYBRID_SELF, root).expect("usable");
        assert_eq!(cg.describe(), "cgroup v1 (cpu, memory, pids, devices)");
        let fsc = root.join("sys/fs/cgroup");
        let cpu = fsc.join("cpu/allot/12.1-m0");
        let memory = fsc.join("memory/process_api/1327a224/allot/12.1-m0");
        let devices = fsc.join("devices/allot/12.1-m0");
        let pids = fsc.join("pids/allot/12.1-m0");
        touch(&cpu, &[("cpu.cfs_period_us", ""), ("cpu.cfs_quota_us", ""), ("cgroup.procs", "")]);
        touch(
            &memory,
            &[
                ("memory.limit_in_bytes", ""),
                ("memory.memsw.limit_in_bytes", ""),
                ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"),
                ("cgroup.procs", ""),
            ],
        );
        touch(&devices, &[("devices.deny", ""), ("cgroup.procs", "")]);
        touch(&pids, &[("pids.max", ""), ("cgroup.procs", "")]);

        let limits = Limits { cpu_millis: 1500, memory_mib: 64, pids_max: 20 };
        let deny = [DeniedDevice { major: 195, minor: 1 }, DeniedDevice { major: 195, minor: 3 }];
        let group = cg.create("12.1-m0", &limits, &deny).expect("create");
        assert_eq!(group.paths(), [cpu.clone(), memory.clone(), devices.clone(), pids.clone()]);
        assert_eq!(text(&cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(text(&cpu.join("cpu.cfs_quota_us")), "150000");
        assert_eq!(text(&memory.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(text(&memory.join("memory.memsw.limit_in_bytes")), "67108864");
        assert_eq!(text(&devices.join("devices.deny")), "c 195:1 rwm\nc 195:3 rwm\n");
        assert_eq!(text(&pids.join("pids.max")), "20");
        assert_eq!(group.open_procs().expect("open").len(), 4);
        assert!(!group.oom_killed());
        fs::write(memory.join("memory.oom_control"), "oom_kill_disable 0\noom_kill 1\n")
            .expect("write");
        assert!(group.oom_killed());
        assert_eq!(cg.existing("12.1-m0"), Some(group));
        assert_eq!(cg.existing("12.1-m1"), None);

        // Reused with no limits; a tiny cpu request still gets the kernel's minimum quota.
        let unlimited = Limits { cpu_millis: 5, memory_mib: 0, pids_max: 0 };
        cg.create("12.1-m0", &unlimited, &[]).expect("create again");
        assert_eq!(text(&cpu.join("cpu.cfs_quota_us")), "1000");
        assert_eq!(text(&memory.join("memory.limit_in_bytes")), "-1");
        assert_eq!(text(&memory.join("memory.memsw.limit_in_bytes")), "-1");
        assert_eq!(text(&pids.join("pids.max")), "max");
    }

    #[test]
    fn errors_name_the_file_and_errno_and_fresh_groups_are_removed() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let cg = Cgroups::from_texts(HYBRID_MOUNTINFO, HYBRID_SELF, tmp.path()).expect("usable");
        // The mount points exist but are plain directories: no control files appear.
        fs::create_dir_all(tmp.path().join("sys/fs/cgroup/cpu")).expect("dir");
        let limits = Limits { cpu_millis: 1000, memory_mib: 0, pids_max: 0 };
        let err = cg.create("m", &limits, &[]).expect_err("no control files");
        assert!(err.contains("cpu/allot/m/cpu.cfs_period_us"), "{err}");
        assert!(err.contains("ENOENT: No such file or directory"), "{err}");
        assert!(!tmp.path().join("sys/fs/cgroup/cpu/allot/m").exists());
        assert!(cg.create("a/b", &limits, &[]).is_err());
    }

    #[test]
    fn pure_v2_enables_the_controllers_and_writes_the_limits() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let root = tmp.path();
        let own = root.join("sys/fs/cgroup/system.slice/allot.service");
        let member = own.join("allot/12.1-m0");
        touch(
            &own,
            &[
                ("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n"),
                ("cgroup.subtree_control", ""),
            ],
        );
        touch(&own.join("allot"), &[("cgroup.subtree_control", "")]);
        touch(
            &member,
            &[
                ("cpu.max", ""),
                ("memory.max", ""),
                ("memory.swap.max", ""),
                ("pids.max", ""),
                ("memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\noom_group_kill 0\n"),
                ("cgroup.procs", ""),
            ],
        );
        let cg = Cgroups::from_texts(V2_MOUNTINFO, "0::/system.slice/allot.service\n", root)
            .expect("usable");
        assert_eq!(
            cg.describe(),
            format!(
                "cgroup v2 at {} (cpu, memory, pids; devices by eBPF)",
                root.join("sys/fs/cgroup").display()
            )
        );
        // After a restart the daemon is in its leaf; the layout is the same.
        let restarted = Cgroups::from_texts(
            V2_MOUNTINFO,
            "0::/system.slice/allot.service/allot-daemon\n",
            root,
        )
        .expect("usable");
        assert_eq!(restarted, cg);

        let limits = Limits { cpu_millis: 1500, memory_mib: 2048, pids_max: 64 };
        let group = cg.create("12.1-m0", &limits, &[]).expect("create");
        assert_eq!(group.paths(), std::slice::from_ref(&member));
        assert_eq!(text(&own.join("cgroup.subtree_control")), "+cpu +memory +pids");
        assert_eq!(text(&own.join("allot/cgroup.subtree_control")), "+cpu +memory +pids");
        assert_eq!(text(&member.join("cpu.max")), "150000 100000");
        assert_eq!(text(&member.join("memory.max")), "2147483648");
        assert_eq!(text(&member.join("memory.swap.max")), "0");
        assert_eq!(text(&member.join("pids.max")), "64");
        assert!(!group.oom_killed(), "oom_group_kill and oom are not oom_kill");
        assert_eq!(group.open_procs().expect("open").len(), 1);

        // Reuse: the controllers are on already (nothing rewritten), the limits lifted.
        fs::write(own.join("cgroup.subtree_control"), "cpu memory pids\n").expect("write");
        cg.create("12.1-m0", &Limits::default(), &[]).expect("create again");
        assert_eq!(text(&own.join("cgroup.subtree_control")), "cpu memory pids\n");
        assert_eq!(text(&member.join("cpu.max")), "max 100000");
        assert_eq!(text(&member.join("memory.max")), "max");
        assert_eq!(text(&member.join("memory.swap.max")), "max");
        assert_eq!(text(&member.join("pids.max")), "max");
    }

    #[test]
    fn v2_without_a_controller_says_so_and_skips_it() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let root = tmp.path();
        let own = root.join("sys/fs/cgroup/user.slice");
        touch(&own, &[("cgroup.controllers", "memory pids\n"), ("cgroup.subtree_control", "")]);
        touch(&own.join("allot"), &[("cgroup.subtree_control", "")]);
        touch(&own.join("allot/x"), &[("memory.max", ""), ("pids.max", "")]);
        let cg = Cgroups::from_texts(V2_MOUNTINFO, "0::/user.slice\n", root).expect("usable");
        assert_eq!(
            cg.describe(),
            format!(
                "cgroup v2 at {} (memory, pids; devices by eBPF); not enforced: cpu",
                root.join("sys/fs/cgroup").display()
            )
        );
        let limits = Limits { cpu_millis: 2000, memory_mib: 1, pids_max: 5 };
        cg.create("x", &limits, &[]).expect("create without cpu.max");
        assert_eq!(text(&own.join("cgroup.subtree_control")), "+memory +pids");
        assert_eq!(text(&own.join("allot/x/memory.max")), "1048576");
        assert!(!own.join("allot/x/cpu.max").exists());
    }

    #[test]
    fn co_mounted_and_nested_v1_paths() {
        let mountinfo = "\
25 21 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:7 - cgroup cgroup rw,cpu,cpuacct
26 21 0:23 / /sys/fs/cgroup/memory rw,nosuid shared:8 - cgroup cgroup rw,memory
";
        let self_cgroup = "5:cpu,cpuacct:/user.slice\n4:memory:/user.slice/a b\n";
        let root = Path::new("/fake");
        let cg = Cgroups::from_texts(mountinfo, self_cgroup, root).expect("usable");
        assert_eq!(
            cg.describe(),
            "cgroup v1 (cpu, memory); not enforced: pids, devices (no v1 devices controller and \
             no cgroup2 group)"
        );
        let group = cg.member_group("7.0-m1");
        assert_eq!(
            group.paths(),
            [
                PathBuf::from("/fake/sys/fs/cgroup/cpu,cpuacct/user.slice/allot/7.0-m1"),
                PathBuf::from("/fake/sys/fs/cgroup/memory/user.slice/a b/allot/7.0-m1"),
            ]
        );
        assert_eq!(
            group.oom_events,
            Some(PathBuf::from(
                "/fake/sys/fs/cgroup/memory/user.slice/a b/allot/7.0-m1/memory.oom_control"
            ))
        );
        assert!(cg.existing("7.0-m1").is_none());
    }

    #[test]
    fn hybrid_without_v1_devices_uses_ebpf_on_the_unified_mount() {
        let mountinfo = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        let self_cgroup = "3:pids:/\n2:memory:/\n1:cpu,cpuacct:/\n0::/\n";
        let tmp = tempfile::tempdir().expect("temp dir");
        let unified = tmp.path().join("sys/fs/cgroup/unified");
        touch(&unified, &[("cgroup.controllers", "hugetlb\n")]);
        let cg = Cgroups::from_texts(mountinfo, self_cgroup, tmp.path()).expect("usable");
        assert_eq!(
            cg.describe(),
            format!(
                "cgroup v1 (cpu, memory, pids) + cgroup v2 at {} (devices by eBPF)",
                unified.display()
            )
        );
        let group = cg.member_group("m");
        assert_eq!(group.paths().last(), Some(&unified.join("allot/m")));
        assert_eq!(group.paths().len(), 4);
        assert!(group.oom_events.is_some_and(|f| f.ends_with("memory/allot/m/memory.oom_control")));
    }

    #[test]
    fn mountinfo_variants() {
        // A container's view: the mount's root is the container's group.
        let mountinfo = "\
40 30 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid master:14 - cgroup cgroup rw,memory
41 30 0:33 /docker/abc /sys/fs/cgroup/my\\040pids rw shared:3 shared:5 - cgroup cgroup rw,pids
";
        let cg = Cgroups::from_texts(
            mountinfo,
            "4:memory:/docker/abc/inner\n3:pids:/docker/abc\n",
            Path::new("/"),
        )
        .expect("usable");
        assert_eq!(
            cg.member_group("m").paths(),
            [
                PathBuf::from("/sys/fs/cgroup/memory/inner/allot/m"),
                PathBuf::from("/sys/fs/cgroup/my pids/allot/m"),
            ]
        );
        // A group outside the mount's root cannot be reached.
        let err = Cgroups::from_texts(mountinfo, "4:memory:/other\n", Path::new("/"))
            .expect_err("unreachable");
        assert!(err.contains("outside the mount"), "{err}");
        assert!(err.contains("pids is mounted but not in /proc/self/cgroup"), "{err}");
        let err =
            Cgroups::from_texts("22 1 253:1 / / rw - ext4 /dev/vda rw\n", "0::/\n", Path::new("/"))
                .expect_err("no cgroups");
        assert!(err.starts_with("no cgroup hierarchy"), "{err}");
        assert_eq!(unescape("a\\134b\\011c\\0"), "a\\b\tc\\0");
    }

    /// The verdict of the device program, by a tiny interpreter of the opcodes it uses.
    fn verdict(program: &[Insn], access_type: u32, major: u32, minor: u32) -> u64 {
        let ctx = [access_type, major, minor];
        let mut reg = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let insn = program[pc];
            pc += 1;
            let dst = usize::from(insn.dst());
            let imm = i64::from(insn.imm) as u64;
            match insn.code {
                LDX_W => {
                    assert_eq!(insn.src(), 1, "loads from the context");
                    reg[dst] = u64::from(ctx[usize::try_from(insn.off / 4).expect("offset")]);
                }
                AND_K => reg[dst] &= imm,
                MOV_K => reg[dst] = imm,
                JNE_K => {
                    if reg[dst] != imm {
                        pc = pc.checked_add_signed(isize::from(insn.off)).expect("jump");
                    }
                }
                EXIT => return reg[0],
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn device_program_denies_exactly_the_listed_char_devices() {
        let deny = [DeniedDevice { major: 195, minor: 1 }, DeniedDevice { major: 510, minor: 3 }];
        let p = device_program(&deny).expect("program");
        assert_eq!(p.len(), 5 + 4 * 2 + 2);
        const CHAR: u32 = 2;
        const BLOCK: u32 = 1;
        const READ_WRITE: u32 = (2 | 4) << 16;
        assert_eq!(verdict(&p, CHAR | READ_WRITE, 195, 1), 0);
        assert_eq!(verdict(&p, CHAR, 510, 3), 0);
        assert_eq!(verdict(&p, CHAR, 195, 0), 1);
        assert_eq!(verdict(&p, CHAR, 195, 3), 1);
        assert_eq!(verdict(&p, CHAR, 510, 1), 1);
        assert_eq!(verdict(&p, BLOCK | READ_WRITE, 195, 1), 1);
        let none = device_program(&[]).expect("program");
        assert_eq!(verdict(&none, CHAR, 195, 1), 1);
        assert!(device_program(&[DeniedDevice { major: u32::MAX, minor: 0 }]).is_err());
    }

    // ---- Against the real kernel: ALLOT_CGROUP_TESTS=1, as root. ----

    /// The real tests share the `allot` parents and remove them at the end: one at a time.
    static REAL: Mutex<()> = Mutex::new(());

    #[allow(clippy::print_stderr)] // the reason a test did nothing belongs in its output
    fn real_tests(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
        if std::env::var("ALLOT_CGROUP_TESTS").as_deref() != Ok("1")
            || !nix::unistd::Uid::effective().is_root()
        {
            eprintln!("{test}: skipped (needs ALLOT_CGROUP_TESTS=1 and root)");
            return None;
        }
        Some(REAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Removes the group (and the `allot` parents, when empty) even when the test fails.
    struct Cleanup(MemberGroup);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = self.0.remove();
            for dir in self.0.paths() {
                if let Some(parent) = dir.parent() {
                    let _ = fs::remove_dir(parent);
                }
            }
        }
    }

    fn name(test: &str) -> String {
        format!("test-{}-{test}", std::process::id())
    }

    /// `sh -c SCRIPT sh ARGS…`, moved into `group` before it execs, as the backend does.
    #[allow(unsafe_code)]
    fn spawn_in(group: Option<&MemberGroup>, script: &str, args: &[&str]) -> Child {
        let procs = group.map(|g| g.open_procs().expect("open cgroup.procs")).unwrap_or_default();
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).arg("sh").args(args);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // SAFETY: the closure only write(2)s to descriptors opened before the fork, which is
        // async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(move || enter(&procs));
        }
        cmd.spawn().expect("spawn sh")
    }

    fn run_in(group: Option<&MemberGroup>, script: &str, args: &[&str]) -> Output {
        spawn_in(group, script, args).wait_with_output().expect("wait for sh")
    }

    fn stderr(out: &Output) -> String {
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// The group's file `name`, in whichever hierarchy has it.
    fn control_file(group: &MemberGroup, name: &str) -> PathBuf {
        group
            .paths()
            .iter()
            .map(|d| d.join(name))
            .find(|f| f.exists())
            .unwrap_or_else(|| panic!("no {name} in {:?}", group.paths()))
    }

    #[test]
    fn real_memory_limit_oom_kills_the_member() {
        let Some(_lock) = real_tests("real_memory_limit_oom_kills_the_member") else { return };
        let cg = Cgroups::detect().expect("cgroups on this host");
        let limits = Limits { cpu_millis: 0, memory_mib: 64, pids_max: 0 };
        let group = Cleanup(cg.create(&name("oom"), &limits, &[]).expect("create"));
        // The shell itself holds ~200 MiB in a variable, so it is the one the OOM killer picks.
        let out =
            run_in(Some(&group.0), "x=$(head -c 200M /dev/zero | tr '\\0' a); echo ${#x}", &[]);
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
        assert!(group.0.oom_killed(), "oom_kill counted");
        group.0.remove().expect("remove");
    }

    fn device_nodes() -> (tempfile::TempDir, String, String) {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        let tmp = tempfile::tempdir().expect("temp dir");
        let node = |minor| {
            let path = tmp.path().join(format!("nvidia{minor}"));
            mknod(&path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(195, minor))
                .expect("mknod");
            path.display().to_string()
        };
        let (gpu0, gpu1) = (node(0), node(1));
        (tmp, gpu0, gpu1)
    }

    /// Opening `gpu1` in the group fails with EPERM; `gpu0` fares as outside: ENXIO without
    /// a driver for major 195 (this host), success with one. Outside, neither is EPERM.
    #[allow(clippy::print_stderr)] // what the kernel answered, for --nocapture runs
    fn check_device_denial(group: &MemberGroup, gpu0: &str, gpu1: &str) {
        const OPEN: &str = "exec 3<\"$1\"";
        const EPERM: &str = "Operation not permitted";
        let outside = run_in(None, OPEN, &[gpu1]);
        assert!(!stderr(&outside).contains(EPERM), "outside the group: {outside:?}");
        let denied = run_in(Some(group), OPEN, &[gpu1]);
        assert!(stderr(&denied).contains(EPERM), "denied: {denied:?}");
        let allowed = run_in(Some(group), OPEN, &[gpu0]);
        let allowed_outside = run_in(None, OPEN, &[gpu0]);
        assert_eq!(stderr(&allowed), stderr(&allowed_outside), "allowed: {allowed:?}");
        assert_eq!(allowed.status.code(), allowed_outside.status.code());
        for (what, out) in [("outside", &outside), ("denied", &denied), ("allowed", &allowed)] {
            eprintln!("{what}: {}", stderr(out).trim());
        }
    }

    #[test]
    fn real_devices_deny_a_gpu_node() {
        let Some(_lock) = real_tests("real_devices_deny_a_gpu_node") else { return };
        let cg = Cgroups::detect().expect("cgroups on this host");
        assert!(!matches!(cg.devices, Devices::Unavailable(_)), "{}", cg.describe());
        let (_tmp, gpu0, gpu1) = device_nodes();
        let deny = [DeniedDevice { major: 195, minor: 1 }];
        let group = Cleanup(cg.create(&name("dev"), &Limits::default(), &deny).expect("create"));
        check_device_denial(&group.0, &gpu0, &gpu1);
    }

    /// Cgroups on this host's cgroup2 mount alone, whatever the v1 controllers.
    fn v2_only() -> Option<Cgroups> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let mounts: String = mountinfo
            .lines()
            .filter(|l| l.contains(" - cgroup2 "))
            .map(|l| format!("{l}\n"))
            .collect();
        let own = fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
        let own: String = own.lines().filter(|l| l.starts_with("0::")).collect();
        if mounts.is_empty() || own.is_empty() {
            return None;
        }
        Cgroups::from_texts(&mounts, &own, Path::new("/")).ok()
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it did nothing
    fn real_v2_ebpf_device_program() {
        let Some(_lock) = real_tests("real_v2_ebpf_device_program") else { return };
        let Some(cg) = v2_only() else {
            eprintln!("real_v2_ebpf_device_program: skipped (no cgroup2 mount)");
            return;
        };
        assert_eq!(cg.devices, Devices::Bpf, "{}", cg.describe());
        let (_tmp, gpu0, gpu1) = device_nodes();
        let deny = [DeniedDevice { major: 195, minor: 1 }, DeniedDevice { major: 195, minor: 7 }];
        let name = name("bpf");
        let group = Cleanup(cg.create(&name, &Limits::default(), &deny).expect("create"));
        // Idempotent: the second create finds the program attached and adds none.
        cg.create(&name, &Limits::default(), &deny).expect("create again");
        let dir = group.0.paths().last().expect("the v2 group");
        assert_eq!(super::bpf::attached(dir), Ok(1));
        // A program the verifier rejects (a read past the context) reports its log.
        let bad = [Insn::new(LDX_W, 0, 1, 64, 0), Insn::new(EXIT, 0, 0, 0, 0)];
        let err = super::bpf::load(&bad).expect_err("rejected");
        assert!(err.contains("EACCES") && err.contains("invalid bpf_context access"), "{err}");
        check_device_denial(&group.0, &gpu0, &gpu1);
    }

    #[test]
    fn real_cpu_quota_and_pids_limit() {
        let Some(_lock) = real_tests("real_cpu_quota_and_pids_limit") else { return };
        let cg = Cgroups::detect().expect("cgroups on this host");
        let name = name("cpu");
        let limits = Limits { cpu_millis: 1500, memory_mib: 0, pids_max: 20 };
        let group = Cleanup(cg.create(&name, &limits, &[]).expect("create"));
        let g = &group.0;
        let cpu = |file| text(&control_file(g, file)).trim().to_string();
        if g.paths().iter().any(|d| d.join("cpu.max").exists()) {
            assert_eq!(cpu("cpu.max"), "150000 100000");
        } else {
            assert_eq!(cpu("cpu.cfs_period_us"), "100000");
            assert_eq!(cpu("cpu.cfs_quota_us"), "150000");
        }
        assert_eq!(text(&control_file(g, "pids.max")).trim(), "20");
        let out = run_in(Some(g), "for i in $(seq 100); do sleep 2 & done; wait", &[]);
        assert!(!out.status.success() && stderr(&out).contains("fork"), "{out:?}");
        // Reused with a tiny request: the kernel's minimum quota.
        cg.create(&name, &Limits { cpu_millis: 5, memory_mib: 0, pids_max: 20 }, &[])
            .expect("create again");
        if g.paths().iter().any(|d| d.join("cpu.max").exists()) {
            assert_eq!(cpu("cpu.max"), "1000 100000");
        } else {
            assert_eq!(cpu("cpu.cfs_quota_us"), "1000");
        }
    }

    #[test]
    fn real_remove_kills_what_remains() {
        let Some(_lock) = real_tests("real_remove_kills_what_remains") else { return };
        let cg = Cgroups::detect().expect("cgroups on this host");
        let name = name("rm");
        let group = Cleanup(cg.create(&name, &Limits::default(), &[]).expect("create"));
        let mut child = spawn_in(Some(&group.0), "exec sleep 1000", &[]);
        let pid = child.id().to_string();
        let procs = text(&control_file(&group.0, "cgroup.procs"));
        assert!(procs.split_whitespace().any(|p| p == pid), "{pid} in {procs}");
        assert_eq!(cg.existing(&name).as_ref(), Some(&group.0));
        group.0.remove().expect("remove");
        for dir in group.0.paths() {
            assert!(!dir.exists(), "{} left", dir.display());
        }
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(cg.existing(&name).is_none());
        group.0.remove().expect("remove again: already gone");
    }
}
