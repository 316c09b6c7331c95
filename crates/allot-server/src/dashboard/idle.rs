//! Idle: running workloads an idle rule warned about, work being reclaimed for idleness, and work
//! waiting after a reclaim — with time left, the signal the rule used and how far it can be
//! trusted, all read from the decision the record keeps (code + sentence).

use allot_api::{Workload, WorkloadState};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::{Frame, Tab, duration, read_view, reason, respond, who};
use crate::state::AppState;

/// Reason codes of idle reclaim (`views::reason_code`).
const IDLE_CODES: [&str; 4] = ["idle_warning", "idle", "idle_backoff", "awaiting_use"];

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IdleData {
    pub now_ms: u64,
    pub workloads: Vec<Workload>,
}

pub(crate) async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let principal = match who(&state, &headers) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let data = {
        let view = match read_view(&state) {
            Ok(v) => v,
            Err(r) => return *r,
        };
        IdleData {
            now_ms: super::now_ms(),
            workloads: view
                .workloads
                .values()
                .filter(|w| principal.can_see(&w.project))
                .filter(|w| !w.state.is_final())
                .filter(|w| w.reason_code.as_deref().is_some_and(|c| IDLE_CODES.contains(&c)))
                .cloned()
                .collect(),
        }
    };
    respond(&headers, "Idle", &Frame::of(Tab::Idle, &principal, &state), "/idle", render(&data))
}

/// The signal named in an idle sentence (`render_idle`) and what it is worth.
pub(crate) fn signal(sentence: &str) -> (&'static str, &'static str) {
    if sentence.contains("telemetry missing") {
        return (
            "telemetry missing",
            "none: no reading (the rule's missing_telemetry setting decides)",
        );
    }
    for (name, confidence) in [
        ("SM-active", "high: the share of SMs busy"),
        ("engine-active", "medium: the compute engine busy"),
        ("utilisation", "low: “a kernel ran”, overstates use"),
        ("no sample", "none: no reading yet"),
    ] {
        if sentence.contains(name) {
            return (name, confidence);
        }
    }
    ("not stated", "–")
}

/// The deadline a warning or backoff names (`… will suspend at 2026-11-30 13:44:51 UTC …`,
/// `… may resume at … UTC`: the last ` at `), in ms since the epoch.
pub(crate) fn deadline_ms(sentence: &str) -> Option<u64> {
    let start = sentence.rfind(" at ")? + 4;
    let text = sentence.get(start..start + 19)?;
    if !sentence.get(start + 19..)?.starts_with(" UTC") {
        return None;
    }
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (h, m, s) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let days = allot_core::days_from_civil(year, month, day);
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    u64::try_from(secs).ok().map(|s| s * 1000)
}

fn what(w: &Workload) -> &'static str {
    match (w.state, w.reason_code.as_deref()) {
        (WorkloadState::Running, Some("idle_warning")) => "warned",
        (WorkloadState::Stopping, _) => "being reclaimed",
        (WorkloadState::Pending, Some("idle_backoff")) => "reclaimed, backing off",
        (WorkloadState::Pending, Some("awaiting_use")) => "reclaimed, waits for use",
        _ => "idle",
    }
}

pub(crate) fn render(data: &IdleData) -> Markup {
    html! {
        h1 { "Idle" }
        p.note { "Work under an idle rule: warned (still running), being reclaimed, or waiting after a reclaim. "
            "Rules see GPU telemetry where a source reports the workload's devices (" code { "--telemetry" } ", " code { "allot agent" } "), application probes and the heartbeat file (" code { "ALLOT_HEARTBEAT_FILE" } "); without readings the rule's " code { "missing_telemetry" } " decides." }
        @if data.workloads.is_empty() { p.nodata { "No workload is under an idle timer." } } @else {
            div.scroll { table {
                tr { th { "workload" } th { "project" } th.num { "GPUs" } th { "status" } th.num { "time left" } th { "signal" } th { "confidence" } th { "decision" } }
                @for w in &data.workloads {
                    @let sentence = w.reason.as_deref().unwrap_or("");
                    @let (sig, confidence) = signal(sentence);
                    @let left = deadline_ms(sentence).map(|d| d.saturating_sub(data.now_ms));
                    tr {
                        td { a href={ "/workload/" (w.id) } { "#" (w.id) " " (w.name) } }
                        td { a href={ "/queue?project=" (super::encode(&w.project)) } { (w.project) } }
                        td.num { a href={ "/api/v1/workloads/" (w.id) } { (w.gpus) } }
                        td { (what(w)) }
                        td.num { @match left { Some(ms) => a href={ "/api/v1/workloads/" (w.id) "/why" } { (duration(ms)) }, None => span.nodata { "–" } } }
                        td { (sig) }
                        td { (confidence) }
                        td { (reason(w.reason_code.as_deref(), w.reason.as_deref())) " " a href={ "/api/v1/workloads/" (w.id) "/why" } { "why" } }
                    }
                }
            } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{deadline_ms, signal};
    use crate::views::utc;

    #[test]
    fn deadlines_read_back_what_utc_wrote() {
        for ms in [0u64, 951_782_400_000, 1_796_046_291_000, 4_102_444_800_000] {
            let sentence = format!("idle 10 min; will suspend at {} unless active again", utc(ms));
            assert_eq!(deadline_ms(&sentence), Some(ms), "{sentence}");
        }
        let gap = format!(
            "idle 1 min; telemetry missing since {}; will suspend at {} unless active again",
            utc(1_000_000_000_000),
            utc(1_796_046_291_000)
        );
        assert_eq!(deadline_ms(&gap), Some(1_796_046_291_000), "the deadline, not the gap");
        assert_eq!(deadline_ms("no time here"), None);
        assert_eq!(deadline_ms("x at 2026-13-30 13:44:51 UTC"), None);
        assert_eq!(deadline_ms("x at 2026-11-30 13:44:51"), None);
        assert_eq!(deadline_ms(" at  UTC"), None);
        assert_eq!(deadline_ms(" at éééééééééé UTC"), None);
    }

    #[test]
    fn the_signal_is_named_with_its_confidence() {
        assert_eq!(signal("below 5.0 % by SM-active").0, "SM-active");
        assert_eq!(signal("below 5.0 % by utilisation").0, "utilisation");
        assert_eq!(signal("x; telemetry missing since 2026").0, "telemetry missing");
        assert_eq!(signal("reclaimed 2 times in a row").0, "not stated");
    }
}
