//! What needs no cluster: the sbatch arguments of a launch, launches refused before anything
//! reaches Slurm, and the command runner's errors (timeouts, missing binaries).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use allot_backend::{
    Backend, BackendError, DeviceAssignment, Launch, MemberLaunch, Observation, RunId, StopSignal,
    Vendor,
};
use allot_backend_slurm::{Runner, SlurmBackend, SlurmConfig, Tool};

fn gpu(index: u32) -> DeviceAssignment {
    DeviceAssignment { index, uuid: None, vendor: Vendor::Nvidia, shares: 1000 }
}

/// A config whose Slurm commands do not exist: any call reaching Slurm fails loudly.
fn offline_config() -> SlurmConfig {
    let mut config = SlurmConfig::new();
    config.runner.bin_dir = Some(PathBuf::from("/nonexistent/slurm/bin"));
    config.default_account = Some("research".into());
    config.partition = Some("gpu".into());
    config
}

fn launch(members: Vec<MemberLaunch>) -> Launch {
    Launch {
        run: RunId { workload: 42, attempt: 3 },
        command: vec!["true".into()],
        env: BTreeMap::from([("ALLOT_PROJECT".to_string(), "vision".to_string())]),
        members,
        log_dir: PathBuf::from("/shared/allot/logs/42.3"),
        adopt: None,
        resources: Default::default(),
    }
}

#[test]
fn sbatch_arguments_of_a_two_node_launch() {
    let backend = SlurmBackend::new(offline_config());
    let member = |node: &str| MemberLaunch { node: node.into(), devices: vec![gpu(0), gpu(1)] };
    let args = backend.sbatch_args(&launch(vec![member("n2"), member("n1")]));
    assert_eq!(
        args,
        [
            "--parsable",
            "--job-name=allot-42.3",
            "--comment=allot:42.3",
            "--nodes=2",
            "--nodelist=n1,n2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--output=/shared/allot/logs/42.3/batch.log",
            "--chdir=/shared/allot/logs/42.3",
            "--no-requeue",
            "--export=ALL",
            "--hold",
            "--gres=gpu:2",
            "--account=vision",
            "--partition=gpu",
        ]
    );
    assert_eq!(backend.job_name(RunId { workload: 7, attempt: 1 }), "allot-7.1");
}

#[test]
fn one_member_writes_member_0_log_and_uses_the_default_account() {
    let backend = SlurmBackend::new(offline_config());
    let mut l = launch(vec![MemberLaunch { node: "n1".into(), devices: Vec::new() }]);
    l.env.clear();
    let args = backend.sbatch_args(&l);
    assert!(args.contains(&"--output=/shared/allot/logs/42.3/member-0.log".to_string()));
    assert!(args.contains(&"--account=research".to_string()));
    assert!(!args.iter().any(|a| a.starts_with("--gres")), "{args:?}");
}

#[test]
fn commands_that_cannot_run_are_errors_naming_the_command_and_the_fix() {
    let mut backend = SlurmBackend::new(offline_config());
    let e = backend.inventory().expect_err("no sinfo here");
    let text = e.to_string();
    assert!(text.contains("/nonexistent/slurm/bin/sinfo --json"), "{text}");
    assert!(text.contains("slurm-client"), "{text}");
    assert!(matches!(
        backend.signal(RunId { workload: 1, attempt: 1 }, StopSignal::Kill),
        Err(BackendError::Io(_))
    ));
    // Nothing is watched: poll has nothing to ask Slurm.
    assert_eq!(backend.poll().expect("idle poll"), Vec::new());
}

#[test]
fn launches_slurm_cannot_express_fail_before_reaching_it() {
    let mut backend = SlurmBackend::new(offline_config());
    let mut half = gpu(0);
    half.shares = 250;
    let refused = [
        launch(vec![]),
        launch(vec![MemberLaunch { node: "n1".into(), devices: vec![half] }]),
        launch(vec![
            MemberLaunch { node: "n1".into(), devices: vec![gpu(0)] },
            MemberLaunch { node: "n2".into(), devices: vec![gpu(0), gpu(1)] },
        ]),
    ];
    let mut reasons = Vec::new();
    for (i, l) in refused.iter().enumerate() {
        let run = RunId { workload: 100 + i as u64, attempt: 1 };
        backend.launch(&Launch { run, ..l.clone() }).expect("refused, not an error");
        match backend.poll().expect("poll").as_slice() {
            [Observation::LaunchFailed { run: r, error }] if *r == run => {
                reasons.push(error.clone())
            }
            other => panic!("{run}: expected LaunchFailed, got {other:?}"),
        }
    }
    assert!(reasons[0].contains("no members"), "{reasons:?}");
    assert!(reasons[1].contains("whole GPUs"), "{reasons:?}");
    assert!(reasons[2].contains("same tasks and GPUs on every node"), "{reasons:?}");
    // A refused run has ended: signalling it is fine, and nothing more is observed.
    backend.signal(RunId { workload: 100, attempt: 1 }, StopSignal::Kill).expect("ended run");
    assert_eq!(backend.poll().expect("poll"), Vec::new());
    // The program is checked after Slurm was asked for the run's job (a requeued run's launch
    // after a restart names the job's program only for information): offline, that question
    // fails, naming squeue. The cluster's contract rule checks the LaunchFailed.
    let missing = Launch {
        command: vec!["allot-test-no-such-program".into()],
        ..launch(vec![MemberLaunch { node: "n1".into(), devices: Vec::new() }])
    };
    let err = backend.launch(&missing).expect_err("squeue cannot run offline");
    assert!(err.to_string().contains("squeue"), "{err}");
}

#[test]
fn the_runner_kills_a_command_past_its_timeout() {
    let mut runner = Runner::new();
    runner.programs.insert(Tool::Squeue, PathBuf::from("/bin/sh"));
    runner.timeout = Duration::from_millis(300);
    let e = runner
        .run(Tool::Squeue, &["-c".into(), "sleep 5".into()], &BTreeMap::new())
        .expect_err("past the timeout");
    assert!(e.message.contains("no answer within"), "{e}");
    assert!(e.command.starts_with("/bin/sh -c"), "{e}");
    let e = runner
        .run(Tool::Squeue, &["-c".into(), "echo oops >&2; exit 3".into()], &BTreeMap::new())
        .expect_err("exit 3");
    assert_eq!(e.stderr.trim(), "oops");
    assert!(e.to_string().contains("failed (exit 3)"), "{e}");
    let out = runner
        .run(
            Tool::Squeue,
            &["-c".into(), "echo \"$X\"".into()],
            &BTreeMap::from([("X".into(), "a b".into())]),
        )
        .expect("runs");
    assert_eq!(out.stdout, "a b\n");
}

#[test]
fn the_backend_is_a_boxable_backend_named_slurm() {
    let backend: Box<dyn Backend> = Box::new(SlurmBackend::new(offline_config()));
    assert_eq!(backend.name(), "slurm");
}
