//! The files a workload itself writes — its logs, heartbeat and checkpoint marker — and who may
//! reach them.
//!
//! They live outside the daemon's private data directory, under the workload directory
//! (`allot serve --workload-dir`):
//!
//! ```text
//! ROOT/                     daemon's, 0711 with workloads of several accounts, else 0700
//!   <id>/                   daemon's, 0711: nobody else can add, remove or swap entries
//!     heartbeat             the workload's account, 0600
//!     checkpoint            the workload's account, 0600
//!     logs/                 daemon's, 0711
//!       <attempt>/          the workload's account, 0700: member-N.log inside
//! ```
//!
//! Every directory the daemon creates or changes belongs to the daemon, so a workload cannot
//! plant a link there that makes the daemon write, chown or read something else; what the
//! workload owns (its attempt's log directory) the daemon only reads through
//! [`open_workload_file`], which refuses links.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::Launch;
use crate::account::Account;

/// The launch environment variables naming files the workload writes besides its logs.
pub const PROBE_FILE_ENVS: [&str; 2] = ["ALLOT_HEARTBEAT_FILE", "ALLOT_CHECKPOINT_FILE"];

/// Where one workload's files are, under the workload directory `root`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadFiles {
    pub dir: PathBuf,
}

impl WorkloadFiles {
    pub fn new(root: &Path, workload: u64) -> WorkloadFiles {
        WorkloadFiles { dir: root.join(workload.to_string()) }
    }

    /// The workload touches it to say it is busy (`ALLOT_HEARTBEAT_FILE`).
    pub fn heartbeat(&self) -> PathBuf {
        self.dir.join("heartbeat")
    }

    /// The workload touches it after each checkpoint (`ALLOT_CHECKPOINT_FILE`).
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }

    /// The log directory of one attempt (`Launch::log_dir`).
    pub fn log_dir(&self, attempt: u32) -> PathBuf {
        self.dir.join("logs").join(attempt.to_string())
    }

    /// The log of one member of one attempt.
    pub fn log_file(&self, attempt: u32, member: usize) -> PathBuf {
        self.log_dir(attempt).join(format!("member-{member}.log"))
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set mode {mode:o} on {}: {e}", path.display()))
}

/// Creates the workload directory `root` (if missing) with the mode its use needs: `0711` when
/// workloads run as other accounts (they must pass through to their own files, never list),
/// else `0700`. An existing one is set to that mode.
pub fn prepare_root(root: &Path, shared: bool) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| format!("cannot create the workload directory {}: {e}", root.display()))?;
    set_mode(root, if shared { 0o711 } else { 0o700 })
}

/// Makes the directories and probe files of `launch` (its log directory and the files named by
/// [`PROBE_FILE_ENVS`]) and gives them to `owner`, who must be able to reach them: a probe file
/// made here is dated at the epoch, not a heartbeat or a checkpoint until the workload touches
/// it. `owner` `None`: they stay the daemon's (a single-user daemon).
pub fn prepare(launch: &Launch, owner: Option<&Account>) -> Result<(), String> {
    let log_dir = &launch.log_dir;
    // The daemon's directories between the root and the attempt's: `<id>/` and `<id>/logs/`.
    let mut missing: Vec<&Path> = log_dir.ancestors().skip(1).take_while(|d| !d.exists()).collect();
    missing.reverse();
    for dir in missing {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        set_mode(dir, 0o711)?;
    }
    if let Some(owner) = owner {
        check_reachable(log_dir, owner)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(log_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create log directory {}: {e}", log_dir.display())),
    }
    give(log_dir, owner, 0o700)?;
    for key in PROBE_FILE_ENVS {
        let Some(path) = launch.env.get(key).map(Path::new) else { continue };
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
            Ok(file) => file
                .set_modified(std::time::SystemTime::UNIX_EPOCH)
                .map_err(|e| format!("cannot date {} ({key}): {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {} ({key}): {e}", path.display())),
        }
        give(path, owner, 0o600)?;
    }
    Ok(())
}

/// Sets the mode of `path` and, with an owner, its owner (not following a link).
fn give(path: &Path, owner: Option<&Account>, mode: u32) -> Result<(), String> {
    if let Some(owner) = owner {
        std::os::unix::fs::lchown(path, Some(owner.uid), Some(owner.gid)).map_err(|e| {
            format!("cannot hand {} to {} (uid {}): {e}", path.display(), owner.name, owner.uid)
        })?;
    }
    set_mode(path, mode)
}

/// The workload's account must pass every directory above its log directory.
fn check_reachable(log_dir: &Path, owner: &Account) -> Result<(), String> {
    for dir in log_dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else { continue };
        let mode = meta.mode();
        let passes = mode & 0o001 != 0
            || (meta.uid() == owner.uid && mode & 0o100 != 0)
            || (owner.groups.contains(&meta.gid()) && mode & 0o010 != 0);
        if !passes {
            return Err(format!(
                "{} (uid {}) cannot reach its files: {} is mode {:o}; let others pass \
                 (chmod o+x {}) or pass allot serve a --workload-dir whose parents they can",
                owner.name,
                owner.uid,
                dir.display(),
                mode & 0o7777,
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Opens `relative` under `trusted` (a directory the daemon owns) for the daemon to read a
/// file a workload wrote: refused if it is reached through a link below `trusted` (the workload
/// owns its log directory and could point it at another's files or the daemon's), or is not a
/// regular file owned by `owner_uid` (when given).
pub fn open_workload_file(
    trusted: &Path,
    relative: &Path,
    owner_uid: Option<u32>,
) -> Result<File, String> {
    let path = trusted.join(relative);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if let Some(uid) = owner_uid
        && meta.uid() != uid
    {
        return Err(format!(
            "{} belongs to uid {}, not the workload's account (uid {uid}): not shown",
            path.display(),
            meta.uid()
        ));
    }
    // O_NOFOLLOW covers the last component only: a linked directory below `trusted` shows in
    // where the open file really is.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    if let (Ok(real), Ok(base)) =
        (std::fs::read_link(format!("/proc/self/fd/{fd}")), std::fs::canonicalize(trusted))
        && real != base.join(relative)
    {
        return Err(format!(
            "{} leads through a link (to {}): not shown",
            path.display(),
            real.display()
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_each_workload_in_its_own_directory() {
        let files = WorkloadFiles::new(Path::new("/w"), 12);
        assert_eq!(files.heartbeat(), Path::new("/w/12/heartbeat"));
        assert_eq!(files.checkpoint(), Path::new("/w/12/checkpoint"));
        assert_eq!(files.log_file(3, 1), Path::new("/w/12/logs/3/member-1.log"));
    }

    #[test]
    fn a_linked_log_is_not_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let secret = root.join("secret");
        std::fs::write(&secret, "the daemon's").expect("write");
        let logs = root.join("logs");
        std::fs::create_dir(&logs).expect("mkdir");
        std::os::unix::fs::symlink(&secret, logs.join("member-0.log")).expect("link");
        let err =
            open_workload_file(&root, Path::new("logs/member-0.log"), None).expect_err("refused");
        assert!(err.contains("member-0.log"), "{err}");
        // A linked directory on the way.
        let other = root.join("other");
        std::fs::create_dir(&other).expect("mkdir");
        std::fs::write(other.join("member-0.log"), "another workload's").expect("write");
        std::os::unix::fs::symlink(&other, root.join("attempt")).expect("link");
        let err = open_workload_file(&root, Path::new("attempt/member-0.log"), None)
            .expect_err("refused");
        assert!(err.contains("leads through a link"), "{err}");
        // The real one reads, also when the trusted part is reached through a link.
        assert!(open_workload_file(&root, Path::new("other/member-0.log"), None).is_ok());
        std::os::unix::fs::symlink(&root, root.join("root-link")).expect("link");
        assert!(
            open_workload_file(&root.join("root-link"), Path::new("other/member-0.log"), None)
                .is_ok()
        );
        // Another account's file is not shown as this one's.
        let uid = std::fs::metadata(&secret).expect("meta").uid();
        let err =
            open_workload_file(&root, Path::new("secret"), Some(uid + 1)).expect_err("refused");
        assert!(err.contains("not the workload's account"), "{err}");
    }
}
