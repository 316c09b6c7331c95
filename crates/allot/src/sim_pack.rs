//! `allot sim pack` (the FGD packing experiment on one node list and one pod list) and
//! `allot sim fgd-compare` (every shared pod list with published results, ours vs theirs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use allot_core::packing::PackPolicy;
use allot_sim::bound::Bound;
use allot_sim::charts::{self, ChartError, Series};
use allot_sim::pack::{self, ArrivalOrder, PackInput, PackReport, PublishedResults, SeedRun};
use allot_sim::progress::Progress;
use allot_sim::report;
use allot_sim::{BadRows, TraceError, openb};
use anyhow::Result;
use rayon::prelude::*;

use crate::InvalidInput;
use crate::sim::trace_error;

#[derive(Debug, clap::Args)]
pub(crate) struct PackArgs {
    /// Openb node list CSV (`sn,cpu_milli,memory_mib,gpu,model`).
    #[arg(long)]
    nodes: PathBuf,
    /// Openb pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,…]`).
    #[arg(long)]
    pods: PathBuf,
    /// Placement policies, comma-separated, or `all`: random, dotprod, clustering, packing,
    /// bestfit, fgd, allot (allot's own, the default).
    #[arg(long, default_value = "allot")]
    placement: String,
    /// Arrived GPU demand to stop at, as a multiple of capacity (the paper uses 1.3).
    #[arg(long, default_value_t = 1.3)]
    inflate: f64,
    /// Seeds: `42`, `42-51` or `42,43,50`.
    #[arg(long, alias = "seed", default_value = "42")]
    seeds: String,
    #[arg(long, value_enum, default_value_t = SimOutput::Text)]
    output: SimOutput,
    /// Also draw the curves (allocation, fragmentation, fragmentation ratio vs arrived demand,
    /// one line per placement) as SVG and PNG into this folder.
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Skip malformed rows (counted on stderr) instead of stopping at the first.
    #[arg(long)]
    skip_bad_rows: bool,
    /// Report `wall_ms` as 0, so that the same inputs give byte-identical output.
    #[arg(long)]
    no_timing: bool,
    /// Offline hindsight reference: the same pods sorted by GPU demand, largest first, instead
    /// of arriving in trace order. Not an online policy; it shows how much is lost to order.
    #[arg(long)]
    hindsight: bool,
    /// Also compute, per seed, an upper bound on the GPU allocation any placement can reach for
    /// that seed's arrived pods (configuration LP; see `allot_sim::bound`), and the gap from it
    /// to each placement at the final column.
    #[arg(long)]
    bound: bool,
    /// Also run the experiment through allot's engine — each pod submitted to an `Engine`, one
    /// cycle, its `Admit` booked; the engine learns the target mix from the submissions — and
    /// report it as placement `engine` beside `--placement`'s.
    #[arg(long)]
    engine: bool,
    /// With `--engine`: migration budgets, % of the pods placed so far that the engine's
    /// defragmentation may have moved to fit an arriving pod, comma-separated (`0,1,2,5`); one
    /// engine run per budget, reported as `engine migrate PCT%` with its moves and their cost,
    /// instead of the plain `engine` run.
    #[arg(long, allow_hyphen_values = true)]
    migrate: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct CompareArgs {
    /// The openb folder: node lists, pod lists and `fgd-expected-results/`.
    #[arg(long, default_value = "../shared/traces/alibaba-gpu-v2023-openb")]
    dir: PathBuf,
    /// Seeds: `42-51` (the paper's) or a list.
    #[arg(long, alias = "seed", default_value = "42-51")]
    seeds: String,
    /// Placement policies, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    placement: String,
    /// Only these pod lists (comma-separated workload names such as `openb_pod_list_default`).
    #[arg(long)]
    workloads: Option<String>,
    /// What to compare: `allocation` (GPU allocation %, the paper's KPI), `fragmentation`
    /// (fragmented GPU % of capacity) or `ratio` (fragmented % of idle).
    #[arg(long, value_enum, default_value_t = Metric::Allocation)]
    metric: Metric,
    /// The arrived-demand column to compare at (% of capacity).
    #[arg(long, default_value_t = 130)]
    column: usize,
    /// Distance from the published mean, in points, inside which a cell passes.
    #[arg(long, default_value_t = 1.5)]
    band: f64,
    #[arg(long, value_enum, default_value_t = SimOutput::Text)]
    output: SimOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Metric {
    Allocation,
    Fragmentation,
    Ratio,
}

impl Metric {
    fn published_file(self) -> &'static str {
        match self {
            Metric::Allocation => "analysis_allo_discrete.csv",
            Metric::Fragmentation => "analysis_frag_discrete.csv",
            Metric::Ratio => "analysis_frag_ratio_discrete.csv",
        }
    }

    fn curve(self, report: &PackReport) -> &[Option<f64>] {
        match self {
            Metric::Allocation => &report.allocation_pct,
            Metric::Fragmentation => &report.fragmentation_pct,
            Metric::Ratio => &report.fragmentation_ratio_pct,
        }
    }

    fn ours(self, report: &PackReport, column: usize) -> Option<f64> {
        self.curve(report).get(column).copied().flatten()
    }

    fn chart_stem(self) -> &'static str {
        match self {
            Metric::Allocation => "pack_allocation",
            Metric::Fragmentation => "pack_fragmentation",
            Metric::Ratio => "pack_fragmentation_ratio",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Metric::Allocation => "GPU allocation % of capacity",
            Metric::Fragmentation => "fragmented GPU % of capacity",
            Metric::Ratio => "fragmented % of idle GPU",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SimOutput {
    Text,
    Json,
}

pub(crate) fn run(args: &PackArgs) -> Result<String> {
    let policies = parse_policies(&args.placement)?;
    let seeds = parse_seeds(&args.seeds)?;
    if !(args.inflate > 0.0 && args.inflate <= 10.0) {
        return Err(usage(
            "--inflate",
            &args.inflate.to_string(),
            "give a factor in (0, 10], e.g. 1.3",
        ));
    }
    if args.engine && args.hindsight {
        return Err(usage(
            "--engine",
            "with --hindsight",
            "the engine places pods as they arrive; drop --hindsight or --engine",
        ));
    }
    let budgets = match &args.migrate {
        Some(text) if !args.engine => {
            return Err(usage(
                "--migrate",
                text,
                "moves are made by the engine's defragmentation; add --engine",
            ));
        }
        Some(text) => parse_budgets(text)?,
        None => Vec::new(),
    };
    let mode = if args.skip_bad_rows { BadRows::Skip } else { BadRows::Fail };
    let input = load(&args.nodes, &args.pods, mode)?;
    let engine_runs = if budgets.is_empty() { usize::from(args.engine) } else { budgets.len() };
    let runs = policies.len() + engine_runs;
    let progress = Progress::new((runs * seeds.len()) as u64, "packing");
    let mut reports = Vec::new();
    for policy in policies {
        let started = wall_clock();
        let order = if args.hindsight { ArrivalOrder::Decreasing } else { ArrivalOrder::Online };
        let mut report =
            pack::run_with_progress(&input, policy, args.inflate, &seeds, order, &|| {
                progress.inc(1);
            });
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        reports.push(report);
    }
    for &budget in &budgets {
        let started = wall_clock();
        let mut report =
            pack::run_engine_migrating_with_progress(&input, args.inflate, &seeds, budget, &|| {
                progress.inc(1);
            })
            .map_err(|e| anyhow::anyhow!("sim pack --engine --migrate {budget}: {e}"))?;
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        reports.push(report);
    }
    if args.engine && budgets.is_empty() {
        let started = wall_clock();
        let mut report = pack::run_engine_with_progress(&input, args.inflate, &seeds, &|| {
            progress.inc(1);
        })
        .map_err(|e| anyhow::anyhow!("sim pack --engine: {e}"))?;
        report.wall_ms = if args.no_timing { 0 } else { started.elapsed().as_millis() as u64 };
        reports.push(report);
    }
    progress.finish();
    if let Some(dir) = &args.charts {
        write_pack_charts(dir, &reports)?;
    }
    let bounds = if args.bound {
        Some(seed_bounds(&input, args.inflate, &seeds, args.no_timing)?)
    } else {
        None
    };
    Ok(match args.output {
        SimOutput::Json => {
            let mut value = match reports.as_slice() {
                [one] => serde_json::to_value(one)?,
                many => serde_json::json!({ "placements": many }),
            };
            if let (Some(bounds), Some(object)) = (&bounds, value.as_object_mut()) {
                object.insert("bound".to_owned(), bound_json(bounds, &reports));
            }
            format!("{}\n", serde_json::to_string_pretty(&value)?)
        }
        SimOutput::Text => {
            let mut out = pack_text(&input, &reports);
            out.push_str(&migration_text(&reports));
            if let Some(bounds) = &bounds {
                out.push_str(&bound_text(bounds, &reports));
            }
            out
        }
    })
}

/// One seed's bound and how long it took.
struct SeedBound {
    seed: u64,
    bound: Bound,
    wall_ms: u64,
}

/// The bound for every seed, in parallel, in seed order.
fn seed_bounds(
    input: &PackInput,
    inflate: f64,
    seeds: &[u64],
    no_timing: bool,
) -> Result<Vec<SeedBound>> {
    let progress = Progress::new(seeds.len() as u64, "bounding");
    let bounds: Vec<Result<SeedBound>> = seeds
        .par_iter()
        .map(|&seed| {
            let started = wall_clock();
            let bound = pack::bound_problem(input, inflate, seed)
                .solve()
                .map_err(|e| anyhow::anyhow!("bound for seed {seed}: {e}"))?;
            progress.inc(1);
            let wall_ms = if no_timing { 0 } else { started.elapsed().as_millis() as u64 };
            Ok(SeedBound { seed, bound, wall_ms })
        })
        .collect();
    progress.finish();
    bounds.into_iter().collect()
}

fn mean_bound_pct(bounds: &[SeedBound]) -> f64 {
    bounds.iter().map(|b| b.bound.bound_pct).sum::<f64>() / bounds.len().max(1) as f64
}

/// Each placement's allocation at the final column (mean over seeds), by name; where no pod
/// event falls in that column (a tiny trace jumps past it), the mean final allocation.
fn final_columns(reports: &[PackReport]) -> Vec<(&str, f64)> {
    reports
        .iter()
        .map(|r| {
            let runs = r.per_seed.len().max(1) as f64;
            let final_mean = r.per_seed.iter().map(|s| s.final_allocation_pct).sum::<f64>() / runs;
            let last = r.allocation_pct.last().copied().flatten().unwrap_or(final_mean);
            (r.placement.as_str(), last)
        })
        .collect()
}

/// An upper bound shown rounded *up* to 2 places, so the printed number stays a bound.
fn ceil2(x: f64) -> f64 {
    (x * 100.0 - 1e-9).ceil() / 100.0
}

/// `"bound": {"per_seed": [{seed, bound_milli, bound_pct, trivial_pct, model_pct, master_pct,
/// converged, rounds, columns, shapes, classes, wall_ms}], "mean_pct", "gap_pct": {placement:
/// mean bound − placement's final column}}`.
fn bound_json(bounds: &[SeedBound], reports: &[PackReport]) -> serde_json::Value {
    let per_seed: Vec<serde_json::Value> = bounds
        .iter()
        .map(|b| {
            let mut value = serde_json::to_value(&b.bound).unwrap_or_default();
            if let Some(object) = value.as_object_mut() {
                object.insert("seed".to_owned(), b.seed.into());
                object.insert("wall_ms".to_owned(), b.wall_ms.into());
            }
            value
        })
        .collect();
    let mean = mean_bound_pct(bounds);
    let gaps: serde_json::Map<String, serde_json::Value> = final_columns(reports)
        .into_iter()
        .map(|(name, last)| (name.to_owned(), round2(mean - last).into()))
        .collect();
    serde_json::json!({
        "method": "configuration LP by column generation, Lagrangian upper bound",
        "per_seed": per_seed,
        "mean_pct": mean,
        "gap_pct": gaps,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn bound_text(bounds: &[SeedBound], reports: &[PackReport]) -> String {
    let mut out = String::new();
    let mean = mean_bound_pct(bounds);
    let per_seed: Vec<String> =
        bounds.iter().map(|b| format!("{}: {:.2}", b.seed, ceil2(b.bound.bound_pct))).collect();
    let _ = writeln!(
        out,
        "upper bound on any placement (configuration LP, same arrivals), mean over seeds: {:.2} % \
         of capacity (per seed {})",
        ceil2(mean),
        per_seed.join(", ")
    );
    let gaps: Vec<String> = final_columns(reports)
        .into_iter()
        .map(|(name, last)| format!("{name} {:.2}", mean - last))
        .collect();
    if !gaps.is_empty() {
        let last = reports.first().map_or(0, |r| r.allocation_pct.len().saturating_sub(1));
        let _ = writeln!(out, "gap bound − allocation at {last}%, points: {}", gaps.join(", "));
    }
    let unconverged = bounds.iter().filter(|b| !b.bound.converged).count();
    if unconverged > 0 {
        let _ = writeln!(
            out,
            "({unconverged} seed(s) stopped before the LP converged: their bound is valid but \
             looser)"
        );
    }
    let wall_ms: u64 = bounds.iter().map(|b| b.wall_ms).sum();
    let _ = writeln!(out, "bound wall ms (sum over seeds): {wall_ms}");
    out
}

/// The three curves of the paper's figures, one line per placement (mean over seeds).
fn write_pack_charts(dir: &Path, reports: &[PackReport]) -> Result<()> {
    for metric in [Metric::Allocation, Metric::Fragmentation, Metric::Ratio] {
        let stem = metric.chart_stem();
        let series: Vec<Series> = reports
            .iter()
            .map(|r| Series {
                label: r.placement.clone(),
                points: metric
                    .curve(r)
                    .iter()
                    .enumerate()
                    .filter_map(|(k, v)| v.map(|v| (k as f64, v)))
                    .collect(),
            })
            .collect();
        match charts::line_chart(
            dir,
            stem,
            metric.title(),
            "arrived GPU demand, % of capacity",
            metric.title(),
            &series,
        ) {
            Ok(_) => {}
            Err(ChartError::NoFont { .. }) => {
                crate::print_err(&format!(
                    "warning: {stem}.svg written, {stem}.png not: no TrueType font found \
                     (install fonts-dejavu-core)\n"
                ));
            }
            Err(e) => return Err(InvalidInput(format!("--charts: {e}\n")).into()),
        }
    }
    Ok(())
}

fn pack_text(input: &PackInput, reports: &[PackReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} nodes, {:.0} GPUs, {} pods in the trace; {} target classes; empty-cluster \
         fragmentation {:.2} % of capacity",
        input.node_count(),
        input.capacity_milli as f64 / 1000.0,
        input.pod_count(),
        input.target_classes().len(),
        input.empty_fragmentation_pct(),
    );
    let _ = writeln!(out, "GPU allocation % of capacity at arrived demand % (mean over seeds):");
    let Some(first) = reports.first() else { return out };
    let last = first.allocation_pct.len().saturating_sub(1);
    let points: Vec<usize> = (0..=last).filter(|k| k % 10 == 0 || *k == last).collect();
    let labels: Vec<String> = points.iter().map(|k| format!("{k}%")).collect();
    let mut headers: Vec<&str> = vec!["placement"];
    headers.extend(labels.iter().map(String::as_str));
    headers.extend(["failed pods", "pods", "wall ms"]);
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|report| {
            let mut row = vec![report.placement.clone()];
            row.extend(points.iter().map(|&k| {
                report
                    .allocation_pct
                    .get(k)
                    .copied()
                    .flatten()
                    .map_or("-".into(), |v| format!("{v:.2}"))
            }));
            let runs = report.per_seed.len().max(1) as f64;
            let mean = |f: fn(&SeedRun) -> usize| {
                report.per_seed.iter().map(f).sum::<usize>() as f64 / runs
            };
            row.push(format!("{:.0}", mean(|r| r.pods_failed)));
            row.push(format!("{:.0}", mean(|r| r.pods_arrived)));
            row.push(report.wall_ms.to_string());
            row
        })
        .collect();
    out.push_str(&report::table(&headers, &rows));
    out
}

/// The moves of each run with a migration budget: per seed, then the mean; empty without.
fn migration_text(reports: &[PackReport]) -> String {
    let mut out = String::new();
    let runs: Vec<&PackReport> = reports.iter().filter(|r| r.migration.is_some()).collect();
    if runs.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "Moves by the engine's defragmentation (cost: moved GPUs × time since checkpoint or \
         start + restart cost, as defrag.rs charges it):"
    );
    let headers = [
        "budget %",
        "seed",
        "allocation %",
        "pods placed",
        "pods moved",
        "moved % of placed",
        "plans",
        "cost GPU-h",
        "lost",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for report in runs {
        let budget = report.migration.as_ref().map_or(0.0, |m| m.budget_pct);
        for run in &report.per_seed {
            let Some(m) = &run.migration else { continue };
            rows.push(vec![
                budget.to_string(),
                run.seed.to_string(),
                format!("{:.2}", run.final_allocation_pct),
                m.pods_placed.to_string(),
                m.pods_moved.to_string(),
                format!("{:.2}", m.moved_pct),
                m.plans.to_string(),
                format!("{:.2}", m.move_cost_gpu_hours),
                m.pods_lost.to_string(),
            ]);
        }
        if let Some(m) = &report.migration {
            let seeds = report.per_seed.len().max(1) as f64;
            let allocation = report.per_seed.iter().map(|r| r.final_allocation_pct).sum::<f64>();
            let placed = report
                .per_seed
                .iter()
                .filter_map(|r| r.migration.as_ref())
                .map(|s| s.pods_placed as f64)
                .sum::<f64>();
            rows.push(vec![
                budget.to_string(),
                "mean".into(),
                format!("{:.2}", allocation / seeds),
                format!("{:.0}", placed / seeds),
                format!("{:.1}", m.pods_moved),
                format!("{:.2}", m.moved_pct),
                format!("{:.1}", m.plans),
                format!("{:.2}", m.move_cost_gpu_hours),
                format!("{:.1}", m.pods_lost),
            ]);
        }
    }
    out.push_str(&report::table(&headers, &rows));
    out
}

/// `0,1,2,5`: migration budgets, each a % in [0, 100].
fn parse_budgets(text: &str) -> Result<Vec<f64>> {
    text.split(',')
        .map(|part| {
            let part = part.trim();
            match part.parse::<f64>() {
                Ok(pct) if (0.0..=100.0).contains(&pct) => Ok(pct),
                _ => Err(usage(
                    "--migrate",
                    part,
                    "give each budget as a % of placed pods from 0 to 100, comma-separated \
                     (e.g. --migrate 0,1,2,5)",
                )),
            }
        })
        .collect()
}

/// Every openb pod list in the folder × every policy: our mean over the seeds at one column
/// (130 % by default) vs the FGD authors' mean over the same seeds, where they published one.
pub(crate) fn compare(args: &CompareArgs) -> Result<String> {
    let policies = parse_policies(&args.placement)?;
    let seeds = parse_seeds(&args.seeds)?;
    if args.column > 130 {
        return Err(usage("--column", &args.column.to_string(), "give 0..=130"));
    }
    let expected_path = args.dir.join("fgd-expected-results").join(args.metric.published_file());
    let published =
        PublishedResults::load(&expected_path, &args.column.to_string()).map_err(trace_error)?;
    let wanted: Option<Vec<&str>> = args.workloads.as_deref().map(|w| w.split(',').collect());
    let nodes_path = args.dir.join("openb_node_list_gpu_node.csv");
    let started = wall_clock();
    let mut inputs: Vec<(String, PackInput)> = Vec::new();
    for workload in pod_lists(&args.dir)? {
        if wanted.as_ref().is_some_and(|w| !w.contains(&workload.as_str())) {
            continue;
        }
        let input = load(&nodes_path, &args.dir.join(format!("{workload}.csv")), BadRows::Fail)?;
        inputs.push((workload, input));
    }
    let jobs: Vec<(&str, &PackInput, PackPolicy)> = inputs
        .iter()
        .flat_map(|(w, input)| policies.iter().map(move |&p| (w.as_str(), input, p)))
        .collect();
    // Every (pod list, policy) pair in parallel; rows keep the listing order.
    let progress = Progress::new((jobs.len() * seeds.len()) as u64, "packing runs");
    let rows: Vec<(String, PackPolicy, Option<f64>, Option<f64>)> = jobs
        .into_par_iter()
        .map(|(workload, input, policy)| {
            let online = ArrivalOrder::Online;
            let report =
                pack::run_with_progress(input, policy, 1.3, &seeds, online, &|| progress.inc(1));
            let ours = args.metric.ours(&report, args.column);
            let theirs = published.mean(workload, policy, &seeds);
            (workload.to_owned(), policy, ours, theirs)
        })
        .collect();
    progress.finish();
    let wall_ms = started.elapsed().as_millis();
    if args.output == SimOutput::Json {
        let cells: Vec<serde_json::Value> = rows
            .iter()
            .map(|(w, p, ours, theirs)| {
                serde_json::json!({"workload": w, "placement": p.name(), "ours": ours,
                    "published": theirs, "diff": ours.zip(*theirs).map(|(a, b)| a - b)})
            })
            .collect();
        let value = serde_json::json!({"seeds": seeds, "band": args.band, "cells": cells,
            "wall_ms": wall_ms});
        return Ok(format!("{}\n", serde_json::to_string_pretty(&value)?));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} at {} % arrived demand, mean of seeds {}: ours / FGD authors' (diff)",
        args.metric.title(),
        args.column,
        args.seeds
    );
    let _ = write!(out, "| workload |");
    for p in &policies {
        let _ = write!(out, " {p} |");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "|---|{}", "---|".repeat(policies.len()));
    let mut outside = 0;
    let mut current = String::new();
    for (workload, _, ours, theirs) in &rows {
        if *workload != current {
            if !current.is_empty() {
                let _ = writeln!(out);
            }
            let _ = write!(out, "| {} |", workload.trim_start_matches("openb_pod_list_"));
            current.clone_from(workload);
        }
        match (ours, theirs) {
            (Some(a), Some(b)) => {
                let flag = if (a - b).abs() > args.band {
                    outside += 1;
                    " **!**"
                } else {
                    ""
                };
                let _ = write!(out, " {a:.2} / {b:.2} ({:+.2}){flag} |", a - b);
            }
            _ => {
                let mine = ours.map_or("–".to_owned(), |v| format!("{v:.2}"));
                let _ = write!(out, " {mine} / – |");
            }
        }
    }
    let _ = writeln!(out);
    let compared = rows.iter().filter(|(_, _, a, b)| a.is_some() && b.is_some()).count();
    let _ = writeln!(
        out,
        "{} cells, {compared} with published results, {outside} outside ±{} points; \
         {} runs in {wall_ms} ms",
        rows.len(),
        args.band,
        rows.len() * seeds.len()
    );
    Ok(out)
}

/// The pod lists in an openb folder (`openb_pod_list_*.csv`), by name.
fn pod_lists(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| trace_error(TraceError::io(dir, &e)))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|n| n.strip_suffix(".csv").map(str::to_owned))
        .filter(|n| n.starts_with("openb_pod_list_"))
        .collect();
    names.sort();
    Ok(names)
}

fn load(nodes: &Path, pods: &Path, mode: BadRows) -> Result<PackInput> {
    let (nodes, skipped_nodes) = openb::load_nodes(nodes, mode).map_err(trace_error)?;
    let (pods, skipped_pods) = openb::load_pods(pods, mode).map_err(trace_error)?;
    for skipped in [&skipped_nodes, &skipped_pods] {
        if skipped.count > 0 {
            let first = skipped.first.first().map(ToString::to_string).unwrap_or_default();
            crate::print_err(&format!(
                "skipped {} malformed row(s); first: {first}\n",
                skipped.count
            ));
        }
    }
    PackInput::new(&nodes, &pods).map_err(|e| InvalidInput(format!("{e}\n")).into())
}

fn usage(flag: &str, value: &str, fix: &str) -> anyhow::Error {
    InvalidInput(format!("{flag}: '{value}' is not valid — {fix}\n")).into()
}

fn parse_policies(text: &str) -> Result<Vec<PackPolicy>> {
    if text == "all" {
        return Ok(PackPolicy::ALL.to_vec());
    }
    text.split(',')
        .map(|name| {
            PackPolicy::parse(name.trim()).ok_or_else(|| {
                usage(
                    "--placement",
                    name,
                    "use random, dotprod, clustering, packing, bestfit, fgd, allot or all",
                )
            })
        })
        .collect()
}

/// `42`, `42-51`, `42,45,50-51`.
pub(crate) fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let mut seeds = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let bad = || usage("--seeds", part, "write a seed (42), a range (42-51) or a list (42,43)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) =
                    (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
                if b < a || b - a > 10_000 {
                    return Err(bad());
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(seeds)
}

/// The CLI measures its own wall time for `wall_ms`; the simulation itself never reads a clock.
#[allow(clippy::disallowed_methods)]
pub(crate) fn wall_clock() -> std::time::Instant {
    std::time::Instant::now()
}
