//! Page colouring (PAGEFOLD_BANKS): as root every frame of a fresh block is a
//! page of the bank set and the block's bytes are what the program wrote;
//! with PFNs hidden (forced) the engine falls back to uncoloured frames,
//! counts it, and the bytes are still right.

use pagefold_banks::colour::Colouring;
use pagefold_banks::pfn::{self, Pagemap};
use pagefold_engine::{Config, Engine, Hint, PAGE};

const PAGES: usize = 1024;

fn coloured_config() -> Config {
    Config {
        banks: Some(Colouring::parse("0-7", Some("coffee-lake-ddr4-1rank")).unwrap()),
        ..Config::default()
    }
}

/// Writes a pattern that differs per page and per word, then checks it.
fn write_and_check(p: *mut u8, pages: usize) {
    let words = pages * PAGE / 8;
    let w = p as *mut u64;
    for i in 0..words {
        // SAFETY: i < words and the block holds pages * PAGE bytes.
        unsafe {
            w.add(i)
                .write((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
    }
    for i in 0..words {
        // SAFETY: as above.
        let v = unsafe { w.add(i).read() };
        assert_eq!(
            v,
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            "word {i}"
        );
    }
}

#[test]
fn fresh_frames_come_from_the_bank_set_and_keep_their_bytes() {
    if !pfn::visible() {
        eprintln!("skipped: pagemap hides PFNs (needs root)");
        return;
    }
    let cfg = coloured_config();
    let colouring = cfg.banks.clone().unwrap();
    let e = Engine::new(cfg);
    let p = e.alloc(PAGES * PAGE, Hint::None);
    assert!(!p.is_null());
    // Unwritten pages read as zero, as plain memory would.
    // SAFETY: the block holds PAGES * PAGE bytes.
    let zero = unsafe { std::slice::from_raw_parts(p, PAGES * PAGE) };
    assert!(zero.iter().all(|&b| b == 0));
    write_and_check(p, PAGES);
    let map = Pagemap::open().unwrap();
    for i in 0..PAGES {
        let pfn = map.pfn(p as usize + i * PAGE).expect("present");
        assert!(
            colouring.fits(pfn),
            "page {i}: pfn {pfn:#x} outside the set"
        );
    }
    let s = e.stats();
    eprintln!(
        "coloured {} rejected {} unmet {} in {} us",
        s.coloured_pages,
        s.colour_rejected,
        s.colour_unmet,
        s.colour_ns / 1000
    );
    assert_eq!(s.coloured_pages, PAGES as u64);
    assert_eq!((s.colour_unmet, s.fallbacks.banks), (0, 0));
    // SAFETY: p came from this engine's alloc and nothing uses it after.
    assert!(unsafe { e.free(p) });
}

#[test]
fn hidden_pfns_fall_back_to_uncoloured_frames_and_count_it() {
    let mut cfg = coloured_config();
    cfg.inject.hide_pfns = true;
    let e = Engine::new(cfg);
    let p = e.alloc(PAGES * PAGE, Hint::None);
    assert!(!p.is_null());
    write_and_check(p, PAGES);
    let s = e.stats();
    assert_eq!(s.fallbacks.banks, 1);
    assert_eq!((s.coloured_pages, s.colour_unmet), (0, PAGES as u64));
    assert!(s.frames_active, "still on frames, only uncoloured");
    // SAFETY: p came from this engine's alloc and nothing uses it after.
    assert!(unsafe { e.free(p) });
}

#[test]
fn colouring_off_costs_nothing() {
    let e = Engine::new(Config::default());
    let p = e.alloc(PAGES * PAGE, Hint::None);
    write_and_check(p, PAGES);
    let s = e.stats();
    assert_eq!(
        (s.coloured_pages, s.colour_ns, s.fallbacks.banks),
        (0, 0, 0)
    );
    // SAFETY: p came from this engine's alloc and nothing uses it after.
    assert!(unsafe { e.free(p) });
}

#[test]
fn the_environment_sets_colouring_and_ignores_bad_sets() {
    // The only test here that touches the environment.
    std::env::set_var("PAGEFOLD_BANKS", "8-15");
    std::env::set_var("PAGEFOLD_BANK_FUNCTIONS", "coffee-lake-ddr4-1rank");
    let c = Config::from_env().banks.expect("colouring on");
    assert_eq!(c.set.to_string(), "8-15");
    std::env::set_var("PAGEFOLD_BANKS", "9-3");
    assert!(Config::from_env().banks.is_none());
    std::env::remove_var("PAGEFOLD_BANKS");
    std::env::remove_var("PAGEFOLD_BANK_FUNCTIONS");
}
