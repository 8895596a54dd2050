//! Pressure-driven tiering (the default): the memory limit found from cgroup
//! v1 and v2 files (copies in a temporary directory, and the live
//! hierarchy), the fallbacks when no cgroup or no PSI file is readable,
//! no clock pass with room to spare, passes that stop while what they
//! evict comes back, and, in a real memory cgroup with a limit, cold pages
//! compressed once usage nears it with every byte read back as written.

mod common;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pagefold_engine::memlimit::{self, Group, Sources, Version};
use pagefold_engine::{Config, Engine, Hint, Inject, Tier, PAGE};

/// The v1 memory controller's root, where the live-cgroup test makes its group.
const V1_ROOT: &str = "/sys/fs/cgroup/memory";
/// Set in the re-executed test binary that runs inside the limited group.
const CHILD: &str = "PAGEFOLD_TEST_PRESSURE_CHILD";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagefold-pressure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(file), text).unwrap();
}

/// The live v1 group's files, or made-up ones in the same format where
/// this machine has no v1 memory controller.
fn v1_file(live: Option<&Path>, file: &str, made_up: &str) -> String {
    live.and_then(|d| std::fs::read_to_string(d.join(file)).ok())
        .unwrap_or_else(|| made_up.to_string())
}

#[test]
fn limit_and_working_set_from_cgroup_v1_files() {
    let live = memlimit::live_group(&Sources::default()).filter(|g| g.version == Version::V1);
    let live_dir = live.as_ref().map(|g| g.dir.as_path());
    let root = scratch("v1");
    let dir = root.join("memory/jobs/a");
    // Real memory.stat content with its limit lines set to what the test wants.
    let stat = v1_file(
        live_dir,
        "memory.stat",
        "cache 0\nrss 0\ntotal_inactive_file 0\n",
    );
    let stat: String = stat
        .lines()
        .filter(|l| {
            !l.starts_with("hierarchical_memory_limit") && !l.starts_with("total_inactive_file")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    write(
        &dir,
        "memory.stat",
        &format!("{stat}hierarchical_memory_limit 209715200\ntotal_inactive_file 10485760\n"),
    );
    write(&dir, "memory.limit_in_bytes", "9223372036854771712\n");
    write(&dir, "memory.usage_in_bytes", "115343360\n");
    let g = Group {
        version: Version::V1,
        dir: dir.clone(),
        mount: root.join("memory"),
    };
    assert_eq!(g.limit(), Some(200 << 20), "the hierarchy's limit binds");
    assert_eq!(g.working_set(), Some(100 << 20), "less inactive page cache");
    // Without the hierarchical line, the group's own; 2^63 rounded is none.
    write(&dir, "memory.stat", "total_inactive_file 0\n");
    assert_eq!(g.limit(), None);
    write(&dir, "memory.limit_in_bytes", "67108864\n");
    assert_eq!(g.limit(), Some(64 << 20));
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn limit_and_working_set_from_cgroup_v2_files() {
    let root = scratch("v2");
    let parent = root.join("jobs.slice");
    let dir = parent.join("job.scope");
    write(&root, "cgroup.controllers", "cpu io memory pids\n");
    write(&parent, "memory.max", "268435456\n");
    write(&parent, "memory.high", "max\n");
    write(&dir, "memory.max", "max\n");
    write(&dir, "memory.high", "max\n");
    write(&dir, "memory.current", "157286400\n");
    write(
        &dir,
        "memory.stat",
        "anon 104857600\nfile 52428800\nactive_file 10485760\ninactive_file 41943040\n",
    );
    // The machine's own PSI file where it has one, else one in its format.
    let psi = std::fs::read_to_string("/proc/pressure/memory").unwrap_or_else(|_| {
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n\
         full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            .into()
    });
    write(&dir, "memory.pressure", &psi);
    let g = Group {
        version: Version::V2,
        dir: dir.clone(),
        mount: root.clone(),
    };
    assert_eq!(g.limit(), Some(256 << 20), "an ancestor's memory.max binds");
    write(&dir, "memory.high", "201326592\n");
    assert_eq!(
        g.limit(),
        Some(192 << 20),
        "memory.high below it binds first"
    );
    assert_eq!(g.working_set(), Some(110 << 20));
    assert_eq!(g.psi_file(), Some(dir.join("memory.pressure")));
    assert!(memlimit::parse_psi(&psi).is_some(), "{psi}");
    // The group as /proc/self/cgroup and mountinfo place it.
    let mountinfo = format!(
        "29 23 0:26 / {} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n",
        root.display()
    );
    let found = memlimit::find_group("0::/jobs.slice/job.scope\n", &mountinfo).unwrap();
    assert_eq!(found, g);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn the_live_group_is_the_one_proc_names() {
    let src = Sources::default();
    let Some(g) = memlimit::live_group(&src) else {
        eprintln!("skipped: no cgroup hierarchy mounted");
        return;
    };
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let (v2, v1) = memlimit::cgroup_paths(&proc_cgroup);
    let path = match g.version {
        Version::V1 => v1.unwrap(),
        Version::V2 => v2.unwrap(),
    };
    assert!(
        g.dir.ends_with(path.trim_start_matches('/')),
        "{g:?} {path}"
    );
    let limit_file = match g.version {
        Version::V1 => "memory.limit_in_bytes",
        Version::V2 => "memory.max",
    };
    if let Ok(text) = std::fs::read_to_string(g.dir.join(limit_file)) {
        if let Some(own) = memlimit::parse_limit(&text) {
            assert!(g.limit().is_some_and(|l| l <= own), "{g:?}");
        }
    }
    assert!(!memlimit::describe(Some(&g)).is_empty());
}

/// Engines of these tests evict one at a time (as tier.rs's do).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pressure-driven tiering, passes on every explicit scan.
fn pressure_cfg() -> Config {
    Config {
        tier: Tier::Pressure,
        clock_interval: Duration::ZERO,
        pin_grace: Duration::from_micros(100),
        ..Config::default()
    }
}

/// Compressible content, different in every page.
fn pattern(k: usize) -> Vec<u8> {
    let line = format!("page {k:08} of the pressure test ");
    line.bytes().cycle().take(PAGE).collect()
}

/// A block of `pages` pages, page k holding `pattern(k)` (written page by
/// page: no copy of the whole is kept, which a limited group has no room for).
fn filled(e: &Engine, pages: usize) -> *mut u8 {
    let p = e.alloc(pages * PAGE, Hint::None);
    assert!(!p.is_null());
    for k in 0..pages {
        let page = pattern(k);
        // SAFETY: page k of the fresh block of `pages` pages, one page long.
        unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), p.add(k * PAGE), PAGE) };
    }
    p
}

/// `filled`, with a scan after every `every` pages written.
fn filled_scanning(e: &Engine, pages: usize, every: usize) -> *mut u8 {
    let p = e.alloc(pages * PAGE, Hint::None);
    assert!(!p.is_null());
    for k in 0..pages {
        let page = pattern(k);
        // SAFETY: page k of the fresh block of `pages` pages, one page long.
        unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), p.add(k * PAGE), PAGE) };
        if (k + 1) % every == 0 {
            e.scan();
        }
    }
    p
}

/// Whether every page of the block reads back as `filled` wrote it.
fn read_back(p: *const u8, pages: usize) -> bool {
    (0..pages).all(|k| {
        // SAFETY: page k of a live block of this test of `pages` pages.
        let page = unsafe { std::slice::from_raw_parts(p.add(k * PAGE), PAGE) };
        page == pattern(k).as_slice()
    })
}

#[test]
fn with_room_to_spare_tiering_stays_idle() {
    let _serial = serial();
    let run = |tier: Tier| {
        let e = Engine::new(Config {
            tier,
            ..pressure_cfg()
        });
        let p = filled(&e, 2048);
        for _ in 0..4 {
            e.scan();
        }
        assert!(read_back(p, 2048));
        e.stats()
    };
    let idle = run(Tier::Pressure);
    let off = run(Tier::Off);
    let c = &idle.clock;
    assert_eq!((c.passes, c.total.evicted), (0, 0), "{c:?}");
    assert!(c.pressure_reads >= 4, "memory was looked at: {c:?}");
    assert!(c.pressure.limit > 0 && c.pressure.used < c.pressure.limit);
    assert_eq!(off.clock.passes, 0);
    assert_eq!(off.clock.pressure_reads, 0, "off: memory is not even read");
    assert_eq!(
        idle.metadata_bytes, off.metadata_bytes,
        "no tiering metadata with room to spare"
    );
}

#[test]
fn without_a_readable_cgroup_the_users_limit_then_the_machine_binds() {
    let _serial = serial();
    let hidden = Inject {
        hide_cgroup: true,
        ..Inject::default()
    };
    let e = Engine::new(Config {
        inject: hidden.clone(),
        memory_limit: Some(1 << 30),
        ..pressure_cfg()
    });
    e.scan();
    let r = e.stats().clock.pressure;
    assert_eq!(r.source, Some(memlimit::Source::User));
    assert_eq!(r.limit, 1 << 30);
    assert!(r.used > 0, "the process's resident memory");
    let e = Engine::new(Config {
        inject: hidden,
        ..pressure_cfg()
    });
    e.scan();
    let r = e.stats().clock.pressure;
    assert_eq!(r.source, Some(memlimit::Source::Machine));
    let total = std::fs::read_to_string("/proc/meminfo").unwrap();
    assert_eq!(Some(r.limit), memlimit::parse_meminfo(&total).map(|m| m.0));
}

#[test]
fn without_psi_pressure_is_read_from_usage_alone() {
    let _serial = serial();
    let e = Engine::new(pressure_cfg());
    e.scan();
    let with = e.stats().clock.pressure;
    if Path::new("/proc/pressure/memory").is_file() {
        assert!(with.psi.is_some(), "{with:?}");
    }
    let e = Engine::new(Config {
        inject: Inject {
            hide_psi: true,
            ..Inject::default()
        },
        ..pressure_cfg()
    });
    e.scan();
    let without = e.stats().clock.pressure;
    assert_eq!(without.psi, None);
    assert!(without.limit > 0, "usage is still read: {without:?}");
}

#[test]
fn a_users_limit_below_the_usage_makes_passes_that_compress() {
    let _serial = serial();
    // 1 MiB: far below what this process holds, so memory is short at once.
    let e = Engine::new(Config {
        inject: Inject {
            hide_cgroup: true,
            ..Inject::default()
        },
        memory_limit: Some(1 << 20),
        ..pressure_cfg()
    });
    let p = filled(&e, 1024);
    for _ in 0..4 {
        e.scan();
    }
    let c = e.stats().clock;
    assert!(c.passes >= 3 && c.pressure_passes >= 3, "{c:?}");
    assert!(c.total.evicted > 512, "cold pages compressed: {c:?}");
    assert!(read_back(p, 1024), "every byte back as written");
}

/// Under a user's limit far below the usage, with passes 20 ms apart and
/// swap free (injected): a program that reads back every page after each
/// pass brings back young what the first pass, a probe, evicted, so passes
/// stop (`clock.suspensions`) and none runs for the 120 clock intervals of
/// a stop; a program that leaves its pages alone is never stopped. Without
/// swap, passes are all that relieves memory: they go on, touched or not.
/// Every byte reads back each time.
#[test]
fn passes_stop_while_what_they_evict_is_touched_again() {
    let _serial = serial();
    let run = |touch: bool, swap_free: u64| {
        let e = Engine::new(Config {
            inject: Inject {
                hide_cgroup: true,
                swap_free: Some(swap_free),
                ..Inject::default()
            },
            memory_limit: Some(1 << 20),
            clock_interval: Duration::from_millis(20),
            ..pressure_cfg()
        });
        let p = filled(&e, 1024);
        let mut passes_by_round = Vec::new();
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(25));
            e.scan();
            if touch {
                assert!(read_back(p, 1024), "every byte back as written");
            }
            passes_by_round.push(e.stats().clock.passes);
        }
        assert!(read_back(p, 1024), "every byte back as written");
        (e.stats().clock, passes_by_round)
    };
    let (touched, by_round) = run(true, 1 << 30);
    assert!(touched.suspensions >= 1, "{touched:?}");
    assert!(touched.total.evicted >= 256, "{touched:?}");
    assert!(touched.passes <= 4, "{by_round:?}");
    let (left, _) = run(false, 1 << 30);
    assert_eq!(left.suspensions, 0, "{left:?}");
    assert!(left.total.evicted >= 1000, "{left:?}");
    let (no_swap, by_round) = run(true, 0);
    assert_eq!(no_swap.suspensions, 0, "{no_swap:?}");
    assert!(no_swap.passes >= 8, "passes go on: {by_round:?}");
}

/// While memory is short and the kernel can swap, scans that are not clock
/// passes read no page (a read marks the page used for the kernel's
/// reclaim): written zero pages stay unfolded until the next pass, which
/// reads every page (it sees writes by their changed content). Where the
/// kernel cannot swap, or with room to spare, every scan folds them.
#[test]
fn while_memory_is_short_and_the_kernel_swaps_scans_read_no_page() {
    let _serial = serial();
    let run = |limit: Option<u64>, swap_free: u64, passes: bool| {
        let e = Engine::new(Config {
            inject: Inject {
                hide_cgroup: true,
                swap_free: Some(swap_free),
                ..Inject::default()
            },
            memory_limit: limit,
            // Every scan a clock pass, or only the first.
            clock_interval: Duration::from_secs(if passes { 0 } else { 3600 }),
            evict: false,
            ..pressure_cfg()
        });
        e.scan();
        let pages = 256;
        let p = e.alloc(pages * PAGE, Hint::None);
        assert!(!p.is_null());
        // SAFETY: the fresh block of `pages` pages, written whole twice.
        unsafe {
            std::ptr::write_bytes(p, 0x5a, pages * PAGE);
            std::ptr::write_bytes(p, 0, pages * PAGE);
        }
        for _ in 0..3 {
            e.scan();
        }
        // SAFETY: the live block, `pages` pages long.
        let back = unsafe { std::slice::from_raw_parts(p, pages * PAGE) };
        assert!(back.iter().all(|&b| b == 0), "every byte back as written");
        e.stats()
    };
    let short = run(Some(1 << 20), 1 << 30, false);
    assert_eq!(short.zero_folded, 0, "{short:?}");
    assert!(short.scan_skipped_pressure >= 3 * 256, "{short:?}");
    let passes = run(Some(1 << 20), 1 << 30, true);
    assert!(passes.clock.passes >= 4, "{:?}", passes.clock);
    assert!(passes.zero_folded >= 256, "{passes:?}");
    assert_eq!(passes.scan_skipped_pressure, 0);
    let no_swap = run(Some(1 << 20), 0, false);
    assert!(no_swap.zero_folded >= 256, "{no_swap:?}");
    assert_eq!(no_swap.scan_skipped_pressure, 0);
    let room = run(None, 1 << 30, false);
    assert!(room.zero_folded >= 256, "{room:?}");
    assert_eq!(room.scan_skipped_pressure, 0);
}

/// The fault thread tells young restores from old ones (the pass
/// governor's evidence of churn): with 50 ms clock intervals, a page touched
/// right after its eviction counts in `restored_young`, one touched 1.5 s
/// (30 intervals) after it does not.
#[test]
fn restores_soon_after_eviction_count_as_young() {
    let _serial = serial();
    let e = Engine::new(Config {
        clock_interval: Duration::from_millis(50),
        ..pressure_cfg()
    });
    let p = filled(&e, 64);
    let young = e.evict(p, 32 * PAGE).evicted;
    assert!(read_back(p, 32));
    // SAFETY: pages 32-63 of the 64-page block.
    let second = unsafe { p.add(32 * PAGE) };
    let old = e.evict(second, 32 * PAGE).evicted;
    std::thread::sleep(Duration::from_millis(1500));
    assert!(read_back(p, 64));
    assert!(young >= 30 && old >= 30, "{young} {old}");
    let s = e.stats();
    assert_eq!(
        (s.restored, s.restored_young),
        (young + old, young),
        "{s:?}"
    );
}

/// Runs this test binary again for `test` inside a fresh v1 memory cgroup
/// limited to `limit` bytes; its exit status and output.
fn in_limited_group(test: &str, limit: u64) -> Option<(bool, String)> {
    let root = Path::new(V1_ROOT);
    if !root.join("memory.limit_in_bytes").is_file() {
        eprintln!("skipped: no cgroup v1 memory controller at {V1_ROOT}");
        return None;
    }
    let dir = root.join(format!("pagefold-test-pressure-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!("skipped: cannot create a memory cgroup ({e})");
        return None;
    }
    std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
    let procs = CString::new(dir.join("cgroup.procs").to_str().unwrap()).unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, test);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec; it only
        // opens, writes and closes a file whose path was made before the
        // fork (no allocation, no lock).
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            })
        };
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_dir(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text))
}

/// In a group limited to 128 MiB, a 104 MiB block of compressible pages
/// written 4 MiB at a time with a scan after each (with the test binary's
/// own memory, above 80% of the limit): passes compress cold pages as the
/// usage nears the limit, until it is below 70% of it, and every byte
/// reads back.
#[test]
fn under_a_real_cgroup_limit_cold_pages_are_compressed() {
    const TEST: &str = "under_a_real_cgroup_limit_cold_pages_are_compressed";
    const LIMIT: u64 = 128 << 20;
    const PAGES: usize = 26624;
    if std::env::var_os(CHILD).is_none() {
        // Its fork retires the frame pools of engines alive in this process.
        let _serial = serial();
        let Some((ok, out)) = in_limited_group(TEST, LIMIT) else {
            return;
        };
        assert!(ok && out.contains("1 passed"), "{out}");
        return;
    }
    // Anonymous, as the preload places blocks of sizes seldom copied from.
    let e = Engine::new(Config {
        fresh: pagefold_engine::Fresh::Anon,
        ..pressure_cfg()
    });
    let p = filled_scanning(&e, PAGES, 1024);
    let start = Instant::now();
    loop {
        e.scan();
        let used = e.stats().clock.pressure.used;
        if used <= LIMIT / 10 * 7 || start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let c = e.stats().clock;
    assert_eq!(c.pressure.source, Some(memlimit::Source::Cgroup), "{c:?}");
    assert_eq!(c.pressure.limit, LIMIT);
    assert!(c.pressure_passes > 0 && c.total.evicted >= 4096, "{c:?}");
    assert!(c.pressure.used <= LIMIT / 10 * 7, "{c:?}");
    assert!(read_back(p, PAGES), "every byte back as written");
}

/// A program that set equal descriptor limits below 4096 itself, without the
/// capability to raise them: the gauge's files would take numbers of the
/// program's, so it keeps none (`fallbacks.pressure`), memory reads as never
/// short even under a user's limit far below the usage, and no pass runs.
#[test]
fn without_room_for_its_descriptors_the_gauge_keeps_none_and_stays_idle() {
    const TEST: &str = "without_room_for_its_descriptors_the_gauge_keeps_none_and_stays_idle";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD, TEST)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    assert!(common::drop_sys_resource());
    let r = libc::rlimit {
        rlim_cur: 1500,
        rlim_max: 1500,
    };
    // SAFETY: r is a live, initialized rlimit; setrlimit only reads it.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    let e = Engine::new(Config {
        memory_limit: Some(1 << 20),
        ..pressure_cfg()
    });
    let p = filled(&e, 256);
    e.scan();
    let s = e.stats();
    assert!(s.fallbacks.pressure >= 3, "{:?}", s.fallbacks);
    assert_eq!(
        (s.clock.pressure.limit, s.clock.pressure_passes),
        (0, 0),
        "{:?}",
        s.clock
    );
    assert!(read_back(p, 256));
}
