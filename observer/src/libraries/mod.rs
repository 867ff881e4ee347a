//! Which files to look at (`discovery`) and which mapped file is what:
//! OpenSSL, BoringSSL, GnuTLS, a C library, a Go or rustls executable. The
//! TLS manager hands TLS files to `tls` and C libraries to `dns`; neither
//! feature reaches into the other.

pub mod discovery;
pub mod elf;
pub mod golang;
pub mod pinned;
pub mod procmaps;
pub mod rustls;

use std::path::PathBuf;

/// Directories searched at start for the system's TLS libraries, so that a
/// process that loads one later (Python imports ssl lazily) is covered
/// before it does.
pub const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/lib64",
];

/// Where musl's C library lives on this host (its loader is its libc):
/// looked at start, so that a musl program's first lookup is seen.
pub const MUSL_LIBS: &[&str] = &[
    "/lib/ld-musl-x86_64.so.1",
    "/lib/ld-musl-aarch64.so.1",
    "/usr/lib/x86_64-linux-musl/libc.so",
    "/usr/lib/aarch64-linux-musl/libc.so",
];

/// The C library this observer itself maps (the system's).
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
