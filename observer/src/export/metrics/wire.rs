//! The metrics written straight into their OTLP protobuf encoding
//! (ExportMetricsServiceRequest), borrowed from the series where they live.
//! Building the prost request first (`Metrics::otlp`, kept for tests) made
//! an owned string per attribute and two vectors per histogram point: with
//! 2,000 series a metric, 1-1.5 MiB of small blocks each minute, all freed
//! right after the send, which showed in RSS until the heap's next trim
//! (bench/NOTES.md, "The soak holds"). A unit test checks that these bytes
//! decode, with prost, to `Metrics::otlp`'s request.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message as _;

use super::{bounds, describe, Labels, Metrics};
use crate::{
    export::{
        protowire::{
            attr_len, bytes_len, framed_len, key_len, put_attr, put_bytes, put_fixed64, put_key,
            put_varint, AnyRef, FIXED64, LEN, VARINT,
        },
        span_wire::{SCOPE_NAME, SCOPE_VERSION},
    },
    hist::Hist,
};

/// AggregationTemporality's CUMULATIVE.
const CUMULATIVE: u64 = 2;

/// Which OTLP metric a group of series is, by the Metric's oneof field.
#[derive(Clone, Copy)]
enum Kind {
    Gauge = 5,
    Sum = 7,
    Histogram = 9,
}

/// One point's value, borrowed.
enum Value<'a> {
    Hist(&'a Hist, &'static [f64; 16]),
    Int(u64),
    Double(f64),
}

/// One metric: its name, kind and series (labels to their value's place).
struct Group<'a> {
    name: &'static str,
    kind: Kind,
    series: &'a BTreeMap<Labels, usize>,
}

/// The timestamps every point carries.
#[derive(Clone, Copy)]
struct Times {
    start: u64,
    now: u64,
}

impl Metrics {
    /// The same request as `otlp`, encoded; `resource` is the observer's own.
    pub fn otlp_bytes(&self, resource: &[KeyValue], now_unix_ns: u64) -> Vec<u8> {
        let times = Times {
            start: self.start_unix_ns,
            now: now_unix_ns,
        };
        let groups = self.groups();
        let metric_lens: Vec<usize> = groups.iter().map(|g| self.metric_len(g, times)).collect();
        let resource_len: usize = resource
            .iter()
            .map(|kv| kv.encoded_len())
            .map(|n| framed_len(1, n))
            .sum();
        let scope_len =
            bytes_len(1, SCOPE_NAME.as_bytes()) + bytes_len(2, SCOPE_VERSION.as_bytes());
        let scope_metrics_len =
            framed_len(1, scope_len) + metric_lens.iter().map(|&n| framed_len(2, n)).sum::<usize>();
        let resource_metrics_len = framed_len(1, resource_len) + framed_len(2, scope_metrics_len);
        let total = framed_len(1, resource_metrics_len);

        let mut buf = Vec::with_capacity(total);
        put_frame(&mut buf, 1, resource_metrics_len);
        put_frame(&mut buf, 1, resource_len);
        for kv in resource {
            put_frame(&mut buf, 1, kv.encoded_len());
            kv.encode_raw(&mut buf);
        }
        put_frame(&mut buf, 2, scope_metrics_len);
        put_frame(&mut buf, 1, scope_len);
        put_bytes(&mut buf, 1, SCOPE_NAME.as_bytes());
        put_bytes(&mut buf, 2, SCOPE_VERSION.as_bytes());
        for (g, len) in groups.iter().zip(metric_lens) {
            put_frame(&mut buf, 2, len);
            self.put_metric(&mut buf, g, times);
        }
        debug_assert_eq!(buf.len(), total);
        buf
    }

    /// Every metric, in `otlp`'s order: histograms, sums, gauges, each by name.
    fn groups(&self) -> Vec<Group<'_>> {
        let mut groups: Vec<Group<'_>> = groups_of(Kind::Histogram, &self.hists.index).collect();
        groups.extend(groups_of(Kind::Sum, &self.counters.index));
        groups.extend(groups_of(Kind::Gauge, &self.gauges.index));
        groups
    }

    fn value(&self, g: &Group<'_>, at: usize) -> Value<'_> {
        match g.kind {
            Kind::Histogram => Value::Hist(&self.hists.values[at], bounds(g.name)),
            Kind::Sum => Value::Int(self.counters.values[at]),
            Kind::Gauge => Value::Double(self.gauges.values[at]),
        }
    }

    /// The Metric's body: name, description, unit, then its data.
    fn metric_len(&self, g: &Group<'_>, times: Times) -> usize {
        let d = describe(g.name);
        bytes_len(1, g.name.as_bytes())
            + bytes_len(2, d.description.as_bytes())
            + bytes_len(3, d.unit.as_bytes())
            + framed_len(g.kind as u32, self.data_len(g, times))
    }

    fn put_metric(&self, buf: &mut Vec<u8>, g: &Group<'_>, times: Times) {
        let d = describe(g.name);
        put_bytes(buf, 1, g.name.as_bytes());
        put_bytes(buf, 2, d.description.as_bytes());
        put_bytes(buf, 3, d.unit.as_bytes());
        put_frame(buf, g.kind as u32, self.data_len(g, times));
        for (labels, &at) in g.series {
            let v = self.value(g, at);
            put_frame(buf, 1, point_len(labels, &v, times));
            put_point(buf, labels, &v, times);
        }
        match g.kind {
            Kind::Gauge => {}
            Kind::Sum => {
                put_uint(buf, 2, CUMULATIVE);
                put_uint(buf, 3, 1); // is_monotonic
            }
            Kind::Histogram => put_uint(buf, 2, CUMULATIVE),
        }
    }

    /// The Gauge's, Sum's or Histogram's body: its points, then its
    /// temporality (and a Sum's monotonicity).
    fn data_len(&self, g: &Group<'_>, times: Times) -> usize {
        let points: usize = g
            .series
            .iter()
            .map(|(labels, &at)| framed_len(1, point_len(labels, &self.value(g, at), times)))
            .sum();
        let uint = |field| key_len(field) + 1;
        points
            + match g.kind {
                Kind::Gauge => 0,
                Kind::Sum => uint(2) + uint(3),
                Kind::Histogram => uint(2),
            }
    }
}

fn groups_of<'a>(
    kind: Kind,
    index: &'a BTreeMap<&'static str, BTreeMap<Labels, usize>>,
) -> impl Iterator<Item = Group<'a>> {
    index
        .iter()
        .filter(|(_, series)| !series.is_empty())
        .map(move |(&name, series)| Group { name, kind, series })
}

/// Field numbers of the point messages: (attributes, start, time).
fn point_fields(v: &Value<'_>) -> (u32, u32, u32) {
    match v {
        // HistogramDataPoint
        Value::Hist(..) => (9, 2, 3),
        // NumberDataPoint
        Value::Int(_) | Value::Double(_) => (7, 2, 3),
    }
}

fn point_len(labels: &Labels, v: &Value<'_>, times: Times) -> usize {
    let (attrs, start, time) = point_fields(v);
    let fixed = |field, x: u64| if x == 0 { 0 } else { key_len(field) + 8 };
    let common = labels
        .iter()
        .map(|(k, s)| attr_len(attrs, k, AnyRef::Str(s)))
        .sum::<usize>()
        + fixed(start, times.start)
        + fixed(time, times.now);
    common
        + match v {
            Value::Hist(h, bounds) => {
                fixed(4, h.count)
                    + key_len(5)
                    + 8
                    + framed_len(6, h.counts.len() * 8)
                    + framed_len(7, bounds.len() * 8)
            }
            // as_double (4) and as_int (6) are a oneof: written even when 0.
            Value::Double(_) => key_len(4) + 8,
            Value::Int(_) => key_len(6) + 8,
        }
}

fn put_point(buf: &mut Vec<u8>, labels: &Labels, v: &Value<'_>, times: Times) {
    let (attrs, start, time) = point_fields(v);
    for (k, s) in labels {
        put_attr(buf, attrs, k, AnyRef::Str(s));
    }
    put_fixed64(buf, start, times.start);
    put_fixed64(buf, time, times.now);
    match v {
        Value::Hist(h, bounds) => {
            put_fixed64(buf, 4, h.count);
            // sum is optional: present, so written even when 0.
            put_key(buf, 5, FIXED64);
            buf.extend_from_slice(&h.sum.to_le_bytes());
            put_frame(buf, 6, h.counts.len() * 8);
            for c in h.counts {
                buf.extend_from_slice(&c.to_le_bytes());
            }
            put_frame(buf, 7, bounds.len() * 8);
            for b in *bounds {
                buf.extend_from_slice(&b.to_le_bytes());
            }
        }
        Value::Double(x) => {
            put_key(buf, 4, FIXED64);
            buf.extend_from_slice(&x.to_le_bytes());
        }
        Value::Int(x) => {
            put_key(buf, 6, FIXED64);
            buf.extend_from_slice(&(*x as i64).to_le_bytes());
        }
    }
}

/// A message's key and length; its body follows.
fn put_frame(buf: &mut Vec<u8>, field: u32, len: usize) {
    put_key(buf, field, LEN);
    put_varint(buf, len as u64);
}

/// A one-byte varint field (an enum or a bool), written even when 0.
fn put_uint(buf: &mut Vec<u8>, field: u32, v: u64) {
    debug_assert!(v < 0x80);
    put_key(buf, field, VARINT);
    put_varint(buf, v);
}
