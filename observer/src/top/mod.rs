//! `observer top`: the host's traffic live in a terminal, one row per
//! process or per endpoint, refreshed every second.
//!
//! The observer runs as `watch` does (`watch::run_with`), its records going
//! to the table's thread instead of stdout. `model` aggregates them over a
//! sliding window, `render` draws (tested on ratatui's TestBackend), `ui`
//! maps keys to changes of the view, `terminal` and `stderr` keep the screen
//! clean and put it back.

pub mod app;
mod args;
pub mod columns;
pub mod model;
pub mod pools;
pub mod render;
mod stderr;
mod terminal;
pub mod ui;

use std::io::{IsTerminal as _, Write as _};

use anyhow::Context as _;

pub use args::TopArgs;
pub use columns::Column;
pub use model::By;

use crate::{stats::Summary, watch};

/// Runs `observer top` until `q`, Ctrl-C, SIGTERM or `--duration`; returns
/// the observer's summary once the terminal is back as it was.
pub fn run(args: TopArgs) -> anyhow::Result<Summary> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "observer top draws on a terminal and reads its keys: stdin or stdout is not one (`observer watch` prints records)"
        );
    }
    let settings = app::Settings {
        by: args.by,
        sort: args.sort,
        reverse: args.reverse,
        filter: args.filter.clone().unwrap_or_default(),
        interval: args.interval,
        window: args.window,
    };
    // Loading the probes takes a few seconds: say so before the table.
    let _ = writeln!(
        std::io::stdout(),
        "observer top: starting (loading the probes)..."
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("observer")
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let capture = stderr::Capture::start().context("holding stderr while the table is up")?;
    let ready = capture.ready();
    let consumer: watch::Consumer = Box::new(move |rx| app::run(rx, settings, ready));
    let mut watch_args = args.watch;
    // Pool records, for the pool view.
    watch_args.pools = true;
    let result = runtime.block_on(watch::run_with(watch_args, None, Some(consumer)));
    drop(runtime);
    // The terminal is back (the table's thread ended before run_with
    // returned): what the observer said meanwhile can be shown now.
    for line in capture.finish() {
        eprintln!("{line}");
    }
    result
}
