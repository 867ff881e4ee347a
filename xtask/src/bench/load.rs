//! Load generators: wrk for HTTP(S) request rates and latency percentiles, and
//! a flood of idle connections made here.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
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
/// `pace`: a wrk script that slows each connection (see bench/pace.lua).
pub fn wrk(
    url: &str,
    secs: u64,
    conns: u32,
    close: bool,
    pace: Option<&std::path::Path>,
) -> Result<WrkResult> {
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
    if let Some(script) = pace {
        cmd.arg("-s").arg(script);
    }
    let out = cmd.arg(url).output().context("running wrk")?;
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

/// h2load (nghttp2-client): "finished in 4.00s, 52161.50 req/s, ...",
/// "requests: N total, N started, N done, N succeeded, N failed, N errored,
/// ..." and "time for request: MIN MAX MEAN SD +/-SD". It gives no
/// percentiles: the mean stands in p50's place, p99 is left 0.
pub fn parse_h2load(out: &str) -> Result<WrkResult> {
    let mut r = WrkResult::default();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["finished", "in", _, rate, "req/s,", ..] => r.rps = rate.parse()?,
            ["requests:", total, "total,", rest @ ..] => {
                r.requests = total.parse()?;
                for pair in rest.chunks(2) {
                    if let [n, "failed," | "errored," | "timeout"] = pair {
                        r.errors += n.parse::<u64>().unwrap_or(0);
                    }
                }
            }
            ["time", "for", "request:", _min, _max, mean, ..] => {
                r.p50_us = micros(mean).context("mean")?;
            }
            _ => {}
        }
    }
    if r.rps == 0.0 {
        bail!("h2load printed no rate:\n{out}");
    }
    Ok(r)
}

/// Runs h2load against `url` (HTTP/2 over TLS) for `secs` seconds with
/// `conns` connections on one thread, `streams` concurrent streams each.
pub fn h2load(url: &str, secs: u64, conns: u32, streams: u32) -> Result<WrkResult> {
    let out = Command::new("h2load")
        .args(["-t1", "-c", &conns.to_string(), "-m", &streams.to_string()])
        .args(["-D", &secs.to_string()])
        .arg(url)
        .output()
        .context("running h2load")?;
    parse_h2load(&String::from_utf8_lossy(&out.stdout))
}

/// Connections one holder process keeps: each holds one fd per connection,
/// and the hard open-file limit here (20,000) may not be raised.
const PER_HOLDER: usize = 8_000;

/// Idle connections held open by helper processes (`xtask flood-hold`): pairs
/// of a server that accepts and a client that connects, each pair on its own
/// port, so neither the per-process fd limit nor the ephemeral port range
/// caps the flood.
pub struct Flood {
    children: Vec<Child>,
    pub open_seconds: f64,
}

fn read_line(child: &mut Child) -> Result<String> {
    let out = child.stdout.as_mut().context("holder stdout")?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while out.read(&mut byte)? == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn holder(args: &[String]) -> Result<Child> {
    Command::new(std::env::current_exe()?)
        .arg("flood-hold")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting a flood holder")
}

pub fn flood(n: usize) -> Result<Flood> {
    let t0 = Instant::now();
    let mut children = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(PER_HOLDER);
        left -= k;
        let mut server = holder(&["serve".into(), k.to_string()])?;
        let port = read_line(&mut server)?;
        let mut client = holder(&["connect".into(), k.to_string(), port.clone()])?;
        for c in [&mut client, &mut server] {
            let l = read_line(c)?;
            if l != "READY" {
                bail!("flood holder said {l:?}");
            }
        }
        children.push(server);
        children.push(client);
    }
    Ok(Flood {
        children,
        open_seconds: t0.elapsed().as_secs_f64(),
    })
}

impl Drop for Flood {
    fn drop(&mut self) {
        // Closing their stdin tells the holders to exit.
        for c in &mut self.children {
            drop(c.stdin.take());
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// The holder process: `serve K` accepts K connections on a fresh port (printed
/// first), `connect K PORT` opens K; both print READY and hold until stdin closes.
pub fn hold(args: &[String]) -> Result<()> {
    let mut out = std::io::stdout();
    let mut held = Vec::new();
    match args {
        [mode, k] if mode == "serve" => {
            let k: usize = k.parse()?;
            let l = TcpListener::bind("127.0.0.1:0")?;
            // A deep accept queue (std listens with 128): with a short one the
            // client outruns accept(), SYNs are dropped and retried after 1 s.
            // SAFETY: listen(2) again on our own listening socket only resizes
            // its queue.
            unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&l), 8192) };
            writeln!(out, "{}", l.local_addr()?.port())?;
            out.flush()?;
            for _ in 0..k {
                held.push(l.accept()?.0);
            }
        }
        [mode, k, port] if mode == "connect" => {
            let (k, port): (usize, u16) = (k.parse()?, port.parse()?);
            for _ in 0..k {
                held.push(TcpStream::connect(("127.0.0.1", port))?);
            }
        }
        _ => bail!("usage: flood-hold serve K | connect K PORT"),
    }
    writeln!(out, "READY")?;
    out.flush()?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(held);
    Ok(())
}

/// Settles the machine between runs.
pub fn pause() {
    std::thread::sleep(Duration::from_millis(500));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2load_output() {
        let out = "finished in 4.00s, 52161.50 req/s, 1.69MB/s\n\
requests: 208646 total, 208806 started, 208646 done, 208640 succeeded, 6 failed, 0 errored, 0 timeout\n\
                     min         max         mean         sd        +/- sd\n\
time for request:      182us     13.63ms      2.91ms       978us    71.74%\n";
        let r = parse_h2load(out).expect("parsed");
        assert_eq!((r.rps, r.requests, r.errors), (52161.5, 208646.0, 6));
        assert!((r.p50_us - 2910.0).abs() < 1e-6);
    }

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
