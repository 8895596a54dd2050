//! The kernel touching engine memory: read(2), pread(2) (also on an O_DIRECT
//! file), readv(2), recv(2) and process_vm_writev(2) writing INTO shared
//! (copy-on-write), zero-folded and merged pages, and write(2), send(2) and
//! process_vm_readv(2) reading FROM them. Every byte is compared with a
//! plain-memory shadow, and so are the pages that share a frame with the one
//! written (they must not change).
//!
//! The concurrent tests run scans in a loop in another thread while the main
//! thread has the kernel write into the very pages the scan write-protects
//! (userfaultfd): a system call must then wait, never fail with EFAULT, and
//! the bytes must be right. Writes that copy through the page tables and
//! writes through pinned pages (process_vm_writev, O_DIRECT DMA) are tested
//! apart: a write-protected page table entry stops only the former.
//! Signals (and a signal stack in engine memory) join in one test.
//!
//! `PAGEFOLD_SYSCALL_SEED` reproduces the random ranges; `PAGEFOLD_SYSCALL_ITERS`
//! scales the concurrent tests (default 3000 system calls each).

mod common;
use common::{pipe, socketpair};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pagefold_engine::{Config, Engine, Hint, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

fn seed() -> u64 {
    env_u64("PAGEFOLD_SYSCALL_SEED").unwrap_or_else(|| {
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

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Content of one page of pattern `p` (never all zero).
fn pattern(p: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|i| ((i * (2 * p + 3)) as u8) ^ (p as u8).wrapping_mul(29) | 0x40)
        .collect()
}

/// An engine block and what plain memory would hold.
struct Blk {
    name: &'static str,
    ptr: *mut u8,
    shadow: Vec<u8>,
}

impl Blk {
    fn new(e: &Engine, name: &'static str, pages: usize, hint: Hint) -> Blk {
        let ptr = e.alloc(pages * PAGE, hint);
        assert!(!ptr.is_null());
        Blk {
            name,
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
    fn check(&self, ctx: &str) {
        let got = bytes(self.ptr, self.len());
        if got != &self.shadow[..] {
            let first = (0..self.len()).find(|&i| got[i] != self.shadow[i]).unwrap();
            let bad = (0..self.len())
                .filter(|&i| got[i] != self.shadow[i])
                .count();
            panic!(
                "{ctx}: block '{}' differs from plain memory: first at byte {first} (page {} + {}), \
                 {bad} bytes differ, got {:02x?} want {:02x?}",
                self.name,
                first / PAGE,
                first % PAGE,
                &got[first..(first + 8).min(self.len())],
                &self.shadow[first..(first + 8).min(self.len())]
            );
        }
    }
}

/// Blocks whose pages are shared by a virtual copy, zero-folded (owned and
/// diverged pages) and merged (within and across blocks), after a scan.
struct Fixture {
    e: Engine,
    blocks: Vec<Blk>,
}

const SRC: usize = 0;
const COW: usize = 1;
const ZERO: usize = 2;
const DUP: usize = 3;
const DUP2: usize = 4;

impl Fixture {
    fn new(cfg: Config) -> Fixture {
        let e = Engine::new(cfg);
        let n = 32;
        let mut src = Blk::new(&e, "src (shared by copy)", n, Hint::None);
        for p in 0..n {
            let mut page = pattern(100 + p);
            page[0] = p as u8;
            src.write(p * PAGE, &page);
        }
        let mut cow = Blk::new(&e, "cow (virtual copy of src)", n, Hint::None);
        // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
        // copied.
        unsafe { e.copy(cow.ptr, src.ptr, n * PAGE) };
        cow.shadow.copy_from_slice(&src.shadow);
        // Pages 20..28 of the copy diverge, then turn zero: diverged zero pages to fold.
        for p in 20..28 {
            cow.write(p * PAGE, &vec![0u8; PAGE]);
        }
        let mut zero = Blk::new(&e, "zero (folded)", n, Hint::FullWrite);
        for p in 0..n {
            zero.write(p * PAGE, &pattern(200 + p));
        }
        for p in 1..n - 1 {
            zero.write(p * PAGE, &vec![0u8; PAGE]);
        }
        let mut dup = Blk::new(&e, "dup (merged)", n, Hint::None);
        let mut dup2 = Blk::new(&e, "dup2 (merged across blocks)", n / 2, Hint::None);
        for p in 0..n {
            dup.write(p * PAGE, &pattern(p % 3));
        }
        for p in 0..n / 2 {
            dup2.write(p * PAGE, &pattern(p % 3));
        }
        let f = Fixture {
            e,
            blocks: vec![src, cow, zero, dup, dup2],
        };
        f.e.scan();
        f.e.scan();
        let s = f.e.stats();
        assert!(
            s.pages_shared_by_copy >= n as u64,
            "fixture: nothing shared by copy: {s:?}"
        );
        assert!(
            s.zero_folded >= (n - 2) as u64 + 8,
            "fixture: zero pages not folded: {s:?}"
        );
        assert!(
            s.merged >= (n + n / 2 - 3) as u64,
            "fixture: duplicates not merged: {s:?}"
        );
        f.check("fixture after scan");
        f
    }

    fn check(&self, ctx: &str) {
        for b in &self.blocks {
            b.check(ctx);
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for b in &self.blocks {
            // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
            // uses it after this free.
            assert!(unsafe { self.e.free(b.ptr) });
        }
        let s = self.e.stats();
        assert_eq!(s.frames_in_use, 0, "{s:?}");
    }
}

/// A temporary file holding `len` bytes of known content.
struct DataFile {
    file: std::fs::File,
    data: Vec<u8>,
}

impl DataFile {
    fn new(len: usize, seed: u64) -> DataFile {
        let mut rng = StdRng::seed_from_u64(seed);
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("pagefold-syscalls-{}-{n}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(&data).unwrap();
        DataFile { file, data }
    }
    fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

fn close(fds: &[i32]) {
    for &fd in fds {
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        unsafe { libc::close(fd) };
    }
}

/// Calls `f(done)` until `len` bytes are transferred; any error but EINTR
/// (EFAULT above all) fails the test.
fn transfer(what: &str, len: usize, mut f: impl FnMut(usize) -> isize) {
    let mut done = 0;
    while done < len {
        let r = f(done);
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            panic!(
                "{what}: failed after {done} of {len} bytes with errno {e} ({})",
                std::io::Error::from_raw_os_error(e)
            );
        }
        assert!(r > 0, "{what}: returned 0 after {done} of {len} bytes");
        done += r as usize;
    }
}

/// The ways the kernel writes into user memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KernelWrite {
    PipeRead,
    FilePread,
    Readv,
    Recv,
    /// GUP: the pages are pinned first, then written through the pin.
    ProcessVmWritev,
    /// pread(2) on an O_DIRECT descriptor: pages pinned for the device's DMA.
    /// Needs page-aligned offsets and lengths.
    DirectPread,
}

/// The kernel copies through the page tables (copy_to_user): a write-protected page makes it wait.
const COPYING: [KernelWrite; 4] = [
    KernelWrite::PipeRead,
    KernelWrite::FilePread,
    KernelWrite::Readv,
    KernelWrite::Recv,
];

/// Every way.
/// Pages per block for the pinned-write reproducers: enough that most pages
/// stay unwritten for longer than the pin age, so scans act on them.
const PINNED_PAGES: usize = 1024;

const INTO: [KernelWrite; 6] = [
    KernelWrite::PipeRead,
    KernelWrite::FilePread,
    KernelWrite::Readv,
    KernelWrite::Recv,
    KernelWrite::ProcessVmWritev,
    KernelWrite::DirectPread,
];

/// Channels for the kernel to copy from.
struct Io {
    file: DataFile,
    /// The same file opened with O_DIRECT (where the file system allows it).
    direct: Option<i32>,
    pipe: (i32, i32),
    sock: (i32, i32),
}

impl Io {
    fn new(seed: u64) -> Io {
        let file = DataFile::new(1 << 20, seed);
        file.file.sync_all().unwrap();
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.fd())).unwrap();
        // SAFETY: plain system calls on this test's own descriptors and paths, with NUL-terminated
        // names and local out-arrays; errors are checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC,
            )
        };
        Io {
            file,
            direct: (fd >= 0).then_some(fd),
            pipe: pipe(),
            sock: socketpair(),
        }
    }

    /// Whether `how` works here (O_DIRECT needs file system support).
    fn can(&self, how: KernelWrite) -> bool {
        how != KernelWrite::DirectPread || self.direct.is_some()
    }

    /// Has the kernel write `len` bytes into `dst` by `how`; returns the bytes written.
    fn kernel_write(
        &self,
        how: KernelWrite,
        dst: *mut u8,
        len: usize,
        rng: &mut StdRng,
    ) -> Vec<u8> {
        let what = format!("{how:?} of {len} bytes into {dst:p}");
        match how {
            KernelWrite::FilePread => {
                let off = rng.gen_range(0..=self.file.data.len() - len);
                // SAFETY: the buffer is live, writable and at least the length passed; the
                // descriptor is this test's own.
                transfer(&what, len, |d| unsafe {
                    libc::pread(
                        self.file.fd(),
                        dst.add(d).cast(),
                        len - d,
                        (off + d) as libc::off_t,
                    )
                });
                self.file.data[off..off + len].to_vec()
            }
            KernelWrite::PipeRead | KernelWrite::Readv | KernelWrite::Recv => {
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                let (rfd, wfd) = if matches!(how, KernelWrite::Recv) {
                    self.sock
                } else {
                    self.pipe
                };
                // SAFETY: the buffer is live and at least the length passed; the descriptor is this
                // test's own.
                transfer(&format!("{what}: feeding"), len, |d| unsafe {
                    libc::write(wfd, data.as_ptr().add(d).cast(), len - d)
                });
                // SAFETY: the buffer is live, writable and at least the length passed; the
                // descriptor is this test's own.
                transfer(&what, len, |d| unsafe {
                    match how {
                        KernelWrite::PipeRead => libc::read(rfd, dst.add(d).cast(), len - d),
                        KernelWrite::Recv => libc::recv(rfd, dst.add(d).cast(), len - d, 0),
                        _ => {
                            // Two iovecs split at an odd place.
                            let rest = len - d;
                            let cut = rest / 3;
                            let iov = [
                                libc::iovec {
                                    iov_base: dst.add(d).cast(),
                                    iov_len: cut,
                                },
                                libc::iovec {
                                    iov_base: dst.add(d + cut).cast(),
                                    iov_len: rest - cut,
                                },
                            ];
                            libc::readv(rfd, iov.as_ptr(), 2)
                        }
                    }
                });
                data
            }
            KernelWrite::DirectPread => {
                assert!(
                    (dst as usize).is_multiple_of(PAGE) && len.is_multiple_of(PAGE),
                    "O_DIRECT needs whole pages"
                );
                let fd = self.direct.expect("no O_DIRECT here");
                let off = rng.gen_range(0..=(self.file.data.len() - len) / PAGE) * PAGE;
                // SAFETY: the buffer is live, writable and at least the length passed; the
                // descriptor is this test's own.
                let r = unsafe { libc::pread(fd, dst.cast(), len, off as libc::off_t) };
                if r != len as isize {
                    panic!(
                        "{what}: O_DIRECT pread returned {r} ({})",
                        std::io::Error::last_os_error()
                    );
                }
                self.file.data[off..off + len].to_vec()
            }
            KernelWrite::ProcessVmWritev => {
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                // SAFETY: the iovecs describe live buffers of this test, each as long as stated.
                transfer(&what, len, |d| unsafe {
                    let local = libc::iovec {
                        iov_base: data.as_ptr().add(d) as *mut _,
                        iov_len: len - d,
                    };
                    let remote = libc::iovec {
                        iov_base: dst.add(d).cast(),
                        iov_len: len - d,
                    };
                    libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0)
                });
                data
            }
        }
    }

    /// Has the kernel read `len` bytes from `src` by every way it can; each must equal `want`.
    fn kernel_read_all_ways(&self, src: *const u8, len: usize, want: &[u8], ctx: &str) {
        let mut buf = vec![0u8; len];
        // write(2) to a file, read back.
        let file = DataFile::new(0, src as u64 ^ len as u64);
        // SAFETY: the buffer is live and at least the length passed; the descriptor is this test's
        // own.
        transfer(&format!("{ctx}: write to file"), len, |d| unsafe {
            libc::write(file.fd(), src.add(d).cast(), len - d)
        });
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        transfer(&format!("{ctx}: read file back"), len, |d| unsafe {
            libc::pread(
                file.fd(),
                buf.as_mut_ptr().add(d).cast(),
                len - d,
                d as libc::off_t,
            )
        });
        assert!(
            buf == want,
            "{ctx}: write(2) to a file wrote other bytes than the block holds"
        );
        // write(2) to a pipe.
        buf.fill(0);
        // SAFETY: the buffer is live and at least the length passed; the descriptor is this test's
        // own.
        transfer(&format!("{ctx}: write to pipe"), len, |d| unsafe {
            libc::write(self.pipe.1, src.add(d).cast(), len - d)
        });
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        transfer(&format!("{ctx}: read pipe"), len, |d| unsafe {
            libc::read(self.pipe.0, buf.as_mut_ptr().add(d).cast(), len - d)
        });
        assert!(
            buf == want,
            "{ctx}: write(2) to a pipe wrote other bytes than the block holds"
        );
        // send(2) on a socket.
        buf.fill(0);
        // SAFETY: the buffer is live and at least the length passed; the descriptor is this test's
        // own.
        transfer(&format!("{ctx}: send"), len, |d| unsafe {
            libc::send(self.sock.1, src.add(d).cast(), len - d, 0)
        });
        // SAFETY: the buffer is live, writable and at least the length passed; the descriptor is
        // this test's own.
        transfer(&format!("{ctx}: recv"), len, |d| unsafe {
            libc::recv(self.sock.0, buf.as_mut_ptr().add(d).cast(), len - d, 0)
        });
        assert!(
            buf == want,
            "{ctx}: send(2) sent other bytes than the block holds"
        );
        // process_vm_readv.
        buf.fill(0);
        // SAFETY: the iovecs describe live buffers of this test, each as long as stated.
        transfer(&format!("{ctx}: process_vm_readv"), len, |d| unsafe {
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr().add(d).cast(),
                iov_len: len - d,
            };
            let remote = libc::iovec {
                iov_base: src.add(d) as *mut _,
                iov_len: len - d,
            };
            libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0)
        });
        assert!(
            buf == want,
            "{ctx}: process_vm_readv read other bytes than the block holds"
        );
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(fd) = self.direct {
            close(&[fd]);
        }
        close(&[self.pipe.0, self.pipe.1, self.sock.0, self.sock.1]);
    }
}

#[test]
fn kernel_writes_into_shared_folded_and_merged_pages() {
    let seed = seed();
    eprintln!("PAGEFOLD_SYSCALL_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let io = Io::new(seed);
    for how in INTO.into_iter().filter(|&h| io.can(h)) {
        // A fresh fixture per way, so every way meets pages in every state.
        let mut f = Fixture::new(Config::default());
        for bi in [SRC, COW, ZERO, DUP, DUP2] {
            // Straddling pages, odd start and length; then exactly one whole page.
            let blen = f.blocks[bi].len();
            for (off, len) in [
                (5 * PAGE + 123, 6 * PAGE + 45),
                (blen - 3 * PAGE, PAGE),
                (PAGE + 1, 1),
            ] {
                let (off, len) = if how == KernelWrite::DirectPread {
                    (off / PAGE * PAGE, len.div_ceil(PAGE) * PAGE)
                } else {
                    (off, len)
                };
                // SAFETY: the address lies inside a live block this test allocated, and no
                // reference to those bytes exists during the access.
                let dst = unsafe { f.blocks[bi].ptr.add(off) };
                let data = io.kernel_write(how, dst, len, &mut rng);
                f.blocks[bi].shadow[off..off + len].copy_from_slice(&data);
                // The block written and every page that shared a frame with it.
                f.check(&format!(
                    "seed {seed}: {how:?} into '{}' [{off}, +{len})",
                    f.blocks[bi].name
                ));
            }
        }
        // And the engine still works on those pages.
        f.e.scan();
        f.check(&format!(
            "seed {seed}: {how:?}: after a scan following the writes"
        ));
    }
}

#[test]
fn kernel_reads_from_shared_folded_and_merged_pages() {
    let seed = seed();
    let io = Io::new(seed);
    let f = Fixture::new(Config::default());
    // A block never touched at all: the kernel must read zeros.
    let fresh = f.e.alloc(8 * PAGE, Hint::None);
    io.kernel_read_all_ways(fresh, 8 * PAGE, &vec![0u8; 8 * PAGE], "untouched block");
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { f.e.free(fresh) };
    for b in &f.blocks {
        io.kernel_read_all_ways(b.ptr, b.len(), &b.shadow, &format!("whole '{}'", b.name));
        let (off, len) = (3 * PAGE - 7, 4 * PAGE + 11);
        io.kernel_read_all_ways(
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            unsafe { b.ptr.add(off) },
            len,
            &b.shadow[off..off + len],
            &format!("part of '{}'", b.name),
        );
    }
    f.check("after the kernel read every block");
}

/// Aborts the test process if `progress` stands still for a minute: a system
/// call sleeping on a page left write-protected never returns, and a hang
/// must end as a failure. (Written with write(2): captured output would be lost.)
fn watchdog(
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    ctx: String,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (mut last, mut since) = (u64::MAX, std::time::Instant::now());
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let now = progress.load(Ordering::Relaxed);
            if now != last {
                (last, since) = (now, std::time::Instant::now());
            } else if since.elapsed() > std::time::Duration::from_secs(60) {
                let msg = format!(
                    "\n{ctx}: no progress for 60 s at iteration {now}: a system call into engine memory \
                     never returned (page left write-protected?); aborting\n"
                );
                // SAFETY: the buffer is live and at least the length passed; the descriptor is this
                // test's own.
                unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                std::process::abort();
            }
        }
    })
}

/// The kernel writes into engine pages while another thread scans in a loop
/// (write-protecting chunk after chunk). Meanwhile the main thread keeps
/// making pages mergeable, zero and shared again, so every scan has work.
fn concurrent(cfg: Config, name: &str, kinds: &[KernelWrite], pages: usize, nblocks: usize) {
    let seed = seed();
    // Pinned writes race with a scan only in a short window: more tries.
    let scale = if kinds.iter().all(|k| COPYING.contains(k)) {
        1
    } else {
        4
    };
    let iters = env_u64("PAGEFOLD_SYSCALL_ITERS").unwrap_or(3000) * scale;
    eprintln!("[{name}] PAGEFOLD_SYSCALL_SEED={seed} iters={iters}");
    let mut rng = StdRng::seed_from_u64(seed);
    let io = Io::new(seed);
    let kinds: Vec<KernelWrite> = kinds.iter().copied().filter(|&k| io.can(k)).collect();
    if kinds.is_empty() {
        eprintln!("[{name}] not supported here: skipped");
        return;
    }
    let e = Engine::new(cfg);
    let mut blocks: Vec<Blk> = ["b0", "b1", "b2", "b3"][..nblocks]
        .iter()
        .map(|n| Blk::new(&e, n, pages, Hint::None))
        .collect();
    let palette: Vec<Vec<u8>> = (0..4).map(pattern).collect();
    for b in blocks.iter_mut() {
        for p in 0..pages {
            b.write(p * PAGE, &palette[p % 4]);
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let scans = Arc::new(AtomicU64::new(0));
    let scanner = {
        let (e, stop, scans) = (e.clone(), stop.clone(), scans.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                e.scan();
                scans.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let progress = Arc::new(AtomicU64::new(0));
    let watchdog = watchdog(
        progress.clone(),
        stop.clone(),
        format!("[{name}] seed {seed}"),
    );
    let mut slow = 0u64;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // At least `iters` rounds, and on until the scanner has run 5 scans
        // beside them (a loaded machine can starve it; bounded at 20x).
        let enough =
            |it: u64| it >= iters && (scans.load(Ordering::Relaxed) >= 5 || it >= 20 * iters);
        for it in (0..).take_while(|&it| !enough(it)) {
            progress.store(it + 1, Ordering::Relaxed);
            let bi = rng.gen_range(0..blocks.len());
            // Pinned writes: refill often, so the pages written are mostly
            // ones the scan is about to merge.
            let step = if scale == 1 {
                it % 10
            } else {
                (it % 3 != 0) as u64 * 2
            };
            match step {
                // Pages for the scan: duplicates of the palette and zero pages.
                0 => {
                    for _ in 0..24 {
                        let p = rng.gen_range(0..pages);
                        let content = if rng.gen_bool(0.3) {
                            vec![0u8; PAGE]
                        } else {
                            palette[rng.gen_range(0..4)].clone()
                        };
                        blocks[bi].write(p * PAGE, &content);
                    }
                }
                // Pages shared by a virtual copy.
                1 => {
                    let di = (bi + 1 + rng.gen_range(0..blocks.len() - 1)) % blocks.len();
                    let n = rng.gen_range(1..=32);
                    let (sp, dp) = (rng.gen_range(0..=pages - n), rng.gen_range(0..=pages - n));
                    // SAFETY: both ranges lie inside live blocks this test allocated, each at least
                    // the length copied.
                    unsafe {
                        e.copy(
                            blocks[di].ptr.add(dp * PAGE),
                            blocks[bi].ptr.add(sp * PAGE),
                            n * PAGE,
                        )
                    };
                    let tmp = blocks[bi].shadow[sp * PAGE..(sp + n) * PAGE].to_vec();
                    blocks[di].shadow[dp * PAGE..(dp + n) * PAGE].copy_from_slice(&tmp);
                }
                // The kernel writes into the pages.
                _ => {
                    let how = kinds[rng.gen_range(0..kinds.len())];
                    let (off, len) = if how == KernelWrite::DirectPread {
                        let n = rng.gen_range(1..=4);
                        (rng.gen_range(0..=pages - n) * PAGE, n * PAGE)
                    } else {
                        let len = rng.gen_range(1..=12 * PAGE);
                        (rng.gen_range(0..=pages * PAGE - len), len)
                    };
                    let t = std::time::Instant::now();
                    let data =
                        // SAFETY: the address lies inside a live block this test allocated, and no
                        // reference to those bytes exists during the access.
                        io.kernel_write(how, unsafe { blocks[bi].ptr.add(off) }, len, &mut rng);
                    slow += (t.elapsed() > std::time::Duration::from_micros(500)) as u64;
                    blocks[bi].shadow[off..off + len].copy_from_slice(&data);
                    // SAFETY: the address lies inside a live block this test allocated, and no
                    // reference to those bytes exists during the access.
                    let got = bytes(unsafe { blocks[bi].ptr.add(off) }, len);
                    if got != &data[..] {
                        let first = (0..len).find(|&i| got[i] != data[i]).unwrap();
                        panic!(
                            "[{name}] seed {seed} iteration {it}: {how:?} into block {bi} [{off}, +{len}) \
                             returned success but byte {first} (block page {}) is {:#04x}, not {:#04x}",
                            (off + first) / PAGE,
                            got[first],
                            data[first]
                        );
                    }
                }
            }
            if it % 100 == 99 {
                for b in &blocks {
                    b.check(&format!("[{name}] seed {seed} iteration {it}"));
                }
            }
        }
    }));
    stop.store(true, Ordering::Relaxed);
    scanner.join().expect("scanner thread panicked");
    watchdog.join().unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    for b in &blocks {
        b.check(&format!("[{name}] seed {seed} at the end"));
    }
    let s = e.stats();
    let n = scans.load(Ordering::Relaxed);
    eprintln!("[{name}] {n} scans, {slow} slow system calls, {s:?}");
    assert!(
        n >= 5,
        "[{name}] only {n} scans ran concurrently: the test did not test anything"
    );
    assert!(
        s.protected_scan,
        "[{name}] no userfaultfd: scans did not write-protect anything"
    );
    // The pinned-write variants do no copies (step 1 never comes up for them).
    assert!(
        s.merged > 0 && s.zero_folded > 0 && (scale != 1 || s.pages_shared_by_copy > 0),
        "[{name}] {s:?}"
    );
    for b in &blocks {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(b.ptr) });
    }
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn kernel_writes_into_pages_under_concurrent_scan() {
    concurrent(Config::default(), "chunk512", &COPYING, 256, 4);
}

#[test]
fn kernel_writes_into_pages_under_concurrent_scan_small_chunks() {
    concurrent(
        Config {
            scan_chunk_pages: 2,
            ..Config::default()
        },
        "chunk2",
        &COPYING,
        256,
        4,
    );
}

/// The engine as the preload runs it, scaled for a test: a pin age (50 ms
/// here, 200 ms in the preload) and no pin grace, so that the pin guard,
/// the freezes and the holds alone keep writes through pins from being lost.
/// Pins held longer than the age are outside what this covers.
fn pinned_cfg() -> Config {
    Config {
        scan_chunk_pages: 8,
        pin_age: std::time::Duration::from_millis(50),
        pin_grace: std::time::Duration::ZERO,
        ..Config::default()
    }
}

/// Writes through pinned pages: the kernel takes the page (get_user_pages,
/// faulting it in writable) and writes it afterwards, past any write
/// protection set in between. A scan that compares and remaps the page in
/// that window leaves the write in a page nobody maps any more. Anonymous
/// pages are taken off with the kernel's pin test, owned pages frozen first
/// and diverged pages held write-protected (so a later pin faults) for the
/// pin age. With `pin_hold: false` (20 ms age) this or the O_DIRECT test
/// below lost a write in 10 of 25 runs; with holds in none.
#[test]
fn process_vm_writev_into_pages_under_concurrent_scan() {
    concurrent(
        pinned_cfg(),
        "process_vm_writev",
        &[KernelWrite::ProcessVmWritev],
        PINNED_PAGES,
        2,
    );
}

/// read(2) on an O_DIRECT file: the device writes the pages by DMA while
/// they are pinned; as above, a scan must not remap a page under the I/O.
#[test]
fn o_direct_read_into_pages_under_concurrent_scan() {
    concurrent(
        pinned_cfg(),
        "o_direct_pread",
        &[KernelWrite::DirectPread],
        PINNED_PAGES,
        2,
    );
}

/// madvise(MADV_DONTNEED) on private anonymous memory makes the pages read
/// zero. On an engine page whose private copy is dropped, the kernel maps
/// the frame at that page's offset again: a frame that may since have been
/// released and handed to another block.
#[test]
fn madvise_dontneed_never_exposes_another_blocks_data() {
    let e = Engine::new(Config::default());
    let n = 4;
    let mut a = Blk::new(&e, "a", n, Hint::None);
    for p in 0..n {
        a.write(p * PAGE, &pattern(10 + p));
    }
    let mut b = Blk::new(&e, "b (copy of a, then rewritten)", n, Hint::None);
    // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
    // copied.
    unsafe { e.copy(b.ptr, a.ptr, n * PAGE) };
    for p in 0..n {
        b.write(p * PAGE, &pattern(20 + p)); // b's pages diverge
    }
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe { e.free(a.ptr) };
    e.scan(); // frames of diverged pages are released, then reused:
    let mut c = Blk::new(&e, "c", n, Hint::None);
    for p in 0..n {
        c.write(p * PAGE, &pattern(30 + p));
    }
    // SAFETY: the range is a live block of this test; the call changes or reads only that range (a
    // mincore vector has one byte per page).
    unsafe { libc::madvise(b.ptr.cast(), n * PAGE, libc::MADV_DONTNEED) };
    let got = bytes(b.ptr, n * PAGE);
    for p in 0..n {
        let page = &got[p * PAGE..(p + 1) * PAGE];
        let other = (0..n).find(|&q| page == &c.shadow[q * PAGE..(q + 1) * PAGE]);
        assert!(
            other.is_none(),
            "after madvise(MADV_DONTNEED) page {p} of block b reads page {} of another live block c",
            other.unwrap()
        );
    }
    b.shadow.fill(0);
    b.check("b after madvise(MADV_DONTNEED) (plain memory reads zero)");
    for blk in [&b, &c] {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        unsafe { e.free(blk.ptr) };
    }
}

static HANDLER_PAGE: std::sync::atomic::AtomicPtr<u8> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
/// The scanning thread (pthread_t); its handler runs write the page's upper half.
static SCANNER_THREAD: AtomicU64 = AtomicU64::new(0);
/// Handler runs on the main thread and on the scanning thread.
static HANDLER_RUNS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Writes into an engine page (its half of it), on the thread's alternate
/// signal stack where it has one.
extern "C" fn on_usr1(_: libc::c_int) {
    let t =
        // SAFETY: signal setup and delivery on this test's own threads; the handler only does
        // async-signal-safe work.
        (unsafe { libc::pthread_self() } as u64 == SCANNER_THREAD.load(Ordering::SeqCst)) as usize;
    let n = HANDLER_RUNS[t].fetch_add(1, Ordering::SeqCst) + 1;
    let p = HANDLER_PAGE.load(Ordering::SeqCst);
    let mut local = [0u8; 2048];
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe {
        std::ptr::write_volatile(&mut local[(n as usize * 7) % 2048], n as u8);
        *p.add(t * PAGE / 2 + n as usize % (PAGE / 2)) = n as u8;
    }
}

/// Signals arrive all the time while scans write-protect engine memory and
/// the kernel writes into it: the kernel writes each signal frame onto an
/// alternate signal stack that is itself engine memory, the handler writes
/// into an engine page, and read(2) / pread(2) / recv(2) keep filling engine
/// pages. Nothing may fail (no EFAULT, no SIGSEGV from an unwritable signal
/// frame) and every byte must be right.
///
/// The test runs in a process of its own (`common::in_own_process`), so that
/// a crash or a hang is this test's failure only, and no lock another test
/// thread holds can get in the way; that process killed by SIGSEGV means a
/// signal frame could not be written.
#[test]
fn signals_during_scans_with_engine_signal_stack() {
    if !common::in_own_process("signals_during_scans_with_engine_signal_stack") {
        return;
    }
    let seed = seed();
    eprintln!("PAGEFOLD_SYSCALL_SEED={seed}");
    signals_with_engine_signal_stack(seed);
}

fn signals_with_engine_signal_stack(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let io = Io::new(seed);
    let e = Engine::new(Config {
        scan_chunk_pages: 8,
        ..Config::default()
    });
    // The alternate signal stack and the handler's page: engine memory.
    let alt_len = 16 * PAGE;
    let alt = e.alloc(alt_len, Hint::None);
    let hpage = e.alloc(PAGE, Hint::None);
    HANDLER_PAGE.store(hpage, Ordering::SeqCst);
    // SAFETY: signal setup and delivery on this test's own threads; the handler only does
    // async-signal-safe work.
    unsafe {
        let ss = libc::stack_t {
            ss_sp: alt.cast(),
            ss_flags: 0,
            ss_size: alt_len,
        };
        assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let pages = 64;
    let mut blocks: Vec<Blk> = ["s0", "s1"]
        .iter()
        .map(|n| Blk::new(&e, n, pages, Hint::None))
        .collect();
    for b in blocks.iter_mut() {
        for p in 0..pages {
            b.write(p * PAGE, &pattern(p % 3));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let scanner = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            // SAFETY: signal setup and delivery on this test's own threads; the handler only does
            // async-signal-safe work.
            SCANNER_THREAD.store(unsafe { libc::pthread_self() } as u64, Ordering::SeqCst);
            while !stop.load(Ordering::Relaxed) {
                e.scan();
                std::thread::yield_now();
            }
        })
    };
    while SCANNER_THREAD.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    // Signals for this thread and for the scanning one: a handler on the
    // scanning thread writing to a page that very thread protected would wait
    // for itself, unless the scan keeps signals out while a chunk is protected.
    let targets = [
        // SAFETY: signal setup and delivery on this test's own threads; the handler only does
        // async-signal-safe work.
        unsafe { libc::pthread_self() } as u64,
        SCANNER_THREAD.load(Ordering::SeqCst),
    ];
    let signaller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: signal setup and delivery on this test's own threads; the handler only
                // does async-signal-safe work.
                unsafe { libc::pthread_kill(targets[i % 2] as libc::pthread_t, libc::SIGUSR1) };
                i += 1;
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        })
    };
    let t = std::time::Instant::now();
    let mut it = 0u64;
    while t.elapsed() < std::time::Duration::from_millis(1500) {
        let bi = rng.gen_range(0..blocks.len());
        if it.is_multiple_of(5) {
            // Duplicates for the scan to merge, again and again.
            for _ in 0..8 {
                let p = rng.gen_range(0..pages);
                blocks[bi].write(p * PAGE, &pattern(rng.gen_range(0..3)));
            }
        } else {
            // Copies through the page tables only: pinned writes fail on their own (tests above).
            let how = COPYING[rng.gen_range(0..COPYING.len())];
            let len = rng.gen_range(1..=6 * PAGE);
            let off = rng.gen_range(0..=pages * PAGE - len);
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            let data = io.kernel_write(how, unsafe { blocks[bi].ptr.add(off) }, len, &mut rng);
            blocks[bi].shadow[off..off + len].copy_from_slice(&data);
        }
        if it.is_multiple_of(50) {
            for b in &blocks {
                b.check(&format!("seed {seed}, with signals, iteration {it}"));
            }
        }
        it += 1;
    }
    stop.store(true, Ordering::Relaxed);
    signaller.join().unwrap();
    scanner.join().unwrap();
    // SAFETY: signal setup and delivery on this test's own threads; the handler only does
    // async-signal-safe work.
    unsafe {
        // Block the signal: no handler may run while we check its page.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    for b in &blocks {
        b.check(&format!("seed {seed}, with signals, at the end"));
    }
    let mut want = vec![0u8; PAGE];
    let runs = [0, 1].map(|t| HANDLER_RUNS[t].load(Ordering::SeqCst));
    for t in 0..2 {
        for n in 1..=runs[t] {
            want[t * PAGE / 2 + n as usize % (PAGE / 2)] = n as u8;
        }
    }
    assert!(
        runs[0] > 100 && runs[1] > 100,
        "too few signals handled: {runs:?}"
    );
    assert!(
        bytes(hpage, PAGE) == &want[..],
        "the handlers' writes into their engine page were lost ({runs:?} runs)"
    );
}
