//! One uprobe of a TLS file (a library's or a Go executable's): where it
//! goes and the cookie it carries.

use std::path::Path;

use aya::programs::uprobe::UProbeScope;

use super::report::TlsFileReport;
use crate::ebpf::{ProbeError, Probes, UprobeAt, UprobeLink};

/// What looking at an executable with TLS compiled in (Go, rustls) gave,
/// for the manager to keep with its file.
#[derive(Default)]
pub struct CompiledIn {
    /// Its file report; None: no TLS in it that can be probed.
    pub file: Option<TlsFileReport>,
    /// Its plaintext probes, for the manager to place.
    pub plaintext: Vec<ProbeSite>,
    /// Its handshake (rustls: tying) probes, placed: taken off when the
    /// file is let go.
    pub handshake: Vec<(&'static str, UprobeLink)>,
    /// A Go executable's index in the offsets map, given back then.
    pub go_index: Option<u32>,
}

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
