//! What predicts an idle endpoint's return, read off the trace alone (no rule, no engine): at
//! every point where an endpoint has not been needed for 15 minutes, whether it is needed
//! within the next 15, split by one candidate signal at a time. A signal worth making a rule
//! input is one whose buckets differ a lot.

use super::{GenaiConfig, needed};
use crate::genai::GenaiTrace;

/// Minutes of the idle run at which each point is taken, and of the look-ahead.
pub const PREDICTOR_IDLE_MIN: f64 = 15.0;
/// Memory moving by more than this during the idle run counts as "changed", bytes.
pub const MEMORY_CHANGE_BYTES: f64 = 1e9;

/// One bucket of one signal.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PredictorRow {
    pub signal: String,
    pub bucket: String,
    /// Points (an endpoint 15 min into an idle run) in the bucket.
    pub points: u64,
    /// Of them, needed again within the next 15 min.
    pub returned: u64,
    pub return_share: f64,
}

struct Point {
    returned: bool,
    /// Share of the other living containers needed in the last 15 min.
    peers_active: Option<f64>,
    /// Slots this container was needed in the last hour.
    own_hour: u32,
    /// Memory moved during the idle run (`None`: a sample missing).
    memory_changed: Option<bool>,
}

/// The points and their share of returns per bucket of: the share of the other endpoints
/// active in the last 15 min (the signal of allot's quiet timer), the endpoint's own
/// needed slots in the last hour (its rhythm), and whether its GPU memory moved while idle.
pub fn return_predictors(trace: &GenaiTrace, config: &GenaiConfig) -> Vec<PredictorRow> {
    let step_min = trace.step_s as f64 / 60.0;
    let k = (PREDICTOR_IDLE_MIN / step_min).ceil().max(1.0) as u32;
    let hour = (60.0 / step_min).round().max(1.0) as u32;
    let slots = trace.slots as usize;
    // Per slot: containers alive, and containers needed within the last `k` slots.
    let mut alive = vec![0u32; slots];
    let mut recent = vec![0u32; slots];
    let mut need: Vec<Vec<bool>> = Vec::with_capacity(trace.containers.len());
    for c in &trace.containers {
        let n: Vec<bool> = (0..c.slots()).map(|i| needed(c, i, config.active_pct)).collect();
        let mut last: Option<usize> = None;
        for (i, &is) in n.iter().enumerate() {
            let s = c.first_slot as usize + i;
            alive[s] += 1;
            if is {
                last = Some(i);
            }
            if last.is_some_and(|l| i - l < k as usize) {
                recent[s] += 1;
            }
        }
        need.push(n);
    }
    let mut points = Vec::new();
    for (c, n) in trace.containers.iter().zip(&need) {
        let mut idle = 0u32;
        for i in 0..n.len() {
            if n[i] {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle != k || i + k as usize >= n.len() {
                continue;
            }
            let s = c.first_slot as usize + i;
            let returned = n[i + 1..=i + k as usize].iter().any(|&x| x);
            // This container is not among its own "recent" (idle k slots).
            let others = alive[s].saturating_sub(1);
            let peers_active = (others > 0).then(|| f64::from(recent[s]) / f64::from(others));
            let from = i.saturating_sub(hour as usize);
            let own_hour = n[from..=i].iter().filter(|&&x| x).count() as u32;
            let start = i + 1 - k as usize;
            let memory_changed = match (c.memory_bytes[start], c.memory_bytes[i]) {
                (Some(a), Some(b)) => Some((a - b).abs() > MEMORY_CHANGE_BYTES),
                _ => None,
            };
            points.push(Point { returned, peers_active, own_hour, memory_changed });
        }
    }
    let mut rows = Vec::new();
    let mut bucket = |signal: &str, name: &str, sel: &dyn Fn(&Point) -> bool| {
        let (n, r) = points
            .iter()
            .filter(|p| sel(p))
            .fold((0u64, 0u64), |(n, r), p| (n + 1, r + u64::from(p.returned)));
        rows.push(PredictorRow {
            signal: signal.into(),
            bucket: name.into(),
            points: n,
            returned: r,
            return_share: if n > 0 { r as f64 / n as f64 } else { 0.0 },
        });
    };
    bucket("all", "every point", &|_| true);
    for (lo, hi, name) in [
        (0.0, 0.1, "< 10 %"),
        (0.1, 0.25, "10–25 %"),
        (0.25, 0.5, "25–50 %"),
        (0.5, 0.75, "50–75 %"),
        (0.75, 1.01, "≥ 75 %"),
    ] {
        bucket("other endpoints active in the last 15 min", name, &|p| {
            p.peers_active.is_some_and(|a| a >= lo && a < hi)
        });
    }
    for (lo, hi, name) in
        [(0, 1, "0"), (1, 3, "1–2"), (3, 6, "3–5"), (6, 11, "6–10"), (11, u32::MAX, "≥ 11")]
    {
        bucket("own needed slots in the last hour", name, &|p| p.own_hour >= lo && p.own_hour < hi);
    }
    for (value, name) in [(Some(true), "moved > 1 GB"), (Some(false), "steady"), (None, "unknown")]
    {
        bucket("GPU memory during the idle run", name, &|p| p.memory_changed == value);
    }
    rows
}
