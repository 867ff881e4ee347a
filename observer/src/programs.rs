//! Every eBPF program of the object, in one table: what it hooks, the
//! feature it serves, and whether the observer can run without it. The
//! loader, the TLS and DNS probe owners, `doctor`, the `ready` line, the
//! summary and the detach test all read this table; a unit test checks that
//! it lists exactly the programs the built object holds.

use observer_common::tracepoints::{self, Layout};
use serde::Serialize;

/// What the observer gives, each on or off on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// Connection records: lifecycle, bytes, time to first byte, errors.
    Connections,
    /// TLS handshakes and server names, for every process (library uprobes).
    TlsHandshakes,
    /// TLS time to first byte from the library's plaintext calls (per-process
    /// uprobes; without them TLS times come from the socket).
    TlsPlaintext,
    /// Name lookups through the C library (resolver uprobes).
    DnsLibrary,
    /// Name lookups on the wire (port 53, cgroup programs).
    DnsWire,
    /// HTTP/1.x requests on plain TCP connections (cgroup programs reading
    /// the payload of tracked connections).
    HttpPlain,
    /// GPU state through NVML (no eBPF program).
    Gpu,
}

impl Feature {
    pub const ALL: [Feature; 7] = [
        Feature::Connections,
        Feature::TlsHandshakes,
        Feature::TlsPlaintext,
        Feature::DnsLibrary,
        Feature::DnsWire,
        Feature::HttpPlain,
        Feature::Gpu,
    ];

    /// As the `ready` line and `doctor` name it.
    pub const fn label(self) -> &'static str {
        match self {
            Feature::Connections => "connections",
            Feature::TlsHandshakes => "TLS handshakes",
            Feature::TlsPlaintext => "TLS plaintext timing",
            Feature::DnsLibrary => "DNS library",
            Feature::DnsWire => "DNS wire",
            Feature::HttpPlain => "plain HTTP requests",
            Feature::Gpu => "GPU",
        }
    }
}

/// A kind of library whose functions a uprobe program goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Library {
    /// OpenSSL and BoringSSL (libssl, or a binary that carries it).
    OpenSsl,
    GnuTls,
    /// Go's crypto/tls, in a Go executable.
    Go,
    /// rustls, in a Rust executable.
    Rustls,
    /// A C library's resolver (glibc, musl).
    Libc,
}

impl Library {
    /// As `doctor` and the feature states name it.
    pub const fn label(self) -> &'static str {
        match self {
            Library::OpenSsl => "OpenSSL/BoringSSL",
            Library::GnuTls => "GnuTLS",
            Library::Go => "Go crypto/tls",
            Library::Rustls => "rustls",
            Library::Libc => "C library resolver",
        }
    }
}

/// Which way a cgroup_skb program sees packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Egress,
    Ingress,
}

/// How a program attaches.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Hook {
    /// A classic tracepoint: the program reads the trace record's fields.
    TracePoint {
        #[serde(serialize_with = "layout_name")]
        layout: Layout,
    },
    /// A raw tracepoint: the program gets the tracepoint's arguments, and the
    /// kernel skips building the record (cheaper on hot paths).
    RawTracePoint {
        #[serde(serialize_with = "layout_name")]
        layout: Layout,
    },
    /// A uprobe (or, with `ret`, a uretprobe) on each of these functions.
    UProbe {
        ret: bool,
        functions: &'static [(Library, &'static str)],
    },
    /// On the root cgroup v2, seeing every socket's packets one way.
    CgroupSkb { direction: Direction },
    /// On the root cgroup v2, at every socket's release.
    CgroupSockRelease,
    /// Never attached: the observer runs it now and then
    /// (`BPF_PROG_TEST_RUN`, a raw tracepoint program given arguments).
    Run,
}

impl Hook {
    /// Whether the program goes on a hook at all.
    pub fn attaches(&self) -> bool {
        !matches!(self, Hook::Run)
    }
}

fn layout_name<S: serde::Serializer>(l: &Layout, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}:{}", l.category, l.name))
}

impl Hook {
    /// Where it goes, for `doctor`: e.g. "sock:inet_sock_set_state",
    /// "SSL_read, gnutls_record_recv (return)".
    pub fn target(&self) -> String {
        match self {
            Hook::TracePoint { layout } => format!("{}:{}", layout.category, layout.name),
            Hook::RawTracePoint { layout } => {
                format!("{}:{} (raw)", layout.category, layout.name)
            }
            Hook::UProbe { ret, functions } => {
                let names: Vec<&str> = functions.iter().map(|(_, f)| *f).collect();
                let ret = if *ret { " (return)" } else { "" };
                format!("{}{ret}", names.join(", "))
            }
            Hook::CgroupSkb { direction } => format!("cgroup_skb {direction:?}").to_lowercase(),
            Hook::CgroupSockRelease => "cgroup sock_release".into(),
            Hook::Run => "run by the observer".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Program {
    /// The function's name in the eBPF object.
    pub name: &'static str,
    pub hook: Hook,
    pub feature: Feature,
    /// A second feature it serves (the packet programs: DNS wire too).
    pub also: Option<Feature>,
    /// Without it the observer does not start (doctor's verdict: not ok).
    pub required: bool,
    /// What it gives, i.e. what is lost without it.
    pub gives: &'static str,
}

const fn tp(name: &'static str, layout: Layout, required: bool, gives: &'static str) -> Program {
    Program {
        name,
        hook: Hook::TracePoint { layout },
        feature: Feature::Connections,
        also: None,
        required,
        gives,
    }
}

/// A raw tracepoint of the connection feature.
const fn raw(name: &'static str, layout: Layout, gives: &'static str) -> Program {
    Program {
        name,
        hook: Hook::RawTracePoint { layout },
        feature: Feature::Connections,
        also: None,
        required: false,
        gives,
    }
}

const fn up(
    name: &'static str,
    ret: bool,
    feature: Feature,
    functions: &'static [(Library, &'static str)],
    gives: &'static str,
) -> Program {
    Program {
        name,
        hook: Hook::UProbe { ret, functions },
        feature,
        also: None,
        required: false,
        gives,
    }
}

use crate::libraries::rustls as rl;
use Feature::{DnsLibrary, DnsWire, HttpPlain, TlsHandshakes, TlsPlaintext};
use Library::{GnuTls, Go, Libc, OpenSsl, Rustls};

/// The program that goes on each RET instruction of the Go functions (Go's
/// moving stacks rule out return probes).
pub const GO_RETURN: &str = "go_tls_return";
const GO_HANDSHAKES: &[(Library, &str)] = &[
    (Go, "crypto/tls.(*Conn).clientHandshake"),
    (Go, "crypto/tls.(*Conn).serverHandshake"),
];

/// The connection lifecycle program (raw: it reads the socket at offsets
/// from BTF).
pub const CONNECTIONS: &str = "inet_sock_set_state";
/// The same handling on the classic tracepoint's record, attached instead
/// of [`CONNECTIONS`] when the kernel's BTF does not give the socket layout.
pub const CONNECTIONS_RECORD: &str = "inet_sock_set_state_record";

/// A second program on the lifecycle tracepoint that handles the changes
/// the kernel skipped [`CONNECTIONS`] for (a softirq's change nested in its
/// run on that CPU); the kernel's skips of this one lose nothing.
pub const CONNECTIONS_NESTED: &str = "inet_sock_set_state_nested";

/// Whether the kernel's skips of the program (`recursion_misses`) are
/// events lost.
pub fn skips_lose_events(name: &str) -> bool {
    name != CONNECTIONS_NESTED
}

/// A program and the one that stands in for it when it cannot attach.
pub fn stand_in(name: &str) -> Option<&'static str> {
    (name == CONNECTIONS).then_some(CONNECTIONS_RECORD)
}

/// Whether the program only stands in for another (attached in its place).
pub fn is_stand_in(name: &str) -> bool {
    name == CONNECTIONS_RECORD
}

/// Each TLS handshake-path hit costs a trap (~5 us here) in every process, so
/// only what must be seen from a session's start is on TLS libraries for all
/// processes. Not SSL_free nor SSL_set_accept_state: on a busy server they
/// were two more traps per connection, and a session reusing a freed one's
/// pointer is recognised at its first handshake call instead (see
/// observer-ebpf's tls_state). The plaintext read/write programs go on one
/// process at a time (see tls::manager).
pub const PROGRAMS: &[Program] = &[
    Program {
        name: CONNECTIONS,
        hook: Hook::RawTracePoint {
            layout: tracepoints::inet_sock_set_state::LAYOUT,
        },
        feature: Feature::Connections,
        also: None,
        required: true,
        gives: "connection lifecycle: every record, connect time, failures",
    },
    Program {
        name: CONNECTIONS_NESTED,
        hook: Hook::RawTracePoint {
            layout: tracepoints::inet_sock_set_state::LAYOUT,
        },
        feature: Feature::Connections,
        also: None,
        required: false,
        gives: "the connection changes a softirq made while the lifecycle program ran on \
                its CPU (the kernel skips a program nested in itself)",
    },
    tp(
        CONNECTIONS_RECORD,
        tracepoints::inet_sock_set_state::LAYOUT,
        false,
        "connection lifecycle where the socket layout is unknown (no BTF): the classic \
         record, skipped while another tracing program runs on the same CPU",
    ),
    Program {
        name: "conn_counters",
        hook: Hook::Run,
        feature: Feature::Connections,
        also: None,
        required: false,
        gives: "bytes and segments of open connections' snapshots (closed ones' are read \
                at close)",
    },
    raw(
        "tcp_retransmit_skb",
        tracepoints::tcp_retransmit_skb::LAYOUT,
        "retransmit counts",
    ),
    raw(
        "tcp_receive_reset",
        tracepoints::tcp_receive_reset::LAYOUT,
        "\"refused\" and \"reset\" errors, resets received",
    ),
    raw(
        "tcp_send_reset",
        tracepoints::tcp_send_reset::LAYOUT,
        "resets sent",
    ),
    Program {
        name: "tcp_destroy_sock",
        hook: Hook::RawTracePoint {
            layout: tracepoints::tcp_destroy_sock::LAYOUT,
        },
        feature: Feature::Connections,
        also: None,
        required: false,
        gives: "resets sent by an aborting close() (else records go out at CLOSE)",
    },
    tp(
        "sched_process_exec",
        tracepoints::sched_process_exec::LAYOUT,
        false,
        "executables of short-lived processes, fresh names after exec, TLS probes at exec",
    ),
    // With sched_process_exec, whose exec holds it extends (a feature is
    // off when one of its programs is: TLS handshakes stay on without it).
    tp(
        "sys_enter_mmap",
        tracepoints::sys_enter_mmap::LAYOUT,
        false,
        "TLS probes on a library a running program opens (dlopen) before its first call",
    ),
    tp(
        "sched_process_exit",
        tracepoints::sched_process_exit::LAYOUT,
        false,
        "process cache cleanup on exit (else bounded by size)",
    ),
    // TLS, for every process that maps a TLS library.
    up(
        "tls_handshake",
        false,
        TlsHandshakes,
        &[(OpenSsl, "SSL_do_handshake"), (GnuTls, "gnutls_handshake")],
        "handshake start",
    ),
    up(
        "tls_handshake_ret",
        true,
        TlsHandshakes,
        &[(OpenSsl, "SSL_do_handshake"), (GnuTls, "gnutls_handshake")],
        "handshake end and result",
    ),
    up(
        "tls_context_new",
        false,
        TlsHandshakes,
        &[
            (OpenSsl, "SSL_CTX_new"),
            (GnuTls, "gnutls_certificate_allocate_credentials"),
        ],
        "processes that get ready for TLS, before their first session",
    ),
    up(
        "ssl_session_begin",
        false,
        TlsHandshakes,
        &[(OpenSsl, "SSL_set_connect_state")],
        "clients that handshake inside SSL_read/SSL_write",
    ),
    up(
        "ssl_set_fd",
        false,
        TlsHandshakes,
        &[(OpenSsl, "SSL_set_fd")],
        "sessions tied to their socket by its descriptor (Python, nginx)",
    ),
    up(
        "ssl_set_host_name",
        false,
        TlsHandshakes,
        &[(OpenSsl, "SSL_set_tlsext_host_name")],
        "server names (BoringSSL)",
    ),
    up(
        "gnutls_server_name_set",
        false,
        TlsHandshakes,
        &[(GnuTls, "gnutls_server_name_set")],
        "server names (GnuTLS)",
    ),
    up(
        "tls_free",
        false,
        TlsHandshakes,
        &[(GnuTls, "gnutls_deinit")],
        "session ends (GnuTLS)",
    ),
    // TLS plaintext calls, per process.
    up(
        "tls_read",
        false,
        TlsPlaintext,
        &[(OpenSsl, "SSL_read"), (GnuTls, "gnutls_record_recv")],
        "plaintext reads",
    ),
    up(
        "ssl_read_ex",
        false,
        TlsPlaintext,
        &[(OpenSsl, "SSL_read_ex")],
        "plaintext reads (OpenSSL 3)",
    ),
    up(
        "tls_write",
        false,
        TlsPlaintext,
        &[(OpenSsl, "SSL_write"), (GnuTls, "gnutls_record_send")],
        "plaintext writes",
    ),
    up(
        "ssl_write_ex",
        false,
        TlsPlaintext,
        &[(OpenSsl, "SSL_write_ex")],
        "plaintext writes (OpenSSL 3)",
    ),
    up(
        "tls_rw_ret",
        true,
        TlsPlaintext,
        &[
            (OpenSsl, "SSL_read"),
            (OpenSsl, "SSL_read_ex"),
            (OpenSsl, "SSL_write"),
            (OpenSsl, "SSL_write_ex"),
            (GnuTls, "gnutls_record_recv"),
            (GnuTls, "gnutls_record_send"),
        ],
        "plaintext call results: bytes and first byte of the answer",
    ),
    // Go's crypto/tls, in each Go executable, for all its processes.
    up(
        "go_tls_handshake",
        false,
        TlsHandshakes,
        GO_HANDSHAKES,
        "Go TLS handshakes: start, socket (through its file descriptor)",
    ),
    up(
        GO_RETURN,
        false,
        TlsHandshakes,
        &[
            (Go, "crypto/tls.(*Conn).clientHandshake"),
            (Go, "crypto/tls.(*Conn).serverHandshake"),
            (Go, "crypto/tls.(*Conn).Read"),
            (Go, "crypto/tls.(*Conn).Write"),
        ],
        "Go TLS call ends (on each RET): handshake end, version, server name, bytes",
    ),
    up(
        "go_tls_read",
        false,
        TlsPlaintext,
        &[(Go, "crypto/tls.(*Conn).Read")],
        "Go plaintext reads",
    ),
    up(
        "go_tls_write",
        false,
        TlsPlaintext,
        &[(Go, "crypto/tls.(*Conn).Write")],
        "Go plaintext writes",
    ),
    // rustls, in each Rust executable that carries it, for all its processes.
    up(
        "rustls_record_read",
        false,
        TlsHandshakes,
        &[(Rustls, rl::RECORD_READ)],
        "rustls: the socket (by its descriptor) a connection's records are read from",
    ),
    up(
        "rustls_records_done",
        false,
        TlsHandshakes,
        &[(Rustls, rl::RECORDS_DONE)],
        "rustls: a connection tied to its socket (its handshake is read on the wire)",
    ),
    up(
        "rustls_write",
        false,
        TlsPlaintext,
        &[(Rustls, rl::WRITE)],
        "rustls plaintext writes",
    ),
    up(
        "rustls_write_vectored",
        false,
        TlsPlaintext,
        &[(Rustls, rl::WRITE_VECTORED)],
        "rustls plaintext writes (vectored)",
    ),
    up(
        "rustls_write_common",
        false,
        TlsPlaintext,
        &[(Rustls, rl::WRITE_COMMON)],
        "rustls: a write's connection",
    ),
    up(
        "rustls_rw_ret",
        true,
        TlsPlaintext,
        &[
            (Rustls, rl::WRITE),
            (Rustls, rl::WRITE_VECTORED),
            (Rustls, rl::READ),
        ],
        "rustls plaintext call results",
    ),
    up(
        "rustls_write_to",
        false,
        TlsPlaintext,
        &[(Rustls, rl::WRITE_TO)],
        "rustls: a moved connection object's first write tied by its descriptor",
    ),
    up(
        "rustls_chunk_ret",
        true,
        TlsPlaintext,
        &[(Rustls, rl::CHUNK)],
        "rustls plaintext handed to tokio-rustls",
    ),
    up(
        "rustls_consume",
        false,
        TlsPlaintext,
        &[(Rustls, rl::CONSUME)],
        "rustls plaintext reads (tokio-rustls)",
    ),
    up(
        "rustls_read",
        false,
        TlsPlaintext,
        &[(Rustls, rl::READ)],
        "rustls plaintext reads (blocking callers)",
    ),
    // Resolver calls, for every process that maps a C library we know.
    up(
        "getaddrinfo",
        false,
        DnsLibrary,
        &[(Libc, "getaddrinfo")],
        "lookups through getaddrinfo",
    ),
    up(
        "getaddrinfo_ret",
        true,
        DnsLibrary,
        &[(Libc, "getaddrinfo")],
        "getaddrinfo results",
    ),
    up(
        "gethostbyname_r",
        false,
        DnsLibrary,
        &[(Libc, "gethostbyname_r")],
        "lookups through gethostbyname(_r)",
    ),
    up(
        "gethostbyname_r_ret",
        true,
        DnsLibrary,
        &[(Libc, "gethostbyname_r")],
        "gethostbyname_r results",
    ),
    up(
        "gethostbyname2_r",
        false,
        DnsLibrary,
        &[(Libc, "gethostbyname2_r")],
        "lookups through gethostbyname2(_r)",
    ),
    up(
        "gethostbyname2_r_ret",
        true,
        DnsLibrary,
        &[(Libc, "gethostbyname2_r")],
        "gethostbyname2_r results",
    ),
    // DNS messages on the wire and the payloads of plain TCP connections,
    // for every socket of the host: one program per direction for both,
    // since each program on the hook costs a dispatch per packet.
    Program {
        name: "dns_sock_release",
        hook: Hook::CgroupSockRelease,
        feature: DnsWire,
        also: None,
        required: false,
        gives: "unanswered queries end when their socket goes",
    },
    Program {
        name: "packets_egress",
        hook: Hook::CgroupSkb {
            direction: Direction::Egress,
        },
        feature: HttpPlain,
        also: Some(DnsWire),
        required: false,
        gives: "first bytes sent, inbound process attribution, TLS sessions without a \
                descriptor; requests (and a server's answers) sent on plain TCP \
                connections; DNS queries sent to port 53, with the sending process",
    },
    Program {
        name: "packets_ingress",
        hook: Hook::CgroupSkb {
            direction: Direction::Ingress,
        },
        feature: HttpPlain,
        also: Some(DnsWire),
        required: false,
        gives: "first bytes received; answers (and a server's requests) received on \
                plain TCP connections; DNS answers from port 53",
    },
];

impl Program {
    /// Whether `feature` is lost without it.
    pub fn serves(&self, feature: Feature) -> bool {
        self.feature == feature || self.also == Some(feature)
    }

    /// Whether it is a uprobe on a function of `lib`.
    pub fn probes_library(&self, lib: Library) -> bool {
        matches!(self.hook, Hook::UProbe { functions, .. } if functions.iter().any(|&(l, _)| l == lib))
    }

    /// A TLS library's uprobe: its refusal costs only the libraries it
    /// probes (the TLS manager asks per library, [`crate::ebpf::Probes::refusal`]),
    /// not the whole feature.
    pub fn per_tls_library(&self) -> bool {
        TLS_LIBRARIES.iter().any(|&l| self.probes_library(l))
    }
}

/// The libraries whose TLS the uprobes see.
pub const TLS_LIBRARIES: [Library; 4] = [
    Library::OpenSsl,
    Library::GnuTls,
    Library::Go,
    Library::Rustls,
];

/// A program that reads its attach cookie, and the one that stands in for
/// it with one cookie value where the kernel gives uprobes no cookie
/// (before 5.15): the same body with the value built in. Stand-ins load and
/// count as the program they stand in for (its ledger row, its feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The table's program.
    pub of: &'static str,
    /// The cookie's low 16 bits it stands in for: the library id, and for
    /// Go the RET-of-a-handshake flag (Go's stand-ins find the executable's
    /// index, the bits above, by the task's executable).
    pub cookie: u64,
    /// The object's program.
    pub name: &'static str,
}

const fn variant(of: &'static str, cookie: u64, name: &'static str) -> Variant {
    Variant { of, cookie, name }
}

/// Bits 8-15 of a Go RET probe's cookie in a handshake function.
pub const GO_RET_OF_HANDSHAKE: u64 = 1 << 8;

/// The library ids, as the cookie's low bits hold them.
const OPEN: u64 = observer_common::tls::library::OPENSSL as u64;
const BORING: u64 = observer_common::tls::library::BORINGSSL as u64;
const GNU: u64 = observer_common::tls::library::GNUTLS as u64;
const GO_ID: u64 = observer_common::tls::library::GO as u64;

/// Every program that reads its attach cookie, with its stand-ins (see
/// [`Variant`]). The return programs read the library from the call their
/// entry recorded, so none of them is here.
pub const VARIANTS: &[Variant] = &[
    variant("tls_context_new", OPEN, "tls_context_new_openssl"),
    variant("tls_context_new", BORING, "tls_context_new_boringssl"),
    variant("tls_context_new", GNU, "tls_context_new_gnutls"),
    variant("tls_handshake", OPEN, "tls_handshake_openssl"),
    variant("tls_handshake", BORING, "tls_handshake_boringssl"),
    variant("tls_handshake", GNU, "tls_handshake_gnutls"),
    variant("tls_read", OPEN, "tls_read_openssl"),
    variant("tls_read", BORING, "tls_read_boringssl"),
    variant("tls_read", GNU, "tls_read_gnutls"),
    variant("tls_write", OPEN, "tls_write_openssl"),
    variant("tls_write", BORING, "tls_write_boringssl"),
    variant("tls_write", GNU, "tls_write_gnutls"),
    variant("ssl_read_ex", OPEN, "ssl_read_ex_openssl"),
    variant("ssl_read_ex", BORING, "ssl_read_ex_boringssl"),
    variant("ssl_write_ex", OPEN, "ssl_write_ex_openssl"),
    variant("ssl_write_ex", BORING, "ssl_write_ex_boringssl"),
    variant("ssl_session_begin", OPEN, "ssl_session_begin_openssl"),
    variant("ssl_session_begin", BORING, "ssl_session_begin_boringssl"),
    variant("ssl_set_fd", OPEN, "ssl_set_fd_openssl"),
    variant("ssl_set_fd", BORING, "ssl_set_fd_boringssl"),
    variant("ssl_set_host_name", OPEN, "ssl_set_host_name_openssl"),
    variant("ssl_set_host_name", BORING, "ssl_set_host_name_boringssl"),
    variant("go_tls_handshake", GO_ID, "go_tls_handshake_by_exe"),
    variant("go_tls_read", GO_ID, "go_tls_read_by_exe"),
    variant("go_tls_write", GO_ID, "go_tls_write_by_exe"),
    variant(GO_RETURN, GO_ID, "go_tls_return_by_exe"),
    variant(
        GO_RETURN,
        GO_ID | GO_RET_OF_HANDSHAKE,
        "go_tls_handshake_return_by_exe",
    ),
];

/// The stand-ins of table program `of`.
pub fn variants_of(of: &str) -> impl Iterator<Item = &'static Variant> + '_ {
    VARIANTS.iter().filter(move |v| v.of == of)
}

/// The object's program that goes on for `program` with `cookie` where the
/// kernel gives no cookies: the program itself if it reads none, else its
/// stand-in for the cookie's low 16 bits; None if it has none for them.
pub fn without_cookie(program: &'static str, cookie: u64) -> Option<&'static str> {
    let mut variants = variants_of(program).peekable();
    if variants.peek().is_none() {
        return Some(program);
    }
    variants
        .find(|v| v.cookie == cookie & 0xffff)
        .map(|v| v.name)
}

/// The table's rows of one feature.
pub fn of(feature: Feature) -> impl Iterator<Item = &'static Program> {
    PROGRAMS.iter().filter(move |p| p.serves(feature))
}

/// The row of a program by name.
pub fn get(name: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| p.name == name)
}

/// One uprobe to place: a program on a function of a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UprobeSite {
    pub program: &'static str,
    pub symbol: &'static str,
    pub ret: bool,
}

/// The uprobes of `feature` that go on a library of kind `lib`, in table
/// order.
pub fn uprobe_sites(feature: Feature, lib: Library) -> Vec<UprobeSite> {
    let mut sites = Vec::new();
    for p in of(feature) {
        if let Hook::UProbe { ret, functions } = p.hook {
            for &(l, symbol) in functions {
                if l == lib {
                    sites.push(UprobeSite {
                        program: p.name,
                        symbol,
                        ret,
                    });
                }
            }
        }
    }
    sites
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_of_the_object_is_in_the_table_once() {
        let obj = aya_obj::Object::parse(crate::ebpf::OBJECT).expect("the built object parses");
        let mut in_object: Vec<&str> = obj.programs.keys().map(String::as_str).collect();
        in_object.sort_unstable();
        let mut in_table: Vec<&str> = PROGRAMS
            .iter()
            .map(|p| p.name)
            .chain(VARIANTS.iter().map(|v| v.name))
            .collect();
        in_table.sort_unstable();
        let n = in_table.len();
        in_table.dedup();
        assert_eq!(in_table.len(), n, "a program is listed twice");
        assert_eq!(in_object, in_table);
        assert!(in_table.len() >= 30, "{}", in_table.len());
    }

    #[test]
    fn the_hook_kind_matches_the_objects_section() {
        let obj = aya_obj::Object::parse(crate::ebpf::OBJECT).expect("the built object parses");
        for p in PROGRAMS {
            let section = &obj.programs[p.name].section;
            use aya_obj::{
                programs::{CgroupSkbAttachType, CgroupSockAttachType},
                ProgramSection as S,
            };
            let ok = match (p.hook, section) {
                (Hook::TracePoint { .. }, S::TracePoint) => true,
                (Hook::RawTracePoint { .. }, S::RawTracePoint) => true,
                (Hook::UProbe { ret, .. }, S::UProbe { .. }) => !ret,
                (Hook::UProbe { ret, .. }, S::URetProbe { .. }) => ret,
                (Hook::CgroupSkb { direction }, S::CgroupSkb { attach_type }) => matches!(
                    (direction, attach_type),
                    (Direction::Egress, Some(CgroupSkbAttachType::Egress))
                        | (Direction::Ingress, Some(CgroupSkbAttachType::Ingress))
                ),
                (Hook::Run, S::RawTracePoint) => true,
                (Hook::CgroupSockRelease, S::CgroupSock { attach_type }) => {
                    matches!(attach_type, CgroupSockAttachType::SockRelease)
                }
                _ => false,
            };
            assert!(
                ok,
                "{}: table says {:?}, object {:?}",
                p.name, p.hook, section
            );
        }
    }

    /// No program copies or zeroes a record through `memmove`, `memset` or
    /// `memcpy`: for BPF those are aya-ebpf's byte-at-a-time loops. A
    /// 192-byte connection record copied that way took ~600 instructions;
    /// under connection churn those loops were 1.5 of the programs' 3.7 µs
    /// per request (perf, 2026-12-05). observer-ebpf's `copy_words`,
    /// `zero_words` and `zeroed_in` move eight bytes at a time instead.
    #[test]
    fn no_program_calls_a_byte_loop() {
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        let file = object::File::parse(crate::ebpf::OBJECT).expect("the built object parses");
        // Every call site in the object: programs and the functions they
        // call that were not inlined.
        let mut calls = Vec::new();
        for section in file.sections() {
            for (at, r) in section.relocations() {
                let RelocationTarget::Symbol(i) = r.target() else {
                    continue;
                };
                let Some(name) = file.symbol_by_index(i).ok().and_then(|t| t.name().ok()) else {
                    continue;
                };
                if matches!(name, "memmove" | "memset" | "memcpy") {
                    let caller = file
                        .symbols()
                        .find(|f| {
                            f.section_index() == Some(section.index())
                                && (f.address()..f.address() + f.size()).contains(&at)
                        })
                        .and_then(|f| f.name().ok().map(str::to_owned));
                    calls.push(format!("{caller:?} calls {name}"));
                }
            }
        }
        assert!(calls.is_empty(), "{calls:#?}");
        assert!(PROGRAMS
            .iter()
            .all(|p| file.symbol_by_name(p.name).is_some()));
    }

    /// A stand-in is an entry uprobe like the program it stands in for,
    /// and every cookie value the TLS manager gives a program that reads
    /// one has a stand-in.
    #[test]
    fn every_cookie_value_has_a_stand_in() {
        let obj = aya_obj::Object::parse(crate::ebpf::OBJECT).expect("the built object parses");
        for v in VARIANTS {
            let p = get(v.of).expect("a stand-in's program is in the table");
            assert!(matches!(p.hook, Hook::UProbe { ret: false, .. }), "{v:?}");
            assert!(
                matches!(
                    obj.programs[v.name].section,
                    aya_obj::ProgramSection::UProbe { .. }
                ),
                "{v:?}"
            );
        }
        for (lib, ids) in [(OpenSsl, &[OPEN, BORING][..]), (GnuTls, &[GNU][..])] {
            for site in [TlsHandshakes, TlsPlaintext]
                .into_iter()
                .flat_map(|f| uprobe_sites(f, lib))
            {
                for &id in ids {
                    assert!(
                        without_cookie(site.program, id).is_some(),
                        "{} for library {id}",
                        site.program
                    );
                }
            }
        }
        for site in [TlsHandshakes, TlsPlaintext]
            .into_iter()
            .flat_map(|f| uprobe_sites(f, Go))
        {
            // The executable's index rides above the low 16 bits.
            let cookie = GO_ID | (7 << 16);
            assert_ne!(without_cookie(site.program, cookie), Some(site.program));
            assert!(without_cookie(site.program, cookie).is_some());
        }
        assert_eq!(
            without_cookie(GO_RETURN, GO_ID | GO_RET_OF_HANDSHAKE | (3 << 16)),
            Some("go_tls_handshake_return_by_exe")
        );
        assert_eq!(without_cookie("tls_free", 3), Some("tls_free"));
        assert_eq!(without_cookie("tls_handshake", 99), None);
    }

    #[test]
    fn only_connection_tracepoints_are_required() {
        for p in PROGRAMS.iter().filter(|p| p.required) {
            assert_eq!(p.feature, Feature::Connections, "{}", p.name);
        }
        assert!(get("inet_sock_set_state").is_some_and(|p| p.required));
    }

    #[test]
    fn the_elf_reader_looks_for_exactly_the_tls_symbols_the_table_probes() {
        use crate::libraries::elf::{GNUTLS_SYMBOLS, OPENSSL_SYMBOLS};
        for (lib, looked_for) in [(OpenSsl, OPENSSL_SYMBOLS), (GnuTls, GNUTLS_SYMBOLS)] {
            let mut probed: Vec<&str> = [TlsHandshakes, TlsPlaintext]
                .into_iter()
                .flat_map(|f| uprobe_sites(f, lib))
                .map(|s| s.symbol)
                .collect();
            probed.sort_unstable();
            probed.dedup();
            let mut wanted = looked_for.to_vec();
            wanted.sort_unstable();
            assert_eq!(wanted, probed, "{lib:?}");
        }
    }

    #[test]
    fn only_the_nested_lifecycle_programs_skips_lose_nothing() {
        let harmless: Vec<&str> = PROGRAMS
            .iter()
            .map(|p| p.name)
            .filter(|n| !skips_lose_events(n))
            .collect();
        assert_eq!(harmless, [CONNECTIONS_NESTED]);
        // It goes on the tracepoint of the program it stands behind.
        let layout = |name| match get(name).map(|p| p.hook) {
            Some(Hook::RawTracePoint { layout }) => Some((layout.category, layout.name)),
            _ => None,
        };
        assert!(layout(CONNECTIONS).is_some());
        assert_eq!(layout(CONNECTIONS_NESTED), layout(CONNECTIONS));
    }

    #[test]
    fn uprobe_sites_per_library() {
        let openssl = uprobe_sites(TlsHandshakes, OpenSsl);
        assert!(openssl.contains(&UprobeSite {
            program: "tls_handshake_ret",
            symbol: "SSL_do_handshake",
            ret: true
        }));
        assert!(openssl.iter().all(|s| !s.symbol.starts_with("gnutls")));
        // Plaintext hooks are read/write calls only: nothing the handshake
        // path needs is left to a per-process probe.
        for lib in [OpenSsl, GnuTls] {
            for s in uprobe_sites(TlsPlaintext, lib) {
                assert!(
                    ["read", "write", "recv", "send"]
                        .iter()
                        .any(|w| s.symbol.contains(w)),
                    "{s:?}"
                );
            }
        }
        let libc = uprobe_sites(DnsLibrary, Libc);
        assert_eq!(libc.len(), 6);
    }
}
