//! Terminal table, JSON and CSV rendering of replay reports, and the generic table/CSV helpers.

use allot_sim::outcome::{ProjectLedger, ReplayReport, TimelinePoint};
use allot_sim::report::{csv_line, replay_csv, replay_json, replay_text, table};
use serde_json::Value;

fn s(x: &str) -> String {
    x.to_owned()
}

fn report(policy: &str, delays: usize, points: usize) -> ReplayReport {
    ReplayReport {
        policy: policy.to_owned(),
        seed: 42,
        jobs_total: 65_797,
        jobs_finished: 65_000,
        jobs_pending: 700,
        jobs_cancelled: 97,
        jct_s_mean: 12_345.678,
        queue_delay_s_p50: 3.25,
        queue_delay_s_p95: 600.0,
        queue_delay_s_p99: 7200.5,
        big_jobs: 2,
        big_queue_delay_s_mean: 900.0,
        big_queue_delay_s_p50: 600.0,
        big_queue_delay_s_p95: 1200.0,
        big_queue_delay_s_max: 1200.0,
        gpu_allocated_pct: 87.345,
        gpu_active_pct: 52.1,
        preemptions: 1234,
        jobs_preempted: 321,
        preemptions_per_job_max: 7,
        lost_gpu_hours: 10.04,
        goodput: 0.8734,
        wall_ms: 1500,
        timeline: (0..points)
            .map(|i| TimelinePoint {
                t_s: i as f64 * 60.0,
                allocated_gpus: (i % 100) as f64,
                active_gpus: (i % 50) as f64,
                pending_jobs: i % 7,
            })
            .collect(),
        queue_delays_s: (0..delays).map(|i| (i * i) as f64 / 100.0).collect(),
        projects: vec![
            ProjectLedger {
                project: s("vc-small"),
                allocated_gpu_hours: 10.0,
                active_gpu_hours: 5.0,
                useful_gpu_hours: 4.0,
                lost_gpu_hours: 1.0,
                jobs_finished: 3,
                ..ProjectLedger::default()
            },
            ProjectLedger {
                project: s("vc-big"),
                allocated_gpu_hours: 1000.0,
                active_gpu_hours: 800.0,
                useful_gpu_hours: 750.5,
                lost_gpu_hours: 0.0,
                jobs_finished: 1200,
                ..ProjectLedger::default()
            },
        ],
        capacity_gpus: 2490.0,
        span_s: 86_400.0,
        allocated_gpu_hours: 1010.0,
        active_gpu_hours: 805.0,
        useful_gpu_hours: 754.5,
        idle_gpu_hours: 245.46,
        decide_calls: 12_345,
        bad_rows_skipped: 2,
        rehearsal: None,
        by_job: Default::default(),
    }
}

#[test]
fn table_aligns_text_left_and_numbers_right() {
    let rows = vec![
        vec![s("alpha"), s("1"), s("n/a"), s("x")],
        vec![s("b"), s("1,234.5"), s("-3"), s("longer")],
        vec![s("gamma"), s("12%"), s("n/a")],
    ];
    let got = table(&["name", "value", "delta", "note"], &rows);
    let want = "\
name     value  delta  note
alpha        1    n/a  x
b      1,234.5     -3  longer
gamma      12%    n/a
";
    assert_eq!(got, want);
}

#[test]
fn table_handles_ragged_rows_control_characters_and_nothing() {
    assert_eq!(table(&[], &[]), "");
    assert_eq!(table(&["a", "b"], &[]), "a  b\n");
    let rows = vec![vec![s("x\ny"), s("1"), s("extra")]];
    assert_eq!(table(&["h"], &rows), "h\nx y  1  extra\n");
    // A column of placeholders only is text, and `inf`/`NaN` count as numbers.
    let rows = vec![vec![s("-"), s("inf")], vec![s(""), s("10")]];
    assert_eq!(table(&["p", "q"], &rows), "p    q\n-  inf\n    10\n");
}

#[test]
fn csv_quotes_per_rfc_4180() {
    let fields = vec![s("plain"), s("a,b"), s("say \"hi\""), s("two\nlines"), s(""), s("cr\r")];
    assert_eq!(csv_line(&fields), "plain,\"a,b\",\"say \"\"hi\"\"\",\"two\nlines\",,\"cr\r\"");
    assert_eq!(csv_line(&[]), "");
    assert_eq!(csv_line(&[s(" spaced ")]), " spaced ");
}

#[test]
fn text_shows_policies_side_by_side_with_units_and_ledger() {
    let text = replay_text(&[report("default", 10, 10), report("fifo", 10, 10)]);
    let want = "\
figure                   unit    default      fifo
jobs_total               jobs     65,797    65,797
jobs_finished            jobs     65,000    65,000
jobs_pending             jobs        700       700
jobs_cancelled           jobs         97        97
jct_s_mean               s      12,345.7  12,345.7
queue_delay_s_p50        s           3.2       3.2
queue_delay_s_p95        s         600.0     600.0
queue_delay_s_p99        s       7,200.5   7,200.5
big_jobs                 jobs          2         2
big_queue_delay_s_mean   s         900.0     900.0
big_queue_delay_s_p50    s         600.0     600.0
big_queue_delay_s_p95    s       1,200.0   1,200.0
big_queue_delay_s_max    s       1,200.0   1,200.0
gpu_allocated_pct        %          87.3      87.3
gpu_active_pct           %          52.1      52.1
preemptions                        1,234     1,234
jobs_preempted           jobs        321       321
preemptions_per_job_max                7         7
lost_gpu_hours           GPU-h      10.0      10.0
goodput                  %          87.3      87.3
wall_ms                  ms        1,500     1,500
seed                                  42        42
capacity_gpus            GPUs      2,490     2,490
span_s                   s      86,400.0  86,400.0
allocated_gpu_hours      GPU-h   1,010.0   1,010.0
active_gpu_hours         GPU-h     805.0     805.0
useful_gpu_hours         GPU-h     754.5     754.5
idle_gpu_hours           GPU-h     245.5     245.5
decide_calls                      12,345    12,345
bad_rows_skipped         rows          2         2

per project
project   policy   allocated GPU-h  active GPU-h  useful GPU-h  lost GPU-h  jobs finished  useful/allocated %
vc-big    default          1,000.0         800.0         750.5         0.0          1,200                75.0
vc-big    fifo             1,000.0         800.0         750.5         0.0          1,200                75.0
vc-small  default             10.0           5.0           4.0         1.0              3                40.0
vc-small  fifo                10.0           5.0           4.0         1.0              3                40.0
";
    assert_eq!(text, want);
    assert!(text.ends_with('\n'));
}

#[test]
fn text_json_csv_survive_empty_and_non_finite_input() {
    assert_eq!(replay_text(&[]), "no policies were replayed\n");
    assert_eq!(replay_json(&[]), "{\n  \"policies\": []\n}\n");
    assert!(replay_csv(&[]).starts_with("policy,seed,jobs_total,"));
    assert_eq!(replay_csv(&[]).lines().count(), 1);

    let odd = ReplayReport {
        jct_s_mean: f64::NAN,
        goodput: f64::INFINITY,
        queue_delays_s: vec![f64::NAN; 2000],
        timeline: vec![TimelinePoint { t_s: f64::NAN, ..TimelinePoint::default() }],
        projects: vec![ProjectLedger::default()],
        ..ReplayReport::default()
    };
    let text = replay_text(std::slice::from_ref(&odd));
    assert!(text.contains("n/a") && text.contains("inf"), "{text}");
    let json: Value =
        serde_json::from_str(&replay_json(std::slice::from_ref(&odd))).unwrap_or(Value::Null);
    // One policy: its object is the whole document.
    assert_eq!(json["jct_s_mean"], Value::Null);
    assert_eq!(json["queue_delay_percentiles_s"], Value::Array(vec![]));
    let csv = replay_csv(&[odd]);
    assert_eq!(csv.lines().count(), 2);
    assert!(csv.lines().nth(1).unwrap_or("").starts_with(",0,0,0,0,0,,"), "{csv}");
}

#[test]
fn json_is_deterministic_ordered_and_bounded() {
    let reports = [report("default", 5000, 5000), report("small", 10, 10)];
    let a = replay_json(&reports);
    let b = replay_json(&reports.clone());
    assert_eq!(a, b);
    // Field order is the struct's: policy first, series last.
    let policy_at = a.find("\"policy\"").unwrap_or(usize::MAX);
    let seed_at = a.find("\"seed\"").unwrap_or(0);
    let wall_at = a.find("\"wall_ms\"").unwrap_or(0);
    let projects_at = a.find("\"projects\"").unwrap_or(0);
    assert!(policy_at < seed_at && seed_at < wall_at && wall_at < projects_at);

    let doc: Value = serde_json::from_str(&a).unwrap_or(Value::Null);
    let big = &doc["policies"][0];
    assert_eq!(big["jobs_total"], 65_797);
    assert_eq!(big["queue_delays_total"], 5000);
    assert!(big.get("queue_delays_s").is_none());
    let cdf: Vec<f64> = big["queue_delay_percentiles_s"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    assert_eq!(cdf.len(), 101);
    assert!(cdf.windows(2).all(|w| w[0] <= w[1]), "monotone");
    assert_eq!(cdf[0], 0.0);
    assert_eq!(cdf[100], (4999.0 * 4999.0) / 100.0);
    assert_eq!(big["timeline_points_total"], 5000);
    let timeline = big["timeline"].as_array().cloned().unwrap_or_default();
    assert_eq!(timeline.len(), 1000);
    assert_eq!(timeline[0]["t_s"], 0.0);
    assert_eq!(timeline[999]["t_s"], 4999.0 * 60.0);
    assert_eq!(big["projects"][1]["project"], "vc-big");

    let small = &doc["policies"][1];
    assert_eq!(small["queue_delays_s"].as_array().map(Vec::len), Some(10));
    assert!(small.get("queue_delay_percentiles_s").is_none());
    assert_eq!(small["timeline"].as_array().map(Vec::len), Some(10));
    // Timeline points keep t_s first.
    assert!(a.contains("{\n          \"t_s\": 0.0,\n          \"allocated_gpus\""), "{a}");
}

#[test]
fn json_has_every_field_of_the_report() {
    // A field added to ReplayReport later shows up in the JSON without touching report.rs.
    let doc: Value =
        serde_json::from_str(&replay_json(&[report("p", 3, 3)])).unwrap_or(Value::Null);
    let whole = serde_json::to_value(report("p", 3, 3)).unwrap_or(Value::Null);
    for key in whole.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default()
    {
        assert!(doc.get(&key).is_some(), "missing {key}");
    }
}

#[test]
fn csv_has_one_row_per_policy_with_scalars_only() {
    let mut quoted = report("a,b", 10, 10);
    quoted.jct_s_mean = 0.1;
    let csv = replay_csv(&[report("default", 10, 10), quoted.clone()]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0],
        "policy,seed,jobs_total,jobs_finished,jobs_pending,jobs_cancelled,jct_s_mean,\
         queue_delay_s_p50,queue_delay_s_p95,queue_delay_s_p99,big_jobs,big_queue_delay_s_mean,\
         big_queue_delay_s_p50,big_queue_delay_s_p95,big_queue_delay_s_max,gpu_allocated_pct,gpu_active_pct,\
         preemptions,jobs_preempted,preemptions_per_job_max,lost_gpu_hours,goodput,wall_ms,capacity_gpus,span_s,allocated_gpu_hours,\
         active_gpu_hours,useful_gpu_hours,idle_gpu_hours,decide_calls,bad_rows_skipped"
    );
    assert_eq!(
        lines[1],
        "default,42,65797,65000,700,97,12345.678,3.25,600,7200.5,2,900,600,1200,1200,87.345,52.1,1234,321,7,10.04,0.8734,1500,\
         2490,86400,1010,805,754.5,245.46,12345,2"
    );
    assert!(lines[2].starts_with("\"a,b\",42,65797,65000,700,97,0.1,"), "{csv}");
    assert_eq!(csv, replay_csv(&[report("default", 10, 10), quoted]), "deterministic");
}
