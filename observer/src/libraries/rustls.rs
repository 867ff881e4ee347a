//! rustls in a Rust executable: its functions found by symbol (the full
//! symbol table; legacy and v0 mangling, demangled without their hashes).
//! rustls is compiled into each program that uses it, so the functions are
//! the program's own; a stripped executable has none to find.

use std::{fs::File, path::Path};

use object::{Object, ObjectSection, ObjectSymbol};

use super::elf::file_offset;

/// The functions the probes go on, as rustls 0.23 names them (the names the
/// program table uses), each with the names earlier versions give it.
pub const RECORD_READ: &str = "rustls::msgs::deframer::buffers::DeframerVecBuffer::read";
pub const RECORDS_DONE: &str = "rustls::common_state::CommonState::current_io_state";
pub const WRITE: &str = "<rustls::conn::connection::Writer as std::io::Write>::write";
pub const WRITE_VECTORED: &str =
    "<rustls::conn::connection::Writer as std::io::Write>::write_vectored";
pub const WRITE_COMMON: &str = "rustls::common_state::CommonState::buffer_plaintext";
pub const CHUNK: &str = "rustls::conn::connection::Reader::into_first_chunk";
pub const CONSUME: &str = "<rustls::conn::connection::Reader as std::io::BufRead>::consume";
pub const READ: &str = "<rustls::conn::connection::Reader as std::io::Read>::read";
pub const WRITE_TO: &str = "rustls::vecbuf::ChunkVecBuffer::write_to";

/// Each function's names: 0.23's first, then 0.22's and 0.21's (`Reader`
/// and `Writer` were in `rustls::conn`; the socket was read by
/// `MessageDeframer::read`, rsi the reader as in 0.23; a write's connection
/// named by `CommonState::send_some_plaintext`, rdi the state as in 0.23).
const NAMES: &[(&str, &[&str])] = &[
    (
        RECORD_READ,
        &[RECORD_READ, "rustls::msgs::deframer::MessageDeframer::read"],
    ),
    (RECORDS_DONE, &[RECORDS_DONE]),
    (
        WRITE,
        &[WRITE, "<rustls::conn::Writer as std::io::Write>::write"],
    ),
    (
        WRITE_VECTORED,
        &[
            WRITE_VECTORED,
            "<rustls::conn::Writer as std::io::Write>::write_vectored",
        ],
    ),
    (
        WRITE_COMMON,
        &[
            WRITE_COMMON,
            "rustls::common_state::CommonState::send_some_plaintext",
        ],
    ),
    (CHUNK, &[CHUNK, "rustls::conn::Reader::into_first_chunk"]),
    (
        CONSUME,
        &[
            CONSUME,
            "<rustls::conn::Reader as std::io::BufRead>::consume",
        ],
    ),
    (
        READ,
        &[READ, "<rustls::conn::Reader as std::io::Read>::read"],
    ),
    (WRITE_TO, &[WRITE_TO]),
];

/// Without these a connection is never tied, and nothing is written.
const REQUIRED: &[&str] = &[RECORD_READ, RECORDS_DONE, WRITE_COMMON];

/// An executable that carries rustls: where its functions are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RustlsImage {
    /// (the table's name, file offset) of each function found.
    pub functions: Vec<(&'static str, u64)>,
    /// "legacy" or "v0": how its symbols were mangled.
    pub mangling: &'static str,
}

impl RustlsImage {
    pub fn offset(&self, name: &str) -> Option<u64> {
        self.functions
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, o)| o)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RustlsError {
    #[error("opening {0}: {1}")]
    Open(String, std::io::Error),
    #[error("{0} is not an ELF file we can read: {1}")]
    Parse(String, object::Error),
    #[error("rustls is in it, but its symbol table was stripped: nothing to probe by name")]
    Stripped,
    #[error(
        "rustls is in it, but not these functions (inlined, or a version we do not know): {0}"
    )]
    Missing(String),
}

/// Reads `path`: `Ok(None)` when it shows no sign of rustls, `Ok(Some)`
/// when it can be probed, `Err` when it carries rustls but cannot be (or
/// cannot be read).
pub fn inspect(path: &Path) -> Result<Option<RustlsImage>, RustlsError> {
    let show = || path.display().to_string();
    let file = File::open(path).map_err(|e| RustlsError::Open(show(), e))?;
    // SAFETY: a read-only private mapping; a file truncated under us would
    // fault, which executables that processes have mapped are not.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| RustlsError::Open(show(), e))?;
    let obj = object::File::parse(&*map).map_err(|e| RustlsError::Parse(show(), e))?;
    let mut functions: Vec<(&'static str, u64)> = Vec::new();
    let mut mangling = "legacy";
    let mut mentions = false;
    for sym in obj.symbols() {
        if !sym.is_definition() {
            continue;
        }
        let Ok(raw) = sym.name() else { continue };
        // Both manglings spell the crate's name out: a cheap filter before
        // demangling.
        if !raw.contains("rustls") {
            continue;
        }
        mentions = true;
        let name = inherent_plain(format!("{:#}", rustc_demangle::demangle(raw)));
        let Some(&(canonical, _)) = NAMES.iter().find(|(_, names)| names.contains(&&*name)) else {
            continue;
        };
        if functions.iter().any(|(n, _)| *n == canonical) {
            continue;
        }
        if let Some(off) = file_offset(&obj, sym.address()) {
            if raw.starts_with("_R") {
                mangling = "v0";
            }
            functions.push((canonical, off));
        }
    }
    if !mentions {
        // A stripped executable still carries rustls's panic locations
        // (source paths in .rodata): say why it got nothing.
        return if obj.symbols().next().is_none() && carries_rustls_paths(&obj) {
            Err(RustlsError::Stripped)
        } else {
            Ok(None)
        };
    }
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|r| !functions.iter().any(|(n, _)| n == r))
        .collect();
    if functions.is_empty() {
        // Names rustls (a crate called rustls-something, or only types).
        return Ok(None);
    }
    if !missing.is_empty() {
        return Err(RustlsError::Missing(missing.join(", ")));
    }
    Ok(Some(RustlsImage {
        functions,
        mangling,
    }))
}

/// A method of a type's own impl as legacy mangling names it: v0 writes
/// `<rustls::common_state::CommonState>::current_io_state`, legacy
/// `rustls::common_state::CommonState::current_io_state` (a trait's method,
/// `<T as Trait>::f`, is written alike by both).
fn inherent_plain(name: String) -> String {
    match name.strip_prefix('<').and_then(|n| n.split_once(">::")) {
        Some((ty, f)) if !ty.contains(" as ") && !ty.contains('<') => format!("{ty}::{f}"),
        _ => name,
    }
}

/// Whether the read-only data names rustls's sources (its panic
/// locations), as a program built with it keeps after stripping.
fn carries_rustls_paths<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>) -> bool {
    let Some(data) = obj.section_by_name(".rodata").and_then(|s| s.data().ok()) else {
        return false;
    };
    memchr::memmem::find(data, b"/rustls-0.").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_has_its_own_name_first() {
        for (canonical, names) in NAMES {
            assert_eq!(names.first(), Some(canonical));
        }
        for r in REQUIRED {
            assert!(NAMES.iter().any(|(c, _)| c == r));
        }
    }

    #[test]
    fn v0_inherent_methods_read_as_legacy_ones() {
        for (v0, legacy) in [
            (
                "<rustls::common_state::CommonState>::current_io_state",
                RECORDS_DONE,
            ),
            (WRITE, WRITE),
            (
                "<rustls::conn::connection::Reader>::into_first_chunk",
                CHUNK,
            ),
            ("<alloc::vec::Vec<u8>>::push", "<alloc::vec::Vec<u8>>::push"),
        ] {
            assert_eq!(inherent_plain(v0.to_owned()), legacy);
        }
    }

    #[test]
    fn a_program_without_rustls_is_not_one() {
        // The unit tests link rustls (the OTLP exporter's), so look at a
        // program that does not: the system's shell.
        assert!(matches!(inspect(Path::new("/bin/sh")), Ok(None)));
    }
}
