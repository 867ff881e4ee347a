//! One uprobe of a TLS file (a library's or a Go executable's): where it
//! goes and the cookie it carries.

use std::path::Path;

use aya::programs::uprobe::UProbeScope;

use crate::ebpf::{ProbeError, Probes, UprobeAt, UprobeLink};

/// One uprobe of a TLS file: where it goes and the cookie it carries (for a
/// library, its kind; for Go, also the executable's index and the RET
/// flags).
#[derive(Clone, Copy, Debug)]
pub struct ProbeSite {
    pub program: &'static str,
    pub symbol: &'static str,
    pub offset: u64,
    pub cookie: u64,
    /// A return probe (libraries only; Go's RETs are entry probes).
    pub ret: bool,
}

impl ProbeSite {
    /// The probe for every process that maps `path`, now or later. The
    /// error is the probe's own; reports keep it as one line ([`crate::ebpf::chain`]).
    pub fn attach_all(&self, probes: &mut Probes, path: &Path) -> Result<UprobeLink, ProbeError> {
        let at = UprobeAt {
            symbol: self.symbol,
            offset: Some(self.offset),
            path,
            cookie: Some(self.cookie),
            scope: UProbeScope::AllProcesses,
        };
        probes.attach_uprobe(self.program, &at)
    }
}
