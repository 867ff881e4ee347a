//! Ctrl-C and SIGTERM detach cleanly: no eBPF program of ours stays loaded.
//! One test in this binary on purpose: cargo runs test binaries one at a time,
//! so no other observer of this suite is running while it counts programs.

use tests::*;

/// Our programs (the kernel keeps the first 15 bytes of each name).
const NAMES: &[&str] = &[
    "inet_sock_set_state",
    "sock_send_length",
    "sock_recv_length",
    "tcp_retransmit_skb",
    "tcp_receive_reset",
    "tcp_send_reset",
    "tcp_destroy_sock",
    "sched_process_exec",
    "sched_process_exit",
    "tls_handshake",
    "tls_handshake_ret",
    "tls_read",
    "tls_write",
    "ssl_read_ex",
    "ssl_write_ex",
    "tls_rw_ret",
    "tls_free",
    "ssl_session_begin",
    "ssl_ctrl",
    "ssl_set_host_name",
    "gnutls_server_name_set",
    "getaddrinfo",
    "getaddrinfo_ret",
];

fn loaded() -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            let name = p.name_as_str().unwrap_or("");
            NAMES.iter().any(|n| &n[..n.len().min(15)] == name)
        })
        .count()
}

/// The count once it has stayed the same for 300 ms (at most 5 s).
fn settled() -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = loaded();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = loaded();
        if now == last || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[test]
fn signals_detach_every_program() {
    if !require_root("detach") {
        return;
    }
    // Programs of observers that just exited (the previous test binaries')
    // are freed after an RCU grace period: start from a settled count.
    let before = settled();
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let w = Watch::start(&[]);
        assert_eq!(
            loaded(),
            before + NAMES.len(),
            "programs are loaded while watching"
        );
        let out = w.stop_with(signal);
        assert!(
            out.stderr.iter().any(|l| l.starts_with("summary")),
            "{:?}",
            out.stderr
        );
        // The kernel frees a program once its last link and fd are gone, after
        // an RCU grace period: allow it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while loaded() != before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            loaded(),
            before,
            "after signal {signal} nothing is left loaded"
        );
    }
}
