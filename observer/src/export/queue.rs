//! The correlator's end of the OTLP exporter's queue.
//!
//! Records are sampled here, before anything is done for their export: a
//! record the sampler leaves out costs no span work and no queue slot. A
//! kept record's spans are written at once, on the correlator's thread,
//! into the batch gathered since the last hand-over, and the record is
//! freed where it was made; the exporter gets encoded bytes, one piece
//! per correlator batch (one wake-up per batch, not per record), and only
//! sends them. The queue's bound is counted in records, as before, by a
//! count both ends share.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex,
};

use tokio::sync::mpsc;

use crate::stats::ExportStats;

use super::{
    attrs::Ids,
    sampling::{Sampled, Sampling},
    span_wire::TraceBatch,
    spans::{write_record, Traced},
};

/// Records queued for the exporter at most (handed over and not yet taken,
/// with those gathered for the next hand-over).
pub const EXPORT_QUEUE: usize = 8192;
/// Gathered records are handed over at this many even within a batch, so
/// one piece carries a bounded number of records.
const HAND_OVER_AT: usize = 256;

/// Why a record was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum NotQueued {
    /// The sampler left it out (counted in `records_sampled_out`).
    SampledOut,
    /// The queue is at its bound: a loss, the caller counts it.
    Full,
    /// No trace endpoint: records are not exported at all.
    NoTraces,
}

/// The spans of some records, encoded: an `ExportTraceServiceRequest`'s
/// bytes. Two such messages end to end are one message holding both's
/// resource spans (a repeated field), so pieces are sent joined.
#[derive(Debug, Default)]
pub struct Encoded {
    pub body: Vec<u8>,
    pub spans: usize,
    pub records: usize,
}

impl Encoded {
    /// Appends `other`'s spans.
    pub fn join(&mut self, other: Encoded) {
        if self.body.is_empty() {
            self.body = other.body;
        } else {
            self.body.extend_from_slice(&other.body);
        }
        self.spans += other.spans;
        self.records += other.records;
    }
}

struct Gathered {
    /// Spans of the records gathered since the last hand-over.
    batch: TraceBatch,
    records: usize,
    /// Trace and span ids, and draws for records that share none.
    ids: Ids,
}

/// Whose spans these are: the resource every span's process is under.
#[derive(Clone, Debug, Default)]
pub struct Origin {
    pub host: String,
    /// `service.name` for every process (None: each its executable's name).
    pub service_name: Option<String>,
}

/// The sending end: sample, write the spans, hand over.
pub struct TraceQueue {
    tx: mpsc::UnboundedSender<Encoded>,
    /// Records in the channel that the exporter has not taken yet.
    queued: Arc<AtomicUsize>,
    gathered: Mutex<Gathered>,
    sampling: Sampling,
    traces: bool,
    origin: Origin,
    stats: Arc<ExportStats>,
}

/// The exporter's end.
pub struct TraceReceiver {
    rx: mpsc::UnboundedReceiver<Encoded>,
    queued: Arc<AtomicUsize>,
}

impl TraceReceiver {
    /// The next hand-over; `None` once the sending end is gone.
    pub async fn recv(&mut self) -> Option<Encoded> {
        let e = self.rx.recv().await?;
        self.queued.fetch_sub(e.records, Ordering::Relaxed);
        Some(e)
    }
}

/// A queue for records to a trace endpoint (`traces`: one is configured;
/// without one, nothing is queued but the exporter still runs for metrics).
pub fn trace_queue(
    sampling: Sampling,
    traces: bool,
    origin: Origin,
    stats: Arc<ExportStats>,
) -> (TraceQueue, TraceReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let q = TraceQueue {
        tx,
        queued: Arc::clone(&queued),
        gathered: Mutex::new(Gathered {
            batch: TraceBatch::default(),
            records: 0,
            ids: Ids::new(),
        }),
        sampling,
        traces,
        origin,
        stats,
    };
    (q, TraceReceiver { rx, queued })
}

impl TraceQueue {
    /// Whether `r` would be exported: decided before anything is copied or
    /// boxed for it. A record left out is counted here.
    pub fn admits(&self, r: &impl Sampled) -> Result<(), NotQueued> {
        if !self.traces {
            return Err(NotQueued::NoTraces);
        }
        let Ok(mut g) = self.gathered.lock() else {
            return Err(NotQueued::Full);
        };
        // A connection and its first request share a draw: one trace holds
        // the connection's phases and the other links to it.
        let draw = match r.shared_draw_key() {
            Some(key) => g.ids.connection_draw(key),
            None => g.ids.draw(),
        };
        if !self.sampling.keep(r, draw) {
            self.stats
                .records_sampled_out
                .fetch_add(1, Ordering::Relaxed);
            return Err(NotQueued::SampledOut);
        }
        if self.queued.load(Ordering::Relaxed) + g.records >= EXPORT_QUEUE {
            return Err(NotQueued::Full);
        }
        Ok(())
    }

    /// Writes an admitted record's spans for the next hand-over.
    pub fn push(&self, r: Traced) {
        let full = match self.gathered.lock() {
            Ok(mut g) => {
                let g = &mut *g;
                let o = &self.origin;
                write_record(
                    &r,
                    &o.host,
                    o.service_name.as_deref(),
                    &mut g.ids,
                    &mut g.batch,
                );
                g.records += 1;
                g.records >= HAND_OVER_AT
            }
            Err(_) => false,
        };
        if full {
            self.hand_over();
        }
    }

    /// Hands what was gathered to the exporter (at the end of each batch the
    /// correlator works through).
    pub fn hand_over(&self) {
        let Ok(mut g) = self.gathered.lock() else {
            return;
        };
        if g.records == 0 {
            return;
        }
        let e = Encoded {
            spans: g.batch.span_count(),
            body: g.batch.encode(),
            records: std::mem::take(&mut g.records),
        };
        self.queued.fetch_add(e.records, Ordering::Relaxed);
        if let Err(e) = self.tx.send(e) {
            // The exporter is gone (only at stop): nothing will take them.
            self.queued.fetch_sub(e.0.records, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        clock::Clock,
        record::{ConnRecord, State},
    };

    fn conn(duration_ns: u64) -> Box<ConnRecord> {
        let c = observer_common::Conn {
            start_ns: 1,
            established_ns: 2,
            end_ns: 1 + duration_ns,
            family: observer_common::AF_INET,
            direction: observer_common::DIR_OUTBOUND,
            flags: observer_common::FLAG_OWNED | observer_common::FLAG_ESTABLISHED,
            ..Default::default()
        };
        Box::new(ConnRecord::new(
            &c,
            None,
            &Clock::with_offset(0),
            State::Closed,
        ))
    }

    fn queue(ratio: f64) -> (TraceQueue, TraceReceiver, Arc<ExportStats>) {
        let stats = Arc::new(ExportStats::default());
        let sampling = Sampling {
            ratio,
            slow: Duration::from_secs(10),
            parent_based: false,
        };
        let (q, rx) = trace_queue(sampling, true, Origin::default(), Arc::clone(&stats));
        (q, rx, stats)
    }

    #[tokio::test]
    async fn records_are_handed_over_in_one_piece_and_counted_out_of_the_bound() {
        let (q, mut rx, _) = queue(1.0);
        for _ in 0..3 {
            let r = conn(1_000);
            assert_eq!(q.admits(r.as_ref()), Ok(()));
            q.push(Traced::Conn(r));
        }
        assert_eq!(q.queued.load(Ordering::Relaxed), 0, "gathered, not sent");
        q.hand_over();
        assert_eq!(q.queued.load(Ordering::Relaxed), 3);
        let got = rx.recv().await.expect("a hand-over");
        assert_eq!(got.records, 3);
        assert!(got.spans >= 3, "each record's spans: {}", got.spans);
        assert_eq!(q.queued.load(Ordering::Relaxed), 0, "taken");
    }

    #[tokio::test]
    async fn pieces_joined_are_one_request_with_every_span() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        let (q, mut rx, _) = queue(1.0);
        let mut joined = Encoded::default();
        for n in [2, 1] {
            for _ in 0..n {
                q.push(Traced::Conn(conn(1_000)));
            }
            q.hand_over();
            joined.join(rx.recv().await.expect("a piece"));
        }
        assert_eq!(joined.records, 3);
        let req = ExportTraceServiceRequest::decode(joined.body.as_slice()).expect("decodes");
        let spans: usize = req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(spans, joined.spans, "every span of both pieces");
        assert_eq!(req.resource_spans.len(), 2, "one resource per piece");
    }

    #[test]
    fn a_full_queue_refuses_and_a_sampled_out_record_is_counted() {
        let (q, _rx, stats) = queue(1.0);
        let mut admitted = 0;
        for _ in 0..EXPORT_QUEUE + 10 {
            let r = conn(1_000);
            if q.admits(r.as_ref()).is_ok() {
                admitted += 1;
                q.push(Traced::Conn(r));
            }
        }
        assert_eq!(admitted, EXPORT_QUEUE, "bounded in records");
        assert_eq!(q.admits(conn(1_000).as_ref()), Err(NotQueued::Full));

        let (none, _rx, stats0) = queue(0.0);
        assert_eq!(
            none.admits(conn(1_000).as_ref()),
            Err(NotQueued::SampledOut)
        );
        assert_eq!(stats0.records_sampled_out.load(Ordering::Relaxed), 1);
        assert_eq!(stats.records_sampled_out.load(Ordering::Relaxed), 0);
    }
}
