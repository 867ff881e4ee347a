//! `sock:inet_sock_set_state`: the life of every TCP connection.
//!
//! Format (6.x): skaddr, oldstate, newstate, sport, dport, family, protocol,
//! saddr[4], daddr[4], saddr_v6[16], daddr_v6[16].
//!
//! CLOSE -> SYN_SENT runs inside connect(), in the connecting task: that is where
//! outbound connections get their owner. The passive side's SYN_RECV ->
//! ESTABLISHED runs in softirq, where the current task is unrelated, so inbound
//! connections are created ownerless and claimed by the first task that sends
//! a payload on them (see `conn_packets`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use observer_common::{
    tcp_state::*, tracepoints::inet_sock_set_state as f, Conn, Counter, AF_INET6, DIR_INBOUND,
    DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED, IPPROTO_TCP,
};

use crate::{
    ctx::{current_comm_into, field, now_ns, zeroed_in},
    events::{emit_close, emit_owner, sk_err, sk_srtt_us},
    maps::{count, emit_at_destroy, own_tgid, CONNS},
};

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    try_inet_sock_set_state(&ctx);
    0
}

#[inline(always)]
fn try_inet_sock_set_state(ctx: &TracePointContext) -> Option<()> {
    if field::<u16>(ctx, f::PROTOCOL) != IPPROTO_TCP {
        return None;
    }
    let sk: u64 = field(ctx, f::SKADDR);
    let old: i32 = field(ctx, f::OLDSTATE);
    let new: i32 = field(ctx, f::NEWSTATE);
    match (old, new) {
        (CLOSE, SYN_SENT) => on_connect(ctx, sk),
        (SYN_SENT, ESTABLISHED) => on_established(ctx, sk),
        (SYN_RECV, ESTABLISHED) => on_accepted(ctx, sk),
        (_, CLOSE) => on_close(ctx, sk, old),
        (ESTABLISHED, _) => on_closing(sk, new),
        _ => None,
    }
}

/// Copies the 4-tuple of the record into `conn`.
#[inline(always)]
fn fill_tuple(ctx: &TracePointContext, conn: &mut Conn) {
    conn.sport = field(ctx, f::SPORT);
    conn.dport = field(ctx, f::DPORT);
    conn.family = field(ctx, f::FAMILY);
    if conn.family == AF_INET6 {
        conn.saddr = field(ctx, f::SADDR_V6);
        conn.daddr = field(ctx, f::DADDR_V6);
    } else {
        let s: [u8; 4] = field(ctx, f::SADDR);
        let d: [u8; 4] = field(ctx, f::DADDR);
        conn.saddr[..4].copy_from_slice(&s);
        conn.daddr[..4].copy_from_slice(&d);
    }
}

fn on_connect(ctx: &TracePointContext, sk: u64) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == own_tgid() {
        return None;
    }
    let now = now_ns();
    let mut slot = core::mem::MaybeUninit::<Conn>::uninit();
    let conn = zeroed_in(&mut slot);
    conn.sk = sk;
    conn.start_ns = now;
    conn.pid = tgid;
    conn.tid = pid_tgid as u32;
    current_comm_into(&mut conn.comm);
    conn.direction = DIR_OUTBOUND;
    conn.flags = FLAG_OWNED;
    fill_tuple(ctx, conn);
    track(sk, conn, Counter::OutboundOpened, now)?;
    emit_owner(sk, conn, now);
    Some(())
}

fn on_established(ctx: &TracePointContext, sk: u64) -> Option<()> {
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run.
    let conn = unsafe { &mut *conn };
    conn.established_ns = now_ns();
    conn.flags |= FLAG_ESTABLISHED;
    // The source port and address are only final now.
    fill_tuple(ctx, conn);
    Some(())
}

fn on_accepted(ctx: &TracePointContext, sk: u64) -> Option<()> {
    let now = now_ns();
    let mut slot = core::mem::MaybeUninit::<Conn>::uninit();
    let conn = zeroed_in(&mut slot);
    conn.sk = sk;
    conn.start_ns = now;
    conn.established_ns = now;
    conn.direction = DIR_INBOUND;
    conn.flags = FLAG_ESTABLISHED;
    fill_tuple(ctx, conn);
    track(sk, conn, Counter::InboundOpened, now)
}

/// Starts tracking `conn`. An earlier connection still under the same socket
/// pointer is finished first: a socket may connect() again after a failed
/// attempt, and a CLOSE the kernel did not run us for leaves a stale entry.
#[inline(always)]
fn track(sk: u64, conn: &Conn, opened: Counter, now: u64) -> Option<()> {
    if let Some(prev) = CONNS.get_ptr(&sk) {
        count(Counter::Replaced);
        emit_close(sk, prev, now);
    }
    if CONNS.insert(&sk, conn, 0).is_err() {
        count(Counter::ConnInsertFailed);
        return None;
    }
    count(opened);
    Some(())
}

/// Leaving ESTABLISHED (FIN sent or received): keep the RTT the connection had
/// while it carried data, before the FIN exchange adds its own samples; the
/// peer's FIN (CLOSE_WAIT) is when it stopped taking requests.
fn on_closing(sk: u64, new: i32) -> Option<()> {
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run.
    unsafe {
        (*conn).srtt_us = sk_srtt_us(sk);
        if new == CLOSE_WAIT {
            (*conn).peer_fin_ns = now_ns();
        }
    }
    Some(())
}

/// Marks the connection closed. The kernel sets `sk_err` before it moves a
/// failed socket to CLOSE, so a timeout or unreachable host reads here.
fn on_close(ctx: &TracePointContext, sk: u64, old: i32) -> Option<()> {
    let Some(conn) = CONNS.get_ptr_mut(&sk) else {
        // Listeners and never-established children close too; only count the rest.
        if old != LISTEN && old != SYN_RECV {
            count(Counter::CloseUntracked);
        }
        return None;
    };
    let now = now_ns();
    // SAFETY: a pointer into a map value, valid for this program run.
    let c = unsafe { &mut *conn };
    c.end_ns = now;
    c.close_from_state = old as u32;
    c.error = sk_err(sk);
    if old == ESTABLISHED || c.srtt_us == 0 {
        c.srtt_us = sk_srtt_us(sk);
    }
    // A refused connect has its source port only now.
    c.sport = field(ctx, f::SPORT);
    if !emit_at_destroy() {
        emit_close(sk, conn, now);
    }
    Some(())
}
