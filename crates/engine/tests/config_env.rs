//! Config::from_env, in a test binary of its own: it sets process-wide
//! environment variables that would leak into engines other tests start.

use pagefold_engine::Config;

#[test]
fn config_reads_fault_injection_from_the_environment() {
    std::env::set_var("PAGEFOLD_INJECT_FAIL_MEMFD", "1");
    std::env::set_var("PAGEFOLD_INJECT_FAIL_UFFD", "0");
    std::env::set_var("PAGEFOLD_INJECT_MMAP_AFTER", "7");
    std::env::set_var("PAGEFOLD_INJECT_MAX_MAP_COUNT", "5000");
    let c = Config::from_env();
    for v in ["FAIL_MEMFD", "FAIL_UFFD", "MMAP_AFTER", "MAX_MAP_COUNT"] {
        std::env::remove_var(format!("PAGEFOLD_INJECT_{v}"));
    }
    assert!(c.inject.fail_memfd && !c.inject.fail_uffd);
    assert_eq!((c.inject.fail_mmap_after, c.inject.max_map_count), (Some(7), Some(5000)));
    assert!(!Config::from_env().inject.fail_memfd);
}

#[test]
fn config_reads_recycling_from_the_environment() {
    std::env::set_var("PAGEFOLD_RECYCLE_MB", "64");
    std::env::set_var("PAGEFOLD_RECYCLE_MS", "2000");
    let c = Config::from_env();
    std::env::remove_var("PAGEFOLD_RECYCLE_MB");
    std::env::remove_var("PAGEFOLD_RECYCLE_MS");
    assert_eq!((c.recycle_bytes, c.recycle_age), (64 << 20, std::time::Duration::from_secs(2)));
    assert_eq!(Config::from_env().recycle_age, std::time::Duration::from_millis(250));
}

#[test]
fn config_reads_patching_from_the_environment() {
    let vars = [("PAGEFOLD_PATCH_BLOCKS", "2"), ("PAGEFOLD_PATCH_BLOCK_BYTES", "64"), ("PAGEFOLD_PATCH_CANDIDATES", "100"), ("PAGEFOLD_INJECT_FAIL_PATCH", "1")];
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let c = Config::from_env();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    assert_eq!((c.patch_blocks, c.patch_block_bytes, c.patch_candidates, c.inject.fail_patch), (2, 64, 100, true));
    let d = Config::from_env();
    assert_eq!((d.patch_blocks, d.patch_block_bytes, d.inject.fail_patch), (8, 8, false));
}
