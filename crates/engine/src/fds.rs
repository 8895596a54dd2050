//! The engine's file descriptors, kept out of the program's way.
//!
//! A program under the preload never opened the engine's descriptors (memfd
//! pools, the userfaultfd, /proc/self/pagemap and maps, ksmd's run file, the
//! swap file, and the files pressure-driven tiering reads: the memory
//! cgroup's usage, limit, stat and memory.pressure files, /proc/self/statm,
//! /proc/meminfo, /proc/pressure/memory) and
//! must never meet them: not in a list of its open descriptors, not as the
//! number its next `open` returns, not as the target of its `dup2`. And the engine must never act on
//! a file of the program's that came to sit on one of its numbers: a punch,
//! write or mapping through such a number would destroy or expose the
//! program's data.
//!
//! So every descriptor the engine holds beyond one call is *adopted* here:
//!
//! - It is moved to a number at or above the program's soft `RLIMIT_NOFILE`
//!   and at or above `FLOOR` (a program that lowered its limit may still look
//!   just above it, where it keeps descriptors open). The soft limit is raised
//!   for the one `fcntl(F_DUPFD_CLOEXEC)` and put back; where soft and hard
//!   limit are equal both are raised, which needs CAP_SYS_RESOURCE. The kernel
//!   hands the program only numbers below its limit, and checks that walk
//!   "every descriptor up to the limit" never look there.
//! - Where the limit cannot be raised (equal limits without the capability, or
//!   the call is forbidden) the number is the highest free one below it, and a
//!   walk up to the limit sees it. Below a limit under `FLOOR` it takes none:
//!   every number may be one the program needs, so the engine declines the
//!   descriptor (and runs without it, as when memfd is unavailable); a
//!   descriptor it can do without (`adopt_spare`: the pressure gauge's files)
//!   it declines below `SPARE_FLOOR`. Above a
//!   limit over `CEILING` it sits at `CEILING`, inside the limit: the kernel's
//!   descriptor table grows with the highest number in use (8 bytes a slot).
//! - It is close-on-exec, so no program the process executes inherits it.
//! - Its identity (`st_dev`, `st_ino`) is recorded. `Fd::with` checks it before
//!   every use: if the number no longer names our file (the program replaced it
//!   with a raw system call the preload cannot see), the call is refused with
//!   EBADF, `lost()` turns true and the engine stops taking work (pages
//!   already mapped keep their contents: mappings hold the file, not the
//!   number).
//!
//! Opening a file puts it for a moment at the lowest free number, where the
//! program may see it (a child forked at that moment inherits it). So the
//! engine opens files only at engine start or in a child right after fork,
//! and files it reads again and again (/proc/self/maps, ksmd's run file,
//! the pressure gauge's files) stay open and are read with pread through
//! the kept descriptor (sys.rs `KeptFile`): a background thread never opens
//! a file.
//!
//! Holders keep an `Fd` (a slot of a fixed table), not the number: `relocate`
//! can move a descriptor to a new number when the program itself takes the old
//! one (the preload's `dup2`/`dup3` do that first). Every use reads the number
//! under a read lock of `USERS`; `relocate` takes it for writing, so no call is
//! between reading the old number and entering the kernel when the number
//! changes hands. The table and the lock are plain atomics: no allocation, so
//! this runs inside malloc and on the fault thread.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

/// Descriptors the engine can hold at once (pools, their duplicates for
/// patches, the userfaultfd, pagemap, maps, ksmd's run file, swap files, and
/// the pressure gauge's files: at most `pressure::MAX_FILES` an engine).
const SLOTS: usize = 256;
/// The most numbers `numbers_in` can report.
pub const MAX_HELD: usize = SLOTS;
/// Where descriptors go when the soft limit is above this.
pub const CEILING: i32 = 1 << 16;
/// The lowest number they take above a soft limit below this.
pub const FLOOR: i32 = 1024;
/// Below a soft limit under this a descriptor the engine can do without
/// (`adopt_spare`) takes none of the program's numbers.
pub const SPARE_FLOOR: i32 = 4096;
const FREE: i32 = -1;

struct Slot {
    num: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Slot {
    /// Whether number `n` names the file this slot recorded (not one the
    /// program put at that number behind the engine's back).
    fn names_ours(&self, n: i32) -> bool {
        let ours = (
            self.dev.load(Ordering::Relaxed),
            self.ino.load(Ordering::Relaxed),
        );
        fstat(n).is_ok_and(|id| id == ours)
    }
}

#[allow(clippy::declare_interior_mutable_const)] // an initializer for each slot of TABLE
const EMPTY: Slot = Slot {
    num: AtomicI32::new(FREE),
    dev: AtomicU64::new(0),
    ino: AtomicU64::new(0),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// No engine descriptor is numbered below this (a fast answer for `is_engine`).
static LOWEST: AtomicI32 = AtomicI32::new(i32::MAX);
/// Set once a descriptor was found replaced behind the engine's back.
static LOST: AtomicBool = AtomicBool::new(false);
/// Uses in flight (low bits) and a waiting relocation (`WRITER`).
static USERS: AtomicU32 = AtomicU32::new(0);
const WRITER: u32 = 1 << 31;
/// Longest a relocation waits for uses in flight: above the fault thread's
/// poll timeout (200 ms), which is the longest use.
const RELOCATE_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

/// An adopted descriptor: a slot of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fd(u16);

/// fstat(2) as a system call (see `close_raw`: a preload hides these
/// descriptors from the program's fstat too).
fn stat_raw(n: i32) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fstat system call fills st, a live local of the kernel's struct stat layout
    // on this architecture; a bad number is reported as an error.
    if unsafe { libc::syscall(libc::SYS_fstat, n, &mut st as *mut libc::stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fstat(n: i32) -> io::Result<(u64, u64)> {
    stat_raw(n).map(|st| (st.st_dev, st.st_ino))
}

// close, fcntl and fstat are system calls here, not libc calls: a preload
// that answers the program's close, fcntl and fstat on these descriptors with
// EBADF would otherwise answer the engine's own calls the same way.

fn close_raw(n: i32) {
    // SAFETY: the close system call takes a plain integer; callers pass a number this module
    // owns.
    unsafe { libc::syscall(libc::SYS_close, n) };
}

/// The soft and hard RLIMIT_NOFILE.
fn nofile() -> Option<libc::rlimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a live local for getrlimit to fill.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r)
}

fn dup_at_least(n: i32, min: i32) -> io::Result<i32> {
    // SAFETY: the fcntl system call with F_DUPFD_CLOEXEC takes plain integers; errors are
    // reported.
    let r = unsafe { libc::syscall(libc::SYS_fcntl, n, libc::F_DUPFD_CLOEXEC, min) } as i32;
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A close-on-exec duplicate of `n` out of the program's range (see the
/// module comment); `n` itself stays open. With `inside` false, where the
/// number could only sit below a soft limit under `SPARE_FLOOR` it is
/// refused (EMFILE) instead.
fn dup_high(n: i32, inside: bool) -> io::Result<i32> {
    let Some(lim) = nofile() else {
        return dup_at_least(n, 0);
    };
    let soft = lim.rlim_cur.min(CEILING as u64) as i32;
    if (soft as u64) < lim.rlim_cur {
        // A huge limit: the number sits at CEILING, inside it.
        return dup_at_least(n, soft).or_else(|_| dup_at_least(n, 0));
    }
    // Room above the soft limit: up to the hard limit, or (with
    // CAP_SYS_RESOURCE, when the two are equal) above the hard limit too.
    // Both limits are put back right after; the kernel lets descriptors stay
    // open above them.
    // Never just above a low limit: a program that lowered its limit may
    // still look at the numbers just above it (it keeps descriptors open
    // there).
    let base = if lim.rlim_max >= (FLOOR + SLOTS as i32) as u64 {
        soft.max(FLOOR)
    } else {
        soft.max(lim.rlim_max.saturating_sub(SLOTS as u64) as i32)
    };
    let top = base as u64 + SLOTS as u64;
    let raised = libc::rlimit {
        rlim_cur: if lim.rlim_max > base as u64 {
            top.min(lim.rlim_max)
        } else {
            top
        },
        rlim_max: lim.rlim_max.max(top),
    };
    let set = |r: &libc::rlimit| {
        // SAFETY: r is a live, initialized rlimit; setrlimit only reads it.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, r) == 0 }
    };
    if set(&raised) {
        let r = dup_at_least(n, base);
        set(&lim);
        if r.is_ok() {
            return r;
        }
    }
    // Below the limit only where the program has numbers to spare: with a
    // small limit every number may be one it needs, and the engine declines
    // (it then runs without frames, as when memfd is unavailable).
    if soft < FLOOR || !inside && soft < SPARE_FLOOR {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    // The highest free number in the top SLOTS below the limit.
    let mut min = (soft - SLOTS as i32).max(3);
    loop {
        match dup_at_least(n, min) {
            Ok(r) => return Ok(r),
            Err(_) if min > 3 => min = (min - SLOTS as i32).max(3),
            Err(e) => return Err(e),
        }
    }
}

/// Takes `n` (just opened by the engine): moves it out of the program's way,
/// records its identity and returns its slot. `n` is closed in every case.
pub fn adopt(n: i32) -> io::Result<Fd> {
    let r = adopt_number(n, true);
    close_raw(n);
    r
}

/// As `adopt`, for a descriptor the engine can do without (a file it only
/// reads now and then): refused (EMFILE) where it would take one of the
/// numbers below a soft limit under `SPARE_FLOOR`. `n` is closed in every case.
pub fn adopt_spare(n: i32) -> io::Result<Fd> {
    let r = adopt_number(n, false);
    close_raw(n);
    r
}

fn adopt_number(n: i32, inside: bool) -> io::Result<Fd> {
    let (dev, ino) = fstat(n)?;
    let high = dup_high(n, inside)?;
    for (i, s) in TABLE.iter().enumerate() {
        if s.num
            .compare_exchange(FREE, high, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.dev.store(dev, Ordering::Relaxed);
            s.ino.store(ino, Ordering::Relaxed);
            LOWEST.fetch_min(high, Ordering::AcqRel);
            return Ok(Fd(i as u16));
        }
    }
    close_raw(high);
    Err(io::Error::from_raw_os_error(libc::EMFILE))
}

/// Whether number `n` is one of the engine's descriptors.
pub fn is_engine(n: i32) -> bool {
    n >= LOWEST.load(Ordering::Acquire) && TABLE.iter().any(|s| s.num.load(Ordering::Acquire) == n)
}

/// The engine's descriptor numbers in `[first, last]`, ascending, into `out`;
/// returns how many. No allocation (the preload calls it from close_range).
pub fn numbers_in(first: i32, last: u32, out: &mut [u32; MAX_HELD]) -> usize {
    let mut n = 0;
    for s in TABLE.iter() {
        let x = s.num.load(Ordering::Acquire);
        if x >= first.max(0) && x as u32 <= last {
            // Insertion into the sorted prefix.
            let mut i = n;
            while i > 0 && out[i - 1] > x as u32 {
                out[i] = out[i - 1];
                i -= 1;
            }
            out[i] = x as u32;
            n += 1;
        }
    }
    n
}

/// Whether a descriptor was found replaced by a file of the program's.
pub fn lost() -> bool {
    LOST.load(Ordering::Acquire)
}

/// Holds off `relocate` while a number read from the table is in use.
struct Using;

impl Using {
    fn enter() -> Using {
        loop {
            let s = USERS.load(Ordering::Acquire);
            if s & WRITER == 0
                && USERS
                    .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Using;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Using {
    fn drop(&mut self) {
        USERS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Fd {
    /// Runs `f` on this descriptor's number once its identity is checked;
    /// EBADF (and `lost()`) if the number now names another file.
    pub fn with<R>(self, f: impl FnOnce(i32) -> io::Result<R>) -> io::Result<R> {
        let _using = Using::enter();
        let s = &TABLE[self.0 as usize];
        let n = s.num.load(Ordering::Acquire);
        if s.names_ours(n) {
            return f(n);
        }
        LOST.store(true, Ordering::Release);
        Err(io::Error::from_raw_os_error(libc::EBADF))
    }

    /// The number, for calls that cannot harm another file if it was replaced
    /// (fstat for accounting) and for tests.
    pub fn number(self) -> i32 {
        TABLE[self.0 as usize].num.load(Ordering::Acquire)
    }

    /// fstat of the descriptor, without the identity check (for accounting:
    /// a replaced number then describes the program's file, which is harmless).
    pub fn stat(self) -> io::Result<libc::stat> {
        stat_raw(self.number())
    }

    /// A second adopted descriptor of the same file, made directly at its
    /// high number (never for a moment at a low one the program could see).
    pub fn duplicate(self) -> io::Result<Fd> {
        self.with(|n| adopt_number(n, true))
    }

    /// In a child right after fork, while no other thread exists: makes this
    /// slot hold `n` (just opened by the engine) in place of its descriptor,
    /// which is closed. For files of the process's own /proc entry, which
    /// name the parent in the child; holders keep their `Fd`. `n` is closed in
    /// every case; on an error the slot keeps its descriptor.
    pub fn replace_in_child(self, n: i32) -> io::Result<()> {
        let r = fstat(n).and_then(|id| Ok((id, dup_high(n, true)?)));
        close_raw(n);
        let ((dev, ino), high) = r?;
        let s = &TABLE[self.0 as usize];
        let _using = Using::enter();
        let old = s.num.load(Ordering::Acquire);
        if s.names_ours(old) {
            close_raw(old);
        }
        s.dev.store(dev, Ordering::Relaxed);
        s.ino.store(ino, Ordering::Relaxed);
        s.num.store(high, Ordering::Release);
        LOWEST.fetch_min(high, Ordering::AcqRel);
        Ok(())
    }

    /// Closes the descriptor and frees its slot.
    pub fn close(self) {
        let s = &TABLE[self.0 as usize];
        let _using = Using::enter();
        let n = s.num.load(Ordering::Acquire);
        // Closed only if it is still ours: a replaced number is the program's file.
        if s.names_ours(n) {
            close_raw(n);
        }
        s.num.store(FREE, Ordering::Release);
    }
}

/// The program is about to take number `n` (dup2/dup3 onto it): if it is one
/// of the engine's, moves the engine's descriptor to another number first.
/// Returns false if `n` is the engine's and could not be moved: no free
/// number, or uses in flight did not end within `RELOCATE_WAIT` (a signal
/// handler calling dup2 on a thread that is inside the engine). The caller
/// then fails the program's call with EBUSY, which dup2 may return anyway.
pub fn relocate(n: i32) -> bool {
    if !is_engine(n) {
        return true;
    }
    let deadline = std::time::Instant::now() + RELOCATE_WAIT;
    // Wait for uses in flight to end and hold off new ones.
    loop {
        let s = USERS.load(Ordering::Acquire);
        if s & WRITER == 0
            && USERS
                .compare_exchange_weak(s, s | WRITER, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            break;
        }
        std::thread::yield_now();
    }
    while USERS.load(Ordering::Acquire) != WRITER {
        if std::time::Instant::now() > deadline {
            USERS.fetch_and(!WRITER, Ordering::AcqRel);
            return false;
        }
        std::thread::yield_now();
    }
    let mut moved = true;
    for s in TABLE.iter().filter(|s| s.num.load(Ordering::Acquire) == n) {
        match dup_high(n, true) {
            Ok(high) => {
                s.num.store(high, Ordering::Release);
                LOWEST.fetch_min(high, Ordering::AcqRel);
                close_raw(n);
            }
            Err(_) => moved = false,
        }
    }
    USERS.fetch_and(!WRITER, Ordering::AcqRel);
    moved
}

/// In a child after fork: the threads that held uses are gone.
pub fn after_fork_child() {
    USERS.store(0, Ordering::Release);
}
