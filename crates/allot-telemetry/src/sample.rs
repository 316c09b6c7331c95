//! The normalised sample: one device, MIG instance or AMD partition at one time.

use allot_core::idle::DeviceReading;
use allot_core::idle::Signal;

/// GPU vendor of a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }
}

/// Which device (or slice of one) a sample describes. Every part a source may lack is optional.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceIdentity {
    pub vendor: Vendor,
    pub hostname: Option<String>,
    /// NVML / CUDA index (dcgm-exporter `gpu`), AMD `gpu_id` or `cardN`.
    pub gpu_index: Option<u32>,
    /// NVIDIA `GPU-…`, AMD `gpu_uuid`.
    pub uuid: Option<String>,
    /// MIG GPU instance id (dcgm-exporter `GPU_I_ID`).
    pub mig_instance: Option<u32>,
    /// MIG profile (dcgm-exporter `GPU_I_PROFILE`, e.g. `1g.10gb`).
    pub mig_profile: Option<String>,
    /// AMD compute partition id (`gpu_partition_id`); `None` when not partitioned (`NA`).
    pub amd_partition: Option<u32>,
    pub model: Option<String>,
}

impl DeviceIdentity {
    pub fn new(vendor: Vendor) -> DeviceIdentity {
        DeviceIdentity {
            vendor,
            hostname: None,
            gpu_index: None,
            uuid: None,
            mig_instance: None,
            mig_profile: None,
            amd_partition: None,
            model: None,
        }
    }
}

/// A Kubernetes owner of the device, as the exporter labels it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodLabels {
    pub namespace: Option<String>,
    pub pod: String,
    pub container: Option<String>,
}

/// Who the exporter says uses the device: pods and HPC (Slurm) job ids, sorted, no duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobLabels {
    pub pods: Vec<PodLabels>,
    pub hpc_jobs: Vec<String>,
}

/// One process on the device (NVML running compute processes and process utilisation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    pub pid: u32,
    pub memory_used_mib: Option<u64>,
    /// SM utilisation of this process over the last sample period, permille. NVML lists only
    /// processes with some activity, so `None` means "no sample", which for a process that holds
    /// memory is the idle-with-memory case.
    pub sm_util_permille: Option<u16>,
    /// NVML's timestamp (µs) of the newest utilisation sample of this process.
    pub last_seen_us: Option<u64>,
}

/// How far the activity signal of a sample can be trusted for idleness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Confidence {
    /// No usable activity signal: never treat as idle.
    Unknown,
    /// Time-based utilisation only ("a kernel ran"): overstates activity.
    Low,
    /// Engine-active: the compute engine was busy, without SM coverage.
    Medium,
    /// SM-active (profiling / GPM): the fraction of SMs with work.
    High,
}

impl Confidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Unknown => "unknown",
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// The name allot uses for a core [`Signal`] in output.
pub fn signal_name(signal: Signal) -> &'static str {
    match signal {
        Signal::SmActive => "sm_active",
        Signal::EngineActive => "engine_active",
        Signal::Utilisation => "utilisation",
    }
}

/// What a sample says about idleness, for people and the GPU check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Activity {
    Active,
    /// Below the threshold but memory is held: reserved, not used.
    IdleWithMemory,
    Idle,
    Unknown,
}

impl Activity {
    pub fn as_str(self) -> &'static str {
        match self {
            Activity::Active => "active",
            Activity::IdleWithMemory => "idle-with-memory",
            Activity::Idle => "idle",
            Activity::Unknown => "unknown",
        }
    }
}

/// One device, MIG instance or AMD partition at one time. Every metric is optional and in
/// permille (activities) or MiB (memory): absent is not 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub identity: DeviceIdentity,
    /// Milliseconds since the epoch, when the source says (exposition or query timestamp, the
    /// collector's clock); `None` for a scrape without timestamps.
    pub at_ms: Option<u64>,
    /// Time-based utilisation (NVML `gpu`, `DCGM_FI_DEV_GPU_UTIL`, amdgpu `gpu_busy_percent`).
    pub utilisation: Option<u16>,
    pub sm_active: Option<u16>,
    /// Graphics/compute engine active (`PROF_GR_ENGINE_ACTIVE`, AMD gfx activity).
    pub engine_active: Option<u16>,
    pub tensor_active: Option<u16>,
    /// Memory interface active (`PROF_DRAM_ACTIVE`, AMD UMC activity).
    pub dram_active: Option<u16>,
    pub memory_used_mib: Option<u64>,
    pub memory_total_mib: Option<u64>,
    pub processes: Vec<ProcessUsage>,
    /// The source lists the device's processes (NVML): memory then counts as held only when a
    /// process holds it (NVML's device "used" includes the driver's own reservation).
    pub processes_listed: bool,
    pub jobs: JobLabels,
    /// The signal idleness is judged on; `None` when nothing usable is present.
    pub signal: Option<Signal>,
    pub confidence: Confidence,
    /// Why this signal and confidence, in words (the pitfall that applied, if any).
    pub reason: String,
}

impl Sample {
    /// An empty sample for `identity`: no metrics yet, confidence Unknown.
    pub fn new(identity: DeviceIdentity) -> Sample {
        Sample {
            identity,
            at_ms: None,
            utilisation: None,
            sm_active: None,
            engine_active: None,
            tensor_active: None,
            dram_active: None,
            memory_used_mib: None,
            memory_total_mib: None,
            processes: Vec::new(),
            processes_listed: false,
            jobs: JobLabels::default(),
            signal: None,
            confidence: Confidence::Unknown,
            reason: String::new(),
        }
    }

    /// Chooses the signal and confidence from the metrics present (rules in the crate docs).
    /// Parsers and collectors call it once the metrics are filled in.
    pub fn classify(&mut self) {
        let mig = self.identity.mig_instance.is_some();
        if mig && self.utilisation.is_some() {
            // DCGM/NVML report GPU_UTIL as 0 on MIG instances whatever runs there
            // (NVIDIA/dcgm-exporter#50, #216): a 0 there is not evidence of idleness.
            self.utilisation = None;
        }
        let (signal, confidence, reason) = if self.sm_active.is_some() {
            (Some(Signal::SmActive), Confidence::High, "SM-active: the fraction of SMs with work")
        } else if self.engine_active.is_some() {
            let reason = if mig {
                "engine-active (no SM-active); on MIG it is relative to the instance's engines"
            } else {
                "engine-active: the compute engine was busy (no SM-active reported)"
            };
            (Some(Signal::EngineActive), Confidence::Medium, reason)
        } else if self.utilisation.is_some() {
            (
                Some(Signal::Utilisation),
                Confidence::Low,
                "utilisation only: time with any kernel running, overstates activity",
            )
        } else if mig {
            (
                None,
                Confidence::Unknown,
                "MIG instance without profiling fields: utilisation is not reported per instance",
            )
        } else if self.identity.amd_partition.is_some_and(|p| p > 0) {
            (
                None,
                Confidence::Unknown,
                "AMD partition other than 0: the exporter reports activity for partition 0 only",
            )
        } else {
            (None, Confidence::Unknown, "no activity metric reported")
        };
        self.signal = signal;
        self.confidence = confidence;
        self.reason = reason.to_string();
    }

    /// The value of the chosen signal, permille of the device (or instance/partition).
    pub fn signal_value(&self) -> Option<u16> {
        match self.signal? {
            Signal::SmActive => self.sm_active,
            Signal::EngineActive => self.engine_active,
            Signal::Utilisation => self.utilisation,
        }
    }

    /// Active at or above `threshold_permille`; below it idle, with or without memory held;
    /// unknown without a usable signal.
    pub fn activity(&self, threshold_permille: u16) -> Activity {
        match self.signal_value() {
            None => Activity::Unknown,
            Some(v) if v >= threshold_permille => Activity::Active,
            Some(_) if self.holds_memory() => Activity::IdleWithMemory,
            Some(_) => Activity::Idle,
        }
    }

    /// Memory held by processes (or, when the source lists no processes, by anyone).
    pub fn holds_memory(&self) -> bool {
        if self.processes.iter().any(|p| p.memory_used_mib.is_some_and(|m| m > 0)) {
            return true;
        }
        !self.processes_listed && self.memory_used_mib.is_some_and(|m| m > 0)
    }

    /// The reading the idle tracker takes. `member` and `shares` come from the allocation.
    /// Utilisation on a MIG instance stays absent (see [`Sample::classify`]).
    pub fn device_reading(&self, member: u32, shares: u32) -> DeviceReading {
        DeviceReading {
            member,
            shares,
            sm_active: self.sm_active,
            engine_active: self.engine_active,
            utilisation: if self.identity.mig_instance.is_some() { None } else { self.utilisation },
        }
    }
}

/// A process's own activity from NVML: active with a utilisation sample at or above the
/// threshold, idle-with-memory when it only holds memory.
pub fn process_activity(process: &ProcessUsage, threshold_permille: u16) -> Activity {
    let busy = process.sm_util_permille.is_some_and(|v| v > 0 && v >= threshold_permille);
    if busy {
        Activity::Active
    } else if process.memory_used_mib.is_some_and(|m| m > 0) {
        Activity::IdleWithMemory
    } else {
        Activity::Idle
    }
}

/// Percent (0..=100) to permille, clamped; `None` for NaN or negative.
pub(crate) fn percent_to_permille(value: f64) -> Option<u16> {
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value * 10.0).round().min(1000.0) as u16)
}

/// Ratio (0..=1) to permille, clamped: SM-active can exceed 1 on MIG (NVIDIA/DCGM#152).
pub(crate) fn ratio_to_permille(value: f64) -> Option<u16> {
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value * 1000.0).round().min(1000.0) as u16)
}

/// A non-negative finite amount (MiB) as an integer.
pub(crate) fn amount(value: f64) -> Option<u64> {
    if !value.is_finite() || value < 0.0 || value > u64::MAX as f64 {
        return None;
    }
    Some(value.round() as u64)
}
