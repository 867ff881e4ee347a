//! TLS handshakes read from the record headers on the wire, for the TLS
//! stacks no library probe sees (Java's JSSE, Go's crypto/tls, rustls, a
//! stripped static binary): the packet programs (`http_packets`) hand over
//! each payload of a connection whose first one was a ClientHello, until the
//! handshake's end and, on TLS 1.2, the first answer.
//!
//! The parsing (the record and hello layouts, the flights and the stages
//! they lead to) is `observer_common::tls_wire`, shared with the fuzz
//! target and the unit tests; here it reads the socket buffer ([`Skb`]) and
//! its verdicts go to the connection's `TLS_CONNS` entry.
//!
//! A library session tied to the socket (through the descriptor a probe
//! saw, or by a packet sent inside its call: `tls_state`) replaces the
//! entry, and the packet programs stop reading it; rustls,
//! whose probes see no handshake call, takes the entry over and leaves the
//! handshake to the wire.

use aya_ebpf::programs::SkBuffContext;
use observer_common::{
    tls::{library, wire, TLS_HS_DONE, TLS_HS_STARTED, TLS_WIRE_12},
    tls_wire::{self as parse, Mark, Segment},
    Counter, TlsConn,
};

use crate::{
    ctx::zeroed_in,
    events::emit_tls_name_from_skb,
    maps::{count, TLS_CONNS},
};

/// A socket buffer as the shared parser reads it: offsets in the packet.
struct Skb<'a>(&'a SkBuffContext);

impl Segment for Skb<'_> {
    #[inline(always)]
    fn load<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.0.load::<[u8; N]>(off).ok()
    }
}

/// A connection's first payload: a ClientHello starts following it (true).
#[inline(always)]
pub fn starts(ctx: &SkBuffContext, sk: u64, payload: usize, egress: bool, now: u64) -> bool {
    let seg = Skb(ctx);
    if !parse::is_client_hello(&seg, payload) {
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
    if let Some((name, len)) = parse::server_name(&seg, payload) {
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
    let seg = Skb(ctx);
    if !parse::is_client_hello(&seg, payload) {
        return;
    }
    if let Some((name, len)) = parse::server_name(&seg, payload) {
        emit_tls_name_from_skb(ctx, sk, name, len, now);
    }
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
    let Some((stage, mark)) = parse::advance(&Skb(ctx), payload, len, t.wire_stage, toward_server)
    else {
        return true;
    };
    match mark {
        Mark::Nothing => {}
        Mark::Version(v) => t.version = v,
        Mark::Finished => finish(t, now),
        Mark::Finished12 => {
            finish(t, now);
            t.flags |= TLS_WIRE_12;
        }
        Mark::Request if egress => t.sk_send_after_hs_ns = now,
        Mark::Request => t.sk_recv_after_hs_ns = now,
        Mark::Answer if egress => t.sk_send_after_recv_ns = now,
        Mark::Answer => t.sk_recv_after_send_ns = now,
    }
    t.wire_stage = stage;
    stage != wire::DONE
}

#[inline(always)]
fn finish(t: &mut TlsConn, now: u64) {
    t.hs_end_ns = now;
    t.flags |= TLS_HS_DONE;
}
