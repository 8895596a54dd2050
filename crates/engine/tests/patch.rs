//! Patching: similar pages evicted as patches against a reference page kept
//! in memory must come back exactly on any touch — by the program, another
//! thread, the kernel inside read(2)/write(2), after fork — even after the
//! reference page was written (copy-on-write break) and freed; a page whose
//! patch would be too big goes to the store or stays; a patch that does not
//! decode kills the toucher (SIGBUS), never yields wrong bytes; and when
//! everything is freed no frame stays referenced.
//!
//! Pages follow Difference Engine's generator (pagefold-tier's kinds): a
//! random reference page and pages "95% similar" to it (5% of the bytes,
//! at random offsets or in one run, replaced by random bytes), and DE's
//! write of a constant byte at 16 fixed offsets.
//!
//! The tests in one process run one at a time: a fork restores every evicted
//! page of every engine in the process. The tests that fork run in a process
//! of their own (`common::in_own_process`), so their children find no lock
//! held by another test's thread.

mod common;
use common::{assert_killed_for_lost_page, pipe};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pagefold_engine::{Allow, Config, Engine, Hint, Inject, Stats, PAGE};
use pagefold_tier::kinds::{page as kind_page, Kind, Rng};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn cfg() -> Config {
    Config {
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    }
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    /// 5% of the bytes at random offsets (DE's "95% similar").
    Scattered,
    /// 5% of the bytes in one run at a random offset.
    Localised,
    /// A constant byte at 16 fixed offsets (DE's benchmark write).
    Write16,
}

/// A page similar to `reference` by `change`, different for every `seed`.
fn similar(reference: &[u8], change: Change, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9) ^ 0xd1ff);
    let mut p = reference.to_vec();
    let n = PAGE * 5 / 100;
    match change {
        Change::Scattered => (0..n).for_each(|_| {
            let o = rng.below(PAGE as u64) as usize;
            p[o] = rng.next_u64() as u8;
        }),
        Change::Localised => {
            let at = rng.below((PAGE - n) as u64) as usize;
            rng.fill(&mut p[at..at + n]);
        }
        Change::Write16 => (0..16).for_each(|i| p[i * (PAGE / 16) + 7] = 0xab),
    }
    p
}

/// A block of `n` pages: page 0 a random reference, the rest similar to it.
struct Similar {
    e: Engine,
    ptr: *mut u8,
    want: Vec<u8>,
}

impl Similar {
    fn new(e: Engine, n: usize, change: Change, seed: u64) -> Similar {
        Similar::of(Kind::Random, e, n, change, seed)
    }

    fn of(kind: Kind, e: Engine, n: usize, change: Change, seed: u64) -> Similar {
        Similar::variants(kind, e, n, change, seed, true)
    }

    /// With `base`, page 0 is the reference itself; without, every page is a
    /// variant of a reference that is not in memory.
    fn variants(kind: Kind, e: Engine, n: usize, change: Change, seed: u64, base: bool) -> Similar {
        let reference = kind_page(kind, seed);
        let mut want = if base {
            reference.clone()
        } else {
            similar(&reference, change, seed * 1000)
        };
        for k in 1..n {
            want.extend(similar(&reference, change, seed * 1000 + k as u64));
        }
        let ptr = e.alloc(n * PAGE, Hint::None);
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), ptr, want.len()) };
        Similar { e, ptr, want }
    }

    fn pages(&self) -> usize {
        self.want.len() / PAGE
    }

    fn check(&self, ctx: &str) {
        for k in 0..self.pages() {
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            let got = bytes(unsafe { self.ptr.add(k * PAGE) }, PAGE);
            assert!(
                got == &self.want[k * PAGE..(k + 1) * PAGE],
                "{ctx}: page {k} differs"
            );
        }
    }
}

fn assert_nothing_held(e: &Engine, ctx: &str) {
    let s = e.stats();
    assert_eq!(
        (
            s.frames_in_use,
            s.references_pinned,
            s.patched_now,
            s.patch_bytes,
            s.reference_bytes,
            s.evicted_now
        ),
        (0, 0, 0, 0, 0, 0),
        "{ctx}: frames or patches left: {s:?}"
    );
}

#[test]
fn similar_pages_become_patches_and_come_back_exactly() {
    let _g = serial();
    for change in [Change::Scattered, Change::Localised, Change::Write16] {
        let b = Similar::new(Engine::new(cfg()), 64, change, 1);
        let r = b.e.evict(b.ptr, 64 * PAGE);
        // Page 0 serves as reference; every other page finds it.
        assert_eq!((r.patched, r.evicted), (63, 63), "{change:?}: {r:?}");
        let s = b.e.stats();
        assert_eq!(
            (s.patched_now, s.references_pinned, s.patched),
            (63, 1, 63),
            "{change:?}: {s:?}"
        );
        assert!(
            s.patch_bytes > 0 && s.patch_bytes <= 63 * 2048,
            "{change:?}: {s:?}"
        );
        assert_eq!(
            s.reference_bytes, 0,
            "the reference page still maps its frame: {s:?}"
        );
        b.check(&format!("{change:?}: read by the program"));
        let s = b.e.stats();
        assert_eq!((s.restored, s.restore_errors), (63, 0), "{s:?}");
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { b.e.free(b.ptr) });
        assert_nothing_held(&b.e, &format!("{change:?}"));
    }
}

#[test]
fn restored_by_another_thread_and_by_writes() {
    let _g = serial();
    let mut b = Similar::new(Engine::new(cfg()), 32, Change::Scattered, 2);
    assert_eq!(b.e.evict(b.ptr, 32 * PAGE).patched, 31);
    let (addr, want) = (b.ptr as usize, b.want.clone());
    std::thread::spawn(move || {
        for k in (1..32).step_by(2) {
            let got = bytes((addr + k * PAGE) as *const u8, PAGE);
            assert!(
                got == &want[k * PAGE..(k + 1) * PAGE],
                "page {k} read by another thread differs"
            );
        }
    })
    .join()
    .unwrap();
    for k in (2..32).step_by(2) {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { b.ptr.add(k * PAGE + 100).write_volatile(0x42) };
        b.want[k * PAGE + 100] = 0x42;
    }
    b.check("after reads by another thread and writes by this one");
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { b.e.free(b.ptr) });
    assert_nothing_held(&b.e, "threads");
}

fn must(what: &str, r: isize, len: usize) {
    assert_eq!(
        r,
        len as isize,
        "{what}: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn kernel_reads_and_writes_patched_pages() {
    let _g = serial();
    let mut b = Similar::new(Engine::new(cfg()), 16, Change::Scattered, 3);
    assert_eq!(b.e.evict(b.ptr, 16 * PAGE).patched, 15);
    let (rd, wr) = pipe();
    // write(2) from patched pages: the kernel reads them.
    must(
        "write",
        // SAFETY: the buffer is live and at least the length passed; the descriptor is this test's
        // own.
        unsafe { libc::write(wr, b.ptr.add(PAGE).cast(), 4 * PAGE) },
        4 * PAGE,
    );
    let mut got = vec![0u8; 4 * PAGE];
    must(
        "read back",
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        unsafe { libc::read(rd, got.as_mut_ptr().cast(), 4 * PAGE) },
        4 * PAGE,
    );
    assert!(
        got == b.want[PAGE..5 * PAGE],
        "write(2) from patched pages sent wrong bytes"
    );
    // read(2) into patched pages: part of each page, the rest must survive.
    for k in 5..16 {
        let data = [k as u8; 100];
        must(
            "write",
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            unsafe { libc::write(wr, data.as_ptr().cast(), 100) },
            100,
        );
        must(
            "read into",
            // SAFETY: the buffer is live, writable and at least the length passed; the descriptor
            // is this test's own.
            unsafe { libc::read(rd, b.ptr.add(k * PAGE + 1000).cast(), 100) },
            100,
        );
        b.want[k * PAGE + 1000..k * PAGE + 1100].copy_from_slice(&data);
    }
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
    b.check("after read(2) into and write(2) from patched pages");
    assert_eq!(b.e.stats().restore_errors, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { b.e.free(b.ptr) });
    assert_nothing_held(&b.e, "kernel");
}

#[test]
fn reference_written_and_freed_patches_still_restore() {
    let _g = serial();
    let e = Engine::new(cfg());
    let reference = kind_page(Kind::Random, 4);
    let r = e.alloc(PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(reference.as_ptr(), r, PAGE) };
    // Patch-only eviction of the lone reference: nothing to patch against,
    // so it stays in memory and becomes a candidate.
    let rep = e.evict_with(
        r,
        PAGE,
        Allow {
            patch: true,
            compress: false,
        },
    );
    assert_eq!((rep.evicted, rep.unpatched), (0, 1), "{rep:?}");
    let n = 24;
    let want: Vec<u8> = (0..n)
        .flat_map(|k| similar(&reference, Change::Scattered, 40 + k as u64))
        .collect();
    let p = e.alloc(n * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    let rep = e.evict_with(
        p,
        n * PAGE,
        Allow {
            patch: true,
            compress: false,
        },
    );
    assert_eq!(rep.patched, n as u64, "{rep:?}");
    // The reference page is written (its frame stays as it was) ...
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(r, 0x5a, 64) };
    assert_eq!(bytes(r, 64), &[0x5a; 64][..]);
    assert!(bytes(r, PAGE)[64..] == reference[64..]);
    assert!(
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        bytes(unsafe { p.add(PAGE) }, PAGE) == &want[PAGE..2 * PAGE],
        "after the reference was written"
    );
    // ... and freed: the frame lives on for the patches alone.
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(r) });
    let s = e.stats();
    assert_eq!(
        (s.references_pinned, s.reference_bytes),
        (1, PAGE as u64),
        "{s:?}"
    );
    assert!(
        bytes(p, n * PAGE) == &want[..],
        "after the reference was freed"
    );
    assert_eq!(e.stats().restore_errors, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_nothing_held(&e, "reference freed");
}

#[test]
fn noted_references_serve_other_blocks() {
    let _g = serial();
    let e = Engine::new(cfg());
    let reference = kind_page(Kind::Random, 10);
    let r = e.alloc(2 * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(reference.as_ptr(), r, PAGE) };
    // The second page is all zero: no reference.
    assert_eq!(e.note_references(r, 2 * PAGE), 1);
    let anon = Engine::new(Config {
        frames: false,
        ..cfg()
    });
    let a = anon.alloc(PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(reference.as_ptr(), a, PAGE) };
    assert_eq!(
        anon.note_references(a, PAGE),
        0,
        "an anonymous page has no frame to pin"
    );
    let n = 8;
    let want: Vec<u8> = (0..n)
        .flat_map(|k| similar(&reference, Change::Scattered, 50 + k as u64))
        .collect();
    let p = e.alloc(n * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    assert_eq!(e.evict(p, n * PAGE).patched, n as u64);
    assert!(bytes(r, PAGE) == &reference[..] && bytes(p, n * PAGE) == &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        assert!(e.free(p) && e.free(r) && anon.free(a));
    }
    assert_nothing_held(&e, "noted references");
}

#[test]
fn the_detector_memory_is_bounded_and_counted() {
    let _g = serial();
    let n = 2048;
    let metadata_growth = |candidates: usize| {
        let e = Engine::new(Config {
            patch_candidates: candidates,
            ..cfg()
        });
        let p = e.alloc(n * PAGE, Hint::None);
        for k in 0..n {
            // SAFETY: source and destination are distinct live buffers of this test, each at least
            // the length copied.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    kind_page(Kind::Random, k as u64).as_ptr(),
                    p.add(k * PAGE),
                    PAGE,
                )
            };
        }
        let before = e.stats().metadata_bytes;
        assert_eq!(e.note_references(p, n * PAGE), n as u64);
        let growth = e.stats().metadata_bytes - before;
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(p) });
        growth
    };
    let (bounded, unbounded) = (metadata_growth(64), metadata_growth(1 << 16));
    eprintln!("detector: {bounded} B with 64 candidates at most, {unbounded} B for {n}");
    assert!(
        unbounded > 100 * n as u64,
        "the index of {n} pages is not counted: {unbounded} B"
    );
    assert!(
        bounded * 10 < unbounded,
        "64 candidates at most cost {bounded} B, {n} cost {unbounded} B"
    );
}

/// The engine goes away (its pools close their memfds) while pages are
/// patched: the fault thread still rebuilds them from its own descriptors,
/// even when the program opens files that reuse the closed numbers.
#[test]
fn patched_pages_outlive_the_engine() {
    let _g = serial();
    let Similar { e, ptr, want } = Similar::new(Engine::new(cfg()), 16, Change::Scattered, 13);
    assert_eq!(e.evict(ptr, 16 * PAGE).patched, 15);
    drop(e);
    // Descriptor numbers the engine closed now name other files.
    let others: Vec<i32> = (0..4)
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        .map(|_| unsafe { libc::memfd_create(c"other".as_ptr(), 0) })
        .collect();
    for &fd in &others {
        assert!(fd >= 0);
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        assert_eq!(unsafe { libc::ftruncate(fd, 1 << 30) }, 0);
    }
    assert!(
        bytes(ptr, 16 * PAGE) == &want[..],
        "patched pages after the engine was dropped"
    );
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    others.into_iter().for_each(|fd| unsafe {
        libc::close(fd);
    });
}

/// A page starting with zstd's dictionary magic is never a reference (its
/// zstd-ref patches would need an allocation on the fault thread).
#[test]
fn no_reference_starts_with_the_zstd_dictionary_magic() {
    let _g = serial();
    let e = Engine::new(cfg());
    let mut reference = kind_page(Kind::Random, 14);
    reference[..4].copy_from_slice(&0xEC30_A437u32.to_le_bytes());
    let n = 8;
    let want: Vec<u8> = (0..n)
        .flat_map(|k| similar(&reference, Change::Write16, k as u64))
        .collect();
    let p = e.alloc(n * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    assert_eq!(e.note_references(p, PAGE), 0);
    let rep = e.evict_with(
        p,
        n * PAGE,
        Allow {
            patch: true,
            compress: false,
        },
    );
    assert_eq!((rep.patched, rep.unpatched), (0, n as u64), "{rep:?}");
    // Without the magic the same pages patch.
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *p.add(PAGE) = 0 };
    assert_eq!(
        e.evict_with(
            p,
            n * PAGE,
            Allow {
                patch: true,
                compress: false
            }
        )
        .patched,
        n as u64 - 2
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_nothing_held(&e, "zstd magic");
}

/// The reference is a sole shared page (a copy whose source is gone), which
/// eviction takes first — its frame would be punched — then a later page of
/// the same chunk picks it as reference: it must be put back, not punched.
#[test]
fn a_taken_candidate_becomes_the_reference() {
    let _g = serial();
    let n = 16;
    let e = Engine::new(cfg());
    // Compressible, so that the store takes page 0 first.
    let src = Similar::of(Kind::Text, e.clone(), n, Change::Localised, 9);
    let dst = e.alloc(n * PAGE, Hint::None);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.copy(dst, src.ptr, n * PAGE);
        assert!(e.free(src.ptr));
    }
    // Page 0 becomes a candidate (patch only, nothing to patch against).
    assert_eq!(
        e.evict_with(
            dst,
            PAGE,
            Allow {
                patch: true,
                compress: false
            }
        )
        .unpatched,
        1
    );
    // Page 0 could go to the store, but page 1 picks it: it stays as the reference.
    let rep = e.evict(dst, n * PAGE);
    assert_eq!(
        (rep.patched, rep.evicted),
        (n as u64 - 1, n as u64 - 1),
        "{rep:?}"
    );
    assert!(
        bytes(dst, n * PAGE) == &src.want[..],
        "patched pages against a put-back reference"
    );
    let s = e.stats();
    assert_eq!(
        (s.restored, s.restore_errors, s.store.pages),
        (n as u64 - 1, 0, 0),
        "{s:?}"
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(dst) });
    assert_nothing_held(&e, "taken candidate");
}

#[test]
fn a_page_whose_patch_is_too_big_goes_to_the_store_or_stays() {
    let _g = serial();
    let e = Engine::new(cfg());
    // Two pages with the same compressible first half (the detector pairs
    // them) and different random second halves: no patch of at most 2048
    // bytes exists either way, and each compresses to about half a page.
    let mut reference: Vec<u8> = (0..PAGE).map(|i| (i / 24) as u8 | 1).collect();
    let mut other = reference.clone();
    Rng::new(5).fill(&mut reference[PAGE / 2..]);
    Rng::new(6).fill(&mut other[PAGE / 2..]);
    let p = e.alloc(2 * PAGE, Hint::None);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe {
        std::ptr::copy_nonoverlapping(reference.as_ptr(), p, PAGE);
        std::ptr::copy_nonoverlapping(other.as_ptr(), p.add(PAGE), PAGE);
    }
    let rep = e.evict_with(
        p,
        2 * PAGE,
        Allow {
            patch: true,
            compress: false,
        },
    );
    assert_eq!(
        (rep.patched, rep.unpatched, rep.evicted),
        (0, 2, 0),
        "{rep:?}"
    );
    let rep = e.evict(p, 2 * PAGE);
    assert_eq!(
        (rep.patched, rep.evicted),
        (0, 2),
        "both go to the store: {rep:?}"
    );
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(bytes(p, PAGE) == &reference[..] && bytes(unsafe { p.add(PAGE) }, PAGE) == &other[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_nothing_held(&e, "too big");
}

#[test]
fn a_patch_that_does_not_decode_kills_the_toucher() {
    if !common::in_own_process("a_patch_that_does_not_decode_kills_the_toucher") {
        return;
    }
    let _g = serial();
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let inject = Inject {
            fail_patch: true,
            ..Inject::default()
        };
        let b = Similar::new(
            Engine::new(Config { inject, ..cfg() }),
            4,
            Change::Scattered,
            6,
        );
        if b.e.evict(b.ptr, 4 * PAGE).patched != 3 {
            // SAFETY: _exit ends the child at once, running no destructors.
            unsafe { libc::_exit(3) };
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let v = unsafe { b.ptr.add(2 * PAGE).read_volatile() };
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(if v == b.want[2 * PAGE] { 4 } else { 5 }) };
    }
    // (Exit status 3: nothing was patched.)
    let sig = assert_killed_for_lost_page(pid, "a patched page that cannot be rebuilt");
    eprintln!("undecodable patch: the child died by signal {sig}");
}

/// A kernel without UFFDIO_POISON (before Linux 6.6, forced here): a page
/// whose stored copy is lost cannot fault with SIGBUS, so the engine ends
/// the process (SIGABRT) rather than let it read wrong bytes.
#[test]
fn without_poisoning_a_lost_page_aborts_the_process() {
    if !common::in_own_process("without_poisoning_a_lost_page_aborts_the_process") {
        return;
    }
    let _g = serial();
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let inject = Inject {
            fail_patch: true,
            fail_uffd_poison: true,
            ..Inject::default()
        };
        let b = Similar::new(
            Engine::new(Config { inject, ..cfg() }),
            4,
            Change::Scattered,
            6,
        );
        if b.e.evict(b.ptr, 4 * PAGE).patched != 3 {
            // SAFETY: _exit ends the child at once, running no destructors.
            unsafe { libc::_exit(3) };
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let v = unsafe { b.ptr.add(2 * PAGE).read_volatile() };
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(if v == b.want[2 * PAGE] { 4 } else { 5 }) };
    }
    let sig = assert_killed_for_lost_page(pid, "a lost page without poisoning");
    assert_eq!(
        sig,
        libc::SIGABRT,
        "without UFFDIO_POISON the engine aborts"
    );
}

#[test]
fn fork_with_patched_pages() {
    if !common::in_own_process("fork_with_patched_pages") {
        return;
    }
    let _g = serial();
    let mut b = Similar::new(Engine::new(cfg()), 16, Change::Localised, 7);
    assert_eq!(b.e.evict(b.ptr, 16 * PAGE).patched, 15);
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = bytes(b.ptr, b.want.len()) == &b.want[..];
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { std::ptr::write_bytes(b.ptr.add(PAGE), 0x77, 10) };
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: status is a writable local; waitpid reaps only the given child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child read wrong bytes: {status:#x}"
    );
    let s = b.e.stats();
    assert_eq!(
        (s.evicted_now, s.patched_now, s.references_pinned),
        (0, 0, 0),
        "fork restores first: {s:?}"
    );
    b.check("parent after fork");
    // Pre-fork frames are no references any more; the parent can patch anew
    // only against what it writes after the fork.
    let rep = b.e.evict(b.ptr, 16 * PAGE);
    b.want[3 * PAGE] ^= 1;
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *b.ptr.add(3 * PAGE) ^= 1 };
    b.check(&format!("parent after eviction after fork ({rep:?})"));
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { b.e.free(b.ptr) });
    assert_eq!(b.e.stats().references_pinned, 0);
}

#[test]
fn patched_pages_under_scan_copy_and_free() {
    let _g = serial();
    let b = Similar::new(Engine::new(cfg()), 32, Change::Write16, 8);
    assert_eq!(b.e.evict(b.ptr, 32 * PAGE).patched, 31);
    // A scan leaves evicted pages alone; the reference stays pinned.
    b.e.scan();
    assert_eq!(b.e.stats().references_pinned, 1);
    // A copy over half of the patched pages replaces them (their patches go).
    let src = b.e.alloc(16 * PAGE, Hint::None);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(src, 3, 16 * PAGE) };
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { b.e.copy(b.ptr.add(16 * PAGE), src, 16 * PAGE) };
    let s = b.e.stats();
    assert_eq!((s.patched_now, s.references_pinned), (15, 1), "{s:?}");
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert!(bytes(unsafe { b.ptr.add(16 * PAGE) }, 16 * PAGE)
        .iter()
        .all(|&x| x == 3));
    assert!(bytes(b.ptr, 16 * PAGE) == &b.want[..16 * PAGE]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        assert!(b.e.free(src));
        assert!(b.e.free(b.ptr));
    }
    assert_nothing_held(&b.e, "scan/copy/free");
}

/// Another thread evicts a block of similar pages over and over while this
/// one writes into patched pages and their reference (copy-on-write breaks),
/// reads them, and has the kernel read from and write into them. What it
/// writes is mostly the reference's bytes at the same offsets (one byte in 16
/// random), so the pages stay similar and keep being patched.
#[test]
fn concurrent_eviction_writes_and_kernel_io() {
    let _g = serial();
    let n = 48;
    // Text compresses: pages go to the store too, and candidates are put back.
    let mut b = Similar::of(Kind::Text, Engine::new(cfg()), n, Change::Scattered, 11);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let evictor = {
        let (e, p, stop) = (b.e.clone(), b.ptr as usize, stop.clone());
        std::thread::spawn(move || {
            let mut patched = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                patched += e.evict(p as *const u8, n * PAGE).patched;
                std::thread::yield_now();
            }
            patched
        })
    };
    let (rd, wr) = pipe();
    let mut rng = Rng::new(12);
    let reference = b.want[..PAGE].to_vec();
    let like_reference = |rng: &mut Rng, off: usize, len: usize| -> Vec<u8> {
        (off..off + len)
            .map(|o| {
                if rng.below(16) == 0 {
                    rng.next_u64() as u8
                } else {
                    reference[o % PAGE]
                }
            })
            .collect()
    };
    let mut out = vec![0u8; 2 * PAGE];
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_millis(600) {
        i += 1;
        let len = 1 + rng.below(2 * PAGE as u64 - 1) as usize;
        // Page 0, the reference, is hit as often as all others together.
        let off = if rng.below(2) == 0 {
            rng.below((PAGE) as u64) as usize / 2
        } else {
            rng.below((n * PAGE - len) as u64) as usize
        };
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let dst = unsafe { b.ptr.add(off) };
        match i % 3 {
            0 => {
                let v = like_reference(&mut rng, off, 1)[0];
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                unsafe { dst.write_volatile(v) };
                b.want[off] = v;
            }
            1 => {
                must(
                    "write(2) from patched pages",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::write(wr, dst.cast(), len) },
                    len,
                );
                must(
                    "pipe read",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::read(rd, out.as_mut_ptr().cast(), len) },
                    len,
                );
                assert!(
                    out[..len] == b.want[off..off + len],
                    "#{i}: write(2) from [{off}, +{len}) sent wrong bytes"
                );
            }
            _ => {
                let data = like_reference(&mut rng, off, len);
                must(
                    "pipe write",
                    // SAFETY: the buffer is live and at least the length passed; the descriptor is
                    // this test's own.
                    unsafe { libc::write(wr, data.as_ptr().cast(), len) },
                    len,
                );
                must(
                    "read(2) into patched pages",
                    // SAFETY: the buffer is live, writable and at least the length passed; the
                    // descriptor is this test's own.
                    unsafe { libc::read(rd, dst.cast(), len) },
                    len,
                );
                b.want[off..off + len].copy_from_slice(&data);
            }
        }
        if i % 200 == 0 {
            b.check(&format!("after {i} operations"));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let patched = evictor.join().unwrap();
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
    assert!(patched > 0, "the evictor patched nothing");
    b.check(&format!("after {i} operations and {patched} patches"));
    assert_eq!(b.e.stats().restore_errors, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { b.e.free(b.ptr) });
    assert_nothing_held(&b.e, "concurrent");
    eprintln!("{i} operations, {patched} pages patched");
}

/// Savings and costs; run with
/// `cargo test -p pagefold-engine --release --test patch -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_patching() {
    let _g = serial();
    let n = 256;
    println!("| base page | detector | changes | patched | patch B/page | saved | evict us/page | touch us/page | patch op us | unpatch op us |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let patch_only = Allow {
        patch: true,
        compress: false,
    };
    for (label, blocks, block) in [
        ("DE (2 x 64 B)", 2, 64),
        ("8 x 8 B", 8, 8),
        ("16 x 8 B", 16, 8),
    ] {
        for change in [Change::Scattered, Change::Localised, Change::Write16] {
            let c = Config {
                pin_grace: Duration::ZERO,
                patch_blocks: blocks,
                patch_block_bytes: block,
                ..Config::default()
            };
            let rows = (0..5)
                .map(|seed| {
                    measure_one(
                        c.clone(),
                        Kind::Random,
                        n,
                        change,
                        100 + seed,
                        true,
                        patch_only,
                    )
                })
                .collect();
            print_row("random", label, change, n, rows);
        }
    }
    let c = Config {
        pin_grace: Duration::ZERO,
        ..Config::default()
    };
    // No page is the reference itself: patches against another variant.
    for change in [Change::Scattered, Change::Localised, Change::Write16] {
        let rows = (0..5)
            .map(|seed| {
                measure_one(
                    c.clone(),
                    Kind::Random,
                    n,
                    change,
                    100 + seed,
                    false,
                    patch_only,
                )
            })
            .collect();
        print_row("random, not in memory", "8 x 8 B", change, n, rows);
    }
    // Costs side by side with the LZ4 store, on pages both can take (text).
    for change in [Change::Scattered, Change::Write16] {
        let rows = (0..5)
            .map(|seed| {
                measure_one(
                    c.clone(),
                    Kind::Text,
                    n,
                    change,
                    100 + seed,
                    true,
                    patch_only,
                )
            })
            .collect();
        print_row("text", "8 x 8 B", change, n, rows);
        let store_only = Allow {
            patch: false,
            compress: true,
        };
        let rows = (0..5)
            .map(|seed| {
                measure_one(
                    c.clone(),
                    Kind::Text,
                    n,
                    change,
                    100 + seed,
                    true,
                    store_only,
                )
            })
            .collect();
        print_row("text", "LZ4 store only", change, n, rows);
    }
}

struct Row {
    patched: u64,
    patch_per_page: f64,
    saved: f64,
    evict_us: f64,
    touch_us: f64,
    patch_us: f64,
    unpatch_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn print_row(base: &str, label: &str, change: Change, n: usize, rows: Vec<Row>) {
    let m = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(f).collect());
    println!(
        "| {base} | {label} | {change:?} | {:.0}/{} | {:.0} | {:.1}% | {:.2} | {:.2} | {:.2} | {:.2} |",
        m(&|r| r.patched as f64),
        n - 1,
        m(&|r| r.patch_per_page),
        m(&|r| r.saved * 100.0),
        m(&|r| r.evict_us),
        m(&|r| r.touch_us),
        m(&|r| r.patch_us),
        m(&|r| r.unpatch_us)
    );
}

/// Evicts `n` pages (a reference and `n - 1` similar pages) and touches them
/// back: evict time per page of the range, touch time per evicted page.
fn measure_one(
    c: Config,
    kind: Kind,
    n: usize,
    change: Change,
    seed: u64,
    base: bool,
    allow: Allow,
) -> Row {
    let b = Similar::variants(kind, Engine::new(c), n, change, seed, base);
    // Warm: the fault thread and stores exist before timing.
    let warm = b.e.alloc(PAGE, Hint::None);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(warm, 1, PAGE) };
    b.e.evict(warm, PAGE);
    let before = footprint(&b.e.stats());
    let t = Instant::now();
    let rep = b.e.evict_with(b.ptr, n * PAGE, allow);
    let evict_ns = t.elapsed().as_nanos() as f64;
    let s = b.e.stats();
    let resident = resident_pages(b.ptr, n) as f64 * PAGE as f64;
    let after = resident + footprint(&s) - before;
    let original = (n * PAGE) as f64;
    let t = Instant::now();
    for k in 0..n {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { b.ptr.add(k * PAGE).read_volatile() };
    }
    let touch_ns = t.elapsed().as_nanos() as f64;
    b.check("measure");
    let s2 = b.e.stats();
    Row {
        patch_us: s.patch_work_ns as f64 / 1e3 / n as f64,
        unpatch_us: s2.patch_restore_ns as f64 / 1e3 / s2.patch_restores.max(1) as f64,
        patched: rep.patched,
        patch_per_page: s.patch_bytes as f64 / rep.patched.max(1) as f64,
        saved: 1.0 - after / original,
        evict_us: evict_ns / 1e3 / n as f64,
        touch_us: touch_ns / 1e3 / rep.evicted.max(1) as f64,
    }
}

/// What the engine holds besides the pages themselves: stores, orphan references, bookkeeping.
fn footprint(s: &Stats) -> f64 {
    (s.patch_store_bytes
        + s.reference_bytes
        + s.store.payload
        + s.store.overhead
        + s.metadata_bytes) as f64
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
