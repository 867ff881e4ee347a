//! Records as the pipeline makes them, for the tests that read them typed
//! and as `watch --json` prints them (the cause rules' and `diagnose`'s).

use std::sync::Arc;

use observer_common::{Conn, AF_INET, DIR_INBOUND, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED};

use crate::{
    clock::Clock,
    dns::{DnsJoin, DnsRecord},
    gpu::{history::GpuUse, GpuRecord},
    http::{GenAi, RequestRecord, RpcRecord, StreamStats},
    pools::{Closes, PoolRecord},
    record::{ConnRecord, State},
    tls::{TlsRecord, TlsSource, TtfbSource},
};

pub const MS: u64 = 1_000_000;
/// The monotonic clock's zero on the wall clock.
pub const T0: u64 = 1_700_000_000_000_000_000;

/// A closed outbound connection from 10.0.0.5:40000 to 10.0.0.9:`port` by
/// pid 7 "client", as `ConnRecord::new` makes one: connect 2 ms, the answer's
/// first byte 30 ms after the request's, 100 ms in all, 2 retransmits.
pub fn conn(port: u16) -> ConnRecord {
    conn_with(port, |_| {})
}

/// [`conn`] with its kernel record changed first (a failed connect, a
/// connection still open).
pub fn conn_with(port: u16, change: impl FnOnce(&mut Conn)) -> ConnRecord {
    let mut c = Conn {
        sk: 1,
        start_ns: MS,
        established_ns: 3 * MS,
        first_tx_ns: 4 * MS,
        first_rx_ns: 34 * MS,
        end_ns: 101 * MS,
        bytes_tx: 300,
        bytes_rx: 4_000,
        retransmits: 2,
        srtt_us: 1_500,
        pid: 7,
        tid: 8,
        comm: *b"client\0\0\0\0\0\0\0\0\0\0",
        sport: 40000,
        dport: port,
        family: AF_INET,
        direction: DIR_OUTBOUND,
        flags: FLAG_OWNED | FLAG_ESTABLISHED,
        ..Conn::default()
    };
    c.saddr[..4].copy_from_slice(&[10, 0, 0, 5]);
    c.daddr[..4].copy_from_slice(&[10, 0, 0, 9]);
    change(&mut c);
    let state = if c.end_ns == 0 {
        State::Open
    } else {
        State::Closed
    };
    ConnRecord::new(&c, None, &Clock::with_offset(T0.into()), state)
}

/// The server's end of [`conn`]: pid 9 "server", on 10.0.0.9:`port`,
/// answering 25 ms after the request came in.
pub fn server_conn(port: u16) -> ConnRecord {
    let mut c = Conn {
        sk: 2,
        start_ns: 2 * MS,
        first_rx_ns: 4 * MS,
        first_tx_ns: 29 * MS,
        end_ns: 100 * MS,
        pid: 9,
        tid: 9,
        comm: *b"server\0\0\0\0\0\0\0\0\0\0",
        sport: port,
        dport: 40000,
        family: AF_INET,
        direction: DIR_INBOUND,
        flags: FLAG_OWNED | FLAG_ESTABLISHED,
        ..Conn::default()
    };
    c.saddr[..4].copy_from_slice(&[10, 0, 0, 9]);
    c.daddr[..4].copy_from_slice(&[10, 0, 0, 5]);
    ConnRecord::new(&c, None, &Clock::with_offset(T0.into()), State::Closed)
}

/// A client's TLS session read by its library's probes: setup 1 ms,
/// handshake 40 ms, the answer's first byte after 25 ms.
pub fn tls(server_name: &str) -> TlsRecord {
    TlsRecord {
        library: Some("openssl"),
        source: TlsSource::Library,
        setup_ns: Some(MS),
        handshake_ns: Some(40 * MS),
        handshake_error: None,
        server_name: Some(Arc::from(server_name)),
        version: Some("1.3"),
        ttfb_ns: Some(25 * MS),
        ttfb_source: Some(TtfbSource::Plaintext),
        exchanges: Some(1),
        plaintext_sent: Some(120),
        plaintext_received: Some(2_000),
        handshake_start_unix_ns: Some(T0 + 4 * MS),
        ttfb_start_unix_ns: Some(T0 + 45 * MS),
        ttfb_unmeasured: None,
    }
}

/// The lookup of `name` that led to a connection: 12 ms, answered.
pub fn dns_join(name: &str) -> DnsJoin {
    DnsJoin {
        name: Arc::from(name),
        duration_ns: 12 * MS,
        result: "ok",
        source: "libc",
        joined_by: "answer",
        start_unix_ns: T0 - 13 * MS,
    }
}

/// The lookup's own record, as the DNS reader makes one.
pub fn dns_record(pid: u32, name: &str, start_unix_ns: u64) -> DnsRecord {
    let mut r = crate::dns::record::tests::rec(pid, pid, start_unix_ns, &["10.0.0.9"]);
    r.name = Arc::from(name);
    r.duration_ns = 12 * MS;
    r.server = Some("10.0.0.53".into());
    r.retries = Some(1);
    r
}

/// One device at `pct`% at its busiest (no UUID: named by its place).
pub fn gpu(uuid: Option<&str>, pct: u32) -> GpuRecord {
    GpuRecord {
        devices: vec![GpuUse {
            uuid: uuid.map(str::to_owned),
            utilization_gpu_pct_max: Some(pct),
            utilization_gpu_pct_avg: Some(f64::from(pct) / 2.0),
            memory_used_bytes: Some(1 << 30),
            memory_total_bytes: Some(16 << 30),
            process_used_memory_bytes: None,
            process_sm_util_pct: None,
            throttle_reasons: 0,
        }],
    }
}

/// A GET on `c` 3 ms after its start, as the HTTP/1.1 reader makes one:
/// first byte after 30 ms, 60 ms in all.
pub fn request_on(c: &ConnRecord) -> RequestRecord {
    RequestRecord {
        kind: "request",
        pid: c.pid,
        tid: c.tid,
        comm: c.comm.clone(),
        exe: None,
        container: None,
        direction: c.direction,
        local_addr: c.local_addr,
        local_port: c.local_port,
        remote_addr: c.remote_addr,
        remote_port: c.remote_port,
        protocol: "http/1.1",
        stream_id: None,
        headers_undecodable: false,
        reset_code: None,
        request_index: Some(1),
        method: Some("GET".into()),
        path: Some("/v1/items".into()),
        host: Some("api.test:8080".into()),
        status: Some(200),
        content_type: Some("application/json".into()),
        start_unix_ns: c.start_unix_ns + 3 * MS,
        end_unix_ns: c.start_unix_ns + 63 * MS,
        duration_ns: 60 * MS,
        request_bytes: 120,
        response_bytes: 2_000,
        ttfb_ns: Some(30 * MS),
        streamed: false,
        stream: None,
        gen_ai: None,
        rpc: None,
        gpu: None,
        diagnosis: None,
        error: None,
        link_rule: None,
        upstream: None,
        own_time_ns: None,
        trace: Default::default(),
        conn_key: c.conn_key,
        connection: None,
    }
}

/// A server-sent event stream: `events` events, the first after `first_ns`.
pub fn stream(events: u32, first_ns: u64) -> StreamStats {
    StreamStats {
        events: Some(events),
        first_event_ns: Some(first_ns),
        mean_gap_ns: Some(20 * MS),
        max_gap_ns: Some(90 * MS),
    }
}

/// A streamed chat completion's usage: `tokens` generated, the first after
/// `first_ns`.
pub fn gen_ai(tokens: Option<u64>, first_ns: Option<u64>) -> GenAi {
    GenAi {
        provider: "openai",
        operation: "chat",
        request_model: Some("gpt-test".into()),
        response_model: Some("gpt-test-1".into()),
        stream: true,
        input_tokens: Some(12),
        output_tokens: tokens,
        cached_input_tokens: None,
        reasoning_output_tokens: None,
        time_to_first_token_ns: first_ns,
        finish_reason: Some("stop".into()),
        content_events: 40,
        content_gaps: None,
        time_per_output_token_ns: Some(20 * MS),
        output_tokens_per_second: Some(50.0),
        unreadable_events: 0,
    }
}

/// A unary gRPC call's answer: status 0, one message each way.
pub fn rpc() -> RpcRecord {
    RpcRecord {
        system: "grpc",
        service: Some("helloworld.Greeter".into()),
        method: Some("SayHello".into()),
        grpc_status: Some(0),
        grpc_message: None,
        request_messages: Some(1),
        response_messages: Some(1),
        time_to_first_message_ns: Some(28 * MS),
    }
}

/// Pool `pid` -> 10.0.0.9:`port` at `t_ns` after [`T0`].
pub fn pool(pid: u32, port: u16, t_ns: u64, open: u32, idle: u32, requests: u64) -> PoolRecord {
    PoolRecord {
        kind: "pool",
        time_unix_ns: T0 + t_ns,
        pid,
        comm: Some(Arc::from("client")),
        exe: None,
        container: None,
        peer_addr: "10.0.0.9".parse().expect("an address"),
        peer_port: port,
        server_name: Some(Arc::from("api.test")),
        open,
        busy: open - idle,
        idle,
        requests,
        new_connections: u64::from(open),
        new_connection_share: (requests > 0).then(|| open as f64 / requests as f64),
        closed: Closes::default(),
        requests_per_connection: None,
        age_at_close_ns: None,
        since_unix_ns: T0,
    }
}
