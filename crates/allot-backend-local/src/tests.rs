//! The contract suite against real processes, and the local backend's own rules: environment,
//! process groups, crash recovery from the files on disk.

#![allow(clippy::disallowed_methods)] // deadlines for real processes
#![allow(clippy::print_stderr)] // the real-cgroup tests say why they are skipped

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use allot_backend::contract::{self, Harness, sh};

use super::*;

const NODE: &str = "testnode";

struct LocalHarness {
    dir: tempfile::TempDir,
}

impl LocalHarness {
    fn new() -> Self {
        LocalHarness { dir: tempfile::tempdir().expect("temp dir for the local harness") }
    }

    fn config(&self) -> LocalConfig {
        let mut config = LocalConfig::new(self.dir.path().join("state"), NODE.to_string());
        config.use_nvml = false;
        config.sysfs_root = self.dir.path().join("no-sysfs");
        config
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

impl Harness for LocalHarness {
    type B = LocalBackend;

    fn backend(&mut self) -> LocalBackend {
        LocalBackend::new(self.config()).expect("backend on a temp state dir")
    }
    fn node(&self) -> String {
        NODE.to_string()
    }
    fn settle(&mut self) {
        std::thread::sleep(Duration::from_millis(20));
    }
    fn tmp_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

allot_backend::contract_tests!(LocalHarness::new(), |_: &str| true;
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
    recover_after_restart,
    recover_reports_learned_exit_code,
    launch_after_restart_adopts,
);

#[test]
fn every_contract_rule_has_a_test() {
    // The macro above must list every rule; this fails when a rule is added and not listed.
    assert_eq!(contract::rules::<LocalHarness>().len(), 13);
}

fn run(workload: u64) -> RunId {
    RunId { workload, attempt: 2 }
}

fn launch_in(
    h: &LocalHarness,
    run: RunId,
    command: Vec<String>,
    members: Vec<MemberLaunch>,
) -> Launch {
    Launch {
        run,
        command,
        env: BTreeMap::from([("EXTRA".to_string(), "from-the-daemon".to_string())]),
        members,
        log_dir: run_log_dir(&h.state_dir(), run),
        adopt: None,
        resources: Default::default(),
    }
}

fn member(devices: Vec<DeviceAssignment>) -> MemberLaunch {
    MemberLaunch { node: NODE.to_string(), devices }
}

fn nvidia(index: u32, uuid: Option<&str>, shares: u64) -> DeviceAssignment {
    DeviceAssignment { index, uuid: uuid.map(str::to_string), vendor: Vendor::Nvidia, shares }
}

fn amd(index: u32) -> DeviceAssignment {
    DeviceAssignment { index, uuid: None, vendor: Vendor::Amd, shares: 1000 }
}

/// Polls until `run` ends; returns everything observed.
fn until_ended(backend: &mut LocalBackend, run: RunId) -> Vec<Observation> {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        seen.extend(backend.poll().expect("poll"));
        if seen.iter().any(|o| o.run() == run && !matches!(o, Observation::Started { .. })) {
            return seen;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{run} never ended: {seen:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_lines(h: &LocalHarness, run: RunId, member: usize) -> Vec<String> {
    std::fs::read_to_string(log_path(&h.state_dir(), run, member))
        .expect("member log")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn members_get_device_and_allot_variables() {
    let mut h = LocalHarness::new();
    let mut backend = h.backend();
    let r = run(1);
    let members = vec![
        member(vec![nvidia(3, Some("GPU-aaaa"), 500)]),
        member(vec![]),
        member(vec![amd(1), amd(2)]),
    ];
    backend.launch(&launch_in(&h, r, vec!["env".to_string()], members)).expect("launch");
    let seen = until_ended(&mut backend, r);
    assert!(matches!(seen.last(), Some(Observation::Exited { code: Some(0), .. })), "{seen:?}");
    let m0 = log_lines(&h, r, 0);
    for line in [
        "CUDA_VISIBLE_DEVICES=GPU-aaaa",
        "ALLOT_GPU_SHARE_PERMILLE=500",
        "ALLOT_WORKLOAD_ID=1",
        "ALLOT_ATTEMPT=2",
        "ALLOT_MEMBER=0",
        "HIP_VISIBLE_DEVICES=",
        "EXTRA=from-the-daemon",
    ] {
        assert!(m0.iter().any(|l| l == line), "member 0 lacks {line}: {m0:?}");
    }
    let m1 = log_lines(&h, r, 1);
    for line in
        ["CUDA_VISIBLE_DEVICES=", "HIP_VISIBLE_DEVICES=", "ROCR_VISIBLE_DEVICES=", "ALLOT_MEMBER=1"]
    {
        assert!(m1.iter().any(|l| l == line), "member 1 lacks {line}: {m1:?}");
    }
    assert!(!m1.iter().any(|l| l.starts_with("ALLOT_GPU_SHARE_PERMILLE")), "{m1:?}");
    let m2 = log_lines(&h, r, 2);
    for line in ["HIP_VISIBLE_DEVICES=1,2", "ROCR_VISIBLE_DEVICES=1,2", "CUDA_VISIBLE_DEVICES=1,2"]
    {
        assert!(m2.iter().any(|l| l == line), "member 2 lacks {line}: {m2:?}");
    }
}

#[test]
fn device_env_rules() {
    let env =
        device_env(&[nvidia(0, None, 1000), nvidia(2, Some("GPU-b"), 1000)]).expect("indices");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0,2", "a device without UUID: indices for all");
    assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    let env = device_env(&[nvidia(0, Some("MIG-x"), 1000)]).expect("MIG by UUID");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "MIG-x");
    let err = device_env(&[nvidia(0, Some("MIG-x"), 1000), nvidia(1, None, 1000)])
        .expect_err("a MIG instance cannot be named by index");
    assert!(err.contains("MIG"), "{err}");
}

#[test]
fn signals_reach_grandchildren_in_the_process_group() {
    let mut h = LocalHarness::new();
    let mut backend = h.backend();
    let r = run(2);
    let grandchild_file = h.tmp_dir().join("grandchild.pid");
    let program = sh("sleep 30 & echo $! > \"$0\"; wait", &[&grandchild_file]);
    backend.launch(&launch_in(&h, r, program, vec![member(vec![])])).expect("launch");
    let start = Instant::now();
    let grandchild: u32 = loop {
        if let Some(pid) =
            std::fs::read_to_string(&grandchild_file).ok().and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no grandchild pid");
        h.settle();
    };
    assert!(alive(grandchild, None));
    backend.signal(r, StopSignal::Terminate).expect("signal");
    let seen = until_ended(&mut backend, r);
    assert!(matches!(seen.last(), Some(Observation::Exited { code: None, .. })), "{seen:?}");
    let start = Instant::now();
    while alive(grandchild, None) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "grandchild {grandchild} survived Terminate"
        );
        h.settle();
    }
}

#[test]
fn failed_member_ends_the_gang_with_its_code() {
    let mut h = LocalHarness::new();
    let mut backend = h.backend();
    let r = run(3);
    // Member 0 sleeps; member 1 fails at once. Both run the same command, told apart by ALLOT_MEMBER.
    let program = sh("if [ \"$ALLOT_MEMBER\" = 1 ]; then exit 5; fi; sleep 30", &[]);
    backend
        .launch(&launch_in(&h, r, program, vec![member(vec![]), member(vec![])]))
        .expect("launch");
    let seen = until_ended(&mut backend, r);
    assert!(
        matches!(seen.last(), Some(Observation::Exited { code: Some(5), detail, .. }) if detail.contains("member 1")),
        "{seen:?}"
    );
}

#[test]
fn launch_record_without_pid_file_is_a_failed_launch() {
    let mut h = LocalHarness::new();
    let r = run(4);
    let l = launch_in(&h, r, h.program_sleep(30), vec![member(vec![])]);
    let dir = run_dir(&h.state_dir(), r);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("launch.json"), "{}").expect("write");
    let mut backend = h.backend();
    let got = backend.recover(std::slice::from_ref(&l)).expect("recover");
    assert_eq!(
        got,
        vec![Observation::LaunchFailed {
            run: r,
            error: "the daemon stopped while launching".to_string()
        }]
    );
    // The answer is durable, and a launch of the same run after it starts nothing.
    drop(backend);
    let mut backend = h.backend();
    backend.launch(&l).expect("launch");
    assert!(matches!(backend.poll().expect("poll").as_slice(), [Observation::LaunchFailed { .. }]));
    assert!(!dir.join("member-0.pid").exists());
}

#[test]
fn reused_pid_is_not_adopted() {
    let mut h = LocalHarness::new();
    let r = run(5);
    let l = launch_in(&h, r, h.program_sleep(30), vec![member(vec![])]);
    let dir = run_dir(&h.state_dir(), r);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("launch.json"), "{}").expect("write");
    // The pid is alive (this test process) but started at another time than recorded.
    let me = std::process::id();
    let (_, my_start) = proc_stat(me).expect("/proc of this process");
    std::fs::write(dir.join("member-0.pid"), format!("{me}\n")).expect("write");
    std::fs::write(dir.join("member-0.start"), (my_start + 1).to_string()).expect("write");
    let mut backend = h.backend();
    let got = backend.recover(&[l]).expect("recover");
    assert!(
        matches!(got.as_slice(), [Observation::Exited { code: None, detail, .. }] if detail.contains("unknown")),
        "{got:?}"
    );
}

#[test]
fn proc_stat_parsing() {
    let stat =
        "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
    assert_eq!(parse_proc_stat(stat), Some(('S', 987654)));
    assert_eq!(parse_proc_stat("garbage"), None);
    assert_eq!(parse_proc_stat("1 (x) Z 1"), None);
}

#[test]
fn exit_record_round_trips() {
    for (code, detail) in
        [(Some(3), "member 0 exited with code 3"), (None, "member 1 was killed by SIGKILL")]
    {
        assert_eq!(parse_exit_record(&exit_record(code, detail)), Some((code, detail.to_string())));
    }
    assert_eq!(parse_exit_record("not json"), None);
}

#[test]
fn inventory_falls_back_to_the_declared_one_and_names_the_fix() {
    let h = LocalHarness::new();
    let mut backend = LocalBackend::new(h.config()).expect("backend");
    let err = backend.inventory().expect_err("no GPU, nothing declared");
    assert!(err.to_string().contains("--inventory FILE"), "{err}");
    let declared = vec![discover::node_spec(NODE, &[])];
    let mut config = h.config();
    config.declared_inventory = Some(declared.clone());
    let mut backend = LocalBackend::new(config).expect("backend");
    assert_eq!(backend.inventory().expect("declared"), declared);
}

#[test]
fn inventory_reads_amd_gpus_from_sysfs() {
    let h = LocalHarness::new();
    let mut config = h.config();
    let device = config.sysfs_root.join("class/drm/card0/device");
    std::fs::create_dir_all(&device).expect("mkdir");
    std::fs::write(device.join("vendor"), "0x1002\n").expect("write");
    std::fs::write(device.join("mem_info_vram_total"), "68702699520\n").expect("write");
    std::fs::write(device.join("product_name"), "AMD Instinct MI250X\n").expect("write");
    config.declared_inventory = Some(Vec::new());
    let mut backend = LocalBackend::new(config).expect("backend");
    let nodes = backend.inventory().expect("discovered");
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].name, NODE);
    let devices: Vec<(&str, u64)> =
        nodes[0].devices.iter().map(|d| (d.model.as_str(), d.memory_mib)).collect();
    assert_eq!(devices, vec![("mi250x", 65520)]);
}

#[test]
fn members_see_none_of_the_daemons_environment() {
    let mut h = LocalHarness::new();
    let mut backend = h.backend();
    let r = run(40);
    // Whatever the daemon's own environment holds (this test process's), only the documented
    // variables and the launch's reach the member.
    let mut launch = launch_in(&h, r, vec!["env".to_string()], vec![member(vec![])]);
    launch.env.insert("LANG".to_string(), "de_DE.UTF-8".to_string());
    backend.launch(&launch).expect("launch");
    until_ended(&mut backend, r);
    let mut keys: Vec<String> = log_lines(&h, r, 0)
        .iter()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .filter(|k| k != "PWD" && k != "SHLVL" && k != "_")
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "ALLOT_ATTEMPT",
            "ALLOT_MEMBER",
            "ALLOT_WORKLOAD_ID",
            "CUDA_DEVICE_ORDER",
            "CUDA_VISIBLE_DEVICES",
            "EXTRA",
            "HIP_VISIBLE_DEVICES",
            "HOME",
            "LANG",
            "LOGNAME",
            "PATH",
            "ROCR_VISIBLE_DEVICES",
            "USER",
        ]
    );
    let lines = log_lines(&h, r, 0);
    assert!(lines.iter().any(|l| l == "LANG=de_DE.UTF-8"), "{lines:?}");
    assert!(lines.iter().any(|l| l == &format!("PATH={}", account::DEFAULT_PATH)), "{lines:?}");
}

/// Real cgroups (`ALLOT_CGROUP_TESTS=1`, root): a member's device filter and memory limit.
fn cgroups_for_test() -> Option<cgroup::Cgroups> {
    let wanted = std::env::var_os("ALLOT_CGROUP_TESTS").is_some();
    if !wanted || !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs ALLOT_CGROUP_TESTS=1 and root");
        return None;
    }
    Some(cgroup::Cgroups::detect().expect("ALLOT_CGROUP_TESTS is set: this host has cgroups"))
}

#[test]
fn a_member_cannot_open_a_gpu_it_was_not_given() {
    let Some(cgroups) = cgroups_for_test() else { return };
    let h = LocalHarness::new();
    // Stand-in device nodes for two NVIDIA GPUs (no driver: opening one that is allowed says
    // ENXIO, one the filter denies says EPERM).
    let dev = h.dir.path().join("dev");
    std::fs::create_dir(&dev).expect("mkdir");
    let mut nodes = Vec::new();
    for index in 0..2 {
        nix::sys::stat::mknod(
            &dev.join(format!("nvidia{index}")),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, u64::from(index)),
        )
        .expect("mknod");
        nodes.push(discover::GpuDeviceNode {
            vendor: Vendor::Nvidia,
            index,
            major: 195,
            minor: index,
        });
    }
    let mut config = h.config();
    config.cgroups = Some(cgroups);
    config.gpu_device_nodes = Some((nodes, None));
    let mut backend = LocalBackend::new(config).expect("backend");
    let r = run(41);
    let script = format!("cat {0}/nvidia0; cat {0}/nvidia1; exit 0", dev.display());
    let launch = launch_in(&h, r, sh(&script, &[]), vec![member(vec![nvidia(0, None, 1000)])]);
    backend.launch(&launch).expect("launch");
    until_ended(&mut backend, r);
    let lines = log_lines(&h, r, 0).join("\n");
    assert!(lines.contains("nvidia0: No such device or address"), "given: {lines}");
    assert!(lines.contains("nvidia1: Operation not permitted"), "not given: {lines}");
}

#[test]
fn a_member_over_its_memory_request_is_killed_and_said_so() {
    let Some(cgroups) = cgroups_for_test() else { return };
    let h = LocalHarness::new();
    let mut config = h.config();
    config.cgroups = Some(cgroups);
    let mut backend = LocalBackend::new(config).expect("backend");
    let r = run(42);
    // The shell itself grows past 64 MiB: a variable of ~256 MiB.
    let script = "x=$(head -c 268435456 /dev/zero | tr '\\0' a); echo survived ${#x}";
    let mut launch = launch_in(&h, r, sh(script, &[]), vec![member(vec![])]);
    launch.resources = allot_backend::MemberResources { cpu_millis: 500, memory_mib: 64 };
    backend.launch(&launch).expect("launch");
    let seen = until_ended(&mut backend, r);
    let Some(Observation::Exited { detail, .. }) = seen.last() else { panic!("{seen:?}") };
    assert!(detail.contains("out of memory"), "{detail}");
    assert!(!log_lines(&h, r, 0).iter().any(|l| l.starts_with("survived")));
    // The member's group is gone with it.
    let name = group_name(&h.state_dir(), r, 0);
    assert!(backend.config.cgroups.as_ref().and_then(|c| c.existing(&name)).is_none());
}
