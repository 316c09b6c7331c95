//! Charts written to a temporary folder: files exist, SVG is SVG with the series labels and
//! byte-identical across runs, PNG is PNG (when a font is installed, as on the CI machine).

use std::path::{Path, PathBuf};

use allot_sim::charts::{
    ChartError, FONT_PATHS, Series, bar_chart_svg, line_chart, line_chart_svg, write_replay_charts,
};
use allot_sim::outcome::{ProjectLedger, ReplayReport, TimelinePoint};

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// A fresh folder for one test (removed first if a previous run left it).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allot-sim-charts-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn font_installed() -> bool {
    let found = FONT_PATHS.iter().any(|p| Path::new(p).is_file());
    if !found {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("note: no TrueType font at {FONT_PATHS:?}; PNG assertions skipped");
        }
    }
    found
}

fn report(policy: &str, scale: f64) -> ReplayReport {
    ReplayReport {
        policy: policy.to_owned(),
        timeline: (0..500)
            .map(|i| {
                let t = f64::from(i);
                TimelinePoint {
                    t_s: t * 600.0,
                    allocated_gpus: scale * (40.0 + 20.0 * (t / 30.0).sin()),
                    active_gpus: scale * (25.0 + 10.0 * (t / 17.0).cos()),
                    pending_jobs: 3,
                }
            })
            .collect(),
        queue_delays_s: (0..3000).map(|i| f64::from(i) * f64::from(i) * scale / 50.0).collect(),
        projects: ["vc-alpha", "vc-beta", "a-project-with-a-very-long-name-indeed"]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let f = (i + 1) as f64 * scale;
                ProjectLedger {
                    project: (*p).to_owned(),
                    allocated_gpu_hours: 100.0 * f,
                    active_gpu_hours: 70.0 * f,
                    useful_gpu_hours: 60.0 * f,
                    lost_gpu_hours: 5.0,
                    jobs_finished: 10,
                    ..ProjectLedger::default()
                }
            })
            .collect(),
        ..ReplayReport::default()
    }
}

fn check_files(written: &[PathBuf], stems: &[&str]) {
    let font = font_installed();
    let mut expected = Vec::new();
    for stem in stems {
        expected.push(format!("{stem}.svg"));
        if font {
            expected.push(format!("{stem}.png"));
        }
    }
    let names: Vec<String> = written
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(names, expected);
    for path in written {
        let bytes = std::fs::read(path).unwrap_or_default();
        if path.extension().is_some_and(|e| e == "svg") {
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.starts_with("<svg") || text.starts_with("<?xml"), "{}", path.display());
            assert!(text.trim_end().ends_with("</svg>"), "{}", path.display());
        } else {
            assert!(bytes.starts_with(&PNG_SIGNATURE), "{}", path.display());
            assert!(bytes.len() > 5_000, "{} is {} bytes", path.display(), bytes.len());
        }
    }
}

fn svg(dir: &Path, stem: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap_or_default()
}

#[test]
fn replay_charts_are_written_labelled_and_deterministic() {
    let reports = [report("default", 1.0), report("strict-fifo", 0.6), report("a&b<c>", 0.3)];
    let stems = ["allocation_over_time", "queue_delay_cdf", "goodput_by_project"];
    let first = scratch("replay-1");
    let second = scratch("replay-2");
    let written = write_replay_charts(&first, &reports);
    assert!(written.is_ok(), "{written:?}");
    check_files(&written.unwrap_or_default(), &stems);
    assert!(write_replay_charts(&second, &reports).is_ok());

    let allocation = svg(&first, "allocation_over_time");
    for label in ["default allocated", "default active", "strict-fifo active", "a&amp;b&lt;c&gt;"] {
        assert!(allocation.contains(label), "{label} missing");
    }
    assert!(allocation.contains("hours since the start of the trace"));
    let cdf = svg(&first, "queue_delay_cdf");
    assert!(cdf.contains("strict-fifo") && cdf.contains("1 min") && cdf.contains("1 h"));
    let goodput = svg(&first, "goodput_by_project");
    assert!(goodput.contains("vc-alpha") && goodput.contains("allocated"));
    assert!(goodput.contains("a-project-wi…name-indeed"), "long names are cut");

    for stem in stems {
        assert_eq!(svg(&first, stem), svg(&second, stem), "{stem}.svg differs between runs");
    }
    let _ = std::fs::remove_dir_all(&first);
    let _ = std::fs::remove_dir_all(&second);
}

#[test]
fn empty_and_odd_input_still_draws() {
    let dir = scratch("odd");
    let written = write_replay_charts(&dir, &[]);
    assert!(written.is_ok(), "{written:?}");
    assert!(svg(&dir, "allocation_over_time").contains("no data"));
    assert!(svg(&dir, "goodput_by_project").contains("no policies"));

    let odd = ReplayReport {
        policy: String::new(),
        timeline: vec![
            TimelinePoint { t_s: f64::NAN, allocated_gpus: 1.0, ..TimelinePoint::default() },
            TimelinePoint { t_s: 5.0, allocated_gpus: f64::INFINITY, ..TimelinePoint::default() },
            TimelinePoint { t_s: 9.0, allocated_gpus: 3.0, ..TimelinePoint::default() },
        ],
        queue_delays_s: vec![f64::NAN, -1.0, 0.0, f64::INFINITY, 1e300],
        projects: vec![ProjectLedger {
            allocated_gpu_hours: f64::NAN,
            active_gpu_hours: -3.0,
            ..ProjectLedger::default()
        }],
        ..ReplayReport::default()
    };
    let written = write_replay_charts(&dir, &[odd.clone(), ReplayReport::default()]);
    assert!(written.is_ok(), "{written:?}");

    let series = [
        Series { label: "empty".to_owned(), points: Vec::new() },
        Series { label: "nan".to_owned(), points: vec![(f64::NAN, f64::NAN)] },
        Series { label: "flat".to_owned(), points: vec![(1.0, 5.0), (1.0, 5.0)] },
        Series { label: "huge".to_owned(), points: vec![(-f64::MAX, 0.0), (f64::MAX, 1.0)] },
    ];
    let written = line_chart(&dir, "odd-lines", "Odd", "x", "y", &series);
    assert!(written.is_ok(), "{written:?}");
    let written = line_chart(&dir, "nothing", "", "", "", &[]);
    assert!(written.is_ok(), "{written:?}");
    assert!(svg(&dir, "nothing").contains("no data"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn line_chart_draws_every_series_with_a_legend() {
    let dir = scratch("lines").join("nested/folder");
    let series: Vec<Series> = (0..12)
        .map(|k| Series {
            label: format!("seed {k}"),
            points: (0..=130).map(|p| (f64::from(p), f64::from(p.min(90 + k)))).collect(),
        })
        .collect();
    let written = line_chart(
        &dir,
        "allocation_vs_demand",
        "GPU allocation vs arrived demand",
        "arrived GPU demand (% of capacity)",
        "GPUs allocated (% of capacity)",
        &series,
    );
    assert!(written.is_ok(), "{written:?}");
    check_files(&written.unwrap_or_default(), &["allocation_vs_demand"]);
    let text = svg(&dir, "allocation_vs_demand");
    assert!(text.contains("seed 0") && text.contains("seed 11"));
    assert!(text.contains("stroke-dasharray") || text.matches("<polyline").count() > 12);
    let _ = std::fs::remove_dir_all(scratch("lines"));
}

#[test]
fn charts_as_svg_text_are_labelled_deterministic_and_need_no_folder() {
    let series = vec![
        Series { label: "allocated".into(), points: vec![(0.0, 1.0), (1.0, 3.0)] },
        Series { label: "free".into(), points: vec![(0.0, 7.0), (1.0, 5.0)] },
    ];
    let line = line_chart_svg("fleet", "GPUs over time", "minutes ago", "GPUs", &series);
    let again = line_chart_svg("fleet", "GPUs over time", "minutes ago", "GPUs", &series);
    let line = line.expect("a line chart draws");
    assert_eq!(Some(&line), again.as_ref().ok());
    assert!(line.starts_with("<svg") && line.contains("allocated") && line.contains("free"));
    assert!(line.contains("GPUs over time"));
    let rows = vec!["research".to_string(), "prod".to_string()];
    let bars = bar_chart_svg(
        "projects",
        "GPU-hours per project",
        "GPU-hours",
        &["allocated", "useful"],
        &rows,
        &[vec![2.0, 1.0], vec![f64::NAN, -1.0]],
    )
    .expect("a bar chart draws");
    assert!(bars.contains("research") && bars.contains("prod") && bars.contains("useful"));
    let empty = bar_chart_svg("none", "t", "x", &["a"], &[], &[]).expect("empty bars draw");
    assert!(empty.contains("no projects"));
}

#[test]
fn bad_names_and_unwritable_folders_are_errors_with_paths() {
    let dir = scratch("bad");
    for stem in ["", "../escape", ".hidden", "a/b", "sp ace"] {
        let err = line_chart(&dir, stem, "t", "x", "y", &[]);
        assert!(matches!(err, Err(ChartError::InvalidStem { .. })), "{stem}: {err:?}");
    }
    // A file where the folder should be.
    let _ = std::fs::create_dir_all(&dir);
    let blocker = dir.join("file");
    let _ = std::fs::write(&blocker, "x");
    let err = write_replay_charts(&blocker.join("charts"), &[]);
    match err {
        Err(e @ ChartError::CreateDir { .. }) => {
            assert!(e.to_string().contains("file/charts"), "{e}");
        }
        other => panic!("expected CreateDir, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
