//! The surrogate-key index: sled tree `tags`, one empty record per (tag, cache key, generation), so purging
//! a tag is a prefix scan. Entries are written before the object they point to and removed after it, so a
//! crash can leave an entry without an object (skipped and cleaned later) but never an object without its
//! entries.

use std::collections::HashSet;

use crate::{error::StoreError, meta::ObjectMeta};

use super::Store;

/// A stored body a tag points at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Tagged {
    /// The cache key of the record holding the body.
    pub(crate) primary: String,
    /// The body's generation: a body stored again under the same key is another entry.
    pub(crate) generation: u64,
}

fn entry(tag: &str, primary: &str, generation: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(tag.len() + primary.len() + 10);
    key.extend_from_slice(tag.as_bytes());
    key.push(0);
    key.extend_from_slice(primary.as_bytes());
    key.push(0);
    key.extend_from_slice(&generation.to_be_bytes());
    key
}

fn prefix(tag: &str) -> Vec<u8> {
    let mut p = tag.as_bytes().to_vec();
    p.push(0);
    p
}

/// Splits an entry key; `None` for a malformed one. Tags and cache keys never contain NUL (header values
/// and request targets cannot), so the first NUL ends the tag.
fn parse(key: &[u8]) -> Option<(String, Tagged)> {
    let (head, generation) = key.split_at_checked(key.len().checked_sub(8)?)?;
    let (tag, rest) = head.split_at(head.iter().position(|&b| b == 0)?);
    let primary = rest.strip_prefix(&[0u8])?.strip_suffix(&[0u8])?;
    Some((
        String::from_utf8(tag.to_vec()).ok()?,
        Tagged {
            primary: String::from_utf8(primary.to_vec()).ok()?,
            generation: u64::from_be_bytes(generation.try_into().ok()?),
        },
    ))
}

fn add(tree: &sled::Tree, primary: &str, meta: &ObjectMeta) -> Result<(), StoreError> {
    for tag in &meta.tags {
        tree.insert(entry(tag, primary, meta.generation), &[])?;
    }
    Ok(())
}

fn remove(tree: &sled::Tree, primary: &str, meta: &ObjectMeta) -> Result<(), StoreError> {
    for tag in &meta.tags {
        tree.remove(entry(tag, primary, meta.generation))?;
    }
    Ok(())
}

/// Every body carrying one of `tags`, and the index keys that pointed there.
fn find(tree: &sled::Tree, tags: &[String]) -> Result<Vec<(Vec<u8>, Tagged)>, StoreError> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for tag in tags {
        for item in tree.scan_prefix(prefix(tag)) {
            let (key, _) = item?;
            match parse(&key) {
                Some((_, tagged)) if seen.insert(tagged.clone()) => {
                    found.push((key.to_vec(), tagged))
                }
                Some(_) => {}
                None => {
                    tree.remove(&key)?;
                }
            }
        }
    }
    Ok(found)
}

impl Store {
    /// Adds the entries of `meta`'s tags; the locked record operations call it before writing the record
    /// that carries them.
    pub(super) fn index_tags(&self, primary: &str, meta: &ObjectMeta) -> Result<(), StoreError> {
        add(&self.inner.tags, primary, meta)
    }

    /// Removes the entries of `meta`'s tags; the locked record operations call it after removing the
    /// body from its record.
    pub(super) fn unindex_tags(&self, primary: &str, meta: &ObjectMeta) -> Result<(), StoreError> {
        remove(&self.inner.tags, primary, meta)
    }

    /// Every body the index says carries one of `tags`, once each, with the entry that pointed at it
    /// (a malformed entry met on the way is removed). The body may be gone already: act on it through
    /// the locked record operations, by generation.
    pub(crate) fn tagged(&self, tags: &[String]) -> Result<Vec<(Vec<u8>, Tagged)>, StoreError> {
        find(&self.inner.tags, tags)
    }

    /// Removes the index entry `key` when the body it points at (`tagged`) is no longer stored; returns
    /// whether it was removed.
    pub(crate) fn prune_tag_entry(&self, key: &[u8], tagged: &Tagged) -> Result<bool, StoreError> {
        if self.stored_generation(&tagged.primary, tagged.generation)? {
            return Ok(false);
        }
        self.inner.tags.remove(key)?;
        Ok(true)
    }

    /// Removes every entry whose body is gone, or that is malformed: left behind by a crash between
    /// removing an object and its entries, or by a record dropped as unreadable. Walks the whole index:
    /// the sweeper runs it.
    pub(crate) fn prune_tag_index(&self) -> Result<(), StoreError> {
        for item in self.inner.tags.iter() {
            let (key, _) = item?;
            match parse(&key) {
                Some((_, tagged)) => {
                    self.prune_tag_entry(&key, &tagged)?;
                }
                None => {
                    self.inner.tags.remove(&key)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let key = entry("product-1", "shop.test/p/1?x=\u{e9}", 42);
        let (tag, tagged) = parse(&key).unwrap();
        assert_eq!(tag, "product-1");
        assert_eq!(tagged.primary, "shop.test/p/1?x=\u{e9}");
        assert_eq!(tagged.generation, 42);
        assert!(key.starts_with(&prefix("product-1")));
        assert!(
            !key.starts_with(&prefix("product")),
            "a tag is not a prefix of a longer one"
        );
        assert_eq!(parse(b"short"), None);
        assert_eq!(parse(b"no-separators-at-all"), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pruning_removes_entries_whose_body_is_gone_and_keeps_the_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::StoreBuilder::small(dir.path())
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let live = ObjectMeta {
            generation: store.next_id(),
            status: 200,
            ttl_ms: 60_000,
            stored_at_ms: lacquer_clock::now_ms(),
            tags: vec!["t".into()],
            ..ObjectMeta::default()
        };
        store
            .publish("a.test/live", live.clone(), store.mark().epoch)
            .unwrap();
        // What a crash between removing a record and its entries leaves behind.
        let dead = ObjectMeta {
            generation: store.next_id(),
            ..live.clone()
        };
        store.index_tags("a.test/dead", &dead).unwrap();
        store.inner.tags.insert(b"malformed", &[]).unwrap();
        let found = store.tagged(&["t".into()]).unwrap();
        assert_eq!(found.len(), 2, "the index still points at the dead body");
        let (key, tagged) = found
            .iter()
            .find(|(_, t)| t.primary == "a.test/dead")
            .unwrap();
        assert!(store.prune_tag_entry(key, tagged).unwrap());
        store.index_tags("a.test/dead", &dead).unwrap();
        store.prune_tag_index().unwrap();
        let left: Vec<Tagged> = store
            .tagged(&["t".into()])
            .unwrap()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            left,
            [Tagged {
                primary: "a.test/live".into(),
                generation: live.generation
            }]
        );
        assert!(store.inner.tags.get(b"malformed").unwrap().is_none());
    }
}
