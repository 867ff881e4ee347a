//! Uprobes specific to OpenSSL's API (libssl, or a binary that carries it).

use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::{
    tls_calls::cookie,
    tls_state::{session_begin, set_server_name, tie_fd},
};

/// SSL_set_connect_state / SSL_set_accept_state: a session is set up, before
/// any handshake call (some programs never make one and handshake inside
/// SSL_read / SSL_write; this is how their processes get announced).
#[uprobe]
pub fn ssl_session_begin(ctx: ProbeContext) -> u32 {
    if let Some(ssl) = ctx.arg::<u64>(0).filter(|&s| s != 0) {
        session_begin(ssl, cookie(&ctx));
    }
    0
}

/// SSL_set_fd(ssl, fd): the session's socket, by the descriptor the program
/// gives the library (Python's ssl, nginx): tied before any of its I/O, so
/// no socket hook is needed to find it. Programs with their own BIO (curl)
/// or memory BIOs (Node.js) are tied by the packets their calls send
/// (`http_packets`). OpenSSL's server name (set through `SSL_ctrl`, called
/// several times per connection for other things) is read from the
/// ClientHello on the wire instead (`tls_wire`).
#[uprobe]
pub fn ssl_set_fd(ctx: ProbeContext) -> u32 {
    if let (Some(ssl), Some(fd)) = (ctx.arg::<u64>(0), ctx.arg::<i32>(1)) {
        if ssl != 0 && fd >= 0 {
            tie_fd(ssl, fd as u64, cookie(&ctx));
        }
    }
    0
}

/// BoringSSL's SSL_set_tlsext_host_name(ssl, name) is a function.
#[uprobe]
pub fn ssl_set_host_name(ctx: ProbeContext) -> u32 {
    if let (Some(ssl), Some(name)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        if ssl != 0 && name != 0 {
            set_server_name(ssl, name, cookie(&ctx));
        }
    }
    0
}
