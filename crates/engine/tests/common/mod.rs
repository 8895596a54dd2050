//! Helpers several engine test files share (each test file is its own crate,
//! so not every one uses every helper).
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Names the one test a re-executed test binary runs (see [`in_own_process`]).
const OWN_PROCESS: &str = "PAGEFOLD_TEST_OWN_PROCESS";

/// How long a test run by [`in_own_process`] may take before it counts as hung.
const OWN_PROCESS_LIMIT: Duration = Duration::from_secs(180);

/// Whether the calling test, `test_name` (its path as libtest names it, as
/// `--exact` takes it), runs its body in this process. Every test that forks
/// starts with `if !common::in_own_process("name") { return; }`.
///
/// In the test harness it returns false, after running this test binary
/// again for that one test (`name --exact --test-threads=1 --nocapture`,
/// with `PAGEFOLD_TEST_OWN_PROCESS=name`, in a process group of its own) and
/// waiting for it: the test fails, showing that run's output, unless the run
/// passed exactly one test within [`OWN_PROCESS_LIMIT`]; a run that hangs is
/// killed with every process it forked. In that run it returns true: the
/// process then has libtest's main thread, waiting, and this test's thread,
/// so no other thread holds a lock (an allocator's, std's thread registry)
/// at the body's fork, and the forked child can allocate and start threads.
pub fn in_own_process(test_name: &str) -> bool {
    if let Some(own) = std::env::var_os(OWN_PROCESS) {
        assert_eq!(
            own.to_str(),
            Some(test_name),
            "{OWN_PROCESS} names another test than the one running"
        );
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and changes
        // only this process's signal on its parent's death: a killed harness
        // takes this run along.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        return true;
    }
    // libtest names a test's thread after the test: a misspelt name fails
    // here rather than as a run of no test.
    if let Some(thread) = std::thread::current().name() {
        assert!(
            thread == "main" || thread == test_name,
            "in_own_process({test_name:?}) called from test {thread:?}"
        );
    }
    let log_path = std::env::temp_dir().join(format!(
        "pagefold-own-process-{}-{test_name}.log",
        std::process::id()
    ));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([test_name, "--exact", "--test-threads=1", "--nocapture"])
            .env(OWN_PROCESS, test_name)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > OWN_PROCESS_LIMIT {
            // SAFETY: kill takes plain integers; the child leads a process
            // group of its own (process_group(0)) and is not reaped yet, so
            // the group is its own and holds only it and what it forked.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    let Some(status) = status else {
        panic!(
            "{test_name}: still running after {OWN_PROCESS_LIMIT:?}, killed; its output:\n{out}"
        );
    };
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            panic!("{test_name}: its process was killed by signal {sig}; its output:\n{out}");
        }
    }
    assert!(
        status.success(),
        "{test_name}: {status}; its output:\n{out}"
    );
    assert!(
        out.lines().any(|l| l == "running 1 test")
            && out.lines().any(|l| l.starts_with("test result: ok. 1 passed;")),
        "{test_name}: the test binary run for it alone did not pass exactly one test; its output:\n{out}"
    );
    eprint!("{out}");
    false
}

/// A pipe with room for the largest transfer, so one thread can write then read.
pub fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a writable array of two ints, as pipe2 requires.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fds[1] is the pipe's write end, just opened; F_SETPIPE_SZ takes an int.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) };
    (fds[0], fds[1])
}

/// A connected pair of Unix stream sockets.
pub fn socketpair() -> (i32, i32) {
    let mut fds = [0i32; 2];
    assert_eq!(
        // SAFETY: fds is a writable array of two ints, as socketpair requires.
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        },
        0
    );
    (fds[0], fds[1])
}

/// Runs `body` in its own thread and fails if it takes longer than `limit`
/// (a fault nobody answers hangs the thread that took it).
pub fn with_deadline(name: &str, limit: Duration, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(());
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    });
    match rx.recv_timeout(limit) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(_) => panic!(
            "{name}: still running after {limit:?}: a touch of an evicted page was never answered"
        ),
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by tests of one file that must not run at the same time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `len` bytes at `p`.
pub fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: every caller passes a live mapping of at least `len` readable
    // bytes that outlives its use of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// Waits for child `pid` and asserts it died of SIGBUS — or SIGABRT where
/// UFFDIO_POISON is missing (before 6.6), when the engine aborts instead —
/// for touching a page whose content is lost; returns the signal.
pub fn assert_killed_for_lost_page(pid: i32, what: &str) -> i32 {
    let mut status = 0;
    // SAFETY: status is a writable int; waitpid only reaps the given child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && matches!(libc::WTERMSIG(status), libc::SIGBUS | libc::SIGABRT),
        "{what} must not be read: child status {status:#x}"
    );
    libc::WTERMSIG(status)
}

/// A random page, different for every seed: nothing compresses it, and no
/// two of them are similar.
pub fn incompressible(seed: u64) -> Vec<u8> {
    pagefold_tier::kinds::page(pagefold_tier::kinds::Kind::Random, seed)
}

/// Mappings of /proc/self/maps overlapping `[lo, hi)`.
pub fn maps_in(lo: usize, hi: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            a < hi && lo < b
        })
        .count()
}

/// Waits past the default recycling age (250 ms), scans (which gives back
/// the recycled blocks that waited longer), and checks that the engine holds
/// no frame, recycled byte or mapping any more.
pub fn assert_all_given_back(e: &pagefold_engine::Engine, ctx: &str) {
    std::thread::sleep(Duration::from_millis(300));
    e.scan();
    let s = e.stats();
    assert_eq!(
        (s.frames_in_use, s.recycled_bytes, s.vmas_used),
        (0, 0, 0),
        "{ctx}: {s:?}"
    );
}

/// Drops CAP_SYS_RESOURCE from the calling thread's effective set (a no-op
/// without it), so no descriptor limit can be raised above the hard one.
pub fn drop_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: h and d are live locals of the layout capget and capset take.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) != 0 {
            return false;
        }
        d[0].effective &= !(1 << CAP_SYS_RESOURCE);
        libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) == 0
    }
}

/// The /proc/self/pagemap entry of the page at `p` (bit 63: present, bit 57:
/// userfaultfd write protection).
pub fn pagemap_entry(p: *const u8) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (p as u64 / pagefold_engine::PAGE as u64) * 8)
        .unwrap();
    u64::from_le_bytes(b)
}
