//! The client verbs without a daemon: argument parsing, request files, exit codes when the
//! daemon is unreachable, completions and the man page. (Against a running daemon:
//! tests/daemon.rs.)

mod common;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use common::{allot, repo, text};

/// A port on this host where nothing listens: bound, then released.
fn closed_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local address").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// Runs `allot` with ALLOT_URL and ALLOT_TOKEN set as given (unset when `None`).
fn allot_env(args: &[&str], url: Option<&str>, stdin: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_allot"));
    command.args(args).current_dir(repo()).env_remove("ALLOT_TOKEN").env_remove("ALLOT_CA_CERT");
    match url {
        Some(url) => command.env("ALLOT_URL", url),
        None => command.env_remove("ALLOT_URL"),
    };
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("run allot");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("allot output")
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allot-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[test]
fn submit_flags_become_a_submit_request() {
    let out = allot(&[
        "submit",
        "--project",
        "vision",
        "--gpus",
        "0.25",
        "--kind",
        "training",
        "--name",
        "resnet",
        "--members",
        "2",
        "--gpu-model",
        "H100",
        "--gpu-model",
        "A100",
        "--priority-class",
        "high",
        "--checkpoint-grace",
        "30s",
        "--max-runtime",
        "2h",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--non-preemptible",
        "--dry-run",
        "--",
        "python",
        "train.py",
        "--epochs",
        "3",
    ]);
    assert_eq!(
        json(&out),
        serde_json::json!({
            "name": "resnet",
            "project": "vision",
            "kind": "training",
            "gpus": 0.25,
            "members": 2,
            "gpu_models": ["H100", "A100"],
            "priority_class": "high",
            "same_node": false,
            "preemptible": false,
            "checkpoint_grace_s": 30,
            "max_runtime_s": 7200,
            "command": ["python", "train.py", "--epochs", "3"],
            "env": {"A": "1", "B": "x=y"},
        })
    );
}

#[test]
fn submit_reads_yaml_json_and_stdin_alike() {
    let expected = serde_json::json!({
        "project": "nlp",
        "gpus": 2.0,
        "same_node": true,
        "command": ["sleep", "60"],
        "env": {"SEED": "7"},
    });
    let yaml = temp_file(
        "job.yaml",
        "project: nlp\ngpus: 2.0\nsame_node: true\ncommand: [sleep, \"60\"]\nenv:\n  SEED: \"7\"\n",
    );
    let out = allot(&["submit", yaml.to_str().expect("utf-8"), "--dry-run"]);
    assert_eq!(json(&out), expected);
    let body = r#"{"project": "nlp", "gpus": 2.0, "same_node": true, "command": ["sleep", "60"], "env": {"SEED": "7"}}"#;
    let json_file = temp_file("job.json", body);
    let out = allot(&["submit", json_file.to_str().expect("utf-8"), "--dry-run"]);
    assert_eq!(json(&out), expected);
    let out = allot_env(&["submit", "-", "--dry-run"], None, Some(body));
    assert_eq!(json(&out), expected);
}

#[test]
fn a_request_file_with_an_unknown_field_names_the_field_the_file_and_the_line() {
    let path = temp_file("typo.yaml", "project: nlp\ngpu: 4\ncommand: [train]\n");
    let file = path.to_str().expect("utf-8");
    let out = allot(&["submit", file, "--dry-run"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with(&format!("{file}:2: unknown field `gpu`")), "{err}");
    assert!(err.contains("`gpus`") && err.contains("fix:"), "{err}");
    assert!(out.stdout.is_empty());

    let path = temp_file("missing.json", r#"{"gpus": 1, "command": ["x"]}"#);
    let out = allot(&["submit", path.to_str().expect("utf-8"), "--dry-run"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("missing field `project`") && err.contains("missing.json"), "{err}");

    for (name, contents, words) in [
        ("broken.yaml", "project: [unclosed\n", &["broken.yaml:", "YAML syntax error"][..]),
        ("broken.json", "{\"project\": ", &["broken.json:1:", "JSON syntax error"][..]),
        ("job.toml", "project = 'x'", &["job.toml", ".yaml, .yml or .json"][..]),
    ] {
        let path = temp_file(name, contents);
        let out = allot(&["submit", path.to_str().expect("utf-8"), "--dry-run"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        for word in words {
            assert!(err.contains(word), "{name}: {word:?} not in {err}");
        }
    }
    let out = allot(&["submit", "no/such/job.yaml", "--dry-run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no/such/job.yaml: cannot read"));
}

#[test]
fn submit_usage_errors_exit_2() {
    for args in [
        &["submit", "job.yaml", "--project", "x"][..],
        &["submit", "--project", "x"][..],
        &["submit", "--project", "x", "--gpus", "1", "--mig", "1g.10gb", "--", "x"][..],
        &["submit", "--project", "x", "--max-runtime", "2 hours", "--", "x"][..],
        &["submit", "--project", "x", "--env", "NOVALUE", "--", "x"][..],
        &["submit", "--project", "x", "--kind", "party", "--", "x"][..],
    ] {
        let out = allot(&args.iter().chain(&["--dry-run"]).copied().collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn an_unreachable_daemon_exits_6_and_says_what_to_check() {
    let url = closed_url();
    for args in [
        &["ls"][..],
        &["why", "1"][..],
        &["cancel", "1"][..],
        &["logs", "1"][..],
        &["projects", "--output", "json"][..],
        &["nodes"][..],
        &["report"][..],
        &["policy", "show"][..],
        &["policy", "diff", "examples/policy.yaml"][..],
        &["policy", "validate", "examples/policy.yaml", "--remote"][..],
        &["token", "create", "--role", "viewer", "--name", "ci"][..],
        &["submit", "--project", "x", "--", "true"][..],
    ] {
        let out = allot_env(args, Some(&url), None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "{args:?}: {err}");
        assert!(err.contains(&format!("is `allot serve` running at {url}?")), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // --url wins over ALLOT_URL.
    let out = allot_env(&["ls", "--url", &url], Some("http://192.0.2.1:1"), None);
    assert_eq!(out.status.code(), Some(6));
    assert!(text(&out.stderr).contains(&url));
}

#[test]
fn local_problems_are_found_before_the_daemon_is_asked() {
    let url = closed_url();
    // A bad address is a usage error, whatever the daemon.
    let out = allot_env(&["ls", "--url", "127.0.0.1:7380"], None, None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A missing local file is invalid input, not an unreachable daemon.
    let out = allot_env(&["policy", "diff", "no/such/policy.yaml"], Some(&url), None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // A member token without projects could see nothing.
    let out =
        allot_env(&["token", "create", "--role", "member", "--name", "ana"], Some(&url), None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--project"));
    // `top` without a terminal (the test's pipes) refuses rather than panics.
    let out = allot_env(&["top"], Some(&url), None);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("needs a terminal") && !err.contains("panicked"), "{err}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    for (shell, marker) in
        [("bash", "complete -F"), ("zsh", "#compdef allot"), ("fish", "complete -c allot")]
    {
        let out = allot(&["completions", shell]);
        let script = text(&out.stdout);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        for verb in ["submit", "serve", "logs", "policy"] {
            assert!(script.contains(verb), "{shell}: {verb} missing");
        }
    }
    let out = allot(&["completions", "powershell"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_man_page_is_generated() {
    let out = allot(&["man"]);
    let page = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(page.contains(".TH allot 1"), "{page}");
    for verb in ["serve", "submit", "top", "completions"] {
        assert!(page.contains(verb), "{verb} missing from the man page");
    }
}

#[test]
fn help_lists_the_exit_codes() {
    let out = allot(&["--help"]);
    let help = text(&out.stdout);
    assert!(out.status.success());
    for line in ["6  the daemon is unreachable", "4  not found", "5  not allowed", "ALLOT_TOKEN"] {
        assert!(help.contains(line), "{line:?} missing from --help");
    }
}
