//! A body read as the calls copied it: HTTP/1.1's chunked framing taken
//! off, then server-sent events (their `data:` lines) or a stream of JSON
//! values (one document, newline-delimited JSON, a JSON array of events)
//! handed to the JSON tokenizer, event by event.
//!
//! Bytes the probes did not copy (the middle of a long call) are a gap:
//! the reader skips to where the next event starts (a blank line, a new
//! line) or to a `"usage"` object, which servers put at an answer's end.

use super::json::{Scalar, Tokenizer, Visit};

/// What a body tells, event by event.
pub trait Events {
    /// A scalar of the event being read.
    fn value(&mut self, path: &str, v: Scalar<'_>);
    /// The event was delivered whole at `t` (what a client can act on).
    fn event(&mut self, t: u64);
}

/// Keys whose object a reader that lost its place may start at.
const ANCHORS: [&str; 2] = ["usageMetadata", "usage"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk's size line (`size` so far, then its extensions).
    Size {
        size: u64,
        ext: bool,
    },
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: trailers, then the end.
    Trailer,
    /// Framing lost in a gap: bytes pass as they are.
    Lost,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// At a line's start, the field name read so far (`len` bytes).
    Field {
        len: u8,
    },
    /// After `data:` (an optional space may follow).
    DataStart,
    Data,
    /// Any other field's value, or a line of the chunked framing.
    Skip,
}

#[derive(Clone, Debug)]
pub struct Body {
    sse: bool,
    chunk: Option<Chunk>,
    line: Line,
    field: [u8; 8],
    /// SSE: data lines in the event being read; their first bytes.
    data_lines: u32,
    data_head: [u8; 6],
    data_head_len: usize,
    json: Tokenizer,
    /// Bytes were lost: skipping to the next event (or an anchor).
    lost: bool,
    /// JSON stream: input was not JSON: skipping to the next line.
    skip_line: bool,
    /// Reading from an anchor: the document's own end will not parse.
    fragment: bool,
    /// Events whose JSON could not be read (not counting `[DONE]`).
    pub unreadable: u32,
    /// Events delivered.
    pub events: u32,
}

/// Hands the tokenizer's findings on, with the read's time.
struct Adapter<'a, E> {
    out: &'a mut E,
    t: u64,
    /// SSE: an event ends at its blank line, not at its JSON's end.
    sse: bool,
    ended: bool,
}

impl<E: Events> Visit for Adapter<'_, E> {
    fn value(&mut self, path: &str, v: Scalar<'_>) {
        self.out.value(path, v);
    }
    fn event_end(&mut self) {
        self.ended = true;
        if !self.sse {
            self.out.event(self.t);
        }
    }
}

impl Body {
    /// `sse`: a `text/event-stream` answer; `chunked`: HTTP/1.1 chunked.
    pub fn new(sse: bool, chunked: bool) -> Self {
        Self {
            sse,
            chunk: chunked.then_some(Chunk::Size {
                size: 0,
                ext: false,
            }),
            line: Line::Field { len: 0 },
            field: [0; 8],
            data_lines: 0,
            data_head: [0; 6],
            data_head_len: 0,
            json: Tokenizer::default(),
            lost: false,
            skip_line: false,
            fragment: false,
            unreadable: 0,
            events: 0,
        }
    }

    /// Bytes of the body as they came, read at `t`.
    pub fn feed(&mut self, mut bytes: &[u8], t: u64, out: &mut impl Events) {
        while !bytes.is_empty() {
            let Some(state) = self.chunk else {
                self.content(bytes, t, out);
                return;
            };
            let (used, data) = self.dechunk(state, bytes);
            if let Some(d) = data {
                self.content(d, t, out);
            }
            bytes = &bytes[used..];
        }
    }

    /// Bytes between the last ones fed and the next were not copied.
    pub fn gap(&mut self) {
        self.lost = true;
        if matches!(self.chunk, Some(c) if c != Chunk::Trailer) {
            self.chunk = Some(Chunk::Lost);
        }
        self.json.reset();
        self.line = Line::Skip;
        self.data_lines = 0;
    }

    /// The body ended: a value still open is an event unread.
    pub fn finish(&mut self, t: u64, out: &mut impl Events) {
        let mut a = Adapter {
            out,
            t,
            sse: false,
            ended: false,
        };
        self.json.finish(&mut a);
        if !self.sse && !self.json.idle() && !self.lost {
            self.unreadable += 1;
        }
        if self.sse && self.data_lines > 0 {
            self.dispatch(t, out);
        }
    }

    /// One step of the chunked framing: bytes used, and body bytes among them.
    fn dechunk<'b>(&mut self, state: Chunk, b: &'b [u8]) -> (usize, Option<&'b [u8]>) {
        let c = b[0];
        let next = match state {
            Chunk::Lost => return (b.len(), Some(b)),
            Chunk::Data(n) => {
                let take = usize::try_from(n).unwrap_or(usize::MAX).min(b.len());
                let left = n - take as u64;
                self.chunk = Some(if left == 0 {
                    Chunk::DataCr
                } else {
                    Chunk::Data(left)
                });
                return (take, Some(&b[..take]));
            }
            Chunk::Size { size, ext } => match (c as char).to_digit(16) {
                Some(d) if !ext => Chunk::Size {
                    size: size.saturating_mul(16).saturating_add(u64::from(d)),
                    ext,
                },
                _ if c == b'\r' => Chunk::SizeLf { size },
                _ if c == b'\n' => Self::after_size(size),
                _ => Chunk::Size { size, ext: true },
            },
            Chunk::SizeLf { size } if c == b'\n' => Self::after_size(size),
            Chunk::DataCr if c == b'\r' => Chunk::DataLf,
            Chunk::DataLf | Chunk::DataCr if c == b'\n' => Chunk::Size {
                size: 0,
                ext: false,
            },
            Chunk::Trailer => Chunk::Trailer,
            _ => Chunk::Lost,
        };
        self.chunk = Some(next);
        (1, None)
    }

    fn after_size(size: u64) -> Chunk {
        if size == 0 {
            Chunk::Trailer
        } else {
            Chunk::Data(size)
        }
    }

    fn content(&mut self, b: &[u8], t: u64, out: &mut impl Events) {
        if self.sse {
            self.sse_bytes(b, t, out);
        } else {
            self.json_bytes(b, t, out);
        }
    }

    /// After a gap: starts at a usage object in `b` if there is one.
    /// Returns the bytes from where reading goes on.
    fn anchor<'b>(&mut self, b: &'b [u8]) -> Option<&'b [u8]> {
        for key in ANCHORS {
            let quoted = format!("\"{key}\"");
            let Some(at) = memchr::memmem::find(b, quoted.as_bytes()) else {
                continue;
            };
            let rest = &b[at + quoted.len()..];
            let rest = trim_start(rest).strip_prefix(b":")?;
            let rest = trim_start(rest);
            if rest.first() == Some(&b'{') {
                self.json.start_at(key);
                self.lost = false;
                self.fragment = true;
                return Some(rest);
            }
        }
        None
    }

    fn json_bytes(&mut self, mut b: &[u8], t: u64, out: &mut impl Events) {
        if self.lost {
            if let Some(rest) = self.anchor(b) {
                b = rest;
            } else {
                self.skip_line = true;
                self.lost = false;
            }
        }
        while !b.is_empty() {
            if self.skip_line {
                let Some(nl) = memchr::memchr(b'\n', b) else {
                    return;
                };
                self.skip_line = false;
                self.json.reset();
                b = &b[nl + 1..];
                continue;
            }
            let mut a = Adapter {
                out: &mut *out,
                t,
                sse: false,
                ended: false,
            };
            // Up to the next line's end, so a broken value costs one line.
            let end = memchr::memchr(b'\n', b).map_or(b.len(), |i| i + 1);
            self.json.feed(&b[..end], &mut a);
            if a.ended {
                self.events += 1;
            }
            if self.json.broken() {
                if !std::mem::take(&mut self.fragment) {
                    self.unreadable += 1;
                }
                // The rest of its line is skipped (none when it ended here).
                self.skip_line = b[end - 1] != b'\n';
                self.json.reset();
            }
            b = &b[end..];
        }
    }

    fn sse_bytes(&mut self, b: &[u8], t: u64, out: &mut impl Events) {
        let mut b = b;
        if self.lost {
            // Wait for a blank line; a usage object may come before it.
            if let Some(rest) = self.anchor(b) {
                self.line = Line::Data;
                self.data_lines = 1;
                b = rest;
            }
        }
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == b'\r' {
                i += 1;
                continue;
            }
            match self.line {
                Line::Data => {
                    // The data line's bytes up to its end, at once.
                    let end = memchr::memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
                    self.data_bytes(&b[i..end], t, out);
                    i = end;
                    if end < b.len() {
                        self.line = Line::Field { len: 0 };
                        i += 1;
                    }
                    continue;
                }
                Line::DataStart if c == b' ' => self.line = Line::Data,
                Line::DataStart if c == b'\n' => self.line = Line::Field { len: 0 },
                Line::DataStart => {
                    self.line = Line::Data;
                    continue;
                }
                Line::Skip if c == b'\n' => self.line = Line::Field { len: 0 },
                Line::Skip => {}
                Line::Field { len: 0 } if c == b'\n' => {
                    if self.lost {
                        self.lost = false;
                        self.json.reset();
                        self.data_lines = 0;
                    } else if self.data_lines > 0 {
                        self.dispatch(t, out);
                    }
                }
                Line::Field { len } if c == b':' => {
                    // A name longer than the buffer counts as 9: not "data".
                    let name = self.field.get(..usize::from(len));
                    self.line = if name == Some(b"data".as_slice()) && !self.lost {
                        self.start_data_line(t, out);
                        Line::DataStart
                    } else {
                        Line::Skip
                    };
                }
                Line::Field { .. } if c == b'\n' => self.line = Line::Field { len: 0 },
                Line::Field { len } => {
                    if usize::from(len) < self.field.len() {
                        self.field[usize::from(len)] = c;
                    }
                    self.line = Line::Field {
                        len: len.saturating_add(1).min(9),
                    };
                }
            }
            i += 1;
        }
    }

    fn start_data_line(&mut self, t: u64, out: &mut impl Events) {
        if self.data_lines > 0 {
            // Lines of one event's data are joined by a newline.
            self.data_bytes(b"\n", t, out);
        }
        self.data_lines += 1;
    }

    fn data_bytes(&mut self, b: &[u8], t: u64, out: &mut impl Events) {
        let room = self.data_head.len() - self.data_head_len;
        let n = room.min(b.len());
        self.data_head[self.data_head_len..self.data_head_len + n].copy_from_slice(&b[..n]);
        self.data_head_len += n;
        let mut a = Adapter {
            out,
            t,
            sse: true,
            ended: false,
        };
        self.json.feed(b, &mut a);
    }

    /// An event's blank line: it is delivered.
    fn dispatch(&mut self, t: u64, out: &mut impl Events) {
        let done = &self.data_head[..self.data_head_len] == b"[DONE]";
        let mut a = Adapter {
            out: &mut *out,
            t,
            sse: true,
            ended: false,
        };
        self.json.finish(&mut a);
        let fragment = std::mem::take(&mut self.fragment);
        if !done && !fragment && (self.json.broken() || !self.json.idle()) {
            self.unreadable += 1;
        }
        self.events += 1;
        out.event(t);
        self.json.reset();
        self.data_lines = 0;
        self.data_head_len = 0;
    }

    /// The chunked framing's last chunk came.
    #[cfg(test)]
    pub fn ended(&self) -> bool {
        self.chunk == Some(Chunk::Trailer)
    }
}

fn trim_start(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default, Debug, PartialEq)]
    struct Seen {
        values: Vec<String>,
        events: Vec<u64>,
    }

    impl Events for Seen {
        fn value(&mut self, path: &str, v: Scalar<'_>) {
            if let Scalar::Str { text, .. } = v {
                self.values.push(format!("{path}={text}"));
            } else if let Scalar::Int(n) = v {
                self.values.push(format!("{path}={n}"));
            }
        }
        fn event(&mut self, t: u64) {
            self.events.push(t);
        }
    }

    fn chunked(parts: &[&str]) -> String {
        let mut s: String = parts
            .iter()
            .map(|p| format!("{:x}\r\n{p}\r\n", p.len()))
            .collect();
        s.push_str("0\r\n\r\n");
        s
    }

    const EVENTS: [&str; 3] = [
        "data: {\"choices\": [{\"delta\": {\"content\": \"Hi\"}}]}\n\n",
        "event: x\r\ndata: {\"usage\":\r\ndata:  {\"prompt_tokens\": 3}}\r\n\r\n",
        "data: [DONE]\n\n",
    ];

    fn want() -> Vec<String> {
        vec![
            "choices.*.delta.content=Hi".into(),
            "usage.prompt_tokens=3".into(),
        ]
    }

    #[test]
    fn server_sent_events_in_chunks_split_at_every_offset() {
        let body = chunked(&EVENTS);
        let b = body.as_bytes();
        for i in 0..=b.len() {
            let mut body = Body::new(true, true);
            let mut seen = Seen::default();
            body.feed(&b[..i], 1, &mut seen);
            body.feed(&b[i..], 2, &mut seen);
            assert_eq!(seen.values, want(), "split at {i}");
            assert_eq!(seen.events.len(), 3, "split at {i}");
            assert_eq!(body.unreadable, 0);
            assert!(body.ended());
            // An event is delivered with its blank line.
            let first_end = body_offset_of_blank(&body_bytes_first_event());
            assert_eq!(seen.events[0], if i > first_end { 1 } else { 2 }, "at {i}");
        }
    }

    fn body_bytes_first_event() -> String {
        chunked(&EVENTS)
    }

    /// Offset of the first event's blank line's last byte in the body.
    fn body_offset_of_blank(body: &str) -> usize {
        body.find("\n\n").expect("present") + 1
    }

    /// Field names longer than the buffer kept for "data" (found by the
    /// http fuzz target: it panicked on `retry_after_ms:`), then the events
    /// after them, still read.
    #[test]
    fn long_field_names_are_skipped_and_the_events_after_them_read() {
        let text = format!(
            "retry_after_ms: 30\nid_of_the_event_here: 7\n{}",
            EVENTS.concat()
        );
        let mut b = Body::new(true, false);
        let mut seen = Seen::default();
        b.feed(text.as_bytes(), 1, &mut seen);
        assert_eq!(seen.values, want());
        assert_eq!(seen.events.len(), 3);
    }

    #[test]
    fn one_byte_per_chunk() {
        let text: String = EVENTS.concat();
        let one: Vec<String> = text.chars().map(String::from).collect();
        let one: Vec<&str> = one.iter().map(String::as_str).collect();
        let body = chunked(&one);
        let mut b = Body::new(true, true);
        let mut seen = Seen::default();
        for (k, c) in body.as_bytes().chunks(1).enumerate() {
            b.feed(c, k as u64, &mut seen);
        }
        assert_eq!(seen.values, want());
        assert_eq!(seen.events.len(), 3);
    }

    #[test]
    fn ndjson_and_a_json_array_and_a_bad_line() {
        let mut b = Body::new(false, false);
        let mut seen = Seen::default();
        b.feed(b"{\"response\":\"a\"}\n{oops}\n{\"eval_", 5, &mut seen);
        b.feed(b"count\": 4}\n", 6, &mut seen);
        assert_eq!(seen.values, ["response=a", "eval_count=4"]);
        assert_eq!(seen.events, [5, 6]);
        assert_eq!(b.unreadable, 1);
        let mut b = Body::new(false, false);
        let mut seen = Seen::default();
        b.feed(b"[{\"a\":\"x\"},\n{\"a\":\"y\"}]", 1, &mut seen);
        assert_eq!(seen.events, [1, 1]);
    }

    #[test]
    fn after_a_gap_the_next_event_or_the_usage() {
        // SSE: the event cut by the gap is skipped, the next one is read.
        let mut b = Body::new(true, true);
        let mut seen = Seen::default();
        let body = chunked(&EVENTS);
        b.feed(&body.as_bytes()[..20], 1, &mut seen);
        b.gap();
        b.feed(b"tent\": \"Hi\"}}]}\n\n\r\n", 2, &mut seen);
        // The chunked framing is lost with the gap: its size lines are skipped.
        b.feed(
            &body.as_bytes()[body.find("event: x").expect("present") - 4..],
            3,
            &mut seen,
        );
        assert_eq!(seen.values, ["usage.prompt_tokens=3"]);
        assert_eq!(b.unreadable, 0);
        // JSON: the usage object in the tail of a long answer.
        let mut b = Body::new(false, false);
        let mut seen = Seen::default();
        b.feed(
            b"{\"choices\":[{\"message\":{\"content\":\"aaaa",
            1,
            &mut seen,
        );
        b.gap();
        b.feed(
            b"aaa\"}}], \"usage\": {\"prompt_tokens\": 9}}",
            2,
            &mut seen,
        );
        assert_eq!(seen.values, ["usage.prompt_tokens=9"]);
        assert_eq!(seen.events, [2]);
        assert_eq!(b.unreadable, 0);
    }
}
