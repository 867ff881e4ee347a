//! TLS that no library probe sees (Java's JSSE here; Go's crypto/tls,
//! rustls and stripped static binaries alike): the handshake read from the
//! TLS record headers on the wire, `library` null and `source` "wire"; the
//! answer's first byte only after a full TLS 1.2 handshake, never a
//! handshake flight or a TLS 1.3 session ticket taken for it.
//! Java 17's `HttpClient` (helpers/TlsClient.java, compiled here) against
//! the tests' OpenSSL server, which injects its handshake and answer
//! delays; its own timer around each call.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::process::Command;

use serde_json::Value;
use tests::*;

const HS_MS: u32 = 100;
const ANSWER_MS: u32 = 200;
/// The wire's handshake against the server's own (its library's calls):
/// the client's Finished leaves just before the server reads it.
const TOL_MS: f64 = 2.0;

fn ms_of(v: &Value) -> f64 {
    ms(v.as_u64()
        .unwrap_or_else(|| panic!("not a number of ns: {v}")))
}

/// TlsClient.java compiled into a fresh directory (removed on drop).
struct Java(std::path::PathBuf);

impl Java {
    fn build() -> Java {
        let dir = std::env::temp_dir().join(format!("observer-java-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("javac")
            .arg("-d")
            .arg(&dir)
            .arg(helper("TlsClient.java"))
            .output()
            .unwrap();
        assert!(out.status.success(), "javac: {out:?}");
        Java(dir)
    }

    /// `requests` calls on one connection; `tls12`: held to TLS 1.2. One
    /// line per call: its path and the call's time by Java's clock.
    fn run(&self, port: u16, requests: u32, prefix: &str, tls12: bool) -> Vec<Value> {
        let mut cmd = Command::new("java");
        if tls12 {
            cmd.arg("-Djdk.tls.client.protocols=TLSv1.2");
        }
        cmd.arg("-cp").arg(&self.0).arg("TlsClient").args([
            &port.to_string(),
            &requests.to_string(),
            prefix,
        ]);
        run_json_lines(&mut cmd)
    }
}

impl Drop for Java {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The one connection record of `comm` in `direction` with `field` = `value`.
fn conn<'a>(out: &'a Watched, comm: &str, field: &str, value: &Value) -> &'a Value {
    let v: Vec<&Value> = out
        .records
        .iter()
        .filter(|r| r["kind"] == "connection" && r["comm"] == comm && &r[field] == value)
        .collect();
    assert_eq!(v.len(), 1, "{comm} {field}={value}: {:#?}", out.records);
    v[0]
}

/// Java over TLS 1.3 and over TLS 1.2, three fresh processes each with
/// three kept-alive calls: each client connection's handshake from the
/// wire, at least the injected delay and inside Java's first call (less the
/// answer's delay); on the least disturbed of each version's three, within
/// TOL_MS of the server's handshake by its library's calls (either side's
/// thread may read a flight late on a busy machine: 2.2 ms once). Over TLS
/// 1.3 no first byte (the server's session tickets come like an answer),
/// counted; over TLS 1.2 the first byte at least the answer's delay and
/// inside Java's call, the least disturbed within TOL_MS of the server's.
#[test]
fn java_handshakes_from_the_wire() {
    let Some(_serial) = begin("tls_wire_java", &["openssl", "python3", "java", "javac"]) else {
        return;
    };
    let java = Java::build();
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", HS_MS, ANSWER_MS);
    let w = Watch::start(&["--port", &server.port.to_string()]);
    let mut own = Vec::new();
    for tls12 in [false, true] {
        for k in 0..3 {
            let calls = java.run(server.port, 3, &format!("v{}-{k}", u8::from(tls12)), tls12);
            assert_eq!(calls.len(), 3, "{calls:?}");
            own.push((tls12, calls));
        }
    }
    let out = w.stop();
    let mut clients: Vec<&Value> = out
        .records
        .iter()
        .filter(|r| r["kind"] == "connection" && r["comm"] == "java")
        .collect();
    assert_eq!(clients.len(), 6, "one connection per process: {clients:#?}");
    // The processes ran one after another.
    clients.sort_by_key(|r| r["start_unix_ns"].as_u64());
    let mut hs_diffs = [Vec::new(), Vec::new()];
    let mut ttfb_diffs = Vec::new();
    for (c, (tls12, calls)) in clients.iter().zip(&own) {
        let who = if *tls12 { "TLS 1.2" } else { "TLS 1.3" };
        let tls = &c["tls"];
        assert_eq!(tls["library"], Value::Null, "{who}: {c:#}");
        assert_eq!(tls["source"], "wire", "{who}: {c:#}");
        // Java sends no SNI for an address.
        assert_eq!(tls["server_name"], Value::Null, "{who}: {c:#}");
        let hs = ms_of(&tls["handshake_ns"]);
        let first_call = calls[0]["ms"].as_f64().unwrap();
        assert!(
            hs >= f64::from(HS_MS) && hs <= first_call - f64::from(ANSWER_MS),
            "{who}: handshake {hs:.3} ms, injected {HS_MS} ms, Java's first call {first_call:.3} ms"
        );
        let s = conn(&out, "python3", "remote_port", &c["local_port"]);
        assert_eq!(s["tls"]["source"], "library", "{s:#}");
        hs_diffs[usize::from(*tls12)].push(hs - ms_of(&s["tls"]["handshake_ns"]));
        if *tls12 {
            assert_eq!(tls["version"], "1.2", "{c:#}");
            assert_eq!(tls["ttfb_source"], "wire", "{c:#}");
            let ttfb = ms_of(&tls["ttfb_ns"]);
            assert!(
                ttfb >= f64::from(ANSWER_MS) && ttfb <= first_call - hs,
                "{who}: first byte {ttfb:.3} ms, injected {ANSWER_MS} ms, Java's call {first_call:.3} ms"
            );
            ttfb_diffs.push(ttfb - ms_of(&s["tls"]["ttfb_ns"]));
        } else {
            // From the ServerHello's supported_versions.
            assert_eq!(tls["version"], "1.3", "{c:#}");
            assert_eq!(
                (&tls["ttfb_ns"], &tls["ttfb_source"]),
                (&Value::Null, &Value::Null),
                "{c:#}"
            );
        }
    }
    for (what, diffs) in [
        ("TLS 1.3 handshake", &hs_diffs[0]),
        ("TLS 1.2 handshake", &hs_diffs[1]),
        ("TLS 1.2 first byte", &ttfb_diffs),
    ] {
        eprintln!("{what}: the wire's - the server's: {diffs:?} ms");
        assert!(
            closest(diffs) <= TOL_MS,
            "{what}: the wire's - the server's {diffs:?} ms, none within {TOL_MS} ms"
        );
    }
    let summary = out.summary();
    // Each Java connection's ClientHello (the Python server's end is its
    // library's from SSL_set_fd on, before a ClientHello comes, unless one
    // came first); the counter is the host's, so other TLS may add to it.
    assert!(summary["tls_wire"].as_u64() >= Some(6), "{summary:#}");
    assert_eq!(
        summary["tls_first_byte_unmeasured"]["wire_tls13"], 3,
        "{summary:#}"
    );
}
