//! With the `embed-preload` feature (the Python wheel's build), builds the
//! preload library and embeds it in the `pagefold` binary, so one file is the
//! whole install: `pagefold run` writes the library out on first use (see
//! src/preload.rs). Without the feature nothing happens: `pagefold run` finds
//! the library beside the binary, as a cargo build leaves it.
//!
//! The library is built by a second cargo, in a target directory of its own
//! (the outer cargo holds the lock on the workspace's), without debug info.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_EMBED_PRELOAD").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest.join("../..");
    for dir in ["preload", "engine", "tier", "codecs"] {
        println!(
            "cargo:rerun-if-changed={}",
            root.join("crates").join(dir).display()
        );
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let target = out.join("preload-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "pagefold-preload",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .status()
        .expect("running cargo to build the preload library");
    assert!(status.success(), "building the preload library failed");
    std::fs::copy(
        target.join("release/libpagefold_preload.so"),
        out.join("libpagefold_preload.so"),
    )
    .expect("copying the preload library");
}
