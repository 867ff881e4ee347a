//! The payload of plain (not TLS) TCP connections the observer tracks, read
//! by the cgroup_skb programs (`cgroup_skb`) for the HTTP parsers.
//!
//! Packets, not syscall tracepoints: a syscall tracepoint slows every
//! syscall on the machine, while this costs a CONNS lookup per TCP packet
//! and leave at once for connections already found not to be HTTP/1.x (the
//! first payload decides) or that carry TLS (the library probes see their
//! plaintext). A segment's payload goes up whole to DATA_CAPTURE bytes, else
//! its first and last halves; retransmitted bytes are skipped by sequence
//! number, so a request is never seen twice.
//!
//! A connection established before the observer started has no CONNS entry:
//! its first packet with a payload adopts it (marked FLAG_MIDSTREAM), so its
//! later requests and HTTP/2 streams, and the TLS probes' plaintext, are
//! followed like any other's (its owner is claimed, and a TLS one's
//! announced for the per-call probes, at its first packet sent: see
//! `conn_packets`).
//!
//! Every payload packet of a tracked connection also tells `conn_packets`
//! its first bytes and owner; a connection whose payload is not read
//! (`quiet`) is marked once those are known.

use aya_ebpf::{
    bindings::{bpf_sock, BPF_SK_STORAGE_GET_F_CREATE},
    btf_maps::SkStorage,
    helpers::{bpf_skb_load_bytes, generated::bpf_sk_storage_get},
    macros::btf_map,
    programs::SkBuffContext,
    EbpfContext,
};
use observer_common::{
    http::{
        self, PlaintextEvent, BUSY_SEGMENTS, DATA_CAPTURE, DATA_FROM_START, DATA_HALF, DATA_PLAIN,
    },
    tcp_state,
    tls::{op, RATE_WINDOW_NS},
    Conn, Counter, EventKind, AF_INET, AF_INET6, DIR_INBOUND, DIR_OUTBOUND, FLAG_ESTABLISHED,
    FLAG_MIDSTREAM, FLAG_RUSTLS, FLAG_TLS, FLAG_TLS_RECORDS,
};

use crate::{
    cgroup_skb::tcp_payload,
    conn_packets,
    ctx::{copy_words, now_ns, zero_words, zeroed_in},
    events::{is_h2_frame, is_http, reserve, submit_flags},
    maps::{count, CONNS, OWN_SOCKS},
    tls_state, tls_wire,
};

/// The first four bytes of a proxy's tunnel request.
const CONNECT: u32 = u32::from_le_bytes(*b"CONN");

/// Sockets with nothing more to read (TLS, or a first payload that is not
/// HTTP/1.x, and owner and first bytes known): socket storage, so that their packets, most of a busy HTTPS
/// server's, leave after a pointer or two instead of a CONNS hash lookup.
/// The kernel frees an entry with its socket.
#[btf_map]
static HTTP_SKIP: SkStorage<u8> = SkStorage::new();

#[inline(always)]
fn skip_ptr(sk: *mut bpf_sock, flags: u64) -> *mut core::ffi::c_void {
    let map = core::ptr::from_ref(&HTTP_SKIP).cast_mut().cast();
    // SAFETY: `sk` is the packet's socket (checked non-null); the helper
    // takes the map's address and the socket's.
    unsafe { bpf_sk_storage_get(map, sk.cast(), core::ptr::null_mut(), flags) }
}

/// Marks the socket's packets as not to be read again.
#[inline(always)]
fn skip(sk: *mut bpf_sock) {
    let _ = skip_ptr(sk, BPF_SK_STORAGE_GET_F_CREATE.into());
}

/// Stops reading the payload of `conn`; its packets still come here for
/// what `conn_packets` learns from them until that is all known.
#[inline(always)]
fn quiet(sk: *mut bpf_sock, conn: &mut Conn) {
    conn.quiet = 1;
    if conn_packets::settled(conn) {
        skip(sk);
    }
}

/// Copies `n` (1..=DATA_CAPTURE - at) payload bytes at `off` into the
/// record's data at `at`.
#[inline(always)]
unsafe fn copy(
    ctx: &SkBuffContext,
    ev: *mut PlaintextEvent,
    at: usize,
    off: usize,
    n: usize,
) -> bool {
    // ((n - 1) & (cap - 1)) + 1 == n for 1..=cap; the verifier needs the
    // size bounded away from 0 and the buffer's end.
    let cap = if at == 0 { DATA_CAPTURE } else { DATA_HALF };
    let size = ((n as u32).wrapping_sub(1) & (cap as u32 - 1)) + 1;
    let dst = core::ptr::addr_of_mut!((*ev).data).cast::<u8>().add(at);
    bpf_skb_load_bytes(ctx.as_ptr().cast(), off as u32, dst.cast(), size) == 0
}

/// An outgoing packet of a TLS connection no library session is tied to
/// yet: its sender may be inside one of the session's calls.
struct Untied {
    sk: *mut bpf_sock,
    conn: *mut Conn,
}

#[inline(always)]
pub fn packet(ctx: &SkBuffContext, egress: bool) {
    let Some(u) = read(ctx, egress) else {
        return;
    };
    // SAFETY: a live map value, valid for this program run.
    let conn = unsafe { &mut *u.conn };
    if tls_state::tie_by_packet(conn, now_ns()).is_some() {
        // The library's probes have its plaintext from now on.
        quiet(u.sk, conn);
    }
}

/// Reads a packet for the HTTP parsers and the TLS wire; Some when it may
/// tie a TLS session to its socket.
#[inline(always)]
fn read(ctx: &SkBuffContext, egress: bool) -> Option<Untied> {
    // SAFETY: the program's own context; the socket pointer is only compared
    // and used as the CONNS key (the socket's address, as the tracepoints
    // see it).
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    // Segments without payload first (most of a short connection's
    // packets: SYNs, ACKs, FINs), read in place without a helper; then the
    // socket's own mark: most payload packets of a busy host belong to
    // sockets already judged (TLS, not HTTP, or too busy).
    let (l4, payload) = tcp_payload(ctx)?;
    if !skip_ptr(sk, 0).is_null() {
        return None;
    }
    let key = sk as u64;
    // No payload seen on the connection before this packet.
    let mut fresh = true;
    let tracked = CONNS.get_ptr_mut(&key);
    let family = match tracked {
        Some(c) => {
            // SAFETY: a live map value, valid for this program run.
            let c = unsafe { &mut *c };
            fresh = c.first_tx_ns == 0 && c.first_rx_ns == 0;
            if !conn_packets::note(c, egress, now_ns()) {
                skip(sk);
                return None;
            }
            if c.quiet != 0 {
                if conn_packets::settled(c) {
                    skip(sk);
                }
                return None;
            }
            // rustls takes the entry over at the handshake's first read and
            // leaves its end to the wire.
            if c.http == http::TLS_WIRE && (c.flags & FLAG_TLS == 0 || c.flags & FLAG_RUSTLS != 0) {
                // Done: the socket's packets leave at the mark from now on
                // (`http` stays TLS_WIRE: its close sends the wire's times).
                let len = ctx.len() as usize - payload;
                if !tls_wire::step(ctx, key, payload, len, egress, now_ns()) {
                    quiet(sk, c);
                }
                return (egress && c.flags & FLAG_TLS == 0).then_some(Untied { sk, conn: c });
            }
            if c.http == http::UNKNOWN && c.flags & FLAG_TLS != 0 && c.flags & FLAG_MIDSTREAM == 0 {
                // Tied before its first byte: this is its hello.
                tls_wire::name_from_hello(ctx, key, payload, now_ns());
                quiet(sk, c);
                return None;
            }
            // Not HTTP from its start: it may still turn to TLS (below).
            let watching = c.http == http::NO
                && c.flags & (FLAG_TLS | FLAG_MIDSTREAM) == 0
                && c.http_looks < http::STARTTLS_LOOKS;
            if !watching
                && (c.http != http::UNKNOWN && c.http != http::YES || c.flags & FLAG_TLS != 0)
            {
                quiet(sk, c);
                return None;
            }
            0
        }
        None => {
            // SAFETY: the packet's socket, checked non-null; its common
            // fields are readable from this program.
            let (state, family) = unsafe { ((*sk).state, (*sk).family) };
            if state != tcp_state::ESTABLISHED as u32 || !ip_family(family) {
                return None;
            }
            family
        }
    };
    let total = ctx.len() as usize;
    let len = total - payload;
    let conn = match tracked {
        Some(c) => c,
        None => {
            // A TLS record: content type 20-23, then version 3.x.
            let tls = ctx
                .load::<[u8; 2]>(payload)
                .is_ok_and(|b| (20..=23).contains(&b[0]) && b[1] == 3);
            let c = adopt(sk, key, family, tls)?;
            // SAFETY: a live map value, valid for this program run.
            if !conn_packets::note(unsafe { &mut *c }, egress, now_ns()) {
                skip(sk);
                return None;
            }
            c
        }
    };
    // SAFETY: a live map value, valid for this program run (an adopted one
    // is new: neither judged nor TLS yet).
    let conn = unsafe { &mut *conn };
    let midstream = conn.flags & FLAG_MIDSTREAM != 0;
    let seq = u32::from_be_bytes(ctx.load::<[u8; 4]>(l4 + 4).ok()?);
    let dir = usize::from(!egress);
    // A connection not HTTP from its start is read as a first payload
    // would be, for a ClientHello.
    let first = conn.http == http::UNKNOWN || conn.http == http::NO;
    let end = seq.wrapping_add(len as u32);
    let now = now_ns();
    if first {
        let start = if len < 4 {
            0
        } else {
            u32::from_le_bytes(ctx.load::<[u8; 4]>(payload).ok()?)
        };
        let h2 = midstream && len >= 9 && is_h2_frame(&ctx.load::<[u8; 9]>(payload).ok()?);
        if !midstream && !is_http(start) && tls_wire::starts(ctx, key, payload, egress, now) {
            // TLS: its plaintext is the library probes', its handshake is
            // followed here until one of them takes the connection over.
            conn.http = http::TLS_WIRE;
            return egress.then_some(Untied { sk, conn });
        }
        if conn.http == http::NO {
            // Watched for a ClientHello after a plaintext start: not one.
            conn.http_looks = conn.http_looks.saturating_add(1);
            if conn.http_looks >= http::STARTTLS_LOOKS {
                quiet(sk, conn);
            }
            return None;
        }
        if !is_http(start) && !h2 {
            // A connection first seen mid-way may first show the rest of an
            // answer; the next request tells.
            conn.http_looks = conn.http_looks.saturating_add(1);
            if midstream && conn.http_looks >= http::MIDSTREAM_LOOKS {
                conn.http = http::NO;
                quiet(sk, conn);
            } else if !midstream {
                // Not HTTP; its next payloads are watched for a ClientHello
                // (STARTTLS, PostgreSQL's SSLRequest), then it is skipped.
                conn.http = http::NO;
                conn.http_looks = 0;
            }
            // One begun before us, TLS: a library call's next packet.
            let records = conn.flags & (FLAG_TLS_RECORDS | FLAG_TLS) == FLAG_TLS_RECORDS;
            return (egress && records).then_some(Untied { sk, conn });
        }
        // SAFETY: the connection's own state, eight-aligned in its entry.
        unsafe { zero_words(&raw mut conn.http_state) };
        let st = &mut conn.http_state;
        st.window_start_ns = now;
        st.window_segments = 1;
        st.next_seq[dir & 1] = end;
        conn.http = http::YES;
        conn.http_looks = if start == CONNECT { http::TUNNEL } else { 0 };
    } else {
        // A TLS handshake through a proxy's CONNECT: its sender may be in
        // the session's call.
        if egress
            && conn.http_looks == http::TUNNEL
            && conn.flags & FLAG_TLS == 0
            && ctx.load::<[u8; 2]>(payload).is_ok_and(|b| b == [22, 3])
        {
            return Some(Untied { sk, conn });
        }
        let st = &mut conn.http_state;
        let want = st.next_seq[dir & 1];
        // Bytes already seen (a retransmission) end at or before what we expect.
        if want != 0 && (end.wrapping_sub(want) as i32) <= 0 {
            return None;
        }
        st.next_seq[dir & 1] = end;
        if now.saturating_sub(st.window_start_ns) > RATE_WINDOW_NS {
            st.window_start_ns = now;
            st.window_segments = 0;
        }
        st.window_segments += 1;
        if st.window_segments > BUSY_SEGMENTS {
            count(Counter::HttpBusy);
            conn.http = http::NO;
            quiet(sk, conn);
            return None;
        }
    }
    let mut entry = reserve::<PlaintextEvent>(EventKind::Plaintext, now)?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is a reserved record of the right size.
    let ok = unsafe {
        copy_words(&raw mut (*ev).conn, conn);
        (*ev).entry_ns = now;
        (*ev).ret_ns = now;
        (*ev).len = len as u32;
        (*ev).op = if egress { op::WRITE } else { op::READ };
        let from_start = first && !midstream && fresh;
        (*ev).flags = DATA_PLAIN | if from_start { DATA_FROM_START } else { 0 };
        // Volatile: two zero stores side by side become a byte-loop memset.
        core::ptr::write_volatile(&raw mut (*ev).hs_start_ns, 0);
        core::ptr::write_volatile(&raw mut (*ev).hs_end_ns, 0);
        (*ev).library = 0;
        (*ev)._pad = 0;
        if len <= DATA_CAPTURE {
            copy(ctx, ev, 0, payload, len)
        } else {
            copy(ctx, ev, 0, payload, DATA_HALF)
                && copy(ctx, ev, DATA_HALF, payload + len - DATA_HALF, DATA_HALF)
        }
    };
    if ok {
        entry.submit(submit_flags());
    } else {
        entry.discard(0);
    }
    None
}

#[inline(always)]
fn ip_family(family: u32) -> bool {
    family == u32::from(AF_INET) || family == u32::from(AF_INET6)
}

/// Starts tracking an established connection that has no CONNS entry (begun
/// before the observer started, or evicted): its owner is claimed at its
/// next packet sent (`conn_packets`), as an accepted connection's is. Which
/// end is the client is a guess from the ports here (the lower one is taken
/// for the server's); userspace corrects it from the first request it sees.
#[inline(always)]
fn adopt(sk: *mut bpf_sock, key: u64, family: u32, tls: bool) -> Option<*mut Conn> {
    if OWN_SOCKS.get_ptr(&key).is_some() {
        skip(sk);
        return None;
    }
    let mut slot = core::mem::MaybeUninit::<Conn>::uninit();
    let c = zeroed_in(&mut slot);
    c.sk = key;
    c.start_ns = now_ns();
    c.family = family as u16;
    c.flags = FLAG_ESTABLISHED | FLAG_MIDSTREAM | if tls { FLAG_TLS_RECORDS } else { 0 };
    // SAFETY: the packet's socket (non-null); its common fields are readable.
    unsafe {
        c.sport = (*sk).src_port as u16;
        c.dport = u16::from_be((*sk).dst_port);
        if family == u32::from(AF_INET) {
            c.saddr[..4].copy_from_slice(&(*sk).src_ip4.to_ne_bytes());
            c.daddr[..4].copy_from_slice(&(*sk).dst_ip4.to_ne_bytes());
        } else {
            for i in 0..4 {
                c.saddr[i * 4..i * 4 + 4].copy_from_slice(&(*sk).src_ip6[i].to_ne_bytes());
                c.daddr[i * 4..i * 4 + 4].copy_from_slice(&(*sk).dst_ip6[i].to_ne_bytes());
            }
        }
    }
    c.direction = if c.sport < c.dport {
        DIR_INBOUND
    } else {
        DIR_OUTBOUND
    };
    if CONNS
        .insert(&key, c, u64::from(aya_ebpf::bindings::BPF_NOEXIST))
        .is_err()
    {
        count(Counter::ConnInsertFailed);
        skip(sk);
        return None;
    }
    count(Counter::Adopted);
    CONNS.get_ptr_mut(&key)
}
