//! Content codings (gzip, brotli, zstd) as push codecs for a body that arrives frame by frame: input is
//! fed as it comes, output is taken in pieces of at most [`PIECE`] bytes, so neither a large body nor a
//! decompression bomb is ever held whole. The codecs are those of `compression-codecs` (the codec layer of
//! `async-compression`); this crate only drives them.

#![warn(missing_docs)]

use bytes::{Buf, Bytes};
use compression_codecs::{
    brotli::params::EncoderParams,
    core::{
        util::{PartialBuffer, WriteBuffer},
        Level,
    },
    zstd::params::{CParameter, DParameter},
    BrotliDecoder, BrotliEncoder, DecodeV2, EncodeV2, GzipDecoder, GzipEncoder, ZstdDecoder,
    ZstdEncoder,
};
pub use lacquer_config::Coding;

/// Largest piece of output one call to `piece` returns: small enough that the first bytes of a decoded
/// body leave early, large enough that a frame's overhead stays small.
pub const PIECE: usize = 16 * 1024;

/// `out`'s first `n` bytes, in an allocation of their size when they fill little of it: a piece kept in
/// a fetch's window must not hold more memory than its length says.
fn piece_of(mut out: Vec<u8>, n: usize) -> Bytes {
    if n < out.len() / 2 {
        Bytes::copy_from_slice(&out[..n])
    } else {
        out.truncate(n);
        Bytes::from(out)
    }
}

/// The zstd window HTTP allows (RFC 9659 §3: 8 MiB), as a power of two: what a decoder accepts.
const ZSTD_WINDOW_LOG: u32 = 23;

/// The window lacquerd's brotli and zstd encoders use (1 MiB), as a power of two.
const ENCODER_WINDOW_LOG: u32 = 20;

/// Why a body could not be coded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The input is not valid in its coding (bad header, checksum, stream).
    #[error("corrupt {coding} body: {source}")]
    Corrupt {
        /// The coding of the input.
        coding: &'static str,
        /// What the codec said.
        source: std::io::Error,
    },
    /// The input ended before its coding's end marker: a truncated body.
    #[error("truncated {0} body")]
    Truncated(&'static str),
    /// Decoding produced more than the limit the decoder was made with.
    #[error("{coding} body expands past {limit} bytes")]
    TooLarge {
        /// The coding of the input.
        coding: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// Encoding failed (the codec refused its own input: a bug in it, not in the body).
    #[error("{coding} encoding failed: {source}")]
    Encode {
        /// The coding being produced.
        coding: &'static str,
        /// What the codec said.
        source: std::io::Error,
    },
}

/// Compresses a body fed piece by piece.
pub struct Encoder {
    coding: Coding,
    codec: Box<dyn EncodeV2 + Send>,
    input: Bytes,
    ending: bool,
    done: bool,
    /// A flush was asked for and is not complete.
    flushing: bool,
    consumed: u64,
    consumed_at_output: u64,
    produced: u64,
}

impl Encoder {
    /// An encoder for `coding` at `level` (brotli 0–11, gzip 1–9, zstd 1–19; clamped by the codec).
    pub fn new(coding: Coding, level: u32) -> Self {
        let level = Level::Precise(level as i32);
        let codec: Box<dyn EncodeV2 + Send> = match coding {
            // Every fill that compresses holds its encoder's window: 1 MiB for brotli and zstd (gzip's is
            // 32 KiB) keeps hundreds of concurrent fills within tens of MiB each, at a cost in ratio only
            // for bodies larger than the window.
            Coding::Br => Box::new(BrotliEncoder::new(
                EncoderParams::default()
                    .quality(level)
                    .window_size(ENCODER_WINDOW_LOG as i32),
            )),
            Coding::Gzip => Box::new(GzipEncoder::new(level.into())),
            Coding::Zstd => Box::new(ZstdEncoder::new_with_params(
                CParameter::quality(level),
                &[CParameter::window_log(ENCODER_WINDOW_LOG)],
            )),
        };
        Self {
            coding,
            codec,
            input: Bytes::new(),
            ending: false,
            done: false,
            flushing: false,
            consumed: 0,
            consumed_at_output: 0,
            produced: 0,
        }
    }

    /// The coding produced.
    pub fn coding(&self) -> Coding {
        self.coding
    }

    /// Queues `data`; take the output with [`Encoder::piece`] until it returns `None` before feeding more.
    pub fn feed(&mut self, data: Bytes) {
        debug_assert!(self.input.is_empty(), "feed after piece returned None");
        self.consumed += data.len() as u64;
        self.input = data;
    }

    /// Asks for everything fed so far to come out of `piece` (at some cost in ratio), so that a reader is
    /// not kept waiting while the codec gathers a block.
    pub fn flush(&mut self) {
        self.flushing = true;
    }

    /// Marks the end of the input: `piece` then returns what the codec still holds, and the trailer.
    pub fn end(&mut self) {
        self.ending = true;
    }

    /// The next piece of output, `None` when everything fed so far has been consumed (or, after
    /// [`Encoder::end`], when the stream is complete).
    pub fn piece(&mut self) -> Result<Option<Bytes>, CodecError> {
        let mut out = vec![0u8; PIECE];
        let mut buf = WriteBuffer::new_initialized(&mut out);
        let coding = self.coding.token();
        let fail = |source| CodecError::Encode { coding, source };
        while !buf.has_no_spare_space() {
            let written = buf.written_len();
            let moved = if !self.input.is_empty() {
                let mut input = PartialBuffer::new(&self.input[..]);
                self.codec.encode(&mut input, &mut buf).map_err(fail)?;
                let used = input.written_len();
                self.input.advance(used);
                used > 0
            } else if self.ending && !self.done {
                self.done = self.codec.finish(&mut buf).map_err(fail)?;
                self.done
            } else if self.flushing {
                // Done once everything taken so far is out.
                self.flushing = !self.codec.flush(&mut buf).map_err(fail)?;
                true
            } else {
                break;
            };
            if !moved && buf.written_len() == written {
                return Err(fail(std::io::Error::other("the encoder made no progress")));
            }
        }
        let n = buf.written_len();
        self.produced += n as u64;
        if n > 0 {
            self.consumed_at_output = self.consumed;
        }
        Ok((n > 0).then(|| piece_of(out, n)))
    }

    /// Bytes fed so far.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// How many bytes had been fed when output last came out.
    pub fn consumed_at_output(&self) -> u64 {
        self.consumed_at_output
    }
}

/// Decompresses a body fed piece by piece, refusing to produce more than a limit.
pub struct Decoder {
    coding: Coding,
    codec: Box<dyn DecodeV2 + Send>,
    input: Bytes,
    /// The current member or frame has ended; more input starts another (gzip members and zstd frames may
    /// be concatenated, a brotli stream may not).
    member_done: bool,
    /// The codec has given all it owes for the input fed so far.
    flushed: bool,
    fed: u64,
    ending: bool,
    finished: bool,
    produced: u64,
    limit: u64,
}

impl Decoder {
    /// A decoder for `coding` that fails with [`CodecError::TooLarge`] past `limit` output bytes.
    pub fn new(coding: Coding, limit: u64) -> Self {
        let codec: Box<dyn DecodeV2 + Send> = match coding {
            Coding::Br => Box::new(BrotliDecoder::new()),
            Coding::Gzip => Box::new(GzipDecoder::new()),
            Coding::Zstd => Box::new(ZstdDecoder::new_with_params(&[DParameter::window_log_max(
                ZSTD_WINDOW_LOG,
            )])),
        };
        Self {
            coding,
            codec,
            input: Bytes::new(),
            member_done: false,
            flushed: true,
            fed: 0,
            ending: false,
            finished: false,
            produced: 0,
            limit,
        }
    }

    /// The coding decoded.
    pub fn coding(&self) -> Coding {
        self.coding
    }

    /// Queues `data`; take the output with [`Decoder::piece`] until it returns `None` before feeding more.
    pub fn feed(&mut self, data: Bytes) {
        debug_assert!(self.input.is_empty(), "feed after piece returned None");
        self.flushed = data.is_empty();
        self.fed += data.len() as u64;
        self.input = data;
    }

    /// Marks the end of the input: `piece` then checks that the coded stream ended too.
    pub fn end(&mut self) {
        self.ending = true;
    }

    /// The next piece of output, `None` when everything fed so far has been decoded (or, after
    /// [`Decoder::end`], when the stream has been checked complete).
    pub fn piece(&mut self) -> Result<Option<Bytes>, CodecError> {
        let coding = self.coding.token();
        let corrupt = |source| CodecError::Corrupt { coding, source };
        let left = self.limit - self.produced;
        // Near the limit, one byte more than it allows tells a body that reaches it from one that exceeds it.
        let room = if left < PIECE as u64 {
            left as usize + 1
        } else {
            PIECE
        };
        let mut out = vec![0u8; room];
        let mut buf = WriteBuffer::new_initialized(&mut out);
        while !buf.has_no_spare_space() {
            let written = buf.written_len();
            // Whether the step moved: a codec that neither takes input nor gives output would spin forever.
            let moved = if !self.input.is_empty() {
                if self.member_done {
                    if self.coding == Coding::Br {
                        return Err(corrupt(std::io::Error::other(
                            "data after the end of the stream",
                        )));
                    }
                    self.codec.reinit().map_err(corrupt)?;
                    self.member_done = false;
                }
                let mut input = PartialBuffer::new(&self.input[..]);
                self.member_done = self.codec.decode(&mut input, &mut buf).map_err(corrupt)?;
                let used = input.written_len();
                self.input.advance(used);
                used > 0 || self.member_done
            } else if !self.member_done && !self.flushed {
                // Input taken whole may still owe output (the last call filled the piece), or the end of
                // the stream that only shows once all of it is out.
                // gzip's inflater calls input it cannot use an error, so it is asked to flush instead; its
                // end shows in the trailer, which is input.
                if self.coding == Coding::Gzip {
                    self.codec.flush(&mut buf).map_err(corrupt)?;
                } else {
                    let mut none = PartialBuffer::new(&[][..]);
                    self.member_done = self.codec.decode(&mut none, &mut buf).map_err(corrupt)?;
                }
                self.flushed = self.member_done || buf.written_len() == written;
                true
            } else if self.ending && !self.finished {
                // An empty body is empty in any coding, as browsers take it.
                if !self.member_done && self.fed > 0 {
                    return Err(CodecError::Truncated(coding));
                }
                self.finished = true;
                true
            } else {
                break;
            };
            if !moved && buf.written_len() == written {
                return Err(corrupt(std::io::Error::other(
                    "the decoder made no progress",
                )));
            }
        }
        let n = buf.written_len();
        if n as u64 > left {
            return Err(CodecError::TooLarge {
                coding,
                limit: self.limit,
            });
        }
        self.produced += n as u64;
        Ok((n > 0).then(|| piece_of(out, n)))
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }
}

#[cfg(test)]
mod tests;
