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

const PATHS: usize = 20;
const DELAY_MS: u32 = 40;

fn proxied(test: &str, upstream_tls: bool) {
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
         server {{\n  listen 127.0.0.1:{port};\n  access_log {log} legs;\n\
           location / {{ proxy_pass {scheme}://backend; proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\"; }}\n }}\n",
        b = backend.port,
        log = log.display(),
    );
    let watch = Watch::start(&[
        "--port",
        &port.to_string(),
        "--port",
        &backend.port.to_string(),
    ]);
    // Started after the observer: a fresh nginx, as a user's would be.
    let nginx = Nginx::start(&dir, &servers, port);
    let urls: Vec<String> = (0..PATHS)
        .map(|i| format!("http://127.0.0.1:{port}/p{i}"))
        .collect();
    let out = Command::new("curl")
        .args([
            "-sS",
            "--parallel",
            "--parallel-immediate",
            "--parallel-max",
        ])
        .arg(PATHS.to_string())
        // Each transfer's own clock: request about to be sent, and done.
        .args(["-w", "%{url_effective} %{time_pretransfer} %{time_total}\n"])
        .args(&urls)
        .output()
        .unwrap();
    assert!(out.status.success(), "curl: {out:?}");
    let body = String::from_utf8_lossy(&out.stdout);
    assert_eq!(body.matches("served /p").count(), PATHS, "{body}");
    // Path -> curl's time from the request to the end of its answer, in ms.
    let curl_says: HashMap<String, f64> = body
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("http://127.0.0.1:{port}")))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let secs = |s: &str| s.parse::<f64>().unwrap_or_else(|_| panic!("{l:?}"));
            (f[0].to_owned(), (secs(f[2]) - secs(f[1])) * 1e3)
        })
        .collect();
    assert_eq!(curl_says.len(), PATHS, "{body}");
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
        let trace = &client["trace_id"];
        assert!(trace.is_string(), "{client:#}");
        for r in [inbound, leg, at_backend] {
            assert_eq!(&r["trace_id"], trace, "{path}: {r:#}");
        }
        assert_eq!(inbound["parent_span_id"], client["span_id"], "{path}");
        assert_eq!(leg["parent_span_id"], inbound["span_id"], "{path}: {leg:#}");
        assert_eq!(leg["link_rule"], "request_match", "{path}: {leg:#}");
        assert_eq!(at_backend["parent_span_id"], leg["span_id"], "{path}");
        let upstream = inbound["upstream"]
            .as_array()
            .unwrap_or_else(|| panic!("{inbound:#}"));
        assert_eq!(upstream.len(), 1, "{path}: {inbound:#}");
        assert_eq!(
            upstream[0]["span_id"], leg["span_id"],
            "{path}: linked to its own leg"
        );
        assert_eq!(upstream[0]["remote_port"], backend.port);
        // Against nginx's own clock.
        let (request_time, upstream_time) = nginx_says[&path];
        let ours = ms(&inbound["duration_ns"]);
        let ours_up = ms(&upstream[0]["duration_ns"]);
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
        // proxy's own time, before the leg began. Ours is never longer, and
        // nginx's exceeds it by no more than that wait.
        let before_leg = (upstream[0]["start_unix_ns"].as_u64().unwrap() as f64
            - inbound["start_unix_ns"].as_u64().unwrap() as f64)
            / 1e6;
        eprintln!("{path}: the leg began {before_leg:.3} ms into the request");
        assert!(
            ours_up <= upstream_time + 2.0 && upstream_time <= ours_up + before_leg.max(0.0) + 2.0,
            "{path}: $upstream_response_time {upstream_time} ms, ours {ours_up:.3} ms, \
             the leg began {before_leg:.3} ms in"
        );
        assert!((own - (ours - ours_up)).abs() < 0.001, "{path}: own time");
    }
}

#[test]
fn nginx_legs_over_http_link_one_to_one() {
    proxied("nginx_legs_over_http_link_one_to_one", false);
}

#[test]
fn nginx_legs_over_https_link_one_to_one() {
    proxied("nginx_legs_over_https_link_one_to_one", true);
}
