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
    pub http: HelperServer,
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
        let mut dns = Command::new("ip")
            .args(["netns", "exec", &name, "python3"])
            .arg(helper("dns_server.py"))
            .args(["--delay-ms", &delay_ms.to_string()])
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
        DnsNs { name, dns, http }
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
    }
}
