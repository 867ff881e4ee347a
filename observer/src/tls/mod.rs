//! TLS: which libraries to probe, the probes' lifecycle, and the `tls`
//! object of connection records. The kernel side is observer-ebpf's
//! `tls_calls`, `libssl`, `libgnutls` and `tls_state`.

pub mod elf;
pub mod manager;
pub mod procmaps;
mod record;
pub mod uprobe_events;

pub use manager::{Command, Policy, Settings, TlsProbes, TlsReport};
pub use record::{TlsRecord, TtfbSource};
