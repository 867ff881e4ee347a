//! TCP connection records against real sockets, real processes, real curl.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::*;

/// A helpers/server.py process; killed on drop.
fn start_server(host: &str, delay_ms: u32, response_bytes: usize) -> HelperServer {
    HelperServer::spawn(
        Command::new("python3")
            .arg(helper("server.py"))
            .args(["--host", host, "--delay-ms", &delay_ms.to_string()])
            .args(["--response-bytes", &response_bytes.to_string()]),
    )
}

/// Connects, waits `think`, sends `request`, reads to EOF. Returns (connect
/// time measured by this client, local port, bytes received).
fn exchange_after(addr: SocketAddr, think: Duration, request: &[u8]) -> (Duration, u16, usize) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    let connect = t0.elapsed();
    let local = s.local_addr().unwrap().port();
    std::thread::sleep(think);
    s.write_all(request).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    (connect, local, buf.len())
}

fn exchange(addr: SocketAddr, request: &[u8]) -> (Duration, u16, usize) {
    exchange_after(addr, Duration::ZERO, request)
}

fn one<'a>(rs: Vec<&'a Value>, what: &str) -> &'a Value {
    assert_eq!(rs.len(), 1, "expected exactly one {what}, got {rs:#?}");
    rs[0]
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn client_and_server_records_carry_their_own_processes() {
    if !require_root("client_and_server_records") || !require_tool("client_and_server", "python3") {
        return;
    }
    let server = start_server("127.0.0.1", 0, 321);
    let watch = Watch::start(&["--port", &server.port.to_string()]);
    let addr: SocketAddr = format!("127.0.0.1:{}", server.port).parse().unwrap();
    // The pause after connect() keeps the connect phase apart from the request.
    let (connect, local, got) =
        exchange_after(addr, Duration::from_millis(30), b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(got, 321);
    let out = watch.stop();

    let me = std::process::id();
    let client = one(out.with("direction", &json!("outbound")), "outbound record");
    assert_eq!(client["pid"], json!(me));
    assert_eq!(client["comm"], json!(own_comm()));
    assert_eq!(client["state"], json!("closed"));
    assert_eq!(client["family"], json!("ipv4"));
    assert_eq!(client["remote_addr"], json!("127.0.0.1"));
    assert_eq!(client["remote_port"], json!(server.port));
    assert_eq!(client["local_port"], json!(local));
    assert_eq!(client["error"], Value::Null);
    let exe = std::env::current_exe().unwrap();
    assert_eq!(client["exe"], json!(exe.to_str().unwrap()));
    // The kernel's SYN_SENT -> ESTABLISHED lies inside the client's connect().
    let ours = u(&client["connect_ns"]);
    assert!(
        ours > 0 && ours <= connect.as_nanos() as u64,
        "connect_ns {ours} vs client-measured {connect:?}"
    );

    let srv = one(out.with("direction", &json!("inbound")), "inbound record");
    assert_eq!(srv["pid"], json!(server.pid()));
    assert_eq!(srv["comm"], json!("python3"));
    assert_eq!(srv["local_port"], json!(server.port));
    assert_eq!(srv["remote_port"], json!(local));
    assert_eq!(srv["connect_ns"], Value::Null);
    assert_eq!(u(&srv["bytes_sent"]), 321);
    // Wall-clock times: within a minute of now, end after start.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for r in [client, srv] {
        let (start, end) = (u(&r["start_unix_ns"]), u(&r["end_unix_ns"]));
        assert!(
            start <= end && end <= now && now - start < 60_000_000_000,
            "{r}"
        );
    }
}

#[test]
fn time_to_first_byte_matches_injected_delay_and_bytes_are_exact() {
    if !require_root("ttfb") || !require_tool("ttfb", "python3") {
        return;
    }
    const DELAY_MS: u32 = 200;
    const RESPONSE: usize = 12_345;
    let request = vec![b'r'; 100];
    let server = start_server("127.0.0.1", DELAY_MS, RESPONSE);
    let watch = Watch::start(&["--port", &server.port.to_string()]);
    // This client's own clock, from before its send to its first read's
    // return, runs around both ends' time to first byte.
    let mut c = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let local = c.local_addr().unwrap().port();
    let t = Instant::now();
    c.write_all(&request).unwrap();
    let mut buf = vec![0u8; RESPONSE];
    let mut got = c.read(&mut buf).unwrap();
    let own_ttfb = t.elapsed().as_nanos() as u64;
    while got < RESPONSE {
        match c.read(&mut buf[got..]).unwrap() {
            0 => break,
            n => got += n,
        }
    }
    assert_eq!(got, RESPONSE);
    drop(c);
    let out = watch.stop();

    // The server sleeps 200 ms between its read and its write: both ends'
    // time to first byte hold it, and lie inside the client's clock. (Within
    // 5 ms of the delay, as before, failed with a CPU spinning: 5.8 ms.)
    let delay = u64::from(DELAY_MS) * 1_000_000;
    let client = one(out.with("local_port", &json!(local)), "client record");
    let ttfb = u(&client["ttfb_ns"]);
    assert!(
        delay <= ttfb && ttfb <= own_ttfb,
        "ttfb {} ms, the client's {} ms",
        ms(ttfb),
        ms(own_ttfb)
    );
    assert_eq!(u(&client["bytes_sent"]), 100);
    assert_eq!(u(&client["bytes_received"]), RESPONSE as u64);

    let srv = one(out.with("direction", &json!("inbound")), "server record");
    let sttfb = u(&srv["ttfb_ns"]);
    assert!(
        delay <= sttfb && sttfb <= own_ttfb,
        "server ttfb {} ms, the client's {} ms",
        ms(sttfb),
        ms(own_ttfb)
    );
    assert_eq!(u(&srv["bytes_received"]), 100);
    assert_eq!(u(&srv["bytes_sent"]), RESPONSE as u64);
}

#[test]
fn refused_connection_is_reported_as_refused() {
    if !require_root("refused") {
        return;
    }
    let port = free_port();
    let watch = Watch::start(&["--port", &port.to_string()]);
    let err = TcpStream::connect(("127.0.0.1", port)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    let out = watch.stop();
    let r = one(out.with("remote_port", &json!(port)), "refused record");
    assert_eq!(r["error"], json!("refused"));
    assert_eq!(r["pid"], json!(std::process::id()));
    assert_eq!(r["connect_ns"], Value::Null);
    assert_eq!(r["ttfb_ns"], Value::Null);
    assert!(u(&r["resets"]) >= 1);
}

#[test]
fn ipv6_loopback() {
    if !require_root("ipv6") {
        return;
    }
    let listener = TcpListener::bind("[::1]:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&["--port", &port.to_string()]);
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"world!").unwrap();
    });
    let (_, local, got) = exchange(format!("[::1]:{port}").parse().unwrap(), b"hello");
    t.join().unwrap();
    assert_eq!(got, 6);
    let out = watch.stop();
    let c = one(out.with("local_port", &json!(local)), "client record");
    assert_eq!(c["family"], json!("ipv6"));
    assert_eq!(c["remote_addr"], json!("::1"));
    assert_eq!(c["local_addr"], json!("::1"));
    assert_eq!(u(&c["bytes_received"]), 6);
    let s = one(out.with("direction", &json!("inbound")), "server record");
    assert_eq!(s["family"], json!("ipv6"));
    assert_eq!(u(&s["bytes_received"]), 5);
}

#[test]
fn v4_mapped_ipv6_socket_reports_ipv4() {
    if !require_root("v4_mapped") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&["--port", &port.to_string(), "--direction", "outbound"]);
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"hi").unwrap();
    });
    // An AF_INET6 socket connecting to ::ffff:127.0.0.1.
    let mut s = TcpStream::connect(format!("[::ffff:127.0.0.1]:{port}")).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    t.join().unwrap();
    let out = watch.stop();
    let c = one(out.records.iter().collect(), "client record");
    assert_eq!(c["family"], json!("ipv4"));
    assert_eq!(c["remote_addr"], json!("127.0.0.1"));
    assert_eq!(u(&c["bytes_received"]), 2);
}

#[test]
fn two_hundred_concurrent_connections_from_several_processes() {
    if !require_root("concurrent") || !require_tool("concurrent", "python3") {
        return;
    }
    const PROCS: usize = 4;
    const PER_PROC: usize = 50;
    let server = start_server("127.0.0.1", 20, 10);
    let watch = Watch::start(&["--port", &server.port.to_string()]);
    let clients: Vec<Child> = (0..PROCS)
        .map(|_| {
            Command::new("python3")
                .arg(helper("clients.py"))
                .args(["127.0.0.1", &server.port.to_string()])
                .args(["--connections", &PER_PROC.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // local port -> pid of the process that owned it, as the clients say.
    let mut expected = std::collections::HashMap::new();
    for c in clients {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let pid: u32 = text
            .lines()
            .find_map(|l| l.strip_prefix("PID "))
            .unwrap()
            .parse()
            .unwrap();
        for p in text.lines().filter_map(|l| l.strip_prefix("LOCAL ")) {
            expected.insert(p.parse::<u16>().unwrap(), pid);
        }
    }
    assert_eq!(expected.len(), PROCS * PER_PROC);
    let out = watch.stop();
    let outbound = out.with("direction", &json!("outbound"));
    assert_eq!(
        outbound.len(),
        PROCS * PER_PROC,
        "each connection recorded once"
    );
    for r in &outbound {
        let port = u(&r["local_port"]) as u16;
        let pid = expected
            .remove(&port)
            .unwrap_or_else(|| panic!("unexpected or duplicate {r}"));
        assert_eq!(r["pid"], json!(pid), "{r}");
        assert_eq!(u(&r["bytes_received"]), 10);
    }
    let inbound = out.with("direction", &json!("inbound"));
    assert_eq!(inbound.len(), PROCS * PER_PROC);
    assert!(inbound.iter().all(|r| r["pid"] == json!(server.pid())));
    let s = out.summary();
    assert_eq!(s["dropped"]["kernel_ring"], json!(0));
    assert_eq!(s["dropped"]["channel"], json!(0));
}

#[test]
fn connection_still_open_when_watch_stops() {
    if !require_root("open_at_stop") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&["--port", &port.to_string(), "--direction", "outbound"]);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    c.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    s.write_all(b"pong!").unwrap();
    c.read_exact(&mut [0u8; 5]).unwrap();
    let out = watch.stop();
    let r = one(out.records.iter().collect(), "open record");
    assert_eq!(r["state"], json!("open"));
    assert_eq!(r["end_unix_ns"], Value::Null);
    assert_eq!(r["error"], Value::Null);
    assert_eq!(u(&r["bytes_sent"]), 4);
    assert_eq!(u(&r["bytes_received"]), 5);
    assert!(r["ttfb_ns"].as_u64().is_some());
    drop((c, s));
}

#[test]
fn connect_and_first_byte_agree_with_curl() {
    if !require_root("curl") || !require_tool("curl", "curl") || !require_tool("curl", "python3") {
        return;
    }
    let server = start_server("127.0.0.1", 50, 2000);
    let watch = Watch::start(&["--port", &server.port.to_string(), "--comm", "curl"]);
    let mut timings = Vec::new();
    for _ in 0..5 {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--http0.9", "-w"])
            .arg("%{local_port} %{time_namelookup} %{time_connect} %{time_pretransfer} %{time_starttransfer}")
            .arg(format!("http://127.0.0.1:{}/", server.port))
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let f: Vec<f64> = text.split(' ').map(|x| x.parse().unwrap()).collect();
        timings.push(f);
    }
    let out = watch.stop();
    // curl's time minus ours, per request (s): connect, TTFB.
    let mut gaps = (Vec::new(), Vec::new());
    for f in timings {
        let port = f[0] as u16;
        let r = one(out.with("local_port", &json!(port)), "curl record");
        assert_eq!(r["comm"], json!("curl"));
        let secs = |ns: u64| ns as f64 / 1e9;
        // curl: time_connect - time_namelookup is its connect(), from before
        // the SYN to after it saw the connection up: around ours, so ours
        // is never longer but for the µs rounding of curl's two times. The
        // request goes out just before time_pretransfer and the first byte
        // comes just before time_starttransfer: ours (from the send's return
        // to the first receive's) holds the server's 50 ms wait.
        let curl_connect = f[2] - f[1];
        let curl_ttfb = f[4] - f[3];
        let ours_connect = secs(u(&r["connect_ns"]));
        let ours_ttfb = secs(u(&r["ttfb_ns"]));
        assert!(
            0.0 < ours_connect && ours_connect <= curl_connect + 0.000_002,
            "connect: ours {ours_connect} curl {curl_connect}"
        );
        assert!(
            ours_ttfb >= 0.050 && curl_ttfb > 0.045,
            "ttfb: ours {ours_ttfb} curl {curl_ttfb}, the server's wait 0.050"
        );
        gaps.0.push(curl_connect - ours_connect);
        gaps.1.push(curl_ttfb - ours_ttfb);
    }
    // Agreement within 1 ms, on the request that curl's own work disturbed
    // least: whatever keeps curl off the CPU between the kernel's event and
    // curl reading its clock counts in curl's time, one request at a time.
    // Over 16 runs (80 requests) on this 2-CPU machine with other builds
    // running (load 2-2.8), half of them with `yes` spinning on a CPU, curl's
    // connect was 0.05-2.5 ms longer than ours (4.9 ms once in a full suite
    // run), the closest of each run's five at most 0.37 ms; curl's TTFB was
    // 0.15 ms shorter to 0.001 ms longer (its pretransfer clock is read
    // after the request is sent).
    assert!(
        closest(&gaps.0) < 0.001 && closest(&gaps.1) < 0.001,
        "curl's connect and TTFB minus ours, per request (s): {gaps:?}"
    );
}

#[test]
fn long_lived_connections_get_periodic_snapshots_with_the_kernels_rtt() {
    if !require_root("snapshots") || !require_tool("snapshots", "ss") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&[
        "--port",
        &port.to_string(),
        "--direction",
        "outbound",
        "--update-interval",
        "0.5",
    ]);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let local = c.local_addr().unwrap().port();
    let (mut s, _) = listener.accept().unwrap();
    for _ in 0..50 {
        c.write_all(b"ping").unwrap();
        s.read_exact(&mut [0u8; 4]).unwrap();
        s.write_all(b"pong").unwrap();
        c.read_exact(&mut [0u8; 4]).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2500));
    // The kernel's own view of the client socket's smoothed RTT, e.g. "rtt:0.056/0.005".
    let ss = Command::new("ss")
        .args(["-tinH", "src", &format!("127.0.0.1:{local}")])
        .output()
        .unwrap();
    let text = String::from_utf8(ss.stdout).unwrap();
    let rtt_ms: f64 = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("rtt:"))
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no rtt in ss output {text:?}"))
        .parse()
        .unwrap();
    drop((c, s));
    let out = watch.stop();
    let snaps = out.with("state", &json!("open"));
    // Open about 2.5 s with a 0.5 s interval: several snapshots, never two in
    // the same interval.
    assert!(snaps.len() >= 2, "{:#?}", out.records);
    assert!(snaps.len() <= 6, "{:#?}", out.records);
    for s in &snaps {
        assert_eq!(u(&s["bytes_sent"]), 200, "{s}");
        assert_eq!(s["end_unix_ns"], Value::Null);
    }
    let last = one(out.with("state", &json!("closed")), "final record");
    assert_eq!(u(&last["bytes_received"]), 200);
    // ss prints srtt in ms with three decimals; no traffic since, so the value
    // read from the socket at close must be the same to within rounding.
    let srtt = u(&last["srtt_us"]) as f64;
    assert!(
        (srtt - rtt_ms * 1000.0).abs() <= 1.5,
        "srtt_us {srtt} vs ss rtt {rtt_ms} ms"
    );
}

#[test]
fn a_process_that_execs_is_reported_under_its_new_executable() {
    if !require_root("exec") || !require_tool("exec", "python3") || !require_tool("exec", "curl") {
        return;
    }
    let server = start_server("127.0.0.1", 0, 10);
    let watch = Watch::start(&[
        "--port",
        &server.port.to_string(),
        "--direction",
        "outbound",
    ]);
    let curl = Command::new("sh")
        .args(["-c", "command -v curl"])
        .output()
        .unwrap();
    let curl = String::from_utf8(curl.stdout).unwrap().trim().to_owned();
    let script = format!(
        "import os, socket\n\
         s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'x'); s.recv(100); s.close()\n\
         os.execv('{curl}', ['curl', '-s', '-o', '/dev/null', '--http0.9', 'http://127.0.0.1:{port}/'])\n",
        port = server.port
    );
    let child = Command::new("python3")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    let out = watch.stop();
    let mine = out.with("pid", &json!(pid));
    assert_eq!(mine.len(), 2, "{:#?}", out.records);
    let exes: Vec<&str> = mine.iter().map(|r| r["exe"].as_str().unwrap()).collect();
    assert!(exes[0].contains("python"), "{exes:?}");
    assert_eq!(
        exes[1],
        std::fs::canonicalize(&curl).unwrap().to_str().unwrap()
    );
    assert_eq!(mine[1]["comm"], json!("curl"));
}

#[test]
fn thousands_of_short_connections_are_each_recorded_once() {
    if !require_root("churn") || !require_tool("churn", "python3") {
        return;
    }
    const N: usize = 3000;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&["--port", &port.to_string(), "--direction", "outbound"]);
    // The server notes each client's port: loopback reuses a port still in
    // TIME_WAIT (tcp_tw_reuse=2), so ports need not be distinct, but the
    // records' ports must be exactly the ones the server saw.
    let server = std::thread::spawn(move || {
        let mut peers = Vec::with_capacity(N);
        for _ in 0..N {
            let (mut s, peer) = listener.accept().unwrap();
            peers.push(u64::from(peer.port()));
            let _ = s.write_all(b"k");
        }
        peers
    });
    let script = format!(
        "import socket\n\
         for _ in range({N}):\n    s = socket.create_connection(('127.0.0.1', {port})); s.recv(1); s.close()\n"
    );
    let st = Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(st.success());
    let mut peers = server.join().unwrap();
    let out = watch.stop();
    assert_eq!(
        out.records.len(),
        N,
        "one record per connection; {}",
        out.summary()
    );
    let mut ports: Vec<u64> = out.records.iter().map(|r| u(&r["local_port"])).collect();
    ports.sort_unstable();
    peers.sort_unstable();
    assert!(ports == peers, "the records' ports are the server's peers");
    assert!(out.records.iter().all(|r| r["comm"] == json!("python3")));
    // The kernel skips a tracepoint program when it fires in a softirq that
    // interrupted another of our programs on that CPU; each skip is counted
    // (kernel_missed) and may leave one record short of a byte count or an end.
    let s = out.summary();
    let missed = u(&s["dropped"]["kernel_missed"]);
    let short = out
        .records
        .iter()
        .filter(|r| u(&r["bytes_received"]) != 1 || r["end_unix_ns"].is_null())
        .count() as u64;
    assert!(
        short <= missed,
        "{short} incomplete records, {missed} counted misses"
    );
    let d = &s["dropped"];
    for k in ["kernel_ring", "kernel_map", "evicted", "channel", "output"] {
        assert_eq!(d[k], json!(0), "{k}: {d}");
    }
}
