//! The container image (`cargo xtask image`) run with podman the way the
//! DaemonSet runs it: the host's PID namespace, the host's cgroup tree and
//! tracefs mounted, a read-only root, every capability dropped but those of
//! deploy/capabilities.txt. A host process (curl, in a network namespace
//! with a DNS server of the tests' own) looks a name up and makes an HTTPS
//! request; the container's records hold that connection with its TLS
//! handshake and the lookup joined: the host's libssl and libc were found
//! through /proc/PID/root from inside the container.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Instant,
};

use observer::privileges;
use tests::*;

const TAG: &str = "localhost/observer:latest";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cargo xtask image` from the binary under test (no rebuild).
fn build_image() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let t = Instant::now();
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["xtask", "image", "--binary"])
        .arg(observer_bin())
        .args(["--tag", TAG])
        .status()
        .unwrap();
    assert!(status.success(), "cargo xtask image: {status}");
    eprintln!("image built in {:.1} s", t.elapsed().as_secs_f64());
}

/// Where this host mounts its cgroup v2 hierarchy's root (/sys/fs/cgroup,
/// or /sys/fs/cgroup/unified on a hybrid host like this one).
fn host_cgroup2() -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut f = left.split_whitespace();
            let (root, at) = (f.nth(3)?, f.next()?);
            (right.starts_with("cgroup2 ") && root == "/").then(|| at.to_owned())
        })
        .expect("a cgroup v2 hierarchy")
}

/// A container run with podman; removed on drop.
/// The observer in its container: `podman rm --force` on drop, whatever
/// became of the test.
struct Container {
    name: String,
    watch: Option<Watch>,
}

impl Container {
    /// `podman run` of the image as the DaemonSet runs it, with `args`;
    /// waits for the observer's `ready` line.
    fn start(args: &[&str]) -> Container {
        let name = format!("observer-test-{}", std::process::id());
        let caps = privileges::parse_list(
            &std::fs::read_to_string(workspace().join("deploy/capabilities.txt")).unwrap(),
        )
        .unwrap();
        let mut cmd = Command::new("podman");
        // crun refuses this machine's hybrid cgroup layout; Debian's runc
        // runs it with limits at or below the machine's own.
        cmd.args(["--runtime", "runc", "run", "--rm", "--name", &name])
            .args([
                "--ulimit",
                "nofile=20000:20000",
                "--ulimit",
                "nproc=1000:1000",
            ])
            .args(["--pid=host", "--network=none", "--read-only"])
            .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"])
            .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing"])
            .args(["--cap-drop", "all"]);
        for c in &caps {
            cmd.args(["--cap-add", c.name()]);
        }
        cmd.arg(TAG).args(args);
        Container {
            name,
            watch: Some(Watch::spawn(cmd)),
        }
    }

    /// Waits for the observer to stop by itself (`--duration`).
    fn finish(mut self) -> Watched {
        self.watch.take().unwrap().finish()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args([
                "--runtime",
                "runc",
                "rm",
                "--force",
                "--time",
                "0",
                &self.name,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn the_image_run_like_the_daemonset_sees_a_host_https_request_and_its_lookup() {
    let Some(_serial) = begin(
        "image",
        &["podman", "runc", "curl", "openssl", "python3", "ip", "ldd"],
    ) else {
        return;
    };
    build_image();
    // The host's processes: a DNS server and an HTTPS server (Python's ssl,
    // so the host's libssl is mapped when the observer starts).
    let ns = DnsNs::new(20.0);
    let cert = Cert::new();
    let server = HelperServer::spawn(
        Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3"])
            .arg(helper("tls_server.py"))
            .arg("--cert")
            .arg(cert.cert())
            .arg("--key")
            .arg(cert.key()),
    );
    let cgroup = host_cgroup2();
    let c = Container::start(&[
        "watch",
        "--json",
        "--duration",
        "6",
        "--cgroup-root",
        &cgroup,
    ]);
    let ready = c
        .watch
        .as_ref()
        .unwrap()
        .stderr_seen()
        .last()
        .unwrap()
        .clone();
    for f in ["TLS handshakes: on", "DNS library: on", "DNS wire: on"] {
        assert!(ready.contains(f), "{f:?} not in {ready}");
    }
    let out = ns.exec(&[
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{local_port}",
        "--cacert",
        cert.cert().to_str().unwrap(),
        &format!("https://tls.test:{}/", server.port),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let out = c.finish();
    let (records, stderr) = (&out.records, &out.stderr);
    let conn = records
        .iter()
        .find(|r| r["kind"] == "connection" && r["comm"] == "curl" && r["local_port"] == port)
        .unwrap_or_else(|| {
            panic!("no connection from curl's port {port}: {records:#?}\n{stderr:#?}")
        });
    let tls = &conn["tls"];
    assert_eq!(tls["library"], "openssl", "{conn:#}");
    assert_eq!(tls["server_name"], "tls.test", "{conn:#}");
    assert!(tls["handshake_ns"].as_u64().unwrap() > 0, "{conn:#}");
    assert_eq!(conn["dns"]["name"], "tls.test", "{conn:#}");
    let lookup = records
        .iter()
        .find(|r| r["kind"] == "dns" && r["comm"] == "curl" && r["name"] == "tls.test")
        .unwrap_or_else(|| panic!("no lookup: {records:#?}"));
    assert_eq!(lookup["result"], "ok", "{lookup:#}");
}
