//! VCL's tokens, each with the line it starts on.

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// A name: a keyword, a variable (`req.http.X-Magento-Tags`), a function (`std.querysort`).
    Ident(String),
    /// A string, `"…"` or `{"…"}`, its quotes removed.
    Str(String),
    /// A number, with a duration's unit when it has one (`120s`, `3d`, `1.5`).
    Num(String),
    /// An operator or punctuation.
    Sym(&'static str),
}

/// A token and the line it is on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: usize,
}

const SYMBOLS: [&str; 21] = [
    "==", "!=", "!~", "<=", ">=", "&&", "||", "+=", "-=", "~", "!", "<", ">", "=", "+", "-", "(",
    ")", "{", "}", ";",
];

/// The tokens of `text`; comments (`#`, `//`, `/* */`) are skipped. A byte that starts no token is an
/// error naming its line.
pub(crate) fn tokens(text: &str) -> Result<Vec<Token>, (usize, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < bytes.len() {
        let c = bytes[i];
        let rest = &text[i..];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' || rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if let Some(comment) = rest.strip_prefix("/*") {
            let end = comment.find("*/").map_or(rest.len(), |e| e + 4);
            line += rest[..end].matches('\n').count();
            i += end;
        } else if let Some(long) = rest.strip_prefix("{\"") {
            let end = long
                .find("\"}")
                .ok_or((line, "a long string {\" is not closed".to_owned()))?;
            let s = &long[..end];
            out.push(Token {
                tok: Tok::Str(s.to_owned()),
                line,
            });
            line += s.matches('\n').count();
            i += end + 4;
        } else if c == b'"' {
            let end = rest[1..]
                .find(['"', '\n'])
                .filter(|&e| rest.as_bytes()[1 + e] == b'"')
                .ok_or((line, "a string is not closed on its line".to_owned()))?;
            out.push(Token {
                tok: Tok::Str(rest[1..1 + end].to_owned()),
                line,
            });
            i += end + 2;
        } else if c.is_ascii_digit() {
            let n = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '.'))
                .unwrap_or(rest.len());
            out.push(Token {
                tok: Tok::Num(rest[..n].to_owned()),
                line,
            });
            i += n;
        } else if c.is_ascii_alphabetic()
            || c == b'_'
            || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_alphabetic))
        {
            // Header names hold `-`, variables `.`: `req.http.X-Magento-Tags`.
            let n = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-')))
                .unwrap_or(rest.len());
            out.push(Token {
                tok: Tok::Ident(rest[..n].to_owned()),
                line,
            });
            i += n;
        } else if let Some(sym) = SYMBOLS.iter().find(|s| rest.starts_with(**s)) {
            out.push(Token {
                tok: Tok::Sym(sym),
                line,
            });
            i += sym.len();
        } else if c == b',' {
            out.push(Token {
                tok: Tok::Sym(","),
                line,
            });
            i += 1;
        } else if c == b'/' {
            // An ACL's mask: `"10.0.0.0"/8`.
            out.push(Token {
                tok: Tok::Sym("/"),
                line,
            });
            i += 1;
        } else {
            let ch = rest.chars().next().unwrap_or('?');
            return Err((line, format!("unexpected {ch:?}")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_lines() {
        let text = "sub vcl_recv {\n  # a comment\n  if (req.http.X-Tags ~ \"a|b\" && req.url != {\"x\ny\"}) {\n    set beresp.ttl = 120s; /* c\n */ }\n}";
        let toks = tokens(text).unwrap();
        let shown: Vec<String> = toks
            .iter()
            .map(|t| match &t.tok {
                Tok::Ident(s) => format!("{}:{s}", t.line),
                Tok::Str(s) => format!("{}:{s:?}", t.line),
                Tok::Num(s) => format!("{}:#{s}", t.line),
                Tok::Sym(s) => format!("{}:{s}", t.line),
            })
            .collect();
        assert_eq!(
            shown.join(" "),
            // The long string spans lines 3 and 4: what follows it is on line 4.
            "1:sub 1:vcl_recv 1:{ 3:if 3:( 3:req.http.X-Tags 3:~ 3:\"a|b\" 3:&& 3:req.url 3:!= 3:\"x\\ny\" 4:) 4:{ 5:set 5:beresp.ttl 5:= 5:#120s 5:; 6:} 7:}"
        );
        assert!(tokens("set x = \"open").is_err());
    }
}
