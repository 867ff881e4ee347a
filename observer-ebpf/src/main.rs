//! eBPF programs of the observer. One module per kernel hook family, named after
//! what it hooks. Shared types and map names come from `observer-common`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `asm!` for a mask the verifier must see (events::verifier_bound).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod ctx;
#[cfg(target_arch = "bpf")]
mod maps;

#[cfg(target_arch = "bpf")]
mod cgroup_skb;
#[cfg(target_arch = "bpf")]
mod cgroup_sock;
#[cfg(target_arch = "bpf")]
mod conn_packets;
#[cfg(target_arch = "bpf")]
mod dns_packets;
#[cfg(target_arch = "bpf")]
mod events;
#[cfg(target_arch = "bpf")]
mod exec_hold;
#[cfg(target_arch = "bpf")]
mod fds;
#[cfg(target_arch = "bpf")]
mod go_tls;
#[cfg(target_arch = "bpf")]
mod http_packets;
#[cfg(target_arch = "bpf")]
mod inet_sock_set_state;
#[cfg(target_arch = "bpf")]
mod libc_resolver;
#[cfg(target_arch = "bpf")]
mod libgnutls;
#[cfg(target_arch = "bpf")]
mod libssl;
#[cfg(target_arch = "bpf")]
mod packet_task;
#[cfg(target_arch = "bpf")]
mod rustls;
#[cfg(target_arch = "bpf")]
mod sched_process;
#[cfg(target_arch = "bpf")]
mod snapshot;
#[cfg(target_arch = "bpf")]
mod tcp_destroy_sock;
#[cfg(target_arch = "bpf")]
mod tcp_health;
#[cfg(target_arch = "bpf")]
mod tls_calls;
#[cfg(target_arch = "bpf")]
mod tls_state;
#[cfg(target_arch = "bpf")]
mod tls_wire;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach here, so this never runs.
    loop {}
}

/// Built for the host only so that `cargo check --workspace` works; the real
/// object is built for bpfel-unknown-none by observer/build.rs.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
