//! `tcp:tcp_destroy_sock`, as a raw tracepoint: the socket is freed. Its
//! one argument is the socket; raw, the kernel builds no trace record for
//! it (the classic record, ports and addresses, went unread) and guards
//! recursion per program, not per CPU (a classic tracepoint is skipped while
//! any other tracing program runs on its CPU).
//!
//! A connection's record goes out here rather than at CLOSE: the kernel moves
//! to CLOSE before it sends the RST of an aborting close() and before the
//! error report of a timeout, and both belong in the record. The end time is
//! still the CLOSE transition's.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

use crate::{
    ctx::now_ns,
    events::{emit_close, sk_err, sk_srtt_us},
    maps::CONNS,
};

#[raw_tracepoint(tracepoint = "tcp_destroy_sock")]
pub fn tcp_destroy_sock(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
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
