//! `observer watch` and `observer run`: the front end that turns their
//! flags (`args.rs`) into the observer's start-up options and how to run,
//! then starts the observer and runs it (`observer/`: start, run, shut
//! down). `top` and `diagnose` run it the same way with a consumer of their
//! own.

use std::time::Duration;

pub mod args;

use args::{DirectionArg, WatchArgs};

pub use crate::observer::run::Consumer;
use crate::{
    ebpf::LoadOptions,
    export::config::ExportSetup,
    filter::Filter,
    k8s::Pods,
    observer::{
        run::Run,
        stop::{raise_fd_limit, Stop},
        Observer, Options,
    },
    output::Format,
    record::Direction,
    stats::Summary,
    tls,
};

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
            "no socket field offsets ({e}): connections are read from the classic tracepoint \
             record (lost while another tracing program runs on the same CPU), and \
             \"timeout\"/\"unreachable\" errors and RTTs are lost"
        );
    }
    obs.run(stop, how_to_run(&args, export, consumer)).await
}

/// What `watch`'s flags ask of the running observer.
fn how_to_run(args: &WatchArgs, export: Option<ExportSetup>, consumer: Option<Consumer>) -> Run {
    Run {
        duration: args.duration,
        format: if args.json {
            Format::Json
        } else {
            Format::Text
        },
        export,
        consumer,
        pools: args.pools,
        gpu_interval: Duration::from_millis(args.gpu_interval),
        filter: filter_of(args),
        update_interval: args.update_interval,
        keep_query: args.http_query,
        pods: Pods::new(
            &args.pod_log_dir,
            Pods::node_name_from_env(),
            args.cgroup_root.clone().or_else(crate::cgroup::root),
        ),
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
            "; OTLP: {} spans sent, {} records sampled out, {} dropped after retries ({} spans), {} not queued, {} export errors{refused}",
            e.spans_sent, e.records_sampled_out, e.records_dropped, e.spans_dropped, e.queue_full, e.export_errors
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
