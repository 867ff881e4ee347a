//! Go executables: Go programs carry crypto/tls compiled in, so its
//! functions are probed in each executable itself, for all its processes
//! (a process started later gets them from its first instruction). The
//! struct offsets the probes read go into a kernel map under the
//! executable's index, which rides in each probe's cookie (where the kernel
//! gives uprobes no cookie, a second map gives the index by the file as the
//! kernel names it, and the programs look up the task's executable).
//!
//! The handshake probes are placed here; the read/write ones are handed to
//! the manager as plaintext sites (entry and RET offsets, with their
//! cookies), which it places for all processes and, while a busy Go
//! process runs the file, per process like a library's (`tls::manager`).

use std::path::Path;

use std::collections::HashMap;

use aya::maps::{HashMap as BpfHashMap, MapData};
use observer_common::tls::{
    go::{GoOffsets, GO_EXES_MAP, GO_OFFSETS_MAP, MAX_GO_BINARIES},
    library,
};

use super::{
    report::{GoExecutableReport, TlsFileReport},
    site::{CompiledIn, ProbeSite},
};
use crate::{
    ebpf::{chain, Probes},
    libraries::{
        golang::{self, GoImage},
        procmaps::FileId,
    },
    programs::{self, Feature, Library, GO_RETURN},
};

/// What looking at a Go executable gave: its report, its file's (when it
/// links crypto/tls) and the plaintext probes for the caller to place.
pub struct GoConsidered {
    pub report: GoExecutableReport,
    /// Its index is given back by [`GoFiles::release`].
    pub compiled: CompiledIn,
}

/// Executables (Go, rustls) listed in the report at most (the rest are counted).
const MAX_LISTED: usize = 64;

pub struct GoFiles {
    offsets: Option<BpfHashMap<MapData, u32, GoOffsets>>,
    /// Where uprobes carry no cookie: each executable's index by its inode
    /// number (None where they do), and the inode number of each index.
    exes: Option<BpfHashMap<MapData, u64, u32>>,
    inodes: HashMap<u32, u64>,
    next_index: u32,
    /// Indices of executables let go, given again first.
    free: Vec<u32>,
}

/// Why a Go executable got no index (its report's `not_probed` says so).
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    /// The object has no offsets map (a build mismatch), or it was taken.
    #[error("the Go offsets map is missing")]
    NoMap,
    /// Every index is given (the map is sized for MAX_GO_BINARIES).
    #[error("more than {MAX_GO_BINARIES} Go executables")]
    Full,
    /// Without attach cookies the programs tell executables by inode
    /// number, and one probed already has this one's.
    #[error(
        "another Go executable probed has inode number {0} (on another filesystem): this \
         kernel's uprobes carry no attach cookie (Linux 5.15+), so its programs tell \
         executables by inode number"
    )]
    SameInode(u64),
    /// The kernel refused the map entry.
    #[error(transparent)]
    Insert(aya::maps::MapError),
}

impl GoFiles {
    pub fn new(probes: &mut Probes) -> Self {
        let offsets = probes
            .ebpf
            .take_map(GO_OFFSETS_MAP)
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let exes = (!probes.attach_cookies())
            .then(|| probes.ebpf.take_map(GO_EXES_MAP))
            .flatten()
            .and_then(|m| BpfHashMap::try_from(m).ok());
        Self {
            offsets,
            exes,
            inodes: HashMap::new(),
            next_index: 0,
            free: Vec::new(),
        }
    }

    /// Puts the handshake probes on `path` if it is a Go executable with
    /// crypto/tls, and gives its plaintext sites for the caller to place.
    /// None: not a Go executable.
    pub fn consider(
        &mut self,
        probes: &mut Probes,
        id: FileId,
        path: &Path,
        shown: &str,
    ) -> Option<GoConsidered> {
        let image = match golang::inspect(path) {
            Ok(None) => return None,
            Ok(Some(img)) => img,
            Err(e) => {
                tracing::debug!("Go executable {shown}: not probed: {e}");
                return Some(GoConsidered {
                    report: GoExecutableReport {
                        path: shown.to_owned(),
                        version: e.version().map(str::to_owned),
                        probes: 0,
                        symbols_from: None,
                        offsets_from: None,
                        not_probed: Some(e.to_string()),
                    },
                    compiled: CompiledIn::default(),
                });
            }
        };
        let mut file = TlsFileReport::new(shown, library::GO, id);
        let mut report = GoExecutableReport {
            path: shown.to_owned(),
            version: Some(image.version.clone()),
            probes: 0,
            symbols_from: Some(image.symbols_from),
            offsets_from: Some(image.offsets_from),
            not_probed: None,
        };
        if let Some(why) = probes.refusal(Feature::TlsHandshakes, Library::Go) {
            let why = format!("the kernel refused its programs: {why}");
            return Some(not_probed(report, file, why));
        }
        let index = match self.register(&image, id) {
            Ok(index) => index,
            Err(why) => return Some(not_probed(report, file, why.to_string())),
        };
        let base = u64::from(library::GO) | (u64::from(index) << 16);
        let mut handshake = Vec::new();
        for site in sites(&image, Feature::TlsHandshakes, base) {
            match site.attach_all(probes, path) {
                Ok(link) => {
                    report.probes += 1;
                    handshake.push((site.program, link));
                }
                Err(e) => {
                    if file.errors.len() < 8 {
                        file.errors.push(chain(&e));
                    }
                }
            }
        }
        file.probes = report.probes;
        tracing::info!(
            "TLS: Go executable {shown} ({}, symbols from {:?}, offsets from {:?}) probed, {} handshake probes",
            image.version,
            image.symbols_from,
            image.offsets_from,
            report.probes
        );
        Some(GoConsidered {
            report,
            compiled: CompiledIn {
                file: Some(file),
                plaintext: match probes.refusal(Feature::TlsPlaintext, Library::Go) {
                    None => sites(&image, Feature::TlsPlaintext, base),
                    Some(_) => Vec::new(),
                },
                handshake,
                go_index: Some(index),
            },
        })
    }

    /// Gives the executable an index and its offsets to the kernel (and,
    /// without cookies, the index under the inode number of its file `id`).
    fn register(&mut self, image: &GoImage, id: FileId) -> Result<u32, RegisterError> {
        let ino = id.1;
        if self.exes.is_some() && self.inodes.values().any(|&i| i == ino) {
            return Err(RegisterError::SameInode(ino));
        }
        let map = self.offsets.as_mut().ok_or(RegisterError::NoMap)?;
        let index = match self.free.last() {
            Some(&i) => i,
            None if self.next_index < MAX_GO_BINARIES => self.next_index,
            None => return Err(RegisterError::Full),
        };
        map.insert(index, image.offsets, 0)
            .map_err(RegisterError::Insert)?;
        if let Some(exes) = &mut self.exes {
            if let Err(e) = exes.insert(ino, index, 0) {
                let _ = map.remove(&index);
                return Err(RegisterError::Insert(e));
            }
            self.inodes.insert(index, ino);
        }
        if self.free.pop().is_none() {
            self.next_index += 1;
        }
        Ok(index)
    }

    /// An executable let go (its probes are off): its index is free again.
    pub fn release(&mut self, index: u32) {
        if let Some(map) = &mut self.offsets {
            let _ = map.remove(&index);
        }
        if let (Some(exes), Some(ino)) = (&mut self.exes, self.inodes.remove(&index)) {
            let _ = exes.remove(&ino);
        }
        self.free.push(index);
    }

    /// Executables holding an index now.
    pub fn registered(&self) -> usize {
        self.next_index as usize - self.free.len()
    }
}

/// The entry probe of each of `feature`'s functions found in the image, and
/// the return program on each of their RETs (Go's moving stacks rule out
/// return probes).
fn sites(image: &GoImage, feature: Feature, base: u64) -> Vec<ProbeSite> {
    let mut out = Vec::new();
    for site in programs::uprobe_sites(feature, Library::Go) {
        if site.program == GO_RETURN {
            continue;
        }
        let Some(func) = image.functions.iter().find(|f| f.name == site.symbol) else {
            continue;
        };
        let handshake = if site.program == "go_tls_handshake" {
            programs::GO_RET_OF_HANDSHAKE
        } else {
            0
        };
        out.push(ProbeSite {
            program: site.program,
            symbol: site.symbol,
            offset: func.entry,
            cookie: base,
            ret: false,
        });
        out.extend(func.returns.iter().map(|&r| ProbeSite {
            program: GO_RETURN,
            symbol: site.symbol,
            offset: r,
            cookie: base | handshake,
            ret: false,
        }));
    }
    out
}

/// Keeps the report's list bounded.
pub fn listed<T>(list: &mut Vec<T>, r: T) -> bool {
    if list.len() >= MAX_LISTED {
        return false;
    }
    list.push(r);
    true
}

/// A Go executable found but not probed, and why.
fn not_probed(mut report: GoExecutableReport, file: TlsFileReport, why: String) -> GoConsidered {
    report.not_probed = Some(why);
    GoConsidered {
        report,
        compiled: CompiledIn {
            file: Some(file),
            ..CompiledIn::default()
        },
    }
}
