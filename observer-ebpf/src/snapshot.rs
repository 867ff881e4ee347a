//! `conn_counters`: never attached; userspace runs it (BPF_PROG_TEST_RUN)
//! with a socket's address before it reports that connection while open,
//! to copy the kernel's byte and segment counters into its CONNS entry.
//! Records of closed connections get them in `events::emit_close`.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

use crate::{events::copy_counters, maps::CONNS};

#[raw_tracepoint(tracepoint = "conn_counters")]
pub fn conn_counters(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let Some(conn) = CONNS.get_ptr_mut(&sk) else {
        return 1;
    };
    // SAFETY: a pointer into a map value, valid for this program run.
    copy_counters(sk, unsafe { &mut *conn });
    0
}
