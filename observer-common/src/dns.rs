//! Shared types of the resolver probes (getaddrinfo and gethostbyname*_r in
//! the C library) and of
//! the DNS messages seen on the wire (port 53, cgroup_skb).

/// LRU hash: pid_tgid -> [`DnsCall`], a lookup in flight.
pub const DNS_CALLS_MAP: &str = "DNS_CALLS";
pub const MAX_DNS_THREADS: u32 = 4096;
/// Bytes of a looked-up name kept.
pub const DNS_NAME_LEN: usize = 128;
/// Addresses of an answer kept.
pub const DNS_ADDRS: usize = 4;

/// Which resolver function a [`DnsCall`] is in.
pub const FUNC_GETADDRINFO: u32 = 1;
/// gethostbyname_r (gethostbyname calls it too).
pub const FUNC_GETHOSTBYNAME_R: u32 = 2;
/// gethostbyname2_r (gethostbyname2 calls it too).
pub const FUNC_GETHOSTBYNAME2_R: u32 = 3;

/// A resolver call in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DnsCall {
    pub start_ns: u64,
    /// getaddrinfo: `struct addrinfo **res`; gethostbyname*_r:
    /// `struct hostent **result`. Read at return.
    pub res_ptr: u64,
    /// gethostbyname*_r: `int *h_errnop`, read at return on failure.
    pub errno_ptr: u64,
    /// The family asked for (0: unspecified).
    pub family: u32,
    /// FUNC_*: only the same function's return ends the call (a resolver
    /// function that calls another is one lookup).
    pub func: u32,
    pub name: [u8; DNS_NAME_LEN],
}

/// Record for [`crate::EventKind::Dns`]: one finished lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsEvent {
    pub hdr: crate::EventHeader,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// getaddrinfo's return value (0: success; EAI_* codes are negative);
    /// gethostbyname*_r's failures are translated to the same codes.
    pub ret: i32,
    /// The family asked for (AF_INET, AF_INET6, 0: any).
    pub family: u32,
    pub n_addrs: u32,
    /// The function called (FUNC_*).
    pub func: u32,
    /// Address families of `addrs` (AF_INET: first 4 bytes used).
    pub families: [u16; DNS_ADDRS],
    pub addrs: [[u8; 16]; DNS_ADDRS],
    pub comm: [u8; 16],
    pub name: [u8; DNS_NAME_LEN],
}

const _: () = assert!(core::mem::size_of::<DnsCall>() == 32 + DNS_NAME_LEN);
const _: () = assert!(core::mem::size_of::<DnsEvent>() == 16 + 40 + 8 + 64 + 16 + DNS_NAME_LEN);

/// LRU hash: socket cookie -> 1, sockets that sent a DNS query (their release
/// ends the queries still unanswered).
pub const DNS_SOCKS_MAP: &str = "DNS_SOCKS";
pub const MAX_DNS_SOCKS: u32 = 16384;
/// Bytes of a DNS message kept (a classic UDP message's maximum).
pub const DNS_PAYLOAD_LEN: usize = 512;
pub const DNS_PORT: u16 = 53;

/// Record for [`crate::EventKind::DnsPacket`]: a DNS message a socket on this
/// host sent to port 53 (a query) or received from port 53 (a response).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsPacketEvent {
    pub hdr: crate::EventHeader,
    /// The socket's cookie: pairs a response with its query.
    pub cookie: u64,
    /// Start of the sending thread's C library lookup in flight (0: none):
    /// the query was made on behalf of that lookup.
    pub libc_start_ns: u64,
    /// Sender (egress only: a response arrives in softirq context).
    pub pid: u32,
    pub tid: u32,
    pub comm: [u8; 16],
    /// 1: sent (query), 0: received (response).
    pub egress: u8,
    /// IPPROTO_UDP or IPPROTO_TCP.
    pub proto: u8,
    /// 4 or 6.
    pub ip_version: u8,
    pub _pad: u8,
    /// The far end's port (53) and the local one.
    pub remote_port: u16,
    pub local_port: u16,
    /// Bytes copied into `payload`: the UDP payload (one DNS message), or
    /// the TCP payload (DNS messages, each after its two-byte length).
    pub len: u32,
    /// Bytes of the UDP or TCP payload in the packet.
    pub wire_len: u32,
    /// The DNS server's address (IPv4: first 4 bytes) and ours.
    pub remote: [u8; 16],
    pub local: [u8; 16],
    pub payload: [u8; DNS_PAYLOAD_LEN],
}

/// Record for [`crate::EventKind::DnsSockReleased`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsSockEvent {
    pub hdr: crate::EventHeader,
    pub cookie: u64,
}

const _: () = assert!(
    core::mem::size_of::<DnsPacketEvent>() == 16 + 16 + 8 + 16 + 8 + 8 + 32 + DNS_PAYLOAD_LEN
);
const _: () = assert!(core::mem::size_of::<DnsSockEvent>() == 24);
