//! Property tests (the fuzz target `config`): no TOML document panics the loader or the builders, and a
//! document with one setting given a wrong, odd or extreme value is either accepted or refused with an
//! error that names that setting.

use std::path::Path;

use lacquer_config::Overrides;
use proptest::prelude::*;
use toml::{Table, Value};

use super::*;

/// Every setting: the defaults as the daemon writes them, plus one of each list the defaults leave empty.
fn full_document() -> Table {
    let mut doc = Table::try_from(Config::default()).unwrap();
    let lists: Table = toml::from_str(
        r#"
        [[director]]
        name = "pool"
        policy = "hash"
        backends = ["default"]
        [[route]]
        host = "*.example.com"
        path_regex = "^/api/"
        backend = "pool"
        [[deny]]
        path_regex = "^/admin"
        "#,
    )
    .unwrap();
    doc.extend(lists);
    let backend: Table = toml::from_str(
        r#"
        address = "127.0.0.1:8080"
        probe = { url = "/health", interval = "5s", window = 8, threshold = 3 }
        "#,
    )
    .unwrap();
    doc["backend"].as_array_mut().unwrap()[0]
        .as_table_mut()
        .unwrap()
        .extend(backend);
    doc
}

/// The path of every leaf setting, as `(["listen", "0", "address"], "listen[0].address")`.
fn leaves(value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Table(t) => {
            for (k, v) in t {
                path.push(k.clone());
                leaves(v, path, out);
                path.pop();
            }
        }
        Value::Array(a) if a.iter().all(Value::is_table) && !a.is_empty() => {
            for (i, v) in a.iter().enumerate() {
                path.push(i.to_string());
                leaves(v, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

fn slot<'a>(doc: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(doc, |v, k| match v {
        Value::Table(t) => t.get_mut(k).unwrap(),
        Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => unreachable!(),
    })
}

fn odd_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(Value::Integer),
        prop_oneof![Just(0i64), Just(-1), Just(1), Just(65_536)].prop_map(Value::Integer),
        any::<f64>().prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        "\\PC{0,24}".prop_map(Value::String),
        prop_oneof![
            Just(""),
            Just("0"),
            Just("-1s"),
            Just("1 parsec"),
            Just("18446744073709551616B"),
            Just("999999999999 years"),
            Just("0.5 GiB"),
            Just("127.0.0.1:99999"),
            Just("[::1"),
            Just("http://"),
            Just("https://:443"),
            Just("*"),
            Just("(("),
            Just("/dev/null"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..3)
                .prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

/// Reads and builds as `lacquerd --config` does, with the store in a scratch directory.
fn load(text: &str, dir: &Path) -> Result<Config, ConfigError> {
    let file = dir.join("lacquer.toml");
    std::fs::write(&file, text).unwrap();
    let overrides = Overrides {
        disk: Some(dir.join("store")),
        ..Default::default()
    };
    let config = Config::load(Some(&file), overrides)?;
    compile(&config)?;
    Ok(config)
}

/// How an error may name `path`: `listen[0].address`, `listen[0]`, or `backend.address` for the single
/// backend.
fn names(error: &str, path: &[String]) -> bool {
    let mut spelled = String::new();
    let mut forms = Vec::new();
    for (i, part) in path.iter().enumerate() {
        match part.parse::<usize>() {
            Ok(n) => spelled.push_str(&format!("[{n}]")),
            Err(_) if i == 0 => spelled.push_str(part),
            Err(_) => spelled.push_str(&format!(".{part}")),
        }
        forms.push(spelled.clone());
    }
    forms.push(spelled.replace("backend[0]", "backend"));
    forms.iter().skip(1).any(|f| error.contains(f.as_str())) || error.contains(&path[0])
}

proptest! {
    #[test]
    fn fuzz_config_odd_value(pick in any::<prop::sample::Index>(), value in odd_value()) {
        let mut doc = Value::Table(full_document());
        let mut all = Vec::new();
        leaves(&doc, &mut Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        *slot(&mut doc, &path) = value;
        let text = toml::to_string(&doc).unwrap();
        let dir = tempfile::tempdir().unwrap();
        if let Err(e) = load(&text, dir.path()) {
            let e = e.to_string();
            prop_assert!(names(&e, &path), "{:?} is not named by {:?}", path, e);
            prop_assert!(!e.contains('\n'), "one line: {:?}", e);
        }
    }

    #[test]
    fn fuzz_config_arbitrary_text(text in prop_oneof![
        "\\PC{0,200}",
        "(\\[\\[?(listen|server|backend|storage|cache|route|deny)\\]\\]?\n([a-z_]{1,12} = (\"[^\"\n]{0,12}\"|[0-9-]{1,6}|true|\\[\\])\n){0,4}){1,4}",
    ]) {
        let dir = tempfile::tempdir().unwrap();
        if let Err(e) = load(&text, dir.path()) {
            prop_assert!(!e.to_string().contains('\n'), "one line: {:?}", e.to_string());
        }
    }
}

#[test]
fn fuzz_config_corpus() {
    for (at, text) in lacquer_corpus::text_cases("config") {
        let dir = tempfile::tempdir().unwrap();
        match load(&text, dir.path()) {
            Ok(_) => assert!(!at.starts_with("bad-"), "{at} was accepted"),
            Err(e) => {
                assert!(at.starts_with("bad-"), "{at}: {e}");
                assert!(!e.to_string().contains('\n'), "{at}: {e}");
            }
        }
    }
}
