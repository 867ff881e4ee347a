//! Builds the eBPF programs from source (observer-ebpf) with the nightly
//! toolchain and bpf-linker that `cargo xtask setup` installs. Set
//! AYA_BUILD_SKIP=1 for lint-only jobs without nightly.

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // The fuzz targets (feature `fuzzing`, fuzz/) feed bytes to parsers and
    // load no program: an empty object spares their instrumented builds the
    // eBPF one (loading it would fail at parsing, should such a build run).
    if std::env::var_os("CARGO_FEATURE_FUZZING").is_some() {
        let out = std::env::var("OUT_DIR").context("OUT_DIR not set")?;
        std::fs::write(std::path::Path::new(&out).join("observer"), [])?;
        return Ok(());
    }
    let meta = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let root = std::path::Path::new(&meta)
        .parent()
        .ok_or_else(|| anyhow!("observer has no parent directory"))?
        .join("observer-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    share_the_ebpf_target_dir()?;
    aya_build::build_ebpf(
        [Package {
            name: "observer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

/// aya-build builds the programs in a target directory under this build
/// script's OUT_DIR, which is new for every feature set the observer is built
/// with: the test run builds it three ways (the targets, `cargo test`, the
/// guests' observer), and each built core and the programs from scratch, 65 s
/// each on a fresh CI machine. That directory becomes a link to one under the
/// workspace's target directory (cargo's own lock on the directory keeps
/// builds that run at once apart), meant to let the second build find the
/// first's work. Measured in a fresh-clone run (2026-12-08): it does not yet:
/// all three builds went to target/ebpf and each still compiled everything
/// (1m24s), the nested cargo's fingerprints differing between the outer
/// invocations (bench/NOTES.md, issue 57 section).
fn share_the_ebpf_target_dir() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").context("OUT_DIR not set")?);
    // OUT_DIR is <target>/<profile>/build/observer-<hash>/out.
    let Some(target) = out.ancestors().nth(4) else {
        return Ok(());
    };
    let shared = target.join("ebpf");
    let link = out.join("aya-build").join("target").join("observer-ebpf");
    if link.exists() || link.symlink_metadata().is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(&shared)?;
    std::fs::create_dir_all(link.parent().context("no parent")?)?;
    std::os::unix::fs::symlink(&shared, &link)
        .with_context(|| format!("linking {} to {}", link.display(), shared.display()))
}
