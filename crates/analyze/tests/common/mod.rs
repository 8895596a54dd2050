//! Test helpers: memory images of known composition, temporary files, and
//! running the `pagefold-analyze` binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use pagefold_analyze::{SimilarityConfig, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// What an image is made of.
#[derive(Debug, Clone, Default)]
pub struct Composition {
    pub zero: usize,
    /// Sizes of groups of identical non-zero pages (each >= 2).
    pub groups: Vec<usize>,
    /// Random pages, each different.
    pub unique: usize,
    /// Families of similar pages: for each, a reference page plus this many
    /// variants, each with `changed_bytes` bytes changed outside the
    /// similarity blocks.
    pub families: Vec<usize>,
    pub changed_bytes: usize,
}

impl Composition {
    pub fn pages(&self) -> usize {
        self.zero
            + self.groups.iter().sum::<usize>()
            + self.unique
            + self.families.iter().map(|v| v + 1).sum::<usize>()
    }
    pub fn variants(&self) -> usize {
        self.families.iter().sum()
    }
    /// Unique (content occurs once) pages: random + references + variants.
    pub fn unique_pages(&self) -> usize {
        self.unique + self.families.len() + self.variants()
    }
    pub fn after_sharing(&self) -> usize {
        self.unique_pages() + self.groups.len() + (self.zero > 0) as usize
    }
}

pub fn random_page(rng: &mut StdRng) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    rng.fill_bytes(&mut p);
    p
}

/// Byte offsets no variant may change: the default similarity blocks.
pub fn protected(offset: usize) -> bool {
    let c = SimilarityConfig::default();
    c.offsets()
        .iter()
        .any(|&o| offset >= o && offset < o + c.block)
}

/// A copy of `reference` with `n` bytes changed outside the similarity blocks.
pub fn variant(rng: &mut StdRng, reference: &[u8], n: usize) -> Vec<u8> {
    let mut v = reference.to_vec();
    let mut done = std::collections::HashSet::new();
    while done.len() < n {
        let i = rng.gen_range(0..PAGE);
        if protected(i) || !done.insert(i) {
            continue;
        }
        v[i] = v[i].wrapping_add(rng.gen_range(1..=255));
    }
    v
}

/// Pages of the composition, in a seeded shuffled order except that each
/// family's reference comes before its variants.
pub fn build(c: &Composition, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Items: (sort key, page).
    let mut items: Vec<(u64, Vec<u8>)> = Vec::new();
    for _ in 0..c.zero {
        items.push((rng.gen(), vec![0u8; PAGE]));
    }
    for &g in &c.groups {
        let p = random_page(&mut rng);
        for _ in 0..g {
            items.push((rng.gen(), p.clone()));
        }
    }
    for _ in 0..c.unique {
        items.push((rng.gen(), random_page(&mut rng)));
    }
    for &v in &c.families {
        let r = random_page(&mut rng);
        // The reference gets the smallest key of its family.
        let mut keys: Vec<u64> = (0..=v).map(|_| rng.gen()).collect();
        keys.sort_unstable();
        items.push((keys[0], r.clone()));
        for k in &keys[1..] {
            let var = variant(&mut rng, &r, c.changed_bytes);
            items.push((*k, var));
        }
    }
    items.sort_by_key(|x| x.0);
    let mut out = Vec::with_capacity(items.len() * PAGE);
    for (_, p) in items {
        out.extend_from_slice(&p);
    }
    out
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh path in the temp directory (removed on drop).
pub struct TempPath(pub PathBuf);

impl TempPath {
    pub fn new(name: &str) -> TempPath {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        TempPath(std::env::temp_dir().join(format!(
            "pagefold-analyze-test-{}-{n}-{name}",
            std::process::id()
        )))
    }
    pub fn write(name: &str, data: &[u8]) -> TempPath {
        let t = TempPath::new(name);
        std::fs::write(&t.0, data).expect("write temp file");
        t
    }
    pub fn s(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagefold-analyze"))
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run pagefold-analyze")
}

pub fn json(args: &[&str]) -> serde_json::Value {
    let mut a: Vec<&str> = args.to_vec();
    a.push("--json");
    a.push("-q");
    let out = run(&a);
    assert!(
        out.status.success(),
        "pagefold-analyze {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(
        v["schema"], "pagefold-analyze/1",
        "no schema in {args:?}'s report"
    );
    v
}

/// Asserts a one-line `pagefold analyze: ...` message and exit code 2.
pub fn assert_fails(out: &Output, contains: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {err}");
    assert!(lines[0].starts_with("pagefold analyze: "), "prefix: {err}");
    assert!(
        lines[0].contains(contains),
        "expected {contains:?} in: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(out.stdout.is_empty(), "no report on failure");
}

/// A forked child holding known memory: `data` at `addr` (plus `untouched`
/// mapped pages never written), optionally a read-only region, and
/// optionally rewriting a counter in its first `changing` pages every 2 ms.
/// Killed and reaped on drop.
pub struct Child {
    pub pid: i32,
    pub addr: u64,
    pub len: usize,
    pub ro_addr: u64,
    pub ro_len: usize,
}

static SLOT: AtomicUsize = AtomicUsize::new(0);

/// Maps a copy of `data` (plus `extra` untouched pages) at an address no
/// other test child uses (1 GiB slots far from the usual mmap area), so
/// address-range filters select exactly one child's region. The mapping,
/// `data.len() + extra * PAGE` bytes, belongs to the caller.
fn map_copy(data: &[u8], extra: usize) -> *mut u8 {
    let len = data.len() + extra * PAGE;
    let mut p = libc::MAP_FAILED;
    for _ in 0..64 {
        let slot = (SLOT.fetch_add(1, Ordering::Relaxed) % 64) as u64;
        let hint = (0x2000_0000_0000u64
            + (std::process::id() as u64 % 256) * (1 << 36)
            + slot * (1 << 30)) as *mut libc::c_void;
        // SAFETY: MAP_FIXED_NOREPLACE makes the call fail rather than
        // replace anything already mapped at `hint`, so no memory in use
        // is touched; the result is only compared until it succeeded.
        p = unsafe {
            libc::mmap(
                hint,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            break;
        }
    }
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: `p` is the start of the `len`-byte anonymous mapping made
    // above, readable and writable, which nothing else refers to yet and
    // which cannot overlap `data` (a live borrow of other memory); madvise
    // only changes its huge-page policy (no transparent huge page: untouched
    // pages must stay unpopulated), and `data.len() <= len` bytes are copied.
    unsafe {
        libc::madvise(p, len, libc::MADV_NOHUGEPAGE);
        std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len());
    }
    p as *mut u8
}

impl Child {
    pub fn spawn(data: &[u8], untouched: usize) -> Child {
        Child::spawn_full(data, untouched, 0, &[])
    }

    pub fn spawn_full(data: &[u8], untouched: usize, changing: usize, ro: &[u8]) -> Child {
        assert!(
            data.len().is_multiple_of(PAGE)
                && ro.len().is_multiple_of(PAGE)
                && changing * PAGE <= data.len()
        );
        let p = map_copy(data, untouched);
        let len = data.len() + untouched * PAGE;
        let (rp, rlen) = if ro.is_empty() {
            (std::ptr::null_mut(), 0)
        } else {
            let rp = map_copy(ro, 0);
            // SAFETY: `rp` is the `ro.len()`-byte mapping map_copy just made
            // for this call; making it read-only affects nothing else.
            unsafe { libc::mprotect(rp as *mut libc::c_void, ro.len(), libc::PROT_READ) };
            (rp, ro.len())
        };
        // SAFETY: the test process has other threads, so after fork the child
        // makes only async-signal-safe calls (pause, usleep) and volatile
        // stores at offset 100 of its first `changing` pages, which lie inside
        // its copy of the `len`-byte mapping at `p` (`changing * PAGE <=
        // data.len()`, asserted above). The parent then unmaps its own copies
        // of the two mappings, which it made above and keeps only as
        // addresses (integers) from here on.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork");
            if pid == 0 {
                if changing == 0 {
                    loop {
                        libc::pause();
                    }
                }
                let mut n: u32 = 1;
                loop {
                    for i in 0..changing {
                        std::ptr::write_volatile(p.add(i * PAGE + 100) as *mut u32, n);
                    }
                    n = n.wrapping_add(1).max(1);
                    libc::usleep(2000);
                }
            }
            libc::munmap(p as *mut libc::c_void, len);
            if rlen > 0 {
                libc::munmap(rp as *mut libc::c_void, rlen);
            }
            Child {
                pid,
                addr: p as u64,
                len,
                ro_addr: rp as u64,
                ro_len: rlen,
            }
        }
    }

    pub fn range(&self) -> String {
        format!("{:#x}-{:#x}", self.addr, self.addr + self.len as u64)
    }

    pub fn ro_range(&self) -> String {
        format!(
            "{:#x}-{:#x}",
            self.ro_addr,
            self.ro_addr + self.ro_len as u64
        )
    }

    /// Kills and reaps the child now.
    pub fn kill(&self) {
        // SAFETY: kill and waitpid take no pointers (waitpid's status
        // pointer is null); `self.pid` is the child spawn_full forked.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}
