//! `kill -9` of the observer under load, then a restart (a crash, an OOM
//! kill, a node agent's hard restart): nothing of the killed one stays in
//! the kernel (its programs and their links, its uprobe events), no process
//! it held at exec stays stopped, and connections opened before the restart
//! (HTTP/1.1 keep-alive, h2 in clear and over TLS) get their later requests
//! recorded by the new one.
//!
//! What an adopted TLS connection can and cannot give: its plaintext is read
//! by per-call probes, which its process gets at its first socket call after
//! the start (15-22 ms to attach), so the first request after the restart
//! may be missed; the handshake is over, so no TLS timing, version or
//! server name; an h2 connection's HPACK table holds entries added before,
//! so a header block may be undecodable (marked so, never guessed).

#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{BufRead, BufReader, Lines, Write},
    process::{ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{programs::*, *};

/// The client's lines up to `DONE tag`, parsed.
fn answers(lines: &mut Lines<BufReader<ChildStdout>>, tag: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l == format!("DONE {tag}") {
            return out;
        }
        out.push(serde_json::from_str(&l).unwrap());
    }
    panic!("the client ended before DONE {tag}");
}

/// Processes named `comm` stopped (state T) now and still a while later:
/// held at exec by an observer that is gone.
fn left_stopped(comm: &str) -> Vec<u32> {
    let stopped = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // "pid (comm) S ..."
                stat.split_once(") ")
                    .is_some_and(|(head, rest)| head.ends_with(comm) && rest.starts_with('T'))
            })
            .collect()
    };
    let first = stopped();
    std::thread::sleep(Duration::from_millis(500));
    let again = stopped();
    first.into_iter().filter(|p| again.contains(p)).collect()
}

#[test]
fn kill_9_under_load_then_a_restart() {
    let Some(_serial) = begin("restart", &["openssl", "python3", "nginx", "curl"]) else {
        return;
    };
    let Some(python) = h2_python("restart") else {
        return;
    };
    let before = settled();
    let cert = Cert::new();
    let backend = llm_server(None, 5.0, 1.0, 1);
    let (port, plain, h1) = (free_port(), free_port(), backend.port);
    let _nginx = nginx_h2(&cert, port, plain, h1);
    let mut client = Command::new(python)
        .arg(helper("restart_client.py"))
        .arg(format!("https://127.0.0.1:{port}"))
        .arg(format!("http://127.0.0.1:{plain}"))
        .arg(format!("http://127.0.0.1:{h1}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "READY");
    let mut to_client = client.stdin.take().unwrap();
    let ports = [port, plain, h1].map(|p| p.to_string());
    let args = [
        "--port", &ports[0], "--port", &ports[1], "--port", &ports[2],
    ];

    let first = Watch::start(&args);
    let killed = first.pid();
    writeln!(to_client, "load").unwrap();
    writeln!(to_client, "a 2").unwrap();
    let a = answers(&mut lines, "a");
    // Load of new processes too: curl after curl, each held at exec until
    // its TLS probes are on.
    let mut churn = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while :; do curl -s -o /dev/null http://127.0.0.1:{h1}/churn; done"
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let status = first.kill();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );

    // Its programs (and so their links) go once their last fd does, after
    // an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !minus(&loaded(), &before).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        minus(&loaded(), &before),
        Default::default(),
        "nothing of the killed observer stays loaded"
    );

    let second = Watch::start(&args);
    // Before Linux 6.6 per-process probes are uprobe events in tracefs,
    // which outlive their maker: the next observer removes a dead one's.
    // (From 6.6 they are uprobe-multi links, gone with the process.)
    let events = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    assert!(
        !events.contains(&format!("observer_{killed}/")),
        "the killed observer's uprobe events are removed: {events}"
    );
    assert_eq!(
        left_stopped("curl"),
        Vec::<u32>::new(),
        "no curl left stopped"
    );
    writeln!(to_client, "b 4").unwrap();
    let b = answers(&mut lines, "b");
    churn.kill().unwrap();
    churn.wait().unwrap();
    drop(to_client);
    let load = lines.next().unwrap().unwrap();
    let made: u64 = load.strip_prefix("LOAD ").unwrap().parse().unwrap();
    assert!(made > 0, "{load}");
    assert!(client.wait().unwrap().success());
    let out = second.stop();

    for name in ["tls", "plain", "h1"] {
        let mine_a: Vec<&Value> = a.iter().filter(|o| o["client"] == name).collect();
        let mine: Vec<&Value> = b.iter().filter(|o| o["client"] == name).collect();
        let cport = &mine[0]["local_port"];
        assert!(
            mine.iter()
                .chain(&mine_a)
                .all(|o| &o["local_port"] == cport),
            "{name}: one connection across the restart: {a:?} {b:?}"
        );
        // The first request after the start may be missed (above).
        for (dir, who) in [("outbound", "client"), ("inbound", "server")] {
            let seen = out.requests_on(cport, dir);
            for o in &mine[1..] {
                let found = seen.iter().find(|x| {
                    if name == "h1" {
                        x["path"] == o["path"]
                    } else {
                        x["stream_id"] == o["stream_id"]
                    }
                });
                let x = found.unwrap_or_else(|| {
                    panic!("{name}: {who} side of {}: {:#?}", o["path"], out.requests)
                });
                assert_eq!(x["error"], Value::Null, "{x:#}");
                if x["headers_undecodable"] != true {
                    assert_eq!(x["path"], o["path"], "{x:#}");
                    assert_eq!(x["status"], 200, "{x:#}");
                }
            }
        }
    }
}
