//! The backend contract suite and the Slurm-only behaviour (requeue, foreign jobs, inventory)
//! against a real cluster: `scripts/slurm-cluster.sh up`, then `ALLOT_SLURM=1 cargo test -p
//! allot-backend-slurm --test cluster`. Without `ALLOT_SLURM=1` every test prints a note and
//! passes without touching Slurm. `SLURM_CONF` (or `ALLOT_SLURM_DIR`) names the cluster.

#![allow(clippy::disallowed_methods)] // deadlines for a real cluster

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use allot_backend::contract::{self, Harness, sh};
use allot_backend::{
    Backend, DeviceAssignment, ForeignWork, Launch, MemberLaunch, Observation, RunId, StopSignal,
    Vendor,
};
use allot_backend_slurm::{SlurmBackend, SlurmConfig};

static HARNESSES: AtomicU32 = AtomicU32::new(0);

/// Whether the cluster tests run; prints why not otherwise.
#[allow(clippy::print_stderr)]
fn enabled(test: &str) -> bool {
    let on = std::env::var("ALLOT_SLURM").is_ok_and(|v| v == "1");
    if !on {
        eprintln!(
            "{test}: skipped, no Slurm cluster: run `scripts/slurm-cluster.sh up` and set \
             ALLOT_SLURM=1"
        );
    }
    on
}

fn slurm_conf() -> PathBuf {
    std::env::var_os("SLURM_CONF").map(PathBuf::from).unwrap_or_else(|| {
        let dir = std::env::var("ALLOT_SLURM_DIR").unwrap_or_else(|_| "/tmp/allot-slurm".into());
        Path::new(&dir).join("etc/slurm.conf")
    })
}

/// A config on the test cluster with a job prefix of its own (`allott<pid>x<n>`), so jobs of
/// earlier test runs still in squeue are never taken for this run's.
fn config(prefix: &str) -> SlurmConfig {
    let mut config = SlurmConfig::new();
    config.runner.slurm_conf = Some(slurm_conf());
    config.job_prefix = prefix.to_string();
    config.poll_min = Duration::from_millis(100);
    config.poll_max = Duration::from_millis(400);
    config.default_account = Some("research".to_string());
    config.unmanaged_partitions.insert("unmanaged".to_string());
    config
}

struct SlurmHarness {
    dir: tempfile::TempDir,
    prefix: String,
    node: String,
}

impl SlurmHarness {
    fn new() -> Self {
        let n = HARNESSES.fetch_add(1, Ordering::SeqCst);
        SlurmHarness {
            dir: tempfile::tempdir().expect("temp dir for the slurm harness"),
            prefix: format!("allott{}x{n}", std::process::id()),
            // Rules run in parallel: spread them over the four nodes (8 CPUs each).
            node: format!("node{}", n % 4 + 1),
        }
    }
}

impl Harness for SlurmHarness {
    type B = SlurmBackend;

    fn backend(&mut self) -> SlurmBackend {
        SlurmBackend::new(config(&self.prefix))
    }
    fn node(&self) -> String {
        self.node.clone()
    }
    fn settle(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
    }
    fn tmp_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

allot_backend::contract_tests!(SlurmHarness::new(), enabled;
    launch_reports_started_once,
    launch_twice_is_idempotent,
    exit_code_is_reported,
    missing_program_fails_launch,
    terminate_ends_sleeping_run,
    kill_ends_run_that_ignores_terminate,
    checkpoint_reaches_program,
    signal_after_exit_is_ok,
    signal_unknown_run_is_an_error,
    poll_reports_each_observation_once,
    // recover_after_restart: replaced by `recover_after_restart_with_slurms_exit_codes` below.
    recover_reports_learned_exit_code,
    launch_after_restart_adopts,
);

#[test]
fn every_contract_rule_has_a_test() {
    // 12 rules above plus `recover_after_restart`'s Slurm variant; fails when a rule is added.
    let rules = contract::rules::<SlurmHarness>();
    assert_eq!(rules.len(), 13);
    assert!(rules.iter().any(|(name, _)| *name == "recover_after_restart"));
}

/// The contract's `recover_after_restart`, except for one run: a run that ended while the
/// daemon was down is reported with the exit code Slurm kept (squeue holds finished jobs for
/// MinJobAge), not with `None` and "unknown" as a backend that cannot learn it must. Everything
/// else is the rule: the running run re-adopted (same pids: none), the never-launched run
/// LaunchFailed, the run the daemon does not name never reported, each observation once.
#[test]
fn recover_after_restart_with_slurms_exit_codes() {
    if !enabled("recover_after_restart_with_slurms_exit_codes") {
        return;
    }
    let mut h = SlurmHarness::new();
    let run = |w| RunId { workload: w, attempt: 1 };
    let (still_running, ends_while_down, never_launched, not_named) =
        (run(1100), run(1101), run(1102), run(1103));
    let launch_of = |h: &SlurmHarness, run: RunId, command: Vec<String>| Launch {
        run,
        command,
        env: BTreeMap::new(),
        members: vec![MemberLaunch { node: h.node(), devices: Vec::new() }],
        log_dir: h.tmp_dir().join(format!("logs-{run}")),
        adopt: None,
        resources: Default::default(),
    };
    let running = launch_of(&h, still_running, h.program_sleep(30));
    let ending = launch_of(&h, ends_while_down, h.program_sleep(1));
    let never = launch_of(&h, never_launched, h.program_sleep(30));
    let unnamed = launch_of(&h, not_named, h.program_sleep(3));
    {
        let mut backend = h.backend();
        for l in [&running, &ending, &unnamed] {
            backend.launch(l).expect("launch");
        }
        let mut seen = Vec::new();
        until(&mut backend, &mut seen, Duration::from_secs(10), "three Started", |s| {
            started(s, still_running) && started(s, ends_while_down) && started(s, not_named)
        });
        assert!(!ended(&seen, ends_while_down), "{seen:#?}");
    }
    h.pass_time(2);
    let mut backend = h.backend();
    let mut seen = backend.recover(&[running, ending, never]).expect("recover");
    assert!(
        matches!(seen.as_slice(), [
            Observation::Started { run: a, pids },
            Observation::Exited { run: b, code: Some(0), detail },
            Observation::LaunchFailed { run: c, .. },
        ] if *a == still_running && pids.is_empty() && *b == ends_while_down
            && detail.contains("COMPLETED") && *c == never_launched),
        "{seen:#?}"
    );
    for _ in 0..10 {
        h.settle();
        seen.extend(backend.poll().expect("poll"));
    }
    assert_eq!(seen.len(), 3, "nothing new before a signal: {seen:#?}");
    backend.signal(still_running, StopSignal::Terminate).expect("terminate");
    until(&mut backend, &mut seen, Duration::from_secs(10), "the re-adopted run to end", |s| {
        s.len() == 4
    });
    assert!(
        matches!(&seen[3], Observation::Exited { run, code: None, .. } if *run == still_running),
        "{seen:#?}"
    );
    for _ in 0..10 {
        h.settle();
        seen.extend(backend.poll().expect("poll"));
    }
    assert_eq!(seen.len(), 4, "each observation once, none for {not_named}: {seen:#?}");
}

/// Polls until `done` holds for what was observed; panics after `limit`.
fn until(
    backend: &mut SlurmBackend,
    seen: &mut Vec<Observation>,
    limit: Duration,
    what: &str,
    done: impl Fn(&[Observation]) -> bool,
) {
    let start = Instant::now();
    loop {
        seen.extend(backend.poll().expect("poll"));
        if done(seen) {
            return;
        }
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}; observed {seen:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn started(seen: &[Observation], run: RunId) -> bool {
    seen.iter().any(|o| matches!(o, Observation::Started { run: r, .. } if *r == run))
}

fn ended(seen: &[Observation], run: RunId) -> bool {
    seen.iter().any(|o| o.run() == run && !matches!(o, Observation::Started { .. }))
}

fn gpu(index: u32) -> DeviceAssignment {
    DeviceAssignment { index, uuid: None, vendor: Vendor::Nvidia, shares: 1000 }
}

/// Serializes the tests that submit foreign jobs or call `watch_cluster` (which holds every
/// pending foreign job it sees, another test's too) or drain a node.
static CLUSTER_WIDE: Mutex<()> = Mutex::new(());

fn cluster_wide() -> std::sync::MutexGuard<'static, ()> {
    CLUSTER_WIDE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A Slurm client command on the test cluster; panics with its stderr if it fails.
fn slurm(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .env("SLURM_CONF", slurm_conf())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `sbatch` as a user would (no allot name): the job id.
fn sbatch_foreign(args: &[&str]) -> String {
    let mut all = vec!["--parsable", "-A", "nlp", "-o", "/dev/null"];
    all.extend_from_slice(args);
    slurm("sbatch", &all)
}

/// `squeue -j <id> -o <format>` of one job (`%T` state, `%r` reason, `%N` nodes).
fn squeue_of(job: &str, format: &str) -> String {
    slurm("squeue", &["-h", "-j", job, "-o", format])
}

fn restarts_of(job: &str) -> String {
    let show = slurm("scontrol", &["show", "job", job]);
    show.split_whitespace()
        .find_map(|f| f.strip_prefix("Restarts="))
        .unwrap_or_default()
        .to_string()
}

/// Waits until `squeue -j job -o format` prints `want`.
fn wait_squeue(job: &str, format: &str, want: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let got = squeue_of(job, format);
        if got == want {
            return;
        }
        assert!(start.elapsed() < limit, "job {job}: {format} is {got:?}, waited for {want:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn foreign_of(backend: &mut SlurmBackend, job: &str) -> Option<ForeignWork> {
    let news = backend.watch_cluster().expect("watch_cluster");
    news.foreign.into_iter().find(|w| w.handle == job)
}

/// One member on `node` with `gpus` GPUs.
fn member(node: &str, gpus: u32) -> MemberLaunch {
    MemberLaunch { node: node.into(), devices: (0..gpus).map(gpu).collect() }
}

/// A launch of `command` as `run` on one GPU of the harness's node.
fn one_gpu_launch(h: &SlurmHarness, run: RunId, command: Vec<String>) -> Launch {
    Launch {
        run,
        command,
        env: BTreeMap::new(),
        members: vec![member(&h.node(), 1)],
        log_dir: h.tmp_dir().join("logs"),
        adopt: None,
        resources: Default::default(),
    }
}

fn adopt_launch(h: &SlurmHarness, run: RunId, job: &str, members: Vec<MemberLaunch>) -> Launch {
    Launch {
        run,
        command: vec!["(foreign job)".to_string()],
        env: BTreeMap::new(),
        members,
        log_dir: h.tmp_dir().join(format!("logs-{run}")),
        adopt: Some(job.to_string()),
        resources: Default::default(),
    }
}

#[test]
fn requeue_runs_the_same_job_again_on_the_next_launchs_nodes() {
    if !enabled("requeue_runs_the_same_job_again_on_the_next_launchs_nodes") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let first = RunId { workload: 1, attempt: 1 };
    let next = RunId { workload: 1, attempt: 2 };
    let launch = Launch {
        run: first,
        command: h.program_sleep(120),
        env: BTreeMap::new(),
        members: vec![member("node2", 2)],
        log_dir: h.tmp_dir().join("logs"),
        adopt: None,
        resources: Default::default(),
    };
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(15), "Started", |s| started(s, first));
    let job = backend.job_id(first).expect("job id of a launched run");
    let gpus = backend.allocated_gpus(first).expect("squeue").expect("a running run has GPUs");
    assert!(
        matches!(gpus.as_slice(), [(node, g)] if node == "node2" && g.indices.len() == 2),
        "{gpus:?}"
    );
    assert!(Backend::requeue(&mut backend, first, next).expect("requeue"), "Slurm requeues");
    assert_eq!(backend.job_id(next), Some(job), "the next attempt is the same Slurm job");
    // A daemon restarted now learns that the first attempt was requeued (the job is renamed).
    let recovered = SlurmBackend::new(config(&h.prefix))
        .recover(std::slice::from_ref(&launch))
        .expect("recover");
    assert!(
        matches!(recovered.as_slice(), [Observation::Exited { run, code: None, detail }]
            if *run == first && detail.contains("requeued by allot as 1.2")),
        "{recovered:#?}"
    );
    until(&mut backend, &mut seen, Duration::from_secs(15), "the first attempt to end", |s| {
        ended(s, first)
    });
    let id = job.to_string();
    // Requeued held: Slurm does not start it again by itself (sched_interval is 5 s).
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(squeue_of(&id, "%T"), "PENDING");
    assert!(!started(&seen[1..], next), "{seen:#?}");
    let requeued_at = Instant::now();
    let next_logs = h.tmp_dir().join("logs-2");
    backend
        .launch(&Launch {
            run: next,
            members: vec![member("node1", 3)],
            log_dir: next_logs.clone(),
            ..launch.clone()
        })
        .expect("launch of the next attempt");
    // Running again as the same job once cred_expire (10 s) has passed.
    until(&mut backend, &mut seen, Duration::from_secs(40), "the next attempt to start", |s| {
        started(s, next)
    });
    let restart = requeued_at.elapsed();
    assert!(
        matches!(seen.as_slice(), [
            Observation::Started { run: a, .. },
            Observation::Exited { run: b, code: None, detail },
            Observation::Started { run: c, .. },
        ] if *a == first && *b == first && detail.contains("requeued") && *c == next),
        "observed {seen:#?}"
    );
    assert_eq!(squeue_of(&id, "%N %b"), "node1 gres:gpu:h100:3");
    assert_eq!(restarts_of(&id), "1");
    // The next attempt writes to its own log; the first attempt's is left as it was.
    let shown = slurm("scontrol", &["show", "job", &id]);
    let next_log = next_logs.join("member-0.log");
    assert!(
        shown.contains(&format!("StdOut={}", next_log.display())),
        "the requeued job's output moved to the next attempt's log: {shown}"
    );
    assert!(next_log.exists(), "{} written by the next attempt", next_log.display());
    assert!(h.tmp_dir().join("logs/member-0.log").exists(), "the first attempt's log kept");
    // Launching the next attempt again starts nothing more.
    backend.launch(&Launch { run: next, ..launch.clone() }).expect("idempotent launch");
    assert_eq!(backend.job_id(next), Some(job));
    backend.signal(next, StopSignal::Kill).expect("kill");
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, next));
    #[allow(clippy::print_stderr)]
    {
        eprintln!("requeue: job {job} ran again {restart:.1?} after launch of the next attempt");
    }
}

#[test]
fn plain_sbatch_job_is_foreign_and_held() {
    if !enabled("plain_sbatch_job_is_foreign_and_held") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    // Eligible in 2 s: pending until then, so the gate holds it before Slurm could start it.
    let name = format!("plain{}", std::process::id());
    let job =
        sbatch_foreign(&["-J", &name, "--begin=now+2", "--gres=gpu:h100:2", "--wrap", "sleep 60"]);
    let work = foreign_of(&mut backend, &job).expect("the job is foreign work");
    assert_eq!(
        (work.name.as_str(), work.project.as_str(), work.user.as_str()),
        (name.as_str(), "nlp", "root")
    );
    assert_eq!(
        (work.nodes, work.gpus_per_node, work.models.first().map(String::as_str)),
        (1, 2, Some("h100"))
    );
    assert!(work.running.is_empty() && work.started_ms.is_none(), "{work:?}");
    let reason = squeue_of(&job, "%r");
    assert!(reason.starts_with("JobHeld"), "held by the gate: {reason}");
    // Past its begin time and a scheduling cycle: still pending, still reported.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(squeue_of(&job, "%T"), "PENDING");
    assert!(foreign_of(&mut backend, &job).is_some_and(|w| w.running.is_empty()));
    // A job its user held stays held and is reported too.
    let user_held = sbatch_foreign(&["-J", &name, "--hold", "--wrap", "sleep 60"]);
    let news = backend.watch_cluster().expect("watch_cluster");
    assert!(news.foreign.iter().any(|w| w.handle == user_held && w.gpus_per_node == 0));
    assert_eq!(squeue_of(&user_held, "%T %r"), "PENDING JobHeldUser");
    slurm("scancel", &[&job, &user_held]);
}

/// `cmd` run as the test cluster's unprivileged `allot-user` (from /tmp, which it can reach):
/// whether it succeeded, and its stdout and stderr.
fn as_user(cmd: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("runuser")
        .env("SLURM_CONF", slurm_conf())
        .current_dir("/tmp")
        .args(["-u", "allot-user", "--"])
        .args(cmd)
        .output()
        .expect("runuser");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text.trim().to_string())
}

/// The submit-time gate (job_submit.lua, on the test cluster's partition `gated`): a job is
/// held the moment Slurm accepts it, before any watch (no allot runs here at all); its user
/// can neither release it nor move it out; allot imports it, says why it waits in its admin
/// comment, and starts it where it chose. Jobs of other partitions are not touched.
#[test]
fn the_submit_time_gate_holds_every_job_before_allot_sees_it() {
    if !enabled("the_submit_time_gate_holds_every_job_before_allot_sees_it") {
        return;
    }
    let _cluster = cluster_wide();
    // Its jobs are cancelled however it ends: left held, they would be imported by the next
    // test's daemon.
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::process::Command::new("scancel")
                .env("SLURM_CONF", slurm_conf())
                .args(["--name", "gate-test"])
                .status();
        }
    }
    let _cleanup = Cleanup;
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let gate = allot_backend::Backend::gate(&mut backend).expect("slurm says its gate");
    assert!(gate.starts_with("submit-time: a job_submit/lua plugin"), "{gate}");
    let held = |job: &str| {
        let state = squeue_of(job, "%T %r");
        assert!(
            state == "PENDING JobHeldUser" || state == "PENDING JobHeldAdmin",
            "{job}: {state}"
        );
        let show = slurm("scontrol", &["show", "job", job]);
        assert!(show.contains("AdminComment=allot-gate: held at submission"), "{show}");
    };
    let by_root = sbatch_foreign(&[
        "-J",
        "gate-test",
        "-p",
        "gated",
        "--gres=gpu:h100:1",
        "--wrap",
        "sleep 60",
    ]);
    held(&by_root);
    let (ok, by_user) = as_user(&[
        "sbatch",
        "--parsable",
        "-J",
        "gate-test",
        "-A",
        "nlp",
        "-o",
        "/dev/null",
        "-p",
        "gated",
        "--wrap",
        "sleep 60",
    ]);
    assert!(ok, "{by_user}");
    held(&by_user);
    let (released, said) = as_user(&["scontrol", "release", &by_user]);
    assert!(!released, "the user released a gated job: {said}");
    let (moved, said) =
        as_user(&["scontrol", "update", &format!("jobid={by_user}"), "partition=batch"]);
    assert!(!moved, "the user moved a gated job out: {said}");
    held(&by_user);
    // A job moved into the gated partition is held on entry, as if submitted there.
    let (ok, later) = as_user(&[
        "sbatch",
        "--parsable",
        "-J",
        "gate-test",
        "-A",
        "nlp",
        "-o",
        "/dev/null",
        "-p",
        "batch",
        "--begin=now+1hour",
        "--wrap",
        "sleep 60",
    ]);
    assert!(ok, "{later}");
    let (ok, said) = as_user(&["scontrol", "update", &format!("jobid={later}"), "partition=gated"]);
    assert!(ok, "{said}");
    assert_eq!(squeue_of(&later, "%T %r %P"), "PENDING JobHeldUser gated");
    slurm("scancel", &[&later]);
    // The user may still hold it (and cancel it).
    let (ok, said) = as_user(&["scontrol", "hold", &by_user]);
    assert!(ok, "{said}");
    let (ok, said) = as_user(&["scancel", &by_user]);
    assert!(ok, "{said}");
    // Another partition's job runs without allot.
    let free = sbatch_foreign(&["-J", "gate-test", "-p", "batch", "--wrap", "sleep 60"]);
    wait_squeue(&free, "%T", "RUNNING", Duration::from_secs(20));
    slurm("scancel", &[&free]);
    // allot imports the held job and starts it on the node it chose.
    let work = foreign_of(&mut backend, &by_root).expect("the gated job is foreign work");
    assert!(work.running.is_empty() && work.refusal.is_none(), "{work:?}");
    // While it waits, allot's reason is its admin comment, for Slurm's own tools.
    let why = "1 GPU of H100 | vision is at its quota".to_string();
    let waiting = allot_backend::Waiting::Foreign(by_root.clone());
    allot_backend::Backend::explain_waiting(&mut backend, &[(waiting, why)]).expect("explain");
    let admin_comment = |job: &str| {
        let show = slurm("scontrol", &["show", "job", job]);
        let line = show.lines().find_map(|l| l.trim().strip_prefix("AdminComment="));
        line.unwrap_or_default().to_string()
    };
    assert_eq!(admin_comment(&by_root), "allot: waiting: 1 GPU of H100   vision is at its quota");
    let run = RunId { workload: 60, attempt: 1 };
    backend.launch(&adopt_launch(&h, run, &by_root, vec![member("node4", 1)])).expect("adopt");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "Started", |s| started(s, run));
    assert_eq!(squeue_of(&by_root, "%T %N"), "RUNNING node4");
    assert_eq!(admin_comment(&by_root), "allot: admitted; released to run");
    backend.signal(run, StopSignal::Kill).expect("kill");
    until(&mut backend, &mut seen, Duration::from_secs(20), "the end", |s| ended(s, run));
}

#[test]
fn cancel_foreign_cancels_a_held_foreign_job() {
    if !enabled("cancel_foreign_cancels_a_held_foreign_job") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let name = format!("cancelme{}", std::process::id());
    let job =
        sbatch_foreign(&["-J", &name, "--begin=now+2", "--gres=gpu:h100:1", "--wrap", "sleep 60"]);
    assert!(foreign_of(&mut backend, &job).is_some(), "held foreign work first");
    assert!(backend.cancel_foreign(&job).expect("cancel_foreign"));
    // A job cancelled before it ran may leave squeue at once: gone or CANCELLED both do.
    let start = Instant::now();
    while !matches!(squeue_of(&job, "%T").as_str(), "" | "CANCELLED") {
        assert!(start.elapsed() < Duration::from_secs(20), "job {job} not cancelled");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(foreign_of(&mut backend, &job).is_none(), "no longer foreign work");
    assert!(!backend.cancel_foreign("not-a-job").expect("a bad handle is no error"));
}

#[test]
fn adopt_launch_of_a_held_foreign_job_starts_it_on_the_chosen_nodes() {
    if !enabled("adopt_launch_of_a_held_foreign_job_starts_it_on_the_chosen_nodes") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let job =
        sbatch_foreign(&["-J", "heldwork", "--hold", "--gres=gpu:h100:1", "--wrap", "sleep 60"]);
    let work = foreign_of(&mut backend, &job).expect("foreign work");
    assert!(work.running.is_empty());
    let run = RunId { workload: 20, attempt: 1 };
    // It asked for one node and one GPU; allot gives it two nodes with two GPUs each.
    let members = vec![member("node2", 2), member("node3", 2)];
    backend.launch(&adopt_launch(&h, run, &job, members)).expect("adopt");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(15), "Started", |s| started(s, run));
    assert_eq!(squeue_of(&job, "%T %N %b"), "RUNNING node[2-3] gres:gpu:h100:2");
    assert!(foreign_of(&mut backend, &job).is_none(), "taken over: allot's now");
    backend.signal(run, StopSignal::Kill).expect("kill");
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, run));
    // A job that is gone fails the launch, naming it.
    let gone = RunId { workload: 21, attempt: 1 };
    backend.launch(&adopt_launch(&h, gone, "999999999", vec![member("node3", 1)])).expect("adopt");
    let seen = backend.poll().expect("poll");
    assert!(
        matches!(seen.as_slice(), [Observation::LaunchFailed { run, error }]
            if *run == gone && error.contains("999999999")),
        "{seen:#?}"
    );
}

#[test]
fn adopt_launch_of_a_running_foreign_job_reports_started_and_its_exit_code() {
    if !enabled("adopt_launch_of_a_running_foreign_job_reports_started_and_its_exit_code") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let job = sbatch_foreign(&["-J", "running", "--gres=gpu:h100:2", "--wrap", "sleep 4; exit 7"]);
    wait_squeue(&job, "%T", "RUNNING", Duration::from_secs(10));
    let work = foreign_of(&mut backend, &job).expect("foreign work");
    assert!(
        matches!(work.running.as_slice(), [m] if m.devices.len() == 2
            && m.devices.iter().all(|d| d.uuid.is_none() && d.shares == 1000)),
        "{work:?}"
    );
    assert!(work.started_ms.is_some());
    let run = RunId { workload: 22, attempt: 1 };
    backend.launch(&adopt_launch(&h, run, &job, work.running.clone())).expect("adopt");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, run));
    assert!(
        matches!(seen.as_slice(), [
            Observation::Started { run: a, .. },
            Observation::Exited { run: b, code: Some(7), .. },
        ] if *a == run && *b == run),
        "{seen:#?}"
    );
}

#[test]
fn requeue_of_an_adopted_job_runs_it_elsewhere_after_a_daemon_restart() {
    if !enabled("requeue_of_an_adopted_job_runs_it_elsewhere_after_a_daemon_restart") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let job = sbatch_foreign(&[
        "-J",
        "adopted",
        "--nodelist=node4",
        "--gres=gpu:h100:1",
        "--wrap",
        "sleep 120",
    ]);
    wait_squeue(&job, "%T", "RUNNING", Duration::from_secs(10));
    let run = RunId { workload: 23, attempt: 1 };
    let next = RunId { workload: 23, attempt: 2 };
    let mut seen = Vec::new();
    {
        let mut backend = SlurmBackend::new(config(&h.prefix));
        backend.launch(&adopt_launch(&h, run, &job, vec![member("node4", 1)])).expect("adopt");
        until(&mut backend, &mut seen, Duration::from_secs(15), "Started", |s| started(s, run));
        assert!(Backend::requeue(&mut backend, run, next).expect("requeue"));
        // The daemon restarts before it saw the run end or launched the next attempt.
    }
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let recovered =
        backend.recover(&[adopt_launch(&h, run, &job, vec![member("node4", 1)])]).expect("recover");
    assert!(
        matches!(recovered.as_slice(), [Observation::Exited { run: r, code: None, detail }]
            if *r == run && detail.contains("requeued by allot as 23.2")),
        "{recovered:#?}"
    );
    wait_squeue(&job, "%T %j", "PENDING adopted", Duration::from_secs(10));
    assert!(foreign_of(&mut backend, &job).is_none(), "requeued for allot: not foreign");
    let launch = Launch { adopt: None, ..adopt_launch(&h, next, &job, vec![member("node2", 2)]) };
    backend.launch(&launch).expect("launch of the next attempt, found by the job's comment");
    until(&mut backend, &mut seen, Duration::from_secs(40), "the next start", |s| started(s, next));
    assert_eq!(squeue_of(&job, "%N %b"), "node2 gres:gpu:h100:2");
    assert_eq!(restarts_of(&job), "1");
    backend.signal(next, StopSignal::Kill).expect("kill");
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, next));
}

#[test]
fn return_foreign_puts_a_running_job_back_in_the_queue_held() {
    if !enabled("return_foreign_puts_a_running_job_back_in_the_queue_held") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let job = sbatch_foreign(&["-J", "returned", "--no-requeue", "--wrap", "sleep 60"]);
    wait_squeue(&job, "%T", "RUNNING", Duration::from_secs(10));
    assert!(foreign_of(&mut backend, &job).is_some_and(|w| !w.running.is_empty()));
    assert!(backend.return_foreign(&job).expect("return_foreign"));
    wait_squeue(&job, "%T", "PENDING", Duration::from_secs(10));
    let work = foreign_of(&mut backend, &job).expect("pending foreign work again");
    assert!(work.running.is_empty() && work.started_ms.is_none(), "{work:?}");
    assert!(squeue_of(&job, "%r").contains("held"), "held: {}", squeue_of(&job, "%r"));
    let requeue_flag = slurm("scontrol", &["show", "job", &job]);
    assert!(requeue_flag.contains("Requeue=0"), "the job's own --no-requeue is kept");
    assert!(!backend.return_foreign("999999999").expect("a gone job"), "nothing to return");
    slurm("scancel", &[&job]);
}

#[test]
fn drained_node_is_unusable_with_its_reason() {
    if !enabled("drained_node_is_unusable_with_its_reason") {
        return;
    }
    let _cluster = cluster_wide();
    let mut backend = SlurmBackend::new(config("allotdrain"));
    let status = |backend: &mut SlurmBackend| {
        let news = backend.watch_cluster().expect("watch_cluster");
        let names: Vec<&str> = news.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["node1", "node2", "node3", "node4"]);
        news.nodes.into_iter().find(|n| n.node == "node4").expect("node4")
    };
    slurm("scontrol", &["update", "nodename=node4", "state=drain", "reason=allot test"]);
    let drained = status(&mut backend);
    slurm("scontrol", &["update", "nodename=node4", "state=resume"]);
    assert!(!drained.usable, "{drained:?}");
    assert!(
        drained.reason.starts_with("DRAIN") && drained.reason.ends_with(": allot test"),
        "{drained:?}"
    );
    let start = Instant::now();
    loop {
        let resumed = status(&mut backend);
        if resumed.usable {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{resumed:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cluster's job completion log once it has a line for `job`.
fn jobcomp_with(job: u64) -> String {
    let log =
        slurm_conf().parent().and_then(Path::parent).expect("state dir").join("log/jobcomp.log");
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(&format!("JobId={job} ")) {
            return text;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no line for job {job} in {log:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A run stopped for good (a cancel, a max runtime) ends CANCELLED in Slurm's accounting, as
/// `scancel` would leave it, not FAILED.
#[test]
fn terminate_ends_a_running_job_cancelled_in_slurms_accounting() {
    if !enabled("terminate_ends_a_running_job_cancelled_in_slurms_accounting") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let run = RunId { workload: 31, attempt: 1 };
    let launch = one_gpu_launch(&h, run, h.program_sleep(60));
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "Started", |s| started(s, run));
    backend.signal(run, StopSignal::Terminate).expect("terminate");
    until(&mut backend, &mut seen, Duration::from_secs(20), "the end", |s| ended(s, run));
    let job = backend.job_id(run).expect("job id");
    let text = jobcomp_with(job);
    let line = text.lines().find(|l| l.contains(&format!("JobId={job} "))).unwrap_or_default();
    assert!(line.contains("JobState=CANCELLED"), "{line}");
    let exited = seen.iter().find_map(|o| match o {
        Observation::Exited { run: r, code, detail } if *r == run => Some((*code, detail.clone())),
        _ => None,
    });
    assert!(matches!(&exited, Some((None, detail)) if detail.contains("CANCELLED")), "{exited:?}");
}

/// While work waits for GPUs (`Backend::set_work_waiting`), a run's end is seen within the
/// short pause, though the backoff's longest pause is 5 s: from the job's own stamp at its end
/// to the `Exited` observation takes well under 1.5 s. Without the hint the backoff (0.25, 0.5,
/// 1, 2, 4 s after the start was seen) sees this 5 s job's end about 3 s late.
#[test]
fn an_end_is_seen_within_the_short_pause_while_work_waits() {
    if !enabled("an_end_is_seen_within_the_short_pause_while_work_waits") {
        return;
    }
    let h = SlurmHarness::new();
    let mut config = config(&h.prefix);
    config.poll_min = Duration::from_millis(250);
    config.poll_max = Duration::from_secs(5);
    config.poll_while_waiting = Duration::from_millis(250);
    let mut backend = SlurmBackend::new(config);
    backend.set_work_waiting(true);
    let run = RunId { workload: 41, attempt: 1 };
    let stamp = h.tmp_dir().join("ended-at");
    let launch = one_gpu_launch(&h, run, sh("sleep 5; date +%s.%N > \"$0\"", &[&stamp]));
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "Started", |s| started(s, run));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ended(&seen, run) {
        assert!(Instant::now() < deadline, "no end in 30 s; observed {seen:#?}");
        seen.extend(backend.poll().expect("poll"));
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs_f64();
    let text = std::fs::read_to_string(&stamp).expect("the job's end stamp");
    let ended_at: f64 = text.trim().parse().expect("seconds since the epoch");
    let late = seen_at - ended_at;
    assert!(late < 1.5, "the end was seen {late:.2} s after it happened; observed {seen:#?}");
    assert!(
        seen.iter()
            .any(|o| matches!(o, Observation::Exited { run: r, code: Some(0), .. } if *r == run)),
        "{seen:#?}"
    );
}

/// The cluster accounts GPUs (slurmdbd, `AccountingStorageTRES=gres/gpu`): a finished run's
/// GPUs and GPU-hours come from Slurm itself, in the job completion log and in `sacct`, under
/// its project's account.
#[test]
fn gpu_hours_of_a_known_job_in_the_jobcomp_log_and_in_sacct() {
    if !enabled("gpu_hours_of_a_known_job_in_the_jobcomp_log_and_in_sacct") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let run = RunId { workload: 30, attempt: 1 };
    let account = "research".to_string();
    let launch = Launch {
        run,
        command: h.program_sleep(2),
        env: BTreeMap::from([("ALLOT_PROJECT".to_string(), account.clone())]),
        members: vec![member("node1", 3)],
        log_dir: h.tmp_dir().join("logs"),
        adopt: None,
        resources: Default::default(),
    };
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "the end", |s| ended(s, run));
    let job = backend.job_id(run).expect("job id");
    // sleep 2 on 3 GPUs: 2-4 s of allocation (whole seconds) × 3 GPUs.
    let expected = 6.0 / 3600.0..=12.0 / 3600.0;
    let text = jobcomp_with(job);
    let line = text.lines().rfind(|l| l.starts_with(&format!("JobId={job} ")));
    // No GPU count from the caller: Slurm's TRES is the only source.
    let hours = allot_backend_slurm::jobcomp_gpu_hours(line.unwrap_or_default(), |_| None)
        .expect("the cluster's jobcomp log parses");
    let got = hours.by_account.get(&account).copied().expect("the account's hours");
    assert!(expected.contains(&got), "{got} GPU-hours from {line:?}");
    assert!(hours.unknown_gpus.is_empty(), "{hours:?}");

    let start = Instant::now();
    let record = loop {
        let out = std::process::Command::new("sacct")
            .args(allot_backend_slurm::sacct_args(600))
            .env("SLURM_TIME_FORMAT", "%s")
            .output()
            .expect("sacct runs");
        assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
        let records = allot_backend_slurm::parse_sacct(&String::from_utf8_lossy(&out.stdout))
            .expect("sacct output parses");
        let done = records.into_iter().find(|r| r.job_id == job && r.end.is_some());
        if let Some(r) = done {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "sacct has no finished job {job}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!((record.account.as_str(), record.state.as_str()), ("research", "COMPLETED"));
    assert_eq!(record.tres_gpus(), Some(3), "{record:?}");
    let sacct_hours = record.elapsed_seconds() as f64 * 3.0 / 3600.0;
    assert!(expected.contains(&sacct_hours), "{record:?}");
}

#[test]
fn inventory_has_typed_gpus_and_leaves_out_unmanaged_partitions() {
    if !enabled("inventory_has_typed_gpus_and_leaves_out_unmanaged_partitions") {
        return;
    }
    let mut config = config("allotinv");
    let mut backend = SlurmBackend::new(config.clone());
    let nodes = backend.inventory().expect("inventory");
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["node1", "node2", "node3", "node4"], "node4 is also in batch");
    for n in &nodes {
        assert_eq!(n.devices.len(), 8);
        assert!(n.devices.iter().all(|d| d.model == "h100"));
        assert_eq!(n.cpu_millis, 8000);
    }
    // Nodes only in unmanaged partitions are not allot's.
    let mut batch_unmanaged = config.clone();
    batch_unmanaged.unmanaged_partitions = ["batch".to_string()].into();
    let names = |c: SlurmConfig| -> Vec<String> {
        SlurmBackend::new(c).inventory().expect("inventory").into_iter().map(|n| n.name).collect()
    };
    assert_eq!(names(batch_unmanaged), ["node4"]);
    // A configured partition limits the inventory to its nodes.
    config.partition = Some("unmanaged".to_string());
    config.unmanaged_partitions.clear();
    assert_eq!(names(config), ["node4"]);
    assert!(backend.nodes().expect("nodes").iter().all(|n| n.usable()));
    let parts = backend.partitions().expect("partitions");
    assert!(parts.iter().any(|p| p.name == "batch" && p.default));
}

#[test]
fn foreign_jobs_are_listed_with_account_and_gpus() {
    if !enabled("foreign_jobs_are_listed_with_account_and_gpus") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let name = format!("foreign{}", std::process::id());
    let submit = |partition: &str| {
        let out = std::process::Command::new("sbatch")
            .env("SLURM_CONF", slurm_conf())
            .args(["--parsable", "-J", &name, "-A", "nlp", "-p", partition])
            .args(["--gres=gpu:h100:2", "-o", "/dev/null", "--wrap", "sleep 60"])
            .output()
            .expect("sbatch runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let managed = submit("batch");
    let unmanaged = submit("unmanaged");
    let start = Instant::now();
    let job = loop {
        let jobs = backend.foreign_jobs().expect("foreign jobs");
        assert!(
            jobs.iter().all(|j| j.partition != "unmanaged"),
            "unmanaged partition excluded: {jobs:#?}"
        );
        if let Some(j) = jobs.into_iter().find(|j| j.job_id.to_string() == managed)
            && j.state == "RUNNING"
        {
            break j;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "foreign job never ran");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((job.account.as_str(), job.name.as_str()), ("nlp", name.as_str()));
    assert_eq!(job.gpus.len(), 1);
    assert_eq!((job.gpus[0].gpu_type.as_deref(), job.gpus[0].count), (Some("h100"), 2));
    assert_eq!(job.gpus[0].indices.len(), 2);
    assert!(job.start_time.is_some());
    let _ = std::process::Command::new("scancel")
        .env("SLURM_CONF", slurm_conf())
        .args([&managed, &unmanaged])
        .status();
}

#[test]
fn running_jobs_of_unmanaged_partitions_on_shared_nodes_are_reported_beside_with_their_gpus() {
    if !enabled(
        "running_jobs_of_unmanaged_partitions_on_shared_nodes_are_reported_beside_with_their_gpus",
    ) {
        return;
    }
    // node4 is in `unmanaged` and in `batch`: the job's six GPUs there are not allot's to give.
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let out = std::process::Command::new("sbatch")
        .env("SLURM_CONF", slurm_conf())
        .args(["--parsable", "-J", "beside", "-A", "physics", "-p", "unmanaged"])
        .args(["--gres=gpu:h100:6", "-o", "/dev/null", "--wrap", "sleep 60"])
        .output()
        .expect("sbatch runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let cancel = || {
        let _ = std::process::Command::new("scancel")
            .env("SLURM_CONF", slurm_conf())
            .arg(&job)
            .status();
    };
    let start = Instant::now();
    let news = loop {
        let news = backend.watch_cluster().expect("watch_cluster");
        if news.beside.iter().any(|w| w.handle == job && !w.running.is_empty()) {
            break news;
        }
        if start.elapsed() > Duration::from_secs(20) {
            cancel();
            panic!("the unmanaged job never showed running beside: {news:#?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    cancel();
    assert!(news.foreign.iter().all(|w| w.handle != job), "not imported: {news:#?}");
    let work = news.beside.iter().find(|w| w.handle == job).expect("listed");
    assert_eq!(work.running.len(), 1, "{work:#?}");
    assert_eq!(work.running[0].node, "node4");
    let mut indices: Vec<u32> = work.running[0].devices.iter().map(|d| d.index).collect();
    indices.sort_unstable();
    indices.dedup();
    assert_eq!(indices.len(), 6, "the indices Slurm bound: {work:#?}");
    assert!(indices.iter().all(|&i| i < 8));
}

#[test]
fn held_jobs_asking_gpus_per_job_are_adopted_per_node_or_refused_with_the_fix() {
    if !enabled("held_jobs_asking_gpus_per_job_are_adopted_per_node_or_refused_with_the_fix") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let even = sbatch_foreign(&[
        "-J",
        "perjob",
        "--hold",
        "-N",
        "2",
        "--gpus=h100:4",
        "--wrap",
        "sleep 60",
    ]);
    let odd = sbatch_foreign(&[
        "-J",
        "perjob-odd",
        "--hold",
        "-N",
        "2",
        "--gpus=3",
        "--wrap",
        "sleep 60",
    ]);
    let work = foreign_of(&mut backend, &even).expect("foreign work");
    assert_eq!(
        (work.nodes, work.gpus_per_node, work.models.first().map(String::as_str)),
        (2, 2, Some("h100"))
    );
    assert_eq!(work.refusal, None);
    let refused = foreign_of(&mut backend, &odd).expect("foreign work");
    let why = refused.refusal.unwrap_or_default();
    assert!(why.contains("--gpus=3") && why.contains("--gpus-per-node"), "{why}");
    slurm("scancel", &[&odd]);
    let run = RunId { workload: 30, attempt: 1 };
    backend
        .launch(&adopt_launch(&h, run, &even, vec![member("node2", 2), member("node3", 2)]))
        .expect("adopt");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(15), "Started", |s| started(s, run));
    assert_eq!(squeue_of(&even, "%T %N"), "RUNNING node[2-3]");
    let bound = backend.allocated_devices(&[run]).expect("allocated devices");
    let per_node: Vec<(String, usize)> = bound
        .iter()
        .flat_map(|(_, ms)| ms.iter().map(|m| (m.node.clone(), m.devices.len())))
        .collect();
    assert_eq!(per_node, [("node2".to_string(), 2), ("node3".to_string(), 2)], "{bound:?}");
    backend.signal(run, StopSignal::Kill).expect("kill");
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, run));
}

/// Every form of GPU request Slurm takes, typed and untyped, is imported and runs where allot
/// placed it: the node's type is added to the request only when the job named one (Slurm
/// refuses an update that mixes the two).
#[test]
fn held_jobs_of_every_gpu_request_form_are_adopted_and_run() {
    if !enabled("held_jobs_of_every_gpu_request_form_are_adopted_and_run") {
        return;
    }
    let _cluster = cluster_wide();
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let forms: [&[&str]; 8] = [
        &["--gres=gpu:2"],
        &["--gres=gpu:h100:2"],
        &["--gpus-per-node=2"],
        &["--gpus-per-node=h100:2"],
        &["--gpus=2"],
        &["--gpus=h100:2"],
        &["--gpus-per-task=2", "--ntasks=1"],
        &["--gpus-per-task=h100:2", "--ntasks=1"],
    ];
    let mut runs = Vec::new();
    for (i, form) in forms.iter().enumerate() {
        let mut args = vec!["-J", "form", "--hold"];
        args.extend_from_slice(form);
        args.extend_from_slice(&["--wrap", "sleep 60"]);
        let job = sbatch_foreign(&args);
        let work = foreign_of(&mut backend, &job).expect("foreign work");
        assert_eq!(
            (work.nodes, work.gpus_per_node, work.refusal.as_deref()),
            (1, 2, None),
            "{form:?}"
        );
        let typed = form.iter().any(|a| a.contains("h100"));
        assert_eq!(work.models.first().map(String::as_str), typed.then_some("h100"), "{form:?}");
        let run = RunId { workload: 40 + i as u64, attempt: 1 };
        let node = format!("node{}", i % 4 + 1);
        backend.launch(&adopt_launch(&h, run, &job, vec![member(&node, 2)])).expect("adopt");
        runs.push((run, job, node, form));
    }
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(30), "all Started", |s| {
        runs.iter().all(|(run, ..)| started(s, *run))
    });
    for (_, job, node, form) in &runs {
        assert_eq!(squeue_of(job, "%T %N"), format!("RUNNING {node}"), "{form:?}");
        let gpus: u32 = slurm("scontrol", &["-d", "-o", "show", "job", job])
            .split_whitespace()
            .find_map(|w| w.strip_prefix("GRES=gpu:h100:"))
            .and_then(|g| g.split('(').next()?.parse().ok())
            .unwrap_or_default();
        assert_eq!(gpus, 2, "{form:?}: bound GPUs");
    }
    for (run, ..) in &runs {
        backend.signal(*run, StopSignal::Kill).expect("kill");
    }
    until(&mut backend, &mut seen, Duration::from_secs(30), "all ended", |s| {
        runs.iter().all(|(run, ..)| ended(s, *run))
    });
}

/// The GPUs Slurm bound, read per job (`scontrol show job -d`, a few starts) and from one
/// `squeue --json` (many starts): the same answer either way.
#[test]
fn allocated_devices_by_job_details_and_by_the_whole_listing_agree() {
    if !enabled("allocated_devices_by_job_details_and_by_the_whole_listing_agree") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    backend.inventory().expect("inventory for the GRES type");
    let runs: Vec<RunId> = (0..9).map(|i| RunId { workload: 40 + i, attempt: 1 }).collect();
    for (i, run) in runs.iter().enumerate() {
        let node = if i < 5 { "node1" } else { "node4" };
        let launch = Launch {
            run: *run,
            command: sh("exec sleep 60", &[]),
            env: BTreeMap::new(),
            members: vec![member(node, 1)],
            log_dir: h.tmp_dir().join(format!("logs-{run}")),
            adopt: None,
            resources: Default::default(),
        };
        backend.launch(&launch).expect("launch");
    }
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(30), "all started", |s| {
        runs.iter().all(|r| started(s, *r))
    });
    let by_details = backend.allocated_devices(&runs[..8]).expect("details");
    let by_listing = backend.allocated_devices(&runs).expect("listing");
    assert_eq!(by_details.len(), 8, "{by_details:?}");
    assert_eq!(by_listing.len(), 9, "{by_listing:?}");
    assert_eq!(by_details.as_slice(), &by_listing[..8]);
    let mut indices: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (_, members) in &by_listing {
        for m in members {
            indices.entry(m.node.clone()).or_default().extend(m.devices.iter().map(|d| d.index));
        }
    }
    for list in indices.values_mut() {
        list.sort_unstable();
        let before = list.len();
        list.dedup();
        assert_eq!(list.len(), before, "no GPU bound twice: {indices:?}");
    }
    for run in &runs {
        backend.signal(*run, StopSignal::Kill).expect("kill");
    }
    until(&mut backend, &mut seen, Duration::from_secs(20), "all ended", |s| {
        runs.iter().all(|r| ended(s, *r))
    });
}

/// With `run_as_submitter`, the job runs as the Unix account of the workload's user
/// (`allot-user`, made by `scripts/slurm-cluster.sh up`), writes its own logs and heartbeat;
/// a user without an account, and root, fail the launch by name.
#[test]
fn jobs_run_as_the_workloads_user_who_writes_its_logs_and_probe_files() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !enabled("jobs_run_as_the_workloads_user_who_writes_its_logs_and_probe_files") {
        return;
    }
    let h = SlurmHarness::new();
    let mut config = config(&h.prefix);
    config.run_as_submitter = true;
    let mut backend = SlurmBackend::new(config);
    // The job's user must reach its log directory: the harness's temp dir is private.
    let dir = h.tmp_dir().join("shared");
    std::fs::create_dir_all(&dir).expect("shared dir");
    for d in [h.tmp_dir(), dir.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let launch_as = |workload: u64, user: &str| Launch {
        run: RunId { workload, attempt: 1 },
        command: sh("id -un; touch \"$ALLOT_HEARTBEAT_FILE\"", &[]),
        env: BTreeMap::from([
            ("ALLOT_USER".to_string(), user.to_string()),
            (
                "ALLOT_HEARTBEAT_FILE".to_string(),
                dir.join(format!("{workload}")).display().to_string(),
            ),
            (
                "ALLOT_CHECKPOINT_FILE".to_string(),
                dir.join(format!("{workload}.checkpoint")).display().to_string(),
            ),
        ]),
        members: vec![member(&h.node, 0)],
        log_dir: dir.join(format!("logs-{workload}")),
        adopt: None,
        resources: Default::default(),
    };
    let ok = launch_as(50, "allot-user");
    backend.launch(&ok).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "the end", |s| ended(s, ok.run));
    assert!(
        matches!(
            seen.as_slice(),
            [Observation::Started { .. }, Observation::Exited { code: Some(0), .. }]
        ),
        "{seen:#?}"
    );
    let log = std::fs::read_to_string(ok.log_dir.join("member-0.log")).expect("the job's log");
    assert_eq!(log.trim(), "allot-user");
    let heartbeat = std::fs::metadata(dir.join("50")).expect("heartbeat file");
    let checkpoint = std::fs::metadata(dir.join("50.checkpoint")).expect("checkpoint file");
    let owner = std::fs::metadata(&ok.log_dir).expect("log dir").uid();
    assert_ne!(owner, 0, "the log directory is the job user's");
    assert_eq!((heartbeat.uid(), checkpoint.uid()), (owner, owner));
    assert!(heartbeat.mtime() > 0, "the job touched its heartbeat");
    assert_eq!(checkpoint.mtime(), 0, "untouched: dated at the epoch, not a checkpoint");
    // A private directory above the logs: refused before submitting, naming it and the fix.
    let private = dir.join("private");
    std::fs::create_dir_all(&private).expect("private dir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let hidden = Launch { log_dir: private.join("logs-53"), ..launch_as(53, "allot-user") };
    backend.launch(&hidden).expect("launch");
    let seen = backend.poll().expect("poll");
    assert!(
        matches!(seen.as_slice(), [Observation::LaunchFailed { run, error }]
            if *run == hidden.run && error.contains("mode 700") && error.contains("chmod o+x")),
        "{seen:#?}"
    );
    for (workload, user, words) in
        [(51, "no-such-allot-user", "no Unix account"), (52, "root", "as root")]
    {
        let refused = launch_as(workload, user);
        backend.launch(&refused).expect("launch");
        let seen = backend.poll().expect("poll");
        assert!(
            matches!(seen.as_slice(), [Observation::LaunchFailed { run, error }]
                if *run == refused.run && error.contains(user) && error.contains(words)),
            "{seen:#?}"
        );
    }
}

#[test]
fn launch_places_members_on_the_chosen_nodes_with_gres_and_env() {
    if !enabled("launch_places_members_on_the_chosen_nodes_with_gres_and_env") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let run = RunId { workload: 7, attempt: 1 };
    let log_dir = h.tmp_dir().join("logs");
    let member = |node: &str| MemberLaunch { node: node.into(), devices: vec![gpu(0), gpu(1)] };
    let launch = Launch {
        run,
        command: sh("echo \"$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $EXTRA\"", &[]),
        env: BTreeMap::from([
            ("EXTRA".to_string(), "from the daemon; with $no expansion".to_string()),
            ("ALLOT_PROJECT".to_string(), "vision".to_string()),
        ]),
        members: vec![member("node3"), member("node4")],
        log_dir: log_dir.clone(),
        adopt: None,
        resources: Default::default(),
    };
    backend.inventory().expect("inventory for the GRES type");
    let args = backend.sbatch_args(&launch);
    assert!(args.contains(&"--gres=gpu:h100:2".to_string()), "{args:?}");
    assert!(args.contains(&"--nodelist=node3,node4".to_string()), "{args:?}");
    assert!(args.contains(&"--account=vision".to_string()), "{args:?}");
    backend.launch(&launch).expect("launch");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(20), "the end", |s| ended(s, run));
    assert!(
        matches!(
            seen.as_slice(),
            [Observation::Started { .. }, Observation::Exited { code: Some(0), .. }]
        ),
        "{seen:#?}"
    );
    // Slurm picks the device indices on each node (two of them); allot's are not pinned.
    let mut lines: Vec<(String, usize, String)> = (0..2)
        .map(|m| {
            let text = std::fs::read_to_string(log_dir.join(format!("member-{m}.log")))
                .unwrap_or_else(|e| panic!("member-{m}.log: {e}"));
            let (node, rest) = text.trim().split_once(' ').expect("node, devices, env");
            let (devices, extra) = rest.split_once(' ').expect("devices, env");
            (node.to_string(), devices.split(',').count(), extra.to_string())
        })
        .collect();
    lines.sort();
    let extra = "from the daemon; with $no expansion".to_string();
    assert_eq!(lines, [("node3".into(), 2, extra.clone()), ("node4".into(), 2, extra)]);
}

#[test]
fn uneven_members_and_fractional_gpus_fail_the_launch() {
    if !enabled("uneven_members_and_fractional_gpus_fail_the_launch") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let uneven = RunId { workload: 8, attempt: 1 };
    let fractional = RunId { workload: 9, attempt: 1 };
    let base = Launch {
        run: uneven,
        command: h.program_sleep(1),
        env: BTreeMap::new(),
        members: vec![
            MemberLaunch { node: "node1".into(), devices: vec![gpu(0)] },
            MemberLaunch { node: "node2".into(), devices: vec![gpu(0), gpu(1)] },
        ],
        log_dir: h.tmp_dir().join("logs"),
        adopt: None,
        resources: Default::default(),
    };
    backend.launch(&base).expect("launch");
    let mut half = gpu(0);
    half.shares = 500;
    backend
        .launch(&Launch {
            run: fractional,
            members: vec![MemberLaunch { node: "node1".into(), devices: vec![half] }],
            ..base.clone()
        })
        .expect("launch");
    let seen = backend.poll().expect("poll");
    assert!(
        matches!(seen.as_slice(), [
            Observation::LaunchFailed { run: a, error: e1 },
            Observation::LaunchFailed { run: b, error: e2 },
        ] if *a == uneven && *b == fractional && e1.contains("same tasks and GPUs")
            && e2.contains("whole GPUs")),
        "{seen:#?}"
    );
}

#[test]
fn a_job_left_held_by_a_dead_daemon_is_released_on_adoption() {
    if !enabled("a_job_left_held_by_a_dead_daemon_is_released_on_adoption") {
        return;
    }
    let h = SlurmHarness::new();
    let by_launch = RunId { workload: 10, attempt: 1 };
    let by_recover = RunId { workload: 11, attempt: 1 };
    let launch_of = |run: RunId| Launch {
        run,
        command: h.program_sleep(30),
        env: BTreeMap::new(),
        members: vec![MemberLaunch { node: h.node(), devices: Vec::new() }],
        log_dir: h.tmp_dir().join(format!("logs-{run}")),
        adopt: None,
        resources: Default::default(),
    };
    {
        // Submitted held; the daemon dies before the poll that would release them.
        let mut backend = SlurmBackend::new(config(&h.prefix));
        backend.launch(&launch_of(by_launch)).expect("launch");
        backend.launch(&launch_of(by_recover)).expect("launch");
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let mut seen = backend.recover(&[launch_of(by_recover)]).expect("recover");
    assert!(seen.is_empty(), "a held job is neither started nor ended: {seen:#?}");
    backend.launch(&launch_of(by_launch)).expect("launch adopts");
    until(&mut backend, &mut seen, Duration::from_secs(15), "both released and started", |s| {
        started(s, by_launch) && started(s, by_recover)
    });
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for run in [by_launch, by_recover] {
        backend.signal(run, StopSignal::Kill).expect("kill");
    }
    until(&mut backend, &mut seen, Duration::from_secs(15), "both ended", |s| {
        ended(s, by_launch) && ended(s, by_recover)
    });
}

#[test]
fn stopping_a_run_not_yet_released_cancels_it() {
    if !enabled("stopping_a_run_not_yet_released_cancels_it") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let run = RunId { workload: 12, attempt: 1 };
    backend
        .launch(&Launch {
            run,
            command: h.program_sleep(30),
            env: BTreeMap::new(),
            members: vec![MemberLaunch { node: h.node(), devices: Vec::new() }],
            log_dir: h.tmp_dir().join("logs"),
            adopt: None,
            resources: Default::default(),
        })
        .expect("launch");
    // A checkpoint of a run that never ran does nothing; a terminate cancels the held job.
    backend.signal(run, StopSignal::Checkpoint).expect("checkpoint");
    backend.signal(run, StopSignal::Terminate).expect("terminate");
    let mut seen = Vec::new();
    until(&mut backend, &mut seen, Duration::from_secs(15), "the end", |s| ended(s, run));
    assert!(
        matches!(seen.as_slice(), [Observation::LaunchFailed { error, .. }] if error.contains("CANCELLED")),
        "{seen:#?}"
    );
}

/// A wave of launches, as one admission round gives them (released by one `scontrol release`):
/// each run gets its own job and its own program's exit code, and a launch Slurm refuses fails
/// alone, under its own run.
#[test]
fn a_wave_of_launches_keeps_each_run_on_its_own_job() {
    if !enabled("a_wave_of_launches_keeps_each_run_on_its_own_job") {
        return;
    }
    let h = SlurmHarness::new();
    let mut backend = SlurmBackend::new(config(&h.prefix));
    let refused = RunId { workload: 60, attempt: 1 };
    let mut launches = Vec::new();
    for i in 0..11_u64 {
        let run = RunId { workload: 50 + i, attempt: 1 };
        let mut launch = one_gpu_launch(&h, run, h.program_exit(i as i32 + 1));
        launch.log_dir = h.tmp_dir().join(format!("logs-{run}"));
        launches.push(launch);
    }
    launches.push(Launch {
        run: refused,
        members: vec![member("no-such-node", 1)],
        ..one_gpu_launch(&h, refused, h.program_exit(0))
    });
    launches.swap(4, 11);
    for launch in &launches {
        backend.launch(launch).expect("a refusal is reported by poll, not as an error");
    }
    let mut seen = Vec::new();
    let runs: Vec<RunId> = launches.iter().map(|l| l.run).collect();
    until(&mut backend, &mut seen, Duration::from_secs(60), "every run's end", |s| {
        runs.iter().all(|run| ended(s, *run))
    });
    let mut job_ids = std::collections::BTreeSet::new();
    for launch in &launches {
        let run = launch.run;
        if run == refused {
            assert!(
                seen.iter().any(|o| matches!(o, Observation::LaunchFailed { run: r, error }
                    if *r == run && error.contains("no-such-node"))),
                "{seen:#?}"
            );
            continue;
        }
        let code = (run.workload - 49) as i32;
        assert!(
            seen.iter().any(|o| matches!(o, Observation::Exited { run: r, code: Some(c), .. }
                if *r == run && *c == code)),
            "{run} should exit {code}: {seen:#?}"
        );
        assert!(job_ids.insert(backend.job_id(run).expect("a job id")), "one job per run");
    }
}
