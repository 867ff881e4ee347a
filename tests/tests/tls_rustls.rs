//! rustls, probed in the Rust executables that carry it (rustls is compiled
//! in: no TLS library to probe): an HTTPS client on reqwest and a server on
//! hyper with tokio-rustls (tests/rustls-pair, built by `cargo xtask test`),
//! over HTTP/1.1 and h2. Each connection's `tls` object says `library`
//! "rustls" with its handshake (read on the wire) on both ends, and every
//! request is a record on both ends, each fresh client process's first
//! included, held to the client's own clock (a monotonic timer around each
//! call, which returns at the answer's header) and to the server's
//! injected delays. An LLM call's `gen_ai`; a server already running when
//! the observer starts; a stripped client (the wire's handshake, the reason
//! in `doctor`); a client built with v0 symbol mangling.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use serde_json::Value;
use tests::*;

/// Injected by the server: inside each handshake (once the ClientHello is
/// read) and before each answer's header.
const HS_MS: u32 = 100;
const ANSWER_MS: u32 = 200;
/// The name the clients ask for (the test certificate's), sent to 127.0.0.1.
const NAME: &str = "tls.test";
/// Ours against the client's own clock, on the least disturbed sample.
const TOL_MS: f64 = 2.0;
/// Fresh client processes per test, and requests each.
const PROCESSES: usize = 3;
const REQUESTS: usize = 3;
const CLIENT: &str = "rustls_client";
const SERVER: &str = "rustls_server";

fn ms_of(v: &Value) -> f64 {
    ms(v.as_u64()
        .unwrap_or_else(|| panic!("not a number of ns: {v}")))
}

/// A program of tests/rustls-pair, built beside the observer.
fn pair_bin(name: &str) -> PathBuf {
    let p = observer_bin().parent().unwrap().join(name);
    assert!(
        p.exists(),
        "{} not found: `cargo xtask test` builds it (cargo build --release -p rustls-pair)",
        p.display()
    );
    p
}

/// A copy of `bin` in a directory of its own: a file no process ran
/// before, as a freshly built or installed program is. Removed with `dir`.
fn fresh_copy(dir: &Path, bin: &Path) -> PathBuf {
    static COPIES: AtomicUsize = AtomicUsize::new(0);
    let d = dir.join(format!("copy{}", COPIES.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&d).unwrap();
    let to = d.join(bin.file_name().unwrap());
    std::fs::copy(bin, &to).unwrap();
    to
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("observer-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn server(bin: &Path, cert: &Cert, port: u16) -> HelperServer {
    HelperServer::spawn(
        Command::new(bin)
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key())
            .args(["--port", &port.to_string()])
            .args(["--handshake-delay-ms", &HS_MS.to_string()])
            .args(["--answer-delay-ms", &ANSWER_MS.to_string()]),
    )
}

/// The client's lines, one per request: its pid, the call's start and its
/// own time to the answer's header.
fn client(bin: &Path, cert: &Cert, port: u16, args: &[&str]) -> Vec<Value> {
    let lines = run_json_lines(
        Command::new(bin)
            .args(["--url", &format!("https://{NAME}:{port}")])
            .args(["--resolve", &format!("{NAME}=127.0.0.1")])
            .arg("--ca")
            .arg(cert.cert())
            .args(args),
    );
    for l in &lines {
        assert_eq!(l["status"], 200, "{lines:#?}");
    }
    lines
}

/// A connection's `tls` object from the rustls probes: the library named,
/// the handshake (on the wire) at least the injected wait, the first byte
/// from the plaintext calls.
fn is_rustls(who: &str, r: &Value) {
    let tls = &r["tls"];
    assert_eq!(tls["library"], "rustls", "{who}: {r:#}");
    assert_eq!(tls["source"], "library", "{who}: {r:#}");
    assert_eq!(tls["handshake_error"], Value::Null, "{who}: {r:#}");
    assert_eq!(tls["ttfb_source"], "plaintext", "{who}: {r:#}");
    // From the hellos on the wire (rustls 0.23 asks for TLS 1.3 first).
    assert_eq!(tls["server_name"], NAME, "{who}: {r:#}");
    assert_eq!(tls["version"], "1.3", "{who}: {r:#}");
    let hs = ms_of(&tls["handshake_ns"]);
    assert!(
        hs >= f64::from(HS_MS),
        "{who}: handshake {hs:.3} ms, injected {HS_MS} ms: {r:#}"
    );
}

/// The client process `pid`'s request records, in order, and the server's
/// records of the same requests (by the client's ports).
fn both_ends<'a>(
    out: &'a Watched,
    pid: &Value,
    server_pid: u32,
) -> (Vec<&'a Value>, Vec<&'a Value>) {
    let mut client: Vec<&Value> = out
        .requests
        .iter()
        .filter(|r| r["direction"] == "outbound" && &r["pid"] == pid)
        .collect();
    client.sort_by_key(|r| r["start_unix_ns"].as_u64());
    let ports: Vec<&Value> = client.iter().map(|r| &r["local_port"]).collect();
    let mut served: Vec<&Value> = out
        .requests
        .iter()
        .filter(|r| {
            r["direction"] == "inbound"
                && r["pid"] == server_pid
                && ports.contains(&&r["remote_port"])
        })
        .collect();
    served.sort_by_key(|r| r["start_unix_ns"].as_u64());
    (client, served)
}

/// The connection records of `comm` (`direction`) that carried requests.
fn carrying<'a>(out: &'a Watched, direction: &str, pid: &Value) -> Vec<&'a Value> {
    out.records
        .iter()
        .filter(|r| {
            r["kind"] == "connection"
                && r["direction"] == direction
                && &r["pid"] == pid
                && r["tls"]["plaintext_sent"].as_u64() > Some(0)
        })
        .collect()
}

/// What each test checks of a run's requests: every one a record on both
/// ends with its method, path, status and protocol, the client's first
/// byte inside its own timer around the call (the least disturbed of the
/// requests after the first within TOL_MS of it: those timers hold no
/// connection set-up), the server's at least the injected wait and inside
/// the client's; the connections' `tls` objects from the probes.
fn check_requests(out: &Watched, own: &[Vec<Value>], server_pid: u32, protocol: &str) {
    check_requests_of(out, own, server_pid, protocol, CLIENT);
}

/// [`check_requests`] for clients named `comm`.
fn check_requests_of(
    out: &Watched,
    own: &[Vec<Value>],
    server_pid: u32,
    protocol: &str,
    comm: &str,
) {
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for lines in own {
        let pid = &lines[0]["pid"];
        let (client, served) = both_ends(out, pid, server_pid);
        for (side, got) in [("client", &client), ("server", &served)] {
            assert_eq!(
                got.len(),
                lines.len(),
                "{side} records of client {pid}'s requests: {got:#?}\nits own: {lines:#?}\nall requests: {:#?}",
                out.requests
            );
        }
        for (i, ((c, s), l)) in client.iter().zip(&served).zip(lines).enumerate() {
            // reqwest's pool may open a second HTTP/1.1 connection for a
            // request whose predecessor's connection is not back yet: the
            // numbers count per connection.
            let index = 1 + client[..i]
                .iter()
                .filter(|e| e["local_port"] == c["local_port"])
                .count();
            for x in [c, s] {
                let what = format!("request {i} of client {pid}: {x:#}");
                assert_eq!(x["protocol"], protocol, "{what}");
                assert_eq!(x["status"], 200, "{what}");
                assert_eq!(x["error"], Value::Null, "{what}");
                assert_eq!(x["headers_undecodable"], false, "{what}");
                assert_eq!(x["request_index"], index, "{what}");
            }
            assert_eq!(c["local_port"], s["remote_port"], "{c:#}\n{s:#}");
            assert_eq!(c["path"], s["path"], "{c:#}\n{s:#}");
            assert_eq!(c["comm"], comm, "{c:#}");
            assert_eq!(s["comm"], SERVER, "{s:#}");
            let mine = ms_of(&c["ttfb_ns"]);
            let timer = ms_of(&l["header_ns"]);
            let answer = ms_of(&s["ttfb_ns"]);
            eprintln!("client {pid} request {i}: ours {mine:.3} ms, its timer {timer:.3} ms, the server's {answer:.3} ms");
            assert!(
                answer >= f64::from(ANSWER_MS) && answer <= mine && mine <= timer,
                "client {pid} request {i}: the server's time to answer {answer:.3} ms (injected {ANSWER_MS} ms), the client's by us {mine:.3} ms, its own timer {timer:.3} ms"
            );
            if i > 0 {
                ours.push(mine);
                theirs.push(timer);
            }
        }
        for c in carrying(out, "outbound", pid) {
            is_rustls(&format!("client {pid}"), c);
            let s: Vec<&Value> = out
                .records
                .iter()
                .filter(|r| {
                    r["kind"] == "connection"
                        && r["direction"] == "inbound"
                        && r["pid"] == server_pid
                        && r["remote_port"] == c["local_port"]
                })
                .collect();
            assert_eq!(s.len(), 1, "the server's end of {c:#}: {s:#?}");
            is_rustls(&format!("server, client {pid}"), s[0]);
        }
    }
    let gaps: Vec<f64> = ours.iter().zip(&theirs).map(|(o, t)| o - t).collect();
    assert!(
        closest(&gaps) <= TOL_MS,
        "ours - the client's timer: {gaps:?} ms, none within {TOL_MS} ms"
    );
    let summary = out.summary();
    assert_eq!(summary["http"]["answers_without_request"], 0, "{summary:#}");
    assert_eq!(summary["tls_rustls_reads_unjoined"], 0, "{summary:#}");
}

/// The handshake by us (connect, the client's TLS set-up and the handshake
/// on the wire) against the client's own clock: its first call's timer
/// less its quickest later one (the same request without the set-up).
fn check_handshakes(out: &Watched, own: &[Vec<Value>]) {
    let mut gaps = Vec::new();
    for lines in own {
        let pid = &lines[0]["pid"];
        let (client, _) = both_ends(out, pid, 0);
        let port = &client[0]["local_port"];
        let c: Vec<&Value> = out
            .records
            .iter()
            .filter(|r| r["kind"] == "connection" && &r["pid"] == pid && &r["local_port"] == port)
            .collect();
        assert_eq!(c.len(), 1, "client {pid}'s first connection: {c:#?}");
        let c = c[0];
        let tls = &c["tls"];
        let ours = ms_of(&c["connect_ns"]) + ms_of(&tls["setup_ns"]) + ms_of(&tls["handshake_ns"]);
        let later = lines[1..]
            .iter()
            .map(|l| ms_of(&l["header_ns"]))
            .fold(f64::INFINITY, f64::min);
        let theirs = ms_of(&lines[0]["header_ns"]) - later;
        eprintln!(
            "client {pid}: connection set-up by us {ours:.3} ms, by its clock {theirs:.3} ms"
        );
        assert!(ours >= f64::from(HS_MS), "{c:#}");
        gaps.push(ours - theirs);
    }
    assert!(
        closest(&gaps) <= TOL_MS,
        "set-up by us - by the client's clock: {gaps:?} ms, none within {TOL_MS} ms"
    );
}

/// The observer first, then the server from a fresh copy, then PROCESSES
/// fresh client processes (each from a copy no process ran before),
/// REQUESTS requests each.
fn fresh_clients(test: &str, args: &[&str], protocol: &str) {
    let Some(_serial) = begin(test, &["openssl"]) else {
        return;
    };
    let scratch = Scratch::new(test);
    let cert = Cert::new();
    let port = free_port();
    let w = Watch::start(&["--port", &port.to_string()]);
    let srv = server(&fresh_copy(&scratch.0, &pair_bin(SERVER)), &cert, port);
    let mut own = Vec::new();
    let n = REQUESTS.to_string();
    for _ in 0..PROCESSES {
        let mut a = vec!["--requests", n.as_str()];
        a.extend_from_slice(args);
        own.push(client(
            &fresh_copy(&scratch.0, &pair_bin(CLIENT)),
            &cert,
            port,
            &a,
        ));
    }
    let out = w.stop();
    check_requests(&out, &own, srv.pid(), protocol);
    check_handshakes(&out, &own);
    let listed = out.summary()["tls"]["rustls_executables"].clone();
    for name in [SERVER, CLIENT] {
        assert!(
            listed.as_array().unwrap().iter().any(|r| r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(name))
                && r["probes"].as_u64() > Some(0)
                && r["mangling"] == "legacy"),
            "{name} not probed: {listed:#}"
        );
    }
}

/// Blocking clients on rustls 0.22 and 0.21 (`StreamOwned` over a
/// `TcpStream`: the socket read by `MessageDeframer::read`, plaintext by
/// `Reader::read`, a write's connection named by `send_some_plaintext`),
/// three kept-alive HTTP/1.1 GETs each from a fresh process: every request
/// on both ends, the first included, times inside the client's own and the
/// least disturbed within TOL_MS of it, the handshake, name and version;
/// `doctor`'s list has them probed.
#[test]
fn older_rustls_blocking_clients() {
    let Some(_serial) = begin("tls_rustls_older", &["openssl"]) else {
        return;
    };
    let scratch = Scratch::new("tls_rustls_older");
    let cert = Cert::new();
    let port = free_port();
    let w = Watch::start(&["--port", &port.to_string()]);
    let srv = server(&fresh_copy(&scratch.0, &pair_bin(SERVER)), &cert, port);
    let n = REQUESTS.to_string();
    let clients = [
        ("rustls022_client", "rustls022_clien"),
        ("rustls021_client", "rustls021_clien"),
    ];
    let mut own = Vec::new();
    for (bin, _) in clients {
        let lines = run_json_lines(
            Command::new(fresh_copy(&scratch.0, &pair_bin(bin)))
                .args(["--addr", &format!("127.0.0.1:{port}")])
                .args(["--name", NAME, "--requests", &n])
                .arg("--ca")
                .arg(cert.cert()),
        );
        assert_eq!(lines.len(), REQUESTS, "{lines:#?}");
        for l in &lines {
            assert_eq!(l["status"], 200, "{lines:#?}");
        }
        own.push(lines);
    }
    let out = w.stop();
    let listed = out.summary()["tls"]["rustls_executables"].clone();
    for ((bin, comm), lines) in clients.into_iter().zip(own) {
        check_requests_of(&out, &[lines], srv.pid(), "http/1.1", comm);
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["path"].as_str().is_some_and(|p| p.ends_with(bin))
                    && r["probes"].as_u64() > Some(0)),
            "{bin} not probed: {listed:#}"
        );
    }
}

#[test]
fn rustls_client_and_server_http1() {
    fresh_clients("tls_rustls_h1", &["--http1"], "http/1.1");
}

#[test]
fn rustls_client_and_server_h2() {
    fresh_clients("tls_rustls_h2", &["--http2"], "h2");
}

/// A fresh client's one chat completion (POST, JSON): its `gen_ai` on both
/// ends, with the model and the server's token counts.
#[test]
fn rustls_llm_call() {
    let Some(_serial) = begin("tls_rustls_llm", &["openssl"]) else {
        return;
    };
    let scratch = Scratch::new("tls_rustls_llm");
    let cert = Cert::new();
    let port = free_port();
    let w = Watch::start(&["--port", &port.to_string()]);
    let srv = server(&fresh_copy(&scratch.0, &pair_bin(SERVER)), &cert, port);
    let lines = client(
        &fresh_copy(&scratch.0, &pair_bin(CLIENT)),
        &cert,
        port,
        &["--http1", "--chat"],
    );
    let out = w.stop();
    let (c, s) = both_ends(&out, &lines[0]["pid"], srv.pid());
    assert_eq!((c.len(), s.len()), (1, 1), "{:#?}", out.requests);
    for x in [c[0], s[0]] {
        assert_eq!(x["method"], "POST", "{x:#}");
        assert_eq!(x["path"], "/v1/chat/completions", "{x:#}");
        let g = &x["gen_ai"];
        assert_eq!(g["request_model"], "rustls-test-model", "{x:#}");
        assert_eq!(g["response_model"], "rustls-test-model", "{x:#}");
        assert_eq!(g["input_tokens"], 5, "{x:#}");
        assert_eq!(g["output_tokens"], 7, "{x:#}");
        assert_eq!(g["finish_reason"], "stop", "{x:#}");
    }
    let mine = ms_of(&c[0]["ttfb_ns"]);
    assert!(
        mine >= f64::from(ANSWER_MS) && mine <= ms_of(&lines[0]["header_ns"]),
        "{:#}\n{lines:#?}",
        c[0]
    );
}

/// The server already running when the observer starts (its file probed
/// from the running processes before `ready`): a fresh client's requests
/// are records on both ends, their connection's handshake included.
#[test]
fn rustls_server_running_before_the_observer() {
    let Some(_serial) = begin("tls_rustls_before", &["openssl"]) else {
        return;
    };
    let scratch = Scratch::new("tls_rustls_before");
    let cert = Cert::new();
    let port = free_port();
    let srv = server(&fresh_copy(&scratch.0, &pair_bin(SERVER)), &cert, port);
    let w = Watch::start(&["--port", &port.to_string()]);
    let n = REQUESTS.to_string();
    let own = vec![client(
        &fresh_copy(&scratch.0, &pair_bin(CLIENT)),
        &cert,
        port,
        &["--requests", &n, "--http2"],
    )];
    let out = w.stop();
    check_requests(&out, &own, srv.pid(), "h2");
}

/// A stripped client (no symbol table): nothing to probe by name. Its
/// connection's handshake comes from the wire (`library` null), `doctor`
/// says why it was not probed, and the server's end still has every
/// request. A client built with v0 symbol mangling is probed like the
/// legacy build.
#[test]
fn stripped_and_v0_mangled_clients() {
    let Some(_serial) = begin("tls_rustls_builds", &["openssl", "strip"]) else {
        return;
    };
    let scratch = Scratch::new("tls_rustls_builds");
    let stripped = fresh_copy(&scratch.0, &pair_bin(CLIENT));
    let ok = Command::new("strip").arg(&stripped).status().unwrap();
    assert!(ok.success());
    let v0 = v0_client(&scratch.0);
    let cert = Cert::new();
    let port = free_port();
    let srv = server(&fresh_copy(&scratch.0, &pair_bin(SERVER)), &cert, port);

    // `doctor` on the running programs: the stripped one named, not probed.
    let mut waiting = Command::new(&stripped)
        .args(["--url", &format!("https://127.0.0.1:{port}")])
        .arg("--ca")
        .arg(cert.cert())
        .args(["--requests", "1", "--wait-ms", "5000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let doctor = Command::new(observer_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let _ = waiting.kill();
    let _ = waiting.wait();
    assert!(doctor.status.success(), "{doctor:?}");
    let d: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let listed = d["tls"]["rustls_executables"].as_array().unwrap();
    let path = stripped.display().to_string();
    let s = listed
        .iter()
        .find(|r| r["path"] == path.as_str())
        .unwrap_or_else(|| panic!("{path} not listed: {listed:#?}"));
    assert_eq!(s["probes"], 0, "{s:#}");
    assert!(
        s["not_probed"].as_str().unwrap().contains("stripped"),
        "{s:#}"
    );

    let w = Watch::start(&["--port", &port.to_string()]);
    let n = REQUESTS.to_string();
    let plain = client(&stripped, &cert, port, &["--requests", &n, "--http1"]);
    let mangled = client(&v0, &cert, port, &["--requests", &n, "--http2"]);
    let out = w.stop();

    let pid = &plain[0]["pid"];
    let (c, _) = both_ends(&out, pid, srv.pid());
    assert!(
        c.is_empty(),
        "the stripped client's plaintext is not seen: {c:#?}"
    );
    let conns: Vec<&Value> = out
        .records
        .iter()
        .filter(|r| r["kind"] == "connection" && &r["pid"] == pid)
        .collect();
    assert!(!conns.is_empty(), "{:#?}", out.records);
    let mut served = 0;
    for c in &conns {
        let tls = &c["tls"];
        assert_eq!(tls["source"], "wire", "{c:#}");
        assert_eq!(tls["library"], Value::Null, "{c:#}");
        assert_eq!(tls["server_name"], NAME, "{c:#}");
        assert_eq!(tls["version"], "1.3", "{c:#}");
        assert!(ms_of(&tls["handshake_ns"]) >= f64::from(HS_MS), "{c:#}");
        served += out
            .requests
            .iter()
            .filter(|r| r["direction"] == "inbound" && r["remote_port"] == c["local_port"])
            .count();
    }
    assert_eq!(
        served, REQUESTS,
        "the server's records of the stripped client's requests: {:#?}",
        out.requests
    );

    check_requests(&out, &[mangled], srv.pid(), "h2");
    let listed = out.summary()["tls"]["rustls_executables"].clone();
    let path = v0.display().to_string();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["path"] == path.as_str()
                && r["mangling"] == "v0"
                && r["probes"].as_u64() > Some(0)),
        "{path}: {listed:#}"
    );
}

/// The client built again with v0 symbol mangling, in a target directory
/// of its own under `dir` (a few minutes on a fresh machine).
fn v0_client(dir: &Path) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = dir.join("v0-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--package",
            "rustls-pair",
            "--bin",
            CLIENT,
        ])
        .arg("--target-dir")
        .arg(&target)
        .env("RUSTFLAGS", "-C symbol-mangling-version=v0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "v0 build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = target.join("release").join(CLIENT);
    // Checked here, not taken on trust: v0 symbols start with _R.
    let nm = Command::new("nm").arg(&bin).output().unwrap();
    assert!(
        String::from_utf8_lossy(&nm.stdout).contains(" _R"),
        "not a v0 build"
    );
    bin
}
