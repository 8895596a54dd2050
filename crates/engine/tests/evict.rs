//! Eviction and transparent restore: every way a page can be touched after
//! `Engine::evict` must see exactly the bytes it held — by the program (read,
//! write), by another thread, by two threads at once, by the kernel inside a
//! system call (read(2), pread(2), recv into it; write(2), send,
//! process_vm_readv from it; process_vm_writev into it) — and every other
//! engine operation must cope with evicted pages: free, copy (either side),
//! scan, discard, shrink, exempt, fork. Refusals (incompressible pages, a
//! full store, no userfaultfd MISSING mode) must leave pages as they were.
//!
//! Each restore test runs over the four kinds of page that can be evicted:
//! anonymous, owned (frame mapped shared), sole shared (a copy whose source
//! is gone) and sole diverged (a written copy whose source is gone).
//!
//! The tests in one process run one at a time: a fork in one test restores
//! every evicted page of every engine in the process, which would upset
//! another's counts. The tests that fork run in a process of their own
//! (`common::in_own_process`), so their children find no lock held by
//! another test's thread.

mod common;
use common::{
    assert_killed_for_lost_page, bytes, incompressible, pipe, serial, socketpair, with_deadline,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use pagefold_engine::{
    Allow, Config, Engine, Handle, Hint, Inject, PageStore, StoreBytes, StoreError, PAGE,
};

/// Compressible content, different for every `k`, never all zero.
fn pattern(k: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|i| (((i / 16) ^ k) as u8).wrapping_mul(3) | 1)
        .collect()
}

fn resident_pages(p: *const u8, n: usize) -> usize {
    let mut v = vec![0u8; n];
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mincore(p as *mut _, n * PAGE, v.as_mut_ptr()) },
        0
    );
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// Eviction to the page store alone, for tests of the store path (tests/patch.rs tests patching).
const STORE_ONLY: Allow = Allow {
    patch: false,
    compress: true,
};

fn cfg() -> Config {
    Config {
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    }
}

/// The kinds of page eviction takes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Anon,
    Owned,
    SoleShared,
    SoleDiverged,
}

const KINDS: [Kind; 4] = [
    Kind::Anon,
    Kind::Owned,
    Kind::SoleShared,
    Kind::SoleDiverged,
];

/// A block of `n` pages of `kind` and what it holds.
struct Blk {
    e: Engine,
    ptr: *mut u8,
    want: Vec<u8>,
}

// SAFETY: Blk holds raw pointers into blocks the test owns; every thread that gets it only touches
// those blocks while the test keeps them alive.
unsafe impl Send for Blk {}
// SAFETY: Blk holds raw pointers into blocks the test owns; every thread that gets it only touches
// those blocks while the test keeps them alive.
unsafe impl Sync for Blk {}

impl Blk {
    fn new(kind: Kind, n: usize) -> Blk {
        Blk::with(kind, n, cfg())
    }

    /// As `new`, on an engine configured as `cfg`.
    fn with(kind: Kind, n: usize, cfg: Config) -> Blk {
        let e = Engine::new(match kind {
            Kind::Anon => Config {
                frames: false,
                ..cfg
            },
            _ => cfg,
        });
        let want: Vec<u8> = (0..n).flat_map(pattern).collect();
        let fresh = |e: &Engine| {
            let p = e.alloc(n * PAGE, Hint::None);
            assert!(!p.is_null());
            p
        };
        let ptr = match kind {
            Kind::Anon | Kind::Owned => {
                let p = fresh(&e);
                // SAFETY: source and destination are distinct live buffers of this test, each at
                // least the length copied.
                unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
                p
            }
            Kind::SoleShared | Kind::SoleDiverged => {
                let src = fresh(&e);
                let dst = fresh(&e);
                let first: Vec<u8> = if kind == Kind::SoleDiverged {
                    (100..100 + n).flat_map(pattern).collect()
                } else {
                    want.clone()
                };
                // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
                // length copied.
                unsafe {
                    std::ptr::copy_nonoverlapping(first.as_ptr(), src, first.len());
                    e.copy(dst, src, n * PAGE);
                }
                assert!(
                    e.stats().pages_shared_by_copy >= n as u64,
                    "{kind:?}: not shared by copy"
                );
                if kind == Kind::SoleDiverged {
                    // SAFETY: source and destination are distinct live buffers of this test, each
                    // at least the length copied.
                    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), dst, want.len()) };
                }
                // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
                // uses it after this free.
                assert!(unsafe { e.free(src) });
                dst
            }
        };
        Blk { e, ptr, want }
    }

    /// Evicts the whole block and checks that all of it left memory.
    fn evicted(kind: Kind, n: usize) -> Blk {
        let b = Blk::new(kind, n);
        let r = b.e.evict_with(b.ptr, n * PAGE, STORE_ONLY);
        assert_eq!(r.evicted, n as u64, "{kind:?}: {r:?}");
        let s = b.e.stats();
        assert_eq!(s.evicted_now, n as u64, "{kind:?}: {s:?}");
        assert_eq!(s.store.pages, n as u64, "{kind:?}: {s:?}");
        assert_eq!(
            s.frames_resident, 0,
            "{kind:?}: frames still resident: {s:?}"
        );
        assert_eq!(
            resident_pages(b.ptr, n),
            0,
            "{kind:?}: pages still present after eviction"
        );
        b
    }

    fn page(&self, k: usize) -> *mut u8 {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { self.ptr.add(k * PAGE) }
    }

    fn check(&self, ctx: &str) {
        let got = bytes(self.ptr, self.want.len());
        if got != &self.want[..] {
            let first = (0..got.len()).find(|&i| got[i] != self.want[i]).unwrap();
            panic!(
                "{ctx}: differs from what was written at byte {first} (page {} + {}): got {:02x?} want {:02x?}",
                first / PAGE,
                first % PAGE,
                &got[first..(first + 8).min(got.len())],
                &self.want[first..(first + 8).min(got.len())]
            );
        }
    }

    fn write(&mut self, off: usize, data: &[u8]) {
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        self.want[off..off + data.len()].copy_from_slice(data);
    }

    /// Frees the block after a final check; the store must end up empty.
    fn finish(self, ctx: &str) {
        self.check(ctx);
        let s = self.e.stats();
        assert_eq!(s.restore_errors, 0, "{ctx}: {s:?}");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { self.e.free(self.ptr) });
        let s = self.e.stats();
        assert_eq!(
            (s.evicted_now, s.store.pages, s.frames_in_use, s.vmas_used),
            (0, 0, 0, 0),
            "{ctx}: {s:?}"
        );
    }
}

#[test]
fn restore_on_read_and_on_write_by_the_program() {
    let _g = serial();
    for kind in KINDS {
        let mut b = Blk::evicted(kind, 64);
        // Reads of some pages, writes of others (the write must land on the restored content).
        assert_eq!(
            bytes(b.page(3), PAGE),
            &pattern(3)[..],
            "{kind:?}: read of an evicted page"
        );
        b.write(5 * PAGE + 7, &[0xEE; 3]);
        b.write(9 * PAGE, &vec![0x42; PAGE]);
        b.check(&format!("{kind:?} after touches"));
        let s = b.e.stats();
        assert_eq!(s.restored, 64, "{kind:?}: {s:?}");
        assert_eq!(
            s.evict_lifetime_ms_log2.iter().sum::<u64>(),
            64,
            "{kind:?}: {s:?}"
        );
        // Reconciled by a scan: records and stored copies go, the mapping count returns.
        b.e.scan();
        let s = b.e.stats();
        assert_eq!((s.evicted_now, s.store.pages), (0, 0), "{kind:?}: {s:?}");
        assert_eq!(s.vmas_used, 1, "{kind:?}: registration not undone: {s:?}");
        b.finish(&format!("{kind:?}"));
    }
}

#[test]
fn restore_by_another_thread_and_evict_again() {
    let _g = serial();
    for kind in KINDS {
        let b = Blk::evicted(kind, 32);
        let b = std::thread::spawn(move || {
            b.check(&format!("{kind:?} read by another thread"));
            b
        })
        .join()
        .unwrap();
        // Restored pages can be evicted again (reconciled first).
        let r = b.e.evict(b.ptr, 32 * PAGE);
        assert_eq!(r.evicted, 32, "{kind:?}: second eviction {r:?}");
        b.check(&format!("{kind:?} after a second eviction"));
        b.finish(&format!("{kind:?}"));
    }
}

fn must(what: &str, r: isize, len: usize) {
    let e = std::io::Error::last_os_error();
    assert_eq!(
        r, len as isize,
        "{what}: {r} ({e}): a system call on an evicted page must wait for it, not fail"
    );
}

fn temp_file(data: &[u8]) -> i32 {
    let path = std::env::temp_dir().join(format!("pagefold-evict-{}", std::process::id()));
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o600,
        )
    };
    assert!(fd >= 0);
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe { libc::unlink(c.as_ptr()) };
    must(
        "write temp file",
        // SAFETY: the buffer is live and at least the length passed; the descriptor is this test's
        // own.
        unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0) },
        data.len(),
    );
    fd
}

#[test]
fn kernel_writes_into_evicted_pages() {
    let _g = serial();
    with_deadline(
        "kernel_writes_into_evicted_pages",
        Duration::from_secs(60),
        || {
            for kind in KINDS {
                let mut b = Blk::evicted(kind, 16);
                let data: Vec<u8> = (0..3 * PAGE).map(|i| (i * 7 + 5) as u8).collect();
                let (r, w) = pipe();
                // read(2) from a pipe into the middle of page 1 and across pages 2-3.
                must(
                    "pipe write",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::write(w, data.as_ptr().cast(), 2 * PAGE) },
                    2 * PAGE,
                );
                must(
                    "read(2) into evicted pages",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::read(r, b.page(1).add(100).cast(), 2 * PAGE) },
                    2 * PAGE,
                );
                b.want[PAGE + 100..3 * PAGE + 100].copy_from_slice(&data[..2 * PAGE]);
                // pread(2) from a file.
                let fd = temp_file(&data);
                must(
                    "pread(2) into an evicted page",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::pread(fd, b.page(5).add(9).cast(), 1000, 17) },
                    1000,
                );
                b.want[5 * PAGE + 9..5 * PAGE + 1009].copy_from_slice(&data[17..1017]);
                // recv(2) from a socket.
                let (s0, s1) = socketpair();
                must(
                    "send",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::send(s0, data.as_ptr().cast(), 500, 0) },
                    500,
                );
                must(
                    "recv(2) into an evicted page",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::recv(s1, b.page(7).add(3000).cast(), 500, 0) },
                    500,
                );
                b.want[7 * PAGE + 3000..7 * PAGE + 3500].copy_from_slice(&data[..500]);
                // process_vm_writev: the kernel pins the page (GUP), faulting it in first.
                let local = libc::iovec {
                    iov_base: data.as_ptr() as *mut _,
                    iov_len: PAGE,
                };
                let remote = libc::iovec {
                    // SAFETY: the address lies inside a live block this test allocated, and no
                    // reference to those bytes exists during the access.
                    iov_base: unsafe { b.page(9).add(1) }.cast(),
                    iov_len: PAGE,
                };
                must(
                    "process_vm_writev into evicted pages",
                    // SAFETY: the iovecs describe live buffers of this test, each as long as
                    // stated.
                    unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) },
                    PAGE,
                );
                b.want[9 * PAGE + 1..10 * PAGE + 1].copy_from_slice(&data[..PAGE]);
                // SAFETY: plain system calls on this test's own descriptors and paths, with
                // NUL-terminated names and local out-arrays; errors are checked.
                unsafe {
                    for fd in [r, w, fd, s0, s1] {
                        libc::close(fd);
                    }
                }
                b.check(&format!(
                    "{kind:?} after the kernel wrote into evicted pages"
                ));
                b.finish(&format!("{kind:?}"));
            }
        },
    );
}

#[test]
fn kernel_reads_from_evicted_pages() {
    let _g = serial();
    with_deadline(
        "kernel_reads_from_evicted_pages",
        Duration::from_secs(60),
        || {
            for kind in KINDS {
                let b = Blk::evicted(kind, 16);
                let mut out = vec![0u8; 2 * PAGE];
                let (r, w) = pipe();
                must(
                    "write(2) from evicted pages",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::write(w, b.page(1).add(10).cast(), 2 * PAGE) },
                    2 * PAGE,
                );
                must(
                    "pipe read",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::read(r, out.as_mut_ptr().cast(), 2 * PAGE) },
                    2 * PAGE,
                );
                assert_eq!(
                    out[..],
                    b.want[PAGE + 10..3 * PAGE + 10],
                    "{kind:?}: write(2) wrote other bytes"
                );
                let (s0, s1) = socketpair();
                must(
                    "send(2) from an evicted page",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::send(s0, b.page(4).cast(), PAGE, 0) },
                    PAGE,
                );
                must(
                    "recv",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::recv(s1, out.as_mut_ptr().cast(), PAGE, libc::MSG_WAITALL) },
                    PAGE,
                );
                assert_eq!(
                    out[..PAGE],
                    b.want[4 * PAGE..5 * PAGE],
                    "{kind:?}: send(2) sent other bytes"
                );
                let local = libc::iovec {
                    iov_base: out.as_mut_ptr().cast(),
                    iov_len: 2 * PAGE,
                };
                let remote = libc::iovec {
                    // SAFETY: the address lies inside a live block this test allocated, and no
                    // reference to those bytes exists during the access.
                    iov_base: unsafe { b.page(6).add(5) }.cast(),
                    iov_len: 2 * PAGE,
                };
                must(
                    "process_vm_readv from evicted pages",
                    // SAFETY: the iovecs describe live buffers of this test, each as long as
                    // stated.
                    unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) },
                    2 * PAGE,
                );
                assert_eq!(
                    out[..],
                    b.want[6 * PAGE + 5..8 * PAGE + 5],
                    "{kind:?}: process_vm_readv read other bytes"
                );
                let fd = temp_file(&[0u8; 16]);
                must(
                    "pwrite(2) from an evicted page",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::pwrite(fd, b.page(10).cast(), PAGE, 0) },
                    PAGE,
                );
                must(
                    "pread back",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::pread(fd, out.as_mut_ptr().cast(), PAGE, 0) },
                    PAGE,
                );
                assert_eq!(
                    out[..PAGE],
                    b.want[10 * PAGE..11 * PAGE],
                    "{kind:?}: pwrite(2) wrote other bytes"
                );
                // SAFETY: plain system calls on this test's own descriptors and paths, with
                // NUL-terminated names and local out-arrays; errors are checked.
                unsafe {
                    for fd in [r, w, s0, s1, fd] {
                        libc::close(fd);
                    }
                }
                b.finish(&format!("{kind:?}"));
            }
        },
    );
}

#[test]
fn concurrent_faults_on_one_page() {
    let _g = serial();
    with_deadline(
        "concurrent_faults_on_one_page",
        Duration::from_secs(120),
        || {
            for kind in KINDS {
                let b = Arc::new(Blk::new(kind, 4));
                let threads = 4;
                let barrier = Arc::new(Barrier::new(threads + 1));
                let rounds = 200;
                let stop = Arc::new(AtomicBool::new(false));
                let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (b, barrier) = (b.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        for round in 0..rounds {
                            barrier.wait();
                            let p = b.page(1);
                            // Half the threads write their own byte, half read the whole page.
                            if t % 2 == 0 {
                                let off = 64 + t * 8;
                                // SAFETY: the address lies inside a live block this test allocated,
                                // and no reference to those bytes exists during the access.
                                unsafe { p.add(off).write_volatile(round as u8) };
                                // SAFETY: the address lies inside a live block this test allocated,
                                // and no reference to those bytes exists during the access.
                                assert_eq!(unsafe { p.add(off).read_volatile() }, round as u8);
                            } else {
                                let got = bytes(p, PAGE);
                                for (i, (&g, &w)) in got.iter().zip(&b.want[PAGE..2 * PAGE]).enumerate() {
                                    let written = i >= 64 && i < 64 + threads * 8 && (i - 64) % 16 == 0;
                                    assert!(g == w || written, "{kind:?} round {round}: byte {i} is {g:#x}, want {w:#x}");
                                }
                            }
                            barrier.wait();
                        }
                    })
                })
                .collect();
                for round in 0..rounds {
                    let r = b.e.evict(b.ptr, 4 * PAGE);
                    assert!(r.evicted > 0 || round > 0, "{kind:?}: {r:?}");
                    barrier.wait();
                    barrier.wait();
                    for t in (0..threads).step_by(2) {
                        // SAFETY: the address lies inside a live block this test allocated, and no
                        // reference to those bytes exists during the access.
                        let got = unsafe { b.page(1).add(64 + t * 8).read() };
                        assert_eq!(
                            got, round as u8,
                            "{kind:?} round {round}: thread {t}'s write was lost"
                        );
                    }
                }
                stop.store(true, Ordering::Relaxed);
                for w in workers {
                    w.join().unwrap();
                }
                let s = b.e.stats();
                assert_eq!(s.restore_errors, 0, "{kind:?}: {s:?}");
                assert!(s.restored >= rounds as u64, "{kind:?}: {s:?}");
            }
        },
    );
}

/// Writers keep incrementing counters in their own pages while another
/// thread evicts the block over and over: no increment may be lost.
#[test]
fn no_write_lost_under_repeated_eviction() {
    let _g = serial();
    with_deadline(
        "no_write_lost_under_repeated_eviction",
        Duration::from_secs(120),
        || {
            for kind in [Kind::Owned, Kind::Anon] {
                let b = Arc::new(Blk::new(kind, 8));
                let stop = Arc::new(AtomicBool::new(false));
                let writers: Vec<_> = (0..2)
                    .map(|t| {
                        let (b, stop) = (b.clone(), stop.clone());
                        std::thread::spawn(move || {
                            let p = b.page(2 + t).cast::<u64>();
                            let mut n = 0u64;
                            // SAFETY: the address lies inside a live block this test allocated, and
                            // no reference to those bytes exists during the access.
                            unsafe { p.write_volatile(0) };
                            while !stop.load(Ordering::Relaxed) {
                                n += 1;
                                // SAFETY: the address lies inside a live block this test allocated,
                                // and no reference to those bytes exists during the access.
                                unsafe { p.write_volatile(n) };
                                // SAFETY: the address lies inside a live block this test allocated,
                                // and no reference to those bytes exists during the access.
                                let got = unsafe { p.read_volatile() };
                                assert_eq!(got, n, "{kind:?}: thread {t} wrote {n} and read {got}");
                            }
                            n
                        })
                    })
                    .collect();
                let mut evicted = 0;
                let t0 = std::time::Instant::now();
                while t0.elapsed() < Duration::from_millis(1500) {
                    evicted += b.e.evict(b.ptr, 8 * PAGE).evicted;
                }
                stop.store(true, Ordering::Relaxed);
                for (t, w) in writers.into_iter().enumerate() {
                    let n = w.join().unwrap();
                    assert_eq!(
                        // SAFETY: the address lies inside a live block this test allocated, and no
                        // reference to those bytes exists during the access.
                        unsafe { b.page(2 + t).cast::<u64>().read() },
                        n,
                        "{kind:?}: last write lost"
                    );
                }
                let s = b.e.stats();
                assert!(
                    evicted > 0 && s.restore_errors == 0,
                    "{kind:?}: evicted {evicted}, {s:?}"
                );
            }
        },
    );
}

#[test]
fn what_is_not_evicted() {
    let _g = serial();
    let e = Engine::new(cfg());
    let n = 16;
    let src = e.alloc(n * PAGE, Hint::None);
    let dst = e.alloc(n * PAGE, Hint::None);
    let want: Vec<u8> = (0..n).flat_map(pattern).collect();
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe {
        std::ptr::copy_nonoverlapping(want.as_ptr(), src, want.len());
        e.copy(dst, src, n * PAGE);
    }
    // Both sides map the same frames: evicting one frees nothing.
    let r = e.evict(src, n * PAGE);
    assert_eq!((r.evicted, r.not_eligible), (0, n as u64), "{r:?}");
    // Never touched, and all zero.
    let fresh = e.alloc(n * PAGE, Hint::None);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(fresh.add(PAGE), 0, PAGE) };
    let r = e.evict(fresh, n * PAGE);
    assert_eq!(
        (r.evicted, r.not_resident, r.zero),
        (0, n as u64 - 1, 1),
        "{r:?}"
    );
    assert_eq!(bytes(dst, n * PAGE), &want[..]);
    assert_eq!(bytes(src, n * PAGE), &want[..]);
    for p in [src, dst, fresh] {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(p) });
    }
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn evict_then_free_releases_the_store() {
    let _g = serial();
    for kind in KINDS {
        let b = Blk::evicted(kind, 32);
        // Touch a few, leave the rest evicted.
        assert_eq!(bytes(b.page(0), PAGE), &b.want[..PAGE]);
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { b.e.free(b.ptr) });
        let s = b.e.stats();
        assert_eq!(
            (s.evicted_now, s.store.pages, s.store.payload),
            (0, 0, 0),
            "{kind:?}: {s:?}"
        );
        assert_eq!(s.evicted_dropped, 31, "{kind:?}: {s:?}");
        assert_eq!(
            (s.frames_in_use, s.frames_resident, s.vmas_used),
            (0, 0, 0),
            "{kind:?}: {s:?}"
        );
    }
}

#[test]
fn evict_then_copy_either_way() {
    let _g = serial();
    for kind in KINDS {
        // Evicted source: the copy restores it and shares what it can.
        let b = Blk::evicted(kind, 32);
        let copy = b.e.alloc(32 * PAGE, Hint::None);
        // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
        // copied.
        unsafe { b.e.copy(copy, b.ptr, 32 * PAGE) };
        assert!(
            bytes(copy, 32 * PAGE) == &b.want[..],
            "{kind:?}: copy of an evicted block"
        );
        b.check(&format!("{kind:?}: source after the copy"));
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { b.e.free(copy) });
        // Evicted destination (written plainly, so its pages are its own), whole pages and a ragged edge.
        let dst = b.e.alloc(32 * PAGE, Hint::None);
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(b.want.as_ptr(), dst, 32 * PAGE) };
        let r = b.e.evict(dst, 32 * PAGE);
        assert!(r.evicted > 0, "{kind:?}: {r:?}");
        let src = b.e.alloc(32 * PAGE, Hint::None);
        let other: Vec<u8> = (200..232).flat_map(pattern).collect();
        // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
        // copied.
        unsafe {
            std::ptr::copy_nonoverlapping(other.as_ptr(), src, other.len());
            b.e.copy(dst.add(100), src.add(100), 30 * PAGE);
        }
        let mut want = b.want.clone();
        want[100..100 + 30 * PAGE].copy_from_slice(&other[100..100 + 30 * PAGE]);
        assert!(
            bytes(dst, 32 * PAGE) == &want[..],
            "{kind:?}: copy onto an evicted block"
        );
        for p in [dst, src] {
            // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
            // uses it after this free.
            assert!(unsafe { b.e.free(p) });
        }
        b.finish(&format!("{kind:?}"));
    }
}

#[test]
fn evict_then_scan_skips_evicted_pages() {
    let _g = serial();
    let e = Engine::new(cfg());
    let n = 64;
    let p = e.alloc(n * PAGE, Hint::None);
    // Pairs of duplicates and some zero pages, so the scan has work.
    let mut want = vec![0u8; n * PAGE];
    for k in 0..n {
        if k % 8 != 7 {
            want[k * PAGE..(k + 1) * PAGE].copy_from_slice(&pattern(k / 2));
        }
    }
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    let r = e.evict_with(unsafe { p.add(16 * PAGE) }, 16 * PAGE, STORE_ONLY);
    assert_eq!((r.evicted, r.zero), (14, 2), "{r:?}");
    let before = e.stats();
    e.scan();
    let rep = e.scan();
    let s = e.stats();
    assert_eq!(
        s.evicted_now, 14,
        "the scan touched evicted pages: {rep:?} {s:?}"
    );
    assert_eq!(s.restored, 0, "the scan restored evicted pages: {s:?}");
    assert!(
        s.merged > before.merged && s.zero_folded > 0,
        "the scan did nothing around them: {s:?}"
    );
    assert!(
        bytes(p, n * PAGE) == &want[..],
        "bytes changed by eviction + scan"
    );
    // Touched, reconciled by the next scan, then scanned like any page.
    assert_eq!(e.stats().restored, 14);
    e.scan();
    e.scan();
    let s = e.stats();
    assert_eq!((s.evicted_now, s.store.pages), (0, 0), "{s:?}");
    assert!(bytes(p, n * PAGE) == &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn discard_shrink_and_exempt_of_evicted_pages() {
    let _g = serial();
    for kind in KINDS {
        let mut b = Blk::evicted(kind, 32);
        // Discard: reads zero, nothing restored, stored copies dropped.
        let rest = b.e.discard(b.page(4), 4 * PAGE);
        for (s, l) in rest {
            // SAFETY: the range is a live block of this test; the call changes or reads only that
            // range (a mincore vector has one byte per page).
            unsafe { libc::madvise(s as *mut _, l, libc::MADV_DONTNEED) };
        }
        b.want[4 * PAGE..8 * PAGE].fill(0);
        assert_eq!(
            bytes(b.page(4), 4 * PAGE),
            &b.want[4 * PAGE..8 * PAGE],
            "{kind:?}: discard"
        );
        let s = b.e.stats();
        assert_eq!(
            (s.evicted_now, s.evicted_dropped),
            (28, 4),
            "{kind:?}: {s:?}"
        );
        // Shrink: the evicted tail goes.
        assert!(b.e.shrink(b.ptr, 20 * PAGE));
        b.want.truncate(20 * PAGE);
        assert_eq!(b.e.stats().evicted_now, 16, "{kind:?}");
        // Exempt: everything comes back first, then leaves the engine's hands.
        assert!(b.e.exempt(b.ptr, 1));
        let s = b.e.stats();
        assert_eq!(
            (s.evicted_now, s.restored_by_engine),
            (0, 16),
            "{kind:?}: {s:?}"
        );
        b.check(&format!("{kind:?} after discard, shrink and exempt"));
        let r = b.e.evict(b.ptr, 20 * PAGE);
        assert_eq!(r.evicted, 0, "{kind:?}: an exempt block was evicted: {r:?}");
        b.finish(&format!("{kind:?}"));
    }
}

#[test]
fn refusals_leave_pages_untouched() {
    let _g = serial();
    // Incompressible pages.
    let e = Engine::new(cfg());
    let n = 16;
    let p = e.alloc(n * PAGE, Hint::None);
    let want: Vec<u8> = (0..n as u64).flat_map(incompressible).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let r = e.evict_with(p, n * PAGE, STORE_ONLY);
    assert_eq!((r.evicted, r.refused), (0, n as u64), "{r:?}");
    assert_eq!(resident_pages(p, n), n);
    assert!(bytes(p, n * PAGE) == &want[..]);
    let s = e.stats();
    assert_eq!(
        (s.evict_refused, s.store.pages, s.vmas_used),
        (n as u64, 0, 1),
        "{s:?}"
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });

    // A full store: what fits is evicted, the rest stays. The capacity is
    // what the empty store holds (tables, codecs) and 32 KiB: one slab of
    // the class these pages compress to, not two.
    let empty = pagefold_engine::TierStore::new(unlimited())
        .unwrap()
        .bytes()
        .memory();
    let e = Engine::new(Config {
        evict_store_bytes: empty + 32_768,
        ..cfg()
    });
    let p = e.alloc(n * PAGE, Hint::None);
    let want: Vec<u8> = (0..n).flat_map(pattern).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let r = e.evict_with(p, n * PAGE, STORE_ONLY);
    assert!(
        r.evicted > 0 && r.refused > 0 && r.evicted + r.refused == n as u64,
        "{r:?}"
    );
    assert_eq!(resident_pages(p, n), r.refused as usize);
    assert!(bytes(p, n * PAGE) == &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_eq!(e.stats().store.pages, 0);
}

fn unlimited() -> pagefold_engine::TierConfig {
    pagefold_engine::TierConfig {
        capacity: u64::MAX,
        swap: None,
    }
}

/// A store that takes nothing, or loses what it took.
struct BadStore {
    lose: bool,
    inner: pagefold_engine::TierStore,
    puts: AtomicU64,
}

impl PageStore for BadStore {
    fn put(&self, page: &[u8; PAGE]) -> Result<Handle, StoreError> {
        self.puts.fetch_add(1, Ordering::Relaxed);
        if self.lose {
            self.inner.put(page)
        } else {
            Err(StoreError::Full)
        }
    }
    fn get(&self, _: Handle, _: &mut [u8; PAGE]) -> Result<(), StoreError> {
        Err(StoreError::Lost)
    }
    fn remove(&self, h: Handle) {
        self.inner.remove(h)
    }
    fn bytes(&self) -> StoreBytes {
        self.inner.bytes()
    }
}

#[test]
fn a_failing_store_never_yields_wrong_bytes() {
    if !common::in_own_process("a_failing_store_never_yields_wrong_bytes") {
        return;
    }
    let _g = serial();
    let e = Engine::new(cfg());
    let store = Arc::new(BadStore {
        lose: false,
        inner: pagefold_engine::TierStore::new(unlimited()).unwrap(),
        puts: AtomicU64::new(0),
    });
    assert!(e.set_store(store.clone()));
    let n = 8;
    let p = e.alloc(n * PAGE, Hint::None);
    let want: Vec<u8> = (0..n).flat_map(pattern).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let r = e.evict_with(p, n * PAGE, STORE_ONLY);
    assert_eq!((r.evicted, r.refused), (0, n as u64), "{r:?}");
    assert_eq!(store.puts.load(Ordering::Relaxed), n as u64);
    assert!(bytes(p, n * PAGE) == &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });

    // A store that loses a page: touching it must kill the toucher (SIGBUS), not read garbage.
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let e = Engine::new(cfg());
        let store = Arc::new(BadStore {
            lose: true,
            inner: pagefold_engine::TierStore::new(unlimited()).unwrap(),
            puts: AtomicU64::new(0),
        });
        e.set_store(store);
        let p = e.alloc(PAGE, Hint::None);
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(pattern(1).as_ptr(), p, PAGE) };
        if e.evict(p, PAGE).evicted != 1 {
            // SAFETY: _exit ends the child at once, running no destructors.
            unsafe { libc::_exit(3) };
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let v = unsafe { p.read_volatile() };
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(if v == pattern(1)[0] { 4 } else { 5 }) };
    }
    let sig = assert_killed_for_lost_page(pid, "a page whose stored copy is lost");
    eprintln!("lost page: the child died by signal {sig}");
}

#[test]
fn evict_then_fork_child_and_parent_read_right_bytes() {
    if !common::in_own_process("evict_then_fork_child_and_parent_read_right_bytes") {
        return;
    }
    let _g = serial();
    with_deadline("evict_then_fork", Duration::from_secs(60), || {
        for kind in KINDS {
            let mut b = Blk::evicted(kind, 32);
            // SAFETY: this test runs alone in its process (in_own_process): at the
            // fork only its own threads run, so no other test's thread holds a
            // lock; the child touches only this test's memory and leaves with
            // _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let ok = bytes(b.ptr, b.want.len()) == &b.want[..];
                // The child writes its own copy (the parent must not see it),
                // then evicts on its own (new userfaultfd, new fault thread).
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                unsafe { std::ptr::write_bytes(b.ptr, 0x77, PAGE) };
                b.want[..PAGE].fill(0x77);
                let fresh = b.e.alloc(4 * PAGE, Hint::None);
                // SAFETY: source and destination are distinct live buffers of this test, each at
                // least the length copied.
                unsafe { std::ptr::copy_nonoverlapping(b.want.as_ptr(), fresh, 4 * PAGE) };
                let r = b.e.evict(fresh, 4 * PAGE);
                let again = r.evicted == 4 && bytes(fresh, 4 * PAGE) == &b.want[..4 * PAGE];
                let code = if !ok {
                    1
                } else if !again {
                    2
                } else {
                    0
                };
                // SAFETY: _exit ends the child at once, running no destructors.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: status is a writable local; waitpid reaps only the given child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "{kind:?}: the child read wrong bytes (exit 1) or could not evict and restore (exit 2): status {status:#x}"
            );
            let s = b.e.stats();
            assert_eq!(
                (s.evicted_now, s.restored_by_engine),
                (0, 32),
                "{kind:?}: fork must restore first: {s:?}"
            );
            b.check(&format!("{kind:?}: parent after fork"));
            // The parent evicts again after the fork (frames from before it
            // are not eligible: the child may map them).
            let r = b.e.evict(b.ptr, 32 * PAGE);
            b.write(PAGE, &[9; 10]);
            b.check(&format!(
                "{kind:?}: parent after eviction after fork ({r:?})"
            ));
            b.finish(&format!("{kind:?}"));
        }
    });
}

#[test]
fn lifetimes_are_recorded() {
    let _g = serial();
    let b = Blk::evicted(Kind::Owned, 4);
    std::thread::sleep(Duration::from_millis(40));
    b.check("after 40 ms");
    let s = b.e.stats();
    let h = s.evict_lifetime_ms_log2;
    assert_eq!(h.iter().sum::<u64>(), 4, "{h:?}");
    // 40 ms is in bucket 6 (32-64 ms) or later.
    assert_eq!(h[6..].iter().sum::<u64>(), 4, "{h:?}");
    b.finish("lifetimes");
}

fn maps_in(lo: usize, hi: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (a, b) = r.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a < hi && b > lo
        })
        .count()
}

#[test]
fn mappings_counted_while_evicted() {
    let _g = serial();
    for kind in KINDS {
        let b = Blk::new(kind, 32);
        let (lo, hi) = (b.ptr as usize, b.ptr as usize + 32 * PAGE);
        let r = b.e.evict(b.page(10), 5 * PAGE);
        assert_eq!(r.evicted, 5, "{kind:?}: {r:?}");
        let s = b.e.stats();
        assert_eq!(
            s.vmas_used as usize,
            maps_in(lo, hi),
            "{kind:?}: engine's count differs from the kernel's: {s:?}"
        );
        assert_eq!(
            s.vmas_used, 3,
            "{kind:?}: a registered run in the middle is its own mapping: {s:?}"
        );
        b.check(&format!("{kind:?}"));
        b.e.scan();
        let s = b.e.stats();
        assert_eq!(
            (s.vmas_used as usize, maps_in(lo, hi)),
            (1, 1),
            "{kind:?}: {s:?}"
        );
        b.finish(&format!("{kind:?}"));
    }
}

fn fallback(inject: Inject, name: &str) {
    let e = Engine::new(Config { inject, ..cfg() });
    let n = 16;
    let p = e.alloc(n * PAGE, Hint::None);
    let want: Vec<u8> = (0..n).flat_map(|k| pattern(k % 4)).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let r = e.evict(p, n * PAGE);
    assert!(r.unavailable && r.evicted == 0, "{name}: {r:?}");
    let s = e.stats();
    assert_eq!((s.fallbacks.evict, s.evicted_now), (1, 0), "{name}: {s:?}");
    assert_eq!(resident_pages(p, n), n);
    // The rest still works.
    let q = e.alloc(n * PAGE, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(q, p, n * PAGE) };
    e.scan();
    e.scan();
    assert!(
        bytes(p, n * PAGE) == &want[..] && bytes(q, n * PAGE) == &want[..],
        "{name}"
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) && e.free(q) });
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn without_missing_mode_evict_is_refused() {
    let _g = serial();
    fallback(
        Inject {
            fail_uffd: true,
            ..Inject::default()
        },
        "no userfaultfd",
    );
    fallback(
        Inject {
            fail_uffd_missing: true,
            ..Inject::default()
        },
        "no MISSING mode",
    );
    // Write protection still works without MISSING mode: scans merge.
    let e = Engine::new(Config {
        inject: Inject {
            fail_uffd_missing: true,
            ..Inject::default()
        },
        ..cfg()
    });
    assert!(e.stats().protected_scan);
}

/// The kernel writes into (read(2) from a pipe, pread, recv) and reads from
/// (write(2), process_vm_readv) pages that another thread evicts in a loop:
/// every call must wait rather than fail, and every byte must be right.
/// Beside it, on a small block of another engine that a thread also evicts
/// in a loop, several threads read (write(2), process_vm_readv) the same
/// pages: several faults on one evicted page, so the fault thread answers
/// the later ones after the first restored it, sometimes as late as the
/// page's next eviction. (Writes through pages pinned before eviction
/// protected them — process_vm_writev, O_DIRECT — are the pin-grace boundary
/// shared with the scan, docs/MECHANISMS.md; not tested here.)
#[test]
fn kernel_io_while_another_thread_evicts() {
    kernel_io_race(0, cfg().pin_grace);
}

/// The same with pauses injected where eviction, restoring and reconciling
/// race (PAGEFOLD_INJECT_RACE_US) and no pin grace (without it eviction
/// comes round more often): other interleavings than the machine's timing
/// gives. It meets a late fault answered while its page is evicted again
/// in about half its runs (docs/MECHANISMS.md, "Kernel reads racing
/// eviction").
#[test]
fn kernel_io_while_another_thread_evicts_with_pauses() {
    kernel_io_race(100, Duration::ZERO);
}

/// Threads reading the small block, and its pages.
const IO_READERS: usize = 4;
const READ_PAGES: usize = 8;

fn kernel_io_race(pause_us: u64, pin_grace: Duration) {
    let _g = serial();
    let mut cfg = cfg();
    cfg.inject.race_pause_us = pause_us;
    cfg.pin_grace = pin_grace;
    with_deadline(
        "kernel_io_while_another_thread_evicts",
        Duration::from_secs(120),
        move || {
            let data: Vec<u8> = (0..3 * PAGE).map(|i| (i * 13 + 1) as u8).collect();
            let fd = temp_file(&data);
            for kind in [Kind::Owned, Kind::Anon, Kind::SoleShared] {
                io_while_evicting(kind, cfg.clone(), &data, fd);
            }
            // SAFETY: close takes a descriptor this test opened; nothing uses it any more.
            unsafe { libc::close(fd) };
        },
    );
}

/// Panics, naming the first differing byte and the run of zeros there, if `got` is not `want`.
fn same(got: &[u8], want: &[u8], ctx: &str) {
    let Some(first) = (0..got.len()).find(|&i| got[i] != want[i]) else {
        return;
    };
    let zeros = got[first..].iter().take_while(|&&x| x == 0).count();
    panic!(
        "{ctx}: byte {first} of {} differs: got {:02x?} want {:02x?} ({zeros} zero bytes from there)",
        got.len(),
        &got[first..(first + 8).min(got.len())],
        &want[first..(first + 8).min(got.len())]
    );
}

/// A thread evicting `p`'s `n` pages in a loop until `stop`; returns the pages evicted.
fn evict_loop(
    e: Engine,
    p: usize,
    n: usize,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut evicted = 0;
        while !stop.load(Ordering::Relaxed) {
            evicted += e.evict(p as *const u8, n * PAGE).evicted;
            std::thread::yield_now();
        }
        evicted
    })
}

/// Two blocks of `kind`, each evicted in a loop by a thread of its own: this
/// thread does system calls into and from a 32-page one, `IO_READERS`
/// threads read a `READ_PAGES`-page one.
fn io_while_evicting(kind: Kind, cfg: Config, data: &[u8], fd: i32) {
    const RUN: Duration = Duration::from_millis(700);
    let n = 32;
    let mut b = Blk::with(kind, n, cfg.clone());
    let rb = Blk::with(kind, READ_PAGES, cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let evictors = [
        evict_loop(b.e.clone(), b.ptr as usize, n, stop.clone()),
        evict_loop(rb.e.clone(), rb.ptr as usize, READ_PAGES, stop.clone()),
    ];
    let readers: Vec<_> = (0..IO_READERS)
        .map(|t| {
            let (p, stop) = (rb.ptr as usize, stop.clone());
            let want = rb.want.clone();
            std::thread::spawn(move || {
                let (r, w) = pipe();
                let mut out = vec![0u8; 2 * PAGE];
                let mut x = 99u64 + t as u64;
                let mut calls = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let len = 1 + (x >> 33) as usize % (2 * PAGE);
                    let off = (x >> 7) as usize % (want.len() - len);
                    let src = p + off;
                    let what = if calls.is_multiple_of(2) {
                        must(
                            "write(2) from pages being evicted",
                            // SAFETY: the buffer is live (the block outlives this thread) and
                            // at least the length passed; the descriptor is this thread's own.
                            unsafe { libc::write(w, src as *const libc::c_void, len) },
                            len,
                        );
                        must(
                            "pipe read",
                            // SAFETY: the buffer is live, writable and at least the length
                            // passed; the descriptor is this thread's own.
                            unsafe { libc::read(r, out.as_mut_ptr().cast(), len) },
                            len,
                        );
                        "write(2)"
                    } else {
                        let local = libc::iovec {
                            iov_base: out.as_mut_ptr().cast(),
                            iov_len: len,
                        };
                        let remote = libc::iovec {
                            iov_base: src as *mut libc::c_void,
                            iov_len: len,
                        };
                        must(
                            "process_vm_readv",
                            // SAFETY: the iovecs describe live buffers (the block outlives this
                            // thread), each as long as stated.
                            unsafe {
                                libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0)
                            },
                            len,
                        );
                        "process_vm_readv"
                    };
                    same(
                        &out[..len],
                        &want[off..off + len],
                        &format!(
                            "{kind:?} reader {t} #{calls}: {what} from evicted pages at byte {off}"
                        ),
                    );
                    calls += 1;
                }
                // SAFETY: close takes descriptors this thread opened; nothing uses them any more.
                unsafe {
                    libc::close(r);
                    libc::close(w);
                }
                calls
            })
        })
        .collect();
    let io = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        io_calls(kind, &mut b, data, fd, RUN)
    }));
    stop.store(true, Ordering::Relaxed);
    let [evicted, read_evicted] = evictors.map(|e| e.join().unwrap());
    let reads: Vec<_> = readers.into_iter().map(|r| r.join()).collect();
    if let Err(p) = io {
        std::panic::resume_unwind(p);
    }
    let mut read_calls = 0;
    for r in reads {
        match r {
            Ok(calls) => read_calls += calls,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    assert!(
        evicted > 0 && read_evicted > 0,
        "{kind:?}: an evictor evicted nothing"
    );
    eprintln!(
        "{kind:?}: {evicted} pages evicted, {} restored; read block: {read_evicted} evicted, {} restored, {read_calls} reads",
        b.e.stats().restored,
        rb.e.stats().restored
    );
    b.finish(&format!("{kind:?} ({evicted} evictions)"));
    rb.finish(&format!("{kind:?} read block ({read_evicted} evictions)"));
}

/// System calls into and from `b`, for `run`.
fn io_calls(kind: Kind, b: &mut Blk, data: &[u8], fd: i32, run: Duration) {
    let n = b.want.len();
    let (r, w) = pipe();
    let (s0, s1) = socketpair();
    let mut out = vec![0u8; 3 * PAGE];
    let mut x = 12345u64;
    let t0 = std::time::Instant::now();
    for i in 0usize.. {
        if t0.elapsed() > run {
            break;
        }
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 1 + (x >> 33) as usize % (2 * PAGE);
        let off = (x >> 7) as usize % (n - len);
        let src = &data[(x >> 20) as usize % PAGE..][..len];
        // SAFETY: the address lies inside a live block this test allocated, and no
        // reference to those bytes exists during the access.
        let dst = unsafe { b.ptr.add(off) };
        match i % 5 {
            0 => {
                must(
                    "pipe write",
                    // SAFETY: the buffer is live and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::write(w, src.as_ptr().cast(), len) },
                    len,
                );
                must(
                    "read(2) into pages being evicted",
                    // SAFETY: the buffer is live, writable and at least the length
                    // passed; the descriptor is this test's own.
                    unsafe { libc::read(r, dst.cast(), len) },
                    len,
                );
            }
            1 => {
                let at = src.as_ptr() as usize - data.as_ptr() as usize;
                must(
                    "pread(2) into pages being evicted",
                    // SAFETY: the buffer is live, writable and at least the length
                    // passed; the descriptor is this test's own.
                    unsafe { libc::pread(fd, dst.cast(), len, at as i64) },
                    len,
                );
            }
            2 => {
                must(
                    "send",
                    // SAFETY: the buffer is live and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::send(s0, src.as_ptr().cast(), len, 0) },
                    len,
                );
                must(
                    "recv(2) into pages being evicted",
                    // SAFETY: the buffer is live, writable and at least the length
                    // passed; the descriptor is this test's own.
                    unsafe { libc::recv(s1, dst.cast(), len, libc::MSG_WAITALL) },
                    len,
                );
            }
            3 => {
                must(
                    "write(2) from pages being evicted",
                    // SAFETY: the buffer is live and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::write(w, dst.cast(), len) },
                    len,
                );
                must(
                    "pipe read",
                    // SAFETY: the buffer is live, writable and at least the length
                    // passed; the descriptor is this test's own.
                    unsafe { libc::read(r, out.as_mut_ptr().cast(), len) },
                    len,
                );
                same(
                    &out[..len],
                    &b.want[off..off + len],
                    &format!("{kind:?} #{i}: write(2) from evicted pages at block byte {off}"),
                );
                continue;
            }
            _ => {
                let local = libc::iovec {
                    iov_base: out.as_mut_ptr().cast(),
                    iov_len: len,
                };
                let remote = libc::iovec {
                    iov_base: dst.cast(),
                    iov_len: len,
                };
                must(
                    "process_vm_readv",
                    // SAFETY: the iovecs describe live buffers of this test, each as
                    // long as stated.
                    unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) },
                    len,
                );
                same(
                    &out[..len],
                    &b.want[off..off + len],
                    &format!(
                        "{kind:?} #{i}: process_vm_readv from evicted pages at block byte {off}"
                    ),
                );
                continue;
            }
        }
        b.want[off..off + len].copy_from_slice(src);
        if i % 100 == 0 {
            b.check(&format!("{kind:?} after {i} system calls"));
        }
    }
    // SAFETY: close takes descriptors this test opened; nothing uses them any more.
    unsafe {
        for fd in [r, w, s0, s1] {
            libc::close(fd);
        }
    }
}

static HANDLER_PAGES: AtomicU64 = AtomicU64::new(0);
static HANDLER_NEXT: AtomicU64 = AtomicU64::new(0);
static HANDLER_BAD: AtomicU64 = AtomicU64::new(0);
const HANDLER_N: u64 = 256;

extern "C" fn touch_evicted_page(_: libc::c_int) {
    let k = HANDLER_NEXT.fetch_add(1, Ordering::Relaxed);
    if k >= HANDLER_N {
        return;
    }
    let base = HANDLER_PAGES.load(Ordering::Relaxed) as *const u8;
    // Byte 100 of page k holds pattern(k)[100].
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    let got = unsafe { base.add(k as usize * PAGE + 100).read_volatile() };
    let want = ((((100 / 16) ^ k as usize) as u8).wrapping_mul(3)) | 1;
    if got != want {
        HANDLER_BAD.fetch_add(1, Ordering::Relaxed);
    }
}

/// A signal handler touches evicted pages while its thread is inside the
/// engine, holding the engine's lock (a copy reading evicted pages plainly
/// under it). The fault thread must restore them without that lock: if it
/// needed it, this test would hang.
#[test]
fn signal_handler_touches_evicted_pages_while_its_thread_holds_the_engine_lock() {
    let _g = serial();
    with_deadline(
        "signal_handler_touches_evicted_pages",
        Duration::from_secs(60),
        || {
            let n = 4096;
            let b = Blk::evicted(Kind::Owned, n);
            let other = b.e.alloc(HANDLER_N as usize * PAGE, Hint::None);
            let content: Vec<u8> = (0..HANDLER_N as usize).flat_map(pattern).collect();
            // SAFETY: source and destination are distinct live buffers of this test, each at least
            // the length copied.
            unsafe { std::ptr::copy_nonoverlapping(content.as_ptr(), other, content.len()) };
            assert_eq!(
                b.e.evict_with(other, content.len(), STORE_ONLY).evicted,
                HANDLER_N
            );
            HANDLER_PAGES.store(other as u64, Ordering::Relaxed);
            HANDLER_NEXT.store(0, Ordering::Relaxed);
            // SAFETY: signal setup and delivery on this test's own threads; the handler only does
            // async-signal-safe work.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = touch_evicted_page as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut());
            }
            let dst = b.e.alloc(n * PAGE, Hint::None);
            // SAFETY: signal setup and delivery on this test's own threads; the handler only does
            // async-signal-safe work.
            let me = unsafe { libc::pthread_self() };
            let stop = Arc::new(AtomicBool::new(false));
            let kicker = {
                let stop = stop.clone();
                let me = me as usize;
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: signal setup and delivery on this test's own threads; the handler
                        // only does async-signal-safe work.
                        unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR2) };
                        std::thread::sleep(Duration::from_micros(200));
                    }
                })
            };
            // Copies from the evicted block until the handler has touched every page.
            let mut rounds = 0;
            while HANDLER_NEXT.load(Ordering::Relaxed) < HANDLER_N && rounds < 50 {
                // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
                // length copied.
                unsafe { b.e.copy(dst, b.ptr, n * PAGE) };
                assert!(
                    bytes(dst, n * PAGE) == &b.want[..],
                    "copy of an evicted block"
                );
                b.e.evict(b.ptr, n * PAGE);
                rounds += 1;
            }
            stop.store(true, Ordering::Relaxed);
            kicker.join().unwrap();
            // SAFETY: signal setup and delivery on this test's own threads; the handler only does
            // async-signal-safe work.
            unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
            eprintln!(
                "{rounds} copies of the evicted block; the handler touched {} evicted pages",
                HANDLER_NEXT.load(Ordering::Relaxed).min(HANDLER_N)
            );
            assert!(
                HANDLER_NEXT.load(Ordering::Relaxed) >= HANDLER_N,
                "the handler ran too rarely"
            );
            assert_eq!(
                HANDLER_BAD.load(Ordering::Relaxed),
                0,
                "a signal handler read wrong bytes from an evicted page"
            );
            for p in [dst, other] {
                // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
                // uses it after this free.
                assert!(unsafe { b.e.free(p) });
            }
            b.finish("signal handler");
        },
    );
}
