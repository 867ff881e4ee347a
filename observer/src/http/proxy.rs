//! Proxy legs: an outbound request a process makes while it serves an
//! inbound one is a leg of that request (nginx's `proxy_pass`, a gateway, a
//! service calling another).
//!
//! The link is decided when the outbound request's head has been seen (the
//! inbound request is then still waiting for its answer), by the first of
//! these rules that leaves exactly one candidate among the process's
//! inbound requests in flight: the trace context the proxy forwarded; the
//! same thread (thread-per-request servers); the same method and path (and
//! `X-Request-Id` when both carry one), for event-loop proxies. A rule that
//! leaves several candidates narrows the set for the next; several left at
//! the end make no link: no guess. A thread-per-request server's socket
//! gets its owner thread only at its first answer byte: a leg that may
//! serve such a request waits for it (see `conntrack::legs`).

use std::net::IpAddr;

use serde::Serialize;

use super::trace_context::{SpanId, TraceId, TraceParent};

/// Which rule linked a leg to the request it serves.
pub const BY_TRACE_CONTEXT: &str = "trace_context";
pub const BY_THREAD: &str = "thread";
pub const BY_REQUEST_MATCH: &str = "request_match";

/// What the rules read of a request in flight.
#[derive(Clone, Copy, Debug)]
pub struct Asked<'a> {
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub traceparent: Option<&'a TraceParent>,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// The owner's thread, when known.
    pub tid: Option<u32>,
}

/// An inbound request in flight that an outbound one may serve.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub asked: Asked<'a>,
    /// When its answer's first byte went out (0: not yet).
    pub answered_ns: u64,
}

/// The inbound request a leg serves, and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub inbound_sk: u64,
    pub inbound_place: u32,
    /// The inbound request's trace and span: the leg's trace and parent.
    pub trace_id: TraceId,
    pub parent_span_id: SpanId,
    pub rule: &'static str,
}

/// The candidate (index into `candidates`) an outbound request `out`
/// serves, and the rule that chose it.
pub fn choose(out: &Asked<'_>, candidates: &[Candidate<'_>]) -> Option<(usize, &'static str)> {
    let mut left: Vec<usize> = (0..candidates.len())
        .filter(|&i| waiting_at(&candidates[i], out.start_ns))
        .collect();
    type Rule = fn(&Asked<'_>, &Asked<'_>) -> bool;
    let rules: [(&'static str, Rule); 3] = [
        (BY_TRACE_CONTEXT, |o, c| {
            o.traceparent
                .zip(c.traceparent)
                .is_some_and(|(a, b)| a.trace_id == b.trace_id)
        }),
        (BY_THREAD, |o, c| o.tid.is_some() && o.tid == c.tid),
        (BY_REQUEST_MATCH, |o, c| {
            let ids_agree = match (o.request_id, c.request_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            o.method.is_some() && o.method == c.method && o.path == c.path && ids_agree
        }),
    ];
    for (name, rule) in rules {
        let matched: Vec<usize> = left
            .iter()
            .copied()
            .filter(|&i| rule(out, &candidates[i].asked))
            .collect();
        match matched.len() {
            0 => {}
            1 => return Some((matched[0], name)),
            _ => left = matched,
        }
    }
    None
}

/// Whether candidate `c` was waiting for its answer at `start_ns` (when an
/// outbound request began): only those may be served by it.
pub fn waiting_at(c: &Candidate<'_>, start_ns: u64) -> bool {
    c.asked.start_ns <= start_ns && (c.answered_ns == 0 || c.answered_ns >= start_ns)
}

/// One leg of a proxied request, on the inbound request's record.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct UpstreamLeg {
    pub remote_addr: IpAddr,
    pub remote_port: u16,
    /// The Host the leg asked for.
    pub host: Option<String>,
    pub status: Option<u16>,
    /// The leg's request, or its connection's start when the leg opened it
    /// (its connect and TLS handshake are upstream time, as a proxy counts
    /// its upstream's: nginx's `$upstream_response_time`).
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    /// First byte of the leg's request -> first byte of its answer.
    pub ttfb_ns: Option<u64>,
    pub link_rule: &'static str,
    /// The leg's span (16 hex digits).
    pub span_id: super::trace_context::Hex<8>,
}

/// The time of a request `[start, end)` outside its legs (their union).
pub fn own_time_ns(start: u64, end: u64, legs: &[UpstreamLeg]) -> u64 {
    let mut spans: Vec<(u64, u64)> = legs
        .iter()
        .map(|l| {
            let s = l.start_unix_ns.clamp(start, end);
            (s, (l.start_unix_ns + l.duration_ns).clamp(s, end))
        })
        .collect();
    spans.sort_unstable();
    let mut covered = 0;
    let mut reach = start;
    for (s, e) in spans {
        let s = s.max(reach);
        if e > s {
            covered += e - s;
            reach = e;
        }
    }
    (end - start).saturating_sub(covered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(method: &'static str, path: &'static str, start_ns: u64) -> Asked<'static> {
        Asked {
            method: Some(method),
            path: Some(path),
            request_id: None,
            traceparent: None,
            start_ns,
            tid: None,
        }
    }

    fn waiting(a: Asked<'_>) -> Candidate<'_> {
        Candidate {
            asked: a,
            answered_ns: 0,
        }
    }

    #[test]
    fn an_event_loop_proxy_links_by_method_and_path_and_never_guesses() {
        let c = [
            waiting(asked("GET", "/a", 10)),
            waiting(asked("GET", "/b", 11)),
            waiting(asked("POST", "/b", 12)),
        ];
        assert_eq!(
            choose(&asked("GET", "/b", 20), &c),
            Some((1, BY_REQUEST_MATCH))
        );
        // Began before the inbound request: not its leg.
        assert_eq!(choose(&asked("GET", "/b", 5), &c), None);
        // Two alike: no guess.
        let twins = [
            waiting(asked("GET", "/b", 10)),
            waiting(asked("GET", "/b", 11)),
        ];
        assert_eq!(choose(&asked("GET", "/b", 20), &twins), None);
        // An inbound request already answered when the leg began is not one.
        let answered = [Candidate {
            asked: asked("GET", "/b", 10),
            answered_ns: 15,
        }];
        assert_eq!(choose(&asked("GET", "/b", 20), &answered), None);
    }

    #[test]
    fn a_forwarded_trace_context_or_the_thread_decides_first() {
        let tp = TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let other = TraceParent::parse(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let mut a = asked("GET", "/x", 10);
        a.traceparent = other.as_ref();
        let mut b = asked("GET", "/x", 11);
        b.traceparent = tp.as_ref();
        let mut out = asked("GET", "/x", 20);
        out.traceparent = tp.as_ref();
        let c = [waiting(a), waiting(b)];
        assert_eq!(choose(&out, &c), Some((1, BY_TRACE_CONTEXT)));
        let (mut t1, mut t2) = (asked("GET", "/x", 10), asked("GET", "/x", 11));
        t1.tid = Some(7);
        t2.tid = Some(8);
        let mut out = asked("POST", "/y", 20);
        out.tid = Some(8);
        assert_eq!(
            choose(&out, &[waiting(t1), waiting(t2)]),
            Some((1, BY_THREAD))
        );
        // X-Request-Id tells apart what method and path do not.
        let (mut r1, mut r2) = (asked("GET", "/x", 10), asked("GET", "/x", 11));
        r1.request_id = Some("one");
        r2.request_id = Some("two");
        let mut out = asked("GET", "/x", 20);
        out.request_id = Some("two");
        assert_eq!(
            choose(&out, &[waiting(r1), waiting(r2)]),
            Some((1, BY_REQUEST_MATCH))
        );
    }

    #[test]
    fn own_time_is_outside_the_union_of_the_legs() {
        let leg = |start_unix_ns, duration_ns| UpstreamLeg {
            remote_addr: IpAddr::from([127, 0, 0, 1]),
            remote_port: 80,
            host: None,
            status: None,
            start_unix_ns,
            duration_ns,
            ttfb_ns: None,
            link_rule: BY_THREAD,
            span_id: super::super::trace_context::Hex([1; 8]),
        };
        assert_eq!(own_time_ns(0, 100, &[]), 100);
        assert_eq!(own_time_ns(0, 100, &[leg(10, 50)]), 50);
        // Overlapping legs count once; one past the end is cut there.
        assert_eq!(
            own_time_ns(0, 100, &[leg(10, 50), leg(40, 40), leg(90, 50)]),
            20
        );
    }
}
