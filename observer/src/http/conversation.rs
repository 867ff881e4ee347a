//! One connection's HTTP/1.x requests, in order, from its plaintext calls.
//!
//! The side that writes requests is the client (an outbound connection's
//! owner); its times are the calls' own: a client's request starts at the
//! entry of its first write and its answer's first byte is the return of
//! its first read (curl's `time_starttransfer - time_pretransfer`); a
//! server's request starts when its read returns and its answer at the
//! entry of its first write.

use observer_common::{
    http::{PlaintextEvent, DATA_FROM_START},
    tls::op,
    FLAG_MIDSTREAM,
};

use super::{
    exchange::{pieces, Cut, Exchange, Stream},
    gen_ai,
    h2::{frame_header, headers_of_request, H2, PREFACE},
    head::{self, Framing},
};

#[derive(Debug, Default)]
pub struct Conversation {
    requests: u32,
    /// Whether the first call seen was the connection's first exchange
    /// (None: no call seen yet).
    from_start: Option<bool>,
    current: Option<Exchange>,
    /// Answers seen without their request (the probes came in between).
    pub orphans: u64,
    /// From the client's preface on: an HTTP/2 connection.
    pub h2: Option<Box<H2>>,
    /// A connection first seen mid-way: whether its owner is the client,
    /// from the first call that shows it (its direction in the kernel is a
    /// guess from the ports).
    pub owner_is_client: Option<bool>,
    /// The first request's record was made: what its trace shows.
    pub first_request: Option<crate::record::FirstRequest>,
    /// The trace nonce this end shares with the other (see
    /// `trace_context::Pairs`).
    pub shared: Option<super::trace_context::Shared>,
    /// This end's address and port, and the other end's.
    pub ends: Option<(super::trace_context::End, super::trace_context::End)>,
    /// Requests of this (client) end linked as legs of a request its
    /// process serves, by index, until their records are made.
    pub links: Vec<(u32, super::proxy::Link)>,
    /// The last request index a link was looked for (once a request).
    pub link_tried: u32,
    /// Legs of this (server) end's requests, by index, until their records
    /// are made.
    pub legs: Vec<(u32, super::proxy::UpstreamLeg)>,
    /// A request's first bytes read alone (a few bytes at most), and when:
    /// the read that follows carries the rest of its head.
    begun: Option<(Vec<u8>, u64)>,
}

/// Whether the owner of a connection first seen mid-way is the client, from
/// a call that starts a request or an answer (None: this one does not tell).
fn owner_is_client(ev: &PlaintextEvent) -> Option<bool> {
    let b = pieces(ev).0;
    let writer_is_client = headers_of_request(b).or_else(|| {
        if head::request(b).is_some() {
            Some(true)
        } else {
            b.starts_with(b"HTTP/1.").then_some(false)
        }
    })?;
    Some(writer_is_client == (ev.op == op::WRITE))
}

/// An HTTP/2 connection's first bytes in one direction: the client's
/// preface, or the server's SETTINGS frame (which a server may send before
/// it reads the preface).
fn starts_h2(b: &[u8], request_dir: bool) -> bool {
    if request_dir {
        b.starts_with(&PREFACE[..14])
    } else {
        // Length (a multiple of 6), type 4, flags 0, stream 0.
        b.len() >= 9
            && b[3] == 4
            && b[4] == 0
            && b[5..9] == [0; 4]
            && frame_header(b).0.is_multiple_of(6)
    }
}

impl Conversation {
    /// Takes one call's bytes; returns the exchanges it completed.
    pub fn feed(&mut self, ev: &PlaintextEvent, mut outbound: bool) -> Vec<Exchange> {
        let wrote = ev.op == op::WRITE;
        let mut done = Vec::new();
        let midstream = ev.conn.flags & FLAG_MIDSTREAM != 0;
        if midstream {
            if self.owner_is_client.is_none() {
                self.owner_is_client = owner_is_client(ev);
            }
            // Until a call shows which end asks, nothing can be read.
            let Some(client) = self.owner_is_client else {
                return done;
            };
            outbound = client;
        }
        let from_start = *self
            .from_start
            .get_or_insert(ev.flags & DATA_FROM_START != 0);
        if self.h2.is_none() && self.requests == 0 && self.current.is_none() {
            let first = pieces(ev).0;
            if starts_h2(first, wrote == outbound) {
                self.h2 = Some(Box::new(H2::new(from_start)));
            } else if midstream && headers_of_request(first).is_some() {
                self.h2 = Some(Box::new(H2::midstream()));
            }
        }
        if let Some(h2) = &mut self.h2 {
            done = h2.feed(ev, outbound);
        } else if wrote == outbound {
            self.request_bytes(ev, outbound, &mut done);
        } else {
            self.response_bytes(ev, outbound, &mut done);
        }
        for x in &mut done {
            if let Some(c) = &mut x.call {
                c.finish(x.last_ns);
            }
        }
        done
    }

    /// The HTTP/1.x request in flight whose head was seen, with its index
    /// (None: none, or its index is unknown), as proxy linking reads it;
    /// `tid`: the owner's thread, when known.
    pub fn asked(&self, tid: Option<u32>) -> Option<(u32, super::proxy::Candidate<'_>)> {
        let x = self.current.as_ref()?;
        Some((x.index?, candidate(x, tid)?))
    }

    /// Every request in flight whose head was seen, as proxy linking reads
    /// the requests a server serves: the HTTP/1.x one, or each HTTP/2
    /// stream's (its stream id its place).
    pub fn serving(&self, tid: Option<u32>) -> Vec<(u32, super::proxy::Candidate<'_>)> {
        match &self.h2 {
            Some(h2) => h2
                .streams()
                .filter_map(|x| Some((x.stream_id?, candidate(x, tid)?)))
                .collect(),
            None => self.asked(tid).into_iter().collect(),
        }
    }

    /// Request `place` in flight (the HTTP/1.x request of that index, or
    /// the HTTP/2 stream of that id), as proxy linking reads it.
    pub fn asked_at(&self, place: u32, tid: Option<u32>) -> Option<super::proxy::Candidate<'_>> {
        match &self.h2 {
            Some(h2) => candidate(h2.streams().find(|x| x.stream_id == Some(place))?, tid),
            None => self.asked(tid).filter(|(p, _)| *p == place).map(|(_, c)| c),
        }
    }

    /// Whether a request is in flight whose head was seen (see `serving`).
    pub fn serves(&self) -> bool {
        match &self.h2 {
            Some(h2) => h2.streams().any(|x| x.request.is_some()),
            None => self.asked(None).is_some(),
        }
    }

    /// Requests seen so far: HTTP/1.x exchanges, or HTTP/2 streams begun.
    pub fn requests_seen(&self) -> u32 {
        self.h2
            .as_ref()
            .map_or(self.requests, |h| h.counts().streams)
    }

    /// Whether an exchange was seen on the connection (its pool use is
    /// known: idle when none is in flight).
    pub fn exchanged(&self) -> bool {
        self.requests_seen() > 0 || self.current.is_some()
    }

    /// An exchange begun and not ended: bytes of it may still be on their
    /// way when the connection's close is seen.
    pub fn in_flight(&self) -> bool {
        self.current.is_some() || self.h2.as_ref().is_some_and(|h| h.has_open_streams())
    }

    /// The connection closed: the exchanges in flight end.
    pub fn close(&mut self) -> Vec<(Exchange, Option<Cut>)> {
        let mut open = self.h2.as_mut().map(|h2| h2.close()).unwrap_or_default();
        open.extend(self.current.take());
        open.into_iter()
            .map(|mut x| {
                if let Some(c) = &mut x.call {
                    c.finish(x.last_ns);
                }
                let whole = x.complete || x.stream.as_ref().is_some_and(|s| s.finished);
                let cut = (!whole).then_some(Cut::Closed);
                (x, cut)
            })
            .collect()
    }

    fn request_bytes(&mut self, ev: &PlaintextEvent, outbound: bool, done: &mut Vec<Exchange>) {
        let mut t = if outbound { ev.entry_ns } else { ev.ret_ns };
        let (mut first, second) = pieces(ev);
        let mut len = u64::from(ev.len);
        let joined;
        if let Some((begun, at)) = self.begun.take() {
            len += begun.len() as u64;
            t = at;
            joined = [begun.as_slice(), first].concat();
            first = &joined;
        }
        let starts = head::request(first);
        // Bytes after a whole request are the next one's, even before its
        // answer is seen: a server's read and write return on two threads
        // (Go's net/http reads a byte of the next request while it answers),
        // so their events can arrive out of order.
        let continuing = self
            .current
            .as_ref()
            .is_some_and(|x| x.response.is_none() && starts.is_none() && !x.request_whole());
        if continuing {
            if let Some(x) = &mut self.current {
                x.request_bytes += u64::from(ev.len);
                if let Some(c) = &mut x.call {
                    c.request_bytes(first, false);
                    if let Some(s) = second {
                        c.request_bytes(s, true);
                    }
                }
            }
            return;
        }
        let Some(h) = starts else {
            if head::could_begin_request(first) {
                self.begun = Some((first.to_vec(), t));
            }
            // Otherwise request bytes with no request started: not HTTP we
            // follow.
            return;
        };
        // A new request ends the one before (its answer had no length).
        if let Some(prev) = self.current.take() {
            done.push(prev);
        }
        self.requests += 1;
        let mut x = Exchange {
            index: (self.from_start == Some(true)).then_some(self.requests),
            start_ns: t,
            request_bytes: len,
            ..Exchange::default()
        };
        if let Some((api, mut call)) = h.path.as_deref().and_then(gen_ai::call_for) {
            x.api = Some(api);
            call.start_request(h.framing == Framing::Chunked);
            // A head not seen whole leaves the body's start unknown.
            let body = h.len.map(|l| &first[l.min(first.len())..]);
            call.request_bytes(body.unwrap_or_default(), body.is_none());
            if let Some(s) = second {
                call.request_bytes(s, true);
            }
            x.call = Some(Box::new(call));
        }
        x.request = Some(h);
        self.current = Some(x);
    }

    fn response_bytes(&mut self, ev: &PlaintextEvent, outbound: bool, done: &mut Vec<Exchange>) {
        let t = if outbound { ev.ret_ns } else { ev.entry_ns };
        let end_t = ev.ret_ns;
        let (first, second) = pieces(ev);
        let Some(x) = &mut self.current else {
            self.orphans += 1;
            return;
        };
        let body: &[u8];
        if x.response.is_none() {
            let Some(h) = head::response(first) else {
                self.orphans += 1;
                return;
            };
            if h.status.is_some_and(|s| (100..200).contains(&s)) {
                // An interim answer (100 Continue): the real one follows.
                return;
            }
            x.first_byte_ns = t;
            body = h.len.map_or(&first[..0], |l| &first[l.min(first.len())..]);
            x.body_bytes = h.len.map(|l| u64::from(ev.len).saturating_sub(l as u64));
            let sse = h.content_type.as_deref() == Some("text/event-stream");
            if sse {
                x.stream = Some(Stream {
                    events: Some(0),
                    ..Stream::default()
                });
            }
            if let Some(c) = &mut x.call {
                c.start_response(sse, h.framing == Framing::Chunked);
                if h.len.is_none() {
                    c.response_bytes(&[], true, t);
                }
            }
            x.response = Some(h);
        } else {
            body = first;
            if let Some(b) = &mut x.body_bytes {
                *b += u64::from(ev.len);
            }
        }
        x.response_bytes += u64::from(ev.len);
        x.last_ns = end_t;
        if let Some(s) = &mut x.stream {
            s.read(body, second.is_none(), t);
            s.mark_end(body);
            if let Some(tail) = second {
                s.mark_end(tail);
            }
        }
        if let Some(c) = &mut x.call {
            c.response_bytes(body, false, t);
            if let Some(s) = second {
                c.response_bytes(s, true, t);
            }
        }
        let tail = second.unwrap_or(body);
        let framing = x.response.as_ref().map_or(Framing::Close, |h| h.framing);
        x.complete = match framing {
            Framing::Length(n) => x.body_bytes.is_some_and(|b| b >= n),
            Framing::Chunked => tail.ends_with(b"0\r\n\r\n"),
            Framing::Close => false,
        };
        if x.complete {
            if let Some(x) = self.current.take() {
                done.push(x);
            }
        }
    }
}

/// What proxy linking reads of exchange `x` (its request head seen).
fn candidate(x: &Exchange, tid: Option<u32>) -> Option<super::proxy::Candidate<'_>> {
    let h = x.request.as_ref()?;
    let asked = super::proxy::Asked {
        method: h.method.as_deref(),
        path: h.path.as_deref(),
        request_id: h.request_id.as_deref(),
        traceparent: h.traceparent.as_ref(),
        start_ns: x.start_ns,
        tid,
    };
    Some(super::proxy::Candidate {
        asked,
        answered_ns: x.first_byte_ns,
    })
}

#[cfg(test)]
mod tests {
    use observer_common::Conn;

    use super::*;

    fn call(op: u8, t: u64, bytes: &[u8]) -> PlaintextEvent {
        PlaintextEvent::of_call(Conn::default(), op, t, bytes, DATA_FROM_START)
    }

    fn chunk(s: &str) -> String {
        format!("{:x}\r\n{s}\r\n", s.len())
    }

    /// hyper's server reads 24 bytes first (to tell an HTTP/2 preface), so
    /// a POST's request line arrives cut, its head and body after it.
    #[test]
    fn a_request_line_cut_short_on_the_server() {
        let mut c = Conversation::default();
        let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (cut, rest) = req.as_bytes().split_at(24);
        let first = call(op::READ, 1_000, cut);
        assert!(c.feed(&first, false).is_empty());
        assert!(c.feed(&call(op::READ, 2_000, rest), false).is_empty());
        let answer = r#"{"model":"m1","choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            answer.len()
        );
        assert!(c
            .feed(&call(op::WRITE, 300_000, head.as_bytes()), false)
            .is_empty());
        let done = c.feed(&call(op::WRITE, 301_000, answer.as_bytes()), false);
        assert_eq!(done.len(), 1);
        let x = &done[0];
        assert_eq!(x.request_bytes, req.len() as u64);
        // A server's request starts when its first bytes were read.
        assert_eq!(x.start_ns, first.ret_ns);
        let h = x.request.as_ref().expect("the request");
        assert_eq!(h.path.as_deref(), Some("/v1/chat/completions"));
    }

    #[test]
    fn a_streamed_chat_completion_from_the_client() {
        let mut c = Conversation::default();
        let body = r#"{"messages":[{"role":"user","content":"hi"}],"model":"tiny","stream":true}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        assert!(c
            .feed(&call(op::WRITE, 1_000, req.as_bytes()), true)
            .is_empty());
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(c
            .feed(&call(op::READ, 300_000, head.as_bytes()), true)
            .is_empty());
        let role = chunk("data: {\"model\":\"tiny-v2\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        c.feed(&call(op::READ, 301_000, role.as_bytes()), true);
        for i in 0..3u64 {
            let ev = chunk(&format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"w{i}\"}}}}]}}\n\n"
            ));
            c.feed(&call(op::READ, 340_000 + i * 40_000, ev.as_bytes()), true);
        }
        let usage = chunk(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n",
        ) + &chunk("data: [DONE]\n\n")
            + "0\r\n\r\n";
        let done = c.feed(&call(op::READ, 500_000, usage.as_bytes()), true);
        assert_eq!(done.len(), 1);
        let x = &done[0];
        assert_eq!(x.index, Some(1));
        assert!(x.complete);
        assert_eq!(x.start_ns, 1_000);
        assert_eq!(x.first_byte_ns, 300_010);
        let c = x.call.as_deref().expect("an LLM call");
        assert_eq!(c.first_content_ns, 340_010);
        assert_eq!(x.api, Some(("openai", "chat")));
        assert_eq!(c.request_model.as_deref(), Some("tiny"));
        assert_eq!(c.response_model.as_deref(), Some("tiny-v2"));
        assert_eq!((c.input_tokens, c.output_tokens), (Some(5), Some(3)));
        let s = x.stream.as_ref().expect("present");
        // The role chunk, three words, usage and [DONE].
        assert_eq!(s.events, Some(6));
        assert_eq!(s.first_ns, 301_010);
        assert_eq!(s.gap_max_ns, 80_000);
        assert_eq!(
            x.response_bytes,
            (head.len() + role.len() + usage.len()) as u64
                + 3 * chunk("data: {\"choices\":[{\"delta\":{\"content\":\"w0\"}}]}\n\n").len()
                    as u64
        );
    }

    /// An inference server's side of an Anthropic stream written the plain
    /// Python way: its record, its SERVER span's GenAI attributes and the
    /// `gen_ai.server.*` metrics.
    #[test]
    fn a_served_anthropic_stream_to_record_span_and_server_metrics() {
        use crate::{
            clock::Clock,
            export::{attrs::Ids, metrics::Metrics, spans::request_spans},
            http::RequestRecord,
            record::{ConnRecord, Direction, State},
        };
        let mut c = Conversation::default();
        let body = r#"{"model": "claude-t", "max_tokens": 64, "stream": true, "messages": []}"#;
        let req = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.feed(&call(op::READ, 1_000, req.as_bytes()), false);
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let start = chunk("event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"model\": \"claude-t-1\", \"usage\": {\"input_tokens\": 12, \"cache_read_input_tokens\": 4, \"output_tokens\": 1}}}\n\n");
        c.feed(
            &call(
                op::WRITE,
                100_000_000,
                (head.to_owned() + &start).as_bytes(),
            ),
            false,
        );
        for (i, t) in [130u64, 160, 200].into_iter().enumerate() {
            let ev = chunk(&format!("event: content_block_delta\ndata: {{\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {{\"type\": \"text_delta\", \"text\": \"w{i}\"}}}}\n\n"));
            c.feed(&call(op::WRITE, t * 1_000_000, ev.as_bytes()), false);
        }
        let end = chunk("event: message_delta\ndata: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\"}, \"usage\": {\"output_tokens\": 3}}\n\n")
            + &chunk("event: message_stop\ndata: {\"type\": \"message_stop\"}\n\n")
            + "0\r\n\r\n";
        let done = c.feed(&call(op::WRITE, 210_000_000, end.as_bytes()), false);
        assert_eq!(done.len(), 1);
        let clock = Clock::with_offset(0);
        let mut conn = ConnRecord::new(&Conn::default(), None, &clock, State::Closed);
        conn.direction = Direction::Inbound;
        let r = RequestRecord::new(done[0].clone(), None, &conn, &clock, false);
        let g = r.gen_ai.as_ref().expect("an LLM call");
        assert_eq!((g.provider, g.operation), ("anthropic", "chat"));
        assert_eq!(g.request_model.as_deref(), Some("claude-t"));
        assert_eq!(g.response_model.as_deref(), Some("claude-t-1"));
        assert_eq!(
            (g.input_tokens, g.output_tokens, g.cached_input_tokens),
            (Some(12), Some(3), Some(4))
        );
        assert_eq!(g.finish_reason.as_deref(), Some("end_turn"));
        // A server's request starts when its read returns (1,010 ns).
        assert_eq!(g.time_to_first_token_ns, Some(130_000_000 - 1_010));
        assert_eq!(g.content_events, 3);
        let gaps = g.content_gaps.as_ref().expect("two gaps");
        assert_eq!((gaps.count, gaps.max_ns), (2, 40_000_000));
        assert_eq!(g.time_per_output_token_ns, Some(35_000_000));
        assert_eq!(g.output_tokens_per_second.map(f64::round), Some(29.0));

        let spans = request_spans(&r, &mut Ids::new());
        let attr = |k: &str| {
            spans[0]
                .attributes
                .iter()
                .find(|a| a.key == k)
                .map(|a| format!("{:?}", a.value))
        };
        assert_eq!(spans[0].name, "chat claude-t");
        assert_eq!(
            attr("gen_ai.usage.cache_read.input_tokens").as_deref(),
            Some("Int(4)")
        );
        assert_eq!(
            attr("observer.gen_ai.content_events").as_deref(),
            Some("Int(3)")
        );
        assert_eq!(
            attr("observer.gen_ai.gap.max").as_deref(),
            Some("Double(0.04)")
        );
        let mut m = Metrics::new(100, 0);
        m.record_request(&r);
        let text = m.prometheus();
        for name in [
            "gen_ai_server_request_duration_seconds_count",
            "gen_ai_server_time_to_first_token_seconds_count",
            "gen_ai_server_time_per_output_token_seconds_count",
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(name) && l.ends_with(" 1")),
                "{name}: {text}"
            );
        }
        assert!(!text.contains("gen_ai_client_"), "a server's call: {text}");
    }

    #[test]
    fn keep_alive_requests_are_numbered_and_a_cut_answer_is_incomplete() {
        let mut c = Conversation::default();
        for i in 1..=2u64 {
            c.feed(
                &call(op::READ, i * 1000, b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"),
                false,
            );
            let done = c.feed(
                &call(
                    op::WRITE,
                    i * 1000 + 500,
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                ),
                false,
            );
            assert_eq!(done.len(), 1);
            assert_eq!(done[0].index, Some(i as u32));
            // A server's request starts when its read returns.
            assert_eq!(done[0].start_ns, i * 1000 + 10);
            assert_eq!(done[0].first_byte_ns, i * 1000 + 500);
        }
        c.feed(
            &call(op::READ, 9000, b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"),
            false,
        );
        c.feed(
            &call(
                op::WRITE,
                9500,
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok",
            ),
            false,
        );
        let (x, cut) = c.close().pop().expect("present");
        assert_eq!((x.index, cut), (Some(3), Some(Cut::Closed)));
    }

    /// Go's net/http server reads one byte of the next request while it
    /// answers the last (to see a close); the rest comes in the next read.
    #[test]
    fn a_request_whose_first_byte_was_read_alone() {
        let mut c = Conversation::default();
        c.feed(&call(op::READ, 1000, b"GET /a HTTP/1.1\r\n\r\n"), false);
        // Its read may return before the answer's write does.
        c.feed(&call(op::READ, 1200, b"G"), false);
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let first = c.feed(&call(op::WRITE, 1100, ok), false);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].request_bytes, 19);
        c.feed(
            &call(op::READ, 2000, b"ET /b HTTP/1.1\r\nHost: h\r\n\r\n"),
            false,
        );
        let done = c.feed(&call(op::WRITE, 2500, ok), false);
        assert_eq!(done.len(), 1);
        let x = &done[0];
        assert_eq!(
            x.request.as_ref().and_then(|h| h.path.as_deref()),
            Some("/b")
        );
        assert_eq!(x.index, Some(2));
        // It began when its first byte was read; all its bytes count.
        assert_eq!(x.start_ns, 1210);
        assert_eq!(x.request_bytes, 28);
        // Bytes that cannot begin a request are not kept.
        c.feed(&call(op::READ, 3000, b"xyz"), false);
        c.feed(&call(op::READ, 3100, b"GET /c HTTP/1.1\r\n\r\n"), false);
        let done = c.feed(&call(op::WRITE, 3500, ok), false);
        assert_eq!(
            done[0].request.as_ref().and_then(|h| h.path.as_deref()),
            Some("/c")
        );
    }

    #[test]
    fn requests_after_missed_calls_are_not_numbered() {
        let mut c = Conversation::default();
        let mut late = call(op::WRITE, 1, b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
        late.flags = 0;
        c.feed(&late, true);
        let done = c.feed(&call(op::READ, 5, b"HTTP/1.1 204 No Content\r\n\r\n"), true);
        assert_eq!(done[0].index, None);
    }

    #[test]
    fn an_answer_without_its_request_is_an_orphan() {
        let mut c = Conversation::default();
        c.feed(
            &call(op::READ, 1, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            true,
        );
        assert_eq!(c.orphans, 1);
        assert!(c.close().is_empty());
    }
}
