//! What `/healthz` and `/readyz` on the Prometheus listener answer: the
//! observer is live while its ring reader and its correlator keep turning
//! (a stalled one means records are being lost or not made), and ready once
//! its programs are attached and both run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::clock::monotonic_ns;

/// A stage silent for this long is stalled: the ring is drained at least every 100 ms and
/// the correlator every second, so this is far past any busy moment.
pub const STALL_NS: u64 = 30_000_000_000;

#[derive(Debug, Default)]
pub struct Health {
    /// Monotonic ns of the ring reader's last drain (0: not yet).
    reader: AtomicU64,
    /// Monotonic ns of the correlator's last tick (0: not yet).
    correlator: AtomicU64,
    ready: AtomicBool,
}

impl Health {
    pub fn reader_beat(&self) {
        self.reader.store(monotonic_ns(), Ordering::Relaxed);
    }

    pub fn correlator_beat(&self) {
        self.correlator.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Programs attached and the `ready` line out.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Ok, or which stage has stalled (for the 503's body).
    pub fn live(&self) -> Result<(), NotHealthy> {
        self.live_at(monotonic_ns())
    }

    fn live_at(&self, now: u64) -> Result<(), NotHealthy> {
        for (name, beat) in [
            ("ring reader", &self.reader),
            ("correlator", &self.correlator),
        ] {
            let at = beat.load(Ordering::Relaxed);
            // Not started yet is not stalled: readiness covers start-up.
            if at != 0 && now.saturating_sub(at) > STALL_NS {
                return Err(NotHealthy::Stalled {
                    stage: name,
                    seconds: now.saturating_sub(at) as f64 / 1e9,
                });
            }
        }
        Ok(())
    }

    /// Ok once started and live; else why not.
    pub fn ready(&self) -> Result<(), NotHealthy> {
        self.ready_at(monotonic_ns())
    }

    fn ready_at(&self, now: u64) -> Result<(), NotHealthy> {
        if !self.ready.load(Ordering::Relaxed) {
            return Err(NotHealthy::NotAttached);
        }
        if self.reader.load(Ordering::Relaxed) == 0 || self.correlator.load(Ordering::Relaxed) == 0
        {
            return Err(NotHealthy::NotTurned);
        }
        self.live_at(now)
    }
}

/// Why `/healthz` or `/readyz` answers 503 (its body).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotHealthy {
    #[error("{stage} stalled: last turned {seconds:.1} s ago")]
    Stalled { stage: &'static str, seconds: f64 },
    #[error("starting: programs not attached yet")]
    NotAttached,
    #[error("starting: the pipeline has not turned yet")]
    NotTurned,
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

    use super::*;

    #[test]
    fn ready_after_start_and_both_beats_then_stalls() {
        let h = Health::default();
        assert!(h.live_at(5).is_ok(), "not started is not stalled");
        assert_eq!(h.ready_at(5), Err(NotHealthy::NotAttached));
        h.set_ready();
        assert_eq!(h.ready_at(5), Err(NotHealthy::NotTurned), "no beat yet");
        h.reader.store(10, Ordering::Relaxed);
        h.correlator.store(20, Ordering::Relaxed);
        assert!(h.ready_at(30).is_ok());
        let late = 10 + STALL_NS + 1;
        let e = h.live_at(late).unwrap_err();
        assert!(
            matches!(
                e,
                NotHealthy::Stalled {
                    stage: "ring reader",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().starts_with("ring reader stalled"), "{e}");
        assert!(h.ready_at(late).is_err());
        h.reader.store(late, Ordering::Relaxed);
        let e = h.live_at(late + 10).unwrap_err();
        assert!(e.to_string().starts_with("correlator stalled"), "{e}");
        assert_eq!(h.ready_at(late + 10), Err(e));
    }
}
