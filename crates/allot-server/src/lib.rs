//! The allot daemon: `allot serve`.
//!
//! The daemon is a sans-I/O state machine (`machine/`: inputs in, log entries, answers and
//! backend commands out) with its log (`durable.rs`), started by `boot.rs`, driven in
//! production by threads, SQLite, the backend and the wall clock (`driver.rs`,
//! `executor.rs`, `telemetry.rs`) and in tests by a seeded simulation on a virtual clock
//! (`simulation.rs`). The HTTP API and the dashboard (`api.rs`, `dashboard/`, on tokio)
//! authenticate, read the published view (`view/`) and send requests (`handle.rs`). Every
//! input is written to the log before it is acknowledged or acted on; a restart replays the
//! log and asks the backend what became of the runs it says were live.

mod api;
mod ask;
mod auth;
mod boot;
mod dashboard;
mod driver;
mod durable;
mod executor;
mod handle;
#[cfg(test)]
mod log_replay;
mod machine;
mod metrics;
mod openapi;
mod os;
mod policy_check;
pub mod simulation;
mod state;
pub mod telemetry;
mod tls;
mod view;
pub mod views;
mod webhook;
pub mod whatif;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use allot_api::{Role, TokenCreated, TokenRequest};
use allot_backend::Backend;
use allot_core::NodeSpec;
use allot_store::{SqliteStore, Store};
use anyhow::{Context, Result, anyhow};

pub use auth::Principal;
pub use dashboard::secure_cookies;

const EMBEDDED_POLICY: (&str, &str) =
    ("examples/policy.yaml (embedded)", include_str!("../../../examples/policy.yaml"));
const EMBEDDED_CLUSTER: (&str, &str) =
    ("examples/cluster.yaml (embedded)", include_str!("../../../examples/cluster.yaml"));

/// What runs the workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// This host: each member a process group (`allot-backend-local`).
    Local,
    /// A Slurm cluster: each run a held job released onto the nodes allot chose.
    Slurm {
        /// `--partition` of every job (`None`: Slurm's default).
        partition: Option<String>,
        /// Partitions allot leaves alone (their nodes are not in the inventory).
        unmanaged_partitions: Vec<String>,
        /// The cluster's `slurm.conf` (`None`: `$SLURM_CONF`, else Slurm's default).
        slurm_conf: Option<PathBuf>,
        /// Run each job as the Unix account of the workload's user (`sbatch --uid`).
        run_as_submitter: bool,
        /// The longest pause between two `squeue` calls while nothing changes.
        poll_max_ms: u64,
        /// The longest pause while work waits for GPUs.
        poll_while_waiting_ms: u64,
    },
    /// A Kubernetes cluster: allot binds the pods that ask for `schedulerName: allot`; the
    /// policy's projects are namespaces.
    Kubernetes {
        /// The kubeconfig (`None`: `$KUBECONFIG`, else `~/.kube/config`, else in-cluster).
        kubeconfig: Option<PathBuf>,
        /// The image of the pods of work submitted through allot.
        image: Option<String>,
    },
}

/// How `allot serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Declared nodes and GPUs, used when this host has no GPU NVML or sysfs can find.
    /// `None`: the embedded `examples/cluster.yaml`.
    pub inventory_file: Option<PathBuf>,
    /// `None`: the embedded `examples/policy.yaml`.
    pub policy_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Least time between decision cycles.
    pub decide_interval_ms: u64,
    /// How often node states and foreign work are read from the backend (`None`: 5 s, and
    /// 200 ms for Kubernetes, whose backend reads a watched view).
    pub cluster_watch_ms: Option<u64>,
    /// Signal that asks a workload to checkpoint (`SIGUSR1`, `SIGUSR2`, `SIGINT`, …).
    pub checkpoint_signal: String,
    /// Log records between snapshots.
    pub snapshot_every: u64,
    pub backend: BackendChoice,
    /// Telemetry source specs (`nvml`, `sysfs`, `dcgm-exporter=URL`, …); empty: this host's
    /// GPUs when NVML or amdgpu sysfs can read them; `none`: no source (agents may post).
    pub telemetry: Vec<String>,
    /// `--policy-webhook URL`: where a rollout's own rollback is posted (JSON).
    pub policy_webhook: Option<String>,
    /// Where workloads' logs, heartbeat and checkpoint files go (`None`: see
    /// [`default_workload_dir`]).
    pub workload_dir: Option<PathBuf>,
    /// Run every local workload as the daemon's own account, on purpose: no warning that they
    /// share it (and, as root, no per-submitter accounts).
    pub single_user: bool,
}

/// Where workloads' own files go by default: inside the private data directory when they all
/// run as the daemon's account, else beside it (`DATA_DIR-workloads`), since accounts that
/// cannot enter the data directory must reach their own files.
pub fn default_workload_dir(data_dir: &Path, several_accounts: bool) -> PathBuf {
    if several_accounts {
        let mut name = data_dir.file_name().map(std::ffi::OsString::from).unwrap_or_default();
        name.push("-workloads");
        data_dir.with_file_name(name)
    } else {
        data_dir.join("workloads")
    }
}

/// This host's cgroups, if a member's group can be made here (root, or a delegated subtree):
/// one is made and removed at start, so that a host that cannot is told now, not at a launch.
fn enforcing_cgroups() -> std::result::Result<allot_backend_local::cgroup::Cgroups, String> {
    use allot_backend_local::cgroup::{Cgroups, Limits};
    let cgroups = Cgroups::detect()?;
    let probe = format!("start-check-{}", std::process::id());
    cgroups.create(&probe, &Limits::default(), &[])?.remove()?;
    Ok(cgroups)
}

/// Who local workloads run as, said once at start: what isolates them and what does not.
fn local_accounts_note(run_as_submitter: bool, single_user: bool) -> String {
    let me = allot_backend::account::Account::current().map_or_else(
        |e| format!("this daemon's account ({e})"),
        |a| format!("{} (uid {})", a.name, a.uid),
    );
    if run_as_submitter {
        "workloads run as the Unix account named like the allot user who submitted them (never \
         root), their files in their own directories"
            .to_string()
    } else if single_user {
        format!("--single-user: every workload runs as {me}, the daemon's own account")
    } else {
        format!(
            "every workload runs as {me}, the daemon's own account: a workload can read and \
             change the other workloads' logs, heartbeat and checkpoint files and this daemon's \
             data directory. On a server several people use, start allot as root so that each \
             workload runs as its submitter's account; pass --single-user if one account is meant"
        )
    }
}

/// The default data directory (`$XDG_DATA_HOME/allot`, else `~/.local/share/allot`).
pub fn default_data_dir() -> Result<PathBuf> {
    Ok(allot_store::default_data_dir()?)
}

/// Makes a token offline in `data_dir` (works while the daemon runs).
pub fn create_token(data_dir: &Path, request: &TokenRequest) -> Result<TokenCreated> {
    auth::check_request(request, &[]).map_err(|e| {
        let e = e.body;
        anyhow!(
            "{}: {}{}",
            e.field.unwrap_or_default(),
            e.error,
            e.fix.map(|f| format!(" — {f}")).unwrap_or_default()
        )
    })?;
    let mut store = SqliteStore::open_unlocked(data_dir)?;
    auth::create(&mut store, request, driver::wall_ms())
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn diagnostics_error(diagnostics: &[allot_config::Diagnostic]) -> anyhow::Error {
    anyhow!(
        "{}{} problem(s) found; nothing was changed.",
        allot_config::render(diagnostics),
        diagnostics.len()
    )
}

fn checkpoint_signal(name: &str) -> Result<nix::sys::signal::Signal> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    full.parse().map_err(|_| {
        anyhow!("--checkpoint-signal {name:?} is not a signal; use e.g. SIGUSR1, SIGUSR2, SIGINT")
    })
}

/// What a daemon is made of; `run` builds it from files, tests from in-memory parts.
pub struct Parts {
    /// The log (and snapshots).
    pub store: Box<dyn Store>,
    /// Token lookups (a second connection to the same database, or another in-memory store).
    pub token_store: Box<dyn Store>,
    pub backend: Box<dyn Backend>,
    /// The inventory declared in a file (the backend may discover another).
    pub declared: Vec<NodeSpec>,
    pub inventory_source: String,
    pub policy: allot_core::PolicySpec,
    pub policy_source: String,
    pub policy_text: String,
    /// Where workloads' own files go: logs, heartbeat and checkpoint files
    /// (`allot_backend::files`). Outside the private data directory, so that workloads run as
    /// other accounts can reach theirs.
    pub workload_dir: PathBuf,
    pub decide_interval_ms: u64,
    /// How often running workloads get a telemetry round (`None`: every 5 s).
    pub telemetry_round_ms: Option<u64>,
    /// Log records between snapshots (`None`: 10,000).
    pub snapshot_every: Option<u64>,
    /// How often node states and foreign work are read from the backend (`None`: every 5 s).
    pub cluster_watch_ms: Option<u64>,
    /// Where GPU activity is read (node agents may post more through the API).
    pub telemetry_sources: Vec<allot_telemetry::collect::Source>,
    /// Where events such as a rollout's own rollback are posted (JSON), if anywhere.
    pub policy_webhook: Option<String>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("backend", &self.backend.name())
            .field("inventory_source", &self.inventory_source)
            .field("policy_source", &self.policy_source)
            .field("workload_dir", &self.workload_dir)
            .finish_non_exhaustive()
    }
}

/// A daemon whose main loop runs: serve `router`; send `Shutdown` through `sender` to stop.
#[derive(Debug)]
pub struct Started {
    pub router: axum::Router,
    /// Made on a first start (no tokens yet): shown once.
    pub admin_token: Option<TokenCreated>,
    /// Log entries replayed at start.
    pub replayed: u64,
    /// Fires when the main loop has ended (shutdown, or a failure: then the daemon must stop
    /// serving and exit, so that a supervisor restarts it and the log is replayed).
    pub loop_done: tokio::sync::oneshot::Receiver<()>,
    sender: std::sync::mpsc::SyncSender<handle::Message>,
    loop_thread: std::thread::JoinHandle<Result<()>>,
}

impl Started {
    /// Stops the main loop and waits for it.
    pub fn stop(self) -> Result<()> {
        let _ = self.sender.send(handle::Message::Shutdown);
        self.loop_thread.join().map_err(|_| anyhow!("the main loop panicked"))?
    }
}

/// Recovers state from the log, starts the main loop, and returns the API's router.
pub fn start(parts: Parts) -> Result<Started> {
    let Parts {
        store,
        mut token_store,
        mut backend,
        declared,
        inventory_source,
        policy,
        policy_source,
        policy_text,
        workload_dir,
        decide_interval_ms,
        telemetry_round_ms,
        snapshot_every,
        cluster_watch_ms,
        telemetry_sources,
        policy_webhook,
    } = parts;
    let webhook =
        policy_webhook.as_deref().map(webhook::Webhook::new).transpose().map_err(|e| anyhow!(e))?;
    let submitter_check = backend.submitter_check();
    let isolation = backend.isolation();
    let gate = backend.gate();
    let config = boot::BootConfig {
        declared,
        inventory_source,
        policy,
        policy_source,
        policy_text,
        workload_dir: workload_dir.clone(),
        cadence: machine::Cadence {
            decide_interval_ms,
            telemetry_round_ms: telemetry_round_ms.unwrap_or(TELEMETRY_ROUND_MS).max(1),
        },
        snapshot_every: snapshot_every.unwrap_or(durable::SNAPSHOT_EVERY).max(1),
    };
    let booted = boot::boot(store, backend.as_mut(), &config, driver::wall_ms())?;
    let boot::Booted { mut durable, commands, pods_owed, replayed, inventory_source } = booted;
    let admin_token = if token_store.tokens()?.is_empty() {
        Some(auth::create(
            token_store.as_mut(),
            &TokenRequest { role: Role::Admin, name: "admin".into(), projects: Vec::new() },
            driver::wall_ms(),
        )?)
    } else {
        None
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let view = Arc::new(RwLock::new(view::View {
        backend: allot_api::BackendStatus {
            name: backend.name().to_string(),
            reachable: true,
            gate,
            ..allot_api::BackendStatus::default()
        },
        inventory_source,
        ..view::View::default()
    }));
    let now = durable.machine.daemon.clamp(driver::wall_ms());
    durable.machine.publish(now, true, &view, &metrics);
    let (sender, receiver) = std::sync::mpsc::sync_channel(handle::QUEUE_MAX);
    let handle = handle::Handle { sender: sender.clone(), view: view.clone() };
    let tokens = Arc::new(auth::Tokens::new(token_store));
    let state = state::AppState {
        handle,
        tokens,
        metrics: metrics.clone(),
        workload_dir,
        submitter_check,
        isolation,
        whatifs: Arc::default(),
    };
    if !telemetry_sources.is_empty() {
        let tx = sender.clone();
        std::thread::Builder::new()
            .name("allot-telemetry".into())
            .spawn(move || telemetry::run_collectors(telemetry_sources, &tx))?;
    }
    let probes = telemetry::ProbeTable::default();
    {
        let (table, tx) = (probes.clone(), sender.clone());
        std::thread::Builder::new()
            .name("allot-prober".into())
            .spawn(move || telemetry::run_probes(&table, &tx))?;
    }
    let watch_every = cluster_watch_ms.unwrap_or(CLUSTER_WATCH_MS).max(1);
    let down = durable.machine.daemon.backend_down.as_ref().map(|d| d.error.clone());
    let mut executor = executor::Executor::new(backend, watch_every, down);
    executor.owe_pods(pods_owed);
    // Whether work waits for GPUs, as of the main loop's last step, for the executor's polls.
    let work_waiting = Arc::new(AtomicBool::new(durable.machine.daemon.engine.has_pending()));
    let executor =
        driver::spawn_executor(executor, commands, sender.clone(), Arc::clone(&work_waiting))?;
    let (done_tx, loop_done) = tokio::sync::oneshot::channel();
    let loop_thread = std::thread::Builder::new().name("allot-main-loop".into()).spawn({
        move || {
            let ended = driver::main_loop(
                durable,
                &receiver,
                &executor,
                (&view, &metrics, &probes),
                webhook.as_ref(),
                &work_waiting,
            );
            if let Err(e) = &ended {
                driver::tracing_log(&format!("the main loop stopped: {e:#}"));
            }
            let _ = done_tx.send(());
            ended
        }
    })?;
    Ok(Started { router: router(state), admin_token, replayed, loop_done, sender, loop_thread })
}

/// The API, `/metrics`, `/healthz` and the dashboard: one router, one body limit, the
/// dashboard's session cookie read as the bearer header where there is none.
fn router(state: state::AppState) -> axum::Router {
    api::routes()
        .route(openapi::PATH, axum::routing::get(openapi::serve))
        .merge(dashboard::routes())
        .layer(axum::middleware::from_fn(dashboard::cookie_as_bearer))
        .layer(axum::extract::DefaultBodyLimit::max(allot_api::limits::BODY_BYTES_MAX))
        .with_state(state)
}

/// Node states and foreign work are read this often by default (on Slurm a `sinfo --json` and
/// a `squeue --Format`, about 0.2 s at 1,000 jobs).
const CLUSTER_WATCH_MS: u64 = 5_000;
/// The Kubernetes backend's default: its reads take a view its watches keep in memory (no API
/// call), and one with nothing changed since the last read is empty news; a pod waits at most
/// this long to be seen, and under churn the daemon takes in the cluster at most 5 times a
/// second (each read with changes is a pass over every pod).
const KUBERNETES_CLUSTER_WATCH_MS: u64 = 200;
/// How often running workloads get a telemetry round by default.
const TELEMETRY_ROUND_MS: u64 = 5_000;

/// This data directory's short random id, made on its first start.
fn instance_id(store: &mut dyn Store) -> Result<String> {
    const KEY: &str = "instance_id";
    if let Some(id) = store.meta(KEY)? {
        return Ok(id);
    }
    let mut bytes = [0u8; 3];
    getrandom::fill(&mut bytes).map_err(|e| anyhow!("no randomness for the instance id: {e}"))?;
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    store.set_meta(KEY, &id)?;
    Ok(id)
}

/// The sources `--telemetry` names, each checked before anything starts.
fn telemetry_sources(specs: &[String]) -> Result<Vec<allot_telemetry::collect::Source>> {
    use allot_telemetry::collect::{Source, local_hostname};
    if specs.iter().any(|s| s == "none") {
        return Ok(Vec::new());
    }
    if specs.is_empty() {
        return Ok(Source::local(local_hostname()).into_iter().collect());
    }
    specs
        .iter()
        .map(|spec| {
            Source::from_spec(spec, local_hostname())
                .map_err(|e| anyhow!("--telemetry {spec}: {e}"))
        })
        .collect()
}

/// Starts the daemon and blocks until SIGINT or SIGTERM.
pub fn run(config: ServeConfig) -> Result<()> {
    if config.tls_cert.is_some() != config.tls_key.is_some() {
        return Err(anyhow!("TLS needs both --tls-cert and --tls-key"));
    }
    // Read and checked before anything starts: a bad certificate or key leaves no daemon behind.
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::server_config(cert, key)?),
        _ => None,
    };
    let (policy_source, policy_text) = match &config.policy_file {
        Some(p) => (p.display().to_string(), read_text(p)?),
        None => (EMBEDDED_POLICY.0.to_string(), EMBEDDED_POLICY.1.to_string()),
    };
    let policy = allot_config::parse_policy(&policy_source, &policy_text)
        .map_err(|d| diagnostics_error(&d))?;
    let (inventory_source, declared) = match &config.inventory_file {
        Some(p) => (
            p.display().to_string(),
            allot_config::load_cluster(p).map_err(|d| diagnostics_error(&d))?,
        ),
        None => (
            EMBEDDED_CLUSTER.0.to_string(),
            allot_config::parse_cluster(EMBEDDED_CLUSTER.0, EMBEDDED_CLUSTER.1)
                .map_err(|d| diagnostics_error(&d))?,
        ),
    };
    let mut store = SqliteStore::open(&config.data_dir)?;
    for path in store.tightened() {
        driver::tracing_log(&format!(
            "{} was readable by other accounts: made private (the data directory 0700, its files 0600)",
            path.display()
        ));
    }
    let signal = checkpoint_signal(&config.checkpoint_signal)?;
    let local_as_submitter = config.backend == BackendChoice::Local
        && allot_backend::account::daemon_is_root()
        && !config.single_user;
    let several_accounts = local_as_submitter
        || matches!(config.backend, BackendChoice::Slurm { run_as_submitter: true, .. });
    let workload_dir = config
        .workload_dir
        .clone()
        .unwrap_or_else(|| default_workload_dir(&config.data_dir, several_accounts));
    allot_backend::files::prepare_root(&workload_dir, several_accounts)
        .map_err(|e| anyhow!("{e} (--workload-dir)"))?;
    let backend: Box<dyn Backend> = match &config.backend {
        BackendChoice::Local => {
            let mut local = allot_backend_local::LocalConfig::new(
                config.data_dir.join("runs"),
                allot_backend_local::discover::hostname(),
            );
            local.checkpoint_signal = signal;
            local.declared_inventory = Some(declared.clone());
            local.run_as = if local_as_submitter {
                allot_backend_local::RunAs::Submitter
            } else {
                allot_backend_local::RunAs::Daemon
            };
            driver::tracing_log(&local_accounts_note(local_as_submitter, config.single_user));
            local.cgroups = match enforcing_cgroups() {
                Ok(cgroups) => {
                    driver::tracing_log(&format!(
                        "each workload member runs in its own cgroup: {}",
                        cgroups.describe()
                    ));
                    Some(cgroups)
                }
                Err(why) => {
                    driver::tracing_log(&format!(
                        "CPU and memory requests and GPU device nodes are NOT enforced: {why}"
                    ));
                    None
                }
            };
            Box::new(allot_backend_local::LocalBackend::new(local)?)
        }
        BackendChoice::Slurm {
            partition,
            unmanaged_partitions,
            slurm_conf,
            run_as_submitter,
            poll_max_ms,
            poll_while_waiting_ms,
        } => {
            let mut slurm = allot_backend_slurm::SlurmConfig::new();
            // Job names carry this data directory's id: a second allot (or this one after a
            // fresh start) never mistakes another's `allot-1.1` for its own.
            slurm.job_prefix = format!("allot{}", instance_id(&mut store)?);
            slurm.partition.clone_from(partition);
            slurm.unmanaged_partitions = unmanaged_partitions.iter().cloned().collect();
            slurm.runner.slurm_conf =
                slurm_conf.clone().or_else(|| std::env::var_os("SLURM_CONF").map(PathBuf::from));
            slurm.checkpoint_signal = signal.as_str().trim_start_matches("SIG").to_string();
            slurm.run_as_submitter = *run_as_submitter;
            slurm.poll_max = std::time::Duration::from_millis(*poll_max_ms).max(slurm.poll_min);
            slurm.poll_while_waiting =
                std::time::Duration::from_millis(*poll_while_waiting_ms).max(slurm.poll_min);
            Box::new(allot_backend_slurm::SlurmBackend::new(slurm))
        }
        BackendChoice::Kubernetes { kubeconfig, image } => {
            let config = allot_backend_kubernetes::KubernetesConfig {
                kubeconfig: kubeconfig.clone(),
                image: image.clone(),
                ..Default::default()
            };
            Box::new(
                allot_backend_kubernetes::KubernetesBackend::connect(config)
                    .map_err(|e| anyhow!("--backend kubernetes: {e}"))?,
            )
        }
    };
    let token_store = SqliteStore::open_unlocked(&config.data_dir)?;
    let started = start(Parts {
        store: Box::new(store),
        token_store: Box::new(token_store),
        backend,
        declared,
        inventory_source,
        policy,
        policy_source,
        policy_text,
        workload_dir: workload_dir.clone(),
        decide_interval_ms: config.decide_interval_ms,
        telemetry_round_ms: None,
        snapshot_every: Some(config.snapshot_every),
        cluster_watch_ms: config.cluster_watch_ms.or(match config.backend {
            BackendChoice::Kubernetes { .. } => Some(KUBERNETES_CLUSTER_WATCH_MS),
            _ => None,
        }),
        telemetry_sources: telemetry_sources(&config.telemetry)?,
        policy_webhook: config.policy_webhook.clone(),
    })?;
    let Started { router, admin_token: first_token, replayed, loop_done, sender, loop_thread } =
        started;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served: Result<()> = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}: is another allot (or program) using it? pass --listen HOST:PORT", config.listen))?;
        let addr = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{addr}");
        driver::tracing_log(&format!(
            "listening on {base} (dashboard {base}/, API {base}/api/v1, OpenAPI {base}/api/v1/openapi.json, metrics {base}/metrics); data in {}, workloads' files in {}; {replayed} log entries replayed",
            config.data_dir.display(),
            workload_dir.display()
        ));
        if let Some(t) = &first_token {
            #[allow(clippy::print_stdout)]
            {
                println!("admin token (shown once; store it, e.g. export ALLOT_TOKEN=…):\n{}", t.token);
            }
        }
        // A signal, or the main loop's end (then stop serving: nothing could be logged).
        let stop = async {
            tokio::select! {
                () = shutdown_signal() => {}
                _ = loop_done => {}
            }
        };
        match tls {
            Some(tls) => {
                let listener = tls::TlsListener::new(listener, tls)?;
                let router = dashboard::secure_cookies(router);
                axum::serve(listener, router).with_graceful_shutdown(stop).await?;
            }
            None => axum::serve(listener, router).with_graceful_shutdown(stop).await?,
        }
        Ok(())
    });
    let _ = sender.send(handle::Message::Shutdown);
    let looped = loop_thread.join().map_err(|_| anyhow!("the main loop panicked"))?;
    served?;
    looped
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
