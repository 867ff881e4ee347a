//! Other observers loaded on this host. Two observers each hook every
//! socket, packet and TLS call, so the observed programs pay twice, and each
//! one's per-process TLS probes run the other's handlers too: a second
//! observer left running (a stray test or profiling run) has made timings
//! drift by milliseconds. `doctor` and start-up name them.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::programs::PROGRAMS;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherObserver {
    /// The process holding the programs (null: held by no process this one
    /// can read: pinned, left attached, or held where /proc/PID/fdinfo is
    /// closed to it, without CAP_SYS_PTRACE).
    pub pid: Option<u32>,
    pub comm: Option<String>,
    /// How many of the observer's programs it holds.
    pub programs: u32,
}

/// The kernel keeps the first 15 bytes of a program's name.
const NAME_LEN: usize = 15;

fn our_names() -> HashSet<&'static str> {
    PROGRAMS
        .iter()
        .map(|p| &p.name[..p.name.len().min(NAME_LEN)])
        .collect()
}

/// The observers loaded now, other than this process. Programs that cannot
/// be listed (no privilege) yield nothing.
pub fn find() -> Vec<OtherObserver> {
    let names = our_names();
    let ids: HashSet<u32> = aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str().is_some_and(|n| names.contains(n)))
        .map(|p| p.id())
        .collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let me = std::process::id();
    let held = holders(&ids);
    let mut out: Vec<OtherObserver> = held
        .iter()
        .filter(|(pid, _)| **pid != me)
        .map(|(&pid, progs)| OtherObserver {
            pid: Some(pid),
            comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim().to_owned()),
            programs: progs.len() as u32,
        })
        .collect();
    let held_ids: HashSet<u32> = held.values().flatten().copied().collect();
    let orphans = ids.difference(&held_ids).count();
    if orphans > 0 {
        out.push(OtherObserver {
            pid: None,
            comm: None,
            programs: orphans as u32,
        });
    }
    out.sort_by_key(|o| o.pid);
    out
}

/// Which process holds which of `ids`, from /proc/*/fdinfo (`prog_id:`).
/// Processes and descriptors that vanish or cannot be read are passed over.
fn holders(ids: &HashSet<u32>) -> HashMap<u32, HashSet<u32>> {
    let mut held: HashMap<u32, HashSet<u32>> = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return held;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(info) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            if let Some(id) = prog_id(&info).filter(|id| ids.contains(id)) {
                held.entry(pid).or_default().insert(id);
            }
        }
    }
    held
}

fn prog_id(fdinfo: &str) -> Option<u32> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The warning line for `others` (None: there are none).
pub fn warning(others: &[OtherObserver]) -> Option<String> {
    if others.is_empty() {
        return None;
    }
    let who: Vec<String> = others
        .iter()
        .map(|o| match (o.pid, &o.comm) {
            (Some(pid), Some(c)) => format!("pid {pid} ({c}, {} programs)", o.programs),
            (Some(pid), None) => format!("pid {pid} ({} programs)", o.programs),
            (None, _) => format!(
                "{} programs held by no process this one can read",
                o.programs
            ),
        })
        .collect();
    Some(format!(
        "another observer is loaded: {}; observed programs pay for both, and timings drift",
        who.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_descriptor_names_its_id() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2071\nprog_type:\t8\nprog_jited:\t1\nprog_tag:\t6bd4a5f1e3b6f1b5\nmemlock:\t4096\nprog_id:\t4242\n";
        assert_eq!(prog_id(info), Some(4242));
        assert_eq!(prog_id("pos:\t0\nflags:\t02\nmap_id:\t7\n"), None);
    }

    #[test]
    fn names_are_cut_as_the_kernel_cuts_them() {
        let n = our_names();
        assert!(n.contains("packets_egress"));
        assert!(n.iter().all(|s| s.len() <= NAME_LEN));
    }

    #[test]
    fn the_warning_names_each_holder() {
        assert_eq!(warning(&[]), None);
        let w = warning(&[
            OtherObserver {
                pid: Some(7),
                comm: Some("observer".into()),
                programs: 40,
            },
            OtherObserver {
                pid: None,
                comm: None,
                programs: 2,
            },
        ])
        .expect("two holders: a warning");
        assert!(w.contains("pid 7 (observer, 40 programs)"), "{w}");
        assert!(
            w.contains("2 programs held by no process this one can read"),
            "{w}"
        );
    }
}
