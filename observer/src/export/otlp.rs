//! OTLP export over gRPC (tonic) or HTTP/protobuf (hyper), configured by the
//! standard OTEL_EXPORTER_OTLP_* variables (and OTEL_TRACES_EXPORTER /
//! OTEL_METRICS_EXPORTER: otlp or none). A bounded queue in front, retries
//! with backoff behind: a collector that is down costs counted drops, never
//! unbounded memory and never a stall of event processing. An endpoint that
//! does not implement a signal's service (Jaeger takes traces only) is told
//! once and that signal stops; the other goes on.

use std::{
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Serialize;

pub use super::sampling::{Sampled, Sampling};
use super::{
    metrics::{Metrics, DROPPED},
    queue::{Encoded, TraceReceiver},
    retry::{self, Backoff, Retry},
};
pub use crate::stats::ExportStats;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// Where and how one signal goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    /// gRPC: the server's URL; HTTP: the full URL including the signal's path.
    pub endpoint: String,
    pub protocol: Protocol,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub gzip: bool,
    /// PEM file of CAs to trust besides the system's (https endpoints).
    pub ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    pub traces: Option<Signal>,
    pub metrics: Option<Signal>,
    pub metric_interval: Duration,
}

/// A setting that cannot be used: which key, what value, why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{key}={value:?}: {why}")]
pub struct BadSetting {
    pub key: String,
    pub value: String,
    pub why: String,
}

fn bad(key: &str, value: &str, why: &str) -> BadSetting {
    BadSetting {
        key: key.into(),
        value: value.into(),
        why: why.into(),
    }
}

fn check_url(key: &str, url: &str) -> Result<(), BadSetting> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| bad(key, url, &format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad(key, url, "the URL must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad(key, url, "the URL has no host"));
    }
    Ok(())
}

impl OtlpConfig {
    /// Reads the standard variables through `get` (the environment, or the
    /// merged config file + environment). Nothing is exported unless an
    /// endpoint is set.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, BadSetting> {
        let metric_interval = match get("OTEL_METRIC_EXPORT_INTERVAL") {
            None => Duration::from_secs(60),
            Some(v) => Duration::from_millis(
                v.trim()
                    .parse()
                    .ok()
                    .filter(|&ms: &u64| ms > 0)
                    .ok_or_else(|| {
                        bad(
                            "OTEL_METRIC_EXPORT_INTERVAL",
                            &v,
                            "expected milliseconds > 0",
                        )
                    })?,
            ),
        };
        Ok(Self {
            traces: match exporter_wanted(get, "OTEL_TRACES_EXPORTER")? {
                true => signal_from_vars(get, "TRACES", "v1/traces")?,
                false => None,
            },
            metrics: match exporter_wanted(get, "OTEL_METRICS_EXPORTER")? {
                true => signal_from_vars(get, "METRICS", "v1/metrics")?,
                false => None,
            },
            metric_interval,
        })
    }
}

/// OTEL_{TRACES,METRICS}_EXPORTER: the SDKs' switch; only otlp (the
/// default) and none mean anything here.
fn exporter_wanted(get: &dyn Fn(&str) -> Option<String>, key: &str) -> Result<bool, BadSetting> {
    match get(key) {
        None => Ok(true),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" | "otlp" => Ok(true),
            "none" => Ok(false),
            _ => Err(bad(key, &v, "expected otlp or none")),
        },
    }
}

/// One signal (`sig`: TRACES or METRICS) from its OTEL_EXPORTER_OTLP_*
/// variables; None when no endpoint is set. `path` is the signal's path
/// under a general HTTP endpoint.
fn signal_from_vars(
    get: &dyn Fn(&str) -> Option<String>,
    sig: &str,
    path: &str,
) -> Result<Option<Signal>, BadSetting> {
    let var = |name: &str| signal_var(get, sig, name);
    let protocol = match var("PROTOCOL") {
        None => Protocol::Grpc,
        Some((_, v)) if v == "grpc" => Protocol::Grpc,
        Some((_, v)) if v == "http/protobuf" => Protocol::HttpProtobuf,
        Some((k, v)) => return Err(bad(&k, &v, "expected grpc or http/protobuf")),
    };
    let Some(endpoint) = signal_endpoint(get, sig, path, protocol)? else {
        return Ok(None);
    };
    let headers = match var("HEADERS") {
        None => Vec::new(),
        Some((k, v)) => parse_headers(&k, &v)?,
    };
    let timeout = match var("TIMEOUT") {
        None => Duration::from_secs(10),
        Some((k, v)) => Duration::from_millis(
            v.trim()
                .parse()
                .map_err(|_| bad(&k, &v, "expected milliseconds"))?,
        ),
    };
    let gzip = match var("COMPRESSION") {
        None => false,
        Some((_, v)) if v == "gzip" => true,
        Some((_, v)) if v == "none" => false,
        Some((k, v)) => return Err(bad(&k, &v, "expected gzip or none")),
    };
    let ca_file = match var("CERTIFICATE") {
        None => None,
        Some((k, v)) => {
            let p = PathBuf::from(v.trim());
            if !p.is_file() {
                return Err(bad(&k, &v, "no such file"));
            }
            Some(p)
        }
    };
    Ok(Some(Signal {
        endpoint,
        protocol,
        headers,
        timeout,
        gzip,
        ca_file,
    }))
}

/// OTEL_EXPORTER_OTLP_{sig}_{name}, else OTEL_EXPORTER_OTLP_{name}, with
/// the key it came from; a blank value counts as unset.
fn signal_var(
    get: &dyn Fn(&str) -> Option<String>,
    sig: &str,
    name: &str,
) -> Option<(String, String)> {
    let specific = format!("OTEL_EXPORTER_OTLP_{sig}_{name}");
    let general = format!("OTEL_EXPORTER_OTLP_{name}");
    get(&specific)
        .map(|v| (specific, v))
        .or_else(|| get(&general).map(|v| (general, v)))
        .filter(|(_, v)| !v.trim().is_empty())
}

/// The signal's endpoint: its own variable as it is, or the general one
/// (with `path` appended for HTTP); None when neither is set.
fn signal_endpoint(
    get: &dyn Fn(&str) -> Option<String>,
    sig: &str,
    path: &str,
    protocol: Protocol,
) -> Result<Option<String>, BadSetting> {
    let specific_key = format!("OTEL_EXPORTER_OTLP_{sig}_ENDPOINT");
    match (get(&specific_key), get("OTEL_EXPORTER_OTLP_ENDPOINT")) {
        (Some(e), _) if !e.trim().is_empty() => {
            check_url(&specific_key, &e)?;
            Ok(Some(e))
        }
        (_, Some(e)) if !e.trim().is_empty() => {
            check_url("OTEL_EXPORTER_OTLP_ENDPOINT", &e)?;
            Ok(Some(match protocol {
                Protocol::Grpc => e,
                Protocol::HttpProtobuf => format!("{}/{path}", e.trim_end_matches('/')),
            }))
        }
        _ => Ok(None),
    }
}

/// OTEL_EXPORTER_OTLP_*HEADERS: `key=value` pairs separated by commas (keys
/// lowercased).
fn parse_headers(key: &str, value: &str) -> Result<Vec<(String, String)>, BadSetting> {
    value
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(a, b)| (a.trim().to_lowercase(), b.trim().to_owned()))
                .filter(|(a, _)| !a.is_empty())
                .ok_or_else(|| bad(key, value, "expected key=value pairs separated by commas"))
        })
        .collect()
}

/// Which service a request goes to.
#[derive(Clone, Copy, Debug)]
enum Service {
    Traces,
    Metrics,
}

impl Service {
    fn grpc_path(self) -> &'static str {
        match self {
            Service::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Service::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        }
    }
}

/// Why an export failed, and whether to try it again (`retry::Retry`).
#[derive(Debug)]
struct Failure {
    why: String,
    retry: Retry,
    /// No answer within the timeout: the connection may be wedged (a peer
    /// that accepts and never reads), so the next attempt opens a new one.
    timed_out: bool,
}

/// A failure on this side (the request could not be made or sent, no
/// answer came): transient.
impl From<String> for Failure {
    fn from(why: String) -> Self {
        Failure {
            why,
            retry: Retry::After(None),
            timed_out: false,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// Sends one signal's requests.
enum Sender {
    Grpc(tonic::transport::Channel),
    Http(Box<HttpClient>),
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// An error and its causes, on one line (hyper's own says only "client error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

/// Why a signal's sender could not be set up (that signal then stays
/// unsent; `run` logs it once). The text gives the cause's own words; the
/// cause stays reachable as the source.
#[derive(Debug, thiserror::Error)]
enum SenderError {
    /// The CA file cannot be read.
    #[error("{}: {source}", path.display())]
    CaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A PEM section of the CA file does not decode.
    #[error("{}: {source}", path.display())]
    CaPem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// rustls takes one of the CA file's certificates for no trust anchor.
    #[error("{}: {source}", path.display())]
    CaCert {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    /// rustls's settings (its protocol versions) for the HTTP client.
    #[error(transparent)]
    Rustls(rustls::Error),
    /// The gRPC endpoint is not a URI.
    #[error(transparent)]
    Endpoint(http::uri::InvalidUri),
    /// tonic refused the TLS settings.
    #[error(transparent)]
    Grpc(tonic::transport::Error),
}

/// The CA file's certificates, PEM.
fn read_ca(path: &Path) -> Result<Vec<u8>, SenderError> {
    std::fs::read(path).map_err(|source| SenderError::CaRead {
        path: path.to_owned(),
        source,
    })
}

/// rustls client settings: the system's roots and the configured CA file.
fn rustls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, SenderError> {
    use rustls_pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let pem = read_ca(path)?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|source| SenderError::CaPem {
                path: path.to_owned(),
                source,
            })?;
            roots.add(cert).map_err(|source| SenderError::CaCert {
                path: path.to_owned(),
                source,
            })?;
        }
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(SenderError::Rustls)
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
}

impl Sender {
    fn new(sig: &Signal) -> Result<Self, SenderError> {
        match sig.protocol {
            Protocol::Grpc => {
                // No tonic timeout: `send` bounds the whole call, and tells
                // a call with no answer (then a new channel) from one the
                // server answered.
                let mut ep = tonic::transport::Channel::from_shared(sig.endpoint.clone())
                    .map_err(SenderError::Endpoint)?
                    .connect_timeout(sig.timeout);
                if sig.endpoint.starts_with("https://") {
                    let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
                    if let Some(ca) = &sig.ca_file {
                        tls = tls
                            .ca_certificate(tonic::transport::Certificate::from_pem(read_ca(ca)?));
                    }
                    ep = ep.tls_config(tls).map_err(SenderError::Grpc)?;
                }
                Ok(Sender::Grpc(ep.connect_lazy()))
            }
            Protocol::HttpProtobuf => {
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(rustls_config(sig.ca_file.as_deref())?)
                    .https_or_http()
                    .enable_http1()
                    .build();
                Ok(Sender::Http(Box::new(
                    hyper_util::client::legacy::Client::builder(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .build(https),
                )))
            }
        }
    }

    fn grpc_request<T>(sig: &Signal, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        for (k, v) in &sig.headers {
            if let (Ok(k), Ok(v)) = (
                k.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
                v.parse(),
            ) {
                r.metadata_mut().insert(k, v);
            }
        }
        r
    }

    async fn http(&self, sig: &Signal, body: Bytes) -> Result<(), Failure> {
        let Sender::Http(client) = self else {
            return Err(Failure::from("not an HTTP sender".to_owned()));
        };
        let (body, encoding) = if sig.gzip {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&body).map_err(|e| e.to_string())?;
            (
                Bytes::from(gz.finish().map_err(|e| e.to_string())?),
                Some("gzip"),
            )
        } else {
            (body, None)
        };
        let mut req =
            http::Request::post(&sig.endpoint).header("content-type", "application/x-protobuf");
        if let Some(enc) = encoding {
            req = req.header("content-encoding", enc);
        }
        for (k, v) in &sig.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = client.request(req).await.map_err(|e| chain(&e))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            return Ok(());
        }
        Err(Failure {
            why: format!("HTTP {status}"),
            retry: retry::http(status.as_u16(), retry_after.as_deref()),
            timed_out: false,
        })
    }

    /// One export call: `body` is the encoded Export*ServiceRequest (gzip
    /// when asked, by tonic or here). The whole call, connecting included,
    /// is bounded by the signal's timeout.
    async fn send(&self, sig: &Signal, service: Service, body: Bytes) -> Result<(), Failure> {
        let call = async {
            match self {
                Sender::Grpc(ch) => Sender::grpc(ch, sig, service, body).await,
                Sender::Http(_) => self.http(sig, body).await,
            }
        };
        match tokio::time::timeout(sig.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Failure {
                why: format!("no answer within {:?}", sig.timeout),
                retry: Retry::After(None),
                timed_out: true,
            }),
        }
    }

    async fn grpc(
        ch: &tonic::transport::Channel,
        sig: &Signal,
        service: Service,
        body: Bytes,
    ) -> Result<(), Failure> {
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        if sig.gzip {
            grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        grpc.ready().await.map_err(|e| Failure::from(chain(&e)))?;
        grpc.unary(
            Sender::grpc_request(sig, body),
            http::uri::PathAndQuery::from_static(service.grpc_path()),
            super::grpc_bytes::EncodedCodec,
        )
        .await
        .map(|_| ())
        .map_err(|s| Failure {
            retry: retry::grpc(&s),
            why: format!("{}: {}", s.code(), s.message()),
            timed_out: false,
        })
    }
}

pub struct Exporter {
    pub config: OtlpConfig,
    /// The observer's own resource, for metrics.
    pub resource: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
    pub metrics: Arc<Mutex<Metrics>>,
    pub stats: Arc<ExportStats>,
}

const MAX_BATCH: usize = 512;
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// A batch is given up after this many attempts that failed transiently
/// (waits between them: `retry::Backoff`, 0.2 s doubling, about 3 s in all
/// unless the server asks for longer).
pub const ATTEMPTS: u32 = 5;

impl Exporter {
    /// Runs until its queue's senders are gone, then flushes what is left.
    /// Spans come encoded (`queue::TraceQueue`), a correlator batch at a
    /// time; pieces are joined up to MAX_BATCH records an export.
    pub async fn run(self, mut rx: TraceReceiver) {
        let mut traces = self
            .config
            .traces
            .clone()
            .and_then(|s| match Sender::new(&s) {
                Ok(x) => Some((s, x)),
                Err(e) => {
                    tracing::warn!("OTLP traces: {e}");
                    None
                }
            });
        let mut metrics = self
            .config
            .metrics
            .clone()
            .and_then(|s| match Sender::new(&s) {
                Ok(x) => Some((s, x)),
                Err(e) => {
                    tracing::warn!("OTLP metrics: {e}");
                    None
                }
            });
        if traces.is_some() {
            self.publish_dropped();
        }
        let mut batch = Encoded::default();
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        let mut metric_tick = tokio::time::interval(self.config.metric_interval);
        metric_tick.tick().await;
        loop {
            tokio::select! {
                r = rx.recv() => match r {
                    Some(piece) => {
                        if traces.is_some() {
                            batch.join(piece);
                        }
                        if batch.records >= MAX_BATCH {
                            self.send_traces(&mut traces, &mut batch).await;
                        }
                    }
                    None => break,
                },
                _ = flush.tick() => self.send_traces(&mut traces, &mut batch).await,
                _ = metric_tick.tick() => self.send_metrics(&mut metrics).await,
            }
        }
        self.send_traces(&mut traces, &mut batch).await;
        self.send_metrics(&mut metrics).await;
    }

    /// Stops a signal its endpoint does not implement, saying so once.
    fn refused(
        &self,
        what: &str,
        slot: &mut Option<(Signal, Sender)>,
        flag: &std::sync::atomic::AtomicBool,
        f: &Failure,
    ) {
        if let Some((sig, _)) = slot.take() {
            flag.store(true, Ordering::Relaxed);
            tracing::warn!(
                "OTLP {what}: {} does not take {what} ({f}); not sending them again \
                 (OTEL_{}_EXPORTER=none silences this)",
                sig.endpoint,
                what.to_uppercase()
            );
        }
    }

    async fn send_traces(&self, traces: &mut Option<(Signal, Sender)>, batch: &mut Encoded) {
        let Encoded {
            body,
            spans: n_spans,
            records: n_records,
        } = std::mem::take(batch);
        if traces.is_none() || n_records == 0 {
            return;
        }
        // Encoded once; a retry sends the same bytes.
        match self.attempts(traces, Bytes::from(body)).await {
            Ok(()) => {
                self.stats
                    .spans_sent
                    .fetch_add(n_spans as u64, Ordering::Relaxed);
                self.stats
                    .records_sent
                    .fetch_add(n_records as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats
                    .records_dropped
                    .fetch_add(n_records as u64, Ordering::Relaxed);
                self.stats
                    .spans_dropped
                    .fetch_add(n_spans as u64, Ordering::Relaxed);
                self.publish_dropped();
                if e.retry == Retry::Refused {
                    self.refused("traces", traces, &self.stats.traces_refused, &e);
                } else if let Some((sig, _)) = traces.as_ref() {
                    tracing::warn!(
                        "OTLP traces to {}: gave up {n_records} records ({n_spans} spans): {e}",
                        sig.endpoint
                    );
                }
            }
        }
    }

    /// Sends one batch, retrying transient failures (up to ATTEMPTS, with
    /// `Backoff`); the last failure when it is given up.
    async fn attempts(
        &self,
        slot: &mut Option<(Signal, Sender)>,
        body: Bytes,
    ) -> Result<(), Failure> {
        let mut backoff = Backoff::default();
        let mut attempt = 1;
        loop {
            let Some((sig, sender)) = slot.as_mut() else {
                return Err(Failure::from("no trace sender".to_owned()));
            };
            let e = match sender.send(sig, Service::Traces, body.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            self.stats.export_errors.fetch_add(1, Ordering::Relaxed);
            let Retry::After(server) = e.retry else {
                return Err(e);
            };
            if attempt == ATTEMPTS {
                return Err(e);
            }
            renew_if_wedged(sig, sender, &e);
            let wait = backoff.next(server);
            tracing::warn!(
                "OTLP traces to {} (attempt {attempt}): {e}; again in {wait:?}",
                sig.endpoint
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// `observer.events.dropped{stage="export_failed"}`: records given up
    /// after their export failed, next to the queue's own losses
    /// (`stage="exporter"`), so a collector that is away shows on the
    /// Prometheus endpoint and in the observer's own OTLP metrics.
    fn publish_dropped(&self) {
        let n = self.stats.records_dropped.load(Ordering::Relaxed);
        if let Ok(mut m) = self.metrics.lock() {
            m.set_counter(DROPPED, vec![("stage", "export_failed".into())], n);
        }
    }

    async fn send_metrics(&self, metrics: &mut Option<(Signal, Sender)>) {
        let Some((sig, sender)) = metrics.as_mut() else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let body = match self.metrics.lock() {
            Ok(m) => Bytes::from(m.otlp_bytes(&self.resource, now)),
            Err(_) => return,
        };
        match sender.send(sig, Service::Metrics, body).await {
            Ok(()) => {
                self.stats.metric_exports.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.retry == Retry::Refused => {
                self.stats.export_errors.fetch_add(1, Ordering::Relaxed);
                self.refused("metrics", metrics, &self.stats.metrics_refused, &e);
            }
            Err(e) => {
                // Not retried: cumulative, the next export carries
                // everything again.
                self.stats.export_errors.fetch_add(1, Ordering::Relaxed);
                renew_if_wedged(sig, sender, &e);
                tracing::warn!("OTLP metrics to {}: {e}", sig.endpoint);
            }
        }
    }
}

/// After a gRPC call that got no answer, a new channel: HTTP/2 keeps one
/// connection, and a peer that accepted it and stopped reading (a wedged
/// collector, a dead path) would hold every later call too. (HTTP/1 drops
/// the connection of a call given up.)
fn renew_if_wedged(sig: &Signal, sender: &mut Sender, e: &Failure) {
    if e.timed_out && matches!(sender, Sender::Grpc(_)) {
        match Sender::new(sig) {
            Ok(s) => *sender = s,
            Err(err) => tracing::warn!("OTLP to {}: a new channel: {err}", sig.endpoint),
        }
    }
}

/// A connection and its first request share a draw (see
/// `Ids::connection_draw`); everything else draws afresh.
#[cfg(test)]
mod tests {
    use observer_common::{
        Conn, AF_INET, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED, FLAG_RESET_RX,
    };

    use super::*;
    use crate::{
        clock::Clock,
        export::spans::Traced,
        record::{ConnRecord, State},
    };

    fn rec(duration_ns: u64, refused: bool) -> Traced {
        let c = Conn {
            start_ns: 1,
            established_ns: 2,
            end_ns: 1 + duration_ns,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: if refused {
                FLAG_OWNED | FLAG_RESET_RX
            } else {
                FLAG_OWNED | FLAG_ESTABLISHED
            },
            ..Conn::default()
        };
        Traced::Conn(Box::new(ConnRecord::new(
            &c,
            None,
            &Clock::with_offset(0),
            State::Closed,
        )))
    }

    #[test]
    fn sampling_keeps_failures_and_slow_connections() {
        let s = Sampling {
            ratio: 0.0,
            slow: Duration::from_millis(500),
            parent_based: false,
        };
        assert!(
            !s.keep(&rec(1_000_000, false), 0),
            "fast, fine, ratio 0: out"
        );
        assert!(s.keep(&rec(1_000_000, true), u64::MAX), "failed: always in");
        assert!(
            s.keep(&rec(600_000_000, false), u64::MAX),
            "slow: always in"
        );
        let half = Sampling {
            ratio: 0.5,
            slow: Duration::from_secs(10),
            parent_based: false,
        };
        assert!(half.keep(&rec(1, false), u64::MAX / 4));
        assert!(!half.keep(&rec(1, false), u64::MAX / 4 * 3));
    }

    /// A `parentbased_` sampler follows the caller's sampled flag; without
    /// one (or without a trace context) the ratio decides.
    #[test]
    fn a_parent_based_sampler_follows_the_callers_flag() {
        let c = ConnRecord::new(
            &Conn::default(),
            None,
            &Clock::with_offset(0),
            State::Closed,
        );
        let mut r = crate::top::model::tests::request_of(&c);
        let sampler = |parent_based| Sampling {
            ratio: 0.5,
            slow: Duration::from_secs(10),
            parent_based,
        };
        let tp = |flags: &str| {
            let v = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
            crate::http::trace_context::TraceParent::parse(v.as_bytes())
        };
        let (low, high) = (0, u64::MAX);
        r.trace.incoming = tp("01");
        assert!(sampler(true).keep(&r, high), "sampled by the caller: kept");
        assert!(
            !sampler(false).keep(&r, high),
            "the ratio, when not parent-based"
        );
        r.trace.incoming = tp("00");
        assert!(
            !sampler(true).keep(&r, low),
            "not sampled by the caller: out"
        );
        r.error = Some("reset");
        assert!(sampler(true).keep(&r, low), "failed: always in");
        r.error = None;
        r.trace.incoming = None;
        assert!(sampler(true).keep(&r, low) && !sampler(true).keep(&r, high));
    }

    #[test]
    fn per_signal_settings_override_the_general_ones() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "http://m:9000/custom",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Bearer x, x-tenant=a",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ];
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let c = OtlpConfig::from_vars(&get).expect("valid");
        let t = c.traces.expect("traces");
        assert_eq!(
            (t.endpoint.as_str(), t.protocol),
            ("http://c:4317", Protocol::Grpc)
        );
        assert_eq!(
            t.headers,
            vec![
                ("authorization".into(), "Bearer x".into()),
                ("x-tenant".into(), "a".into())
            ]
        );
        assert_eq!((t.timeout, t.gzip), (Duration::from_millis(2500), true));
        let m = c.metrics.expect("metrics");
        assert_eq!(
            (m.endpoint.as_str(), m.protocol),
            ("http://m:9000/custom", Protocol::HttpProtobuf)
        );
        let bad = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
        ];
        let get = |k: &str| {
            bad.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let e = OtlpConfig::from_vars(&get).expect_err("bad timeout");
        assert_eq!(e.key, "OTEL_EXPORTER_OTLP_TIMEOUT");
    }

    /// A CA file that cannot be used stops the signal with an error naming
    /// the file and why; which step failed shows in the variant.
    #[test]
    fn unusable_ca_files_say_which_and_why() {
        let dir = std::env::temp_dir().join(format!("otlp-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let missing = dir.join("missing.pem");
        let e = rustls_config(Some(&missing)).expect_err("no such file");
        assert!(matches!(&e, SenderError::CaRead { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound));
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", missing.display())),
            "{e}"
        );
        let not_der = dir.join("not-der.pem");
        std::fs::write(
            &not_der,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        let e = rustls_config(Some(&not_der)).expect_err("not a certificate");
        assert!(matches!(e, SenderError::CaCert { .. }), "{e:?}");
        let sig = Signal {
            endpoint: "https://c:4317".into(),
            protocol: Protocol::Grpc,
            headers: Vec::new(),
            timeout: Duration::from_secs(1),
            gzip: false,
            ca_file: Some(missing),
        };
        let e = Sender::new(&sig).err().expect("no such file");
        assert!(matches!(e, SenderError::CaRead { .. }), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
