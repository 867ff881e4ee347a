//! TLS session state shared by the library probes (`tls_calls`, `libssl`,
//! `libgnutls`, `go_tls`, `rustls`) and the packet programs, which tie a
//! session that never named its socket by the packets its calls send.
//!
//! Every function here runs inside a uprobe (about 5 us per hit in a VM), so
//! each does a bounded number of map lookups and copies no payload.

use aya_ebpf::helpers::{
    bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
};
use observer_common::{
    tls::{
        library, op, TlsCall, TlsCallKey, TlsProc, TlsSession, TlsSessionKey, BIND_WINDOW_NS,
        RATE_WINDOW_NS, SERVER_NAME_LEN, TLS_HS_DONE, TLS_HS_STARTED, TLS_LAST_READ,
        TLS_LAST_WRITE, TLS_MIDSTREAM, TLS_PLAINTEXT,
    },
    Conn, Counter, TlsConn, FLAG_RUSTLS, FLAG_TLS,
};

use crate::{
    ctx::{now_ns, zero_words, zeroed_in},
    events::{emit_tls_busy, emit_tls_name, emit_tls_plaintext, emit_tls_process},
    maps::{
        busy_calls, count, own_tgid, CLOSED_TLS_CONNS, CONNS, TLS_CALLS, TLS_CONNS, TLS_PROCS,
        TLS_SCRATCH, TLS_SESSIONS,
    },
};

#[inline(always)]
fn key(tgid: u32, ssl: u64) -> TlsSessionKey {
    TlsSessionKey { tgid, _pad: 0, ssl }
}

/// The current tgid and pid_tgid, or None for the observer itself.
#[inline(always)]
pub fn current() -> Option<(u32, u64)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    (tgid != own_tgid()).then_some((tgid, pid_tgid))
}

/// Tells userspace about a process's first TLS session, once per process.
#[inline(always)]
fn announce(tgid: u32, library: u8, now: u64) {
    if TLS_PROCS.get_ptr(&tgid).is_some() {
        return;
    }
    let mut slot = core::mem::MaybeUninit::<TlsProc>::uninit();
    if TLS_PROCS.insert(&tgid, zeroed_in(&mut slot), 0).is_ok() {
        emit_tls_process(tgid, library, now);
    }
}

/// A process whose TLS connection began before the observer started.
#[inline(always)]
pub fn announce_tgid(tgid: u32, now: u64) {
    announce(tgid, 0, now);
}

/// A process about to use TLS (it made a TLS context).
#[inline(always)]
pub fn announce_process(library: u8) -> Option<()> {
    let (tgid, _) = current()?;
    announce(tgid, library, now_ns());
    Some(())
}

/// Stores a fresh session under `k` and returns it.
#[inline(always)]
fn create(k: &TlsSessionKey, library: u8, flags: u8) -> Option<*mut TlsSession> {
    let scratch = TLS_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: the per-CPU scratch slot belongs to this program run.
    unsafe {
        zero_words(scratch);
        (*scratch).tls.session_ns = now_ns();
        (*scratch).tls.library = library;
        (*scratch).tls.flags = flags;
        if TLS_SESSIONS.insert(k, &*scratch, 0).is_err() {
            count(Counter::TlsInsertFailed);
            return None;
        }
    }
    TLS_SESSIONS.get_ptr_mut(k)
}

/// The socket entry of a session tied to one, if it is still this session's:
/// the entry goes when the connection closes, and the socket's address may
/// then be reused by another connection (of any process) while a freed
/// session under a reused pointer still names it.
#[inline(always)]
fn socket_entry(session: *mut TlsSession) -> Option<*mut TlsConn> {
    // SAFETY: `session` points at a live map value.
    unsafe {
        let t = TLS_CONNS.get_ptr_mut(&(*session).sk)?;
        ((*t).session_ns == (*session).tls.session_ns).then_some(t)
    }
}

/// Where a session's timings go: its connection's entry once tied to a
/// socket, its own copy before; the connection's entry as it was at its
/// close for a call that returns after it (see CLOSED_CONNS).
#[inline(always)]
pub fn timings(session: *mut TlsSession) -> Option<*mut TlsConn> {
    // SAFETY: `session` points at a live map value.
    unsafe {
        if (*session).sk == 0 {
            Some(&mut (*session).tls)
        } else {
            socket_entry(session).or_else(|| closed_entry(session))
        }
    }
}

/// The session's connection's timings as they were at its close.
#[inline(always)]
fn closed_entry(session: *mut TlsSession) -> Option<*mut TlsConn> {
    // SAFETY: `session` points at a live map value.
    unsafe {
        let t = CLOSED_TLS_CONNS.get_ptr_mut(&(*session).sk)?;
        ((*t).session_ns == (*session).tls.session_ns).then_some(t)
    }
}

/// A handshake call on a session whose handshake completed, or whose
/// connection is gone, is a new session under a freed one's pointer (SSL_free
/// is not probed: it would cost every connection a trap).
#[inline(always)]
fn finished(session: *mut TlsSession) -> bool {
    // SAFETY: a live map value.
    unsafe {
        if (*session).sk == 0 {
            return (*session).tls.flags & TLS_HS_DONE != 0;
        }
        match socket_entry(session) {
            Some(t) => (*t).flags & TLS_HS_DONE != 0,
            None => true,
        }
    }
}

/// A session starts (SSL_set_connect_state / SSL_set_accept_state). An entry
/// under the same pointer that already has a socket or a handshake belonged
/// to a freed session; a fresh one (the server name is often set first) stays.
#[inline(always)]
pub fn session_begin(ssl: u64, library: u8) -> Option<()> {
    let (tgid, _) = current()?;
    announce(tgid, library, now_ns());
    let k = key(tgid, ssl);
    if let Some(s) = TLS_SESSIONS.get_ptr_mut(&k) {
        if fresh(s) {
            return Some(());
        }
    }
    create(&k, library, 0)?;
    Some(())
}

/// A session set up but not handshaking yet (its server name or socket may
/// be set first), not one under a freed session's pointer.
#[inline(always)]
fn fresh(session: *mut TlsSession) -> bool {
    // SAFETY: a live map value, and the entry its timings are in.
    timings(session).is_some_and(|t| unsafe { (*t).hs_start_ns == 0 })
}

/// The program gave session `ssl` its socket's descriptor `fd`
/// (`SSL_set_fd`): tied to that socket now, when it is a connection we
/// follow.
#[inline(always)]
pub fn tie_fd(ssl: u64, fd: u64, library: u8) -> Option<()> {
    let (tgid, _) = current()?;
    let now = now_ns();
    announce(tgid, library, now);
    let sk = crate::fds::socket_of(fd)?;
    let conn = CONNS.get_ptr_mut(&sk)?;
    let k = key(tgid, ssl);
    let session = match TLS_SESSIONS.get_ptr_mut(&k) {
        // Again on the same socket: wrk sets it before each try of a
        // non-blocking handshake.
        // SAFETY: a live map value.
        Some(s) if unsafe { (*s).sk } == sk && socket_entry(s).is_some() => return Some(()),
        // Its server name may have been set first.
        // SAFETY: a live map value.
        Some(s) if unsafe { (*s).sk } == 0 && fresh(s) => s,
        _ => create(&k, library, 0)?,
    };
    // SAFETY: a live map value.
    tie(session, sk, unsafe { &mut *conn }, now)?;
    count(Counter::TlsFdTied);
    Some(())
}

/// SSL_free / gnutls_deinit: the connection keeps what was gathered.
#[inline(always)]
pub fn session_end(ssl: u64) -> Option<()> {
    let (tgid, _) = current()?;
    let _ = TLS_SESSIONS.remove(&key(tgid, ssl));
    Some(())
}

/// Counts a plaintext call; the call that passes the window's limit reports
/// the process busy (once per window).
#[inline(always)]
fn count_call(p: &mut TlsProc, tgid: u32, now: u64) {
    p.plaintext_calls += 1;
    if now.saturating_sub(p.window_start_ns) > RATE_WINDOW_NS {
        p.window_start_ns = now;
        p.window_calls = 0;
    }
    p.window_calls += 1;
    let limit = busy_calls();
    if limit != 0 && p.window_calls == limit {
        emit_tls_busy(tgid, p.window_calls, now);
    }
}

/// The key of the current thread's calls (None for the observer's own).
#[inline(always)]
pub fn thread_call() -> Option<TlsCallKey> {
    let (_, pid_tgid) = current()?;
    Some(TlsCallKey { id: pid_tgid, g: 0 })
}

/// Entry of a handshake, read or write call. `count_ptr`: where an `_ex`
/// call stores its byte count (0: the call returns it). `call`: whose call
/// it is, None for the current thread's. Returns the call's session.
#[inline(always)]
pub fn call_enter(
    ssl: u64,
    operation: u8,
    library: u8,
    count_ptr: u64,
    buf: u64,
    call: Option<TlsCallKey>,
) -> Option<*mut TlsSession> {
    let (tgid, pid_tgid) = current()?;
    let call_key = call.unwrap_or(TlsCallKey { id: pid_tgid, g: 0 });
    let now = now_ns();
    let k = key(tgid, ssl);
    if operation == op::HANDSHAKE {
        // Also when the session exists: setting the server name may have
        // created it.
        announce(tgid, library, now);
    } else if let Some(p) = TLS_PROCS.get_ptr_mut(&tgid) {
        // SAFETY: a live map value.
        let p = unsafe { &mut *p };
        if p.off != 0 {
            // Too busy to follow: its times come from the socket, and each
            // call costs only the trap and this lookup.
            return None;
        }
        count_call(p, tgid, now);
    } else {
        // Its sessions began before us: from now on its rate is watched.
        announce(tgid, library, now);
    }
    let session = match TLS_SESSIONS.get_ptr_mut(&k) {
        Some(s) if operation == op::HANDSHAKE && finished(s) => create(&k, library, 0)?,
        Some(s) => s,
        None if operation == op::HANDSHAKE => create(&k, library, 0)?,
        // Read or write on a session we never saw start: it predates us.
        None => create(&k, library, TLS_MIDSTREAM)?,
    };
    let tls = timings(session)?;
    // SAFETY: pointers into live map values, valid for this program run.
    unsafe {
        let flags = (*tls).flags;
        let in_handshake = flags & (TLS_HS_DONE | TLS_MIDSTREAM) == 0;
        if in_handshake && (*tls).hs_start_ns == 0 {
            (*tls).hs_start_ns = now;
            (*tls).flags |= TLS_HS_STARTED;
        }
        let mut slot = core::mem::MaybeUninit::<TlsCall>::uninit();
        let call = zeroed_in(&mut slot);
        call.ssl = ssl;
        call.entry_ns = now;
        call.count_ptr = count_ptr;
        call.op = operation;
        call.library = library;
        call.bound = u8::from((*session).sk != 0);
        call.buf = buf;
        let _ = TLS_CALLS.insert(&call_key, call, 0);
    }
    Some(session)
}

/// A call returning: the call, where its session's timings go, the time,
/// and the session's socket (0: not tied to one yet).
pub struct Returning {
    pub call: TlsCall,
    pub tls: *mut TlsConn,
    pub now: u64,
    pub sk: u64,
}

/// The call in flight under `key`, marked returned.
#[inline(always)]
pub fn returning(call_key: &TlsCallKey) -> Option<Returning> {
    let (tgid, _) = current()?;
    let call = TLS_CALLS.get_ptr_mut(call_key)?;
    let now = now_ns();
    // SAFETY: a live map value of this thread's.
    let call = unsafe {
        if (*call).ret_ns != 0 {
            // Its entry was missed (probes attached mid-call).
            return None;
        }
        (*call).ret_ns = now;
        *call
    };
    let session = TLS_SESSIONS.get_ptr_mut(&key(tgid, call.ssl))?;
    // SAFETY: a live map value.
    let sk = unsafe { (*session).sk };
    Some(Returning {
        call,
        tls: timings(session)?,
        now,
        sk,
    })
}

/// Return of a handshake call: `done` when it completed the handshake,
/// else `ret` is kept (a retry on a non-blocking socket, or the error).
#[inline(always)]
pub fn handshake_exit(r: &Returning, done: bool, ret: i32) -> Option<()> {
    let (tls, now) = (r.tls, r.now);
    // SAFETY: a live map value.
    unsafe {
        if done {
            if (*tls).flags & TLS_HS_DONE == 0 {
                (*tls).hs_end_ns = now;
                (*tls).flags |= TLS_HS_DONE;
            }
        } else if (*tls).flags & TLS_HS_DONE == 0 {
            (*tls).hs_ret = ret;
        }
    }
    Some(())
}

/// Return of a plaintext read or write: `n` is the return value as the
/// library's type has it (`ret` as an int, kept when the call failed during a
/// handshake). `_ex` calls return 1 and store the count behind a pointer.
#[inline(always)]
pub fn rw_exit(r: &Returning, n: i64, ret: i32) -> Option<()> {
    let (call, now, sk) = (r.call, r.now, r.sk);
    let n = if call.count_ptr == 0 {
        n
    } else if ret == 1 {
        // SAFETY: the helper tolerates any user address.
        unsafe { bpf_probe_read_user(call.count_ptr as *const u64) }.map_or(0, |c| c as i64)
    } else {
        0
    };
    // SAFETY: a live map value.
    let tls = unsafe { &mut *r.tls };
    if account(tls, &call, n, ret, now) && sk != 0 {
        emit_tls_plaintext(sk, call.op, call.buf, n as u64, call.entry_ns, now, tls);
    }
    Some(())
}

/// A plaintext call of `n` bytes (`ret` its return as an int) into the
/// session's timings. True when it moved data.
#[inline(always)]
pub fn account(tls: &mut TlsConn, call: &TlsCall, n: i64, ret: i32, now: u64) -> bool {
    tls.flags |= TLS_PLAINTEXT;
    let in_handshake = tls.flags & (TLS_HS_DONE | TLS_MIDSTREAM) == 0;
    if n <= 0 {
        if in_handshake {
            tls.hs_ret = ret;
        }
        return false;
    }
    // Moving data means the handshake is over (programs that never call the
    // handshake function complete it inside their first reads and writes).
    if in_handshake && tls.flags & TLS_HS_STARTED != 0 {
        tls.hs_end_ns = now;
        tls.flags |= TLS_HS_DONE;
    }
    if call.op == op::WRITE {
        if tls.pt_first_write_ns == 0 {
            tls.pt_first_write_ns = call.entry_ns;
        }
        if tls.flags & TLS_LAST_READ != 0 {
            tls.exchanges_server += 1;
            // A write that entered before the read returned (Go's h2
            // server writes from one goroutine while another reads) is
            // not an answer to it.
            if tls.pt_write_after_read_ns == 0 && call.entry_ns >= tls.pt_first_read_ns {
                tls.pt_write_after_read_ns = call.entry_ns;
            }
        }
        tls.pt_sent += n as u64;
        tls.flags = (tls.flags & !TLS_LAST_READ) | TLS_LAST_WRITE;
    } else {
        if tls.pt_first_read_ns == 0 {
            tls.pt_first_read_ns = now;
        }
        if tls.flags & TLS_LAST_WRITE != 0 {
            tls.exchanges_client += 1;
            if tls.pt_read_after_write_ns == 0 {
                tls.pt_read_after_write_ns = now;
            }
        }
        tls.pt_received += n as u64;
        tls.flags = (tls.flags & !TLS_LAST_WRITE) | TLS_LAST_READ;
    }
    true
}

/// The client set the server name (SNI) of session `ssl` from the string at
/// `name` (user memory, NUL-terminated).
#[inline(always)]
pub fn set_server_name(ssl: u64, name: u64, library: u8) -> Option<()> {
    let (tgid, _) = current()?;
    let k = key(tgid, ssl);
    // A name is set before the handshake: a session past it is a freed one
    // whose pointer a new session reuses (its socket may be another's now).
    let session = match TLS_SESSIONS.get_ptr_mut(&k) {
        Some(s) if finished(s) => create(&k, library, 0)?,
        Some(s) => s,
        None => create(&k, library, 0)?,
    };
    // SAFETY: a live map value; the helper bounds the read by the buffer.
    let len = unsafe {
        let buf: &mut [u8; SERVER_NAME_LEN] = &mut (*session).name;
        match bpf_probe_read_user_str_bytes(name as *const u8, buf) {
            Ok(s) => s.len() as u32,
            Err(_) => return None,
        }
    };
    name_stored(session, len);
    Some(())
}

/// A session's server name, `len` bytes of a Go string at `ptr` (not
/// NUL-terminated; a longer one is cut).
#[inline(always)]
pub fn set_server_name_bytes(session: *mut TlsSession, ptr: u64, len: u64) -> Option<()> {
    if ptr == 0 || len == 0 {
        return None;
    }
    let len = (len as usize).min(SERVER_NAME_LEN - 1);
    // SAFETY: a live map value; the read is bounded by the buffer (the mask
    // tells the verifier so).
    unsafe {
        let buf = &mut (*session).name;
        let n = len & (SERVER_NAME_LEN - 1);
        if n == 0 {
            return None;
        }
        if aya_ebpf::helpers::generated::bpf_probe_read_user(
            buf.as_mut_ptr().cast(),
            n as u32,
            ptr as *const core::ffi::c_void,
        ) != 0
        {
            return None;
        }
        buf[n] = 0;
        name_stored(session, n as u32);
    }
    Some(())
}

/// The session's name buffer holds a name of `len` bytes: the connection
/// gets it once.
#[inline(always)]
fn name_stored(session: *mut TlsSession, len: u32) {
    // SAFETY: a live map value.
    unsafe {
        // Some clients set the name again on every retry (wrk: 3 times per
        // connection); once the connection has it, say it once.
        let sent = (*session).name_len != 0 && (*session).sk != 0;
        (*session).name_len = len;
        if (*session).sk != 0 && !sent {
            emit_tls_name((*session).sk, &(*session).name, len, now_ns());
        }
    }
}

/// Called for socket I/O on a tracked connection `sk` by thread `pid_tgid`:
/// if the thread is inside (or just out of) a TLS call whose session has no
/// socket yet, this is that session's socket. A rustls call's only from
/// rustls's own I/O (`from_rustls`: the socket is its descriptor's).
#[inline(always)]
pub fn bind(
    sk: u64,
    conn: &mut Conn,
    pid_tgid: u64,
    now: u64,
    from_rustls: bool,
) -> Option<(*mut TlsSession, *mut TlsCall)> {
    let call = TLS_CALLS.get_ptr_mut(&TlsCallKey { id: pid_tgid, g: 0 })?;
    // SAFETY: live map values, valid for this program run.
    unsafe {
        if (*call).bound != 0 || ((*call).library == library::RUSTLS) != from_rustls {
            return None;
        }
        if (*call).ret_ns != 0 && now.saturating_sub((*call).ret_ns) > BIND_WINDOW_NS {
            return None;
        }
        let session = TLS_SESSIONS.get_ptr_mut(&key((pid_tgid >> 32) as u32, (*call).ssl))?;
        (*call).bound = 1;
        tie(session, sk, conn, now)?;
        Some((session, call))
    }
}

/// A payload packet of TLS connection `conn` (no session tied yet) is
/// leaving the host: if its sender's thread is inside, or just out of, a
/// TLS call whose session has no socket, and holds the socket (so this is
/// not a softirq's send on an interrupted task), this is that session's
/// socket. The library's own transport sent it (curl's BIO, Node.js writing
/// its memory BIO out, GnuTLS's push function): no descriptor was ever
/// given to the library.
#[inline(always)]
pub fn tie_by_packet(conn: &mut Conn, now: u64) -> Option<()> {
    // The packet programs' own way to the task (this runs in one).
    let pid_tgid = crate::packet_task::pid_tgid()?;
    if (pid_tgid >> 32) as u32 == own_tgid() {
        return None;
    }
    // Most such packets come from no TLS call: the map first, the kernel's
    // lock after.
    TLS_CALLS.get_ptr(&TlsCallKey { id: pid_tgid, g: 0 })?;
    // The socket's address as a number (the map value's copy): the
    // packet's own pointer to it may not be offset.
    let sk = conn.sk;
    if !crate::events::sk_held_by_task(sk) {
        return None;
    }
    bind(sk, conn, pid_tgid, now, false)?;
    count(Counter::TlsPacketTied);
    Some(())
}

/// Ties `session` to socket `sk` (its connection `conn`): its timings move
/// to the socket's entry, and the connection is TLS from now on.
#[inline(always)]
pub fn tie(session: *mut TlsSession, sk: u64, conn: &mut Conn, now: u64) -> Option<()> {
    // SAFETY: a live map value.
    unsafe {
        if (*session).sk != 0 {
            return None;
        }
        if (*session).tls.library == library::RUSTLS {
            return adopt(session, sk, conn);
        }
    }
    insert(session, sk, conn, now)
}

/// [`tie`] by a fresh entry for the socket.
#[inline(always)]
fn insert(session: *mut TlsSession, sk: u64, conn: &mut Conn, now: u64) -> Option<()> {
    // SAFETY: live map values, valid for this program run.
    unsafe {
        if TLS_CONNS.insert(&sk, &(*session).tls, 0).is_err() {
            count(Counter::TlsInsertFailed);
            return None;
        }
        (*session).sk = sk;
        conn.flags |= FLAG_TLS;
        count(Counter::TlsBound);
        if (*session).name_len != 0 {
            emit_tls_name(sk, &(*session).name, (*session).name_len, now);
        }
    }
    Some(())
}

/// Ties rustls session `c` (its `CommonState`) of the current process to
/// socket `sk`, whose bytes the library just read for it. A session under
/// the same address tied to another connection is a freed one's: a new one
/// starts.
#[inline(always)]
pub fn tie_rustls(c: u64, sk: u64) -> Option<()> {
    let (tgid, _) = current()?;
    // Its reads look for their connection in the process's entry.
    announce(tgid, library::RUSTLS, now_ns());
    let conn = CONNS.get_ptr_mut(&sk)?;
    let k = key(tgid, c);
    let session = match TLS_SESSIONS.get_ptr_mut(&k) {
        // SAFETY: a live map value.
        Some(s) if unsafe { (*s).sk } == sk && socket_entry(s).is_some() => return Some(()),
        // SAFETY: a live map value.
        Some(s) if unsafe { (*s).sk } == 0 => s,
        _ => create(&k, library::RUSTLS, 0)?,
    };
    // SAFETY: a live map value.
    adopt(session, sk, unsafe { &mut *conn })
}

/// The socket rustls session `c` (its `CommonState`) of the current
/// process is tied to, if it is (and the socket's entry is still its).
#[inline(always)]
pub fn rustls_tied(c: u64) -> Option<u64> {
    let (tgid, _) = current()?;
    let s = TLS_SESSIONS.get_ptr_mut(&key(tgid, c))?;
    // SAFETY: a live map value.
    let sk = unsafe { (*s).sk };
    (sk != 0 && socket_entry(s).is_some()).then_some(sk)
}

/// Ties rustls `session` to `sk`. The socket's entry, made by the wire at
/// the ClientHello or by the connection's earlier rustls object (a
/// handshake run on the stack, a server's acceptor: the object moves to
/// its owner after), is taken over with its handshake and timings, and
/// shared by every object of the connection; without one the handshake was
/// not seen.
#[inline(always)]
fn adopt(session: *mut TlsSession, sk: u64, conn: &mut Conn) -> Option<()> {
    // SAFETY: live map values, valid for this program run.
    unsafe {
        match TLS_CONNS.get_ptr_mut(&sk) {
            Some(t) if (*t).library == library::WIRE || (*t).library == library::RUSTLS => {
                (*t).library = library::RUSTLS;
                // The first rustls object names the connection; the later
                // ones (moved objects, a reader's buffer) share its name.
                if (*t).session_ns == 0 {
                    (*t).session_ns = (*session).tls.session_ns;
                } else {
                    (*session).tls.session_ns = (*t).session_ns;
                }
                (*session).sk = sk;
                conn.flags |= FLAG_TLS;
            }
            _ => {
                (*session).tls.flags |= TLS_MIDSTREAM;
                insert(session, sk, conn, now_ns())?;
            }
        }
    }
    conn.flags |= FLAG_RUSTLS;
    count(Counter::RustlsTied);
    Some(())
}

/// Socket-level timing of a TLS connection after its handshake, for when no
/// plaintext probes ran: first payload packets each way and the first
/// answer to them (`conn_packets`). A packet is seen when it reaches the
/// socket, not when a call reads it: a client's Finished and its request
/// often reach a server before the server's handshake call returns, so
/// the last payload received during the handshake stands as the first
/// received after it until a later one, before anything was sent, replaces
/// it. Returns true once all of them are taken (or the connection's TLS
/// entry is gone): the socket needs no more of this.
#[inline(always)]
pub fn socket_io(sk: u64, tx: bool, now: u64) -> bool {
    let Some(tls) = TLS_CONNS.get_ptr_mut(&sk) else {
        return true;
    };
    // SAFETY: a live map value.
    let tls = unsafe { &mut *tls };
    let hs_end = tls.hs_end_ns;
    if hs_end == 0 {
        if !tx {
            tls.sk_recv_after_hs_ns = now;
        }
        return false;
    }
    if tx {
        if tls.sk_send_after_hs_ns == 0 {
            tls.sk_send_after_hs_ns = now;
        }
        if tls.sk_recv_after_hs_ns != 0 && tls.sk_send_after_recv_ns == 0 {
            tls.sk_send_after_recv_ns = now;
        }
    } else {
        let during_handshake = tls.sk_recv_after_hs_ns < hs_end && tls.sk_send_after_hs_ns == 0;
        if tls.sk_recv_after_hs_ns == 0 || during_handshake {
            tls.sk_recv_after_hs_ns = now;
        }
        if tls.sk_send_after_hs_ns != 0 && tls.sk_recv_after_send_ns == 0 {
            tls.sk_recv_after_send_ns = now;
        }
    }
    tls.sk_send_after_hs_ns != 0
        && tls.sk_recv_after_hs_ns != 0
        && tls.sk_send_after_recv_ns != 0
        && tls.sk_recv_after_send_ns != 0
}
