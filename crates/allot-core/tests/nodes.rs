//! Node availability (`Event::NodeUnavailable`/`NodeAvailable`, issue 8): a node the cluster
//! reports down or drained takes no new work, keeps the work running on it, withholds what
//! that work frees until it is available again, and is named in the deferral of work that
//! only it could hold.
//!
//! One `check` helper runs each named scenario on a small cluster and compares its transcript
//! (rendered decisions, `why`, cluster snapshots) with the expected text. After every step
//! the engine's invariants hold (`Engine::audit`), and after every cycle the engine is saved
//! and rebuilt from its state (`Engine::state`/`from_state`), which must equal it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use allot_core::{
    Decision, DeferReason, DeviceShare, DeviceSpec, Engine, Event, GpuRequest, MemberPlacement,
    MigProfile, ModelId, NodeId, NodeSpec, Placement, PolicySpec, PriorityClassSpec, ProjectSpec,
    Queueing, QuotaModel, QuotaSpec, Shares, Stage, Timestamp, WorkloadId, WorkloadSpec,
};

/// A cluster of `(name, A100 count)` nodes (`+mig` after the count: MIG-enabled A100-80GBs),
/// one project `p` with 64 GPUs guaranteed, classes `low` (default) and `high`.
struct World {
    nodes: Vec<NodeSpec>,
    policy: PolicySpec,
    engine: Engine,
    ids: BTreeMap<String, WorkloadId>,
    out: String,
}

impl World {
    fn new(nodes: &[(&str, u32)]) -> World {
        World::with_mig(nodes, false)
    }

    fn with_mig(nodes: &[(&str, u32)], mig: bool) -> World {
        let model = if mig { "A100-80GB" } else { "A100" };
        let nodes: Vec<NodeSpec> = nodes
            .iter()
            .map(|&(name, gpus)| NodeSpec {
                name: name.into(),
                cpu_millis: 64_000,
                memory_mib: 512 * 1024,
                labels: BTreeMap::new(),
                pool: None,
                rack: None,
                devices: (0..gpus)
                    .map(|_| DeviceSpec { model: model.into(), memory_mib: 81920, island: 0, mig })
                    .collect(),
            })
            .collect();
        let policy = PolicySpec {
            priority_classes: vec![
                PriorityClassSpec { name: "low".into(), value: 0, preemptible: true },
                PriorityClassSpec { name: "high".into(), value: 10, preemptible: true },
            ],
            default_priority_class: "low".into(),
            projects: vec![ProjectSpec {
                name: "p".into(),
                cohort: None,
                department: None,
                quotas: vec![QuotaSpec {
                    model: QuotaModel::Any,
                    guaranteed: Shares::from_gpus(64),
                    borrow_limit: None,
                    lend_limit: None,
                }],
                weight_milli: 1000,
                queueing: Queueing::BestEffortFifo,
                preemption_mode: None,
                preempt_within_project: Default::default(),
                borrow_within_cohort: None,
            }],
            ..PolicySpec::minimal()
        };
        let engine = Engine::new(&nodes, &policy).expect("valid configuration");
        World { nodes, policy, engine, ids: BTreeMap::new(), out: String::new() }
    }

    fn id(&self, name: &str) -> WorkloadId {
        self.ids[name]
    }

    fn node(&self, name: &str) -> NodeId {
        self.engine.node_id(name).expect("a node of the cluster")
    }

    fn apply(&mut self, at: u64, event: Event) {
        self.engine.apply(Timestamp(at), event);
        self.engine.audit().expect("invariants after an event");
    }

    /// Submits `members` × `gpus` for project `p`; `class` `high` or `low`.
    fn submit(&mut self, at: u64, name: &str, gpus: GpuRequest, members: u32, class: &str) {
        let id = self.ids.len() as u64 + 1;
        let mut spec = WorkloadSpec::new(id, name, "p", gpus);
        spec.members = members;
        spec.priority_class = Some(class.into());
        self.ids.insert(name.into(), WorkloadId(id));
        self.apply(at, Event::WorkloadSubmitted(spec));
    }

    fn whole(&mut self, at: u64, name: &str, gpus: u32) {
        self.submit(at, name, GpuRequest::Whole(gpus), 1, "low");
    }

    fn down(&mut self, at: u64, node: &str, reason: &str) {
        let node = self.node(node);
        self.apply(at, Event::NodeUnavailable { node, reason: reason.into() });
    }

    fn up(&mut self, at: u64, node: &str) {
        let node = self.node(node);
        self.apply(at, Event::NodeAvailable { node });
    }

    /// `node`'s devices `devices` are held by work allot does not govern (the whole set).
    fn occupy(&mut self, at: u64, node: &str, devices: &[u16], by: &str) {
        let node = self.node(node);
        self.apply(at, Event::DevicesOccupied { node, devices: devices.to_vec(), by: by.into() });
    }

    fn finish(&mut self, at: u64, name: &str) {
        let workload = self.id(name);
        self.apply(at, Event::WorkloadFinished { workload });
    }

    /// One cycle, printed; then the engine is saved and rebuilt from its state.
    fn decide(&mut self, at: u64) -> Vec<Decision> {
        let decisions = self.engine.decide(Timestamp(at));
        self.engine.audit().expect("invariants after a cycle");
        let _ = writeln!(self.out, "decide at={at}");
        for d in &decisions {
            let _ = writeln!(self.out, "  {}", self.engine.render(d));
        }
        let bytes = self.engine.state().expect("right after a cycle");
        let rebuilt =
            Engine::from_state(&self.nodes, &self.policy, &bytes).expect("the same configuration");
        assert_eq!(format!("{rebuilt:?}"), format!("{:?}", self.engine), "rebuilt engine differs");
        self.engine = rebuilt;
        decisions
    }

    /// Cycles, starting every admit and stopping every victim, until nothing changes.
    fn settle(&mut self, at: u64) {
        for _ in 0..10 {
            let mut acted = false;
            for d in self.decide(at) {
                match d {
                    Decision::Admit { workload, .. } => {
                        self.apply(at, Event::AllocationStarted { workload });
                        acted = true;
                    }
                    Decision::Preempt { victim: workload, .. }
                    | Decision::Stop { workload, .. } => {
                        self.apply(at, Event::WorkloadStopped { workload });
                        acted = true;
                    }
                    _ => {}
                }
            }
            if !acted {
                return;
            }
        }
    }

    fn why(&mut self, at: u64, name: &str) {
        let e = self.engine.explain(Timestamp(at), self.id(name)).expect("held");
        let _ = writeln!(self.out, "why {name} at={at}\n{}", self.engine.render_explanation(&e));
    }

    /// The ledger's view of the cluster, in GPUs.
    fn snapshot(&mut self, label: &str) {
        let s = self.engine.cluster_snapshot();
        let _ = write!(
            self.out,
            "cluster {label}: capacity {} allocated {} free {} fragmented {}",
            Shares(s.capacity_shares),
            Shares(s.allocated_shares),
            Shares(s.free_shares),
            Shares(s.fragmented_shares)
        );
        if s.unmanaged_shares > 0 {
            let _ = write!(self.out, " unmanaged {}", Shares(s.unmanaged_shares));
        }
        let _ = writeln!(self.out);
    }
}

/// Runs a scenario and compares its transcript with `expect` (leading/trailing blank lines
/// and indentation common to `expect` are ignored).
fn check(nodes: &[(&str, u32)], scenario: impl FnOnce(&mut World), expect: &str) {
    let mut world = World::new(nodes);
    scenario(&mut world);
    assert_transcript(&world.out, expect);
}

fn assert_transcript(actual: &str, expect: &str) {
    let lines: Vec<&str> = expect.lines().filter(|l| !l.trim().is_empty()).collect();
    let indent = lines.iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    let expect: Vec<&str> = lines.iter().map(|l| &l[indent..]).collect();
    let actual: Vec<&str> = actual.lines().collect();
    assert_eq!(actual, expect, "\nactual transcript:\n{}\n", actual.join("\n"));
}

#[test]
fn a_drained_node_gets_no_new_work_while_another_node_takes_it() {
    check(
        &[("n0", 4), ("n1", 4)],
        |w| {
            w.down(0, "n0", "drained: maintenance");
            w.whole(0, "a", 4);
            w.whole(0, "b", 2);
            w.settle(0);
            w.snapshot("n0 drained");
            w.up(10, "n0");
            w.settle(10);
            w.snapshot("n0 back");
        },
        "
        decide at=0
          admit a: within p's guarantee (4/64 any used); on A100 n1[0,1,2,3]
          defer b: no room for 2 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial); would fit if unavailable node n0 (drained: maintenance) were usable again
        decide at=0
          defer b: no room for 2 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial); would fit if unavailable node n0 (drained: maintenance) were usable again
        cluster n0 drained: capacity 4 allocated 4 free 0 fragmented 0
        decide at=10
          admit b: within p's guarantee (6/64 any used); on A100 n0[0,1]
        decide at=10
        cluster n0 back: capacity 8 allocated 6 free 2 fragmented 2
        ",
    );
}

#[test]
fn work_on_a_drained_node_runs_on_and_its_devices_stay_unusable_until_the_node_is_back() {
    check(
        &[("n0", 4)],
        |w| {
            w.whole(0, "a", 2);
            w.settle(0);
            w.down(5, "n0", "drained: reboot");
            w.whole(5, "b", 1);
            w.settle(5);
            w.snapshot("a runs on drained n0");
            w.finish(6, "a");
            w.settle(6);
            w.snapshot("a ended");
            w.up(7, "n0");
            w.snapshot("n0 back");
            w.settle(7);
        },
        "
        decide at=0
          admit a: within p's guarantee (2/64 any used); on A100 n0[0,1]
        decide at=0
        decide at=5
          defer b: no room for 1 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial); would fit if unavailable node n0 (drained: reboot) were usable again
        cluster a runs on drained n0: capacity 2 allocated 2 free 0 fragmented 0
        decide at=6
          defer b: no room for 1 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial); would fit if unavailable node n0 (drained: reboot) were usable again
        cluster a ended: capacity 0 allocated 0 free 0 fragmented 0
        cluster n0 back: capacity 4 allocated 0 free 4 fragmented 0
        decide at=7
          admit b: within p's guarantee (1/64 any used); on A100 n0[0]
        decide at=7
        ",
    );
}

#[test]
fn preemption_plans_no_room_on_an_unavailable_node() {
    // Without the drain, `a` (lower id, same cost) would be the victim; its devices are on
    // the drained n0, so stopping it would free nothing usable. (`b`, suspended, then waits;
    // n0 would not hold it either while `a` runs there, so no node is named.)
    check(
        &[("n0", 4), ("n1", 4)],
        |w| {
            w.whole(0, "a", 4);
            w.whole(0, "b", 4);
            w.settle(0);
            w.down(1_000, "n0", "down: Not responding");
            w.submit(1_000, "h", GpuRequest::Whole(4), 1, "high");
            w.settle(1_000);
        },
        "
        decide at=0
          admit a: within p's guarantee (4/64 any used); on A100 n0[0,1,2,3]
          admit b: within p's guarantee (8/64 any used); on A100 n1[0,1,2,3]
        decide at=0
        decide at=1000
          preempt b: suspend for h: priority in p: 10 outranks 0
          defer h: waiting for b to stop
        decide at=1000
          admit h: within p's guarantee (8/64 any used); on A100 n1[0,1,2,3]
          defer b: no room for 4 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        decide at=1000
          defer b: no room for 4 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        ",
    );
}

#[test]
fn nothing_is_preempted_when_only_work_on_an_unavailable_node_could_make_room() {
    check(
        &[("n0", 4), ("n1", 4)],
        |w| {
            w.whole(0, "a", 4);
            w.settle(0);
            w.submit(1, "peer", GpuRequest::Whole(4), 1, "high");
            w.settle(1);
            w.down(1_000, "n0", "drained");
            w.submit(1_000, "h", GpuRequest::Whole(4), 1, "high");
            w.decide(1_000);
        },
        "
        decide at=0
          admit a: within p's guarantee (4/64 any used); on A100 n0[0,1,2,3]
        decide at=0
        decide at=1
          admit peer: within p's guarantee (8/64 any used); on A100 n1[0,1,2,3]
        decide at=1
        decide at=1000
          defer h: no room for 4 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        ",
    );
}

#[test]
fn a_gang_that_only_fits_with_the_unavailable_node_defers_naming_it() {
    check(
        &[("n0", 4), ("n1", 4), ("n2", 2)],
        |w| {
            w.down(0, "n1", "down: Not responding");
            w.submit(0, "gang", GpuRequest::Whole(4), 2, "low");
            w.decide(0);
            w.why(0, "gang");
            w.up(1, "n1");
            w.decide(1);
        },
        "
        decide at=0
          defer gang: no room for 2 members × 4 A100: largest free block 4 on n0; 6 whole free across 2 nodes (6 incl. partial); would fit if unavailable node n1 (down: Not responding) were usable again
        why gang at=0
        gang: pending
          position 1 in its project queue
          now: defer — no room for 2 members × 4 A100: largest free block 4 on n0; 6 whole free across 2 nodes (6 incl. partial); would fit if unavailable node n1 (down: Not responding) were usable again
          option: would start now with 2 × 2 GPUs
        decide at=1
          admit gang: within p's guarantee (8/64 any used); on A100 n0[0,1,2,3] n1[0,1,2,3]
        ",
    );
}

#[test]
fn a_cpu_only_workload_is_not_placed_on_an_unavailable_node() {
    check(
        &[("n0", 1)],
        |w| {
            w.down(0, "n0", "drained");
            w.whole(0, "cpu", 0);
            w.decide(0);
            w.up(1, "n0");
            w.decide(1);
        },
        "
        decide at=0
          defer cpu: no room for 0 cpu: no whole device free; 0 whole free across 0 nodes (0 incl. partial); would fit if unavailable node n0 (drained) were usable again
        decide at=1
          admit cpu: needs no GPU; on cpu n0 (no GPU)
        ",
    );
}

#[test]
fn repeated_and_unmatched_availability_events_change_nothing() {
    let mut once = World::new(&[("n0", 4), ("n1", 4)]);
    let mut twice = World::new(&[("n0", 4), ("n1", 4)]);
    for w in [&mut once, &mut twice] {
        w.whole(0, "a", 2);
        w.settle(0);
        w.up(1, "n0"); // never down: nothing to do
    }
    once.down(2, "n0", "drained: second reason");
    twice.down(2, "n0", "drained: first reason");
    twice.down(2, "n0", "drained: second reason");
    assert_eq!(format!("{:?}", once.engine), format!("{:?}", twice.engine));
    assert_eq!(twice.engine.node_unavailable(twice.node("n0")), Some("drained: second reason"));
    let listed: Vec<(NodeId, String)> =
        twice.engine.unavailable_nodes().map(|(n, r)| (n, r.to_string())).collect();
    assert_eq!(listed, vec![(NodeId(0), "drained: second reason".to_string())]);

    once.up(3, "n0");
    twice.up(3, "n0");
    twice.up(3, "n0");
    assert_eq!(format!("{:?}", once.engine), format!("{:?}", twice.engine));
    assert_eq!(twice.engine.node_unavailable(twice.node("n0")), None);
    // Back as it was before the drain.
    let mut never = World::new(&[("n0", 4), ("n1", 4)]);
    never.whole(0, "a", 2);
    never.settle(0);
    never.engine.decide(Timestamp(3));
    twice.engine.decide(Timestamp(3));
    assert_eq!(format!("{:?}", never.engine), format!("{:?}", twice.engine));
}

#[test]
fn an_unknown_node_is_harmless() {
    let mut w = World::new(&[("n0", 2)]);
    w.whole(0, "a", 1);
    w.settle(0);
    let before = format!("{:?}", w.engine);
    w.apply(0, Event::NodeUnavailable { node: NodeId(7), reason: "no such node".into() });
    w.apply(0, Event::NodeAvailable { node: NodeId(7) });
    w.apply(0, Event::NodeUnavailable { node: NodeId(u32::MAX), reason: String::new() });
    assert_eq!(format!("{:?}", w.engine), before);
    assert_eq!(w.engine.node_unavailable(NodeId(7)), None);
    assert_eq!(w.engine.node_id("n9"), None);
    assert_eq!(w.engine.node_id("n0"), Some(NodeId(0)));
    assert_eq!(
        Event::NodeAvailable { node: NodeId(7) }.workload(),
        None,
        "a node event concerns no workload"
    );
}

#[test]
fn the_state_round_trip_keeps_unavailable_nodes_and_their_reasons() {
    let mut w = World::new(&[("n0", 4), ("n1", 4)]);
    w.whole(0, "a", 3);
    w.settle(0);
    w.down(1, "n0", "drained: kernel update");
    w.whole(1, "b", 4);
    w.whole(1, "c", 4);
    w.settle(1); // b on n1; c defers
    w.finish(2, "a");
    let decisions = w.decide(2); // saved and rebuilt inside
    assert!(
        matches!(&decisions[..], [Decision::Defer { reason: DeferReason::NodesUnavailable { nodes, .. }, .. }]
            if nodes == &vec![(NodeId(0), "drained: kernel update".to_string())]),
        "{decisions:?}"
    );
    let bytes = w.engine.state().expect("after a cycle");
    let rebuilt = Engine::from_state(&w.nodes, &w.policy, &bytes).expect("same configuration");
    assert_eq!(rebuilt.node_unavailable(NodeId(0)), Some("drained: kernel update"));
    assert_eq!(rebuilt.cluster_snapshot(), w.engine.cluster_snapshot());
    // Another policy keeps the node unavailable.
    let moved = w.engine.with_policy(&w.nodes, &w.policy).expect("same policy");
    assert_eq!(moved.node_unavailable(NodeId(0)), Some("drained: kernel update"));
    assert_eq!(moved.cluster_snapshot(), w.engine.cluster_snapshot());
    // A damaged tail is refused, not misread.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(Engine::from_state(&w.nodes, &w.policy, &longer).is_err());
    assert!(Engine::from_state(&w.nodes, &w.policy, &bytes[..bytes.len() - 1]).is_err());
    // Both come back the same way.
    w.up(3, "n0");
    let mut rebuilt = rebuilt;
    rebuilt.apply(Timestamp(3), Event::NodeAvailable { node: NodeId(0) });
    assert_eq!(rebuilt.decide(Timestamp(3)), w.decide(3));
}

#[test]
fn work_running_on_an_unavailable_node_can_be_adopted() {
    let mut w = World::new(&[("n0", 4), ("n1", 4)]);
    w.down(0, "n0", "drained");
    let placement = Placement {
        model: Some(ModelId(0)),
        members: vec![MemberPlacement {
            node: NodeId(0),
            devices: vec![DeviceShare { device: 2, shares: 1000, mig: None }],
        }],
    };
    let spec = WorkloadSpec::new(1, "foreign", "p", GpuRequest::Whole(1));
    w.ids.insert("foreign".into(), WorkloadId(1));
    w.apply(0, Event::WorkloadAdopted { spec, placement });
    let decisions = w.decide(0);
    assert!(decisions.is_empty(), "{decisions:?}");
    assert_eq!(w.engine.stage(WorkloadId(1)), Some(Stage::Running));
    let s = w.engine.cluster_snapshot();
    assert_eq!((s.capacity_shares, s.allocated_shares, s.free_shares), (5000, 1000, 4000));
    // Once it ends, its device is withheld with the rest of the node.
    w.finish(1, "foreign");
    assert_eq!(w.engine.cluster_snapshot().capacity_shares, 4000);
    w.up(2, "n0");
    assert_eq!(w.engine.cluster_snapshot().free_shares, 8000);
}

#[test]
fn mig_devices_of_an_unavailable_node_take_no_instance_until_it_is_back() {
    let mut w = World::with_mig(&[("n0", 1)], true);
    let profile = MigProfile::parse("3g.40gb").expect("a profile");
    w.submit(0, "first", GpuRequest::Mig(profile), 1, "low");
    w.settle(0);
    w.down(1, "n0", "drained");
    w.submit(1, "second", GpuRequest::Mig(profile), 1, "low");
    let decisions = w.decide(1);
    assert!(
        matches!(
            &decisions[..],
            [Decision::Defer { reason: DeferReason::NodesUnavailable { .. }, .. }]
        ),
        "{decisions:?}"
    );
    w.finish(2, "first");
    let decisions = w.decide(2);
    assert!(matches!(&decisions[..], [Decision::Defer { .. }]), "{decisions:?}");
    w.up(3, "n0");
    let decisions = w.decide(3);
    assert!(matches!(&decisions[..], [Decision::Admit { .. }]), "{decisions:?}");
}

#[test]
fn devices_held_by_foreign_work_take_no_allot_work_until_it_ends() {
    // Slurm job 812 of an account allot does not govern runs on n0's GPUs 0–5: an 8-GPU job
    // goes to n1, a 2-GPU job fits n0's two left, and the six come back when 812 ends.
    check(
        &[("n0", 8), ("n1", 8)],
        |w| {
            w.occupy(0, "n0", &[0, 1, 2, 3, 4, 5], "Slurm job 812 (account physics)");
            w.snapshot("812 runs");
            w.whole(0, "big", 8);
            w.whole(0, "small", 2);
            w.whole(0, "third", 4);
            w.settle(0);
            w.snapshot("allot's work placed");
            w.occupy(10, "n0", &[], "");
            w.snapshot("812 ended");
            w.settle(10);
        },
        "
        cluster 812 runs: capacity 10 allocated 0 free 10 fragmented 10 unmanaged 6
        decide at=0
          admit big: within p's guarantee (8/64 any used); on A100 n1[0,1,2,3,4,5,6,7]
          admit small: within p's guarantee (10/64 any used); on A100 n0[6,7]
          defer third: no room for 4 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        decide at=0
          defer third: no room for 4 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        cluster allot's work placed: capacity 10 allocated 10 free 0 fragmented 0 unmanaged 6
        cluster 812 ended: capacity 16 allocated 10 free 6 fragmented 0
        decide at=10
          admit third: within p's guarantee (14/64 any used); on A100 n0[0,1,2,3]
        decide at=10
        ",
    );
}

#[test]
fn foreign_work_on_a_device_allot_holds_keeps_what_allot_frees_there() {
    // A foreign job lands on n0[1] while allot's `a` holds n0[0,1] (the cluster double-booked
    // it, or allot's view was late): the device counts as `a`'s while `a` runs; when `a`
    // ends, n0[1] stays out of use (unmanaged), n0[0] is free. A drain keeps n0[1] withheld
    // after the foreign job ends, and the node's return frees it.
    check(
        &[("n0", 2)],
        |w| {
            w.whole(0, "a", 2);
            w.settle(0);
            w.occupy(1, "n0", &[1], "Slurm job 9 (account other)");
            w.snapshot("both on n0[1]");
            w.finish(2, "a");
            w.snapshot("a ended");
            w.whole(3, "b", 2);
            w.whole(3, "c", 1);
            w.settle(3);
            w.down(4, "n0", "drained");
            w.occupy(5, "n0", &[], "");
            w.snapshot("drained, foreign ended");
            w.up(6, "n0");
            w.snapshot("back");
            w.settle(6);
        },
        "
        decide at=0
          admit a: within p's guarantee (2/64 any used); on A100 n0[0,1]
        decide at=0
        cluster both on n0[1]: capacity 2 allocated 2 free 0 fragmented 0
        cluster a ended: capacity 1 allocated 0 free 1 fragmented 1 unmanaged 1
        decide at=3
          defer b: no room for 2 A100: largest free block 1 on n0; 1 whole free across 1 nodes (1 incl. partial)
          admit c: within p's guarantee (1/64 any used); on A100 n0[0]
        decide at=3
          defer b: no room for 2 A100: no whole device free; 0 whole free across 0 nodes (0 incl. partial)
        cluster drained, foreign ended: capacity 1 allocated 1 free 0 fragmented 0
        cluster back: capacity 2 allocated 1 free 1 fragmented 1
        decide at=6
          defer b: no room for 2 A100: largest free block 1 on n0; 1 whole free across 1 nodes (1 incl. partial)
        ",
    );
}

#[test]
fn occupancy_events_are_idempotent_bounded_and_survive_a_restart() {
    let mut w = World::new(&[("n0", 4), ("n1", 4)]);
    w.occupy(0, "n0", &[2, 3, 9], "Slurm job 5");
    let once = format!("{:?}", w.engine);
    w.occupy(0, "n0", &[3, 2, 2], "Slurm job 5");
    assert_eq!(format!("{:?}", w.engine), once, "the same set again changes nothing");
    let held: Vec<(NodeId, Vec<u16>, String)> = w
        .engine
        .occupied_devices()
        .map(|(n, o)| (n, o.devices.iter().copied().collect(), o.by.clone()))
        .collect();
    assert_eq!(held, vec![(NodeId(0), vec![2, 3], "Slurm job 5".to_string())], "index 9 dropped");
    w.apply(0, Event::DevicesOccupied { node: NodeId(7), devices: vec![0], by: "x".into() });
    assert_eq!(format!("{:?}", w.engine), once, "an unknown node changes nothing");
    // Saved and rebuilt (by `decide`), the occupancy is the same.
    w.decide(1);
    assert_eq!(w.engine.occupied_devices().count(), 1);
    assert_eq!(
        Event::DevicesOccupied { node: NodeId(0), devices: vec![], by: String::new() }.workload(),
        None
    );
}
