//! Stops a process at exec when the observer has not looked at its
//! executable yet, so the probes the file needs (a Go program's TLS) are on
//! before its first instruction. See `observer_common::hold`.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, generated::bpf_send_signal},
    macros::map,
    maps::{Array, LruHashMap, RingBuf},
};
use observer_common::{
    hold::{ExeKey, ExeWalk, HoldEvent, HOLDS_RING_BYTES, MAX_KNOWN_EXES},
    Counter,
};

use crate::maps::count;

/// Executables the observer has looked at.
#[map(name = "EXE_KNOWN")]
static EXE_KNOWN: LruHashMap<ExeKey, u8> = LruHashMap::with_max_entries(MAX_KNOWN_EXES, 0);

/// Holding is on while the clock is below this.
#[map(name = "HOLD_UNTIL")]
static HOLD_UNTIL: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "HOLDS")]
static HOLDS: RingBuf = RingBuf::with_byte_size(HOLDS_RING_BYTES, 0);

/// Where the running kernel keeps a task's executable (from BTF).
#[no_mangle]
static EXE_WALK: ExeWalk = ExeWalk {
    task_mm: 0,
    mm_exe_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    task_signal: 0,
    signal_tty: 0,
};

const SIGSTOP: u32 = 19;

#[inline(always)]
fn kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper tolerates any kernel address.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// The current task's executable, or None for one on a terminal: a shell
/// with job control would see its foreground job stop and take the prompt
/// back.
#[inline(always)]
fn unattended_exe(w: &ExeWalk) -> Option<ExeKey> {
    // SAFETY: a helper returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    let signal: u64 = kernel(task + u64::from(w.task_signal))?;
    let tty: u64 = kernel(signal + u64::from(w.signal_tty))?;
    if tty != 0 {
        return None;
    }
    let mm: u64 = kernel(task + u64::from(w.task_mm))?;
    let file: u64 = kernel(mm + u64::from(w.mm_exe_file))?;
    let inode: u64 = kernel(file + u64::from(w.file_inode))?;
    let ino: u64 = kernel(inode + u64::from(w.inode_ino))?;
    let sb: u64 = kernel(inode + u64::from(w.inode_sb))?;
    let dev: u32 = kernel(sb + u64::from(w.sb_dev))?;
    Some(ExeKey { ino, dev, _pad: 0 })
}

/// Called at every exec: one array lookup while holding is off, a hash
/// lookup for a known executable.
#[inline(always)]
pub fn maybe_hold(pid: u32, now: u64) {
    let Some(until) = HOLD_UNTIL.get(0) else {
        return;
    };
    if now >= *until {
        return;
    }
    // SAFETY: a load-time constant.
    let w = unsafe { core::ptr::read_volatile(&EXE_WALK) };
    if w.task_mm == 0 {
        return;
    }
    let Some(exe) = unattended_exe(&w) else {
        return;
    };
    // SAFETY: a shared read of a map value.
    if unsafe { EXE_KNOWN.get(&exe) }.is_some() {
        return;
    }
    let Some(mut entry) = HOLDS.reserve::<HoldEvent>(0) else {
        count(Counter::ExecHoldFailed);
        return;
    };
    // SAFETY: a reserved record of the right size; the helper signals the
    // current process, which stops before it returns to user space.
    let sent = unsafe {
        let ev = entry.as_mut_ptr();
        (*ev).ts_ns = now;
        (*ev).pid = pid;
        (*ev)._pad = 0;
        (*ev).exe = exe;
        bpf_send_signal(SIGSTOP)
    };
    if sent != 0 {
        entry.discard(0);
        count(Counter::ExecHoldFailed);
        return;
    }
    entry.submit(aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP.into());
    count(Counter::ExecHeld);
}
