//! `observer watch` and `observer run`: start the observer (see
//! `observer.rs`), run the pipeline (see `pipeline.rs`) until a signal or
//! `--duration`, then shut down in order: the TLS manager gives the probes
//! back, every program is detached, the last events are drained, the
//! exporters flush.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::RingBuf;
use observer_common::{Counter, EVENTS_MAP};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    sync::{mpsc, watch},
};

pub mod args;

use args::{DirectionArg, WatchArgs};

use crate::{
    ebpf::{self, KernelConnMap, LoadOptions},
    export::config::ExportSetup,
    filter::Filter,
    gpu,
    observer::{Observer, Options, View},
    output::{self, Format},
    pipeline::{self, Sinks},
    record::Direction,
    stats::{Dropped, ExportSummary, Stats, Summary},
    tls,
};

/// Process events waiting for the TLS probe manager.
const TLS_COMMANDS: usize = 4096;

/// The records `--pid`, `--comm`, `--port` and `--direction` keep.
fn filter_of(args: &WatchArgs) -> Filter {
    Filter {
        pids: args.pid.clone(),
        comms: args.comm.clone(),
        ports: args.port.clone(),
        direction: args.direction.map(|d| match d {
            DirectionArg::Inbound => Direction::Inbound,
            DirectionArg::Outbound => Direction::Outbound,
        }),
    }
}

/// The start-up options `watch`, `run` and `doctor` share.
pub fn options(args: &WatchArgs) -> Options {
    Options {
        load: LoadOptions {
            max_connections: args.max_connections,
            ring_bytes: args.ring_bytes,
            // Only per-process probes can come off a busy process.
            tls_busy_rate: match args.tls_plaintext_probes {
                tls::Policy::Auto => args.tls_plaintext_max_rate,
                tls::Policy::Off | tls::Policy::All => 0,
            },
        },
        tls: tls::Settings {
            policy: args.tls_plaintext_probes,
            max_rate: args.tls_plaintext_max_rate,
            max_processes: args.tls_plaintext_max_processes as usize,
            hold_execs: args.exec_hold == crate::cli::OnOff::On,
        },
        dns_wire: args.dns_wire == crate::cli::OnOff::On,
        nvml_lib: args.nvml_lib.clone(),
        cgroup_root: args.cgroup_root.clone(),
    }
}

pub async fn run(args: WatchArgs, export: Option<ExportSetup>) -> anyhow::Result<Summary> {
    run_with(args, export, None).await
}

/// Takes every finished record instead of the printer (`diagnose`, `top`):
/// runs on a thread of its own until the channel closes at shutdown.
pub type Consumer =
    Box<dyn FnOnce(mpsc::Receiver<output::Line>) -> std::io::Result<()> + Send + 'static>;

/// `run`, with the records going to `consumer` rather than stdout when given.
pub async fn run_with(
    args: WatchArgs,
    export: Option<ExportSetup>,
    consumer: Option<Consumer>,
) -> anyhow::Result<Summary> {
    // Before anything else: a SIGTERM that comes during start-up, or right
    // after `ready`, stops the observer cleanly instead of killing it.
    let stop = Stop::install()?;
    raise_fd_limit();
    if let Some(w) = crate::others::warning(&crate::others::find()) {
        tracing::warn!("{w}");
    }
    let obs = Observer::start(options(&args))?;
    obs.verdict()?;
    if let Err(e) = &obs.offsets {
        tracing::warn!(
            "no socket field offsets ({e}): \"timeout\"/\"unreachable\" errors and RTTs are lost"
        );
    }
    let ready = obs.ready_line();
    let Observer {
        mut probes,
        mut tls,
        dns,
        http_plain,
        resolver_files,
        gpus,
        tracefs,
        emit_at_destroy,
        options,
        ..
    } = obs;
    let bpf = &mut probes.ebpf;
    let ring = RingBuf::try_from(bpf.take_map(EVENTS_MAP).context("no EVENTS map")?)
        .context("EVENTS is not a ring buffer")?;
    // SAFETY: the RingBuf owns its map fd for its whole life and always returns
    // that same fd; the AsyncFd owns the RingBuf.
    let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
    let conns = KernelConnMap::take(bpf).context("no CONNS map")?;
    let counters = Arc::new(ebpf::KernelCounters::take(bpf));
    let probes_attached: u64 = probes.states().iter().map(|(_, s)| s.attached).sum();

    let stats = Arc::new(Stats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    // tokio's bounded channel allocates as it fills (std's sync_channel would
    // reserve all OUTPUT_CHANNEL records, about 20 MiB, up front).
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let print = consumer.is_some() || export.as_ref().is_none_or(|e| e.print);
    let (out_tx, output) = if print {
        let (tx, rx) = mpsc::channel::<output::Line>(pipeline::OUTPUT_CHANNEL);
        let consume: Consumer =
            consumer.unwrap_or_else(|| Box::new(move |rx| pipeline::write_output(rx, format)));
        let thread = std::thread::Builder::new()
            .name("output".into())
            .spawn(move || consume(rx))
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
        pools: args.pools,
    };
    let mut exporter = None;
    let mut export_stats = None;
    let mut prometheus = None;
    if let Some(e) = export {
        let (setup, task, stats, prom) =
            pipeline::start_export(e, probes_attached, Arc::clone(&stats)).await?;
        sinks.export = setup.0;
        sinks.metrics = Some(setup.1);
        exporter = task;
        export_stats = Some(stats);
        prometheus = prom;
    }
    // GPUs: sampled on a thread of their own.
    let gpu_devices = gpus
        .as_ref()
        .map(gpu::Gpus::device_count)
        .map_err(Clone::clone);
    let (gpu_history, gpu_stop) = match gpus {
        Ok(g) => {
            let history = Arc::new(Mutex::new(gpu::History::default()));
            let (stop_tx, stop_rx) = std::sync::mpsc::channel();
            gpu::history::spawn_poller(
                g,
                Duration::from_millis(args.gpu_interval),
                Arc::clone(&history),
                stop_rx,
            )
            .context("starting the GPU poller")?;
            (Some(history), Some(stop_tx))
        }
        Err(_) => (None, None),
    };
    sinks.gpu = gpu_history.clone();
    // The TLS manager owns the eBPF object while it runs (it attaches and
    // detaches uprobes) and gives it back when stopped.
    let (tls_tx, tls_rx) = std::sync::mpsc::sync_channel(TLS_COMMANDS);
    tls.start_holds(&mut probes, tls_tx.clone());
    let manager = std::thread::Builder::new()
        .name("tls-probes".into())
        .spawn(move || tls.run(probes, tls_rx))
        .context("starting the TLS probe thread")?;
    let correlator = tokio::spawn(pipeline::correlate(
        ring,
        stop_rx,
        sinks,
        conns,
        tls_tx.clone(),
        filter_of(&args),
        args.update_interval,
        args.http_query,
        Arc::clone(&stats),
        Arc::clone(&counters),
        crate::k8s::Pods::new(
            &args.pod_log_dir,
            crate::k8s::Pods::node_name_from_env(),
            args.cgroup_root.clone().or_else(crate::cgroup::root),
        ),
    ));

    eprintln!("{ready}");
    stats.health.set_ready();
    stop.wait(args.duration).await;
    let _ = tls_tx.send(tls::Command::Stop);
    let (mut probes, tls_report) = manager
        .join()
        .map_err(|_| anyhow::anyhow!("the TLS probe thread panicked"))?;
    // Freeze the kernel side first, so the last drain sees every event and the
    // open-connection snapshot reads a map that no longer changes.
    let prog_stats = ebpf::prog_stats::read(&probes.ebpf);
    probes.close_uprobe_links();
    ebpf::detach_all(&mut probes.ebpf);
    let _ = stop_tx.send(true);

    let end = correlator.await.context("correlator task")??;
    drop(gpu_stop);
    // The correlator dropped the exporter's queue: it flushes and ends.
    if let Some(task) = exporter {
        if tokio::time::timeout(pipeline::EXPORT_FLUSH, task)
            .await
            .is_err()
        {
            tracing::warn!(
                "OTLP: the last export did not finish within {:?}",
                pipeline::EXPORT_FLUSH
            );
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
    let mut dns = dns;
    dns.resolver_files = resolver_files.lock().map(|f| f.clone()).unwrap_or_default();
    let features = View {
        probes: &probes,
        tls: &tls_report,
        dns: &dns,
        http_plain: &http_plain,
        gpus: gpu_devices.as_ref().map(|n| *n),
        options: &options,
        emit_at_destroy,
        tracefs: &tracefs,
    }
    .features();
    let programs = probes
        .states()
        .into_iter()
        .map(|(p, s)| crate::stats::ProgramSummary {
            program: p.name,
            feature: p.feature,
            attached: s.attached,
            failures: s.failures,
        })
        .collect();
    // Dropping the probes closes the maps; had anything failed above, the
    // drop would still detach every program (all links are fd-based).
    drop(probes);
    Ok(Summary {
        events: Stats::get(&stats.events),
        connections_closed: Stats::get(&stats.closed),
        dns_lookups: Stats::get(&stats.dns),
        requests: Stats::get(&stats.requests),
        http: crate::stats::HttpSummary {
            answers_without_request: Stats::get(&stats.http_orphans),
            closes_waited: Stats::get(&stats.closes_waited),
            closes_waited_completed: Stats::get(&stats.closes_waited_completed),
            busy_connections: k(Counter::HttpBusy),
            insert_failed: k(Counter::HttpInsertFailed),
            h2_undecodable_headers: Stats::get(&stats.h2_undecodable),
            h2_out_of_step: Stats::get(&stats.h2_out_of_step),
        },
        open_records: Stats::get(&stats.open),
        filtered: Stats::get(&stats.filtered),
        outbound_opened: k(Counter::OutboundOpened),
        inbound_opened: k(Counter::InboundOpened),
        adopted_midstream: k(Counter::Adopted),
        dropped: Dropped {
            kernel_ring: k(Counter::RingFull),
            kernel_missed: prog_stats.iter().map(|p| p.recursion_misses).sum(),
            kernel_map: k(Counter::ConnInsertFailed),
            evicted: end.evicted,
            channel: Stats::get(&stats.channel_full),
            output: Stats::get(&stats.output_full),
            dns: end.dns_overflow,
            pools: Stats::get(&stats.pools_untracked),
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
        tls_wire: k(Counter::TlsWire),
        tls_rustls_tied: k(Counter::RustlsTied),
        tls_rustls_reads_unjoined: k(Counter::RustlsReadUnjoined),
        tls_tied_by_fd: k(Counter::TlsFdTied),
        tls_tied_by_packet: k(Counter::TlsPacketTied),
        tls_insert_failed: k(Counter::TlsInsertFailed),
        tls_commands_dropped: Stats::get(&stats.tls_commands_full),
        tls_first_byte_unmeasured: end.tls_unmeasured,
        tls: Some(tls_report),
        dns: Some(dns),
        features,
        program_attachments: programs,
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

/// SIGTERM, SIGINT and SIGHUP, caught from the moment they are installed.
/// SIGHUP too: a terminal closed under `watch` or `top` (or the tmux
/// session it ran in killed) must stop the observer as `q` does, with the
/// processes held at exec resumed, not kill it with them left stopped.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Stop {
    fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    async fn wait(mut self, duration: Option<Duration>) {
        let timer = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
            _ = timer => {}
        }
    }
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
            "; TLS: {} sessions tied to connections ({} by the descriptor given to the library, {} by a packet sent in a call), per-call probes on {} processes ({} fell back to socket timing, {} over the cap), {} attach errors, {} lost (maps full)",
            s.tls_bound,
            s.tls_tied_by_fd,
            s.tls_tied_by_packet,
            t.plaintext_attached_total,
            t.plaintext_fell_back,
            t.plaintext_over_cap,
            t.attach_errors,
            s.tls_insert_failed
        )
    });
    let export = s.export.as_ref().map_or(String::new(), |e| {
        let refused = match (e.traces_refused, e.metrics_refused) {
            (false, false) => "",
            (true, false) => " (the endpoint refused traces)",
            (false, true) => " (the endpoint refused metrics)",
            (true, true) => " (the endpoint refused traces and metrics)",
        };
        format!(
            "; OTLP: {} spans sent, {} records sampled out, {} dropped after retries, {} not queued, {} export errors{refused}",
            e.spans_sent, e.records_sampled_out, e.records_dropped, e.queue_full, e.export_errors
        )
    });
    let failed: u64 = s.program_attachments.iter().map(|p| p.failures).sum();
    format!(
        "summary: {} connections closed, {} open-connection snapshots, {} dns lookups, {} requests, {} filtered out; {} events; dropped {} (kernel ring {}, kernel map {}, kernel missed {}, evicted {}, channel {}, output {}, dns {}){tls}{export}; features: {}; {failed} program attachments failed",
        s.connections_closed,
        s.open_records,
        s.dns_lookups,
        s.requests,
        s.filtered,
        s.events,
        d.total(),
        d.kernel_ring,
        d.kernel_map,
        d.kernel_missed,
        d.evicted,
        d.channel,
        d.output,
        d.dns,
        s.features.words()
    )
}
