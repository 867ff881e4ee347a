//! Uprobes on the calls every TLS library has: handshake, read, write, free.
//! One program per call kind serves all libraries; the attach cookie says
//! which library a probe sits in (see `observer_common::tls::library`).
//! Kernels before 5.15 give uprobes no cookie: there the same bodies run as
//! one program per library ([`by_library`]), which the loader attaches
//! instead (`observer::programs::VARIANTS`). The return programs take the
//! library from the call their entry recorded, so they need neither.
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

/// Programs for one library each, on kernels without attach cookies: each
/// `name = body(library)` is a uprobe running `body(&ctx, library)`.
macro_rules! by_library {
    ($($name:ident = $body:ident($lib:expr);)*) => {
        $(
            #[aya_ebpf::macros::uprobe]
            pub fn $name(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
                $body(&ctx, $lib)
            }
        )*
    };
}
pub(crate) use by_library;

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
    context_new(&ctx, cookie(&ctx))
}

#[inline(always)]
fn context_new(_ctx: &ProbeContext, lib: u8) -> u32 {
    announce_process(lib);
    0
}

#[uprobe]
pub fn tls_handshake(ctx: ProbeContext) -> u32 {
    handshake(&ctx, cookie(&ctx))
}

#[inline(always)]
fn handshake(ctx: &ProbeContext, lib: u8) -> u32 {
    if let Some(s) = session(ctx) {
        call_enter(s, op::HANDSHAKE, lib, 0, 0, None);
    }
    0
}

#[uretprobe]
pub fn tls_handshake_ret(ctx: RetProbeContext) -> u32 {
    if let Some(r) = thread_call().and_then(|k| returning(&k)) {
        let ret: i32 = ctx.ret();
        // OpenSSL: 1 is success; GnuTLS: 0 is success.
        let done = if r.call.library == library::GNUTLS {
            ret == 0
        } else {
            ret == 1
        };
        handshake_exit(&r, done, ret);
    }
    0
}

#[uprobe]
pub fn tls_read(ctx: ProbeContext) -> u32 {
    read(&ctx, cookie(&ctx))
}

#[inline(always)]
fn read(ctx: &ProbeContext, lib: u8) -> u32 {
    if let Some(s) = session(ctx) {
        call_enter(s, op::READ, lib, 0, buffer(ctx), None);
    }
    0
}

#[uprobe]
pub fn tls_write(ctx: ProbeContext) -> u32 {
    write(&ctx, cookie(&ctx))
}

#[inline(always)]
fn write(ctx: &ProbeContext, lib: u8) -> u32 {
    if let Some(s) = session(ctx) {
        call_enter(s, op::WRITE, lib, 0, buffer(ctx), None);
    }
    0
}

/// SSL_read_ex / SSL_write_ex (ssl, buf, num, size_t *count): the count goes
/// through the fourth argument.
#[uprobe]
pub fn ssl_read_ex(ctx: ProbeContext) -> u32 {
    read_ex(&ctx, cookie(&ctx))
}

#[inline(always)]
fn read_ex(ctx: &ProbeContext, lib: u8) -> u32 {
    if let (Some(s), Some(p)) = (session(ctx), ctx.arg::<u64>(3)) {
        call_enter(s, op::READ, lib, p, buffer(ctx), None);
    }
    0
}

#[uprobe]
pub fn ssl_write_ex(ctx: ProbeContext) -> u32 {
    write_ex(&ctx, cookie(&ctx))
}

#[inline(always)]
fn write_ex(ctx: &ProbeContext, lib: u8) -> u32 {
    if let (Some(s), Some(p)) = (session(ctx), ctx.arg::<u64>(3)) {
        call_enter(s, op::WRITE, lib, p, buffer(ctx), None);
    }
    0
}

by_library! {
    tls_context_new_openssl = context_new(library::OPENSSL);
    tls_context_new_boringssl = context_new(library::BORINGSSL);
    tls_context_new_gnutls = context_new(library::GNUTLS);
    tls_handshake_openssl = handshake(library::OPENSSL);
    tls_handshake_boringssl = handshake(library::BORINGSSL);
    tls_handshake_gnutls = handshake(library::GNUTLS);
    tls_read_openssl = read(library::OPENSSL);
    tls_read_boringssl = read(library::BORINGSSL);
    tls_read_gnutls = read(library::GNUTLS);
    tls_write_openssl = write(library::OPENSSL);
    tls_write_boringssl = write(library::BORINGSSL);
    tls_write_gnutls = write(library::GNUTLS);
    ssl_read_ex_openssl = read_ex(library::OPENSSL);
    ssl_read_ex_boringssl = read_ex(library::BORINGSSL);
    ssl_write_ex_openssl = write_ex(library::OPENSSL);
    ssl_write_ex_boringssl = write_ex(library::BORINGSSL);
}

/// Return of any read or write above.
#[uretprobe]
pub fn tls_rw_ret(ctx: RetProbeContext) -> u32 {
    if let Some(r) = thread_call().and_then(|k| returning(&k)) {
        // GnuTLS returns ssize_t; OpenSSL an int (the upper half of the
        // register is not defined then).
        let (n, ret) = if r.call.library == library::GNUTLS {
            let v: i64 = ctx.ret();
            (v, v as i32)
        } else {
            let v: i32 = ctx.ret();
            (i64::from(v), v)
        };
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
