//! What the program does to its blocks beyond reading and writing them:
//! discard (madvise MADV_DONTNEED through the preload), exempt (before mprotect
//! or fork/dump advice) and shrink (realloc). Each test checks bytes against
//! what private anonymous memory would hold, and memory by the engine's counters
//! while the blocks live (freed blocks may be kept mapped for reuse).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pagefold_engine::{Config, Engine, Hint, PAGE};

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// Page `i` of a block filled with a pattern unique to (seed, i).
fn fill(p: *mut u8, pages: usize, seed: u8) {
    for i in 0..pages * PAGE {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe {
            *p.add(i) = (i as u8).wrapping_mul(29) ^ seed ^ ((i / PAGE) as u8).wrapping_mul(7) | 1
        };
    }
}

fn zero(p: *const u8, len: usize) -> bool {
    bytes(p, len).iter().all(|&b| b == 0)
}

/// Discards like the preload: the engine's part, then the kernel for the rest.
fn discard(e: &Engine, p: *mut u8, len: usize) -> Vec<(usize, usize)> {
    let rest = e.discard(p, len);
    for &(s, l) in &rest {
        assert_eq!(
            // SAFETY: the range is a live block of this test; the call changes or reads only that
            // range (a mincore vector has one byte per page).
            unsafe { libc::madvise(s as *mut libc::c_void, l, libc::MADV_DONTNEED) },
            0
        );
    }
    rest
}

#[test]
fn discard_owned_pages_reads_zero_and_frees_frames() {
    let e = Engine::new(Config::default());
    let a = e.alloc(16 * PAGE, Hint::None);
    fill(a, 16, 1);
    let keep = bytes(a, 16 * PAGE).to_vec();
    assert_eq!(e.stats().frames_resident, 16);
    // Pages 4..8, given as a length that is not a page multiple (rounded up).
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    let rest = discard(&e, unsafe { a.add(4 * PAGE) }, 3 * PAGE + 1);
    assert!(rest.is_empty(), "owned pages are the engine's: {rest:?}");
    // Memory first: reading a punched frame allocates it again (shmem has no zero page).
    let s = e.stats();
    assert_eq!((s.discarded, s.frames_resident), (4, 12), "{s:?}");
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(zero(unsafe { a.add(4 * PAGE) }, 4 * PAGE));
    assert_eq!(bytes(a, 4 * PAGE), &keep[..4 * PAGE]);
    assert_eq!(
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        bytes(unsafe { a.add(8 * PAGE) }, 8 * PAGE),
        &keep[8 * PAGE..]
    );
    // Still the engine's: writable, and copies of it are still virtual.
    fill(a, 16, 2);
    let b = e.alloc(16 * PAGE, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, 16 * PAGE) };
    assert_eq!(e.stats().pages_shared_by_copy, 16);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
    assert_eq!(e.stats().blocks, 0);
}

#[test]
fn discard_after_virtual_copy_and_divergence() {
    let e = Engine::new(Config::default());
    let n = 32;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    fill(a, n, 3);
    let keep = bytes(a, n * PAGE).to_vec();
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, n * PAGE) };
    assert_eq!(e.stats().pages_shared_by_copy, n as u64);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *b.add(5 * PAGE) = 0xEE }; // page 5 of b diverges
                                        // Memory is checked before the discarded pages are read: they map fresh
                                        // frames, and reading a fresh memfd page allocates it (shmem has no zero page).
    discard(&e, b, n * PAGE);
    assert_eq!(bytes(a, n * PAGE), &keep[..]);
    assert_eq!(
        e.stats().frames_resident,
        n as u64,
        "the source still needs every frame"
    );
    // The source too: now nothing needs the old frames.
    discard(&e, a, n * PAGE);
    let s = e.stats();
    assert_eq!(
        (s.frames_resident, s.frames_in_use, s.discarded),
        (0, 2 * n as u64, 2 * n as u64),
        "{s:?}"
    );
    // Zero, the diverged page too (it must not revert to its old frame).
    assert!(zero(b, n * PAGE) && zero(a, n * PAGE));
    e.scan();
    e.scan();
    assert_eq!(
        e.stats().frames_resident,
        0,
        "the scan folds the zero pages those reads allocated"
    );
    // Both stay usable blocks.
    fill(b, n, 4);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(a, b, n * PAGE) };
    assert_eq!(bytes(a, n * PAGE), bytes(b, n * PAGE));
    assert_eq!(e.stats().pages_shared_by_copy, 2 * n as u64);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
    assert_eq!(e.stats().blocks, 0);
}

#[test]
fn discard_after_merge() {
    let e = Engine::new(Config {
        pin_grace: std::time::Duration::ZERO,
        ..Config::default()
    });
    let n = 8;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    fill(a, n, 5);
    fill(b, n, 5);
    let keep = bytes(a, n * PAGE).to_vec();
    e.scan();
    e.scan(); // the volatility check wants two sightings
    assert_eq!(e.stats().merged, n as u64);
    assert_eq!(e.stats().frames_resident, n as u64);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    discard(&e, unsafe { a.add(2 * PAGE) }, 2 * PAGE);
    assert_eq!(
        bytes(b, n * PAGE),
        &keep[..],
        "the merge partner keeps its content"
    );
    discard(&e, b, n * PAGE);
    assert_eq!(
        e.stats().frames_resident,
        (n - 2) as u64,
        "frames only a's remaining pages need"
    );
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(zero(b, n * PAGE) && zero(unsafe { a.add(2 * PAGE) }, 2 * PAGE));
    assert_eq!(bytes(a, 2 * PAGE), &keep[..2 * PAGE]);
    assert_eq!(
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        bytes(unsafe { a.add(4 * PAGE) }, 4 * PAGE),
        &keep[4 * PAGE..]
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
    assert_eq!(e.stats().blocks, 0);
}

#[test]
fn discard_hands_back_only_ranges_outside_blocks() {
    // Plain anonymous memory around a block: [anon | block | anon].
    let e = Engine::new(Config::default());
    let a = e.alloc(4 * PAGE, Hint::None);
    fill(a, 4, 6);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    let rest = e.discard(unsafe { a.sub(2 * PAGE) }, 8 * PAGE);
    let (lo, hi) = (a as usize - 2 * PAGE, a as usize + 4 * PAGE);
    assert_eq!(rest, vec![(lo, 2 * PAGE), (hi, 2 * PAGE)]);
    assert!(zero(a, 4 * PAGE));
    // Misaligned or empty: nothing done, all handed back for the kernel's verdict.
    assert_eq!(
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        e.discard(unsafe { a.add(1) }, PAGE),
        vec![(a as usize + 1, PAGE)]
    );
    assert_eq!(e.discard(a, 0), vec![(a as usize, 0)]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // Without frames every block is plain memory: the engine has the kernel
    // discard it under its lock (a scan must not merge a page in between).
    let e = Engine::new(Config {
        frames: false,
        ..Config::default()
    });
    let a = e.alloc(4 * PAGE, Hint::None);
    fill(a, 4, 7);
    assert_eq!(discard(&e, a, 4 * PAGE), vec![]);
    assert!(zero(a, 4 * PAGE));
    assert_eq!(e.stats().discarded, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
}

#[test]
fn discard_beyond_vma_budget_zeroes_in_place() {
    // Room for whole-block remaps (a mapping replaced, counted as one more
    // until done), none for splitting a block.
    let e = Engine::new(Config {
        vma_budget: Some(4),
        ..Config::default()
    });
    let a = e.alloc(8 * PAGE, Hint::None);
    let b = e.alloc(8 * PAGE, Hint::None);
    fill(a, 8, 8);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, 8 * PAGE) }; // whole-block remaps fit: 2 mappings
    assert_eq!(e.stats().pages_shared_by_copy, 8);
    let before = e.stats().fallbacks.vma_budget;
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    discard(&e, unsafe { b.add(3 * PAGE) }, PAGE); // a middle page: +2 mappings, refused
    assert!(e.stats().fallbacks.vma_budget > before);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(zero(unsafe { b.add(3 * PAGE) }, PAGE));
    assert_eq!(bytes(b, 3 * PAGE), bytes(a, 3 * PAGE));
    assert_eq!(
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        bytes(unsafe { b.add(4 * PAGE) }, 4 * PAGE),
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        bytes(unsafe { a.add(4 * PAGE) }, 4 * PAGE)
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
    assert_eq!(e.stats().blocks, 0);
}

#[test]
fn exempt_block_is_plain_memory_the_engine_leaves_alone() {
    let e = Engine::new(Config {
        pin_grace: std::time::Duration::ZERO,
        ..Config::default()
    });
    let n = 16;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    let c = e.alloc(n * PAGE, Hint::None);
    fill(a, n, 9);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, n * PAGE) };
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *b.add(PAGE) = 3 };
    let want = bytes(b, n * PAGE).to_vec();
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(e.exempt(unsafe { b.add(5) }, 1));
    let outside = [0u8; 16];
    assert!(!e.exempt(outside.as_ptr(), 16), "not engine memory");
    assert_eq!(bytes(b, n * PAGE), &want[..]);
    let s = e.stats();
    assert_eq!(s.exempted, 1);
    assert_eq!(
        s.frames_resident, n as u64,
        "b no longer holds a frame reference beyond a's"
    );
    // The program protects it; scans must not read it, copies must not remap it.
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mprotect(b.cast(), n * PAGE, libc::PROT_NONE) },
        0
    );
    fill(c, n, 9);
    e.scan();
    e.scan();
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mprotect(b.cast(), n * PAGE, libc::PROT_READ) },
        0
    );
    let shared = e.stats().pages_shared_by_copy;
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(c, b, n * PAGE) };
    assert_eq!(
        e.stats().pages_shared_by_copy,
        shared,
        "a copy from an exempt block is plain"
    );
    assert_eq!(bytes(c, n * PAGE), &want[..]);
    // Discarding it is MADV_DONTNEED on plain memory, made by the engine.
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mprotect(b.cast(), n * PAGE, libc::PROT_READ | libc::PROT_WRITE) },
        0
    );
    assert_eq!(e.discard(b, n * PAGE), vec![]);
    assert!(zero(b, n * PAGE));
    for p in [a, b, c] {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        unsafe { e.free(p) };
    }
    assert_eq!(e.stats().blocks, 0);
}

/// A writer stores into every page while the block is exempted: the move
/// onto anonymous memory must not lose a store (writers sleep under write
/// protection meanwhile). Each store goes to its own slot, so a lost one stays lost.
#[test]
fn exempt_loses_no_concurrent_write() {
    const SLOTS: u64 = (PAGE / 8) as u64;
    let e = Engine::new(Config::default());
    let mut overlapped = 0;
    for round in 0..20u64 {
        let n = 64;
        let src = e.alloc(n * PAGE, Hint::None);
        let a = e.alloc(n * PAGE, Hint::None);
        fill(src, n, round as u8);
        // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
        // copied.
        unsafe { e.copy(a, src, n * PAGE) }; // shared pages: the hardest case
        let progress = Arc::new(AtomicU64::new(0));
        let addr = a as usize;
        let writer = {
            let progress = progress.clone();
            std::thread::spawn(move || {
                for v in 1..SLOTS {
                    for p in 0..n {
                        // SAFETY: the address lies inside a live block this test allocated, and no
                        // reference to those bytes exists during the access.
                        unsafe {
                            std::ptr::write_volatile(
                                (addr + p * PAGE + 8 * v as usize) as *mut u64,
                                v,
                            )
                        };
                    }
                    progress.store(v, Ordering::SeqCst);
                    // Paced (about 15 ms for all slots) so that it is still
                    // writing while the move runs, even on a loaded machine.
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(30) {}
                }
            })
        };
        // Wait until the writer is under way (a fixed sleep is not enough on a
        // loaded machine), at a point that differs from round to round.
        let start_at = 1 + round * 8;
        while progress.load(Ordering::SeqCst) < start_at {
            std::hint::spin_loop();
        }
        let before = progress.load(Ordering::SeqCst);
        assert!(e.exempt(a, n * PAGE));
        let after = progress.load(Ordering::SeqCst);
        overlapped += (before > 0 && after < SLOTS - 1) as u32;
        writer.join().unwrap();
        for p in 0..n {
            for v in 1..SLOTS {
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                let got = unsafe { *((addr + p * PAGE + 8 * v as usize) as *const u64) };
                assert_eq!(
                    got, v,
                    "round {round}: page {p} lost the store of {v} (exempted at {before}..{after})"
                );
            }
        }
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        unsafe { e.free(a) };
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        unsafe { e.free(src) };
    }
    assert_eq!(e.stats().exempted, 20);
    assert!(
        overlapped >= 3,
        "the writer was running during only {overlapped} of 20 moves"
    );
}

#[test]
fn shrink_releases_the_tail() {
    let e = Engine::new(Config::default());
    let n = 40;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    fill(a, n, 11);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, n * PAGE) };
    let want = bytes(a, 10 * PAGE + 100).to_vec();
    assert!(e.shrink(a, 10 * PAGE + 100));
    assert_eq!(e.block_len(a), Some(11 * PAGE));
    assert_eq!(bytes(a, 10 * PAGE + 100), &want[..]);
    assert_eq!(
        e.stats().frames_resident,
        n as u64,
        "b still maps every frame"
    );
    assert!(e.shrink(b, 1));
    assert_eq!(e.block_len(b), Some(PAGE));
    let s = e.stats();
    assert_eq!(s.frames_resident, 11, "{s:?}");
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(!e.shrink(unsafe { a.add(PAGE) }, 1), "not a block");
    assert!(
        e.shrink(a, 100 * PAGE),
        "growing is not shrinking: nothing to do"
    );
    assert_eq!(e.block_len(a), Some(11 * PAGE));
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
    assert_eq!(e.stats().blocks, 0);
}

/// Without userfaultfd a block cannot be moved safely (a concurrent write
/// could be lost): it stays exempt on its frames, frozen, and still never
/// scanned or shared.
#[test]
fn exempt_without_write_protection_stays_on_frozen_frames() {
    let cfg = Config {
        inject: pagefold_engine::Inject {
            fail_uffd: true,
            ..Default::default()
        },
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let n = 8;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    fill(a, n, 12);
    let want = bytes(a, n * PAGE).to_vec();
    assert!(e.exempt(a, n * PAGE));
    let s = e.stats();
    assert_eq!((s.exempted, s.fallbacks.uffd), (1, 1), "{s:?}");
    assert_eq!(bytes(a, n * PAGE), &want[..]);
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mprotect(a.cast(), n * PAGE, libc::PROT_NONE) },
        0
    );
    e.scan();
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mprotect(a.cast(), n * PAGE, libc::PROT_READ) },
        0
    );
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, n * PAGE) };
    assert_eq!(
        e.stats().pages_shared_by_copy,
        0,
        "no sharing with an exempt block"
    );
    assert_eq!(bytes(b, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b) };
}
