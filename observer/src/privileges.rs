//! Do we have what loading eBPF needs?

/// Capability numbers (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The message users see when privileges are missing.
pub const NEEDS: &str = "needs root, or CAP_BPF and CAP_PERFMON";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privileges {
    pub euid: u32,
    pub cap_bpf: bool,
    pub cap_perfmon: bool,
    pub cap_sys_admin: bool,
}

impl Privileges {
    pub fn current() -> Self {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let caps = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| parse_cap_eff(&s))
            .unwrap_or(0);
        let has = |n: u32| caps & (1u64 << n) != 0;
        Self {
            euid,
            cap_bpf: has(CAP_BPF),
            cap_perfmon: has(CAP_PERFMON),
            cap_sys_admin: has(CAP_SYS_ADMIN),
        }
    }

    /// Enough to load and attach tracepoint programs and read ring buffers.
    pub fn sufficient(&self) -> bool {
        self.cap_sys_admin || (self.cap_bpf && self.cap_perfmon)
    }
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
        assert_ne!(caps & (1 << CAP_BPF), 0);
        assert_ne!(caps & (1 << CAP_PERFMON), 0);
        assert_eq!(caps & (1 << CAP_SYS_ADMIN), 0);
        assert_eq!(parse_cap_eff("nothing"), None);
    }
}
