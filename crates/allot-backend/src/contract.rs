//! The backend contract: the rules every backend keeps, as checks a backend's own tests run.
//!
//! Each rule is a function over a [`Harness`], which supplies backends and a few programs in the
//! backend's own terms (a shell command on the local backend, a scripted behaviour on the fake).
//! `run_all` runs every rule; a crate may instead run each rule as its own test (see [`rules`]).
//! Rules use distinct workload ids, so they can share one harness (and one state directory).
//!
//! The checks panic with the observations seen so far when a rule is broken: this module is test
//! code, compiled only for tests and under the `contract` feature.

#![allow(clippy::disallowed_methods)] // the suite's deadlines are real time: backends are asynchronous

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Backend, BackendError, Launch, MemberLaunch, Observation, RunId, StopSignal};

/// How long the suite waits for something a backend must eventually report.
const DEADLINE: Duration = Duration::from_secs(10);
/// Settles after which a backend that has nothing more to say is taken to be quiet.
const QUIET_SETTLES: u32 = 10;

/// What a backend's tests supply so the suite can drive it.
pub trait Harness {
    type B: Backend;

    /// A fresh backend on the harness's state (state directory, simulated host). Called again
    /// after the suite dropped the previous one, it is the backend after a daemon restart.
    fn backend(&mut self) -> Self::B;

    /// The node name members are launched on.
    fn node(&self) -> String;

    /// The environment every launch of the suite carries, as the daemon's would (it sets
    /// `ALLOT_PROJECT` on every launch: a backend that places work by project reads it).
    fn launch_env(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    // The programs default to POSIX `sh` scripts, for backends that run real processes; a
    // simulated host overrides them.

    /// A program that runs `seconds` and exits 0.
    fn program_sleep(&self, seconds: u32) -> Vec<String> {
        vec!["sleep".to_string(), seconds.to_string()]
    }

    /// A program that exits at once with `code`.
    fn program_exit(&self, code: i32) -> Vec<String> {
        sh(&format!("exit {code}"), &[])
    }

    /// A program that creates `ready` once it handles the checkpoint signal, and on that signal
    /// creates `marker` and exits 0.
    fn program_trap_checkpoint(&self, ready: &Path, marker: &Path) -> Vec<String> {
        sh(
            "trap 'touch \"$1\"; exit 0' USR1; touch \"$0\"; while :; do sleep 0.1; done",
            &[ready, marker],
        )
    }

    /// A program that creates `ready` once it ignores the terminate signal, then runs until
    /// killed.
    fn program_ignore_terminate(&self, ready: &Path) -> Vec<String> {
        sh("trap '' TERM; touch \"$0\"; while :; do sleep 0.1; done", &[ready])
    }

    /// A program that does not exist.
    fn program_missing(&self) -> Vec<String> {
        vec!["allot-test-no-such-program".to_string()]
    }

    /// Let a little time pass (a few milliseconds, or one step of a simulated host).
    fn settle(&mut self);

    /// Let `seconds` pass while no backend is running (the daemon is down): real time, unless
    /// the harness simulates its host.
    fn pass_time(&mut self, seconds: u32) {
        std::thread::sleep(Duration::from_secs(u64::from(seconds)));
    }

    /// A directory for logs and marker files, alive as long as the harness.
    fn tmp_dir(&self) -> PathBuf;
}

/// One `#[test]` per named rule, in a module `contract_rules`, each on a fresh harness:
/// `contract_tests!(HARNESS_EXPR, ENABLED; rule, …)`, where `ENABLED` is called with the rule's
/// name and says whether to run it (a cluster that is not up skips the rule, saying so).
#[macro_export]
macro_rules! contract_tests {
    ($harness:expr, $enabled:expr; $($rule:ident),* $(,)?) => {
        mod contract_rules {
            $(
                #[test]
                fn $rule() {
                    #[allow(unused_imports)]
                    use super::*;
                    if ($enabled)(stringify!($rule)) {
                        $crate::contract::$rule(&mut $harness);
                    }
                }
            )*
        }
    };
}

/// `sh -c SCRIPT ARGS…`: the paths become `$0`, `$1`, ….
pub fn sh(script: &str, args: &[&Path]) -> Vec<String> {
    let mut argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    argv.extend(args.iter().map(|p| p.to_string_lossy().into_owned()));
    argv
}

/// Every rule with its name, in the order `run_all` runs them.
#[allow(clippy::type_complexity)]
pub fn rules<H: Harness>() -> Vec<(&'static str, fn(&mut H))> {
    vec![
        ("launch_reports_started_once", launch_reports_started_once::<H>),
        ("launch_twice_is_idempotent", launch_twice_is_idempotent::<H>),
        ("exit_code_is_reported", exit_code_is_reported::<H>),
        ("missing_program_fails_launch", missing_program_fails_launch::<H>),
        ("terminate_ends_sleeping_run", terminate_ends_sleeping_run::<H>),
        ("kill_ends_run_that_ignores_terminate", kill_ends_run_that_ignores_terminate::<H>),
        ("checkpoint_reaches_program", checkpoint_reaches_program::<H>),
        ("signal_after_exit_is_ok", signal_after_exit_is_ok::<H>),
        ("signal_unknown_run_is_an_error", signal_unknown_run_is_an_error::<H>),
        ("poll_reports_each_observation_once", poll_reports_each_observation_once::<H>),
        ("recover_after_restart", recover_after_restart::<H>),
        ("recover_reports_learned_exit_code", recover_reports_learned_exit_code::<H>),
        ("launch_after_restart_adopts", launch_after_restart_adopts::<H>),
    ]
}

/// Runs every rule on one harness.
pub fn run_all<H: Harness>(h: &mut H) {
    for (_, rule) in rules::<H>() {
        rule(h);
    }
}

/// Observations of one backend, kept in the order polled.
struct Seen {
    all: Vec<Observation>,
}

impl Seen {
    fn new() -> Self {
        Seen { all: Vec::new() }
    }

    fn of(&self, run: RunId) -> Vec<&Observation> {
        self.all.iter().filter(|o| o.run() == run).collect()
    }

    fn poll<B: Backend>(&mut self, backend: &mut B) {
        let observations = backend.poll().unwrap_or_else(|e| panic!("poll failed: {e}"));
        self.all.extend(observations);
    }

    /// Polls until `done` holds, settling in between; panics after the deadline.
    fn wait<H: Harness>(
        &mut self,
        h: &mut H,
        backend: &mut H::B,
        what: &str,
        done: impl Fn(&Seen) -> bool,
    ) {
        let start = Instant::now();
        loop {
            self.poll(backend);
            if done(self) {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "waited {DEADLINE:?} for {what}; observed {:#?}",
                self.all
            );
            h.settle();
        }
    }

    /// Polls a few more times so that anything a backend would still report shows up.
    fn quiet<H: Harness>(&mut self, h: &mut H, backend: &mut H::B) {
        for _ in 0..QUIET_SETTLES {
            h.settle();
            self.poll(backend);
        }
    }

    fn started(&self, run: RunId) -> bool {
        self.of(run).iter().any(|o| matches!(o, Observation::Started { .. }))
    }

    fn ended(&self, run: RunId) -> bool {
        self.of(run)
            .iter()
            .any(|o| matches!(o, Observation::Exited { .. } | Observation::LaunchFailed { .. }))
    }

    /// Every observation names one of `runs`: a backend never invents a run.
    fn only_runs(&self, runs: &[RunId]) {
        for o in &self.all {
            assert!(runs.contains(&o.run()), "observation of a run never launched: {o:?}");
        }
    }

    /// The run was observed exactly as Started, then Exited with `code`; returns the detail.
    fn started_then_exited(&self, run: RunId, code: Option<i32>) -> String {
        let of = self.of(run);
        match of.as_slice() {
            [Observation::Started { .. }, Observation::Exited { code: c, detail, .. }]
                if *c == code =>
            {
                detail.clone()
            }
            _ => panic!("{run}: expected Started then Exited with code {code:?}; observed {of:#?}"),
        }
    }
}

fn run_id(workload: u64) -> RunId {
    RunId { workload, attempt: 1 }
}

fn launch_of<H: Harness>(h: &H, run: RunId, command: Vec<String>) -> Launch {
    Launch {
        run,
        command,
        env: h.launch_env(),
        members: vec![MemberLaunch { node: h.node(), devices: Vec::new() }],
        log_dir: h.tmp_dir().join(format!("logs-{run}")),
        adopt: None,
        resources: Default::default(),
    }
}

fn launch<B: Backend>(backend: &mut B, launch: &Launch) {
    backend.launch(launch).unwrap_or_else(|e| panic!("{}: launch failed: {e}", launch.run));
}

fn signal<B: Backend>(backend: &mut B, run: RunId, signal: StopSignal) {
    backend.signal(run, signal).unwrap_or_else(|e| panic!("{run}: {signal:?} failed: {e}"));
}

fn wait_for_file<H: Harness>(h: &mut H, path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < DEADLINE, "waited {DEADLINE:?} for {}", path.display());
        h.settle();
    }
}

/// Terminates a run a rule no longer needs and waits for its end.
fn stop<H: Harness>(h: &mut H, backend: &mut H::B, seen: &mut Seen, run: RunId) {
    signal(backend, run, StopSignal::Kill);
    seen.wait(h, backend, &format!("{run} to end after Kill"), |s| s.ended(run));
}

/// A launch is reported `Started` exactly once.
pub fn launch_reports_started_once<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(100);
    launch(&mut backend, &launch_of(h, run, h.program_sleep(30)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started", |s| s.started(run));
    seen.quiet(h, &mut backend);
    let of = seen.of(run);
    assert!(
        matches!(of.as_slice(), [Observation::Started { pids, .. }] if pids.len() <= 1),
        "{run}: expected one Started (with at most one pid for one member); observed {of:#?}"
    );
    seen.only_runs(&[run]);
    stop(h, &mut backend, &mut seen, run);
}

/// Launching a run again, before and after it started, starts nothing more.
pub fn launch_twice_is_idempotent<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(200);
    let l = launch_of(h, run, h.program_sleep(30));
    launch(&mut backend, &l);
    launch(&mut backend, &l);
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started", |s| s.started(run));
    launch(&mut backend, &l);
    seen.quiet(h, &mut backend);
    let of = seen.of(run);
    assert!(
        matches!(of.as_slice(), [Observation::Started { .. }]),
        "{run}: launched three times, expected one Started; observed {of:#?}"
    );
    stop(h, &mut backend, &mut seen, run);
    let starts = seen.of(run).iter().filter(|o| matches!(o, Observation::Started { .. })).count();
    assert_eq!(starts, 1, "{run}: observed {:#?}", seen.all);
}

/// The exit code of a program is reported (0 and non-zero).
pub fn exit_code_is_reported<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let failing = run_id(300);
    let succeeding = run_id(301);
    launch(&mut backend, &launch_of(h, failing, h.program_exit(3)));
    launch(&mut backend, &launch_of(h, succeeding, h.program_exit(0)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "both runs to exit", |s| s.ended(failing) && s.ended(succeeding));
    seen.quiet(h, &mut backend);
    seen.started_then_exited(failing, Some(3));
    seen.started_then_exited(succeeding, Some(0));
    seen.only_runs(&[failing, succeeding]);
}

/// A program that does not exist fails the launch and is never reported started.
pub fn missing_program_fails_launch<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(400);
    launch(&mut backend, &launch_of(h, run, h.program_missing()));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "LaunchFailed", |s| s.ended(run));
    seen.quiet(h, &mut backend);
    let of = seen.of(run);
    assert!(
        matches!(of.as_slice(), [Observation::LaunchFailed { error, .. }] if !error.is_empty()),
        "{run}: expected only LaunchFailed with an error; observed {of:#?}"
    );
    // Signalling a run that failed to launch is signalling a run that ended.
    signal(&mut backend, run, StopSignal::Terminate);
}

/// Terminate ends a sleeping run; its code is None (it ended by a signal).
pub fn terminate_ends_sleeping_run<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(500);
    launch(&mut backend, &launch_of(h, run, h.program_sleep(30)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started", |s| s.started(run));
    signal(&mut backend, run, StopSignal::Terminate);
    seen.wait(h, &mut backend, "Exited after Terminate", |s| s.ended(run));
    seen.quiet(h, &mut backend);
    seen.started_then_exited(run, None);
}

/// A run that ignores Terminate keeps running; Kill ends it.
pub fn kill_ends_run_that_ignores_terminate<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(600);
    let ready = h.tmp_dir().join(format!("ready-{run}"));
    launch(&mut backend, &launch_of(h, run, h.program_ignore_terminate(&ready)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started", |s| s.started(run));
    wait_for_file(h, &ready);
    signal(&mut backend, run, StopSignal::Terminate);
    seen.quiet(h, &mut backend);
    assert!(!seen.ended(run), "{run} ignores Terminate but was reported ended: {:#?}", seen.all);
    signal(&mut backend, run, StopSignal::Kill);
    seen.wait(h, &mut backend, "Exited after Kill", |s| s.ended(run));
    seen.started_then_exited(run, None);
}

/// The checkpoint signal reaches the program, and does not by itself end it: the program that
/// traps it exits on its own, with code 0.
pub fn checkpoint_reaches_program<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(700);
    let ready = h.tmp_dir().join(format!("ready-{run}"));
    let marker = h.tmp_dir().join(format!("checkpointed-{run}"));
    launch(&mut backend, &launch_of(h, run, h.program_trap_checkpoint(&ready, &marker)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started", |s| s.started(run));
    wait_for_file(h, &ready);
    assert!(!marker.exists(), "{}: marker before any checkpoint signal", marker.display());
    signal(&mut backend, run, StopSignal::Checkpoint);
    seen.wait(h, &mut backend, "Exited after Checkpoint", |s| s.ended(run));
    assert!(marker.exists(), "{run}: the program exited but never saw the checkpoint signal");
    seen.started_then_exited(run, Some(0));
}

/// Signalling a run that already ended does nothing and is not an error.
pub fn signal_after_exit_is_ok<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(800);
    launch(&mut backend, &launch_of(h, run, h.program_exit(0)));
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Exited", |s| s.ended(run));
    for s in [StopSignal::Checkpoint, StopSignal::Terminate, StopSignal::Kill] {
        signal(&mut backend, run, s);
    }
    seen.quiet(h, &mut backend);
    seen.started_then_exited(run, Some(0));
}

/// Signalling a run the backend never saw is an `UnknownRun` error, and invents nothing.
pub fn signal_unknown_run_is_an_error<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let run = run_id(900);
    match backend.signal(run, StopSignal::Terminate) {
        Err(BackendError::UnknownRun { run: r }) if r == run => {}
        other => panic!("{run}: signal of a run never launched returned {other:?}"),
    }
    let mut seen = Seen::new();
    seen.quiet(h, &mut backend);
    seen.only_runs(&[]);
}

/// Each observation is reported once, across many polls, for several runs at once.
pub fn poll_reports_each_observation_once<H: Harness>(h: &mut H) {
    let mut backend = h.backend();
    let runs: Vec<RunId> = (1000..1004).map(run_id).collect();
    for (i, run) in runs.iter().enumerate() {
        let code = i32::try_from(i).unwrap_or(0);
        launch(&mut backend, &launch_of(h, *run, h.program_exit(code)));
    }
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "every run to exit", |s| runs.iter().all(|r| s.ended(*r)));
    seen.quiet(h, &mut backend);
    for (i, run) in runs.iter().enumerate() {
        seen.started_then_exited(*run, Some(i32::try_from(i).unwrap_or(0)));
    }
    seen.only_runs(&runs);
}

/// After a restart: a still-running run is re-adopted (Started, later Exited when terminated); a
/// run that ended while the daemon was down is Exited with code None and an "unknown" detail; a
/// run never launched is LaunchFailed; a run the daemon does not name is never reported.
pub fn recover_after_restart<H: Harness>(h: &mut H) {
    let still_running = run_id(1100);
    let ends_while_down = run_id(1101);
    let never_launched = run_id(1102);
    let not_named = run_id(1103);
    let running_launch = launch_of(h, still_running, h.program_sleep(30));
    let ending_launch = launch_of(h, ends_while_down, h.program_sleep(1));
    let never_launch = launch_of(h, never_launched, h.program_sleep(30));
    let not_named_launch = launch_of(h, not_named, h.program_sleep(3));
    let first_pids;
    {
        let mut backend = h.backend();
        launch(&mut backend, &running_launch);
        launch(&mut backend, &ending_launch);
        launch(&mut backend, &not_named_launch);
        let mut seen = Seen::new();
        seen.wait(h, &mut backend, "three runs Started", |s| {
            s.started(still_running) && s.started(ends_while_down) && s.started(not_named)
        });
        assert!(!seen.ended(ends_while_down), "{ends_while_down} ended too soon: {:#?}", seen.all);
        first_pids = pids_of(&seen, still_running);
    }
    // The daemon is down; the short run ends meanwhile.
    h.pass_time(2);
    let mut backend = h.backend();
    let recovered = backend
        .recover(&[running_launch, ending_launch, never_launch])
        .unwrap_or_else(|e| panic!("recover failed: {e}"));
    let mut seen = Seen { all: recovered };
    assert_eq!(seen.all.len(), 3, "one observation per run named; got {:#?}", seen.all);
    let of = seen.of(still_running);
    assert!(
        matches!(of.as_slice(), [Observation::Started { pids, .. }] if *pids == first_pids),
        "{still_running}: expected re-adoption with pids {first_pids:?}; observed {of:#?}"
    );
    let of = seen.of(ends_while_down);
    assert!(
        matches!(of.as_slice(), [Observation::Exited { code: None, detail, .. }]
            if detail.contains("unknown")),
        "{ends_while_down}: expected Exited, code None, status unknown; observed {of:#?}"
    );
    let of = seen.of(never_launched);
    assert!(
        matches!(of.as_slice(), [Observation::LaunchFailed { .. }]),
        "{never_launched}: expected LaunchFailed; observed {of:#?}"
    );
    seen.quiet(h, &mut backend);
    assert_eq!(seen.all.len(), 3, "nothing new before a signal; observed {:#?}", seen.all);
    signal(&mut backend, still_running, StopSignal::Terminate);
    seen.wait(h, &mut backend, "the re-adopted run to end", |s| s.of(still_running).len() == 2);
    let of = seen.of(still_running);
    assert!(
        matches!(of.as_slice(), [_, Observation::Exited { code: None, .. }]),
        "{still_running}: expected Exited with code None after Terminate; observed {of:#?}"
    );
    seen.quiet(h, &mut backend);
    seen.only_runs(&[still_running, ends_while_down, never_launched]);
    assert_eq!(seen.all.len(), 4, "each observation once; observed {:#?}", seen.all);
}

/// An exit code the backend learned before a restart survives it.
pub fn recover_reports_learned_exit_code<H: Harness>(h: &mut H) {
    let run = run_id(1200);
    let l = launch_of(h, run, h.program_exit(4));
    {
        let mut backend = h.backend();
        launch(&mut backend, &l);
        let mut seen = Seen::new();
        seen.wait(h, &mut backend, "Exited", |s| s.ended(run));
        seen.started_then_exited(run, Some(4));
    }
    let mut backend = h.backend();
    let recovered = backend.recover(&[l]).unwrap_or_else(|e| panic!("recover failed: {e}"));
    assert!(
        matches!(recovered.as_slice(), [Observation::Exited { code: Some(4), .. }]),
        "{run}: expected the learned code 4 after restart; got {recovered:#?}"
    );
    let mut seen = Seen::new();
    seen.quiet(h, &mut backend);
    seen.only_runs(&[]);
}

/// After a restart, launching a run that is still running adopts it: no second process.
pub fn launch_after_restart_adopts<H: Harness>(h: &mut H) {
    let run = run_id(1300);
    let l = launch_of(h, run, h.program_sleep(30));
    let first_pids;
    {
        let mut backend = h.backend();
        launch(&mut backend, &l);
        let mut seen = Seen::new();
        seen.wait(h, &mut backend, "Started", |s| s.started(run));
        first_pids = pids_of(&seen, run);
    }
    let mut backend = h.backend();
    launch(&mut backend, &l);
    let mut seen = Seen::new();
    seen.wait(h, &mut backend, "Started after restart", |s| s.started(run));
    seen.quiet(h, &mut backend);
    let of = seen.of(run);
    assert!(
        matches!(of.as_slice(), [Observation::Started { pids, .. }] if *pids == first_pids),
        "{run}: expected the running run adopted with pids {first_pids:?}; observed {of:#?}"
    );
    stop(h, &mut backend, &mut seen, run);
}

fn pids_of(seen: &Seen, run: RunId) -> Vec<u32> {
    seen.of(run)
        .iter()
        .find_map(|o| match o {
            Observation::Started { pids, .. } => Some(pids.clone()),
            _ => None,
        })
        .unwrap_or_default()
}
