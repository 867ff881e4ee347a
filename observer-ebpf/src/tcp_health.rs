//! `tcp:tcp_retransmit_skb`, `tcp:tcp_receive_reset` and `tcp:tcp_send_reset`:
//! the health of a tracked connection. All take the socket first; sockets we
//! do not track cost one map lookup. (The RTT is read from the socket instead
//! of tcp:tcp_probe, which runs for every received segment.)
//!
//! Raw tracepoints: these run in softirq (a retransmit timer, a reset
//! received), where a classic tracepoint program is skipped if it interrupted
//! another tracing program on that CPU, and a lost reset turned "refused"
//! into "aborted". A raw one is guarded per program and builds no record.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use observer_common::FLAG_RESET_RX;

use crate::maps::CONNS;

/// Arguments: (sk, skb).
#[raw_tracepoint(tracepoint = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe { (*conn).retransmits = (*conn).retransmits.wrapping_add(1) };
    }
    0
}

/// Arguments: (sk). Fires before the socket is torn down, so the CLOSE that
/// follows can tell "refused" (RST in SYN_SENT) and "reset" apart from an
/// orderly close.
#[raw_tracepoint(tracepoint = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe {
            (*conn).resets_rx = (*conn).resets_rx.saturating_add(1);
            (*conn).flags |= FLAG_RESET_RX;
        }
    }
    0
}

/// Arguments: (sk, skb[, reason]); sk is NULL when answering a segment for no
/// socket.
#[raw_tracepoint(tracepoint = "tcp_send_reset")]
pub fn tcp_send_reset(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    if sk == 0 {
        return 0;
    }
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe { (*conn).resets_tx = (*conn).resets_tx.saturating_add(1) };
    }
    0
}
