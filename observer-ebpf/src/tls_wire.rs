//! TLS handshakes read from the record headers on the wire, for the TLS
//! stacks no library probe sees (Java's JSSE, Go's crypto/tls, rustls, a
//! stripped static binary): the packet programs (`http_packets`) hand over
//! each payload of a connection whose first one was a ClientHello, until the
//! handshake's end and, on TLS 1.2, the first answer.
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
//! - A HelloRetryRequest: a second ClientHello starts over.
//! - TLS 1.2: ClientHello; the server's flight; the client's key exchange
//!   (a handshake record); the server's last flight (ChangeCipherSpec and
//!   Finished, or a session ticket first): the end. Then the first
//!   application record toward the server is the request, the first back
//!   the answer.
//!
//! The hellos are read further: the ClientHello's server name (SNI) goes up
//! for the connection's record, the ServerHello's `supported_versions`
//! (TLS 1.3) or its legacy version (1.2 and older) is the version.
//!
//! A library session tied to the socket (through the descriptor a probe
//! saw, or by a packet sent inside its call: `tls_state`) replaces the
//! entry, and the packet programs stop reading it; rustls,
//! whose probes see no handshake call, takes the entry over and leaves the
//! handshake to the wire.

use aya_ebpf::programs::SkBuffContext;
use observer_common::{
    tls::{library, wire, TLS_HS_DONE, TLS_HS_STARTED, TLS_WIRE_12},
    Counter, TlsConn,
};

use crate::{
    ctx::zeroed_in,
    events::emit_tls_name_from_skb,
    maps::{count, TLS_CONNS},
};

const HANDSHAKE: u8 = 22;
const CHANGE_CIPHER_SPEC: u8 = 20;
const APPLICATION_DATA: u8 = 23;
const CLIENT_HELLO: u8 = 1;
const SERVER_HELLO: u8 = 2;
const EXT_SERVER_NAME: u16 = 0;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
/// Extensions looked at for the one wanted (browsers send about 18).
const MAX_EXTENSIONS: usize = 24;
/// Where a hello's session id length lies: after the record header (5),
/// the handshake header (4), the version (2) and the random (32).
const HELLO_SESSION_ID: usize = 43;
/// A ChangeCipherSpec record whole: header and its one byte.
const CCS_RECORD_LEN: usize = 6;

/// The first bytes of a segment: a record's content type, its major
/// version (3), and where it is a handshake record, its message type.
#[inline(always)]
fn head(ctx: &SkBuffContext, payload: usize) -> Option<(u8, u8, u8)> {
    let b = ctx.load::<[u8; 6]>(payload).ok()?;
    Some((b[0], b[1], b[5]))
}

/// A connection's first payload: a ClientHello starts following it (true).
#[inline(always)]
pub fn starts(ctx: &SkBuffContext, sk: u64, payload: usize, egress: bool, now: u64) -> bool {
    let Some((kind, major, msg)) = head(ctx, payload) else {
        return false;
    };
    if kind != HANDSHAKE || major != 3 || msg != CLIENT_HELLO {
        return false;
    }
    let mut slot = core::mem::MaybeUninit::<TlsConn>::uninit();
    let t = zeroed_in(&mut slot);
    t.hs_start_ns = now;
    t.library = library::WIRE;
    t.flags = TLS_HS_STARTED;
    t.wire_stage = wire::HELLO;
    t.wire_hello_out = u8::from(egress);
    // BPF_NOEXIST: a library's entry (its probes saw the handshake) stays.
    if TLS_CONNS.insert(&sk, t, 1).is_err() {
        return false;
    }
    count(Counter::TlsWire);
    if let Some((name, len)) = server_name(ctx, payload) {
        emit_tls_name_from_skb(ctx, sk, name, len, now);
    }
    true
}

/// The first payload of a connection whose library session was tied before
/// any of its bytes (`SSL_set_fd`, Go): a ClientHello names the server for
/// the connection's record, on both ends (no library call is probed for
/// the name: `SSL_ctrl`, which carries it in OpenSSL, is called several
/// times per connection for other things).
#[inline(always)]
pub fn name_from_hello(ctx: &SkBuffContext, sk: u64, payload: usize, now: u64) {
    let Some((kind, major, msg)) = head(ctx, payload) else {
        return;
    };
    if kind != HANDSHAKE || major != 3 || msg != CLIENT_HELLO {
        return;
    }
    if let Some((name, len)) = server_name(ctx, payload) {
        emit_tls_name_from_skb(ctx, sk, name, len, now);
    }
}

/// Where a hello's extensions lie in the segment: (start, end). After the
/// session id, a ClientHello lists its cipher suites and compression
/// methods (each with its length in front), a ServerHello names one of each.
#[inline(always)]
fn extensions(ctx: &SkBuffContext, payload: usize, client: bool) -> Option<(usize, usize)> {
    // The hello ends where its handshake header says: a ServerHello without
    // extensions is followed by the next message (a Certificate), whose
    // bytes must not be read as extensions.
    let h = ctx.load::<[u8; 3]>(payload + 6).ok()?;
    let hello_end =
        payload + 9 + (usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]));
    let mut off = payload + HELLO_SESSION_ID;
    let sid = usize::from(ctx.load::<u8>(off).ok()?);
    if sid > 32 {
        return None;
    }
    off += 1 + sid;
    if client {
        off += 2 + usize::from(u16::from_be_bytes(ctx.load::<[u8; 2]>(off).ok()?));
        off += 1 + usize::from(ctx.load::<u8>(off).ok()?);
    } else {
        off += 3;
    }
    if off + 2 > hello_end {
        return None;
    }
    let len = usize::from(u16::from_be_bytes(ctx.load::<[u8; 2]>(off).ok()?));
    (off + 2 + len <= hello_end).then_some((off + 2, off + 2 + len))
}

/// The extension `wanted` among a hello's: where its data starts, its length.
#[inline(always)]
fn extension(
    ctx: &SkBuffContext,
    (start, end): (usize, usize),
    wanted: u16,
) -> Option<(usize, usize)> {
    let mut off = start;
    for _ in 0..MAX_EXTENSIONS {
        if off + 4 > end {
            return None;
        }
        let h = ctx.load::<[u8; 4]>(off).ok()?;
        let len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if u16::from_be_bytes([h[0], h[1]]) == wanted {
            return Some((off + 4, len));
        }
        off += 4 + len;
    }
    None
}

/// The host name a ClientHello asks for (RFC 6066: a list of one, type 0,
/// its length, the name): where it lies in the segment and its length.
#[inline(always)]
fn server_name(ctx: &SkBuffContext, payload: usize) -> Option<(usize, usize)> {
    let (data, len) = extension(ctx, extensions(ctx, payload, true)?, EXT_SERVER_NAME)?;
    let h = ctx.load::<[u8; 5]>(data).ok()?;
    let name_len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    (h[2] == 0 && name_len > 0 && name_len + 5 <= len).then_some((data + 5, name_len))
}

/// The version a ServerHello settles on: its `supported_versions` (TLS
/// 1.3, whose legacy field says 1.2), else its legacy version.
#[inline(always)]
fn server_version(ctx: &SkBuffContext, payload: usize) -> u16 {
    let legacy = ctx
        .load::<[u8; 2]>(payload + 9)
        .map_or(0, u16::from_be_bytes);
    extensions(ctx, payload, false)
        .and_then(|exts| extension(ctx, exts, EXT_SUPPORTED_VERSIONS))
        .and_then(|(data, len)| (len == 2).then_some(data))
        .and_then(|data| ctx.load::<[u8; 2]>(data).ok())
        .map_or(legacy, u16::from_be_bytes)
}

/// A later payload of a followed connection; false once there is nothing
/// more to read on the wire (or the entry went: the library took over).
#[inline(always)]
pub fn step(
    ctx: &SkBuffContext,
    sk: u64,
    payload: usize,
    len: usize,
    egress: bool,
    now: u64,
) -> bool {
    let Some(t) = TLS_CONNS.get_ptr_mut(&sk) else {
        return false;
    };
    // SAFETY: a live map value, valid for this program run.
    let t = unsafe { &mut *t };
    // rustls's probes take the entry over at the handshake's first socket
    // read (`tls_state::tie_rustls`) and read its end here.
    if t.library != library::WIRE && t.library != library::RUSTLS {
        return false;
    }
    let toward_server = u8::from(egress) == t.wire_hello_out;
    let Some((kind, _, msg)) = head(ctx, payload) else {
        return true;
    };
    match (t.wire_stage, toward_server) {
        (wire::HELLO, false) => {
            if kind == HANDSHAKE && msg == SERVER_HELLO {
                t.version = server_version(ctx, payload);
            }
            t.wire_stage = wire::SERVER_FLIGHT;
        }
        (wire::SERVER_FLIGHT, true) => {
            if kind == HANDSHAKE && msg == CLIENT_HELLO {
                // After a HelloRetryRequest: the handshake goes on.
                t.wire_stage = wire::HELLO;
            } else if kind == HANDSHAKE {
                t.wire_stage = wire::TLS12_CLIENT_FLIGHT;
            } else if kind == CHANGE_CIPHER_SPEC && len <= CCS_RECORD_LEN {
                // A TLS 1.3 client's compatibility ChangeCipherSpec, sent on
                // its own before it has read the server's flight (Java's).
            } else {
                // The client's Finished (after a ChangeCipherSpec or not).
                finish(t, now);
                t.wire_stage = wire::DONE;
            }
        }
        (wire::TLS12_CLIENT_FLIGHT, false) => {
            if kind == HANDSHAKE || kind == CHANGE_CIPHER_SPEC {
                finish(t, now);
                t.flags |= TLS_WIRE_12;
                t.wire_stage = wire::TLS12_OPEN;
            }
        }
        (wire::TLS12_OPEN, true) if kind == APPLICATION_DATA => {
            if egress {
                t.sk_send_after_hs_ns = now;
            } else {
                t.sk_recv_after_hs_ns = now;
            }
            t.wire_stage = wire::TLS12_REQUEST;
        }
        (wire::TLS12_REQUEST, false) if kind == APPLICATION_DATA => {
            if egress {
                t.sk_send_after_recv_ns = now;
            } else {
                t.sk_recv_after_send_ns = now;
            }
            t.wire_stage = wire::DONE;
        }
        _ => {}
    }
    t.wire_stage != wire::DONE
}

#[inline(always)]
fn finish(t: &mut TlsConn, now: u64) {
    t.hs_end_ns = now;
    t.flags |= TLS_HS_DONE;
}
