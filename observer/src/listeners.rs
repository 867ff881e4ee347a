//! Which TCP ports a process listens on, read from /proc when asked (its
//! descriptors' socket inodes against the kernel's listening sockets).
//!
//! Proxy linking asks it about an inbound request whose socket's owner is
//! not known yet (a plain-TCP server's first request: the packet programs
//! name the owner at its first send, after its legs have begun): the
//! request is a candidate only for a process that listens on its port.
//! Answers are kept a second per process, so a busy proxy reads /proc at
//! most once a second.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

/// How long one reading of a process's ports is trusted.
const FRESH: Duration = Duration::from_secs(1);
/// Processes remembered at most (the oldest reading is dropped past it).
const MAX_PROCESSES: usize = 1024;

pub struct Listeners {
    proc_root: PathBuf,
    by_pid: HashMap<u32, (Instant, Vec<u16>)>,
}

impl Listeners {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            by_pid: HashMap::new(),
        }
    }

    /// Whether process `pid` listens on TCP port `port` (false when /proc
    /// cannot tell).
    pub fn listens(&mut self, pid: u32, port: u16) -> bool {
        let now = Instant::now();
        let fresh = self
            .by_pid
            .get(&pid)
            .is_some_and(|(at, _)| now.duration_since(*at) < FRESH);
        if !fresh {
            if self.by_pid.len() >= MAX_PROCESSES {
                let oldest = self
                    .by_pid
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(p, _)| *p);
                if let Some(p) = oldest {
                    self.by_pid.remove(&p);
                }
            }
            let ports = self.read(pid);
            self.by_pid.insert(pid, (now, ports));
        }
        self.by_pid
            .get(&pid)
            .is_some_and(|(_, ports)| ports.contains(&port))
    }

    /// The ports of the listening sockets among `pid`'s descriptors.
    fn read(&self, pid: u32) -> Vec<u16> {
        let pid_dir = self.proc_root.join(pid.to_string());
        let Ok(fds) = std::fs::read_dir(pid_dir.join("fd")) else {
            return Vec::new();
        };
        let inodes: HashSet<u64> = fds
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| socket_inode(&l.to_string_lossy()))
            .collect();
        if inodes.is_empty() {
            return Vec::new();
        }
        // The process's own network namespace.
        ["net/tcp", "net/tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(pid_dir.join(t)).ok())
            .flat_map(|text| listening(&text))
            .filter(|(_, inode)| inodes.contains(inode))
            .map(|(port, _)| port)
            .collect()
    }
}

/// `socket:[12345]` -> 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The (port, inode) of each listening socket in a /proc/net/tcp table.
fn listening(table: &str) -> Vec<(u16, u64)> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local_address rem_address st ... inode (the 10th field).
            if f.len() < 10 || f[3] != "0A" {
                return None;
            }
            let port = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
            Some((port, f[9].parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_of_this_process_is_found_and_others_are_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let mut ls = Listeners::new("/proc");
        let me = std::process::id();
        assert!(ls.listens(me, port));
        // A connected socket's port is not a listening one.
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let local = c.local_addr().expect("addr").port();
        drop(l);
        let mut fresh = Listeners::new("/proc");
        assert!(!fresh.listens(me, local));
        assert!(!fresh.listens(me, port), "closed");
        assert!(!fresh.listens(u32::MAX, port), "no such process");
    }

    #[test]
    fn the_kernels_table_is_read_by_state_and_inode() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                 0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0\n\
                 1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0\n";
        assert_eq!(listening(t), vec![(8080, 4242)]);
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("pipe:[1]"), None);
    }
}
