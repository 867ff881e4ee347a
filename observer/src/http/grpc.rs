//! gRPC calls over HTTP/2: the service and method from `:path`, the
//! length-prefixed messages each way counted from DATA frames, the status
//! from the trailers (or a trailers-only answer).

/// Bytes of the DATA frames' payload as the reader had them: copied, or
/// skipped (the uncopied middle of a long call).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Piece {
    Seen(Vec<u8>),
    Unseen(usize),
}

/// Payload bytes a DATA frame keeps for the message splitter; past this the
/// rest counts as unseen (a message prefix there loses the count).
pub(super) const MAX_SEEN: usize = 16 * 1024;

/// Adds `b` to a frame's pieces within [`MAX_SEEN`].
pub(super) fn add_seen(pieces: &mut Vec<Piece>, b: &[u8]) {
    let seen: usize = pieces
        .iter()
        .map(|p| match p {
            Piece::Seen(s) => s.len(),
            Piece::Unseen(_) => 0,
        })
        .sum();
    let n = MAX_SEEN.saturating_sub(seen).min(b.len());
    if n > 0 {
        if let Some(Piece::Seen(last)) = pieces.last_mut() {
            last.extend_from_slice(&b[..n]);
        } else {
            pieces.push(Piece::Seen(b[..n].to_vec()));
        }
    }
    add_unseen(pieces, b.len() - n);
}

pub(super) fn add_unseen(pieces: &mut Vec<Piece>, n: usize) {
    if n == 0 {
        return;
    }
    if let Some(Piece::Unseen(last)) = pieces.last_mut() {
        *last += n;
    } else {
        pieces.push(Piece::Unseen(n));
    }
}

/// One direction's messages: a 1-byte compressed flag and a 4-byte
/// big-endian length, then the message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Messages {
    /// Messages begun; None once a prefix fell among uncopied bytes.
    count: Option<u32>,
    /// Bytes of the current message still to come.
    need: usize,
    prefix: Vec<u8>,
}

impl Messages {
    fn new() -> Self {
        Messages {
            count: Some(0),
            need: 0,
            prefix: Vec::with_capacity(5),
        }
    }

    pub fn count(&self) -> Option<u32> {
        self.count
    }

    /// One DATA frame's payload; returns whether a message began in it.
    pub(super) fn feed(&mut self, pieces: &[Piece]) -> bool {
        let before = self.count;
        for p in pieces {
            let Some(n) = self.count else { break };
            match p {
                Piece::Seen(b) => {
                    let mut b = b.as_slice();
                    let mut n = n;
                    while !b.is_empty() {
                        if self.need > 0 {
                            let k = self.need.min(b.len());
                            self.need -= k;
                            b = &b[k..];
                            continue;
                        }
                        let k = (5 - self.prefix.len()).min(b.len());
                        self.prefix.extend_from_slice(&b[..k]);
                        b = &b[k..];
                        if self.prefix.len() == 5 {
                            let p = &self.prefix;
                            self.need = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                            self.prefix.clear();
                            n += 1;
                        }
                    }
                    self.count = Some(n);
                }
                Piece::Unseen(k) => {
                    if self.need >= *k && self.prefix.is_empty() {
                        self.need -= k;
                    } else {
                        self.count = None;
                    }
                }
            }
        }
        self.count.unwrap_or(0) > before.unwrap_or(0)
    }
}

/// A gRPC call as its frames showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rpc {
    pub service: Option<String>,
    pub method: Option<String>,
    /// From `grpc-status` (trailers, or a trailers-only answer).
    pub status: Option<u32>,
    /// `grpc-message`, percent-decoded, at most [`MAX_MESSAGE`] bytes.
    pub message: Option<String>,
    /// [client -> server, server -> client].
    pub messages: [Messages; 2],
    /// When the first answer message began (CLOCK_MONOTONIC ns).
    pub first_message_ns: u64,
}

/// Longest `grpc-message` kept.
const MAX_MESSAGE: usize = 256;

/// Whether a request's content type is gRPC's.
pub fn is_grpc(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|c| {
        c == "application/grpc"
            || c.starts_with("application/grpc+")
            || c.starts_with("application/grpc;")
    })
}

impl Rpc {
    /// From the request's `:path`, "/package.Service/Method".
    pub fn new(path: Option<&str>) -> Self {
        let (service, method) = path
            .and_then(|p| p.strip_prefix('/')?.split_once('/'))
            .map_or((None, None), |(s, m)| {
                (Some(s.to_owned()), Some(m.to_owned()))
            });
        Rpc {
            service,
            method,
            status: None,
            message: None,
            messages: [Messages::new(), Messages::new()],
            first_message_ns: 0,
        }
    }

    /// An answer header block (headers or trailers).
    pub fn answer_fields(&mut self, status: Option<&[u8]>, message: Option<&[u8]>) {
        if let Some(s) = status.and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok()) {
            self.status = Some(s);
        }
        if let Some(m) = message.filter(|m| !m.is_empty()) {
            self.message = Some(percent_decode(m));
        }
    }
}

/// `grpc-message` is percent-encoded UTF-8; what does not decode stays as
/// it came, lossy.
fn percent_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() && out.len() < MAX_MESSAGE {
        let hex = |b: u8| (b as char).to_digit(16);
        match (v[i], v.get(i + 1).copied(), v.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend((body.len() as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn messages_split_across_frames_and_skipped_in_step() {
        let mut m = Messages::new();
        let mut all = msg(b"one");
        all.extend(msg(&[9u8; 3000]));
        all.extend(msg(b""));
        // A prefix split across two frames.
        assert!(m.feed(&[Piece::Seen(all[..10].to_vec())]));
        // The big message's middle not copied: its length carries over it.
        assert!(m.feed(&[
            Piece::Seen(all[10..100].to_vec()),
            Piece::Unseen(2_000),
            Piece::Seen(all[2_100..].to_vec()),
        ]));
        assert_eq!(m.count(), Some(3));
    }

    #[test]
    fn a_prefix_among_uncopied_bytes_loses_the_count() {
        let mut m = Messages::new();
        let mut all = msg(b"a");
        all.extend(msg(b"b"));
        m.feed(&[Piece::Seen(all[..3].to_vec()), Piece::Unseen(all.len() - 3)]);
        assert_eq!(m.count(), None);
    }

    #[test]
    fn path_status_and_message() {
        let mut r = Rpc::new(Some("/helloworld.Greeter/SayHello"));
        assert_eq!(r.service.as_deref(), Some("helloworld.Greeter"));
        assert_eq!(r.method.as_deref(), Some("SayHello"));
        r.answer_fields(Some(b"5"), Some(b"no such thing: caf%C3%A9 100%"));
        assert_eq!(r.status, Some(5));
        assert_eq!(r.message.as_deref(), Some("no such thing: café 100%"));
        assert!(is_grpc(Some("application/grpc+proto")));
        assert!(!is_grpc(Some("application/grpc-web")));
    }
}
