//! tracefs: where tracepoints are described. We mount it when the machine has
//! not (aya looks for it at /sys/kernel/tracing), and check each tracepoint's
//! field layout against what our eBPF programs read.

use std::{
    io,
    path::{Path, PathBuf},
};

use observer_common::tracepoints::Layout;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// Neither location has tracefs, and mounting it failed.
    #[error("tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {0} (needs root or CAP_SYS_ADMIN; or run `mount -t tracefs nodev /sys/kernel/tracing`)")]
    Mount(io::Error),
    /// tracefs is mounted, but this process may not read it.
    #[error("tracefs is mounted at {path} but not readable by this process (needs root, or read access to {path}: tracepoint layouts and uprobe events live there)")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A tracefs directory that holds `events/`.
fn usable(dir: &Path) -> bool {
    dir.join("events").is_dir()
}

/// Finds tracefs without changing anything.
pub fn find() -> Option<PathBuf> {
    CANDIDATES.iter().map(PathBuf::from).find(|p| usable(p))
}

/// Where the mount table says tracefs is, readable or not.
fn mounted() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        // "... root mountpoint opts ... - fstype source superopts"
        let (left, right) = l.split_once(" - ")?;
        let mountpoint = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next()? == "tracefs").then(|| PathBuf::from(mountpoint))
    })
}

/// Finds tracefs, mounting it at /sys/kernel/tracing when it is nowhere.
pub fn find_or_mount() -> Result<PathBuf, TracefsError> {
    if let Some(p) = find() {
        return Ok(p);
    }
    if let Some(path) = mounted() {
        let source = std::fs::read_dir(path.join("events"))
            .err()
            .unwrap_or_else(|| io::Error::other("events/ is missing"));
        // Not found: the mount table lists a tracefs that another mount
        // hides (a container's own /sys); try mounting one as if none were.
        if source.kind() != io::ErrorKind::NotFound {
            return Err(TracefsError::Unreadable { path, source });
        }
    }
    let target = Path::new(CANDIDATES[0]);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL in literal");
    let (src, dst, fs) = (c("nodev"), c(CANDIDATES[0]), c("tracefs"));
    // SAFETY: all pointers are valid NUL-terminated strings for the call's duration.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(TracefsError::Mount(io::Error::last_os_error()));
    }
    if usable(target) {
        Ok(target.to_path_buf())
    } else {
        Err(TracefsError::Mount(io::Error::other(
            "mounted, but events/ is missing",
        )))
    }
}

/// One `field:` line of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    pub offset: usize,
    pub size: usize,
}

/// Parses a tracepoint `format` file's field lines, e.g.
/// `field:__u16 sport; offset:24; size:2; signed:0;` (tab-separated).
pub fn parse_format(text: &str) -> Vec<FormatField> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let decl = line.strip_prefix("field:")?;
            let mut parts = decl.split(';').map(str::trim);
            let decl = parts.next()?;
            let mut offset = None;
            let mut size = None;
            for p in parts {
                if let Some(v) = p.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = p.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            // The name is the last word of the declaration, without any `[N]`.
            let name = decl.rsplit(' ').next()?;
            let name = name.split('[').next()?.to_owned();
            Some(FormatField {
                name,
                offset: offset?,
                size: size?,
            })
        })
        .collect()
}

/// Why a tracepoint cannot be used as our programs expect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The kernel has no such tracepoint.
    #[error("tracepoint {0} is missing on this kernel")]
    Missing(String),
    /// A field we read is absent.
    #[error("tracepoint {tp} has no field `{field}`")]
    NoField { tp: String, field: &'static str },
    /// A classic tracepoint attaches by the id tracefs gives.
    #[error("tracepoint {tp} cannot attach without tracefs ({why})")]
    NoTracefs { tp: String, why: String },
    /// Without tracefs, a raw tracepoint's prototype is looked for in BTF.
    #[error("tracepoint {tp} is not declared in the kernel's BTF ({why})")]
    NotDeclared { tp: String, why: String },
    /// A field we read sits elsewhere or has another size.
    #[error("tracepoint {tp} field `{field}` is at offset {offset} size {size}, expected offset {want_offset} size {want_size}")]
    Moved {
        tp: String,
        field: &'static str,
        offset: usize,
        size: usize,
        want_offset: usize,
        want_size: usize,
    },
}

/// Where the tracepoints our programs use are described.
#[derive(Debug, Clone)]
pub enum Described {
    /// tracefs: each tracepoint's id and record layout.
    Tracefs(PathBuf),
    /// No tracefs (`why`): a raw tracepoint attaches by name, and the kernel's
    /// BTF declares its prototype (`btf_trace_<name>`), listed in `declared`
    /// (empty without BTF); a classic tracepoint, which attaches by its
    /// tracefs id, cannot.
    BtfOnly {
        why: String,
        declared: Vec<&'static str>,
    },
}

impl Described {
    /// tracefs, found or mounted; else what BTF declares of `raw` (the raw
    /// tracepoints the programs use).
    pub fn find(raw: &[&'static str]) -> Described {
        match find_or_mount() {
            Ok(p) => Described::Tracefs(p),
            Err(e) => Described::BtfOnly {
                declared: crate::btf::raw_tracepoints_declared(raw).unwrap_or_default(),
                why: e.to_string(),
            },
        }
    }

    pub fn tracefs(&self) -> Option<&Path> {
        match self {
            Described::Tracefs(p) => Some(p),
            Described::BtfOnly { .. } => None,
        }
    }

    /// Whether a program may go on the tracepoint of `layout` as our programs
    /// read it: classic (`raw` false) or raw.
    pub fn check(&self, layout: &Layout, raw: bool) -> Result<(), LayoutError> {
        let tp = || format!("{}:{}", layout.category, layout.name);
        match self {
            Described::Tracefs(p) => check_layout(p, layout),
            Described::BtfOnly { why, .. } if !raw => Err(LayoutError::NoTracefs {
                tp: tp(),
                why: why.clone(),
            }),
            Described::BtfOnly { declared, .. } if declared.contains(&layout.name) => Ok(()),
            Described::BtfOnly { why, .. } => Err(LayoutError::NotDeclared {
                tp: tp(),
                why: why.clone(),
            }),
        }
    }
}

/// Checks `layout` against the kernel's format file under `tracefs`.
pub fn check_layout(tracefs: &Path, layout: &Layout) -> Result<(), LayoutError> {
    let tp = format!("{}:{}", layout.category, layout.name);
    let path = tracefs
        .join("events")
        .join(layout.category)
        .join(layout.name)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|_| LayoutError::Missing(tp.clone()))?;
    check_fields(&tp, &parse_format(&text), layout)
}

fn check_fields(tp: &str, fields: &[FormatField], layout: &Layout) -> Result<(), LayoutError> {
    for want in layout.fields {
        let got =
            fields
                .iter()
                .find(|f| f.name == want.name)
                .ok_or_else(|| LayoutError::NoField {
                    tp: tp.to_owned(),
                    field: want.name,
                })?;
        if got.offset != want.offset || got.size != want.size {
            return Err(LayoutError::Moved {
                tp: tp.to_owned(),
                field: want.name,
                offset: got.offset,
                size: got.size,
                want_offset: want.offset,
                want_size: want.size,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use observer_common::tracepoints::{inet_sock_set_state, sock_send_length};

    use super::*;

    const FORMAT: &str = "name: sock_send_length
ID: 1712
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:void * sk;	offset:8;	size:8;	signed:0;
	field:__u16 family;	offset:16;	size:2;	signed:0;
	field:__u16 protocol;	offset:18;	size:2;	signed:0;
	field:int ret;	offset:20;	size:4;	signed:1;
	field:int flags;	offset:24;	size:4;	signed:1;

print fmt: \"sk address = %p\", REC->sk
";

    #[test]
    fn parses_fields() {
        let f = parse_format(FORMAT);
        assert_eq!(f.len(), 6);
        assert_eq!(
            f[1],
            FormatField {
                name: "sk".into(),
                offset: 8,
                size: 8
            }
        );
        let arr = parse_format("\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;");
        assert_eq!(arr[0].name, "saddr_v6");
        assert_eq!(arr[0].size, 16);
    }

    #[test]
    fn layout_matches_and_mismatches() {
        let f = parse_format(FORMAT);
        assert_eq!(check_fields("t", &f, &sock_send_length::LAYOUT), Ok(()));
        let moved = FORMAT.replace("offset:20;", "offset:28;");
        assert!(matches!(
            check_fields("t", &parse_format(&moved), &sock_send_length::LAYOUT),
            Err(LayoutError::Moved {
                field: "ret",
                offset: 28,
                ..
            })
        ));
        assert!(matches!(
            check_fields("t", &f, &inet_sock_set_state::LAYOUT),
            Err(LayoutError::NoField {
                field: "skaddr",
                ..
            })
        ));
    }

    #[test]
    fn without_tracefs_only_declared_raw_tracepoints_pass() {
        let d = Described::BtfOnly {
            why: "not mounted".into(),
            declared: vec!["sock_send_length"],
        };
        assert_eq!(d.check(&sock_send_length::LAYOUT, true), Ok(()));
        assert!(matches!(
            d.check(&sock_send_length::LAYOUT, false),
            Err(LayoutError::NoTracefs { .. })
        ));
        assert!(matches!(
            d.check(&inet_sock_set_state::LAYOUT, true),
            Err(LayoutError::NotDeclared { .. })
        ));
        assert_eq!(d.tracefs(), None);
    }

    #[test]
    fn missing_tracepoint() {
        let dir = std::env::temp_dir();
        assert!(matches!(
            check_layout(&dir, &sock_send_length::LAYOUT),
            Err(LayoutError::Missing(_))
        ));
    }
}
