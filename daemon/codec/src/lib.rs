//! Content codings (gzip, brotli, zstd) as push codecs for a body that arrives frame by frame: input is
//! fed as it comes, output is taken in pieces of at most [`PIECE`] bytes, so neither a large body nor a
//! decompression bomb is ever held whole. The codecs are those of `compression-codecs` (the codec layer of
//! `async-compression`); this crate only drives them.

#![warn(missing_docs)]

use brotli::enc::{
    encode::{BrotliEncoderOperation, BrotliEncoderStateStruct},
    StandardAlloc,
};
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
pub use lacquer_config::{Coding, DictionaryCoding};

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
    /// Decoding produced more than the expansion limit allows for the input taken so far (a body that
    /// costs far more CPU to decode than its size suggests).
    #[error("{coding} body expands more than {ratio} times")]
    Expands {
        /// The coding of the input.
        coding: &'static str,
        /// The ratio allowed.
        ratio: u64,
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
    /// The `Content-Encoding` token produced.
    token: &'static str,
    codec: Box<dyn EncodeV2 + Send>,
    /// Bytes sent before the codec's output: a dictionary coding's magic number and dictionary hash.
    prefix: Option<Bytes>,
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
        Self::of(coding.token(), codec, None)
    }

    fn of(token: &'static str, codec: Box<dyn EncodeV2 + Send>, prefix: Option<Bytes>) -> Self {
        Self {
            token,
            codec,
            prefix,
            input: Bytes::new(),
            ending: false,
            done: false,
            flushing: false,
            consumed: 0,
            consumed_at_output: 0,
            produced: 0,
        }
    }

    /// An encoder for `coding` against `dictionary`, whose SHA-256 is `hash` (RFC 9842 §4): the raw
    /// dictionary is what the stream's first bytes may refer back into, and the stream starts with the
    /// coding's magic number and the hash, so that a client never decodes it against another dictionary.
    /// `level` as for [`Encoder::new`] (brotli at 9 at least). A dictionary over [`MAX_DICTIONARY`] is
    /// refused.
    pub fn with_dictionary(
        coding: DictionaryCoding,
        level: u32,
        dictionary: &[u8],
        hash: &[u8; 32],
    ) -> Result<Self, CodecError> {
        let token = coding.token();
        if dictionary.len() > MAX_DICTIONARY {
            return Err(CodecError::Encode {
                coding: token,
                source: std::io::Error::other("the dictionary is larger than 8 MiB"),
            });
        }
        let codec: Box<dyn EncodeV2 + Send> = match coding {
            DictionaryCoding::Dcb => Box::new(BrotliWithDictionary::new(level, dictionary)),
            // Levels up to 19 keep zstd's window within the 8 MiB RFC 9842 §5 allows; a raw dictionary
            // (one without zstd's own header) is loaded as content, as the RFC's dictionaries are.
            DictionaryCoding::Dcz => Box::new(
                ZstdEncoder::new_with_dict(level.min(19) as i32, dictionary).map_err(|source| {
                    CodecError::Encode {
                        coding: token,
                        source,
                    }
                })?,
            ),
        };
        let mut prefix = magic(coding).to_vec();
        prefix.extend_from_slice(hash);
        Ok(Self::of(token, codec, Some(Bytes::from(prefix))))
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
        if let Some(prefix) = self.prefix.take() {
            self.produced += prefix.len() as u64;
            return Ok(Some(prefix));
        }
        let mut out = vec![0u8; PIECE];
        let mut buf = WriteBuffer::new_initialized(&mut out);
        let coding = self.token;
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

/// The largest dictionary [`Encoder::with_dictionary`] takes: half of brotli's largest window (16 MiB, all
/// that `dcb` allows), so that the body compressed after it is seen whole as well.
pub const MAX_DICTIONARY: usize = 8 << 20;

/// The bytes a stream in `coding` starts with, before the dictionary's SHA-256: `dcb`'s magic number, and
/// for `dcz` a zstd skippable frame holding the 32 bytes of the hash.
pub fn magic(coding: DictionaryCoding) -> &'static [u8] {
    match coding {
        DictionaryCoding::Dcb => &[0xff, 0x44, 0x43, 0x42],
        DictionaryCoding::Dcz => &[0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00],
    }
}

/// Brotli with a raw dictionary: `compression-codecs`' brotli encoder takes none, so its state is driven
/// here as that encoder drives it, the dictionary set first.
struct BrotliWithDictionary {
    state: BrotliEncoderStateStruct<StandardAlloc>,
}

impl BrotliWithDictionary {
    fn new(level: u32, dictionary: &[u8]) -> Self {
        let mut state = BrotliEncoderStateStruct::new(StandardAlloc::default());
        // Below quality 9 this encoder (brotli 9.1.1) writes streams against a dictionary that no decoder
        // reads back: they fail in Chromium and in brotli-decompressor alike (dropbox/rust-brotli#224,
        // copies spanning the dictionary's end, was fixed in 8.0.0; an edited copy of a 150 KiB dictionary
        // failed at qualities 2 to 7 and passed from 9 when measured). A sibling is made once, so the
        // slower qualities cost little.
        state.params.quality = level.clamp(9, 11) as i32;
        // The window must reach back over the whole dictionary (brotli uses only its last window's
        // worth): at least lacquerd's usual 1 MiB, at most brotli's 16 MiB.
        let needed = (dictionary.len() + 16).next_power_of_two().trailing_zeros();
        state.params.lgwin = needed.clamp(ENCODER_WINDOW_LOG, 24) as i32;
        state.set_custom_dictionary(dictionary.len(), dictionary);
        Self { state }
    }

    fn run(
        &mut self,
        input: &mut PartialBuffer<&[u8]>,
        output: &mut WriteBuffer<'_>,
        op: BrotliEncoderOperation,
    ) -> std::io::Result<()> {
        let in_buf = input.unwritten();
        let out_buf = output.initialize_unwritten();
        let (mut taken, mut written) = (0, 0);
        if !self.state.compress_stream(
            op,
            &mut in_buf.len(),
            in_buf,
            &mut taken,
            &mut out_buf.len(),
            out_buf,
            &mut written,
            &mut None,
            &mut |_, _, _, _| (),
        ) {
            return Err(std::io::Error::other("brotli error"));
        }
        input.advance(taken);
        output.advance(written);
        Ok(())
    }
}

impl EncodeV2 for BrotliWithDictionary {
    fn encode(
        &mut self,
        input: &mut PartialBuffer<&[u8]>,
        output: &mut WriteBuffer<'_>,
    ) -> std::io::Result<()> {
        self.run(
            input,
            output,
            BrotliEncoderOperation::BROTLI_OPERATION_PROCESS,
        )
    }

    fn flush(&mut self, output: &mut WriteBuffer<'_>) -> std::io::Result<bool> {
        let op = BrotliEncoderOperation::BROTLI_OPERATION_FLUSH;
        self.run(&mut PartialBuffer::new(&[][..]), output, op)?;
        Ok(!self.state.has_more_output())
    }

    fn finish(&mut self, output: &mut WriteBuffer<'_>) -> std::io::Result<bool> {
        let op = BrotliEncoderOperation::BROTLI_OPERATION_FINISH;
        self.run(&mut PartialBuffer::new(&[][..]), output, op)?;
        Ok(self.state.is_finished())
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
    /// Output allowed per byte of input taken, past `expansion_floor` bytes of output.
    expansion: Option<(u64, u64)>,
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
            expansion: None,
        }
    }

    /// Also fails, with [`CodecError::Expands`], once the output is more than `ratio` times the input
    /// taken so far and more than `floor` bytes: the CPU a decode costs follows its output, so a small
    /// body that expands enormously (text compresses 5 to 20 times; gzip cannot pass about 1 030) is cut
    /// after a bounded amount of work instead of at `limit`.
    pub fn with_max_expansion(mut self, ratio: u64, floor: u64) -> Self {
        self.expansion = Some((ratio, floor));
        self
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
        if let Some((ratio, floor)) = self.expansion {
            let taken = self.fed - self.input.len() as u64;
            if self.produced > floor.max(taken.saturating_mul(ratio)) {
                return Err(CodecError::Expands { coding, ratio });
            }
        }
        Ok((n > 0).then(|| piece_of(out, n)))
    }

    /// Bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// What a decoder of `coding` may hold at most, for a body that starts with `start` (its first bytes,
    /// when known): the window the body names, its ring buffer and the codec's tables. Conservative: twice
    /// the window plus 2 MiB for brotli and zstd (at most 16 MiB and 8 MiB of window, what the stream
    /// header allows and what this decoder accepts), and 128 KiB for gzip (a 32 KiB window and inflate's
    /// tables), each with the 16 KiB piece being sent.
    pub fn memory(coding: Coding, start: Option<&[u8]>) -> u64 {
        const TABLES: u64 = 2 << 20;
        match coding {
            Coding::Gzip => 128 << 10,
            Coding::Br => {
                let bits = start.and_then(brotli_window_bits).unwrap_or(24);
                2 * ((1u64 << bits) - 16) + TABLES
            }
            Coding::Zstd => {
                let max = 1u64 << ZSTD_WINDOW_LOG;
                let window = start.and_then(zstd_window).unwrap_or(max).min(max);
                2 * window + TABLES
            }
        }
    }
}

/// The window size (as a power of two) a brotli stream's first bits declare (RFC 7932 §9.1); `None` for
/// an empty start or a large-window stream.
fn brotli_window_bits(start: &[u8]) -> Option<u32> {
    let b = *start.first()?;
    if b & 1 == 0 {
        return Some(16);
    }
    match (b >> 1) & 7 {
        0 => match (b >> 4) & 7 {
            0 => Some(17),
            1 => None,
            m => Some(8 + u32::from(m)),
        },
        n => Some(17 + u32::from(n)),
    }
}

/// The window size a zstd frame header declares (RFC 8878 §3.1.1.1): the window descriptor, or for a
/// single-segment frame its content size. `None` when the start is not a whole frame header.
fn zstd_window(start: &[u8]) -> Option<u64> {
    if start.get(..4)? != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let descriptor = *start.get(4)?;
    if descriptor & 0x20 == 0 {
        let w = *start.get(5)?;
        let base = 1u64 << (10 + u32::from(w >> 3));
        return Some(base + base / 8 * u64::from(w & 7));
    }
    let dictionary = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let size = [1, 2, 4, 8][usize::from(descriptor >> 6)];
    let field = start.get(5 + dictionary..5 + dictionary + size)?;
    let mut bytes = [0u8; 8];
    bytes[..size].copy_from_slice(field);
    let value = u64::from_le_bytes(bytes);
    Some(if size == 2 { value + 256 } else { value })
}

#[cfg(test)]
mod tests;
