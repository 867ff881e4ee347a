//! HTTP/2 streams as request records, as root with the real probes: curl
//! (libcurl's nghttp2 over OpenSSL) fetching several URLs on one connection
//! through nginx terminating h2 in front of a slow backend, and Node's http2
//! module over cleartext h2. Each stream is its own record on both sides,
//! its time to first byte checked against the client's own clock and the
//! backend's injected wait.

#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use serde_json::Value;
use tests::*;

/// The backend's wait before each answer.
const FIRST_MS: f64 = 150.0;
/// Against a client's own clock: how far ours may pass it (its rounding), and
/// for curl how far the least disturbed stream's may be from it (curl's
/// figures also hold its own wake-up and parsing).
const TOL_MS: f64 = 2.0;
/// Tolerance against Node's own clock, for the least disturbed stream: its
/// 'response' callback comes after libuv's read, nghttp2's parse and a turn
/// of its event loop (1.0-1.6 ms after the bytes' arrival here, at least
/// 3.7 ms on a slower CI machine).
const NODE_TOL_MS: f64 = 5.0;

fn ms_of(v: &Value) -> f64 {
    ms(v.as_u64()
        .unwrap_or_else(|| panic!("not a number of ns: {v}")))
}

/// nginx terminating h2 (TLS on `port`, cleartext on `plain`) in front of
/// the tests' LLM server waiting FIRST_MS before each answer. Dropped in
/// field order: nginx before the files it reads.
struct Front {
    port: u16,
    plain: u16,
    _nginx: Nginx,
    _backend: HelperServer,
    _cert: Cert,
}

fn front() -> Front {
    let cert = Cert::new();
    let backend = llm_server(None, FIRST_MS, 10.0, 1);
    let (port, plain) = (free_port(), free_port());
    Front {
        port,
        plain,
        _nginx: nginx_h2(&cert, port, plain, backend.port),
        _backend: backend,
        _cert: cert,
    }
}

/// The client's and the server's records of the connection from client
/// port `cport` (`n` each), paired in the order they started.
fn both_sides<'a>(out: &'a Watched, cport: &Value, n: usize) -> Vec<(&'a Value, &'a Value)> {
    let client = out.requests_on(cport, "outbound");
    let server = out.requests_on(cport, "inbound");
    assert_eq!(client.len(), n, "{:#?}", out.requests);
    assert_eq!(server.len(), n, "{:#?}", out.requests);
    client.into_iter().zip(server).collect()
}

/// An HTTP/2 stream's record: its id and number, no error.
fn is_stream(x: &Value, stream_id: &Value, index: Option<usize>) {
    assert_eq!(x["protocol"], "h2", "{x:#}");
    assert_eq!(&x["stream_id"], stream_id, "{x:#}");
    assert_eq!(x["request_index"], Value::from(index), "{x:#}");
    assert_eq!(x["error"], Value::Null, "{x:#}");
}

/// One curl process: `warm` over HTTP/1.1 on a connection of its own, then
/// `urls` with --http2 on one connection of a fresh curl (its first, so its
/// first bytes are read from its first call): per URL its local port, HTTP
/// version and `time_starttransfer - time_pretransfer` in ms.
fn curl_h2(urls: &[String]) -> Vec<(u64, String, f64)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--http2", "-w"])
        .arg("%{local_port} %{http_version} %{time_pretransfer} %{time_starttransfer}\\n");
    for u in urls {
        cmd.args(["-o", "/dev/null", u]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let t = |i: usize| f[i].parse::<f64>().unwrap();
            (t(0) as u64, f[1].to_owned(), (t(3) - t(2)) * 1000.0)
        })
        .collect()
}

/// Per stream: the client's time to first byte by us held against the
/// client's own clock (`agree_with_clock`: at least the backend's wait, at
/// most its own + TOL_MS, the least disturbed within `tol` ms), the
/// server's inside ours.
fn times_agree(who: &str, pairs: &[(&Value, &Value)], own_ms: &[f64], tol: f64) {
    let ours: Vec<f64> = pairs.iter().map(|(c, _)| ms_of(&c["ttfb_ns"])).collect();
    agree_with_clock(who, &ours, own_ms, FIRST_MS, TOL_MS, tol);
    for (i, ((_, s), ours)) in pairs.iter().zip(&ours).enumerate() {
        let served = ms_of(&s["ttfb_ns"]);
        assert!(
            served >= FIRST_MS && served <= *ours,
            "{who} stream {i}: the server {served:.3} ms, the client by us {ours:.3} ms"
        );
    }
}

/// curl with three URLs on one h2 connection through nginx: three streams
/// (1, 3, 5) on each side, each with its method, path, authority and status;
/// curl's time to first byte per stream at least the backend's wait and at
/// most curl's own + TOL_MS, the least disturbed stream's within TOL_MS of
/// curl's; nginx's inside ours.
#[test]
fn curl_streams_through_nginx_h2_against_curls_clock() {
    let Some(_serial) = begin("http2_curl_nginx", &["openssl", "python3", "nginx", "curl"]) else {
        return;
    };
    let f = front();
    let port = f.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    // nginx started before the observer, curl after it, neither warmed
    // up: the connection is each one's first since the observer started.
    let urls: Vec<String> = (0..3)
        .map(|i| format!("https://127.0.0.1:{port}/item/{i}?q={i}"))
        .collect();
    let own = curl_h2(&urls);
    let out = w.stop();
    assert_eq!(own.len(), 3);
    let cport = own[0].0;
    assert!(
        own.iter().all(|(p, v, _)| *p == cport && v == "2"),
        "one h2 connection: {own:?}"
    );
    let pairs = both_sides(&out, &Value::from(cport), 3);
    for (i, &(c, s)) in pairs.iter().enumerate() {
        for x in [c, s] {
            is_stream(x, &Value::from(2 * i + 1), Some(i + 1));
            assert_eq!(x["method"], "GET");
            assert_eq!(x["path"], format!("/item/{i}"));
            assert_eq!(x["host"], format!("127.0.0.1:{port}"));
            assert_eq!(x["status"], 200);
            assert_eq!(x["content_type"], "text/plain");
            assert_eq!(x["headers_undecodable"], false);
        }
        assert_eq!(c["comm"], "curl");
        assert_eq!(s["comm"], "nginx");
    }
    // curl takes time_pretransfer of a stream on a reused connection around
    // its HEADERS write (ours once 0.03 ms longer): its figure bounds ours
    // only within the tolerance.
    let curls: Vec<f64> = own.iter().map(|o| o.2).collect();
    times_agree("curl", &pairs, &curls, TOL_MS);
    let conn = out
        .records
        .iter()
        .find(|c| c["kind"] == "connection" && c["local_port"] == cport)
        .expect("curl's connection");
    assert_eq!(conn["http2"]["streams"], 3, "{conn:#}");
    assert_eq!(conn["http2"]["resets"], 0, "{conn:#}");
    assert_eq!(out.summary()["http"]["h2_undecodable_headers"], 0);
}

/// Node's http2 module over cleartext h2 (prior knowledge) through nginx:
/// the packet programs' copies, not a TLS library's, on both sides. Six
/// streams each way, with the times of node's own clock (which also holds
/// its event loop's turn: 1.0-1.6 ms on later streams, 9-20 ms on its
/// first, on a quiet machine or with both CPUs spinning; 3.7-15 ms on all
/// of three streams in one CI run) bounding ours, the least disturbed
/// within NODE_TOL_MS.
#[test]
fn node_http2_cleartext_through_nginx() {
    let Some(_serial) = begin("http2_node_h2c", &["openssl", "python3", "nginx", "node"]) else {
        return;
    };
    let f = front();
    let plain = f.plain;
    let w = Watch::start(&["--port", &plain.to_string()]);
    let paths = ["/a", "/b?x=1", "/c", "/d", "/e?y=2", "/f"];
    let own = run_json_lines(
        Command::new("node")
            .arg(helper("h2_client.js"))
            .arg(format!("http://127.0.0.1:{plain}"))
            .args(paths),
    );
    let out = w.stop();
    assert_eq!(own.len(), paths.len(), "{own:?}");
    let pairs = both_sides(&out, &own[0]["local_port"], paths.len());
    for (i, (&(c, s), o)) in pairs.iter().zip(&own).enumerate() {
        let path = paths[i].split('?').next().unwrap();
        for x in [c, s] {
            is_stream(x, &o["stream_id"], Some(i + 1));
            assert_eq!(x["method"], "GET");
            assert_eq!(x["path"], path);
            assert_eq!(x["status"], o["status"]);
            assert_eq!(x["headers_undecodable"], false);
        }
        assert_eq!(c["comm"], "node");
        assert_eq!(c["pid"], o["pid"]);
        assert_eq!(s["comm"], "nginx");
    }
    let nodes: Vec<f64> = own.iter().map(|o| o["ttfb_ms"].as_f64().unwrap()).collect();
    times_agree("node", &pairs, &nodes, NODE_TOL_MS);
}

/// A server of the tests' own (Node's http2, cleartext) that resets a stream
/// mid-answer and sends GOAWAY after another, with Node's http2 client: the
/// reset stream's records say "reset_stream" with its code on both sides,
/// the others are whole, and the connection records count what happened.
#[test]
fn resets_and_goaway_from_a_server_of_our_own() {
    let Some(_serial) = begin("http2_resets", &["node"]) else {
        return;
    };
    let server = HelperServer::spawn(
        Command::new("node")
            .arg(helper("h2_server.js"))
            .args(["0", &FIRST_MS.to_string()]),
    );
    let port = server.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    let own = run_json_lines(
        Command::new("node")
            .arg(helper("h2_client.js"))
            .arg(format!("http://127.0.0.1:{port}"))
            .args(["/ok", "/reset", "/bye"]),
    );
    drop(server);
    let out = w.stop();
    assert_eq!(own.len(), 3, "{own:?}");
    assert_eq!(own[1]["rst_code"], 2, "the client saw the reset: {own:?}");
    let cport = own[0]["local_port"].as_u64().unwrap();
    for direction in ["outbound", "inbound"] {
        let r = out.requests_on(&Value::from(cport), direction);
        assert_eq!(r.len(), 3, "{direction}: {:#?}", out.requests);
        for (x, o) in r.iter().zip(&own) {
            assert_eq!(x["stream_id"], o["stream_id"], "{x:#}");
            assert_eq!(x["path"], o["path"]);
            assert_eq!(x["status"], 200);
        }
        assert_eq!(r[0]["error"], Value::Null);
        assert!(ms_of(&r[0]["ttfb_ns"]) >= FIRST_MS, "{:#}", r[0]);
        assert_eq!(r[1]["error"], "reset_stream", "{:#}", r[1]);
        assert_eq!(r[1]["reset_code"], 2);
        assert_eq!(r[2]["error"], Value::Null, "{:#}", r[2]);
        let port_field = if direction == "outbound" {
            "local_port"
        } else {
            "remote_port"
        };
        let conn = out
            .records
            .iter()
            .find(|c| {
                c["kind"] == "connection" && c["direction"] == direction && c[port_field] == cport
            })
            .unwrap_or_else(|| panic!("{direction} connection: {:#?}", out.records));
        let h2 = &conn["http2"];
        assert_eq!(h2["streams"], 3, "{conn:#}");
        assert_eq!(h2["resets"], 1, "{conn:#}");
        assert!(h2["goaways"].as_u64().unwrap() >= 1, "{conn:#}");
        assert_eq!(h2["undecodable_headers"], 0);
        assert_eq!(h2["out_of_step"], 0);
    }
    let http = &out.summary()["http"];
    assert_eq!(http["h2_undecodable_headers"], 0, "{http}");
    assert_eq!(http["h2_out_of_step"], 0, "{http}");
}

/// Python's httpx with HTTP/2 (the h2 package, over Python's ssl: OpenSSL)
/// through nginx terminating h2: three streams on one connection, each its
/// own record on both sides. httpx's own clock holds its pure-Python h2
/// work around the calls (2.5-7 ms seen), so the closest stream must agree
/// within 8 ms; every stream's ours stays inside its own + TOL_MS.
#[test]
fn httpx_http2_through_nginx() {
    let Some(_serial) = begin("http2_httpx", &["openssl", "python3", "nginx"]) else {
        return;
    };
    let Some(python) = h2_python("http2_httpx") else {
        return;
    };
    let f = front();
    let port = f.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    let own = run_json_lines(
        Command::new(python)
            .arg(helper("httpx_h2.py"))
            .arg(format!("https://localhost:{port}/warm"))
            .arg(format!("https://127.0.0.1:{port}"))
            .args(["/x/1", "/x/2?k=v", "/x/3"]),
    );
    let out = w.stop();
    assert_eq!(own.len(), 3, "{own:?}");
    let cport = &own[0]["local_port"];
    assert!(
        own.iter()
            .all(|o| &o["local_port"] == cport && o["http_version"] == "HTTP/2"),
        "one h2 connection: {own:?}"
    );
    let pairs = both_sides(&out, cport, 3);
    for (i, (&(c, s), o)) in pairs.iter().zip(&own).enumerate() {
        for x in [c, s] {
            is_stream(x, &o["stream_id"], Some(i + 1));
            assert_eq!(x["method"], "GET");
            assert_eq!(x["path"], format!("/x/{}", i + 1));
            assert_eq!(x["host"], format!("127.0.0.1:{port}"));
            assert_eq!(x["status"], o["status"]);
            assert_eq!(x["headers_undecodable"], false);
        }
        assert_eq!(s["comm"], "nginx");
    }
    let own_ms: Vec<f64> = own.iter().map(|o| o["ttfb_ms"].as_f64().unwrap()).collect();
    times_agree("httpx", &pairs, &own_ms, 8.0);
}

/// How far a gRPC call by us may lie inside grpcio's own clock: its Python
/// layer around the call took 1-1.5 ms on a quiet machine; a loaded one adds
/// scheduling.
const GRPC_SLACK_MS: f64 = 10.0;

/// `ours` (ms) at least the injected `floor`, at most `own` + 1 ms (clock
/// reads), and no more than GRPC_SLACK_MS under it.
fn inside(what: &str, ours: f64, floor: f64, own: f64) {
    eprintln!("{what}: ours {ours:.3} ms, injected {floor} ms, grpcio's {own:.3} ms");
    assert!(
        ours >= floor && ours <= own + 1.0 && own - ours <= GRPC_SLACK_MS,
        "{what}: ours {ours:.3} ms, injected {floor} ms, grpcio's own {own:.3} ms"
    );
}

/// grpcio client and server (cleartext h2 on loopback: the packet
/// programs' copies), one channel: a unary call the server answers after
/// 30 ms, a server-streaming call (first message after 200 ms, four more
/// 50 ms apart) and a call that fails NOT_FOUND with a message. Each is a
/// record with an `rpc` object on both sides: service, method, status and
/// message, messages each way, and times inside grpcio's own clock.
#[test]
fn grpcio_unary_streaming_and_failing_calls() {
    let Some(_serial) = begin("http2_grpcio", &["python3"]) else {
        return;
    };
    let Some(python) = h2_python("http2_grpcio") else {
        return;
    };
    let server = HelperServer::spawn(
        Command::new(&python)
            .arg(helper("grpc_pair.py"))
            .arg("server"),
    );
    let port = server.port;
    let w = Watch::start(&["--port", &port.to_string()]);
    let own = run_json_lines(
        Command::new(&python)
            .arg(helper("grpc_pair.py"))
            .args(["client", &port.to_string()]),
    );
    let out = w.stop();
    drop(server);
    assert_eq!(own.len(), 1, "{own:?}");
    let own = &own[0];
    assert_eq!(own["stream"]["messages"], 5, "{own}");
    assert_eq!(own["fail"]["code"], "NOT_FOUND", "{own}");
    let own_ms = |call: &str, key: &str| ms_of(&own[call][key]);
    for (direction, port_field) in [("outbound", "remote_port"), ("inbound", "local_port")] {
        let mut calls: Vec<&Value> = out
            .requests
            .iter()
            .filter(|r| r["direction"] == direction && r[port_field] == port)
            .collect();
        calls.sort_by_key(|r| r["stream_id"].as_u64());
        let paths: Vec<&Value> = calls.iter().map(|r| &r["path"]).collect();
        assert_eq!(
            paths,
            [
                "/observer.test.Echo/Unary",
                "/observer.test.Echo/Stream",
                "/observer.test.Echo/Fail"
            ],
            "{direction}: {:#?}",
            out.requests
        );
        for (x, method) in calls.iter().zip(["Unary", "Stream", "Fail"]) {
            assert_eq!(x["protocol"], "h2", "{x:#}");
            assert_eq!(x["status"], 200, "{x:#}");
            assert_eq!(x["content_type"], "application/grpc", "{x:#}");
            assert_eq!(x["error"], Value::Null, "{x:#}");
            let rpc = &x["rpc"];
            assert_eq!(rpc["system"], "grpc", "{x:#}");
            assert_eq!(rpc["service"], "observer.test.Echo", "{x:#}");
            assert_eq!(rpc["method"], method, "{x:#}");
            assert_eq!(rpc["request_messages"], 1, "{x:#}");
        }
        let (unary, stream, fail) = (&calls[0]["rpc"], &calls[1]["rpc"], &calls[2]["rpc"]);
        assert_eq!(unary["grpc_status"], 0);
        assert_eq!(unary["response_messages"], 1);
        assert_eq!(stream["grpc_status"], 0);
        assert_eq!(stream["response_messages"], 5);
        assert_eq!(fail["grpc_status"], 5);
        assert_eq!(fail["grpc_message"], "no such thing: café");
        assert_eq!(fail["response_messages"], 0);
        assert_eq!(fail["time_to_first_message_ns"], Value::Null);
        if direction == "outbound" {
            inside(
                "unary",
                ms_of(&calls[0]["duration_ns"]),
                30.0,
                own_ms("unary", "ns"),
            );
            inside(
                "stream, first message",
                ms_of(&stream["time_to_first_message_ns"]),
                200.0,
                own_ms("stream", "first_ns"),
            );
            inside(
                "stream",
                ms_of(&calls[1]["duration_ns"]),
                400.0,
                own_ms("stream", "ns"),
            );
            inside(
                "fail",
                ms_of(&calls[2]["duration_ns"]),
                20.0,
                own_ms("fail", "ns"),
            );
        }
    }
    // The server's view of each call lies inside the client's.
    for method in ["Unary", "Stream", "Fail"] {
        let path = Value::from(format!("/observer.test.Echo/{method}"));
        let of = |dir: &str| {
            out.requests
                .iter()
                .find(|r| r["direction"] == dir && r["path"] == path)
                .map(|r| ms_of(&r["duration_ns"]))
                .unwrap()
        };
        assert!(of("inbound") <= of("outbound"), "{method}");
    }
}

/// HTTP/2 connections begun before the observer started (httpx: one over
/// TLS, one cleartext with prior knowledge, both through nginx), each used
/// once before and four times after. The first packet after the start
/// adopts a connection; a TLS one's process gets its per-call probes at its
/// first socket call then (15-22 ms to attach), so the first request after
/// may be missed: the last three streams must be records on both sides,
/// timed inside httpx's own clock, not numbered; a header block either
/// decodes to what was sent or is marked undecodable (HPACK entries the
/// earlier requests added were never seen), never guessed. The client's
/// connection records say `began_before_observer`.
#[test]
fn connections_begun_before_the_observer() {
    let Some(_serial) = begin("http2_before", &["openssl", "python3", "nginx"]) else {
        return;
    };
    let Some(python) = h2_python("http2_before") else {
        return;
    };
    let f = front();
    let (port, plain) = (f.port, f.plain);
    let mut client = Command::new(python)
        .arg(helper("pooled_h2.py"))
        .arg(format!("https://127.0.0.1:{port}"))
        .arg(format!("http://127.0.0.1:{plain}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "READY");
    let w = Watch::start(&["--port", &port.to_string(), "--port", &plain.to_string()]);
    writeln!(client.stdin.take().unwrap(), "go").unwrap();
    let own: Vec<Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert!(client.wait().unwrap().success());
    let out = w.stop();
    assert_eq!(own.len(), 8, "{own:?}");
    for name in ["tls", "plain"] {
        let mine: Vec<&Value> = own.iter().filter(|o| o["client"] == name).collect();
        let cport = &mine[0]["local_port"];
        assert!(mine.iter().all(|o| &o["local_port"] == cport), "{own:?}");
        let mine = &mine[1..];
        // The first request after the start may be missed (above).
        let later = |dir: &str| -> Vec<&Value> {
            let r = out.requests_on(cport, dir);
            r.into_iter()
                .filter(|x| mine.iter().any(|o| o["stream_id"] == x["stream_id"]))
                .collect()
        };
        let (client, server) = (later("outbound"), later("inbound"));
        assert_eq!(client.len(), 3, "{name}: {:#?}", out.requests);
        assert_eq!(server.len(), 3, "{name}: {:#?}", out.requests);
        let pairs: Vec<(&Value, &Value)> = client.into_iter().zip(server).collect();
        for (i, (&(c, s), o)) in pairs.iter().zip(mine).enumerate() {
            for x in [c, s] {
                is_stream(x, &o["stream_id"], None);
                let path = format!("/after/{}", i + 1);
                if x["headers_undecodable"] == false {
                    assert_eq!(x["path"], path, "{x:#}");
                    assert_eq!(x["status"], 200, "{x:#}");
                } else {
                    // Not decoded whole: what the static table and literals
                    // tell is kept, the rest null, never a wrong value.
                    assert!(x["path"].is_null() || x["path"] == path, "{x:#}");
                    assert!(x["status"].is_null() || x["status"] == 200, "{x:#}");
                }
            }
            assert_eq!(s["comm"], "nginx");
        }
        let own_ms: Vec<f64> = mine
            .iter()
            .map(|o| o["ttfb_ms"].as_f64().unwrap())
            .collect();
        times_agree(name, &pairs, &own_ms, 8.0);
        let conn = out
            .records
            .iter()
            .find(|r| r["kind"] == "connection" && &r["local_port"] == cport)
            .unwrap_or_else(|| panic!("{name}: no connection record: {:#?}", out.records));
        assert_eq!(conn["began_before_observer"], true, "{conn:#}");
        assert_eq!(conn["direction"], "outbound", "{conn:#}");
        assert_eq!(conn["connect_ns"], Value::Null, "{conn:#}");
    }
    let adopted = &out.summary()["adopted_midstream"];
    assert!(adopted.as_u64().unwrap() >= 4, "{adopted}");
}

/// The official `openai` SDK streaming chat completions over HTTP/2 (its
/// httpx transport with `http2=True`) to nginx terminating h2, which
/// proxies to the tests' OpenAI-compatible server over HTTP/1.1 without
/// buffering: each of the SDK's calls is an h2 stream record with its
/// `gen_ai` (models, usage, finish reason) and `stream`, its first byte and
/// first token at least the backend's wait and at most the SDK's own clock
/// plus TOL_MS, the closest of three within 10 ms of it, and nginx's own
/// record of the stream inside the SDK's. The SDK stops reading an h2
/// stream at `[DONE]`; its last call is whole all the same.
#[test]
fn openai_sdk_over_http2_through_nginx() {
    let test = "http2_openai_sdk";
    let Some(_serial) = begin(test, &["openssl", "python3", "nginx", "curl"]) else {
        return;
    };
    let Some(python) = openai_python(test) else {
        return;
    };
    let cert = Cert::new();
    let backend = llm_server(None, FIRST_MS, 20.0, 4);
    let port = free_port();
    let d = cert.dir.display();
    let _nginx = Nginx::start(
        &cert.dir,
        &format!(
            " server {{\n  listen 127.0.0.1:{port} ssl http2;\n\
             ssl_certificate {d}/cert.pem;\n  ssl_certificate_key {d}/key.pem;\n\
             location / {{ proxy_pass http://127.0.0.1:{}; proxy_http_version 1.1;\n\
             proxy_buffering off; }}\n }}\n",
            backend.port
        ),
        port,
    );
    let w = Watch::start(&[
        "--port",
        &port.to_string(),
        "--port",
        &backend.port.to_string(),
    ]);
    // nginx made its TLS context before the observer started: its per-call
    // probes come at its first TLS session after (15-22 ms to attach), which
    // this warm-up is.
    let warm = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            &format!("https://127.0.0.1:{port}/warm"),
        ])
        .status()
        .unwrap();
    assert!(warm.success());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let own = run_json_lines(
        Command::new(&python)
            .arg(helper("openai_client.py"))
            .args(["--port", &port.to_string(), "--http2"])
            .args(["--model", "h2-a", "--model", "h2-b", "--model", "h2-c"]),
    );
    let out = w.stop();
    assert_eq!(own.len(), 3, "{own:?}");
    let (mut ttfbs, mut ttfts) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for (o, model) in own.iter().zip(["h2-a", "h2-b", "h2-c"]) {
        let r: Vec<&Value> = out
            .requests
            .iter()
            .filter(|r| r["gen_ai"]["request_model"] == model)
            .collect();
        let c = r
            .iter()
            .find(|x| x["direction"] == "outbound" && x["protocol"] == "h2")
            .unwrap_or_else(|| panic!("{model}: the SDK's record: {r:#?}"));
        // The SDK's (h2), nginx's (h2), nginx's to the backend and the
        // backend's (HTTP/1.1).
        assert_eq!(r.len(), 4, "{model}: {r:#?}");
        assert_eq!(c["comm"], "python", "{c:#}");
        assert_eq!(c["protocol"], "h2", "{c:#}");
        assert_eq!(c["local_port"], o["local_port"], "{c:#}");
        assert_eq!(c["path"], "/v1/chat/completions");
        assert_eq!(c["status"], 200);
        assert_eq!(c["error"], Value::Null, "{c:#}");
        let g = &c["gen_ai"];
        assert_eq!(g["provider"], "openai");
        assert_eq!(g["operation"], "chat");
        assert_eq!(g["response_model"], o["response_model"], "{c:#}");
        assert_eq!(g["input_tokens"], o["usage"]["input"], "{c:#}");
        assert_eq!(g["output_tokens"], o["usage"]["output"], "{c:#}");
        assert_eq!(g["finish_reason"], o["finish_reason"], "{c:#}");
        assert!(c["stream"]["events"].as_u64().unwrap() >= 4, "{c:#}");
        let (ttfb, ttft) = (ms_of(&c["ttfb_ns"]), ms_of(&g["time_to_first_token_ns"]));
        let (own_ttfb, own_ttft) = (
            o["ttfb_ms"].as_f64().unwrap(),
            o["ttft_ms"].as_f64().unwrap(),
        );
        ttfbs.0.push(ttfb);
        ttfbs.1.push(own_ttfb);
        ttfts.0.push(ttft);
        ttfts.1.push(own_ttft);
        let served = r
            .iter()
            .find(|x| x["direction"] == "inbound" && x["protocol"] == "h2")
            .unwrap_or_else(|| panic!("{model}: nginx's record: {r:#?}"));
        assert_eq!(served["comm"], "nginx");
        assert!(ms_of(&served["ttfb_ns"]) <= ttfb, "{served:#}");
    }
    // The SDK's own clock (each chunk at the socket read that brought it;
    // helpers/openai_client.py) also holds building the request and its
    // pure-Python h2 encoding (the first call also its connection's
    // set-up): the closest call must agree within 10 ms.
    for (what, (ours, own)) in [("SDK first byte", &ttfbs), ("SDK first token", &ttfts)] {
        agree_with_clock(what, ours, own, FIRST_MS, TOL_MS, 10.0);
    }
}
