//! Do we have what loading eBPF needs, and what does each feature need?
//!
//! [`FEATURE_NEEDS`] is the one table of the capabilities each feature needs on this
//! kernel and why; `doctor` names, per feature, the ones this process lacks,
//! and [`DEPLOY`] (the smallest set for every feature, as uid 0) is what
//! deploy/capabilities.txt, the DaemonSet and the host service ask for.

use serde::Serialize;

use crate::programs::Feature;

/// A capability the observer's features need (linux/capability.h numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cap {
    DacOverride = 1,
    DacReadSearch = 2,
    NetAdmin = 12,
    SysPtrace = 19,
    SysAdmin = 21,
    Perfmon = 38,
    Bpf = 39,
}

impl Cap {
    pub const ALL: [Cap; 7] = [
        Cap::DacOverride,
        Cap::DacReadSearch,
        Cap::NetAdmin,
        Cap::SysPtrace,
        Cap::SysAdmin,
        Cap::Perfmon,
        Cap::Bpf,
    ];

    /// As capabilities(7), podman and Kubernetes spell it (with `CAP_`).
    pub const fn name(self) -> &'static str {
        match self {
            Cap::DacOverride => "CAP_DAC_OVERRIDE",
            Cap::DacReadSearch => "CAP_DAC_READ_SEARCH",
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::SysPtrace => "CAP_SYS_PTRACE",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }

    /// By name, with or without `CAP_`, any case.
    pub fn from_name(s: &str) -> Option<Cap> {
        let s = s.trim().to_ascii_uppercase();
        let s = s.strip_prefix("CAP_").unwrap_or(&s);
        Cap::ALL.into_iter().find(|c| &c.name()[4..] == s)
    }

    const fn bit(self) -> u64 {
        1 << (self as u32)
    }
}

impl Serialize for Cap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// One capability some features need on this kernel.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Need {
    pub capability: Cap,
    /// Capabilities the kernel's check accepts as well (CAP_SYS_ADMIN passes
    /// every check of CAP_BPF, CAP_PERFMON and, for eBPF, CAP_NET_ADMIN).
    pub or: &'static [Cap],
    /// Needed only by a user other than root (root owns what it opens).
    pub non_root_only: bool,
    /// Needed only where uprobes are perf events: kernels before 6.6, which
    /// make no uprobe-multi links (`ebpf::uprobe_multi`).
    pub perf_uprobes_only: bool,
    pub features: &'static [Feature],
    /// What the kernel checks it for.
    pub why: &'static str,
}

use Feature::{Connections, DnsLibrary, DnsWire, HttpPlain, TlsHandshakes, TlsPlaintext};

/// Every feature that loads eBPF programs.
const EBPF: &[Feature] = &[
    Connections,
    TlsHandshakes,
    TlsPlaintext,
    DnsLibrary,
    DnsWire,
    HttpPlain,
];
/// The features whose programs are uprobes.
const UPROBES: &[Feature] = &[TlsHandshakes, TlsPlaintext, DnsLibrary];

/// What each feature needs on this kernel (6.18; checked by
/// tests/tests/privileges.rs). GPU needs none: NVML opens /dev/nvidia*.
pub const FEATURE_NEEDS: &[Need] = &[
    Need {
        capability: Cap::Bpf,
        or: &[Cap::SysAdmin],
        non_root_only: false,
        perf_uprobes_only: false,
        features: EBPF,
        why: "bpf(2) creates maps and loads programs only for CAP_BPF \
              (kernel.unprivileged_bpf_disabled)",
    },
    Need {
        capability: Cap::Perfmon,
        or: &[Cap::SysAdmin],
        non_root_only: false,
        perf_uprobes_only: false,
        features: EBPF,
        why: "tracing programs, reading kernel memory and socket pointers in \
              programs (the verifier's pointer-leak rule), and system-wide perf \
              events (kernel.perf_event_paranoid) need CAP_PERFMON",
    },
    Need {
        capability: Cap::NetAdmin,
        or: &[Cap::SysAdmin],
        non_root_only: false,
        perf_uprobes_only: false,
        features: &[DnsWire, HttpPlain],
        why: "loading cgroup/sock programs and attaching cgroup_skb programs to \
              the root cgroup need CAP_NET_ADMIN (bpf(2) answers EPERM)",
    },
    Need {
        capability: Cap::SysAdmin,
        or: &[],
        non_root_only: false,
        perf_uprobes_only: true,
        features: UPROBES,
        why: "perf_event_open of a uprobe needs CAP_SYS_ADMIN: CAP_PERFMON no \
              longer does since CVE-2025-38466's fix (commit ba677dbe77af, Linux \
              6.16 and the stable kernels of July 2025); from Linux 6.6 the \
              uprobes are uprobe-multi links, which CAP_BPF and CAP_PERFMON make",
    },
    Need {
        capability: Cap::SysPtrace,
        or: &[],
        non_root_only: false,
        perf_uprobes_only: false,
        features: UPROBES,
        why: "libraries are reached through /proc/PID/root (or \
              /proc/PID/map_files) of the processes that map them, which needs \
              ptrace read access to processes with other credentials or more \
              capabilities: containers' libraries, and every host library when \
              the observer runs in a container",
    },
    Need {
        capability: Cap::SysPtrace,
        or: &[],
        non_root_only: false,
        perf_uprobes_only: false,
        features: &[Connections],
        why: "/proc/PID/exe of processes with other credentials or more \
              capabilities needs ptrace read access: records of processes \
              started before the observer lack `exe`",
    },
    Need {
        capability: Cap::DacReadSearch,
        or: &[Cap::DacOverride],
        non_root_only: true,
        perf_uprobes_only: false,
        features: EBPF,
        why: "tracefs is root's (mode 0700): tracepoint formats and ids are read \
              there",
    },
    Need {
        capability: Cap::DacOverride,
        or: &[],
        non_root_only: true,
        perf_uprobes_only: true,
        features: &[TlsPlaintext],
        why: "the per-process TLS probes (on a file a busy process maps) are \
              defined in tracefs's uprobe_events, root's and writable by root only",
    },
];

/// The smallest set that gives every feature, as uid 0: what
/// deploy/capabilities.txt lists (a unit test holds them equal).
pub const DEPLOY: &[Cap] = &[Cap::SysAdmin, Cap::SysPtrace];

/// The message users see when privileges are missing.
pub const NEEDS: &str = "needs root, or CAP_BPF and CAP_PERFMON";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privileges {
    pub euid: u32,
    pub cap_bpf: bool,
    pub cap_perfmon: bool,
    pub cap_sys_admin: bool,
    /// The effective set (`CapEff` of /proc/self/status).
    pub effective: u64,
    /// The kernel makes uprobe-multi links: uprobes are no perf events.
    pub uprobe_multi: bool,
}

impl Privileges {
    pub fn current() -> Self {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let caps = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| parse_cap_eff(&s))
            .unwrap_or(0);
        Self::of(euid, caps)
    }

    pub fn of(euid: u32, effective: u64) -> Self {
        let has = |c: Cap| effective & c.bit() != 0;
        Self {
            euid,
            cap_bpf: has(Cap::Bpf),
            cap_perfmon: has(Cap::Perfmon),
            cap_sys_admin: has(Cap::SysAdmin),
            effective,
            uprobe_multi: makes_uprobe_multi_links(),
        }
    }

    /// Enough to load and attach tracepoint programs and read ring buffers.
    pub fn sufficient(&self) -> bool {
        self.cap_sys_admin || (self.cap_bpf && self.cap_perfmon)
    }

    pub fn has(&self, c: Cap) -> bool {
        self.effective & c.bit() != 0
    }

    /// Whether `need` is met (by its capability or one that does as well).
    pub fn meets(&self, need: &Need) -> bool {
        (need.non_root_only && self.euid == 0)
            || (need.perf_uprobes_only && self.uprobe_multi)
            || self.has(need.capability)
            || need.or.iter().any(|&c| self.has(c))
    }

    /// The needs of `feature` this process does not meet.
    pub fn missing(&self, feature: Feature) -> Vec<&'static Need> {
        needs_of(feature).filter(|n| !self.meets(n)).collect()
    }

    /// The capabilities of [`Cap`] held, by name.
    pub fn held(&self) -> Vec<Cap> {
        Cap::ALL.into_iter().filter(|&c| self.has(c)).collect()
    }
}

/// Whether this kernel makes uprobe-multi links (Linux 6.6+), so that the
/// observer's uprobes are no perf events (read from the release, which
/// needs no privilege; the loader checks the kernel itself).
pub fn makes_uprobe_multi_links() -> bool {
    static KNOWN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KNOWN.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| release_at_least(&r, (6, 6)))
            .unwrap_or(false)
    })
}

/// "6.18.44-fc" is at least (6, 6); None: not a release we can read.
fn release_at_least(release: &str, (major, minor): (u32, u32)) -> Option<bool> {
    let mut parts = release.trim().split(['.', '-']);
    let a: u32 = parts.next()?.parse().ok()?;
    let b: u32 = parts.next()?.parse().ok()?;
    Some((a, b) >= (major, minor))
}

/// The table's rows for `feature`.
pub fn needs_of(feature: Feature) -> impl Iterator<Item = &'static Need> {
    FEATURE_NEEDS
        .iter()
        .filter(move |n| n.features.contains(&feature))
}

/// A capability a feature lacks, for `doctor`.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    pub capability: Cap,
    /// Would do as well.
    pub or: &'static [Cap],
    pub why: &'static str,
}

impl Missing {
    /// "CAP_BPF (or CAP_SYS_ADMIN)"
    pub fn names(&self) -> String {
        let mut s = self.capability.name().to_owned();
        if !self.or.is_empty() {
            let or: Vec<&str> = self.or.iter().map(|c| c.name()).collect();
            s.push_str(&format!(" (or {})", or.join(", ")));
        }
        s
    }
}

/// One feature's needs and what of them is missing.
#[derive(Debug, Clone, Serialize)]
pub struct FeatureCaps {
    pub feature: Feature,
    /// Every capability it needs for this user ("CAP_X" or "CAP_X|CAP_Y").
    pub needs: Vec<String>,
    pub missing: Vec<Missing>,
}

/// `doctor`'s capability section.
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityReport {
    /// The effective set (hex, as /proc/PID/status's CapEff).
    pub effective_hex: String,
    /// The capabilities of the table this process holds.
    pub held: Vec<Cap>,
    /// What deploy/capabilities.txt asks for (uid 0).
    pub deploy: &'static [Cap],
    pub features: Vec<FeatureCaps>,
}

impl CapabilityReport {
    pub fn of(p: &Privileges) -> Self {
        let features = Feature::ALL
            .iter()
            .map(|&f| FeatureCaps {
                feature: f,
                needs: needs_of(f)
                    .filter(|n| !(n.non_root_only && p.euid == 0))
                    .map(|n| {
                        std::iter::once(n.capability)
                            .chain(n.or.iter().copied())
                            .map(Cap::name)
                            .collect::<Vec<_>>()
                            .join("|")
                    })
                    .collect(),
                missing: p
                    .missing(f)
                    .into_iter()
                    .map(|n| Missing {
                        capability: n.capability,
                        or: n.or,
                        why: n.why,
                    })
                    .collect(),
            })
            .collect();
        Self {
            effective_hex: format!("{:016x}", p.effective),
            held: p.held(),
            deploy: DEPLOY,
            features,
        }
    }

    pub fn missing(&self, f: Feature) -> &[Missing] {
        self.features
            .iter()
            .find(|x| x.feature == f)
            .map_or(&[], |x| &x.missing)
    }
}

/// A name in a capabilities.txt that is not a capability this observer
/// knows (the name as written).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown capability {0:?}")]
pub struct UnknownCapability(pub String);

/// The capability names of a capabilities.txt (one a line, `#` comments).
pub fn parse_list(text: &str) -> Result<Vec<Cap>, UnknownCapability> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| Cap::from_name(l).ok_or_else(|| UnknownCapability(l.to_owned())))
        .collect()
}

/// The effective capability set from /proc/self/status (`CapEff:` in hex).
fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_capabilities() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000000000\n";
        let caps = parse_cap_eff(s).expect("parses");
        let p = Privileges::of(1, caps);
        assert!(p.cap_bpf && p.cap_perfmon && !p.cap_sys_admin);
        assert!(p.sufficient());
        assert_eq!(parse_cap_eff("nothing"), None);
        assert_eq!(Cap::from_name("sys_admin"), Some(Cap::SysAdmin));
        assert_eq!(Cap::from_name("CAP_BPF"), Some(Cap::Bpf));
        assert_eq!(Cap::from_name("CAP_CHOWN"), None);
        for c in Cap::ALL {
            assert_eq!(Cap::from_name(c.name()), Some(c));
        }
    }

    /// On a kernel without uprobe-multi links (uprobes are perf events),
    /// where the deploy set is smallest.
    fn with(caps: &[Cap], euid: u32) -> Privileges {
        Privileges {
            uprobe_multi: false,
            ..Privileges::of(euid, caps.iter().fold(0, |a, c| a | c.bit()))
        }
    }

    /// The deploy set gives every feature as root, and each of its
    /// capabilities is needed: without it some feature lacks one.
    #[test]
    fn the_deploy_set_is_sufficient_and_minimal() {
        let all = with(DEPLOY, 0);
        for f in Feature::ALL {
            assert!(all.missing(f).is_empty(), "{f:?}: {:?}", all.missing(f));
        }
        for drop in DEPLOY {
            let fewer: Vec<Cap> = DEPLOY.iter().copied().filter(|c| c != drop).collect();
            let p = with(&fewer, 0);
            assert!(
                Feature::ALL.iter().any(|&f| p
                    .missing(f)
                    .iter()
                    .any(|n| n.capability == *drop || n.or.contains(drop))),
                "{drop:?} is not needed"
            );
        }
        assert!(with(&[], 0).missing(Feature::Gpu).is_empty());
    }

    #[test]
    fn names_the_missing_capability_per_feature() {
        let p = with(&[Cap::Bpf, Cap::Perfmon, Cap::NetAdmin, Cap::SysPtrace], 0);
        assert!(p.missing(Feature::Connections).is_empty());
        assert!(p.missing(Feature::DnsWire).is_empty());
        let tls: Vec<Cap> = p
            .missing(Feature::TlsHandshakes)
            .iter()
            .map(|n| n.capability)
            .collect();
        assert_eq!(tls, [Cap::SysAdmin]);
        // Where uprobes are uprobe-multi links, CAP_BPF and CAP_PERFMON make
        // them: every feature works without CAP_SYS_ADMIN.
        let multi = Privileges {
            uprobe_multi: true,
            ..p
        };
        for f in Feature::ALL {
            assert!(multi.missing(f).is_empty(), "{f:?}: {:?}", multi.missing(f));
        }
        // A user other than root needs tracefs too.
        let nobody = with(&[Cap::Bpf, Cap::Perfmon, Cap::SysPtrace], 65534);
        let conn: Vec<Cap> = nobody
            .missing(Feature::Connections)
            .iter()
            .map(|n| n.capability)
            .collect();
        assert_eq!(conn, [Cap::DacReadSearch]);
        let r = CapabilityReport::of(&nobody);
        assert_eq!(
            r.missing(Feature::Connections)[0].names(),
            "CAP_DAC_READ_SEARCH (or CAP_DAC_OVERRIDE)"
        );
    }

    #[test]
    fn kernel_releases_compared() {
        assert_eq!(release_at_least("6.18.44-fc-v1252\n", (6, 6)), Some(true));
        assert_eq!(release_at_least("6.6.0", (6, 6)), Some(true));
        assert_eq!(release_at_least("6.1.0-28-amd64", (6, 6)), Some(false));
        assert_eq!(release_at_least("5.15.0", (6, 6)), Some(false));
        assert_eq!(release_at_least("garbage", (6, 6)), None);
    }

    #[test]
    fn deploy_capabilities_txt_is_the_deploy_set() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/capabilities.txt");
        let text = std::fs::read_to_string(path).expect("deploy/capabilities.txt");
        assert_eq!(parse_list(&text).expect("parses"), DEPLOY);
        let e = parse_list("CAP_BPF\n# c\n\nCAP_NOPE\n").expect_err("CAP_NOPE is unknown");
        assert_eq!(e, UnknownCapability("CAP_NOPE".into()));
        assert_eq!(e.to_string(), "unknown capability \"CAP_NOPE\"");
    }
}
