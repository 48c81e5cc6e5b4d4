//! The parser: a page's bytes, as they arrive, into a template.
//!
//! What it reads, as Varnish's parser does:
//! - `<esi:include src="…"/>` (or `…>` with a `</esi:include>` after): an include, with
//!   `onerror="continue"` when the tag says so; `alt` is not read. One without a `src` is dropped.
//! - `<esi:remove>…</esi:remove>`: removed, with everything inside.
//! - `<esi:comment …/>` and any other `esi:` element's tags: removed.
//! - `<!--esi … -->`: the markers removed, what is between them parsed.
//! - An HTML comment (`<!-- … -->`) and a CDATA section are text: nothing in them is parsed.
//!
//! Names are matched as written (lower case), as Varnish's are. A tag longer than [`MAX_TAG`] is text: so
//! the parser holds at most that much of a page at a time.

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use crate::template::{put_include, put_literal, Include, MAX_SRC};

/// The longest tag read as ESI, attributes included: a page cannot make the parser hold more than this.
pub const MAX_TAG: usize = 16 * 1024;

/// Where the parser is in the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    /// Markup: tags are looked for.
    #[default]
    Text,
    /// Inside an HTML comment: text until `-->`.
    Comment,
    /// Inside a CDATA section: text until `]]>`.
    Cdata,
    /// Inside `<esi:remove>`: dropped until `</esi:remove>`.
    Remove,
}

/// What a `<` starts.
enum Opening {
    /// Not enough bytes in hand to tell.
    Unknown,
    EsiComment,
    Comment,
    Cdata,
    /// An `esi:` element's tag (`closing`: `</esi:`).
    Esi,
    Other,
}

const ESI_COMMENT: &[u8] = b"<!--esi";
const COMMENT: &[u8] = b"<!--";
const CDATA: &[u8] = b"<![CDATA[";
const ESI_OPEN: &[u8] = b"<esi:";
const ESI_CLOSE: &[u8] = b"</esi:";
const REMOVE_END: &[u8] = b"</esi:remove>";

/// Parses a page as it arrives into a template ([`crate::Reader`] reads it back).
#[derive(Default)]
pub struct Parser {
    /// Input not yet parsed: the start of a tag, or the end of a section, still to be told.
    held: BytesMut,
    /// Text not yet written as a record.
    text: BytesMut,
    /// Template bytes made.
    out: BytesMut,
    state: State,
    /// Inside `<!--esi`: its `-->` ends it.
    in_esi_comment: bool,
    includes: usize,
}

impl Parser {
    /// A parser at the start of a page.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the page's next bytes; returns the template bytes they completed (the text in hand is
    /// written out, so readers of a page still arriving get it).
    pub fn push(&mut self, data: &[u8]) -> Bytes {
        self.held.extend_from_slice(data);
        self.run(false);
        self.flush_text();
        self.out.split().freeze()
    }

    /// Ends the page: what is held is text. Returns the last template bytes.
    pub fn finish(&mut self) -> Bytes {
        self.run(true);
        self.flush_text();
        self.out.split().freeze()
    }

    /// How many includes the page has had so far.
    pub fn includes(&self) -> usize {
        self.includes
    }

    fn flush_text(&mut self) {
        if !self.text.is_empty() {
            put_literal(&mut self.out, &self.text);
            self.text.clear();
        }
    }

    /// Parses what is held; at the `end`, nothing is held back.
    fn run(&mut self, end: bool) {
        let mut pos = 0;
        loop {
            let rest = &self.held[pos..];
            if rest.is_empty() {
                break;
            }
            match self.state {
                State::Comment | State::Cdata => {
                    let close: &[u8] = if self.state == State::Comment {
                        b"-->"
                    } else {
                        b"]]>"
                    };
                    match memmem::find(rest, close) {
                        Some(i) => {
                            let n = i + close.len();
                            self.text.extend_from_slice(&rest[..n]);
                            pos += n;
                            self.state = State::Text;
                        }
                        None => {
                            // The end marker may start in the last bytes: they wait for the next.
                            let keep = if end {
                                0
                            } else {
                                (close.len() - 1).min(rest.len())
                            };
                            let n = rest.len() - keep;
                            self.text.extend_from_slice(&rest[..n]);
                            pos += n;
                            break;
                        }
                    }
                }
                State::Remove => match memmem::find(rest, REMOVE_END) {
                    Some(i) => {
                        pos += i + REMOVE_END.len();
                        self.state = State::Text;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            (REMOVE_END.len() - 1).min(rest.len())
                        };
                        pos += rest.len() - keep;
                        break;
                    }
                },
                State::Text => {
                    let lt = memchr::memchr(b'<', rest);
                    let end_marker = if self.in_esi_comment {
                        memmem::find(rest, b"-->")
                    } else {
                        None
                    };
                    match (lt, end_marker) {
                        (_, Some(e)) if lt.is_none_or(|l| e < l) => {
                            self.text.extend_from_slice(&rest[..e]);
                            pos += e + 3;
                            self.in_esi_comment = false;
                        }
                        (Some(l), _) => {
                            self.text.extend_from_slice(&rest[..l]);
                            pos += l;
                            match self.tag(pos, end) {
                                Some(used) => pos += used,
                                None => break,
                            }
                        }
                        (None, _) => {
                            // In `<!--esi`, a `-->` may start in the last two bytes.
                            let keep = if self.in_esi_comment && !end {
                                2.min(rest.len())
                            } else {
                                0
                            };
                            let n = rest.len() - keep;
                            self.text.extend_from_slice(&rest[..n]);
                            pos += n;
                            break;
                        }
                    }
                }
            }
        }
        let _ = self.held.split_to(pos);
        if end && !self.held.is_empty() {
            let rest = self.held.split();
            if self.state != State::Remove {
                self.text.extend_from_slice(&rest);
            }
        }
    }

    /// Handles what the `<` at `pos` starts; how many bytes it used, or `None` to wait for more.
    fn tag(&mut self, pos: usize, end: bool) -> Option<usize> {
        let rest = &self.held[pos..];
        let opening = if rest.starts_with(ESI_COMMENT) {
            Opening::EsiComment
        } else if rest.starts_with(CDATA) {
            Opening::Cdata
        } else if rest.starts_with(ESI_OPEN) || rest.starts_with(ESI_CLOSE) {
            Opening::Esi
        } else if rest.starts_with(COMMENT) {
            // `<!--` could still be the start of `<!--esi`.
            if ESI_COMMENT.starts_with(rest) && !end {
                Opening::Unknown
            } else {
                Opening::Comment
            }
        } else if [ESI_COMMENT, CDATA, ESI_OPEN, ESI_CLOSE]
            .iter()
            .any(|p| p.starts_with(rest))
            && !end
        {
            Opening::Unknown
        } else {
            Opening::Other
        };
        match opening {
            Opening::Unknown => None,
            Opening::EsiComment => {
                self.in_esi_comment = true;
                Some(ESI_COMMENT.len())
            }
            Opening::Comment => {
                self.text.extend_from_slice(COMMENT);
                self.state = State::Comment;
                Some(COMMENT.len())
            }
            Opening::Cdata => {
                self.text.extend_from_slice(CDATA);
                self.state = State::Cdata;
                Some(CDATA.len())
            }
            Opening::Other => {
                self.text.extend_from_slice(b"<");
                Some(1)
            }
            Opening::Esi => {
                let window = &rest[..rest.len().min(MAX_TAG)];
                match memchr::memchr(b'>', window) {
                    Some(gt) => {
                        let tag = rest[..=gt].to_vec();
                        self.element(&tag);
                        Some(gt + 1)
                    }
                    // Not ended within the bound (or by the page's end): text.
                    None if end || rest.len() >= MAX_TAG => {
                        self.text.extend_from_slice(b"<");
                        Some(1)
                    }
                    None => None,
                }
            }
        }
    }

    /// Acts on one whole `esi:` tag (from `<` to `>`).
    fn element(&mut self, tag: &[u8]) {
        let closing = tag.starts_with(ESI_CLOSE);
        let body = &tag[if closing {
            ESI_CLOSE.len()
        } else {
            ESI_OPEN.len()
        }..tag.len() - 1];
        let empty = body.ends_with(b"/");
        let body = if empty { &body[..body.len() - 1] } else { body };
        let name_end = body
            .iter()
            .position(|b| b.is_ascii_whitespace())
            .unwrap_or(body.len());
        let (name, attributes) = body.split_at(name_end);
        match (name, closing) {
            (b"include", false) => {
                let attrs = attributes_of(attributes);
                let src = attrs
                    .iter()
                    .find(|(n, _)| n == b"src")
                    .map(|(_, v)| decode_entities(v));
                if let Some(src) = src.filter(|s| !s.is_empty() && s.len() <= MAX_SRC) {
                    let continue_on_error = attrs
                        .iter()
                        .any(|(n, v)| n == b"onerror" && v == b"continue");
                    self.flush_text();
                    put_include(
                        &mut self.out,
                        &Include {
                            src,
                            continue_on_error,
                        },
                    );
                    self.includes += 1;
                }
            }
            (b"remove", false) if !empty => self.state = State::Remove,
            // `esi:comment`, closing tags, and the elements Varnish does not implement either: the tag
            // goes, whatever it held.
            _ => {}
        }
    }
}

/// The `name="value"` (or `'value'`) pairs of a tag's attributes; a name without a value is left out.
fn attributes_of(mut s: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut attrs = Vec::new();
    loop {
        s = trim_start(s);
        let Some(eq) = s.iter().position(|&b| b == b'=') else {
            return attrs;
        };
        let name = trim_end(&s[..eq]).to_vec();
        // A name with spaces in it: the part before them was a bare attribute.
        let name = match name.iter().rposition(|b| b.is_ascii_whitespace()) {
            Some(i) => name[i + 1..].to_vec(),
            None => name,
        };
        s = trim_start(&s[eq + 1..]);
        let Some(&quote) = s.first().filter(|&&q| q == b'"' || q == b'\'') else {
            let end = s
                .iter()
                .position(|b| b.is_ascii_whitespace())
                .unwrap_or(s.len());
            attrs.push((name, s[..end].to_vec()));
            s = &s[end..];
            continue;
        };
        let Some(close) = s[1..].iter().position(|&b| b == quote) else {
            return attrs;
        };
        attrs.push((name, s[1..1 + close].to_vec()));
        s = &s[close + 2..];
    }
}

fn trim_start(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &s[n..]
}

fn trim_end(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_whitespace())
        .count();
    &s[..s.len() - n]
}

/// The XML entities a `src` may hold (`&amp;` between query parameters) decoded, as Varnish decodes
/// them; bytes that are not UTF-8 are replaced, and [`crate::resolve`] refuses the target.
fn decode_entities(v: &[u8]) -> String {
    let text = String::from_utf8_lossy(v);
    if !text.contains('&') {
        return text.into_owned();
    }
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Reader, Segment};

    /// The page parsed whole, as text and includes (`[src]`, `[src?]` for `onerror="continue"`).
    fn parsed(page: &str) -> String {
        render(&parse_in(page, page.len().max(1)))
    }

    fn parse_in(page: &str, size: usize) -> Vec<Segment> {
        let mut parser = Parser::new();
        let mut template = BytesMut::new();
        for chunk in page.as_bytes().chunks(size) {
            template.extend_from_slice(&parser.push(chunk));
        }
        template.extend_from_slice(&parser.finish());
        Reader::read_all(template.freeze()).unwrap()
    }

    fn render(segments: &[Segment]) -> String {
        segments
            .iter()
            .map(|s| match s {
                Segment::Literal(b) => String::from_utf8_lossy(b).into_owned(),
                Segment::Include(i) if i.continue_on_error => format!("[{}?]", i.src),
                Segment::Include(i) => format!("[{}]", i.src),
            })
            .collect()
    }

    #[test]
    fn varnish_subset() {
        let table = [
            ("plain <b>text</b>", "plain <b>text</b>"),
            (r#"a<esi:include src="/nav"/>b"#, "a[/nav]b"),
            (r#"a<esi:include src='/nav' />b"#, "a[/nav]b"),
            (r#"<esi:include src="/x" onerror="continue"/>"#, "[/x?]"),
            (r#"<esi:include src="/x"></esi:include>!"#, "[/x]!"),
            (r#"<esi:include src="/p?a=1&amp;b=2"/>"#, "[/p?a=1&b=2]"),
            // Magento's blocks: an absolute URL on the site.
            (
                r#"<esi:include src="http://shop.test/page_cache/block/esi/blocks/[%22catalog.topnav%22]/" />"#,
                "[http://shop.test/page_cache/block/esi/blocks/[%22catalog.topnav%22]/]",
            ),
            ("a<esi:remove>gone <b>all</b></esi:remove>b", "ab"),
            (r#"a<esi:comment text="not shown"/>b"#, "ab"),
            (
                "a<!--esi <p><esi:include src=\"/in\"/></p> -->b",
                "a <p>[/in]</p> b",
            ),
            // Not ESI: comments and CDATA are text, whatever they hold.
            (
                r#"<!-- <esi:include src="/no"/> -->"#,
                r#"<!-- <esi:include src="/no"/> -->"#,
            ),
            (
                r#"<![CDATA[<esi:include src="/no"/>]]>"#,
                r#"<![CDATA[<esi:include src="/no"/>]]>"#,
            ),
            // Names are matched as written.
            (r#"<ESI:include src="/no"/>"#, r#"<ESI:include src="/no"/>"#),
            // Without a src, the tag goes and nothing is included; an unknown element's tags go.
            (r#"a<esi:include/>b"#, "ab"),
            ("a<esi:try><esi:attempt>x</esi:attempt></esi:try>b", "axb"),
            // A `<` that starts nothing, and a page ending in the middle of a tag.
            ("1 < 2 <esi", "1 < 2 <esi"),
            ("x <esi:include src=\"/cut", "x <esi:include src=\"/cut"),
            ("a<esi:remove>never closed", "a"),
        ];
        for (page, want) in table {
            assert_eq!(parsed(page), want, "{page}");
            // Whatever the chunks the page comes in.
            for size in 1..page.len() {
                assert_eq!(
                    render(&parse_in(page, size)),
                    want,
                    "{page} in chunks of {size}"
                );
            }
        }
    }

    #[test]
    fn a_tag_past_the_bound_is_text_and_nothing_more_is_held() {
        let long = format!("<esi:include src=\"/{}\"/>", "a".repeat(MAX_TAG));
        assert_eq!(parsed(&long), long);
        let mut parser = Parser::new();
        let mut out = 0;
        for _ in 0..100 {
            out += parser.push(long.as_bytes()[..1000].as_ref()).len();
            assert!(parser.held.len() <= MAX_TAG, "{}", parser.held.len());
        }
        assert!(out > 0);
    }

    #[test]
    fn includes_are_counted() {
        let mut parser = Parser::new();
        let _ = parser.push(br#"<esi:include src="/a"/><esi:include src="/b"/>"#);
        let _ = parser.finish();
        assert_eq!(parser.includes(), 2);
    }
}
