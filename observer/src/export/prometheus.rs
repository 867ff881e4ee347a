//! The Prometheus text endpoint (`GET /metrics`), rendered from the shared
//! metrics on each scrape.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::metrics::Metrics;

/// Default listen address (`--prometheus-listen`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// Binds `addr` (errors say which address could not be used).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("Prometheus endpoint: cannot listen on {addr}: {e}"))
}

/// Serves scrapes until the task is dropped. A bad request gets an error
/// status; nothing a client sends can stop the endpoint.
pub async fn serve(listener: TcpListener, metrics: Arc<Mutex<Metrics>>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            // Read the request head (bounded); bodies are not expected.
            while n < buf.len() {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    sock.read(&mut buf[n..]),
                )
                .await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(k)) => {
                        n += k;
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let line = head.lines().next().unwrap_or("");
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let path = path.split('?').next().unwrap_or("");
            let (status, ctype, body) = match (method, path) {
                ("GET", "/metrics") => {
                    let text = metrics.lock().map(|m| m.prometheus()).unwrap_or_default();
                    ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text)
                }
                ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".to_owned()),
                _ => ("405 Method Not Allowed", "text/plain", String::new()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
