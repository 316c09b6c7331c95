//! The policy's idle reclaim rules (`idle:`, PRODUCT.md §3) and the knobs beside them
//! (`restart_cost`, `idle_resume_backoff`).
//!
//! Each rule names a model (`allot_core::idle`): `allot`'s own, or one of the two baselines,
//! which are checked the way their products check them (`shared/docs/reference/products.md`
//! §2.1–2.2): AMD Resource Manager's API refuses an idle timer under 15 minutes or not in whole
//! minutes and has no warning and no report-only policy; Run:ai's threshold is fixed at 0 %.
//! Settings only `allot` has (sustain window, missing telemetry, start-up grace, quiet timer)
//! are refused on
//! the baselines rather than ignored, so that a comparison never runs a baseline that is not one.

use std::collections::BTreeMap;

use allot_core::idle::{IdleModel, IdleRule, MissingTelemetry};
use allot_core::{
    IDLE_BACKOFF_MAX_MS, IdlePolicySpec, IdleWhen, PreemptionMode, PriorityClassSpec, ProjectSpec,
    WorkloadKind,
};

use super::MODES;
use crate::decode::{self, Ctx, Fields, fields, index, list};
use crate::tree::{Node, Pos};
use crate::workloads::KINDS;

/// Most idle rules in one policy.
const IDLE_RULES_MAX: usize = 1_000;

const RULE_FIELDS: [&str; 16] = [
    "name",
    "projects",
    "kinds",
    "exempt_classes",
    "model",
    "threshold",
    "idle_timer",
    "sustain",
    "missing_telemetry",
    "min_runtime",
    "policy",
    "action",
    "warn_before",
    "quiet_timer",
    "quiet_below",
    "quiet_window",
];
const RULE_EXAMPLE: &str =
    "`- {name: notebooks, kinds: [notebook], threshold: 10%, idle_timer: 15m}`";

const MODELS: [(&str, IdleModel); 3] =
    [("allot", IdleModel::Allot), ("amd_rm", IdleModel::AmdRm), ("runai", IdleModel::RunAi)];
const WHENS: [(&str, IdleWhen); 3] = [
    ("on_pressure", IdleWhen::OnPressure),
    ("always", IdleWhen::Always),
    ("report_only", IdleWhen::ReportOnly),
];
const MISSING: [(&str, MissingTelemetry); 3] = [
    ("hold", MissingTelemetry::Hold),
    ("idle", MissingTelemetry::Idle),
    ("active", MissingTelemetry::Active),
];

const MINUTE_MS: u64 = 60_000;
/// AMD Resource Manager's API validation: the idle timer ("gracePeriod") is at least 900 s.
const AMD_TIMER_MIN_MS: u64 = 15 * MINUTE_MS;
/// The default threshold of `allot` and `amd_rm`: 10 %.
const THRESHOLD_DEFAULT_PERMILLE: u16 = 100;
/// The default idle timer of `allot` and `amd_rm`.
const TIMER_DEFAULT_MS: u64 = 15 * MINUTE_MS;
/// `allot`'s default warning before the action (shortened to the idle timer, or the quiet
/// timer, if that is less).
const WARN_BEFORE_DEFAULT_MS: u64 = 5 * MINUTE_MS;
/// Longest `quiet_window`: a day.
const QUIET_WINDOW_MAX_MS: u64 = 24 * 60 * MINUTE_MS;

/// `idle_resume_backoff:`: the first wait, at most `IDLE_BACKOFF_MAX_MS` (the engine doubles it
/// up to that bound, so a longer first wait would be silently cut).
pub(super) fn resume_backoff_ms(ctx: &mut Ctx, node: &Node) -> Option<u64> {
    let ms = decode::duration_ms(ctx, node, "idle_resume_backoff")?;
    if ms > IDLE_BACKOFF_MAX_MS {
        let max = decode::format_duration(IDLE_BACKOFF_MAX_MS);
        ctx.report(
            node.pos,
            "idle_resume_backoff",
            format!(
                "{} is longer than the longest wait, {max} (the wait doubles after each further \
                 idle reclaim, up to {max})",
                decode::format_duration(ms)
            ),
            format!("set `idle_resume_backoff` to at most {max}, e.g. 5m"),
        );
        return None;
    }
    Some(ms)
}

/// `idle:`: the rules in order. `projects` and `classes` are the policy's own (`None` when
/// they could not be read: then names are not checked against them).
pub(super) fn decode_idle(
    ctx: &mut Ctx,
    node: &Node,
    projects: Option<&[ProjectSpec]>,
    classes: Option<&[PriorityClassSpec]>,
) -> Option<Vec<IdlePolicySpec>> {
    let items = list(ctx, node, "idle", RULE_EXAMPLE)?;
    if items.len() > IDLE_RULES_MAX {
        ctx.report(
            node.pos,
            "idle",
            format!("at most {IDLE_RULES_MAX} idle rules, got {}", items.len()),
            "merge rules: one rule may cover several projects and kinds",
        );
        return None;
    }
    let known = Known {
        projects: projects.map(|p| p.iter().map(|p| p.name.as_str()).collect()),
        classes: classes.map(|c| c.iter().map(|c| c.name.as_str()).collect()),
    };
    // Decoded rules with their index in the file.
    let mut rules: Vec<(usize, IdlePolicySpec)> = Vec::new();
    let mut seen: BTreeMap<String, Pos> = BTreeMap::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index("idle", i);
        let (name, rule) = decode_rule(ctx, item, &path, &known);
        // Names are checked even on a rule that is broken otherwise.
        if let Some((name, pos)) = name {
            if let Some(first) = seen.get(&name) {
                ctx.report(
                    pos,
                    &decode::join(&path, "name"),
                    format!("idle rule `{name}` is already defined at line {}", first.line),
                    "give every idle rule a different name",
                );
                ok = false;
                continue;
            }
            seen.insert(name, pos);
        }
        let Some(rule) = rule else {
            ok = false;
            continue;
        };
        // The first rule that covers a workload judges it: a rule whose whole scope an earlier
        // rule covers never judges anything.
        if let Some((j, earlier)) = rules.iter().find(|(_, earlier)| shadows(earlier, &rule)) {
            ctx.report(
                item.pos,
                &path,
                format!(
                    "idle rule `{}` is never used: `{}` (idle[{j}]) comes first and covers every \
                     workload it covers (the first rule that covers a workload judges it)",
                    rule.name, earlier.name
                ),
                format!(
                    "move `{later}` above `{first}`, narrow `{first}` with `projects:` or \
                     `kinds:`, or remove `{later}`",
                    later = rule.name,
                    first = earlier.name
                ),
            );
            ok = false;
            continue;
        }
        rules.push((i, rule));
    }
    ok.then(|| rules.into_iter().map(|(_, r)| r).collect())
}

/// Whether `earlier` covers every project and kind `later` covers (empty: all).
fn shadows(earlier: &IdlePolicySpec, later: &IdlePolicySpec) -> bool {
    fn covers<T: PartialEq>(earlier: &[T], later: &[T]) -> bool {
        earlier.is_empty() || (!later.is_empty() && later.iter().all(|x| earlier.contains(x)))
    }
    covers(&earlier.projects, &later.projects) && covers(&earlier.kinds, &later.kinds)
}

/// The names rules may refer to.
struct Known<'p> {
    projects: Option<Vec<&'p str>>,
    classes: Option<Vec<&'p str>>,
}

/// What a rule's fields said, before the model's defaults and checks: for each field, `None`
/// when it is there but broken (reported), `Some(None)` when absent.
struct Written {
    threshold: Option<Option<u16>>,
    timer: Option<Option<u64>>,
    sustain: Option<Option<u64>>,
    missing: Option<Option<MissingTelemetry>>,
    min_runtime: Option<Option<u64>>,
    when: Option<Option<IdleWhen>>,
    action: Option<Option<PreemptionMode>>,
    warn_before: Option<Option<u64>>,
    quiet_timer: Option<Option<u64>>,
    quiet_below: Option<Option<u16>>,
    quiet_window: Option<Option<u64>>,
}

/// The judged part of a rule once the model has given its defaults and checked its limits.
struct Judged {
    rule: IdleRule,
    when: IdleWhen,
    action: PreemptionMode,
    warn_before_ms: u64,
}

/// One rule, and its name with the name's position (when the name could be read, even if the
/// rest could not).
fn decode_rule(
    ctx: &mut Ctx,
    item: &Node,
    path: &str,
    known: &Known<'_>,
) -> (Option<(String, Pos)>, Option<IdlePolicySpec>) {
    let Some(f) = fields(ctx, item, path, "an idle rule", &RULE_FIELDS, RULE_EXAMPLE) else {
        return (None, None);
    };
    let name = f
        .required(ctx, "name", "name the rule, e.g. `name: notebooks`")
        .and_then(|n| Some((decode::name(ctx, n, &f.path("name"), "`notebooks`")?, n.pos)));
    let projects = match f.get("projects") {
        None => Some(Vec::new()),
        Some(n) => names(ctx, n, &f.path("projects"), Names::Projects, known.projects.as_deref()),
    };
    let kinds = match f.get("kinds") {
        None => Some(Vec::new()),
        Some(n) => kinds(ctx, n, &f.path("kinds")),
    };
    let exempt = match f.get("exempt_classes") {
        None => Some(Vec::new()),
        Some(n) => {
            names(ctx, n, &f.path("exempt_classes"), Names::Classes, known.classes.as_deref())
        }
    };
    let model = match f.get("model") {
        None => Some(IdleModel::default()),
        Some(n) => decode::one_of(ctx, n, &f.path("model"), &MODELS),
    };
    let written = Written {
        threshold: field(ctx, &f, "threshold", decode::percent_permille),
        timer: field(ctx, &f, "idle_timer", decode::duration_ms),
        sustain: field(ctx, &f, "sustain", decode::duration_ms),
        missing: field(ctx, &f, "missing_telemetry", |ctx, n, p| {
            decode::one_of(ctx, n, p, &MISSING)
        }),
        min_runtime: field(ctx, &f, "min_runtime", decode::duration_ms),
        when: field(ctx, &f, "policy", |ctx, n, p| decode::one_of(ctx, n, p, &WHENS)),
        action: field(ctx, &f, "action", |ctx, n, p| decode::one_of(ctx, n, p, &MODES)),
        warn_before: field(ctx, &f, "warn_before", decode::duration_ms),
        quiet_timer: field(ctx, &f, "quiet_timer", decode::duration_ms),
        quiet_below: field(ctx, &f, "quiet_below", decode::percent_permille),
        quiet_window: field(ctx, &f, "quiet_window", decode::duration_ms),
    };
    // A broken `model` leaves the defaults and limits unknown: the rest is reported already.
    let judged = model.and_then(|model| judge(ctx, &f, model, &written));
    let rule = (|| {
        let judged = judged?;
        Some(IdlePolicySpec {
            name: name.as_ref()?.0.clone(),
            projects: projects?,
            kinds: kinds?,
            exempt_classes: exempt?,
            rule: judged.rule,
            when: judged.when,
            action: judged.action,
            warn_before_ms: judged.warn_before_ms,
        })
    })();
    (name, rule)
}

/// An optional field read with `read`.
fn field<T>(
    ctx: &mut Ctx,
    f: &Fields<'_>,
    key: &str,
    read: impl FnOnce(&mut Ctx, &Node, &str) -> Option<T>,
) -> Option<Option<T>> {
    decode::optional(f.get(key).map(|n| read(ctx, n, &f.path(key))))
}

/// The model's defaults and its own limits applied to what the rule wrote.
fn judge(ctx: &mut Ctx, f: &Fields<'_>, model: IdleModel, w: &Written) -> Option<Judged> {
    let mut ok = true;
    if model != IdleModel::Allot {
        ok &= no_allot_only_settings(ctx, f, model);
    }
    let threshold = match model {
        IdleModel::RunAi => match f.get("threshold") {
            Some(n) => {
                ctx.report(
                    n.pos,
                    &f.path("threshold"),
                    "Run:ai's threshold is fixed: only 30 s windows of exactly 0 % utilisation \
                     count as idle",
                    "remove `threshold`, or use `model: allot` or `model: amd_rm` to set one",
                );
                None
            }
            None => Some(0),
        },
        IdleModel::Allot | IdleModel::AmdRm => {
            w.threshold.map(|t| t.unwrap_or(THRESHOLD_DEFAULT_PERMILLE))
        }
    };
    let timer = match (model, w.timer) {
        (IdleModel::RunAi, Some(None)) => {
            ctx.report(
                f.pos,
                &f.path("idle_timer"),
                "missing required field `idle_timer` (Run:ai's idle GPU time limit has no default)",
                "set the limit, e.g. `idle_timer: 30m`",
            );
            None
        }
        (_, timer) => timer.map(|t| t.unwrap_or(TIMER_DEFAULT_MS)),
    };
    let timer = timer.filter(|&t| timer_within_limits(ctx, f, model, t));
    let when = match (model, w.when) {
        (IdleModel::AmdRm, Some(Some(IdleWhen::ReportOnly))) => {
            if let Some(n) = f.get("policy") {
                ctx.report(
                    n.pos,
                    &f.path("policy"),
                    "AMD Resource Manager has no report-only policy, only `OnPressure` and \
                     `Always`",
                    "use `policy: on_pressure` or `policy: always`, or `model: allot` to only \
                     report",
                );
            }
            None
        }
        (IdleModel::RunAi, when) => when.map(|w| w.unwrap_or(IdleWhen::Always)),
        (IdleModel::Allot | IdleModel::AmdRm, when) => when.map(Option::unwrap_or_default),
    };
    let action = w.action.map(|a| {
        a.unwrap_or(match model {
            IdleModel::AmdRm => PreemptionMode::Delete,
            IdleModel::Allot | IdleModel::RunAi => PreemptionMode::Suspend,
        })
    });
    let warn_before = match (model, w.warn_before) {
        (IdleModel::AmdRm, Some(Some(ms))) if ms > 0 => {
            if let Some(n) = f.get("warn_before") {
                ctx.report(
                    n.pos,
                    &f.path("warn_before"),
                    "AMD Resource Manager gives no warning before it reclaims: the idle timer \
                     itself is the grace",
                    "remove `warn_before` (or set it to 0), or use `model: allot` for a warning",
                );
            }
            None
        }
        (IdleModel::Allot, Some(None)) => {
            let quiet = w.quiet_timer.flatten().filter(|&q| q > 0).unwrap_or(u64::MAX);
            Some(timer.map_or(WARN_BEFORE_DEFAULT_MS, |t| t.min(quiet).min(WARN_BEFORE_DEFAULT_MS)))
        }
        (_, warn) => warn.map(Option::unwrap_or_default),
    };
    if let (Some(warn), Some(timer), Some(n)) = (warn_before, timer, f.get("warn_before"))
        && warn > timer
    {
        let (warn, timer) = (decode::format_duration(warn), decode::format_duration(timer));
        ctx.report(
            n.pos,
            &f.path("warn_before"),
            format!(
                "warn_before {warn} is longer than idle_timer {timer}: the warning would have to \
                 come before the workload had been idle at all"
            ),
            format!("set warn_before to at most {timer}, or lengthen idle_timer"),
        );
        ok = false;
    }
    let quiet =
        if model == IdleModel::Allot { quiet_timer(ctx, f, w, timer, warn_before) } else { None };
    let rule = match model {
        IdleModel::Allot => {
            let (quiet_timer_ms, quiet_below_permille, quiet_window_ms) = quiet?;
            IdleRule {
                model,
                threshold_permille: threshold?,
                idle_timer_ms: timer?,
                sustain_ms: w.sustain?.unwrap_or(IdleRule::allot_default().sustain_ms),
                missing: w.missing?.unwrap_or_default(),
                min_runtime_ms: w.min_runtime?.unwrap_or(IdleRule::allot_default().min_runtime_ms),
                quiet_timer_ms,
                quiet_below_permille,
                quiet_window_ms,
            }
        }
        IdleModel::AmdRm => IdleRule::amd_rm(threshold?, timer?),
        IdleModel::RunAi => {
            threshold?;
            IdleRule::runai(timer?)
        }
    };
    let judged = Judged { rule, when: when?, action: action?, warn_before_ms: warn_before? };
    ok.then_some(judged)
}

/// `quiet_timer`, `quiet_below`, `quiet_window` of an `allot` rule: (timer, share, window), the
/// timer 0 when absent. The timer is above 0 and at most `idle_timer` (it is the shorter timer
/// of a quiet service), and at least `warn_before`; the share in (0, 100 %]; the window in
/// (0, 24 h]; a share or window without a timer is refused (it would do nothing). `None`
/// when any is wrong (reported) or could not be read.
fn quiet_timer(
    ctx: &mut Ctx,
    f: &Fields<'_>,
    w: &Written,
    timer: Option<u64>,
    warn_before: Option<u64>,
) -> Option<(u64, u16, u64)> {
    let defaults = IdleRule::allot_default();
    let (quiet, below, window) = (w.quiet_timer?, w.quiet_below?, w.quiet_window?);
    let mut ok = true;
    let Some(quiet) = quiet else {
        for key in ["quiet_below", "quiet_window"] {
            if let Some(n) = f.get(key) {
                ctx.report(
                    n.pos,
                    &f.path(key),
                    format!("`{key}` has no effect without `quiet_timer`"),
                    format!("add `quiet_timer` (e.g. `quiet_timer: 15m`), or remove `{key}`"),
                );
                ok = false;
            }
        }
        return ok.then_some((0, defaults.quiet_below_permille, defaults.quiet_window_ms));
    };
    let pos = |key: &str| f.get(key).map_or(f.pos, |n| n.pos);
    let shown = decode::format_duration(quiet);
    if quiet == 0 {
        ctx.report(
            pos("quiet_timer"),
            &f.path("quiet_timer"),
            "must be > 0: a zero quiet timer would reclaim a workload the moment it is idle",
            "set the timer for quiet periods, e.g. `quiet_timer: 15m`, or remove it",
        );
        ok = false;
    } else if let Some(t) = timer.filter(|&t| quiet > t) {
        ctx.report(
            pos("quiet_timer"),
            &f.path("quiet_timer"),
            format!(
                "quiet_timer {shown} is longer than idle_timer {}: it is the shorter timer used \
                 while the rule's other workloads are quiet",
                decode::format_duration(t)
            ),
            format!(
                "set quiet_timer to at most {}, or lengthen idle_timer",
                decode::format_duration(t)
            ),
        );
        ok = false;
    } else if let Some(warn) = warn_before.filter(|&wb| wb > quiet) {
        ctx.report(
            pos("quiet_timer"),
            &f.path("quiet_timer"),
            format!(
                "quiet_timer {shown} is shorter than warn_before {}: the warning would have to \
                 come before the workload had been idle at all",
                decode::format_duration(warn)
            ),
            format!("set warn_before to at most {shown}, or lengthen quiet_timer"),
        );
        ok = false;
    }
    let below = below.unwrap_or(defaults.quiet_below_permille);
    if below == 0 {
        ctx.report(
            pos("quiet_below"),
            &f.path("quiet_below"),
            "must be > 0 %: fewer than 0 % of the other workloads can never be active, so the \
             quiet timer would never apply",
            "set the share of active workloads below which the service is quiet, e.g. \
             `quiet_below: 25%`",
        );
        ok = false;
    }
    let window = window.unwrap_or(defaults.quiet_window_ms);
    if window == 0 || window > QUIET_WINDOW_MAX_MS {
        ctx.report(
            pos("quiet_window"),
            &f.path("quiet_window"),
            format!(
                "{} is not in (0, 24h]: a workload counts as active while its idle time is below \
                 this",
                decode::format_duration(window)
            ),
            "set how recently a workload must have been active to count, e.g. \
             `quiet_window: 15m`",
        );
        ok = false;
    }
    ok.then_some((quiet, below, window))
}

/// Reports `sustain`, `missing_telemetry` and `min_runtime` on a baseline model; true if none.
fn no_allot_only_settings(ctx: &mut Ctx, f: &Fields<'_>, model: IdleModel) -> bool {
    let (product, settings) = match model {
        IdleModel::Allot => return true,
        IdleModel::AmdRm => (
            "amd_rm",
            [
                (
                    "sustain",
                    "AMD Resource Manager resets the idle timer on any one sample at or above the \
                     threshold",
                ),
                ("missing_telemetry", "AMD Resource Manager counts missing samples as 0 % (idle)"),
                (
                    "min_runtime",
                    "AMD Resource Manager judges a workload from its start, with no grace",
                ),
                ("quiet_timer", "AMD Resource Manager has one idle timer per project"),
                ("quiet_below", "AMD Resource Manager has one idle timer per project"),
                ("quiet_window", "AMD Resource Manager has one idle timer per project"),
            ],
        ),
        IdleModel::RunAi => (
            "runai",
            [
                ("sustain", "Run:ai resets the idle time on any non-zero sample in a 30 s window"),
                (
                    "missing_telemetry",
                    "a Run:ai window without samples neither adds to nor resets the idle time",
                ),
                ("min_runtime", "Run:ai counts idle time from the workload's start, with no grace"),
                ("quiet_timer", "Run:ai has one idle GPU time limit per workload type"),
                ("quiet_below", "Run:ai has one idle GPU time limit per workload type"),
                ("quiet_window", "Run:ai has one idle GPU time limit per workload type"),
            ],
        ),
    };
    let mut ok = true;
    for (key, why) in settings {
        if let Some(n) = f.get(key) {
            ctx.report(
                n.pos,
                &f.path(key),
                format!("`{key}` is a setting of the allot model, not of `{product}`: {why}"),
                format!("remove `{key}`, or use `model: allot`"),
            );
            ok = false;
        }
    }
    ok
}

/// The idle timer's limits: above 0 for every model; AMD's API validation (at least 15 min,
/// whole minutes); Run:ai's limits are set in days, hours and minutes.
fn timer_within_limits(ctx: &mut Ctx, f: &Fields<'_>, model: IdleModel, ms: u64) -> bool {
    let pos = f.get("idle_timer").map_or(f.pos, |n| n.pos);
    let path = f.path("idle_timer");
    let shown = decode::format_duration(ms);
    match model {
        IdleModel::AmdRm if ms < AMD_TIMER_MIN_MS || !ms.is_multiple_of(MINUTE_MS) => {
            ctx.report(
                pos,
                &path,
                format!(
                    "AMD Resource Manager's idle timer must be at least 15 minutes and a whole \
                     number of minutes (its API checks both), got {shown}"
                ),
                "set `idle_timer` to 15m or more in whole minutes (e.g. 15m, 20m), or use \
                 `model: allot` for another timer",
            );
            false
        }
        IdleModel::RunAi if ms == 0 || !ms.is_multiple_of(MINUTE_MS) => {
            ctx.report(
                pos,
                &path,
                format!(
                    "Run:ai's idle GPU time limit is a positive number of minutes (it is set in \
                     days, hours and minutes), got {shown}"
                ),
                "set `idle_timer` in whole minutes, e.g. 15m or 1h30m",
            );
            false
        }
        IdleModel::Allot if ms == 0 => {
            ctx.report(
                pos,
                &path,
                "must be > 0: a zero idle timer would reclaim a workload the moment it is idle",
                "set how long a workload may stay idle, e.g. `idle_timer: 15m`",
            );
            false
        }
        _ => true,
    }
}

#[derive(Clone, Copy)]
enum Names {
    Projects,
    Classes,
}

/// A list of project or priority class names, each one the policy defines, none twice.
fn names(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    what: Names,
    known: Option<&[&str]>,
) -> Option<Vec<String>> {
    let (example, singular, section, key) = match what {
        Names::Projects => ("`[vision, nlp]`", "project", "projects", "projects"),
        Names::Classes => ("`[high]`", "priority class", "priority_classes", "exempt_classes"),
    };
    let items = list(ctx, node, path, example)?;
    if items.is_empty() {
        let fix = match what {
            Names::Projects => "remove `projects:` to cover every project, or name some",
            Names::Classes => "remove `exempt_classes:` to exempt no class, or name some",
        };
        ctx.report(node.pos, path, format!("`{key}` is an empty list"), fix);
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let item_path = index(path, i);
        let Some(name) = decode::name(ctx, item, &item_path, example) else {
            ok = false;
            continue;
        };
        if let Some(known) = known
            && !known.contains(&name.as_str())
        {
            ctx.report(
                item.pos,
                &item_path,
                format!("unknown {singular} `{name}`"),
                decode::did_you_mean(
                    &name,
                    known.iter().copied(),
                    &format!("define it under {section}, or use one of"),
                ),
            );
            ok = false;
            continue;
        }
        if out.contains(&name) {
            ctx.report(
                item.pos,
                &item_path,
                format!("{singular} `{name}` is listed twice"),
                "list each name once",
            );
            ok = false;
            continue;
        }
        out.push(name);
    }
    ok.then_some(out)
}

/// `kinds: [notebook, inference]`: each a workload kind, none twice.
fn kinds(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Vec<WorkloadKind>> {
    let items = list(ctx, node, path, "`[notebook, inference]`")?;
    if items.is_empty() {
        ctx.report(
            node.pos,
            path,
            "`kinds` is an empty list",
            "remove `kinds:` to cover every kind, or name some",
        );
        return None;
    }
    let mut out: Vec<WorkloadKind> = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let item_path = index(path, i);
        let Some(kind) = decode::one_of(ctx, item, &item_path, &KINDS) else {
            ok = false;
            continue;
        };
        if out.contains(&kind) {
            ctx.report(
                item.pos,
                &item_path,
                format!("kind `{}` is listed twice", kind.as_str()),
                "list each kind once",
            );
            ok = false;
            continue;
        }
        out.push(kind);
    }
    ok.then_some(out)
}
