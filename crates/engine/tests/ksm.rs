//! Handing scattered duplicates to kernel KSM (ksm.rs): a block in which
//! the mapping budget keeps refusing merges is moved onto anonymous memory,
//! marked mergeable, and merged by the real ksmd; when KSM is not running,
//! nothing is handed over and the fallback is counted. Every byte is checked.

mod common;

use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, PAGE};

/// Pages of the test block: half copies of `CONTENTS` contents at scattered
/// places, half unique.
const PAGES: usize = 16384;
const CONTENTS: usize = 64;
/// Scans before the handoff is looked for.
const SCANS: usize = 8;

/// KSM's knobs, put back as they were when dropped (also when a test fails).
struct KsmKnobs {
    saved: Vec<(&'static str, String)>,
}

const KNOBS: &str = "/sys/kernel/mm/ksm";

impl KsmKnobs {
    /// Sets ksmd running fast, or None if this kernel or user cannot.
    fn fast() -> Option<KsmKnobs> {
        let names = ["pages_to_scan", "sleep_millisecs", "run"];
        let saved: Option<Vec<_>> = names
            .iter()
            .map(|&n| {
                let v = std::fs::read_to_string(format!("{KNOBS}/{n}")).ok()?;
                Some((n, v.trim().to_string()))
            })
            .collect();
        let knobs = KsmKnobs { saved: saved? };
        for (n, v) in [
            ("pages_to_scan", "10000"),
            ("sleep_millisecs", "10"),
            ("run", "1"),
        ] {
            std::fs::write(format!("{KNOBS}/{n}"), v).ok()?;
        }
        Some(knobs)
    }
}

impl Drop for KsmKnobs {
    fn drop(&mut self) {
        // `run` last: ksmd stops (or goes on) with its old rate in place.
        for (n, v) in self.saved.iter().filter(|(n, _)| *n != "run") {
            let _ = std::fs::write(format!("{KNOBS}/{n}"), v);
        }
        for (n, v) in self.saved.iter().filter(|(n, _)| *n == "run") {
            let _ = std::fs::write(format!("{KNOBS}/{n}"), v);
        }
    }
}

/// The content of page `k`: a scattered copy of one of `CONTENTS` contents
/// for half the pages (chosen by a hash of k), else unique to k.
fn content(k: usize) -> (u64, bool) {
    let h = (k as u64 ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    if h >> 63 == 1 {
        ((h >> 32) % CONTENTS as u64, true)
    } else {
        (1_000_000 + k as u64, false)
    }
}

fn fill(p: *mut u8) -> usize {
    let mut copies = 0;
    for k in 0..PAGES {
        let (id, copy) = content(k);
        copies += copy as usize;
        let words = PAGE / 8;
        for w in 0..words {
            let v = id.wrapping_mul(0x100_0000_01b3) ^ w as u64;
            // SAFETY: word w of page k lies inside the block of PAGES pages.
            unsafe { (p as *mut u64).add(k * words + w).write(v) };
        }
    }
    copies
}

fn check(p: *const u8) {
    let words = PAGE / 8;
    for k in 0..PAGES {
        let (id, _) = content(k);
        for w in 0..words {
            let v = id.wrapping_mul(0x100_0000_01b3) ^ w as u64;
            // SAFETY: word w of page k lies inside the live block.
            let got = unsafe { (p as *const u64).add(k * words + w).read() };
            assert_eq!(got, v, "page {k} word {w}");
        }
    }
}

/// An engine whose mapping budget refuses merges early, handing off
/// (the handoff is opt-in).
fn engine(inject_off: bool) -> Engine {
    let mut cfg = Config {
        ksm_handoff: true,
        vma_budget: Some(400),
        ..Config::default()
    };
    cfg.inject.ksm_off = inject_off;
    Engine::new(cfg)
}

/// A filled block of `PAGES` pages after `SCANS` scans, and
/// the number of its pages that are copies.
fn scanned_block(e: &Engine) -> (*mut u8, usize) {
    let p = e.alloc(PAGES * PAGE, Hint::None);
    assert!(!p.is_null());
    let copies = fill(p);
    for _ in 0..SCANS {
        e.scan();
    }
    (p, copies)
}

/// Checks every byte of the block and frees it.
fn check_and_free(e: &Engine, p: *mut u8) {
    check(p);
    // SAFETY: p is a block the test allocated, no longer used.
    assert!(unsafe { e.free(p) });
}

/// Pages of this process KSM has merged.
fn ksm_merging_pages() -> u64 {
    std::fs::read_to_string("/proc/self/ksm_merging_pages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn scattered_duplicates_are_handed_to_ksm_and_merged() {
    let _serial = common::serial();
    let Some(_knobs) = KsmKnobs::fast() else {
        eprintln!("skipped: KSM's knobs cannot be set here (needs root and CONFIG_KSM)");
        return;
    };
    let e = engine(false);
    let (p, copies) = scanned_block(&e);
    let s = e.stats();
    assert_eq!(s.ksm_blocks, 1, "{s:?}");
    assert_eq!(s.ksm_bytes, (PAGES * PAGE) as u64);
    assert_eq!(s.fallbacks.ksm, 0);
    check(p);
    // ksmd merges all but one page of each content (two full scans).
    let want = (copies - CONTENTS) as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ksm_merging_pages() < want * 99 / 100 {
        assert!(
            Instant::now() < deadline,
            "ksmd merged {} of {want} pages",
            ksm_merging_pages()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    check(p);
    // A write to a merged page breaks only that page's sharing.
    let (k, _) = (0..PAGES).map(|k| (k, content(k).1)).find(|c| c.1).unwrap();
    // SAFETY: page k lies inside the live block.
    unsafe { p.add(k * PAGE).write(0xEE) };
    // SAFETY: as above.
    assert_eq!(unsafe { p.add(k * PAGE).read() }, 0xEE);
    // SAFETY: as above.
    unsafe { p.add(k * PAGE).write(content_first_byte(k)) };
    // No more scans of the block: the engine does nothing more with it.
    let before = e.stats();
    e.scan();
    assert_eq!(e.stats().merged, before.merged);
    check_and_free(&e, p);
}

/// The first byte of page `k`'s content (little-endian first word).
fn content_first_byte(k: usize) -> u8 {
    let (id, _) = content(k);
    id.wrapping_mul(0x100_0000_01b3) as u8
}

#[test]
fn a_block_the_kernel_refuses_to_mark_mergeable_stays_plain_memory() {
    let _serial = common::serial();
    let Some(_knobs) = KsmKnobs::fast() else {
        eprintln!("skipped: KSM's knobs cannot be set here (needs root and CONFIG_KSM)");
        return;
    };
    let mut cfg = Config {
        ksm_handoff: true,
        vma_budget: Some(400),
        ..Config::default()
    };
    cfg.inject.ksm_refuse = true;
    let e = Engine::new(cfg);
    let (p, _) = scanned_block(&e);
    let s = e.stats();
    assert_eq!(s.ksm_blocks, 0, "{s:?}");
    assert!(s.fallbacks.ksm >= 1, "{s:?}");
    assert!(
        s.exempted == 0 && s.frames_in_use == 0,
        "moved onto anonymous memory: {s:?}"
    );
    check(p);
    // Not mergeable: ksmd leaves it alone, and so does the engine.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ksm_merging_pages(), 0);
    let before = e.stats();
    e.scan();
    assert_eq!(e.stats().merged, before.merged);
    // Plain memory: writes land and stay.
    for k in (0..PAGES).step_by(97) {
        // SAFETY: page k lies inside the live block.
        unsafe { p.add(k * PAGE).write(content_first_byte(k) ^ 0x5a) };
        // SAFETY: as above.
        let got = unsafe { p.add(k * PAGE).read() };
        assert_eq!(got, content_first_byte(k) ^ 0x5a);
        // SAFETY: as above.
        unsafe { p.add(k * PAGE).write(content_first_byte(k)) };
    }
    check_and_free(&e, p);
}

#[test]
fn nothing_is_handed_over_while_ksm_is_not_running() {
    let _serial = common::serial();
    let e = engine(true);
    let (p, _) = scanned_block(&e);
    let s = e.stats();
    assert_eq!(s.ksm_blocks, 0, "{s:?}");
    assert!(s.fallbacks.ksm >= 1, "{s:?}");
    assert!(s.fallbacks.vma_budget > 0, "{s:?}");
    assert!(s.merged > 0, "the engine keeps what it merged: {s:?}");
    check_and_free(&e, p);
}

/// The handoff is opt-in: by default no block goes to ksmd, even while it
/// runs (where its knobs can be set, they are, so that it does).
#[test]
fn by_default_blocks_stay_the_engines() {
    let _serial = common::serial();
    let _knobs = KsmKnobs::fast();
    let e = Engine::new(Config {
        vma_budget: Some(400),
        ..Config::default()
    });
    let (p, _) = scanned_block(&e);
    let s = e.stats();
    assert_eq!((s.ksm_blocks, s.fallbacks.ksm), (0, 0), "{s:?}");
    assert!(s.fallbacks.vma_budget > 0, "{s:?}");
    check_and_free(&e, p);
}
