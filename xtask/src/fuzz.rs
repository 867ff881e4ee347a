//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the parsers of outside bytes
//! under cargo-fuzz (libFuzzer, coverage-guided), on the nightly the eBPF
//! build already uses. Each target starts from its kept corpus
//! (fuzz/corpus/TARGET, recorded from the tests' own traffic by `--seed`)
//! and the inputs of crashes once found (fuzz/regressions/TARGET); what it
//! finds new goes to fuzz/target/corpus/TARGET, a crash to
//! fuzz/artifacts/TARGET. The observer's unit tests run the kept inputs too
//! (observer/src/fuzzing.rs).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{run_checked, workspace_root};

/// The targets, as fuzz/fuzz_targets names them (and observer::fuzzing's
/// TARGETS; a unit test there checks each has its file).
pub const TARGETS: &[&str] = &[
    "http",
    "http2",
    "gen_ai",
    "dns",
    "elf",
    "pclntab",
    "procmaps",
    "config",
    "tls_hello",
];

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// How long each target runs.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Record the seed corpora again from the tests' traffic (as root;
    /// needs the tests' Python environments: run the tests once first).
    #[arg(long)]
    pub seed: bool,
    /// What `cargo xtask test` runs: every target for 10 s, built without
    /// sanitizer or cargo-fuzz (--seconds and targets do not apply).
    #[arg(long)]
    pub smoke: bool,
    /// Targets to run (default: all).
    pub targets: Vec<String>,
}

/// What one target's run gave.
struct Outcome {
    target: String,
    seconds: f64,
    runs: Option<u64>,
    coverage: Option<u64>,
    features: Option<u64>,
    crashed: bool,
}

pub fn run(args: &FuzzArgs) -> Result<()> {
    let root = workspace_root()?;
    if args.seed {
        return seed(&root);
    }
    if args.smoke {
        return smoke(&root);
    }
    ensure_cargo_fuzz()?;
    let targets: Vec<String> = if args.targets.is_empty() {
        TARGETS.iter().map(|t| (*t).to_string()).collect()
    } else {
        args.targets.clone()
    };
    for t in &targets {
        if !TARGETS.contains(&t.as_str()) {
            bail!("no fuzz target {t}; there are: {}", TARGETS.join(", "));
        }
    }
    run_checked(fuzz_cmd(&root).args(["build", "-O", "--fuzz-dir", "fuzz"]))?;
    let mut outcomes = Vec::new();
    for t in &targets {
        outcomes.push(run_target(&root, t, args.seconds, &Runner::CargoFuzz)?);
    }
    report(&outcomes)
}

fn fuzz_cmd(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["+nightly", "fuzz"]).current_dir(root);
    cmd
}

/// cargo-fuzz, installed from crates.io once.
fn ensure_cargo_fuzz() -> Result<()> {
    let there = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if there {
        return Ok(());
    }
    eprintln!("xtask fuzz: installing cargo-fuzz");
    run_checked(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}

/// How a target runs: through cargo-fuzz (its sanitizer build, in
/// fuzz/target), or the binary of the quick build `cargo xtask test` makes.
enum Runner<'a> {
    CargoFuzz,
    Binary(&'a Path),
}

/// Seconds each target runs in `cargo xtask test` (CI): long enough to
/// pass through every kept input and mutate a while, short enough that
/// the nine cost under two minutes.
pub const SMOKE_SECONDS: u64 = 10;

/// The rust flags cargo-fuzz gives a build without sanitizer (`-s none`):
/// libFuzzer's coverage counters and comparison tracing, and `cfg(fuzzing)`.
const SANCOV_FLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg=fuzzing",
    "-Cdebug-assertions",
    "-Coverflow-checks",
];

/// `cargo xtask test`'s fuzzing: every target for [`SMOKE_SECONDS`], built
/// with coverage but without AddressSanitizer (plain cargo on the nightly,
/// unoptimized: a third of cargo-fuzz's build time, and no cargo-fuzz to
/// install), in target/fuzz-smoke. A crash fails the test run and leaves
/// its input in fuzz/artifacts/TARGET, as `cargo xtask fuzz` does.
pub fn smoke(root: &Path) -> Result<()> {
    let dir = root.join("target/fuzz-smoke");
    let started = Instant::now();
    let triple = host_triple()?;
    run_checked(
        Command::new("cargo")
            .args(["+nightly", "build", "--bins", "--manifest-path"])
            .arg(root.join("fuzz/Cargo.toml"))
            .args(["--target", &triple])
            .env("CARGO_TARGET_DIR", &dir)
            // No debug information to write and link: a crash is told by
            // its kept input, run again under `cargo xtask fuzz`.
            .env("CARGO_PROFILE_DEV_DEBUG", "0")
            .env("RUSTFLAGS", SANCOV_FLAGS.join(" "))
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
    )
    .context("building the fuzz targets")?;
    eprintln!(
        "xtask fuzz: targets built in {:.0} s; {SMOKE_SECONDS} s each",
        started.elapsed().as_secs_f64()
    );
    let bins = dir.join(&triple).join("debug");
    let mut outcomes = Vec::new();
    for t in TARGETS {
        let runner = Runner::Binary(&bins.join(t));
        outcomes.push(run_target(root, t, SMOKE_SECONDS, &runner)?);
    }
    report(&outcomes)
}

/// The host's target triple (rustc -vV): the build names it so that the
/// coverage flags reach the targets but not the build scripts.
fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV names no host")
}

fn run_target(root: &Path, target: &str, seconds: u64, runner: &Runner) -> Result<Outcome> {
    let work = root.join("fuzz/target/corpus").join(target);
    let artifacts = root.join("fuzz/artifacts").join(target);
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&artifacts)?;
    let mut dirs = vec![work];
    for kept in ["corpus", "regressions"] {
        let d = root.join("fuzz").join(kept).join(target);
        if d.is_dir() {
            dirs.push(d);
        }
    }
    let started = Instant::now();
    let mut cmd = match runner {
        Runner::CargoFuzz => {
            let mut c = fuzz_cmd(root);
            c.args(["run", "-O", "--fuzz-dir", "fuzz", target])
                .args(&dirs)
                .arg("--");
            c
        }
        Runner::Binary(bin) => {
            let mut c = Command::new(bin);
            c.args(&dirs);
            c
        }
    };
    let out = cmd
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-print_final_stats=1", "-rss_limit_mb=2048", "-timeout=10"])
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running fuzz target {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let last_status = log.lines().rev().find(|l| l.contains(" cov: "));
    let stat = |name: &str| -> Option<u64> {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
    };
    let after = |line: Option<&str>, key: &str| -> Option<u64> {
        let rest = line?.split(key).nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let crashed = !out.status.success();
    if crashed {
        eprintln!("{log}");
    }
    Ok(Outcome {
        target: target.to_string(),
        seconds: started.elapsed().as_secs_f64(),
        runs: stat("number_of_executed_units"),
        coverage: after(last_status, " cov: "),
        features: after(last_status, " ft: "),
        crashed,
    })
}

/// The table of what each target did; an error naming those that crashed.
fn report(outcomes: &[Outcome]) -> Result<()> {
    print_table(outcomes);
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.crashed)
        .map(|o| o.target.as_str())
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {crashed:?}: the inputs are in fuzz/artifacts/TARGET; fix \
             the parser and keep each input in fuzz/regressions/TARGET"
        );
    }
    Ok(())
}

fn print_table(outcomes: &[Outcome]) {
    let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    println!(
        "{:<10} {:>8} {:>12} {:>8} {:>8}  result",
        "target", "seconds", "runs", "cov", "ft"
    );
    for o in outcomes {
        println!(
            "{:<10} {:>8.0} {:>12} {:>8} {:>8}  {}",
            o.target,
            o.seconds,
            show(o.runs),
            show(o.coverage),
            show(o.features),
            if o.crashed { "CRASHED" } else { "clean" }
        );
    }
}

/// Records the seed corpora (fuzz/seed.py) in a network namespace of its
/// own, with the Python environments the tests made.
fn seed(root: &Path) -> Result<()> {
    let venv = |name: &str| -> Result<PathBuf> {
        let p = root.join(format!("target/test-venv-{name}/bin/python"));
        anyhow::ensure!(
            p.exists(),
            "{} is missing: run the tests once (cargo xtask test) to make it",
            p.display()
        );
        Ok(p)
    };
    run_checked(
        Command::new("unshare")
            .args(["-n", "python3"])
            .arg(root.join("fuzz/seed.py"))
            .env("SEED_SDK_PYTHON", venv("llm-sdks")?)
            .env("SEED_H2_PYTHON", venv("h2")?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_are_the_fuzz_target_files() {
        let dir = workspace_root().expect("root").join("fuzz/fuzz_targets");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("fuzz/fuzz_targets")
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".rs")
                    .map(String::from)
            })
            .collect();
        files.sort();
        let mut targets: Vec<&str> = TARGETS.to_vec();
        targets.sort_unstable();
        assert_eq!(files, targets);
        let manifest = std::fs::read_to_string(dir.join("../Cargo.toml")).expect("manifest");
        for t in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{t}\"")),
                "{t} not in fuzz/Cargo.toml"
            );
        }
    }
}
