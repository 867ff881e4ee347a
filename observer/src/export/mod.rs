//! OpenTelemetry: connection records as traces (OTLP), histograms and
//! counters (OTLP and a Prometheus endpoint), for `observer run`. Exporters
//! only read finished records.

pub mod attrs;
pub mod config;
mod grpc_bytes;
pub mod metrics;
pub mod otlp;
pub mod prometheus;
mod protowire;
pub mod queue;
pub mod retry;
pub mod running;
pub mod sampling;
pub mod span_wire;
pub mod spans;
