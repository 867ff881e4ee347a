//! What a header block still tells when it cannot be decoded whole: it
//! refers to dynamic-table entries we never saw (the connection began
//! before the observer, or a block was lost). HPACK's representations are
//! self-delimiting, so the block is walked field by field: fields from the
//! static table (RFC 7541, Appendix A) and literal ones are recovered, a
//! field that names a dynamic entry is skipped and counted. Nothing is
//! guessed, and the walk never changes the decoder's table.

use loona_hpack::huffman::HuffmanDecoder;

/// RFC 7541, Appendix A: index 1 is the first.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The fields recovered from a block, and how many could not be.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Partial {
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    pub unknown: u32,
}

/// An HPACK integer with an `n`-bit prefix at `b[*at]` (RFC 7541, 5.1).
fn integer(b: &[u8], at: &mut usize, n: u32) -> Option<usize> {
    let max = (1usize << n) - 1;
    let mut v = usize::from(*b.get(*at)?) & max;
    *at += 1;
    if v < max {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let byte = *b.get(*at)?;
        *at += 1;
        // Four continuation bytes reach 2^28: more is not a header block.
        if shift > 21 {
            return None;
        }
        v += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
}

/// A string literal (RFC 7541, 5.2), Huffman-coded or not.
fn string(b: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let huffman = b.get(*at)? & 0x80 != 0;
    let len = integer(b, at, 7)?;
    let raw = b.get(*at..at.checked_add(len)?)?;
    *at += len;
    if huffman {
        HuffmanDecoder::new().decode(raw).ok()
    } else {
        Some(raw.to_vec())
    }
}

fn static_entry(index: usize) -> Option<(&'static str, &'static str)> {
    index.checked_sub(1).and_then(|i| STATIC.get(i)).copied()
}

/// Walks `block`; None when it is not a well-formed header block.
pub fn walk(block: &[u8]) -> Option<Partial> {
    let mut p = Partial::default();
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        if first & 0x80 != 0 {
            // Indexed field.
            let index = integer(block, &mut at, 7)?;
            match static_entry(index) {
                Some((n, v)) => p.fields.push((n.into(), v.into())),
                None if index > STATIC.len() => p.unknown += 1,
                None => return None,
            }
            continue;
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            integer(block, &mut at, 5)?;
            continue;
        }
        // A literal: with incremental indexing (6-bit name index), without
        // indexing or never indexed (4-bit).
        let prefix = if first & 0x40 != 0 { 6 } else { 4 };
        let index = integer(block, &mut at, prefix)?;
        let name = if index == 0 {
            Some(string(block, &mut at)?)
        } else {
            static_entry(index).map(|(n, _)| n.as_bytes().to_vec())
        };
        let value = string(block, &mut at)?;
        match name {
            Some(name) => p.fields.push((name, value)),
            None => p.unknown += 1,
        }
    }
    Some(p)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use loona_hpack::{Decoder, Encoder};

    use super::*;

    fn field(p: &Partial, name: &str) -> Option<String> {
        p.fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
    }

    /// A second request of a connection whose first block we never saw: a
    /// fresh decoder fails on it; the walk recovers the method (static),
    /// path and authority (literals, their names static), and counts the
    /// field it names from the dynamic table.
    #[test]
    fn a_block_that_names_entries_we_never_saw() {
        let mut enc = Encoder::new();
        let first: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", b"/v1/chat/completions"),
            (b":authority", b"api.example"),
            (b"user-agent", b"sdk/1.0"),
            (b"x-custom", b"abc"),
        ];
        let _ = enc.encode(first);
        let second: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", b"/v1/embeddings"),
            (b":authority", b"api.example"),
            (b"user-agent", b"sdk/1.0"),
            (b"x-custom", b"abc"),
        ];
        let block = enc.encode(second);
        assert!(
            Decoder::new().decode(&block).is_err(),
            "a fresh decoder fails"
        );
        let p = walk(&block).unwrap();
        assert_eq!(field(&p, ":method").as_deref(), Some("POST"));
        assert_eq!(field(&p, ":scheme").as_deref(), Some("https"));
        assert_eq!(field(&p, ":path").as_deref(), Some("/v1/embeddings"));
        assert_eq!(field(&p, ":authority").as_deref(), Some("api.example"));
        // loona's encoder indexes the field whose name is not in the static
        // table: the second block names it by its dynamic index.
        assert_eq!(field(&p, "x-custom"), None);
        assert_eq!(p.unknown, 1, "{p:?}");
    }

    /// A table size update, an indexed static field, an unknown dynamic
    /// one, literals never indexed and without indexing, and a
    /// Huffman-coded value (RFC 7541, C.4.1: "www.example.com").
    #[test]
    fn every_representation() {
        let mut block = vec![0x3f, 0xe1, 0x1f]; // size update to 4096
        block.push(0x82); // :method GET
        block.push(0xbe); // index 62: dynamic, unknown
        block.extend_from_slice(&[0x14, 0x03]); // never indexed, :path
        block.extend_from_slice(b"/ok");
        block.extend_from_slice(&[0x00, 0x01, b'x', 0x01, b'y']); // without indexing
        block.extend_from_slice(&[0x41, 0x8c]); // incremental, :authority, Huffman 12
        block.extend_from_slice(&[
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ]);
        block.extend_from_slice(&[0x7f, 0x00, 0x01, b'z']); // index 63: unknown name
        let p = walk(&block).unwrap();
        assert_eq!(field(&p, ":method").as_deref(), Some("GET"));
        assert_eq!(field(&p, ":path").as_deref(), Some("/ok"));
        assert_eq!(field(&p, "x").as_deref(), Some("y"));
        assert_eq!(field(&p, ":authority").as_deref(), Some("www.example.com"));
        assert_eq!(p.unknown, 2);
        // Cut anywhere inside a field: refused, not misread.
        assert_eq!(walk(&block[..block.len() - 1]), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u32 = 12345;
        for len in 0..200 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            let _ = walk(&b);
        }
    }
}
