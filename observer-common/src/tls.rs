//! Shared types of the TLS library probes (OpenSSL, BoringSSL, GnuTLS).
//!
//! A TLS session is keyed by the process and the library's session pointer
//! (`SSL *`, `gnutls_session_t`). It is tied to a socket the first time its
//! thread does socket I/O inside (or right after) a TLS call; from then on its
//! timings live in [`TLS_CONNS_MAP`] under the socket pointer, beside the
//! socket's [`crate::Conn`], and leave with the connection's close record.

/// LRU hash: [`TlsSessionKey`] -> [`TlsSession`].
pub const TLS_SESSIONS_MAP: &str = "TLS_SESSIONS";
/// LRU hash: socket pointer -> [`TlsConn`].
pub const TLS_CONNS_MAP: &str = "TLS_CONNS";
/// LRU hash: pid_tgid of a thread -> [`TlsCall`], the thread's last TLS call.
pub const TLS_CALLS_MAP: &str = "TLS_CALLS";
/// LRU hash: tgid -> [`TlsProc`], processes that use TLS.
pub const TLS_PROCS_MAP: &str = "TLS_PROCS";
/// Array (one u32) userspace sets while some TLS library file's plaintext
/// probes are per process: a process beginning TLS then wakes the reader at
/// once, as it gets probes of its own only when its announcement is read.
/// Otherwise the announcement waits for the reader's next drain like every
/// record: a forced wake-up cost the announcing call (`SSL_CTX_new`, a
/// client's first session, inside its handshake) about 20 µs in this VM.
pub const TLS_WAKE_MAP: &str = "TLS_WAKE";

/// Sessions tracked at once (about 270 bytes each).
pub const MAX_TLS_SESSIONS: u32 = 16_384;
/// TLS connections tracked at once (about 120 bytes each).
pub const MAX_TLS_CONNS: u32 = 16_384;
/// Threads remembered between a TLS call and the socket I/O it leads to.
pub const MAX_TLS_THREADS: u32 = 16_384;
/// Processes remembered as TLS users.
pub const MAX_TLS_PROCS: u32 = 8_192;

/// A packet sent by a thread this long after its last TLS call returned
/// still belongs to that call's session (programs with memory BIOs, such as
/// Node.js, write the bytes a TLS call produced after the call returns).
pub const BIND_WINDOW_NS: u64 = 20_000_000;

/// Bytes of a server name kept (longer names are cut).
pub const SERVER_NAME_LEN: usize = 128;

/// TLS libraries, passed to each probe as its attach cookie.
pub mod library {
    pub const OPENSSL: u8 = 1;
    pub const BORINGSSL: u8 = 2;
    pub const GNUTLS: u8 = 3;
    /// No library probe saw the session: its handshake was read from the
    /// TLS record headers on the wire (Java, Go, rustls, anything unknown).
    pub const WIRE: u8 = 4;
    /// Go's crypto/tls, compiled into the executable (probes on its
    /// functions; the attach cookie's upper bits name the binary, see
    /// [`super::go`]).
    pub const GO: u8 = 5;
    /// rustls, compiled into a Rust executable (probes on its functions,
    /// found by symbol; see observer-ebpf's `rustls`).
    pub const RUSTLS: u8 = 6;

    pub const fn name(id: u8) -> &'static str {
        match id {
            OPENSSL => "openssl",
            BORINGSSL => "boringssl",
            GNUTLS => "gnutls",
            WIRE => "wire",
            GO => "go",
            RUSTLS => "rustls",
            _ => "unknown",
        }
    }
}

/// [`TlsConn::wire_stage`]: how far the packet programs followed a TLS
/// handshake on the wire (library [`library::WIRE`]).
pub mod wire {
    /// The ClientHello passed.
    pub const HELLO: u8 = 1;
    /// The server's first flight passed.
    pub const SERVER_FLIGHT: u8 = 2;
    /// The client's second flight began with a handshake record other than
    /// a ClientHello (a TLS 1.2 full handshake); the server's last flight
    /// ends it.
    pub const TLS12_CLIENT_FLIGHT: u8 = 3;
    /// A TLS 1.2 handshake ended: the first application record toward the
    /// server is the request.
    pub const TLS12_OPEN: u8 = 4;
    /// The request passed: the first application record back is the answer.
    pub const TLS12_REQUEST: u8 = 5;
    /// Nothing more to read on the wire.
    pub const DONE: u8 = 6;
}

/// [`TlsConn::flags`]: the handshake completed.
pub const TLS_HS_DONE: u8 = 1;
/// A plaintext read or write was seen on the session (the plaintext probes
/// were attached to its process).
pub const TLS_PLAINTEXT: u8 = 2;
/// The last plaintext call that moved data was a write.
pub const TLS_LAST_WRITE: u8 = 4;
/// The last plaintext call that moved data was a read.
pub const TLS_LAST_READ: u8 = 8;
/// The session was first seen after its start (it existed before the
/// observer, or its first calls were missed): no handshake timing.
pub const TLS_MIDSTREAM: u8 = 16;
/// A handshake call or the start of one was seen.
pub const TLS_HS_STARTED: u8 = 32;
/// The wire showed a full TLS 1.2 handshake (where TLS 1.3's post-handshake
/// session tickets cannot be mistaken for the answer).
pub const TLS_WIRE_12: u8 = 64;
/// Kernel side only: the copy of a connection's timings kept at its close
/// for a call that returns after it (observer-ebpf's CLOSED_TLS_CONNS).
pub const TLS_CLOSED: u8 = 128;

/// TLS timings of one connection. CLOCK_MONOTONIC ns; 0: did not happen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsConn {
    /// Entry of the first handshake call (or first TLS call) on the session.
    pub hs_start_ns: u64,
    /// Return of the call that completed the handshake.
    pub hs_end_ns: u64,
    /// Entry of the first plaintext write that moved data.
    pub pt_first_write_ns: u64,
    /// Return of the first plaintext read that returned data.
    pub pt_first_read_ns: u64,
    /// Return of the first plaintext read with data after a write (client TTFB end).
    pub pt_read_after_write_ns: u64,
    /// Entry of the first plaintext write after a read (server answer start).
    pub pt_write_after_read_ns: u64,
    /// Socket level, after the handshake: first send; first receive after it.
    pub sk_send_after_hs_ns: u64,
    pub sk_recv_after_send_ns: u64,
    /// Socket level, after the handshake: first receive; first send after it.
    pub sk_recv_after_hs_ns: u64,
    pub sk_send_after_recv_ns: u64,
    pub pt_sent: u64,
    pub pt_received: u64,
    /// When the session these timings belong to was first seen: tells its
    /// socket's entry from another connection's once the socket's address
    /// is reused while a freed session still names it.
    pub session_ns: u64,
    /// Last return value of a handshake call that did not complete it.
    pub hs_ret: i32,
    /// Reads with data that followed a write (client exchanges).
    pub exchanges_client: u32,
    /// Writes that followed a read with data (server exchanges).
    pub exchanges_server: u32,
    /// A [`library`] id; 0: no TLS seen on this connection.
    pub library: u8,
    pub flags: u8,
    /// Whether the plaintext is HTTP/1.x ([`crate::http`]), decided at the
    /// first call that moves data: a connection that is not costs nothing more.
    pub http: u8,
    /// Calls looked at while `http` is undecided on a connection first seen
    /// after its start (a call there may begin mid-message).
    pub http_looks: u8,
    /// Library [`library::WIRE`]: a [`wire`] stage, and whether the
    /// ClientHello left this socket (1: this end is the client).
    pub wire_stage: u8,
    pub wire_hello_out: u8,
    /// The negotiated protocol version as on the wire (0x0303: TLS 1.2,
    /// 0x0304: TLS 1.3); 0: not read (only the Go probes read it).
    pub version: u16,
    pub _pad: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsSessionKey {
    pub tgid: u32,
    pub _pad: u32,
    /// The library's session pointer in that process.
    pub ssl: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsSession {
    /// The socket the session was tied to (0: not yet).
    pub sk: u64,
    /// Timings gathered before the session was tied to a socket.
    pub tls: TlsConn,
    /// Server name set by the client (NUL-terminated unless full).
    pub name: [u8; SERVER_NAME_LEN],
    pub name_len: u32,
    pub _pad: u32,
}

/// Operation of a TLS call in flight.
pub mod op {
    pub const HANDSHAKE: u8 = 1;
    pub const READ: u8 = 2;
    pub const WRITE: u8 = 3;
}

/// Whose call a [`TlsCall`] is: a C library's calls are a thread's
/// (`id` = pid_tgid, `g` = 0); Go's are a goroutine's, which may return on
/// another thread than it entered on (`id` = tgid, `g` = the goroutine).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsCallKey {
    pub id: u64,
    pub g: u64,
}

/// The last TLS call a thread (or goroutine) made (or is making).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsCall {
    pub ssl: u64,
    pub entry_ns: u64,
    /// Return time of the call (0 while it runs).
    pub ret_ns: u64,
    /// `size_t *` where SSL_read_ex / SSL_write_ex store the byte count (0: the
    /// call returns the count).
    pub count_ptr: u64,
    pub op: u8,
    pub library: u8,
    /// The session is already tied to a socket (no binding needed).
    pub bound: u8,
    pub _pad: [u8; 5],
    /// The call's plaintext buffer (0 for a handshake call).
    pub buf: u64,
}

/// A process seen using TLS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsProc {
    /// Plaintext calls captured for it.
    pub plaintext_calls: u64,
    /// Start of the current rate window, and the calls in it.
    pub window_start_ns: u64,
    pub window_calls: u32,
    /// Nonzero: userspace turned its plaintext capture off (its call rate):
    /// the all-process probes return at once for it.
    pub off: u32,
    /// rustls: where a connection's received plaintext buffer lies in its
    /// `CommonState` (bytes; 0: not learned yet). Learned from a read that
    /// follows the same connection's record processing on one thread.
    pub rustls_reader_off: u32,
    /// rustls: where the socket's descriptor lies in the I/O object the
    /// library reads and writes through ([`rustls_fd`]; 0: not learned).
    pub rustls_fd_path: u32,
    /// rustls: the `CommonState` the process processed records of or wrote
    /// to last (a reader on another thread than its connection's last
    /// records may still lie in it).
    pub rustls_last_common: u64,
}

/// Where rustls's I/O object keeps its socket's descriptor, as a
/// [`TlsProc::rustls_fd_path`]: the object itself (`&mut TcpStream` for
/// blocking callers), or behind a pointer in it (tokio-rustls's adapters
/// hold `&mut` the stream, whose descriptor lies inside its `PollEvented`).
pub mod rustls_fd {
    /// Set on a learned path.
    pub const KNOWN: u32 = 1 << 31;
    /// The descriptor lies behind the pointer at byte `(path >> 8) & 0xff`.
    pub const BEHIND_POINTER: u32 = 1 << 16;
    /// Offsets searched in the object itself (4 bytes apart).
    pub const DIRECT_SLOTS: u32 = 8;
    /// Pointers searched (8 bytes apart), and offsets behind each.
    pub const POINTERS: u32 = 2;
    pub const BEHIND_SLOTS: u32 = 16;

    /// The descriptor's offset in the object it lies in.
    pub const fn fd_offset(path: u32) -> u32 {
        path & 0xff
    }

    /// The pointer's offset, when behind one.
    pub const fn pointer_offset(path: u32) -> Option<u32> {
        if path & BEHIND_POINTER != 0 {
            Some((path >> 8) & 0xff)
        } else {
            None
        }
    }
}

/// LRU hash: pid_tgid of a thread -> [`RustlsThread`].
pub const RUSTLS_THREADS_MAP: &str = "RUSTLS_THREADS";

/// A rustls `Reader`'s buffer lies this close after the start of its
/// connection's `CommonState` (840 bytes in rustls 0.23): an address found
/// this close after a `CommonState` of the thread's belongs to it, since
/// two `CommonState`s never overlap.
pub const RUSTLS_READER_SPAN: u64 = 512;

/// What a thread is doing in rustls: the calls a plaintext read or write is
/// spread over (see observer-ebpf's `rustls`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RustlsThread {
    /// The plaintext of the write in progress: a buffer, or an array of
    /// `iovec`s (`iovecs` of them).
    pub write_buf: u64,
    pub write_len: u64,
    pub write_iovecs: u64,
    /// Entry of the library's record read (its socket read is inside), and
    /// the descriptor its I/O object reads from (+1; 0: none found).
    pub reading_ns: u64,
    pub read_fd: u64,
    /// The `CommonState` whose records the thread processed last.
    pub common: u64,
    /// The plaintext chunk a `Reader` handed out last (its caller consumes
    /// part or all of it next).
    pub chunk_ptr: u64,
    pub chunk_len: u64,
    /// Bytes a write took before its connection was tied (a connection
    /// object moved after its handshake): sent up at the tie, made by the
    /// socket send that follows in the same call of its owner.
    pub pending_n: u64,
    /// The socket the thread last tied a connection to, and when: a read
    /// right after on an object not tied yet is that connection's, moved
    /// (the handshake's object moves into its owner, with the first request
    /// already decrypted in it).
    pub tied_sk: u64,
    pub tied_ns: u64,
}

/// Go's crypto/tls: where the probes find what they read, per executable.
pub mod go {
    /// Hash: executable index (the attach cookie >> 16) -> [`GoOffsets`].
    pub const GO_OFFSETS_MAP: &str = "GO_OFFSETS";
    /// Map inode number (u64) -> u32: a Go executable's index in
    /// [`GO_OFFSETS_MAP`], for kernels whose uprobes carry no attach cookie
    /// (before 5.15), where the programs find it by the task's executable.
    /// By the inode number alone: the device a file is named by differs
    /// between stat, /proc/PID/maps and the executable's own inode where it
    /// lies on overlayfs over two filesystems or on a btrfs subvolume, its
    /// inode number does not.
    pub const GO_EXES_MAP: &str = "GO_EXES";
    /// Go executables probed at once.
    pub const MAX_GO_BINARIES: u32 = 256;

    /// Byte offsets of the struct fields the Go probes read (from the
    /// executable's DWARF, or a table keyed by its Go version).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct GoOffsets {
        /// crypto/tls.Conn.conn: a net.Conn interface (type word, data word).
        pub conn_conn: u32,
        pub conn_is_client: u32,
        pub conn_vers: u32,
        pub conn_config: u32,
        pub conn_server_name: u32,
        pub config_server_name: u32,
        /// net.conn.fd (a *net.TCPConn starts with its net.conn).
        pub net_conn_fd: u32,
        pub netfd_pfd: u32,
        pub pfd_sysfd: u32,
        pub _pad: u32,
    }

    /// Global ([`FdWalk`]): where the kernel keeps a task's open files, to
    /// go from a Go connection's file descriptor to its socket.
    pub const FD_WALK_GLOBAL: &str = "FD_WALK";

    /// Byte offsets in the running kernel's structs (from BTF); all 0:
    /// unknown, Go connections are not tied to their sockets.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct FdWalk {
        pub task_files: u32,
        pub files_fdt: u32,
        pub fdt_max_fds: u32,
        pub fdt_fd: u32,
        pub file_private_data: u32,
        pub socket_sk: u32,
    }
}

/// Length of the in-kernel rate window for plaintext calls.
pub const RATE_WINDOW_NS: u64 = 50_000_000;
/// Global (u32): plaintext calls in one [`RATE_WINDOW_NS`] window above
/// which the process is reported busy ([`TlsBusyEvent`]) so that userspace
/// takes its per-call probes off at once (0: never).
pub const BUSY_CALLS_GLOBAL: &str = "TLS_BUSY_CALLS";

/// Record for [`crate::EventKind::TlsBusy`]: a process with per-call probes
/// passed the call-rate limit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TlsBusyEvent {
    pub hdr: crate::EventHeader,
    pub pid: u32,
    pub calls: u32,
}

/// Record for [`crate::EventKind::TlsProcess`]: a process began using TLS
/// (its first session), so userspace may attach per-process probes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TlsProcessEvent {
    pub hdr: crate::EventHeader,
    pub pid: u32,
    pub library: u32,
}

/// Record for [`crate::EventKind::TlsName`]: the server name of the TLS
/// session on socket `sk`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TlsNameEvent {
    pub hdr: crate::EventHeader,
    pub sk: u64,
    pub len: u32,
    pub _pad: u32,
    pub name: [u8; SERVER_NAME_LEN],
}

const _: () = assert!(core::mem::size_of::<TlsConn>() == 128);
const _: () = assert!(core::mem::size_of::<TlsSession>() == 8 + 128 + SERVER_NAME_LEN + 8);
const _: () = assert!(core::mem::size_of::<TlsCall>() == 48);
const _: () = assert!(core::mem::size_of::<TlsCallKey>() == 16);
const _: () = assert!(core::mem::size_of::<go::GoOffsets>() == 40);
const _: () = assert!(core::mem::size_of::<go::FdWalk>() == 24);
const _: () = assert!(core::mem::size_of::<TlsProcessEvent>() == 24);
const _: () = assert!(core::mem::size_of::<TlsBusyEvent>() == 24);
const _: () = assert!(core::mem::size_of::<TlsProc>() == 40);
const _: () = assert!(core::mem::size_of::<TlsNameEvent>() == 32 + SERVER_NAME_LEN);
const _: () = assert!(core::mem::size_of::<RustlsThread>() == 88);
