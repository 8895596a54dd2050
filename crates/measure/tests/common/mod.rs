//! A helper child for the integration tests: the test binary re-executes
//! itself (test `helper_entry`, env PAGEFOLD_MEASURE_HELPER=1) and then obeys
//! one command per stdin line, answering lines that start with "pf:" (libtest
//! prints its own lines on the same stdout). Memory it maps is never freed,
//! so a measurement taken after a command sees it. It exits at stdin EOF.

#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub const MIB: u64 = 1 << 20;
const HELPER_ENV: &str = "PAGEFOLD_MEASURE_HELPER";

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs the helper loop if this process was started as the helper; returns
/// at once in a normal test run.
pub fn run_helper_if_requested() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    reply("ready");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = obey(&words);
        reply(&answer);
    }
    std::process::exit(0);
}

fn reply(text: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "pf:{text}").unwrap();
    out.flush().unwrap();
}

fn number(words: &[&str], i: usize) -> u64 {
    words
        .get(i)
        .and_then(|w| w.parse().ok())
        .expect("numeric argument")
}

fn obey(words: &[&str]) -> String {
    match words.first().copied().unwrap_or("") {
        "anon" => anon(number(words, 1) * MIB),
        "same_content" => same_content(number(words, 1) * MIB),
        "written_zero" => written_zero(number(words, 1) * MIB),
        "memfd_shared_twice" => memfd_shared_twice(number(words, 1) * MIB),
        "memfd_private" => memfd_private(number(words, 1) * MIB, number(words, 2) * MIB),
        "memfd_unmapped" => memfd_unmapped(number(words, 1) * MIB),
        "fork_shared" => return format!("ok {}", fork_shared(number(words, 1) * MIB)),
        "measure_self" => return measured(pagefold_measure::measure_self()),
        "measure" => return measured(pagefold_measure::measure_pid(number(words, 1) as u32)),
        "exit" => std::process::exit(0),
        other => panic!("unknown helper command {other:?}"),
    }
    "ok".to_string()
}

fn measured(result: Result<pagefold_measure::Footprint, pagefold_measure::Error>) -> String {
    match result {
        Ok(fp) => format!("method {}", fp.method),
        Err(e) => format!("error {e:?}"),
    }
}

fn page_size() -> usize {
    pagefold_measure::page_size() as usize
}

/// mmap that panics on failure; the mapping is never unmapped.
fn map(len: u64, flags: i32, fd: i32) -> *mut u8 {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new mapping at an address the kernel picks.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, prot, flags, fd, 0) };
    assert_ne!(
        addr,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    addr as *mut u8
}

/// Writes a value no other page holds into every page (so that nothing
/// could merge them), or reads every page.
fn touch(base: *mut u8, len: u64, write: bool) {
    let seed = (std::process::id() as u64) << 32;
    for page in 0..len as usize / page_size() {
        // SAFETY: every caller passes a mapping made by `map` (and still
        // mapped) with at least `len` bytes from `base` on, and this word
        // lies in page `page` < len / page_size of it.
        unsafe {
            let at = base.add(page * page_size()) as *mut u64;
            if write {
                at.write_volatile(seed ^ (base as u64 + page as u64));
            } else {
                at.read_volatile();
            }
        }
    }
}

fn anon(len: u64) {
    let base = map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
    touch(base, len, true);
}

/// Anonymous memory whose every page holds the same content.
fn same_content(len: u64) {
    let base = map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
    // SAFETY: `base` is a fresh mapping of `len` writable bytes, never unmapped.
    unsafe { std::slice::from_raw_parts_mut(base, len as usize) }.fill(0x5a);
}

/// Anonymous memory every page of which was written, then zeroed: each on a
/// frame of its own, all holding zeros.
fn written_zero(len: u64) {
    let base = map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
    touch(base, len, true);
    // SAFETY: as in `same_content`.
    unsafe { std::slice::from_raw_parts_mut(base, len as usize) }.fill(0);
}

fn new_memfd(len: u64) -> i32 {
    // SAFETY: valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"pagefold-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is the memfd just created.
    assert_eq!(unsafe { libc::ftruncate(fd, len as i64) }, 0);
    fd
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor this helper owns.
    unsafe { libc::close(fd) };
}

/// One memfd mapped MAP_SHARED twice, both mappings touching every page;
/// the descriptor is closed so only the mappings lead to the file.
fn memfd_shared_twice(len: u64) {
    let fd = new_memfd(len);
    let first = map(len, libc::MAP_SHARED, fd);
    let second = map(len, libc::MAP_SHARED, fd);
    close(fd);
    touch(first, len, true);
    touch(second, len, false);
}

/// A memfd filled through a shared mapping (then unmapped), mapped
/// MAP_PRIVATE; `written` bytes of it written (private copies), the rest read.
fn memfd_private(len: u64, written: u64) {
    let fd = new_memfd(len);
    let filler = map(len, libc::MAP_SHARED, fd);
    touch(filler, len, true);
    // SAFETY: unmapping the mapping made just above.
    unsafe { libc::munmap(filler as *mut libc::c_void, len as usize) };
    let private = map(len, libc::MAP_PRIVATE, fd);
    close(fd);
    touch(private, written, true);
    // SAFETY: written <= len (the test's command), so [written, len) lies
    // inside the private mapping of `len` bytes.
    touch(
        unsafe { private.add(written as usize) },
        len - written,
        false,
    );
}

/// A memfd written through a mapping that is then removed: its pages are
/// resident but mapped nowhere; the descriptor stays open.
fn memfd_unmapped(len: u64) {
    let fd = new_memfd(len);
    let base = map(len, libc::MAP_SHARED, fd);
    touch(base, len, true);
    // SAFETY: unmapping the mapping made just above.
    unsafe { libc::munmap(base as *mut libc::c_void, len as usize) };
}

/// Shared anonymous memory, written, then a forked child that maps all of
/// it too (fork copies no page tables of shared mappings, so the child reads
/// every page) and keeps it until this helper dies. Returns the child's PID.
fn fork_shared(len: u64) -> i32 {
    let base = map(len, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1);
    touch(base, len, true);
    let parent = std::process::id() as i32;
    let mut done = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `done`, a local array of two.
    let piped = unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(piped, 0);
    // SAFETY: the child runs only `shared_child`, which reads memory and makes
    // async-signal-safe calls (all a child of a threaded process may make),
    // and never returns.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: `base` is the shared mapping of `len` bytes made above,
        // inherited by this child; done[1] is the pipe's write end.
        unsafe { shared_child(base, len as usize, parent, done[1]) }
    }
    assert!(child > 0, "fork failed");
    let mut byte = 0u8;
    // SAFETY: `byte` is a local one-byte buffer for the read; both ends of
    // the pipe made above are this process's own and closed once.
    unsafe {
        assert_eq!(
            libc::read(done[0], &mut byte as *mut u8 as *mut libc::c_void, 1),
            1
        );
        libc::close(done[0]);
        libc::close(done[1]);
    }
    child
}

/// The forked child: fault in every shared page, say so, wait to be killed.
///
/// # Safety
/// Runs in a child just forked: `base` is a mapping of `len` bytes readable
/// in it, `done` a descriptor open for writing, and nothing runs after it.
unsafe fn shared_child(base: *mut u8, len: usize, parent: i32, done: i32) -> ! {
    // SAFETY: plain system calls (async-signal-safe, as the forked child of
    // a threaded process needs); the reads stay below `len` bytes of the
    // mapping at `base`, and the one byte written comes from a literal.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(0);
        }
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        for offset in (0..len).step_by(page) {
            base.add(offset).read_volatile();
        }
        libc::write(done, b"x".as_ptr() as *const libc::c_void, 1);
        loop {
            libc::pause();
        }
    }
}

/// The parent's side of a helper child.
pub struct Helper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Helper {
    pub fn spawn() -> Helper {
        Self::spawn_as(None).expect("spawning the helper")
    }

    /// Spawns the helper, optionally as another user (uid = gid).
    pub fn spawn_as(user: Option<u32>) -> std::io::Result<Helper> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", "helper_entry", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(id) = user {
            use std::os::unix::process::CommandExt;
            command.uid(id).gid(id);
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut helper = Helper {
            child,
            stdin,
            stdout,
        };
        assert_eq!(helper.answer(), "ready");
        Ok(helper)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command and returns the answer without its "pf:".
    pub fn send(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        self.answer()
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "helper closed its output");
            // libtest's "test helper_entry ... " may precede the first answer.
            if let Some(at) = line.find("pf:") {
                return line[at + 3..].trim_end().to_string();
            }
        }
    }

    /// Asks the helper to exit and reaps it.
    pub fn finish(mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
