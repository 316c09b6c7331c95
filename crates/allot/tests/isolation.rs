//! A shared GPU server's users cannot reach each other or the daemon: `allot serve` run as root
//! (as on a shared server), two project members whose workloads run as their own Unix accounts.
//!
//! Needs root and the accounts `allot-alice` and `allot-bob` (`.ci/run` makes them and sets
//! `ALLOT_ISOLATION_TESTS=1`, which turns a missing precondition into a failure); otherwise the
//! test says why it is skipped.

#![allow(clippy::print_stderr)] // says why it is skipped
#![allow(clippy::disallowed_methods)] // deadlines for a real daemon

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::http;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_allot");
const ALICE: &str = "allot-alice";
const BOB: &str = "allot-bob";
/// In the daemon's environment only; no workload may see it.
const DAEMON_SECRET: &str = "allot_daemon_environment_secret_4f1c";

fn preconditions() -> Result<(), String> {
    if !nix_root() {
        return Err("not root".into());
    }
    for user in [ALICE, BOB] {
        let ok = Command::new("id").arg(user).output().is_ok_and(|o| o.status.success());
        if !ok {
            return Err(format!("no Unix account {user} (useradd -M {user})"));
        }
    }
    Ok(())
}

fn nix_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn skip_unless_ready() -> bool {
    match preconditions() {
        Ok(()) => false,
        Err(why) if std::env::var_os("ALLOT_ISOLATION_TESTS").is_some() => {
            panic!("ALLOT_ISOLATION_TESTS is set but {why}")
        }
        Err(why) => {
            eprintln!("skipped: {why} (set ALLOT_ISOLATION_TESTS=1 to require it)");
            true
        }
    }
}

struct Daemon {
    child: std::process::Child,
    addr: String,
    admin: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(data: &Path, work: &Path) -> Daemon {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--telemetry", "none", "--data-dir"])
        .arg(data)
        .arg("--workload-dir")
        .arg(work)
        .arg("--inventory")
        .arg(common::repo().join("examples/cluster.yaml"))
        .arg("--policy")
        .arg(common::repo().join("examples/policy.yaml"))
        // What the README once told operators to do: the admin token in the daemon's shell.
        .env("ALLOT_TOKEN", DAEMON_SECRET)
        .env("AWS_SECRET_ACCESS_KEY", DAEMON_SECRET);
    let (child, addr, admin) = common::spawn_serve(command, "http");
    Daemon { child, addr, admin: admin.expect("a first start prints the admin token") }
}

/// A daemon on a fresh data directory and workload directory, in a temporary directory the
/// workloads' accounts may pass (kept alive by the returned guard).
fn fresh_daemon() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, Daemon) {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))
        .expect("chmod");
    let (data, work) = (tmp.path().join("data"), tmp.path().join("work"));
    let daemon = start(&data, &work);
    (tmp, data, work, daemon)
}

fn member_token(daemon: &Daemon, name: &str) -> String {
    let body = format!(r#"{{"role":"member","name":"{name}","projects":["research"]}}"#);
    let (status, text) =
        http(&daemon.addr, "POST", "/api/v1/tokens", &daemon.admin, Some(&body)).expect("token");
    assert_eq!(status, 201, "{text}");
    let v: Value = serde_json::from_str(&text).expect("token JSON");
    v["token"].as_str().expect("token").to_string()
}

fn submit(daemon: &Daemon, token: &str, extra: &str, script: &str) -> (u16, String) {
    let body = serde_json::json!({
        "project": "research",
        "gpus": 1,
        "command": ["sh", "-c", script],
    });
    let mut body = body.as_object().expect("object").clone();
    if !extra.is_empty() {
        let more: Value = serde_json::from_str(extra).expect("extra JSON");
        body.extend(more.as_object().expect("object").clone());
    }
    let body = Value::Object(body).to_string();
    http(&daemon.addr, "POST", "/api/v1/workloads", token, Some(&body)).expect("submit")
}

fn id_of(answer: &(u16, String)) -> u64 {
    assert_eq!(answer.0, 201, "{}", answer.1);
    let v: Value = serde_json::from_str(&answer.1).expect("JSON");
    v["id"].as_u64().expect("id")
}

fn workload(daemon: &Daemon, id: u64) -> Value {
    let (status, text) =
        http(&daemon.addr, "GET", &format!("/api/v1/workloads/{id}"), &daemon.admin, None)
            .expect("get");
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("workload JSON")
}

fn wait_for(daemon: &Daemon, id: u64, states: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = workload(daemon, id);
        if states.iter().any(|s| w["state"] == *s) {
            return w;
        }
        assert!(Instant::now() < deadline, "workload {id} never reached {states:?}: {w}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn logs(daemon: &Daemon, id: u64) -> String {
    let (status, text) =
        http(&daemon.addr, "GET", &format!("/api/v1/workloads/{id}/logs"), &daemon.admin, None)
            .expect("logs");
    assert_eq!(status, 200, "{text}");
    text
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o7777
}

#[test]
fn a_members_workload_cannot_reach_the_daemon_or_another_members_work() {
    if skip_unless_ready() {
        return;
    }
    let (_tmp, data, work, daemon) = fresh_daemon();
    assert_eq!(mode_of(&data), 0o700, "the data directory");
    assert_eq!(mode_of(&data.join("allot.db")), 0o600, "the database");
    assert_eq!(mode_of(&work), 0o711, "the workload directory: passable, not listable");

    // A user with no Unix account here is refused at submission, with the fix.
    let stranger = member_token(&daemon, "no-such-allot-account");
    let refused = submit(&daemon, &stranger, "", "true");
    assert_eq!(refused.0, 422, "{}", refused.1);
    assert!(refused.1.contains("useradd no-such-allot-account"), "{}", refused.1);

    let bob = member_token(&daemon, BOB);
    let bob_id = id_of(&submit(
        &daemon,
        &bob,
        "",
        "echo bob-private-output; touch \"$ALLOT_HEARTBEAT_FILE\"; sleep 600",
    ));
    wait_for(&daemon, bob_id, &["running"]);
    let bob_files = allot_backend::files::WorkloadFiles::new(&work, bob_id);
    let bob_log = bob_files.log_file(1, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&bob_log).is_ok_and(|t| t.contains("bob-private-output")) {
        assert!(Instant::now() < deadline, "bob's workload never wrote its log");
        std::thread::sleep(Duration::from_millis(50));
    }

    let alice = member_token(&daemon, ALICE);
    let probe = format!(
        "id -un; env; \
         for f in '{db}' '{log}' '{hb}' /proc/{daemon}/environ; do \
           if cat \"$f\" > /dev/null 2>&1; then echo \"READ $f\"; else echo \"DENIED-READ $f\"; fi; done; \
         if touch '{hb}' 2> /dev/null; then echo WROTE-HEARTBEAT; else echo DENIED-WRITE-HEARTBEAT; fi; \
         if ls '{data}' > /dev/null 2>&1; then echo LISTED-DATA; else echo DENIED-LIST-DATA; fi; \
         if ls '{work}' > /dev/null 2>&1; then echo LISTED-WORK; else echo DENIED-LIST-WORK; fi; \
         touch \"$ALLOT_HEARTBEAT_FILE\" && echo OWN-HEARTBEAT",
        db = data.join("allot.db").display(),
        log = bob_log.display(),
        hb = bob_files.heartbeat().display(),
        data = data.display(),
        work = work.display(),
        daemon = daemon.child.id(),
    );
    let alice_id = id_of(&submit(&daemon, &alice, "", &probe));
    let end = wait_for(&daemon, alice_id, &["succeeded", "failed"]);
    let out = logs(&daemon, alice_id);
    assert_eq!(end["state"], "succeeded", "{end}\n{out}");
    assert_eq!(out.lines().next(), Some(ALICE), "runs as its submitter's account:\n{out}");
    assert!(!out.contains(DAEMON_SECRET), "the daemon's environment leaked:\n{out}");
    assert!(!out.contains(&daemon.admin), "the admin token leaked:\n{out}");
    for line in ["HOME=/", "USER=allot-alice", "ALLOT_USER=allot-alice", "PATH=/usr/local/bin"] {
        assert!(out.lines().any(|l| l.starts_with(line)), "no {line} in:\n{out}");
    }
    for denied in [
        format!("DENIED-READ {}", data.join("allot.db").display()),
        format!("DENIED-READ {}", bob_log.display()),
        format!("DENIED-READ {}", bob_files.heartbeat().display()),
        format!("DENIED-READ /proc/{}/environ", daemon.child.id()),
        "DENIED-WRITE-HEARTBEAT".to_string(),
        "DENIED-LIST-DATA".to_string(),
        "DENIED-LIST-WORK".to_string(),
        "OWN-HEARTBEAT".to_string(),
    ] {
        assert!(out.contains(&denied), "expected {denied:?} in:\n{out}");
    }
    // What the files are: the workload's own, out of everyone else's reach.
    use std::os::unix::fs::MetadataExt;
    let alice_files = allot_backend::files::WorkloadFiles::new(&work, alice_id);
    let alice_uid = Command::new("id").args(["-u", ALICE]).output().expect("id").stdout;
    let alice_uid: u32 = String::from_utf8_lossy(&alice_uid).trim().parse().expect("uid");
    for (path, mode) in [
        (alice_files.heartbeat(), 0o600),
        (alice_files.checkpoint(), 0o600),
        (alice_files.log_dir(1), 0o700),
    ] {
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!((meta.uid(), mode_of(&path)), (alice_uid, mode), "{}", path.display());
    }
    for dir in [alice_files.dir.clone(), alice_files.dir.join("logs")] {
        let uid = std::fs::metadata(&dir).expect("dir").uid();
        assert_eq!(
            (uid, mode_of(&dir)),
            (0, 0o711),
            "the daemon's, not listable: {}",
            dir.display()
        );
    }

    // The admin token is in no workload's environment or log.
    for id in [bob_id, alice_id] {
        assert!(!logs(&daemon, id).contains(&daemon.admin));
    }
    // `why` says what isolates a running workload.
    let (status, why) =
        http(&daemon.addr, "GET", &format!("/api/v1/workloads/{bob_id}/why"), &daemon.admin, None)
            .expect("why");
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("Isolation: it runs as its submitter's Unix account"), "{why}");
    assert!(why.contains("only its own GPUs' device nodes"), "{why}");
    let (status, _) = http(
        &daemon.addr,
        "POST",
        &format!("/api/v1/workloads/{bob_id}/cancel"),
        &daemon.admin,
        None,
    )
    .expect("cancel");
    assert_eq!(status, 200);
    // Ended before the daemon goes: no member of the test outlives it.
    wait_for(&daemon, bob_id, &["cancelled", "failed", "succeeded"]);
}

#[test]
fn a_workload_that_plants_a_link_in_its_log_directory_cannot_read_through_the_daemon() {
    if skip_unless_ready() {
        return;
    }
    let (_tmp, data, _work, daemon) = fresh_daemon();
    let alice = member_token(&daemon, ALICE);
    // The workload swaps its own log for a link to the daemon's database, then asks for it.
    let db = data.join("allot.db");
    let script = format!(
        "cd \"$(dirname \"$ALLOT_HEARTBEAT_FILE\")/logs/1\" && rm -f member-0.log && \
         ln -s '{}' member-0.log && echo linked > /dev/null",
        db.display()
    );
    let id = id_of(&submit(&daemon, &alice, "", &script));
    wait_for(&daemon, id, &["succeeded", "failed"]);
    let (status, text) =
        http(&daemon.addr, "GET", &format!("/api/v1/workloads/{id}/logs"), &daemon.admin, None)
            .expect("logs");
    assert_eq!(status, 404, "the link is not followed: {text}");
    assert!(!text.contains("SQLite format"), "{text}");
}

#[test]
fn a_workload_over_its_memory_request_is_killed_by_the_kernel() {
    if skip_unless_ready() {
        return;
    }
    let (_tmp, _data, _work, daemon) = fresh_daemon();
    let alice = member_token(&daemon, ALICE);
    // ~256 MiB in the shell's own memory against a 64 MiB request.
    let script = "x=$(head -c 268435456 /dev/zero | tr '\\0' a); echo survived ${#x}";
    let id = id_of(&submit(&daemon, &alice, r#"{"memory_mib": 64, "cpu_millis": 500}"#, script));
    let end = wait_for(&daemon, id, &["succeeded", "failed"]);
    assert_eq!(end["state"], "failed", "{end}");
    assert!(end.to_string().contains("out of memory"), "the reason says why: {end}");
    assert!(!logs(&daemon, id).contains("survived"));
}
