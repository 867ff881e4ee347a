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
    aya_build::build_ebpf(
        [Package {
            name: "observer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
