//! A translation as a configuration file: TOML that `lacquerd --check` reads, each piece under the VCL
//! lines it came from, what was not translated listed at the end as comments.

use std::fmt::Write;

use lacquer_config::Backend;
use toml::{Table, Value};

use crate::translate::{Piece, Translation, Untranslated};

/// The most VCL lines quoted above one piece.
const QUOTED: usize = 12;

/// The translation of `file` (its VCL `source`) as a configuration file.
pub fn render(t: &Translation, file: &str, source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Translated from {file} by `cachectl vcl2rules`: {} rule(s), {} construct(s) not translated.",
        t.rules.len(),
        t.untranslated.len()
    );
    let _ = writeln!(
        out,
        "# Review it before use: what was not translated is listed at the end, with why. Then run"
    );
    let _ = writeln!(
        out,
        "# `lacquerd --check --config FILE`, and add `examples` to the rules (docs/rules.md)."
    );
    let defaults = table_of(&Backend::default());
    for b in &t.backends {
        quote(&mut out, b, &lines);
        let mut table = table_of(&b.value);
        // Only what the VCL set: the rest is lacquerd's default.
        without_defaults(&mut table, &defaults);
        table.insert("name".into(), Value::String(b.value.name.clone()));
        out.push_str(&array_entry("backend", table));
    }
    if let Some(p) = &t.purge_allow {
        quote(&mut out, p, &lines);
        let nets: Vec<Value> = p
            .value
            .iter()
            .map(|n| Value::String(n.to_string()))
            .collect();
        let mut purge = Table::new();
        purge.insert("allow_from".into(), Value::Array(nets));
        let mut doc = Table::new();
        doc.insert("purge".into(), Value::Table(purge));
        out.push('\n');
        out.push_str(&toml::to_string(&doc).expect("a table"));
    }
    let default_rule = table_of(&lacquer_config::Rule::default());
    for r in &t.rules {
        quote(&mut out, r, &lines);
        let mut table = table_of(&r.value);
        without_defaults(&mut table, &default_rule);
        out.push_str(&array_entry("rule", table));
    }
    listed(&mut out, "Not translated (review each):", &t.untranslated);
    listed(&mut out, "Needs no rule here:", &t.unneeded);
    out
}

fn listed(out: &mut String, title: &str, items: &[Untranslated]) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n# {title}");
    for u in items {
        let _ = writeln!(out, "#   line {}: {}", u.line, u.construct);
        let _ = writeln!(out, "#       {}", u.why);
    }
}

/// The VCL lines a piece came from, as comments.
fn quote<T>(out: &mut String, piece: &Piece<T>, lines: &[&str]) {
    let (first, last) = piece.lines;
    let _ = writeln!(
        out,
        "\n# {}, line{} {}{}:",
        piece.from,
        if first == last { "" } else { "s" },
        first,
        if first == last {
            String::new()
        } else {
            format!("-{last}")
        }
    );
    let shown = (last + 1 - first).min(QUOTED);
    for n in first..first + shown {
        if let Some(text) = lines.get(n - 1) {
            let _ = writeln!(out, "#   {}", text.trim_end());
        }
    }
    if last + 1 - first > shown {
        let _ = writeln!(out, "#   …");
    }
}

/// A value as a TOML table.
fn table_of<T: serde::Serialize>(value: &T) -> Table {
    match Value::try_from(value) {
        Ok(Value::Table(t)) => t,
        _ => Table::new(),
    }
}

/// `t` without what it holds as `defaults` does (a `false` that is a default, an empty list), so a rule
/// shows what the VCL said; a `false` that is not a default (`store = false`) stays. In the tables of a
/// list (a rule's `ban` entries), a `false` is their default.
fn without_defaults(t: &mut Table, defaults: &Table) {
    for (key, v) in t.iter_mut() {
        match (v, defaults.get(key)) {
            (Value::Table(inner), Some(Value::Table(d))) => without_defaults(inner, d),
            (Value::Array(items), _) => {
                for item in items {
                    if let Value::Table(inner) = item {
                        inner.retain(|_, v| !matches!(v, Value::Boolean(false)));
                    }
                }
            }
            _ => {}
        }
    }
    t.retain(|key, v| {
        let empty = matches!(v, Value::Table(inner) if inner.is_empty());
        !empty && defaults.get(key) != Some(v)
    });
}

/// `[[name]]` with `table` in it.
fn array_entry(name: &str, table: Table) -> String {
    let mut doc = Table::new();
    doc.insert(name.into(), Value::Array(vec![Value::Table(table)]));
    toml::to_string(&doc).expect("a table")
}
