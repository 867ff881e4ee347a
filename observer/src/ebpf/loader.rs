//! Prepare (parse the object, set load-time constants and map sizes, create
//! maps) apart from attach (side effects), both public so tests reuse them.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use aya::{
    maps::{HashMap, MapData, PerCpuArray},
    programs::{Program, ProgramFd, RawTracePoint},
    Ebpf, EbpfLoader,
};
use observer_common::{
    hold::EXE_WALK_GLOBAL,
    tls::{go::FD_WALK_GLOBAL, BUSY_CALLS_GLOBAL, RATE_WINDOW_NS, TLS_CONNS_MAP},
    tracepoints, Conn, Counter, TlsConn, CONNS_MAP, COUNTERS_MAP, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_RING_BYTES, DNS_WIRE_GLOBAL, EMIT_AT_DESTROY_GLOBAL, EVENTS_MAP, OWN_TGID_GLOBAL,
    SKB_TASK_GLOBAL, SK_ERR_OFFSET_GLOBAL, SK_LOCK_OWNED_OFFSET_GLOBAL, SOCK_TUPLE_GLOBAL,
    SRTT_US_OFFSET_GLOBAL, TASK_IDS_GLOBAL, TCP_COUNTERS_GLOBAL, WAKEUP_BYTES_GLOBAL,
};

use crate::tracefs::Described;

/// The eBPF object observer/build.rs built.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// The fewest plaintext calls in one kernel rate window that report a
/// process busy, whatever the cap.
pub const MIN_BUSY_CALLS: u64 = 16;

/// Calls per kernel rate window (50 ms) that make a process busy at `rate`
/// calls/s (0: never): at least MIN_BUSY_CALLS, as a low cap's share of one
/// window (5 calls at 100/s) is what any client makes around its first
/// request (curl: 4, then waits) and says nothing of its rate; the
/// manager's 200 ms average judges those.
fn busy_calls_per_window(rate: u64) -> u32 {
    match rate {
        0 => 0,
        rate => u32::try_from(rate.saturating_mul(RATE_WINDOW_NS) / 1_000_000_000)
            .map_or(u32::MAX, |n| n.max(MIN_BUSY_CALLS as u32)),
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// CONNS max_entries: connections tracked at once.
    pub max_connections: u32,
    /// Ring buffer bytes (power of two, multiple of the page size).
    pub ring_bytes: u32,
    /// Plaintext TLS calls per second above which a process is reported busy
    /// by the kernel (0: never).
    pub tls_busy_rate: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            ring_bytes: DEFAULT_RING_BYTES,
            tls_busy_rate: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not root and without CAP_BPF + CAP_PERFMON.
    #[error("{}", crate::privileges::NEEDS)]
    NotPrivileged,
    /// The object could not be loaded (maps could not be created).
    #[error("loading the eBPF object failed: {0}")]
    Object(#[from] aya::EbpfError),
    /// A program that everything depends on could not be attached.
    #[error("required program {program} ({gives}) could not be attached: {reason}")]
    Required {
        program: &'static str,
        gives: &'static str,
        reason: String,
    },
}

/// The loaded object and the load-time decisions made for this kernel.
pub struct Loaded {
    pub ebpf: Ebpf,
    /// Records go out when the socket is destroyed (tcp:tcp_destroy_sock).
    pub emit_at_destroy: bool,
    /// How the packet programs know the task here: the helpers they may
    /// call (`observer_common::SKB_TASK_*`), and `kernel_probe::TASK_STRUCT`
    /// where they read it from the task's own fields.
    pub skb_task: u32,
    /// Where `sk_err` and `srtt_us` sit in the kernel's socket structs, or why
    /// that is unknown (then "timeout"/"unreachable" errors and RTTs are lost).
    pub offsets: Result<crate::btf::KernelOffsets, crate::btf::OffsetsError>,
}

/// Parses the object and creates its maps. Load-time constants: our own tgid
/// (the programs never observe the observer), the `sk_err` offset from BTF,
/// whether records wait for the socket's destruction, and whether the packet
/// programs read DNS messages.
pub fn load(
    opts: &LoadOptions,
    dns_wire: bool,
    described: &Described,
) -> Result<Loaded, LoadError> {
    if !crate::privileges::Privileges::current().sufficient() {
        return Err(LoadError::NotPrivileged);
    }
    let own = std::process::id();
    let offsets = crate::btf::kernel_offsets();
    let (sk_err, srtt, sk_lock_owned) = offsets
        .as_ref()
        .map_or((0, 0, 0), |o| (o.sk_err, o.srtt_us, o.sk_lock_owned));
    let fd_walk = offsets
        .as_ref()
        .ok()
        .and_then(|o| o.fd_walk)
        .unwrap_or_default();
    let exe_walk = offsets
        .as_ref()
        .ok()
        .and_then(|o| o.exe_walk)
        .unwrap_or_default();
    let tcp_counters = offsets.as_ref().map(|o| o.tcp_counters).unwrap_or_default();
    let sock_tuple = offsets.as_ref().map(|o| o.sock_tuple).unwrap_or_default();
    let emit_at_destroy = described
        .check(&tracepoints::tcp_destroy_sock::LAYOUT, true)
        .is_ok();
    // Wake the reader at an eighth full: at 40 MB/s of events that is every
    // ~13 ms, well inside the ring even if the poll timer is late.
    let wakeup = u64::from(opts.ring_bytes / 8);
    let busy_calls = busy_calls_per_window(opts.tls_busy_rate);
    let skb_task = super::kernel_probe::skb_task_helpers();
    let task_ids = offsets.as_ref().map(|o| o.task_ids).unwrap_or_default();
    let ebpf = EbpfLoader::new()
        // Our programs carry no CO-RE relocations (offsets come from our own
        // BTF reader), so aya needs no kernel BTF kept around.
        .btf(None)
        .override_global(OWN_TGID_GLOBAL, &own, true)
        .override_global(WAKEUP_BYTES_GLOBAL, &wakeup, true)
        .override_global(SK_ERR_OFFSET_GLOBAL, &sk_err, true)
        .override_global(SRTT_US_OFFSET_GLOBAL, &srtt, true)
        .override_global(SK_LOCK_OWNED_OFFSET_GLOBAL, &sk_lock_owned, true)
        .override_global(FD_WALK_GLOBAL, &fd_walk, true)
        .override_global(EXE_WALK_GLOBAL, &exe_walk, true)
        .override_global(TCP_COUNTERS_GLOBAL, &tcp_counters, true)
        .override_global(SOCK_TUPLE_GLOBAL, &sock_tuple, true)
        .override_global(EMIT_AT_DESTROY_GLOBAL, &u32::from(emit_at_destroy), true)
        .override_global(BUSY_CALLS_GLOBAL, &busy_calls, true)
        .override_global(DNS_WIRE_GLOBAL, &u32::from(dns_wire), true)
        .override_global(SKB_TASK_GLOBAL, &skb_task, true)
        .override_global(TASK_IDS_GLOBAL, &task_ids, true)
        .map_max_entries(CONNS_MAP, opts.max_connections)
        .map_max_entries(EVENTS_MAP, opts.ring_bytes)
        .load(OBJECT)?;
    // Parsing BTF (aya's and ours) left tens of MiB freed on the heap; give
    // them back to the system so a long-running observer stays small.
    // SAFETY: malloc_trim only releases free memory.
    unsafe { libc::malloc_trim(0) };
    let task_struct = if task_ids.tgid != 0 && task_ids.comm != 0 {
        super::kernel_probe::TASK_STRUCT
    } else {
        0
    };
    Ok(Loaded {
        ebpf,
        emit_at_destroy,
        skb_task: skb_task | task_struct,
        offsets,
    })
}

/// Detaches and unloads every program, keeping the maps: after this the ring
/// buffer and CONNS no longer change, so a last drain and snapshot are exact.
pub fn detach_all(ebpf: &mut Ebpf) {
    for (name, prog) in ebpf.programs_mut() {
        let res = match prog {
            Program::TracePoint(p) => p.unload(),
            Program::RawTracePoint(p) => p.unload(),
            Program::UProbe(p) => p.unload(),
            Program::CgroupSkb(p) => p.unload(),
            Program::CgroupSock(p) => p.unload(),
            _ => Ok(()),
        };
        if let Err(e) = res {
            tracing::debug!(program = name, "unload: {e}");
        }
    }
}

/// The kernel's per-CPU counters, taken out of the object so that the
/// pipeline can read them while the TLS manager owns the rest.
pub struct KernelCounters {
    counters: Option<PerCpuArray<MapData, u64>>,
    /// The loaded programs whose runs the kernel skips are events lost.
    skippable: Vec<ProgramFd>,
}

impl KernelCounters {
    /// The counters map, and the programs loaded by now (every program of
    /// the table is loaded at start, the uprobes' before any is placed).
    pub fn take(ebpf: &mut Ebpf) -> Self {
        let skippable = ebpf
            .programs()
            .filter(|(name, _)| crate::programs::skips_lose_events(name))
            .filter_map(|(_, p)| p.fd().ok()?.try_clone().ok())
            .collect();
        Self {
            counters: ebpf
                .take_map(COUNTERS_MAP)
                .and_then(|m| PerCpuArray::try_from(m).ok()),
            skippable,
        }
    }

    /// Runs the kernel skipped because the program was already running on
    /// the CPU (`recursion_misses`), over every program whose skips lose
    /// events: the summary's `kernel_missed`, live.
    pub fn skipped(&self) -> u64 {
        self.skippable
            .iter()
            .filter_map(|fd| super::prog_stats::recursion_misses(fd.as_fd().as_raw_fd()))
            .sum()
    }

    /// Sums over CPUs.
    pub fn read(&self) -> Vec<(Counter, u64)> {
        let Some(arr) = &self.counters else {
            return Vec::new();
        };
        Counter::ALL
            .iter()
            .map(|&c| {
                let total = arr.get(&(c as u32), 0).map(|v| v.iter().sum()).unwrap_or(0);
                (c, total)
            })
            .collect()
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.read()
            .iter()
            .find(|(x, _)| *x == c)
            .map_or(0, |(_, v)| *v)
    }
}

/// The kernel's CONNS and TLS_CONNS maps, read by the correlator for
/// snapshots, and the program that copies a socket's byte and segment
/// Read access to the kernel's live connection maps (a trait so the table can
/// be tested without root).
pub trait KernelConns {
    fn lookup(&self, sk: u64) -> Option<Conn>;
    /// The TLS timings of a connection whose `Conn` carries FLAG_TLS.
    fn lookup_tls(&self, _sk: u64) -> Option<TlsConn> {
        None
    }
    /// Brings an open connection's byte and segment counts up to date
    /// before it is looked up for a snapshot.
    fn refresh(&self, _sk: u64) {}
    /// Connections the kernel holds (at stop: open ones, or leaks).
    fn tracked(&self) -> u64 {
        0
    }
}

/// counters into CONNS before one is read.
pub struct KernelConnMap {
    pub conns: HashMap<MapData, u64, Conn>,
    pub tls: Option<HashMap<MapData, u64, TlsConn>>,
    counters: Option<ProgramFd>,
}

/// The never-attached program run by [`KernelConnMap::refresh`].
const CONN_COUNTERS: &str = "conn_counters";

impl KernelConnMap {
    pub fn take(ebpf: &mut Ebpf) -> Option<Self> {
        let map = ebpf.take_map(CONNS_MAP)?;
        let tls = ebpf
            .take_map(TLS_CONNS_MAP)
            .and_then(|m| HashMap::try_from(m).ok());
        let counters = load_counters(ebpf)
            .map_err(|e| tracing::warn!("open connections' bytes and segments not read: {e}"))
            .ok();
        HashMap::try_from(map).ok().map(|conns| Self {
            conns,
            tls,
            counters,
        })
    }
}

/// Loads the counters program and keeps its own descriptor, so that it
/// outlives [`detach_all`] for the snapshots taken after it.
fn load_counters(ebpf: &mut Ebpf) -> anyhow::Result<ProgramFd> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(CONN_COUNTERS)
        .ok_or_else(|| anyhow::anyhow!("no {CONN_COUNTERS} program in the object"))?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load()?;
    }
    Ok(prog.fd()?.try_clone()?)
}

impl KernelConns for KernelConnMap {
    fn lookup(&self, sk: u64) -> Option<Conn> {
        self.conns.get(&sk, 0).ok()
    }

    fn lookup_tls(&self, sk: u64) -> Option<TlsConn> {
        self.tls.as_ref()?.get(&sk, 0).ok()
    }

    fn tracked(&self) -> u64 {
        self.conns.keys().count() as u64
    }

    fn refresh(&self, sk: u64) {
        if let Some(fd) = &self.counters {
            if let Err(e) = test_run_raw_tp(fd.as_fd(), &[sk]) {
                tracing::debug!("{CONN_COUNTERS}: {e}");
            }
        }
    }
}

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs a raw tracepoint program once with `args` as its arguments.
fn test_run_raw_tp(fd: BorrowedFd<'_>, args: &[u64]) -> std::io::Result<u32> {
    let mut attr = TestRunAttr {
        prog_fd: fd.as_raw_fd() as u32,
        ctx_size_in: std::mem::size_of_val(args) as u32,
        ctx_in: args.as_ptr() as u64,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid, zero-padded bpf_attr for this command; the
    // kernel reads `args` (alive for the call) and writes `retval`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            std::ptr::addr_of_mut!(attr),
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_cap_still_takes_sixteen_calls_in_a_window() {
        assert_eq!(busy_calls_per_window(0), 0);
        assert_eq!(busy_calls_per_window(100), 16);
        assert_eq!(busy_calls_per_window(500), 25);
        assert_eq!(busy_calls_per_window(2000), 100);
        assert_eq!(busy_calls_per_window(u64::MAX), u32::MAX);
    }
}
