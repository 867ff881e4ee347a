//! Request and response heads of HTTP/1.x.

use std::borrow::Cow;

use super::scan::find;

/// How a message's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// At the connection's close (or unknown: the head was not all seen).
    Close,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Request: method; response: the status code.
    pub method: Option<String>,
    pub status: Option<u16>,
    /// Request target without its query.
    pub path: Option<String>,
    pub query: Option<String>,
    pub host: Option<String>,
    pub content_type: Option<String>,
    pub framing: Framing,
    /// Bytes of the head, blank line included (None: its end was not seen).
    pub len: Option<usize>,
}

const METHODS: [&str; 9] = [
    "GET", "POST", "PUT", "HEAD", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

/// Whether `b` could be the first bytes of a request read alone: a method
/// cut short, a method and its space (Go's net/http server reads one byte
/// of the next request while it answers the last, to see a close), or a
/// request line cut short (hyper's server reads 24 bytes first, to tell an
/// HTTP/2 preface).
pub fn could_begin_request(b: &[u8]) -> bool {
    /// Longer than any request line we follow: the rest is not HTTP.
    const MAX_LINE: usize = 8192;
    !b.is_empty()
        && b.len() <= MAX_LINE
        && METHODS.iter().any(|m| {
            let m = m.as_bytes();
            if b.len() <= m.len() {
                m.starts_with(b)
            } else {
                b.starts_with(m) && b[m.len()] == b' ' && !b.contains(&b'\n')
            }
        })
}

/// A request head at the start of `b`.
pub fn request(b: &[u8]) -> Option<Head> {
    let (text, len) = head_text(b);
    let (first, headers) = text.split_once("\r\n").unwrap_or((&text, ""));
    let mut parts = first.split(' ');
    let method = parts.next()?;
    if !METHODS.contains(&method) {
        return None;
    }
    let target = parts.next()?;
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (target, None),
    };
    let mut h = fields(headers, len);
    h.method = Some(method.to_owned());
    h.path = Some(path.to_owned());
    h.query = query;
    if h.framing == Framing::Close && h.len.is_some() {
        // A request without a length has no body.
        h.framing = Framing::Length(0);
    }
    Some(h)
}

/// A response head at the start of `b`.
pub fn response(b: &[u8]) -> Option<Head> {
    let (text, len) = head_text(b);
    let (first, headers) = text.split_once("\r\n").unwrap_or((&text, ""));
    let mut parts = first.split(' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status: u16 = parts.next()?.parse().ok()?;
    let mut h = fields(headers, len);
    h.status = Some(status);
    if status == 204 || status == 304 || (100..200).contains(&status) {
        h.framing = Framing::Length(0);
    }
    Some(h)
}

/// The head's text (borrowed unless it needed repair), and its length if
/// its end is in `b`.
fn head_text(b: &[u8]) -> (Cow<'_, str>, Option<usize>) {
    let (head, len) = match find(b, b"\r\n\r\n") {
        Some(i) => (&b[..i], Some(i + 4)),
        None => (b, None),
    };
    (String::from_utf8_lossy(head), len)
}

impl Head {
    /// No field known yet.
    pub fn empty(len: Option<usize>) -> Head {
        Head {
            method: None,
            status: None,
            path: None,
            query: None,
            host: None,
            content_type: None,
            framing: Framing::Close,
            len,
        }
    }
}

fn fields(headers: &str, len: Option<usize>) -> Head {
    let mut h = Head::empty(len);
    for line in headers.split("\r\n") {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        // Compared in place: a lowercased copy of every field name was a
        // large part of reading a head.
        let k = k.trim();
        if k.eq_ignore_ascii_case("host") {
            h.host = Some(v.to_owned());
        } else if k.eq_ignore_ascii_case("content-type") {
            h.content_type = Some(v.split(';').next().unwrap_or(v).trim().to_owned());
        } else if k.eq_ignore_ascii_case("content-length") && h.framing != Framing::Chunked {
            if let Ok(n) = v.parse() {
                h.framing = Framing::Length(n);
            }
        } else if k.eq_ignore_ascii_case("transfer-encoding")
            && v.to_ascii_lowercase().contains("chunked")
        {
            h.framing = Framing::Chunked;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_head() {
        let h = request(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: api:8443\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n{\"model\"").expect("present");
        assert_eq!(h.method.as_deref(), Some("POST"));
        assert_eq!(h.path.as_deref(), Some("/v1/chat/completions"));
        assert_eq!(h.query.as_deref(), Some("x=1"));
        assert_eq!(h.host.as_deref(), Some("api:8443"));
        assert_eq!(h.framing, Framing::Length(42));
        assert_eq!(h.len, Some(110));
        let g = request(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("present");
        assert_eq!(g.framing, Framing::Length(0));
        assert!(request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").is_none());
        assert!(request(b"HELLO there").is_none());
    }

    #[test]
    fn response_head() {
        let h = response(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n").expect("present");
        assert_eq!(h.status, Some(200));
        assert_eq!(h.content_type.as_deref(), Some("text/event-stream"));
        assert_eq!(h.framing, Framing::Chunked);
        let n = response(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
            .expect("present");
        assert_eq!((n.status, n.framing), (Some(500), Framing::Length(0)));
        // The head's end not seen: its length is unknown.
        let cut = response(b"HTTP/1.1 200 OK\r\nServer: x").expect("present");
        assert_eq!((cut.len, cut.framing), (None, Framing::Close));
    }

    #[test]
    fn the_first_bytes_of_a_request() {
        for b in [
            &b"G"[..],
            b"GE",
            b"GET",
            b"GET ",
            b"OPT",
            b"OPTIONS ",
            b"GET /",
            b"POST /v1/chat/completion",
        ] {
            assert!(could_begin_request(b), "{b:?}");
        }
        for b in [
            &b""[..],
            b"X",
            b"get",
            b"GETX",
            b"HTTP/1.1",
            b"GET / HTTP/1.1\r\nHost: x",
        ] {
            assert!(!could_begin_request(b), "{b:?}");
        }
    }
}
