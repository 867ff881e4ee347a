//! DNS messages as they cross the wire (RFC 1035): the header, the first
//! question and the addresses of the answer. Bounded and panic-free on any
//! input: the bytes come from any program's packets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a message says that a lookup record needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: u16,
    /// QR: a response (else a query).
    pub response: bool,
    /// TC: cut short; the client asks again over TCP.
    pub truncated: bool,
    pub rcode: u8,
    /// Resource records in the answer section (of any type).
    pub answer_count: u16,
    pub question: Option<Question>,
    /// A and AAAA records of the answer section that fit in the bytes seen.
    pub addresses: Vec<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// Dotted, without the root's trailing dot.
    pub name: String,
    pub qtype: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("shorter than a DNS header")]
    Short,
    #[error("malformed name")]
    BadName,
}

const HEADER: usize = 12;
/// Compression pointers followed per name: a loop in a hostile message ends here.
const MAX_JUMPS: usize = 16;
/// RFC 1035's limit on a name's wire length.
const MAX_NAME: usize = 255;
/// Answer records walked (a message cut at 512 bytes holds far fewer).
const MAX_ANSWERS: usize = 64;
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Reads the name at `at`; returns it and the offset just past it (past the
/// first compression pointer when there is one).
fn name_at(b: &[u8], mut at: usize) -> Result<(String, usize), ParseError> {
    let mut name = String::new();
    let mut end = None;
    let mut jumps = 0;
    let mut wire_len = 0;
    loop {
        let len = *b.get(at).ok_or(ParseError::BadName)? as usize;
        match len & 0xc0 {
            0x00 if len == 0 => {
                return Ok((name, end.unwrap_or(at + 1)));
            }
            0x00 => {
                let label = b.get(at + 1..at + 1 + len).ok_or(ParseError::BadName)?;
                wire_len += len + 1;
                if wire_len > MAX_NAME {
                    return Err(ParseError::BadName);
                }
                if !name.is_empty() {
                    name.push('.');
                }
                for &c in label {
                    // Names are bytes; show anything odd escaped, as dig does.
                    if c.is_ascii_graphic() && c != b'.' && c != b'\\' {
                        name.push(char::from(c));
                    } else {
                        name.push_str(&format!("\\{c:03}"));
                    }
                }
                at += 1 + len;
            }
            0xc0 => {
                let ptr = (u16_at(b, at).ok_or(ParseError::BadName)? & 0x3fff) as usize;
                jumps += 1;
                if jumps > MAX_JUMPS {
                    return Err(ParseError::BadName);
                }
                end.get_or_insert(at + 2);
                at = ptr;
            }
            _ => return Err(ParseError::BadName),
        }
    }
}

/// Parses what it can of `b`. Only a missing header or a malformed question
/// is an error: a message cut short loses the answers that did not fit.
pub fn parse(b: &[u8]) -> Result<Message, ParseError> {
    if b.len() < HEADER {
        return Err(ParseError::Short);
    }
    let flags = u16_at(b, 2).ok_or(ParseError::Short)?;
    let qdcount = u16_at(b, 4).ok_or(ParseError::Short)?;
    let ancount = u16_at(b, 6).ok_or(ParseError::Short)?;
    let mut msg = Message {
        id: u16_at(b, 0).ok_or(ParseError::Short)?,
        response: flags & 0x8000 != 0,
        truncated: flags & 0x0200 != 0,
        rcode: (flags & 0x000f) as u8,
        answer_count: ancount,
        question: None,
        addresses: Vec::new(),
    };
    let mut at = HEADER;
    for i in 0..qdcount {
        let (name, next) = name_at(b, at)?;
        let qtype = u16_at(b, next).ok_or(ParseError::BadName)?;
        at = next + 4;
        if i == 0 {
            msg.question = Some(Question { name, qtype });
        }
    }
    for _ in 0..usize::from(ancount).min(MAX_ANSWERS) {
        let Ok((_, next)) = name_at(b, at) else { break };
        let (Some(rtype), Some(rdlen)) = (u16_at(b, next), u16_at(b, next + 8)) else {
            break;
        };
        let rdata = next + 10;
        let Some(data) = b.get(rdata..rdata + usize::from(rdlen)) else {
            break;
        };
        match (rtype, data.len()) {
            (TYPE_A, 4) => msg.addresses.push(IpAddr::V4(Ipv4Addr::new(
                data[0], data[1], data[2], data[3],
            ))),
            (TYPE_AAAA, 16) => {
                let mut a = [0u8; 16];
                a.copy_from_slice(data);
                msg.addresses.push(IpAddr::V6(Ipv6Addr::from(a)));
            }
            _ => {}
        }
        at = rdata + usize::from(rdlen);
    }
    Ok(msg)
}

/// A query type's mnemonic (RFC 3597's TYPEn for the rest).
pub fn qtype_name(t: u16) -> std::borrow::Cow<'static, str> {
    let s = match t {
        1 => "A",
        2 => "NS",
        5 => "CNAME",
        6 => "SOA",
        12 => "PTR",
        15 => "MX",
        16 => "TXT",
        28 => "AAAA",
        33 => "SRV",
        64 => "SVCB",
        65 => "HTTPS",
        255 => "ANY",
        n => return format!("TYPE{n}").into(),
    };
    s.into()
}

/// A response code's mnemonic.
pub fn rcode_name(r: u8) -> std::borrow::Cow<'static, str> {
    let s = match r {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        n => return format!("RCODE{n}").into(),
    };
    s.into()
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
pub(crate) mod tests {
    use super::*;

    /// A query for `name` of type `qtype` with id `id`.
    pub(crate) fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut b = vec![0u8; 12];
        b[0..2].copy_from_slice(&id.to_be_bytes());
        b[2] = 0x01; // RD
        b[5] = 1; // QDCOUNT
        for label in name.split('.') {
            b.push(label.len() as u8);
            b.extend_from_slice(label.as_bytes());
        }
        b.push(0);
        b.extend_from_slice(&qtype.to_be_bytes());
        b.extend_from_slice(&1u16.to_be_bytes());
        b
    }

    /// The response to `q` with `rcode` and A records (compressed names).
    pub(crate) fn response(q: &[u8], rcode: u8, addrs: &[[u8; 4]]) -> Vec<u8> {
        let mut b = q.to_vec();
        b[2] = 0x81;
        b[3] = 0x80 | rcode;
        b[7] = addrs.len() as u8;
        for a in addrs {
            b.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            b.extend_from_slice(a);
        }
        b
    }

    #[test]
    fn query_and_response() {
        let q = query(0x1234, "api.example.test", 28);
        let m = parse(&q).expect("query");
        assert_eq!(m.id, 0x1234);
        assert!(!m.response);
        let question = m.question.expect("question");
        assert_eq!(question.name, "api.example.test");
        assert_eq!(qtype_name(question.qtype), "AAAA");

        let r = response(&q, 0, &[[10, 0, 0, 1], [10, 0, 0, 2]]);
        let m = parse(&r).expect("response");
        assert!(m.response);
        assert_eq!(m.rcode, 0);
        assert_eq!(m.answer_count, 2);
        let want: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        assert_eq!(m.addresses, want);
        assert_eq!(
            rcode_name(parse(&response(&q, 3, &[])).unwrap().rcode),
            "NXDOMAIN"
        );
    }

    #[test]
    fn cut_short_keeps_what_fits() {
        let q = query(7, "a.test", 1);
        let r = response(&q, 0, &[[1, 1, 1, 1], [2, 2, 2, 2]]);
        let m = parse(&r[..r.len() - 2]).expect("cut");
        assert_eq!(m.addresses, vec![IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1))]);
        assert_eq!(m.answer_count, 2);
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        assert_eq!(parse(&[0; 5]), Err(ParseError::Short));
        // A name pointing at itself.
        let mut b = vec![0u8; 12];
        b[5] = 1;
        b.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(parse(&b), Err(ParseError::BadName));
        // A label running past the end.
        let mut b = vec![0u8; 12];
        b[5] = 1;
        b.extend_from_slice(&[40, b'a']);
        assert_eq!(parse(&b), Err(ParseError::BadName));
        // Every short prefix of a real response parses or fails cleanly.
        let r = response(&query(1, "x.y.z", 1), 0, &[[1, 2, 3, 4]]);
        for n in 0..r.len() {
            let _ = parse(&r[..n]);
        }
        // Odd bytes in a label are escaped.
        let m = parse(&query(1, "a b", 1)).expect("odd");
        assert_eq!(m.question.expect("q").name, "a\\032b");
    }
}
