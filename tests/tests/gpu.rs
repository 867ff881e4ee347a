//! GPU state through a test build of NVML (tests/nvml-stub: the C functions
//! observer calls, loaded through the same `--nvml-lib` path users use, values
//! set by the test per device and per process over time).
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use serde_json::{json, Value};
use tests::*;

/// A stub config file; `set` rewrites it atomically (the stub re-reads it
/// when it changes).
struct StubConfig(PathBuf);

impl StubConfig {
    fn new(v: &Value) -> StubConfig {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "observer-nvml-{}-{}.json",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let c = StubConfig(p);
        c.set(v);
        c
    }

    fn set(&self, v: &Value) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, v.to_string()).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for StubConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `observer watch` of `port`'s connections with the stub NVML, sampled
/// every 50 ms.
fn watch_with_stub(port: u16, cfg: &StubConfig) -> Watch {
    let stub = nvml_stub();
    Watch::start_with_env(
        &[
            "--port",
            &port.to_string(),
            "--nvml-lib",
            stub.to_str().unwrap(),
            "--gpu-interval",
            "50",
        ],
        &[("NVML_STUB_CONFIG", cfg.0.to_str().unwrap())],
    )
}

fn devices(gpu_pid: u32, util: u32) -> Value {
    json!({"devices": [
        {"uuid": "GPU-00000000-aaaa", "name": "Stub H200", "util_gpu": util, "util_mem": 10,
         "mem_used": 1_048_576_000u64, "mem_total": 8_388_608_000u64, "temp": 50, "power_mw": 120_500,
         "sm_clock": 1500, "processes": [{"pid": gpu_pid, "used_memory": 524_288_000u64, "sm_util": util}]},
        {"uuid": "GPU-00000001-bbbb", "name": "Stub H200", "util_gpu": 5, "mem_total": 8_388_608_000u64},
        {"error": "gpu_lost"}
    ]})
}

#[test]
fn gpu_snapshot_two_devices_and_one_that_errors() {
    let cfg = StubConfig::new(&devices(4242, 40));
    let out = Command::new(observer_bin())
        .args(["gpu", "--json", "--nvml-lib"])
        .arg(nvml_stub())
        .env("NVML_STUB_CONFIG", &cfg.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = v.as_array().unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(d[0]["index"], 0);
    assert_eq!(d[0]["uuid"], "GPU-00000000-aaaa");
    assert_eq!(d[0]["name"], "Stub H200");
    assert_eq!(d[0]["utilization_gpu_pct"], 40);
    assert_eq!(d[0]["utilization_memory_pct"], 10);
    assert_eq!(d[0]["memory_used_bytes"], 1_048_576_000u64);
    assert_eq!(d[0]["memory_total_bytes"], 8_388_608_000u64);
    assert_eq!(d[0]["temperature_c"], 50);
    assert_eq!(d[0]["power_w"], 120.5);
    assert_eq!(
        d[0]["processes"],
        json!([{"pid": 4242, "used_memory_bytes": 524_288_000u64, "sm_util_pct": 40, "mem_util_pct": 0}])
    );
    assert_eq!(d[1]["processes"], json!([]));
    assert_eq!(d[1]["error"], Value::Null);
    // The lost device costs only itself.
    assert!(d[2]["error"].as_str().unwrap().contains("bus"), "{}", d[2]);
    assert_eq!(d[2]["uuid"], Value::Null);
    // doctor reports the same library's devices.
    if require_root("gpu_doctor") {
        let out = Command::new(observer_bin())
            .args(["doctor", "--json", "--nvml-lib"])
            .arg(nvml_stub())
            .env("NVML_STUB_CONFIG", &cfg.0)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["gpu"]["devices"], 3, "{}", v["gpu"]);
    }
}

#[test]
fn without_nvml_gpu_features_are_off_and_the_rest_runs() {
    let out = Command::new(observer_bin())
        .args(["gpu", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("NVML could not be loaded") && err.contains("GPU features are off"),
        "{err}"
    );
    let Some(_serial) = begin("gpu_off", &[]) else {
        return;
    };
    let w = Watch::start(&[
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
        "--port",
        "1",
    ]);
    let ready = w
        .stderr_seen()
        .iter()
        .find(|l| l.starts_with("ready"))
        .cloned()
        .unwrap();
    assert!(ready.contains("GPU: off"), "{ready}");
    let out = w.stop();
    assert!(out.records.iter().all(|r| r["gpu"].is_null()));
}

/// A server that holds a GPU context answers slowly; its GPU's utilization
/// goes from 10% to 90% during the request: the server's record carries the
/// device and both values, the client's record carries none.
#[test]
fn a_gpu_servers_records_carry_its_gpu_during_the_request() {
    let Some(_serial) = begin("gpu_join", &["python3"]) else {
        return;
    };
    let server = HelperServer::spawn(Command::new("python3").arg(helper("server.py")).args([
        "--delay-ms",
        "800",
        "--response-bytes",
        "100",
    ]));
    let cfg = StubConfig::new(&devices(server.pid(), 10));
    let w = watch_with_stub(server.port, &cfg);
    std::thread::sleep(Duration::from_millis(300));
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.write_all(b"request").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cfg.set(&devices(server.pid(), 90));
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let client_port = s.local_addr().unwrap().port();
    drop(s);
    let out = w.stop();
    let inbound = out
        .records
        .iter()
        .find(|r| r["direction"] == "inbound" && r["remote_port"] == json!(client_port))
        .unwrap();
    assert_eq!(inbound["pid"], server.pid());
    let g = &inbound["gpu"]["devices"];
    assert_eq!(
        g.as_array().unwrap().len(),
        1,
        "only the device it holds a context on: {inbound:#}"
    );
    let d = &g[0];
    assert_eq!(d["uuid"], "GPU-00000000-aaaa");
    assert_eq!(d["utilization_gpu_pct_max"], 90, "{d}");
    let avg = d["utilization_gpu_pct_avg"].as_f64().unwrap();
    assert!(
        avg > 10.0 && avg < 90.0,
        "both values during the request: {avg}"
    );
    assert_eq!(d["memory_total_bytes"], 8_388_608_000u64);
    assert_eq!(d["process_used_memory_bytes"], 524_288_000u64);
    let outbound = out
        .records
        .iter()
        .find(|r| r["direction"] == "outbound" && r["local_port"] == json!(client_port))
        .unwrap();
    assert!(
        outbound["gpu"].is_null(),
        "the client holds no GPU: {outbound:#}"
    );
}

/// GPU gauges reach the Prometheus endpoint (and so OTLP, from the same
/// metrics), per device by `hw.id` and per process.
#[test]
fn gpu_metrics_on_the_prometheus_endpoint() {
    let Some(_serial) = begin("gpu_metrics", &["curl"]) else {
        return;
    };
    let cfg = StubConfig::new(&devices(std::process::id(), 40));
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(observer_bin())
        .args([
            "run",
            "--json",
            "--duration",
            "3",
            "--gpu-interval",
            "50",
            "--port",
            "1",
        ])
        .args(["--prometheus-listen", &listen, "--nvml-lib"])
        .arg(nvml_stub())
        .env("NVML_STUB_CONFIG", &cfg.0)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("ready") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0,
            "no ready line"
        );
    }
    assert!(line.contains("GPU: on (3 devices through NVML)"), "{line}");
    std::thread::sleep(Duration::from_millis(1500));
    let text = String::from_utf8(
        Command::new("curl")
            .args(["-s", &format!("http://{listen}/metrics")])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        text.contains("hw_gpu_utilization{hw_id=\"GPU-00000000-aaaa\"} 0.4"),
        "{text}"
    );
    assert!(
        text.contains("hw_gpu_memory_limit{hw_id=\"GPU-00000000-aaaa\"} 8388608000"),
        "{text}"
    );
    assert!(
        text.contains("hw_errors{error_type=\"unavailable\",hw_id=\"index-2\"} 1"),
        "the lost device: {text}"
    );
    assert!(
        text.contains("observer_gpu_process_memory_usage{hw_id=\"GPU-00000000-aaaa\",process_executable_name=\"gpu-"),
        "this test process's GPU memory: {text}"
    );
}

/// One plain HTTP/1.1 request for `model` (not streamed) on `s`; returns
/// once the whole answer is read.
fn ask(s: &mut TcpStream, model: &str) {
    let body = format!(r#"{{"model":"{model}","stream":false,"messages":[]}}"#);
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gpu.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the server closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a Content-Length");
            if rest.len() >= len {
                return;
            }
        }
    }
}

/// An inference server holding a GPU answers two requests on one kept-alive
/// connection; its GPU's utilization goes from 10% to 90% during the first
/// and is 30% through the second: each of the server's request records
/// carries what the GPU did during that request only; the client's
/// (this test, which holds no GPU) carry none.
#[test]
fn each_request_of_an_inference_server_carries_its_gpu() {
    let Some(_serial) = begin("gpu_requests", &["python3"]) else {
        return;
    };
    let server = llm_server(None, 600.0, 0.0, 2);
    let cfg = StubConfig::new(&devices(server.pid(), 10));
    let w = watch_with_stub(server.port, &cfg);
    std::thread::sleep(Duration::from_millis(300));
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    // The first request, and the change of utilization while it waits.
    std::thread::scope(|scope| {
        let asking = scope.spawn(|| ask(&mut s, "first"));
        std::thread::sleep(Duration::from_millis(300));
        cfg.set(&devices(server.pid(), 90));
        asking.join().unwrap();
    });
    cfg.set(&devices(server.pid(), 30));
    std::thread::sleep(Duration::from_millis(300));
    ask(&mut s, "second");
    drop(s);
    let out = w.stop();
    let of = |model: &str, direction: &str| out.request_of_model(model, direction);
    let device = |r: &Value| -> Value {
        let d = r["gpu"]["devices"]
            .as_array()
            .unwrap_or_else(|| panic!("no gpu: {r:#}"));
        assert_eq!(d.len(), 1, "only the device it holds a context on: {r:#}");
        d[0].clone()
    };
    let first = device(of("first", "inbound"));
    assert_eq!(first["uuid"], "GPU-00000000-aaaa");
    assert_eq!(first["utilization_gpu_pct_max"], 90, "{first}");
    let avg = first["utilization_gpu_pct_avg"].as_f64().unwrap();
    assert!(
        avg > 10.0 && avg < 90.0,
        "both values during the first: {avg}"
    );
    let second = device(of("second", "inbound"));
    assert_eq!(second["utilization_gpu_pct_max"], 30, "{second}");
    assert_eq!(second["utilization_gpu_pct_avg"], 30.0, "{second}");
    assert_eq!(of("second", "inbound")["request_index"], 2);
    for model in ["first", "second"] {
        let client = of(model, "outbound");
        assert!(
            client["gpu"].is_null(),
            "the client holds no GPU: {client:#}"
        );
    }
}
