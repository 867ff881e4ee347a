//! Holds what the observer writes on stderr (the `ready` line, warnings)
//! while the table is on the screen, where it would land in the middle of
//! the table, and writes it out once the terminal is back.

use std::{
    io::{self, BufRead, BufReader},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
};

/// Lines kept at most (the first ones, then a count of the rest).
const KEEP: usize = 1000;

#[derive(Default)]
struct Held {
    lines: Vec<String>,
    more: u64,
}

/// File descriptor 2 pointed at a pipe that a thread of ours reads.
pub struct Capture {
    saved: OwnedFd,
    reader: JoinHandle<()>,
    held: Arc<Mutex<Held>>,
    ready: Arc<AtomicBool>,
}

impl Capture {
    pub fn start() -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both fds were just returned by pipe2 and are ours alone.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: dup of fd 2, which this process holds open.
        let saved = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
        if saved < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd from fcntl, ours alone.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        // SAFETY: dup2 onto fd 2 of a pipe end we own; `write` closes after,
        // leaving fd 2 the only writer.
        if unsafe { libc::dup2(write.as_raw_fd(), 2) } < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(write);
        let held = Arc::new(Mutex::new(Held::default()));
        let ready = Arc::new(AtomicBool::new(false));
        let reader = {
            let held = Arc::clone(&held);
            let ready = Arc::clone(&ready);
            let pipe = std::fs::File::from(read);
            std::thread::Builder::new()
                .name("top-stderr".into())
                .spawn(move || {
                    for line in BufReader::new(pipe).lines() {
                        let Ok(line) = line else { break };
                        if line.starts_with("ready") {
                            ready.store(true, Ordering::Relaxed);
                        }
                        let Ok(mut h) = held.lock() else { break };
                        if h.lines.len() < KEEP {
                            h.lines.push(line);
                        } else {
                            h.more += 1;
                        }
                    }
                })?
        };
        Ok(Self {
            saved,
            reader,
            held,
            ready,
        })
    }

    /// Set once the observer has printed its `ready` line.
    pub fn ready(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ready)
    }

    /// Puts stderr back and returns what was written meanwhile.
    pub fn finish(self) -> Vec<String> {
        // SAFETY: dup2 of the fd saved in `start` back onto fd 2; the pipe's
        // last writer closes with it, so the reader sees its end.
        unsafe { libc::dup2(self.saved.as_raw_fd(), 2) };
        let _ = self.reader.join();
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        let mut lines = held.lines;
        if held.more > 0 {
            lines.push(format!("({} more lines on stderr not kept)", held.more));
        }
        lines
    }
}
