//! Which TCP ports a process listens on, read from /proc when asked (its
//! descriptors' socket inodes against the kernel's listening sockets).
//!
//! Proxy linking asks it about an inbound request whose socket's owner is
//! not known yet (a plain-TCP server's first request: the packet programs
//! name the owner at its first send, after its legs have begun): the
//! request is a candidate only for a process that listens on its port.
//!
//! What the kernel told comes first: listen() calls, seen as the
//! connections' events are (in their order), so a process that listened,
//! served and exited before its events were read is still known (the ring
//! is read on a timer, and /proc is gone with the process). /proc answers
//! for the rest (sockets listened on before the observer started, or
//! inherited: nginx's workers), kept a second per process, so a busy proxy
//! reads it at most once a second.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

/// How long one reading of a process's ports is trusted.
const FRESH: Duration = Duration::from_secs(1);
/// Processes remembered at most (the oldest reading is dropped past it).
const MAX_PROCESSES: usize = 1024;
/// Listening sockets the kernel told of kept at most; past it, /proc answers.
const MAX_TOLD: usize = 65_536;

pub struct Listeners {
    proc_root: PathBuf,
    by_pid: HashMap<u32, (Instant, Vec<u16>)>,
    /// Listening sockets told by the kernel: socket -> (process, port).
    told: HashMap<u64, (u32, u16)>,
    /// The same by process: its sockets.
    told_by_pid: HashMap<u32, Vec<u64>>,
}

impl Listeners {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: proc_root.into(),
            by_pid: HashMap::new(),
            told: HashMap::new(),
            told_by_pid: HashMap::new(),
        }
    }

    /// The kernel told that socket `sk` began listening on `port` in
    /// process `pid` (port 0: listen() binds it).
    pub fn began(&mut self, sk: u64, pid: u32, port: u16) {
        self.ended(sk);
        if self.told.len() >= MAX_TOLD {
            return;
        }
        self.told.insert(sk, (pid, port));
        self.told_by_pid.entry(pid).or_default().push(sk);
    }

    /// Socket `sk` no longer listens.
    pub fn ended(&mut self, sk: u64) {
        let Some((pid, _)) = self.told.remove(&sk) else {
            return;
        };
        if let Some(socks) = self.told_by_pid.get_mut(&pid) {
            socks.retain(|&s| s != sk);
            if socks.is_empty() {
                self.told_by_pid.remove(&pid);
            }
        }
    }

    /// Process `pid` exited: what it told is forgotten (a child that
    /// inherited its sockets is read from /proc).
    pub fn exited(&mut self, pid: u32) {
        for sk in self.told_by_pid.remove(&pid).unwrap_or_default() {
            self.told.remove(&sk);
        }
        self.by_pid.remove(&pid);
    }

    /// Whether process `pid` listens on any TCP port: only a server can
    /// make a leg of a request it serves.
    pub fn listens_any(&mut self, pid: u32) -> bool {
        self.told_by_pid.contains_key(&pid) || self.ports(pid).is_some_and(|p| !p.is_empty())
    }

    /// Whether process `pid` listens on TCP port `port` (false when neither
    /// the kernel nor /proc tells).
    pub fn listens(&mut self, pid: u32, port: u16) -> bool {
        self.told_port(pid, port) || self.ports(pid).is_some_and(|p| p.contains(&port))
    }

    fn told_port(&self, pid: u32, port: u16) -> bool {
        self.told_by_pid.get(&pid).is_some_and(|socks| {
            socks
                .iter()
                .any(|sk| self.told.get(sk) == Some(&(pid, port)))
        })
    }

    /// The ports `pid` listens on, read again when older than a second.
    fn ports(&mut self, pid: u32) -> Option<&Vec<u16>> {
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
        self.by_pid.get(&pid).map(|(_, ports)| ports)
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
        // In our network namespace the kernel lists its listening sockets
        // alone (sock_diag): /proc's tables list every socket, tens of
        // thousands of TIME_WAIT ones on a busy host, and reading them stalled
        // the correlator long enough for the ring to overflow.
        let same_netns = std::fs::read_link(pid_dir.join("ns/net")).ok()
            == std::fs::read_link(self.proc_root.join("self/ns/net")).ok();
        if same_netns {
            if let Some(all) = diag_listeners() {
                return all
                    .into_iter()
                    .filter(|(_, inode)| inodes.contains(inode))
                    .map(|(port, _)| port)
                    .collect();
            }
        }
        // Another namespace (a container's): its own, usually small, tables.
        ["net/tcp", "net/tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(pid_dir.join(t)).ok())
            .flat_map(|text| listening(&text))
            .filter(|(_, inode)| inodes.contains(inode))
            .map(|(port, _)| port)
            .collect()
    }
}

/// The (port, inode) of every listening TCP socket of our network
/// namespace, IPv4 and IPv6, from the kernel's sock_diag netlink interface
/// (None: it could not be asked).
fn diag_listeners() -> Option<Vec<(u16, u64)>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        out.extend(diag_dump(family as u8)?);
    }
    Some(out)
}

/// One SOCK_DIAG_BY_FAMILY dump of `family`'s TCP sockets in LISTEN.
fn diag_dump(family: u8) -> Option<Vec<(u16, u64)>> {
    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const TCP_LISTEN: u32 = 10;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    use std::os::fd::AsRawFd as _;
    // nlmsghdr (16 bytes) + inet_diag_req_v2 (56 bytes).
    let mut req = [0u8; 72];
    req[0..4].copy_from_slice(&72u32.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[16] = family;
    req[17] = libc::IPPROTO_TCP as u8;
    req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    // SAFETY: req is a valid buffer of its length for the call.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent != req.len() as isize {
        return None;
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: buf is a valid, writable buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(n) = usize::try_from(n) else {
            return None;
        };
        if n == 0 {
            return Some(out);
        }
        let mut at = 0;
        while at + 16 <= n {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().ok()?) as usize;
            let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().ok()?);
            if len < 16 || at + len > n {
                return None;
            }
            match kind {
                NLMSG_DONE => return Some(out),
                NLMSG_ERROR => return None,
                _ => {}
            }
            // inet_diag_msg: family, state, timer, retrans, then the socket
            // id (source port first, big-endian), ..., the inode at 68.
            let msg = &buf[at + 16..at + len];
            if msg.len() >= 72 {
                let port = u16::from_be_bytes([msg[4], msg[5]]);
                let inode = u32::from_ne_bytes(msg[68..72].try_into().ok()?);
                out.push((port, u64::from(inode)));
            }
            // Messages are 4-byte aligned.
            at += (len + 3) & !3;
        }
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
    fn what_the_kernel_told_answers_for_a_process_gone_from_proc() {
        let mut ls = Listeners::new("/nonexistent");
        let pid = 4_000_001;
        assert!(!ls.listens_any(pid));
        ls.began(1, pid, 8080);
        ls.began(2, pid, 0);
        assert!(ls.listens_any(pid) && ls.listens(pid, 8080));
        assert!(!ls.listens(pid, 8081) && !ls.listens(pid + 1, 8080));
        ls.ended(1);
        assert!(!ls.listens(pid, 8080), "closed");
        assert!(ls.listens_any(pid), "still listens on the other");
        ls.began(3, pid, 9090);
        ls.exited(pid);
        assert!(!ls.listens_any(pid) && !ls.listens(pid, 9090), "exited");
        assert!(ls.told.is_empty() && ls.told_by_pid.is_empty());
    }

    #[test]
    fn a_listening_socket_of_this_process_is_found_and_others_are_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let mut ls = Listeners::new("/proc");
        let me = std::process::id();
        assert!(ls.listens(me, port) && ls.listens_any(me));
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
    fn the_kernel_lists_our_listening_socket_by_netlink() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let local = c.local_addr().expect("addr").port();
        let all = diag_listeners().expect("sock_diag answers");
        assert!(
            all.iter().any(|&(p, inode)| p == port && inode > 0),
            "{all:?}"
        );
        assert!(!all.iter().any(|&(p, _)| p == local), "only listeners");
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
