//! `observer run`: OTLP traces and metrics to a receiver of the test's own
//! (tests/src/otlp.rs: gRPC, HTTP/protobuf, and a traces-only endpoint as
//! Jaeger is), the Prometheus endpoint, and config errors.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    common::v1::{any_value::Value as AnyV, KeyValue},
    trace::v1::{span::SpanKind, Span},
};
use serde_json::Value;
use tests::{otlp::*, *};

/// `observer run` with `env` and `args`; waits for `ready`.
/// `observer run` sending OTLP/gRPC to `port`, for connections on `server_port`.
fn exporting_to(port: u16, server_port: u16) -> Daemon {
    let env = [(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    )];
    start(
        &env,
        &[
            "--prometheus-listen",
            "none",
            "--port",
            &server_port.to_string(),
        ],
    )
}

/// `observer run --json ARGS` with `env` set.
fn start(env: &[(&str, String)], args: &[&str]) -> Daemon {
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json"]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Daemon::start(cmd)
}

fn ms_of(span: &Span) -> f64 {
    (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e6
}

/// A plain HTTP server (helpers/server.py) that answers after `delay_ms`.
fn http_server(delay_ms: u32) -> HelperServer {
    HelperServer::spawn(Command::new("python3").arg(helper("server.py")).args([
        "--delay-ms",
        &delay_ms.to_string(),
        "--response-bytes",
        "100",
    ]))
}

/// curl's own timings and its pid (the shell exec's into curl).
fn curl(url: &str) -> (u32, Vec<f64>) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$; exec curl -s -o /dev/null -w '%{{time_connect}} %{{time_starttransfer}} %{{time_pretransfer}} %{{time_namelookup}}' {url}"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let pid = lines.next().unwrap().trim().parse().unwrap();
    let t = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap() * 1e3)
        .collect();
    (pid, t)
}

fn check_traces(rec: &Received, server: &HelperServer, runs: &[(u32, Vec<f64>)]) {
    let spans = all_spans(rec);
    // curl's time minus ours, per run (ms): connect, first byte.
    let mut gaps = (Vec::new(), Vec::new());
    for (pid, t) in runs {
        let mine: Vec<&(Vec<KeyValue>, Span)> = spans
            .iter()
            .filter(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(*pid)))
            .collect();
        assert!(!mine.is_empty(), "no spans for curl pid {pid}");
        let res = &mine[0].0;
        assert_eq!(attr_str(res, "service.name").as_deref(), Some("curl"));
        assert_eq!(
            attr_str(res, "process.executable.name").as_deref(),
            Some("curl")
        );
        assert!(attr_str(res, "host.name").is_some());
        let root = mine
            .iter()
            .map(|(_, s)| s)
            .find(|s| s.parent_span_id.is_empty() && s.name.starts_with("tcp "))
            .unwrap();
        assert_eq!(root.name, format!("tcp 127.0.0.1:{}", server.port));
        // Its request is a trace of its own; the test server answers with
        // bytes that are not HTTP, so the request has no response.
        let get = mine
            .iter()
            .map(|(_, s)| s)
            .find(|s| s.name == "GET" && s.kind == SpanKind::Client as i32)
            .unwrap_or_else(|| panic!("no GET span for curl pid {pid}"));
        assert_eq!(
            attr_str(&get.attributes, "error.type").as_deref(),
            Some("no response")
        );
        assert_eq!(root.kind, SpanKind::Client as i32);
        assert_eq!(
            attr_str(&root.attributes, "network.transport").as_deref(),
            Some("tcp")
        );
        assert_eq!(
            attr_int(&root.attributes, "server.port"),
            Some(i64::from(server.port))
        );
        // The connection's phases are in its first request's trace, which
        // the connection's root links to; the wait for the first byte stays
        // with the connection when the request has none of its own (here:
        // the answer is not HTTP).
        let link = root
            .links
            .first()
            .expect("the connection links to its first request");
        assert_eq!(
            (&link.trace_id, &link.span_id),
            (&get.trace_id, &get.span_id)
        );
        let phases = phases_of(mine.iter().map(|(_, s)| s), root);
        let connect = named(&phases, "socket connect");
        let wait = named(&phases, "wait first byte");
        assert_eq!(connect.parent_span_id, get.span_id);
        assert_eq!(wait.parent_span_id, root.span_id);
        for (c, parent) in [(connect, get), (wait, root)] {
            assert_eq!(c.trace_id, parent.trace_id);
            assert!(c.start_time_unix_nano >= parent.start_time_unix_nano);
            assert!(
                c.end_time_unix_nano <= parent.end_time_unix_nano,
                "{} outside its parent",
                c.name
            );
        }
        // curl -w: connect = time_connect - time_namelookup, around ours
        // (curl's clock starts before its setup and reads the end after it
        // saw the connection up); first byte = time_starttransfer -
        // time_pretransfer, which holds the server's 120 ms wait as ours
        // does (see connections.rs, `connect_and_first_byte_agree_with_curl`).
        let (curl_connect, curl_wait) = (t[0] - t[3], t[1] - t[2]);
        assert!(
            0.0 < ms_of(connect) && ms_of(connect) <= curl_connect + CURL_ROUNDING_MS,
            "connect span: {:.3} ms, curl {curl_connect:.3} ms",
            ms_of(connect)
        );
        assert!(
            ms_of(wait) >= 120.0 && curl_wait > 115.0,
            "first byte span: {:.3} ms, curl {curl_wait:.3} ms, the server's wait 120 ms",
            ms_of(wait)
        );
        gaps.0.push(curl_connect - ms_of(connect));
        gaps.1.push(curl_wait - ms_of(wait));
    }
    // Within 1 ms of curl on the run curl's own scheduling disturbed least
    // (the spread is measured in connections.rs).
    assert!(
        closest(&gaps.0) < 1.0 && closest(&gaps.1) < 1.0,
        "curl's connect and first byte minus our spans, per run (ms): {gaps:?}"
    );
    // The server's side: SERVER spans under the server process's resource.
    let server_spans: Vec<&(Vec<KeyValue>, Span)> = spans
        .iter()
        .filter(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(server.pid())))
        .collect();
    assert_eq!(
        server_spans
            .iter()
            .filter(|(_, s)| s.kind == SpanKind::Server as i32 && s.name.starts_with("tcp "))
            .count(),
        runs.len()
    );
}

/// What curl's printed times (µs) lose to rounding, two of them in a
/// difference, and to its clock (CLOCK_MONOTONIC_RAW: NTP's rate correction,
/// at most 500 ppm, is 0.15 ms over 300 ms).
const CURL_ROUNDING_MS: f64 = 0.2;

fn count_metric(rec: &Received, name: &str) -> u64 {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let reqs = rec.metrics.lock().unwrap();
    let Some(last) = reqs.last() else { return 0 };
    last.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == name)
        .map(|m| match &m.data {
            Some(Data::Histogram(h)) => h.data_points.iter().map(|p| p.count).sum(),
            _ => 0,
        })
        .sum()
}

fn exports_over(protocol: &str, rec: Received, port: u16) {
    let server = http_server(120);
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_owned()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500".to_owned()),
    ];
    let run = start(
        &env,
        &[
            "--prometheus-listen",
            "none",
            "--port",
            &server.port.to_string(),
        ],
    );
    let url = format!("http://127.0.0.1:{}/", server.port);
    let runs: Vec<(u32, Vec<f64>)> = (0..3).map(|_| curl(&url)).collect();
    let summary = summary_of(&run.stop());
    assert!(
        summary["export"]["spans_sent"].as_u64() >= Some(9),
        "{summary:#}"
    );
    assert_eq!(summary["export"]["records_dropped"], 0);
    check_traces(&rec, &server, &runs);
    // Metrics see every connection: 3 outbound connects.
    assert_eq!(count_metric(&rec, "observer.tcp.connect.duration"), 3);
}

#[test]
fn otlp_grpc_traces_and_metrics() {
    let Some(_serial) = begin("otlp_grpc", &["curl"]) else {
        return;
    };
    let (rec, port) = grpc_receiver();
    exports_over("grpc", rec, port);
}

#[test]
fn otlp_http_traces_and_metrics() {
    let Some(_serial) = begin("otlp_http", &["curl"]) else {
        return;
    };
    let (rec, port) = http_receiver();
    exports_over("http/protobuf", rec, port);
}

/// The Prometheus endpoint counts every connection in the connect histogram.
#[test]
fn prometheus_endpoint() {
    let Some(_serial) = begin("prometheus", &["curl"]) else {
        return;
    };
    let server = http_server(0);
    let listen = format!("127.0.0.1:{}", free_port());
    let run = start(
        &[],
        &[
            "--prometheus-listen",
            &listen,
            "--port",
            &server.port.to_string(),
        ],
    );
    let url = format!("http://127.0.0.1:{}/", server.port);
    for _ in 0..5 {
        curl(&url);
    }
    std::thread::sleep(Duration::from_millis(500));
    let text = String::from_utf8(
        Command::new("curl")
            .args(["-s", &format!("http://{listen}/metrics")])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    run.stop();
    let port_label = format!("server_port=\"{}\"", server.port);
    let count: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with("observer_tcp_connect_duration_seconds_count") && l.contains(&port_label)
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(count, 5, "{text}");
    assert!(
        text.contains("# TYPE observer_tcp_connect_duration_seconds histogram"),
        "{text}"
    );
    assert!(text.contains("observer_tcp_connections_total{"), "{text}");
    assert!(
        text.contains("observer_events_dropped_total{stage=\"kernel\"}"),
        "{text}"
    );
    // The kernel's skipped runs, live (the summary's kernel_missed).
    assert!(
        text.contains("observer_events_dropped_total{stage=\"kernel_missed\"} 0"),
        "{text}"
    );
    // The heap in use: a live process's is never 0.
    let heap_in_use: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("observer_memory_heap{state=\"in_use\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(heap_in_use > 100_000.0, "{text}");
}

#[test]
fn bad_config_is_a_usage_error() {
    let dir = std::env::temp_dir().join(format!("observer-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(&file, "prometheus_listne = \"127.0.0.1:1\"\n").unwrap();
    let out = Command::new(observer_bin())
        .args(["run", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("prometheus_listne"),
        "the unknown key is named: {err}"
    );
    let yaml = dir.join("bad.yaml");
    std::fs::write(&yaml, "otlp:\n  endpiont: http://x:4317\n").unwrap();
    let out = Command::new(observer_bin())
        .args(["run", "--config"])
        .arg(&yaml)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("otlp.endpiont"), "{err}");
    let out = Command::new(observer_bin())
        .arg("run")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.contains("localhost:4317"),
        "the variable and its value are named: {err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The root span and its children of the one connection of process `pid`.
fn trace_of(rec: &Received, pid: u32) -> (Vec<KeyValue>, Span, Vec<Span>) {
    let spans: Vec<(Vec<KeyValue>, Span)> = all_spans(rec)
        .into_iter()
        .filter(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(pid)))
        .collect();
    // Its requests are traces of their own.
    let roots: Vec<&(Vec<KeyValue>, Span)> = spans
        .iter()
        .filter(|(_, s)| s.parent_span_id.is_empty() && s.name.starts_with("tcp "))
        .collect();
    assert_eq!(roots.len(), 1, "one connection of pid {pid}: {roots:#?}");
    let (res, root) = roots[0].clone();
    let children = phases_of(spans.iter().map(|(_, s)| s), &root);
    (res, root, children)
}

/// A connection's phases: its root's children, and the children of the
/// first request's span it links to (that trace holds the connect, TLS and
/// lookup phases, and its own wait for the first byte).
fn phases_of<'a>(spans: impl Iterator<Item = &'a Span>, root: &Span) -> Vec<Span> {
    let linked: Vec<(&[u8], &[u8])> = root
        .links
        .iter()
        .map(|l| (&l.trace_id[..], &l.span_id[..]))
        .collect();
    spans
        .filter(|s| {
            s.parent_span_id == root.span_id
                || linked.contains(&(&s.trace_id[..], &s.parent_span_id[..]))
        })
        .cloned()
        .collect()
}

fn named<'a>(children: &'a [Span], prefix: &str) -> &'a Span {
    children
        .iter()
        .find(|s| s.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no span {prefix}: {children:#?}"))
}

/// curl and a Python client against a TLS server: each process its own
/// resource, and the connect / TLS / first-byte spans as the clients timed
/// them.
#[test]
fn tls_phases_match_the_clients_own_timings() {
    let Some(_serial) = begin("otlp_tls", &["curl", "openssl"]) else {
        return;
    };
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", 100, 200);
    let (rec, port) = grpc_receiver();
    let run = exporting_to(port, server.port);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$; exec curl -sk -o /dev/null --resolve tls.test:{p}:127.0.0.1 -w '%{{time_connect}} %{{time_appconnect}} %{{time_starttransfer}} %{{time_namelookup}}' https://tls.test:{p}/",
            p = server.port
        ))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let curl_pid: u32 = lines.next().unwrap().trim().parse().unwrap();
    let t: Vec<f64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap() * 1e3)
        .collect();
    // Three Python processes, a connection each: one's clock alone can run
    // late (see below).
    let pys: Vec<Value> = (0..3)
        .map(|_| {
            let py = Command::new("python3")
                .arg(helper("tls_client.py"))
                .args([
                    "--port",
                    &server.port.to_string(),
                    "--servername",
                    "py.test",
                ])
                .output()
                .unwrap();
            serde_json::from_slice(&py.stdout).unwrap()
        })
        .collect();
    run.stop();

    let (res, root, children) = trace_of(&rec, curl_pid);
    assert_eq!(attr_str(&res, "service.name").as_deref(), Some("curl"));
    assert_eq!(root.name, format!("tcp tls.test:{}", server.port));
    assert_eq!(
        attr_str(&root.attributes, "server.address").as_deref(),
        Some("tls.test")
    );
    assert_eq!(
        attr_str(&root.attributes, "observer.tls.library").as_deref(),
        Some("openssl")
    );
    // curl reads its clock after each phase's end as the kernel or its TLS
    // library saw it, so each of our phase ends, counted from the connect,
    // comes no later than curl's (counted from its name lookup, before its
    // connect). Phase by phase the two cannot be compared closely: a late
    // read of curl's clock at one end (3.8 ms once, on a busy CPU) moves time
    // from one of curl's phases to the next. Each phase holds the server's
    // injected wait.
    let connect = named(&children, "socket connect");
    let handshake = named(&children, "TLS client handshake tls.test");
    let wait = named(&children, "wait first byte");
    let since_connect =
        |s: &Span| (s.end_time_unix_nano - connect.start_time_unix_nano) as f64 / 1e6;
    for (what, ours, curls) in [
        ("connect", since_connect(connect), t[0] - t[3]),
        ("TLS handshake", since_connect(handshake), t[1] - t[3]),
        ("first byte", since_connect(wait), t[2] - t[3]),
    ] {
        assert!(
            ours <= curls + CURL_ROUNDING_MS,
            "curl's {what} ended {ours:.3} ms after the connect began by our spans, {curls:.3} ms by curl's clock"
        );
    }
    assert!(
        ms_of(handshake) >= 100.0 && ms_of(wait) >= 200.0,
        "TLS span {:.3} ms (100 ms injected), first byte span {:.3} ms (200 ms)",
        ms_of(handshake),
        ms_of(wait)
    );

    // Python's clock runs from TCP connected to wrap_socket's return, and
    // from before its request to after its first read: the TLS span runs
    // from the connection's establishment, a little before the first (a
    // client woken late from its connect reads its clock later: 2.0 ms once
    // under CI), so it lies inside Python's clock from before the connect,
    // and the least disturbed process's within 1 ms of the handshake's;
    // the first byte span inside Python's, the least disturbed within 1 ms
    // (one's first byte once came out 1.2 ms under it in a CI run, the
    // client scheduled late).
    let (mut ours, mut own) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for py in &pys {
        let py_pid = u32::try_from(py["pid"].as_u64().unwrap()).unwrap();
        let (res, root, children) = trace_of(&rec, py_pid);
        assert_eq!(
            attr_str(&res, "process.executable.name")
                .as_deref()
                .map(|n| n.starts_with("python")),
            Some(true)
        );
        assert_eq!(root.name, format!("tcp py.test:{}", server.port));
        let span = ms_of(named(&children, "TLS client handshake py.test"));
        let whole = py["connect_and_handshake_ms"].as_f64().unwrap();
        assert!(
            span <= whole,
            "python TLS span {span:.3} ms, its clock from before the connect {whole:.3} ms"
        );
        ours.0.push(span);
        own.0.push(py["handshake_ms"].as_f64().unwrap());
        ours.1.push(ms_of(named(&children, "wait first byte")));
        own.1.push(py["ttfb_ms"][0].as_f64().unwrap());
    }
    let gaps: Vec<f64> = ours.0.iter().zip(&own.0).map(|(o, c)| o - c).collect();
    assert!(
        ours.0.iter().all(|&o| o >= 100.0) && closest(&gaps) <= 1.0,
        "python TLS spans {:?} ms (100 ms injected), minus the handshake's own clock: {gaps:?} ms",
        ours.0
    );
    agree_with_clock("python first byte span", &ours.1, &own.1, 200.0, 0.1, 1.0);
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The collector goes away for 30 s under load and comes back: the observer
/// keeps running with bounded memory, counts what it dropped, and spans flow
/// again.
#[test]
fn collector_outage() {
    let Some(_serial) = begin("otlp_outage", &["curl"]) else {
        return;
    };
    let server = http_server(0);
    let rec = Received::default();
    let (port, stop) = serve_grpc(&rec, 0);
    let run = exporting_to(port, server.port);
    let pid = run.pid();
    let load_until = Instant::now() + Duration::from_secs(40);
    let url = format!("http://127.0.0.1:{}/", server.port);
    let load = std::thread::spawn(move || {
        let mut n = 0u64;
        while Instant::now() < load_until {
            // ~100 connections/s in bursts of 10.
            let mut kids: Vec<Child> = (0..10)
                .map(|_| {
                    Command::new("curl")
                        .args(["-s", "-o", "/dev/null", &url])
                        .spawn()
                        .unwrap()
                })
                .collect();
            for k in &mut kids {
                k.wait().unwrap();
            }
            n += 10;
            std::thread::sleep(Duration::from_millis(100));
        }
        n
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !rec.traces.lock().unwrap().is_empty(),
        "spans flow before the outage"
    );
    drop(stop);
    let rss_before = rss_kib(pid);
    let mut rss_max = rss_before;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        rss_max = rss_max.max(rss_kib(pid));
    }
    let back = Received::default();
    let (_, stop2) = serve_grpc(&back, port);
    let made = load.join().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let summary = summary_of(&run.stop());
    drop(stop2);
    assert!(made > 1000, "load made {made} connections");
    let export = &summary["export"];
    let lost = export["records_dropped"].as_u64().unwrap() + export["queue_full"].as_u64().unwrap();
    assert!(
        lost > 0,
        "the outage's records are counted as dropped: {export:#}"
    );
    assert!(export["export_errors"].as_u64() > Some(0), "{export:#}");
    assert!(
        !back.traces.lock().unwrap().is_empty(),
        "spans flow again after the collector is back: {export:#}"
    );
    assert!(
        rss_max < rss_before + 64 * 1024,
        "memory bounded during the outage: {rss_before} KiB -> max {rss_max} KiB"
    );
}

/// A real Prometheus server (Debian's) scrapes the endpoint; its HTTP API's
/// count of the connect histogram equals the connections made.
#[test]
fn a_real_prometheus_scrapes_the_histograms() {
    let Some(_serial) = begin("prometheus_server", &["prometheus", "curl"]) else {
        return;
    };
    let server = http_server(0);
    let listen = format!("127.0.0.1:{}", free_port());
    let run = start(
        &[],
        &[
            "--prometheus-listen",
            &listen,
            "--port",
            &server.port.to_string(),
        ],
    );
    let dir = std::env::temp_dir().join(format!("observer-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: observer\n    static_configs:\n      - targets: ['{listen}']\n"
        ),
    )
    .unwrap();
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    const N: u64 = 7;
    let url = format!("http://127.0.0.1:{}/", server.port);
    for _ in 0..N {
        curl(&url);
    }
    let query = format!(
        "sum(observer_tcp_connect_duration_seconds_count{{server_port=\"{}\"}})",
        server.port
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last;
    let got = loop {
        std::thread::sleep(Duration::from_secs(1));
        let out = Command::new("curl")
            .args(["-s", "--get", "--data-urlencode", &format!("query={query}")])
            .arg(format!("http://{prom_addr}/api/v1/query"))
            .output()
            .unwrap();
        last = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let v = last["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        if v == Some(N as f64) || Instant::now() > deadline {
            break v;
        }
    };
    let _ = prom.kill();
    let _ = prom.wait();
    run.stop();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got, Some(N as f64), "Prometheus said {last}");
}

/// https endpoints: the collector's certificate is trusted through
/// OTEL_EXPORTER_OTLP_CERTIFICATE.
#[test]
fn otlp_grpc_over_tls() {
    let Some(_serial) = begin("otlp_tls_endpoint", &["curl", "openssl"]) else {
        return;
    };
    let cert = Cert::new();
    let rec = Received::default();
    let (port, stop) = serve_grpc_with(&rec, 0, Some(&cert));
    let server = http_server(0);
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://127.0.0.1:{port}"),
        ),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            cert.cert().display().to_string(),
        ),
    ];
    let run = start(
        &env,
        &[
            "--prometheus-listen",
            "none",
            "--port",
            &server.port.to_string(),
        ],
    );
    let url = format!("http://127.0.0.1:{}/", server.port);
    let (pid, _) = curl(&url);
    let summary = summary_of(&run.stop());
    drop(stop);
    assert_eq!(summary["export"]["export_errors"], 0, "{summary:#}");
    let (_, root, _) = trace_of(&rec, pid);
    assert_eq!(root.name, format!("tcp 127.0.0.1:{}", server.port));
}

/// The same over OTLP/HTTP (rustls with the system's roots and the CA file).
#[test]
fn otlp_http_over_tls() {
    let Some(_serial) = begin("otlp_http_tls", &["curl", "openssl"]) else {
        return;
    };
    let cert = Cert::new();
    let receiver = HelperServer::spawn(
        Command::new("python3")
            .arg(helper("otlp_http_tls.py"))
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key()),
    );
    let server = http_server(0);
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://127.0.0.1:{}", receiver.port),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            cert.cert().display().to_string(),
        ),
    ];
    let run = start(
        &env,
        &[
            "--prometheus-listen",
            "none",
            "--port",
            &server.port.to_string(),
        ],
    );
    curl(&format!("http://127.0.0.1:{}/", server.port));
    let summary = summary_of(&run.stop());
    let export = &summary["export"];
    assert_eq!(export["export_errors"], 0, "{export:#}");
    assert!(export["spans_sent"].as_u64() >= Some(3), "{export:#}");
    assert!(export["metric_exports"].as_u64() >= Some(1), "{export:#}");
}

/// Lookups as spans: curl's lookup (in a namespace whose DNS server answers
/// after 150 ms) is a child of its connection's trace, as long as curl's
/// `time_namelookup`; dig's lookup, which leads to no connection, is a trace
/// of its own, once; both feed `dns.lookup.duration`.
#[test]
fn lookups_as_spans_and_metrics() {
    let Some(_serial) = begin("otlp_dns", &["curl", "dig", "ip", "python3"]) else {
        return;
    };
    let ns = DnsNs::new(150.0);
    let (rec, port) = grpc_receiver();
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500".to_owned()),
    ];
    let run = start(&env, &["--prometheus-listen", "none"]);
    let out = ns.exec(&[
        "sh",
        "-c",
        &format!(
            "echo $$; exec curl -s -o /dev/null -w '%{{time_namelookup}}' http://api.test:{}/",
            ns.http.port
        ),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let curl_pid: u32 = lines.next().unwrap().trim().parse().unwrap();
    let namelookup_ms = lines.next().unwrap().trim().parse::<f64>().unwrap() * 1e3;
    let dig = ns.exec(&["dig", "+tries=1", "+timeout=2", "nxspan.test"]);
    assert!(dig.status.success());
    let summary = summary_of(&run.stop());
    assert_eq!(summary["export"]["records_dropped"], 0, "{summary:#}");

    let (_, root, children) = trace_of(&rec, curl_pid);
    let lookup = named(&children, "DNS lookup api.test");
    // Between the DNS server's own time and curl's, as in dns.rs
    // (`assert_between`, where the spread is measured).
    let server_ms = ns.server_ms("api.test");
    assert!(
        server_ms <= ms_of(lookup) && ms_of(lookup) <= namelookup_ms + CURL_ROUNDING_MS,
        "curl's lookup: {:.3} ms, the server's {server_ms:.3} ms, curl's {namelookup_ms:.3} ms",
        ms_of(lookup)
    );
    assert_eq!(
        root.start_time_unix_nano, lookup.start_time_unix_nano,
        "the connection's trace starts with its lookup"
    );
    assert_eq!(
        attr_str(&root.attributes, "server.address").as_deref(),
        Some("api.test")
    );

    let spans = all_spans(&rec);
    let named_all = |name: &str| -> Vec<&(Vec<KeyValue>, Span)> {
        spans.iter().filter(|(_, s)| s.name == name).collect()
    };
    assert_eq!(
        named_all("DNS lookup api.test").len(),
        1,
        "curl's lookup once"
    );
    let standalone = named_all("DNS lookup nxspan.test");
    assert_eq!(standalone.len(), 1, "{standalone:#?}");
    let (res, s) = standalone[0];
    assert!(s.parent_span_id.is_empty(), "a trace of its own");
    assert_eq!(s.kind, SpanKind::Client as i32);
    assert_eq!(
        attr_str(res, "process.executable.name").as_deref(),
        Some("dig")
    );
    assert_eq!(
        attr_str(&s.attributes, "error.type").as_deref(),
        Some("nxdomain")
    );
    assert_eq!(
        attr_str(&s.attributes, "observer.dns.source").as_deref(),
        Some("wire")
    );
    assert_eq!(
        attr_str(&s.attributes, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert!(ms_of(s) >= 150.0, "{}", ms_of(s));
    // Each lookup once in the histogram, under its name.
    for name in ["api.test", "nxspan.test"] {
        assert_eq!(
            histogram_count_where(&rec, "dns.lookup.duration", "dns.question.name", name),
            1,
            "{name}"
        );
    }
}

/// Observations of histogram `name` in the last metrics export whose data
/// point has attribute `key` = `value`.
fn histogram_count_where(rec: &Received, name: &str, key: &str, value: &str) -> u64 {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let reqs = rec.metrics.lock().unwrap();
    let Some(last) = reqs.last() else { return 0 };
    last.resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == name)
        .flat_map(|m| match &m.data {
            Some(Data::Histogram(h)) => h.data_points.clone(),
            _ => Vec::new(),
        })
        .filter(|p| attr_str(&p.attributes, key).as_deref() == Some(value))
        .map(|p| p.count)
        .sum()
}

/// An LLM API call as a trace: a CLIENT span `chat {model}` with the GenAI
/// attributes, times within 2 ms of the client's own clock, and the
/// server's SERVER span.
#[test]
fn llm_calls_as_traces() {
    let Some(_serial) = begin("otlp_llm", &["openssl", "python3"]) else {
        return;
    };
    let (rec, port) = grpc_receiver();
    let cert = Cert::new();
    // Both processes start after the observer: the first request of each
    // is a trace like any other.
    let server_port = free_port();
    let run = exporting_to(port, server_port);
    let server = llm_server_on(server_port, Some(&cert), 120.0, 20.0, 4);
    let c = llm_client(server.port, 0, &["--model", "tiny-t", "--model", "tiny-u"]);
    run.stop();
    let spans: Vec<Span> = rec
        .traces
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| &r.resource_spans)
        .flat_map(|rs| &rs.scope_spans)
        .flat_map(|ss| ss.spans.clone())
        .collect();
    let calls: Vec<&Span> = spans.iter().filter(|s| s.name == "chat tiny-t").collect();
    assert_eq!(calls.len(), 2, "client and server: {calls:#?}");
    let client = calls
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    let server_span = calls
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    let a = |s: &Span, k: &str| s.attributes.iter().find(|kv| kv.key == k).cloned();
    let str_of = |s: &Span, k: &str| match a(s, k).and_then(|kv| kv.value?.value) {
        Some(AnyV::StringValue(v)) => v,
        other => panic!("{k}: {other:?}"),
    };
    let int_of = |s: &Span, k: &str| match a(s, k).and_then(|kv| kv.value?.value) {
        Some(AnyV::IntValue(v)) => v,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(str_of(client, "gen_ai.operation.name"), "chat");
    assert_eq!(str_of(client, "gen_ai.provider.name"), "openai");
    assert_eq!(str_of(client, "gen_ai.request.model"), "tiny-t");
    assert_eq!(str_of(client, "gen_ai.response.model"), "tiny-t-served");
    assert_eq!(str_of(client, "http.request.method"), "POST");
    assert_eq!(str_of(client, "url.path"), "/v1/chat/completions");
    assert_eq!(str_of(client, "server.address"), "llm.test");
    assert_eq!(int_of(client, "server.port"), i64::from(server.port));
    assert_eq!(int_of(client, "http.response.status_code"), 200);
    assert_eq!(int_of(client, "gen_ai.usage.output_tokens"), 4);
    assert_eq!(
        int_of(client, "gen_ai.usage.input_tokens"),
        (c[0]["body_len"].as_u64().unwrap() % 1000) as i64
    );
    // Both calls' times against the client's clock: at least the server's
    // 120 ms wait, at most the client's + 2 ms, the least disturbed call's
    // within 2 ms (one call's client clock can run late on its own).
    let other = spans
        .iter()
        .find(|s| s.name == "chat tiny-u" && s.kind == SpanKind::Client as i32)
        .unwrap_or_else(|| panic!("no client span chat tiny-u: {spans:#?}"));
    let ttfc_of = |s: &Span| match a(s, "gen_ai.response.time_to_first_chunk")
        .and_then(|kv| kv.value?.value)
    {
        Some(AnyV::DoubleValue(v)) => v * 1000.0,
        other => panic!("time_to_first_chunk: {other:?}"),
    };
    let wait_of = |call: &Span| -> &Span {
        let wait: Vec<&Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == call.span_id && s.name == "wait first byte")
            .collect();
        assert_eq!(wait.len(), 1, "{}: {spans:#?}", call.name);
        wait[0]
    };
    let waited_of = |call: &Span| {
        let w = wait_of(call);
        (w.end_time_unix_nano - w.start_time_unix_nano) as f64 / 1e6
    };
    assert_eq!(c.len(), 2, "one line per call: {c:?}");
    let own = |k: &str| -> Vec<f64> { c.iter().map(|x| x[k].as_f64().unwrap()).collect() };
    agree_with_clock(
        "time to first chunk",
        &[ttfc_of(client), ttfc_of(other)],
        &own("ttft_ms"),
        120.0,
        2.0,
        2.0,
    );
    let waited = waited_of(client);
    agree_with_clock(
        "wait first byte",
        &[waited, waited_of(other)],
        &own("ttfb_ms"),
        120.0,
        2.0,
        2.0,
    );
    let wait = wait_of(client);
    // The server's span starts inside the client's (its end is its last
    // write's return, which a busy CPU delays past the client's last read:
    // 5.5 ms once), and its wait for the answer holds the injected 120 ms
    // and lies inside the client's.
    assert!(server_span.start_time_unix_nano >= client.start_time_unix_nano);
    let served = spans
        .iter()
        .find(|s| s.parent_span_id == server_span.span_id && s.name == "wait first byte")
        .unwrap();
    let served_ms = (served.end_time_unix_nano - served.start_time_unix_nano) as f64 / 1e6;
    assert!(
        served_ms >= 120.0 && served_ms <= waited,
        "the server's wait {served_ms:.3} ms, the client's {waited:.3} ms"
    );
    // The connection's first request carries its phases: the connect and
    // the TLS handshake, inside the request's span, before its wait.
    let phase = |name: &str| -> &Span {
        spans
            .iter()
            .find(|s| s.parent_span_id == client.span_id && s.name == name)
            .unwrap_or_else(|| panic!("no {name} under the first request: {spans:#?}"))
    };
    let connect = phase(&format!("socket connect 127.0.0.1:{}", server.port));
    let handshake = phase("TLS client handshake llm.test");
    assert!(client.start_time_unix_nano <= connect.start_time_unix_nano);
    assert!(connect.end_time_unix_nano <= handshake.end_time_unix_nano);
    assert!(handshake.end_time_unix_nano <= wait.start_time_unix_nano);
    assert_eq!(connect.trace_id, client.trace_id);
    // The connection's own trace does not repeat them: its root links to
    // the first request and has no children (that request timed its own
    // wait for the first byte).
    let conn_root: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.kind == SpanKind::Client as i32 && s.name == format!("tcp llm.test:{}", server.port)
        })
        .collect();
    assert_eq!(conn_root.len(), 1, "{spans:#?}");
    assert_eq!(
        conn_root[0]
            .links
            .iter()
            .map(|l| (&l.trace_id, &l.span_id))
            .collect::<Vec<_>>(),
        [(&client.trace_id, &client.span_id)]
    );
    assert!(
        !spans
            .iter()
            .any(|s| s.parent_span_id == conn_root[0].span_id),
        "the connection's phases are only in its first request's trace"
    );
    // The second request on the connection is a trace of its own, linked
    // to the first's.
    let second: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "chat tiny-u" && s.kind == SpanKind::Client as i32)
        .collect();
    assert_eq!(second.len(), 1, "{spans:#?}");
    assert_ne!(second[0].trace_id, client.trace_id);
    assert_eq!(second[0].links.len(), 1, "{:#?}", second[0]);
    assert_eq!(
        (&second[0].links[0].trace_id, &second[0].links[0].span_id),
        (&client.trace_id, &client.span_id)
    );
    assert!(
        !spans
            .iter()
            .any(|s| s.parent_span_id == second[0].span_id && s.name.starts_with("socket connect")),
        "phases belong to the first request only"
    );
}

/// An endpoint that implements only the trace service (as Jaeger does):
/// traces flow, the metrics it refuses are reported once and not sent again;
/// with OTEL_METRICS_EXPORTER=none they are not even tried.
#[test]
fn a_traces_only_endpoint() {
    let Some(_serial) = begin("traces_only", &["curl"]) else {
        return;
    };
    let server = http_server(0);
    let url = format!("http://127.0.0.1:{}/", server.port);
    for metrics_exporter in ["otlp", "none"] {
        let (rec, port) = traces_only_receiver();
        let env = [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{port}"),
            ),
            // Many chances to retry in the run below.
            ("OTEL_METRIC_EXPORT_INTERVAL", "200".to_owned()),
            ("OTEL_METRICS_EXPORTER", metrics_exporter.to_owned()),
        ];
        let run = start(
            &env,
            &[
                "--prometheus-listen",
                "none",
                "--port",
                &server.port.to_string(),
            ],
        );
        let pids: Vec<u32> = (0..3).map(|_| curl(&url).0).collect();
        // Ten metric intervals.
        std::thread::sleep(Duration::from_secs(2));
        let stderr = run.stop();
        let summary = summary_of(&stderr);
        let refusals = stderr
            .iter()
            .filter(|l| l.contains("does not take metrics"))
            .count();
        let metric_warnings = stderr.iter().filter(|l| l.contains("OTLP metrics")).count();
        if metrics_exporter == "otlp" {
            assert_eq!(refusals, 1, "told once: {stderr:#?}");
            assert_eq!(metric_warnings, 1, "and never retried: {stderr:#?}");
            assert_eq!(summary["export"]["metrics_refused"], true, "{summary:#}");
            assert_eq!(summary["export"]["export_errors"], 1, "{summary:#}");
        } else {
            assert_eq!(metric_warnings, 0, "not tried: {stderr:#?}");
            assert_eq!(summary["export"]["metrics_refused"], false, "{summary:#}");
            assert_eq!(summary["export"]["export_errors"], 0, "{summary:#}");
        }
        assert_eq!(summary["export"]["traces_refused"], false, "{summary:#}");
        assert!(rec.metrics.lock().unwrap().is_empty());
        // Every curl's connection arrived as a trace.
        let spans = all_spans(&rec);
        for pid in pids {
            assert!(
                spans.iter().any(|(res, s)| {
                    attr_int(res, "process.pid") == Some(i64::from(pid))
                        && s.name.starts_with("tcp ")
                }),
                "{metrics_exporter}: no connection span of curl {pid}"
            );
        }
        assert_eq!(summary["export"]["records_dropped"], 0, "{summary:#}");
    }
}
