//! The rules, one injected cause at a time, on calls read from JSON as
//! `watch --json` prints them.

use serde_json::{json, Value};

use super::{collect::Collector, only::Only};
use crate::cause::{
    call::{Call, GpuBusy, ServerSide},
    diagnose, Cause, Thresholds,
};

const MS: u64 = 1_000_000;

fn request(extra: Value) -> Value {
    let mut v = json!({
        "kind": "request", "pid": 7, "comm": "client", "direction": "outbound",
        "local_addr": "127.0.0.1", "local_port": 40000,
        "remote_addr": "127.0.0.1", "remote_port": 8080,
        "method": "GET", "path": "/", "host": "api.test:8080", "status": 200,
        "start_unix_ns": 1_000_000_000_000u64, "duration_ns": 20 * MS, "ttfb_ns": 15 * MS,
    });
    for (k, x) in extra.as_object().expect("object") {
        v[k] = x.clone();
    }
    v
}

fn call(extra: Value) -> Call {
    Call::from_json(&request(extra)).expect("a call")
}

fn judge(c: &Call) -> (Cause, String) {
    let d = diagnose(c, &Thresholds::default());
    (d.cause, d.evidence)
}

#[test]
fn a_healthy_call_is_none() {
    let (cause, evidence) = judge(&call(json!({})));
    assert_eq!(cause, Cause::None);
    assert!(
        evidence.starts_with("no phase over its threshold"),
        "{evidence}"
    );
}

#[test]
fn a_slow_lookup_names_its_server_and_retries() {
    let mut c = call(json!({}));
    c.dns = Some(crate::cause::call::Lookup {
        name: "api.example.com".into(),
        duration_ns: 1200 * MS,
        result: "ok".into(),
        server: Some("10.0.0.2".into()),
        retries: Some(1),
    });
    assert_eq!(
        judge(&c),
        (
            Cause::Dns,
            "slow DNS lookup: api.example.com took 1.20 s at 10.0.0.2 (1 retry)".into()
        )
    );
}

#[test]
fn a_connect_past_the_syn_timeout_is_a_retransmitted_syn() {
    let c = call(json!({}));
    let c = Call {
        connect_ns: Some(1030 * MS),
        ..c
    };
    assert_eq!(
        judge(&c),
        (
            Cause::Connect,
            "SYN retransmitted: connect took 1.03 s".into()
        )
    );
    let c = Call {
        connect_ns: Some(150 * MS),
        srtt_us: Some(140_000),
        ..c
    };
    assert_eq!(
        judge(&c).1,
        "slow connect: connect took 150 ms (round trip 140 ms)"
    );
}

#[test]
fn a_slow_handshake_gives_the_round_trip() {
    let c = Call {
        tls_handshake_ns: Some(480 * MS),
        srtt_us: Some(120_000),
        ..call(json!({}))
    };
    assert_eq!(
        judge(&c),
        (Cause::Tls, "TLS handshake 480 ms: round trip 120 ms".into())
    );
    // The client's own setup before the handshake.
    let c = Call {
        tls_setup_ns: Some(300 * MS),
        ..call(json!({}))
    };
    assert_eq!(judge(&c).0, Cause::Client);
}

#[test]
fn a_late_first_byte_is_the_server_with_its_own_record_when_seen() {
    let mut c = call(json!({"ttfb_ns": 4100 * MS, "duration_ns": 4110 * MS}));
    c.server = Some(ServerSide {
        wait_ns: Some(4000 * MS),
        ..ServerSide::default()
    });
    assert_eq!(
        judge(&c),
        (
            Cause::Server,
            "server slow to answer: first byte after 4.10 s (the server on this host took 4.00 s)"
                .into()
        )
    );
}

/// Through a proxy whose legs were seen: its own time is "proxy", its
/// upstream's "server", whichever weighs more.
#[test]
fn a_proxys_own_time_is_told_apart_from_its_upstreams() {
    let through = |own_ms: u64| {
        let mut c = call(json!({"ttfb_ns": 3100 * MS, "duration_ns": 3110 * MS}));
        c.server = Some(ServerSide {
            wait_ns: Some(3000 * MS),
            own_ns: Some(own_ms * MS),
            ..ServerSide::default()
        });
        judge(&c)
    };
    assert_eq!(
        through(2500),
        (
            Cause::Proxy,
            "proxy slow: 2.50 s in the proxy itself, 500 ms upstream".into()
        )
    );
    assert_eq!(
        through(10),
        (
            Cause::Server,
            "server slow to answer: first byte after 3.10 s (upstream of the proxy 2.99 s, the proxy itself 10 ms)"
                .into()
        )
    );
    // The proxy's own record of the request says the same.
    let inbound =
        call(json!({"ttfb_ns": 3000 * MS, "duration_ns": 3000 * MS, "own_time_ns": 2000 * MS}));
    assert_eq!(judge(&inbound).0, Cause::Proxy);
}

#[test]
fn a_slow_token_stream_gives_its_rate_and_first_token() {
    // 39 tokens over 1 s after the first: 38 tokens/s.
    let c = call(json!({
        "ttfb_ns": 100 * MS, "duration_ns": 3100 * MS,
        "stream": {"events": 41, "first_event_ns": 2100 * MS, "mean_gap_ns": 25 * MS, "max_gap_ns": 40 * MS},
        "gen_ai": {"output_tokens": 39, "time_to_first_token_ns": 2100 * MS},
    }));
    // The first token's 2.1 s outweighs the stream's 1 s: the server.
    assert_eq!(judge(&c).0, Cause::Server);
    // 19 tokens over 1.5 s after the first: 13 tokens/s.
    let c = Call {
        first_token_ns: Some(500 * MS),
        duration_ns: 1500 * MS + 500 * MS,
        tokens: Some(20),
        ..c
    };
    let (cause, evidence) = judge(&c);
    assert_eq!(cause, Cause::Stream);
    assert_eq!(
        evidence,
        "slow token stream: 13 tokens/s after a 500 ms first token"
    );
    // A pause past --stream-gap-ms is a stall whatever the rate.
    let stalled = Call {
        tokens: Some(400),
        max_gap_ns: Some(1200 * MS),
        ..c.clone()
    };
    assert_eq!(
        judge(&stalled),
        (
            Cause::Stream,
            "stalled stream: a pause of 1.20 s after a 500 ms first token".into()
        )
    );
    // A fast stream is no cause.
    let c = Call {
        tokens: Some(400),
        ..c
    };
    assert_eq!(judge(&c).0, Cause::None);
}

#[test]
fn a_busy_gpu_explains_a_slow_server() {
    let c = call(json!({
        "ttfb_ns": 1500 * MS, "duration_ns": 1510 * MS,
        "gpu": {"devices": [{"uuid": "GPU-0", "utilization_gpu_pct_max": 99}]},
    }));
    assert_eq!(
        judge(&c),
        (
            Cause::Gpu,
            "GPU busy: device GPU-0 at 99% during the request; first byte after 1.50 s".into()
        )
    );
    // Busy, but the call was fast: not a cause.
    let c = Call {
        ttfb_ns: Some(10 * MS),
        ..c
    };
    assert_eq!(judge(&c).0, Cause::None);
    // The server's GPU on this host counts as well.
    let mut c = call(json!({"ttfb_ns": 1500 * MS, "duration_ns": 1510 * MS}));
    c.server = Some(ServerSide {
        wait_ns: Some(1490 * MS),
        gpus: vec![GpuBusy {
            device: "GPU-1".into(),
            utilization_pct: 95,
        }],
        ..ServerSide::default()
    });
    assert_eq!(judge(&c).0, Cause::Gpu);
}

#[test]
fn retransmissions_alone_are_the_network() {
    let c = Call {
        retransmits: 12,
        ..call(json!({}))
    };
    assert_eq!(
        judge(&c),
        (
            Cause::Network,
            "retransmissions: 12 during the answer".into()
        )
    );
    let t = Thresholds {
        retransmits: 12,
        ..Thresholds::default()
    };
    assert_eq!(diagnose(&c, &t).cause, Cause::None);
}

#[test]
fn the_heaviest_phase_wins() {
    let c = Call {
        connect_ns: Some(300 * MS),
        tls_handshake_ns: Some(900 * MS),
        ttfb_ns: Some(1100 * MS),
        duration_ns: 1200 * MS,
        ..call(json!({}))
    };
    assert_eq!(judge(&c).0, Cause::Server);
    let c = Call {
        ttfb_ns: Some(100 * MS),
        ..c
    };
    assert_eq!(judge(&c).0, Cause::Tls);
}

#[test]
fn a_refused_connect_is_the_connect() {
    let v = json!({
        "kind": "connection", "state": "closed", "pid": 7, "comm": "c", "direction": "outbound",
        "local_addr": "127.0.0.1", "local_port": 40001, "remote_addr": "127.0.0.1",
        "remote_port": 1, "start_unix_ns": 5u64, "duration_ns": MS, "connect_ns": null,
        "error": "refused", "retransmits": 0,
    });
    let c = Call::from_json(&v).expect("a call");
    let (cause, evidence) = judge(&c);
    assert_eq!(cause, Cause::Connect);
    assert_eq!(evidence, "connect failed: refused after 1.0 ms");
}

#[test]
fn the_collector_joins_phases_lookups_and_the_server_on_this_host() {
    let mut col = Collector::default();
    let conn = json!({
        "kind": "connection", "state": "closed", "pid": 7, "comm": "client",
        "direction": "outbound", "local_addr": "127.0.0.1", "local_port": 40000,
        "remote_addr": "127.0.0.1", "remote_port": 8080,
        "start_unix_ns": 1_000_000_000_000u64 - 300 * MS, "duration_ns": 400 * MS,
        "connect_ns": 250 * MS, "retransmits": 1,
        "dns": {"name": "api.test", "duration_ns": 5 * MS, "result": "ok"},
    });
    let lookup = json!({"kind": "dns", "pid": 7, "name": "api.test",
        "start_unix_ns": 1_000_000_000_000u64 - 310 * MS, "server": "10.0.0.53", "retries": 2});
    let server = json!({
        "kind": "request", "pid": 9, "comm": "server", "direction": "inbound",
        "local_addr": "127.0.0.1", "local_port": 8080, "remote_addr": "127.0.0.1",
        "remote_port": 40000, "start_unix_ns": 1_000_000_000_000u64 + MS,
        "duration_ns": 14 * MS, "ttfb_ns": 12 * MS,
    });
    for v in [&request(json!({})), &conn, &lookup, &server] {
        assert!(col.add(v), "{v}");
    }
    assert!(!col.add(&json!({"kind": "nonsense"})));
    let calls = col.calls(&Only::default());
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let c = &calls[0];
    assert_eq!(c.connect_ns, Some(250 * MS));
    assert_eq!(c.retransmits, 1);
    assert_eq!(c.server.as_ref().and_then(|s| s.wait_ns), Some(12 * MS));
    let d = c.dns.as_ref().expect("lookup");
    assert_eq!(
        (d.server.as_deref(), d.retries),
        (Some("10.0.0.53"), Some(2))
    );
    assert_eq!(
        judge(c),
        (
            Cause::Connect,
            "SYN retransmitted: connect took 250 ms".into()
        )
    );
    let only = Only {
        pids: vec![8],
        ..Only::default()
    };
    let mut col = Collector::default();
    assert!(col.add(&request(json!({}))));
    assert!(col.calls(&only).is_empty());
}
