//! A container's cgroup removed while its connections are open (issue 33).
//!
//! A client runs in a cgroup v2 laid out as podman lays out a container's
//! (`.../libpod-<64 hex>.scope`, which the observer reads as the container's
//! id) and opens a keep-alive HTTP connection and a plain TCP connection to
//! servers on the host. Then its container goes, one of two ways:
//! - moved out: the process is moved to another cgroup and the old one is
//!   removed (rmdir succeeds: a socket keeps a reference to its cgroup,
//!   not a task); requests and bytes then go on the still-open
//!   connections, and the client closes them;
//! - killed: the process is killed (`podman rm -f`) and its cgroup
//!   removed while the host's servers still hold their ends.
//!
//! Checked: every request (before and after) is recorded on both ends,
//! each connection's close with the bytes the test sent and read; the
//! client's records keep the container it was in when it made its
//! connections (the product attributes a process by the cgroup it
//! exec'd in, kept until it execs again or exits; it never looks the gone
//! cgroup up again), the servers' records none; the observer exits
//! cleanly; and its tables, the cgroup-keyed one included, are back near
//! where they were once the clients are gone: a cgroup that is gone
//! leaves no entry behind.
//!
//! Needs root (loads eBPF, makes cgroups), a cgroup v2 hierarchy and python3.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::*;

/// Containers made and removed, alternately moved out and killed.
const CYCLES: u32 = 10;
/// The tables stored each second, the kernel's connections every 5 s.
const TABLES_FRESH: Duration = Duration::from_secs(6);

/// The client: a keep-alive HTTP connection and a TCP connection; one
/// request and one 4-byte echo, READY with both local ports, then on
/// `after` two more requests and an echo on the same connections, closed.
const CLIENT: &str = r#"
import http.client, socket, sys
hp, ep, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
h = http.client.HTTPConnection("127.0.0.1", hp)
t = socket.create_connection(("127.0.0.1", ep))
def req(name):
    h.request("GET", "/%s/%s" % (tag, name))
    r = h.getresponse(); r.read(); return r.status
def echo():
    t.sendall(b"ping"); got = b""
    while len(got) < 4: got += t.recv(4 - len(got))
s0 = req("before"); echo()
print("READY", h.sock.getsockname()[1], t.getsockname()[1], s0, flush=True)
if sys.stdin.readline().strip() == "after":
    s1 = req("after-1"); s2 = req("after-2"); echo()
    h.close(); t.close()
    print("DONE", s1, s2, flush=True)
"#;

/// The cgroup v2 hierarchy's root, as mounted here.
fn cgroup_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let at = f.next()?;
        (right.starts_with("cgroup2 ") && root == "/").then(|| PathBuf::from(at))
    })
}

/// Directories under `dir`, itself included.
fn count_cgroups(dir: &Path) -> u64 {
    1 + std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| count_cgroups(&e.path()))
        .sum::<u64>()
}

/// A podman-like container id: 64 hex characters.
fn container_id(n: u32) -> String {
    format!(
        "{:016x}",
        (u64::from(std::process::id()) << 20) | u64::from(n)
    )
    .repeat(4)
}

/// Echoes what each connection sends until it ends.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// One container's client, as the test saw it.
struct Cycle {
    id: String,
    tag: String,
    killed: bool,
    http_port: u64,
    tcp_port: u64,
}

/// A client in a fresh container under `parent`, its cgroup removed while
/// its connections are open (moved out, or killed).
fn cycle(parent: &Path, n: u32, http: u16, echo: u16) -> Cycle {
    let id = container_id(2 * n);
    let a = parent.join(format!("libpod-{id}.scope"));
    let b = parent.join(format!("libpod-{}.scope", container_id(2 * n + 1)));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let tag = format!("c{n}");
    let killed = n % 2 == 1;
    // In its cgroup before it execs python3, as a container's process is.
    let mut client = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec python3 -c "$1" "$2" "$3" "$4""#)
        .arg(&a)
        .args([CLIENT, &http.to_string(), &echo.to_string(), &tag])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = client.id();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    let f: Vec<&str> = ready.split(' ').collect();
    assert_eq!((f[0], f[3]), ("READY", "200"), "{ready}");
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cg.contains(&id), "pid {pid} in {cg}");
    if killed {
        // podman rm -f: the process goes, then its cgroup.
        client.kill().unwrap();
        client.wait().unwrap();
        std::fs::remove_dir(&a).unwrap();
    } else {
        std::fs::write(b.join("cgroup.procs"), pid.to_string()).unwrap();
        std::fs::remove_dir(&a).unwrap();
        assert!(!a.exists());
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        assert!(!cg.contains(&id), "pid {pid} still in {cg}");
        writeln!(client.stdin.as_mut().unwrap(), "after").unwrap();
        let done = lines.next().unwrap().unwrap();
        assert_eq!(done, "DONE 200 200");
        assert!(client.wait().unwrap().success());
    }
    std::fs::remove_dir(&b).unwrap();
    Cycle {
        id,
        tag,
        killed,
        http_port: f[1].parse().unwrap(),
        tcp_port: f[2].parse().unwrap(),
    }
}

#[test]
fn a_containers_cgroup_removed_while_its_connections_are_open() {
    let Some(_serial) = begin("cgroup_gone", &["python3", "sh"]) else {
        return;
    };
    let Some(root) = cgroup_root() else {
        assert!(
            !in_ci(),
            "cgroup_gone: no cgroup v2 hierarchy (CI=true, so this is a failure)"
        );
        eprintln!("SKIPPED cgroup_gone: no cgroup v2 hierarchy");
        return;
    };
    let parent = root.join(format!("observer-test-{}.slice", std::process::id()));
    std::fs::create_dir(&parent).unwrap();
    let cert = Cert::new();
    let server = tls_server(&cert, "plain", 0, 0);
    let echo = echo_server();
    let prom = free_port();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--prometheus-listen"])
        .arg(format!("127.0.0.1:{prom}"));
    let t0 = Instant::now();
    let run = Watch::spawn(cmd);
    std::thread::sleep(TABLES_FRESH);
    let before = observer_tables(prom);
    let cycles: Vec<Cycle> = (0..CYCLES)
        .map(|n| cycle(&parent, n, server.port, echo))
        .collect();
    std::fs::remove_dir(&parent).unwrap();
    std::thread::sleep(TABLES_FRESH);
    let after = observer_tables(prom);
    let cgroups_now = count_cgroups(&root);
    let out = run.stop();
    eprintln!("observer ran {:?}", t0.elapsed());
    let s = out.summary();
    eprintln!(
        "summary: dropped {}, tables at stop {}",
        s["dropped"], s["tables"]
    );
    eprintln!("tables before {before:?}, after {after:?}; {cgroups_now} cgroups on the host now");

    for c in &cycles {
        let want: &[&str] = if c.killed {
            &["before"]
        } else {
            &["before", "after-1", "after-2"]
        };
        let want: Vec<String> = want.iter().map(|p| format!("/{}/{p}", c.tag)).collect();
        let port = json!(c.http_port);
        let container = json!({ "id": c.id });
        for (dir, mine) in [("outbound", true), ("inbound", false)] {
            let seen = out.requests_on(&port, dir);
            let paths: Vec<&str> = seen.iter().filter_map(|r| r["path"].as_str()).collect();
            assert_eq!(paths, want, "{dir} requests of {}: {seen:#?}", c.tag);
            for r in seen {
                assert_eq!(r["status"], 200, "{r:#}");
                if mine {
                    assert_eq!(r["container"]["id"], container["id"], "{r:#}");
                } else {
                    assert_eq!(r["container"], Value::Null, "{r:#}");
                }
            }
        }
        // Each connection's close, with the bytes through it.
        let echoed = if c.killed { 4 } else { 8 };
        for (dir, to) in [("outbound", echo), ("inbound", echo)] {
            let r = conn(&out, dir, &json!(c.tcp_port), to);
            assert_eq!(r["state"], "closed", "{r:#}");
            assert_eq!(r["bytes_sent"], echoed, "{r:#}");
            assert_eq!(r["bytes_received"], echoed, "{r:#}");
            let want = if dir == "outbound" {
                container.clone()
            } else {
                Value::Null
            };
            assert_eq!(r["container"]["id"], want["id"], "{r:#}");
        }
        for dir in ["outbound", "inbound"] {
            let r = conn(&out, dir, &json!(c.http_port), server.port);
            assert_eq!(r["state"], "closed", "{r:#}");
            assert_eq!(r["error"], Value::Null, "{r:#}");
        }
        let client = conn(&out, "outbound", &json!(c.http_port), server.port);
        assert_eq!(client["container"]["id"], container["id"], "{client:#}");
    }

    // Back near where they were (host-wide tables move with the host's
    // other programs, by far less than a cgroup-keyed leak would).
    for (t, slack) in [
        ("processes", 50),
        ("connections", 50),
        ("http_conversations", 20),
        ("kernel_connections", 50),
    ] {
        assert!(
            after[t] <= before[t] + slack,
            "{t}: {} -> {}",
            before[t],
            after[t]
        );
    }
    // The cgroup paths are those of the last walk of the tree: at most the
    // tree now and the last container's two, never one per container made.
    assert!(
        after["cgroups"] <= cgroups_now + 2 + 8,
        "{} cgroup ids kept, {cgroups_now} cgroups on the host, {} made and removed",
        after["cgroups"],
        2 * CYCLES
    );
}
