//! Go's crypto/tls, probed in the executable itself: Go programs carry their
//! TLS and never call a shared library (Go 1.17+ on amd64, register ABI).
//!
//! Entry probes on `(*Conn).Read`, `(*Conn).Write`, `clientHandshake` and
//! `serverHandshake`; no return probes (a uretprobe rewrites the return
//! address on a stack that Go may move), but plain probes on each of the
//! function's RET instructions, found by userspace. A call is a goroutine's
//! (R14 holds it), not a thread's: it may return on another thread.
//!
//! The session is tied to its socket through the connection's own file
//! descriptor (tls.Conn -> net.Conn -> netFD -> poll.FD.Sysfd), and the fd
//! to the kernel's socket through the task's file table; userspace gives
//! the offsets (the Go structs' per executable, the kernel's from BTF).
//!
//! Attach cookie: the library id (bits 0-7), 1 in bits 8-15 on the RETs of
//! the handshake functions, the executable's index from bit 16. Kernels
//! before 5.15 give uprobes no cookie: there the `_by_exe` programs stand
//! in, which find the executable's index by the inode number of the current
//! task's executable (`GO_EXES`) and tell a handshake's RETs by program.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_attach_cookie, bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext,
};
use observer_common::tls::{go::GoOffsets, library, op, TlsCallKey, TlsSession, TLS_HS_DONE};

use crate::{
    ctx::now_ns,
    exec_hold::current_exe_ino,
    fds::socket_of,
    maps::{own_tgid, CONNS, GO_EXES, GO_OFFSETS},
    tls_state::{call_enter, handshake_exit, returning, rw_exit, set_server_name_bytes, tie},
};

/// Bits 8-15 of the cookie on the RETs of a handshake function.
const RET_OF_HANDSHAKE: u64 = 1 << 8;

#[inline(always)]
fn regs(ctx: &ProbeContext) -> &pt_regs {
    // SAFETY: a uprobe's context is the task's saved registers.
    unsafe { &*ctx.regs }
}

#[inline(always)]
fn full_cookie(ctx: &ProbeContext) -> u64 {
    // SAFETY: a helper reading the attachment's cookie.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// Where a probe learns its executable's index.
#[derive(Clone, Copy)]
enum Exe {
    /// In the attach cookie (bits 16 and up).
    Cookie(u64),
    /// By the current task's executable (no cookies on this kernel).
    Current,
}

#[inline(always)]
fn offsets(exe: Exe) -> Option<GoOffsets> {
    let index = match exe {
        Exe::Cookie(cookie) => (cookie >> 16) as u32,
        // SAFETY: a copy out of a live map value.
        Exe::Current => unsafe { *GO_EXES.get(&current_exe_ino()?)? },
    };
    // SAFETY: a copy out of a live map value.
    unsafe { GO_OFFSETS.get(&index).copied() }
}

/// A goroutine's call; its handshake apart from its read or write (a Read
/// runs the handshake when the program did not call it first).
#[inline(always)]
fn go_call(tgid: u32, g: u64, handshake: bool) -> TlsCallKey {
    TlsCallKey {
        id: u64::from(tgid) | (u64::from(handshake) << 32),
        g,
    }
}

#[inline(always)]
fn tgid() -> Option<u32> {
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    (tgid != own_tgid()).then_some(tgid)
}

#[inline(always)]
fn user<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper tolerates any user address.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Ties the session of tls.Conn `c` to its socket, found through the
/// connection's file descriptor. A connection we do not track (or a
/// net.Conn that is not a TCP one: its fields are not where we read) finds
/// no entry and stays untied.
#[inline(always)]
fn tie_to_socket(session: *mut TlsSession, c: u64, o: &GoOffsets) -> Option<()> {
    let data: u64 = user(c + u64::from(o.conn_conn) + 8)?;
    let netfd: u64 = user(data + u64::from(o.net_conn_fd))?;
    let fd: i64 = user(netfd + u64::from(o.netfd_pfd) + u64::from(o.pfd_sysfd))?;
    if !(0..1 << 24).contains(&fd) {
        return None;
    }
    let sk = socket_of(fd as u64)?;
    let conn = CONNS.get_ptr_mut(&sk)?;
    // SAFETY: a live map value, valid for this program run.
    tie(session, sk, unsafe { &mut *conn }, now_ns())
}

#[inline(always)]
fn enter(ctx: &ProbeContext, operation: u8, exe: Exe) -> Option<()> {
    let r = regs(ctx);
    // Receiver in RAX; a byte slice's pointer in RBX; the goroutine in R14.
    let (c, buf, g) = (r.rax, r.rbx, r.r14);
    if c == 0 || g == 0 {
        return None;
    }
    let o = offsets(exe)?;
    let handshake = operation == op::HANDSHAKE;
    let key = go_call(tgid()?, g, handshake);
    let buf = if handshake { 0 } else { buf };
    let session = call_enter(c, operation, library::GO, 0, buf, Some(key))?;
    // SAFETY: a live map value.
    if unsafe { (*session).sk } == 0 {
        tie_to_socket(session, c, &o);
    }
    Some(())
}

#[uprobe]
pub fn go_tls_handshake(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::HANDSHAKE, Exe::Cookie(full_cookie(&ctx)));
    0
}

#[uprobe]
pub fn go_tls_handshake_by_exe(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::HANDSHAKE, Exe::Current);
    0
}

#[uprobe]
pub fn go_tls_read(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::READ, Exe::Cookie(full_cookie(&ctx)));
    0
}

#[uprobe]
pub fn go_tls_read_by_exe(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::READ, Exe::Current);
    0
}

#[uprobe]
pub fn go_tls_write(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::WRITE, Exe::Cookie(full_cookie(&ctx)));
    0
}

#[uprobe]
pub fn go_tls_write_by_exe(ctx: ProbeContext) -> u32 {
    let _ = enter(&ctx, op::WRITE, Exe::Current);
    0
}

/// On a RET of one of the functions above: Read and Write return the byte
/// count in RAX, the handshakes an error whose type word (RAX) is 0 for nil.
#[uprobe]
pub fn go_tls_return(ctx: ProbeContext) -> u32 {
    let cookie = full_cookie(&ctx);
    let _ = exit(&ctx, cookie & RET_OF_HANDSHAKE != 0, Exe::Cookie(cookie));
    0
}

#[uprobe]
pub fn go_tls_return_by_exe(ctx: ProbeContext) -> u32 {
    let _ = exit(&ctx, false, Exe::Current);
    0
}

#[uprobe]
pub fn go_tls_handshake_return_by_exe(ctx: ProbeContext) -> u32 {
    let _ = exit(&ctx, true, Exe::Current);
    0
}

#[inline(always)]
fn exit(ctx: &ProbeContext, handshake: bool, exe: Exe) -> Option<()> {
    let r = regs(ctx);
    let (rax, g) = (r.rax, r.r14);
    let tgid = tgid()?;
    let ret = returning(&go_call(tgid, g, handshake))?;
    if handshake {
        let done = rax == 0;
        handshake_exit(&ret, done, i32::from(!done));
        if done {
            handshake_done(tgid, ret.call.ssl, ret.tls, &offsets(exe)?);
        }
    } else {
        let n = rax as i64;
        rw_exit(&ret, n, n as i32);
    }
    Some(())
}

/// After a handshake: the negotiated version, and the server name (the
/// client's config, or what the server read from the ClientHello).
#[inline(always)]
fn handshake_done(
    tgid: u32,
    c: u64,
    tls: *mut observer_common::TlsConn,
    o: &GoOffsets,
) -> Option<()> {
    let vers: u16 = user(c + u64::from(o.conn_vers))?;
    // SAFETY: a live map value.
    unsafe {
        if (*tls).flags & TLS_HS_DONE != 0 {
            (*tls).version = vers;
        }
    }
    let is_client: u8 = user(c + u64::from(o.conn_is_client))?;
    let name_at = if is_client != 0 {
        let config: u64 = user(c + u64::from(o.conn_config))?;
        config + u64::from(o.config_server_name)
    } else {
        c + u64::from(o.conn_server_name)
    };
    let (ptr, len): (u64, u64) = (user(name_at)?, user(name_at + 8)?);
    let session = crate::maps::TLS_SESSIONS.get_ptr_mut(&observer_common::tls::TlsSessionKey {
        tgid,
        _pad: 0,
        ssl: c,
    })?;
    set_server_name_bytes(session, ptr, len)
}
