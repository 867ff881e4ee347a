//! Per-process uprobes that are cheap to add and to take off.
//!
//! A uprobe made through the perf `uprobe` PMU (how aya attaches) is a
//! private trace event; closing it waits for the kernel's tracepoint RCU
//! grace periods while holding the trace event mutex: about 110 ms per probe
//! in this VM, during which no other uprobe can be opened. With eight probes
//! per process, short-lived TLS clients would queue up probes to close faster
//! than they can be closed, and delay the probes of the next process.
//!
//! So per-process probes use named uprobe events (`uprobe_events` in
//! tracefs), one per function and kind, shared by all processes:
//! - the BPF program is attached once per event, to an "anchor" perf event
//!   that targets the observer itself (which never calls these functions);
//!   it keeps the event's reference count above zero, so later closes never
//!   wait for a grace period;
//! - each traced process gets a perf event of its own on the event, without
//!   a program: it only tells the kernel to plant the breakpoint in that
//!   process (the uprobe filter), and the event's program runs on each hit.
//!   Opening or closing one costs a breakpoint update in that process.

use std::{
    fs::OpenOptions,
    io::Write,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

/// `perf_event_attr` fields we set (the first 64 bytes, PERF_ATTR_SIZE_VER0).
const PERF_ATTR_SIZE: usize = 64;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `_IOW('$', 8, __u32)`: a program on a perf event, without a link
/// (kernels before 5.15 have no perf-event links, nor cookies).
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventId(usize);

struct TraceEvent {
    name: String,
    id: u64,
    // Dropped before the event is removed (see Drop). None: the program
    // went on the anchor itself (no perf-event links here).
    _anchor_link: Option<OwnedFd>,
    _anchor: OwnedFd,
}

pub struct UprobeEvents {
    /// None: no tracefs, so no uprobe events (each definition fails).
    tracefs: Option<PathBuf>,
    group: String,
    next: u32,
    events: Vec<TraceEvent>,
}

/// Why a uprobe event could not be defined or opened (into the TLS file's
/// report).
#[derive(Debug, thiserror::Error)]
pub enum UprobeEventError {
    #[error("{}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing `{line}` to {}: {source}", path.display())]
    Write {
        line: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: uprobe_events cannot name paths with spaces")]
    SpaceInPath(String),
    #[error("no id for uprobe event {}", .0.display())]
    NoId(PathBuf),
    #[error("{what}: {source}")]
    Syscall {
        what: String,
        source: std::io::Error,
    },
    #[error("unknown uprobe event")]
    Unknown,
    #[error("uprobe events are defined in tracefs, which is not available")]
    NoTracefs,
}

/// The failed call's errno, named.
fn errno(what: impl Into<String>) -> UprobeEventError {
    UprobeEventError::Syscall {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

/// Whether this process may define uprobe events (root owns the file).
pub fn writable(tracefs: &Path) -> Result<(), UprobeEventError> {
    let path = tracefs.join("uprobe_events");
    match OpenOptions::new().append(true).open(&path) {
        Ok(_) => Ok(()),
        Err(source) => Err(UprobeEventError::Open { path, source }),
    }
}

impl UprobeEvents {
    /// Events go in group `observer_<pid>`; groups left by observers that
    /// died without cleaning up are removed.
    pub fn new(tracefs: Option<&Path>) -> Self {
        let me = Self {
            tracefs: tracefs.map(Path::to_owned),
            group: format!("observer_{}", std::process::id()),
            next: 0,
            events: Vec::new(),
        };
        me.remove_stale();
        me
    }

    fn control(&self, line: &str) -> Result<(), UprobeEventError> {
        let path = self
            .tracefs
            .as_ref()
            .ok_or(UprobeEventError::NoTracefs)?
            .join("uprobe_events");
        let mut f = match OpenOptions::new().append(true).open(&path) {
            Ok(f) => f,
            Err(source) => return Err(UprobeEventError::Open { path, source }),
        };
        f.write_all(format!("{line}\n").as_bytes())
            .map_err(|source| UprobeEventError::Write {
                line: line.to_owned(),
                path,
                source,
            })
    }

    fn remove_stale(&self) {
        let Some(tracefs) = &self.tracefs else { return };
        let Ok(text) = std::fs::read_to_string(tracefs.join("uprobe_events")) else {
            return;
        };
        for line in text.lines() {
            // "p:observer_123/t0 /usr/lib/...:0x..."
            let Some(event) = line
                .split_whitespace()
                .next()
                .and_then(|d| d.split_once(':'))
                .map(|(_, e)| e)
            else {
                continue;
            };
            let Some(pid) = event
                .strip_prefix("observer_")
                .and_then(|r| r.split_once('/'))
                .and_then(|(p, _)| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = self.control(&format!("-:{event}"));
            }
        }
    }

    /// Defines a uprobe (or uretprobe) at `offset` in `path` and attaches
    /// `prog` to it with `cookie` (None: without a link, on kernels that give
    /// no cookies). No process is traced until `open_for`.
    pub fn define(
        &mut self,
        path: &Path,
        offset: u64,
        ret: bool,
        prog: BorrowedFd<'_>,
        cookie: Option<u64>,
    ) -> Result<EventId, UprobeEventError> {
        let shown = path.display().to_string();
        if shown.chars().any(char::is_whitespace) {
            return Err(UprobeEventError::SpaceInPath(shown));
        }
        let name = format!("t{}", self.next);
        self.next += 1;
        let kind = if ret { 'r' } else { 'p' };
        self.control(&format!("{kind}:{}/{name} {shown}:{offset:#x}", self.group))?;
        let id_path = self
            .tracefs
            .as_ref()
            .ok_or(UprobeEventError::NoTracefs)?
            .join("events")
            .join(&self.group)
            .join(&name)
            .join("id");
        let id = std::fs::read_to_string(&id_path)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let remove = |me: &Self| {
            let _ = me.control(&format!("-:{}/{name}", me.group));
        };
        let Some(id) = id else {
            remove(self);
            return Err(UprobeEventError::NoId(id_path));
        };
        let anchor = match perf_open(id, std::process::id()) {
            Ok(fd) => fd,
            Err(e) => {
                remove(self);
                return Err(e);
            }
        };
        let link = match cookie {
            Some(cookie) => link_create(prog, &anchor, cookie).map(Some),
            None => set_bpf(prog, &anchor).map(|()| None),
        };
        let link = match link {
            Ok(link) => link,
            Err(e) => {
                drop(anchor);
                remove(self);
                return Err(e);
            }
        };
        self.events.push(TraceEvent {
            name,
            id,
            _anchor_link: link,
            _anchor: anchor,
        });
        Ok(EventId(self.events.len() - 1))
    }

    /// Plants event `ev`'s probe in process `pid`; closing the fd removes it.
    pub fn open_for(&self, ev: EventId, pid: u32) -> Result<OwnedFd, UprobeEventError> {
        let e = self.events.get(ev.0).ok_or(UprobeEventError::Unknown)?;
        perf_open(e.id, pid)
    }
}

impl Drop for UprobeEvents {
    fn drop(&mut self) {
        let names: Vec<String> = self.events.iter().map(|e| e.name.clone()).collect();
        // Closing the anchors detaches the programs; the kernel refuses to
        // remove an event that is still open.
        self.events.clear();
        for name in names {
            if let Err(e) = self.control(&format!("-:{}/{name}", self.group)) {
                tracing::warn!("removing uprobe event: {e}");
            }
        }
    }
}

/// A perf event on trace event `id` for process `pid`, enabled.
fn perf_open(id: u64, pid: u32) -> Result<OwnedFd, UprobeEventError> {
    let mut attr = [0u8; PERF_ATTR_SIZE];
    attr[0..4].copy_from_slice(&PERF_TYPE_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&(PERF_ATTR_SIZE as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&id.to_ne_bytes());
    // sample_period = 1
    attr[16..24].copy_from_slice(&1u64.to_ne_bytes());
    // SAFETY: perf_event_open with a zero-initialised attr of the size it
    // declares; the returned fd is owned by us.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            pid as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(errno(format!(
            "perf_event_open(uprobe event {id}, pid {pid})"
        )));
    }
    // SAFETY: a fresh fd from the kernel.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: ioctl on our perf fd.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, 0) } < 0 {
        return Err(errno("enabling the perf event"));
    }
    Ok(fd)
}

/// PERF_EVENT_IOC_SET_BPF: attaches `prog` to perf event `perf` until the
/// event is closed.
fn set_bpf(prog: BorrowedFd<'_>, perf: &OwnedFd) -> Result<(), UprobeEventError> {
    // SAFETY: ioctl on our perf fd with a program fd as its argument.
    if unsafe {
        libc::ioctl(
            perf.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd(),
        )
    } < 0
    {
        return Err(errno("attaching the program to the uprobe event"));
    }
    Ok(())
}

/// BPF_LINK_CREATE: attaches `prog` to perf event `perf` with a cookie.
fn link_create(
    prog: BorrowedFd<'_>,
    perf: &OwnedFd,
    cookie: u64,
) -> Result<OwnedFd, UprobeEventError> {
    // union bpf_attr, link_create: prog_fd, target_fd, attach_type, flags,
    // perf_event.bpf_cookie (offset 16).
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(perf.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_PERF_EVENT.to_ne_bytes());
    attr[16..24].copy_from_slice(&cookie.to_ne_bytes());
    // SAFETY: bpf(2) with an attr buffer of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            attr.as_ptr(),
            attr.len() as u32,
        )
    };
    if fd < 0 {
        return Err(errno("attaching the program to the uprobe event"));
    }
    // SAFETY: a fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
