//! A network namespace with a DNS server of the tests' own.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use crate::{helper, HelperServer};

/// A network namespace with lo up, a resolv.conf naming a DNS server inside
/// it (tests/helpers/dns_server.py), the server, and an HTTP server; removed
/// on drop.
pub struct DnsNs {
    pub name: String,
    dns: Child,
    /// The server's log of the queries it received.
    log: std::path::PathBuf,
    pub http: HelperServer,
}

/// A query as the DNS server received it (times: CLOCK_MONOTONIC ns, the
/// clock of the observer's eBPF timestamps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub qtype: u16,
    /// "udp" or "tcp".
    pub transport: String,
    /// Just after the server read the query.
    pub received_ns: u64,
    /// Just before it sent the answer (None: not answered).
    pub sent_ns: Option<u64>,
}

impl DnsNs {
    /// `delay_ms`: how long the DNS server waits before it answers.
    pub fn new(delay_ms: f64) -> DnsNs {
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
        let log = std::env::temp_dir().join(format!("{name}-queries.log"));
        let mut dns = Command::new("ip")
            .args(["netns", "exec", &name, "python3"])
            .arg(helper("dns_server.py"))
            .args(["--delay-ms", &delay_ms.to_string()])
            .arg("--log")
            .arg(&log)
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
        DnsNs {
            name,
            dns,
            log,
            http,
        }
    }

    /// The queries for `qname` the server has received so far, in order.
    pub fn asked(&self, qname: &str) -> Vec<Asked> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == qname).then_some(())?;
                Some(Asked {
                    qtype: f.next()?.parse().ok()?,
                    transport: f.next()?.to_owned(),
                    received_ns: f.next()?.parse().ok()?,
                    sent_ns: f.next()?.parse().ok(),
                })
            })
            .collect()
    }

    /// The server's time on the lookup of `qname`, by its own clock: from
    /// reading the first query to just before sending the last answer. A
    /// lookup seen from the client's side holds it (its first query left
    /// before, its last answer arrived after).
    pub fn server_ms(&self, qname: &str) -> f64 {
        let asked = self.asked(qname);
        let first = asked.iter().map(|a| a.received_ns).min();
        let last = asked.iter().filter_map(|a| a.sent_ns).max();
        match (first, last) {
            (Some(first), Some(last)) => (last - first) as f64 / 1e6,
            _ => panic!("{qname}: not answered by the server: {asked:?}"),
        }
    }

    /// Runs a command inside the namespace to its end.
    pub fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for DnsNs {
    fn drop(&mut self) {
        let _ = self.dns.kill();
        let _ = self.dns.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
        let _ = std::fs::remove_file(&self.log);
    }
}
