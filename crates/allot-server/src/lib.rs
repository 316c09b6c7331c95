//! The allot daemon: `allot serve`.
//!
//! One main loop (a thread of its own, `runtime.rs`) owns the durable log (`allot-store`), the
//! engine and the workload records (`daemon.rs`) and the backend; the HTTP API (`api.rs`, on
//! tokio) authenticates, reads the loop's published view, and sends it requests. Every input is
//! written to the log before it is acknowledged or acted on; a restart replays the log and asks
//! the backend what became of the runs it says were live.

mod api;
mod auth;
mod daemon;
mod dashboard;
mod entry;
mod foreign;
mod inventory;
mod metrics;
mod runtime;
mod snapshot;
mod submit;
pub mod telemetry;
mod tls;
pub mod views;
pub mod whatif;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use allot_api::{ApiError, PolicyValidation, Role, TokenCreated, TokenRequest};
use allot_backend::Backend;
use allot_core::Engine;
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
    /// Signal that asks a workload to checkpoint (`SIGUSR1`, `SIGUSR2`, `SIGINT`, …).
    pub checkpoint_signal: String,
    /// Log records between snapshots.
    pub snapshot_every: u64,
    pub backend: BackendChoice,
    /// Telemetry source specs (`nvml`, `sysfs`, `dcgm-exporter=URL`, …); empty: this host's
    /// GPUs when NVML or amdgpu sysfs can read them; `none`: no source (agents may post).
    pub telemetry: Vec<String>,
}

/// The default data directory (`$XDG_DATA_HOME/allot`, else `~/.local/share/allot`).
pub fn default_data_dir() -> Result<PathBuf> {
    Ok(allot_store::default_data_dir()?)
}

/// Makes a token offline in `data_dir` (works while the daemon runs).
pub fn create_token(data_dir: &Path, request: &TokenRequest) -> Result<TokenCreated> {
    auth::check_request(request, &[]).map_err(|e| {
        anyhow!(
            "{}: {}{}",
            e.field.unwrap_or_default(),
            e.error,
            e.fix.map(|f| format!(" — {f}")).unwrap_or_default()
        )
    })?;
    let mut store = SqliteStore::open_unlocked(data_dir)?;
    auth::create(&mut store, request, runtime::wall_ms())
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

/// Checks a policy text against `nodes`, as `POST /policy/validate` answers.
pub(crate) fn validate_policy_text(name: &str, text: &str, nodes: &[NodeSpec]) -> PolicyValidation {
    match allot_config::parse_policy(name, text) {
        Err(diagnostics) => PolicyValidation {
            ok: false,
            summary: format!("{}: {} problem(s)", name, diagnostics.len()),
            problems: diagnostics
                .iter()
                .map(|d| ApiError {
                    error: format!("{}:{}:{}: {}", name, d.line, d.column, d.message),
                    field: Some(d.field.clone()),
                    fix: Some(d.fix.clone()),
                })
                .collect(),
        },
        Ok(policy) => match Engine::new(nodes, &policy) {
            Err(e) => PolicyValidation {
                ok: false,
                summary: format!("{name}: 1 problem"),
                problems: vec![ApiError { error: e.to_string(), field: None, fix: None }],
            },
            Ok(_) => PolicyValidation {
                ok: true,
                summary: format!(
                    "{name}: ok — {} projects, {} priority classes, {} idle rules",
                    policy.projects.len(),
                    policy.priority_classes.len(),
                    policy.idle.len()
                ),
                problems: Vec::new(),
            },
        },
    }
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
    pub data_dir: PathBuf,
    pub decide_interval_ms: u64,
    /// How often running workloads get a telemetry round (`None`: every 5 s).
    pub telemetry_round_ms: Option<u64>,
    /// Log records between snapshots (`None`: 10,000).
    pub snapshot_every: Option<u64>,
    /// How often node states and foreign work are read from the backend (`None`: every 5 s).
    pub cluster_watch_ms: Option<u64>,
    /// Where GPU activity is read (node agents may post more through the API).
    pub telemetry_sources: Vec<allot_telemetry::collect::Source>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("backend", &self.backend.name())
            .field("inventory_source", &self.inventory_source)
            .field("policy_source", &self.policy_source)
            .field("data_dir", &self.data_dir)
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
    sender: std::sync::mpsc::SyncSender<runtime::Request>,
    loop_thread: std::thread::JoinHandle<Result<()>>,
}

impl Started {
    /// Stops the main loop and waits for it.
    pub fn stop(self) -> Result<()> {
        let _ = self.sender.send(runtime::Request::Shutdown);
        self.loop_thread.join().map_err(|_| anyhow!("the main loop panicked"))?
    }
}

/// Recovers state from the log, starts the main loop, and returns the API's router.
pub fn start(parts: Parts) -> Result<Started> {
    let Parts {
        mut store,
        mut token_store,
        mut backend,
        declared,
        inventory_source,
        policy,
        policy_source,
        policy_text,
        data_dir,
        decide_interval_ms,
        telemetry_round_ms,
        snapshot_every,
        cluster_watch_ms,
        telemetry_sources,
    } = parts;
    // A backend that does not answer at start (slurmctld restarting) does not stop a daemon
    // with a log: it starts on the inventory it knew and recovers the runs once it answers.
    let (discovered, unreachable) = match backend.inventory() {
        Ok(nodes) => (Some(nodes), None),
        Err(e) if e.is_transient() && store.last_seq()? > 0 => (None, Some(e.to_string())),
        Err(e) => {
            return Err(anyhow!(
                "the {} backend's inventory cannot be read: {e}{}",
                backend.name(),
                if e.is_transient() {
                    "; this data directory has no log yet, so allot needs the backend to answer \
                     once to learn the cluster: start it when the controller is up"
                } else {
                    ""
                }
            ));
        }
    };
    let inventory_source = match &discovered {
        Some(nodes) if *nodes == declared => inventory_source,
        Some(_) => format!("discovered by the {} backend", backend.name()),
        None => format!("as last seen by the {} backend (unreachable at start)", backend.name()),
    };
    let LogStart { policy_source: log_source, policy_text: log_text, nodes: log_nodes } =
        log_start(
            store.as_mut(),
            (&policy_source, &policy_text),
            discovered.as_deref(),
            &inventory_source,
        )?;
    let log_policy = if log_text == policy_text {
        policy.clone()
    } else {
        allot_config::parse_policy(&log_source, &log_text).map_err(|d| {
            anyhow!("the policy this data directory's log began with: {}", allot_config::render(&d))
        })?
    };
    let daemon = daemon::Daemon::new(
        log_nodes,
        &log_policy,
        (log_source.clone(), log_text.clone()),
        data_dir.clone(),
    )
    .map_err(|e| anyhow!("{log_source}: {e}"))?;
    let admin_token = if token_store.tokens()?.is_empty() {
        Some(auth::create(
            token_store.as_mut(),
            &TokenRequest { role: Role::Admin, name: "admin".into(), projects: Vec::new() },
            runtime::wall_ms(),
        )?)
    } else {
        None
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let initial_text = log_text.clone();
    let view = Arc::new(RwLock::new(runtime::View {
        backend: allot_api::BackendStatus {
            name: backend.name().to_string(),
            reachable: true,
            ..allot_api::BackendStatus::default()
        },
        inventory_source,
        policy_source: log_source,
        policy_text: log_text,
        ..runtime::View::default()
    }));
    let mut main_loop = runtime::Loop::new(
        store,
        daemon,
        backend,
        metrics.clone(),
        view.clone(),
        decide_interval_ms,
    );
    if let Some(ms) = telemetry_round_ms {
        main_loop.telemetry_round_ms = ms.max(1);
    }
    if let Some(every) = snapshot_every {
        main_loop.snapshot_every = every.max(1);
    }
    if let Some(ms) = cluster_watch_ms {
        main_loop.cluster_watch_ms = ms.max(1);
    }
    let replayed = main_loop.recover(discovered.as_deref(), unreachable)?;
    let nodes = main_loop.daemon.nodes.clone();
    // A policy file edited since the last start applies like `allot policy apply`; the same
    // file as last time leaves the policy in effect alone (it may be one applied since).
    const GIVEN_AT_LAST_START: &str = "last_start_policy_text";
    let given_before = main_loop.store.meta(GIVEN_AT_LAST_START)?.unwrap_or(initial_text);
    if policy_text != given_before {
        main_loop.start_with_policy(&policy_source, &policy_text)?;
    } else if main_loop.daemon.policy_text != policy_text {
        runtime::tracing_log(&format!(
            "{policy_source} is unchanged since the last start: the policy in effect ({}, \
             applied since) stays; `allot policy show` prints it",
            main_loop.daemon.policy_source
        ));
    }
    main_loop.store.set_meta(GIVEN_AT_LAST_START, &policy_text)?;
    let (sender, receiver) = std::sync::mpsc::sync_channel(runtime::QUEUE_MAX);
    let handle = runtime::Handle { sender: sender.clone(), view };
    let tokens = Arc::new(auth::Tokens::new(token_store));
    let state = api::AppState { handle, tokens, metrics, data_dir, nodes: Arc::new(nodes) };
    if !telemetry_sources.is_empty() {
        let tx = sender.clone();
        std::thread::Builder::new()
            .name("allot-telemetry".into())
            .spawn(move || telemetry::run_collectors(telemetry_sources, &tx))?;
    }
    let (done_tx, loop_done) = tokio::sync::oneshot::channel();
    let loop_thread = std::thread::Builder::new().name("allot-main-loop".into()).spawn({
        let sender = sender.clone();
        move || {
            let ended = main_loop.run(receiver, sender);
            if let Err(e) = &ended {
                runtime::tracing_log(&format!("the main loop stopped: {e:#}"));
            }
            let _ = done_tx.send(());
            ended
        }
    })?;
    Ok(Started {
        router: api::router(state),
        admin_token,
        replayed,
        loop_done,
        sender,
        loop_thread,
    })
}

/// What the log begins with: the policy (replay starts under it; snapshots and
/// `PolicyApplied` entries carry later ones) and the inventory (snapshots and
/// `InventoryReported` entries carry later ones). A first start records the given policy and
/// the discovered inventory.
struct LogStart {
    policy_source: String,
    policy_text: String,
    nodes: Vec<NodeSpec>,
}

fn log_start(
    store: &mut dyn Store,
    (given_source, given_text): (&str, &str),
    discovered: Option<&[NodeSpec]>,
    inventory_source: &str,
) -> Result<LogStart> {
    const INVENTORY: &str = "initial_inventory";
    // Written by allot before the inventory itself was recorded: only its fingerprint.
    const INVENTORY_SHA: &str = "inventory_sha256";
    const SOURCE: &str = "initial_policy_source";
    const TEXT: &str = "initial_policy_text";
    // Written by allot before policy apply existed: policy and inventory in one fingerprint.
    const COMBINED: &str = "configuration_sha256";
    let used = store.last_seq()? > 0;
    if let (Some(source), Some(text)) = (store.meta(SOURCE)?, store.meta(TEXT)?) {
        let nodes = match store.meta(INVENTORY)? {
            Some(json) => {
                let saved: Vec<inventory::SavedNode> =
                    serde_json::from_str(&json).with_context(|| {
                        "the inventory this data directory's log began with cannot be read \
                         (written by another allot version, or damaged); restore the data \
                         directory from a backup"
                    })?;
                inventory::specs(&saved)
            }
            None => {
                let Some(discovered) = discovered else {
                    return Err(anyhow!(
                        "the backend is unreachable and this data directory was written by an \
                         allot that did not record its inventory: start once with the backend \
                         answering"
                    ));
                };
                // An older log: replay over today's inventory (its runs name nodes by name;
                // the engine is told of any difference as an inventory change afterwards).
                if used
                    && store
                        .meta(INVENTORY_SHA)?
                        .is_some_and(|old| old != auth::hash(&format!("{discovered:?}")))
                {
                    runtime::tracing_log(&format!(
                        "the inventory ({inventory_source}) differs from the one this data \
                         directory's log began with, which an older allot kept only as a \
                         fingerprint: replaying over today's inventory"
                    ));
                }
                store
                    .set_meta(INVENTORY, &serde_json::to_string(&inventory::saved(discovered))?)?;
                discovered.to_vec()
            }
        };
        return Ok(LogStart { policy_source: source, policy_text: text, nodes });
    }
    // No log yet, or one from before the policy was recorded: the backend answered (a start
    // without a log needs it).
    let discovered = discovered.ok_or_else(|| anyhow!("the backend's inventory is unknown"))?;
    if used && let Some(old) = store.meta(COMBINED)? {
        let combined = auth::hash(&format!("{given_text}\n--- inventory ---\n{discovered:?}"));
        if old != combined {
            return Err(anyhow!(
                "the policy or the inventory ({inventory_source}) differs from the one this \
                 data directory's log was written with (by an allot that did not record them \
                 separately) — start once with the same files, then change the policy with \
                 `allot policy apply`"
            ));
        }
    }
    store.set_meta(INVENTORY, &serde_json::to_string(&inventory::saved(discovered))?)?;
    store.set_meta(SOURCE, given_source)?;
    store.set_meta(TEXT, given_text)?;
    Ok(LogStart {
        policy_source: given_source.to_string(),
        policy_text: given_text.to_string(),
        nodes: discovered.to_vec(),
    })
}

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
    let signal = checkpoint_signal(&config.checkpoint_signal)?;
    let backend: Box<dyn Backend> = match &config.backend {
        BackendChoice::Local => {
            let mut local = allot_backend_local::LocalConfig::new(
                config.data_dir.join("runs"),
                allot_backend_local::discover::hostname(),
            );
            local.checkpoint_signal = signal;
            local.declared_inventory = Some(declared.clone());
            Box::new(allot_backend_local::LocalBackend::new(local)?)
        }
        BackendChoice::Slurm { partition, unmanaged_partitions, slurm_conf, run_as_submitter } => {
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
            Box::new(allot_backend_slurm::SlurmBackend::new(slurm))
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
        data_dir: config.data_dir.clone(),
        decide_interval_ms: config.decide_interval_ms,
        telemetry_round_ms: None,
        snapshot_every: Some(config.snapshot_every),
        cluster_watch_ms: None,
        telemetry_sources: telemetry_sources(&config.telemetry)?,
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
        runtime::tracing_log(&format!(
            "listening on {base} (dashboard {base}/, API {base}/api/v1, OpenAPI {base}/api/v1/openapi.json, metrics {base}/metrics); data in {}; {replayed} log entries replayed",
            config.data_dir.display()
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
    let _ = sender.send(runtime::Request::Shutdown);
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
