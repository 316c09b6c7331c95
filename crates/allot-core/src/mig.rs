//! NVIDIA MIG (Multi-Instance GPU): the profile tables of the GPUs allot knows, and the slot
//! state of one GPU (which memory slices, compute slices and media engines its instances use).
//! Pure data and arithmetic; the engine keeps one [`MigState`] per MIG-enabled device.
//!
//! # Sources
//!
//! - Profiles and their fractions: NVIDIA MIG User Guide, "Supported MIG Profiles"
//!   (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): 7 compute
//!   slices and 8 memory slices per GPU; a 1g profile takes 1/8 of the memory, the
//!   double-memory 1g and the 2g 2/8, 3g and 4g 4/8, 7g all of it; `+me` (media extensions) is
//!   allowed on a single 1g instance per GPU. The A100-80GB names are the A100-40GB ones with
//!   the memory doubled (1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb).
//! - Placements: the same guide, "Getting Started with MIG" → "List GPU Instance Profiles",
//!   `nvidia-smi mig -lgipp` on an A100 (each line `{starts}:size` in memory slices, as NVML's
//!   `nvmlGpuInstancePlacement_t {start, size}`):
//!   profile 19 (1g.5gb) `{0,1,2,3,4,5,6}:1`, 20 (1g.5gb+me) `{0,1,2,3,4,5,6}:1`,
//!   15 (1g.10gb) `{0,2,4,6}:2`, 14 (2g.10gb) `{0,2,4}:2`, 9 (3g.20gb) `{0,4}:4`,
//!   5 (4g.20gb) `{0}:4`, 0 (7g.40gb) `{0}:8`. NVIDIA's H100 NVL material prints the same seven
//!   lines, and the H100/H200 profile tables have the same fractions, so one geometry serves
//!   every GPU here; only the memory in the names differs.
//! - Per-GPU maximum counts (7, 1, 4, 3, 2, 1, 1) are those of the guide's tables; they follow
//!   from the placements and the 7 compute slices, which the tests check.
//! - H100-94GB / H100 NVL names (1g.12gb, 1g.24gb, 2g.24gb, 3g.47gb, 4g.47gb, 7g.94gb) and
//!   H200 names (1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb) as the GPU Operator's
//!   default mig-parted config writes them (`docs/reference/telemetry-and-crates.md` §2.5).

use std::fmt;

use crate::ids::{SHARES_PER_GPU, Shares};

/// Memory slices of one MIG-capable GPU.
pub const MEMORY_SLICES: u8 = 8;
/// Compute slices of one MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;

/// A MIG profile as a workload asks for it: `3g.40gb`, `1g.10gb+me`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigProfile {
    /// Compute slices, 1..=7 (the `Ng` of the name).
    pub compute_slices: u8,
    /// Memory in GB as the name writes it (the `Mgb` of the name).
    pub memory_gb: u16,
    /// `+me`: the instance takes the GPU's media engines.
    pub media_extensions: bool,
}

impl MigProfile {
    /// Parses `3g.40gb`, `1g.10gb+me`, also with a `mig-` prefix (`mig-3g.40gb`, as Kubernetes
    /// resource names write it). Case-insensitive. `None` for anything else.
    pub fn parse(text: &str) -> Option<MigProfile> {
        let lower = text.trim().to_ascii_lowercase();
        let body = lower.strip_prefix("mig-").unwrap_or(&lower);
        let (body, media_extensions) = match body.strip_suffix("+me") {
            Some(b) => (b, true),
            None => (body, false),
        };
        let (compute, memory) = body.split_once("g.")?;
        let memory = memory.strip_suffix("gb")?;
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(compute) || !digits(memory) {
            return None;
        }
        let compute_slices: u8 = compute.parse().ok()?;
        let memory_gb: u16 = memory.parse().ok()?;
        if !(1..=COMPUTE_SLICES).contains(&compute_slices) || memory_gb == 0 {
            return None;
        }
        Some(MigProfile { compute_slices, memory_gb, media_extensions })
    }

    /// Quota charged for one instance: its compute slices as a share of the GPU, rounded down
    /// (`compute_slices × 1000 / 7`: 1g = 142, 2g = 285, 3g = 428, 4g = 571, 7g = 1000). Compute,
    /// not memory, because compute is what the GPU has 7 of and what a 7g instance uses whole.
    pub fn shares(self) -> Shares {
        Shares(u64::from(self.compute_slices) * SHARES_PER_GPU / u64::from(COMPUTE_SLICES))
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb", self.compute_slices, self.memory_gb)?;
        if self.media_extensions {
            write!(f, "+me")?;
        }
        Ok(())
    }
}

/// One profile of one GPU model: how many memory slices it takes and where it may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileSpec {
    pub profile: MigProfile,
    /// Memory slices an instance occupies (the placement `size`).
    pub memory_slices: u8,
    /// Valid first memory slices (the placement `start`s).
    pub starts: &'static [u8],
    /// Most instances of this profile on one GPU.
    pub max_count: u8,
}

const STARTS_1G: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const STARTS_1G_DOUBLE: &[u8] = &[0, 2, 4, 6];
const STARTS_2G: &[u8] = &[0, 2, 4];
const STARTS_3G: &[u8] = &[0, 4];
const STARTS_HALF: &[u8] = &[0];

const fn spec(
    compute_slices: u8,
    memory_gb: u16,
    media_extensions: bool,
    memory_slices: u8,
    starts: &'static [u8],
    max_count: u8,
) -> ProfileSpec {
    ProfileSpec {
        profile: MigProfile { compute_slices, memory_gb, media_extensions },
        memory_slices,
        starts,
        max_count,
    }
}

/// The seven profiles of the common geometry, largest first (the order the start rule uses).
/// `gb` = memory in GB of (1g, double-memory 1g and 2g, 3g and 4g, 7g).
const fn geometry(g1: u16, g2: u16, g4: u16, g8: u16) -> [ProfileSpec; 7] {
    [
        spec(7, g8, false, 8, STARTS_HALF, 1),
        spec(4, g4, false, 4, STARTS_HALF, 1),
        spec(3, g4, false, 4, STARTS_3G, 2),
        spec(2, g2, false, 2, STARTS_2G, 3),
        spec(1, g2, false, 2, STARTS_1G_DOUBLE, 4),
        spec(1, g1, false, 1, STARTS_1G, 7),
        spec(1, g1, true, 1, STARTS_1G, 1),
    ]
}

static A100_40GB: [ProfileSpec; 7] = geometry(5, 10, 20, 40);
static GB_80: [ProfileSpec; 7] = geometry(10, 20, 40, 80);
static H100_94GB: [ProfileSpec; 7] = geometry(12, 24, 47, 94);
static H200_141GB: [ProfileSpec; 7] = geometry(18, 35, 71, 141);

/// A GPU model with a MIG table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MigGpu {
    /// A100 40 GB (SXM4 or PCIe).
    A100M40,
    /// A100 80 GB (SXM4 or PCIe).
    A100M80,
    /// H100 80 GB (SXM5 or PCIe).
    H100M80,
    /// H100 94 GB (H100 NVL, SXM5 94 GB).
    H100M94,
    /// H200 141 GB (SXM or NVL).
    H200M141,
}

/// Accepted model names per table (compared case-insensitively), canonical name first.
const NAMES: [(MigGpu, &[&str]); 5] = [
    (MigGpu::A100M40, &["A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"]),
    (MigGpu::A100M80, &["A100-80GB", "A100-SXM4-80GB", "A100-PCIE-80GB"]),
    (MigGpu::H100M80, &["H100-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB"]),
    (MigGpu::H100M94, &["H100-94GB", "H100-NVL", "H100-SXM5-94GB", "H100-PCIE-94GB"]),
    (MigGpu::H200M141, &["H200-141GB", "H200", "H200-SXM5-141GB", "H200-NVL"]),
];

impl MigGpu {
    /// The table for a GPU model name (`A100-80GB`, `H100-NVL`, …), case-insensitive.
    pub fn from_model(name: &str) -> Option<MigGpu> {
        let name = name.trim();
        NAMES
            .iter()
            .find(|(_, names)| names.iter().any(|n| n.eq_ignore_ascii_case(name)))
            .map(|(gpu, _)| *gpu)
    }

    /// The canonical model names with a MIG table, for error messages.
    pub fn known_models() -> Vec<&'static str> {
        NAMES.iter().map(|(_, names)| names[0]).collect()
    }

    /// The canonical model name.
    pub fn name(self) -> &'static str {
        NAMES.iter().find(|(g, _)| *g == self).map_or("?", |(_, names)| names[0])
    }

    /// Every profile of this GPU, largest first.
    pub fn profiles(self) -> &'static [ProfileSpec] {
        match self {
            MigGpu::A100M40 => &A100_40GB,
            MigGpu::A100M80 | MigGpu::H100M80 => &GB_80,
            MigGpu::H100M94 => &H100_94GB,
            MigGpu::H200M141 => &H200_141GB,
        }
    }

    /// The spec of `profile` on this GPU, if it has one.
    pub fn profile(self, profile: MigProfile) -> Option<&'static ProfileSpec> {
        self.profiles().iter().find(|s| s.profile == profile)
    }
}

/// One instance on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Instance {
    profile: MigProfile,
    memory_slices: u8,
}

/// The slot state of one MIG-enabled GPU: occupied memory slices (a bitmask, bit i = slice
/// i), compute slices in use (≤ 7), whether the media engines are taken, and the instance that
/// starts at each memory slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigState {
    gpu: MigGpu,
    occupied: u8,
    compute_used: u8,
    media_used: bool,
    instances: [Option<Instance>; MEMORY_SLICES as usize],
}

fn mask(start: u8, size: u8) -> u8 {
    let bits: u16 = ((1u16 << size) - 1) << start;
    (bits & 0xff) as u8
}

impl MigState {
    /// An empty GPU.
    pub fn new(gpu: MigGpu) -> MigState {
        MigState {
            gpu,
            occupied: 0,
            compute_used: 0,
            media_used: false,
            instances: [None; MEMORY_SLICES as usize],
        }
    }

    pub fn gpu(&self) -> MigGpu {
        self.gpu
    }
    /// Occupied memory slices, bit i = slice i.
    pub fn occupied(&self) -> u8 {
        self.occupied
    }
    pub fn free_memory_slices(&self) -> u8 {
        MEMORY_SLICES - self.occupied.count_ones() as u8
    }
    pub fn compute_used(&self) -> u8 {
        self.compute_used
    }
    pub fn media_used(&self) -> bool {
        self.media_used
    }
    /// No instance on the GPU.
    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }
    /// The instances, by start: (start, profile).
    pub fn instances(&self) -> impl Iterator<Item = (u8, MigProfile)> + '_ {
        self.instances.iter().enumerate().filter_map(|(s, i)| i.map(|i| (s as u8, i.profile)))
    }

    fn fits_spec_at(&self, spec: &ProfileSpec, start: u8) -> bool {
        spec.starts.contains(&start)
            && u16::from(start) + u16::from(spec.memory_slices) <= u16::from(MEMORY_SLICES)
            && self.occupied & mask(start, spec.memory_slices) == 0
            && self.compute_used + spec.profile.compute_slices <= COMPUTE_SLICES
            && !(spec.profile.media_extensions && self.media_used)
    }

    /// Whether an instance of `profile` could start at `start` now.
    pub fn fits_at(&self, profile: MigProfile, start: u8) -> bool {
        self.gpu.profile(profile).is_some_and(|spec| self.fits_spec_at(spec, start))
    }

    /// Whether an instance of `profile` fits anywhere now.
    pub fn fits(&self, profile: MigProfile) -> bool {
        self.best_start(profile).is_some()
    }

    /// The start `place` would choose. The rule keeps the most future options, largest
    /// profiles first: for each valid free start, count — per profile of the table, largest
    /// first — the placements that would still be entirely free of occupied memory slices;
    /// take the start whose counts are lexicographically largest, the lowest start on a tie.
    /// So a 3g goes to slice 4 on an empty GPU (a 4g can still start at 0), a 1g to slice 6
    /// (the 4g at 0 and all three 2g starts stay open) — the order `nvidia-smi` itself fills.
    pub fn best_start(&self, profile: MigProfile) -> Option<u8> {
        let spec = self.gpu.profile(profile)?;
        let mut best: Option<(Vec<u8>, u8)> = None;
        for &start in spec.starts {
            if !self.fits_spec_at(spec, start) {
                continue;
            }
            let after = self.occupied | mask(start, spec.memory_slices);
            let counts: Vec<u8> = self
                .gpu
                .profiles()
                .iter()
                .map(|p| {
                    p.starts.iter().filter(|&&s| after & mask(s, p.memory_slices) == 0).count()
                        as u8
                })
                .collect();
            // Strictly larger only: on a tie the earlier (lower) start stays.
            if best.as_ref().is_none_or(|(b, _)| counts > *b) {
                best = Some((counts, start));
            }
        }
        best.map(|(_, start)| start)
    }

    /// Places an instance of `profile` at `start`; `false` (and nothing changes) if it does
    /// not fit there.
    pub fn occupy(&mut self, profile: MigProfile, start: u8) -> bool {
        let Some(spec) = self.gpu.profile(profile) else { return false };
        if !self.fits_spec_at(spec, start) {
            return false;
        }
        self.occupied |= mask(start, spec.memory_slices);
        self.compute_used += profile.compute_slices;
        self.media_used |= profile.media_extensions;
        self.instances[start as usize] =
            Some(Instance { profile, memory_slices: spec.memory_slices });
        true
    }

    /// Places an instance of `profile` at the start [`best_start`](Self::best_start) chooses.
    pub fn place(&mut self, profile: MigProfile) -> Option<u8> {
        let start = self.best_start(profile)?;
        self.occupy(profile, start).then_some(start)
    }

    /// Removes the instance that starts at `start`; its profile, or `None` if there is none.
    pub fn free(&mut self, start: u8) -> Option<MigProfile> {
        let instance = self.instances.get_mut(start as usize)?.take()?;
        self.occupied &= !mask(start, instance.memory_slices);
        self.compute_used -= instance.profile.compute_slices;
        if instance.profile.media_extensions {
            self.media_used = false;
        }
        Some(instance.profile)
    }
}

// Snapshot encoding (`codec.rs`).
crate::codec::codec_struct!(MigProfile { compute_slices, memory_gb, media_extensions });

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> MigProfile {
        MigProfile::parse(s).expect(s)
    }

    #[test]
    fn names_round_trip() {
        for gpu in [MigGpu::A100M40, MigGpu::A100M80, MigGpu::H100M94, MigGpu::H200M141] {
            for spec in gpu.profiles() {
                assert_eq!(MigProfile::parse(&spec.profile.to_string()), Some(spec.profile));
            }
        }
        assert_eq!(p("MIG-3g.40GB"), p("3g.40gb"));
        for bad in
            ["", "3g", "3g.gb", "8g.40gb", "0g.5gb", "3g.0gb", "g.40gb", "3g.40gb+m", "3x.40gb"]
        {
            assert_eq!(MigProfile::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn shares_by_compute() {
        let shares: Vec<u64> =
            ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"].map(|s| p(s).shares().0).into();
        assert_eq!(shares, vec![142, 285, 428, 571, 1000]);
    }

    #[test]
    fn models_resolve() {
        assert_eq!(MigGpu::from_model("a100-80gb"), Some(MigGpu::A100M80));
        assert_eq!(MigGpu::from_model("H100-NVL"), Some(MigGpu::H100M94));
        assert_eq!(MigGpu::from_model("A100"), None);
        assert_eq!(MigGpu::H200M141.profile(p("3g.71gb")).map(|s| s.memory_slices), Some(4));
        assert_eq!(MigGpu::A100M40.profile(p("1g.10gb")).map(|s| s.memory_slices), Some(2));
        assert_eq!(MigGpu::A100M80.profile(p("1g.10gb")).map(|s| s.memory_slices), Some(1));
        assert_eq!(MigGpu::A100M80.profile(p("3g.20gb")), None);
    }

    /// Placing one profile again and again reaches exactly the guide's maximum count.
    #[test]
    fn max_counts_follow_from_placements() {
        for gpu in [MigGpu::A100M40, MigGpu::A100M80, MigGpu::H100M94, MigGpu::H200M141] {
            for spec in gpu.profiles() {
                let mut s = MigState::new(gpu);
                let mut n = 0;
                while s.place(spec.profile).is_some() {
                    n += 1;
                }
                assert_eq!(n, spec.max_count, "{} on {}", spec.profile, gpu.name());
            }
        }
    }
}
