//! Proxy legs and local calls across the table's conversations: an
//! outbound request linked to the inbound request its process serves
//! (`http::proxy`), and the records of both put in one trace.

use observer_common::{http::PlaintextEvent, DIR_INBOUND};

use super::{ConnTable, Live};
use crate::{
    http::{
        proxy::{self, Link, UpstreamLeg},
        trace_context::{Hex, SpanIds, TraceParent},
        Conversation, RequestRecord,
    },
    keys::{NumMap, NumSet},
    record::Direction,
};

/// Links kept per client end after their record was made (a local
/// server's record of the same request may come later and reads them).
const LINKS_KEPT: usize = 8;
/// The same for an HTTP/2 client end, whose streams in flight each hold one
/// until their record is made (servers allow 100 at once by default).
const LINKS_KEPT_H2: usize = 128;
/// Legs held per server end for requests whose record is not made yet.
const LEGS_HELD: usize = 64;
/// Legs waiting for the thread rule at once; beyond, the other rules
/// decide at once.
const MAX_WAITING: usize = 1024;
/// Ticks a waiting leg is held at most (its requests' records did not
/// come: their connections were cut, or they are slower than this).
const WAIT_TICKS: u32 = 5;

/// A leg made on a worker thread while its process served requests whose
/// owner thread was not known yet (a thread-per-request server's socket
/// is claimed at its first answer byte). The thread rule is tried as each
/// of those requests' records is made; meanwhile the leg's record, and a
/// local server's record of the same request, wait here.
// The records move on as the boxes they were made in (see `requests_out`).
#[allow(clippy::vec_box)]
pub(super) struct WaitingLeg {
    /// The leg's client end and request.
    sk: u64,
    place: u32,
    pid: u32,
    tid: u32,
    /// The inbound requests (server end, request) it may serve.
    candidates: Vec<(u64, u32)>,
    /// What the other rules linked it to, if the thread rule finds nothing.
    fallback: Option<Link>,
    record: Option<Box<RequestRecord>>,
    at_server: Vec<Box<RequestRecord>>,
    ticks: u32,
}

impl ConnTable {
    /// After a call's bytes were fed to socket `ev.conn.sk`'s conversation:
    /// a client's new request is linked to the request its process serves;
    /// a server's request in flight becomes a candidate; records made
    /// (from `from` in `requests_out`) take their links and legs.
    pub(super) fn follow_legs(&mut self, ev: &PlaintextEvent, from: usize) {
        let sk = ev.conn.sk;
        let Some(talk) = self.http.get(&sk) else {
            return;
        };
        let client = talk
            .owner_is_client
            .unwrap_or(ev.conn.direction != DIR_INBOUND);
        if client {
            self.link_new_requests(sk);
        } else if talk.serves() {
            self.serving.insert(sk);
        }
        if from < self.requests_out.len() {
            let mut made = std::mem::take(&mut self.requests_out);
            let tail = made.split_off(from);
            for mut r in tail {
                let place = r.stream_id.or(r.request_index);
                match r.direction {
                    Direction::Outbound => {
                        if let Some(w) = self.waiting_leg(sk, place) {
                            w.record = Some(r);
                            continue;
                        }
                        self.apply_link(sk, &mut r);
                    }
                    Direction::Inbound => {
                        if let Some(p) = place {
                            let served = (r.trace.incoming, r.start_unix_ns);
                            made.extend(self.resolve_waiting(sk, p, served));
                        }
                        self.take_legs(sk, &mut r);
                        if let Some(w) = self.waiting_leg_served(sk, place) {
                            w.at_server.push(r);
                            continue;
                        }
                    }
                }
                made.push(r);
            }
            self.requests_out = made;
        }
    }

    /// The owner's process and thread of socket `sk`, when known.
    fn owner_of(&self, sk: u64) -> Option<(u32, u32)> {
        self.live.get(&sk).map(|l| (l.owner.pid, l.owner.tid))
    }
}

impl ConnTable {
    /// The waiting leg of client end `sk`'s request `place`.
    fn waiting_leg(&mut self, sk: u64, place: Option<u32>) -> Option<&mut WaitingLeg> {
        let place = place?;
        self.waiting
            .iter_mut()
            .find(|w| w.sk == sk && w.place == place)
    }

    /// The waiting leg whose request server end `sk` served as `place`
    /// (the leg's client end here, on the same connection).
    fn waiting_leg_served(&mut self, sk: u64, place: Option<u32>) -> Option<&mut WaitingLeg> {
        if self.waiting.is_empty() {
            return None;
        }
        let talk = self.http.get(&sk)?;
        let (shared, (local, remote)) = talk.shared.zip(talk.ends)?;
        let client = self.pairs.other(shared, local, remote)?;
        self.waiting_leg(client, place)
    }

    /// Server end `sk`'s request `place` is over and its owner thread
    /// known: the legs waiting on it are linked to it by thread, or, its
    /// thread another, no longer wait on it. Records of legs decided.
    #[allow(clippy::vec_box)]
    fn resolve_waiting(
        &mut self,
        sk: u64,
        place: u32,
        (incoming, since): (Option<TraceParent>, u64),
    ) -> Vec<Box<RequestRecord>> {
        let mut out = Vec::new();
        if self.waiting.is_empty() {
            return out;
        }
        let owner = self.owner_of(sk).filter(|o| worker_thread(*o).is_some());
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &mut self.waiting[i];
            if !w.candidates.contains(&(sk, place)) {
                i += 1;
                continue;
            }
            let link = if owner == Some((w.pid, w.tid)) {
                self.server_ids(sk, place, incoming.as_ref())
                    .map(|ids| Link {
                        inbound_sk: sk,
                        inbound_place: place,
                        trace_id: ids.trace_id,
                        parent_span_id: ids.span_id,
                        rule: proxy::BY_THREAD,
                    })
            } else {
                w.candidates.retain(|&c| c != (sk, place));
                if !w.candidates.is_empty() {
                    i += 1;
                    continue;
                }
                w.fallback
            };
            let w = self.waiting.swap_remove(i);
            out.extend(self.finish_waiting(w, link, Some(since)));
        }
        out
    }

    /// A waiting leg decided: its records, in the trace of `link`'s request.
    #[allow(clippy::vec_box)]
    fn finish_waiting(
        &mut self,
        w: WaitingLeg,
        link: Option<Link>,
        served_since: Option<u64>,
    ) -> Vec<Box<RequestRecord>> {
        self.keep_link(w.sk, w.place, link);
        let mut out = Vec::new();
        if let Some(mut r) = w.record {
            if let Some(l) = link {
                self.link_record(w.sk, &mut r, l, served_since);
            }
            out.push(r);
        }
        for mut r in w.at_server {
            if let Some(l) = link {
                r.trace.trace_id = Some(Hex(l.trace_id));
            }
            out.push(r);
        }
        out
    }

    /// Ends the waits that have seen more than `older_than` ticks (this
    /// one counted), their records into `requests_out`.
    fn end_waits(&mut self, older_than: u32) {
        let mut i = 0;
        while i < self.waiting.len() {
            self.waiting[i].ticks = self.waiting[i].ticks.saturating_add(1);
            if self.waiting[i].ticks <= older_than {
                i += 1;
                continue;
            }
            let w = self.waiting.swap_remove(i);
            let fallback = w.fallback;
            let made = self.finish_waiting(w, fallback, None);
            self.requests_out.extend(made);
        }
    }

    /// Called each tick.
    pub(super) fn age_waits(&mut self) {
        self.end_waits(WAIT_TICKS);
    }

    /// Every leg still waiting decided by the other rules (watching stops).
    pub fn end_all_waits(&mut self) {
        self.end_waits(0);
    }
}

/// The thread the thread rule may link by: one other than the process's
/// main thread (an event loop such as nginx's serves every request on its
/// one thread, which tells none apart).
fn worker_thread((pid, tid): (u32, u32)) -> Option<u32> {
    (tid != pid).then_some(tid)
}

/// An inbound request a leg may serve: its server end, its place, the
/// `traceparent` it carried, and (when its owner is not known yet) the
/// local port its process must listen on for it to count.
type InboundRequest = (u64, u32, Option<TraceParent>, Option<u16>);

impl ConnTable {
    /// Links each request in flight of client end `sk` not tried yet (its
    /// HTTP/1.x request, or its HTTP/2 streams, in the order they began).
    fn link_new_requests(&mut self, sk: u64) {
        let Some((pid, tid)) = self.owner_of(sk) else {
            return;
        };
        let Some(talk) = self.http.get(&sk) else {
            return;
        };
        let tried = talk.link_tried;
        match talk.h2.as_ref() {
            None => {
                if let Some((place, _)) = talk.asked(None).filter(|(p, _)| *p > tried) {
                    self.link_new_request(sk, (pid, tid), place);
                }
            }
            Some(h2) => {
                let places: Vec<u32> = h2
                    .streams()
                    .filter(|x| x.request.is_some())
                    .filter_map(|x| x.stream_id)
                    .filter(|&p| p > tried)
                    .collect();
                for place in places {
                    self.link_new_request(sk, (pid, tid), place);
                }
            }
        }
    }

    /// Links client end `sk`'s request `place` (once) to the inbound
    /// request of its process it serves, if one rule tells which.
    fn link_new_request(&mut self, sk: u64, (pid, tid): (u32, u32), place: u32) {
        let Some(talk) = self.http.get(&sk) else {
            return;
        };
        let Some(out) = talk.asked_at(place, worker_thread((pid, tid))) else {
            return;
        };
        // Most processes serve nothing: one look (cached) and no search.
        if !self.listeners.listens_any(pid) {
            if let Some(talk) = self.http.get_mut(&sk) {
                talk.link_tried = place;
            }
            return;
        }
        let http = &self.http;
        self.serving
            .retain(|s| http.get(s).is_some_and(|t| t.serves()));
        let (found, candidates) = Self::inbound_in_flight(http, &self.live, &self.serving, sk, pid);
        let chosen = proxy::choose(&out.asked, &candidates).filter(|&(i, _)| match found[i].3 {
            Some(port) => self.listeners.listens(pid, port),
            None => true,
        });
        // The thread rule comes before the request match, but the owner
        // thread of a thread-per-request server's socket is only learnt
        // at its first answer byte: a leg made on a worker thread while
        // such requests are in flight waits for their records.
        let rule = chosen.map(|(_, rule)| rule);
        let unowned = if worker_thread((pid, tid)).is_some()
            && !matches!(rule, Some(proxy::BY_TRACE_CONTEXT | proxy::BY_THREAD))
            && self.waiting.len() < MAX_WAITING
        {
            Self::awaited_requests(
                &mut self.listeners,
                pid,
                &found,
                &candidates,
                out.asked.start_ns,
            )
        } else {
            Vec::new()
        };
        let link = self.chosen_link(chosen, &found);
        if let Some(talk) = self.http.get_mut(&sk) {
            talk.link_tried = place;
        }
        if unowned.is_empty() {
            self.keep_link(sk, place, link);
        } else {
            self.waiting.push(WaitingLeg {
                sk,
                place,
                pid,
                tid,
                candidates: unowned,
                fallback: link,
                record: None,
                at_server: Vec::new(),
                ticks: 0,
            });
        }
    }

    /// The inbound requests in flight of process `pid` (other than on `sk`),
    /// and those whose owner is not known yet: one of these that the rules
    /// choose counts only when the process listens on its port (else a
    /// client's request would be taken for a leg of the server it calls).
    /// Checked for the one chosen only: /proc is read for a link, never for
    /// every request.
    fn inbound_in_flight<'a>(
        http: &'a NumMap<u64, Conversation>,
        live: &NumMap<u64, Live>,
        serving: &NumSet<u64>,
        sk: u64,
        pid: u32,
    ) -> (Vec<InboundRequest>, Vec<proxy::Candidate<'a>>) {
        let mut found = Vec::new();
        let mut candidates = Vec::new();
        for &isk in serving {
            let owner = live.get(&isk).map(|l| (l.owner.pid, l.owner.tid));
            if isk == sk || owner.is_some_and(|(p, _)| p != pid) {
                continue;
            }
            let Some(t) = http.get(&isk) else {
                continue;
            };
            let unowned_port = match (owner, t.ends) {
                (Some(_), _) => None,
                (None, Some((local, _))) => Some(local.1),
                (None, None) => continue,
            };
            for (iplace, c) in t.serving(owner.and_then(worker_thread)) {
                found.push((isk, iplace, c.asked.traceparent.copied(), unowned_port));
                candidates.push(c);
            }
        }
        (found, candidates)
    }

    /// The requests found whose owner is not known yet, on a port their
    /// process listens on, and in flight at `start_ns`: a leg made on a
    /// worker thread waits for their records.
    fn awaited_requests(
        listeners: &mut crate::listeners::Listeners,
        pid: u32,
        found: &[InboundRequest],
        candidates: &[proxy::Candidate<'_>],
        start_ns: u64,
    ) -> Vec<(u64, u32)> {
        let mut unowned = Vec::new();
        for (f, c) in found.iter().zip(candidates) {
            let listened = f.3.is_some_and(|port| listeners.listens(pid, port));
            if listened && proxy::waiting_at(c, start_ns) {
                unowned.push((f.0, f.1));
            }
        }
        unowned
    }

    /// The link to the inbound request the rules chose (its index into
    /// `found`, and the rule): that request's trace and span are the leg's
    /// trace and parent.
    fn chosen_link(
        &self,
        chosen: Option<(usize, &'static str)>,
        found: &[InboundRequest],
    ) -> Option<Link> {
        chosen.and_then(|(i, rule)| {
            let (isk, iplace, incoming, _) = found[i];
            let ids = self.server_ids(isk, iplace, incoming.as_ref())?;
            Some(Link {
                inbound_sk: isk,
                inbound_place: iplace,
                trace_id: ids.trace_id,
                parent_span_id: ids.span_id,
                rule,
            })
        })
    }

    /// Keeps client end `sk`'s link of request `place`, for its record and
    /// a local server's record of the same request.
    fn keep_link(&mut self, sk: u64, place: u32, link: Option<Link>) {
        if let (Some(talk), Some(l)) = (self.http.get_mut(&sk), link) {
            talk.links.push((place, l));
            let kept = if talk.h2.is_some() {
                LINKS_KEPT_H2
            } else {
                LINKS_KEPT
            };
            if talk.links.len() > kept {
                talk.links.remove(0);
            }
        }
    }

    /// The ids of server end `sk`'s request `place`: derived as
    /// `place_in_trace` does, in the trace of its client's request when
    /// that client is here and its request was linked as a leg.
    fn server_ids(&self, sk: u64, place: u32, incoming: Option<&TraceParent>) -> Option<SpanIds> {
        let talk = self.http.get(&sk)?;
        let (shared, (local, remote)) = talk.shared.zip(talk.ends)?;
        let both = self.pairs.both_here(shared, local, remote);
        let mut ids = shared.request(place, false, both, incoming);
        if both {
            let client = self.pairs.other(shared, local, remote);
            let link = client
                .and_then(|c| self.http.get(&c))
                .and_then(|t| t.links.iter().find(|(p, _)| *p == place));
            if let Some((_, l)) = link {
                ids.trace_id = l.trace_id;
            }
        }
        Some(ids)
    }

    /// A client's record: into the trace of the request it is a leg of,
    /// and that request's legs take it.
    fn apply_link(&mut self, sk: u64, r: &mut RequestRecord) {
        let Some(place) = r.stream_id.or(r.request_index) else {
            return;
        };
        let Some(talk) = self.http.get_mut(&sk) else {
            return;
        };
        let Some(&(_, link)) = talk.links.iter().find(|(p, _)| *p == place) else {
            return;
        };
        let served_since = self
            .http
            .get(&link.inbound_sk)
            .and_then(|t| t.asked_at(link.inbound_place, None))
            .map(|c| self.clock.to_unix_ns(c.asked.start_ns));
        self.link_record(sk, r, link, served_since);
    }

    /// Puts client end `sk`'s record `r` in the trace of the request `link`
    /// names, and among that request's legs.
    /// `served_since`: when that request began (unix ns), if known.
    fn link_record(
        &mut self,
        sk: u64,
        r: &mut RequestRecord,
        link: Link,
        served_since: Option<u64>,
    ) {
        r.trace.trace_id = Some(Hex(link.trace_id));
        r.trace.parent_span_id = Some(Hex(link.parent_span_id));
        r.link_rule = Some(link.rule);
        if r.connection.is_some() {
            let talk = self.http.get_mut(&sk);
            if let Some(f) = talk.and_then(|t| t.first_request.as_mut()) {
                f.trace = r.trace.ids();
            }
        }
        // A leg that opened its connection while the request it serves was
        // waiting waited on the connect (and TLS handshake) too: as a
        // proxy's upstream time counts it. A connection opened before (an
        // HTTP/2 session opened at start-up, whose first stream this is)
        // was not waited on.
        let start = match (&r.connection, served_since) {
            (Some(c), Some(since)) if c.start_unix_ns >= since => {
                c.start_unix_ns.min(r.start_unix_ns)
            }
            _ => r.start_unix_ns,
        };
        let leg = UpstreamLeg {
            remote_addr: r.remote_addr,
            remote_port: r.remote_port,
            host: r.host.clone(),
            status: r.status,
            start_unix_ns: start,
            duration_ns: r.end_unix_ns.saturating_sub(start),
            ttfb_ns: r.ttfb_ns,
            link_rule: link.rule,
            span_id: r.trace.span_id.unwrap_or(Hex([0; 8])),
        };
        if let Some(server) = self.http.get_mut(&link.inbound_sk) {
            if server.legs.len() < LEGS_HELD {
                server.legs.push((link.inbound_place, leg));
            }
        }
    }

    /// A server's record: in its client's trace when that client's request
    /// was a leg; with the legs it made and its own time outside them.
    fn take_legs(&mut self, sk: u64, r: &mut RequestRecord) {
        let Some(place) = r.stream_id.or(r.request_index) else {
            return;
        };
        if let Some(ids) = self.server_ids(sk, place, r.trace.incoming.as_ref()) {
            r.trace.set(ids);
        }
        let Some(talk) = self.http.get_mut(&sk) else {
            return;
        };
        if r.connection.is_some() {
            if let Some(f) = &mut talk.first_request {
                f.trace = r.trace.ids();
            }
        }
        if talk.legs.is_empty() {
            return;
        }
        let (mine, rest): (Vec<_>, Vec<_>) = talk.legs.drain(..).partition(|(p, _)| *p == place);
        // Legs of requests still in flight stay; the others are stale.
        // HTTP/1.x requests end in order; HTTP/2 streams in any.
        let open = |p: u32| match &talk.h2 {
            Some(h2) => h2.streams().any(|x| x.stream_id == Some(p)),
            None => p > place,
        };
        talk.legs = rest.into_iter().filter(|&(p, _)| open(p)).collect();
        if mine.is_empty() {
            return;
        }
        let legs: Vec<UpstreamLeg> = mine.into_iter().map(|(_, l)| l).collect();
        r.own_time_ns = Some(proxy::own_time_ns(r.start_unix_ns, r.end_unix_ns, &legs));
        r.upstream = Some(legs);
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{
        http::{PlaintextEvent, DATA_FROM_START},
        tls::op,
        Conn, AF_INET, DIR_INBOUND, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED,
    };

    use super::*;
    use crate::{
        clock::Clock,
        decode::{Event, Plaintext},
        process::ProcessCache,
    };

    /// Socket `sk` of a connection on 127.0.0.1 from port `local` to
    /// `remote`.
    fn end(sk: u64, local: u16, remote: u16, direction: u8) -> Conn {
        let mut c = Conn {
            sk,
            start_ns: 100,
            established_ns: 200,
            family: AF_INET,
            direction,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            sport: local,
            dport: remote,
            ..Conn::default()
        };
        c.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        c.daddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        c
    }

    fn call(t: &mut ConnTable, conn: Conn, op: u8, at: u64, bytes: &[u8]) {
        let ev = PlaintextEvent::of_call(conn, op, at, bytes, DATA_FROM_START);
        t.handle(Event::Plaintext(Plaintext::new(ev)));
    }

    fn owner(t: &mut ConnTable, sk: u64, pid: u32, tid: u32) {
        t.handle(Event::Owner {
            ts_ns: 1,
            sk,
            pid,
            tid,
            comm: *b"proxy\0\0\0\0\0\0\0\0\0\0\0",
            direction: DIR_OUTBOUND,
            remote: None,
            remote_port: 0,
        });
    }

    const ASKED: &[u8] = b"GET /a HTTP/1.1\r\nHost: proxy\r\n\r\n";
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

    /// client -> proxy -> backend, all here: one trace, each record the
    /// child of the one before, the proxy's inbound record with its leg.
    #[test]
    fn a_proxied_call_is_one_trace_with_the_proxys_own_time_apart() {
        let me = std::process::id();
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        // The proxy (this process) listens on its inbound requests' port:
        // their owner is not known before the legs begin.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let client = end(5, 40000, port, DIR_OUTBOUND);
        let inbound = end(10, port, 40000, DIR_INBOUND);
        // The leg's connection opens while the inbound request waits.
        let outbound = Conn {
            start_ns: 1_150,
            established_ns: 1_180,
            ..end(20, 40001, 9000, DIR_OUTBOUND)
        };
        let backend = end(30, 9000, 40001, DIR_INBOUND);
        owner(&mut t, 5, me, me);
        owner(&mut t, 20, me, me);
        call(&mut t, client, op::WRITE, 1_000, ASKED);
        call(&mut t, inbound, op::READ, 1_100, ASKED);
        call(&mut t, outbound, op::WRITE, 1_200, ASKED);
        call(&mut t, backend, op::READ, 1_300, ASKED);
        call(&mut t, backend, op::WRITE, 1_400, ANSWER);
        call(&mut t, outbound, op::READ, 1_500, ANSWER);
        call(&mut t, inbound, op::WRITE, 1_600, ANSWER);
        call(&mut t, client, op::READ, 1_700, ANSWER);
        let by_port = |port: u16, dir: Direction| {
            let r = t
                .requests_out
                .iter()
                .find(|r| r.local_port == port && r.direction == dir);
            r.expect("a record").clone()
        };
        let c = by_port(40000, Direction::Outbound);
        let pi = by_port(port, Direction::Inbound);
        let po = by_port(40001, Direction::Outbound);
        let b = by_port(9000, Direction::Inbound);
        let trace = c.trace.trace_id.expect("placed");
        for r in [&pi, &po, &b] {
            assert_eq!(r.trace.trace_id, Some(trace), "{r:?}");
        }
        assert_eq!(c.trace.parent_span_id, None);
        assert_eq!(pi.trace.parent_span_id, c.trace.span_id);
        assert_eq!(po.trace.parent_span_id, pi.trace.span_id);
        assert_eq!(po.link_rule, Some(proxy::BY_REQUEST_MATCH));
        assert_eq!(b.trace.parent_span_id, po.trace.span_id);
        let legs = pi.upstream.as_ref().expect("its leg");
        assert_eq!(legs.len(), 1);
        // The leg opened its connection: from the connect on.
        let connect = po
            .connection
            .as_ref()
            .expect("its first request")
            .start_unix_ns;
        let leg_ns = po.end_unix_ns - connect;
        assert_eq!((legs[0].remote_port, legs[0].duration_ns), (9000, leg_ns));
        assert_eq!(legs[0].span_id, po.trace.span_id.expect("placed"));
        // Its part within the inbound request is upstream time.
        let within = po.end_unix_ns - connect.max(pi.start_unix_ns);
        assert_eq!(pi.own_time_ns, Some(pi.duration_ns - within));
        // The conversations gone, a tick forgets what linked them.
        assert!(t.pairs.len() > 0 && !t.serving.is_empty());
        for conn in [client, inbound, outbound, backend] {
            t.handle(Event::Close(
                Conn {
                    end_ns: 2_000,
                    ..conn
                },
                observer_common::TlsConn::default(),
            ));
        }
        t.set_clock(Clock::with_offset(0));
        assert_eq!((t.pairs.len(), t.serving.len()), (0, 0));
    }

    /// A thread-per-request proxy: its inbound sockets' owner threads are
    /// learnt at their first answer byte, after the legs. Two requests
    /// alike in flight; each leg waits and is linked by thread once the
    /// request its thread served is over, its record and its backend's
    /// record (same trace) held until then.
    #[test]
    fn legs_of_a_thread_per_request_server_are_linked_by_thread() {
        let me = std::process::id();
        let (t1, t2) = (me + 1, me + 2);
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let in1 = end(10, port, 40000, DIR_INBOUND);
        let in2 = end(11, port, 40002, DIR_INBOUND);
        let out1 = end(20, 40001, 9000, DIR_OUTBOUND);
        let out2 = end(21, 40003, 9000, DIR_OUTBOUND);
        let backend1 = end(30, 9000, 40001, DIR_INBOUND);
        owner(&mut t, 20, me, t1);
        owner(&mut t, 21, me, t2);
        call(&mut t, in1, op::READ, 1_100, ASKED);
        call(&mut t, in2, op::READ, 1_150, ASKED);
        call(&mut t, out1, op::WRITE, 1_200, ASKED);
        call(&mut t, out2, op::WRITE, 1_250, ASKED);
        call(&mut t, backend1, op::READ, 1_300, ASKED);
        call(&mut t, backend1, op::WRITE, 1_400, ANSWER);
        call(&mut t, out1, op::READ, 1_500, ANSWER);
        call(&mut t, out2, op::READ, 1_550, ANSWER);
        assert!(t.requests_out.is_empty(), "{:?}", t.requests_out);
        // The second request's thread answers first.
        owner(&mut t, 11, me, t2);
        call(&mut t, in2, op::WRITE, 1_600, ANSWER);
        assert_eq!(t.requests_out.len(), 2, "in2 and its leg");
        owner(&mut t, 10, me, t1);
        call(&mut t, in1, op::WRITE, 1_700, ANSWER);
        assert_eq!(t.requests_out.len(), 5, "in1, its leg and its backend's");
        assert!(t.waiting.is_empty());
        let by_port = |port: u16, dir: Direction| {
            let r = t
                .requests_out
                .iter()
                .find(|r| r.local_port == port && r.direction == dir);
            r.expect("a record").clone()
        };
        for (inbound, leg) in [(40000, 40001), (40002, 40003)] {
            let i = t
                .requests_out
                .iter()
                .find(|r| r.remote_port == inbound)
                .expect("inbound")
                .clone();
            let o = by_port(leg, Direction::Outbound);
            assert_eq!(o.link_rule, Some(proxy::BY_THREAD), "{o:?}");
            assert_eq!(o.trace.trace_id, i.trace.trace_id);
            assert_eq!(o.trace.parent_span_id, i.trace.span_id);
            let legs = i.upstream.as_ref().expect("its leg");
            assert_eq!(legs.len(), 1);
            assert_eq!(Some(legs[0].span_id), o.trace.span_id);
        }
        let b = by_port(9000, Direction::Inbound);
        let o1 = by_port(40001, Direction::Outbound);
        assert_eq!(b.trace.trace_id, o1.trace.trace_id);
        assert_eq!(b.trace.parent_span_id, o1.trace.span_id);
    }

    /// A waiting leg whose requests never end (cut connections) goes out
    /// after a few ticks, by the other rules; all go out when watching
    /// stops.
    #[test]
    fn a_waiting_leg_goes_out_after_a_few_ticks() {
        let me = std::process::id();
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let in1 = end(10, port, 40000, DIR_INBOUND);
        let out1 = end(20, 40001, 9000, DIR_OUTBOUND);
        owner(&mut t, 20, me, me + 1);
        call(&mut t, in1, op::READ, 1_100, ASKED);
        call(&mut t, out1, op::WRITE, 1_200, ASKED);
        call(&mut t, out1, op::READ, 1_500, ANSWER);
        assert!(t.requests_out.is_empty());
        for _ in 0..WAIT_TICKS {
            t.age_waits();
        }
        assert!(t.requests_out.is_empty());
        t.age_waits();
        let o = &t.requests_out[0];
        // The one candidate's path matches: the request match links it.
        assert_eq!(o.link_rule, Some(proxy::BY_REQUEST_MATCH));
        let out2 = end(21, 40003, 9000, DIR_OUTBOUND);
        owner(&mut t, 21, me, me + 1);
        call(&mut t, out2, op::WRITE, 1_600, ASKED);
        call(&mut t, out2, op::READ, 1_700, ANSWER);
        assert_eq!(t.requests_out.len(), 1);
        t.end_all_waits();
        assert_eq!(t.requests_out.len(), 2);
    }

    /// An HTTP/2 frame: length, type, flags, stream, payload.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A HEADERS frame ending its stream.
    fn headers(
        enc: &mut loona_hpack::Encoder<'_>,
        stream: u32,
        fields: &[(&str, &str)],
    ) -> Vec<u8> {
        let block = enc.encode(fields.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
        frame(1, 0x1 | 0x4, stream, &block)
    }

    /// An event-loop proxy whose legs are HTTP/2 streams of one upstream
    /// connection (a gateway calling its upstream over h2): ten streams in
    /// flight at once, each linked to the request it serves, answered in
    /// the reverse order.
    #[test]
    fn http2_streams_are_legs_each_of_its_own_request() {
        const N: u32 = 10;
        let me = std::process::id();
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let inbound = |i: u32| end(10 + u64::from(i), port, 40000 + i as u16, DIR_INBOUND);
        let up = end(99, 39999, 9000, DIR_OUTBOUND);
        owner(&mut t, 99, me, me);
        for i in 0..N {
            let asked = format!("GET /p{i} HTTP/1.1\r\nHost: proxy\r\n\r\n");
            call(
                &mut t,
                inbound(i),
                op::READ,
                1_100 + u64::from(i),
                asked.as_bytes(),
            );
        }
        let (mut asks, mut answers) = (loona_hpack::Encoder::new(), loona_hpack::Encoder::new());
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(frame(4, 0, 0, &[]));
        for i in 0..N {
            let path = format!("/p{i}");
            let fields = [
                (":method", "GET"),
                (":scheme", "http"),
                (":authority", "up"),
                (":path", path.as_str()),
            ];
            out.extend(headers(&mut asks, 1 + 2 * i, &fields));
        }
        call(&mut t, up, op::WRITE, 1_200, &out);
        let mut back = frame(4, 0, 0, &[]);
        for i in (0..N).rev() {
            back.extend(headers(&mut answers, 1 + 2 * i, &[(":status", "200")]));
        }
        call(&mut t, up, op::READ, 1_400, &back);
        for i in 0..N {
            owner(&mut t, 10 + u64::from(i), me, me);
            call(&mut t, inbound(i), op::WRITE, 1_500 + u64::from(i), ANSWER);
        }
        for i in 0..N {
            let find = |f: &dyn Fn(&RequestRecord) -> bool| {
                let r = t.requests_out.iter().find(|r| f(r));
                r.expect("a record").clone()
            };
            let o = find(&|r| r.stream_id == Some(1 + 2 * i));
            let inb = find(&|r| r.remote_port == 40000 + i as u16);
            assert_eq!(o.link_rule, Some(proxy::BY_REQUEST_MATCH), "{o:?}");
            assert_eq!(o.trace.parent_span_id, inb.trace.span_id);
            assert_eq!(o.trace.trace_id, inb.trace.trace_id);
            let legs = inb.upstream.as_ref().expect("its leg");
            assert_eq!(legs.len(), 1);
            assert_eq!(Some(legs[0].span_id), o.trace.span_id);
        }
    }

    /// Two requests alike in flight at an event-loop proxy: no guess.
    #[test]
    fn two_candidates_alike_make_no_link() {
        let me = std::process::id();
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let in1 = end(10, port, 40000, DIR_INBOUND);
        let in2 = end(11, port, 40002, DIR_INBOUND);
        let outbound = end(20, 40001, 9000, DIR_OUTBOUND);
        owner(&mut t, 20, me, me);
        call(&mut t, in1, op::READ, 1_100, ASKED);
        call(&mut t, in2, op::READ, 1_150, ASKED);
        call(&mut t, outbound, op::WRITE, 1_200, ASKED);
        call(&mut t, outbound, op::READ, 1_500, ANSWER);
        let po = &t.requests_out[0];
        assert_eq!((po.direction, po.link_rule), (Direction::Outbound, None));
        assert_eq!(po.trace.parent_span_id, None);
    }

    /// A client's request is no leg of a server it does not run: an
    /// inbound request whose owner is not known yet is a candidate only for
    /// a process listening on its port.
    #[test]
    fn a_request_to_a_server_is_not_a_leg_of_that_servers_request() {
        let me = std::process::id();
        let mut t = ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0));
        // Nobody here listens on the (unbound) port 9 of this inbound one.
        let other_server = end(10, 9, 40000, DIR_INBOUND);
        let client = end(20, 40001, 9, DIR_OUTBOUND);
        owner(&mut t, 20, me, me);
        call(&mut t, other_server, op::READ, 1_100, ASKED);
        call(&mut t, client, op::WRITE, 1_200, ASKED);
        call(&mut t, client, op::READ, 1_500, ANSWER);
        let r = &t.requests_out[0];
        assert_eq!((r.direction, r.link_rule), (Direction::Outbound, None));
    }
}
