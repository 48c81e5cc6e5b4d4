//! The hot metadata copy: a foyer in-memory cache of object sets by cache key, bounded by
//! `storage.metadata_cache` bytes. Its weight is what an entry really takes from the allocator, not the
//! size of the data it holds: foyer's record and table slot, the key, every allocation of the set, and the
//! response head a hit prepares from the stored headers ([`crate::ObjectMeta::prepared`]), which is made
//! after the entry is weighed and so is counted up front. Weighed by the data alone (the weight before), a 64 MiB
//! copy took 118 MiB of RSS at 100 000 objects without a single prepared head, and each head a hit made
//! added about as much again, none of it counted. While deliver rules edit prepared heads ahead of their
//! hits ([`crate::Store::weigh_edited_heads`]), each head's edited copy is counted too.

use std::{
    mem::size_of,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc,
    },
};

use foyer::{Cache, CacheBuilder, SieveConfig};
use http::{HeaderName, HeaderValue};

use crate::meta::{ObjectMeta, ObjectSet};

/// The hot metadata copy.
pub(super) type HotCopy = Cache<String, Arc<ObjectSet>>;

/// What foyer takes per entry beyond the key and value it is given: its record (key, value, hash, weight,
/// eviction links, reference count and flags, in an `Arc`) and its share of the shard's hash table. The
/// test below checks the whole weight against what inserting an entry takes (foyer 0.22: within 7 %).
const ENTRY: usize = 176;

/// Edited copies of prepared heads, as the hot copy weighs them: 0 for none, else 1 + the fields they may
/// add ([`crate::Store::weigh_edited_heads`]).
pub(super) type EditedHeads = Arc<AtomicUsize>;

/// A hot copy holding at most `bytes` of entries, by [`weight`]; each prepared head is weighed with the
/// edited copy `edited` says it has.
pub(super) fn hot_copy(bytes: usize, edited: EditedHeads) -> HotCopy {
    CacheBuilder::new(bytes)
        .with_eviction_config(SieveConfig)
        .with_weighter(move |key: &String, set: &Arc<ObjectSet>| {
            weight(key, set, edited.load(Relaxed).checked_sub(1))
        })
        .build()
}

/// Bytes the allocator hands out for a request of `n`: jemalloc's size classes (8, 16, then steps of 16
/// to 128, then four classes per doubling).
fn heap(n: usize) -> usize {
    match n {
        0 => 0,
        1..=8 => 8,
        9..=128 => n.div_ceil(16) * 16,
        _ => {
            let step = 1 << (usize::BITS - 3 - (n - 1).leading_zeros());
            n.div_ceil(step) * step
        }
    }
}

/// The bytes an entry of the hot copy takes: see the module's documentation.
pub(super) fn weight(key: &str, set: &ObjectSet, edited: Option<usize>) -> usize {
    let variants: usize = set.variants.iter().map(|m| meta_heap(m, edited)).sum();
    let siblings: usize = set
        .siblings
        .iter()
        .map(|s| {
            let head = set
                .variants
                .iter()
                .find(|v| v.generation == s.of)
                .map_or(0, |v| prepared_head(v, edited));
            s.coding.as_ref().map_or(0, |c| heap(c.len())) + meta_heap(&s.body, edited) + head
        })
        .sum();
    let partials: usize = set
        .partials
        .iter()
        .map(|p| {
            heap(p.parts.capacity() * size_of::<crate::meta::Part>())
                + p.parts
                    .iter()
                    .map(|part| meta_heap(&part.body, None))
                    .sum::<usize>()
        })
        .sum();
    ENTRY
        + heap(key.len())
        + heap(set.partials.capacity() * size_of::<crate::meta::Partial>())
        + partials
        + heap(2 * size_of::<usize>() + size_of::<ObjectSet>())
        + heap(set.variants.capacity() * size_of::<ObjectMeta>())
        + heap(set.siblings.capacity() * size_of::<crate::meta::Sibling>())
        + variants
        + siblings
}

/// What one metadata's fields allocate, and the header map a hit prepares from its headers.
fn meta_heap(meta: &ObjectMeta, edited: Option<usize>) -> usize {
    let pair = size_of::<(String, Vec<u8>)>();
    let headers: usize = meta
        .headers
        .iter()
        .map(|(n, v)| heap(n.len()) + heap(v.len()))
        .sum();
    let variant: usize = meta
        .variant
        .iter()
        .map(|(n, v)| heap(n.len()) + heap(v.len()))
        .sum();
    let tags: usize = meta.tags.iter().map(|t| heap(t.len())).sum();
    heap(meta.headers.capacity() * pair)
        + headers
        + heap(meta.variant.capacity() * size_of::<(String, String)>())
        + variant
        + heap(meta.tags.capacity() * size_of::<String>())
        + tags
        + prepared_head(meta, edited)
}

/// The response head the data path prepares from `meta`'s fields ([`ObjectMeta::prepared`]; the proxy's
/// `prepared.rs`): boxed with a few facts about the body, `http`'s table for the stored fields and the
/// seven a response adds (a power of two of 2-byte-hash, 2-byte-index positions, and three quarters as
/// many buckets of name, value, hash and links), each value copied, and each name that is not one `http`
/// knows copied too (counted for every name: most stored names are known ones, and a little too much is
/// the safe side). The first clone of a copied value or name, which every hit makes, gives it a shared
/// header of its own (32 bytes). Of the values a response adds, two are its own bytes (`Content-Length`,
/// `Via`). A representation's head is a copy of its variant's. An `edited` copy (the head as the deliver
/// rules that look at the response alone leave it, with at most that many fields more) has its own table,
/// exactly as long as its fields, and shares their values but for those it joined anew; it is kept in an
/// `Arc` with what the rules did.
fn prepared_head(meta: &ObjectMeta, edited: Option<usize>) -> usize {
    if meta.headers.is_empty() {
        return 0;
    }
    let boxed = heap(size_of::<http::HeaderMap>() + 40);
    let own = 2 * (heap(24) + 32);
    let wanted = meta.headers.len() + 7;
    let raw = (wanted + wanted / 3).next_power_of_two();
    let bucket = size_of::<HeaderName>() + size_of::<HeaderValue>() + 4 * size_of::<usize>();
    let copied: usize = meta
        .headers
        .iter()
        .map(|(n, v)| heap(n.len()) + heap(v.len()) + 2 * 32)
        .sum();
    let table = heap(raw * 4) + heap((raw - raw / 4) * bucket);
    // A field added to a copy grows its buckets as a `Vec` grows (twice as many), or to the capacity of
    // the larger positions it needs.
    let copy = edited.map_or(0, |added| {
        let fields = wanted + added;
        let positions = raw.max((fields + fields / 3).next_power_of_two());
        let buckets = match added {
            0 => wanted,
            _ => (positions - positions / 4).max(2 * wanted),
        };
        heap(2 * size_of::<usize>() + size_of::<http::HeaderMap>() + 32)
            + heap(positions * 4)
            + heap(buckets * bucket)
            + added * (heap(64) + 32)
    });
    boxed + table + copied + own + copy
}

#[cfg(test)]
mod tests {
    use std::{
        alloc::{GlobalAlloc, Layout, System},
        cell::Cell,
    };

    use super::*;
    use http::{header, HeaderMap};

    use crate::meta::{Prepared, Sibling};

    /// Counts the bytes the calling thread has allocated and not freed (by the size asked for, rounded as
    /// [`heap`] rounds), so a test measures what its own code allocates while other tests run.
    struct Counting;

    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
    }

    fn count(delta: isize) {
        // During thread teardown the counter may be gone: nothing measured runs then.
        let _ = LIVE.try_with(|live| live.set(live.get() + delta));
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(heap(layout.size()) as isize);
            System.alloc(layout)
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(heap(layout.size()) as isize));
            System.dealloc(ptr, layout)
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(heap(new_size) as isize - heap(layout.size()) as isize);
            System.realloc(ptr, layout, new_size)
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    fn live() -> isize {
        LIVE.with(Cell::get)
    }

    /// A set as a fill stores it and sled gives it back: decoded from its record, so its vectors have the
    /// capacities a real hot entry has.
    fn stored(i: usize, headers: usize, variants: usize, siblings: usize) -> ObjectSet {
        let meta = |v: usize| ObjectMeta {
            object: i as u64,
            generation: (i * 16 + v) as u64,
            variant: if variants > 1 {
                vec![("accept-encoding".into(), format!("gzip-{v}"))]
            } else {
                Vec::new()
            },
            status: 200,
            headers: (0..headers)
                .map(|h| match h {
                    0 => ("content-type".into(), b"application/octet-stream".to_vec()),
                    1 => ("cache-control".into(), b"max-age=3600".to_vec()),
                    2 => ("etag".into(), format!("\"{i}-{v}\"").into_bytes()),
                    3 => ("x-url".into(), format!("/small/rs/{i:07}").into_bytes()),
                    _ => (format!("x-extra-{h}"), vec![b'v'; 40]),
                })
                .collect(),
            length: 1024,
            chunk_size: 256 << 10,
            stored_at_ms: 1,
            ttl_ms: 3_600_000,
            tags: vec![format!("tag-{i}")],
            prepared: Prepared::default(),
            ..ObjectMeta::default()
        };
        let mut set = ObjectSet::of((0..variants).map(meta).collect());
        set.siblings = (0..siblings)
            .map(|_| Sibling::new((i * 16) as u64, None, (i as u64, 99), 2048, 256 << 10))
            .collect();
        ObjectSet::decode("k", &set.encode()).expect("decodes")
    }

    /// What the proxy prepares for a hit (`lacquer_proxy`'s `Prepared::of`): the stored fields with room
    /// for seven more, and the response's own, beside the facts it keeps of the body (as large).
    fn prepare(meta: &ObjectMeta) -> &HeaderMap {
        &meta
            .prepared(|m| {
                let mut head = m.header_map(7);
                head.insert(header::CONTENT_LENGTH, HeaderValue::from(m.length));
                head.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
                head.insert(header::AGE, HeaderValue::from_static("0"));
                head.insert("x-cache", HeaderValue::from_static("HIT"));
                head.insert("cache-status", HeaderValue::from_static("lacquer"));
                head.insert(header::VIA, HeaderValue::from_str("1.1 lacquer").unwrap());
                (head, [0u64; 5])
            })
            .unwrap()
            .0
    }

    /// The edited copy of a prepared head the proxy keeps while deliver rules edit heads ahead of their
    /// hits, with what they did (as large).
    type Edited = Arc<(HeaderMap, [u64; 4])>;

    /// The hot copy's weights account for what its entries take from the allocator, prepared heads and
    /// foyer's own records included: at most a quarter more (the safe side), never less. Before, the
    /// weight was about half of what an entry took.
    #[test]
    fn an_entry_weighs_what_it_takes_from_the_allocator() {
        for (headers, variants, siblings, edited) in [
            (4, 1, 0, None),
            (1, 1, 0, None),
            (12, 1, 0, None),
            (4, 3, 0, None),
            (4, 1, 1, None),
            (4, 1, 0, Some(0)),
            (12, 1, 0, Some(0)),
            (4, 3, 0, Some(0)),
            (4, 1, 1, Some(0)),
            (4, 1, 0, Some(3)),
            (1, 1, 0, Some(1)),
        ] {
            const N: usize = 2000;
            let flag = edited.map_or(0, |added: usize| added + 1);
            let hot = hot_copy(1 << 30, Arc::new(AtomicUsize::new(flag)));
            let mut copies: Vec<Edited> = Vec::with_capacity(N * (variants + siblings));
            // The copy as rules that add `added` fields leave it: names the rules hold, each value of the
            // larger kind, joined anew to what the head had.
            let names: Vec<HeaderName> = (0..edited.unwrap_or(0))
                .map(|f| HeaderName::from_bytes(format!("x-added-{f}").as_bytes()).unwrap())
                .collect();
            let before = live();
            let mut edit = |head: &HeaderMap| {
                if edited.is_some() {
                    let mut copy = head.clone();
                    for (f, name) in names.iter().enumerate() {
                        let joined = format!("{f}, max-age=31536000");
                        copy.insert(name.clone(), HeaderValue::from_str(&joined).unwrap());
                    }
                    copies.push(Arc::new((copy, [0; 4])));
                }
            };
            for i in 0..N {
                let key = format!("127.0.0.1:6081/small/rs/{i:07}");
                let set = stored(i, headers, variants, siblings);
                let entry = hot.insert(key, Arc::new(set));
                let set = entry.value();
                for meta in &set.variants {
                    drop(prepare(meta).clone());
                    edit(prepare(meta));
                }
                for sibling in &set.siblings {
                    let variant = set.variants.iter().find(|v| v.generation == sibling.of);
                    let head = variant.map(|v| prepare(v).clone()).unwrap_or_default();
                    let head = &sibling.body.prepared(|_| (head, [0u64; 5])).unwrap().0;
                    drop(head.clone());
                    edit(head);
                }
            }
            let taken = (live() - before) as f64;
            let weighed = hot.usage() as f64;
            let shape = format!(
                "{headers} headers, {variants} variants, {siblings} siblings, edited {edited:?}: per entry weighed {:.0}, took {:.0}",
                weighed / N as f64,
                taken / N as f64
            );
            assert!(weighed >= taken, "{shape}: weighed {weighed}, took {taken}");
            assert!(
                weighed <= 1.25 * taken,
                "{shape}: weighed {weighed}, took {taken}"
            );
        }
    }

    /// A hot copy keeps to its bound by that weight: past it, older entries are evicted.
    #[test]
    fn the_hot_copy_keeps_to_its_bound() {
        let hot = hot_copy(1 << 20, Arc::default());
        let set = stored(1, 4, 1, 0);
        let one = weight("127.0.0.1:6081/small/rs/0000001", &set, None);
        for i in 0..(4 << 20) / one {
            hot.insert(
                format!("127.0.0.1:6081/small/rs/{i:07}"),
                Arc::new(set.clone()),
            );
        }
        assert!(hot.usage() <= 1 << 20, "usage {}", hot.usage());
        assert!(hot.usage() >= 3 << 18, "usage {}", hot.usage());
    }

    #[test]
    fn heap_follows_the_allocators_classes() {
        let classes = [
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (100, 112),
            (129, 160),
            (256, 256),
            (257, 320),
            (1000, 1024),
        ];
        for (n, class) in classes {
            assert_eq!(heap(n), class, "{n}");
        }
    }
}
