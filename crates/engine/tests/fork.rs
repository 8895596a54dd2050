//! fork(2) with engine memory: both processes must keep reading exactly what
//! plain memory would hold, whatever state the pages were in at the fork
//! (owned, shared by a virtual copy, merged, zero-folded, diverged), and both
//! must keep working (write, copy, scan, free) afterwards.
//!
//! The child reports through a pipe and its exit status (it ends with
//! `libc::_exit`, never returning into the test harness). Each test runs in a
//! process of its own (`common::in_own_process`), so its children find no
//! lock held by another test's thread; within one process the tests run one
//! at a time: one of them changes the process-global mmap fault injection,
//! and counting descriptors needs a quiet process.

mod common;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, Inject, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

static SERIAL: Mutex<()> = Mutex::new(());
/// Set when a test body overran its deadline: its scanner threads stop.
static ABANDONED: AtomicBool = AtomicBool::new(false);

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` (one at a time) in a thread of its own and fails the test if it
/// takes longer than `limit`: a thread writing to a page the engine left
/// write-protected sleeps forever, and a test must report that, not hang.
fn with_deadline(name: &str, limit: Duration, body: impl FnOnce() + Send + 'static) {
    let _g = serial();
    ABANDONED.store(false, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let _ = tx.send(());
            if let Err(p) = r {
                std::panic::resume_unwind(p);
            }
        })
        .unwrap();
    match rx.recv_timeout(limit) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            ABANDONED.store(true, Ordering::SeqCst);
            panic!(
                "{name}: still running after {limit:?}: a thread is stuck (in a write to engine memory, \
                 see /proc/<pid>/task/*/stack: handle_userfault means a page was left write-protected)"
            );
        }
    }
}

fn stopped(stop: &AtomicBool) -> bool {
    stop.load(Ordering::Relaxed) || ABANDONED.load(Ordering::Relaxed)
}

fn seed() -> u64 {
    std::env::var("PAGEFOLD_FORK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

fn pattern(p: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|i| ((i * (2 * p + 5)) as u8) ^ (p as u8).wrapping_mul(37) | 0x20)
        .collect()
}

type Check = Result<(), String>;

/// An engine block and its plain-memory shadow.
struct Blk {
    name: String,
    ptr: *mut u8,
    shadow: Vec<u8>,
}

impl Blk {
    fn new(e: &Engine, name: &str, pages: usize, hint: Hint) -> Blk {
        let ptr = e.alloc(pages * PAGE, hint);
        assert!(!ptr.is_null(), "alloc failed");
        Blk {
            name: name.into(),
            ptr,
            shadow: vec![0; pages * PAGE],
        }
    }
    fn len(&self) -> usize {
        self.shadow.len()
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        self.shadow[off..off + data.len()].copy_from_slice(data);
    }
    fn check(&self, ctx: &str) -> Check {
        let got = bytes(self.ptr, self.len());
        if got == &self.shadow[..] {
            return Ok(());
        }
        let first = (0..self.len()).find(|&i| got[i] != self.shadow[i]).unwrap();
        let bad = (0..self.len())
            .filter(|&i| got[i] != self.shadow[i])
            .count();
        Err(format!(
            "{ctx}: block '{}' differs from plain memory: first at byte {first} (page {} + {}), {bad} bytes \
             differ; got {:02x?} want {:02x?}",
            self.name,
            first / PAGE,
            first % PAGE,
            &got[first..(first + 8).min(self.len())],
            &self.shadow[first..(first + 8).min(self.len())]
        ))
    }
}

fn check_all(blocks: &[Blk], ctx: &str) -> Check {
    blocks.iter().try_for_each(|b| b.check(ctx))
}

/// Blocks holding pages in every state: owned, shared by a virtual copy,
/// diverged, zero-folded, merged within and across blocks.
fn fixture(e: &Engine) -> Vec<Blk> {
    let n = 32;
    let mut owned = Blk::new(e, "owned", n, Hint::FullWrite);
    let mut src = Blk::new(e, "src", n, Hint::None);
    for p in 0..n {
        owned.write(p * PAGE, &pattern(300 + p));
        src.write(p * PAGE, &pattern(100 + p));
    }
    let mut cow = Blk::new(e, "cow (copy of src)", n, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(cow.ptr, src.ptr, n * PAGE) };
    cow.shadow.copy_from_slice(&src.shadow);
    for p in 8..12 {
        cow.write(p * PAGE + 17, b"diverged");
    }
    for p in 20..26 {
        cow.write(p * PAGE, &vec![0u8; PAGE]);
    }
    // Half a virtual copy, half owned pages: one block, two kinds of mapping.
    let mut half = Blk::new(e, "half (copy + owned)", n, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(half.ptr, src.ptr, n / 2 * PAGE) };
    half.shadow[..n / 2 * PAGE].copy_from_slice(&src.shadow[..n / 2 * PAGE]);
    for p in n / 2..n {
        half.write(p * PAGE, &pattern(400 + p));
    }
    let mut zero = Blk::new(e, "zero", n, Hint::FullWrite);
    for p in 0..n {
        zero.write(p * PAGE, &pattern(200 + p));
    }
    for p in 1..n - 1 {
        zero.write(p * PAGE, &vec![0u8; PAGE]);
    }
    let mut dup = Blk::new(e, "dup", n, Hint::None);
    let mut dup2 = Blk::new(e, "dup2", n / 2, Hint::None);
    for p in 0..n {
        dup.write(p * PAGE, &pattern(p % 3));
    }
    for p in 0..n / 2 {
        dup2.write(p * PAGE, &pattern(p % 3));
    }
    e.scan();
    e.scan();
    let s = e.stats();
    assert!(
        s.pages_shared_by_copy > 0 && s.merged > 0 && s.zero_folded > 0,
        "fixture not in shape: {s:?}"
    );
    let blocks = vec![owned, src, cow, half, zero, dup, dup2];
    check_all(&blocks, "fixture before fork").unwrap();
    blocks
}

/// Random writes, virtual and plain copies, allocations, frees and scans,
/// checked against the shadows.
fn churn(e: &Engine, blocks: &mut Vec<Blk>, rng: &mut StdRng, ops: usize, who: &str) -> Check {
    for op in 0..ops {
        let ctx = format!("{who} op {op}");
        let bi = rng.gen_range(0..blocks.len());
        match rng.gen_range(0..10) {
            0 | 1 => {
                // Many pages at once, shared ones included.
                let np = blocks[bi].len() / PAGE;
                for _ in 0..np / 2 {
                    let p = rng.gen_range(0..np);
                    let content = match rng.gen_range(0..3) {
                        0 => vec![0u8; PAGE],
                        1 => pattern(rng.gen_range(0..3)),
                        _ => (0..PAGE).map(|_| rng.gen()).collect(),
                    };
                    blocks[bi].write(p * PAGE, &content);
                }
            }
            2 => {
                let off = rng.gen_range(0..blocks[bi].len());
                blocks[bi].write(off, &[rng.gen()]);
            }
            3 | 4 => {
                let di = rng.gen_range(0..blocks.len());
                let max = blocks[bi].len().min(blocks[di].len());
                let len = rng.gen_range(1..=max);
                let soff = rng.gen_range(0..=blocks[bi].len() - len);
                let doff = if rng.gen_bool(0.7) {
                    let r = soff % PAGE;
                    if r + len > blocks[di].len() {
                        continue;
                    }
                    rng.gen_range(0..=(blocks[di].len() - len - r) / PAGE) * PAGE + r
                } else {
                    rng.gen_range(0..=blocks[di].len() - len)
                };
                let (s, d) = (blocks[bi].ptr, blocks[di].ptr);
                // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
                // length copied.
                unsafe { e.copy(d.add(doff), s.add(soff), len) };
                if bi == di {
                    blocks[bi].shadow.copy_within(soff..soff + len, doff);
                } else {
                    let tmp = blocks[bi].shadow[soff..soff + len].to_vec();
                    blocks[di].shadow[doff..doff + len].copy_from_slice(&tmp);
                }
                blocks[di].check(&format!("{ctx}: copy destination"))?;
            }
            5 if blocks.len() < 12 => {
                let pages = rng.gen_range(1..=48);
                let mut b = Blk::new(
                    e,
                    &format!("{who}-new{op}"),
                    pages,
                    if rng.gen() {
                        Hint::FullWrite
                    } else {
                        Hint::None
                    },
                );
                b.check(&format!("{ctx}: fresh block"))?;
                for p in 0..pages {
                    if rng.gen_bool(0.5) {
                        b.write(p * PAGE, &pattern(rng.gen_range(0..4)));
                    }
                }
                blocks.push(b);
            }
            6 if blocks.len() > 3 => {
                blocks[bi].check(&format!("{ctx}: before free"))?;
                let b = blocks.swap_remove(bi);
                // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
                // uses it after this free.
                if !unsafe { e.free(b.ptr) } {
                    return Err(format!("{ctx}: free of '{}' returned false", b.name));
                }
            }
            7 => {
                e.scan();
            }
            _ => blocks[bi].check(&ctx)?,
        }
    }
    check_all(blocks, &format!("{who} after churn"))
}

fn free_all(e: &Engine, blocks: &mut Vec<Blk>, who: &str) -> Check {
    check_all(blocks, &format!("{who} before freeing all"))?;
    for b in blocks.drain(..) {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        if !unsafe { e.free(b.ptr) } {
            return Err(format!("{who}: free of '{}' returned false", b.name));
        }
    }
    Ok(())
}

/// A forked child, talking over pipes.
struct Child {
    pid: i32,
    report: i32,
    to_child: i32,
}

/// Forks; the child runs `body` with (read end of the parent's messages),
/// sends its error text (if any) up the report pipe and `_exit`s with 0 on
/// success, 1 on a failed check, 2 on a panic.
fn spawn(body: impl FnOnce(i32) -> Check) -> Child {
    let (mut up, mut down) = ([0i32; 2], [0i32; 2]);
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe {
        assert_eq!(libc::pipe2(up.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(down.as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    // SAFETY: every caller runs alone in its process (in_own_process): at the
    // fork only its own threads run, so no other test's thread holds a lock;
    // the child touches only the caller's memory and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        unsafe {
            libc::close(up[0]);
            libc::close(down[1]);
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(down[0])));
        let (code, msg) = match r {
            Ok(Ok(())) => (0, String::new()),
            Ok(Err(m)) => (1, m),
            Err(p) => (2, format!("child panicked: {}", panic_text(&p))),
        };
        // SAFETY: _exit ends the child at once, running no destructors.
        unsafe {
            libc::write(up[1], msg.as_ptr().cast(), msg.len());
            libc::_exit(code);
        }
    }
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe {
        libc::close(up[1]);
        libc::close(down[0]);
    }
    Child {
        pid,
        report: up[0],
        to_child: down[1],
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "?".into())
}

impl Child {
    /// Lets the child go on past its `wait_parent`.
    fn release(&self) {
        assert_eq!(
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            unsafe { libc::write(self.to_child, b"g".as_ptr().cast(), 1) },
            1
        );
    }

    /// Waits for the child (killing it after `limit`); Ok if it passed.
    fn wait(self, limit: Duration) -> Check {
        let t = Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: status is a writable local; waitpid reaps only the given child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                break;
            }
            if t.elapsed() > limit {
                // SAFETY: status is a writable local; waitpid reaps only the given child.
                unsafe {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, &mut status, 0);
                }
                return Err(format!(
                    "child {} hung for {limit:?} and was killed",
                    self.pid
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut msg = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: the buffer is live, writable and at least the length passed; the descriptor
            // is this test's own.
            let n = unsafe { libc::read(self.report, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            msg.extend_from_slice(&buf[..n as usize]);
        }
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        unsafe {
            libc::close(self.report);
            libc::close(self.to_child);
        }
        let msg = String::from_utf8_lossy(&msg);
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Ok(())
        } else if libc::WIFEXITED(status) {
            Err(format!(
                "child failed (exit status {}): {msg}",
                libc::WEXITSTATUS(status)
            ))
        } else {
            Err(format!(
                "child died by signal {}: {msg}",
                libc::WTERMSIG(status)
            ))
        }
    }
}

/// In the child: blocks until the parent calls `release`.
fn wait_parent(fd: i32) {
    let mut b = [0u8; 1];
    // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is this
    // test's own.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
}

/// Writes that make every page of every block private to this process.
fn scribble(blocks: &mut [Blk], tag: u8) {
    for b in blocks.iter_mut() {
        for p in (0..b.len() / PAGE).step_by(2) {
            let off = p * PAGE + (tag as usize * 13) % PAGE;
            b.write(off, &[tag, tag ^ 0x5a, tag]);
        }
    }
}

#[test]
fn fork_after_copies_and_scan_keeps_both_processes_right() {
    if !common::in_own_process("fork_after_copies_and_scan_keeps_both_processes_right") {
        return;
    }
    with_deadline(
        "fork_after_copies_and_scan_keeps_both_processes_right",
        Duration::from_secs(60),
        fork_after_copies_and_scan_keeps_both_processes_right_body,
    );
}

fn fork_after_copies_and_scan_keeps_both_processes_right_body() {
    let seed = seed();
    eprintln!("PAGEFOLD_FORK_SEED={seed}");
    let e = Engine::new(Config::default());
    let mut blocks = fixture(&e);
    let (ready_r, ready_w) = {
        let mut p = [0i32; 2];
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (p[0], p[1])
    };

    let child = {
        let e = e.clone();
        let blocks = &mut blocks;
        spawn(move |from_parent| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xc41d);
            check_all(blocks, "child right after fork")?;
            // Write into many pages, shared, merged and folded ones too.
            scribble(blocks, 0xC1);
            check_all(blocks, "child after its writes")?;
            // Let the parent write too, then check the parent's writes did not reach us.
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            unsafe { libc::write(ready_w, b"r".as_ptr().cast(), 1) };
            wait_parent(from_parent);
            check_all(blocks, "child after the parent wrote its own copy")?;
            churn(&e, blocks, &mut rng, 150, "child")?;
            e.scan();
            check_all(blocks, "child after its scan")?;
            free_all(&e, blocks, "child")?;
            let s = e.stats();
            if s.blocks != 0 {
                return Err(format!("child: blocks left after freeing all: {s:?}"));
            }
            Ok(())
        })
    };
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe { libc::close(ready_w) };
    // The child has written; the parent's view must not have moved.
    let mut b = [0u8; 1];
    assert_eq!(
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        unsafe { libc::read(ready_r, b.as_mut_ptr().cast(), 1) },
        1,
        "child died before writing"
    );
    let parent_check = check_all(&blocks, "parent after the child wrote");
    scribble(&mut blocks, 0x9A);
    child.release();
    let child_result = child.wait(Duration::from_secs(120));
    parent_check.unwrap();
    child_result.unwrap();
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe { libc::close(ready_r) };

    check_all(&blocks, "parent after the child exited").unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    churn(&e, &mut blocks, &mut rng, 300, "parent after fork").unwrap();
    let s = e.stats();
    assert!(s.frames_active, "parent lost its frames after fork: {s:?}");
    free_all(&e, &mut blocks, "parent").unwrap();
    assert_eq!(e.stats().blocks, 0);
}

#[test]
fn fork_while_background_scanning() {
    if !common::in_own_process("fork_while_background_scanning") {
        return;
    }
    with_deadline(
        "fork_while_background_scanning",
        Duration::from_secs(60),
        fork_while_background_scanning_body,
    );
}

fn fork_while_background_scanning_body() {
    let seed = seed();
    eprintln!("PAGEFOLD_FORK_SEED={seed}");
    let cfg = Config {
        scan_interval: Some(Duration::from_millis(1)),
        scan_cpu_budget: 1.0,
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let mut blocks = fixture(&e);
    // A second scanner of our own, so a scan is very likely in progress at each fork.
    let stop = Arc::new(AtomicBool::new(false));
    let scans = Arc::new(AtomicU64::new(0));
    let scanner = {
        let (e, stop, scans) = (e.clone(), stop.clone(), scans.clone());
        std::thread::spawn(move || {
            while !stopped(&stop) {
                e.scan();
                scans.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut result = Ok(());
    for round in 0..12 {
        let child = {
            let e = e.clone();
            let blocks = &mut blocks;
            spawn(move |_| {
                let mut rng = StdRng::seed_from_u64(seed ^ round);
                check_all(blocks, &format!("child {round} right after fork"))?;
                scribble(blocks, 0x40 + round as u8);
                check_all(blocks, &format!("child {round} after its writes"))?;
                churn(&e, blocks, &mut rng, 60, &format!("child {round}"))?;
                if round % 3 == 0 {
                    // The inherited scanner handle names a thread that does not exist here.
                    e.stop_background();
                }
                free_all(&e, blocks, &format!("child {round}"))?;
                drop(e);
                Ok(())
            })
        };
        // The parent works on while the child runs.
        let r = churn(
            &e,
            &mut blocks,
            &mut rng,
            40,
            &format!("parent round {round}"),
        );
        let c = child.wait(Duration::from_secs(60));
        if let Err(m) = r.and(c) {
            result = Err(format!("seed {seed} round {round}: {m}"));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    scanner.join().unwrap();
    result.unwrap();
    check_all(&blocks, "parent at the end").unwrap();
    assert!(scans.load(Ordering::Relaxed) > 0);
    free_all(&e, &mut blocks, "parent").unwrap();
}

/// After a fork, the parent's pre-fork blocks must still be scanned, and a
/// scan must never leave a page write-protected: with no fault handler, a
/// writer to such a page sleeps until the engine is dropped.
#[test]
fn parent_scans_after_fork_without_stranding_writers() {
    if !common::in_own_process("parent_scans_after_fork_without_stranding_writers") {
        return;
    }
    with_deadline(
        "parent_scans_after_fork_without_stranding_writers",
        Duration::from_secs(60),
        parent_scans_after_fork_without_stranding_writers_body,
    );
}

fn parent_scans_after_fork_without_stranding_writers_body() {
    let e = Engine::new(Config::default());
    let mut a = Blk::new(&e, "a", 4, Hint::None);
    let mut b = Blk::new(&e, "b", 8, Hint::None);
    for p in 0..4 {
        a.write(p * PAGE, &pattern(p));
    }
    for p in 0..8 {
        b.write(p * PAGE, &pattern(10 + p));
    }
    // b: pages 0..4 shared with a by a virtual copy, pages 4..8 owned.
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b.ptr, a.ptr, 4 * PAGE) };
    b.shadow[..4 * PAGE].copy_from_slice(&a.shadow);
    spawn(|_| Ok(())).wait(Duration::from_secs(30)).unwrap();

    // Zero pages for the scan to fold, in both blocks.
    a.write(3 * PAGE, &vec![0u8; PAGE]);
    b.write(6 * PAGE, &vec![0u8; PAGE]);
    b.write(7 * PAGE, &vec![0u8; PAGE]);
    let before = e.stats();
    // The first scan only looks (volatility check); the second folds.
    e.scan();
    let r = e.scan();

    // Every page must still be writable, promptly.
    let (tx, rx) = std::sync::mpsc::channel();
    let targets: Vec<usize> = [(a.ptr as usize, 4usize), (b.ptr as usize, 8usize)]
        .into_iter()
        .flat_map(|(base, n)| (0..n).map(move |p| base + p * PAGE + 99))
        .collect();
    std::thread::spawn(move || {
        for addr in targets {
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            unsafe { *(addr as *mut u8) = 0x77 };
            let _ = tx.send(addr);
        }
    });
    let mut written = 0;
    while written < 12 {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(_) => written += 1,
            Err(_) => panic!(
                "after a fork and a scan in the parent, a write to engine page #{written} of [a 0..4, b 0..8] \
                 has been blocked for 10 s (page left write-protected); scan: {r:?}"
            ),
        }
    }
    for (blk, n) in [(&mut a, 4), (&mut b, 8)] {
        for p in 0..n {
            blk.shadow[p * PAGE + 99] = 0x77;
        }
    }
    check_all(&[a, b], "after writes").unwrap();
    let after = e.stats();
    assert!(
        after.zero_folded >= before.zero_folded + 3,
        "the parent's scan after fork folded {} of the 3 zero pages written after the fork: {r:?}",
        after.zero_folded - before.zero_folded
    );
}

/// Frames used before a fork are retired (never punched nor reused). Once
/// the child has exited and the parent freed every block, nothing uses them.
#[test]
fn frames_are_released_after_fork_and_free() {
    if !common::in_own_process("frames_are_released_after_fork_and_free") {
        return;
    }
    with_deadline(
        "frames_are_released_after_fork_and_free",
        Duration::from_secs(60),
        frames_are_released_after_fork_and_free_body,
    );
}

fn frames_are_released_after_fork_and_free_body() {
    let e = Engine::new(Config::default());
    let mut blocks = fixture(&e);
    spawn(|_| Ok(())).wait(Duration::from_secs(30)).unwrap();
    free_all(&e, &mut blocks, "parent").unwrap();
    let s = e.stats();
    assert_eq!(s.blocks, 0, "{s:?}");
    assert_eq!(
        s.frames_in_use, 0,
        "after fork, child exit and freeing every block the engine still reports frames in use: {s:?}"
    );
    assert_eq!(
        s.frames_resident, 0,
        "after fork, child exit and freeing every block the engine still holds frames in memory: {s:?}"
    );
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn vm_size_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A program that forks again and again (a snapshotting server, R's
/// mclapply) must not pay a descriptor and address space per fork forever.
#[test]
fn repeated_forks_do_not_accumulate_pools() {
    if !common::in_own_process("repeated_forks_do_not_accumulate_pools") {
        return;
    }
    with_deadline(
        "repeated_forks_do_not_accumulate_pools",
        Duration::from_secs(60),
        repeated_forks_do_not_accumulate_pools_body,
    );
}

fn repeated_forks_do_not_accumulate_pools_body() {
    let e = Engine::new(Config::default());
    let mut b = Blk::new(&e, "b", 16, Hint::FullWrite);
    for p in 0..16 {
        b.write(p * PAGE, &pattern(p));
    }
    spawn(|_| Ok(())).wait(Duration::from_secs(30)).unwrap();
    let (fds0, vm0) = (open_fds(), vm_size_kib());
    let forks = 48;
    for i in 0..forks {
        spawn(|_| Ok(())).wait(Duration::from_secs(30)).unwrap();
        // The parent keeps using its memory between forks.
        b.write((i % 16) * PAGE + i, &[i as u8]);
    }
    b.check("after the forks").unwrap();
    let (fds1, vm1) = (open_fds(), vm_size_kib());
    let s = e.stats();
    assert!(s.frames_active, "{s:?}");
    assert!(
        fds1 <= fds0 + 4,
        "{forks} forks left {} more open descriptors (VmSize grew by {} GiB): {s:?}",
        fds1 as i64 - fds0 as i64,
        (vm1 as i64 - vm0 as i64) >> 20
    );
    assert!(
        vm1 <= vm0 + (64 << 20),
        "{forks} forks grew the address space by {} GiB",
        (vm1 - vm0) >> 20
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b.ptr) };
}

/// Every engine mmap after the allocation's own fails (injected ENOMEM), so
/// nothing the engine maps at the fork can be taken for granted; the two
/// processes must still not see each other's writes to owned pages.
#[test]
fn fork_under_mmap_failures_keeps_processes_apart() {
    if !common::in_own_process("fork_under_mmap_failures_keeps_processes_apart") {
        return;
    }
    with_deadline(
        "fork_under_mmap_failures_keeps_processes_apart",
        Duration::from_secs(60),
        fork_under_mmap_failures_keeps_processes_apart_body,
    );
}

fn fork_under_mmap_failures_keeps_processes_apart_body() {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            // Engine::new sets the process-global injection: back to none.
            drop(Engine::new(Config::default()));
        }
    }
    let _reset = Reset;
    // One mmap allowed: the allocation's own; the freeze at fork gets ENOMEM.
    let cfg = Config {
        inject: Inject {
            fail_mmap_after: Some(1),
            ..Inject::default()
        },
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let mut b = Blk::new(&e, "owned", 8, Hint::FullWrite);
    for p in 0..8 {
        b.write(p * PAGE, &pattern(p));
    }
    let (ready_r, ready_w) = {
        let mut p = [0i32; 2];
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (p[0], p[1])
    };
    let child = {
        let b = &mut b;
        spawn(move |from_parent| {
            b.check("child right after fork")?;
            b.write(0, &[0xEE; 64]);
            // SAFETY: the buffer is live and at least the length passed; the descriptor is this
            // test's own.
            unsafe { libc::write(ready_w, b"r".as_ptr().cast(), 1) };
            wait_parent(from_parent);
            b.check("child after the parent wrote page 1")
        })
    };
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe { libc::close(ready_w) };
    let mut x = [0u8; 1];
    assert_eq!(
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        unsafe { libc::read(ready_r, x.as_mut_ptr().cast(), 1) },
        1,
        "child died early"
    );
    let parent_view = b.check("parent after the child wrote page 0");
    b.write(PAGE, &[0xDD; 64]);
    child.release();
    let child_view = child.wait(Duration::from_secs(30));
    // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
    // names and local out-arrays; errors are checked.
    unsafe { libc::close(ready_r) };
    let s = e.stats();
    parent_view.unwrap_or_else(|m| panic!("{m} (mmap fallbacks {})", s.fallbacks.mmap));
    child_view.unwrap();
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(b.ptr) };
}
