//! How long the observer takes to stop, each way a user or an orchestrator
//! stops it: SIGTERM to `run` (as deployed; a DaemonSet's rolling update
//! waits on it), Ctrl-C (SIGINT) to `watch`, and `q` in `top` (on a
//! terminal of its own, through script(1)). Each from the signal or key to
//! the process's exit, after it said it was ready; with nothing else
//! running, so what is measured is the observer's own teardown (its
//! uprobes, programs and links).

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::daemon::Daemon;

/// Stops of each kind measured.
const RUNS: usize = 3;
/// How long a start may take (the first attach waits RCU grace periods).
const READY_WITHIN: Duration = Duration::from_secs(60);

pub fn run(root: &Path) -> Result<Value> {
    let bin = root.join("target/release/observer");
    let (mut run_s, mut watch_s, mut top_s) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        run_s.push(run_sigterm(&bin)?);
        watch_s.push(watch_sigint(&bin)?);
        top_s.push(top_q(&bin)?);
    }
    eprintln!("bench: stops: run {run_s:.3?} s, watch {watch_s:.3?} s, top {top_s:.3?} s");
    Ok(json!({
        "name": "stops",
        "runs": RUNS,
        "run_sigterm_s": run_s,
        "watch_sigint_s": watch_s,
        "top_q_s": top_s,
    }))
}

/// `run` as deployed (its OTLP receiver and scraper up), stopped by SIGTERM.
fn run_sigterm(bin: &Path) -> Result<f64> {
    let mut d = Daemon::start()?;
    let mut cmd = Command::new(bin);
    cmd.arg("run").args(d.args()).envs(d.env());
    let child = started(cmd, "run")?;
    d.start_scraping();
    let took = signalled(child, libc::SIGTERM, "run")?;
    drop(d);
    Ok(took)
}

fn watch_sigint(bin: &Path) -> Result<f64> {
    let mut cmd = Command::new(bin);
    cmd.args(["watch", "--json"]);
    signalled(started(cmd, "watch")?, libc::SIGINT, "watch")
}

/// `cmd` started, once it printed its `ready` line on stderr (the rest of
/// its output is drained).
fn started(mut cmd: Command, what: &str) -> Result<Child> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting observer {what}"))?;
    let lines = child.stderr.take().context("stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(lines).lines().map_while(Result::ok) {
            if l.starts_with("ready") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(READY_WITHIN).is_err() {
        let _ = child.kill();
        bail!("observer {what} never printed `ready`");
    }
    Ok(child)
}

/// Seconds from `signal` to the child's (successful) exit.
fn signalled(mut child: Child, signal: i32, what: &str) -> Result<f64> {
    let t = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait()?;
    let took = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("observer {what} exited with {status} after the signal");
    }
    Ok(took)
}

/// `top` on a terminal of its own (script(1) gives it one and passes our
/// bytes to it as keys): seconds from `q` to its exit, a second after its
/// table is drawn.
fn top_q(bin: &Path) -> Result<f64> {
    let mut child = Command::new("script")
        .args(["-qfec", &format!("{} top", bin.display()), "/dev/null"])
        .env("TERM", "xterm")
        .env("COLUMNS", "160")
        .env("LINES", "40")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting observer top under script(1) (util-linux)")?;
    let mut screen = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let mut told = false;
        while let Ok(n) = screen.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if !told && seen.windows(12).any(|w| w == b"observer top") {
                told = true;
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(READY_WITHIN).is_err() {
        let _ = child.kill();
        bail!("observer top never drew its table");
    }
    // Its start-up over (the table is drawn as the probes go on).
    std::thread::sleep(Duration::from_secs(1));
    let mut keys = child.stdin.take().context("stdin")?;
    let t = Instant::now();
    keys.write_all(b"q")?;
    keys.flush()?;
    let status = child.wait()?;
    let took = t.elapsed().as_secs_f64();
    if !status.success() {
        bail!("observer top exited with {status} after q");
    }
    Ok(took)
}
