//! tracefs, the kernel's BTF or the cgroup v2 mount missing: one clear
//! line says what is lost, and the rest runs. Each observer runs in a mount
//! namespace of its own where a shell has taken the mount away (the host's
//! stay as they are), and a client and a refused connect go past it.

#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
};

use serde_json::{json, Value};
use tests::*;

/// What one observer without a mount gave.
struct Seen {
    out: Watched,
    /// Its local port for the exchange, the port nothing listens on.
    local: u16,
    refused: u16,
    server: u16,
}

/// `observer watch` after `hide` (shell, run in a mount namespace of the
/// observer's own) took a mount away: a client's exchange with a server of
/// ours and a connect to a port nothing listens on.
fn watch_without(hide: &str) -> Seen {
    let listener = TcpListener::bind("[::1]:0").unwrap();
    let server = listener.local_addr().unwrap().port();
    let refused = free_port();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!("{hide} && exec \"$0\" watch --json --port {server},{refused}"),
    ])
    .arg(observer_bin());
    let watch = Watch::spawn(cmd);
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"world!").unwrap();
    });
    let mut s = TcpStream::connect(("::1", server)).unwrap();
    let local = s.local_addr().unwrap().port();
    s.write_all(b"hello").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    t.join().unwrap();
    assert_eq!(got, b"world!");
    let err = TcpStream::connect(("127.0.0.1", refused)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    Seen {
        out: watch.stop(),
        local,
        refused,
        server,
    }
}

impl Seen {
    /// The log's warnings, but for one about other observers' programs
    /// (the previous test's, freed a grace period after it exited): that one
    /// is about the machine, not the mount.
    fn warnings(&self) -> Vec<&String> {
        self.out
            .stderr
            .iter()
            .filter(|l| l.contains("WARN") && !l.contains("another observer is loaded"))
            .collect()
    }

    /// Exactly one warning, which says `what`; the observer ran and stopped
    /// cleanly; its ready line.
    fn one_warning(&self, what: &[&str]) -> &String {
        let w = self.warnings();
        assert_eq!(w.len(), 1, "one warning: {:#?}", self.out.stderr);
        for s in what {
            assert!(w[0].contains(s), "{s:?} in {}", w[0]);
        }
        assert!(self.out.status.success(), "{:?}", self.out.status);
        assert!(
            self.out.stderr.iter().any(|l| l.starts_with("summary ")),
            "{:#?}",
            self.out.stderr
        );
        self.out
            .stderr
            .iter()
            .find(|l| l.starts_with("ready: "))
            .expect("ready line")
    }

    /// The client's record and the refused one: ports, addresses, the error.
    fn client_and_refused(&self) {
        let c = self.out.with("local_port", &json!(self.local));
        assert_eq!(c.len(), 1, "one client record: {c:#?}");
        assert_eq!(c[0]["family"], json!("ipv6"));
        assert_eq!(c[0]["remote_addr"], json!("::1"));
        assert_eq!(c[0]["remote_port"], json!(self.server));
        let r: Vec<&Value> = self.out.with("remote_port", &json!(self.refused));
        assert_eq!(r.len(), 1, "one refused record: {r:#?}");
        assert_eq!(r[0]["error"], json!("refused"));
        assert_eq!(r[0]["remote_addr"], json!("127.0.0.1"));
        assert_ne!(r[0]["local_port"], json!(0));
    }
}

/// Without BTF (an empty file over it) the socket's layout is unknown and
/// the classic tracepoint's record stands in for the raw program.
#[test]
fn without_btf_the_classic_tracepoint_record_stands_in() {
    let Some(_serial) = begin("no_btf", &["unshare"]) else {
        return;
    };
    let seen = watch_without("mount --bind /dev/null /sys/kernel/btf/vmlinux");
    let ready = seen.one_warning(&[
        "/sys/kernel/btf/vmlinux",
        "classic tracepoint record",
        "RTTs are lost",
    ]);
    assert!(ready.contains("inet_sock_set_state lost"), "{ready}");
    seen.client_and_refused();
    // (Bytes are read from the socket at offsets from BTF: not here.)
    let s = seen.out.with("direction", &json!("inbound"));
    assert_eq!(s.len(), 1, "one server record: {s:#?}");
    assert_eq!(s[0]["local_port"], json!(seen.server));
    assert_eq!(s[0]["remote_port"], json!(seen.local));
}

/// Without tracefs (not mounted, and nowhere to mount it: an empty
/// read-only /sys/kernel with only btf/ kept), the raw tracepoints go on by
/// name, checked against BTF; the classic ones and per-process probes go.
#[test]
fn without_tracefs_the_raw_tracepoints_still_go_on() {
    let Some(_serial) = begin("no_tracefs", &["unshare"]) else {
        return;
    };
    let seen = watch_without(
        "d=$(mktemp -d) && mount --bind /sys/kernel/btf \"$d\" && mount -t tmpfs none \
         /sys/kernel && mkdir /sys/kernel/btf && mount --move \"$d\" /sys/kernel/btf && rmdir \
         \"$d\" && mount -o remount,ro /sys/kernel && ! test -e /sys/kernel/tracing",
    );
    let ready = seen.one_warning(&[
        "tracefs is not mounted",
        "raw tracepoints go on, checked against the kernel's BTF",
        "sched_process_exec",
    ]);
    for on in [
        "TLS handshakes: on",
        "DNS library: on",
        "plain HTTP requests: on",
    ] {
        assert!(ready.contains(on), "{on}: {ready}");
    }
    seen.client_and_refused();
}

/// Without the cgroup v2 mount, the packet programs have nowhere to go:
/// plain HTTP and wire lookups are off, connections are still recorded.
#[test]
fn without_cgroup2_connections_are_still_recorded() {
    let Some(_serial) = begin("no_cgroup2", &["unshare"]) else {
        return;
    };
    // Every cgroup2 mount hidden (on hybrid hosts it sits under
    // /sys/fs/cgroup/unified), then the directory itself.
    let seen = watch_without(
        "for m in $(findmnt -rn -t cgroup2 -o TARGET); do umount -l \"$m\"; done; mount -t \
         tmpfs none /sys/fs/cgroup",
    );
    let ready = seen.one_warning(&["no cgroup v2 hierarchy", "plain HTTP requests"]);
    assert!(ready.contains("plain HTTP requests: off"), "{ready}");
    assert!(ready.contains("TLS handshakes: on"), "{ready}");
    seen.client_and_refused();
}
