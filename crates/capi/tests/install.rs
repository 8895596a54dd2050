//! `make install` lays out bin/, lib/, include/ and lib/pkgconfig/ under a
//! prefix (with DESTDIR staging), and a C program builds against it with
//! nothing but `pkg-config --cflags --libs pagefold`, then runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ok(what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn make_install_then_a_c_program_links_with_pkg_config() {
    let profile = pagefold_testkit::profile_dir();
    let stage = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-stage");
    let _ = std::fs::remove_dir_all(&stage);
    let prefix = "/opt/pagefold-test";
    ok(
        "make install",
        Command::new("make")
            .current_dir(repo())
            .arg("install")
            .arg(format!("PREFIX={prefix}"))
            .arg(format!("DESTDIR={}", stage.display()))
            .arg(format!("TARGET={}", profile.display()))
            .arg(format!("CARGO={}", env!("CARGO")))
            .env("CARGO_TARGET_DIR", profile.parent().unwrap()),
    );
    let root = stage.join(prefix.trim_start_matches('/'));
    for f in [
        "bin/pagefold",
        "lib/libpagefold.so",
        "lib/libpagefold_preload.so",
        "include/pagefold.h",
        "lib/pkgconfig/pagefold.pc",
    ] {
        assert!(
            root.join(f).is_file(),
            "{f} not installed under {}",
            root.display()
        );
    }
    // The staged tree stands in for the prefix: pkg-config's sysroot maps it.
    let pc = |arg: &str| {
        ok(
            "pkg-config",
            Command::new("pkg-config")
                .args([arg, "pagefold"])
                .env("PKG_CONFIG_PATH", root.join("lib/pkgconfig"))
                .env("PKG_CONFIG_SYSROOT_DIR", &stage),
        )
    };
    let flags: Vec<String> = format!("{} {}", pc("--cflags"), pc("--libs"))
        .split_whitespace()
        .map(|s| {
            // -Wl,-rpath,<libdir> is not rewritten by the sysroot: point it at the stage.
            s.replace(
                &format!("-Wl,-rpath,{prefix}"),
                &format!("-Wl,-rpath,{}", root.display()),
            )
        })
        .collect();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pkgconfig-demo");
    ok(
        "cc with pkg-config flags",
        Command::new("cc")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/install_demo.c"))
            .arg("-o")
            .arg(&exe)
            .args(&flags),
    );
    let out = ok("the C program", &mut Command::new(&exe));
    assert_eq!(out.trim(), "copy shared: yes, bytes equal: yes");
    let version = ok(
        "installed pagefold --version",
        Command::new(root.join("bin/pagefold")).arg("--version"),
    );
    assert!(version.starts_with("pagefold "));
}
