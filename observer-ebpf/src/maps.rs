//! Maps shared by all probe families, and small helpers over them.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    Conn, Counter, ErrorSlot, COUNTER_SLOTS, DEFAULT_MAX_CONNECTIONS, DEFAULT_RING_BYTES,
};

#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// Socket pointer -> live connection. LRU so that a missed CLOSE can never fill
/// it; userspace notices evictions (a connection it knows vanished without a
/// close event) and counts them.
#[map(name = "CONNS")]
pub static CONNS: LruHashMap<u64, Conn> = LruHashMap::with_max_entries(DEFAULT_MAX_CONNECTIONS, 0);

#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

#[map(name = "ERROR_SLOT")]
pub static ERROR_SLOT: PerCpuArray<ErrorSlot> = PerCpuArray::with_max_entries(1, 0);

/// The observer's own tgid, set at load time; its sockets are never tracked.
#[no_mangle]
static OWN_TGID: u32 = 0;

#[inline(always)]
pub fn own_tgid() -> u32 {
    // SAFETY: read_volatile keeps the compiler from folding the load-time constant.
    unsafe { core::ptr::read_volatile(&OWN_TGID) }
}

#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer while this program runs on this CPU.
        unsafe { *slot += 1 };
    }
}
