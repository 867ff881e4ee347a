//! Project tasks: `cargo xtask setup | build | run | test | fuzz | image | imports | vmtest`.
//!
//! `build`, `run` and `test` call `setup` first, so a fresh machine of this kind
//! needs nothing but these commands. xtask orchestrates; the eBPF object itself
//! is built by observer/build.rs.

mod bench;
mod fuzz;
mod image;
mod imports;
mod long_fns;
mod setup;
mod test;
mod vmtest;

use std::process::Command;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "observer's project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building needs (rust-src for nightly, bpf-linker); quick when all is there.
    Setup,
    /// Build target/{debug,release}/observer.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build (release) and run observer with ARGS, e.g. `cargo xtask run -- watch`.
    Run {
        #[arg(long, help = "Build in debug mode instead of release")]
        debug: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure what observing costs against a baseline and the bpftrace peer (as root).
    Bench(bench::BenchArgs),
    /// (internal) Hold idle connections for the bench's flood.
    #[command(hide = true)]
    FloodHold {
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// On a machine with an NVIDIA GPU: build, then compare `observer gpu
    /// --json` with nvidia-smi and check a short `observer watch` while this
    /// check holds a CUDA context (tests/helpers/gpu_check.py).
    GpuCheck,
    /// Build the container image localhost/observer:latest (podman, FROM
    /// scratch: the release binary, its shared libraries and loader).
    Image(image::ImageArgs),
    /// The structure drawing of observer/src from its imports: top-level
    /// modules in layers; fails on an import circle or a function over 80 lines.
    Imports {
        /// Print Graphviz (dot) instead: `cargo xtask imports --dot | dot -Tsvg`.
        #[arg(long)]
        dot: bool,
        /// List every file's imports instead.
        #[arg(long)]
        edges: bool,
    },
    /// The parsers of outside bytes under cargo-fuzz: each target for
    /// --seconds from its kept corpus; a table of runs and coverage.
    Fuzz(fuzz::FuzzArgs),
    /// Run every test: unit tests and the end-to-end tests (as root).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a command as root on stock Debian kernels (5.10, 6.1, 6.12) in
    /// qemu, with this machine's root filesystem: `cargo xtask vmtest
    /// --kernel 6.1 -- CMD`; by default uname and a BPF feature probe.
    Vmtest(vmtest::VmtestArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup => setup::run(),
        Task::Build { release } => {
            setup::run()?;
            build(release)
        }
        Task::Run { debug, args } => {
            setup::run()?;
            build(!debug)?;
            let bin = workspace_root()?
                .join("target")
                .join(if debug { "debug" } else { "release" })
                .join("observer");
            let status = Command::new(&bin)
                .args(&args)
                .status()
                .with_context(|| format!("running {}", bin.display()))?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Task::Bench(args) => {
            setup::run()?;
            bench::run(&args)
        }
        Task::FloodHold { args } => bench::load::hold(&args),
        Task::GpuCheck => {
            setup::run()?;
            build(true)?;
            let root = workspace_root()?;
            let status = Command::new("python3")
                .arg(root.join("tests/helpers/gpu_check.py"))
                .arg(root.join("target/release/observer"))
                .status()
                .context("running tests/helpers/gpu_check.py")?;
            anyhow::ensure!(status.success(), "gpu-check failed");
            Ok(())
        }
        Task::Image(args) => image::run(&args),
        Task::Imports { dot, edges } => imports::run(dot, edges),
        Task::Fuzz(args) => {
            setup::run()?;
            fuzz::run(&args)
        }
        Task::Test { args } => {
            setup::run()?;
            test::run(&args)
        }
        Task::Vmtest(args) => vmtest::run(&args),
    }
}

pub fn workspace_root() -> Result<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    dir.parent()
        .map(std::path::Path::to_path_buf)
        .context("xtask has no parent directory")
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    if let Ok(root) = workspace_root() {
        cmd.current_dir(root);
    }
    cmd
}

pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn build(release: bool) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--package", "observer"]);
    if release {
        cmd.arg("--release");
    }
    run_checked(&mut cmd)
}
