//! Types shared by the eBPF programs and the userspace loader.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of implicit padding, so the
//! bytes the kernel writes are the bytes userspace reads. Never re-declare one of
//! these by hand on either side.
#![no_std]

pub mod dns;
pub mod hold;
pub mod http;
pub mod tls;
pub mod tls_wire;
pub mod tracepoints;

pub use tls::TlsConn;

/// Ring buffer that carries [`OwnerEvent`], [`CloseEvent`] and [`ProcessEvent`].
pub const EVENTS_MAP: &str = "EVENTS";
/// LRU hash: socket pointer -> [`Conn`], the live state of each tracked connection.
pub const CONNS_MAP: &str = "CONNS";
/// Per-CPU array of `u64` counters, indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Global (load-time constant): the observer's own tgid, never observed.
pub const OWN_TGID_GLOBAL: &str = "OWN_TGID";
/// Global (u64): ring fill level in bytes above which a record wakes the reader;
/// below it the reader finds records on its poll timer.
pub const WAKEUP_BYTES_GLOBAL: &str = "WAKEUP_BYTES";
/// How often the reader drains the ring without being woken. Short enough that
/// a batch is small (under churn a 50 ms batch held ~4,000 events, whose
/// processing in one go doubled the p99 latency of the traced server).
pub const POLL_INTERVAL_MS: u64 = 10;
/// The longest the reader sleeps while the ring stays empty (it backs off
/// from POLL_INTERVAL_MS): a record on an idle host waits at most this.
pub const IDLE_POLL_MS: u64 = 100;
/// Global: byte offset of `sk_err` in `struct sock` (from BTF); 0 when unknown.
pub const SK_ERR_OFFSET_GLOBAL: &str = "SK_ERR_OFFSET";
/// Global: byte offset of `srtt_us` in `struct tcp_sock` (from BTF); 0 when unknown.
pub const SRTT_US_OFFSET_GLOBAL: &str = "SRTT_US_OFFSET";
/// Global: byte offset of `sk_lock.owned` in `struct sock` (from BTF); 0
/// when unknown.
pub const SK_LOCK_OWNED_OFFSET_GLOBAL: &str = "SK_LOCK_OWNED_OFFSET";
/// Global ([`TcpCounters`]): where `struct tcp_sock` keeps the kernel's
/// own byte and segment counters.
pub const TCP_COUNTERS_GLOBAL: &str = "TCP_COUNTERS";

/// Global ([`SockTuple`]): where a socket keeps its protocol, family,
/// ports and addresses, for the raw `sock:inet_sock_set_state` program.
pub const SOCK_TUPLE_GLOBAL: &str = "SOCK_TUPLE";

/// Byte offsets (from BTF) of the fields the classic
/// `sock:inet_sock_set_state` record copies from the socket: `sock_common`'s
/// family, destination port and addresses, `sock`'s protocol, and
/// `inet_sock`'s source port and address. `family == 0`: unknown (the raw
/// program is not attached; the classic one reads the record instead).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockTuple {
    pub family: u32,
    pub protocol: u32,
    /// `__be16`, as the peer's port is kept.
    pub dport: u32,
    /// `inet_sock.inet_sport`, `__be16`.
    pub sport: u32,
    /// `inet_sock.inet_saddr`.
    pub saddr: u32,
    pub daddr: u32,
    pub saddr_v6: u32,
    pub daddr_v6: u32,
}

/// Byte offsets in `struct tcp_sock` (from BTF) of the counters a record's
/// bytes and segments are copied from, and of `sock.sk_flags`; 0: unknown
/// (the field stays 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpCounters {
    /// Payload bytes transmitted, retransmissions included.
    pub bytes_sent: u32,
    /// Payload bytes retransmitted.
    pub bytes_retrans: u32,
    /// Sequence space received in order: the payload, and the peer's FIN.
    pub bytes_received: u32,
    pub data_segs_out: u32,
    pub data_segs_in: u32,
    /// `sock.sk_flags` (`__sk_common.skc_flags`), whose SOCK_DONE bit tells
    /// that the peer's FIN came.
    pub sk_flags: u32,
}

/// `enum sock_flags`: SOCK_DONE, set when the peer's FIN is received.
pub const SOCK_DONE: u32 = 1;

/// Global: which task helpers the cgroup_skb programs may call on this
/// kernel, as the loader probed it (`SKB_TASK_PID`, `SKB_TASK_COMM`).
/// `bpf_get_current_pid_tgid` came to them in Linux 6.10 and
/// `bpf_get_current_comm` later; an older verifier refuses the whole program
/// for a call it does not allow, even one a flag makes unreachable at run
/// time, unless the flag is a load-time constant (then the branch is dead
/// code it never walks).
pub const SKB_TASK_GLOBAL: &str = "SKB_TASK";
pub const SKB_TASK_PID: u32 = 1;
pub const SKB_TASK_COMM: u32 = 2;

/// Global: where a task's ids and name are in `struct task_struct` (from
/// BTF; all 0: unknown). Where the packet programs may not call the task
/// helpers, they read the current task's own fields instead
/// (`bpf_get_current_task` and `bpf_probe_read_kernel` are theirs on every
/// kernel since 5.8, with CAP_PERFMON).
pub const TASK_IDS_GLOBAL: &str = "TASK_IDS";

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskIds {
    /// `task_struct.pid`: the thread id.
    pub pid: u32,
    /// `task_struct.tgid`: the process id.
    pub tgid: u32,
    /// `task_struct.comm`: the thread's name (16 bytes).
    pub comm: u32,
    pub _pad: u32,
}

/// Global: 1 when the packet programs read DNS messages (`--dns-wire on`).
pub const DNS_WIRE_GLOBAL: &str = "DNS_WIRE";
/// Global: 1 when `tcp:tcp_destroy_sock` is attached, so a closed connection's
/// record goes out when the socket is destroyed (after any RST sent on close
/// and the errno set); 0 to send it at CLOSE.
pub const EMIT_AT_DESTROY_GLOBAL: &str = "EMIT_AT_DESTROY";

/// Default number of connections tracked at once (CONNS max_entries). At 168 bytes
/// a value plus the key and LRU bookkeeping this is about 16 MiB of kernel memory.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 65_536;
/// Default ring buffer size in bytes (a power of two, multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 4 * 1024 * 1024;

/// Kinds of ring-buffer records. Explicit ids: they are a wire format.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A connection got its owning process (outbound: at connect; inbound: at first I/O).
    Owner = 1,
    /// A connection reached CLOSE; carries its whole final state.
    Close = 2,
    /// A process called exec (its executable changed).
    Exec = 3,
    /// A process (thread group) exited.
    Exit = 4,
    /// A process began using TLS ([`tls::TlsProcessEvent`]).
    TlsProcess = 5,
    /// The server name of a TLS connection ([`tls::TlsNameEvent`]).
    TlsName = 6,
    /// A process's plaintext TLS call rate passed the limit ([`tls::TlsBusyEvent`]).
    TlsBusy = 7,
    /// A name lookup through the C library finished ([`dns::DnsEvent`]).
    Dns = 8,
    /// A DNS message on port 53 left or reached a socket ([`dns::DnsPacketEvent`]).
    DnsPacket = 9,
    /// A socket that sent DNS queries was released ([`dns::DnsSockEvent`]).
    DnsSockReleased = 10,
    /// Plaintext of an HTTP/1.x connection ([`http::PlaintextEvent`]).
    Plaintext = 11,
    /// A TCP socket began or stopped listening ([`ListenEvent`]).
    Listen = 12,
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Owner),
            2 => Some(Self::Close),
            3 => Some(Self::Exec),
            4 => Some(Self::Exit),
            5 => Some(Self::TlsProcess),
            6 => Some(Self::TlsName),
            7 => Some(Self::TlsBusy),
            8 => Some(Self::Dns),
            9 => Some(Self::DnsPacket),
            10 => Some(Self::DnsSockReleased),
            11 => Some(Self::Plaintext),
            12 => Some(Self::Listen),
            _ => None,
        }
    }
}

/// The envelope every ring-buffer record starts with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// An [`EventKind`] id.
    pub kind: u32,
    /// Size in bytes of the whole record, header included (a cheap sanity check).
    pub size: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the record was made.
    pub ts_ns: u64,
}

/// Connection direction as seen from this host.
pub const DIR_OUTBOUND: u8 = 1;
pub const DIR_INBOUND: u8 = 2;

/// `Conn::flags`: the owning process is known (pid/tid/comm are valid).
pub const FLAG_OWNED: u8 = 1;
/// `Conn::flags`: an RST was received on this socket.
pub const FLAG_RESET_RX: u8 = 2;
/// `Conn::flags`: the connection reached ESTABLISHED.
pub const FLAG_ESTABLISHED: u8 = 4;
/// `Conn::flags`: a TLS session is tied to this socket (see [`tls`]).
pub const FLAG_TLS: u8 = 8;
/// `Conn::flags`: the TLS connection's socket-level times are all taken, so
/// its sends and receives need no more TLS work.
pub const FLAG_TLS_TIMED: u8 = 16;
/// `Conn::flags`: the connection began before the observer started (or was
/// evicted from CONNS): tracked from its first packet seen, its start and
/// connect unknown.
pub const FLAG_MIDSTREAM: u8 = 32;
/// `Conn::flags`: a [`FLAG_MIDSTREAM`] connection whose first payload seen
/// was a TLS record: its owner gets the per-call TLS probes at once (it made
/// its TLS context before the observer started).
pub const FLAG_TLS_RECORDS: u8 = 64;
/// Its TLS is rustls's: the connection's later rustls objects (a server's
/// acceptor hands the connection to a new one) share its TLS entry.
pub const FLAG_RUSTLS: u8 = 128;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;
pub const IPPROTO_TCP: u16 = 6;
pub const IPPROTO_UDP: u16 = 17;

/// TCP states as the kernel numbers them (include/net/tcp_states.h).
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_SENT: i32 = 2;
    pub const SYN_RECV: i32 = 3;
    pub const FIN_WAIT1: i32 = 4;
    pub const FIN_WAIT2: i32 = 5;
    pub const TIME_WAIT: i32 = 6;
    pub const CLOSE: i32 = 7;
    pub const CLOSE_WAIT: i32 = 8;
    pub const LAST_ACK: i32 = 9;
    pub const LISTEN: i32 = 10;
    pub const CLOSING: i32 = 11;
}

/// Live state of one TCP connection, keyed by socket pointer in [`CONNS_MAP`].
/// Timestamps are CLOCK_MONOTONIC nanoseconds; 0 means "did not happen".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conn {
    /// Kernel socket pointer: identity of the connection while it lives.
    pub sk: u64,
    /// Outbound: connect() (CLOSE -> SYN_SENT). Inbound: reaching ESTABLISHED.
    pub start_ns: u64,
    pub established_ns: u64,
    pub first_tx_ns: u64,
    pub first_rx_ns: u64,
    /// Reaching CLOSE (0 while the connection is open).
    pub end_ns: u64,
    /// Payload bytes and segments with data each way: the kernel's own
    /// counters (`tcp_sock.bytes_sent` less `bytes_retrans`,
    /// `bytes_received` less the peer's FIN, `data_segs_out`,
    /// `data_segs_in`), copied when the record is made.
    pub bytes_tx: u64,
    pub bytes_rx: u64,
    pub segs_out: u32,
    pub segs_in: u32,
    pub retransmits: u32,
    /// Smoothed RTT in microseconds, read from the socket at close (and at the
    /// first byte each way, for snapshots); 0: unknown.
    pub srtt_us: u32,
    pub resets_rx: u16,
    pub resets_tx: u16,
    /// Positive errno the socket held when it closed (`sk_err`; 0: none).
    pub error: u32,
    pub pid: u32,
    pub tid: u32,
    /// The kernel's name of the owning thread.
    pub comm: [u8; 16],
    /// IPv4 addresses use the first 4 bytes.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub direction: u8,
    pub flags: u8,
    /// The state the socket left for CLOSE.
    pub close_from_state: u32,
    /// Whether a plain connection's payload is HTTP/1.x ([`http`]).
    pub http: u8,
    /// A [`FLAG_MIDSTREAM`] connection: payloads looked at that did not
    /// start an HTTP message or frame (see [`http::MIDSTREAM_LOOKS`]).
    pub http_looks: u8,
    /// The packet programs no longer read this connection's payload; its
    /// packets still reach them until its owner and first bytes are known
    /// (then the socket is marked and they leave at once).
    pub quiet: u8,
    pub _pad: u8,
    /// The peer's FIN arrived (ESTABLISHED -> CLOSE_WAIT): a request sent
    /// after it went to a connection the peer had already closed.
    pub peer_fin_ns: u64,
    /// What the packet programs keep while they copy a plain HTTP/1.x
    /// connection's payload. Here, in the entry every packet looks up
    /// anyway, rather than in a map of its own: an insert per connection into
    /// a full LRU map (each one evicting) was most of the packet programs'
    /// cost under connection churn.
    pub http_state: http::HttpSock,
}

/// Record for [`EventKind::Owner`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnerEvent {
    pub hdr: EventHeader,
    pub sk: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: [u8; 16],
    pub direction: u8,
    pub _pad: u8,
    /// AF_INET or AF_INET6 (0: unknown).
    pub family: u16,
    /// The far end's port (host order, as `Conn::dport`; 0: unknown).
    pub dport: u16,
    pub _pad2: u16,
    /// The far end (IPv4: first 4 bytes): for an outbound connection, known
    /// at connect, which lets the lookup that led to it be marked at once.
    pub daddr: [u8; 16],
}

/// Record for [`EventKind::Close`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CloseEvent {
    pub hdr: EventHeader,
    pub conn: Conn,
    /// The connection's TLS timings (`library == 0`: no TLS seen).
    pub tls: TlsConn,
}

/// Bytes of the exec'd path kept (longer paths are cut).
pub const EXEC_PATH_LEN: usize = 256;

/// Record for [`EventKind::Exec`]: the path the process exec'd, as given to
/// exec (NUL-terminated), so userspace knows the executable even when the
/// process is gone before it could look at /proc.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    pub hdr: EventHeader,
    pub pid: u32,
    pub _pad: u32,
    /// The process's cgroup v2 id (the cgroup directory's inode): its
    /// container and pod, even once it is gone from /proc.
    pub cgroup_id: u64,
    pub filename: [u8; EXEC_PATH_LEN],
}

/// Record for [`EventKind::Exit`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEvent {
    pub hdr: EventHeader,
    pub pid: u32,
    pub _pad: u32,
}

/// Record for [`EventKind::Listen`]: told in the order of the connections'
/// events, so a process that listened, served and exited before userspace
/// read its events is still known to have listened (/proc no longer can).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ListenEvent {
    pub hdr: EventHeader,
    pub sk: u64,
    /// The process that called listen() (0 when it stopped listening: the
    /// last holder may be any).
    pub pid: u32,
    /// The local port, host order (0: not bound yet, listen() binds it).
    pub port: u16,
    /// 1: began listening; 0: the listening socket closed.
    pub listening: u8,
    pub _pad: u8,
}

/// Indexes into [`COUNTERS_MAP`]. Explicit ids: userspace reads them by number.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// A ring-buffer reservation failed: the event was lost.
    RingFull = 0,
    /// Inserting a new connection into CONNS failed.
    ConnInsertFailed = 1,
    /// Outbound connections started (CLOSE -> SYN_SENT).
    OutboundOpened = 2,
    /// Inbound connections established.
    InboundOpened = 3,
    /// Connections closed while tracked.
    Closed = 4,
    /// CLOSE seen for a socket not in CONNS (opened before start, or evicted).
    CloseUntracked = 5,
    /// A new connection found an earlier one under the same socket pointer
    /// (a reconnect after failure, or a missed destroy); the earlier one was
    /// sent as closed.
    Replaced = 6,
    /// A TLS session or TLS connection could not be stored (map full).
    TlsInsertFailed = 7,
    /// TLS sessions tied to their socket.
    TlsBound = 8,
    /// A socket that sent DNS queries could not be remembered (map full): its
    /// unanswered queries time out by age instead of at its release.
    DnsSockInsertFailed = 9,
    /// Plain HTTP connections whose payload stopped being copied: they moved
    /// more segments per window than [`http::BUSY_SEGMENTS`].
    HttpBusy = 10,
    /// Plain HTTP connections whose sequence state could not be stored: none
    /// since that state lives in the connection's own entry (kept, always 0,
    /// for the exported counter of that name).
    HttpInsertFailed = 11,
    /// Connections found established with no record of their start (begun
    /// before the observer started, or evicted), tracked from then on.
    Adopted = 12,
    /// TLS connections whose handshake was followed on the wire (no library
    /// probe had seen it at its ClientHello).
    TlsWire = 13,
    /// Processes stopped at exec until their new executable was looked at
    /// (see [`hold`]).
    ExecHeld = 14,
    /// A process that should have been held ran on (its report could not be
    /// queued, or the signal was refused): its first connection may be
    /// missed.
    ExecHoldFailed = 15,
    /// rustls connections tied to their socket (the socket read inside the
    /// library's own record read, `observer-ebpf/src/rustls.rs`).
    RustlsTied = 16,
    /// rustls plaintext reads whose connection could not be found (the
    /// process's reader offset not learned yet, no tie on the thread just
    /// before): their bytes are lost.
    RustlsReadUnjoined = 17,
    /// OpenSSL sessions tied to their socket through the descriptor the
    /// program gave the library (`SSL_set_fd`), before any of its I/O.
    TlsFdTied = 18,
    /// OpenSSL and GnuTLS sessions that never gave the library a
    /// descriptor (curl's own BIO, Node.js's memory BIOs, GnuTLS's
    /// transport) tied to the socket whose packet the thread sent during
    /// (or just after) one of the session's calls.
    TlsPacketTied = 19,
    /// Connection state changes the kernel skipped for the lifecycle
    /// program (a softirq's change while it ran on the CPU) and its
    /// nested stand-in handled (observer-ebpf's inet_sock_set_state).
    LifecycleNested = 20,
}

pub const COUNTER_SLOTS: u32 = 21;

impl Counter {
    pub const ALL: [Counter; 21] = [
        Counter::RingFull,
        Counter::ConnInsertFailed,
        Counter::OutboundOpened,
        Counter::InboundOpened,
        Counter::Closed,
        Counter::CloseUntracked,
        Counter::Replaced,
        Counter::TlsInsertFailed,
        Counter::TlsBound,
        Counter::DnsSockInsertFailed,
        Counter::HttpBusy,
        Counter::HttpInsertFailed,
        Counter::Adopted,
        Counter::TlsWire,
        Counter::ExecHeld,
        Counter::ExecHoldFailed,
        Counter::RustlsTied,
        Counter::RustlsReadUnjoined,
        Counter::TlsFdTied,
        Counter::TlsPacketTied,
        Counter::LifecycleNested,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Counter::RingFull => "kernel_ring_full",
            Counter::ConnInsertFailed => "kernel_conn_insert_failed",
            Counter::OutboundOpened => "outbound_opened",
            Counter::InboundOpened => "inbound_opened",
            Counter::Closed => "closed",
            Counter::CloseUntracked => "close_untracked",
            Counter::Replaced => "replaced",
            Counter::TlsInsertFailed => "kernel_tls_insert_failed",
            Counter::TlsBound => "tls_bound",
            Counter::DnsSockInsertFailed => "kernel_dns_sock_insert_failed",
            Counter::HttpBusy => "http_busy_connections",
            Counter::HttpInsertFailed => "kernel_http_insert_failed",
            Counter::Adopted => "adopted_midstream",
            Counter::TlsWire => "tls_wire",
            Counter::ExecHeld => "exec_held",
            Counter::ExecHoldFailed => "exec_hold_failed",
            Counter::RustlsTied => "tls_rustls_tied",
            Counter::RustlsReadUnjoined => "tls_rustls_reads_unjoined",
            Counter::TlsFdTied => "tls_tied_by_fd",
            Counter::TlsPacketTied => "tls_tied_by_packet",
            Counter::LifecycleNested => "lifecycle_nested_caught",
        }
    }

    /// Whether the counter means data was lost.
    pub const fn is_loss(self) -> bool {
        matches!(
            self,
            Counter::RingFull
                | Counter::ConnInsertFailed
                | Counter::TlsInsertFailed
                | Counter::HttpInsertFailed
                | Counter::ExecHoldFailed
                | Counter::RustlsReadUnjoined
        )
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are repr(C), Copy, contain only integers and byte
    // arrays, and have no implicit padding (checked by the size tests below).
    unsafe impl aya::Pod for super::Conn {}
    unsafe impl aya::Pod for super::TlsConn {}
    unsafe impl aya::Pod for super::tls::TlsProc {}
    unsafe impl aya::Pod for super::tls::go::GoOffsets {}
    unsafe impl aya::Pod for super::tls::go::FdWalk {}
    unsafe impl aya::Pod for super::hold::ExeWalk {}
    unsafe impl aya::Pod for super::TcpCounters {}
    unsafe impl aya::Pod for super::SockTuple {}
    unsafe impl aya::Pod for super::TaskIds {}
    unsafe impl aya::Pod for super::hold::ExeKey {}
}

// Layout checks: a change here is a wire-format change on both sides.
const _: () = assert!(core::mem::size_of::<TaskIds>() == 16);
const _: () = assert!(core::mem::size_of::<EventHeader>() == 16);
const _: () = assert!(core::mem::size_of::<Conn>() == 192);
const _: () = assert!(core::mem::size_of::<OwnerEvent>() == 16 + 56);
const _: () = assert!(core::mem::size_of::<CloseEvent>() == 16 + 192 + 128);
const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 24);
const _: () = assert!(core::mem::size_of::<ListenEvent>() == 32);
const _: () = assert!(core::mem::size_of::<ExecEvent>() == 32 + EXEC_PATH_LEN);
