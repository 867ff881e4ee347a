//! Name lookups through the C library (getaddrinfo uprobes): their own
//! records (`"kind": "dns"`) and the join to the connection that follows.

pub mod record;

use std::path::PathBuf;

use aya::{
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf,
};

pub use record::{DnsJoin, DnsRecord, Lookups};

/// The C library this observer itself maps (the system's), where the probes go.
fn libc_path() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or("");
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .map(PathBuf::from)
}

/// Attaches the getaddrinfo probes for every process; Ok: what was probed.
pub fn attach(ebpf: &mut Ebpf) -> Result<String, String> {
    let path = libc_path().ok_or("no C library mapped by the observer")?;
    for program in ["getaddrinfo", "getaddrinfo_ret"] {
        let p: &mut UProbe = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("program {program} missing"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        p.load().map_err(|e| format!("loading {program}: {e}"))?;
        p.attach("getaddrinfo", &path, UProbeScope::AllProcesses)
            .map_err(|e| format!("attaching {program} to {}: {e}", path.display()))?;
    }
    Ok(format!("getaddrinfo in {}", path.display()))
}
