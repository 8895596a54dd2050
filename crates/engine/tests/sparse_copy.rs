//! Plain copies into engine blocks leave out the source's zero pages where
//! the destination page reads zero already (copy.rs): every byte of the
//! destination still reads what memcpy would have written, pages the
//! program wrote before the copy are overwritten with the source's zeros,
//! and with zero folding or sparse copies off every page is written.
//! Zeroing (`Engine::zero`, memset to 0) leaves out the same pages, under
//! the same rules.

use pagefold_engine::{Config, Engine, Fresh, Hint, PAGE};

/// A source of `pages` pages plus a 100-byte tail whose pages are zero
/// where `k % 3 != 0`, with a byte pattern elsewhere.
fn source(pages: usize) -> Vec<u8> {
    let mut v = vec![0u8; pages * PAGE + 100];
    for (i, b) in v.iter_mut().enumerate() {
        if (i / PAGE).is_multiple_of(3) {
            *b = (i as u8).wrapping_mul(7) | 1;
        }
    }
    v
}

fn engine(fresh: Fresh, zero: bool) -> Engine {
    Engine::new(Config {
        fresh,
        zero,
        ..Config::default()
    })
}

fn without_sparse_copies(fresh: Fresh) -> Engine {
    Engine::new(Config {
        fresh,
        sparse_copy: false,
        ..Config::default()
    })
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// Copies `src` into a fresh block at byte offset `off`, after the program
/// wrote 0xee over the destination's pages in `written`; returns the
/// zero pages the engine left out.
fn copy_into_fresh(e: &Engine, src: &[u8], off: usize, written: std::ops::Range<usize>) -> u64 {
    let len = src.len();
    let p = e.alloc(len + off + PAGE, Hint::None);
    // SAFETY: the pages written lie inside the block just allocated.
    unsafe { std::ptr::write_bytes(p.add(written.start * PAGE), 0xee, written.len() * PAGE) };
    let before = e.stats().zero_pages_not_copied;
    // SAFETY: the source is a live vector of len bytes; the destination lies inside the block,
    // and the two do not overlap.
    unsafe { e.copy(p.add(off), src.as_ptr(), len) };
    // SAFETY: the copy's destination lies inside the block.
    let copied = unsafe { p.add(off) };
    assert!(bytes(copied, len) == src, "the copy reads as its source");
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
    e.stats().zero_pages_not_copied - before
}

#[test]
fn zero_source_pages_are_left_out_where_the_destination_reads_zero() {
    // Anonymous blocks (pagemap: not mapped, not swapped) and blocks on
    // frames (the frame a hole in the memfd).
    for fresh in [Fresh::Anon, Fresh::Frames] {
        let e = engine(fresh, true);
        let src = source(30);
        // Page-aligned: pages 1, 2, 4, 5, ... of 30 are zero (20 of them).
        assert_eq!(copy_into_fresh(&e, &src, 0, 0..0), 20, "{fresh:?}");
        // Pages the program wrote first hold 0xee: the copy must write them.
        assert_eq!(copy_into_fresh(&e, &src, 0, 0..9), 20 - 6, "{fresh:?}");
        // Off the page boundary, the destination's whole pages straddle two
        // source pages each: only those whose 4 KiB of source are all zero.
        let skipped = copy_into_fresh(&e, &src, 1000, 0..0);
        assert!(skipped > 0 && skipped < 20, "{fresh:?}: {skipped}");
    }
}

#[test]
fn with_zero_folding_or_sparse_copies_off_every_page_is_copied() {
    for fresh in [Fresh::Anon, Fresh::Frames] {
        let e = engine(fresh, false);
        assert_eq!(copy_into_fresh(&e, &source(30), 0, 0..0), 0, "{fresh:?}");
        let e = without_sparse_copies(fresh);
        assert_eq!(copy_into_fresh(&e, &source(30), 0, 0..0), 0, "{fresh:?}");
    }
}

#[test]
fn a_destination_page_discarded_reads_zero_and_one_written_after_does_not() {
    let e = engine(Fresh::Anon, true);
    let src = source(12);
    let p = e.alloc(src.len(), Hint::None);
    // SAFETY: the whole block was just allocated; the discard is the program's own
    // MADV_DONTNEED, routed as the preload routes it (what the engine leaves alone goes to the
    // kernel).
    unsafe {
        std::ptr::write_bytes(p, 0xee, src.len());
        for (start, len) in e.discard(p, 5 * PAGE) {
            assert_eq!(
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED),
                0
            );
        }
        std::ptr::write_bytes(p.add(PAGE), 0x55, 10);
        e.copy(p, src.as_ptr(), src.len());
    }
    assert!(bytes(p, src.len()) == &src[..]);
    // Pages 2 and 4 (zero in the source, discarded) are left out; page 1
    // was written after the discard, pages 5-11 were never discarded.
    assert_eq!(e.stats().zero_pages_not_copied, 2);
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
}

fn without_sparse_zeroing(fresh: Fresh) -> Engine {
    Engine::new(Config {
        fresh,
        sparse_zero: false,
        ..Config::default()
    })
}

/// Zeroes bytes `[off, len - tail)` of a fresh block of `pages` pages after
/// the program wrote 0xee over the pages in `written`; checks every byte
/// and returns whether the engine did it and the pages it left out.
fn zero_in_fresh(
    e: &Engine,
    pages: usize,
    off: usize,
    tail: usize,
    written: std::ops::Range<usize>,
) -> (bool, u64) {
    let len = pages * PAGE;
    let p = e.alloc(len, Hint::None);
    // SAFETY: the pages written lie inside the block just allocated.
    unsafe { std::ptr::write_bytes(p.add(written.start * PAGE), 0xee, written.len() * PAGE) };
    let before = e.stats().zero_pages_not_written;
    // SAFETY: the range lies inside the block.
    let done = unsafe { e.zero(p.add(off), len - off - tail) };
    let block = bytes(p, len);
    if done {
        assert!(block[off..len - tail].iter().all(|&b| b == 0), "cleared");
    } else {
        assert_eq!(e.stats().zero_pages_not_written, before, "nothing left out");
    }
    let kept = |i: usize| match written.contains(&(i / PAGE)) {
        true => 0xee,
        false => 0,
    };
    assert!(
        (0..off).all(|i| block[i] == kept(i)),
        "bytes before the range kept"
    );
    assert!(
        (len - tail..len).all(|i| block[i] == kept(i)),
        "bytes after it kept"
    );
    // SAFETY: the block this test allocated, freed once.
    unsafe { e.free(p) };
    (done, e.stats().zero_pages_not_written - before)
}

#[test]
fn zeroing_leaves_out_the_pages_that_read_zero_and_writes_the_others() {
    for fresh in [Fresh::Anon, Fresh::Frames] {
        let e = engine(fresh, true);
        assert_eq!(zero_in_fresh(&e, 20, 0, 0, 0..0), (true, 20), "{fresh:?}");
        // Pages 3-5 written first are cleared by writing; the partial first
        // and last pages are written whatever they held.
        assert_eq!(
            zero_in_fresh(&e, 20, 100, 200, 0..6),
            (true, 18 - 5),
            "{fresh:?}"
        );
        // Every page written: nothing to leave out, the caller clears it.
        assert_eq!(zero_in_fresh(&e, 20, 0, 0, 0..20), (false, 0), "{fresh:?}");
    }
}

#[test]
fn zeroing_outside_blocks_or_with_sparse_zeroing_or_zero_folding_off_is_the_callers() {
    let e = engine(Fresh::Anon, true);
    let mut v = vec![7u8; 8 * PAGE];
    // SAFETY: the vector is live and 8 pages long.
    assert!(!unsafe { e.zero(v.as_mut_ptr(), v.len()) });
    assert!(
        v.iter().all(|&b| b == 7),
        "memory not the engine's is not touched"
    );
    for fresh in [Fresh::Anon, Fresh::Frames] {
        assert_eq!(
            zero_in_fresh(&without_sparse_zeroing(fresh), 20, 0, 0, 0..0),
            (false, 0)
        );
        assert_eq!(
            zero_in_fresh(&engine(fresh, false), 20, 0, 0, 0..0),
            (false, 0)
        );
    }
}
