//! Entry points for the fuzz targets (fuzz/, `cargo xtask fuzz`): each
//! takes arbitrary bytes to one parser of what other programs send or
//! hold (their traffic, their DNS messages, their executables, /proc, a
//! config file) the way the observer (or its eBPF side) calls it. The same inputs (the seed
//! corpora and every crash once found) run in the unit tests below, so a
//! regression fails `cargo test` without a fuzzer.
//!
//! The call-fed parsers read their input as calls: `[control][length: u16
//! LE][bytes]` repeated, the last call taking what is left when its length
//! runs past the end. See [`Call`] for the control bits.

use std::borrow::Cow;

use observer_common::{
    http::{PlaintextEvent, DATA_FROM_START},
    tls::{op, wire},
    tls_wire, Conn, FLAG_MIDSTREAM,
};

use crate::{
    dns::message,
    http::{exchange::Exchange, gen_ai, hpack_partial, Conversation},
    libraries::{elf, golang, procmaps, rustls},
};

/// A parser's entry: arbitrary bytes in, nothing out (it must not panic).
pub type Target = fn(&[u8]);

/// Every target, by the name its fuzz target and corpus directory have.
pub const TARGETS: &[(&str, Target)] = &[
    ("http", http),
    ("http2", http2),
    ("gen_ai", gen_ai),
    ("dns", dns),
    ("elf", elf),
    ("pclntab", pclntab),
    ("procmaps", procmaps),
    ("config", config),
    ("tls_hello", tls_hello),
];

/// The most calls one input makes (a conversation's state is bounded by
/// its own limits; this bounds a run's time).
const MAX_CALLS: usize = 512;

/// One call of a call-fed input. Control bits: 0, the connection's owner
/// read (else wrote); 2, the call moved 4096 bytes more than were copied
/// (the kernel copies its first and last halves); 4-7, the time since the
/// previous call in microseconds, less one. Of the first call only: 1, the
/// connection was open before the observer (midstream); 3, the owner is a
/// server (an inbound connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    pub control: u8,
    pub bytes: &'a [u8],
}

/// The input's calls.
pub fn calls(mut data: &[u8]) -> Vec<Call<'_>> {
    let mut out = Vec::new();
    while let Some((&control, rest)) = data.split_first() {
        if out.len() == MAX_CALLS {
            break;
        }
        let len = match rest {
            [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])),
            _ => 0,
        };
        let rest = rest.get(2..).unwrap_or_default();
        let (bytes, next) = rest.split_at(len.min(rest.len()));
        out.push(Call { control, bytes });
        data = next;
    }
    out
}

/// The inverse of [`calls`], for seeds.
pub fn encode(calls: &[Call<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in calls {
        let len = u16::try_from(c.bytes.len()).unwrap_or(u16::MAX);
        out.push(c.control);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&c.bytes[..usize::from(len)]);
    }
    out
}

/// HTTP/1.x (heads, bodies, chunked, server-sent events, the LLM APIs'
/// JSON) and whatever else a connection's plaintext turns out to be.
pub fn http(data: &[u8]) {
    std::hint::black_box(conversation(data, false));
}

/// HTTP/2 and gRPC: as [`http`], with the client's preface put before the
/// first request bytes so that every input reads as frames; each call's
/// bytes are also walked as an HPACK header block.
pub fn http2(data: &[u8]) {
    std::hint::black_box(conversation(data, true));
    for c in calls(data) {
        let _ = hpack_partial::walk(c.bytes);
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The exchanges a connection's calls complete, those open at its close
/// included.
fn conversation(data: &[u8], h2: bool) -> Vec<Exchange> {
    let calls = calls(data);
    let first = calls.first().map_or(0, |c| c.control);
    let mut conn = Conn::default();
    if first & 2 != 0 {
        conn.flags |= FLAG_MIDSTREAM;
    }
    let outbound = first & 8 == 0;
    let mut conv = Conversation::default();
    let mut preface = h2;
    let mut t = 1_000_000u64;
    let mut done = Vec::new();
    for c in &calls {
        t += 1_000 * (1 + u64::from(c.control >> 4));
        let op = if c.control & 1 != 0 {
            op::READ
        } else {
            op::WRITE
        };
        let mut bytes = Cow::Borrowed(c.bytes);
        if preface && (op == op::WRITE) == outbound {
            bytes = Cow::Owned([PREFACE, c.bytes].concat());
            preface = false;
        }
        let mut ev = PlaintextEvent::of_call(conn, op, t, &bytes, DATA_FROM_START);
        if c.control & 4 != 0 {
            ev.len = ev.len.saturating_add(4096);
        }
        done.extend(conv.feed(&ev, outbound));
        let _ = conv.asked(Some(1));
        let _ = conv.serving(None);
    }
    done.extend(conv.close().into_iter().map(|(x, _)| x));
    done
}

/// An LLM API call's bodies: the first call's bytes are the request's path;
/// then control bit 0: answer (else request) bytes; 1: the answer is an
/// event stream; 2: chunked; 3: bytes before these were not copied.
pub fn gen_ai(data: &[u8]) {
    let calls = calls(data);
    let Some((path, rest)) = calls.split_first() else {
        return;
    };
    let path = String::from_utf8_lossy(path.bytes);
    let mut call = gen_ai::call_for(&path).map_or_else(|| gen_ai::Call::new(None), |(_, c)| c);
    let (mut asked, mut answered) = (false, false);
    let mut t = 1_000_000u64;
    for c in rest {
        t += 1_000 * (1 + u64::from(c.control >> 4));
        let (sse, chunked, gap) = (c.control & 2 != 0, c.control & 4 != 0, c.control & 8 != 0);
        if c.control & 1 == 0 {
            if !asked {
                call.start_request(chunked);
                asked = true;
            }
            call.request_bytes(c.bytes, gap);
        } else {
            if !answered {
                call.start_response(sse, chunked);
                answered = true;
            }
            call.response_bytes(c.bytes, gap, t);
        }
    }
    call.finish(t + 1);
    std::hint::black_box(call.time_per_output_token_ns());
}

/// A DNS message off the wire.
pub fn dns(data: &[u8]) {
    if let Ok(m) = message::parse(data) {
        if let Some(q) = &m.question {
            std::hint::black_box(message::qtype_name(q.qtype));
        }
        std::hint::black_box(message::rcode_name(m.rcode));
    }
}

/// An executable or library, as the TLS and DNS discovery read one: its
/// kind (OpenSSL, GnuTLS, a C library), the probed symbols' offsets, and
/// whether it is a Go or a rustls executable.
pub fn elf(data: &[u8]) {
    let Some(path) = scratch_file(data) else {
        return;
    };
    let _ = elf::classify(&path);
    let _ = elf::symbol_offset(&path, "SSL_read");
    let _ = golang::inspect(&path);
    let _ = rustls::inspect(&path);
    // Each run's file is its own (pid, thread): left behind, every test
    // run would leave one in the temporary directory.
    let _ = std::fs::remove_file(&path);
}

/// A Go executable's function table and build information, and the
/// instruction decoder that finds its functions' returns.
pub fn pclntab(data: &[u8]) {
    golang::fuzz_tables(data);
}

/// Lines of a /proc/PID/maps file.
pub fn procmaps(data: &[u8]) {
    for line in String::from_utf8_lossy(data).lines() {
        std::hint::black_box(procmaps::parse_line(line));
    }
}

/// `observer run`'s config file, read as TOML and as YAML.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for yaml in [false, true] {
        let _ = crate::export::config::parse(&text, yaml, "fuzz".into());
    }
}

/// TLS segments as the packet programs read them
/// (`observer_common::tls_wire`, the eBPF's own code): each call is a
/// segment, control bit 0 set where the connection's owner read it (else
/// sent it). Every segment's server name and version are read; a first
/// segment that is a ClientHello starts a handshake that the later ones
/// walk through its stages, as on the wire. Panics where the parser breaks
/// its word: a name outside its hello, a stage it cannot reach.
pub fn tls_hello(data: &[u8]) {
    let calls = calls(data);
    for seg in std::iter::once(data).chain(calls.iter().map(|c| c.bytes)) {
        hello_fields(seg);
    }
    let Some((first, rest)) = calls.split_first() else {
        return;
    };
    if !tls_wire::is_client_hello(first.bytes, 0) {
        return;
    }
    let hello_in = first.control & 1;
    let mut stage = wire::HELLO;
    for c in rest {
        let toward_server = c.control & 1 == hello_in;
        let Some((next, mark)) = tls_wire::advance(c.bytes, 0, c.bytes.len(), stage, toward_server)
        else {
            assert!(c.bytes.len() < 6, "a segment with its head read as none");
            continue;
        };
        assert!(
            wire_step_allowed(stage, next, mark),
            "{stage} -> {next} ({mark:?})"
        );
        stage = next;
        if stage == wire::DONE {
            // The packet programs stop reading the connection.
            break;
        }
    }
}

/// A segment read as a hello: the name lies inside the hello (and inside
/// the segment where the hello is all there).
fn hello_fields(seg: &[u8]) {
    if let Some((off, len)) = tls_wire::server_name(seg, 0) {
        let end = tls_wire::hello_end(seg, 0).expect("a hello's length, read before its name");
        assert!(len > 0 && off >= tls_wire::HELLO_SESSION_ID && off + len <= end);
        if end <= seg.len() {
            std::hint::black_box(&seg[off..off + len]);
        }
    }
    std::hint::black_box(tls_wire::server_version(seg, 0));
}

/// Whether [`tls_wire::advance`] may go from `from` to `to`, marking `mark`
/// (the flights in `observer_common::tls_wire`'s comment).
fn wire_step_allowed(from: u8, to: u8, mark: tls_wire::Mark) -> bool {
    use tls_wire::Mark;
    match (from, to, mark) {
        (_, _, Mark::Nothing) if from == to => true,
        (wire::HELLO, wire::SERVER_FLIGHT, Mark::Nothing | Mark::Version(_))
        | (wire::SERVER_FLIGHT, wire::HELLO | wire::TLS12_CLIENT_FLIGHT, Mark::Nothing)
        | (wire::SERVER_FLIGHT, wire::DONE, Mark::Finished)
        | (wire::TLS12_CLIENT_FLIGHT, wire::TLS12_OPEN, Mark::Finished12)
        | (wire::TLS12_OPEN, wire::TLS12_REQUEST, Mark::Request)
        | (wire::TLS12_REQUEST, wire::DONE, Mark::Answer) => true,
        _ => false,
    }
}

/// The readers of executables take a path (they map the file): the input
/// goes to one file per process and thread, removed once read.
fn scratch_file(data: &[u8]) -> Option<std::path::PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "observer-fuzz-{}-{:?}.elf",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, data).ok()?;
    Some(path)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn fuzz_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
    }

    /// Every kept input (seeds and the crashes once found) through its
    /// target: none may panic.
    #[test]
    fn every_kept_input_runs_through_its_target() {
        for &(name, target) in TARGETS {
            let mut n = 0;
            for dir in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(name)) else {
                    continue;
                };
                for e in entries.flatten() {
                    let data = std::fs::read(e.path()).expect("readable");
                    target(&data);
                    n += 1;
                }
            }
            assert!(n > 0, "no kept inputs for the {name} target");
        }
    }

    /// The seeds are what they say: a recorded OpenAI chat stream (the first
    /// connection of llm_shapes.py's compact run, curl's) reads as one LLM
    /// call from the client's end and from the server's.
    #[test]
    fn a_recorded_stream_reads_as_an_llm_call_from_both_ends() {
        for view in ["client", "server"] {
            let path = fuzz_dir().join(format!("corpus/http/llm-compact-0-{view}"));
            let data = std::fs::read(&path).expect("the seed");
            let done = conversation(&data, false);
            assert_eq!(done.len(), 1, "{view}");
            let call = done[0].call.as_ref().expect("an LLM call");
            assert_eq!(call.request_model.as_deref(), Some("m1"), "{view}");
            assert_eq!(call.response_model.as_deref(), Some("m1-served"), "{view}");
            assert_eq!(call.output_tokens, Some(3), "{view}");
            assert_eq!(call.content_events, 3, "{view}");
            assert!(done[0].complete, "{view}");
        }
    }

    /// A recorded TLS connection (fuzz/corpus/tls_hello, `seed.py tls`)
    /// from one end: the ClientHello's name, then each later segment's
    /// index, the stage it leads to and its mark, as the packet programs
    /// walk them (until the end: they stop reading there).
    fn walk_tls(name: &str) -> (Option<String>, Vec<(usize, u8, tls_wire::Mark)>) {
        let data = std::fs::read(fuzz_dir().join("corpus/tls_hello").join(name)).expect("the seed");
        tls_hello(&data);
        let calls = calls(&data);
        let hello = calls[0].bytes;
        assert!(tls_wire::is_client_hello(hello, 0), "{name}");
        let sni = tls_wire::server_name(hello, 0)
            .map(|(off, len)| String::from_utf8_lossy(&hello[off..off + len]).into_owned());
        let mut stage = wire::HELLO;
        let mut steps = Vec::new();
        for (i, c) in calls.iter().enumerate().skip(1) {
            let toward_server = c.control & 1 == calls[0].control & 1;
            let (next, mark) =
                tls_wire::advance(c.bytes, 0, c.bytes.len(), stage, toward_server).expect("a head");
            stage = next;
            steps.push((i, stage, mark));
            if stage == wire::DONE {
                break;
            }
        }
        (sni, steps)
    }

    /// The recorded handshakes of real clients (OpenSSL's s_client,
    /// Python's ssl, curl, Java's JSSE; TLS 1.3 and 1.2, with a name and
    /// without) against Python's ssl (OpenSSL), from both ends: the name,
    /// the version, and the handshake's end where the client's Finished
    /// went (1.3) or the server's last flight came (1.2), then the request
    /// and the answer.
    #[test]
    fn recorded_tls_handshakes_read_as_they_went() {
        use tls_wire::Mark;
        let clients = [
            "openssl-13",
            "openssl-13-nosni",
            "openssl-12",
            "python-13",
            "python-13-nosni",
            "python-12",
            "curl-13",
            "curl-12",
            "java-13",
            "java-12",
            "openssl-hrr",
        ];
        for client in clients {
            let (sni, steps) = walk_tls(&format!("{client}-0-client"));
            let named = !client.contains("nosni") && !client.starts_with("java");
            assert_eq!(sni.as_deref(), named.then_some("example.test"), "{client}");
            assert_eq!(
                walk_tls(&format!("{client}-0-server")),
                (sni, steps.clone()),
                "{client}: the server's view"
            );
            let version = steps.iter().find_map(|s| match s.2 {
                Mark::Version(v) => Some(v),
                _ => None,
            });
            let tls12 = client.ends_with("-12");
            assert_eq!(
                version,
                Some(if tls12 { 0x0303 } else { 0x0304 }),
                "{client}"
            );
            let marks: Vec<Mark> = steps
                .iter()
                .map(|s| s.2)
                .filter(|m| !matches!(m, Mark::Nothing | Mark::Version(_)))
                .collect();
            if tls12 {
                assert_eq!(
                    marks,
                    [Mark::Finished12, Mark::Request, Mark::Answer],
                    "{client}"
                );
            } else {
                assert_eq!(marks, [Mark::Finished], "{client}");
            }
            assert_eq!(steps.last().map(|s| s.1), Some(wire::DONE), "{client}");
        }
    }

    /// OpenSSL's client after a HelloRetryRequest: its compatibility
    /// ChangeCipherSpec and second ClientHello in one segment start the
    /// handshake over; its end is the Finished two segments later.
    #[test]
    fn a_recorded_hello_retry_ends_at_the_clients_finished_not_its_second_hello() {
        use tls_wire::Mark;
        let (_, steps) = walk_tls("openssl-hrr-0-client");
        assert_eq!(
            steps,
            [
                (1, wire::SERVER_FLIGHT, Mark::Version(0x0304)),
                (2, wire::HELLO, Mark::Nothing),
                (3, wire::SERVER_FLIGHT, Mark::Version(0x0304)),
                (4, wire::DONE, Mark::Finished),
            ]
        );
    }

    /// A recorded ClientHello cut anywhere: no name until its header is
    /// in, then the whole hello's; the cut server flight's version is the
    /// whole one's or none of it.
    #[test]
    fn recorded_hellos_cut_short_name_nothing_else() {
        for client in ["python-13", "curl-12", "openssl-hrr"] {
            let data =
                std::fs::read(fuzz_dir().join(format!("corpus/tls_hello/{client}-0-client")))
                    .expect("the seed");
            let calls = calls(&data);
            let (hello, flight) = (calls[0].bytes, calls[1].bytes);
            let name = tls_wire::server_name(hello, 0).expect("a name");
            let version = tls_wire::server_version(flight, 0);
            for n in 0..hello.len() {
                match tls_wire::server_name(&hello[..n], 0) {
                    None => assert!(n < name.0, "{client} {n}"),
                    Some(found) => assert_eq!(found, name, "{client} {n}"),
                }
            }
            for n in 0..flight.len() {
                let v = tls_wire::server_version(&flight[..n], 0);
                // Legacy (0x0303) while supported_versions is not all in.
                assert!([0, 0x0303, version].contains(&v), "{client} {n}: {v:#x}");
            }
        }
    }

    #[test]
    fn every_target_has_a_fuzz_target_file() {
        for &(name, _) in TARGETS {
            let f = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
            let text = std::fs::read_to_string(&f).expect("a fuzz target per entry");
            assert!(
                text.contains(&format!("fuzzing::{name}(")),
                "{}",
                f.display()
            );
        }
    }

    #[test]
    fn calls_read_what_encode_writes_and_a_short_tail_is_one_call() {
        let calls_in = [
            Call {
                control: 1,
                bytes: b"GET / HTTP/1.1\r\n\r\n",
            },
            Call {
                control: 0x20,
                bytes: b"",
            },
        ];
        assert_eq!(calls(&encode(&calls_in)), calls_in);
        assert_eq!(
            calls(&[7, 200, 0, b'x']),
            [Call {
                control: 7,
                bytes: b"x"
            }]
        );
        assert_eq!(
            calls(&[7]),
            [Call {
                control: 7,
                bytes: b""
            }]
        );
    }
}
