//! Least privilege: the observer run as root with exactly the capabilities
//! of deploy/capabilities.txt (the bounding set the host service and the
//! DaemonSet give it) has every feature, shown with real traffic: an HTTPS
//! request after a name lookup (the TLS handshake, plaintext timing, the
//! lookup through the C library and on the wire) and a plain HTTP request.
//! With one capability of the set taken away, `doctor` names the missing
//! capability for each feature that needs it, beside the kernel's own
//! refusal; with CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and CAP_SYS_PTRACE
//! instead of CAP_SYS_ADMIN every feature works on this kernel (uprobes are
//! uprobe-multi links).
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::process::Command;

use observer::privileges::{self, Cap};
use serde_json::{json, Value};
use tests::*;

/// deploy/capabilities.txt.
fn deploy_caps() -> Vec<Cap> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/capabilities.txt");
    privileges::parse_list(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `setpriv` running `observer ARGS` as root with exactly `caps`: the
/// bounding set (what root gets at exec) and the inheritable set (else root
/// keeps those too) cut to them.
fn as_root_with(caps: &[Cap], args: &[&str]) -> Command {
    let list: String = caps
        .iter()
        .map(|c| format!(",+{}", c.name()[4..].to_ascii_lowercase()))
        .collect();
    let mut cmd = Command::new("setpriv");
    cmd.arg("--inh-caps=-all")
        .arg(format!("--bounding-set=-all{list}"))
        .arg(observer_bin())
        .args(args);
    cmd
}

fn bits(caps: &[Cap]) -> String {
    format!("{:016x}", caps.iter().fold(0u64, |a, &c| a | 1 << c as u32))
}

/// The HTTP/1.1 server of the TLS tests (Python's ssl: OpenSSL), over TLS
/// or (`mode` "plain") not, inside the DNS namespace when `ns` is given.
fn http_server(ns: Option<&DnsNs>, cert: &Cert, mode: &str) -> HelperServer {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns.name, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    HelperServer::spawn(
        cmd.arg(helper("tls_server.py"))
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key())
            // No delay in the handshake: a fresh curl's first bytes are
            // read as they leave (the probes are on libssl before it runs).
            .args(["--mode", mode]),
    )
}

/// curl in the namespace: its local port.
fn curl(ns: &DnsNs, args: &[&str]) -> u64 {
    let mut a = vec!["curl", "-s", "-o", "/dev/null", "-w", "%{local_port}"];
    a.extend_from_slice(args);
    let out = ns.exec(&a);
    assert!(
        out.status.success(),
        "{a:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn every_feature_works_with_exactly_the_deploy_capabilities() {
    let Some(_serial) = begin(
        "least_privilege",
        &["setpriv", "curl", "openssl", "python3", "ip"],
    ) else {
        return;
    };
    let caps = deploy_caps();
    let ns = DnsNs::new(20.0);
    let cert = Cert::new();
    let server = http_server(Some(&ns), &cert, "tls");
    let plain = http_server(Some(&ns), &cert, "plain");
    let w = Watch::spawn(as_root_with(&caps, &["watch", "--json"]));
    let ready = w.stderr_seen().last().unwrap().clone();
    for f in [
        "connections: on",
        "TLS handshakes: on",
        "TLS plaintext timing: on",
        "DNS library: on",
        "DNS wire: on",
        "plain HTTP requests: on",
    ] {
        assert!(ready.contains(f), "{f:?} not in {ready}");
    }
    // The first TLS client after start-up can outrun the definition of the
    // per-process probes (tests/tests/tls.rs warms up the same way).
    curl(
        &ns,
        &[
            "--cacert",
            cert.cert().to_str().unwrap(),
            &format!("https://warm.test:{}/", server.port),
            "-k",
        ],
    );
    let tls_port = curl(
        &ns,
        &[
            "--cacert",
            cert.cert().to_str().unwrap(),
            &format!("https://tls.test:{}/", server.port),
        ],
    );
    let http_port = curl(&ns, &[&format!("http://api.test:{}/", plain.port)]);
    let out = w.stop();
    let (records, stderr) = (&out.records, &out.stderr);
    let conn = |port: u64| {
        records
            .iter()
            .find(|r| r["kind"] == "connection" && r["comm"] == "curl" && r["local_port"] == port)
            .unwrap_or_else(|| {
                panic!("no connection from curl port {port}: {records:#?}\n{stderr:#?}")
            })
    };
    // HTTPS: the handshake (all-process uprobes on libssl), the first
    // byte from the plaintext calls (uprobes on libssl for all processes,
    // curl's first connection included), the lookup that led to it.
    let c = conn(tls_port);
    let tls = &c["tls"];
    assert_eq!(tls["library"], "openssl", "{c:#}");
    assert_eq!(tls["server_name"], "tls.test", "{c:#}");
    assert!(tls["handshake_ns"].as_u64().unwrap() > 0, "{c:#}");
    assert_eq!(tls["ttfb_source"], "plaintext", "{c:#}");
    assert_eq!(c["dns"]["name"], "tls.test", "{c:#}");
    assert_eq!(c["dns"]["source"], "libc", "{c:#}");
    // The server's side: a process started before the observer, its
    // executable read from /proc/PID/exe (CAP_SYS_PTRACE).
    let s = records
        .iter()
        .find(|r| {
            r["kind"] == "connection"
                && r["direction"] == "inbound"
                && r["local_port"] == server.port
                && r["remote_port"] == tls_port
        })
        .unwrap_or_else(|| panic!("no server record: {records:#?}"));
    assert_eq!(s["comm"], "python3", "{s:#}");
    assert!(
        s["exe"].as_str().is_some_and(|e| e.contains("python3")),
        "{s:#}"
    );
    // The lookup itself, from the C library, with its query seen on the
    // wire (the server it went to).
    let lookup = records
        .iter()
        .find(|r| r["kind"] == "dns" && r["comm"] == "curl" && r["name"] == "tls.test")
        .unwrap_or_else(|| panic!("no lookup: {records:#?}"));
    assert_eq!(lookup["result"], "ok", "{lookup:#}");
    assert_eq!(lookup["server"], "127.0.0.1", "{lookup:#}");
    // Plain HTTP: the request record (cgroup_skb programs).
    let c = conn(http_port);
    assert_eq!(c["dns"]["name"], "api.test", "{c:#}");
    let req = out.requests.iter().any(|r| {
        r["direction"] == "outbound"
            && r["local_port"] == http_port
            && r["method"] == "GET"
            && r["status"] == 200
    });
    assert!(
        req,
        "no request record for port {http_port}: {:#?}",
        out.requests
    );
}

/// `doctor --json` as root with `caps`: (exit code, report).
fn doctor(caps: &[Cap]) -> (Option<i32>, Value) {
    let out = as_root_with(caps, &["doctor", "--json"]).output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

fn missing(v: &Value, feature: &str) -> Vec<String> {
    v["capabilities"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["feature"] == feature)
        .unwrap()["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["capability"].as_str().unwrap().to_owned())
        .collect()
}

fn state(v: &Value, feature: &str) -> Value {
    v["features"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x[0] == feature)
        .map_or(Value::Null, |x| x[1]["state"].clone())
}

/// The kernel's refusal behind CAP_SYS_PTRACE: a server started before the
/// observer (as root with every capability, more than the observer holds)
/// has its connection recorded with its name but no executable, since
/// /proc/PID/exe needs ptrace read access.
fn without_ptrace_exe_is_unknown(caps: &[Cap]) {
    let cert = Cert::new();
    let server = http_server(None, &cert, "plain");
    let w = Watch::spawn(as_root_with(caps, &["watch", "--json"]));
    {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut answer = [0u8; 64];
        let n = c.read(&mut answer).unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{answer:?}");
    }
    let out = w.stop();
    let (records, stderr) = (&out.records, &out.stderr);
    let s = records
        .iter()
        .find(|r| {
            r["kind"] == "connection"
                && r["direction"] == "inbound"
                && r["local_port"] == server.port
        })
        .unwrap_or_else(|| panic!("no server record: {records:#?}\n{stderr:#?}"));
    assert_eq!(s["comm"], "python3", "{s:#}");
    assert_eq!(s["exe"], Value::Null, "{s:#}");
}

#[test]
fn doctor_names_each_missing_capability_for_the_features_it_serves() {
    let Some(_serial) = begin("least_privilege_doctor", &["setpriv", "python3"]) else {
        return;
    };
    let caps = deploy_caps();
    // The set itself: exactly it is held, nothing is missing.
    let (code, v) = doctor(&caps);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["capabilities"]["effective_hex"], bits(&caps));
    for f in v["capabilities"]["features"].as_array().unwrap() {
        assert_eq!(f["missing"], json!([]), "{f:#}");
    }
    for f in [
        "connections",
        "tls_handshakes",
        "dns_library",
        "dns_wire",
        "http_plain",
    ] {
        assert_eq!(state(&v, f), "on", "{f}: {:#}", v["features"]);
    }
    // One taken away at a time.
    for drop in &caps {
        let fewer: Vec<Cap> = caps.iter().copied().filter(|c| c != drop).collect();
        let (code, v) = doctor(&fewer);
        let name = drop.name();
        match drop {
            Cap::SysAdmin => {
                // Neither CAP_BPF nor CAP_PERFMON (CAP_SYS_ADMIN did for
                // both): nothing can be loaded. (The uprobes need no
                // CAP_SYS_ADMIN of their own here: uprobe-multi links.)
                assert_eq!(code, Some(1), "{v:#}");
                assert_eq!(v["ok"], false);
                for f in [
                    "connections",
                    "tls_handshakes",
                    "tls_plaintext",
                    "dns_library",
                ] {
                    assert_eq!(missing(&v, f), ["CAP_BPF", "CAP_PERFMON"], "{f}: {v:#}");
                }
            }
            Cap::SysPtrace => {
                assert_eq!(code, Some(0), "{v:#}");
                for f in [
                    "connections",
                    "tls_handshakes",
                    "tls_plaintext",
                    "dns_library",
                ] {
                    assert_eq!(missing(&v, f), [name], "{f}: {v:#}");
                }
                assert_eq!(missing(&v, "dns_wire"), Vec::<String>::new());
                without_ptrace_exe_is_unknown(&fewer);
            }
            other => panic!("no check written for {other:?}"),
        }
    }
    // CAP_SYS_ADMIN's narrower relatives instead of it: on this kernel
    // (6.6+) the uprobes are uprobe-multi links, which CAP_BPF and
    // CAP_PERFMON make (perf-event uprobes would need CAP_SYS_ADMIN since
    // CVE-2025-38466's fix), so every feature works and nothing is missing.
    let narrow = [Cap::Bpf, Cap::Perfmon, Cap::NetAdmin, Cap::SysPtrace];
    let (code, v) = doctor(&narrow);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["uprobes"], "uprobe_multi", "{v:#}");
    for f in [
        "connections",
        "tls_handshakes",
        "tls_plaintext",
        "dns_library",
        "dns_wire",
        "http_plain",
    ] {
        assert_eq!(state(&v, f), "on", "{f}: {:#}", v["features"]);
        assert_eq!(missing(&v, f), Vec::<String>::new(), "{f}");
    }
    let getaddrinfo = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["program"] == "getaddrinfo")
        .unwrap();
    assert_eq!(getaddrinfo["status"], "attached", "{getaddrinfo:#}");
    // The text says nothing is missing under the feature.
    let out = as_root_with(&narrow, &["doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let after_tls: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("TLS handshakes"))
        .take(2)
        .collect();
    assert!(
        after_tls.len() == 2
            && after_tls[0].contains(" on ")
            && !after_tls[1].contains("-> missing"),
        "{text}"
    );
}
