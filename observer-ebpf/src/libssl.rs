//! Uprobes specific to OpenSSL's API (libssl, or a binary that carries it).

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use observer_common::tls::library;

use crate::{
    tls_calls::{by_library, cookie},
    tls_state::{session_begin, set_server_name, tie_fd},
};

/// SSL_set_connect_state / SSL_set_accept_state: a session is set up, before
/// any handshake call (some programs never make one and handshake inside
/// SSL_read / SSL_write; this is how their processes get announced).
#[uprobe]
pub fn ssl_session_begin(ctx: ProbeContext) -> u32 {
    begin(&ctx, cookie(&ctx))
}

#[inline(always)]
fn begin(ctx: &ProbeContext, lib: u8) -> u32 {
    if let Some(ssl) = ctx.arg::<u64>(0).filter(|&s| s != 0) {
        session_begin(ssl, lib);
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
    set_fd(&ctx, cookie(&ctx))
}

#[inline(always)]
fn set_fd(ctx: &ProbeContext, lib: u8) -> u32 {
    if let (Some(ssl), Some(fd)) = (ctx.arg::<u64>(0), ctx.arg::<i32>(1)) {
        if ssl != 0 && fd >= 0 {
            tie_fd(ssl, fd as u64, lib);
        }
    }
    0
}

/// BoringSSL's SSL_set_tlsext_host_name(ssl, name) is a function.
#[uprobe]
pub fn ssl_set_host_name(ctx: ProbeContext) -> u32 {
    set_host_name(&ctx, cookie(&ctx))
}

#[inline(always)]
fn set_host_name(ctx: &ProbeContext, lib: u8) -> u32 {
    if let (Some(ssl), Some(name)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        if ssl != 0 && name != 0 {
            set_server_name(ssl, name, lib);
        }
    }
    0
}

// Kernels without attach cookies: see `tls_calls`.
by_library! {
    ssl_session_begin_openssl = begin(library::OPENSSL);
    ssl_session_begin_boringssl = begin(library::BORINGSSL);
    ssl_set_fd_openssl = set_fd(library::OPENSSL);
    ssl_set_fd_boringssl = set_fd(library::BORINGSSL);
    ssl_set_host_name_openssl = set_host_name(library::OPENSSL);
    ssl_set_host_name_boringssl = set_host_name(library::BORINGSSL);
}
