//! `[compression]`: content codings lacquerd negotiates, stores and converts.

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// A content coding lacquerd can decode and encode (RFC 9110 §8.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Coding {
    /// `br` (RFC 7932).
    Br,
    /// `gzip` (RFC 1952), also accepted as `x-gzip`.
    Gzip,
    /// `zstd` (RFC 8878, with the 8 MiB window RFC 9659 sets for HTTP).
    Zstd,
}

impl Coding {
    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Br => "br",
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        }
    }

    /// The coding a `Content-Encoding` or `Accept-Encoding` token names, in any letter case.
    pub fn from_token(token: &str) -> Option<Coding> {
        [
            ("br", Coding::Br),
            ("gzip", Coding::Gzip),
            ("x-gzip", Coding::Gzip),
            ("zstd", Coding::Zstd),
        ]
        .into_iter()
        .find(|(name, _)| token.eq_ignore_ascii_case(name))
        .map(|(_, coding)| coding)
    }
}

/// A content coding against a dictionary the client holds (RFC 9842 §4, §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DictionaryCoding {
    /// `dcb`: brotli with the dictionary as a raw prefix.
    Dcb,
    /// `dcz`: zstd with the dictionary as raw content.
    Dcz,
}

impl DictionaryCoding {
    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            DictionaryCoding::Dcb => "dcb",
            DictionaryCoding::Dcz => "dcz",
        }
    }

    /// The coding `token` names, in any letter case.
    pub fn from_token(token: &str) -> Option<Self> {
        [DictionaryCoding::Dcb, DictionaryCoding::Dcz]
            .into_iter()
            .find(|c| token.eq_ignore_ascii_case(c.token()))
    }
}

/// `[compression]`: like Varnish's `http_gzip_support` and NGINX's `gzip`/`gunzip`. `Accept-Encoding` is
/// negotiated by lacquerd instead of being a variant per client string: the origin is asked once for a
/// compressed body, text it sends uncompressed is compressed once when stored, and every client gets the
/// stored coding when it accepts it, or the body decompressed on the way out.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Compression {
    /// Negotiate codings and compress at the edge. Off, `Accept-Encoding` is forwarded as the client sent it
    /// and varies the cache like any other field. Default: true.
    pub enabled: bool,
    /// Codings lacquerd asks origins for (in preference order, by quality values) and accepts; the first
    /// is the one it compresses with. Default: `["gzip", "br"]`: one stored body serves every client, and
    /// every client that compresses takes gzip, while one that only takes gzip would get a brotli body
    /// decoded (about 7 times the bytes). `["br", "gzip"]` saves a tenth of the bytes for browsers at that
    /// price. Add `"zstd"` to ask for it.
    pub codings: Vec<Coding>,
    /// Media types compressed when the origin sends them uncompressed; `text/*` matches every subtype.
    /// Default: text, JSON, JavaScript, XML, SVG, wasm and the web font types that are not compressed already.
    #[serde(deserialize_with = "lower_case")]
    pub types: Vec<String>,
    /// Bodies whose `Content-Length` is below this are stored as sent. Default: 1 KiB.
    pub min_size: ByteSize,
    /// Brotli quality, 0 to 11: 5 keeps a miss fast and compresses within a few per cent of 11 on text.
    /// Default: 5.
    pub brotli_level: u32,
    /// gzip level, 1 to 9. Default: 6 (NGINX's `gzip_comp_level` is 1; 6 is gzip's own default).
    pub gzip_level: u32,
    /// zstd level, 1 to 19. Default: 3.
    pub zstd_level: u32,
    /// Memory all the decoders of bodies decoded on the way out may hold together, each counted at its
    /// most (by coding and the window its body declares: 128 KiB for gzip, 4 MiB for brotli or zstd made
    /// by lacquerd, up to 34 MiB for a brotli body of the largest window). A request that would need a
    /// decoder past it is answered 503 with `Retry-After` (`decodes_refused`). At least 128 KiB. Default:
    /// 256 MiB.
    pub decode_memory: ByteSize,
    /// A byte range of a body decoded on the way out costs decoding everything before it: a range that
    /// ends within this many decoded bytes is answered 206, one beyond it with the whole body (200,
    /// streamed, as RFC 9110 §14.2 allows), so the work a request costs follows the bytes it is sent.
    /// Default: 1 MiB.
    pub range_decode: ByteSize,
    /// A body decoded on the way out is cut (and the response fails) once it has expanded more than this
    /// many times the bytes decoded, past its first MiB: text expands 5 to 20 times and gzip cannot pass
    /// about 1 030, while a small brotli or zstd body can expand a million times and cost seconds of CPU.
    /// At least 20. Default: 1000.
    pub max_expansion: u32,
    /// A client that takes none of a stored body's coding (identity for a body stored gzip'd, gzip for one
    /// stored brotli) is served the first time by converting the body on the way out, and the conversion
    /// is kept beside the body as another representation of it: later such clients get stored bytes.
    /// This many representations may be being made at once; past it a client is served by converting on
    /// the way out, as the first one was (`representations_deferred`). 0: none is made, every such client
    /// is converted for. Default: 4.
    pub conversions: u32,
    /// Compression dictionaries (RFC 9842). A stored response with `Use-As-Dictionary` is kept as a
    /// dictionary, known by the SHA-256 of its bytes; a client that holds it (`Available-Dictionary`, and
    /// `dcz` or `dcb` in `Accept-Encoding`) is sent later responses of the same host compressed against it,
    /// each made once from the stored body (as `conversions` makes the others) and kept beside it. A client
    /// whose dictionary is not held gets the ordinary codings. Default: true.
    pub dictionaries: bool,
    /// Memory the dictionaries held may take together; past it the least recently used is let go (its
    /// clients get the ordinary codings until its URL is served again). Default: 32 MiB.
    pub dictionary_memory: ByteSize,
    /// A larger `Use-As-Dictionary` response is not kept as a dictionary. At most 8 MiB (half of the
    /// largest brotli window, which `dcb` allows). Default: 4 MiB.
    pub max_dictionary_size: ByteSize,
}

impl Default for Compression {
    fn default() -> Self {
        Self {
            enabled: true,
            codings: vec![Coding::Gzip, Coding::Br],
            types: [
                "text/*",
                "application/json",
                "application/javascript",
                "application/x-javascript",
                "application/ecmascript",
                "application/xml",
                "application/xhtml+xml",
                "application/rss+xml",
                "application/atom+xml",
                "application/ld+json",
                "application/manifest+json",
                "application/geo+json",
                "application/vnd.apple.mpegurl",
                "application/x-mpegurl",
                "application/wasm",
                "image/svg+xml",
                "image/x-icon",
                "font/ttf",
                "font/otf",
                "application/vnd.ms-fontobject",
            ]
            .map(String::from)
            .to_vec(),
            min_size: ByteSize::kib(1),
            brotli_level: 5,
            gzip_level: 6,
            zstd_level: 3,
            decode_memory: ByteSize::mib(256),
            range_decode: ByteSize::mib(1),
            max_expansion: 1000,
            conversions: 4,
            dictionaries: true,
            dictionary_memory: ByteSize::mib(32),
            max_dictionary_size: ByteSize::mib(4),
        }
    }
}

impl Compression {
    /// Checks on the values alone; `key` is where the section is (`compression`).
    pub fn check(&self, key: &str) -> Result<(), crate::ConfigError> {
        let bad = |field: &str, why: &str| Err(crate::ConfigError(format!("{key}.{field}: {why}")));
        // Even while off: a route may turn it on.
        if self.codings.is_empty() {
            return bad("codings", "at least one coding is required");
        }
        for (n, coding) in self.codings.iter().enumerate() {
            if self.codings[..n].contains(coding) {
                return bad("codings", &format!("{} is listed twice", coding.token()));
            }
        }
        for t in &self.types {
            let valid = t
                .split_once('/')
                .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && !t.contains([' ', ';']));
            if !valid {
                return bad(
                    "types",
                    &format!("{t:?} is not a media type like text/html or text/*"),
                );
            }
        }
        if self.brotli_level > 11 {
            return bad("brotli_level", "must be between 0 and 11");
        }
        if !(1..=9).contains(&self.gzip_level) {
            return bad("gzip_level", "must be between 1 and 9");
        }
        if !(1..=19).contains(&self.zstd_level) {
            return bad("zstd_level", "must be between 1 and 19");
        }
        // Below one gzip decoder nothing could ever be decoded.
        if self.decode_memory.as_u64() < 128 * 1024 {
            return bad("decode_memory", "must be at least 128KiB");
        }
        if self.max_dictionary_size.as_u64() > 8 << 20 {
            return bad("max_dictionary_size", "must be at most 8MiB");
        }
        if self.max_dictionary_size > self.dictionary_memory {
            return bad(
                "max_dictionary_size",
                "must be at most dictionary_memory, or no dictionary could be held",
            );
        }
        // Text itself expands up to about 20 times.
        if self.max_expansion < 20 {
            return bad("max_expansion", "must be at least 20");
        }
        Ok(())
    }
}

fn lower_case<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    Ok(names.into_iter().map(|n| n.to_ascii_lowercase()).collect())
}
