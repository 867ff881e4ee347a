//! `watch`'s options, which `run`, `top` and `diagnose` take too (flattened
//! into theirs): their own file, so those front ends and the command line
//! import them without importing each other. Flags named here are a
//! contract: add, never rename.

use std::time::Duration;

use clap::{Args, ValueEnum};
use observer_common::{DEFAULT_MAX_CONNECTIONS, DEFAULT_RING_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DirectionArg {
    Inbound,
    Outbound,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// One JSON object per line instead of aligned columns.
    #[arg(long)]
    pub json: bool,
    /// Only connections of these process ids (repeat or comma-separate).
    #[arg(long, value_name = "PID", value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Only connections of processes with this name (process or thread name).
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub comm: Vec<String>,
    /// Only connections with this local or remote port.
    #[arg(long, value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Vec<u16>,
    /// Only inbound or only outbound connections.
    #[arg(long, value_enum)]
    pub direction: Option<DirectionArg>,
    /// Stop by itself after this many seconds (fractions allowed).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Emit a snapshot ("state": "open") of connections open longer than this,
    /// every this many seconds; 0 turns snapshots off.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_seconds_or_zero)]
    pub update_interval: Duration,
    /// Connections tracked at once in the kernel (LRU beyond that; evictions are counted).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(64..=16_777_216))]
    pub max_connections: u32,
    /// Kernel ring buffer size in bytes (a power of two, at least 4096).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_RING_BYTES, value_parser = parse_ring_bytes)]
    pub ring_bytes: u32,
    /// Whose TLS reads and writes are captured (uprobes on every TLS library
    /// file, in each process from its first byte; about 5 us per call):
    /// auto: every process while it makes at most --tls-plaintext-max-rate
    /// calls/s (then turned off in the kernel); all: every process, always;
    /// off: none (TLS first-byte times then come from the socket).
    #[arg(long, value_enum, value_name = "POLICY", default_value = "auto")]
    pub tls_plaintext_probes: crate::tls::Policy,
    /// Plaintext TLS calls per second above which a process's capture is
    /// turned off (auto policy).
    #[arg(long, value_name = "CALLS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_plaintext_max_rate: u64,
    /// Kept for existing command lines; limits nothing since the plaintext
    /// probes are on the library files for all processes.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub tls_plaintext_max_processes: u64,
    /// DNS messages on port 53 (cgroup_skb programs on the root cgroup):
    /// lookups of programs with their own resolver, and the server, id and
    /// retries of library lookups. off: library lookups only (the packet
    /// programs, there for plain HTTP too, leave DNS messages alone).
    #[arg(long, value_enum, value_name = "ON|OFF", default_value = "on")]
    pub dns_wire: OnOff,
    /// Stop the first process of an executable not looked at yet, at its
    /// exec, until the probes its file needs are on (a Go program's TLS),
    /// then resume it (a few ms, once per file; never a process on a
    /// terminal). off: such a process's first connections may be missed.
    #[arg(long, value_enum, value_name = "ON|OFF", default_value = "on")]
    pub exec_hold: OnOff,
    /// The host's cgroup v2 root, where the packet programs go (default:
    /// where this process sees cgroup2 mounted). In a container with its own
    /// cgroup namespace, mount the host's /sys/fs/cgroup and name it here.
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<std::path::PathBuf>,
    /// The kubelet's pod log directory, where pods' namespaces, names and
    /// containers' names are read (`<namespace>_<pod>_<uid>/<container>/`).
    #[arg(long, value_name = "DIR", default_value = "/var/log/pods")]
    pub pod_log_dir: std::path::PathBuf,
    /// Keep the query string in request records' `path` (and spans'
    /// `url.path`; metrics never carry it). Off by default: queries often
    /// hold ids, tokens or keys.
    #[arg(long)]
    pub http_query: bool,
    /// Also print connection pool records ("kind": "pool"): each process's
    /// outbound connections to each peer (open, busy, idle; requests, new
    /// connections, closes), every second while any are open or change.
    #[arg(long)]
    pub pools: bool,
    /// The NVML library to load for GPU state (default libnvidia-ml.so.1;
    /// without it GPU features are off and everything else runs).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<String>,
    /// How often the GPUs are sampled, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub gpu_interval: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

pub(crate) fn parse_seconds_or_zero(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || !(0.0..=1e9).contains(&v) {
        return Err(format!("`{s}` is out of range (0 to 1e9 seconds)"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let d = parse_seconds_or_zero(s)?;
    if d.is_zero() {
        return Err("must be more than 0 seconds".into());
    }
    Ok(d)
}

fn parse_ring_bytes(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count"))?;
    if v < 4096 || !v.is_power_of_two() {
        return Err(format!("`{s}` must be a power of two of at least 4096"));
    }
    Ok(v)
}
