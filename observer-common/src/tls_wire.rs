//! TLS handshakes read from the record headers on the wire, for the TLS
//! stacks no library probe sees (Java's JSSE, Go's crypto/tls, rustls, a
//! stripped static binary): the packet programs (`http_packets`) hand over
//! each payload of a connection whose first one was a ClientHello, until the
//! handshake's end and, on TLS 1.2, the first answer.
//!
//! The parsing lives here, shared: the eBPF side (`observer-ebpf`'s
//! `tls_wire`) reads a socket buffer through [`Segment`] and applies what
//! [`advance`] says to its map entry; the fuzz target and the unit tests
//! read byte slices through the same code. Everything is
//! `#[inline(always)]` so that the eBPF side gets one copy, specialised to
//! its buffer, as it had before the code moved here.
//!
//! Only the first bytes of a segment are read (a record's content type,
//! and for a handshake record its message type), so a segment that starts
//! mid-record is read by its direction alone. The flights:
//! - TLS 1.3 (and a resumed 1.2): ClientHello; the server's flight; the
//!   client's Finished (an encrypted record, after a ChangeCipherSpec in the
//!   same segment or not; a segment of that ChangeCipherSpec alone is not
//!   the end: Java sends it before reading the server's flight): the end.
//!   The first answer cannot be told from the session tickets the server
//!   sends after the handshake: none.
//! - A HelloRetryRequest: a second ClientHello starts over (with the
//!   client's compatibility ChangeCipherSpec before it or not).
//! - TLS 1.2: ClientHello; the server's flight; the client's key exchange
//!   (a handshake record); the server's last flight (ChangeCipherSpec and
//!   Finished, or a session ticket first): the end. Then the first
//!   application record toward the server is the request, the first back
//!   the answer.
//!
//! The hellos are read further: the ClientHello's server name (SNI) goes up
//! for the connection's record, the ServerHello's `supported_versions`
//! (TLS 1.3) or its legacy version (1.2 and older) is the version.

use crate::tls::wire;

pub const HANDSHAKE: u8 = 22;
pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const APPLICATION_DATA: u8 = 23;
pub const CLIENT_HELLO: u8 = 1;
pub const SERVER_HELLO: u8 = 2;
const EXT_SERVER_NAME: u16 = 0;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
/// Extensions looked at for the one wanted (browsers send about 18).
pub const MAX_EXTENSIONS: usize = 24;
/// Where a hello's session id length lies: after the record header (5),
/// the handshake header (4), the version (2) and the random (32).
pub const HELLO_SESSION_ID: usize = 43;
/// A ChangeCipherSpec record whole: header and its one byte.
const CCS_RECORD_LEN: usize = 6;

/// The bytes of one TCP segment, at offsets the caller gives (a socket
/// buffer's: the payload's offset in the packet; a slice's: from its start).
pub trait Segment {
    /// `N` bytes at `off`, or `None` where they do not all lie in the
    /// segment.
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
}

impl Segment for [u8] {
    #[inline(always)]
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let bytes = self.get(off..off.checked_add(N)?)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Some(out)
    }
}

/// The first bytes of a segment: a record's content type, its major
/// version (3), and where it is a handshake record, its message type.
#[inline(always)]
pub fn head<S: Segment + ?Sized>(seg: &S, payload: usize) -> Option<(u8, u8, u8)> {
    let b = seg.load::<6>(payload)?;
    Some((b[0], b[1], b[5]))
}

/// Whether a segment starts with a ClientHello (a handshake record of
/// major version 3 whose first message is one).
#[inline(always)]
pub fn is_client_hello<S: Segment + ?Sized>(seg: &S, payload: usize) -> bool {
    matches!(head(seg, payload), Some((HANDSHAKE, 3, CLIENT_HELLO)))
}

/// Where a hello's handshake message ends, as its header says (it may end
/// past the segment: a hello split over two).
#[inline(always)]
pub fn hello_end<S: Segment + ?Sized>(seg: &S, payload: usize) -> Option<usize> {
    let h = seg.load::<3>(payload + 6)?;
    Some(payload + 9 + (usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2])))
}

/// Where a hello's extensions lie in the segment: (start, end). After the
/// session id, a ClientHello lists its cipher suites and compression
/// methods (each with its length in front), a ServerHello names one of each.
#[inline(always)]
fn extensions<S: Segment + ?Sized>(
    seg: &S,
    payload: usize,
    client: bool,
) -> Option<(usize, usize)> {
    // The hello ends where its handshake header says: a ServerHello without
    // extensions is followed by the next message (a Certificate), whose
    // bytes must not be read as extensions.
    let hello_end = hello_end(seg, payload)?;
    let mut off = payload + HELLO_SESSION_ID;
    let sid = usize::from(seg.load::<1>(off)?[0]);
    if sid > 32 {
        return None;
    }
    off += 1 + sid;
    if client {
        off += 2 + usize::from(u16::from_be_bytes(seg.load::<2>(off)?));
        off += 1 + usize::from(seg.load::<1>(off)?[0]);
    } else {
        off += 3;
    }
    if off + 2 > hello_end {
        return None;
    }
    let len = usize::from(u16::from_be_bytes(seg.load::<2>(off)?));
    (off + 2 + len <= hello_end).then_some((off + 2, off + 2 + len))
}

/// The extension `wanted` among a hello's: where its data starts, its
/// length (all of it inside the extensions: one that runs past them is
/// malformed, and its length cannot be trusted).
#[inline(always)]
fn extension<S: Segment + ?Sized>(
    seg: &S,
    (start, end): (usize, usize),
    wanted: u16,
) -> Option<(usize, usize)> {
    let mut off = start;
    for _ in 0..MAX_EXTENSIONS {
        if off + 4 > end {
            return None;
        }
        let h = seg.load::<4>(off)?;
        let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if u16::from_be_bytes([h[0], h[1]]) == wanted {
            return (off + 4 + len <= end).then_some((off + 4, len));
        }
        off += 4 + len;
    }
    None
}

/// The host name a ClientHello asks for (RFC 6066: a list of one, type 0,
/// its length, the name): where it lies in the segment and its length
/// (inside the hello, not always inside the segment: the caller's load of
/// the name says).
#[inline(always)]
pub fn server_name<S: Segment + ?Sized>(seg: &S, payload: usize) -> Option<(usize, usize)> {
    let (data, len) = extension(seg, extensions(seg, payload, true)?, EXT_SERVER_NAME)?;
    let h = seg.load::<5>(data)?;
    let name_len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    (h[2] == 0 && name_len > 0 && name_len + 5 <= len).then_some((data + 5, name_len))
}

/// The version a ServerHello settles on: its `supported_versions` (TLS
/// 1.3, whose legacy field says 1.2), else its legacy version.
#[inline(always)]
pub fn server_version<S: Segment + ?Sized>(seg: &S, payload: usize) -> u16 {
    let legacy = seg.load::<2>(payload + 9).map_or(0, u16::from_be_bytes);
    extensions(seg, payload, false)
        .and_then(|exts| extension(seg, exts, EXT_SUPPORTED_VERSIONS))
        .and_then(|(data, len)| (len == 2).then_some(data))
        .and_then(|data| seg.load::<2>(data))
        .map_or(legacy, u16::from_be_bytes)
}

/// What a segment of a followed handshake has the connection record, as
/// [`advance`] returns it with the next stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Nothing.
    Nothing,
    /// The version the ServerHello settled on ([`server_version`]).
    Version(u16),
    /// The handshake's end.
    Finished,
    /// The end of a full TLS 1.2 handshake.
    Finished12,
    /// The first application record toward the server after a TLS 1.2
    /// handshake: the request's time.
    Request,
    /// The first one back after it: the answer's time.
    Answer,
}

/// A later payload of a followed connection in [`wire`] stage `stage`, of
/// `len` bytes, sent toward the server (or back): the stage it leads to and
/// what it marks. `None`: its first bytes are not in the segment (nothing
/// changes).
#[inline(always)]
pub fn advance<S: Segment + ?Sized>(
    seg: &S,
    payload: usize,
    len: usize,
    stage: u8,
    toward_server: bool,
) -> Option<(u8, Mark)> {
    let (kind, _, msg) = head(seg, payload)?;
    Some(match (stage, toward_server) {
        (wire::HELLO, false) => {
            let mark = if kind == HANDSHAKE && msg == SERVER_HELLO {
                Mark::Version(server_version(seg, payload))
            } else {
                Mark::Nothing
            };
            (wire::SERVER_FLIGHT, mark)
        }
        (wire::SERVER_FLIGHT, true) => {
            if kind == HANDSHAKE && msg == CLIENT_HELLO {
                // After a HelloRetryRequest: the handshake goes on.
                (wire::HELLO, Mark::Nothing)
            } else if kind == HANDSHAKE {
                (wire::TLS12_CLIENT_FLIGHT, Mark::Nothing)
            } else if kind == CHANGE_CIPHER_SPEC && len <= CCS_RECORD_LEN {
                // A TLS 1.3 client's compatibility ChangeCipherSpec, sent on
                // its own before it has read the server's flight (Java's).
                (stage, Mark::Nothing)
            } else if kind == CHANGE_CIPHER_SPEC && is_client_hello(seg, payload + CCS_RECORD_LEN) {
                // After a HelloRetryRequest, that ChangeCipherSpec right
                // before the second ClientHello, in one segment (OpenSSL's).
                (wire::HELLO, Mark::Nothing)
            } else {
                // The client's Finished (after a ChangeCipherSpec or not).
                (wire::DONE, Mark::Finished)
            }
        }
        (wire::TLS12_CLIENT_FLIGHT, false) if kind == HANDSHAKE || kind == CHANGE_CIPHER_SPEC => {
            (wire::TLS12_OPEN, Mark::Finished12)
        }
        (wire::TLS12_OPEN, true) if kind == APPLICATION_DATA => {
            (wire::TLS12_REQUEST, Mark::Request)
        }
        (wire::TLS12_REQUEST, false) if kind == APPLICATION_DATA => (wire::DONE, Mark::Answer),
        _ => (stage, Mark::Nothing),
    })
}

#[cfg(test)]
mod tests;
