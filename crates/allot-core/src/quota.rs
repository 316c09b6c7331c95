//! Quota book: guarantees, borrowing and lending inside a cohort.
//!
//! Semantics follow Kueue's flat cohorts (shared/docs/reference/kueue-semantics.md §1.1):
//! a line with a lend limit L keeps `guaranteed − L` for itself alone (its *local* part); the
//! rest of its guarantee is pooled in the cohort. Usage fills the local part first; only the
//! excess draws on the pool. A line may draw from the pool at most its own contribution plus
//! its borrow limit. A project without a cohort is a cohort of one.

use std::collections::BTreeMap;

use crate::decision::QuotaKey;
use crate::ids::{ProjectId, Shares};

#[derive(Clone, Debug)]
pub(crate) struct QuotaLine {
    pub guaranteed: Shares,
    pub borrow_limit: Option<Shares>,
    pub lend_limit: Option<Shares>,
    pub used: Shares,
}

impl QuotaLine {
    /// The part of the guarantee nobody else may borrow.
    pub fn local(&self) -> Shares {
        match self.lend_limit {
            Some(l) => self.guaranteed.saturating_sub(l),
            None => Shares::ZERO,
        }
    }
    /// What this line puts into the cohort pool.
    pub fn contribution(&self) -> Shares {
        self.guaranteed.saturating_sub(self.local())
    }
    /// What this line's usage takes from the cohort pool.
    pub fn pool_use(&self) -> Shares {
        self.used.saturating_sub(self.local())
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    pub contributed: Shares,
    pub used: Shares,
}

#[derive(Clone, Debug)]
pub(crate) struct QuotaBook {
    /// Per project, per key.
    pub lines: Vec<BTreeMap<QuotaKey, QuotaLine>>,
    pub cohort_of: Vec<usize>,
    /// Per cohort, per key.
    pub pools: Vec<BTreeMap<QuotaKey, Pool>>,
}

/// Quota state for one request on one line, for decisions and explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QuotaView {
    pub used: Shares,
    pub guaranteed: Shares,
    pub available: Shares,
    pub max: Shares,
    pub borrow_limited: bool,
}

impl QuotaBook {
    pub fn new(lines: Vec<BTreeMap<QuotaKey, QuotaLine>>, cohort_of: Vec<usize>) -> QuotaBook {
        let cohorts = cohort_of.iter().copied().max().map_or(0, |m| m + 1);
        let mut pools: Vec<BTreeMap<QuotaKey, Pool>> = vec![BTreeMap::new(); cohorts];
        for (p, project_lines) in lines.iter().enumerate() {
            for (key, line) in project_lines {
                let pool = pools[cohort_of[p]].entry(*key).or_default();
                pool.contributed = pool.contributed.saturating_add(line.contribution());
                pool.used = pool.used.saturating_add(line.pool_use());
            }
        }
        QuotaBook { lines, cohort_of, pools }
    }

    /// The line a workload of `project` is charged to on `model`: its own line for the model,
    /// else its "any" line, else none (the project may not use that model).
    pub fn resolve(&self, project: ProjectId, model: QuotaKey) -> Option<QuotaKey> {
        let lines = &self.lines[project.0 as usize];
        if lines.contains_key(&model) {
            Some(model)
        } else if lines.contains_key(&QuotaKey::Any) {
            Some(QuotaKey::Any)
        } else {
            None
        }
    }

    pub fn line(&self, project: ProjectId, key: QuotaKey) -> Option<&QuotaLine> {
        self.lines[project.0 as usize].get(&key)
    }

    pub fn view(&self, project: ProjectId, key: QuotaKey) -> Option<QuotaView> {
        let line = self.line(project, key)?;
        let pool = self.pools[self.cohort_of[project.0 as usize]].get(&key)?;
        let local_free = line.local().saturating_sub(line.used);
        let pool_free = pool.contributed.saturating_sub(pool.used);
        let (from_pool, borrow_limited) = match line.borrow_limit {
            Some(bl) => {
                let cap = line.contribution().saturating_add(bl).saturating_sub(line.pool_use());
                (pool_free.min(cap), cap < pool_free)
            }
            None => (pool_free, false),
        };
        let max_pool = match line.borrow_limit {
            Some(bl) => pool.contributed.min(line.contribution().saturating_add(bl)),
            None => pool.contributed,
        };
        Some(QuotaView {
            used: line.used,
            guaranteed: line.guaranteed,
            available: local_free.saturating_add(from_pool),
            max: line.local().saturating_add(max_pool),
            borrow_limited,
        })
    }

    pub fn charge(&mut self, project: ProjectId, key: QuotaKey, amount: Shares) {
        self.adjust(project, key, |used| used.saturating_add(amount));
    }

    pub fn release(&mut self, project: ProjectId, key: QuotaKey, amount: Shares) {
        self.adjust(project, key, |used| used.saturating_sub(amount));
    }

    fn adjust(&mut self, project: ProjectId, key: QuotaKey, f: impl FnOnce(Shares) -> Shares) {
        let cohort = self.cohort_of[project.0 as usize];
        let Some(line) = self.lines[project.0 as usize].get_mut(&key) else { return };
        let before = line.pool_use();
        line.used = f(line.used);
        let after = line.pool_use();
        if let Some(pool) = self.pools[cohort].get_mut(&key) {
            pool.used = pool.used.saturating_sub(before).saturating_add(after);
        }
    }
}
