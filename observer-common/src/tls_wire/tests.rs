//! The parser over hellos built here, field by field, where a real one
//! cannot show the case (a malformed length, the extension bound). Real
//! hellos, recorded from OpenSSL, Python, curl and Java, are read in the
//! observer's unit tests (`observer::fuzzing`, over fuzz/corpus/tls_hello).

extern crate std;

use std::{vec, vec::Vec};

use super::*;

/// An extension: type, length, data.
fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::from(kind.to_be_bytes());
    out.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// RFC 6066's server_name data: a list of one host name.
fn sni(name: &[u8]) -> Vec<u8> {
    let mut entry = vec![0];
    entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    entry.extend_from_slice(name);
    let mut out = Vec::from(u16::try_from(entry.len()).unwrap().to_be_bytes());
    out.extend(entry);
    out
}

/// A hello record whose extensions block says `exts_len` and holds `exts`.
fn hello(msg: u8, exts: &[u8], exts_len: usize) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(32);
    body.extend_from_slice(&[0x11; 32]);
    if msg == CLIENT_HELLO {
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02, 1, 0]);
    } else {
        body.extend_from_slice(&[0x13, 0x01, 0]);
    }
    body.extend_from_slice(&u16::try_from(exts_len).unwrap().to_be_bytes());
    body.extend_from_slice(exts);
    let mut hs = vec![msg];
    hs.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![HANDSHAKE, 3, 1];
    rec.extend_from_slice(&u16::try_from(hs.len()).unwrap().to_be_bytes());
    rec.extend(hs);
    rec
}

fn client_hello(exts: &[u8]) -> Vec<u8> {
    hello(CLIENT_HELLO, exts, exts.len())
}

fn name_of(seg: &[u8]) -> Option<&[u8]> {
    let (off, len) = server_name(seg, 0)?;
    seg.get(off..off + len)
}

#[test]
fn a_client_hello_names_its_server_among_other_extensions() {
    let exts = [
        ext(10, &[0, 2, 0, 29]),
        ext(EXT_SERVER_NAME, &sni(b"api.example.test")),
        ext(43, &[2, 3, 4]),
    ]
    .concat();
    let seg = client_hello(&exts);
    assert!(is_client_hello(&seg[..], 0));
    assert_eq!(name_of(&seg), Some(&b"api.example.test"[..]));
    // Past other bytes in the packet (a socket buffer's headers): the same.
    let at = [vec![0xee; 52], seg.clone()].concat();
    assert_eq!(
        server_name(&at[..], 52).map(|(o, l)| (o - 52, l)),
        server_name(&seg[..], 0)
    );
}

#[test]
fn a_client_hello_without_a_name_or_with_an_empty_one_names_none() {
    let seg = client_hello(&ext(10, &[0, 2, 0, 29]));
    assert_eq!(server_name(&seg[..], 0), None);
    let seg = client_hello(&ext(EXT_SERVER_NAME, &sni(b"")));
    assert_eq!(server_name(&seg[..], 0), None);
    // A name of another type than a host name (0).
    let mut data = sni(b"x.test");
    data[2] = 1;
    assert_eq!(
        server_name(&client_hello(&ext(EXT_SERVER_NAME, &data))[..], 0),
        None
    );
}

#[test]
fn a_truncated_hello_gives_no_name_or_the_whole_hellos() {
    let exts = [
        ext(10, &[0, 2, 0, 29]),
        ext(EXT_SERVER_NAME, &sni(b"example.test")),
    ]
    .concat();
    let seg = client_hello(&exts);
    let whole = server_name(&seg[..], 0).expect("a name");
    for n in 0..seg.len() {
        let part = &seg[..n];
        // The name's place comes from the hello's own lengths: a segment that
        // ends inside the name still says where it lies (the eBPF's load of
        // it then fails); one that ends before its header says nothing.
        match server_name(part, 0) {
            None => assert!(n < whole.0, "{n}"),
            Some(found) => assert_eq!(found, whole, "{n}"),
        }
        let _ = server_version(part, 0);
        let _ = advance(part, 0, n, wire::HELLO, false);
    }
}

#[test]
fn an_extension_that_runs_past_the_extensions_names_none() {
    // The server_name extension says 200 bytes, its list and name agree, but
    // the extensions block ends after 30: the name would lie past the
    // hello, in whatever follows it in the segment.
    let mut data = Vec::from(198u16.to_be_bytes());
    data.push(0);
    data.extend_from_slice(&195u16.to_be_bytes());
    data.extend_from_slice(&[b'a'; 195]);
    let exts = ext(EXT_SERVER_NAME, &data);
    let seg = [hello(CLIENT_HELLO, &exts[..30], 30), exts[30..].to_vec()].concat();
    assert_eq!(server_name(&seg[..], 0), None);
    // The same extension whole: named.
    assert_eq!(name_of(&client_hello(&exts)).map(<[u8]>::len), Some(195));
}

#[test]
fn the_name_is_looked_for_among_the_first_24_extensions_only() {
    for (before, found) in [(MAX_EXTENSIONS - 1, true), (MAX_EXTENSIONS, false)] {
        let mut exts: Vec<u8> = (0..before)
            .flat_map(|i| ext(100 + i as u16, &[1]))
            .collect();
        exts.extend(ext(EXT_SERVER_NAME, &sni(b"far.test")));
        assert_eq!(name_of(&client_hello(&exts)).is_some(), found, "{before}");
    }
}

#[test]
fn a_server_hello_gives_its_supported_version_else_its_legacy_one() {
    let tls13 = hello(SERVER_HELLO, &ext(EXT_SUPPORTED_VERSIONS, &[3, 4]), 6);
    assert_eq!(server_version(&tls13[..], 0), 0x0304);
    let tls12 = hello(SERVER_HELLO, &ext(0xff01, &[0]), 5);
    assert_eq!(server_version(&tls12[..], 0), 0x0303);
    // No extensions at all, a Certificate message right after the hello
    // in the same record: its bytes are not read as extensions.
    let mut bare = hello(SERVER_HELLO, &[], 0);
    bare.truncate(bare.len() - 2);
    let len = bare[8] - 2;
    bare[8] = len;
    bare.extend_from_slice(&[11, 0, 0, 8, 0, 43, 0, 2, 3, 4, 0, 0]);
    assert_eq!(server_version(&bare[..], 0), 0x0303);
    // Too short for even the legacy version.
    assert_eq!(server_version(&tls13[..10], 0), 0);
}

/// The record headers (and a handshake's message type) of a flight.
fn rec(kind: u8, msg: u8) -> [u8; 6] {
    [kind, 3, 3, 0, 1, msg]
}

fn walk(flights: &[(&[u8], bool)]) -> Vec<(u8, Mark)> {
    let mut stage = wire::HELLO;
    let mut out = Vec::new();
    for &(seg, toward_server) in flights {
        if let Some((next, mark)) = advance(seg, 0, seg.len(), stage, toward_server) {
            stage = next;
            out.push((next, mark));
        }
    }
    out
}

#[test]
fn a_tls13_handshake_ends_at_the_clients_finished_and_java_s_lone_ccs_is_not_it() {
    let sh = hello(SERVER_HELLO, &ext(EXT_SUPPORTED_VERSIONS, &[3, 4]), 6);
    let ccs = [CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1];
    let fin = rec(APPLICATION_DATA, 0x42);
    let steps = walk(&[(&sh, false), (&ccs, true), (&fin, true), (&fin, false)]);
    assert_eq!(
        steps,
        [
            (wire::SERVER_FLIGHT, Mark::Version(0x0304)),
            (wire::SERVER_FLIGHT, Mark::Nothing),
            (wire::DONE, Mark::Finished),
            (wire::DONE, Mark::Nothing),
        ]
    );
}

#[test]
fn a_hello_retry_request_starts_over_at_the_second_client_hello() {
    let hrr = hello(SERVER_HELLO, &ext(EXT_SUPPORTED_VERSIONS, &[3, 4]), 6);
    let ch = client_hello(&ext(EXT_SERVER_NAME, &sni(b"example.test")));
    let steps = walk(&[(&hrr, false), (&ch, true), (&hrr, false)]);
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        [wire::SERVER_FLIGHT, wire::HELLO, wire::SERVER_FLIGHT]
    );
    // The client's compatibility ChangeCipherSpec in front of its second
    // ClientHello, in one segment: not its Finished.
    let ccs_ch = [&[CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1][..], &ch].concat();
    let steps = walk(&[(&hrr, false), (&ccs_ch, true), (&hrr, false)]);
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        [wire::SERVER_FLIGHT, wire::HELLO, wire::SERVER_FLIGHT]
    );
}

#[test]
fn a_tls12_handshake_ends_at_the_servers_last_flight_then_request_and_answer() {
    let sh = hello(SERVER_HELLO, &ext(0xff01, &[0]), 5);
    let kx = rec(HANDSHAKE, 16);
    let ccs = rec(CHANGE_CIPHER_SPEC, 0);
    let app = rec(APPLICATION_DATA, 0);
    let steps = walk(&[
        (&sh, false),
        (&kx, true),
        (&ccs, false),
        (&app, false),
        (&app, true),
        (&app, false),
    ]);
    assert_eq!(
        steps,
        [
            (wire::SERVER_FLIGHT, Mark::Version(0x0303)),
            (wire::TLS12_CLIENT_FLIGHT, Mark::Nothing),
            (wire::TLS12_OPEN, Mark::Finished12),
            (wire::TLS12_OPEN, Mark::Nothing),
            (wire::TLS12_REQUEST, Mark::Request),
            (wire::DONE, Mark::Answer),
        ]
    );
}

#[test]
fn a_segment_too_short_for_its_head_changes_nothing() {
    assert_eq!(
        advance(&[HANDSHAKE, 3, 3][..], 0, 3, wire::HELLO, false),
        None
    );
    assert!(!is_client_hello(&[HANDSHAKE, 3, 1, 0, 9][..], 0));
    assert_eq!([1u8, 2][..].load::<2>(usize::MAX), None);
}
