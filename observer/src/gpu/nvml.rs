//! Reading the GPUs through NVML (nvml-wrapper, the library loaded at run
//! time). Every field is read on its own: a field a device does not support,
//! or a device that errors, costs only that field or that device.

use std::ffi::OsStr;

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor},
    enums::device::UsedGpuMemory,
    Device, Nvml,
};
use serde::Serialize;

/// Where NVML is by default (the driver's library).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

#[derive(Debug, thiserror::Error)]
#[error("NVML could not be loaded from {lib}: {err}")]
pub struct NvmlUnavailable {
    pub lib: String,
    pub err: String,
}

/// One process holding a context on a device.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
    /// SM utilization from NVML's process samples (null: no new sample).
    pub sm_util_pct: Option<u32>,
    /// Memory controller utilization from the same samples.
    pub mem_util_pct: Option<u32>,
}

/// One device at one instant.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DeviceSample {
    pub index: u32,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub utilization_gpu_pct: Option<u32>,
    pub utilization_memory_pct: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    /// NVML's throttle reason bits (0: none).
    pub throttle_reasons: Option<u64>,
    /// ECC errors since the driver loaded (null: ECC off or not supported).
    pub ecc_errors_corrected: Option<u64>,
    pub ecc_errors_uncorrected: Option<u64>,
    /// PCIe throughput, KiB/s (null where not supported).
    pub pcie_tx_kib_s: Option<u32>,
    pub pcie_rx_kib_s: Option<u32>,
    pub processes: Vec<GpuProcess>,
    /// Why the device could not be read at all.
    pub error: Option<String>,
    /// Unix time of the sample.
    #[serde(skip)]
    pub unix_ns: u64,
}

pub struct Gpus {
    nvml: Nvml,
    /// Per device: the last process-sample timestamp seen (NVML returns only
    /// newer samples).
    last_seen: Vec<u64>,
}

impl Gpus {
    pub fn open(lib: Option<&str>) -> Result<Self, NvmlUnavailable> {
        let path = lib.unwrap_or(DEFAULT_LIB);
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(path))
            .init()
            .map_err(|e| NvmlUnavailable {
                lib: path.to_owned(),
                err: e.to_string(),
            })?;
        Ok(Self {
            nvml,
            last_seen: Vec::new(),
        })
    }

    pub fn device_count(&self) -> u32 {
        self.nvml.device_count().unwrap_or(0)
    }

    /// Every device, now.
    pub fn sample(&mut self) -> Vec<DeviceSample> {
        let n = self.device_count();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        self.last_seen.resize(n as usize, 0);
        (0..n).map(|i| self.device(i, unix_ns)).collect()
    }

    fn device(&mut self, index: u32, unix_ns: u64) -> DeviceSample {
        let mut s = blank_sample(index, unix_ns);
        let d = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                s.error = Some(e.to_string());
                return s;
            }
        };
        read_fields(&mut s, &d);
        s.processes = processes(&d, &mut self.last_seen, index);
        s
    }
}

/// A sample of `index` with every field still unread (null).
fn blank_sample(index: u32, unix_ns: u64) -> DeviceSample {
    DeviceSample {
        index,
        uuid: None,
        name: None,
        utilization_gpu_pct: None,
        utilization_memory_pct: None,
        memory_used_bytes: None,
        memory_total_bytes: None,
        temperature_c: None,
        power_w: None,
        sm_clock_mhz: None,
        throttle_reasons: None,
        ecc_errors_corrected: None,
        ecc_errors_uncorrected: None,
        pcie_tx_kib_s: None,
        pcie_rx_kib_s: None,
        processes: Vec::new(),
        error: None,
        unix_ns,
    }
}

/// The device's own fields, each on its own: one that errors stays null.
fn read_fields(s: &mut DeviceSample, d: &Device) {
    s.uuid = d.uuid().ok();
    s.name = d.name().ok();
    if let Ok(u) = d.utilization_rates() {
        s.utilization_gpu_pct = Some(u.gpu);
        s.utilization_memory_pct = Some(u.memory);
    }
    if let Ok(m) = d.memory_info() {
        s.memory_used_bytes = Some(m.used);
        s.memory_total_bytes = Some(m.total);
    }
    s.temperature_c = d.temperature(TemperatureSensor::Gpu).ok();
    s.power_w = d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0);
    s.sm_clock_mhz = d.clock_info(Clock::SM).ok();
    s.throttle_reasons = d.current_throttle_reasons().ok().map(|r| r.bits());
    s.ecc_errors_corrected = d
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        .ok();
    s.ecc_errors_uncorrected = d
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .ok();
    s.pcie_tx_kib_s = d.pcie_throughput(PcieUtilCounter::Send).ok();
    s.pcie_rx_kib_s = d.pcie_throughput(PcieUtilCounter::Receive).ok();
}

/// The processes on the device, by pid, with their utilization from the
/// samples newer than `last_seen[index]` (which moves on to the newest).
fn processes(d: &Device, last_seen: &mut [u64], index: u32) -> Vec<GpuProcess> {
    let mut procs: Vec<GpuProcess> = d
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            used_memory_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            },
            sm_util_pct: None,
            mem_util_pct: None,
        })
        .collect();
    // "No new samples" is not an error: the processes keep a null.
    let last = last_seen.get(index as usize).copied().unwrap_or(0);
    if let Ok(samples) = d.process_utilization_stats(last) {
        let mut newest = last;
        for u in samples {
            newest = newest.max(u.timestamp);
            if let Some(p) = procs.iter_mut().find(|p| p.pid == u.pid) {
                p.sm_util_pct = Some(u.sm_util);
                p.mem_util_pct = Some(u.mem_util);
            }
        }
        if let Some(slot) = last_seen.get_mut(index as usize) {
            *slot = newest;
        }
    }
    procs.sort_by_key(|p| p.pid);
    procs
}

/// `observer gpu` for people.
pub fn text(devices: &[DeviceSample]) -> String {
    use std::fmt::Write;
    let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let mut out = String::new();
    for d in devices {
        let _ = match &d.error {
            Some(e) => writeln!(out, "GPU {}: error: {e}", d.index),
            None => writeln!(
                out,
                "GPU {} {} {}: util {}% mem-util {}% memory {}/{} MiB, {} C, {} W, {} processes",
                d.index,
                d.name.as_deref().unwrap_or("?"),
                d.uuid.as_deref().unwrap_or("?"),
                opt(d.utilization_gpu_pct.map(u64::from)),
                opt(d.utilization_memory_pct.map(u64::from)),
                opt(d.memory_used_bytes.map(|v| v >> 20)),
                opt(d.memory_total_bytes.map(|v| v >> 20)),
                opt(d.temperature_c.map(u64::from)),
                d.power_w.map_or("-".into(), |v| format!("{v:.0}")),
                d.processes.len()
            ),
        };
        for p in &d.processes {
            let _ = writeln!(
                out,
                "  pid {} memory {} MiB sm {}%",
                p.pid,
                opt(p.used_memory_bytes.map(|v| v >> 20)),
                opt(p.sm_util_pct.map(u64::from))
            );
        }
    }
    if devices.is_empty() {
        out.push_str("NVML loaded; no GPU\n");
    }
    out
}
