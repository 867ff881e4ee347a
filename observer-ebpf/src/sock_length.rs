//! `sock:sock_send_length` and `sock:sock_recv_length`, attached as raw
//! tracepoints: bytes moved on a socket, reported from sock_sendmsg /
//! sock_recvmsg in the calling task's context.
//!
//! Prototype: `(struct sock *sk, int ret, int flags)`. They fire for every send
//! and receive on the machine, every socket family, so the program is as short
//! as it can be: a raw tracepoint skips building the trace record (cheaper than
//! a classic tracepoint), and the CONNS lookup alone tells TCP sockets we track
//! from everything else (no family or protocol test needed).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use observer_common::{Conn, FLAG_OWNED, FLAG_TLS, FLAG_TLS_RECORDS, FLAG_TLS_TIMED};

use crate::{
    ctx::now_ns,
    events::{emit_owner, sk_srtt_us},
    maps::{own_tgid, CONNS, OWN_SOCKS},
    tls_state,
};

/// recvmsg flag: data was only looked at, it is still queued.
const MSG_PEEK: i32 = 2;

#[raw_tracepoint(tracepoint = "sock_send_length")]
pub fn sock_send_length(ctx: RawTracePointContext) -> i32 {
    try_io(&ctx, true);
    0
}

#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn sock_recv_length(ctx: RawTracePointContext) -> i32 {
    try_io(&ctx, false);
    0
}

#[inline(always)]
fn try_io(ctx: &RawTracePointContext, tx: bool) -> Option<()> {
    let ret: i32 = ctx.arg(1);
    if ret <= 0 || (!tx && ctx.arg::<i32>(2) & MSG_PEEK != 0) {
        return None;
    }
    let sk: u64 = ctx.arg(0);
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run. The BPF
    // target has no atomic read-modify-write in Rust's core, so two threads
    // writing the same socket at the same instant on two CPUs may lose one
    // update; sockets are almost never written concurrently.
    let conn = unsafe { &mut *conn };
    if conn.flags & FLAG_OWNED == 0 && !claim(sk, conn, now_ns()) {
        return None;
    }
    // TLS sessions are tied by their descriptor (`SSL_set_fd`, Go, rustls)
    // or by the packets their calls send (`http_packets`), never here.
    if conn.flags & FLAG_TLS != 0
        && conn.flags & FLAG_TLS_TIMED == 0
        && tls_state::socket_io(sk, tx)
    {
        conn.flags |= FLAG_TLS_TIMED;
    }
    let (first, bytes, calls) = if tx {
        (
            &mut conn.first_tx_ns,
            &mut conn.bytes_tx,
            &mut conn.tx_calls,
        )
    } else {
        (
            &mut conn.first_rx_ns,
            &mut conn.bytes_rx,
            &mut conn.rx_calls,
        )
    };
    // The clock is read once per direction, not per call: this runs for every
    // send and receive on the machine.
    if *first == 0 {
        *first = now_ns();
        // Once per direction, so snapshots of open connections carry an RTT.
        conn.srtt_us = sk_srtt_us(sk);
    }
    *bytes += ret as u64;
    *calls = calls.wrapping_add(1);
    Some(())
}

/// Gives an ownerless (inbound) connection to the current process. Returns false
/// when the connection belongs to the observer itself and was dropped.
#[inline(always)]
fn claim(sk: u64, conn: &mut Conn, now: u64) -> bool {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == own_tgid() {
        let _ = OWN_SOCKS.insert(&sk, &0, 0);
        let _ = CONNS.remove(&sk);
        return false;
    }
    conn.pid = tgid;
    conn.tid = pid_tgid as u32;
    conn.comm = bpf_get_current_comm().unwrap_or_default();
    conn.flags |= FLAG_OWNED;
    if conn.flags & FLAG_TLS_RECORDS != 0 {
        // Its TLS context was made before the observer started: the
        // per-call probes would otherwise never come for it.
        tls_state::announce_tgid(tgid, now);
    }
    emit_owner(sk, conn, now);
    true
}
