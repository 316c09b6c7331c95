//! The issue's acceptance commands, run against the built binary.

mod common;

use common::{allot, repo, text};

use std::path::{Path, PathBuf};

#[test]
fn validate_accepts_the_example_policy() {
    let out = allot(&["policy", "validate", "examples/policy.yaml"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok"));
    assert!(
        text(&out.stdout)
            .contains("pre-emption guard: restarted work is exempt for 2m, no cap per workload"),
        "{}",
        text(&out.stdout)
    );
    let capped = broken("capped", |p| {
        p.replace(
            "  # max_per_workload: {count: 3, window: 6h}",
            "  max_per_workload: {count: 3, window: 6h}",
        )
    });
    let out = allot(&["policy", "validate", capped.to_str().expect("utf-8 path")]);
    assert!(
        text(&out.stdout).contains("at most 3 pre-emptions per workload per 6h00m"),
        "{}",
        text(&out.stdout)
    );
    let out = allot(&[
        "policy",
        "validate",
        "examples/policy.yaml",
        "--cluster",
        "examples/cluster.yaml",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
}

/// Writes a broken copy of the example policy and returns its path.
fn broken(name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let original = std::fs::read_to_string(repo().join("examples/policy.yaml")).expect("example");
    let edited = edit(&original);
    assert_ne!(edited, original, "{name}: the edit changed nothing");
    let dir = std::env::temp_dir().join(format!("allot-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, edited).expect("write");
    path
}

fn assert_rejected(path: &Path, must_mention: &[&str]) {
    let before = std::fs::read(path).expect("read");
    let out = allot(&["policy", "validate", path.to_str().expect("utf-8 path")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: stderr {err}", path.display());
    assert!(!err.contains("panicked"), "{err}");
    let first = err.lines().next().unwrap_or("");
    // file:line:column: field: message — fix: …
    let file = path.display().to_string();
    assert!(first.starts_with(&format!("{file}:")), "no file and line in {first:?}");
    assert!(first.contains("fix:") || err.contains("fix:"), "no fix in {err}");
    for word in must_mention {
        assert!(err.contains(word), "{}: {word:?} not in {err}", path.display());
    }
    assert_eq!(std::fs::read(path).expect("read"), before, "validate changed its input");
}

#[test]
fn validate_rejects_broken_policies_with_line_and_field() {
    let truncated = broken("truncated", |s| {
        let cut = s.find("projects:").expect("projects key") + 40;
        let mut t = s[..cut].to_string();
        t.push_str("\n  - name: [unclosed\n");
        t
    });
    assert_rejected(&truncated, &[]);

    let wrong_type = broken("wrong-type", |s| replace_first_value(s, "value:", "high-ish"));
    assert_rejected(&wrong_type, &["value"]);

    let negative = broken("negative", |s| replace_first_value(s, "guaranteed:", "-4"));
    assert_rejected(&negative, &["guaranteed", "-4"]);

    let unknown_class =
        broken("unknown-class", |s| replace_first_value(s, "default_priority_class:", "platinum"));
    assert_rejected(&unknown_class, &["default_priority_class", "platinum"]);

    let duplicate = broken("duplicate-project", |s| {
        let first = first_value(s, "  - name:", "projects:");
        let second_at = s.find("projects:").expect("projects");
        let rest = &s[second_at..];
        let idx = rest.match_indices("  - name:").nth(1).expect("a second project").0 + second_at;
        let line_end = s[idx..].find('\n').expect("eol") + idx;
        format!("{}  - name: {first}{}", &s[..idx], &s[line_end..])
    });
    assert_rejected(&duplicate, &["duplicate", "projects["]);
}

fn first_value(s: &str, key: &str, after: &str) -> String {
    let start = s.find(after).unwrap_or(0);
    let at = s[start..].find(key).expect("key") + start + key.len();
    let end = s[at..].find('\n').expect("eol") + at;
    s[at..end].split('#').next().unwrap_or("").trim().to_string()
}

/// Replaces the value after the first occurrence of `key` (up to `,`, `}` or the line end,
/// so that flow mappings stay well-formed).
fn replace_first_value(s: &str, key: &str, value: &str) -> String {
    let at = s.find(key).unwrap_or_else(|| panic!("{key} not in example")) + key.len();
    let end = s[at..].find([',', '}', '\n']).expect("end of value") + at;
    format!("{} {value}{}", &s[..at], &s[end..])
}

#[test]
fn plan_prints_json_decisions() {
    let out = allot(&[
        "plan",
        "--cluster",
        "examples/cluster.yaml",
        "--policy",
        "examples/policy.yaml",
        "--workloads",
        "examples/workloads.yaml",
        "--output",
        "json",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let decisions = doc["decisions"].as_array().expect("decisions array");
    assert!(!decisions.is_empty());
    for d in decisions {
        for field in ["workload", "action", "reason"] {
            assert!(d[field].is_string(), "{field} missing in {d}");
        }
    }
    let actions: Vec<&str> = decisions.iter().filter_map(|d| d["action"].as_str()).collect();
    assert!(actions.contains(&"admit"), "{actions:?}");
    assert!(actions.contains(&"defer"), "{actions:?}");
}

#[test]
fn plan_runs_on_embedded_defaults() {
    let out = allot(&["plan", "--explain"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("admit"), "{stdout}");
    assert!(stdout.contains("position"), "{stdout}");
}

#[test]
fn plan_reports_all_broken_files_at_once() {
    let dir = std::env::temp_dir().join(format!("allot-cli-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cluster = dir.join("cluster.yaml");
    let workloads = dir.join("workloads.yaml");
    std::fs::write(&cluster, "nodes:\n  - name: a\n    cpu: lots\n").expect("write");
    std::fs::write(&workloads, "workloads:\n  - name: w\n    project: vision\n    gpus: -1\n")
        .expect("write");
    let out = allot(&[
        "plan",
        "--cluster",
        cluster.to_str().expect("utf-8"),
        "--workloads",
        workloads.to_str().expect("utf-8"),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cluster.yaml:3"), "{err}");
    assert!(err.contains("workloads.yaml:4"), "{err}");
}

/// `allot plan` with the cluster and policy of an `examples/plans/` folder.
fn plan_in(dir: &str, workloads: &str, extra: &[&str]) -> std::process::Output {
    let (cluster, policy) = (format!("{dir}/cluster.yaml"), format!("{dir}/policy.yaml"));
    let mut args = vec!["plan", "--cluster", &cluster, "--policy", &policy];
    args.extend(["--workloads", workloads]);
    args.extend(extra);
    allot(&args)
}

/// `allot plan` over a cluster where work already runs: the Kueue test restated as plan
/// files in `examples/plans/`, and running work stated wrongly.
#[test]
fn plan_takes_running_work_as_stated() {
    let dir = "examples/plans/kueue-reclaim-under-guarantee";
    let run = |workloads: &str| plan_in(dir, workloads, &[]);
    let out = run(&format!("{dir}/workloads.yaml"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for line in [
        "7 workloads (6 running)",
        "[1] preempt a1: suspend for in: priority in a: 0 outranks -1",
        "[1] preempt b5: suspend for in: quota reclaim: b borrows 3 A100",
        "[2] admit in: within a's guarantee (2/2 A100 used); on A100 gpu-0[0,5]",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    assert_eq!(stdout.matches("preempt").count(), 2, "{stdout}");

    let bad = std::env::temp_dir().join(format!("allot-cli-running-{}.yaml", std::process::id()));
    std::fs::write(
        &bad,
        "workloads:\n  \
         - {name: a1, project: a, gpus: 1, running: {node: gpu-0, devices: [0], since: 2h}}\n  \
         - {name: a2, project: a, gpus: 1, running: {node: gpu-0, devices: [0]}}\n  \
         - {name: a3, project: a, gpus: 1, running: {node: gpu-9}}\n  \
         - {name: a4, project: a, gpus: 1, running: {node: gpu-0, since: 1h, last_checkpoint: 2h}}\n",
    )
    .expect("write");
    let out = run(bad.to_str().expect("utf-8"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("last_checkpoint: its last checkpoint (2h ago) is before it started"),
        "{err}"
    );
    // Parse errors first; once the file reads, the placements are checked all at once.
    std::fs::write(
        &bad,
        "workloads:\n  \
         - {name: a1, project: a, gpus: 1, running: {node: gpu-0, devices: [0], since: 2h}}\n  \
         - {name: a2, project: a, gpus: 1, running: {node: gpu-0, devices: [0]}}\n  \
         - {name: a3, project: a, gpus: 1, running: {node: gpu-9}}\n  \
         - {name: a4, project: a, gpus: 2, running: {node: gpu-0, devices: [7]}}\n",
    )
    .expect("write");
    let out = run(bad.to_str().expect("utf-8"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for part in [
        ":3:47: workloads[1].running.devices: GPU 0 of gpu-0 is already stated as running `a1`",
        ":4:47: workloads[2].running.node: no node `gpu-9` in the cluster",
        ":5:47: workloads[3].running.devices: 1 device(s) listed; each member asks 2",
        "3 problem(s) found; nothing was changed.",
    ] {
        assert!(err.contains(part), "missing {part:?} in\n{err}");
    }
    let _ = std::fs::remove_file(&bad);

    // Departments with quota of their own, as the README shows them.
    let dir = "examples/plans/departments";
    let out = plan_in(dir, &format!("{dir}/workloads.yaml"), &["--explain"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout
            .contains("[1] preempt train: suspend for infer: quota reclaim: vision borrows 6 H100"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[2] admit infer: within serving's guarantee (8/8 H100 used)"),
        "{stdout}"
    );
}

#[test]
fn readme_idle_rules_are_a_valid_policy() {
    // The README's idle-rule example, under the projects and classes of the idle experiment's
    // policy: the documentation stays true.
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let rules = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.starts_with("idle:"))
        .expect("a yaml block of idle rules in the README");
    let policy = std::fs::read_to_string(repo().join("examples/idle/allot.yaml")).expect("policy");
    let head = policy.split("\nidle:").next().expect("a head");
    let dir = std::env::temp_dir().join(format!("allot-cli-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("readme-policy.yaml");
    std::fs::write(&path, format!("{head}\n{rules}")).expect("write");
    let out = allot(&["policy", "validate", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for rule in ["idle rule notebooks", "idle rule runai: runai", "idle rule amd: amd_rm"] {
        assert!(stdout.contains(rule), "{rule} missing from:\n{stdout}");
    }
}

/// `--output` names a format everywhere but in `history export`, where it takes a file: a bare
/// format name is refused before anything is fetched or written (issue 25).
#[test]
fn history_export_refuses_a_format_name_as_its_output_file() {
    let dir = std::env::temp_dir().join(format!("allot-history-output-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["history", "export", "--output", "json"])
        .current_dir(&dir)
        .env("ALLOT_URL", "http://127.0.0.1:9")
        .env("ALLOT_TOKEN", "allot_x")
        .output()
        .expect("run allot");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--json"), "{}", text(&out.stderr));
    assert!(!dir.join("json").exists(), "a file named json was written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn why_names_the_two_forms_of_a_workload_reference_when_given_neither() {
    for (arg, says) in [
        ("slurm:abc", "a Slurm job id is a number, as in slurm:1234"),
        ("12x", "give a workload id (a number), a Slurm job id as slurm:1234, or a Kubernetes"),
        ("ns/a/b", "namespace/pod, namespace/job:name or namespace/jobset:name"),
    ] {
        let out = allot(&["why", arg]);
        assert_eq!(out.status.code(), Some(2), "{arg}");
        assert!(text(&out.stderr).contains(says), "{arg}: {}", text(&out.stderr));
    }
}
