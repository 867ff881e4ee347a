//! HTTP/2 connections (ALPN h2 over TLS, and h2c with prior knowledge): the
//! frames of each direction rebuilt from the plaintext calls, header blocks
//! decoded through HPACK (loona-hpack, one decoder per direction, as each
//! peer's encoder keeps its own table), one [`Exchange`] per stream.
//!
//! Calls longer than `DATA_CAPTURE` arrive as their first and last halves;
//! frame lengths carry the reader across the uncopied middle when it lies
//! inside one frame's payload. When a frame header falls in it, the reader
//! is out of step until a later call starts with a plausible frame header.
//!
//! A header block that was not seen whole, or that referred to a table
//! entry we never saw, starts that direction's HPACK table afresh. HPACK
//! numbers dynamic entries from the newest, so the entries added since then
//! keep their true indexes: a later block that refers only to them (or to
//! the static table) decodes right, and one that refers further back fails
//! and is marked undecodable, never guessed; what it tells through the
//! static table and literals (method, path, status, ...) is still kept
//! (`hpack_partial`). The same holds for a connection first seen mid-way
//! (begun before the observer started).

use std::collections::BTreeMap;

use observer_common::{http::PlaintextEvent, tls::op};

use crate::record::H2Counts;

use super::{
    exchange::{pieces, Exchange, Stream},
    gen_ai,
    grpc::{self, Piece, Rpc},
    head::Head,
    hpack_partial,
    trace_context::{tracestate, TraceParent},
};

/// Payload bytes of an HTTP/2 DATA frame kept for the event and API
/// scanners: a call copies no more.
const DATA_KEEP: usize = observer_common::http::DATA_CAPTURE;

/// The client's connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// A header block longer than this is not decoded (the table is then
/// unknown): real ones are a few hundred bytes.
const MAX_BLOCK: usize = 64 * 1024;
/// The dynamic table size a peer may ask for that we follow.
const MAX_TABLE: usize = 64 * 1024;
/// Payload bytes of the frames whose content is read (RST_STREAM, GOAWAY's
/// first 8, DATA's for the API scanner) kept per frame.
const KEEP_SMALL: usize = 8;

/// A frame header's payload length and stream id (reserved bit cleared).
pub(super) fn frame_header(h: &[u8]) -> (usize, u32) {
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
    (len, stream)
}

/// What the reader gives for one frame.
#[derive(Debug, PartialEq, Eq)]
enum Item<'a> {
    Start {
        kind: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
    Payload(&'a [u8]),
    /// Payload bytes that were not copied.
    Unseen(usize),
    End,
    /// A frame header fell where nothing was copied: out of step from here.
    Lost,
}

/// One direction's frames.
struct Reader {
    /// Bytes of a frame header split across calls.
    header: Vec<u8>,
    /// Payload bytes left in the current frame (None: between frames).
    left: Option<usize>,
    /// A frame header fell where nothing was copied.
    lost: bool,
    /// Preface bytes still to skip (the client's direction).
    preface: usize,
}

impl Reader {
    fn new(preface: usize) -> Self {
        Reader {
            header: Vec::with_capacity(9),
            left: None,
            lost: false,
            preface,
        }
    }

    /// Visible bytes, in order.
    fn bytes<'a>(&mut self, mut b: &'a [u8], out: &mut Vec<Item<'a>>) {
        while !b.is_empty() && !self.lost {
            if self.preface > 0 {
                let n = self.preface.min(b.len());
                let at = PREFACE.len() - self.preface;
                if b[..n] != PREFACE[at..at + n] {
                    // Not HTTP/2 after all (a server's first bytes only
                    // looked like SETTINGS): nothing more is read.
                    self.preface = 0;
                    self.lose(out);
                    return;
                }
                self.preface -= n;
                b = &b[n..];
                continue;
            }
            match self.left {
                None => {
                    let n = (9 - self.header.len()).min(b.len());
                    self.header.extend_from_slice(&b[..n]);
                    b = &b[n..];
                    if self.header.len() == 9 {
                        let h = &self.header;
                        let (len, stream) = frame_header(h);
                        out.push(Item::Start {
                            kind: h[3],
                            flags: h[4],
                            stream,
                            len,
                        });
                        self.header.clear();
                        self.end_or(len, out);
                    }
                }
                Some(left) => {
                    let n = left.min(b.len());
                    out.push(Item::Payload(&b[..n]));
                    b = &b[n..];
                    self.end_or(left - n, out);
                }
            }
        }
    }

    fn end_or(&mut self, left: usize, out: &mut Vec<Item<'_>>) {
        if left == 0 {
            out.push(Item::End);
            self.left = None;
        } else {
            self.left = Some(left);
        }
    }

    /// `n` bytes that were not copied.
    fn unseen(&mut self, n: usize, out: &mut Vec<Item<'_>>) {
        if n == 0 || self.lost {
            return;
        }
        match self.left {
            Some(left) if left >= n && self.preface == 0 => {
                out.push(Item::Unseen(n));
                self.end_or(left - n, out);
            }
            _ => self.lose(out),
        }
    }

    fn lose(&mut self, out: &mut Vec<Item<'_>>) {
        if let Some(left) = self.left {
            out.push(Item::Unseen(left));
            out.push(Item::End);
        }
        out.push(Item::Lost);
        self.lost = true;
        self.left = None;
        self.header.clear();
    }

    /// At a call's start, out of step: is this a frame header we can trust
    /// enough to count bytes and time streams from again?
    fn resync(&mut self, b: &[u8]) {
        if !self.lost || b.len() < 9 {
            return;
        }
        let (len, stream) = frame_header(b);
        let reserved = b[5] & 0x80 != 0;
        let on_stream = stream != 0 && !reserved;
        let plausible = len <= 16_384
            && match b[3] {
                DATA | HEADERS => on_stream,
                RST_STREAM => on_stream && len == 4,
                SETTINGS => stream == 0 && len.is_multiple_of(6) && b[4] & !1 == 0,
                PING => stream == 0 && len == 8 && b[4] & !1 == 0,
                GOAWAY => stream == 0 && len >= 8,
                WINDOW_UPDATE => !reserved && len == 4,
                _ => false,
            };
        if plausible {
            self.lost = false;
        }
    }
}

/// A frame being read, then as the conversation uses it.
#[derive(Default)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    len: usize,
    /// Header block bytes (HEADERS, CONTINUATION) or the first few of others.
    kept: Vec<u8>,
    /// All of the payload was seen.
    whole: bool,
    /// DATA: the payload as seen and skipped, for the gRPC message splitter.
    pieces: Vec<Piece>,
    /// For a HEADERS frame with its CONTINUATIONs, once whole: the fields.
    fields: Fields,
    /// `fields` are only those a block that could not be decoded whole
    /// still told (`hpack_partial`): the rest named unseen table entries.
    partial: bool,
}

/// One direction: its frames and its peer's HPACK table.
struct Direction {
    reader: Reader,
    hpack: loona_hpack::Decoder<'static>,
    frame: Option<Frame>,
    /// A header block in progress (HEADERS without END_HEADERS so far).
    block: Option<(u32, u8, Vec<u8>, bool)>,
}

fn decoder() -> loona_hpack::Decoder<'static> {
    let mut hpack = loona_hpack::Decoder::new();
    hpack.set_max_allowed_table_size(MAX_TABLE);
    hpack
}

impl Direction {
    fn forget_table(&mut self) {
        self.hpack = decoder();
    }

    fn new(preface: usize) -> Self {
        Direction {
            reader: Reader::new(preface),
            hpack: decoder(),
            frame: None,
            block: None,
        }
    }
}

/// Headers of one block, decoded (None: undecodable).
type Fields = Option<Vec<(Vec<u8>, Vec<u8>)>>;

/// One HTTP/2 connection's streams.
pub struct H2 {
    /// [request direction (client -> server), answer direction].
    dirs: [Direction; 2],
    streams: BTreeMap<u32, Exchange>,
    from_start: bool,
    requests: u32,
    /// GOAWAY frames seen, either way.
    pub goaways: u32,
    /// The last stream id of a GOAWAY the server sent: a stream the client
    /// begins above it will not be processed.
    server_goaway: Option<u32>,
    /// RST_STREAM frames seen, either way.
    pub resets: u32,
    /// Header blocks that could not be decoded.
    pub undecodable: u64,
    /// Times a direction's reader lost its place (a frame header not copied).
    pub lost: u64,
    /// The highest stream a request began on: client streams only grow, so
    /// an answer's frame above it is for a request not seen yet.
    last_request_stream: u32,
    /// Answer frames (with their times) that came before their request's
    /// HEADERS: the calls' records come from different threads (Go reads
    /// answers on a goroutine of its own), so a read may be reported before
    /// the write it answers. Applied when the request comes; at most
    /// [`MAX_EARLY_FRAMES`], the oldest over it counted lost.
    early: Vec<(u64, u64, Frame)>,
}

/// Answer frames held for requests not seen yet, per connection.
const MAX_EARLY_FRAMES: usize = 16;

impl std::fmt::Debug for H2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2")
            .field("streams", &self.streams.keys().collect::<Vec<_>>())
            .field("requests", &self.requests)
            .field("lost", &self.lost)
            .field("undecodable", &self.undecodable)
            .finish_non_exhaustive()
    }
}

impl H2 {
    /// From the first call of either direction: the client's preface, or a
    /// server's SETTINGS frame written before it read the preface.
    pub fn new(from_start: bool) -> Self {
        H2 {
            dirs: [Direction::new(PREFACE.len()), Direction::new(0)],
            streams: BTreeMap::new(),
            from_start,
            requests: 0,
            goaways: 0,
            server_goaway: None,
            resets: 0,
            undecodable: 0,
            lost: 0,
            last_request_stream: 0,
            early: Vec::new(),
        }
    }

    /// A connection first seen mid-way (no preface): each direction out of
    /// step until a call starts with a plausible frame header; streams are
    /// not numbered.
    pub fn midstream() -> Self {
        let mut h = H2::new(false);
        h.dirs[0].reader = Reader::new(0);
        for d in &mut h.dirs {
            d.reader.lost = true;
        }
        h
    }

    /// Takes one call's bytes; returns the streams it ended.
    pub fn feed(&mut self, ev: &PlaintextEvent, outbound: bool) -> Vec<Exchange> {
        let wrote = ev.op == op::WRITE;
        let request_dir = wrote == outbound;
        let d = usize::from(!request_dir);
        // A client's request starts at its write's entry and its answer at
        // its read's return; a server's the other way round.
        let t = match (request_dir, outbound) {
            (true, true) | (false, false) => ev.entry_ns,
            _ => ev.ret_ns,
        };
        let (first, second) = pieces(ev);
        let seen = first.len() + second.map_or(0, <[u8]>::len);
        let mut items = Vec::new();
        let dir = &mut self.dirs[d];
        let was_lost = dir.reader.lost;
        dir.reader.resync(first);
        dir.reader.bytes(first, &mut items);
        dir.reader
            .unseen(ev.len as usize - seen.min(ev.len as usize), &mut items);
        if let Some(s) = second {
            dir.reader.bytes(s, &mut items);
        }
        if dir.reader.lost && !was_lost {
            self.lost += 1;
        }
        let frames = self.frames(d, items);
        let mut done = Vec::new();
        for f in frames {
            self.apply(request_dir, t, ev.ret_ns, f, &mut done);
        }
        done
    }

    /// Holds an answer's frame until its request comes (see `early`).
    fn hold_early(&mut self, t: u64, end_t: u64, f: Frame) {
        if self.early.len() >= MAX_EARLY_FRAMES {
            self.early.remove(0);
            self.lost += 1;
        }
        self.early.push((t, end_t, f));
    }

    /// The held answer frames of `stream`, whose request just began, in the
    /// order they came.
    fn apply_early(&mut self, stream: u32, done: &mut Vec<Exchange>) {
        if !self.early.iter().any(|(_, _, f)| f.stream == stream) {
            return;
        }
        let (mine, rest) = std::mem::take(&mut self.early)
            .into_iter()
            .partition(|(_, _, f)| f.stream == stream);
        self.early = rest;
        for (t, end_t, f) in mine {
            self.apply(false, t, end_t, f, done);
        }
    }

    /// Items to whole frames, header blocks decoded.
    fn frames(&mut self, d: usize, items: Vec<Item<'_>>) -> Vec<Frame> {
        let dir = &mut self.dirs[d];
        let mut out = Vec::new();
        for item in items {
            match item {
                Item::Start {
                    kind,
                    flags,
                    stream,
                    len,
                } => {
                    dir.frame = Some(Frame {
                        kind,
                        flags,
                        stream,
                        len,
                        whole: true,
                        ..Frame::default()
                    });
                }
                Item::Payload(b) => {
                    if let Some(f) = &mut dir.frame {
                        let room = match f.kind {
                            HEADERS | CONTINUATION => MAX_BLOCK,
                            DATA => DATA_KEEP,
                            _ => KEEP_SMALL,
                        };
                        if f.kind == DATA {
                            grpc::add_seen(&mut f.pieces, b);
                        }
                        let n = room.saturating_sub(f.kept.len()).min(b.len());
                        f.kept.extend_from_slice(&b[..n]);
                        if matches!(f.kind, HEADERS | CONTINUATION) && n < b.len() {
                            f.whole = false;
                        }
                    }
                }
                Item::Unseen(n) => {
                    if let Some(f) = &mut dir.frame {
                        f.whole = false;
                        if f.kind == DATA {
                            grpc::add_unseen(&mut f.pieces, n);
                        }
                    }
                }
                Item::Lost => {
                    // Header blocks among the uncopied bytes moved the table.
                    dir.forget_table();
                    dir.block = None;
                }
                Item::End => {
                    let Some(f) = dir.frame.take() else { continue };
                    if let Some(w) = Self::block(dir, f, &mut self.undecodable) {
                        out.push(w);
                    }
                }
            }
        }
        out
    }

    /// Header blocks across HEADERS and CONTINUATION, decoded in order so the
    /// table stays in step; other frames pass.
    fn block(dir: &mut Direction, mut f: Frame, undecodable: &mut u64) -> Option<Frame> {
        match f.kind {
            HEADERS => {
                let mut b: &[u8] = &f.kept;
                let mut pad = 0;
                if f.flags & PADDED != 0 {
                    pad = usize::from(*b.first()?);
                    b = &b[1..];
                }
                if f.flags & PRIORITY != 0 {
                    b = b.get(5..).unwrap_or(&[]);
                }
                let b = &b[..b.len().saturating_sub(pad)];
                dir.block = Some((f.stream, f.flags, b.to_vec(), f.whole));
            }
            CONTINUATION => {
                if let Some((_, _, block, whole)) = &mut dir.block {
                    block.extend_from_slice(&f.kept);
                    *whole &= f.whole;
                }
            }
            _ => {
                if f.kind == DATA && f.flags & PADDED != 0 && !f.kept.is_empty() {
                    // The pad length byte; the padding itself is not events.
                    let pad = usize::from(f.kept.remove(0));
                    if f.whole {
                        f.kept.truncate(f.kept.len().saturating_sub(pad));
                    }
                }
                return Some(f);
            }
        };
        if f.flags & END_HEADERS == 0 {
            return None;
        }
        let (stream, flags, block, whole) = dir.block.take()?;
        let fields = if whole {
            dir.hpack.decode(&block).ok()
        } else {
            None
        };
        let mut partial = false;
        if fields.is_none() {
            // What the block added to the peer's table is not known.
            dir.forget_table();
            *undecodable += 1;
        }
        // A whole block that named entries we never saw still tells its
        // static and literal fields (the method, path, status...).
        let fields = fields.or_else(|| {
            let p = whole.then(|| hpack_partial::walk(&block)).flatten()?;
            partial = !p.fields.is_empty();
            partial.then_some(p.fields)
        });
        Some(Frame {
            kind: HEADERS,
            flags,
            stream,
            len: f.len,
            kept: Vec::new(),
            whole,
            pieces: Vec::new(),
            fields,
            partial,
        })
    }

    fn apply(&mut self, request_dir: bool, t: u64, end_t: u64, f: Frame, done: &mut Vec<Exchange>) {
        let frame_bytes = (f.len + 9) as u64;
        match f.kind {
            GOAWAY => {
                self.goaway(request_dir, end_t, &f, done);
                return;
            }
            RST_STREAM => {
                self.reset_stream(end_t, &f, done);
                return;
            }
            DATA | HEADERS => {}
            _ => return,
        }
        if f.stream == 0 {
            return;
        }
        if request_dir && f.kind == HEADERS && !self.streams.contains_key(&f.stream) {
            self.begin_stream(t, end_t, &f, frame_bytes, done);
            return;
        }
        // On a connection first seen mid-way, answers before its first
        // request seen are to streams begun before us: never held.
        let requests_seen = self.from_start || self.last_request_stream != 0;
        if !request_dir && f.stream % 2 == 1 && f.stream > self.last_request_stream && requests_seen
        {
            self.hold_early(t, end_t, f);
            return;
        }
        let Some(x) = self.streams.get_mut(&f.stream) else {
            return;
        };
        if request_dir {
            Self::request_frame(x, &f, frame_bytes);
            return;
        }
        x.response_bytes += frame_bytes;
        x.last_ns = end_t;
        if f.kind == HEADERS {
            Self::response_headers(x, &f, t);
        } else {
            Self::response_data(x, &f, t);
        }
        if f.flags & END_STREAM != 0 && x.response.is_some() {
            x.complete = true;
            if let Some(x) = self.streams.remove(&f.stream) {
                done.push(x);
            }
        }
    }

    /// GOAWAY: the streams above the last one the sender processed end.
    fn goaway(&mut self, request_dir: bool, end_t: u64, f: &Frame, done: &mut Vec<Exchange>) {
        self.goaways += 1;
        let last = f.kept.get(..4).map_or(u32::MAX, |b| {
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
        });
        if !request_dir {
            self.server_goaway = Some(last);
        }
        // Streams above the last one the sender processed never will
        // be: they end here. A server's GOAWAY names client streams,
        // whose ids are odd.
        let gone: Vec<u32> = self
            .streams
            .range(last.saturating_add(1)..)
            .map(|(k, _)| *k)
            .collect();
        for id in gone {
            if let Some(mut x) = self.streams.remove(&id) {
                x.error = Some("goaway");
                x.last_ns = x.last_ns.max(end_t);
                done.push(x);
            }
        }
    }

    /// RST_STREAM: the stream ends with the error code it names.
    #[inline]
    fn reset_stream(&mut self, end_t: u64, f: &Frame, done: &mut Vec<Exchange>) {
        self.resets += 1;
        if let Some(mut x) = self.streams.remove(&f.stream) {
            x.error = Some("reset_stream");
            x.reset_code = f
                .kept
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            x.last_ns = x.last_ns.max(end_t);
            done.push(x);
        }
    }

    /// A request's HEADERS on a new stream: the exchange begins (or ends at
    /// once when begun after the server's GOAWAY).
    fn begin_stream(
        &mut self,
        t: u64,
        end_t: u64,
        f: &Frame,
        frame_bytes: u64,
        done: &mut Vec<Exchange>,
    ) {
        self.requests += 1;
        let head = f.fields.as_ref().map(|fields| request_head(fields));
        let (api, call) = head
            .as_ref()
            .and_then(|h| h.path.as_deref())
            .and_then(gen_ai::call_for)
            .map_or((None, None), |(kind, mut call)| {
                call.start_request(false);
                (Some(kind), Some(Box::new(call)))
            });
        let rpc = head
            .as_ref()
            .filter(|h| grpc::is_grpc(h.content_type.as_deref()))
            .map(|h| Box::new(Rpc::new(h.path.as_deref())));
        let mut x = Exchange {
            index: self.from_start.then_some(self.requests),
            stream_id: Some(f.stream),
            headers_undecodable: f.fields.is_none() || f.partial,
            request: head,
            start_ns: t,
            last_ns: end_t,
            request_bytes: frame_bytes,
            api,
            call,
            rpc,
            ..Exchange::default()
        };
        self.last_request_stream = self.last_request_stream.max(f.stream);
        if self.server_goaway.is_some_and(|last| f.stream > last) {
            // Begun after the server's GOAWAY: it will never be answered.
            x.error = Some("goaway");
            done.push(x);
        } else {
            self.streams.insert(f.stream, x);
            self.apply_early(f.stream, done);
        }
    }

    /// A later request frame of an open stream: its bytes, and its body to
    /// the API call and the gRPC request message.
    #[inline]
    fn request_frame(x: &mut Exchange, f: &Frame, frame_bytes: u64) {
        x.request_bytes += frame_bytes;
        if let (DATA, Some(c)) = (f.kind, &mut x.call) {
            feed_pieces(&f.pieces, |b, gap| c.request_bytes(b, gap));
        }
        if let (DATA, Some(rpc)) = (f.kind, &mut x.rpc) {
            rpc.messages[0].feed(&f.pieces);
        }
    }

    /// The answer's HEADERS: gRPC status, and the response head unless it
    /// is an interim (1xx) one.
    #[inline]
    fn response_headers(x: &mut Exchange, f: &Frame, t: u64) {
        if f.fields.is_none() || f.partial {
            x.headers_undecodable = true;
        }
        if let (Some(rpc), Some(fields)) = (&mut x.rpc, &f.fields) {
            rpc.answer_fields(
                field(fields, b"grpc-status"),
                field(fields, b"grpc-message"),
            );
        }
        if x.response.is_none() {
            let h = f.fields.as_ref().map(|fields| response_head(fields));
            let interim = h
                .as_ref()
                .and_then(|h| h.status)
                .is_some_and(|s| (100..200).contains(&s));
            if !interim {
                x.first_byte_ns = t;
                let sse =
                    h.as_ref().and_then(|h| h.content_type.as_deref()) == Some("text/event-stream");
                if sse {
                    x.stream = Some(Stream {
                        events: Some(0),
                        ..Stream::default()
                    });
                }
                if let Some(c) = &mut x.call {
                    c.start_response(sse, false);
                }
                x.response = h.or(Some(Head::empty(None)));
            }
        }
    }

    /// The answer's DATA: to the event stream, the API call and the gRPC
    /// response message.
    #[inline]
    fn response_data(x: &mut Exchange, f: &Frame, t: u64) {
        if x.response.is_none() {
            // Its head was among bytes not seen: an answer, with no
            // first byte or fields to give.
            x.headers_undecodable = true;
            x.response = Some(Head::empty(None));
            if let Some(c) = &mut x.call {
                // Read as JSON documents, from where it can be.
                c.start_response(false, false);
                c.response_bytes(&[], true, t);
            }
        }
        let body = &f.kept;
        if let Some(s) = &mut x.stream {
            s.read(body, f.whole && f.len <= DATA_KEEP, t);
            s.mark_end(body);
        }
        if let Some(c) = &mut x.call {
            feed_pieces(&f.pieces, |b, gap| c.response_bytes(b, gap, t));
        }
        if let Some(rpc) = &mut x.rpc {
            if rpc.messages[1].feed(&f.pieces) && rpc.first_message_ns == 0 {
                rpc.first_message_ns = t;
            }
        }
    }

    /// The streams begun and not ended.
    pub fn streams(&self) -> impl Iterator<Item = &Exchange> {
        self.streams.values()
    }

    /// Streams begun and not ended.
    pub fn has_open_streams(&self) -> bool {
        !self.streams.is_empty()
    }

    pub fn counts(&self) -> H2Counts {
        H2Counts {
            streams: self.requests,
            resets: self.resets,
            goaways: self.goaways,
            undecodable_headers: self.undecodable,
            out_of_step: self.lost,
        }
    }

    /// The connection closed: streams in flight end.
    pub fn close(&mut self) -> Vec<Exchange> {
        std::mem::take(&mut self.streams).into_values().collect()
    }
}

/// Whether bytes that start with a HEADERS frame carry a request (its block
/// opens with `:method`, `:path`, `:scheme` or `:authority`: true) or an
/// answer (`:status`: false), read from the first field's static index
/// (pseudo-header fields come first, and name themselves by index in every
/// encoder seen). None: not a HEADERS frame, or not telling.
pub(super) fn headers_of_request(b: &[u8]) -> Option<bool> {
    if b.len() < 10 || b[3] != HEADERS {
        return None;
    }
    let mut at = 9;
    if b[4] & PADDED != 0 {
        at += 1;
    }
    if b[4] & PRIORITY != 0 {
        at += 5;
    }
    let first = *b.get(at)?;
    let index = match first {
        // Indexed field; literal with incremental indexing.
        _ if first & 0x80 != 0 => first & 0x7f,
        _ if first & 0xc0 == 0x40 => first & 0x3f,
        // A dynamic table size update first: not telling.
        _ if first & 0xe0 == 0x20 => return None,
        // Literal without indexing, or never indexed.
        _ => first & 0x0f,
    };
    match index {
        1..=7 => Some(true),
        8..=14 => Some(false),
        _ => None,
    }
}

fn text(v: &[u8]) -> Option<String> {
    std::str::from_utf8(v).ok().map(str::to_owned)
}

fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &[u8]) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k.as_slice() == name)
        .map(|(_, v)| v.as_slice())
}

fn request_head(fields: &[(Vec<u8>, Vec<u8>)]) -> Head {
    let target = field(fields, b":path").and_then(text);
    let (path, query) = match target {
        Some(t) => match t.split_once('?') {
            Some((p, q)) => (Some(p.to_owned()), Some(q.to_owned())),
            None => (Some(t), None),
        },
        None => (None, None),
    };
    Head {
        method: field(fields, b":method").and_then(text),
        path,
        query,
        host: field(fields, b":authority")
            .or_else(|| field(fields, b"host"))
            .and_then(text),
        content_type: field(fields, b"content-type").and_then(text),
        traceparent: field(fields, b"traceparent").and_then(TraceParent::parse),
        tracestate: field(fields, b"tracestate").and_then(tracestate),
        request_id: field(fields, b"x-request-id")
            .filter(|v| v.len() <= 128)
            .and_then(text),
        ..Head::empty(None)
    }
}

fn response_head(fields: &[(Vec<u8>, Vec<u8>)]) -> Head {
    Head {
        status: field(fields, b":status").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()),
        content_type: field(fields, b"content-type").and_then(text),
        ..Head::empty(None)
    }
}

/// A DATA frame's payload as it was seen: the bytes copied, with a gap
/// wherever some were not.
fn feed_pieces(pieces: &[Piece], mut feed: impl FnMut(&[u8], bool)) {
    let mut gap = false;
    for p in pieces {
        match p {
            Piece::Seen(b) => {
                feed(b, gap);
                gap = false;
            }
            Piece::Unseen(_) => gap = true,
        }
    }
    if gap {
        feed(&[], true);
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{http::DATA_FROM_START, Conn};

    use super::*;
    use crate::http::Conversation;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn call(op: u8, t: u64, bytes: &[u8]) -> PlaintextEvent {
        PlaintextEvent::of_call(Conn::default(), op, t, bytes, DATA_FROM_START)
    }

    struct Peer(loona_hpack::Encoder<'static>);

    impl Peer {
        fn new() -> Self {
            Peer(loona_hpack::Encoder::new())
        }
        fn headers(&mut self, stream: u32, flags: u8, fields: &[(&str, &str)]) -> Vec<u8> {
            let block = self
                .0
                .encode(fields.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
            frame(HEADERS, flags | END_HEADERS, stream, &block)
        }
    }

    fn get(path: &str) -> Vec<(&'static str, String)> {
        vec![
            (":method", "GET".into()),
            (":scheme", "https".into()),
            (":authority", "example.test".into()),
            (":path", path.into()),
        ]
    }

    fn fields<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        v.iter().map(|(k, x)| (*k, x.as_str())).collect()
    }

    /// A server's streams in flight are each a request it serves (proxy
    /// linking's candidates), by stream id, until answered in any order.
    #[test]
    fn a_servers_streams_in_flight_are_each_served() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut got = PREFACE.to_vec();
        got.extend(frame(SETTINGS, 0, 0, &[]));
        got.extend(req.headers(1, END_STREAM, &fields(&get("/a"))));
        got.extend(req.headers(3, END_STREAM, &fields(&get("/b"))));
        assert!(c.feed(&call(op::READ, 1_000, &got), false).is_empty());
        assert!(c.serves());
        let served: Vec<(u32, Option<&str>, u64)> = c
            .serving(Some(7))
            .iter()
            .map(|(p, x)| (*p, x.asked.path, x.answered_ns))
            .collect();
        assert_eq!(served, [(1, Some("/a"), 0), (3, Some("/b"), 0)]);
        assert_eq!(c.serving(Some(7))[0].1.asked.tid, Some(7));
        // Stream 3 answered first: stream 1 alone is served.
        let back = resp.headers(3, END_STREAM, &[(":status", "200")]);
        assert_eq!(c.feed(&call(op::WRITE, 2_000, &back), false).len(), 1);
        let left: Vec<u32> = c.serving(None).iter().map(|(p, _)| *p).collect();
        assert_eq!(left, [1]);
        let back = resp.headers(1, END_STREAM, &[(":status", "200")]);
        assert_eq!(c.feed(&call(op::WRITE, 3_000, &back), false).len(), 1);
        assert!(!c.serves() && c.serving(None).is_empty());
    }

    /// A client (outbound) with two streams on one connection: one answered,
    /// one reset by the server; each its own exchange with its own times.
    #[test]
    fn two_streams_from_the_client_and_a_reset() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut out = PREFACE.to_vec();
        out.extend(frame(SETTINGS, 0, 0, &[]));
        let asked = req.headers(1, END_STREAM, &fields(&get("/a?x=1")));
        out.extend(&asked);
        assert!(c.feed(&call(op::WRITE, 1_000, &out), true).is_empty());
        let out = req.headers(3, END_STREAM, &fields(&get("/b")));
        assert!(c.feed(&call(op::WRITE, 2_000, &out), true).is_empty());
        let mut back = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let head = resp.headers(
            1,
            0,
            &[
                (":status", "200"),
                ("content-type", "text/plain; charset=utf-8"),
            ],
        );
        back.extend(&head);
        assert!(c.feed(&call(op::READ, 250_000, &back), true).is_empty());
        let mut back = frame(DATA, END_STREAM, 1, b"hello");
        back.extend(frame(RST_STREAM, 0, 3, &8u32.to_be_bytes()));
        let done = c.feed(&call(op::READ, 300_000, &back), true);
        assert_eq!(done.len(), 2);
        let a = &done[0];
        assert_eq!((a.stream_id, a.index), (Some(1), Some(1)));
        let h = a.request.as_ref().expect("decoded");
        assert_eq!(h.method.as_deref(), Some("GET"));
        assert_eq!(h.path.as_deref(), Some("/a"));
        assert_eq!(h.query.as_deref(), Some("x=1"));
        assert_eq!(h.host.as_deref(), Some("example.test"));
        let r = a.response.as_ref().expect("decoded");
        assert_eq!(r.status, Some(200));
        assert_eq!(r.content_type.as_deref(), Some("text/plain; charset=utf-8"));
        assert_eq!(a.start_ns, 1_000);
        assert_eq!(a.first_byte_ns, 250_010);
        assert_eq!(a.last_ns, 300_010);
        assert!(a.complete);
        assert_eq!(a.request_bytes, asked.len() as u64);
        assert_eq!(a.response_bytes, (head.len() + 9 + 5) as u64);
        let b = &done[1];
        assert_eq!((b.stream_id, b.index), (Some(3), Some(2)));
        assert_eq!(
            b.request.as_ref().and_then(|h| h.path.as_deref()),
            Some("/b")
        );
        assert_eq!((b.error, b.reset_code), (Some("reset_stream"), Some(8)));
        assert!(!b.complete);
        assert_eq!(c.h2.as_ref().map(|h| h.resets), Some(1));
    }

    /// A client whose answer is reported before its request (the read on
    /// one thread returned, and was reported, before the write on another):
    /// the answer is held until the request comes, one exchange whole.
    #[test]
    fn an_answer_reported_before_its_request() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut out = PREFACE.to_vec();
        out.extend(frame(SETTINGS, 0, 0, &[]));
        out.extend(req.headers(1, END_STREAM, &fields(&get("/a"))));
        assert!(c.feed(&call(op::WRITE, 1_000, &out), true).is_empty());
        let back = resp.headers(1, END_STREAM, &[(":status", "200")]);
        assert_eq!(c.feed(&call(op::READ, 250_000, &back), true).len(), 1);
        // Stream 3: its answer's read is reported first.
        let mut back = resp.headers(3, 0, &[(":status", "201")]);
        back.extend(frame(DATA, END_STREAM, 3, b"late"));
        assert!(c.feed(&call(op::READ, 400_000, &back), true).is_empty());
        let asked = req.headers(3, END_STREAM, &fields(&get("/b")));
        let done = c.feed(&call(op::WRITE, 300_000, &asked), true);
        assert_eq!(done.len(), 1, "{done:?}");
        let b = &done[0];
        assert_eq!(b.stream_id, Some(3));
        assert_eq!(
            b.request.as_ref().and_then(|h| h.path.as_deref()),
            Some("/b")
        );
        assert_eq!(b.response.as_ref().and_then(|r| r.status), Some(201));
        assert!(b.complete);
        assert_eq!((b.start_ns, b.first_byte_ns), (300_000, 400_010));
        assert_eq!(c.h2.as_ref().map(|h| h.lost), Some(0));
    }

    /// A connection first seen mid-way: answers to the streams begun before
    /// the observer are not held for requests that will never be seen (they
    /// would push out held answers and count as lost).
    #[test]
    fn answers_to_streams_begun_before_us_are_not_held() {
        let mut h = H2::midstream();
        let mut resp = Peer::new();
        for s in 0..20u32 {
            let back = resp.headers(2 * s + 1, END_STREAM, &[(":status", "200")]);
            assert!(h
                .feed(&call(op::READ, 1_000 + u64::from(s), &back), true)
                .is_empty());
        }
        assert_eq!(h.lost, 0);
        assert!(h.early.is_empty());
    }

    /// A server (inbound) streaming a chat completion as server-sent events
    /// over HTTP/2: times from its own calls, the API's fields from the
    /// request body and the events.
    #[test]
    fn a_streamed_chat_completion_on_the_server() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let body = br#"{"model":"tiny","stream":true,"messages":[]}"#;
        let mut got = PREFACE.to_vec();
        got.extend(req.headers(
            1,
            0,
            &[
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", "llm"),
                (":path", "/v1/chat/completions"),
                ("content-type", "application/json"),
            ],
        ));
        got.extend(frame(DATA, END_STREAM, 1, body));
        assert!(c.feed(&call(op::READ, 1_000, &got), false).is_empty());
        let head = resp.headers(
            1,
            0,
            &[(":status", "200"), ("content-type", "text/event-stream")],
        );
        c.feed(&call(op::WRITE, 300_000, &head), false);
        for i in 0..3u64 {
            let ev = format!("data: {{\"model\":\"tiny-v2\",\"choices\":[{{\"delta\":{{\"content\":\"w{i}\"}}}}]}}\n\n");
            c.feed(
                &call(
                    op::WRITE,
                    340_000 + i * 40_000,
                    &frame(DATA, 0, 1, ev.as_bytes()),
                ),
                false,
            );
        }
        let last = frame(
            DATA,
            END_STREAM,
            1,
            b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
        );
        let done = c.feed(&call(op::WRITE, 500_000, &last), false);
        assert_eq!(done.len(), 1);
        let x = &done[0];
        // A server's request starts when its read returns, its answer at
        // its write's entry.
        assert_eq!((x.start_ns, x.first_byte_ns), (1_010, 300_000));
        let c = x.call.as_deref().expect("an LLM call");
        assert_eq!(x.api, Some(("openai", "chat")));
        assert_eq!(c.request_model.as_deref(), Some("tiny"));
        assert_eq!(c.response_model.as_deref(), Some("tiny-v2"));
        assert_eq!((c.input_tokens, c.output_tokens), (Some(5), Some(3)));
        assert_eq!(c.first_content_ns, 340_000);
        let s = x.stream.as_ref().expect("an event stream");
        assert_eq!(s.events, Some(5));
        assert_eq!((s.first_ns, s.gap_max_ns), (340_000, 80_000));
        assert_eq!(x.request_bytes, (got.len() - PREFACE.len()) as u64);
    }

    /// A read longer than what is copied: frame lengths carry the reader
    /// across the middle when it falls inside one frame's payload.
    #[test]
    fn the_uncopied_middle_of_a_large_data_frame_is_skipped_in_step() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut out = PREFACE.to_vec();
        out.extend(req.headers(1, END_STREAM, &fields(&get("/big"))));
        out.extend(req.headers(3, END_STREAM, &fields(&get("/small"))));
        c.feed(&call(op::WRITE, 1_000, &out), true);
        let mut back = resp.headers(1, 0, &[(":status", "200")]);
        back.extend(frame(DATA, 0, 1, &[7u8; 3000]));
        back.extend(frame(DATA, END_STREAM, 1, b"end"));
        back.extend(resp.headers(3, END_STREAM, &[(":status", "404")]));
        assert!(back.len() > observer_common::http::DATA_CAPTURE);
        let done = c.feed(&call(op::READ, 9_000, &back), true);
        let ids: Vec<_> = done
            .iter()
            .map(|x| (x.stream_id, x.response.as_ref().and_then(|h| h.status)))
            .collect();
        assert_eq!(ids, [(Some(1), Some(200)), (Some(3), Some(404))]);
        assert!(done.iter().all(|x| x.complete && !x.headers_undecodable));
        assert_eq!(c.h2.as_ref().map(|h| (h.lost, h.undecodable)), Some((0, 0)));
    }

    /// A frame header in the uncopied middle: the reader is out of step until
    /// a call starts with a frame, and from there the answer's header blocks
    /// are undecodable whole (the table moved unseen): what they tell by the
    /// static table and literals is kept (stream 5's status, a literal with
    /// a static name), the field naming a lost entry never guessed.
    #[test]
    fn lost_frames_leave_later_headers_undecodable() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut out = PREFACE.to_vec();
        for id in [1, 3, 5] {
            out.extend(req.headers(id, END_STREAM, &fields(&get(&format!("/s{id}")))));
        }
        c.feed(&call(op::WRITE, 1_000, &out), true);
        let mut back = resp.headers(1, 0, &[(":status", "200")]);
        for _ in 0..60 {
            back.extend(frame(DATA, 0, 1, &[1u8; 10]));
        }
        back.extend(resp.headers(3, 0, &[(":status", "201"), ("x-new", "indexed")]));
        for _ in 0..60 {
            back.extend(frame(DATA, 0, 1, &[1u8; 10]));
        }
        assert!(c.feed(&call(op::READ, 9_000, &back), true).is_empty());
        let mut rest = frame(DATA, END_STREAM, 1, b"a");
        rest.extend(frame(DATA, END_STREAM, 3, b"b"));
        rest.extend(resp.headers(5, END_STREAM, &[(":status", "202"), ("x-new", "indexed")]));
        let done = c.feed(&call(op::READ, 10_000, &rest), true);
        let h2 = c.h2.as_ref().expect("h2");
        assert_eq!((h2.lost, h2.undecodable), (1, 1));
        let got: Vec<_> = done
            .iter()
            .map(|x| {
                (
                    x.stream_id,
                    x.response.as_ref().and_then(|h| h.status),
                    x.headers_undecodable,
                    x.first_byte_ns,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some(1), Some(200), false, 9_010),
                (Some(3), None, true, 0),
                (Some(5), Some(202), true, 10_010),
            ]
        );
    }

    /// GOAWAY ends the streams above the last one the sender processed.
    #[test]
    fn goaway_ends_the_streams_it_refused() {
        let mut c = Conversation::default();
        let mut req = Peer::new();
        let mut out = PREFACE.to_vec();
        for id in [1, 3] {
            out.extend(req.headers(id, END_STREAM, &fields(&get("/"))));
        }
        c.feed(&call(op::WRITE, 1_000, &out), true);
        let mut away = 1u32.to_be_bytes().to_vec();
        away.extend(0u32.to_be_bytes());
        let done = c.feed(&call(op::READ, 5_000, &frame(GOAWAY, 0, 0, &away)), true);
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].stream_id, done[0].error),
            (Some(3), Some("goaway"))
        );
        let left = c.close();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.stream_id, Some(1));
        assert!(left[0].1.is_some());
    }

    /// The `openai` SDK stops reading an HTTP/2 stream at `data: [DONE]`:
    /// the END_STREAM frame after it is never read, and the connection
    /// closes with the stream open. Its answer was whole all the same.
    #[test]
    fn an_event_stream_ended_by_done_is_whole_without_end_stream() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let mut out = PREFACE.to_vec();
        out.extend(req.headers(1, END_STREAM, &fields(&get("/v1/chat/completions"))));
        c.feed(&call(op::WRITE, 1_000, &out), true);
        let mut back = resp.headers(
            1,
            0,
            &[(":status", "200"), ("content-type", "text/event-stream")],
        );
        back.extend(frame(
            DATA,
            0,
            1,
            b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n",
        ));
        assert!(c.feed(&call(op::READ, 9_000, &back), true).is_empty());
        let (x, cut) = c.close().pop().expect("open at close");
        assert_eq!(cut, None);
        assert!(x.stream.is_some_and(|s| s.finished && s.events == Some(2)));
    }

    /// A stream begun after the server's GOAWAY (the client had not read it
    /// yet) will never be answered: it ends at once with "goaway".
    #[test]
    fn a_stream_begun_after_goaway() {
        let mut c = Conversation::default();
        let mut req = Peer::new();
        let mut out = PREFACE.to_vec();
        out.extend(req.headers(1, END_STREAM, &fields(&get("/a"))));
        c.feed(&call(op::WRITE, 1_000, &out), true);
        let mut away = 1u32.to_be_bytes().to_vec();
        away.extend(0u32.to_be_bytes());
        assert!(c
            .feed(&call(op::READ, 5_000, &frame(GOAWAY, 0, 0, &away)), true)
            .is_empty());
        let late = req.headers(3, END_STREAM, &fields(&get("/late")));
        let done = c.feed(&call(op::WRITE, 6_000, &late), true);
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].stream_id, done[0].error),
            (Some(3), Some("goaway"))
        );
        assert_eq!(c.close().len(), 1, "stream 1 is still in flight");
    }

    /// nginx writes its SETTINGS as soon as the handshake is done, before it
    /// reads the client's preface: the server's streams are still timed.
    #[test]
    fn a_server_that_speaks_first() {
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 128]);
        assert!(c.feed(&call(op::WRITE, 500, &settings), false).is_empty());
        let mut got = PREFACE.to_vec();
        got.extend(frame(SETTINGS, 0, 0, &[]));
        got.extend(req.headers(1, END_STREAM, &fields(&get("/x"))));
        c.feed(&call(op::READ, 1_000, &got), false);
        let mut back = frame(SETTINGS, 1, 0, &[]);
        back.extend(resp.headers(1, END_STREAM, &[(":status", "204")]));
        let done = c.feed(&call(op::WRITE, 7_000, &back), false);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].response.as_ref().and_then(|h| h.status), Some(204));
        assert_eq!((done[0].start_ns, done[0].first_byte_ns), (1_010, 7_000));
        assert_eq!(c.orphans, 0);
    }

    /// Bytes that only looked like a server's SETTINGS: no preface follows,
    /// nothing is made of them.
    #[test]
    fn no_preface_no_streams() {
        let mut c = Conversation::default();
        c.feed(&call(op::WRITE, 500, &frame(SETTINGS, 0, 0, &[])), false);
        let mut req = Peer::new();
        // As long as the preface and starting like it: skipped blindly, the
        // HEADERS after it would make a stream.
        let mut got = b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n".to_vec();
        assert_eq!(got.len(), PREFACE.len());
        got.extend(req.headers(1, END_STREAM, &fields(&get("/x"))));
        c.feed(&call(op::READ, 1_000, &got), false);
        assert!(c.close().is_empty());
    }

    fn grpc_message(body: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend((body.len() as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A gRPC client (outbound): a server-streaming call with trailers and a
    /// trailers-only failure on one connection; the `rpc` objects, then the
    /// RPC conventions' span and metric.
    #[test]
    fn grpc_calls_to_records_spans_and_metrics() {
        use crate::{
            clock::Clock,
            export::{attrs::Ids, metrics::Metrics, spans::request_spans},
            http::RequestRecord,
            record::{ConnRecord, State},
        };
        let mut c = Conversation::default();
        let (mut req, mut resp) = (Peer::new(), Peer::new());
        let call_fields = |method: &str| {
            vec![
                (":method", "POST".to_owned()),
                (":scheme", "http".into()),
                (":authority", "127.0.0.1:50051".into()),
                (":path", format!("/helloworld.Greeter/{method}")),
                ("content-type", "application/grpc".into()),
                ("te", "trailers".into()),
            ]
        };
        let mut out = PREFACE.to_vec();
        out.extend(req.headers(1, 0, &fields(&call_fields("Many"))));
        // One message split across two DATA frames.
        let m = grpc_message(b"hello there");
        out.extend(frame(DATA, 0, 1, &m[..3]));
        out.extend(frame(DATA, END_STREAM, 1, &m[3..]));
        out.extend(req.headers(3, 0, &fields(&call_fields("Fail"))));
        out.extend(frame(DATA, END_STREAM, 3, &grpc_message(b"")));
        assert!(c.feed(&call(op::WRITE, 1_000, &out), true).is_empty());
        let ok = [(":status", "200"), ("content-type", "application/grpc")];
        let mut back = resp.headers(1, 0, &ok);
        back.extend(frame(DATA, 0, 1, &grpc_message(b"one")));
        assert!(c.feed(&call(op::READ, 200_000, &back), true).is_empty());
        let mut two = grpc_message(b"two");
        two.extend(grpc_message(&[0u8; 40]));
        c.feed(&call(op::READ, 250_000, &frame(DATA, 0, 1, &two)), true);
        let failed = resp.headers(
            3,
            END_STREAM,
            &[
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "5"),
                ("grpc-message", "not%20found"),
            ],
        );
        let done = c.feed(&call(op::READ, 260_000, &failed), true);
        assert_eq!(done.len(), 1);
        let trailers = resp.headers(1, END_STREAM, &[("grpc-status", "0")]);
        let mut all = done;
        all.extend(c.feed(&call(op::READ, 300_000, &trailers), true));
        assert_eq!(all.len(), 2);
        let conn = ConnRecord::new(
            &observer_common::Conn::default(),
            None,
            &Clock::with_offset(0),
            State::Closed,
        );
        let clock = Clock::with_offset(0);
        let fail = RequestRecord::new(all[0].clone(), None, &conn, &clock, false);
        let many = RequestRecord::new(all[1].clone(), None, &conn, &clock, false);
        let rpc = fail.rpc.as_ref().expect("a gRPC call");
        assert_eq!(rpc.method.as_deref(), Some("Fail"));
        assert_eq!(
            (rpc.grpc_status, rpc.grpc_message.as_deref()),
            (Some(5), Some("not found"))
        );
        assert_eq!(
            (rpc.request_messages, rpc.response_messages),
            (Some(1), Some(0))
        );
        assert_eq!(rpc.time_to_first_message_ns, None);
        let rpc = many.rpc.as_ref().expect("a gRPC call");
        assert_eq!(rpc.service.as_deref(), Some("helloworld.Greeter"));
        assert_eq!(rpc.method.as_deref(), Some("Many"));
        assert_eq!(
            (rpc.grpc_status, rpc.grpc_message.as_deref()),
            (Some(0), None)
        );
        assert_eq!(
            (rpc.request_messages, rpc.response_messages),
            (Some(1), Some(3))
        );
        assert_eq!(rpc.time_to_first_message_ns, Some(199_010));
        assert_eq!(many.duration_ns, 299_010);

        let spans = request_spans(&fail, &mut Ids::new());
        assert_eq!(spans[0].name, "helloworld.Greeter/Fail");
        let attr = |k: &str| {
            spans[0]
                .attributes
                .iter()
                .find(|a| a.key == k)
                .map(|a| format!("{:?}", a.value))
        };
        assert_eq!(attr("rpc.system").as_deref(), Some("Str(\"grpc\")"));
        assert_eq!(attr("rpc.grpc.status_code").as_deref(), Some("Int(5)"));
        assert_eq!(
            spans[0].status.as_ref().map(|s| s.message.as_str()),
            Some("5"),
            "a client's non-OK status is an error"
        );
        let mut m = Metrics::new(100, 0);
        m.record_request(&many);
        m.record_request(&fail);
        let text = m.prometheus();
        assert!(
            text.contains("rpc_client_duration_milliseconds_bucket{rpc_grpc_status_code=\"0\",rpc_method=\"Many\""),
            "{text}"
        );
        assert!(!text.contains("http_client_request_duration"), "{text}");
    }

    /// Arbitrary bytes either way (a peer that is not HTTP/2, or copies cut
    /// anywhere) never panic the parser, HPACK decoder included.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..2_000u64 {
            let mut c = Conversation::default();
            let mut req = PREFACE.to_vec();
            let mut back = frame(SETTINGS, 0, 0, &[]);
            for _ in 0..8 {
                let len = (next() % 1500) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                // Plausible frame headers now and then, so frames are read.
                if next() % 2 == 0 && b.len() >= 9 {
                    b[..9].copy_from_slice(
                        &frame(HEADERS, next() as u8, 1 + 2 * (next() % 4) as u32, &[])[..9],
                    );
                    b[2] = (next() % 64) as u8;
                }
                if next() % 2 == 0 {
                    req.extend(&b);
                } else {
                    back.extend(&b);
                }
            }
            c.feed(&call(op::WRITE, round, &req), true);
            c.feed(&call(op::READ, round + 1, &back), true);
            c.close();
            // The same bytes on a connection first seen mid-way (no
            // preface; the role read from the bytes).
            let mut c = Conversation::default();
            for (op, b) in [(op::WRITE, &req[PREFACE.len()..]), (op::READ, &back[..])] {
                let mut ev = call(op, round, b);
                ev.flags = 0;
                ev.conn.flags = observer_common::FLAG_MIDSTREAM;
                c.feed(&ev, true);
            }
            c.close();
        }
    }
}
