//! `allot serve` as a user runs it: the issue's acceptance commands through the CLI, and
//! `kill -9` of the daemon during bursts of submissions (every acknowledged submission exists
//! exactly once afterwards; every child is re-adopted or accounted for, never duplicated).
//!
//! The kill test's full size (20 rounds × 1,000 submissions) runs with `ALLOT_SLOW_TESTS=1`;
//! `cargo test` runs 3 rounds × 150.

#![allow(clippy::print_stderr)] // the kill test reports its seed and rounds

mod common;

use common::{http, set_label};

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_allot");

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

struct Daemon {
    child: Child,
    url: String,
    addr: String,
}

impl Daemon {
    /// Starts `allot serve` on a free port; returns it and the admin token if it printed one.
    fn start(data_dir: &Path) -> (Daemon, Option<String>) {
        Daemon::start_with(data_dir, &[])
    }

    /// `start` with more arguments for `allot serve`.
    fn start_with(data_dir: &Path, extra: &[String]) -> (Daemon, Option<String>) {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--single-user", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "--inventory"])
            .arg(repo_file("examples/cluster.yaml"))
            .arg("--policy")
            .arg(repo_file("examples/policy.yaml"))
            // Frequent snapshots and compaction, so that kills land around them too.
            .args(["--snapshot-every", "100"])
            .args(extra);
        let (child, addr, token) = common::spawn_serve(command, "http");
        (Daemon { child, url: format!("http://{addr}"), addr }, token)
    }

    fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    fn terminate(mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

fn workloads(addr: &str, token: &str) -> Vec<Value> {
    let (status, body) = http(addr, "GET", "/api/v1/workloads", token, None).expect("list");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON list");
    v["workloads"].as_array().cloned().unwrap_or_default()
}

/// `allot ARGS` against `daemon` with `token`: its exit code, stdout and stderr.
fn allot(daemon: &Daemon, token: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("ALLOT_URL", &daemon.url)
        .env("ALLOT_TOKEN", token)
        .output()
        .expect("allot runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), text, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allot-daemon-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Processes whose command line carries `marker`: the test's own workloads.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let zombie = stat.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'));
        if cmd.starts_with("sleep ") && cmd.contains(marker) && !zombie {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

fn kill_all(marker: &str) {
    for pid in processes_with(marker) {
        let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
    }
}

#[test]
fn acceptance_commands_work_as_written() {
    let dir = temp_dir("acceptance");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("a first start prints an admin token");
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("ALLOT_URL", &daemon.url)
            .env("ALLOT_TOKEN", &token)
            .output()
            .expect("allot runs");
        assert!(out.status.success(), "allot {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let id = cli(&[
        "submit",
        "--project",
        "vision",
        "--gpus",
        "1",
        "--kind",
        "batch",
        "--",
        "sleep",
        "30",
    ]);
    let id: u64 = id.trim().parse().expect("submit prints the id");
    let ls: Value = serde_json::from_str(&cli(&["ls", "--output", "json"])).expect("ls JSON");
    let listed =
        ls["workloads"].as_array().expect("workloads").iter().find(|w| w["id"] == id).cloned();
    assert!(listed.is_some_and(|w| w["state"].is_string()), "{ls}");
    let why: Value = serde_json::from_str(&cli(&["why", &id.to_string(), "--output", "json"]))
        .expect("why JSON");
    assert!(why["lines"].as_array().is_some_and(|l| !l.is_empty()), "{why}");
    let report: Value =
        serde_json::from_str(&cli(&["report", "--output", "json"])).expect("report JSON");
    assert!(report["rows"].is_array(), "{report}");
    let (status, metrics) = http(&daemon.addr, "GET", "/metrics", &token, None).expect("metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("allot_queue_length"), "{metrics}");
    let (status, doc) =
        http(&daemon.addr, "GET", "/api/v1/openapi.json", "", None).expect("openapi");
    assert_eq!(status, 200);
    assert!(doc.contains("\"openapi\""));
    // An offline token works against the running daemon.
    let out = Command::new(BIN)
        .args(["token", "create", "--data-dir"])
        .arg(&dir)
        .args(["--role", "viewer", "--name", "watcher"])
        .output()
        .expect("token create");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let viewer = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim().starts_with("allot_"))
        .map(|l| l.trim().to_string());
    let viewer = viewer.expect("token create prints the token");
    assert_eq!(http(&daemon.addr, "GET", "/api/v1/workloads", &viewer, None).expect("list").0, 200);
    assert_eq!(
        http(&daemon.addr, "POST", &format!("/api/v1/workloads/{id}/cancel"), &viewer, None)
            .expect("cancel")
            .0,
        403
    );
    cli(&["cancel", &id.to_string()]);
    // Several ids: an unknown one among them changes nothing; then all are acted on.
    let submit = || cli(&["submit", "--project", "vision", "--gpus", "1", "--", "sleep", "30"]);
    let (a, b) = (submit().trim().to_string(), submit().trim().to_string());
    let out = Command::new(BIN)
        .args(["cancel", &a, "999999", &b])
        .env("ALLOT_URL", &daemon.url)
        .env("ALLOT_TOKEN", &token)
        .output()
        .expect("allot runs");
    assert_eq!(out.status.code(), Some(4), "not found: {}", String::from_utf8_lossy(&out.stderr));
    let state = |id: &str| {
        let w: Value = serde_json::from_str(&cli(&["ls", "--output", "json"])).expect("ls JSON");
        let found = w["workloads"].as_array().and_then(|l| {
            l.iter()
                .find(|w| w["id"].as_u64().map(|v| v.to_string()).as_deref() == Some(id))
                .cloned()
        });
        found.map(|w| w["state"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
    };
    assert!(!["cancelled", "stopping"].contains(&state(&a).as_str()), "{a} was left alone");
    let text = cli(&["cancel", &a, &b]);
    assert_eq!(text.lines().count(), 2, "one line per workload: {text}");
    let (c, d) = (submit().trim().to_string(), submit().trim().to_string());
    let both: Value =
        serde_json::from_str(&cli(&["suspend", &c, &d, "--output", "json"])).expect("suspend JSON");
    assert_eq!(both["workloads"].as_array().map(Vec::len), Some(2), "{both}");
    for id in [&a, &b] {
        assert!(["cancelled", "stopping"].contains(&state(id).as_str()), "{id}: {}", state(id));
    }
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allot history export` writes a trace, the cluster file and the policy that `allot sim
/// replay` runs as written.
#[test]
fn the_exported_history_replays_with_sim_replay() {
    let dir = temp_dir("history");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("a first start prints an admin token");
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env("ALLOT_URL", &daemon.url)
            .env("ALLOT_TOKEN", &token)
            .output()
            .expect("allot runs");
        assert!(out.status.success(), "allot {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        (
            String::from_utf8(out.stdout).expect("UTF-8"),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut ids = Vec::new();
    for project in ["vision", "nlp"] {
        let (id, _) = cli(&["submit", "--project", project, "--gpus", "1", "--", "sleep", "31.5"]);
        ids.push(id.trim().to_string());
    }
    for _ in 0..200 {
        let running =
            workloads(&daemon.addr, &token).iter().filter(|w| w["state"] == "running").count();
        if running == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (trace, cluster, policy) =
        (dir.join("history.jsonl"), dir.join("cluster.yaml"), dir.join("policy.yaml"));
    let path = |p: &PathBuf| p.display().to_string();
    let (stdout, stderr) = cli(&[
        "history",
        "export",
        "--output",
        &path(&trace),
        "--cluster-output",
        &path(&cluster),
        "--policy-output",
        &path(&policy),
    ]);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("exported 2 jobs: 0 ended") && stderr.contains("2 running"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("--trace {}", path(&trace))), "{stderr}");
    let (report, _) = cli(&[
        "sim",
        "replay",
        "--trace",
        &path(&trace),
        "--cluster",
        &path(&cluster),
        "--policy",
        &path(&policy),
        "--output",
        "json",
    ]);
    let report: Value = serde_json::from_str(&report).expect("replay JSON");
    assert_eq!(report["jobs_total"], 2, "{report}");
    assert_eq!(report["jobs_finished"], 2, "{report}");
    // To stdout, as JSON with each job's duration basis.
    let (json, _) = cli(&["history", "export", "--json", "--limit", "1"]);
    let json: Value = serde_json::from_str(&json).expect("export JSON");
    assert_eq!(json["jobs"][0]["duration_basis"], "elapsed_lower_bound", "{json}");
    for id in &ids {
        cli(&["cancel", id]);
    }
    daemon.terminate();
    kill_all("31.5");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dcgm-exporter served on loopback: the real exporter's lines (from the shared fixture, an
/// L40S's `GR_ENGINE_ACTIVE` and a V100's `GPU_UTIL`) with their `gpu`, `device` and
/// `Hostname` labels set to every device of the example inventory, values varying per scrape.
fn serve_exporter() -> String {
    let fixture = std::fs::read_to_string(repo_file("../shared/fixtures/dcgm-exporter-sample.txt"))
        .expect("the shared dcgm-exporter fixture");
    let pick = |metric: &str, host: &str| {
        fixture
            .lines()
            .find(|l| l.starts_with(metric) && l.contains(&format!("Hostname=\"{host}\"")))
            .unwrap_or_else(|| panic!("no {metric} line of {host} in the fixture"))
            .to_string()
    };
    let engine = pick("DCGM_FI_PROF_GR_ENGINE_ACTIVE{", "l40s.example.com");
    let util = pick("DCGM_FI_DEV_GPU_UTIL{", "r6i3n0");
    let relabel = |line: &str, node: &str, gpu: u32, value: &str| {
        let (labels, _) = line.rsplit_once(' ').expect("a sample line");
        let labels = set_label(labels, "gpu", &gpu.to_string());
        let labels = set_label(&labels, "device", &format!("nvidia{gpu}"));
        format!("{} {value}", set_label(&labels, "Hostname", node))
    };
    // The example inventory: node and device count.
    let devices: [(&str, u32); 6] =
        [("h100-0", 8), ("h100-1", 8), ("a100-0", 4), ("a100-1", 4), ("v100-0", 4), ("l4-0", 2)];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut scrape = 0u32;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            scrape += 1;
            let mut page = String::from(
                "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n",
            );
            for (node, count) in devices {
                for gpu in 0..count {
                    let busy = !(gpu + scrape).is_multiple_of(3);
                    page.push_str(&relabel(
                        &engine,
                        node,
                        gpu,
                        if busy { "0.610000" } else { "0.000000" },
                    ));
                    page.push('\n');
                }
            }
            page.push_str("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n");
            for (node, count) in devices {
                for gpu in 0..count {
                    page.push_str(&relabel(&util, node, gpu, "55"));
                    page.push('\n');
                }
            }
            let mut request = [0u8; 2048];
            let _ = std::io::Read::read(&mut stream, &mut request);
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = std::io::Write::write_all(&mut stream, answer.as_bytes());
        }
    });
    url
}

/// A tiny seeded generator (SplitMix64) so that a failing round can be replayed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn kill_9_during_submission_bursts_loses_and_duplicates_nothing() {
    let slow = std::env::var("ALLOT_SLOW_TESTS").is_ok_and(|v| v == "1");
    let (rounds, burst) = if slow { (20, 1000) } else { (3, 150) };
    let seed: u64 =
        std::env::var("ALLOT_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42);
    eprintln!("SEED={seed} rounds={rounds} burst={burst}");
    let mut rng = seed;
    let dir = temp_dir("kill9");
    let marker = format!("{}.{seed}", 3000 + std::process::id() % 1000);
    let mut acknowledged: Vec<u64> = Vec::new();
    let mut token = None;
    // Telemetry on, as people run it: a dcgm-exporter page on loopback, read every 2 s.
    let exporter = vec!["--telemetry".to_string(), format!("dcgm-exporter={}", serve_exporter())];
    let mut sampled_rounds = 0;
    for round in 0..rounds {
        let (daemon, first) = Daemon::start_with(&dir, &exporter);
        if token.is_none() {
            token = first;
        }
        let token = token.clone().expect("admin token from the first start");
        // After the restart: everything acknowledged before is there exactly once.
        let listed = workloads(&daemon.addr, &token);
        let mut ids: Vec<u64> = listed.iter().filter_map(|w| w["id"].as_u64()).collect();
        let total = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), total, "round {round}: a workload is listed twice");
        for id in &acknowledged {
            assert!(
                ids.binary_search(id).is_ok(),
                "round {round}: acknowledged workload {id} is lost (SEED={seed})"
            );
        }
        // Children: re-adopted (pids alive and listed) or accounted for; none twice, none orphaned.
        std::thread::sleep(Duration::from_millis(300));
        let listed = workloads(&daemon.addr, &token);
        let live: Vec<u32> = processes_with(&marker);
        let mut claimed: Vec<u32> = listed
            .iter()
            .filter(|w| w["state"] == "running")
            .flat_map(|w| w["pids"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p.as_u64().map(|p| p as u32))
            .collect();
        claimed.sort_unstable();
        for pid in &claimed {
            assert!(
                live.contains(pid),
                "round {round}: running workload's pid {pid} is not alive (SEED={seed})"
            );
        }
        let running = listed
            .iter()
            .filter(|w| matches!(w["state"].as_str(), Some("running" | "starting" | "stopping")))
            .count();
        assert!(
            live.len() <= running,
            "round {round}: {} workload processes for {running} running workloads — a duplicate or an orphan (SEED={seed})",
            live.len()
        );

        // A burst from 4 threads; the daemon is killed at a random point in it.
        let kill_after = Duration::from_millis(splitmix(&mut rng) % (burst as u64 * 2 / 3));
        let acks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let addr = daemon.addr.clone();
                let token = token.clone();
                let acks = acks.clone();
                let marker = marker.clone();
                std::thread::spawn(move || {
                    for i in 0..burst / 4 {
                        let project = ["vision", "nlp", "research", "speech"][(i + t) % 4];
                        let body = format!(
                            r#"{{"project": "{project}", "gpus": 1, "kind": "batch", "command": ["sleep", "{marker}"]}}"#
                        );
                        match http(&addr, "POST", "/api/v1/workloads", &token, Some(&body)) {
                            Ok((201, body)) => {
                                let v: Value = serde_json::from_str(&body).expect("submit JSON");
                                acks.lock().expect("acks").push(v["id"].as_u64().expect("id"));
                            }
                            // The daemon is gone (refused, or reset mid-answer): not acknowledged.
                            Ok((0, _)) | Err(_) => return,
                            Ok((status, body)) => panic!("submission refused: {status} {body}"),
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(kill_after);
        // Running workloads were sampled before the kill (the telemetry round is 5 s: wait for
        // one in some rounds, so the log the next start reads holds `sampled` entries).
        if round % 3 == 0 {
            for _ in 0..150 {
                let (_, metrics) =
                    http(&daemon.addr, "GET", "/metrics", &token, None).unwrap_or_default();
                if metrics
                    .lines()
                    .any(|l| l.starts_with("allot_measured_gpus{") && !l.ends_with(" 0.0"))
                {
                    sampled_rounds += 1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        daemon.kill9();
        for t in threads {
            t.join().expect("submitter");
        }
        let mut got = acks.lock().expect("acks").clone();
        eprintln!("round {round}: killed after {kill_after:?}, {} acknowledged", got.len());
        acknowledged.append(&mut got);
    }
    assert!(sampled_rounds > 0, "no round had running workloads sampled before its kill");
    // Last restart: everything is there; then clean up.
    let (daemon, _) = Daemon::start_with(&dir, &exporter);
    let token = token.expect("token");
    let listed = workloads(&daemon.addr, &token);
    let ids: std::collections::BTreeSet<u64> =
        listed.iter().filter_map(|w| w["id"].as_u64()).collect();
    assert_eq!(ids.len(), listed.len(), "no duplicates");
    for id in &acknowledged {
        assert!(ids.contains(id), "acknowledged workload {id} is lost (SEED={seed})");
    }
    eprintln!(
        "{} acknowledged, {} listed after {rounds} kills; {sampled_rounds} rounds sampled by telemetry before the kill",
        acknowledged.len(),
        listed.len()
    );
    daemon.kill9();
    kill_all(&marker);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_agent_forwards_its_hosts_readings_to_the_daemon() {
    let dir = temp_dir("agent");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("admin token");
    // amdgpu sysfs as recorded (card0: 63 % busy), read as node h100-0's device 0.
    let sysfs = repo_file("crates/allot-telemetry/tests/data/sysfs");
    let out = Command::new(BIN)
        .args(["agent", "--url", &daemon.url, "--token", &token, "--hostname", "h100-0"])
        .arg("--source")
        .arg(format!("sysfs={}", sysfs.display()))
        .args(["--interval-ms", "200", "--seconds", "2"])
        .output()
        .expect("allot agent runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.starts_with("0 samples"), "{stdout}");
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics =
            http(&daemon.addr, "GET", "/metrics", &token, None).map(|r| r.1).unwrap_or_default();
        if metrics.contains("allot_device_activity{node=\"h100-0\",device=\"0\"") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = metrics
        .lines()
        .find(|l| l.starts_with("allot_device_activity{node=\"h100-0\",device=\"0\""))
        .unwrap_or_else(|| panic!("no device activity for h100-0/0:\n{metrics}"));
    assert!(line.ends_with(" 0.63"), "{line}");
    // A bad source is refused by name, before anything is posted.
    let out = Command::new(BIN)
        .args(["agent", "--url", &daemon.url, "--token", &token, "--source", "gpu-magic"])
        .output()
        .expect("allot agent runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--source gpu-magic"));
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allot policy history`, `show --version N [--diff]` and `rollback [N]`: each applied policy
/// is a version, readable and diffable by number; a rollback brings one back as a new version,
/// across a restart too.
#[test]
fn policy_versions_through_the_cli_survive_a_restart() {
    let dir = temp_dir("policy-versions");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("a first start prints an admin token");
    let run = |daemon: &Daemon, args: &[&str]| allot(daemon, &token, args);
    let cli = |daemon: &Daemon, args: &[&str]| {
        let (code, out, err) = run(daemon, args);
        assert_eq!(code, Some(0), "allot {args:?}: {out}{err}");
        out
    };
    let original = std::fs::read_to_string(repo_file("examples/policy.yaml")).expect("policy");
    let edited = dir.join("edited.yaml");
    std::fs::write(&edited, original.replacen("half_life: 7d", "half_life: 1d", 1)).expect("write");
    let edited = edited.display().to_string();
    let said = cli(&daemon, &["policy", "apply", &edited]);
    assert!(said.starts_with("applied: the daemon's policy is now version 2"), "{said}");
    let history = cli(&daemon, &["policy", "history"]);
    let lines: Vec<&str> = history.lines().collect();
    assert!(lines[0].starts_with("VERSION"), "{history}");
    assert!(lines[1].starts_with("1 ") && lines[1].contains("first start"), "{history}");
    assert!(lines[2].starts_with("2* ") && lines[2].contains("+1 -1 lines"), "{history}");
    assert!(lines[2].contains(&edited), "{history}");
    let diff = cli(&daemon, &["policy", "show", "--version", "2", "--diff"]);
    assert!(diff.contains("-  half_life: 7d") && diff.contains("+  half_life: 1d"), "{diff}");
    assert_eq!(cli(&daemon, &["policy", "show", "--version", "1"]), original);
    let (code, _, err) = run(&daemon, &["policy", "show", "--version", "7"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("no policy version 7"), "{err}");
    daemon.terminate();

    let (daemon, _) = Daemon::start(&dir);
    let said = cli(&daemon, &["policy", "rollback"]);
    assert!(said.starts_with("rolled back: the daemon's policy is now version 3"), "{said}");
    assert_eq!(cli(&daemon, &["policy", "show"]), original);
    let history = cli(&daemon, &["policy", "history"]);
    assert!(
        history.lines().nth(3).is_some_and(|l| l.starts_with("3* ") && l.contains("(back to 1)")),
        "{history}"
    );
    let (code, _, err) = run(&daemon, &["policy", "rollback", "1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("has the text of the policy in effect"), "{err}");
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allot policy apply FILE --shadow`, `allot policy shadow [--stop]`: a candidate that would
/// start vision's waiting job now is counted, not executed.
#[test]
fn a_policy_in_shadow_through_the_cli() {
    let dir = temp_dir("policy-shadow");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("a first start prints an admin token");
    let run = |args: &[&str]| allot(&daemon, &token, args);
    let cli = |args: &[&str]| {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(0), "allot {args:?}: {out}{err}");
        out
    };
    let submit = |gpus: &str| {
        let id = cli(&[
            "submit",
            "--project",
            "vision",
            "--gpus",
            gpus,
            "--kind",
            "batch",
            "--",
            "sleep",
            "60",
        ]);
        id.trim().to_string()
    };
    let (a, b) = (submit("8"), submit("4"));
    let policy = std::fs::read_to_string(repo_file("examples/policy.yaml")).expect("policy");
    let candidate = dir.join("generous.yaml");
    std::fs::write(
        &candidate,
        policy.replacen(
            "{model: H100, guaranteed: 8, borrow_limit: 8, lend_limit: 4}",
            "{model: H100, guaranteed: 10, borrow_limit: 8, lend_limit: 4}",
            1,
        ),
    )
    .expect("write");
    let (code, _, err) = run(&["policy", "shadow"]);
    assert_eq!(code, Some(4), "no shadow yet: {err}");
    let said = cli(&["policy", "apply", &candidate.display().to_string(), "--shadow"]);
    assert!(said.starts_with("in shadow: "), "{said}");
    let waiting = submit("2");
    let mut tries = 0;
    let report = loop {
        let json: Value = serde_json::from_str(&cli(&["policy", "shadow", "--output", "json"]))
            .expect("shadow JSON");
        let vision = json["projects"]
            .as_array()
            .and_then(|p| p.iter().find(|r| r["project"] == "vision").cloned());
        if vision.is_some_and(|v| v["sooner"] == 1) {
            break json;
        }
        tries += 1;
        assert!(tries < 100, "never counted in 20 s: {json}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(report["failed_cycles"], 0, "{report}");
    let ls: Value = serde_json::from_str(&cli(&["ls", "--output", "json"])).expect("ls JSON");
    let state = |id: &str| {
        ls["workloads"].as_array().and_then(|w| {
            w.iter()
                .find(|w| w["id"].as_u64().is_some_and(|i| i.to_string() == id))
                .map(|w| w["state"].clone())
        })
    };
    assert_eq!(
        state(&waiting),
        Some(Value::from("pending")),
        "shadow decisions are not executed: {ls}"
    );
    assert!(
        [state(&a), state(&b)].iter().all(|s| s.as_ref().is_some_and(|s| s == "running")),
        "{ls}"
    );
    let text = cli(&["policy", "shadow"]);
    assert!(text.contains("PROJECT") && text.lines().any(|l| l.starts_with("vision ")), "{text}");
    let stopped = cli(&["policy", "shadow", "--stop"]);
    assert!(stopped.lines().next().is_some_and(|l| l.ends_with("; stopped")), "{stopped}");
    let (code, _, _) = run(&["policy", "shadow"]);
    assert_eq!(code, Some(4));
    for id in [a, b, waiting] {
        cli(&["cancel", &id]);
    }
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `allot policy apply FILE --scope … --rollback-if …`, `allot policy rollout`: a rollout to
/// one project, its conditions with their figures, and `policy rollback` ending it.
#[test]
fn a_scoped_rollout_through_the_cli() {
    let dir = temp_dir("policy-rollout");
    let (daemon, token) = Daemon::start(&dir);
    let token = token.expect("a first start prints an admin token");
    let run = |args: &[&str]| allot(&daemon, &token, args);
    let cli = |args: &[&str]| {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(0), "allot {args:?}: {out}{err}");
        out
    };
    let (code, _, err) = run(&["policy", "rollout"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no scoped rollout"), "{err}");
    let original = std::fs::read_to_string(repo_file("examples/policy.yaml")).expect("policy");
    let candidate = dir.join("nlp-weight.yaml");
    std::fs::write(&candidate, original.replacen("    weight: 1.5\n", "    weight: 3\n", 1))
        .expect("write");
    let candidate = candidate.display().to_string();
    let (code, _, err) = run(&["policy", "apply", &candidate, "--rollback-if", "p95_wait>2x"]);
    assert_eq!(code, Some(2), "conditions need a scope: {err}");
    let said = cli(&[
        "policy",
        "apply",
        &candidate,
        "--scope",
        "project=nlp",
        "--rollback-if",
        "p95_wait>2x",
        "--rollback-if",
        "failure_rate>0.25",
        "--baseline",
        "1d",
    ]);
    assert!(said.starts_with("applied: the daemon's policy is now version 2"), "{said}");
    assert!(said.contains("to project=nlp") && said.contains("carried: project nlp"), "{said}");
    let rollout = cli(&["policy", "rollout"]);
    assert!(rollout.contains("baseline: the 1d"), "{rollout}");
    assert!(rollout.contains("p95_wait>2x") && rollout.contains("failure_rate>0.25"), "{rollout}");
    assert!(rollout.contains("not judged: 0 of 5 observations since the rollout"), "{rollout}");
    let shown = cli(&["policy", "show"]);
    assert!(shown.starts_with("# Scoped rollout of"), "{shown}");
    let history = cli(&["policy", "history"]);
    assert!(history.contains("scoped to project=nlp"), "{history}");
    cli(&["policy", "rollback"]);
    let rollout = cli(&["policy", "rollout"]);
    assert!(rollout.contains("ended: rolled back by admin as version 3"), "{rollout}");
    assert_eq!(cli(&["policy", "show"]), original);
    daemon.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
