//! What start-up and shutdown need from the process: the signals that stop
//! the observer (caught before anything is attached), and a file descriptor
//! limit fit for per-process probes.

use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

/// Each process with per-call TLS probes holds 8-12 perf event fds; a
/// service manager's default soft limit (1024) would stop at ~100 processes.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("raising the fd limit: {}", std::io::Error::last_os_error());
            }
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, caught from the moment they are installed.
/// SIGHUP too: a terminal closed under `watch` or `top` (or the tmux
/// session it ran in killed) must stop the observer as `q` does, with the
/// processes held at exec resumed, not kill it with them left stopped.
pub struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Stop {
    pub fn install() -> anyhow::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    pub async fn wait(mut self, duration: Option<Duration>) {
        let timer = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
            _ = timer => {}
        }
    }
}
