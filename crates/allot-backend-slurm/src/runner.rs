//! The one way this crate runs Slurm's commands: an argument vector (never a shell string), a
//! timeout, stdout and stderr captured, and errors that name the command and the fix.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// The Slurm client commands the backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tool {
    Sbatch,
    Scontrol,
    Scancel,
    Squeue,
    Sinfo,
}

impl Tool {
    pub fn program_name(self) -> &'static str {
        match self {
            Tool::Sbatch => "sbatch",
            Tool::Scontrol => "scontrol",
            Tool::Scancel => "scancel",
            Tool::Squeue => "squeue",
            Tool::Sinfo => "sinfo",
        }
    }
}

/// How commands are found and run.
#[derive(Clone, Debug)]
pub struct Runner {
    /// Directory holding the Slurm binaries; `None` searches `PATH`.
    pub bin_dir: Option<PathBuf>,
    /// Per-tool overrides (a wrapper script, a site's own path); win over `bin_dir`.
    pub programs: BTreeMap<Tool, PathBuf>,
    /// `SLURM_CONF` for every command (a cluster whose slurm.conf is not in /etc/slurm).
    pub slurm_conf: Option<PathBuf>,
    /// Longest a command may run before it is killed and reported.
    pub timeout: Duration,
}

/// A command's captured result.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    /// The command line, for the message.
    pub command: String,
    pub stderr: String,
    pub message: String,
    /// It gave no answer within the runner's timeout (and was killed).
    pub timed_out: bool,
}

/// What Slurm's client tools print when slurmctld does not answer (down, restarting, or too
/// busy): the failure is the controller's passing state, not the request's.
const UNREACHABLE_PHRASES: [&str; 6] = [
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Communication connection failure",
    "slurmctld is not responding",
];

impl CommandError {
    /// Whether the command failed because the controller could not be reached (or timed out),
    /// rather than because Slurm refused what it was asked.
    pub fn is_unreachable(&self) -> bool {
        self.timed_out
            || UNREACHABLE_PHRASES
                .iter()
                .any(|p| self.stderr.contains(p) || self.message.contains(p))
    }
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.command, self.message)?;
        if !self.stderr.trim().is_empty() {
            write!(f, "; stderr: {}", self.stderr.trim())?;
        }
        Ok(())
    }
}

impl Runner {
    pub fn new() -> Self {
        Runner {
            bin_dir: None,
            programs: BTreeMap::new(),
            slurm_conf: None,
            timeout: Duration::from_secs(30),
        }
    }

    pub fn program(&self, tool: Tool) -> PathBuf {
        if let Some(p) = self.programs.get(&tool) {
            return p.clone();
        }
        match &self.bin_dir {
            Some(dir) => dir.join(tool.program_name()),
            None => PathBuf::from(tool.program_name()),
        }
    }

    /// Runs `tool args…` with `env` added to this process's environment; a non-zero exit is an
    /// error carrying stderr.
    pub fn run(
        &self,
        tool: Tool,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<Output, CommandError> {
        self.run_with(tool, args, env, false)
    }

    /// [`Runner::run`] with `env` (and `SLURM_CONF`) as the whole environment: for `sbatch`,
    /// which hands its environment to the job.
    pub fn run_clean(
        &self,
        tool: Tool,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<Output, CommandError> {
        self.run_with(tool, args, env, true)
    }

    fn run_with(
        &self,
        tool: Tool,
        args: &[String],
        env: &BTreeMap<String, String>,
        clean: bool,
    ) -> Result<Output, CommandError> {
        let program = self.program(tool);
        let shown = std::iter::once(program.display().to_string())
            .chain(args.iter().map(|a| shown_arg(a)))
            .collect::<Vec<_>>()
            .join(" ");
        let fail = |message: String, stderr: String| CommandError {
            command: shown.clone(),
            stderr,
            message,
            timed_out: false,
        };
        let mut command = Command::new(&program);
        if clean {
            command.env_clear();
        }
        command.args(args).envs(env).stdin(Stdio::null()).stdout(Stdio::piped());
        command.stderr(Stdio::piped());
        if let Some(conf) = &self.slurm_conf {
            command.env("SLURM_CONF", conf);
        }
        let mut child = command.spawn().map_err(|e| {
            fail(
                format!(
                    "cannot start it ({e}); install the Slurm client (Debian: slurm-client) or \
                     set the backend's bin_dir to where {} is",
                    tool.program_name()
                ),
                String::new(),
            )
        })?;
        // Readers drain the pipes while we wait, so a large `squeue --json` cannot block.
        let out_reader = child.stdout.take().map(reader_thread);
        let err_reader = child.stderr.take().map(reader_thread);
        let status = match child.wait_timeout(self.timeout) {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommandError {
                    timed_out: true,
                    ..fail(
                        format!(
                            "no answer within {:?}; is slurmctld up (`scontrol ping`)?",
                            self.timeout
                        ),
                        String::new(),
                    )
                });
            }
            Err(e) => return Err(fail(format!("cannot wait for it: {e}"), String::new())),
        };
        let stdout = out_reader.and_then(|h| h.join().ok()).unwrap_or_default();
        let stderr = err_reader.and_then(|h| h.join().ok()).unwrap_or_default();
        if !status.success() {
            let how = status.code().map_or_else(|| status.to_string(), |c| format!("exit {c}"));
            return Err(fail(format!("failed ({how})"), stderr));
        }
        Ok(Output { stdout, stderr })
    }
}

impl Default for Runner {
    fn default() -> Self {
        Runner::new()
    }
}

fn shown_arg(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_=.,:/@%+".contains(c)) {
        a.to_string()
    } else {
        format!("{a:?}")
    }
}

fn reader_thread<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
