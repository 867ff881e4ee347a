//! HTTP/1.x requests and the LLM API calls among them, from the plaintext
//! the TLS read/write probes copy (observer-ebpf's `emit_tls_data`).
//!
//! Each call's bytes arrive whole up to `DATA_CAPTURE`, else as their first
//! and last halves: enough for request and response heads, the JSON keys an
//! LLM API puts at a body's start or end, and one server-sent event per
//! read. Nothing of a prompt or a completion is kept past the parsing.

mod body;
mod conversation;
pub(crate) mod exchange;
mod gaps;
pub(crate) mod gen_ai;
mod grpc;
mod h2;
mod head;
pub(crate) mod hpack_partial;
mod json;
pub mod proxy;
mod record;
pub mod route;
mod scan;
pub mod trace_context;

pub use conversation::Conversation;
pub use record::{GapStats, GenAi, RequestRecord, RpcRecord, StreamStats, Trace};
