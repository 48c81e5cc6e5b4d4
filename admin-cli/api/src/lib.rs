//! Lacquer's admin API: the wire types every route takes and returns ([`wire`]), and the typed client
//! `cachectl` and `cachetop` use to call it. `lacquerd`'s handlers serve the same types, so the daemon and
//! its tools cannot drift apart.

mod client;
pub mod cluster;
pub mod format;
mod target;
pub mod top;
pub mod wire;

pub use client::{AdminClient, AdminError, LogEvent, LogStream, StatsStream};
pub use target::{ConnectArgs, Target, TargetError, DEFAULT_ADMIN, DEFAULT_CONFIG, DEFAULT_SECRET};
