//! Every kind of record, once, kept short: the subset of the end-to-end
//! tests that runs on this host and in qemu on stock Debian kernels (5.10,
//! 6.1, 6.12: `cargo xtask vmtest`), where software emulation makes
//! everything 10-50x slower and the clocks noisy. So each record and field is
//! checked to be there and sane, not to the millisecond: a handshake or a
//! first byte at least the wait the server injected and under MAX_MS, the
//! server's answer inside the client's wait, the owner (pid, comm) of each
//! end. Waits are for conditions, with generous deadlines. `doctor`'s verdict
//! and exit code; curl over HTTP and HTTPS to a server started before the
//! observer; Python, Node.js and Go TLS clients; DNS through libc and on the
//! wire; an LLM call's stream over TLS and plain HTTP; OTLP spans.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use serde_json::{json, Value};
use tests::{otlp::*, *};

/// Injected by the TLS test server: inside each handshake, and before each
/// answer.
const HS_MS: u32 = 100;
const ANSWER_MS: u32 = 200;
/// No time measured here may reach this: a bound for sanity (a unit off, a
/// start never set), not for speed.
const MAX_MS: f64 = 30_000.0;
/// How long a wait for a condition may take (in a VM, a process's start
/// alone can take seconds).
const DEADLINE: Duration = Duration::from_secs(60);

/// `v` as milliseconds, at least `floor_ms` and under MAX_MS.
fn sane_ms(what: &str, v: &Value, floor_ms: f64) -> f64 {
    let got = ms(v
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: not a number of ns: {v}")));
    assert!(
        got >= floor_ms && got < MAX_MS,
        "{what}: {got:.3} ms, expected at least {floor_ms} ms (and under {MAX_MS} ms)"
    );
    got
}

/// `r` belongs to process `pid`, named `comm`.
fn owned_by(what: &str, r: &Value, pid: u32, comm: &str) {
    assert_eq!(
        (r["pid"].as_u64(), r["comm"].as_str()),
        (Some(u64::from(pid)), Some(comm)),
        "{what}: the owner: {r:#}"
    );
}

/// The one request record on the connection from `client_port`, seen from
/// `direction`: an HTTP/1.1 GET of `path` answered 200, its first byte at
/// least the injected wait after the request began, inside the request.
/// (The client port alone does not name a connection: the kernel gives
/// one client port to connections to two servers.)
fn get_request<'a>(
    out: &'a Watched,
    direction: &str,
    client_port: u64,
    server_port: u16,
    path: &str,
) -> &'a Value {
    let server_field = if direction == "outbound" {
        "remote_port"
    } else {
        "local_port"
    };
    let mut v = out.requests_on(&json!(client_port), direction);
    v.retain(|r| r[server_field] == server_port);
    assert_eq!(
        v.len(),
        1,
        "{direction} requests of client port {client_port}: {v:#?}\nall requests: {:#?}",
        out.requests
    );
    let r = v[0];
    let what = format!("{direction} request of client port {client_port}: {r:#}");
    assert_eq!(r["protocol"], "http/1.1", "{what}");
    assert_eq!(r["method"], "GET", "{what}");
    assert_eq!(r["path"], path, "{what}");
    assert_eq!(r["status"], 200, "{what}");
    assert_eq!(r["error"], Value::Null, "{what}");
    assert_eq!(r["request_index"], 1, "{what}");
    let ttfb = sane_ms(&what, &r["ttfb_ns"], f64::from(ANSWER_MS));
    let duration = sane_ms(&what, &r["duration_ns"], 0.0);
    assert!(ttfb <= duration, "first byte after the end: {what}");
    r
}

/// The server's time to answer lies inside the client's wait for it (the
/// server read the request after the client sent it, and answered before the
/// client read the answer): both on one clock, whatever the emulation.
fn answer_inside_wait(what: &str, server_ns: &Value, client_ns: &Value) {
    let (s, c) = (server_ns.as_u64().unwrap(), client_ns.as_u64().unwrap());
    assert!(
        s <= c,
        "{what}: the server answered in {:.3} ms, the client waited {:.3} ms",
        ms(s),
        ms(c)
    );
}

/// A connection's `tls` object from `library`'s probes: a handshake of at
/// least the injected wait, a first byte of at least the answer's, read from
/// the plaintext calls.
fn tls_of(what: &str, r: &Value, library: &str) {
    let t = &r["tls"];
    assert_eq!(t["library"], library, "{what}: {r:#}");
    assert_eq!(t["source"], "library", "{what}: {r:#}");
    assert_eq!(t["handshake_error"], Value::Null, "{what}: {r:#}");
    assert_eq!(t["ttfb_source"], "plaintext", "{what}: {r:#}");
    sane_ms(
        &format!("{what} handshake"),
        &t["handshake_ns"],
        f64::from(HS_MS),
    );
    sane_ms(
        &format!("{what} first byte"),
        &t["ttfb_ns"],
        f64::from(ANSWER_MS),
    );
}

/// Waits until no TCP socket of this network namespace on `port` is still
/// between established and closed (TIME_WAIT is closed for the observer):
/// every end of the test's connections has closed, so its records are due.
fn closed_on(port: u16) {
    let busy = || -> Vec<String> {
        ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let on_port = |a: &str| {
                    a.rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
                };
                // 0A LISTEN, 06 TIME_WAIT.
                f.len() > 3 && (on_port(f[1]) || on_port(f[2])) && !matches!(f[3], "0A" | "06")
            })
            .collect()
    };
    let t = Instant::now();
    while !busy().is_empty() {
        assert!(
            t.elapsed() < DEADLINE,
            "sockets on port {port} still open: {:?}",
            busy()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cmd` run to its end; its pid and stdout.
fn pid_and_stdout(cmd: &mut Command) -> (u32, String) {
    let child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", out.status);
    (pid, String::from_utf8(out.stdout).unwrap())
}

/// `observer doctor --json` exits with its verdict's code (0 ok, 3
/// degraded, 1 unusable), lists every program with a status, and says "ok":
/// every feature a user expects works on this kernel. Anything else fails
/// with why, and doctor's whole text report.
#[test]
fn doctor_says_ok_and_exits_with_its_verdicts_code() {
    let Some(_serial) = begin("subset_doctor", &[]) else {
        return;
    };
    let out = Command::new(observer_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let code = out.status.code();
    let mut wrong = Vec::new();
    match serde_json::from_slice::<Value>(&out.stdout) {
        Err(e) => wrong.push(format!("doctor --json printed no JSON: {e}")),
        Ok(v) => {
            let verdict = &v["verdict"];
            let (word, why) = (verdict["verdict"].as_str(), &verdict["why"]);
            let want_code = match word {
                Some("ok") if why.is_null() => Some(0),
                Some("degraded") if why.as_array().is_some_and(|w| !w.is_empty()) => Some(3),
                Some("unusable") if why.is_string() => Some(1),
                _ => None,
            };
            match want_code {
                None => wrong.push(format!("no verdict of a known shape: {verdict}")),
                Some(c) if code != Some(c) => {
                    wrong.push(format!("exit code {code:?} for the verdict {verdict}"));
                }
                Some(_) => {}
            }
            if word != Some("ok") || v["ok"] != true {
                wrong.push(format!(
                    "the verdict is not ok: {verdict:#} (ok: {})",
                    v["ok"]
                ));
            }
            let programs = v["programs"].as_array().map_or(&[][..], Vec::as_slice);
            if !v["attach_cookies"].is_boolean() {
                wrong.push(format!("attach_cookies: {}", v["attach_cookies"]));
            }
            if programs.len() != observer::programs::PROGRAMS.len() {
                wrong.push(format!(
                    "{} program rows, {} programs",
                    programs.len(),
                    observer::programs::PROGRAMS.len()
                ));
            }
            for p in programs {
                if !matches!(
                    p["status"].as_str(),
                    Some("attached" | "loaded" | "not loaded" | "failed")
                ) {
                    wrong.push(format!("a program without a status: {p}"));
                }
            }
        }
    }
    if !wrong.is_empty() {
        let text = Command::new(observer_bin()).arg("doctor").output().unwrap();
        // The text report says it all, and shorter than the JSON.
        panic!(
            "doctor --json (exit {code:?}): {}\nits stderr: {}\n--- observer doctor (exit {:?}) ---\n{}{}",
            wrong.join("\n"),
            String::from_utf8_lossy(&out.stderr),
            text.status.code(),
            String::from_utf8_lossy(&text.stdout),
            String::from_utf8_lossy(&text.stderr),
        );
    }
}

/// Three fresh curls over plain HTTP and three over HTTPS (OpenSSL) to a
/// Python server started before the observer: each connection on both ends
/// with its owner, the TLS object on both ends of the HTTPS ones, and each
/// request on both ends: GET, 200, its first byte at least the server's
/// wait, the server's answer inside curl's wait.
#[test]
fn curl_over_http_and_https_to_a_server_started_first() {
    let Some(_serial) = begin("subset_curl", &["curl", "openssl", "python3"]) else {
        return;
    };
    let cert = Cert::new();
    let plain = tls_server(&cert, "plain", 0, ANSWER_MS);
    let tls = tls_server(&cert, "tls", HS_MS, ANSWER_MS);
    let w = Watch::start(&["--port", &format!("{},{}", plain.port, tls.port)]);
    let mut runs = Vec::new();
    for (server, scheme) in [(&plain, "http"), (&tls, "https")] {
        for _ in 0..3 {
            let (pid, said) = pid_and_stdout(
                Command::new("curl")
                    .args(["-sk", "--max-time", "60", "-o", "/dev/null"])
                    .args(["-w", "%{local_port} %{http_code}", "--resolve"])
                    .arg(format!("tls.test:{}:127.0.0.1", server.port))
                    .arg(format!("{scheme}://tls.test:{}/", server.port)),
            );
            let (lport, status) = said.split_once(' ').unwrap();
            assert_eq!(status, "200", "curl {scheme}");
            runs.push((server, scheme, pid, lport.parse::<u64>().unwrap()));
        }
    }
    closed_on(plain.port);
    closed_on(tls.port);
    let out = w.stop();

    for (server, scheme, pid, lport) in runs {
        let what = format!("curl {scheme} (pid {pid}, port {lport})");
        let c = conn(&out, "outbound", &json!(lport), server.port);
        owned_by(&what, c, pid, "curl");
        assert_eq!(c["exe"], "/usr/bin/curl", "{what}: {c:#}");
        assert_eq!(
            (&c["state"], &c["error"]),
            (&json!("closed"), &Value::Null),
            "{what}: {c:#}"
        );
        sane_ms(&format!("{what} connect"), &c["connect_ns"], 0.0);
        let s = conn(&out, "inbound", &json!(lport), server.port);
        let swhat = format!("the server's end of {what}");
        owned_by(&swhat, s, server.pid(), "python3");
        // The kernel's own counts, one end's sent the other's received.
        assert_eq!(
            (&c["bytes_sent"], &c["bytes_received"]),
            (&s["bytes_received"], &s["bytes_sent"]),
            "{what}: bytes\n{c:#}\n{s:#}"
        );
        assert!(c["bytes_received"].as_u64() > Some(0), "{what}: {c:#}");
        if scheme == "https" {
            // The socket's first byte on TLS: the ClientHello to the
            // server's first handshake bytes, after its injected wait.
            sane_ms(
                &format!("{what} ServerHello"),
                &c["ttfb_ns"],
                f64::from(HS_MS),
            );
            sane_ms(
                &format!("{swhat} ServerHello"),
                &s["ttfb_ns"],
                f64::from(HS_MS),
            );
            tls_of(&what, c, "openssl");
            tls_of(&swhat, s, "openssl");
            for r in [c, s] {
                assert_eq!(r["tls"]["server_name"], "tls.test", "{what}: {r:#}");
            }
            answer_inside_wait(&what, &s["tls"]["ttfb_ns"], &c["tls"]["ttfb_ns"]);
        } else {
            assert_eq!(
                (&c["tls"], &s["tls"]),
                (&Value::Null, &Value::Null),
                "{what}"
            );
            sane_ms(
                &format!("{what} first byte"),
                &c["ttfb_ns"],
                f64::from(ANSWER_MS),
            );
            sane_ms(
                &format!("{swhat} first byte"),
                &s["ttfb_ns"],
                f64::from(ANSWER_MS),
            );
            answer_inside_wait(&what, &s["ttfb_ns"], &c["ttfb_ns"]);
        }
        let cr = get_request(&out, "outbound", lport, server.port, "/");
        owned_by(&what, cr, pid, "curl");
        assert_eq!(cr["host"], format!("tls.test:{}", server.port), "{cr:#}");
        let sr = get_request(&out, "inbound", lport, server.port, "/");
        owned_by(&swhat, sr, server.pid(), "python3");
        answer_inside_wait(&format!("{what} request"), &sr["ttfb_ns"], &cr["ttfb_ns"]);
    }
}

/// Where this test binary built helpers/gotls/main.go: target/, by the
/// source's hash and the Go release, so a VM booted on this root (or the
/// next run) finds it built (a Go build under emulation takes minutes).
fn gotls() -> PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let src = helper("gotls/main.go");
    let version = Command::new("go").arg("version").output().unwrap().stdout;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (std::fs::read(&src).unwrap(), version).hash(&mut h);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/kernel-subset-go");
    let bin = root.join(format!("{:016x}", h.finish())).join("gotls");
    if bin.exists() {
        return bin;
    }
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    let part = bin.with_extension(format!("part{}", std::process::id()));
    let out = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&part)
        .arg(&src)
        // Debian's Go, the standard library only: no module, no proxy, no
        // user's settings (as tls_go.rs builds it).
        .env("GO111MODULE", "off")
        .env("GOENV", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", root.join("cache"))
        .env("GOPATH", root.join("gopath"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&part, &bin).unwrap();
    bin
}

/// A Python client (its own mapping of libssl), a Node.js client (its own
/// OpenSSL) and a Go client (crypto/tls in the executable) to the Python
/// TLS server: each connection with its owner and its library's `tls`
/// object, and its request on both ends.
#[test]
fn python_node_and_go_tls_clients() {
    let Some(_serial) = begin("subset_tls_clients", &["openssl", "python3", "node", "go"]) else {
        return;
    };
    tls_clients(&[]);
}

/// The same where uprobes carry no attach cookie (kernels before 5.15, as
/// 5.10 in qemu; here by `OBSERVER_NO_ATTACH_COOKIE`): a program per library
/// stands in for each shared one, and Go's find their executable by the
/// task's. `doctor` says so, and ok.
#[test]
fn tls_clients_where_uprobes_carry_no_cookie() {
    let Some(_serial) = begin(
        "subset_tls_no_cookie",
        &["openssl", "python3", "node", "go"],
    ) else {
        return;
    };
    let env = [(observer::ebpf::NO_COOKIE_ENV, "1")];
    let out = Command::new(observer_bin())
        .args(["doctor", "--json"])
        .envs(env)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            &v["attach_cookies"],
            &v["verdict"]["verdict"],
            out.status.code()
        ),
        (&json!(false), &json!("ok"), Some(0)),
        "doctor --json without cookies: {:#}",
        v["verdict"]
    );
    tls_clients(&env);
}

/// A Python, a Node.js and a Go client over TLS to a Python server, the
/// observer run with `env`: each connection on both ends with its owner, its
/// TLS object and server name, and its request on both ends.
fn tls_clients(env: &[(&str, &str)]) {
    let go = gotls();
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", HS_MS, ANSWER_MS);
    let port = server.port.to_string();
    let w = Watch::start_with_env(&["--port", &port], env);
    let py = run_json_lines(Command::new("python3").arg(helper("tls_client.py")).args([
        "--port",
        &port,
        "--servername",
        "py.test",
    ]));
    let node = run_json_lines(
        Command::new("node")
            .arg(helper("tls_client.js"))
            .args([port.as_str(), "node.test"]),
    );
    let gol = run_json_lines(
        Command::new(&go)
            .arg("client")
            .args(["-url", &format!("https://localhost:{port}")])
            .args(["-connect", &format!("127.0.0.1:{port}")])
            .args(["-h1", "-n", "1"]),
    );
    closed_on(server.port);
    let out = w.stop();

    for (who, said, comm, library, path, name) in [
        ("python", &py, "python3", "openssl", "/0", "py.test"),
        ("node", &node, "node", "openssl", "/", "node.test"),
        ("go", &gol, "gotls", "go", "/0", "localhost"),
    ] {
        assert_eq!(said.len(), 1, "{who}: {said:?}");
        let pid = said[0]["pid"].as_u64().unwrap() as u32;
        // Node prints no port: its connection is the one of its pid.
        let lport = said[0]["local_port"].as_u64().unwrap_or_else(|| {
            let mine: Vec<&Value> = out
                .records
                .iter()
                .filter(|r| {
                    r["kind"] == "connection" && r["direction"] == "outbound" && r["pid"] == pid
                })
                .collect();
            assert_eq!(
                mine.len(),
                1,
                "{who} pid {pid}: {mine:#?}\nall: {:#?}",
                out.records
            );
            mine[0]["local_port"].as_u64().unwrap()
        });
        let what = format!("{who} (pid {pid}, port {lport})");
        let c = conn(&out, "outbound", &json!(lport), server.port);
        owned_by(&what, c, pid, comm);
        tls_of(&what, c, library);
        assert_eq!(c["tls"]["server_name"], name, "{what}: {c:#}");
        let s = conn(&out, "inbound", &json!(lport), server.port);
        let swhat = format!("the server's end of {what}");
        owned_by(&swhat, s, server.pid(), "python3");
        tls_of(&swhat, s, "openssl");
        let cr = get_request(&out, "outbound", lport, server.port, path);
        owned_by(&what, cr, pid, comm);
        let sr = get_request(&out, "inbound", lport, server.port, path);
        owned_by(&swhat, sr, server.pid(), "python3");
        answer_inside_wait(&format!("{what} request"), &sr["ttfb_ns"], &cr["ttfb_ns"]);
    }
}

/// The DNS server's wait before each answer.
const DNS_DELAY_MS: f64 = 100.0;

/// A lookup through glibc's getaddrinfo (Python) and one dig sends itself,
/// against a DNS server in a network namespace: each one record with its
/// name, answer, server and the process that asked.
#[test]
fn lookups_through_libc_and_on_the_wire() {
    let Some(_serial) = begin("subset_dns", &["dig", "python3", "ip"]) else {
        return;
    };
    let ns = DnsNs::new(DNS_DELAY_MS);
    let w = Watch::start(&[]);
    let py = ns.exec(&[
        "python3",
        "-c",
        "import os, socket\nprint(os.getpid())\nsocket.getaddrinfo('ks-libc.test', 80)",
    ]);
    assert!(py.status.success(), "{py:?}");
    let py_pid: u64 = String::from_utf8(py.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The shell's pid is dig's: it execs it.
    let dig = ns.exec(&[
        "sh",
        "-c",
        "echo $$; exec dig +tries=1 +timeout=10 ks-wire.test",
    ]);
    let text = String::from_utf8(dig.stdout).unwrap();
    assert!(dig.status.success(), "{text}");
    let dig_pid: u64 = text.lines().next().unwrap().trim().parse().unwrap();
    let dig_id: u64 = text
        .lines()
        .find(|l| l.contains("->>HEADER<<-"))
        .and_then(|l| l.split("id: ").nth(1))
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("no id in dig's output: {text}"));
    let out = w.stop();

    for (name, source, pid, comm) in [
        ("ks-libc.test", "libc", py_pid, "python3"),
        ("ks-wire.test", "wire", dig_pid, "dig"),
    ] {
        let l: Vec<&Value> = out
            .records
            .iter()
            .filter(|r| r["kind"] == "dns" && r["name"] == name)
            .collect();
        assert_eq!(
            l.len(),
            1,
            "{name}: {l:#?}\nall lookups: {:#?}",
            out.records
                .iter()
                .filter(|r| r["kind"] == "dns")
                .collect::<Vec<_>>()
        );
        let r = l[0];
        owned_by(name, r, pid as u32, comm);
        assert_eq!(r["source"], source, "{r:#}");
        assert_eq!(r["result"], "ok", "{r:#}");
        assert_eq!(r["rcode"], "NOERROR", "{r:#}");
        assert_eq!(r["answers"], json!(["127.0.0.1"]), "{r:#}");
        assert_eq!(r["server"], "127.0.0.1", "{r:#}");
        sane_ms(name, &r["duration_ns"], DNS_DELAY_MS);
        if source == "libc" {
            assert_eq!(r["call"], "getaddrinfo", "{r:#}");
        } else {
            assert_eq!(
                (&r["qtype"], &r["id"]),
                (&json!("A"), &json!(dig_id)),
                "{r:#}"
            );
        }
    }
}

/// Injected by the LLM server: before the answer, then between content
/// chunks.
const FIRST_MS: f64 = 150.0;
const GAP_MS: f64 = 30.0;
const CHUNKS: u64 = 4;

/// A streamed chat completion over TLS and one over plain HTTP, each from a
/// fresh client to a fresh server: on both ends the call's model, tokens
/// and events, and its time to first token at least the wait before the
/// first content chunk.
#[test]
fn streamed_llm_calls_over_tls_and_plain_http() {
    let Some(_serial) = begin("subset_llm", &["openssl", "python3"]) else {
        return;
    };
    let cert = Cert::new();
    let ports = [free_port(), free_port()];
    let w = Watch::start(&["--port", &format!("{},{}", ports[0], ports[1])]);
    let tls = llm_server_on(ports[0], Some(&cert), FIRST_MS, GAP_MS, CHUNKS);
    let plain = llm_server_on(ports[1], None, FIRST_MS, GAP_MS, CHUNKS);
    // helpers/llm_client.py, its pid and its lines.
    let client = |port: u16, args: &[&str]| {
        let (pid, said) = pid_and_stdout(
            Command::new("python3")
                .arg(helper("llm_client.py"))
                .args(["--port", &port.to_string()])
                .args(args),
        );
        let lines: Vec<Value> = said
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (pid, lines)
    };
    let calls = [
        (&tls, "ks-tls", client(tls.port, &["--model", "ks-tls"])),
        (
            &plain,
            "ks-plain",
            client(plain.port, &["--plain", "--model", "ks-plain"]),
        ),
    ];
    closed_on(tls.port);
    closed_on(plain.port);
    let out = w.stop();

    for (server, model, (pid, said)) in &calls {
        assert_eq!(said.len(), 1, "{model}: {said:?}");
        let own = &said[0];
        assert_eq!(own["status"], 200, "{model}: {own}");
        let c = out.request_of_model(model, "outbound");
        let s = out.request_of_model(model, "inbound");
        assert_eq!(c["local_port"], own["local_port"], "{c:#}");
        owned_by(model, c, *pid, "python3");
        owned_by(model, s, server.pid(), "python3");
        for r in [c, s] {
            let what = format!("{model}: {r:#}");
            assert_eq!(
                (&r["method"], &r["path"], &r["status"]),
                (&json!("POST"), &json!("/v1/chat/completions"), &json!(200)),
                "{what}"
            );
            assert_eq!(r["content_type"], "text/event-stream", "{what}");
            assert_eq!(r["streamed"], true, "{what}");
            assert_eq!(r["stream"]["events"], CHUNKS + 4, "{what}");
            let g = &r["gen_ai"];
            assert_eq!(
                (&g["provider"], &g["operation"]),
                (&json!("openai"), &json!("chat")),
                "{what}"
            );
            assert_eq!(g["response_model"], format!("{model}-served"), "{what}");
            assert_eq!(g["output_tokens"], CHUNKS, "{what}");
            assert_eq!(
                g["input_tokens"],
                own["body_len"].as_u64().unwrap() % 1000,
                "{what}"
            );
            assert_eq!(g["finish_reason"], "stop", "{what}");
            let ttfb = sane_ms(&what, &r["ttfb_ns"], FIRST_MS);
            let ttft = sane_ms(&what, &g["time_to_first_token_ns"], FIRST_MS + GAP_MS);
            assert!(
                ttfb <= ttft,
                "the first token before the first byte: {what}"
            );
        }
        answer_inside_wait(model, &s["ttfb_ns"], &c["ttfb_ns"]);
        answer_inside_wait(
            model,
            &s["gen_ai"]["time_to_first_token_ns"],
            &c["gen_ai"]["time_to_first_token_ns"],
        );
    }
}

/// Spans of the process `pid` named `name` of `kind`.
fn spans_of(rec: &Received, pid: u32, name: &str, kind: SpanKind) -> Vec<Span> {
    all_spans(rec)
        .into_iter()
        .filter(|(res, s)| {
            attr_int(res, "process.pid") == Some(i64::from(pid))
                && s.name == name
                && s.kind == kind as i32
        })
        .map(|(_, s)| s)
        .collect()
}

/// `observer run` exporting OTLP/gRPC to a receiver of the test's own: a
/// curl's GET to a plain HTTP server arrives as the client's and the
/// server's spans (waited for while it runs), with method, status and the
/// server's wait.
#[test]
fn otlp_spans_of_an_http_call() {
    let Some(_serial) = begin("subset_otlp", &["curl", "python3"]) else {
        return;
    };
    let (rec, port) = grpc_receiver();
    let cert = Cert::new();
    let server = tls_server(&cert, "plain", 0, ANSWER_MS);
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--prometheus-listen", "none"])
        .args(["--port", &server.port.to_string()])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        );
    let run = Daemon::start(cmd);
    let (curl, said) = pid_and_stdout(
        Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "60",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("http://127.0.0.1:{}/", server.port)),
    );
    assert_eq!(said, "200");
    let t = Instant::now();
    let both = || {
        !spans_of(&rec, curl, "GET", SpanKind::Client).is_empty()
            && !spans_of(&rec, server.pid(), "GET", SpanKind::Server).is_empty()
    };
    while !both() && t.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
    }
    let summary = summary_of(&run.stop());
    assert_eq!(summary["export"]["records_dropped"], 0, "{summary:#}");
    let names = || -> Vec<(Option<i64>, String, i32)> {
        all_spans(&rec)
            .into_iter()
            .map(|(res, s)| (attr_int(&res, "process.pid"), s.name, s.kind))
            .collect()
    };
    for (pid, kind) in [(curl, SpanKind::Client), (server.pid(), SpanKind::Server)] {
        let get = spans_of(&rec, pid, "GET", kind);
        assert_eq!(
            get.len(),
            1,
            "{kind:?} GET of pid {pid}: (pid, name, kind) received: {:?}",
            names()
        );
        let g = &get[0];
        assert_eq!(
            attr_str(&g.attributes, "http.request.method").as_deref(),
            Some("GET"),
            "{g:#?}"
        );
        assert_eq!(
            attr_int(&g.attributes, "http.response.status_code"),
            Some(200),
            "{g:#?}"
        );
        assert_eq!(
            attr_str(&g.attributes, "url.path").as_deref(),
            Some("/"),
            "{g:#?}"
        );
        let took = (g.end_time_unix_nano - g.start_time_unix_nano) as f64 / 1e6;
        assert!(
            took >= f64::from(ANSWER_MS) && took < MAX_MS,
            "{kind:?} GET: {took:.3} ms, the server's wait {ANSWER_MS} ms: {g:#?}"
        );
        let root = spans_of(&rec, pid, &format!("tcp 127.0.0.1:{}", server.port), kind);
        assert_eq!(
            root.len(),
            1,
            "{kind:?} connection of pid {pid}: {:?}",
            names()
        );
    }
    let client_res = all_spans(&rec)
        .into_iter()
        .find(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(curl)))
        .unwrap()
        .0;
    assert_eq!(
        attr_str(&client_res, "service.name").as_deref(),
        Some("curl")
    );
}
