//! VCL read into a tree: the declarations templates use (`backend`, `probe`, `acl`, `sub`) and the
//! statements and expressions of subroutines. What is not understood is kept as [`Stmt::Other`] or
//! [`Item::Other`], with its line, for the translation to report.

use crate::lex::{Tok, Token};

/// A file's declarations, in order.
#[derive(Debug, Default)]
pub(crate) struct Program {
    pub items: Vec<Item>,
}

/// One declaration.
#[derive(Debug)]
pub(crate) enum Item {
    /// `backend NAME { .host = …; .probe = { … }; }`: the fields as `(name, value)`, a nested probe's
    /// fields in `probe`.
    Backend {
        name: String,
        fields: Vec<(String, Expr)>,
        probe: Option<Probe>,
        line: usize,
    },
    /// `probe NAME { … }`.
    Probe { name: String, probe: Probe },
    /// `acl NAME { "10.0.0.0"/8; ! "10.1.0.0"/16; }`: entries as written, `!` first when negated.
    Acl { name: String, entries: Vec<String> },
    /// `sub NAME { … }`.
    Sub { name: String, body: Vec<Stmt> },
    /// Anything else (`vcl 4.0;` and `import` are not kept).
    Other { line: usize, text: String },
}

/// A probe's fields, or the name of a probe declared apart.
#[derive(Debug, Clone)]
pub(crate) enum Probe {
    Fields(Vec<(String, Expr)>),
    Named(String),
}

/// A statement, with the lines it spans.
#[derive(Debug, Clone)]
pub(crate) enum Stmt {
    /// `if (c) { … } elsif (c) { … } else { … }`.
    If {
        branches: Vec<(Cond, Vec<Stmt>)>,
        otherwise: Option<Vec<Stmt>>,
        lines: (usize, usize),
    },
    /// `set LHS = EXPR;` (`+=` kept as its operator).
    Set {
        lhs: String,
        op: &'static str,
        value: Expr,
        line: usize,
    },
    /// `unset LHS;`.
    Unset { lhs: String, line: usize },
    /// `return (ACTION);`: the action as an expression (`pass`, `synth(404, "x")`).
    Return { action: Expr, line: usize },
    /// A function called for its effect: `hash_data(…)`, `ban(…)`, `std.collect(…)`, `synthetic(…)`.
    Call {
        name: String,
        args: Vec<Expr>,
        line: usize,
    },
    /// `call NAME;`.
    CallSub { name: String, line: usize },
    /// A statement not understood, as written.
    Other { line: usize, text: String },
}

/// A condition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cond {
    Or(Vec<Cond>),
    And(Vec<Cond>),
    Not(Box<Cond>),
    /// `left OP right`: `~`, `!~`, `==`, `!=`, `<`, `<=`, `>`, `>=`.
    Cmp(Expr, &'static str, Expr),
    /// A value on its own: true when set (a header present, a flag on).
    Truthy(Expr),
}

/// A value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    /// A variable, or a bare name (a backend, an ACL, `pass`).
    Var(String),
    Str(String),
    /// A number or a duration, as written.
    Num(String),
    /// `name(args)`.
    Call(String, Vec<Expr>),
    /// `a + b + …`.
    Concat(Vec<Expr>),
    /// `a - b` and other arithmetic, kept whole to be reported.
    Arith(Box<Expr>, &'static str, Box<Expr>),
}

/// A declaration's fields, and the probe among them.
type Fields = (Vec<(String, Expr)>, Option<Probe>);

/// A parse error: the line and what was expected.
pub(crate) type Error = (usize, String);

struct Parser<'a> {
    toks: &'a [Token],
    at: usize,
}

/// Parses the tokens of a file.
pub(crate) fn program(toks: &[Token]) -> Result<Program, Error> {
    let mut p = Parser { toks, at: 0 };
    let mut program = Program::default();
    while p.at < toks.len() {
        program.items.extend(p.item()?);
    }
    Ok(program)
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at).map(|t| &t.tok)
    }

    fn line(&self) -> usize {
        self.toks
            .get(self.at)
            .or(self.toks.last())
            .map_or(1, |t| t.line)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).map(|t| t.tok.clone());
        self.at += 1;
        t
    }

    fn is_sym(&self, s: &str) -> bool {
        matches!(self.peek(), Some(Tok::Sym(x)) if *x == s)
    }

    fn eat_sym(&mut self, s: &str) -> bool {
        if self.is_sym(s) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect_sym(&mut self, s: &str) -> Result<(), Error> {
        if self.eat_sym(s) {
            Ok(())
        } else {
            Err((
                self.line(),
                format!("expected `{s}`, found {}", self.shown()),
            ))
        }
    }

    fn shown(&self) -> String {
        match self.peek() {
            None => "the end of the file".into(),
            Some(Tok::Ident(s)) => format!("`{s}`"),
            Some(Tok::Str(s)) => format!("{s:?}"),
            Some(Tok::Num(s)) => format!("`{s}`"),
            Some(Tok::Sym(s)) => format!("`{s}`"),
        }
    }

    fn ident(&mut self) -> Result<String, Error> {
        match self.next() {
            Some(Tok::Ident(s)) => Ok(s),
            _ => {
                self.at -= 1;
                Err((
                    self.line(),
                    format!("expected a name, found {}", self.shown()),
                ))
            }
        }
    }

    /// Skips to the end of the current statement (`;`) or block, for what is not understood; the text
    /// skipped, roughly as written.
    fn skip_statement(&mut self) -> String {
        let mut depth = 0;
        let mut words = Vec::new();
        while let Some(tok) = self.peek().cloned() {
            self.at += 1;
            match &tok {
                Tok::Sym("{") | Tok::Sym("(") => depth += 1,
                Tok::Sym("}") | Tok::Sym(")") => {
                    depth -= 1;
                    if depth == 0 && matches!(tok, Tok::Sym("}")) {
                        words.push("}".to_owned());
                        break;
                    }
                }
                Tok::Sym(";") if depth == 0 => break,
                _ => {}
            }
            words.push(match tok {
                Tok::Ident(s) | Tok::Num(s) => s,
                Tok::Str(s) => format!("{s:?}"),
                Tok::Sym(s) => s.to_owned(),
            });
        }
        words.join(" ")
    }

    fn item(&mut self) -> Result<Option<Item>, Error> {
        let line = self.line();
        let word = match self.peek() {
            Some(Tok::Ident(w)) => w.clone(),
            _ => {
                let text = self.skip_statement();
                return Ok(Some(Item::Other { line, text }));
            }
        };
        match word.as_str() {
            "vcl" | "import" => {
                self.skip_statement();
                Ok(None)
            }
            "backend" => {
                self.at += 1;
                let name = self.ident()?;
                let (fields, probe) = self.fields()?;
                Ok(Some(Item::Backend {
                    name,
                    fields,
                    probe,
                    line,
                }))
            }
            "probe" => {
                self.at += 1;
                let name = self.ident()?;
                let (fields, _) = self.fields()?;
                Ok(Some(Item::Probe {
                    name,
                    probe: Probe::Fields(fields),
                }))
            }
            "acl" => {
                self.at += 1;
                let name = self.ident()?;
                self.expect_sym("{")?;
                let mut entries = Vec::new();
                while !self.eat_sym("}") {
                    let negated = self.eat_sym("!");
                    let Some(Tok::Str(addr)) = self.next() else {
                        return Err((self.line(), "an ACL entry is a quoted address".into()));
                    };
                    let mut entry = if negated { format!("!{addr}") } else { addr };
                    if self.eat_sym("/") {
                        match self.next() {
                            Some(Tok::Num(mask)) => entry = format!("{entry}/{mask}"),
                            _ => return Err((self.line(), "an ACL mask is a number".into())),
                        }
                    }
                    self.expect_sym(";")?;
                    entries.push(entry);
                }
                Ok(Some(Item::Acl { name, entries }))
            }
            "sub" => {
                self.at += 1;
                let name = self.ident()?;
                let body = self.block()?;
                Ok(Some(Item::Sub { name, body }))
            }
            _ => {
                let text = self.skip_statement();
                Ok(Some(Item::Other { line, text }))
            }
        }
    }

    /// `{ .name = value; .probe = { … }; }`.
    fn fields(&mut self) -> Result<Fields, Error> {
        self.expect_sym("{")?;
        let mut fields = Vec::new();
        let mut probe = None;
        while !self.eat_sym("}") {
            let name = self.ident()?;
            let name = name.trim_start_matches('.').to_owned();
            self.expect_sym("=")?;
            if self.is_sym("{") {
                let (inner, _) = self.fields()?;
                self.eat_sym(";");
                if name == "probe" {
                    probe = Some(Probe::Fields(inner));
                }
                continue;
            }
            let value = self.expr()?;
            self.eat_sym(";");
            if name == "probe" {
                if let Expr::Var(named) = &value {
                    probe = Some(Probe::Named(named.clone()));
                    continue;
                }
            }
            fields.push((name, value));
        }
        Ok((fields, probe))
    }

    fn block(&mut self) -> Result<Vec<Stmt>, Error> {
        self.expect_sym("{")?;
        let mut body = Vec::new();
        while !self.eat_sym("}") {
            if self.peek().is_none() {
                return Err((self.line(), "a block is not closed".into()));
            }
            body.push(self.statement()?);
        }
        Ok(body)
    }

    fn statement(&mut self) -> Result<Stmt, Error> {
        let line = self.line();
        let word = match self.peek() {
            Some(Tok::Ident(w)) => w.clone(),
            _ => {
                let text = self.skip_statement();
                return Ok(Stmt::Other { line, text });
            }
        };
        let start = self.at;
        let parsed = self.statement_of(&word, line);
        match parsed {
            Ok(stmt) => Ok(stmt),
            // A statement this reader does not follow: kept, as written, for the report.
            Err(_) => {
                self.at = start;
                let text = self.skip_statement();
                Ok(Stmt::Other { line, text })
            }
        }
    }

    /// The statement `word` starts, or why it does not read.
    fn statement_of(&mut self, word: &str, line: usize) -> Result<Stmt, Error> {
        match word {
            "if" => self.if_statement(),
            "set" => {
                self.at += 1;
                let lhs = self.ident()?;
                let op = match self.next() {
                    Some(Tok::Sym(op @ ("=" | "+=" | "-="))) => op,
                    _ => return Err((line, "expected `=` after `set NAME`".into())),
                };
                let value = self.expr()?;
                self.expect_sym(";")?;
                Ok(Stmt::Set {
                    lhs,
                    op,
                    value,
                    line,
                })
            }
            "unset" | "remove" => {
                self.at += 1;
                let lhs = self.ident()?;
                self.expect_sym(";")?;
                Ok(Stmt::Unset { lhs, line })
            }
            "return" => {
                self.at += 1;
                self.expect_sym("(")?;
                let action = self.expr()?;
                self.expect_sym(")")?;
                self.expect_sym(";")?;
                Ok(Stmt::Return { action, line })
            }
            "call" => {
                self.at += 1;
                let name = self.ident()?;
                self.expect_sym(";")?;
                Ok(Stmt::CallSub { name, line })
            }
            _ => {
                let e = self.expr()?;
                self.expect_sym(";")?;
                match e {
                    Expr::Call(name, args) => Ok(Stmt::Call { name, args, line }),
                    _ => Err((line, "a statement that does nothing".into())),
                }
            }
        }
    }

    fn if_statement(&mut self) -> Result<Stmt, Error> {
        let first = self.line();
        self.at += 1;
        let mut branches = Vec::new();
        let mut otherwise = None;
        self.expect_sym("(")?;
        let cond = self.cond()?;
        self.expect_sym(")")?;
        branches.push((cond, self.block()?));
        loop {
            match self.peek() {
                Some(Tok::Ident(w)) if matches!(w.as_str(), "elsif" | "elseif" | "elif") => {
                    self.at += 1;
                }
                Some(Tok::Ident(w)) if w == "else" => {
                    self.at += 1;
                    if matches!(self.peek(), Some(Tok::Ident(w)) if w == "if") {
                        self.at += 1;
                    } else {
                        otherwise = Some(self.block()?);
                        break;
                    }
                }
                _ => break,
            }
            self.expect_sym("(")?;
            let cond = self.cond()?;
            self.expect_sym(")")?;
            branches.push((cond, self.block()?));
        }
        let last = self
            .toks
            .get(self.at.saturating_sub(1))
            .map_or(first, |t| t.line);
        Ok(Stmt::If {
            branches,
            otherwise,
            lines: (first, last),
        })
    }

    fn cond(&mut self) -> Result<Cond, Error> {
        let mut any = vec![self.and()?];
        while self.eat_sym("||") {
            any.push(self.and()?);
        }
        Ok(if any.len() == 1 {
            any.pop().expect("one")
        } else {
            Cond::Or(any)
        })
    }

    fn and(&mut self) -> Result<Cond, Error> {
        let mut all = vec![self.unary()?];
        while self.eat_sym("&&") {
            all.push(self.unary()?);
        }
        Ok(if all.len() == 1 {
            all.pop().expect("one")
        } else {
            Cond::And(all)
        })
    }

    fn unary(&mut self) -> Result<Cond, Error> {
        if self.eat_sym("!") {
            return Ok(Cond::Not(Box::new(self.unary()?)));
        }
        if self.is_sym("(") {
            // A parenthesised condition, or a parenthesised value compared after it: tried as the first.
            let save = self.at;
            self.at += 1;
            if let Ok(c) = self.cond() {
                if self.eat_sym(")") {
                    return Ok(c);
                }
            }
            self.at = save;
        }
        let left = self.expr()?;
        let op = match self.peek() {
            Some(Tok::Sym(op @ ("~" | "!~" | "==" | "!=" | "<" | "<=" | ">" | ">="))) => *op,
            _ => return Ok(Cond::Truthy(left)),
        };
        self.at += 1;
        let right = self.expr()?;
        Ok(Cond::Cmp(left, op, right))
    }

    fn expr(&mut self) -> Result<Expr, Error> {
        let first = self.atom()?;
        let mut parts = vec![first];
        loop {
            if self.eat_sym("+") {
                parts.push(self.atom()?);
            } else if self.eat_sym("-") {
                let right = self.atom()?;
                let left = parts.pop().expect("one");
                parts.push(Expr::Arith(Box::new(left), "-", Box::new(right)));
            } else {
                break;
            }
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Expr::Concat(parts)
        })
    }

    fn atom(&mut self) -> Result<Expr, Error> {
        let line = self.line();
        match self.next() {
            Some(Tok::Str(s)) => Ok(Expr::Str(s)),
            Some(Tok::Num(n)) => Ok(Expr::Num(n)),
            Some(Tok::Ident(name)) => {
                if self.eat_sym("(") {
                    let mut args = Vec::new();
                    while !self.eat_sym(")") {
                        args.push(self.expr()?);
                        if !self.eat_sym(",") && !self.is_sym(")") {
                            return Err((line, format!("expected `,` or `)` in {name}(…)")));
                        }
                    }
                    Ok(Expr::Call(name, args))
                } else {
                    Ok(Expr::Var(name))
                }
            }
            Some(Tok::Sym("(")) => {
                let e = self.expr()?;
                self.expect_sym(")")?;
                Ok(e)
            }
            _ => {
                self.at -= 1;
                Err((line, format!("expected a value, found {}", self.shown())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lex::tokens;

    #[test]
    fn a_sub_reads_as_a_tree() {
        let text = r#"
backend default { .host = "127.0.0.1"; .port = "8080"; .probe = { .url = "/health"; .interval = 5s; } }
acl purge { "localhost"; "10.0.0.0"/8; ! "10.1.0.0"/16; }
sub vcl_recv {
    if (req.method == "PURGE") {
        if (!client.ip ~ purge) { return (synth(405, "Not allowed")); }
        ban("obj.http.X-Tags ~ " + req.http.X-Tags-Pattern);
    } elsif (req.url ~ "^/a" || (req.http.X && req.http.Y !~ "b")) {
        set req.http.Z = "1";
    } else {
        unset req.http.Cookie;
    }
    std.collect(req.http.Cookie);
    frobnicate the thing;
}
"#;
        let program = program(&tokens(text).unwrap()).unwrap();
        assert_eq!(program.items.len(), 3);
        let Item::Acl { entries, .. } = &program.items[1] else {
            panic!()
        };
        assert_eq!(entries, &["localhost", "10.0.0.0/8", "!10.1.0.0/16"]);
        let Item::Sub { body, .. } = &program.items[2] else {
            panic!()
        };
        assert_eq!(body.len(), 3);
        let Stmt::If {
            branches,
            otherwise,
            lines,
        } = &body[0]
        else {
            panic!()
        };
        assert_eq!(branches.len(), 2);
        assert!(otherwise.is_some());
        assert_eq!(*lines, (5, 12));
        assert_eq!(
            branches[1].0,
            Cond::Or(vec![
                Cond::Cmp(Expr::Var("req.url".into()), "~", Expr::Str("^/a".into())),
                Cond::And(vec![
                    Cond::Truthy(Expr::Var("req.http.X".into())),
                    Cond::Cmp(Expr::Var("req.http.Y".into()), "!~", Expr::Str("b".into())),
                ]),
            ])
        );
        assert!(matches!(&body[2], Stmt::Other { line: 14, .. }));
        let Item::Backend { probe, fields, .. } = &program.items[0] else {
            panic!()
        };
        assert_eq!(fields.len(), 2);
        assert!(matches!(probe, Some(Probe::Fields(f)) if f.len() == 2));
    }
}
