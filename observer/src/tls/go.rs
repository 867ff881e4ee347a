//! Go executables: Go programs carry crypto/tls compiled in, so its
//! functions are probed in each executable itself, for all its processes
//! (a process started later gets them from its first instruction). The
//! struct offsets the probes read go into a kernel map under the
//! executable's index, which rides in each probe's cookie.
//!
//! Go files are never made per process: a busy Go process is turned off in
//! the kernel (its probes return after one lookup), the others keep theirs.

use std::path::Path;

use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    programs::uprobe::UProbeScope,
};
use observer_common::tls::{
    go::{GoOffsets, GO_OFFSETS_MAP, MAX_GO_BINARIES},
    library,
};
use serde::Serialize;

use super::report::TlsFileReport;
use crate::{
    ebpf::{chain, Probes},
    libraries::{
        golang::{self, GoImage, OffsetsSource, SymbolSource},
        procmaps::FileId,
    },
    programs::{self, Feature, Library, GO_RETURN},
};

/// A Go executable looked at: probed, or why not (for `doctor`).
#[derive(Clone, Debug, Serialize)]
pub struct GoExecutableReport {
    pub path: String,
    /// The Go version it was built with (null: not read).
    pub version: Option<String>,
    /// Uprobes placed (entries and returns).
    pub probes: usize,
    pub symbols_from: Option<SymbolSource>,
    pub offsets_from: Option<OffsetsSource>,
    /// Why it got no probes (no crypto/tls, stripped, unsupported version).
    pub not_probed: Option<String>,
}

/// Go executables listed in the report at most (the rest are counted).
const MAX_LISTED: usize = 64;

pub struct GoFiles {
    offsets: Option<BpfHashMap<MapData, u32, GoOffsets>>,
    next_index: u32,
}

/// Bits 8-15 of the cookie of a RET probe in a handshake function (see
/// observer-ebpf's go_tls).
const RET_OF_HANDSHAKE: u64 = 1 << 8;

impl GoFiles {
    pub fn new(probes: &mut Probes) -> Self {
        let offsets = probes
            .ebpf
            .take_map(GO_OFFSETS_MAP)
            .and_then(|m| BpfHashMap::try_from(m).ok());
        Self {
            offsets,
            next_index: 0,
        }
    }

    /// Probes `path` if it is a Go executable with crypto/tls. None: not a
    /// Go executable. `plaintext`: the read/write probes too.
    pub fn consider(
        &mut self,
        probes: &mut Probes,
        id: FileId,
        path: &Path,
        shown: &str,
        plaintext: bool,
    ) -> Option<(GoExecutableReport, Option<TlsFileReport>)> {
        let image = match golang::inspect(path) {
            Ok(None) => return None,
            Ok(Some(img)) => img,
            Err(e) => {
                tracing::debug!("Go executable {shown}: not probed: {e}");
                return Some((
                    GoExecutableReport {
                        path: shown.to_owned(),
                        version: e.version().map(str::to_owned),
                        probes: 0,
                        symbols_from: None,
                        offsets_from: None,
                        not_probed: Some(e.to_string()),
                    },
                    None,
                ));
            }
        };
        let mut file = TlsFileReport {
            path: shown.to_owned(),
            library: library::name(library::GO),
            dev: id.0,
            inode: id.1,
            probes: 0,
            per_process: false,
            errors: Vec::new(),
        };
        let mut report = GoExecutableReport {
            path: shown.to_owned(),
            version: Some(image.version.clone()),
            probes: 0,
            symbols_from: Some(image.symbols_from),
            offsets_from: Some(image.offsets_from),
            not_probed: None,
        };
        match self.register(&image) {
            Ok(index) => {
                report.probes =
                    attach_all(probes, &image, path, index, plaintext, &mut file.errors);
                file.probes = report.probes;
                tracing::info!(
                    "TLS: Go executable {shown} ({}, symbols from {:?}, offsets from {:?}) probed, {} probes",
                    image.version,
                    image.symbols_from,
                    image.offsets_from,
                    report.probes
                );
            }
            Err(why) => report.not_probed = Some(why),
        }
        Some((report, Some(file)))
    }

    /// Gives the executable an index and its offsets to the kernel.
    fn register(&mut self, image: &GoImage) -> Result<u32, String> {
        let map = self
            .offsets
            .as_mut()
            .ok_or("the Go offsets map is missing")?;
        if self.next_index >= MAX_GO_BINARIES {
            return Err(format!("more than {MAX_GO_BINARIES} Go executables"));
        }
        let index = self.next_index;
        map.insert(index, image.offsets, 0)
            .map_err(|e| e.to_string())?;
        self.next_index += 1;
        Ok(index)
    }
}

/// Entry probes on the functions found, and the return program on each of
/// their RETs; returns how many were placed.
fn attach_all(
    probes: &mut Probes,
    image: &GoImage,
    path: &Path,
    index: u32,
    plaintext: bool,
    errors: &mut Vec<String>,
) -> usize {
    let mut features = vec![Feature::TlsHandshakes];
    if plaintext {
        features.push(Feature::TlsPlaintext);
    }
    let entries: Vec<_> = features
        .iter()
        .flat_map(|&f| programs::uprobe_sites(f, Library::Go))
        .filter(|s| s.program != GO_RETURN)
        .collect();
    let base = u64::from(library::GO) | (u64::from(index) << 16);
    let mut placed = 0;
    for site in entries {
        let Some(func) = image.functions.iter().find(|f| f.name == site.symbol) else {
            continue;
        };
        let handshake = if site.program == "go_tls_handshake" {
            RET_OF_HANDSHAKE
        } else {
            0
        };
        let at = std::iter::once((site.program, func.entry, base)).chain(
            func.returns
                .iter()
                .map(|&r| (GO_RETURN, r, base | handshake)),
        );
        for (program, offset, cookie) in at {
            match probes.attach_uprobe(
                program,
                site.symbol,
                Some(offset),
                path,
                Some(cookie),
                UProbeScope::AllProcesses,
            ) {
                Ok(_) => placed += 1,
                Err(e) => {
                    if errors.len() < 8 {
                        errors.push(chain(&e));
                    }
                }
            }
        }
    }
    placed
}

/// Keeps the report's list bounded.
pub fn listed(list: &mut Vec<GoExecutableReport>, r: GoExecutableReport) -> bool {
    if list.len() >= MAX_LISTED {
        return false;
    }
    list.push(r);
    true
}
