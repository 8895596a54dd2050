//! `make install` lays out bin/, lib/, include/ and lib/pkgconfig/ under a
//! prefix (with DESTDIR staging), and a C program builds against it with
//! nothing but `pkg-config --cflags --libs pagefold`, then runs; the
//! installed `pagefold run` finds the installed preload library. `make deb`
//! packs the same files under /usr into a Debian package that dpkg reads and
//! whose unpacked tree works the same way.

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

/// The files `make install` puts under its prefix (and `make deb` under /usr).
const INSTALLED: [&str; 5] = [
    "bin/pagefold",
    "lib/libpagefold.so",
    "lib/libpagefold_preload.so",
    "include/pagefold.h",
    "lib/pkgconfig/pagefold.pc",
];

/// `make TARGET_NAME VARS...` in the repository, building into this test
/// run's cargo target directory.
fn make(target: &str, vars: &[String]) -> String {
    let profile = pagefold_testkit::profile_dir();
    ok(
        &format!("make {target}"),
        Command::new("make")
            .current_dir(repo())
            .arg(target)
            .args(vars)
            .arg(format!("TARGET={}", profile.display()))
            .arg(format!("CARGO={}", env!("CARGO")))
            .env("CARGO_TARGET_DIR", profile.parent().unwrap()),
    )
}

#[test]
fn make_install_then_a_c_program_links_with_pkg_config() {
    let stage = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-stage");
    let _ = std::fs::remove_dir_all(&stage);
    let prefix = "/opt/pagefold-test";
    make(
        "install",
        &[
            format!("PREFIX={prefix}"),
            format!("DESTDIR={}", stage.display()),
        ],
    );
    let root = stage.join(prefix.trim_start_matches('/'));
    for f in INSTALLED {
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
    runs_with_its_own_preload(&root);
}

/// The installed `pagefold` under `root` (bin/, lib/) uses the preload
/// library installed beside it, with no variable to point at it.
fn runs_with_its_own_preload(root: &Path) {
    let lib = root
        .join("lib/libpagefold_preload.so")
        .canonicalize()
        .unwrap();
    let pagefold = || {
        let mut c = Command::new(root.join("bin/pagefold"));
        c.env_remove("PAGEFOLD_PRELOAD");
        c
    };
    let found = ok("installed pagefold preload", pagefold().arg("preload"));
    assert_eq!(Path::new(found.trim()), lib);
    let out = ok(
        "installed pagefold run",
        pagefold().args(["run", "--", "sh", "-c", "echo \"preload=$LD_PRELOAD\""]),
    );
    assert!(
        out.contains(&format!("preload={}", lib.display())),
        "the program ran without the installed preload:\n{out}"
    );
}

#[test]
fn make_deb_builds_a_package_dpkg_reads_and_its_tree_runs() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        panic!("dpkg-deb not found: `make deb` needs Debian's dpkg (apt-get install dpkg)");
    }
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deb");
    let _ = std::fs::remove_dir_all(&out_dir);
    make("deb", &[format!("DEB_DIR={}", out_dir.display())]);
    let debs: Vec<PathBuf> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    assert_eq!(
        debs.len(),
        1,
        "one package expected in {}",
        out_dir.display()
    );
    let deb = &debs[0];
    let field = |name: &str| {
        ok(
            "dpkg-deb --field",
            Command::new("dpkg-deb").arg("--field").arg(deb).arg(name),
        )
        .trim()
        .to_string()
    };
    assert_eq!(field("Package"), "pagefold");
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    let arch = ok(
        "dpkg --print-architecture",
        Command::new("dpkg").arg("--print-architecture"),
    );
    assert_eq!(field("Architecture"), arch.trim());
    let listing = ok(
        "dpkg-deb --contents",
        Command::new("dpkg-deb").arg("--contents").arg(deb),
    );
    for f in INSTALLED {
        let f = format!("./usr/{f}");
        assert!(
            listing.lines().any(|l| l.ends_with(&f)),
            "{f} not in the package:\n{listing}"
        );
    }
    assert!(
        listing.lines().all(|l| l.contains(" root/root ")),
        "files not owned by root:\n{listing}"
    );
    let tree = out_dir.join("unpacked");
    ok(
        "dpkg-deb --extract",
        Command::new("dpkg-deb")
            .arg("--extract")
            .arg(deb)
            .arg(&tree),
    );
    let pc = std::fs::read_to_string(tree.join("usr/lib/pkgconfig/pagefold.pc")).unwrap();
    assert!(pc.contains("prefix=/usr\n"), "{pc}");
    runs_with_its_own_preload(&tree.join("usr"));
}
