//! Records sent to userspace through the ring buffer. A failed reservation is
//! counted, never silent.

use aya_ebpf::{
    helpers::{bpf_probe_read_kernel, generated::bpf_skb_load_bytes},
    maps::ring_buf::RingBufEntry,
    programs::SkBuffContext,
    EbpfContext,
};
use observer_common::{
    http::{self, PlaintextEvent, DATA_CAPTURE, DATA_FROM_START, DATA_HALF},
    tls::{
        library, TlsBusyEvent, TlsNameEvent, TlsProcessEvent, SERVER_NAME_LEN, TLS_CLOSED,
        TLS_MIDSTREAM,
    },
    CloseEvent, Conn, Counter, EventHeader, EventKind, ListenEvent, OwnerEvent, TlsConn, FLAG_TLS,
    SOCK_DONE,
};

use crate::ctx::{copy_words, zero_words};
use crate::maps::{
    count, sk_err_offset, sk_lock_owned_offset, srtt_us_offset, tcp_counters, tls_wake_at_once,
    wakeup_bytes, CLOSED_CONNS, CLOSED_TLS_CONNS, CONNS, EVENTS, TLS_CONNS,
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Waking the reader for every record costs over a microsecond each; instead
/// the reader polls on a short timer and is woken only when the ring holds
/// more than WAKEUP_BYTES, so a burst can never outrun the timer.
#[inline(always)]
pub fn submit_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= wakeup_bytes() {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Reserves a record of type `T` (whose first field is its [`EventHeader`])
/// with the header filled in. A full ring is counted and gives None.
#[inline(always)]
pub fn reserve<T: 'static>(kind: EventKind, now: u64) -> Option<RingBufEntry<T>> {
    let Some(mut entry) = EVENTS.reserve::<T>(0) else {
        count(Counter::RingFull);
        return None;
    };
    let hdr = entry.as_mut_ptr().cast::<EventHeader>();
    // SAFETY: every record type starts with its header (repr(C)), and the
    // reservation is the size of `T`.
    unsafe {
        (*hdr).kind = kind as u32;
        (*hdr).size = core::mem::size_of::<T>() as u32;
        (*hdr).ts_ns = now;
    }
    Some(entry)
}

/// Tells userspace who owns `sk` so it can resolve the executable while the
/// process still exists.
#[inline(always)]
pub fn emit_owner(sk: u64, conn: &Conn, now: u64) {
    let Some(mut entry) = reserve::<OwnerEvent>(EventKind::Owner, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size.
    unsafe {
        (*ev).sk = sk;
        (*ev).pid = conn.pid;
        (*ev).tid = conn.tid;
        copy_words(&raw mut (*ev).comm, &conn.comm);
        (*ev).direction = conn.direction;
        (*ev)._pad = 0;
        (*ev).family = conn.family;
        (*ev).dport = conn.dport;
        (*ev)._pad2 = 0;
        copy_words(&raw mut (*ev).daddr, &conn.daddr);
    }
    entry.submit(submit_flags());
}

/// Tells userspace that `sk` began (`pid` on `port`) or stopped listening.
#[inline(always)]
pub fn emit_listen(sk: u64, pid: u32, port: u16, listening: bool, now: u64) {
    let Some(mut entry) = reserve::<ListenEvent>(EventKind::Listen, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size.
    unsafe {
        (*ev).sk = sk;
        (*ev).pid = pid;
        (*ev).port = port;
        (*ev).listening = u8::from(listening);
        (*ev)._pad = 0;
    }
    entry.submit(submit_flags());
}

/// A TLS entry for the socket: a library's session tied to it, or a
/// handshake followed on the wire.
#[inline(always)]
fn has_tls(conn: &Conn) -> bool {
    conn.flags & FLAG_TLS != 0 || conn.http == http::TLS_WIRE
}

/// Sends the final record of `sk` and forgets it.
#[inline(always)]
pub fn emit_close(sk: u64, conn: *const Conn, now: u64) {
    if let Some(mut entry) = reserve::<CloseEvent>(EventKind::Close, now) {
        let ev = entry.as_mut_ptr();
        // SAFETY: `ev` points at a reserved record of the right size; `conn`
        // at a live map value.
        unsafe {
            copy_words(&raw mut (*ev).conn, conn);
            copy_counters(sk, &mut (*ev).conn);
            match has_tls(&*conn).then(|| TLS_CONNS.get_ptr(&sk)).flatten() {
                Some(tls) => copy_words(&raw mut (*ev).tls, tls),
                None => zero_words(&raw mut (*ev).tls),
            }
        }
        entry.submit(submit_flags());
    }
    count(Counter::Closed);
    // SAFETY: `conn` still points at the live map value.
    if has_tls(unsafe { &*conn }) {
        keep_closed_tls(sk, conn);
        let _ = TLS_CONNS.remove(&sk);
    }
    let _ = CONNS.remove(&sk);
}

/// Keeps a TLS connection as it was at its close for a library call in
/// flight on it, whose plaintext comes at its return (see CLOSED_CONNS).
#[inline(always)]
fn keep_closed_tls(sk: u64, conn: *const Conn) {
    let Some(tls) = TLS_CONNS.get_ptr(&sk) else {
        return;
    };
    // SAFETY: both point at live map values; the helpers copy from them.
    unsafe {
        if CLOSED_TLS_CONNS.insert(&sk, &*tls, 0).is_err() {
            return;
        }
        if let Some(kept) = CLOSED_TLS_CONNS.get_ptr_mut(&sk) {
            (*kept).flags |= TLS_CLOSED;
        }
        let _ = CLOSED_CONNS.insert(&sk, &*conn, 0);
    }
}

/// Announces a process's first TLS session (or context). The reader is woken
/// at once only while a file is per process: then the per-process probes
/// it may attach should be in before the first request.
#[inline(always)]
pub fn emit_tls_process(pid: u32, library: u8, now: u64) {
    let Some(mut entry) = reserve::<TlsProcessEvent>(EventKind::TlsProcess, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size.
    unsafe {
        (*ev).pid = pid;
        (*ev).library = u32::from(library);
    }
    // Read at the next drain, unless a file is per process now (see
    // TLS_WAKE_MAP): a forced wake-up costs this call ~20 µs here.
    let flags = if tls_wake_at_once() {
        BPF_RB_FORCE_WAKEUP
    } else {
        submit_flags()
    };
    entry.submit(flags);
}

/// Sends the server name of the TLS session on `sk`.
#[inline(always)]
pub fn emit_tls_name(sk: u64, name: &[u8; SERVER_NAME_LEN], len: u32, now: u64) {
    let Some(mut entry) = reserve::<TlsNameEvent>(EventKind::TlsName, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size.
    unsafe {
        (*ev).sk = sk;
        (*ev).len = len;
        (*ev)._pad = 0;
        (*ev).name = *name;
    }
    entry.submit(submit_flags());
}

/// Sends the server name of the TLS session on `sk` as a ClientHello in the
/// packet holds it: `len` bytes at `off` (at most [`SERVER_NAME_LEN`]).
#[inline(always)]
pub fn emit_tls_name_from_skb(ctx: &SkBuffContext, sk: u64, off: usize, len: usize, now: u64) {
    if len == 0 {
        return;
    }
    // 1..=SERVER_NAME_LEN in a form the verifier can follow (a load of
    // zero bytes is refused).
    let len = ((len.min(SERVER_NAME_LEN) - 1) & (SERVER_NAME_LEN - 1)) + 1;
    let Some(mut entry) = reserve::<TlsNameEvent>(EventKind::TlsName, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size, and
    // `len` bytes fit in its name.
    let loaded = unsafe {
        (*ev).sk = sk;
        (*ev).len = len as u32;
        (*ev)._pad = 0;
        bpf_skb_load_bytes(
            ctx.as_ptr() as *const _,
            off as u32,
            (*ev).name.as_mut_ptr().cast(),
            len as u32,
        )
    };
    if loaded == 0 {
        entry.submit(submit_flags());
    } else {
        entry.discard(0);
    }
}

/// Reads a 32-bit field of the socket at `off` (0: offset unknown -> 0).
#[inline(always)]
fn sk_u32(sk: u64, off: u32) -> u32 {
    if off == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; `sk` is a live
    // socket passed by the tracepoint.
    unsafe { bpf_probe_read_kernel((sk + u64::from(off)) as *const u32) }.unwrap_or(0)
}

/// Reads a field of any type of the socket at `off`, which may be 0 (the
/// peer's address starts `struct sock`): the caller knows the offsets.
#[inline(always)]
pub fn sk_field<T: Copy + Default>(sk: u64, off: u32) -> T {
    // SAFETY: as in `sk_u32`.
    unsafe { bpf_probe_read_kernel((sk + u64::from(off)) as *const T) }.unwrap_or_default()
}

/// Reads a 64-bit field of the socket at `off` (0: offset unknown -> 0).
#[inline(always)]
fn sk_u64(sk: u64, off: u32) -> u64 {
    if off == 0 {
        return 0;
    }
    // SAFETY: as in `sk_u32`.
    unsafe { bpf_probe_read_kernel((sk + u64::from(off)) as *const u64) }.unwrap_or(0)
}

/// Copies the kernel's own byte and segment counters of TCP socket `sk`
/// into its record: four reads when the record is made, instead of a
/// count kept on every send and receive of the machine.
#[inline(always)]
pub fn copy_counters(sk: u64, conn: &mut Conn) {
    let off = tcp_counters();
    // Payload only: no retransmitted byte twice, and not the peer's FIN,
    // which takes a place in the sequence space `bytes_received` counts.
    let sent = sk_u64(sk, off.bytes_sent);
    conn.bytes_tx = sent.saturating_sub(sk_u64(sk, off.bytes_retrans));
    let fin = sk_u64(sk, off.sk_flags) >> SOCK_DONE & 1;
    conn.bytes_rx = sk_u64(sk, off.bytes_received).saturating_sub(fin);
    conn.segs_out = sk_u32(sk, off.data_segs_out);
    conn.segs_in = sk_u32(sk, off.data_segs_in);
}

/// The socket's pending error (`sk->sk_err`), positive.
#[inline(always)]
pub fn sk_err(sk: u64) -> u32 {
    (sk_u32(sk, sk_err_offset()) as i32).unsigned_abs()
}

/// Whether a task holds socket `sk` (`sk->sk_lock.owned`): a packet sent
/// then is sent in that task's context. The kernel sends from softirq
/// (retransmits, data an ACK let out, TSQ) only while no task holds the
/// socket, deferring to the holder's release otherwise, so a packet sent
/// while it is held is never the interrupted task's by accident. False
/// when the offset is unknown.
#[inline(always)]
pub fn sk_held_by_task(sk: u64) -> bool {
    sk_u32(sk, sk_lock_owned_offset()) != 0
}

/// The smoothed RTT in microseconds (`tcp_sk(sk)->srtt_us >> 3`). Read from the
/// socket when needed rather than from tcp:tcp_probe, which would run for every
/// received segment.
#[inline(always)]
pub fn sk_srtt_us(sk: u64) -> u32 {
    sk_u32(sk, srtt_us_offset()) >> 3
}

/// A process's plaintext call rate passed the limit: wake the reader at once,
/// each call costs that process a trap until its probes come off.
#[inline(always)]
pub fn emit_tls_busy(pid: u32, calls: u32, now: u64) {
    let Some(mut entry) = reserve::<TlsBusyEvent>(EventKind::TlsBusy, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at a reserved record of the right size.
    unsafe {
        (*ev).pid = pid;
        (*ev).calls = calls;
    }
    entry.submit(BPF_RB_FORCE_WAKEUP);
}

/// First four bytes of an HTTP/1.x request (a method) or response, or of an
/// HTTP/2 client's preface ("PRI * HTTP/2.0"), as a little-endian u32.
pub const HTTP_STARTS: [u32; 10] = [
    u32::from_le_bytes(*b"PRI "),
    u32::from_le_bytes(*b"GET "),
    u32::from_le_bytes(*b"POST"),
    u32::from_le_bytes(*b"PUT "),
    u32::from_le_bytes(*b"HEAD"),
    u32::from_le_bytes(*b"DELE"),
    u32::from_le_bytes(*b"PATC"),
    u32::from_le_bytes(*b"OPTI"),
    u32::from_le_bytes(*b"HTTP"),
    // A proxy's tunnel: its TLS follows (`http_packets` ties the session).
    u32::from_le_bytes(*b"CONN"),
];

/// Whether a payload starting with these four bytes is HTTP (1.x, or 2
/// from its preface, or from a server's SETTINGS frame: an HTTP/2 server
/// may write its own before it reads the client's preface).
#[inline(always)]
pub fn is_http(start: u32) -> bool {
    // Length under 64 KiB (two zero bytes), then type 4.
    const SETTINGS_MASK: u32 = 0xff00_ffff;
    const SETTINGS_START: u32 = 0x0400_0000;
    HTTP_STARTS.contains(&start) || start & SETTINGS_MASK == SETTINGS_START
}

/// Whether a call or payload that starts with these nine bytes starts an
/// HTTP/2 HEADERS or DATA frame on a client-or-server stream: how a
/// connection first seen mid-way (no preface) shows it speaks HTTP/2.
#[inline(always)]
pub fn is_h2_frame(h: &[u8; 9]) -> bool {
    let len = u32::from(h[0]) << 16 | u32::from(h[1]) << 8 | u32::from(h[2]);
    let flags_ok = match h[3] {
        // END_STREAM, END_HEADERS, PADDED, PRIORITY.
        1 => h[4] & !0x2d == 0,
        // END_STREAM, PADDED.
        0 => h[4] & !0x09 == 0,
        _ => false,
    };
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
    flags_ok && len >= 1 && len <= 16_384 && stream != 0 && stream & 0x8000_0000 == 0
}

/// Copies `size` (at most [`DATA_CAPTURE`] - `at`) bytes of user memory at
/// `src` into the record's data at `at`.
#[inline(always)]
unsafe fn copy_user(ev: *mut PlaintextEvent, at: usize, src: u64, size: u32) -> bool {
    use aya_ebpf::helpers::generated::bpf_probe_read_user;
    let dst = (*ev).data.as_mut_ptr().add(at).cast();
    if size as usize > DATA_CAPTURE - at {
        return false;
    }
    bpf_probe_read_user(dst, verifier_bound(size), src as *const _) == 0
}

/// `size` (below [`DATA_CAPTURE`], a power of two) masked in the register
/// the helper gets. The check above bounds it for LLVM, which then drops a
/// plain mask and may pass a copy it reloads from the stack, spilled before
/// the check: verifiers before 6.8 do not carry the bound to that copy and
/// refused the program (6.1: "R2 min value is negative"). The mask, opaque
/// to LLVM, bounds the very register.
#[inline(always)]
fn verifier_bound(size: u32) -> u32 {
    const { assert!(DATA_CAPTURE.is_power_of_two()) };
    let mut n = u64::from(size);
    // SAFETY: an AND on a register; no memory, no stack.
    unsafe {
        core::arch::asm!(
            "{n} &= {mask}",
            n = inout(reg) n,
            mask = const DATA_CAPTURE - 1,
            options(pure, nomem, nostack),
        );
    }
    n as u32
}

/// Sends a plaintext call's bytes (all of them up to DATA_CAPTURE, else its
/// first and last halves) for the HTTP parser. The connection's first call
/// that moves data decides whether it is HTTP (1.x, or 2 from the client's
/// preface); one that is not is never copied again.
#[inline(always)]
pub fn emit_tls_plaintext(
    sk: u64,
    op: u8,
    buf: u64,
    n: u64,
    entry_ns: u64,
    now: u64,
    tls: &mut TlsConn,
) {
    if tls.http == http::NO || buf == 0 {
        return;
    }
    // A call that returns after its connection closed has the timings kept
    // at the close, and the connection as it was then: a new one may have
    // the socket by now.
    let conn = if tls.flags & TLS_CLOSED == 0 {
        CONNS.get_ptr(&sk)
    } else {
        CLOSED_CONNS.get_ptr(&sk)
    };
    let Some(conn) = conn else {
        return;
    };
    let Some(mut entry) = reserve::<PlaintextEvent>(EventKind::Plaintext, now) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // The socket's first payload sent after the handshake: none before this
    // call's entry means no exchange before it was missed. Only what was
    // sent tells: a packet received (a TLS 1.3 session ticket, a request
    // waiting for a busy server) may arrive before the call that reads it.
    let first_io = tls.sk_send_after_hs_ns;
    // Go's and rustls's probes are never put on after a handshake they saw
    // (rustls's TLS 1.2 handshake read on the wire marks the socket's first
    // send), and Go's client reads (the server's session tickets) from the socket inside
    // a Read begun before its first write: the socket cannot tell there.
    // One value, not a chain of branches: each branch here multiplies the
    // paths the verifier walks in the programs that inline this.
    let own_start = (tls.library == library::GO) | (tls.library == library::RUSTLS);
    let none_before = (first_io == 0) | (first_io >= entry_ns);
    let from_start =
        (tls.flags & TLS_MIDSTREAM == 0) & (tls.hs_end_ns != 0) & (own_start | none_before);
    // SAFETY: `ev` points at a reserved record of the right size; `conn` at
    // a live map value.
    let ok = unsafe {
        (*ev).flags = 0;
        copy_words(&raw mut (*ev).conn, conn);
        (*ev).entry_ns = entry_ns;
        (*ev).ret_ns = now;
        (*ev).len = n as u32;
        (*ev).op = op;
        (*ev).flags = if from_start { DATA_FROM_START } else { 0 };
        (*ev).hs_start_ns = tls.hs_start_ns;
        (*ev).hs_end_ns = tls.hs_end_ns;
        (*ev).library = tls.library;
        (*ev)._pad = 0;
        // Below DATA_CAPTURE whole (the mask in `copy_user` keeps that
        // size); else its halves, of fixed size (a call of exactly
        // DATA_CAPTURE bytes is both halves: the same bytes).
        if n < DATA_CAPTURE as u64 {
            copy_user(ev, 0, buf, n as u32)
        } else {
            copy_user(ev, 0, buf, DATA_HALF as u32)
                && copy_user(ev, DATA_HALF, buf + n - DATA_HALF as u64, DATA_HALF as u32)
        }
    };
    if ok && tls.http == http::UNKNOWN {
        // SAFETY: as above; at least one byte was copied, four are read.
        let start = unsafe {
            u32::from_le_bytes([(*ev).data[0], (*ev).data[1], (*ev).data[2], (*ev).data[3]])
        };
        // SAFETY: as above; nine bytes read when the call moved as many.
        let h2 = !from_start
            && n >= 9
            && is_h2_frame(unsafe { &*(*ev).data.as_ptr().cast::<[u8; 9]>() });
        if (n >= 4 && is_http(start)) || h2 {
            tls.http = http::YES;
        } else if from_start {
            tls.http = http::NO;
        } else {
            // Probes that came on mid-connection may first see the rest of
            // an answer; the next request shows whether it is HTTP.
            tls.http_looks = tls.http_looks.saturating_add(1);
            if tls.http_looks >= http::MIDSTREAM_LOOKS {
                tls.http = http::NO;
            }
        }
    }
    if ok && tls.http == http::YES {
        entry.submit(submit_flags());
    } else {
        entry.discard(0);
    }
}
