//! Hand-computed cases for the packing policies and FGD's fragmentation measure, and a property
//! test that no sequence of placements over-allocates a GPU, CPU or memory.
//!
//! Each policy case goes through one `check` helper: a cluster described as nodes with their
//! GPUs' free shares, one pod, and the node and GPUs the policy must choose (or none).

use allot_core::packing::{
    MILLI, ModelSet, PackCluster, PackNodeSpec, PackPlacement, PackPolicy, PodShape, RandomSource,
    TargetClass, TargetMix,
};
use proptest::prelude::*;

/// A node for a case: CPU free (millicores), model index, and each GPU's free shares.
struct Node {
    cpu: u64,
    model: u8,
    gpus: Vec<u16>,
}

fn node(cpu: u64, gpus: &[u16]) -> Node {
    Node { cpu, model: 0, gpus: gpus.to_vec() }
}

fn pod(cpu: u64, gpus: u8, milli: u16) -> PodShape {
    PodShape {
        cpu_milli: cpu,
        memory_mib: 0,
        gpus,
        gpu_milli: milli,
        models: ModelSet::ANY,
        class: 0,
    }
}

/// Build a cluster whose nodes have the free shares given: each starts empty (CPU = 128 cores,
/// memory plenty) and is brought to its state by committing filler pods, so the test goes
/// through the same booking path as a run.
fn cluster(nodes: &[Node], mix: TargetMix) -> PackCluster {
    let specs: Vec<PackNodeSpec> = nodes
        .iter()
        .map(|n| PackNodeSpec {
            cpu_milli: 128_000,
            memory_mib: 1 << 20,
            gpus: n.gpus.len() as u8,
            model: n.model,
        })
        .collect();
    let mut cluster = PackCluster::new(&specs, mix);
    for (index, n) in nodes.iter().enumerate() {
        let cpu_filler = PodShape { class: 999, ..pod(128_000 - n.cpu, 0, 0) };
        cluster.commit(&cpu_filler, &PackPlacement { node: index, gpus: vec![] });
        for (gpu, &free) in n.gpus.iter().enumerate() {
            if free < MILLI {
                let filler = PodShape { class: 999, ..pod(0, 1, MILLI - free) };
                cluster.commit(&filler, &PackPlacement { node: index, gpus: vec![gpu as u8] });
            }
        }
    }
    cluster
}

/// Always draws the same index (clamped), for the random policy.
struct Fixed(u64);

impl RandomSource for Fixed {
    fn below(&mut self, n: u64) -> u64 {
        self.0.min(n - 1)
    }
}

fn no_mix() -> TargetMix {
    TargetMix::new(Vec::new())
}

#[track_caller]
fn check(
    policy: PackPolicy,
    nodes: &[Node],
    pod: PodShape,
    mix: TargetMix,
    want: Option<(usize, &[u8])>,
) {
    let mut c = cluster(nodes, mix);
    let got = c.choose(policy, &pod, &mut Fixed(0));
    let want = want.map(|(node, gpus)| PackPlacement { node, gpus: gpus.to_vec() });
    assert_eq!(got, want, "{policy} placing {pod:?}");
}

#[test]
fn fragment_of_a_node_by_hand() {
    // Free [1000, 500, 300, 0], idle 1800, 10 cores free.
    // Class A (1 core, 1×500, p .5): fits; shares on GPUs below 500: 300 + 0 = 300.
    // Class B (1 core, 1×1000, p .25): fits; below 1000: 500 + 300 = 800.
    // Class C (CPU-only, p .25): every idle share counts: 1800.
    // F = .5·300 + .25·800 + .25·1800 = 800.
    let mix = TargetMix::new(vec![
        TargetClass {
            cpu_milli: 1000,
            gpus: 1,
            gpu_milli: 500,
            models: ModelSet::ANY,
            popularity: 0.5,
        },
        TargetClass {
            cpu_milli: 1000,
            gpus: 1,
            gpu_milli: 1000,
            models: ModelSet::ANY,
            popularity: 0.25,
        },
        TargetClass {
            cpu_milli: 1000,
            gpus: 0,
            gpu_milli: 0,
            models: ModelSet::ANY,
            popularity: 0.25,
        },
    ]);
    assert_eq!(mix.node_fragment(10_000, 0, &[1000, 500, 300, 0]), 800.0);
    // Too little CPU for A and B: all idle shares are fragment for every class.
    assert_eq!(mix.node_fragment(500, 0, &[1000, 500, 300, 0]), 1800.0);
    // A class that needs 2 whole GPUs cannot run on a node with one free GPU: all idle.
    let big = TargetMix::new(vec![TargetClass {
        cpu_milli: 0,
        gpus: 2,
        gpu_milli: 1000,
        models: ModelSet::ANY,
        popularity: 1.0,
    }]);
    assert_eq!(big.node_fragment(10_000, 0, &[1000, 500]), 1500.0);
    // A class restricted to model 1 cannot use model 0's shares at all.
    let picky = TargetMix::new(vec![TargetClass {
        cpu_milli: 0,
        gpus: 1,
        gpu_milli: 100,
        models: ModelSet(0).with(1),
        popularity: 1.0,
    }]);
    assert_eq!(picky.node_fragment(10_000, 0, &[1000, 50]), 1050.0);
    assert_eq!(picky.node_fragment(10_000, 1, &[1000, 50]), 50.0);
    // Nothing idle, nothing fragmented.
    assert_eq!(mix.node_fragment(10_000, 0, &[0, 0]), 0.0);
}

#[test]
fn whole_gpus_go_to_the_lowest_index_fully_free_gpus() {
    let nodes = [node(64_000, &[1000, 400, 1000, 1000])];
    for policy in PackPolicy::ALL {
        check(policy, &nodes, pod(1000, 2, 1000), no_mix(), Some((0, &[0, 2])));
    }
}

#[test]
fn infeasible_pods_get_no_placement() {
    let nodes = [node(4_000, &[1000, 1000]), node(64_000, &[300, 1000])];
    for policy in PackPolicy::ALL {
        // Three whole GPUs: no node has three.
        check(policy, &nodes, pod(1000, 3, 1000), no_mix(), None);
        // 800 shares with 8 cores: node 0 lacks CPU; node 1 has a whole GPU free.
        check(policy, &nodes, pod(8_000, 1, 800), no_mix(), Some((1, &[1])));
    }
    // A model constraint no node meets.
    let picky = PodShape { models: ModelSet(0).with(3), ..pod(1000, 1, 500) };
    check(PackPolicy::Fgd, &nodes, picky, no_mix(), None);
}

#[test]
fn best_fit_takes_the_fullest_node_and_the_tightest_gpu() {
    // raw = trunc(100·(1 − .5·cpu_left/128000 − .5·gpu_left/8000)):
    // node 0: cpu_left 63000, gpu_left 1500 → trunc(100·(1 − .2461 − .0938)) = 66
    // node 1: cpu_left 15000, gpu_left 1200 → trunc(100·(1 − .0586 − .0750)) = 86
    let nodes = [node(64_000, &[1000, 1000]), node(16_000, &[700, 1000])];
    check(PackPolicy::BestFit, &nodes, pod(1000, 1, 500), no_mix(), Some((1, &[0])));
}

#[test]
fn dot_product_prefers_the_node_with_less_free_along_the_request() {
    // u = (64000/128000, 1000/8000) = (.5, .125).
    // node 0 (64 cores, 2000 shares): v = (.5, .25), v·u = .28125 → trunc(100·(1 − .1406)) = 85
    // node 1 (64 cores, 1000 shares): v = (.5, .125), v·u = .2656 → trunc(100·(1 − .1328)) = 86
    let nodes = [node(64_000, &[1000, 1000]), node(64_000, &[1000, 0])];
    check(PackPolicy::DotProd, &nodes, pod(64_000, 1, 1000), no_mix(), Some((1, &[0])));
}

#[test]
fn packing_prefers_shared_gpus_then_used_nodes_then_small_empty_nodes() {
    // Node 0 empty (8 GPUs → max(33−8, 8) = 25), node 1 used with a free GPU (50 − 1 = 49),
    // node 2 has a partly used GPU with 600 free (100 − ⌊60/10⌋ = 94).
    let nodes = [node(64_000, &[1000; 8]), node(64_000, &[1000, 0]), node(64_000, &[600, 0])];
    check(PackPolicy::Packing, &nodes, pod(1000, 1, 500), no_mix(), Some((2, &[0])));
    // A whole GPU: node 2 cannot; node 1 (49) beats the empty node 0 (25).
    check(PackPolicy::Packing, &nodes, pod(1000, 1, 1000), no_mix(), Some((1, &[0])));
    // Among empty nodes the one with fewer GPUs scores higher: 2 GPUs → 31 > 8 GPUs → 25.
    let empty = [node(64_000, &[1000; 8]), node(64_000, &[1000; 2])];
    check(PackPolicy::Packing, &empty, pod(1000, 1, 1000), no_mix(), Some((1, &[0])));
}

#[test]
fn clustering_prefers_nodes_hosting_the_same_shape() {
    let specs = [PackNodeSpec { cpu_milli: 64_000, memory_mib: 1 << 20, gpus: 4, model: 0 }; 3];
    let mut c = PackCluster::new(&specs, no_mix());
    // Node 1 hosts a sharing pod, node 2 a whole-GPU pod.
    let share = pod(1000, 1, 300);
    let whole = pod(1000, 1, 1000);
    c.commit(&share, &PackPlacement { node: 1, gpus: vec![0] });
    c.commit(&whole, &PackPlacement { node: 2, gpus: vec![0] });
    // Another sharing pod: node 1 = ⌊25·(8000−3700)/8000⌋ + 75 = 13 + 75 = 88;
    // node 0 = ⌊25·4000/8000⌋ + 25 = 37; node 2 = ⌊25·5000/8000⌋ + 0 = 15.
    let got = c.choose(PackPolicy::Clustering, &share, &mut Fixed(0));
    assert_eq!(got.map(|p| p.node), Some(1));
    // Another whole-GPU pod goes to node 2: 15 + 75 = 90 against 37 and 13.
    let got = c.choose(PackPolicy::Clustering, &whole, &mut Fixed(0));
    assert_eq!(got.map(|p| p.node), Some(2));
}

/// Half the pods want a whole GPU, half want 500 shares; no CPU.
fn whole_or_half_mix() -> TargetMix {
    TargetMix::new(vec![
        TargetClass {
            cpu_milli: 0,
            gpus: 1,
            gpu_milli: 1000,
            models: ModelSet::ANY,
            popularity: 0.5,
        },
        TargetClass {
            cpu_milli: 0,
            gpus: 1,
            gpu_milli: 500,
            models: ModelSet::ANY,
            popularity: 0.5,
        },
    ])
}

#[test]
fn fgd_keeps_whole_gpus_for_the_target_workload() {
    // Target: half the pods want a whole GPU, half want 500 shares. A 500-share pod on node 0
    // (two free GPUs) would leave a 500 fragment for whole-GPU pods; on node 1, whose GPU has
    // 500 free, it fills the hole and removes fragmentation. FGD picks node 1.
    let mix = whole_or_half_mix();
    let nodes = [node(64_000, &[1000, 1000]), node(64_000, &[1000, 500])];
    check(PackPolicy::Fgd, &nodes, pod(1000, 1, 500), mix.clone(), Some((1, &[1])));
    // Within node 1 it is GPU 1 (free 500 → 0), not GPU 0 (free 1000 → 500).
    // A 300-share pod: on GPU 1 of node 1 it leaves 200 (a fragment for both classes: Δ = −.5·…);
    // on a whole GPU it leaves 700 (a fragment for whole-GPU pods only). Check FGD prefers the
    // placement that grows fragmentation least, by computing both by hand:
    // node 1 before: F = .5·500 (whole-GPU class: 500 on GPU 1) + .5·0 = 250.
    //  GPU 1 → [1000, 200]: F = .5·200 + .5·200 = 200 → Δ = +50 → score 51.
    //  GPU 0 → [700, 500]:  F = .5·1200 + .5·0 = 600 → Δ = −350 → score 41.
    // node 0 before: F = 0. GPU 0 → [700, 1000]: F = .5·700 + 0 = 350 → Δ = −350 → score 41.
    check(PackPolicy::Fgd, &nodes, pod(1000, 1, 300), mix, Some((1, &[1])));
}

#[test]
fn allot_keeps_cpu_where_free_gpus_need_it() {
    // Target: one class, 1 whole GPU with 4 cores: the mix needs 4 cores per GPU.
    // A CPU-only pod of 26 cores, nodes A (2 free GPUs, 32 cores) and B (2 free GPUs, 100 cores).
    // FGD: on A 6 cores stay, still ≥ 4, so the class runs there before and after: Δ = 0 on
    //  both nodes, score 50 on both, and the earlier node, A, wins.
    // allot: on A the stranded shares grow from max(0, 2000 − 1000·32/4) = 0 to
    //  2000 − 1000·6/4 = 500: score trunc(100·sigmoid(−0.5)) = 37; on B nothing strands
    //  (74 cores feed 18 GPUs): 50. B wins.
    let mix = TargetMix::new(vec![TargetClass {
        cpu_milli: 4_000,
        gpus: 1,
        gpu_milli: 1000,
        models: ModelSet::ANY,
        popularity: 1.0,
    }]);
    assert_eq!(mix.cpu_stranded(6_000, 2_000), 500.0);
    assert_eq!(mix.cpu_stranded(32_000, 2_000), 0.0);
    let nodes = [node(32_000, &[1000, 1000]), node(100_000, &[1000, 1000])];
    check(PackPolicy::Fgd, &nodes, pod(26_000, 0, 0), mix.clone(), Some((0, &[])));
    check(PackPolicy::Allot, &nodes, pod(26_000, 0, 0), mix.clone(), Some((1, &[])));
    // A GPU pod of 30 cores and 1 GPU: on A 2 cores stay for 1 free GPU — the class cannot run
    // (FGD: fragment 1000, Δ = −1000, score 26); on B 70 cores stay (score 50). Both pick B.
    check(PackPolicy::Fgd, &nodes, pod(30_000, 1, 1000), mix.clone(), Some((1, &[0])));
    check(PackPolicy::Allot, &nodes, pod(30_000, 1, 1000), mix, Some((1, &[0])));
}

#[test]
fn allot_is_fgd_when_cpu_is_plentiful() {
    // The FGD case above, with 64 free cores on every node and a mix that asks none: nothing
    // strands, so allot makes FGD's choices.
    let mix = whole_or_half_mix();
    assert_eq!(mix.cpu_stranded(0, 8_000), 0.0);
    let nodes = [node(64_000, &[1000, 1000]), node(64_000, &[1000, 500])];
    check(PackPolicy::Allot, &nodes, pod(1000, 1, 500), mix.clone(), Some((1, &[1])));
    check(PackPolicy::Allot, &nodes, pod(1000, 1, 300), mix, Some((1, &[1])));
}

#[test]
fn equal_scores_go_to_the_earlier_node() {
    let nodes = [node(64_000, &[1000]), node(64_000, &[1000]), node(64_000, &[1000])];
    for policy in PackPolicy::ALL {
        check(policy, &nodes, pod(1000, 1, 1000), no_mix(), Some((0, &[0])));
    }
}

#[test]
fn random_draws_among_feasible_nodes_and_fitting_gpus() {
    let nodes = [node(1_000, &[1000]), node(64_000, &[200, 600]), node(64_000, &[1000, 1000])];
    let mut c = cluster(&nodes, no_mix());
    // Feasible for 4 cores × 500 shares: nodes 1 and 2. Draw 1 → node 2; its fitting GPUs are
    // 0 and 1; draw 1 → GPU 1.
    let got = c.choose(PackPolicy::Random, &pod(4_000, 1, 500), &mut Fixed(1));
    assert_eq!(got, Some(PackPlacement { node: 2, gpus: vec![1] }));
}

#[test]
fn cpu_only_pods_take_no_gpu_and_count_no_shares() {
    let nodes = [node(64_000, &[1000])];
    for policy in PackPolicy::ALL {
        let mut c = cluster(&nodes, no_mix());
        let p = pod(2_000, 0, 0);
        let got = c.choose(policy, &p, &mut Fixed(0));
        assert_eq!(got, Some(PackPlacement { node: 0, gpus: vec![] }));
        if let Some(placement) = got {
            c.commit(&p, &placement);
        }
        assert_eq!(c.used_milli(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    /// Whatever arrives, under any policy: a GPU's shares never go below zero, CPU and memory
    /// never over-commit, and the allocated total equals the shares taken.
    #[test]
    fn placements_never_over_allocate(
        policy in 0usize..6,
        shapes in prop::collection::vec((0u8..4, 1u8..=4, 0u16..=1000, 0u64..40_000, 0u64..200_000), 1..120),
        seed in 0u64..1000,
    ) {
        let specs = [
            PackNodeSpec { cpu_milli: 64_000, memory_mib: 256_000, gpus: 2, model: 0 },
            PackNodeSpec { cpu_milli: 96_000, memory_mib: 400_000, gpus: 8, model: 1 },
            PackNodeSpec { cpu_milli: 32_000, memory_mib: 128_000, gpus: 4, model: 0 },
        ];
        let mix = TargetMix::new(vec![
            TargetClass { cpu_milli: 4000, gpus: 1, gpu_milli: 500, models: ModelSet::ANY, popularity: 0.6 },
            TargetClass { cpu_milli: 8000, gpus: 2, gpu_milli: 1000, models: ModelSet::ANY, popularity: 0.4 },
        ]);
        let mut cluster = PackCluster::new(&specs, mix);
        let policy = PackPolicy::ALL[policy];
        let mut random = Fixed(seed % 3);
        let mut cpu_used = [0u64; 3];
        let mut mem_used = [0u64; 3];
        let mut shares_taken = 0u64;
        for (i, (kind, gpus, milli, cpu, mem)) in shapes.into_iter().enumerate() {
            let p = match kind {
                0 => PodShape { cpu_milli: cpu, memory_mib: mem, gpus: 0, gpu_milli: 0, models: ModelSet::ANY, class: 0 },
                1 => PodShape { cpu_milli: cpu, memory_mib: mem, gpus: 1, gpu_milli: milli.max(1), models: ModelSet::ANY, class: 1 + u32::from(milli / 100) },
                2 => PodShape { cpu_milli: cpu, memory_mib: mem, gpus, gpu_milli: 1000, models: ModelSet::ANY, class: 20 + u32::from(gpus) },
                _ => PodShape { cpu_milli: cpu, memory_mib: mem, gpus: 1, gpu_milli: 1000, models: ModelSet(0).with(1), class: 30 },
            };
            let before: Vec<Vec<u16>> = (0..3).map(|n| cluster.gpu_free(n).to_vec()).collect();
            if let Some(placement) = cluster.choose(policy, &p, &mut random) {
                let n = placement.node;
                prop_assert!(cpu_used[n] + p.cpu_milli <= specs[n].cpu_milli, "pod {i} over-commits CPU");
                prop_assert!(mem_used[n] + p.memory_mib <= specs[n].memory_mib, "pod {i} over-commits memory");
                prop_assert_eq!(placement.gpus.len(), if p.is_cpu_only() { 0 } else { usize::from(p.gpus) });
                for &g in &placement.gpus {
                    prop_assert!(before[n][usize::from(g)] >= p.gpu_milli, "pod {i} on a GPU without room");
                }
                let mut distinct = placement.gpus.clone();
                distinct.sort_unstable();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), placement.gpus.len());
                cluster.commit(&p, &placement);
                cpu_used[n] += p.cpu_milli;
                mem_used[n] += p.memory_mib;
                shares_taken += p.total_milli();
            }
            let free: u64 = (0..3).flat_map(|n| cluster.gpu_free(n).to_vec()).map(u64::from).sum();
            prop_assert_eq!(cluster.used_milli(), shares_taken);
            prop_assert_eq!(free + shares_taken, cluster.capacity_milli());
        }
    }
}
