//! The engine's descriptors stay out of the program's way (fds.rs): above the
//! soft descriptor limit, close-on-exec, moved when the program takes their
//! number, refused (and the engine stopped) when the number names another
//! file. Limits and the "lost" flag are per process, so each case that changes
//! them runs in a forked child and reports through its exit status. Each test
//! runs in a process of its own (`common::in_own_process`), so that child
//! finds no lock held by another test's thread.

mod common;
use pagefold_engine::fds::{self, Fd};

fn rlimit() -> libc::rlimit {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a live local for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    r
}

fn set_rlimit(cur: u64, max: u64) -> bool {
    let r = libc::rlimit {
        rlim_cur: cur,
        rlim_max: max,
    };
    // SAFETY: r is a live, initialized rlimit; setrlimit only reads it.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) == 0 }
}

fn memfd() -> i32 {
    // SAFETY: the name is a NUL-terminated literal; memfd_create only reads it.
    let fd = unsafe { libc::memfd_create(c"fds-test".as_ptr(), 0) };
    assert!(fd >= 0);
    fd
}

fn is_open(n: i32) -> bool {
    // SAFETY: fcntl(F_GETFD) takes plain integers; a closed number is an error.
    unsafe { libc::fcntl(n, libc::F_GETFD) >= 0 }
}

fn cloexec(n: i32) -> bool {
    // SAFETY: as in is_open.
    unsafe { libc::fcntl(n, libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
}

/// Runs `body` in a forked child; the child's exit status is `body`'s result
/// (0 = passed). The child leaves with _exit, running no destructors.
fn in_child(body: impl FnOnce() -> i32) -> i32 {
    // SAFETY: every caller runs alone in its process (in_own_process): at the
    // fork no other test's thread holds a lock; the child only runs `body`,
    // which makes system calls and small allocations, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(99);
        // SAFETY: _exit ends the child without returning.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: status is a writable int; pid is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn adopted_descriptors_sit_above_the_soft_limit_and_close_on_exec() {
    if !common::in_own_process("adopted_descriptors_sit_above_the_soft_limit_and_close_on_exec") {
        return;
    }
    let code = in_child(|| {
        let lim = rlimit();
        if lim.rlim_max < 2048 || !set_rlimit(256, lim.rlim_max) {
            return 10;
        }
        let raw = memfd();
        let f = fds::adopt(raw).unwrap();
        let n = f.number();
        let checks = [
            // Not just above the low limit: at the floor above it.
            n >= fds::FLOOR,
            n < fds::FLOOR + 256,
            cloexec(n),
            !is_open(raw),
            fds::is_engine(n),
            !fds::is_engine(raw),
            rlimit().rlim_cur == 256,
            f.with(Ok).unwrap() == n,
            !fds::lost(),
        ];
        if let Some(i) = checks.iter().position(|ok| !ok) {
            return 20 + i as i32;
        }
        f.close();
        if is_open(n) || fds::is_engine(n) {
            return 40;
        }
        0
    });
    assert_eq!(code, 0);
}

#[test]
fn with_equal_limits_the_descriptor_takes_the_top_of_the_range_or_none() {
    if !common::in_own_process(
        "with_equal_limits_the_descriptor_takes_the_top_of_the_range_or_none",
    ) {
        return;
    }
    let code = in_child(|| {
        // Equal limits. Raising the hard one needs CAP_SYS_RESOURCE; lowering
        // it is always allowed, and a number cannot go above a hard limit that
        // cannot be raised.
        if !set_rlimit(1500, 1500) {
            return 10;
        }
        let f = fds::adopt(memfd()).unwrap();
        let n = f.number();
        // Both limits are put back after the one dup.
        if rlimit().rlim_max != 1500 || rlimit().rlim_cur != 1500 {
            return 11;
        }
        let placed = match n {
            n if n >= 1500 => true,                     // privileged: above both limits
            n if n >= 1500 - 256 && cloexec(n) => true, // the top of the range
            _ => false,
        };
        if !placed {
            return 12;
        }
        // Below 1024 the engine takes none of the program's numbers.
        if !set_rlimit(300, 300) {
            return 13;
        }
        match fds::adopt(memfd()) {
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => 0,
            Ok(g) if g.number() >= 300 => 0, // privileged: above both limits
            _ => 14,
        }
    });
    assert_eq!(code, 0);
}

/// A descriptor the engine can do without (the pressure gauge's files) is
/// not kept at one of the numbers of a program with few: with equal limits
/// below 4096 and no capability to raise them, `adopt` takes the top of the
/// range and `adopt_spare` is refused; at 4096 both take the top.
#[test]
fn a_spare_descriptor_is_refused_where_it_would_take_a_program_number() {
    if !common::in_own_process("a_spare_descriptor_is_refused_where_it_would_take_a_program_number")
    {
        return;
    }
    let code = in_child(|| {
        if !common::drop_sys_resource() {
            return 10;
        }
        // Hard limits only go down without the capability: the largest first.
        if !set_rlimit(4096, 4096) {
            return 11;
        }
        match fds::adopt_spare(memfd()) {
            Ok(f) if (4096 - 256..4096).contains(&f.number()) => {}
            _ => return 12,
        }
        if !set_rlimit(1500, 1500) {
            return 13;
        }
        match fds::adopt_spare(memfd()) {
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {}
            _ => return 14,
        }
        match fds::adopt(memfd()) {
            Ok(f) if (1500 - 256..1500).contains(&f.number()) => {}
            _ => return 15,
        }
        // With room above the soft limit (below the hard one) it is kept there.
        if !set_rlimit(1200, 1500) {
            return 16;
        }
        match fds::adopt_spare(memfd()) {
            Ok(f) if f.number() >= 1200 => 0,
            _ => 17,
        }
    });
    assert_eq!(code, 0);
}

#[test]
fn relocation_moves_the_descriptor_and_keeps_its_file() {
    if !common::in_own_process("relocation_moves_the_descriptor_and_keeps_its_file") {
        return;
    }
    let code = in_child(|| {
        let f = fds::adopt(memfd()).unwrap();
        let n = f.number();
        // SAFETY: the memfd is ours; ftruncate takes plain integers.
        if f.with(|fd| Ok(unsafe { libc::ftruncate(fd, 8192) }))
            .unwrap()
            != 0
        {
            return 10;
        }
        if !fds::relocate(n) {
            return 11;
        }
        let m = f.number();
        if m == n || is_open(n) || !fds::is_engine(m) || fds::is_engine(n) {
            return 12;
        }
        let mut st: libc::stat = unsafe_zeroed_stat();
        // SAFETY: st is a live local for fstat to fill.
        if f.with(|fd| Ok(unsafe { libc::fstat(fd, &mut st) }))
            .unwrap()
            != 0
            || st.st_size != 8192
        {
            return 13;
        }
        // A number that is not the engine's needs no move.
        if !fds::relocate(3) || fds::lost() {
            return 14;
        }
        0
    });
    assert_eq!(code, 0);
}

fn unsafe_zeroed_stat() -> libc::stat {
    // SAFETY: an all-zero stat is a valid value of the plain C struct.
    unsafe { std::mem::zeroed() }
}

#[test]
fn a_replaced_descriptor_is_refused_and_the_foreign_file_untouched() {
    if !common::in_own_process("a_replaced_descriptor_is_refused_and_the_foreign_file_untouched") {
        return;
    }
    let code = in_child(|| {
        let f = fds::adopt(memfd()).unwrap();
        let n = f.number();
        // The program's own file, put on the engine's number behind its back.
        let theirs = memfd();
        // SAFETY: plain integers; theirs and n are open descriptors of this process.
        if unsafe { libc::dup2(theirs, n) } != n {
            return 10;
        }
        let used = f.with(|fd| {
            // SAFETY: ftruncate takes plain integers.
            unsafe { libc::ftruncate(fd, 1 << 20) };
            Ok(())
        });
        let mut st: libc::stat = unsafe_zeroed_stat();
        // SAFETY: st is a live local for fstat to fill.
        unsafe { libc::fstat(theirs, &mut st) };
        if used.is_ok() || !fds::lost() || st.st_size != 0 {
            return 11;
        }
        // Closing the slot leaves the program's file open.
        f.close();
        if !is_open(n) || fds::is_engine(n) {
            return 12;
        }
        0
    });
    assert_eq!(code, 0);
}

#[test]
fn numbers_in_a_range_come_sorted() {
    if !common::in_own_process("numbers_in_a_range_come_sorted") {
        return;
    }
    let code = in_child(|| {
        let held: Vec<Fd> = (0..5).map(|_| fds::adopt(memfd()).unwrap()).collect();
        let mut out = [0u32; fds::MAX_HELD];
        let n = fds::numbers_in(0, u32::MAX, &mut out);
        let mut want: Vec<u32> = held.iter().map(|f| f.number() as u32).collect();
        want.sort();
        if out[..n] != want[..] {
            return 10;
        }
        let n = fds::numbers_in(want[1] as i32, want[3], &mut out);
        if out[..n] != want[1..4] {
            return 11;
        }
        0
    });
    assert_eq!(code, 0);
}
