//! What is attached during a measurement: nothing (baseline), observer, or the
//! bpftrace reference peer. Each runs as its own process so its CPU time and
//! peak memory can be read from /proc.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use super::{
    daemon::{Consumed, Daemon},
    proc::{cpu_seconds, peak_rss_bytes},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Baseline,
    Observer,
    Peer,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline",
            Mode::Observer => "observer",
            Mode::Peer => "bpftrace",
        }
    }
}

/// How the observer runs in the bench: `run` (the daemon as deployed:
/// spans and metrics exported over OTLP, Prometheus scraped) or `watch
/// --json` (the terminal view, records to /dev/null).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ObserverMode {
    Run,
    Watch,
}

pub struct Attached {
    child: Option<Child>,
    lines: Option<mpsc::Receiver<String>>,
    daemon: Option<Daemon>,
}

fn forward_lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            // Keep draining even when nobody listens, so the child never blocks.
            let _ = tx.send(line);
        }
    });
    rx
}

fn wait_for(rx: &mpsc::Receiver<String>, prefix: &str, what: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with(prefix) => return Ok(()),
            Ok(_) => {}
            Err(_) => bail!("{what} never printed `{prefix}`"),
        }
    }
}

/// The loss counters of the observer's summary, one per stage.
const LOSSES: [&str; 6] = [
    "kernel_ring",
    "kernel_map",
    "kernel_missed",
    "evicted",
    "channel",
    "output",
];

/// Every loss the observer's summary counts, by any stage.
pub fn total_dropped(summary: &Value) -> u64 {
    dropped_by_stage(summary).iter().map(|(_, n)| n).sum()
}

/// The stages that lost something, with their counts ("kernel_missed 1"),
/// so that a round's loss says where it happened.
pub fn dropped_by_stage(summary: &Value) -> Vec<(&'static str, u64)> {
    let d = &summary["dropped"];
    LOSSES
        .iter()
        .map(|&k| (k, d[k].as_u64().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// Which programs the kernel skipped (`kernel_missed`: another tracing
/// program was running on the CPU), " (inet_sock_set_state 1)"; empty when
/// none did.
pub fn missed_by_program(summary: &Value) -> String {
    let missed: Vec<String> = summary["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let n = p["recursion_misses"].as_u64().filter(|&n| n > 0)?;
            Some(format!("{} {n}", p["program"].as_str().unwrap_or("?")))
        })
        .collect();
    if missed.is_empty() {
        String::new()
    } else {
        format!(" ({})", missed.join(", "))
    }
}

/// The libssl that nginx and wrk map, for the peer's uprobes.
pub fn libssl() -> Result<String> {
    for p in [
        "/usr/lib/x86_64-linux-gnu/libssl.so.3",
        "/lib/x86_64-linux-gnu/libssl.so.3",
        "/usr/lib64/libssl.so.3",
    ] {
        if Path::new(p).exists() {
            return Ok(p.to_owned());
        }
    }
    bail!("libssl.so.3 not found")
}

/// `--observer-args`, for every observer the bench starts.
pub static OBSERVER_ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
/// `--observer-mode` (default run).
pub static OBSERVER_MODE: std::sync::OnceLock<ObserverMode> = std::sync::OnceLock::new();

pub fn observer_mode() -> ObserverMode {
    *OBSERVER_MODE.get().unwrap_or(&ObserverMode::Run)
}

impl Attached {
    pub fn start(mode: Mode, root: &Path, extra: &[&str]) -> Result<Attached> {
        match mode {
            Mode::Baseline => Ok(Attached {
                child: None,
                lines: None,
                daemon: None,
            }),
            Mode::Observer => {
                let mut cmd = Command::new(root.join("target/release/observer"));
                let mut daemon = None;
                match observer_mode() {
                    ObserverMode::Watch => {
                        cmd.args(["watch", "--json", "--update-interval", "0"]);
                    }
                    ObserverMode::Run => {
                        let d = Daemon::start()?;
                        // --json: the summary line on stderr as JSON.
                        cmd.args(["run", "--json"]).args(d.args()).envs(d.env());
                        daemon = Some(d);
                    }
                }
                let mut child = cmd
                    .args(extra)
                    .args(OBSERVER_ARGS.get().into_iter().flatten())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting observer")?;
                let rx = forward_lines(child.stderr.take().context("stderr")?);
                wait_for(&rx, "ready", "observer")?;
                if let Some(d) = daemon.as_mut() {
                    d.start_scraping();
                }
                Ok(Attached {
                    child: Some(child),
                    lines: Some(rx),
                    daemon,
                })
            }
            Mode::Peer => {
                let script = std::fs::read_to_string(root.join("bench/peer.bt"))?
                    .replace("LIBSSL", &libssl()?);
                let path = std::env::temp_dir().join("observer-bench-peer.bt");
                std::fs::write(&path, script)?;
                let mut child = Command::new("bpftrace")
                    .arg(&path)
                    .env("BPFTRACE_MAP_KEYS_MAX", "200000")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting bpftrace")?;
                let rx = forward_lines(child.stdout.take().context("stdout")?);
                wait_for(&rx, "Attaching", "bpftrace")?;
                // bpftrace prints "Attaching" before the last probes are in.
                std::thread::sleep(Duration::from_millis(500));
                Ok(Attached {
                    child: Some(child),
                    lines: Some(rx),
                    daemon: None,
                })
            }
        }
    }

    /// The observer's gauges named `prefix` by label (`run` only; see
    /// [`Daemon::gauges`]).
    pub fn gauges(&self, prefix: &str) -> Vec<(String, f64)> {
        self.daemon
            .as_ref()
            .map_or_else(Vec::new, |d| d.gauges(prefix))
    }

    /// What the OTLP receiver and the scraper took in so far (`run` only).
    pub fn consumed(&self) -> Option<Consumed> {
        self.daemon.as_ref().map(Daemon::consumed)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn cpu(&self) -> f64 {
        self.pid().map_or(0.0, cpu_seconds)
    }

    pub fn peak_rss(&self) -> u64 {
        self.pid().map_or(0, peak_rss_bytes)
    }

    /// Stops the tool; for observer, returns its summary.
    pub fn stop(mut self) -> Result<Option<Value>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: signalling our own child. SIGINT ends bpftrace, SIGTERM observer
        // (both handle either).
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let status = child.wait()?;
        if !status.success() {
            bail!("attached tool exited with {status}");
        }
        // The receiver stays up through the exporter's last flush.
        drop(self.daemon.take());
        let summary = self
            .lines
            .take()
            .into_iter()
            .flat_map(|rx| rx.into_iter())
            .find_map(|l| l.strip_prefix("summary ").map(str::to_owned));
        Ok(match summary {
            Some(s) => Some(serde_json::from_str(&s)?),
            None => None,
        })
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_missed_run_names_its_program() {
        let s = json!({
            "dropped": {"kernel_missed": 3},
            "programs": [
                {"program": "inet_sock_set_state", "recursion_misses": 2},
                {"program": "packets_egress", "recursion_misses": 0},
                {"program": "tcp_send_reset", "recursion_misses": 1},
            ],
        });
        assert_eq!(dropped_by_stage(&s), vec![("kernel_missed", 3)]);
        assert_eq!(
            missed_by_program(&s),
            " (inet_sock_set_state 2, tcp_send_reset 1)"
        );
        assert_eq!(missed_by_program(&json!({"programs": []})), "");
        assert_eq!(missed_by_program(&json!({})), "");
    }
}
