//! allot's config files — cluster, policy, workloads — read into `allot-core`'s model.
//!
//! Every problem is reported at once, each as a [`Diagnostic`] naming the file, the line and
//! column, the field path (`projects[2].quotas[0].guaranteed`, 0-based indexes) and a fix.
//! Nothing here panics on any input: YAML syntax errors, wrong types, out-of-range numbers,
//! deep nesting and huge counts all come back as diagnostics (every size has a limit).
//!
//! How: yaml-rust2's event parser builds a small tree that keeps positions (`tree`), and a
//! hand-written decoder reads it with an error collector (`decode`). Numbers are parsed as exact
//! decimals, never through `f64`, so `0.1` GPU is exactly 100 shares.
//!
//! # Common value formats
//!
//! - **GPUs** (quotas): a number, fractions allowed down to 1/1000 (`4`, `0.5`, `2.125`).
//! - **CPU**: cores (`64`, `0.5`) or millicores (`64000m`).
//! - **Memory**: binary units `Ki` `Mi` `Gi` `Ti` `Pi` (`80Gi`, `1.5Ti`) or a whole number of
//!   MiB. Decimal units (`G`, `GB`) are refused: they are not whole MiB.
//! - **Durations**: `500ms`, `30s`, `15m`, `2h`, `7d`, combined (`1h30m`) or decimal (`1.5h`),
//!   or a whole number of milliseconds.
//! - **Percentages**: `10%`, `2.5%`, or a bare number meaning the same (`10` is 10 %, `0.5` is
//!   half a percent); 0 to 100, in steps of 0.1 %.
//! - **Timestamps**: milliseconds since the caller's epoch (the daemon: Unix time; the
//!   simulator: 0), or a duration after it (`6h`).
//! - **Names** (nodes, pools, racks, projects, cohorts, departments, classes, GPU models):
//!   1–253 letters, digits, `-`, `_`, `.`.
//! - Booleans are `true`/`false`. Unknown fields are errors (with "did you mean"). YAML anchors
//!   are allowed, aliases (`*x`) are not; one document per file.
//!
//! # Cluster file → `Vec<NodeSpec>`
//!
//! ```yaml
//! nodes:
//!   - name: h100          # required; with `count: N`, nodes are named h100-0 … h100-{N-1}
//!     count: 2            # optional: stamp out N identical nodes
//!     cpu: 192            # required
//!     memory: 2048Gi      # required
//!     pool: training      # optional
//!     rack: r1            # optional
//!     labels: {vendor: nvidia}   # optional text → text; `pool`/`rack` are fields, not labels
//!     gpus:               # optional (a CPU-only node has none): groups of identical devices
//!       - {model: H100, count: 4, memory: 80Gi, island: 0}   # island: NVLink group, default 0
//!       - {model: H100, count: 4, memory: 80Gi, island: 1}
//!   - name: a100-mig
//!     cpu: 128
//!     memory: 1Ti
//!     gpus:               # mig: true — MIG-enabled, requests may ask `gpus: 3g.40gb`
//!       - {model: A100-80GB, count: 8, memory: 80Gi, mig: true}
//!   - name: mi300x
//!     cpu: 192
//!     memory: 2Ti
//!     gpus:               # each GPU becomes 8 devices `MI300X-CPX` of 192Gi / 8 each
//!       - {model: MI300X, count: 8, memory: 192Gi, partition: {compute: CPX, memory: NPS4}}
//! ```
//! Checked: node names unique (after `count` expansion), at least one node, ≤ 1024 devices
//! per node (after partition expansion), ≤ 100 000 nodes, `any` is not a model name.
//! `mig: true` needs a model with a MIG table (`A100-40GB`, `A100-80GB`, `H100-80GB`,
//! `H100-94GB`/`H100-NVL`, `H200-141GB`; `allot_core::MigGpu`). `partition` is MI300X only:
//! `compute` SPX | DPX | QPX | CPX (1, 2, 4, 8 devices per GPU, memory split evenly, all in
//! the group's island), `memory` NPS1 | NPS2 | NPS4, in the pairs the amdgpu driver accepts:
//! SPX–NPS1, DPX–NPS1|NPS2, QPX–NPS1|NPS4, CPX–NPS1|NPS4.
//!
//! # Policy file → `PolicySpec`
//!
//! ```yaml
//! fair_share: {half_life: 7d}         # optional; default 0 (point-in-time fairness)
//! preemption: {mode: suspend}         # optional; suspend | requeue | delete (default suspend)
//!   # exempt_after_restart: 2m        # optional, default 2m (0: off): work restarted after a
//!                                     #   pre-emption or idle reclaim is not pre-empted again
//!                                     #   this long (Slurm's PreemptExemptTime, for restarts)
//!   # max_per_workload: {count: 3, window: 1h}  # optional, default no cap: pre-empted this
//!                                     #   often within the window, it is not pre-empted again
//!                                     #   until the oldest leaves it (count 1–16)
//!   # reclaim_after: 1m               # optional, default 0 (at once): a claimant takes quota
//!                                     #   back from borrowers only once it has waited this
//!                                     #   long; what borrowed work ends meanwhile goes to it
//!   # fair_sharing: true              # optional, default off: a borrower may take another
//!                                     #   borrower's GPUs when their shares allow it (Kueue's
//!                                     #   strategies; `{strategies: [less_than_or_equal_to_
//!                                     #   final_share, less_than_initial_share]}` by default)
//! defragmentation: true               # optional, default false; or {enabled: true, restart_cost: 2m}
//!                                     #   (restart_cost here: per GPU of work moved to defragment)
//! reservations: {after: 5m, per_model_max: 2}   # optional, default off: a whole-GPU request
//!                                     #   quota allows that has waited `after` gets the nodes
//!                                     #   where it would start earliest held for it (at most
//!                                     #   `per_model_max` per GPU model, 1-64, default 2); other
//!                                     #   work goes there only if its max runtime ends first.
//!                                     #   Borrowers also wait while an in-guarantee request of
//!                                     #   another project of the cohort waits for room.
//!                                     #   `hold_quota: true` (default false) holds quota too:
//!                                     #   for a reserved request and for the oldest one its
//!                                     #   quota line cannot hold yet, later work of its project
//!                                     #   and other projects' borrowers wait unless their max
//!                                     #   runtime ends by its expected start
//! restart_cost: 2m                    # optional, default 2m: what restarting a pre-empted or
//!                                     #   reclaimed victim costs the arbiter, per GPU it holds
//! idle_resume_backoff: 5m             # optional, default 5m, at most 4h: first wait before work
//!                                     #   reclaimed for idleness may resume (doubled per reclaim)
//! priority_classes:                   # required, at least one
//!   - {name: low, value: -100, preemptible: true}   # value: i32; preemptible default true
//!   - {name: high, value: 100, preemptible: false}
//! default_priority_class: low         # required; must name a class above
//! projects:                           # required, at least one
//!   - name: vision                    # required, unique
//!     cohort: perception              # optional: projects in a cohort lend to each other
//!     department: ai-research         # optional
//!     weight: 2                       # optional fair-share weight > 0, default 1
//!     queueing: best_effort_fifo      # optional: strict_fifo | best_effort_fifo (default)
//!     preemption_mode: requeue        # optional: overrides `preemption.mode` for its victims
//!     preempt_within_project: lower_priority  # optional: which of its own running work its
//!                                     #   pending work may pre-empt: lower_priority (default) |
//!                                     #   lower_or_newer_equal_priority | never (Kueue's
//!                                     #   withinClusterQueue)
//!     borrow_within_cohort: {policy: lower_priority, max_priority_threshold: 0}  # optional,
//!                                     #   cohort only: reclaim borrowed GPUs from other projects'
//!                                     #   work below its own (and at most the threshold) even
//!                                     #   though it borrows afterwards; `never` (default) or
//!                                     #   `lower_priority` (no threshold) also work
//!     quotas:                         # optional; one line per model, `any` for the rest
//!       - {model: H100, guaranteed: 8, borrow_limit: 8, lend_limit: 4}
//!       - {model: any, guaranteed: 0.5}
//! cohorts:                            # optional: cohorts with quota of their own, inside others
//!   - name: org                       #   (hierarchical quota, Kueue's Cohort objects)
//!   - name: research                  # required, unique; a project's `cohort` may name it
//!     parent: org                     # optional: a cohort declared here; no circles
//!     quotas:                         # optional, as a project's: its own GPUs beside what its
//!       - {model: A100, guaranteed: 4, borrow_limit: 2, lend_limit: 6}
//!                                     #   projects lend it; limits need a parent; lend_limit is
//!                                     #   on its whole subtree
//! idle:                               # optional idle reclaim rules, in order: the first whose
//!                                     #   scope covers a workload judges it; none: never idle
//!   - name: notebooks                 # required, unique among the rules
//!     projects: [vision]              # optional, default every project; each defined above
//!     kinds: [notebook]               # optional, default every kind (kinds as in workloads)
//!     exempt_classes: [high]          # optional: classes never reclaimed (idleness reported)
//!     model: allot                    # allot (default) | amd_rm | runai
//!     threshold: 10%                  # activity below this share of the allocation is idle
//!     idle_timer: 15m                 # idle this long: reclaim (> 0)
//!     sustain: 60s                    # allot only: activity must last this long to reset it
//!     missing_telemetry: hold         # allot only: hold | idle | active (a gap in samples)
//!     min_runtime: 5m                 # allot only: not judged this long after the start
//!     policy: on_pressure             # on_pressure | always | report_only
//!     action: suspend                 # suspend | requeue | delete
//!     warn_before: 5m                 # a warning this long before the action, ≤ idle_timer
//!     quiet_timer: 15m                # allot only: the timer while the rule's other workloads
//!                                     #   in the project are quiet (0 < it ≤ idle_timer)
//!     quiet_below: 25%                # allot only: quiet = fewer than this share of them active
//!     quiet_window: 15m               # allot only: active = idle less than this (≤ 24h)
//! ```
//! Checked: unique project and class names; the default class exists; one quota line per
//! model per project; GPU amounts ≥ 0 and not finer than 1/1000; `lend_limit ≤ guaranteed`;
//! `borrow_limit` and `lend_limit` only in a cohort (as in Kueue: without a cohort there is
//! nobody to borrow from or lend to).
//!
//! Idle rules (`allot_core::idle` has each model's semantics): unique rule names; `projects`
//! and `exempt_classes` name ones the file defines, none twice, not an empty list; no rule
//! whose whole scope an earlier rule already covers (it would never judge anything);
//! `warn_before ≤ idle_timer`. Defaults and limits per model:
//!
//! | | `allot` | `amd_rm` (AMD Resource Manager) | `runai` (Run:ai) |
//! |---|---|---|---|
//! | `threshold` | 10 % | 10 % | fixed at 0 %: refused if given |
//! | `idle_timer` | 15m, > 0 | 15m; ≥ 15m and whole minutes (AMD's API) | required; whole minutes > 0 |
//! | `sustain`, `missing_telemetry`, `min_runtime` | 60s, `hold`, 5m | refused | refused |
//! | `policy` | `on_pressure` | `on_pressure`; `report_only` refused | `always` |
//! | `action` | `suspend` | `delete` | `suspend` |
//! | `warn_before` | 5m (the timer if shorter) | 0; anything else refused | 0 |
//! | `quiet_timer`, `quiet_below`, `quiet_window` | none, 25 %, 15m; the timer ≥ `warn_before`, the share > 0; a share or window without a timer refused | refused | refused |
//!
//! A setting a baseline does not have is refused rather than ignored, so that a comparison
//! against `amd_rm` or `runai` always runs the product's own rule
//! (`shared/docs/reference/products.md` §2.1–2.2).
//!
//! # Workloads file → [`WorkloadFile`] (`Vec<WorkloadSpec>`)
//!
//! ```yaml
//! workloads:
//!   - id: 7                 # optional; default: 1-based position in the file; unique
//!     name: resnet          # optional; default `workload-{id}`
//!     kind: training        # training (default) | batch | notebook | inference | service
//!     project: vision       # required
//!     user: alice           # optional
//!     priority_class: high  # optional; default: the policy's default class
//!     members: 2            # gang size, default 1
//!     gpus: 4               # required, per member: whole GPUs (≥ 1), a fraction < 1 (shares),
//!                           # or one MIG instance (`3g.40gb`, `1g.10gb+me`) on a MIG-enabled GPU
//!     gpu_models: [H100, A100]   # or "H100|A100"; optional, in order of preference; any if absent
//!     cpu: 16               # per member, default 0
//!     memory: 128Gi         # per member, default 0
//!     same_node: true       # default false; the same as `topology: required_same_node`
//!     topology: prefer_same_node   # required_same_node | prefer_same_node | spread_ok (default)
//!     preemptible: false    # optional; may only narrow the class's preemptibility
//!     checkpoint: {grace: 30s, last_checkpoint_at: 0}   # optional; grace required in it
//!     min_runtime: 10m      # default 0
//!     max_runtime: 24h      # optional
//!     deadline: 12h         # optional timestamp
//!     running: {node: gpu-1, devices: [0, 1, 2, 3], since: 2h, last_checkpoint: 20m}
//!                           # plan files only, optional: it runs already there (devices
//!                           # optional: the node's first free ones it accepts), started
//!                           # `since` ago, last checkpointed `last_checkpoint` ago; a gang
//!                           # says `members: [{node: gpu-1, devices: [..]}, {node: gpu-2}]`
//! ```
//! The same fields also come as JSON lines, one object per line (`.jsonl`/`.ndjson`, or any
//! file whose first non-blank line is a whole `{…}` object); blank lines are skipped.
//! [`check_workloads`] then checks them against a policy and a cluster.

mod cluster;
mod decode;
mod diagnostic;
mod policy;
mod render;
pub mod rollout;
mod scope;
mod tree;
mod workloads;

use std::io::Read;
use std::path::Path;

use allot_core::{NodeSpec, PolicySpec};

pub use cluster::parse_cluster;
pub use diagnostic::{Diagnostic, render};
pub use policy::{not_a_mapping, parse_policy};
pub use render::render_policy;
pub use scope::{Scope, Scoped, scoped_policy};
pub use workloads::{Running, RunningMember, WorkloadFile, check_workloads, parse_workloads};

/// Largest config file read (workload traces as JSON lines are the big ones).
const FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Reads and parses a cluster file.
/// A duration as the config files write it (`30s`, `15m`, `7d`, `1h30m`), in milliseconds;
/// the error says what is wrong with it.
pub fn duration_ms(text: &str) -> Result<u64, String> {
    decode::parse_duration_ms(text).map_err(|_| {
        format!("`{text}` is not a duration: write a number with a unit (ms, s, m, h or d), e.g. 30m or 7d")
    })
}

pub fn load_cluster(path: &Path) -> Result<Vec<NodeSpec>, Vec<Diagnostic>> {
    let (file, text) = read(path)?;
    parse_cluster(&file, &text)
}

/// Reads and parses a policy file.
pub fn load_policy(path: &Path) -> Result<PolicySpec, Vec<Diagnostic>> {
    let (file, text) = read(path)?;
    parse_policy(&file, &text)
}

/// Reads and parses a workloads file (YAML or JSON lines).
pub fn load_workloads(path: &Path) -> Result<WorkloadFile, Vec<Diagnostic>> {
    let (file, text) = read(path)?;
    parse_workloads(&file, &text)
}

/// The file's name for diagnostics and its text, or one diagnostic saying why it can't be read.
fn read(path: &Path) -> Result<(String, String), Vec<Diagnostic>> {
    let file = path.display().to_string();
    let whole_file = |message: String, fix: &str| {
        vec![Diagnostic {
            file: file.clone(),
            line: 0,
            column: 0,
            field: String::new(),
            message,
            fix: fix.to_string(),
        }]
    };
    let mut bytes = Vec::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(FILE_BYTES_MAX + 1).read_to_end(&mut bytes));
    if let Err(error) = read {
        return Err(whole_file(
            format!("cannot read the file: {error}"),
            "check the path and its permissions",
        ));
    }
    if u64::try_from(bytes.len()).map_or(true, |n| n > FILE_BYTES_MAX) {
        return Err(whole_file(
            format!("the file is larger than {} MiB", FILE_BYTES_MAX / (1024 * 1024)),
            "split it into smaller files",
        ));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok((file, text)),
        Err(error) => {
            let valid = &error.as_bytes()[..error.utf8_error().valid_up_to()];
            let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
            let mut diagnostics =
                whole_file("the file is not UTF-8 text".to_string(), "save it as UTF-8");
            diagnostics[0].line = line;
            Err(diagnostics)
        }
    }
}
