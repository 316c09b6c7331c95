//! Decisions and reasons as sentences with names, for the CLI, logs and `why`.

use crate::decision::{
    AdmitReason, Decision, DeferReason, HostShortfall, IdleFacts, Placement, PlacementFacts,
    PreemptReason, RejectReason, StopReason,
};
use crate::engine::{DefragPlan, Engine, Protection, Stage};
use crate::explain::{Counterfactual, Explanation};
use crate::idle::IdleModel;
use crate::model::{GpuRequest, PreemptionMode};

impl Engine {
    fn wl(&self, id: crate::ids::WorkloadId) -> String {
        match self.workload_name(id) {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => format!("#{id}"),
        }
    }

    /// "node-1[0,1] node-2[3:500] node-3[2:3g.40gb@4]": devices per member; `:N` marks a
    /// partial device, `:PROFILE@START` a MIG instance (its profile and first memory slice).
    pub fn render_placement(&self, placement: &Placement) -> String {
        let mut parts = Vec::new();
        for m in &placement.members {
            let devices: Vec<String> = m
                .devices
                .iter()
                .map(|d| {
                    if let Some(slot) = d.mig {
                        format!("{}:{slot}", d.device)
                    } else if d.shares as u64 == crate::ids::SHARES_PER_GPU {
                        d.device.to_string()
                    } else {
                        format!("{}:{}", d.device, d.shares)
                    }
                })
                .collect();
            if devices.is_empty() {
                parts.push(format!("{} (no GPU)", self.node_name(m.node)));
            } else {
                parts.push(format!("{}[{}]", self.node_name(m.node), devices.join(",")));
            }
        }
        parts.join(" ")
    }

    /// The reason part of a decision, as a sentence.
    pub fn render_reason(&self, decision: &Decision) -> String {
        match decision {
            Decision::Admit { placement, reason, .. } => {
                let model = placement.model.map_or("cpu", |m| self.model_name(m));
                let why = match reason {
                    AdmitReason::WithinGuarantee { project, key, used, guaranteed } => format!(
                        "within {}'s guarantee ({used}/{guaranteed} {} used)",
                        self.project_name(*project),
                        self.key_name(*key),
                    ),
                    AdmitReason::Borrowing { project, key, borrowed, used, guaranteed } => format!(
                        "{} borrows {borrowed} {} from its cohort ({used} used, {guaranteed} guaranteed)",
                        self.project_name(*project),
                        self.key_name(*key),
                    ),
                    AdmitReason::NoGpuRequested => "needs no GPU".to_string(),
                };
                format!("{why}; on {model} {}", self.render_placement(placement))
            }
            Decision::Preempt { for_workload, mode, reason, checkpoint_grace_ms, .. } => {
                let why = match reason {
                    PreemptReason::QuotaReclaim {
                        borrower,
                        claimant,
                        key,
                        borrowed,
                        for_cohort: None,
                    } => format!(
                        "quota reclaim: {} borrows {borrowed} {} and {} needs its guarantee back",
                        self.project_name(*borrower),
                        self.key_name(*key),
                        self.project_name(*claimant)
                    ),
                    PreemptReason::QuotaReclaim {
                        borrower,
                        claimant,
                        key,
                        borrowed,
                        for_cohort: Some(cohort),
                    } => format!(
                        "quota reclaim: {} borrows {borrowed} {} from outside cohort {cohort}, \
                         and {} takes {cohort}'s quota back",
                        self.project_name(*borrower),
                        self.key_name(*key),
                        self.project_name(*claimant)
                    ),
                    PreemptReason::ReclaimWhileBorrowing {
                        borrower,
                        claimant,
                        key,
                        borrowed,
                        victim_priority,
                        preemptor_priority,
                    } => format!(
                        "quota reclaim while borrowing: {} borrows {borrowed} {} and {} may take \
                         it back though it borrows too (borrow_within_cohort: \
                         {preemptor_priority} outranks {victim_priority})",
                        self.project_name(*borrower),
                        self.key_name(*key),
                        self.project_name(*claimant)
                    ),
                    PreemptReason::FairShare {
                        borrower,
                        claimant,
                        key,
                        claimant_share,
                        borrower_share,
                        borrower_share_after,
                        strategy,
                    } => {
                        let share = |s: u64| {
                            if s == u64::MAX {
                                "unbounded (weight 0)".to_string()
                            } else {
                                format!("{:.3}", s as f64 / 1e6)
                            }
                        };
                        format!(
                            "fair sharing: {}'s share of what its cohort lends of {} is {} ({} \
                             without it); {}'s with its workload {} ({})",
                            self.project_name(*borrower),
                            self.key_name(*key),
                            share(*borrower_share),
                            share(*borrower_share_after),
                            self.project_name(*claimant),
                            share(*claimant_share),
                            strategy.as_str()
                        )
                    }
                    PreemptReason::Priority { project, victim_priority, preemptor_priority }
                        if victim_priority == preemptor_priority =>
                    {
                        format!(
                            "priority in {}: the same ({preemptor_priority}), queued after it \
                             (preempt_within_project: lower_or_newer_equal_priority)",
                            self.project_name(*project)
                        )
                    }
                    PreemptReason::Priority { project, victim_priority, preemptor_priority } => {
                        format!(
                            "priority in {}: {preemptor_priority} outranks {victim_priority}",
                            self.project_name(*project)
                        )
                    }
                    PreemptReason::Defragment {
                        model,
                        node,
                        frees_block,
                        gain_gpu_ms,
                        cost_gpu_ms,
                        replaceable,
                    } => format!(
                        "defragmentation: frees a block of {frees_block} {} on {} ({})",
                        self.model_name(*model),
                        self.node_name(*node),
                        if *replaceable {
                            "every workload moved can restart elsewhere at once".to_string()
                        } else {
                            format!(
                                "gain {} waited > cost {} lost and restarting",
                                gpu_time(*gain_gpu_ms),
                                gpu_time(*cost_gpu_ms)
                            )
                        }
                    ),
                    PreemptReason::Idle { idle, gpu_count_only } => format!(
                        "{}{}",
                        self.render_idle(idle),
                        if *gpu_count_only {
                            " (amd_rm: pressure counted in GPUs, the waiting workload not placed)"
                        } else {
                            ""
                        }
                    ),
                };
                let grace = checkpoint_grace_ms
                    .map(|g| format!(", checkpoint first (grace {g} ms)"))
                    .unwrap_or_default();
                format!("{} for {}: {why}{grace}", mode.as_str(), self.wl(*for_workload))
            }
            Decision::Stop { reason, .. } => match reason {
                StopReason::Cancelled => "cancelled by its user".to_string(),
                StopReason::MaxRuntimeExceeded { max_runtime_ms, ran_ms } => {
                    format!("ran {ran_ms} ms, past its max runtime of {max_runtime_ms} ms")
                }
            },
            Decision::Defer { reason, .. } => self.render_defer(reason),
            Decision::Warn { idle, action_at, .. } => match action_at {
                Some(at) => format!(
                    "{}; will {} at t={} ms unless active again",
                    self.render_idle(idle),
                    idle.action.as_str(),
                    at.0
                ),
                None => format!("{}; reported only, not reclaimed", self.render_idle(idle)),
            },
            Decision::Reclaim { mode, idle, checkpoint_grace_ms, .. } => {
                let grace = checkpoint_grace_ms
                    .map(|g| format!(", checkpoint first (grace {g} ms)"))
                    .unwrap_or_default();
                format!("{}: {}{grace}", mode.as_str(), self.render_idle(idle))
            }
            Decision::Reject { reason, .. } => match reason {
                RejectReason::UnknownProject { name } => format!("unknown project {name:?}"),
                RejectReason::UnknownPriorityClass { name } => {
                    format!("unknown priority class {name:?}")
                }
                RejectReason::UnknownModel { name } => {
                    format!("GPU model {name:?} exists on no node and in no quota")
                }
                RejectReason::DuplicateId => "a workload with this id already exists".to_string(),
                RejectReason::InvalidRequest { detail } => detail.clone(),
                RejectReason::CannotAdopt { detail } => {
                    format!("running outside allot and cannot be taken over: {detail}")
                }
            },
        }
    }

    /// "idle 20 min (timer 15 min, below 10 % by SM-active; rule 'notebooks', always)".
    pub fn render_idle(&self, idle: &IdleFacts) -> String {
        let signal = match idle.signal {
            Some(crate::idle::Signal::SmActive) => "SM-active",
            Some(crate::idle::Signal::EngineActive) => "engine-active",
            Some(crate::idle::Signal::Utilisation) => "utilisation",
            None => "no sample",
        };
        let gap = idle
            .telemetry_gap_since
            .map(|t| format!("; telemetry missing since t={} ms", t.0))
            .unwrap_or_default();
        let below = match idle.model {
            IdleModel::RunAi => format!("30 s windows of exactly 0 % {signal} (runai)"),
            IdleModel::AmdRm => format!(
                "below {}.{} % {signal}, reset by any one sample (amd_rm)",
                idle.threshold_permille / 10,
                idle.threshold_permille % 10
            ),
            IdleModel::Allot => format!(
                "below {}.{} % {}",
                idle.threshold_permille / 10,
                idle.threshold_permille % 10,
                if idle.signal.is_some() {
                    format!("by {signal}")
                } else {
                    "(no sample yet)".into()
                }
            ),
        };
        format!(
            "idle {} (timer {}, {below}; rule {:?}, {}){gap}",
            duration(idle.idle_ms),
            duration(idle.idle_timer_ms),
            self.idle_rule_name(idle.rule),
            idle.when.as_str(),
        )
    }

    pub fn render_defer(&self, reason: &DeferReason) -> String {
        match reason {
            DeferReason::AwaitingUse { since } => format!(
                "suspended for idleness at t={} ms; resumes when a probe shows it in use again",
                since.0
            ),
            DeferReason::IdleBackoff { until, reclaims } => format!(
                "reclaimed for idleness {} in a row; may resume at t={} ms",
                if *reclaims == 1 { "1 time".to_string() } else { format!("{reclaims} times") },
                until.0
            ),
            DeferReason::NoQuotaForModel { project } => format!(
                "project {} has no quota for any GPU model this workload accepts",
                self.project_name(*project)
            ),
            DeferReason::ExceedsMaxQuota { project, key, requested, max } => format!(
                "asks {requested} {}, more than project {} can ever hold ({max}: guarantee plus borrowing)",
                self.key_name(*key),
                self.project_name(*project)
            ),
            DeferReason::QuotaExhausted {
                project,
                key,
                requested,
                used,
                guaranteed,
                available,
                borrow_limited,
                held_for_preemptors,
            } => format!(
                "project {} uses {used}/{guaranteed} guaranteed {}; request {requested}; {}{}",
                self.project_name(*project),
                self.key_name(*key),
                if *borrow_limited
                    && self.quota.line(*project, *key).is_some_and(|l| l.borrow_limit.is_none())
                {
                    format!("its cohort's borrow limit leaves {available}")
                } else if *borrow_limited {
                    format!("its borrow limit leaves {available}")
                } else if self.project_declared_cohort(*project).is_none() {
                    format!("{available} available (no cohort to borrow from)")
                } else {
                    format!("{available} available incl. cohort lending")
                },
                if *held_for_preemptors > crate::ids::Shares::ZERO {
                    format!(
                        "; {held_for_preemptors} more held for {}'s work that pre-empted for \
                         it (its victims are stopping)",
                        self.project_name(*project)
                    )
                } else {
                    String::new()
                }
            ),
            DeferReason::NoMigProfile { model, profile } => {
                format!("no MIG-enabled {} device offers {profile}", self.model_name(*model))
            }
            DeferReason::NoPlacement(f) => self.render_no_room(f),
            DeferReason::NodesUnavailable { facts, nodes } => {
                let named: Vec<String> = nodes
                    .iter()
                    .map(|(node, reason)| {
                        if reason.is_empty() {
                            self.node_name(*node).to_string()
                        } else {
                            format!("{} ({reason})", self.node_name(*node))
                        }
                    })
                    .collect();
                // "…; would fit if unavailable node n2 (drained: maintenance) were usable again".
                format!(
                    "{}; would fit if unavailable node{} {} were usable again",
                    self.render_no_room(facts),
                    if named.len() == 1 { "" } else { "s" },
                    named.join(", "),
                )
            }
            DeferReason::NeverPlaceable { model, members, per_member, same_node, host } => {
                let model = model.map_or("cpu", |m| self.model_name(m));
                let asked = format!(
                    "{members} × {per_member} {model}{}",
                    if *same_node { " on one node" } else { "" }
                );
                match host {
                    None if *members > 1 && !*same_node => format!(
                        "{asked} exceeds the cluster: even empty, its {model} GPUs hold fewer \
                         than {members} such members"
                    ),
                    None => format!("{asked} exceeds the largest node"),
                    Some(HostShortfall::Cpu { asked: a, largest }) => format!(
                        "{asked} exceeds the largest node: it asks {} CPUs on one node, the \
                         largest {model} node has {}",
                        cpus_text(*a),
                        cpus_text(*largest)
                    ),
                    Some(HostShortfall::Memory { asked: a, largest }) => format!(
                        "{asked} exceeds the largest node: it asks {} of memory on one node, \
                         the largest {model} node has {}",
                        mib_text(*a),
                        mib_text(*largest)
                    ),
                    Some(HostShortfall::Spread) if *members == 1 || *same_node => format!(
                        "{asked} exceeds every node: no {model} node has both the GPUs and \
                         the CPU and memory it asks"
                    ),
                    Some(HostShortfall::Spread) => format!(
                        "{asked} exceeds the cluster: even empty, the {model} nodes' GPUs, CPU \
                         and memory hold fewer than {members} such members"
                    ),
                }
            }
            DeferReason::WaitingForPreemption { victims } => {
                let names: Vec<String> = victims.iter().map(|v| self.wl(*v)).collect();
                format!("waiting for {} to stop", names.join(", "))
            }
            DeferReason::BlockedByFifo { head } => {
                format!("strict FIFO: behind {}, which cannot start", self.wl(*head))
            }
            DeferReason::HeldForReservation { reservation, nodes, start } => {
                let names: Vec<&str> = nodes.iter().map(|n| self.node_name(*n)).collect();
                match start {
                    Some(t) => format!(
                        "fits only on GPUs held for {} on {} (expected to start at t={} ms; \
                         work whose max runtime ends by then may use them)",
                        self.wl(*reservation),
                        names.join(", "),
                        t.0
                    ),
                    None => format!(
                        "fits only on GPUs held for {} on {} (its start is unknown: held from \
                         all other work)",
                        self.wl(*reservation),
                        names.join(", ")
                    ),
                }
            }
            DeferReason::HeldForClaimant { claimant, key } => format!(
                "would borrow {} while {} of another project of its cohort waits for room \
                 within its guarantee (it would be reclaimed)",
                self.key_name(*key),
                self.wl(*claimant)
            ),
            DeferReason::QuotaHeldForReservation { reservation, key } => format!(
                "would take {} quota held for {}, pending longer, which waits for it \
                 (reservations: work may take it only if its max runtime ends before that \
                 request's expected start)",
                self.key_name(*key),
                self.wl(*reservation)
            ),
        }
    }

    /// "no room for …": the free capacity a placement found too little of.
    fn render_no_room(&self, f: &PlacementFacts) -> String {
        match f.mig {
            Some(profile) => {
                let model = f.model.map_or("cpu", |m| self.model_name(m));
                format!(
                    "no room for {}{profile} on {model}{}: no MIG-enabled device has a free \
                     placement for it; {} whole {model} free",
                    if f.members > 1 { format!("{} × ", f.members) } else { String::new() },
                    if f.same_node { " on one node" } else { "" },
                    f.free_whole_gpus,
                )
            }
            None => {
                let model = f.model.map_or("cpu", |m| self.model_name(m));
                let shape = if f.members > 1 {
                    format!("{} members × {} {model}", f.members, f.per_member)
                } else {
                    format!("{} {model}", f.per_member)
                };
                let block = match f.largest_free_block_node {
                    Some(node) => {
                        format!(
                            "largest free block {} on {}",
                            f.largest_free_block,
                            self.node_name(node)
                        )
                    }
                    None => "no whole device free".to_string(),
                };
                if f.fragmented() {
                    // "9 free A100 across 5 nodes, largest block 3 on node-7".
                    return format!(
                        "no room for {shape}{}: fragmented, {} free {model} across {} nodes, {}",
                        if f.same_node { " on one node" } else { "" },
                        f.free_whole_gpus,
                        f.nodes_with_free,
                        block.replace("largest free block", "largest block")
                    );
                }
                format!(
                    "no room for {shape}{}: {block}; {} whole free across {} nodes ({} incl. partial)",
                    if f.same_node { " on one node" } else { "" },
                    f.free_whole_gpus,
                    f.nodes_with_free,
                    f.free_shares
                )
            }
        }
    }

    /// "suspending `w-123` (checkpointed 2 min ago) frees a block of 4 A100 on n7; …".
    fn render_defrag(&self, plan: &DefragPlan, enabled: bool) -> String {
        let mut last_verb = "";
        let victims: Vec<String> = plan
            .victims
            .iter()
            .map(|v| {
                let verb = match self.victim_mode(v.workload) {
                    Some(PreemptionMode::Requeue) => "requeueing",
                    _ => "suspending",
                };
                let saved = match v.checkpoint_age_ms {
                    Some(age) => format!("checkpointed {} ago", duration(age)),
                    None => "no checkpoint".to_string(),
                };
                let shown = if verb == last_verb { String::new() } else { format!("{verb} ") };
                last_verb = verb;
                format!("{shown}{} ({saved})", self.wl(v.workload))
            })
            .collect();
        let books = format!(
            "gain {} waited, cost {} lost and restarting",
            gpu_time(plan.gain_gpu_ms),
            gpu_time(plan.cost_gpu_ms)
        );
        let verdict = if !enabled {
            format!("defragmentation is off in the policy ({books})")
        } else if plan.touches_guarantee && !plan.replaceable {
            "not done: it would take work another project runs within its guarantee".to_string()
        } else {
            format!("not done: the cost is not below the gain ({books})")
        };
        format!(
            "{} frees a block of {} {} on {}; {verdict}",
            victims.join(", "),
            plan.frees_block,
            self.model_name(plan.model),
            self.node_name(plan.node)
        )
    }

    /// A one-line summary: `admit train-1: within vision's guarantee …`.
    pub fn render(&self, decision: &Decision) -> String {
        format!(
            "{} {}: {}",
            decision.action(),
            self.decision_subject(decision),
            self.render_reason(decision)
        )
    }

    /// The name of the workload a decision is about (`#id` when it has none).
    pub fn decision_subject(&self, decision: &Decision) -> String {
        match decision {
            Decision::Reject { name, .. } if !name.is_empty() => name.clone(),
            _ => self.wl(decision.workload()),
        }
    }

    /// A multi-line `why` report.
    pub fn render_explanation(&self, e: &Explanation) -> String {
        let mut lines = Vec::new();
        let suspended;
        let stage = match e.stage {
            Stage::Pending if e.preemptions > 0 => {
                suspended = format!("suspended ({}), pending", e.stops().unwrap_or_default());
                suspended.as_str()
            }
            Stage::Pending => "pending",
            Stage::Assumed => "admitted (start not yet confirmed)",
            Stage::Running => "running",
            Stage::Stopping => "stopping",
        };
        lines.push(format!("{}: {stage}", self.wl(e.workload)));
        if let Some(deadline) = e.deadline {
            lines.push(format!("  deadline {deadline}"));
        }
        if let Some(p) = &e.placement {
            lines.push(format!("  placed on {}", self.render_placement(p)));
        }
        if let Some((key, levels)) = &e.borrowing {
            let project = self.workloads.get(&e.workload).map(|w| w.project);
            let mut parts = Vec::new();
            let mut borrower = project
                .map_or_else(|| "its project".to_string(), |p| self.project_name(p).to_string());
            for (cohort, lent) in levels {
                let cohort_shown = cohort.strip_suffix(":solo").unwrap_or(cohort);
                parts.push(format!(
                    "{borrower} borrows {lent} {} from {cohort_shown}",
                    self.key_name(*key)
                ));
                borrower = cohort_shown.to_string();
            }
            lines.push(format!("  borrowing: {}", parts.join("; ")));
        }
        if let Some(p) = e.protection {
            lines.push(format!("  not pre-emptible now: {}", render_protection(p)));
        }
        if let Some(t) = e.reclaim_from {
            lines.push(format!(
                "  takes no GPUs back from borrowers before t={} ms (preemption.reclaim_after)",
                t.0
            ));
        }
        if let Some(r) = &e.reservation {
            let nodes: Vec<String> = r
                .nodes
                .iter()
                .map(|(n, gpus)| format!("{} ({gpus})", self.node_name(*n)))
                .collect();
            let start = r.start.map_or("unknown".to_string(), |t| format!("t={} ms", t.0));
            lines.push(format!(
                "  reserved: {} {} GPUs held on {} since t={} ms; expected start {start}",
                r.nodes.iter().map(|(_, g)| g).sum::<u32>(),
                self.model_name(r.model),
                nodes.join(", "),
                r.since.0
            ));
        }
        if let Some((key, start)) = e.quota_hold {
            let start = start.map_or("unknown".to_string(), |t| format!("t={} ms", t.0));
            lines.push(format!(
                "  quota held: {} quota this needs is kept from later work of its project and \
                 other projects' borrowers; expected start {start}",
                self.key_name(key)
            ));
        }
        if let Some((idle, warned)) = &e.idle {
            let warned = warned.map(|t| format!("; warned at t={} ms", t.0)).unwrap_or_default();
            let action = e
                .idle_action_at
                .map(|t| {
                    format!("; will {} at t={} ms unless active again", idle.action.as_str(), t.0)
                })
                .unwrap_or_default();
            lines.push(format!("  {}{warned}{action}", self.render_idle(idle)));
        }
        if let Some(q) = &e.queue {
            let ahead: Vec<String> = q.ahead.iter().map(|w| self.wl(*w)).collect();
            lines.push(format!(
                "  position {} in its project queue{}",
                q.position,
                if ahead.is_empty() {
                    String::new()
                } else {
                    format!(", behind {}", ahead.join(", "))
                }
            ));
        }
        if let Some(d) = &e.decision {
            lines.push(format!("  now: {} — {}", d.action(), self.render_reason(d)));
        }
        let now_reason = match &e.decision {
            Some(Decision::Defer { reason, .. }) => Some(reason),
            _ => None,
        };
        for b in e.blocking.iter().filter(|b| Some(*b) != now_reason) {
            lines.push(format!("  also blocked: {}", self.render_defer(b)));
        }
        for c in &e.counterfactuals {
            let text = match c {
                Counterfactual::FewerGpus { members, gpus_per_member } => {
                    let per = match gpus_per_member {
                        GpuRequest::Whole(n) => n.to_string(),
                        GpuRequest::Shares(s) => format!("{}", crate::ids::Shares(u64::from(*s))),
                        GpuRequest::Mig(p) => p.to_string(),
                    };
                    format!("would start now with {members} × {per} GPUs")
                }
                Counterfactual::OtherModel { model } => {
                    format!("would start now on {}", self.model_name(*model))
                }
                Counterfactual::SplitAcrossNodes => {
                    "would start now if its members may run on different nodes".to_string()
                }
                Counterfactual::Reclaim { victims, protected } => {
                    let names: Vec<String> = victims.iter().map(|v| self.wl(*v)).collect();
                    let guards: Vec<String> = protected
                        .iter()
                        .map(|(v, p)| format!("{} {}", self.wl(*v), render_protection(*p)))
                        .collect();
                    let guards = if guards.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", guards.join("; "))
                    };
                    format!("would start now if {} stopped{guards}", names.join(", "))
                }
                Counterfactual::Defragment { plan, enabled } => self.render_defrag(plan, *enabled),
            };
            lines.push(format!("  option: {text}"));
        }
        lines.join("\n")
    }
}

/// Why running work may not be pre-empted, with the policy field that says so.
fn render_protection(p: Protection) -> String {
    match p {
        Protection::NotPreemptible => {
            "is never pre-empted: its class or its own flag says so".into()
        }
        Protection::MinRuntime { until } => {
            format!("is within its min runtime until t={} ms", until.0)
        }
        Protection::Restarted { until } => format!(
            "restarted after a stop: exempt until t={} ms (preemption.exempt_after_restart)",
            until.0
        ),
        Protection::Capped { count, window_ms, until } => format!(
            "was pre-empted {count} {} within {}: exempt until t={} ms \
             (preemption.max_per_workload)",
            if count == 1 { "time" } else { "times" },
            duration(window_ms),
            until.0
        ),
    }
}

/// GPU time for people: `45 GPU-s`, `12.5 GPU-min`, `3.2 GPU-h`.
pub(crate) fn gpu_time(gpu_ms: u64) -> String {
    if gpu_ms < 60_000 {
        format!("{} GPU-s", gpu_ms / 1000)
    } else if gpu_ms < 7_200_000 {
        format!("{:.1} GPU-min", gpu_ms as f64 / 60_000.0)
    } else {
        format!("{:.1} GPU-h", gpu_ms as f64 / 3_600_000.0)
    }
}

/// A duration for people: `40 s`, `2 min`, `3.5 h`.
pub(crate) fn duration(ms: u64) -> String {
    if ms < 60_000 {
        format!("{} s", ms / 1000)
    } else if ms < 7_200_000 {
        format!("{} min", ms / 60_000)
    } else {
        format!("{:.1} h", ms as f64 / 3_600_000.0)
    }
}

/// Millicores as CPUs: "16", "0.5".
fn cpus_text(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{:.3}", millis as f64 / 1000.0).trim_end_matches('0').to_string()
    }
}

/// MiB as the unit a node's memory is written in: "512Gi", "1536Mi".
fn mib_text(mib: u64) -> String {
    if mib.is_multiple_of(1024) { format!("{}Gi", mib / 1024) } else { format!("{mib}Mi") }
}
