//! cgroup_skb programs on the root cgroup: every packet of the host's
//! sockets, one way each. One program per direction serves both readers of
//! packets, DNS messages (`dns_packets`, when the DNS wire feature is on)
//! and the payload of plain TCP connections (`http_packets`): every program
//! on the hook costs a dispatch per packet, the largest single cost the
//! observer adds to a busy keep-alive server.

use aya_ebpf::{macros::cgroup_skb, programs::SkBuffContext};
use observer_common::IPPROTO_TCP;

use crate::{dns_packets, http_packets, maps::dns_wire};

#[cgroup_skb(egress)]
pub fn packets_egress(ctx: SkBuffContext) -> i32 {
    packet(&ctx, true);
    1
}

#[cgroup_skb(ingress)]
pub fn packets_ingress(ctx: SkBuffContext) -> i32 {
    packet(&ctx, false);
    1
}

#[inline(always)]
fn packet(ctx: &SkBuffContext, egress: bool) {
    if dns_wire() && dns_packets::packet(ctx, egress).is_some() {
        return;
    }
    let _ = http_packets::packet(ctx, egress);
}

/// Where a TCP segment's header and payload start, when it has a payload:
/// None for other protocols, later fragments and segments without data (the
/// SYNs, ACKs and FINs that are most of a short connection's packets), so
/// that those leave before any map is touched or helper called. An IPv4
/// header without options and the TCP data offset are read in place (the
/// packet's linear head, where the kernel keeps the headers); other packets
/// take the general path.
#[inline(always)]
pub fn tcp_payload(ctx: &SkBuffContext) -> Option<(usize, usize)> {
    let total = ctx.len() as usize;
    // SAFETY: the program's own context.
    let (data, end) = unsafe {
        (
            (*ctx.skb.skb).data as usize,
            (*ctx.skb.skb).data_end as usize,
        )
    };
    let ipv4 = if data + 33 <= end {
        let head = data as *const u8;
        // SAFETY: the 33 bytes read lie before data_end (checked above).
        unsafe {
            (*head == 0x45).then(|| (*head.add(9), *head.add(6), *head.add(7), *head.add(32)))
        }
    } else {
        let head: [u8; 33] = ctx.load(0).ok()?;
        (head[0] == 0x45).then_some((head[9], head[6], head[7], head[32]))
    };
    let (l4, doff) = if let Some((proto, frag_hi, frag_lo, doff)) = ipv4 {
        // IPv4, 20-byte header: protocol, fragment offset, TCP data offset.
        if u16::from(proto) != IPPROTO_TCP || u16::from_be_bytes([frag_hi, frag_lo]) & 0x1fff != 0 {
            return None;
        }
        (20, doff)
    } else {
        let l = layers(ctx)?;
        if u16::from(l.proto) != IPPROTO_TCP {
            return None;
        }
        (l.l4, ctx.load::<u8>(l.l4 + 12).ok()?)
    };
    let payload = l4 + usize::from(doff >> 4) * 4;
    (total > payload).then_some((l4, payload))
}

/// Where the layers of a packet start.
pub struct Layers {
    pub ip_version: u8,
    pub proto: u8,
    pub l4: usize,
}

#[inline(always)]
pub fn layers(ctx: &SkBuffContext) -> Option<Layers> {
    // cgroup_skb sees the packet from its network header on.
    let first: u8 = ctx.load(0).ok()?;
    match first >> 4 {
        4 => {
            // Later fragments carry no transport header.
            let frag: [u8; 2] = ctx.load(6).ok()?;
            if u16::from_be_bytes(frag) & 0x1fff != 0 {
                return None;
            }
            Some(Layers {
                ip_version: 4,
                proto: ctx.load(9).ok()?,
                l4: usize::from(first & 0xf) * 4,
            })
        }
        // Extension headers are not walked: DNS packets do not carry them.
        6 => Some(Layers {
            ip_version: 6,
            proto: ctx.load(6).ok()?,
            l4: 40,
        }),
        _ => None,
    }
}
