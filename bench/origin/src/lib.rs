//! What `bench-origin`'s live LL-HLS route and `bench-live-players` share: the names of parts and playlist
//! versions, the bytes every part must have, and the scripted live origin itself; and what the origin's
//! routes share: their settings from the environment, the hash that places a path's body in the pattern.

pub mod live;

/// The environment variable `name` as a number, or `default` when it is not set.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

/// FNV-1a: the same across runs and builds, unlike std's hasher, so that a client can compute it too.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
