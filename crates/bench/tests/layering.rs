//! The harness's modules are layered: no module depends, directly or
//! through others, on one that depends on it, and none on lib.rs, which
//! ties them together (see pagefold-layering).

use pagefold_layering as module_graph;

#[test]
fn the_module_graph_reader_finds_cycles() {
    module_graph::self_test();
}

#[test]
fn no_module_depends_on_itself_through_others() {
    module_graph::assert_layered(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}
