//! The latency a fresh process sees, not throughput: curl started anew for
//! each request to the bench's nginx over HTTPS, its own `-w` timings read
//! (TLS handshake = `time_appconnect - time_connect`), with nothing, the
//! observer and bpftrace attached in interleaved rounds.

use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{
    attach::{Attached, Mode},
    nginx::HTTPS_PORT,
};

/// curl runs per mode per round.
const RUNS: usize = 30;

#[derive(Default)]
struct Times {
    tls_ms: Vec<f64>,
    appconnect_ms: Vec<f64>,
    first_byte_ms: Vec<f64>,
}

fn curl_once(url: &str) -> Result<(f64, f64, f64)> {
    let out = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "--http1.1"])
        .args([
            "-w",
            "%{time_connect} %{time_appconnect} %{time_starttransfer}",
        ])
        .arg(url)
        .output()
        .context("running curl")?;
    if !out.status.success() {
        bail!("curl failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().map(|s| s * 1e3))
        .collect::<Result<_, _>>()
        .with_context(|| format!("curl -w printed {text:?}"))?;
    match v[..] {
        [connect, appconnect, first] => Ok((appconnect - connect, appconnect, first)),
        _ => bail!("curl -w printed {text:?}"),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn run(root: &Path, rounds: u32) -> Result<Value> {
    let url = format!("https://127.0.0.1:{HTTPS_PORT}/");
    let modes = [Mode::Baseline, Mode::Observer, Mode::Peer];
    let mut times: Vec<Times> = modes.iter().map(|_| Times::default()).collect();
    for round in 0..rounds as usize {
        for i in 0..modes.len() {
            let m = (i + round) % modes.len();
            let tool = Attached::start(modes[m], root, &[])?;
            for _ in 0..RUNS {
                let (tls, app, first) = curl_once(&url)?;
                let t = &mut times[m];
                t.tls_ms.push(tls);
                t.appconnect_ms.push(app);
                t.first_byte_ms.push(first);
            }
            tool.stop()?;
            super::load::pause();
        }
        eprintln!(
            "bench: curl_tls_latency round {round}: TLS median so far baseline {:.3} ms, observer {:.3} ms, bpftrace {:.3} ms",
            median(&times[0].tls_ms),
            median(&times[1].tls_ms),
            median(&times[2].tls_ms)
        );
    }
    let (b, o, p) = (&times[0], &times[1], &times[2]);
    Ok(json!({
        "name": "curl_tls_latency",
        "rounds": rounds,
        "runs_per_round": RUNS,
        "baseline_tls_ms": median(&b.tls_ms),
        "observer_tls_ms": median(&o.tls_ms),
        "peer_tls_ms": median(&p.tls_ms),
        "observer_tls_added_ms": median(&o.tls_ms) - median(&b.tls_ms),
        "peer_tls_added_ms": median(&p.tls_ms) - median(&b.tls_ms),
        "baseline_appconnect_ms": median(&b.appconnect_ms),
        "observer_appconnect_ms": median(&o.appconnect_ms),
        "peer_appconnect_ms": median(&p.appconnect_ms),
        "baseline_first_byte_ms": median(&b.first_byte_ms),
        "observer_first_byte_ms": median(&o.first_byte_ms),
        "peer_first_byte_ms": median(&p.first_byte_ms),
    }))
}
