//! The soak's traffic: every kind the observer follows, at steady rates
//! the 2-CPU machine carries beside the daemon, for the soak's whole length:
//! - connection churn (plain TCP, a new connection per exchange);
//! - fresh curl processes, each with its own first TLS handshake (the
//!   per-process probes attached anew every time): HTTP/1.1 over TLS,
//!   HTTP/2 over TLS and plain HTTP, three requests on one connection each;
//! - wrk keeping two TLS connections busy (requests on kept-alive
//!   connections, paced by bench/pace.lua);
//! - DNS lookups over UDP to a responder on 127.0.0.2:53, each of a name of
//!   its own (the observer's name caches and series meet their caps).

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket},
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use super::{
    load::{self, WrkResult},
    nginx::{H2_PORT, HTTPS_PORT, HTTP_PORT},
};

/// Where the soak's DNS responder listens: loopback, port 53 (the observer
/// reads DNS on port 53), away from a local stub resolver's 127.0.0.53.
const DNS_ADDR: (Ipv4Addr, u16) = (Ipv4Addr::new(127, 0, 0, 2), 53);
/// Lookups a second.
const DNS_RATE: u64 = 20;
/// A curl process every this often (five a second).
const CURL_EVERY: Duration = Duration::from_millis(200);

/// What the traffic did, by its own count.
#[derive(Default)]
pub struct Counts {
    pub connections: AtomicU64,
    pub connections_failed: AtomicU64,
    pub curl_ok: AtomicU64,
    pub curl_failed: AtomicU64,
    pub dns_answered: AtomicU64,
    pub dns_unanswered: AtomicU64,
}

/// The running traffic; `finish` stops it and says what it did.
pub struct Traffic {
    done: Arc<AtomicBool>,
    /// The servers stop after the clients, so that no last exchange is cut
    /// short and counted as the traffic's failure.
    servers_done: Arc<AtomicBool>,
    counts: Arc<Counts>,
    clients: Vec<JoinHandle<()>>,
    servers: Vec<JoinHandle<()>>,
    wrk: JoinHandle<Result<WrkResult>>,
}

impl Traffic {
    /// Starts every kind, for `secs` seconds (wrk's own length).
    pub fn start(root: &Path, secs: u64, churn_rate: u64) -> Result<Traffic> {
        let done = Arc::new(AtomicBool::new(false));
        let servers_done = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let dns = UdpSocket::bind(DNS_ADDR).context(
            "the soak's DNS responder could not bind 127.0.0.2:53 (as root, with nothing else there)",
        )?;
        dns.set_read_timeout(Some(Duration::from_millis(100)))?;
        let (churn_server, churn) = spawn_churn(&done, &servers_done, &counts, churn_rate)?;
        let servers = vec![
            spawn_dns_responder(dns, Arc::clone(&servers_done)),
            churn_server,
        ];
        let clients = vec![
            spawn_loop(&done, &counts, dns_lookup, DNS_RATE),
            churn,
            spawn_curls(&done, &counts),
        ];
        let pace = root.join("bench/pace.lua");
        let wrk = std::thread::spawn(move || {
            let url = format!("https://127.0.0.1:{HTTPS_PORT}/");
            load::wrk(&url, secs, 2, false, Some(&pace))
        });
        Ok(Traffic {
            done,
            servers_done,
            counts,
            clients,
            servers,
            wrk,
        })
    }

    /// Stops the traffic (wrk ends by itself at the soak's end) and reports
    /// what each kind did.
    pub fn finish(self) -> Result<Value> {
        self.done.store(true, Ordering::Relaxed);
        for t in self.clients {
            let _ = t.join();
        }
        self.servers_done.store(true, Ordering::Relaxed);
        for t in self.servers {
            let _ = t.join();
        }
        let wrk = self
            .wrk
            .join()
            .map_err(|_| anyhow::anyhow!("wrk thread panicked"))??;
        let c = &self.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Ok(json!({
            "connections": n(&c.connections),
            "connections_failed": n(&c.connections_failed),
            "curl_processes_ok": n(&c.curl_ok),
            "curl_processes_failed": n(&c.curl_failed),
            "dns_answered": n(&c.dns_answered),
            "dns_unanswered": n(&c.dns_unanswered),
            "wrk_requests": wrk.requests,
            "wrk_errors": wrk.errors,
        }))
    }
}

/// Runs `one(counts, i)` `rate` times a second, on its own clock, until done.
fn spawn_loop(
    done: &Arc<AtomicBool>,
    counts: &Arc<Counts>,
    one: impl Fn(&Counts, u64) + Send + 'static,
    rate: u64,
) -> JoinHandle<()> {
    let (done, counts) = (Arc::clone(done), Arc::clone(counts));
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut i = 0u64;
        while !done.load(Ordering::Relaxed) {
            let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            one(&counts, i);
            i += 1;
        }
    })
}

/// A server that accepts and answers one byte, and the churn that connects
/// to it `rate` times a second: (server, client).
fn spawn_churn(
    done: &Arc<AtomicBool>,
    servers_done: &Arc<AtomicBool>,
    counts: &Arc<Counts>,
    rate: u64,
) -> Result<(JoinHandle<()>, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let server = {
        let done = Arc::clone(servers_done);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.write_all(b"k");
                    }
                    Err(_) => std::thread::sleep(Duration::from_micros(200)),
                }
            }
        })
    };
    let client = spawn_loop(
        done,
        counts,
        move |c, _| {
            let ok = TcpStream::connect(("127.0.0.1", port))
                .and_then(|mut s| s.read(&mut [0u8; 1]))
                .is_ok_and(|n| n == 1);
            let counter = if ok {
                &c.connections
            } else {
                &c.connections_failed
            };
            counter.fetch_add(1, Ordering::Relaxed);
        },
        rate,
    );
    Ok((server, client))
}

/// A curl process every `CURL_EVERY`, in turn HTTP/1.1 over TLS, HTTP/2
/// over TLS and plain HTTP, three requests each on one connection; a
/// process counts as ok when all three answered 200.
fn spawn_curls(done: &Arc<AtomicBool>, counts: &Arc<Counts>) -> JoinHandle<()> {
    let rate = (1.0 / CURL_EVERY.as_secs_f64()) as u64;
    spawn_loop(
        done,
        counts,
        |c, i| {
            let (flag, url) = match i % 3 {
                0 => ("--http1.1", format!("https://127.0.0.1:{HTTPS_PORT}/")),
                1 => ("--http2", format!("https://127.0.0.1:{H2_PORT}/")),
                _ => ("--http1.1", format!("http://127.0.0.1:{HTTP_PORT}/")),
            };
            let out = Command::new("curl")
                .args(["-sk", flag, "-o", "/dev/null", "-w", "%{http_code}\\n"])
                .args([&url, &url, &url])
                .stderr(Stdio::null())
                .output();
            let ok =
                out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).matches("200").count() == 3);
            let counter = if ok { &c.curl_ok } else { &c.curl_failed };
            counter.fetch_add(1, Ordering::Relaxed);
        },
        rate,
    )
}

/// One lookup of a name of its own (so no cache anywhere answers it), from a
/// fresh socket as a stub resolver does; answered within a second or not.
fn dns_lookup(c: &Counts, i: u64) {
    let answered = (|| -> std::io::Result<bool> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let id = (i & 0xffff) as u16;
        s.send_to(&dns_query(id, &format!("soak-{i}.example")), DNS_ADDR)?;
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf)?;
        Ok(n >= 12 && buf[..2] == id.to_be_bytes() && buf[3] & 0x0f == 0)
    })()
    .unwrap_or(false);
    let counter = if answered {
        &c.dns_answered
    } else {
        &c.dns_unanswered
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A standard query (recursion desired) for `name`'s A record.
fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(32 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Answers every query with one A record, until done: an address of
/// TEST-NET-1 (192.0.2.0/24) that nothing connects to, so that the names do
/// not become the server names of the soak's own connections.
fn spawn_dns_responder(sock: UdpSocket, done: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !done.load(Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            if n < 12 {
                continue;
            }
            let mut a = buf[..n].to_vec();
            a[2] = 0x81; // a response, recursion desired
            a[3] = 0x80; // recursion available, no error
            a[6..8].copy_from_slice(&1u16.to_be_bytes()); // one answer
                                                          // The answer: a pointer to the question's name, A, IN, TTL 60,
                                                          // four bytes of address.
            let host = 1 + buf[1] % 250;
            a.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, host]);
            let _ = sock.send_to(&a, from);
        }
    })
}
