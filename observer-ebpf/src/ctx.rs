//! Reading tracepoint records.

use aya_ebpf::{programs::TracePointContext, EbpfContext};

/// Reads a field of the raw tracepoint record at `offset`.
///
/// Tracepoint programs may load from their context directly; that is cheaper than
/// `bpf_probe_read_kernel`. The verifier wants the load aligned to its size, which
/// every offset in `observer_common::tracepoints` is (userspace checks them against
/// the kernel's format files before attaching).
#[inline(always)]
pub fn field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: the offset lies inside the tracepoint record (checked against the
    // format file at load time) and the verifier bounds-checks context loads.
    unsafe { core::ptr::read_volatile((ctx.as_ptr() as *const u8).add(offset) as *const T) }
}

/// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, the clock userspace converts from.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper with no arguments.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}
