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
    ebpf::{chain, ProbeError, Probes, UprobeAt},
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

/// Places the resolver probes on the system's C library, once the DNS
/// library programs are loaded (`library`: the program table's outcome),
/// and reports both ways of seeing lookups; `wire`: the root cgroup the wire
/// programs went on, or why not; None: `--dns-wire` is off. (Why the wire
/// programs are off is the caller's to say: often the root cgroup's reason,
/// said once for all the packet programs.)
pub fn report(
    probes: &mut Probes,
    library: Result<(), &str>,
    wire: Option<Result<&Path, &str>>,
) -> DnsReport {
    let library = match library {
        Ok(()) => probe_system_libc(probes),
        Err(e) => Err(LibraryError::Programs(e.to_owned())),
    };
    let (probed, error) = split(library);
    let wire = wire.unwrap_or(Err(WIRE_OFF));
    let (wire_probed, wire_error) =
        split(wire.map(|root| format!("port 53 on cgroup {}", root.display())));
    if let Some(e) = &error {
        tracing::warn!("library lookups not seen: {e}");
    }
    DnsReport {
        probed,
        error,
        wire_probed,
        wire_error,
        resolver_files: Vec::new(),
    }
}

/// The wire lookups' reason when `--dns-wire` is off.
pub const WIRE_OFF: &str = "--dns-wire off";

fn split<E: std::fmt::Display>(r: Result<String, E>) -> (Option<String>, Option<String>) {
    match r {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e.to_string())),
    }
}

/// Why the system's C library has no resolver probes.
#[derive(Debug, thiserror::Error)]
enum LibraryError {
    /// The resolver programs did not load (the program table's reason).
    #[error("{0}")]
    Programs(String),
    #[error("no C library mapped by the observer")]
    NoLibc,
    #[error("{}", chain(.0))]
    Probe(#[source] ProbeError),
}

/// Puts the resolver probes on the C library at `path` for every process
/// that maps it; Ok: the functions probed (getaddrinfo at least).
pub fn attach_resolver(probes: &mut Probes, path: &Path) -> Result<Vec<&'static str>, ProbeError> {
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
            Err(e) if site.symbol == "getaddrinfo" => return Err(e),
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

/// The resolver probes on the system's C library: e.g. "getaddrinfo, ...
/// in /usr/lib/x86_64-linux-gnu/libc.so.6".
fn probe_system_libc(probes: &mut Probes) -> Result<String, LibraryError> {
    let path = crate::libraries::system_libc().ok_or(LibraryError::NoLibc)?;
    let probed = attach_resolver(probes, &path).map_err(LibraryError::Probe)?;
    Ok(format!("{} in {}", probed.join(", "), path.display()))
}

/// A C library besides the system's (musl, a container's glibc): its
/// resolver gets the probes, for all processes.
pub fn attach_resolver_file(probes: &mut Probes, path: &Path, shown: &str) -> ResolverFileReport {
    let (probed, error) = match attach_resolver(probes, path) {
        Ok(fns) => (fns, None),
        Err(e) => (Vec::new(), Some(chain(&e))),
    };
    tracing::info!("DNS: {shown} probed ({probed:?}, {error:?})");
    ResolverFileReport {
        path: shown.to_owned(),
        probed,
        error,
    }
}
