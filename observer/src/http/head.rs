//! Request and response heads of HTTP/1.x.

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
    /// The caller's trace context (W3C `traceparent`), when valid.
    pub traceparent: Option<super::trace_context::TraceParent>,
    /// Its `tracestate`, as sent.
    pub tracestate: Option<String>,
    /// `X-Request-Id` (at most 128 bytes), which proxy legs may be matched by.
    pub request_id: Option<String>,
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
    let (first, headers, len) = head_parts(b);
    let mut parts = first.split(|&c| c == b' ');
    let method = parts.next()?;
    let method = *METHODS.iter().find(|m| m.as_bytes() == method)?;
    let target = parts.next()?;
    if !parts.next()?.starts_with(b"HTTP/1.") {
        return None;
    }
    let (path, query) = match target.iter().position(|&c| c == b'?') {
        Some(i) => (&target[..i], Some(text(&target[i + 1..]))),
        None => (target, None),
    };
    let mut h = fields(headers, len);
    h.method = Some(method.to_owned());
    h.path = Some(text(path));
    h.query = query;
    if h.framing == Framing::Close && h.len.is_some() {
        // A request without a length has no body.
        h.framing = Framing::Length(0);
    }
    Some(h)
}

/// A response head at the start of `b`.
pub fn response(b: &[u8]) -> Option<Head> {
    let (first, headers, len) = head_parts(b);
    let mut parts = first.split(|&c| c == b' ');
    if !parts.next()?.starts_with(b"HTTP/1.") {
        return None;
    }
    let status: u16 = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let mut h = fields(headers, len);
    h.status = Some(status);
    if status == 204 || status == 304 || (100..200).contains(&status) {
        h.framing = Framing::Length(0);
    }
    Some(h)
}

/// The head's first line, its header lines, and its length if its end is
/// in `b`. Read as bytes: only the values kept become text (a head is
/// mostly fields nobody reads, and checking it all for UTF-8 and
/// splitting it as text was most of reading one).
fn head_parts(b: &[u8]) -> (&[u8], &[u8], Option<usize>) {
    let (head, len) = match blank_line(b) {
        Some(i) => (&b[..i], Some(i + 4)),
        None => (b, None),
    };
    match crlf(head) {
        Some(i) => (&head[..i], &head[i + 2..], len),
        None => (head, &[], len),
    }
}

/// Where the first CRLF CRLF in `b` starts: a head is short, and walking
/// its line feeds costs less than setting up a substring search.
fn blank_line(b: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', b)
        .find(|&i| i >= 3 && &b[i - 3..=i] == b"\r\n\r\n")
        .map(|i| i - 3)
}

/// Where the first CRLF in `b` starts (a bare LF does not end a line).
fn crlf(b: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', b)
        .find(|&i| i > 0 && b[i - 1] == b'\r')
        .map(|i| i - 1)
}

/// Bytes as text; invalid UTF-8 is replaced (U+FFFD).
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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
            traceparent: None,
            tracestate: None,
            request_id: None,
            framing: Framing::Close,
            len,
        }
    }
}

fn fields(mut headers: &[u8], len: Option<usize>) -> Head {
    let mut h = Head::empty(len);
    while !headers.is_empty() {
        let line = match crlf(headers) {
            Some(i) => {
                let line = &headers[..i];
                headers = &headers[i + 2..];
                line
            }
            None => std::mem::take(&mut headers),
        };
        // Only seven names are read, and no other starts as they do: most
        // lines (Server, Date, ETag, ...) are passed over at their first byte.
        let first = line.trim_ascii_start().first();
        if !matches!(first.map(|b| b | 0x20), Some(b'h' | b'c' | b't' | b'x')) {
            continue;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            continue;
        };
        let v = line[colon + 1..].trim_ascii();
        // Compared in place: a lowercased copy of every field name was a
        // large part of reading a head.
        let k = line[..colon].trim_ascii();
        if k.eq_ignore_ascii_case(b"host") {
            h.host = Some(text(v));
        } else if k.eq_ignore_ascii_case(b"content-type") {
            let media = v.split(|&c| c == b';').next().unwrap_or(v);
            h.content_type = Some(text(media.trim_ascii()));
        } else if k.eq_ignore_ascii_case(b"traceparent") {
            h.traceparent = super::trace_context::TraceParent::parse(v);
        } else if k.eq_ignore_ascii_case(b"x-request-id") {
            h.request_id = (v.len() <= 128).then(|| text(v));
        } else if k.eq_ignore_ascii_case(b"tracestate") {
            h.tracestate = super::trace_context::tracestate(v);
        } else if k.eq_ignore_ascii_case(b"content-length") && h.framing != Framing::Chunked {
            if let Some(n) = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok()) {
                h.framing = Framing::Length(n);
            }
        } else if k.eq_ignore_ascii_case(b"transfer-encoding")
            && v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))
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
        let t = request(b"GET / HTTP/1.1\r\nHost: x\r\nTraceParent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\ntracestate:  vendor=v1,other=x \r\n\r\n").expect("present");
        let tp = t.traceparent.expect("a valid traceparent");
        assert_eq!(
            tp.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(t.tracestate.as_deref(), Some("vendor=v1,other=x"));
        let bad = request(b"GET / HTTP/1.1\r\ntraceparent: 00-zz-00f067aa0ba902b7-01\r\n\r\n");
        assert_eq!(bad.expect("present").traceparent, None);
        let g = request(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("present");
        assert_eq!(g.framing, Framing::Length(0));
        assert!(request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").is_none());
        assert!(request(b"HELLO there").is_none());
    }

    #[test]
    fn heads_read_as_bytes() {
        // Invalid UTF-8 in a kept value is replaced; field names match in
        // any case, around spaces; a bare LF does not end a line.
        let h = request(
            b"GET /caf\xe9?q=\xff HTTP/1.1\r\nHOST : h\nX: y\r\ncontent-length:  7 \r\n\r\n",
        )
        .expect("present");
        assert_eq!(h.path.as_deref(), Some("/caf\u{fffd}"));
        assert_eq!(h.query.as_deref(), Some("q=\u{fffd}"));
        assert_eq!(h.host.as_deref(), Some("h\nX: y"));
        assert_eq!(h.framing, Framing::Length(7));
        let r = response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, CHUNKED\r\nContent-Length: 3\r\n\r\n",
        )
        .expect("present");
        assert_eq!(
            r.framing,
            Framing::Chunked,
            "a length after chunked is ignored"
        );
        assert!(response(b"HTTP/1.1 2x0 OK\r\n\r\n").is_none());
        assert!(request(b"GET / HTTP/2\r\n\r\n").is_none());
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
