//! Soak: steady connection churn for a long time, to show that the observer's
//! memory and the kernel map come back to where they started (no leaks).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use super::{
    attach::{Attached, Mode},
    proc::rss_bytes,
};

pub fn run(root: &Path, secs: u64, rate: u64) -> Result<Value> {
    let tool = Attached::start(Mode::Observer, root, &[])?;
    let pid = tool.pid().context("observer pid")?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let done = Arc::new(AtomicBool::new(false));
    let server = {
        let done = Arc::clone(&done);
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
    let total = secs * rate;
    let start = Instant::now();
    let mut rss_early = 0;
    let mut made = 0u64;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = c.read(&mut [0u8; 1]);
            made += 1;
        }
        if rss_early == 0 && start.elapsed() >= Duration::from_secs((secs / 5).clamp(1, 60)) {
            rss_early = rss_bytes(pid);
        }
        if i % (rate * 60) == 0 && i > 0 {
            eprintln!(
                "bench: soak {:>5.0}s  rss {} bytes",
                start.elapsed().as_secs_f64(),
                rss_bytes(pid)
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = server.join();
    std::thread::sleep(Duration::from_secs(2));
    let rss_end = rss_bytes(pid);
    let summary = tool.stop()?.context("observer summary")?;
    let dropped = super::attach::total_dropped(&summary);
    let change = if rss_early > 0 {
        (rss_end as f64 - rss_early as f64) / rss_early as f64 * 100.0
    } else {
        0.0
    };
    eprintln!("bench: soak done: {made} connections, rss {rss_early} -> {rss_end} ({change:+.1}%)");
    Ok(json!({
        "name": "soak",
        "seconds": secs,
        "rate": rate,
        "connections": made,
        "rss_early_bytes": rss_early,
        "rss_end_bytes": rss_end,
        "rss_change_pct": change,
        "kernel_tracked_at_stop": summary["kernel_tracked_at_stop"],
        "events": summary["events"],
        "dropped": dropped,
        "dropped_detail": summary["dropped"],
    }))
}
