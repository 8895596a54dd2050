//! Basic behaviour of each mechanism, checked byte for byte and by the
//! engine's own counters.

use pagefold_engine::{Config, Engine, Fresh, Hint, PAGE};

fn fill(p: *mut u8, len: usize, seed: u8) {
    for i in 0..len {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { *p.add(i) = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i / PAGE) as u8) };
    }
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

#[test]
fn alloc_is_zeroed_and_writable() {
    let e = Engine::new(Config::default());
    let p = e.alloc(10 * PAGE + 5, Hint::None);
    assert!(!p.is_null());
    assert!(bytes(p, 11 * PAGE).iter().all(|&b| b == 0));
    fill(p, 11 * PAGE, 1);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *p.add(7) }, 7u8.wrapping_mul(31).wrapping_add(1));
    assert!(e.stats().frames_active);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn virtual_copy_is_independent() {
    let e = Engine::new(Config::default());
    let n = 64 * PAGE;
    let a = e.alloc(n, Hint::None);
    let b = e.alloc(n, Hint::None);
    fill(a, n, 3);
    let before = bytes(a, n).to_vec();
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b, a, n) };
    assert_eq!(bytes(b, n), &before[..]);
    let st = e.stats();
    assert_eq!(st.pages_shared_by_copy, 64);
    assert_eq!(st.frames_in_use, 64, "the copy shares the source's frames");
    // Writes on either side stay on that side.
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *a.add(5 * PAGE + 1) = 0xAA };
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *b.add(9 * PAGE + 2) = 0xBB };
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *b.add(5 * PAGE + 1) }, before[5 * PAGE + 1]);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *a.add(9 * PAGE + 2) }, before[9 * PAGE + 2]);
    // Copy of a copy, at an odd offset and length.
    let c = e.alloc(n, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(c.add(100), b.add(100), n - 300) };
    let mut want = vec![0u8; n];
    want[100..n - 200].copy_from_slice(&bytes(b, n)[100..n - 200]);
    assert_eq!(bytes(c, n), &want[..]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e.free(b);
        e.free(c);
    }
    assert_eq!(e.stats().frames_in_use, 0);
}

/// A copy the program then writes over in full, its source then freed (an
/// interpreter's copy-on-modify): the frames the two shared are punched at
/// the free, with no scan, and the copy keeps what was written. A copy
/// written over in part keeps the frames its unwritten pages still map.
#[test]
fn frames_of_a_copy_written_over_go_when_its_source_is_freed() {
    let e = Engine::new(Config::default());
    let n = 64;
    let a = e.alloc(n * PAGE, Hint::None);
    let b = e.alloc(n * PAGE, Hint::None);
    let c = e.alloc(n * PAGE, Hint::None);
    fill(a, n * PAGE, 5);
    // SAFETY: live blocks of this test, each at least the length copied.
    unsafe {
        e.copy(b, a, n * PAGE);
        e.copy(c, a, n * PAGE);
    }
    assert_eq!(e.stats().frames_resident, n as u64);
    fill(b, n * PAGE, 6);
    let want_b = bytes(b, n * PAGE).to_vec();
    // c: its first half written, the second still the source's frames.
    fill(c, n / 2 * PAGE, 7);
    let mut want_c = bytes(a, n * PAGE).to_vec();
    want_c[..n / 2 * PAGE].copy_from_slice(bytes(c, n / 2 * PAGE));
    // SAFETY: a block this test got from the engine's alloc, not used after.
    unsafe { e.free(a) };
    let s = e.stats();
    assert_eq!(s.scans, 0);
    assert_eq!(s.frames_resident, n as u64 / 2, "{s:?}");
    assert_eq!(bytes(b, n * PAGE), &want_b[..]);
    assert_eq!(bytes(c, n * PAGE), &want_c[..]);
    // SAFETY: blocks this test got from the engine's alloc, not used after.
    unsafe {
        e.free(b);
        e.free(c);
    }
    assert_eq!(e.stats().frames_resident, 0);
}

#[test]
fn scan_folds_zero_and_merges_duplicates() {
    let e = Engine::new(Config::default());
    let n = 256 * PAGE;
    let a = e.alloc(n, Hint::FullWrite);
    // Pages 0..64 zero (but touched), 64..128 copies of 4 contents, the rest unique.
    for pg in 64..256 {
        let seed = if pg < 128 { (pg % 4) as u8 } else { pg as u8 };
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let p = unsafe { a.add(pg * PAGE) };
        fill(p, PAGE, seed);
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe {
            *(p as *mut u64) = if pg < 128 {
                (pg % 4) as u64
            } else {
                pg as u64 + 1000
            }
        };
    }
    let before = bytes(a, n).to_vec();
    // The first scan only looks: pages are folded once a second scan sees them unchanged.
    let first = e.scan();
    assert_eq!(
        (first.zero_folded, first.merged, first.volatile),
        (0, 0, 256),
        "{first:?}"
    );
    let r = e.scan();
    assert_eq!(r.zero_folded, 64, "{r:?}");
    assert_eq!(r.merged, 60, "{r:?}");
    assert_eq!(bytes(a, n), &before[..]);
    // Writes after the merge must not leak into the other copies.
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *a.add(64 * PAGE + 8) ^= 0xFF };
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *a.add(68 * PAGE + 8) }, before[68 * PAGE + 8]);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_ne!(unsafe { *a.add(64 * PAGE + 8) }, before[64 * PAGE + 8]);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn pages_that_change_between_scans_are_left_alone() {
    // Every scan looks at page 3 here (the smart scan would look at it less
    // often, as it finds nothing to do; tests/smart_scan.rs covers that).
    let e = Engine::new(Config {
        smart_scan: false,
        ..Config::default()
    });
    let a = e.alloc(8 * PAGE, Hint::FullWrite);
    e.scan();
    // Page 3 is rewritten with other zero-free content before every scan; the
    // rest stay zero. Only the settled pages may fold.
    for round in 1..4u8 {
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { std::ptr::write_bytes(a.add(3 * PAGE), round, PAGE) };
        let r = e.scan();
        assert_eq!(r.volatile, 1, "round {round}: {r:?}");
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        assert_eq!(unsafe { *a.add(3 * PAGE + 100) }, round);
    }
    let off = Config {
        volatile_check: false,
        ..Config::default()
    };
    let e2 = Engine::new(off);
    let b = e2.alloc(8 * PAGE, Hint::FullWrite);
    assert_eq!(e2.scan().zero_folded, 8, "without the check one scan folds");
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e2.free(b);
    }
}

#[test]
fn a_merge_partner_run_reaching_into_the_chunk_leaves_the_chunk_protected() {
    // Chunks of 8 pages; pages 10..14 repeat pages 6..10, a partner run
    // that begins in the first chunk and reaches into the second, whose
    // pages 10..14 find it. Only the part before the chunk may be protected
    // and registered on its own: doing so for the whole run would unprotect
    // and unregister the chunk's pages 8 and 9 under its work, and the
    // chunk's own unprotect would then stop at them.
    let e = Engine::new(Config {
        scan_chunk_pages: 8,
        ..Config::default()
    });
    let n = 16 * PAGE;
    let a = e.alloc(n, Hint::FullWrite);
    for pg in 0..16 {
        let seed = if (10..14).contains(&pg) { pg - 4 } else { pg };
        // SAFETY: page pg lies inside the live 16-page block this test allocated.
        fill(unsafe { a.add(pg * PAGE) }, PAGE, seed as u8);
    }
    let before = bytes(a, n).to_vec();
    let merged: u64 = (0..3).map(|_| e.scan().merged).sum();
    assert_eq!(bytes(a, n), &before[..]);
    let s = e.stats();
    assert!(merged >= 4, "the repeated pages were merged: {s:?}");
    assert_eq!(s.unprotect_gaps, 0, "{s:?}");
    // Every page is writable: none was left protected.
    fill(a, n, 77);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
}

#[test]
fn folding_anonymous_zero_pages_leaves_the_chunk_protected() {
    // Anonymous pages, chunks of 8: pages 2..5 zero, the rest unique. The
    // pin guard folds the zero pages by moving them off and leaves holes it
    // unregisters (they must fault as plain memory); the holes must be
    // registered again for the chunk's unprotect to reach the pages after them.
    let e = Engine::new(Config {
        fresh: Fresh::Anon,
        scan_chunk_pages: 8,
        ..Config::default()
    });
    let n = 16 * PAGE;
    let a = e.alloc(n, Hint::FullWrite);
    fill(a, n, 5);
    // SAFETY: pages 2..5 lie inside the live 16-page block this test allocated.
    unsafe { std::ptr::write_bytes(a.add(2 * PAGE), 0, 3 * PAGE) };
    let before = bytes(a, n).to_vec();
    let folded: u64 = (0..3).map(|_| e.scan().zero_folded).sum();
    assert_eq!(bytes(a, n), &before[..]);
    let s = e.stats();
    assert_eq!(folded, 3, "{s:?}");
    assert_eq!(s.unprotect_gaps, 0, "{s:?}");
    // Every page is writable: none was left protected.
    fill(a, n, 78);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a) };
}
