//! An OTLP receiver of the tests' own: the gRPC trace and metrics services
//! (built from opentelemetry-proto's tonic services; the metrics one can be
//! left out, as Jaeger leaves it out) and OTLP/HTTP, and readers of what it
//! received.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            metrics_service_server::{MetricsService, MetricsServiceServer},
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        },
        trace::v1::{
            trace_service_server::{TraceService, TraceServiceServer},
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        },
    },
    common::v1::{any_value::Value as AnyV, KeyValue},
    trace::v1::Span,
};
use prost::Message;

use crate::Cert;

#[derive(Default, Clone)]
pub struct Received {
    pub traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    pub metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    /// Every byte the OTLP/HTTP receiver read (request lines, headers and
    /// bodies as they came), for tests that search all of it.
    pub raw: Arc<Mutex<Vec<u8>>>,
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.traces.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver on a free port, served from a background thread.
pub fn grpc_receiver() -> (Received, u16) {
    let rec = Received::default();
    let (port, stop) = serve_grpc(&rec, 0);
    std::mem::forget(stop);
    (rec, port)
}

/// An OTLP/gRPC receiver of traces only, as Jaeger is: a metrics export
/// gets Unimplemented.
pub fn traces_only_receiver() -> (Received, u16) {
    let rec = Received::default();
    let (port, stop) = serve(&rec, 0, None, false);
    std::mem::forget(stop);
    (rec, port)
}

/// Serves `rec` on `port` (0: any) until the returned sender is dropped.
pub fn serve_grpc(rec: &Received, port: u16) -> (u16, tokio::sync::oneshot::Sender<()>) {
    serve_grpc_with(rec, port, None)
}

/// The same over TLS with `cert`'s identity when given.
pub fn serve_grpc_with(
    rec: &Received,
    port: u16,
    cert: Option<&Cert>,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    serve(rec, port, cert, true)
}

fn serve(
    rec: &Received,
    port: u16,
    cert: Option<&Cert>,
    with_metrics: bool,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let identity = cert.map(|c| {
        tonic::transport::Identity::from_pem(
            std::fs::read(c.cert()).unwrap(),
            std::fs::read(c.key()).unwrap(),
        )
    });
    let l = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let port = l.local_addr().unwrap().port();
    let r = rec.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            l.set_nonblocking(true).unwrap();
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            let mut builder = tonic::transport::Server::builder();
            if let Some(id) = identity {
                builder = builder
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(id))
                    .unwrap();
            }
            builder
                .add_service(TraceServiceServer::new(r.clone()))
                .add_optional_service(with_metrics.then(|| MetricsServiceServer::new(r)))
                .serve_with_incoming_shutdown(tokio_stream_from(l), async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
    });
    (port, tx)
}

pub fn tokio_stream_from(
    l: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(l)
}

/// An OTLP/HTTP receiver: decodes POSTs to /v1/traces and /v1/metrics.
pub fn http_receiver() -> (Received, u16) {
    let rec = Received::default();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let r = rec.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            r.raw.lock().unwrap().extend_from_slice(line.as_bytes());
            let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            let mut len = 0;
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                r.raw.lock().unwrap().extend_from_slice(h.as_bytes());
                if h == "\r\n" || h.is_empty() {
                    break;
                }
                if let Some(v) = h.to_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            r.raw.lock().unwrap().extend_from_slice(&body);
            match path.as_str() {
                "/v1/traces" => r
                    .traces
                    .lock()
                    .unwrap()
                    .push(ExportTraceServiceRequest::decode(&body[..]).unwrap()),
                "/v1/metrics" => r
                    .metrics
                    .lock()
                    .unwrap()
                    .push(ExportMetricsServiceRequest::decode(&body[..]).unwrap()),
                _ => {}
            }
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (rec, port)
}

pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyV> {
    attrs
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

pub fn attr_str(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key)? {
        AnyV::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

pub fn attr_int(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        AnyV::IntValue(v) => Some(*v),
        _ => None,
    }
}

/// (resource attributes, span) of everything received.
pub fn all_spans(rec: &Received) -> Vec<(Vec<KeyValue>, Span)> {
    rec.traces
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| r.resource_spans.clone())
        .flat_map(|rs| {
            let res = rs.resource.map(|r| r.attributes).unwrap_or_default();
            rs.scope_spans
                .into_iter()
                .flat_map(|s| s.spans)
                .map(move |sp| (res.clone(), sp))
                .collect::<Vec<_>>()
        })
        .collect()
}
