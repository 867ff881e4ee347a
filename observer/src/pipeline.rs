//! The pipeline `watch` and `run` share: ring buffer -> decode -> correlate
//! (connection, DNS and process state) -> sinks (terminal, OTLP exporter,
//! metrics). The correlator reads the ring itself; the sinks are joined to it
//! by bounded queues that it never waits on, and what a full queue refuses
//! is counted.

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use observer_common::{Counter, IDLE_POLL_MS, POLL_INTERVAL_MS};
use tokio::{
    io::unix::AsyncFd,
    sync::{mpsc, watch},
};

use crate::{
    clock::{monotonic_ns, Clock},
    conntrack::ConnTable,
    decode::{decode, Event},
    ebpf::{self, KernelConnMap},
    export::{
        attrs,
        config::ExportSetup,
        metrics::Metrics,
        otlp::{ExportStats, Exporter, Sampled, Sampling},
        prometheus,
        queue::{trace_queue, NotQueued, Origin, TraceQueue},
        spans::Traced,
    },
    filter::Filter,
    gpu,
    output::{self, Format},
    process::ProcessCache,
    record::{ConnRecord, State},
    stats::Stats,
    tls,
};

/// Records waiting for the output thread.
pub(crate) const OUTPUT_CHANNEL: usize = 65_536;

/// A lookup no connection followed within this is traced on its own (a
/// connection that comes later still shows it as its child span).
const UNUSED_LOOKUP_GRACE_NS: u64 = 5_000_000_000;

/// The wait before the next drain: the short interval while records come, doubling
/// up to IDLE_POLL_MS while drains find none.
///
/// The ring is drained on a short timer, and at once when the kernel wakes
/// us (the ring is filling). The timer backs off while drains find
/// nothing: on a busy keep-alive server the ring is nearly idle (no record
/// per request), and a reader waking 100 times a second preempts the very
/// processes being observed (bench/NOTES.md: the nginx worker's involuntary
/// context switches under load, 402-547 per 4 s with the observer, 133-215
/// without). The kernel's wake-up at an eighth full still bounds a burst.
fn next_wait_ms(wait_ms: u64, found: usize) -> u64 {
    if found >= MAX_DRAIN {
        // A drain that stopped at its cap: the ring is still full.
        0
    } else if found > 0 {
        POLL_INTERVAL_MS
    } else {
        (wait_ms * 2).min(IDLE_POLL_MS)
    }
}

/// Records one drain takes at most: a ring refilled as fast as it is read
/// must not keep the correlator from its ticks (snapshots, health).
const MAX_DRAIN: usize = 65_536;

/// Drains the ring, handing each record's event to `on_event` as it is
/// decoded (read where the kernel wrote it: no batch of events is built and
/// handed to another thread); returns how many records it held.
fn drain(ring: &mut RingBuf<MapData>, stats: &Stats, mut on_event: impl FnMut(Event)) -> usize {
    stats.health.reader_beat();
    let mut found = 0;
    while found < MAX_DRAIN {
        let Some(item) = ring.next() else { break };
        found += 1;
        let ev = decode(&item);
        // The record's room goes back to the kernel before the event is
        // worked on.
        drop(item);
        match ev {
            Ok(ev) => on_event(ev),
            Err(e) => {
                Stats::add(&stats.decode_errors, 1);
                tracing::debug!("undecodable record: {e}");
            }
        }
    }
    Stats::add(&stats.events, found as u64);
    found
}

/// What the correlator counted, for the summary.
pub(crate) struct CorrelatorEnd {
    pub(crate) evicted: u64,
    pub(crate) proc_unreadable: u64,
    /// Entries left in CONNS at stop (open connections, or leaks).
    pub(crate) kernel_tracked: u64,
    pub(crate) dns_malformed: u64,
    pub(crate) dns_in_flight: u64,
    pub(crate) dns_overflow: u64,
    pub(crate) tls_unmeasured: crate::stats::TlsFirstByteUnmeasured,
}

/// Where finished records go.
pub(crate) struct Sinks {
    /// The output thread (watch, or run --print).
    pub(crate) out: Option<mpsc::Sender<output::Line>>,
    /// The OTLP exporter's queue (records sampled before they are queued).
    pub(crate) export: Option<TraceQueue>,
    /// Histograms and counters (Prometheus, OTLP metrics).
    pub(crate) metrics: Option<Arc<Mutex<Metrics>>>,
    /// GPU samples, joined to the records of processes that use a GPU.
    pub(crate) gpu: Option<Arc<Mutex<gpu::History>>>,
    /// Pool records go to `out` too (`--pools`, `top`, `diagnose`).
    pub(crate) pools: bool,
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

#[allow(clippy::too_many_arguments)]
pub(crate) async fn correlate(
    mut ring: AsyncFd<RingBuf<MapData>>,
    mut stop: watch::Receiver<bool>,
    sinks: Sinks,
    conns: KernelConnMap,
    tls_tx: std::sync::mpsc::SyncSender<tls::Command>,
    filter: Filter,
    update_interval: Duration,
    keep_query: bool,
    stats: Arc<Stats>,
    counters: Arc<ebpf::KernelCounters>,
    pods: crate::k8s::Pods,
) -> anyhow::Result<CorrelatorEnd> {
    let mut table = ConnTable::new(ProcessCache::new("/proc").with_pods(pods), Clock::sample());
    table.keep_query = keep_query;
    // A lock rather than a RefCell: the correlator's future must be Send
    // (uncontended: only this task takes it).
    let pools = Mutex::new(crate::pools::Pools::default());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Closes waiting for an exchange's last bytes end on time even when no
    // event follows them.
    let mut closes_tick = tokio::time::interval(Duration::from_millis(50));
    closes_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // What the process's GPUs did between two wall-clock times.
    let gpu_during = |pid: u32, start: u64, end: u64| {
        let h = sinks.gpu.as_ref()?.lock().ok()?;
        h.join(pid, start, end)
    };
    let emit = |mut r: Box<ConnRecord>| {
        if !filter.matches(&r) {
            Stats::add(&stats.filtered, 1);
            return;
        }
        if let Some(pid) = r.pid {
            let end = r.end_unix_ns.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
            r.gpu = gpu_during(pid, r.start_unix_ns, end);
        }
        let counter = match r.state {
            State::Closed => &stats.closed,
            State::Open => &stats.open,
        };
        Stats::add(counter, 1);
        if r.state == State::Closed {
            if let Ok(mut p) = pools.lock() {
                p.on_close(&r);
            }
            // Judged once, for the metrics and the span (GPU joined first).
            r.diagnosis = Some(crate::cause::cause_of_conn(&r));
            if let Some(m) = &sinks.metrics {
                if let Ok(mut m) = m.lock() {
                    m.record(&r);
                }
            }
        }
        let export = sinks.export.as_ref().filter(|_| r.state == State::Closed);
        fan_out(
            r,
            export,
            Traced::Conn,
            sinks.out.as_ref(),
            output::Line::Conn,
            &stats,
        );
    };
    let emit_dns = |r: crate::dns::DnsRecord| {
        if let Some(m) = &sinks.metrics {
            if let Ok(mut m) = m.lock() {
                m.record_dns(&r);
            }
        }
        if !filter.matches_dns(&r) {
            Stats::add(&stats.filtered, 1);
            return;
        }
        Stats::add(&stats.dns, 1);
        if let Some(out) = &sinks.out {
            if out.try_send(output::Line::Dns(r)).is_err() {
                Stats::add(&stats.output_full, 1);
            }
        }
    };
    let emit_request = |mut r: Box<crate::http::RequestRecord>| {
        if !filter.matches_request(&r) {
            Stats::add(&stats.filtered, 1);
            return;
        }
        if let Some(pid) = r.pid {
            r.gpu = gpu_during(pid, r.start_unix_ns, r.end_unix_ns);
        }
        Stats::add(&stats.requests, 1);
        if let Ok(mut p) = pools.lock() {
            p.on_request(&r);
        }
        r.diagnosis = Some(crate::cause::cause_of_request(&r));
        if let Some(m) = &sinks.metrics {
            if let Ok(mut m) = m.lock() {
                m.record_request(&r);
            }
        }
        fan_out(
            r,
            sinks.export.as_ref(),
            Traced::Request,
            sinks.out.as_ref(),
            output::Line::Request,
            &stats,
        );
    };
    // Lookups no connection followed: traces of their own.
    let export_unused = |rs: Vec<crate::dns::DnsRecord>| {
        let Some(q) = &sinks.export else { return };
        for r in rs.into_iter().filter(|r| filter.matches_dns(r)) {
            match q.admits(&r) {
                Ok(()) => q.push(Traced::Dns(Box::new(r))),
                Err(NotQueued::Full) => Stats::add(&stats.export_full, 1),
                Err(_) => {}
            }
        }
        q.hand_over();
    };
    // Once a second: the pools' census, to the metrics and the printer.
    let pool_tick = |table: &ConnTable| {
        let now = Clock::sample().to_unix_ns(monotonic_ns());
        let Ok(mut p) = pools.lock() else { return };
        table.pool_census(&mut p, now);
        let records = p.tick(now);
        stats
            .pools_untracked
            .store(p.untracked, std::sync::atomic::Ordering::Relaxed);
        if let Some(m) = &sinks.metrics {
            if let Ok(mut m) = m.lock() {
                crate::export::metrics::pool_series(&mut m, &p);
            }
        }
        let Some(out) = sinks.out.as_ref().filter(|_| sinks.pools) else {
            return;
        };
        for r in records.into_iter().filter(|r| filter.matches_pool(r)) {
            if out.try_send(output::Line::Pool(Box::new(r))).is_err() {
                Stats::add(&stats.output_full, 1);
            }
        }
    };
    let hand_over = || {
        if let Some(q) = &sinks.export {
            q.hand_over();
        }
    };
    // One event, from the ring to the sinks.
    let on_event = |table: &mut ConnTable, ev: Event| {
        let cmd = match ev {
            Event::TlsProcess { pid, .. } => Some(tls::Command::TlsProcess(pid)),
            Event::TlsBusy { pid, calls } => Some(tls::Command::Busy(pid, calls)),
            Event::Exec { pid, .. } => Some(tls::Command::Exec(pid)),
            Event::Exit { pid } => Some(tls::Command::Exit(pid)),
            _ => None,
        };
        if let Some(cmd) = cmd {
            if let Err(std::sync::mpsc::TrySendError::Full(_)) = tls_tx.try_send(cmd) {
                Stats::add(&stats.tls_commands_full, 1);
            }
        }
        if let Some(r) = table.handle(ev) {
            emit(r);
        }
        for r in table.conns_out.drain(..) {
            emit(r);
        }
        for d in table.dns_out.drain(..) {
            emit_dns(d);
        }
        for r in table.requests_out.drain(..) {
            emit_request(r);
        }
    };
    // After a drain (and on the closes' own tick): closes whose wait is over,
    // and the batch to the exporter.
    let after_drain = |table: &mut ConnTable| {
        table.end_closes_due(monotonic_ns());
        for r in table.conns_out.drain(..) {
            emit(r);
        }
        for r in table.requests_out.drain(..) {
            emit_request(r);
        }
        hand_over();
    };
    let mut wait_ms = POLL_INTERVAL_MS;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {
                let found = drain(ring.get_mut(), &stats, |ev| on_event(&mut table, ev));
                wait_ms = next_wait_ms(wait_ms, found);
                after_drain(&mut table);
            }
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                let found = drain(guard.get_inner_mut(), &stats, |ev| on_event(&mut table, ev));
                guard.clear_ready();
                wait_ms = next_wait_ms(POLL_INTERVAL_MS, found.max(1));
                after_drain(&mut table);
            }
            // The kernel side is frozen first: this drain sees every event.
            _ = stop.changed() => {
                while drain(ring.get_mut(), &stats, |ev| on_event(&mut table, ev)) >= MAX_DRAIN {}
                after_drain(&mut table);
                break;
            }
            _ = closes_tick.tick(), if table.has_waiting_closes() => after_drain(&mut table),
            _ = tick.tick() => {
                stats.health.correlator_beat();
                table.set_clock(Clock::sample());
                stats.dns_overflow.store(table.wire.overflow, std::sync::atomic::Ordering::Relaxed);
                let now = Clock::sample().to_unix_ns(monotonic_ns());
                export_unused(table.unused_lookups(now, UNUSED_LOOKUP_GRACE_NS));
                for d in table.dns_out.drain(..) {
                    emit_dns(d);
                }
                if let Some(m) = &sinks.metrics {
                    health(m, &stats, &counters);
                    if let Some(h) = &sinks.gpu {
                        let latest = h.lock().map(|h| h.latest()).unwrap_or_default();
                        if let Ok(mut m) = m.lock() {
                            crate::export::metrics::gpu_gauges(&mut m, &latest);
                        }
                    }
                }
                pool_tick(&table);
                if !update_interval.is_zero() {
                    let interval = update_interval.as_nanos() as u64;
                    for r in table.periodic(&conns, monotonic_ns(), interval) {
                        emit(Box::new(r));
                    }
                }
                hand_over();
            }
        }
    }
    table.end_closes_due(u64::MAX);
    table.end_all_waits();
    for r in table.conns_out.drain(..) {
        emit(r);
    }
    for r in table.drain_open(&conns) {
        emit(Box::new(r));
    }
    for r in table.requests_out.drain(..) {
        emit_request(r);
    }
    stats
        .http_orphans
        .store(table.http_orphans(), std::sync::atomic::Ordering::Relaxed);
    stats
        .closes_waited
        .store(table.close_lingered, std::sync::atomic::Ordering::Relaxed);
    stats.closes_waited_completed.store(
        table.close_linger_completed,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (undecodable, out_of_step) = table.h2_losses();
    Stats::add(&stats.h2_undecodable, undecodable);
    Stats::add(&stats.h2_out_of_step, out_of_step);
    export_unused(table.unused_lookups(u64::MAX, 0));
    hand_over();
    Ok(CorrelatorEnd {
        evicted: table.evicted,
        proc_unreadable: table.proc_unreadable(),
        kernel_tracked: conns.conns.keys().count() as u64,
        dns_malformed: table.wire.malformed,
        dns_in_flight: table.wire.pending_len() as u64,
        dns_overflow: table.wire.overflow,
        tls_unmeasured: table.tls_unmeasured,
    })
}

/// How long the exporter may take for its last export at stop.
pub(crate) const EXPORT_FLUSH: Duration = Duration::from_secs(10);

pub(crate) type ExportParts = (
    (Option<TraceQueue>, Arc<Mutex<Metrics>>),
    Option<tokio::task::JoinHandle<()>>,
    Arc<ExportStats>,
    Option<tokio::task::JoinHandle<()>>,
);

/// Metrics, the Prometheus endpoint (bound before `ready`, so a taken port is
/// an error at once) and the OTLP exporter task.
pub(crate) async fn start_export(
    e: ExportSetup,
    probes_attached: u64,
    pipeline_stats: Arc<Stats>,
) -> anyhow::Result<ExportParts> {
    let s = e.settings;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let metrics = Arc::new(Mutex::new(Metrics::new(s.max_series, now)));
    if let Ok(mut m) = metrics.lock() {
        m.set_gauge(
            crate::export::metrics::PROBES,
            Vec::new(),
            probes_attached as f64,
        );
    }
    let prometheus = match s.prometheus_listen {
        Some(addr) => {
            let l = prometheus::bind(addr).await?;
            Some(tokio::spawn(prometheus::serve(
                l,
                Arc::clone(&metrics),
                pipeline_stats,
            )))
        }
        None => None,
    };
    let stats = Arc::new(ExportStats::default());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let mut resource = vec![
        attrs::s("service.name", "observer"),
        attrs::s("host.name", host.clone()),
    ];
    if let Some(node) = crate::k8s::Pods::node_name_from_env().filter(|n| !n.is_empty()) {
        resource.push(attrs::s("k8s.node.name", node));
    }
    for (k, v) in &s.resource {
        resource.retain(|a| &a.key != k);
        resource.push(attrs::s(k, v.clone()));
    }
    let (tx, task) = if s.otlp.traces.is_some() || s.otlp.metrics.is_some() {
        let sampling = Sampling {
            ratio: s.sample_ratio,
            slow: s.slow_threshold,
            parent_based: s.parent_based,
        };
        let origin = Origin {
            host,
            service_name: s.service_name.clone(),
        };
        let (tx, rx) = trace_queue(
            sampling,
            s.otlp.traces.is_some(),
            origin,
            Arc::clone(&stats),
        );
        let exporter = Exporter {
            config: s.otlp.clone(),
            resource,
            metrics: Arc::clone(&metrics),
            stats: Arc::clone(&stats),
        };
        (Some(tx), Some(tokio::spawn(exporter.run(rx))))
    } else {
        (None, None)
    };
    Ok(((tx, metrics), task, stats, prometheus))
}

/// The observer's own loss counters as `observer.events.dropped` by stage.
fn health(m: &Mutex<Metrics>, stats: &Stats, counters: &ebpf::KernelCounters) {
    use crate::export::metrics::DROPPED;
    let kernel = counters.get(Counter::RingFull) + counters.get(Counter::ConnInsertFailed);
    let stages = [
        ("kernel", kernel),
        ("channel", Stats::get(&stats.channel_full)),
        ("output", Stats::get(&stats.output_full)),
        ("exporter", Stats::get(&stats.export_full)),
        ("dns", Stats::get(&stats.dns_overflow)),
        // Requests and closes of pools past the cap.
        ("pools", Stats::get(&stats.pools_untracked)),
        // Plain HTTP connections no longer copied (busy) or never (table full).
        (
            "http",
            counters.get(Counter::HttpBusy) + counters.get(Counter::HttpInsertFailed),
        ),
    ];
    if let Ok(mut m) = m.lock() {
        for (stage, v) in stages {
            m.set_counter(DROPPED, vec![("stage", stage.into())], v);
        }
    }
}

pub(crate) fn write_output(
    mut rx: mpsc::Receiver<output::Line>,
    format: Format,
) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if format == Format::Text {
        writeln!(w, "{}", output::HEADER)?;
        w.flush()?;
    }
    // A plain thread: blocking_recv parks it until records come.
    while let Some(r) = rx.blocking_recv() {
        output::write_line(&mut w, &r, format)?;
        // Flush when the queue is empty so lines show up at once, but batch
        // writes under load.
        while let Ok(r) = rx.try_recv() {
            output::write_line(&mut w, &r, format)?;
        }
        w.flush()?;
    }
    w.flush()
}

#[cfg(test)]
mod read_timer_tests {
    use super::*;

    #[test]
    fn backs_off_while_idle_and_returns_at_once_with_records() {
        let mut w = POLL_INTERVAL_MS;
        let mut seen = vec![];
        for _ in 0..6 {
            w = next_wait_ms(w, 0);
            seen.push(w);
        }
        assert_eq!(seen, [20, 40, 80, 100, 100, 100]);
        assert_eq!(next_wait_ms(IDLE_POLL_MS, 1), POLL_INTERVAL_MS);
        assert_eq!(
            next_wait_ms(POLL_INTERVAL_MS, MAX_DRAIN),
            0,
            "the ring is still full"
        );
    }
}
