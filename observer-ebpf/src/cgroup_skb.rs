//! cgroup_skb programs on the root cgroup: every packet of the host's
//! sockets, one way each. One program per direction serves both readers of
//! packets, DNS messages (`dns_packets`, when the DNS wire feature is on)
//! and the payload of plain TCP connections (`http_packets`): every program
//! on the hook costs a dispatch per packet, the largest single cost the
//! observer adds to a busy keep-alive server.

use aya_ebpf::{macros::cgroup_skb, programs::SkBuffContext};

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
