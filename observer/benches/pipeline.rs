//! The userspace pipeline alone: decode ring-buffer records and correlate them
//! in the connection table, on one core. `cargo xtask bench` reports the result
//! in events/s (EVENTS_PER_ITER events per iteration).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use observer::{
    clock::Clock,
    conntrack::ConnTable,
    decode::{as_bytes, decode},
    process::ProcessCache,
};
use observer_common::{
    CloseEvent, Conn, EventHeader, EventKind, OwnerEvent, TlsConn, AF_INET, DIR_OUTBOUND,
    FLAG_ESTABLISHED, FLAG_OWNED,
};

const EVENTS_PER_ITER: usize = 10_000;

/// Connection `i` of this process (outbound, to 10.0.0.x:443) as the kernel
/// reports it: its owner record and its close record.
fn connection(i: u64) -> (OwnerEvent, CloseEvent) {
    let pid = std::process::id();
    let sk = 0xffff_8880_0000_0000 + i * 4096;
    let owner = OwnerEvent {
        hdr: EventHeader {
            kind: EventKind::Owner as u32,
            size: std::mem::size_of::<OwnerEvent>() as u32,
            ts_ns: 1_000 + i,
        },
        sk,
        pid,
        tid: pid,
        comm: *b"bench\0\0\0\0\0\0\0\0\0\0\0",
        direction: DIR_OUTBOUND,
        _pad: 0,
        family: observer_common::AF_INET,
        dport: 443,
        _pad2: 0,
        daddr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    };
    let mut conn = Conn {
        sk,
        start_ns: 1_000 + i,
        established_ns: 2_000 + i,
        first_tx_ns: 3_000 + i,
        first_rx_ns: 9_000 + i,
        end_ns: 20_000 + i,
        bytes_tx: 517,
        bytes_rx: 4096,
        segs_out: 1,
        segs_in: 2,
        pid,
        tid: pid,
        sport: 40_000 + (i % 20_000) as u16,
        dport: 443,
        family: AF_INET,
        direction: DIR_OUTBOUND,
        flags: FLAG_OWNED | FLAG_ESTABLISHED,
        ..Conn::default()
    };
    conn.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
    conn.daddr[..4].copy_from_slice(&[10, 0, 0, (i % 250) as u8]);
    let close = CloseEvent {
        hdr: EventHeader {
            kind: EventKind::Close as u32,
            size: std::mem::size_of::<CloseEvent>() as u32,
            ts_ns: 20_000 + i,
        },
        conn,
        tls: TlsConn::default(),
    };
    (owner, close)
}

/// Owner + close records for EVENTS_PER_ITER / 2 connections of this process,
/// as the kernel would write them.
fn stream() -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(EVENTS_PER_ITER);
    for i in 0..(EVENTS_PER_ITER / 2) as u64 {
        let (owner, close) = connection(i);
        out.push(as_bytes(&owner).to_vec());
        out.push(as_bytes(&close).to_vec());
    }
    out
}

fn pipeline(c: &mut Criterion) {
    let records = stream();
    let mut table = ConnTable::new(ProcessCache::new("/proc"), Clock::sample());
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(EVENTS_PER_ITER as u64));
    group.bench_function("decode_and_correlate", |b| {
        b.iter(|| {
            for bytes in &records {
                let ev = decode(bytes).expect("synthetic records decode");
                black_box(table.handle(ev));
            }
        })
    });
    group.finish();
}

/// Content events per streamed answer in the request benchmark.
const CHUNKS: usize = 20;

/// One plaintext record (a TLS library call) of an outbound connection.
fn plaintext(op: u8, t: u64, bytes: &[u8], first: bool) -> Vec<u8> {
    use observer_common::http::{PlaintextEvent, DATA_FROM_START};
    let (_, close) = connection(0);
    let flags = if first { DATA_FROM_START } else { 0 };
    as_bytes(&PlaintextEvent::of_call(close.conn, op, t, bytes, flags)).to_vec()
}

/// A streamed chat completion as its client's library calls: the request
/// written, the answer's head with the first event, CHUNKS content events
/// read one by one, the finish, usage and [DONE] in one last read.
fn chat_completion(first: bool) -> Vec<Vec<u8>> {
    use observer_common::tls::op;
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
    let event = |json: &str| chunk(&format!("data: {json}\n\n"));
    let body = r#"{"model":"bench-model","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say twenty words."}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: api.bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let base = r#""id":"c1","object":"chat.completion.chunk","model":"bench-model-1""#;
    let mut out = vec![plaintext(op::WRITE, 10_000, request.as_bytes(), first)];
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        event(&format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}}}}]}}"#))
    );
    out.push(plaintext(op::READ, 20_000, head.as_bytes(), false));
    for i in 0..CHUNKS {
        let e = event(&format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{"content":"word{i} "}}}}]}}"#
        ));
        out.push(plaintext(
            op::READ,
            30_000 + i as u64 * 1_000,
            e.as_bytes(),
            false,
        ));
    }
    let last = format!(
        "{}{}{}0\r\n\r\n",
        event(&format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}"#
        )),
        event(&format!(
            r#"{{{base},"choices":[],"usage":{{"prompt_tokens":31,"completion_tokens":{CHUNKS},"total_tokens":51}}}}"#
        )),
        chunk("data: [DONE]\n\n"),
    );
    out.push(plaintext(op::READ, 60_000, last.as_bytes(), false));
    out
}

/// Requests on one kept-alive TLS connection: decode, parse (HTTP head,
/// chunked framing, server-sent events, the LLM API's JSON keys) and the
/// request record, per request.
fn requests(c: &mut Criterion) {
    let mut table = ConnTable::new(ProcessCache::new("/proc"), Clock::sample());
    // The connection's first request, once: those after it are what is timed.
    for bytes in chat_completion(true) {
        table.handle(decode(&bytes).expect("synthetic records decode"));
    }
    table.requests_out.clear();
    let records = chat_completion(false);
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(1));
    group.bench_function("streamed_request", |b| {
        b.iter(|| {
            for bytes in &records {
                let ev = decode(bytes).expect("synthetic records decode");
                black_box(table.handle(ev));
            }
            assert_eq!(table.requests_out.len(), 1, "one request record");
            black_box(table.requests_out.pop());
        })
    });
    group.finish();
}

/// Requests in one iteration of the churn benchmark.
const CHURN_REQUESTS: usize = 100;

/// The 8 records of one request of `cargo xtask bench`'s connection-churn
/// workload (wrk to nginx on one host, a new connection per request): each
/// end's owner, the request and its answer seen on each end (packets of a
/// plain connection), each end's close.
fn churn_request(i: u64) -> Vec<Vec<u8>> {
    use observer_common::{
        http::{PlaintextEvent, DATA_FROM_START, DATA_PLAIN},
        tls::op,
        DIR_INBOUND,
    };
    let (client_owner, client_close) = connection(i);
    let (mut server_owner, mut server_close) = connection(i + 1_000_000);
    let client = client_close.conn;
    let mut server = server_close.conn;
    server.direction = DIR_INBOUND;
    (server.sport, server.dport) = (client.dport, client.sport);
    (server.saddr, server.daddr) = (client.daddr, client.saddr);
    server_owner.direction = DIR_INBOUND;
    server_close.conn = server;
    let request = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n";
    let answer = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sat, 05 Dec 2026 11:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: 4\r\nLast-Modified: Sat, 05 Dec 2026 10:00:00 GMT\r\nConnection: close\r\nETag: \"1-4\"\r\nAccept-Ranges: bytes\r\n\r\nok!\n";
    let flags = DATA_FROM_START | DATA_PLAIN;
    let seen = |conn: Conn, op: u8, t: u64, bytes: &[u8]| {
        as_bytes(&PlaintextEvent::of_call(conn, op, t, bytes, flags)).to_vec()
    };
    vec![
        as_bytes(&client_owner).to_vec(),
        as_bytes(&server_owner).to_vec(),
        seen(client, op::WRITE, 3_000 + i, request),
        seen(server, op::READ, 3_100 + i, request),
        seen(server, op::WRITE, 8_000 + i, answer),
        seen(client, op::READ, 9_000 + i, answer),
        as_bytes(&server_close).to_vec(),
        as_bytes(&client_close).to_vec(),
    ]
}

/// The userspace work of one churn request from its records to its
/// exported bytes: decode, correlate, metrics, and every span encoded.
/// Steadier than the daemon's CPU in the bench (no nginx, wrk or
/// scheduler beside it), and the same work.
fn churn(c: &mut Criterion) {
    use observer::export::{
        attrs::Ids,
        metrics::Metrics,
        span_wire::TraceBatch,
        spans::{write_batch, Traced},
    };
    let records: Vec<Vec<u8>> = (0..CHURN_REQUESTS as u64)
        .flat_map(|i| churn_request(i * 100_000))
        .collect();
    let mut table = ConnTable::new(ProcessCache::new("/proc"), Clock::sample());
    let mut metrics = Metrics::new(10_000, 0);
    let mut ids = Ids::new();
    let mut batch = TraceBatch::default();
    let mut traced = Vec::new();
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(CHURN_REQUESTS as u64));
    group.bench_function("churn_request", |b| {
        b.iter(|| {
            for bytes in &records {
                let ev = decode(bytes).expect("synthetic records decode");
                // As the correlator does: the cause judged once, for the
                // metrics and the span.
                if let Some(mut r) = table.handle(ev) {
                    r.diagnosis = Some(observer::cause::cause_of_conn(&r));
                    metrics.record(&r);
                    traced.push(Traced::Conn(r));
                }
                for mut r in table.requests_out.drain(..) {
                    r.diagnosis = Some(observer::cause::cause_of_request(&r));
                    metrics.record_request(&r);
                    traced.push(Traced::Request(r));
                }
            }
            assert_eq!(
                traced.len(),
                4 * CHURN_REQUESTS,
                "two connections, two requests"
            );
            write_batch(&traced, "bench", None, &mut ids, &mut batch);
            black_box(batch.encode());
            traced.clear();
        })
    });
    group.finish();
}

criterion_group!(benches, pipeline, requests, churn);
criterion_main!(benches);
