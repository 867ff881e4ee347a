//! `cargo xtask test`: every test, the root-only end-to-end ones included.
//!
//! Installs the Debian tools the end-to-end tests drive when they are missing
//! (as root), builds every target of the workspace once (the release observer
//! among them), then runs `cargo test` over the whole workspace with
//! OBSERVER_BIN pointing at that binary, and each fuzz target for a few
//! seconds (`fuzz::smoke`).

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};

use crate::{cargo, run_checked, workspace_root};

/// Commands the end-to-end tests run, and the Debian package of each.
pub const TOOLS: &[(&str, &str)] = &[
    ("curl", "curl"),
    ("ip", "iproute2"),
    ("setpriv", "util-linux"),
    ("python3", "python3"),
    // TLS tests: certificates, a Node.js client, a GnuTLS client, nginx.
    ("openssl", "openssl"),
    ("node", "nodejs"),
    ("wget", "wget"),
    ("nginx", "nginx"),
    // OpenTelemetry tests: a real Prometheus server scrapes the endpoint.
    ("prometheus", "prometheus"),
    // DNS tests: a resolver that sends its own queries, and musl's libc.
    ("dig", "dnsutils"),
    ("musl-gcc", "musl-tools"),
    // Image test: podman builds the image FROM scratch and runs it with
    // Debian's runc (its default crun refuses hybrid cgroup layouts).
    ("podman", "podman"),
    ("runc", "runc"),
    // Deploy test: the host service's unit checked by `systemd-analyze verify`.
    // (Its manifests test also needs kubectl, whose kustomize renders them: it
    // comes with this machine kind, not from Debian, so it is not listed here.)
    ("systemd-analyze", "systemd"),
    // Diagnose test: a first SYN dropped in a network namespace.
    ("iptables", "iptables"),
    // `observer top` driven in a terminal: send-keys and capture-pane.
    ("tmux", "tmux"),
    // TLS on the wire: Java's own TLS (JSSE), which no library probe sees.
    ("javac", "openjdk-17-jdk-headless"),
    ("go", "golang-go"),
    // The kernel's own per-program run counts, read by a tool of its own.
    ("bpftool", "bpftool"),
];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Installs the Debian packages of `tools` whose commands are missing (as root).
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        eprintln!(
            "xtask: missing tools from Debian packages {missing:?}; not root, so not installing them"
        );
        return Ok(());
    }
    eprintln!("xtask: installing {missing:?}");
    run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

pub fn run(args: &[String]) -> Result<()> {
    ensure_tools(TOOLS)?;
    build_all()?;
    let root = workspace_root()?;
    let mut cmd = cargo();
    // Every test binary runs even after one fails, so one run shows every
    // failure (a flaky test elsewhere is not hidden behind the first).
    cmd.args(["test", "--release", "--workspace", "--no-fail-fast"])
        .args(args)
        .envs(test_env(&root));
    let tests = run_checked(&mut cmd).context("tests failed");
    // The whole run (no test named): every parser of outside bytes under
    // the fuzzer a little while too (after the tests, whose timings it would
    // disturb), whatever they gave.
    if !args.is_empty() {
        return tests;
    }
    let fuzz = crate::fuzz::smoke(&root);
    // Last, the kernel subset of the end-to-end tests on the long-term
    // kernels people run, each booted in qemu (docs/testing.md).
    let kernels = crate::vmtest::subset_in_test_run();
    tests.and(fuzz).and(kernels)
}

/// What the end-to-end tests are told: the observer and the NVML stub built.
pub fn test_env(root: &std::path::Path) -> [(&'static str, std::path::PathBuf); 2] {
    [
        ("OBSERVER_BIN", root.join("target/release/observer")),
        ("NVML_STUB", root.join("target/release/libnvml_stub.so")),
    ]
}

/// Builds what the test run uses, so `cargo test` builds nothing again.
pub fn build_all() -> Result<()> {
    run_checked(cargo().args(BUILD_ALL))
}

/// The path of the test binary `name` that [`build_all`] built (the one
/// `cargo test` runs: asking `cargo test --no-run --test name` instead
/// unifies other features and builds much of it again).
pub fn built_test(name: &str) -> Result<std::path::PathBuf> {
    let out = cargo()
        .args(BUILD_ALL)
        .arg("--message-format=json")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo build")?;
    anyhow::ensure!(out.status.success(), "cargo build failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["target"]["name"] == name
                && v["profile"]["test"] == true
                && v["executable"].is_string()
        })
        .and_then(|v| v["executable"].as_str().map(Into::into))
        .ok_or_else(|| anyhow::anyhow!("no test binary {name} in cargo's output"))
}

const BUILD_ALL: &[&str] = &[
    // Every target at once, the observer's binary, the test build of NVML
    // the GPU tests load through --nvml-lib and the rustls tests' programs
    // among them: built with the features the test run unifies across the
    // workspace, so `cargo test` builds nothing again. (The observer, the
    // stub and the rustls programs built one package at a time each had
    // their own features, and the test build compiled most of it again:
    // 13 minutes of a fresh machine's CI where one build takes 9.)
    // observer-ebpf is left out: its program, built for the host, is also
    // named `observer` and would land on the daemon's target/release/observer
    // (its tests build it in the test run, where nothing else it uses does).
    "build",
    "--release",
    "--workspace",
    "--exclude",
    "observer-ebpf",
    "--lib",
    "--bins",
    "--tests",
];
