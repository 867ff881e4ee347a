//! A typed record gives the call its `watch --json` line gives: `diagnose`
//! reads the pipeline's records typed and a recorded stream as JSON, and
//! must answer alike.

use std::sync::Arc;

use super::{
    call::Call,
    fixtures::{
        conn, conn_with, dns_join, gen_ai, gpu, request_on, rpc, server_conn, stream, tls, MS,
    },
};
use crate::{http::RequestRecord, record::ConnRecord};

/// Both readings of a connection record, and the call they agree on.
fn conn_call(r: &ConnRecord) -> Call {
    let json = serde_json::to_value(r).expect("serializes");
    let typed = Call::from_conn(r);
    assert_eq!(typed, Call::from_json(&json).expect("a call"), "{json}");
    typed
}

/// Both readings of a request record, and the call they agree on.
fn request_call(r: &RequestRecord) -> Call {
    let json = serde_json::to_value(r).expect("serializes");
    let typed = Call::from_request(r);
    assert_eq!(typed, Call::from_json(&json).expect("a call"), "{json}");
    typed
}

#[test]
fn a_plain_connection_reads_alike() {
    let c = conn_call(&conn(8080));
    assert_eq!((c.record, c.direction), ("connection", "outbound"));
    assert_eq!((c.connect_ns, c.ttfb_ns), (Some(2 * MS), Some(30 * MS)));
    assert_eq!((c.retransmits, c.srtt_us), (2, Some(1_500)));
    assert_eq!(c.remote_addr, "10.0.0.9");
    let s = conn_call(&server_conn(8080));
    assert_eq!((s.direction, s.ttfb_ns), ("inbound", Some(25 * MS)));
}

#[test]
fn a_tls_connection_reads_its_handshake_and_name_alike() {
    let mut r = conn(443);
    r.tls = Some(tls("api.example.com"));
    let c = conn_call(&r);
    assert_eq!(c.tls_handshake_ns, Some(40 * MS));
    assert_eq!(c.tls_setup_ns, Some(MS));
    // The socket's first byte back was the handshake's: the TLS one counts.
    assert_eq!(c.ttfb_ns, Some(25 * MS));
    assert_eq!(c.host.as_deref(), Some("api.example.com"));
    // With its lookup: the server name still names it.
    r.dns = Some(dns_join("lb.example.com"));
    let c = conn_call(&r);
    assert_eq!(c.host.as_deref(), Some("api.example.com"));
    assert_eq!(c.dns.as_ref().map(|d| d.duration_ns), Some(12 * MS));
}

#[test]
fn a_connection_after_a_lookup_is_named_by_it() {
    let mut r = conn(8080);
    r.dns = Some(dns_join("api.test"));
    let c = conn_call(&r);
    assert_eq!(c.host.as_deref(), Some("api.test"));
    assert_eq!(
        c.dns.map(|d| (d.name, d.result)),
        Some(("api.test".into(), "ok".into()))
    );
}

#[test]
fn a_failed_connect_reads_alike() {
    // SYNs unanswered until the client gave up.
    let timeout = conn_with(8080, |c| {
        c.flags = observer_common::FLAG_OWNED;
        c.error = libc::ETIMEDOUT as u32;
        c.established_ns = 0;
        c.first_tx_ns = 0;
        c.first_rx_ns = 0;
        c.end_ns = 1_031 * MS;
        c.srtt_us = 0;
    });
    let c = conn_call(&timeout);
    assert_eq!(c.error.as_deref(), Some("timeout"));
    assert_eq!(
        (c.connect_ns, c.ttfb_ns, c.duration_ns),
        (None, None, 1_030 * MS)
    );
    let refused = conn_with(1, |c| {
        c.flags = observer_common::FLAG_OWNED | observer_common::FLAG_RESET_RX;
        c.established_ns = 0;
        c.first_tx_ns = 0;
        c.first_rx_ns = 0;
        c.resets_rx = 1;
    });
    assert_eq!(conn_call(&refused).error.as_deref(), Some("refused"));
}

#[test]
fn open_midstream_v6_and_gpu_connections_read_alike() {
    let open = conn_with(8080, |c| c.end_ns = 0);
    assert_eq!(conn_call(&open).duration_ns, 0);
    let midstream = conn_with(8080, |c| c.flags |= observer_common::FLAG_MIDSTREAM);
    assert_eq!(conn_call(&midstream).ttfb_ns, None);
    let mut v6 = conn(8080);
    v6.local_addr = "2001:db8::5".parse().expect("an address");
    v6.remote_addr = "2001:db8::9".parse().expect("an address");
    assert_eq!(conn_call(&v6).remote_addr, "2001:db8::9");
    let mut g = conn(8000);
    g.gpu = Some(gpu(Some("GPU-1"), 97));
    assert_eq!(conn_call(&g).gpus[0].device, "GPU-1");
    // No UUID: the device is named by its place in the record.
    g.gpu = Some(gpu(None, 80));
    assert_eq!(conn_call(&g).gpus[0].device, "0");
}

#[test]
fn an_http_request_reads_alike_with_its_hosts_port_dropped() {
    let mut r = request_on(&conn(8080));
    let c = request_call(&r);
    assert_eq!(c.record, "request");
    assert_eq!(c.host.as_deref(), Some("api.test"));
    assert_eq!((c.ttfb_ns, c.duration_ns), (Some(30 * MS), 60 * MS));
    assert_eq!((c.method.as_deref(), c.status), (Some("GET"), Some(200)));
    for (host, name) in [
        ("api.test", "api.test"),
        ("[2001:db8::9]:8443", "[2001:db8::9]"),
        // Not cut at the address's last colon.
        ("[2001:db8::9]", "[2001:db8::9]"),
        ("2001:db8::9", "2001:db8::9"),
    ] {
        r.host = Some(host.into());
        assert_eq!(request_call(&r).host.as_deref(), Some(name), "{host}");
    }
    // Unresolved: no process, no host, no answer.
    r.host = None;
    r.pid = None;
    r.comm = None;
    r.status = None;
    r.ttfb_ns = None;
    r.error = Some("no response");
    let c = request_call(&r);
    assert_eq!(
        (c.host, c.pid, c.error.as_deref()),
        (None, None, Some("no response"))
    );
}

/// The first request holds its connection as it stood (`connection`, not
/// printed): the call is the request's own; its lookup, connect, TLS,
/// retransmits and the connection's error join from the connection's
/// record, as they do from a file.
#[test]
fn a_first_request_reads_as_printed_without_its_connection() {
    let mut on = conn(443);
    on.tls = Some(tls("api.example.com"));
    on.dns = Some(dns_join("api.example.com"));
    on.error = Some("reset");
    let mut r = request_on(&on);
    r.host = None;
    r.error = Some("incomplete");
    r.connection = Some(Box::new(on));
    let c = request_call(&r);
    assert_eq!(
        (c.dns, c.connect_ns, c.tls_handshake_ns, c.srtt_us),
        (None, None, None, None)
    );
    assert_eq!((c.retransmits, c.error.as_deref()), (0, Some("incomplete")));
    assert_eq!(c.host, None, "named by the connection's record when joined");
    r.error = None;
    assert_eq!(request_call(&r).error, None);
}

#[test]
fn llm_streams_read_their_first_token_and_tokens_alike() {
    let mut r = request_on(&conn(443));
    r.path = Some("/v1/chat/completions".into());
    r.content_type = Some("text/event-stream".into());
    r.streamed = true;
    r.duration_ns = 2_100 * MS;
    r.stream = Some(stream(41, 900 * MS));
    r.gen_ai = Some(gen_ai(Some(39), Some(950 * MS)));
    let c = request_call(&r);
    assert_eq!((c.first_token_ns, c.tokens), (Some(950 * MS), Some(39)));
    assert_eq!(c.max_gap_ns, Some(90 * MS));
    // No usage sent: the stream's events stand in.
    r.gen_ai = Some(gen_ai(None, None));
    let c = request_call(&r);
    assert_eq!((c.first_token_ns, c.tokens), (Some(900 * MS), Some(41)));
    // A plain event stream.
    r.gen_ai = None;
    assert_eq!(request_call(&r).tokens, Some(41));
    r.stream = None;
    r.gen_ai = Some(gen_ai(Some(39), Some(950 * MS)));
    assert_eq!(request_call(&r).max_gap_ns, None);
}

#[test]
fn h2_grpc_gpu_and_proxy_requests_read_alike() {
    let mut r = request_on(&conn(50051));
    r.protocol = "h2";
    r.stream_id = Some(3);
    r.method = Some("POST".into());
    r.path = Some("/helloworld.Greeter/SayHello".into());
    r.host = Some("greeter.test:50051".into());
    r.content_type = Some("application/grpc".into());
    r.rpc = Some(rpc());
    assert_eq!(request_call(&r).host.as_deref(), Some("greeter.test"));
    r.reset_code = Some(8);
    r.error = Some("reset_stream");
    assert_eq!(request_call(&r).error.as_deref(), Some("reset_stream"));
    r.headers_undecodable = true;
    (r.method, r.path, r.host, r.status) = (None, None, None, None);
    assert_eq!(request_call(&r).path, None);
    let mut g = request_on(&conn(8000));
    g.gpu = Some(gpu(Some("GPU-0"), 99));
    assert_eq!(request_call(&g).gpus[0].utilization_pct, 99);
    // A proxy's inbound request and its own time outside its leg.
    let mut p = request_on(&server_conn(8080));
    p.comm = Some(Arc::from("nginx"));
    p.own_time_ns = Some(7 * MS);
    p.link_rule = None;
    let c = request_call(&p);
    assert_eq!((c.direction, c.own_ns), ("inbound", Some(7 * MS)));
}
