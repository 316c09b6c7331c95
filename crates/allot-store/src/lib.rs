//! Durable state of the allot daemon: an append-only log of inputs, written before anything is
//! acknowledged; snapshots of the state as of a log record; API tokens; a little metadata.
//!
//! The store knows nothing of allot's types: record and snapshot bodies are opaque strings (JSON
//! by convention), kinds are free-form strings. [`SqliteStore`] is the real store, one file
//! `allot.db` in a data directory, guarded by `allot.lock` so that only one daemon uses it;
//! [`MemoryStore`] has the same semantics in memory, for tests. Both pass one contract suite
//! (`tests/store.rs`).
//!
//! Sequence numbers start at 1, increase by one per record and are never reused, not even after
//! [`Store::compact_through`] removed every record.

mod memory;
mod sqlite;

use std::ffi::OsStr;
use std::path::PathBuf;

pub use memory::MemoryStore;
pub use sqlite::{DB_FILE_NAME, LOCK_FILE_NAME, SCHEMA_VERSION, SqliteStore};

/// A record to append: the store assigns its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRecord<'a> {
    /// When the input arrived, ms since the Unix epoch (the caller's clock).
    pub at_ms: u64,
    /// What the body is, e.g. `"workload_submitted"`; opaque to the store.
    pub kind: &'a str,
    /// The input itself; opaque to the store.
    pub body: &'a str,
}

/// A record of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Position in the log: 1 for the first record ever appended, gap-free, increasing.
    pub seq: u64,
    pub at_ms: u64,
    pub kind: String,
    pub body: String,
}

/// The caller's state as of the record `seq` (inclusive): replay starts at `seq + 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub seq: u64,
    pub at_ms: u64,
    pub body: String,
}

/// An API token. The secret itself is never stored, only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Unique; the key of [`Store::put_token`] and [`Store::revoke_token`].
    pub id: String,
    /// Hex SHA-256 of the secret, computed by the caller; unique among tokens.
    pub hash: String,
    pub role: String,
    /// In the caller's order, which is kept.
    pub projects: Vec<String>,
    pub name: String,
    pub created_ms: u64,
    pub revoked: bool,
}

/// What went wrong; every message names the file or value and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Neither `$XDG_DATA_HOME` nor `$HOME` is set, so there is no default data directory.
    #[error(
        "no data directory: neither XDG_DATA_HOME nor HOME is set — pass --data-dir to a writable folder"
    )]
    NoDataDir,
    /// The data directory could not be created.
    #[error("cannot create data dir {dir}: {source} — pass --data-dir to a writable folder")]
    CreateDir { dir: PathBuf, source: std::io::Error },
    /// A part of the data directory other accounts could read, which could not be made private.
    #[error(
        "{path} is mode {mode:o}: other accounts could read the workloads' commands, tokens and logs, and it cannot be made private ({source}) — as its owner run `chmod {want:o} {path}`, or pass --data-dir to a folder of the daemon's own user"
    )]
    NotPrivate { path: PathBuf, mode: u32, want: u32, source: std::io::Error },
    /// The lock file could not be opened, locked or written.
    #[error("cannot use lock file {path}: {source} — pass --data-dir to a writable folder")]
    LockFile { path: PathBuf, source: std::io::Error },
    /// Another process holds the lock on the data directory.
    #[error(
        "data dir {dir} is in use by another allot (pid {holder} in {lock}) — stop that allot, or pass --data-dir to another folder"
    )]
    InUse { dir: PathBuf, lock: PathBuf, holder: String },
    /// The database file could not be opened or written (permissions, read-only file system).
    #[error("cannot open {path}: {source} — pass --data-dir to a writable folder")]
    Open { path: PathBuf, source: rusqlite::Error },
    /// The file is not an SQLite database, or is damaged.
    #[error(
        "{path} is not a readable allot database ({source}) — move it aside and restore a backup, or pass --data-dir to another folder"
    )]
    NotADatabase { path: PathBuf, source: rusqlite::Error },
    /// The file is an SQLite database of some other program.
    #[error(
        "{path} is an SQLite database of another program ({detail}) — pass --data-dir to a folder of allot's own"
    )]
    ForeignDatabase { path: PathBuf, detail: String },
    /// The database was written by a newer allot.
    #[error(
        "database {path} is newer than this allot (schema {found} > {supported}): upgrade allot"
    )]
    NewerSchema { path: PathBuf, found: i64, supported: i64 },
    /// SQLite refused write-ahead logging (typically a network file system).
    #[error(
        "cannot use write-ahead logging for {path} (journal mode stayed {mode}) — put the data dir on a local file system"
    )]
    NoWal { path: PathBuf, mode: String },
    /// Any other SQLite failure while doing `action`.
    #[error("{action} in {path} failed: {source}")]
    Sqlite { path: PathBuf, action: &'static str, source: rusqlite::Error },
    /// A stored value is impossible (e.g. a negative sequence number): the file was edited or
    /// damaged.
    #[error(
        "{path} holds an impossible value: {detail} — move it aside and restore a backup, or pass --data-dir to another folder"
    )]
    Corrupt { path: PathBuf, detail: String },
    /// A number is larger than the store can hold (SQLite integers are signed 64-bit).
    #[error("{field} = {value} is larger than the store can hold ({})", i64::MAX)]
    OutOfRange { field: &'static str, value: u64 },
    /// A snapshot claims a record that was never appended.
    #[error(
        "snapshot at seq {seq} is ahead of the log (last seq {last_seq}): snapshot only state that was appended"
    )]
    SnapshotAhead { seq: u64, last_seq: u64 },
    /// Compaction would drop records that no snapshot covers.
    #[error(
        "cannot compact through seq {seq}: the latest snapshot is {} — put a snapshot at seq {seq} or later first",
        match .snapshot_seq { Some(s) => format!("at seq {s}"), None => "missing".to_owned() }
    )]
    CompactBeyondSnapshot { seq: u64, snapshot_seq: Option<u64> },
    /// Another token already has this hash.
    #[error(
        "token {id}: another token{} has the same hash — generate a new secret",
        match .other_id { Some(o) => format!(" ({o})"), None => String::new() }
    )]
    DuplicateTokenHash { id: String, other_id: Option<String> },
}

/// The durable state of the daemon. Writes take `&mut self`: one writer per store value.
pub trait Store: Send {
    /// Appends `records` in one transaction and returns the seq of the last one (the current
    /// last seq when `records` is empty). When it returns `Ok` the records are durable
    /// (fsync'd); on `Err` none of them was appended.
    fn append(&mut self, records: &[NewRecord<'_>]) -> Result<u64, StoreError>;
    /// The seq of the last record ever appended, compacted or not; 0 when none was.
    fn last_seq(&self) -> Result<u64, StoreError>;
    /// Up to `limit` records with seq > `after_seq`, ascending. After compaction the first one
    /// returned may be later than `after_seq + 1`.
    fn read_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError>;
    /// Stores `snapshot`, replacing one at the same seq. Its seq must not be ahead of the log.
    fn put_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError>;
    /// The snapshot with the highest seq.
    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError>;
    /// Drops log records with seq <= `seq`, and the snapshots older than `seq` (nothing could be
    /// replayed onto them any more). Allowed only when a snapshot at or after `seq` exists.
    /// Returns the number of records removed. Seq numbering continues.
    fn compact_through(&mut self, seq: u64) -> Result<u64, StoreError>;
    /// Inserts the token or replaces the one with the same id.
    fn put_token(&mut self, token: &TokenRecord) -> Result<(), StoreError>;
    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError>;
    /// All tokens, revoked ones included, by creation time then id.
    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;
    /// Marks the token revoked; `false` when there is no token with this id. Revoking twice is
    /// not an error.
    fn revoke_token(&mut self, id: &str) -> Result<bool, StoreError>;
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError>;
    fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError>;
}

/// `$XDG_DATA_HOME/allot`, else `$HOME/.local/share/allot`.
pub fn default_data_dir() -> Result<PathBuf, StoreError> {
    data_dir_from(std::env::var_os("XDG_DATA_HOME").as_deref(), std::env::var_os("HOME").as_deref())
}

/// The XDG base-directory rule: a relative or empty `XDG_DATA_HOME` is ignored.
fn data_dir_from(
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Result<PathBuf, StoreError> {
    if let Some(xdg) = xdg_data_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Ok(xdg.join("allot"));
    }
    match home.filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/allot")),
        None => Err(StoreError::NoDataDir),
    }
}

/// SQLite integers are i64; both stores refuse larger values the same way.
fn to_i64(field: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { field, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_prefers_an_absolute_xdg_data_home() {
        let dir = data_dir_from(Some(OsStr::new("/x/data")), Some(OsStr::new("/home/u")));
        assert_eq!(dir.expect("xdg set"), PathBuf::from("/x/data/allot"));
    }

    #[test]
    fn data_dir_falls_back_to_home_when_xdg_is_missing_empty_or_relative() {
        for xdg in [None, Some(OsStr::new("")), Some(OsStr::new("rel/data"))] {
            let dir = data_dir_from(xdg, Some(OsStr::new("/home/u"))).expect("home set");
            assert_eq!(dir, PathBuf::from("/home/u/.local/share/allot"));
        }
    }

    #[test]
    fn data_dir_without_xdg_or_home_says_to_pass_data_dir() {
        let err = data_dir_from(None, Some(OsStr::new(""))).expect_err("nothing set");
        assert!(err.to_string().contains("--data-dir"), "{err}");
    }

    #[test]
    fn values_beyond_i64_are_refused() {
        assert_eq!(to_i64("at_ms", 5).expect("small"), 5);
        let err = to_i64("at_ms", u64::MAX).expect_err("too large");
        assert!(err.to_string().starts_with("at_ms = 18446744073709551615"), "{err}");
    }
}
