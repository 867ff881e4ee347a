//! `observer run` against an OTLP endpoint that fails, over gRPC and
//! HTTP/protobuf: nothing listening at start, an endpoint that accepts and
//! never reads, one that answers 503 / UNAVAILABLE / RESOURCE_EXHAUSTED;
//! then it recovers. Every record the observer printed (`--print`) is
//! accounted for: sent (and the receiver got exactly the spans counted as
//! sent) or counted as dropped, in the summary and on the Prometheus
//! endpoint. Timings are held to the receiver's own log of attempts.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{otlp::*, *};

/// `observer run --print` exporting to 127.0.0.1:`port`, for connections
/// on `server_port`; its stdout in a file, its Prometheus endpoint on a
/// port of its own.
struct Observed {
    daemon: Daemon,
    stdout: PathBuf,
    prometheus: u16,
}

fn observe(protocol: &str, port: u16, server_port: u16, env: &[(&str, &str)]) -> Observed {
    let prometheus = free_port();
    let stdout =
        std::env::temp_dir().join(format!("otlp-faults-{}-{port}.jsonl", std::process::id()));
    let file = std::fs::File::create(&stdout).unwrap();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--prometheus-listen"])
        .arg(format!("127.0.0.1:{prometheus}"))
        .args(["--port", &server_port.to_string()])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .envs(env.iter().copied());
    Observed {
        daemon: Daemon::start_with_stdout(cmd, Stdio::from(file)),
        stdout,
        prometheus,
    }
}

impl Observed {
    /// Records printed so far.
    fn printed(&self) -> usize {
        std::fs::read_to_string(&self.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with('{'))
            .count()
    }

    /// `observer_events_dropped_total{stage="export_failed"}` now.
    fn given_up(&self) -> u64 {
        let addr = ([127, 0, 0, 1], self.prometheus).into();
        let (status, _, body) = http_request(addr, "GET", "/metrics").unwrap();
        assert_eq!(status, 200, "{body}");
        let v = series(
            &body,
            "observer_events_dropped_total",
            &["stage=\"export_failed\""],
        );
        v.unwrap_or_else(|| panic!("no export_failed series in {body}")) as u64
    }

    /// Stops it: its summary and the records it printed.
    fn stop(self) -> (Value, usize) {
        let summary = summary_of(&self.daemon.stop());
        let printed = std::fs::read_to_string(&self.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with('{'))
            .count();
        let _ = std::fs::remove_file(&self.stdout);
        (summary, printed)
    }
}

/// A plain TCP server (helpers/server.py) that answers at once.
fn http_server() -> HelperServer {
    HelperServer::spawn(
        Command::new("python3")
            .arg(helper("server.py"))
            .args(["--response-bytes", "100"]),
    )
}

/// `n` curls to `url`, one after another, `every` apart; their pids.
fn curls(url: &str, n: usize, every: Duration) -> Vec<u32> {
    (0..n)
        .map(|_| {
            let mut c = Command::new("curl")
                .args(["-s", "-o", "/dev/null", url])
                .spawn()
                .unwrap();
            let pid = c.id();
            c.wait().unwrap();
            std::thread::sleep(every);
            pid
        })
        .collect()
}

/// Waits up to `within` until every one of `pids` has spans at `rec`; how
/// long that took.
fn spans_arrive(rec: &Received, pids: &[u32], within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let spans = all_spans(rec);
        let missing: Vec<&u32> = pids
            .iter()
            .filter(|&&p| {
                !spans
                    .iter()
                    .any(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(p)))
            })
            .collect();
        if missing.is_empty() {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "no spans within {within:?} for curl pids {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nothing lost silently: every printed record was sent, given up or not
/// queued (all counted), and the receiver holds exactly the spans counted
/// as sent.
fn accounted(summary: &Value, printed: usize, rec: &Received) {
    let e = &summary["export"];
    let n = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("no {k} in {e:#}"));
    assert_eq!(summary["dropped"]["output"], 0, "{summary:#}");
    assert_eq!(
        n("records_sent") + n("records_dropped") + n("queue_full") + n("records_sampled_out"),
        printed as u64,
        "every printed record is sent or counted: {e:#}"
    );
    assert_eq!(
        all_spans(rec).len() as u64,
        n("spans_sent"),
        "the receiver got exactly the spans counted as sent: {e:#}"
    );
}

/// A receiver for `protocol` on `port` (0: any), serving until the test
/// ends (the returned guard, for gRPC, keeps it up).
fn receiver_on(protocol: &str, rec: &Received, port: u16) -> (u16, Option<impl Drop>) {
    match protocol {
        "grpc" => {
            let (port, stop) = serve_grpc(rec, port);
            (port, Some(stop))
        }
        _ => (serve_http(rec, port), None),
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Nothing listens on the endpoint when the observer starts; 5 s later a
/// receiver comes up there. What was made meanwhile is given up and counted
/// (Prometheus shows it while it happens); what is made after arrives.
fn down_at_start(protocol: &str) {
    let server = http_server();
    let port = free_port();
    let run = observe(protocol, port, server.port, &[]);
    let url = format!("http://127.0.0.1:{}/", server.port);
    let t0 = Instant::now();
    curls(&url, 20, Duration::from_millis(250));
    // A batch is given up after 5 attempts 0.2+0.4+0.8+1.6 s (+-20 %) apart,
    // each refused at once: counted within 1 s (the first flush) + 3.6 s.
    let counted = loop {
        let n = run.given_up();
        if n > 0 || t0.elapsed() > Duration::from_secs(10) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(counted > 0, "nothing counted as given up while down");
    let rec = Received::default();
    let (_, _guard) = receiver_on(protocol, &rec, port);
    let up = Instant::now();
    let pids = curls(&url, 10, Duration::from_millis(250));
    // The batch in hand may be waiting its longest back-off (1.6 s + 20 %)
    // or be the down phase's last one; then a flush (1 s).
    spans_arrive(&rec, &pids, Duration::from_secs(10));
    eprintln!(
        "{protocol}: {counted} records counted as given up while down; the spans of the 10 \
         curls made in the 2.5 s after the receiver came up had all arrived {:?} after it did",
        up.elapsed()
    );
    let given_up = run.given_up();
    let (summary, printed) = run.stop();
    accounted(&summary, printed, &rec);
    let e = &summary["export"];
    assert_eq!(e["records_dropped"].as_u64(), Some(given_up), "{e:#}");
    assert!(e["export_errors"].as_u64() >= Some(5), "{e:#}");
    eprintln!("{protocol}: printed {printed}, export summary {e}");
}

#[test]
fn otlp_grpc_down_at_start() {
    let Some(_serial) = begin("otlp_grpc_down_at_start", &["curl"]) else {
        return;
    };
    down_at_start("grpc");
}

#[test]
fn otlp_http_down_at_start() {
    let Some(_serial) = begin("otlp_http_down_at_start", &["curl"]) else {
        return;
    };
    down_at_start("http/protobuf");
}

/// The export timeout the wedged tests set (OTEL_EXPORTER_OTLP_TIMEOUT).
const TIMEOUT: Duration = Duration::from_secs(1);
/// Attempts at a batch before it is given up.
const ATTEMPTS: u32 = observer::export::otlp::ATTEMPTS;
/// Scheduling slack on this shared machine for a wait to end late.
const LATE: Duration = Duration::from_millis(150);

/// The endpoint accepts connections and never reads them, for 10 s of
/// traffic: records go on being printed every second, each export attempt
/// ends at the timeout (a new connection each: the receiver's accept log),
/// with the back-off between them, not in a loop; what is given up is
/// counted, memory stays flat. Then the wedged endpoint stops listening
/// (its connections stay open, unread) and a real receiver takes the port:
/// export recovers.
fn wedged(protocol: &str) {
    let server = http_server();
    let mut wedged = Wedged::listen();
    let env = [("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")];
    let run = observe(protocol, wedged.port, server.port, &env);
    let pid = run.daemon.pid();
    let url = format!("http://127.0.0.1:{}/", server.port);
    let rss_before = rss_kib(pid);
    let (mut rss_max, mut printed) = (rss_before, vec![run.printed()]);
    let t0 = Instant::now();
    let mut made = 0;
    for _ in 0..10 {
        made += curls(&url, 10, Duration::from_millis(80)).len();
        printed.push(run.printed());
        rss_max = rss_max.max(rss_kib(pid));
    }
    let phase = t0.elapsed();
    assert!(
        printed.windows(2).all(|w| w[1] > w[0]),
        "records printed each second while the endpoint is wedged: {printed:?}"
    );
    // Each curl: its connection, the server's, and its request.
    assert!(
        *printed.last().unwrap() >= 2 * made,
        "{made} curls, printed {printed:?}"
    );
    let accepts = wedged.accepts.lock().unwrap().clone();
    check_wedged_attempts(&accepts, phase);
    // The first batch is given up once its attempts are through: the first
    // flush (1 s), ATTEMPTS timeouts and the back-offs between them (0.2 s
    // doubling, +20 % jitter): 9.6 s from the start at most, which the
    // curls' own phase may not last.
    let backoffs: f64 = (0..ATTEMPTS - 1).map(|i| 0.2 * 2f64.powi(i as i32)).sum();
    let give_up_by = t0
        + Duration::from_secs(1)
        + TIMEOUT * ATTEMPTS
        + Duration::from_secs_f64(backoffs * 1.2)
        + LATE;
    let mut counted = run.given_up();
    while counted == 0 && Instant::now() < give_up_by {
        std::thread::sleep(Duration::from_millis(100));
        counted = run.given_up();
    }
    assert!(
        counted > 0,
        "nothing counted as given up while wedged, {:?} after it began",
        t0.elapsed()
    );
    assert!(
        rss_max < rss_before + 32 * 1024,
        "memory bounded while wedged: {rss_before} KiB -> max {rss_max} KiB"
    );
    wedged.close_listener();
    let rec = Received::default();
    let (_, _guard) = receiver_on(protocol, &rec, wedged.port);
    let up = Instant::now();
    let pids = curls(&url, 5, Duration::from_millis(200));
    // The batch in hand may be in its last attempt (1 s) and longest
    // back-off (5 s + 20 %), then a flush (1 s).
    spans_arrive(&rec, &pids, Duration::from_secs(10));
    let recovered = up.elapsed();
    let given_up = run.given_up();
    let (summary, printed) = run.stop();
    accounted(&summary, printed, &rec);
    let e = &summary["export"];
    assert_eq!(e["records_dropped"].as_u64(), Some(given_up), "{e:#}");
    // Recovered although the wedged connections are still open, unread.
    assert!(wedged.held() >= accepts.len(), "{} held", wedged.held());
    eprintln!(
        "{protocol} wedged: {} attempts in {phase:?}, {counted} records given up by then, \
         RSS {rss_before} -> max {rss_max} KiB; recovered {recovered:?} after a receiver \
         took over; printed {printed}; export {e}",
        accepts.len()
    );
}

/// The wedged endpoint's accept log: one connection per attempt, each
/// attempt held its whole timeout, then the back-off (0.2 s doubling, +-20 %)
/// before the next of the same batch; never more than the phase allows.
fn check_wedged_attempts(accepts: &[Instant], phase: Duration) {
    let gaps: Vec<Duration> = accepts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        accepts.len() >= 5,
        "at least one batch's 5 attempts in {phase:?}: {gaps:?}"
    );
    assert!(
        (accepts.len() as f64) <= phase.as_secs_f64() / TIMEOUT.as_secs_f64() + 2.0,
        "no more than one attempt per timeout: {} in {phase:?}",
        accepts.len()
    );
    // `Wedged` polls accept every 5 ms: an accept's time is up to 5 ms late.
    assert!(
        gaps.iter()
            .all(|&g| g >= TIMEOUT - Duration::from_millis(5)),
        "each attempt waits out its timeout: {gaps:?}"
    );
    // The first batch: attempts 1-5, then given up.
    for (g, backoff) in gaps.iter().zip([0.2, 0.4, 0.8, 1.6]) {
        let least = TIMEOUT + Duration::from_secs_f64(backoff * 0.8) - Duration::from_millis(5);
        let most = TIMEOUT + Duration::from_secs_f64(backoff * 1.2) + LATE;
        assert!(
            *g >= least && *g <= most,
            "timeout + back-off {backoff} s: {g:?} not in {least:?}..{most:?} ({gaps:?})"
        );
    }
}

#[test]
fn otlp_grpc_wedged_endpoint() {
    let Some(_serial) = begin("otlp_grpc_wedged_endpoint", &["curl"]) else {
        return;
    };
    wedged("grpc");
}

#[test]
fn otlp_http_wedged_endpoint() {
    let Some(_serial) = begin("otlp_http_wedged_endpoint", &["curl"]) else {
        return;
    };
    wedged("http/protobuf");
}

/// The receiver answers trace exports from `script`: a transient failure
/// 5 times (one batch's attempts: given up), the same with the server's own
/// delay of 2 s twice, then OK, then a failure not worth retrying, then OK.
/// Checked against its own log of attempts: the back-off between a batch's
/// attempts, the server's delay honoured, no retry of the permanent one,
/// and the spans given up counted exactly.
fn answered(protocol: &str, transient: Answer, delayed: Answer, permanent: Answer) {
    let server = http_server();
    let rec = Received::default();
    let script = [
        [transient; 5].as_slice(),
        &[delayed, delayed, Answer::Ok, permanent],
    ]
    .concat();
    rec.script(script.iter().copied());
    let (port, _guard) = receiver_on(protocol, &rec, 0);
    let run = observe(protocol, port, server.port, &[]);
    let url = format!("http://127.0.0.1:{}/", server.port);
    let t0 = Instant::now();
    // Traffic until the script is spent and an export after it went OK.
    while rec.attempts.lock().unwrap().len() <= script.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "{:#?}",
            rec.attempts
        );
        curls(&url, 1, Duration::from_millis(200));
    }
    let pids = curls(&url, 3, Duration::from_millis(200));
    spans_arrive(&rec, &pids, Duration::from_secs(5));
    let given_up = run.given_up();
    let (summary, printed) = run.stop();
    accounted(&summary, printed, &rec);
    let attempts = rec.attempts.lock().unwrap().clone();
    check_answered(&attempts, &script);
    let e = &summary["export"];
    let n = |k: &str| e[k].as_u64().unwrap();
    assert_eq!(n("export_errors"), 8, "5 + 2 + 1 failed attempts: {e:#}");
    assert_eq!(
        n("spans_dropped"),
        (attempts[4].spans + attempts[8].spans) as u64,
        "the spans given up are those of the 5th and the 9th attempts: {e:#}"
    );
    assert_eq!(n("records_dropped"), given_up, "{e:#}");
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].at - w[0].at).collect();
    eprintln!("{protocol}: attempts {gaps:?} apart; printed {printed}; export {e}");
}

/// The attempts against the script: the first batch's 5 with the back-off
/// between them (0.2 s doubling, +-20 %, up to LATE late), the second
/// batch's with the server's 2 s each.
fn check_answered(attempts: &[Attempt], script: &[Answer]) {
    let gap = |i: usize| attempts[i + 1].at - attempts[i].at;
    for (i, a) in script.iter().enumerate() {
        assert_eq!(attempts[i].answer, *a, "attempt {i}: {attempts:#?}");
    }
    assert!(
        attempts[..5].iter().all(|a| a.spans == attempts[0].spans),
        "one batch, sent again whole: {attempts:#?}"
    );
    for (i, backoff) in [0.2, 0.4, 0.8, 1.6].into_iter().enumerate() {
        let least = Duration::from_secs_f64(backoff * 0.8);
        let most = Duration::from_secs_f64(backoff * 1.2) + LATE;
        assert!(
            gap(i) >= least && gap(i) <= most,
            "back-off {backoff} s: {:?} not in {least:?}..{most:?}",
            gap(i)
        );
    }
    assert!(
        attempts[5..8].iter().all(|a| a.spans == attempts[5].spans),
        "{attempts:#?}"
    );
    for i in [5, 6] {
        let server = Duration::from_secs(2);
        assert!(
            gap(i) >= server && gap(i) <= server + LATE,
            "the server's delay of 2 s: {:?}",
            gap(i)
        );
    }
}

#[test]
fn otlp_http_503_then_ok() {
    let Some(_serial) = begin("otlp_http_503_then_ok", &["curl"]) else {
        return;
    };
    let http = |status, retry_after| Answer::Http {
        status,
        retry_after,
    };
    answered(
        "http/protobuf",
        http(503, None),
        http(503, Some(2)),
        http(400, None),
    );
}

#[test]
fn otlp_grpc_unavailable_and_resource_exhausted_then_ok() {
    let Some(_serial) = begin("otlp_grpc_unavailable_then_ok", &["curl"]) else {
        return;
    };
    let grpc = |code, retry_info| Answer::Grpc { code, retry_info };
    answered(
        "grpc",
        grpc(tonic::Code::Unavailable, None),
        grpc(tonic::Code::ResourceExhausted, Some(Duration::from_secs(2))),
        // Without RetryInfo the spec says not to retry.
        grpc(tonic::Code::ResourceExhausted, None),
    );
}
