//! A process's first TLS connection, read from its first byte: fresh
//! processes that start after the observer and connect at once to a local
//! server that answers at once, with no delay in its handshake (a local
//! handshake takes 2-3 ms; a probe attached once the process has begun
//! would come 13-21 ms later, bench/NOTES.md). Each request is recorded on
//! both ends, each process's first one included, its first byte held to
//! the client's own clock.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::process::Command;

use serde_json::Value;
use tests::*;

/// Ours against the client's own clock, on the least disturbed request.
const TOL_MS: f64 = 2.0;

fn ms_of(v: &Value) -> f64 {
    ms(v.as_u64()
        .unwrap_or_else(|| panic!("not a number of ns: {v}")))
}

/// The one request record of `path` seen from `direction`.
fn request<'a>(out: &'a Watched, path: &str, direction: &str) -> &'a Value {
    let v: Vec<&Value> = out
        .requests
        .iter()
        .filter(|r| r["path"] == path && r["direction"] == direction)
        .collect();
    assert_eq!(
        v.len(),
        1,
        "{direction} {path}: {:#?}\n{:#?}",
        out.requests,
        out.stderr
    );
    v[0]
}

/// One fresh curl fetching `urls` (HTTP/1.1, one kept-alive connection):
/// per URL, its local port and `time_starttransfer - time_appconnect` (ms).
/// Not from `time_pretransfer`: curl reads that clock after writing the
/// request, so a curl scheduled out in between reports less than the wait
/// its request met. `time_appconnect` is the handshake's end on a new
/// connection, the transfer's start (0) on a reused one: before the
/// request either way.
fn curl(urls: &[String]) -> Vec<(u64, f64)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--http1.1", "-w"])
        .arg("%{local_port} %{time_appconnect} %{time_starttransfer}\\n");
    for u in urls {
        cmd.args(["-o", "/dev/null", u]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<f64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (f[0] as u64, (f[2] - f[1]) * 1000.0)
        })
        .collect()
}

/// Five fresh curls, three URLs each, on a server that answers at once:
/// fifteen requests on each end, every curl's first included, each with its
/// path, status and connection; the first byte of each curl's first
/// request by us within TOL_MS of curl's on the least disturbed, never
/// more than curl's own + TOL_MS.
#[test]
fn fresh_curls_first_requests() {
    let Some(_serial) = begin("tls_first_curl", &["openssl", "python3", "curl"]) else {
        return;
    };
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", 0, 0);
    let port = server.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    let mut firsts = (Vec::new(), Vec::new());
    let mut runs = Vec::new();
    for p in 0..5 {
        let paths: Vec<String> = (0..3).map(|i| format!("/c{p}/u{i}")).collect();
        let urls: Vec<String> = paths
            .iter()
            .map(|p| format!("https://127.0.0.1:{port}{p}"))
            .collect();
        let own = curl(&urls);
        assert_eq!(own.len(), 3, "{own:?}");
        runs.push((paths, own));
    }
    let out = w.stop();
    for (paths, own) in &runs {
        for (i, (path, (local_port, curls))) in paths.iter().zip(own).enumerate() {
            let c = request(&out, path, "outbound");
            let s = request(&out, path, "inbound");
            for x in [c, s] {
                assert_eq!(x["method"], "GET", "{x:#}");
                assert_eq!(x["status"], 200, "{x:#}");
            }
            assert_eq!(c["comm"], "curl", "{c:#}");
            assert_eq!(c["local_port"], *local_port, "{c:#}");
            assert_eq!(s["remote_port"], *local_port, "{s:#}");
            let ours = ms_of(&c["ttfb_ns"]);
            // The server's answer left inside the client's wait.
            assert!(ms_of(&s["ttfb_ns"]) <= ours, "{s:#}\n{c:#}");
            if i == 0 {
                firsts.0.push(ours);
                firsts.1.push(*curls);
            }
        }
        let conn = out
            .records
            .iter()
            .find(|r| r["kind"] == "connection" && r["local_port"] == own[0].0)
            .expect("curl's connection");
        assert_eq!(conn["tls"]["ttfb_source"], "plaintext", "{conn:#}");
        assert!(conn["tls"]["handshake_ns"].is_u64(), "{conn:#}");
    }
    agree_with_clock(
        "a fresh curl's first request, first byte",
        &firsts.0,
        &firsts.1,
        0.0,
        TOL_MS,
        TOL_MS,
    );
    let summary = out.summary();
    assert_eq!(summary["http"]["answers_without_request"], 0, "{summary:#}");
    assert_eq!(
        summary["tls_first_byte_unmeasured"]["plaintext_late"], 0,
        "{summary:#}"
    );
}

/// A Python program that connects as it starts (Python's ssl, libssl.so.3),
/// sends one request and times the answer's first byte itself (from its
/// sendall to its first recv's return), reads the answer whole: the request on both ends, its first byte
/// within TOL_MS of Python's (least disturbed of five processes).
#[test]
fn a_python_process_that_connects_at_start_up() {
    let Some(_serial) = begin("tls_first_python", &["openssl", "python3"]) else {
        return;
    };
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", 0, 0);
    let port = server.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    const SCRIPT: &str = "import socket, ssl, sys, time
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = ctx.wrap_socket(socket.create_connection(('127.0.0.1', int(sys.argv[1]))))
t = time.perf_counter()
s.sendall(b'GET ' + sys.argv[2].encode() + b' HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')
got = s.recv(65536)
ttfb = (time.perf_counter() - t) * 1000
head, _, body = got.partition(b'\\r\\n\\r\\n')
length = int(head.lower().split(b'content-length:')[1].split(b'\\r\\n')[0])
while len(body) < length:
    body += s.recv(65536)
print(s.getsockname()[1], ttfb)
";
    let mut own = Vec::new();
    for p in 0..5 {
        let path = format!("/py{p}");
        let out = Command::new("python3")
            .args(["-c", SCRIPT, &port.to_string(), &path])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let line = String::from_utf8(out.stdout).unwrap();
        let f: Vec<f64> = line
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        own.push((path, f[0] as u64, f[1]));
    }
    let out = w.stop();
    let mut ours = Vec::new();
    for (path, local_port, _) in &own {
        let c = request(&out, path, "outbound");
        let s = request(&out, path, "inbound");
        assert_eq!(c["comm"], "python3", "{c:#}");
        assert_eq!(c["local_port"], *local_port, "{c:#}");
        assert_eq!(c["status"], 200, "{c:#}");
        assert_eq!(s["status"], 200, "{s:#}");
        ours.push(ms_of(&c["ttfb_ns"]));
    }
    // Each Python session (both ends: the server is Python's too) tied by
    // the descriptor it gave OpenSSL (SSL_set_fd), not by a socket hook;
    // the counter is the host's, so other TLS may add to it.
    let summary = out.summary();
    assert!(
        summary["tls_tied_by_fd"].as_u64() >= Some(2 * own.len() as u64),
        "{summary:#}"
    );
    let theirs: Vec<f64> = own.iter().map(|o| o.2).collect();
    agree_with_clock(
        "python's first request, first byte",
        &ours,
        &theirs,
        0.0,
        TOL_MS,
        TOL_MS,
    );
}

/// A busy process takes the TLS files it maps per process (so that it
/// traps no more) until it exits; then they go back to all processes and a
/// fresh curl's first request is read again. With the rate cap at 100
/// calls/s: a Python client making 1,500 requests, and the server answering
/// them, both turn busy; once both are gone, a new server and a fresh curl
/// (its first request on both ends).
#[test]
fn a_busy_process_takes_its_files_per_process_until_it_exits() {
    let Some(_serial) = begin("tls_first_busy", &["openssl", "python3", "curl"]) else {
        return;
    };
    let cert = Cert::new();
    let busy_server = tls_server(&cert, "tls", 0, 0);
    let mut w = Watch::start_with_env(
        &["--tls-plaintext-max-rate", "100"],
        &[("RUST_LOG", "observer=info")],
    );
    let busy = run_json_lines(
        Command::new("python3")
            .arg(helper("tls_client.py"))
            .args(["--port", &busy_server.port.to_string()])
            .args(["--requests", "1500", "--connections", "1"]),
    );
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert!(
        w.wait_for_stderr("per process now", std::time::Duration::from_secs(10)),
        "no file went per process: {:?}",
        w.stderr_seen()
    );
    drop(busy_server);
    assert!(
        w.wait_for_stderr("back to all processes", std::time::Duration::from_secs(10)),
        "the file stayed per process: {:?}",
        w.stderr_seen()
    );
    let server = tls_server(&cert, "tls", 0, 0);
    let port = server.port;
    let own = curl(&[format!("https://127.0.0.1:{port}/after/0")]);
    let out = w.stop();
    let c = request(&out, "/after/0", "outbound");
    let s = request(&out, "/after/0", "inbound");
    assert_eq!(c["comm"], "curl", "{c:#}");
    assert_eq!(c["local_port"], own[0].0, "{c:#}");
    assert_eq!(
        (&c["status"], &s["status"]),
        (&Value::from(200), &Value::from(200)),
        "{c:#} {s:#} {:#}",
        Value::from(
            out.with("local_port", &c["local_port"])
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        )
    );
    let summary = out.summary();
    let tls = &summary["tls"];
    assert!(
        tls["plaintext_fell_back"].as_u64() >= Some(2),
        "{summary:#}"
    );
    assert!(
        tls["files_per_process_total"].as_u64() >= Some(1),
        "{summary:#}"
    );
    let files = tls["files"].as_array().unwrap();
    assert!(
        files.iter().all(|f| f["per_process"] == false),
        "all back to all processes: {files:#?}"
    );
}
