//! `allot top`: a live terminal view of the daemon (ratatui over crossterm).

use std::io::IsTerminal as _;
use std::time::Duration;

use allot_api::{NodeList, Workload, WorkloadList, WorkloadState};
use anyhow::Result;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use crate::client::Client;
use crate::{EXIT_USAGE, Failure, RemoteArgs, render};

const REFRESH: Duration = Duration::from_secs(2);
/// Characters in a device's usage bar.
const BAR_CHARS: u64 = 10;

/// One refresh's facts.
#[derive(Debug)]
struct View {
    url: String,
    nodes: NodeList,
    workloads: Vec<Workload>,
    now_ms: u64,
    /// The last refresh's failure, shown in the header while the previous data stays.
    error: Option<String>,
}

pub(crate) fn run(remote: &RemoteArgs) -> Result<String> {
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        return Err(Failure::new(
            EXIT_USAGE,
            "error: `allot top` needs a terminal — fix: run it in one, or use `allot nodes` and `allot ls --active`\n",
        )
        .into());
    }
    let client = Client::new(remote)?;
    // The first fetch happens before the screen is taken, so an unreachable daemon or a bad
    // token is reported like any other verb's failure.
    let (nodes, workloads) = fetch(&client)?;
    let mut view =
        View { url: remote.url.clone(), nodes, workloads, now_ms: render::now_ms(), error: None };
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> Result<()> {
        loop {
            terminal.draw(|frame| draw(frame, &view))?;
            if quit_requested(REFRESH)? {
                return Ok(());
            }
            match fetch(&client) {
                Ok((nodes, workloads)) => {
                    view.nodes = nodes;
                    view.workloads = workloads;
                    view.error = None;
                }
                Err(e) => view.error = Some(e.to_string().trim_end().to_string()),
            }
            view.now_ms = render::now_ms();
        }
    })();
    ratatui::restore();
    result.map(|()| String::new())
}

fn fetch(client: &Client) -> Result<(NodeList, Vec<Workload>)> {
    let nodes = client.get::<NodeList>("/nodes")?.value;
    let mut workloads = client.get::<WorkloadList>("/workloads")?.value.workloads;
    workloads.retain(|w| !w.state.is_final());
    Ok((nodes, workloads))
}

/// Waits up to `wait` for a key; true for q, Esc or Ctrl-C.
fn quit_requested(wait: Duration) -> Result<bool> {
    if !event::poll(wait)? {
        return Ok(false);
    }
    Ok(match event::read()? {
        Event::Key(key) if key.kind == KeyEventKind::Press => {
            matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    })
}

fn bar(used_shares: u64) -> String {
    let full = (used_shares.min(1000) * BAR_CHARS).div_ceil(1000);
    let mut bar = "█".repeat(full as usize);
    bar.push_str(&"·".repeat((BAR_CHARS - full) as usize));
    bar
}

/// The device panel's title; says how many rows fit when not all do.
fn devices_title(view: &View, device_count: usize, height: u16) -> String {
    let shown = usize::from(height.saturating_sub(3));
    if shown < device_count {
        format!(
            " devices ({}) — {shown} of {device_count} shown; `allot nodes` lists all ",
            view.nodes.source
        )
    } else {
        format!(" devices ({}) ", view.nodes.source)
    }
}

fn draw(frame: &mut Frame<'_>, view: &View) {
    let count = |state: WorkloadState| view.workloads.iter().filter(|w| w.state == state).count();
    let pending: Vec<&Workload> =
        view.workloads.iter().filter(|w| w.state == WorkloadState::Pending).collect();
    let mut header = format!(
        "allot top — {} — running {}, starting {}, stopping {}, suspended {}, pending {} — q quits",
        view.url,
        count(WorkloadState::Running),
        count(WorkloadState::Starting),
        count(WorkloadState::Stopping),
        count(WorkloadState::Suspended),
        pending.len(),
    );
    if let Some(error) = &view.error {
        header = format!("{header} — refresh failed: {error}");
    }
    let device_count: usize = view.nodes.nodes.iter().map(|n| n.devices.len()).sum();
    // Devices take at most half the screen, so running and pending work stay in view.
    let device_height = (device_count + 3).min(usize::from(frame.area().height / 2).max(4));
    let [top, middle, running_area, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(u16::try_from(device_height).unwrap_or(u16::MAX)),
        Constraint::Fill(1),
        Constraint::Fill(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(Line::from(header)), top);

    let bold = Style::default().add_modifier(Modifier::BOLD);
    let device_rows: Vec<Row<'_>> = view
        .nodes
        .nodes
        .iter()
        .flat_map(|node| {
            node.devices.iter().enumerate().map(move |(i, d)| {
                let ids: Vec<String> = d.workloads.iter().map(u64::to_string).collect();
                Row::new(vec![
                    if i == 0 { node.name.clone() } else { String::new() },
                    d.index.to_string(),
                    d.model.clone(),
                    bar(d.used_shares),
                    render::share(d.used_shares),
                    ids.join(","),
                ])
            })
        })
        .collect();
    let devices = Table::new(
        device_rows,
        [
            Constraint::Length(16),
            Constraint::Length(4),
            Constraint::Length(12),
            Constraint::Length(BAR_CHARS as u16),
            Constraint::Length(5),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(["NODE", "DEV", "MODEL", "USED", "", "WORKLOADS"]).style(bold))
    .block(Block::bordered().title(devices_title(view, device_count, middle.height)));
    frame.render_widget(devices, middle);

    let running: Vec<&Workload> = view
        .workloads
        .iter()
        .filter(|w| matches!(w.state, WorkloadState::Running | WorkloadState::Starting))
        .collect();
    let running_rows = running.iter().map(|w| {
        let ran = w.started_ms.map(|s| render::duration(view.now_ms.saturating_sub(s)));
        (*w, ran.unwrap_or_else(|| "starting".to_string()), w.placement.join(" "))
    });
    let title = format!(" running ({}) ", running.len());
    let running_table = workload_table(running_rows, ["RUNNING", "ON"], 9, title, bold);
    frame.render_widget(running_table, running_area);

    let pending_rows = pending.iter().map(|w| {
        let waited = render::duration(view.now_ms.saturating_sub(w.submitted_ms));
        (*w, waited, w.reason.clone().unwrap_or_default())
    });
    let pending_table =
        workload_table(pending_rows, ["WAIT", "REASON"], 7, " pending ".to_string(), bold);
    frame.render_widget(pending_table, bottom);
}

/// A panel of workloads: id, name, project and GPUs, then a time column (`time_width` wide)
/// and a detail column, headed by `headers`.
fn workload_table<'a>(
    rows: impl Iterator<Item = (&'a Workload, String, String)>,
    headers: [&'a str; 2],
    time_width: u16,
    title: String,
    header_style: Style,
) -> Table<'a> {
    let rows: Vec<Row<'a>> = rows
        .map(|(w, time, detail)| {
            Row::new(vec![
                w.id.to_string(),
                w.name.clone(),
                w.project.clone(),
                w.size(),
                time,
                detail,
            ])
        })
        .collect();
    let [time_header, detail_header] = headers;
    Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(20),
            Constraint::Length(14),
            Constraint::Length(6),
            Constraint::Length(time_width),
            Constraint::Min(20),
        ],
    )
    .header(
        Row::new(["ID", "NAME", "PROJECT", "GPUS", time_header, detail_header]).style(header_style),
    )
    .block(Block::bordered().title(title))
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::{Device, Node};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn workload(id: u64, state: WorkloadState, reason: Option<&str>) -> Workload {
        Workload {
            id,
            name: format!("job-{id}"),
            project: "vision".to_string(),
            user: "ana".to_string(),
            kind: "batch".to_string(),
            state,
            gpus: "2".to_string(),
            members: 1,
            command: vec!["train".to_string()],
            submitted_ms: 1_000,
            started_ms: (state == WorkloadState::Running).then_some(1_000),
            ended_ms: None,
            exit_code: None,
            attempt: 1,
            reason: reason.map(str::to_string),
            reason_code: None,
            placement: if state == WorkloadState::Running {
                vec!["gpu-a: 0".to_string()]
            } else {
                Vec::new()
            },
            pids: Vec::new(),
            last_checkpoint_ms: None,
            last_activity_ms: None,
        }
    }

    #[test]
    fn the_view_shows_devices_counts_and_pending_reasons() {
        let view = View {
            url: "http://127.0.0.1:7380".to_string(),
            nodes: NodeList {
                source: "inventory.yaml".to_string(),
                backend: allot_api::BackendStatus::default(),
                inventory_note: None,
                nodes: vec![Node {
                    unusable: None,
                    unmanaged: None,
                    name: "gpu-a".to_string(),
                    devices: vec![
                        Device {
                            index: 0,
                            model: "H100".to_string(),
                            used_shares: 1000,
                            workloads: vec![1],
                        },
                        Device {
                            index: 1,
                            model: "H100".to_string(),
                            used_shares: 250,
                            workloads: vec![],
                        },
                    ],
                }],
            },
            workloads: vec![
                workload(1, WorkloadState::Running, None),
                workload(2, WorkloadState::Pending, Some("quota exhausted in vision")),
            ],
            now_ms: 61_000,
            error: None,
        };
        let mut terminal = Terminal::new(TestBackend::new(120, 16)).expect("test terminal");
        terminal.draw(|frame| draw(frame, &view)).expect("draw");
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .chunks(120)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>() + "\n")
            .collect();
        assert!(screen.contains("running 1,"), "{screen}");
        assert!(screen.contains("pending 1 "), "{screen}");
        assert!(screen.contains("gpu-a"), "{screen}");
        assert!(screen.contains("██████████ 100%"), "{screen}");
        assert!(screen.contains("███······· 25%"), "{screen}");
        assert!(screen.contains("quota exhausted in vision"), "{screen}");
        assert!(screen.contains("1m"), "{screen}");
        // The running panel (issue 25: the help promised one), with where it runs.
        assert!(screen.contains(" running (1) "), "{screen}");
        assert!(screen.contains("gpu-a: 0"), "{screen}");
    }

    #[test]
    fn a_device_list_taller_than_half_the_screen_says_how_much_is_shown() {
        let device =
            |index| Device { index, model: "H100".to_string(), used_shares: 0, workloads: vec![] };
        let view = View {
            url: "http://127.0.0.1:7380".to_string(),
            nodes: NodeList {
                source: "inventory.yaml".to_string(),
                backend: allot_api::BackendStatus::default(),
                inventory_note: None,
                nodes: vec![Node {
                    unusable: None,
                    unmanaged: None,
                    name: "gpu-a".to_string(),
                    devices: (0..64).map(device).collect(),
                }],
            },
            workloads: Vec::new(),
            now_ms: 0,
            error: None,
        };
        let mut terminal = Terminal::new(TestBackend::new(120, 30)).expect("test terminal");
        terminal.draw(|frame| draw(frame, &view)).expect("draw");
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .chunks(120)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>() + "\n")
            .collect();
        assert!(screen.contains("12 of 64 shown"), "{screen}");
    }

    #[test]
    fn bars_show_any_use_and_stop_at_full() {
        assert_eq!(bar(0), "··········");
        assert_eq!(bar(1), "█·········");
        assert_eq!(bar(5000), "██████████");
    }
}
