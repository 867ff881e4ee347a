//! The daemon as deployed, for the bench: `observer run` sends its spans and
//! metrics to an OTLP/HTTP receiver that reads every byte (a collector's
//! cheapest possible stand-in: what the observer pays to build, encode and
//! send them is all there), and Prometheus-style scrapes read its metrics
//! endpoint every `SCRAPE_EVERY` while the load runs.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};

/// Prometheus' usual interval is 15-60 s; scraping far more often keeps the
/// endpoint's cost visible in 6-10 s rounds.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(2);

/// What the receiver and the scraper saw during one round.
#[derive(Debug, Default, Clone, Copy)]
pub struct Consumed {
    pub otlp_bytes: u64,
    pub scrapes: u64,
}

#[derive(Default)]
struct Counts {
    otlp_bytes: AtomicU64,
    scrapes: AtomicU64,
}

/// The receiver and scraper of one observer run; both stop when dropped.
pub struct Daemon {
    pub otlp_port: u16,
    pub prometheus_port: u16,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    scraper: Option<JoinHandle<()>>,
}

impl Daemon {
    pub fn start() -> Result<Daemon> {
        let listener = TcpListener::bind("127.0.0.1:0").context("OTLP receiver")?;
        let otlp_port = listener.local_addr()?.port();
        // A port that is free now, for the observer's Prometheus endpoint.
        let prometheus_port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&counts), Arc::clone(&stop));
        listener.set_nonblocking(true)?;
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let c = Arc::clone(&c);
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false).and_then(|()| receive(conn, &c));
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Daemon {
            otlp_port,
            prometheus_port,
            counts,
            stop,
            scraper: None,
        })
    }

    /// The flags and environment `observer run` gets.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--prometheus-listen".into(),
            format!("127.0.0.1:{}", self.prometheus_port),
        ]
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{}", self.otlp_port),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
        ]
    }

    /// Scrapes until dropped (from when the observer is ready).
    pub fn start_scraping(&mut self) {
        let (c, stop, port) = (
            Arc::clone(&self.counts),
            Arc::clone(&self.stop),
            self.prometheus_port,
        );
        self.scraper = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // An empty answer is no scrape (the endpoint was not up).
                if scrape(port).is_ok_and(|n| n > 0) {
                    c.scrapes.fetch_add(1, Ordering::Relaxed);
                }
                let mut slept = Duration::ZERO;
                while slept < SCRAPE_EVERY && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    slept += Duration::from_millis(50);
                }
            }
        }));
    }

    /// The gauges of the observer's metrics whose Prometheus name starts
    /// with `prefix`, by their one label's value
    /// (`observer_tables_entries{table="connections"} 12` -> ("connections", 12)).
    pub fn gauges(&self, prefix: &str) -> Vec<(String, f64)> {
        let Ok(body) = scrape_body(self.prometheus_port) else {
            return Vec::new();
        };
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| l.strip_prefix(prefix)?.strip_prefix('{'))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once("} ")?;
                let label = labels.split_once("=\"")?.1.split('"').next()?;
                Some((label.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }

    pub fn consumed(&self) -> Consumed {
        let c = &self.counts;
        Consumed {
            otlp_bytes: c.otlp_bytes.load(Ordering::Relaxed),
            scrapes: c.scrapes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.scraper.take() {
            let _ = t.join();
        }
    }
}

/// HTTP/1.1 keep-alive: every request's body read whole, answered 200 with
/// an empty protobuf message (a valid Export*ServiceResponse).
fn receive(conn: TcpStream, counts: &Counts) -> std::io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let (mut length, mut chunked) = (0usize, false);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if h.starts_with("transfer-encoding:") && h.contains("chunked") {
                chunked = true;
            }
        }
        let body = if chunked {
            read_chunked(&mut r)?
        } else {
            let mut b = vec![0; length];
            r.read_exact(&mut b)?;
            b.len()
        };
        counts.otlp_bytes.fetch_add(body as u64, Ordering::Relaxed);
        w.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )?;
    }
}

fn read_chunked(r: &mut impl BufRead) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let mut size = String::new();
        r.read_line(&mut size)?;
        let n =
            usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
        let mut b = vec![0; n + 2];
        r.read_exact(&mut b)?;
        total += n;
        if n == 0 {
            return Ok(total);
        }
    }
}

/// One GET /metrics, read to the end; the body's length.
fn scrape(port: u16) -> std::io::Result<u64> {
    Ok(scrape_body(port)?.len() as u64)
}

/// One GET /metrics, read to the end (the answer's head included).
fn scrape_body(port: u16) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    Ok(body)
}
