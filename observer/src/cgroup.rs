//! The cgroup v2 root, where the packet programs go: there they see every
//! socket of the host's processes.

use std::path::PathBuf;

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

/// Every cgroup program of `feature` on the root cgroup; the root's path.
pub fn attach_on_root(probes: &mut Probes, feature: Feature) -> Result<PathBuf, String> {
    let root = root().ok_or("no cgroup v2 hierarchy mounted at its root")?;
    let dir = std::fs::File::open(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    for p in programs::of(feature) {
        probes
            .attach_cgroup(p.name, &dir, &root)
            .map_err(|e| chain(&e))?;
    }
    Ok(root)
}
