//! Maps and load-time constants shared by all probe families.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    tls::{
        go::{FdWalk, GoOffsets, MAX_GO_BINARIES},
        RustlsThread, TlsCall, TlsCallKey, TlsProc, TlsSession, TlsSessionKey, MAX_TLS_CONNS,
        MAX_TLS_PROCS, MAX_TLS_SESSIONS, MAX_TLS_THREADS,
    },
    Conn, Counter, SockTuple, TcpCounters, TlsConn, COUNTER_SLOTS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_RING_BYTES,
};

#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// Socket pointer -> live connection. LRU so that a missed CLOSE can never fill
/// it; userspace notices evictions (a connection it knows vanished without a
/// close event) and counts them.
#[map(name = "CONNS")]
pub static CONNS: LruHashMap<u64, Conn> = LruHashMap::with_max_entries(DEFAULT_MAX_CONNECTIONS, 0);

/// The observer's own sockets, dropped from CONNS when they were claimed:
/// the packet programs must not take them for connections begun before the
/// observer started.
#[map(name = "OWN_SOCKS")]
pub static OWN_SOCKS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(1024, 0);

#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// The observer's own tgid; its sockets are never tracked.
#[no_mangle]
static OWN_TGID: u32 = 0;

/// Byte offset of `sk_err` in `struct sock`, from BTF; 0 when unknown.
#[no_mangle]
static SK_ERR_OFFSET: u32 = 0;

/// Byte offset of `srtt_us` in `struct tcp_sock`, from BTF; 0 when unknown.
#[no_mangle]
static SRTT_US_OFFSET: u32 = 0;

#[inline(always)]
pub fn srtt_us_offset() -> u32 {
    unsafe { core::ptr::read_volatile(&SRTT_US_OFFSET) }
}

/// Where `struct tcp_sock`'s byte and segment counters are, from BTF.
#[no_mangle]
static TCP_COUNTERS: TcpCounters = TcpCounters {
    bytes_sent: 0,
    bytes_retrans: 0,
    bytes_received: 0,
    data_segs_out: 0,
    data_segs_in: 0,
    sk_flags: 0,
};

#[inline(always)]
pub fn tcp_counters() -> TcpCounters {
    unsafe { core::ptr::read_volatile(&TCP_COUNTERS) }
}

/// Where a socket's family, protocol, ports and addresses are, from BTF.
#[no_mangle]
static SOCK_TUPLE: SockTuple = SockTuple {
    family: 0,
    protocol: 0,
    dport: 0,
    sport: 0,
    saddr: 0,
    daddr: 0,
    saddr_v6: 0,
    daddr_v6: 0,
};

#[inline(always)]
pub fn sock_tuple() -> SockTuple {
    unsafe { core::ptr::read_volatile(&SOCK_TUPLE) }
}

/// Byte offset of `sk_lock.owned` in `struct sock`, from BTF; 0 when unknown.
#[no_mangle]
static SK_LOCK_OWNED_OFFSET: u32 = 0;

#[inline(always)]
pub fn sk_lock_owned_offset() -> u32 {
    unsafe { core::ptr::read_volatile(&SK_LOCK_OWNED_OFFSET) }
}

/// Task helpers the packet programs may call here (`SKB_TASK_PID`,
/// `SKB_TASK_COMM`); 0 until the loader sets what the kernel allows.
#[no_mangle]
static SKB_TASK: u32 = 0;

#[inline(always)]
pub fn skb_task_pid() -> bool {
    unsafe { core::ptr::read_volatile(&SKB_TASK) & observer_common::SKB_TASK_PID != 0 }
}

#[inline(always)]
pub fn skb_task_comm() -> bool {
    unsafe { core::ptr::read_volatile(&SKB_TASK) & observer_common::SKB_TASK_COMM != 0 }
}

/// Where a task's ids and name are, for the packet programs that may not
/// call the task helpers (from BTF; 0: unknown).
#[no_mangle]
static TASK_IDS: observer_common::TaskIds = observer_common::TaskIds {
    pid: 0,
    tgid: 0,
    comm: 0,
    _pad: 0,
};

#[inline(always)]
pub fn task_ids() -> observer_common::TaskIds {
    unsafe { core::ptr::read_volatile(&TASK_IDS) }
}

/// 1: the packet programs read DNS messages (the DNS wire feature is on).
#[no_mangle]
static DNS_WIRE: u32 = 0;

#[inline(always)]
pub fn dns_wire() -> bool {
    unsafe { core::ptr::read_volatile(&DNS_WIRE) != 0 }
}

/// 1: send a closed connection's record when the socket is destroyed.
#[no_mangle]
static EMIT_AT_DESTROY: u32 = 0;

/// Ring buffer fill level (bytes) above which a record wakes the reader.
#[no_mangle]
static WAKEUP_BYTES: u64 = 0;

#[inline(always)]
pub fn wakeup_bytes() -> u64 {
    unsafe { core::ptr::read_volatile(&WAKEUP_BYTES) }
}

// SAFETY (all the readers here): read_volatile keeps the compiler from folding
// load-time constants that the loader rewrites.
#[inline(always)]
pub fn own_tgid() -> u32 {
    unsafe { core::ptr::read_volatile(&OWN_TGID) }
}

#[inline(always)]
pub fn sk_err_offset() -> u32 {
    unsafe { core::ptr::read_volatile(&SK_ERR_OFFSET) }
}

#[inline(always)]
pub fn emit_at_destroy() -> bool {
    unsafe { core::ptr::read_volatile(&EMIT_AT_DESTROY) != 0 }
}

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer while this program runs on this CPU.
        unsafe { *slot += 1 };
    }
}

/// TLS session -> its timings until tied to a socket, then its socket.
#[map(name = "TLS_SESSIONS")]
pub static TLS_SESSIONS: LruHashMap<TlsSessionKey, TlsSession> =
    LruHashMap::with_max_entries(MAX_TLS_SESSIONS, 0);

/// Socket pointer -> TLS timings of the connection.
#[map(name = "TLS_CONNS")]
pub static TLS_CONNS: LruHashMap<u64, TlsConn> = LruHashMap::with_max_entries(MAX_TLS_CONNS, 0);

/// TLS connections closed lately, as they were at their close: what a
/// library call still in flight on one needs at its return to send its
/// plaintext. Its bytes can make the peer close, and that close come
/// first, while the calling thread is descheduled before its return (a Go
/// writer goroutine whose reader closed the connection, an OpenSSL thread
/// on a loaded host); userspace holds such a close back for them
/// (`conntrack::CLOSE_LINGER_NS`). Only connections with TLS are kept.
#[map(name = "CLOSED_CONNS")]
pub static CLOSED_CONNS: LruHashMap<u64, Conn> = LruHashMap::with_max_entries(MAX_CLOSED_TLS, 0);

/// The TLS timings of the connections in CLOSED_CONNS.
#[map(name = "CLOSED_TLS_CONNS")]
pub static CLOSED_TLS_CONNS: LruHashMap<u64, TlsConn> =
    LruHashMap::with_max_entries(MAX_CLOSED_TLS, 0);

/// TLS connections closed within a close's wait for its last bytes, at a
/// few thousand TLS connections a second.
const MAX_CLOSED_TLS: u32 = 4096;

/// Thread (or goroutine) -> its last TLS call.
#[map(name = "TLS_CALLS")]
pub static TLS_CALLS: LruHashMap<TlsCallKey, TlsCall> =
    LruHashMap::with_max_entries(MAX_TLS_THREADS, 0);

/// Thread (pid_tgid) -> where it is in rustls's calls (`rustls`).
#[map(name = "RUSTLS_THREADS")]
pub static RUSTLS_THREADS: LruHashMap<u64, RustlsThread> =
    LruHashMap::with_max_entries(MAX_TLS_THREADS, 0);

/// Go executable (index from the attach cookie) -> its struct offsets.
#[map(name = "GO_OFFSETS")]
pub static GO_OFFSETS: HashMap<u32, GoOffsets> = HashMap::with_max_entries(MAX_GO_BINARIES, 0);

/// Go executable's inode number -> its index in `GO_OFFSETS`, where uprobes
/// carry no cookie.
#[map(name = "GO_EXES")]
pub static GO_EXES: HashMap<u64, u32> = HashMap::with_max_entries(MAX_GO_BINARIES, 0);

/// Where the running kernel keeps a task's open files (from BTF).
#[no_mangle]
static FD_WALK: FdWalk = FdWalk {
    task_files: 0,
    files_fdt: 0,
    fdt_max_fds: 0,
    fdt_fd: 0,
    file_private_data: 0,
    socket_sk: 0,
};

#[inline(always)]
pub fn fd_walk() -> FdWalk {
    unsafe { core::ptr::read_volatile(&FD_WALK) }
}

/// Process (tgid) -> TLS use; a new entry announces the process to userspace.
#[map(name = "TLS_PROCS")]
pub static TLS_PROCS: LruHashMap<u32, TlsProc> = LruHashMap::with_max_entries(MAX_TLS_PROCS, 0);

/// Nonzero while a process beginning TLS must be read at once
/// (`observer_common::tls::TLS_WAKE_MAP`).
#[map(name = "TLS_WAKE")]
static TLS_WAKE: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn tls_wake_at_once() -> bool {
    TLS_WAKE.get(0).is_some_and(|w| *w != 0)
}

/// Scratch space for building a session (too big for the 512-byte stack
/// next to the rest of a probe's locals).
#[map(name = "TLS_SCRATCH")]
pub static TLS_SCRATCH: PerCpuArray<TlsSession> = PerCpuArray::with_max_entries(1, 0);

/// Plaintext calls per rate window that make a process busy (0: never).
#[no_mangle]
static TLS_BUSY_CALLS: u32 = 0;

#[inline(always)]
pub fn busy_calls() -> u32 {
    unsafe { core::ptr::read_volatile(&TLS_BUSY_CALLS) }
}
