//! Gathers a run's records and turns them into calls: requests get their
//! connection's phases, lookups their server and retries, clients the
//! record of the server that answered them on this host. Calls are judged
//! at the end, once every side of them has been seen.

use std::collections::HashMap;

use serde_json::Value;

use super::{only::Only, read::Record};
use crate::{
    cause::call::{Call, ServerSide},
    output::Line,
};

/// Records held at once; past it, further calls are counted, not kept (a
/// diagnosis is for minutes of traffic, not days).
pub const MAX_RECORDS: usize = 500_000;

#[derive(Debug, Default)]
pub struct Collector {
    requests: Vec<Call>,
    conns: Vec<Call>,
    /// (pid, name) -> each lookup seen.
    lookups: HashMap<(u32, String), Vec<Seen>>,
    /// Calls not kept past [`MAX_RECORDS`].
    pub not_kept: u64,
    /// Pool records, for "pool leak".
    pub pools: super::pools::PoolSamples,
}

/// A lookup's start, the server asked and its retries.
type Seen = (u64, Option<String>, Option<u32>);

type Tuple = (String, u16, String, u16);

fn tuple(c: &Call) -> Tuple {
    (
        c.local_addr.clone(),
        c.local_port,
        c.remote_addr.clone(),
        c.remote_port,
    )
}

fn reversed(c: &Call) -> Tuple {
    (
        c.remote_addr.clone(),
        c.remote_port,
        c.local_addr.clone(),
        c.local_port,
    )
}

/// The record's end (start + duration), for matching records in time.
fn end(c: &Call) -> u64 {
    c.start_unix_ns + c.duration_ns
}

/// Records of one connection may start a little apart (clocks read on
/// different CPUs, the request after the connect).
const SLACK_NS: u64 = 50_000_000;

impl Collector {
    /// Takes one `watch --json` record. False: not a record `diagnose`
    /// reads (counted by the caller as a skipped line).
    pub fn add(&mut self, v: &Value) -> bool {
        Record::from_json(v).map(|r| self.take(r)).is_some()
    }

    /// Takes one record of the live pipeline.
    pub fn add_line(&mut self, line: &Line) {
        self.take(Record::of_line(line));
    }

    /// Both readings end here: a line and its typed record are one
    /// `Record`, so the live run and its saved stream cannot drift apart.
    fn take(&mut self, r: Record) {
        match r {
            Record::Call(c) => self.keep(c),
            Record::Snapshot => {}
            Record::Lookup(l) => self.lookups.entry((l.pid, l.name)).or_default().push((
                l.start_unix_ns,
                l.server,
                l.retries,
            )),
            Record::Pool(p) => self.pools.add(p),
        }
    }

    /// Past [`MAX_RECORDS`] a call is counted, not kept.
    fn keep(&mut self, c: Call) {
        if self.requests.len() + self.conns.len() >= MAX_RECORDS {
            self.not_kept += 1;
        } else if c.record == "request" {
            self.requests.push(c);
        } else {
            self.conns.push(c);
        }
    }

    /// The calls: requests (the first of a connection with its lookup,
    /// connect and TLS), connections that carried no request, and servers'
    /// records on this host folded into the clients' calls they answered.
    pub fn calls(mut self, only: &Only) -> Vec<Call> {
        let mut by_tuple: HashMap<Tuple, Vec<usize>> = HashMap::new();
        for (i, c) in self.conns.iter().enumerate() {
            by_tuple.entry(tuple(c)).or_default().push(i);
        }
        let mut conn_used = vec![false; self.conns.len()];
        self.requests.sort_by_key(|r| r.start_unix_ns);
        for r in &mut self.requests {
            let Some(&i) = by_tuple.get(&tuple(r)).and_then(|v| {
                v.iter().find(|&&i| {
                    let c = &self.conns[i];
                    c.start_unix_ns <= r.start_unix_ns + SLACK_NS
                        && r.start_unix_ns <= end(c) + SLACK_NS
                })
            }) else {
                continue;
            };
            let conn = &self.conns[i];
            if !conn_used[i] {
                // The connection's first request waited for its phases.
                conn_used[i] = true;
                r.dns = conn.dns.clone();
                r.connect_ns = conn.connect_ns;
                r.tls_setup_ns = conn.tls_setup_ns;
                r.tls_handshake_ns = conn.tls_handshake_ns;
                r.retransmits = conn.retransmits;
                if r.error.is_none() {
                    r.error = conn.error.clone();
                }
                if r.gpus.is_empty() {
                    r.gpus = conn.gpus.clone();
                }
            }
            r.srtt_us = conn.srtt_us;
            r.comm = r.comm.take().or_else(|| conn.comm.clone());
            if r.host.is_none() {
                r.host = conn.host.clone();
            }
        }
        let mut calls: Vec<Call> = std::mem::take(&mut self.requests);
        calls.extend(
            std::mem::take(&mut self.conns)
                .into_iter()
                .zip(conn_used)
                .filter_map(|(c, used)| (!used).then_some(c)),
        );
        for c in &mut calls {
            self.fill_lookup(c);
        }
        let calls = fold_servers(calls);
        calls.into_iter().filter(|c| only.keeps(c)).collect()
    }

    /// The server and retries of the lookup a call's record joined: the same
    /// process's latest lookup of the name that started before the call.
    fn fill_lookup(&self, c: &mut Call) {
        let (Some(pid), Some(d)) = (c.pid, c.dns.as_mut()) else {
            return;
        };
        let Some(seen) = self.lookups.get(&(pid, d.name.clone())) else {
            return;
        };
        if let Some((_, server, retries)) = seen
            .iter()
            .filter(|(start, _, _)| *start <= c.start_unix_ns + SLACK_NS)
            .max_by_key(|(start, _, _)| *start)
        {
            d.server = server.clone();
            d.retries = *retries;
        }
    }
}

/// A client's call and the server's record of it, both on this host: the
/// same connection seen from its two ends. The server's wait becomes the
/// client's evidence, and the server's record is not a call of its own.
fn fold_servers(calls: Vec<Call>) -> Vec<Call> {
    let mut inbound: HashMap<Tuple, Vec<usize>> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        if c.direction == "inbound" {
            inbound.entry(tuple(c)).or_default().push(i);
        }
    }
    let mut folded = vec![false; calls.len()];
    let mut sides: Vec<(usize, ServerSide)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if c.direction != "outbound" {
            continue;
        }
        let Some(&j) = inbound.get(&reversed(c)).and_then(|v| {
            v.iter().find(|&&j| {
                let s = &calls[j];
                !folded[j]
                    && s.record == c.record
                    && c.start_unix_ns <= s.start_unix_ns + SLACK_NS
                    && s.start_unix_ns <= end(c) + SLACK_NS
            })
        }) else {
            continue;
        };
        folded[j] = true;
        let s = &calls[j];
        sides.push((
            i,
            ServerSide {
                pid: s.pid,
                comm: s.comm.clone(),
                wait_ns: s.first_token_ns.or(s.ttfb_ns),
                own_ns: s.own_ns,
                gpus: s.gpus.clone(),
            },
        ));
    }
    let mut calls = calls;
    for (i, side) in sides {
        calls[i].server = Some(side);
    }
    calls
        .into_iter()
        .zip(folded)
        .filter_map(|(c, f)| (!f).then_some(c))
        .collect()
}
