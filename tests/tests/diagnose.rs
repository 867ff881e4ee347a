//! `observer diagnose`: calls with one injected cause each (a late DNS
//! server, a dropped first SYN, a slow TLS handshake, a slow server, a slow
//! token stream, a busy GPU from the test NVML library, and a healthy call)
//! are named with that cause and evidence that matches the injected figure
//! by the clients' own clocks; the same verdicts from a recorded `watch
//! --json` stream (`--from FILE`), as a span attribute and as a counter.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::{json, Value};
use tests::{otlp::*, *};

/// What curl's `-w` times lose to rounding (µs) and to its clock
/// (CLOCK_MONOTONIC_RAW against the observer's CLOCK_MONOTONIC: at most
/// 500 ppm, 0.75 ms over 1.5 s).
const CURL_MARGIN_MS: f64 = 1.0;

/// The stub's config file (one device, `gpu_pid` on it at `util`%);
/// removed on drop.
struct StubConfig(PathBuf);

impl StubConfig {
    fn new(gpu_pid: u32, util: u32) -> StubConfig {
        let p = std::env::temp_dir().join(format!(
            "observer-diagnose-nvml-{}.json",
            std::process::id()
        ));
        let v = json!({"devices": [
            {"uuid": "GPU-00000000-aaaa", "name": "Stub H200", "util_gpu": util, "util_mem": 10,
             "mem_used": 1_048_576_000u64, "mem_total": 8_388_608_000u64,
             "processes": [{"pid": gpu_pid, "used_memory": 524_288_000u64, "sm_util": util}]}
        ]});
        std::fs::write(&p, v.to_string()).unwrap();
        StubConfig(p)
    }
}

impl Drop for StubConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// curl (in `ns` when given) with its own times, in ms: name lookup,
/// connect, pretransfer, first byte (all from its start).
fn curl(ns: Option<&DnsNs>, url: &str) -> [f64; 4] {
    let args = [
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{time_namelookup} %{time_connect} %{time_pretransfer} %{time_starttransfer}",
        url,
    ];
    let out = match ns {
        Some(ns) => ns.exec(&args),
        None => Command::new(args[0]).args(&args[1..]).output().unwrap(),
    };
    let text = String::from_utf8(out.stdout).unwrap();
    let t: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap() * 1e3)
        .collect();
    assert_eq!(t.len(), 4, "curl {url}: {text:?}");
    [t[0], t[1], t[2], t[3]]
}

fn fig_ms(v: &Value, key: &str) -> f64 {
    ms(v["figures"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key}: {v:#}")))
}

/// The one verdict on an outbound call to `port` (whose host is `host` when
/// given).
fn verdict<'a>(all: &'a [Value], port: u16, host: Option<&str>) -> &'a Value {
    let v: Vec<&Value> = all
        .iter()
        .filter(|v| {
            v["kind"] == "diagnosis"
                && v["direction"] == "outbound"
                && v["remote_port"] == port
                && host.is_none_or(|h| v["host"] == h)
        })
        .collect();
    assert_eq!(v.len(), 1, "port {port} host {host:?}: {all:#?}");
    v[0]
}

fn assert_cause(v: &Value, cause: &str, evidence_starts: &str) {
    assert_eq!(v["cause"], cause, "{v:#}");
    let e = v["evidence"].as_str().unwrap();
    assert!(e.starts_with(evidence_starts), "{e:?} for {v:#}");
    // The thresholds it used come with every verdict.
    assert_eq!(v["thresholds"]["ttfb_ms"], 1000.0, "{v:#}");
}

/// Every injected cause, one `observer diagnose --json` watching them all.
#[test]
fn each_injected_cause_is_named_with_its_evidence() {
    let Some(_serial) = begin("diagnose_live", &["curl", "python3", "ip", "iptables"]) else {
        return;
    };
    let cert = Cert::new();
    // Injected: DNS server 300 ms, TLS handshake 400 ms, server 1500 ms, a
    // server with a 99%-busy GPU 1200 ms, tokens 150 ms apart.
    const DNS_MS: f64 = 300.0;
    let ns = DnsNs::new(DNS_MS);
    let tls = tls_server(&cert, "tls", 400, 0);
    let slow = tls_server(&cert, "plain", 0, 1500);
    let gpu = tls_server(&cert, "plain", 0, 1200);
    let healthy = tls_server(&cert, "plain", 0, 0);
    const GAP_MS: f64 = 150.0;
    let llm = llm_server(None, 100.0, GAP_MS, 12);
    let stub = StubConfig::new(gpu.pid(), 99);
    let mut cmd = Command::new(observer_bin());
    cmd.args([
        "diagnose",
        "--json",
        "--top",
        "0",
        "--gpu-interval",
        "50",
        "--nvml-lib",
    ])
    .arg(nvml_stub())
    .env("NVML_STUB_CONFIG", &stub.0);
    let w = Watch::spawn(cmd);
    // The first calls after start-up compete with the observer's own
    // start-up work: one unmeasured call of each kind.
    let healthy_url = format!("http://127.0.0.1:{}/", healthy.port);
    curl(None, &healthy_url);
    ns.exec(&["curl", "-s", "-o", "/dev/null", "http://warm.test:1/"]);

    let dns = curl(Some(&ns), &format!("http://slow.test:{}/", ns.http.port));
    // The first SYN to the namespace's server is dropped, the next passes.
    let port = ns.http.port.to_string();
    let out = ns.exec(&[
        "iptables",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        &port,
        "--syn",
        "-m",
        "statistic",
        "--mode",
        "nth",
        "--every",
        "2",
        "--packet",
        "0",
        "-j",
        "DROP",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let syn = curl(Some(&ns), &format!("http://127.0.0.1:{port}/"));
    let tls_client = run_json_lines(
        Command::new("python3")
            .arg(helper("tls_client.py"))
            .args(["--port", &tls.port.to_string()]),
    );
    let server = curl(None, &format!("http://127.0.0.1:{}/", slow.port));
    let busy = curl(None, &format!("http://127.0.0.1:{}/", gpu.port));
    let stream = llm_client(llm.port, 0, &["--plain", "--model", "slow-stream"]);
    let fine = curl(None, &healthy_url);
    let out = w.stop();
    let all = &out.records;
    eprintln!("{}", serde_json::to_string_pretty(all).unwrap());

    // DNS: between the server's own time on the lookup and curl's.
    let v = verdict(all, ns.http.port, Some("slow.test"));
    assert_cause(v, "dns", "slow DNS lookup: slow.test took ");
    let ours = fig_ms(v, "dns_ns");
    let server_ms = ns.server_ms("slow.test");
    assert!(
        server_ms >= DNS_MS && server_ms <= ours && ours <= dns[0] + CURL_MARGIN_MS,
        "lookup: ours {ours} ms, the server's {server_ms} ms, curl's {} ms",
        dns[0]
    );
    assert!(
        v["evidence"].as_str().unwrap().contains(" at 127.0.0.1"),
        "{v:#}"
    );

    // Connect: the SYN's retransmission timeout (1 s), within curl's.
    let v = verdict(all, ns.http.port, Some("127.0.0.1"));
    assert_cause(v, "connect", "SYN retransmitted: connect took ");
    let ours = fig_ms(v, "connect_ns");
    assert!(
        (1000.0..=syn[1] - syn[0] + CURL_MARGIN_MS).contains(&ours),
        "connect: ours {ours} ms, curl's {} ms",
        syn[1] - syn[0]
    );

    // TLS: the injected 400 ms, within the client's wrap_socket time.
    let v = verdict(all, tls.port, None);
    assert_cause(v, "tls", "TLS handshake ");
    let ours = fig_ms(v, "tls_handshake_ns");
    let client_ms = tls_client[0]["handshake_ms"].as_f64().unwrap();
    assert!(
        (400.0..=client_ms + 0.1).contains(&ours),
        "handshake: ours {ours} ms, the client's {client_ms} ms"
    );
    assert!(
        v["evidence"].as_str().unwrap().contains(": round trip "),
        "{v:#}"
    );

    // Server: the injected 1.5 s, within curl's request-to-first-byte; the
    // server's own record on this host at least the injected wait and at
    // most the client's.
    let v = verdict(all, slow.port, None);
    assert_cause(v, "server", "server slow to answer: first byte after ");
    let ours = fig_ms(v, "ttfb_ns");
    let curl_ms = server[3] - server[2];
    assert!(
        (1500.0..=curl_ms + CURL_MARGIN_MS).contains(&ours),
        "first byte: ours {ours} ms, curl's {curl_ms} ms"
    );
    let theirs = fig_ms(v, "server_ns");
    assert!(
        (1500.0..=ours).contains(&theirs),
        "server: {theirs} ms, client {ours} ms"
    );
    assert!(
        v["evidence"]
            .as_str()
            .unwrap()
            .contains("(the server on this host took "),
        "{v:#}"
    );

    // GPU: the server's device at the 99% the stub reported.
    let v = verdict(all, gpu.port, None);
    assert_cause(
        v,
        "gpu",
        "GPU busy: device GPU-00000000-aaaa at 99% during the request",
    );
    assert_eq!(v["figures"]["gpu_util_pct"], 99);
    let ours = fig_ms(v, "ttfb_ns");
    assert!(
        (1200.0..=busy[3] - busy[2] + CURL_MARGIN_MS).contains(&ours),
        "first byte: ours {ours} ms, curl's {} ms",
        busy[3] - busy[2]
    );

    // Stream: a token every 150 ms is 6.7 tokens/s; sleeps only add time,
    // so the rate is at most that (3% over: a first token read late), and at
    // least 75% of it (scheduling).
    let v = verdict(all, llm.port, None);
    assert_cause(v, "stream", "slow token stream: ");
    let rate = v["figures"]["tokens_per_s"].as_f64().unwrap();
    let nominal = 1000.0 / GAP_MS;
    assert!(
        (0.75 * nominal..=nominal * 1.03).contains(&rate),
        "{rate} tokens/s, injected {nominal}"
    );
    let ttft = stream[0]["ttft_ms"].as_f64().unwrap();
    assert!(
        fig_ms(v, "first_token_ns") <= ttft + 0.1,
        "{v:#} client {ttft}"
    );

    // Healthy: nothing over its threshold.
    let vs: Vec<&Value> = all
        .iter()
        .filter(|v| v["direction"] == "outbound" && v["remote_port"] == healthy.port)
        .collect();
    assert_eq!(vs.len(), 2, "{vs:#?}");
    for v in vs {
        assert_cause(v, "none", "no phase over its threshold");
    }
    assert!(fine[3] < 1000.0, "curl took {fine:?}");
    // The end line counts every verdict by cause.
    let end = out
        .stderr
        .iter()
        .find_map(|l| l.strip_prefix("diagnosed "))
        .unwrap();
    let end: Value = serde_json::from_str(end).unwrap();
    for cause in ["dns", "connect", "tls", "server", "gpu", "stream", "none"] {
        assert!(
            end["by_cause"][cause].as_u64() >= Some(1),
            "{cause}: {end:#}"
        );
    }
}

/// `observer run`: the cause as a span attribute and a counter (OTLP and
/// Prometheus); its printed records, read back by `diagnose --from FILE`,
/// give the same verdicts, odd lines skipped and counted.
#[test]
fn spans_counter_and_a_recorded_stream_carry_the_same_cause() {
    let Some(_serial) = begin("diagnose_run", &["curl", "python3"]) else {
        return;
    };
    let cert = Cert::new();
    let slow = tls_server(&cert, "plain", 0, 1200);
    let healthy = tls_server(&cert, "plain", 0, 0);
    let (rec, otlp_port) = grpc_receiver();
    let prom_port = free_port();
    let file = std::env::temp_dir().join(format!("observer-diagnose-{}.jsonl", std::process::id()));
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(file.clone());
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--prometheus-listen"])
        .arg(format!("127.0.0.1:{prom_port}"))
        .args(["--port", &format!("{},{}", slow.port, healthy.port)])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp_port}"),
        )
        .env("OTEL_METRIC_EXPORT_INTERVAL", "300");
    let run = Daemon::start_with_stdout(cmd, Stdio::from(std::fs::File::create(&file).unwrap()));
    let healthy_url = format!("http://127.0.0.1:{}/", healthy.port);
    curl(None, &healthy_url);
    let server = curl(None, &format!("http://127.0.0.1:{}/", slow.port));
    curl(None, &healthy_url);
    // The counter, on Prometheus, once the records are in.
    let mut metrics = String::new();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let (_, _, body) =
            http_request(([127, 0, 0, 1], prom_port).into(), "GET", "/metrics").unwrap();
        metrics = body;
        if metrics
            .contains("observer_diagnosis_total{cause=\"server\",observer_record_kind=\"request\"}")
        {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(800));
    run.stop();
    let count = |cause: &str, kind: &str| -> u64 {
        let key = format!(
            "observer_diagnosis_total{{cause=\"{cause}\",observer_record_kind=\"{kind}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map_or(0, |n| n.trim().parse::<f64>().unwrap() as u64)
    };
    // One slow request, two healthy ones, each seen by its client and its
    // server (the exporters judge every record on its own).
    assert_eq!(count("server", "request"), 2, "{metrics}");
    assert_eq!(count("none", "request"), 4, "{metrics}");
    assert!(count("server", "connection") >= 1, "{metrics}");

    // OTLP: the request spans carry the cause; so does the metric.
    let spans = all_spans(&rec);
    let causes: Vec<(String, i64)> = spans
        .iter()
        .filter(|(_, s)| s.name == "GET" && s.kind == SpanKind::Client as i32)
        .map(|(_, s)| {
            (
                attr_str(&s.attributes, "observer.diagnosis.cause").unwrap_or_default(),
                attr_int(&s.attributes, "server.port").unwrap_or(0),
            )
        })
        .collect();
    let slow_port = i64::from(slow.port);
    assert!(causes.contains(&("server".into(), slow_port)), "{causes:?}");
    assert_eq!(
        causes.iter().filter(|(c, _)| c == "none").count(),
        2,
        "{causes:?}"
    );
    let roots: Vec<String> = spans
        .iter()
        .filter(|(_, s)| {
            s.parent_span_id.is_empty()
                && s.kind == SpanKind::Client as i32
                && s.name == format!("tcp 127.0.0.1:{}", slow.port)
        })
        .filter_map(|(_, s)| attr_str(&s.attributes, "observer.diagnosis.cause"))
        .collect();
    assert_eq!(roots, ["server"], "the connection's span");
    let metric_causes: Vec<String> = rec
        .metrics
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == "observer.diagnosis")
        .flat_map(|m| match &m.data {
            Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Sum(s)) => s
                .data_points
                .iter()
                .filter_map(|p| attr_str(&p.attributes, "cause"))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    assert!(
        metric_causes.iter().any(|c| c == "server"),
        "{metric_causes:?}"
    );

    // --from FILE: the recorded stream, with odd lines among it.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        writeln!(f, "not json at all\n{{\"kind\": \"weather\"}}\n").unwrap();
    }
    let out = Command::new(observer_bin())
        .args(["diagnose", "--json", "--top", "0", "--from"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let all: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let v = verdict(&all, slow.port, None);
    assert_cause(v, "server", "server slow to answer: first byte after ");
    let ours = fig_ms(v, "ttfb_ns");
    let curl_ms = server[3] - server[2];
    assert!(
        (1200.0..=curl_ms + CURL_MARGIN_MS).contains(&ours),
        "first byte: ours {ours} ms, curl's {curl_ms} ms"
    );
    assert!(fig_ms(v, "server_ns") >= 1200.0, "{v:#}");
    let healthy_verdicts = all
        .iter()
        .filter(|v| v["remote_port"] == healthy.port && v["cause"] == "none")
        .count();
    assert_eq!(healthy_verdicts, 2, "{all:#?}");
    // Slowest first.
    assert_eq!(all[0]["remote_port"], slow.port, "{all:#?}");
    let end: Value = serde_json::from_str(
        stderr
            .lines()
            .find_map(|l| l.strip_prefix("diagnosed "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(end["skipped_lines"], 2, "{end:#}");

    // Text, from stdin, the slowest one only.
    let text = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} diagnose --top 1 --ttfb-ms 500 --from - < {}",
            observer_bin().display(),
            file.display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("first byte 500 ms"), "{text}");
    assert!(text.contains("the 1 slowest of 3 calls"), "{text}");
    assert!(
        text.contains("server slow to answer: first byte after 1."),
        "{text}"
    );
    assert!(
        text.contains("skipped 2 lines that were not records"),
        "{text}"
    );

    // An unreadable file is an error that names it.
    let out = Command::new(observer_bin())
        .args(["diagnose", "--from", "/nonexistent/records.jsonl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/records.jsonl"),
        "{out:?}"
    );
}
