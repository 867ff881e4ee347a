//! `cargo xtask setup`: the nightly's rust-src and a bpf-linker built against the
//! nightly's own LLVM (the recipe in shared/notes/toolchain.md). Idempotent: each
//! step first checks whether it is needed, so a set-up machine takes a second.

use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

use crate::run_checked;

/// The eBPF toolchain (aya-build runs `rustup run nightly cargo build`).
const NIGHTLY: &str = "nightly";
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn run() -> Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ensure_nightly() -> Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is needed to build the eBPF programs")?;
    if list.lines().any(|l| l.starts_with("nightly-")) {
        return Ok(());
    }
    eprintln!("xtask setup: installing the nightly toolchain");
    run_checked(Command::new("rustup").args([
        "toolchain",
        "install",
        NIGHTLY,
        "--profile",
        "minimal",
    ]))
}

fn ensure_rust_src() -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]))?;
    if installed.lines().any(|l| l.trim() == "rust-src") {
        return Ok(());
    }
    eprintln!("xtask setup: adding rust-src to {NIGHTLY}");
    run_checked(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        NIGHTLY,
    ]))
}

/// The nightly's lib directory and the name of its LLVM shared library
/// (e.g. `LLVM-22-rust-1.97.0-nightly`), and the LLVM major version.
fn nightly_llvm() -> Result<(String, String, u32)> {
    let sysroot =
        output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))?;
    let lib = format!("{}/lib", sysroot.trim());
    let name = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {lib}"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with("libLLVM") && n.ends_with(".so"))
        .with_context(|| format!("no libLLVM*.so in {lib}: the nightly lacks its LLVM library"))?;
    let name = name
        .trim_start_matches("lib")
        .trim_end_matches(".so")
        .to_owned();
    let major = name
        .split('-')
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("cannot read the LLVM version from {name}"))?;
    Ok((lib, name, major))
}

/// bpf-linker is usable when it starts (its LLVM library still exists) and is
/// the version we build.
fn bpf_linker_ok() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)
        })
        .unwrap_or(false)
}

fn ensure_bpf_linker() -> Result<()> {
    if bpf_linker_ok() {
        return Ok(());
    }
    let (lib, llvm, major) = nightly_llvm()?;
    eprintln!(
        "xtask setup: building bpf-linker {BPF_LINKER_VERSION} against {llvm} (about a minute)"
    );
    // The default build wants a newer LLVM than the nightly's; link against the
    // nightly's own instead, and find it at run time through the rpath.
    let rustflags = format!("-L {lib} -l dylib={llvm} -C link-args=-Wl,-rpath,{lib}");
    run_checked(
        Command::new("cargo")
            .args([
                &format!("+{NIGHTLY}"),
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                &format!("llvm-{major},no-llvm-linking"),
            ])
            .env("RUSTFLAGS", rustflags),
    )?;
    if !bpf_linker_ok() {
        bail!("bpf-linker was installed but does not run; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}
