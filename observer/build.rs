//! Builds the eBPF programs from source (observer-ebpf) with the nightly
//! toolchain and bpf-linker that `cargo xtask setup` installs. Set
//! AYA_BUILD_SKIP=1 for lint-only jobs without nightly.

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
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
