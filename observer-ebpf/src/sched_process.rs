//! `sched:sched_process_exec` and `sched:sched_process_exit`: tell userspace when
//! a pid's executable changes or its process ends, so cached process details
//! (exe path, name) are never stale. One record per exec or process exit.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use observer_common::{EventKind, ProcessEvent};

use crate::{
    ctx::now_ns,
    maps::{count, EVENTS},
};

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    emit((bpf_get_current_pid_tgid() >> 32) as u32, EventKind::Exec);
    0
}

/// Fires for every exiting thread; only the thread group leader's exit ends the
/// process.
#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid >> 32 == pid_tgid & 0xffff_ffff {
        emit((pid_tgid >> 32) as u32, EventKind::Exit);
    }
    0
}

#[inline(always)]
fn emit(pid: u32, kind: EventKind) {
    match EVENTS.reserve::<ProcessEvent>(0) {
        Some(mut entry) => {
            let ev = entry.as_mut_ptr();
            // SAFETY: `ev` points at a reserved record of the right size.
            unsafe {
                (*ev).hdr.kind = kind as u32;
                (*ev).hdr.size = core::mem::size_of::<ProcessEvent>() as u32;
                (*ev).hdr.ts_ns = now_ns();
                (*ev).pid = pid;
                (*ev)._pad = 0;
            }
            entry.submit(0);
        }
        None => count(observer_common::Counter::RingFull),
    }
}
