//! The cgroup v2 root, where the packet programs go: there they see every
//! socket of the host's processes.

use std::path::{Path, PathBuf};

/// The cgroup v2 hierarchy's root as this process sees it mounted.
pub fn root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        // "... root mountpoint opts ... - fstype source superopts"
        let (left, right) = l.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let mountpoint = f.next()?;
        (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(mountpoint))
    })
}

/// The root cgroup, opened: where the packet programs go.
#[derive(Debug)]
pub struct Root {
    pub path: PathBuf,
    pub dir: std::fs::File,
}

/// Why the packet programs have no root cgroup to go on.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("--cgroup-root {}: not a cgroup v2 mount", .0.display())]
    NotCgroup2(PathBuf),
    #[error("no cgroup v2 hierarchy mounted at its root")]
    NotMounted,
    #[error("{}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Root {
    /// The root cgroup `given` (`--cgroup-root`), else the one mounted here.
    pub fn open(given: Option<&Path>) -> Result<Root, RootError> {
        let path = match given {
            Some(p) if is_cgroup2(p) => p.to_path_buf(),
            Some(p) => return Err(RootError::NotCgroup2(p.to_path_buf())),
            None => root().ok_or(RootError::NotMounted)?,
        };
        match std::fs::File::open(&path) {
            Ok(dir) => Ok(Root { path, dir }),
            Err(source) => Err(RootError::Open { path, source }),
        }
    }
}

/// Whether `path` is on a cgroup v2 file system.
fn is_cgroup2(path: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs on a NUL-terminated path into a zeroed struct.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}
