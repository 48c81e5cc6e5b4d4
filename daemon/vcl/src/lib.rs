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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lacquer_config::{Phase, Rule};

    use super::*;

    /// The rules `vcl` translates into, and the lines of what was not translated.
    fn rules(vcl: &str) -> (Vec<Rule>, Vec<usize>) {
        let t = translate(vcl).expect("VCL");
        (
            t.rules.into_iter().map(|p| p.value).collect(),
            t.untranslated.iter().map(|u| u.line).collect(),
        )
    }

    #[test]
    fn branches_become_rules_with_their_conditions() {
        let (rules, untranslated) = rules(
            r#"sub vcl_recv {
    if (req.method != "GET" && req.method != "HEAD") {
        return (pass);
    } elsif (req.url ~ "^/admin" || req.http.Authorization) {
        return (pass);
    } else {
        unset req.http.Cookie;
    }
    set req.http.X-Seen = "1";
}"#,
        );
        // The `else` is neither branch's condition: a URL that does not match `^/admin` has no rule
        // condition, so its rule is reported (the statement's line), never made without it.
        assert_eq!(untranslated, [7]);
        // The methods but GET and HEAD; each alternative of `||` a rule of its own.
        assert_eq!(rules.len(), 4, "{rules:#?}");
        assert!(rules[0].pass && rules[0].stop);
        assert!(!rules[0].when.methods.contains(&"GET".to_owned()));
        assert!(rules[0].when.methods.contains(&"POST".to_owned()));
        assert_eq!(rules[1].when.path_regex.as_deref(), Some("^/admin"));
        assert_eq!(rules[1].when.methods, ["GET", "HEAD"]);
        assert_eq!(rules[2].when.headers["authorization"], "");
        assert!(rules[3].when == Default::default() && rules[3].set_headers["x-seen"] == "1");
    }

    #[test]
    fn what_has_no_rule_is_reported_with_its_line() {
        let (rules, untranslated) = rules(
            r#"sub vcl_recv {
    if (req.url !~ "^/static/") {
        return (pass);
    }
    set req.hash_always_miss = true;
}
sub vcl_backend_response {
    if (beresp.ttl <= 0s) {
        set beresp.uncacheable = true;
    }
}"#,
        );
        assert!(rules.is_empty(), "{rules:#?}");
        assert_eq!(untranslated, [3, 5, 9]);
    }

    #[test]
    fn the_idioms_templates_write() {
        let (rules, untranslated) = rules(
            r#"import std;
sub vcl_recv {
    set req.url = std.querysort(req.url);
    set req.url = regsuball(req.url, "(utm_[a-z]+|gclid)=[-_A-z0-9+()%.]+&?", "");
    set req.http.Cookie = regsuball(req.http.Cookie, "(^|;\s*)(_ga[^=]*|_fbp)=[^;]*", "");
    if (std.port(server.ip) == 443) {
        set req.http.X-Forwarded-Proto = "https";
    } else {
        set req.http.X-Forwarded-Proto = "http";
    }
    if (req.http.User-Agent ~ "(?i)mobile") {
        set req.http.X-Device = "mobile";
    } else {
        set req.http.X-Device = "desktop";
    }
}
sub vcl_hash {
    hash_data(regsub(req.http.cookie, "^.*?X-Magento-Vary=([^;]+);*.*$", "\1"));
}
sub vcl_backend_response {
    if (beresp.ttl > 1d) {
        set beresp.ttl = 1d;
    }
    if (!beresp.http.Cache-Control && !beresp.http.Expires) {
        set beresp.ttl = 2m;
    }
    if (beresp.status >= 500) {
        set beresp.uncacheable = true;
        set beresp.ttl = 120s;
        return (deliver);
    }
}"#,
        );
        assert!(untranslated.is_empty(), "{untranslated:?}");
        // vcl_hash's rule first: vcl_recv's returns must not skip it.
        assert_eq!(rules[0].key_cookie_values, ["X-Magento-Vary"]);
        assert!(rules[0].forward_all_cookies);
        let query = rules[1].query.as_ref().unwrap();
        assert!(query.sort && query.sort_values);
        assert_eq!(query.drop, ["utm_*", "gclid"]);
        assert_eq!(rules[1].cookies.as_ref().unwrap().drop, ["_ga*", "_fbp"]);
        assert_eq!(rules[2].set_headers["x-forwarded-proto"], "${scheme}");
        assert_eq!(rules[3].buckets[0].to.as_deref(), Some("x-device"));
        assert_eq!(rules[3].buckets[0].default, "desktop");
        assert_eq!(rules[4].ttl_max, Some(Duration::from_secs(86400)));
        assert_eq!(rules[5].default_ttl, Some(Duration::from_secs(120)));
        // Uncacheable: Varnish's TTL there is how long it remembers so; nothing is stored here.
        assert_eq!(rules[6].store, Some(false));
        assert_eq!(rules[6].ttl, None);
        assert!(rules[6].stop && rules[6].on == Phase::BackendResponse);
    }

    #[test]
    fn synth_answers_take_vcl_synths_case() {
        let (rules, untranslated) = rules(
            r#"sub vcl_recv {
    if (req.http.Host == "old.example.com") {
        return (synth(750, "https://new.example.com" + req.url));
    }
}
sub vcl_synth {
    if (resp.status == 750) {
        set resp.http.Location = resp.reason;
        set resp.status = 301;
        return (deliver);
    }
}"#,
        );
        assert!(untranslated.is_empty(), "{untranslated:?}");
        let respond = rules[0].respond.as_ref().unwrap();
        assert_eq!(respond.status, Some(301));
        assert_eq!(
            respond.location.as_deref(),
            Some("https://new.example.com${target}")
        );
        assert_eq!(rules[0].when.headers["host"], r"^old\.example\.com$");
    }

    #[test]
    fn bad_input_names_its_line() {
        assert_eq!(
            translate("sub vcl_recv {\n  set req.url = \"open;\n}")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            translate("sub vcl_recv {\n  if (x) {\n").unwrap_err().line,
            2
        );
    }
}
