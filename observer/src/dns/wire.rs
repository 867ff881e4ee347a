//! Lookups seen on the wire: a query paired with its response by socket and
//! id, a question asked again (a retry, or TCP after a truncated answer)
//! folded into one lookup, and the queries a C library call sent handed to
//! that call's record rather than reported a second time.

use std::{borrow::Cow, collections::HashMap, net::IpAddr, sync::Arc};

use observer_common::{dns::DnsPacketEvent, AF_INET, AF_INET6, IPPROTO_TCP};

use super::{
    message::{self, Message},
    DnsRecord,
};
use crate::{clock::Clock, record::comm_str_n};

/// Lookups waiting for an answer, and library lookups waiting for their
/// call's end; past these, new ones are counted and dropped.
const MAX_PENDING: usize = 4096;
/// An unanswered query on a socket that stays open ends as a timeout here.
const EXPIRE_NS: u64 = 30_000_000_000;
/// Queries of a library call whose end never came (the process was killed
/// inside getaddrinfo) are reported as wire lookups after this.
const LIBC_WAIT_NS: u64 = 60_000_000_000;

/// A library call: (tid, start of the call, CLOCK_MONOTONIC ns).
type LibcKey = (u32, u64);

/// One question in flight: (pid, library call, name, type).
type QuestionKey = (u32, LibcKey, Arc<str>, u16);

struct Pending {
    pid: u32,
    tid: u32,
    comm: Arc<str>,
    name: Arc<str>,
    qtype: u16,
    server: Option<IpAddr>,
    transport: &'static str,
    /// CLOCK_MONOTONIC ns of the first query.
    start_ns: u64,
    /// (socket cookie, id) of each query sent, first to last.
    queries: Vec<(u64, u16)>,
    libc: LibcKey,
    /// A truncated answer came (to this question, or to another of the same
    /// library call on the same socket): the client asks again over TCP, on
    /// a socket of its own, so the UDP socket's release does not end the
    /// lookup.
    truncated: bool,
}

/// Wire lookups in flight and finished ones held for their library call.
#[derive(Default)]
pub struct WireLookups {
    pending: HashMap<u64, Pending>,
    by_query: HashMap<(u64, u16), u64>,
    by_question: HashMap<QuestionKey, u64>,
    /// Finished lookups of library calls still running, with the time the
    /// first was held.
    for_libc: HashMap<LibcKey, (u64, Vec<DnsRecord>)>,
    next: u64,
    /// Port-53 payloads that were not DNS messages.
    pub malformed: u64,
    /// Lookups not followed because the tables were full.
    pub overflow: u64,
}

/// The server's address (as connection records show addresses).
fn server(ev: &DnsPacketEvent) -> Option<IpAddr> {
    let family = if ev.ip_version == 4 {
        AF_INET
    } else {
        AF_INET6
    };
    crate::record::ip_of(family, &ev.remote)
}

fn result(msg: &Message) -> &'static str {
    match msg.rcode {
        0 if msg.answer_count > 0 => "ok",
        0 => "no_data",
        3 => "nxdomain",
        _ => "error",
    }
}

impl WireLookups {
    /// Follows the DNS messages of one port-53 packet (one over UDP; over
    /// TCP each after its two-byte length, several when the client wrote
    /// them at once); the responses that end lookups made outside the C
    /// library give their records.
    pub fn packet(&mut self, ev: &DnsPacketEvent, clock: &Clock) -> Vec<DnsRecord> {
        let len = (ev.len as usize).min(ev.payload.len());
        let bytes = &ev.payload[..len];
        let mut out = Vec::new();
        if u16::from(ev.proto) != IPPROTO_TCP {
            out.extend(self.message(ev, bytes, clock));
            return out;
        }
        let mut at = 0;
        while let Some(prefix) = bytes.get(at..at + 2) {
            let start = at + 2;
            let end = start + usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
            // The last message may be cut at the bytes kept; a bare length
            // (a client that writes it apart from the message) is nothing.
            if start < bytes.len() {
                out.extend(self.message(ev, &bytes[start..end.min(bytes.len())], clock));
            }
            at = end;
        }
        out
    }

    /// Follows one DNS message of `ev`.
    fn message(&mut self, ev: &DnsPacketEvent, bytes: &[u8], clock: &Clock) -> Option<DnsRecord> {
        let msg = match message::parse(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.malformed += 1;
                return None;
            }
        };
        match (ev.egress != 0, msg.response) {
            (true, false) => {
                self.query(ev, &msg);
                None
            }
            (false, true) => self.response(ev, &msg, clock),
            // A server on this host talking to port 53 elsewhere: not a lookup.
            _ => None,
        }
    }

    fn query(&mut self, ev: &DnsPacketEvent, msg: &Message) {
        let Some(q) = &msg.question else {
            self.malformed += 1;
            return;
        };
        let libc = if ev.libc_start_ns != 0 {
            (ev.tid, ev.libc_start_ns)
        } else {
            (0, 0)
        };
        let name: Arc<str> = Arc::from(q.name.as_str());
        let key = (ev.pid, libc, Arc::clone(&name), q.qtype);
        let transport = if u16::from(ev.proto) == IPPROTO_TCP {
            "tcp"
        } else {
            "udp"
        };
        // The same question again while it is unanswered: a retry.
        if let Some(&id) = self.by_question.get(&key) {
            if let Some(p) = self.pending.get_mut(&id) {
                p.queries.push((ev.cookie, msg.id));
                if transport == "tcp" {
                    p.transport = transport;
                }
                p.truncated = false;
                self.by_query.insert((ev.cookie, msg.id), id);
                return;
            }
        }
        if self.pending.len() >= MAX_PENDING {
            self.overflow += 1;
            return;
        }
        let id = self.next;
        self.next += 1;
        self.pending.insert(
            id,
            Pending {
                pid: ev.pid,
                tid: ev.tid,
                comm: Arc::from(comm_str_n(&ev.comm)),
                name,
                qtype: q.qtype,
                server: server(ev),
                transport,
                start_ns: ev.hdr.ts_ns,
                queries: vec![(ev.cookie, msg.id)],
                libc,
                truncated: false,
            },
        );
        self.by_query.insert((ev.cookie, msg.id), id);
        self.by_question.insert(key, id);
    }

    fn response(&mut self, ev: &DnsPacketEvent, msg: &Message, clock: &Clock) -> Option<DnsRecord> {
        let id = *self.by_query.get(&(ev.cookie, msg.id))?;
        let p = self.pending.get(&id)?;
        if let Some(q) = &msg.question {
            if !q.name.eq_ignore_ascii_case(&p.name) || q.qtype != p.qtype {
                return None;
            }
        }
        if msg.truncated {
            // The client asks again over TCP: the lookup goes on. glibc
            // leaves the UDP socket at the first truncated answer of a call
            // and asks all the call's questions again over TCP (res_send.c:
            // send_dg, then send_vc), whichever of them was cut: the call's
            // other questions on that socket wait for TCP too, rather than
            // end as timeouts when the socket is closed.
            let (libc, cookie) = (p.libc, ev.cookie);
            for (&other, q) in &mut self.pending {
                let same_call = libc != (0, 0)
                    && q.libc == libc
                    && q.queries.last().is_some_and(|x| x.0 == cookie);
                if other == id || same_call {
                    q.truncated = true;
                }
            }
            return None;
        }
        let p = self.forget(id)?;
        let mut answers = Vec::new();
        for a in &msg.addresses {
            if !answers.contains(a) {
                answers.push(*a);
            }
        }
        let r = record(
            &p,
            ev.hdr.ts_ns,
            result(msg),
            Some(message::rcode_name(msg.rcode)),
            answers,
            clock,
        );
        self.finish(p.libc, r, ev.hdr.ts_ns)
    }

    /// A socket that sent queries is gone: the lookups whose last query it
    /// carried got no answer.
    pub fn released(&mut self, cookie: u64, ts_ns: u64, clock: &Clock) -> Vec<DnsRecord> {
        let ended: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.truncated && p.queries.last().is_some_and(|q| q.0 == cookie))
            .map(|(id, _)| *id)
            .collect();
        self.time_out(ended, ts_ns, clock)
    }

    /// Lookups unanswered for too long end as timeouts; queries of library
    /// calls that never ended become wire lookups.
    pub fn expire(&mut self, now_ns: u64, clock: &Clock) -> Vec<DnsRecord> {
        let old: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now_ns.saturating_sub(p.start_ns) > EXPIRE_NS)
            .map(|(id, _)| *id)
            .collect();
        let mut out = self.time_out(old, now_ns, clock);
        self.for_libc.retain(|_, (held, records)| {
            if now_ns.saturating_sub(*held) > LIBC_WAIT_NS {
                out.append(records);
                false
            } else {
                true
            }
        });
        out
    }

    fn time_out(&mut self, ids: Vec<u64>, end_ns: u64, clock: &Clock) -> Vec<DnsRecord> {
        let mut out = Vec::new();
        for id in ids {
            if let Some(p) = self.forget(id) {
                let r = record(&p, end_ns, "timeout", None, Vec::new(), clock);
                out.extend(self.finish(p.libc, r, end_ns));
            }
        }
        out
    }

    fn forget(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        for q in &p.queries {
            self.by_query.remove(q);
        }
        self.by_question
            .remove(&(p.pid, p.libc, Arc::clone(&p.name), p.qtype));
        Some(p)
    }

    /// A wire lookup of a library call waits for the call's record.
    fn finish(&mut self, libc: LibcKey, r: DnsRecord, now_ns: u64) -> Option<DnsRecord> {
        if libc == (0, 0) {
            return Some(r);
        }
        if self.for_libc.len() >= MAX_PENDING && !self.for_libc.contains_key(&libc) {
            self.overflow += 1;
            return None;
        }
        self.for_libc
            .entry(libc)
            .or_insert_with(|| (now_ns, Vec::new()))
            .1
            .push(r);
        None
    }

    /// Adds what the wire saw of the library call of thread `tid` that
    /// started at `start_ns` (CLOCK_MONOTONIC) to its record.
    pub fn complete_libc(&mut self, r: &mut DnsRecord, tid: u32, start_ns: u64, clock: &Clock) {
        let key = (tid, start_ns);
        // Questions still unanswered when the call returned (it gave up).
        let open: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.libc == key)
            .map(|(id, _)| *id)
            .collect();
        let end = start_ns + r.duration_ns;
        for id in open {
            if let Some(p) = self.forget(id) {
                let t = record(&p, end, "timeout", None, Vec::new(), clock);
                self.finish(key, t, end);
            }
        }
        let Some((_, wire)) = self.for_libc.remove(&key) else {
            return;
        };
        let Some(first) = wire.first() else { return };
        r.server = first.server.clone();
        r.id = first.id;
        r.rcode = wire.iter().find_map(|w| w.rcode.clone());
        r.retries = Some(wire.iter().filter_map(|w| w.retries).sum());
        r.transport = if wire.iter().any(|w| w.transport == Some("tcp")) {
            Some("tcp")
        } else {
            first.transport
        };
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

fn record(
    p: &Pending,
    end_ns: u64,
    result: &'static str,
    rcode: Option<Cow<'static, str>>,
    answers: Vec<IpAddr>,
    clock: &Clock,
) -> DnsRecord {
    DnsRecord {
        kind: "dns",
        pid: p.pid,
        tid: p.tid,
        comm: Arc::clone(&p.comm),
        exe: None,
        container: None,
        name: Arc::clone(&p.name),
        qtype: message::qtype_name(p.qtype),
        duration_ns: end_ns.saturating_sub(p.start_ns),
        result,
        server: p.server.map(|a| a.to_string()),
        answers,
        start_unix_ns: clock.to_unix_ns(p.start_ns),
        source: "wire",
        id: p.queries.first().map(|q| q.1),
        rcode,
        retries: Some(p.queries.len().saturating_sub(1) as u32),
        transport: Some(p.transport),
        call: None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use observer_common::{EventHeader, IPPROTO_UDP};

    use super::*;
    use crate::dns::message::tests::{query, response};

    const MS: u64 = 1_000_000;
    const CLOCK: Clock = Clock::with_offset(0);

    fn packet(ts: u64, egress: bool, cookie: u64, msg: &[u8], libc: u64) -> DnsPacketEvent {
        let mut payload = [0u8; 512];
        payload[..msg.len()].copy_from_slice(msg);
        DnsPacketEvent {
            hdr: EventHeader {
                kind: 9,
                size: 0,
                ts_ns: ts,
            },
            cookie,
            libc_start_ns: libc,
            pid: if egress { 10 } else { 0 },
            tid: if egress { 11 } else { 0 },
            comm: *b"dig\0\0\0\0\0\0\0\0\0\0\0\0\0",
            egress: u8::from(egress),
            proto: IPPROTO_UDP as u8,
            ip_version: 4,
            _pad: 0,
            remote_port: 53,
            local_port: 40000,
            len: msg.len() as u32,
            wire_len: msg.len() as u32,
            remote: [10, 0, 0, 53, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            local: [0; 16],
            payload,
        }
    }

    /// A TCP segment carrying `msgs`, each after its two-byte length.
    fn tcp(ts: u64, egress: bool, cookie: u64, msgs: &[&[u8]], libc: u64) -> DnsPacketEvent {
        let mut seg = Vec::new();
        for m in msgs {
            seg.extend_from_slice(&(m.len() as u16).to_be_bytes());
            seg.extend_from_slice(m);
        }
        let mut ev = packet(ts, egress, cookie, &seg, libc);
        ev.proto = IPPROTO_TCP as u8;
        ev
    }

    #[test]
    fn a_retry_is_one_lookup_and_late_answers_are_ignored() {
        let mut w = WireLookups::default();
        let q1 = query(1, "api.test", 1);
        let q2 = query(2, "api.test", 1);
        assert!(w
            .packet(&packet(100 * MS, true, 7, &q1, 0), &CLOCK)
            .is_empty());
        assert!(w
            .packet(&packet(1100 * MS, true, 7, &q2, 0), &CLOCK)
            .is_empty());
        let mut r = w.packet(
            &packet(1150 * MS, false, 7, &response(&q2, 0, &[[1, 2, 3, 4]]), 0),
            &CLOCK,
        );
        assert_eq!(r.len(), 1, "answered");
        let r = r.remove(0);
        assert_eq!(r.source, "wire");
        assert_eq!(r.duration_ns, 1050 * MS, "from the first query");
        assert_eq!(r.retries, Some(1));
        assert_eq!(r.id, Some(1));
        assert_eq!(r.result, "ok");
        assert_eq!(r.rcode.as_deref(), Some("NOERROR"));
        assert_eq!(r.server.as_deref(), Some("10.0.0.53"));
        assert_eq!(r.answers, vec![IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4))]);
        let late = response(&q1, 0, &[[1, 2, 3, 4]]);
        assert!(w
            .packet(&packet(1200 * MS, false, 7, &late, 0), &CLOCK)
            .is_empty());
        assert_eq!(w.pending_len(), 0);
    }

    #[test]
    fn unanswered_ends_at_release_or_expiry() {
        let mut w = WireLookups::default();
        w.packet(
            &packet(100 * MS, true, 7, &query(1, "gone.test", 28), 0),
            &CLOCK,
        );
        w.packet(
            &packet(100 * MS, true, 8, &query(2, "slow.test", 1), 0),
            &CLOCK,
        );
        assert!(
            w.released(99, 500 * MS, &CLOCK).is_empty(),
            "another socket"
        );
        let r = w.released(7, 1100 * MS, &CLOCK);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].result, r[0].duration_ns), ("timeout", 1000 * MS));
        assert_eq!(r[0].qtype, "AAAA");
        assert!(w.expire(1000 * MS, &CLOCK).is_empty());
        let r = w.expire(100 * MS + EXPIRE_NS + 1, &CLOCK);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name.as_ref(), "slow.test");
    }

    #[test]
    fn a_library_calls_queries_complete_its_record() {
        let mut w = WireLookups::default();
        let start = 50 * MS;
        let (qa, qaaaa) = (query(5, "db.test", 1), query(6, "db.test", 28));
        w.packet(&packet(100 * MS, true, 7, &qa, start), &CLOCK);
        w.packet(&packet(100 * MS, true, 7, &qaaaa, start), &CLOCK);
        w.packet(
            &packet(900 * MS, true, 7, &query(9, "db.test", 1), start),
            &CLOCK,
        );
        assert!(w
            .packet(
                &packet(950 * MS, false, 7, &response(&qaaaa, 3, &[]), 0),
                &CLOCK
            )
            .is_empty());
        let answer = response(&query(9, "db.test", 1), 3, &[]);
        assert!(
            w.packet(&packet(990 * MS, false, 7, &answer, 0), &CLOCK)
                .is_empty(),
            "held for the library call, never a record of its own"
        );
        let mut r = crate::dns::record::tests::rec(10, 11, start, &[]);
        r.name = Arc::from("db.test");
        r.duration_ns = 960 * MS;
        w.complete_libc(&mut r, 11, start, &CLOCK);
        assert_eq!(r.source, "libc");
        assert_eq!(r.server.as_deref(), Some("10.0.0.53"));
        assert_eq!(r.retries, Some(1), "the A query was sent twice");
        assert_eq!(r.rcode.as_deref(), Some("NXDOMAIN"));
        assert_eq!(r.transport, Some("udp"));
        assert_eq!(w.pending_len(), 0);
        assert!(
            w.expire(u64::MAX / 2, &CLOCK).is_empty(),
            "nothing left over"
        );
    }

    #[test]
    fn queries_of_a_call_that_never_returned_become_wire_lookups() {
        let mut w = WireLookups::default();
        let q = query(5, "x.test", 1);
        w.packet(&packet(100 * MS, true, 7, &q, 42), &CLOCK);
        w.packet(
            &packet(110 * MS, false, 7, &response(&q, 0, &[[9, 9, 9, 9]]), 0),
            &CLOCK,
        );
        let r = w.expire(110 * MS + LIBC_WAIT_NS + 1, &CLOCK);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].source, r[0].duration_ns), ("wire", 10 * MS));
    }

    #[test]
    fn a_truncated_answer_waits_for_the_tcp_retry() {
        let mut w = WireLookups::default();
        let q = query(1, "big.test", 1);
        w.packet(&packet(100 * MS, true, 7, &q, 0), &CLOCK);
        let mut tc = response(&q, 0, &[]);
        tc[2] |= 0x02;
        assert!(w
            .packet(&packet(110 * MS, false, 7, &tc, 0), &CLOCK)
            .is_empty());
        assert!(
            w.released(7, 111 * MS, &CLOCK).is_empty(),
            "UDP socket closed"
        );
        let q2 = query(2, "big.test", 1);
        w.packet(&tcp(112 * MS, true, 8, &[&q2], 0), &CLOCK);
        let answer = response(&q2, 0, &[[5, 5, 5, 5]]);
        let r = w.packet(&tcp(130 * MS, false, 8, &[&answer], 0), &CLOCK);
        assert_eq!(r.len(), 1, "answered over TCP");
        assert_eq!((r[0].retries, r[0].transport), (Some(1), Some("tcp")));
        assert_eq!(r[0].duration_ns, 30 * MS);
        assert_eq!(r[0].answers, vec![IpAddr::V4(Ipv4Addr::new(5, 5, 5, 5))]);
    }

    /// glibc's getaddrinfo for both families: A and AAAA over UDP on one
    /// socket; at the first truncated answer (either one: the server
    /// answers them in any order) it closes the socket and writes both
    /// queries again, same ids, in one TCP segment.
    #[test]
    fn a_library_call_moves_all_its_questions_to_tcp() {
        for a_first in [true, false] {
            let mut w = WireLookups::default();
            let start = 50 * MS;
            let (qa, qaaaa) = (query(5, "tc.test", 1), query(6, "tc.test", 28));
            w.packet(&packet(100 * MS, true, 7, &qa, start), &CLOCK);
            w.packet(&packet(100 * MS, true, 7, &qaaaa, start), &CLOCK);
            let mut tc = response(if a_first { &qa } else { &qaaaa }, 0, &[]);
            tc[2] |= 0x02;
            assert!(w
                .packet(&packet(250 * MS, false, 7, &tc, 0), &CLOCK)
                .is_empty());
            // The other truncated answer comes after the close: unseen.
            assert!(w.released(7, 251 * MS, &CLOCK).is_empty());
            w.packet(&tcp(252 * MS, true, 8, &[&qa, &qaaaa], start), &CLOCK);
            assert_eq!(w.pending_len(), 2, "both questions followed over TCP");
            for (ts, q, addrs) in [(400, &qa, &[[127, 0, 0, 1]][..]), (550, &qaaaa, &[])] {
                let r = w.packet(
                    &tcp(ts * MS, false, 8, &[&response(q, 0, addrs)], 0),
                    &CLOCK,
                );
                assert!(r.is_empty(), "held for the library call");
            }
            let mut r = crate::dns::record::tests::rec(10, 11, start, &["127.0.0.1"]);
            r.name = Arc::from("tc.test");
            r.duration_ns = 501 * MS;
            w.complete_libc(&mut r, 11, start, &CLOCK);
            assert_eq!(
                (r.retries, r.transport, r.rcode.as_deref(), r.id),
                (Some(2), Some("tcp"), Some("NOERROR"), Some(5)),
                "each question asked again once (A first: {a_first})"
            );
            assert_eq!(w.pending_len(), 0);
            assert!(w.expire(u64::MAX / 2, &CLOCK).is_empty());
        }
    }

    #[test]
    fn messages_in_one_tcp_segment_and_a_cut_one() {
        let mut w = WireLookups::default();
        let (q1, q2) = (query(1, "one.test", 1), query(2, "two.test", 1));
        w.packet(&tcp(100 * MS, true, 8, &[&q1, &q2], 0), &CLOCK);
        assert_eq!(w.pending_len(), 2);
        let (a1, a2) = (
            response(&q1, 0, &[[1, 1, 1, 1]]),
            response(&q2, 0, &[[2, 2, 2, 2]]),
        );
        let mut ev = tcp(120 * MS, false, 8, &[&a1, &a2], 0);
        // The second message cut in its answer's address (at the bytes
        // kept): its header and question still count.
        ev.len -= 2;
        let r = w.packet(&ev, &CLOCK);
        let ip = IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1));
        assert_eq!(
            r.iter()
                .map(|r| (r.name.as_ref(), r.result, r.answers.clone()))
                .collect::<Vec<_>>(),
            vec![("one.test", "ok", vec![ip]), ("two.test", "ok", vec![])]
        );
        // A length written apart from its message is nothing to parse.
        let mut bare = tcp(130 * MS, true, 9, &[], 0);
        bare.payload[..2].copy_from_slice(&25u16.to_be_bytes());
        bare.len = 2;
        assert!(w.packet(&bare, &CLOCK).is_empty());
        assert_eq!((w.malformed, w.pending_len()), (0, 0));
    }

    #[test]
    fn garbage_on_port_53_is_counted() {
        let mut w = WireLookups::default();
        assert!(w
            .packet(&packet(1, true, 7, &[1, 2, 3], 0), &CLOCK)
            .is_empty());
        assert_eq!(w.malformed, 1);
    }
}
