//! The background scanner in proportion to profit: it folds what an idle
//! program offers, then backs off and nearly stops; without a scan share it
//! keeps its fixed pace.

use std::time::Duration;

use pagefold_engine::{Config, Engine, Hint, PAGE};

/// An engine scanning every 10 ms in the background, with or without a scan share.
fn background(share: Option<f64>) -> Engine {
    Engine::new(Config {
        scan_interval: Some(Duration::from_millis(10)),
        scan_cpu_budget: 1.0,
        scan_share: share,
        ..Config::default()
    })
}

/// A block of `n` pages, every page one of 8 contents.
fn duplicates(e: &Engine, n: usize) -> *mut u8 {
    let p = e.alloc(n * PAGE, Hint::None);
    assert!(!p.is_null());
    for k in 0..n {
        // SAFETY: page k lies inside the block of n pages allocated above.
        unsafe { std::ptr::write_bytes(p.add(k * PAGE), (k % 8) as u8 + 1, PAGE) };
    }
    p
}

/// Scans during `d` after the first merges of `n` duplicate pages.
fn scans_once_folded(share: Option<f64>, d: Duration) -> (u64, u64) {
    let e = background(share);
    let n = 256;
    let p = duplicates(&e, n);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while e.stats().merged < (n - 8) as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "not folded: {:?}",
            e.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = e.stats().scans;
    std::thread::sleep(d);
    let s = e.stats();
    e.stop_background();
    for k in 0..n {
        // SAFETY: page k lies inside the live block.
        let first = unsafe { *p.add(k * PAGE) };
        assert_eq!(first, (k % 8) as u8 + 1);
    }
    // SAFETY: p is the block allocated above, no longer used.
    assert!(unsafe { e.free(p) });
    (s.scans - before, s.merged)
}

#[test]
fn an_idle_program_is_folded_and_then_left_alone() {
    let window = Duration::from_millis(1500);
    let (fixed, _) = scans_once_folded(None, window);
    let (budgeted, merged) = scans_once_folded(Some(0.02), window);
    assert!(merged >= 248, "{merged}");
    // Fixed pace: one scan per 10 ms (over 100 in the window); with the
    // share, backoff to 160 ms once nothing changes (under 20).
    assert!(
        budgeted * 4 < fixed,
        "scans in {window:?} once folded: {budgeted} with a share, {fixed} without"
    );
}
