//! `sock:sock_send_length` and `sock:sock_recv_length`: bytes moved on a socket,
//! reported from sock_sendmsg/sock_recvmsg in the calling task's context.
//!
//! Format (6.x): sk, family, protocol, ret, flags. They fire for every socket
//! family on the machine, so the family/protocol test comes first and the map
//! lookup only for TCP.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::tracepoint,
    programs::TracePointContext,
};
use observer_common::{
    tracepoints::sock_send_length as f, Conn, AF_INET, AF_INET6, FLAG_OWNED, IPPROTO_TCP,
};

use crate::{
    ctx::{field, now_ns},
    events::{emit_owner, sk_srtt_us},
    maps::{own_tgid, CONNS},
};

/// recvmsg flag: data was only looked at, it is still queued.
const MSG_PEEK: i32 = 2;

#[tracepoint]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    try_io(&ctx, true);
    0
}

#[tracepoint]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    try_io(&ctx, false);
    0
}

#[inline(always)]
fn try_io(ctx: &TracePointContext, tx: bool) -> Option<()> {
    // Both tracepoints share one layout (checked at load time).
    let family: u16 = field(ctx, f::FAMILY);
    if (family != AF_INET && family != AF_INET6) || field::<u16>(ctx, f::PROTOCOL) != IPPROTO_TCP {
        return None;
    }
    let ret: i32 = field(ctx, f::RET);
    if ret <= 0 || (!tx && field::<i32>(ctx, f::FLAGS) & MSG_PEEK != 0) {
        return None;
    }
    let sk: u64 = field(ctx, f::SK);
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run. The BPF
    // target has no atomic read-modify-write in Rust's core, so two threads
    // writing the same socket at the same instant on two CPUs may lose one
    // update; sockets are almost never written concurrently.
    let conn = unsafe { &mut *conn };
    if conn.flags & FLAG_OWNED == 0 && !claim(sk, conn, now_ns()) {
        return None;
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
        let _ = CONNS.remove(&sk);
        return false;
    }
    conn.pid = tgid;
    conn.tid = pid_tgid as u32;
    conn.comm = bpf_get_current_comm().unwrap_or_default();
    conn.flags |= FLAG_OWNED;
    emit_owner(sk, conn, now);
    true
}
