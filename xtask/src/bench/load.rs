//! Load generators: wrk for HTTP(S) request rates and latency percentiles, and
//! a flood of idle connections made here.

use std::{
    net::{TcpListener, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// What one wrk run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct WrkResult {
    pub rps: f64,
    pub requests: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

/// "170.00us" / "1.20ms" / "2.00s" -> microseconds.
fn micros(v: &str) -> Option<f64> {
    let (num, mult) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|x| x * mult)
}

pub fn parse_wrk(out: &str) -> Result<WrkResult> {
    let mut r = WrkResult::default();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["Requests/sec:", v] => r.rps = v.parse()?,
            ["50%", v] => r.p50_us = micros(v).context("p50")?,
            ["99%", v] => r.p99_us = micros(v).context("p99")?,
            [n, "requests", "in", ..] => r.requests = n.parse()?,
            ["Socket", "errors:", rest @ ..] => {
                r.errors += rest
                    .iter()
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => r.errors += n.parse::<u64>()?,
            _ => {}
        }
    }
    if r.rps == 0.0 {
        bail!("wrk printed no rate:\n{out}");
    }
    Ok(r)
}

/// Runs wrk against `url` for `secs` seconds with `conns` connections on one
/// thread; `close` sends `Connection: close` so every request is a new connection.
pub fn wrk(url: &str, secs: u64, conns: u32, close: bool) -> Result<WrkResult> {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t1",
        "-c",
        &conns.to_string(),
        "-d",
        &format!("{secs}s"),
        "--latency",
    ]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    let out = cmd.arg(url).output().context("running wrk")?;
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

/// Raises the open-file limit for this process (root may go up to fs.nr_open).
pub fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit with a valid struct; failure just leaves the old limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// Opens `n` idle connections to listeners of our own (spread over several ports
/// so the ephemeral port range is no limit) and holds them until dropped.
pub struct Flood {
    _listeners: Vec<TcpListener>,
    _client: Vec<TcpStream>,
    _server: Vec<TcpStream>,
    pub open_seconds: f64,
}

pub fn flood(n: usize) -> Result<Flood> {
    raise_nofile(4 * n as u64 + 1024);
    let ports = n / 20_000 + 1;
    let listeners: Vec<TcpListener> = (0..ports)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let addrs: Vec<_> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<_>>()?;
    let t0 = Instant::now();
    let mut client = Vec::with_capacity(n);
    let mut server = Vec::with_capacity(n);
    for i in 0..n {
        let c = TcpStream::connect(addrs[i % ports])
            .with_context(|| format!("connection {i} of the flood"))?;
        let (s, _) = listeners[i % ports].accept()?;
        client.push(c);
        server.push(s);
    }
    let open_seconds = t0.elapsed().as_secs_f64();
    Ok(Flood {
        _listeners: listeners,
        _client: client,
        _server: server,
        open_seconds,
    })
}

/// Settles the machine between runs.
pub fn pause() {
    std::thread::sleep(Duration::from_millis(500));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_output() {
        let out = "Running 5s test @ https://127.0.0.1:18443/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   190.07us   50.00us   2.00ms   90.00%
  Latency Distribution
     50%  170.00us
     75%  200.00us
     90%  250.00us
     99%    1.20ms
  456789 requests in 5.00s, 60.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  91357.80
Transfer/sec:     12.00MB
";
        let r = parse_wrk(out).expect("parses");
        assert_eq!(r.rps, 91357.80);
        assert_eq!(r.p50_us, 170.0);
        assert_eq!(r.p99_us, 1200.0);
        assert_eq!(r.requests, 456789.0);
        assert_eq!(r.errors, 3);
        assert!(parse_wrk("nothing").is_err());
    }
}
