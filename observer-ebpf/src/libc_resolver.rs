//! Uprobes on the C library's resolver: `getaddrinfo(node, service, hints,
//! res)`, `gethostbyname_r` and `gethostbyname2_r` (which `gethostbyname`
//! and `gethostbyname2` call). The entry keeps the name and where the
//! answer will be; the return sends the lookup with up to four addresses of
//! the answer.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated as gen,
    },
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    dns::{
        DnsCall, DnsEvent, DNS_ADDRS, FUNC_GETADDRINFO, FUNC_GETHOSTBYNAME2_R,
        FUNC_GETHOSTBYNAME_R, MAX_DNS_THREADS,
    },
    EventKind, AF_INET, AF_INET6,
};

use crate::{
    ctx::{copy_words, current_comm_into, now_ns, zero_words},
    events::{reserve, submit_flags},
    maps::own_tgid,
};

#[map(name = "DNS_CALLS")]
pub static DNS_CALLS: LruHashMap<u64, DnsCall> = LruHashMap::with_max_entries(MAX_DNS_THREADS, 0);

/// Scratch for building a call (too big for the stack beside the rest).
#[map(name = "DNS_SCRATCH")]
static DNS_SCRATCH: PerCpuArray<DnsCall> = PerCpuArray::with_max_entries(1, 0);

// struct addrinfo on 64-bit glibc and musl.
const AI_FAMILY: u64 = 4;
const AI_ADDR: u64 = 24;
const AI_NEXT: u64 = 40;
// struct hostent on 64-bit.
const H_ADDRTYPE: u64 = 16;
const H_ADDR_LIST: u64 = 24;
// h_errno values, and the EAI_* codes they become.
const HOST_NOT_FOUND: i32 = 1;
const TRY_AGAIN: i32 = 2;
const NO_DATA: i32 = 4;
const EAI_NONAME: i32 = -2;
const EAI_AGAIN: i32 = -3;
const EAI_FAIL: i32 = -4;
const EAI_NODATA: i32 = -5;
const ERANGE: i32 = 34;
/// A call older than this on the same thread was never seen returning (a
/// thread cancelled inside it): a new one replaces it.
const STALE_NS: u64 = 60_000_000_000;

#[uprobe]
pub fn getaddrinfo(ctx: ProbeContext) -> u32 {
    let _ = (|| {
        let hints: u64 = ctx.arg(2)?;
        let family = if hints == 0 {
            0
        } else {
            // SAFETY: a user read through the helper.
            unsafe { bpf_probe_read_user((hints + AI_FAMILY) as *const i32) }.unwrap_or(0) as u32
        };
        enter(FUNC_GETADDRINFO, ctx.arg(0)?, family, ctx.arg(3)?, 0)
    })();
    0
}

#[uprobe]
pub fn gethostbyname_r(ctx: ProbeContext) -> u32 {
    // (name, ret, buf, buflen, result, h_errnop)
    let _ = (|| {
        enter(
            FUNC_GETHOSTBYNAME_R,
            ctx.arg(0)?,
            u32::from(AF_INET),
            ctx.arg(4)?,
            ctx.arg(5)?,
        )
    })();
    0
}

#[uprobe]
pub fn gethostbyname2_r(ctx: ProbeContext) -> u32 {
    // (name, af, ret, buf, buflen, result, h_errnop): the seventh argument is
    // on the stack, above the return address.
    let _ = (|| {
        let af: u64 = ctx.arg(1)?;
        // SAFETY: the probed thread's registers, and a user read through
        // the helper.
        let sp = unsafe { (*ctx.regs).rsp };
        let errno_ptr: u64 = unsafe { bpf_probe_read_user((sp + 8) as *const u64) }.unwrap_or(0);
        enter(
            FUNC_GETHOSTBYNAME2_R,
            ctx.arg(0)?,
            af as u32,
            ctx.arg(5)?,
            errno_ptr,
        )
    })();
    0
}

fn enter(func: u32, node: u64, family: u32, res: u64, errno_ptr: u64) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if (pid_tgid >> 32) as u32 == own_tgid() || node == 0 {
        return None;
    }
    let now = now_ns();
    // A resolver function called by another is part of the outer lookup.
    if let Some(outer) = DNS_CALLS.get_ptr(&pid_tgid) {
        // SAFETY: a live map value.
        if now.saturating_sub(unsafe { (*outer).start_ns }) < STALE_NS {
            return None;
        }
    }
    let call = DNS_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: the per-CPU scratch slot; user reads go through the helpers.
    unsafe {
        (*call).start_ns = now;
        (*call).res_ptr = res;
        (*call).errno_ptr = errno_ptr;
        (*call).family = family;
        (*call).func = func;
        if bpf_probe_read_user_str_bytes(node as *const u8, &mut (*call).name).is_err() {
            return None;
        }
        let _ = DNS_CALLS.insert(&pid_tgid, &*call, 0);
    }
    Some(())
}

#[uretprobe]
pub fn getaddrinfo_ret(ctx: RetProbeContext) -> u32 {
    let _ = exit(&ctx, FUNC_GETADDRINFO);
    0
}

#[uretprobe]
pub fn gethostbyname_r_ret(ctx: RetProbeContext) -> u32 {
    let _ = exit(&ctx, FUNC_GETHOSTBYNAME_R);
    0
}

#[uretprobe]
pub fn gethostbyname2_r_ret(ctx: RetProbeContext) -> u32 {
    let _ = exit(&ctx, FUNC_GETHOSTBYNAME2_R);
    0
}

/// Copies an address of `family` at `at` into slot `i` of the record.
///
/// # Safety
/// `ev` points at a reserved record; `at` is read through the helper.
#[inline(always)]
unsafe fn put_addr(ev: *mut DnsEvent, i: usize, family: u16, at: u64) -> bool {
    if at == 0 {
        return false;
    }
    // Read straight into the zeroed slot (an array built on the stack and
    // assigned is a byte-loop memmove); left zero when the read fails.
    let slot = core::ptr::addr_of_mut!((*ev).addrs[i]).cast::<core::ffi::c_void>();
    if family == AF_INET {
        gen::bpf_probe_read_user(slot, 4, at as *const core::ffi::c_void);
    } else if family == AF_INET6 {
        gen::bpf_probe_read_user(slot, 16, at as *const core::ffi::c_void);
    } else {
        return false;
    }
    (*ev).families[i] = family;
    true
}

fn exit(ctx: &RetProbeContext, func: u32) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let call = DNS_CALLS.get_ptr(&pid_tgid)?;
    // SAFETY: a live map value.
    if unsafe { (*call).func } != func {
        return None;
    }
    let mut ret: i32 = ctx.ret();
    // SAFETY: a live map value; user memory is read through the helper.
    let hostent: u64 = if func == FUNC_GETADDRINFO {
        0
    } else {
        if ret == ERANGE {
            // The caller grows its buffer and calls again: that call is the lookup.
            let _ = DNS_CALLS.remove(&pid_tgid);
            return None;
        }
        let h = unsafe { bpf_probe_read_user((*call).res_ptr as *const u64) }.unwrap_or(0);
        if h == 0 {
            let herr = unsafe { bpf_probe_read_user((*call).errno_ptr as *const i32) }.unwrap_or(0);
            ret = match herr {
                HOST_NOT_FOUND => EAI_NONAME,
                TRY_AGAIN => EAI_AGAIN,
                NO_DATA => EAI_NODATA,
                _ => EAI_FAIL,
            };
        } else {
            ret = 0;
        }
        h
    };
    let now = now_ns();
    let mut entry = reserve::<DnsEvent>(EventKind::Dns, now)?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is a reserved record of the right size, `call` a live map
    // value; user memory is read through the helper.
    unsafe {
        (*ev).pid = (pid_tgid >> 32) as u32;
        (*ev).tid = pid_tgid as u32;
        (*ev).start_ns = (*call).start_ns;
        (*ev).end_ns = now;
        (*ev).ret = ret;
        (*ev).family = (*call).family;
        (*ev).func = func;
        current_comm_into(&mut (*ev).comm);
        copy_words(&raw mut (*ev).name, &raw const (*call).name);
        zero_words(&raw mut (*ev).families);
        zero_words(&raw mut (*ev).addrs);
        let mut n = 0u32;
        if ret == 0 && func == FUNC_GETADDRINFO && (*call).res_ptr != 0 {
            let mut ai: u64 = bpf_probe_read_user((*call).res_ptr as *const u64).unwrap_or(0);
            for i in 0..DNS_ADDRS {
                if ai == 0 {
                    break;
                }
                let fam = bpf_probe_read_user((ai + AI_FAMILY) as *const i32).unwrap_or(0) as u16;
                let sa: u64 = bpf_probe_read_user((ai + AI_ADDR) as *const u64).unwrap_or(0);
                // sockaddr_in's address at 4, sockaddr_in6's at 8.
                let at = match fam {
                    AF_INET if sa != 0 => sa + 4,
                    AF_INET6 if sa != 0 => sa + 8,
                    _ => 0,
                };
                if put_addr(ev, i, fam, at) {
                    n += 1;
                }
                ai = bpf_probe_read_user((ai + AI_NEXT) as *const u64).unwrap_or(0);
            }
        } else if ret == 0 && hostent != 0 {
            let fam = bpf_probe_read_user((hostent + H_ADDRTYPE) as *const i32).unwrap_or(0) as u16;
            let list: u64 = bpf_probe_read_user((hostent + H_ADDR_LIST) as *const u64).unwrap_or(0);
            for i in 0..DNS_ADDRS {
                if list == 0 {
                    break;
                }
                let at: u64 = bpf_probe_read_user((list + 8 * i as u64) as *const u64).unwrap_or(0);
                if !put_addr(ev, i, fam, at) {
                    break;
                }
                n += 1;
            }
        }
        (*ev).n_addrs = n;
    }
    entry.submit(submit_flags());
    let _ = DNS_CALLS.remove(&pid_tgid);
    Some(())
}
