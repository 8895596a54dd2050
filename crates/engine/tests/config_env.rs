//! Config::from_env, in a test binary of its own: it sets process-wide
//! environment variables that would leak into engines other tests start.
//! Each test holds `ENV` while it sets and reads them: tests run on
//! threads of one process, and one test's variable must not reach another.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pagefold_engine::{Config, Fresh, Tier};

static ENV: Mutex<()> = Mutex::new(());

fn env_lock() -> MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// What `read` returns with the variables `vars` set; they are removed after.
fn with_vars<R>(vars: &[(&str, &str)], read: impl FnOnce() -> R) -> R {
    vars.iter().for_each(|(k, v)| std::env::set_var(k, v));
    let r = read();
    vars.iter().for_each(|(k, _)| std::env::remove_var(k));
    r
}

#[test]
fn config_reads_fault_injection_from_the_environment() {
    let _env = env_lock();
    std::env::set_var("PAGEFOLD_INJECT_FAIL_MEMFD", "1");
    std::env::set_var("PAGEFOLD_INJECT_FAIL_UFFD", "0");
    std::env::set_var("PAGEFOLD_INJECT_MMAP_AFTER", "7");
    std::env::set_var("PAGEFOLD_INJECT_MAX_MAP_COUNT", "5000");
    std::env::set_var("PAGEFOLD_INJECT_KSM_OFF", "1");
    std::env::set_var("PAGEFOLD_INJECT_KSM_REFUSE", "1");
    std::env::set_var("PAGEFOLD_KSM", "1");
    std::env::set_var("PAGEFOLD_INJECT_FAIL_UFFD_SYSCALL", "1");
    std::env::set_var("PAGEFOLD_INJECT_FAIL_UFFD_WP_UNPOPULATED", "1");
    std::env::set_var("PAGEFOLD_INJECT_FAIL_UFFD_MOVE", "1");
    let c = Config::from_env();
    for v in [
        "FAIL_MEMFD",
        "FAIL_UFFD",
        "MMAP_AFTER",
        "MAX_MAP_COUNT",
        "KSM_OFF",
        "KSM_REFUSE",
        "FAIL_UFFD_SYSCALL",
        "FAIL_UFFD_WP_UNPOPULATED",
        "FAIL_UFFD_MOVE",
    ] {
        std::env::remove_var(format!("PAGEFOLD_INJECT_{v}"));
    }
    std::env::remove_var("PAGEFOLD_KSM");
    assert!(c.inject.fail_memfd && !c.inject.fail_uffd);
    assert!(c.inject.ksm_off && c.inject.ksm_refuse && c.ksm_handoff);
    assert!(!Config::default().ksm_handoff, "KSM delegation is opt-in");
    let r = c.inject.uffd_refusals();
    assert!(r.syscall && r.wp_unpopulated && r.move_pages);
    assert!(!r.device && !r.wp && !r.missing && !r.poison);
    assert_eq!(
        (c.inject.fail_mmap_after, c.inject.max_map_count),
        (Some(7), Some(5000))
    );
    assert!(!Config::from_env().inject.fail_memfd);
}

#[test]
fn config_reads_recycling_from_the_environment() {
    let _env = env_lock();
    std::env::set_var("PAGEFOLD_RECYCLE_MB", "64");
    std::env::set_var("PAGEFOLD_RECYCLE_MS", "2000");
    let c = Config::from_env();
    std::env::remove_var("PAGEFOLD_RECYCLE_MB");
    std::env::remove_var("PAGEFOLD_RECYCLE_MS");
    assert_eq!(
        (c.recycle_bytes, c.recycle_age),
        (64 << 20, std::time::Duration::from_secs(2))
    );
    assert_eq!(
        Config::from_env().recycle_age,
        std::time::Duration::from_millis(250)
    );
}

#[test]
fn config_reads_tiering_from_the_environment() {
    let _env = env_lock();
    let d = Config::default();
    assert!(d.tier == Tier::Pressure && d.tier_patch && d.tier_compress && d.high_water.is_none());
    let vars = [
        ("PAGEFOLD_TIER", "1"),
        ("PAGEFOLD_CLOCK_MS", "250"),
        ("PAGEFOLD_COLD_PASSES", "99"),
        ("PAGEFOLD_TIER_PATCH", "0"),
        ("PAGEFOLD_TIER_COMPRESS", "off"),
        ("PAGEFOLD_HIGH_MB", "512"),
        ("PAGEFOLD_LOW_MB", "0"),
    ];
    let c = with_vars(&vars, Config::from_env);
    assert!(c.tier == Tier::On && !c.tier_patch && !c.tier_compress);
    assert_eq!(c.clock_interval, std::time::Duration::from_millis(250));
    assert_eq!(c.cold_passes, 7, "capped to the age the clock can count");
    assert_eq!(
        (c.high_water, c.low_water),
        (Some(512 << 20), None),
        "0 MiB: no watermark"
    );
    assert_eq!(Config::from_env().tier, Tier::Pressure);
}

#[test]
fn config_reads_the_tiering_mode_the_memory_limit_and_the_pressure_marks() {
    let _env = env_lock();
    for (v, t) in [
        ("0", Tier::Off),
        ("off", Tier::Off),
        ("pressure", Tier::Pressure),
        ("1", Tier::On),
    ] {
        assert_eq!(Tier::parse(v), t, "{v}");
    }
    let d = Config::default();
    assert_eq!(
        (d.memory_limit, d.pressure_high, d.pressure_low),
        (None, 80, 70)
    );
    let vars = [
        ("PAGEFOLD_MEMORY", "3G"),
        ("PAGEFOLD_PRESSURE_HIGH", "70"),
        ("PAGEFOLD_PRESSURE_LOW", "90"),
        ("PAGEFOLD_PRESSURE_PSI", "5.5"),
    ];
    vars.iter().for_each(|(k, v)| std::env::set_var(k, v));
    let c = Config::from_env();
    std::env::set_var("PAGEFOLD_MEMORY", "junk");
    let junk = Config::from_env();
    vars.iter().for_each(|(k, _)| std::env::remove_var(k));
    assert_eq!(c.memory_limit, Some(3 << 30));
    assert_eq!(
        (c.pressure_high, c.pressure_low),
        (70, 70),
        "low at most high"
    );
    assert_eq!(c.pressure_psi, 5.5);
    assert_eq!(junk.memory_limit, None, "the preload keeps the default");
}

#[test]
fn config_reads_the_swap_file_from_the_environment() {
    let _env = env_lock();
    assert!(
        Config::from_env().swap_file.is_none(),
        "no swap unless asked for"
    );
    std::env::set_var("PAGEFOLD_SWAP_FILE", "/var/tmp/pf.swap");
    std::env::set_var("PAGEFOLD_SWAP_MB", "64");
    let c = Config::from_env();
    std::env::remove_var("PAGEFOLD_SWAP_FILE");
    std::env::remove_var("PAGEFOLD_SWAP_MB");
    assert_eq!(
        c.swap_file.as_deref(),
        Some(std::path::Path::new("/var/tmp/pf.swap"))
    );
    assert_eq!(c.swap_bytes, 64 << 20);
}

#[test]
fn config_reads_patching_from_the_environment() {
    let _env = env_lock();
    let vars = [
        ("PAGEFOLD_PATCH_BLOCKS", "2"),
        ("PAGEFOLD_PATCH_BLOCK_BYTES", "64"),
        ("PAGEFOLD_PATCH_CANDIDATES", "100"),
        ("PAGEFOLD_INJECT_FAIL_PATCH", "1"),
    ];
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let c = Config::from_env();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    assert_eq!(
        (
            c.patch_blocks,
            c.patch_block_bytes,
            c.patch_candidates,
            c.inject.fail_patch
        ),
        (2, 64, 100, true)
    );
    let d = Config::from_env();
    assert_eq!(
        (d.patch_blocks, d.patch_block_bytes, d.inject.fail_patch),
        (8, 8, false)
    );
}

#[test]
fn malloc_configuration_has_the_preloads_defaults_and_the_environment_wins() {
    let _env = env_lock();
    let c = Config::malloc_from_env();
    assert_eq!(c.fresh, Fresh::Adaptive);
    assert_eq!(c.plain_below, 32 << 20);
    assert!(c.copy_through && c.copy_learn && !c.evict_untested);
    assert_eq!(c.recycle_bytes, 256 << 20);
    assert_eq!(c.pin_age, Duration::from_millis(200));
    assert_eq!(c.scan_interval, Some(Duration::from_secs(1)));
    let d = Config::from_env();
    assert!(d.fresh != Fresh::Adaptive && d.plain_below == 0 && d.recycle_bytes == 0);

    let vars = [
        ("PAGEFOLD_RECYCLE_MB", "8"),
        ("PAGEFOLD_COPY_LEARN", "0"),
        ("PAGEFOLD_SCAN_INTERVAL_MS", "0"),
        ("PAGEFOLD_PLAIN_BELOW", "4096"),
    ];
    let c = with_vars(&vars, Config::malloc_from_env);
    assert_eq!((c.recycle_bytes, c.plain_below), (8 << 20, 4096));
    assert!(!c.copy_learn && c.scan_interval.is_none());

    // Blocks on frames: no size is left to the caller's heap.
    let c = with_vars(&[("PAGEFOLD_FRESH", "frames")], Config::malloc_from_env);
    assert_eq!((c.fresh, c.plain_below), (Fresh::Frames, 0));

    // Tiering always on keeps blocks on frames and evicts untested pages.
    let c = with_vars(&[("PAGEFOLD_TIER", "1")], Config::malloc_from_env);
    assert!(c.fresh == Fresh::Frames && c.plain_below == 0 && c.evict_untested);
}
