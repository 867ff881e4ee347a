//! What `observer top` shows, aggregated from the records: a sliding window
//! of samples per process and per endpoint, and the figures of each row
//! (rates, counts, p50 and p99 of each phase) computed from it on each
//! refresh.
//!
//! Requests are HTTP request records when a row has any in the window; a
//! row without them (plain TCP, or TLS without plaintext probes) counts its
//! connections instead, and takes its first-byte times from them. So a
//! keep-alive client is counted by requests, not by its one connection.

use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    dns::DnsRecord,
    gpu::GpuRecord,
    http::RequestRecord,
    output::Line,
    record::{ConnRecord, Direction, State},
};

/// What a row stands for (`--by`, or `e` in the view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// One row per process (pid and name).
    Process,
    /// One row per remote endpoint (host:port or server name; a server on
    /// this host is its local address and port, marked `in`).
    Endpoint,
    /// One row per connection pool: a process's connections to one peer
    /// (open, busy, idle, requests per second, new-connection share).
    Pool,
}

/// Samples kept per row at most: a row busier than this over the window
/// has its oldest samples dropped (its rate then reads low, its
/// percentiles stay right for the newest).
pub const MAX_SAMPLES: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Connection,
    Request,
    Lookup,
}

/// One record's contribution to a row.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    kind: Kind,
    dns_ns: Option<u64>,
    connect_ns: Option<u64>,
    tls_ns: Option<u64>,
    ttfb_ns: Option<u64>,
    ttft_ns: Option<u64>,
    /// An LLM call's gaps between content events (median, p99) and its
    /// output tokens per second after the first.
    gap_p50_ns: Option<u64>,
    gap_p99_ns: Option<u64>,
    tokens_per_s: Option<f64>,
    error: bool,
    retransmits: u32,
    gpu_pct: Option<f64>,
}

impl Sample {
    fn new(at: Instant, kind: Kind) -> Self {
        Self {
            at,
            kind,
            dns_ns: None,
            connect_ns: None,
            tls_ns: None,
            ttfb_ns: None,
            ttft_ns: None,
            gap_p50_ns: None,
            gap_p99_ns: None,
            tokens_per_s: None,
            error: false,
            retransmits: 0,
            gpu_pct: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ProcessKey {
    pid: u32,
    comm: Arc<str>,
}

/// A remote endpoint (outbound), or this host's own server (inbound: its
/// local address and port).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EndpointKey {
    inbound: bool,
    addr: SocketAddr,
}

#[derive(Default)]
struct Series {
    samples: VecDeque<Sample>,
    /// A name the endpoint was reached by (TLS server name, the lookup
    /// that led to it, an HTTP Host), newest first.
    name: Option<Arc<str>>,
}

impl Series {
    fn push(&mut self, s: Sample) {
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }
}

/// p50 and p99 (nearest rank) of one phase over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quantiles {
    pub p50: Option<u64>,
    pub p99: Option<u64>,
}

impl Quantiles {
    fn of(mut v: Vec<u64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let rank = |q: f64| {
            // Nearest rank: the smallest value with at least q of them at or below it.
            let i = (q * v.len() as f64).ceil() as usize;
            v[i.clamp(1, v.len()) - 1]
        };
        Self {
            p50: Some(rank(0.50)),
            p99: Some(rank(0.99)),
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// By process: its pid and name.
    pub pid: Option<u32>,
    pub comm: String,
    /// By endpoint: "host:port" (a name when one is known).
    pub endpoint: String,
    /// By endpoint: a server on this host (its local address).
    pub inbound: bool,
    pub rate: f64,
    pub requests: u64,
    pub errors: u64,
    pub retransmits: u64,
    pub dns: Quantiles,
    pub connect: Quantiles,
    pub tls: Quantiles,
    pub ttfb: Quantiles,
    pub ttft: Quantiles,
    /// LLM calls' median gaps between content events (p50: over calls'
    /// medians; p99: over calls' p99s).
    pub gap: Quantiles,
    /// Mean over LLM calls of their output tokens per second after the first.
    pub tokens_per_s: Option<f64>,
    /// Mean over the window's records of the busiest device's average
    /// utilization during each record (None: no record carried a GPU).
    pub gpu_pct: Option<f64>,
}

impl Figures {
    /// What the filter matches: pid and name, or the endpoint.
    pub fn matches(&self, by: By, filter: &str) -> bool {
        if filter.is_empty() {
            return true;
        }
        let needle = filter.to_lowercase();
        match by {
            By::Process | By::Pool => {
                self.comm.to_lowercase().contains(&needle)
                    || self.pid.is_some_and(|p| p.to_string().contains(&needle))
            }
            By::Endpoint => self.endpoint.to_lowercase().contains(&needle),
        }
    }
}

/// The windows of every process and endpoint seen.
pub struct Model {
    window: Duration,
    started: Instant,
    processes: HashMap<ProcessKey, Series>,
    endpoints: HashMap<EndpointKey, Series>,
    /// The pool view's rows.
    pub pools: super::pools::PoolModel,
}

fn busiest_gpu(g: Option<&GpuRecord>) -> Option<f64> {
    g?.devices
        .iter()
        .filter_map(|d| d.utilization_gpu_pct_avg)
        .reduce(f64::max)
}

fn endpoint_of(direction: Direction, local: SocketAddr, remote: SocketAddr) -> EndpointKey {
    match direction {
        Direction::Outbound => EndpointKey {
            inbound: false,
            addr: remote,
        },
        Direction::Inbound => EndpointKey {
            inbound: true,
            addr: local,
        },
    }
}

/// The host part of an HTTP Host or :authority ("api.test:8080" -> "api.test").
fn host_name(h: &str) -> Option<Arc<str>> {
    if h.parse::<IpAddr>().is_ok() {
        return None;
    }
    let host = match h.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        _ => h,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|v6| v6.strip_suffix(']'))
        .unwrap_or(host);
    // A numeric Host says nothing the address does not.
    (!host.is_empty() && host.parse::<IpAddr>().is_err()).then(|| Arc::from(host))
}

impl Model {
    pub fn new(window: Duration, started: Instant) -> Self {
        Self {
            window,
            started,
            processes: HashMap::new(),
            endpoints: HashMap::new(),
            pools: super::pools::PoolModel::default(),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Takes one record that arrived at `at`.
    pub fn add(&mut self, line: &Line, at: Instant) {
        match line {
            Line::Conn(r) => self.add_connection(r, at),
            Line::Request(r) => self.add_request(r, at),
            Line::Dns(r) => self.add_lookup(r, at),
            Line::Pool(r) => self.pools.add(r, at),
        }
    }

    fn add_connection(&mut self, r: &ConnRecord, at: Instant) {
        // Snapshots of open connections come again when they close.
        if r.state == State::Open {
            return;
        }
        let mut s = Sample::new(at, Kind::Connection);
        s.connect_ns = r.connect_ns;
        s.tls_ns = r.tls.as_ref().and_then(|t| t.handshake_ns);
        // On TLS the socket's first bytes are the handshake's: the answer's
        // first byte is the TLS library's.
        s.ttfb_ns = r.answer_ttfb_ns();
        s.error = r.error.is_some();
        s.retransmits = r.retransmits;
        s.gpu_pct = busiest_gpu(r.gpu.as_ref());
        if let (Some(pid), Some(comm)) = (r.pid, &r.comm) {
            // By process, lookups count from their own records.
            self.process(pid, comm).push(s);
        }
        let key = endpoint_of(
            r.direction,
            SocketAddr::new(r.local_addr, r.local_port),
            SocketAddr::new(r.remote_addr, r.remote_port),
        );
        let name = r
            .tls
            .as_ref()
            .and_then(|t| t.server_name.clone())
            .or_else(|| r.dns.as_ref().map(|d| Arc::clone(&d.name)));
        s.dns_ns = r.dns.as_ref().map(|d| d.duration_ns);
        let series = self.endpoints.entry(key).or_default();
        if name.is_some() {
            series.name = name;
        }
        series.push(s);
    }

    fn add_request(&mut self, r: &RequestRecord, at: Instant) {
        let mut s = Sample::new(at, Kind::Request);
        s.ttfb_ns = r.ttfb_ns;
        if let Some(g) = &r.gen_ai {
            s.ttft_ns = g.time_to_first_token_ns;
            s.gap_p50_ns = g.content_gaps.as_ref().map(|x| x.p50_ns);
            s.gap_p99_ns = g.content_gaps.as_ref().map(|x| x.p99_ns);
            s.tokens_per_s = g.output_tokens_per_second;
        }
        s.error = r.error.is_some()
            || r.status.is_some_and(|c| c >= 500)
            || r.rpc
                .as_ref()
                .is_some_and(|c| c.grpc_status.is_some_and(|g| g != 0));
        s.gpu_pct = busiest_gpu(r.gpu.as_ref());
        if let (Some(pid), Some(comm)) = (r.pid, &r.comm) {
            self.process(pid, comm).push(s);
        }
        let key = endpoint_of(
            r.direction,
            SocketAddr::new(r.local_addr, r.local_port),
            SocketAddr::new(r.remote_addr, r.remote_port),
        );
        let series = self.endpoints.entry(key).or_default();
        if let Some(name) = r.host.as_deref().and_then(host_name) {
            series.name = Some(name);
        }
        series.push(s);
    }

    fn add_lookup(&mut self, r: &DnsRecord, at: Instant) {
        let mut s = Sample::new(at, Kind::Lookup);
        s.dns_ns = Some(r.duration_ns);
        s.error = r.result != "ok";
        self.process(r.pid, &r.comm).push(s);
    }

    fn process(&mut self, pid: u32, comm: &Arc<str>) -> &mut Series {
        self.processes
            .entry(ProcessKey {
                pid,
                comm: Arc::clone(comm),
            })
            .or_default()
    }

    /// Forgets samples older than the window, and rows left with none.
    pub fn expire(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.window) else {
            return;
        };
        let keep = |s: &mut Series| {
            while s.samples.front().is_some_and(|x| x.at < cutoff) {
                s.samples.pop_front();
            }
            !s.samples.is_empty()
        };
        self.processes.retain(|_, s| keep(s));
        self.endpoints.retain(|_, s| keep(s));
    }

    /// Every row of the view, unsorted, as of `now`.
    pub fn rows(&mut self, by: By, now: Instant) -> Vec<Figures> {
        self.expire(now);
        // Rates over the window, or over the time since top started when
        // that is shorter (at least a second).
        let span = now
            .saturating_duration_since(self.started)
            .min(self.window)
            .max(Duration::from_secs(1))
            .as_secs_f64();
        match by {
            // The pool view's rows are `pools`'.
            By::Pool => Vec::new(),
            By::Process => self
                .processes
                .iter()
                .map(|(k, s)| {
                    let mut f = figures(s, span);
                    f.pid = Some(k.pid);
                    f.comm = k.comm.to_string();
                    f
                })
                .collect(),
            By::Endpoint => self
                .endpoints
                .iter()
                .map(|(k, s)| {
                    let mut f = figures(s, span);
                    f.endpoint = match &s.name {
                        Some(n) => format!("{n}:{}", k.addr.port()),
                        None => k.addr.to_string(),
                    };
                    f.inbound = k.inbound;
                    f
                })
                .collect(),
        }
    }
}

fn figures(s: &Series, span_secs: f64) -> Figures {
    let requests = s.samples.iter().filter(|x| x.kind == Kind::Request).count();
    let counted = if requests > 0 {
        Kind::Request
    } else {
        Kind::Connection
    };
    let n = s.samples.iter().filter(|x| x.kind == counted).count() as u64;
    let phase = |get: fn(&Sample) -> Option<u64>, only: Option<Kind>| {
        Quantiles::of(
            s.samples
                .iter()
                .filter(|x| only.is_none_or(|k| x.kind == k))
                .filter_map(get)
                .collect(),
        )
    };
    let gpu: Vec<f64> = s.samples.iter().filter_map(|x| x.gpu_pct).collect();
    let rates: Vec<f64> = s.samples.iter().filter_map(|x| x.tokens_per_s).collect();
    let gap = Quantiles {
        p50: phase(|x| x.gap_p50_ns, None).p50,
        p99: phase(|x| x.gap_p99_ns, None).p99,
    };
    Figures {
        rate: n as f64 / span_secs,
        requests: n,
        errors: s.samples.iter().filter(|x| x.error).count() as u64,
        retransmits: s.samples.iter().map(|x| u64::from(x.retransmits)).sum(),
        dns: phase(|x| x.dns_ns, None),
        connect: phase(|x| x.connect_ns, None),
        tls: phase(|x| x.tls_ns, None),
        ttfb: phase(|x| x.ttfb_ns, Some(counted)),
        ttft: phase(|x| x.ttft_ns, None),
        gap,
        tokens_per_s: (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64),
        gpu_pct: (!gpu.is_empty()).then(|| gpu.iter().sum::<f64>() / gpu.len() as f64),
        ..Figures::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        clock::Clock,
        gpu::history::GpuUse,
        record::{ConnRecord, State},
    };

    pub(crate) fn conn(pid: u32, comm: &str, port: u16, ttfb_ms: u64) -> ConnRecord {
        let c = observer_common::Conn {
            sk: 1,
            start_ns: 1_000,
            established_ns: 1_000 + 200_000,
            first_tx_ns: 2_000_000,
            first_rx_ns: 2_000_000 + ttfb_ms * 1_000_000,
            end_ns: 3_000_000_000,
            pid,
            tid: pid,
            sport: 40000,
            dport: port,
            family: observer_common::AF_INET,
            direction: observer_common::DIR_OUTBOUND,
            flags: observer_common::FLAG_OWNED | observer_common::FLAG_ESTABLISHED,
            ..observer_common::Conn::default()
        };
        let mut r = ConnRecord::new(&c, None, &Clock::with_offset(0), State::Closed);
        r.comm = Some(Arc::from(comm));
        r.remote_addr = "10.0.0.2".parse().expect("an address");
        r
    }

    /// A request on `c`, as the HTTP reader makes one.
    pub(crate) fn request_of(c: &ConnRecord) -> RequestRecord {
        RequestRecord {
            kind: "request",
            pid: c.pid,
            tid: c.tid,
            comm: c.comm.clone(),
            exe: None,
            container: None,
            direction: c.direction,
            local_addr: c.local_addr,
            local_port: c.local_port,
            remote_addr: c.remote_addr,
            remote_port: c.remote_port,
            protocol: "http/1.1",
            stream_id: None,
            headers_undecodable: false,
            reset_code: None,
            request_index: Some(1),
            method: Some("GET".into()),
            path: Some("/".into()),
            host: None,
            status: Some(200),
            content_type: None,
            start_unix_ns: 0,
            end_unix_ns: 1,
            duration_ns: 1,
            request_bytes: 10,
            response_bytes: 10,
            ttfb_ns: None,
            streamed: false,
            stream: None,
            gen_ai: None,
            rpc: None,
            gpu: None,
            diagnosis: None,
            error: None,
            link_rule: None,
            upstream: None,
            own_time_ns: None,
            trace: Default::default(),
            conn_key: 0,
            connection: None,
        }
    }

    fn at(t0: Instant, secs: f64) -> Instant {
        t0 + Duration::from_secs_f64(secs)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let q = Quantiles::of((1..=100).collect());
        assert_eq!((q.p50, q.p99), (Some(50), Some(99)));
        let q = Quantiles::of(vec![7]);
        assert_eq!((q.p50, q.p99), (Some(7), Some(7)));
        let q = Quantiles::of(vec![10, 30, 20]);
        assert_eq!((q.p50, q.p99), (Some(20), Some(30)));
        assert_eq!(Quantiles::of(Vec::new()), Quantiles::default());
    }

    #[test]
    fn a_process_row_counts_its_connections_and_their_phases() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(10), t0);
        for (i, ttfb) in [100, 120, 110, 300].into_iter().enumerate() {
            let mut r = conn(7, "curl", 80, ttfb);
            r.retransmits = 1;
            if i == 3 {
                r.error = Some("reset");
            }
            m.add(&Line::Conn(Box::new(r)), at(t0, 1.0));
        }
        let mut open = conn(7, "curl", 80, 5);
        open.state = State::Open;
        m.add(&Line::Conn(Box::new(open)), at(t0, 1.0));
        let rows = m.rows(By::Process, at(t0, 2.0));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.pid, r.comm.as_str()), (Some(7), "curl"));
        assert_eq!(r.requests, 4, "open snapshots are not counted");
        assert!((r.rate - 2.0).abs() < 1e-9, "4 in the 2 s since start");
        assert_eq!(r.errors, 1);
        assert_eq!(r.retransmits, 4);
        assert_eq!(r.ttfb.p50, Some(110_000_000));
        assert_eq!(r.ttfb.p99, Some(300_000_000));
        assert_eq!(r.connect.p50, Some(200_000));
        assert_eq!(r.tls, Quantiles::default());
    }

    #[test]
    fn llm_calls_give_their_gaps_and_token_rates() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(10), t0);
        let c = conn(5, "python3", 443, 50);
        for (p50, p99, rate) in [(20, 90, 40.0), (30, 60, 60.0), (40, 70, 50.0)] {
            let mut req = request_of(&c);
            req.gen_ai = Some(crate::http::GenAi {
                provider: "openai",
                operation: "chat",
                request_model: None,
                response_model: None,
                stream: true,
                input_tokens: None,
                output_tokens: Some(9),
                cached_input_tokens: None,
                reasoning_output_tokens: None,
                time_to_first_token_ns: Some(100_000_000),
                finish_reason: None,
                content_events: 9,
                content_gaps: Some(crate::http::GapStats {
                    count: 8,
                    mean_ns: p50 * 1_000_000,
                    p50_ns: p50 * 1_000_000,
                    p99_ns: p99 * 1_000_000,
                    max_ns: p99 * 1_000_000,
                }),
                time_per_output_token_ns: None,
                output_tokens_per_second: Some(rate),
                unreadable_events: 0,
            });
            m.add(&Line::Request(Box::new(req)), at(t0, 0.5));
        }
        let r = &m.rows(By::Process, at(t0, 1.0))[0];
        // The median of the calls' medians, the p99 of their p99s.
        assert_eq!((r.gap.p50, r.gap.p99), (Some(30_000_000), Some(90_000_000)));
        assert_eq!(r.tokens_per_s, Some(50.0));
        assert_eq!(super::super::columns::Column::Gap.text(r), "30.0ms");
        assert_eq!(
            super::super::columns::Column::TokensPerSecond.text(r),
            "50.0"
        );
    }

    #[test]
    fn requests_replace_connections_when_a_row_has_them() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(10), t0);
        let c = conn(9, "python3", 443, 50);
        let mut req = request_of(&c);
        req.ttfb_ns = Some(40_000_000);
        req.host = Some("api.test:443".into());
        for _ in 0..3 {
            m.add(&Line::Request(Box::new(req.clone())), at(t0, 0.5));
        }
        m.add(&Line::Conn(Box::new(c)), at(t0, 0.6));
        let rows = m.rows(By::Process, at(t0, 20.0));
        assert!(rows.is_empty(), "gone after the window");
        let mut m = Model::new(Duration::from_secs(10), t0);
        for _ in 0..3 {
            m.add(&Line::Request(Box::new(req.clone())), at(t0, 0.5));
        }
        m.add(
            &Line::Conn(Box::new(conn(9, "python3", 443, 50))),
            at(t0, 0.6),
        );
        let r = &m.rows(By::Process, at(t0, 10.0))[0];
        assert_eq!(r.requests, 3, "three requests on one connection");
        assert_eq!(r.ttfb.p50, Some(40_000_000), "the requests' first bytes");
        assert!((r.rate - 0.3).abs() < 1e-9);
        let e = &m.rows(By::Endpoint, at(t0, 10.0))[0];
        assert_eq!(e.endpoint, "api.test:443", "named by the Host");
        assert!(!e.inbound);
        assert_eq!(e.requests, 3);
    }

    #[test]
    fn lookups_count_by_process_and_by_the_endpoint_they_led_to() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(10), t0);
        let mut lookup = crate::dns::record::tests::rec(7, 7, 0, &["10.0.0.2"]);
        lookup.comm = Arc::from("curl");
        lookup.duration_ns = 30_000_000;
        m.add(&Line::Dns(lookup.clone()), at(t0, 0.1));
        lookup.result = "nxdomain";
        m.add(&Line::Dns(lookup), at(t0, 0.1));
        let mut c = conn(7, "curl", 443, 20);
        c.dns = Some(crate::dns::DnsJoin {
            name: Arc::from("api.test"),
            duration_ns: 30_000_000,
            result: "ok",
            source: "libc",
            joined_by: "answer",
            start_unix_ns: 0,
        });
        m.add(&Line::Conn(Box::new(c)), at(t0, 0.2));
        let p = &m.rows(By::Process, at(t0, 1.0))[0];
        assert_eq!(p.dns.p50, Some(30_000_000));
        assert_eq!(p.errors, 1, "the failed lookup");
        assert_eq!(p.requests, 1, "lookups are not requests");
        let e = &m.rows(By::Endpoint, at(t0, 1.0))[0];
        assert_eq!(e.endpoint, "api.test:443");
        assert_eq!(e.dns.p50, Some(30_000_000));
    }

    #[test]
    fn servers_are_their_local_endpoint_and_gpus_average() {
        let t0 = Instant::now();
        let mut m = Model::new(Duration::from_secs(10), t0);
        for (pct, port) in [(90.0, 50000), (30.0, 50001)] {
            let mut r = conn(5, "vllm", 8000, 10);
            r.direction = Direction::Inbound;
            r.local_port = 8000;
            r.remote_port = port;
            let dev = |p: f64| GpuUse {
                uuid: None,
                utilization_gpu_pct_max: None,
                utilization_gpu_pct_avg: Some(p),
                memory_used_bytes: None,
                memory_total_bytes: None,
                process_used_memory_bytes: None,
                process_sm_util_pct: None,
                throttle_reasons: 0,
            };
            r.gpu = Some(GpuRecord {
                devices: vec![dev(pct), dev(5.0)],
            });
            m.add(&Line::Conn(Box::new(r)), at(t0, 0.1));
        }
        let e = m.rows(By::Endpoint, at(t0, 1.0));
        assert_eq!(e.len(), 1, "one server, whatever the clients' ports");
        assert!(e[0].inbound);
        assert!(e[0].endpoint.ends_with(":8000"), "{}", e[0].endpoint);
        assert_eq!(e[0].gpu_pct, Some(60.0), "the busiest device, averaged");
    }

    #[test]
    fn filters_match_names_pids_and_endpoints() {
        let f = Figures {
            pid: Some(4242),
            comm: "Curl".into(),
            endpoint: "api.test:443".into(),
            ..Figures::default()
        };
        assert!(f.matches(By::Process, ""));
        assert!(f.matches(By::Process, "cur"));
        assert!(f.matches(By::Process, "424"));
        assert!(!f.matches(By::Process, "python"));
        assert!(f.matches(By::Endpoint, "API.test"));
        assert!(!f.matches(By::Endpoint, "curl"));
        assert_eq!(host_name("api.test:8080").as_deref(), Some("api.test"));
        assert_eq!(host_name("127.0.0.1:8080"), None);
        assert_eq!(host_name("[::1]:80"), None);
        assert_eq!(host_name("llm.test").as_deref(), Some("llm.test"));
    }
}
