//! One record as `diagnose` reads it: typed from the live pipeline, or a
//! line of a recorded `watch --json` stream. Both readings give the same
//! `Record`, and the collector takes only that, so a file saved from `watch
//! --json` gets the answer the live run gave.

use serde_json::Value;

use super::pools::PoolSample;
use crate::{cause::Call, output::Line, record::State};

/// What `diagnose` takes from one record.
#[derive(Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one lives from a record's reading to the collector's take; boxing the call would allocate for each"
)]
pub enum Record {
    /// A request's call, or a closed connection's.
    Call(Call),
    /// An open connection's snapshot: its closed record follows.
    Snapshot,
    Lookup(LookupSeen),
    Pool(PoolSample),
}

/// A lookup's own record: what a call's joined lookup (`dns`) lacks, the
/// server asked and the queries sent again.
#[derive(Debug, PartialEq)]
pub struct LookupSeen {
    pub pid: u32,
    pub name: String,
    pub start_unix_ns: u64,
    pub server: Option<String>,
    pub retries: Option<u32>,
}

impl Record {
    /// A record of the live pipeline.
    pub fn of_line(line: &Line) -> Record {
        match line {
            // Not read into a call: it would be dropped.
            Line::Conn(r) if r.state == State::Open => Record::Snapshot,
            Line::Conn(r) => Record::Call(Call::from_conn(r)),
            Line::Request(r) => Record::Call(Call::from_request(r)),
            Line::Dns(r) => Record::Lookup(LookupSeen {
                pid: r.pid,
                name: r.name.to_string(),
                start_unix_ns: r.start_unix_ns,
                server: r.server.clone(),
                retries: r.retries,
            }),
            Line::Pool(r) => Record::Pool(PoolSample::of_record(r)),
        }
    }

    /// A `watch --json` line; None when it is not a record `diagnose`
    /// reads (the caller counts it as skipped).
    pub fn from_json(v: &Value) -> Option<Record> {
        match v["kind"].as_str()? {
            "request" | "connection" => {
                let c = Call::from_json(v)?;
                Some(if v["state"] == "open" {
                    Record::Snapshot
                } else {
                    Record::Call(c)
                })
            }
            "dns" => Some(Record::Lookup(LookupSeen {
                pid: v["pid"].as_u64().and_then(|p| u32::try_from(p).ok())?,
                name: v["name"].as_str()?.to_owned(),
                start_unix_ns: v["start_unix_ns"].as_u64()?,
                server: v["server"].as_str().map(str::to_owned),
                retries: v["retries"].as_u64().and_then(|n| u32::try_from(n).ok()),
            })),
            "pool" => PoolSample::from_json(v).map(Record::Pool),
            _ => None,
        }
    }
}
