//! Connection pools, end to end: three Python clients of one keep-alive
//! backend, each with its own habit (`tests/helpers/pool_client.py`): one
//! that reuses one connection, one that opens and closes a connection per
//! request, and one that leaks (opens a connection per request and never
//! closes it). Every figure is checked against the clients' own counts of
//! requests and of connections they opened and closed: the Prometheus
//! series, the pool records of `--pools`, `observer top --by pool` in a
//! terminal, and `observer diagnose` (from the recorded stream and live),
//! which names the leaking client and no other.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{
    tmux::{row_of, table, Tmux},
    *,
};

/// Requests each client sends, one every INTERVAL_MS.
const COUNT: u64 = 20;
const INTERVAL_MS: u64 = 250;

/// A running pool_client.py; what it said of itself once done.
struct Client {
    child: Child,
    mode: &'static str,
}

impl Client {
    fn start(mode: &'static str, port: u16) -> Client {
        let child = Command::new("python3")
            .arg(helper("pool_client.py"))
            .args([mode, &port.to_string(), &COUNT.to_string()])
            .arg(INTERVAL_MS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Client { child, mode }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its counts, once it sent every request (it then holds its
    /// connections until [`Client::end`]).
    fn done(&mut self) -> Value {
        let mut line = String::new();
        BufReader::new(self.child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{} client said {line:?}: {e}", self.mode));
        assert_eq!(v["requests"], COUNT, "{v}");
        v
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The three clients against `port`, started together, once all are done
/// and their own counts checked; with their pids (by mode).
fn three_clients(port: u16) -> (HashMap<&'static str, Client>, HashMap<&'static str, String>) {
    let mut clients: HashMap<&'static str, Client> = ["reuse", "new", "leak"]
        .into_iter()
        .map(|m| (m, Client::start(m, port)))
        .collect();
    let said = clients.iter_mut().map(|(m, c)| (*m, c.done())).collect();
    check_counts(&said);
    let pids = clients
        .iter()
        .map(|(m, c)| (*m, c.pid().to_string()))
        .collect();
    (clients, pids)
}

fn backend() -> HelperServer {
    HelperServer::spawn(
        Command::new("python3")
            .arg(helper("delay_backend.py"))
            .args(["--delay-ms", "0"]),
    )
}

/// The clients' own counts, as the pools must show them.
fn check_counts(said: &HashMap<&str, Value>) {
    assert_eq!(said["reuse"]["opened"], 1, "{said:?}");
    assert_eq!(said["new"]["opened"], COUNT, "{said:?}");
    assert_eq!(said["new"]["closed"], COUNT, "{said:?}");
    assert_eq!(said["leak"]["opened"], COUNT, "{said:?}");
    assert_eq!(said["leak"]["closed"], 0, "{said:?}");
    assert_eq!(
        said["leak"]["open_ports"].as_array().unwrap().len() as u64,
        COUNT
    );
}

/// `observer run --pools`: the Prometheus series and the pool records
/// agree with each client's counts; `diagnose --from` the recorded stream
/// names the leak.
#[test]
fn metrics_and_records_show_each_clients_pool() {
    let Some(_serial) = begin("pools_metrics", &["python3"]) else {
        return;
    };
    let server = backend();
    let prom = free_port();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--pools", "--prometheus-listen"])
        .arg(format!("127.0.0.1:{prom}"))
        .args([
            "--port",
            &server.port.to_string(),
            "--direction",
            "outbound",
        ]);
    let run = Watch::spawn(cmd);
    let (clients, pids) = three_clients(server.port);
    let pid = |m: &str| pids[m].clone();
    let label = |m: &str| format!("process_pid=\"{}\"", pid(m));
    // Open and idle come from the table's census, once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        let (_, _, body) = http_request(([127, 0, 0, 1], prom).into(), "GET", "/metrics").unwrap();
        let open = |m: &str| series(&body, "observer_pool_connections_open", &[&label(m)]);
        if open("leak") == Some(COUNT as f64) && open("reuse") == Some(1.0)
            || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let get = |name: &str, m: &str, extra: &[&str]| {
        let l = label(m);
        let mut labels = vec![l.as_str()];
        labels.extend_from_slice(extra);
        series(&metrics, name, &labels)
            .unwrap_or_else(|| panic!("no {name} for the {m} client {labels:?}:\n{metrics}"))
    };
    let n = COUNT as f64;
    for (m, open, idle) in [("reuse", 1.0, 1.0), ("new", 0.0, 0.0), ("leak", n, n)] {
        assert_eq!(get("observer_pool_connections_open", m, &[]), open, "{m}");
        assert_eq!(get("observer_pool_connections_idle", m, &[]), idle, "{m}");
        assert_eq!(get("observer_pool_connections_busy", m, &[]), 0.0, "{m}");
    }
    // The counters are per executable and peer: the three clients' sums.
    let peer = format!("network_peer_port=\"{}\"", server.port);
    // The executable's file name (python3.11 here).
    let exe = "process_executable_name=\"python3";
    let total = |name: &str, extra: &[&str]| {
        let mut labels = vec![peer.as_str(), exe];
        labels.extend_from_slice(extra);
        series(&metrics, name, &labels)
            .unwrap_or_else(|| panic!("no {name} {labels:?}:\n{metrics}"))
    };
    let requests = "observer_pool_requests_total";
    assert_eq!(
        total(requests, &["connection=\"new\""]),
        1.0 + 2.0 * n,
        "a connection for the reusing client, one per request for the others"
    );
    assert_eq!(total(requests, &["connection=\"reused\""]), n - 1.0);
    // Closed so far: the per-request client's, each by the client itself
    // after one request.
    let closes = "observer_pool_connection_closes_total";
    assert_eq!(total(closes, &["closed_by=\"client\""]), n);
    for by in ["server", "reset", "goaway"] {
        let l = format!("closed_by=\"{by}\"");
        assert_eq!(series(&metrics, closes, &[&peer, exe, &l]), None, "{by}");
    }
    assert_eq!(total("observer_pool_connection_requests_count", &[]), n);
    assert_eq!(total("observer_pool_connection_requests_sum", &[]), n);
    assert_eq!(total("observer_pool_connection_age_seconds_count", &[]), n);
    // Stopped before the clients end: the stream ends with the leak open.
    let watched = run.stop();
    drop(clients);
    let pools: Vec<&Value> = watched
        .records
        .iter()
        .filter(|r| r["kind"] == "pool")
        .collect();
    let last = |m: &str| {
        pools
            .iter()
            .rev()
            .find(|r| r["pid"].as_u64() == pid(m).parse().ok())
            .unwrap_or_else(|| panic!("no pool record of the {m} client: {pools:#?}"))
    };
    for (m, open, new_share) in [("reuse", 1, 1.0 / n), ("new", 0, 1.0), ("leak", COUNT, 1.0)] {
        let r = last(m);
        assert_eq!(r["open"], open, "{m}: {r}");
        assert_eq!(r["requests"], COUNT, "{m}: {r}");
        assert_eq!(r["peer_port"], server.port, "{m}: {r}");
        assert_eq!(r["comm"], "python3", "{m}: {r}");
        let share = r["new_connection_share"].as_f64().unwrap();
        assert!((share - new_share).abs() < 1e-9, "{m}: {r}");
    }
    let new = last("new");
    assert_eq!(new["closed"]["client"], COUNT, "{new}");
    assert_eq!(new["requests_per_connection"], 1.0, "{new}");
    assert!(new["age_at_close_ns"].as_u64().unwrap() > 0, "{new}");
    // The leak grew record after record.
    let leak_open: Vec<u64> = pools
        .iter()
        .filter(|r| r["pid"].as_u64() == pid("leak").parse().ok())
        .map(|r| r["open"].as_u64().unwrap())
        .collect();
    assert!(leak_open.windows(2).all(|w| w[0] <= w[1]), "{leak_open:?}");
    assert!(leak_open.len() >= 4, "{leak_open:?}");

    // diagnose --from the recorded stream: the leak, and only it.
    let file = std::env::temp_dir().join(format!("observer-pools-{}.jsonl", std::process::id()));
    let text: String = watched
        .records
        .iter()
        .chain(&watched.requests)
        .map(|r| format!("{r}\n"))
        .collect();
    std::fs::write(&file, text).unwrap();
    let out = Command::new(observer_bin())
        .args(["diagnose", "--json", "--from"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{out:?}");
    let leaks = leaks_in(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert_eq!(leaks[0]["pid"].to_string(), pid("leak"), "{leaks:#?}");
    assert_eq!(leaks[0]["peer_port"], server.port);
    assert!(
        leaks[0]["open_last"].as_u64().unwrap() >= COUNT - 1,
        "{leaks:#?}"
    );
}

fn leaks_in(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "pool_leak")
        .collect()
}

/// `observer top --by pool` in a terminal shows each client's pool; a live
/// `observer diagnose` names the leak.
#[test]
fn top_shows_each_pool_and_live_diagnose_names_the_leak() {
    let Some(_serial) = begin("pools_top", &["python3", "tmux"]) else {
        return;
    };
    let server = backend();
    let shell = format!(
        "{} top --by pool --window 60 --port {}; echo \"top exited $?\"; sleep 600",
        observer_bin().display(),
        server.port,
    );
    let tmux = Tmux::start(&shell);
    tmux.wait("the pool view, live", 60, |s| {
        s.first()
            .is_some_and(|l| l.contains("by pool") && l.ends_with("| live"))
    });
    let (clients, pids) = three_clients(server.port);
    let pid = |m: &str| pids[m].clone();
    let want = |rows: &[HashMap<String, String>], m: &str, open: u64, new_pct: u64| {
        row_of(rows, "PID", &pid(m)).is_some_and(|r| {
            r["OPEN"] == open.to_string()
                && r["IDLE"] == open.to_string()
                && r["NEW%"] == new_pct.to_string()
        })
    };
    let screen = tmux.wait("each client's pool", 10, |s| {
        let rows = table(s);
        want(&rows, "leak", COUNT, 100)
            && want(&rows, "reuse", 1, 100 / COUNT)
            && want(&rows, "new", 0, 100)
    });
    let rows = table(&screen);
    let new = row_of(&rows, "PID", &pid("new")).unwrap();
    assert_eq!(new["CLOSED"], COUNT.to_string(), "{screen:#?}");
    assert_eq!(new["PEER"], format!("127.0.0.1:{}", server.port));
    // The leak sorts first (most open).
    assert_eq!(rows[0]["PID"], pid("leak"), "{screen:#?}");
    tmux.type_text("q");
    tmux.wait("top to exit", 15, |s| s.iter().any(|l| l == "top exited 0"));
    drop(clients);
    drop(tmux);

    // Live: the leak grows while diagnose watches.
    let mut cmd = Command::new(observer_bin());
    cmd.args(["diagnose", "--json", "--duration", "6", "--port"])
        .arg(server.port.to_string());
    let diagnose = Watch::spawn(cmd);
    let leak = Client::start("leak", server.port);
    let steady = Client::start("reuse", server.port);
    let watched = diagnose.finish();
    let leaks: Vec<&Value> = watched
        .records
        .iter()
        .filter(|v| v["kind"] == "pool_leak")
        .collect();
    assert_eq!(leaks.len(), 1, "{:#?}", watched.records);
    assert_eq!(leaks[0]["pid"], leak.pid(), "{leaks:#?}");
    let (first, last) = (
        leaks[0]["open_first"].as_u64().unwrap(),
        leaks[0]["open_last"].as_u64().unwrap(),
    );
    assert!(last >= first + 5, "{leaks:#?}");
    // Its rate as the client set it (the second half's ends after its
    // last request).
    let rate = leaks[0]["requests_per_second_first"].as_f64().unwrap();
    let expected = 1000.0 / INTERVAL_MS as f64;
    assert!(
        (rate - expected).abs() <= 1.5,
        "{rate} vs {expected}: {leaks:#?}"
    );
    drop(steady);
}
