//! Lacquer's object store.
//!
//! Bodies are split into fixed-size chunks and kept in a foyer hybrid cache (memory tier in front of a disk
//! tier). Chunk keys carry the object's generation, which is never reused, so a replaced or removed object can
//! never lend a stale chunk to its successor, even if foyer resurrects a removed entry after a restart.
//! Object metadata lives in sled, which is the authority on what exists; a bounded in-memory copy of hot
//! metadata keeps memory hits away from sled and the disk. Purges and bans are also appended to an
//! invalidation journal of their own (see `journal`), replayed at every start, so that a crash or damage
//! that rolls sled back cannot bring an invalidated body back.
#![warn(missing_docs)]

mod background;
mod ban;
mod builder;
mod chunk;
mod error;
mod health;
mod journal;
mod meta;
mod purge;
mod space;
mod store;
mod sweep;
mod writer;

pub use ban::{BanExpr, BanInfo, BanSyntaxError};
pub use builder::StoreBuilder;
pub use chunk::ChunkKey;
pub use error::StoreError;
pub use meta::{
    same_representation, ObjectMeta, ObjectSet, Part, PartFate, Partial, Prepared, Sibling,
};
pub use purge::{Invalidated, Invalidation, InvalidationMark, PurgeMode};
pub use store::{
    ChunkRead, ChunkTiers, Inspected, PartKept, Store, StoreStatsSnapshot, Tier, VERIFY_AHEAD,
};
pub use writer::{ObjectWriter, PartialBody};
