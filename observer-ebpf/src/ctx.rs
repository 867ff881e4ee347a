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

/// Copies a `T` eight bytes at a time. Rust lowers `*dst = *src` of a
/// struct this size to a `memmove` call, which for BPF is aya-ebpf's byte
/// loop: a 192-byte `Conn` took ~600 instructions, and under connection
/// churn those loops were a fifth of all the programs' time. Volatile moves
/// keep LLVM from folding the loop back into that call.
///
/// # Safety
/// Both pointers valid for a `T` and eight-aligned (a byte array inside a
/// record at an eight-aligned offset is fine); `T`'s size a multiple of 8,
/// checked at compile time.
#[inline(always)]
pub unsafe fn copy_words<T>(dst: *mut T, src: *const T) {
    const { assert!(core::mem::size_of::<T>() % 8 == 0) };
    let (d, s) = (dst.cast::<u64>(), src.cast::<u64>());
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: inside both `T`s, per the caller.
        unsafe { core::ptr::write_volatile(d.add(i), core::ptr::read_volatile(s.add(i))) };
    }
}

/// Zeroes a `T` eight bytes at a time (the `memset` twin of [`copy_words`]).
///
/// # Safety
/// As [`copy_words`], for `dst`.
#[inline(always)]
pub unsafe fn zero_words<T>(dst: *mut T) {
    const { assert!(core::mem::size_of::<T>() % 8 == 0) };
    let d = dst.cast::<u64>();
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: inside the `T`, per the caller.
        unsafe { core::ptr::write_volatile(d.add(i), 0) };
    }
}

/// Zeroes `slot` with [`zero_words`] and hands it out as a `T` (`T {
/// ..T::default() }` of a big record is a byte-loop `memset` call; a
/// function returning the zeroed `T` by value would put a second copy of it
/// on the 512-byte stack).
/// For plain-data records only: all zeroes must be a valid `T`.
#[inline(always)]
pub fn zeroed_in<T: Copy>(slot: &mut core::mem::MaybeUninit<T>) -> &mut T {
    const { assert!(core::mem::align_of::<T>() >= 8) };
    // SAFETY: the slot is a `T`, eight-aligned (asserted); the records this
    // is used for are integers and byte arrays, valid as all zeroes.
    unsafe {
        zero_words(slot.as_mut_ptr());
        slot.assume_init_mut()
    }
}

/// The current task's name, written straight into `dst`: aya's
/// `bpf_get_current_comm` zeroes an array of its own first (a byte-loop
/// `memset`) and returns it by value (a copy). Zeroed on failure (the
/// helper does that).
#[inline(always)]
pub fn current_comm_into(dst: &mut [u8; 16]) {
    // SAFETY: `dst` is 16 writable bytes.
    unsafe { aya_ebpf::helpers::generated::bpf_get_current_comm(dst.as_mut_ptr().cast(), 16) };
}
