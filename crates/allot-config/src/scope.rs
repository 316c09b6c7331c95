//! Scoped rollout (`allot policy apply FILE --scope …`): the candidate's rules for one project,
//! one GPU pool or one kind of work, the active policy's everywhere else, as one policy.
//!
//! What a scope carries:
//! - `project=NAME`: the project's whole entry (quotas, weight, queueing, pre-emption mode,
//!   cohort) and the candidate's idle rules as they judge that project's work;
//! - `pool=MODEL`: every project's and cohort's quota line for that GPU model (Kueue's
//!   resource flavour: the pool of one kind of device);
//! - `kind=KIND`: the candidate's idle rules as they judge that kind of work.
//!
//! Fleet-wide settings (pre-emption, defragmentation, fair sharing, priority classes, costs)
//! have no scope: they keep the active policy's and are named in `left_out`. Idle rules are
//! split, not copied: the candidate's rules narrowed to the scope come first, the active
//! rules narrowed to everything else after, so every workload is judged by exactly one side.

use allot_core::{IdlePolicySpec, PolicySpec, QuotaModel, QuotaSpec, WorkloadKind};

use crate::workloads::KINDS;

/// Where a scoped rollout applies the candidate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Project(String),
    /// A GPU model's quota lines.
    Pool(String),
    Kind(WorkloadKind),
}

impl Scope {
    /// `project=NAME`, `pool=MODEL` or `kind=KIND`.
    pub fn parse(text: &str) -> Result<Scope, String> {
        let fix = "write `project=NAME`, `pool=MODEL` (a GPU model's quota) or `kind=KIND` \
                   (training, batch, notebook, inference, service)";
        let Some((key, value)) = text.split_once('=') else {
            return Err(format!("scope `{text}` is not KEY=VALUE: {fix}"));
        };
        let value = value.trim();
        let named = !value.is_empty()
            && value.len() <= 253
            && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !named {
            return Err(format!("scope `{text}`: `{value}` is not a name: {fix}"));
        }
        match key.trim() {
            "project" => Ok(Scope::Project(value.into())),
            "pool" => Ok(Scope::Pool(value.into())),
            "kind" => KINDS
                .iter()
                .find(|(name, _)| *name == value)
                .map(|(_, kind)| Scope::Kind(*kind))
                .ok_or_else(|| format!("scope `{text}`: unknown kind `{value}`: {fix}")),
            other => Err(format!("scope `{text}`: unknown scope `{other}`: {fix}")),
        }
    }

    /// Whether work of `project` and `kind` that accepts GPUs of `models` is in the scope (a
    /// pool: work that names its model; work that takes any model is in no pool's scope).
    pub fn covers(&self, project: &str, kind: WorkloadKind, models: &[String]) -> bool {
        match self {
            Scope::Project(name) => name == project,
            Scope::Pool(pool) => models.contains(pool),
            Scope::Kind(k) => *k == kind,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Project(name) => write!(f, "project={name}"),
            Scope::Pool(model) => write!(f, "pool={model}"),
            Scope::Kind(kind) => write!(f, "kind={}", kind.as_str()),
        }
    }
}

/// The merged policy, with what of the candidate it carries and what it leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scoped {
    pub policy: PolicySpec,
    /// What differs from the active policy, one phrase each ("project nlp", "idle rules").
    pub carried: Vec<String>,
    /// What the candidate changes outside the scope, kept as the active policy has it.
    pub left_out: Vec<String>,
}

/// `active` with `candidate`'s rules for `scope`. Errors when the scope names nothing the
/// candidate has or changes nothing.
pub fn scoped_policy(
    active: &PolicySpec,
    candidate: &PolicySpec,
    scope: &Scope,
) -> Result<Scoped, String> {
    let mut policy = active.clone();
    match scope {
        Scope::Project(name) => {
            let Some(theirs) = candidate.projects.iter().find(|p| &p.name == name) else {
                return Err(format!(
                    "the candidate has no project `{name}`: a rollout to a project takes that \
                     project's entry from the candidate"
                ));
            };
            match policy.projects.iter_mut().find(|p| &p.name == name) {
                Some(ours) => *ours = theirs.clone(),
                None => policy.projects.push(theirs.clone()),
            }
            let all: Vec<String> = policy.projects.iter().map(|p| p.name.clone()).collect();
            let in_scope = |project: &str, _: WorkloadKind| project == name;
            if idle_differs(active, candidate, in_scope) {
                policy.idle = split_idle(
                    &active.idle,
                    &candidate.idle,
                    |r| narrow(&r.projects, std::slice::from_ref(name), &all, true),
                    |r| narrow(&r.projects, std::slice::from_ref(name), &all, false),
                    |r, projects| IdlePolicySpec { projects, ..r.clone() },
                    name,
                );
            }
        }
        Scope::Kind(kind) => {
            let all: Vec<WorkloadKind> = KINDS.iter().map(|(_, k)| *k).collect();
            let label = kind.as_str();
            if idle_differs(active, candidate, |_, k| k == *kind) {
                policy.idle = split_idle(
                    &active.idle,
                    &candidate.idle,
                    |r| narrow(&r.kinds, std::slice::from_ref(kind), &all, true),
                    |r| narrow(&r.kinds, std::slice::from_ref(kind), &all, false),
                    |r, kinds| IdlePolicySpec { kinds, ..r.clone() },
                    label,
                );
            }
        }
        Scope::Pool(model) => {
            let line = |quotas: &[QuotaSpec]| {
                quotas.iter().find(|q| q.model == QuotaModel::Model(model.clone())).cloned()
            };
            if candidate.projects.iter().all(|p| line(&p.quotas).is_none())
                && candidate.cohorts.iter().all(|c| line(&c.quotas).is_none())
                && active.projects.iter().all(|p| line(&p.quotas).is_none())
                && active.cohorts.iter().all(|c| line(&c.quotas).is_none())
            {
                return Err(format!(
                    "neither policy has a quota line for `{model}`: a rollout to a pool takes \
                     each project's `{model}` quota from the candidate"
                ));
            }
            for p in &mut policy.projects {
                if let Some(theirs) = candidate.projects.iter().find(|c| c.name == p.name) {
                    set_line(&mut p.quotas, model, line(&theirs.quotas));
                }
            }
            for c in &mut policy.cohorts {
                if let Some(theirs) = candidate.cohorts.iter().find(|x| x.name == c.name) {
                    set_line(&mut c.quotas, model, line(&theirs.quotas));
                }
            }
        }
    }
    let carried = differences(active, &policy);
    if carried.is_empty() {
        return Err(format!(
            "the candidate changes nothing in {scope}: the scoped policy would be the active one"
        ));
    }
    let left_out = differences(&policy, candidate);
    Ok(Scoped { policy, carried, left_out })
}

/// `quotas` with its line for `model` replaced by `theirs` (removed when `None`).
fn set_line(quotas: &mut Vec<QuotaSpec>, model: &str, theirs: Option<QuotaSpec>) {
    let key = QuotaModel::Model(model.to_string());
    match (quotas.iter().position(|q| q.model == key), theirs) {
        (Some(i), Some(line)) => quotas[i] = line,
        (Some(i), None) => {
            quotas.remove(i);
        }
        (None, Some(line)) => quotas.push(line),
        (None, None) => {}
    }
}

/// A rule's list (`rule`, empty: all of `all`) narrowed to `scope` (`inside`) or to the rest;
/// `None` when nothing is left.
fn narrow<T: Clone + PartialEq>(
    rule: &[T],
    scope: &[T],
    all: &[T],
    inside: bool,
) -> Option<Vec<T>> {
    let covered: Vec<T> = if rule.is_empty() { all.to_vec() } else { rule.to_vec() };
    let kept: Vec<T> = covered.into_iter().filter(|x| scope.contains(x) == inside).collect();
    (!kept.is_empty()).then_some(kept)
}

/// The candidate's rules narrowed into the scope, then the active rules narrowed out of it;
/// a rule whose scope an earlier one covers is dropped (it would never judge anything), and
/// a candidate rule whose name an active one keeps is renamed `NAME-LABEL`.
fn split_idle<T>(
    active: &[IdlePolicySpec],
    candidate: &[IdlePolicySpec],
    inside: impl Fn(&IdlePolicySpec) -> Option<Vec<T>>,
    outside: impl Fn(&IdlePolicySpec) -> Option<Vec<T>>,
    with: impl Fn(&IdlePolicySpec, Vec<T>) -> IdlePolicySpec,
    label: &str,
) -> Vec<IdlePolicySpec> {
    let kept: Vec<IdlePolicySpec> =
        active.iter().filter_map(|r| outside(r).map(|list| with(r, list))).collect();
    let mut rules: Vec<IdlePolicySpec> = Vec::new();
    let narrowed = candidate.iter().filter_map(|r| inside(r).map(|list| with(r, list)));
    let tagged = narrowed.map(|r| (true, r)).chain(kept.iter().map(|r| (false, r.clone())));
    for (from_candidate, mut rule) in tagged {
        if rules.iter().any(|earlier| shadows(earlier, &rule)) {
            continue;
        }
        if from_candidate && kept.iter().any(|k| k.name == rule.name) {
            rule.name = format!("{}-{label}", rule.name);
        }
        rules.push(rule);
    }
    rules
}

/// Whether `earlier` covers every project and kind `later` covers (empty: all): the parser's
/// rule for a rule that is never used.
fn shadows(earlier: &IdlePolicySpec, later: &IdlePolicySpec) -> bool {
    fn covers<T: PartialEq>(earlier: &[T], later: &[T]) -> bool {
        earlier.is_empty() || (!later.is_empty() && later.iter().all(|x| earlier.contains(x)))
    }
    covers(&earlier.projects, &later.projects) && covers(&earlier.kinds, &later.kinds)
}

/// What differs from `a` to `b`, one phrase each.
fn differences(a: &PolicySpec, b: &PolicySpec) -> Vec<String> {
    let mut out = Vec::new();
    let fleet: [(&str, bool); 9] = [
        ("fair_share", a.fair_share_half_life_ms != b.fair_share_half_life_ms),
        (
            "preemption",
            a.preemption_mode != b.preemption_mode || a.preemption_guard != b.preemption_guard,
        ),
        ("preemption.fair_sharing", a.fair_sharing != b.fair_sharing),
        ("defragmentation", a.defragmentation != b.defragmentation),
        ("restart_cost", a.restart_cost_ms != b.restart_cost_ms),
        ("idle_resume_backoff", a.idle_resume_backoff_ms != b.idle_resume_backoff_ms),
        ("priority_classes", a.priority_classes != b.priority_classes),
        ("default_priority_class", a.default_priority_class != b.default_priority_class),
        ("cohorts", a.cohorts != b.cohorts),
    ];
    out.extend(fleet.iter().filter(|(_, differs)| *differs).map(|(name, _)| name.to_string()));
    let mut names: Vec<&str> =
        a.projects.iter().chain(&b.projects).map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let (x, y) = (
            a.projects.iter().find(|p| p.name == name),
            b.projects.iter().find(|p| p.name == name),
        );
        if x != y {
            out.push(format!("project {name}"));
        }
    }
    if idle_differs(a, b, |_, _| true) {
        out.push("idle rules".into());
    }
    out
}

/// Whether some work `within` (by project and kind) of a project either policy has is judged
/// differently by the two: by another rule's settings, or by a rule on one side only. Names
/// and the rules' own scopes do not count, so a split that judges everything alike is alike.
fn idle_differs(
    a: &PolicySpec,
    b: &PolicySpec,
    within: impl Fn(&str, WorkloadKind) -> bool,
) -> bool {
    let judge = |p: &PolicySpec, project: &str, kind: WorkloadKind| {
        p.idle.iter().find(|r| r.covers(project, kind)).map(|r| IdlePolicySpec {
            name: String::new(),
            projects: Vec::new(),
            kinds: Vec::new(),
            ..r.clone()
        })
    };
    let projects = a.projects.iter().chain(&b.projects).map(|p| p.name.as_str());
    projects.flat_map(|p| KINDS.iter().map(move |(_, k)| (p, *k))).any(|(project, kind)| {
        within(project, kind) && judge(a, project, kind) != judge(b, project, kind)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTIVE: &str = "
priority_classes: [{name: low, value: 0, preemptible: true}, {name: high, value: 10}]
default_priority_class: low
projects:
  - {name: nlp, cohort: c, quotas: [{model: H100, guaranteed: 4}, {model: A100, guaranteed: 2}]}
  - {name: vision, cohort: c, quotas: [{model: H100, guaranteed: 4}]}
  - {name: research, quotas: [{model: A100, guaranteed: 1}]}
idle:
  - {name: notebooks, kinds: [notebook], idle_timer: 30m}
  - {name: serving, kinds: [inference, service], idle_timer: 2h}
";

    fn policy(text: &str) -> PolicySpec {
        crate::parse_policy("p.yaml", text).unwrap_or_else(|d| panic!("{}", crate::render(&d)))
    }

    /// The merge of `candidate` into ACTIVE for `scope`, read back from its rendered text.
    fn check(candidate: &str, scope: &str) -> (Scoped, PolicySpec) {
        let scope = Scope::parse(scope).expect("scope");
        let scoped = scoped_policy(&policy(ACTIVE), &policy(candidate), &scope).expect("scoped");
        let text = crate::render_policy(&scoped.policy, "scoped");
        let again = policy(&text);
        assert_eq!(again, scoped.policy, "{text}");
        (scoped, again)
    }

    /// The rule that judges work of `project` and `kind`, by name and timer.
    fn judged_by(p: &PolicySpec, project: &str, kind: WorkloadKind) -> Option<(String, u64)> {
        p.idle
            .iter()
            .find(|r| r.covers(project, kind))
            .map(|r| (r.name.clone(), r.rule.idle_timer_ms))
    }

    #[test]
    fn a_project_scope_takes_that_projects_entry_and_idle_rules_only() {
        let candidate = ACTIVE
            .replace(
                "{model: H100, guaranteed: 4}, {model: A100",
                "{model: H100, guaranteed: 6}, {model: A100",
            )
            .replace("{model: H100, guaranteed: 4}]}", "{model: H100, guaranteed: 2}]}")
            .replace("idle_timer: 30m", "idle_timer: 10m");
        let (scoped, p) = check(&candidate, "project=nlp");
        assert_eq!(p.projects[0].quotas[0].guaranteed.0, 6000);
        assert_eq!(p.projects[1].quotas[0].guaranteed.0, 4000, "vision keeps its quota");
        let m = 60_000;
        assert_eq!(
            judged_by(&p, "nlp", WorkloadKind::Notebook),
            Some(("notebooks-nlp".into(), 10 * m))
        );
        assert_eq!(
            judged_by(&p, "vision", WorkloadKind::Notebook),
            Some(("notebooks".into(), 30 * m))
        );
        assert_eq!(
            judged_by(&p, "nlp", WorkloadKind::Service),
            Some(("serving-nlp".into(), 120 * m))
        );
        assert_eq!(judged_by(&p, "nlp", WorkloadKind::Training), None);
        assert_eq!(scoped.carried, vec!["project nlp", "idle rules"]);
        assert_eq!(scoped.left_out, vec!["project vision", "idle rules"]);
    }

    #[test]
    fn a_kind_scope_splits_the_idle_rules_by_kind() {
        let candidate = ACTIVE.replace(
            "  - {name: serving, kinds: [inference, service], idle_timer: 2h}",
            "  - {name: serving, kinds: [inference, service], idle_timer: 1h}\n  - {name: all, idle_timer: 4h}",
        );
        let (_, p) = check(&candidate, "kind=inference");
        let m = 60_000;
        assert_eq!(
            judged_by(&p, "nlp", WorkloadKind::Inference),
            Some(("serving-inference".into(), 60 * m))
        );
        assert_eq!(judged_by(&p, "nlp", WorkloadKind::Service), Some(("serving".into(), 120 * m)));
        // The candidate's catch-all reaches training only where the scope is: not at all.
        assert_eq!(judged_by(&p, "nlp", WorkloadKind::Training), None);
    }

    #[test]
    fn a_pool_scope_takes_each_projects_line_for_that_model() {
        let candidate = ACTIVE
            .replace(
                "{model: H100, guaranteed: 4}, {model: A100, guaranteed: 2}",
                "{model: H100, guaranteed: 5}",
            )
            .replace("{model: H100, guaranteed: 4}]}", "{model: H100, guaranteed: 3}]}")
            .replace("{model: A100, guaranteed: 1}", "{model: A100, guaranteed: 3}");
        let (scoped, p) = check(&candidate, "pool=H100");
        let lines = |i: usize| -> Vec<(String, u64)> {
            p.projects[i]
                .quotas
                .iter()
                .map(|q| (format!("{:?}", q.model), q.guaranteed.0))
                .collect()
        };
        assert_eq!(
            lines(0),
            vec![("Model(\"H100\")".into(), 5000), ("Model(\"A100\")".into(), 2000)]
        );
        assert_eq!(lines(1), vec![("Model(\"H100\")".into(), 3000)]);
        assert_eq!(lines(2), vec![("Model(\"A100\")".into(), 1000)], "A100 keeps the active line");
        assert!(scoped.left_out.contains(&"project research".to_string()));
    }

    #[test]
    fn a_scope_that_changes_nothing_or_names_nothing_is_refused() {
        let active = policy(ACTIVE);
        let nothing = scoped_policy(&active, &active, &Scope::Project("nlp".into()));
        assert!(nothing.expect_err("refused").contains("changes nothing in project=nlp"));
        let missing = scoped_policy(&active, &active, &Scope::Project("physics".into()));
        assert!(missing.expect_err("refused").contains("no project `physics`"));
        let pool = scoped_policy(&active, &active, &Scope::Pool("L4".into()));
        assert!(pool.expect_err("refused").contains("a quota line for `L4`"));
        for bad in ["nlp", "team=nlp", "kind=gpu", "project=", "project=a b"] {
            assert!(Scope::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Scope::parse("kind=notebook").expect("kind").to_string(), "kind=notebook");
    }
}
