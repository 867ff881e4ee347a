//! Plaintext that the HTTP parser reads: from TLS library calls, and from
//! the packets of plain TCP connections.

/// [`crate::TlsConn::http`] and [`crate::Conn::http`] values.
pub const UNKNOWN: u8 = 0;
pub const YES: u8 = 1;
pub const NO: u8 = 2;
/// [`crate::Conn::http`]: not HTTP in the clear but TLS records, whose
/// handshake no library probe saw yet: followed on the wire
/// ([`crate::tls::wire`]).
pub const TLS_WIRE: u8 = 3;

/// On a TLS connection first seen after its start, how many calls that do
/// not begin an HTTP/1.x message are looked at (one may be the rest of an
/// answer) before it is judged not HTTP.
pub const MIDSTREAM_LOOKS: u8 = 16;

/// A connection whose first payload was neither HTTP nor TLS: how many more
/// payloads (either way) are looked at for a ClientHello, for protocols
/// that turn to TLS after a plaintext start (STARTTLS in SMTP, IMAP and
/// FTP; PostgreSQL's SSLRequest; MySQL's SSL request).
pub const STARTTLS_LOOKS: u8 = 8;

/// [`crate::Conn::http_looks`] of an HTTP/1.x connection whose first request
/// was a proxy's `CONNECT`: its later payloads are looked at for the
/// ClientHello of the TLS tunnelled through it (and only its: another
/// connection's body bytes may look like a record header).
pub const TUNNEL: u8 = u8::MAX;

/// What the packet programs keep per plain HTTP/1.x connection
/// ([`crate::Conn::http_state`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpSock {
    /// Next sequence number expected each way (0: egress, 1: ingress; 0:
    /// none seen yet).
    pub next_seq: [u32; 2],
    /// Start of the current rate window, and the segments copied in it.
    pub window_start_ns: u64,
    pub window_segments: u32,
    pub _pad: u32,
}

/// Segments one plain connection may have copied per [`crate::tls::RATE_WINDOW_NS`]
/// (50 ms) window, both ways together: 2,000 a second, as many as the TLS
/// plaintext probes allow a process. A connection past it (a load test, a
/// busy keep-alive API) is no longer copied, and counted.
pub const BUSY_SEGMENTS: u32 = 100;

/// Bytes of a call's buffer (or a packet's payload) a [`PlaintextEvent`]
/// carries: all of it up to this size, else its first and last
/// [`DATA_HALF`] bytes.
pub const DATA_CAPTURE: usize = 1024;
pub const DATA_HALF: usize = DATA_CAPTURE / 2;

/// Record for [`crate::EventKind::Plaintext`]: a plaintext read or write
/// that moved data on an HTTP/1.x connection (a TLS library call, or a TCP
/// segment of a plain connection), with the connection as it stood.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaintextEvent {
    pub hdr: crate::EventHeader,
    pub conn: crate::Conn,
    /// The call's entry and return (a packet: when it passed, both).
    pub entry_ns: u64,
    pub ret_ns: u64,
    /// TLS: the session's handshake, first call's entry to the completing
    /// call's return (the phases a first request's trace shows); 0 on plain
    /// TCP or when not seen.
    pub hs_start_ns: u64,
    pub hs_end_ns: u64,
    /// Bytes the call or the segment moved.
    pub len: u32,
    /// [`crate::tls::op::READ`] (the connection's owner received) or
    /// [`crate::tls::op::WRITE`] (it sent).
    pub op: u8,
    /// [`DATA_FROM_START`], [`DATA_PLAIN`].
    pub flags: u8,
    /// TLS: the library ([`crate::tls::library`]); 0 on plain TCP.
    pub library: u8,
    pub _pad: u8,
    pub data: [u8; DATA_CAPTURE],
}

#[cfg(feature = "user")]
impl PlaintextEvent {
    /// The record the kernel would write for a call on `conn` that moved
    /// `bytes` (its first and last halves when longer than the capture),
    /// returning 10 ns after `entry_ns`: for tests and benchmarks.
    pub fn of_call(conn: crate::Conn, op: u8, entry_ns: u64, bytes: &[u8], flags: u8) -> Self {
        let mut data = [0u8; DATA_CAPTURE];
        let len = bytes.len();
        if len <= DATA_CAPTURE {
            data[..len].copy_from_slice(bytes);
        } else {
            data[..DATA_HALF].copy_from_slice(&bytes[..DATA_HALF]);
            data[DATA_HALF..].copy_from_slice(&bytes[len - DATA_HALF..]);
        }
        Self {
            hdr: crate::EventHeader {
                kind: crate::EventKind::Plaintext as u32,
                size: core::mem::size_of::<Self>() as u32,
                ts_ns: entry_ns,
            },
            conn,
            entry_ns,
            ret_ns: entry_ns + 10,
            hs_start_ns: 0,
            hs_end_ns: 0,
            len: len as u32,
            op,
            flags,
            library: 0,
            _pad: 0,
            data,
        }
    }
}

/// Nothing moved on the connection (after its TLS handshake) before this:
/// it carries the connection's first exchange, not one after data the
/// probes missed.
pub const DATA_FROM_START: u8 = 1;
/// From a plain TCP segment (not a TLS library call).
pub const DATA_PLAIN: u8 = 2;

const _: () = assert!(core::mem::size_of::<PlaintextEvent>() == 16 + 192 + 40 + DATA_CAPTURE);
