//! The summary of one run: what the pipeline counted (`Stats`), what the
//! correlator counted at its end, the kernel's own counters and each
//! program's, the exporter's, and each feature's state.

use std::sync::Arc;

use observer_common::Counter;

use crate::{
    correlator::CorrelatorEnd,
    dns::DnsReport,
    ebpf::{prog_stats::ProgStats, Probes},
    features::Features,
    stats::{
        DnsWireSummary, Dropped, ExportStats, ExportSummary, HttpSummary, ProgramSummary, Stats,
        Summary,
    },
    tls::TlsReport,
};

/// What the summary is counted from, read after the shutdown.
pub struct Parts<'a> {
    pub stats: &'a Stats,
    pub end: CorrelatorEnd,
    /// The kernel's counters (`Counter`), summed over CPUs.
    pub kernel: Vec<(Counter, u64)>,
    pub prog_stats: Vec<ProgStats>,
    pub probes: &'a Probes,
    pub export: Option<Arc<ExportStats>>,
}

impl Parts<'_> {
    fn k(&self, c: Counter) -> u64 {
        self.kernel
            .iter()
            .find(|(x, _)| *x == c)
            .map_or(0, |(_, v)| *v)
    }

    pub fn summary(self, features: Features, tls: TlsReport, dns: DnsReport) -> Summary {
        let (s, k) = (self.stats, |c| self.k(c));
        Summary {
            events: Stats::get(&s.events),
            connections_closed: Stats::get(&s.closed),
            dns_lookups: Stats::get(&s.dns),
            requests: Stats::get(&s.requests),
            http: self.http(),
            open_records: Stats::get(&s.open),
            filtered: Stats::get(&s.filtered),
            outbound_opened: k(Counter::OutboundOpened),
            inbound_opened: k(Counter::InboundOpened),
            adopted_midstream: k(Counter::Adopted),
            dropped: self.dropped(),
            dns_wire: DnsWireSummary {
                malformed: self.end.dns_malformed,
                in_flight_at_stop: self.end.dns_in_flight,
                kernel_sock_insert_failed: k(Counter::DnsSockInsertFailed),
            },
            decode_errors: Stats::get(&s.decode_errors),
            proc_unreadable: self.end.proc_unreadable,
            kernel_tracked_at_stop: self.end.kernel_tracked,
            close_untracked: k(Counter::CloseUntracked),
            replaced: k(Counter::Replaced),
            tls_bound: k(Counter::TlsBound),
            tls_wire: k(Counter::TlsWire),
            tls_rustls_tied: k(Counter::RustlsTied),
            tls_rustls_reads_unjoined: k(Counter::RustlsReadUnjoined),
            tls_tied_by_fd: k(Counter::TlsFdTied),
            tls_tied_by_packet: k(Counter::TlsPacketTied),
            lifecycle_nested_caught: k(Counter::LifecycleNested),
            tls_insert_failed: k(Counter::TlsInsertFailed),
            tls_commands_dropped: Stats::get(&s.tls_commands_full),
            tables: s.tables.read(),
            tls_first_byte_unmeasured: self.end.tls_unmeasured,
            tls: Some(tls),
            dns: Some(dns),
            features,
            program_attachments: self.program_attachments(),
            export: self
                .export
                .as_ref()
                .map(|e| ExportSummary::from_stats(e, Stats::get(&s.export_full))),
            programs: self.prog_stats,
        }
    }

    fn http(&self) -> HttpSummary {
        let s = self.stats;
        HttpSummary {
            answers_without_request: Stats::get(&s.http_orphans),
            closes_waited: Stats::get(&s.closes_waited),
            closes_waited_completed: Stats::get(&s.closes_waited_completed),
            busy_connections: self.k(Counter::HttpBusy),
            insert_failed: self.k(Counter::HttpInsertFailed),
            h2_undecodable_headers: Stats::get(&s.h2_undecodable),
            h2_out_of_step: Stats::get(&s.h2_out_of_step),
        }
    }

    fn dropped(&self) -> Dropped {
        let s = self.stats;
        Dropped {
            kernel_ring: self.k(Counter::RingFull),
            kernel_missed: self
                .prog_stats
                .iter()
                .filter(|p| crate::programs::skips_lose_events(&p.program))
                .map(|p| p.recursion_misses)
                .sum(),
            kernel_map: self.k(Counter::ConnInsertFailed),
            evicted: self.end.evicted,
            channel: Stats::get(&s.channel_full),
            output: Stats::get(&s.output_full),
            dns: self.end.dns_overflow,
            pools: Stats::get(&s.pools_untracked),
        }
    }

    fn program_attachments(&self) -> Vec<ProgramSummary> {
        self.probes
            .states()
            .into_iter()
            .map(|(p, s)| ProgramSummary {
                program: p.name,
                feature: p.feature,
                attached: s.attached,
                failures: s.failures,
            })
            .collect()
    }
}
