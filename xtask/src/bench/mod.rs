//! `cargo xtask bench`: what observing costs, side by side with the bpftrace
//! reference, measured in interleaved A/B rounds on loopback (the machine is
//! noisy: medians and per-round ratios), plus the userspace pipeline alone
//! (criterion). Writes target/bench/results.json and bench/RESULTS.md.

mod attach;
mod curl_latency;
mod daemon;
mod go_server;
pub mod load;
mod nginx;
mod proc;
mod report;
mod soak;
mod soak_traffic;
mod stops;

use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use attach::{Attached, Mode};
use go_server::{GoServer, GO_HTTPS_PORT};
use nginx::{Nginx, H2_PORT, HTTPS_PORT, HTTP_PORT};

use crate::{cargo, run_checked, workspace_root};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// A short run (under 3 minutes) for a first look.
    #[arg(long)]
    pub quick: bool,
    /// Rounds per workload (default 5; 2 with --quick).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Seconds per measurement (default 10; 4 with --quick).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Sockets tracked in the flood: half as many idle connections, both ends on
    /// this host (default 50000; 10000 with --quick).
    #[arg(long)]
    pub flood: Option<usize>,
    /// Only these workloads (https_keepalive, https_keepalive_half_rate,
    /// https_new_conn, http_keepalive, http_churn, h2_keepalive,
    /// go_https_keepalive, flood, curl_tls_latency, stops, pipeline, soak). The soak runs only when named here or given --soak-seconds.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Only re-render bench/RESULTS.md from target/bench/results.json and
    /// bench/NOTES.md (after editing the notes); measures nothing.
    #[arg(long)]
    pub report_only: bool,
    /// The soak alone: the daemon as deployed under every kind of traffic
    /// for 30 minutes (or --soak-seconds); fails unless its RSS and open
    /// descriptors stay within 5% of their level after warm-up, nothing is
    /// lost and every kind is recorded. Writes target/bench/soak.json and
    /// the soak's section of bench/RESULTS.md.
    #[arg(long)]
    pub soak: bool,
    /// The stops alone: how long SIGTERM to `run`, Ctrl-C to `watch` and
    /// `q` in `top` take to end the observer (3 runs each). Writes
    /// target/bench/stops.json and its section of bench/RESULTS.md.
    #[arg(long)]
    pub stops: bool,
    /// The soak's length; without --soak, the soak also runs after the
    /// other workloads.
    #[arg(long)]
    pub soak_seconds: Option<u64>,
    /// More arguments for every observer the bench starts (split at
    /// whitespace), to compare settings, e.g. "--tls-plaintext-probes off".
    /// The report names them.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub observer_args: Option<String>,
    /// How the observer runs: `run`, the daemon as deployed (spans and
    /// metrics sent over OTLP/HTTP to a receiver that reads them, its
    /// Prometheus endpoint scraped every 2 s), or `watch` (`watch --json`
    /// to /dev/null).
    #[arg(long, value_enum, default_value = "run")]
    pub observer_mode: attach::ObserverMode,
    /// Leave the bpftrace reference out of the throughput rounds (a third
    /// fewer measurements: for more rounds of baseline against observer).
    #[arg(long)]
    pub no_bpftrace: bool,
}

/// One measurement of one workload under one mode.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub rps: f64,
    pub requests: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
    /// The server's (nginx worker's, or the Go server's) CPU seconds during
    /// the run.
    pub server_cpu_s: f64,
    /// The attached tool's CPU seconds during the run.
    pub tool_cpu_s: f64,
    pub tool_peak_rss: u64,
    pub events: u64,
    pub dropped: u64,
    /// Where the losses were, when there were any ("kernel_missed 1").
    pub dropped_where: String,
    pub seconds: f64,
    /// From SIGINT to exit.
    pub shutdown_s: f64,
    /// Connections the observer saw open (both ends of a loopback
    /// connection count).
    pub connections: u64,
    /// Run time of all the observer's eBPF programs (kernel.bpf_stats_enabled).
    pub ebpf_ns: u64,
    /// What the OTLP receiver and the scraper took in (`run`).
    pub otlp_bytes: u64,
    pub scrapes: u64,
    /// The observer's programs: name, runs, run time (ns).
    pub programs: Vec<(String, u64, u64)>,
}

struct Workload {
    name: &'static str,
    url: String,
    conns: u32,
    close: bool,
    /// Paced by bench/pace.lua (about `conns` x 1000 requests/s).
    paced: bool,
    /// HTTP/2 with h2load, this many concurrent streams per connection (0:
    /// HTTP/1.1 with wrk).
    h2_streams: u32,
}

/// The process whose CPU time is the server's cost (nginx's one worker, or
/// the Go server), and which server it is, for the report.
#[derive(Debug, Clone, Copy)]
struct Server {
    name: &'static str,
    pid: u32,
}

fn workloads() -> Vec<Workload> {
    vec![
        Workload {
            name: "https_keepalive",
            url: format!("https://127.0.0.1:{HTTPS_PORT}/"),
            conns: 16,
            close: false,
            paced: false,
            h2_streams: 0,
        },
        Workload {
            name: "https_new_conn",
            url: format!("https://127.0.0.1:{HTTPS_PORT}/"),
            conns: 16,
            close: true,
            paced: false,
            h2_streams: 0,
        },
        Workload {
            name: "http_keepalive",
            url: format!("http://127.0.0.1:{HTTP_PORT}/"),
            conns: 16,
            close: false,
            paced: false,
            h2_streams: 0,
        },
        Workload {
            name: "http_churn",
            url: format!("http://127.0.0.1:{HTTP_PORT}/"),
            conns: 16,
            close: true,
            paced: false,
            h2_streams: 0,
        },
        Workload {
            name: "h2_keepalive",
            url: format!("https://127.0.0.1:{H2_PORT}/"),
            conns: 16,
            close: false,
            paced: false,
            h2_streams: 10,
        },
    ]
}

/// https_keepalive's load (the same wrk settings) on the Go server: the
/// observer's cost where TLS is Go's crypto/tls rather than OpenSSL.
fn go_https_keepalive() -> Workload {
    Workload {
        name: "go_https_keepalive",
        url: format!("https://127.0.0.1:{GO_HTTPS_PORT}/"),
        conns: 16,
        close: false,
        paced: false,
        h2_streams: 0,
    }
}

/// HTTPS keep-alive at about half the maximum rate (`max_rps`, the keep-alive
/// baseline), where latency rather than throughput shows the cost. Each paced
/// connection offers under 1,000 requests/s (1 ms pause plus the request), so
/// a short calibration run finds how many connections make half the maximum.
fn half_rate(root: &Path, max_rps: f64) -> Result<Workload> {
    let url = format!("https://127.0.0.1:{HTTPS_PORT}/");
    let probe_conns = 50;
    let pace = root.join("bench/pace.lua");
    let probe = load::wrk(&url, 3, probe_conns, false, Some(&pace))?;
    let per_conn = probe.rps / f64::from(probe_conns);
    let conns = ((max_rps / 2.0) / per_conn).round().clamp(1.0, 2000.0) as u32;
    eprintln!(
        "bench: half rate: {per_conn:.0} req/s per paced connection, {conns} connections for {:.0} req/s",
        max_rps / 2.0
    );
    load::pause();
    Ok(Workload {
        name: "https_keepalive_half_rate",
        url,
        conns,
        close: false,
        paced: true,
        h2_streams: 0,
    })
}

fn measure(root: &Path, server: Server, w: &Workload, mode: Mode, secs: u64) -> Result<Sample> {
    let tool = Attached::start(mode, root, &[])?;
    let (s0, t0) = (proc::cpu_seconds(server.pid), tool.cpu());
    let pace = root.join("bench/pace.lua");
    let r = if w.h2_streams > 0 {
        load::h2load(&w.url, secs, w.conns, w.h2_streams)?
    } else {
        load::wrk(
            &w.url,
            secs,
            w.conns,
            w.close,
            w.paced.then_some(pace.as_path()),
        )?
    };
    let (s1, t1) = (proc::cpu_seconds(server.pid), tool.cpu());
    let rss = tool.peak_rss();
    let consumed = tool.consumed().unwrap_or_default();
    let t_stop = std::time::Instant::now();
    let summary = tool.stop()?;
    let shutdown_s = t_stop.elapsed().as_secs_f64();
    let (events, dropped) = summary.as_ref().map_or((0, 0), |s| {
        (s["events"].as_u64().unwrap_or(0), attach::total_dropped(s))
    });
    let dropped_where = summary.as_ref().map_or_else(String::new, |s| {
        let mut w: String = attach::dropped_by_stage(s)
            .iter()
            .map(|(k, n)| format!(" {k} {n}"))
            .collect();
        w.push_str(&attach::missed_by_program(s));
        w
    });
    let (connections, ebpf_ns) = summary.as_ref().map_or((0, 0), observer_costs);
    load::pause();
    Ok(Sample {
        rps: r.rps,
        requests: r.requests,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        errors: r.errors,
        server_cpu_s: s1 - s0,
        tool_cpu_s: t1 - t0,
        tool_peak_rss: rss,
        events,
        dropped,
        dropped_where,
        seconds: secs as f64,
        shutdown_s,
        connections,
        ebpf_ns,
        otlp_bytes: consumed.otlp_bytes,
        scrapes: consumed.scrapes,
        programs: summary.as_ref().map_or_else(Vec::new, program_stats),
    })
}

/// Per-program runs and run time, from the observer's summary.
fn program_stats(s: &Value) -> Vec<(String, u64, u64)> {
    s["programs"].as_array().map_or_else(Vec::new, |ps| {
        ps.iter()
            .filter(|p| p["run_cnt"].as_u64().unwrap_or(0) > 0)
            .map(|p| {
                (
                    p["program"].as_str().unwrap_or("?").to_owned(),
                    p["run_cnt"].as_u64().unwrap_or(0),
                    p["run_time_ns"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    })
}

/// From the observer's summary: connections opened (both directions) and
/// the run time of all its eBPF programs.
fn observer_costs(s: &Value) -> (u64, u64) {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let ebpf = s["programs"].as_array().map_or(0, |ps| {
        ps.iter()
            .map(|p| p["run_time_ns"].as_u64().unwrap_or(0))
            .sum()
    });
    (n("outbound_opened") + n("inbound_opened"), ebpf)
}

/// Interleaved rounds: each round runs every mode once, in a rotated order so
/// that no mode always runs first (warm caches) or last.
///
/// The compared rounds run with kernel.bpf_stats_enabled off (it times every
/// program run, adding its own cost to the observer's side only); one more
/// observer run with it on, after them, measures the programs.
fn run_workload(
    root: &Path,
    server: Server,
    w: &Workload,
    rounds: u32,
    secs: u64,
    peer: bool,
) -> Result<Value> {
    let modes: &[Mode] = if peer {
        &[Mode::Baseline, Mode::Observer, Mode::Peer]
    } else {
        &[Mode::Baseline, Mode::Observer]
    };
    let mut samples: Vec<(Mode, u32, Sample)> = Vec::new();
    for round in 0..rounds {
        for i in 0..modes.len() {
            let mode = modes[(i + round as usize) % modes.len()];
            let s = measure(root, server, w, mode, secs)
                .with_context(|| format!("{} under {}", w.name, mode.name()))?;
            eprintln!(
                "bench: {:<16} round {round} {:<9} {:>10.0} req/s  p50 {:>7.0}us  p99 {:>7.0}us  tool cpu {:.2}s  events {}  dropped {}{}",
                w.name, mode.name(), s.rps, s.p50_us, s.p99_us, s.tool_cpu_s, s.events, s.dropped, s.dropped_where
            );
            samples.push((mode, round, s));
        }
    }
    let costs = {
        let _stats = BpfStats::set(true);
        measure(root, server, w, Mode::Observer, secs)
            .with_context(|| format!("{} with bpf_stats", w.name))?
    };
    eprintln!(
        "bench: {:<16} programs timed ({:.0} req/s with bpf_stats on, not a compared round)",
        w.name, costs.rps
    );
    let mut v = report::summarize_workload(w.name, rounds, &samples, &costs);
    v["server"] = json!(server.name);
    annotate(&mut v);
    Ok(v)
}

/// The observer's settings, on each workload's results.
fn annotate(v: &mut Value) {
    if let Some(a) = attach::OBSERVER_ARGS.get() {
        v["observer_args"] = json!(a.join(" "));
    }
    v["observer_mode"] = json!(match attach::observer_mode() {
        attach::ObserverMode::Run => "run",
        attach::ObserverMode::Watch => "watch",
    });
}

/// Many idle connections: the observer's memory with `tracked` sockets tracked
/// (tracked / 2 connections, both ends here).
fn run_flood(root: &Path, tracked: usize) -> Result<Value> {
    let n = tracked / 2;
    let mut out = json!({ "name": "flood", "connections": n, "tracked": tracked });
    for mode in [Mode::Baseline, Mode::Observer, Mode::Peer] {
        let tool = Attached::start(mode, root, &[])?;
        let rss0 = tool.pid().map_or(0, proc::rss_bytes);
        let flood = load::flood(n)?;
        std::thread::sleep(std::time::Duration::from_secs(2));
        let rss = tool.pid().map_or(0, proc::rss_bytes);
        let peak = tool.peak_rss();
        let cpu = tool.cpu();
        let open_s = flood.open_seconds;
        let summary = tool.stop()?;
        drop(flood);
        eprintln!(
            "bench: flood {n:>6} {:<9} opened in {open_s:.2}s  rss {} -> {} (peak {}) bytes",
            mode.name(),
            rss0,
            rss,
            peak
        );
        let key = mode.name();
        out[format!("{key}_open_seconds")] = json!(open_s);
        if mode != Mode::Baseline {
            out[format!("{key}_rss_before_bytes")] = json!(rss0);
            out[format!("{key}_rss_bytes")] = json!(rss);
            out[format!("{key}_peak_rss_bytes")] = json!(peak);
            out[format!("{key}_cpu_s")] = json!(cpu);
        }
        if let Some(s) = summary {
            out["observer_tracked_at_stop"] = s["open_records"].clone();
            out["observer_events"] = s["events"].clone();
            out["dropped"] = s["dropped"].clone();
        }
        load::pause();
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    if let (Some(b), Some(o)) = (
        out["baseline_open_seconds"].as_f64(),
        out["observer_open_seconds"].as_f64(),
    ) {
        out["ratio"] = json!(b / o);
    }
    Ok(out)
}

/// The criterion benchmark of decode + correlate, in events/s on one core.
fn run_pipeline(root: &Path, quick: bool) -> Result<Value> {
    let mut cmd = cargo();
    cmd.args([
        "bench",
        "--package",
        "observer",
        "--bench",
        "pipeline",
        "--",
    ]);
    if quick {
        cmd.args(["--warm-up-time", "1", "--measurement-time", "3"]);
    }
    run_checked(&mut cmd)?;
    let est = root.join("target/criterion/pipeline/decode_and_correlate/new/estimates.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&est).context("criterion estimates")?)?;
    let ns_per_iter = v["median"]["point_estimate"].as_f64().context("median")?;
    let events_per_s = observer_bench_events_per_iter() / (ns_per_iter / 1e9);
    eprintln!("bench: pipeline decode+correlate {events_per_s:.0} events/s on one core");
    // One streamed chat completion (22 plaintext records) per iteration.
    let est = root.join("target/criterion/pipeline/streamed_request/new/estimates.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&est).context("criterion estimates")?)?;
    let request_us = v["median"]["point_estimate"].as_f64().context("median")? / 1e3;
    eprintln!("bench: a streamed request's decode+parse+record {request_us:.2} µs on one core");
    // 100 churn requests (8 records each) to their metrics and encoded spans
    // per iteration.
    let est = root.join("target/criterion/pipeline/churn_request/new/estimates.json");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&est).context("criterion estimates")?)?;
    let churn_us = v["median"]["point_estimate"].as_f64().context("median")? / 1e3 / 100.0;
    eprintln!(
        "bench: a churn request's records to metrics and encoded spans {churn_us:.2} µs on one core"
    );
    Ok(json!({
        "name": "pipeline",
        "events_per_s": events_per_s,
        "request_us": request_us,
        "churn_request_us": churn_us,
    }))
}

/// kernel.bpf_stats_enabled set for a while, put back as it was on drop.
struct BpfStats(Option<String>);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn set(on: bool) -> BpfStats {
        let old = std::fs::read_to_string(BPF_STATS).ok();
        if std::fs::write(BPF_STATS, if on { "1" } else { "0" }).is_err() && on {
            eprintln!("bench: could not enable {BPF_STATS}: no eBPF run times");
        }
        BpfStats(old)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(v) = &self.0 {
            let _ = std::fs::write(BPF_STATS, v.trim());
        }
    }
}

/// Must match EVENTS_PER_ITER in observer/benches/pipeline.rs.
fn observer_bench_events_per_iter() -> f64 {
    10_000.0
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let root = workspace_root()?;
    if args.report_only {
        return report::write(&root, &[], false, 0, 0);
    }
    if args.soak {
        let _ = attach::OBSERVER_MODE.set(args.observer_mode);
        return run_soak_alone(&root, args.soak_seconds.unwrap_or(1800));
    }
    if args.stops {
        run_checked(cargo().args(["build", "--release", "--package", "observer"]))?;
        return report::write_stops_alone(&root, &stops::run(&root)?);
    }
    let quick = args.quick;
    let rounds = args.rounds.unwrap_or(if quick { 2 } else { 5 });
    let secs = args.seconds.unwrap_or(if quick { 4 } else { 10 });
    let flood_n = args.flood.unwrap_or(if quick { 10_000 } else { 50_000 });
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    crate::test::ensure_tools(&[
        ("nginx", "nginx"),
        ("wrk", "wrk"),
        ("h2load", "nghttp2-client"),
        ("bpftrace", "bpftrace"),
        ("openssl", "openssl"),
        ("go", "golang-go"),
    ])?;
    run_checked(cargo().args(["build", "--release", "--package", "observer"]))?;
    if let Some(a) = &args.observer_args {
        let _ = attach::OBSERVER_ARGS.set(a.split_whitespace().map(str::to_owned).collect());
    }
    let _ = attach::OBSERVER_MODE.set(args.observer_mode);
    // Off while anything is compared: per-program run time is measured in a
    // run of its own (run_workload). Put back as it was at the end.
    let _stats = BpfStats::set(false);
    let peer = !args.no_bpftrace;

    let mut results = Vec::new();
    if want("pipeline") {
        results.push(run_pipeline(&root, quick)?);
    }
    // Built before anything is measured, so that a missing Go stops the
    // bench at once rather than after the other workloads.
    let go_bin = want("go_https_keepalive")
        .then(|| go_server::build(&root))
        .transpose()?;
    let nginx = Nginx::start()?;
    let worker = Server {
        name: "nginx",
        pid: nginx.worker().context("nginx has no worker")?,
    };
    let mut max_rps = None;
    for w in workloads() {
        if want(w.name) {
            let r = run_workload(&root, worker, &w, rounds, secs, peer)?;
            if w.name == "https_keepalive" {
                max_rps = r["baseline_rps"].as_f64();
            }
            results.push(r);
        }
    }
    if want("https_keepalive_half_rate") {
        let w = half_rate(&root, max_rps.unwrap_or(110_000.0))?;
        results.push(run_workload(&root, worker, &w, rounds, secs, peer)?);
    }
    if let Some(bin) = &go_bin {
        let go = GoServer::start(bin, &nginx.dir)?;
        let server = Server {
            name: "go",
            pid: go.pid(),
        };
        let w = go_https_keepalive();
        results.push(run_workload(&root, server, &w, rounds, secs, peer)?);
    }
    if want("curl_tls_latency") {
        let mut v = curl_latency::run(&root, rounds)?;
        annotate(&mut v);
        results.push(v);
    }
    drop(nginx);
    if want("flood") {
        results.push(run_flood(&root, flood_n)?);
    }
    if want("stops") {
        results.push(stops::run(&root)?);
    }
    let soak = args.soak_seconds.or_else(|| {
        args.only
            .iter()
            .any(|o| o == "soak")
            .then_some(if quick { 60 } else { 1800 })
    });
    let soak = soak.map(|s| soak::run(&root, s)).transpose()?;
    results.extend(soak.clone());
    report::write(&root, &results, quick, rounds, secs)?;
    soak.as_ref().map_or(Ok(()), soak::check)
}

/// `--soak`: the soak alone, its section of bench/RESULTS.md rewritten in
/// place (the other workloads' sections stay as the last full run left them).
fn run_soak_alone(root: &Path, secs: u64) -> Result<()> {
    crate::test::ensure_tools(&[("nginx", "nginx"), ("wrk", "wrk"), ("curl", "curl")])?;
    run_checked(cargo().args(["build", "--release", "--package", "observer"]))?;
    let result = soak::run(root, secs)?;
    report::write_soak_alone(root, &result)?;
    soak::check(&result)
}
