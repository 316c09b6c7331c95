//! allot-sim: what-if simulation over real cluster traces.
//!
//! Everything here drives `allot-core` — the engine for time-based replay, the placement
//! policies for the packing experiment — with a virtual clock; there is no second scheduler.
//!
//! - [`openb`]: Alibaba openb node and pod lists (FGD, ATC'23).
//! - [`trace`]: Philly jobs, machines and virtual clusters; the allot trace format.
//! - [`genai`]: Alibaba's GenAI serving trace 2026 (per-container duty cycle, memory, requests).
//! - [`pack`]: the FGD packing experiment (arrival-only, inflated, metrics per 1 % of demand).
//! - [`bound`]: an upper bound on what any placement can allocate (configuration LP).
//! - [`replay`]: discrete-event replay with quotas, priorities, pre-emption and [`activity`].
//! - [`slurm`]: the plain-Slurm baseline (FIFO + backfill with reservations) that replays
//!   the same trace for comparison; a model of Slurm, not a second allot scheduler.
//! - [`idle`]: the idle-reclaim experiment (AMD RM, Run:ai and allot rules on one seeded
//!   workload with modelled telemetry).
//! - [`report`], [`charts`], [`progress`]: tables, JSON/CSV, SVG/PNG charts, progress bars.

pub mod activity;
pub mod bound;
pub mod charts;
pub mod csv;
pub mod error;
pub mod genai;
pub mod idle;
pub mod openb;
pub mod outcome;
pub mod pack;
pub mod progress;
pub mod replay;
pub mod report;
pub mod rng;
pub mod slurm;
pub mod trace;

pub use error::{BadRows, Skipped, TraceError};
pub use rng::SimRng;
