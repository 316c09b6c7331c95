//! [`SqliteStore`]: the store in one SQLite file, `allot.db`, in write-ahead-log mode with
//! `synchronous=FULL`, so that a commit is on disk when it returns.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::{NewRecord, Record, Snapshot, Store, StoreError, TokenRecord, to_i64};

/// The database file inside the data directory.
pub const DB_FILE_NAME: &str = "allot.db";
/// The lock file inside the data directory; holds the pid of the daemon that has it.
pub const LOCK_FILE_NAME: &str = "allot.lock";
/// The schema this build writes: the number of [`MIGRATIONS`] steps.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Marks the file as allot's (`PRAGMA application_id`): "allt".
const APPLICATION_ID: i32 = 0x616c_6c74;
/// How long a statement waits for another connection's lock (an admin command while the daemon
/// runs) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Step `i` takes the schema from version `i` to `i + 1` (`PRAGMA user_version`). Append only;
/// never edit a released step.
const MIGRATIONS: &[&str] = &[
    // 1: the log, snapshots, tokens, metadata.
    "CREATE TABLE log_head (
         id INTEGER PRIMARY KEY CHECK (id = 1),
         last_seq INTEGER NOT NULL CHECK (last_seq >= 0)
     ) STRICT;
     INSERT INTO log_head (id, last_seq) VALUES (1, 0);
     CREATE TABLE log (
         seq INTEGER PRIMARY KEY CHECK (seq > 0),
         at_ms INTEGER NOT NULL,
         kind TEXT NOT NULL,
         body TEXT NOT NULL
     ) STRICT;
     CREATE TABLE snapshots (
         seq INTEGER PRIMARY KEY CHECK (seq >= 0),
         at_ms INTEGER NOT NULL,
         body TEXT NOT NULL
     ) STRICT;
     CREATE TABLE tokens (
         id TEXT PRIMARY KEY,
         hash TEXT NOT NULL UNIQUE,
         role TEXT NOT NULL,
         name TEXT NOT NULL,
         created_ms INTEGER NOT NULL,
         revoked INTEGER NOT NULL CHECK (revoked IN (0, 1))
     ) STRICT;
     CREATE TABLE token_projects (
         token_id TEXT NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
         position INTEGER NOT NULL,
         project TEXT NOT NULL,
         PRIMARY KEY (token_id, position)
     ) STRICT;
     CREATE TABLE meta (
         key TEXT PRIMARY KEY,
         value TEXT NOT NULL
     ) STRICT;",
];

/// The store in `dir/allot.db`. [`SqliteStore::open`] also holds `dir/allot.lock` for the
/// lifetime of the value, so that two daemons cannot share a data directory.
#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    /// Held only for its lock, released when dropped (or when the process dies).
    _lock: Option<File>,
    tightened: Vec<PathBuf>,
}

impl SqliteStore {
    /// Opens (creating the directory and file if missing) the store of a daemon: takes the
    /// exclusive lock on `dir/allot.lock` and writes our pid into it, then opens the database
    /// and brings its schema up to date.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let tightened = create_dir(dir)?;
        let lock = lock_data_dir(dir)?;
        let mut store = Self::open_db(dir, Some(lock))?;
        store.tightened = tightened;
        Ok(store)
    }

    /// Opens the store without the lock, for offline admin commands (`allot token create
    /// --data-dir D`) that may run while the daemon does; SQLite serialises the writes, waiting up
    /// to 5 s for the other side.
    pub fn open_unlocked(dir: &Path) -> Result<Self, StoreError> {
        create_dir(dir)?;
        Self::open_db(dir, None)
    }

    /// What [`SqliteStore::open`] found readable by other accounts and made private, for the
    /// daemon to say so.
    pub fn tightened(&self) -> &[PathBuf] {
        &self.tightened
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_db(dir: &Path, lock: Option<File>) -> Result<Self, StoreError> {
        let path = dir.join(DB_FILE_NAME);
        let conn = Connection::open(&path)
            .map_err(|source| StoreError::Open { path: path.clone(), source })?;
        let mut store = Self { conn, path, _lock: lock, tightened: Vec::new() };
        store.configure()?;
        store.migrate()?;
        Ok(store)
    }

    fn configure(&mut self) -> Result<(), StoreError> {
        self.conn.busy_timeout(BUSY_TIMEOUT).map_err(self.err("setting the busy timeout"))?;
        // The first statement that reads the file: a file that is not a database fails here.
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(self.err("switching to write-ahead logging"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NoWal { path: self.path.clone(), mode });
        }
        self.conn
            .pragma_update(None, "synchronous", "FULL")
            .map_err(self.err("setting synchronous=FULL"))?;
        self.conn
            .pragma_update(None, "foreign_keys", true)
            .map_err(self.err("enabling foreign keys"))?;
        Ok(())
    }

    /// Applies the missing [`MIGRATIONS`] steps, each in its own transaction together with the
    /// new `user_version`; refuses a newer schema and another program's database.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let path = path.as_path();
        let err = |action| move |source| classify(path, action, source);
        // IMMEDIATE: a concurrent opener (daemon and admin command) waits instead of migrating
        // the same step twice.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err("starting the schema check"))?;
        let found: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(err("reading the schema version"))?;
        let application_id: i32 = tx
            .pragma_query_value(None, "application_id", |row| row.get(0))
            .map_err(err("reading the application id"))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found < 0 {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("schema version {found}"),
            });
        }
        if application_id != APPLICATION_ID && application_id != 0 {
            return Err(StoreError::ForeignDatabase {
                path: self.path.clone(),
                detail: format!("application id {application_id:#x}"),
            });
        }
        if found == 0 {
            let tables: i64 = tx
                .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
                .map_err(err("reading the table list"))?;
            if tables > 0 {
                return Err(StoreError::ForeignDatabase {
                    path: self.path.clone(),
                    detail: format!("{tables} tables but no allot schema version"),
                });
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(err("setting the application id"))?;
        }
        // `found` is within 0..=SCHEMA_VERSION, checked above.
        let done = usize::try_from(found).unwrap_or(MIGRATIONS.len());
        for (step, sql) in MIGRATIONS.iter().enumerate().skip(done) {
            tx.execute_batch(sql).map_err(err("migrating the schema"))?;
            tx.pragma_update(None, "user_version", step as i64 + 1)
                .map_err(err("setting the schema version"))?;
        }
        tx.commit().map_err(err("committing the schema"))
    }

    /// Maps an SQLite error of `action` to a [`StoreError`] naming our file.
    fn err(&self, action: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + use<> {
        let path = self.path.clone();
        move |source| classify(&path, action, source)
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), detail }
    }

    fn to_u64(&self, field: &str, value: i64) -> Result<u64, StoreError> {
        u64::try_from(value).map_err(|_| self.corrupt(format!("{field} = {value}")))
    }

    fn token_projects(&self, token_id: &str) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT project FROM token_projects WHERE token_id = ?1 ORDER BY position",
            )
            .map_err(self.err("reading token projects"))?;
        let rows = stmt
            .query_map([token_id], |row| row.get(0))
            .map_err(self.err("reading token projects"))?;
        rows.collect::<Result<Vec<String>, _>>().map_err(self.err("reading token projects"))
    }

    fn token_from_row(&self, row: TokenRow) -> Result<TokenRecord, StoreError> {
        let projects = self.token_projects(&row.id)?;
        Ok(TokenRecord {
            created_ms: self.to_u64("tokens.created_ms", row.created_ms)?,
            revoked: row.revoked != 0,
            projects,
            id: row.id,
            hash: row.hash,
            role: row.role,
            name: row.name,
        })
    }

    fn latest_snapshot_seq(conn: &Connection) -> rusqlite::Result<Option<i64>> {
        conn.query_row("SELECT max(seq) FROM snapshots", [], |row| row.get(0))
    }

    fn read_last_seq(conn: &Connection) -> rusqlite::Result<i64> {
        conn.query_row("SELECT last_seq FROM log_head WHERE id = 1", [], |row| row.get(0))
    }
}

/// A token's columns as stored.
struct TokenRow {
    id: String,
    hash: String,
    role: String,
    name: String,
    created_ms: i64,
    revoked: i64,
}

const TOKEN_COLUMNS: &str = "id, hash, role, name, created_ms, revoked";

fn token_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<TokenRow> {
    Ok(TokenRow {
        id: row.get(0)?,
        hash: row.get(1)?,
        role: row.get(2)?,
        name: row.get(3)?,
        created_ms: row.get(4)?,
        revoked: row.get(5)?,
    })
}

impl Store for SqliteStore {
    fn append(&mut self, records: &[NewRecord<'_>]) -> Result<u64, StoreError> {
        let err = self.err("appending to the log");
        let tx =
            self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let mut last_seq = Self::read_last_seq(&tx).map_err(&err)?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO log (seq, at_ms, kind, body) VALUES (?1, ?2, ?3, ?4)")
                .map_err(&err)?;
            for record in records {
                last_seq = last_seq
                    .checked_add(1)
                    .ok_or(StoreError::OutOfRange { field: "seq", value: u64::MAX })?;
                let at_ms = to_i64("at_ms", record.at_ms)?;
                insert.execute(params![last_seq, at_ms, record.kind, record.body]).map_err(&err)?;
            }
        }
        tx.execute("UPDATE log_head SET last_seq = ?1 WHERE id = 1", [last_seq]).map_err(&err)?;
        tx.commit().map_err(&err)?;
        self.to_u64("log_head.last_seq", last_seq)
    }

    fn last_seq(&self) -> Result<u64, StoreError> {
        let last_seq = Self::read_last_seq(&self.conn).map_err(self.err("reading the last seq"))?;
        self.to_u64("log_head.last_seq", last_seq)
    }

    fn read_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        let err = self.err("reading the log");
        // Beyond i64 there is nothing stored; beyond i64 rows there is nothing to return.
        let Ok(after_seq) = i64::try_from(after_seq) else { return Ok(Vec::new()) };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, at_ms, kind, body FROM log WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )
            .map_err(&err)?;
        let rows = stmt
            .query_map([after_seq, limit], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get(2)?, row.get(3)?))
            })
            .map_err(&err)?;
        let mut records = Vec::new();
        for row in rows {
            let (seq, at_ms, kind, body) = row.map_err(&err)?;
            records.push(Record {
                seq: self.to_u64("log.seq", seq)?,
                at_ms: self.to_u64("log.at_ms", at_ms)?,
                kind,
                body,
            });
        }
        Ok(records)
    }

    fn put_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let err = self.err("writing a snapshot");
        let at_ms = to_i64("at_ms", snapshot.at_ms)?;
        let tx =
            self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let last_seq = Self::read_last_seq(&tx).map_err(&err)?;
        let seq = match i64::try_from(snapshot.seq) {
            Ok(seq) if seq <= last_seq => seq,
            _ => {
                let last_seq = u64::try_from(last_seq).unwrap_or(0);
                return Err(StoreError::SnapshotAhead { seq: snapshot.seq, last_seq });
            }
        };
        tx.execute(
            "INSERT INTO snapshots (seq, at_ms, body) VALUES (?1, ?2, ?3)
             ON CONFLICT (seq) DO UPDATE SET at_ms = excluded.at_ms, body = excluded.body",
            params![seq, at_ms, snapshot.body],
        )
        .map_err(&err)?;
        tx.commit().map_err(&err)
    }

    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        let row = self
            .conn
            .query_row(
                "SELECT seq, at_ms, body FROM snapshots ORDER BY seq DESC LIMIT 1",
                [],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(self.err("reading the latest snapshot"))?;
        row.map(|(seq, at_ms, body)| {
            Ok(Snapshot {
                seq: self.to_u64("snapshots.seq", seq)?,
                at_ms: self.to_u64("snapshots.at_ms", at_ms)?,
                body,
            })
        })
        .transpose()
    }

    fn compact_through(&mut self, seq: u64) -> Result<u64, StoreError> {
        let err = self.err("compacting the log");
        let tx =
            self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let snapshot_seq = Self::latest_snapshot_seq(&tx).map_err(&err)?;
        // Snapshots never exceed i64, so a `seq` beyond it is never covered.
        let through = match (snapshot_seq, i64::try_from(seq)) {
            (Some(snapshot), Ok(through)) if snapshot >= through => through,
            _ => {
                let snapshot_seq = snapshot_seq.and_then(|s| u64::try_from(s).ok());
                return Err(StoreError::CompactBeyondSnapshot { seq, snapshot_seq });
            }
        };
        let removed = tx.execute("DELETE FROM log WHERE seq <= ?1", [through]).map_err(&err)?;
        tx.execute("DELETE FROM snapshots WHERE seq < ?1", [through]).map_err(&err)?;
        tx.commit().map_err(&err)?;
        Ok(removed as u64)
    }

    fn put_token(&mut self, token: &TokenRecord) -> Result<(), StoreError> {
        let err = self.err("writing a token");
        let created_ms = to_i64("created_ms", token.created_ms)?;
        let tx =
            self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&err)?;
        let other_id: Option<String> = tx
            .query_row(
                "SELECT id FROM tokens WHERE hash = ?1 AND id <> ?2",
                [&token.hash, &token.id],
                |row| row.get(0),
            )
            .optional()
            .map_err(&err)?;
        if other_id.is_some() {
            return Err(StoreError::DuplicateTokenHash { id: token.id.clone(), other_id });
        }
        // An upsert, not INSERT OR REPLACE: a replace deletes the row first, which would cascade
        // to its projects mid-statement.
        tx.execute(
            "INSERT INTO tokens (id, hash, role, name, created_ms, revoked)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET hash = excluded.hash, role = excluded.role,
                 name = excluded.name, created_ms = excluded.created_ms, revoked = excluded.revoked",
            params![token.id, token.hash, token.role, token.name, created_ms, token.revoked],
        )
        .map_err(&err)?;
        tx.execute("DELETE FROM token_projects WHERE token_id = ?1", [&token.id]).map_err(&err)?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO token_projects (token_id, position, project) VALUES (?1, ?2, ?3)",
                )
                .map_err(&err)?;
            for (position, project) in token.projects.iter().enumerate() {
                insert.execute(params![token.id, position as i64, project]).map_err(&err)?;
            }
        }
        tx.commit().map_err(&err)
    }

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        let row = self
            .conn
            .query_row(
                &format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?1"),
                [hash],
                token_row,
            )
            .optional()
            .map_err(self.err("reading a token"))?;
        row.map(|row| self.token_from_row(row)).transpose()
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let err = self.err("reading tokens");
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_ms, id"))
            .map_err(&err)?;
        let rows = stmt.query_map([], token_row).map_err(&err)?;
        let rows = rows.collect::<Result<Vec<_>, _>>().map_err(&err)?;
        rows.into_iter().map(|row| self.token_from_row(row)).collect()
    }

    fn revoke_token(&mut self, id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn
            .execute("UPDATE tokens SET revoked = 1 WHERE id = ?1", [id])
            .map_err(self.err("revoking a token"))?;
        Ok(changed > 0)
    }

    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| row.get(0))
            .optional()
            .map_err(self.err("reading metadata"))
    }

    fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [key, value],
            )
            .map_err(self.err("writing metadata"))?;
        Ok(())
    }
}

/// Sorts SQLite's failures into the ones a user can act on.
fn classify(path: &Path, action: &'static str, source: rusqlite::Error) -> StoreError {
    let path = path.to_path_buf();
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            StoreError::NotADatabase { path, source }
        }
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            StoreError::Open { path, source }
        }
        _ => StoreError::Sqlite { path, action, source },
    }
}

/// Creates the data directory private (`0700`) and keeps it so: the database holds every
/// workload's command line and environment and the token hashes. A directory or file left wider
/// (by an older allot, or by hand) is tightened; one we cannot change is refused.
/// `allot.db` is made `0600` before SQLite first opens it, so that its `-wal` and `-shm` files,
/// which SQLite creates with the database's mode, are private from the first write.
fn create_dir(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| StoreError::CreateDir { dir: dir.to_path_buf(), source })?;
    let mut tightened = Vec::new();
    make_private(dir, 0o700, &mut tightened)?;
    let db = dir.join(DB_FILE_NAME);
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&db)
        .map_err(|source| StoreError::CreateDir { dir: db.clone(), source })?;
    for name in [DB_FILE_NAME, WAL_FILE_NAME, SHM_FILE_NAME, LOCK_FILE_NAME] {
        let path = dir.join(name);
        if path.exists() {
            make_private(&path, 0o600, &mut tightened)?;
        }
    }
    Ok(tightened)
}

const WAL_FILE_NAME: &str = "allot.db-wal";
const SHM_FILE_NAME: &str = "allot.db-shm";

/// Narrows `path` to `want` when group or others have any access; records what it changed.
fn make_private(path: &Path, want: u32, tightened: &mut Vec<PathBuf>) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|source| StoreError::CreateDir { dir: path.to_path_buf(), source })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)).map_err(|source| {
        StoreError::NotPrivate { path: path.to_path_buf(), mode, want, source }
    })?;
    tightened.push(path.to_path_buf());
    Ok(())
}

/// Takes the exclusive lock on `dir/allot.lock` and writes our pid into it. The lock is the
/// operating system's (flock on Unix), so it goes away with the process, however that ends.
fn lock_data_dir(dir: &Path) -> Result<File, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let lock = dir.join(LOCK_FILE_NAME);
    let lock_err = |source| StoreError::LockFile { path: lock.clone(), source };
    // Not truncated on open: the pid in it belongs to the holder until we have the lock.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock)
        .map_err(lock_err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            // The pid is only for the message; an unreadable file still means "in use".
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "unknown".to_owned(),
                pid => pid.to_owned(),
            };
            return Err(StoreError::InUse { dir: dir.to_path_buf(), lock, holder });
        }
        Err(TryLockError::Error(source)) => return Err(lock_err(source)),
    }
    file.set_len(0).map_err(lock_err)?;
    file.seek(SeekFrom::Start(0)).map_err(lock_err)?;
    writeln!(file, "{}", std::process::id()).map_err(lock_err)?;
    file.flush().map_err(lock_err)?;
    Ok(file)
}
