//! Stops a process at exec when the observer has not looked at its
//! executable yet, so the probes the file needs (a Go program's TLS) are on
//! before its first instruction. See `observer_common::hold`.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel,
        generated::bpf_send_signal,
    },
    macros::map,
    maps::{Array, LruHashMap, RingBuf},
};
use observer_common::{
    hold::{ExeKey, ExeWalk, HoldEvent, HOLDS_RING_BYTES, HOLD_EXEC, HOLD_MAPPING, MAX_KNOWN_EXES},
    Counter,
};

use crate::{
    ctx::now_ns,
    fds::file_of,
    maps::{count, fd_walk, own_tgid},
};

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
const PROT_EXEC: u64 = 4;

#[inline(always)]
fn kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper tolerates any kernel address.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// Whether the current task runs unattended: not one on a terminal, whose
/// shell (with job control) would see its foreground job stop and take the
/// prompt back.
#[inline(always)]
fn unattended(w: &ExeWalk, task: u64) -> Option<()> {
    let signal: u64 = kernel(task + u64::from(w.task_signal))?;
    let tty: u64 = kernel(signal + u64::from(w.signal_tty))?;
    (tty == 0).then_some(())
}

/// The file behind a `struct file *`, as its inode names it.
#[inline(always)]
fn file_key(w: &ExeWalk, file: u64) -> Option<ExeKey> {
    let inode: u64 = kernel(file + u64::from(w.file_inode))?;
    let ino: u64 = kernel(inode + u64::from(w.inode_ino))?;
    let sb: u64 = kernel(inode + u64::from(w.inode_sb))?;
    let dev: u32 = kernel(sb + u64::from(w.sb_dev))?;
    Some(ExeKey { ino, dev, _pad: 0 })
}

/// The inode number of the current task's executable; None where BTF did
/// not give the walk.
#[inline(always)]
pub fn current_exe_ino() -> Option<u64> {
    // SAFETY: a load-time constant.
    let w = unsafe { core::ptr::read_volatile(&EXE_WALK) };
    if w.task_mm == 0 {
        return None;
    }
    // SAFETY: a helper returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = kernel(task + u64::from(w.task_mm))?;
    let file: u64 = kernel(mm + u64::from(w.mm_exe_file))?;
    let inode: u64 = kernel(file + u64::from(w.file_inode))?;
    kernel(inode + u64::from(w.inode_ino))
}

/// The walk, while holding is on (the manager keeps `HOLD_UNTIL` ahead of
/// the clock): one array lookup when it is off.
#[inline(always)]
fn holding(now: u64) -> Option<ExeWalk> {
    let until = HOLD_UNTIL.get(0)?;
    if now >= *until {
        return None;
    }
    // SAFETY: a load-time constant.
    let w = unsafe { core::ptr::read_volatile(&EXE_WALK) };
    (w.task_mm != 0).then_some(w)
}

/// Called at every exec: one array lookup while holding is off, a hash
/// lookup for a known executable.
#[inline(always)]
pub fn maybe_hold(pid: u32, now: u64) {
    let Some(w) = holding(now) else {
        return;
    };
    // SAFETY: a helper returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    if unattended(&w, task).is_none() {
        return;
    }
    let Some(exe) = kernel::<u64>(task + u64::from(w.task_mm))
        .and_then(|mm| kernel::<u64>(mm + u64::from(w.mm_exe_file)))
        .and_then(|file| file_key(&w, file))
    else {
        return;
    };
    hold(pid, now, exe, HOLD_EXEC);
}

/// Called at every mmap: a file mapped executable that the observer has not
/// looked at (a library opened with dlopen, which the loader maps while the
/// program runs: Python's ssl module maps libssl and may handshake within a
/// millisecond) holds its process too. The signal is taken on the way out of
/// the call, so the mapping is in place when userspace looks.
#[inline(always)]
pub fn maybe_hold_mapping(prot: u64, fd: u64) {
    // Anonymous memory and data mappings: the bulk of mmaps, passed at once.
    if prot & PROT_EXEC == 0 || fd > i32::MAX as u64 {
        return;
    }
    let now = now_ns();
    let Some(w) = holding(now) else {
        return;
    };
    // SAFETY: a helper returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    if unattended(&w, task).is_none() {
        return;
    }
    let Some(file) = file_of(&fd_walk(), task, fd) else {
        return;
    };
    let Some(key) = file_key(&w, file) else {
        return;
    };
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    hold(pid, now, key, HOLD_MAPPING);
}

/// Stops the current process unless `file` is known, and tells userspace.
/// Never the observer itself: nobody would resume it (it maps libraries
/// while it runs: the C library's name service modules, NVML).
#[inline(always)]
fn hold(pid: u32, now: u64, file: ExeKey, kind: u32) {
    if pid == own_tgid() {
        return;
    }
    // SAFETY: a shared read of a map value.
    if unsafe { EXE_KNOWN.get(&file) }.is_some() {
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
        (*ev).kind = kind;
        (*ev).exe = file;
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
