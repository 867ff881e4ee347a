//! Searches in captured pieces of JSON and event streams. A piece is a
//! contiguous run of bytes (a whole call, or one of its two halves): no
//! search spans two pieces.

/// Where `needle` starts in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    memchr::memmem::find(hay, needle)
}

/// The string value of the first `"key":"value"` in `piece` (JSON strings
/// escape their quotes, so a key inside a string value cannot match).
pub fn string_value(piece: &[u8], key: &str) -> Option<String> {
    let pat = format!("\"{key}\":");
    let at = find(piece, pat.as_bytes())? + pat.len();
    let rest = skip_space(&piece[at..]);
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    (rest.get(end) == Some(&b'"')).then(|| String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// The unsigned integer value of the first `"key":N` in `piece`.
pub fn int_value(piece: &[u8], key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let at = find(piece, pat.as_bytes())? + pat.len();
    let rest = skip_space(&piece[at..]);
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // A number cut by the end of the piece is not a number.
    if digits == 0 || digits == rest.len() {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// The boolean value of the first `"key":true|false` in `piece`.
pub fn bool_value(piece: &[u8], key: &str) -> Option<bool> {
    let pat = format!("\"{key}\":");
    let at = find(piece, pat.as_bytes())? + pat.len();
    let rest = skip_space(&piece[at..]);
    if rest.starts_with(b"true") {
        Some(true)
    } else if rest.starts_with(b"false") {
        Some(false)
    } else {
        None
    }
}

fn skip_space(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    &b[n..]
}

/// Server-sent events whose data lines start in `body` (a line is an
/// event's first when it starts with "data:" after a blank line or at the
/// piece's start, which is where a read of a stream begins).
pub fn sse_events(body: &[u8]) -> u32 {
    let mut n = 0;
    let mut at_event_start = true;
    for line in body.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            at_event_start = true;
            continue;
        }
        if at_event_start && line.starts_with(b"data:") {
            n += 1;
            at_event_start = false;
        } else if !line.starts_with(b"event:")
            && !line.starts_with(b"id:")
            && !line.starts_with(b":")
            && !line.starts_with(b"retry:")
            && !line.starts_with(b"data:")
        {
            // A chunk-size line of the chunked framing: the event that
            // follows it starts afresh.
            at_event_start = line.iter().all(u8::is_ascii_hexdigit);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        let p =
            br#"{"model": "m-1","stream":true,"usage":{"prompt_tokens":12,"completion_tokens":7}}"#;
        assert_eq!(string_value(p, "model").as_deref(), Some("m-1"));
        assert_eq!(bool_value(p, "stream"), Some(true));
        assert_eq!(int_value(p, "prompt_tokens"), Some(12));
        assert_eq!(int_value(p, "completion_tokens"), Some(7));
        assert_eq!(int_value(p, "total_tokens"), None);
        // Cut by the piece's end: unknown, not a smaller number.
        assert_eq!(int_value(br#""eval_count":12"#, "eval_count"), None);
        assert_eq!(string_value(br#""model":"abc"#, "model"), None);
        // A key inside a string value is escaped.
        assert_eq!(
            string_value(
                br#"{"content":"say \"model\":\"x\"","model":"real"}"#,
                "model"
            )
            .as_deref(),
            Some("real")
        );
    }

    #[test]
    fn events() {
        assert_eq!(sse_events(b"data: {\"a\":1}\n\n"), 1);
        assert_eq!(
            sse_events(b"4a\r\ndata: {}\r\n\r\n\r\n4a\r\ndata: {}\r\n\r\n\r\n"),
            2
        );
        assert_eq!(
            sse_events(b"event: message_start\ndata: {}\n\nevent: ping\ndata: {}\n\n"),
            2
        );
        assert_eq!(sse_events(b"data: [DONE]\n\n"), 1);
        assert_eq!(sse_events(b": keep-alive\n\n"), 0);
        // A multi-line event is one event.
        assert_eq!(sse_events(b"data: a\ndata: b\n\n"), 1);
    }
}
