//! Edge Side Includes, the subset Varnish implements: `<esi:include src>` (with `onerror="continue"`),
//! `<esi:remove>`, `<!--esi … -->` and `<esi:comment>`.
//!
//! A page is parsed once, as it is fetched ([`Parser`]), into a template: its text with the removals
//! made, and its includes, in the order they come. The template is what the store keeps, so a hit reads
//! it back ([`Reader`]) as literal text and includes without scanning the page again. [`resolve`] turns
//! an include's `src` into the request target fetched for it, refusing what would leave the page's host.
//!
//! The template's form is this crate's: a sequence of records, each a tag byte and a length, that only
//! [`Reader`] reads. [`TEMPLATE_VERSION`] names it, kept beside the stored page.

#![warn(missing_docs)]

mod parse;
mod resolve;
mod template;

pub use parse::{Parser, MAX_TAG};
pub use resolve::{resolve, Refused};
pub use template::{Include, Reader, Segment, TemplateError, TEMPLATE_VERSION};
