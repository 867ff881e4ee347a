//! GPUs: NVML device and per-process state (`observer gpu`), sampled on a
//! thread of its own and joined to the connection records of the processes
//! that hold a GPU context.

pub mod history;
pub mod nvml;

pub use history::{GpuRecord, History};
pub use nvml::{DeviceSample, Gpus, NvmlUnavailable};
