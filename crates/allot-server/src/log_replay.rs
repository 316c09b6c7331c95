//! A diagnostic, not a test: `ALLOT_LOG_REPLAY_DIR=DIR ALLOT_LOG_REPLAY_IDS=202,157 cargo test
//! -p allot-server --lib log_replay -- --nocapture` replays a daemon's data directory (from its
//! latest snapshot, or from the start when it has none) and prints, after each logged cycle,
//! the engine's explanation of the chosen workloads each time it changes, with the inputs
//! between (times in seconds from the first record replayed). A daemon started with a huge
//! `--snapshot-every` (`bench-slurm-vs-allot.py --keep-log`) keeps its whole run. Optional
//! `ALLOT_LOG_REPLAY_FROM` / `_TO` (seconds) bound what is printed. Without the variables it
//! does nothing. It reads the directory and writes nothing (`open_unlocked` on an existing
//! store).

use std::collections::BTreeMap;
use std::path::Path;

use allot_core::{NodeSpec, Timestamp, WorkloadId};
use allot_store::{SqliteStore, Store};

use crate::machine::{Daemon, Entry, SavedNode};

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
// A diagnostic's output is what it is for.
#[allow(clippy::print_stdout)]
fn log_replay() {
    let Ok(dir) = std::env::var("ALLOT_LOG_REPLAY_DIR") else { return };
    let dir = Path::new(&dir);
    assert!(
        dir.join("allot.db").is_file(),
        "{}: no allot.db: not a daemon's data directory",
        dir.display()
    );
    let ids: Vec<u64> = std::env::var("ALLOT_LOG_REPLAY_IDS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let (from, to) =
        (env_f64("ALLOT_LOG_REPLAY_FROM", 0.0), env_f64("ALLOT_LOG_REPLAY_TO", f64::MAX));
    let store = SqliteStore::open_unlocked(dir).expect("the store opens");
    let meta = |key: &str| {
        store.meta(key).expect("the store reads").unwrap_or_else(|| panic!("no {key} in the store"))
    };
    let saved: Vec<SavedNode> =
        serde_json::from_str(&meta("initial_inventory")).expect("the inventory reads");
    let nodes: Vec<NodeSpec> = saved.iter().map(NodeSpec::from).collect();
    let (source, text) = (meta("initial_policy_source"), meta("initial_policy_text"));
    let policy = allot_config::parse_policy(&source, &text).expect("the policy parses");
    let scratch = std::env::temp_dir();
    let mut daemon = Daemon::new(nodes.clone(), &policy, (source, text), scratch.clone())
        .expect("the daemon builds");
    let mut after = 0;
    if let Some(snapshot) = store.latest_snapshot().expect("the store reads") {
        daemon = Daemon::from_snapshot(nodes, scratch, &snapshot.body).expect("the snapshot reads");
        after = snapshot.seq;
        println!("from the snapshot at record {after}");
    }
    let mut t0 = None;
    let mut last: BTreeMap<u64, String> = BTreeMap::new();
    loop {
        let records = store.read_after(after, 4096).expect("the store reads");
        let Some(end) = records.last().map(|r| r.seq) else { break };
        for r in &records {
            let entry: Entry = serde_json::from_str(&r.body).expect("the record reads");
            let rel = (r.at_ms - *t0.get_or_insert(r.at_ms)) as f64 / 1000.0;
            let shown = (from..=to).contains(&rel);
            if shown && !matches!(r.kind.as_str(), "decided" | "sampled" | "telemetry_missing") {
                println!("{rel:9.2}  {}", r.body.chars().take(160).collect::<String>());
            }
            daemon.apply(r.at_ms, &entry);
            if r.kind != "decided" {
                continue;
            }
            for &id in &ids {
                let why =
                    crate::views::explain_json(&daemon.engine, Timestamp(r.at_ms), WorkloadId(id));
                let why = why.to_string();
                if shown && last.get(&id) != Some(&why) {
                    println!("{rel:9.2}  workload {id}: {why}");
                }
                last.insert(id, why);
            }
        }
        after = end;
    }
}
