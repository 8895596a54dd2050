//! Where `pagefold run` finds the preload library. A cargo build leaves it
//! beside the binary and `make install` in `lib/` beside the binary's `bin/`,
//! where pagefold-bench's `find_preload` looks. A binary
//! built with the `embed-preload` feature (the Python wheel's) carries the
//! library inside: on first use it is written to a cache directory, under a
//! name that changes with its content, and `PAGEFOLD_PRELOAD` points there.
//! `PAGEFOLD_PRELOAD` set by the user always wins.

use std::path::PathBuf;

#[cfg(feature = "embed-preload")]
const EMBEDDED: Option<&[u8]> = Some(include_bytes!(concat!(
    env!("OUT_DIR"),
    "/libpagefold_preload.so"
)));
#[cfg(not(feature = "embed-preload"))]
const EMBEDDED: Option<&[u8]> = None;

/// Makes the embedded library available through `PAGEFOLD_PRELOAD`, unless
/// the variable is set or the library sits beside the binary. Call before
/// any thread starts (it sets an environment variable).
pub fn provide() -> Result<(), String> {
    let Some(bytes) = EMBEDDED else {
        return Ok(());
    };
    if std::env::var_os("PAGEFOLD_PRELOAD").is_some() || beside_binary().is_some() {
        return Ok(());
    }
    let path = write_out(bytes)?;
    std::env::set_var("PAGEFOLD_PRELOAD", path);
    Ok(())
}

/// The library `pagefold run` would use, for `pagefold preload`.
pub fn path() -> Result<PathBuf, String> {
    provide()?;
    pagefold_bench::program::find_preload(None)
}

fn beside_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    pagefold_bench::program::preload_places(&exe)
        .into_iter()
        .find(|p| p.is_file())
}

/// The cache directories to try, in order.
fn cache_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        dirs.push(PathBuf::from(x).join("pagefold"));
    } else if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        dirs.push(PathBuf::from(h).join(".cache/pagefold"));
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    dirs.push(std::env::temp_dir().join(format!("pagefold-{uid}")));
    dirs
}

/// Writes `bytes` once per content (write to a temporary name, then rename:
/// concurrent first runs never see half a file) and returns the path.
fn write_out(bytes: &[u8]) -> Result<PathBuf, String> {
    let name = format!(
        "libpagefold_preload-{}-{:016x}.so",
        env!("CARGO_PKG_VERSION"),
        xxhash_rust::xxh3::xxh3_64(bytes)
    );
    let mut last = String::from("no cache directory");
    for dir in cache_dirs() {
        let path = dir.join(&name);
        // Reused only if it is exactly our library (a file someone else put
        // there would be loaded into every program pagefold runs).
        if std::fs::read(&path).is_ok_and(|have| have == bytes) {
            return Ok(path);
        }
        let tmp = dir.join(format!("{name}.{}", std::process::id()));
        let written = create_private_dir(&dir)
            .and_then(|()| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => return Ok(path),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                last = format!("{}: {e}", dir.display());
            }
        }
    }
    Err(format!("cannot write the preload library out ({last})"))
}

/// `dir`, created readable by its owner only if it does not exist.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
