//! An OTLP receiver of the tests' own: the gRPC trace and metrics services
//! (built from opentelemetry-proto's tonic services; the metrics one can be
//! left out, as Jaeger leaves it out) and OTLP/HTTP, and readers of what it
//! received. For the fault tests it can answer trace exports from a script
//! (a status N times, then OK) and log every attempt with its time, and
//! `Wedged` is an endpoint that accepts connections and never reads them.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
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
    /// Trace exports answered OK.
    pub traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    pub metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    /// Every byte the OTLP/HTTP receiver read (request lines, headers and
    /// bodies as they came), for tests that search all of it.
    pub raw: Arc<Mutex<Vec<u8>>>,
    /// How the next trace exports are answered, one entry each (then OK).
    pub script: Arc<Mutex<VecDeque<Answer>>>,
    /// Every trace export that arrived, OK or not, in order.
    pub attempts: Arc<Mutex<Vec<Attempt>>>,
}

/// A scripted answer to a trace export.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Answer {
    Ok,
    /// OTLP/HTTP: this status, with `Retry-After: secs` when given.
    Http {
        status: u16,
        retry_after: Option<u32>,
    },
    /// OTLP/gRPC: this code, with a google.rpc.RetryInfo delay when given.
    Grpc {
        code: tonic::Code,
        retry_info: Option<Duration>,
    },
}

/// One trace export as the receiver saw it: when it arrived (its body read
/// whole), how it was answered, and how many spans it carried.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub at: Instant,
    pub answer: Answer,
    pub spans: usize,
}

impl Received {
    /// Answers the next trace exports with `answers` (then OK).
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.script.lock().unwrap().extend(answers);
    }

    /// Logs a trace export and decides its answer; OK ones are kept.
    fn take(&self, req: ExportTraceServiceRequest) -> Answer {
        let answer = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Answer::Ok);
        self.attempts.lock().unwrap().push(Attempt {
            at: Instant::now(),
            answer,
            spans: span_count(&req),
        });
        if answer == Answer::Ok {
            self.traces.lock().unwrap().push(req);
        }
        answer
    }
}

/// Spans in one export request.
pub fn span_count(req: &ExportTraceServiceRequest) -> usize {
    req.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

/// A gRPC status with a RetryInfo of `delay` in its details, as a collector
/// that sheds load says when to come back.
fn status_of(code: tonic::Code, retry_info: Option<Duration>) -> tonic::Status {
    use observer::export::retry::{ProtoAny, ProtoDuration, RetryInfo, RpcStatus, RETRY_INFO_TYPE};
    let Some(d) = retry_info else {
        return tonic::Status::new(code, "scripted");
    };
    let info = RetryInfo {
        retry_delay: Some(ProtoDuration {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        }),
    };
    let details = RpcStatus {
        code: code as i32,
        message: "scripted".into(),
        details: vec![ProtoAny {
            type_url: RETRY_INFO_TYPE.into(),
            value: info.encode_to_vec(),
        }],
    };
    tonic::Status::with_details(code, "scripted", details.encode_to_vec().into())
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        match self.take(req.into_inner()) {
            Answer::Grpc { code, retry_info } => Err(status_of(code, retry_info)),
            _ => Ok(tonic::Response::new(ExportTraceServiceResponse::default())),
        }
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
    let port = serve_http(&rec, 0);
    (rec, port)
}

/// Serves OTLP/HTTP for `rec` on `port` (0: any) from a background thread,
/// one request per connection; trace exports are answered by its script.
pub fn serve_http(rec: &Received, port: u16) -> u16 {
    let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let port = l.local_addr().unwrap().port();
    let r = rec.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            // A client that gave up mid-request is not the test's failure.
            let _ = http_exchange(&r, s);
        }
    });
    port
}

/// One OTLP/HTTP request read and answered.
fn http_exchange(r: &Received, mut s: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    r.raw.lock().unwrap().extend_from_slice(line.as_bytes());
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut len = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        r.raw.lock().unwrap().extend_from_slice(h.as_bytes());
        if h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some(v) = h.to_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    r.raw.lock().unwrap().extend_from_slice(&body);
    let answer = match path.as_str() {
        "/v1/traces" => r.take(ExportTraceServiceRequest::decode(&body[..]).unwrap()),
        "/v1/metrics" => {
            let m = ExportMetricsServiceRequest::decode(&body[..]).unwrap();
            r.metrics.lock().unwrap().push(m);
            Answer::Ok
        }
        _ => Answer::Ok,
    };
    let head = match answer {
        Answer::Http {
            status,
            retry_after: Some(secs),
        } => format!("HTTP/1.1 {status} Scripted\r\nRetry-After: {secs}\r\n"),
        Answer::Http { status, .. } => format!("HTTP/1.1 {status} Scripted\r\n"),
        _ => "HTTP/1.1 200 OK\r\n".to_owned(),
    };
    s.write_all(format!("{head}Content-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
}

/// An endpoint that accepts connections and never reads them (a wedged
/// collector, a path that went dead): the kernel takes what fits in its
/// buffers, then the sender waits. Accepted connections stay open until
/// it is dropped, also after `close_listener`.
pub struct Wedged {
    pub port: u16,
    /// When each connection was accepted.
    pub accepts: Arc<Mutex<Vec<Instant>>>,
    held: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Wedged {
    pub fn listen() -> Wedged {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Polled, so that `close_listener` can end the accept loop.
        l.set_nonblocking(true).unwrap();
        let accepts = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, h, st) = (accepts.clone(), held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        a.lock().unwrap().push(Instant::now());
                        h.lock().unwrap().push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Wedged {
            port,
            accepts,
            held,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops listening (the port is free for another server) and keeps the
    /// accepted connections open, still unread.
    pub fn close_listener(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Connections accepted and still held.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }
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
