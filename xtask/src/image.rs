//! `cargo xtask image`: an OCI image of the release binary, built with
//! Debian's podman FROM scratch (no base image can be pulled here): the
//! binary without its debug info, the shared libraries `ldd` says it loads
//! and the dynamic loader, copied from this machine, and the system's CA
//! certificates for OTLP over https. Nothing else: no shell, no package
//! manager. The DaemonSet and `tests/tests/image.rs` run it read-only with
//! a /tmp tmpfs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::Args;

use crate::{run_checked, workspace_root};

/// The tag the DaemonSet and the tests use.
pub const TAG: &str = "localhost/observer:latest";
/// Where the binary goes in the image (the DaemonSet's `command`).
pub const BIN_IN_IMAGE: &str = "/usr/local/bin/observer";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Use this observer binary instead of building target/release/observer.
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// The image's name.
    #[arg(long, default_value = TAG)]
    pub tag: String,
}

pub fn run(args: &ImageArgs) -> Result<()> {
    crate::test::ensure_tools(&[("podman", "podman"), ("runc", "runc")])?;
    let bin = match &args.binary {
        Some(b) => b.clone(),
        None => {
            crate::setup::run()?;
            run_checked(crate::cargo().args(["build", "--release", "--package", "observer"]))?;
            workspace_root()?.join("target/release/observer")
        }
    };
    build(&bin, &args.tag)
}

/// `ldd`'s answer: the libraries the binary loads and the loader, as paths
/// on this machine (the loader is the `/lib64/ld-linux-...` line).
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!(
            "ldd {}: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_ldd(&String::from_utf8_lossy(&out.stdout))
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)",
        // "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)"
        let path = match line.split_once(" => ") {
            Some((name, rest)) => {
                let p = rest.split(" (").next().unwrap_or("").trim();
                if !p.starts_with('/') {
                    bail!("ldd: {name} not found ({line})");
                }
                p
            }
            None => line.split(" (").next().unwrap_or("").trim(),
        };
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    if !libs.iter().any(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("ld-"))
    }) {
        bail!("ldd named no dynamic loader:\n{text}");
    }
    Ok(libs)
}

/// Copies `from` (following links) to `root` + `at`.
fn copy_into(root: &Path, from: &Path, at: &Path) -> Result<u64> {
    let dest = root.join(at.strip_prefix("/").unwrap_or(at));
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(from, &dest)
        .with_context(|| format!("copying {} to {}", from.display(), dest.display()))
}

/// Builds the image from `bin` as `tag`.
pub fn build(bin: &Path, tag: &str) -> Result<()> {
    let ctx = workspace_root()?.join("target/image");
    let rootfs = ctx.join("rootfs");
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx).with_context(|| format!("removing {}", ctx.display()))?;
    }
    std::fs::create_dir_all(&rootfs)?;
    let mut bytes = 0;
    // The binary without its debug info (80 MB -> about a quarter): symbols
    // stay, so a panic's backtrace still names functions.
    let dest = rootfs.join(BIN_IN_IMAGE.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().context("binary path")?)?;
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&dest)
        .arg(bin)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        eprintln!("xtask image: strip failed; the binary goes in with its debug info");
        std::fs::copy(bin, &dest)?;
    }
    bytes += std::fs::metadata(&dest)?.len();
    for lib in shared_libraries(bin)? {
        bytes += copy_into(&rootfs, &lib, &lib)?;
    }
    if Path::new(CA_BUNDLE).exists() {
        bytes += copy_into(&rootfs, Path::new(CA_BUNDLE), Path::new(CA_BUNDLE))?;
    }
    // Mount points: runc makes them itself in a writable layer, but not on a
    // read-only root.
    for dir in ["tmp", "proc", "sys", "dev", "etc/observer"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    let containerfile = ctx.join("Containerfile");
    std::fs::write(
        &containerfile,
        format!(
            "FROM scratch\n\
             COPY rootfs/ /\n\
             ENTRYPOINT [\"{BIN_IN_IMAGE}\"]\n\
             CMD [\"run\"]\n"
        ),
    )?;
    run_checked(
        Command::new("podman")
            .args(["build", "--quiet", "--tag", tag, "--file"])
            .arg(&containerfile)
            .arg(&ctx),
    )?;
    eprintln!(
        "xtask image: {tag} ({:.1} MB of files: {BIN_IN_IMAGE}, its shared libraries and loader, CA certificates)",
        bytes as f64 / 1e6
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ldd() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let libs = parse_ldd(text).expect("parses");
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
        assert!(parse_ldd("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n").is_err());
    }
}
