//! Charts of replay results and a generic line chart, each written as `NAME.svg` and `NAME.png`
//! (plotters).
//!
//! - Same input, same SVG bytes. No SVG layout depends on font metrics: titles and legends are
//!   placed at fixed positions and long labels are cut at a fixed number of characters, so the
//!   SVG is the same with or without a font installed, and needs none (the viewer renders
//!   `font-family="sans-serif"`).
//! - PNG text is rasterised by plotters' `ab_glyph` backend, which needs a TrueType font
//!   registered at run time. The first readable font in [`FONT_PATHS`] is loaded once per
//!   process (its bytes stay in memory for the rest of the process; plotters wants `'static`
//!   data). Without one, every SVG is still written and the call returns
//!   [`ChartError::NoFont`], which lists the SVGs written and the paths searched.
//! - [`line_chart_svg`] and [`bar_chart_svg`] return the same drawings as SVG text, for pages
//!   that inline them (the daemon's dashboard).
//! - Colours are the Okabe–Ito palette (safe for the common colour-vision deficiencies), yellow
//!   last because it is faint on white; after eight series the colours repeat. Charts are
//!   1000×600 unless they need more room.
//! - Limits: at most [`SERIES_POINTS_MAX`] points are drawn per series (longer series keep the
//!   first and last point and, per bucket of consecutive points, the lowest and the highest,
//!   so spikes stay visible); at most [`PROJECTS_CHARTED_MAX`] project rows per chart.
//! - Nothing panics on odd input: empty report lists and series draw empty axes with a note,
//!   non-finite points break a line into pieces, non-finite or negative bar values draw as 0.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

use crate::outcome::ReplayReport;
use crate::report::even_indices;

/// Default chart size in pixels (width, height): readable on a laptop screen.
pub const CHART_SIZE: (u32, u32) = (1000, 600);
/// At most this many points drawn per series (see the module comment).
pub const SERIES_POINTS_MAX: usize = 2000;
/// At most this many project rows in the goodput chart: the most allocated projects, the rest
/// summed into one "other" row.
pub const PROJECTS_CHARTED_MAX: usize = 20;
/// Where PNG text fonts are looked for, in order: Debian/Ubuntu `fonts-dejavu-core`, the same
/// on Fedora and Arch, Liberation, then macOS and Windows standard fonts.
pub const FONT_PATHS: [&str; 9] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// The font family name charts use; the PNG font is registered under it.
const FAMILY: &str = "sans-serif";
const LEGEND_WIDTH: u32 = 240;
const TITLE_HEIGHT: u32 = 44;
const LEGEND_ROW_PX: u32 = 22;
/// Characters of a legend label or project name before it is cut with "…".
const LABEL_CHARS_MAX: usize = 24;
const TITLE_CHARS_MAX: usize = 90;

/// Okabe & Ito (2008), "Color Universal Design"; yellow last.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(230, 159, 0),   // orange
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(0, 0, 0),       // black
    RGBColor(240, 228, 66),  // yellow
];
const GRID: RGBColor = RGBColor(221, 221, 221);
const NOTE: RGBColor = RGBColor(110, 110, 110);

/// One line of a [`line_chart`]: a label for the legend and its points in data coordinates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Why a chart was not written; every variant names the path concerned.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The chart folder could not be created.
    #[error("cannot create the chart folder {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A chart file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// plotters could not draw the chart; `cause` is its message.
    #[error("cannot draw {}: {cause}", path.display())]
    Draw { path: PathBuf, cause: String },
    /// No TrueType font for PNG text was found at any of `searched`. `path` is the first PNG not
    /// written; every SVG was written (`written`).
    #[error(
        "cannot draw {}: no TrueType font found at {}; install fonts-dejavu-core \
         (the SVG charts were written)",
        path.display(),
        searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoFont { path: PathBuf, searched: Vec<PathBuf>, written: Vec<PathBuf> },
    /// A chart name must be a plain file name: ASCII letters, digits, `-`, `_` and `.`, not
    /// starting with `.`.
    #[error(
        "cannot write chart {stem:?} in {}: a chart name must be a plain file name \
         (letters, digits, '-', '_', '.')",
        dir.display()
    )]
    InvalidStem { dir: PathBuf, stem: String },
}

// ---------------------------------------------------------------------------------------------
// Public entry points

/// The replay charts, each as SVG and PNG in `dir` (created if missing):
/// - `allocation_over_time`: allocated GPUs (solid) and active GPUs (dashed) per policy against
///   hours since the start of the trace;
/// - `queue_delay_cdf`: per policy, the share of admitted jobs whose first queue delay is at
///   most x, on a log-scaled x axis from 1 s (shorter delays are drawn at 1 s; NaN and infinite
///   delays are left out);
/// - `goodput_by_project`: one panel per policy, side by side on a shared scale, with a row per
///   project (the same rows in every panel) and bars for allocated, active and useful
///   GPU-hours.
///
/// Returns the files written, SVG before PNG for each chart. Without a font for PNG text, see
/// [`ChartError::NoFont`].
pub fn write_replay_charts(
    dir: &Path,
    reports: &[ReplayReport],
) -> Result<Vec<PathBuf>, ChartError> {
    let charts = [
        ("allocation_over_time", allocation_chart(reports)),
        ("queue_delay_cdf", queue_delay_chart(reports)),
        ("goodput_by_project", Chart::Bars(goodput_bars(reports))),
    ];
    write_all(dir, &charts)
}

/// A line chart of `series` on linear axes fitted to the data, written as `dir/stem.svg` and
/// `dir/stem.png`, legend on the right in series order. `stem` must be a plain file name.
/// Returns the two paths (SVG first); without a font for PNG text, see [`ChartError::NoFont`].
pub fn line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<Vec<PathBuf>, ChartError> {
    let plot = line_plot(title, x_label, y_label, series, false);
    write_all(dir, &[(stem, Chart::Lines(plot))])
}

/// The same line chart as [`line_chart`], as SVG text (for a page that inlines it), with the
/// y axis from 0. `name` only labels a drawing error.
pub fn line_chart_svg(
    name: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, ChartError> {
    let plot = line_plot(title, x_label, y_label, series, true);
    svg_string(Path::new(name), &Chart::Lines(plot))
}

/// Horizontal grouped bars as SVG text: one row per `rows` entry, one bar per measure
/// (`measures[m]` names `values[row][m]`), measures coloured in palette order; the same
/// drawing as the replay's goodput chart with one panel. `name` only labels a drawing error.
pub fn bar_chart_svg(
    name: &str,
    title: &str,
    x_label: &str,
    measures: &[&str],
    rows: &[String],
    values: &[Vec<f64>],
) -> Result<String, ChartError> {
    let bars = BarPlot {
        title: title.to_owned(),
        x_label: x_label.to_owned(),
        measures: measures
            .iter()
            .enumerate()
            .map(|(i, m)| ((*m).to_owned(), PALETTE[i % PALETTE.len()]))
            .collect(),
        rows: rows.to_vec(),
        panels: vec![Panel {
            title: String::new(),
            values: values.iter().map(|row| row.iter().map(|&v| bar_value(v)).collect()).collect(),
        }],
    };
    svg_string(Path::new(name), &Chart::Bars(bars))
}

fn line_plot(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    y_from_zero: bool,
) -> LinePlot {
    let lines = series
        .iter()
        .enumerate()
        .map(|(i, s)| Line {
            label: s.label.clone(),
            colour: PALETTE[i % PALETTE.len()],
            // Colours repeat after eight series: dash the repeats so lines stay distinct.
            dashed: (i / PALETTE.len()) % 2 == 1,
            points: s.points.clone(),
        })
        .collect();
    LinePlot {
        title: title.to_owned(),
        x_label: x_label.to_owned(),
        y_label: y_label.to_owned(),
        x_log_seconds: false,
        y_fixed: None,
        y_from_zero,
        lines,
    }
}

// ---------------------------------------------------------------------------------------------
// Files and fonts

/// The font PNG text is drawn with: the first of [`FONT_PATHS`] that reads and parses,
/// registered with plotters once per process.
fn png_font() -> Option<&'static Path> {
    static FONT: OnceLock<Option<PathBuf>> = OnceLock::new();
    FONT.get_or_init(|| {
        FONT_PATHS.iter().map(PathBuf::from).find(|path| {
            let Ok(bytes) = fs::read(path) else { return false };
            // plotters keeps a `'static` reference: the font lives as long as the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font(FAMILY, FontStyle::Normal, bytes).is_ok()
        })
    })
    .as_deref()
}

fn valid_stem(stem: &str) -> bool {
    !stem.is_empty()
        && !stem.starts_with('.')
        && stem.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn write_all(dir: &Path, charts: &[(&str, Chart)]) -> Result<Vec<PathBuf>, ChartError> {
    for (stem, _) in charts {
        if !valid_stem(stem) {
            return Err(ChartError::InvalidStem {
                dir: dir.to_path_buf(),
                stem: (*stem).to_owned(),
            });
        }
    }
    fs::create_dir_all(dir)
        .map_err(|source| ChartError::CreateDir { path: dir.to_path_buf(), source })?;
    let font = png_font();
    let mut written = Vec::new();
    let mut png_missing = None;
    for (stem, chart) in charts {
        let svg = dir.join(format!("{stem}.svg"));
        write_svg(&svg, chart)?;
        written.push(svg);
        let png = dir.join(format!("{stem}.png"));
        if font.is_some() {
            write_png(&png, chart)?;
            written.push(png);
        } else if png_missing.is_none() {
            png_missing = Some(png);
        }
    }
    match png_missing {
        None => Ok(written),
        Some(path) => Err(ChartError::NoFont {
            path,
            searched: FONT_PATHS.iter().map(PathBuf::from).collect(),
            written,
        }),
    }
}

fn draw_error<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> ChartError + '_ {
    move |e| ChartError::Draw { path: path.to_path_buf(), cause: e.to_string() }
}

/// Drawn into a string first, so that a drawing error never leaves half a file and the bytes
/// depend on nothing but the chart.
fn write_svg(path: &Path, chart: &Chart) -> Result<(), ChartError> {
    let svg = svg_string(path, chart)?;
    fs::write(path, svg).map_err(|source| ChartError::Write { path: path.to_path_buf(), source })
}

/// The chart as SVG text; `path` names it in a drawing error.
fn svg_string(path: &Path, chart: &Chart) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, chart.size()).into_drawing_area();
        chart.draw(&root).map_err(draw_error(path))?;
        root.present().map_err(draw_error(path))?;
    }
    Ok(svg)
}

fn write_png(path: &Path, chart: &Chart) -> Result<(), ChartError> {
    let root = BitMapBackend::new(path, chart.size()).into_drawing_area();
    chart.draw(&root).map_err(draw_error(path))?;
    root.present().map_err(draw_error(path))
}

// ---------------------------------------------------------------------------------------------
// Chart descriptions (data only, drawn by `Chart::draw` on any backend)

enum Chart {
    Lines(LinePlot),
    Bars(BarPlot),
}

struct Line {
    label: String,
    colour: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

struct LinePlot {
    title: String,
    x_label: String,
    y_label: String,
    /// x values are seconds, drawn on a log₁₀ scale from 1 s with duration ticks.
    x_log_seconds: bool,
    /// A fixed y range instead of one fitted to the data.
    y_fixed: Option<(f64, f64)>,
    /// The fitted y range starts at 0 (quantities that cannot be negative).
    y_from_zero: bool,
    lines: Vec<Line>,
}

/// Horizontal grouped bars: one panel per group (policy), one row per category (project), one
/// bar per measure in each row.
struct BarPlot {
    title: String,
    x_label: String,
    measures: Vec<(String, RGBColor)>,
    rows: Vec<String>,
    panels: Vec<Panel>,
}

struct Panel {
    title: String,
    /// `values[row][measure]`.
    values: Vec<Vec<f64>>,
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

impl Chart {
    fn size(&self) -> (u32, u32) {
        match self {
            Chart::Lines(_) => CHART_SIZE,
            Chart::Bars(bars) => bars.size(),
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        match self {
            Chart::Lines(plot) => plot.draw(root),
            Chart::Bars(bars) => bars.draw(root),
        }
    }
}

fn allocation_chart(reports: &[ReplayReport]) -> Chart {
    let mut lines = Vec::new();
    for (i, report) in reports.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let hours = |t_s: f64| t_s / 3600.0;
        lines.push(Line {
            label: format!("{} allocated", report.policy),
            colour,
            dashed: false,
            points: report.timeline.iter().map(|p| (hours(p.t_s), p.allocated_gpus)).collect(),
        });
        lines.push(Line {
            label: format!("{} active", report.policy),
            colour,
            dashed: true,
            points: report.timeline.iter().map(|p| (hours(p.t_s), p.active_gpus)).collect(),
        });
    }
    Chart::Lines(LinePlot {
        title: "GPUs allocated (solid) and active (dashed) over time".to_owned(),
        x_label: "hours since the start of the trace".to_owned(),
        y_label: "GPUs".to_owned(),
        x_log_seconds: false,
        y_fixed: None,
        y_from_zero: true,
        lines,
    })
}

fn queue_delay_chart(reports: &[ReplayReport]) -> Chart {
    let lines = reports
        .iter()
        .enumerate()
        .map(|(i, report)| {
            let mut delays: Vec<f64> =
                report.queue_delays_s.iter().copied().filter(|d| d.is_finite()).collect();
            delays.sort_by(f64::total_cmp);
            let n = delays.len() as f64;
            // Every point of the empirical CDF is exact; a long list is sampled evenly.
            let points = even_indices(delays.len(), SERIES_POINTS_MAX)
                .into_iter()
                .map(|k| (delays[k], (k + 1) as f64 / n * 100.0))
                .collect();
            Line {
                label: report.policy.clone(),
                colour: PALETTE[i % PALETTE.len()],
                dashed: false,
                points,
            }
        })
        .collect();
    Chart::Lines(LinePlot {
        title: "Queue delay CDF (first admission)".to_owned(),
        x_label: "queue delay (log scale; under 1 s drawn at 1 s)".to_owned(),
        y_label: "% of admitted jobs".to_owned(),
        x_log_seconds: true,
        y_fixed: Some((0.0, 100.0)),
        y_from_zero: true,
        lines,
    })
}

fn goodput_bars(reports: &[ReplayReport]) -> BarPlot {
    // Rows: projects by allocated GPU-hours summed over policies (most first), then name.
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    for report in reports {
        for ledger in &report.projects {
            *totals.entry(ledger.project.as_str()).or_insert(0.0) +=
                bar_value(ledger.allocated_gpu_hours);
        }
    }
    let mut order: Vec<(&str, f64)> = totals.into_iter().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let shown =
        if order.len() > PROJECTS_CHARTED_MAX { PROJECTS_CHARTED_MAX - 1 } else { order.len() };
    let mut rows: Vec<String> = order[..shown].iter().map(|(p, _)| (*p).to_owned()).collect();
    let others = order.len() - shown;
    if others > 0 {
        rows.push(format!("other ({others} projects)"));
    }
    let row_of: BTreeMap<&str, usize> =
        order.iter().enumerate().map(|(i, (p, _))| (*p, i.min(shown))).collect();
    let panels = reports
        .iter()
        .map(|report| {
            let mut values = vec![vec![0.0; 3]; rows.len()];
            for ledger in &report.projects {
                if let Some(&row) = row_of.get(ledger.project.as_str()) {
                    values[row][0] += bar_value(ledger.allocated_gpu_hours);
                    values[row][1] += bar_value(ledger.active_gpu_hours);
                    values[row][2] += bar_value(ledger.useful_gpu_hours);
                }
            }
            Panel { title: report.policy.clone(), values }
        })
        .collect();
    BarPlot {
        title: "GPU-hours per project: allocated, active, useful".to_owned(),
        x_label: "GPU-hours".to_owned(),
        measures: vec![
            ("allocated".to_owned(), PALETTE[0]),
            ("active".to_owned(), PALETTE[3]),
            ("useful".to_owned(), PALETTE[2]),
        ],
        rows,
        panels,
    }
}

fn bar_value(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

// ---------------------------------------------------------------------------------------------
// Drawing

fn text_style(size: u32, colour: &RGBColor, h: HPos, v: VPos) -> TextStyle<'_> {
    (FAMILY, size).into_font().color(colour).pos(Pos::new(h, v))
}

/// At most `max` characters: a longer text keeps its start and its end around "…", since
/// labels often differ only at the end (`seed 41`, `seed 42`).
fn cut(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if chars.len() <= max {
        return chars.into_iter().collect();
    }
    let tail = max.saturating_sub(1) / 2;
    let head = max.saturating_sub(1) - tail;
    let mut short: String = chars[..head].iter().collect();
    short.push('…');
    short.extend(&chars[chars.len() - tail..]);
    short
}

/// A legend label on at most two lines of [`LABEL_CHARS_MAX`] characters, broken at a space
/// (a word longer than a line is broken inside); only what two lines cannot hold is cut.
fn legend_lines(label: &str) -> Vec<String> {
    let clean: String = label.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let chars: Vec<char> = clean.chars().collect();
    if chars.len() <= LABEL_CHARS_MAX {
        return vec![clean];
    }
    // The last space that leaves the first line within bounds, else a hard break.
    let limit = LABEL_CHARS_MAX.min(chars.len());
    let split = (1..=limit).rev().find(|&i| chars.get(i) == Some(&' ')).unwrap_or(limit);
    let first: String = chars[..split].iter().collect();
    let rest: String = chars[split..].iter().collect();
    vec![first.trim_end().to_string(), cut(rest.trim_start(), LABEL_CHARS_MAX)]
}

/// Width a key entry (swatch, gap, label) takes, from its characters alone (no font metrics,
/// so the SVG is the same everywhere): 15 px text averages under 8.5 px a character.
fn key_entry_px(label: &str) -> u32 {
    let chars = u32::try_from(label.chars().count()).unwrap_or(u32::MAX);
    chars.saturating_mul(17).div_ceil(2).saturating_add(20 + 24)
}

/// Where each key entry of a bar chart goes: rows of entries centred in `width`, a new row
/// when the next entry would pass the edge. Returns `(x, row)` per entry.
fn key_layout(labels: &[String], width: u32) -> Vec<(u32, u32)> {
    let usable = width.saturating_sub(40).max(1);
    let mut rows: Vec<Vec<(usize, u32)>> = vec![Vec::new()];
    let mut used = 0u32;
    for (i, label) in labels.iter().enumerate() {
        let w = key_entry_px(label).min(usable);
        if used > 0 && used.saturating_add(w) > usable {
            rows.push(Vec::new());
            used = 0;
        }
        if let Some(row) = rows.last_mut() {
            row.push((i, w));
        }
        used = used.saturating_add(w);
    }
    let mut out = vec![(0, 0); labels.len()];
    for (row, entries) in rows.iter().enumerate() {
        let total: u32 = entries.iter().map(|(_, w)| *w).sum();
        let mut x = (width.saturating_sub(total)) / 2;
        for (i, w) in entries {
            out[*i] = (x, u32::try_from(row).unwrap_or(u32::MAX));
            x = x.saturating_add(*w);
        }
    }
    out
}

fn px(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn draw_title<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str) -> DrawResult<DB> {
    let (width, _) = root.dim_in_pixel();
    root.draw(&Text::new(
        cut(title, TITLE_CHARS_MAX),
        (px(width) / 2, 12),
        text_style(22, &BLACK, HPos::Center, VPos::Top),
    ))
}

/// "No data" in the middle of an area.
fn draw_note<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, note: &str) -> DrawResult<DB> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        note.to_owned(),
        (px(w) / 2, px(h) / 2),
        text_style(16, &NOTE, HPos::Center, VPos::Center),
    ))
}

/// A short sample of a line's style at (x, y), 30 px long.
fn draw_swatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    colour: &RGBColor,
    dashed: bool,
) -> DrawResult<DB> {
    let style = colour.stroke_width(3);
    if dashed {
        for k in 0..3 {
            area.draw(&PathElement::new(vec![(x + k * 11, y), (x + k * 11 + 7, y)], style))?;
        }
        Ok(())
    } else {
        area.draw(&PathElement::new(vec![(x, y), (x + 30, y)], style))
    }
}

impl LinePlot {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        draw_title(root, &self.title)?;
        let (width, _) = root.dim_in_pixel();
        let (plot_area, legend_area) = root.split_horizontally(width.saturating_sub(LEGEND_WIDTH));

        // Points in drawing coordinates, broken into pieces at non-finite values.
        let pieces: Vec<Vec<Vec<(f64, f64)>>> = self
            .lines
            .iter()
            .map(|line| {
                let transformed = line.points.iter().map(|&(x, y)| {
                    let x = if self.x_log_seconds { log_seconds(x) } else { x };
                    (x, y)
                });
                split_finite(transformed)
                    .into_iter()
                    .map(|p| decimate(&p, SERIES_POINTS_MAX))
                    .collect()
            })
            .collect();
        let all = pieces.iter().flatten().flatten();
        let (x_range, y_range, has_data) = self.ranges(all);

        let (x_ticks, x_decimals) = if self.x_log_seconds {
            (duration_ticks(x_range.1), 0)
        } else {
            nice_ticks(x_range.0, x_range.1)
        };
        let (y_ticks, y_decimals) = nice_ticks(y_range.0, y_range.1);
        let x_fmt = |v: &f64| {
            if self.x_log_seconds { duration_label(*v) } else { tick_label(*v, x_decimals) }
        };
        let y_fmt = |v: &f64| tick_label(*v, y_decimals);

        let mut chart = ChartBuilder::on(&plot_area)
            .margin_top(TITLE_HEIGHT + 6)
            .margin_right(20)
            .margin_left(10)
            .margin_bottom(10)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(
                Axis { lo: x_range.0, hi: x_range.1, ticks: x_ticks },
                Axis { lo: y_range.0, hi: y_range.1, ticks: y_ticks },
            )?;
        chart
            .configure_mesh()
            .bold_line_style(GRID)
            .axis_style(BLACK)
            .label_style((FAMILY, 15))
            .axis_desc_style((FAMILY, 17))
            .x_desc(cut(&self.x_label, TITLE_CHARS_MAX))
            .y_desc(cut(&self.y_label, TITLE_CHARS_MAX))
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .draw()?;

        for (line, pieces) in self.lines.iter().zip(&pieces) {
            let style = line.colour.stroke_width(2);
            for piece in pieces {
                if piece.len() == 1 {
                    chart.draw_series([Circle::new(piece[0], 3, line.colour.filled())])?;
                } else if line.dashed {
                    chart.draw_series(DashedLineSeries::new(piece.iter().copied(), 8, 5, style))?;
                } else {
                    chart.draw_series(LineSeries::new(piece.iter().copied(), style))?;
                }
            }
        }
        if !has_data {
            draw_note(&plot_area, "no data")?;
        }
        self.draw_legend(&legend_area)
    }

    fn ranges<'a>(
        &self,
        points: impl Iterator<Item = &'a (f64, f64)>,
    ) -> ((f64, f64), (f64, f64), bool) {
        let mut x = (f64::INFINITY, f64::NEG_INFINITY);
        let mut y = (f64::INFINITY, f64::NEG_INFINITY);
        for &(px_, py) in points {
            x = (x.0.min(px_), x.1.max(px_));
            y = (y.0.min(py), y.1.max(py));
        }
        let has_data = x.0 <= x.1;
        if !has_data {
            x = (0.0, 1.0);
            y = (0.0, 1.0);
        }
        if self.x_log_seconds {
            // From 1 s (10⁰) to at least 10 s.
            x = (0.0, x.1.max(1.0));
        }
        if self.y_from_zero {
            y = (y.0.min(0.0), y.1.max(0.0));
        }
        let x = widen(x);
        let y = match self.y_fixed {
            Some(fixed) => fixed,
            // Headroom above the highest line so it does not run along the frame.
            None => {
                let (lo, hi) = widen(y);
                let top = hi + (hi - lo) * 0.05;
                (lo, if top.is_finite() { top } else { hi })
            }
        };
        (x, y, has_data)
    }

    fn draw_legend<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (_, height) = area.dim_in_pixel();
        let top = px(TITLE_HEIGHT) + 16;
        let room = usize::try_from(height.saturating_sub(TITLE_HEIGHT + 40) / LEGEND_ROW_PX)
            .unwrap_or(0)
            .max(1);
        // Rows each entry takes (a long label wraps onto a second line).
        let labels: Vec<Vec<String>> = self.lines.iter().map(|l| legend_lines(&l.label)).collect();
        let shown = if labels.iter().map(Vec::len).sum::<usize>() <= room {
            labels.len()
        } else {
            // The last row is kept for "… and N more".
            let mut rows = 0;
            labels
                .iter()
                .take_while(|l| {
                    rows += l.len();
                    rows < room
                })
                .count()
        };
        let fits = shown == self.lines.len();
        let mut y = top;
        for (line, text) in self.lines[..shown].iter().zip(&labels) {
            draw_swatch(area, (8, y), &line.colour, line.dashed)?;
            for part in text {
                area.draw(&Text::new(
                    part.clone(),
                    (46, y),
                    text_style(15, &BLACK, HPos::Left, VPos::Center),
                ))?;
                y += px(LEGEND_ROW_PX);
            }
        }
        if !fits {
            area.draw(&Text::new(
                format!("… and {} more", self.lines.len() - shown),
                (46, y),
                text_style(15, &NOTE, HPos::Left, VPos::Center),
            ))?;
        }
        Ok(())
    }
}

/// Row height in the bar chart, in pixels; the first panel also holds the row labels.
const BAR_ROW_PX: u32 = 28;
const BAR_LABELS_PX: u32 = 190;
const BAR_PANEL_MIN_PX: u32 = 260;
const BAR_HEADER_PX: u32 = 80;
const KEY_ROW_PX: u32 = 22;

impl BarPlot {
    /// Title and key: one key row in [`BAR_HEADER_PX`], each further row [`KEY_ROW_PX`] more.
    fn header_px(&self, width: u32) -> u32 {
        let names: Vec<String> = self.measures.iter().map(|(n, _)| n.clone()).collect();
        let rows = key_layout(&names, width).iter().map(|(_, r)| r + 1).max().unwrap_or(1);
        BAR_HEADER_PX.saturating_add(rows.saturating_sub(1).saturating_mul(KEY_ROW_PX))
    }

    fn size(&self) -> (u32, u32) {
        let panels = u32::try_from(self.panels.len().max(1)).unwrap_or(u32::MAX);
        let rows = u32::try_from(self.rows.len().max(1)).unwrap_or(u32::MAX);
        let width =
            CHART_SIZE.0.max(BAR_LABELS_PX.saturating_add(panels.saturating_mul(BAR_PANEL_MIN_PX)));
        let height = CHART_SIZE.1.max(self.header_px(width) + 80 + rows.saturating_mul(BAR_ROW_PX));
        (width, height)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        draw_title(root, &self.title)?;
        let (width, height) = root.dim_in_pixel();
        // The measures' key under the title, in as many rows as its labels need.
        let names: Vec<String> = self.measures.iter().map(|(n, _)| n.clone()).collect();
        let places = key_layout(&names, width);
        for ((name, colour), (x, row)) in self.measures.iter().zip(&places) {
            let (x, y) = (px(*x), 59 + px(*row * KEY_ROW_PX));
            root.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], colour.filled()))?;
            root.draw(&Text::new(
                name.clone(),
                (x + 20, y),
                text_style(15, &BLACK, HPos::Left, VPos::Center),
            ))?;
        }
        let header = self.header_px(width);
        let body = root.clone().shrink((0, header), (width, height.saturating_sub(header)));
        if self.panels.is_empty() {
            return draw_note(&body, "no policies");
        }
        let x_max = self
            .panels
            .iter()
            .flat_map(|p| p.values.iter().flatten())
            .fold(0.0f64, |m, &v| m.max(v));
        let (lo, hi) = widen((0.0, x_max));
        let hi = hi * 1.05;
        let (x_ticks, x_decimals) = nice_ticks(lo, hi);
        let x_fmt = |v: &f64| tick_label(*v, x_decimals);
        let rows = self.rows.len();
        let y_ticks: Vec<f64> = (0..rows).map(|r| (rows - 1 - r) as f64 + 0.5).collect();
        let row_name = |v: &f64| {
            let r = rows as f64 - 0.5 - v;
            if r.is_finite() && r >= 0.0 && (r as usize) < rows {
                cut(&self.rows[r as usize], LABEL_CHARS_MAX)
            } else {
                String::new()
            }
        };
        let no_name = |_: &f64| String::new();

        let panel_width = (width - BAR_LABELS_PX) / u32::try_from(self.panels.len()).unwrap_or(1);
        for (i, panel) in self.panels.iter().enumerate() {
            let first = i == 0;
            let left =
                if first { 0 } else { BAR_LABELS_PX + panel_width * u32::try_from(i).unwrap_or(0) };
            let w = if first { BAR_LABELS_PX + panel_width } else { panel_width };
            let (_, body_h) = body.dim_in_pixel();
            let area = body.clone().shrink((left, 0), (w, body_h));
            let (aw, _) = area.dim_in_pixel();
            let title_x = if first { px(BAR_LABELS_PX + aw) / 2 } else { px(aw) / 2 };
            area.draw(&Text::new(
                cut(&panel.title, LABEL_CHARS_MAX),
                (title_x, 4),
                text_style(17, &BLACK, HPos::Center, VPos::Top),
            ))?;
            let mut chart = ChartBuilder::on(&area)
                .margin_top(30)
                .margin_right(16)
                .margin_bottom(10)
                .x_label_area_size(50)
                .y_label_area_size(if first { BAR_LABELS_PX } else { 8 })
                .build_cartesian_2d(
                    Axis { lo, hi, ticks: x_ticks.clone() },
                    Axis { lo: 0.0, hi: rows.max(1) as f64, ticks: y_ticks.clone() },
                )?;
            chart
                .configure_mesh()
                .bold_line_style(GRID)
                .disable_y_mesh()
                .axis_style(BLACK)
                .label_style((FAMILY, 14))
                .axis_desc_style((FAMILY, 16))
                .x_desc(self.x_label.clone())
                .x_label_formatter(&x_fmt)
                .y_label_formatter(if first { &row_name } else { &no_name })
                .draw()?;
            draw_bars(&mut chart, rows, &panel.values, &self.measures)?;
            if rows == 0 {
                draw_note(&area, "no projects")?;
            }
        }
        Ok(())
    }
}

type BarChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// A linear axis from `lo` to `hi` with ticks and grid lines exactly at `ticks` (plotters'
/// own f64 axis picks its ticks itself, and its key-point wrapper loses the label formatter).
#[derive(Clone, Debug)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, (from, to): (i32, i32)) -> i32 {
        let share = (value - self.lo) / (self.hi - self.lo);
        let pixel = f64::from(from) + share * (f64::from(to) - f64::from(from));
        if pixel.is_nan() {
            from
        } else {
            // In range by the clamp; `as` saturates anyway.
            pixel.round().clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
        }
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold points only: no light grid between the ticks.
        if hint.weight().allow_light_points() { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

fn draw_bars<DB: DrawingBackend>(
    chart: &mut BarChart<'_, DB>,
    rows: usize,
    values: &[Vec<f64>],
    measures: &[(String, RGBColor)],
) -> DrawResult<DB> {
    let measures_n = measures.len().max(1) as f64;
    let thickness = 0.76 / measures_n;
    for (r, row) in values.iter().enumerate().take(rows) {
        let base = (rows - 1 - r) as f64;
        for (m, (&value, (_, colour))) in row.iter().zip(measures).enumerate() {
            // The first measure on top.
            let y0 = base + 0.12 + (measures_n - 1.0 - m as f64) * thickness;
            let y1 = y0 + thickness * 0.9;
            chart.draw_series([Rectangle::new([(0.0, y0), (value, y1)], colour.filled())])?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Numbers: ranges, ticks, decimation (pure)

/// Seconds → log₁₀ seconds, with delays under 1 s drawn at 1 s.
fn log_seconds(x: f64) -> f64 {
    if x.is_nan() { x } else { x.max(1.0).log10() }
}

/// Runs of consecutive finite points.
fn split_finite(points: impl Iterator<Item = (f64, f64)>) -> Vec<Vec<(f64, f64)>> {
    let mut pieces = vec![Vec::new()];
    for (x, y) in points {
        if x.is_finite() && y.is_finite() {
            if let Some(piece) = pieces.last_mut() {
                piece.push((x, y));
            }
        } else if pieces.last().is_some_and(|p| !p.is_empty()) {
            pieces.push(Vec::new());
        }
    }
    pieces.retain(|p| !p.is_empty());
    pieces
}

/// At most `max` points (max ≥ 4): the first and the last, and per bucket of consecutive points
/// the lowest and the highest y, in their order.
fn decimate(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    let n = points.len();
    if n <= max || max < 4 {
        return points.to_vec();
    }
    let buckets = (max - 2) / 2;
    let mut keep = Vec::with_capacity(max);
    keep.push(0);
    for b in 0..buckets {
        let (start, end) = (1 + b * (n - 2) / buckets, 1 + (b + 1) * (n - 2) / buckets);
        if start >= end {
            continue;
        }
        let slice = &points[start..end];
        let lowest =
            (0..slice.len()).min_by(|&i, &j| slice[i].1.total_cmp(&slice[j].1).then(i.cmp(&j)));
        let highest =
            (0..slice.len()).max_by(|&i, &j| slice[i].1.total_cmp(&slice[j].1).then(j.cmp(&i)));
        if let (Some(lo), Some(hi)) = (lowest, highest) {
            let (a, b) = (lo.min(hi), lo.max(hi));
            keep.push(start + a);
            if b != a {
                keep.push(start + b);
            }
        }
    }
    keep.push(n - 1);
    keep.into_iter().map(|i| points[i]).collect()
}

/// A range with room in it: equal ends are pulled apart, non-finite ones replaced.
fn widen((lo, hi): (f64, f64)) -> (f64, f64) {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    if hi > lo && (hi - lo).is_finite() {
        (lo, hi)
    } else if hi > lo {
        // The span overflows f64: halve both ends' reach.
        (lo / 2.0, hi / 2.0)
    } else if lo == 0.0 {
        (0.0, 1.0)
    } else {
        let pad = lo.abs() * 0.1;
        (lo - pad, hi + pad)
    }
}

/// Tick positions at 1, 2, 2.5 or 5 × 10ᵏ covering [lo, hi] with about eight ticks, and the
/// decimals their labels need.
fn nice_ticks(lo: f64, hi: f64) -> (Vec<f64>, usize) {
    let span = hi - lo;
    if !(span.is_finite() && span > 0.0) {
        return (vec![lo], 0);
    }
    let raw = span / 8.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude);
    if !(step.is_finite() && step > 0.0) {
        return (vec![lo, hi], 0);
    }
    let first = (lo / step).ceil() * step;
    let ticks: Vec<f64> = (0..100)
        .map(|k| first + f64::from(k) * step)
        .take_while(|&v| v <= hi + step * 1e-9)
        .collect();
    // Decimals of the step: 10^-k needs k, and a 2.5 mantissa one more.
    let quarter = f64::from(u8::from((step / magnitude - 2.5).abs() < 1e-9));
    let decimals = (quarter - step.log10().floor()).clamp(0.0, 12.0) as usize;
    (ticks, decimals)
}

fn tick_label(v: f64, decimals: usize) -> String {
    crate::report::fixed(v, decimals)
}

/// Seconds at which the log-scaled duration axis has ticks, with their labels.
const DURATION_TICKS: [(f64, &str); 10] = [
    (1.0, "1 s"),
    (10.0, "10 s"),
    (60.0, "1 min"),
    (600.0, "10 min"),
    (3600.0, "1 h"),
    (36_000.0, "10 h"),
    (86_400.0, "1 d"),
    (864_000.0, "10 d"),
    (8_640_000.0, "100 d"),
    (86_400_000.0, "1000 d"),
];

fn duration_ticks(hi_log: f64) -> Vec<f64> {
    DURATION_TICKS.iter().map(|(s, _)| s.log10()).filter(|&l| l <= hi_log + 1e-9).collect()
}

fn duration_label(log_s: f64) -> String {
    DURATION_TICKS
        .iter()
        .find(|(s, _)| (s.log10() - log_s).abs() < 1e-6)
        .map_or_else(|| format!("{:.0} s", 10f64.powf(log_s)), |(_, label)| (*label).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(nice_ticks(0.0, 100.0), (vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0], 0));
        assert_eq!(nice_ticks(0.0, 1.0), (vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0], 1));
        assert_eq!(nice_ticks(0.0, 2.0).1, 2, "steps of 0.25");
        assert_eq!(nice_ticks(0.0, 200.0).1, 0, "steps of 25");
        assert_eq!(nice_ticks(-7.0, 7.0).0.first(), Some(&-6.0));
        assert_eq!(nice_ticks(1.0, 1.0), (vec![1.0], 0));
        assert_eq!(nice_ticks(0.0, f64::INFINITY), (vec![0.0], 0));
        assert!(nice_ticks(-1e300, 1e300).0.len() <= 100);
        assert_eq!(duration_ticks(2.0), vec![0.0, 1.0, 60f64.log10()]);
        assert_eq!(duration_label(3600f64.log10()), "1 h");
    }

    #[test]
    fn long_labels_keep_both_ends() {
        assert_eq!(cut("seed 1", 10), "seed 1");
        assert_eq!(cut("placement-with-long-name 42", 11), "place…me 42");
        assert_eq!(cut("abc", 0), "…");
        assert_eq!(cut("a\nb", 5), "a b");
    }

    #[test]
    fn a_long_legend_label_wraps_before_it_is_cut() {
        // The fleet chart's series: cut on one line it read "free, fits n…ing request".
        assert_eq!(
            legend_lines("free, fits no pending request"),
            ["free, fits no pending", "request"]
        );
        assert_eq!(legend_lines("allocated"), ["allocated"]);
        let long = legend_lines(&"x".repeat(60));
        assert_eq!(long.len(), 2);
        assert!(long.iter().all(|l| l.chars().count() <= LABEL_CHARS_MAX), "{long:?}");
        let svg = line_chart_svg(
            "wrap",
            "t",
            "x",
            "y",
            &[Series { label: "free, fits no pending request".into(), points: vec![(0.0, 1.0)] }],
        )
        .expect("an SVG needs no font");
        let text = |t: &str| svg.lines().any(|l| l.trim() == t);
        assert!(text("free, fits no pending") && text("request"), "{svg}");
    }

    #[test]
    fn bar_chart_key_entries_do_not_overlap() {
        // The what-if chart's four measures overlapped at a fixed 110 px step.
        let labels: Vec<String> =
            ["active: allocated", "candidate: allocated", "active: useful", "candidate: useful"]
                .map(String::from)
                .into();
        for width in [1000, 600, 300] {
            let places = key_layout(&labels, width);
            for (i, (x, row)) in places.iter().enumerate() {
                assert!(
                    x + key_entry_px(&labels[i]).min(width) <= width + 20,
                    "{width}: {places:?}"
                );
                for (j, (x2, row2)) in places.iter().enumerate().skip(i + 1) {
                    if row == row2 {
                        let (a, b) = if x < x2 { (i, *x) } else { (j, *x2) };
                        let other = if x < x2 { *x2 } else { *x };
                        assert!(b + key_entry_px(&labels[a]) <= other, "{width}: {places:?}");
                    }
                }
            }
        }
        assert!(key_layout(&labels, 300).iter().any(|(_, row)| *row > 0), "a narrow chart wraps");
    }

    #[test]
    fn ranges_survive_odd_values() {
        assert_eq!(widen((5.0, 5.0)), (4.5, 5.5));
        assert_eq!(widen((0.0, 0.0)), (0.0, 1.0));
        assert_eq!(widen((f64::NAN, 1.0)), (0.0, 1.0));
        assert_eq!(widen((-f64::MAX, f64::MAX)), (-f64::MAX / 2.0, f64::MAX / 2.0));
    }

    #[test]
    fn non_finite_points_split_lines() {
        let pieces = split_finite(
            [(0.0, 1.0), (1.0, f64::NAN), (2.0, 2.0), (3.0, 3.0), (f64::INFINITY, 0.0)].into_iter(),
        );
        assert_eq!(pieces, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
        assert!(split_finite(std::iter::empty()).is_empty());
    }

    #[test]
    fn decimation_keeps_ends_and_spikes() {
        let mut points: Vec<(f64, f64)> = (0..10_000).map(|i| (f64::from(i), 1.0)).collect();
        points[5000].1 = 99.0;
        points[7000].1 = -5.0;
        let kept = decimate(&points, 100);
        assert!(kept.len() <= 100);
        assert_eq!(kept.first(), Some(&(0.0, 1.0)));
        assert_eq!(kept.last(), Some(&(9999.0, 1.0)));
        assert!(kept.contains(&(5000.0, 99.0)) && kept.contains(&(7000.0, -5.0)));
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn svg_needs_no_font() {
        // No test in this binary registers a font, so this draws exactly as on a machine
        // without one: the SVG must still come out, with its text.
        let chart = Chart::Lines(LinePlot {
            title: "t".to_owned(),
            x_label: "x".to_owned(),
            y_label: "y".to_owned(),
            x_log_seconds: false,
            y_fixed: None,
            y_from_zero: false,
            lines: vec![Line {
                label: "only line".to_owned(),
                colour: PALETTE[0],
                dashed: false,
                points: vec![(0.0, 0.0), (1.0, 2.0)],
            }],
        });
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, chart.size()).into_drawing_area();
            assert!(chart.draw(&root).is_ok());
            assert!(root.present().is_ok());
        }
        assert!(svg.contains("only line"), "{svg}");
        let bars = Chart::Bars(goodput_bars(&[ReplayReport::default()]));
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, bars.size()).into_drawing_area();
            assert!(bars.draw(&root).is_ok());
        }
        assert!(svg.contains("no projects"), "{svg}");
    }
}
