//! What any payload packet of a tracked connection tells, HTTP or not: the
//! first payload each way, an inbound connection's owner, and a TLS
//! connection's socket-level times after its handshake. Read by the
//! cgroup_skb programs (`http_packets`) until all of it is known; then the
//! socket is marked and its packets leave at the mark.
//!
//! This replaces per-call socket hooks (`sock_send_length` /
//! `sock_recv_length`), which ran for every send and receive of every
//! process: a connection's byte and segment totals come from the kernel's
//! own counters when its record is made (`events::copy_counters`).

use observer_common::{Conn, FLAG_OWNED, FLAG_TLS, FLAG_TLS_RECORDS, FLAG_TLS_TIMED};

use crate::{
    events::{emit_owner, sk_held_by_task, sk_srtt_us},
    maps::{own_tgid, sk_lock_owned_offset, CONNS, OWN_SOCKS},
    packet_task, tls_state,
};

/// Notes what payload packet (`egress`: leaving) of `conn` tells. False
/// when the connection turned out to be the observer's own: its entry is
/// gone and the socket must be marked.
#[inline(always)]
pub fn note(conn: &mut Conn, egress: bool, now: u64) -> bool {
    let untimed_tls = conn.flags & (FLAG_TLS | FLAG_TLS_TIMED) == FLAG_TLS;
    // Sent by a task's own call, not pushed out later from softirq by an
    // ACK (data Nagle held back: a TLS 1.3 server's second session ticket
    // leaves when the client's request acknowledges the first).
    let by_task =
        egress && (conn.flags & FLAG_OWNED == 0 || untimed_tls) && sk_held_by_task(conn.sk);
    if by_task && conn.flags & FLAG_OWNED == 0 && !claim(conn, now) {
        return false;
    }
    let first = if egress {
        &mut conn.first_tx_ns
    } else {
        &mut conn.first_rx_ns
    };
    if *first == 0 {
        *first = now;
        // Once per direction, so snapshots of open connections carry an RTT.
        conn.srtt_us = sk_srtt_us(conn.sk);
    }
    if untimed_tls && (!egress || by_task) && tls_state::socket_io(conn.sk, egress, now) {
        conn.flags |= FLAG_TLS_TIMED;
    }
    true
}

/// Whether the packets of `conn` have nothing more to tell here: its owner
/// (where the kernel lets us read who holds a socket), both first payloads,
/// and a TLS connection's socket times.
#[inline(always)]
pub fn settled(conn: &Conn) -> bool {
    let owned =
        conn.flags & FLAG_OWNED != 0 || sk_lock_owned_offset() == 0 || !packet_task::known();
    owned
        && conn.first_tx_ns != 0
        && conn.first_rx_ns != 0
        && conn.flags & (FLAG_TLS | FLAG_TLS_TIMED) != FLAG_TLS
}

/// Gives an ownerless (inbound, or adopted) connection to the task sending
/// its packet, which holds the socket: the kernel sends from softirq only
/// while no task holds it, so this is the task's own send, never an
/// interrupted one's. False when the connection is the observer's own.
/// True (nothing done) where the task cannot be known here.
#[inline(always)]
fn claim(conn: &mut Conn, now: u64) -> bool {
    let Some(pid_tgid) = packet_task::pid_tgid() else {
        return true;
    };
    let tgid = (pid_tgid >> 32) as u32;
    let sk = conn.sk;
    if tgid == own_tgid() {
        let _ = OWN_SOCKS.insert(&sk, &0, 0);
        let _ = CONNS.remove(&sk);
        return false;
    }
    conn.pid = tgid;
    conn.tid = pid_tgid as u32;
    // Else left as made (zeroes): userspace names it from the pid.
    packet_task::comm_into(&mut conn.comm);
    conn.flags |= FLAG_OWNED;
    if conn.flags & FLAG_TLS_RECORDS != 0 {
        // Its TLS context was made before the observer started: the
        // per-call probes would otherwise never come for it.
        tls_state::announce_tgid(tgid, now);
    }
    emit_owner(sk, conn, now);
    true
}
