//! The ring self-routing hashes keys onto: rendezvous (highest random weight) hashing over the live
//! members, so a member leaving moves only its own keys, each to the member that scores next for it, and
//! every node computes the same owner from the same member list with no shared state.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::Member;

/// The member that owns `key`; `None` with no member.
pub fn owner<'a>(members: &'a [Member], key: &str) -> Option<&'a Member> {
    members
        .iter()
        .max_by_key(|m| (score(&m.node, key), &m.node))
}

fn score(node: &str, key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), xxhash_rust::xxh3::xxh3_64(node.as_bytes()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn members(names: &[&str]) -> Vec<Member> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| Member {
                node: (*n).into(),
                advertise: format!("127.0.0.{}:80", i + 1).parse().unwrap(),
                advertise_admin: format!("127.0.0.{}:81", i + 1).parse().unwrap(),
            })
            .collect()
    }

    #[test]
    fn keys_spread_evenly_and_a_leaving_member_moves_only_its_own() {
        let three = members(&["n1", "n2", "n3"]);
        let two: Vec<Member> = three.iter().filter(|m| m.node != "n2").cloned().collect();
        let mut shares = HashMap::new();
        for i in 0..30_000 {
            let key = format!("shop.test/item/{i}");
            let before = owner(&three, &key).unwrap();
            *shares.entry(before.node.clone()).or_insert(0) += 1;
            let after = owner(&two, &key).unwrap();
            if before.node != "n2" {
                assert_eq!(after, before, "{key} moved though its owner stayed");
            }
        }
        for (node, n) in &shares {
            assert!((9_000..11_000).contains(n), "{node} owns {n} of 30 000");
        }
    }

    #[test]
    fn every_node_agrees_whatever_order_it_lists_the_members_in() {
        let a = members(&["n1", "n2", "n3"]);
        let mut b = a.clone();
        b.reverse();
        for i in 0..1000 {
            let key = format!("h/{i}");
            assert_eq!(owner(&a, &key), owner(&b, &key));
        }
        assert!(owner(&[], "h/x").is_none());
    }
}
