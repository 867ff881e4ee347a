//! `observer watch`: the pipeline from ring buffer to terminal.
//!
//! reader (drains the ring buffer, decodes, never blocks: try_send) ->
//! correlator (ConnTable; snapshots) -> output thread (stdout). Stages are
//! joined by bounded channels; what a full channel refuses is counted.

use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use observer_common::{Counter, EVENTS_MAP, POLL_INTERVAL_MS};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    sync::{mpsc, watch},
};

use crate::{
    cli::WatchArgs,
    clock::{monotonic_ns, Clock},
    conntrack::ConnTable,
    decode::{decode, Event},
    ebpf::{self, KernelConnMap, LoadOptions, ProbeReport},
    export::{
        attrs,
        config::RunSettings,
        metrics::Metrics,
        otlp::{ExportStats, Exporter, Sampling},
        prometheus,
        spans::Traced,
    },
    filter::Filter,
    gpu,
    output::{self, Format},
    process::ProcessCache,
    record::{ConnRecord, State},
    stats::{Dropped, ExportSummary, Stats, Summary},
    tls::{self, TlsProbes},
    tracefs,
};

/// Batches of decoded events between reader and correlator.
const EVENT_CHANNEL_BATCHES: usize = 4096;
const MAX_BATCH: usize = 1024;
/// Records waiting for the output thread.
const OUTPUT_CHANNEL: usize = 65_536;
/// Process events waiting for the TLS probe manager.
const TLS_COMMANDS: usize = 4096;

/// What `observer run` adds to `watch`: exporters.
pub struct ExportSetup {
    pub settings: RunSettings,
    /// Also print records on stdout.
    pub print: bool,
}

/// A lookup no connection followed within this is traced on its own (a
/// connection that comes later still shows it as its child span).
const UNUSED_LOOKUP_GRACE_NS: u64 = 5_000_000_000;

/// Records waiting for the OTLP exporter.
const EXPORT_QUEUE: usize = 8192;

pub async fn run(args: WatchArgs, export: Option<ExportSetup>) -> anyhow::Result<Summary> {
    let opts = LoadOptions {
        max_connections: args.max_connections,
        ring_bytes: args.ring_bytes,
        // Only per-process probes can come off a busy process.
        tls_busy_rate: match args.tls_plaintext_probes {
            tls::Policy::Auto => args.tls_plaintext_max_rate,
            tls::Policy::Off | tls::Policy::All => 0,
        },
    };
    if !crate::privileges::Privileges::current().sufficient() {
        return Err(ebpf::LoadError::NotPrivileged.into());
    }
    raise_fd_limit();
    let tracefs = tracefs::find_or_mount()?;
    let mut loaded = ebpf::load(&opts, &tracefs)?;
    let reports = ebpf::attach(&mut loaded, &tracefs)?;
    if let Err(e) = &loaded.offsets {
        tracing::warn!(
            "no socket field offsets ({e}): \"timeout\"/\"unreachable\" errors and RTTs are lost"
        );
    }
    let mut bpf = loaded.ebpf;
    let dns_line = crate::dns::attach(&mut bpf, args.dns_wire == crate::cli::OnOff::On).summary();
    let mut tls = TlsProbes::new(
        &mut bpf,
        tls::Settings {
            policy: args.tls_plaintext_probes,
            max_rate: args.tls_plaintext_max_rate,
            max_processes: args.tls_plaintext_max_processes as usize,
        },
        Path::new("/proc"),
        &tracefs,
    );
    tls.discover(&mut bpf);
    let ring = RingBuf::try_from(bpf.take_map(EVENTS_MAP).context("no EVENTS map")?)
        .context("EVENTS is not a ring buffer")?;
    // SAFETY: the RingBuf owns its map fd for its whole life and always returns
    // that same fd; the AsyncFd owns the RingBuf.
    let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
    let conns = KernelConnMap::take(&mut bpf).context("no CONNS map")?;
    let counters = Arc::new(ebpf::KernelCounters::take(&mut bpf));
    let probes_attached = reports.iter().filter(|r| r.attached()).count() as u64
        + tls
            .report
            .files
            .iter()
            .map(|f| f.probes as u64)
            .sum::<u64>();

    let stats = Arc::new(Stats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ev_tx, ev_rx) = mpsc::channel::<Vec<Event>>(EVENT_CHANNEL_BATCHES);
    // tokio's bounded channel allocates as it fills (std's sync_channel would
    // reserve all OUTPUT_CHANNEL records, about 20 MiB, up front).
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let print = export.as_ref().is_none_or(|e| e.print);
    let (out_tx, output) = if print {
        let (tx, rx) = mpsc::channel::<output::Line>(OUTPUT_CHANNEL);
        let thread = std::thread::Builder::new()
            .name("output".into())
            .spawn(move || write_output(rx, format))
            .context("starting the output thread")?;
        (Some(tx), Some(thread))
    } else {
        (None, None)
    };
    let mut sinks = Sinks {
        out: out_tx,
        export: None,
        metrics: None,
        gpu: None,
    };
    let mut exporter = None;
    let mut export_stats = None;
    let mut prometheus = None;
    if let Some(e) = export {
        let (setup, task, stats, prom) = start_export(e, probes_attached).await?;
        sinks.export = setup.0;
        sinks.metrics = Some(setup.1);
        exporter = task;
        export_stats = Some(stats);
        prometheus = prom;
    }
    // GPUs: sampled on a thread of their own; without NVML, one line says so.
    let (gpu_history, gpu_stop, gpu_line) = match gpu::Gpus::open(args.nvml_lib.as_deref()) {
        Ok(g) => {
            let n = g.device_count();
            let history = Arc::new(Mutex::new(gpu::History::default()));
            let (stop_tx, stop_rx) = std::sync::mpsc::channel();
            gpu::history::spawn_poller(
                g,
                Duration::from_millis(args.gpu_interval),
                Arc::clone(&history),
                stop_rx,
            )
            .context("starting the GPU poller")?;
            (
                Some(history),
                Some(stop_tx),
                format!("GPU: {n} devices (NVML)"),
            )
        }
        Err(e) => (None, None, format!("GPU: off ({e})")),
    };
    sinks.gpu = gpu_history.clone();
    let ready = format!(
        "{}; {}; {gpu_line}; {dns_line}{}",
        ready_line(&reports, opts.max_connections),
        tls.summary(),
        tls.report
            .resolver_files
            .iter()
            .filter(|f| f.error.is_none())
            .map(|f| format!("; DNS also: {} in {}", f.probed.join(", "), f.path))
            .collect::<String>()
    );
    // The TLS manager owns the eBPF object while it runs (it attaches and
    // detaches uprobes) and gives it back when stopped.
    let (tls_tx, tls_rx) = std::sync::mpsc::sync_channel(TLS_COMMANDS);
    let manager = std::thread::Builder::new()
        .name("tls-probes".into())
        .spawn(move || tls.run(bpf, tls_rx))
        .context("starting the TLS probe thread")?;
    let reader = tokio::spawn(read_ring(ring, ev_tx, stop_rx, Arc::clone(&stats)));
    let correlator = tokio::spawn(correlate(
        ev_rx,
        sinks,
        conns,
        tls_tx.clone(),
        Filter::from_args(&args),
        args.update_interval,
        Arc::clone(&stats),
        Arc::clone(&counters),
    ));

    eprintln!("{ready}");
    wait_for_stop(args.duration).await?;
    let _ = tls_tx.send(tls::Command::Stop);
    let (mut bpf, tls_report) = manager
        .join()
        .map_err(|_| anyhow::anyhow!("the TLS probe thread panicked"))?;
    // Freeze the kernel side first, so the last drain sees every event and the
    // open-connection snapshot reads a map that no longer changes.
    let prog_stats = ebpf::prog_stats::read(&bpf);
    ebpf::detach_all(&mut bpf);
    let _ = stop_tx.send(true);

    reader.await.context("reader task")??;
    let end = correlator.await.context("correlator task")?;
    drop(gpu_stop);
    // The correlator dropped the exporter's queue: it flushes and ends.
    if let Some(task) = exporter {
        if tokio::time::timeout(EXPORT_FLUSH, task).await.is_err() {
            tracing::warn!("OTLP: the last export did not finish within {EXPORT_FLUSH:?}");
        }
    }
    if let Some(p) = prometheus {
        p.abort();
    }
    if let Some(output) = output {
        if let Err(e) = output.join().unwrap_or(Ok(())) {
            // A closed stdout (e.g. `| head`) is not an error of ours.
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                tracing::warn!("writing output: {e}");
            }
        }
    }
    let kernel = counters.read();
    let k = |c: Counter| kernel.iter().find(|(x, _)| *x == c).map_or(0, |(_, v)| *v);
    // Dropping `bpf` closes the maps; had anything failed above, the drop would
    // still detach every program (all links are fd-based).
    drop(bpf);
    Ok(Summary {
        events: Stats::get(&stats.events),
        connections_closed: Stats::get(&stats.closed),
        dns_lookups: Stats::get(&stats.dns),
        open_records: Stats::get(&stats.open),
        filtered: Stats::get(&stats.filtered),
        outbound_opened: k(Counter::OutboundOpened),
        inbound_opened: k(Counter::InboundOpened),
        dropped: Dropped {
            kernel_ring: k(Counter::RingFull),
            kernel_missed: prog_stats.iter().map(|p| p.recursion_misses).sum(),
            kernel_map: k(Counter::ConnInsertFailed),
            evicted: end.evicted,
            channel: Stats::get(&stats.channel_full),
            output: Stats::get(&stats.output_full),
            dns: end.dns_overflow,
        },
        dns_wire: crate::stats::DnsWireSummary {
            malformed: end.dns_malformed,
            in_flight_at_stop: end.dns_in_flight,
            kernel_sock_insert_failed: k(Counter::DnsSockInsertFailed),
        },
        decode_errors: Stats::get(&stats.decode_errors),
        proc_unreadable: end.proc_unreadable,
        kernel_tracked_at_stop: end.kernel_tracked,
        close_untracked: k(Counter::CloseUntracked),
        replaced: k(Counter::Replaced),
        tls_bound: k(Counter::TlsBound),
        tls_insert_failed: k(Counter::TlsInsertFailed),
        tls_commands_dropped: Stats::get(&stats.tls_commands_full),
        tls: Some(tls_report),
        export: export_stats.map(|e| ExportSummary::from_stats(&e, Stats::get(&stats.export_full))),
        programs: prog_stats,
    })
}

/// Each process with per-call TLS probes holds 8-12 perf event fds; a
/// service manager's default soft limit (1024) would stop at ~100 processes.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("raising the fd limit: {}", std::io::Error::last_os_error());
            }
        }
    }
}

fn ready_line(reports: &[ProbeReport], max_connections: u32) -> String {
    let attached = reports.iter().filter(|r| r.attached()).count();
    let mut line = format!(
        "ready: {attached}/{} probes attached, tracking up to {max_connections} connections (observer pid {})",
        reports.len(),
        std::process::id()
    );
    for r in reports.iter().filter(|r| !r.attached()) {
        line.push_str(&format!("; lost {}: {}", r.feature, r.program));
    }
    line
}

async fn wait_for_stop(duration: Option<Duration>) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let timer = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = timer => {}
    }
    Ok(())
}

/// Drains the ring buffer on a short timer, and at once when the kernel wakes
/// us (the ring is filling); on stop, drains it once more and returns
/// (dropping the sender ends the correlator).
async fn read_ring(
    mut ring: AsyncFd<RingBuf<MapData>>,
    tx: mpsc::Sender<Vec<Event>>,
    mut stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
) -> anyhow::Result<()> {
    let mut poll = tokio::time::interval(Duration::from_millis(POLL_INTERVAL_MS));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = poll.tick() => drain(ring.get_mut(), &tx, &stats),
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                drain(guard.get_inner_mut(), &tx, &stats);
                guard.clear_ready();
            }
            _ = stop.changed() => {
                drain(ring.get_mut(), &tx, &stats);
                return Ok(());
            }
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>, tx: &mpsc::Sender<Vec<Event>>, stats: &Stats) {
    let mut batch = Vec::with_capacity(64);
    while let Some(item) = ring.next() {
        Stats::add(&stats.events, 1);
        match decode(&item) {
            Ok(ev) => batch.push(ev),
            Err(e) => {
                Stats::add(&stats.decode_errors, 1);
                tracing::debug!("undecodable record: {e}");
            }
        }
        if batch.len() >= MAX_BATCH {
            send(tx, std::mem::take(&mut batch), stats);
        }
    }
    if !batch.is_empty() {
        send(tx, batch, stats);
    }
}

fn send(tx: &mpsc::Sender<Vec<Event>>, batch: Vec<Event>, stats: &Stats) {
    if let Err(e) = tx.try_send(batch) {
        let n = match e {
            mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b) => b.len(),
        };
        Stats::add(&stats.channel_full, n as u64);
    }
}

/// What the correlator counted, for the summary.
struct CorrelatorEnd {
    evicted: u64,
    proc_unreadable: u64,
    /// Entries left in CONNS at stop (open connections, or leaks).
    kernel_tracked: u64,
    dns_malformed: u64,
    dns_in_flight: u64,
    dns_overflow: u64,
}

/// Where finished records go.
struct Sinks {
    /// The output thread (watch, or run --print).
    out: Option<mpsc::Sender<output::Line>>,
    /// The OTLP exporter's queue.
    export: Option<mpsc::Sender<Traced>>,
    /// Histograms and counters (Prometheus, OTLP metrics).
    metrics: Option<Arc<Mutex<Metrics>>>,
    /// GPU samples, joined to the records of processes that use a GPU.
    gpu: Option<Arc<Mutex<gpu::History>>>,
}

#[allow(clippy::too_many_arguments)]
async fn correlate(
    mut rx: mpsc::Receiver<Vec<Event>>,
    sinks: Sinks,
    conns: KernelConnMap,
    tls_tx: std::sync::mpsc::SyncSender<tls::Command>,
    filter: Filter,
    update_interval: Duration,
    stats: Arc<Stats>,
    counters: Arc<ebpf::KernelCounters>,
) -> CorrelatorEnd {
    let mut table = ConnTable::new(ProcessCache::new("/proc"), Clock::sample());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let emit = |mut r: ConnRecord| {
        if !filter.matches(&r) {
            Stats::add(&stats.filtered, 1);
            return;
        }
        if let (Some(h), Some(pid)) = (&sinks.gpu, r.pid) {
            let end = r.end_unix_ns.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
            if let Ok(h) = h.lock() {
                r.gpu = h.join(pid, r.start_unix_ns, end);
            }
        }
        let counter = match r.state {
            State::Closed => &stats.closed,
            State::Open => &stats.open,
        };
        Stats::add(counter, 1);
        if r.state == State::Closed {
            if let Some(m) = &sinks.metrics {
                if let Ok(mut m) = m.lock() {
                    m.record(&r);
                }
            }
            if let Some(tx) = &sinks.export {
                if tx.try_send(Traced::Conn(r.clone())).is_err() {
                    Stats::add(&stats.export_full, 1);
                }
            }
        }
        if let Some(out) = &sinks.out {
            if out.try_send(output::Line::Conn(r)).is_err() {
                Stats::add(&stats.output_full, 1);
            }
        }
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
    // Lookups no connection followed: traces of their own.
    let export_unused = |rs: Vec<crate::dns::DnsRecord>| {
        let Some(tx) = &sinks.export else { return };
        for r in rs.into_iter().filter(|r| filter.matches_dns(r)) {
            if tx.try_send(Traced::Dns(r)).is_err() {
                Stats::add(&stats.export_full, 1);
            }
        }
    };
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                for ev in batch {
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
                    for d in table.dns_out.drain(..) {
                        emit_dns(d);
                    }
                }
            }
            _ = tick.tick() => {
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
                if !update_interval.is_zero() {
                    let interval = update_interval.as_nanos() as u64;
                    for r in table.periodic(&conns, monotonic_ns(), interval) {
                        emit(r);
                    }
                }
            }
        }
    }
    for r in table.drain_open(&conns) {
        emit(r);
    }
    export_unused(table.unused_lookups(u64::MAX, 0));
    CorrelatorEnd {
        evicted: table.evicted,
        proc_unreadable: table.proc_unreadable(),
        kernel_tracked: conns.conns.keys().count() as u64,
        dns_malformed: table.wire.malformed,
        dns_in_flight: table.wire.pending_len() as u64,
        dns_overflow: table.wire.overflow,
    }
}

/// How long the exporter may take for its last export at stop.
const EXPORT_FLUSH: Duration = Duration::from_secs(10);

type ExportParts = (
    (Option<mpsc::Sender<Traced>>, Arc<Mutex<Metrics>>),
    Option<tokio::task::JoinHandle<()>>,
    Arc<ExportStats>,
    Option<tokio::task::JoinHandle<()>>,
);

/// Metrics, the Prometheus endpoint (bound before `ready`, so a taken port is
/// an error at once) and the OTLP exporter task.
async fn start_export(e: ExportSetup, probes_attached: u64) -> anyhow::Result<ExportParts> {
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
            Some(tokio::spawn(prometheus::serve(l, Arc::clone(&metrics))))
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
    for (k, v) in &s.resource {
        resource.retain(|a| &a.key != k);
        resource.push(attrs::s(k, v.clone()));
    }
    let (tx, task) = if s.otlp.traces.is_some() || s.otlp.metrics.is_some() {
        let (tx, rx) = mpsc::channel::<Traced>(EXPORT_QUEUE);
        let exporter = Exporter {
            config: s.otlp.clone(),
            sampling: Sampling {
                ratio: s.sample_ratio,
                slow: s.slow_threshold,
            },
            host,
            service_name: s.service_name.clone(),
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
    ];
    if let Ok(mut m) = m.lock() {
        for (stage, v) in stages {
            m.set_counter(DROPPED, vec![("stage", stage.into())], v);
        }
    }
}

fn write_output(mut rx: mpsc::Receiver<output::Line>, format: Format) -> std::io::Result<()> {
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

/// The line printed on stderr when watching stops.
pub fn summary_line(s: &Summary, json: bool) -> String {
    if json {
        return format!(
            "summary {}",
            serde_json::to_string(s).unwrap_or_else(|_| "{}".into())
        );
    }
    let d = &s.dropped;
    let tls = s.tls.as_ref().map_or(String::new(), |t| {
        format!(
            "; TLS: {} sessions tied to connections, per-call probes on {} processes ({} fell back to socket timing, {} over the cap), {} attach errors, {} lost (maps full)",
            s.tls_bound,
            t.plaintext_attached_total,
            t.plaintext_fell_back,
            t.plaintext_over_cap,
            t.attach_errors,
            s.tls_insert_failed
        )
    });
    let export = s.export.as_ref().map_or(String::new(), |e| {
        format!(
            "; OTLP: {} spans sent, {} records sampled out, {} dropped after retries, {} not queued, {} export errors",
            e.spans_sent, e.records_sampled_out, e.records_dropped, e.queue_full, e.export_errors
        )
    });
    format!(
        "summary: {} connections closed, {} open-connection snapshots, {} dns lookups, {} filtered out; {} events; dropped {} (kernel ring {}, kernel map {}, kernel missed {}, evicted {}, channel {}, output {}, dns {}){tls}{export}",
        s.connections_closed,
        s.open_records,
        s.dns_lookups,
        s.filtered,
        s.events,
        d.total(),
        d.kernel_ring,
        d.kernel_map,
        d.kernel_missed,
        d.evicted,
        d.channel,
        d.output,
        d.dns
    )
}
