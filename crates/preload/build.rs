//! Links the unwinder statically, so loading the preload does not also load
//! libgcc_s into every process (each short-lived process of a shell script
//! would pay for opening and relocating it: measured, about 0.17 ms each).
//!
//! Rust's standard library asks the linker for `-lgcc_s`. A `libgcc_s.a`
//! found first on the search path answers that request with gcc's static
//! unwinder (`libgcc_eh.a`). The library builds with panic=abort, so the
//! unwinder only walks stacks for a backtrace and never meets the program's
//! own exceptions. Without a static unwinder nothing changes.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let eh = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !eh.is_absolute() || !eh.is_file() {
        return;
    }
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if std::fs::copy(&eh, dir.join("libgcc_s.a")).is_ok() {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
}
