//! [`MemoryStore`]: the store's semantics in memory, for tests.

use std::collections::BTreeMap;

use crate::{NewRecord, Record, Snapshot, Store, StoreError, TokenRecord, to_i64};

/// Holds everything in ordered maps; nothing survives the value. Same rules and errors as
/// [`crate::SqliteStore`], including the i64 range of numbers.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    last_seq: u64,
    log: BTreeMap<u64, Record>,
    snapshots: BTreeMap<u64, Snapshot>,
    tokens: BTreeMap<String, TokenRecord>,
    meta: BTreeMap<String, String>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn append(&mut self, records: &[NewRecord<'_>]) -> Result<u64, StoreError> {
        // Check everything first so that a refused batch leaves nothing behind.
        let last_seq = self.last_seq + records.len() as u64;
        to_i64("seq", last_seq)?;
        for record in records {
            to_i64("at_ms", record.at_ms)?;
        }
        for (seq, record) in (self.last_seq + 1..).zip(records) {
            let record = Record {
                seq,
                at_ms: record.at_ms,
                kind: record.kind.to_owned(),
                body: record.body.to_owned(),
            };
            self.log.insert(seq, record);
        }
        self.last_seq = last_seq;
        Ok(last_seq)
    }

    fn last_seq(&self) -> Result<u64, StoreError> {
        Ok(self.last_seq)
    }

    fn read_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        let Some(first) = after_seq.checked_add(1) else { return Ok(Vec::new()) };
        Ok(self.log.range(first..).take(limit).map(|(_, r)| r.clone()).collect())
    }

    fn put_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError> {
        to_i64("at_ms", snapshot.at_ms)?;
        if snapshot.seq > self.last_seq {
            return Err(StoreError::SnapshotAhead { seq: snapshot.seq, last_seq: self.last_seq });
        }
        self.snapshots.insert(snapshot.seq, snapshot.clone());
        Ok(())
    }

    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        Ok(self.snapshots.last_key_value().map(|(_, s)| s.clone()))
    }

    fn compact_through(&mut self, seq: u64) -> Result<u64, StoreError> {
        let snapshot_seq = self.snapshots.last_key_value().map(|(s, _)| *s);
        if snapshot_seq.is_none_or(|s| s < seq) {
            return Err(StoreError::CompactBeyondSnapshot { seq, snapshot_seq });
        }
        let kept_log = match seq.checked_add(1) {
            Some(first_kept) => self.log.split_off(&first_kept),
            None => BTreeMap::new(),
        };
        let removed = std::mem::replace(&mut self.log, kept_log).len() as u64;
        self.snapshots = self.snapshots.split_off(&seq);
        Ok(removed)
    }

    fn put_token(&mut self, token: &TokenRecord) -> Result<(), StoreError> {
        to_i64("created_ms", token.created_ms)?;
        let clash = self.tokens.values().find(|t| t.hash == token.hash && t.id != token.id);
        if let Some(other) = clash {
            return Err(StoreError::DuplicateTokenHash {
                id: token.id.clone(),
                other_id: Some(other.id.clone()),
            });
        }
        self.tokens.insert(token.id.clone(), token.clone());
        Ok(())
    }

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        Ok(self.tokens.values().find(|t| t.hash == hash).cloned())
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let mut tokens: Vec<TokenRecord> = self.tokens.values().cloned().collect();
        // Ids are already ascending and the sort is stable.
        tokens.sort_by_key(|t| t.created_ms);
        Ok(tokens)
    }

    fn revoke_token(&mut self, id: &str) -> Result<bool, StoreError> {
        match self.tokens.get_mut(id) {
            Some(token) => {
                token.revoked = true;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.meta.get(key).cloned())
    }

    fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.meta.insert(key.to_owned(), value.to_owned());
        Ok(())
    }
}
