//! The table's thread: takes the records as they come, redraws every
//! interval and at each key, and on `q` puts the terminal back and stops the
//! observer the way Ctrl-C does (SIGINT to itself), so every probe is
//! detached on the normal path.

use std::{
    io,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crossterm::event::{self, Event};
use tokio::sync::mpsc::{error::TryRecvError, Receiver};

use super::{
    columns::Column,
    model::By,
    model::Model,
    render::{self, Status},
    terminal::Screen,
    ui::Ui,
};
use crate::output::Line;

/// How long a key or record may wait before the loop looks again.
const TICK: Duration = Duration::from_millis(50);

/// What `observer top` starts with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub by: By,
    pub sort: Column,
    pub reverse: bool,
    pub filter: String,
    pub interval: Duration,
    pub window: Duration,
}

/// Runs the table until `q` (or the observer stops: a signal, `--duration`).
pub fn run(mut rx: Receiver<Line>, s: Settings, ready: Arc<AtomicBool>) -> io::Result<()> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut screen = Screen::enter()?;
        let r = show(&mut rx, &s, &ready, &mut screen);
        screen.restore()?;
        r
    }))
    .unwrap_or_else(|_| Err(io::Error::other("the table's thread panicked")));
    // The observer may still be running (q, or an error here): stop it as
    // Ctrl-C does, and take the records it sends until it has shut down.
    if !rx.is_closed() {
        // SAFETY: kill(2) to this very process; the observer's signal
        // handler (installed before this thread started) takes it.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
    }
    while rx.blocking_recv().is_some() {}
    result
}

/// Ok(()) on `q` or when the records end.
fn show(
    rx: &mut Receiver<Line>,
    s: &Settings,
    ready: &AtomicBool,
    screen: &mut Screen,
) -> io::Result<()> {
    let started = Instant::now();
    let mut model = Model::new(s.window, started);
    let mut ui = Ui::new(s.by, s.sort, s.reverse, s.filter.clone());
    let mut next_draw = started;
    loop {
        let now = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(line) => model.add(&line, now),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        }
        if now >= next_draw && ui.by == By::Pool {
            let rows = model.pools.rows(model.window(), started, now);
            let status = Status {
                ready: ready.load(Ordering::Relaxed),
                window: model.window(),
                total: rows.len(),
            };
            let rows = super::pools::visible(rows, &ui.filter);
            screen
                .terminal
                .draw(|f| render::draw_pools(f, &ui, &rows, &status))?;
            next_draw = now + s.interval;
        } else if now >= next_draw {
            let rows = model.rows(ui.by, now);
            let status = Status {
                ready: ready.load(Ordering::Relaxed),
                window: model.window(),
                total: rows.len(),
            };
            let rows = render::visible(&ui, rows);
            screen
                .terminal
                .draw(|f| render::draw(f, &ui, &rows, &status))?;
            next_draw = now + s.interval;
        }
        let wait = next_draw
            .saturating_duration_since(Instant::now())
            .min(TICK);
        if event::poll(wait)? {
            match event::read()? {
                Event::Key(key) => {
                    if let Some(a) = ui.action(key) {
                        ui.apply(a);
                        // Show what the key did now, not at the next tick.
                        next_draw = Instant::now();
                    }
                }
                Event::Resize(..) => next_draw = Instant::now(),
                _ => {}
            }
        }
        if ui.quit {
            return Ok(());
        }
    }
}
