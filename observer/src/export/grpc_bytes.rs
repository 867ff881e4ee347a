//! Unary gRPC calls whose request is already encoded: the exporter encodes a
//! batch once and sends the same bytes again on a retry, where the generated
//! clients would need the message itself (a deep copy per attempt). The
//! answer (an Export*ServiceResponse) is read and dropped.

use bytes::{Buf, BufMut, Bytes};
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    Status,
};

#[derive(Debug, Clone, Copy, Default)]
pub struct EncodedCodec;

#[derive(Debug, Clone, Copy, Default)]
pub struct EncodedEncoder;

#[derive(Debug, Clone, Copy, Default)]
pub struct DiscardDecoder;

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = EncodedEncoder;
    type Decoder = DiscardDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        DiscardDecoder
    }
}

impl Encoder for EncodedEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for DiscardDecoder {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}
