//! allot governing a real Slurm cluster (`scripts/slurm-cluster.sh up`: four nodes with eight
//! `h100` GRES GPUs each), end to end through `allot serve --backend slurm`:
//!
//! 1. team-a borrows the whole cluster (4 × 8 GPUs);
//! 2. team-b submits within its guarantee: allot reclaims from team-a through Slurm, team-b's
//!    jobs start on the freed nodes (the reclaim latency is printed), team-a's reclaimed jobs
//!    queue again and run again once team-b's are done;
//! 3. a team-b notebook whose GPUs a synthetic telemetry feed shows idle is reclaimed
//!    (`on_pressure`) for team-b's next job;
//! 4. the ledger shows both projects' GPU-hours and team-a's loss to pre-emption.
//!
//! Runs only with `ALLOT_SLURM=1` (and `SLURM_CONF` pointing at the test cluster); `.ci/run`
//! starts the cluster and sets both.

#![allow(clippy::print_stderr)] // the test reports its figures
#![allow(clippy::disallowed_methods)] // waits on a real cluster: real time is the point

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::http;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_allot");

struct Serve {
    child: Child,
    addr: String,
    token: String,
}

impl Drop for Serve {
    /// Cancels what the test left on the cluster (through allot, which stops the Slurm jobs),
    /// then stops the daemon.
    fn drop(&mut self) {
        if let Ok((_, text)) = http(&self.addr, "GET", "/api/v1/workloads", &self.token, None)
            && let Ok(list) = serde_json::from_str::<Value>(&text)
        {
            for w in list["workloads"].as_array().into_iter().flatten() {
                let live = matches!(w["state"].as_str(), Some("pending" | "starting" | "running"));
                if let (true, Some(id)) = (live, w["id"].as_u64()) {
                    let path = format!("/api/v1/workloads/{id}/cancel");
                    let _ = http(&self.addr, "POST", &path, &self.token, None);
                }
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Value {
        let (status, text) =
            http(&self.addr, method, path, &self.token, body).expect("daemon answers");
        assert!(status < 400, "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    fn submit(&self, project: &str, gpus: u32, kind: &str, seconds: u32) -> u64 {
        let body = json!({"project": project, "gpus": gpus, "kind": kind,
            "command": ["sleep", seconds.to_string()]})
        .to_string();
        self.call("POST", "/api/v1/workloads", Some(&body))["id"].as_u64().expect("id")
    }

    fn workload(&self, id: u64) -> Value {
        self.call("GET", &format!("/api/v1/workloads/{id}"), None)
    }

    /// Waits until `done` holds for the workloads, up to `limit`; panics with their states.
    fn wait(&self, what: &str, limit: Duration, done: impl Fn(&Serve) -> bool) -> Duration {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done(self) {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let list = self.call("GET", "/api/v1/workloads", None);
        panic!("{what}: not within {limit:?}; workloads: {list}");
    }

    fn state(&self, id: u64) -> String {
        self.workload(id)["state"].as_str().unwrap_or("").to_string()
    }
}

fn enabled() -> bool {
    if std::env::var("ALLOT_SLURM").is_ok_and(|v| v == "1") {
        return true;
    }
    eprintln!("skipped: set ALLOT_SLURM=1 with the test cluster up (scripts/slurm-cluster.sh up)");
    false
}

fn start(data_dir: &std::path::Path) -> Serve {
    start_with(data_dir, &[])
}

/// A first start with more `allot serve` arguments (`--slurm-partition gated`, …).
fn start_with(data_dir: &std::path::Path, extra: &[&str]) -> Serve {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--backend", "slurm", "--telemetry", "none", "--listen", "127.0.0.1:0"])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--policy")
        .arg(common::repo().join("examples/slurm-policy.yaml"));
    let (child, addr, token) = common::spawn_serve(command, "http");
    Serve { child, addr, token: token.expect("admin token on a first start") }
}

#[test]
fn allot_reclaims_through_slurm_and_keeps_the_ledger() {
    if !enabled() {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("allot-slurm-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let serve = start(&dir);
    let nodes = serve.call("GET", "/api/v1/nodes", None);
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(4), "{nodes}");
    // The test cluster runs allot's job_submit.lua (on its partition `gated`).
    let gate = nodes["backend"]["gate"].as_str().unwrap_or_default();
    assert!(gate.starts_with("submit-time: a job_submit/lua plugin"), "{nodes}");

    // 1. team-a borrows the whole cluster.
    let a: Vec<u64> = (0..4).map(|_| serve.submit("team-a", 8, "training", 600)).collect();
    serve.wait("team-a's four jobs running on Slurm", Duration::from_secs(60), |s| {
        a.iter().all(|id| s.state(*id) == "running")
    });

    // 2. team-b within its guarantee: reclaimed from team-a through Slurm.
    let b: Vec<u64> = (0..2).map(|_| serve.submit("team-b", 8, "batch", 15)).collect();
    let latency =
        serve.wait("team-b's jobs running on reclaimed nodes", Duration::from_secs(60), |s| {
            b.iter().all(|id| s.state(*id) == "running")
        });
    eprintln!("reclaim latency (submission to both jobs running on Slurm): {latency:?}");
    let requeued: Vec<u64> = a.iter().copied().filter(|id| serve.state(*id) == "pending").collect();
    assert_eq!(requeued.len(), 2, "two of team-a's jobs gave their nodes back");
    for id in &requeued {
        let w = serve.workload(*id);
        assert_eq!(w["attempt"], 1, "{w}");
    }
    // team-a's reclaimed jobs run again (a new attempt, a new Slurm job) after team-b's end.
    serve.wait("team-a's reclaimed jobs running again", Duration::from_secs(90), |s| {
        b.iter().all(|id| s.state(*id) == "succeeded")
            && requeued.iter().all(|id| {
                let w = s.workload(*id);
                w["state"] == "running" && w["attempt"] == 2
            })
    });
    // Each run keeps its own output: both attempts' logs are there (the call asserts < 400).
    for id in &requeued {
        for attempt in [1, 2] {
            serve.call("GET", &format!("/api/v1/workloads/{id}/logs?attempt={attempt}"), None);
        }
    }

    // 3. Idle reclaim: two of team-a's jobs end; team-b runs a notebook and a job there.
    // The two that were never reclaimed end: they have run since step 1, so Slurm's books
    // (whole seconds) hold their time. The reclaimed ones may have been requeued within the
    // second they started and just restarted: ending those leaves Slurm 0 s to show.
    let long_running: Vec<u64> = a.iter().copied().filter(|id| !requeued.contains(id)).collect();
    for id in &long_running {
        serve.call("POST", &format!("/api/v1/workloads/{id}/cancel"), None);
    }
    let notebook = serve.submit("team-b", 8, "notebook", 600);
    let job = serve.submit("team-b", 8, "batch", 600);
    serve.wait("team-b's notebook and job running", Duration::from_secs(60), |s| {
        s.state(notebook) == "running" && s.state(job) == "running"
    });
    // The notebook's GPUs report nothing busy (a synthetic feed, as node agents would post).
    let nodes = serve.call("GET", "/api/v1/nodes", None);
    let node =
        nodes["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| {
                n["devices"].as_array().into_iter().flatten().any(|d| {
                    d["workloads"].as_array().is_some_and(|w| w.contains(&json!(notebook)))
                })
            })
            .and_then(|n| n["name"].as_str())
            .expect("the notebook's node")
            .to_string();
    let waiting = serve.submit("team-b", 8, "batch", 600);
    let feed_until = Instant::now() + Duration::from_secs(90);
    let reclaimed = loop {
        let at = std::time::SystemTime::UNIX_EPOCH.elapsed().expect("clock").as_millis() as u64;
        let samples: Vec<Value> = (0..8)
            .map(|i| json!({"hostname": node, "gpu_index": i, "at_ms": at, "sm_active": 0}))
            .collect();
        let post = json!({ "samples": samples }).to_string();
        let (status, text) =
            http(&serve.addr, "POST", "/api/v1/telemetry", &serve.token, Some(&post))
                .expect("post");
        assert_eq!(status, 202, "{text}");
        if serve.state(waiting) == "running" {
            break true;
        }
        if Instant::now() > feed_until {
            break false;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let nb = serve.workload(notebook);
    assert!(reclaimed, "the idle notebook was not reclaimed for team-b's job: {nb}");
    assert_eq!(nb["state"], "pending", "{nb}");
    assert!(nb["reason"].as_str().is_some_and(|r| r.contains("idle")), "{nb}");

    // 4. The ledger.
    let report = serve.call("GET", "/api/v1/report", None);
    let row = |scope: &str| {
        report["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["scope"] == scope)
            .cloned()
            .unwrap_or_else(|| panic!("no {scope} row: {report}"))
    };
    let (ra, rb) = (row("project:team-a"), row("project:team-b"));
    eprintln!("ledger: {ra}\n        {rb}");
    for r in [&ra, &rb] {
        assert!(r["allocated_gpu_hours"].as_f64().is_some_and(|h| h > 0.0), "{r}");
    }
    assert!(ra["lost_gpu_hours"].as_f64().is_some_and(|h| h > 0.0), "{ra}");

    // 5. Slurm's own books next to the ledger: its job completion log, and its accounting
    // database (slurmdbd) through sacct. Both hold the same runs with the GPUs Slurm
    // accounted (gres/gpu in the TRES), so their GPU-hours agree.
    let config = slurm("scontrol", &["show", "config"]);
    let jobcomp = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("JobCompLoc")?.split('=').nth(1).map(str::trim))
        .expect("JobCompLoc in slurm.conf")
        .to_string();
    let reconcile = |source: &[&str]| {
        let out = Command::new(BIN)
            .args(["slurm", "reconcile"])
            .args(source)
            .env("ALLOT_URL", format!("http://{}", serve.addr))
            .env("ALLOT_TOKEN", &serve.token)
            .output()
            .expect("allot slurm reconcile runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{text}");
        let hours: Vec<f64> = ["team-a", "team-b"]
            .iter()
            .map(|project| {
                let line =
                    text.lines().find(|l| l.starts_with(project)).expect("a row per project");
                let slurm_hours: f64 =
                    line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                assert!(slurm_hours > 0.0, "Slurm has {project}'s finished runs: {text}");
                slurm_hours
            })
            .collect();
        // Every run's GPUs are Slurm's own count (the cluster accounts gres/gpu).
        assert!(!text.contains("without GPUs in Slurm's TRES"), "{text}");
        hours
    };
    let from_log = reconcile(&["--jobcomp", &jobcomp]);
    let from_sacct = reconcile(&["--sacct"]);
    for (log, sacct) in from_log.iter().zip(&from_sacct) {
        assert!((log - sacct).abs() <= 0.02 * log.max(*sacct), "{from_log:?} vs {from_sacct:?}");
    }
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job's admin comment (`scontrol show job`), where allot says why it keeps a job waiting.
fn admin_comment(job: &str) -> String {
    let show = slurm("scontrol", &["show", "job", job]);
    let line = show.lines().find_map(|l| l.trim().strip_prefix("AdminComment="));
    line.unwrap_or_default().to_string()
}

/// The two tests share the cluster: one at a time.
static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn slurm(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect("Slurm command runs");
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A one-node job submitted to Slurm directly (not through allot) under `account`, asking GPUs
/// by `gpus` (an sbatch flag), that sleeps `sleep_s`: its job id.
fn sbatch_direct(
    dir: &std::path::Path,
    name: &str,
    account: &str,
    gpus: &str,
    sleep_s: u32,
) -> u64 {
    let script = dir.join(format!("{name}.sh"));
    std::fs::write(&script, format!("#!/bin/sh\nsleep {sleep_s}\n")).expect("script");
    let out = slurm(
        "sbatch",
        &[
            "--parsable",
            &format!("--account={account}"),
            "--nodes=1",
            gpus,
            &format!("--job-name={name}"),
            &format!("--chdir={}", dir.display()),
            &script.display().to_string(),
        ],
    );
    out.trim().split(';').next().and_then(|j| j.parse().ok()).expect("job id")
}

/// `squeue` lines `id name state reason` of every job.
fn squeue() -> Vec<(u64, String, String, String)> {
    slurm("squeue", &["--noheader", "--states=all", "--format=%i %j %T %r"])
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let id = f.next()?.parse().ok()?;
            Some((id, f.next()?.into(), f.next()?.into(), f.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

/// The Slurm job id of an allot run (jobs are named `<prefix>-<workload>.<attempt>`), among
/// the jobs not in `older` (another daemon's jobs have the same suffixes).
fn job_of(older: &std::collections::BTreeSet<u64>, workload: u64, attempt: u32) -> Option<u64> {
    let suffix = format!("-{workload}.{attempt}");
    squeue()
        .into_iter()
        .find(|(id, name, ..)| name.ends_with(&suffix) && !older.contains(id))
        .map(|(id, ..)| id)
}

#[test]
fn foreign_jobs_drained_nodes_and_requeue_are_governed_through_slurm() {
    if !enabled() {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("allot-slurm-foreign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let older: std::collections::BTreeSet<u64> = squeue().into_iter().map(|(id, ..)| id).collect();
    let serve = start(&dir);
    let node_reason = |s: &Serve, node: &str| -> Option<String> {
        let nodes = s.call("GET", "/api/v1/nodes", None);
        let n = nodes["nodes"].as_array()?.iter().find(|n| n["name"] == node)?.clone();
        Some(n["unusable"].as_str().unwrap_or("").to_string())
    };

    // 1. A drained node takes no new work.
    slurm("scontrol", &["update", "nodename=node4", "state=drain", "reason=allot-e2e"]);
    struct Resume;
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = Command::new("scontrol")
                .args(["update", "nodename=node4", "state=resume"])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
    let _resume = Resume;
    serve.wait("node4 shown unusable", Duration::from_secs(30), |s| {
        node_reason(s, "node4").is_some_and(|r| r.contains("allot-e2e"))
    });
    let a: Vec<u64> = (0..4).map(|_| serve.submit("team-a", 8, "training", 600)).collect();
    serve.wait("three of team-a's jobs running", Duration::from_secs(60), |s| {
        a.iter().filter(|id| s.state(**id) == "running").count() == 3
    });
    let waiting = *a.iter().find(|id| serve.state(**id) == "pending").expect("one waits");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(serve.state(waiting), "pending", "nothing placed on the drained node");
    // team-a's jobs now, before team-b's guarantee reclaims any of them.
    let before: Vec<(u64, Option<u64>)> =
        a.iter().map(|id| (*id, job_of(&older, *id, 1))).collect();

    // 2. A job submitted to Slurm directly is held and imported under its account.
    // GPUs asked per job (`--gpus`), not per node: read as 8 on its one node.
    let job = sbatch_direct(&dir, "direct-sbatch", "team-b", "--gpus=h100:8", 20);
    let imported = || -> Option<u64> {
        let list = serve.call("GET", "/api/v1/workloads", None);
        list["workloads"].as_array()?.iter().find_map(|w| {
            (w["command"] == json!(["foreign", job.to_string()])).then(|| w["id"].as_u64())?
        })
    };
    serve.wait("the direct sbatch job imported", Duration::from_secs(30), |_| imported().is_some());
    let foreign = imported().expect("imported");
    let w = serve.workload(foreign);
    assert_eq!(w["project"], "team-b", "{w}");
    assert_eq!((w["gpus"].as_str(), w["members"].as_u64()), (Some("8"), Some(1)), "{w}");
    // Slurm's own tools show why work waits: a team-a job requeued for team-b's (held for
    // its next attempt) carries allot's reason in its admin comment.
    serve.wait("allot's reason in a requeued job's admin comment", Duration::from_secs(60), |s| {
        before.iter().any(|(id, first)| {
            let w = s.workload(*id);
            let reason = w["reason"].as_str().unwrap_or_default().replace('|', " ");
            w["state"] == "pending"
                && w["attempt"] == 1
                && first.is_some_and(|j| {
                    admin_comment(&j.to_string()) == format!("allot: waiting: {reason}")
                })
        })
    });

    // 3. The node comes back; team-b's guarantee reclaims from team-a by requeue: the
    //    reclaimed job stays the same Slurm job and comes back as attempt 2.
    // team-b also submits through allot: with the imported job it asks 16 GPUs, its
    // guarantee, while team-a holds 24 and only node4 is coming back.
    let b = serve.submit("team-b", 8, "batch", 15);
    slurm("scontrol", &["update", "nodename=node4", "state=resume"]);
    serve.wait("node4 usable again", Duration::from_secs(30), |s| {
        node_reason(s, "node4").is_some_and(|r| r.is_empty())
    });
    serve.wait("the imported job and team-b's running", Duration::from_secs(90), |s| {
        s.state(foreign) == "running" && s.state(b) == "running"
    });
    // A requeued run's job is renamed for the next attempt and keeps its id.
    let requeued: Vec<(u64, u64, Option<u64>)> = before
        .iter()
        .filter_map(|(id, first)| Some((*id, (*first)?, job_of(&older, *id, 2))))
        .filter(|(.., again)| again.is_some())
        .collect();
    assert!(!requeued.is_empty(), "team-a gave GPUs back by requeue: {:?}", squeue());
    for (id, first, again) in &requeued {
        assert_eq!(again, &Some(*first), "workload {id}: its job was requeued, not replaced");
        // Held for its next attempt, it says why it waits.
        if serve.state(*id) == "pending" {
            let said = admin_comment(&first.to_string());
            assert!(said.starts_with("allot: waiting: "), "workload {id}: {said}");
        }
    }
    serve.wait("the imported job done", Duration::from_secs(60), |s| {
        s.state(foreign) == "succeeded"
    });
    // A requeued job running again is exempt from pre-emption for a while (the policy's
    // default `preemption.exempt_after_restart`, as Slurm's PreemptExemptTime): `allot why`
    // says so.
    let again = |s: &Serve| {
        requeued.iter().map(|(id, ..)| *id).find(|id| {
            let w = s.workload(*id);
            w["state"] == "running" && w["attempt"] == 2
        })
    };
    serve.wait("a requeued job running again", Duration::from_secs(60), |s| again(s).is_some());
    let restarted = again(&serve).expect("running again");
    let out = Command::new(BIN)
        .args(["why", &restarted.to_string()])
        .args(["--url", &format!("http://{}", serve.addr), "--token", &serve.token])
        .output()
        .expect("allot why");
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("restarted after a stop: exempt until"), "allot why {restarted}: {why}");
    // Cancelling everything through allot leaves nothing of this daemon's in Slurm's queue:
    // a requeued job held for its next attempt is cancelled with its workload.
    drop(serve);
    let deadline = Instant::now() + Duration::from_secs(30);
    let left = loop {
        let left: Vec<_> = squeue()
            .into_iter()
            .filter(|(id, _, state, _)| {
                !older.contains(id) && matches!(state.as_str(), "PENDING" | "RUNNING")
            })
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(left.is_empty(), "jobs left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/slurm-cluster.sh ctld-stop|ctld-start`: the controller alone (starting a running
/// one does nothing).
fn controller(what: &str) {
    if what == "ctld-start"
        && Command::new("scontrol").arg("ping").output().is_ok_and(|o| o.status.success())
    {
        return;
    }
    let out = Command::new("bash")
        .arg(common::repo().join("scripts/slurm-cluster.sh"))
        .arg(what)
        .output()
        .expect("slurm-cluster.sh runs");
    assert!(out.status.success(), "ctld {what}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The submit-time gate through the daemon (the test cluster's partition `gated`, node4): a
/// job submitted to Slurm while allot is not running stays held — nothing starts while allot
/// is down — and once allot runs (governing that partition) it is imported, admitted and
/// started through allot; `allot nodes` names the gate; cancelled through allot, the job ends
/// CANCELLED in Slurm's accounting.
#[test]
fn a_job_submitted_while_allot_is_down_waits_for_allot_and_a_cancel_is_cancelled() {
    if !enabled() {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("allot-slurm-gate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("data dir");
    let script = dir.join("direct.sh");
    std::fs::write(&script, "#!/bin/sh\nsleep 300\n").expect("script");
    let job: u64 = slurm(
        "sbatch",
        &[
            "--parsable",
            "--account=team-a",
            "--partition=gated",
            "--nodes=1",
            "--gpus-per-node=h100:4",
            "--job-name=while-down",
            &format!("--chdir={}", dir.display()),
            &script.display().to_string(),
        ],
    )
    .trim()
    .parse()
    .expect("job id");
    let state =
        || squeue().into_iter().find(|(id, ..)| *id == job).map(|(_, _, s, r)| format!("{s} {r}"));
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(state().as_deref(), Some("PENDING JobHeldUser"), "held with no allot running");

    let serve = start_with(&dir, &["--slurm-partition", "gated"]);
    let out = Command::new(BIN)
        .args(["nodes", "--url", &format!("http://{}", serve.addr), "--token", &serve.token])
        .output()
        .expect("allot nodes");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("gate: submit-time: a job_submit/lua plugin"), "allot nodes: {text}");
    let imported = || {
        let list = serve.call("GET", "/api/v1/workloads", None);
        list["workloads"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["name"] == "while-down")
            .cloned()
    };
    serve.wait("the held job imported and running", Duration::from_secs(60), |_| {
        imported().is_some_and(|w| w["state"] == "running")
    });
    assert_eq!(state().map(|s| s.starts_with("RUNNING")), Some(true), "{:?}", state());
    let id = imported().and_then(|w| w["id"].as_u64()).expect("workload id");
    // `allot why` and `allot ls` by Slurm job id: the imported job, and one of allot's own.
    let own = serve.submit("team-b", 1, "batch", 300);
    serve.wait("allot's own job running", Duration::from_secs(60), |s| s.state(own) == "running");
    let own_job =
        job_of(&std::collections::BTreeSet::new(), own, 1).expect("the own job's Slurm id");
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .args(["--url", &format!("http://{}", serve.addr), "--token", &serve.token])
            .output()
            .expect("allot runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    for (job, workload, name) in
        [(job, id, "while-down".to_string()), (own_job, own, String::new())]
    {
        let why = cli(&["why", &format!("slurm:{job}")]);
        assert!(why.starts_with(&format!("{workload} {name}")), "why slurm:{job}: {why}");
        let ls = cli(&["ls", "--slurm-job", &job.to_string(), "--output", "json"]);
        let listed: Value = serde_json::from_str(&ls).expect("json");
        let ids: Vec<u64> = listed["workloads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["id"].as_u64())
            .collect();
        assert_eq!(ids, [workload], "ls --slurm-job {job}: {ls}");
    }
    serve.call("POST", &format!("/api/v1/workloads/{id}/cancel"), None);
    serve.wait("the cancelled job ended", Duration::from_secs(60), |s| s.state(id) == "cancelled");
    let config = slurm("scontrol", &["show", "config"]);
    let jobcomp = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("JobCompLoc")?.split('=').nth(1).map(str::trim))
        .expect("JobCompLoc in slurm.conf")
        .to_string();
    let start = Instant::now();
    let line = loop {
        let text = std::fs::read_to_string(&jobcomp).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with(&format!("JobId={job} "))) {
            break line.to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no jobcomp line for {job}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(line.contains("JobState=CANCELLED"), "{line}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start on an existing data directory (no admin token is printed; the first one works).
fn restart(data_dir: &std::path::Path, token: &str) -> Serve {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--backend", "slurm", "--telemetry", "none", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--policy")
        .arg(common::repo().join("examples/slurm-policy.yaml"));
    let (child, addr, _) = common::spawn_serve(command, "http");
    Serve { child, addr, token: token.to_string() }
}

/// (id, state, attempt) of every workload, in id order.
fn states(serve: &Serve) -> Vec<(u64, String, u64)> {
    let list = serve.call("GET", "/api/v1/workloads", None);
    list["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            (
                w["id"].as_u64().unwrap_or(0),
                w["state"].as_str().unwrap_or("").to_string(),
                w["attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Issue 18 on the real cluster: `kill -9` of allot with jobs running (nodes `mixed` and
/// `allocated`), queued and held, a slurmctld restart in between, and starts while the
/// controller is down. Every workload comes back once, running jobs are re-adopted (same
/// Slurm job, same attempt), nothing fails because the controller was away, and `/metrics`
/// and `allot nodes` say when it is unreachable.
#[test]
fn kill_9_and_a_controller_restart_lose_nothing() {
    if !enabled() {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Killed daemons leave their jobs behind: cancelled at the start and at the end (also
    // when an assertion fails), and the controller is left running.
    struct Clean;
    impl Drop for Clean {
        fn drop(&mut self) {
            controller("ctld-start");
            let _ = Command::new("scancel").args(["--user", "root"]).status();
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    drop(Clean);
    let _clean = Clean;
    let dir = std::env::temp_dir().join(format!("allot-slurm-kill9-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let older: std::collections::BTreeSet<u64> = squeue().into_iter().map(|(id, ..)| id).collect();
    let serve = start(&dir);
    let token = serve.token.clone();
    // Running: three 8-GPU jobs of team-a and a 4-GPU one of team-b (a node `mixed`); queued:
    // two more 8-GPU jobs of team-a (4 GPUs are free); held: an 8-GPU job of team-a submitted
    // to Slurm directly. Nobody waits within a guarantee, so nothing is reclaimed.
    let mut running: Vec<u64> =
        (0..3).map(|_| serve.submit("team-a", 8, "training", 600)).collect();
    running.push(serve.submit("team-b", 4, "batch", 600));
    serve.wait("four jobs running", Duration::from_secs(90), |s| {
        running.iter().all(|id| s.state(*id) == "running")
    });
    let queued: Vec<u64> = (0..2).map(|_| serve.submit("team-a", 8, "training", 600)).collect();
    let direct = sbatch_direct(&dir, "held-direct", "team-a", "--gpus-per-node=h100:8", 30);
    serve.wait("the direct job imported", Duration::from_secs(30), |s| {
        states(s).len() == running.len() + queued.len() + 1
    });
    let nodes = slurm("sinfo", &["-h", "-N", "-p", "batch", "-o", "%N %T"]);
    assert!(nodes.contains("mixed") || nodes.contains("allocated"), "nodes are in use: {nodes}");
    std::thread::sleep(Duration::from_secs(3));
    let jobs_before: Vec<Option<u64>> = running.iter().map(|id| job_of(&older, *id, 1)).collect();
    let before = states(&serve);

    // kill -9, then the controller restarts (its jobs kept), then allot starts again.
    let mut serve = serve;
    let _ = serve.child.kill();
    let _ = serve.child.wait();
    std::mem::forget(serve); // its Drop would cancel the work through a dead daemon
    controller("ctld-stop");
    std::thread::sleep(Duration::from_secs(3));
    controller("ctld-start");
    let serve = restart(&dir, &token);
    serve.wait("running jobs re-adopted", Duration::from_secs(60), |s| {
        running.iter().all(|id| s.state(*id) == "running")
    });
    let after = states(&serve);
    assert_eq!(
        after.iter().map(|(id, ..)| *id).collect::<Vec<_>>(),
        before.iter().map(|(id, ..)| *id).collect::<Vec<_>>(),
        "every workload once: {before:?} vs {after:?}"
    );
    for (id, state, attempt) in &after {
        let was = before.iter().find(|(b, ..)| b == id).expect("listed before");
        assert_eq!((state, attempt), (&was.1, &was.2), "workload {id}: {before:?} vs {after:?}");
    }
    let jobs_after: Vec<Option<u64>> = running.iter().map(|id| job_of(&older, *id, 1)).collect();
    assert_eq!(jobs_before, jobs_after, "the same Slurm jobs, adopted again");
    assert!(queued.iter().all(|id| serve.state(*id) == "pending"), "queued work still queued");

    // The controller goes away while allot runs: nothing fails, and allot says so.
    controller("ctld-stop");
    serve.wait("the backend shown unreachable", Duration::from_secs(60), |s| {
        s.call("GET", "/api/v1/nodes", None)["backend"]["reachable"] == false
    });
    let (_, metrics) = http(&serve.addr, "GET", "/metrics", &token, None).expect("metrics");
    assert!(metrics.contains("allot_backend_up 0"), "{metrics}");
    let late = serve.submit("team-b", 4, "batch", 60);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(serve.state(late), "pending", "queued while the controller is away");
    let out = Command::new(BIN)
        .args(["nodes", "--url", &format!("http://{}", serve.addr), "--token", &token])
        .output()
        .expect("allot nodes");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("UNREACHABLE"), "allot nodes says so: {text}");
    // And allot restarts while it is still away: it comes up on what it knew.
    let mut serve = serve;
    let _ = serve.child.kill();
    let _ = serve.child.wait();
    std::mem::forget(serve);
    let serve = restart(&dir, &token);
    assert_eq!(serve.state(late), "pending");
    controller("ctld-start");
    serve.wait("the late job runs once the controller is back", Duration::from_secs(120), |s| {
        s.state(late) == "running"
    });
    let failed: Vec<(u64, String, u64)> =
        states(&serve).into_iter().filter(|(_, s, _)| s == "failed").collect();
    assert!(failed.is_empty(), "nothing failed for the controller's absence: {failed:?}");
    assert!(running.iter().all(|id| serve.state(*id) == "running"), "{:?}", states(&serve));
    let _ = Command::new("scancel").arg(direct.to_string()).status();
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

/// GPUs held by a job of a partition allot leaves alone, on a node a managed partition shares
/// (node4 is in `batch` and in `unmanaged`), are occupied: allot places nothing on them —
/// an 8-GPU job waits rather than sit PENDING in Slurm on node4 — shows them in `allot nodes`,
/// counts them `unmanaged` in the ledger, and uses node4 once that job ends.
#[test]
fn gpus_held_by_an_unmanaged_partitions_job_take_no_allot_work() {
    if !enabled() {
        return;
    }
    let _one = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("allot-slurm-beside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    let script = dir.join("beside.sh");
    std::fs::write(&script, "#!/bin/sh\nsleep 300\n").expect("script");
    let beside: u64 = slurm(
        "sbatch",
        &[
            "--parsable",
            "--account=physics",
            "--partition=unmanaged",
            "--gres=gpu:h100:6",
            "--job-name=beside-allot",
            &format!("--chdir={}", dir.display()),
            &script.display().to_string(),
        ],
    )
    .trim()
    .parse()
    .expect("job id");
    struct Cancel(u64);
    impl Drop for Cancel {
        fn drop(&mut self) {
            let _ = Command::new("scancel").arg(self.0.to_string()).status();
        }
    }
    let _cancel = Cancel(beside);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !squeue().iter().any(|(id, _, state, _)| *id == beside && state == "RUNNING") {
        assert!(Instant::now() < deadline, "the unmanaged job never ran: {:?}", squeue());
        std::thread::sleep(Duration::from_millis(300));
    }

    let serve = start_with(&dir, &["--slurm-unmanaged-partition", "unmanaged"]);
    let occupied = |s: &Serve| {
        let nodes = s.call("GET", "/api/v1/nodes", None);
        let node4 = nodes["nodes"].as_array()?.iter().find(|n| n["name"] == "node4")?.clone();
        Some(node4["unmanaged"]["devices"].as_array()?.len())
    };
    serve.wait("node4's six GPUs shown occupied", Duration::from_secs(30), |s| {
        occupied(s) == Some(6)
    });
    let a: Vec<u64> = (0..4).map(|_| serve.submit("team-a", 8, "training", 600)).collect();
    serve.wait("three of team-a's jobs running", Duration::from_secs(60), |s| {
        a.iter().filter(|id| s.state(**id) == "running").count() == 3
    });
    let waiting = *a.iter().find(|id| serve.state(**id) == "pending").expect("one waits");
    std::thread::sleep(Duration::from_secs(6));
    let w = serve.workload(waiting);
    assert_eq!(w["state"], "pending", "nothing placed on node4's occupied GPUs: {w}");
    // None of allot's jobs is on node4, in allot's books or in Slurm's.
    for id in &a {
        let placed = serve.workload(*id)["placement"].to_string();
        assert!(!placed.contains("node4"), "workload {id} placed on node4: {placed}");
    }
    let out = Command::new(BIN)
        .args(["nodes", "--url", &format!("http://{}", serve.addr), "--token", &serve.token])
        .output()
        .expect("allot nodes");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("GPUs held by work allot does not govern"), "allot nodes: {text}");
    let report = serve.call("GET", "/api/v1/report", None);
    eprintln!("report rows: {}", report["rows"]);

    // The unmanaged job ends: node4 is allot's again and the waiting job runs there.
    slurm("scancel", &[&beside.to_string()]);
    serve.wait("the waiting job running on node4", Duration::from_secs(60), |s| {
        let w = s.workload(waiting);
        w["state"] == "running" && w["placement"].to_string().contains("node4")
    });
    assert_eq!(occupied(&serve), None, "nothing occupied once the job ended");
    let report = serve.call("GET", "/api/v1/report", None);
    let unmanaged: f64 = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["unmanaged_gpu_hours"].as_f64())
        .fold(0.0, f64::max);
    assert!(unmanaged > 0.0, "the ledger counts the occupied GPUs' hours: {report}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}
