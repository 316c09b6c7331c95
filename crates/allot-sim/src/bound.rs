//! An upper bound on the GPU allocation any placement can reach for one arrived pod multiset:
//! a configuration LP in the manner of Gilmore and Gomory, solved by column generation, with the
//! value it reports taken from a Lagrangian bound, so that the number is a valid upper bound
//! whatever the LP solver's accuracy and however early generation stops.
//!
//! # The problem
//! Nodes come in *shapes* t = (CPU C_t, memory M_t, G_t GPUs, model), N_t of each; the arrived
//! GPU pods in *classes* p = (CPU, memory, k GPUs, m shares per GPU, allowed models), n_p of each,
//! worth g_p = k·m shares. A *configuration* of a shape is a multiset of pods that fits one node:
//! CPU and memory within capacity, models allowed, each sharing pod (k = 1, m < 1000) on one GPU,
//! each whole-GPU pod on k GPUs of its own, at most 1000 shares per GPU. The best packing of the
//! multiset — what no policy can beat — is an integer program over configurations.
//!
//! CPU-only pods are left out: they add nothing to the objective and only take CPU and memory, so
//! dropping them from any feasible packing leaves a feasible packing of the same value; the best
//! packing with them is exactly the best packing without them.
//!
//! # The relaxation actually solved
//! Columns are configurations of a slightly *larger* set, which contains every real one:
//! - a column may hold more pods of a class than arrived (the class rows still cap the total);
//! - a pod of k > 1 GPUs with m < 1000 shares counts as k independent one-GPU pieces, each with
//!   ⌊cpu/k⌋ CPU and ⌊mem/k⌋ memory (openb has no such pod).
//!
//! CPU, memory, models and the per-GPU packing are exact. So the LP optimum is ≥ the
//! configuration LP with exact columns ≥ the best packing.
//!
//! # Why the reported number is an upper bound
//! For any prices y_p ≥ 0 on the classes, every packing's value is at most
//!
//!   L(y) = Σ_p n_p·y_p + Σ_t N_t·P_t(y),   P_t(y) = max over configurations c of shape t of
//!   Σ_p a_pc·(g_p − y_p)
//!
//! (each node of a packing holds one configuration, and each class is used at most n_p times:
//! weak duality of the Lagrangian relaxation of the class counts). The maximum is found exactly
//! by [`price`]: per GPU, a Pareto front of (CPU, memory, value) over the multisets of sharing
//! pieces within 1000 shares; fronts for j GPUs by combining; whole-GPU pods on the remaining
//! GPUs; nothing is rounded. Every L computed is an upper bound (plus a margin of
//! [`FLOAT_MARGIN`] per node against floating-point residue); the reported bound is the smallest,
//! floored to whole shares (a packing allocates whole shares). Column generation picks the
//! prices: y is the restricted master's dual (the dual LP is solved directly with
//! `good_lp`/microlp), and the best configuration of each shape joins the master while its
//! reduced cost is positive. When none is, L equals the master's value, the LP optimum; if the
//! round limit stops it first, the bound is still valid, only looser (`converged` says which).

use std::collections::{BTreeMap, BTreeSet};

use allot_core::packing::{PackNodeSpec, PodShape};
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, constraint, microlp, variable,
};
use serde::Serialize;

/// Shares per GPU.
const GPU_SHARES: u64 = 1000;
/// Column generation stops after this many master solves (the bound stays valid).
const ROUNDS_MAX: usize = 300;
/// ... or once the bound is within this many shares per GPU of capacity of the master's value.
const GAP_PER_GPU: f64 = 0.05;
/// Added to every P_t against floating-point residue in the pricing sums, in shares.
const FLOAT_MARGIN: f64 = 0.01;

/// A node shape and how many nodes have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shape {
    cpu_milli: u64,
    memory_mib: u64,
    gpus: u8,
    model: u8,
    count: u64,
}

/// A GPU pod class and how many pods arrived in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Class {
    cpu_milli: u64,
    memory_mib: u64,
    gpus: u8,
    gpu_milli: u16,
    models: u64,
    count: u64,
}

impl Class {
    fn value(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.gpu_milli)
    }

    /// Pieces a column counts per pod: k for a multi-GPU pod of less than whole GPUs (packed
    /// as independent pieces), else 1.
    fn unit(&self) -> u32 {
        if self.gpus > 1 && u64::from(self.gpu_milli) < GPU_SHARES {
            u32::from(self.gpus)
        } else {
            1
        }
    }

    fn allowed_on(&self, shape: &Shape) -> bool {
        shape.model < 64 && self.models & (1u64 << shape.model) != 0
    }
}

/// The packing problem of one arrived pod multiset on one node list, grouped into shapes and
/// classes.
#[derive(Clone, Debug)]
pub struct BoundProblem {
    shapes: Vec<Shape>,
    classes: Vec<Class>,
    capacity_milli: u64,
}

/// What [`BoundProblem::solve`] found. Shares are GPU 1/1000s; percentages are of capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Bound {
    /// The upper bound: no placement of these pods allocates more shares.
    pub bound_milli: u64,
    pub bound_pct: f64,
    /// min(capacity, arrived GPU shares).
    pub trivial_pct: f64,
    /// Node boundaries dropped, GPU models kept: a transportation problem from pod classes to
    /// GPU models.
    pub model_pct: f64,
    /// The restricted master's value at the end (a lower estimate of the configuration LP; not
    /// a bound on anything). `bound_pct − master_pct` is how far from the LP optimum the bound
    /// may still be.
    pub master_pct: f64,
    /// True when generation ended with no positive reduced cost, or with the bound within
    /// [`GAP_PER_GPU`] shares per GPU of capacity of the master's value; false when the round
    /// limit stopped it (the bound is valid either way, only looser).
    pub converged: bool,
    pub rounds: usize,
    pub columns: usize,
    pub shapes: usize,
    pub classes: usize,
}

/// Why a bound could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    /// The LP solver failed on a restricted master (it is always feasible and bounded, so this
    /// is a solver failure).
    #[error("the LP solver failed on the restricted master problem: {0}")]
    Solver(String),
}

impl BoundProblem {
    /// Group nodes into shapes and the GPU pods among `pods` into classes (CPU-only pods are
    /// dropped: see the module documentation).
    pub fn new(nodes: &[PackNodeSpec], pods: &[PodShape]) -> BoundProblem {
        let mut shapes: BTreeMap<(u64, u64, u8, u8), u64> = BTreeMap::new();
        for n in nodes {
            *shapes.entry((n.cpu_milli, n.memory_mib, n.gpus, n.model)).or_default() += 1;
        }
        let mut classes: BTreeMap<(u64, u64, u8, u16, u64), u64> = BTreeMap::new();
        for p in pods.iter().filter(|p| !p.is_cpu_only()) {
            let milli = p.gpu_milli.min(GPU_SHARES as u16);
            *classes.entry((p.cpu_milli, p.memory_mib, p.gpus, milli, p.models.0)).or_default() +=
                1;
        }
        let capacity_milli = nodes.iter().map(|n| u64::from(n.gpus) * GPU_SHARES).sum();
        BoundProblem {
            shapes: shapes
                .into_iter()
                .map(|((cpu_milli, memory_mib, gpus, model), count)| Shape {
                    cpu_milli,
                    memory_mib,
                    gpus,
                    model,
                    count,
                })
                .collect(),
            classes: classes
                .into_iter()
                .map(|((cpu_milli, memory_mib, gpus, gpu_milli, models), count)| Class {
                    cpu_milli,
                    memory_mib,
                    gpus,
                    gpu_milli,
                    models,
                    count,
                })
                .collect(),
            capacity_milli,
        }
    }

    pub fn capacity_milli(&self) -> u64 {
        self.capacity_milli
    }

    /// Σ arrived GPU shares.
    pub fn arrived_milli(&self) -> u64 {
        self.classes.iter().map(|c| c.count * c.value()).sum()
    }

    fn pct(&self, milli: f64) -> f64 {
        100.0 * milli / self.capacity_milli.max(1) as f64
    }

    /// min(capacity, arrived), % of capacity.
    pub fn trivial_pct(&self) -> f64 {
        self.pct(self.arrived_milli().min(self.capacity_milli) as f64)
    }

    /// The transportation bound: pods may split across nodes but only onto GPUs of a model they
    /// allow, each model holding at most its GPUs' shares. % of capacity.
    pub fn model_pct(&self) -> Result<f64, BoundError> {
        let mut model_capacity: BTreeMap<u8, u64> = BTreeMap::new();
        for s in &self.shapes {
            *model_capacity.entry(s.model).or_default() += s.count * u64::from(s.gpus) * GPU_SHARES;
        }
        let mut vars = ProblemVariables::new();
        let mut per_model: BTreeMap<u8, Expression> = BTreeMap::new();
        let mut objective = Expression::from(0.0);
        let mut per_class: Vec<Expression> = Vec::new();
        for class in &self.classes {
            let mut sum = Expression::from(0.0);
            for &model in model_capacity.keys() {
                if model < 64 && class.models & (1u64 << model) != 0 {
                    let x = vars.add(variable().min(0.0));
                    sum += x;
                    objective += x;
                    *per_model.entry(model).or_default() += x;
                }
            }
            per_class.push(sum);
        }
        let mut problem = vars.maximise(objective.clone()).using(microlp);
        for (class, sum) in self.classes.iter().zip(per_class) {
            problem.add_constraint(constraint!(sum <= (class.count * class.value()) as f64));
        }
        for (model, sum) in per_model {
            let cap = model_capacity.get(&model).copied().unwrap_or(0) as f64;
            problem.add_constraint(constraint!(sum <= cap));
        }
        let solution = problem.solve().map_err(|e| BoundError::Solver(e.to_string()))?;
        // A transportation problem with integral data has an integral optimum (its matrix is
        // totally unimodular): round the solver's float residue away.
        let value = solution.eval(&objective).round().max(0.0);
        Ok(self.pct(value))
    }

    /// Run column generation and return the bound.
    pub fn solve(&self) -> Result<Bound, BoundError> {
        let trivial_pct = self.trivial_pct();
        let model_pct = self.model_pct()?;
        let mut columns: Vec<Column> = Vec::new();
        let mut seen: BTreeSet<(usize, Vec<(usize, u32)>)> = BTreeSet::new();
        // Start: for every shape and class, as many pods of the class alone as fit.
        for (t, shape) in self.shapes.iter().enumerate() {
            for (p, class) in self.classes.iter().enumerate() {
                let alone = max_alone(shape, class);
                if alone > 0 {
                    let column = Column::new(self, t, vec![(p, alone * class.unit())]);
                    if seen.insert((t, column.counts.clone())) {
                        columns.push(column);
                    }
                }
            }
        }
        // y = g: every reduced weight is 0 and L is the arrived demand.
        let mut best = self.arrived_milli() as f64;
        let mut master = 0.0;
        let mut converged = false;
        let mut rounds = 0;
        let gap_allowed = GAP_PER_GPU * self.capacity_milli as f64 / GPU_SHARES as f64;
        while rounds < ROUNDS_MAX {
            rounds += 1;
            let duals = self.solve_master(&columns)?;
            master = duals.value;
            let mut bound: f64 =
                self.classes.iter().zip(&duals.y).map(|(c, y)| c.count as f64 * y).sum();
            let mut added = 0;
            for (t, shape) in self.shapes.iter().enumerate() {
                let priced = price(shape, &self.classes, &duals.y);
                let q = priced.value + FLOAT_MARGIN;
                bound += shape.count as f64 * q;
                let column = Column::new(self, t, priced.counts);
                let reduced = column.value as f64
                    - column
                        .counts
                        .iter()
                        .map(|&(p, a)| column.share(self, p, a) * duals.y[p])
                        .sum::<f64>()
                    - duals.pi[t];
                if reduced > 1e-6 * (1.0 + column.value as f64)
                    && seen.insert((t, column.counts.clone()))
                {
                    columns.push(column);
                    added += 1;
                }
            }
            best = best.min(bound);
            if added == 0 || best - master <= gap_allowed {
                converged = true;
                break;
            }
        }
        // The best packing allocates a whole number of shares.
        let bound_milli = best.min(self.capacity_milli as f64).floor().max(0.0) as u64;
        Ok(Bound {
            bound_milli,
            bound_pct: self.pct(bound_milli as f64),
            trivial_pct,
            model_pct,
            master_pct: self.pct(master),
            converged,
            rounds,
            columns: columns.len(),
            shapes: self.shapes.len(),
            classes: self.classes.len(),
        })
    }

    /// The restricted master's dual: min Σ N_t π_t + Σ n_p y_p subject to π_t + a_c·y ≥ g_c for
    /// every column c of shape t; 0 ≤ y_p ≤ g_p (a price above a pod's value never lowers L),
    /// π ≥ 0.
    fn solve_master(&self, columns: &[Column]) -> Result<Duals, BoundError> {
        let mut vars = ProblemVariables::new();
        let pi: Vec<Variable> = self.shapes.iter().map(|_| vars.add(variable().min(0.0))).collect();
        let y: Vec<Variable> = self
            .classes
            .iter()
            .map(|c| vars.add(variable().min(0.0).max(c.value() as f64)))
            .collect();
        let mut objective = Expression::from(0.0);
        for (s, v) in self.shapes.iter().zip(&pi) {
            objective += s.count as f64 * *v;
        }
        for (c, v) in self.classes.iter().zip(&y) {
            objective += c.count as f64 * *v;
        }
        let mut problem = vars.minimise(objective.clone()).using(microlp);
        for column in columns {
            let mut lhs = Expression::from(pi[column.shape]);
            for &(p, a) in &column.counts {
                lhs += column.share(self, p, a) * y[p];
            }
            problem.add_constraint(constraint!(lhs >= column.value as f64));
        }
        let solution = problem.solve().map_err(|e| BoundError::Solver(e.to_string()))?;
        Ok(Duals {
            value: solution.eval(&objective),
            pi: pi.iter().map(|v| solution.value(*v).max(0.0)).collect(),
            y: self
                .classes
                .iter()
                .zip(&y)
                .map(|(c, v)| solution.value(*v).clamp(0.0, c.value() as f64))
                .collect(),
        })
    }
}

/// The master's value and dual prices, clipped to their valid ranges.
struct Duals {
    value: f64,
    pi: Vec<f64>,
    y: Vec<f64>,
}

/// How many pods of `class` alone fit on one node of `shape` (every limit, at most the arrived
/// count).
fn max_alone(shape: &Shape, class: &Class) -> u32 {
    if !class.allowed_on(shape) || class.gpus == 0 || class.gpus > shape.gpus {
        return 0;
    }
    let mut most = class.count;
    if let Some(n) = shape.cpu_milli.checked_div(class.cpu_milli) {
        most = most.min(n);
    }
    if let Some(n) = shape.memory_mib.checked_div(class.memory_mib) {
        most = most.min(n);
    }
    let per_gpu = GPU_SHARES / u64::from(class.gpu_milli).max(1);
    most = most.min(u64::from(shape.gpus) * per_gpu / u64::from(class.gpus));
    most.min(u64::from(u32::MAX)) as u32
}

/// A configuration of a shape: pieces per class (pods × [`Class::unit`]).
#[derive(Clone, Debug)]
struct Column {
    shape: usize,
    counts: Vec<(usize, u32)>,
    value: u64,
}

impl Column {
    fn new(problem: &BoundProblem, shape: usize, counts: Vec<(usize, u32)>) -> Column {
        let mut value = 0.0;
        for &(p, a) in &counts {
            let class = &problem.classes[p];
            value += f64::from(a) / f64::from(class.unit()) * class.value() as f64;
        }
        Column { shape, counts, value: value.round() as u64 }
    }

    /// a_pc: pods of class p (pieces / unit).
    fn share(&self, problem: &BoundProblem, p: usize, pieces: u32) -> f64 {
        f64::from(pieces) / f64::from(problem.classes[p].unit())
    }
}

/// What one pricing found: the maximum of Σ a·(g − y) over the relaxed configurations of
/// a shape (exact), and a configuration reaching it (pieces per class).
#[derive(Clone, Debug)]
struct Priced {
    value: f64,
    counts: Vec<(usize, u32)>,
}

/// How a front point was built, for reading its configuration back.
#[derive(Clone, Copy, Debug)]
enum Link {
    Empty,
    /// One more piece (or whole-GPU pod) of a class on top of `parent`.
    Add {
        class: u32,
        parent: u32,
    },
    /// Two independent parts (e.g. j−1 GPUs and one more GPU).
    Join(u32, u32),
}

/// A point of a Pareto front over (CPU used, memory used, value), sorted by CPU.
#[derive(Clone, Copy, Debug)]
struct Point {
    cpu: u64,
    mem: u64,
    value: f64,
    id: u32,
}

/// A candidate point: an existing one or a new one with its link.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    cpu: u64,
    mem: u64,
    value: f64,
    origin: Origin,
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Existing(u32),
    New(Link),
}

#[derive(Debug, Default)]
struct Arena(Vec<Link>);

impl Arena {
    fn push(&mut self, link: Link) -> u32 {
        self.0.push(link);
        (self.0.len() - 1) as u32
    }

    /// Keep the candidates within `limits` (CPU, memory) that no other dominates (no more CPU,
    /// no more memory, at least the value); store the new survivors. Sorted by CPU.
    fn pareto(&mut self, mut candidates: Vec<Candidate>, limits: (u64, u64)) -> Vec<Point> {
        candidates.retain(|c| c.cpu <= limits.0 && c.mem <= limits.1);
        candidates.sort_by(|a, b| {
            a.cpu.cmp(&b.cpu).then(a.mem.cmp(&b.mem)).then(b.value.total_cmp(&a.value))
        });
        // Among the points kept so far (all with no more CPU): the best value per memory used,
        // as a staircase rising with memory.
        let mut staircase: BTreeMap<u64, f64> = BTreeMap::new();
        let mut front: Vec<Point> = Vec::new();
        for c in candidates {
            if staircase.range(..=c.mem).next_back().is_some_and(|(_, &v)| v >= c.value) {
                continue;
            }
            let covered: Vec<u64> = staircase
                .range(c.mem..)
                .take_while(|&(_, &v)| v <= c.value)
                .map(|(&m, _)| m)
                .collect();
            for m in covered {
                staircase.remove(&m);
            }
            staircase.insert(c.mem, c.value);
            let id = match c.origin {
                Origin::Existing(id) => id,
                Origin::New(link) => self.push(link),
            };
            front.push(Point { cpu: c.cpu, mem: c.mem, value: c.value, id });
        }
        front
    }

    /// Pieces per class of the configuration behind `id`.
    fn counts(&self, id: u32) -> Vec<(usize, u32)> {
        let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            match self.0.get(id as usize) {
                Some(Link::Add { class, parent }) => {
                    *counts.entry(*class as usize).or_default() += 1;
                    stack.push(*parent);
                }
                Some(Link::Join(a, b)) => {
                    stack.push(*a);
                    stack.push(*b);
                }
                Some(Link::Empty) | None => {}
            }
        }
        counts.into_iter().collect()
    }
}

/// One pod class as the pricing of one shape sees it.
#[derive(Clone, Copy, Debug)]
struct Item {
    class: u32,
    cpu: u64,
    mem: u64,
    /// Shares on one GPU (sharing items) or GPUs taken (whole-GPU items).
    size: u64,
    weight: f64,
}

fn existing(front: &[Point]) -> impl Iterator<Item = Candidate> + '_ {
    front.iter().map(|p| Candidate {
        cpu: p.cpu,
        mem: p.mem,
        value: p.value,
        origin: Origin::Existing(p.id),
    })
}

/// Unbounded knapsack of `items` over capacity `size_max` (shares of one GPU, or GPUs), a
/// Pareto front of (CPU, value) per capacity used.
fn fronts_by_size(
    arena: &mut Arena,
    items: &[Item],
    size_max: u64,
    limits: (u64, u64),
    empty: u32,
) -> Vec<Vec<Point>> {
    let mut fronts: Vec<Vec<Point>> = vec![Vec::new(); size_max as usize + 1];
    fronts[0] = vec![Point { cpu: 0, mem: 0, value: 0.0, id: empty }];
    for item in items {
        // Ascending sizes, in place: a front already holding copies of this item extends again.
        for s in 0..=size_max.saturating_sub(item.size) {
            if fronts[s as usize].is_empty() {
                continue;
            }
            let target = (s + item.size) as usize;
            let mut candidates: Vec<Candidate> = existing(&fronts[target]).collect();
            candidates.extend(fronts[s as usize].iter().map(|p| Candidate {
                cpu: p.cpu + item.cpu,
                mem: p.mem + item.mem,
                value: p.value + item.weight,
                origin: Origin::New(Link::Add { class: item.class, parent: p.id }),
            }));
            fronts[target] = arena.pareto(candidates, limits);
        }
    }
    fronts
}

/// The exact maximum of Σ_p a_p·(g_p − y_p) over relaxed configurations of `shape` (see the
/// module documentation): CPU and memory within the node's, sharing pieces packed into GPUs of
/// 1000 shares, whole-GPU pods on GPUs of their own, class counts not limited.
fn price(shape: &Shape, classes: &[Class], y: &[f64]) -> Priced {
    let mut sharing: Vec<Item> = Vec::new();
    let mut whole: Vec<Item> = Vec::new();
    for (p, class) in classes.iter().enumerate() {
        if !class.allowed_on(shape) || class.gpus == 0 || class.gpu_milli == 0 {
            continue;
        }
        let unit = u64::from(class.unit());
        let weight = (class.value() as f64 - y[p]) / unit as f64;
        let (cpu, mem) = (class.cpu_milli / unit, class.memory_mib / unit);
        if weight <= 0.0 || cpu > shape.cpu_milli || mem > shape.memory_mib {
            continue;
        }
        let milli = u64::from(class.gpu_milli);
        if milli >= GPU_SHARES {
            if class.gpus <= shape.gpus {
                let size = u64::from(class.gpus);
                whole.push(Item { class: p as u32, cpu, mem, size, weight });
            }
        } else if shape.gpus > 0 {
            sharing.push(Item { class: p as u32, cpu, mem, size: milli, weight });
        }
    }
    let limits = (shape.cpu_milli, shape.memory_mib);
    let mut arena = Arena::default();
    let empty = arena.push(Link::Empty);
    let origin = Point { cpu: 0, mem: 0, value: 0.0, id: empty };
    // One GPU: every multiset of sharing pieces within 1000 shares.
    let per_size = fronts_by_size(&mut arena, &sharing, GPU_SHARES, limits, empty);
    let one_gpu = arena.pareto(per_size.iter().flat_map(|f| existing(f)).collect(), limits);
    // j GPUs of sharing pieces.
    let gpus = usize::from(shape.gpus);
    let mut shared: Vec<Vec<Point>> = vec![vec![origin]];
    for j in 1..=gpus {
        let mut candidates = Vec::new();
        for a in &shared[j - 1] {
            for b in &one_gpu {
                if a.cpu + b.cpu > limits.0 {
                    break;
                }
                if a.mem + b.mem > limits.1 {
                    continue;
                }
                candidates.push(Candidate {
                    cpu: a.cpu + b.cpu,
                    mem: a.mem + b.mem,
                    value: a.value + b.value,
                    origin: Origin::New(Link::Join(a.id, b.id)),
                });
            }
        }
        let front = arena.pareto(candidates, limits);
        shared.push(front);
    }
    // Whole-GPU pods by GPUs taken, then the rest of the GPUs shared.
    let by_gpus = fronts_by_size(&mut arena, &whole, shape.gpus.into(), limits, empty);
    let mut best = (0.0, empty, empty);
    for (taken, front) in by_gpus.iter().enumerate() {
        for a in front {
            for b in &shared[gpus - taken] {
                if a.cpu + b.cpu > limits.0 {
                    break;
                }
                let value = a.value + b.value;
                if a.mem + b.mem <= limits.1 && value > best.0 {
                    best = (value, a.id, b.id);
                }
            }
        }
    }
    let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
    for id in [best.1, best.2] {
        for (p, n) in arena.counts(id) {
            *counts.entry(p).or_default() += n;
        }
    }
    Priced { value: best.0, counts: counts.into_iter().collect() }
}
