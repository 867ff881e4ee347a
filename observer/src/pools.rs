//! Connection pools: each process's outbound connections to one peer
//! (address and port), as an HTTP client library's pool holds them.
//!
//! Two sources, one way: finished records (requests, and connections at
//! their close) feed the counters; once a second the connection table's
//! live outbound connections give how many are open, busy (an exchange in
//! flight) and idle (exchanges seen, none in flight). Each tick yields one
//! [`PoolRecord`] per pool that has open connections or changed, for the
//! metrics, `top`, `diagnose` and `watch --pools`.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use foldhash::HashMap;

use serde::Serialize;

use crate::{
    hist::{Hist, AGE_BUCKETS, REQUEST_BUCKETS},
    http::RequestRecord,
    record::{ConnRecord, Direction, Owner, State},
};

/// Pools followed at once; a request or close of one more is counted in
/// `Pools::untracked` (a host with more pools than this has a fan-out the
/// per-pool view does not help with).
pub const MAX_POOLS: usize = 4096;

/// A pool with nothing open is forgotten after this many quiet ticks.
const FORGET_TICKS: u32 = 60;

/// What a live connection is doing, as the pools count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// An exchange in flight.
    Busy,
    /// Exchanges seen, none in flight.
    Idle,
    /// No exchange seen (new, not HTTP, or its bytes are not read).
    Unknown,
}

/// A pool: one process, one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub pid: u32,
    pub peer: SocketAddr,
}

/// Connections closed, by who closed them (`ConnRecord::closed_by`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Closes {
    pub client: u64,
    pub server: u64,
    pub reset: u64,
    pub goaway: u64,
}

impl Closes {
    fn add(&mut self, by: &str) {
        match by {
            "client" => self.client += 1,
            "server" => self.server += 1,
            "reset" => self.reset += 1,
            "goaway" => self.goaway += 1,
            _ => {}
        }
    }

    pub fn total(&self) -> u64 {
        self.client + self.server + self.reset + self.goaway
    }
}

/// One pool as it stood at a tick (`watch --pools`: `"kind": "pool"`).
/// Counters run from when the observer first saw the pool (`since_unix_ns`).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PoolRecord {
    /// Always "pool".
    #[schemars(extend("const" = "pool"))]
    pub kind: &'static str,
    pub time_unix_ns: u64,
    pub pid: u32,
    pub comm: Option<Arc<str>>,
    pub exe: Option<Arc<str>>,
    pub container: Option<Arc<crate::k8s::Container>>,
    pub peer_addr: IpAddr,
    pub peer_port: u16,
    /// The TLS server name of its connections (null: none seen).
    pub server_name: Option<Arc<str>>,
    /// Connections open now; `busy` have an exchange in flight, `idle` have
    /// had exchanges and have none in flight (the rest: no exchange seen).
    pub open: u32,
    pub busy: u32,
    pub idle: u32,
    /// Requests made, and those that opened a new connection (the
    /// connection's first request).
    pub requests: u64,
    pub new_connections: u64,
    /// `new_connections / requests` (null: no requests).
    pub new_connection_share: Option<f64>,
    pub closed: Closes,
    /// Mean requests per closed connection (null: none closed with HTTP seen).
    pub requests_per_connection: Option<f64>,
    /// Mean age of the connections closed, open to close (null: none).
    pub age_at_close_ns: Option<u64>,
    pub since_unix_ns: u64,
}

/// What a pool's finished records added up to.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    pub requests: u64,
    pub new_connections: u64,
    pub closed: Closes,
    /// Closed connections with HTTP seen, and their requests.
    closed_http: u64,
    closed_requests: u64,
    age_sum_ns: u64,
    /// Age at close (seconds) and requests per connection, for the metrics.
    pub ages: Hist,
    pub per_connection: Hist,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.requests += o.requests;
        self.new_connections += o.new_connections;
        self.closed.client += o.closed.client;
        self.closed.server += o.closed.server;
        self.closed.reset += o.closed.reset;
        self.closed.goaway += o.closed.goaway;
        self.closed_http += o.closed_http;
        self.closed_requests += o.closed_requests;
        self.age_sum_ns += o.age_sum_ns;
        self.ages.add(&o.ages);
        self.per_connection.add(&o.per_connection);
    }
}

/// The counters' series: per executable and peer, not per process, so a
/// short-lived client's counts add to its executable's (a series per pid
/// would start and end with each process, and show no rate).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExeKey {
    pub exe: Arc<str>,
    pub server_name: Option<Arc<str>>,
    pub peer: SocketAddr,
}

#[derive(Debug, Default)]
struct Pool {
    comm: Option<Arc<str>>,
    exe: Option<Arc<str>>,
    container: Option<Arc<crate::k8s::Container>>,
    server_name: Option<Arc<str>>,
    open: u32,
    busy: u32,
    idle: u32,
    t: Totals,
    since_unix_ns: u64,
    /// Counters moved since the last tick.
    changed: bool,
    /// Connections open at the last record (a pool that emptied says so).
    emitted_open: u32,
    quiet_ticks: u32,
}

impl Pool {
    fn name(&mut self, comm: Option<&Arc<str>>, exe: Option<&Arc<str>>) {
        if self.comm.is_none() {
            self.comm = comm.cloned();
        }
        if self.exe.is_none() {
            self.exe = exe.cloned();
        }
    }
}

/// Every pool followed, by process and peer.
#[derive(Debug, Default)]
pub struct Pools {
    pools: HashMap<PoolKey, Pool>,
    /// The totals of forgotten pools, by executable and peer.
    retired: HashMap<ExeKey, Totals>,
    /// Requests and closes of pools past [`MAX_POOLS`].
    pub untracked: u64,
}

/// The executable's name a pool's series carry.
fn exe_name(p: &Pool) -> Arc<str> {
    let path = p.exe.as_ref().or(p.comm.as_ref());
    match path {
        Some(e) => match e.rsplit_once('/') {
            Some((_, name)) => Arc::from(name),
            None => Arc::clone(e),
        },
        None => Arc::from("unknown"),
    }
}

impl Pools {
    fn pool(&mut self, key: PoolKey, now_unix_ns: u64) -> Option<&mut Pool> {
        if !self.pools.contains_key(&key) && self.pools.len() >= MAX_POOLS {
            self.untracked += 1;
            return None;
        }
        Some(self.pools.entry(key).or_insert_with(|| Pool {
            since_unix_ns: now_unix_ns,
            ..Pool::default()
        }))
    }

    /// The pool of a record's process and peer (made at `start_unix_ns`
    /// if new), named after the record's process.
    fn pool_of(
        &mut self,
        pid: u32,
        peer: SocketAddr,
        start_unix_ns: u64,
        comm: Option<&Arc<str>>,
        exe: Option<&Arc<str>>,
    ) -> Option<&mut Pool> {
        let p = self.pool(PoolKey { pid, peer }, start_unix_ns)?;
        p.name(comm, exe);
        Some(p)
    }

    /// A client request's record.
    pub fn on_request(&mut self, r: &RequestRecord) {
        let Some(pid) = r.pid.filter(|_| r.direction == Direction::Outbound) else {
            return;
        };
        let peer = SocketAddr::new(r.remote_addr, r.remote_port);
        let (comm, exe) = (r.comm.as_ref(), r.exe.as_ref());
        let Some(p) = self.pool_of(pid, peer, r.start_unix_ns, comm, exe) else {
            return;
        };
        p.t.requests += 1;
        if r.request_index == Some(1) {
            p.t.new_connections += 1;
        }
        p.changed = true;
    }

    /// A connection's final record.
    pub fn on_close(&mut self, r: &ConnRecord) {
        let outbound_closed = r.direction == Direction::Outbound && r.state == State::Closed;
        let (Some(pid), Some(by)) = (r.pid.filter(|_| outbound_closed), r.closed_by) else {
            return;
        };
        let peer = SocketAddr::new(r.remote_addr, r.remote_port);
        let (comm, exe) = (r.comm.as_ref(), r.exe.as_ref());
        let Some(p) = self.pool_of(pid, peer, r.start_unix_ns, comm, exe) else {
            return;
        };
        if let Some(name) = r.tls.as_ref().and_then(|t| t.server_name.clone()) {
            p.server_name = Some(name);
        }
        let t = &mut p.t;
        t.closed.add(by);
        let age = r.duration_ns.unwrap_or(0);
        t.age_sum_ns += age;
        t.ages.observe(&AGE_BUCKETS, age as f64 / 1e9);
        if let Some(n) = r.requests {
            t.closed_http += 1;
            t.closed_requests += u64::from(n);
            t.per_connection.observe(&REQUEST_BUCKETS, f64::from(n));
        }
        p.changed = true;
    }

    /// Starts a count of the live connections: every pool's open, busy
    /// and idle go to zero until [`Pools::count`] adds them up again.
    pub fn begin_census(&mut self) {
        for p in self.pools.values_mut() {
            (p.open, p.busy, p.idle) = (0, 0, 0);
        }
    }

    /// One live outbound connection of `owner` to `peer`.
    pub fn count(
        &mut self,
        owner: &Owner,
        peer: SocketAddr,
        server_name: Option<&Arc<str>>,
        u: Use,
        now_unix_ns: u64,
    ) {
        let key = PoolKey {
            pid: owner.pid,
            peer,
        };
        let Some(p) = self.pool(key, now_unix_ns) else {
            return;
        };
        p.name(Some(&owner.comm), owner.exe.as_ref());
        if p.container.is_none() {
            p.container = owner.container.clone();
        }
        if p.server_name.is_none() {
            p.server_name = server_name.cloned();
        }
        p.open += 1;
        match u {
            Use::Busy => p.busy += 1,
            Use::Idle => p.idle += 1,
            Use::Unknown => {}
        }
    }

    /// The tick's records: pools with connections open or counters moved.
    /// Pools with nothing open and quiet for [`FORGET_TICKS`] are forgotten.
    pub fn tick(&mut self, now_unix_ns: u64) -> Vec<PoolRecord> {
        let mut out = Vec::new();
        let retired = &mut self.retired;
        self.pools.retain(|key, p| {
            let active = p.open > 0 || p.changed || p.emitted_open != p.open;
            p.emitted_open = p.open;
            p.quiet_ticks = if active { 0 } else { p.quiet_ticks + 1 };
            if active {
                out.push(record(key, p, now_unix_ns));
            }
            p.changed = false;
            let keep = p.quiet_ticks < FORGET_TICKS;
            if !keep {
                retire(retired, key, p);
            }
            keep
        });
        shrink_if_sparse(&mut self.pools);
        out.sort_by_key(|r| (r.pid, r.peer_addr, r.peer_port));
        out
    }

    /// Every pool's connections now, for the gauges: (pool, executable,
    /// server name, open, busy, idle).
    pub fn open(&self) -> impl Iterator<Item = (&PoolKey, Arc<str>, Option<&Arc<str>>, [u32; 3])> {
        self.pools.iter().map(|(k, p)| {
            (
                k,
                exe_name(p),
                p.server_name.as_ref(),
                [p.open, p.busy, p.idle],
            )
        })
    }

    /// The totals by executable and peer, forgotten pools included, for the
    /// counters and histograms.
    pub fn totals(&self) -> Vec<(ExeKey, Totals)> {
        let mut all = self.retired.clone();
        for (k, p) in &self.pools {
            all.entry(exe_key(k, p)).or_default().add(&p.t);
        }
        all.into_iter().collect()
    }
}

/// Gives back a map's room once it holds under a quarter of it: a map never
/// shrinks by itself, so each new peak of short-lived clients' pools (curl
/// after curl, each pool kept a minute) would step the heap up for good
/// (+256 KiB at one such peak in the soak).
fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    const SMALL: usize = 64;
    if map.capacity() > SMALL && map.len() < map.capacity() / 4 {
        map.shrink_to((map.len() * 2).max(SMALL));
    }
}

fn exe_key(k: &PoolKey, p: &Pool) -> ExeKey {
    ExeKey {
        exe: exe_name(p),
        server_name: p.server_name.clone(),
        peer: k.peer,
    }
}

/// A forgotten pool's totals kept under its executable (at most
/// [`MAX_POOLS`] executables and peers: past it, the oldest are not told
/// apart from new ones, so they are dropped whole and counted).
fn retire(retired: &mut HashMap<ExeKey, Totals>, k: &PoolKey, p: &Pool) {
    let key = exe_key(k, p);
    if !retired.contains_key(&key) && retired.len() >= MAX_POOLS {
        return;
    }
    retired.entry(key).or_default().add(&p.t);
}

fn record(key: &PoolKey, p: &Pool, now_unix_ns: u64) -> PoolRecord {
    let t = &p.t;
    let closed = t.closed.total();
    PoolRecord {
        kind: "pool",
        time_unix_ns: now_unix_ns,
        pid: key.pid,
        comm: p.comm.clone(),
        exe: p.exe.clone(),
        container: p.container.clone(),
        peer_addr: key.peer.ip(),
        peer_port: key.peer.port(),
        server_name: p.server_name.clone(),
        open: p.open,
        busy: p.busy,
        idle: p.idle,
        requests: t.requests,
        new_connections: t.new_connections,
        new_connection_share: (t.requests > 0)
            .then(|| t.new_connections as f64 / t.requests as f64),
        closed: t.closed.clone(),
        requests_per_connection: (t.closed_http > 0)
            .then(|| t.closed_requests as f64 / t.closed_http as f64),
        age_at_close_ns: (closed > 0).then(|| t.age_sum_ns / closed),
        since_unix_ns: p.since_unix_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(pid: u32) -> Owner {
        Owner {
            pid,
            tid: pid,
            comm: Arc::from("client"),
            thread_comm: Arc::from("client"),
            exe: Some(Arc::from("/usr/bin/client")),
            container: None,
        }
    }

    fn peer() -> SocketAddr {
        "10.0.0.9:8080".parse().expect("an address")
    }

    #[test]
    fn a_census_counts_open_busy_and_idle_per_peer() {
        let mut p = Pools::default();
        p.begin_census();
        p.count(&owner(7), peer(), None, Use::Busy, 1);
        p.count(&owner(7), peer(), None, Use::Idle, 1);
        p.count(&owner(7), peer(), None, Use::Unknown, 1);
        p.count(&owner(8), peer(), None, Use::Idle, 1);
        let recs = p.tick(2);
        assert_eq!(recs.len(), 2);
        let r = &recs[0];
        assert_eq!((r.pid, r.open, r.busy, r.idle), (7, 3, 1, 1));
        assert_eq!((r.peer_addr, r.peer_port), (peer().ip(), 8080));
        assert_eq!(r.comm.as_deref(), Some("client"));
        // The next census finds them closed: one record with nothing open,
        // then none until the pool is forgotten.
        p.begin_census();
        let recs = p.tick(3);
        assert_eq!(recs.len(), 2, "a pool that just emptied says so once");
        assert!(recs.iter().all(|r| r.open == 0));
        p.begin_census();
        assert!(p.tick(4).is_empty());
        for t in 0..FORGET_TICKS {
            p.tick(5 + u64::from(t));
        }
        assert_eq!(p.open().count(), 0, "quiet pools are forgotten");
    }

    #[test]
    fn requests_and_closes_count_new_connections_and_who_closed() {
        use crate::top::model::tests::{conn, request_of};
        let mut p = Pools::default();
        let mut c = conn(7, "client", 8080, 5);
        // Two connections of one request each, one of three requests.
        for (index, n) in [(1, 1), (1, 1), (1, 3)] {
            let mut q = request_of(&c);
            q.request_index = Some(index);
            p.on_request(&q);
            for i in 2..=n {
                q.request_index = Some(i);
                p.on_request(&q);
            }
        }
        c.requests = Some(1);
        c.closed_by = c.who_closed(true);
        assert_eq!(c.closed_by, Some("client"));
        p.on_close(&c);
        c.peer_fin_unix_ns = Some(5);
        c.closed_by = c.who_closed(true);
        assert_eq!(c.closed_by, Some("server"), "the server's FIN came first");
        p.on_close(&c);
        c.resets = 1;
        c.requests = Some(3);
        c.closed_by = c.who_closed(true);
        p.on_close(&c);
        assert_eq!(c.who_closed(false), None, "never established");
        p.begin_census();
        let r = &p.tick(10)[0];
        assert_eq!((r.requests, r.new_connections), (5, 3));
        assert_eq!(r.new_connection_share, Some(0.6));
        assert_eq!(
            r.closed,
            Closes {
                client: 1,
                server: 1,
                reset: 1,
                goaway: 0
            }
        );
        assert_eq!(r.requests_per_connection, Some(5.0 / 3.0));
        assert_eq!(r.age_at_close_ns, c.duration_ns);
        // Inbound records are not a pool's.
        let mut inbound = request_of(&c);
        inbound.direction = Direction::Inbound;
        p.on_request(&inbound);
        p.begin_census();
        assert!(p.tick(11).is_empty(), "nothing moved");
        // Forgotten, its counts stay under its executable and peer.
        for t in 0..FORGET_TICKS {
            p.tick(12 + u64::from(t));
        }
        assert_eq!(p.open().count(), 0);
        let totals = p.totals();
        assert_eq!(totals.len(), 1);
        let (k, t) = &totals[0];
        assert_eq!((&*k.exe, k.peer.port()), ("client", 8080));
        assert_eq!((t.requests, t.new_connections, t.closed.total()), (5, 3, 3));
        assert_eq!(t.ages.count(), 3);
    }

    #[test]
    fn pools_past_the_cap_are_counted_not_kept() {
        let mut p = Pools::default();
        for pid in 0..MAX_POOLS as u32 + 3 {
            p.count(&owner(pid), peer(), None, Use::Idle, 1);
        }
        assert_eq!(p.open().count(), MAX_POOLS);
        assert_eq!(p.untracked, 3);
    }

    #[test]
    fn a_peak_of_pools_gives_its_room_back_once_they_are_forgotten() {
        let mut p = Pools::default();
        for pid in 0..2_000 {
            p.count(&owner(pid), peer(), None, Use::Idle, 1);
        }
        let peak = p.pools.capacity();
        p.begin_census();
        p.count(&owner(1), peer(), None, Use::Idle, 1);
        for _ in 0..=FORGET_TICKS {
            p.tick(2);
        }
        assert_eq!(p.pools.len(), 1);
        assert!(
            p.pools.capacity() <= 128,
            "{peak} -> {}",
            p.pools.capacity()
        );
        // The retired pools' totals stay.
        assert_eq!(p.totals().len(), 1);
    }
}
