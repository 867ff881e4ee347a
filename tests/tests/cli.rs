//! What users see on bad input and without privileges, `--duration`, and
//! `doctor`.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{os::unix::fs::PermissionsExt, path::PathBuf, process::Command};

use serde_json::{json, Value};
use tests::*;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(observer_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_exit_2_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["watch", "--bogus"], "unexpected argument '--bogus'"),
        (&["watch", "--port", "70000"], "--port"),
        (&["watch", "--port", "http"], "invalid value 'http'"),
        (&["watch", "--duration", "soon"], "not a number of seconds"),
        (&["watch", "--direction", "up"], "invalid value 'up'"),
        (&["launch"], "unrecognized subcommand"),
    ];
    for (args, needle) in cases {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// A copy of the binary that an unprivileged user can execute wherever the
/// checkout lives.
fn world_executable_copy(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("observer-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("observer");
    std::fs::copy(observer_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn without_privileges_it_says_what_it_needs_and_exits_1() {
    if !require_root("unprivileged") || !require_tool("unprivileged", "setpriv") {
        return;
    }
    let bin = world_executable_copy("unprivileged");
    for sub in [&["watch"][..], &["doctor"]] {
        // Dropping from uid 0 to nobody clears every effective capability.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(sub)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{sub:?}: {all}");
        assert!(
            all.contains("needs root, or CAP_BPF and CAP_PERFMON"),
            "{sub:?}: {all}"
        );
    }
    std::fs::remove_dir_all(bin.parent().unwrap()).unwrap();
}

#[test]
fn duration_stops_by_itself_with_a_summary() {
    // Serial: another observer's start or stop beside this one (doctor's,
    // here) holds the kernel's trace-event lock for seconds, and its time
    // would count as ours.
    let Some(_serial) = begin("duration", &[]) else {
        return;
    };
    let t0 = std::time::Instant::now();
    let (code, out, err) = run(&["watch", "--duration", "0.5"]);
    let took = t0.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("TIME(UTC)"),
        "text mode prints a header: {out}"
    );
    assert!(
        err.lines().any(|l| l.starts_with("ready: ")
            && l.contains("; connections: on (9/9 programs attached); ")),
        "{err}"
    );
    assert!(err.lines().any(|l| l.starts_with("summary: ")), "{err}");
    assert!(
        took.as_secs_f64() >= 0.5 && took.as_secs_f64() < 10.0,
        "{took:?}"
    );
}

/// A program doctor shows "loaded" on this machine: nothing here for it
/// to attach to (see `doctor_reports_every_probe_attached`), or one the
/// observer runs itself and never attaches.
fn waits_to_attach(name: &str) -> bool {
    use observer::programs::{get, Hook, Library};
    name == "ssl_set_host_name"
        || get(name).is_some_and(|p| !p.hook.attaches())
        || get(name).is_some_and(|p| {
            matches!(p.hook, Hook::UProbe { functions, .. }
                if functions.iter().all(|(l, _)| matches!(l, Library::Go | Library::Rustls)))
        })
}

#[test]
fn doctor_reports_every_probe_attached() {
    let Some(_serial) = begin("doctor", &[]) else {
        return;
    };
    let (code, out, err) = run(&["doctor", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], Value::Bool(true));
    assert_eq!(v["privileged"], Value::Bool(true));
    // This kernel (6.6+) makes uprobe-multi links: stopping waits no
    // trace-event lock (see duration_stops_by_itself_with_a_summary).
    assert_eq!(v["uprobes"], "uprobe_multi");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(v["kernel"].as_str().unwrap().starts_with(release.trim()));
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 9);
    for p in probes {
        assert_eq!(p["status"], "attached", "{p}");
        assert!(!p["feature"].as_str().unwrap().is_empty());
    }
    // The TLS libraries the TLS tests use are found and probed, each file
    // once whatever its paths (libssl.so -> libssl.so.3 is one file).
    let files = v["tls"]["files"].as_array().unwrap();
    assert_eq!(v["tls"]["programs_error"], Value::Null);
    for lib in ["openssl", "gnutls"] {
        let f: Vec<&Value> = files.iter().filter(|f| f["library"] == lib).collect();
        assert!(!f.is_empty(), "no {lib} found: {files:#?}");
        assert!(
            f.iter()
                .all(|f| f["probes"].as_u64() >= Some(4) && f["errors"] == json!([])),
            "{f:#?}"
        );
    }
    let mut ids: Vec<(u64, u64)> = files
        .iter()
        .map(|f| (f["dev"].as_u64().unwrap(), f["inode"].as_u64().unwrap()))
        .collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "a file probed twice: {files:#?}");
    let (code, text, _) = run(&["doctor"]);
    assert_eq!(code, 0);
    assert!(text.contains("inet_sock_set_state"), "{text}");
    assert!(text.contains("libssl.so.3"), "{text}");
    assert!(
        text.contains("DNS lookups: getaddrinfo, gethostbyname_r, gethostbyname2_r in"),
        "{text}"
    );
    assert!(
        text.contains("DNS on the wire: port 53 on cgroup"),
        "{text}"
    );
    assert!(
        v["dns"]["probed"]
            .as_str()
            .is_some_and(|s| s.contains("libc.so")),
        "{}",
        v["dns"]
    );
    assert!(v["dns"]["wire_probed"].is_string(), "{}", v["dns"]);
    // musl, installed for the DNS tests, is a C library of its own.
    let resolvers = v["dns"]["resolver_files"].as_array().unwrap();
    assert!(
        resolvers
            .iter()
            .any(|f| f["path"].as_str().is_some_and(|p| p.contains("musl"))
                && f["error"].is_null()
                && f["probed"][0] == "getaddrinfo"),
        "{resolvers:#?}"
    );
    // Every program of the object is listed; none failed. Those still
    // "loaded" wait for something to attach to: BoringSSL's
    // SSL_set_tlsext_host_name (not in OpenSSL 3), Go's crypto/tls and
    // rustls (attached to each Go or Rust executable a process runs; none
    // runs here, see tls_go.rs and tls_rustls.rs for doctor with one). The plaintext programs are on every
    // TLS file for all processes from the start. The classic connection
    // tracepoint only stands in where the raw one cannot go (no BTF): not
    // loaded here.
    let programs = v["programs"].as_array().unwrap();
    assert_eq!(programs.len(), observer::programs::PROGRAMS.len());
    for p in programs {
        let name = p["program"].as_str().unwrap();
        let want = if observer::programs::is_stand_in(name) {
            "not loaded"
        } else if waits_to_attach(name) {
            "loaded"
        } else {
            "attached"
        };
        assert_eq!(p["status"], want, "{p}");
        assert_eq!(p["failures"], 0, "{p}");
    }
    for (feature, state) in v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (&f[0], &f[1]))
    {
        let want = if feature == "gpu" { "off" } else { "on" };
        assert_eq!(state["state"], want, "{feature}: {state}");
    }
    // Every program but those waiting (above).
    let all = observer::programs::PROGRAMS;
    let waiting = all
        .iter()
        .filter(|p| waits_to_attach(p.name) || observer::programs::is_stand_in(p.name))
        .count();
    let want = format!(
        "verdict: ok, {}/{} programs attached",
        all.len() - waiting,
        all.len()
    );
    assert!(text.contains(&want), "{want}: {text}");
}

/// The capabilities a cautious operator might give a daemon instead of
/// root, short of CAP_NET_ADMIN: eBPF loads, the tracepoints attach, and so
/// do the uprobes (uprobe-multi links need no CAP_SYS_ADMIN, as perf-event
/// uprobes would on this kernel), but the cgroup packet programs are
/// refused, and tracefs is root's. The `ready` line, the summary and doctor
/// must say so, feature by feature.
#[test]
fn under_reduced_privileges_each_feature_says_whether_it_works() {
    let Some(_serial) = begin("reduced_privileges", &["setpriv"]) else {
        return;
    };
    let bin = world_executable_copy("reduced");
    let as_nobody = |caps: &str, args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps={caps}"))
            .arg(format!("--ambient-caps={caps}"))
            .arg(&bin)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let caps = "+bpf,+perfmon,+sys_ptrace,+dac_read_search";
    let (code, _, err) = as_nobody(caps, &["watch", "--duration", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let ready = err.lines().find(|l| l.starts_with("ready: ")).expect(&err);
    for want in [
        "; connections: degraded (9/9 programs attached; first bytes and inbound owners lost: \
         the packet programs are not attached)",
        "; TLS handshakes: on (",
        "openssl /usr/lib/x86_64-linux-gnu/libssl.so.3",
        "; TLS plaintext timing: on (",
        "; DNS library: on (getaddrinfo",
        "; DNS wire: off (loading dns_sock_release: ",
        "; plain HTTP requests: off (attaching packets_egress",
        "Operation not permitted",
    ] {
        assert!(ready.contains(want), "{want:?} not in {ready}");
    }
    let summary = err
        .lines()
        .find(|l| l.starts_with("summary: "))
        .expect(&err);
    assert!(
        summary.contains("features: connections degraded, TLS handshakes on, TLS plaintext timing on, DNS library on, DNS wire off, plain HTTP requests off"),
        "{summary}"
    );
    // doctor reaches the same verdict (it can run, degraded: exit 3) and
    // the same states.
    let (code, out, err) = as_nobody(caps, &["doctor", "--json"]);
    assert_eq!(code, Some(3), "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["verdict"]["verdict"], "degraded", "{}", v["verdict"]);
    let why = v["verdict"]["why"].to_string();
    for off in [
        "connections degraded",
        "DNS wire off",
        "plain HTTP requests off",
    ] {
        assert!(why.contains(off), "{off}: {why}");
    }
    for (f, want) in [
        ("connections", "degraded"),
        ("tls_handshakes", "on"),
        ("dns_library", "on"),
        ("dns_wire", "off"),
        ("http_plain", "off"),
    ] {
        assert_eq!(doctor_feature(&v, f), want, "{f}");
    }
    assert_eq!(doctor_program(&v, "getaddrinfo")["status"], "attached");
    let failed = doctor_program(&v, "dns_sock_release");
    assert_eq!(failed["status"], "failed", "{failed}");
    // With CAP_BPF and CAP_PERFMON only, tracefs (mounted, root's) cannot
    // be read: said as that, not as "not mounted", in one warning; the rest
    // runs (the raw tracepoints need no tracefs: tests/tests/mounts.rs).
    let (code, _, err) = as_nobody("+bpf,+perfmon", &["watch", "--duration", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let tracefs: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("tracefs is"))
        .collect();
    assert_eq!(tracefs.len(), 1, "{err}");
    assert!(
        tracefs[0].contains("tracefs is mounted at")
            && tracefs[0].contains("not readable by this process")
            && tracefs[0].contains("raw tracepoints go on"),
        "{err}"
    );
    std::fs::remove_dir_all(bin.parent().unwrap()).unwrap();
}

/// A second observer on the host is named by `doctor` and by the start-up
/// of another: two observers double what observed programs pay, and a stray
/// one has made timings drift.
#[test]
fn another_observer_loaded_is_named() {
    let Some(_serial) = begin("another_observer", &[]) else {
        return;
    };
    let first = Watch::start(&["--port", "9"]);
    let (code, out, err) = run(&["doctor", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let listed = |v: &Value, pid: u32| -> Option<Value> {
        v["other_observers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["pid"] == json!(pid))
            .cloned()
    };
    let it = listed(&v, first.pid()).unwrap_or_else(|| panic!("{:#}", v["other_observers"]));
    assert_eq!(it["comm"], "observer");
    // Every program of the table it loaded (the TLS and DNS probes among
    // them), not one or two.
    assert!(it["programs"].as_u64().unwrap() >= 20, "{it}");
    let (_, text, _) = run(&["doctor"]);
    // Any stray observer is listed too: what matters is that this one is.
    let named = |line: &str, pid: u32| {
        line.contains("another observer is loaded:")
            && line.contains(&format!("pid {pid} (observer,"))
    };
    assert!(
        text.lines()
            .any(|l| l.contains("WARNING") && named(l, first.pid())),
        "{text}"
    );
    let second = Watch::start(&["--port", "9"]);
    assert!(
        second.stderr_seen().iter().any(|l| named(l, first.pid())),
        "{:?}",
        second.stderr_seen()
    );
    second.stop();
    let first_pid = first.pid();
    first.stop();
    let (_, out, _) = run(&["doctor", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed(&v, first_pid), None, "gone once it stopped");
    let (_, text, _) = run(&["doctor"]);
    assert!(
        !text.contains(&format!("pid {first_pid} (observer,")),
        "{text}"
    );
}

/// `doctor --json` with `programs` treated as refused by the verifier (the
/// fault a kernel lacking what they use causes): (exit code, report).
fn doctor_refusing(programs: &str) -> (i32, Value) {
    let out = Command::new(observer_bin())
        .args(["doctor", "--json"])
        .env("OBSERVER_REFUSE_PROGRAMS", programs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), v)
}

/// A program the kernel refuses costs only its own feature, and a TLS
/// library's program only that library: a refused rustls program (6.1
/// refused one) leaves OpenSSL and GnuTLS probed and every other feature
/// on; a refused packet program (6.1 and 6.12 refused packets_egress)
/// takes plain HTTP and wire DNS, not TLS or the library lookups. Each
/// time the verdict is `degraded` (exit 3) and names what is off; and a
/// curl over TLS under the first is still recorded with its handshake.
#[test]
fn a_refused_program_costs_only_its_own_feature() {
    let Some(_serial) = begin("refused_program", &["curl", "openssl", "python3"]) else {
        return;
    };
    let (code, v) = doctor_refusing("rustls_write_to");
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"]["verdict"], "degraded", "{}", v["verdict"]);
    let why = v["verdict"]["why"].to_string();
    assert!(
        why.contains("TLS plaintext timing degraded: rustls off: loading rustls_write_to: refused"),
        "{why}"
    );
    assert_eq!(doctor_program(&v, "rustls_write_to")["status"], "failed");
    for f in [
        "connections",
        "tls_handshakes",
        "dns_library",
        "dns_wire",
        "http_plain",
    ] {
        assert_eq!(doctor_feature(&v, f), "on", "{f}: {:#}", v["features"]);
    }
    assert_eq!(doctor_feature(&v, "tls_plaintext"), "degraded");
    let files = v["tls"]["files"].as_array().unwrap();
    for lib in ["openssl", "gnutls"] {
        assert!(
            files
                .iter()
                .any(|f| f["library"] == lib && f["probes"].as_u64() >= Some(4)),
            "{lib} not probed: {files:#?}"
        );
    }

    let (code, v) = doctor_refusing("packets_egress");
    assert_eq!(code, 3, "{v:#}");
    for (f, want) in [
        ("connections", "degraded"),
        ("tls_handshakes", "on"),
        ("tls_plaintext", "on"),
        ("dns_library", "on"),
        ("dns_wire", "off"),
        ("http_plain", "off"),
    ] {
        assert_eq!(doctor_feature(&v, f), want, "{f}: {:#}", v["features"]);
    }

    // As `watch` runs it: a fresh curl's HTTPS call still has its TLS.
    let cert = Cert::new();
    let server = tls_server(&cert, "tls", 50, 0);
    let port = server.port.to_string();
    let w = Watch::start_with_env(
        &["--port", &port],
        &[("OBSERVER_REFUSE_PROGRAMS", "rustls_write_to")],
    );
    let out = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{local_port}", "--resolve"])
        .arg(format!("tls.test:{port}:127.0.0.1"))
        .arg(format!("https://tls.test:{port}/"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let local: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let seen = w.stop();
    let r = seen
        .records
        .iter()
        .find(|r| r["local_port"] == local && r["comm"] == "curl")
        .unwrap_or_else(|| panic!("no record of curl's connection: {:#?}", seen.records));
    assert_eq!(r["tls"]["library"], "openssl", "{r:#}");
    assert!(
        r["tls"]["handshake_ns"].as_u64() >= Some(50_000_000),
        "{r:#}"
    );
}
