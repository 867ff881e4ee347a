//! Protocol Buffers' wire format, written by hand for the OTLP messages the
//! exporter sends often (spans, `span_wire`; metrics, `metrics::wire`): each
//! message's length worked out before it is written, so the bytes go into one
//! buffer with no message values built first.

/// A message of `n` bytes as field `field`.
pub(crate) fn framed_len(field: u32, n: usize) -> usize {
    key_len(field) + varint_len(n as u64) + n
}

/// AnyValue, borrowed: a oneof, written even when it holds a default.
#[derive(Clone, Copy)]
pub(crate) enum AnyRef<'a> {
    Str(&'a str),
    Int(i64),
    Double(f64),
    Bool(bool),
}

impl AnyRef<'_> {
    pub(crate) fn body_len(self) -> usize {
        match self {
            AnyRef::Str(v) => framed_len(1, v.len()),
            AnyRef::Bool(_) => key_len(2) + 1,
            AnyRef::Int(v) => key_len(3) + varint_len(v as u64),
            AnyRef::Double(_) => key_len(4) + 8,
        }
    }

    pub(crate) fn write(self, buf: &mut Vec<u8>) {
        match self {
            AnyRef::Str(v) => {
                put_key(buf, 1, LEN);
                put_varint(buf, v.len() as u64);
                buf.extend_from_slice(v.as_bytes());
            }
            AnyRef::Bool(v) => {
                put_key(buf, 2, VARINT);
                buf.push(u8::from(v));
            }
            AnyRef::Int(v) => {
                put_key(buf, 3, VARINT);
                put_varint(buf, v as u64);
            }
            AnyRef::Double(v) => {
                put_key(buf, 4, FIXED64);
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// KeyValue's body: the key, then the value.
pub(crate) fn attr_body_len(key: &str, v: AnyRef<'_>) -> usize {
    bytes_len(1, key.as_bytes()) + framed_len(2, v.body_len())
}

pub(crate) fn attr_len(field: u32, key: &str, v: AnyRef<'_>) -> usize {
    framed_len(field, attr_body_len(key, v))
}

pub(crate) fn put_attr(buf: &mut Vec<u8>, field: u32, key: &str, v: AnyRef<'_>) {
    let any = v.body_len();
    let body = bytes_len(1, key.as_bytes()) + framed_len(2, any);
    // One reservation for the whole attribute: its bytes are then pushed
    // without growing the buffer midway.
    buf.reserve(framed_len(field, body));
    if body < 0x80 && field < 16 && !key.is_empty() {
        // Nearly every attribute: each key and length one byte, the
        // KeyValue's head and the AnyValue's written in two pieces.
        let tag = |f: u32| ((f << 3) | LEN) as u8;
        buf.extend_from_slice(&[tag(field), body as u8, tag(1), key.len() as u8]);
        buf.extend_from_slice(key.as_bytes());
        buf.extend_from_slice(&[tag(2), any as u8]);
        v.write(buf);
        return;
    }
    put_key(buf, field, LEN);
    put_varint(buf, body as u64);
    put_bytes(buf, 1, key.as_bytes());
    put_key(buf, 2, LEN);
    put_varint(buf, any as u64);
    v.write(buf);
}

// Protobuf wire format: a key is (field << 3) | wire type; the fields of a
// message go in field order, defaults (0, empty) left out as prost does.

pub(crate) const VARINT: u32 = 0;
pub(crate) const FIXED64: u32 = 1;
pub(crate) const LEN: u32 = 2;

pub(crate) fn varint_len(v: u64) -> usize {
    // ceil(bits / 7) without a division, as prost computes it.
    ((64 - (v | 1).leading_zeros() as usize) * 9 + 64) / 64
}

pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

pub(crate) fn key_len(field: u32) -> usize {
    varint_len(u64::from(field << 3))
}

pub(crate) fn put_key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from((field << 3) | wire));
}

pub(crate) fn bytes_len(field: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        key_len(field) + varint_len(b.len() as u64) + b.len()
    }
}

pub(crate) fn put_bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    if !b.is_empty() {
        put_key(buf, field, LEN);
        put_varint(buf, b.len() as u64);
        buf.extend_from_slice(b);
    }
}

pub(crate) fn varint_field_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + varint_len(v)
    }
}

pub(crate) fn put_varint_field(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(buf, field, VARINT);
        put_varint(buf, v);
    }
}

pub(crate) fn put_fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}
