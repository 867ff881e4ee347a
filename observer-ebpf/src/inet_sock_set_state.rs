//! `sock:inet_sock_set_state`: the life of every TCP connection.
//!
//! Attached raw (the tracepoint's arguments: socket, old and new state), the
//! ports and addresses read from the socket at offsets from BTF. A classic
//! tracepoint program is skipped whenever another tracing program (a uprobe
//! on a TLS library, say) runs on the same CPU, and a SYN's timeout or a
//! peer's FIN handled in softirq over such a program went unseen: the record
//! lost its port and its error. A raw tracepoint guards recursion per
//! program. Without BTF the classic record is read instead
//! (`inet_sock_set_state_record`, same handling).
//!
//! Format of the classic record (6.x): skaddr, oldstate, newstate, sport,
//! dport, family, protocol, saddr[4], daddr[4], saddr_v6[16], daddr_v6[16].
//!
//! CLOSE -> SYN_SENT runs inside connect(), in the connecting task: that is where
//! outbound connections get their owner. The passive side's SYN_RECV ->
//! ESTABLISHED runs in softirq, where the current task is unrelated, so inbound
//! connections are created ownerless and claimed by the first task that sends
//! a payload on them (see `conn_packets`). listen() (-> LISTEN) runs in the
//! listening task: userspace learns which process listens where in the
//! order of its connections' events.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{RawTracePointContext, TracePointContext},
};
use observer_common::{
    tcp_state::*, tracepoints::inet_sock_set_state as f, Conn, Counter, SockTuple, AF_INET6,
    DIR_INBOUND, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED, IPPROTO_TCP,
};

use crate::{
    ctx::{current_comm_into, field, now_ns, zeroed_in},
    events::{emit_close, emit_listen, emit_owner, sk_err, sk_field, sk_srtt_us},
    maps::{count, emit_at_destroy, own_tgid, sock_tuple, CONNS},
};

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: RawTracePointContext) -> i32 {
    let running = RUNNING.get_ptr_mut(0);
    if let Some(r) = running {
        // SAFETY: this CPU's slot; only this program writes it.
        unsafe { *r = 1 };
    }
    on_change(&Raw::of(&ctx));
    if let Some(r) = running {
        // SAFETY: as above.
        unsafe { *r = 0 };
    }
    0
}

/// The kernel skips a raw tracepoint's program on a CPU where that same
/// program is already running: a state change in a softirq (a peer's FIN,
/// a timer's close) that interrupts [`inet_sock_set_state`] in process
/// context was lost, a connection's end with it (1-2 in 4 million changes
/// in the soak). This second program on the same tracepoint has a guard of
/// its own, so it runs in that nested context: it handles the change only
/// when the first is mid-run on its CPU (and so was skipped), and does
/// nothing otherwise, after the first ran. A skip of this one loses
/// nothing: it can only be nested in its own do-nothing run, where the
/// first is not running and so handles the change.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn inet_sock_set_state_nested(ctx: RawTracePointContext) -> i32 {
    // This CPU's slot, read only.
    let first_running = RUNNING.get(0).is_some_and(|r| *r != 0);
    if first_running {
        count(Counter::LifecycleNested);
        on_change(&Raw::of(&ctx));
    }
    0
}

/// Per CPU: whether [`inet_sock_set_state`] is running there.
#[map(name = "LIFECYCLE_RUNNING")]
static RUNNING: PerCpuArray<u8> = PerCpuArray::with_max_entries(1, 0);

#[tracepoint]
pub fn inet_sock_set_state_record(ctx: TracePointContext) -> u32 {
    on_change(&Record(&ctx));
    0
}

/// One state change of a socket, whichever way it was read.
trait Change {
    fn sk(&self) -> u64;
    fn states(&self) -> (i32, i32);
    fn protocol(&self) -> u16;
    /// The local port, host order.
    fn sport(&self) -> u16;
    /// Copies the 4-tuple into `conn`.
    fn fill_tuple(&self, conn: &mut Conn);
}

/// The classic tracepoint's record.
struct Record<'a>(&'a TracePointContext);

impl Change for Record<'_> {
    fn sk(&self) -> u64 {
        field(self.0, f::SKADDR)
    }

    fn states(&self) -> (i32, i32) {
        (field(self.0, f::OLDSTATE), field(self.0, f::NEWSTATE))
    }

    fn protocol(&self) -> u16 {
        field(self.0, f::PROTOCOL)
    }

    fn sport(&self) -> u16 {
        field(self.0, f::SPORT)
    }

    #[inline(always)]
    fn fill_tuple(&self, conn: &mut Conn) {
        let ctx = self.0;
        conn.sport = field(ctx, f::SPORT);
        conn.dport = field(ctx, f::DPORT);
        conn.family = field(ctx, f::FAMILY);
        if conn.family == AF_INET6 {
            conn.saddr = field(ctx, f::SADDR_V6);
            conn.daddr = field(ctx, f::DADDR_V6);
        } else {
            let s: [u8; 4] = field(ctx, f::SADDR);
            let d: [u8; 4] = field(ctx, f::DADDR);
            conn.saddr[..4].copy_from_slice(&s);
            conn.daddr[..4].copy_from_slice(&d);
        }
    }
}

/// The raw tracepoint's arguments; the rest read from the socket the way
/// the classic record copies it.
struct Raw {
    sk: u64,
    old: i32,
    new: i32,
    at: SockTuple,
}

impl Raw {
    #[inline(always)]
    fn of(ctx: &RawTracePointContext) -> Raw {
        let old: u64 = ctx.arg(1);
        let new: u64 = ctx.arg(2);
        Raw {
            sk: ctx.arg(0),
            old: old as i32,
            new: new as i32,
            at: sock_tuple(),
        }
    }
}

impl Change for Raw {
    fn sk(&self) -> u64 {
        self.sk
    }

    fn states(&self) -> (i32, i32) {
        (self.old, self.new)
    }

    fn protocol(&self) -> u16 {
        sk_field(self.sk, self.at.protocol)
    }

    fn sport(&self) -> u16 {
        u16::from_be(sk_field(self.sk, self.at.sport))
    }

    #[inline(always)]
    fn fill_tuple(&self, conn: &mut Conn) {
        let (sk, at) = (self.sk, &self.at);
        conn.sport = self.sport();
        conn.dport = u16::from_be(sk_field(sk, at.dport));
        conn.family = sk_field(sk, at.family);
        if conn.family == AF_INET6 {
            conn.saddr = sk_field(sk, at.saddr_v6);
            conn.daddr = sk_field(sk, at.daddr_v6);
        } else {
            let s: [u8; 4] = sk_field(sk, at.saddr);
            let d: [u8; 4] = sk_field(sk, at.daddr);
            conn.saddr[..4].copy_from_slice(&s);
            conn.daddr[..4].copy_from_slice(&d);
        }
    }
}

#[inline(always)]
fn on_change(c: &impl Change) -> Option<()> {
    if c.protocol() != IPPROTO_TCP {
        return None;
    }
    let sk = c.sk();
    match c.states() {
        (CLOSE, SYN_SENT) => on_connect(c, sk),
        (SYN_SENT, ESTABLISHED) => on_established(c, sk),
        (SYN_RECV, ESTABLISHED) => on_accepted(c, sk),
        (LISTEN, CLOSE) => on_listen(sk, 0, false),
        (_, LISTEN) => on_listen(sk, c.sport(), true),
        (old, CLOSE) => on_close(c, sk, old),
        (ESTABLISHED, new) => on_closing(sk, new),
        _ => None,
    }
}

fn on_connect(c: &impl Change, sk: u64) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == own_tgid() {
        return None;
    }
    let now = now_ns();
    let mut slot = core::mem::MaybeUninit::<Conn>::uninit();
    let conn = zeroed_in(&mut slot);
    conn.sk = sk;
    conn.start_ns = now;
    conn.pid = tgid;
    conn.tid = pid_tgid as u32;
    current_comm_into(&mut conn.comm);
    conn.direction = DIR_OUTBOUND;
    conn.flags = FLAG_OWNED;
    c.fill_tuple(conn);
    track(sk, conn, Counter::OutboundOpened, now)?;
    emit_owner(sk, conn, now);
    Some(())
}

/// listen() runs in the listening task (its port is bound by then unless
/// listen() binds it); a listener closes wherever its last holder lets go.
fn on_listen(sk: u64, port: u16, listening: bool) -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if listening && tgid == own_tgid() {
        return None;
    }
    let pid = if listening { tgid } else { 0 };
    emit_listen(sk, pid, port, listening, now_ns());
    Some(())
}

fn on_established(c: &impl Change, sk: u64) -> Option<()> {
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run.
    let conn = unsafe { &mut *conn };
    conn.established_ns = now_ns();
    conn.flags |= FLAG_ESTABLISHED;
    // The source port and address are only final now.
    c.fill_tuple(conn);
    Some(())
}

fn on_accepted(c: &impl Change, sk: u64) -> Option<()> {
    let now = now_ns();
    let mut slot = core::mem::MaybeUninit::<Conn>::uninit();
    let conn = zeroed_in(&mut slot);
    conn.sk = sk;
    conn.start_ns = now;
    conn.established_ns = now;
    conn.direction = DIR_INBOUND;
    conn.flags = FLAG_ESTABLISHED;
    c.fill_tuple(conn);
    track(sk, conn, Counter::InboundOpened, now)
}

/// Starts tracking `conn`. An earlier connection still under the same socket
/// pointer is finished first: a socket may connect() again after a failed
/// attempt, and a CLOSE the kernel did not run us for leaves a stale entry.
#[inline(always)]
fn track(sk: u64, conn: &Conn, opened: Counter, now: u64) -> Option<()> {
    if let Some(prev) = CONNS.get_ptr(&sk) {
        count(Counter::Replaced);
        emit_close(sk, prev, now);
    }
    if CONNS.insert(&sk, conn, 0).is_err() {
        count(Counter::ConnInsertFailed);
        return None;
    }
    count(opened);
    Some(())
}

/// Leaving ESTABLISHED (FIN sent or received): keep the RTT the connection had
/// while it carried data, before the FIN exchange adds its own samples; the
/// peer's FIN (CLOSE_WAIT) is when it stopped taking requests.
fn on_closing(sk: u64, new: i32) -> Option<()> {
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a pointer into a map value, valid for this program run.
    unsafe {
        (*conn).srtt_us = sk_srtt_us(sk);
        if new == CLOSE_WAIT {
            (*conn).peer_fin_ns = now_ns();
        }
    }
    Some(())
}

/// Marks the connection closed. The kernel sets `sk_err` before it moves a
/// failed socket to CLOSE, so a timeout or unreachable host reads here.
fn on_close(ch: &impl Change, sk: u64, old: i32) -> Option<()> {
    let Some(conn) = CONNS.get_ptr_mut(&sk) else {
        // Listeners and never-established children close too; only count the rest.
        if old != LISTEN && old != SYN_RECV {
            count(Counter::CloseUntracked);
        }
        return None;
    };
    let now = now_ns();
    // SAFETY: a pointer into a map value, valid for this program run.
    let c = unsafe { &mut *conn };
    c.end_ns = now;
    c.close_from_state = old as u32;
    c.error = sk_err(sk);
    if old == ESTABLISHED || c.srtt_us == 0 {
        c.srtt_us = sk_srtt_us(sk);
    }
    // A refused connect has its source port only now.
    c.sport = ch.sport();
    if !emit_at_destroy() {
        emit_close(sk, conn, now);
    }
    Some(())
}
