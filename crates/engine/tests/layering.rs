//! The engine's modules are layered: no module depends, directly or through
//! others, on one that depends on it (see pagefold-layering). Frames and the
//! page table at the bottom, then the mechanisms (copy, fold, merge, the pin
//! guard, holds), the scan's policy and the clock, tiering (eviction, the
//! page stores, patching) as their client, and the public `Engine` on top.

use std::path::Path;

#[test]
fn the_module_graph_reader_finds_cycles() {
    pagefold_layering::self_test();
}

#[test]
fn no_module_depends_on_itself_through_others() {
    pagefold_layering::assert_layered(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
