//! Property tests (the fuzz target `ban`): any text is either a ban or an error pointing inside it, and a
//! generated ban, written with any quoting and spacing an operator might use, parses to what it says and
//! prints in a canonical form that parses back to itself.

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
struct Generated {
    field: Field,
    op: Op,
    value: String,
}

fn field() -> impl Strategy<Value = Field> {
    prop_oneof![
        Just(Field::Url),
        Just(Field::Host),
        Just(Field::Status),
        // Every token character but `!` and `~`, which end a field name (they start an operator).
        "[A-Za-z0-9#$%&'*+.^_`|-]{1,20}".prop_map(Field::Header),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop::sample::select(vec![Op::Eq, Op::Ne, Op::Match, Op::NoMatch])
}

/// Text an operator could compare against: anything printable, quotes and backslashes included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,24}",
        "/[a-z0-9/._?=&%-]{0,24}",
        "[\\\\\"' ]{1,6}",
        "\\PC{0,8}",
    ]
}

/// A regex that compiles: a literal escaped, or a few of the shapes bans use.
fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        text().prop_map(|t| regex::escape(&t)),
        "\\^/[a-z]{1,8}(/\\.\\*)?",
        "\\\\\\.(css|js|png)\\$",
        "\\(\\?i\\)[a-z]{1,6}",
    ]
}

fn condition() -> impl Strategy<Value = Generated> {
    (field(), op()).prop_flat_map(|(field, op)| {
        let value = match (&field, op) {
            (Field::Status, _) => (100u16..=999).prop_map(|s| s.to_string()).boxed(),
            (_, Op::Match | Op::NoMatch) => pattern().boxed(),
            _ => text().boxed(),
        };
        let op = match field {
            Field::Status if matches!(op, Op::Match | Op::NoMatch) => Op::Eq,
            _ => op,
        };
        value.prop_map(move |value| Generated {
            field: field.clone(),
            op,
            value,
        })
    })
}

#[derive(Debug, Clone, Copy)]
enum Quoting {
    Double,
    Single,
    Bare,
}

fn render(c: &Generated, quoting: Quoting, space: &str) -> String {
    let field = match &c.field {
        Field::Url => "req.url".to_owned(),
        Field::Host => "req.http.host".to_owned(),
        Field::Status => "obj.status".to_owned(),
        Field::Header(name) => format!("obj.http.{name}"),
    };
    let op = match c.op {
        Op::Eq => "==",
        Op::Ne => "!=",
        Op::Match => "~",
        Op::NoMatch => "!~",
    };
    let bare_ok = !c.value.is_empty()
        && !c.value.starts_with(['"', '\'', '&'])
        && !c.value.chars().any(char::is_whitespace);
    let value = match quoting {
        Quoting::Bare if bare_ok => c.value.clone(),
        Quoting::Single => format!("'{}'", c.value.replace('\\', "\\\\").replace('\'', "\\'")),
        _ => format!("\"{}\"", c.value.replace('\\', "\\\\").replace('"', "\\\"")),
    };
    // With no space, an operator character ending a bare value would run into the next token.
    let space = if space.is_empty() { " " } else { space };
    format!("{field}{space}{op}{space}{value}")
}

/// What the canonical form of a generated ban must be, written from the grammar rather than from `fmt`.
fn canonical(conditions: &[Generated]) -> String {
    conditions
        .iter()
        .map(|c| {
            let value = match (&c.field, c.op) {
                (Field::Status, _) => return render(c, Quoting::Bare, " "),
                (Field::Host, Op::Eq | Op::Ne) => normal_host(c.value.trim()).into_owned(),
                _ => c.value.clone(),
            };
            let field = match &c.field {
                Field::Header(name) => Field::Header(name.to_ascii_lowercase()),
                other => other.clone(),
            };
            render(
                &Generated {
                    field,
                    op: c.op,
                    value,
                },
                Quoting::Double,
                " ",
            )
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

proptest! {
    #[test]
    fn fuzz_ban_round_trip(
        conditions in prop::collection::vec(
            (condition(), prop::sample::select(vec![Quoting::Double, Quoting::Single, Quoting::Bare])),
            1..5,
        ),
        space in prop_oneof![Just(""), Just(" "), Just("\t"), Just("  ")],
        around in prop_oneof![Just(""), Just(" "), Just("\n")],
    ) {
        let text = conditions
            .iter()
            .map(|(c, q)| render(c, *q, space))
            .collect::<Vec<_>>()
            .join(" && ");
        let text = format!("{around}{text}{around}");
        let ban = BanExpr::parse(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        let generated: Vec<Generated> = conditions.into_iter().map(|(c, _)| c).collect();
        let printed = ban.to_string();
        prop_assert_eq!(&printed, &canonical(&generated), "from {:?}", text);
        let again = BanExpr::parse(&printed)
            .map_err(|e| TestCaseError::fail(format!("canonical {printed:?}: {e}")))?;
        prop_assert_eq!(again.to_string(), printed);
    }

    #[test]
    fn fuzz_ban_arbitrary(text in prop_oneof![
        "\\PC{0,64}",
        "((req\\.url|req\\.http\\.host|obj\\.status|obj\\.http\\.[a-z-]{0,8}) ?(==|!=|~|!~|=|!) ?[\"']?[a-z0-9^$.*()\\[\\\\/ &]{0,12}[\"']? ?(&&)? ?){1,4}",
    ]) {
        match BanExpr::parse(&text) {
            Ok(ban) => {
                let printed = ban.to_string();
                let again = BanExpr::parse(&printed)
                    .map_err(|e| TestCaseError::fail(format!("canonical {printed:?} of {text:?}: {e}")))?;
                prop_assert_eq!(again.to_string(), printed);
            }
            Err(e) => {
                let columns = text.chars().count() + 1;
                prop_assert!(
                    (1..=columns).contains(&e.position),
                    "{:?}: position {} outside 1..={}", text, e.position, columns
                );
            }
        }
    }
}

#[test]
fn fuzz_ban_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/ban");
    let text = std::fs::read_to_string(dir.join("real-world.lines")).unwrap();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        if let Ok(ban) = BanExpr::parse(line) {
            let printed = ban.to_string();
            let again = BanExpr::parse(&printed)
                .unwrap_or_else(|e| panic!("line {}: canonical {printed:?}: {e}", n + 1));
            assert_eq!(again.to_string(), printed, "line {}", n + 1);
        }
    }
}
