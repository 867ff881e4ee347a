//! The files a process maps executable, from `/proc/PID/maps`.

use std::path::Path;

/// A file by identity: (st_dev, st_ino). Uprobes live on inodes, so a file
/// reached through two paths (a container's root, a symlink) is one file.
pub type FileId = (u64, u64);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub id: FileId,
    /// The path inside the process's mount namespace.
    pub path: String,
    /// The first mapped address range ("start-end"), for /proc/PID/map_files.
    pub range: String,
}

/// Parses one maps line; None for anonymous, non-executable or odd lines.
pub fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let _offset = it.next()?;
    let dev = it.next()?;
    let ino: u64 = it.next()?.parse().ok()?;
    let path = it.next()?.trim_start();
    if ino == 0 || perms.as_bytes().get(2) != Some(&b'x') || !path.starts_with('/') {
        return None;
    }
    let (major, minor) = dev.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(Mapping {
        id: (libc::makedev(major, minor), ino),
        path: path.to_owned(),
        range: range.to_owned(),
    })
}

/// Distinct executable files mapped by `pid`.
pub fn executable_files(proc_root: &Path, pid: u32) -> std::io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps"))?;
    let mut out: Vec<Mapping> = Vec::new();
    for m in text.lines().filter_map(parse_line) {
        if !out.iter().any(|o| o.id == m.id) {
            out.push(m);
        }
    }
    Ok(out)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use super::*;

    #[test]
    fn parses_executable_file_mappings_only() {
        let m = parse_line(
            "7f1c2a000000-7f1c2a0a0000 r-xp 00020000 fd:01 1835  /usr/lib/x86_64-linux-gnu/libssl.so.3",
        )
        .expect("a file mapping");
        assert_eq!(m.id, (libc::makedev(0xfd, 1), 1835));
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libssl.so.3");
        let spaced = parse_line("1000-2000 r-xp 0 08:02 77 /opt/my app/bin (deleted)").unwrap();
        assert_eq!(spaced.path, "/opt/my app/bin");
        assert_eq!(parse_line("1000-2000 r--p 0 08:02 77 /lib/libc.so.6"), None);
        assert_eq!(parse_line("1000-2000 rw-p 0 00:00 0 "), None);
        assert_eq!(parse_line("1000-2000 r-xp 0 00:00 0 [vdso]"), None);
        assert_eq!(parse_line("garbage"), None);
    }
}
