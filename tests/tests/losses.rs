//! Nothing is lost silently: when the reader cannot keep up, the kernel's
//! ring-buffer drop counter says so.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
};

use tests::*;

#[test]
fn a_full_ring_buffer_is_counted_as_dropped() {
    if !require_root("ring_full") {
        return;
    }
    const N: usize = 200;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // One page of ring: room for a few dozen records.
    let watch = Watch::start(&["--port", &port.to_string(), "--ring-bytes", "4096"]);
    // Freeze the observer so nothing drains the ring while traffic flows.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(watch.pid() as i32, libc::SIGSTOP) };
    for _ in 0..N {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        c.write_all(b"x").unwrap();
        s.write_all(b"y").unwrap();
    }
    // SAFETY: as above.
    unsafe { libc::kill(watch.pid() as i32, libc::SIGCONT) };
    let out = watch.stop();
    let s = out.summary();
    let lost = s["dropped"]["kernel_ring"].as_u64().unwrap();
    assert!(
        lost > 0,
        "a 4 KiB ring cannot hold {N} connections' events: {s}"
    );
    assert!(out.records.len() < 2 * N, "{} records", out.records.len());
    // Every event the ring refused is counted: each record missing its close
    // event lost at least that one.
    let shown = out
        .records
        .iter()
        .filter(|r| r["state"] == "closed")
        .count() as u64;
    assert!(
        shown + lost >= 2 * N as u64,
        "{shown} closed records + {lost} dropped < {}",
        2 * N
    );
    assert!(out.stderr.iter().any(|l| l.starts_with("summary")));
}
