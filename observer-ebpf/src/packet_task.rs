//! The task a packet program runs in (a packet sent in its own call, the
//! caller judges): the task helpers where the kernel lets a cgroup_skb
//! program call them (`bpf_get_current_pid_tgid` since 6.10,
//! `bpf_get_current_comm` later), else the same fields read from the
//! current `task_struct` at the offsets BTF gave. The flag and the offsets
//! are load-time constants, so an older verifier never walks the helper
//! call it would refuse.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel};

use crate::{
    ctx::current_comm_into,
    maps::{skb_task_comm, skb_task_pid, task_ids},
};

/// Whether the task can be known here at all.
#[inline(always)]
pub fn known() -> bool {
    skb_task_pid() || task_ids().tgid != 0
}

/// The current task's `pid_tgid` (tgid << 32 | pid), or None where neither
/// way is open.
#[inline(always)]
pub fn pid_tgid() -> Option<u64> {
    if skb_task_pid() {
        return Some(bpf_get_current_pid_tgid());
    }
    let ids = task_ids();
    if ids.tgid == 0 {
        return None;
    }
    // SAFETY: the helper reads any kernel address safely; the task pointer
    // is the current task's.
    unsafe {
        let task = bpf_get_current_task();
        if task == 0 {
            return None;
        }
        let tgid = bpf_probe_read_kernel((task + u64::from(ids.tgid)) as *const u32).ok()?;
        let pid = bpf_probe_read_kernel((task + u64::from(ids.pid)) as *const u32).ok()?;
        Some((u64::from(tgid) << 32) | u64::from(pid))
    }
}

/// The current task's name into `dst`; false (and `dst` untouched) where
/// neither way is open: userspace names it from the pid.
#[inline(always)]
pub fn comm_into(dst: &mut [u8; 16]) -> bool {
    if skb_task_comm() {
        current_comm_into(dst);
        return true;
    }
    let ids = task_ids();
    if ids.comm == 0 {
        return false;
    }
    // SAFETY: `dst` is 16 writable bytes; the helper reads any kernel
    // address safely (zeroing `dst` on failure).
    unsafe {
        let task = bpf_get_current_task();
        task != 0
            && aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                dst.as_mut_ptr().cast(),
                16,
                (task + u64::from(ids.comm)) as *const _,
            ) == 0
    }
}
