//! `tcp:tcp_retransmit_skb`, `tcp:tcp_receive_reset` and `tcp:tcp_send_reset`:
//! the health of a tracked connection. All carry the socket pointer; sockets we
//! do not track cost one map lookup. (The RTT is read from the socket instead
//! of tcp:tcp_probe, which runs for every received segment.)

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{tracepoints, FLAG_RESET_RX};

use crate::{ctx::field, maps::CONNS};

/// Format: skbaddr, skaddr, state, sport, dport, family, addresses, err.
#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let sk: u64 = field(&ctx, tracepoints::tcp_retransmit_skb::SKADDR);
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe { (*conn).retransmits = (*conn).retransmits.wrapping_add(1) };
    }
    0
}

/// Format: skaddr, sport, dport, family, addresses, sock_cookie. Fires before
/// the socket is torn down, so the CLOSE that follows can tell "refused" (RST in
/// SYN_SENT) and "reset" apart from an orderly close.
#[tracepoint]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    let sk: u64 = field(&ctx, tracepoints::tcp_receive_reset::SKADDR);
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe {
            (*conn).resets_rx = (*conn).resets_rx.saturating_add(1);
            (*conn).flags |= FLAG_RESET_RX;
        }
    }
    0
}

/// Format: skbaddr, skaddr (NULL when answering a segment for no socket), state,
/// reason, saddr[28], daddr[28].
#[tracepoint]
pub fn tcp_send_reset(ctx: TracePointContext) -> u32 {
    let sk: u64 = field(&ctx, tracepoints::tcp_send_reset::SKADDR);
    if sk == 0 {
        return 0;
    }
    if let Some(conn) = CONNS.get_ptr_mut(&sk) {
        // SAFETY: map value valid for this program run.
        unsafe { (*conn).resets_tx = (*conn).resets_tx.saturating_add(1) };
    }
    0
}
