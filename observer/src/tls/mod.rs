//! TLS: which libraries to probe, the probes' lifecycle, and the `tls`
//! object of connection records. The kernel side is observer-ebpf's
//! `tls_calls`, `libssl`, `libgnutls`, `go_tls`, `rustls` and `tls_state`.

mod command;
mod go;
mod hold;
pub mod manager;
mod record;
mod report;
mod rustls;
mod site;
pub mod uprobe_events;

pub use command::Command;
pub use manager::{OnCLibrary, TlsProbes};
pub use record::{TlsRecord, TlsSource, TtfbSource, TtfbUnmeasured};
pub use report::{
    ExecHoldReport, GoExecutableReport, Policy, RustlsExecutableReport, Settings, TlsFileReport,
    TlsReport,
};
