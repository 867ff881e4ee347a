//! OpenTelemetry: connection records as traces (OTLP), histograms and
//! counters (OTLP and a Prometheus endpoint), for `observer run`. Exporters
//! only read finished records.

pub mod attrs;
pub mod config;
pub mod metrics;
pub mod otlp;
pub mod prometheus;
pub mod spans;
