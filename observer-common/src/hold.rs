//! Holding the first process of an executable the observer has not looked at
//! yet, at its exec, until the probes its file needs are on.
//!
//! Go programs carry their TLS in the executable, so their probes can only
//! go on once the file is known; an attach waits an RCU grace period (13-21
//! ms) and a local handshake takes 2-3 ms. The exec tracepoint stops such a
//! process (SIGSTOP, before its first instruction) and tells userspace,
//! which looks at the file, attaches, remembers the file and resumes it
//! (SIGCONT). Files already looked at pass at once.

/// Global ([`ExeWalk`]): where the kernel keeps a task's executable.
pub const EXE_WALK_GLOBAL: &str = "EXE_WALK";
/// Map [`ExeKey`] -> u8: executables looked at (they pass unheld).
pub const EXE_KNOWN_MAP: &str = "EXE_KNOWN";
/// Array of one u64: holding is on while CLOCK_MONOTONIC is below it. The
/// observer moves it forward while it can answer; a stalled or stopped one
/// holds nobody.
pub const HOLD_UNTIL_MAP: &str = "HOLD_UNTIL";
/// Ring buffer of [`HoldEvent`]s, woken at each one.
pub const HOLDS_RING: &str = "HOLDS";
pub const MAX_KNOWN_EXES: u32 = 16_384;
pub const HOLDS_RING_BYTES: u32 = 64 * 1024;

/// Byte offsets in the running kernel's structs (from BTF); `task_mm` 0:
/// unknown, nothing is held.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeWalk {
    pub task_mm: u32,
    pub mm_exe_file: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub task_signal: u32,
    pub signal_tty: u32,
}

/// An executable as the kernel names it: the superblock's device (the
/// kernel's dev_t: major << 20 | minor) and the inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExeKey {
    pub ino: u64,
    pub dev: u32,
    pub _pad: u32,
}

/// [`HoldEvent::kind`]: stopped at its exec; `exe` is its executable.
pub const HOLD_EXEC: u32 = 0;
/// Stopped on its way out of an mmap of a file executable (a library it
/// opened while running); `exe` is that file.
pub const HOLD_MAPPING: u32 = 1;

/// A process stopped for a file the observer has not looked at yet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HoldEvent {
    pub ts_ns: u64,
    pub pid: u32,
    /// [`HOLD_EXEC`] or [`HOLD_MAPPING`].
    pub kind: u32,
    pub exe: ExeKey,
}
