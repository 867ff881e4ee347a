//! Uprobes on the C library's resolver: `getaddrinfo(node, service, hints,
//! res)`. The entry keeps the name and where the answer will be; the return
//! sends the lookup with up to four addresses of the answer.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes,
    },
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    dns::{DnsCall, DnsEvent, DNS_ADDRS, MAX_DNS_THREADS},
    EventKind, AF_INET, AF_INET6,
};

use crate::{
    ctx::now_ns,
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

#[uprobe]
pub fn getaddrinfo(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx);
    0
}

fn enter(ctx: &ProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if (pid_tgid >> 32) as u32 == own_tgid() {
        return None;
    }
    let node: u64 = ctx.arg(0)?;
    let hints: u64 = ctx.arg(2)?;
    let res: u64 = ctx.arg(3)?;
    if node == 0 {
        return None;
    }
    let call = DNS_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: the per-CPU scratch slot; user reads go through the helpers.
    unsafe {
        (*call).start_ns = now_ns();
        (*call).res_ptr = res;
        (*call).family = if hints == 0 {
            0
        } else {
            bpf_probe_read_user((hints + AI_FAMILY) as *const i32).unwrap_or(0) as u32
        };
        (*call)._pad = 0;
        if bpf_probe_read_user_str_bytes(node as *const u8, &mut (*call).name).is_err() {
            return None;
        }
        let _ = DNS_CALLS.insert(&pid_tgid, &*call, 0);
    }
    Some(())
}

#[uretprobe]
pub fn getaddrinfo_ret(ctx: RetProbeContext) -> u32 {
    let _ = exit(&ctx);
    0
}

fn exit(ctx: &RetProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let call = DNS_CALLS.get_ptr(&pid_tgid)?;
    let ret: i32 = ctx.ret();
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
        (*ev)._pad = 0;
        (*ev).comm = bpf_get_current_comm().unwrap_or_default();
        (*ev).name = (*call).name;
        (*ev).families = [0; DNS_ADDRS];
        (*ev).addrs = [[0; 16]; DNS_ADDRS];
        let mut n = 0u32;
        if ret == 0 && (*call).res_ptr != 0 {
            let mut ai: u64 = bpf_probe_read_user((*call).res_ptr as *const u64).unwrap_or(0);
            for i in 0..DNS_ADDRS {
                if ai == 0 {
                    break;
                }
                let fam = bpf_probe_read_user((ai + AI_FAMILY) as *const i32).unwrap_or(0) as u16;
                let sa: u64 = bpf_probe_read_user((ai + AI_ADDR) as *const u64).unwrap_or(0);
                if sa != 0 && fam == AF_INET {
                    let a: [u8; 4] =
                        bpf_probe_read_user((sa + 4) as *const [u8; 4]).unwrap_or([0; 4]);
                    let slot = &mut (*ev).addrs[i];
                    slot[0] = a[0];
                    slot[1] = a[1];
                    slot[2] = a[2];
                    slot[3] = a[3];
                    (*ev).families[i] = fam;
                    n += 1;
                } else if sa != 0 && fam == AF_INET6 {
                    (*ev).addrs[i] =
                        bpf_probe_read_user((sa + 8) as *const [u8; 16]).unwrap_or([0; 16]);
                    (*ev).families[i] = fam;
                    n += 1;
                }
                ai = bpf_probe_read_user((ai + AI_NEXT) as *const u64).unwrap_or(0);
            }
        }
        (*ev).n_addrs = n;
    }
    entry.submit(submit_flags());
    let _ = DNS_CALLS.remove(&pid_tgid);
    Some(())
}
