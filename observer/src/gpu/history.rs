//! A short ring of samples per device, filled by the poller thread, and the
//! join of a connection's time span to the devices its process uses.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Serialize;

use super::nvml::{DeviceSample, Gpus};

/// Samples kept per device (5 minutes at the default 500 ms).
pub const KEEP: usize = 600;

#[derive(Default)]
pub struct History {
    devices: BTreeMap<u32, VecDeque<DeviceSample>>,
}

/// The `gpu` object of a record: the devices the process held a context on
/// during the connection.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GpuRecord {
    pub devices: Vec<GpuUse>,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GpuUse {
    pub uuid: Option<String>,
    pub utilization_gpu_pct_max: Option<u32>,
    pub utilization_gpu_pct_avg: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub process_used_memory_bytes: Option<u64>,
    pub process_sm_util_pct: Option<u32>,
    /// Throttle reason bits seen in the window (0: none).
    #[serde(skip)]
    pub throttle_reasons: u64,
}

impl History {
    pub fn push(&mut self, samples: Vec<DeviceSample>) {
        for s in samples {
            let ring = self.devices.entry(s.index).or_default();
            if ring.len() >= KEEP {
                ring.pop_front();
            }
            ring.push_back(s);
        }
    }

    /// The devices `pid` used between `from` and `to` (Unix ns): the samples
    /// inside the span plus the nearest one before it.
    pub fn join(&self, pid: u32, from: u64, to: u64) -> Option<GpuRecord> {
        let mut devices = Vec::new();
        for ring in self.devices.values() {
            let before = ring.iter().rposition(|s| s.unix_ns <= from);
            let first = before.unwrap_or(0);
            let window: Vec<&DeviceSample> = ring
                .iter()
                .skip(first)
                .take_while(|s| s.unix_ns <= to)
                .filter(|s| s.error.is_none())
                .collect();
            let mine: Vec<(&DeviceSample, &super::nvml::GpuProcess)> = window
                .iter()
                .filter_map(|s| s.processes.iter().find(|p| p.pid == pid).map(|p| (*s, p)))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let utils: Vec<u32> = window
                .iter()
                .filter_map(|s| s.utilization_gpu_pct)
                .collect();
            let last = window.last().copied();
            devices.push(GpuUse {
                uuid: last.and_then(|s| s.uuid.clone()),
                utilization_gpu_pct_max: utils.iter().copied().max(),
                utilization_gpu_pct_avg: (!utils.is_empty())
                    .then(|| f64::from(utils.iter().sum::<u32>()) / utils.len() as f64),
                memory_used_bytes: last.and_then(|s| s.memory_used_bytes),
                memory_total_bytes: last.and_then(|s| s.memory_total_bytes),
                process_used_memory_bytes: mine
                    .iter()
                    .filter_map(|(_, p)| p.used_memory_bytes)
                    .max(),
                process_sm_util_pct: mine.iter().filter_map(|(_, p)| p.sm_util_pct).max(),
                throttle_reasons: window
                    .iter()
                    .filter_map(|s| s.throttle_reasons)
                    .fold(0, |a, b| a | b),
            });
        }
        (!devices.is_empty()).then_some(GpuRecord { devices })
    }

    /// The latest sample of each device.
    pub fn latest(&self) -> Vec<DeviceSample> {
        self.devices
            .values()
            .filter_map(|r| r.back().cloned())
            .collect()
    }
}

/// Polls on its own thread (NVML calls block) until `stop` is dropped.
pub fn spawn_poller(
    mut gpus: Gpus,
    every: Duration,
    history: Arc<Mutex<History>>,
    stop: std::sync::mpsc::Receiver<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("gpu-poller".into())
        .spawn(move || loop {
            let samples = gpus.sample();
            if let Ok(mut h) = history.lock() {
                h.push(samples);
            }
            match stop.recv_timeout(every) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::{super::nvml::GpuProcess, *};

    fn sample(index: u32, t: u64, util: u32, pids: &[u32]) -> DeviceSample {
        DeviceSample {
            index,
            uuid: Some(format!("GPU-{index}")),
            name: None,
            utilization_gpu_pct: Some(util),
            utilization_memory_pct: None,
            memory_used_bytes: Some(100),
            memory_total_bytes: Some(1000),
            temperature_c: None,
            power_w: None,
            sm_clock_mhz: None,
            throttle_reasons: Some(0),
            ecc_errors_corrected: None,
            ecc_errors_uncorrected: None,
            pcie_tx_kib_s: None,
            pcie_rx_kib_s: None,
            processes: pids
                .iter()
                .map(|&pid| GpuProcess {
                    pid,
                    used_memory_bytes: Some(50),
                    sm_util_pct: Some(util),
                    mem_util_pct: None,
                })
                .collect(),
            error: None,
            unix_ns: t,
        }
    }

    #[test]
    fn a_request_sees_the_samples_inside_it_and_the_one_before() {
        let mut h = History::default();
        for (t, u) in [(0, 5), (10, 10), (20, 90), (30, 30), (40, 99)] {
            h.push(vec![sample(0, t, u, &[7]), sample(1, t, 1, &[])]);
        }
        let r = h.join(7, 15, 30).expect("pid 7 uses device 0");
        assert_eq!(r.devices.len(), 1, "device 1 has no context of pid 7");
        let d = &r.devices[0];
        assert_eq!(d.uuid.as_deref(), Some("GPU-0"));
        // Samples at 10 (nearest before 15), 20, 30.
        assert_eq!(d.utilization_gpu_pct_max, Some(90));
        assert_eq!(d.utilization_gpu_pct_avg, Some(130.0 / 3.0));
        assert_eq!(h.join(8, 0, 40), None, "another process: null");
    }
}
