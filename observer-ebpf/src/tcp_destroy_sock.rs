//! `tcp:tcp_destroy_sock`: the socket is freed. Format: skaddr, ports, family,
//! addresses, sock_cookie.
//!
//! A connection's record goes out here rather than at CLOSE: the kernel moves
//! to CLOSE before it sends the RST of an aborting close() and before the
//! error report of a timeout, and both belong in the record. The end time is
//! still the CLOSE transition's.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::tracepoints::tcp_destroy_sock as f;

use crate::{
    ctx::{field, now_ns},
    events::{emit_close, sk_err, sk_srtt_us},
    maps::CONNS,
};

#[tracepoint]
pub fn tcp_destroy_sock(ctx: TracePointContext) -> u32 {
    let sk: u64 = field(&ctx, f::SKADDR);
    let Some(conn) = CONNS.get_ptr_mut(&sk) else {
        return 0;
    };
    let now = now_ns();
    // SAFETY: a pointer into a map value, valid for this program run.
    unsafe {
        if (*conn).end_ns == 0 {
            (*conn).end_ns = now;
        }
        if (*conn).error == 0 {
            (*conn).error = sk_err(sk);
        }
        if (*conn).srtt_us == 0 {
            (*conn).srtt_us = sk_srtt_us(sk);
        }
    }
    emit_close(sk, conn, now);
    0
}
