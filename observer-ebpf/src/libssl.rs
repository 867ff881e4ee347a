//! Uprobes specific to OpenSSL's API (libssl, or a binary that carries it).

use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::{
    tls_calls::cookie,
    tls_state::{session_begin, set_server_name, tie_fd},
};

/// `SSL_ctrl` command of `SSL_set_tlsext_host_name` (a macro over SSL_ctrl).
const SSL_CTRL_SET_TLSEXT_HOSTNAME: i32 = 55;
const TLSEXT_NAMETYPE_HOST_NAME: i64 = 0;

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
/// or memory BIOs (Node.js) are tied by their first socket I/O instead.
#[uprobe]
pub fn ssl_set_fd(ctx: ProbeContext) -> u32 {
    if let (Some(ssl), Some(fd)) = (ctx.arg::<u64>(0), ctx.arg::<i32>(1)) {
        if ssl != 0 && fd >= 0 {
            tie_fd(ssl, fd as u64, cookie(&ctx));
        }
    }
    0
}

/// SSL_ctrl(ssl, cmd, larg, parg): only the server-name command is looked at.
#[uprobe]
pub fn ssl_ctrl(ctx: ProbeContext) -> u32 {
    let (Some(ssl), Some(cmd), Some(larg), Some(parg)) = (
        ctx.arg::<u64>(0),
        ctx.arg::<i32>(1),
        ctx.arg::<i64>(2),
        ctx.arg::<u64>(3),
    ) else {
        return 0;
    };
    if cmd == SSL_CTRL_SET_TLSEXT_HOSTNAME
        && larg == TLSEXT_NAMETYPE_HOST_NAME
        && ssl != 0
        && parg != 0
    {
        set_server_name(ssl, parg, cookie(&ctx));
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
