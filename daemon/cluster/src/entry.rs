//! The entries of the invalidation log. Each revision of `<prefix>/invalidations` holds one entry, or
//! several a node wrote together (a JSON array, in the order they were taken).

use lacquer_proxy::{cluster::Invalidation, invalidation::PurgeTarget};
use lacquer_storage::{BanExpr, BanSyntaxError};
use serde::{Deserialize, Serialize};

/// An invalidation as the log carries it: JSON, so an operator can read the log with `etcdctl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique per entry: the node that took it acknowledges it when it sees this id applied.
    pub id: String,
    /// The node that took it.
    pub from: String,
    /// What it invalidates.
    #[serde(flatten)]
    pub op: Op,
}

/// What an entry invalidates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A ban, in canonical form.
    Ban { expression: String },
    /// Every variant of one cache key.
    Purge { key: String, soft: bool },
    /// Every object carrying one of the tags.
    PurgeTags { tags: Vec<String>, soft: bool },
}

impl Op {
    /// The log's form of an invalidation.
    pub fn of(inv: &Invalidation) -> Op {
        match inv {
            Invalidation::Ban(expr) => Op::Ban {
                expression: expr.to_string(),
            },
            Invalidation::Purge {
                target: PurgeTarget::Key(key),
                soft,
            } => Op::Purge {
                key: key.clone(),
                soft: *soft,
            },
            Invalidation::Purge {
                target: PurgeTarget::Tags(tags),
                soft,
            } => Op::PurgeTags {
                tags: tags.clone(),
                soft: *soft,
            },
        }
    }

    /// The invalidation to apply; a ban that does not parse here (a newer node's syntax) is an error.
    pub fn invalidation(&self) -> Result<Invalidation, BanSyntaxError> {
        Ok(match self {
            Op::Ban { expression } => Invalidation::Ban(BanExpr::parse(expression)?),
            Op::Purge { key, soft } => Invalidation::Purge {
                target: PurgeTarget::Key(key.clone()),
                soft: *soft,
            },
            Op::PurgeTags { tags, soft } => Invalidation::Purge {
                target: PurgeTarget::Tags(tags.clone()),
                soft: *soft,
            },
        })
    }
}

/// The value of one revision holding `entries` (JSON each), oldest first: a lone entry as itself, as
/// every version wrote it; several as a JSON array.
pub fn batch(entries: &[&[u8]]) -> Vec<u8> {
    if let [one] = entries {
        return one.to_vec();
    }
    let mut out = Vec::with_capacity(entries.iter().map(|e| e.len() + 1).sum::<usize>() + 1);
    out.push(b'[');
    for (n, entry) in entries.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(entry);
    }
    out.push(b']');
    out
}

/// The entries of one revision's value, oldest first: each as an [`Entry`], or as its JSON text when this
/// node cannot read it (a newer version's). A value that is neither an entry nor an array of them is one
/// entry this node cannot read.
pub fn read(value: &[u8]) -> Vec<Result<Entry, String>> {
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    if value.trim_ascii_start().first() != Some(&b'[') {
        return vec![serde_json::from_slice(value).map_err(|_| text(value))];
    }
    match serde_json::from_slice::<Vec<serde_json::Value>>(value) {
        Ok(items) => items
            .into_iter()
            .map(|item| {
                let json = item.to_string();
                serde_json::from_value(item).map_err(|_| json)
            })
            .collect(),
        Err(_) => vec![Err(text(value))],
    }
}

/// What a node applies in place of history it cannot read or that etcd no longer has: a ban of every
/// object stored before it.
pub fn everything() -> Invalidation {
    Invalidation::Ban(BanExpr::parse(r#"req.url ~ "^""#).expect("a valid ban"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_as_written_and_as_an_operator_reads_them() {
        let cases = [
            (
                Op::Ban {
                    expression: r#"req.url ~ "^/news""#.into(),
                },
                r#"{"id":"n1-1","from":"n1","op":"ban","expression":"req.url ~ \"^/news\""}"#,
            ),
            (
                Op::Purge {
                    key: "shop.test/a?b".into(),
                    soft: true,
                },
                r#"{"id":"n1-1","from":"n1","op":"purge","key":"shop.test/a?b","soft":true}"#,
            ),
            (
                Op::PurgeTags {
                    tags: vec!["t1".into(), "t2".into()],
                    soft: false,
                },
                r#"{"id":"n1-1","from":"n1","op":"purge_tags","tags":["t1","t2"],"soft":false}"#,
            ),
        ];
        for (op, json) in cases {
            let entry = Entry {
                id: "n1-1".into(),
                from: "n1".into(),
                op,
            };
            assert_eq!(serde_json::to_string(&entry).unwrap(), json);
            assert_eq!(serde_json::from_str::<Entry>(json).unwrap(), entry);
        }
    }

    #[test]
    fn an_invalidation_survives_the_log_unchanged() {
        let ban = Invalidation::Ban(BanExpr::parse("req.url ~ ^/a && obj.status == 200").unwrap());
        let back = Op::of(&ban).invalidation().unwrap();
        let (Invalidation::Ban(a), Invalidation::Ban(b)) = (&ban, &back) else {
            panic!("{back:?}")
        };
        assert_eq!(a.to_string(), b.to_string());
        for json in [
            r#"{"id":"x","from":"n9","op":"ban","expression":"req.nope == 1"}"#,
            r#"{"id":"x","from":"n9","op":"rewrite","url":"/a"}"#,
            r#"not json"#,
        ] {
            let readable = serde_json::from_str::<Entry>(json)
                .ok()
                .and_then(|e| e.op.invalidation().ok());
            assert!(
                readable.is_none(),
                "{json} must not read as an invalidation"
            );
        }
    }

    fn purge(n: u32) -> Entry {
        Entry {
            id: format!("n1-1-{n}"),
            from: "n1".into(),
            op: Op::Purge {
                key: format!("shop.test/{n}"),
                soft: false,
            },
        }
    }

    #[test]
    fn a_lone_entry_is_written_as_before_and_several_as_an_array_in_order() {
        let one = serde_json::to_vec(&purge(1)).unwrap();
        assert_eq!(batch(&[&one]), one, "what every version reads");
        assert_eq!(read(&one), vec![Ok(purge(1))]);

        let jsons: Vec<Vec<u8>> = (0..5)
            .map(|n| serde_json::to_vec(&purge(n)).unwrap())
            .collect();
        let refs: Vec<&[u8]> = jsons.iter().map(Vec::as_slice).collect();
        let value = batch(&refs);
        assert_eq!(value[0], b'[');
        let back: Vec<Entry> = read(&value).into_iter().map(Result::unwrap).collect();
        assert_eq!(back, (0..5).map(purge).collect::<Vec<_>>());
    }

    #[test]
    fn an_unreadable_entry_in_a_batch_is_that_one_alone() {
        let value = br#"[{"id":"a","from":"n1","op":"ban","expression":"req.url ~ ^/a"},{"id":"b","from":"n9","op":"rewrite"}]"#;
        let entries = read(value);
        assert_eq!(entries.len(), 2);
        assert!(entries[0].is_ok());
        assert!(entries[1]
            .as_ref()
            .is_err_and(|text| text.contains("rewrite")));
        for garbage in [&b"[1, 2"[..], b"not json", b""] {
            assert!(matches!(&read(garbage)[..], [Err(_)]), "{garbage:?}");
        }
    }
}
