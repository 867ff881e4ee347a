//! The one place that owns connection state in userspace.
//!
//! The kernel keeps each live connection's counters in the CONNS map and sends
//! two events per connection: who owns it, and its final state at close. This
//! table joins them with process details and turns them into records. It also
//! produces snapshots of long-lived connections (periodic updates, and at stop)
//! by reading CONNS directly.

use std::{collections::HashMap, sync::Arc};

use observer_common::{
    tls::{TLS_HS_DONE, TLS_HS_STARTED},
    Conn, TlsConn, FLAG_TLS,
};

use crate::{
    clock::Clock,
    decode::Event,
    dns::{DnsRecord, Lookups, WireLookups},
    ebpf::KernelConns,
    http::{
        trace_context::{self, End, Pairs, Shared},
        RequestRecord,
    },
    keys::{NumMap, NumSet},
    process::ProcessCache,
    record::{comm_str, comm_str_n, ConnRecord, FirstRequest, Owner, State},
    tls::{TlsRecord, TtfbUnmeasured},
};

struct Live {
    owner: Owner,
    /// TLS server name, from the client's library call.
    server_name: Option<Arc<str>>,
    /// Monotonic time of the last snapshot record (0: none yet).
    last_snapshot_ns: u64,
    /// The connection was missing from CONNS at the previous snapshot pass.
    missing: bool,
    /// The owner event said the owner connected (its guess from the
    /// ports for a connection first seen mid-way).
    outbound: bool,
    /// The far end, when the kernel knew it at the owner event.
    peer: Option<std::net::SocketAddr>,
}

/// Interned thread names are forgotten past this many distinct ones.
const MAX_NAMES: usize = 4096;
/// Server names held for sockets whose owner is not known yet.
const MAX_EARLY_NAMES: usize = 4096;

/// How long a close waits for the last bytes of an exchange in flight. A
/// library call's plaintext leaves at its return, which can come after the
/// bytes it wrote made the peer close and the close event overtook it (a
/// Go goroutine descheduled between its send and its RET; an OpenSSL
/// uretprobe's thread preempted): without the wait the answer ends
/// "incomplete" on one end and its last bytes become an answer without a
/// request.
const CLOSE_LINGER_NS: u64 = 100_000_000;
/// Closes waiting at most: past it, every waiting close ends at once.
const MAX_CLOSING: usize = 1024;

/// A close held back for the last bytes of an exchange in flight, with
/// what it had under its socket (a new connection may take the socket
/// meanwhile).
struct Closing {
    due_ns: u64,
    conn: Conn,
    tls: TlsConn,
    live: Option<Live>,
    talk: Option<crate::http::Conversation>,
}

pub struct ConnTable {
    live: NumMap<u64, Live>,
    /// Interned kernel thread names.
    names: HashMap<[u8; 16], Arc<str>>,
    procs: ProcessCache,
    clock: Clock,
    /// Connections that vanished from CONNS without a close event (LRU eviction
    /// under pressure, or a lost close event).
    pub evicted: u64,
    /// Recent name lookups, joined to the connections that follow.
    lookups: Lookups,
    /// Lookups on the wire in flight.
    pub wire: WireLookups,
    /// Lookup records not yet taken by the correlator.
    pub dns_out: Vec<DnsRecord>,
    http_orphans_closed: u64,
    /// HTTP/2 header blocks not decoded and frames lost track of, on
    /// connections closed.
    h2_losses_closed: (u64, u64),
    /// Request records not yet taken by the correlator.
    pub requests_out: Vec<Box<RequestRecord>>,
    /// Keep the query string of request paths.
    pub keep_query: bool,
    /// Closed TLS connections without a first-byte time, by why.
    pub tls_unmeasured: crate::stats::TlsFirstByteUnmeasured,
    /// HTTP/1.x conversations by socket: kept apart from `live`, since a
    /// server's first request arrives before its owner is known.
    http: NumMap<u64, crate::http::Conversation>,
    /// Server names read from a ClientHello on the wire before the socket's
    /// owner was known (a server's socket: the hello arrives before the
    /// server reads it).
    early_names: NumMap<u64, Arc<str>>,
    /// Sockets of `http` or `early_names` without an owner that were
    /// missing from CONNS at the last snapshot pass.
    ownerless_missing: NumSet<u64>,
    /// Closes waiting for an exchange's last bytes (see CLOSE_LINGER_NS).
    closing: Vec<Closing>,
    /// Connection records of closes that waited, not yet taken by the
    /// correlator.
    pub conns_out: Vec<Box<ConnRecord>>,
    /// Closes that waited, and those whose exchange ended meanwhile.
    pub close_lingered: u64,
    pub close_linger_completed: u64,
    /// The trace nonces both ends of a connection on this host share.
    pairs: Pairs,
    /// Server ends with a request in flight: what a process's outbound
    /// requests may be legs of (see `http::proxy`).
    serving: NumSet<u64>,
    /// The ports processes listen on (proxy linking's candidates whose
    /// owner is not known yet).
    listeners: crate::listeners::Listeners,
    /// Legs waiting for the thread rule (see `legs::WaitingLeg`).
    waiting: Vec<legs::WaitingLeg>,
}

impl ConnTable {
    pub fn new(procs: ProcessCache, clock: Clock) -> Self {
        Self {
            live: NumMap::default(),
            names: HashMap::new(),
            procs,
            clock,
            evicted: 0,
            lookups: Lookups::default(),
            wire: WireLookups::default(),
            dns_out: Vec::new(),
            requests_out: Vec::new(),
            http_orphans_closed: 0,
            h2_losses_closed: (0, 0),
            keep_query: false,
            tls_unmeasured: crate::stats::TlsFirstByteUnmeasured::default(),
            http: NumMap::default(),
            early_names: NumMap::default(),
            ownerless_missing: NumSet::default(),
            closing: Vec::new(),
            conns_out: Vec::new(),
            close_lingered: 0,
            close_linger_completed: 0,
            pairs: Pairs::default(),
            serving: NumSet::default(),
            listeners: crate::listeners::Listeners::new("/proc"),
            waiting: Vec::new(),
        }
    }

    pub fn has_waiting_closes(&self) -> bool {
        !self.closing.is_empty()
    }

    /// Ends the waiting closes that are due (all with `u64::MAX`): their
    /// records go to `conns_out`.
    pub fn end_closes_due(&mut self, now_ns: u64) {
        let mut i = 0;
        while i < self.closing.len() {
            if self.closing[i].due_ns <= now_ns {
                let c = self.closing.swap_remove(i);
                let r = self.close_with(c.conn, c.tls, c.live, c.talk);
                self.conns_out.push(r);
            } else {
                i += 1;
            }
        }
    }

    /// Holds the close back when its conversation has an exchange in
    /// flight; false: close it now.
    fn linger(&mut self, conn: &Conn, tls: &TlsConn) -> bool {
        if !self.http.get(&conn.sk).is_some_and(|c| c.in_flight()) {
            return false;
        }
        if self.closing.len() >= MAX_CLOSING {
            self.end_closes_due(u64::MAX);
        }
        self.close_lingered += 1;
        self.early_names.remove(&conn.sk);
        self.closing.push(Closing {
            due_ns: crate::clock::monotonic_ns() + CLOSE_LINGER_NS,
            conn: *conn,
            tls: *tls,
            live: self.live.remove(&conn.sk),
            talk: self.http.remove(&conn.sk),
        });
        true
    }

    /// Answers seen without their request on the connections still open and
    /// those closed (the per-process probes came in between).
    pub fn http_orphans(&self) -> u64 {
        self.http_orphans_closed + self.http.values().map(|c| c.orphans).sum::<u64>()
    }

    /// HTTP/2 header blocks not decoded and times frames were lost track of.
    pub fn h2_losses(&self) -> (u64, u64) {
        let live = self.http.values().filter_map(|c| c.h2.as_ref());
        live.fold(self.h2_losses_closed, |(u, l), h| {
            (u + h.undecodable, l + h.lost)
        })
    }

    fn http_data(&mut self, ev: &observer_common::http::PlaintextEvent) {
        let sk = ev.conn.sk;
        // The late bytes of a connection whose close waits for them (the
        // socket may be another connection's already).
        let waiting = self
            .closing
            .iter()
            .position(|c| c.conn.sk == sk && c.conn.start_ns == ev.conn.start_ns);
        let Some(i) = waiting else {
            if !self.http.contains_key(&sk) {
                let (shared, ends) = self.join_pair(&ev.conn);
                let talk = self.http.entry(sk).or_default();
                talk.shared = Some(shared);
                talk.ends = Some(ends);
            }
            let talk = self.http.entry(sk).or_default();
            let live = self.live.get(&sk);
            let out = (&mut self.lookups, &mut self.requests_out);
            let places = (&mut self.pairs, self.keep_query);
            let from = out.1.len();
            feed(talk, live, ev, &self.clock, places, out);
            self.follow_legs(ev, from);
            return;
        };
        let c = &mut self.closing[i];
        let talk = c.talk.get_or_insert_with(Default::default);
        let out = (&mut self.lookups, &mut self.requests_out);
        let places = (&mut self.pairs, self.keep_query);
        feed(talk, c.live.as_ref(), ev, &self.clock, places, out);
        if !talk.in_flight() {
            self.close_linger_completed += 1;
            let c = self.closing.swap_remove(i);
            let r = self.close_with(c.conn, c.tls, c.live, c.talk);
            self.conns_out.push(r);
        }
    }

    /// The trace nonce of the connection whose end `conn` is: shared with
    /// its other end when that end is on this host and its conversation
    /// is live.
    fn join_pair(&mut self, conn: &Conn) -> (Shared, (End, End)) {
        let (_, local) = crate::record::addr(conn.family, &conn.saddr);
        let (_, remote) = crate::record::addr(conn.family, &conn.daddr);
        let ends = ((local, conn.sport), (remote, conn.dport));
        let http = &self.http;
        let shared = self.pairs.join(conn.sk, ends.0, ends.1, |sk, nonce| {
            http.get(&sk)
                .is_some_and(|t| t.shared.is_some_and(|s| s.nonce() == nonce))
        });
        (shared, ends)
    }

    /// Re-samples the wall clock offset (NTP may step or slew it), drops
    /// lookups too old to be joined and ends wire lookups never answered.
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
        let now = crate::clock::monotonic_ns();
        self.lookups.prune(clock.to_unix_ns(now));
        for r in self.wire.expire(now, &self.clock) {
            self.add_lookup(r);
        }
        // Every tick, whatever --update-interval says: the pairing and
        // proxy state is only as large as the conversations that hold it.
        self.age_waits();
        self.forget_pairs();
        let http = &self.http;
        self.serving
            .retain(|s| http.get(s).is_some_and(|t| t.serves()));
    }

    /// Lookups that led to no connection within `grace_ns` (all that are
    /// left, with u64::MAX), to be traced on their own.
    pub fn unused_lookups(&mut self, now_unix_ns: u64, grace_ns: u64) -> Vec<DnsRecord> {
        self.lookups.unused(now_unix_ns, grace_ns)
    }

    fn add_lookup(&mut self, mut r: DnsRecord) {
        // getaddrinfo on an address literal looks nothing up.
        if r.name.parse::<std::net::IpAddr>().is_ok() {
            return;
        }
        let info = self.procs.get(r.pid);
        if let Some(comm) = &info.comm {
            r.comm = Arc::clone(comm);
        }
        r.exe = info.exe.clone();
        r.container = info.container.clone();
        self.lookups.add(r.clone());
        self.dns_out.push(r);
    }

    pub fn live_len(&self) -> usize {
        self.live.len()
    }

    /// Its tables' entries, into `t`.
    pub fn store_sizes(&self, t: &crate::tables::Tables) {
        use crate::tables::Tables;
        Tables::set(&t.processes, self.procs.len());
        Tables::set(&t.cgroups, self.procs.cgroups_len());
        Tables::set(&t.connections, self.live.len());
        Tables::set(&t.http_conversations, self.http.len());
    }

    /// Counts each live outbound connection whose owner and peer are known
    /// into `pools`, with what it is doing.
    pub fn pool_census(&self, pools: &mut crate::pools::Pools, now_unix_ns: u64) {
        use crate::pools::Use;
        pools.begin_census();
        for (sk, live) in &self.live {
            let talk = self.http.get(sk);
            let client = talk
                .and_then(|t| t.owner_is_client)
                .unwrap_or(live.outbound);
            let Some(peer) = live.peer.filter(|p| client && p.port() != 0) else {
                continue;
            };
            let u = match talk {
                Some(t) if t.in_flight() => Use::Busy,
                Some(t) if t.exchanged() => Use::Idle,
                _ => Use::Unknown,
            };
            pools.count(&live.owner, peer, live.server_name.as_ref(), u, now_unix_ns);
        }
    }

    /// /proc entries that could not be read so far.
    pub fn proc_unreadable(&self) -> u64 {
        self.procs.unreadable
    }

    /// Applies one kernel event; a close yields the connection's final record.
    pub fn handle(&mut self, event: Event) -> Option<Box<ConnRecord>> {
        match event {
            Event::Owner {
                ts_ns,
                sk,
                pid,
                tid,
                comm,
                direction,
                remote,
                remote_port,
            } => {
                let peer = remote.map(|ip| std::net::SocketAddr::new(ip, remote_port));
                self.owned(ts_ns, sk, (pid, tid, comm), direction, peer);
                None
            }
            Event::Close(conn, tls) => {
                if self.linger(&conn, &tls) {
                    return None;
                }
                Some(self.close(conn, tls))
            }
            Event::Dns(ev) => {
                let mut r = DnsRecord::new(&ev, &self.clock);
                self.wire
                    .complete_libc(&mut r, ev.tid, ev.start_ns, &self.clock);
                self.add_lookup(r);
                None
            }
            Event::DnsPacket(mut ev) => {
                self.name_sender(&mut ev);
                for r in self.wire.packet(&ev, &self.clock) {
                    self.add_lookup(r);
                }
                None
            }
            Event::DnsSockReleased { ts_ns, cookie } => {
                for r in self.wire.released(cookie, ts_ns, &self.clock) {
                    self.add_lookup(r);
                }
                None
            }
            Event::TlsName { sk, len, name } => {
                self.server_name(sk, &name[..len]);
                None
            }
            Event::Plaintext(ev) => {
                self.http_data(&ev);
                None
            }
            // For the TLS probe manager, not for the table.
            Event::TlsProcess { .. } | Event::TlsBusy { .. } => None,
            Event::Exec {
                pid,
                cgroup_id,
                filename,
            } => {
                self.procs.exec(pid, &comm_str_n(&filename), cgroup_id);
                None
            }
            Event::Exit { pid } => {
                self.procs.forget(pid);
                self.listeners.exited(pid);
                None
            }
            Event::Listen {
                sk,
                pid,
                port,
                listening,
            } => {
                if listening {
                    self.listeners.began(sk, pid, port);
                } else {
                    self.listeners.ended(sk);
                }
                None
            }
        }
    }

    /// A query's sender without a name (a kernel whose packet programs may
    /// not ask for it): the process's, from its pid.
    fn name_sender(&mut self, ev: &mut observer_common::dns::DnsPacketEvent) {
        if ev.comm[0] != 0 || ev.pid == 0 {
            return;
        }
        if let Some(c) = &self.procs.get(ev.pid).comm {
            let n = c.len().min(15);
            ev.comm[..n].copy_from_slice(&c.as_bytes()[..n]);
        }
    }

    /// A connection got its owner (`pid`, `tid`, the thread's name).
    fn owned(
        &mut self,
        ts_ns: u64,
        sk: u64,
        (pid, tid, comm): (u32, u32, [u8; 16]),
        direction: u8,
        peer: Option<std::net::SocketAddr>,
    ) {
        // The lookup an outbound connection follows is marked at
        // connect: it is not traced on its own.
        if let (observer_common::DIR_OUTBOUND, Some(p)) = (direction, peer) {
            let _ = self
                .lookups
                .join(pid, tid, p.ip(), self.clock.to_unix_ns(ts_ns));
        }
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
        }
        let info = self.procs.get(pid);
        // Zeroes where the kernel's packet programs may not ask for the
        // name: the process's.
        let thread_comm = match (&info.comm, comm[0]) {
            (Some(c), 0) => Arc::clone(c),
            _ => self
                .names
                .entry(comm)
                .or_insert_with(|| Arc::from(comm_str(&comm)))
                .clone(),
        };
        let owner = Owner {
            pid,
            tid,
            comm: info.comm.clone().unwrap_or_else(|| thread_comm.clone()),
            thread_comm,
            exe: info.exe.clone(),
            container: info.container.clone(),
        };
        self.live.insert(
            sk,
            Live {
                owner,
                server_name: self.early_names.remove(&sk),
                last_snapshot_ns: 0,
                missing: false,
                outbound: direction == observer_common::DIR_OUTBOUND,
                peer,
            },
        );
    }

    /// The TLS server name the client's library was given for socket `sk`
    /// (held until the socket's owner is known, if it is not yet).
    fn server_name(&mut self, sk: u64, name: &[u8]) {
        let name = String::from_utf8_lossy(name);
        let name = name.trim_end_matches('\0');
        // A literal address is never sent as a server name (RFC
        // 6066); Go's client config holds one when dialing an IP.
        if name.parse::<std::net::IpAddr>().is_ok() {
            return;
        }
        match self.live.get_mut(&sk) {
            Some(live) => live.server_name = Some(Arc::from(name)),
            None => {
                if self.early_names.len() >= MAX_EARLY_NAMES {
                    self.early_names.clear();
                }
                self.early_names.insert(sk, Arc::from(name));
            }
        }
    }

    /// A connection's final record, and its requests in flight ended.
    fn close(&mut self, conn: Conn, tls: TlsConn) -> Box<ConnRecord> {
        let live = self.live.remove(&conn.sk);
        let talk = self.http.remove(&conn.sk);
        self.early_names.remove(&conn.sk);
        self.close_with(conn, tls, live, talk)
    }

    /// `close` with what was under the connection's socket.
    fn close_with(
        &mut self,
        conn: Conn,
        tls: TlsConn,
        live: Option<Live>,
        talk: Option<crate::http::Conversation>,
    ) -> Box<ConnRecord> {
        // Boxed at once: the record moves through the correlator and two
        // queues, 672 bytes at each step otherwise.
        let mut r = Box::new(ConnRecord::new(
            &conn,
            live.as_ref().map(|l| &l.owner),
            &self.clock,
            State::Closed,
        ));
        // Requests the close ends are made once the record has its
        // TLS and lookup: the first one's trace shows those phases.
        let mut ended = Vec::new();
        let mut shared = None;
        if let Some(mut c) = talk {
            shared = c.shared;
            set_direction(&mut r, c.owner_is_client);
            self.http_orphans_closed += c.orphans;
            if let Some(h2) = &c.h2 {
                self.h2_losses_closed.0 += h2.undecodable;
                self.h2_losses_closed.1 += h2.lost;
                r.http2 = Some(h2.counts());
            }
            // A plain connection whose copying stopped (busy): what
            // was in flight is not known to have ended badly. (A TLS
            // connection's own packets are never HTTP: its plaintext
            // comes from the library.)
            let stopped = conn.flags & FLAG_TLS == 0 && conn.http == observer_common::http::NO;
            r.first_request = c.first_request;
            r.requests = Some(c.requests_seen()).filter(|&n| n > 0);
            if !stopped {
                ended = c.close();
            }
        }
        let established = conn.flags & observer_common::FLAG_ESTABLISHED != 0
            || conn.flags & observer_common::FLAG_MIDSTREAM != 0;
        r.closed_by = r.who_closed(established);
        let name = live.and_then(|l| l.server_name);
        r.tls = TlsRecord::new(
            &tls,
            &conn,
            r.direction,
            State::Closed,
            name,
            Some(&self.clock),
        );
        match r.tls.as_ref().and_then(|t| t.ttfb_unmeasured) {
            Some(TtfbUnmeasured::ClientSocketOnly) => {
                self.tls_unmeasured.client_socket_only += 1;
            }
            Some(TtfbUnmeasured::PlaintextLate) => self.tls_unmeasured.plaintext_late += 1,
            Some(TtfbUnmeasured::WireTls13) => self.tls_unmeasured.wire_tls13 += 1,
            None => {}
        }
        join_dns(&mut self.lookups, &mut r);
        for (x, cut) in ended {
            let mut q = RequestRecord::new(x, cut, &r, &self.clock, self.keep_query);
            place_in_trace(&mut q, shared, r.first_request, &mut self.pairs);
            if q.connection.is_some() {
                r.first_request = Some(FirstRequest {
                    waited: q.ttfb_ns.is_some(),
                    trace: q.trace.ids(),
                });
            }
            self.requests_out.push(Box::new(q));
        }
        r
    }

    /// Snapshot records ("state": "open") of connections open for at least
    /// `interval_ns` and not reported in the last `interval_ns`. A connection
    /// missing from CONNS on two passes in a row is counted as evicted.
    pub fn periodic(
        &mut self,
        kernel: &impl KernelConns,
        now_ns: u64,
        interval_ns: u64,
    ) -> Vec<ConnRecord> {
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (&sk, live) in &mut self.live {
            if now_ns.saturating_sub(live.last_snapshot_ns) < interval_ns {
                continue;
            }
            kernel.refresh(sk);
            match kernel.lookup(sk) {
                // Closed, waiting for the socket to be destroyed: its final
                // record is on its way.
                Some(conn) if conn.end_ns != 0 => live.missing = false,
                Some(conn) => {
                    live.missing = false;
                    if now_ns.saturating_sub(conn.start_ns) >= interval_ns {
                        live.last_snapshot_ns = now_ns;
                        let mut r = snapshot(kernel, &conn, live, &self.clock, State::Open);
                        set_direction(&mut r, self.http.get(&sk).and_then(|c| c.owner_is_client));
                        join_dns(&mut self.lookups, &mut r);
                        r.http2 = self
                            .http
                            .get(&sk)
                            .and_then(|c| Some(c.h2.as_ref()?.counts()));
                        out.push(r);
                    }
                }
                // Its close event may still be in flight: only the second miss counts.
                None if live.missing => gone.push(sk),
                None => live.missing = true,
            }
        }
        self.evicted += gone.len() as u64;
        for sk in gone {
            self.live.remove(&sk);
            self.http.remove(&sk);
        }
        self.forget_ownerless(kernel);
        out
    }

    /// Forgets the trace nonces of connections none of whose ends still
    /// has a conversation here (open or waiting for its last bytes).
    fn forget_pairs(&mut self) {
        let nonce_of = |t: &crate::http::Conversation| t.shared.map(|s| s.nonce());
        let waiting: HashMap<u64, u64> = self
            .closing
            .iter()
            .filter_map(|c| Some((c.conn.sk, nonce_of(c.talk.as_ref()?)?)))
            .collect();
        let http = &self.http;
        self.pairs.retain(|sk, nonce| {
            http.get(&sk).and_then(nonce_of) == Some(nonce) || waiting.get(&sk) == Some(&nonce)
        });
    }

    /// Drops what is held for sockets whose owner the table never learnt
    /// (a server's conversation and hello before its first send) once they
    /// are gone from CONNS on two passes in a row: on the first, their
    /// socket's close, or the owner and the answer, may still be on their
    /// way from the ring (it is drained in batches, and a tick runs between
    /// two).
    fn forget_ownerless(&mut self, kernel: &impl KernelConns) {
        let missed_before = std::mem::take(&mut self.ownerless_missing);
        let missing = &mut self.ownerless_missing;
        let mut gone = |sk: u64| {
            if missed_before.contains(&sk) {
                return kernel.lookup(sk).is_none();
            }
            if kernel.lookup(sk).is_none() {
                missing.insert(sk);
            }
            false
        };
        let live = &self.live;
        self.http
            .retain(|sk, _| live.contains_key(sk) || !gone(*sk));
        self.early_names.retain(|sk, _| !gone(*sk));
    }

    /// Records of every connection still open, for when watching stops. Call it
    /// after the ring buffer was drained: a connection missing from CONNS then
    /// lost its close event and is counted as evicted.
    pub fn drain_open(&mut self, kernel: &impl KernelConns) -> Vec<ConnRecord> {
        let mut out = Vec::new();
        for (sk, live) in self.live.drain() {
            kernel.refresh(sk);
            match kernel.lookup(sk) {
                Some(conn) => {
                    // Closed but not destroyed yet (the owner still holds the fd).
                    let state = if conn.end_ns != 0 {
                        State::Closed
                    } else {
                        State::Open
                    };
                    let mut r = snapshot(kernel, &conn, &live, &self.clock, state);
                    set_direction(&mut r, self.http.get(&sk).and_then(|c| c.owner_is_client));
                    join_dns(&mut self.lookups, &mut r);
                    r.http2 = self
                        .http
                        .get(&sk)
                        .and_then(|c| Some(c.h2.as_ref()?.counts()));
                    out.push(r);
                }
                None => self.evicted += 1,
            }
        }
        out.sort_by_key(|r| r.start_unix_ns);
        out
    }
}

/// Feeds a call's bytes to its connection's conversation; the exchanges it
/// ends become request records in `out.1` (lookups, `out.0`, join the
/// first one's connection).
// The records are boxed where made: they move on as boxes (see `requests_out`).
#[allow(clippy::vec_box)]
fn feed(
    talk: &mut crate::http::Conversation,
    live: Option<&Live>,
    ev: &observer_common::http::PlaintextEvent,
    clock: &Clock,
    (pairs, keep_query): (&mut Pairs, bool),
    out: (&mut Lookups, &mut Vec<Box<RequestRecord>>),
) {
    let outbound = ev.conn.direction != observer_common::DIR_INBOUND;
    let done = talk.feed(ev, outbound);
    if done.is_empty() {
        return;
    }
    let mut conn = Box::new(ConnRecord::new(
        &ev.conn,
        live.map(|l| &l.owner),
        clock,
        State::Open,
    ));
    set_direction(&mut conn, talk.owner_is_client);
    // The first request's trace shows the connection's phases.
    if done.iter().any(|x| x.index == Some(1)) {
        if ev.hs_end_ns != 0 {
            let tls = TlsConn {
                hs_start_ns: ev.hs_start_ns,
                hs_end_ns: ev.hs_end_ns,
                library: ev.library,
                flags: TLS_HS_STARTED | TLS_HS_DONE,
                ..TlsConn::default()
            };
            let name = live.and_then(|l| l.server_name.clone());
            conn.tls = TlsRecord::new(
                &tls,
                &ev.conn,
                conn.direction,
                State::Open,
                name,
                Some(clock),
            );
        }
        join_dns(out.0, &mut conn);
    }
    // The first request's record takes the connection's (moved in below,
    // not copied: under churn every request is a connection's first).
    let mut first = None;
    for x in done {
        let is_first = x.index == Some(1);
        let mut r = Box::new(RequestRecord::bare(x, None, &conn, clock, keep_query));
        place_in_trace(&mut r, talk.shared, talk.first_request, pairs);
        if is_first {
            talk.first_request = Some(FirstRequest {
                waited: r.ttfb_ns.is_some(),
                trace: r.trace.ids(),
            });
            first = Some(out.1.len());
        }
        out.1.push(r);
    }
    if let Some(at) = first {
        out.1[at].connection = Some(conn);
    }
}

/// Gives request `r` its trace ids (see `http::trace_context`): derived
/// from the nonce its connection's ends share (`shared`) and its place on
/// the connection (HTTP/2: the stream; HTTP/1.x: the index), fresh when
/// either is unknown; `first`: the connection's first request, which a
/// later one links to.
fn place_in_trace(
    r: &mut RequestRecord,
    shared: Option<Shared>,
    first: Option<FirstRequest>,
    pairs: &mut Pairs,
) {
    use crate::record::Direction;
    let incoming = r.trace.incoming;
    let client = r.direction == Direction::Outbound;
    let ids = match (shared, r.stream_id.or(r.request_index)) {
        (Some(shared), Some(place)) => {
            let local = (r.local_addr, r.local_port);
            let remote = (r.remote_addr, r.remote_port);
            let both_here = !client && pairs.both_here(shared, local, remote);
            shared.request(place, client, both_here, incoming.as_ref())
        }
        _ => trace_context::unplaced(pairs, incoming.as_ref()),
    };
    r.trace.set(ids);
    r.trace.first_request = first.and_then(|f| f.trace);
}

/// A connection first seen mid-way has the direction its requests showed
/// (the kernel's is a guess from the ports).
fn set_direction(r: &mut ConnRecord, owner_is_client: Option<bool>) {
    use crate::record::Direction;
    if let Some(client) = owner_is_client {
        r.direction = if client {
            Direction::Outbound
        } else {
            Direction::Inbound
        };
    }
}

/// Attaches the lookup an outbound connection followed. A connection to a
/// DNS server (DNS over TCP) carries lookups; it does not follow one.
fn join_dns(lookups: &mut Lookups, r: &mut ConnRecord) {
    if r.direction == crate::record::Direction::Outbound
        && r.remote_port != observer_common::dns::DNS_PORT
    {
        if let (Some(pid), Some(tid)) = (r.pid, r.tid) {
            r.dns = lookups.join(pid, tid, r.remote_addr, r.start_unix_ns);
        }
    }
}

/// The record of a connection read from the kernel's maps.
fn snapshot(
    kernel: &impl KernelConns,
    conn: &Conn,
    live: &Live,
    clock: &Clock,
    state: State,
) -> ConnRecord {
    let mut r = ConnRecord::new(conn, Some(&live.owner), clock, state);
    if conn.flags & FLAG_TLS != 0 {
        if let Some(tls) = kernel.lookup_tls(conn.sk) {
            r.tls = TlsRecord::new(
                &tls,
                conn,
                r.direction,
                state,
                live.server_name.clone(),
                Some(clock),
            );
        }
    }
    r
}

mod legs;

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use observer_common::{
        tls::op, AF_INET, DIR_INBOUND, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED,
    };

    use super::*;

    #[derive(Default)]
    struct FakeKernel(RefCell<HashMap<u64, Conn>>);

    impl KernelConns for FakeKernel {
        fn lookup(&self, sk: u64) -> Option<Conn> {
            self.0.borrow().get(&sk).copied()
        }
    }

    fn table() -> ConnTable {
        ConnTable::new(ProcessCache::new("/proc"), Clock::with_offset(0))
    }

    fn owner_event(sk: u64, pid: u32) -> Event {
        Event::Owner {
            ts_ns: 1,
            sk,
            pid,
            tid: pid + 1,
            comm: *b"worker-thread\0\0\0",
            direction: DIR_OUTBOUND,
            remote: None,
            remote_port: 0,
        }
    }

    fn conn(sk: u64, pid: u32) -> Conn {
        Conn {
            sk,
            start_ns: 100,
            established_ns: 200,
            pid,
            tid: pid + 1,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            ..Conn::default()
        }
    }

    #[test]
    fn owner_then_close_gives_one_record_with_process_details() {
        let me = std::process::id();
        let mut t = table();
        assert_eq!(t.handle(owner_event(1, me)), None);
        assert_eq!(t.live_len(), 1);
        let closed = Conn {
            end_ns: 1_000,
            ..conn(1, me)
        };
        let r = t
            .handle(Event::Close(closed, TlsConn::default()))
            .expect("a record");
        assert_eq!(r.pid, Some(me));
        assert_eq!(r.tid, Some(me + 1));
        assert_eq!(r.thread_comm.as_deref(), Some("worker-thread"));
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(r.exe.as_deref(), exe.to_str());
        assert_eq!(r.state, State::Closed);
        assert_eq!(t.live_len(), 0);
    }

    #[test]
    fn inbound_closed_without_io_has_no_process() {
        let mut t = table();
        let c = Conn {
            direction: DIR_INBOUND,
            flags: FLAG_ESTABLISHED,
            pid: 0,
            ..conn(5, 0)
        };
        let r = t
            .handle(Event::Close(c, TlsConn::default()))
            .expect("a record");
        assert_eq!(r.pid, None);
        assert_eq!(r.comm, None);
    }

    #[test]
    fn periodic_snapshots_and_eviction() {
        let mut t = table();
        let k = FakeKernel::default();
        t.handle(owner_event(1, 10));
        t.handle(owner_event(2, 11));
        k.0.borrow_mut().insert(1, conn(1, 10));
        k.0.borrow_mut().insert(2, conn(2, 11));
        // Too young for a snapshot.
        assert!(t.periodic(&k, 150, 100).is_empty());
        let snap = t.periodic(&k, 10_000, 100);
        assert_eq!(snap.len(), 2);
        assert!(snap
            .iter()
            .all(|r| r.state == State::Open && r.end_unix_ns.is_none()));
        // sk 2 leaves CONNS without a close event.
        k.0.borrow_mut().remove(&2);
        assert!(t.periodic(&k, 10_050, 100).is_empty(), "reported recently");
        assert_eq!(t.periodic(&k, 20_000, 100).len(), 1);
        assert_eq!(t.evicted, 0, "one miss may be a close in flight");
        assert_eq!(t.periodic(&k, 30_000, 100).len(), 1);
        assert_eq!(t.evicted, 1);
        assert_eq!(t.live_len(), 1);
        // Closed in the kernel, waiting for destruction: no snapshot, and a
        // final record at stop.
        k.0.borrow_mut().get_mut(&1).expect("present").end_ns = 25_000;
        assert!(t.periodic(&k, 40_000, 100).is_empty());
        let open = t.drain_open(&k);
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].state, State::Closed);
        assert_eq!(t.live_len(), 0);
    }

    #[test]
    fn tls_name_and_timings_join_the_connection() {
        use observer_common::tls::{library, SERVER_NAME_LEN, TLS_HS_DONE, TLS_HS_STARTED};
        let mut t = table();
        t.handle(owner_event(3, 10));
        let mut name = [0u8; SERVER_NAME_LEN];
        name[..8].copy_from_slice(b"api.test");
        assert_eq!(
            t.handle(Event::TlsName {
                sk: 3,
                len: 8,
                name
            }),
            None
        );
        // A name that comes before its socket's owner (a server's: the
        // ClientHello arrives before the server reads it) waits for it.
        assert_eq!(
            t.handle(Event::TlsName {
                sk: 99,
                len: 8,
                name
            }),
            None
        );
        t.handle(owner_event(99, 10));
        let wire = TlsConn {
            hs_start_ns: 300,
            hs_end_ns: 900,
            library: library::WIRE,
            flags: TLS_HS_STARTED | TLS_HS_DONE,
            version: 0x0304,
            ..TlsConn::default()
        };
        let r = t
            .handle(Event::Close(conn(99, 10), wire))
            .expect("a record");
        let tls = r.tls.expect("a tls object");
        assert_eq!(tls.server_name.as_deref(), Some("api.test"));
        assert_eq!(tls.version, Some("1.3"), "the ServerHello's version");
        assert!(t.early_names.is_empty());
        // One for a socket that closes with no owner is forgotten.
        t.handle(Event::TlsName {
            sk: 98,
            len: 8,
            name,
        });
        let _ = t.handle(Event::Close(conn(98, 10), TlsConn::default()));
        assert!(t.early_names.is_empty());
        let tls = TlsConn {
            hs_start_ns: 300,
            hs_end_ns: 900,
            library: library::OPENSSL,
            flags: TLS_HS_STARTED | TLS_HS_DONE,
            ..TlsConn::default()
        };
        let closed = Conn {
            end_ns: 1_000,
            flags: FLAG_OWNED | FLAG_ESTABLISHED | FLAG_TLS,
            ..conn(3, 10)
        };
        let r = t.handle(Event::Close(closed, tls)).expect("a record");
        let tls = r.tls.expect("a tls object");
        assert_eq!(tls.server_name.as_deref(), Some("api.test"));
        assert_eq!(tls.handshake_ns, Some(600));
        assert_eq!(
            tls.setup_ns,
            Some(100),
            "established at 200, first TLS call at 300"
        );
        // Without TLS the object is null.
        t.handle(owner_event(4, 10));
        let r = t
            .handle(Event::Close(conn(4, 10), TlsConn::default()))
            .expect("a record");
        assert_eq!(r.tls, None);
    }

    #[test]
    fn exec_forgets_cached_process() {
        let mut t = table();
        let me = std::process::id();
        t.handle(owner_event(1, me));
        assert_eq!(t.procs.len(), 1);
        let mut filename = [0u8; 256];
        filename[..9].copy_from_slice(b"/bin/true");
        t.handle(Event::Exec {
            pid: me,
            cgroup_id: 0,
            filename,
        });
        let exe = t
            .procs
            .get(me)
            .exe
            .clone()
            .expect("exe from the exec event");
        assert!(exe.ends_with("true"), "{exe}");
        t.handle(Event::Exit { pid: me });
        assert!(t.procs.is_empty());
    }

    fn plain(conn: Conn, op: u8, t: u64, bytes: &[u8]) -> Event {
        Event::Plaintext(crate::decode::Plaintext::new(
            observer_common::http::PlaintextEvent::of_call(
                conn,
                op,
                t,
                bytes,
                observer_common::http::DATA_FROM_START,
            ),
        ))
    }

    const ASKED: &[u8] = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n";
    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";

    /// A close seen before the read that brought the answer's last bytes
    /// (the library call returned after the peer closed): the close waits,
    /// and the answer ends whole, not "incomplete" with an orphan after it.
    #[test]
    fn a_close_waits_for_the_last_bytes_of_an_answer_in_flight() {
        let me = std::process::id();
        let mut t = table();
        t.handle(owner_event(1, me));
        let c = conn(1, me);
        t.handle(plain(c, op::WRITE, 1_000, ASKED));
        t.handle(plain(c, op::READ, 2_000, HEAD));
        let closed = Conn { end_ns: 4_000, ..c };
        assert_eq!(t.handle(Event::Close(closed, TlsConn::default())), None);
        assert!(t.conns_out.is_empty() && t.requests_out.is_empty());
        t.handle(plain(c, op::READ, 3_000, b"hello"));
        assert_eq!(t.conns_out.len(), 1, "the close ends with its exchange");
        assert_eq!(t.conns_out[0].state, State::Closed);
        assert_eq!(t.requests_out.len(), 1);
        let q = &t.requests_out[0];
        assert_eq!((q.status, q.error), (Some(200), None));
        assert_eq!(t.http_orphans(), 0);
        assert_eq!((t.close_lingered, t.close_linger_completed), (1, 1));
    }

    /// A close without an exchange in flight is made at once; one whose
    /// last bytes never come ends when due, cut; one whose socket a new
    /// connection takes meanwhile still gets its late bytes, apart from the
    /// new connection's.
    #[test]
    fn a_waiting_close_ends_when_due_and_outlives_a_new_connection_on_its_socket() {
        let me = std::process::id();
        let mut t = table();
        let c = conn(1, me);
        t.handle(plain(c, op::WRITE, 1_000, ASKED));
        t.handle(plain(c, op::READ, 2_000, HEAD));
        t.handle(plain(c, op::READ, 2_500, b"hello"));
        let closed = Conn { end_ns: 4_000, ..c };
        assert!(t.handle(Event::Close(closed, TlsConn::default())).is_some());

        let c = conn(2, me);
        t.handle(plain(c, op::WRITE, 1_000, ASKED));
        t.handle(plain(c, op::READ, 2_000, HEAD));
        let closed = Conn { end_ns: 4_000, ..c };
        assert_eq!(t.handle(Event::Close(closed, TlsConn::default())), None);
        t.end_closes_due(crate::clock::monotonic_ns());
        assert!(t.conns_out.is_empty(), "not due yet");
        t.end_closes_due(u64::MAX);
        assert_eq!(t.conns_out.len(), 1);
        let q = t.requests_out.last().expect("the cut request");
        assert_eq!(q.error, Some("incomplete"));

        t.conns_out.clear();
        let c = conn(3, me);
        t.handle(plain(c, op::WRITE, 1_000, ASKED));
        t.handle(plain(c, op::READ, 2_000, HEAD));
        let closed = Conn { end_ns: 4_000, ..c };
        assert_eq!(t.handle(Event::Close(closed, TlsConn::default())), None);
        let again = Conn {
            start_ns: 9_000,
            ..conn(3, me)
        };
        t.handle(owner_event(3, me));
        t.handle(plain(again, op::WRITE, 9_500, ASKED));
        assert!(
            t.conns_out.is_empty(),
            "the new connection leaves it waiting"
        );
        t.handle(plain(c, op::READ, 3_000, b"hello"));
        assert_eq!(t.conns_out.len(), 1, "its late bytes end it");
        assert_eq!(t.conns_out[0].start_unix_ns, t.clock.to_unix_ns(100));
        let q = t.requests_out.last().expect("the old connection's request");
        assert_eq!((q.status, q.error), (Some(200), None));
        assert_eq!(t.http_orphans(), 0);
        assert!(
            t.http.get(&3).is_some_and(|c| c.in_flight()),
            "the new one's own"
        );
    }

    /// A server's socket has no owner until it first sends; the snapshot
    /// pass that runs while its answer (and, by then, its close) is still
    /// in the ring finds it gone from CONNS once. Its request is kept and
    /// answered, and only a socket missing on two passes is forgotten.
    #[test]
    fn an_ownerless_conversation_outlives_one_pass_that_misses_its_socket() {
        let me = std::process::id();
        let mut t = table();
        let k = FakeKernel::default();
        let server = Conn {
            direction: DIR_INBOUND,
            pid: 0,
            flags: FLAG_ESTABLISHED,
            ..conn(7, 0)
        };
        t.handle(plain(server, op::READ, 1_000, ASKED));
        assert!(t.periodic(&k, 10_000, 100).is_empty());
        let owned = Conn {
            pid: me,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            ..server
        };
        t.handle(owner_event(7, me));
        t.handle(plain(owned, op::WRITE, 2_000, HEAD));
        t.handle(plain(owned, op::WRITE, 2_100, b"hello"));
        assert_eq!(t.requests_out.len(), 1, "the request survived the pass");
        let q = &t.requests_out[0];
        assert_eq!((q.method.as_deref(), q.status), (Some("GET"), Some(200)));

        // A socket that really went (its close lost): two passes.
        let lost = Conn {
            direction: DIR_INBOUND,
            ..conn(8, 0)
        };
        t.handle(plain(lost, op::READ, 3_000, ASKED));
        t.periodic(&k, 20_000, 100);
        assert!(t.http.contains_key(&8), "one miss is not enough");
        t.periodic(&k, 30_000, 100);
        assert!(!t.http.contains_key(&8), "two are");
        assert!(t.ownerless_missing.is_empty(), "nothing left to watch");
    }
}
