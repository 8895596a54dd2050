//! Kernels and users without a userfaultfd feature the engine asks for,
//! each forced with its `Inject` refusal (the kernel's own answer: EPERM,
//! EACCES, EINVAL): the engine must keep every byte and do what the
//! remaining features allow. The refusals a real kernel can give without
//! injection (no userfaultfd for an unprivileged user, the device's path)
//! are run for real by the `pagefold` command's tests (crates/cli/tests/doctor.rs).

use pagefold_engine::protect::{self, Protector, Refuse, Source};
use pagefold_engine::{Config, Engine, Fresh, Hint, Inject, Stats};

const PAGE: usize = 4096;

/// A block of anonymous memory of 16 pages: 0..8 zero but touched, 8..16
/// copies of one content (the pin guard works on such pages).
fn block(e: &Engine) -> *mut u8 {
    let p = e.alloc(16 * PAGE, Hint::None);
    assert!(!p.is_null());
    for k in 0..16 {
        // SAFETY: page k lies inside the live 16-page block just allocated.
        unsafe { std::ptr::write_bytes(p.add(k * PAGE), byte(k), PAGE) };
    }
    p
}

fn byte(k: usize) -> u8 {
    if k < 8 {
        0
    } else {
        0x5a
    }
}

/// Scans the block twice (the second folds what the first saw unchanged),
/// checks every byte, frees it and returns the engine's statistics.
fn scanned(inject: Inject) -> Stats {
    let e = Engine::new(Config {
        fresh: Fresh::Anon,
        inject,
        ..Config::default()
    });
    let p = block(&e);
    e.scan();
    e.scan();
    for k in 0..16 {
        // SAFETY: page k lies inside the live block and nothing writes it meanwhile.
        let page = unsafe { std::slice::from_raw_parts(p.add(k * PAGE), PAGE) };
        assert!(page.iter().all(|&b| b == byte(k)), "page {k} changed");
    }
    let s = e.stats();
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
    s
}

/// A refusal that leaves the engine without write protection: the scans
/// look, fold and merge nothing, and say so.
fn assert_unprotected(inject: Inject, what: &str) {
    let s = scanned(inject);
    assert!(!s.protected_scan, "{what}: {s:?}");
    assert_eq!((s.zero_folded, s.merged), (0, 0), "{what}: {s:?}");
    assert!(
        s.fallbacks.uffd > 0,
        "{what}: scans not counted as fallbacks: {s:?}"
    );
}

#[test]
fn with_every_feature_scans_fold_and_merge() {
    let s = scanned(Inject::default());
    assert!(s.protected_scan, "{s:?}");
    assert_eq!((s.zero_folded, s.merged), (8, 7), "{s:?}");
    assert_eq!(s.fallbacks.pin_guard, 0, "{s:?}");
}

/// The system call refused (an unprivileged user while
/// `vm.unprivileged_userfaultfd` is 0): the engine asks /dev/userfaultfd,
/// and where it may open the device (root here, mode 600), nothing is lost.
#[test]
fn a_refused_system_call_falls_back_to_the_device() {
    let refuse = Refuse {
        syscall: true,
        ..Refuse::default()
    };
    let device = protect::probe(&Refuse::default()).device.is_ok();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(
            device,
            "root cannot open /dev/userfaultfd (Linux 6.1 has it)"
        );
    }
    let p = Protector::open_refusing(true, &refuse);
    assert_eq!(
        p.as_ref().map(|p| p.source).ok(),
        device.then_some(Source::Device)
    );
    drop(p);
    let s = scanned(Inject {
        fail_uffd_syscall: true,
        ..Inject::default()
    });
    assert_eq!(s.protected_scan, device, "{s:?}");
    if device {
        assert_eq!((s.zero_folded, s.merged), (8, 7), "{s:?}");
    }
}

#[test]
fn refused_system_call_and_device_leave_no_write_protection() {
    assert_unprotected(
        Inject {
            fail_uffd_syscall: true,
            fail_uffd_device: true,
            ..Inject::default()
        },
        "no userfaultfd for this user",
    );
}

/// Before Linux 6.1 (no write protection of shmem): no protected scans.
#[test]
fn without_write_protection_nothing_is_folded() {
    assert_unprotected(
        Inject {
            fail_uffd_wp: true,
            ..Inject::default()
        },
        "no WP",
    );
}

/// Before Linux 6.4: a never-touched anonymous page cannot be protected,
/// so a write to it could race a fold; no protected scans.
#[test]
fn without_wp_unpopulated_nothing_is_folded() {
    assert_unprotected(
        Inject {
            fail_uffd_wp_unpopulated: true,
            ..Inject::default()
        },
        "no WP_UNPOPULATED",
    );
}

/// Before Linux 6.8 (no UFFDIO_MOVE): the pin guard cannot start, the scans
/// fold and merge behind the pin grace, and the fallback is counted once.
#[test]
fn without_uffdio_move_the_pin_grace_folds_and_merges() {
    let s = scanned(Inject {
        fail_uffd_move: true,
        ..Inject::default()
    });
    assert!(s.protected_scan, "{s:?}");
    assert_eq!(s.fallbacks.pin_guard, 1, "{s:?}");
    assert_eq!((s.zero_folded, s.merged), (8, 7), "{s:?}");
    assert_eq!((s.pin_refused, s.pin_changed), (0, 0), "{s:?}");
}

/// What the doctor reads: each refusal takes away its own feature and no other.
#[test]
fn the_probe_reports_each_refused_feature() {
    let all = protect::probe(&Refuse::default());
    let Some(have) = all.features else {
        panic!("no userfaultfd of any kind could be opened: {all:?}");
    };
    for (refuse, lacks) in [
        (
            Refuse {
                wp: true,
                ..Refuse::default()
            },
            "wp",
        ),
        (
            Refuse {
                wp_unpopulated: true,
                ..Refuse::default()
            },
            "wp_unpopulated",
        ),
        (
            Refuse {
                missing: true,
                ..Refuse::default()
            },
            "missing",
        ),
        (
            Refuse {
                poison: true,
                ..Refuse::default()
            },
            "poison",
        ),
        (
            Refuse {
                move_pages: true,
                ..Refuse::default()
            },
            "move",
        ),
    ] {
        let f = protect::probe(&refuse).features.expect("features");
        let got = [
            ("wp", f.wp),
            ("wp_unpopulated", f.wp_unpopulated),
            ("missing", f.missing),
            ("poison", f.poison),
            ("move", f.move_pages),
        ];
        let want = [
            ("wp", have.wp),
            ("wp_unpopulated", have.wp_unpopulated),
            ("missing", have.missing),
            ("poison", have.poison),
            ("move", have.move_pages),
        ];
        for ((name, g), (_, w)) in got.iter().zip(want) {
            // Refusing all write protection takes WP_UNPOPULATED along.
            let gone = *name == lacks || (lacks == "wp" && *name == "wp_unpopulated");
            assert_eq!(*g, w && !gone, "refusing {lacks}: {name}");
        }
    }
    let p = protect::probe(&Refuse {
        syscall: true,
        device: true,
        ..Refuse::default()
    });
    assert!(p.syscall.is_err() && p.device.is_err(), "{p:?}");
    assert!(
        p.user_mode_only.is_ok(),
        "user-mode-only userfaultfd is open to everyone since Linux 5.11: {p:?}"
    );
}
