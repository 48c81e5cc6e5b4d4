//! The stored form of a parsed page: records of literal text and includes, read back in order.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The version of the template form, stored beside each page parsed into it: a page stored in another
/// form is fetched again rather than misread.
pub const TEMPLATE_VERSION: &str = "1";

/// A record of literal text: the tag, a 4-byte length, the bytes.
const LITERAL: u8 = b'L';
/// A record of an include: the tag, a flags byte, a 2-byte length, the resolved-to-be `src`.
const INCLUDE: u8 = b'I';
/// The include's `onerror="continue"`.
const CONTINUE: u8 = 1;

/// The longest `src` kept; a longer one is not an include (see [`crate::Parser`]).
pub(crate) const MAX_SRC: usize = u16::MAX as usize;

/// One include of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Include {
    /// The `src` attribute, its entities decoded.
    pub src: String,
    /// `onerror="continue"`: a fragment that fails is left out, rather than cutting the page off.
    pub continue_on_error: bool,
}

/// What a template reads back as, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text sent as it is.
    Literal(Bytes),
    /// A fragment fetched and sent in its place.
    Include(Include),
}

/// A template that does not read back: damaged, cut short, or of another form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// A record's tag is none this version writes.
    #[error("the stored ESI template is damaged: unknown record {0:#04x}")]
    UnknownRecord(u8),
    /// An include's `src` is not UTF-8.
    #[error("the stored ESI template is damaged: an include's src is not text")]
    BadSrc,
    /// The bytes ended inside a record.
    #[error("the stored ESI template ends inside a record")]
    Truncated,
}

/// Appends a literal record of `text` (nothing for none).
pub(crate) fn put_literal(out: &mut BytesMut, text: &[u8]) {
    for piece in text.chunks(u32::MAX as usize) {
        if piece.is_empty() {
            continue;
        }
        out.reserve(5 + piece.len());
        out.put_u8(LITERAL);
        out.put_u32(piece.len() as u32);
        out.put_slice(piece);
    }
}

/// Appends an include record.
pub(crate) fn put_include(out: &mut BytesMut, include: &Include) {
    let src = include.src.as_bytes();
    debug_assert!(src.len() <= MAX_SRC);
    out.put_u8(INCLUDE);
    out.put_u8(if include.continue_on_error {
        CONTINUE
    } else {
        0
    });
    out.put_u16(src.len() as u16);
    out.put_slice(src);
}

/// Reads a template back as it arrives, chunk by chunk: text is handed on as it comes (a long stretch
/// need not be all in hand), an include once its record is whole. Nothing is scanned: each record says
/// how long it is. Text is a slice of the chunk it came in (no copy); only a record cut between two chunks
/// is joined.
#[derive(Default)]
pub struct Reader {
    held: Bytes,
    /// Bytes of the literal record being read that are still to come.
    literal_left: usize,
}

impl Reader {
    /// A reader at the start of a template.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the template's next bytes.
    pub fn push(&mut self, data: Bytes) {
        if self.held.is_empty() {
            self.held = data;
        } else {
            let mut joined = BytesMut::with_capacity(self.held.len() + data.len());
            joined.extend_from_slice(&self.held);
            joined.extend_from_slice(&data);
            self.held = joined.freeze();
        }
    }

    /// The next segment the bytes in hand make; `Ok(None)` when more bytes are needed.
    pub fn next_segment(&mut self) -> Result<Option<Segment>, TemplateError> {
        if self.literal_left > 0 {
            if self.held.is_empty() {
                return Ok(None);
            }
            let n = self.literal_left.min(self.held.len());
            self.literal_left -= n;
            return Ok(Some(Segment::Literal(self.held.split_to(n))));
        }
        let Some(&tag) = self.held.first() else {
            return Ok(None);
        };
        match tag {
            LITERAL => {
                if self.held.len() < 5 {
                    return Ok(None);
                }
                self.held.advance(1);
                self.literal_left = self.held.get_u32() as usize;
                self.next_segment()
            }
            INCLUDE => {
                if self.held.len() < 4 {
                    return Ok(None);
                }
                let len = usize::from(u16::from_be_bytes([self.held[2], self.held[3]]));
                if self.held.len() < 4 + len {
                    return Ok(None);
                }
                let flags = self.held[1];
                self.held.advance(4);
                let src = self.held.split_to(len);
                let src = std::str::from_utf8(&src)
                    .map_err(|_| TemplateError::BadSrc)?
                    .to_owned();
                Ok(Some(Segment::Include(Include {
                    src,
                    continue_on_error: flags & CONTINUE != 0,
                })))
            }
            other => Err(TemplateError::UnknownRecord(other)),
        }
    }

    /// Checks, once the template's bytes have all been pushed and read, that it ended between records.
    pub fn finish(&self) -> Result<(), TemplateError> {
        if self.literal_left > 0 || !self.held.is_empty() {
            return Err(TemplateError::Truncated);
        }
        Ok(())
    }

    /// Every segment of a whole template in hand (for tests and `cachectl inspect`).
    pub fn read_all(template: Bytes) -> Result<Vec<Segment>, TemplateError> {
        let mut reader = Reader::new();
        reader.push(template);
        let mut segments = Vec::new();
        while let Some(segment) = reader.next_segment()? {
            segments.push(segment);
        }
        reader.finish()?;
        Ok(segments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn include(src: &str, continue_on_error: bool) -> Include {
        Include {
            src: src.into(),
            continue_on_error,
        }
    }

    #[test]
    fn records_read_back_whatever_the_chunks() {
        let mut out = BytesMut::new();
        put_literal(&mut out, b"<p>before ");
        put_include(&mut out, &include("/nav?x=1&y=2", true));
        put_literal(&mut out, b" after</p>");
        put_include(&mut out, &include("/foot", false));
        let template = out.freeze();
        let whole = Reader::read_all(template.clone()).unwrap();
        for size in 1..template.len() {
            let mut reader = Reader::new();
            let mut segments = Vec::new();
            for chunk in template.chunks(size) {
                reader.push(Bytes::copy_from_slice(chunk));
                while let Some(s) = reader.next_segment().unwrap() {
                    segments.push(s);
                }
            }
            reader.finish().unwrap();
            // Text may come in more pieces; joined, it is the same.
            let mut joined: Vec<Segment> = Vec::new();
            for s in segments {
                match (joined.last_mut(), s) {
                    (Some(Segment::Literal(a)), Segment::Literal(b)) => {
                        let mut both = a.to_vec();
                        both.extend_from_slice(&b);
                        *a = Bytes::from(both);
                    }
                    (_, s) => joined.push(s),
                }
            }
            assert_eq!(joined, whole, "chunks of {size}");
        }
        assert_eq!(
            whole,
            vec![
                Segment::Literal(Bytes::from_static(b"<p>before ")),
                Segment::Include(include("/nav?x=1&y=2", true)),
                Segment::Literal(Bytes::from_static(b" after</p>")),
                Segment::Include(include("/foot", false)),
            ]
        );
    }

    #[test]
    fn damaged_and_truncated_templates_are_errors() {
        assert_eq!(
            Reader::read_all(Bytes::from_static(b"<html>")),
            Err(TemplateError::UnknownRecord(b'<'))
        );
        let mut out = BytesMut::new();
        put_literal(&mut out, b"0123456789");
        let cut = out.freeze().slice(..8);
        assert_eq!(Reader::read_all(cut), Err(TemplateError::Truncated));
        let mut out = BytesMut::new();
        put_include(&mut out, &include("/a", false));
        let cut = out.freeze().slice(..5);
        assert_eq!(Reader::read_all(cut), Err(TemplateError::Truncated));
    }
}
