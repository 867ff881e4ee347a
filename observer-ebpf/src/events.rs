//! Records sent to userspace through the ring buffer. A failed reservation is
//! counted, never silent.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{CloseEvent, Conn, Counter, EventKind, OwnerEvent};

use crate::maps::{count, sk_err_offset, CONNS, EVENTS};

/// Tells userspace who owns `sk` so it can resolve the executable while the
/// process still exists.
#[inline(always)]
pub fn emit_owner(sk: u64, conn: &Conn, now: u64) {
    match EVENTS.reserve::<OwnerEvent>(0) {
        Some(mut entry) => {
            let ev = entry.as_mut_ptr();
            // SAFETY: `ev` points at a reserved record of the right size.
            unsafe {
                (*ev).hdr.kind = EventKind::Owner as u32;
                (*ev).hdr.size = core::mem::size_of::<OwnerEvent>() as u32;
                (*ev).hdr.ts_ns = now;
                (*ev).sk = sk;
                (*ev).pid = conn.pid;
                (*ev).tid = conn.tid;
                (*ev).comm = conn.comm;
                (*ev).direction = conn.direction;
                (*ev)._pad = [0; 7];
            }
            entry.submit(0);
        }
        None => count(Counter::RingFull),
    }
}

/// Sends the final record of `sk` and forgets it.
#[inline(always)]
pub fn emit_close(sk: u64, conn: *const Conn, now: u64) {
    match EVENTS.reserve::<CloseEvent>(0) {
        Some(mut entry) => {
            let ev = entry.as_mut_ptr();
            // SAFETY: `ev` points at a reserved record of the right size;
            // `conn` at a live map value.
            unsafe {
                (*ev).hdr.kind = EventKind::Close as u32;
                (*ev).hdr.size = core::mem::size_of::<CloseEvent>() as u32;
                (*ev).hdr.ts_ns = now;
                (*ev).conn = *conn;
            }
            entry.submit(0);
        }
        None => count(Counter::RingFull),
    }
    count(Counter::Closed);
    let _ = CONNS.remove(&sk);
}

/// The socket's pending error (`sk->sk_err`), or 0 when its offset is unknown.
#[inline(always)]
pub fn sk_err(sk: u64) -> u32 {
    let off = sk_err_offset();
    if off == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; `sk` is a live
    // socket passed by the tracepoint.
    unsafe { bpf_probe_read_kernel((sk + u64::from(off)) as *const i32) }
        .map_or(0, |e| e.unsigned_abs())
}
