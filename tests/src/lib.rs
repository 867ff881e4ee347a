//! Helpers for the end-to-end tests: find the observer binary, run `observer
//! watch --json` around some traffic, and read its records.
//!
//! These tests need root (they load eBPF). Without root they say so and return;
//! under CI (`CI=true`) a missing privilege or tool is a failure instead.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is a test failure"
)]

mod dns_ns;
pub mod otlp;
pub mod programs;
pub mod tmux;
pub use dns_ns::{Asked, DnsNs};

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use serde_json::Value;

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// True when the test can run, and then this test binary holds the machine's
/// end-to-end lock (see `machine_lock`): every test that loads eBPF comes
/// here. Without root it prints why and returns false, except under CI where
/// that is a failure.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        machine_lock();
        return true;
    }
    assert!(
        !in_ci(),
        "{test}: needs root (CI=true, so this is a failure)"
    );
    eprintln!("SKIPPED {test}: needs root to load eBPF programs");
    false
}

/// True when `cmd` is on PATH; under CI its absence is a failure.
pub fn require_tool(test: &str, cmd: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !in_ci(),
            "{test}: needs `{cmd}` (CI=true, so this is a failure)"
        );
        eprintln!("SKIPPED {test}: needs `{cmd}`");
    }
    ok
}

/// The observer binary: $OBSERVER_BIN (set by `cargo xtask test`) or the
/// release build in this workspace.
pub fn observer_bin() -> PathBuf {
    let p = std::env::var_os("OBSERVER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/observer"),
        PathBuf::from,
    );
    assert!(
        p.exists(),
        "observer binary {} not found: run `cargo xtask test` (it builds it)",
        p.display()
    );
    p
}

/// The test build of the NVML library (the same FFI path as the real one):
/// $NVML_STUB (set by `cargo xtask test`), else the release build's.
pub fn nvml_stub() -> PathBuf {
    let p = std::env::var_os("NVML_STUB").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libnvml_stub.so"),
        PathBuf::from,
    );
    assert!(
        p.exists(),
        "{} missing: `cargo build --release -p nvml-stub` (cargo xtask test does)",
        p.display()
    );
    p
}

/// A helper script shipped in tests/helpers.
pub fn helper(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("helpers")
        .join(name)
}

/// The official `openai` Python SDK, as the tests install it from PyPI.
pub const OPENAI_SDK: &str = "openai==3.57.0";

/// A python with the official `openai` SDK (and `h2`, for its HTTP/2
/// transport): a virtual environment the tests make once, under target/
/// (`python3 -m venv`, then pip from PyPI). None when it cannot be made here
/// (said why); under CI that is a failure.
pub fn openai_python(test: &str) -> Option<PathBuf> {
    python_with(
        test,
        "openai",
        &[OPENAI_SDK, "h2==4.4.1"],
        "import openai, h2",
    )
}

/// The official `anthropic` Python SDK, as the tests install it from PyPI.
pub const ANTHROPIC_SDK: &str = "anthropic==2.16.0";

/// A python with the official `openai` and `anthropic` SDKs (and the HTTP
/// client both bring), as [`openai_python`] makes its own.
pub fn llm_sdk_python(test: &str) -> Option<PathBuf> {
    python_with(
        test,
        "llm-sdks",
        &[OPENAI_SDK, ANTHROPIC_SDK],
        "import openai, anthropic",
    )
}

/// grpcio and httpx with HTTP/2, as the tests install them from PyPI.
pub const H2_PACKAGES: [&str; 2] = ["grpcio==1.85.3", "httpx[http2]==0.28.1"];

/// A python with [`H2_PACKAGES`], as [`openai_python`] makes its own.
pub fn h2_python(test: &str) -> Option<PathBuf> {
    python_with(test, "h2", &H2_PACKAGES, "import grpc, httpx, h2")
}

/// The OpenTelemetry Python SDK (its API beside it, pinned to the same
/// release) and httpx with HTTP/2, as the tests install them from PyPI.
pub const OTEL_SDK_PACKAGES: [&str; 3] = [
    "opentelemetry-api==1.45.2",
    "opentelemetry-sdk==1.45.2",
    "httpx[http2]==0.28.1",
];

/// A python with [`OTEL_SDK_PACKAGES`] (an application that propagates W3C
/// trace context, and the h2 package for a server of the tests' own), as
/// [`openai_python`] makes its own.
pub fn otel_sdk_python(test: &str) -> Option<PathBuf> {
    python_with(
        test,
        "otel-sdk",
        &OTEL_SDK_PACKAGES,
        "import opentelemetry.sdk.trace, opentelemetry.propagate, httpx, h2",
    )
}

/// kubernetes-validate (the Kubernetes JSON schemas, 1.25 to 1.37, bundled)
/// and the libraries it validates with, as the tests install them from PyPI.
pub const KUBERNETES_VALIDATE_PACKAGES: [&str; 4] = [
    "kubernetes-validate==1.37.0",
    "jsonschema==4.26.0",
    "referencing==0.37.0",
    "PyYAML==6.0.4",
];

/// A python with [`KUBERNETES_VALIDATE_PACKAGES`] (`python -m
/// kubernetes_validate`), as [`openai_python`] makes its own.
pub fn kubernetes_validate_python(test: &str) -> Option<PathBuf> {
    python_with(
        test,
        "kubernetes-validate",
        &KUBERNETES_VALIDATE_PACKAGES,
        "import kubernetes_validate",
    )
}

/// A virtual environment `target/test-venv-{name}` with `packages`, made
/// once; `check` is the Python that proves them importable.
fn python_with(test: &str, name: &str, packages: &[&str], check: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../target/test-venv-{name}"));
    let python = dir.join("bin/python");
    let ready = || {
        Command::new(&python)
            .args(["-c", check])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Some(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(dir.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages)
            .status()
            .is_ok_and(|s| s.success());
    if made && ready() {
        return Some(python);
    }
    let why = format!(
        "{test}: could not install {} into {} (python3 -m venv needs Debian's python3-venv; pip needs PyPI)",
        packages.join(" "),
        dir.display()
    );
    assert!(!in_ci(), "{why} (CI=true, so this is a failure)");
    eprintln!("SKIPPED {why}");
    None
}

/// What a finished `observer watch` printed.
#[derive(Debug)]
pub struct Watched {
    /// Connection and DNS records.
    pub records: Vec<Value>,
    /// `"kind": "request"` records (HTTP requests), apart: the connection
    /// tests look at connections.
    pub requests: Vec<Value>,
    pub stderr: Vec<String>,
    pub status: ExitStatus,
}

/// The JSON summary among the lines an observer printed on stderr.
pub fn summary_of(stderr: &[String]) -> Value {
    let line = stderr
        .iter()
        .find_map(|l| l.strip_prefix("summary "))
        .unwrap_or_else(|| panic!("no summary line in {stderr:?}"));
    serde_json::from_str(line).unwrap()
}

impl Watched {
    pub fn summary(&self) -> Value {
        summary_of(&self.stderr)
    }

    /// The one request record of an LLM call for `model` seen from
    /// `direction` ("outbound": the client's, "inbound": the server's).
    pub fn request_of_model(&self, model: &str, direction: &str) -> &Value {
        let v: Vec<&Value> = self
            .requests
            .iter()
            .filter(|r| r["direction"] == direction && r["gen_ai"]["request_model"] == model)
            .collect();
        assert_eq!(v.len(), 1, "{model} {direction}: {:#?}", self.requests);
        v[0]
    }

    /// The request records of the connection from client port `client_port`,
    /// seen from `direction` ("outbound": the client's, "inbound": the
    /// server's), in the order they started.
    pub fn requests_on(&self, client_port: &Value, direction: &str) -> Vec<&Value> {
        let port_field = if direction == "outbound" {
            "local_port"
        } else {
            "remote_port"
        };
        let mut v: Vec<&Value> = self
            .requests
            .iter()
            .filter(|r| r["direction"] == direction && &r[port_field] == client_port)
            .collect();
        v.sort_by_key(|r| r["start_unix_ns"].as_u64());
        v
    }

    /// Records whose `field` equals `value`.
    pub fn with<'a>(&'a self, field: &str, value: &Value) -> Vec<&'a Value> {
        self.records.iter().filter(|r| &r[field] == value).collect()
    }
}

/// A running `observer watch --json`.
pub struct Watch {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Watch {
    /// Starts `observer watch --json ARGS` and waits for its `ready` line.
    pub fn start(args: &[&str]) -> Watch {
        Self::start_with_env(args, &[])
    }

    /// The same with environment variables set.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Watch {
        let mut cmd = Command::new(observer_bin());
        cmd.arg("watch")
            .arg("--json")
            .args(args)
            .envs(env.iter().copied());
        Self::spawn(cmd)
    }

    /// Any command that ends in `observer watch --json ...` (under setpriv,
    /// in a container): spawned, and waited for until its `ready` line
    /// (60 s: a container starts in its own time).
    pub fn spawn(mut cmd: Command) -> Watch {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        let mut w = Watch {
            child,
            stdout,
            stderr,
            stderr_seen: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match w.stderr.recv_timeout(left) {
                Ok(line) => {
                    let ready = line.starts_with("ready");
                    w.stderr_seen.push(line);
                    if ready {
                        return w;
                    }
                }
                Err(_) => {
                    let _ = w.child.kill();
                    panic!("observer never became ready; stderr: {:?}", w.stderr_seen);
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed on stderr up to `ready` (and since, as far as
    /// `wait_for_stderr` read).
    pub fn stderr_seen(&self) -> &[String] {
        &self.stderr_seen
    }

    /// Reads its stderr until a line contains `text` (true), or `timeout`.
    pub fn wait_for_stderr(&mut self, text: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.stderr_seen.push(line);
                    if found {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    /// Sends `signal` (SIGTERM or SIGINT) and collects everything it printed.
    pub fn stop_with(self, signal: i32) -> Watched {
        // Let the last events of the traffic reach the ring buffer's reader.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.finish()
    }

    pub fn stop(self) -> Watched {
        self.stop_with(libc::SIGTERM)
    }

    /// `kill -9`: no clean-up of its own; what it printed is dropped (a
    /// line may be cut short).
    pub fn kill(mut self) -> ExitStatus {
        self.child.kill().unwrap();
        self.child.wait().unwrap()
    }

    /// Waits for the process to exit by itself (e.g. `--duration`).
    pub fn finish(mut self) -> Watched {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("observer did not exit; stderr: {:?}", self.stderr_seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (requests, records): (Vec<Value>, Vec<Value>) = self
            .stdout
            .iter()
            .map(|l| {
                serde_json::from_str::<Value>(&l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}"))
            })
            .partition(|r| r["kind"] == "request");
        for r in records.iter().chain(&requests) {
            assert_record_fits_schema(r);
        }
        let mut stderr = std::mem::take(&mut self.stderr_seen);
        stderr.extend(self.stderr.iter());
        assert!(
            status.success(),
            "observer failed: {status}; stderr: {stderr:?}"
        );
        Watched {
            records,
            requests,
            stderr,
            status,
        }
    }
}

/// Asserts that `record` (a line of `watch --json`) is valid against
/// docs/records.schema.json, the schema generated from observer's types:
/// every test's records are checked, whatever the test itself looks at.
pub fn assert_record_fits_schema(record: &Value) {
    type ByKind = std::collections::HashMap<String, jsonschema::Validator>;
    static SCHEMA: std::sync::OnceLock<ByKind> = std::sync::OnceLock::new();
    let by_kind = SCHEMA.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/records.schema.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        // One validator per kind (its definition, found by its `kind`
        // constant): errors then name the fields, not "none of the kinds".
        let defs = schema["$defs"].as_object().expect("$defs");
        defs.iter()
            .filter_map(|(name, d)| Some((d["properties"]["kind"]["const"].as_str()?, name)))
            .map(|(kind, name)| {
                let one = serde_json::json!({
                    "$schema": schema["$schema"],
                    "$ref": format!("#/$defs/{name}"),
                    "$defs": schema["$defs"],
                });
                let v =
                    jsonschema::draft202012::new(&one).unwrap_or_else(|e| panic!("{name}: {e}"));
                (kind.to_owned(), v)
            })
            .collect()
    });
    let kind = record["kind"].as_str().unwrap_or_default();
    let Some(validator) = by_kind.get(kind) else {
        panic!("a record of a kind docs/records.schema.json does not have: {record}");
    };
    let errors: Vec<String> = validator
        .iter_errors(record)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "a {kind} record does not fit docs/records.schema.json: {errors:#?}\n{record:#}"
    );
}

impl Drop for Watch {
    fn drop(&mut self) {
        // A test that panicked mid-way must not leave an observer running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `observer run` (OTLP and Prometheus; nothing on stdout).
pub struct Daemon {
    child: Child,
    stderr: mpsc::Receiver<String>,
}

impl Daemon {
    /// Spawns `cmd` (an `observer run ...`) and waits for its `ready` line.
    pub fn start(cmd: Command) -> Daemon {
        Self::start_with_stdout(cmd, Stdio::null())
    }

    /// The same with its stdout (`--print` records) sent to `out`.
    pub fn start_with_stdout(mut cmd: Command, out: Stdio) -> Daemon {
        let mut child = cmd.stdout(out).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = lines(child.stderr.take().unwrap());
        let mut d = Daemon { child, stderr };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match d.stderr.recv_timeout(left) {
                Ok(line) if line.starts_with("ready") => return d,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = d.child.kill();
                    panic!("observer run never became ready; stderr: {seen:?}");
                }
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM; the observer must exit cleanly. Returns what it printed on
    /// stderr after `ready` (its warnings are echoed for a failing test).
    pub fn stop(mut self) -> Vec<String> {
        // Let the last events reach the ring buffer's reader.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let lines: Vec<String> = self.stderr.iter().collect();
        for l in lines.iter().filter(|l| l.contains("WARN")) {
            eprintln!("observer: {l}");
        }
        assert!(
            status.success(),
            "observer run exited {status}; stderr after ready: {lines:#?}"
        );
        lines
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test must not leave an observer running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a helper that prints one JSON object per line; its lines.
pub fn run_json_lines(cmd: &mut Command) -> Vec<Value> {
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed: {}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The observer's `observer_tables_entries` by table, read from its
/// `/metrics` on `prom` (fails when the gauge is missing).
pub fn observer_tables(prom: u16) -> std::collections::HashMap<String, u64> {
    let (_, _, body) = http_request(([127, 0, 0, 1], prom).into(), "GET", "/metrics").unwrap();
    let t: std::collections::HashMap<String, u64> = body
        .lines()
        .filter_map(|l| l.strip_prefix("observer_tables_entries{table=\""))
        .filter_map(|l| {
            let (name, v) = l.split_once("\"} ")?;
            Some((name.to_owned(), v.parse::<f64>().ok()? as u64))
        })
        .collect();
    assert!(
        t.contains_key("processes") && t.contains_key("cgroups"),
        "no observer_tables_entries:\n{body}"
    );
    t
}

/// A plain HTTP/1.1 exchange: (status, head, body), or why it failed.
pub fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<(u16, String, String), String> {
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read after {:?}: {e}", t0.elapsed()))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no complete head: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status: {head:?}"))?;
    Ok((status, head.to_owned(), body.to_owned()))
}

/// Milliseconds from nanoseconds, for messages.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Our times (ms) against a client's own clock around each of them: each of
/// ours at least `floor_ms` (the wait the test injected) and at most the
/// client's + `slack_ms` (the client's clock starts before and stops after
/// what we time, but for its rounding); the least disturbed within `tol_ms`
/// of the client's. One sample cannot be held within a tolerance: a client
/// scheduled late, or busy in its event loop, reads its clock late (a
/// Python's TLS first byte once 1.2 ms late, each of Node's three HTTP/2
/// streams 3.7-15 ms late, both in one CI run).
pub fn agree_with_clock(
    who: &str,
    ours: &[f64],
    own: &[f64],
    floor_ms: f64,
    slack_ms: f64,
    tol_ms: f64,
) {
    assert_eq!(
        ours.len(),
        own.len(),
        "{who}: ours {ours:?}, its own {own:?}"
    );
    assert!(!ours.is_empty(), "{who}: no times");
    for (i, (o, c)) in ours.iter().zip(own).enumerate() {
        eprintln!("{who} {i}: ours {o:.3} ms, its own {c:.3} ms");
        assert!(
            *o >= floor_ms && *o <= c + slack_ms,
            "{who} {i}: ours {o:.3} ms, the injected wait {floor_ms} ms, its own {c:.3} ms (+{slack_ms})"
        );
    }
    let gaps: Vec<f64> = ours.iter().zip(own).map(|(o, c)| o - c).collect();
    assert!(
        closest(&gaps) <= tol_ms,
        "{who}: ours - its own: {gaps:?} ms, none within {tol_ms} ms"
    );
}

/// The smallest magnitude of `gaps`: the least disturbed sample's.
pub fn closest(gaps: &[f64]) -> f64 {
    gaps.iter().map(|g| g.abs()).fold(f64::INFINITY, f64::min)
}

/// The name the kernel gives this process (what `comm` should say).
pub fn own_comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .unwrap()
        .trim()
        .to_owned()
}

/// The value of the Prometheus series `name` whose labels include all of
/// `labels`.
pub fn series(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A port nobody listens on (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A helper server process (tests/helpers) that prints "PORT <n>" once it
/// listens; killed on drop.
pub struct HelperServer {
    child: Child,
    pub port: u16,
}

impl HelperServer {
    pub fn spawn(cmd: &mut Command) -> HelperServer {
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("{cmd:?} said {line:?}"))
            .parse()
            .unwrap();
        HelperServer { child, port }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HelperServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx from Debian's packages, one worker, its files in `dir`, with
/// `servers` (server blocks) in its http block; up once `port` accepts.
/// Stopped when dropped (SIGTERM: the master stops its worker, which SIGKILL
/// would orphan).
pub struct Nginx(Child);

impl Nginx {
    pub fn start(dir: &Path, servers: &str, port: u16) -> Nginx {
        let conf = dir.join("nginx.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
                 events {{}}\nhttp {{\n access_log off;\n client_body_temp_path {d};\n proxy_temp_path {d};\n\
                 fastcgi_temp_path {d};\n uwsgi_temp_path {d};\n scgi_temp_path {d};\n{servers}}}\n"
            ),
        )
        .unwrap();
        let nginx = Nginx(
            Command::new("nginx")
                .arg("-c")
                .arg(&conf)
                .arg("-p")
                .arg(dir)
                .spawn()
                .unwrap(),
        );
        let up = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "nginx did not start");
        nginx
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// A self-signed P-256 certificate for tls.test and 127.0.0.1.
pub struct Cert {
    pub dir: PathBuf,
}

impl Cert {
    pub fn new() -> Cert {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "observer-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=tls.test"])
            .args(["-addext", "subjectAltName=DNS:tls.test,IP:127.0.0.1"])
            // A leaf, not a CA: rustls refuses a CA certificate as a server's own.
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .arg("-keyout")
            .arg(dir.join("key.pem"))
            .arg("-out")
            .arg(dir.join("cert.pem"))
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(ok.success(), "openssl req failed");
        Cert { dir }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
}

impl Default for Cert {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// helpers/tls_server.py; killed on drop.
pub fn tls_server(cert: &Cert, mode: &str, hs_ms: u32, answer_ms: u32) -> HelperServer {
    HelperServer::spawn(
        Command::new("python3")
            .arg(helper("tls_server.py"))
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key())
            .args(["--mode", mode])
            .args(["--handshake-delay-ms", &hs_ms.to_string()])
            .args(["--answer-delay-ms", &answer_ms.to_string()]),
    )
}

/// nginx with h2 over TLS on `port` and cleartext h2 (prior knowledge) on
/// `plain`, proxying to `backend`.
pub fn nginx_h2(cert: &Cert, port: u16, plain: u16, backend: u16) -> Nginx {
    let d = cert.dir.display();
    Nginx::start(
        &cert.dir,
        &format!(
            " server {{\n  listen 127.0.0.1:{port} ssl http2;\n  listen 127.0.0.1:{plain} http2;\n\
             ssl_certificate {d}/cert.pem;\n  ssl_certificate_key {d}/key.pem;\n\
             location / {{ proxy_pass http://127.0.0.1:{backend}; }}\n }}\n"
        ),
        port,
    )
}

/// helpers/llm_server.py (an OpenAI-compatible server; HTTPS with a
/// certificate, plain HTTP without) with its injected waits; killed on drop.
pub fn llm_server(cert: Option<&Cert>, first_ms: f64, gap_ms: f64, chunks: u64) -> HelperServer {
    llm_server_on(0, cert, first_ms, gap_ms, chunks)
}

/// helpers/llm_server.py on `port` (0: any).
pub fn llm_server_on(
    port: u16,
    cert: Option<&Cert>,
    first_ms: f64,
    gap_ms: f64,
    chunks: u64,
) -> HelperServer {
    let mut cmd = Command::new("python3");
    cmd.arg(helper("llm_server.py"))
        .args(["--port", &port.to_string()]);
    if let Some(cert) = cert {
        cmd.arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key());
    }
    HelperServer::spawn(
        cmd.args(["--first-ms", &first_ms.to_string()])
            .args(["--gap-ms", &gap_ms.to_string()])
            .args(["--chunks", &chunks.to_string()]),
    )
}

/// helpers/llm_client.py: one line per request, its own times.
pub fn llm_client(port: u16, settle_ms: u32, args: &[&str]) -> Vec<Value> {
    run_json_lines(
        Command::new("python3")
            .arg(helper("llm_client.py"))
            .args(["--port", &port.to_string()])
            .args(["--settle-ms", &settle_ms.to_string()])
            .args(args),
    )
}

/// A test's start: its privileges and tools (see `require_root` and
/// `require_tool`), then the lock that runs observers one at a time within a
/// test binary: an observer that starts or stops attaches or closes its
/// all-process uprobes, each close holding the kernel's trace-event lock for
/// ~110 ms, which would delay the per-process probes of an observer beside it.
/// None: the test cannot run here (and said why).
pub fn begin(test: &str, tools: &[&str]) -> Option<std::sync::MutexGuard<'static, ()>> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !require_root(test) || !tools.iter().all(|t| require_tool(test, t)) {
        return None;
    }
    Some(
        LOCK.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// One end-to-end test binary at a time on the machine, whichever checkout
/// it comes from: observers see each other's traffic, the detach test counts
/// the machine's loaded programs, and the DNS tests' network namespace has
/// one name. cargo runs a workspace's test binaries one after another; this
/// covers two `cargo test` runs side by side. Taken by the first test that
/// needs root, held until the test binary exits.
fn machine_lock() {
    use std::os::fd::AsRawFd as _;
    static HELD: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    HELD.get_or_init(|| {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/tmp/observer-e2e-tests.lock")
            .ok()?;
        // SAFETY: flock on a descriptor this File owns.
        let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0;
        locked.then_some(f)
    });
}

#[cfg(test)]
mod agree_with_clock_tests {
    use super::agree_with_clock;

    #[test]
    fn one_close_sample_is_enough() {
        agree_with_clock("t", &[200.5, 201.0], &[200.6, 205.0], 200.0, 0.1, 1.0);
    }

    #[test]
    #[should_panic(expected = "none within")]
    fn every_sample_off_fails() {
        agree_with_clock("t", &[200.5, 201.0], &[202.0, 205.0], 200.0, 0.1, 1.0);
    }

    #[test]
    #[should_panic(expected = "the injected wait")]
    fn ours_past_the_clients_clock_fails() {
        agree_with_clock("t", &[200.5, 203.0], &[200.6, 202.0], 200.0, 0.1, 1.0);
    }

    #[test]
    #[should_panic(expected = "the injected wait")]
    fn ours_under_the_injected_wait_fails() {
        agree_with_clock("t", &[199.5], &[199.6], 200.0, 0.1, 1.0);
    }

    #[test]
    #[should_panic(expected = "no times")]
    fn no_samples_fail() {
        agree_with_clock("t", &[], &[], 200.0, 0.1, 1.0);
    }
}

#[cfg(test)]
mod schema_tests {
    use super::{assert_record_fits_schema, Value};

    /// A pool record as `watch --pools` prints it, with `change` applied.
    fn pool_record(change: impl FnOnce(&mut Value)) -> Value {
        let mut r = serde_json::json!({
            "kind": "pool", "time_unix_ns": 2, "pid": 7, "comm": "curl",
            "exe": "/usr/bin/curl", "container": null, "peer_addr": "127.0.0.1",
            "peer_port": 80, "server_name": null, "open": 1, "busy": 0, "idle": 1,
            "requests": 3, "new_connections": 1, "new_connection_share": 0.33,
            "closed": {"client": 0, "server": 0, "reset": 0, "goaway": 0},
            "requests_per_connection": null, "age_at_close_ns": null,
            "since_unix_ns": 1
        });
        change(&mut r);
        r
    }

    #[test]
    fn the_schema_takes_a_record_as_printed_and_refuses_any_other() {
        let ok = pool_record(|_| {});
        if let Err(why) = std::panic::catch_unwind(|| assert_record_fits_schema(&ok)) {
            panic!("{why:?}: the pool fields changed? {}", ok);
        }
        for bad in [
            pool_record(|r| r["extra"] = 1.into()),
            pool_record(|r| r["open"] = "one".into()),
            pool_record(|r| {
                r.as_object_mut().unwrap().remove("busy");
            }),
        ] {
            let refused = std::panic::catch_unwind(|| assert_record_fits_schema(&bad));
            assert!(refused.is_err(), "taken: {bad}");
        }
    }
}

/// A feature's state ("on", "degraded", "off") in `doctor --json`'s report.
pub fn doctor_feature(v: &Value, feature: &str) -> String {
    v["features"]
        .as_array()
        .and_then(|fs| fs.iter().find(|x| x[0] == feature))
        .and_then(|x| x[1]["state"].as_str())
        .unwrap_or_else(|| panic!("no feature {feature}: {:#}", v["features"]))
        .to_owned()
}

/// A program's row in `doctor --json`'s report.
pub fn doctor_program<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["programs"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["program"] == name))
        .unwrap_or_else(|| panic!("no program {name} in doctor's report"))
}

/// The one connection record between client port `client_port` and server
/// port `server_port`, seen from `direction` ("outbound": the client's).
pub fn conn<'a>(
    out: &'a Watched,
    direction: &str,
    client_port: &Value,
    server_port: u16,
) -> &'a Value {
    let (client_field, server_field) = if direction == "outbound" {
        ("local_port", "remote_port")
    } else {
        ("remote_port", "local_port")
    };
    let v: Vec<&Value> = out
        .records
        .iter()
        .filter(|r| {
            r["kind"] == "connection"
                && r["direction"] == direction
                && &r[client_field] == client_port
                && r[server_field] == server_port
        })
        .collect();
    assert_eq!(
        v.len(),
        1,
        "{direction} connection of client port {client_port} to {server_port}: {v:#?}\nall records: {:#?}",
        out.records
    );
    v[0]
}
