//! Userspace half of holding a new executable's first process at exec (see
//! `observer_common::hold`): a thread wakes at each hold and hands it to the
//! manager, which looks at the file (a Go executable gets its probes),
//! remembers it in the kernel and resumes the process.
//!
//! Nobody stays stopped: the kernel holds only while the manager keeps
//! `HOLD_UNTIL` ahead of the clock (a stalled manager holds nobody within
//! [`BEAT_AHEAD`]); at a stop, holding ends first and every held process is
//! resumed. A process held when the observer was killed (SIGKILL) stays
//! stopped until the next observer starts: it resumes every process stopped
//! at the end of an exec ([`resume_left_behind`]).

use std::{
    os::fd::{AsFd, AsRawFd},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{SyncSender, TrySendError},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, RingBuf};
use observer_common::hold::{ExeKey, HoldEvent, EXE_KNOWN_MAP, HOLDS_RING, HOLD_UNTIL_MAP};

use super::command::Command;
use crate::{ebpf::Probes, libraries::procmaps::FileId};

/// How far ahead of the clock the manager keeps `HOLD_UNTIL`.
const BEAT_AHEAD: Duration = Duration::from_secs(2);
/// How often it moves it.
const BEAT_EVERY: Duration = Duration::from_millis(250);
/// The reader's poll timeout: how soon it sees a stop.
const POLL_MS: i32 = 50;

/// Why new executables are not held at exec (the report's `off_reason`).
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// The object lacks the map, or it is not of the kind expected (a build
    /// mismatch), or it was taken already.
    #[error("no {0} map")]
    NoMap(&'static str),
    /// Likewise for the ring the kernel sends holds through.
    #[error("no {0} ring")]
    NoRing(&'static str),
    /// The reader thread could not be started.
    #[error("starting the hold reader: {0}")]
    Reader(#[source] std::io::Error),
}

pub struct Holds {
    known: BpfHashMap<MapData, ExeKey, u8>,
    until: Array<MapData, u64>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    last_beat: Option<Instant>,
}

impl Holds {
    /// Takes the maps and starts the reader, which forwards each hold to
    /// `tx`. An error: nothing is held (reported by the caller).
    pub fn start(probes: &mut Probes, tx: SyncSender<Command>) -> Result<Self, HoldError> {
        let ebpf = &mut probes.ebpf;
        let known = ebpf
            .take_map(EXE_KNOWN_MAP)
            .and_then(|m| BpfHashMap::try_from(m).ok())
            .ok_or(HoldError::NoMap(EXE_KNOWN_MAP))?;
        let until = ebpf
            .take_map(HOLD_UNTIL_MAP)
            .and_then(|m| Array::try_from(m).ok())
            .ok_or(HoldError::NoMap(HOLD_UNTIL_MAP))?;
        let ring = ebpf
            .take_map(HOLDS_RING)
            .and_then(|m| RingBuf::try_from(m).ok())
            .ok_or(HoldError::NoRing(HOLDS_RING))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let reader = std::thread::Builder::new()
            .name("exec-holds".into())
            .spawn(move || read_holds(ring, &tx, &flag))
            .map_err(HoldError::Reader)?;
        Ok(Self {
            known,
            until,
            stop,
            reader: Some(reader),
            last_beat: None,
        })
    }

    /// Keeps holding on while the manager runs.
    pub fn beat(&mut self) {
        let now = Instant::now();
        if self.last_beat.is_some_and(|t| now - t < BEAT_EVERY) {
            return;
        }
        self.last_beat = Some(now);
        let until = crate::clock::monotonic_ns() + BEAT_AHEAD.as_nanos() as u64;
        if let Err(e) = self.until.set(0, until, 0) {
            tracing::warn!("exec holds: {e}");
        }
    }

    /// A file looked at, as stat named it: its first processes pass.
    pub fn know_file(&mut self, id: FileId) {
        self.know(exe_key(id));
    }

    /// A file whose processes must be held again: a Go executable made
    /// per process, whose new processes need probes of their own before
    /// they run.
    pub fn forget_file(&mut self, id: FileId) {
        let _ = self.known.remove(&exe_key(id));
    }

    /// A file looked at, as the kernel named it.
    pub fn know(&mut self, exe: ExeKey) {
        let _ = self.known.insert(exe, 1, 0);
    }

    /// Ends holding, then resumes whoever the reader still had.
    pub fn stop(mut self) {
        let _ = self.until.set(0, 0, 0);
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Resumes a held process (gone already: nothing to do).
pub fn resume(pid: u32) {
    // SAFETY: kill(2) with a pid and a signal number; no memory involved.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGCONT);
    }
}

/// Resumes the processes a killed observer left held: stopped (state T,
/// not traced) with one of their threads on its way out of execve or mmap,
/// which is where a hold stops them and where nobody else's SIGSTOP lands
/// short of a race with the call. (A multi-threaded program is held at an
/// mmap of any of its threads: rustc's were left stopped when only the main
/// thread's call was looked at.)
pub fn resume_left_behind(proc_root: &Path) -> u64 {
    let Ok(pids) = crate::libraries::discovery::running_pids(proc_root, std::process::id()) else {
        return 0;
    };
    let mut resumed = 0;
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        let stopped =
            std::fs::read_to_string(dir.join("stat")).is_ok_and(|s| state_of(&s) == Some('T'));
        if stopped && a_thread_in_held_call(&dir) {
            tracing::info!("exec hold: pid {pid} was left stopped at exec or mmap; resumed");
            resume(pid);
            resumed += 1;
        }
    }
    resumed
}

/// The state letter of a /proc/PID/stat line (after the command's ")").
fn state_of(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The calls a hold stops a task on its way out of: execve, execveat, mmap.
#[cfg(target_arch = "x86_64")]
const HELD_CALLS: &[&str] = &["59", "322", "9"];
#[cfg(target_arch = "aarch64")]
const HELD_CALLS: &[&str] = &["221", "281", "222"];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const HELD_CALLS: &[&str] = &[];

/// Whether a thread of the process at /proc/PID `dir` is in one of
/// [`HELD_CALLS`].
fn a_thread_in_held_call(dir: &Path) -> bool {
    let held =
        |task: &Path| std::fs::read_to_string(task.join("syscall")).is_ok_and(|s| in_held_call(&s));
    match std::fs::read_dir(dir.join("task")) {
        Ok(tasks) => tasks.flatten().any(|t| held(&t.path())),
        Err(_) => held(dir),
    }
}

/// /proc/PID/syscall of a task stopped in one of [`HELD_CALLS`].
fn in_held_call(syscall: &str) -> bool {
    syscall
        .split_whitespace()
        .next()
        .is_some_and(|nr| HELD_CALLS.contains(&nr))
}

/// A file as stat named it, as the kernel names it (`ExeKey`).
fn exe_key(id: FileId) -> ExeKey {
    ExeKey {
        ino: id.1,
        dev: kernel_dev(id.0),
        _pad: 0,
    }
}

/// stat's st_dev to the kernel's dev_t (major << 20 | minor).
fn kernel_dev(dev: u64) -> u32 {
    (libc::major(dev) << 20) | libc::minor(dev)
}

fn read_holds(mut ring: RingBuf<MapData>, tx: &SyncSender<Command>, stop: &AtomicBool) {
    let fd = ring.as_fd().as_raw_fd();
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if stopping {
            // A program past its check when holding ended may still be
            // writing its record.
            std::thread::sleep(Duration::from_millis(10));
        }
        while let Some(item) = ring.next() {
            let Some(ev) = decode(&item) else { continue };
            if stopping {
                resume(ev.pid);
                continue;
            }
            match tx.try_send(Command::Held(ev)) {
                Ok(()) => {}
                Err(TrySendError::Full(Command::Held(ev))) => {
                    tracing::warn!(
                        "exec holds: the manager is behind; pid {} resumed unprobed",
                        ev.pid
                    );
                    resume(ev.pid);
                }
                Err(_) => resume(ev.pid),
            }
        }
        if stopping {
            return;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call's duration.
        unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
    }
}

fn decode(bytes: &[u8]) -> Option<HoldEvent> {
    if bytes.len() < std::mem::size_of::<HoldEvent>() {
        return None;
    }
    // SAFETY: the length is checked; HoldEvent is plain integers (repr(C)).
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<HoldEvent>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dev_numbers() {
        // /dev/sda1 is 8:1; a device-mapper volume 254:3; NVMe partitions
        // have minors past 255.
        assert_eq!(kernel_dev(libc::makedev(8, 1)), (8 << 20) | 1);
        assert_eq!(kernel_dev(libc::makedev(254, 3)), (254 << 20) | 3);
        assert_eq!(kernel_dev(libc::makedev(259, 300)), (259 << 20) | 300);
    }

    #[test]
    fn stopped_at_exec() {
        assert_eq!(state_of("12 (a (b) c) T 1 12 12 0"), Some('T'));
        assert_eq!(state_of("12 (cat) S 1"), Some('S'));
        assert_eq!(state_of("garbage"), None);
        assert!(in_held_call("59 0x0 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x401000"));
        assert!(in_held_call("9 0x0 0x1000 0x5 0x802 0x3 0x0 0x7ffd 0x7f12"));
        assert!(!in_held_call(
            "0 0x3 0x7ffd 0x1000 0x0 0x0 0x0 0x7ffd 0x7f12"
        ));
        assert!(!in_held_call("running"));
    }
}
