//! Loading the eBPF object and attaching its programs.

pub mod kernel_probe;
mod loader;
mod probes;
pub mod prog_stats;
pub mod uprobe_multi;

pub use loader::{
    detach_all, load, KernelConnMap, KernelConns, KernelCounters, LoadError, LoadOptions, Loaded,
    OBJECT,
};
pub use probes::{chain, ProbeError, Probes, ProgramState, UprobeAt, UprobeLink, NO_COOKIE_ENV};
