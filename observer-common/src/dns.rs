//! Shared types of the resolver probes (getaddrinfo in the C library).

/// LRU hash: pid_tgid -> [`DnsCall`], a lookup in flight.
pub const DNS_CALLS_MAP: &str = "DNS_CALLS";
pub const MAX_DNS_THREADS: u32 = 4096;
/// Bytes of a looked-up name kept.
pub const DNS_NAME_LEN: usize = 128;
/// Addresses of an answer kept.
pub const DNS_ADDRS: usize = 4;

/// A getaddrinfo call in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DnsCall {
    pub start_ns: u64,
    /// `struct addrinfo **res`, read at return.
    pub res_ptr: u64,
    /// hints->ai_family (0: unspecified).
    pub family: u32,
    pub _pad: u32,
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
    /// getaddrinfo's return value (0: success; EAI_* codes are negative).
    pub ret: i32,
    /// The family asked for (AF_INET, AF_INET6, 0: any).
    pub family: u32,
    pub n_addrs: u32,
    pub _pad: u32,
    /// Address families of `addrs` (AF_INET: first 4 bytes used).
    pub families: [u16; DNS_ADDRS],
    pub addrs: [[u8; 16]; DNS_ADDRS],
    pub comm: [u8; 16],
    pub name: [u8; DNS_NAME_LEN],
}

const _: () = assert!(core::mem::size_of::<DnsCall>() == 24 + DNS_NAME_LEN);
const _: () = assert!(core::mem::size_of::<DnsEvent>() == 16 + 40 + 8 + 64 + 16 + DNS_NAME_LEN);
