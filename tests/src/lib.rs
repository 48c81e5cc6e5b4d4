//! End-to-end test harness: a scripted origin that counts what it sees, the real `lacquerd` binary on
//! ephemeral ports with its own store directory, and a small HTTP client.

pub mod client;
pub mod daemon;
pub mod origin;

pub use client::{get, open, request, Reply as ClientReply};
pub use daemon::Daemon;
pub use origin::{Origin, Reply, Step};
