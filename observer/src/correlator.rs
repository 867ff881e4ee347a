//! The correlator: events in, finished records out to the sinks. It owns the
//! connection table (connections, DNS, HTTP, TLS joins), the pools and what
//! it hands each sink; `pipeline.rs` feeds it from the ring buffer and its
//! timers, and tests feed it events with no kernel at all.
//!
//! - `on_events`, `end_batch`: the events one drain of the ring held, then
//!   the closes whose wait was over when the ring was last read to its end,
//!   and the batch to the exporter.
//! - `on_tick`: once a second: lookups no connection followed, the pools'
//!   census, health and GPU gauges, snapshots of open connections.
//! - `finish`: at stop, everything still held, and the counts for the
//!   summary.

use std::{
    sync::{atomic::Ordering, mpsc::SyncSender, Arc, Mutex},
    time::Duration,
};

use observer_common::Counter;
use tokio::sync::mpsc;

use crate::{
    clock::{monotonic_ns, Clock},
    conntrack::ConnTable,
    decode::Event,
    dns::DnsRecord,
    ebpf::{KernelConns, KernelCounters},
    export::{
        metrics::{self, Metrics},
        queue::{NotQueued, TraceQueue},
        sampling::Sampled,
        spans::Traced,
    },
    filter::Filter,
    gpu,
    http::RequestRecord,
    output,
    pools::Pools,
    process::ProcessCache,
    record::{ConnRecord, State},
    stats::{Stats, TlsFirstByteUnmeasured},
    tables::Tables,
    tls,
};

/// A lookup no connection followed within this is traced on its own (a
/// connection that comes later still shows it as its child span).
const UNUSED_LOOKUP_GRACE_NS: u64 = 5_000_000_000;

/// Where finished records go.
pub struct Sinks {
    /// The output thread (watch, or run --print).
    pub out: Option<mpsc::Sender<output::Line>>,
    /// The OTLP exporter's queue (records sampled before they are queued).
    pub export: Option<TraceQueue>,
    /// Histograms and counters (Prometheus, OTLP metrics).
    pub metrics: Option<Arc<Mutex<Metrics>>>,
    /// GPU samples, joined to the records of processes that use a GPU.
    pub gpu: Option<Arc<Mutex<gpu::History>>>,
    /// Pool records go to `out` too (`--pools`, `top`, `diagnose`).
    pub pools: bool,
}

/// How the correlator is set up besides its sinks.
pub struct Settings {
    pub filter: Filter,
    /// `--update-interval`: snapshots of open connections (zero: none).
    pub update_interval: Duration,
    /// Keep each request's query string (`--keep-query`).
    pub keep_query: bool,
    /// The processes' events for the TLS probe manager (None: no TLS probes).
    pub tls_commands: Option<SyncSender<tls::Command>>,
    /// The kernel's loss counters, for the `observer.events.dropped` metric.
    pub counters: Option<Arc<KernelCounters>>,
}

/// What the correlator counted, for the summary.
pub struct CorrelatorEnd {
    pub evicted: u64,
    pub proc_unreadable: u64,
    /// Entries left in CONNS at stop (open connections, or leaks).
    pub kernel_tracked: u64,
    pub dns_malformed: u64,
    pub dns_in_flight: u64,
    pub dns_overflow: u64,
    pub tls_unmeasured: TlsFirstByteUnmeasured,
}

pub struct Correlator {
    table: ConnTable,
    delivery: Delivery,
    update_interval: Duration,
    tls_commands: Option<SyncSender<tls::Command>>,
    counters: Option<Arc<KernelCounters>>,
    /// Ticks so far (the kernel's connection map is counted every
    /// `KERNEL_CONNS_EVERY`).
    ticks: u64,
}

/// Ticks (seconds) between counts of the kernel's connection map.
const KERNEL_CONNS_EVERY: u64 = 5;

/// What takes a finished record to the sinks (apart from the table, so the
/// table's queues drain into it without a copy).
struct Delivery {
    pools: Pools,
    sinks: Sinks,
    filter: Filter,
    stats: Arc<Stats>,
}

impl Correlator {
    pub fn new(
        processes: ProcessCache,
        sinks: Sinks,
        settings: Settings,
        stats: Arc<Stats>,
    ) -> Self {
        let mut table = ConnTable::new(processes, Clock::sample());
        table.keep_query = settings.keep_query;
        Correlator {
            table,
            delivery: Delivery {
                pools: Pools::default(),
                sinks,
                filter: settings.filter,
                stats,
            },
            update_interval: settings.update_interval,
            tls_commands: settings.tls_commands,
            counters: settings.counters,
            ticks: 0,
        }
    }

    /// One drain's events; `end_batch` follows.
    pub fn on_events(&mut self, events: impl Iterator<Item = Event>) {
        for ev in events {
            self.on_event(ev);
        }
    }

    /// Whether closes wait for an exchange's last bytes (the caller's timer
    /// then ends them on time even when no event follows).
    pub fn has_waiting_closes(&self) -> bool {
        self.table.has_waiting_closes()
    }

    /// Once a second.
    pub fn on_tick(&mut self, kernel: &impl KernelConns) {
        self.delivery.stats.health.correlator_beat();
        self.store_sizes(kernel);
        self.table.set_clock(Clock::sample());
        self.delivery
            .stats
            .dns_overflow
            .store(self.table.wire.overflow, Ordering::Relaxed);
        let now = Clock::sample().to_unix_ns(monotonic_ns());
        let unused = self.table.unused_lookups(now, UNUSED_LOOKUP_GRACE_NS);
        self.delivery.export_unused(unused);
        for d in self.table.dns_out.drain(..) {
            self.delivery.emit_dns(d);
        }
        self.metrics_tick();
        self.pool_tick();
        if !self.update_interval.is_zero() {
            let interval = self.update_interval.as_nanos() as u64;
            for r in self.table.periodic(kernel, monotonic_ns(), interval) {
                self.delivery.emit(Box::new(r));
            }
        }
        self.delivery.hand_over();
    }

    /// The tables' entries for `/metrics`; the kernel's connection map
    /// (host-wide, one system call per entry to count) every
    /// `KERNEL_CONNS_EVERY` ticks.
    fn store_sizes(&mut self, kernel: &impl KernelConns) {
        let tables = &self.delivery.stats.tables;
        self.table.store_sizes(tables);
        if self.ticks.is_multiple_of(KERNEL_CONNS_EVERY) {
            Tables::set(&tables.kernel_connections, kernel.tracked() as usize);
        }
        self.ticks += 1;
    }

    /// At stop: ends every wait, emits what is still open, and counts.
    pub fn finish(mut self, kernel: &impl KernelConns) -> CorrelatorEnd {
        // The tables as they are at stop, before they are drained.
        let tracked = kernel.tracked();
        let tables = &self.delivery.stats.tables;
        self.table.store_sizes(tables);
        Tables::set(&tables.kernel_connections, tracked as usize);
        self.table.end_closes_due(u64::MAX);
        self.table.end_all_waits();
        for r in self.table.conns_out.drain(..) {
            self.delivery.emit(r);
        }
        for r in self.table.drain_open(kernel) {
            self.delivery.emit(Box::new(r));
        }
        for r in self.table.requests_out.drain(..) {
            self.delivery.emit_request(r);
        }
        self.count_losses();
        let unused = self.table.unused_lookups(u64::MAX, 0);
        self.delivery.export_unused(unused);
        self.delivery.hand_over();
        let t = &self.table;
        CorrelatorEnd {
            evicted: t.evicted,
            proc_unreadable: t.proc_unreadable(),
            kernel_tracked: tracked,
            dns_malformed: t.wire.malformed,
            dns_in_flight: t.wire.pending_len() as u64,
            dns_overflow: t.wire.overflow,
            tls_unmeasured: t.tls_unmeasured,
        }
    }

    /// One event, from the ring to the sinks.
    fn on_event(&mut self, ev: Event) {
        self.tell_tls_manager(&ev);
        if let Some(r) = self.table.handle(ev) {
            self.delivery.emit(r);
        }
        for r in self.table.conns_out.drain(..) {
            self.delivery.emit(r);
        }
        for d in self.table.dns_out.drain(..) {
            self.delivery.emit_dns(d);
        }
        for r in self.table.requests_out.drain(..) {
            self.delivery.emit_request(r);
        }
    }

    /// Closes whose wait was over when the ring was last read to its end,
    /// and the batch to the exporter. Not the time now: the last bytes a
    /// close waits for can be in the ring still (written without a wake-up,
    /// or behind a drain's cap), and a close ended before they are read
    /// leaves its answer "incomplete".
    /// `read_through`: when the drain began, if it read the ring to its
    /// end; `None` when it stopped at its cap.
    pub fn end_batch(&mut self, read_through: Option<u64>) {
        if let Some(t) = read_through {
            self.table.end_closes_due(t);
        }
        for r in self.table.conns_out.drain(..) {
            self.delivery.emit(r);
        }
        for r in self.table.requests_out.drain(..) {
            self.delivery.emit_request(r);
        }
        self.delivery.hand_over();
    }

    fn tell_tls_manager(&self, ev: &Event) {
        let cmd = match *ev {
            Event::TlsProcess { pid, .. } => tls::Command::TlsProcess(pid),
            Event::TlsBusy { pid, calls } => tls::Command::Busy(pid, calls),
            Event::Exec { pid, .. } => tls::Command::Exec(pid),
            Event::Exit { pid } => tls::Command::Exit(pid),
            _ => return,
        };
        let Some(tx) = &self.tls_commands else { return };
        if let Err(std::sync::mpsc::TrySendError::Full(_)) = tx.try_send(cmd) {
            Stats::add(&self.delivery.stats.tls_commands_full, 1);
        }
    }

    /// The pools' census, to the metrics and the printer.
    fn pool_tick(&mut self) {
        let now = Clock::sample().to_unix_ns(monotonic_ns());
        let d = &mut self.delivery;
        self.table.pool_census(&mut d.pools, now);
        let records = d.pools.tick(now);
        d.stats
            .pools_untracked
            .store(d.pools.untracked, Ordering::Relaxed);
        d.with_metrics(|m| metrics::pool_series(m, &d.pools));
        let Some(out) = d.sinks.out.as_ref().filter(|_| d.sinks.pools) else {
            return;
        };
        for r in records.into_iter().filter(|r| d.filter.matches_pool(r)) {
            if out.try_send(output::Line::Pool(Box::new(r))).is_err() {
                Stats::add(&d.stats.output_full, 1);
            }
        }
    }

    /// The observer's own loss counters and the GPUs' latest samples.
    fn metrics_tick(&self) {
        let Some(m) = &self.delivery.sinks.metrics else {
            return;
        };
        if let Some(counters) = &self.counters {
            health(m, &self.delivery.stats, counters);
        }
        if let Some(h) = &self.delivery.sinks.gpu {
            let latest = h.lock().map(|h| h.latest()).unwrap_or_default();
            if let Ok(mut m) = m.lock() {
                metrics::gpu_gauges(&mut m, &latest);
            }
        }
    }

    /// The table's losses, into the stats, at stop.
    fn count_losses(&self) {
        let (s, t) = (&self.delivery.stats, &self.table);
        s.http_orphans.store(t.http_orphans(), Ordering::Relaxed);
        s.closes_waited.store(t.close_lingered, Ordering::Relaxed);
        s.closes_waited_completed
            .store(t.close_linger_completed, Ordering::Relaxed);
        let (undecodable, out_of_step) = t.h2_losses();
        Stats::add(&s.h2_undecodable, undecodable);
        Stats::add(&s.h2_out_of_step, out_of_step);
    }
}

impl Delivery {
    /// What the process's GPUs did between two wall-clock times.
    fn gpu_during(&self, pid: u32, start: u64, end: u64) -> Option<gpu::GpuRecord> {
        let h = self.sinks.gpu.as_ref()?.lock().ok()?;
        h.join(pid, start, end)
    }

    fn emit(&mut self, mut r: Box<ConnRecord>) {
        if !self.filter.matches(&r) {
            Stats::add(&self.stats.filtered, 1);
            return;
        }
        if let Some(pid) = r.pid {
            let end = r.end_unix_ns.unwrap_or_else(unix_now_ns);
            r.gpu = self.gpu_during(pid, r.start_unix_ns, end);
        }
        let counter = match r.state {
            State::Closed => &self.stats.closed,
            State::Open => &self.stats.open,
        };
        Stats::add(counter, 1);
        if r.state == State::Closed {
            self.pools.on_close(&r);
            // Judged once, for the metrics and the span (GPU joined first).
            r.diagnosis = Some(crate::cause::cause_of_conn(&r));
            self.with_metrics(|m| m.record(&r));
        }
        let export = self
            .sinks
            .export
            .as_ref()
            .filter(|_| r.state == State::Closed);
        fan_out(
            r,
            export,
            Traced::Conn,
            self.sinks.out.as_ref(),
            output::Line::Conn,
            &self.stats,
        );
    }

    fn emit_dns(&mut self, r: DnsRecord) {
        self.with_metrics(|m| m.record_dns(&r));
        if !self.filter.matches_dns(&r) {
            Stats::add(&self.stats.filtered, 1);
            return;
        }
        Stats::add(&self.stats.dns, 1);
        if let Some(out) = &self.sinks.out {
            if out.try_send(output::Line::Dns(r)).is_err() {
                Stats::add(&self.stats.output_full, 1);
            }
        }
    }

    fn emit_request(&mut self, mut r: Box<RequestRecord>) {
        if !self.filter.matches_request(&r) {
            Stats::add(&self.stats.filtered, 1);
            return;
        }
        if let Some(pid) = r.pid {
            r.gpu = self.gpu_during(pid, r.start_unix_ns, r.end_unix_ns);
        }
        Stats::add(&self.stats.requests, 1);
        self.pools.on_request(&r);
        r.diagnosis = Some(crate::cause::cause_of_request(&r));
        self.with_metrics(|m| m.record_request(&r));
        let export = self.sinks.export.as_ref();
        fan_out(
            r,
            export,
            Traced::Request,
            self.sinks.out.as_ref(),
            output::Line::Request,
            &self.stats,
        );
    }

    /// Lookups no connection followed: traces of their own.
    fn export_unused(&self, rs: Vec<DnsRecord>) {
        let Some(q) = &self.sinks.export else { return };
        for r in rs.into_iter().filter(|r| self.filter.matches_dns(r)) {
            match q.admits(&r) {
                Ok(()) => q.push(Traced::Dns(Box::new(r))),
                Err(NotQueued::Full) => Stats::add(&self.stats.export_full, 1),
                Err(_) => {}
            }
        }
        q.hand_over();
    }

    fn with_metrics(&self, f: impl FnOnce(&mut Metrics)) {
        if let Some(m) = &self.sinks.metrics {
            if let Ok(mut m) = m.lock() {
                f(&mut m);
            }
        }
    }

    fn hand_over(&self) {
        if let Some(q) = &self.sinks.export {
            q.hand_over();
        }
    }
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A finished record to the exporter and the printer, copied only when both
/// take it (`run` without `--print` moves it to the exporter). The sampler
/// decides first: a record it leaves out is not copied for the exporter.
fn fan_out<T: Clone + Sampled>(
    r: Box<T>,
    export: Option<&TraceQueue>,
    traced: fn(Box<T>) -> Traced,
    out: Option<&mpsc::Sender<output::Line>>,
    line: fn(Box<T>) -> output::Line,
    stats: &Stats,
) {
    let export = export.filter(|q| match q.admits(r.as_ref()) {
        Ok(()) => true,
        Err(NotQueued::Full) => {
            Stats::add(&stats.export_full, 1);
            false
        }
        Err(NotQueued::SampledOut | NotQueued::NoTraces) => false,
    });
    let (to_export, to_out) = match (export, out) {
        (Some(_), Some(_)) => (Some(r.clone()), Some(r)),
        (Some(_), None) => (Some(r), None),
        (None, Some(_)) => (None, Some(r)),
        (None, None) => return,
    };
    if let (Some(q), Some(r)) = (export, to_export) {
        q.push(traced(r));
    }
    if let (Some(out), Some(r)) = (out, to_out) {
        if out.try_send(line(r)).is_err() {
            Stats::add(&stats.output_full, 1);
        }
    }
}

/// The observer's own loss counters as `observer.events.dropped` by stage,
/// its tables' entries as `observer.tables.entries` and its heap as
/// `observer.memory.heap`.
fn health(m: &Mutex<Metrics>, stats: &Stats, counters: &KernelCounters) {
    let kernel = counters.get(Counter::RingFull) + counters.get(Counter::ConnInsertFailed);
    let stages = [
        ("kernel", kernel),
        // Runs the kernel skipped (the program already running on the CPU).
        ("kernel_missed", counters.skipped()),
        ("channel", Stats::get(&stats.channel_full)),
        ("output", Stats::get(&stats.output_full)),
        ("exporter", Stats::get(&stats.export_full)),
        ("dns", Stats::get(&stats.dns_overflow)),
        // Requests and closes of pools past the cap.
        ("pools", Stats::get(&stats.pools_untracked)),
        // Process events the TLS manager could not take (its queue full).
        ("tls_commands", Stats::get(&stats.tls_commands_full)),
        // Plain HTTP connections no longer copied (busy) or never (table full).
        (
            "http",
            counters.get(Counter::HttpBusy) + counters.get(Counter::HttpInsertFailed),
        ),
    ];
    let tables = stats.tables.read();
    let heap = crate::heap::Heap::read();
    if let Ok(mut m) = m.lock() {
        for (stage, v) in stages {
            m.set_counter(metrics::DROPPED, vec![("stage", stage.into())], v);
        }
        for (table, v) in tables.by_name() {
            m.set_gauge(metrics::TABLES, vec![("table", table.into())], v as f64);
        }
        for (state, v) in heap.by_state() {
            m.set_gauge(metrics::HEAP, vec![("state", state.into())], v as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{Conn, TlsConn, AF_INET, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED};

    use super::*;

    /// The kernel's connection map, as tests hold it.
    struct NoKernel;

    impl KernelConns for NoKernel {
        fn lookup(&self, _sk: u64) -> Option<Conn> {
            None
        }
    }

    fn correlator(filter: Filter) -> (Correlator, mpsc::Receiver<output::Line>, Arc<Stats>) {
        let (tx, rx) = mpsc::channel(16);
        let sinks = Sinks {
            out: Some(tx),
            export: None,
            metrics: Some(Arc::new(Mutex::new(Metrics::new(1000, 0)))),
            gpu: None,
            pools: false,
        };
        let settings = Settings {
            filter,
            update_interval: Duration::ZERO,
            keep_query: false,
            tls_commands: None,
            counters: None,
        };
        let stats = Arc::new(Stats::default());
        let c = Correlator::new(
            ProcessCache::new("/proc"),
            sinks,
            settings,
            Arc::clone(&stats),
        );
        (c, rx, stats)
    }

    /// A connection of `pid` owned, then closed after `ms` milliseconds.
    fn connection(sk: u64, pid: u32, ms: u64) -> [Event; 2] {
        let owner = Event::Owner {
            ts_ns: 1,
            sk,
            pid,
            tid: pid,
            comm: *b"client\0\0\0\0\0\0\0\0\0\0",
            direction: DIR_OUTBOUND,
            remote: None,
            remote_port: 443,
        };
        let conn = Conn {
            sk,
            start_ns: 1_000,
            established_ns: 2_000,
            end_ns: 1_000 + ms * 1_000_000,
            pid,
            tid: pid,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            dport: 443,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            ..Conn::default()
        };
        [owner, Event::Close(conn, TlsConn::default())]
    }

    #[test]
    fn a_batch_of_events_becomes_a_record_at_the_printer_and_in_the_metrics() {
        let (mut c, mut rx, stats) = correlator(Filter::default());
        c.on_events(connection(7, 4242, 30).into_iter());
        c.end_batch(Some(monotonic_ns()));
        let Ok(output::Line::Conn(r)) = rx.try_recv() else {
            panic!("no connection record");
        };
        assert_eq!(
            (r.pid, r.remote_port, r.state),
            (Some(4242), 443, State::Closed)
        );
        assert_eq!(r.duration_ns, Some(30_000_000));
        // Judged before it left: the span attribute and the cause count agree.
        assert!(r.diagnosis.is_some());
        assert_eq!(Stats::get(&stats.closed), 1);
        c.on_tick(&NoKernel);
        let end = c.finish(&NoKernel);
        assert_eq!((end.evicted, end.kernel_tracked), (0, 0));
        assert!(rx.try_recv().is_err(), "one record only");
    }

    #[test]
    fn the_filter_is_applied_and_counted_before_the_sinks() {
        let only = Filter {
            pids: vec![1],
            ..Filter::default()
        };
        let (mut c, mut rx, stats) = correlator(only);
        c.on_events(connection(8, 4242, 5).into_iter());
        c.end_batch(Some(monotonic_ns()));
        assert!(rx.try_recv().is_err());
        assert_eq!(Stats::get(&stats.filtered), 1);
        assert_eq!(Stats::get(&stats.closed), 0);
    }
}
