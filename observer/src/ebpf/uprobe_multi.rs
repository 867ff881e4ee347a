//! Uprobes as uprobe-multi links (`BPF_LINK_CREATE` with
//! `BPF_TRACE_UPROBE_MULTI`, Linux 6.6+), where the kernel has them.
//!
//! aya 0.14 attaches a uprobe through a perf event. Closing one waits for
//! RCU grace periods while holding the kernel's trace-event mutex, about
//! 100 ms here, one close after another: the observer's 41 library-wide
//! probes took 4.3 s to stop, and taking a busy process's probes off stalled
//! every other attach meanwhile. A uprobe-multi link has no perf event: its
//! close waits one grace period (~30 ms) without that lock, so closes made
//! side by side overlap (40 links: 90 ms). The programs must be loaded for
//! it (`UProbe::load_multi`, vendor/aya/README.observer.md).

use std::{
    ffi::CString,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::{mpsc, Mutex, OnceLock},
    thread,
};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

fn sys_bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: bpf(2) reads `attr.len()` bytes of a buffer we own; the
    // pointers inside it point to memory that outlives the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel gave us, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One uprobe (or uretprobe) of program `prog` at file offset `offset` of
/// `path`, for every process (`pid` None) or one.
pub fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offset: u64,
    cookie: u64,
    ret: bool,
    pid: Option<u32>,
) -> std::io::Result<Link> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let offsets = [offset];
    let cookies = [cookie];
    // union bpf_attr, link_create with its uprobe_multi member.
    let mut attr = [0u8; 64];
    put_u32(&mut attr, 0, prog.as_raw_fd() as u32);
    put_u32(&mut attr, 8, BPF_TRACE_UPROBE_MULTI);
    put_u64(&mut attr, 16, path.as_ptr() as u64);
    put_u64(&mut attr, 24, offsets.as_ptr() as u64);
    put_u64(&mut attr, 40, cookies.as_ptr() as u64);
    put_u32(&mut attr, 48, 1);
    put_u32(
        &mut attr,
        52,
        if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
    );
    put_u32(&mut attr, 56, pid.unwrap_or(0));
    sys_bpf(BPF_LINK_CREATE, &mut attr).map(|fd| Link(Some(fd)))
}

/// Whether this kernel makes uprobe-multi links: a two-instruction program
/// loaded for them, linked to a path that does not exist, is refused with
/// ENOENT where the kernel knows the link type (it looked the path up) and
/// EINVAL where it does not.
pub fn supported() -> bool {
    // r0 = 0; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut attr = [0u8; 72];
    put_u32(&mut attr, 0, BPF_PROG_TYPE_KPROBE);
    put_u32(&mut attr, 4, insns.len() as u32);
    put_u64(&mut attr, 8, insns.as_ptr() as u64);
    put_u64(&mut attr, 16, license.as_ptr() as u64);
    put_u32(&mut attr, 68, BPF_TRACE_UPROBE_MULTI);
    let Ok(prog) = sys_bpf(BPF_PROG_LOAD, &mut attr) else {
        return false;
    };
    let missing = Path::new("/nonexistent/observer-uprobe-multi-check");
    match attach(prog.as_fd(), missing, 0, 0, false, None) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::ENOENT),
    }
}

/// A uprobe-multi link: dropping it takes the probe off, on the closer's
/// thread (each close waits a grace period, ~50 ms; the caller has work to
/// do).
pub struct Link(Option<OwnedFd>);

impl Link {
    fn into_fd(mut self) -> Option<OwnedFd> {
        self.0.take()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            closer().close_later(fd);
        }
    }
}

/// Every link in `links` closed, side by side, before it returns (one
/// grace period in all, not one each behind the closer's queue).
pub fn close_now(links: Vec<Link>) {
    close_side_by_side(links.into_iter().filter_map(Link::into_fd).collect());
}

/// Every link in `links` closed, side by side, and every one dropped
/// before, when it returns; links dropped later close where they drop.
pub fn close_all(links: Vec<Link>) {
    close_side_by_side(links.into_iter().filter_map(Link::into_fd).collect());
    closer().finish();
}

fn closer() -> &'static Closer {
    static CLOSER: OnceLock<Closer> = OnceLock::new();
    CLOSER.get_or_init(Closer::start)
}

struct Closer {
    tx: Mutex<Option<mpsc::Sender<OwnedFd>>>,
    done: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Closer {
    fn start() -> Self {
        let (tx, rx) = mpsc::channel::<OwnedFd>();
        let done = thread::Builder::new()
            .name("uprobe-close".into())
            .spawn(move || in_batches(&rx, close_side_by_side))
            .ok();
        Self {
            tx: Mutex::new(done.is_some().then_some(tx)),
            done: Mutex::new(done),
        }
    }

    /// Closed on the closer's thread, or here once it has finished.
    fn close_later(&self, fd: OwnedFd) {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = tx.as_ref() {
            // A closer thread gone drops it here.
            let _ = tx.send(fd);
        }
    }

    /// Waits for the closes handed over so far.
    fn finish(&self) {
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(tx);
        let done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(done) = done {
            let _ = done.join();
        }
    }
}

/// Hands `close` everything queued on `rx` at once, batch after batch,
/// until every sender is gone. One at a time, each close waiting its
/// grace period, the queue grew without end while processes came and went
/// faster than ~20 links a second (a short-lived TLS client's own probes
/// are a dozen links): their descriptors and uprobes stayed, and the
/// shutdown waited for them all.
fn in_batches<T>(rx: &mpsc::Receiver<T>, mut close: impl FnMut(Vec<T>)) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        close(batch);
    }
}

/// Threads that close at most a few links each, so that their grace
/// periods overlap.
fn close_side_by_side(fds: Vec<OwnedFd>) {
    const THREADS: usize = 32;
    let per = fds.len().div_ceil(THREADS).max(1);
    let mut fds = fds.into_iter().peekable();
    thread::scope(|s| {
        while fds.peek().is_some() {
            let group: Vec<OwnedFd> = fds.by_ref().take(per).collect();
            // A thread that cannot start drops its group here instead.
            let _ = thread::Builder::new().spawn_scoped(s, move || drop(group));
        }
    });
}

#[cfg(test)]
mod closer_tests {
    use super::*;

    #[test]
    fn what_is_queued_is_closed_in_one_batch() {
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            tx.send(i).expect("the receiver is alive");
        }
        let late = tx.clone();
        drop(tx);
        let mut batches: Vec<Vec<i32>> = Vec::new();
        let mut late = Some(late);
        in_batches(&rx, |b| {
            batches.push(b);
            // One more after the first batch, then no sender is left.
            if let Some(tx) = late.take() {
                tx.send(100).expect("the receiver is alive");
            }
        });
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(batches[0], (0..100).collect::<Vec<_>>());
        assert_eq!(batches[1], vec![100]);
    }
}
