//! pagefold-measure: the true physical footprint of a process, or of a
//! process tree, read from outside through /proc.
//!
//! RSS counts a shared page once per process and PSS splits it; neither sees
//! the page cache of a memfd that is not mapped at the moment, which is where
//! pagefold's engine keeps its frames. Savings claimed by pagefold (and by the
//! kernel's KSM, which it is compared with) must be measured in physical
//! pages, so this crate counts distinct physical frames from pagemap and adds
//! memfd files by their allocated blocks (`footprint` documents the formula).
//! Without root the PFNs are hidden and the result is PSS, labelled a proxy.
//!
//! - [`measure_pid`], [`measure_pids`], [`measure_tree`], [`measure_self`]:
//!   one measurement, a [`Footprint`].
//! - [`measure`]: either, with the sharing limit if asked, the footprint if
//!   every zero page and every repeated anonymous content were folded
//!   ([`SharingLimit`]).
//! - [`Sampler`]: a time series with peak and average, on the calling thread
//!   or on its own ([`Sampler::spawn`]).
//! - [`cli`]: argument checks, messages, text and JSON reports for `pagefold measure`.
//! - [`schema`]: the `"schema"` field every JSON document pagefold writes
//!   carries (here because every crate that writes JSON can depend on this one).

pub mod cli;
mod error;
mod footprint;
mod limit;
mod memfd;
mod pagemap;
mod procfs;
mod sampler;
pub mod schema;
mod tree;

pub use error::Error;
pub use footprint::{
    measure, measure_pid, measure_pids, measure_self, measure_tree, Footprint, Method,
};
pub use limit::SharingLimit;
pub use pagemap::page_size;
pub use procfs::KsmStat;
pub use sampler::{Sampler, SamplerHandle, Series, SeriesEnd, Summary};
pub use tree::process_tree;
