//! Counters of what the pipeline saw and what it lost, shared by its stages.

use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc,
};

use serde::Serialize;

use crate::tables::Tables;

#[derive(Debug, Default)]
pub struct Stats {
    /// What `/healthz` and `/readyz` answer.
    pub health: crate::health::Health,
    /// Ring-buffer records read.
    pub events: AtomicU64,
    /// Records that did not decode.
    pub decode_errors: AtomicU64,
    /// Events dropped between the ring and the correlator. The correlator
    /// now reads the ring itself (a correlator that falls behind leaves
    /// records in the ring, and a full ring is counted as `kernel`), so this
    /// stays 0; kept for the `stage="channel"` series and the summary field.
    pub channel_full: AtomicU64,
    /// Records dropped because the output could not keep up.
    pub output_full: AtomicU64,
    /// Final records of closed connections.
    pub closed: AtomicU64,
    /// Snapshot records of open connections.
    pub open: AtomicU64,
    /// Records not shown because of --pid/--comm/--port/--direction.
    pub filtered: AtomicU64,
    /// Process events the TLS probe manager could not take (queue full).
    pub tls_commands_full: AtomicU64,
    /// Records the OTLP exporter's queue could not take.
    pub export_full: AtomicU64,
    /// DNS lookup records.
    pub dns: AtomicU64,
    /// Wire lookups not followed: the correlator's tables were full.
    pub dns_overflow: AtomicU64,
    /// Requests and closes of connection pools past `pools::MAX_POOLS`.
    pub pools_untracked: AtomicU64,
    /// HTTP request records.
    pub requests: AtomicU64,
    /// Answers seen without their request (per-process probes came between).
    pub http_orphans: AtomicU64,
    pub closes_waited: AtomicU64,
    pub closes_waited_completed: AtomicU64,
    /// HTTP/2 header blocks not decoded.
    pub h2_undecodable: AtomicU64,
    /// HTTP/2 frames lost track of.
    pub h2_out_of_step: AtomicU64,
    /// The size of each table that grows with processes or connections
    /// (shared with the TLS manager's thread).
    pub tables: Arc<Tables>,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Everything counted over one run, printed as the summary when watching stops.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Summary {
    pub events: u64,
    pub connections_closed: u64,
    /// Name lookups reported (`"kind": "dns"` records).
    pub dns_lookups: u64,
    /// HTTP requests reported (`"kind": "request"` records).
    pub requests: u64,
    /// Why requests were not reported.
    pub http: HttpSummary,
    pub open_records: u64,
    pub filtered: u64,
    pub outbound_opened: u64,
    pub inbound_opened: u64,
    /// Connections found established with no record of their start (begun
    /// before the observer started, or evicted), followed from then on.
    pub adopted_midstream: u64,
    /// Losses by stage.
    pub dropped: Dropped,
    pub decode_errors: u64,
    pub proc_unreadable: u64,
    /// Entries left in the kernel's connection map at stop.
    pub kernel_tracked_at_stop: u64,
    pub close_untracked: u64,
    /// Connections whose close the kernel never showed us (see `kernel_missed`),
    /// found when their socket pointer was reused.
    pub replaced: u64,
    /// TLS sessions tied to their socket.
    pub tls_bound: u64,
    /// TLS connections whose handshake was read on the wire (no library
    /// probe saw it at its start; a library that took over later is not
    /// subtracted).
    pub tls_wire: u64,
    /// rustls connections tied to their socket, and rustls plaintext reads
    /// whose connection was not found (their bytes lost).
    pub tls_rustls_tied: u64,
    pub tls_rustls_reads_unjoined: u64,
    /// OpenSSL sessions tied to their socket by the descriptor given to the
    /// library (`SSL_set_fd`).
    pub tls_tied_by_fd: u64,
    /// OpenSSL and GnuTLS sessions without a descriptor (their own BIO or
    /// transport) tied by the first packet their thread sent in a call.
    pub tls_tied_by_packet: u64,
    /// Connection state changes a softirq made while the lifecycle program
    /// ran on its CPU: skipped by the kernel for that program, handled by
    /// its nested stand-in (`inet_sock_set_state_nested`).
    pub lifecycle_nested_caught: u64,
    /// TLS sessions or connections the kernel could not store (maps full).
    pub tls_insert_failed: u64,
    /// Process events the TLS probe manager missed (its queue was full).
    pub tls_commands_dropped: u64,
    /// The tables that grow with processes and connections, at stop (the
    /// TLS manager's and the kernel's as last counted, before detaching).
    pub tables: crate::tables::TablesSummary,
    /// Closed TLS connections that moved data but have no `tls.ttfb_ns`, by
    /// why: never a guess in its place.
    pub tls_first_byte_unmeasured: TlsFirstByteUnmeasured,
    /// What the wire view of DNS saw besides lookups.
    pub dns_wire: DnsWireSummary,
    /// TLS libraries found and probes attached.
    pub tls: Option<crate::tls::TlsReport>,
    /// What the DNS probes sat on.
    pub dns: Option<crate::dns::DnsReport>,
    /// Each feature's state at stop: on, degraded (why) or off (why).
    pub features: crate::features::Features,
    /// Each program of the table: where it was attached, and failures.
    pub program_attachments: Vec<ProgramSummary>,
    /// `observer run`: what the OTLP exporter did.
    pub export: Option<ExportSummary>,
    /// Per-program run counts, run time and misses.
    pub programs: Vec<crate::ebpf::prog_stats::ProgStats>,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct TlsFirstByteUnmeasured {
    /// Clients without plaintext probes (busy, over the cap, or policy
    /// `off`): their socket cannot tell the answer from a TLS 1.3 session
    /// ticket.
    pub client_socket_only: u64,
    /// The process's plaintext probes came on after the connection's first
    /// exchange.
    pub plaintext_late: u64,
    /// TLS read on the wire only, not a full TLS 1.2 handshake: the answer
    /// cannot be told from TLS 1.3 session tickets.
    pub wire_tls13: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct HttpSummary {
    /// Answers whose request was not seen: the process's plaintext probes
    /// came in between (its first request, under the `auto` policy).
    pub answers_without_request: u64,
    /// Closes held back (up to 100 ms) because an exchange was in flight:
    /// its last bytes may come from a library call that returns after the
    /// close was seen; and of those, the ones whose exchange then ended.
    pub closes_waited: u64,
    pub closes_waited_completed: u64,
    /// Plain connections whose payload stopped being copied: over 2,000
    /// segments a second.
    pub busy_connections: u64,
    /// Plain connections not copied: the kernel's table of them was full.
    pub insert_failed: u64,
    /// HTTP/2 header blocks that could not be decoded (an earlier one was
    /// not seen whole, so the peer's table is unknown): those streams'
    /// fields are null.
    pub h2_undecodable_headers: u64,
    /// Times an HTTP/2 connection's frames were lost track of (a frame
    /// header among a long call's bytes not copied), until a call starting
    /// with a frame.
    pub h2_out_of_step: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Dropped {
    /// Kernel ring buffer was full (events lost in the kernel).
    pub kernel_ring: u64,
    /// CONNS insert failed (connections not tracked).
    pub kernel_map: u64,
    /// Program runs the kernel skipped because another tracing program was
    /// running on that CPU (bpf_prog_info.recursion_misses).
    pub kernel_missed: u64,
    /// Connections that left CONNS without a close event.
    pub evicted: u64,
    /// Userspace channel between reader and correlator was full.
    pub channel: u64,
    /// Output could not keep up.
    pub output: u64,
    /// DNS lookups on the wire not followed (too many in flight at once).
    pub dns: u64,
    /// Requests and closes of connection pools past `pools::MAX_POOLS`
    /// (left out of the pool figures).
    pub pools: u64,
}

impl Dropped {
    pub fn total(&self) -> u64 {
        self.kernel_ring
            + self.kernel_map
            + self.kernel_missed
            + self.evicted
            + self.channel
            + self.output
            + self.dns
            + self.pools
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct DnsWireSummary {
    /// Port-53 payloads that were not DNS messages (skipped).
    pub malformed: u64,
    /// Queries still unanswered when watching stopped (not reported).
    pub in_flight_at_stop: u64,
    /// Sockets the kernel could not remember (map full): their unanswered
    /// queries ended by age (30 s) rather than at the socket's release.
    pub kernel_sock_insert_failed: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct ExportSummary {
    pub spans_sent: u64,
    /// Records whose spans the endpoint took.
    pub records_sent: u64,
    /// Records not exported as traces by the sampling ratio.
    pub records_sampled_out: u64,
    /// Records given up after retries (the collector was away, slow or
    /// refused them); `spans_dropped`: their spans.
    pub records_dropped: u64,
    pub spans_dropped: u64,
    /// Records the exporter's queue could not take.
    pub queue_full: u64,
    pub export_errors: u64,
    pub metric_exports: u64,
    /// The endpoint does not implement that service (stopped at its first
    /// refusal; e.g. Jaeger takes traces only).
    pub traces_refused: bool,
    pub metrics_refused: bool,
}

impl ExportSummary {
    pub fn from_stats(s: &ExportStats, queue_full: u64) -> Self {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Self {
            spans_sent: g(&s.spans_sent),
            records_sent: g(&s.records_sent),
            records_sampled_out: g(&s.records_sampled_out),
            records_dropped: g(&s.records_dropped),
            spans_dropped: g(&s.spans_dropped),
            queue_full,
            export_errors: g(&s.export_errors),
            metric_exports: g(&s.metric_exports),
            traces_refused: s.traces_refused.load(Ordering::Relaxed),
            metrics_refused: s.metrics_refused.load(Ordering::Relaxed),
        }
    }
}

/// One program of the table over a run.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramSummary {
    pub program: &'static str,
    pub feature: crate::programs::Feature,
    /// Attachments made (a uprobe program: one per library function).
    pub attached: u64,
    pub failures: u64,
}

/// What the exporter did, for the summary and the drop metric.
#[derive(Debug, Default)]
pub struct ExportStats {
    pub spans_sent: AtomicU64,
    pub records_sent: AtomicU64,
    pub records_sampled_out: AtomicU64,
    /// Records whose spans were given up after retries, and those spans.
    pub records_dropped: AtomicU64,
    pub spans_dropped: AtomicU64,
    pub export_errors: AtomicU64,
    pub metric_exports: AtomicU64,
    /// The endpoint does not implement the trace / metrics service: that
    /// signal was stopped at its first refusal.
    pub traces_refused: AtomicBool,
    pub metrics_refused: AtomicBool,
}
