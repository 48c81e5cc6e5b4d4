//! The client-facing request flow: classify, look up, coalesce misses, pass the rest.

#![warn(missing_docs)]

pub mod access_log;
pub mod cluster;
pub mod coalesce;
mod coding;
mod dictionary;
pub mod error_page;
mod esi;
pub mod explain;
mod fetch;
mod fields;
mod flow;
mod forward;
mod hls;
pub mod invalidation;
mod live;
pub mod log_format;
#[cfg(test)]
mod memory;
mod peer;
mod phase;
mod pipe;
mod prefetch;
mod prepared;
mod purge_method;
mod repeats;
mod respond;
mod siblings;
mod slice;
pub mod stats;
pub mod store;
#[cfg(test)]
mod tests;
mod timing;
pub mod worker;

pub use esi::fill::TEMPLATE as ESI_TEMPLATE;
pub use flow::Observed;
