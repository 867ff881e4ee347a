//! An HTTPS client on reqwest with rustls (TLS compiled in), for
//! tests/tls_rustls.rs: `--requests N` keep-alive requests over one
//! connection to `--url`, HTTP/1.1 or HTTP/2 (`--http1` / `--http2`), the
//! server's certificate from `--ca`. `--chat` POSTs an OpenAI-style chat
//! completion instead of a GET. Prints one JSON line per request with its
//! own clock: the call's start (wall clock) and the time to the answer's
//! header (a monotonic timer around `send()`, which returns at the header).
//! `--resolve NAME=IP` sends NAME's requests to IP (the URL names NAME, so
//! the ClientHello carries it). For tests/secrets.rs: `--path P` requests P
//! (with its query) instead, `--body B` POSTs B (application/json) there,
//! `--header "Name: value"` (repeatable) adds a header, and `--expect TEXT`
//! adds `"replied"`: whether the answer's body held TEXT.
#![expect(clippy::unwrap_used, reason = "a test helper: a panic is a failure")]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[tokio::main]
async fn main() {
    let (mut url, mut ca, mut n, mut http2, mut chat) =
        (String::new(), String::new(), 1, false, false);
    let mut wait_ms = 0;
    let mut resolve = None;
    let (mut path, mut post, mut expect) = (None, None, None);
    let mut headers = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--url" => url = it.next().unwrap(),
            "--ca" => ca = it.next().unwrap(),
            "--requests" => n = it.next().unwrap().parse().unwrap(),
            "--http2" => http2 = true,
            "--http1" => http2 = false,
            "--chat" => chat = true,
            // Waits before its requests (a process for `doctor` to find).
            "--wait-ms" => wait_ms = it.next().unwrap().parse().unwrap(),
            "--resolve" => resolve = Some(it.next().unwrap()),
            "--path" => path = Some(it.next().unwrap()),
            "--body" => post = Some(it.next().unwrap()),
            "--header" => headers.push(it.next().unwrap()),
            "--expect" => expect = Some(it.next().unwrap()),
            _ => panic!("unknown argument {k}"),
        }
    }
    let cert = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert);
    if let Some(r) = resolve {
        let (name, ip) = r.split_once('=').unwrap();
        // Port 0: the URL's port is used.
        b = b.resolve(name, std::net::SocketAddr::new(ip.parse().unwrap(), 0));
    }
    b = if http2 {
        b.http2_prior_knowledge()
    } else {
        b.http1_only()
    };
    let client = b.build().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
    for i in 0..n {
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let t = Instant::now();
        let mut req = if let Some(p) = &path {
            match &post {
                Some(b) => client
                    .post(format!("{url}{p}"))
                    .header("content-type", "application/json")
                    .body(b.clone()),
                None => client.get(format!("{url}{p}")),
            }
        } else if chat {
            client
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(
                    r#"{"model":"rustls-test-model","messages":[{"role":"user","content":"hi"}]}"#,
                )
        } else {
            client.get(format!("{url}/req{i}"))
        };
        for h in &headers {
            let (name, value) = h.split_once(':').unwrap();
            req = req.header(name.trim(), value.trim());
        }
        let resp = req.send().await.unwrap();
        let header_ns = t.elapsed().as_nanos() as u64;
        let status = resp.status().as_u16();
        let version = format!("{:?}", resp.version());
        let body = resp.bytes().await.unwrap();
        let total_ns = t.elapsed().as_nanos() as u64;
        let replied = expect.as_ref().map_or(String::new(), |e| {
            let held = body.windows(e.len()).any(|w| w == e.as_bytes());
            format!(",\"replied\":{held}")
        });
        println!(
            "{{\"pid\":{},\"i\":{i},\"start_unix_ns\":{start_unix_ns},\"header_ns\":{header_ns},\"total_ns\":{total_ns},\"status\":{status},\"version\":\"{version}\",\"body_bytes\":{}{replied}}}",
            std::process::id(),
            body.len()
        );
    }
}
