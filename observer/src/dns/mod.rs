//! Name lookups: through the C library (getaddrinfo uprobes) and on the
//! wire (port-53 messages, cgroup_skb); their own records (`"kind": "dns"`)
//! and the join to the connection that follows.

pub mod message;
pub mod record;
pub mod wire;

use std::path::{Path, PathBuf};

use aya::{
    programs::{
        uprobe::UProbeScope, CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSock, UProbe,
    },
    Ebpf,
};

pub use record::{DnsJoin, DnsRecord, Lookups};
pub use wire::WireLookups;

/// The C library this observer itself maps (the system's), where the probes go.
pub fn system_libc() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or("");
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .map(PathBuf::from)
}

/// What the DNS probes sit on, or why they are missing.
#[derive(Debug, Clone)]
pub struct Attached {
    /// Library lookups: e.g. "getaddrinfo in /usr/lib/x86_64-linux-gnu/libc.so.6".
    pub libc: Result<String, String>,
    /// Wire lookups: e.g. "port 53 on cgroup /sys/fs/cgroup".
    pub wire: Result<String, String>,
}

impl Attached {
    /// For the `ready` line.
    pub fn summary(&self) -> String {
        let part = |r: &Result<String, String>| match r {
            Ok(what) => what.clone(),
            Err(e) => format!("off ({e})"),
        };
        format!("DNS: {}; wire: {}", part(&self.libc), part(&self.wire))
    }
}

/// Attaches the library and (with `wire`) the wire probes, each on its own.
pub fn attach(ebpf: &mut Ebpf, wire: bool) -> Attached {
    let a = Attached {
        libc: attach_libc(ebpf),
        wire: if wire {
            attach_wire(ebpf)
        } else {
            Err("--dns-wire off".into())
        },
    };
    if let Err(e) = &a.libc {
        tracing::warn!("library lookups not seen: {e}");
    }
    match &a.wire {
        Err(e) if wire => tracing::warn!("wire lookups not seen: {e}"),
        _ => {}
    }
    a
}

/// The cgroup v2 hierarchy's root as this process sees it mounted.
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        // "... root mountpoint opts ... - fstype source superopts"
        let (left, right) = l.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let mountpoint = f.next()?;
        (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(mountpoint))
    })
}

/// cgroup_skb programs (both ways) and the socket-release program on the
/// root cgroup: they see every socket of the host's processes. aya attaches
/// them as bpf links (kernel 5.7+), which always run beside other programs on
/// the cgroup and refuse the ALLOW_MULTI flag: hence `Single`.
fn attach_wire(ebpf: &mut Ebpf) -> Result<String, String> {
    let root = cgroup2_root().ok_or("no cgroup v2 hierarchy mounted at its root")?;
    let dir = std::fs::File::open(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    for (program, way) in [
        ("dns_egress", CgroupSkbAttachType::Egress),
        ("dns_ingress", CgroupSkbAttachType::Ingress),
    ] {
        let p: &mut CgroupSkb = ebpf
            .program_mut(program)
            .ok_or_else(|| format!("program {program} missing"))?
            .try_into()
            .map_err(|e| format!("{program}: {e}"))?;
        p.load().map_err(|e| format!("loading {program}: {e:#}"))?;
        p.attach(&dir, way, CgroupAttachMode::Single)
            .map_err(|e| format!("attaching {program}: {e:#}"))?;
    }
    let p: &mut CgroupSock = ebpf
        .program_mut("dns_sock_release")
        .ok_or("program dns_sock_release missing")?
        .try_into()
        .map_err(|e| format!("dns_sock_release: {e}"))?;
    p.load()
        .map_err(|e| format!("loading dns_sock_release: {e:#}"))?;
    p.attach(&dir, CgroupAttachMode::Single)
        .map_err(|e| format!("attaching dns_sock_release: {e:#}"))?;
    Ok(format!("port 53 on cgroup {}", root.display()))
}

/// Resolver entry points: (symbol, entry program, return program).
const RESOLVER: &[(&str, &str, &str)] = &[
    ("getaddrinfo", "getaddrinfo", "getaddrinfo_ret"),
    ("gethostbyname_r", "gethostbyname_r", "gethostbyname_r_ret"),
    (
        "gethostbyname2_r",
        "gethostbyname2_r",
        "gethostbyname2_r_ret",
    ),
];

fn resolver_program<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut UProbe, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("program {program} missing"))?
        .try_into()
        .map_err(|e| format!("{program}: {e}"))
}

/// Puts the resolver probes on the C library at `path` for every process
/// that maps it; Ok: the functions probed (getaddrinfo at least).
pub fn attach_resolver(ebpf: &mut Ebpf, path: &Path) -> Result<Vec<&'static str>, String> {
    let mut probed = Vec::new();
    for &(symbol, entry, ret) in RESOLVER {
        let mut attach = |program: &str| {
            resolver_program(ebpf, program)?
                .attach(symbol, path, UProbeScope::AllProcesses)
                .map(|_| ())
                .map_err(|e| format!("attaching {program} to {}: {e}", path.display()))
        };
        match attach(entry).and_then(|()| attach(ret)) {
            Ok(()) => probed.push(symbol),
            // getaddrinfo is what every resolver has; the others are extras.
            Err(e) if symbol == "getaddrinfo" => return Err(e),
            Err(e) => tracing::debug!("{e}"),
        }
    }
    Ok(probed)
}

/// Loads the resolver programs and probes the system's C library.
fn attach_libc(ebpf: &mut Ebpf) -> Result<String, String> {
    for &(_, entry, ret) in RESOLVER {
        for program in [entry, ret] {
            resolver_program(ebpf, program)?
                .load()
                .map_err(|e| format!("loading {program}: {e}"))?;
        }
    }
    let path = system_libc().ok_or("no C library mapped by the observer")?;
    let probed = attach_resolver(ebpf, &path)?;
    Ok(format!("{} in {}", probed.join(", "), path.display()))
}
