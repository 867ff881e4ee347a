//! `sched:sched_process_exec` and `sched:sched_process_exit`: tell userspace when
//! a pid's executable changes (and to what) or its process ends, so cached
//! process details are never stale and short-lived processes still get their
//! executable. One record per exec or process exit. An exec of a file the
//! observer has not looked at yet may also be held (`exec_hold`).

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};
use observer_common::{
    tracepoints::{sched_process_exec as f, sys_enter_mmap as m},
    EventKind, ExecEvent, ProcessEvent,
};

use crate::{
    ctx::{field, now_ns},
    events::{reserve, submit_flags},
    exec_hold::{maybe_hold, maybe_hold_mapping},
};

/// Format: filename (__data_loc char[]), pid, old_pid.
#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let now = now_ns();
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(mut entry) = reserve::<ExecEvent>(EventKind::Exec, now) {
        let ev = entry.as_mut_ptr();
        // __data_loc: low 16 bits the offset of the string in the record,
        // high 16 bits its length.
        let loc: u32 = field(&ctx, f::FILENAME);
        let src = (ctx.as_ptr() as u64 + u64::from(loc & 0xffff)) as *const u8;
        // SAFETY: `ev` points at a reserved record of the right size; the
        // string read is bounded by the destination and tolerates a bad
        // source.
        unsafe {
            (*ev).pid = pid;
            (*ev)._pad = 0;
            (*ev).cgroup_id = bpf_get_current_cgroup_id();
            if bpf_probe_read_kernel_str_bytes(src, &mut (*ev).filename).is_err() {
                (*ev).filename[0] = 0;
            }
        }
        entry.submit(submit_flags());
    }
    maybe_hold(pid, now);
    0
}

/// Every mmap: one of a file not looked at yet, mapped executable, may be
/// held (`exec_hold`).
#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let prot: u64 = field(&ctx, m::PROT);
    let fd: u64 = field(&ctx, m::FD);
    maybe_hold_mapping(prot, fd);
    0
}

/// Fires for every exiting thread; only the thread group leader's exit ends the
/// process.
#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid >> 32 != pid_tgid & 0xffff_ffff {
        return 0;
    }
    if let Some(mut entry) = reserve::<ProcessEvent>(EventKind::Exit, now_ns()) {
        let ev = entry.as_mut_ptr();
        // SAFETY: `ev` points at a reserved record of the right size.
        unsafe {
            (*ev).pid = (pid_tgid >> 32) as u32;
            (*ev)._pad = 0;
        }
        entry.submit(submit_flags());
    }
    0
}
