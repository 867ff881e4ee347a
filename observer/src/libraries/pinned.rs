//! A file held open while probes go on it.
//!
//! Checking a path's inode and then attaching by the path is a race: a
//! package upgrade that renames a new library over the old path between the
//! two puts the probes on the new file and none on the old one its processes
//! run. Attaching through the open file's `/proc/self/fd` link cannot be
//! swapped: the kernel follows the link to the file that is open, not to
//! whatever the name means now.

use std::{
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use super::procmaps::{FileId, Mapping};

#[derive(Debug)]
pub struct Pinned {
    file: File,
    id: FileId,
}

impl Pinned {
    /// Whatever file `path` names now.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let md = file.metadata()?;
        Ok(Self {
            file,
            id: (md.dev(), md.ino()),
        })
    }

    /// `path`'s file if it is `id` (checked on the open file).
    pub fn open_if(path: &Path, id: FileId) -> Option<Self> {
        Self::open(path).ok().filter(|p| p.id == id)
    }

    pub fn id(&self) -> FileId {
        self.id
    }

    /// A path to exactly this file while it is held, for attaching uprobes
    /// and reading its image.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// The very file `pid` maps, opened, and the path it was reached by: its
/// path under `/proc/PID/root` (how containers' files are reached) when
/// that is the same inode, else the mapping's own link in
/// `/proc/PID/map_files` (a file replaced or deleted since it was mapped).
pub fn reachable(proc_root: &Path, pid: u32, m: &Mapping) -> Option<(Pinned, PathBuf)> {
    let base = proc_root.join(pid.to_string());
    let via_root = base.join("root").join(m.path.trim_start_matches('/'));
    let via_map = base.join("map_files").join(&m.range);
    [via_root, via_map]
        .into_iter()
        .find_map(|p| Some((Pinned::open_if(&p, m.id)?, p)))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use super::*;
    use crate::libraries::procmaps::executable_files;

    #[test]
    fn a_file_renamed_over_after_the_open_is_not_the_one_reached() {
        let dir = std::env::temp_dir().join(format!("observer-pinned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libssl.so.3");
        std::fs::write(&lib, b"old").unwrap();
        let old = Pinned::open(&lib).unwrap();
        let staged = dir.join("libssl.so.3.new");
        std::fs::write(&staged, b"new").unwrap();
        std::fs::rename(&staged, &lib).unwrap();
        assert_eq!(std::fs::read(old.path()).unwrap(), b"old");
        let md = std::fs::metadata(old.path()).unwrap();
        assert_eq!((md.dev(), md.ino()), old.id());
        assert!(Pinned::open_if(&lib, old.id()).is_none());
        let new = Pinned::open(&lib).unwrap();
        assert!(Pinned::open_if(&lib, new.id()).is_some());
        assert_ne!(new.id(), old.id());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_mappings_are_reachable() {
        let me = std::process::id();
        let maps = executable_files(Path::new("/proc"), me).unwrap();
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let m = maps
            .iter()
            .find(|m| Path::new(&m.path) == exe)
            .expect("the test binary is mapped");
        let (file, p) = reachable(Path::new("/proc"), me, m).expect("reachable");
        assert!(p.starts_with(format!("/proc/{me}/root")), "{p:?}");
        assert_eq!(file.id(), m.id);
    }
}
