//! One contract suite run against both stores, then what only the SQLite store has: files,
//! schema versions, the lock, durability across SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use allot_store::{
    DB_FILE_NAME, LOCK_FILE_NAME, MemoryStore, NewRecord, Record, SCHEMA_VERSION, Snapshot,
    SqliteStore, Store, StoreError, TokenRecord,
};

fn record(at_ms: u64, kind: &'static str, body: &'static str) -> NewRecord<'static> {
    NewRecord { at_ms, kind, body }
}

fn seqs(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

fn snapshot(seq: u64, body: &str) -> Snapshot {
    Snapshot { seq, at_ms: 1_000 + seq, body: body.to_owned() }
}

fn token(id: &str, hash: &str, created_ms: u64, projects: &[&str]) -> TokenRecord {
    TokenRecord {
        id: id.to_owned(),
        hash: hash.to_owned(),
        role: "user".to_owned(),
        projects: projects.iter().map(|p| (*p).to_owned()).collect(),
        name: format!("token {id}"),
        created_ms,
        revoked: false,
    }
}

/// The behaviour every `Store` must have.
fn contract(store: &mut dyn Store) {
    // Empty.
    assert_eq!(store.last_seq().expect("last_seq"), 0);
    assert!(store.read_after(0, 10).expect("read").is_empty());
    assert_eq!(store.latest_snapshot().expect("snapshot"), None);
    assert!(store.tokens().expect("tokens").is_empty());
    assert_eq!(store.meta("k").expect("meta"), None);
    assert_eq!(store.append(&[]).expect("empty append"), 0);

    // Seq starts at 1 and is gap-free across single and batched appends.
    assert_eq!(store.append(&[record(10, "a", r#"{"n":1}"#)]).expect("append"), 1);
    let batch = [record(11, "b", r#"{"n":2}"#), record(12, "c", "{}"), record(13, "d", "")];
    assert_eq!(store.append(&batch).expect("append batch"), 4);
    assert_eq!(store.append(&[]).expect("empty append"), 4);
    assert_eq!(store.last_seq().expect("last_seq"), 4);
    let all = store.read_after(0, 100).expect("read");
    assert_eq!(seqs(&all), [1, 2, 3, 4]);
    assert_eq!(
        all[1],
        Record { seq: 2, at_ms: 11, kind: "b".to_owned(), body: r#"{"n":2}"#.to_owned() }
    );
    assert_eq!(all[3].body, "");

    // Pagination.
    assert_eq!(seqs(&store.read_after(1, 2).expect("page")), [2, 3]);
    assert_eq!(seqs(&store.read_after(3, 2).expect("page")), [4]);
    assert!(store.read_after(4, 2).expect("past the end").is_empty());
    assert!(store.read_after(0, 0).expect("limit 0").is_empty());
    assert!(store.read_after(u64::MAX, 10).expect("far past the end").is_empty());

    // A batch with one bad record leaves nothing behind.
    let bad = [record(14, "e", "{}"), record(u64::MAX, "f", "{}")];
    let err = store.append(&bad).expect_err("at_ms beyond i64");
    assert!(matches!(err, StoreError::OutOfRange { field: "at_ms", .. }), "{err}");
    assert_eq!(store.last_seq().expect("last_seq"), 4);
    assert_eq!(seqs(&store.read_after(0, 100).expect("read")), [1, 2, 3, 4]);

    // Snapshots: not ahead of the log; the latest is the highest seq; same seq replaces.
    let err = store.put_snapshot(&snapshot(5, "s5")).expect_err("ahead of the log");
    assert!(matches!(err, StoreError::SnapshotAhead { seq: 5, last_seq: 4 }), "{err}");
    let err = store.compact_through(2).expect_err("no snapshot");
    assert!(matches!(err, StoreError::CompactBeyondSnapshot { seq: 2, snapshot_seq: None }));
    assert!(err.to_string().contains("put a snapshot at seq 2 or later first"), "{err}");
    store.put_snapshot(&snapshot(3, "s3")).expect("snapshot 3");
    store.put_snapshot(&snapshot(2, "s2")).expect("an older snapshot");
    assert_eq!(store.latest_snapshot().expect("latest"), Some(snapshot(3, "s3")));
    store.put_snapshot(&snapshot(3, "s3 again")).expect("replace snapshot 3");
    assert_eq!(store.latest_snapshot().expect("latest"), Some(snapshot(3, "s3 again")));

    // Compaction only up to the latest snapshot; numbering continues.
    let err = store.compact_through(4).expect_err("beyond the snapshot");
    assert!(matches!(err, StoreError::CompactBeyondSnapshot { seq: 4, snapshot_seq: Some(3) }));
    assert_eq!(seqs(&store.read_after(0, 100).expect("unchanged")), [1, 2, 3, 4]);
    assert_eq!(store.compact_through(3).expect("compact"), 3);
    assert_eq!(seqs(&store.read_after(0, 100).expect("read")), [4]);
    assert_eq!(store.compact_through(3).expect("again"), 0);
    assert_eq!(store.compact_through(1).expect("older"), 0);
    assert_eq!(store.last_seq().expect("last_seq"), 4);
    assert_eq!(store.append(&[record(20, "g", "{}")]).expect("append"), 5);
    store.put_snapshot(&snapshot(5, "s5")).expect("snapshot 5");
    assert_eq!(store.compact_through(5).expect("compact all"), 2);
    assert!(store.read_after(0, 100).expect("read").is_empty());
    assert_eq!(store.last_seq().expect("last_seq after compacting all"), 5);
    assert_eq!(store.latest_snapshot().expect("latest"), Some(snapshot(5, "s5")));
    assert_eq!(store.append(&[record(21, "h", "{}")]).expect("never reused"), 6);
    assert_eq!(seqs(&store.read_after(0, 100).expect("read")), [6]);

    // Tokens.
    let alice = token("t-alice", "aa11", 200, &["vision", "audio"]);
    let bob = token("t-bob", "bb22", 100, &[]);
    let carol = token("t-carol", "cc33", 200, &["nlp"]);
    for t in [&alice, &bob, &carol] {
        store.put_token(t).expect("put token");
    }
    assert_eq!(store.token_by_hash("aa11").expect("by hash"), Some(alice.clone()));
    assert_eq!(store.token_by_hash("zz99").expect("unknown hash"), None);
    let ids: Vec<String> = store.tokens().expect("tokens").into_iter().map(|t| t.id).collect();
    assert_eq!(ids, ["t-bob", "t-alice", "t-carol"], "by created_ms, then id");
    let alice =
        TokenRecord { projects: vec!["audio".to_owned()], role: "admin".to_owned(), ..alice };
    store.put_token(&alice).expect("replace by id");
    assert_eq!(store.token_by_hash("aa11").expect("by hash"), Some(alice.clone()));
    assert_eq!(store.tokens().expect("tokens").len(), 3);
    let err = store.put_token(&token("t-mallory", "bb22", 300, &[])).expect_err("hash taken");
    assert!(
        matches!(&err, StoreError::DuplicateTokenHash { id, other_id: Some(other) }
            if id == "t-mallory" && other == "t-bob"),
        "{err}"
    );
    assert_eq!(store.tokens().expect("tokens").len(), 3);
    assert!(store.revoke_token("t-bob").expect("revoke"));
    assert!(store.revoke_token("t-bob").expect("revoke twice"));
    assert!(!store.revoke_token("t-nobody").expect("unknown id"));
    let bob_now = store.token_by_hash("bb22").expect("by hash").expect("bob is kept");
    assert_eq!(bob_now, TokenRecord { revoked: true, ..bob });
    assert!(!store.token_by_hash("cc33").expect("by hash").expect("carol").revoked);

    // Meta.
    store.set_meta("cluster", "alpha").expect("set");
    store.set_meta("version", "1").expect("set");
    store.set_meta("cluster", "beta").expect("overwrite");
    assert_eq!(store.meta("cluster").expect("meta").as_deref(), Some("beta"));
    assert_eq!(store.meta("version").expect("meta").as_deref(), Some("1"));
    assert_eq!(store.meta("missing").expect("meta"), None);
}

#[test]
fn memory_store_meets_the_contract() {
    contract(&mut MemoryStore::default());
}

#[test]
fn sqlite_store_meets_the_contract() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = SqliteStore::open(dir.path()).expect("open");
    assert_eq!(store.path(), dir.path().join(DB_FILE_NAME));
    contract(&mut store);
}

#[test]
fn sqlite_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("nested/data");
    let written = {
        let mut store = SqliteStore::open(&data_dir).expect("open creates the folders");
        contract(&mut store);
        Dump::of(&store)
    };
    let mut store = SqliteStore::open(&data_dir).expect("reopen");
    assert_eq!(Dump::of(&store), written);
    assert_eq!(store.append(&[record(30, "i", "{}")]).expect("append after reopen"), 7);
}

/// Everything a store shows, for comparing two stores.
#[derive(Debug, PartialEq)]
struct Dump {
    last_seq: u64,
    records: Vec<Record>,
    snapshot: Option<Snapshot>,
    tokens: Vec<TokenRecord>,
    meta: Vec<Option<String>>,
}

impl Dump {
    fn of(store: &dyn Store) -> Self {
        Dump {
            last_seq: store.last_seq().expect("last_seq"),
            records: store.read_after(0, usize::MAX).expect("read"),
            snapshot: store.latest_snapshot().expect("snapshot"),
            tokens: store.tokens().expect("tokens"),
            meta: ["cluster", "version"].map(|k| store.meta(k).expect("meta")).into(),
        }
    }
}

#[test]
fn a_newer_schema_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().expect("temp dir");
    drop(SqliteStore::open(dir.path()).expect("create"));
    let db = dir.path().join(DB_FILE_NAME);
    let conn = rusqlite::Connection::open(&db).expect("raw open");
    conn.pragma_update(None, "user_version", 7).expect("set user_version");
    drop(conn);
    let err = SqliteStore::open(dir.path()).expect_err("newer schema");
    let message = err.to_string();
    let expected =
        format!("database {} is newer than this allot (schema 7 > 1): upgrade allot", db.display());
    assert_eq!(message, expected);
    assert_eq!(SCHEMA_VERSION, 1);
}

#[test]
fn a_file_that_is_not_a_database_gives_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join(DB_FILE_NAME);
    std::fs::write(&db, "this is a text file, not an SQLite database\n".repeat(100))
        .expect("write");
    let err = SqliteStore::open(dir.path()).expect_err("not a database");
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&db.display().to_string()), "{message}");
    assert!(message.contains("move it aside"), "{message}");
}

#[test]
fn a_damaged_database_gives_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let mut store = SqliteStore::open(dir.path()).expect("create");
        let body = "x".repeat(500);
        let batch: Vec<NewRecord<'_>> =
            (0..100).map(|i| NewRecord { at_ms: i, kind: "k", body: &body }).collect();
        store.append(&batch).expect("append");
    } // Closing the last connection checkpoints the WAL into the main file.
    let db = dir.path().join(DB_FILE_NAME);
    let mut bytes = std::fs::read(&db).expect("read the file");
    assert!(bytes.len() > 16 * 4096, "the log spans many pages");
    bytes[2 * 4096..12 * 4096].fill(0xA5);
    std::fs::write(&db, bytes).expect("damage the file");
    let err = SqliteStore::open(dir.path())
        .and_then(|store| store.read_after(0, usize::MAX))
        .expect_err("damaged pages");
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("move it aside"), "{err}");
}

#[test]
fn another_programs_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join(DB_FILE_NAME);
    let conn = rusqlite::Connection::open(&db).expect("raw open");
    conn.execute_batch("CREATE TABLE photos (id INTEGER PRIMARY KEY)").expect("create");
    drop(conn);
    let err = SqliteStore::open(dir.path()).expect_err("foreign database");
    assert!(matches!(err, StoreError::ForeignDatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("another program"), "{err}");
}

#[test]
fn a_data_dir_that_cannot_be_created_names_it_and_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    let err = SqliteStore::open(&file.join("data")).expect_err("parent is a file");
    assert!(matches!(err, StoreError::CreateDir { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("a-file/data") && message.contains("--data-dir"), "{message}");
}

#[test]
fn the_lock_refuses_a_second_open_but_not_an_unlocked_admin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut daemon = SqliteStore::open(dir.path()).expect("first open");
    let pid = std::process::id().to_string();
    let lock_contents = std::fs::read_to_string(dir.path().join(LOCK_FILE_NAME)).expect("lock");
    assert_eq!(lock_contents.trim(), pid);

    let err = SqliteStore::open(dir.path()).expect_err("second open");
    assert!(matches!(&err, StoreError::InUse { holder, .. } if *holder == pid), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("is in use by another allot") && message.contains(&pid), "{message}");

    // An admin command works alongside the daemon, and each sees the other's writes.
    let mut admin = SqliteStore::open_unlocked(dir.path()).expect("unlocked open");
    admin.put_token(&token("t-admin", "ad01", 1, &["ops"])).expect("admin writes");
    assert_eq!(
        daemon.token_by_hash("ad01").expect("daemon reads").map(|t| t.id).as_deref(),
        Some("t-admin")
    );
    daemon.append(&[record(1, "a", "{}")]).expect("daemon appends");
    assert_eq!(admin.last_seq().expect("admin reads"), 1);

    drop(daemon);
    let reopened = SqliteStore::open(dir.path()).expect("lock released on drop");
    assert_eq!(reopened.last_seq().expect("last_seq"), 1);
}

/// Set in the child process of `acknowledged_appends_survive_sigkill`: the data dir to write.
const WRITER_ENV: &str = "ALLOT_STORE_TEST_WRITER_DIR";
const ACKS_BEFORE_KILL: usize = 200;

#[test]
fn acknowledged_appends_survive_sigkill() {
    if let Some(dir) = std::env::var_os(WRITER_ENV) {
        write_until_killed(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "acknowledged_appends_survive_sigkill",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WRITER_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the writer");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut acked = Vec::new();
    let mut checked_lock = false;
    while acked.len() < ACKS_BEFORE_KILL {
        let Some(line) = lines.next() else { break };
        if let Some(seq) = line.expect("child stdout").strip_prefix("ack ") {
            acked.push(seq.parse::<u64>().expect("a seq"));
        }
        if !checked_lock && !acked.is_empty() {
            // The writer holds the data dir: another process cannot open it.
            let err = SqliteStore::open(dir.path()).expect_err("held by the writer");
            let child_pid = child.id().to_string();
            assert!(
                matches!(&err, StoreError::InUse { holder, .. } if *holder == child_pid),
                "{err:?}"
            );
            checked_lock = true;
        }
    }
    child.kill().expect("SIGKILL the writer");
    // Acks printed before the kill count too.
    for line in lines {
        if let Some(seq) = line.expect("child stdout").strip_prefix("ack ") {
            acked.push(seq.parse::<u64>().expect("a seq"));
        }
    }
    let status = child.wait().expect("reap the writer");
    assert!(
        acked.len() >= ACKS_BEFORE_KILL,
        "the writer stopped after {} acks ({status})",
        acked.len()
    );

    let store = SqliteStore::open(dir.path()).expect("reopen after the kill");
    let last_seq = store.last_seq().expect("last_seq");
    let records = store.read_after(0, usize::MAX).expect("read");
    assert_eq!(seqs(&records), (1..=last_seq).collect::<Vec<_>>(), "gap-free from 1");
    let max_acked = acked.iter().copied().max().expect("acks");
    assert!(last_seq >= max_acked, "acked {max_acked}, stored only through {last_seq}");
    assert_eq!(acked, (1..=max_acked).collect::<Vec<_>>(), "acks in order, each once");
}

/// The child: appends batches of 1 and 3 records and prints every acknowledged seq, until killed
/// (or until the parent goes away and stdout breaks).
fn write_until_killed(dir: &Path) {
    let mut store = SqliteStore::open(dir).expect("writer opens the store");
    let mut stdout = std::io::stdout().lock();
    // libtest's "test … ... " has no newline yet: start the acks on a line of their own.
    if writeln!(stdout).is_err() {
        return;
    }
    for iteration in 0..1_000_000_u64 {
        let bodies: Vec<String> = (0..1 + 2 * (iteration % 2))
            .map(|i| format!(r#"{{"iteration":{iteration},"i":{i}}}"#))
            .collect();
        let batch: Vec<NewRecord<'_>> =
            bodies.iter().map(|body| NewRecord { at_ms: iteration, kind: "test", body }).collect();
        let last = store.append(&batch).expect("writer appends");
        for seq in last + 1 - batch.len() as u64..=last {
            if writeln!(stdout, "ack {seq}").and_then(|()| stdout.flush()).is_err() {
                return;
            }
        }
    }
}

/// Appends per second on a real file system (the target dir, not tmpfs). Only prints.
#[test]
#[allow(clippy::print_stderr)] // the measurement is the output
fn append_rate() {
    if std::env::var_os("ALLOT_SLOW_TESTS").is_none() {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let mut store = SqliteStore::open(dir.path()).expect("open");
    let body = r#"{"kind":"workload_submitted","at_ms":1700000000000,"workload":{"name":"train-42","project":"vision","gpus":4,"priority":"high"}}"#;

    let singles = 500;
    let seconds = timed(|| {
        for i in 0..singles {
            store
                .append(&[NewRecord { at_ms: i, kind: "workload_submitted", body }])
                .expect("append");
        }
    });
    eprintln!(
        "single-record appends: {:.0} appends/s ({singles} in {seconds:.2} s)",
        singles as f64 / seconds
    );

    let batches = 100;
    let batch: Vec<NewRecord<'_>> =
        (0..100).map(|i| NewRecord { at_ms: i, kind: "workload_submitted", body }).collect();
    let seconds = timed(|| {
        for _ in 0..batches {
            store.append(&batch).expect("append batch");
        }
    });
    eprintln!(
        "100-record batches: {:.0} batches/s = {:.0} records/s ({batches} in {seconds:.2} s)",
        batches as f64 / seconds,
        (batches * 100) as f64 / seconds
    );
    eprintln!("in {}", dir.path().display());
}

#[allow(clippy::disallowed_methods)] // a throughput measurement needs the real clock
fn timed(work: impl FnOnce()) -> f64 {
    let start = std::time::Instant::now();
    work();
    start.elapsed().as_secs_f64()
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o7777
}

#[test]
fn the_data_directory_is_private_from_the_first_write() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("nested").join("data");
    let mut store = SqliteStore::open(&dir).expect("open");
    store.append(&[record(1, "Submitted", "{}")]).expect("append");
    assert_eq!(mode_of(&dir), 0o700, "the data directory");
    for name in [DB_FILE_NAME, "allot.db-wal", "allot.db-shm", LOCK_FILE_NAME] {
        let path = dir.join(name);
        assert!(path.exists(), "{name} exists after a write");
        assert_eq!(mode_of(&path), 0o600, "{name}");
    }
    assert!(store.tightened().is_empty(), "nothing needed tightening: {:?}", store.tightened());
}

#[test]
fn a_data_directory_left_readable_is_tightened_and_said() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    drop(SqliteStore::open(&dir).expect("first open"));
    // What an older allot left: 755 and 644.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(dir.join(DB_FILE_NAME), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let store = SqliteStore::open(&dir).expect("second open");
    assert_eq!(mode_of(&dir), 0o700);
    assert_eq!(mode_of(&dir.join(DB_FILE_NAME)), 0o600);
    assert_eq!(store.tightened(), [dir.clone(), dir.join(DB_FILE_NAME)]);
}
