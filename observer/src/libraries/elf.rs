//! Which TLS library an ELF file carries, and where its functions are; and
//! whether it is a C library with a resolver (musl, a container's glibc).
//!
//! Only the dynamic symbol table is read (what a program exports is what its
//! callers, and our probes, can rely on), from a read-only mapping.

use std::{fs::File, path::Path};

use object::{Object, ObjectSegment, ObjectSymbol};
use observer_common::tls::library;

/// The functions a library's probes need, by name: exactly those the
/// program table probes (a test in programs.rs holds the two equal).
pub const OPENSSL_SYMBOLS: &[&str] = &[
    "SSL_do_handshake",
    "SSL_read",
    "SSL_write",
    "SSL_read_ex",
    "SSL_write_ex",
    "SSL_set_connect_state",
    "SSL_set_fd",
    "SSL_set_tlsext_host_name",
    "SSL_CTX_new",
];
pub const GNUTLS_SYMBOLS: &[&str] = &[
    "gnutls_handshake",
    "gnutls_record_recv",
    "gnutls_record_send",
    "gnutls_deinit",
    "gnutls_server_name_set",
    "gnutls_certificate_allocate_credentials",
];

/// A file that carries a TLS library: its kind and the file offsets of the
/// symbols it exports (a missing one is simply not probed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsImage {
    pub library: u8,
    pub symbols: Vec<(&'static str, u64)>,
}

impl TlsImage {
    pub fn offset(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, o)| o)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("opening {0}: {1}")]
    Open(String, std::io::Error),
    #[error("{0} is not an ELF file we can read: {1}")]
    Parse(String, object::Error),
}

/// What a file carries that the observer probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub tls: Option<TlsImage>,
    /// It exports getaddrinfo: a C library's resolver.
    pub resolver: bool,
}

/// Reads `path`.
pub fn classify(path: &Path) -> Result<Image, ElfError> {
    let mut resolver = false;
    let tls = classify_with(path, &mut resolver)?;
    Ok(Image { tls, resolver })
}

fn classify_with(path: &Path, resolver: &mut bool) -> Result<Option<TlsImage>, ElfError> {
    let show = || path.display().to_string();
    let file = File::open(path).map_err(|e| ElfError::Open(show(), e))?;
    // SAFETY: a read-only private mapping; a file truncated under us would
    // fault, which ELF files that processes have mapped are not.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ElfError::Open(show(), e))?;
    let obj = object::File::parse(&*map).map_err(|e| ElfError::Parse(show(), e))?;
    let mut openssl = Vec::new();
    let mut gnutls = Vec::new();
    let mut is_boringssl = false;
    for sym in obj.dynamic_symbols() {
        if sym.is_undefined() || !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name == "getaddrinfo" {
            *resolver = true;
        }
        // Only BoringSSL has these; OpenSSL's version symbols are in libcrypto.
        if name == "BORINGSSL_self_test" || name == "SSL_CTX_set_grease_enabled" {
            is_boringssl = true;
        }
        let (table, found) = if name.starts_with("SSL_") {
            (OPENSSL_SYMBOLS, &mut openssl)
        } else if name.starts_with("gnutls_") {
            (GNUTLS_SYMBOLS, &mut gnutls)
        } else {
            continue;
        };
        // Versioned duplicates (name@VER) share the address; the first wins.
        if let Some(&want) = table.iter().find(|&&w| w == name) {
            if !found.iter().any(|(n, _)| *n == want) {
                if let Some(off) = file_offset(&obj, sym.address()) {
                    found.push((want, off));
                }
            }
        }
    }
    let has =
        |v: &[(&str, u64)], names: &[&str]| names.iter().all(|n| v.iter().any(|(m, _)| m == n));
    if has(&openssl, &["SSL_do_handshake", "SSL_read", "SSL_write"]) {
        let library = if is_boringssl {
            library::BORINGSSL
        } else {
            library::OPENSSL
        };
        return Ok(Some(TlsImage {
            library,
            symbols: openssl,
        }));
    }
    if has(
        &gnutls,
        &[
            "gnutls_handshake",
            "gnutls_record_recv",
            "gnutls_record_send",
        ],
    ) {
        return Ok(Some(TlsImage {
            library: library::GNUTLS,
            symbols: gnutls,
        }));
    }
    Ok(None)
}

/// The file offset of the function `name` that `path` defines (dynamic
/// symbols first, then the full table), as a uprobe attaches to it.
pub fn symbol_offset(path: &Path, name: &str) -> Option<u64> {
    let file = File::open(path).ok()?;
    // SAFETY: as in `classify_with`.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*map).ok()?;
    let found = obj
        .dynamic_symbols()
        .chain(obj.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(name))?;
    file_offset(&obj, found.address())
}

/// The file offset of virtual address `addr` (what uprobes attach to).
/// Checked arithmetic: Go executables (`golang.rs`) feed it addresses read
/// from the file itself.
pub(crate) fn file_offset<'d, R: object::ReadRef<'d>>(
    obj: &object::File<'d, R>,
    addr: u64,
) -> Option<u64> {
    obj.segments().find_map(|seg| {
        let (off, fsize) = seg.file_range();
        let delta = addr.checked_sub(seg.address())?;
        (delta < seg.size() && delta < fsize)
            .then(|| off.checked_add(delta))
            .flatten()
    })
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use super::*;

    #[test]
    fn not_elf_is_an_error_and_a_plain_binary_has_no_tls() {
        let dir = std::env::temp_dir().join(format!("observer-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("text");
        std::fs::write(&text, b"hello").unwrap();
        assert!(matches!(classify(&text), Err(ElfError::Parse(..))));
        assert!(matches!(
            classify(&dir.join("missing")),
            Err(ElfError::Open(..))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        // The test binary itself exports no TLS library.
        let me = std::env::current_exe().unwrap();
        assert_eq!(
            classify(&me).unwrap(),
            Image {
                tls: None,
                resolver: false
            }
        );
    }

    /// getaddrinfo's offset in the C library holds the code this process
    /// runs as getaddrinfo.
    #[test]
    fn symbol_offset_of_getaddrinfo_in_libc() {
        let libc = crate::libraries::system_libc().expect("a C library");
        let off = symbol_offset(&libc, "getaddrinfo").unwrap() as usize;
        let file = std::fs::read(&libc).unwrap();
        // SAFETY: reads 32 bytes of getaddrinfo's own code, mapped here.
        let code = unsafe { std::slice::from_raw_parts(libc::getaddrinfo as *const u8, 32) };
        // The first byte may be a uprobe's breakpoint (an observer running
        // beside the tests probes getaddrinfo).
        assert_eq!(&file[off + 1..off + 32], &code[1..]);
        assert_eq!(symbol_offset(&libc, "no_such_function_here"), None);
    }

    /// The C library the tests run on is a resolver, not a TLS library.
    #[test]
    fn system_libc_is_a_resolver() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| {
                p.rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("libc.so"))
            })
            .expect("a libc mapped");
        let img = classify(Path::new(libc)).unwrap();
        assert!(img.resolver && img.tls.is_none(), "{img:?}");
    }

    /// Debian's libssl (required under CI, where the end-to-end tests use it):
    /// the symbols at distinct offsets inside the file.
    #[test]
    fn system_libssl() {
        let Some(path) = [
            "/usr/lib/x86_64-linux-gnu/libssl.so.3",
            "/lib/x86_64-linux-gnu/libssl.so.3",
        ]
        .iter()
        .map(Path::new)
        .find(|p| p.exists()) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "libssl.so.3 missing under CI"
            );
            eprintln!("SKIPPED: no libssl.so.3 on this machine");
            return;
        };
        let img = classify(path).unwrap().tls.expect("libssl carries OpenSSL");
        assert_eq!(img.library, library::OPENSSL);
        let len = std::fs::metadata(path).unwrap().len();
        let mut offs: Vec<u64> = [
            "SSL_do_handshake",
            "SSL_read",
            "SSL_write",
            "SSL_set_connect_state",
            "SSL_set_fd",
        ]
        .iter()
        .map(|n| img.offset(n).unwrap_or_else(|| panic!("{n} missing")))
        .collect();
        assert!(offs.iter().all(|&o| o > 0 && o < len), "{offs:x?}");
        offs.sort_unstable();
        offs.dedup();
        assert_eq!(offs.len(), 5);
    }
}
