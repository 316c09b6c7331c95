//! Finding this host's GPUs: NVML for NVIDIA (the library is loaded at run time; without it
//! there are simply no NVIDIA GPUs), sysfs for AMD. The parsers are pure functions over strings
//! and a sysfs root directory, so tests run them on text and on a fake tree.

use std::collections::BTreeMap;
use std::path::Path;

use allot_backend::Vendor;
use allot_core::{DeviceSpec, NodeSpec};

/// One GPU as discovered, before it becomes a `DeviceSpec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredGpu {
    /// CUDA/HIP ordinal (NVML index; AMD: order of the `cardN` directories).
    pub index: u32,
    pub vendor: Vendor,
    pub model: String,
    pub memory_mib: u64,
    /// NVML `GPU-…` UUID; `None` for AMD.
    pub uuid: Option<String>,
    pub mig: bool,
    /// Devices sharing a fast interconnect share a key (NVLink peers/switches, xGMI hive).
    /// `None`: connected to nothing but PCIe; the device is an island of its own.
    pub fabric: Vec<String>,
}

/// Tokens dropped from marketing names: vendor and family prefixes, and form factors that do
/// not change what the engine schedules (`SXM4`, `PCIe`, `HBM3`). `NVL` is kept: an H100 NVL
/// has 94 GB and a MIG table of its own.
const DROPPED_TOKENS: [&str; 14] = [
    "nvidia", "amd", "tesla", "geforce", "instinct", "sxm", "sxm2", "sxm3", "sxm4", "sxm5", "pcie",
    "hbm2e", "hbm3", "hbm3e",
];

/// The engine's model string for a vendor's product name: lower case, vendor/family prefixes
/// and form factors dropped, the rest joined by `-`.
///
/// `NVIDIA H200` → `h200`; `NVIDIA A100-SXM4-80GB` → `a100-80gb`; `NVIDIA H100 80GB HBM3` →
/// `h100-80gb`; `NVIDIA H100 NVL` → `h100-nvl`; `Tesla V100-SXM2-16GB` → `v100-16gb`;
/// `NVIDIA GeForce RTX 4090` → `rtx-4090`; `AMD Instinct MI300X` → `mi300x`. These match
/// `allot_core::MigGpu::from_model`'s names (case-insensitive) for the MIG-capable GPUs.
pub fn model_from_name(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    let kept: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|t| !t.is_empty() && !DROPPED_TOKENS.contains(t) && *t != "hbm2")
        .collect();
    if kept.is_empty() { "gpu".to_string() } else { kept.join("-") }
}

/// AMD GPUs under `sysfs_root` (`/sys` on a real host): every `class/drm/cardN` whose
/// `device/vendor` is `0x1002`, ordered by N. Memory from `device/mem_info_vram_total` (bytes),
/// model from `device/product_name` when the driver exposes it, else `amd-<device id>`; xGMI
/// hive from `device/xgmi_hive_info/xgmi_hive_id`.
/// The DRM cards under `sysfs_root` (`class/drm/cardN/device`), by N: AMD GPUs are numbered in
/// this order among them.
fn drm_cards(sysfs_root: &Path) -> Vec<(u32, std::path::PathBuf)> {
    let drm = sysfs_root.join("class/drm");
    let Ok(entries) = std::fs::read_dir(&drm) else { return Vec::new() };
    let mut cards: Vec<(u32, std::path::PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("card")?.parse().ok()?;
            Some((n, e.path().join("device")))
        })
        .collect();
    cards.sort();
    cards
}

pub fn amd_gpus(sysfs_root: &Path) -> Vec<DiscoveredGpu> {
    let cards = drm_cards(sysfs_root);
    let read = |dir: &Path, file: &str| {
        std::fs::read_to_string(dir.join(file)).ok().map(|s| s.trim().to_string())
    };
    let mut gpus = Vec::new();
    for (_, device) in cards {
        if read(&device, "vendor").as_deref() != Some("0x1002") {
            continue;
        }
        let memory_mib = read(&device, "mem_info_vram_total")
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(0, |bytes| bytes / (1024 * 1024));
        let model = match read(&device, "product_name").filter(|s| !s.is_empty()) {
            Some(product) => model_from_name(&product),
            None => {
                let id = read(&device, "device").unwrap_or_default();
                format!("amd-{}", id.trim_start_matches("0x"))
            }
        };
        let fabric = read(&device, "xgmi_hive_info/xgmi_hive_id")
            .filter(|id| !id.is_empty() && id != "0")
            .map(|id| vec![format!("xgmi:{id}")])
            .unwrap_or_default();
        gpus.push(DiscoveredGpu {
            index: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
            vendor: Vendor::Amd,
            model,
            memory_mib,
            uuid: None,
            mig: false,
            fabric,
        });
    }
    gpus
}

/// NVIDIA GPUs through NVML. `Err` says why NVML is unusable (no driver library, no devices);
/// the caller treats that as "no NVIDIA GPUs".
pub fn nvidia_gpus() -> Result<Vec<DiscoveredGpu>, String> {
    // NVML_NVLINK_MAX_LINKS in nvml.h.
    const NVLINK_MAX_LINKS: u32 = 18;
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
    let count = nvml.device_count().map_err(|e| format!("NVML device count: {e}"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let device =
            nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}"))?;
        let name = device.name().map_err(|e| format!("NVML device {index} name: {e}"))?;
        let memory_mib =
            device.memory_info().map_err(|e| format!("NVML device {index} memory: {e}"))?.total
                / (1024 * 1024);
        let uuid = device.uuid().ok();
        // NVML_DEVICE_MIG_ENABLE = 1; GPUs without MIG support answer NotSupported.
        let mig = device.mig_mode().is_ok_and(|m| m.current == 1);
        let mut fabric = Vec::new();
        for link in 0..NVLINK_MAX_LINKS {
            let link = device.link_wrapper_for(link);
            if link.is_active().unwrap_or(false)
                && let Ok(remote) = link.remote_pci_info()
            {
                fabric.push(format!("pci:{}", remote.bus_id.to_ascii_lowercase()));
            }
        }
        if !fabric.is_empty()
            && let Ok(own) = device.pci_info()
        {
            // Peers name this device by its own bus id: put it in the same component.
            fabric.push(format!("pci:{}", own.bus_id.to_ascii_lowercase()));
        }
        gpus.push(DiscoveredGpu {
            index,
            vendor: Vendor::Nvidia,
            model: model_from_name(&name),
            memory_mib,
            uuid,
            mig,
            fabric,
        });
    }
    Ok(gpus)
}

/// Island numbers for `gpus`, in order: devices whose fabric keys connect (directly or through
/// other devices) share an island; a device with no keys is alone. Islands are numbered from 0
/// in order of their first device, so the result is deterministic.
pub fn islands(gpus: &[DiscoveredGpu]) -> Vec<u32> {
    // Union-find over device positions; keys map to the first device that named them.
    let mut parent: Vec<usize> = (0..gpus.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut owner: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, gpu) in gpus.iter().enumerate() {
        for key in &gpu.fabric {
            match owner.get(key.as_str()) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a.max(b)] = a.min(b);
                }
                None => {
                    owner.insert(key, i);
                }
            }
        }
    }
    let mut numbers: BTreeMap<usize, u32> = BTreeMap::new();
    (0..gpus.len())
        .map(|i| {
            let r = root(&mut parent, i);
            let next = u32::try_from(numbers.len()).unwrap_or(u32::MAX);
            *numbers.entry(r).or_insert(next)
        })
        .collect()
}

/// `MemTotal` of `/proc/meminfo` text, in MiB.
pub fn mem_total_mib(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// This host as one node with `gpus` (NVIDIA first, then AMD; indices per vendor).
pub fn node_spec(name: &str, gpus: &[DiscoveredGpu]) -> NodeSpec {
    let cpu_millis = std::thread::available_parallelism()
        .map_or(1000, |n| u64::try_from(n.get()).unwrap_or(1).saturating_mul(1000));
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_mib(&text))
        .unwrap_or(0);
    let islands = islands(gpus);
    NodeSpec {
        name: name.to_string(),
        cpu_millis,
        memory_mib,
        labels: BTreeMap::new(),
        pool: None,
        rack: None,
        devices: gpus
            .iter()
            .zip(islands)
            .map(|(gpu, island)| DeviceSpec {
                model: gpu.model.clone(),
                memory_mib: gpu.memory_mib,
                island,
                mig: gpu.mig,
            })
            .collect(),
    }
}

/// This host's name (`/proc/sys/kernel/hostname`, else `/etc/hostname`, else `localhost`).
/// A device node through which a program reaches one GPU (`/dev/nvidiaN`; an AMD card's
/// `/dev/dri/cardN` and `/dev/dri/renderDN`), for the filter that denies a member the GPUs it
/// was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuDeviceNode {
    pub vendor: Vendor,
    /// The GPU's CUDA/HIP ordinal, as in [`DiscoveredGpu::index`].
    pub index: u32,
    pub major: u32,
    pub minor: u32,
}

/// AMD's compute interface, one node for every AMD GPU (`/dev/kfd`): the driver cannot fence
/// one GPU through it, so a member is denied it only when it was given no AMD GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedDeviceNode {
    pub major: u32,
    pub minor: u32,
}

/// `MAJOR:MINOR` of a sysfs `dev` file.
fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The GPUs' device nodes on this host: NVIDIA's `nvidiaN` under `dev_root` (the driver numbers
/// them by GPU: minor N is GPU N), and each AMD card's DRM nodes from sysfs, in the order
/// [`amd_gpus`] numbers the cards; and `/dev/kfd` when AMD's compute driver is loaded.
pub fn gpu_device_nodes(
    sysfs_root: &Path,
    dev_root: &Path,
) -> (Vec<GpuDeviceNode>, Option<SharedDeviceNode>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut nodes = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dev_root) {
        for entry in entries.filter_map(Result::ok) {
            let Some(n) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("nvidia"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
            if !meta.file_type().is_char_device() {
                continue;
            }
            let rdev = meta.rdev();
            nodes.push(GpuDeviceNode {
                vendor: Vendor::Nvidia,
                index: n,
                major: u32::try_from(nix::sys::stat::major(rdev)).unwrap_or(u32::MAX),
                minor: u32::try_from(nix::sys::stat::minor(rdev)).unwrap_or(u32::MAX),
            });
        }
    }
    let mut amd_index = 0;
    for (_, device) in drm_cards(sysfs_root) {
        let vendor = std::fs::read_to_string(device.join("vendor")).unwrap_or_default();
        if vendor.trim() != "0x1002" {
            continue;
        }
        for entry in std::fs::read_dir(device.join("drm")).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("card") || name.starts_with("renderD")) {
                continue;
            }
            if let Some((major, minor)) =
                std::fs::read_to_string(entry.path().join("dev")).ok().and_then(|t| parse_dev(&t))
            {
                nodes.push(GpuDeviceNode { vendor: Vendor::Amd, index: amd_index, major, minor });
            }
        }
        amd_index += 1;
    }
    nodes.sort_by_key(|n| (n.index, n.major, n.minor));
    let kfd = std::fs::read_to_string(sysfs_root.join("class/kfd/kfd/dev"))
        .ok()
        .and_then(|t| parse_dev(&t))
        .map(|(major, minor)| SharedDeviceNode { major, minor });
    (nodes, kfd)
}

pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_device_nodes_come_from_sysfs_in_card_order() {
        let root = tempfile::tempdir().expect("tempdir");
        let sys = root.path();
        for (card, vendor, render) in [(0, "0x1002", 128), (1, "0x10de", 129), (2, "0x1002", 130)] {
            let drm = sys.join(format!("class/drm/card{card}/device/drm"));
            std::fs::create_dir_all(drm.join(format!("card{card}"))).expect("mkdir");
            std::fs::create_dir_all(drm.join(format!("renderD{render}"))).expect("mkdir");
            std::fs::write(sys.join(format!("class/drm/card{card}/device/vendor")), vendor)
                .expect("vendor");
            std::fs::write(drm.join(format!("card{card}/dev")), format!("226:{card}\n"))
                .expect("dev");
            std::fs::write(drm.join(format!("renderD{render}/dev")), format!("226:{render}\n"))
                .expect("dev");
        }
        std::fs::create_dir_all(sys.join("class/kfd/kfd")).expect("mkdir");
        std::fs::write(sys.join("class/kfd/kfd/dev"), "235:0\n").expect("kfd");
        let (nodes, kfd) = gpu_device_nodes(sys, &sys.join("no-dev"));
        let seen: Vec<(u32, u32, u32)> =
            nodes.iter().map(|n| (n.index, n.major, n.minor)).collect();
        // The NVIDIA card (card1) is not an AMD GPU: AMD's second GPU is card2.
        assert_eq!(seen, [(0, 226, 0), (0, 226, 128), (1, 226, 2), (1, 226, 130)]);
        assert_eq!(kfd, Some(SharedDeviceNode { major: 235, minor: 0 }));
    }

    #[test]
    fn model_names() {
        for (name, model) in [
            ("NVIDIA H200", "h200"),
            ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
            ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
            ("NVIDIA H100 80GB HBM3", "h100-80gb"),
            ("NVIDIA H100 NVL", "h100-nvl"),
            ("NVIDIA H200 NVL", "h200-nvl"),
            ("Tesla V100-SXM2-16GB", "v100-16gb"),
            ("NVIDIA GeForce RTX 4090", "rtx-4090"),
            ("NVIDIA L40S", "l40s"),
            ("AMD Instinct MI300X", "mi300x"),
            ("  ", "gpu"),
        ] {
            assert_eq!(model_from_name(name), model, "{name}");
        }
        for mig in
            ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL"]
        {
            assert!(allot_core::MigGpu::from_model(&model_from_name(mig)).is_some(), "{mig}");
        }
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn amd_sysfs_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        // card1: AMD with product name and hive; card0: an Intel iGPU; card2: AMD, bare.
        write(r, "class/drm/card0/device/vendor", "0x8086\n");
        write(r, "class/drm/card1/device/vendor", "0x1002\n");
        write(r, "class/drm/card1/device/mem_info_vram_total", "206141652992\n");
        write(r, "class/drm/card1/device/product_name", "AMD Instinct MI300X\n");
        write(r, "class/drm/card1/device/xgmi_hive_info/xgmi_hive_id", "1234\n");
        write(r, "class/drm/card10/device/vendor", "0x1002\n");
        write(r, "class/drm/card10/device/device", "0x74a1\n");
        write(r, "class/drm/card10/device/xgmi_hive_info/xgmi_hive_id", "1234\n");
        write(r, "class/drm/card2/device/vendor", "0x1002\n");
        write(r, "class/drm/card2/device/device", "0x740f\n");
        write(r, "class/drm/card1-DP-1/device/vendor", "0x1002\n");
        let gpus = amd_gpus(r);
        let summary: Vec<(u32, &str, u64)> =
            gpus.iter().map(|g| (g.index, g.model.as_str(), g.memory_mib)).collect();
        assert_eq!(summary, vec![(0, "mi300x", 196592), (1, "amd-740f", 0), (2, "amd-74a1", 0)]);
        assert_eq!(islands(&gpus), vec![0, 1, 0]);
        assert!(amd_gpus(&r.join("missing")).is_empty());
    }

    #[test]
    fn islands_join_through_shared_keys() {
        let gpu = |keys: &[&str]| DiscoveredGpu {
            index: 0,
            vendor: Vendor::Nvidia,
            model: "h200".to_string(),
            memory_mib: 1,
            uuid: None,
            mig: false,
            fabric: keys.iter().map(|k| k.to_string()).collect(),
        };
        // 0–1 through a switch, 2 alone, 3–4 linked directly, 5 joins 0 through 1's own id.
        let gpus = [
            gpu(&["sw1"]),
            gpu(&["sw1", "pci:b"]),
            gpu(&[]),
            gpu(&["pci:d", "pci:e"]),
            gpu(&["pci:e"]),
            gpu(&["pci:b"]),
        ];
        assert_eq!(islands(&gpus), vec![0, 0, 1, 2, 2, 0]);
    }

    #[test]
    fn meminfo() {
        assert_eq!(mem_total_mib("MemTotal:       131072000 kB\nMemFree: 1 kB\n"), Some(128000));
        assert_eq!(mem_total_mib("nothing"), None);
    }
}
