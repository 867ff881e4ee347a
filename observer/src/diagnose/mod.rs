//! `observer diagnose`: names the phase that made each call slow, with the
//! figures that show it. The rules live in `crate::cause` (pure functions
//! of a call), so the exporters tag spans and count causes with the same
//! verdicts this command prints.

pub mod collect;
pub mod only;
pub mod pools;
pub mod read;
pub mod run;
pub mod text;

use crate::cause::Thresholds;

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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod typed_tests;
