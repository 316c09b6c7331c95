//! The target workload placement measures fragmentation against, learned from submissions.
//!
//! FGD (and `allot`'s own policy, `packing::allot_score`) rate a placement by how much it
//! grows the *expected* fragmentation: the free GPU share that the workload to come could not
//! use. `sim pack` takes that workload from the whole trace; a live scheduler has no trace,
//! so the engine counts what is submitted — each member's (CPU, GPUs, share, accepted
//! models) — and keeps the most common classes until they cover 95 % of the count, as FGD's
//! artifact does with its trace.
//!
//! The mix changes the score of every node, so placement's cached scores start over when it
//! does. So it is reconsidered after 1, 2, 4, … 256 submissions and then every 256, each time
//! after the counts decay by 1/32 (it follows about the last 8,000 submissions), and taken
//! only when it moved: when the popularities differ from the active mix's by more than
//! [`MOVED`] in total variation. A steady demand keeps one mix and its cached scores. The
//! census is part of the saved state: a restored engine places exactly as the one that saved
//! it.

use std::collections::BTreeMap;

use crate::codec::codec_struct;
use crate::packing::{ModelSet, TargetClass, TargetMix};

/// One submission's member, as the target mix counts it. `gpus == 0`: CPU only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DemandClass {
    pub cpu_millis: u64,
    pub gpus: u8,
    /// Shares per GPU (1000 for whole GPUs).
    pub gpu_milli: u16,
    /// Accepted models as a `ModelSet` mask (all bits: any model).
    pub models: u64,
}

codec_struct!(DemandClass { cpu_millis, gpus, gpu_milli, models });

/// What one member adds to its class's count (the decay takes 1/32 of it, rounded down).
const WEIGHT: u64 = 32;
/// Total variation distance between the active mix and the census's past which the census's
/// is taken (sampling noise over a few thousand submissions of ~35 classes stays below it).
const MOVED: f64 = 0.1;
/// The mix is remade at most this many submissions apart.
const REFRESH_EVERY: u64 = 256;
/// The most common classes are kept until they cover this share of the count.
const COVERAGE: f64 = 0.95;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DemandCensus {
    counts: BTreeMap<DemandClass, u64>,
    since_refresh: u64,
    refreshes: u64,
    /// The classes and counts the active mix was made from.
    active: Vec<(DemandClass, u64)>,
}

codec_struct!(DemandCensus { counts, since_refresh, refreshes, active });

impl DemandCensus {
    /// Counts one valid submission of `members` members of `class`; true when the active
    /// mix was remade.
    pub fn note(&mut self, class: DemandClass, members: u32) -> bool {
        let entry = self.counts.entry(class).or_default();
        *entry = entry.saturating_add(WEIGHT.saturating_mul(u64::from(members)));
        self.since_refresh += 1;
        let due = REFRESH_EVERY.min(1 << self.refreshes.min(8));
        if self.since_refresh < due {
            return false;
        }
        self.since_refresh = 0;
        self.refreshes = self.refreshes.saturating_add(1);
        for count in self.counts.values_mut() {
            *count = *count * 31 / 32;
        }
        self.counts.retain(|_, count| *count > 0);
        let top = self.top_classes();
        if distance(&self.active, &top) <= MOVED {
            return false;
        }
        self.active = top;
        true
    }

    /// The most common classes covering [`COVERAGE`] of the count: most counted first, equal
    /// counts larger asks first (FGD's artifact's order), so the result does not depend on
    /// the map's order.
    fn top_classes(&self) -> Vec<(DemandClass, u64)> {
        let mut ranked: Vec<(DemandClass, u64)> =
            self.counts.iter().map(|(k, c)| (*k, *c)).collect();
        ranked.sort_by(|(ka, ca), (kb, cb)| cb.cmp(ca).then(kb.cmp(ka)));
        let total: u64 = ranked.iter().map(|(_, c)| c).sum();
        let mut covered = 0u64;
        let mut kept = Vec::new();
        for (class, count) in ranked {
            if covered as f64 >= COVERAGE * total as f64 {
                break;
            }
            covered += count;
            kept.push((class, count));
        }
        kept
    }

    /// The active target mix; `None` before the first submission.
    #[allow(clippy::cast_precision_loss)]
    pub fn mix(&self) -> Option<TargetMix> {
        let covered: u64 = self.active.iter().map(|(_, c)| c).sum();
        if covered == 0 {
            return None;
        }
        let classes = self
            .active
            .iter()
            .map(|(class, count)| TargetClass {
                cpu_milli: class.cpu_millis,
                gpus: class.gpus,
                gpu_milli: class.gpu_milli,
                models: ModelSet(class.models),
                popularity: *count as f64 / covered as f64,
            })
            .collect();
        Some(TargetMix::new(classes))
    }
}

/// Total variation distance between two mixes given as counts: half the summed difference of
/// their popularities over the classes of either (1 when one is empty and the other is not).
fn distance(a: &[(DemandClass, u64)], b: &[(DemandClass, u64)]) -> f64 {
    let total = |m: &[(DemandClass, u64)]| m.iter().map(|(_, c)| *c).sum::<u64>() as f64;
    let (ta, tb) = (total(a), total(b));
    if ta == 0.0 || tb == 0.0 {
        return if ta == tb { 0.0 } else { 1.0 };
    }
    let mut popularity: BTreeMap<DemandClass, (f64, f64)> = BTreeMap::new();
    for (class, count) in a {
        popularity.entry(*class).or_default().0 = *count as f64 / ta;
    }
    for (class, count) in b {
        popularity.entry(*class).or_default().1 = *count as f64 / tb;
    }
    popularity.values().map(|(pa, pb)| (pa - pb).abs()).sum::<f64>() / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(gpus: u8) -> DemandClass {
        DemandClass { cpu_millis: 4000, gpus, gpu_milli: 1000, models: u64::MAX }
    }

    #[test]
    fn a_steady_demand_keeps_its_first_mix() {
        let mut census = DemandCensus::default();
        let at: Vec<u32> = (1..=2000u32).filter(|_| census.note(class(1), 1)).collect();
        assert_eq!(at, vec![1]);
    }

    #[test]
    fn a_moved_demand_is_taken_on_the_doubling_schedule_then_every_256() {
        let mut census = DemandCensus::default();
        // Alternating halves: each check sees a mix far from the last one taken only while
        // the first class still dominates the counts.
        let at: Vec<u32> =
            (1..=1100u32).filter(|&i| census.note(class(if i < 8 { 1 } else { 2 }), 1)).collect();
        assert_eq!(at[0], 1);
        assert!(at.iter().all(|&i| [1, 3, 7, 15, 31, 63, 127, 255, 511, 767, 1023].contains(&i)));
        let mix = census.mix().expect("a mix");
        assert_eq!(mix.classes()[0].gpus, 2, "{:?}", mix.classes());
    }

    #[test]
    fn rare_classes_fall_out_of_the_mix() {
        let mut census = DemandCensus::default();
        for i in 0..512u32 {
            census.note(class(if i % 100 == 0 { 8 } else { 1 }), 1);
        }
        let mix = census.mix().expect("a mix after submissions");
        assert_eq!(mix.classes().len(), 1, "{:?}", mix.classes());
        assert_eq!(mix.classes()[0].gpus, 1);
    }

    #[test]
    fn counts_decay_to_nothing() {
        let mut census = DemandCensus::default();
        census.note(class(2), 1);
        for _ in 0..(256 * 80) {
            census.note(class(1), 1);
        }
        assert!(!census.counts.contains_key(&class(2)));
    }
}
