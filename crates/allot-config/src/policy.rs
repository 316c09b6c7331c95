//! The policy file: fair share, pre-emption, priority classes, projects with quotas, and idle
//! reclaim rules (`idle`).

mod idle;

use std::collections::BTreeMap;

use allot_core::{
    BorrowWithinCohort, CohortSpec, Defragmentation, FairShareStrategy, FairSharing, PolicySpec,
    PreemptionGuard, PreemptionLimit, PreemptionMode, PriorityClassSpec, ProjectSpec, Queueing,
    QuotaModel, QuotaSpec, Reservations, WithinProject,
};

use crate::decode::{self, Ctx, fields, index, list};
use crate::diagnostic::Diagnostic;
use crate::tree::{self, Node, Pos};

/// Most projects and most priority classes in one policy.
const PROJECTS_MAX: usize = 10_000;
const PRIORITY_CLASSES_MAX: usize = 1_000;

const TOP_FIELDS: [&str; 11] = [
    "fair_share",
    "preemption",
    "defragmentation",
    "restart_cost",
    "idle_resume_backoff",
    "priority_classes",
    "default_priority_class",
    "projects",
    "cohorts",
    "idle",
    "reservations",
];
const COHORT_FIELDS: [&str; 3] = ["name", "parent", "quotas"];
const COHORT_EXAMPLE: &str =
    "`- {name: research, parent: org, quotas: [{model: A100, guaranteed: 4, borrow_limit: 2}]}`";
const DEFRAG_FIELDS: [&str; 2] = ["enabled", "restart_cost"];
const DEFRAG_EXAMPLE: &str =
    "`defragmentation: true`, or `defragmentation: {enabled: true, restart_cost: 2m}`";
const RESERVATION_FIELDS: [&str; 3] = ["after", "per_model_max", "hold_quota"];
const RESERVATION_EXAMPLE: &str = "`reservations: {after: 5m, per_model_max: 2}`";
const FAIR_SHARE_FIELDS: [&str; 1] = ["half_life"];
const PREEMPTION_FIELDS: [&str; 5] =
    ["mode", "fair_sharing", "exempt_after_restart", "max_per_workload", "reclaim_after"];
const LIMIT_FIELDS: [&str; 2] = ["count", "window"];
const LIMIT_EXAMPLE: &str = "`max_per_workload: {count: 3, window: 1h}`";
const FAIR_SHARING_FIELDS: [&str; 1] = ["strategies"];
const FAIR_SHARING_EXAMPLE: &str = "`fair_sharing: true`, or `fair_sharing: {strategies: \
     [less_than_or_equal_to_final_share, less_than_initial_share]}`";
const STRATEGIES: [(&str, FairShareStrategy); 2] = [
    ("less_than_or_equal_to_final_share", FairShareStrategy::LessThanOrEqualToFinalShare),
    ("less_than_initial_share", FairShareStrategy::LessThanInitialShare),
];
const CLASS_FIELDS: [&str; 3] = ["name", "value", "preemptible"];
const PROJECT_FIELDS: [&str; 9] = [
    "name",
    "cohort",
    "department",
    "weight",
    "queueing",
    "preemption_mode",
    "preempt_within_project",
    "borrow_within_cohort",
    "quotas",
];
const WITHIN_PROJECT: [(&str, WithinProject); 3] = [
    ("lower_priority", WithinProject::LowerPriority),
    ("lower_or_newer_equal_priority", WithinProject::LowerOrNewerEqualPriority),
    ("never", WithinProject::Never),
];
const BORROW_WITHIN_FIELDS: [&str; 2] = ["policy", "max_priority_threshold"];
const BORROW_WITHIN_EXAMPLE: &str =
    "`borrow_within_cohort: {policy: lower_priority, max_priority_threshold: 0}`";
/// `borrow_within_cohort`'s policies: whether it is on.
const BORROW_WITHIN_POLICIES: [(&str, bool); 2] = [("never", false), ("lower_priority", true)];
const QUOTA_FIELDS: [&str; 4] = ["model", "guaranteed", "borrow_limit", "lend_limit"];

pub(crate) const MODES: [(&str, PreemptionMode); 3] = [
    ("suspend", PreemptionMode::Suspend),
    ("requeue", PreemptionMode::Requeue),
    ("delete", PreemptionMode::Delete),
];
const QUEUEINGS: [(&str, Queueing); 2] =
    [("strict_fifo", Queueing::StrictFifo), ("best_effort_fifo", Queueing::BestEffortFifo)];

const CLASS_EXAMPLE: &str = "`- {name: medium, value: 0, preemptible: true}`";
const PROJECT_EXAMPLE: &str =
    "`- {name: vision, cohort: perception, quotas: [{model: A100, guaranteed: 8}]}`";
const QUOTA_EXAMPLE: &str = "`- {model: A100, guaranteed: 8, borrow_limit: 4, lend_limit: 2}`";

/// Parses a policy file (see the crate docs for the schema) and checks it is consistent:
/// unique names, a default priority class that exists, limits that make sense.
pub fn parse_policy(file: &str, text: &str) -> Result<PolicySpec, Vec<Diagnostic>> {
    let mut ctx = Ctx::new(file);
    let policy = tree::parse(&mut ctx, text).and_then(|root| decode_policy(&mut ctx, &root));
    ctx.finish(policy)
}

fn decode_policy(ctx: &mut Ctx, root: &Node) -> Option<PolicySpec> {
    let top = fields(
        ctx,
        root,
        "",
        "the policy file",
        &TOP_FIELDS,
        "`priority_classes:`, `default_priority_class:` and `projects:` sections",
    )?;

    let half_life = match top.get("fair_share") {
        None => Some(0),
        Some(n) => half_life_ms(ctx, n),
    };
    let (mode, fair_sharing, guard) = match top.get("preemption") {
        None => (Some(PreemptionMode::default()), Some(None), Some(PreemptionGuard::DEFAULT)),
        Some(n) => match fields(
            ctx,
            n,
            "preemption",
            "preemption",
            &PREEMPTION_FIELDS,
            "`preemption: {mode: suspend}`",
        ) {
            None => (None, None, None),
            Some(f) => {
                let others =
                    ["fair_sharing", "exempt_after_restart", "max_per_workload", "reclaim_after"];
                let mode = match f.get("mode") {
                    Some(n) => decode::one_of(ctx, n, &f.path("mode"), &MODES),
                    None if others.iter().any(|o| f.get(o).is_some()) => {
                        Some(PreemptionMode::default())
                    }
                    None => f
                        .required(ctx, "mode", "choose `mode: suspend`, `requeue` or `delete`")
                        .and_then(|n| decode::one_of(ctx, n, &f.path("mode"), &MODES)),
                };
                let fair = match f.get("fair_sharing") {
                    None => Some(None),
                    Some(n) => fair_sharing(ctx, n, &f.path("fair_sharing")),
                };
                let exempt = match f.get("exempt_after_restart") {
                    None => Some(PreemptionGuard::DEFAULT.exempt_after_restart_ms),
                    Some(n) => decode::duration_ms(ctx, n, &f.path("exempt_after_restart")),
                };
                let limit = match f.get("max_per_workload") {
                    None => Some(PreemptionGuard::DEFAULT.limit),
                    Some(n) => preemption_limit(ctx, n, &f.path("max_per_workload")),
                };
                let reclaim_after = match f.get("reclaim_after") {
                    None => Some(PreemptionGuard::DEFAULT.reclaim_after_ms),
                    Some(n) => decode::duration_ms(ctx, n, &f.path("reclaim_after")),
                };
                let guard = match (exempt, limit, reclaim_after) {
                    (Some(exempt_after_restart_ms), Some(limit), Some(reclaim_after_ms)) => {
                        Some(PreemptionGuard { exempt_after_restart_ms, limit, reclaim_after_ms })
                    }
                    _ => None,
                };
                (mode, fair, guard)
            }
        },
    };

    let defragmentation = match top.get("defragmentation") {
        None => Some(None),
        Some(n) => defragmentation(ctx, n),
    };

    let reservations = match top.get("reservations") {
        None => Some(None),
        Some(n) => reservations(ctx, n),
    };

    let classes = top
        .required(
            ctx,
            "priority_classes",
            &format!("add `priority_classes:` with a list like {CLASS_EXAMPLE}"),
        )
        .and_then(|n| decode_classes(ctx, n));

    let default_class = top
        .required(
            ctx,
            "default_priority_class",
            "name the class used when a workload names none, e.g. `default_priority_class: medium`",
        )
        .and_then(|n| {
            decode::name(ctx, n, "default_priority_class", "`medium`").map(|name| (name, n.pos))
        });
    if let (Some(classes), Some((name, pos))) = (&classes, &default_class)
        && !classes.iter().any(|c| &c.name == name)
    {
        ctx.report(
            *pos,
            "default_priority_class",
            format!("unknown priority class `{name}`"),
            decode::did_you_mean(
                name,
                classes.iter().map(|c| c.name.as_str()),
                "define it under priority_classes, or use one of",
            ),
        );
    }

    let projects = top
        .required(ctx, "projects", &format!("add `projects:` with a list like {PROJECT_EXAMPLE}"))
        .and_then(|n| decode_projects(ctx, n));

    let cohorts = match top.get("cohorts") {
        None => Some(Vec::new()),
        Some(n) => decode_cohorts(ctx, n),
    };

    let restart_cost = match top.get("restart_cost") {
        None => Some(PolicySpec::DEFAULT_RESTART_COST_MS),
        Some(n) => decode::duration_ms(ctx, n, "restart_cost"),
    };
    let resume_backoff = match top.get("idle_resume_backoff") {
        None => Some(PolicySpec::DEFAULT_IDLE_RESUME_BACKOFF_MS),
        Some(n) => idle::resume_backoff_ms(ctx, n),
    };
    // Rules name projects and classes: checked against those read above, when they could be.
    let idle_rules = match top.get("idle") {
        None => Some(Vec::new()),
        Some(n) => idle::decode_idle(ctx, n, projects.as_deref(), classes.as_deref()),
    };

    Some(PolicySpec {
        priority_classes: classes?,
        default_priority_class: default_class?.0,
        projects: projects?,
        fair_share_half_life_ms: half_life?,
        preemption_mode: mode?,
        preemption_guard: guard?,
        defragmentation: defragmentation?,
        idle: idle_rules?,
        restart_cost_ms: restart_cost?,
        idle_resume_backoff_ms: resume_backoff?,
        cohorts: cohorts?,
        fair_sharing: fair_sharing?,
        reservations: reservations?,
    })
}

/// `max_per_workload: {count: N, window: DURATION}` (both required; `false` for no cap).
fn preemption_limit(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Option<PreemptionLimit>> {
    if !matches!(node.value, tree::Value::Map(_)) {
        return match decode::boolean(ctx, node, path)? {
            false => Some(None),
            true => {
                ctx.report(
                    node.pos,
                    path,
                    "`true` does not say how many pre-emptions, nor in what time".to_string(),
                    format!("write e.g. {LIMIT_EXAMPLE}, or `false` for no cap"),
                );
                None
            }
        };
    }
    let f = fields(ctx, node, path, "max_per_workload", &LIMIT_FIELDS, LIMIT_EXAMPLE)?;
    let max = u64::from(PreemptionGuard::COUNT_MAX);
    let count = f
        .required(ctx, "count", &format!("say how many pre-emptions, e.g. {LIMIT_EXAMPLE}"))
        .and_then(|n| decode::uint(ctx, n, &f.path("count"), 1, max, "3"));
    let window = f
        .required(ctx, "window", &format!("say in what time, e.g. {LIMIT_EXAMPLE}"))
        .and_then(|n| {
            let ms = decode::duration_ms(ctx, n, &f.path("window"))?;
            if ms == 0 {
                ctx.report(
                    n.pos,
                    &f.path("window"),
                    "a window of 0 counts nothing".to_string(),
                    format!("give a duration, e.g. {LIMIT_EXAMPLE}, or `max_per_workload: false`"),
                );
                return None;
            }
            Some(ms)
        });
    let (count, window_ms) = (count?, window?);
    Some(Some(PreemptionLimit { count: count as u32, window_ms }))
}

/// `fair_sharing: true|false`, or `{strategies: [..]}` (one or both, each once; Kueue's
/// `fairSharing.preemptionStrategies`).
fn fair_sharing(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Option<FairSharing>> {
    if !matches!(node.value, tree::Value::Map(_)) {
        return decode::boolean(ctx, node, path).map(|on| on.then(FairSharing::default));
    }
    let f = fields(ctx, node, path, "fair_sharing", &FAIR_SHARING_FIELDS, FAIR_SHARING_EXAMPLE)?;
    let Some(n) = f.get("strategies") else { return Some(Some(FairSharing::default())) };
    let items = list(ctx, n, &f.path("strategies"), FAIR_SHARING_EXAMPLE)?;
    let mut strategies = Vec::new();
    let mut ok = !items.is_empty();
    if items.is_empty() {
        ctx.report(
            n.pos,
            &f.path("strategies"),
            "no strategy listed".to_string(),
            format!("list one or both, e.g. {FAIR_SHARING_EXAMPLE}"),
        );
    }
    for (i, item) in items.iter().enumerate() {
        let p = index(&f.path("strategies"), i);
        match decode::one_of(ctx, item, &p, &STRATEGIES) {
            Some(s) if strategies.contains(&s) => {
                ctx.report(
                    item.pos,
                    &p,
                    format!("`{}` is listed twice", s.as_str()),
                    "list each strategy once",
                );
                ok = false;
            }
            Some(s) => strategies.push(s),
            None => ok = false,
        }
    }
    ok.then_some(Some(FairSharing { strategies }))
}

/// `defragmentation: true|false`, or `{enabled: BOOL, restart_cost: DURATION}` (enabled by
/// default in the map form).
fn defragmentation(ctx: &mut Ctx, node: &Node) -> Option<Option<Defragmentation>> {
    if !matches!(node.value, tree::Value::Map(_)) {
        return decode::boolean(ctx, node, "defragmentation")
            .map(|on| on.then(Defragmentation::default));
    }
    let f =
        fields(ctx, node, "defragmentation", "defragmentation", &DEFRAG_FIELDS, DEFRAG_EXAMPLE)?;
    let enabled = match f.get("enabled") {
        None => Some(true),
        Some(n) => decode::boolean(ctx, n, &f.path("enabled")),
    };
    let restart = match f.get("restart_cost") {
        None => Some(Defragmentation::DEFAULT_RESTART_COST_MS),
        Some(n) => decode::duration_ms(ctx, n, &f.path("restart_cost")),
    };
    let (enabled, restart_cost_ms) = (enabled?, restart?);
    Some(enabled.then_some(Defragmentation { restart_cost_ms, ..Default::default() }))
}

/// `reservations: {after: DURATION, per_model_max: N, hold_quota: BOOL}` (`after` required,
/// more than 0; `per_model_max` 1 to `Reservations::PER_MODEL_MAX`, default 2; `hold_quota`
/// default false), or `false`.
fn reservations(ctx: &mut Ctx, node: &Node) -> Option<Option<Reservations>> {
    if !matches!(node.value, tree::Value::Map(_)) {
        return match decode::boolean(ctx, node, "reservations")? {
            false => Some(None),
            true => {
                ctx.report(
                    node.pos,
                    "reservations",
                    "`reservations: true` does not say how long a request waits first".to_string(),
                    format!("write {RESERVATION_EXAMPLE}"),
                );
                None
            }
        };
    }
    let f = fields(
        ctx,
        node,
        "reservations",
        "reservations",
        &RESERVATION_FIELDS,
        RESERVATION_EXAMPLE,
    )?;
    let after = f
        .required(
            ctx,
            "after",
            &format!("say how long a request waits before nodes are held for it, e.g. {RESERVATION_EXAMPLE}"),
        )
        .and_then(|n| {
            let ms = decode::duration_ms(ctx, n, &f.path("after"))?;
            if ms == 0 {
                ctx.report(
                    n.pos,
                    &f.path("after"),
                    "a wait of 0 would hold nodes for every request that does not start at once"
                        .to_string(),
                    "give a wait longer than a cycle, e.g. `after: 5m`".to_string(),
                );
                return None;
            }
            Some(ms)
        });
    let max = u64::from(Reservations::PER_MODEL_MAX);
    let per_model_max = match f.get("per_model_max") {
        None => Some(u64::from(Reservations::DEFAULT_PER_MODEL_MAX)),
        Some(n) => decode::uint(ctx, n, &f.path("per_model_max"), 1, max, "2"),
    };
    let hold_quota = match f.get("hold_quota") {
        None => Some(false),
        Some(n) => decode::boolean(ctx, n, &f.path("hold_quota")),
    };
    let (after_ms, per_model_max, hold_quota) = (after?, per_model_max?, hold_quota?);
    Some(Some(Reservations { after_ms, per_model_max: per_model_max as u32, hold_quota }))
}

fn half_life_ms(ctx: &mut Ctx, node: &Node) -> Option<u64> {
    let example = "`fair_share: {half_life: 7d}`";
    let f = fields(ctx, node, "fair_share", "fair_share", &FAIR_SHARE_FIELDS, example)?;
    let fix = "say how fast past usage is forgotten, e.g. `half_life: 7d` (0: not remembered)";
    let n = f.required(ctx, "half_life", fix)?;
    decode::duration_ms(ctx, n, &f.path("half_life"))
}

fn decode_classes(ctx: &mut Ctx, node: &Node) -> Option<Vec<PriorityClassSpec>> {
    let items = list(ctx, node, "priority_classes", CLASS_EXAMPLE)?;
    if items.is_empty() || items.len() > PRIORITY_CLASSES_MAX {
        ctx.report(
            node.pos,
            "priority_classes",
            format!("needs 1 to {PRIORITY_CLASSES_MAX} priority classes, got {}", items.len()),
            format!("define the classes workloads may use, e.g. {CLASS_EXAMPLE}"),
        );
        return None;
    }
    let mut classes = Vec::new();
    let mut seen: BTreeMap<String, Pos> = BTreeMap::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index("priority_classes", i);
        let Some(f) = fields(ctx, item, &path, "a priority class", &CLASS_FIELDS, CLASS_EXAMPLE)
        else {
            ok = false;
            continue;
        };
        let name_node = f.required(ctx, "name", "name the class, e.g. `name: high`");
        let name = name_node.and_then(|n| decode::name(ctx, n, &f.path("name"), "`high`"));
        let value = f
            .required(
                ctx,
                "value",
                "give the class a priority, e.g. `value: 100` (higher runs first)",
            )
            .and_then(|n| decode::int32(ctx, n, &f.path("value"), "100"));
        let preemptible = match f.get("preemptible") {
            None => Some(true),
            Some(n) => decode::boolean(ctx, n, &f.path("preemptible")),
        };
        let (Some(name), Some(value), Some(preemptible), Some(name_node)) =
            (name, value, preemptible, name_node)
        else {
            ok = false;
            continue;
        };
        if let Some(first) = seen.get(&name) {
            ctx.report(
                name_node.pos,
                &f.path("name"),
                format!("priority class `{name}` is already defined at line {}", first.line),
                "give every priority class a different name",
            );
            ok = false;
            continue;
        }
        seen.insert(name.clone(), name_node.pos);
        classes.push(PriorityClassSpec { name, value, preemptible });
    }
    ok.then_some(classes)
}

/// `cohorts:`: cohorts with quota of their own and a parent (hierarchical quota). Names are
/// unique, a parent is a cohort declared here, and no cohort is inside itself.
fn decode_cohorts(ctx: &mut Ctx, node: &Node) -> Option<Vec<CohortSpec>> {
    let items = list(ctx, node, "cohorts", COHORT_EXAMPLE)?;
    // (cohort, where its parent is written, its index in the file).
    let mut cohorts: Vec<(CohortSpec, Option<Pos>, usize)> = Vec::new();
    // Every name read, even of a cohort with other errors: duplicates and parents are
    // checked against them all.
    let mut seen: Vec<(String, Pos)> = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index("cohorts", i);
        let Some(f) = fields(ctx, item, &path, "a cohort", &COHORT_FIELDS, COHORT_EXAMPLE) else {
            ok = false;
            continue;
        };
        let name_node = f.required(ctx, "name", "name the cohort, e.g. `name: research`");
        let name = name_node.and_then(|n| decode::name(ctx, n, &f.path("name"), "`research`"));
        if let (Some(name), Some(n)) = (&name, name_node) {
            if let Some((_, first)) = seen.iter().find(|(s, _)| s == name) {
                ctx.report(
                    n.pos,
                    &f.path("name"),
                    format!("cohort `{name}` is already defined at line {}", first.line),
                    "give every cohort a different name, or merge the two entries",
                );
                ok = false;
                continue;
            }
            seen.push((name.clone(), n.pos));
        }
        let parent = f.get("parent").map(|n| decode::name(ctx, n, &f.path("parent"), "`org`"));
        let label = name.clone().unwrap_or_else(|| "this cohort".into());
        let quotas = match f.get("quotas") {
            None => Some(Vec::new()),
            Some(n) => decode_quotas(
                ctx,
                n,
                &f.path("quotas"),
                QuotaOwner::Cohort { name: &label, has_parent: f.get("parent").is_some() },
            ),
        };
        let (Some(name), Some(parent), Some(quotas)) = (name, decode::optional(parent), quotas)
        else {
            ok = false;
            continue;
        };
        let parent_pos = f.get("parent").map(|n| n.pos);
        cohorts.push((CohortSpec { name, parent, quotas }, parent_pos, i));
    }
    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    for (c, parent_pos, i) in &cohorts {
        let (Some(parent), Some(pos)) = (&c.parent, parent_pos) else { continue };
        let path = decode::join(&index("cohorts", *i), "parent");
        if !names.contains(&parent.as_str()) {
            ctx.report(
                *pos,
                &path,
                format!("unknown parent cohort `{parent}`"),
                decode::did_you_mean(
                    parent,
                    names.iter().copied(),
                    "declare it under `cohorts:` (`- name: ...`), or use one of",
                ),
            );
            ok = false;
            continue;
        }
        // Up the parents: back at `c` means a circle.
        let mut at = parent.as_str();
        for _ in 0..=cohorts.len() {
            if at == c.name {
                ctx.report(
                    *pos,
                    &path,
                    format!("cohort `{}` is inside itself: its parents lead back to it", c.name),
                    "make the cohorts a tree: give the topmost cohort no `parent`",
                );
                ok = false;
                break;
            }
            match cohorts.iter().find(|x| x.0.name == at).and_then(|x| x.0.parent.as_deref()) {
                Some(up) => at = up,
                None => break,
            }
        }
    }
    ok.then(|| cohorts.into_iter().map(|x| x.0).collect())
}

fn decode_projects(ctx: &mut Ctx, node: &Node) -> Option<Vec<ProjectSpec>> {
    let items = list(ctx, node, "projects", PROJECT_EXAMPLE)?;
    if items.is_empty() || items.len() > PROJECTS_MAX {
        ctx.report(
            node.pos,
            "projects",
            format!("needs 1 to {PROJECTS_MAX} projects, got {}", items.len()),
            format!("define the projects that own quota, e.g. {PROJECT_EXAMPLE}"),
        );
        return None;
    }
    let mut projects = Vec::new();
    let mut seen: BTreeMap<String, Pos> = BTreeMap::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index("projects", i);
        let Some((project, name_pos)) = decode_project(ctx, item, &path) else {
            ok = false;
            continue;
        };
        if let Some(first) = seen.get(&project.name) {
            ctx.report(
                name_pos,
                &decode::join(&path, "name"),
                format!("project `{}` is already defined at line {}", project.name, first.line),
                "give every project a different name, or merge the two entries",
            );
            ok = false;
            continue;
        }
        seen.insert(project.name.clone(), name_pos);
        projects.push(project);
    }
    ok.then_some(projects)
}

fn decode_project(ctx: &mut Ctx, item: &Node, path: &str) -> Option<(ProjectSpec, Pos)> {
    let f = fields(ctx, item, path, "a project", &PROJECT_FIELDS, PROJECT_EXAMPLE)?;
    let name_node = f.required(ctx, "name", "name the project, e.g. `name: vision`");
    let name = name_node.and_then(|n| decode::name(ctx, n, &f.path("name"), "`vision`"));
    let cohort = f.get("cohort").map(|n| decode::name(ctx, n, &f.path("cohort"), "`perception`"));
    let department =
        f.get("department").map(|n| decode::name(ctx, n, &f.path("department"), "`research`"));
    let weight = match f.get("weight") {
        None => Some(1000),
        Some(n) => decode::weight_milli(ctx, n, &f.path("weight")),
    };
    let queueing = match f.get("queueing") {
        None => Some(Queueing::default()),
        Some(n) => decode::one_of(ctx, n, &f.path("queueing"), &QUEUEINGS),
    };
    let mode = f
        .get("preemption_mode")
        .map(|n| decode::one_of(ctx, n, &f.path("preemption_mode"), &MODES));
    let within = match f.get("preempt_within_project") {
        None => Some(WithinProject::default()),
        Some(n) => decode::one_of(ctx, n, &f.path("preempt_within_project"), &WITHIN_PROJECT),
    };
    let project_label = name.clone().unwrap_or_else(|| "this project".into());
    let borrow_within = match f.get("borrow_within_cohort") {
        None => Some(None),
        Some(n) => borrow_within_cohort(
            ctx,
            n,
            &f.path("borrow_within_cohort"),
            &project_label,
            f.get("cohort").is_some(),
        ),
    };
    // Without a cohort there is nobody to borrow from or lend to. A cohort field that is there
    // but broken counts as a cohort (it is reported already): one error, not a misleading second.
    let has_cohort = f.get("cohort").is_some();
    let project_name = name.as_deref().unwrap_or("this project");
    let quotas = match f.get("quotas") {
        None => Some(Vec::new()),
        Some(n) => decode_quotas(
            ctx,
            n,
            &f.path("quotas"),
            QuotaOwner::Project { name: project_name, has_cohort },
        ),
    };
    let project = ProjectSpec {
        name: name?,
        cohort: decode::optional(cohort)?,
        department: decode::optional(department)?,
        quotas: quotas?,
        weight_milli: weight?,
        queueing: queueing?,
        preemption_mode: decode::optional(mode)?,
        preempt_within_project: within?,
        borrow_within_cohort: borrow_within?,
    };
    Some((project, name_node?.pos))
}

/// `borrow_within_cohort: never | lower_priority`, or `{policy: never|lower_priority,
/// max_priority_threshold: INT}`: only for a project in a cohort.
fn borrow_within_cohort(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    project: &str,
    has_cohort: bool,
) -> Option<Option<BorrowWithinCohort>> {
    let (on, threshold) = if matches!(node.value, tree::Value::Map(_)) {
        let f = fields(
            ctx,
            node,
            path,
            "borrow_within_cohort",
            &BORROW_WITHIN_FIELDS,
            BORROW_WITHIN_EXAMPLE,
        )?;
        let on = match f.get("policy") {
            None => Some(true),
            Some(n) => decode::one_of(ctx, n, &f.path("policy"), &BORROW_WITHIN_POLICIES),
        };
        let threshold = f.get("max_priority_threshold").map(|n| {
            decode::int32(ctx, n, &f.path("max_priority_threshold"), "`max_priority_threshold: 0`")
        });
        let (on, threshold) = (on?, decode::optional(threshold)?);
        if !on && threshold.is_some() {
            ctx.report(
                node.pos,
                path,
                "`max_priority_threshold` with `policy: never` has no meaning".to_string(),
                "remove `max_priority_threshold`, or say `policy: lower_priority`".to_string(),
            );
            return None;
        }
        (on, threshold)
    } else {
        (decode::one_of(ctx, node, path, &BORROW_WITHIN_POLICIES)?, None)
    };
    if on && !has_cohort {
        ctx.report(
            node.pos,
            path,
            format!(
                "project `{project}` has no cohort, so `borrow_within_cohort` has no meaning: \
                 there is nobody to reclaim from"
            ),
            "remove `borrow_within_cohort`, or put the project in a cohort with `cohort: <name>`"
                .to_string(),
        );
        return None;
    }
    Some(on.then_some(BorrowWithinCohort { max_priority_threshold: threshold }))
}

/// Who holds a quota list: a project (whose limits need a cohort) or a cohort (whose limits
/// need a parent cohort, and whose lend limit is on its whole subtree).
#[derive(Clone, Copy)]
enum QuotaOwner<'a> {
    Project { name: &'a str, has_cohort: bool },
    Cohort { name: &'a str, has_parent: bool },
}

fn decode_quotas(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    owner: QuotaOwner<'_>,
) -> Option<Vec<QuotaSpec>> {
    let (project, has_cohort) = match owner {
        QuotaOwner::Project { name, has_cohort } => (name, has_cohort),
        QuotaOwner::Cohort { name, has_parent } => (name, has_parent),
    };
    let is_cohort = matches!(owner, QuotaOwner::Cohort { .. });
    let items = list(ctx, node, path, QUOTA_EXAMPLE)?;
    let mut quotas = Vec::new();
    let mut seen: BTreeMap<QuotaModel, Pos> = BTreeMap::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = index(path, i);
        let Some(f) = fields(ctx, item, &path, "a quota", &QUOTA_FIELDS, QUOTA_EXAMPLE) else {
            ok = false;
            continue;
        };
        let model_node = f.required(
            ctx,
            "model",
            "name the GPU model this line covers, e.g. `model: A100`, or `model: any`",
        );
        let model = model_node.and_then(|n| {
            let text = decode::text(ctx, n, &f.path("model"), "`A100`")?;
            if text == "any" {
                Some(QuotaModel::Any)
            } else {
                crate::cluster::model_name(ctx, n, &f.path("model")).map(QuotaModel::Model)
            }
        });
        let guaranteed = f
            .required(
                ctx,
                "guaranteed",
                "give the GPUs this project is guaranteed, e.g. `guaranteed: 8` (0 is fine)",
            )
            .and_then(|n| decode::gpus_as_shares(ctx, n, &f.path("guaranteed")));
        let mut limit = |key: &str, lends: bool| -> Option<Option<(allot_core::Shares, Pos)>> {
            let Some(n) = f.get(key) else { return Some(None) };
            let shares = decode::gpus_as_shares(ctx, n, &f.path(key))?;
            if !has_cohort && is_cohort {
                ctx.report(
                    n.pos,
                    &f.path(key),
                    format!(
                        "cohort `{project}` has no parent, so `{key}` has no meaning: there is \
                         nobody above it to {}",
                        if lends { "lend to" } else { "borrow from" }
                    ),
                    format!("remove `{key}`, or give the cohort a `parent:`"),
                );
                return None;
            }
            if !has_cohort {
                let why = if lends { "nobody to lend to" } else { "nobody to borrow from" };
                ctx.report(
                    n.pos,
                    &f.path(key),
                    format!(
                        "project `{project}` has no cohort, so `{key}` has no meaning: there is {why} \
                         (Kueue rejects a {} without a cohort for the same reason)",
                        if lends { "lendingLimit" } else { "borrowingLimit" }
                    ),
                    format!("remove `{key}`, or put the project in a cohort with `cohort: <name>`"),
                );
                return None;
            }
            Some(Some((shares, n.pos)))
        };
        let borrow = limit("borrow_limit", false);
        let lend = limit("lend_limit", true);
        if let (Some(g), Some(Some((l, pos)))) = (guaranteed, lend)
            && l > g
            && !is_cohort
        {
            ctx.report(
                pos,
                &f.path("lend_limit"),
                format!(
                    "lend_limit {l} is more than guaranteed {g}: \
                     a project can only lend GPUs it is guaranteed"
                ),
                format!("set lend_limit to at most {g}, or raise guaranteed"),
            );
            ok = false;
            continue;
        }
        let (Some(model), Some(guaranteed), Some(borrow), Some(lend), Some(model_node)) =
            (model, guaranteed, borrow, lend, model_node)
        else {
            ok = false;
            continue;
        };
        if let Some(first) = seen.get(&model) {
            let shown = match &model {
                QuotaModel::Any => "any".to_string(),
                QuotaModel::Model(m) => m.clone(),
            };
            ctx.report(
                model_node.pos,
                &f.path("model"),
                format!(
                    "project `{project}` already has a quota for `{shown}` at line {}",
                    first.line
                ),
                "merge the two lines into one",
            );
            ok = false;
            continue;
        }
        seen.insert(model.clone(), model_node.pos);
        quotas.push(QuotaSpec {
            model,
            guaranteed,
            borrow_limit: borrow.map(|(s, _)| s),
            lend_limit: lend.map(|(s, _)| s),
        });
    }
    ok.then_some(quotas)
}

/// What the document is when it parses but is not a mapping (`"nothing"`, `"a list"`, …):
/// not a policy at all, before any field is judged. `None` for a mapping, or for text that
/// does not parse (whose syntax error `parse_policy` reports with its position).
pub fn not_a_mapping(text: &str) -> Option<&'static str> {
    let mut ctx = Ctx::new("");
    let root = tree::parse(&mut ctx, text)?;
    match root.value {
        tree::Value::Map(_) => None,
        _ => Some(root.kind()),
    }
}
