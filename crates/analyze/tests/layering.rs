//! The analyzer's modules are layered: no module depends, directly or
//! through others, on one that depends on it (see pagefold-layering).

#[test]
fn the_module_graph_reader_finds_cycles() {
    pagefold_layering::self_test();
}

#[test]
fn no_module_depends_on_itself_through_others() {
    pagefold_layering::assert_layered(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    );
}
