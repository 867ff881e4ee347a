//! Connections that fail after the SYN went out: timed out, unreachable, reset.
//! Timeouts and unreachable hosts are made inside a network namespace of the
//! test's own (no netem here), so nothing leaves this machine.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
};

use serde_json::{json, Value};
use tests::*;

/// A network namespace, deleted on drop.
struct Netns(String);

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "`{cmd}` failed");
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("obs-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        sh(&format!(
            "ip netns add {name} && ip -n {name} link set lo up"
        ));
        Netns(name)
    }

    fn exec(&self, cmd: &str) {
        sh(&format!("ip netns exec {} {cmd}", self.0));
    }

    /// Runs helpers/connect.py in the namespace: ("OK"|"ERR", errno name, local port).
    fn connect(&self, host: &str, port: u16) -> (String, String, u16) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "python3"])
            .arg(helper("connect.py"))
            .args([host, &port.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let f: Vec<&str> = text.split_whitespace().collect();
        match f.as_slice() {
            ["OK", p] => ("OK".into(), String::new(), p.parse().unwrap()),
            ["ERR", e, p] => ("ERR".into(), (*e).into(), p.parse().unwrap()),
            _ => panic!("connect.py said {text:?}"),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ready(test: &str) -> bool {
    require_root(test) && require_tool(test, "ip") && require_tool(test, "python3")
}

#[test]
fn syn_that_is_never_answered_times_out() {
    if !ready("timeout") {
        return;
    }
    let ns = Netns::new("to");
    // One SYN retry: the kernel gives up after about 3 s instead of 2 minutes.
    ns.exec("sysctl -qw net.ipv4.tcp_syn_retries=1");
    // A listener with a full accept queue drops further SYNs unanswered.
    let port = 4242;
    ns.exec(&format!(
        "python3 -c 'import socket,time,sys; s=socket.socket(); s.bind((\"127.0.0.1\",{port})); s.listen(0); \
         c=socket.create_connection((\"127.0.0.1\",{port})); sys.stdout.close(); time.sleep(30)' &"
    ));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let watch = Watch::start(&["--port", &port.to_string(), "--direction", "outbound"]);
    let (res, errno, local) = ns.connect("127.0.0.1", port);
    assert_eq!((res.as_str(), errno.as_str()), ("ERR", "ETIMEDOUT"));
    let out = watch.stop();
    let r: Vec<&Value> = out.with("local_port", &json!(local));
    assert_eq!(r.len(), 1, "{:#?}", out.records);
    assert_eq!(r[0]["error"], json!("timeout"));
    assert!(r[0]["retransmits"].as_u64().unwrap() >= 1, "{}", r[0]);
    assert_eq!(r[0]["connect_ns"], Value::Null);
    // The listener's sleeper dies with the namespace's processes.
    let _ = Command::new("sh")
        .args(["-c", &format!("ip netns pids {} | xargs -r kill", ns.0)])
        .status();
}

#[test]
fn host_that_does_not_answer_arp_is_unreachable() {
    if !ready("unreachable") {
        return;
    }
    let ns = Netns::new("un");
    // A link with no host behind 10.213.0.9; fail neighbour discovery fast.
    ns.exec("ip link add oa type veth peer name ob");
    ns.exec("ip addr add 10.213.0.1/24 dev oa");
    ns.exec("ip link set oa up");
    ns.exec("ip link set ob up");
    ns.exec("sysctl -qw net.ipv4.neigh.oa.mcast_solicit=1 net.ipv4.neigh.oa.retrans_time_ms=100");
    let port = 4343;
    let watch = Watch::start(&["--port", &port.to_string()]);
    let (res, errno, local) = ns.connect("10.213.0.9", port);
    assert_eq!((res.as_str(), errno.as_str()), ("ERR", "EHOSTUNREACH"));
    let out = watch.stop();
    let r: Vec<&Value> = out.with("local_port", &json!(local));
    assert_eq!(r.len(), 1, "{:#?}", out.records);
    assert_eq!(r[0]["error"], json!("unreachable"));
    assert_eq!(r[0]["remote_addr"], json!("10.213.0.9"));
}

#[test]
fn reset_by_peer_is_reported_on_both_sides() {
    if !require_root("reset") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let watch = Watch::start(&["--port", &port.to_string()]);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (s, _) = listener.accept().unwrap();
    c.write_all(b"x").unwrap();
    // Linger 0: close() sends RST instead of FIN.
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on an fd we own with a correctly sized struct.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(rc, 0);
    drop(s);
    let err = c.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    drop(c);
    let out = watch.stop();
    let client = out.with("direction", &json!("outbound"));
    assert_eq!(client.len(), 1);
    assert_eq!(client[0]["error"], json!("reset"));
    assert_eq!(client[0]["resets_received"], json!(1));
    let server = out.with("direction", &json!("inbound"));
    assert_eq!(server.len(), 1);
    assert_eq!(server[0]["resets_sent"], json!(1));
}
