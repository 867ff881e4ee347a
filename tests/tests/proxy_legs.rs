//! Proxy legs: nginx (Debian's, one worker: an event loop) as a reverse
//! proxy with keep-alive to a backend that answers after an injected delay.
//! Each inbound request's record carries its upstream leg and its own time
//! outside it, checked against nginx's own `$request_time` and
//! `$upstream_response_time` (its access log) and curl's per-transfer
//! clock; the leg's record is the
//! child of the inbound request's, linked by method and path (no trace
//! context sent); 20 concurrent requests on distinct paths link one to
//! one, none to a wrong request; the backend's own record of each leg is
//! the leg's child, so the call is one trace client -> nginx -> backend.
//! The same with the 20 requests as HTTP/2 streams of one connection. A
//! thread-per-request Python proxy links its legs by thread.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{collections::HashMap, process::Command};

use serde_json::Value;
use tests::*;

/// What an nginx access log line of ours says: `$request_uri
/// $request_time $upstream_response_time`, times in ms.
fn access_log(path: &std::path::Path) -> HashMap<String, (f64, f64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let ms = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{l:?}")) * 1e3;
            (f[0].to_owned(), (ms(f[1]), ms(f[2])))
        })
        .collect()
}

fn ms(v: &Value) -> f64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}")) as f64 / 1e6
}

/// curl fetching `paths` of 127.0.0.1:`port` at once (as HTTP/2 streams of
/// one connection with `h2`), each answered by the backend: per path, its
/// own clock from the request about to be sent to the end of its answer,
/// in ms.
fn curl_parallel(port: u16, paths: &[String], h2: bool) -> HashMap<String, f64> {
    curl_fetch(port, paths, h2, "served /p")
}

/// The same over HTTP/1.1, each answer's body `answer`.
fn curl_parallel_answered(port: u16, paths: &[String], answer: &str) -> HashMap<String, f64> {
    curl_fetch(port, paths, false, answer)
}

fn curl_fetch(port: u16, paths: &[String], h2: bool, answer: &str) -> HashMap<String, f64> {
    let base = format!("http://127.0.0.1:{port}");
    let mut curl = Command::new("curl");
    if h2 {
        curl.arg("--http2-prior-knowledge");
    }
    let out = curl
        .args([
            "-sS",
            "--parallel",
            "--parallel-immediate",
            "--parallel-max",
        ])
        .arg(paths.len().to_string())
        .args([
            "-w",
            "\n%{url_effective} %{time_pretransfer} %{time_total}\n",
        ])
        .args(paths.iter().map(|p| format!("{base}{p}")))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl: {out:?}");
    let body = String::from_utf8_lossy(&out.stdout);
    assert_eq!(body.matches(answer).count(), paths.len(), "{body}");
    let says: HashMap<String, f64> = body
        .lines()
        .filter_map(|l| l.strip_prefix(&base))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let secs = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{l:?}"));
            (f[0].to_owned(), (secs(f[2]) - secs(f[1])) * 1e3)
        })
        .collect();
    assert_eq!(says.len(), paths.len(), "{body}");
    says
}

/// The records of one proxied call (curl's `client`, the proxy's `inbound`,
/// its `leg`, the server's record of it `at_server`) are one trace, each the
/// child of the one before, the leg linked by `rule` and the inbound
/// record's only upstream leg: that entry.
fn assert_one_trace<'a>(
    call: &str,
    [client, inbound, leg, at_server]: [&'a Value; 4],
    rule: &str,
) -> &'a Value {
    let trace = &client["trace_id"];
    assert!(trace.is_string(), "{call}: {client:#}");
    for r in [inbound, leg, at_server] {
        assert_eq!(&r["trace_id"], trace, "{call}: {r:#}");
    }
    assert_eq!(inbound["parent_span_id"], client["span_id"], "{call}");
    assert_eq!(leg["parent_span_id"], inbound["span_id"], "{call}: {leg:#}");
    assert_eq!(leg["link_rule"], rule, "{call}: {leg:#}");
    assert_eq!(at_server["parent_span_id"], leg["span_id"], "{call}");
    let upstream = inbound["upstream"]
        .as_array()
        .unwrap_or_else(|| panic!("{call}: {inbound:#}"));
    assert_eq!(upstream.len(), 1, "{call}: {inbound:#}");
    assert_eq!(
        upstream[0]["span_id"], leg["span_id"],
        "{call}: linked to its own leg"
    );
    assert_eq!(upstream[0]["link_rule"], rule, "{call}");
    &upstream[0]
}

const PATHS: usize = 20;
const DELAY_MS: u32 = 40;

/// `front_h2`: curl speaks HTTP/2 to nginx (cleartext, prior knowledge),
/// its 20 transfers multiplexed as streams of one connection.
fn proxied(test: &str, upstream_tls: bool, front_h2: bool) {
    let Some(_serial) = begin(test, &["python3", "nginx", "curl", "openssl"]) else {
        return;
    };
    let cert = Cert::new();
    let mut backend_cmd = Command::new("python3");
    backend_cmd
        .arg(helper("delay_backend.py"))
        .args(["--delay-ms", &DELAY_MS.to_string()]);
    if upstream_tls {
        backend_cmd.arg("--tls").arg(cert.cert()).arg(cert.key());
    }
    let backend = HelperServer::spawn(&mut backend_cmd);
    let port = free_port();
    // nginx's files beside the certificate (removed with it).
    let dir = cert.dir.clone();
    let scheme = if upstream_tls { "https" } else { "http" };
    let log = dir.join("access.log");
    let servers = format!(
        " log_format legs '$request_uri $request_time $upstream_response_time';\n\
         upstream backend {{ server 127.0.0.1:{b}; keepalive 32; }}\n\
         server {{\n  listen 127.0.0.1:{port}{h2};\n  access_log {log} legs;\n\
           location / {{ proxy_pass {scheme}://backend; proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\"; }}\n }}\n",
        b = backend.port,
        log = log.display(),
        h2 = if front_h2 { " http2" } else { "" },
    );
    let watch = Watch::start(&[
        "--port",
        &port.to_string(),
        "--port",
        &backend.port.to_string(),
    ]);
    // Started after the observer: a fresh nginx, as a user's would be.
    let nginx = Nginx::start(&dir, &servers, port);
    let paths: Vec<String> = (0..PATHS).map(|i| format!("/p{i}")).collect();
    let curl_says = curl_parallel(port, &paths, front_h2);
    drop(nginx);
    let w = watch.stop();
    let nginx_says = access_log(&log);
    let find = |port_field: &str, p: u16, dir: &str, path: &str| -> Vec<&Value> {
        w.requests
            .iter()
            .filter(|r| r[port_field] == p && r["direction"] == dir && r["path"] == path)
            .collect()
    };
    for i in 0..PATHS {
        let path = format!("/p{i}");
        let inbound = find("local_port", port, "inbound", &path);
        let legs_out = find("remote_port", backend.port, "outbound", &path);
        let at_backend = find("local_port", backend.port, "inbound", &path);
        let client = find("remote_port", port, "outbound", &path);
        assert_eq!(
            (
                inbound.len(),
                legs_out.len(),
                at_backend.len(),
                client.len()
            ),
            (1, 1, 1, 1),
            "{path}: one record at each end of each hop; the backend's: {:?}",
            w.requests
                .iter()
                .filter(|r| r["local_port"] == backend.port)
                .map(|r| (
                    &r["path"],
                    &r["remote_port"],
                    &r["request_index"],
                    &r["error"]
                ))
                .collect::<Vec<_>>()
        );
        let (inbound, leg, at_backend, client) =
            (inbound[0], legs_out[0], at_backend[0], client[0]);
        // One trace: curl -> nginx -> the leg -> the backend.
        let up = assert_one_trace(&path, [client, inbound, leg, at_backend], "request_match");
        assert_eq!(up["remote_port"], backend.port);
        // Against nginx's own clock.
        let (request_time, upstream_time) = nginx_says[&path];
        let ours = ms(&inbound["duration_ns"]);
        let ours_up = ms(&up["duration_ns"]);
        let own = ms(&inbound["own_time_ns"]);
        eprintln!(
            "{path}: nginx {request_time:.0} ms (upstream {upstream_time:.0}), \
             ours {ours:.3} ms (upstream {ours_up:.3}, own {own:.3})"
        );
        assert!(
            ours_up >= f64::from(DELAY_MS),
            "{path}: the leg holds the delay"
        );
        // nginx logs whole milliseconds of its cached clock, read when its
        // event loop wakes: its figure is within 2 ms of ours, or shorter
        // when the loop's turn began before the request came in or ended
        // after work for the other requests (the 20 legs' connects and TLS
        // handshakes share one worker). Ours is then bounded from above by
        // curl's own clock for the transfer, which holds nginx's whole time.
        let curl_ms = curl_says[&path];
        eprintln!("{path}: curl {curl_ms:.3} ms from request to answer");
        assert!(
            ours >= request_time - 2.0 && (ours <= request_time + 2.0 || ours <= curl_ms),
            "{path}: ours {ours:.3} ms, $request_time {request_time} ms, curl {curl_ms:.3} ms"
        );
        // nginx starts the upstream clock from its cached time (the event
        // loop's last wake-up), so a request whose upstream connect waited
        // behind the other 19's in one loop turn (each TLS client handshake
        // costs CPU) has that wait in nginx's figure; ours puts it in the
        // proxy's own time, before the leg began. Likewise at the end: the
        // leg is over when the upstream's last byte arrives, nginx's clock
        // stops when its loop gets to reading it (3.7 ms later once in 20
        // here while the other transfers kept it busy). Ours is never
        // longer, and nginx's exceeds it by no more than those waits.
        let at = |r: &Value| r["start_unix_ns"].as_u64().unwrap() as f64 / 1e6;
        let before_leg = at(up) - at(inbound);
        let after_leg = (at(inbound) + ours) - (at(up) + ours_up);
        eprintln!(
            "{path}: the leg began {before_leg:.3} ms into the request, ended {after_leg:.3} ms \
             before its answer"
        );
        assert!(
            ours_up <= upstream_time + 2.0
                && upstream_time <= ours_up + before_leg.max(0.0) + after_leg.max(0.0) + 2.0,
            "{path}: $upstream_response_time {upstream_time} ms, ours {ours_up:.3} ms, \
             the leg began {before_leg:.3} ms in and ended {after_leg:.3} ms before the answer"
        );
        assert!((own - (ours - ours_up)).abs() < 0.001, "{path}: own time");
    }
}

#[test]
fn nginx_legs_over_http_link_one_to_one() {
    proxied("nginx_legs_over_http_link_one_to_one", false, false);
}

#[test]
fn nginx_legs_over_https_link_one_to_one() {
    proxied("nginx_legs_over_https_link_one_to_one", true, false);
}

/// The inbound requests are HTTP/2 streams, 20 in flight on one
/// connection: each stream a candidate of its own.
#[test]
fn nginx_legs_of_http2_streams_link_one_to_one() {
    proxied("nginx_legs_of_http2_streams_link_one_to_one", false, true);
}

/// A thread-per-request proxy (tests/helpers/thread_proxy.py, the standard
/// library's ThreadingHTTPServer) rewriting each path, so neither a trace
/// context nor the request match can tie a leg: 10 concurrent requests on
/// distinct paths, each leg linked to its own request by thread (the
/// proxy's inbound sockets get their owner thread only at their first
/// answer byte, after the legs). Checked against the proxy's own clock
/// around its upstream call and curl's per-transfer clock.
#[test]
fn thread_per_request_proxy_legs_link_by_thread() {
    let Some(_serial) = begin("thread_proxy", &["python3", "curl", "openssl"]) else {
        return;
    };
    const N: usize = 10;
    const OWN_MS: u32 = 15;
    let backend = HelperServer::spawn(
        Command::new("python3")
            .arg(helper("delay_backend.py"))
            .args(["--delay-ms", &DELAY_MS.to_string()]),
    );
    // A scratch directory (removed with it).
    let scratch = Cert::new();
    let log = scratch.dir.join("proxy.log");
    let port = free_port();
    let ports = format!("{port},{}", backend.port);
    let watch = Watch::start(&["--port", &ports]);
    // Started after the observer, as a user's would be.
    let proxy = HelperServer::spawn(
        Command::new("python3")
            .arg(helper("thread_proxy.py"))
            .args(["--port", &port.to_string()])
            .args(["--backend", &backend.port.to_string()])
            .args(["--own-ms", &OWN_MS.to_string()])
            .arg("--log")
            .arg(&log),
    );
    let paths: Vec<String> = (0..N).map(|i| format!("/api/p{i}")).collect();
    let curl_says = curl_parallel(proxy.port, &paths, false);
    // Each handler logs once its answer is written: wait for all ten.
    let logged = || std::fs::read_to_string(&log).map_or(0, |l| l.lines().count());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while logged() < N && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(proxy);
    let w = watch.stop();
    let proxy_says: HashMap<String, (f64, f64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let ms = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{l:?}"));
            (f[0].to_owned(), (ms(f[1]), ms(f[2])))
        })
        .collect();
    assert_eq!(proxy_says.len(), N);
    let find = |dir: &str, path: &str| -> Vec<&Value> {
        w.requests
            .iter()
            .filter(|r| r["direction"] == dir && r["path"] == path)
            .collect()
    };
    for i in 0..N {
        let (outer, inner) = (format!("/api/p{i}"), format!("/p{i}"));
        let inbound: Vec<&Value> = find("inbound", &outer);
        let client: Vec<&Value> = find("outbound", &outer);
        let leg: Vec<&Value> = find("outbound", &inner);
        let at_backend: Vec<&Value> = find("inbound", &inner);
        assert_eq!(
            (inbound.len(), client.len(), leg.len(), at_backend.len()),
            (1, 1, 1, 1),
            "{outer}: one record at each end of each hop"
        );
        let (inbound, client, leg, at_backend) = (inbound[0], client[0], leg[0], at_backend[0]);
        let up = assert_one_trace(&outer, [client, inbound, leg, at_backend], "thread");
        assert_eq!(
            leg["tid"], inbound["tid"],
            "{outer}: one thread served both"
        );
        assert_ne!(leg["tid"], leg["pid"], "{outer}: a worker thread");
        // Against the proxy's own clock: its upstream call (a connect, the
        // request, the answer read) is our leg, from its connect on.
        let (request_ms, leg_ms) = proxy_says[&outer];
        let ours = ms(&inbound["duration_ns"]);
        let ours_up = ms(&up["duration_ns"]);
        let own = ms(&inbound["own_time_ns"]);
        let curl_ms = curl_says[&outer];
        eprintln!(
            "{outer}: proxy {request_ms:.3} ms (upstream {leg_ms:.3}), ours {ours:.3} ms \
             (upstream {ours_up:.3}, own {own:.3}), curl {curl_ms:.3} ms"
        );
        assert!(
            ours_up >= f64::from(DELAY_MS),
            "{outer}: the leg holds the delay"
        );
        // The proxy's clock holds the leg, so ours is never longer; from
        // below, the injected delay bounds it (above). The proxy's clock
        // cannot: the ten answers arrive together and its threads take
        // turns with the GIL to parse them, the last one 9 ms after the
        // wire here.
        assert!(
            ours_up <= leg_ms + 0.5,
            "{outer}: upstream ours {ours_up:.3} ms, the proxy's {leg_ms:.3} ms"
        );
        // The handler starts once the request is read and ends once its
        // answer is written: ours holds it, and curl's holds ours (to
        // within 1 ms: curl stamps a transfer's end in its loop, 0.5 ms
        // early once with both CPUs busy).
        assert!(
            ours >= request_ms - 2.0 && ours <= curl_ms + 1.0,
            "{outer}: ours {ours:.3} ms, the proxy's {request_ms:.3} ms, curl {curl_ms:.3} ms"
        );
        assert!(
            own >= f64::from(OWN_MS) - 2.0,
            "{outer}: the proxy's own work"
        );
        assert!((own - (ours - ours_up)).abs() < 0.001, "{outer}: own time");
    }
}

/// A gateway calling its upstream over HTTP/2 (tests/helpers/h2_gateway.js:
/// Node's event loop, one h2 session opened at start-up): each leg is a
/// stream of that one connection, linked by method and path to the request
/// it serves; 10 concurrent requests link one to one, the upstream's own
/// record of each stream the leg's child.
#[test]
fn gateway_legs_over_http2_streams_link_one_to_one() {
    let Some(_serial) = begin("h2_gateway", &["node", "curl"]) else {
        return;
    };
    const N: usize = 10;
    let upstream = HelperServer::spawn(
        Command::new("node")
            .arg(helper("h2_server.js"))
            .args(["0", &DELAY_MS.to_string()]),
    );
    let port = free_port();
    let watch = Watch::start(&["--port", &format!("{port},{}", upstream.port)]);
    // Started after the observer, as a user's would be.
    let gateway = HelperServer::spawn(
        Command::new("node")
            .arg(helper("h2_gateway.js"))
            .args([port.to_string(), upstream.port.to_string()]),
    );
    let paths: Vec<String> = (0..N).map(|i| format!("/p{i}")).collect();
    let curl_says = curl_parallel_answered(port, &paths, "ok");
    drop(gateway);
    let w = watch.stop();
    for path in &paths {
        let find = |local: Option<u16>, remote: Option<u16>, dir: &str| -> Vec<&Value> {
            w.requests
                .iter()
                .filter(|r| r["direction"] == dir && r["path"] == path.as_str())
                .filter(|r| local.is_none_or(|p| r["local_port"] == p))
                .filter(|r| remote.is_none_or(|p| r["remote_port"] == p))
                .collect()
        };
        let inbound = find(Some(port), None, "inbound");
        let client = find(None, Some(port), "outbound");
        let leg = find(None, Some(upstream.port), "outbound");
        let at_upstream = find(Some(upstream.port), None, "inbound");
        assert_eq!(
            (inbound.len(), client.len(), leg.len(), at_upstream.len()),
            (1, 1, 1, 1),
            "{path}: one record at each end of each hop"
        );
        let (inbound, client, leg, at_upstream) = (inbound[0], client[0], leg[0], at_upstream[0]);
        assert!(
            leg["stream_id"].is_u64(),
            "{path}: an HTTP/2 stream: {leg:#}"
        );
        let up = assert_one_trace(path, [client, inbound, leg, at_upstream], "request_match");
        // The upstream answers after the injected delay; curl's clock holds
        // the whole call (its end stamped in its loop: 1 ms allowed).
        let ours = ms(&inbound["duration_ns"]);
        let ours_up = ms(&up["duration_ns"]);
        let curl_ms = curl_says[path];
        eprintln!("{path}: ours {ours:.3} ms (upstream {ours_up:.3}), curl {curl_ms:.3} ms");
        assert!(
            ours_up >= f64::from(DELAY_MS),
            "{path}: the leg holds the delay"
        );
        assert!(ours_up <= ours && ours <= curl_ms + 1.0, "{path}");
    }
}
