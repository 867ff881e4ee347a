//! Per-program kernel statistics: how often each program ran, how long it took
//! (when `kernel.bpf_stats_enabled` is 1) and how often the kernel skipped it
//! because another tracing program was already running on that CPU (a
//! tracepoint in a softirq that interrupted one of our programs). Those skips
//! are lost events, so they are reported like every other loss.

use std::os::fd::{AsFd, AsRawFd};

use aya::Ebpf;
use aya_obj::generated::{bpf_cmd, bpf_prog_info};
use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct ProgStats {
    pub program: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
}

/// `BPF_OBJ_GET_INFO_BY_FD` (aya's ProgramInfo does not expose these fields).
fn info(fd: i32) -> Option<bpf_prog_info> {
    // SAFETY: bpf_prog_info is plain old data; zeroed is a valid value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: std::mem::size_of::<bpf_prog_info>() as u32,
        info: (&mut info as *mut bpf_prog_info) as u64,
    };
    // SAFETY: the attr points at a live, correctly sized bpf_prog_info; the
    // kernel writes at most info_len bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as i32,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>() as u32,
        )
    };
    (rc == 0).then_some(info)
}

/// How often the kernel skipped the program of `fd` (already running on
/// the CPU); None when its info cannot be read.
pub fn recursion_misses(fd: i32) -> Option<u64> {
    info(fd).map(|i| i.recursion_misses)
}

/// Statistics of every loaded program of `ebpf`.
pub fn read(ebpf: &Ebpf) -> Vec<ProgStats> {
    ebpf.programs()
        .filter_map(|(name, prog)| {
            let fd = prog.fd().ok()?;
            let i = info(fd.as_fd().as_raw_fd())?;
            Some(ProgStats {
                program: name.to_owned(),
                run_cnt: i.run_cnt,
                run_time_ns: i.run_time_ns,
                recursion_misses: i.recursion_misses,
            })
        })
        .collect()
}
