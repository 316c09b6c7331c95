//! MIG slot tables: hand-checked fit table for sequences of placements on one A100-80GB (the
//! start rule of `MigState::best_start` worked out by hand for each step), and a property test
//! that no sequence of place/free over-allocates and that free restores.

use allot_core::{
    ConfigError, DeviceSpec, Engine, MigGpu, MigProfile, MigState, NodeSpec, PolicySpec,
    PriorityClassSpec,
};
use proptest::prelude::*;

fn p(s: &str) -> MigProfile {
    MigProfile::parse(s).expect(s)
}

/// Places `profiles` in order on an empty A100-80GB; the start each got, or `None`.
fn run(profiles: &[&str]) -> Vec<Option<u8>> {
    let mut gpu = MigState::new(MigGpu::A100M80);
    profiles.iter().map(|name| gpu.place(p(name))).collect()
}

/// Every pair of the seven A100-80GB profiles, the first placed by the rule on an empty GPU,
/// then the second: where each lands, or `None`. Worked out by hand from the placements
/// (7g {0}:8, 4g {0}:4, 3g {0,4}:4, 2g {0,2,4}:2, 1g.20gb {0,2,4,6}:2, 1g {0..6}:1) and the
/// start rule (most free placements left, largest profile first; lowest start on a tie).
#[test]
fn every_pair() {
    let names = ["7g.80gb", "4g.40gb", "3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb", "1g.10gb+me"];
    // First placement on an empty GPU: 7g and 4g at 0; 3g and 2g at 4 (a 4g can still go at
    // 0); the 1g profiles at 6 (the 4g at 0 and all three 2g starts stay open).
    let first = [Some(0), Some(0), Some(4), Some(4), Some(6), Some(6), Some(6)];
    // second[i][j]: where names[j] lands after names[i].
    let n = None;
    let second: [[Option<u8>; 7]; 7] = [
        // after 7g@0: the GPU is full.
        [n, n, n, n, n, n, n],
        // after 4g@0 (slices 0-3, 4 compute): 3g and 2g only at 4; the 1g profiles at 6
        // (keeps the 2g at 4 open).
        [n, n, Some(4), Some(4), Some(6), Some(6), Some(6)],
        // after 3g@4: 4g at 0 (4 + 3 = 7 compute), 3g at 0; the rest tie, lowest start 0.
        [n, Some(0), Some(0), Some(0), Some(0), Some(0), Some(0)],
        // after 2g@4: 4g and 3g at 0; 2g ties 0/2 → 0; the 1g profiles at 6.
        [n, Some(0), Some(0), Some(0), Some(6), Some(6), Some(6)],
        // after 1g.20gb@6: 3g only at 0 (4-7 overlaps 6); 2g and 1g.20gb at 4 (keep 4g at 0);
        // 1g: 4 and 5 tie → 4.
        [n, Some(0), Some(0), Some(4), Some(4), Some(4), Some(4)],
        // after 1g@6: the same as after 1g.20gb@6.
        [n, Some(0), Some(0), Some(4), Some(4), Some(4), Some(4)],
        // after 1g+me@6: the same, but a second +me has no media engines left.
        [n, Some(0), Some(0), Some(4), Some(4), Some(4), n],
    ];
    for (i, a) in names.iter().enumerate() {
        for (j, b) in names.iter().enumerate() {
            assert_eq!(run(&[a, b]), vec![first[i], second[i][j]], "{a} then {b}");
        }
    }
}

#[test]
fn triples_and_longer() {
    let cases: &[(&[&str], &[Option<u8>])] = &[
        // 4g + 3g fill the GPU: 7 compute, 8 memory slices.
        (&["4g.40gb", "3g.40gb", "1g.10gb"], &[Some(0), Some(4), None]),
        (&["4g.40gb", "2g.20gb", "1g.10gb"], &[Some(0), Some(4), Some(6)]),
        (&["4g.40gb", "2g.20gb", "2g.20gb"], &[Some(0), Some(4), None]),
        (&["3g.40gb", "3g.40gb", "1g.10gb"], &[Some(4), Some(0), None]),
        // 1g at 6 blocks a 3g at 4: the second 3g has nowhere to go.
        (&["1g.10gb", "3g.40gb", "3g.40gb"], &[Some(6), Some(0), None]),
        // Three 2g and a 1g: 7 compute slices; nothing more fits.
        (
            &["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            &[Some(4), Some(0), Some(2), Some(6), None],
        ),
        // The 3-2-1-1 geometry of the MIG guide, 3g first.
        (&["3g.40gb", "1g.10gb", "1g.10gb", "2g.20gb"], &[Some(4), Some(0), Some(1), Some(2)]),
        // The same set in another order fails, as in the guide's example with `nvidia-smi`:
        // 1g at 6 and 4, 2g at 0, then a 3g has neither 0-3 nor 4-7.
        (&["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"], &[Some(6), Some(4), Some(0), None]),
        (
            &["1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"],
            &[Some(6), Some(4), Some(0), Some(2), None],
        ),
        (&["1g.10gb"; 8], &[Some(6), Some(4), Some(5), Some(0), Some(1), Some(2), Some(3), None]),
        (&["7g.80gb", "1g.10gb"], &[Some(0), None]),
        // A profile of another GPU never fits.
        (&["3g.20gb"], &[None]),
    ];
    for (profiles, expect) in cases {
        assert_eq!(run(profiles), expect.to_vec(), "{profiles:?}");
    }
}

#[test]
fn explicit_starts() {
    let mut gpu = MigState::new(MigGpu::A100M80);
    // 3g placed at 0 blocks a 4g (which can only start at 0).
    assert!(gpu.occupy(p("3g.40gb"), 0));
    assert!(!gpu.fits(p("4g.40gb")));
    assert!(gpu.fits(p("3g.40gb")));
    // Not a valid start for a 2g; 1g at 7 is not a placement either.
    assert!(!gpu.fits_at(p("2g.20gb"), 6));
    assert!(!gpu.fits_at(p("1g.10gb"), 7));
    assert_eq!(gpu.free(0), Some(p("3g.40gb")));
    assert_eq!(gpu.free(0), None);
    assert!(gpu.is_empty());
    assert!(gpu.fits(p("4g.40gb")));
    // 1g at 6 blocks the 3g at 4 but not the one at 0.
    assert!(gpu.occupy(p("1g.10gb"), 6));
    assert!(!gpu.fits_at(p("3g.40gb"), 4));
    assert!(gpu.fits_at(p("3g.40gb"), 0));
}

/// A device declared MIG-enabled must have a model with a MIG table.
#[test]
fn engine_refuses_mig_without_a_table() {
    let node = |model: &str| NodeSpec {
        name: "n1".into(),
        cpu_millis: 1000,
        memory_mib: 1024,
        labels: Default::default(),
        pool: None,
        rack: None,
        devices: vec![DeviceSpec { model: model.into(), memory_mib: 81920, island: 0, mig: true }],
    };
    let policy = PolicySpec {
        priority_classes: vec![PriorityClassSpec { name: "c".into(), value: 0, preemptible: true }],
        default_priority_class: "c".into(),
        projects: Vec::new(),
        ..PolicySpec::minimal()
    };
    assert!(Engine::new(&[node("H200")], &policy).is_ok());
    let error = Engine::new(&[node("A100")], &policy).expect_err("no table for A100");
    assert_eq!(error, ConfigError::NoMigTable { node: "n1".into(), model: "A100".into() });
    assert!(error.to_string().contains("A100-40GB, A100-80GB"), "{error}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("ALLOT_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    /// Whatever sequence of place/free: memory slices and compute are never over-allocated
    /// (the mask is the union of the instances', compute the sum of theirs, ≤ 7, at most one
    /// media-engine instance), freeing what was just placed restores the state exactly, and
    /// freeing everything leaves an empty GPU.
    #[test]
    fn place_and_free_never_over_allocate(
        gpu in 0usize..4,
        ops in prop::collection::vec((any::<bool>(), 0usize..7, 0u8..8), 1..60),
    ) {
        let gpu = [MigGpu::A100M40, MigGpu::A100M80, MigGpu::H100M94, MigGpu::H200M141][gpu];
        let profiles = gpu.profiles();
        let mut state = MigState::new(gpu);
        for (is_place, which, start) in ops {
            if is_place {
                let before = state;
                let profile = profiles[which].profile;
                let fits = state.fits(profile);
                match state.place(profile) {
                    Some(s) => {
                        prop_assert!(fits);
                        let mut undo = state;
                        prop_assert_eq!(undo.free(s), Some(profile));
                        prop_assert_eq!(undo, before);
                    }
                    None => {
                        prop_assert!(!fits);
                        prop_assert_eq!(state, before);
                    }
                }
            } else {
                let _ = state.free(start);
            }
            let mut mask = 0u8;
            let mut compute = 0u8;
            let mut media = 0;
            for (s, profile) in state.instances() {
                let spec = gpu.profile(profile).expect("own profile");
                prop_assert!(spec.starts.contains(&s));
                let bits = (((1u16 << spec.memory_slices) - 1) << s) as u8;
                prop_assert_eq!(mask & bits, 0, "overlapping instances");
                mask |= bits;
                compute += profile.compute_slices;
                media += usize::from(profile.media_extensions);
            }
            prop_assert_eq!(mask, state.occupied());
            prop_assert_eq!(compute, state.compute_used());
            prop_assert!(compute <= 7);
            prop_assert!(media <= 1);
            prop_assert_eq!(media == 1, state.media_used());
        }
        let starts: Vec<u8> = state.instances().map(|(s, _)| s).collect();
        for s in starts {
            prop_assert!(state.free(s).is_some());
        }
        prop_assert_eq!(state, MigState::new(gpu));
    }
}
