//! What the running kernel lets a program type call, asked of the kernel
//! itself: a program of two or three instructions is loaded and dropped.
//! A version number would say nothing of what a distribution backported.

use std::os::fd::{FromRawFd, OwnedFd};

use observer_common::{SKB_TASK_COMM, SKB_TASK_PID};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const FN_GET_CURRENT_PID_TGID: i32 = 14;
const FN_GET_CURRENT_COMM: i32 = 16;
const FN_GET_ATTACH_COOKIE: i32 = 174;

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off: 0,
        imm,
    }
}

const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const MOV64_IMM: u8 = 0xb7;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;

/// The head of `union bpf_attr` as BPF_PROG_LOAD reads it (the kernel takes
/// a shorter attribute and zeroes the rest).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
}

/// Whether the kernel loads a program of `prog_type` made of `insns`.
fn loads(prog_type: u32, insns: &[Insn]) -> bool {
    let license = c"GPL";
    let attr = ProgLoadAttr {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..ProgLoadAttr::default()
    };
    // SAFETY: `attr` is a valid BPF_PROG_LOAD attribute whose pointers
    // (instructions, license) live through the call; the kernel writes
    // nothing back without a log buffer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            std::ptr::addr_of!(attr),
            std::mem::size_of::<ProgLoadAttr>(),
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: a descriptor the kernel just gave us, closed on drop.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    true
}

/// Which task helpers a cgroup_skb program may call here: `SKB_TASK_PID`
/// (Linux 6.10+), `SKB_TASK_COMM` (later; needs CAP_PERFMON).
pub fn skb_task_helpers() -> u32 {
    let pid = [
        insn(CALL, 0, 0, FN_GET_CURRENT_PID_TGID),
        insn(MOV64_IMM, 0, 0, 1),
        insn(EXIT, 0, 0, 0),
    ];
    let comm = [
        insn(MOV64_REG, 1, 10, 0),
        insn(ADD64_IMM, 1, 0, -16),
        insn(MOV64_IMM, 2, 0, 16),
        insn(CALL, 0, 0, FN_GET_CURRENT_COMM),
        insn(MOV64_IMM, 0, 0, 1),
        insn(EXIT, 0, 0, 0),
    ];
    let mut allowed = 0;
    if loads(BPF_PROG_TYPE_CGROUP_SKB, &pid) {
        allowed |= SKB_TASK_PID;
    }
    if loads(BPF_PROG_TYPE_CGROUP_SKB, &comm) {
        allowed |= SKB_TASK_COMM;
    }
    allowed
}

/// Whether uprobes (kprobe-type programs) may read an attach cookie
/// (`bpf_get_attach_cookie`, Linux 5.15+, which brought perf-event links
/// that carry one too).
pub fn attach_cookies() -> bool {
    let cookie = [
        insn(CALL, 0, 0, FN_GET_ATTACH_COOKIE),
        insn(MOV64_IMM, 0, 0, 0),
        insn(EXIT, 0, 0, 0),
    ];
    loads(BPF_PROG_TYPE_KPROBE, &cookie)
}

/// Beside the helper bits: the packet programs read the current task's
/// ids and name from its `task_struct` (offsets from BTF).
pub const TASK_STRUCT: u32 = 1 << 8;

/// How the packet programs learn the task here, for `doctor`: the helpers
/// and the task_struct read, or what is lost without either.
pub fn packet_task_ways(bits: u32) -> Vec<&'static str> {
    [
        (SKB_TASK_PID, "bpf_get_current_pid_tgid"),
        (SKB_TASK_COMM, "bpf_get_current_comm"),
        (TASK_STRUCT, "task_struct fields (BTF)"),
    ]
    .into_iter()
    .filter(|(bit, _)| bits & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// What is lost where the packet programs can know the task neither way.
pub fn task_lost(bits: u32) -> Option<&'static str> {
    (bits & (SKB_TASK_PID | TASK_STRUCT) == 0).then_some(
        "this kernel's packet programs may not call bpf_get_current_pid_tgid (Linux 6.10+) and \
         the task's fields are not in its BTF",
    )
}
