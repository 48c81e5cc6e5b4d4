//! The VCL subset that templates use (Magento's `varnish6.vcl`, the WordPress VCLs), read and translated
//! into lacquerd's configuration: `[[backend]]`s with their probes, `[purge] allow_from` from the ACL that
//! guards purges, and `[[rule]]`s, each with the VCL lines it came from. What has no translation is listed
//! with its line and why (`cachectl vcl2rules`).
//!
//! Read: `backend`, `probe`, `acl`, and `vcl_recv`, `vcl_hash`, `vcl_backend_fetch`,
//! `vcl_backend_response`, `vcl_deliver`, `vcl_backend_error` (and `vcl_synth`, for what a `synth` answers);
//! `if`/`elsif`/`else`, `~`, `!~`, `==`, `!=`, `&&`, `||`, `!`; `set`/`unset` of headers; `regsub` and
//! `regsuball` on `req.url`; `return (pass|pipe|hash|lookup|purge|synth|deliver)`; `hash_data`; `ban()`;
//! `beresp.ttl`, `grace`, `keep`, `uncacheable`, `do_esi`, `do_gzip`; `call` of a subroutine.

#![warn(missing_docs)]

mod lex;
mod parse;
mod render;
mod translate;

pub use render::render;
pub use translate::{Piece, Translation, Untranslated};

/// A file that does not read as VCL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    /// Where.
    pub line: usize,
    /// What was expected.
    pub reason: String,
}

/// Translates the VCL `text`. Every rule made is compiled on its own: one that does not compile is listed
/// with what has no translation, never printed.
pub fn translate(text: &str) -> Result<Translation, ParseError> {
    let tokens = lex::tokens(text).map_err(|(line, reason)| ParseError { line, reason })?;
    let program = parse::program(&tokens).map_err(|(line, reason)| ParseError { line, reason })?;
    let mut translation = translate::translate(&program, text);
    let names: Vec<String> = translation
        .backends
        .iter()
        .map(|b| b.value.name.clone())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut kept = Vec::new();
    for piece in std::mem::take(&mut translation.rules) {
        // A file a rule answers with is read where lacquerd runs, not here: the rest is checked.
        let mut checked = piece.value.clone();
        if let Some(respond) = checked.respond.as_mut().filter(|r| r.file.is_some()) {
            respond.file = None;
            respond.body = Some(String::new());
        }
        match lacquer_rules::Rules::compile(std::slice::from_ref(&checked), &names) {
            Ok(_) => kept.push(piece),
            Err(e) => translation.untranslated.push(Untranslated {
                line: piece.lines.0,
                construct: format!("{} (lines {}-{})", piece.from, piece.lines.0, piece.lines.1),
                why: format!(
                    "the rule made of it does not compile: {} {}",
                    e.field, e.reason
                ),
            }),
        }
    }
    translation.rules = kept;
    translation.untranslated.sort_by_key(|u| u.line);
    Ok(translation)
}
