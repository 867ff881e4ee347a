//! `observer top`'s pool view (`--by pool`, or `o`): one row per process
//! and peer, from the pool records the correlator sends each second. What
//! is open comes from the latest record; rates and shares from the records
//! of the window.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    time::{Duration, Instant},
};

use ratatui::{
    style::{Modifier, Style},
    text::{Line, Span},
};

use crate::{pools::PoolRecord, units::fmt_ns};

/// One pool's records in the window: the latest whole, and the counters
/// of each (for rates over the window).
struct Series {
    latest: PoolRecord,
    at: Instant,
    /// (arrival, requests, new connections, closes).
    counts: VecDeque<(Instant, u64, u64, u64)>,
}

/// Records of a pool kept at most (one a second: an hour's window).
const MAX_COUNTS: usize = 3600;

#[derive(Default)]
pub struct PoolModel {
    pools: HashMap<(u32, SocketAddr), Series>,
}

/// One row of the pool view.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRow {
    pub pid: u32,
    pub comm: String,
    /// "name:port" when a TLS server name is known, else "address:port".
    pub peer: String,
    pub open: u32,
    pub busy: u32,
    pub idle: u32,
    /// Requests per second over the window.
    pub rate: f64,
    /// Share of the window's requests that opened a new connection.
    pub new_share: Option<f64>,
    /// Connections closed in the window.
    pub closed: u64,
    /// Mean age at close, since the pool was first seen.
    pub age_ns: Option<u64>,
}

impl PoolModel {
    pub fn add(&mut self, r: &PoolRecord, at: Instant) {
        let key = (r.pid, SocketAddr::new(r.peer_addr, r.peer_port));
        let s = self.pools.entry(key).or_insert_with(|| Series {
            latest: r.clone(),
            at,
            counts: VecDeque::new(),
        });
        s.latest = r.clone();
        s.at = at;
        if s.counts.len() >= MAX_COUNTS {
            s.counts.pop_front();
        }
        s.counts
            .push_back((at, r.requests, r.new_connections, r.closed.total()));
    }

    /// The rows as of `now`: pools with a record in the window. Rates and
    /// shares are over the window, or since `started` (the observer's
    /// start, when its counters began) when that is later.
    pub fn rows(&mut self, window: Duration, started: Instant, now: Instant) -> Vec<PoolRow> {
        let cutoff = now.checked_sub(window).unwrap_or(started).max(started);
        self.pools.retain(|_, s| s.at >= cutoff);
        for s in self.pools.values_mut() {
            // The newest record before the window stays: the window's
            // counts are differences from it.
            while s.counts.len() > 1 && s.counts[1].0 < cutoff {
                s.counts.pop_front();
            }
        }
        self.pools.values().map(|s| row(s, cutoff, now)).collect()
    }
}

fn row(s: &Series, cutoff: Instant, now: Instant) -> PoolRow {
    let r = &s.latest;
    // From the record before the window, or from nothing when every record
    // is in it (the counters start with the observer).
    let (t0, req0, new0, closed0) = match s.counts.front() {
        Some(&c) if c.0 < cutoff => c,
        _ => (cutoff, 0, 0, 0),
    };
    let secs = now.saturating_duration_since(t0).as_secs_f64().max(1.0);
    let requests = r.requests.saturating_sub(req0);
    let peer = match &r.server_name {
        Some(n) => format!("{n}:{}", r.peer_port),
        None => SocketAddr::new(r.peer_addr, r.peer_port).to_string(),
    };
    PoolRow {
        pid: r.pid,
        comm: r.comm.as_deref().unwrap_or("-").to_owned(),
        peer,
        open: r.open,
        busy: r.busy,
        idle: r.idle,
        rate: requests as f64 / secs,
        new_share: (requests > 0)
            .then(|| r.new_connections.saturating_sub(new0) as f64 / requests as f64),
        closed: r.closed.total().saturating_sub(closed0),
        age_ns: r.age_at_close_ns,
    }
}

/// The rows that match `filter` (pid, name or peer), most connections open
/// first.
pub fn visible(mut rows: Vec<PoolRow>, filter: &str) -> Vec<PoolRow> {
    let needle = filter.to_lowercase();
    rows.retain(|r| {
        needle.is_empty()
            || r.comm.to_lowercase().contains(&needle)
            || r.pid.to_string().contains(&needle)
            || r.peer.to_lowercase().contains(&needle)
    });
    rows.sort_by(|a, b| {
        b.open
            .cmp(&a.open)
            .then(b.rate.total_cmp(&a.rate))
            .then(a.pid.cmp(&b.pid))
            .then(a.peer.cmp(&b.peer))
    });
    rows
}

/// The columns but the peer's, with their spaces.
const OTHERS: usize = 65;

/// The view's header and row lines for a terminal `width` wide (the peer
/// column takes what the others leave, 12 to 40 characters).
pub fn lines(rows: &[PoolRow], width: usize) -> Vec<Line<'static>> {
    let peer_w = width.saturating_sub(OTHERS).clamp(12, 40);
    let head = format!(
        "{:>7} {:<10} {:<peer_w$} {:>5} {:>5} {:>5} {:>6} {:>4} {:>6} {:>7}",
        "PID", "COMM", "PEER", "OPEN", "BUSY", "IDLE", "REQ/S", "NEW%", "CLOSED", "AGE"
    );
    let style = Style::default().add_modifier(Modifier::REVERSED);
    let mut out = vec![Line::from(Span::styled(cut(&head, width), style))];
    for r in rows {
        let share = r
            .new_share
            .map_or("-".into(), |s| format!("{:.0}", s * 100.0));
        let peer: String = if r.peer.chars().count() > peer_w {
            let n = r.peer.chars().count();
            format!(
                "~{}",
                r.peer.chars().skip(n - peer_w + 1).collect::<String>()
            )
        } else {
            r.peer.clone()
        };
        let text = format!(
            "{:>7} {:<10} {:<peer_w$} {:>5} {:>5} {:>5} {:>6.1} {:>4} {:>6} {:>7}",
            r.pid,
            r.comm.chars().take(10).collect::<String>(),
            peer,
            r.open,
            r.busy,
            r.idle,
            r.rate,
            share,
            r.closed,
            fmt_ns(r.age_ns),
        );
        out.push(Line::from(cut(&text, width)));
    }
    out
}

fn cut(s: &str, w: usize) -> String {
    s.chars().take(w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools::Closes;

    fn record(pid: u32, open: u32, requests: u64, new: u64) -> PoolRecord {
        PoolRecord {
            kind: "pool",
            time_unix_ns: 0,
            pid,
            comm: Some("python3".into()),
            exe: None,
            container: None,
            peer_addr: "127.0.0.1".parse().expect("an address"),
            peer_port: 8080,
            server_name: None,
            open,
            busy: 0,
            idle: open,
            requests,
            new_connections: new,
            new_connection_share: None,
            closed: Closes::default(),
            requests_per_connection: None,
            age_at_close_ns: None,
            since_unix_ns: 0,
        }
    }

    #[test]
    fn rows_rate_over_the_window_and_show_the_latest_open() {
        let t0 = Instant::now();
        let mut m = PoolModel::default();
        // Records from 1 s after the start: 10 requests a second, one new
        // connection each second for the first pool.
        for i in 1..=4u32 {
            let at = t0 + Duration::from_secs(u64::from(i));
            m.add(&record(7, i, 10 * u64::from(i), u64::from(i)), at);
            m.add(&record(8, 1, 10 * u64::from(i), 1), at);
        }
        let now = t0 + Duration::from_secs(4);
        let rows = visible(m.rows(Duration::from_secs(10), t0, now), "");
        assert_eq!(rows.len(), 2);
        let leak = &rows[0];
        assert_eq!(
            (leak.pid, leak.open, leak.peer.as_str()),
            (7, 4, "127.0.0.1:8080")
        );
        assert!((leak.rate - 10.0).abs() < 0.01, "{}", leak.rate);
        assert_eq!(leak.new_share, Some(0.1));
        assert_eq!(rows[1].new_share, Some(1.0 / 40.0), "one connection reused");
        let text: Vec<String> = lines(&rows, 80)
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        assert!(
            text[0].contains("OPEN") && text[0].contains("NEW%"),
            "{}",
            text[0]
        );
        assert!(text[1].trim_start().starts_with("7 python3"), "{}", text[1]);
        assert!(text.iter().all(|l| l.chars().count() <= 80));
        // A window of 2 s: from the record before it (t0 + 2 s).
        let rows = visible(m.rows(Duration::from_secs(2), t0, now), "");
        assert!((rows[0].rate - 10.0).abs() < 0.01, "{}", rows[0].rate);
        assert_eq!(rows[0].new_share, Some(0.1));
        // Past the window, a pool without records leaves the view.
        let later = t0 + Duration::from_secs(9);
        assert!(m.rows(Duration::from_secs(2), t0, later).is_empty());
        assert_eq!(visible(vec![leak.clone()], "nginx"), vec![]);
    }
}
