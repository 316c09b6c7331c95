//! Fair-share standing, read-only: what step 4 of the cycle orders projects by, per project,
//! so that people can see who goes next and why (`Engine::standings`).
//!
//! A project's **usage** is the shares it holds now plus its decayed average allocation (the
//! half-life is the policy's `fair_share_half_life_ms`); its **fair share** is its cohort's
//! total guarantee split by weight. **Standing** = usage / fair share: the lower, the sooner
//! its next workload is visited. Projects whose next workload fits in their guarantee are
//! visited before those that would borrow, whatever their standing.

use crate::ids::{ProjectId, Shares};

use super::Engine;

/// One project's place in the fair-share order at the engine's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    pub project: ProjectId,
    pub name: String,
    /// `None`: a cohort of its own.
    pub cohort: Option<String>,
    /// Its weight in its cohort (1000 = 1).
    pub weight_milli: u64,
    /// Its part of its cohort's weight, 0..=1 (1 when the cohort's weights sum to 0).
    pub weight_fraction: f64,
    /// Its fair share of the cohort, in shares.
    pub fair_share_shares: f64,
    /// Shares held now by its admitted workloads.
    pub allocated: Shares,
    /// Its decayed average allocation, in shares.
    pub decayed_shares: f64,
    /// Its part of its cohort's usage (held + decayed), 0..=1; `None` when the cohort uses
    /// nothing.
    pub usage_fraction: Option<f64>,
    /// Usage / fair share; `None` for weight 0 (always last).
    pub standing: Option<f64>,
    /// Its next workload fits in its guarantee (it goes before those that would borrow).
    pub head_within_guarantee: Option<bool>,
    /// 1-based place of its queue's head in the next cycle's project order; `None` with
    /// nothing pending.
    pub rank: Option<usize>,
    /// Workloads pending.
    pub pending: usize,
}

impl Engine {
    /// Every project's fair-share standing, in project order, with its rank among the projects
    /// that have pending work (the order `decide` visits them in, before any admission of the
    /// next cycle changes it). Costs one pass over the projects.
    pub fn standings(&self) -> Vec<Standing> {
        let cohorts = self.cohort_names.len();
        let mut cohort_weight = vec![0u64; cohorts];
        let mut cohort_usage = vec![0f64; cohorts];
        for p in &self.projects {
            cohort_weight[p.cohort] += p.weight_milli;
            cohort_usage[p.cohort] += p.allocated.0 as f64 + p.decayed_allocated;
        }
        let mut order: Vec<(super::queue::OrderKey, usize)> = Vec::new();
        let mut out: Vec<Standing> = self
            .projects
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let id = ProjectId(i as u32);
                let usage = p.allocated.0 as f64 + p.decayed_allocated;
                let head = self.queues[i].first_key_value().map(|(k, _)| k.2);
                let key = head.map(|h| self.project_order_key(id, h));
                if let Some(key) = key {
                    order.push((key, i));
                }
                Standing {
                    project: id,
                    name: p.name.clone(),
                    cohort: self.project_declared_cohort(id).map(str::to_string),
                    weight_milli: p.weight_milli,
                    weight_fraction: if cohort_weight[p.cohort] == 0 {
                        1.0
                    } else {
                        p.weight_milli as f64 / cohort_weight[p.cohort] as f64
                    },
                    fair_share_shares: p.fair_share,
                    allocated: p.allocated,
                    decayed_shares: p.decayed_allocated,
                    usage_fraction: (cohort_usage[p.cohort] > 0.0)
                        .then(|| usage / cohort_usage[p.cohort]),
                    standing: (p.weight_milli > 0).then(|| usage / p.fair_share.max(1.0)),
                    head_within_guarantee: key.map(|k| k.0 == 0),
                    rank: None,
                    pending: self.queues[i].len(),
                }
            })
            .collect();
        order.sort_unstable();
        for (rank, (_, i)) in order.into_iter().enumerate() {
            out[i].rank = Some(rank + 1);
        }
        out
    }
}
