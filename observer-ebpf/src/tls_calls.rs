//! Uprobes on the calls every TLS library has: handshake, read, write, free.
//! One program per call kind serves all libraries; the attach cookie says
//! which library a probe sits in (see `observer_common::tls::library`).
//!
//! OpenSSL / BoringSSL: SSL_do_handshake (SSL_connect and SSL_accept call it),
//! SSL_read, SSL_write, SSL_free. GnuTLS: gnutls_handshake,
//! gnutls_record_recv, gnutls_record_send, gnutls_deinit. The session is the
//! first argument of each.

use aya_ebpf::{
    helpers::bpf_get_attach_cookie,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use observer_common::tls::{library, op};

use crate::tls_state::{
    announce_process, call_enter, handshake_exit, returning, rw_exit, session_end, thread_call,
};

#[inline(always)]
pub fn cookie(ctx: &impl EbpfContext) -> u8 {
    // SAFETY: a helper reading the attachment's cookie.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u8 }
}

#[inline(always)]
fn session(ctx: &ProbeContext) -> Option<u64> {
    ctx.arg::<u64>(0).filter(|&s| s != 0)
}

/// The plaintext buffer: the second argument of every read and write.
#[inline(always)]
fn buffer(ctx: &ProbeContext) -> u64 {
    ctx.arg::<u64>(1).unwrap_or(0)
}

/// SSL_CTX_new / gnutls_certificate_allocate_credentials: a process gets
/// ready for TLS, typically once at start-up and well before its first
/// session, so its per-process plaintext probes can be on in time for the
/// first request (announced again at the first session otherwise).
#[uprobe]
pub fn tls_context_new(ctx: ProbeContext) -> u32 {
    announce_process(cookie(&ctx));
    0
}

#[uprobe]
pub fn tls_handshake(ctx: ProbeContext) -> u32 {
    if let Some(s) = session(&ctx) {
        call_enter(s, op::HANDSHAKE, cookie(&ctx), 0, 0, None);
    }
    0
}

#[uretprobe]
pub fn tls_handshake_ret(ctx: RetProbeContext) -> u32 {
    let ret: i32 = ctx.ret();
    // OpenSSL: 1 is success; GnuTLS: 0 is success.
    let done = if cookie(&ctx) == library::GNUTLS {
        ret == 0
    } else {
        ret == 1
    };
    if let Some(r) = thread_call().and_then(|k| returning(&k)) {
        handshake_exit(&r, done, ret);
    }
    0
}

#[uprobe]
pub fn tls_read(ctx: ProbeContext) -> u32 {
    if let Some(s) = session(&ctx) {
        call_enter(s, op::READ, cookie(&ctx), 0, buffer(&ctx), None);
    }
    0
}

#[uprobe]
pub fn tls_write(ctx: ProbeContext) -> u32 {
    if let Some(s) = session(&ctx) {
        call_enter(s, op::WRITE, cookie(&ctx), 0, buffer(&ctx), None);
    }
    0
}

/// SSL_read_ex / SSL_write_ex (ssl, buf, num, size_t *count): the count goes
/// through the fourth argument.
#[uprobe]
pub fn ssl_read_ex(ctx: ProbeContext) -> u32 {
    if let (Some(s), Some(p)) = (session(&ctx), ctx.arg::<u64>(3)) {
        call_enter(s, op::READ, cookie(&ctx), p, buffer(&ctx), None);
    }
    0
}

#[uprobe]
pub fn ssl_write_ex(ctx: ProbeContext) -> u32 {
    if let (Some(s), Some(p)) = (session(&ctx), ctx.arg::<u64>(3)) {
        call_enter(s, op::WRITE, cookie(&ctx), p, buffer(&ctx), None);
    }
    0
}

/// Return of any read or write above.
#[uretprobe]
pub fn tls_rw_ret(ctx: RetProbeContext) -> u32 {
    let lib = cookie(&ctx);
    // GnuTLS returns ssize_t; OpenSSL an int (the upper half of the register
    // is not defined then).
    let (n, ret) = if lib == library::GNUTLS {
        let r: i64 = ctx.ret();
        (r, r as i32)
    } else {
        let r: i32 = ctx.ret();
        (i64::from(r), r)
    };
    if let Some(r) = thread_call().and_then(|k| returning(&k)) {
        rw_exit(&r, n, ret);
    }
    0
}

#[uprobe]
pub fn tls_free(ctx: ProbeContext) -> u32 {
    if let Some(s) = session(&ctx) {
        session_end(s);
    }
    0
}
