//! Running a started observer, and its shutdown: the ring goes to the
//! correlator (`correlator.rs`, fed by `pipeline.rs`), finished records to
//! the printer or a front end's consumer and the exporters, GPU samples
//! are polled and the TLS manager places per-process probes, until a signal
//! or the duration; then, in order: the TLS manager gives the probes back,
//! every program is detached, the last events are drained, the exporters
//! flush, and the summary is counted.

use std::{
    sync::{mpsc::SyncSender, Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use observer_common::EVENTS_MAP;
use tokio::{
    io::unix::AsyncFd,
    sync::{mpsc, watch},
};

use super::{stop::Stop, summary, Observer};
use crate::{
    correlator::{Correlator, CorrelatorEnd, Settings, Sinks},
    dns::{DnsReport, ResolverFileReport},
    ebpf::{self, KernelConnMap, KernelCounters, Probes},
    export::{
        config::ExportSetup,
        running::{self, Exporting},
    },
    filter::Filter,
    gpu,
    k8s::Pods,
    output::{self, Format},
    pipeline,
    process::ProcessCache,
    stats::{Stats, Summary},
    tls::{self, TlsProbes, TlsReport},
};

/// Process events waiting for the TLS probe manager.
const TLS_COMMANDS: usize = 4096;

/// Takes every finished record instead of the printer (`diagnose`, `top`):
/// runs on a thread of its own until the channel closes at shutdown.
pub type Consumer =
    Box<dyn FnOnce(mpsc::Receiver<output::Line>) -> std::io::Result<()> + Send + 'static>;

/// How to run, as the front end (`watch`, `run`, `top`, `diagnose`) asks.
pub struct Run {
    /// Stop after this long (None: at a signal).
    pub duration: Option<Duration>,
    /// How the printer writes records (when there is no consumer).
    pub format: Format,
    /// The exporters (`run`); None prints only.
    pub export: Option<ExportSetup>,
    /// Where records go instead of the printer.
    pub consumer: Option<Consumer>,
    /// Pool records to the printer or consumer too.
    pub pools: bool,
    pub gpu_interval: Duration,
    pub filter: Filter,
    /// Snapshots of open connections this often (zero: none).
    pub update_interval: Duration,
    pub keep_query: bool,
    /// Kubernetes pods, named from the cgroups of the processes.
    pub pods: Pods,
}

/// The printer, or the consumer, on a thread of its own.
struct Output {
    tx: Option<mpsc::Sender<output::Line>>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

/// The GPU poller's samples, and its stop (dropping it stops the poller).
struct GpuPoller {
    history: Option<Arc<Mutex<gpu::History>>>,
    _stop: Option<std::sync::mpsc::Sender<()>>,
}

/// A running observer: its threads and tasks, and what shutting it down
/// needs.
struct Running {
    stats: Arc<Stats>,
    counters: Arc<KernelCounters>,
    correlating: tokio::task::JoinHandle<anyhow::Result<CorrelatorEnd>>,
    /// Tells the correlator the kernel side is frozen: its last drain.
    stop_correlator: watch::Sender<bool>,
    tls_tx: SyncSender<tls::Command>,
    manager: JoinHandle<(Probes, TlsReport)>,
    output: Option<JoinHandle<std::io::Result<()>>>,
    exporting: Option<Exporting>,
    poller: GpuPoller,
}

/// The observer's parts the summary reads after the shutdown.
struct Remains {
    dns: DnsReport,
    http_plain: Result<String, String>,
    resolver_files: Arc<Mutex<Vec<ResolverFileReport>>>,
    gpu_devices: Result<u32, String>,
    emit_at_destroy: bool,
    skb_task: u32,
    options: super::Options,
}

impl Observer {
    /// Runs until `stop` or the duration, then shuts down in order.
    pub async fn run(self, stop: Stop, how: Run) -> anyhow::Result<Summary> {
        let ready = self.ready_line();
        let duration = how.duration;
        let (running, remains) = self.start_running(how).await?;
        eprintln!("{ready}");
        running.stats.health.set_ready();
        stop.wait(duration).await;
        running.shut_down(remains).await
    }

    async fn start_running(self, mut how: Run) -> anyhow::Result<(Running, Remains)> {
        let Observer {
            mut probes,
            tls,
            dns,
            http_plain,
            resolver_files,
            gpus,
            emit_at_destroy,
            skb_task,
            options,
            ..
        } = self;
        let (ring, conns, counters) = take_maps(&mut probes)?;
        crate::heap::keep_releasing(crate::heap::RELEASE_EVERY)
            .context("starting the heap's release thread")?;
        let probes_attached: u64 = probes.states().iter().map(|(_, s)| s.attached).sum();
        let stats = Arc::new(Stats::default());
        let output = start_output(&mut how)?;
        let mut exporting = match how.export.take() {
            Some(e) => Some(running::start(e, probes_attached, Arc::clone(&stats)).await?),
            None => None,
        };
        let gpu_devices = gpus
            .as_ref()
            .map(gpu::Gpus::device_count)
            .map_err(ToString::to_string);
        let poller = start_gpu_poller(gpus, how.gpu_interval)?;
        let (tls_tx, manager) = start_tls_manager(tls, probes, Arc::clone(&stats.tables))?;
        let sinks = Sinks {
            out: output.tx,
            // Moved, not copied: the exporter ends when its queue's senders
            // are gone (the correlator's, at stop).
            export: exporting.as_mut().and_then(|e| e.queue.take()),
            metrics: exporting.as_ref().map(|e| Arc::clone(&e.metrics)),
            gpu: poller.history.clone(),
            pools: how.pools,
        };
        let settings = Settings {
            filter: how.filter,
            update_interval: how.update_interval,
            keep_query: how.keep_query,
            tls_commands: Some(tls_tx.clone()),
            counters: Some(Arc::clone(&counters)),
        };
        let processes = ProcessCache::new("/proc").with_pods(how.pods);
        let correlator = Correlator::new(processes, sinks, settings, Arc::clone(&stats));
        let (stop_correlator, stopped) = watch::channel(false);
        let correlating = tokio::spawn(pipeline::correlate(
            ring,
            stopped,
            correlator,
            conns,
            Arc::clone(&stats),
        ));
        let running = Running {
            stats,
            counters,
            correlating,
            stop_correlator,
            tls_tx,
            manager,
            output: output.thread,
            exporting,
            poller,
        };
        let remains = Remains {
            dns,
            http_plain,
            resolver_files,
            gpu_devices,
            emit_at_destroy,
            skb_task,
            options,
        };
        Ok((running, remains))
    }
}

impl Running {
    /// In order: the TLS manager gives the probes back, every program is
    /// detached, the correlator drains the last events, the exporters flush,
    /// the printer ends; then the summary.
    async fn shut_down(self, remains: Remains) -> anyhow::Result<Summary> {
        let _ = self.tls_tx.send(tls::Command::Stop);
        let (mut probes, tls_report) = self
            .manager
            .join()
            .map_err(|_| anyhow::anyhow!("the TLS probe thread panicked"))?;
        // Freeze the kernel side first, so the last drain sees every event and the
        // open-connection snapshot reads a map that no longer changes.
        let prog_stats = ebpf::prog_stats::read(&probes.ebpf);
        probes.close_uprobe_links();
        ebpf::detach_all(&mut probes.ebpf);
        let _ = self.stop_correlator.send(true);

        let end = self.correlating.await.context("correlator task")??;
        drop(self.poller);
        let export = match self.exporting {
            Some(e) => Some(e.finish().await),
            None => None,
        };
        join_output(self.output);
        let Remains { mut dns, .. } = remains;
        dns.resolver_files = remains
            .resolver_files
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        let features = super::View {
            probes: &probes,
            tls: &tls_report,
            dns: &dns,
            http_plain: &remains.http_plain,
            gpus: remains.gpu_devices.clone(),
            options: &remains.options,
            emit_at_destroy: remains.emit_at_destroy,
            skb_task: remains.skb_task,
        }
        .features();
        let parts = summary::Parts {
            stats: &self.stats,
            end,
            kernel: self.counters.read(),
            prog_stats,
            probes: &probes,
            export,
        };
        let summary = parts.summary(features, tls_report, dns);
        // Dropping the probes closes the maps; had anything failed above, the
        // drop would still detach every program (all links are fd-based).
        drop(probes);
        Ok(summary)
    }
}

/// The ring buffer (polled), the connection map and the kernel's counters,
/// out of the eBPF object.
fn take_maps(
    probes: &mut Probes,
) -> anyhow::Result<(
    AsyncFd<RingBuf<MapData>>,
    KernelConnMap,
    Arc<KernelCounters>,
)> {
    let bpf = &mut probes.ebpf;
    let ring = RingBuf::try_from(bpf.take_map(EVENTS_MAP).context("no EVENTS map")?)
        .context("EVENTS is not a ring buffer")?;
    // SAFETY: the RingBuf owns its map fd for its whole life and always returns
    // that same fd; the AsyncFd owns the RingBuf.
    let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
    let conns = KernelConnMap::take(bpf).context("no CONNS map")?;
    let counters = Arc::new(KernelCounters::take(bpf));
    Ok((ring, conns, counters))
}

/// The printer (or the front end's consumer) on its thread, unless only
/// the exporters take records (`run` without `--print`).
fn start_output(how: &mut Run) -> anyhow::Result<Output> {
    let print = how.consumer.is_some() || how.export.as_ref().is_none_or(|e| e.print);
    if !print {
        return Ok(Output {
            tx: None,
            thread: None,
        });
    }
    // tokio's bounded channel allocates as it fills (std's sync_channel would
    // reserve all OUTPUT_CHANNEL records, about 20 MiB, up front).
    let (tx, rx) = mpsc::channel::<output::Line>(pipeline::OUTPUT_CHANNEL);
    let format = how.format;
    let consume: Consumer = how
        .consumer
        .take()
        .unwrap_or_else(|| Box::new(move |rx| pipeline::write_output(rx, format)));
    let thread = std::thread::Builder::new()
        .name("output".into())
        .spawn(move || consume(rx))
        .context("starting the output thread")?;
    Ok(Output {
        tx: Some(tx),
        thread: Some(thread),
    })
}

/// GPUs: sampled on a thread of their own.
fn start_gpu_poller(
    gpus: Result<gpu::Gpus, gpu::nvml::NvmlUnavailable>,
    every: Duration,
) -> anyhow::Result<GpuPoller> {
    let Ok(g) = gpus else {
        return Ok(GpuPoller {
            history: None,
            _stop: None,
        });
    };
    let history = Arc::new(Mutex::new(gpu::History::default()));
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    gpu::history::spawn_poller(g, every, Arc::clone(&history), stop_rx)
        .context("starting the GPU poller")?;
    Ok(GpuPoller {
        history: Some(history),
        _stop: Some(stop_tx),
    })
}

/// The TLS manager owns the eBPF object while it runs (it attaches and
/// detaches uprobes) and gives it back when stopped.
#[allow(clippy::type_complexity)]
fn start_tls_manager(
    mut tls: TlsProbes,
    mut probes: Probes,
    tables: Arc<crate::tables::Tables>,
) -> anyhow::Result<(SyncSender<tls::Command>, JoinHandle<(Probes, TlsReport)>)> {
    let (tls_tx, tls_rx) = std::sync::mpsc::sync_channel(TLS_COMMANDS);
    tls.show_sizes_in(tables);
    tls.start_holds(&mut probes, tls_tx.clone());
    let manager = std::thread::Builder::new()
        .name("tls-probes".into())
        .spawn(move || tls.run(probes, tls_rx))
        .context("starting the TLS probe thread")?;
    Ok((tls_tx, manager))
}

fn join_output(thread: Option<JoinHandle<std::io::Result<()>>>) {
    let Some(thread) = thread else { return };
    if let Err(e) = thread.join().unwrap_or(Ok(())) {
        // A closed stdout (e.g. `| head`) is not an error of ours.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            tracing::warn!("writing output: {e}");
        }
    }
}
