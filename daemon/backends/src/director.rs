//! Directors: which of several backends a request goes to, skipping sick ones.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use xxhash_rust::xxh3::xxh3_64;

use lacquer_config::DirectorPolicy;

/// Points per backend on the hash ring: enough that 2 to 10 backends get shares within a few percent.
const POINTS_PER_BACKEND: usize = 160;

/// One `[[director]]`, compiled: its members and, for `hash`, the ring. A reload builds new ones; a route
/// holds its own, so requests already routed finish with the director they started with.
#[derive(Debug)]
pub struct Director {
    /// What routes target and `unavailable` errors name.
    pub name: String,
    /// How a healthy member is picked.
    pub policy: DirectorPolicy,
    /// Indexes into the daemon's backends.
    pub members: Vec<usize>,
    next: AtomicUsize,
    /// `(point, member position)`, sorted by point.
    ring: Vec<(u64, usize)>,
}

impl Director {
    /// `names` are the members' backend names: ring points are placed by name, so every node of a cache
    /// cluster with the same backends sends a URL to the same one.
    pub fn new(name: &str, policy: DirectorPolicy, members: Vec<usize>, names: &[&str]) -> Self {
        let mut ring: Vec<(u64, usize)> = names
            .iter()
            .enumerate()
            .flat_map(|(pos, name)| {
                (0..POINTS_PER_BACKEND)
                    .map(move |i| (xxh3_64(format!("{name}#{i}").as_bytes()), pos))
            })
            .collect();
        ring.sort_unstable();
        Self {
            name: name.to_owned(),
            policy,
            members,
            next: AtomicUsize::new(0),
            ring,
        }
    }

    /// Whether any member is healthy (asking moves no round-robin turn).
    pub fn any_healthy(&self, healthy: impl Fn(usize) -> bool) -> bool {
        self.members.iter().any(|&b| healthy(b))
    }

    /// A healthy member for a request with cache key `key`; `None` when every member is sick. Round robin
    /// and random choose among the healthy members only, so a sick member's share is spread evenly rather
    /// than handed to its neighbour.
    pub fn pick(&self, key: &str, healthy: impl Fn(usize) -> bool) -> Option<usize> {
        if self.policy == DirectorPolicy::Hash {
            return self.on_ring(key, healthy);
        }
        let up = self.members.iter().filter(|&&b| healthy(b)).count();
        if up == 0 {
            return None;
        }
        let nth = match self.policy {
            DirectorPolicy::RoundRobin => self.next.fetch_add(1, Relaxed) % up,
            _ => fastrand::usize(..up),
        };
        self.members
            .iter()
            .copied()
            .filter(|&b| healthy(b))
            .nth(nth)
    }

    /// The first healthy member clockwise from the key's point: a sick member's keys go to the next
    /// members on the ring, everyone else's stay where they were.
    fn on_ring(&self, key: &str, healthy: impl Fn(usize) -> bool) -> Option<usize> {
        let point = xxh3_64(key.as_bytes());
        let start = self.ring.partition_point(|&(p, _)| p < point);
        let len = self.ring.len();
        (0..len)
            .map(|i| self.members[self.ring[(start + i) % len].1])
            .find(|&b| healthy(b))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn director(policy: DirectorPolicy) -> Director {
        Director::new("d", policy, vec![10, 11, 12], &["a", "b", "c"])
    }

    fn shares(d: &Director, sick: Option<usize>) -> HashMap<usize, usize> {
        let mut m = HashMap::new();
        for i in 0..3000 {
            let b = d
                .pick(&format!("example.com/{i}"), |b| Some(b) != sick)
                .unwrap();
            *m.entry(b).or_default() += 1;
        }
        m
    }

    #[test]
    fn round_robin_takes_turns_and_skips_the_sick() {
        let d = director(DirectorPolicy::RoundRobin);
        let picks: Vec<usize> = (0..6).map(|_| d.pick("k", |_| true).unwrap()).collect();
        assert_eq!(picks, [10, 11, 12, 10, 11, 12]);
        let picks: Vec<usize> = (0..4).map(|_| d.pick("k", |b| b != 11).unwrap()).collect();
        assert_eq!(picks.iter().filter(|&&b| b == 10).count(), 2, "{picks:?}");
        assert_eq!(picks.iter().filter(|&&b| b == 12).count(), 2, "{picks:?}");
        assert_eq!(d.pick("k", |_| false), None);
    }

    #[test]
    fn random_spreads_over_the_healthy() {
        let s = shares(&director(DirectorPolicy::Random), Some(12));
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s.values().all(|&n| n > 1200), "{s:?}");
    }

    #[test]
    fn hash_is_stable_balanced_and_moves_only_the_sick_backends_keys() {
        let d = director(DirectorPolicy::Hash);
        let all = shares(&d, None);
        assert!(all.values().all(|&n| (800..1200).contains(&n)), "{all:?}");
        let key = |i: usize| format!("example.com/{i}");
        let before: Vec<usize> = (0..3000)
            .map(|i| d.pick(&key(i), |_| true).unwrap())
            .collect();
        let again = director(DirectorPolicy::Hash);
        let same: Vec<usize> = (0..3000)
            .map(|i| again.pick(&key(i), |_| true).unwrap())
            .collect();
        assert_eq!(before, same, "placement depends on names and keys only");
        for (i, &was) in before.iter().enumerate() {
            let now = d.pick(&key(i), |b| b != 11).unwrap();
            if was == 11 {
                assert_ne!(now, 11);
            } else {
                assert_eq!(now, was, "key {i} moved although its backend is healthy");
            }
        }
    }
}
