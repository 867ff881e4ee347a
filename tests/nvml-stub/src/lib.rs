//! A test build of NVML (`libnvidia-ml.so.1`'s C API, the functions observer
//! calls), so the GPU code runs through the same FFI path (nvml-wrapper
//! loading a shared library) on a machine without a GPU.
//!
//! Values come from the JSON file named by `NVML_STUB_CONFIG`, re-read when
//! it changes, so a test can change a device's utilization during a request:
//! `{"devices": [{"uuid", "name", "util_gpu", "util_mem", "mem_used",
//! "mem_total", "temp", "power_mw", "sm_clock", "error": null | "gpu_lost",
//! "processes": [{"pid", "used_memory", "sm_util"}]}]}`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::{
    ffi::c_char,
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t,
    nvmlUtilization_t,
};
use serde::Deserialize;

const SUCCESS: u32 = 0;
const ERROR_INVALID_ARGUMENT: u32 = 2;
const ERROR_NOT_FOUND: u32 = 6;
const ERROR_INSUFFICIENT_SIZE: u32 = 7;
const ERROR_GPU_IS_LOST: u32 = 15;

#[derive(Deserialize, Default, Clone)]
struct Config {
    devices: Vec<Device>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Device {
    uuid: String,
    name: String,
    util_gpu: u32,
    util_mem: u32,
    mem_used: u64,
    mem_total: u64,
    temp: u32,
    power_mw: u32,
    sm_clock: u32,
    error: Option<String>,
    processes: Vec<Process>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Process {
    pid: u32,
    used_memory: u64,
    sm_util: u32,
}

static CACHE: Mutex<Option<(SystemTime, Config)>> = Mutex::new(None);

fn config() -> Config {
    let Ok(path) = std::env::var("NVML_STUB_CONFIG") else {
        return Config::default();
    };
    let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let (Some(m), Some((at, cfg))) = (mtime, cache.as_ref()) {
        if *at == m {
            return cfg.clone();
        }
    }
    let cfg: Config = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    if let Some(m) = mtime {
        *cache = Some((m, cfg.clone()));
    }
    cfg
}

/// Handles are 1-based indexes.
fn device(d: nvmlDevice_t) -> Result<Device, u32> {
    let i = (d as usize).checked_sub(1).ok_or(ERROR_INVALID_ARGUMENT)?;
    let dev = config()
        .devices
        .get(i)
        .cloned()
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    match dev.error.as_deref() {
        Some(_) => Err(ERROR_GPU_IS_LOST),
        None => Ok(dev),
    }
}

unsafe fn write_str(s: &str, buf: *mut c_char, len: u32) -> u32 {
    if buf.is_null() || s.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
    *buf.add(s.len()) = 0;
    SUCCESS
}

macro_rules! with_device {
    ($d:expr, |$dev:ident| $body:block) => {
        match device($d) {
            Ok($dev) => $body,
            Err(e) => e,
        }
    };
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> u32 {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: u32) -> u32 {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> u32 {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: u32) -> u32 {
    write_str("550.00-stub", buf, len)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut u32) -> u32 {
    *count = config().devices.len() as u32;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: u32, out: *mut nvmlDevice_t) -> u32 {
    let handle = (index as usize + 1) as nvmlDevice_t;
    match device(handle) {
        Ok(_) => {
            *out = handle;
            SUCCESS
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(d: nvmlDevice_t, buf: *mut c_char, len: u32) -> u32 {
    with_device!(d, |dev| { write_str(&dev.uuid, buf, len) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(d: nvmlDevice_t, buf: *mut c_char, len: u32) -> u32 {
    with_device!(d, |dev| { write_str(&dev.name, buf, len) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    d: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> u32 {
    with_device!(d, |dev| {
        (*u).gpu = dev.util_gpu;
        (*u).memory = dev.util_mem;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    d: nvmlDevice_t,
    m: *mut nvmlMemory_v2_t,
) -> u32 {
    with_device!(d, |dev| {
        (*m).total = dev.mem_total;
        (*m).used = dev.mem_used;
        (*m).free = dev.mem_total.saturating_sub(dev.mem_used);
        (*m).reserved = 0;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    d: nvmlDevice_t,
    _sensor: u32,
    t: *mut u32,
) -> u32 {
    with_device!(d, |dev| {
        *t = dev.temp;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(d: nvmlDevice_t, p: *mut u32) -> u32 {
    with_device!(d, |dev| {
        *p = dev.power_mw;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(d: nvmlDevice_t, _kind: u32, c: *mut u32) -> u32 {
    with_device!(d, |dev| {
        *c = dev.sm_clock;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    d: nvmlDevice_t,
    r: *mut u64,
) -> u32 {
    with_device!(d, |_dev| {
        *r = 0;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    d: nvmlDevice_t,
    count: *mut u32,
    infos: *mut nvmlProcessInfo_t,
) -> u32 {
    with_device!(d, |dev| {
        let n = dev.processes.len() as u32;
        if infos.is_null() || *count < n {
            *count = n;
            return if n == 0 {
                SUCCESS
            } else {
                ERROR_INSUFFICIENT_SIZE
            };
        }
        for (i, p) in dev.processes.iter().enumerate() {
            let slot = &mut *infos.add(i);
            slot.pid = p.pid;
            slot.usedGpuMemory = p.used_memory;
            slot.gpuInstanceId = u32::MAX;
            slot.computeInstanceId = u32::MAX;
        }
        *count = n;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    d: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut u32,
    last_seen: u64,
) -> u32 {
    with_device!(d, |dev| {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_micros() as u64);
        if dev.processes.is_empty() || now_us <= last_seen {
            return ERROR_NOT_FOUND;
        }
        let n = dev.processes.len() as u32;
        if samples.is_null() || *count < n {
            *count = n;
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (i, p) in dev.processes.iter().enumerate() {
            let s = &mut *samples.add(i);
            s.pid = p.pid;
            s.timeStamp = now_us;
            s.smUtil = p.sm_util;
            s.memUtil = 0;
            s.encUtil = 0;
            s.decUtil = 0;
        }
        *count = n;
        SUCCESS
    })
}
