//! `observer top`'s flags: those of `watch` (which processes, ports,
//! probes), and the view's.

use std::time::Duration;

use clap::Args;

use super::{columns::Column, model::By};
use crate::watch::args::WatchArgs;

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
    /// One row per process, per endpoint (`e` switches), or per
    /// connection pool (`o`).
    #[arg(
        long,
        value_enum,
        value_name = "process|endpoint|pool",
        default_value = "process"
    )]
    pub by: By,
    /// The column rows are sorted by (`<` and `>` move it): figures largest
    /// first, names and pids in order.
    #[arg(long, value_enum, value_name = "COLUMN", default_value = "rate")]
    pub sort: Column,
    /// The other way round (`r`).
    #[arg(long)]
    pub reverse: bool,
    /// Only rows whose process name or pid (by endpoint: the endpoint)
    /// contains this text, case-insensitively (`/` to change it).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
    pub interval: Duration,
    /// Seconds of records the figures are computed over (rates, p50, p99).
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_window)]
    pub window: Duration,
}

fn seconds(s: &str, min: f64, max: f64) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || !(min..=max).contains(&v) {
        return Err(format!("`{s}` is out of range ({min} to {max} seconds)"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    seconds(s, 0.1, 60.0)
}

fn parse_window(s: &str) -> Result<Duration, String> {
    seconds(s, 1.0, 3600.0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<TopArgs, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("observer").chain(args.iter().copied()))?;
        match cli.command {
            Command::Top(t) => Ok(t),
            other => panic!("not top: {other:?}"),
        }
    }

    #[test]
    fn flags() {
        let t = parse(&["top"]).expect("parses");
        assert_eq!(
            (t.by, t.sort, t.reverse),
            (By::Process, Column::Rate, false)
        );
        assert_eq!(t.interval, Duration::from_secs(1));
        assert_eq!(t.window, Duration::from_secs(10));
        let t = parse(&[
            "top",
            "--by",
            "endpoint",
            "--sort",
            "ttfb-p99",
            "--reverse",
            "--filter",
            "curl",
            "--interval",
            "0.5",
            "--window",
            "60",
            "--comm",
            "curl",
            "--port",
            "443",
        ])
        .expect("parses");
        assert_eq!(
            (t.by, t.sort, t.reverse),
            (By::Endpoint, Column::TtfbP99, true)
        );
        assert_eq!(t.filter.as_deref(), Some("curl"));
        assert_eq!(t.interval, Duration::from_millis(500));
        assert_eq!(t.window, Duration::from_secs(60));
        assert_eq!(
            (t.watch.comm.len(), t.watch.port.as_slice()),
            (1, &[443][..])
        );
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            &["top", "--by", "host"][..],
            &["top", "--sort", "speed"],
            &["top", "--interval", "0"],
            &["top", "--interval", "soon"],
            &["top", "--window", "0.5"],
            &["top", "--window", "1e9"],
        ] {
            let err = parse(bad).expect_err("rejected");
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }
}
