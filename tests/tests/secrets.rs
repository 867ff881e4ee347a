//! Nothing private leaves the host. `observer run` with every output on
//! (records as JSON on stdout, its log on stderr at RUST_LOG=trace, OTLP
//! traces and metrics to a receiver of the tests' own, the Prometheus
//! endpoint), the per-call TLS probes on every process and DNS on the wire,
//! while every client the suite drives sends secrets of its own: a bearer
//! token (or basic credentials), a cookie, an API key header (X-Api-Key,
//! api-key, x-goog-api-key, gRPC metadata), a query string and a prompt in
//! the body; and every server answers with secrets: a completion text (the
//! answer's body) and a Set-Cookie header. Then every byte the observer gave
//! out is searched for each secret: whole, any 12 characters of it (a
//! truncated copy), in hex, and in base64 at each alignment (basic
//! credentials, or a payload dumped as base64). The secrets are letters and
//! digits, so percent-encoding and JSON escaping leave them as they are.
//!
//! A secret in a URL's path is not among them: the path is the request's
//! route, recorded (`path`, `url.path`) by design; metrics keep only its
//! template, where an opaque segment becomes `{id}` (observer/src/http/route.rs).
//!
//! The test also proves the traffic was seen: each client's request
//! records, with their paths (the query gone), each server's, the LLM calls
//! as such, spans and metrics over OTLP and series on the endpoint.
//! Needs root (see tests/src/lib.rs).
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{otlp, *};

/// Letters and digits from the kernel's random source.
fn random_token(len: usize) -> String {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    bytes
        .iter()
        .map(|b| ALNUM[usize::from(*b) % ALNUM.len()] as char)
        .collect()
}

/// Every secret sent, by what it is (client and place).
#[derive(Default)]
struct Book(Vec<(String, String)>);

impl Book {
    fn new_secret(&mut self, what: String) -> String {
        let s = random_token(24);
        self.0.push((what, s.clone()));
        s
    }

    /// A client's secrets, one per place.
    fn client(&mut self, name: &str) -> ClientSecrets {
        ClientSecrets {
            bearer: self.new_secret(format!("{name}: Authorization")),
            cookie: self.new_secret(format!("{name}: Cookie")),
            api_key: self.new_secret(format!("{name}: API key header")),
            query: self.new_secret(format!("{name}: query string")),
            prompt: self.new_secret(format!("{name}: prompt / request body")),
        }
    }

    /// A server's secrets.
    fn server(&mut self, name: &str) -> ServerSecrets {
        ServerSecrets {
            reply: self.new_secret(format!("{name}: completion / answer body")),
            set_cookie: self.new_secret(format!("{name}: Set-Cookie")),
        }
    }
}

struct ClientSecrets {
    bearer: String,
    cookie: String,
    api_key: String,
    query: String,
    prompt: String,
}

impl ClientSecrets {
    /// An OpenAI chat request whose prompt is the secret.
    fn chat_body(&self, model: &str) -> String {
        format!(
            r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
            self.prompt
        )
    }
}

struct ServerSecrets {
    reply: String,
    set_cookie: String,
}

/// Base64 (standard alphabet, padded).
fn base64(data: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What a copy of `secret` looks like in any output: its 12-character
/// windows (the whole secret, or a truncated copy), its hex (either case),
/// and the base64 characters its bytes alone decide at each of the three
/// alignments it can have inside a longer encoded string ("user:" + secret
/// in basic credentials is one).
fn forms(secret: &str) -> Vec<String> {
    const WINDOW: usize = 12;
    let b = secret.as_bytes();
    let mut v: Vec<String> = b
        .windows(WINDOW)
        .map(|w| String::from_utf8(w.to_vec()).unwrap())
        .collect();
    let hex: String = b.iter().map(|c| format!("{c:02x}")).collect();
    v.push(hex.to_uppercase());
    v.push(hex);
    for k in 0..3 {
        let mut padded = vec![0u8; k];
        padded.extend_from_slice(b);
        let enc = base64(&padded);
        // Whole groups of 3 bytes that are the secret's alone.
        let (from, to) = (k.div_ceil(3) * 4, (k + b.len()) / 3 * 4);
        v.push(enc[from..to].to_owned());
    }
    v
}

/// Every (secret, form, output) found, with the text around it.
fn leaks(book: &Book, outputs: &[(&str, &[u8])]) -> Vec<String> {
    // Each form by its first 12 bytes: one pass over each output, a look-up
    // per position, whatever the number of secrets.
    const KEY: usize = 12;
    let mut by_key: std::collections::HashMap<&[u8], Vec<(&str, String)>> = Default::default();
    let all: Vec<(&str, String)> = book
        .0
        .iter()
        .flat_map(|(what, secret)| forms(secret).into_iter().map(move |f| (what.as_str(), f)))
        .collect();
    for (what, form) in &all {
        by_key
            .entry(&form.as_bytes()[..KEY])
            .or_default()
            .push((what, form.clone()));
    }
    let mut found = Vec::new();
    // Each secret once per output: the first copy found, with its context.
    let mut seen = std::collections::HashSet::new();
    for (name, bytes) in outputs {
        for (at, w) in bytes.windows(KEY).enumerate() {
            for (what, form) in by_key.get(w).into_iter().flatten() {
                if bytes[at..].starts_with(form.as_bytes()) && seen.insert((*what, *name)) {
                    let from = at.saturating_sub(120);
                    let to = (at + form.len() + 120).min(bytes.len());
                    found.push(format!(
                        "{what} ({form}) in {name}: ...{}...",
                        String::from_utf8_lossy(&bytes[from..to])
                    ));
                }
            }
        }
    }
    found
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let d = std::env::temp_dir().join(format!("observer-secrets-{}", std::process::id()));
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

/// `observer run`, its stdout and stderr going to files (every byte kept,
/// the lines before `ready` included); killed on drop.
struct Observer(Child);

impl Observer {
    fn start(dir: &Path, otlp_port: u16, prom_port: u16) -> Observer {
        let child = Command::new(observer_bin())
            .args(["run", "--json", "--print", "--pools"])
            .args(["--tls-plaintext-probes", "all", "--dns-wire", "on"])
            .args(["--prometheus-listen", &format!("127.0.0.1:{prom_port}")])
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{otlp_port}"),
            )
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
            .env("RUST_LOG", "trace")
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .unwrap();
        let o = Observer(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
            if log.lines().any(|l| l.starts_with("ready")) {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "observer run never became ready; stderr: {log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM; it must exit cleanly (its exporters flushed).
    fn stop(mut self) {
        // Let the last events reach the ring buffer's reader.
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let status = self.0.wait().unwrap();
        assert!(status.success(), "observer run exited {status}");
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// helpers/secret_server.py answering with `s`, over TLS with `cert`.
fn secret_server(cert: Option<&Cert>, s: &ServerSecrets) -> HelperServer {
    let mut cmd = Command::new("python3");
    cmd.arg(helper("secret_server.py"))
        .args(["--reply", &s.reply])
        .args(["--set-cookie", &s.set_cookie]);
    if let Some(c) = cert {
        cmd.arg("--cert").arg(c.cert()).arg("--key").arg(c.key());
    }
    HelperServer::spawn(&mut cmd)
}

/// `go build` of helpers/gotls into `dir` (the standard library only).
fn build_gotls(dir: &Path) -> PathBuf {
    let bin = dir.join("gotls");
    let out = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(helper("gotls/main.go"))
        .env("GO111MODULE", "off")
        .env("GOENV", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build gotls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
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

/// A client that ran: its pid, and the path its requests must be recorded
/// with (without the query it sent).
struct Ran {
    name: &'static str,
    pid: u32,
    path: &'static str,
}

/// Runs a client to its end; it must succeed and its answer must carry
/// `reply` (a JSON line's `"replied": true`, or the text itself).
fn run(name: &'static str, path: &'static str, reply: &str, cmd: &mut Command) -> Ran {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &Value| v.get("replied").is_some())
        .collect();
    if lines.is_empty() {
        assert!(stdout.contains(reply), "{name}: no reply in {stdout}");
    } else {
        assert!(
            lines.iter().all(|l| l["replied"] == true),
            "{name}: {lines:?}"
        );
    }
    Ran { name, pid, path }
}

fn curl_args(s: &ClientSecrets) -> Vec<String> {
    ["-sS", "--fail", "--max-time", "20"]
        .iter()
        .map(ToString::to_string)
        .chain([
            "-H".into(),
            format!("Cookie: session={}", s.cookie),
            "-H".into(),
            "Content-Type: application/json".into(),
        ])
        .collect()
}

#[test]
fn no_secret_in_records_spans_metrics_or_logs() {
    let Some(_serial) = begin(
        "no_secret_in_records_spans_metrics_or_logs",
        &["curl", "wget", "node", "nginx", "go", "openssl"],
    ) else {
        return;
    };
    let t0 = Instant::now();
    let (Some(sdk_py), Some(openai_py), Some(h2_py)) = (
        llm_sdk_python("secrets"),
        openai_python("secrets"),
        h2_python("secrets"),
    ) else {
        return;
    };
    let dir = Scratch::new();
    let gotls = build_gotls(&dir.0);
    let (rustls_client, rustls_server) = (pair_bin("rustls_client"), pair_bin("rustls_server"));
    let mut book = Book::default();

    let (rec, otlp_port) = otlp::http_receiver();
    let prom_port = free_port();
    let observer = Observer::start(&dir.0, otlp_port, prom_port);

    // The servers, each answering with secrets of its own.
    let cert = Cert::new();
    let plain_s = book.server("python server (http)");
    let plain = secret_server(None, &plain_s);
    let tls_s = book.server("python server (https)");
    let tls = secret_server(Some(&cert), &tls_s);
    let backend_s = book.server("nginx's backend");
    let backend = secret_server(None, &backend_s);
    let (h2_port, h2c_port) = (free_port(), free_port());
    let nginx = nginx_h2(&cert, h2_port, h2c_port, backend.port);
    let go_s = book.server("Go server");
    let go_port = free_port();
    let go_server = HelperServer::spawn(
        Command::new(&gotls)
            .arg("server")
            .args(["-port", &go_port.to_string()])
            .arg("-cert")
            .arg(cert.cert())
            .arg("-key")
            .arg(cert.key())
            .args(["-reply", &go_s.reply])
            .args(["-set-cookie", &format!("sid={}", go_s.set_cookie)]),
    );
    let rustls_s = book.server("rustls server");
    let rustls = HelperServer::spawn(
        Command::new(&rustls_server)
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key())
            .args(["--port", "0"])
            .args(["--reply", &rustls_s.reply])
            .args(["--set-cookie", &format!("sid={}", rustls_s.set_cookie)]),
    );
    let grpc_s = book.server("grpcio server");
    let grpc = HelperServer::spawn(Command::new(&h2_py).arg(helper("secret_grpc.py")).args([
        "server",
        &grpc_s.reply,
        &grpc_s.set_cookie,
    ]));

    let chat = "/v1/chat/completions";
    let https = format!("https://127.0.0.1:{}", tls.port);
    let mut ran = Vec::new();

    // curl over plain HTTP/1.1: bearer, cookie, X-Api-Key, query, prompt.
    let s = book.client("curl http");
    ran.push(run(
        "curl http",
        chat,
        &plain_s.reply,
        Command::new("curl")
            .args(curl_args(&s))
            .args(["-H", &format!("Authorization: Bearer {}", s.bearer)])
            .args(["-H", &format!("X-Api-Key: {}", s.api_key)])
            .args(["--data", &s.chat_body("curl-model")])
            .arg(format!(
                "http://127.0.0.1:{}{chat}?api_key={}",
                plain.port, s.query
            )),
    ));
    // curl over HTTPS (OpenSSL), HTTP/1.1: basic credentials, api-key.
    let s = book.client("curl https");
    ran.push(run(
        "curl https",
        chat,
        &tls_s.reply,
        Command::new("curl")
            .args(curl_args(&s))
            .args(["-k", "--http1.1", "-u", &format!("user:{}", s.bearer)])
            .args(["-H", &format!("api-key: {}", s.api_key)])
            .args(["--data", &s.chat_body("curl-model")])
            .arg(format!("{https}{chat}?key={}", s.query)),
    ));
    // curl over h2 (nghttp2) through nginx: a Gemini call, x-goog-api-key.
    let s = book.client("curl h2");
    ran.push(run(
        "curl h2",
        "/v1beta/models/gemini-pro:generateContent",
        &backend_s.reply,
        Command::new("curl")
            .args(curl_args(&s))
            .args(["-k", "--http2"])
            .args(["-H", &format!("Authorization: Bearer {}", s.bearer)])
            .args(["-H", &format!("x-goog-api-key: {}", s.api_key)])
            .args([
                "--data",
                &format!(
                    r#"{{"contents":[{{"role":"user","parts":[{{"text":"{}"}}]}}]}}"#,
                    s.prompt
                ),
            ])
            .arg(format!(
                "https://127.0.0.1:{h2_port}/v1beta/models/gemini-pro:generateContent?key={}",
                s.query
            )),
    ));
    // wget (GnuTLS).
    let s = book.client("wget");
    ran.push(run(
        "wget",
        chat,
        &tls_s.reply,
        Command::new("wget")
            .args(["-q", "-O", "-", "--no-check-certificate", "--tries=1"])
            .arg(format!("--header=Authorization: Bearer {}", s.bearer))
            .arg(format!("--header=Cookie: session={}", s.cookie))
            .arg(format!("--header=X-Api-Key: {}", s.api_key))
            .arg("--header=Content-Type: application/json")
            .arg(format!("--post-data={}", s.chat_body("wget-model")))
            .arg(format!("{https}{chat}?api_key={}", s.query)),
    ));
    // Python: the standard library, the official SDKs, httpx over h2.
    let python = |py: &Path, mode: &str, base: &str, s: &ClientSecrets, reply: &str| {
        let mut cmd = Command::new(py);
        cmd.arg(helper("secret_clients.py"))
            .arg(mode)
            .args(["--base", base])
            .args(["--bearer", &s.bearer, "--cookie", &s.cookie])
            .args(["--api-key", &s.api_key, "--query", &s.query])
            .args(["--prompt", &s.prompt, "--reply", reply]);
        cmd
    };
    let h2_base = format!("https://127.0.0.1:{h2_port}");
    let s = book.client("python urllib");
    ran.push(run(
        "python urllib",
        chat,
        &tls_s.reply,
        &mut python(Path::new("python3"), "stdlib", &https, &s, &tls_s.reply),
    ));
    let s = book.client("openai SDK");
    ran.push(run(
        "openai SDK",
        chat,
        &tls_s.reply,
        &mut python(&sdk_py, "openai", &https, &s, &tls_s.reply),
    ));
    let s = book.client("anthropic SDK");
    ran.push(run(
        "anthropic SDK",
        "/v1/messages",
        &tls_s.reply,
        &mut python(&sdk_py, "anthropic", &https, &s, &tls_s.reply),
    ));
    let s = book.client("openai SDK h2");
    ran.push(run(
        "openai SDK h2",
        chat,
        &backend_s.reply,
        python(&openai_py, "openai", &h2_base, &s, &backend_s.reply).arg("--http2"),
    ));
    let s = book.client("httpx h2");
    ran.push(run(
        "httpx h2",
        chat,
        &backend_s.reply,
        python(&h2_py, "httpx", &h2_base, &s, &backend_s.reply).arg("--http2"),
    ));
    // Node.js: fetch (its own OpenSSL) and http2 over cleartext h2.
    let node = |mode: &str, base: &str, s: &ClientSecrets, reply: &str| {
        let mut cmd = Command::new("node");
        cmd.arg(helper("secret_clients.js"))
            .args([mode, base, &s.bearer, &s.cookie, &s.api_key, &s.query])
            .args([&s.prompt, reply])
            .env("NODE_TLS_REJECT_UNAUTHORIZED", "0");
        cmd
    };
    let s = book.client("node fetch");
    ran.push(run(
        "node fetch",
        chat,
        &tls_s.reply,
        &mut node("fetch", &https, &s, &tls_s.reply),
    ));
    let s = book.client("node http2");
    ran.push(run(
        "node http2",
        chat,
        &backend_s.reply,
        &mut node(
            "h2",
            &format!("http://127.0.0.1:{h2c_port}"),
            &s,
            &backend_s.reply,
        ),
    ));
    // Go's crypto/tls: h2 to the Go server, HTTP/1.1 to Python's.
    let go = |url: &str, connect: u16, s: &ClientSecrets, reply: &str| {
        let mut cmd = Command::new(&gotls);
        cmd.arg("client")
            .args(["-url", url, "-connect", &format!("127.0.0.1:{connect}")])
            .args(["-path", &format!("{chat}?api_key={}", s.query)])
            .args([
                "-post-json",
                &s.chat_body("go-model").replace("true", "false"),
            ])
            .args(["-header", &format!("Authorization: Bearer {}", s.bearer)])
            .args(["-header", &format!("Cookie: session={}", s.cookie)])
            .args(["-header", &format!("X-Api-Key: {}", s.api_key)])
            .args(["-expect", reply]);
        cmd
    };
    let s = book.client("Go h2");
    ran.push(run(
        "Go h2",
        chat,
        &go_s.reply,
        &mut go(
            &format!("https://localhost:{go_port}"),
            go_port,
            &s,
            &go_s.reply,
        ),
    ));
    let s = book.client("Go http/1.1");
    ran.push(run(
        "Go http/1.1",
        chat,
        &tls_s.reply,
        go(&https, tls.port, &s, &tls_s.reply).arg("-h1"),
    ));
    // rustls (reqwest) to the rustls server, HTTP/1.1 and h2.
    for (name, version) in [("rustls http/1.1", "--http1"), ("rustls h2", "--http2")] {
        let s = book.client(name);
        ran.push(run(
            name,
            chat,
            &rustls_s.reply,
            Command::new(&rustls_client)
                .args(["--url", &format!("https://tls.test:{}", rustls.port)])
                .args(["--resolve", "tls.test=127.0.0.1", version])
                .arg("--ca")
                .arg(cert.cert())
                .args(["--path", &format!("{chat}?api_key={}", s.query)])
                .args([
                    "--body",
                    &s.chat_body("rustls-model").replace("true", "false"),
                ])
                .args(["--header", &format!("authorization: Bearer {}", s.bearer)])
                .args(["--header", &format!("cookie: session={}", s.cookie)])
                .args(["--header", &format!("x-api-key: {}", s.api_key)])
                .args(["--expect", &rustls_s.reply]),
        ));
    }
    // grpcio: metadata and the message (a gRPC call has no query string).
    let s = book.client("grpcio");
    ran.push(run(
        "grpcio",
        "/observer.test.Secrets/Echo",
        &grpc_s.reply,
        Command::new(&h2_py)
            .arg(helper("secret_grpc.py"))
            .args(["client", &grpc.port.to_string()])
            .args([&s.bearer, &s.cookie, &s.api_key, &s.prompt, &grpc_s.reply]),
    ));

    // The endpoint, scraped as Prometheus would, then the observer stopped.
    std::thread::sleep(Duration::from_millis(700));
    let prom_addr = std::net::SocketAddr::from(([127, 0, 0, 1], prom_port));
    let (status, head, metrics) = http_request(prom_addr, "GET", "/metrics").unwrap();
    assert_eq!(status, 200, "{head}");
    let scraped = format!("{head}\r\n\r\n{metrics}");
    observer.stop();
    let stdout = std::fs::read(dir.0.join("stdout")).unwrap();
    let stderr = std::fs::read(dir.0.join("stderr")).unwrap();
    let raw = rec.raw.lock().unwrap().clone();
    let decoded = format!(
        "{:?}\n{:?}",
        rec.traces.lock().unwrap(),
        rec.metrics.lock().unwrap()
    );

    // The traffic was seen: without that, finding nothing proves nothing.
    let records: Vec<Value> = String::from_utf8_lossy(&stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect();
    let requests: Vec<&Value> = records.iter().filter(|r| r["kind"] == "request").collect();
    for c in &ran {
        let mine: Vec<&&Value> = requests
            .iter()
            .filter(|r| r["pid"] == c.pid && r["direction"] == "outbound")
            .collect();
        assert!(
            mine.iter().any(|r| r["path"] == c.path),
            "{} (pid {}): no request record with path {}; its records: {mine:#?}",
            c.name,
            c.pid,
            c.path
        );
    }
    for (name, pid) in [
        ("python server (http)", plain.pid()),
        ("python server (https)", tls.pid()),
        ("nginx's backend", backend.pid()),
        ("Go server", go_server.pid()),
        ("rustls server", rustls.pid()),
        ("grpcio server", grpc.pid()),
    ] {
        assert!(
            requests
                .iter()
                .any(|r| r["pid"] == pid && r["direction"] == "inbound"),
            "{name} (pid {pid}): no inbound request record"
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| r["comm"] == "nginx" && r["protocol"] == "h2" && r["direction"] == "inbound"),
        "nginx: no inbound h2 request record"
    );
    for (name, provider) in [("openai SDK", "openai"), ("anthropic SDK", "anthropic")] {
        let pid = ran.iter().find(|c| c.name == name).unwrap().pid;
        assert!(
            requests
                .iter()
                .any(|r| r["pid"] == pid && r["gen_ai"]["provider"] == provider),
            "{name}: no {provider} gen_ai record"
        );
    }
    let spans = otlp::all_spans(&rec);
    assert!(spans.len() >= ran.len(), "{} spans", spans.len());
    assert!(!rec.metrics.lock().unwrap().is_empty(), "no OTLP metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with("observer_")),
        "{metrics}"
    );
    // What the request bodies told the observer did reach every output:
    // the model named beside the prompt, the route beside the query.
    for (name, bytes) in [
        ("records", &stdout[..]),
        ("OTLP", &raw[..]),
        ("Prometheus", scraped.as_bytes()),
    ] {
        let text = String::from_utf8_lossy(bytes);
        assert!(text.contains("/v1/chat/completions"), "{name}: no route");
        if name != "Prometheus" {
            assert!(text.contains("openai-model"), "{name}: no model");
        }
    }
    assert!(
        String::from_utf8_lossy(&stderr).contains("DEBUG"),
        "the log is not at its most verbose"
    );

    let found = leaks(
        &book,
        &[
            ("watch --json records (stdout)", &stdout),
            ("the log (stderr)", &stderr),
            ("OTLP as received (raw protobuf)", &raw),
            ("OTLP decoded", decoded.as_bytes()),
            ("the Prometheus endpoint", scraped.as_bytes()),
        ],
    );
    eprintln!(
        "{} secrets from {} clients and 6 servers searched in {} B of records, {} B of log, \
         {} B of OTLP, {} B of metrics; {:.1} s",
        book.0.len(),
        ran.len(),
        stdout.len(),
        stderr.len(),
        raw.len(),
        scraped.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        found.is_empty(),
        "secrets left the host:\n{}",
        found.join("\n")
    );
    drop((nginx, backend, plain, tls, go_server, rustls, grpc));
}

/// The search itself: each form a copy of a secret can take is found, and
/// a string without one is clean.
#[test]
fn the_search_finds_every_form_of_a_secret() {
    let mut book = Book::default();
    let s = book.new_secret("t".into());
    let basic = base64(format!("user:{s}").as_bytes());
    assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
    assert_eq!(base64(b"ab"), "YWI=");
    let hex: String = s.bytes().map(|c| format!("{c:02X}")).collect();
    for (i, out) in [
        format!("path=/x?key={s}&y=1"),
        format!("truncated: {}", &s[..14]),
        format!("truncated: {}", &s[10..]),
        format!("Authorization: Basic {basic}"),
        base64(format!("a{s}").as_bytes()),
        base64(format!("ab{s}").as_bytes()),
        base64(s.as_bytes()),
        format!("bytes: {hex}"),
        format!("bytes: {}", hex.to_lowercase()),
    ]
    .iter()
    .enumerate()
    {
        assert!(
            !leaks(&book, &[("out", out.as_bytes())]).is_empty(),
            "{i}: {out}"
        );
    }
    let clean = format!("{} {}", &s[..11], &s[13..]);
    assert!(leaks(&book, &[("out", clean.as_bytes())]).is_empty());
}
