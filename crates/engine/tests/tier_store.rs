//! The default page store (TierStore: the tier crate's compressor and slab
//! store, a swap file below) behind the engine: pages compressed with LZ4,
//! with zstd and as one repeated word, and pages moved on to the swap file,
//! must come back exactly on every kind of touch — by the program, by
//! another thread, by the kernel inside read(2) and write(2) — and through
//! fork; the fault thread's path must allocate nothing; a full disk keeps
//! pages in memory; a corrupted or truncated swap slot poisons the page
//! (SIGBUS), never yields wrong bytes; the store's accounting must equal
//! its tables after churn.
//!
//! The tests in one process run one at a time (a fork restores every
//! evicted page of every engine in the process, and the allocation count is
//! process-wide). The tests that fork run in a process of their own
//! (`common::in_own_process`), so their children find no lock held by
//! another test's thread.

mod common;
use common::{bytes, pipe, serial, with_deadline};

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pagefold_engine::{
    Allow, Config, Engine, Handle, Hint, PageStore, TierConfig, TierStore, PAGE,
};
use pagefold_testkit::TmpMount;
use pagefold_tier::kinds::{page as kind_page, Kind};

/// These tests are about the page store: patching (which would take similar pages) is not offered.
const STORE_ONLY: Allow = Allow {
    patch: false,
    compress: true,
};

/// Counts allocations made while armed, on engine threads (the fault
/// thread) or on a thread that asked to be counted.
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static COUNTED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if ARMED.load(Ordering::Relaxed)
        && (pagefold_engine::on_engine_thread()
            || COUNT_HERE.try_with(|c| c.get()).unwrap_or(false))
    {
        COUNTED.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method passes its layout and pointer to System unchanged, which upholds the
// GlobalAlloc contract; counting touches only an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        System.realloc(p, l, n)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Page `k` of the test content: text (LZ4), integer doubles, heap records
/// and sparse pages (zstd), one repeated word (same-filled), in turn.
fn content_page(k: usize) -> Vec<u8> {
    match k % 5 {
        0 => kind_page(Kind::Text, k as u64),
        1 => kind_page(Kind::IntDoubles, k as u64),
        2 => kind_page(Kind::Heap, k as u64),
        3 => kind_page(Kind::Sparse, k as u64),
        _ => (0..PAGE)
            .map(|i| [0xa5, k as u8 | 1, 3, 4, 5, 6, 7, 8][i % 8])
            .collect(),
    }
}

fn swap_prefix(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pagefold-tier-store-{tag}-{}", std::process::id()))
}

fn store(capacity: u64, swap: Option<PathBuf>) -> Arc<TierStore> {
    let swap = swap.map(|path| pagefold_engine::SwapSettings {
        path,
        max_bytes: 1 << 30,
    });
    Arc::new(TierStore::new(TierConfig { capacity, swap }).unwrap())
}

/// An engine whose page store is `store`, and a block of `n` pages of content.
struct Fixture {
    e: Engine,
    store: Arc<TierStore>,
    ptr: *mut u8,
    want: Vec<u8>,
}

// SAFETY: Fixture holds raw pointers into blocks the test owns; every thread that gets it only
// touches those blocks while the test keeps them alive.
unsafe impl Send for Fixture {}
// SAFETY: Fixture holds raw pointers into blocks the test owns; every thread that gets it only
// touches those blocks while the test keeps them alive.
unsafe impl Sync for Fixture {}

impl Fixture {
    fn new(store: Arc<TierStore>, n: usize) -> Fixture {
        let e = Engine::new(Config {
            pin_grace: Duration::from_micros(100),
            ..Config::default()
        });
        assert!(e.set_store(store.clone()));
        let want: Vec<u8> = (0..n).flat_map(content_page).collect();
        let ptr = e.alloc(n * PAGE, Hint::None);
        assert!(!ptr.is_null());
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), ptr, want.len()) };
        Fixture {
            e,
            store,
            ptr,
            want,
        }
    }

    fn pages(&self) -> usize {
        self.want.len() / PAGE
    }

    /// Evicts the block; with `swap`, moves all of it on to the swap file.
    fn evicted(store: Arc<TierStore>, n: usize, swap: bool) -> Fixture {
        let f = Fixture::new(store, n);
        f.evict_all(swap);
        f
    }

    fn evict_all(&self, swap: bool) {
        let n = self.pages() as u64;
        let r = self.e.evict_with(self.ptr, self.want.len(), STORE_ONLY);
        assert_eq!(r.evicted, n, "{r:?}");
        let c = self.store.counts();
        assert!(
            c.lz4 > 0 && c.zstd > 0 && c.same > 0,
            "every method used: {c:?}"
        );
        if swap {
            let before = self.store.bytes();
            let released = self.store.spill(u64::MAX);
            let after = self.store.bytes();
            assert_eq!(
                (after.swapped, after.pages, after.payload),
                (n, n, 0),
                "{after:?}"
            );
            assert!(
                released >= before.payload,
                "spill released {released} of {before:?}"
            );
            assert_eq!(before.memory() - after.memory(), released);
        }
        assert_eq!(self.store.audit().unwrap(), self.store.bytes());
    }

    fn page(&self, k: usize) -> *mut u8 {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { self.ptr.add(k * PAGE) }
    }

    fn check(&self, ctx: &str) {
        let got = bytes(self.ptr, self.want.len());
        if let Some(first) = (0..got.len()).find(|&i| got[i] != self.want[i]) {
            panic!(
                "{ctx}: wrong byte at {first} (page {} + {})",
                first / PAGE,
                first % PAGE
            );
        }
    }

    fn finish(self, ctx: &str) {
        self.check(ctx);
        let s = self.e.stats();
        assert_eq!(s.restore_errors, 0, "{ctx}: {s:?}");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { self.e.free(self.ptr) });
        let b = self.store.bytes();
        assert_eq!((b.pages, b.payload, b.swapped), (0, 0, 0), "{ctx}: {b:?}");
        assert_eq!(self.store.audit().unwrap(), b, "{ctx}");
    }
}

#[derive(Clone, Copy, Debug)]
enum Toucher {
    Program,
    OtherThread,
    KernelRead,
    KernelWrite,
}

fn must(what: &str, r: isize, len: usize) {
    let e = std::io::Error::last_os_error();
    assert_eq!(r, len as isize, "{what}: {r} ({e})");
}

fn touch(f: Fixture, how: Toucher, ctx: &str) -> Fixture {
    let mut f = f;
    let n = f.pages();
    match how {
        Toucher::Program => {
            for k in (0..n).step_by(2) {
                assert_eq!(
                    bytes(f.page(k), PAGE),
                    &content_page(k)[..],
                    "{ctx}: read of page {k}"
                );
            }
            for k in (1..n).step_by(2) {
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                unsafe { f.page(k).add(11).write_volatile(0xEE) };
                f.want[k * PAGE + 11] = 0xEE;
            }
        }
        Toucher::OtherThread => {
            f = std::thread::spawn(move || {
                f.check("read by another thread");
                f
            })
            .join()
            .unwrap();
        }
        Toucher::KernelRead => {
            // write(2) from evicted pages: the kernel reads them.
            let (r, w) = pipe();
            let mut out = vec![0u8; n * PAGE];
            must(
                "write(2) from evicted pages",
                // SAFETY: the buffer is live and at least the length passed; the descriptor is this
                // test's own.
                unsafe { libc::write(w, f.ptr.cast(), n * PAGE) },
                n * PAGE,
            );
            must(
                "pipe read",
                // SAFETY: the buffer is live, writable and at least the length passed; the
                // descriptor is this test's own.
                unsafe { libc::read(r, out.as_mut_ptr().cast(), n * PAGE) },
                n * PAGE,
            );
            assert!(out == f.want, "{ctx}: write(2) sent other bytes");
            // SAFETY: plain system calls on this test's own descriptors and paths, with
            // NUL-terminated names and local out-arrays; errors are checked.
            unsafe { (libc::close(r), libc::close(w)) };
        }
        Toucher::KernelWrite => {
            // read(2) into evicted pages, across page boundaries.
            let (r, w) = pipe();
            let data: Vec<u8> = (0..2 * PAGE).map(|i| (i * 13 + 1) as u8).collect();
            must(
                "pipe write",
                // SAFETY: the buffer is live and at least the length passed; the descriptor is this
                // test's own.
                unsafe { libc::write(w, data.as_ptr().cast(), data.len()) },
                data.len(),
            );
            must(
                "read(2) into evicted pages",
                // SAFETY: the buffer is live, writable and at least the length passed; the
                // descriptor is this test's own.
                unsafe { libc::read(r, f.page(1).add(100).cast(), data.len()) },
                data.len(),
            );
            f.want[PAGE + 100..3 * PAGE + 100].copy_from_slice(&data);
            // SAFETY: plain system calls on this test's own descriptors and paths, with
            // NUL-terminated names and local out-arrays; errors are checked.
            unsafe { (libc::close(r), libc::close(w)) };
        }
    }
    f.check(&format!("{ctx} after {how:?}"));
    let s = f.e.stats();
    assert!(s.restored > 0 && s.restore_errors == 0, "{ctx}: {s:?}");
    f
}

#[test]
fn compressed_and_swapped_pages_come_back_on_every_touch() {
    let _g = serial();
    with_deadline("restore", Duration::from_secs(120), || {
        for swap in [false, true] {
            for how in [
                Toucher::Program,
                Toucher::OtherThread,
                Toucher::KernelRead,
                Toucher::KernelWrite,
            ] {
                let ctx = format!("swap {swap}, {how:?}");
                let s = store(u64::MAX, swap.then(|| swap_prefix("touch")));
                let f = touch(Fixture::evicted(s, 40, swap), how, &ctx);
                // Reconciled: restored pages leave the store (memory and swap slots).
                f.e.scan();
                let b = f.store.bytes();
                assert_eq!(
                    (b.pages, b.swapped),
                    (f.e.stats().evicted_now, f.e.stats().evicted_now),
                    "{ctx}: {b:?}"
                );
                // Evicted and swapped again after the touches.
                f.evict_all_remaining(swap, &ctx);
                f.check(&format!("{ctx} after a second eviction"));
                f.finish(&ctx);
            }
        }
    });
}

impl Fixture {
    fn evict_all_remaining(&self, swap: bool, ctx: &str) {
        let r = self.e.evict_with(self.ptr, self.want.len(), STORE_ONLY);
        assert_eq!(
            r.evicted + r.not_resident,
            self.pages() as u64,
            "{ctx}: {r:?}"
        );
        if swap {
            self.store.spill(u64::MAX);
            assert_eq!(self.store.bytes().payload, 0, "{ctx}");
        }
    }
}

#[test]
fn the_fault_path_allocates_nothing() {
    let _g = serial();
    with_deadline("no allocation", Duration::from_secs(60), || {
        // get() itself, on every kind of object, counted on this thread.
        let s = store(u64::MAX, Some(swap_prefix("alloc")));
        let pages: Vec<Vec<u8>> = (0..10).map(content_page).collect();
        let hs: Vec<Handle> = pages
            .iter()
            .map(|p| s.put(p.as_slice().try_into().unwrap()).unwrap())
            .collect();
        let mut out = [0u8; PAGE];
        let gets = |what: &str| {
            COUNTED.store(0, Ordering::SeqCst);
            COUNT_HERE.with(|c| c.set(true));
            ARMED.store(true, Ordering::SeqCst);
            let mut ok = true;
            for (h, p) in hs.iter().zip(&pages) {
                let mut o = [0u8; PAGE];
                ok &= s.get(*h, &mut o).is_ok() && o[..] == p[..];
            }
            ARMED.store(false, Ordering::SeqCst);
            COUNT_HERE.with(|c| c.set(false));
            assert!(ok, "{what}: wrong bytes");
            assert_eq!(COUNTED.load(Ordering::SeqCst), 0, "{what}: get allocated");
        };
        gets("compressed in memory");
        assert!(s.spill(u64::MAX) > 0);
        assert_eq!(s.bytes().swapped, 10);
        gets("swapped");
        s.get(hs[0], &mut out).unwrap();

        // The whole fault path (fault thread: table, store, UFFDIO_COPY), on
        // compressed and swapped pages touched by this thread and the kernel.
        for swap in [false, true] {
            let f = Fixture::evicted(store(u64::MAX, Some(swap_prefix("alloc2"))), 30, swap);
            let (r, w) = pipe();
            COUNTED.store(0, Ordering::SeqCst);
            ARMED.store(true, Ordering::SeqCst);
            let mut sum = 0u64;
            for k in 0..15 {
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                sum = sum.wrapping_add(unsafe { f.page(k).add(8).read_volatile() } as u64);
            }
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            let written = unsafe { libc::write(w, f.page(15).cast(), 15 * PAGE) };
            ARMED.store(false, Ordering::SeqCst);
            std::hint::black_box(sum);
            must("write(2) from evicted pages", written, 15 * PAGE);
            assert_eq!(f.e.stats().restored, 30);
            assert_eq!(
                COUNTED.load(Ordering::SeqCst),
                0,
                "swap {swap}: the fault thread allocated"
            );
            // SAFETY: plain system calls on this test's own descriptors and paths, with
            // NUL-terminated names and local out-arrays; errors are checked.
            unsafe { (libc::close(r), libc::close(w)) };
            f.finish(&format!("no allocation, swap {swap}"));
        }

        // Patched pages: reference read, patch read and decode on the fault thread.
        let e = Engine::new(Config::default());
        let n = 30;
        let p = e.alloc(n * PAGE, Hint::None);
        let base = content_page(2);
        let mut want = Vec::with_capacity(n * PAGE);
        for k in 0..n {
            let mut page = base.clone();
            (0..16).for_each(|j| page[j * 256 + 5] = (k * 16 + j) as u8 | 1);
            want.extend_from_slice(&page);
        }
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
        let r = e.evict_with(
            p,
            n * PAGE,
            Allow {
                patch: true,
                compress: false,
            },
        );
        assert!(r.patched >= n as u64 - 2, "{r:?}");
        COUNTED.store(0, Ordering::SeqCst);
        ARMED.store(true, Ordering::SeqCst);
        let mut sum = 0u64;
        for k in 0..n {
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            sum = sum.wrapping_add(unsafe { p.add(k * PAGE + 8).read_volatile() } as u64);
        }
        ARMED.store(false, Ordering::SeqCst);
        std::hint::black_box(sum);
        assert_eq!(
            COUNTED.load(Ordering::SeqCst),
            0,
            "the fault thread allocated restoring patches"
        );
        assert_eq!(
            // SAFETY: the pointer and length describe a live block of this test, which outlives
            // every use of the slice.
            unsafe { std::slice::from_raw_parts(p, n * PAGE) },
            &want[..]
        );
        assert!(e.stats().patch_restores >= r.patched);
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(p) });
    });
}

/// The store's memory when empty (tables and codecs).
fn empty_store_bytes() -> u64 {
    store(u64::MAX, None).bytes().memory()
}

/// An engine on store `s`, a block of `n` text pages in it, and what
/// evicting the block into the store did.
fn evicted_text(
    s: &Arc<TierStore>,
    n: usize,
) -> (Engine, *mut u8, Vec<u8>, pagefold_engine::EvictReport) {
    let e = Engine::new(Config {
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    });
    assert!(e.set_store(s.clone()));
    let want: Vec<u8> = (0..n as u64)
        .flat_map(|k| kind_page(Kind::Text, k))
        .collect();
    let p = e.alloc(n * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let r = e.evict_with(p, n * PAGE, STORE_ONLY);
    (e, p, want, r)
}

#[test]
fn a_full_disk_keeps_pages_in_memory() {
    let _g = serial();
    let Some(m) = TmpMount::new("engine-swap-full", "512k") else {
        return;
    };
    let prefix = m.path().join("swap");
    with_deadline("full disk", Duration::from_secs(120), move || {
        // A store of 64 KiB beyond its tables, over a 512 KiB disk, for
        // 2 MiB of compressed text: it spills until the disk is full, then refuses.
        let s = store(empty_store_bytes() + (64 << 10), Some(prefix));
        let n = 1000;
        let (e, p, want, r) = evicted_text(&s, n);
        let c = s.counts();
        let b = s.bytes();
        assert!(
            r.evicted > 0 && r.refused > 0 && r.evicted + r.refused == n as u64,
            "{r:?}"
        );
        assert!(
            c.spilled > 0 && c.swap_write_errors > 0,
            "spilled, then the disk filled: {c:?}"
        );
        assert!(b.swapped > 0 && b.swap_file_bytes <= 512 << 10, "{b:?}");
        assert_eq!(s.audit().unwrap(), b);
        // Asking for more changes nothing and loses nothing.
        let before = s.bytes();
        s.spill(1 << 20);
        assert_eq!(s.bytes().pages, before.pages);
        assert!(
            bytes(p, n * PAGE) == &want[..],
            "wrong bytes after a full disk"
        );
        let st = e.stats();
        assert_eq!((st.restore_errors, st.restored), (0, r.evicted), "{st:?}");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(p) });
        assert_eq!(s.bytes().pages, 0);
        eprintln!("full disk: {r:?}, {c:?}");
        // The fault thread holds the store (and the file on the mount) until
        // it sees the engine gone: wait, so the mount is not busy.
        drop(e);
        let t = std::time::Instant::now();
        while Arc::strong_count(&s) > 1 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// Runs `body` in a forked child and returns its wait status.
fn in_child(body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: every caller runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only the caller's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // A panic must end the child, not unwind into the test harness.
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(99);
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: status is a writable local; waitpid reaps only the given child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// The swap file of this process whose path starts with `prefix` (it is
/// unlinked: reached through /proc/self/fd), opened for writing.
fn open_swap_file(prefix: &std::path::Path) -> Option<i32> {
    let want = prefix.to_str()?;
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let link = std::fs::read_link(entry.path()).ok()?;
        if link.to_str().is_some_and(|l| l.starts_with(want)) {
            let c = std::ffi::CString::new(entry.path().to_str()?).ok()?;
            // SAFETY: plain system calls on this test's own descriptors and paths, with
            // NUL-terminated names and local out-arrays; errors are checked.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY) };
            return (fd >= 0).then_some(fd);
        }
    }
    None
}

/// In a child: five pages evicted and swapped, `damage` done to the swap
/// file's slot of page `victim`; page `intact` must read right and page
/// `victim` must not be readable.
fn damaged_swap(tag: &str, victim: usize, intact: usize, damage: fn(i32, usize)) {
    let prefix = swap_prefix(tag);
    let status = in_child(|| {
        let f = Fixture::evicted(store(u64::MAX, Some(prefix.clone())), 5, true);
        let Some(fd) = open_swap_file(&prefix) else {
            return 3;
        };
        // Slots are taken oldest first: page k is in slot k.
        damage(fd, victim * PAGE);
        if bytes(f.page(intact), PAGE) != &f.want[intact * PAGE..(intact + 1) * PAGE] {
            return 4;
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let v = unsafe { f.page(victim).add(100).read_volatile() };
        if v == f.want[victim * PAGE + 100] {
            5
        } else {
            6
        }
    });
    assert!(
        libc::WIFSIGNALED(status) && matches!(libc::WTERMSIG(status), libc::SIGBUS | libc::SIGABRT),
        "{tag}: a page whose swap slot is damaged must not be read: child status {status:#x} \
         (exit 99: panicked, 3: no swap file, 4: an intact page read wrong, 5: read the old byte, 6: read a wrong byte)"
    );
    eprintln!("{tag}: the child died by signal {}", libc::WTERMSIG(status));
}

#[test]
fn a_corrupted_swap_slot_poisons_the_page() {
    if !common::in_own_process("a_corrupted_swap_slot_poisons_the_page") {
        return;
    }
    let _g = serial();
    damaged_swap("corrupt", 0, 1, |fd, slot| {
        let junk = [0x5au8; 64];
        assert_eq!(
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            unsafe { libc::pwrite(fd, junk.as_ptr().cast(), junk.len(), slot as i64 + 10) },
            64
        );
    });
}

#[test]
fn a_truncated_swap_file_poisons_the_page() {
    if !common::in_own_process("a_truncated_swap_file_poisons_the_page") {
        return;
    }
    let _g = serial();
    // Cut at the victim's slot: its read comes back short.
    damaged_swap("truncated", 3, 0, |fd, slot| {
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        assert_eq!(unsafe { libc::ftruncate(fd, slot as i64) }, 0)
    });
}

#[test]
fn accounting_equals_the_tables_after_churn() {
    let _g = serial();
    with_deadline("churn", Duration::from_secs(120), || {
        let s = store(u64::MAX, Some(swap_prefix("churn")));
        let empty = s.bytes().memory();
        let a = Fixture::new(s.clone(), 200);
        let b = Fixture::new(s.clone(), 100);
        let agree = |what: &str| {
            let by_counters = s.bytes();
            assert_eq!(s.audit().unwrap(), by_counters, "{what}");
            assert_eq!(
                a.e.stats().store,
                by_counters,
                "{what}: the engine reports the store's bytes"
            );
        };
        for round in 0..4 {
            a.evict_all_remaining(false, "a");
            b.evict_all_remaining(false, "b");
            agree(&format!("round {round}: evicted"));
            s.spill(s.bytes().payload / 2);
            agree(&format!("round {round}: half spilled"));
            // Touch every third page of a, every other of b; reconcile.
            for k in (round..a.pages()).step_by(3) {
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                unsafe { a.page(k).read_volatile() };
            }
            for k in (0..b.pages()).step_by(2) {
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                unsafe { b.page(k).write_volatile(round as u8) };
            }
            a.e.scan();
            b.e.scan();
            agree(&format!("round {round}: touched and reconciled"));
            assert_eq!(
                s.bytes().pages,
                a.e.stats().evicted_now + b.e.stats().evicted_now
            );
        }
        let mut b = b;
        for k in (0..b.pages()).step_by(2) {
            b.want[k * PAGE] = 3;
        }
        a.check("a after churn");
        b.check("b after churn");
        drop(a.finish_keep());
        b.finish("b");
        // Everything freed: the memory is the empty store's, plus at most
        // the cache of empty slabs (256 KiB) and grown tables.
        let left = s.bytes();
        assert_eq!((left.pages, left.payload, left.swapped), (0, 0, 0));
        assert!(
            left.memory() < empty + (300 << 10),
            "{} left of {empty}",
            left.memory()
        );
    });
}

impl Fixture {
    /// Frees the block after a check, without asserting the shared store is empty.
    fn finish_keep(self) -> Engine {
        self.check("finish");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { self.e.free(self.ptr) });
        self.e
    }
}

#[test]
fn fork_with_swapped_pages() {
    if !common::in_own_process("fork_with_swapped_pages") {
        return;
    }
    let _g = serial();
    with_deadline("fork", Duration::from_secs(60), || {
        let prefix = swap_prefix("fork");
        let f = Fixture::evicted(store(u64::MAX, Some(prefix.clone())), 30, true);
        let ptr = f.ptr as usize;
        let want = f.want.clone();
        let status = in_child(|| {
            // Fork restored every page first, from the swap file.
            if bytes(ptr as *const u8, want.len()) != &want[..] {
                return 1;
            }
            // The child evicts and swaps on its own, into its own file (a
            // fresh block: pre-fork frames are not evicted, the parent maps them).
            let fresh = f.e.alloc(want.len(), Hint::None);
            // SAFETY: source and destination are distinct live buffers of this test, each at least
            // the length copied.
            unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), fresh, want.len()) };
            f.e.evict_with(fresh, want.len(), STORE_ONLY);
            if f.store.spill(u64::MAX) == 0 || f.store.bytes().swapped == 0 {
                return 2;
            }
            let own = format!("{}.{}.", prefix.display(), std::process::id());
            if open_swap_file(std::path::Path::new(&own)).is_none() {
                return 3;
            }
            if bytes(fresh, want.len()) != &want[..] {
                return 4;
            }
            // The parent's swapped objects are unreadable here but still counted.
            if f.store.audit() != Ok(f.store.bytes()) {
                return 5;
            }
            0
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child: status {status:#x} (99: panicked, 1: wrong bytes after fork, 2: no swap, 3: not its own file, 4: wrong bytes, 5: audit)"
        );
        let s = f.e.stats();
        assert_eq!((s.evicted_now, s.restored_by_engine), (0, 30), "{s:?}");
        f.check("parent after fork");
        // The parent's file is untouched by the child: swap a fresh block
        // (pre-fork frames are not evicted) through it and read it back.
        f.e.scan();
        assert_eq!(f.store.bytes().pages, 0);
        let fresh = f.e.alloc(want.len(), Hint::None);
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), fresh, want.len()) };
        assert_eq!(f.e.evict_with(fresh, want.len(), STORE_ONLY).evicted, 30);
        f.store.spill(u64::MAX);
        assert_eq!(f.store.bytes().swapped, 30);
        assert!(
            bytes(fresh, want.len()) == &want[..],
            "parent: wrong bytes from its swap file after the child swapped"
        );
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { f.e.free(fresh) });
        f.finish("fork");
    });
}

#[test]
fn without_a_usable_swap_file_a_full_store_refuses() {
    let _g = serial();
    // No swap configured: spill moves nothing. A swap file that cannot be
    // made (its directory does not exist): the same, and a full store refuses.
    for prefix in [None, Some(PathBuf::from("/nonexistent-pagefold-dir/swap"))] {
        let s = store(empty_store_bytes() + (32 << 10), prefix.clone());
        let n = 64;
        let (e, p, want, r) = evicted_text(&s, n);
        assert!(r.evicted > 0 && r.refused > 0, "{prefix:?}: {r:?}");
        assert_eq!(s.spill(1 << 20), 0, "{prefix:?}");
        assert_eq!(s.bytes().swapped, 0);
        assert_eq!(
            s.counts().swap_write_errors,
            prefix.is_some() as u64,
            "{prefix:?}: {:?}",
            s.counts()
        );
        assert!(bytes(p, n * PAGE) == &want[..], "{prefix:?}: wrong bytes");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(p) });
        assert_eq!(s.audit().unwrap(), s.bytes());
    }
}

#[test]
fn fork_while_another_thread_holds_the_store_lock() {
    if !common::in_own_process("fork_while_another_thread_holds_the_store_lock") {
        return;
    }
    let _g = serial();
    // A policy spills outside the engine lock: a fork can come while that
    // thread holds the store's lock. The child must not wait for it (the
    // thread does not exist there): its store refuses, its pages stay right.
    let s = store(u64::MAX, Some(swap_prefix("forklock")));
    let e = Engine::new(Config {
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    });
    assert!(e.set_store(s.clone()));
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let s = s.clone();
        std::thread::spawn(move || {
            s.with_lock_held(|| {
                held_tx.send(()).unwrap();
                let _ = go_rx.recv();
            })
        })
    };
    held_rx.recv().unwrap();
    let want: Vec<u8> = (0..8).flat_map(content_page).collect();
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run (the holder keeps the store's lock, which
    // the child must not wait for), so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let p = e.alloc(want.len(), Hint::None);
            // SAFETY: source and destination are distinct live buffers of this test, each at least
            // the length copied.
            unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
            let r = e.evict_with(p, want.len(), STORE_ONLY);
            let right = bytes(p, want.len()) == &want[..];
            match (r.evicted, r.refused, right) {
                (0, 8, true) => 0,
                (_, _, false) => 1,
                _ => 2,
            }
        }))
        .unwrap_or(99);
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(code) };
    }
    // The child has 10 s; a child waiting for the lock is killed and fails the test.
    let mut status = 0;
    let t = std::time::Instant::now();
    // SAFETY: status is a writable local; waitpid reaps only the given child.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if t.elapsed() > Duration::from_secs(10) {
            // SAFETY: signal setup and delivery on this test's own threads; the handler only does
            // async-signal-safe work.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: status is a writable local; waitpid reaps only the given child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            go_tx.send(()).unwrap();
            panic!("the child hung on the store's lock, held by a thread it does not have");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    go_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child: status {status:#x} (1: wrong bytes, 2: the store took pages, 99: panicked)"
    );
    // The parent's store works on.
    let f = Fixture::new(s, 20);
    f.evict_all(true);
    f.check("parent after the fork");
    f.finish("parent after the fork");
}

/// Resident bytes of this process (statm).
fn resident_bytes() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<i64>()
        .unwrap()
        * PAGE as i64
}

#[test]
fn counted_memory_follows_what_the_kernel_sees() {
    let _g = serial();
    // The store's `bytes().memory()` against the process's resident size,
    // the store alone (no engine memory moving): filling it, then spilling
    // most of it to disk (slabs compacted and given back).
    let s = store(u64::MAX, Some(swap_prefix("rss")));
    let pages: Vec<Vec<u8>> = (0..4000).map(|k| kind_page(Kind::Text, k)).collect();
    let (rss0, mem0) = (resident_bytes(), s.bytes().memory() as i64);
    let hs: Vec<Handle> = pages
        .iter()
        .map(|p| s.put(p.as_slice().try_into().unwrap()).unwrap())
        .collect();
    let (rss1, mem1) = (resident_bytes(), s.bytes().memory() as i64);
    let close = |what: &str, kernel: i64, counted: i64| {
        let slack = kernel.abs() / 20 + (256 << 10);
        assert!(
            (kernel - counted).abs() <= slack,
            "{what}: resident size moved {kernel} B, the store counted {counted} B"
        );
        eprintln!("{what}: resident {kernel} B, counted {counted} B");
    };
    close("filled", rss1 - rss0, mem1 - mem0);
    assert!(mem1 - mem0 > 8 << 20, "4000 text pages: {} B", mem1 - mem0);
    let released = s.spill((mem1 - mem0) as u64 * 3 / 4) as i64;
    let (rss2, mem2) = (resident_bytes(), s.bytes().memory() as i64);
    assert_eq!(mem1 - mem2, released);
    close("spilled", rss1 - rss2, released);
    let mut out = [0u8; PAGE];
    for (h, p) in hs.iter().zip(&pages) {
        s.get(*h, &mut out).unwrap();
        assert!(out[..] == p[..]);
        s.remove(*h);
    }
    assert_eq!(s.audit().unwrap(), s.bytes());
}

/// Number of this process's descriptor whose target starts with `prefix`.
fn descriptor_of(prefix: &std::path::Path) -> Option<i32> {
    let want = prefix.to_str()?;
    std::fs::read_dir("/proc/self/fd")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let link = std::fs::read_link(entry.path()).ok()?;
            link.to_str()?
                .starts_with(want)
                .then(|| entry.file_name().to_str()?.parse().ok())?
        })
}

/// The swap file's descriptor is the engine's like its others: out of the
/// program's range, close-on-exec, hidden from the program. A program that
/// puts its own file on that number with a raw dup3 gets no write into it: the
/// next spill is refused and the pages it would have moved stay in memory.
#[test]
fn the_swap_file_descriptor_is_kept_out_of_the_programs_way() {
    if !common::in_own_process("the_swap_file_descriptor_is_kept_out_of_the_programs_way") {
        return;
    }
    let _g = serial();
    let prefix = swap_prefix("adopted");
    let theirs = std::env::temp_dir().join(format!("pagefold-theirs-{}", std::process::id()));
    let pattern: Vec<u8> = (0..2 * PAGE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&theirs, &pattern).unwrap();
    let status = in_child(|| {
        let s = store(u64::MAX, Some(prefix.clone()));
        let f = Fixture::evicted(s.clone(), 5, true);
        let Some(n) = descriptor_of(&prefix) else {
            return 3;
        };
        // SAFETY: fcntl F_GETFD on a number takes no pointer.
        let flags = unsafe { libc::fcntl(n, libc::F_GETFD) };
        if !pagefold_engine::fds::is_engine(n) || flags & libc::FD_CLOEXEC == 0 || n < 1024 - 256 {
            return 4;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&theirs)
            .unwrap();
        use std::os::unix::io::AsRawFd;
        // SAFETY: dup3 of this test's own open file onto a number; no pointer.
        let r = unsafe { libc::syscall(libc::SYS_dup3, file.as_raw_fd(), n, libc::O_CLOEXEC) };
        if r != n as i64 {
            return 5;
        }
        let g = Fixture::new(s.clone(), 5);
        let r = g.e.evict_with(g.ptr, g.want.len(), STORE_ONLY);
        let before = s.bytes();
        s.spill(u64::MAX);
        let after = s.bytes();
        if r.evicted != 5 || after.swapped != before.swapped || !pagefold_engine::fds::lost() {
            return 6;
        }
        g.check("pages whose spill was refused");
        std::mem::forget(f);
        0
    });
    let after = std::fs::read(&theirs).unwrap();
    let _ = std::fs::remove_file(&theirs);
    assert_eq!(
        status, 0,
        "child status {status:#x} (3: no swap file, 4: not adopted, 5: dup3, 6: spill not refused)"
    );
    assert!(after == pattern, "the program's file was written");
}
