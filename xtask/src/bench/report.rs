//! Results: medians per workload, JSON for machines, markdown for people.

use std::path::Path;

use anyhow::Result;
use serde_json::{json, Value};

use super::{attach::Mode, Sample};

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `costs`: an observer run with kernel.bpf_stats_enabled on, for the
/// programs' run time (not one of the compared rounds).
pub fn summarize_workload(
    name: &str,
    rounds: u32,
    samples: &[(Mode, u32, Sample)],
    costs: &Sample,
) -> Value {
    let of = |m: Mode| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|(x, _, _)| *x == m)
            .map(|(_, _, s)| s)
            .collect()
    };
    let med = |m: Mode, f: &dyn Fn(&Sample) -> f64| median(of(m).into_iter().map(f).collect());
    // Per-round ratios against the same round's baseline.
    let ratios = |m: Mode, f: &dyn Fn(&Sample) -> f64| -> Vec<f64> {
        (0..rounds)
            .filter_map(|r| {
                let get = |mode: Mode| {
                    samples
                        .iter()
                        .find(|(x, rr, _)| *x == mode && *rr == r)
                        .map(|(_, _, s)| f(s))
                };
                Some(get(m)? / get(Mode::Baseline)?)
            })
            .collect()
    };
    let ratio = |m: Mode, f: &dyn Fn(&Sample) -> f64| median(ratios(m, f));
    let per_req = |m: Mode, f: &dyn Fn(&Sample) -> f64| {
        med(m, &|s: &Sample| {
            if s.requests > 0.0 {
                f(s) / s.requests * 1e6
            } else {
                0.0
            }
        })
    };
    let per_conn = |f: &dyn Fn(&Sample) -> f64| {
        med(Mode::Observer, &|s: &Sample| {
            if s.connections > 0 {
                f(s) / s.connections as f64
            } else {
                0.0
            }
        })
    };
    let (b, o, p) = (Mode::Baseline, Mode::Observer, Mode::Peer);
    // Per program, from the timed run: runs per request and per connection,
    // ns per run.
    let s = costs;
    let programs: Vec<Value> = s
        .programs
        .iter()
        .map(|(name, runs, ns)| {
            json!({
                "program": name,
                "runs_per_request": *runs as f64 / s.requests.max(1.0),
                "runs_per_connection": *runs as f64 / (s.connections.max(1) as f64),
                "ns_per_run": if *runs > 0 { *ns as f64 / *runs as f64 } else { 0.0 },
                "ns_per_connection": *ns as f64 / (s.connections.max(1) as f64),
            })
        })
        .collect();
    let mut round_ratios = ratios(o, &|s| s.rps);
    round_ratios.sort_by(f64::total_cmp);
    let events = med(o, &|s| s.events as f64);
    let obs_cpu = med(o, &|s| s.tool_cpu_s);
    let server_b = per_req(b, &|s| s.server_cpu_s);
    let server_o = per_req(o, &|s| s.server_cpu_s);
    json!({
        "name": name,
        "rounds": rounds,
        "baseline_rps": med(b, &|s| s.rps),
        "observed_rps": med(o, &|s| s.rps),
        "ratio": ratio(o, &|s| s.rps),
        "p50_ratio": ratio(o, &|s| s.p50_us),
        "p99_ratio": ratio(o, &|s| s.p99_us),
        "baseline_p50_us": med(b, &|s| s.p50_us),
        "baseline_p99_us": med(b, &|s| s.p99_us),
        "observed_p50_us": med(o, &|s| s.p50_us),
        "observed_p99_us": med(o, &|s| s.p99_us),
        "events": events,
        "events_per_s": med(o, &|s| s.events as f64 / s.seconds),
        "dropped": of(o).iter().map(|s| s.dropped).sum::<u64>(),
        "errors": samples.iter().map(|(_, _, s)| s.errors).sum::<u64>(),
        "observer_cpu_s": obs_cpu,
        "observer_cpu_us_per_request": per_req(o, &|s| s.tool_cpu_s),
        "connections_per_s": med(o, &|s| s.connections as f64 / s.seconds),
        "observer_cpu_us_per_connection": per_conn(&|s| s.tool_cpu_s * 1e6),
        "ebpf_us_per_connection": costs.ebpf_ns as f64 / 1e3 / costs.connections.max(1) as f64,
        "ebpf_us_per_request": costs.ebpf_ns as f64 / 1e3 / costs.requests.max(1.0),
        "timed_rps": costs.rps,
        "round_ratios": round_ratios,
        "otlp_bytes_per_s": med(o, &|s| s.otlp_bytes as f64 / s.seconds),
        "scrapes": med(o, &|s| s.scrapes as f64),
        "programs": programs,
        "observer_cpu_s_per_1000_events": if events > 0.0 { obs_cpu / events * 1000.0 } else { 0.0 },
        "observer_peak_rss_bytes": of(o).iter().map(|s| s.tool_peak_rss).max().unwrap_or(0),
        "observer_shutdown_s_max": of(o).iter().map(|s| s.shutdown_s).fold(0.0, f64::max),
        "server_cpu_us_per_request_baseline": server_b,
        "server_cpu_us_per_request_observed": server_o,
        "server_cpu_ratio": if server_b > 0.0 { server_o / server_b } else { 0.0 },
        "peer_rps": med(p, &|s| s.rps),
        "peer_ratio": ratio(p, &|s| s.rps),
        "peer_p99_ratio": ratio(p, &|s| s.p99_us),
        "peer_cpu_s": med(p, &|s| s.tool_cpu_s),
        "peer_cpu_us_per_request": per_req(p, &|s| s.tool_cpu_s),
        "peer_peak_rss_bytes": of(p).iter().map(|s| s.tool_peak_rss).max().unwrap_or(0),
        "server_cpu_us_per_request_peer": per_req(p, &|s| s.server_cpu_s),
    })
}

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} CPUs ({model}), Linux {}", kernel.trim())
}

fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// The per-round ratios' lower quartile, median and upper quartile (the
/// spread a single ratio carries on this machine); "-" for runs that did not
/// keep them.
fn quartiles(r: &Value) -> String {
    let Some(v) = r["round_ratios"].as_array() else {
        return "-".into();
    };
    let mut v: Vec<f64> = v.iter().filter_map(Value::as_f64).collect();
    if v.is_empty() {
        return "-".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "{:.3} / {:.3} / {:.3} (n={})",
        at(0.25),
        at(0.5),
        at(0.75),
        v.len()
    )
}

/// The workload's server; results from before the Go server were all nginx.
fn server(r: &Value) -> &str {
    r["server"].as_str().unwrap_or("nginx")
}

fn mib(v: &Value, k: &str) -> String {
    format!("{:.1}", f(v, k) / 1048576.0)
}

/// Stamps this run's results with the date and settings, and keeps the
/// workloads of earlier runs that this one did not repeat (e.g. a soak run
/// alone), so results.json and RESULTS.md always show every workload's latest.
fn merge(root: &Path, fresh: &[Value], quick: bool, rounds: u32, secs: u64) -> Vec<Value> {
    let stamp = |v: &Value| {
        let mut v = v.clone();
        v["date"] = json!(today());
        v["quick"] = json!(quick);
        if v.get("baseline_rps").is_some() {
            v["seconds"] = json!(secs);
            v["rounds"] = json!(rounds);
        }
        v
    };
    let mut out: Vec<Value> = fresh.iter().map(stamp).collect();
    let old_doc = std::fs::read_to_string(root.join("target/bench/results.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok());
    if let Some(old) = old_doc.as_ref().and_then(|o| o["workloads"].as_array()) {
        for w in old {
            if !out.iter().any(|n| n["name"] == w["name"]) {
                let mut w = w.clone();
                for k in ["date", "quick", "seconds"] {
                    if w.get(k).is_none() {
                        w[k] = old_doc_field(old_doc.as_ref(), k);
                    }
                }
                out.push(w);
            }
        }
    }
    out
}

/// A run-wide field of an earlier results.json (older files kept the date
/// and settings there rather than per workload).
fn old_doc_field(doc: Option<&Value>, k: &str) -> Value {
    doc.map_or(Value::Null, |d| d[k].clone())
}

pub fn write(root: &Path, fresh: &[Value], quick: bool, rounds: u32, secs: u64) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let results = &merge(root, fresh, quick, rounds, secs);
    let doc = json!({ "machine": machine(), "date": today(), "workloads": results });
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&doc)?,
    )?;

    let mut md = String::new();
    md.push_str("# Benchmark results\n\n");
    md.push_str(&format!(
        "Machine: {}. Written {} by `cargo xtask bench` (each workload keeps the date and settings of its latest run in `target/bench/results.json`). Workloads run in interleaved rounds (baseline, observer, bpftrace in rotating order); figures are medians, ratios are taken per round against the same round's baseline.\n\n",
        machine(),
        today(),
    ));
    md.push_str("## Workloads (on loopback: nginx, 1 worker, or the Go server of bench/go_server; wrk, 1 thread, 16 connections)\n\n");
    md.push_str("| workload | server | date | rounds × s |\n| --- | --- | --- | --- |\n");
    for r in results.iter().filter(|r| r.get("baseline_rps").is_some()) {
        md.push_str(&format!(
            "| {} | {} | {} | {} × {}{} |\n",
            r["name"].as_str().unwrap_or(""),
            server(r),
            r["date"].as_str().unwrap_or("?"),
            r["rounds"],
            r["seconds"],
            if r["quick"] == json!(true) {
                " (quick)"
            } else {
                ""
            }
        ));
    }
    md.push('\n');
    md.push_str("| workload | baseline req/s | observer req/s | ratio | per-round ratios: quartiles | p50 ratio | p99 ratio | server CPU/req ratio | observer CPU µs/req | observer CPU s/1000 events | events/s | dropped | observer peak RSS MiB | bpftrace req/s | bpftrace ratio | bpftrace CPU µs/req |\n");
    md.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in results.iter().filter(|r| r.get("baseline_rps").is_some()) {
        let peer = if f(r, "peer_rps") > 0.0 {
            format!(
                "{:.0} | {:.3} | {:.2}",
                f(r, "peer_rps"),
                f(r, "peer_ratio"),
                f(r, "peer_cpu_us_per_request")
            )
        } else {
            "not run | | ".to_owned()
        };
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.3} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.4} | {:.0} | {} | {} | {} |\n",
            r["name"].as_str().unwrap_or(""),
            f(r, "baseline_rps"),
            f(r, "observed_rps"),
            f(r, "ratio"),
            quartiles(r),
            f(r, "p50_ratio"),
            f(r, "p99_ratio"),
            f(r, "server_cpu_ratio"),
            f(r, "observer_cpu_us_per_request"),
            f(r, "observer_cpu_s_per_1000_events"),
            f(r, "events_per_s"),
            r["dropped"],
            mib(r, "observer_peak_rss_bytes"),
            peer,
        ));
    }
    md.push_str("\n### Per connection and per request (observer side)\n\nConnections count both ends (each loopback connection is two sockets). eBPF: the run time of all the observer's programs together, from one more observer run after the compared rounds with kernel.bpf_stats_enabled on (it adds about 20-30 ns to each program run, so it is off in the compared rounds). Server CPU: the server process's (nginx's worker's or the Go server's) user and system time per request, without and with the observer (uprobes in the server count there). OTLP: what the receiver read during the load.\n\n");
    md.push_str("| workload | mode | connections/s | server CPU µs/req, baseline / observer | observer CPU µs/connection | eBPF µs/connection | eBPF µs/request | OTLP KiB/s | scrapes |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in results.iter().filter(|r| r.get("baseline_rps").is_some()) {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} / {:.2} | {:.2} | {:.2} | {:.3} | {:.1} | {:.0} |\n",
            r["name"].as_str().unwrap_or(""),
            r["observer_mode"].as_str().unwrap_or("watch"),
            f(r, "connections_per_s"),
            f(r, "server_cpu_us_per_request_baseline"),
            f(r, "server_cpu_us_per_request_observed"),
            f(r, "observer_cpu_us_per_connection"),
            f(r, "ebpf_us_per_connection"),
            f(r, "ebpf_us_per_request"),
            f(r, "otlp_bytes_per_s") / 1024.0,
            f(r, "scrapes"),
        ));
    }
    md.push_str("\nPer eBPF program (the timed run): ns per run × runs per connection (runs per request).\n\n");
    for r in results.iter().filter(|r| r.get("baseline_rps").is_some()) {
        let Some(ps) = r["programs"].as_array() else {
            continue;
        };
        let mut ps: Vec<&Value> = ps.iter().collect();
        ps.sort_by(|a, b| f(b, "ns_per_connection").total_cmp(&f(a, "ns_per_connection")));
        let parts: Vec<String> = ps
            .iter()
            .map(|p| {
                format!(
                    "{} {:.0} ns × {:.2} ({:.2})",
                    p["program"].as_str().unwrap_or("?"),
                    f(p, "ns_per_run"),
                    f(p, "runs_per_connection"),
                    f(p, "runs_per_request")
                )
            })
            .collect();
        md.push_str(&format!(
            "- {}: {}\n",
            r["name"].as_str().unwrap_or(""),
            parts.join("; ")
        ));
    }
    if let Some(c) = results.iter().find(|r| r["name"] == "curl_tls_latency") {
        md.push_str(&format!(
            "\n## A fresh process's HTTPS latency\n\ncurl started anew for each request to nginx (HTTPS, TLS 1.3), {} rounds × {} runs per mode, curl's own `-w` figures, medians. TLS handshake (`time_appconnect - time_connect`): baseline {:.3} ms, observer ({}) {:.3} ms ({:+.3} ms), bpftrace {:.3} ms ({:+.3} ms). Connected and TLS done (`time_appconnect`): {:.3} / {:.3} / {:.3} ms. First byte (`time_starttransfer`): {:.3} / {:.3} / {:.3} ms.\n",
            c["rounds"], c["runs_per_round"],
            f(c, "baseline_tls_ms"),
            c["observer_mode"].as_str().unwrap_or("watch"),
            f(c, "observer_tls_ms"), f(c, "observer_tls_added_ms"),
            f(c, "peer_tls_ms"), f(c, "peer_tls_added_ms"),
            f(c, "baseline_appconnect_ms"), f(c, "observer_appconnect_ms"), f(c, "peer_appconnect_ms"),
            f(c, "baseline_first_byte_ms"), f(c, "observer_first_byte_ms"), f(c, "peer_first_byte_ms"),
        ));
    }
    if let Some(fl) = results.iter().find(|r| r["name"] == "flood") {
        md.push_str(&format!(
            "\n## Connection flood\n\n{} idle connections held open (both ends on this host, so {} sockets tracked). Time to open them: baseline {:.2} s, with observer {:.2} s, with bpftrace {:.2} s. Observer RSS {} MiB before, {} MiB with them open (peak {} MiB); tracked at stop: {}; dropped: {}. bpftrace RSS {} MiB.\n",
            fl["connections"],
            fl["tracked"],
            f(fl, "baseline_open_seconds"),
            f(fl, "observer_open_seconds"),
            f(fl, "bpftrace_open_seconds"),
            mib(fl, "observer_rss_before_bytes"),
            mib(fl, "observer_rss_bytes"),
            mib(fl, "observer_peak_rss_bytes"),
            fl["observer_tracked_at_stop"],
            fl["dropped"],
            mib(fl, "bpftrace_rss_bytes"),
        ));
    }
    if let Some(s) = results.iter().find(|r| r["name"] == "stops") {
        md.push_str(&stops_section(s));
    }
    if let Some(s) = results.iter().find(|r| r["name"] == "soak") {
        md.push_str(&soak_section(s));
    }
    if let Some(p) = results.iter().find(|r| r["name"] == "pipeline") {
        md.push_str(&format!(
            "\n## Userspace pipeline alone\n\nDecode + correlate a synthetic stream (criterion, `cargo bench -p observer --bench pipeline`): {:.0} events/s on one core.\n",
            f(p, "events_per_s")
        ));
        if p.get("request_us").is_some() {
            md.push_str(&format!(
                "A streamed chat completion on a kept-alive TLS connection (22 plaintext records: the request, the head and 20 content events, the finish and usage), decoded, parsed and made a request record: {:.2} µs on one core.\n",
                f(p, "request_us")
            ));
        }
        if p.get("churn_request_us").is_some() {
            md.push_str(&format!(
                "A request of the HTTP churn workload (8 records: both ends' owners, the request and answer seen on each end, both closes) decoded, correlated, measured and every span encoded: {:.2} µs on one core (the daemon's own CPU per churn request above adds the ring, the queues and the OTLP client).\n",
                f(p, "churn_request_us")
            ));
        }
    }
    let notes = root.join("bench/NOTES.md");
    if let Ok(n) = std::fs::read_to_string(&notes) {
        md.push('\n');
        md.push_str(&n);
    }
    std::fs::write(root.join("bench/RESULTS.md"), md)?;
    eprintln!("bench: wrote target/bench/results.json and bench/RESULTS.md");
    Ok(())
}

/// How long each way of stopping took, each run (target: within 1 s).
fn stops_section(s: &Value) -> String {
    let runs = |k: &str| {
        let v: Vec<String> = s[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .map(|x| format!("{x:.2}"))
            .collect();
        v.join(", ")
    };
    format!(
        "\n## Stopping\n\nFrom the signal or key to the exit, each run (s; target 1 s): SIGTERM to `run` as deployed {}; Ctrl-C (SIGINT) to `watch` {}; `q` in `top` (on a terminal of its own, through script(1)) {}.\n",
        runs("run_sigterm_s"),
        runs("watch_sigint_s"),
        runs("top_q_s"),
    )
}

/// The soak's section of RESULTS.md (it starts with a blank line).
fn soak_section(s: &Value) -> String {
    let t = &s["traffic"];
    let verdict = if s["holds"].as_bool() == Some(true) {
        "It held".to_owned()
    } else {
        format!("It did not hold: {}", s["misses"])
    };
    format!(
        "\n## Soak\n\n{} s of the daemon as deployed ({}: OTLP receiver, Prometheus scraped \
         {} times) under every kind of traffic at once: {} plain connections at {}/s, {} fresh \
         curl processes (HTTP/1.1 and HTTP/2 over TLS, plain HTTP; 3 requests each), {:.0} wrk \
         requests on kept-alive TLS connections, {} DNS lookups. Recorded: {} requests, {} DNS \
         lookups, {} TLS sessions, {} records exported ({} bytes). After {:.0} s of warm-up \
         the observer's RSS was {} MiB and its open descriptors {} (the median of the warm-up's \
         last minute of readings); the largest stray of a later minute's median {:+.1}% and \
         {:+.1}% (bound 5%); the largest single readings {} MiB and {}; at the end {} MiB and \
         {}. Dropped: {} (export \
         {}); connections left in the kernel map at stop: {}. {verdict}.\n",
        s["seconds"],
        s["observer_mode"].as_str().unwrap_or("?"),
        s["scrapes"],
        t["connections"],
        s["churn_rate"],
        t["curl_processes_ok"],
        f(t, "wrk_requests"),
        t["dns_answered"],
        s["requests"],
        s["dns_lookups"],
        s["tls_bound"],
        s["records_sent"],
        s["otlp_bytes"],
        f(s, "warm_up_s"),
        mib(s, "rss_warm_bytes"),
        s["fds_warm"],
        f(s, "rss_max_stray_pct"),
        f(s, "fds_max_stray_pct"),
        mib(s, "rss_peak_bytes"),
        s["fds_peak"],
        mib(s, "rss_end_bytes"),
        s["fds_end"],
        s["dropped"],
        s["export_spans_dropped"],
        s["kernel_tracked_at_stop"],
    )
}

/// `bench --soak`: the soak's numbers to target/bench/soak.json and its
/// section of bench/RESULTS.md replaced in place.
pub fn write_soak_alone(root: &Path, soak: &Value) -> Result<()> {
    write_alone(root, soak, "Soak", soak_section)
}

/// `bench --stops`: likewise for the stops (target/bench/stops.json).
pub fn write_stops_alone(root: &Path, stops: &Value) -> Result<()> {
    write_alone(root, stops, "Stopping", stops_section)
}

/// One workload's numbers to target/bench/NAME.json and its section of
/// bench/RESULTS.md (under `## heading`) replaced, or put before the
/// pipeline's, leaving every other section as the last full run wrote it.
fn write_alone(
    root: &Path,
    result: &Value,
    heading: &str,
    render: fn(&Value) -> String,
) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut stamped = result.clone();
    stamped["date"] = json!(today());
    let name = result["name"].as_str().unwrap_or("workload");
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&stamped)?,
    )?;
    let path = root.join("bench/RESULTS.md");
    let md = std::fs::read_to_string(&path).unwrap_or_default();
    let section = render(&stamped);
    let md = match md.find(&format!("\n## {heading}\n")) {
        Some(at) => {
            let rest = &md[at + 1..];
            let end = rest.find("\n## ").map_or(md.len(), |e| at + 1 + e);
            format!("{}{}{}", &md[..at], section, &md[end..])
        }
        None => match md.find("\n## Userspace pipeline alone") {
            Some(at) => format!("{}{}{}", &md[..at], section, &md[at..]),
            None => md + &section,
        },
    };
    std::fs::write(&path, md)?;
    eprintln!("bench: wrote target/bench/{name}.json and its section of bench/RESULTS.md");
    Ok(())
}
