//! `observer diagnose`: names the phase that made each call slow, with the
//! figures that show it. The rules (`cause`) are pure functions of a call
//! (`call`), so the exporters tag spans and count causes with the same
//! verdicts the command prints.

pub mod call;
pub mod cause;
pub mod collect;
pub mod only;
pub mod pools;
pub mod run;
pub mod text;
pub mod thresholds;

pub use call::Call;
pub use cause::{diagnose, Cause, Diagnosis};
pub use thresholds::Thresholds;

/// `observer diagnose` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DiagnoseArgs {
    /// The live pipeline's flags (--pid, --comm, --duration, --json, ...).
    #[command(flatten)]
    pub watch: crate::watch::args::WatchArgs,
    /// Only calls to this name (Host header, TLS server name or looked-up
    /// name) or remote address.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Read a `watch --json` stream recorded earlier instead of watching
    /// (`-`: stdin). Lines that are not records are skipped and counted.
    #[arg(long, value_name = "FILE")]
    pub from: Option<std::path::PathBuf>,
    /// How many of the slowest calls to print (0: all).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub thresholds: Thresholds,
}

/// The cause of a connection record with the default thresholds (the span
/// attribute `observer.diagnosis.cause` and the `observer.diagnosis` count).
pub fn cause_of_conn(r: &crate::record::ConnRecord) -> &'static str {
    r.diagnosis
        .unwrap_or_else(|| cause::cause(&Call::phases_of_conn(r), &Thresholds::default()).as_str())
}

/// The same for a request record (a connection's first request carries the
/// connection's lookup, connect and TLS).
pub fn cause_of_request(r: &crate::http::RequestRecord) -> &'static str {
    r.diagnosis.unwrap_or_else(|| {
        cause::cause(&Call::phases_of_request(r), &Thresholds::default()).as_str()
    })
}

#[cfg(test)]
mod tests;
