//! One request and its answer (`Exchange`) and an answer's event stream
//! (`Stream`): what the HTTP/1.x conversation and the HTTP/2 streams both
//! fill, kept apart from either so neither imports the other's state.

use observer_common::http::{PlaintextEvent, DATA_CAPTURE, DATA_HALF};

use super::{
    gen_ai::Call,
    grpc::Rpc,
    head::{Framing, Head},
    scan::{find, sse_events},
};

/// A request and its answer, times in CLOCK_MONOTONIC ns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exchange {
    /// 1 for the connection's first request; None when calls before the
    /// first one seen were missed (the probes came in mid-connection).
    pub index: Option<u32>,
    pub request: Option<Head>,
    pub start_ns: u64,
    pub request_bytes: u64,
    pub response: Option<Head>,
    pub first_byte_ns: u64,
    pub last_ns: u64,
    pub response_bytes: u64,
    /// Body bytes of the answer seen so far (None: its head's end was not seen).
    pub(super) body_bytes: Option<u64>,
    pub complete: bool,
    pub stream: Option<Stream>,
    /// (provider, operation) for an LLM API call.
    pub api: Option<(&'static str, &'static str)>,
    /// An LLM API call's fields and content times, read from its bodies
    /// (present with `api`; boxed: most requests are not LLM calls).
    pub call: Option<Box<Call>>,
    /// HTTP/2: the stream's id.
    pub stream_id: Option<u32>,
    /// HTTP/2: a header block of the stream could not be decoded (its
    /// fields are then null, not guessed).
    pub headers_undecodable: bool,
    /// HTTP/2: "reset_stream" or "goaway" when either ended the stream.
    pub error: Option<&'static str>,
    /// HTTP/2: the RST_STREAM's error code.
    pub reset_code: Option<u32>,
    /// A gRPC call (HTTP/2 with a gRPC content type).
    pub rpc: Option<Box<Rpc>>,
}

impl Exchange {
    /// Its request's head and body were all seen (a body of known length).
    pub(super) fn request_whole(&self) -> bool {
        match self.request.as_ref() {
            Some(Head {
                len: Some(head),
                framing: Framing::Length(body),
                ..
            }) => self.request_bytes >= *head as u64 + body,
            _ => false,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    /// None once a read was too long to be copied whole (its middle unseen).
    pub events: Option<u32>,
    pub first_ns: u64,
    pub last_ns: u64,
    pub gap_sum_ns: u64,
    pub gap_max_ns: u64,
    pub gaps: u32,
    /// The stream's own end marker was seen (OpenAI's `data: [DONE]`,
    /// Anthropic's `event: message_stop`): the answer is whole even if the
    /// client then closed before the transfer's end (the `openai` SDK stops
    /// reading an HTTP/2 stream at `[DONE]`).
    pub finished: bool,
}

impl Stream {
    /// Looks for the stream's end marker in a piece of answer bytes.
    pub(super) fn mark_end(&mut self, piece: &[u8]) {
        if !self.finished {
            self.finished = find(piece, b"data: [DONE]").is_some()
                || find(piece, b"event: message_stop").is_some();
        }
    }

    /// Answer bytes read at `t` (`whole`: all of them were copied).
    pub(super) fn read(&mut self, body: &[u8], whole: bool, t: u64) {
        let Some(n) = self.events.filter(|_| whole) else {
            // An uncopied middle may have held events: the count is unknown.
            self.events = None;
            return;
        };
        let k = sse_events(body);
        if k == 0 {
            return;
        }
        if self.first_ns == 0 {
            self.first_ns = t;
        } else {
            let gap = t.saturating_sub(self.last_ns);
            self.gap_sum_ns += gap;
            self.gap_max_ns = self.gap_max_ns.max(gap);
            self.gaps += 1;
        }
        // Events that came in one read came together.
        self.gaps += k - 1;
        self.last_ns = t;
        self.events = Some(n + k);
    }
}

/// Why an exchange ended without a complete answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The connection closed first.
    Closed,
}

/// The contiguous pieces of a call's bytes that were copied.
pub(super) fn pieces(ev: &PlaintextEvent) -> (&[u8], Option<&[u8]>) {
    let len = ev.len as usize;
    if len <= DATA_CAPTURE {
        (&ev.data[..len], None)
    } else {
        (&ev.data[..DATA_HALF], Some(&ev.data[DATA_HALF..]))
    }
}
