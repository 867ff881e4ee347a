//! DNS records and the join of lookups to connections.

use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    net::IpAddr,
    sync::Arc,
};

use observer_common::{
    dns::{DnsEvent, FUNC_GETADDRINFO, FUNC_GETHOSTBYNAME2_R, FUNC_GETHOSTBYNAME_R},
    AF_INET, AF_INET6,
};
use serde::Serialize;

use crate::{clock::Clock, record::comm_str_n};

/// One lookup, as `observer watch --json` prints it.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DnsRecord {
    /// Always "dns".
    #[schemars(extend("const" = "dns"))]
    pub kind: &'static str,
    pub pid: u32,
    pub tid: u32,
    /// The process's name (its main thread's; the kernel's thread name when
    /// /proc could not tell).
    pub comm: Arc<str>,
    /// The process's executable, when /proc could tell.
    pub exe: Option<Arc<str>>,
    /// The process's container and Kubernetes pod (null: none).
    pub container: Option<Arc<crate::k8s::Container>>,
    pub name: Arc<str>,
    /// "A", "AAAA", ... as asked on the wire; library lookups: "A", "AAAA",
    /// or "ANY" (getaddrinfo asked for both).
    pub qtype: Cow<'static, str>,
    pub duration_ns: u64,
    /// "ok", "nxdomain", "no_data", "timeout" (temporary failure), "error".
    pub result: &'static str,
    /// The server asked (seen on the wire; null for a library lookup that
    /// sent nothing, answered from /etc/hosts or a cache).
    pub server: Option<String>,
    pub answers: Vec<IpAddr>,
    pub start_unix_ns: u64,
    /// "libc": a C library call (its queries on the wire add `server`, `id`,
    /// `rcode`, `retries`); "wire": queries a program sent itself.
    pub source: &'static str,
    /// The first query's id.
    pub id: Option<u16>,
    /// The response code ("NOERROR", "NXDOMAIN", "SERVFAIL", ...; null: no
    /// response seen).
    pub rcode: Option<Cow<'static, str>>,
    /// Queries sent again for the same question (a timeout's retries, or
    /// the TCP retry of a truncated answer).
    pub retries: Option<u32>,
    /// "udp", or "tcp" when any of its queries went over TCP.
    pub transport: Option<&'static str>,
    /// The C library function called ("getaddrinfo", "gethostbyname_r",
    /// "gethostbyname2_r"; null for wire lookups).
    pub call: Option<&'static str>,
}

/// The `dns` object of a connection record.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DnsJoin {
    pub name: Arc<str>,
    pub duration_ns: u64,
    pub result: &'static str,
    pub source: &'static str,
    /// "answer": the connection's address was in the lookup's answer;
    /// "thread": the same thread's latest lookup, shortly before.
    pub joined_by: &'static str,
    #[serde(skip)]
    pub start_unix_ns: u64,
}

// glibc's EAI_* codes.
fn result(ret: i32) -> &'static str {
    match ret {
        0 => "ok",
        -2 => "nxdomain", // EAI_NONAME
        -5 => "no_data",  // EAI_NODATA
        -3 => "timeout",  // EAI_AGAIN
        _ => "error",
    }
}

impl DnsRecord {
    pub fn new(ev: &DnsEvent, clock: &Clock) -> Self {
        let mut answers: Vec<IpAddr> = Vec::new();
        for i in 0..(ev.n_addrs as usize).min(ev.addrs.len()) {
            let Some(ip) = crate::record::ip_of(ev.families[i], &ev.addrs[i]) else {
                continue;
            };
            // getaddrinfo lists each address once per socket type.
            if !answers.contains(&ip) {
                answers.push(ip);
            }
        }
        Self {
            kind: "dns",
            pid: ev.pid,
            tid: ev.tid,
            comm: Arc::from(comm_str_n(&ev.comm)),
            exe: None,
            container: None,
            name: Arc::from(comm_str_n(&ev.name)),
            qtype: Cow::Borrowed(match u16::try_from(ev.family).unwrap_or(0) {
                AF_INET => "A",
                AF_INET6 => "AAAA",
                _ => "ANY",
            }),
            duration_ns: ev.end_ns.saturating_sub(ev.start_ns),
            result: result(ev.ret),
            server: None,
            answers,
            start_unix_ns: clock.to_unix_ns(ev.start_ns),
            source: "libc",
            id: None,
            rcode: None,
            retries: None,
            transport: None,
            call: match ev.func {
                FUNC_GETADDRINFO => Some("getaddrinfo"),
                FUNC_GETHOSTBYNAME_R => Some("gethostbyname_r"),
                FUNC_GETHOSTBYNAME2_R => Some("gethostbyname2_r"),
                _ => None,
            },
        }
    }

    fn end_unix_ns(&self) -> u64 {
        self.start_unix_ns + self.duration_ns
    }

    fn join(&self, joined_by: &'static str) -> DnsJoin {
        DnsJoin {
            name: Arc::clone(&self.name),
            duration_ns: self.duration_ns,
            result: self.result,
            source: self.source,
            joined_by,
            start_unix_ns: self.start_unix_ns,
        }
    }
}

/// A lookup kept for the join.
struct Kept {
    r: DnsRecord,
    /// A connection followed it (seen at connect, or joined at a record).
    used: bool,
    /// Handed out to be traced on its own.
    traced: bool,
}

/// Recent lookups per process, for the join.
#[derive(Default)]
pub struct Lookups {
    by_pid: HashMap<u32, VecDeque<Kept>>,
}

/// Lookups kept per process, and how long a lookup may lead to a connection.
const PER_PID: usize = 32;
const ANSWER_WINDOW_NS: u64 = 60_000_000_000;
const THREAD_WINDOW_NS: u64 = 2_000_000_000;
/// Processes remembered (past it, the table starts over).
const MAX_PIDS: usize = 4096;

impl Lookups {
    pub fn add(&mut self, r: DnsRecord) {
        if self.by_pid.len() >= MAX_PIDS && !self.by_pid.contains_key(&r.pid) {
            self.by_pid.clear();
        }
        let q = self.by_pid.entry(r.pid).or_default();
        if q.len() >= PER_PID {
            q.pop_front();
        }
        q.push_back(Kept {
            r,
            used: false,
            traced: false,
        });
    }

    /// Drops lookups too old to join anything. A process's lookups outlive
    /// it: a connection's record can come after its process exited (the
    /// socket is destroyed once the peer has acknowledged the close).
    pub fn prune(&mut self, now_unix_ns: u64) {
        let horizon = now_unix_ns.saturating_sub(2 * ANSWER_WINDOW_NS);
        self.by_pid.retain(|_, q| {
            q.retain(|k| k.r.end_unix_ns() >= horizon);
            !q.is_empty()
        });
    }

    /// The lookup that led to a connection of `pid`/`tid` to `remote`
    /// started at `start`: the latest whose answer holds `remote`, else the
    /// same thread's latest lookup just before. It is marked as used.
    pub fn join(&mut self, pid: u32, tid: u32, remote: IpAddr, start: u64) -> Option<DnsJoin> {
        let q = self.by_pid.get_mut(&pid)?;
        let before = |r: &DnsRecord| r.end_unix_ns() <= start + 1_000_000;
        let age = |r: &DnsRecord| start - r.end_unix_ns().min(start);
        let (i, by) = match q.iter().rposition(|k| {
            before(&k.r) && k.r.answers.contains(&remote) && age(&k.r) <= ANSWER_WINDOW_NS
        }) {
            Some(i) => (i, "answer"),
            None => (
                q.iter().rposition(|k| {
                    before(&k.r)
                        && k.r.tid == tid
                        && k.r.answers.is_empty()
                        && age(&k.r) <= THREAD_WINDOW_NS
                })?,
                "thread",
            ),
        };
        q[i].used = true;
        Some(q[i].r.join(by))
    }

    /// Lookups that led to no connection within `grace_ns` of their end
    /// (all of them when `now_unix_ns` is u64::MAX), each handed out once:
    /// they are traced on their own.
    pub fn unused(&mut self, now_unix_ns: u64, grace_ns: u64) -> Vec<DnsRecord> {
        let mut out = Vec::new();
        for k in self.by_pid.values_mut().flatten() {
            if !k.used && !k.traced && k.r.end_unix_ns().saturating_add(grace_ns) <= now_unix_ns {
                k.traced = true;
                out.push(k.r.clone());
            }
        }
        out.sort_by_key(|r| r.start_unix_ns);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A library lookup of "api.test" by curl, 1 µs long.
    pub(crate) fn rec(pid: u32, tid: u32, start: u64, ips: &[&str]) -> DnsRecord {
        DnsRecord {
            kind: "dns",
            pid,
            tid,
            comm: Arc::from("curl"),
            exe: None,
            container: None,
            name: Arc::from("api.test"),
            qtype: "ANY".into(),
            duration_ns: 1_000,
            result: if ips.is_empty() { "nxdomain" } else { "ok" },
            server: None,
            answers: ips.iter().map(|s| s.parse().expect("ip")).collect(),
            start_unix_ns: start,
            source: "libc",
            id: None,
            rcode: None,
            retries: None,
            transport: None,
            call: Some("getaddrinfo"),
        }
    }

    #[test]
    fn joins_by_answer_then_by_thread() {
        let mut l = Lookups::default();
        const MS: u64 = 1_000_000;
        l.add(rec(1, 11, 10 * MS, &["10.0.0.1", "10.0.0.2"]));
        l.add(rec(1, 12, 20 * MS, &[]));
        let ip: IpAddr = "10.0.0.2".parse().expect("ip");
        let j = l.join(1, 99, ip, 50 * MS).expect("by answer");
        assert_eq!(j.joined_by, "answer");
        let other: IpAddr = "10.9.9.9".parse().expect("ip");
        assert_eq!(
            l.unused(u64::MAX, 0)
                .iter()
                .map(|r| r.tid)
                .collect::<Vec<_>>(),
            vec![12],
            "the lookup joined by answer is used"
        );
        assert_eq!(
            l.join(1, 12, other, 50 * MS).map(|j| j.joined_by),
            Some("thread")
        );
        assert_eq!(
            l.join(1, 13, other, 50 * MS),
            None,
            "another thread, no answer"
        );
        assert_eq!(l.join(2, 11, ip, 50 * MS), None, "another process");
        assert_eq!(
            l.join(1, 11, ip, 5 * MS),
            None,
            "a lookup after the connection"
        );
    }
}
