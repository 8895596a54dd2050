//! Tiering: the clock classifies pages and the policy evicts cold ones in
//! scans, with every byte read back as written. Covers the background
//! scanner doing it unasked, pages written every pass staying, a restored
//! page staying until cold again, duplicates merged rather than compressed
//! (no compression before a full sharing cycle), the watermarks and the
//! store's spill, tiering off, and tiering without userfaultfd MISSING mode.
//!
//! Most tests drive passes by hand: `clock_interval` zero makes every
//! explicit scan a pass. They run one at a time (the background test's
//! timing would suffer from the others' CPU use).

mod common;
use common::{bytes, incompressible, serial};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_engine::{
    Config, Engine, Handle, Hint, Inject, PageStore, StoreBytes, StoreError, Tier, TierConfig,
    TierStore, PAGE,
};

/// Every explicit scan is a clock pass.
fn tier_cfg() -> Config {
    Config {
        tier: Tier::On,
        clock_interval: Duration::ZERO,
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    }
}

/// Compressible content, different for every `k` (and at the sampled offsets), never zero.
fn pattern(k: usize) -> Vec<u8> {
    let mut page: Vec<u8> = (0..PAGE)
        .map(|i| (((i / 16) ^ k) as u8).wrapping_mul(3) | 1)
        .collect();
    for at in (0..PAGE).step_by(512) {
        page[at + 8..at + 16].copy_from_slice(&(k as u64).to_le_bytes());
    }
    page
}

/// A block of `n` pages holding `pattern(first + j)` in page j.
fn filled(e: &Engine, n: usize, first: usize) -> (*mut u8, Vec<u8>) {
    let p = e.alloc(n * PAGE, Hint::None);
    assert!(!p.is_null());
    let want: Vec<u8> = (first..first + n).flat_map(pattern).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    (p, want)
}

/// Which of `n` pages at `p` are resident (evicted pages are not).
fn resident(p: *const u8, n: usize) -> Vec<bool> {
    let mut v = vec![0u8; n];
    assert_eq!(
        // SAFETY: the range is a live block of this test; the call changes or reads only that range
        // (a mincore vector has one byte per page).
        unsafe { libc::mincore(p as *mut _, n * PAGE, v.as_mut_ptr()) },
        0
    );
    v.iter().map(|&b| b & 1 != 0).collect()
}

fn scans(e: &Engine, n: usize) {
    for _ in 0..n {
        assert!(
            e.scan().pass,
            "every scan is a pass with a zero clock interval"
        );
    }
}

#[test]
fn the_background_scanner_evicts_cold_pages_and_they_read_back_exactly() {
    let _s = serial();
    let ms = Duration::from_millis(20);
    let e = Engine::new(Config {
        clock_interval: ms,
        scan_interval: Some(ms),
        scan_cpu_budget: 1.0,
        ..tier_cfg()
    });
    let n = 64;
    let (p, want) = filled(&e, n, 0);
    let t0 = Instant::now();
    // The clock's counts are complete at the end of a pass.
    while e.stats().clock.total.evicted < n as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "cold pages not evicted: {:?}",
            e.stats().clock
        );
        std::thread::sleep(ms);
    }
    let st = e.stats();
    assert!(
        st.clock.passes >= 3 && st.evicted_now == n as u64,
        "{:?}",
        st.clock
    );
    assert!(
        resident(p, n).iter().all(|r| !r),
        "evicted pages hold no memory"
    );
    assert_eq!(bytes(p, n * PAGE), &want[..], "every byte restored");
    let st = e.stats();
    assert_eq!(st.restored, n as u64);
    assert_eq!(st.restore_errors, 0);
    e.stop_background();
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn pages_written_every_pass_are_never_evicted() {
    let _s = serial();
    let e = Engine::new(tier_cfg());
    let n = 16;
    let (hot, mut hot_want) = filled(&e, n, 100);
    let (cold, cold_want) = filled(&e, n, 200);
    for round in 0..8u8 {
        for k in 0..n {
            // Offset 0 is among the bytes a look samples.
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            unsafe { *hot.add(k * PAGE) = round.wrapping_add(7) };
            hot_want[k * PAGE] = round.wrapping_add(7);
        }
        let rep = e.scan();
        assert!(
            rep.clock.c1 >= n as u64,
            "round {round}: hot pages are C1: {:?}",
            rep.clock
        );
        assert!(
            resident(hot, n).iter().all(|&r| r),
            "round {round}: a hot page was evicted"
        );
    }
    let st = e.stats();
    assert_eq!(
        st.evicted_now, n as u64,
        "only the cold block is evicted: {:?}",
        st.clock
    );
    assert!(resident(cold, n).iter().all(|r| !r));
    assert_eq!(bytes(hot, n * PAGE), &hot_want[..]);
    assert_eq!(bytes(cold, n * PAGE), &cold_want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(hot);
        e.free(cold);
    }
}

#[test]
fn a_restored_page_is_not_evicted_again_until_it_is_cold_again() {
    let _s = serial();
    let e = Engine::new(tier_cfg());
    let n = 8;
    let (p, want) = filled(&e, n, 300);
    scans(&e, 3); // C1, C3, C4: evicted
    assert!(resident(p, n).iter().all(|r| !r), "{:?}", e.stats().clock);
    assert_eq!(bytes(p, PAGE), &want[..PAGE], "a read restores page 0");
    let rep = e.scan();
    assert_eq!(
        (rep.clock.restored, rep.clock.c2),
        (1, 1),
        "the restore is seen as an access: {:?}",
        rep.clock
    );
    assert!(
        resident(p, 1)[0],
        "not evicted on the pass after its restore"
    );
    e.scan(); // C3: cold for one pass, not yet for compression
    assert!(resident(p, 1)[0], "not compressed before it is C4 again");
    e.scan();
    assert!(!resident(p, 1)[0], "cold again: evicted again");
    assert_eq!(e.stats().clock.total.evicted, n as u64 + 1);
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn duplicate_cold_pages_are_merged_not_compressed() {
    let _s = serial();
    // C4 after one pass without access, so only the sharing-cycle rule keeps
    // a page from being compressed before its duplicate (in a later chunk) met it.
    let e = Engine::new(Config {
        cold_passes: 1,
        scan_chunk_pages: 8,
        ..tier_cfg()
    });
    let (dups, unique) = (16, 8);
    let (a, a_want) = filled(&e, dups, 400);
    let (u, u_want) = filled(&e, unique, 500);
    let (b, b_want) = filled(&e, dups, 400);
    e.scan(); // first looks: all C1
    let rep = e.scan(); // settled: duplicates merge; the rest is C4 but its cycle is not complete
    assert_eq!(rep.merged, dups as u64, "{rep:?}");
    assert_eq!(
        rep.clock.evicted, 0,
        "nothing compressed before a full sharing cycle: {:?}",
        rep.clock
    );
    let rep = e.scan();
    assert_eq!(
        rep.clock.evicted, unique as u64,
        "then the unique cold pages are: {:?}",
        rep.clock
    );
    e.scan();
    let st = e.stats();
    assert_eq!(
        (st.evicted_now, st.merged),
        (unique as u64, dups as u64),
        "merged pages are shared, not compressed"
    );
    assert_eq!(bytes(a, dups * PAGE), &a_want[..]);
    assert_eq!(bytes(b, dups * PAGE), &b_want[..]);
    assert_eq!(bytes(u, unique * PAGE), &u_want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e.free(b);
        e.free(u);
    }
}

/// A page a pass freezes (remaps privately onto its own frame, to be shared
/// later) sits on a fresh mapping that its chunk's write protection no longer
/// covers: the policy leaves it for a later pass. Evicted in the same pass, a
/// write between its read and the hole punched in its frame would stay
/// behind as a private copy the engine does not know of, and its restore
/// would find the page already present.
#[test]
fn a_page_frozen_in_a_pass_is_not_evicted_in_that_pass() {
    let _s = serial();
    // C4 after two passes without access; no patching and no sharing cycle
    // to wait for, so the C4 page is compressed at the pass it is frozen in.
    // A pin age makes an owned page with a match frozen first; one this
    // short keeps no frozen frame young (unevictable) through the pass.
    let e = Engine::new(Config {
        cold_passes: 2,
        volatile_check: false,
        tier_patch: false,
        pin_age: Duration::from_nanos(1),
        ..tier_cfg()
    });
    let (p, mut want) = filled(&e, 2, 700);
    scans(&e, 2); // C1 (first looks), then C3: nothing allowed yet
                  // Page 0 now repeats page 1: at the next pass page 1 meets it in the
                  // index and is frozen, and is C4.
    want.copy_within(PAGE..2 * PAGE, 0);
    // SAFETY: p is a live two-page block of this test; one page is written.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, PAGE) };
    let rep = e.scan();
    assert!(rep.frozen >= 1, "page 1 was not frozen: {rep:?}");
    assert_eq!(
        resident(p, 2),
        [true, true],
        "a page frozen in this pass was evicted in it: {:?} {:?}",
        rep.clock,
        e.stats()
    );
    assert!(rep.clock.not_eligible >= 1, "{:?}", rep.clock);
    assert_eq!(bytes(p, 2 * PAGE), &want[..]);
    assert_eq!(e.stats().restore_errors, 0);
    // SAFETY: p is the block this test got from alloc, unused after this free.
    unsafe { e.free(p) };
}

/// A tier store (no swap file) that records what the policy asked it to spill, and with
/// `releases` says it released that much (as a store with a disk tier would).
struct SpyStore {
    inner: TierStore,
    spill_asked: AtomicU64,
    releases: bool,
}

impl PageStore for SpyStore {
    fn put(&self, page: &[u8; PAGE]) -> Result<Handle, StoreError> {
        self.inner.put(page)
    }
    fn get(&self, h: Handle, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        self.inner.get(h, out)
    }
    fn remove(&self, h: Handle) {
        self.inner.remove(h)
    }
    fn bytes(&self) -> StoreBytes {
        self.inner.bytes()
    }
    fn spill(&self, bytes: u64) -> u64 {
        self.spill_asked.fetch_add(bytes, Ordering::SeqCst);
        if self.releases {
            bytes
        } else {
            0
        }
    }
}

/// Passes 1-2 over 4 MiB written once, with C4 only at the third pass
/// (patching off: what is at stake is what compression does under pressure).
fn two_passes(cfg: Config, releases: bool) -> (Engine, *mut u8, Vec<u8>, Arc<SpyStore>) {
    let e = Engine::new(Config {
        cold_passes: 3,
        tier_patch: false,
        ..cfg
    });
    let spy = Arc::new(SpyStore {
        inner: TierStore::new(TierConfig::from_engine(&Config::default())).expect("tier store"),
        spill_asked: AtomicU64::new(0),
        releases,
    });
    assert!(e.set_store(spy.clone()));
    let (p, want) = filled(&e, 1024, 600);
    scans(&e, 2);
    (e, p, want, spy)
}

#[test]
fn above_the_high_watermark_c3_pages_are_compressed_until_below_the_low_one() {
    let _s = serial();
    let (calm, p, want, spy) = two_passes(tier_cfg(), false);
    let st = calm.stats();
    assert_eq!(
        (st.evicted_now, st.clock.pressure_passes),
        (0, 0),
        "no watermark: C3 pages stay"
    );
    assert_eq!(spy.spill_asked.load(Ordering::SeqCst), 0);
    assert_eq!(bytes(p, 1024 * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { calm.free(p) };

    let (high, low) = (2u64 << 20, 1u64 << 20);
    let marks = Config {
        high_water: Some(high),
        low_water: Some(low),
        ..tier_cfg()
    };
    // A store whose spill released the excess: nothing more to shed.
    let (spilled, p, want, spy) = two_passes(marks.clone(), true);
    assert!(spy.spill_asked.load(Ordering::SeqCst) >= 3 << 20);
    let st = spilled.stats();
    assert_eq!(
        st.evicted_now, 0,
        "the spill shed the excess: {:?}",
        st.clock
    );
    assert!(st.clock.spilled >= 3 << 20, "{:?}", st.clock);
    assert_eq!(bytes(p, 1024 * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { spilled.free(p) };

    let (e, p, want, spy) = two_passes(marks, false);
    let st = e.stats();
    assert!(st.clock.footprint > high, "{:?}", st.clock);
    assert_eq!(st.clock.pressure_passes, 2);
    assert!(
        spy.spill_asked.load(Ordering::SeqCst) >= 3 << 20,
        "the store is asked to spill the excess first"
    );
    let evicted = st.evicted_now;
    assert!(
        evicted > 500 && evicted < 1024,
        "C3 pages compressed until the excess is shed, not all: {evicted}"
    );
    e.scan();
    let st = e.stats();
    assert!(
        st.clock.footprint < high,
        "below the high watermark after shedding: {:?}",
        st.clock
    );
    assert_eq!(bytes(p, 1024 * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn tiering_off_evicts_nothing() {
    let _s = serial();
    let e = Engine::new(Config {
        tier: Tier::Off,
        ..tier_cfg()
    });
    let (p, want) = filled(&e, 32, 700);
    for _ in 0..6 {
        assert!(!e.scan().pass);
    }
    let st = e.stats();
    assert_eq!((st.evicted, st.clock.passes), (0, 0));
    assert!(resident(p, 32).iter().all(|&r| r));
    assert_eq!(bytes(p, 32 * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn without_userfaultfd_missing_mode_passes_classify_merge_and_evict_nothing() {
    let _s = serial();
    let inject = Inject {
        fail_uffd_missing: true,
        ..Inject::default()
    };
    let e = Engine::new(Config {
        inject,
        ..tier_cfg()
    });
    let (a, a_want) = filled(&e, 16, 800);
    let (b, b_want) = filled(&e, 16, 800);
    scans(&e, 5);
    let st = e.stats();
    assert_eq!(st.evicted, 0);
    assert!(
        st.fallbacks.evict >= 5,
        "each pass counts the missing mode: {:?}",
        st.fallbacks
    );
    assert_eq!(st.merged, 16, "sharing still works");
    assert!(
        st.clock.last.c4 >= 16,
        "the clock still classifies: {:?}",
        st.clock
    );
    assert_eq!(bytes(a, 16 * PAGE), &a_want[..]);
    assert_eq!(bytes(b, 16 * PAGE), &b_want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e.free(b);
    }
}

#[test]
fn incompressible_pages_are_offered_once_until_written() {
    let _s = serial();
    let e = Engine::new(tier_cfg());
    let n = 8;
    let p = e.alloc(n * PAGE, Hint::None);
    let mut want: Vec<u8> = (0..n as u64)
        .flat_map(|k| incompressible(2 * k + 1))
        .collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    scans(&e, 8); // C4 from the third pass on
    let c = e.stats().clock;
    assert_eq!(
        (c.total.refused, c.total.evicted),
        (n as u64, 0),
        "refused once each: {c:?}"
    );
    assert!(c.total.incompressible >= n as u64, "then left alone: {c:?}");
    assert!(
        c.total.c4 < 4 * n as u64,
        "and looked at only as the smart scan would: {c:?}"
    );
    // New, compressible content: seen by the smart scan's next look (at
    // most 8 scans), then cold after two passes, offered again and taken.
    let fresh = pattern(900);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(fresh.as_ptr(), p, PAGE) };
    want[..PAGE].copy_from_slice(&fresh);
    let mut passes = 0;
    while resident(p, 1)[0] {
        assert!(
            passes < 8 + 3,
            "a written incompressible page was never offered again: {:?}",
            e.stats().clock
        );
        e.scan();
        passes += 1;
    }
    let c = e.stats().clock;
    assert_eq!((c.total.refused, c.total.evicted), (n as u64, 1), "{c:?}");
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn a_copy_of_evicted_pages_shares_them_instead_of_copying_plainly() {
    let _s = serial();
    let e = Engine::new(tier_cfg());
    let n = 16;
    let (p, want) = filled(&e, n, 1000);
    scans(&e, 3);
    assert_eq!(e.stats().evicted_now, n as u64);
    let dst = e.alloc(n * PAGE, Hint::None);
    let before = e.stats();
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(dst, p, n * PAGE) };
    let after = e.stats();
    assert_eq!(
        after.pages_shared_by_copy - before.pages_shared_by_copy,
        n as u64,
        "{after:?}"
    );
    assert_eq!(after.bytes_copied_plain, before.bytes_copied_plain);
    assert_eq!(
        after.restored_by_engine - before.restored_by_engine,
        n as u64
    );
    assert_eq!(bytes(dst, n * PAGE), &want[..]);
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(p);
        e.free(dst);
    }
}

#[test]
fn the_policy_patches_similar_cold_pages_against_a_reference_and_they_read_back_exactly() {
    let _s = serial();
    // Compression off: only patching can take these pages.
    let e = Engine::new(Config {
        cold_passes: 1,
        tier_compress: false,
        ..tier_cfg()
    });
    let n = 64;
    let p = e.alloc(n * PAGE, Hint::None);
    assert!(!p.is_null());
    // One random-looking base; every page differs from it in 16 bytes (DE's write pattern).
    let base = incompressible(0x9e37);
    let mut want = Vec::with_capacity(n * PAGE);
    for k in 0..n {
        let mut page = base.clone();
        (0..16).for_each(|j| page[j * 256 + 3] = (k as u8).wrapping_add(j as u8) | 1);
        want.extend_from_slice(&page);
    }
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    scans(&e, 4);
    let st = e.stats();
    assert!(
        st.patched_now >= n as u64 / 2,
        "most similar cold pages are patches: {st:?}"
    );
    assert_eq!(
        st.evicted_now, st.patched_now,
        "nothing compressed with compression off"
    );
    assert!(
        st.patch_bytes < st.patched_now * 512,
        "patches are small: {st:?}"
    );
    // Writing every page (the reference included) restores and changes them; nothing is lost.
    for k in 0..n {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { *p.add(k * PAGE + 100) ^= 0x5a };
        want[k * PAGE + 100] ^= 0x5a;
    }
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    scans(&e, 4);
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}

#[test]
fn a_page_without_a_reference_is_not_offered_a_patch_again_until_written() {
    let _s = serial();
    let e = Engine::new(Config {
        cold_passes: 1,
        tier_compress: false,
        ..tier_cfg()
    });
    let n = 32;
    let p = e.alloc(n * PAGE, Hint::None);
    // Distinct random pages: none is similar to another.
    let mut want: Vec<u8> = (0..n as u64)
        .flat_map(|k| incompressible(0x2545 + k))
        .collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), p, want.len()) };
    scans(&e, 4);
    let tried = e.stats().patch_work_ns;
    assert!(tried > 0, "cold pages were offered a patch");
    assert_eq!(e.stats().patched_now, 0, "no reference for random pages");
    scans(&e, 4);
    assert_eq!(
        e.stats().patch_work_ns,
        tried,
        "not offered again while unwritten"
    );
    // A write (seen by the next look) makes the page a candidate again.
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *p.add(5 * PAGE + 9) ^= 1 };
    want[5 * PAGE + 9] ^= 1;
    scans(&e, 4);
    assert!(
        e.stats().patch_work_ns > tried,
        "a written page is offered again"
    );
    assert_eq!(bytes(p, n * PAGE), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(p) };
}
