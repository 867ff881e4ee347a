//! Rust executables that carry rustls: its functions are probed in each
//! executable itself, for all its processes (a process started later gets
//! them from its first instruction). The probes that tie a connection to
//! its socket are placed here; the plaintext ones are handed to the manager
//! as plaintext sites, placed for all processes or, while a busy process
//! runs the file, per process (`tls::manager`).

use std::path::Path;

use observer_common::tls::library;

use super::{
    report::{RustlsExecutableReport, TlsFileReport},
    site::{CompiledIn, ProbeSite},
};
use crate::{
    ebpf::{chain, Probes},
    libraries::{procmaps::FileId, rustls as rl},
    programs::{self, Feature, Library},
};

/// What looking at an executable with rustls gave.
pub struct RustlsConsidered {
    pub report: RustlsExecutableReport,
    pub compiled: CompiledIn,
}

/// Puts the tying probes on `path` if it carries rustls, and gives its
/// plaintext sites for the caller to place. None: no rustls in it.
pub fn consider(
    probes: &mut Probes,
    id: FileId,
    path: &Path,
    shown: &str,
) -> Option<RustlsConsidered> {
    let image = match rl::inspect(path) {
        Ok(None) => return None,
        Ok(Some(img)) => img,
        Err(e) => {
            tracing::debug!("rustls executable {shown}: not probed: {e}");
            // Unreadable files are not rustls executables we know of.
            if matches!(e, rl::RustlsError::Open(..) | rl::RustlsError::Parse(..)) {
                return None;
            }
            return Some(RustlsConsidered {
                report: RustlsExecutableReport {
                    path: shown.to_owned(),
                    probes: 0,
                    mangling: None,
                    not_probed: Some(e.to_string()),
                },
                compiled: CompiledIn::default(),
            });
        }
    };
    let mut file = TlsFileReport::new(shown, library::RUSTLS, id);
    if let Some(why) = probes.refusal(Feature::TlsHandshakes, Library::Rustls) {
        return Some(RustlsConsidered {
            report: RustlsExecutableReport {
                path: shown.to_owned(),
                probes: 0,
                mangling: Some(image.mangling),
                not_probed: Some(format!("the kernel refused its programs: {why}")),
            },
            compiled: CompiledIn {
                file: Some(file),
                ..CompiledIn::default()
            },
        });
    }
    let mut handshake = Vec::new();
    for site in sites(&image, Feature::TlsHandshakes) {
        match site.attach_all(probes, path) {
            Ok(link) => {
                file.probes += 1;
                handshake.push((site.program, link));
            }
            Err(e) => {
                if file.errors.len() < 8 {
                    file.errors.push(chain(&e));
                }
            }
        }
    }
    tracing::info!(
        "TLS: rustls executable {shown} ({} mangling) probed, {} tying probes",
        image.mangling,
        file.probes
    );
    Some(RustlsConsidered {
        report: RustlsExecutableReport {
            path: shown.to_owned(),
            probes: file.probes,
            mangling: Some(image.mangling),
            not_probed: None,
        },
        compiled: CompiledIn {
            file: Some(file),
            plaintext: match probes.refusal(Feature::TlsPlaintext, Library::Rustls) {
                None => sites(&image, Feature::TlsPlaintext),
                Some(_) => Vec::new(),
            },
            handshake,
            go_index: None,
        },
    })
}

/// The table's rustls probes of `feature` found in the image.
fn sites(image: &rl::RustlsImage, feature: Feature) -> Vec<ProbeSite> {
    programs::uprobe_sites(feature, Library::Rustls)
        .into_iter()
        .filter_map(|site| {
            Some(ProbeSite {
                program: site.program,
                symbol: site.symbol,
                offset: image.offset(site.symbol)?,
                cookie: u64::from(library::RUSTLS),
                ret: site.ret,
            })
        })
        .collect()
}
