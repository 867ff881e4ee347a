//! Command line. Flags named here are a contract (docs/: each command's page): add,
//! never rename.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::watch::args::parse_seconds_or_zero;
pub use crate::watch::args::{DirectionArg, OnOff, WatchArgs};

#[derive(Debug, Parser)]
#[command(
    name = "observer",
    version,
    about = "Where every TCP connection on this host spends its time, seen from the kernel",
    after_help = "Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print one line per finished connection (and snapshots of long-lived ones).
    Watch(WatchArgs),
    /// Check the kernel, privileges and every probe; say what is lost without each.
    Doctor(DoctorArgs),
    /// The daemon: probes and correlation as `watch`, records exported as
    /// OpenTelemetry traces and metrics (OTLP, configured by the standard
    /// OTEL_EXPORTER_OTLP_* variables) and a Prometheus endpoint.
    Run(RunArgs),
    /// A snapshot of the GPUs (NVML): devices and the processes using them.
    Gpu(GpuArgs),
    /// Names the phase that made each call slow (DNS, connect, TLS, server,
    /// stream, GPU, network, client), with its evidence: live, or from a
    /// recorded `watch --json` stream.
    Diagnose(crate::diagnose::DiagnoseArgs),
    /// The host's traffic live in a terminal, as `top` shows CPU: one row
    /// per process or endpoint with request rates, p50/p99 of each phase,
    /// errors, retransmits and GPU use; sort keys and a filter.
    Top(crate::top::TopArgs),
}

#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// One JSON array of devices instead of text.
    #[arg(long)]
    pub json: bool,
    /// The NVML library to load (default libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
    /// Config file, TOML or YAML (by extension: .yaml/.yml, else TOML).
    /// Precedence: defaults < file < environment < flags.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Prometheus endpoint address, or `none` (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub prometheus_listen: Option<String>,
    /// Share of ordinary connections exported as traces (0 to 1; default 1,
    /// or from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG). Failed and slow
    /// connections are always exported; metrics see all.
    #[arg(long, value_name = "RATIO")]
    pub sample_ratio: Option<f64>,
    /// Connections at least this long are always exported (seconds; default 1).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds_or_zero)]
    pub slow_threshold: Option<Duration>,
    /// `service.name` of every process's resource (default: the executable's name).
    #[arg(long, value_name = "NAME")]
    pub service_name: Option<String>,
    /// Series per metric before values go to an overflow series (default 2000).
    #[arg(long, value_name = "N")]
    pub max_series: Option<usize>,
    /// Also print records on stdout, as `watch` does.
    #[arg(long)]
    pub print: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Machine-readable report.
    #[arg(long)]
    pub json: bool,
    /// Also print the kernel verifier's log of each program it refused.
    #[arg(long, short)]
    pub verbose: bool,
    /// The NVML library to try (default libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<String>,
    /// As `watch --dns-wire`: the verdict is the one watch would reach.
    #[arg(long, value_enum, value_name = "ON|OFF", default_value = "on")]
    pub dns_wire: OnOff,
    /// As `watch --tls-plaintext-probes`.
    #[arg(long, value_enum, value_name = "POLICY", default_value = "auto")]
    pub tls_plaintext_probes: crate::tls::Policy,
    /// As `watch --cgroup-root`.
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("observer").chain(args.iter().copied()))
    }

    #[test]
    fn watch_flags() {
        let cli = parse(&[
            "watch",
            "--json",
            "--pid",
            "1,2",
            "--port",
            "80",
            "--port",
            "443",
            "--direction",
            "inbound",
            "--duration",
            "1.5",
        ])
        .expect("parses");
        let Command::Watch(w) = cli.command else {
            panic!("not watch")
        };
        assert!(w.json);
        assert_eq!(w.pid, vec![1, 2]);
        assert_eq!(w.port, vec![80, 443]);
        assert_eq!(w.direction, Some(DirectionArg::Inbound));
        assert_eq!(w.duration, Some(Duration::from_millis(1500)));
        assert_eq!(w.update_interval, Duration::from_secs(10));
        assert_eq!(w.tls_plaintext_probes, crate::tls::Policy::Auto);
        assert_eq!(w.dns_wire, OnOff::On);
        let cli = parse(&["watch", "--tls-plaintext-probes", "off"]).expect("parses");
        let Command::Watch(w) = cli.command else {
            panic!("not watch")
        };
        assert_eq!(w.tls_plaintext_probes, crate::tls::Policy::Off);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            &["watch", "--port", "0"][..],
            &["watch", "--port", "65536"],
            &["watch", "--port", "http"],
            &["watch", "--duration", "-1"],
            &["watch", "--duration", "0"],
            &["watch", "--direction", "sideways"],
            &["watch", "--ring-bytes", "5000"],
            &["watch", "--tls-plaintext-probes", "some"],
            &["watch", "--tls-plaintext-max-rate", "0"],
            &["watch", "--bogus"],
            &["frobnicate"],
        ] {
            let err = parse(bad).expect_err("rejected");
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }
}
