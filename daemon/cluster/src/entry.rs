//! One entry of the invalidation log, as the value of a revision of `<prefix>/invalidations`.

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
}
