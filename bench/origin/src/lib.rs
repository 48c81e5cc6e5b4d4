//! What `bench-origin`'s live LL-HLS route and `bench-live-players` share: the names of parts and playlist
//! versions, the bytes every part must have, and the scripted live origin itself.

pub mod live;
