//! DNS messages on port 53, read by the cgroup_skb programs (`cgroup_skb`). A
//! query a socket sends and the response it receives go to userspace whole
//! (up to 512 bytes of the UDP or TCP payload), which parses them; here only
//! the IP and UDP/TCP headers are read.
//!
//! Packet-level hooks instead of syscall tracepoints: any syscall tracepoint
//! slows every syscall on the machine, while this runs per packet and leaves
//! at once for connected sockets whose far port is not 53 (the socket's port
//! is in the context), after three header loads for the others.

use aya_ebpf::{
    bindings::bpf_sock,
    helpers::{bpf_get_socket_cookie, bpf_skb_load_bytes},
    macros::map,
    maps::LruHashMap,
    programs::SkBuffContext,
    EbpfContext,
};
use observer_common::{
    dns::{DnsPacketEvent, DNS_PAYLOAD_LEN, DNS_PORT, MAX_DNS_SOCKS},
    Counter, EventKind, IPPROTO_TCP, IPPROTO_UDP,
};

use crate::{
    cgroup_skb::layers,
    ctx::{now_ns, zero_words},
    events::{reserve, submit_flags},
    libc_resolver::DNS_CALLS,
    maps::{count, own_tgid, CONNS},
    packet_task,
};

/// Sockets that sent a query: only their responses are sent up, and their
/// release ends the queries still unanswered.
#[map(name = "DNS_SOCKS")]
pub static DNS_SOCKS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(MAX_DNS_SOCKS, 0);

/// `bpf_sock.state` of a listening TCP socket.
const TCP_LISTEN: u32 = 10;

/// A DNS header is 12 bytes; shorter payloads are not DNS.
const DNS_HEADER: usize = 12;

/// The far port of the packet's socket, when it is connected (0: not
/// connected, or unknown). `__sk_buff.remote_port` holds it in network
/// order, in the upper half of the word on little-endian machines.
#[inline(always)]
fn socket_remote_port(ctx: &SkBuffContext) -> u16 {
    let raw = ctx.skb.remote_port();
    let be = if raw >> 16 != 0 {
        raw >> 16
    } else {
        raw & 0xffff
    };
    u16::from_be(be as u16)
}

/// Some: the packet was a DNS message sent up (nothing else reads it).
#[inline(always)]
pub fn packet(ctx: &SkBuffContext, egress: bool) -> Option<()> {
    // Most packets belong to connected sockets whose far end is not port 53:
    // two context loads, no helper call (keep-alive HTTPS traffic pays only
    // this). Unconnected sockets (UDP sendto) are looked at in full.
    let far = socket_remote_port(ctx);
    if far != 0 && far != DNS_PORT {
        return None;
    }
    // A listening TCP socket never asks: a server's SYN, SYN-ACK and
    // handshake ACK pass with one more load.
    // SAFETY: the program's own context; the socket pointer is checked
    // against null before its state (in every socket) is read.
    let sk = unsafe { (*ctx.skb.skb).__bindgen_anon_2.sk };
    if !sk.is_null() && unsafe { (*sk).state } == TCP_LISTEN {
        return None;
    }
    let l = layers(ctx)?;
    if u16::from(l.proto) != IPPROTO_UDP && u16::from(l.proto) != IPPROTO_TCP {
        return None;
    }
    let ports: [u8; 4] = ctx.load(l.l4).ok()?;
    let (src, dst) = (
        u16::from_be_bytes([ports[0], ports[1]]),
        u16::from_be_bytes([ports[2], ports[3]]),
    );
    let (remote_port, local_port) = if egress { (dst, src) } else { (src, dst) };
    if remote_port != DNS_PORT {
        return None;
    }
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let pid_tgid = if egress {
        let pid_tgid = sender(sk);
        if pid_tgid != 0 && (pid_tgid >> 32) as u32 == own_tgid() {
            return None;
        }
        pid_tgid
    } else {
        // Responses only for sockets seen asking (not ours, not older ones).
        DNS_SOCKS.get_ptr(&cookie)?;
        0
    };
    // Over TCP the payload keeps each message's two-byte length prefix: one
    // segment can carry several messages (glibc writes a call's A and AAAA
    // queries in one writev), and userspace splits them by it.
    let (payload, prefix) = if u16::from(l.proto) == IPPROTO_UDP {
        (l.l4 + 8, 0)
    } else {
        let doff: u8 = ctx.load(l.l4 + 12).ok()?;
        (l.l4 + usize::from(doff >> 4) * 4, 2)
    };
    let total = ctx.len() as usize;
    if total < payload + prefix + DNS_HEADER {
        // A bare ACK or handshake segment.
        return None;
    }
    let wire_len = total - payload;
    let len = if wire_len > DNS_PAYLOAD_LEN {
        DNS_PAYLOAD_LEN
    } else {
        wire_len
    };
    if egress && DNS_SOCKS.insert(&cookie, &1, 0).is_err() {
        count(Counter::DnsSockInsertFailed);
    }
    let mut entry = reserve::<DnsPacketEvent>(EventKind::DnsPacket, now_ns())?;
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is a reserved record of the right size; the helpers write
    // at most `len` (<= DNS_PAYLOAD_LEN) bytes into its payload.
    unsafe {
        (*ev).cookie = cookie;
        (*ev).pid = (pid_tgid >> 32) as u32;
        (*ev).tid = pid_tgid as u32;
        let libc_start_ns = if egress {
            DNS_CALLS.get(&pid_tgid).map_or(0, |c| c.start_ns)
        } else {
            0
        };
        // Volatile: on ingress it and the zero pid beside it would merge
        // into a byte-loop memset.
        core::ptr::write_volatile(&raw mut (*ev).libc_start_ns, libc_start_ns);
        // Else (and for answers) zeroes: userspace names a known sender
        // from its pid.
        if !(egress && packet_task::comm_into(&mut (*ev).comm)) {
            zero_words(&raw mut (*ev).comm);
        }
        (*ev).egress = u8::from(egress);
        (*ev).proto = l.proto;
        (*ev).ip_version = l.ip_version;
        (*ev)._pad = 0;
        (*ev).remote_port = remote_port;
        (*ev).local_port = local_port;
        (*ev).wire_len = wire_len as u32;
        let (saddr, daddr, alen) = if l.ip_version == 4 {
            (12, 16, 4)
        } else {
            (8, 24, 16)
        };
        let (r, lo) = if egress {
            (daddr, saddr)
        } else {
            (saddr, daddr)
        };
        // Loaded straight into the record (an array built on the stack and
        // assigned is a byte-loop memmove); zeroes where a load fails.
        zero_words(&raw mut (*ev).remote);
        zero_words(&raw mut (*ev).local);
        // The helper itself with a constant length (aya's `load_bytes`
        // clamps it to the packet, which the verifier reads as maybe 0).
        let skb = ctx.as_ptr().cast();
        let remote = core::ptr::addr_of_mut!((*ev).remote).cast();
        let local = core::ptr::addr_of_mut!((*ev).local).cast();
        if alen == 4 {
            bpf_skb_load_bytes(skb, r as u32, remote, 4);
            bpf_skb_load_bytes(skb, lo as u32, local, 4);
        } else {
            bpf_skb_load_bytes(skb, r as u32, remote, 16);
            bpf_skb_load_bytes(skb, lo as u32, local, 16);
        }
        // ((len - 1) & 511) + 1 == len here (12..=512); the verifier needs
        // to see the copy's size bounded away from 0 and the buffer's end.
        let n = ((len as u32 - 1) & (DNS_PAYLOAD_LEN as u32 - 1)) + 1;
        let ok = bpf_skb_load_bytes(
            ctx.as_ptr().cast(),
            payload as u32,
            core::ptr::addr_of_mut!((*ev).payload).cast(),
            n,
        ) == 0;
        (*ev).len = if ok { n } else { 0 };
    }
    entry.submit(submit_flags());
    Some(())
}

/// The task sending a query: the current one (where it can be known), else
/// a TCP connection's owner from its connect; 0 when neither is known.
#[inline(always)]
fn sender(sk: *mut bpf_sock) -> u64 {
    if let Some(id) = packet_task::pid_tgid() {
        return id;
    }
    if sk.is_null() {
        return 0;
    }
    CONNS.get_ptr(&(sk as u64)).map_or(0, |c| {
        // SAFETY: a live map value, valid for this program run.
        let c = unsafe { &*c };
        (u64::from(c.pid) << 32) | u64::from(c.tid)
    })
}
