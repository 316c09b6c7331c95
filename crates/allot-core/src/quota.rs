//! Quota book: guarantees, borrowing and lending in a tree of cohorts.
//!
//! Semantics follow Kueue's cohorts, flat and hierarchical
//! (shared/docs/reference/kueue-semantics.md §1.1, Kueue's `resource_node.go`). Every node —
//! a project's line or a cohort's pool for the same key — has a **subtree quota**: a line its
//! guarantee; a pool its cohort's own quota plus what its children put into it. A node with a
//! lend limit L keeps `subtree − L` for itself alone (its *local* part); the rest is pooled in
//! its parent. Usage fills the local part first; only the excess counts as usage of the parent,
//! and so on up. A node may draw from its parent at most what it put in plus its borrow limit.
//! The root pool's subtree quota is all there is. A project without a cohort is a cohort of
//! one; a cohort without a parent is a root.

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

/// The part of `subtree` a node with lend limit `lend` keeps for itself alone.
fn local_of(subtree: Shares, lend: Option<Shares>) -> Shares {
    lend.map_or(Shares::ZERO, |l| subtree.saturating_sub(l))
}

impl QuotaLine {
    /// The part of the guarantee nobody else may borrow.
    pub fn local(&self) -> Shares {
        local_of(self.guaranteed, self.lend_limit)
    }
    /// What this line puts into its cohort's pool.
    pub fn contribution(&self) -> Shares {
        self.guaranteed.saturating_sub(self.local())
    }
    /// What this line's usage takes from its cohort's pool.
    pub fn pool_use(&self) -> Shares {
        self.used.saturating_sub(self.local())
    }
}

/// A cohort's quota for one key: what it holds of its own, with its limits toward its parent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CohortQuota {
    pub guaranteed: Shares,
    pub borrow_limit: Option<Shares>,
    pub lend_limit: Option<Shares>,
}

/// One cohort's pool for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pool {
    /// The cohort's own quota and limits (zero and none when it declares none).
    pub own: CohortQuota,
    /// Own quota plus what the children put in.
    pub subtree: Shares,
    /// What the children's usage takes from it.
    pub used: Shares,
}

impl Pool {
    fn local(&self) -> Shares {
        local_of(self.subtree, self.own.lend_limit)
    }
    /// What this pool's usage takes from its parent.
    fn parent_use(&self) -> Shares {
        self.used.saturating_sub(self.local())
    }
    /// What this pool puts into its parent.
    fn contribution(&self) -> Shares {
        self.subtree.saturating_sub(self.local())
    }
}

#[derive(Clone, Debug)]
pub(crate) struct QuotaBook {
    /// Per project, per key.
    pub lines: Vec<BTreeMap<QuotaKey, QuotaLine>>,
    pub cohort_of: Vec<usize>,
    /// Per cohort: its parent cohort.
    pub parent: Vec<Option<usize>>,
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

/// One level of the tree that lends to a line that borrows (`QuotaBook::borrowing_path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lender {
    pub cohort: usize,
    /// What the level below takes from this cohort's pool beyond what it put in.
    pub lent: Shares,
}

impl QuotaBook {
    /// `parent[c]` must form a forest (the engine checks there is no cycle); `own[c]` is each
    /// cohort's own quota per key.
    pub fn new(
        lines: Vec<BTreeMap<QuotaKey, QuotaLine>>,
        cohort_of: Vec<usize>,
        parent: Vec<Option<usize>>,
        own: Vec<BTreeMap<QuotaKey, CohortQuota>>,
    ) -> QuotaBook {
        let cohorts = parent.len();
        let mut pools: Vec<BTreeMap<QuotaKey, Pool>> = vec![BTreeMap::new(); cohorts];
        for (c, quotas) in own.iter().enumerate() {
            for (key, q) in quotas {
                pools[c].insert(*key, Pool { own: *q, subtree: q.guaranteed, used: Shares::ZERO });
            }
        }
        let mut book = QuotaBook { lines, cohort_of, parent, pools };
        // Children before parents: a cohort's depth below its root, deepest first.
        let depth = |mut c: usize| {
            let mut d = 0;
            while let Some(p) = book.parent[c] {
                c = p;
                d += 1;
            }
            d
        };
        let mut order: Vec<usize> = (0..cohorts).collect();
        order.sort_by_key(|&c| std::cmp::Reverse(depth(c)));
        for (p, project_lines) in book.lines.iter().enumerate() {
            let c = book.cohort_of[p];
            for (key, line) in project_lines {
                let pool = book.pools[c].entry(*key).or_default();
                pool.subtree = pool.subtree.saturating_add(line.contribution());
                pool.used = pool.used.saturating_add(line.pool_use());
            }
        }
        for c in order {
            let Some(up) = book.parent[c] else { continue };
            let child: Vec<(QuotaKey, Shares, Shares)> = book.pools[c]
                .iter()
                .map(|(k, pool)| (*k, pool.contribution(), pool.parent_use()))
                .collect();
            for (key, contribution, used) in child {
                let pool = book.pools[up].entry(key).or_default();
                pool.subtree = pool.subtree.saturating_add(contribution);
                pool.used = pool.used.saturating_add(used);
            }
        }
        book
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

    /// Cohort `c` and the cohorts above it, nearest first (its root last).
    pub fn ancestors(&self, c: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(c), |&at| self.parent[at])
    }

    /// What cohort `c`'s pool for `key` can still give a child: its own free local part plus
    /// what its parent can give it, within its borrow limit; all that is left at a root.
    /// With whether a borrow limit on the way bound it.
    fn pool_available(&self, c: usize, key: QuotaKey) -> (Shares, bool) {
        let Some(pool) = self.pools[c].get(&key) else { return (Shares::ZERO, false) };
        let Some(up) = self.parent[c] else {
            return (pool.subtree.saturating_sub(pool.used), false);
        };
        let (mut from_parent, mut limited) = self.pool_available(up, key);
        if let Some(bl) = pool.own.borrow_limit {
            let cap = pool.contribution().saturating_add(bl).saturating_sub(pool.parent_use());
            if cap < from_parent {
                from_parent = cap;
                limited = true;
            }
        }
        (pool.local().saturating_sub(pool.used).saturating_add(from_parent), limited)
    }

    /// The most cohort `c`'s pool for `key` could ever give a child (nothing else used).
    pub fn pool_potential(&self, c: usize, key: QuotaKey) -> Shares {
        let Some(pool) = self.pools[c].get(&key) else { return Shares::ZERO };
        let Some(up) = self.parent[c] else { return pool.subtree };
        let most = pool.local().saturating_add(self.pool_potential(up, key));
        match pool.own.borrow_limit {
            Some(bl) => most.min(pool.subtree.saturating_add(bl)),
            None => most,
        }
    }

    pub fn view(&self, project: ProjectId, key: QuotaKey) -> Option<QuotaView> {
        let line = self.line(project, key)?;
        let c = self.cohort_of[project.0 as usize];
        self.pools[c].get(&key)?;
        let local_free = line.local().saturating_sub(line.used);
        let (pool_free, above_limited) = self.pool_available(c, key);
        let (from_pool, borrow_limited) = match line.borrow_limit {
            Some(bl) => {
                let cap = line.contribution().saturating_add(bl).saturating_sub(line.pool_use());
                (pool_free.min(cap), cap < pool_free || above_limited)
            }
            None => (pool_free, above_limited),
        };
        let potential = self.pool_potential(c, key);
        let max_pool = match line.borrow_limit {
            Some(bl) => potential.min(line.contribution().saturating_add(bl)),
            None => potential,
        };
        Some(QuotaView {
            used: line.used,
            guaranteed: line.guaranteed,
            available: local_free.saturating_add(from_pool),
            max: line.local().saturating_add(max_pool),
            borrow_limited,
        })
    }

    /// Who lends what to a line that borrows: its cohort, then each cohort above that itself
    /// takes more from its parent than it put in, with that excess. Empty when the line is
    /// within its guarantee.
    pub fn borrowing_path(&self, project: ProjectId, key: QuotaKey) -> Vec<Lender> {
        let Some(line) = self.line(project, key) else { return Vec::new() };
        let mut out = Vec::new();
        let mut lent = line.used.saturating_sub(line.guaranteed);
        let mut c = self.cohort_of[project.0 as usize];
        while lent > Shares::ZERO {
            out.push(Lender { cohort: c, lent });
            let (Some(pool), Some(up)) = (self.pools[c].get(&key), self.parent[c]) else { break };
            lent = pool.used.saturating_sub(pool.subtree);
            c = up;
        }
        out
    }

    pub fn charge(&mut self, project: ProjectId, key: QuotaKey, amount: Shares) {
        self.adjust(project, key, |used| used.saturating_add(amount));
    }

    pub fn release(&mut self, project: ProjectId, key: QuotaKey, amount: Shares) {
        self.adjust(project, key, |used| used.saturating_sub(amount));
    }

    /// Changes a line's usage and what each level above takes from its parent.
    fn adjust(&mut self, project: ProjectId, key: QuotaKey, f: impl FnOnce(Shares) -> Shares) {
        let Some(line) = self.lines[project.0 as usize].get_mut(&key) else { return };
        let (mut before, mut after) = (line.pool_use(), {
            line.used = f(line.used);
            line.pool_use()
        });
        let mut c = Some(self.cohort_of[project.0 as usize]);
        while let Some(at) = c {
            if before == after {
                break;
            }
            let Some(pool) = self.pools[at].get_mut(&key) else { break };
            let up_before = pool.parent_use();
            pool.used = pool.used.saturating_sub(before).saturating_add(after);
            (before, after) = (up_before, pool.parent_use());
            c = self.parent[at];
        }
    }
}
