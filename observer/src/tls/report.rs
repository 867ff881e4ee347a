//! The TLS probe policy and what the manager reports (`ready`, summary,
//! `doctor`).

use serde::Serialize;

use crate::libraries::golang::{OffsetsSource, SymbolSource};

/// When the plaintext read/write probes are attached (`--tls-plaintext-probes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Never: TLS times come from the socket after the handshake.
    Off,
    /// Every process from its first byte, while its call rate is modest.
    Auto,
    /// On every TLS file for all processes (costly for busy TLS servers).
    All,
}

#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub policy: Policy,
    /// Plaintext calls per second above which a process's probes come off.
    pub max_rate: u64,
    /// Per-process probe sets at once (on files that are per process).
    pub max_processes: usize,
    /// Hold a new executable's first process at exec until it is probed.
    pub hold_execs: bool,
}

/// What the manager found and did, for `ready`, the summary and `doctor`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TlsReport {
    pub plaintext_policy: Option<Policy>,
    pub plaintext_max_rate: u64,
    /// Why the TLS programs could not be loaded (then nothing is probed).
    pub programs_error: Option<String>,
    pub files: Vec<TlsFileReport>,
    /// Processes whose plaintext calls are captured now, their rate watched.
    pub plaintext_processes: usize,
    /// Processes whose plaintext calls were captured, in all.
    pub plaintext_attached_total: u64,
    /// Processes whose capture was turned off for their call rate.
    pub plaintext_fell_back: u64,
    /// Processes left without their own probes on a per-process file
    /// because of the cap.
    pub plaintext_over_cap: u64,
    /// Uprobe attachments that failed.
    pub attach_errors: u64,
    /// /proc/PID/maps files that could not be read.
    pub maps_unreadable: u64,
    /// Files that could not be opened or parsed.
    pub files_unreadable: u64,
    /// Times a file went per process for a busy process on it.
    pub files_per_process_total: u64,
    /// Files whose probes came off: replaced or removed on disk, and
    /// mapped by no process.
    pub files_released: u64,
    /// Go executables seen: probed, or why not.
    pub go_executables: Vec<GoExecutableReport>,
    /// Go executables beyond the listed ones.
    pub go_executables_unlisted: u64,
    /// Rust executables with rustls seen: probed, or why not.
    pub rustls_executables: Vec<RustlsExecutableReport>,
    /// Rust executables with rustls beyond the listed ones.
    pub rustls_executables_unlisted: u64,
    /// New executables' first processes held at exec: on, or why not.
    pub exec_hold: ExecHoldReport,
}

/// Holding new executables' first processes at exec (`--exec-hold`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExecHoldReport {
    pub on: bool,
    /// Why holding is off (None while on).
    pub off_reason: Option<String>,
    /// Processes held and resumed (at exec, or at a mapping).
    pub held: u64,
    /// Of those, held at an mmap of a file not looked at yet (a library
    /// opened while running).
    pub held_mappings: u64,
    /// The longest and the total time a process was held, from its exec (or
    /// mmap) to its resumption, in microseconds.
    pub max_us: u64,
    pub total_us: u64,
    /// Processes a killed observer had left held, resumed at start.
    pub resumed_at_start: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TlsFileReport {
    pub path: String,
    pub library: &'static str,
    pub dev: u64,
    pub inode: u64,
    /// Handshake probes attached for all processes.
    pub probes: usize,
    /// Its plaintext probes are per process now (a busy process maps it);
    /// false: for all processes.
    pub per_process: bool,
    pub errors: Vec<String>,
    /// Replaced or removed on disk, and mapped by no process: its probes
    /// came off (a process that maps it again gets a new entry).
    pub released: bool,
}

impl TlsFileReport {
    /// A file of `library` (its id) just found, nothing attached yet.
    pub fn new(shown: &str, library: u8, id: crate::libraries::procmaps::FileId) -> Self {
        Self {
            path: shown.to_owned(),
            library: observer_common::tls::library::name(library),
            dev: id.0,
            inode: id.1,
            probes: 0,
            per_process: false,
            errors: Vec::new(),
            released: false,
        }
    }
}

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

/// A Rust executable with rustls looked at: probed, or why not (`doctor`).
#[derive(Clone, Debug, Serialize)]
pub struct RustlsExecutableReport {
    pub path: String,
    /// Uprobes placed (entries and returns).
    pub probes: usize,
    /// "legacy" or "v0" symbol mangling.
    pub mangling: Option<&'static str>,
    /// Why it got no probes (stripped, functions not found).
    pub not_probed: Option<String>,
}
