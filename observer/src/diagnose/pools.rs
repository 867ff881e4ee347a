//! "pool leak": a process whose open connections to one peer keep growing
//! while its requests do not, read from the run's pool records (`watch
//! --pools`; the live `diagnose` asks for them).
//!
//! Growing means across the whole run, not a warm-up: the most connections
//! open in each third of the run rise third after third, by at least
//! [`MIN_GROWTH`] from the first record to the last, and the new ones are
//! idle (a pool that grows with the requests in flight is busy, not
//! leaking). The requests do not grow: the second half's rate is at most
//! [`RATE_GROWTH`] times the first half's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::only::Only;
use crate::{pools::PoolRecord, record::ip_text};

/// Connections a pool must gain over the run.
pub const MIN_GROWTH: u64 = 5;
/// Pool records a pool needs, and seconds they must span.
pub const MIN_SAMPLES: usize = 4;
pub const MIN_SECONDS: f64 = 3.0;
/// How much faster the second half's requests may come.
pub const RATE_GROWTH: f64 = 1.5;
/// Pool records kept at once (an hour of 100 pools' records each second
/// is 360,000: past this they are counted, not kept).
const MAX_SAMPLES: usize = 200_000;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    t_ns: u64,
    open: u64,
    idle: u64,
    requests: u64,
}

#[derive(Debug, Default)]
struct Series {
    comm: Option<String>,
    server_name: Option<String>,
    samples: Vec<Sample>,
}

/// One pool that leaks, with the figures that show it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Leak {
    /// Always "pool_leak".
    #[schemars(extend("const" = "pool_leak"))]
    pub kind: &'static str,
    pub pid: u32,
    pub comm: Option<String>,
    pub peer_addr: String,
    pub peer_port: u16,
    pub server_name: Option<String>,
    /// The run's first and last pool records, this far apart.
    pub seconds: f64,
    pub open_first: u64,
    pub open_last: u64,
    pub idle_first: u64,
    pub idle_last: u64,
    /// Requests per second in the first and the second half of the run.
    pub requests_per_second_first: f64,
    pub requests_per_second_last: f64,
}

impl Leak {
    pub fn text(&self) -> String {
        let name = self
            .server_name
            .as_deref()
            .map_or(String::new(), |n| format!(" ({n})"));
        format!(
            "pool leak: pid {} {} -> {}:{}{name}: open connections {} -> {} in {:.0}s, idle {} -> {}, while requests held at {:.1}/s then {:.1}/s",
            self.pid,
            self.comm.as_deref().unwrap_or("-"),
            self.peer_addr,
            self.peer_port,
            self.open_first,
            self.open_last,
            self.seconds,
            self.idle_first,
            self.idle_last,
            self.requests_per_second_first,
            self.requests_per_second_last,
        )
    }
}

/// Every pool's records of the run.
#[derive(Debug, Default)]
pub struct PoolSamples {
    by: BTreeMap<(u32, String, u16), Series>,
    kept: usize,
    pub not_kept: u64,
}

/// One pool record as the leak rule reads it, from the pipeline's record or
/// from its `watch --json` line alike.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSample {
    pid: u32,
    peer_addr: String,
    peer_port: u16,
    comm: Option<String>,
    server_name: Option<String>,
    sample: Sample,
}

impl PoolSample {
    /// A pool record of the live pipeline.
    pub fn of_record(r: &PoolRecord) -> PoolSample {
        PoolSample {
            pid: r.pid,
            peer_addr: ip_text(&r.peer_addr),
            peer_port: r.peer_port,
            comm: r.comm.as_deref().map(str::to_owned),
            server_name: r.server_name.as_deref().map(str::to_owned),
            sample: Sample {
                t_ns: r.time_unix_ns,
                open: r.open.into(),
                idle: r.idle.into(),
                requests: r.requests,
            },
        }
    }

    /// Reads a `"kind": "pool"` line; None when it is not one.
    pub fn from_json(v: &Value) -> Option<PoolSample> {
        let u = |v: &Value| v.as_u64();
        Some(PoolSample {
            pid: u(&v["pid"]).and_then(|p| u32::try_from(p).ok())?,
            peer_addr: v["peer_addr"].as_str()?.to_owned(),
            peer_port: u(&v["peer_port"]).and_then(|p| u16::try_from(p).ok())?,
            comm: v["comm"].as_str().map(str::to_owned),
            server_name: v["server_name"].as_str().map(str::to_owned),
            sample: Sample {
                t_ns: u(&v["time_unix_ns"])?,
                open: u(&v["open"])?,
                idle: u(&v["idle"])?,
                requests: u(&v["requests"])?,
            },
        })
    }
}

impl PoolSamples {
    /// Takes one pool record.
    pub fn add(&mut self, p: PoolSample) {
        if self.kept >= MAX_SAMPLES {
            self.not_kept += 1;
            return;
        }
        self.kept += 1;
        let s = self
            .by
            .entry((p.pid, p.peer_addr, p.peer_port))
            .or_default();
        if s.comm.is_none() {
            s.comm = p.comm;
        }
        if p.server_name.is_some() {
            s.server_name = p.server_name;
        }
        s.samples.push(p.sample);
    }

    /// The pools that leak, of the processes `only` keeps.
    pub fn leaks(&self, only: &Only) -> Vec<Leak> {
        self.by
            .iter()
            .filter(|((pid, addr, _), s)| {
                (only.pids.is_empty() || only.pids.contains(pid))
                    && (only.comms.is_empty()
                        || s.comm.as_ref().is_some_and(|c| only.comms.contains(c)))
                    && only
                        .host
                        .as_ref()
                        .is_none_or(|h| h == addr || s.server_name.as_deref() == Some(h.as_str()))
            })
            .filter_map(|((pid, addr, port), s)| {
                let mut l = leak_of(&s.samples)?;
                l.pid = *pid;
                l.comm = s.comm.clone();
                l.peer_addr = addr.clone();
                l.peer_port = *port;
                l.server_name = s.server_name.clone();
                Some(l)
            })
            .collect()
    }
}

/// Requests per second between two records.
fn rate(a: &Sample, b: &Sample) -> f64 {
    let secs = b.t_ns.saturating_sub(a.t_ns) as f64 / 1e9;
    if secs <= 0.0 {
        return 0.0;
    }
    b.requests.saturating_sub(a.requests) as f64 / secs
}

/// The leak one pool's records show (its identity left blank).
fn leak_of(samples: &[Sample]) -> Option<Leak> {
    let mut s = samples.to_vec();
    s.sort_by_key(|x| x.t_ns);
    let (first, last) = (*s.first()?, *s.last()?);
    let span_ns = last.t_ns.saturating_sub(first.t_ns);
    let seconds = span_ns as f64 / 1e9;
    if s.len() < MIN_SAMPLES || seconds < MIN_SECONDS {
        return None;
    }
    let growth = last.open.saturating_sub(first.open);
    if growth < MIN_GROWTH || last.idle.saturating_sub(first.idle) * 2 < growth {
        return None;
    }
    // The most open in each third of the run: rising third after third.
    let mut most = [0u64; 3];
    for x in &s {
        let third = ((x.t_ns - first.t_ns) as u128 * 3 / (u128::from(span_ns) + 1)) as usize;
        most[third.min(2)] = most[third.min(2)].max(x.open);
    }
    if !(most[0] < most[1] && most[1] < most[2]) {
        return None;
    }
    let mid = s[s.len() / 2];
    let (early, late) = (rate(&first, &mid), rate(&mid, &last));
    if late > early * RATE_GROWTH + 1.0 {
        return None;
    }
    Some(Leak {
        kind: "pool_leak",
        pid: 0,
        comm: None,
        peer_addr: String::new(),
        peer_port: 0,
        server_name: None,
        seconds,
        open_first: first.open,
        open_last: last.open,
        idle_first: first.idle,
        idle_last: last.idle,
        requests_per_second_first: early,
        requests_per_second_last: late,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record a second: `open(i)` open, all idle but one, `rate`
    /// requests a second.
    fn run(n: u64, open: impl Fn(u64) -> u64, rate: impl Fn(u64) -> u64) -> Vec<Sample> {
        let mut requests = 0;
        (0..n)
            .map(|i| {
                requests += rate(i);
                Sample {
                    t_ns: i * 1_000_000_000,
                    open: open(i),
                    idle: open(i).saturating_sub(1),
                    requests,
                }
            })
            .collect()
    }

    #[test]
    fn a_pool_that_grows_with_steady_requests_leaks() {
        let l = leak_of(&run(10, |i| 2 + 3 * i, |_| 3)).expect("a leak");
        assert_eq!((l.open_first, l.open_last), (2, 29));
        assert!((l.requests_per_second_first - 3.0).abs() < 0.01);
        assert!(
            l.text().contains("open connections 2 -> 29 in 9s"),
            "{}",
            l.text()
        );
    }

    #[test]
    fn steady_pools_warm_ups_and_busy_growth_do_not() {
        assert_eq!(leak_of(&run(10, |_| 4, |_| 50)), None, "a reused pool");
        assert_eq!(
            leak_of(&run(10, |_| 0, |_| 5)),
            None,
            "a new connection each request"
        );
        // A burst that warmed the pool up, then steady.
        assert_eq!(
            leak_of(&run(12, |i| if i < 2 { 10 * i } else { 20 }, |_| 5)),
            None
        );
        // Growing with the load: requests come faster.
        assert_eq!(leak_of(&run(10, |i| 2 + 3 * i, |i| 1 + 3 * i)), None);
        // Growing busy, not idle.
        let busy: Vec<Sample> = run(10, |i| 2 + 3 * i, |_| 3)
            .into_iter()
            .map(|s| Sample { idle: 1, ..s })
            .collect();
        assert_eq!(leak_of(&busy), None);
        assert_eq!(leak_of(&run(3, |i| 10 * i, |_| 1)), None, "too few records");
    }
}
