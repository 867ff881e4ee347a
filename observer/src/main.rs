//! `observer`: parse, init, run, map errors to exit codes (0 ok, 1 failure,
//! 2 usage).

use std::process::ExitCode;

use clap::Parser;
use observer::{
    cli::{Cli, Command},
    doctor,
    export::config,
    watch,
};

fn main() -> ExitCode {
    observer::heap::configure();
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Watch(args) => run_pipeline(args, None),
        Command::Run(args) => {
            let file = match &args.config {
                Some(path) => match config::read_file(path) {
                    Ok(f) => f,
                    Err(e) => return usage(&e),
                },
                None => config::FileConfig::default(),
            };
            let flags = config::Flags {
                prometheus_listen: args.prometheus_listen.clone(),
                sample_ratio: args.sample_ratio,
                slow_threshold: args.slow_threshold,
                service_name: args.service_name.clone(),
                max_series: args.max_series,
            };
            let settings = match config::resolve(&file, &|k| std::env::var(k).ok(), &flags) {
                Ok(s) => s,
                Err(e) => return usage(&e),
            };
            let setup = config::ExportSetup {
                settings,
                print: args.print,
            };
            let mut watch_args = args.watch;
            if watch_args.nvml_lib.is_none() {
                watch_args.nvml_lib = file.nvml_lib.clone();
            }
            run_pipeline(watch_args, Some(setup))
        }
        Command::Gpu(args) => gpu(&args),
        Command::Diagnose(args) => diagnose(args),
        Command::Top(args) => top(args),
        Command::Doctor(args) => {
            let report = doctor::run(observer::observer::Options {
                load: observer::ebpf::LoadOptions::default(),
                tls: observer::tls::Settings {
                    policy: args.tls_plaintext_probes,
                    max_rate: 2000,
                    max_processes: 512,
                    hold_execs: false,
                },
                dns_wire: args.dns_wire == observer::cli::OnOff::On,
                nvml_lib: args.nvml_lib.clone(),
                cgroup_root: args.cgroup_root.clone(),
            });
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(&e.into()),
                }
            } else {
                doctor::print(&report, args.verbose);
            }
            ExitCode::from(report.verdict.exit_code())
        }
    }
}

fn gpu(args: &observer::cli::GpuArgs) -> ExitCode {
    let mut gpus = match observer::gpu::Gpus::open(args.nvml_lib.as_deref()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("observer: {e}: GPU features are off");
            return ExitCode::FAILURE;
        }
    };
    let devices = gpus.sample();
    let text = if args.json {
        match serde_json::to_string_pretty(&devices) {
            Ok(s) => s + "\n",
            Err(e) => return fail(&e.into()),
        }
    } else {
        observer::gpu::nvml::text(&devices)
    };
    // A closed stdout (`| head`) is not an error of ours.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
    ExitCode::SUCCESS
}

/// `observer diagnose`: from a recorded stream, or live (its summary line
/// on stderr as `watch` prints it).
fn diagnose(args: observer::diagnose::DiagnoseArgs) -> ExitCode {
    if let Some(path) = args.from.clone() {
        return match observer::diagnose::run::from_file(&args, &path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        };
    }
    let json = args.watch.json;
    match observer::diagnose::run::live(args) {
        Ok(summary) => {
            eprintln!("{}", watch::summary_line(&summary, json));
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// `observer top`: the summary line prints once the terminal is back.
fn top(args: observer::top::TopArgs) -> ExitCode {
    if args.watch.json {
        return usage(&"top draws a table: --json is for `observer watch`");
    }
    match observer::top::run(args) {
        Ok(summary) => {
            eprintln!("{}", watch::summary_line(&summary, false));
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn run_pipeline(args: observer::cli::WatchArgs, export: Option<config::ExportSetup>) -> ExitCode {
    let json = args.json;
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("observer")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::Error::from(e).context("starting the runtime")),
    };
    match rt.block_on(watch::run(args, export)) {
        Ok(summary) => {
            eprintln!("{}", watch::summary_line(&summary, json));
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// A bad setting: exit 2, like a bad flag.
fn usage(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("observer: {e}");
    ExitCode::from(2)
}

fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("observer: {e:#}");
    ExitCode::FAILURE
}

/// `tracing` to stderr, filtered by RUST_LOG (default: warnings), with `log`
/// records (aya's) bridged in.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
