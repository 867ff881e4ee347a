//! The rules: which phase dominated a call, and the sentence that says so.
//!
//! Each phase over its threshold is a candidate, weighed by the time it
//! took; the heaviest names the cause. A busy GPU turns a slow server or
//! stream into "gpu" (it is the likelier reason the server was slow);
//! retransmissions are "network" when they weigh most (the time spent after
//! the first byte, or the whole call when nothing else was slow). A call with
//! no candidate is "none".

use serde::Serialize;

use crate::units::dur;

use super::{
    call::{Call, GpuBusy},
    thresholds::{ns, Thresholds},
};

/// The fixed list of causes (a contract: docs/diagnose-and-top.md, span attribute, metric).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    Dns,
    Connect,
    Tls,
    Server,
    Stream,
    Gpu,
    Network,
    Client,
    /// Time in a proxy itself, apart from its upstream's.
    Proxy,
    None,
}

impl Cause {
    pub const ALL: [Cause; 10] = [
        Cause::Dns,
        Cause::Connect,
        Cause::Tls,
        Cause::Server,
        Cause::Stream,
        Cause::Gpu,
        Cause::Network,
        Cause::Client,
        Cause::Proxy,
        Cause::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Dns => "dns",
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Server => "server",
            Cause::Stream => "stream",
            Cause::Gpu => "gpu",
            Cause::Network => "network",
            Cause::Client => "client",
            Cause::Proxy => "proxy",
            Cause::None => "none",
        }
    }
}

/// The figures a verdict rests on (null: not measured on this call).
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Figures {
    pub total_ns: u64,
    pub dns_ns: Option<u64>,
    pub dns_server: Option<String>,
    pub dns_retries: Option<u32>,
    pub connect_ns: Option<u64>,
    pub tls_setup_ns: Option<u64>,
    pub tls_handshake_ns: Option<u64>,
    pub srtt_us: Option<u32>,
    pub ttfb_ns: Option<u64>,
    pub first_token_ns: Option<u64>,
    /// Tokens (or events) per second after the first one.
    pub tokens_per_s: Option<f64>,
    pub max_gap_ns: Option<u64>,
    /// The server on this host: its own wait before answering.
    pub server_ns: Option<u64>,
    /// Through a proxy whose legs were seen: the proxy's own time, and its
    /// upstream's.
    pub proxy_ns: Option<u64>,
    pub upstream_ns: Option<u64>,
    pub gpu_device: Option<String>,
    pub gpu_util_pct: Option<u32>,
    pub retransmits: u32,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Diagnosis {
    pub cause: Cause,
    pub evidence: String,
    pub figures: Figures,
}

/// The SYN retransmission timeout starts at 1 s: a connect this long lost
/// its first SYN (or its SYN-ACK).
const SYN_RTO_NS: u64 = 900_000_000;

/// Connection errors that mean the connect itself failed.
const CONNECT_ERRORS: [&str; 4] = ["refused", "timeout", "unreachable", "aborted"];

pub fn diagnose(c: &Call, t: &Thresholds) -> Diagnosis {
    let figures = figures(c);
    let (cause, busy) = judge(c, t);
    let evidence = evidence(cause, c, &figures, busy.as_ref(), t);
    Diagnosis {
        cause,
        evidence,
        figures,
    }
}

/// The cause alone (the exporters: no sentence, no figures).
pub fn cause(c: &Call, t: &Thresholds) -> Cause {
    judge(c, t).0
}

/// The cause, and the busy GPU that named it.
fn judge(c: &Call, t: &Thresholds) -> (Cause, Option<GpuBusy>) {
    let mut candidates: Vec<(Cause, u64)> = Vec::new();
    if let Some(d) = &c.dns {
        if d.duration_ns > ns(t.dns_ms) {
            candidates.push((Cause::Dns, d.duration_ns));
        }
    }
    match c.connect_ns {
        Some(n) if n > ns(t.connect_ms) => candidates.push((Cause::Connect, n)),
        None if c
            .error
            .as_deref()
            .is_some_and(|e| CONNECT_ERRORS.contains(&e)) =>
        {
            candidates.push((Cause::Connect, c.duration_ns.max(1)));
        }
        _ => {}
    }
    if let Some(n) = c.tls_handshake_ns.filter(|&n| n > ns(t.tls_ms)) {
        candidates.push((Cause::Tls, n));
    }
    if let Some(n) = c.tls_setup_ns.filter(|&n| n > ns(t.tls_ms)) {
        candidates.push((Cause::Client, n));
    }
    let wait = c.first_token_ns.or(c.ttfb_ns);
    if let Some(w) = wait.filter(|&w| w > ns(t.ttfb_ms)) {
        // Through a proxy: its own time apart from its upstream's.
        match c.proxy_split() {
            Some((own, upstream)) => {
                if own > ns(t.ttfb_ms) {
                    candidates.push((Cause::Proxy, own));
                }
                if upstream.min(w) > ns(t.ttfb_ms) {
                    candidates.push((Cause::Server, upstream.min(w)));
                }
            }
            None => candidates.push((Cause::Server, w)),
        }
    }
    let after = after_first_token(c);
    if let Some(after) = after {
        let slow_rate =
            tokens_per_s(c).is_some_and(|r| r < t.tokens_per_s) && after > ns(t.ttfb_ms);
        let stalled = c.max_gap_ns.is_some_and(|g| g > ns(t.stream_gap_ms));
        if slow_rate || stalled {
            candidates.push((Cause::Stream, after));
        }
    }
    if c.retransmits > t.retransmits {
        let transfer = c.duration_ns.saturating_sub(wait.unwrap_or(0));
        let weight = if candidates.is_empty() {
            c.total_ns()
        } else {
            transfer
        };
        candidates.push((Cause::Network, weight));
    }
    // The heaviest; ties go to the earlier phase (the list's order).
    let mut cause = candidates
        .iter()
        .fold(None::<(Cause, u64)>, |best, &(cause, w)| match best {
            Some((_, bw)) if bw >= w => best,
            _ => Some((cause, w)),
        })
        .map_or(Cause::None, |(c, _)| c);
    let busy = busy_gpu(c, t);
    if busy.is_some() && matches!(cause, Cause::Server | Cause::Stream) {
        cause = Cause::Gpu;
    }
    (cause, busy)
}

/// Tokens (or events) per second after the first one, which came with the
/// wait and is not part of the rate.
fn tokens_per_s(c: &Call) -> Option<f64> {
    let after = after_first_token(c)?;
    let n = c.tokens?.saturating_sub(1);
    (after > 0).then(|| n as f64 / (after as f64 / 1e9))
}

/// The time the stream ran after its first token (None: not a stream).
fn after_first_token(c: &Call) -> Option<u64> {
    let first = c.first_token_ns?;
    c.tokens?;
    Some(c.duration_ns.saturating_sub(first))
}

/// The busiest GPU, of the call's process or of the server on this host,
/// at or above the threshold.
fn busy_gpu(c: &Call, t: &Thresholds) -> Option<GpuBusy> {
    c.gpus
        .iter()
        .chain(c.server.iter().flat_map(|s| s.gpus.iter()))
        .filter(|g| g.utilization_pct >= t.gpu_util_pct)
        .max_by_key(|g| g.utilization_pct)
        .cloned()
}

fn figures(c: &Call) -> Figures {
    let gpu = c
        .gpus
        .iter()
        .chain(c.server.iter().flat_map(|s| s.gpus.iter()))
        .max_by_key(|g| g.utilization_pct);
    Figures {
        total_ns: c.total_ns(),
        dns_ns: c.dns.as_ref().map(|d| d.duration_ns),
        dns_server: c.dns.as_ref().and_then(|d| d.server.clone()),
        dns_retries: c.dns.as_ref().and_then(|d| d.retries),
        connect_ns: c.connect_ns,
        tls_setup_ns: c.tls_setup_ns,
        tls_handshake_ns: c.tls_handshake_ns,
        srtt_us: c.srtt_us,
        ttfb_ns: c.ttfb_ns,
        first_token_ns: c.first_token_ns,
        tokens_per_s: tokens_per_s(c),
        max_gap_ns: c.max_gap_ns,
        server_ns: c.server.as_ref().and_then(|s| s.wait_ns),
        proxy_ns: c.proxy_split().map(|p| p.0),
        upstream_ns: c.proxy_split().map(|p| p.1),
        gpu_device: gpu.map(|g| g.device.clone()),
        gpu_util_pct: gpu.map(|g| g.utilization_pct),
        retransmits: c.retransmits,
        error: c.error.clone(),
    }
}

fn plural(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn evidence(cause: Cause, c: &Call, f: &Figures, busy: Option<&GpuBusy>, t: &Thresholds) -> String {
    match cause {
        Cause::Dns => dns_sentence(c),
        Cause::Connect => connect_sentence(c),
        Cause::Tls => format!(
            "TLS handshake {}{}",
            dur(c.tls_handshake_ns.unwrap_or(0)),
            c.srtt_us
                .map(|us| format!(": round trip {}", dur(u64::from(us) * 1000)))
                .unwrap_or_default()
        ),
        Cause::Client => format!(
            "client slow to start: its own TLS setup took {} before the handshake",
            dur(c.tls_setup_ns.unwrap_or(0))
        ),
        Cause::Server => server_sentence(c, f),
        Cause::Stream => stream_sentence(c, f, t),
        Cause::Proxy => format!(
            "proxy slow: {} in the proxy itself, {} upstream",
            dur(f.proxy_ns.unwrap_or(0)),
            dur(f.upstream_ns.unwrap_or(0))
        ),
        Cause::Gpu => gpu_sentence(c, f, busy),
        Cause::Network => {
            let phase = if c.ttfb_ns.is_some() {
                "during the answer"
            } else {
                "during the call"
            };
            format!("retransmissions: {} {phase}{}", c.retransmits, rtt(c))
        }
        Cause::None => format!("no phase over its threshold: {} in all", dur(c.total_ns())),
    }
}

/// The server's own share, appended to the server and GPU sentences: the
/// proxy's split when the call went through one, else the wait of the
/// server on this host (empty when neither is known).
fn server_part(f: &Figures) -> String {
    match (f.proxy_ns, f.upstream_ns) {
        (Some(own), Some(up)) => format!(
            " (upstream of the proxy {}, the proxy itself {})",
            dur(up),
            dur(own)
        ),
        _ => f
            .server_ns
            .map(|s| format!(" (the server on this host took {})", dur(s)))
            .unwrap_or_default(),
    }
}

fn dns_sentence(c: &Call) -> String {
    let d = c.dns.clone().unwrap_or_default();
    let mut s = format!("slow DNS lookup: {} took {}", d.name, dur(d.duration_ns));
    if let Some(server) = &d.server {
        s.push_str(&format!(" at {server}"));
    }
    if let Some(n) = d.retries.filter(|&n| n > 0) {
        s.push_str(&format!(" ({})", plural(n, "retry", "retries")));
    }
    if d.result != "ok" && !d.result.is_empty() {
        s.push_str(&format!(", {}", d.result));
    }
    s
}

fn connect_sentence(c: &Call) -> String {
    match (c.connect_ns, &c.error) {
        (Some(n), _) if n >= SYN_RTO_NS || c.retransmits > 0 => {
            format!("SYN retransmitted: connect took {}", dur(n))
        }
        (Some(n), _) => format!("slow connect: connect took {}{}", dur(n), rtt(c)),
        (None, e) => format!(
            "connect failed: {} after {}",
            e.as_deref().unwrap_or("error"),
            dur(c.duration_ns)
        ),
    }
}

fn server_sentence(c: &Call, f: &Figures) -> String {
    match (c.first_token_ns, c.ttfb_ns) {
        (Some(ft), _) if c.tokens.is_some() => format!(
            "server slow to answer: first token after {}{}",
            dur(ft),
            server_part(f)
        ),
        (_, Some(b)) => format!(
            "server slow to answer: first byte after {}{}",
            dur(b),
            server_part(f)
        ),
        (Some(ft), None) => format!(
            "server slow to answer: first event after {}{}",
            dur(ft),
            server_part(f)
        ),
        (None, None) => "server slow to answer".into(),
    }
}

fn gpu_sentence(c: &Call, f: &Figures, busy: Option<&GpuBusy>) -> String {
    let g = busy.cloned().unwrap_or(GpuBusy {
        device: "?".into(),
        utilization_pct: 0,
    });
    let wait = c
        .first_token_ns
        .or(c.ttfb_ns)
        .map_or_else(String::new, |w| {
            format!(
                "; {} after {}",
                if c.tokens.is_some() {
                    "first token"
                } else {
                    "first byte"
                },
                dur(w)
            )
        });
    format!(
        "GPU busy: device {} at {}% during the request{wait}{}",
        g.device,
        g.utilization_pct,
        server_part(f)
    )
}

fn stream_sentence(c: &Call, f: &Figures, t: &Thresholds) -> String {
    let first = c.first_token_ns.map(dur).unwrap_or_default();
    match f.tokens_per_s {
        Some(r) if r < t.tokens_per_s => format!(
            "slow token stream: {} tokens/s after a {first} first token",
            fmt_rate(r)
        ),
        _ => format!(
            "stalled stream: a pause of {} after a {first} first token",
            dur(c.max_gap_ns.unwrap_or(0))
        ),
    }
}

fn fmt_rate(r: f64) -> String {
    if r < 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.0}")
    }
}

fn rtt(c: &Call) -> String {
    c.srtt_us
        .map(|us| format!(" (round trip {})", dur(u64::from(us) * 1000)))
        .unwrap_or_default()
}
