//! The attach table: one row per eBPF program, what it hooks, whether the
//! observer can run without it, and what is lost when it is missing.

use observer_common::tracepoints::{self, Layout};
use serde::Serialize;

#[derive(Debug, Clone, Copy)]
pub struct ProbeSpec {
    /// Program (function) name in the eBPF object.
    pub program: &'static str,
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
        layout: tracepoints::inet_sock_set_state::LAYOUT,
        required: true,
        feature: "connection lifecycle: every record, connect time, failures",
    },
    ProbeSpec {
        program: "sock_send_length",
        layout: tracepoints::sock_send_length::LAYOUT,
        required: false,
        feature: "bytes sent, time to first byte, inbound process attribution",
    },
    ProbeSpec {
        program: "sock_recv_length",
        layout: tracepoints::sock_recv_length::LAYOUT,
        required: false,
        feature: "bytes received, time to first byte, inbound process attribution",
    },
    ProbeSpec {
        program: "tcp_retransmit_skb",
        layout: tracepoints::tcp_retransmit_skb::LAYOUT,
        required: false,
        feature: "retransmit counts",
    },
    ProbeSpec {
        program: "tcp_receive_reset",
        layout: tracepoints::tcp_receive_reset::LAYOUT,
        required: false,
        feature: "\"refused\" and \"reset\" errors, resets received",
    },
    ProbeSpec {
        program: "tcp_send_reset",
        layout: tracepoints::tcp_send_reset::LAYOUT,
        required: false,
        feature: "resets sent",
    },
    ProbeSpec {
        program: "tcp_destroy_sock",
        layout: tracepoints::tcp_destroy_sock::LAYOUT,
        required: false,
        feature: "resets sent by an aborting close() (else records go out at CLOSE)",
    },
    ProbeSpec {
        program: "sched_process_exec",
        layout: tracepoints::sched_process_exec::LAYOUT,
        required: false,
        feature: "fresh process names after exec (else cached until exit)",
    },
    ProbeSpec {
        program: "sched_process_exit",
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
