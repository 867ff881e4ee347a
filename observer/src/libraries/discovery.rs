//! Which files to look at, before any process maps them or while they run:
//! the system's TLS libraries and musl's C libraries (so a process that
//! loads one later, as Python imports ssl lazily, is covered before it
//! does), and the processes running now, whose mappings say the rest. The
//! features decide what each file is worth (`tls`, `dns`).

use std::path::{Path, PathBuf};

use super::{procmaps::FileId, LIB_DIRS, MUSL_LIBS};

/// The system's TLS libraries (by name, in the library directories) and
/// musl's C libraries, as found now.
pub fn system_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in LIB_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("libssl.so") || name.starts_with("libgnutls.so") {
                out.push(e.path());
            }
        }
    }
    out.extend(MUSL_LIBS.iter().map(PathBuf::from));
    out
}

/// The pids under `proc_root` now, but `except` (the observer's own).
pub fn running_pids(proc_root: &Path, except: u32) -> std::io::Result<Vec<u32>> {
    Ok(std::fs::read_dir(proc_root)?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&p| p != except)
        .collect())
}

/// A file of this host's: the real one behind the symlinks to it, and its
/// identity (device, inode). None when it is not there.
pub fn host_file(link: &Path) -> Option<(FileId, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let path = std::fs::canonicalize(link).ok()?;
    let md = std::fs::metadata(&path).ok()?;
    Some(((md.dev(), md.ino()), path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_and_can_be_left_out() {
        let me = std::process::id();
        let all = running_pids(Path::new("/proc"), 0).expect("/proc");
        assert!(all.contains(&me));
        let others = running_pids(Path::new("/proc"), me).expect("/proc");
        assert!(!others.contains(&me));
        assert!(running_pids(Path::new("/nonexistent"), 0).is_err());
    }

    #[test]
    fn a_symlink_is_followed_to_the_file() {
        let (id, path) = host_file(Path::new("/proc/self/exe")).expect("our executable");
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(path, std::fs::canonicalize(exe).expect("canonical"));
        assert_ne!(id, (0, 0));
        assert!(host_file(Path::new("/nonexistent/file")).is_none());
    }
}
