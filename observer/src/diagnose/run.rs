//! The command: records from the live pipeline (through `watch::run_with`'s
//! tap) or from a recorded `watch --json` stream, then the slowest calls with
//! their verdicts.

use std::{
    collections::BTreeMap,
    io::{BufRead, Write},
};

use anyhow::Context as _;
use serde_json::Value;

use super::{
    collect::Collector,
    only::Only,
    pools::Leak,
    text::{block, Verdict, HEADER},
    DiagnoseArgs,
};
use crate::cause::{diagnose, Call, Cause, Diagnosis, Thresholds};
use crate::watch;

/// What the end line says besides the verdicts.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Lines of `--from FILE` that were not records.
    skipped_lines: u64,
}

fn only(args: &DiagnoseArgs) -> Only {
    Only {
        pids: args.watch.pid.clone(),
        comms: args.watch.comm.clone(),
        host: args.host.clone(),
    }
}

/// `--from FILE`: reads the stream, then reports.
pub fn from_file(args: &DiagnoseArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?,
        ))
    };
    let mut collector = Collector::default();
    let mut tally = Tally::default();
    for line in reader.split(b'\n') {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let ok = serde_json::from_slice::<Value>(&line)
            .ok()
            .is_some_and(|v| collector.add(&v));
        if !ok {
            tally.skipped_lines += 1;
        }
    }
    report(collector, args, &tally, &mut std::io::stdout().lock())
}

/// Live: the observer's pipeline, its records taken here until it stops
/// (signal or `--duration`).
pub fn live(args: DiagnoseArgs) -> anyhow::Result<crate::stats::Summary> {
    let mut watch_args = args.watch.clone();
    // Pool records, for "pool leak".
    watch_args.pools = true;
    let consumer: watch::Consumer = Box::new(move |mut rx| {
        let mut collector = Collector::default();
        while let Some(line) = rx.blocking_recv() {
            collector.add_line(&line);
        }
        report(
            collector,
            &args,
            &Tally::default(),
            &mut std::io::stdout().lock(),
        )
        .map_err(std::io::Error::other)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("observer")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(watch::run_with(watch_args, None, Some(consumer)))
}

pub(super) fn report(
    collector: Collector,
    args: &DiagnoseArgs,
    tally: &Tally,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let t: &Thresholds = &args.thresholds;
    let not_kept = collector.not_kept + collector.pools.not_kept;
    let leaks = collector.pools.leaks(&only(args));
    let calls = collector.calls(&only(args));
    let mut judged: Vec<_> = calls.iter().map(|c| (c, diagnose(c, t))).collect();
    let mut by_cause: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (_, d) in &judged {
        *by_cause.entry(d.cause.as_str()).or_default() += 1;
    }
    judged.sort_by_key(|(c, _)| std::cmp::Reverse(c.total_ns()));
    let shown = if args.top == 0 {
        judged.len()
    } else {
        args.top.min(judged.len())
    };
    if args.watch.json {
        write_json_records(out, &judged[..shown], &leaks, t)?;
        let end = serde_json::json!({
            "pool_leaks": leaks.len(),
            "calls": judged.len(),
            "shown": shown,
            "by_cause": by_cause,
            "skipped_lines": tally.skipped_lines,
            "not_kept": not_kept,
            "thresholds": t,
        });
        eprintln!("diagnosed {end}");
    } else {
        write_text_table(out, &judged[..shown], judged.len(), t)?;
        write_text_summary(out, &by_cause, &leaks, tally, not_kept)?;
    }
    Ok(())
}

/// `--json`: one line per verdict shown, then one per pool leak.
fn write_json_records(
    out: &mut impl Write,
    shown: &[(&Call, Diagnosis)],
    leaks: &[Leak],
    t: &Thresholds,
) -> anyhow::Result<()> {
    for (c, d) in shown {
        serde_json::to_writer(&mut *out, &Verdict::new(c, d, t))?;
        out.write_all(b"\n")?;
    }
    for l in leaks {
        serde_json::to_writer(&mut *out, l)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// The text report's title, header and one block per verdict shown.
fn write_text_table(
    out: &mut impl Write,
    shown: &[(&Call, Diagnosis)],
    calls: usize,
    t: &Thresholds,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "observer diagnose: the {} slowest of {calls} calls; {}",
        shown.len(),
        t.summary()
    )?;
    writeln!(out, "{HEADER}")?;
    for (c, d) in shown {
        writeln!(out, "{}", block(c, d))?;
    }
    Ok(())
}

/// The text report's tail: the count by cause, the pool leaks, and what
/// was skipped or not kept.
fn write_text_summary(
    out: &mut impl Write,
    by_cause: &BTreeMap<&'static str, u64>,
    leaks: &[Leak],
    tally: &Tally,
    not_kept: u64,
) -> anyhow::Result<()> {
    let causes: Vec<String> = Cause::ALL
        .iter()
        .filter_map(|c| {
            by_cause
                .get(c.as_str())
                .map(|n| format!("{} {n}", c.as_str()))
        })
        .collect();
    writeln!(
        out,
        "by cause: {}",
        if causes.is_empty() {
            "-".into()
        } else {
            causes.join(", ")
        }
    )?;
    for l in leaks {
        writeln!(out, "{}", l.text())?;
    }
    if tally.skipped_lines > 0 {
        writeln!(
            out,
            "skipped {} lines that were not records",
            tally.skipped_lines
        )?;
    }
    if not_kept > 0 {
        writeln!(
            out,
            "{not_kept} calls past {} not kept",
            super::collect::MAX_RECORDS
        )?;
    }
    out.flush()?;
    Ok(())
}
