//! rustls, probed in the Rust executable that carries it (found by symbol
//! in userspace, `observer/src/libraries/rustls.rs`). rustls has no session
//! handle that every call takes and no socket of its own: its connection
//! object is moved about by its owner, and its plaintext calls take borrowed
//! views of it. What ties the calls together:
//!
//! - A connection is its `CommonState`, the non-generic core every
//!   connection type holds. `CommonState::current_io_state` (rsi: the
//!   state; rdi: where its result goes) runs after each batch of records
//!   read, and `CommonState::buffer_plaintext` (rdi) inside each write.
//! - Its socket: `DeframerVecBuffer::read` (rsi: the `dyn io::Read` it
//!   reads from) reads the records that are processed next on the same
//!   thread, ending in `current_io_state`: the socket behind that reader's
//!   descriptor is the `CommonState`'s (`tls_state::tie_rustls`). Where the
//!   descriptor lies in the reader is learned per process at its first
//!   handshake ([`rustls_fd`]): the candidate whose socket is a handshake
//!   the wire follows. The handshake's first read ties, so every plaintext
//!   call finds its connection tied; the handshake itself is read on the
//!   wire. No socket hook takes part.
//! - Writes: `Writer::write` (rsi, rdx: the buffer) and
//!   `Writer::write_vectored` (rsi, rdx: the `iovec`s) call
//!   `buffer_plaintext`, which names the connection; their return (rax: 0
//!   for Ok, rdx: the count) ends the call. A connection object that moved
//!   after its handshake is tied when its first write's records go out
//!   (`ChunkVecBuffer::write_to`, rsi: the `dyn io::Write`, whose
//!   descriptor lies where the reader's does).
//! - Reads: `Reader` points at the connection's received-plaintext buffer,
//!   inside its `CommonState` at an offset the process learns from a read
//!   that follows the same connection's record processing on one thread.
//!   tokio-rustls takes a chunk (`Reader::into_first_chunk`, rdi: where
//!   the slice goes, rsi: the `Reader`) and consumes what it copied
//!   (`<Reader as BufRead>::consume`, rdi: the `Reader`, rsi: the count);
//!   blocking callers use `<Reader as Read>::read` (rdi, rsi, rdx).
//!
//! The registers are those of rustc's Rust ABI on x86-64 for these
//! signatures (rustls 0.21 to 0.23), read from the functions' instructions.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::bpf_probe_read_user,
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    tls::{
        library, op, rustls_fd, RustlsThread, TlsCall, TlsSession, TlsSessionKey, BIND_WINDOW_NS,
        RUSTLS_READER_SPAN, TLS_HS_DONE,
    },
    Counter, TlsConn,
};

use crate::{
    ctx::{now_ns, zeroed_in},
    events::emit_tls_plaintext,
    fds::socket_of,
    maps::{count, CONNS, RUSTLS_THREADS, TLS_CONNS, TLS_PROCS, TLS_SESSIONS},
    tls_state::{
        account, announce_process, bind, call_enter, current, returning, rustls_tied, thread_call,
        tie_rustls, timings,
    },
};

/// A record read's descriptor is the records' processed this soon after
/// (a blocking read may wait long for the server's flight; the reader is
/// forgotten at each processing, so a stale one never lasts).
const READ_WINDOW_NS: u64 = 10_000_000_000;
/// The `iovec`s of a vectored write whose bytes are sent up, at most.
const MAX_IOVECS: usize = 8;
/// The same for a write sent up when its connection is tied later
/// (`write_tied`): with the descriptor's search in the same program, the
/// verifier's budget allows fewer (8 ran past its million instructions).
const TIED_IOVECS: usize = 3;

#[inline(always)]
fn regs(ctx: &ProbeContext) -> &pt_regs {
    // SAFETY: a uprobe's context is the task's saved registers.
    unsafe { &*ctx.regs }
}

#[inline(always)]
fn ret_regs(ctx: &RetProbeContext) -> &pt_regs {
    // SAFETY: as above, at the return.
    unsafe { &*ctx.regs }
}

/// The current thread's entry, made on first use.
#[inline(always)]
fn thread() -> Option<&'static mut RustlsThread> {
    let (_, pid_tgid) = current()?;
    if let Some(t) = RUSTLS_THREADS.get_ptr_mut(&pid_tgid) {
        // SAFETY: a live map value, valid for this program run.
        return Some(unsafe { &mut *t });
    }
    let mut slot = core::mem::MaybeUninit::<RustlsThread>::uninit();
    let _ = RUSTLS_THREADS.insert(&pid_tgid, zeroed_in(&mut slot), 0);
    // SAFETY: as above.
    RUSTLS_THREADS
        .get_ptr_mut(&pid_tgid)
        .map(|t| unsafe { &mut *t })
}

/// The descriptor at `path` in I/O object `io` (+1), 0 if none there.
#[inline(always)]
fn fd_at(io: u64, path: u32) -> Option<u64> {
    let mut base = io;
    if let Some(p) = rustls_fd::pointer_offset(path) {
        base = user::<u64>(io + u64::from(p))?;
    }
    let fd = user::<i32>(base + u64::from(rustls_fd::fd_offset(path)))?;
    (0..1 << 24).contains(&fd).then_some(fd as u64)
}

#[inline(always)]
fn user<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper tolerates any user address.
    unsafe { bpf_probe_read_user(addr as *const T) }.ok()
}

/// Whether the descriptor at `path` in `io` is a socket in a handshake the
/// wire follows (what a learned path must show).
#[inline(always)]
fn handshaking(io: u64, path: u32) -> bool {
    let Some(sk) = fd_at(io, path).and_then(socket_of) else {
        return false;
    };
    // SAFETY: a copy out of a live map value.
    TLS_CONNS.get_ptr(&sk).is_some_and(|t| unsafe {
        ((*t).library == library::WIRE || (*t).library == library::RUSTLS)
            && (*t).flags & TLS_HS_DONE == 0
    })
}

/// Where the socket's descriptor lies in `io`, searched: the object's own
/// first bytes, then behind its first pointers.
#[inline(always)]
fn learn_fd_path(io: u64) -> Option<u32> {
    for i in 0..rustls_fd::DIRECT_SLOTS {
        let path = rustls_fd::KNOWN | (i * 4);
        if handshaking(io, path) {
            return Some(path);
        }
    }
    for p in 0..rustls_fd::POINTERS {
        for i in 0..rustls_fd::BEHIND_SLOTS {
            let path = rustls_fd::KNOWN | rustls_fd::BEHIND_POINTER | (p * 8) << 8 | (i * 4);
            if handshaking(io, path) {
                return Some(path);
            }
        }
    }
    None
}

/// The descriptor of rustls's I/O object `io` in process `tgid` plus one
/// (0: none found), by the process's learned path, else learned now (a
/// handshake's read). A plain number, not an `Option`: the verifier
/// refused the code LLVM made of one carried across helper calls.
#[inline(always)]
fn fd_of_io(io: u64, tgid: u32) -> u64 {
    let Some(proc) = TLS_PROCS.get_ptr_mut(&tgid) else {
        return 0;
    };
    // SAFETY: a live map value.
    let proc = unsafe { &mut *proc };
    let known = proc.rustls_fd_path;
    if known & rustls_fd::KNOWN != 0 {
        if let Some(fd) = fd_at(io, known) {
            return fd + 1;
        }
    }
    let Some(path) = learn_fd_path(io) else {
        return 0;
    };
    proc.rustls_fd_path = path;
    fd_at(io, path).map_or(0, |fd| fd + 1)
}

/// `DeframerVecBuffer::read`: the records read from `rd` (rsi) are this
/// thread's next processed.
#[uprobe]
pub fn rustls_record_read(ctx: ProbeContext) -> u32 {
    let io = regs(&ctx).rsi;
    // A server's first read comes before any other call of the process.
    let _ = announce_process(library::RUSTLS);
    let Some((tgid, _)) = current() else { return 0 };
    let fd = fd_of_io(io, tgid);
    if let Some(t) = thread() {
        t.reading_ns = now_ns();
        t.read_fd = fd;
    }
    0
}

/// `CommonState::current_io_state`: the thread processed the records of
/// this connection; the socket they came from is its socket.
#[uprobe]
pub fn rustls_records_done(ctx: ProbeContext) -> u32 {
    let common = regs(&ctx).rsi;
    let Some(t) = thread() else { return 0 };
    let now = now_ns();
    let fd = core::mem::take(&mut t.read_fd);
    let reading_ns = core::mem::take(&mut t.reading_ns);
    let sk = match rustls_tied(common) {
        Some(sk) => Some(sk),
        None if fd != 0 && now - reading_ns < READ_WINDOW_NS => socket_of(fd - 1)
            .filter(|sk| CONNS.get_ptr(sk).is_some() && tie_rustls(common, *sk).is_some()),
        None => None,
    };
    if let Some(sk) = sk {
        t.tied_sk = sk;
        t.tied_ns = now;
    }
    t.common = common;
    note_common(common);
    0
}

/// `ChunkVecBuffer::write_to`: the records of the thread's last write go
/// out through `wr` (rsi). A write that returned before its connection was
/// tied (an object moved after its handshake) is tied to that socket, and
/// its bytes go up (`write_tied`).
#[uprobe]
pub fn rustls_write_to(ctx: ProbeContext) -> u32 {
    let io = regs(&ctx).rsi;
    let Some((tgid, pid_tgid)) = current() else {
        return 0;
    };
    // SAFETY: a live map value.
    if !RUSTLS_THREADS
        .get_ptr(&pid_tgid)
        .is_some_and(|t| unsafe { (*t).pending_n } != 0)
    {
        return 0;
    }
    let fd = fd_of_io(io, tgid);
    let Some(sk) = fd.checked_sub(1).and_then(socket_of) else {
        return 0;
    };
    let Some(conn) = CONNS.get_ptr_mut(&sk) else {
        return 0;
    };
    // SAFETY: live map values, valid for this program run.
    unsafe {
        if let Some((session, call)) = bind(sk, &mut *conn, pid_tgid, now_ns(), true) {
            if (*call).ret_ns != 0 {
                // Its caller's buffer is still theirs: the bytes go up now.
                write_tied(sk, &*call, pid_tgid, session);
            }
        }
    }
    0
}

/// `Writer::write`: the plaintext, until `buffer_plaintext` names the
/// connection.
#[uprobe]
pub fn rustls_write(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    if let Some(t) = thread() {
        t.write_buf = r.rsi;
        t.write_len = r.rdx;
        t.write_iovecs = 0;
        t.pending_n = 0;
    }
    0
}

/// `Writer::write_vectored`: as above, an array of `iovec`s.
#[uprobe]
pub fn rustls_write_vectored(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    if let Some(t) = thread() {
        t.write_buf = r.rsi;
        t.write_len = 0;
        t.write_iovecs = r.rdx;
        t.pending_n = 0;
    }
    0
}

/// `CommonState::buffer_plaintext`, inside a write: the write's connection.
#[uprobe]
pub fn rustls_write_common(ctx: ProbeContext) -> u32 {
    let common = regs(&ctx).rdi;
    let Some(t) = thread() else { return 0 };
    if t.write_buf == 0 {
        return 0;
    }
    let buf = t.write_buf;
    t.write_buf = 0;
    t.common = common;
    note_common(common);
    // The `iovec` count rides where the OpenSSL `_ex` calls keep a pointer.
    call_enter(
        common,
        op::WRITE,
        library::RUSTLS,
        t.write_iovecs,
        buf,
        None,
    );
    0
}

/// Return of `Writer::write`, `Writer::write_vectored` and `Reader::read`:
/// `io::Result<usize>` as rax (0: Ok) and rdx (the count).
#[uretprobe]
pub fn rustls_rw_ret(ctx: RetProbeContext) -> u32 {
    let r = ret_regs(&ctx);
    let n = if r.rax == 0 { r.rdx as i64 } else { -1 };
    let Some(ret) = thread_call().and_then(|k| returning(&k)) else {
        return 0;
    };
    if ret.sk == 0 && ret.call.op == op::WRITE && n > 0 {
        // Its connection is tied when its records go out
        // (`rustls_write_to`), which sends these bytes up (`write_tied`).
        if let Some(t) = thread() {
            t.pending_n = n as u64;
        }
        return 0;
    }
    if ret.sk == 0 && n > 0 {
        // A read whose connection was not found: its bytes are lost.
        count(Counter::RustlsReadUnjoined);
    }
    // SAFETY: a live map value.
    let tls = unsafe { &mut *ret.tls };
    if account(tls, &ret.call, n, n as i32, ret.now) && ret.sk != 0 {
        emit_call(ret.sk, &ret.call, n as u64, ret.now, tls);
    }
    0
}

/// A write or read's bytes, sent up.
#[inline(always)]
fn emit_call(sk: u64, call: &TlsCall, n: u64, now: u64, tls: &mut TlsConn) {
    if call.op == op::WRITE && call.count_ptr != 0 {
        emit_iovecs::<MAX_IOVECS>(sk, call.buf, call.count_ptr, n, call.entry_ns, now, tls);
    } else {
        emit_tls_plaintext(sk, call.op, call.buf, n, call.entry_ns, now, tls);
    }
}

/// The records going out of thread `pid_tgid` tied the session of its
/// rustls write `call`, which had returned: its bytes now.
#[inline(always)]
fn write_tied(sk: u64, call: &TlsCall, pid_tgid: u64, session: *mut TlsSession) {
    let Some(t) = RUSTLS_THREADS.get_ptr_mut(&pid_tgid) else {
        return;
    };
    // SAFETY: a live map value.
    let n = unsafe { core::mem::take(&mut (*t).pending_n) };
    if n == 0 || call.op != op::WRITE {
        return;
    }
    let Some(tls) = timings(session) else {
        return;
    };
    // SAFETY: a live map value.
    let tls = unsafe { &mut *tls };
    if !account(tls, call, n as i64, n as i32, call.ret_ns) {
        return;
    }
    // A vectored write's first [`TIED_IOVECS`] buffers (a request's head
    // and body); bytes past them are counted, not sent up.
    if call.count_ptr != 0 {
        emit_iovecs::<TIED_IOVECS>(
            sk,
            call.buf,
            call.count_ptr,
            n,
            call.entry_ns,
            call.ret_ns,
            tls,
        );
    } else {
        emit_tls_plaintext(sk, op::WRITE, call.buf, n, call.entry_ns, call.ret_ns, tls);
    }
}

/// The `n` bytes a vectored write took, one event per `iovec` (at most
/// `MAX`; the bytes past them are counted, not sent up).
#[inline(always)]
fn emit_iovecs<const MAX: usize>(
    sk: u64,
    iov: u64,
    count: u64,
    n: u64,
    entry_ns: u64,
    now: u64,
    tls: &mut TlsConn,
) {
    let mut left = n;
    for i in 0..MAX {
        if i as u64 >= count || left == 0 {
            return;
        }
        // SAFETY: the helper tolerates any user address.
        let Ok(v) = (unsafe { bpf_probe_read_user((iov + 16 * i as u64) as *const [u64; 2]) })
        else {
            return;
        };
        let len = v[1].min(left);
        if len != 0 {
            emit_tls_plaintext(sk, op::WRITE, v[0], len, entry_ns, now, tls);
        }
        left -= len;
    }
}

/// The connection a `Reader` at `reader_ptr` reads from: the thread's or
/// else the process's last `CommonState` if the reader's buffer lies in it
/// (the process learns where), else by the learned offset; before the
/// offset is learned, the buffer's own address (a session of its own, tied
/// by [`moved_here`]).
#[inline(always)]
fn reader_common(reader_ptr: u64) -> Option<u64> {
    let buffer = user::<u64>(reader_ptr)?;
    let (tgid, pid_tgid) = current()?;
    let thread_last = RUSTLS_THREADS
        .get_ptr(&pid_tgid)
        // SAFETY: a live map value.
        .map_or(0, |t| unsafe { (*t).common });
    let Some(proc) = TLS_PROCS.get_ptr_mut(&tgid) else {
        return Some(buffer);
    };
    // SAFETY: a live map value.
    let proc = unsafe { &mut *proc };
    for last in [thread_last, proc.rustls_last_common] {
        if last != 0 && buffer >= last && buffer - last < RUSTLS_READER_SPAN {
            proc.rustls_reader_off = (buffer - last) as u32;
            return Some(last);
        }
    }
    if proc.rustls_reader_off == 0 {
        return Some(buffer);
    }
    Some(buffer - u64::from(proc.rustls_reader_off))
}

/// The process's last `CommonState` (see [`reader_common`]).
#[inline(always)]
fn note_common(common: u64) {
    let Some((tgid, _)) = current() else { return };
    if let Some(p) = TLS_PROCS.get_ptr_mut(&tgid) {
        // SAFETY: a live map value.
        unsafe { (*p).rustls_last_common = common };
    }
}

/// A read from a connection object not tied yet, right after the thread
/// tied one: the same connection, moved (see [`RustlsThread::tied_sk`]).
#[inline(always)]
fn moved_here(common: u64, t: &mut RustlsThread) {
    if t.tied_sk == 0 || now_ns().saturating_sub(t.tied_ns) > BIND_WINDOW_NS {
        return;
    }
    if let Some((tgid, _)) = current() {
        let k = TlsSessionKey {
            tgid,
            _pad: 0,
            ssl: common,
        };
        // SAFETY: a live map value.
        if TLS_SESSIONS
            .get_ptr(&k)
            .is_some_and(|s| unsafe { (*s).sk } != 0)
        {
            return;
        }
        let _ = tie_rustls(common, t.tied_sk);
    }
}

/// `Reader::into_first_chunk` returns: the chunk its caller copies from.
#[uretprobe]
pub fn rustls_chunk_ret(ctx: RetProbeContext) -> u32 {
    let slot = ret_regs(&ctx).rax;
    // SAFETY: the helper tolerates any user address.
    let Ok(v) = (unsafe { bpf_probe_read_user(slot as *const [u64; 2]) }) else {
        return 0;
    };
    if let Some(t) = thread() {
        // A null pointer is the error variant; 1 an empty slice's.
        (t.chunk_ptr, t.chunk_len) = if v[0] > 1 { (v[0], v[1]) } else { (0, 0) };
    }
    0
}

/// `<Reader as BufRead>::consume`: its caller took `n` bytes of the chunk.
#[uprobe]
pub fn rustls_consume(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    let n = r.rsi;
    let Some(t) = thread() else { return 0 };
    let (ptr, len) = (t.chunk_ptr, t.chunk_len);
    t.chunk_ptr = 0;
    if ptr == 0 || n == 0 || n > len {
        return 0;
    }
    let Some(common) = reader_common(r.rdi) else {
        return 0;
    };
    moved_here(common, t);
    if call_enter(common, op::READ, library::RUSTLS, 0, ptr, None).is_none() {
        return 0;
    }
    let Some(ret) = thread_call().and_then(|k| returning(&k)) else {
        return 0;
    };
    if ret.sk == 0 {
        // Its connection not found: the bytes are lost.
        count(Counter::RustlsReadUnjoined);
        return 0;
    }
    // SAFETY: a live map value.
    let tls = unsafe { &mut *ret.tls };
    if account(tls, &ret.call, n as i64, 0, ret.now) {
        emit_tls_plaintext(ret.sk, op::READ, ptr, n, ret.call.entry_ns, ret.now, tls);
    }
    0
}

/// `<Reader as Read>::read` (blocking callers): ends at `rustls_rw_ret`.
#[uprobe]
pub fn rustls_read(ctx: ProbeContext) -> u32 {
    let r = regs(&ctx);
    if let (Some(common), Some(t)) = (reader_common(r.rdi), thread()) {
        moved_here(common, t);
        call_enter(common, op::READ, library::RUSTLS, 0, r.rsi, None);
    }
    0
}
