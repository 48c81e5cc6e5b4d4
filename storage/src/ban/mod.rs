//! Bans: invalidation by pattern, applied at lookup and by a background lurker, persisted in sled.

mod expr;
mod list;
pub(crate) mod lurker;

pub(crate) use expr::Subject;
pub use expr::{BanExpr, BanSyntaxError};
pub use list::BanInfo;
pub(crate) use list::{Ban, Bans, Verdict};
