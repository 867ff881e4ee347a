//! The pipeline a running observer drives: ring buffer -> decode ->
//! correlate (`correlator.rs`: connection, DNS and process state) -> sinks
//! (terminal, OTLP exporter, metrics). The correlator's task reads the ring
//! itself; the sinks are joined to it by bounded queues that it never waits
//! on, and what a full queue refuses is counted. Also the printer's loop.

use std::{io::Write, sync::Arc, time::Duration};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};
use observer_common::{IDLE_POLL_MS, POLL_INTERVAL_MS};
use tokio::{
    io::unix::AsyncFd,
    sync::{mpsc, watch},
};

use crate::{
    clock::monotonic_ns,
    correlator::{Correlator, CorrelatorEnd},
    decode::{decode, Event},
    ebpf::KernelConnMap,
    output::{self, Format},
    stats::Stats,
};

/// Records waiting for the output thread.
pub(crate) const OUTPUT_CHANNEL: usize = 65_536;

/// The wait before the next drain: the short interval while records come, doubling
/// up to IDLE_POLL_MS while drains find none.
///
/// The ring is drained on a short timer, and at once when the kernel wakes
/// us (the ring is filling). The timer backs off while drains find
/// nothing: on a busy keep-alive server the ring is nearly idle (no record
/// per request), and a reader waking 100 times a second preempts the very
/// processes being observed (bench/NOTES.md: the nginx worker's involuntary
/// context switches under load, 402-547 per 4 s with the observer, 133-215
/// without). The kernel's wake-up at an eighth full still bounds a burst.
fn next_wait_ms(wait_ms: u64, found: usize) -> u64 {
    if found >= MAX_DRAIN {
        // A drain that stopped at its cap: the ring is still full.
        0
    } else if found > 0 {
        POLL_INTERVAL_MS
    } else {
        (wait_ms * 2).min(IDLE_POLL_MS)
    }
}

/// Records one drain takes at most: a ring refilled as fast as it is read
/// must not keep the correlator from its ticks (snapshots, health).
const MAX_DRAIN: usize = 65_536;

/// The ring's records as events, decoded where the kernel wrote them (no
/// batch of events is built and handed to another thread): each record's
/// room goes back to the kernel before its event is worked on. At most
/// MAX_DRAIN.
struct Drain<'a> {
    ring: &'a mut RingBuf<MapData>,
    stats: &'a Stats,
    found: usize,
}

impl<'a> Drain<'a> {
    fn new(ring: &'a mut RingBuf<MapData>, stats: &'a Stats) -> Self {
        stats.health.reader_beat();
        Drain {
            ring,
            stats,
            found: 0,
        }
    }

    /// Records read (decoded or not), now counted.
    fn finish(self) -> usize {
        Stats::add(&self.stats.events, self.found as u64);
        self.found
    }
}

impl Iterator for Drain<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        while self.found < MAX_DRAIN {
            let item = self.ring.next()?;
            self.found += 1;
            let ev = decode(&item);
            drop(item);
            match ev {
                Ok(ev) => return Some(ev),
                Err(e) => {
                    Stats::add(&self.stats.decode_errors, 1);
                    tracing::debug!("undecodable record: {e}");
                }
            }
        }
        None
    }
}

/// One drain of the ring into the correlator; how many records it held.
/// Closes waiting for their last bytes end only once the ring was read to
/// its end after their wait: those bytes may be in it, written without a
/// wake-up.
fn drain(ring: &mut RingBuf<MapData>, stats: &Stats, correlator: &mut Correlator) -> usize {
    let began = monotonic_ns();
    let mut d = Drain::new(ring, stats);
    correlator.on_events(&mut d);
    let found = d.finish();
    correlator.end_batch((found < MAX_DRAIN).then_some(began));
    found
}

/// Feeds the correlator from the ring (on the kernel's wake-up and a
/// backing-off timer) and its ticks, until `stop`; then finishes it.
pub(crate) async fn correlate(
    mut ring: AsyncFd<RingBuf<MapData>>,
    mut stop: watch::Receiver<bool>,
    mut correlator: Correlator,
    conns: KernelConnMap,
    stats: Arc<Stats>,
) -> anyhow::Result<CorrelatorEnd> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Closes waiting for an exchange's last bytes end on time even when no
    // event follows them.
    let mut closes_tick = tokio::time::interval(Duration::from_millis(50));
    closes_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut wait_ms = POLL_INTERVAL_MS;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {
                let found = drain(ring.get_mut(), &stats, &mut correlator);
                wait_ms = next_wait_ms(wait_ms, found);
            }
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                let found = drain(guard.get_inner_mut(), &stats, &mut correlator);
                guard.clear_ready();
                wait_ms = next_wait_ms(POLL_INTERVAL_MS, found.max(1));
            }
            // The kernel side is frozen first: this drain sees every event.
            _ = stop.changed() => {
                while drain(ring.get_mut(), &stats, &mut correlator) >= MAX_DRAIN {}
                break;
            }
            // The ring is read first: the bytes a close waits for may be
            // in it (written without a wake-up, the timer above reset by
            // this one).
            _ = closes_tick.tick(), if correlator.has_waiting_closes() => {
                let found = drain(ring.get_mut(), &stats, &mut correlator);
                wait_ms = next_wait_ms(wait_ms, found);
            }
            _ = tick.tick() => correlator.on_tick(&conns),
        }
    }
    Ok(correlator.finish(&conns))
}

pub(crate) fn write_output(
    mut rx: mpsc::Receiver<output::Line>,
    format: Format,
) -> std::io::Result<()> {
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

#[cfg(test)]
mod read_timer_tests {
    use super::*;

    #[test]
    fn backs_off_while_idle_and_returns_at_once_with_records() {
        let mut w = POLL_INTERVAL_MS;
        let mut seen = vec![];
        for _ in 0..6 {
            w = next_wait_ms(w, 0);
            seen.push(w);
        }
        assert_eq!(seen, [20, 40, 80, 100, 100, 100]);
        assert_eq!(next_wait_ms(IDLE_POLL_MS, 1), POLL_INTERVAL_MS);
        assert_eq!(
            next_wait_ms(POLL_INTERVAL_MS, MAX_DRAIN),
            0,
            "the ring is still full"
        );
    }
}
