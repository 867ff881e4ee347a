//! Records sent to userspace through the ring buffer. A failed reservation is
//! counted, never silent.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{CloseEvent, Conn, Counter, EventKind, OwnerEvent};

use crate::maps::{count, sk_err_offset, srtt_us_offset, wakeup_bytes, CONNS, EVENTS};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Waking the reader for every record costs over a microsecond each; instead
/// the reader polls on a short timer and is woken only when the ring holds
/// more than WAKEUP_BYTES, so a burst can never outrun the timer.
#[inline(always)]
pub fn submit_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= wakeup_bytes() {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

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
            entry.submit(submit_flags());
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
            entry.submit(submit_flags());
        }
        None => count(Counter::RingFull),
    }
    count(Counter::Closed);
    let _ = CONNS.remove(&sk);
}

/// Reads a 32-bit field of the socket at `off` (0: offset unknown -> 0).
#[inline(always)]
fn sk_u32(sk: u64, off: u32) -> u32 {
    if off == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address; `sk` is a live
    // socket passed by the tracepoint.
    unsafe { bpf_probe_read_kernel((sk + u64::from(off)) as *const u32) }.unwrap_or(0)
}

/// The socket's pending error (`sk->sk_err`), positive.
#[inline(always)]
pub fn sk_err(sk: u64) -> u32 {
    (sk_u32(sk, sk_err_offset()) as i32).unsigned_abs()
}

/// The smoothed RTT in microseconds (`tcp_sk(sk)->srtt_us >> 3`). Read from the
/// socket when needed rather than from tcp:tcp_probe, which would run for every
/// received segment.
#[inline(always)]
pub fn sk_srtt_us(sk: u64) -> u32 {
    sk_u32(sk, srtt_us_offset()) >> 3
}
