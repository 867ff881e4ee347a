//! Soak (`cargo xtask bench --soak`): the daemon as deployed (spans and
//! metrics over OTLP, Prometheus scraped) under every kind of traffic it
//! follows (soak_traffic) for 30 minutes, its RSS and open descriptors read
//! every 10 s. It holds when, after a warm-up (a sixth of the run, at most 5
//! minutes), every minute's level (the median of its six readings) stays
//! within 5% of the warm-up's last minute's, nothing is counted lost
//! anywhere, every kind of traffic was recorded, and the kernel's
//! connection map is back to where it started.
//!
//! Each minute it also reads what the memory is made of (RssAnon, the
//! observer's heap in use and held free, every table's entries from its
//! metrics), so that a stray says whether a table filled, the heap leaked
//! or fragmented.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{
    attach::{self, Attached, Mode},
    nginx::Nginx,
    proc::{rss_anon_bytes, rss_bytes},
    soak_traffic::Traffic,
};

/// How often RSS and descriptors are read.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The most a level may stray from the warm-up's level, in percent.
const BOUND_PCT: f64 = 5.0;
/// Readings a level is the median of: a minute's. One reading can catch
/// work in flight rather than state kept: a TLS client followed at that
/// instant holds its own probes' links (+8 descriptors for the ~0.1 s it
/// lives, while libssl is per process) on a level of 121. A leak moves
/// every reading, so every median.
const LEVEL_READINGS: usize = 6;
/// New plain connections a second beside the other traffic.
const CHURN_RATE: u64 = 500;

/// One reading of the observer's footprint.
#[derive(Clone, Copy)]
struct Sample {
    at_s: f64,
    rss: u64,
    fds: u64,
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// What the observer's memory is made of at one moment.
fn footprint(tool: &Attached, pid: u32, at_s: f64) -> Value {
    let heap: serde_json::Map<String, Value> = tool
        .gauges(HEAP_GAUGE)
        .into_iter()
        .map(|(state, v)| (state, json!(v as u64)))
        .collect();
    let tables: serde_json::Map<String, Value> = tool
        .gauges(TABLES_GAUGE)
        .into_iter()
        .map(|(table, v)| (table, json!(v as u64)))
        .collect();
    json!({
        "at_s": at_s.round(),
        "rss": rss_bytes(pid),
        "rss_anon": rss_anon_bytes(pid),
        "heap": heap,
        "tables": tables,
    })
}

/// The observer's gauges the footprint reads, as Prometheus names them.
const HEAP_GAUGE: &str = "observer_memory_heap";
const TABLES_GAUGE: &str = "observer_tables_entries";

pub fn run(root: &Path, secs: u64) -> Result<Value> {
    let _nginx = Nginx::start()?;
    let tool = Attached::start(Mode::Observer, root, &[])?;
    let pid = tool.pid().context("observer pid")?;
    let warm_up = (secs / 6).clamp(10, 300) as f64;
    let traffic = Traffic::start(root, secs, CHURN_RATE)?;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut footprints = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(
            SAMPLE_EVERY.min(Duration::from_secs(secs).saturating_sub(start.elapsed())),
        );
        let s = Sample {
            at_s: start.elapsed().as_secs_f64(),
            rss: rss_bytes(pid),
            fds: open_fds(pid),
        };
        if samples.len() % LEVEL_READINGS == LEVEL_READINGS - 1 {
            footprints.push(footprint(&tool, pid, s.at_s));
            eprintln!(
                "bench: soak {:>5.0}s  rss {:.1} MiB  fds {}",
                s.at_s,
                s.rss as f64 / 1048576.0,
                s.fds
            );
        }
        samples.push(s);
    }
    let done = traffic.finish()?;
    // Closes and the last export settle before the last reading.
    std::thread::sleep(Duration::from_secs(3));
    let last = Sample {
        at_s: start.elapsed().as_secs_f64(),
        rss: rss_bytes(pid),
        fds: open_fds(pid),
    };
    samples.push(last);
    footprints.push(footprint(&tool, pid, last.at_s));
    let consumed = tool.consumed().unwrap_or_default();
    let summary = tool.stop()?.context("observer summary")?;
    let mut out = judge(&samples, warm_up, &summary, &done);
    if out["rss_max_stray_pct"].as_f64().unwrap_or(0.0).abs() > BOUND_PCT {
        let made_of = what_grew(&footprints, warm_up);
        if let (Some(misses), Some(m)) = (out["misses"].as_array_mut(), made_of) {
            misses.push(json!(m));
        }
    }
    out["footprints"] = json!(footprints);
    out["seconds"] = json!(secs);
    out["churn_rate"] = json!(CHURN_RATE);
    out["observer_mode"] = json!(format!("{:?}", attach::observer_mode()).to_lowercase());
    out["otlp_bytes"] = json!(consumed.otlp_bytes);
    out["scrapes"] = json!(consumed.scrapes);
    out["traffic"] = done;
    Ok(out)
}

/// What changed in the memory's make-up from the warm-up's last minute to
/// the last reading: RssAnon, the heap in use and free, and each table whose
/// entries moved by more than a tenth ("RSS's make-up from 300 s to 1803 s:
/// anon +2.1 MiB, heap in use +0.2 MiB, free +1.8 MiB; tables: ...").
fn what_grew(footprints: &[Value], warm_up: f64) -> Option<String> {
    let at = |f: &Value| f["at_s"].as_f64().unwrap_or(0.0);
    let from = footprints.iter().rev().find(|f| at(f) <= warm_up)?;
    let to = footprints.last()?;
    let mib = |f: &Value, p: &str| f.pointer(p).and_then(Value::as_f64).unwrap_or(0.0) / 1048576.0;
    let delta = |p: &str| mib(to, p) - mib(from, p);
    let tables: Vec<String> = to["tables"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, v)| {
            let (was, is) = (from["tables"][name].as_f64()?, v.as_f64()?);
            ((is - was).abs() > was.max(10.0) / 10.0).then(|| format!("{name} {was} -> {is}"))
        })
        .collect();
    Some(format!(
        "RSS's make-up from {:.0} s to {:.0} s: anon {:+.1} MiB, heap in use {:+.1} MiB, \
         free {:+.1} MiB; tables moved: {}",
        at(from),
        at(to),
        delta("/rss_anon"),
        delta("/heap/in_use"),
        delta("/heap/free"),
        if tables.is_empty() {
            "none".to_owned()
        } else {
            tables.join(", ")
        }
    ))
}

/// The median of `values` (the upper one of an even count).
fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// The warm-up's level of `value` (its last minute's median) and the
/// largest stray from it, in percent, of a later minute's median.
fn stray(samples: &[Sample], warm_up: f64, value: fn(&Sample) -> u64) -> (u64, f64) {
    let (warm, after): (Vec<&Sample>, Vec<&Sample>) =
        samples.iter().partition(|s| s.at_s <= warm_up);
    let warm: Vec<u64> = warm
        .iter()
        .rev()
        .take(LEVEL_READINGS)
        .map(|s| value(s))
        .collect();
    let level = median(warm);
    let worst = after
        .chunks(LEVEL_READINGS)
        .map(|minute| median(minute.iter().map(|s| value(s)).collect()))
        .map(|m| (m as f64 - level as f64) / level.max(1) as f64 * 100.0)
        .fold(0.0, |w: f64, p| if p.abs() > w.abs() { p } else { w });
    (level, worst)
}

/// The largest single reading after the warm-up (shown beside the levels).
fn peak(samples: &[Sample], warm_up: f64, value: fn(&Sample) -> u64) -> u64 {
    samples
        .iter()
        .filter(|s| s.at_s > warm_up)
        .map(value)
        .max()
        .unwrap_or(0)
}

/// The soak's numbers and whether it held, with why not.
fn judge(samples: &[Sample], warm_up: f64, summary: &Value, traffic: &Value) -> Value {
    let (rss_level, rss_stray) = stray(samples, warm_up, |s| s.rss);
    let (fds_level, fds_stray) = stray(samples, warm_up, |s| s.fds);
    let last = samples.last().copied().unwrap_or(Sample {
        at_s: 0.0,
        rss: 0,
        fds: 0,
    });
    let dropped = attach::total_dropped(summary);
    let export_dropped = summary["export"]["spans_dropped"].as_u64().unwrap_or(0);
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let mut misses = Vec::new();
    if rss_stray.abs() > BOUND_PCT {
        misses.push(format!(
            "RSS strayed {rss_stray:+.1}% from its warm-up level"
        ));
    }
    if fds_stray.abs() > BOUND_PCT {
        misses.push(format!(
            "open fds strayed {fds_stray:+.1}% from their warm-up level"
        ));
    }
    if dropped + export_dropped > 0 {
        misses.push(format!(
            "losses counted: {:?}{}, export {export_dropped}",
            attach::dropped_by_stage(summary),
            attach::missed_by_program(summary)
        ));
    }
    for (what, seen) in [
        ("requests", &summary["requests"]),
        ("DNS lookups", &summary["dns_lookups"]),
        ("TLS sessions", &summary["tls_bound"]),
        ("exported records", &summary["export"]["records_sent"]),
    ] {
        if u(seen) == 0 {
            misses.push(format!("no {what} recorded"));
        }
    }
    for failed in [
        "connections_failed",
        "curl_processes_failed",
        "dns_unanswered",
        "wrk_errors",
    ] {
        if u(&traffic[failed]) > 0 {
            misses.push(format!(
                "the traffic itself failed: {failed} {}",
                traffic[failed]
            ));
        }
    }
    json!({
        "name": "soak",
        "holds": misses.is_empty(),
        "misses": misses,
        "warm_up_s": warm_up,
        "rss_warm_bytes": rss_level,
        "rss_end_bytes": last.rss,
        "rss_max_stray_pct": rss_stray,
        "fds_warm": fds_level,
        "fds_end": last.fds,
        "fds_max_stray_pct": fds_stray,
        "rss_peak_bytes": peak(samples, warm_up, |s| s.rss),
        "fds_peak": peak(samples, warm_up, |s| s.fds),
        "samples": samples.iter().map(|s| json!([s.at_s.round(), s.rss, s.fds])).collect::<Vec<_>>(),
        "kernel_tracked_at_stop": summary["kernel_tracked_at_stop"],
        "events": summary["events"],
        "requests": summary["requests"],
        "dns_lookups": summary["dns_lookups"],
        "tls_bound": summary["tls_bound"],
        "records_sent": summary["export"]["records_sent"],
        "dropped": dropped,
        "dropped_detail": summary["dropped"],
        "export_spans_dropped": export_dropped,
    })
}

/// Fails the bench when the soak did not hold (after its numbers are kept).
pub fn check(result: &Value) -> Result<()> {
    if result["holds"].as_bool() == Some(true) {
        return Ok(());
    }
    bail!("the soak did not hold: {}", result["misses"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(rss: &[u64]) -> Vec<Sample> {
        rss.iter()
            .enumerate()
            .map(|(i, &rss)| Sample {
                at_s: (i as f64 + 1.0) * 10.0,
                rss,
                fds: 100,
            })
            .collect()
    }

    fn quiet_summary() -> Value {
        json!({
            "requests": 10, "dns_lookups": 5, "tls_bound": 3,
            "export": {"records_sent": 40, "spans_dropped": 0},
            "dropped": {"kernel_ring": 0},
        })
    }

    #[test]
    fn a_stray_says_what_the_memory_grew_in() {
        let at = |s: u64, anon: u64, in_use: u64, conns: u64, files: u64| {
            json!({"at_s": s, "rss_anon": anon << 20, "heap": {"in_use": in_use << 20, "free": 1 << 20},
                   "tables": {"connections": conns, "tls_files": files}})
        };
        let f = [
            at(240, 30, 10, 100, 3),
            at(300, 30, 10, 100, 3),
            at(900, 33, 12, 500, 3),
        ];
        let said = what_grew(&f, 300.0).expect("a reading in the warm-up");
        assert!(said.starts_with("RSS's make-up from 300 s to 900 s: anon +3.0 MiB, heap in use +2.0 MiB, free +0.0 MiB"), "{said}");
        assert!(
            said.ends_with("tables moved: connections 100 -> 500"),
            "{said}"
        );
        assert_eq!(what_grew(&f[2..], 300.0), None, "no reading in the warm-up");
    }

    #[test]
    fn strays_are_measured_between_minute_levels() {
        // Growth during the warm-up (to 120 s) does not count; after it
        // each minute's median does, up or down; a reading or two of work
        // in flight does not.
        let warm = [50, 80, 90, 100, 100, 100, 100, 100, 100, 100, 100, 100];
        let spikes = [100, 100, 140, 100, 100, 100, 103, 97, 104, 104, 104, 130];
        let s = samples(&[&warm[..], &spikes[..]].concat());
        let (level, worst) = stray(&s, 120.0, |s| s.rss);
        assert_eq!(level, 100);
        assert!((worst - 4.0).abs() < 1e-9, "{worst}");
        assert_eq!(peak(&s, 120.0, |s| s.rss), 140);
        let v = judge(&s, 120.0, &quiet_summary(), &json!({}));
        assert_eq!(v["holds"], true, "{v}");
        let grown = samples(&[&warm[..], &[100, 103, 106, 106, 106, 106][..]].concat());
        let v = judge(&grown, 120.0, &quiet_summary(), &json!({}));
        assert_eq!(v["holds"], false);
        assert!(v["misses"].to_string().contains("RSS strayed +6.0%"), "{v}");
        let fell = samples(&[&warm[..], &[100, 90, 90, 90, 94, 94][..]].concat());
        let (_, worst) = stray(&fell, 120.0, |s| s.rss);
        assert!((worst + 6.0).abs() < 1e-9, "{worst}");
    }

    #[test]
    fn a_loss_a_kind_unrecorded_or_failed_traffic_does_not_hold() {
        let s = samples(&[100, 100, 100]);
        let mut lost = quiet_summary();
        lost["dropped"]["kernel_ring"] = json!(1);
        let mut no_dns = quiet_summary();
        no_dns["dns_lookups"] = json!(0);
        for (summary, traffic, why) in [
            (lost, json!({}), "losses counted"),
            (no_dns, json!({}), "no DNS lookups recorded"),
            (
                quiet_summary(),
                json!({"dns_unanswered": 2}),
                "dns_unanswered 2",
            ),
        ] {
            let v = judge(&s, 10.0, &summary, &traffic);
            assert_eq!(v["holds"], false, "{why}");
            assert!(v["misses"].to_string().contains(why), "{why}: {v}");
        }
    }
}
