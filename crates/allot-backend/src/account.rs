//! The Unix account a workload runs as, and the minimal environment it starts with.
//!
//! A shared server's daemon runs as root and starts each workload as the account named like the
//! allot user who submitted it (the local backend by `setuid`, Slurm by `sbatch --uid`). Root is
//! never such an account: a workload that could run as root could read the daemon's database
//! and become any user.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;

/// The launch environment variable naming the allot user who submitted the workload.
pub const USER_ENV: &str = "ALLOT_USER";

/// `PATH` of a workload whose submission declares none (the daemon's own is never passed on).
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// `LANG` of a workload whose submission declares none.
pub const DEFAULT_LANG: &str = "C.UTF-8";

/// A Unix account, as NSS (`getent passwd`, `id`) knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    /// Supplementary groups (e.g. `video`, `render` for GPU device nodes), primary included.
    pub groups: Vec<u32>,
}

impl Account {
    /// The account of the allot user `user` for a workload to run as. Refused, with what to do
    /// (`fix`, the backend's alternative): no such account, or root.
    pub fn of_user(user: &str, fix: &str) -> Result<Account, String> {
        if user.is_empty() {
            return Err(format!("the workload names no user, so it has no Unix account: {fix}"));
        }
        let found = nix::unistd::User::from_name(user)
            .map_err(|e| format!("cannot look up the Unix account {user:?}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "the allot user {user:?} has no Unix account on this host (getent passwd \
                     {user} finds none), and workloads run as their submitter's account: create \
                     it (useradd {user}), or {fix}"
                )
            })?;
        if found.uid.is_root() {
            return Err(format!(
                "refusing to run a workload of {user:?} as root (uid 0): a workload must never \
                 run with the daemon's privileges; submit as another user, or {fix}"
            ));
        }
        Ok(Self::from_user(&found))
    }

    /// The account this process runs as (the daemon's own, for a single-user daemon).
    pub fn current() -> Result<Account, String> {
        let uid = nix::unistd::geteuid();
        let found = nix::unistd::User::from_uid(uid)
            .map_err(|e| format!("cannot look up uid {uid}: {e}"))?
            .ok_or_else(|| format!("uid {uid} has no entry in the account database"))?;
        Ok(Self::from_user(&found))
    }

    fn from_user(user: &nix::unistd::User) -> Account {
        let gid = user.gid;
        // Without its groups a member could not open the GPU device nodes its user may.
        let groups = CString::new(user.name.as_str())
            .ok()
            .and_then(|name| nix::unistd::getgrouplist(&name, gid).ok())
            .unwrap_or_else(|| vec![gid]);
        Account {
            name: user.name.clone(),
            uid: user.uid.as_raw(),
            gid: gid.as_raw(),
            home: user.dir.clone(),
            groups: groups.into_iter().map(nix::unistd::Gid::as_raw).collect(),
        }
    }

    /// Whether this is the account the daemon runs as.
    pub fn is_current(&self) -> bool {
        self.uid == nix::unistd::geteuid().as_raw()
    }
}

/// Whether this process runs as root (and so can start workloads as other accounts).
pub fn daemon_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The environment a workload starts with, before the device variables: the account's
/// identity and a known `PATH` and `LANG`, then `declared` (the launch's variables, which may
/// set `PATH` and `LANG`); never the daemon's variables (its token, its credentials, its `PATH`).
pub fn base_env(
    account: &Account,
    declared: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_string(), DEFAULT_PATH.to_string()),
        ("LANG".to_string(), DEFAULT_LANG.to_string()),
        ("HOME".to_string(), account.home.display().to_string()),
        ("USER".to_string(), account.name.clone()),
        ("LOGNAME".to_string(), account.name.clone()),
    ]);
    env.extend(declared.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        Account {
            name: "alice".into(),
            uid: 1001,
            gid: 1001,
            home: PathBuf::from("/home/alice"),
            groups: vec![1001, 44],
        }
    }

    #[test]
    fn the_base_environment_names_the_account_and_nothing_of_the_daemon() {
        let env = base_env(&account(), &BTreeMap::new());
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(keys, ["HOME", "LANG", "LOGNAME", "PATH", "USER"]);
        assert_eq!(env["PATH"], DEFAULT_PATH);
        assert_eq!(env["HOME"], "/home/alice");
        assert_eq!(env["USER"], "alice");
    }

    #[test]
    fn a_submission_may_set_path_and_lang() {
        let declared = BTreeMap::from([
            ("PATH".to_string(), "/opt/conda/bin:/usr/bin".to_string()),
            ("LANG".to_string(), "de_DE.UTF-8".to_string()),
        ]);
        let env = base_env(&account(), &declared);
        assert_eq!(env["PATH"], "/opt/conda/bin:/usr/bin");
        assert_eq!(env["LANG"], "de_DE.UTF-8");
    }

    #[test]
    fn root_and_unknown_accounts_are_refused_with_the_fix() {
        let root = Account::of_user("root", "start allot with --single-user").expect_err("refused");
        assert!(root.contains("as root") && root.contains("--single-user"), "{root}");
        let unknown = Account::of_user("no-such-allot-user", "start allot with --single-user")
            .expect_err("refused");
        assert!(unknown.contains("useradd no-such-allot-user"), "{unknown}");
        let empty = Account::of_user("", "fix").expect_err("refused");
        assert!(empty.contains("names no user"), "{empty}");
    }
}
