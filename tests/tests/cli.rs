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
fn world_executable_copy() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("observer-cli-{}", std::process::id()));
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
    let bin = world_executable_copy();
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
    if !require_root("duration") {
        return;
    }
    let t0 = std::time::Instant::now();
    let (code, out, err) = run(&["watch", "--duration", "0.5"]);
    let took = t0.elapsed();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("TIME(UTC)"),
        "text mode prints a header: {out}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("ready: 9/9 probes attached")),
        "{err}"
    );
    assert!(err.lines().any(|l| l.starts_with("summary: ")), "{err}");
    assert!(
        took.as_secs_f64() >= 0.5 && took.as_secs_f64() < 10.0,
        "{took:?}"
    );
}

#[test]
fn doctor_reports_every_probe_attached() {
    if !require_root("doctor") {
        return;
    }
    let (code, out, err) = run(&["doctor", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], Value::Bool(true));
    assert_eq!(v["privileged"], Value::Bool(true));
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
    let resolvers = v["tls"]["resolver_files"].as_array().unwrap();
    assert!(
        resolvers
            .iter()
            .any(|f| f["path"].as_str().is_some_and(|p| p.contains("musl"))
                && f["error"].is_null()
                && f["probed"][0] == "getaddrinfo"),
        "{resolvers:#?}"
    );
    assert!(text.contains("verdict: ok, 9/9 probes attach"), "{text}");
}
