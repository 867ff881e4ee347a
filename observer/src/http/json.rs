//! A streaming JSON tokenizer for the bodies and events of LLM API calls.
//!
//! Bytes come in as the calls copied them: a value may be split across
//! reads, frames or segments at any byte, so every state survives between
//! `feed`s. Memory is fixed per tokenizer: the path of the value being read
//! (`a.*.b`, `*` for an array element) in [`PATH_MAX`] bytes, and at most
//! [`TEXT_MAX`] bytes of a string value, handed to the visitor and
//! overwritten by the next one. Nothing else of the text is kept.
//!
//! Input that is not JSON puts the tokenizer in a broken state until
//! [`Tokenizer::reset`]; the caller (which knows where the next event
//! starts) counts it.

/// Bytes of the dotted path kept; a deeper path makes its values unseen.
const PATH_MAX: usize = 192;
/// Containers deep a value may be; deeper is treated as broken input.
const DEPTH_MAX: usize = 24;
/// Decoded bytes of a string value handed to the visitor.
pub const TEXT_MAX: usize = 96;

/// A value the tokenizer finished reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar<'a> {
    /// `text` is the first [`TEXT_MAX`] decoded bytes (lossy UTF-8);
    /// `len` counts every decoded byte.
    Str {
        text: &'a str,
        len: usize,
    },
    /// A non-negative integer that fits a u64.
    Int(u64),
    /// Any other number.
    Number,
    Bool(bool),
    Null,
}

/// What the tokenizer tells as it reads.
pub trait Visit {
    /// A scalar at `path` (keys joined by `.`, `*` for array elements).
    fn value(&mut self, path: &str, v: Scalar<'_>);
    /// A top-level value ended, or an element of a top-level array (a
    /// stream of JSON values or a JSON array of events: each is an event).
    fn event_end(&mut self);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value may start (top level, after `:`, after `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ArrayStart,
    /// After `{`: a key or `}`.
    ObjectStart,
    /// After `,` in an object: a key.
    Key,
    InKey,
    InKeyEscape,
    Colon,
    InString,
    InEscape,
    /// `\u` and the hex digits read so far.
    InUnicode(u8),
    InNumber,
    /// A literal (`true`, `false`, `null`) and how much of it was read.
    InLiteral(u8, u8),
    /// After a value: `,`, the container's end, or (top level) anything.
    AfterValue,
    Broken,
}

const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

#[derive(Clone, Copy, Debug, Default)]
struct Container {
    array: bool,
    /// Length of the path before this container's keys or `*`.
    base: u8,
}

#[derive(Clone)]
pub struct Tokenizer {
    state: State,
    stack: [Container; DEPTH_MAX],
    depth: usize,
    path: [u8; PATH_MAX],
    path_len: usize,
    /// The path grew past [`PATH_MAX`]: values are unseen until it is
    /// cut back below that.
    path_lost: bool,
    text: [u8; TEXT_MAX],
    text_len: usize,
    str_len: usize,
    unicode: u32,
    /// A high surrogate waiting for its low half.
    high_surrogate: Option<u32>,
    number: Option<u64>,
    number_digits: u32,
}

impl Default for Tokenizer {
    fn default() -> Self {
        Self {
            state: State::Value,
            stack: [Container::default(); DEPTH_MAX],
            depth: 0,
            path: [0; PATH_MAX],
            path_len: 0,
            path_lost: false,
            text: [0; TEXT_MAX],
            text_len: 0,
            str_len: 0,
            unicode: 0,
            high_surrogate: None,
            number: None,
            number_digits: 0,
        }
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("state", &self.state)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Forgets everything: the next byte starts a new top-level value.
    pub fn reset(&mut self) {
        self.state = State::Value;
        self.depth = 0;
        self.path_len = 0;
        self.path_lost = false;
        self.high_surrogate = None;
    }

    /// The input was not JSON since the last reset.
    pub fn broken(&self) -> bool {
        self.state == State::Broken
    }

    /// Between values at the top level (nothing half read).
    pub fn idle(&self) -> bool {
        self.depth == 0 && matches!(self.state, State::Value | State::AfterValue)
    }

    /// Starts as if `path` were the path of the value that follows (reading
    /// from the middle of a document, at a key found by other means).
    pub fn start_at(&mut self, path: &str) {
        self.reset();
        let n = path.len().min(PATH_MAX);
        self.path[..n].copy_from_slice(&path.as_bytes()[..n]);
        self.path_len = n;
    }

    pub fn feed(&mut self, bytes: &[u8], v: &mut impl Visit) {
        for &b in bytes {
            if self.state == State::Broken {
                return;
            }
            self.byte(b, v);
        }
    }

    /// The input ended (an event's end): a number at the top level ends here.
    pub fn finish(&mut self, v: &mut impl Visit) {
        if self.state == State::InNumber && self.depth == 0 {
            self.end_number(v);
            self.value_done(v);
        }
    }

    fn byte(&mut self, b: u8, v: &mut impl Visit) {
        match self.state {
            State::Value | State::ArrayStart => self.value_start(b, v),
            State::ObjectStart | State::Key => self.key_start(b, v),
            State::InKey => match b {
                b'"' => self.state = State::Colon,
                b'\\' => self.state = State::InKeyEscape,
                _ => self.path_byte(b),
            },
            State::InKeyEscape => {
                // Keys we look for have no escapes: keep the escaped byte as
                // it is written (a `\u` key simply matches nothing).
                self.path_byte(b);
                self.state = State::InKey;
            }
            State::Colon => match b {
                b':' => self.state = State::Value,
                _ if is_space(b) => {}
                _ => self.state = State::Broken,
            },
            State::InString => self.string_byte(b, v),
            State::InEscape => self.escape_byte(b),
            State::InUnicode(n) => self.unicode_byte(n, b),
            State::InNumber => self.number_byte(b, v),
            State::InLiteral(which, at) => self.literal_byte(which, at, b, v),
            State::AfterValue => self.after_value(b, v),
            State::Broken => {}
        }
    }

    /// After `{` or an object's `,`: a key's opening quote (or `}` right
    /// after `{`).
    #[inline]
    fn key_start(&mut self, b: u8, v: &mut impl Visit) {
        match b {
            b'"' => {
                self.push_segment_start();
                self.state = State::InKey;
            }
            b'}' if self.state == State::ObjectStart => self.close(false, v),
            _ if is_space(b) => {}
            _ => self.state = State::Broken,
        }
    }

    /// Inside a string value: its end, an escape, or a byte of its text.
    #[inline]
    fn string_byte(&mut self, b: u8, v: &mut impl Visit) {
        match b {
            b'"' => {
                self.flush_surrogate();
                let len = self.str_len;
                let text = String::from_utf8_lossy(&self.text[..self.text_len]);
                self.report(v, Scalar::Str { text: &text, len });
                self.value_done(v);
            }
            b'\\' => self.state = State::InEscape,
            _ => {
                self.flush_surrogate();
                self.text_byte(b);
            }
        }
    }

    /// The byte after `\` in a string value.
    #[inline]
    fn escape_byte(&mut self, b: u8) {
        let c = match b {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'b' => 8,
            b'f' => 12,
            b'"' | b'\\' | b'/' => b,
            b'u' => {
                self.unicode = 0;
                self.state = State::InUnicode(0);
                return;
            }
            _ => {
                self.state = State::Broken;
                return;
            }
        };
        self.flush_surrogate();
        self.text_byte(c);
        self.state = State::InString;
    }

    /// One of the four hex digits of `\u`; `n` read before it.
    #[inline]
    fn unicode_byte(&mut self, n: u8, b: u8) {
        let Some(d) = (b as char).to_digit(16) else {
            self.state = State::Broken;
            return;
        };
        self.unicode = self.unicode << 4 | d;
        if n < 3 {
            self.state = State::InUnicode(n + 1);
        } else {
            self.code_point(self.unicode);
            self.state = State::InString;
        }
    }

    /// Inside a number: a digit, a sign, fraction or exponent (the number is
    /// then not an integer), or the byte after its end.
    #[inline]
    fn number_byte(&mut self, b: u8, v: &mut impl Visit) {
        match b {
            b'0'..=b'9' => {
                self.number_digits += 1;
                self.number = self
                    .number
                    .and_then(|n| n.checked_mul(10)?.checked_add(u64::from(b - b'0')));
            }
            b'.' | b'e' | b'E' | b'+' | b'-' => self.number = None,
            _ => {
                self.end_number(v);
                self.value_done(v);
                self.byte(b, v);
            }
        }
    }

    /// The next byte of `true`, `false` or `null` (`which`), `at` read.
    #[inline]
    fn literal_byte(&mut self, which: u8, at: u8, b: u8, v: &mut impl Visit) {
        let lit = LITERALS[usize::from(which)];
        if lit.get(usize::from(at)) != Some(&b) {
            self.state = State::Broken;
            return;
        }
        if usize::from(at) + 1 < lit.len() {
            self.state = State::InLiteral(which, at + 1);
            return;
        }
        let s = match which {
            0 => Scalar::Bool(true),
            1 => Scalar::Bool(false),
            _ => Scalar::Null,
        };
        self.report(v, s);
        self.value_done(v);
    }

    fn value_start(&mut self, b: u8, v: &mut impl Visit) {
        match b {
            b'{' | b'[' => {
                if self.depth == DEPTH_MAX {
                    self.state = State::Broken;
                    return;
                }
                let array = b == b'[';
                let top = self.depth == 0;
                self.stack[self.depth] = Container {
                    array,
                    base: self.path_len.min(usize::from(u8::MAX)) as u8,
                };
                self.depth += 1;
                if array && top {
                    // A top-level array's elements are events (Gemini's
                    // stream): their paths are as if each stood alone.
                    self.state = State::ArrayStart;
                } else if array {
                    self.push_segment_start();
                    self.path_byte(b'*');
                    self.state = State::ArrayStart;
                } else {
                    self.state = State::ObjectStart;
                }
            }
            b']' if self.state == State::ArrayStart => self.close(true, v),
            b'"' => {
                self.text_len = 0;
                self.str_len = 0;
                self.high_surrogate = None;
                self.state = State::InString;
            }
            b'-' => {
                self.number = None;
                self.number_digits = 0;
                self.state = State::InNumber;
            }
            b'0'..=b'9' => {
                self.number = Some(u64::from(b - b'0'));
                self.number_digits = 1;
                self.state = State::InNumber;
            }
            b't' | b'f' | b'n' => {
                let which = match b {
                    b't' => 0,
                    b'f' => 1,
                    _ => 2,
                };
                self.state = State::InLiteral(which, 1);
            }
            _ if is_space(b) => {}
            _ => self.state = State::Broken,
        }
    }

    fn after_value(&mut self, b: u8, v: &mut impl Visit) {
        if self.depth == 0 {
            // The next top-level value of a stream of them.
            self.state = State::Value;
            self.value_start(b, v);
            return;
        }
        let top = self.stack[self.depth - 1];
        match b {
            b',' if top.array => self.state = State::Value,
            b',' => {
                self.truncate_path(usize::from(top.base));
                self.state = State::Key;
            }
            b']' if top.array => self.close(true, v),
            b'}' if !top.array => self.close(false, v),
            _ if is_space(b) => {}
            _ => self.state = State::Broken,
        }
    }

    fn close(&mut self, array: bool, v: &mut impl Visit) {
        let top = self.stack[self.depth - 1];
        if top.array != array {
            self.state = State::Broken;
            return;
        }
        self.depth -= 1;
        self.truncate_path(usize::from(top.base));
        if self.depth == 0 && array {
            // A top-level array's elements were the events.
            self.state = State::AfterValue;
            return;
        }
        self.value_done(v);
    }

    /// A value ended: an event when it is a top-level value or an element
    /// of a top-level array.
    fn value_done(&mut self, v: &mut impl Visit) {
        self.state = State::AfterValue;
        let in_top_array = self.depth == 1 && self.stack[0].array;
        if self.depth == 0 || in_top_array {
            v.event_end();
        }
    }

    fn end_number(&mut self, v: &mut impl Visit) {
        let s = match self.number {
            Some(n) if self.number_digits > 0 => Scalar::Int(n),
            _ => Scalar::Number,
        };
        self.report(v, s);
    }

    fn report(&self, v: &mut impl Visit, s: Scalar<'_>) {
        if self.path_lost {
            return;
        }
        // Key bytes as written: lossy keeps the path a str.
        let path = String::from_utf8_lossy(&self.path[..self.path_len]);
        v.value(&path, s);
    }

    fn push_segment_start(&mut self) {
        if self.path_len > 0 {
            self.path_byte(b'.');
        }
    }

    fn path_byte(&mut self, b: u8) {
        if self.path_len == PATH_MAX {
            self.path_lost = true;
            return;
        }
        self.path[self.path_len] = b;
        self.path_len += 1;
    }

    fn truncate_path(&mut self, len: usize) {
        self.path_len = len.min(self.path_len);
        if len < PATH_MAX {
            self.path_lost = false;
        }
    }

    fn text_byte(&mut self, b: u8) {
        self.str_len += 1;
        if self.text_len < TEXT_MAX {
            self.text[self.text_len] = b;
            self.text_len += 1;
        }
    }

    fn code_point(&mut self, u: u32) {
        match u {
            0xD800..=0xDBFF => {
                self.flush_surrogate();
                self.high_surrogate = Some(u);
            }
            0xDC00..=0xDFFF => {
                let c = self
                    .high_surrogate
                    .take()
                    .and_then(|h| char::from_u32(0x10000 + ((h - 0xD800) << 10) + (u - 0xDC00)));
                self.push_char(c.unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            _ => {
                self.flush_surrogate();
                self.push_char(char::from_u32(u).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
        }
    }

    fn flush_surrogate(&mut self) {
        if self.high_surrogate.take().is_some() {
            self.push_char(char::REPLACEMENT_CHARACTER);
        }
    }

    fn push_char(&mut self, c: char) {
        let mut buf = [0; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            self.text_byte(b);
        }
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Log(Vec<String>);

    impl Visit for Log {
        fn value(&mut self, path: &str, v: Scalar<'_>) {
            self.0.push(match v {
                Scalar::Str { text, len } => format!("{path}={text:?}/{len}"),
                Scalar::Int(n) => format!("{path}={n}"),
                Scalar::Number => format!("{path}=num"),
                Scalar::Bool(b) => format!("{path}={b}"),
                Scalar::Null => format!("{path}=null"),
            });
        }
        fn event_end(&mut self) {
            self.0.push("|".into());
        }
    }

    fn read(parts: &[&[u8]]) -> (Vec<String>, bool) {
        let mut t = Tokenizer::default();
        let mut log = Log::default();
        for p in parts {
            t.feed(p, &mut log);
        }
        t.finish(&mut log);
        (log.0, t.broken())
    }

    const DOC: &[u8] = br#"{"model": "m\/1", "choices": [{"delta": {"content": "Hi \"x\" \u00e9\ud83d\ude00"}, "n": [1, 2.5, -3]}], "ok": true, "none": null, "usage": {"prompt_tokens": 12}}"#;

    fn want() -> Vec<String> {
        [
            "model=\"m/1\"/3",
            "choices.*.delta.content=\"Hi \\\"x\\\" é😀\"/13",
            "choices.*.n.*=1",
            "choices.*.n.*=num",
            "choices.*.n.*=num",
            "ok=true",
            "none=null",
            "usage.prompt_tokens=12",
            "|",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn paths_values_and_escapes() {
        assert_eq!(read(&[DOC]), (want(), false));
    }

    #[test]
    fn split_at_every_byte_offset() {
        for i in 0..=DOC.len() {
            for j in i..=DOC.len() {
                let got = read(&[&DOC[..i], &DOC[i..j], &DOC[j..]]);
                assert_eq!(got, (want(), false), "split at {i}, {j}");
            }
        }
    }

    #[test]
    fn a_byte_at_a_time_and_pretty_printed() {
        let pretty =
            b"{\n  \"model\" :\t\"m/1\",\r\n  \"usage\": {\n    \"prompt_tokens\": 12\n  }\n}\n";
        let parts: Vec<&[u8]> = pretty.chunks(1).collect();
        let (log, broken) = read(&parts);
        assert!(!broken);
        assert_eq!(log, ["model=\"m/1\"/3", "usage.prompt_tokens=12", "|"]);
    }

    #[test]
    fn streams_of_values_and_arrays_of_events() {
        let (log, _) = read(&[b"{\"a\":1}\n{\"a\":2}\n7"]);
        assert_eq!(log, ["a=1", "|", "a=2", "|", "=7", "|"]);
        let (log, _) = read(&[b"[{\"a\":1},\r\n{\"a\":[2]}]"]);
        assert_eq!(log, ["a=1", "|", "a.*=2", "|"]);
    }

    #[test]
    fn not_json_breaks_until_reset() {
        let mut t = Tokenizer::default();
        let mut log = Log::default();
        t.feed(b"[DONE]", &mut log);
        assert!(t.broken());
        t.feed(b"{\"a\":1}", &mut log);
        assert!(log.0.is_empty());
        t.reset();
        t.feed(b"{\"a\":1}", &mut log);
        assert_eq!(log.0, ["a=1", "|"]);
        for bad in [
            &b"{\"a\" 1}"[..],
            b"{\"a\":1]",
            b"{1:2}",
            b"\"\\q\"",
            b"tru ",
        ] {
            assert!(read(&[bad]).1, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn bounded_text_and_paths() {
        let long = format!("{{\"content\":\"{}\"}}", "x".repeat(1000));
        let (log, _) = read(&[long.as_bytes()]);
        assert_eq!(log[0], format!("content={:?}/1000", "x".repeat(TEXT_MAX)));
        let deep = format!(
            "{}1{}",
            "[".repeat(DEPTH_MAX + 1),
            "]".repeat(DEPTH_MAX + 1)
        );
        assert!(read(&[deep.as_bytes()]).1);
        let key = "k".repeat(PATH_MAX + 10);
        let doc = format!("{{\"{key}\":{{\"a\":1}},\"b\":2}}");
        assert_eq!(read(&[doc.as_bytes()]).0, ["b=2", "|"]);
    }

    #[test]
    fn resumes_mid_document() {
        let mut t = Tokenizer::default();
        let mut log = Log::default();
        t.start_at("usage");
        t.feed(b"{\"input_tokens\":3}}", &mut log);
        // The fragment's end is an event's end: what it held is kept.
        assert_eq!(log.0, ["usage.input_tokens=3", "|"]);
        assert!(t.broken(), "the document's own end is not JSON here");
    }

    /// A small deterministic generator (xorshift), so failures repeat.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random JSON value: keys plain (paths compare as written), strings
    /// with quotes, escapes, control characters and non-ASCII.
    fn random_value(r: &mut Rng, depth: u32) -> serde_json::Value {
        use serde_json::Value as V;
        let pick = if depth >= 5 { r.below(5) } else { r.below(7) };
        match pick {
            0 => V::Null,
            1 => V::Bool(r.below(2) == 0),
            2 => V::from(r.next() >> r.below(64)),
            3 => V::from(-(r.below(1000) as i64) - 1),
            4 => {
                const PARTS: [&str; 8] = ["a", "\"", "\\", "\n", "é", "😀", "\u{1}", "/"];
                let n = r.below(130);
                V::from(
                    (0..n)
                        .map(|_| PARTS[r.below(8) as usize])
                        .collect::<String>(),
                )
            }
            5 => V::Array(
                (0..r.below(4))
                    .map(|_| random_value(r, depth + 1))
                    .collect(),
            ),
            _ => V::Object(
                (0..r.below(4))
                    .map(|k| (format!("k{}", k + r.below(3)), random_value(r, depth + 1)))
                    .collect(),
            ),
        }
    }

    /// What the tokenizer should report for `v`, as [`Prefixes`] writes it.
    fn expected(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        expected_in(v, path, false, out);
    }

    /// `nested`: `v` is inside a container (a top-level array's element
    /// has the empty path too).
    fn expected_in(v: &serde_json::Value, path: &str, nested: bool, out: &mut Vec<String>) {
        use serde_json::Value as V;
        let join = |k: &str| {
            if path.is_empty() {
                k.to_owned()
            } else {
                format!("{path}.{k}")
            }
        };
        match v {
            V::Null => out.push(format!("{path}=null")),
            V::Bool(b) => out.push(format!("{path}={b}")),
            V::Number(n) => out.push(match n.as_u64() {
                Some(u) => format!("{path}={u}"),
                None => format!("{path}=num"),
            }),
            V::String(t) => {
                let mut end = t.len().min(TEXT_MAX);
                // The tokenizer cuts at a byte: a cut character is lost.
                while std::str::from_utf8(&t.as_bytes()[..end]).is_err() {
                    end -= 1;
                }
                out.push(format!("{path}=<{}>/{}", &t[..end], t.len()));
            }
            // A top-level array's elements stand alone (events).
            V::Array(a) if path.is_empty() && !nested => {
                a.iter().for_each(|x| expected_in(x, "", true, out))
            }
            V::Array(a) => a.iter().for_each(|x| expected_in(x, &join("*"), true, out)),
            V::Object(o) => o
                .iter()
                .for_each(|(k, x)| expected_in(x, &join(k), true, out)),
        }
    }

    /// The tokenizer's report with strings shown as their whole-character
    /// prefix (a character cut by [`TEXT_MAX`] is dropped) and their length.
    #[derive(Default)]
    struct Prefixes(Vec<String>);

    impl Visit for Prefixes {
        fn value(&mut self, path: &str, v: Scalar<'_>) {
            self.0.push(match v {
                Scalar::Str { text, len } => {
                    format!("{path}=<{}>/{len}", text.trim_end_matches('\u{fffd}'))
                }
                Scalar::Int(n) => format!("{path}={n}"),
                Scalar::Number => format!("{path}=num"),
                Scalar::Bool(b) => format!("{path}={b}"),
                Scalar::Null => format!("{path}=null"),
            });
        }
        fn event_end(&mut self) {}
    }

    #[test]
    fn random_documents_any_layout_any_split() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut values = 0;
        for round in 0..3_000 {
            let v = random_value(&mut r, 0);
            let mut want = Vec::new();
            expected(&v, "", &mut want);
            let texts = [
                serde_json::to_string(&v).expect("serialises"),
                serde_json::to_string_pretty(&v).expect("serialises"),
            ];
            for text in texts {
                let b = text.as_bytes();
                let mut t = Tokenizer::default();
                let mut got = Prefixes::default();
                let mut at = 0;
                while at < b.len() {
                    let n = (1 + r.below(b.len() as u64) as usize).min(b.len() - at);
                    t.feed(&b[at..at + n], &mut got);
                    at += n;
                }
                t.finish(&mut got);
                assert!(!t.broken() && t.idle(), "round {round}: {text}");
                assert_eq!(got.0, want, "round {round}: {text}");
                values += got.0.len();
            }
        }
        assert!(values > 5_000, "only {values} values read");
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        const ALPHABET: &[u8] = b"{}[]\":,.-+eE0123456789 \n\\utrfalsn/abc";
        for _ in 0..20_000 {
            let mut t = Tokenizer::default();
            let mut log = Log::default();
            let len = r.below(64) as usize;
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    if r.below(4) == 0 {
                        r.next() as u8
                    } else {
                        ALPHABET[r.below(ALPHABET.len() as u64) as usize]
                    }
                })
                .collect();
            t.feed(&b, &mut log);
            t.finish(&mut log);
        }
    }
}
