//! The module graph reader is the crate pagefold-layering
//! (crates/layering); crates that take it as a dev-dependency use it from
//! there. This file lets a test that includes the reader by path
//! (`#[path = ".../module_graph/mod.rs"] mod module_graph;`, as
//! pagefold-bench's tests/layering.rs does) read the same source.

#[path = "../../../layering/src/lib.rs"]
mod reader;

pub use reader::*;
