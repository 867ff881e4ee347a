//! The cgroup v2 root, where the packet programs go: there they see every
//! socket of the host's processes.

use std::path::{Path, PathBuf};

use crate::{
    ebpf::{chain, Probes},
    programs::{self, Feature},
};

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

/// Every cgroup program of `feature` on the root cgroup (`given`, else the
/// one mounted here); the root's path.
pub fn attach_on_root(
    probes: &mut Probes,
    feature: Feature,
    given: Option<&Path>,
) -> Result<PathBuf, String> {
    let root = match given {
        Some(p) if is_cgroup2(p) => p.to_path_buf(),
        Some(p) => {
            return Err(format!(
                "--cgroup-root {}: not a cgroup v2 mount",
                p.display()
            ))
        }
        None => root().ok_or("no cgroup v2 hierarchy mounted at its root")?,
    };
    let dir = std::fs::File::open(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    for p in programs::of(feature) {
        probes
            .attach_cgroup(p.name, &dir, &root)
            .map_err(|e| chain(&e))?;
    }
    Ok(root)
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
