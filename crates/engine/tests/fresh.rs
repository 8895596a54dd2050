//! Where fresh blocks start (anonymous memory or frames), copies out of
//! anonymous memory (the source adopted onto frames, or without the pin
//! guard written through into frames), and what the adaptive
//! placement learns from copies: byte for byte and by the engine's counters.
//!
//! `fail_mmap_after` is process-global, so every test here takes one lock
//! and the test that sets it resets it before letting go.

use std::sync::{Mutex, MutexGuard};

use pagefold_engine::{Config, Engine, Fresh, HeapFirst, Hint, Inject, Stats, PAGE};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn engine(fresh: Fresh) -> Engine {
    Engine::new(Config {
        fresh,
        copy_through: true,
        ..Config::default()
    })
}

/// A block of `len` bytes from `e`, filled with a pattern from `seed`.
fn filled(e: &Engine, len: usize, seed: u8) -> *mut u8 {
    let p = e.alloc(len, Hint::None);
    assert!(!p.is_null());
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i / PAGE) as u8))
        .collect();
    // SAFETY: p is a live block of at least len bytes returned just above.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, len) };
    p
}

fn bytes(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: every caller passes a live engine block of at least len bytes.
    unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
}

fn copy(e: &Engine, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: both are live, distinct engine blocks of at least len bytes.
    unsafe { e.copy(dst, src, len) }
}

fn free(e: &Engine, p: *mut u8) {
    // SAFETY: p is a block of e that the test no longer uses.
    assert!(unsafe { e.free(p) });
}

fn write(p: *mut u8, off: usize, v: u8) {
    // SAFETY: callers stay inside a live block.
    unsafe { *p.add(off) = v };
}

/// Writes one byte into each of three copies of `want` (`n` bytes) and
/// checks that each write stays in its own copy.
fn writes_stay_apart(copies: [(*mut u8, usize, u8); 3], want: &[u8], n: usize) {
    for (p, off, v) in copies {
        write(p, off, v);
    }
    for (p, off, v) in copies {
        let mut w = want.to_vec();
        w[off] = v;
        assert_eq!(bytes(p, n), w);
    }
}

/// Every block anonymous, copies through, and no pin guard (no UFFDIO_MOVE,
/// as before Linux 6.8): sources are never adopted.
fn engine_without_pin_guard() -> Engine {
    Engine::new(Config {
        fresh: Fresh::Anon,
        copy_through: true,
        pin_guard: false,
        ..Config::default()
    })
}

fn no_frames_left(s: Stats) {
    assert_eq!((s.blocks, s.frames_in_use), (0, 0), "{s:?}");
}

#[test]
fn anonymous_blocks_use_no_frames() {
    let _g = serial();
    let e = engine(Fresh::Anon);
    let n = 32 * PAGE;
    let a = filled(&e, n, 1);
    let s = e.stats();
    assert_eq!(s.frames_in_use, 0, "{s:?}");
    assert!(bytes(a, n).iter().any(|&b| b != 0));
    free(&e, a);
    no_frames_left(e.stats());
}

#[test]
fn a_copy_of_anonymous_memory_adopts_its_source_and_later_copies_are_virtual() {
    let _g = serial();
    let e = engine(Fresh::Anon);
    let n = 64 * PAGE;
    let a = filled(&e, n, 7);
    let want = bytes(a, n);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), want);
    assert_eq!(bytes(a, n), want);
    let s = e.stats();
    assert_eq!(
        s.fallbacks.pin_guard, 0,
        "this kernel has UFFDIO_MOVE: {s:?}"
    );
    assert_eq!((s.pages_adopted, s.pages_copied_through), (64, 0), "{s:?}");
    assert_eq!(s.frames_in_use, 64, "source and copy share: {s:?}");
    assert_eq!(s.pages_saved_by_sharing, 64, "{s:?}");
    // The same source copied again: only mappings.
    let c = e.alloc(n, Hint::None);
    copy(&e, c, a, n);
    assert_eq!(bytes(c, n), want);
    let s = e.stats();
    assert_eq!((s.pages_adopted, s.frames_in_use), (64, 64), "{s:?}");
    assert_eq!(s.pages_shared_by_copy, 128, "{s:?}");
    // Writes stay on their side.
    writes_stay_apart(
        [
            (a, 2 * PAGE + 5, 0xA5),
            (b, 9 * PAGE, 0xB5),
            (c, 63 * PAGE + 4095, 0xC5),
        ],
        &want,
        n,
    );
    for p in [a, b, c] {
        free(&e, p);
    }
    no_frames_left(e.stats());
}

#[test]
fn untouched_source_pages_are_not_adopted_and_copy_as_zeros() {
    let _g = serial();
    let e = engine(Fresh::Anon);
    let n = 32 * PAGE;
    let a = e.alloc(n, Hint::None);
    // Only the even pages are ever written; the odd ones read zero.
    for k in (0..32).step_by(2) {
        write(a, k * PAGE + 17, k as u8 + 1);
    }
    let want = bytes(a, n);
    let b = filled(&e, n, 9);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), want);
    assert_eq!(bytes(a, n), want);
    let s = e.stats();
    assert_eq!(s.pages_adopted, 16, "{s:?}");
    assert_eq!(
        s.frames_in_use, 16,
        "no frame for a page never written: {s:?}"
    );
    free(&e, a);
    free(&e, b);
    no_frames_left(e.stats());
}

#[test]
fn without_the_pin_guard_a_copy_of_anonymous_memory_is_written_through() {
    let _g = serial();
    // No UFFDIO_MOVE (as before Linux 6.8): the source cannot be taken off
    // safely, so it stays anonymous and the copy writes through.
    let e = engine_without_pin_guard();
    let n = 64 * PAGE;
    let a = filled(&e, n, 3);
    let want = bytes(a, n);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), want);
    let s = e.stats();
    assert_eq!((s.pages_copied_through, s.pages_adopted), (64, 0), "{s:?}");
    assert_eq!(s.frames_in_use, 64, "the copy lives in frames: {s:?}");
    // Copy of the copy: virtual, no new frame.
    let c = e.alloc(n, Hint::None);
    copy(&e, c, b, n);
    assert_eq!(bytes(c, n), want);
    let s = e.stats();
    assert_eq!(s.pages_shared_by_copy, 64, "{s:?}");
    assert_eq!(s.frames_in_use, 64, "{s:?}");
    // Writes stay on their side.
    writes_stay_apart(
        [
            (a, 3 * PAGE + 1, 0xA1),
            (b, 5 * PAGE + 2, 0xB2),
            (c, 7 * PAGE + 3, 0xC3),
        ],
        &want,
        n,
    );
    for p in [a, b, c] {
        free(&e, p);
    }
    no_frames_left(e.stats());
}

#[test]
fn the_scan_folds_the_source_of_a_written_through_copy_onto_its_frames() {
    let _g = serial();
    let e = engine_without_pin_guard();
    let n = 128 * PAGE;
    let a = filled(&e, n, 5);
    let want = bytes(a, n);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    // The first scans only look (volatility check); a later one merges.
    for _ in 0..4 {
        e.scan();
    }
    let s = e.stats();
    assert!(s.merged >= 128, "the source was not folded: {s:?}");
    assert_eq!(s.frames_in_use, 128, "source and copy share: {s:?}");
    assert_eq!(bytes(a, n), want);
    assert_eq!(bytes(b, n), want);
    write(a, 9, 0x55);
    assert_eq!(
        bytes(b, n),
        want,
        "a write to the folded source reached the copy"
    );
    free(&e, a);
    free(&e, b);
    no_frames_left(e.stats());
}

#[test]
fn adaptive_placement_puts_blocks_of_a_copied_size_on_frames() {
    let _g = serial();
    let e = engine(Fresh::Adaptive);
    let n = 48 * PAGE;
    // Unknown size: anonymous; its copy adopts it onto frames.
    let a = filled(&e, n, 7);
    assert_eq!(e.stats().frames_in_use, 0);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    assert_eq!(e.stats().pages_adopted, 48);
    // Blocks of that size were copied: the next one starts on frames, and
    // its copy is virtual at once (frozen in place, nothing written through).
    let c = filled(&e, n, 9);
    let want = bytes(c, n);
    let s = e.stats();
    assert_eq!(s.frames_in_use, 48 + 48, "{s:?}");
    let d = e.alloc(n, Hint::None);
    copy(&e, d, c, n);
    let s = e.stats();
    assert_eq!((s.pages_adopted, s.pages_copied_through), (48, 0), "{s:?}");
    assert_eq!(s.pages_shared_by_copy, 96, "{s:?}");
    assert_eq!(bytes(d, n), want);
    // Another size is unaffected.
    let other = filled(&e, n + PAGE, 1);
    assert_eq!(e.stats().frames_in_use, s.frames_in_use);
    for p in [a, b, c, d, other] {
        free(&e, p);
    }
    no_frames_left(e.stats());
}

/// Reads every byte of `n` at `p`; true if all are zero.
fn reads_zero(p: *const u8, n: usize) -> bool {
    bytes(p, n).iter().all(|&b| b == 0)
}

#[test]
fn zeroed_blocks_start_anonymous_until_their_size_is_copied_from() {
    let _g = serial();
    let e = Engine::new(Config::default());
    let n = 40 * PAGE;
    // Asked zeroed, never written: read in full, it takes no frame (the
    // kernel's zero page answers), where a block on frames allocates one
    // page per page read.
    let a = e.alloc(n, Hint::Zeroed);
    assert!(reads_zero(a, n));
    let s = e.stats();
    assert_eq!((s.frames_in_use, s.frames_resident), (0, 0), "{s:?}");
    let on_frames = e.alloc(n + PAGE, Hint::None);
    assert!(reads_zero(on_frames, n + PAGE));
    assert_eq!(e.stats().frames_resident, 41, "a frame per page read");
    // Its size is copied from: the next zeroed block of that size starts on
    // frames, so its own copies can be virtual.
    write(a, 5 * PAGE, 3);
    let b = e.alloc(n, Hint::Uninit);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), bytes(a, n));
    let c = e.alloc(n, Hint::Zeroed);
    assert!(reads_zero(c, n));
    assert_eq!(e.stats().frames_in_use, 41 + 40 + 40);
    for p in [a, b, c, on_frames] {
        free(&e, p);
    }
    no_frames_left(e.stats());
}

#[test]
fn zeroed_blocks_on_frames_when_configured() {
    let _g = serial();
    let e = Engine::new(Config {
        fresh_zeroed: Fresh::Frames,
        ..Config::default()
    });
    let n = 8 * PAGE;
    let a = e.alloc(n, Hint::Zeroed);
    assert!(reads_zero(a, n));
    assert_eq!(e.stats().frames_in_use, 8);
    free(&e, a);
    no_frames_left(e.stats());
}

#[test]
fn copies_fall_back_to_plain_without_frames() {
    let _g = serial();
    // memfd refused: no pool, so nothing can be written through.
    let e = Engine::new(Config {
        fresh: Fresh::Anon,
        copy_through: true,
        inject: Inject {
            fail_memfd: true,
            ..Inject::default()
        },
        ..Config::default()
    });
    let n = 16 * PAGE;
    let a = filled(&e, n, 2);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), bytes(a, n));
    let s = e.stats();
    assert_eq!(s.pages_copied_through, 0, "{s:?}");
    assert!(s.bytes_copied_plain >= n as u64, "{s:?}");
    free(&e, a);
    free(&e, b);
}

#[test]
fn copies_fall_back_to_plain_when_mapping_fails() {
    let _g = serial();
    // Two mmaps succeed (both blocks); the copy's remap is refused, so its
    // frames are given back and the pages copied plainly.
    let e = Engine::new(Config {
        fresh: Fresh::Anon,
        copy_through: true,
        inject: Inject {
            fail_mmap_after: Some(2),
            ..Inject::default()
        },
        ..Config::default()
    });
    let n = 16 * PAGE;
    let a = filled(&e, n, 4);
    let b = e.alloc(n, Hint::None);
    assert!(!b.is_null());
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), bytes(a, n));
    let s = e.stats();
    assert_eq!(s.pages_copied_through, 0, "{s:?}");
    assert!(s.fallbacks.mmap > 0, "{s:?}");
    assert_eq!(
        s.frames_in_use, 0,
        "frames of the failed copy leaked: {s:?}"
    );
    free(&e, a);
    free(&e, b);
    // A fresh engine lifts the injected failure for the next test.
    drop(Engine::new(Config::default()));
}

#[test]
fn copy_through_can_be_switched_off() {
    let _g = serial();
    let e = Engine::new(Config {
        fresh: Fresh::Anon,
        copy_through: false,
        ..Config::default()
    });
    let n = 16 * PAGE;
    let a = filled(&e, n, 6);
    let b = e.alloc(n, Hint::None);
    copy(&e, b, a, n);
    assert_eq!(bytes(b, n), bytes(a, n));
    let s = e.stats();
    assert_eq!((s.pages_copied_through, s.frames_in_use), (0, 0), "{s:?}");
    free(&e, a);
    free(&e, b);
}

/// Anonymous blocks get the transparent huge pages a program asks for, as
/// plain memory does (frames, on shmem, get none where shmem THP is off).
#[test]
fn anonymous_blocks_get_huge_pages_when_asked() {
    let _g = serial();
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.is_empty() || thp.contains("[never]") {
        eprintln!("skipped: transparent huge pages are off on this machine ({thp:?})");
        return;
    }
    let e = engine(Fresh::Anon);
    let len = 8 << 20;
    let p = e.alloc(len, Hint::None);
    // SAFETY: p is a live block of len bytes; advice changes no content.
    let r = unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
    assert_eq!(r, 0);
    // SAFETY: p is a live block of len bytes.
    unsafe { std::ptr::write_bytes(p, 1, len) };
    let huge = anon_huge_kb(p as usize, len);
    assert!(
        huge >= 2048,
        "no huge page in an 8 MiB anonymous block: {huge} kB"
    );
    free(&e, p);
}

/// AnonHugePages (kB) of the mappings overlapping `[start, start+len)`.
fn anon_huge_kb(start: usize, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = lo < start + len && start < hi;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                kb += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
    }
    kb
}

/// The engine's defaults with copy learning on (the preload's setting).
fn copy_learning_engine() -> Engine {
    Engine::new(Config {
        copy_learn: true,
        ..Config::default()
    })
}

#[test]
fn copies_the_program_writes_in_full_are_made_plainly_after_a_few() {
    let _g = serial();
    let e = copy_learning_engine();
    let n = 32 * PAGE;
    let a = filled(&e, n, 8);
    let want = bytes(a, n);
    // Copies into 32-page blocks, each written in full and freed: after
    // 64 shared pages the class is judged, later copies are plain.
    for round in 0..12u8 {
        let b = e.alloc(n, Hint::None);
        copy(&e, b, a, n);
        assert_eq!(bytes(b, n), want, "round {round}");
        // SAFETY: b is a live block of n bytes.
        unsafe { std::ptr::write_bytes(b, round, n) };
        assert!(bytes(b, n).iter().all(|&x| x == round));
        free(&e, b);
    }
    let s = e.stats();
    assert!(s.copies_made_plain >= 8, "{s:?}");
    assert_eq!(bytes(a, n), want);
    // Copies into another size follow what copies into every class did (they
    // were written over): plain, but for a probe in every few; once a probe's
    // pages stay unwritten, the class has evidence of its own and its copies
    // are virtual again.
    let m = 80 * PAGE;
    let c = filled(&e, m, 9);
    let before = e.stats().copies_made_plain;
    let mut plain_copies = Vec::new();
    for _ in 0..12 {
        let d = e.alloc(m, Hint::None);
        let was = e.stats().copies_made_plain;
        copy(&e, d, c, m);
        plain_copies.push(e.stats().copies_made_plain > was);
        assert_eq!(bytes(d, m), bytes(c, m));
        free(&e, d);
    }
    assert!(plain_copies[0], "the prior: {plain_copies:?}");
    assert!(
        plain_copies[6..].iter().all(|p| !p),
        "judged on its own: {plain_copies:?}"
    );
    assert!(e.stats().copies_made_plain - before < 6);
    free(&e, a);
    free(&e, c);
    no_frames_left(e.stats());
}

/// A size whose copies are made plainly still gets a probe now and then;
/// a probe of a large copy shares only its first pages, and the rest is
/// copied plainly: every byte arrives either way.
#[test]
fn probes_of_large_copies_share_only_their_first_pages() {
    let _g = serial();
    let e = copy_learning_engine();
    let n = 1200 * PAGE + 100;
    let a = filled(&e, n, 11);
    let want = bytes(a, n);
    let mut shared_per_copy = Vec::new();
    for round in 0..40u8 {
        let b = e.alloc(n, Hint::None);
        let before = e.stats().pages_shared_by_copy;
        // Unaligned start and end: the head and tail bytes are plain too.
        copy(&e, b.wrapping_add(100), a.wrapping_add(100), n - 200);
        shared_per_copy.push(e.stats().pages_shared_by_copy - before);
        assert_eq!(
            bytes(b, n)[100..n - 100],
            want[100..n - 100],
            "round {round}"
        );
        // SAFETY: b is a live block of n bytes.
        unsafe { std::ptr::write_bytes(b, round, n) };
        free(&e, b);
    }
    let s = e.stats();
    assert!(s.copies_made_plain >= 30, "{s:?}");
    assert!(s.copies_probed >= 2, "{s:?}");
    let probes: Vec<u64> = shared_per_copy[2..]
        .iter()
        .copied()
        .filter(|&p| p > 0)
        .collect();
    assert!(
        !probes.is_empty() && probes.iter().all(|&p| p <= 512),
        "{shared_per_copy:?}"
    );
    assert_eq!(bytes(a, n), want);
    free(&e, a);
    no_frames_left(e.stats());
}

#[test]
fn copy_learning_can_be_switched_off() {
    let _g = serial();
    let e = Engine::new(Config {
        copy_learn: false,
        ..Config::default()
    });
    let n = 32 * PAGE;
    let a = filled(&e, n, 8);
    for round in 0..12u8 {
        let b = e.alloc(n, Hint::None);
        copy(&e, b, a, n);
        // SAFETY: b is a live block of n bytes.
        unsafe { std::ptr::write_bytes(b, round, n) };
        free(&e, b);
    }
    let s = e.stats();
    assert_eq!(
        (s.copies_made_plain, s.pages_shared_by_copy),
        (0, 12 * 32),
        "{s:?}"
    );
    free(&e, a);
}

fn engine_config_leaving_plain_below(plain_below: usize) -> Config {
    Config {
        fresh: Fresh::Adaptive,
        copy_through: true,
        copy_learn: true,
        plain_below,
        ..Config::default()
    }
}

fn engine_leaving_plain_below(plain_below: usize) -> Engine {
    Engine::new(engine_config_leaving_plain_below(plain_below))
}

/// A size class below `plain_below` is taken for its first allocations (the
/// first block of a size may be the source of many copies), then left to
/// the caller's allocator while its blocks are not copied from; sizes at or
/// above `plain_below` are always taken, and `plain_below` 0 takes all.
#[test]
fn allocations_no_copy_pays_for_are_left_to_the_caller() {
    let _s = serial();
    let len = 64 * PAGE;
    let e = engine_leaving_plain_below(1 << 20);
    for k in 0..4 {
        let p = e
            .take(len, Hint::Uninit)
            .expect("an unknown class is taken");
        assert!(e.owns(p), "allocation {k}");
        free(&e, p);
    }
    assert_eq!(e.take(len, Hint::Uninit), None, "known, never copied from");
    assert_eq!(
        e.take(len, Hint::Zeroed),
        None,
        "zeroed follows the same class"
    );
    assert_eq!(e.stats().allocs_declined, 2);
    let big = e
        .take(1 << 20, Hint::Uninit)
        .expect("at plain_below: taken");
    free(&e, big);

    let all = engine_leaving_plain_below(0);
    for _ in 0..8 {
        let p = all
            .take(len, Hint::Uninit)
            .expect("plain_below 0 takes all");
        free(&all, p);
    }
    assert_eq!(all.stats().allocs_declined, 0);
}

/// A copy out of a block, into a block the program frees at once, does not
/// leave the source's size on frames: numpy's slice copied out of a 48 MB
/// array and dropped at once put the next three arrays of that size on
/// frames, 4 KiB faults where anonymous memory takes 2 MiB ones. A copy that
/// lives on does.
#[test]
fn a_copy_freed_young_does_not_put_its_sources_size_on_frames() {
    let _s = serial();
    let e = Engine::new(Config {
        copy_young: std::time::Duration::from_secs(60),
        ..engine_config_leaving_plain_below(1 << 20)
    });
    let (n, part) = (96 * PAGE, 64 * PAGE);
    let a = filled(&e, n, 3);
    let want = bytes(a, part);
    let b = e
        .take(part, Hint::Uninit)
        .expect("an unknown class is taken");
    copy(&e, b, a, part);
    assert_eq!(bytes(b, part), want);
    let s = e.stats();
    assert!(s.pages_adopted + s.pages_shared_by_copy >= 64, "{s:?}");
    free(&e, b);
    assert_eq!(e.stats().copy_pages_freed_young, 64, "{:?}", e.stats());
    free(&e, a);
    let frames = e.stats().frames_in_use;
    let c = filled(&e, n, 4);
    assert_eq!(
        e.stats().frames_in_use,
        frames,
        "the source's size starts anonymous"
    );

    // A copy of another length (its class not judged yet) kept: the
    // source's size is copied from, its next block on frames.
    let part = part + 8 * PAGE;
    let d = e.take(part, Hint::Uninit).expect("taken");
    copy(&e, d, c, part);
    let frames = e.stats().frames_in_use;
    let f = filled(&e, n, 5);
    assert_eq!(e.stats().frames_in_use, frames + 96, "{:?}", e.stats());
    for p in [c, d, f] {
        free(&e, p);
    }
}

/// `take_first` sets how many allocations of a size are taken before copy
/// evidence decides.
#[test]
fn how_many_allocations_of_a_size_are_taken_first_is_configurable() {
    let _s = serial();
    let len = 64 * PAGE;
    for take_first in [1, 2] {
        let e = Engine::new(Config {
            take_first,
            ..engine_config_leaving_plain_below(1 << 20)
        });
        let taken = (0..6)
            .filter_map(|_| e.take(len, Hint::Uninit))
            .inspect(|&p| free(&e, p))
            .count();
        assert_eq!(taken, take_first as usize);
        assert_eq!(e.stats().allocs_declined, 6 - take_first as u64);
    }
}

/// Copies out of the caller's own memory count for the class of their
/// length: once one block in two is copied from, the class is taken again,
/// and a copy between two taken blocks is virtual.
#[test]
fn copies_out_of_plain_memory_bring_a_class_back() {
    let _s = serial();
    let len = 64 * PAGE;
    let e = engine_leaving_plain_below(1 << 20);
    for _ in 0..5 {
        if let Some(p) = e.take(len, Hint::Uninit) {
            free(&e, p);
        }
    }
    assert_eq!(e.take(len, Hint::Uninit), None);
    let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; len];
    // Six allocations seen, one more for each block taken below.
    for _ in 0..4 {
        // SAFETY: two distinct vectors of len bytes.
        unsafe { e.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
        assert_eq!(dst, src);
    }
    let a = e.take(len, Hint::Uninit).expect("copied from: taken");
    let b = e.take(len, Hint::Uninit).expect("copied from: taken");
    // SAFETY: a is a live block of len bytes, src a vector of len bytes.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), a, len) };
    copy(&e, b, a, len);
    assert_eq!(bytes(b, len), src);
    assert!(e.stats().pages_shared_by_copy + e.stats().pages_adopted >= 64);
    free(&e, a);
    free(&e, b);
}

/// A malloc at or above `plain_below` that the caller's heap has room for
/// (it holds at least as many bytes freed) is left to it; calloc is not,
/// nor a malloc with too little room, nor any with `heap_first` off. Below
/// `plain_below` the first allocations of a size are taken, room or not,
/// unless `heap_first` is `Every`.
#[test]
fn mallocs_the_callers_heap_has_room_for_are_left_to_it() {
    let _s = serial();
    let big = 16 << 20;
    let e = Engine::new(Config {
        recycle_bytes: 0,
        ..engine_config_leaving_plain_below(1 << 20)
    });
    assert_eq!(e.take_beside_heap(big, Hint::Uninit, big), None, "room");
    assert_eq!(e.take_beside_heap(2 * big, Hint::Uninit, 1 << 30), None);
    let short = e.take_beside_heap(big, Hint::Uninit, big - 1);
    let zeroed = e.take_beside_heap(big, Hint::Zeroed, big);
    let small = e.take_beside_heap(64 * PAGE, Hint::Uninit, 1 << 30);
    for p in [short, zeroed, small] {
        let p = p.expect("too little room, calloc, or a small first: taken");
        assert!(e.owns(p));
        free(&e, p);
    }
    assert_eq!(e.take(big, Hint::Uninit).map(|p| free(&e, p)), Some(()));
    assert_eq!(e.stats().allocs_left_to_heap, 2);

    let off = Engine::new(Config {
        heap_first: HeapFirst::Off,
        ..engine_config_leaving_plain_below(1 << 20)
    });
    let p = off
        .take_beside_heap(big, Hint::Uninit, usize::MAX)
        .expect("heap_first off: taken");
    free(&off, p);
    assert_eq!(off.stats().allocs_left_to_heap, 0);

    let all = engine_leaving_plain_below(0);
    let p = all
        .take_beside_heap(big, Hint::Uninit, usize::MAX)
        .expect("plain_below 0 takes every allocation");
    free(&all, p);
    assert_eq!(all.stats().allocs_left_to_heap, 0);

    let every = Engine::new(Config {
        heap_first: HeapFirst::Every,
        ..engine_config_leaving_plain_below(1 << 20)
    });
    assert_eq!(
        every.take_beside_heap(64 * PAGE, Hint::Uninit, 1 << 30),
        None,
        "every size: the first of a size too"
    );
}

/// A size whose blocks are copied from (or copied into the caller's memory),
/// or one a recycled block fits, is taken even when the caller's heap has
/// room: a copy of an engine block is virtual, and a recycled block is
/// memory the engine already faulted in.
#[test]
fn copied_sizes_and_recycled_blocks_are_taken_beside_a_roomy_heap() {
    let _s = serial();
    let big = 16 << 20;
    let e = Engine::new(Config {
        recycle_bytes: 256 << 20,
        ..engine_config_leaving_plain_below(1 << 20)
    });
    let p = e.take(big, Hint::Uninit).expect("at plain_below: taken");
    write(p, 0, 1);
    free(&e, p);
    let again = e
        .take_beside_heap(big, Hint::Uninit, big)
        .expect("a recycled block fits: taken");
    assert_eq!(e.stats().recycled, 1);
    free(&e, again);

    let len = 32 << 20;
    assert_eq!(e.take_beside_heap(len, Hint::Uninit, len), None);
    let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; len];
    // SAFETY: two distinct vectors of len bytes.
    unsafe { e.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
    assert_eq!(dst, src);
    let p = e
        .take_beside_heap(len, Hint::Uninit, len)
        .expect("copied from: taken");
    free(&e, p);
    assert_eq!(e.stats().allocs_left_to_heap, 1);

    // A copy out of an engine block into the caller's memory (a
    // destination left to the heap) counts for the size of its length.
    let len = 24 << 20;
    let src = filled(&e, len, 3);
    assert_eq!(e.take_beside_heap(len, Hint::Uninit, len), None);
    let mut dst = vec![0u8; len];
    copy(&e, dst.as_mut_ptr(), src, len);
    assert_eq!(dst, bytes(src, len));
    let p = e
        .take_beside_heap(len, Hint::Uninit, len)
        .expect("copied into the caller's memory: taken");
    free(&e, p);
    free(&e, src);
    assert_eq!(e.stats().allocs_left_to_heap, 2);
}

/// A size whose last block a scan found fruitful (its zero pages folded) is
/// taken even when the caller's heap has room; two fruitless blocks later it
/// is left to the heap again.
#[test]
fn a_size_whose_blocks_fold_is_taken_beside_a_roomy_heap() {
    let _s = serial();
    let len = 2 << 20;
    let e = Engine::new(Config {
        recycle_bytes: 0,
        ..engine_config_leaving_plain_below(1 << 20)
    });
    let p = e.take(len, Hint::Uninit).expect("at plain_below: taken");
    for k in 0..len / PAGE {
        write(p, k * PAGE, 0);
    }
    let mut folded = 0;
    for _ in 0..4 {
        folded += e.scan().zero_folded;
    }
    assert_eq!(folded, (len / PAGE) as u64);
    free(&e, p);
    let q = e
        .take_beside_heap(len, Hint::Uninit, len)
        .expect("a fruitful size: taken");
    free(&e, q);
    for _ in 0..2 {
        let p = e.take(len, Hint::Uninit).expect("taken");
        // Pages neither zero nor equal to one another.
        for k in 0..len / PAGE {
            write(p, k * PAGE, k as u8);
            write(p, k * PAGE + 1, (k >> 8) as u8 + 1);
        }
        for _ in 0..2 {
            e.scan();
        }
        free(&e, p);
    }
    assert_eq!(
        e.take_beside_heap(len, Hint::Uninit, len),
        None,
        "fruitless again"
    );
}

fn engine_judging_lifetime(young: std::time::Duration) -> Engine {
    Engine::new(Config {
        copy_learn: true,
        copy_young: young,
        plain_below: 1 << 20,
        recycle_bytes: 64 << 20,
        ..Config::default()
    })
}

/// A copy of `src` (`n` bytes) into a fresh block (malloc-like, so a
/// recycled block may serve it): the block, and whether the copy was plain.
fn copy_into_fresh(e: &Engine, src: *const u8, n: usize) -> (*mut u8, bool) {
    let d = e.alloc(n, Hint::Uninit);
    assert!(!d.is_null());
    let plain_before = e.stats().copies_made_plain;
    copy(e, d, src, n);
    assert_eq!(bytes(d, n), bytes(src, n));
    (d, e.stats().copies_made_plain > plain_before)
}

/// Copies into a size below `plain_below` that the program frees young and
/// unwritten count against their class as written ones do: once 64 pages
/// were judged, copies of that size are plain, and the blocks plainly
/// copied into are recycled, as the caller's heap would reuse them. Copies
/// of another size that live past the window stay virtual.
#[test]
fn copies_freed_young_become_plain_and_long_lived_ones_stay_virtual() {
    let _g = serial();
    let young = std::time::Duration::from_millis(300);
    let e = engine_judging_lifetime(young);
    let n = 32 * PAGE;
    let a = filled(&e, n, 3);
    let mut plain = Vec::new();
    for _ in 0..12 {
        let (d, was_plain) = copy_into_fresh(&e, a, n);
        plain.push(was_plain);
        free(&e, d);
    }
    let s = e.stats();
    assert_eq!(
        &plain[..2],
        &[false, false],
        "virtual until judged: {plain:?}"
    );
    assert!(plain[2..].iter().all(|&p| p), "then plain: {plain:?}");
    assert!(s.copy_pages_freed_young >= 64, "{s:?}");
    assert!(s.recycled >= 8, "plain copies' blocks are recycled: {s:?}");

    let m = 48 * PAGE;
    let c = filled(&e, m, 4);
    let shared_before = e.stats().pages_shared_by_copy;
    for _ in 0..3 {
        let kept: Vec<*mut u8> = (0..2)
            .map(|_| {
                let (d, was_plain) = copy_into_fresh(&e, c, m);
                assert!(!was_plain, "copies that live long stay virtual");
                d
            })
            .collect();
        std::thread::sleep(young + std::time::Duration::from_millis(50));
        kept.into_iter().for_each(|d| free(&e, d));
    }
    let s = e.stats();
    assert_eq!(s.pages_shared_by_copy - shared_before, 6 * 48, "{s:?}");
    assert!(s.copy_pages_freed_young < 2 * 64, "{s:?}");
    free(&e, a);
    free(&e, c);
}

/// With lifetime not judged (`copy_young` zero), copies freed young stay virtual.
#[test]
fn copies_freed_young_stay_virtual_when_lifetime_is_not_judged() {
    let _g = serial();
    let e = engine_judging_lifetime(std::time::Duration::ZERO);
    let n = 32 * PAGE;
    let a = filled(&e, n, 5);
    for _ in 0..12 {
        let (d, was_plain) = copy_into_fresh(&e, a, n);
        assert!(!was_plain);
        free(&e, d);
    }
    let s = e.stats();
    assert_eq!(
        (s.copies_made_plain, s.copy_pages_freed_young),
        (0, 0),
        "{s:?}"
    );
    free(&e, a);
}
