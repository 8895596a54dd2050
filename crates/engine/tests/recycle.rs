//! Recycled blocks (recycle.rs): a freed block that was all its own comes
//! back to a same-sized `Hint::Uninit` allocation (several smaller ones laid
//! side by side to a larger one), never to one that needs
//! zeroed memory, never when it shared frames with another block, and goes
//! away after the age limit, over the budget, before fork, and before fresh
//! memory would take the process past its peak. Off by default (the preload
//! turns it on). The test that forks runs in a process of its
//! own (`common::in_own_process`), so its child finds no lock held by another
//! test's thread.

mod common;
use pagefold_engine::{Config, Engine, Hint, PAGE};

/// An engine keeping up to `recycle_mb` of freed blocks. The peak rule is
/// off: it reads the process's resident bytes, which the tests running
/// beside this one move; its own tests run in processes of their own.
fn engine(recycle_mb: usize) -> Engine {
    Engine::new(Config {
        recycle_bytes: recycle_mb << 20,
        recycle_under_peak: false,
        ..Config::default()
    })
}

fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(p, byte, len) };
}

fn all(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|&b| b == byte)
}

#[test]
fn a_freed_block_serves_the_next_uninit_allocation_of_its_size() {
    let e = engine(32);
    let len = 16 * PAGE;
    let a = e.alloc(len, Hint::Uninit);
    fill(a, len, 7);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    assert_eq!(e.stats().recycled_bytes, len as u64);
    let other_size = e.alloc(3 * PAGE, Hint::Uninit);
    assert_ne!(
        other_size, a,
        "a block over four times the request is not cut up"
    );
    let b = e.alloc(len, Hint::Uninit);
    assert_eq!(b, a);
    assert!(
        all(b, len, 7),
        "a recycled block keeps its bytes, as a reused heap chunk does"
    );
    let s = e.stats();
    assert_eq!((s.recycled, s.recycled_bytes), (1, 0));
    fill(b, len, 9);
    assert!(all(b, len, 9));
    assert_eq!(e.block_len(b), Some(len));
}

/// A fresh block of `len` asked with `first` reads zero; written and freed,
/// it comes back as it was to the next allocation asked with `again`.
fn freed_block_comes_back(e: &Engine, len: usize, first: Hint, again: Hint) {
    let fresh = e.alloc(len, first);
    assert!(all(fresh, len, 0), "fresh memory is zero, populated or not");
    fill(fresh, len, 0x5A);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(fresh) };
    let reused = e.alloc(len, again);
    assert_eq!(reused, fresh);
    assert!(all(reused, len, 0x5A), "it comes back as it was");
    assert_eq!(e.stats().recycled, 1);
    // SAFETY: as above.
    unsafe { e.free(reused) };
}

#[test]
fn a_result_written_whole_reuses_a_freed_block_and_fresh_ones_read_zero() {
    let e = engine(32);
    freed_block_comes_back(&e, 16 * PAGE, Hint::UninitFullWrite, Hint::UninitFullWrite);
}

#[test]
fn a_larger_block_is_split_and_its_tail_stays_recycled() {
    let e = engine(32);
    let a = e.alloc(16 * PAGE, Hint::Uninit);
    fill(a, 16 * PAGE, 2);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    let head = e.alloc(8 * PAGE, Hint::Uninit);
    assert_eq!(head, a);
    assert_eq!(e.block_len(head), Some(8 * PAGE));
    assert_eq!(e.stats().recycled_bytes, 8 * PAGE as u64);
    let tail = e.alloc(8 * PAGE, Hint::Uninit);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(tail, unsafe { a.add(8 * PAGE) });
    fill(head, 8 * PAGE, 3);
    assert!(all(tail, 8 * PAGE, 2), "the halves are separate blocks");
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(head) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(tail) };
    common::assert_all_given_back(&e, "");
}

#[test]
fn smaller_blocks_laid_side_by_side_serve_a_larger_allocation() {
    let e = engine(32);
    let len = 8 * PAGE;
    let freed: Vec<*mut u8> = (1..=3u8)
        .map(|byte| {
            let p = e.alloc(len, Hint::Uninit);
            fill(p, len, byte);
            p
        })
        .collect();
    for &p in &freed {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses
        // it after this free.
        unsafe { e.free(p) };
    }
    let fresh = e.stats().fresh_pages;
    let j = e.alloc(20 * PAGE, Hint::Uninit);
    let s = e.stats();
    assert_eq!((s.recycled, s.recycled_joined), (1, 1), "{s:?}");
    assert_eq!(s.fresh_pages, fresh, "no fresh page for the joined block");
    assert_eq!(
        s.recycled_bytes,
        4 * PAGE as u64,
        "the oldest block's cut tail"
    );
    assert_eq!(e.block_len(j), Some(20 * PAGE));
    // SAFETY: offsets inside the 20-page block.
    let (second, third) = unsafe { (j.add(len), j.add(2 * len)) };
    assert!(
        all(j, len, 3) && all(second, len, 2) && all(third, 4 * PAGE, 1),
        "the blocks moved, newest first, with their pages: nothing was faulted afresh"
    );
    assert!(
        common::maps_in(j as usize, j as usize + 20 * PAGE) <= s.vmas_used as usize,
        "the mapping budget counts at least the mappings the joined block has: {s:?}"
    );
    fill(j, 20 * PAGE, 4);
    assert!(all(j, 20 * PAGE, 4));
    let tail = e.alloc(4 * PAGE, Hint::Uninit);
    // SAFETY: the tail starts 4 pages into the oldest block.
    assert_eq!(tail, unsafe { freed[0].add(4 * PAGE) });
    assert!(all(tail, 4 * PAGE, 1), "the cut tail kept its pages");
    for p in [j, tail] {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses
        // it after this free.
        unsafe { e.free(p) };
    }
    common::assert_all_given_back(&e, "");
}

#[test]
fn blocks_that_do_not_add_up_to_the_request_are_left_alone() {
    let e = engine(32);
    let a = e.alloc(8 * PAGE, Hint::Uninit);
    fill(a, 8 * PAGE, 1);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    let big = e.alloc(9 * PAGE, Hint::Uninit);
    let s = e.stats();
    assert_eq!(
        (s.recycled, s.recycled_bytes),
        (0, 8 * PAGE as u64),
        "{s:?}"
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(big) };
    assert_eq!(e.alloc(8 * PAGE, Hint::Uninit), a, "still there, whole");
}

#[test]
fn the_age_limit_is_configurable() {
    let e = Engine::new(Config {
        recycle_bytes: 32 << 20,
        recycle_age: std::time::Duration::from_secs(60),
        ..Config::default()
    });
    let a = e.alloc(8 * PAGE, Hint::Uninit);
    fill(a, 8 * PAGE, 1);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    e.scan();
    assert_eq!(
        e.stats().recycled_bytes,
        8 * PAGE as u64,
        "kept past the default 250 ms"
    );
    let e = Engine::new(Config {
        recycle_bytes: 32 << 20,
        recycle_age: std::time::Duration::ZERO,
        ..Config::default()
    });
    let a = e.alloc(8 * PAGE, Hint::Uninit);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    std::thread::sleep(std::time::Duration::from_millis(5));
    e.scan();
    assert_eq!(
        e.stats().recycled_bytes,
        0,
        "age 0: given back at the next check"
    );
}

#[test]
fn blocks_idle_longer_than_the_age_limit_are_released() {
    let e = engine(32);
    let a = e.alloc(8 * PAGE, Hint::Uninit);
    fill(a, 8 * PAGE, 1);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b = e.alloc(8 * PAGE, Hint::None);
    assert!(all(b, 8 * PAGE, 0));
    assert_eq!(
        e.stats().recycled_bytes,
        0,
        "expired on the next allocation"
    );
}

#[test]
fn zeroed_allocations_never_get_a_recycled_block() {
    let e = engine(32);
    let len = 8 * PAGE;
    let a = e.alloc(len, Hint::Uninit);
    fill(a, len, 0xAB);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    let z = e.alloc(len, Hint::None);
    assert!(all(z, len, 0), "Hint::None promises zero-filled memory");
    assert_eq!(e.stats().recycled, 0);
}

#[test]
fn a_recycled_block_serves_only_allocations_that_start_on_its_kind_of_memory() {
    let e = engine(32);
    let len = 8 * PAGE;
    // A zeroed block starts anonymous (its size was never copied from).
    let z = e.alloc(len, Hint::Zeroed);
    fill(z, len, 0x5A);
    assert_eq!(e.stats().frames_in_use, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(z) };
    assert_eq!(
        e.stats().recycled_bytes,
        len as u64,
        "anonymous blocks recycle too"
    );
    // A malloc of that size starts on frames (the default): the anonymous
    // block does not serve it, whole or laid side by side.
    let a = e.alloc(len, Hint::Uninit);
    let b = e.alloc(2 * len, Hint::Uninit);
    let s = e.stats();
    assert_eq!(s.recycled, 0, "{s:?}");
    assert_eq!(s.frames_in_use, 3 * 8, "both on frames: {s:?}");
    assert_ne!(a, z);
    // SAFETY: as above.
    unsafe {
        e.free(a);
        e.free(b);
    }
}

#[test]
fn anonymous_blocks_serve_mallocs_that_start_anonymous() {
    let e = Engine::new(Config {
        recycle_bytes: 32 << 20,
        fresh: pagefold_engine::Fresh::Anon,
        ..Config::default()
    });
    freed_block_comes_back(&e, 8 * PAGE, Hint::Zeroed, Hint::Uninit);
}

/// An engine that leaves every allocation it is offered to the caller's
/// allocator (`take`): blocks start anonymous, no size is taken to learn
/// (beyond its first block), none is copied from.
fn declining_engine(under_peak: bool) -> Engine {
    Engine::new(Config {
        recycle_bytes: 16 << 20,
        recycle_under_peak: under_peak,
        fresh: pagefold_engine::Fresh::Adaptive,
        plain_below: 64 << 20,
        take_first: 0,
        ..Config::default()
    })
}

#[test]
fn blocks_sharing_frames_are_not_recycled() {
    let e = engine(32);
    let len = 8 * PAGE;
    let src = e.alloc(len, Hint::Uninit);
    fill(src, len, 3);
    let dst = e.alloc(len, Hint::Uninit);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(dst, src, len) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(src) };
    assert_eq!(e.stats().recycled_bytes, 0, "src's frames are dst's too");
    let again = e.alloc(len, Hint::Uninit);
    assert!(all(dst, len, 3));
    fill(again, len, 4);
    assert!(
        all(dst, len, 3),
        "the copy never sees a write to memory reused after its source was freed"
    );
}

#[test]
fn the_budget_releases_the_oldest_and_scans_release_the_stale() {
    let e = engine(1); // blocks up to 256 KiB, 1 MiB in total
    let len = 64 * PAGE;
    let blocks: Vec<_> = (0..5).map(|_| e.alloc(len, Hint::Uninit)).collect();
    for &b in &blocks {
        fill(b, len, 1);
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        unsafe { e.free(b) };
    }
    assert_eq!(
        e.stats().recycled_bytes,
        4 * len as u64,
        "1 MiB holds four of them"
    );
    let big = e.alloc(512 * PAGE, Hint::Uninit);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(big) };
    assert_eq!(
        e.stats().recycled_bytes,
        4 * len as u64,
        "over a quarter of the budget: released at once"
    );
    e.scan();
    assert_eq!(
        e.stats().recycled_bytes,
        4 * len as u64,
        "freed just now: kept"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    e.scan();
    assert_eq!(
        e.stats().recycled_bytes,
        0,
        "idle past the age limit: a scan releases them"
    );
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn fork_releases_recycled_blocks_first() {
    if !common::in_own_process("fork_releases_recycled_blocks_first") {
        return;
    }
    let e = engine(32);
    let len = 8 * PAGE;
    let a = e.alloc(len, Hint::Uninit);
    fill(a, len, 5);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    assert_eq!(e.stats().recycled_bytes, len as u64);
    // SAFETY: this test runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only this test's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // The child's allocation must not share frames with the parent's.
        let c = e.alloc(len, Hint::Uninit);
        fill(c, len, 0xCC);
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: status is a writable local; waitpid reaps only the given child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(status, 0);
    assert_eq!(e.stats().recycled_bytes, 0);
    let p = e.alloc(len, Hint::Uninit);
    assert!(
        !all(p, len, 0xCC),
        "the child's writes reached the parent's memory"
    );
}

#[test]
fn recycling_off_means_every_free_releases() {
    assert_eq!(Config::default().recycle_bytes, 0);
    let e = engine(0);
    let a = e.alloc(8 * PAGE, Hint::Uninit);
    fill(a, 8 * PAGE, 1);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    let s = e.stats();
    assert_eq!((s.recycled_bytes, s.frames_in_use), (0, 0));
}

#[test]
fn freed_memory_kept_for_reuse_stays_small_beside_what_the_program_holds() {
    let mib = 1 << 20;
    let held_for = |live_mib: usize, percent: u64| {
        let e = Engine::new(Config {
            recycle_bytes: 256 * mib,
            recycle_live_percent: percent,
            ..Config::default()
        });
        let live = e.alloc(live_mib * mib, Hint::Uninit);
        // Eight 8 MiB blocks freed: 64 MiB offered for reuse.
        let freed: Vec<*mut u8> = (0..8).map(|_| e.alloc(8 * mib, Hint::Uninit)).collect();
        for p in freed {
            // SAFETY: blocks this test allocated, freed once, not used after.
            unsafe { e.free(p) };
        }
        let kept = e.stats().recycled_bytes as usize;
        // SAFETY: the block allocated above, freed once.
        unsafe { e.free(live) };
        kept
    };
    // 16 MiB plus 12% of 100 MiB is 28 MiB: three of the eight blocks stay.
    assert_eq!(held_for(100, 12), 24 * mib);
    // A program holding 1 GiB keeps every one of them (16 + 123 MiB).
    assert_eq!(held_for(1024, 12), 64 * mib);
    // Without the share only the fixed budget counts.
    assert_eq!(held_for(100, 0), 64 * mib);
}

/// Runs `body` in a process of its own (its resident bytes and their peak
/// are this test's alone) with the engine `engine` makes there.
fn alone(test_name: &str, engine: impl FnOnce() -> Engine, body: impl FnOnce(&Engine)) {
    if !common::in_own_process(test_name) {
        return;
    }
    body(&engine());
}

/// An engine keeping up to 16 MiB of freed blocks, under the peak rule or
/// not.
fn keeping_engine(under_peak: bool) -> Engine {
    Engine::new(Config {
        recycle_bytes: 16 << 20,
        recycle_under_peak: under_peak,
        ..Config::default()
    })
}

/// Holds three 1 MiB blocks, frees two (kept for reuse), then lets `grow`
/// take the process 5 MiB further; what is kept afterwards.
fn kept_after(e: &Engine, grow: impl FnOnce(&Engine)) -> u64 {
    let mib = 1 << 20;
    let held: Vec<_> = (0..3).map(|_| e.alloc(mib, Hint::Uninit)).collect();
    for &p in &held {
        fill(p, mib, 3);
    }
    // SAFETY: blocks this test allocated, freed once, not used after.
    unsafe {
        e.free(held[0]);
        e.free(held[1]);
    }
    assert_eq!(e.stats().recycled_bytes, 2 * mib as u64);
    grow(e);
    assert!(all(held[2], mib, 3), "live blocks are untouched");
    e.stats().recycled_bytes
}

/// The engine maps 5 MiB that no kept block fits.
fn engine_grows(e: &Engine) {
    let big = e.alloc(5 << 20, Hint::Uninit);
    fill(big, 5 << 20, 4);
}

/// 5 MiB are offered to the engine and left to the caller's allocator,
/// which would map them.
fn caller_grows(e: &Engine) {
    assert_eq!(e.take(5 << 20, Hint::Uninit), None);
}

/// A declining engine that has seen the 5 MiB size once (the first block
/// of a size is not declined); never touched, that block adds nothing
/// resident, and it is too large to keep.
fn declining_engine_that_saw_the_size(under_peak: bool) -> Engine {
    let e = declining_engine(under_peak);
    let seen = e.alloc(5 << 20, Hint::Uninit);
    // SAFETY: the block allocated above, freed once, not used after.
    unsafe { e.free(seen) };
    e
}

#[test]
fn kept_blocks_never_raise_the_peak() {
    alone(
        "kept_blocks_never_raise_the_peak",
        || keeping_engine(true),
        |e| {
            assert_eq!(
                kept_after(e, engine_grows),
                0,
                "the process grows past its peak: nothing kept stays beside it"
            );
        },
    );
}

#[test]
fn kept_blocks_never_raise_the_peak_beside_the_callers_heap() {
    alone(
        "kept_blocks_never_raise_the_peak_beside_the_callers_heap",
        || declining_engine_that_saw_the_size(true),
        |e| assert_eq!(kept_after(e, caller_grows), 0),
    );
}

#[test]
fn without_the_peak_rule_kept_blocks_stay_beside_the_callers_heap() {
    alone(
        "without_the_peak_rule_kept_blocks_stay_beside_the_callers_heap",
        || declining_engine_that_saw_the_size(false),
        |e| assert_eq!(kept_after(e, caller_grows), 2 << 20),
    );
}

#[test]
fn without_the_peak_rule_kept_blocks_stay_beside_fresh_memory() {
    alone(
        "without_the_peak_rule_kept_blocks_stay_beside_fresh_memory",
        || keeping_engine(false),
        |e| assert_eq!(kept_after(e, engine_grows), 2 << 20),
    );
}

#[test]
fn a_program_that_shrank_keeps_its_freed_blocks_for_reuse() {
    alone(
        "a_program_that_shrank_keeps_its_freed_blocks_for_reuse",
        || keeping_engine(true),
        |e| {
            let mib = 1 << 20;
            // 8 MiB resident once, then freed (too large to keep: over a
            // quarter of the budget): the peak stays far above what follows.
            let ballast = e.alloc(8 * mib, Hint::Uninit);
            fill(ballast, 8 * mib, 2);
            // SAFETY: the block allocated above, freed once, not used after.
            unsafe { e.free(ballast) };
            assert_eq!(e.stats().recycled_bytes, 0);
            let a = e.alloc(mib, Hint::Uninit);
            fill(a, mib, 1);
            // SAFETY: the block allocated above, freed once, not used after.
            unsafe { e.free(a) };
            // Fresh memory too small to cut the kept block for, well under
            // the peak: the kept block stays, and serves its size again.
            let c = e.alloc(3 * PAGE, Hint::Uninit);
            assert_eq!(e.stats().recycled_bytes, mib as u64);
            assert_eq!(e.alloc(mib, Hint::Uninit), a, "the kept block is reused");
            // SAFETY: blocks this test allocated, freed once, not used after.
            unsafe {
                e.free(a);
                e.free(c);
            }
        },
    );
}
