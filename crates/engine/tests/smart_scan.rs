//! The smart scan (idle.rs): pages earlier scans found nothing to do with are
//! looked at less often, yet zero pages and duplicates that appear among
//! them are still found, within one full-look period (8 scans). And sampled
//! blocks (sample.rs): a block that yields nothing is looked at one page in
//! 16, yet a zeroed or duplicated run of 16 pages in it is still found, and
//! then the whole block is looked at again; blocks of a size whose blocks
//! yielded nothing start sampled.

mod common;

use pagefold_engine::{Config, Engine, Fresh, Hint, PAGE};

/// Every page different from every other (and from any other test's pages).
fn fill_unique(p: *mut u8, pages: usize, seed: u64) {
    for k in 0..pages {
        let words =
            // SAFETY: the pointer and length describe a live block of this test, which outlives
            // every use of the slice.
            unsafe { std::slice::from_raw_parts_mut(p.add(k * PAGE) as *mut u64, PAGE / 8) };
        for (w, word) in words.iter_mut().enumerate() {
            *word = (seed << 40) ^ ((k as u64) << 16) ^ w as u64 ^ 0x9e37_79b9_7f4a_7c15;
        }
    }
}

/// An engine whose scans look at pages by their idle level alone (no
/// sampled blocks: the tests at the end cover those).
fn engine(smart: bool) -> Engine {
    Engine::new(Config {
        smart_scan: smart,
        sample_scan: false,
        ..Config::default()
    })
}

#[test]
fn unchanging_unique_pages_are_looked_at_less_often_and_all_together_every_8th_scan() {
    let pages = 256;
    let e = engine(true);
    let p = e.alloc(pages * PAGE, Hint::None);
    fill_unique(p, pages, 1);
    let looked: Vec<u64> = (0..17).map(|_| e.scan().pages_scanned).collect();
    let all = pages as u64;
    assert_eq!(
        looked,
        [all, all, all, 0, all, 0, 0, 0, all, 0, 0, 0, 0, 0, 0, 0, all],
        "scans 0, 1, 2, 4, then every 8th"
    );
    assert!(e.stats().scan_skipped_idle >= 11 * all);

    let plain = engine(false);
    let q = plain.alloc(pages * PAGE, Hint::None);
    fill_unique(q, pages, 2);
    assert!(
        (0..6).all(|_| plain.scan().pages_scanned == all),
        "smart scan off: every page every scan"
    );
    assert_eq!(plain.stats().scan_skipped_idle, 0);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(p);
        plain.free(q);
    }
}

#[test]
fn a_duplicate_of_an_idle_page_is_still_merged() {
    let pages = 64;
    let e = engine(true);
    let a = e.alloc(pages * PAGE, Hint::None);
    fill_unique(a, pages, 3);
    for _ in 0..6 {
        e.scan(); // a's pages reach the top idle level
    }
    let b = e.alloc(pages * PAGE, Hint::None);
    fill_unique(b, pages, 4);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(a.add(10 * PAGE), b.add(20 * PAGE), PAGE) };
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    let before = unsafe { std::slice::from_raw_parts(b, pages * PAGE) }.to_vec();
    let mut scans = 0;
    while e.stats().merged == 0 && scans < 10 {
        e.scan();
        scans += 1;
    }
    assert_eq!(e.stats().merged, 1, "merged within {scans} scans");
    assert!(
        scans <= 9,
        "idle pages are all looked at every 8th scan; took {scans}"
    );
    assert_eq!(
        // SAFETY: the pointer and length describe a live block of this test, which outlives every
        // use of the slice.
        unsafe { std::slice::from_raw_parts(b, pages * PAGE) },
        &before[..]
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e.free(b);
    }
}

#[test]
fn an_idle_page_the_program_zeroes_is_still_folded() {
    let pages = 32;
    let e = engine(true);
    let a = e.alloc(pages * PAGE, Hint::None);
    fill_unique(a, pages, 5);
    for _ in 0..6 {
        e.scan();
    }
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { std::ptr::write_bytes(a.add(7 * PAGE), 0, PAGE) };
    let mut scans = 0;
    while e.stats().zero_folded == 0 && scans < 20 {
        e.scan();
        scans += 1;
    }
    assert_eq!(e.stats().zero_folded, 1, "folded within {scans} scans");
    assert!(
        scans <= 17,
        "two full looks at most (the volatility check needs both); took {scans}"
    );
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    let bytes = unsafe { std::slice::from_raw_parts(a, pages * PAGE) };
    assert!(bytes[7 * PAGE..8 * PAGE].iter().all(|&x| x == 0));
    assert!(bytes[8 * PAGE..].iter().any(|&x| x != 0));
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
}

/// Writes zeros over pages `[from, to)` of the block at `p`.
fn zero_pages(p: *mut u8, from: usize, to: usize) {
    // SAFETY: callers pass page ranges inside a live block of this test.
    unsafe { std::ptr::write_bytes(p.add(from * PAGE), 0, (to - from) * PAGE) };
}

/// Zero pages folded by at most `scans` scans, stopping once `want` are.
fn folded_within(e: &Engine, want: u64, scans: usize) -> u64 {
    let mut folded = 0;
    for _ in 0..scans {
        folded += e.scan().zero_folded;
        if folded == want {
            break;
        }
    }
    folded
}

/// Asserts that each page in `pages` of the block at `p` reads zero.
fn assert_reads_zero(p: *const u8, pages: impl Iterator<Item = usize>) {
    for k in pages {
        // SAFETY: callers pass pages inside a live block of this test, read only.
        let page = unsafe { std::slice::from_raw_parts(p.add(k * PAGE), PAGE) };
        assert!(page.iter().all(|&b| b == 0), "page {k}");
    }
}

#[test]
fn a_fruitless_block_is_sampled_and_a_zeroed_run_in_it_ends_the_sampling() {
    let pages = 256;
    let e = Engine::new(Config {
        smart_scan: false,
        ..Config::default()
    });
    let p = e.alloc(pages * PAGE, Hint::None);
    fill_unique(p, pages, 9);
    let looked: Vec<u64> = (0..4).map(|_| e.scan().pages_scanned).collect();
    assert_eq!(
        looked,
        [256, 256, 16, 16],
        "two fruitless scans, then one page in 16"
    );
    // A zeroed run of 16 pages covers a sampled page; a shorter run elsewhere
    // does not, but is found once the block is looked at whole again.
    zero_pages(p, 40, 56);
    zero_pages(p, 100, 104);
    assert_eq!(folded_within(&e, 20, 8), 20, "{:?}", e.stats());
    assert_reads_zero(p, (40..56).chain(100..104));
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
}

#[test]
fn sampling_can_be_switched_off() {
    let pages = 64;
    let e = Engine::new(Config {
        smart_scan: false,
        sample_scan: false,
        ..Config::default()
    });
    let p = e.alloc(pages * PAGE, Hint::None);
    fill_unique(p, pages, 10);
    assert!((0..5).all(|_| e.scan().pages_scanned == pages as u64));
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
}

#[test]
fn two_sampled_blocks_that_become_duplicates_merge_in_full() {
    let pages = 64;
    let e = Engine::new(Config {
        smart_scan: false,
        ..Config::default()
    });
    let a = e.alloc(pages * PAGE, Hint::None);
    let b = e.alloc(pages * PAGE, Hint::None);
    fill_unique(a, pages, 11);
    fill_unique(b, pages, 12);
    for _ in 0..3 {
        e.scan();
    }
    assert!(e.scan().pages_scanned <= 2 * 4, "both blocks are sampled");
    // b becomes a duplicate of a, page for page (plainly written, no copy).
    // SAFETY: two live, distinct blocks of `pages` pages each.
    unsafe { std::ptr::copy_nonoverlapping(a, b, pages * PAGE) };
    let mut scans = 0;
    while e.stats().pages_saved_by_sharing < pages as u64 && scans < 12 {
        e.scan();
        scans += 1;
    }
    let s = e.stats();
    assert_eq!(
        s.pages_saved_by_sharing, pages as u64,
        "after {scans} scans: {s:?}"
    );
    // SAFETY: the blocks this test allocated, freed once each.
    unsafe {
        e.free(a);
        e.free(b);
    }
}

/// A chunk none of whose pages can be folded or merged is looked at without
/// write protection (`look_first`): unique pages are never protected, however
/// often they are scanned. A plainly written duplicate of a block and a zeroed
/// run in another are then folded and merged as when every chunk is protected
/// for its look (`look_first` off, which protects every chunk with a page due),
/// and every byte reads back as written. The zeroed run lies in a sampled
/// block: the pages that turned zero keep the whole block due (sample.rs),
/// so all 64 fold, not only the sampled ones.
#[test]
fn chunks_with_nothing_to_fold_or_merge_are_looked_at_unprotected() {
    let pages = 2048;
    for look_first in [true, false] {
        let e = Engine::new(Config {
            look_first,
            ..Config::default()
        });
        let a = e.alloc(pages * PAGE, Hint::None);
        let quiet = e.alloc(pages * PAGE, Hint::None);
        fill_unique(a, pages, 21);
        fill_unique(quiet, pages, 22);
        for _ in 0..4 {
            e.scan();
        }
        let s = e.stats();
        if look_first {
            assert_eq!(s.scan_chunks_protected, 0, "{s:?}");
            assert!(s.scan_chunks_unprotected >= 2 * 4, "{s:?}");
        } else {
            assert_eq!(s.scan_chunks_unprotected, 0, "{s:?}");
            assert!(s.scan_chunks_protected >= 2 * 4, "{s:?}");
        }
        let b = e.alloc(pages * PAGE, Hint::None);
        // SAFETY: live, distinct blocks of `pages` pages each; the zeroed run
        // lies inside `quiet`.
        unsafe {
            std::ptr::copy_nonoverlapping(a, b, pages * PAGE);
            std::ptr::write_bytes(quiet.add(100 * PAGE), 0, 64 * PAGE);
        }
        let mut want = vec![0u8; pages * PAGE];
        fill_unique(want.as_mut_ptr(), pages, 22);
        want[100 * PAGE..164 * PAGE].fill(0);
        let mut scans = 0;
        while (e.stats().merged < pages as u64 || e.stats().zero_folded < 64) && scans < 16 {
            e.scan();
            scans += 1;
        }
        let s = e.stats();
        assert_eq!(
            (s.merged, s.zero_folded),
            (pages as u64, 64),
            "look_first {look_first}, after {scans} scans: {s:?}"
        );
        // SAFETY: the blocks this test allocated, read while live.
        let (got_a, got_b, got_quiet) = unsafe {
            (
                std::slice::from_raw_parts(a, pages * PAGE).to_vec(),
                std::slice::from_raw_parts(b, pages * PAGE),
                std::slice::from_raw_parts(quiet, pages * PAGE),
            )
        };
        assert!(got_a == got_b && got_quiet == &want[..]);
        // SAFETY: the blocks this test allocated, freed once each.
        unsafe {
            e.free(a);
            e.free(b);
            e.free(quiet);
        }
    }
}

/// Whether the page at `p` is in this process's page tables (pagemap bit 63).
fn mapped(p: *const u8) -> bool {
    common::pagemap_entry(p) >> 63 == 1
}

/// A scan reads a copy's shared pages through the frame window: the copy's
/// own mapping stays unpopulated, so the program's first write to a page of
/// it is one copy-on-write fault, not a read-only mapping and then a fault.
#[test]
fn scans_read_shared_pages_without_mapping_them_into_the_copy() {
    let pages = 64;
    let e = engine(true);
    let a = e.alloc(pages * PAGE, Hint::None);
    let b = e.alloc(pages * PAGE, Hint::None);
    fill_unique(a, pages, 31);
    let want = common::bytes(a, pages * PAGE).to_vec();
    // SAFETY: a and b are live blocks of pages * PAGE bytes; a is freed once
    // and not used after.
    unsafe {
        e.copy(b, a, pages * PAGE);
        e.free(a);
    }
    assert!(e.stats().pages_shared_by_copy >= pages as u64);
    let scanned: u64 = (0..3).map(|_| e.scan().pages_scanned).sum();
    assert!(scanned >= pages as u64, "the copy's pages were looked at");
    // SAFETY: b is a live block of pages * PAGE bytes.
    let unmapped = (0..pages)
        .filter(|&k| !mapped(unsafe { b.add(k * PAGE) }))
        .count();
    assert_eq!(unmapped, pages, "pages of the copy mapped by the scan");
    assert!(common::bytes(b, pages * PAGE) == want);
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(b) };
}

#[test]
fn new_blocks_of_a_size_that_yielded_nothing_start_sampled_and_a_zeroed_run_still_folds() {
    let pages = 256;
    let e = Engine::new(Config {
        smart_scan: false,
        ..Config::default()
    });
    // Two blocks of one size, each looked at whole once and found fruitless.
    for seed in [20, 21] {
        let p = e.alloc(pages * PAGE, Hint::None);
        fill_unique(p, pages, seed);
        assert_eq!(e.scan().pages_scanned, pages as u64);
        // SAFETY: the block this loop allocated, freed once.
        unsafe { e.free(p) };
    }
    assert_eq!(e.stats().blocks_started_sampled, 0);
    // The next block of that size starts sampled; one of another size does not.
    let p = e.alloc(pages * PAGE, Hint::None);
    fill_unique(p, pages, 22);
    let other = e.alloc((pages + 1) * PAGE, Hint::None);
    fill_unique(other, pages + 1, 23);
    assert_eq!(e.stats().blocks_started_sampled, 1);
    assert_eq!(e.scan().pages_scanned, (pages / 16 + pages + 1) as u64);
    // A zeroed run of 16 pages covers a sampled page: it ends the sampling,
    // and the whole run folds.
    zero_pages(p, 80, 96);
    assert_eq!(folded_within(&e, 16, 6), 16, "{:?}", e.stats());
    assert_reads_zero(p, 80..96);
    // The block was fruitful: new blocks of its size start whole again.
    let q = e.alloc(pages * PAGE, Hint::None);
    fill_unique(q, pages, 24);
    assert_eq!(e.stats().blocks_started_sampled, 1);
    // SAFETY: the blocks this test allocated, freed once each.
    unsafe {
        e.free(p);
        e.free(other);
        e.free(q);
    }
}

#[test]
fn two_blocks_of_one_size_equal_page_for_page_merge_whole_at_their_second_look() {
    let pages = 64;
    let e = Engine::new(Config {
        smart_scan: false,
        ..Config::default()
    });
    let a = e.alloc(pages * PAGE, Hint::None);
    let b = e.alloc(pages * PAGE, Hint::None);
    fill_unique(a, pages, 30);
    fill_unique(b, pages, 30);
    // Both are fruitless at their first look, which makes their size
    // sampled for new blocks, but not for them.
    e.scan();
    assert_eq!(e.scan().merged, pages as u64, "{:?}", e.stats());
    // SAFETY: the blocks this test allocated, freed once each.
    unsafe {
        e.free(a);
        e.free(b);
    }
}

/// Pages `2j` and `2j + 1` equal, every pair different (`seed` apart from
/// other fills).
fn fill_pairs(p: *mut u8, pages: usize, seed: u64) {
    for k in 0..pages {
        let words =
            // SAFETY: the pointer and length describe a live block of this test, which outlives
            // every use of the slice.
            unsafe { std::slice::from_raw_parts_mut(p.add(k * PAGE) as *mut u64, PAGE / 8) };
        for (w, word) in words.iter_mut().enumerate() {
            *word = (seed << 40) ^ (((k / 2) as u64) << 16) ^ w as u64 ^ 0x2545_f491_4f6c_dd1d;
        }
    }
}

/// Asserts that the block at `p` holds what `fill_pairs(p, pages, seed)` wrote.
fn assert_pairs(p: *const u8, pages: usize, seed: u64) {
    for k in 0..pages {
        // SAFETY: callers pass a live block of this test, read only.
        let words = unsafe { std::slice::from_raw_parts(p.add(k * PAGE) as *const u64, PAGE / 8) };
        for (w, &word) in words.iter().enumerate() {
            let want = (seed << 40) ^ (((k / 2) as u64) << 16) ^ w as u64 ^ 0x2545_f491_4f6c_dd1d;
            assert_eq!(word, want, "page {k} word {w}");
        }
    }
}

/// A program that, every `every` scans, writes duplicate pairs into the
/// next 8 pages of a block and overwrites the 8 before with unique content
/// (R's random forest rewrites its work arrays tree after tree), beside a
/// block of duplicate pairs it never writes: pages merged over `scans`
/// scans, pages sharing at the end, and the block rests counted.
fn merges_while_rewriting(churn_rest: bool, scans: u64, every: u64) -> (u64, u64, u64) {
    let pages = 8 * (scans / every + 1) as usize;
    // As under the preload: blocks on anonymous memory, a pin age.
    let pin_age = std::time::Duration::from_millis(1);
    let e = Engine::new(Config {
        smart_scan: false,
        sample_scan: false,
        churn_rest,
        pin_age,
        fresh: Fresh::Anon,
        ..Config::default()
    });
    let churning = e.alloc(pages * PAGE, Hint::None);
    fill_unique(churning, pages, 100);
    let region = |r: u64| {
        // SAFETY: region r of the block, inside it for every round this test runs.
        unsafe { churning.add(8 * r as usize * PAGE) }
    };
    let steady = e.alloc(64 * PAGE, Hint::None);
    fill_pairs(steady, 64, 1);
    let (mut round, mut merged) = (0, 0);
    fill_pairs(region(0), 8, 1000);
    for n in 1..=scans {
        std::thread::sleep(2 * pin_age);
        merged += e.scan().merged;
        if n % every == 0 {
            fill_unique(region(round), 8, 2000 + round);
            round += 1;
            fill_pairs(region(round), 8, 1000 + round);
        }
    }
    for r in 0..round {
        let mut want = vec![0u8; 8 * PAGE];
        fill_unique(want.as_mut_ptr(), 8, 2000 + r);
        // SAFETY: region r of the live block, read only.
        let got = unsafe { std::slice::from_raw_parts(region(r), 8 * PAGE) };
        assert!(got == &want[..], "region {r} reads what was written last");
    }
    eprintln!("churn_rest {churn_rest}: merged {merged}");
    assert_pairs(region(round), 8, 1000 + round);
    assert_pairs(steady, 64, 1);
    let s = e.stats();
    // SAFETY: the blocks this test allocated, each freed once.
    unsafe {
        e.free(churning);
        e.free(steady);
    }
    (merged, s.pages_sharing, s.block_rests)
}

#[test]
fn a_block_whose_merges_the_program_undoes_is_looked_at_less_often() {
    let (scans, every) = (48, 3);
    let (merged_off, _, rests_off) = merges_while_rewriting(false, scans, every);
    let (merged, sharing, rests) = merges_while_rewriting(true, scans, every);
    assert_eq!(rests_off, 0, "no block rests with the rest switched off");
    assert!(rests > 0, "the rewritten block rests");
    // Without rest each round's pairs merge (16 rounds of 4 pages, plus the
    // steady block's 32); resting, looks 4 or 8 scans apart see each
    // round's pages change between them.
    assert!(
        merged_off >= 32 + 12 * 4,
        "without rest every round's pairs merge: {merged_off}"
    );
    assert!(
        merged * 2 <= merged_off,
        "resting merges half as much or less: {merged} against {merged_off}"
    );
    assert!(
        sharing >= 64,
        "the steady block's pairs stay merged: {sharing} pages sharing"
    );
}

/// A program that zeroes a block for two scans and writes it for one, over
/// and over, beside a block that stays zero: zero pages folded over 24
/// scans, and the stats.
fn folds_while_refilling(churn_rest: bool) -> (u64, pagefold_engine::Stats) {
    let pages = 64;
    let e = Engine::new(Config {
        smart_scan: false,
        sample_scan: false,
        churn_rest,
        ..Config::default()
    });
    let refilled = e.alloc(pages * PAGE, Hint::None);
    let kept = e.alloc(pages * PAGE, Hint::None);
    zero_pages(kept, 0, pages);
    let (mut seed, mut folded) = (200, 0);
    for n in 0..24 {
        if n % 3 == 0 {
            zero_pages(refilled, 0, pages);
        } else if n % 3 == 2 {
            seed += 1;
            fill_pairs(refilled, pages, seed);
        }
        folded += e.scan().zero_folded;
    }
    assert_reads_zero(kept, 0..pages);
    assert_pairs(refilled, pages, seed);
    let s = e.stats();
    // SAFETY: the blocks this test allocated, each freed once.
    unsafe {
        e.free(refilled);
        e.free(kept);
    }
    (folded, s)
}

#[test]
fn a_block_whose_zero_folds_are_written_again_is_looked_at_less_often() {
    let (folded_off, off) = folds_while_refilling(false);
    let (folded, on) = folds_while_refilling(true);
    assert!(
        folded_off >= 7 * 64 && off.zero_refilled >= 6 * 64 && off.block_rests == 0,
        "without rest the block is folded every round: {folded_off} {off:?}"
    );
    assert!(on.block_rests > 0, "{on:?}");
    assert!(
        folded * 2 <= folded_off && folded >= 64,
        "resting folds half as much or less, the block that stays zero included: \
         {folded} against {folded_off}"
    );
}

/// Scans a block of zero pages on anonymous memory or frames 24 times,
/// writing zeros over it (`write`) or reading it between scans; returns
/// the zero pages folded and the stats.
fn refolds(fresh: Fresh, write: bool) -> (u64, pagefold_engine::Stats) {
    let pages = 64;
    let e = Engine::new(Config {
        smart_scan: false,
        sample_scan: false,
        fresh,
        ..Config::default()
    });
    let p = e.alloc(pages * PAGE, Hint::None);
    zero_pages(p, 0, pages);
    let mut folded = 0;
    let mut sum = 0u64;
    for _ in 0..24 {
        folded += e.scan().zero_folded;
        if write {
            zero_pages(p, 0, pages);
        } else {
            // SAFETY: reads inside the live block.
            sum += (0..pages)
                .map(|k| unsafe { *p.add(k * PAGE + 8) } as u64)
                .sum::<u64>();
        }
    }
    assert_eq!(sum, 0);
    assert_reads_zero(p, 0..pages);
    let s = e.stats();
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
    (folded, s)
}

#[test]
fn zeros_written_over_folded_pages_count_as_refills_and_the_block_rests() {
    for fresh in [Fresh::Anon, Fresh::Frames] {
        let (folded, s) = refolds(fresh, true);
        assert!(
            s.zero_refilled >= 64 && s.block_rests > 0,
            "{fresh:?}: zeros written back are refills: {s:?}"
        );
        assert!(
            folded <= 6 * 64,
            "{fresh:?}: the resting block is folded a few times, not every other scan: {folded}"
        );
    }
    // Reading folded anonymous pages maps the shared zero page: no memory
    // comes back, so nothing is refilled and nothing rests.
    let (folded, s) = refolds(Fresh::Anon, false);
    assert_eq!((s.zero_refilled, s.block_rests), (0, 0), "{s:?}");
    assert_eq!(folded, 64, "folded once and left alone");
}

#[test]
fn with_every_mechanism_off_a_scan_reads_no_page() {
    let pages = 64;
    let scanned = |on: bool| {
        let e = Engine::new(Config {
            zero: on,
            merge: on,
            copy: on,
            ..Config::default()
        });
        let p = e.alloc(pages * PAGE, Hint::None);
        fill_unique(p, pages / 2, 7);
        // SAFETY: the upper half of the live block this test allocated.
        unsafe { std::ptr::write_bytes(p.add(pages / 2 * PAGE), 0, pages / 2 * PAGE) };
        let rep = (0..3).map(|_| e.scan()).fold(0, |n, r| {
            n + r.pages_scanned + r.chunks_protected + r.chunks_unprotected
        });
        // SAFETY: the block allocated above, freed once.
        unsafe { e.free(p) };
        rep
    };
    assert!(scanned(true) > 0);
    assert_eq!(
        scanned(false),
        0,
        "nothing could be acted on: no block walked"
    );
}
