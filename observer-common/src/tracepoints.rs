//! Offsets of the tracepoint fields the eBPF programs read.
//!
//! The eBPF side reads these offsets directly from the tracepoint context. The
//! userspace side checks each one against the kernel's own
//! `/sys/kernel/tracing/events/<category>/<name>/format` before attaching, so a
//! kernel whose layout differs disables that probe with a reason instead of
//! reading garbage.

/// One field an eBPF program reads: its name in the format file, offset, size.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// A tracepoint and the fields we depend on.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub category: &'static str,
    pub name: &'static str,
    pub fields: &'static [Field],
}

macro_rules! layout {
    ($mod:ident, $cat:literal, $name:literal, { $($field:ident : $fname:literal @ $off:literal / $size:literal),* $(,)? }) => {
        pub mod $mod {
            $(pub const $field: usize = $off;)*
            pub const LAYOUT: super::Layout = super::Layout {
                category: $cat,
                name: $name,
                fields: &[$(super::Field { name: $fname, offset: $off, size: $size }),*],
            };
        }
    };
}

layout!(inet_sock_set_state, "sock", "inet_sock_set_state", {
    SKADDR: "skaddr" @ 8 / 8,
    OLDSTATE: "oldstate" @ 16 / 4,
    NEWSTATE: "newstate" @ 20 / 4,
    SPORT: "sport" @ 24 / 2,
    DPORT: "dport" @ 26 / 2,
    FAMILY: "family" @ 28 / 2,
    PROTOCOL: "protocol" @ 30 / 2,
    SADDR: "saddr" @ 32 / 4,
    DADDR: "daddr" @ 36 / 4,
    SADDR_V6: "saddr_v6" @ 40 / 16,
    DADDR_V6: "daddr_v6" @ 56 / 16,
});

// Attached as raw tracepoints (arguments, not record fields: `(struct sock *sk,
// int ret, int flags)`), so only their existence is checked. The record fields
// exist since the tracepoints did (6.3), checked too as a sign of that prototype.
layout!(sock_send_length, "sock", "sock_send_length", {
    SK: "sk" @ 8 / 8,
    RET: "ret" @ 20 / 4,
    FLAGS: "flags" @ 24 / 4,
});

layout!(sock_recv_length, "sock", "sock_recv_length", {
    SK: "sk" @ 8 / 8,
    RET: "ret" @ 20 / 4,
    FLAGS: "flags" @ 24 / 4,
});

layout!(tcp_destroy_sock, "tcp", "tcp_destroy_sock", {
    SKADDR: "skaddr" @ 8 / 8,
});

layout!(tcp_retransmit_skb, "tcp", "tcp_retransmit_skb", {
    SKADDR: "skaddr" @ 16 / 8,
});

layout!(tcp_receive_reset, "tcp", "tcp_receive_reset", {
    SKADDR: "skaddr" @ 8 / 8,
});

layout!(tcp_send_reset, "tcp", "tcp_send_reset", {
    SKADDR: "skaddr" @ 16 / 8,
});

layout!(sched_process_exec, "sched", "sched_process_exec", {
    FILENAME: "filename" @ 8 / 4,
    PID: "pid" @ 12 / 4,
});

// A syscall's arguments, each an unsigned long after the syscall number.
layout!(sys_enter_mmap, "syscalls", "sys_enter_mmap", {
    PROT: "prot" @ 32 / 8,
    FD: "fd" @ 48 / 8,
});

layout!(sched_process_exit, "sched", "sched_process_exit", {
    PID: "pid" @ 24 / 4,
});
