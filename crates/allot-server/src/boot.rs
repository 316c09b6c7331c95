//! A start, the same for the production driver and the simulation: learn the inventory from
//! the backend (or, if it does not answer and a log exists, start on the one last seen), read
//! what the log began with, rebuild the machine from the snapshot and the log, tell it what
//! changed while it was down (the inventory, the runs the backend still has, a policy file
//! edited since the last start), and hand back the commands that recovery decided.

use std::path::PathBuf;

use allot_backend::Backend;
use allot_core::{NodeSpec, PolicySpec};
use allot_store::Store;
use anyhow::{Context, Result, anyhow};

use crate::durable::Durable;
use crate::machine::{self, Cadence, Command, Daemon, Entry, Machine, SavedNode};

/// The store's meta key of the inventory the log begins with.
const INITIAL_INVENTORY: &str = "initial_inventory";

/// What a start is given.
#[derive(Clone, Debug)]
pub(crate) struct BootConfig {
    /// The inventory declared in a file (the backend may discover another).
    pub declared: Vec<NodeSpec>,
    pub inventory_source: String,
    pub policy: PolicySpec,
    pub policy_source: String,
    pub policy_text: String,
    pub workload_dir: PathBuf,
    pub cadence: Cadence,
    pub snapshot_every: u64,
}

/// A machine ready to run.
pub(crate) struct Booted {
    pub durable: Durable,
    /// What recovery decided, for the executor to run first.
    pub commands: Vec<Command>,
    /// Re-adopted runs whose pods the backend could not say now: the executor asks again.
    pub pods_owed: Vec<allot_backend::RunId>,
    /// Log records replayed.
    pub replayed: u64,
    /// Where the inventory came from, for readers.
    pub inventory_source: String,
}

/// Starts a machine on `store`, asking `backend` what it has; `now` is the wall clock.
pub(crate) fn boot(
    store: Box<dyn Store>,
    backend: &mut dyn Backend,
    config: &BootConfig,
    now: u64,
) -> Result<Booted> {
    let opened = open(store, backend, config)?;
    recover(opened, backend, config, now)
}

/// The machine as the log leaves it, before it is told anything of the present.
pub(crate) struct Opened {
    pub durable: Durable,
    pub replayed: u64,
    /// The backend's inventory now, if it answered.
    discovered: Option<Vec<NodeSpec>>,
    /// What the backend said when it did not answer.
    unreachable: Option<String>,
    inventory_source: String,
    /// The policy text the log began with.
    initial_text: String,
}

/// Reads what the log began with and rebuilds the machine from the snapshot and the log;
/// nothing is executed and nothing of the present is applied yet.
pub(crate) fn open(
    mut store: Box<dyn Store>,
    backend: &mut dyn Backend,
    config: &BootConfig,
) -> Result<Opened> {
    // A backend that does not answer at start (slurmctld restarting) does not stop a daemon
    // with a log: it starts on the inventory it knew and recovers the runs once it answers.
    let (discovered, unreachable) = match backend.inventory() {
        Ok(nodes) => (Some(nodes), None),
        // Any start before recorded the inventory the log begins with (`log_start`).
        Err(e) if e.is_transient() && store.meta(INITIAL_INVENTORY)?.is_some() => {
            (None, Some(e.to_string()))
        }
        Err(e) => {
            return Err(anyhow!(
                "the {} backend's inventory cannot be read: {e}{}",
                backend.name(),
                if e.is_transient() {
                    "; allot has never seen this cluster from this data directory, so it needs \
                     the backend to answer once to learn it: start it when the controller is up"
                } else {
                    ""
                }
            ));
        }
    };
    let inventory_source = match &discovered {
        Some(nodes) if *nodes == config.declared => config.inventory_source.clone(),
        Some(_) => format!("discovered by the {} backend", backend.name()),
        None => format!("as last seen by the {} backend (unreachable at start)", backend.name()),
    };
    let given = (config.policy_source.as_str(), config.policy_text.as_str());
    let start = log_start(store.as_mut(), given, discovered.as_deref(), &inventory_source)?;
    let log_policy = if start.policy_text == config.policy_text {
        config.policy.clone()
    } else {
        allot_config::parse_policy(&start.policy_source, &start.policy_text).map_err(|d| {
            anyhow!("the policy this data directory's log began with: {}", allot_config::render(&d))
        })?
    };
    let initial_text = start.policy_text.clone();
    let daemon = Daemon::new(
        start.nodes,
        &log_policy,
        (start.policy_source.clone(), start.policy_text),
        config.workload_dir.clone(),
    )
    .map_err(|e| anyhow!("{}: {e}", start.policy_source))?;
    let (durable, replayed) =
        Durable::open(store, Machine::new(daemon, config.cadence), config.snapshot_every)?;
    Ok(Opened { durable, replayed, discovered, unreachable, inventory_source, initial_text })
}

/// Tells an opened machine what changed while it was down: the inventory, what became of
/// the runs the log says were live, a policy file edited since the last start.
pub(crate) fn recover(
    opened: Opened,
    backend: &mut dyn Backend,
    config: &BootConfig,
    now: u64,
) -> Result<Booted> {
    let Opened {
        mut durable,
        replayed,
        discovered,
        mut unreachable,
        inventory_source,
        initial_text,
    } = opened;
    let now = durable.machine.daemon.clamp(now);
    let mut commands = Vec::new();

    // The inventory may have changed while the daemon was down: an entry, like any other.
    if let Some(entry) =
        discovered.as_deref().and_then(|d| durable.machine.daemon.inventory_entry(d))
    {
        commands.extend(durable.apply_logged(now, std::slice::from_ref(&entry))?);
        if let Some(note) = &durable.machine.daemon.inventory_note {
            crate::os::tracing_log(&format!(
                "the inventory changed since the log was written: {note}"
            ));
        }
    }

    // What became of the runs the log says were live.
    let launches = durable.machine.daemon.live_launches();
    let observations = match &unreachable {
        None => match backend.recover(&launches) {
            Ok(observations) => observations,
            Err(e) if e.is_transient() => {
                unreachable = Some(e.to_string());
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        },
        Some(_) => Vec::new(),
    };
    let mut entries: Vec<Entry> = Vec::new();
    match &unreachable {
        Some(error) => {
            crate::os::tracing_log(&format!(
                "the backend is unreachable at start ({error}): runs are recovered once it \
                 answers"
            ));
            entries.push(Entry::BackendUnreachable { error: error.clone() });
            // The executor runs it first, and again until the backend answers.
            commands.push(Command::Recover(launches));
        }
        None if durable.machine.daemon.backend_down.is_some() => {
            entries.push(Entry::BackendReachable);
        }
        None => {}
    }
    // The pods of re-adopted runs (not logged: asked again), for telemetry.
    let readopted: Vec<allot_backend::RunId> = observations
        .iter()
        .filter(|o| matches!(o, allot_backend::Observation::Started { .. }))
        .map(allot_backend::Observation::run)
        .collect();
    let mut pods_owed = Vec::new();
    if !readopted.is_empty() {
        match backend.member_pods(&readopted) {
            Ok(pods) => durable.machine.take_pods(pods),
            Err(e) if e.is_transient() => pods_owed = readopted,
            Err(e) => crate::os::tracing_log(&format!("backend member pods: {e}")),
        }
    }
    entries.extend(machine::recovered_entries(observations));
    commands.extend(durable.apply_logged(now, &entries)?);
    // Stops that were under way: their current step again, then escalate from now (signals
    // are idempotent).
    commands.extend(durable.machine.daemon.resend_stops(now));
    commands.extend(durable.machine.daemon.due_signals(now));
    durable.machine.daemon.changed.extend(durable.machine.daemon.workloads.keys().copied());

    // A policy file edited since the last start applies like `allot policy apply`; the same
    // file as last time leaves the policy in effect alone (it may be one applied since).
    const GIVEN_AT_LAST_START: &str = "last_start_policy_text";
    let given_before = durable.store.meta(GIVEN_AT_LAST_START)?.unwrap_or(initial_text);
    if config.policy_text != given_before {
        let daemon = &durable.machine.daemon;
        match daemon.prepare_policy(&config.policy_source, &config.policy_text, None, None) {
            Ok(None) => {}
            Ok(Some(entry)) => {
                commands.extend(durable.apply_logged(now, std::slice::from_ref(&entry))?);
                crate::os::tracing_log(&format!(
                    "the policy changed since the last start: {} applied to the live work",
                    config.policy_source
                ));
            }
            Err(problems) => {
                return Err(anyhow!(
                    "{} cannot be applied to this data directory's live work: {}; start with \
                     the policy in effect (`allot policy show`), or cancel or suspend the work \
                     named",
                    config.policy_source,
                    problems.join("; ")
                ));
            }
        }
    } else if durable.machine.daemon.policy_text != config.policy_text {
        crate::os::tracing_log(&format!(
            "{} is unchanged since the last start: the policy in effect ({}, applied since) \
             stays; `allot policy show` prints it",
            config.policy_source, durable.machine.daemon.policy_source
        ));
    }
    durable.store.set_meta(GIVEN_AT_LAST_START, &config.policy_text)?;
    Ok(Booted { durable, commands, pods_owed, replayed, inventory_source })
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
    const INVENTORY: &str = INITIAL_INVENTORY;
    // Written by allot before the inventory itself was recorded: only its fingerprint.
    const INVENTORY_SHA: &str = "inventory_sha256";
    const SOURCE: &str = "initial_policy_source";
    const TEXT: &str = "initial_policy_text";
    // Written by allot before policy apply existed: policy and inventory in one fingerprint.
    const COMBINED: &str = "configuration_sha256";
    let record = |nodes: &[NodeSpec]| serde_json::to_string(&machine::saved_nodes(nodes));
    let used = store.last_seq()? > 0;
    if let (Some(source), Some(text)) = (store.meta(SOURCE)?, store.meta(TEXT)?) {
        let nodes = match store.meta(INVENTORY)? {
            Some(json) => {
                let saved: Vec<SavedNode> = serde_json::from_str(&json).with_context(|| {
                    "the inventory this data directory's log began with cannot be read \
                     (written by another allot version, or damaged); restore the data \
                     directory from a backup"
                })?;
                saved.iter().map(NodeSpec::from).collect()
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
                        .is_some_and(|old| old != crate::auth::hash(&format!("{discovered:?}")))
                {
                    crate::os::tracing_log(&format!(
                        "the inventory ({inventory_source}) differs from the one this data \
                         directory's log began with, which an older allot kept only as a \
                         fingerprint: replaying over today's inventory"
                    ));
                }
                store.set_meta(INVENTORY, &record(discovered)?)?;
                discovered.to_vec()
            }
        };
        return Ok(LogStart { policy_source: source, policy_text: text, nodes });
    }
    // No log yet, or one from before the policy was recorded: a start without a log needs the
    // backend to have answered.
    let discovered = discovered.ok_or_else(|| anyhow!("the backend's inventory is unknown"))?;
    if used && let Some(old) = store.meta(COMBINED)? {
        let combined =
            crate::auth::hash(&format!("{given_text}\n--- inventory ---\n{discovered:?}"));
        if old != combined {
            return Err(anyhow!(
                "the policy or the inventory ({inventory_source}) differs from the one this \
                 data directory's log was written with (by an allot that did not record them \
                 separately) — start once with the same files, then change the policy with \
                 `allot policy apply`"
            ));
        }
    }
    store.set_meta(INVENTORY, &record(discovered)?)?;
    store.set_meta(SOURCE, given_source)?;
    store.set_meta(TEXT, given_text)?;
    Ok(LogStart {
        policy_source: given_source.to_string(),
        policy_text: given_text.to_string(),
        nodes: discovered.to_vec(),
    })
}
