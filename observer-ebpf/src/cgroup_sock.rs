//! cgroup/sock_release on the root cgroup: a socket that sent DNS queries is
//! gone, so its queries still unanswered will never be (a client that gave
//! up: `dig` timing out, a resolver closing its socket).

use aya_ebpf::{
    helpers::bpf_get_socket_cookie, macros::cgroup_sock, programs::SockContext, EbpfContext,
};
use observer_common::{
    dns::{DnsSockEvent, DNS_PORT},
    EventKind,
};

use crate::{
    ctx::now_ns,
    dns_packets::DNS_SOCKS,
    events::{reserve, submit_flags},
};

#[cgroup_sock(sock_release)]
pub fn dns_sock_release(ctx: SockContext) -> i32 {
    // A connected socket whose far port is not 53 never asked (two context
    // loads, no map lookup: every closing connection passes here).
    // SAFETY: the program's own context.
    let far = u16::from_be(unsafe { (*ctx.sock).dst_port });
    if far != 0 && far != DNS_PORT {
        return 1;
    }
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if DNS_SOCKS.get_ptr(&cookie).is_some() {
        if let Some(mut entry) = reserve::<DnsSockEvent>(EventKind::DnsSockReleased, now_ns()) {
            // SAFETY: `entry` is a reserved record of the right size.
            unsafe { (*entry.as_mut_ptr()).cookie = cookie };
            entry.submit(submit_flags());
        }
        let _ = DNS_SOCKS.remove(&cookie);
    }
    1
}
