//! `sock:inet_sk_error_report`: the errno a socket is about to report
//! (ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH, ...).
//!
//! Format: error, sport, dport, family, protocol, addresses. There is no socket
//! pointer, but on timeouts and ICMP errors the kernel reports the error and then
//! closes the socket in the same call on the same CPU, so a per-CPU slot matched
//! by ports links the two (see `inet_sock_set_state::take_error`).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{tracepoints::inet_sk_error_report as f, IPPROTO_TCP};

use crate::{
    ctx::{field, now_ns},
    maps::ERROR_SLOT,
};

#[tracepoint]
pub fn inet_sk_error_report(ctx: TracePointContext) -> u32 {
    if field::<u16>(&ctx, f::PROTOCOL) != IPPROTO_TCP {
        return 0;
    }
    let error: i32 = field(&ctx, f::ERROR);
    if let Some(slot) = ERROR_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe {
            (*slot).ts_ns = now_ns();
            (*slot).error = error.unsigned_abs();
            (*slot).sport = field(&ctx, f::SPORT);
            (*slot).dport = field(&ctx, f::DPORT);
        }
    }
    0
}
