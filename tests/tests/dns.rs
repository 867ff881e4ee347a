//! Name lookups through the C library (getaddrinfo), against a DNS server of
//! the test's own in a network namespace that answers after a known delay.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use serde_json::{json, Value};
use tests::*;

const DELAY_MS: f64 = 150.0;

/// A network namespace with lo up, a resolv.conf naming a DNS server inside
/// it, the server, and an HTTP server; removed on drop.
struct Ns {
    name: String,
    dns: Child,
    http: HelperServer,
}

impl Ns {
    fn new() -> Ns {
        let name = format!("obs-dns-{}", std::process::id());
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("ip").args(["netns", "add", &name]));
        ok(Command::new("ip").args(["netns", "exec", &name, "ip", "link", "set", "lo", "up"]));
        let etc = format!("/etc/netns/{name}");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            format!("{etc}/resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .unwrap();
        let mut dns = Command::new("ip")
            .args(["netns", "exec", &name, "python3"])
            .arg(helper("dns_server.py"))
            .args(["--delay-ms", &DELAY_MS.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(dns.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "READY");
        let http = HelperServer::spawn(
            Command::new("ip")
                .args(["netns", "exec", &name, "python3"])
                .arg(helper("server.py"))
                .args(["--response-bytes", "10"]),
        );
        Ns { name, dns, http }
    }

    fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = self.dns.kill();
        let _ = self.dns.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
    }
}

fn lookups<'a>(w: &'a Watched, comm: &str, name: &str) -> Vec<&'a Value> {
    w.records
        .iter()
        .filter(|r| r["kind"] == "dns" && r["comm"] == comm && r["name"] == name)
        .collect()
}

#[test]
fn library_lookups_their_durations_results_and_the_connection_they_lead_to() {
    let Some(_serial) = begin("dns_libc", &["curl", "python3", "ip", "getent"]) else {
        return;
    };
    let ns = Ns::new();
    let w = Watch::start(&[]);
    let out = ns.exec(&[
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{time_namelookup}",
        &format!("http://api.test:{}/", ns.http.port),
    ]);
    let curl_lookup_ms: f64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse::<f64>()
        .unwrap()
        * 1e3;
    let py = ns.exec(&[
        "python3", "-c",
        "import socket\nfor n in ('py.test','nx.test','drop.test'):\n  try: socket.getaddrinfo(n, 80)\n  except Exception as e: pass",
    ]);
    assert!(py.status.success());
    let getent = ns.exec(&["getent", "ahosts", "getent.test"]);
    assert!(getent.status.success());
    let out = w.stop();

    // curl: the lookup took the server's delay, as curl measured it.
    let l = lookups(&out, "curl", "api.test");
    assert!(
        !l.is_empty(),
        "no lookup from curl: {:#?}",
        out.records
            .iter()
            .filter(|r| r["kind"] == "dns")
            .collect::<Vec<_>>()
    );
    let ours = l
        .iter()
        .map(|r| ms(r["duration_ns"].as_u64().unwrap()))
        .fold(0.0, f64::max);
    assert!(
        (ours - curl_lookup_ms).abs() <= 2.0,
        "lookup {ours:.3} ms, curl's time_namelookup {curl_lookup_ms:.3} ms"
    );
    assert!(ours >= DELAY_MS, "{ours}");
    assert!(
        l.iter()
            .any(|r| r["answers"] == json!(["127.0.0.1"]) && r["result"] == "ok"),
        "{l:#?}"
    );
    // The connection that followed carries it.
    let conn = out
        .records
        .iter()
        .find(|r| {
            r["kind"] == "connection"
                && r["comm"] == "curl"
                && r["remote_port"] == json!(ns.http.port)
        })
        .unwrap();
    assert_eq!(conn["dns"]["name"], "api.test", "{conn:#}\nlookups: {l:#?}");
    assert_eq!(conn["dns"]["joined_by"], "answer");
    assert_eq!(conn["dns"]["source"], "libc");
    // Python and getent, NXDOMAIN and no answer.
    assert_eq!(lookups(&out, "python3", "py.test")[0]["result"], "ok");
    assert_eq!(lookups(&out, "python3", "nx.test")[0]["result"], "nxdomain");
    let dropped = lookups(&out, "python3", "drop.test");
    assert_eq!(dropped[0]["result"], "timeout", "{dropped:#?}");
    assert!(
        ms(dropped[0]["duration_ns"].as_u64().unwrap()) >= 1000.0,
        "the resolver's 1 s timeout"
    );
    assert!(!lookups(&out, "getent", "getent.test").is_empty());
}

/// 500 lookups at once from five processes: each reported once.
#[test]
fn five_hundred_parallel_lookups_each_reported_once() {
    let Some(_serial) = begin("dns_parallel", &["python3", "ip"]) else {
        return;
    };
    let ns = Ns::new();
    let w = Watch::start(&[]);
    // Each process prints how many of its lookups failed (the DNS server
    // of this test drops some of 500 queries at once: the resolver then times
    // out, and that is what the records must say).
    let script = "import socket, sys, threading\n\
p = sys.argv[1]\nfailed = []\n\
def look(i):\n  try: socket.getaddrinfo(f'p{p}-{i}.test', 80, socket.AF_INET)\n  except OSError: failed.append(i)\n\
ts = [threading.Thread(target=look, args=(i,)) for i in range(100)]\n\
[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(failed))\n";
    let kids: Vec<Child> = (0..5)
        .map(|p| {
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns.name,
                    "python3",
                    "-c",
                    script,
                    &p.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut failed_seen_by_clients = 0u64;
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success());
        failed_seen_by_clients += String::from_utf8(o.stdout)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap();
    }
    let out = w.stop();
    let mut names: Vec<&str> = out
        .records
        .iter()
        .filter(|r| r["kind"] == "dns")
        .filter_map(|r| r["name"].as_str())
        .filter(|n| n.starts_with('p') && n.ends_with(".test"))
        .collect();
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!((n, names.len()), (500, 500), "each of the 500 lookups once");
    let mine: Vec<&Value> = out
        .records
        .iter()
        .filter(|r| {
            r["kind"] == "dns"
                && r["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with('p') && n.ends_with(".test"))
        })
        .collect();
    assert!(mine.iter().all(|r| r["qtype"] == "A"));
    let failed = mine.iter().filter(|r| r["result"] != "ok").count() as u64;
    assert_eq!(
        failed, failed_seen_by_clients,
        "failed lookups: ours vs the clients' own count"
    );
}
