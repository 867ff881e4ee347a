//! Loading the eBPF object and attaching its programs.

mod loader;
mod probes;
pub mod prog_stats;

pub use loader::{
    attach, attach_spec, detach_all, load, KernelConnMap, KernelCounters, LoadError, LoadOptions,
    Loaded,
};
pub use probes::{Hook, ProbeReport, ProbeSpec, ProbeStatus, PROBES};
