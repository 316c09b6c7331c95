//! Identifiers and quantities as newtypes, so that a node index is never mistaken for a share count.

use std::fmt;

/// Milliseconds since an epoch chosen by the caller (the daemon uses Unix time, the simulator 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later (clocks may jump back).
    pub fn since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A workload's identity, assigned by whoever submits it (the store, the simulator, a test).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadId(pub u64);

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Index of a node in the cluster the engine was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

/// Index of a project in the policy the engine was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProjectId(pub u32);

/// Index of a GPU model in the engine's catalogue (models seen in the cluster or the policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub u16);

/// 1/1000 of one GPU device. Whole GPUs are counted as 1000 shares everywhere in quota math.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shares(pub u64);

/// Shares in one whole device.
pub const SHARES_PER_GPU: u64 = 1000;

impl Shares {
    pub const ZERO: Shares = Shares(0);

    pub fn from_gpus(gpus: u64) -> Shares {
        Shares(gpus.saturating_mul(SHARES_PER_GPU))
    }

    /// In GPUs, as a number (`Display` prints the same with at most three decimals).
    pub fn as_gpus(self) -> f64 {
        self.0 as f64 / SHARES_PER_GPU as f64
    }

    pub fn saturating_sub(self, other: Shares) -> Shares {
        Shares(self.0.saturating_sub(other.0))
    }

    pub fn saturating_add(self, other: Shares) -> Shares {
        Shares(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Shares {
    /// Prints GPUs, with up to three decimals: `4`, `0.5`, `2.25`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / SHARES_PER_GPU;
        let frac = self.0 % SHARES_PER_GPU;
        if frac == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date: count whole 400-year eras (146,097
/// days each) from year 0 with the year starting in March, so the leap day is the era's last.
/// Pure arithmetic for the edges that read dates (traces, telemetry, Slurm logs); the core
/// itself never reads a calendar.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = (month + 9) % 12; // March = 0 … February = 11
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`]: `(year, month, day)` of a day number (days since
/// 1970-01-01, proleptic Gregorian), for the edges that write dates.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // March = 0 … February = 11
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::{civil_from_days, days_from_civil};

    #[test]
    fn civil_dates_and_day_numbers_round_trip() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }
}
