//! The attach table: one row per eBPF program, what it hooks, whether the
//! observer can run without it, and what is lost when it is missing.

use observer_common::tracepoints::{self, Layout};
use serde::Serialize;

/// How a program attaches to its tracepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// A classic tracepoint: the program reads the trace record's fields.
    TracePoint,
    /// A raw tracepoint: the program gets the tracepoint's arguments, and the
    /// kernel skips building the record (cheaper on hot paths).
    RawTracePoint,
}

#[derive(Debug, Clone, Copy)]
pub struct ProbeSpec {
    /// Program (function) name in the eBPF object.
    pub program: &'static str,
    pub hook: Hook,
    /// The tracepoint and the fields the program reads.
    pub layout: Layout,
    /// Without a required probe nothing works.
    pub required: bool,
    /// What this probe provides, i.e. what is lost without it.
    pub feature: &'static str,
}

pub const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        program: "inet_sock_set_state",
        hook: Hook::TracePoint,
        layout: tracepoints::inet_sock_set_state::LAYOUT,
        required: true,
        feature: "connection lifecycle: every record, connect time, failures",
    },
    ProbeSpec {
        program: "sock_send_length",
        hook: Hook::RawTracePoint,
        layout: tracepoints::sock_send_length::LAYOUT,
        required: false,
        feature: "bytes sent, time to first byte, inbound process attribution",
    },
    ProbeSpec {
        program: "sock_recv_length",
        hook: Hook::RawTracePoint,
        layout: tracepoints::sock_recv_length::LAYOUT,
        required: false,
        feature: "bytes received, time to first byte, inbound process attribution",
    },
    ProbeSpec {
        program: "tcp_retransmit_skb",
        hook: Hook::TracePoint,
        layout: tracepoints::tcp_retransmit_skb::LAYOUT,
        required: false,
        feature: "retransmit counts",
    },
    ProbeSpec {
        program: "tcp_receive_reset",
        hook: Hook::TracePoint,
        layout: tracepoints::tcp_receive_reset::LAYOUT,
        required: false,
        feature: "\"refused\" and \"reset\" errors, resets received",
    },
    ProbeSpec {
        program: "tcp_send_reset",
        hook: Hook::TracePoint,
        layout: tracepoints::tcp_send_reset::LAYOUT,
        required: false,
        feature: "resets sent",
    },
    ProbeSpec {
        program: "tcp_destroy_sock",
        hook: Hook::TracePoint,
        layout: tracepoints::tcp_destroy_sock::LAYOUT,
        required: false,
        feature: "resets sent by an aborting close() (else records go out at CLOSE)",
    },
    ProbeSpec {
        program: "sched_process_exec",
        hook: Hook::TracePoint,
        layout: tracepoints::sched_process_exec::LAYOUT,
        required: false,
        feature: "executables of short-lived processes, fresh names after exec",
    },
    ProbeSpec {
        program: "sched_process_exit",
        hook: Hook::TracePoint,
        layout: tracepoints::sched_process_exit::LAYOUT,
        required: false,
        feature: "process cache cleanup on exit (else bounded by size)",
    },
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum ProbeStatus {
    Attached,
    /// The kernel lacks the tracepoint or lays it out differently.
    Unavailable(String),
    /// Loading (verifier) or attaching failed.
    Failed(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub program: &'static str,
    pub hook: Hook,
    pub tracepoint: String,
    pub required: bool,
    pub feature: &'static str,
    #[serde(flatten)]
    pub status: ProbeStatus,
}

impl ProbeReport {
    pub fn attached(&self) -> bool {
        self.status == ProbeStatus::Attached
    }
}
