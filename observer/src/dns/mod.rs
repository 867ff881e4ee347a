//! Name lookups: through the C library (getaddrinfo uprobes) and on the
//! wire (port-53 messages, cgroup_skb); their own records (`"kind": "dns"`)
//! and the join to the connection that follows.

pub mod message;
pub mod record;
pub mod wire;

use std::path::Path;

use aya::programs::uprobe::UProbeScope;

use serde::Serialize;

pub use record::{DnsJoin, DnsRecord, Lookups};
pub use wire::WireLookups;

use crate::{
    ebpf::{chain, Probes, UprobeAt},
    programs::{self, Feature, Library},
};

/// What the DNS probes sit on, or why they are missing (`ready`, `doctor`,
/// the summary).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DnsReport {
    /// Library lookups: e.g. "getaddrinfo, ... in /usr/lib/x86_64-linux-gnu/libc.so.6".
    pub probed: Option<String>,
    pub error: Option<String>,
    /// Wire lookups: e.g. "port 53 on cgroup /sys/fs/cgroup".
    pub wire_probed: Option<String>,
    pub wire_error: Option<String>,
    /// C libraries besides the system's (musl, a container's own glibc),
    /// found at start or in processes' maps, and their resolver probes.
    pub resolver_files: Vec<ResolverFileReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ResolverFileReport {
    pub path: String,
    /// The resolver functions probed for all processes.
    pub probed: Vec<&'static str>,
    pub error: Option<String>,
}

/// Attaches the library and (with `wire`) the wire probes, each on its own;
/// the wire ones on `cgroup_root` when given.
pub fn attach(probes: &mut Probes, wire: bool, cgroup_root: Option<&Path>) -> DnsReport {
    let (probed, error) = split(attach_libc(probes));
    let (wire_probed, wire_error) = split(if wire {
        attach_wire(probes, cgroup_root)
    } else {
        Err("--dns-wire off".into())
    });
    if let Some(e) = &error {
        tracing::warn!("library lookups not seen: {e}");
    }
    if let (true, Some(e)) = (wire, &wire_error) {
        tracing::warn!("wire lookups not seen: {e}");
    }
    DnsReport {
        probed,
        error,
        wire_probed,
        wire_error,
        resolver_files: Vec::new(),
    }
}

fn split(r: Result<String, String>) -> (Option<String>, Option<String>) {
    match r {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e)),
    }
}

/// The wire programs of the table on the root cgroup: they see every socket
/// of the host's processes.
fn attach_wire(probes: &mut Probes, cgroup_root: Option<&Path>) -> Result<String, String> {
    let root = crate::cgroup::attach_on_root(probes, Feature::DnsWire, cgroup_root)?;
    Ok(format!("port 53 on cgroup {}", root.display()))
}

/// Puts the resolver probes on the C library at `path` for every process
/// that maps it; Ok: the functions probed (getaddrinfo at least).
pub fn attach_resolver(probes: &mut Probes, path: &Path) -> Result<Vec<&'static str>, String> {
    let mut probed: Vec<&'static str> = Vec::new();
    let mut failed: Vec<&'static str> = Vec::new();
    for site in programs::uprobe_sites(Feature::DnsLibrary, Library::Libc) {
        if failed.contains(&site.symbol) {
            continue;
        }
        let at = UprobeAt {
            symbol: site.symbol,
            offset: None,
            path,
            cookie: None,
            scope: UProbeScope::AllProcesses,
        };
        match probes.attach_uprobe(site.program, &at) {
            Ok(_) => {
                if !probed.contains(&site.symbol) {
                    probed.push(site.symbol);
                }
            }
            // getaddrinfo is what every resolver has; the others are extras.
            Err(e) if site.symbol == "getaddrinfo" => return Err(chain(&e)),
            Err(e) => {
                failed.push(site.symbol);
                tracing::debug!("{}", chain(&e));
            }
        }
    }
    // A function counts once both its entry and its return are on.
    probed.retain(|f| !failed.contains(f));
    Ok(probed)
}

/// Loads the resolver programs and probes the system's C library.
fn attach_libc(probes: &mut Probes) -> Result<String, String> {
    probes
        .load_feature(Feature::DnsLibrary)
        .map_err(|e| chain(&e))?;
    let path = crate::libraries::system_libc().ok_or("no C library mapped by the observer")?;
    let probed = attach_resolver(probes, &path)?;
    Ok(format!("{} in {}", probed.join(", "), path.display()))
}

/// A C library besides the system's (musl, a container's glibc): its
/// resolver gets the probes, for all processes.
pub fn attach_resolver_file(probes: &mut Probes, path: &Path, shown: &str) -> ResolverFileReport {
    let (probed, error) = match attach_resolver(probes, path) {
        Ok(fns) => (fns, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    tracing::info!("DNS: {shown} probed ({probed:?}, {error:?})");
    ResolverFileReport {
        path: shown.to_owned(),
        probed,
        error,
    }
}
