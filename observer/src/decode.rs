//! The one place that turns ring-buffer bytes into typed events.

use observer_common::{
    http::{PlaintextEvent, DATA_CAPTURE},
    tls::{TlsBusyEvent, TlsNameEvent, TlsProcessEvent, SERVER_NAME_LEN},
    CloseEvent, Conn, EventHeader, EventKind, ExecEvent, ListenEvent, OwnerEvent, ProcessEvent,
    TlsConn, EXEC_PATH_LEN,
};

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A connection got its owning process.
    Owner {
        ts_ns: u64,
        sk: u64,
        pid: u32,
        tid: u32,
        comm: [u8; 16],
        direction: u8,
        /// The far end, when the kernel knew it.
        remote: Option<std::net::IpAddr>,
        /// The far end's port (0: unknown).
        remote_port: u16,
    },
    /// A connection closed; its final state and TLS timings (`library == 0`:
    /// no TLS seen).
    Close(Conn, TlsConn),
    /// `pid` exec'd `filename` (NUL-terminated, as given to exec).
    Exec {
        pid: u32,
        /// Its cgroup v2 id at exec.
        cgroup_id: u64,
        filename: [u8; EXEC_PATH_LEN],
    },
    /// Process `pid` exited.
    Exit { pid: u32 },
    /// Socket `sk` began listening on `port` in process `pid`
    /// (`listening`), or its listening ended (`pid` 0).
    Listen {
        sk: u64,
        pid: u32,
        port: u16,
        listening: bool,
    },
    /// Process `pid` began using TLS through `library`.
    TlsProcess { pid: u32, library: u8 },
    /// A getaddrinfo call finished.
    Dns(Box<observer_common::dns::DnsEvent>),
    /// A DNS message to or from port 53.
    DnsPacket(Box<observer_common::dns::DnsPacketEvent>),
    /// A socket that sent DNS queries was released at `ts_ns`.
    DnsSockReleased { ts_ns: u64, cookie: u64 },
    /// A plaintext read or write on an HTTP/1.x TLS connection.
    Plaintext(Plaintext),
    /// Process `pid` made `calls` plaintext TLS calls in one kernel rate window.
    TlsBusy { pid: u32, calls: u32 },
    /// The server name of the TLS connection on `sk`.
    TlsName {
        sk: u64,
        len: usize,
        name: [u8; SERVER_NAME_LEN],
    },
}

/// Why a record could not be decoded. Each is counted, never fatal.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the common header.
    #[error("record of {0} bytes is shorter than the header")]
    Short(usize),
    /// A kind id this build does not know (kernel and userspace out of step).
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    /// The record's size does not match its kind's.
    #[error("record kind {kind} has {got} bytes, expected {want}")]
    BadSize { kind: u32, got: usize, want: usize },
}

/// Reads a `T` from the start of `bytes` after checking the length.
fn read<T: Copy>(bytes: &[u8], kind: u32) -> Result<T, DecodeError> {
    fits::<T>(bytes, kind)?;
    // SAFETY: length checked above; T is a plain-old-data repr(C) type from
    // observer-common, valid for any bit pattern; read_unaligned needs no alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The size of T, if the record holds one.
fn fits<T>(bytes: &[u8], kind: u32) -> Result<usize, DecodeError> {
    let want = std::mem::size_of::<T>();
    if bytes.len() < want {
        return Err(DecodeError::BadSize {
            kind,
            got: bytes.len(),
            want,
        });
    }
    Ok(want)
}

/// `read`, straight into the heap: the large events (a plaintext event
/// carries 1 KiB of payload room) are copied once, not once onto the stack
/// and again into their box.
fn read_boxed<T: Copy>(bytes: &[u8], kind: u32) -> Result<Box<T>, DecodeError> {
    let want = fits::<T>(bytes, kind)?;
    let mut b = Box::<T>::new_uninit();
    // SAFETY: length checked above; T is a plain-old-data repr(C) type from
    // observer-common, valid for any bit pattern, so `want` bytes copied
    // from the record initialise it whole.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.as_mut_ptr().cast::<u8>(), want);
        Ok(b.assume_init())
    }
}

/// Spare plaintext boxes kept at most (1.2 KiB each).
const MAX_SPARE: usize = 1024;

/// Boxes of plaintext events read, for the next ones: a record is 1.2 KiB,
/// past glibc's per-thread cache, so each new box cost a trip through the
/// allocator's shared bins (5% of a churn request's userspace work).
// Boxes, not values: each is handed out and taken back whole.
#[allow(clippy::vec_box)]
static SPARE: std::sync::Mutex<Vec<Box<PlaintextEvent>>> = std::sync::Mutex::new(Vec::new());

/// A decoded plaintext event, boxed; its box goes back to [`SPARE`] when
/// it is dropped.
pub struct Plaintext(std::mem::ManuallyDrop<Box<PlaintextEvent>>);

impl Plaintext {
    pub fn new(ev: PlaintextEvent) -> Self {
        let mut b = spare_box();
        b.write(ev);
        // SAFETY: written whole just above.
        Self(std::mem::ManuallyDrop::new(unsafe { b.assume_init() }))
    }
}

/// A box for a plaintext event: a spare one, else a new one.
fn spare_box() -> Box<std::mem::MaybeUninit<PlaintextEvent>> {
    let spare = SPARE.lock().ok().and_then(|mut s| s.pop());
    match spare {
        // SAFETY: MaybeUninit<T> has T's layout; the box's allocation is
        // handed over as it is.
        Some(b) => unsafe { Box::from_raw(Box::into_raw(b).cast()) },
        None => Box::new_uninit(),
    }
}

impl Drop for Plaintext {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and never used after.
        let b = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        if let Ok(mut s) = SPARE.lock() {
            if s.len() < MAX_SPARE {
                s.push(b);
            }
        }
    }
}

impl std::ops::Deref for Plaintext {
    type Target = PlaintextEvent;
    fn deref(&self) -> &PlaintextEvent {
        &self.0
    }
}

impl Clone for Plaintext {
    fn clone(&self) -> Self {
        Self::new(**self.0)
    }
}

impl PartialEq for Plaintext {
    fn eq(&self, o: &Self) -> bool {
        **self.0 == **o.0
    }
}

impl Eq for Plaintext {}

impl std::fmt::Debug for Plaintext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A plaintext event copied as far as its payload goes: a request's head
/// is a few dozen bytes of the kilobyte the record has room for, and the
/// record's unused room (memory the kernel wrote on another CPU) is not
/// read; the box's rest is zeroed instead.
fn read_plaintext(bytes: &[u8], kind: u32) -> Result<Plaintext, DecodeError> {
    let want = fits::<PlaintextEvent>(bytes, kind)?;
    let len_at = std::mem::offset_of!(PlaintextEvent, len);
    let mut len = [0u8; 4];
    len.copy_from_slice(&bytes[len_at..len_at + 4]);
    let used = std::mem::offset_of!(PlaintextEvent, data)
        + (u32::from_ne_bytes(len) as usize).min(DATA_CAPTURE);
    let mut b = spare_box();
    // SAFETY: `want` bytes are in the record (checked above) and `used` is
    // at most `want`; the first `used` bytes come from the record and the
    // rest are zeroed, so the whole plain-old-data value is initialised.
    unsafe {
        let p = b.as_mut_ptr().cast::<u8>();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, used);
        std::ptr::write_bytes(p.add(used), 0, want - used);
        Ok(Plaintext(std::mem::ManuallyDrop::new(b.assume_init())))
    }
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    if bytes.len() < std::mem::size_of::<EventHeader>() {
        return Err(DecodeError::Short(bytes.len()));
    }
    let hdr: EventHeader = read(bytes, 0)?;
    let kind = EventKind::from_u32(hdr.kind).ok_or(DecodeError::UnknownKind(hdr.kind))?;
    match kind {
        EventKind::Owner => {
            let ev: OwnerEvent = read(bytes, hdr.kind)?;
            Ok(Event::Owner {
                ts_ns: ev.hdr.ts_ns,
                sk: ev.sk,
                pid: ev.pid,
                tid: ev.tid,
                comm: ev.comm,
                direction: ev.direction,
                remote: crate::record::ip_of(ev.family, &ev.daddr),
                remote_port: ev.dport,
            })
        }
        EventKind::Close => {
            let ev: CloseEvent = read(bytes, hdr.kind)?;
            Ok(Event::Close(ev.conn, ev.tls))
        }
        EventKind::Exec => {
            let ev: ExecEvent = read(bytes, hdr.kind)?;
            Ok(Event::Exec {
                pid: ev.pid,
                cgroup_id: ev.cgroup_id,
                filename: ev.filename,
            })
        }
        EventKind::Exit => {
            let ev: ProcessEvent = read(bytes, hdr.kind)?;
            Ok(Event::Exit { pid: ev.pid })
        }
        EventKind::Listen => {
            let ev: ListenEvent = read(bytes, hdr.kind)?;
            Ok(Event::Listen {
                sk: ev.sk,
                pid: ev.pid,
                port: ev.port,
                listening: ev.listening != 0,
            })
        }
        EventKind::TlsProcess => {
            let ev: TlsProcessEvent = read(bytes, hdr.kind)?;
            Ok(Event::TlsProcess {
                pid: ev.pid,
                library: ev.library as u8,
            })
        }
        EventKind::Dns => Ok(Event::Dns(read_boxed(bytes, hdr.kind)?)),
        EventKind::DnsPacket => Ok(Event::DnsPacket(read_boxed(bytes, hdr.kind)?)),
        EventKind::DnsSockReleased => {
            let ev: observer_common::dns::DnsSockEvent = read(bytes, hdr.kind)?;
            Ok(Event::DnsSockReleased {
                ts_ns: ev.hdr.ts_ns,
                cookie: ev.cookie,
            })
        }
        EventKind::TlsBusy => {
            let ev: TlsBusyEvent = read(bytes, hdr.kind)?;
            Ok(Event::TlsBusy {
                pid: ev.pid,
                calls: ev.calls,
            })
        }
        EventKind::Plaintext => Ok(Event::Plaintext(read_plaintext(bytes, hdr.kind)?)),
        EventKind::TlsName => {
            let ev: TlsNameEvent = read(bytes, hdr.kind)?;
            Ok(Event::TlsName {
                sk: ev.sk,
                len: (ev.len as usize).min(SERVER_NAME_LEN),
                name: ev.name,
            })
        }
    }
}

/// The bytes of a plain-old-data value, as the kernel would write them. For tests
/// and benchmarks that build synthetic event streams.
pub fn as_bytes<T: Copy>(value: &T) -> &[u8] {
    // SAFETY: T is a padding-free repr(C) type from observer-common (their sizes
    // are asserted there); viewing it as bytes is sound.
    unsafe {
        std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(kind: EventKind, size: usize) -> EventHeader {
        EventHeader {
            kind: kind as u32,
            size: size as u32,
            ts_ns: 42,
        }
    }

    #[test]
    fn decodes_owner() {
        let ev = OwnerEvent {
            hdr: hdr(EventKind::Owner, std::mem::size_of::<OwnerEvent>()),
            sk: 0xffff_8880_0000_1000,
            pid: 10,
            tid: 11,
            comm: *b"curl\0\0\0\0\0\0\0\0\0\0\0\0",
            direction: observer_common::DIR_OUTBOUND,
            _pad: 0,
            family: observer_common::AF_INET,
            dport: 443,
            _pad2: 0,
            daddr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        };
        let got = decode(as_bytes(&ev)).expect("decodes");
        assert_eq!(
            got,
            Event::Owner {
                ts_ns: 42,
                sk: 0xffff_8880_0000_1000,
                pid: 10,
                tid: 11,
                comm: ev.comm,
                direction: observer_common::DIR_OUTBOUND,
                remote: Some(std::net::IpAddr::from([10, 0, 0, 1])),
                remote_port: 443,
            }
        );
    }

    #[test]
    fn decodes_close_and_process_events() {
        let conn = Conn {
            sk: 7,
            bytes_tx: 100,
            bytes_rx: 200,
            ..Conn::default()
        };
        let tls = TlsConn {
            hs_start_ns: 5,
            library: observer_common::tls::library::GNUTLS,
            ..TlsConn::default()
        };
        let ev = CloseEvent {
            hdr: hdr(EventKind::Close, std::mem::size_of::<CloseEvent>()),
            conn,
            tls,
        };
        assert_eq!(decode(as_bytes(&ev)), Ok(Event::Close(conn, tls)));
        let mut name = [0u8; SERVER_NAME_LEN];
        name[..9].copy_from_slice(b"localhost");
        let n = TlsNameEvent {
            hdr: hdr(EventKind::TlsName, std::mem::size_of::<TlsNameEvent>()),
            sk: 9,
            len: 900,
            _pad: 0,
            name,
        };
        assert_eq!(
            decode(as_bytes(&n)),
            Ok(Event::TlsName {
                sk: 9,
                len: SERVER_NAME_LEN,
                name
            }),
            "a length past the buffer is clamped"
        );
        let b = TlsBusyEvent {
            hdr: hdr(EventKind::TlsBusy, std::mem::size_of::<TlsBusyEvent>()),
            pid: 5,
            calls: 100,
        };
        assert_eq!(
            decode(as_bytes(&b)),
            Ok(Event::TlsBusy { pid: 5, calls: 100 })
        );
        let p = ProcessEvent {
            hdr: hdr(EventKind::Exit, 24),
            pid: 99,
            _pad: 0,
        };
        assert_eq!(decode(as_bytes(&p)), Ok(Event::Exit { pid: 99 }));
        let l = ListenEvent {
            hdr: hdr(EventKind::Listen, 32),
            sk: 7,
            pid: 42,
            port: 8080,
            listening: 1,
            _pad: 0,
        };
        assert_eq!(
            decode(as_bytes(&l)),
            Ok(Event::Listen {
                sk: 7,
                pid: 42,
                port: 8080,
                listening: true
            })
        );
        let mut filename = [0u8; EXEC_PATH_LEN];
        filename[..9].copy_from_slice(b"/bin/true");
        let e = ExecEvent {
            hdr: hdr(EventKind::Exec, std::mem::size_of::<ExecEvent>()),
            pid: 98,
            _pad: 0,
            cgroup_id: 7,
            filename,
        };
        assert_eq!(
            decode(as_bytes(&e)),
            Ok(Event::Exec {
                pid: 98,
                cgroup_id: 7,
                filename
            })
        );
        // An exit-sized record claiming to be an exec is refused.
        let short = ProcessEvent {
            hdr: hdr(EventKind::Exec, 24),
            ..p
        };
        assert!(matches!(
            decode(as_bytes(&short)),
            Err(DecodeError::BadSize { .. })
        ));
    }

    #[test]
    fn rejects_bad_records() {
        assert_eq!(decode(&[0u8; 3]), Err(DecodeError::Short(3)));
        let h = EventHeader {
            kind: 77,
            size: 16,
            ts_ns: 0,
        };
        assert_eq!(decode(as_bytes(&h)), Err(DecodeError::UnknownKind(77)));
        let h = hdr(EventKind::Close, 16);
        assert_eq!(
            decode(as_bytes(&h)),
            Err(DecodeError::BadSize {
                kind: 2,
                got: 16,
                want: std::mem::size_of::<CloseEvent>()
            })
        );
    }

    #[test]
    fn a_plaintext_event_keeps_its_payload_and_nothing_past_it() {
        let mut ev = PlaintextEvent::of_call(
            Conn::default(),
            observer_common::tls::op::WRITE,
            7,
            b"GET / HTTP/1.1\r\n\r\n",
            observer_common::http::DATA_FROM_START,
        );
        ev.hdr.kind = EventKind::Plaintext as u32;
        let mut record = as_bytes(&ev).to_vec();
        // Whatever the ring held past the payload is not carried over.
        let past = std::mem::offset_of!(PlaintextEvent, data) + 18;
        record[past..].fill(0xAA);
        let Ok(Event::Plaintext(got)) = decode(&record) else {
            panic!("not a plaintext event");
        };
        assert_eq!(*got, ev, "payload kept, the rest zero");

        let long: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut ev = PlaintextEvent::of_call(Conn::default(), 0, 7, &long, 0);
        ev.hdr.kind = EventKind::Plaintext as u32;
        let Ok(Event::Plaintext(got)) = decode(as_bytes(&ev)) else {
            panic!("not a plaintext event");
        };
        assert_eq!(*got, ev, "both halves of a long call kept");
    }
}
