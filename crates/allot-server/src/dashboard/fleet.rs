//! Fleet: allocated, free, stranded and warned-idle GPUs over time; a node × device map coloured
//! by allocation; fragmented capacity.

use std::collections::BTreeSet;

use allot_api::{Node, Role};
use allot_sim::charts::{Series, line_chart_svg};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::{Frame, NO_TELEMETRY, Tab, chart, gpus, read_view, respond, who};
use crate::state::AppState;
use crate::view::{FleetSample, is_warned};

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FleetData {
    pub now_ms: u64,
    pub inventory_source: String,
    pub samples: Vec<FleetSample>,
    /// Devices with the workloads the principal may see on them.
    pub nodes: Vec<Node>,
    /// Running workloads an idle rule warned about (visible ones).
    pub warned: BTreeSet<u64>,
    /// `/metrics` names every project: linked for admins and viewers only.
    pub show_metrics: bool,
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
        let visible: BTreeSet<u64> = view
            .workloads
            .values()
            .filter(|w| principal.can_see(&w.project))
            .map(|w| w.id)
            .collect();
        let mut nodes = view.nodes.clone();
        if principal.role == Role::Member {
            for n in &mut nodes {
                for d in &mut n.devices {
                    d.workloads.retain(|id| visible.contains(id));
                }
            }
        }
        FleetData {
            now_ms: super::now_ms(),
            inventory_source: view.inventory_source.clone(),
            samples: view.dashboard.samples.iter().copied().collect(),
            nodes,
            warned: view
                .workloads
                .values()
                .filter(|w| visible.contains(&w.id) && is_warned(w))
                .map(|w| w.id)
                .collect(),
            show_metrics: principal.role != Role::Member,
        }
    };
    respond(&headers, "Fleet", &Frame::of(Tab::Fleet, &principal, &state), "/fleet", render(&data))
}

/// Shares as GPUs.
fn g(shares: u64) -> String {
    gpus(shares as f64 / 1000.0)
}

pub(crate) fn render(data: &FleetData) -> Markup {
    let capacity: u64 = data.nodes.iter().map(|n| n.devices.len() as u64 * 1000).sum();
    let allocated: u64 =
        data.nodes.iter().flat_map(|n| &n.devices).map(|d| d.used_shares.min(1000)).sum();
    let free = capacity.saturating_sub(allocated);
    let partial: Vec<(&str, u32, u64)> = data
        .nodes
        .iter()
        .flat_map(|n| {
            n.devices
                .iter()
                .filter(|d| d.used_shares > 0 && d.used_shares < 1000)
                .map(|d| (n.name.as_str(), d.index, 1000 - d.used_shares))
        })
        .collect();
    let partial_free: u64 = partial.iter().map(|p| p.2).sum();
    // Nodes with free capacity but no whole free device: a whole-GPU request cannot land there.
    let no_whole: Vec<(&str, u64)> = data
        .nodes
        .iter()
        .filter(|n| !n.devices.is_empty() && n.devices.iter().all(|d| d.used_shares > 0))
        .map(|n| {
            let free: u64 = n.devices.iter().map(|d| 1000u64.saturating_sub(d.used_shares)).sum();
            (n.name.as_str(), free)
        })
        .filter(|(_, free)| *free > 0)
        .collect();
    let last = data.samples.last();
    let warned_shares = last.map(|s| s.warned_idle_shares);
    html! {
        h1 { "Fleet" }
        p.note { "Inventory: " (data.inventory_source) ". Active GPUs (at least 10 % of their share busy) come from GPU telemetry (" code { "--telemetry" } " sources, " code { "allot agent" } "); without readings they show as “" (NO_TELEMETRY) "”, never as 0." }
        div.figures {
            div.figure { a href="/api/v1/nodes" { span.n { (g(capacity)) } } "GPUs in the inventory" }
            div.figure { a href="/api/v1/nodes" { span.n { (g(allocated)) } } "allocated" }
            div.figure { a href="/api/v1/nodes" { span.n { (g(free)) } } "free" }
            @match last.and_then(|s| s.active_shares) {
                Some(a) => div.figure { a href="/metrics" { span.n { (g(a)) } } "active" },
                None => div.figure { span.n.nodata { (NO_TELEMETRY) } "active" },
            }
            div.figure {
                a href="/idle" { span.n { @if let Some(w) = warned_shares { (g(w)) } @else { "–" } } }
                "held by work an idle rule warned (by heartbeat probes)"
            }
            // From the last sample (every 5 s), so beside that sample's own free count: the
            // live "free" above may have moved since.
            div.figure {
                a href="/api/v1/report" { span.n { @if let Some(s) = last { (g(s.stranded_shares)) } @else { "–" } } }
                @if let Some(s) = last {
                    "of the " (g(s.free_shares)) " free at " (crate::views::utc(s.at_ms).get(11..19).unwrap_or_default())
                    " UTC fit no pending request (all, when none pends)"
                } @else { "free, but no pending request fits there (sampled every 5 s)" }
            }
            @if data.show_metrics { div.figure { a href="/metrics" { span.n { "/metrics" } } "all gauges (OpenMetrics)" } }
        }
        h2 { "GPUs over time" }
        (chart(fleet_chart(data)))
        p.note { "Samples: " (data.samples.len()) ", one per " (crate::view::SAMPLE_MS / 1000) " s (the last "
            (crate::view::SAMPLES_MAX) " are kept in memory). Active GPUs: where telemetry had readings, else " (NO_TELEMETRY) "." }
        h2 { "Devices" }
        p.legend {
            span.cell.free { "free" } span.cell.part { "partly allocated (%)" }
            span.cell.full { "fully allocated" } span.cell.idle { "idle? — warned by an idle rule" }
            " Activity per device, where a source reports it: " code { "allot_device_activity" } " in /metrics."
        }
        div.scroll { table.heat {
            tr { th { "node" } th colspan="8" { "devices (index: allocation, workloads)" } }
            @for n in &data.nodes {
                tr {
                    th {
                        a href="/api/v1/nodes" { (n.name) }
                        @if let Some(why) = &n.unusable { br; span.warn title="no new work is placed here; running work stays" { "no new work: " (why) } }
                    }
                    @if n.devices.is_empty() { td.nodata { "no GPUs" } }
                    @for d in &n.devices {
                        @let warned = d.workloads.iter().any(|id| data.warned.contains(id));
                        @let class = if warned { "cell idle" } else if d.used_shares == 0 { "cell free" } else if d.used_shares >= 1000 { "cell full" } else { "cell part" };
                        @let label = if warned { "idle?".to_string() } else if d.used_shares == 0 && n.unusable.is_some() { "unusable".to_string() } else if d.used_shares == 0 { "free".to_string() } else if d.used_shares >= 1000 { "full".to_string() } else { format!("{}%", d.used_shares / 10) };
                        td class=(class) title=(format!("{} device {} ({})", n.name, d.index, d.model)) {
                            (d.index) ": " (label)
                            @for id in &d.workloads { br; a href={ "/workload/" (id) } { "#" (id) } }
                        }
                    }
                }
            }
        } }
        h2 { "Fragmented capacity" }
        p {
            a href="/api/v1/nodes" { (g(partial_free)) } " GPUs are free on " (partial.len())
            " partly used devices (only fractional requests fit there), and "
            a href="/api/v1/nodes" { (no_whole.len()) } " nodes have free capacity but no whole free GPU."
        }
        @if !partial.is_empty() {
            div.scroll { table {
                tr { th { "node" } th.num { "device" } th.num { "free GPUs" } }
                @for (node, index, free) in partial.iter().take(50) {
                    tr { td { (node) } td.num { (index) } td.num { a href="/api/v1/nodes" { (g(*free)) } } }
                }
            } }
            @if partial.len() > 50 { p.note { "first 50 of " (partial.len()) "; all in " a href="/api/v1/nodes" { "/api/v1/nodes" } } }
        }
        @if !no_whole.is_empty() {
            p { "No whole free GPU: "
                @for (i, (node, free)) in no_whole.iter().enumerate().take(50) {
                    @if i > 0 { ", " } (node) " (" a href="/api/v1/nodes" { (g(*free)) } " free)"
                }
            }
        }
    }
}

fn fleet_chart(data: &FleetData) -> Result<String, allot_sim::charts::ChartError> {
    let minutes = |s: &FleetSample| -(data.now_ms.saturating_sub(s.at_ms) as f64) / 60_000.0;
    let series = |label: &str, value: &dyn Fn(&FleetSample) -> u64| Series {
        label: label.to_string(),
        points: data.samples.iter().map(|s| (minutes(s), value(s) as f64 / 1000.0)).collect(),
    };
    let mut lines = vec![
        series("allocated", &|s| s.allocated_shares),
        series("free", &|s| s.free_shares),
        series("free, fits no pending request", &|s| s.stranded_shares),
        series("warned idle", &|s| s.warned_idle_shares),
    ];
    // Active only where telemetry gave readings: a gap is no telemetry, not 0.
    let active: Vec<(f64, f64)> = data
        .samples
        .iter()
        .filter_map(|s| Some((minutes(s), s.active_shares? as f64 / 1000.0)))
        .collect();
    let telemetry = !active.is_empty();
    if telemetry {
        lines.push(Series { label: "active".to_string(), points: active });
    }
    line_chart_svg(
        "fleet",
        if telemetry {
            "GPUs allocated, active, free and warned idle"
        } else {
            "GPUs allocated, free and warned idle (active: no telemetry)"
        },
        "minutes before now",
        "GPUs",
        &lines,
    )
}
