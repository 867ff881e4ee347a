//! Searches in captured pieces of event streams. A piece is a
//! contiguous run of bytes (a whole call, or one of its two halves): no
//! search spans two pieces.

/// Where `needle` starts in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    memchr::memmem::find(hay, needle)
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
