//! The Prometheus text endpoint (`GET /metrics`), rendered from the shared
//! metrics on each scrape and served by hyper, one request per connection.
//!
//! Idle and slow clients cannot exhaust the daemon: at most
//! [`MAX_CONNECTIONS`] connections live at once, and when a new one arrives
//! at the cap the oldest is closed to make room, so a flood of idle
//! connections cannot lock out a scrape (the scrape is the newest one). The
//! request head must arrive within [`HEADER_TIMEOUT`] and the whole connection
//! end within [`CONNECTION_DEADLINE`], however slowly the bytes trickle in. An
//! accept error (out of descriptors, say) pauses accepting for
//! [`ACCEPT_PAUSE`] instead of retrying at once.

use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::metrics::Metrics;
use crate::{
    health::{Health, NotHealthy},
    stats::Stats,
};

/// Default listen address (`--prometheus-listen`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// Connections served at once; a few Prometheus servers need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// Time from accept to a complete request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Time from accept to the connection's end, response written.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// Pause after a failed accept.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Read buffer per connection (hyper's minimum is 8 KiB); a scrape's head is
/// a few hundred bytes.
const MAX_BUF: usize = 16 * 1024;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The limits of [`serve`], apart so that tests can shorten them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_connections: usize,
    header_timeout: Duration,
    deadline: Duration,
}

const LIMITS: Limits = Limits {
    max_connections: MAX_CONNECTIONS,
    header_timeout: HEADER_TIMEOUT,
    deadline: CONNECTION_DEADLINE,
};

/// Binds `addr` (errors say which address could not be used).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("Prometheus endpoint: cannot listen on {addr}: {e}"))
}

/// Serves scrapes until the task is dropped (which closes every connection).
/// A bad request gets an error status; nothing a client sends can stop the
/// endpoint.
pub async fn serve(listener: TcpListener, metrics: Arc<Mutex<Metrics>>, stats: Arc<Stats>) {
    serve_with(listener, metrics, stats, LIMITS).await;
}

async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Mutex<Metrics>>,
    stats: Arc<Stats>,
    limits: Limits,
) {
    let mut live = Live::default();
    let mut reported = Vec::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Once per errno at warn: EMFILE under a flood would
                // otherwise print ten lines a second.
                let errno = e.raw_os_error();
                if reported.contains(&errno) {
                    tracing::debug!("Prometheus endpoint: accept: {e}");
                } else {
                    reported.push(errno);
                    tracing::warn!("Prometheus endpoint: accept: {e} (pausing {ACCEPT_PAUSE:?})");
                }
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        live.make_room(limits.max_connections).await;
        live.tasks.push_back(tokio::spawn(connection(
            stream,
            Arc::clone(&metrics),
            Arc::clone(&stats),
            limits,
        )));
    }
}

/// The live connections' tasks, oldest first. Dropped with [`serve`]'s task,
/// it closes them all.
#[derive(Default)]
struct Live {
    tasks: VecDeque<JoinHandle<()>>,
    evicted: u64,
}

impl Live {
    /// Forgets finished connections, then closes the oldest until there is
    /// room for one more.
    async fn make_room(&mut self, max: usize) {
        self.tasks.retain(|t| !t.is_finished());
        while self.tasks.len() >= max {
            let Some(oldest) = self.tasks.pop_front() else {
                break;
            };
            oldest.abort();
            // Until the task is dropped its socket is open: waiting keeps the
            // descriptors within the cap. It ends at its next await point.
            let _ = oldest.await;
            self.evicted += 1;
            tracing::debug!(
                "Prometheus endpoint: closed the oldest connection to make room ({} so far)",
                self.evicted
            );
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One connection: one request, then close (no keep-alive), all within the
/// deadline.
async fn connection(
    stream: TcpStream,
    metrics: Arc<Mutex<Metrics>>,
    stats: Arc<Stats>,
    limits: Limits,
) {
    let service = service_fn(move |req: Request<Incoming>| {
        let resp = respond(req.method(), req.uri().path(), &metrics, &stats.health);
        async move { Ok::<_, Infallible>(resp) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(false)
        .max_buf_size(MAX_BUF)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.deadline, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("Prometheus endpoint: {e}"),
        Err(_) => tracing::debug!("Prometheus endpoint: connection past its deadline, closed"),
    }
}

/// GET (or HEAD) /metrics: the text; /healthz and /readyz: 200 "ok" or 503
/// and why; another path: 404; another method: 405.
fn respond(
    method: &Method,
    path: &str,
    metrics: &Mutex<Metrics>,
    health: &Health,
) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let probe = |r: Result<(), NotHealthy>| match r {
        Ok(()) => (StatusCode::OK, TEXT, "ok\n".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{why}\n")),
    };
    let (status, ctype, body) = match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz") => probe(health.live()),
        (&Method::GET | &Method::HEAD, "/readyz") => probe(health.ready()),
        (&Method::GET | &Method::HEAD, "/metrics") => {
            // A panic elsewhere while holding the lock leaves counters that
            // are still worth reading.
            let text = metrics
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .prometheus();
            (StatusCode::OK, CONTENT_TYPE, text)
        }
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "try /metrics, /healthz or /readyz\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            String::new(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn metrics() -> Arc<Mutex<Metrics>> {
        let mut m = Metrics::new(10, 0);
        m.set_counter(
            "observer.events.dropped",
            vec![("stage", "kernel".into())],
            3,
        );
        Arc::new(Mutex::new(m))
    }

    #[test]
    fn statuses_by_method_and_path() {
        let m = metrics();
        let h = Health::default();
        let ok = respond(&Method::GET, "/metrics", &m, &h);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(
            respond(&Method::HEAD, "/metrics", &m, &h).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&Method::GET, "/", &m, &h).status(),
            StatusCode::NOT_FOUND
        );
        // Live before start (nothing stalled), not ready until started and turning.
        assert_eq!(
            respond(&Method::GET, "/healthz", &m, &h).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&Method::GET, "/readyz", &m, &h).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.set_ready();
        h.reader_beat();
        h.correlator_beat();
        assert_eq!(
            respond(&Method::GET, "/readyz", &m, &h).status(),
            StatusCode::OK
        );
        let post = respond(&Method::POST, "/metrics", &m, &h);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
    }

    async fn start(limits: Limits) -> SocketAddr {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve_with(l, metrics(), Arc::default(), limits));
        addr
    }

    /// Reads until the server closes; None if it has not within `within`.
    async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        match tokio::time::timeout(within, s.read_to_end(&mut got)).await {
            Ok(_) => Some(got),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_connection_makes_room() {
        let addr = start(Limits {
            max_connections: 4,
            ..LIMITS
        })
        .await;
        let mut idle = Vec::new();
        for _ in 0..6 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metr").await.unwrap();
            idle.push(s);
        }
        let mut scrape = TcpStream::connect(addr).await.unwrap();
        scrape
            .write_all(b"GET /metrics?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let resp = closed_within(&mut scrape, Duration::from_secs(5))
            .await
            .unwrap();
        let resp = String::from_utf8(resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(resp.contains("connection: close\r\n"), "{resp}");
        assert!(
            resp.contains("observer_events_dropped_total{stage=\"kernel\"} 3"),
            "{resp}"
        );
        // The three oldest made room (for the 5th, the 6th and the scrape);
        // the three newest are still open.
        for s in &mut idle[..3] {
            assert!(closed_within(s, Duration::from_secs(1)).await.is_some());
        }
        for s in &mut idle[3..] {
            assert!(closed_within(s, Duration::from_millis(200)).await.is_none());
        }
    }

    #[tokio::test]
    async fn a_trickling_head_is_cut_off_by_its_timeout_not_reset_by_each_byte() {
        let addr = start(Limits {
            header_timeout: Duration::from_millis(300),
            ..LIMITS
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let t0 = Instant::now();
        let mut buf = [0u8; 64];
        loop {
            assert!(t0.elapsed() < Duration::from_secs(3), "never cut off");
            if s.write_all(b"a").await.is_err() {
                break;
            }
            let read = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                break;
            }
        }
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(250), "cut off after {took:?}");
    }

    #[tokio::test]
    async fn a_connection_ends_at_its_deadline() {
        let addr = start(Limits {
            deadline: Duration::from_millis(300),
            ..LIMITS
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metr").await.unwrap();
        let t0 = Instant::now();
        let closed = closed_within(&mut s, Duration::from_secs(3)).await;
        let took = t0.elapsed();
        assert!(closed.is_some(), "still open after {took:?}");
        assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    }
}
