//! Histograms and counters over every connection record (metrics see all
//! records, whatever spans are sampled), with low-cardinality attributes and
//! a cap on series per metric. Rendered as Prometheus text and as OTLP.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point, AggregationTemporality, Gauge, Histogram as OtlpHistogram,
        HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};

use super::attrs::{error_type, s};
use crate::hist::{Hist, AGE_BUCKETS, REQUEST_BUCKETS};
use crate::record::{ConnRecord, Direction, Family, Host};

mod wire;

/// Explicit bucket bounds in seconds, 100 us to 10 s.
pub const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

pub const CONNECT: &str = "observer.tcp.connect.duration";
pub const HANDSHAKE: &str = "observer.tls.handshake.duration";
pub const TTFB: &str = "observer.tcp.time_to_first_byte";
pub const DNS: &str = "dns.lookup.duration";
pub const CONNECTIONS: &str = "observer.tcp.connections";
pub const RETRANSMITS: &str = "observer.tcp.retransmits";
pub const IO: &str = "observer.tcp.io";
pub const DROPPED: &str = "observer.events.dropped";
pub const PROBES: &str = "observer.probes.attached";
pub const TABLES: &str = "observer.tables.entries";
pub const HEAP: &str = "observer.memory.heap";
pub const GPU_UTIL: &str = "hw.gpu.utilization";
pub const GPU_MEM_UTIL: &str = "hw.gpu.memory.utilization";
pub const GPU_MEM_USAGE: &str = "hw.gpu.memory.usage";
pub const GPU_MEM_LIMIT: &str = "hw.gpu.memory.limit";
pub const GPU_POWER: &str = "hw.power";
pub const GPU_ERRORS: &str = "hw.errors";
pub const GPU_PROC_UTIL: &str = "observer.gpu.process.utilization";
pub const GPU_PROC_MEM: &str = "observer.gpu.process.memory.usage";
pub const HTTP_CLIENT: &str = "http.client.request.duration";
pub const HTTP_SERVER: &str = "http.server.request.duration";
pub const GENAI_DURATION: &str = "gen_ai.client.operation.duration";
pub const GENAI_TOKENS: &str = "gen_ai.client.token.usage";
pub const GENAI_FIRST_CHUNK: &str = "gen_ai.client.operation.time_to_first_chunk";
pub const GENAI_PER_CHUNK: &str = "gen_ai.client.operation.time_per_output_chunk";
pub const GENAI_SERVER_DURATION: &str = "gen_ai.server.request.duration";
pub const GENAI_SERVER_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
pub const GENAI_SERVER_PER_TOKEN: &str = "gen_ai.server.time_per_output_token";
pub const RPC_CLIENT: &str = "rpc.client.duration";
pub const RPC_SERVER: &str = "rpc.server.duration";
pub const DIAGNOSIS: &str = "observer.diagnosis";
pub const POOL_OPEN: &str = "observer.pool.connections.open";
pub const POOL_BUSY: &str = "observer.pool.connections.busy";
pub const POOL_IDLE: &str = "observer.pool.connections.idle";
pub const POOL_REQUESTS: &str = "observer.pool.requests";
pub const POOL_CLOSES: &str = "observer.pool.connection.closes";
pub const POOL_AGE: &str = "observer.pool.connection.age";
pub const POOL_CONN_REQUESTS: &str = "observer.pool.connection.requests";

/// Token counts' bucket bounds (the GenAI semantic conventions' advice,
/// extended to sixteen).
pub const TOKEN_BUCKETS: [f64; 16] = [
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
];

/// [`BUCKETS`] in milliseconds, for the RPC conventions' `ms` histograms.
pub const MS_BUCKETS: [f64; 16] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
    10000.0,
];

/// The bucket bounds of histogram `name`.
pub fn bounds(name: &str) -> &'static [f64; 16] {
    if name == POOL_AGE {
        return &AGE_BUCKETS;
    }
    if name == POOL_CONN_REQUESTS {
        return &REQUEST_BUCKETS;
    }
    match describe(name).unit {
        "{token}" => &TOKEN_BUCKETS,
        "ms" => &MS_BUCKETS,
        _ => &BUCKETS,
    }
}

/// A series' attributes, sorted by key.
pub type Labels = Vec<(&'static str, String)>;

struct Described {
    name: &'static str,
    unit: &'static str,
    description: &'static str,
}

const DESCRIPTIONS: &[Described] = &[
    Described {
        name: CONNECT,
        unit: "s",
        description: "TCP connect: SYN sent to ESTABLISHED (outbound)",
    },
    Described {
        name: HANDSHAKE,
        unit: "s",
        description: "TLS handshake, as the TLS library saw it",
    },
    Described {
        name: TTFB,
        unit: "s",
        description:
            "Time to first byte: request sent to first byte of the answer (TLS: plaintext)",
    },
    Described {
        name: DNS,
        unit: "s",
        description: "DNS lookup duration",
    },
    Described {
        name: CONNECTIONS,
        unit: "{connection}",
        description: "TCP connections closed, by outcome",
    },
    Described {
        name: RETRANSMITS,
        unit: "{segment}",
        description: "TCP segments retransmitted",
    },
    Described {
        name: IO,
        unit: "By",
        description: "Payload bytes through the socket API",
    },
    Described {
        name: DROPPED,
        unit: "{event}",
        description: "Events the observer lost, by stage",
    },
    Described {
        name: TABLES,
        unit: "{entry}",
        description: "Entries in the observer's tables that grow with processes and connections, by table",
    },
    Described {
        name: HEAP,
        unit: "By",
        description: "The observer's heap, by state: in_use (allocated), free (freed, held by the allocator)",
    },
    Described {
        name: PROBES,
        unit: "{probe}",
        description: "Probes attached",
    },
    Described {
        name: HTTP_CLIENT,
        unit: "s",
        description: "HTTP client requests: first byte of the request to the end of the answer",
    },
    Described {
        name: HTTP_SERVER,
        unit: "s",
        description: "HTTP server requests: the request read to the end of the answer written",
    },
    Described {
        name: GENAI_DURATION,
        unit: "s",
        description: "LLM API calls, as the client saw them",
    },
    Described {
        name: GENAI_TOKENS,
        unit: "{token}",
        description:
            "Tokens per LLM API call, by gen_ai.token.type, from the usage the server sent",
    },
    Described {
        name: GENAI_FIRST_CHUNK,
        unit: "s",
        description: "LLM API calls: request start to the first chunk of generated content",
    },
    Described {
        name: RPC_CLIENT,
        unit: "ms",
        description: "gRPC calls, as the client saw them (the RPC conventions' unit, ms)",
    },
    Described {
        name: RPC_SERVER,
        unit: "ms",
        description: "gRPC calls, as the server saw them (the RPC conventions' unit, ms)",
    },
    Described {
        name: GENAI_PER_CHUNK,
        unit: "s",
        description: "LLM API streams: mean time between content chunks after the first",
    },
    Described {
        name: GENAI_SERVER_DURATION,
        unit: "s",
        description: "LLM API calls an inference server on this host served: request read to answer written",
    },
    Described {
        name: GENAI_SERVER_FIRST_TOKEN,
        unit: "s",
        description: "LLM API calls served on this host: request read to the first content written",
    },
    Described {
        name: GENAI_SERVER_PER_TOKEN,
        unit: "s",
        description: "LLM API calls served on this host: first content to the last, per output token after the first",
    },
    Described {
        name: DIAGNOSIS,
        unit: "{call}",
        description: "Calls by the cause `observer diagnose` names (connections and requests)",
    },
    Described {
        name: POOL_OPEN,
        unit: "{connection}",
        description: "Connection pools: a process's outbound connections open to a peer",
    },
    Described {
        name: POOL_BUSY,
        unit: "{connection}",
        description: "Connection pools: open connections with an exchange in flight",
    },
    Described {
        name: POOL_IDLE,
        unit: "{connection}",
        description: "Connection pools: open connections that had exchanges and have none in flight",
    },
    Described {
        name: POOL_REQUESTS,
        unit: "{request}",
        description: "Connection pools: requests, by whether they opened a new connection",
    },
    Described {
        name: POOL_CLOSES,
        unit: "{connection}",
        description: "Connection pools: connections closed, by who closed them",
    },
    Described {
        name: POOL_AGE,
        unit: "s",
        description: "Connection pools: a connection's age at its close",
    },
    Described {
        name: POOL_CONN_REQUESTS,
        unit: "{request}",
        description: "Connection pools: requests a connection carried, at its close",
    },
];

fn describe(name: &str) -> &'static Described {
    DESCRIPTIONS
        .iter()
        .find(|d| d.name == name)
        .unwrap_or(&DESCRIPTIONS[0])
}

/// One kind of value by metric, then by labels: a record's labels are
/// looked up borrowed (a series already seen costs no copy of them) and
/// compared only with the same metric's series. Values live in a vector and
/// keep their place: a record's series, once found, are updated by index
/// (`Metrics::record` binds them per connection peer).
struct Series<V> {
    index: BTreeMap<&'static str, BTreeMap<Labels, usize>>,
    values: Vec<V>,
    /// Places of removed series, for new ones.
    free: Vec<usize>,
}

impl<V> Default for Series<V> {
    fn default() -> Self {
        Self {
            index: BTreeMap::new(),
            values: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<V> Series<V> {
    fn find(&self, metric: &'static str, labels: &[(&'static str, String)]) -> Option<usize> {
        self.index.get(metric)?.get(labels).copied()
    }

    fn get_mut(
        &mut self,
        metric: &'static str,
        labels: &[(&'static str, String)],
    ) -> Option<&mut V> {
        let at = self.find(metric, labels)?;
        Some(&mut self.values[at])
    }

    /// The series' place, made with a default value if new.
    fn slot(&mut self, metric: &'static str, labels: Labels) -> usize
    where
        V: Default,
    {
        let m = self.index.entry(metric).or_default();
        if let Some(&at) = m.get(&labels) {
            return at;
        }
        let at = match self.free.pop() {
            Some(at) => {
                self.values[at] = V::default();
                at
            }
            None => {
                self.values.push(V::default());
                self.values.len() - 1
            }
        };
        m.insert(labels, at);
        at
    }

    fn entry(&mut self, metric: &'static str, labels: Labels) -> &mut V
    where
        V: Default,
    {
        let at = self.slot(metric, labels);
        &mut self.values[at]
    }

    fn insert(&mut self, metric: &'static str, labels: Labels, v: V)
    where
        V: Default,
    {
        *self.entry(metric, labels) = v;
    }

    /// Takes every series of `metric` out.
    fn remove_metric(&mut self, metric: &'static str) {
        if let Some(m) = self.index.remove(metric) {
            self.free.extend(m.into_values());
        }
    }

    /// Every series in (metric, labels) order.
    fn iter(&self) -> impl Iterator<Item = (&'static str, &Labels, &V)> {
        self.index
            .iter()
            .flat_map(move |(&name, m)| m.iter().map(move |(l, &at)| (name, l, &self.values[at])))
    }
}

/// The series a closed connection updates, by the labels its peer gives
/// them (direction, network, executable, server, port), found on the first
/// record and then updated by place. A connection that failed counts
/// under its error type, looked up as before.
#[derive(Default, Clone, Copy)]
struct ConnSlots {
    connect: Option<usize>,
    handshake: Option<usize>,
    ttfb: Option<usize>,
    connections: Option<usize>,
    retransmits: Option<usize>,
    transmit: Option<usize>,
    receive: Option<usize>,
}

/// Which kind of series `Metrics::place` looks in.
#[derive(Clone, Copy)]
enum Which {
    Hist,
    Counter,
}

/// Bound series are forgotten past this many peers (they are found again
/// by their labels): the cache stays the size of the series it points to.
const BOUND_PEERS: usize = 4096;

#[derive(Default)]
pub struct Metrics {
    hists: Series<Hist>,
    counters: Series<u64>,
    gauges: Series<f64>,
    series: HashMap<&'static str, usize>,
    /// Connection series by peer (see `ConnSlots`); the key is written
    /// into `key` for each record, so a known peer costs no allocation.
    bound: foldhash::HashMap<String, ConnSlots>,
    /// HTTP request series by method, server, path, status and error.
    bound_requests: foldhash::HashMap<String, usize>,
    key: String,
    /// `observer.diagnosis` series by (cause, record kind).
    causes: foldhash::HashMap<(&'static str, &'static str), usize>,
    /// Series per metric; past it, values go to one overflow series.
    pub max_series: usize,
    pub start_unix_ns: u64,
    /// Records whose attributes went to an overflow series.
    pub overflowed: u64,
    /// The room the next Prometheus text is given (the last one's length).
    text_len: std::cell::Cell<usize>,
}

/// A port or status code's digits, without the formatting machinery.
fn push_u16(s: &mut String, n: u16) {
    let mut b = [0u8; 5];
    let mut at = b.len();
    let mut n = n;
    loop {
        at -= 1;
        b[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // The digits are ASCII.
    s.push_str(std::str::from_utf8(&b[at..]).unwrap_or_default());
}

fn overflow() -> Labels {
    vec![("otel.metric.overflow", "true".into())]
}

impl Metrics {
    pub fn new(max_series: usize, start_unix_ns: u64) -> Self {
        Self {
            max_series,
            start_unix_ns,
            ..Self::default()
        }
    }

    /// The labels to use for a new series of `metric`.
    fn admit(&mut self, metric: &'static str, labels: &[(&'static str, String)]) -> Labels {
        let n = self.series.entry(metric).or_insert(0);
        if *n >= self.max_series {
            self.overflowed += 1;
            return overflow();
        }
        *n += 1;
        labels.to_vec()
    }

    fn observe(&mut self, metric: &'static str, labels: &[(&'static str, String)], secs: f64) {
        // A known series: found by the labels themselves, no copy of them.
        if let Some(h) = self.hists.get_mut(metric, labels) {
            h.observe(bounds(metric), secs);
            return;
        }
        let labels = self.admit(metric, labels);
        self.hists
            .entry(metric, labels)
            .observe(bounds(metric), secs);
    }

    fn add(&mut self, metric: &'static str, labels: &[(&'static str, String)], v: u64) {
        if let Some(c) = self.counters.get_mut(metric, labels) {
            *c += v;
            return;
        }
        let labels = self.admit(metric, labels);
        *self.counters.entry(metric, labels) += v;
    }

    /// Sets a counter kept elsewhere (the observer's own loss counters).
    pub fn set_counter(&mut self, metric: &'static str, labels: Labels, v: u64) {
        self.counters.insert(metric, labels, v);
    }

    pub fn set_gauge(&mut self, metric: &'static str, labels: Labels, v: f64) {
        self.gauges.insert(metric, labels, v);
    }

    /// Replaces every series of `metric` (a device or process gone stops
    /// being reported).
    pub fn replace_gauges(&mut self, metric: &'static str, values: Vec<(Labels, f64)>) {
        self.gauges.remove_metric(metric);
        for (l, v) in values {
            self.gauges.insert(metric, l, v);
        }
    }

    /// Replaces every series of counter `metric` (a pool forgotten stops
    /// being reported).
    pub fn replace_counters(&mut self, metric: &'static str, values: Vec<(Labels, u64)>) {
        self.counters.remove_metric(metric);
        for (l, v) in values {
            self.counters.insert(metric, l, v);
        }
    }

    /// Replaces every series of histogram `metric`.
    pub fn replace_hists(&mut self, metric: &'static str, values: Vec<(Labels, Hist)>) {
        self.hists.remove_metric(metric);
        for (l, v) in values {
            self.hists.insert(metric, l, v);
        }
    }

    /// Counts a finished connection (open snapshots are not counted twice:
    /// only closed records reach here).
    pub fn record(&mut self, r: &ConnRecord) {
        let exe = r
            .exe
            .as_deref()
            .and_then(|p| p.rsplit('/').next())
            .or(r.comm.as_deref())
            .unwrap_or("unknown");
        let (server, port) = Self::conn_server(r);
        let direction = match r.direction {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        };
        let net = match r.family {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        };
        let base = || -> Labels {
            vec![
                ("direction", direction.into()),
                ("network.type", net.into()),
                ("process.executable.name", exe.to_owned()),
                ("server.address", server.to_string()),
                ("server.port", port.to_string()),
            ]
        };
        self.key.clear();
        for part in [direction, net, exe] {
            self.key.push_str(part);
            self.key.push('\0');
        }
        server.push_to(&mut self.key);
        self.key.push('\0');
        push_u16(&mut self.key, port);
        let mut slots = self.bound.get(self.key.as_str()).copied();
        let known = slots.is_some();
        let s = slots.get_or_insert_default();
        self.observe_conn_phases(r, s, &base);
        self.count_conn_outcome(r, s, &base);
        self.count_cause(crate::cause::cause_of_conn(r), "connection");
        self.count_conn_traffic(r, s, &base);
        self.keep_conn_slots(*s, known);
    }

    /// The server end of a connection: an outbound one's by the name it was
    /// reached by (TLS SNI, else the DNS answer's name), else its address; an
    /// inbound one's is this host's end.
    fn conn_server(r: &ConnRecord) -> (Host<'_>, u16) {
        match r.direction {
            Direction::Outbound => (
                r.tls
                    .as_ref()
                    .and_then(|t| t.server_name.as_deref())
                    .or(r.dns.as_ref().map(|d| &*d.name))
                    .map_or(Host::Ip(&r.remote_addr), Host::Name),
                r.remote_port,
            ),
            Direction::Inbound => (Host::Ip(&r.local_addr), r.local_port),
        }
    }

    /// A connection's phases: connect, TLS handshake, time to first byte.
    fn observe_conn_phases(
        &mut self,
        r: &ConnRecord,
        s: &mut ConnSlots,
        base: &dyn Fn() -> Labels,
    ) {
        if let Some(c) = r.connect_ns {
            self.observe_bound(&mut s.connect, CONNECT, base, c as f64 / 1e9);
        }
        if let Some(h) = r.tls.as_ref().and_then(|t| t.handshake_ns) {
            self.observe_bound(&mut s.handshake, HANDSHAKE, base, h as f64 / 1e9);
        }
        if let Some(t) = r.answer_ttfb_ns() {
            self.observe_bound(&mut s.ttfb, TTFB, base, t as f64 / 1e9);
        }
    }

    /// `observer.tcp.connections`: a failed connection under its error
    /// type (looked up each time, not bound), a good one in its bound slot.
    fn count_conn_outcome(&mut self, r: &ConnRecord, s: &mut ConnSlots, base: &dyn Fn() -> Labels) {
        let err = r.error.map(error_type).or_else(|| {
            r.tls
                .as_ref()
                .and_then(|t| t.handshake_error)
                .map(|_| "tls_handshake_failed")
        });
        match err {
            Some(e) => {
                let mut outcome = base();
                outcome.insert(1, ("error.type", e.into()));
                self.add(CONNECTIONS, &outcome, 1);
            }
            None => self.add_bound(&mut s.connections, CONNECTIONS, base, 1),
        }
    }

    /// Retransmitted segments (when there were any) and bytes each way.
    fn count_conn_traffic(&mut self, r: &ConnRecord, s: &mut ConnSlots, base: &dyn Fn() -> Labels) {
        if r.retransmits > 0 {
            self.add_bound(
                &mut s.retransmits,
                RETRANSMITS,
                base,
                u64::from(r.retransmits),
            );
        }
        for (slot, dir, bytes) in [
            (&mut s.transmit, "transmit", r.bytes_sent),
            (&mut s.receive, "receive", r.bytes_received),
        ] {
            let io = || {
                let mut l = base();
                l.insert(2, ("network.io.direction", dir.into()));
                l
            };
            self.add_bound(slot, IO, &io, bytes);
        }
    }

    /// Stores the peer's slots under the key `record` wrote (a new peer
    /// past `BOUND_PEERS` starts the cache over).
    fn keep_conn_slots(&mut self, s: ConnSlots, known: bool) {
        match self.bound.get_mut(self.key.as_str()) {
            Some(b) => *b = s,
            None => {
                if !known && self.bound.len() >= BOUND_PEERS {
                    self.bound.clear();
                }
                self.bound.insert(self.key.clone(), s);
            }
        }
    }

    /// A histogram's value into the series at `slot`, found (or admitted)
    /// by `labels` the first time. An overflowed record is not bound: each
    /// one counts in `overflowed`.
    fn observe_bound(
        &mut self,
        slot: &mut Option<usize>,
        metric: &'static str,
        labels: &dyn Fn() -> Labels,
        secs: f64,
    ) {
        match self.bound_place(slot, metric, labels, Which::Hist) {
            Some(at) => self.hists.values[at].observe(bounds(metric), secs),
            None => self.observe(metric, &labels(), secs),
        }
    }

    /// `observe_bound`, for a counter.
    fn add_bound(
        &mut self,
        slot: &mut Option<usize>,
        metric: &'static str,
        labels: &dyn Fn() -> Labels,
        v: u64,
    ) {
        match self.bound_place(slot, metric, labels, Which::Counter) {
            Some(at) => self.counters.values[at] += v,
            None => self.add(metric, &labels(), v),
        }
    }

    /// `slot`, or the place `labels` find (then kept in `slot`).
    fn bound_place(
        &mut self,
        slot: &mut Option<usize>,
        metric: &'static str,
        labels: &dyn Fn() -> Labels,
        w: Which,
    ) -> Option<usize> {
        if slot.is_none() {
            *slot = self.place(metric, &labels(), w);
        }
        *slot
    }

    /// Where `metric`'s series for `labels` is, made if new; None when the
    /// metric is full (the value goes to the overflow series).
    fn place(
        &mut self,
        metric: &'static str,
        labels: &[(&'static str, String)],
        w: Which,
    ) -> Option<usize> {
        let found = match w {
            Which::Hist => self.hists.find(metric, labels),
            Which::Counter => self.counters.find(metric, labels),
        };
        if found.is_some() {
            return found;
        }
        if self
            .series
            .get(metric)
            .is_some_and(|&n| n >= self.max_series)
        {
            return None;
        }
        let labels = self.admit(metric, labels);
        Some(match w {
            Which::Hist => self.hists.slot(metric, labels),
            Which::Counter => self.counters.slot(metric, labels),
        })
    }

    /// `observer.diagnosis`: by cause and the kind of record judged.
    fn count_cause(&mut self, cause: &'static str, kind: &'static str) {
        let known = self.causes.get(&(cause, kind)).copied();
        let mut slot = known;
        let labels = || -> Labels {
            vec![
                ("cause", cause.into()),
                ("observer.record.kind", kind.into()),
            ]
        };
        self.add_bound(&mut slot, DIAGNOSIS, &labels, 1);
        if let (None, Some(at)) = (known, slot) {
            self.causes.insert((cause, kind), at);
        }
    }

    /// A name lookup: `dns.lookup.duration` by process, name and outcome.
    pub fn record_dns(&mut self, r: &crate::dns::DnsRecord) {
        let mut l: Labels = vec![
            ("dns.question.name", r.name.to_string()),
            ("process.executable.name", r.comm.to_string()),
        ];
        if r.result != "ok" {
            l.insert(0, ("error.type", r.result.into()));
        }
        self.observe(DNS, &l, r.duration_ns as f64 / 1e9);
    }

    /// A finished HTTP request: its duration by method, status and server;
    /// for an LLM API call, the GenAI metrics (the client's, or the
    /// server's for a call served on this host). The path
    /// only as its template (`http.route` on a server's, `url.template` on a
    /// client's: ids grouped as `{id}`), never the query: series stay
    /// bounded.
    pub fn record_request(&mut self, r: &crate::http::RequestRecord) {
        self.count_cause(crate::cause::cause_of_request(r), "request");
        if let Some(rpc) = &r.rpc {
            // A gRPC call is measured as the RPC conventions say, not as
            // an HTTP request too.
            self.record_rpc(r, rpc);
            return;
        }
        let method = r.method.as_deref().unwrap_or("_OTHER");
        let (host, port) = r.server_end();
        // As the HTTP conventions say: a 5xx status is the error type.
        let error: Option<String> = r
            .error
            .map(str::to_owned)
            .or_else(|| r.status.filter(|&s| s >= 500).map(|s| s.to_string()));
        let labels = || -> Labels {
            let mut l: Labels = vec![
                ("http.request.method", method.to_owned()),
                ("server.address", host.to_string()),
                ("server.port", port.to_string()),
            ];
            if let Some(p) = &r.path {
                let key = match r.direction {
                    Direction::Outbound => "url.template",
                    Direction::Inbound => "http.route",
                };
                l.push((key, crate::http::route::template(p)));
            }
            if let Some(st) = r.status {
                l.push(("http.response.status_code", st.to_string()));
            }
            if let Some(e) = &error {
                l.push(("error.type", e.clone()));
            }
            l.sort();
            l
        };
        let secs = r.duration_ns as f64 / 1e9;
        let metric = match r.direction {
            Direction::Outbound => HTTP_CLIENT,
            Direction::Inbound => HTTP_SERVER,
        };
        self.write_request_key(r, metric, method, (host, port), error.as_deref());
        let known = self.bound_requests.get(self.key.as_str()).copied();
        let mut slot = known;
        self.observe_bound(&mut slot, metric, &labels, secs);
        if let (None, Some(at)) = (known, slot) {
            if self.bound_requests.len() >= BOUND_PEERS {
                self.bound_requests.clear();
            }
            self.bound_requests.insert(self.key.clone(), at);
        }
        if let Some(g) = &r.gen_ai {
            self.record_gen_ai(r, g, r.server(), error, secs);
        }
    }

    /// `rpc.client.duration` or `rpc.server.duration`, in milliseconds.
    fn record_rpc(&mut self, r: &crate::http::RequestRecord, rpc: &crate::http::RpcRecord) {
        let (server, port) = r.server();
        let mut l: Labels = vec![
            ("rpc.system", rpc.system.into()),
            ("server.address", server),
            ("server.port", port.to_string()),
        ];
        for (key, v) in [("rpc.service", &rpc.service), ("rpc.method", &rpc.method)] {
            if let Some(v) = v {
                l.push((key, v.clone()));
            }
        }
        if let Some(c) = rpc.grpc_status {
            l.push(("rpc.grpc.status_code", c.to_string()));
        }
        if let Some(e) = r.error {
            l.push(("error.type", e.into()));
        }
        l.sort();
        let metric = match r.direction {
            Direction::Outbound => RPC_CLIENT,
            Direction::Inbound => RPC_SERVER,
        };
        self.observe(metric, &l, r.duration_ns as f64 / 1e6);
    }

    /// Writes into `key` what a request's series is bound by: what its
    /// labels come from (the path, not yet its route), without allocating.
    fn write_request_key(
        &mut self,
        r: &crate::http::RequestRecord,
        metric: &str,
        method: &str,
        (host, port): (Host<'_>, u16),
        error: Option<&str>,
    ) {
        self.key.clear();
        for part in [metric, method] {
            self.key.push_str(part);
            self.key.push('\0');
        }
        host.push_to(&mut self.key);
        self.key.push('\0');
        push_u16(&mut self.key, port);
        self.key.push('\0');
        // No path and an empty one differ; so do no status and status 0.
        match &r.path {
            Some(p) => self.key.push_str(p),
            None => self.key.push('\0'),
        }
        self.key.push('\0');
        match r.status {
            Some(st) => push_u16(&mut self.key, st),
            None => self.key.push('-'),
        }
        self.key.push('\0');
        self.key.push_str(error.unwrap_or(""));
    }

    /// The GenAI conventions' metrics of an LLM API call: the client's
    /// (`gen_ai.client.*`) or, for a call an inference server on this host
    /// served, the server's (`gen_ai.server.*`).
    fn record_gen_ai(
        &mut self,
        r: &crate::http::RequestRecord,
        g: &crate::http::GenAi,
        (server, port): (String, u16),
        error: Option<String>,
        secs: f64,
    ) {
        let mut l: Labels = vec![
            ("gen_ai.operation.name", g.operation.into()),
            ("gen_ai.provider.name", g.provider.into()),
            ("server.address", server),
            ("server.port", port.to_string()),
        ];
        if let Some(m) = &g.request_model {
            l.push(("gen_ai.request.model", m.clone()));
        }
        if let Some(m) = &g.response_model {
            l.push(("gen_ai.response.model", m.clone()));
        }
        l.sort();
        let mut with_error = l.clone();
        if let Some(e) = error {
            with_error.push(("error.type", e));
            with_error.sort();
        }
        let ttft = g.time_to_first_token_ns.map(|t| t as f64 / 1e9);
        if r.direction == Direction::Inbound {
            self.observe(GENAI_SERVER_DURATION, &with_error, secs);
            if let Some(t) = ttft {
                self.observe(GENAI_SERVER_FIRST_TOKEN, &l, t);
            }
            if let Some(t) = g.time_per_output_token_ns {
                self.observe(GENAI_SERVER_PER_TOKEN, &l, t as f64 / 1e9);
            }
            return;
        }
        self.observe(GENAI_DURATION, &with_error, secs);
        for (kind, n) in [("input", g.input_tokens), ("output", g.output_tokens)] {
            if let Some(n) = n {
                let mut t = l.clone();
                t.push(("gen_ai.token.type", kind.into()));
                t.sort();
                self.observe(GENAI_TOKENS, &t, n as f64);
            }
        }
        if let Some(t) = ttft {
            self.observe(GENAI_FIRST_CHUNK, &l, t);
        }
        if let Some(gaps) = &g.content_gaps {
            self.observe(GENAI_PER_CHUNK, &l, gaps.mean_ns as f64 / 1e9);
        }
    }

    /// Prometheus text exposition (format 0.0.4), written into one buffer
    /// as large as the last one: with 2,000 series a metric the text is
    /// several MiB, and building each line in strings of its own, in a
    /// buffer that grew by doubling, left the heap fragmented after every
    /// scrape (bench/NOTES.md, "The soak holds").
    pub fn prometheus(&self) -> String {
        let mut out = String::with_capacity(self.text_len.get());
        let mut last = "";
        for (name, labels, h) in self.hists.iter() {
            let unit = match describe(name).unit {
                "s" => "_seconds",
                "ms" => "_milliseconds",
                _ => "",
            };
            let base = prom_name(name, unit);
            if name != last {
                header(&mut out, &base, name, "histogram");
                last = name;
            }
            let mut cumulative = 0;
            for (i, bound) in bounds(name).iter().enumerate() {
                cumulative += h.counts[i];
                sample(&mut out, &base, "_bucket", labels, Some(Le::Bound(*bound)));
                _ = writeln!(out, " {cumulative}");
            }
            sample(&mut out, &base, "_bucket", labels, Some(Le::Inf));
            _ = writeln!(out, " {}", h.count);
            sample(&mut out, &base, "_sum", labels, None);
            _ = writeln!(out, " {}", h.sum);
            sample(&mut out, &base, "_count", labels, None);
            _ = writeln!(out, " {}", h.count);
        }
        for (name, labels, v) in self.counters.iter() {
            let suffix = if name == IO { "_bytes_total" } else { "_total" };
            let base = prom_name(name, "");
            if name != last {
                header(&mut out, &format!("{base}{suffix}"), name, "counter");
                last = name;
            }
            sample(&mut out, &base, suffix, labels, None);
            _ = writeln!(out, " {v}");
        }
        for (name, labels, v) in self.gauges.iter() {
            let base = prom_name(name, "");
            if name != last {
                header(&mut out, &base, name, "gauge");
                last = name;
            }
            sample(&mut out, &base, "", labels, None);
            _ = writeln!(out, " {v}");
        }
        self.text_len.set(out.len() + out.len() / 8);
        out
    }

    /// The same as OTLP, cumulative, under the observer's own resource.
    pub fn otlp(&self, resource: Vec<KeyValue>, now_unix_ns: u64) -> ExportMetricsServiceRequest {
        let mut metrics: Vec<Metric> = Vec::new();
        self.otlp_histograms(now_unix_ns, &mut metrics);
        self.otlp_sums(now_unix_ns, &mut metrics);
        self.otlp_gauges(now_unix_ns, &mut metrics);
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource {
                    attributes: resource,
                    ..Resource::default()
                }),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "observer".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..InstrumentationScope::default()
                    }),
                    metrics,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
    }

    /// `otlp`'s histograms, one metric per name, in name order.
    fn otlp_histograms(&self, now_unix_ns: u64, metrics: &mut Vec<Metric>) {
        let mut by_name: BTreeMap<&str, Vec<HistogramDataPoint>> = BTreeMap::new();
        for (name, labels, h) in self.hists.iter() {
            by_name.entry(name).or_default().push(HistogramDataPoint {
                attributes: otlp_labels(labels),
                start_time_unix_nano: self.start_unix_ns,
                time_unix_nano: now_unix_ns,
                count: h.count,
                sum: Some(h.sum),
                bucket_counts: h.counts.to_vec(),
                explicit_bounds: bounds(name).to_vec(),
                ..HistogramDataPoint::default()
            });
        }
        for (name, points) in by_name {
            let d = describe(name);
            metrics.push(Metric {
                name: name.to_owned(),
                description: d.description.into(),
                unit: d.unit.into(),
                data: Some(Data::Histogram(OtlpHistogram {
                    data_points: points,
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                })),
                ..Metric::default()
            });
        }
    }

    /// A counter's or a gauge's point.
    fn otlp_number(
        &self,
        labels: &Labels,
        v: number_data_point::Value,
        now_unix_ns: u64,
    ) -> NumberDataPoint {
        NumberDataPoint {
            attributes: otlp_labels(labels),
            start_time_unix_nano: self.start_unix_ns,
            time_unix_nano: now_unix_ns,
            value: Some(v),
            ..NumberDataPoint::default()
        }
    }

    /// `otlp`'s counters, as monotonic sums.
    fn otlp_sums(&self, now_unix_ns: u64, metrics: &mut Vec<Metric>) {
        let mut sums: BTreeMap<&str, Vec<NumberDataPoint>> = BTreeMap::new();
        for (name, labels, v) in self.counters.iter() {
            sums.entry(name).or_default().push(self.otlp_number(
                labels,
                number_data_point::Value::AsInt(*v as i64),
                now_unix_ns,
            ));
        }
        for (name, points) in sums {
            let d = describe(name);
            metrics.push(Metric {
                name: name.to_owned(),
                description: d.description.into(),
                unit: d.unit.into(),
                data: Some(Data::Sum(Sum {
                    data_points: points,
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                })),
                ..Metric::default()
            });
        }
    }

    /// `otlp`'s gauges.
    fn otlp_gauges(&self, now_unix_ns: u64, metrics: &mut Vec<Metric>) {
        let mut gauges: BTreeMap<&str, Vec<NumberDataPoint>> = BTreeMap::new();
        for (name, labels, v) in self.gauges.iter() {
            gauges.entry(name).or_default().push(self.otlp_number(
                labels,
                number_data_point::Value::AsDouble(*v),
                now_unix_ns,
            ));
        }
        for (name, points) in gauges {
            let d = describe(name);
            metrics.push(Metric {
                name: name.to_owned(),
                description: d.description.into(),
                unit: d.unit.into(),
                data: Some(Data::Gauge(Gauge {
                    data_points: points,
                })),
                ..Metric::default()
            });
        }
    }
}

fn otlp_labels(labels: &Labels) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| s(k, v.clone())).collect()
}

/// `observer.tcp.connect.duration` -> `observer_tcp_connect_duration` + suffix.
fn prom_name(name: &str, suffix: &str) -> String {
    let mut n = String::with_capacity(name.len() + suffix.len());
    push_prom_name(&mut n, name);
    n.push_str(suffix);
    n
}

fn push_prom_name(out: &mut String, name: &str) {
    out.extend(
        name.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
}

fn header(out: &mut String, prom: &str, name: &str, kind: &str) {
    out.push_str(&format!(
        "# HELP {prom} {}\n# TYPE {prom} {kind}\n",
        describe(name).description
    ));
}

/// A histogram bucket's upper bound.
#[derive(Clone, Copy)]
enum Le {
    Bound(f64),
    Inf,
}

/// A sample's name and labels, up to its value.
fn sample(out: &mut String, base: &str, suffix: &str, labels: &Labels, le: Option<Le>) {
    out.push_str(base);
    out.push_str(suffix);
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_prom_name(out, k);
        out.push_str("=\"");
        push_escaped(out, v);
        out.push('"');
    }
    if let Some(le) = le {
        if !labels.is_empty() {
            out.push(',');
        }
        _ = match le {
            Le::Bound(b) => write!(out, "le=\"{b}\""),
            Le::Inf => write!(out, "le=\"+Inf\""),
        };
    }
    out.push('}');
}

/// A label value with `\`, `"` and newlines escaped.
fn push_escaped(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The connection pools' series: gauges of what is open now per process
/// (executable and pid) and peer; counters and histograms since the
/// observer started per executable and peer (a short-lived client's counts
/// add to its executable's). At most `max_series` series of each (the
/// busiest; the rest counted as overflow).
pub fn pool_series(m: &mut Metrics, pools: &crate::pools::Pools) {
    let peer_labels =
        |exe: &str, server: Option<&std::sync::Arc<str>>, peer: &std::net::SocketAddr| -> Labels {
            let ip = peer.ip().to_string();
            vec![
                ("network.peer.address", ip.clone()),
                ("network.peer.port", peer.port().to_string()),
                ("process.executable.name", exe.to_owned()),
                ("server.address", server.map_or(ip, |s| s.to_string())),
            ]
        };
    let mut open: Vec<_> = pools.open().collect();
    open.sort_by_key(|(k, _, _, n)| (std::cmp::Reverse(n[0]), **k));
    m.overflowed += open.len().saturating_sub(m.max_series) as u64;
    open.truncate(m.max_series);
    let mut gauges: [Vec<(Labels, f64)>; 3] = Default::default();
    for (k, exe, server, n) in open {
        let mut l = peer_labels(&exe, server, &k.peer);
        l.insert(3, ("process.pid", k.pid.to_string()));
        for (g, v) in gauges.iter_mut().zip(n) {
            g.push((l.clone(), f64::from(v)));
        }
    }
    for (metric, values) in [POOL_OPEN, POOL_BUSY, POOL_IDLE].into_iter().zip(gauges) {
        m.replace_gauges(metric, values);
    }
    let mut totals = pools.totals();
    totals.sort_by(|(a, x), (b, y)| y.requests.cmp(&x.requests).then_with(|| a.cmp(b)));
    m.overflowed += totals.len().saturating_sub(m.max_series) as u64;
    totals.truncate(m.max_series);
    let (mut requests, mut closes, mut ages, mut per_conn) = (vec![], vec![], vec![], vec![]);
    for (k, t) in totals {
        let labels = peer_labels(&k.exe, k.server_name.as_ref(), &k.peer);
        let with = |key: &'static str, v: &str| {
            let mut l = labels.clone();
            l.push((key, v.to_owned()));
            l.sort_by_key(|(k, _)| *k);
            l
        };
        requests.push((with("connection", "new"), t.new_connections));
        let reused = t.requests.saturating_sub(t.new_connections);
        requests.push((with("connection", "reused"), reused));
        let c = &t.closed;
        for (by, n) in [
            ("client", c.client),
            ("server", c.server),
            ("reset", c.reset),
            ("goaway", c.goaway),
        ] {
            if n > 0 {
                closes.push((with("closed_by", by), n));
            }
        }
        if t.ages.count() > 0 {
            ages.push((labels.clone(), t.ages.clone()));
        }
        if t.per_connection.count() > 0 {
            per_conn.push((labels, t.per_connection.clone()));
        }
    }
    m.replace_counters(POOL_REQUESTS, requests);
    m.replace_counters(POOL_CLOSES, closes);
    m.replace_hists(POOL_AGE, ages);
    m.replace_hists(POOL_CONN_REQUESTS, per_conn);
}

/// The GPUs' latest state as gauges (`hw.*` per device with `hw.id`, per
/// process with `process.executable.name`).
pub fn gpu_gauges(m: &mut Metrics, devices: &[crate::gpu::DeviceSample]) {
    let mut by: BTreeMap<&'static str, Vec<(Labels, f64)>> = BTreeMap::new();
    for d in devices {
        let id = d
            .uuid
            .clone()
            .unwrap_or_else(|| format!("index-{}", d.index));
        let l: Labels = vec![("hw.id", id.clone())];
        let mut put = |metric: &'static str, labels: &Labels, v: Option<f64>| {
            if let Some(v) = v {
                by.entry(metric).or_default().push((labels.clone(), v));
            }
        };
        // hw.errors by type: ECC errors since the driver loaded, and a device
        // that could not be read at all.
        let typed = |t: &str| vec![("error.type", t.to_owned()), ("hw.id", id.clone())];
        put(
            GPU_ERRORS,
            &typed("unavailable"),
            Some(if d.error.is_some() { 1.0 } else { 0.0 }),
        );
        put(
            GPU_ERRORS,
            &typed("ecc_corrected"),
            d.ecc_errors_corrected.map(|v| v as f64),
        );
        put(
            GPU_ERRORS,
            &typed("ecc_uncorrected"),
            d.ecc_errors_uncorrected.map(|v| v as f64),
        );
        put(
            GPU_UTIL,
            &l,
            d.utilization_gpu_pct.map(|v| f64::from(v) / 100.0),
        );
        put(
            GPU_MEM_UTIL,
            &l,
            d.utilization_memory_pct.map(|v| f64::from(v) / 100.0),
        );
        put(GPU_MEM_USAGE, &l, d.memory_used_bytes.map(|v| v as f64));
        put(GPU_MEM_LIMIT, &l, d.memory_total_bytes.map(|v| v as f64));
        put(GPU_POWER, &l, d.power_w);
        for p in &d.processes {
            let exe = std::fs::read_link(format!("/proc/{}/exe", p.pid))
                .ok()
                .and_then(|e| e.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "unknown".into());
            let pl: Labels = vec![("hw.id", id.clone()), ("process.executable.name", exe)];
            put(
                GPU_PROC_UTIL,
                &pl,
                p.sm_util_pct.map(|v| f64::from(v) / 100.0),
            );
            put(GPU_PROC_MEM, &pl, p.used_memory_bytes.map(|v| v as f64));
        }
    }
    for metric in [
        GPU_ERRORS,
        GPU_UTIL,
        GPU_MEM_UTIL,
        GPU_MEM_USAGE,
        GPU_MEM_LIMIT,
        GPU_POWER,
        GPU_PROC_UTIL,
        GPU_PROC_MEM,
    ] {
        m.replace_gauges(metric, by.remove(metric).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use observer_common::{
        Conn, AF_INET, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED, FLAG_RESET_RX,
    };

    use super::*;
    use crate::{clock::Clock, record::State};

    fn record(port: u16, connect_ns: u64, refused: bool) -> ConnRecord {
        let mut c = Conn {
            sk: 1,
            start_ns: 1_000,
            established_ns: if refused { 0 } else { 1_000 + connect_ns },
            end_ns: 9_000_000,
            bytes_tx: 10,
            bytes_rx: 20,
            dport: port,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: if refused {
                FLAG_OWNED | FLAG_RESET_RX
            } else {
                FLAG_OWNED | FLAG_ESTABLISHED
            },
            ..Conn::default()
        };
        c.daddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        let mut r = ConnRecord::new(&c, None, &Clock::with_offset(0), State::Closed);
        r.exe = Some(Arc::from("/usr/bin/curl"));
        r
    }

    #[test]
    fn the_encoded_request_decodes_to_the_built_one() {
        use prost::Message as _;
        // Start 0 (a field left out), values of 0 (a oneof and an optional
        // written anyway), a refused connection's error series, gauges,
        // counters and an overflow series past the cap.
        let mut m = Metrics::new(4, 0);
        for port in [443, 443, 80, 8080, 9090, 9091] {
            m.record(&record(port, 2_000_000, false));
        }
        m.record(&record(443, 0, true));
        m.set_gauge(HEAP, vec![("state", "free".into())], 0.0);
        m.set_gauge(HEAP, vec![("state", "in_use".into())], 1.5e6);
        m.set_counter(DROPPED, vec![("stage", "ring".into())], 0);
        m.set_counter(DROPPED, vec![("stage", "exporter".into())], u64::MAX >> 1);
        let resource = vec![s("service.name", "observer"), s("host.name", "h")];
        for start in [0, 1_700_000_000_000_000_000] {
            m.start_unix_ns = start;
            let built = m.otlp(resource.clone(), 1_800_000_000_000_000_000);
            let bytes = m.otlp_bytes(&resource, 1_800_000_000_000_000_000);
            assert_eq!(bytes.len(), built.encoded_len());
            let decoded =
                ExportMetricsServiceRequest::decode(&bytes[..]).expect("the bytes decode");
            assert_eq!(decoded, built);
        }
        assert_eq!(
            Metrics::new(4, 0).otlp_bytes(&[], 1),
            Metrics::new(4, 0).otlp(Vec::new(), 1).encode_to_vec()
        );
    }

    #[test]
    fn histograms_and_counters_in_prometheus_text() {
        let mut m = Metrics::new(100, 0);
        m.record(&record(443, 2_000_000, false)); // 2 ms
        m.record(&record(443, 300_000, false)); // 0.3 ms
        m.record(&record(443, 0, true));
        let t = m.prometheus();
        let labels = "direction=\"outbound\",network_type=\"ipv4\",process_executable_name=\"curl\",server_address=\"10.0.0.1\",server_port=\"443\"";
        assert!(
            t.contains("# TYPE observer_tcp_connect_duration_seconds histogram"),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "observer_tcp_connect_duration_seconds_bucket{{{labels},le=\"0.0005\"}} 1"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "observer_tcp_connect_duration_seconds_bucket{{{labels},le=\"0.0025\"}} 2"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "observer_tcp_connect_duration_seconds_count{{{labels}}} 2"
            )),
            "{t}"
        );
        assert!(t.contains("observer_tcp_connections_total{direction=\"outbound\",error_type=\"connection_refused\""), "{t}");
        assert!(t.contains("network_io_direction=\"transmit\""), "{t}");
        // The two that connected count under their bound series, the
        // refused one under its error type.
        assert!(
            t.contains(&format!("observer_tcp_connections_total{{{labels}}} 2")),
            "{t}"
        );
        assert!(
            t.contains("observer_tcp_io_bytes_total{direction=\"outbound\",network_type=\"ipv4\",network_io_direction=\"transmit\",process_executable_name=\"curl\",server_address=\"10.0.0.1\",server_port=\"443\"} 30"),
            "{t}"
        );
        let req = m.otlp(Vec::new(), 1);
        let names: Vec<&str> = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert!(
            names.contains(&CONNECT) && names.contains(&CONNECTIONS) && names.contains(&IO),
            "{names:?}"
        );
    }

    #[test]
    fn series_past_the_cap_go_to_one_overflow_series() {
        let mut m = Metrics::new(3, 0);
        // Twice each: a peer's second record finds its bound series, or
        // (past the cap) goes to the overflow series again.
        for _ in 0..2 {
            for port in 1..=10 {
                m.record(&record(port, 1_000_000, false));
            }
        }
        let t = m.prometheus();
        let series = t
            .lines()
            .filter(|l| l.starts_with("observer_tcp_connect_duration_seconds_count"))
            .count();
        assert_eq!(series, 4, "3 series and the overflow one: {t}");
        assert!(
            t.contains(
                "observer_tcp_connect_duration_seconds_count{otel_metric_overflow=\"true\"} 14"
            ),
            "{t}"
        );
        assert!(
            t.contains("observer_tcp_connect_duration_seconds_count{direction=\"outbound\",network_type=\"ipv4\",process_executable_name=\"curl\",server_address=\"10.0.0.1\",server_port=\"1\"} 2"),
            "{t}"
        );
        // Per pass: 7 peers' connect, connection and two I/O values, and
        // the I/O metric (two series a peer) full at the second peer's
        // receive: 3 more.
        assert_eq!(
            m.overflowed,
            2 * (7 * 4 + 3),
            "each overflowed value counted"
        );
    }

    #[test]
    fn pools_give_gauges_per_process_and_counters_per_executable() {
        use crate::{
            pools::{Pools, Use},
            record::Owner,
            top::model::tests::{conn, request_of},
        };
        let mut pools = Pools::default();
        let peer: std::net::SocketAddr = "10.0.0.2:8080".parse().expect("an address");
        // Two processes of one executable: one connection each, one idle
        // and one busy; three requests, two on new connections.
        for (pid, u) in [(7, Use::Idle), (8, Use::Busy)] {
            let owner = Owner {
                pid,
                tid: pid,
                comm: "client".into(),
                thread_comm: "client".into(),
                exe: Some("/usr/bin/client".into()),
                container: None,
            };
            pools.count(&owner, peer, None, u, 1);
            let mut q = request_of(&conn(pid, "client", 8080, 5));
            q.exe = owner.exe.clone();
            pools.on_request(&q);
        }
        let mut q = request_of(&conn(7, "client", 8080, 5));
        q.request_index = Some(2);
        pools.on_request(&q);
        let mut m = Metrics::new(100, 0);
        pool_series(&mut m, &pools);
        let t = m.prometheus();
        let peer_labels = "network_peer_address=\"10.0.0.2\",network_peer_port=\"8080\",process_executable_name=\"client\"";
        assert!(
            t.contains(&format!("observer_pool_connections_idle{{{peer_labels},process_pid=\"7\",server_address=\"10.0.0.2\"}} 1")),
            "{t}"
        );
        assert!(
            t.contains(&format!("observer_pool_connections_busy{{{peer_labels},process_pid=\"8\",server_address=\"10.0.0.2\"}} 1")),
            "{t}"
        );
        assert!(
            t.contains(&format!("observer_pool_requests_total{{connection=\"new\",{peer_labels},server_address=\"10.0.0.2\"}} 2")),
            "{t}"
        );
        assert!(
            t.contains(&format!("observer_pool_requests_total{{connection=\"reused\",{peer_labels},server_address=\"10.0.0.2\"}} 1")),
            "{t}"
        );
        // The next census finds nothing open: the gauges say so.
        pools.begin_census();
        pool_series(&mut m, &pools);
        let t = m.prometheus();
        assert!(
            t.contains("observer_pool_connections_open{")
                && !t.contains("process_pid=\"7\",server_address=\"10.0.0.2\"} 1"),
            "{t}"
        );
    }
}
