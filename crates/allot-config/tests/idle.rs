//! Idle reclaim rules in the policy file: each model's defaults and limits, first-match order,
//! and every mistake reported with its line, field path and a fix, the file refused.

use allot_config::{Diagnostic, parse_policy, render};
use allot_core::idle::{IdleModel, IdleRule, MissingTelemetry};
use allot_core::{IdlePolicySpec, IdleWhen, PolicySpec, PreemptionMode, WorkloadKind};

const MIN: u64 = 60_000;

/// Eight lines; the first idle rule is on line 9.
const HEAD: &str = "\
priority_classes:
  - {name: low, value: -100}
  - {name: high, value: 100, preemptible: false}
default_priority_class: low
projects:
  - {name: vision}
  - {name: nlp}
idle:
";

fn with_rules(rules: &str) -> String {
    format!("{HEAD}{rules}")
}

fn ok(text: &str) -> PolicySpec {
    match parse_policy("p.yaml", text) {
        Ok(policy) => policy,
        Err(diagnostics) => panic!("unexpected diagnostics:\n{}", render(&diagnostics)),
    }
}

fn refused(text: &str) -> Vec<Diagnostic> {
    match parse_policy("p.yaml", text) {
        Ok(policy) => panic!("accepted:\n{text}\nas {:?}", policy.idle),
        Err(diagnostics) => diagnostics,
    }
}

/// The one rule of a policy with `rule` as its only idle rule.
fn only_rule(rule: &str) -> IdlePolicySpec {
    let mut policy = ok(&with_rules(&format!("  - {rule}\n")));
    assert_eq!(policy.idle.len(), 1);
    policy.idle.remove(0)
}

/// `(line, field, message fragment, fix fragment)` of every diagnostic, in file order.
struct Case {
    name: &'static str,
    text: String,
    want: Vec<(usize, &'static str, &'static str, &'static str)>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "unknown project, kind and class, with suggestions",
            text: with_rules(
                "  - {name: a, projects: [visoin], kinds: [notebok], exempt_classes: [hihg]}\n",
            ),
            want: vec![
                (9, "idle[0].projects[0]", "unknown project `visoin`", "did you mean `vision`?"),
                (9, "idle[0].kinds[0]", "`notebok` is not one of", "did you mean `notebook`?"),
                (
                    9,
                    "idle[0].exempt_classes[0]",
                    "unknown priority class `hihg`",
                    "did you mean `high`?",
                ),
            ],
        },
        Case {
            name: "unknown project with nothing close",
            text: with_rules("  - {name: a, projects: [finance]}\n"),
            want: vec![(
                9,
                "idle[0].projects[0]",
                "unknown project `finance`",
                "define it under projects, or use one of `vision` or `nlp`",
            )],
        },
        Case {
            name: "empty scope lists and names listed twice",
            text: with_rules(
                "  - {name: a, projects: [], kinds: [notebook, notebook], exempt_classes: [high, high]}\n",
            ),
            want: vec![
                (9, "idle[0].projects", "`projects` is an empty list", "to cover every project"),
                (9, "idle[0].kinds[1]", "kind `notebook` is listed twice", "once"),
                (9, "idle[0].exempt_classes[1]", "`high` is listed twice", "once"),
            ],
        },
        Case {
            name: "missing and duplicate rule names",
            text: with_rules(
                "  - {kinds: [notebook]}\n  - {name: a, kinds: [notebook]}\n  - {name: a, kinds: [service]}\n",
            ),
            want: vec![
                (9, "idle[0].name", "missing required field `name`", "name: notebooks"),
                (11, "idle[2].name", "idle rule `a` is already defined at line 10", "different"),
            ],
        },
        Case {
            name: "thresholds out of range, too fine, not numbers",
            text: with_rules(
                "  - {name: a, kinds: [notebook], threshold: 150%}\n  \
                 - {name: b, kinds: [service], threshold: -5%}\n  \
                 - {name: c, kinds: [batch], threshold: 2.55%}\n  \
                 - {name: d, kinds: [training], threshold: ten}\n",
            ),
            want: vec![
                (9, "idle[0].threshold", "must be between 0 and 100 %, got 150%", "e.g. 10%"),
                (10, "idle[1].threshold", "must be between 0 and 100 %, got -5%", "e.g. 10%"),
                (11, "idle[2].threshold", "finer than 0.1 %", "one decimal"),
                (12, "idle[3].threshold", "`ten` is not a percentage", "e.g. 10%"),
            ],
        },
        Case {
            name: "allot: zero timer, warning longer than the timer, bad durations",
            text: with_rules(
                "  - {name: a, kinds: [notebook], idle_timer: 0}\n  \
                 - {name: b, kinds: [service], idle_timer: 10m, warn_before: 15m}\n  \
                 - {name: c, kinds: [batch], sustain: -1m, min_runtime: 5 minutes}\n",
            ),
            want: vec![
                (9, "idle[0].idle_timer", "must be > 0", "idle_timer: 15m"),
                (
                    10,
                    "idle[1].warn_before",
                    "warn_before 15m is longer than idle_timer 10m",
                    "at most 10m",
                ),
                (11, "idle[2].sustain", "must be ≥ 0", "e.g. 30s"),
                (11, "idle[2].min_runtime", "is not a duration", "e.g. 30s"),
            ],
        },
        Case {
            name: "amd_rm: AMD's API limits on the idle timer",
            text: with_rules(
                "  - {name: a, kinds: [notebook], model: amd_rm, idle_timer: 10m}\n  \
                 - {name: b, kinds: [service], model: amd_rm, idle_timer: 15m30s}\n",
            ),
            want: vec![
                (
                    9,
                    "idle[0].idle_timer",
                    "at least 15 minutes and a whole number of minutes (its API checks both), got 10m",
                    "set `idle_timer` to 15m or more in whole minutes",
                ),
                (
                    10,
                    "idle[1].idle_timer",
                    "got 15m30s",
                    "set `idle_timer` to 15m or more in whole minutes",
                ),
            ],
        },
        Case {
            name: "amd_rm: no report-only policy and no warning",
            text: with_rules(
                "  - {name: a, model: amd_rm, policy: report_only, warn_before: 5m}\n",
            ),
            want: vec![
                (9, "idle[0].policy", "no report-only policy", "`policy: on_pressure`"),
                (9, "idle[0].warn_before", "gives no warning", "remove `warn_before`"),
            ],
        },
        Case {
            name: "amd_rm: allot-only settings",
            text: with_rules(
                "  - {name: a, model: amd_rm, sustain: 60s, missing_telemetry: hold, min_runtime: 5m}\n",
            ),
            want: vec![
                (
                    9,
                    "idle[0].sustain",
                    "`sustain` is a setting of the allot model, not of `amd_rm`",
                    "remove `sustain`, or use `model: allot`",
                ),
                (
                    9,
                    "idle[0].missing_telemetry",
                    "counts missing samples as 0 %",
                    "remove `missing_telemetry`, or use `model: allot`",
                ),
                (
                    9,
                    "idle[0].min_runtime",
                    "not of `amd_rm`",
                    "remove `min_runtime`, or use `model: allot`",
                ),
            ],
        },
        Case {
            name: "runai: fixed threshold, required timer in minutes, allot-only settings",
            text: with_rules(
                "  - {name: a, kinds: [notebook], model: runai, threshold: 0}\n  \
                 - {name: b, kinds: [service], model: runai, idle_timer: 90s, sustain: 1m, min_runtime: 1m, missing_telemetry: idle}\n",
            ),
            want: vec![
                (9, "idle[0].idle_timer", "missing required field `idle_timer`", "idle_timer: 30m"),
                (9, "idle[0].threshold", "Run:ai's threshold is fixed", "remove `threshold`"),
                (10, "idle[1].idle_timer", "positive number of minutes", "whole minutes"),
                (10, "idle[1].sustain", "not of `runai`", "remove `sustain`"),
                (10, "idle[1].min_runtime", "not of `runai`", "remove `min_runtime`"),
                (10, "idle[1].missing_telemetry", "not of `runai`", "remove `missing_telemetry`"),
            ],
        },
        Case {
            name: "unknown model, policy, action and missing telemetry",
            text: with_rules(
                "  - {name: a, model: kaiwo, policy: on-pressure, action: kill, missing_telemetry: held}\n",
            ),
            want: vec![
                (9, "idle[0].model", "`kaiwo` is not one of allot, amd_rm, runai", "use one of"),
                (9, "idle[0].policy", "`on-pressure` is not one of", "did you mean `on_pressure`?"),
                (
                    9,
                    "idle[0].action",
                    "`kill` is not one of suspend, requeue, delete",
                    "use one of",
                ),
                (9, "idle[0].missing_telemetry", "`held` is not one of", "did you mean `hold`?"),
            ],
        },
        Case {
            name: "unknown field in a rule",
            text: with_rules("  - {name: a, idle_time: 15m}\n"),
            want: vec![(
                9,
                "idle[0].idle_time",
                "unknown field `idle_time` in an idle rule",
                "did you mean `idle_timer`?",
            )],
        },
        Case {
            name: "rules an earlier rule shadows",
            text: with_rules(
                "  - {name: all-notebooks, kinds: [notebook]}\n  \
                 - {name: vision-notebooks, projects: [vision], kinds: [notebook]}\n  \
                 - {name: everything}\n  \
                 - {name: services, kinds: [service]}\n",
            ),
            want: vec![
                (
                    10,
                    "idle[1]",
                    "`vision-notebooks` is never used: `all-notebooks` (idle[0]) comes first",
                    "move `vision-notebooks` above `all-notebooks`",
                ),
                (
                    12,
                    "idle[3]",
                    "`services` is never used: `everything` (idle[2]) comes first",
                    "move `services` above `everything`",
                ),
            ],
        },
        Case {
            name: "quiet timer: longer than the idle timer, zero, shorter than the warning",
            text: with_rules(
                "  - {name: a, kinds: [inference], idle_timer: 30m, quiet_timer: 1h}\n  \
                 - {name: b, kinds: [service], quiet_timer: 0}\n  \
                 - {name: c, kinds: [notebook], quiet_timer: 2m, warn_before: 5m}\n",
            ),
            want: vec![
                (
                    9,
                    "idle[0].quiet_timer",
                    "quiet_timer 1h is longer than idle_timer 30m",
                    "set quiet_timer to at most 30m",
                ),
                (10, "idle[1].quiet_timer", "must be > 0", "e.g. `quiet_timer: 15m`"),
                (
                    11,
                    "idle[2].quiet_timer",
                    "quiet_timer 2m is shorter than warn_before 5m",
                    "set warn_before to at most 2m",
                ),
            ],
        },
        Case {
            name: "quiet share and window: out of range, or without a quiet timer",
            text: with_rules(
                "  - {name: a, kinds: [inference], quiet_timer: 10m, quiet_below: 0%, \
                 quiet_window: 2d}\n  \
                 - {name: b, kinds: [service], quiet_below: 30%, quiet_window: 10m}\n  \
                 - {name: c, kinds: [batch], quiet_timer: 10m, quiet_below: 120%}\n",
            ),
            want: vec![
                (9, "idle[0].quiet_below", "must be > 0 %", "e.g. `quiet_below: 25%`"),
                (9, "idle[0].quiet_window", "2d is not in (0, 24h]", "`quiet_window: 15m`"),
                (
                    10,
                    "idle[1].quiet_below",
                    "has no effect without `quiet_timer`",
                    "add `quiet_timer`",
                ),
                (
                    10,
                    "idle[1].quiet_window",
                    "has no effect without `quiet_timer`",
                    "add `quiet_timer`",
                ),
                (11, "idle[2].quiet_below", "between 0 and 100 %", "write a percentage"),
            ],
        },
        Case {
            name: "the baselines have no quiet timer",
            text: with_rules(
                "  - {name: a, model: amd_rm, kinds: [inference], quiet_timer: 15m}\n  \
                 - {name: b, model: runai, kinds: [service], idle_timer: 30m, quiet_below: 20%}\n",
            ),
            want: vec![
                (9, "idle[0].quiet_timer", "not of `amd_rm`", "use `model: allot`"),
                (10, "idle[1].quiet_below", "not of `runai`", "use `model: allot`"),
            ],
        },
        Case {
            name: "idle is not a list",
            text: with_rules("  name: a\n"),
            want: vec![(9, "idle", "expected a list, got a mapping", "one `- ` item per entry")],
        },
        Case {
            name: "a rule is not a mapping",
            text: with_rules("  - notebooks\n"),
            want: vec![(9, "idle[0]", "expected an idle rule as a mapping", "name: notebooks")],
        },
        Case {
            name: "restart cost and resume backoff",
            text: format!("restart_cost: soon\nidle_resume_backoff: 5h\n{HEAD}"),
            want: vec![
                (1, "restart_cost", "`soon` is not a duration", "e.g. 30s"),
                (2, "idle_resume_backoff", "5h is longer than the longest wait, 4h", "at most 4h"),
            ],
        },
    ]
}

#[test]
fn each_mistake_names_line_field_and_fix_and_the_file_is_refused() {
    for case in cases() {
        let got = refused(&case.text);
        let rendered = render(&got);
        assert_eq!(got.len(), case.want.len(), "{}: got\n{rendered}", case.name);
        for (d, (line, field, message, fix)) in got.iter().zip(&case.want) {
            assert_eq!(
                (d.line, d.field.as_str()),
                (*line, *field),
                "{}: got\n{rendered}",
                case.name
            );
            assert!(d.message.contains(message), "{}: want `{message}` in\n{rendered}", case.name);
            assert!(d.fix.contains(fix), "{}: want fix `{fix}` in\n{rendered}", case.name);
            assert!(d.column > 0, "{}: no column in\n{rendered}", case.name);
            assert_eq!(d.file, "p.yaml");
        }
    }
}

/// Mistakes in several rules and the knobs: all reported in one run, in file order.
#[test]
fn all_idle_mistakes_are_reported_at_once() {
    let rules = "  - {name: a, projects: [nlpp], threshold: 101}
  - {name: b, model: amd_rm, idle_timer: 5m, sustain: 1m}
  - {name: c, model: runai, idle_timer: 30m, threshold: 1%, colour: red}
  - {name: a, kinds: [notebook]}
";
    let text = format!("idle_resume_backoff: -1m\n{HEAD}{rules}");
    let got = refused(&text);
    let fields: Vec<(usize, &str)> = got.iter().map(|d| (d.line, d.field.as_str())).collect();
    assert_eq!(
        fields,
        [
            (1, "idle_resume_backoff"),
            (10, "idle[0].projects[0]"),
            (10, "idle[0].threshold"),
            (11, "idle[1].idle_timer"),
            (11, "idle[1].sustain"),
            (12, "idle[2].threshold"),
            (12, "idle[2].colour"),
            (13, "idle[3].name"),
        ],
        "{}",
        render(&got)
    );
    assert_eq!(got[1].fix, "did you mean `nlp`?");
}

#[test]
fn allot_defaults() {
    let rule = only_rule("{name: a}");
    assert_eq!(rule.name, "a");
    assert!(rule.projects.is_empty() && rule.kinds.is_empty() && rule.exempt_classes.is_empty());
    assert_eq!(rule.rule, IdleRule::allot_default());
    assert_eq!(
        (rule.rule.threshold_permille, rule.rule.idle_timer_ms, rule.rule.sustain_ms),
        (100, 15 * MIN, MIN)
    );
    assert_eq!((rule.rule.missing, rule.rule.min_runtime_ms), (MissingTelemetry::Hold, 5 * MIN));
    assert_eq!((rule.when, rule.action), (IdleWhen::OnPressure, PreemptionMode::Suspend));
    assert_eq!(rule.warn_before_ms, 5 * MIN);
    assert_eq!(only_rule("{name: a, model: allot}"), rule);

    // The default warning never comes before the workload is idle at all.
    assert_eq!(only_rule("{name: a, idle_timer: 2m}").warn_before_ms, 2 * MIN);
    assert_eq!(only_rule("{name: a, idle_timer: 2m, warn_before: 2m}").warn_before_ms, 2 * MIN);
    assert_eq!(only_rule("{name: a, warn_before: 0}").warn_before_ms, 0);

    let written = only_rule(
        "{name: a, projects: [nlp, vision], kinds: [batch], exempt_classes: [high], \
         threshold: 2.5%, idle_timer: 1h30m, sustain: 5m, missing_telemetry: idle, \
         min_runtime: 0, policy: always, action: requeue, warn_before: 10m}",
    );
    assert_eq!(written.projects, ["nlp", "vision"]);
    assert_eq!(written.kinds, [WorkloadKind::Batch]);
    assert_eq!(written.exempt_classes, ["high"]);
    assert_eq!(
        written.rule,
        IdleRule {
            model: IdleModel::Allot,
            threshold_permille: 25,
            idle_timer_ms: 90 * MIN,
            sustain_ms: 5 * MIN,
            missing: MissingTelemetry::Idle,
            min_runtime_ms: 0,
            ..IdleRule::allot_default()
        }
    );
    assert_eq!((written.when, written.action), (IdleWhen::Always, PreemptionMode::Requeue));
    assert_eq!(written.warn_before_ms, 10 * MIN);
    assert_eq!(
        only_rule("{name: a, missing_telemetry: active}").rule.missing,
        MissingTelemetry::Active
    );
    assert_eq!(only_rule("{name: a, policy: report_only}").when, IdleWhen::ReportOnly);

    // No quiet timer unless written; with one, the share and window default to 25 % and 15m,
    // and the default warning is never longer than the quiet timer.
    assert_eq!(rule.rule.quiet_timer_ms, 0);
    let quiet = only_rule("{name: a, idle_timer: 1h, quiet_timer: 3m}");
    assert_eq!(quiet.rule.quiet_timer_ms, 3 * MIN);
    assert_eq!((quiet.rule.quiet_below_permille, quiet.rule.quiet_window_ms), (250, 15 * MIN));
    assert_eq!(quiet.warn_before_ms, 3 * MIN);
    let written = only_rule(
        "{name: a, idle_timer: 1h, quiet_timer: 20m, quiet_below: 40%, quiet_window: 30m}",
    );
    assert_eq!((written.rule.quiet_timer_ms, written.rule.quiet_below_permille), (20 * MIN, 400));
    assert_eq!((written.rule.quiet_window_ms, written.warn_before_ms), (30 * MIN, 5 * MIN));
}

#[test]
fn thresholds_as_percentages() {
    for (written, permille) in [
        ("10%", 100),
        ("10", 100),
        ("2.5%", 25),
        ("0.5", 5),
        ("0%", 0),
        ("100%", 1000),
        ("\"7 %\"", 70),
    ] {
        let rule = only_rule(&format!("{{name: a, threshold: {written}}}"));
        assert_eq!(rule.rule.threshold_permille, permille, "{written}");
    }
}

#[test]
fn amd_rm_defaults_and_limits() {
    let rule = only_rule("{name: a, model: amd_rm}");
    assert_eq!(rule.rule, IdleRule::amd_rm(100, 15 * MIN));
    assert_eq!(
        (rule.when, rule.action, rule.warn_before_ms),
        (IdleWhen::OnPressure, PreemptionMode::Delete, 0)
    );

    let written = only_rule(
        "{name: a, model: amd_rm, threshold: 5%, idle_timer: 16m, policy: always, action: suspend, warn_before: 0s}",
    );
    assert_eq!(written.rule, IdleRule::amd_rm(50, 16 * MIN));
    assert_eq!((written.when, written.action), (IdleWhen::Always, PreemptionMode::Suspend));
    assert_eq!(written.warn_before_ms, 0);
    // AMD's API takes 0–100 % and any whole number of minutes from 15 on.
    assert_eq!(only_rule("{name: a, model: amd_rm, threshold: 0}").rule.threshold_permille, 0);
    assert_eq!(only_rule("{name: a, model: amd_rm, idle_timer: 2h}").rule.idle_timer_ms, 120 * MIN);
}

#[test]
fn runai_defaults_and_limits() {
    let rule = only_rule("{name: a, model: runai, idle_timer: 30m}");
    assert_eq!(rule.rule, IdleRule::runai(30 * MIN));
    assert_eq!(
        (rule.when, rule.action, rule.warn_before_ms),
        (IdleWhen::Always, PreemptionMode::Suspend, 0)
    );
    // Run:ai notifies before a limit is reached, so a warning may be asked for.
    let written = only_rule(
        "{name: a, model: runai, idle_timer: 1d2h3m, policy: on_pressure, action: delete, warn_before: 10m}",
    );
    assert_eq!(written.rule, IdleRule::runai(26 * 60 * MIN + 3 * MIN));
    assert_eq!((written.when, written.action), (IdleWhen::OnPressure, PreemptionMode::Delete));
    assert_eq!(written.warn_before_ms, 10 * MIN);
}

#[test]
fn rules_keep_their_order_and_the_first_covering_rule_judges() {
    let policy = ok(&with_rules(
        "  - {name: vision-notebooks, projects: [vision], kinds: [notebook], idle_timer: 5m}
  - {name: notebooks, kinds: [notebook]}
  - {name: nlp, projects: [nlp]}
  - {name: rest}
",
    ));
    let names: Vec<&str> = policy.idle.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["vision-notebooks", "notebooks", "nlp", "rest"]);
    let judge = |project: &str, kind: WorkloadKind| {
        policy.idle.iter().find(|r| r.covers(project, kind)).map(|r| r.name.as_str())
    };
    assert_eq!(judge("vision", WorkloadKind::Notebook), Some("vision-notebooks"));
    assert_eq!(judge("nlp", WorkloadKind::Notebook), Some("notebooks"));
    assert_eq!(judge("nlp", WorkloadKind::Training), Some("nlp"));
    assert_eq!(judge("vision", WorkloadKind::Service), Some("rest"));
}

#[test]
fn without_idle_rules_nothing_is_reclaimed_and_the_knobs_have_defaults() {
    for text in
        [HEAD.trim_end_matches("idle:\n").to_string(), HEAD.to_string(), with_rules("  []\n")]
    {
        let policy = ok(&text);
        assert!(policy.idle.is_empty());
        assert_eq!(policy.restart_cost_ms, PolicySpec::DEFAULT_RESTART_COST_MS);
        assert_eq!(policy.idle_resume_backoff_ms, PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS);
    }
    let knobs = ok(&format!("restart_cost: 90s\nidle_resume_backoff: 4h\n{HEAD}"));
    assert_eq!((knobs.restart_cost_ms, knobs.idle_resume_backoff_ms), (90_000, 240 * MIN));
    let zero = ok(&format!("restart_cost: 0\nidle_resume_backoff: 0s\n{HEAD}"));
    assert_eq!((zero.restart_cost_ms, zero.idle_resume_backoff_ms), (0, 0));
}

/// Rule names are checked only against a projects section that could be read: a broken one is
/// reported once, not again through every rule that names its projects.
#[test]
fn a_broken_projects_section_is_not_reported_again_through_the_rules() {
    let text = HEAD.replace("  - {name: nlp}\n", "  - {name: nlp, weight: -1}\n")
        + "  - {name: a, projects: [nlp]}\n";
    let got = refused(&text);
    let fields: Vec<&str> = got.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(fields, ["projects[1].weight"], "{}", render(&got));
}
