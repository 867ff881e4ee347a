//! LLM API calls of every provider's shape, however the server spaces or
//! splits its JSON: a server of the tests' own (helpers/llm_shapes.py: OpenAI
//! chat, the Responses API, Azure, Anthropic Messages, Ollama's NDJSON,
//! Gemini's SSE and JSON array; compact, Python's default spacing or
//! pretty-printed; or one byte per flush) called by the official `openai` and
//! `anthropic` SDKs, httpx and curl (helpers/sdk_client.py times itself).
//! Each call's time to first token is held to the client's own clock, its
//! tokens to what the SDK parsed, its content gaps to the client's; the
//! server's side of each call too.
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::process::Command;

use serde_json::Value;
use tests::*;

/// Injected: before the answer's head and first event, between content events.
const FIRST_MS: f64 = 150.0;
const GAP_MS: f64 = 30.0;
const CHUNKS: u64 = 5;
/// What the server reports as cached input and reasoning output tokens.
const CACHED: u64 = 7;
const REASONING: u64 = 3;
/// Ours against the client's own clock (the least disturbed of each
/// client's calls), as the issue asks.
const TOL_MS: f64 = 2.0;
/// A median gap or time per token against the client's (timed at its
/// socket reads): our quantile comes from a histogram within 1.6% (0.5 ms
/// at 30 ms), and a Python read loop lags the kernel by up to a ms or so.
const GAP_TOL_MS: f64 = 2.5;

/// An API shape as the client and server name it, and what its records say.
struct Shape {
    api: &'static str,
    provider: &'static str,
    operation: &'static str,
    /// The server sends cached input / reasoning output tokens in this shape.
    cached: bool,
    reasoning: bool,
}

const fn shape(
    api: &'static str,
    provider: &'static str,
    operation: &'static str,
    cached: bool,
    reasoning: bool,
) -> Shape {
    Shape {
        api,
        provider,
        operation,
        cached,
        reasoning,
    }
}

const SHAPES: [Shape; 8] = [
    shape("chat", "openai", "chat", true, true),
    shape("responses", "openai", "chat", true, true),
    shape("azure", "azure.ai.openai", "chat", true, true),
    shape("anthropic", "anthropic", "chat", true, false),
    shape("ollama-chat", "ollama", "chat", false, false),
    shape("ollama-generate", "ollama", "text_completion", false, false),
    shape("gemini", "gcp.gemini", "chat", true, true),
    shape("gemini-sse", "gcp.gemini", "chat", true, true),
];

fn shape_of(api: &str) -> &'static Shape {
    SHAPES.iter().find(|s| s.api == api).unwrap()
}

/// The shapes server: `style` compact|python|pretty, `byte`: one byte per flush.
fn server(port: u16, cert: Option<&Cert>, style: &str, byte: bool) -> HelperServer {
    let mut cmd = Command::new("python3");
    cmd.arg(helper("llm_shapes.py"))
        .args(["--port", &port.to_string()])
        .args(["--first-ms", &FIRST_MS.to_string()])
        .args(["--gap-ms", &GAP_MS.to_string()])
        .args(["--chunks", &CHUNKS.to_string()])
        .args(["--style", style]);
    if let Some(cert) = cert {
        cmd.arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key());
    }
    if byte {
        cmd.arg("--byte-at-a-time");
    }
    HelperServer::spawn(&mut cmd)
}

/// helpers/sdk_client.py under the SDKs' python: one line per model, on
/// one client (its pool decides: the `openai` SDK stops reading a chat
/// stream at `[DONE]` and opens a new connection for the next call; the
/// others keep theirs alive).
fn client(
    python: &std::path::Path,
    port: u16,
    api: &str,
    models: &[String],
    extra: &[&str],
) -> Vec<Value> {
    let mut cmd = Command::new(python);
    // --strict: the SDKs check every answer against their own types, so
    // the server's shapes are the providers'.
    cmd.arg(helper("sdk_client.py"))
        .arg("--strict")
        .args(["--port", &port.to_string()])
        .args(["--api", api])
        .args(extra);
    for m in models {
        cmd.args(["--model", m]);
    }
    let out = run_json_lines(&mut cmd);
    assert_eq!(out.len(), models.len(), "{api}: {out:?}");
    out
}

fn ms_of(v: &Value) -> f64 {
    ms(v.as_u64()
        .unwrap_or_else(|| panic!("not a number of ns: {v}")))
}

/// The median by nearest rank (the ceil(n/2)-th smallest), as the record's
/// `p50_ns` is defined: of 4 gaps the 2nd, not the 3rd.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len().div_ceil(2) - 1]
}

/// One call's times, ours beside its client's own (ms).
struct Times {
    /// Time to first token, from the request's first write.
    ttft: (f64, f64),
    /// The median gap between content events.
    gap_p50: (f64, f64),
    /// Time per output token after the first.
    per_token: (f64, f64),
}

/// `model`'s call checked against what its client saw (`own`), on both
/// ends; returns its times beside the client's.
fn check_call(out: &Watched, s: &Shape, model: &str, own: &Value) -> Times {
    let r = out.request_of_model(model, "outbound");
    let g = &r["gen_ai"];
    let what = format!("{} {model}: {g:#}", s.api);
    assert_eq!(r["status"], 200, "{what}");
    assert_eq!(r["error"], Value::Null, "{what}");
    assert_eq!(g["provider"], s.provider, "{what}");
    assert_eq!(g["operation"], s.operation, "{what}");
    assert_eq!(g["response_model"], format!("{model}-served"), "{what}");
    assert_eq!(g["response_model"], own["response_model"], "{what}");
    // Tokens as the client parsed them from the same answer.
    assert_eq!(g["input_tokens"], own["input_tokens"], "{what}");
    assert!(g["input_tokens"].as_u64().is_some_and(|n| n > 0), "{what}");
    assert_eq!(g["output_tokens"], CHUNKS, "{what}");
    assert_eq!(own["output_tokens"], CHUNKS, "{what}");
    let want = |has: bool, n: u64| if has { Value::from(n) } else { Value::Null };
    assert_eq!(g["cached_input_tokens"], want(s.cached, CACHED), "{what}");
    assert_eq!(own["cached_tokens"], want(s.cached, CACHED), "{what}");
    assert_eq!(
        g["reasoning_output_tokens"],
        want(s.reasoning, REASONING),
        "{what}"
    );
    assert_eq!(
        own["reasoning_tokens"],
        want(s.reasoning, REASONING),
        "{what}"
    );
    assert_eq!(g["content_events"], CHUNKS, "{what}");
    assert_eq!(g["unreadable_events"], 0, "{what}");
    assert_eq!(g["stream"], true, "{what}");
    // Gaps between content events: ours against the injected gap here,
    // against the client's own in `run_shapes` (the least disturbed call).
    let gaps = &g["content_gaps"];
    assert_eq!(gaps["count"], CHUNKS - 1, "{what}");
    let times: Vec<f64> = own["content_times_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    assert_eq!(times.len() as u64, CHUNKS, "{what}: {own}");
    let mut own_gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let own_p50 = median(&mut own_gaps);
    let p50 = ms_of(&gaps["p50_ns"]);
    assert!(ms_of(&gaps["max_ns"]) >= p50, "{what}");
    let per_token = ms_of(&g["time_per_output_token_ns"]);
    let own_per_token = (times[times.len() - 1] - times[0]) / (CHUNKS - 1) as f64;
    assert!(
        g["output_tokens_per_second"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{what}"
    );
    // The server's side of the same call: its own first content, no later
    // than the client's, the same counts.
    let srv = out.request_of_model(model, "inbound");
    let sg = &srv["gen_ai"];
    let ttft = ms_of(&g["time_to_first_token_ns"]);
    let server_ttft = ms_of(&sg["time_to_first_token_ns"]);
    assert!(
        server_ttft >= FIRST_MS + GAP_MS && server_ttft <= ttft,
        "{what}: the server's first token {server_ttft} ms, the client's {ttft} ms"
    );
    // The server sleeps the injected gap between its events' writes: a
    // floor on its gaps. (Not on the client's: a client that fell behind
    // reads two events closer together than they were sent.)
    let server_p50 = ms_of(&sg["content_gaps"]["p50_ns"]);
    assert!(
        server_p50 >= GAP_MS * 0.98,
        "{what}: the server's median gap {server_p50} ms, the injected gap {GAP_MS} ms"
    );
    for field in [
        "provider",
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "reasoning_output_tokens",
        "content_events",
        "response_model",
    ] {
        assert_eq!(sg[field], g[field], "{what}: the server's {field}: {sg:#}");
    }
    // The client's clock from its request's first write (as ours starts):
    // a connection the SDK opened for the call is not part of it.
    let sent = own["request_sent_ms"].as_f64().unwrap();
    Times {
        ttft: (ttft, own["ttft_ms"].as_f64().unwrap() - sent),
        gap_p50: (p50, own_p50),
        per_token: (per_token, own_per_token),
    }
}

/// Runs each of `apis` against a `style` server (`byte`: one byte per
/// flush), `calls` calls each on one connection of a fresh client process,
/// and holds every call to its client.
fn run_shapes(test: &str, apis: &[&str], tls: bool, style: &str, byte: bool, watch_args: &[&str]) {
    let Some(_serial) = begin(test, &["openssl", "python3"]) else {
        return;
    };
    let Some(python) = llm_sdk_python(test) else {
        return;
    };
    let cert = Cert::new();
    let port = free_port();
    let port_arg = port.to_string();
    let mut args = vec!["--port", &port_arg];
    args.extend_from_slice(watch_args);
    // Both ends start after the observer and neither waits: the client's
    // first call is checked like its others.
    let w = Watch::start(&args);
    let srv = server(port, tls.then_some(&cert), style, byte);
    let mut runs = Vec::new();
    for api in apis {
        let models: Vec<String> = (0..3).map(|k| format!("{api}-{style}-{k}")).collect();
        let plain: &[&str] = if tls { &[] } else { &["--plain"] };
        let own = client(&python, srv.port, api, &models, plain);
        runs.push((*api, models, own));
    }
    let out = w.stop();
    // Every call is held to its client, the first of each fresh process
    // included, over TLS too.
    for (api, models, own) in &runs {
        let s = shape_of(api);
        let times: Vec<Times> = models
            .iter()
            .zip(own)
            .map(|(m, c)| check_call(&out, s, m, c))
            .collect();
        let (ours, theirs): (Vec<f64>, Vec<f64>) = times.iter().map(|t| t.ttft).unzip();
        agree_with_clock(
            &format!("{api} ({style}) time to first token"),
            &ours,
            &theirs,
            FIRST_MS + GAP_MS,
            TOL_MS,
            TOL_MS,
        );
        // The gaps as the client timed them, on its least disturbed call
        // (a busy machine delays a Python client's reads now and then).
        for (what, pick) in [
            (
                "median gap",
                (|t: &Times| t.gap_p50) as fn(&Times) -> (f64, f64),
            ),
            ("time per output token", |t: &Times| t.per_token),
        ] {
            let pairs: Vec<(f64, f64)> = times.iter().map(pick).collect();
            let diffs: Vec<f64> = pairs.iter().map(|(o, c)| o - c).collect();
            assert!(
                closest(&diffs) <= GAP_TOL_MS,
                "{api} ({style}) {what}: (ours, the client's) {pairs:?} ms, none within {GAP_TOL_MS} ms"
            );
        }
    }
}

#[test]
fn every_provider_shape_spaced_as_python_writes_it_over_tls() {
    let apis: Vec<&str> = SHAPES.iter().map(|s| s.api).collect();
    run_shapes("llm_shapes_tls", &apis, true, "python", false, &[]);
}

#[test]
fn compact_and_pretty_printed_events_over_plain_http() {
    let apis: Vec<&str> = SHAPES.iter().map(|s| s.api).collect();
    for style in ["compact", "pretty"] {
        run_shapes("llm_shapes_plain", &apis, false, style, false, &[]);
    }
}

#[test]
fn a_server_that_flushes_one_byte_at_a_time() {
    // Every byte its own TLS write: ~1,500 calls a second from the server,
    // over the default cap on per-call probes (under which a process's
    // probes come off, counted); the cap is a setting, raised here.
    run_shapes(
        "llm_shapes_bytes",
        &["chat", "responses", "anthropic"],
        true,
        "python",
        true,
        &["--tls-plaintext-max-rate", "100000"],
    );
}

/// curl's `-w` times of one call over plain HTTP (where a local Ollama
/// listens): (first byte, total) in ms from its connection's end. Not from
/// `time_pretransfer`: curl reads that clock after the request was written
/// (multi.c's DID state), so a curl scheduled out between the two gives a
/// figure shorter than the wait it sent its request into (153.8 ms against
/// our 156.2 in one CI run). A fresh curl writes its request right after
/// `time_connect`, so curl's time holds ours.
fn curl_call(port: u16, path: &str, body: &str) -> (f64, f64) {
    let out = Command::new("curl")
        .args([
            "-sk",
            "-N",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/json",
        ])
        .args(["-w", "%{time_connect} %{time_starttransfer} %{time_total}"])
        .args(["--data", body])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {path}: {out:?}");
    let t: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split(' ')
        .map(|x| x.parse::<f64>().unwrap() * 1000.0)
        .collect();
    (t[1] - t[0], t[2] - t[0])
}

#[test]
fn curl_for_ollama_and_gemini_and_a_gateway_prefix() {
    let Some(_serial) = begin("llm_shapes_curl", &["python3", "curl"]) else {
        return;
    };
    // Plain HTTP: a one-shot curl's first TLS connection is a race with its
    // per-process probes today (issue 29 takes it on, with its own tests).
    let port = free_port();
    let w = Watch::start(&["--port", &port.to_string()]);
    let srv = server(port, None, "python", false);
    let calls = [
        (
            "ollama-chat",
            "/api/chat",
            r#"{"model": "oc", "messages": [{"role": "user", "content": "hi"}]}"#,
            "oc",
        ),
        (
            "ollama-generate",
            "/gw/ollama/api/generate",
            r#"{"model": "og", "prompt": "hi"}"#,
            "og",
        ),
        (
            "gemini",
            "/v1beta/models/gem-a:streamGenerateContent",
            r#"{"contents": [{"parts": [{"text": "hi"}]}]}"#,
            "gem-a",
        ),
        (
            "gemini-sse",
            "/v1beta/models/gem-b:streamGenerateContent?alt=sse",
            r#"{"contents": []}"#,
            "gem-b",
        ),
        (
            "chat",
            "/gw/openai/v1/chat/completions",
            r#"{"model": "gw", "stream": true, "messages": []}"#,
            "gw",
        ),
    ];
    let mut own = Vec::new();
    for (_, path, body, _) in calls {
        // Each a fresh curl process: its one request is its first.
        own.push(curl_call(srv.port, path, body));
    }
    let out = w.stop();
    let mut first_bytes = (Vec::new(), Vec::new());
    for ((api, path, body, model), (ttfb, total)) in calls.iter().zip(own) {
        let s = shape_of(api);
        let r = out.request_of_model(model, "outbound");
        let g = &r["gen_ai"];
        let what = format!("{api} {path}: {r:#}");
        assert_eq!(r["comm"], "curl", "{what}");
        assert_eq!(r["request_index"], 1, "{what}");
        assert_eq!(
            (&g["provider"], &g["operation"]),
            (&s.provider.into(), &s.operation.into()),
            "{what}"
        );
        assert_eq!(g["response_model"], format!("{model}-served"), "{what}");
        assert_eq!(g["input_tokens"], body.len() as u64 % 1000, "{what}");
        assert_eq!(g["output_tokens"], CHUNKS, "{what}");
        assert_eq!(g["content_events"], CHUNKS, "{what}");
        assert_eq!(g["unreadable_events"], 0, "{what}");
        let cached = if s.cached {
            Value::from(CACHED)
        } else {
            Value::Null
        };
        assert_eq!(g["cached_input_tokens"], cached, "{what}");
        // curl's own clock: its first byte, and the call's end.
        first_bytes.0.push(ms_of(&r["ttfb_ns"]));
        first_bytes.1.push(ttfb);
        let ttft = ms_of(&g["time_to_first_token_ns"]);
        assert!(
            ttft >= FIRST_MS + GAP_MS && ttft <= total,
            "{what}: first token {ttft} ms, curl's whole call {total} ms"
        );
    }
    agree_with_clock(
        "curl's first byte",
        &first_bytes.0,
        &first_bytes.1,
        FIRST_MS,
        TOL_MS,
        TOL_MS,
    );
}

#[test]
fn the_servers_view_in_the_metrics() {
    let Some(_serial) = begin("llm_shapes_metrics", &["openssl", "python3"]) else {
        return;
    };
    let Some(python) = llm_sdk_python("llm_shapes_metrics") else {
        return;
    };
    let cert = Cert::new();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let port = free_port();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--prometheus-listen", &listen.to_string()])
        .args(["--port", &port.to_string()])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    let run = Daemon::start(cmd);
    let srv = server(port, Some(&cert), "python", false);
    let models = ["anth-m".to_owned(), "anth-m".to_owned()];
    let own = client(&python, srv.port, "anthropic", &models, &[]);
    // The correlator takes the records within its next batch.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, _, text) = http_request(listen, "GET", "/metrics").unwrap();
    run.stop();
    assert_eq!(status, 200);
    let labels = [
        "gen_ai_operation_name=\"chat\"",
        "gen_ai_provider_name=\"anthropic\"",
        "gen_ai_request_model=\"anth-m\"",
        "gen_ai_response_model=\"anth-m-served\"",
    ];
    for name in [
        "gen_ai_server_request_duration_seconds_count",
        "gen_ai_server_time_to_first_token_seconds_count",
        "gen_ai_server_time_per_output_token_seconds_count",
        "gen_ai_client_operation_duration_seconds_count",
        "gen_ai_client_operation_time_to_first_chunk_seconds_count",
    ] {
        assert_eq!(series(&text, name, &labels), Some(2.0), "{name}: {text}");
    }
    // The server's time to first token: within the client's, over the wait.
    let sum = series(
        &text,
        "gen_ai_server_time_to_first_token_seconds_sum",
        &labels,
    )
    .unwrap();
    let own_sum: f64 = own.iter().map(|c| c["ttft_ms"].as_f64().unwrap()).sum();
    assert!(
        sum * 1000.0 >= 2.0 * (FIRST_MS + GAP_MS) && sum * 1000.0 <= own_sum,
        "server first tokens {sum} s in all, the client's {own_sum} ms"
    );
    let mut with = labels.to_vec();
    with.push("gen_ai_token_type=\"input\"");
    let input: u64 = own
        .iter()
        .map(|c| c["input_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        series(&text, "gen_ai_client_token_usage_sum", &with),
        Some(input as f64),
        "{text}"
    );
}
