//! Measures eviction and restore on this machine, for docs/MECHANISMS.md
//! ("Eviction and restore").
//!
//! Run: `cargo run --release -p pagefold-engine --example evict [pages] [runs]`
//! (default 16,384 pages = 64 MiB, 5 runs; medians). For each kind of page
//! the engine evicts, prints: evict cost per page (compression, stores,
//! registration, freeing; with the default 1 ms pin grace per 512-page chunk
//! and without it), restore cost per page when a thread touches the pages
//! one after another (fault -> fault thread -> decompress -> UFFDIO_COPY ->
//! wake), and the footprint: resident pages before and after, bytes the store
//! holds per page and the engine's metadata per evicted page.
//!
//! First it probes what the mechanism rests on: how registering part of a
//! mapping with userfaultfd changes the mapping count, and what a MISSING
//! fault answered by another thread costs on anonymous memory, on a shared
//! memfd mapping (owned pages) and on a private one (copies), without
//! compression; and what SIGBUS mode does to a system call touching a missing page.

use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, PAGE};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Anon,
    Owned,
    SoleShared,
    SoleDiverged,
}

/// Text-like content (words from a small vocabulary), compressible like
/// ordinary text: LZ4 makes a page about 1.7 KB (see docs/MECHANISMS.md).
fn text_page(k: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the ",
        "model ",
        "value ",
        "of ",
        "frame ",
        "page ",
        "residual ",
        "in ",
        "variance ",
        "coefficient ",
        "estimate ",
        "and ",
        "error ",
        "for ",
        "data ",
        "matrix\n",
    ];
    let mut x = (k as u64).wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut v = Vec::with_capacity(PAGE + 16);
    while v.len() < PAGE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
        if x.is_multiple_of(7) {
            v.extend_from_slice(format!("{} ", x % 1000).as_bytes());
        }
    }
    v.truncate(PAGE);
    v
}

fn resident(p: *const u8, n: usize) -> usize {
    let mut v = vec![0u8; n];
    // SAFETY: p is a block of n pages from the engine and v has one byte per page, as mincore
    // writes.
    unsafe { libc::mincore(p as *mut _, n * PAGE, v.as_mut_ptr()) };
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// A block of `n` pages of `kind` filled with text; returns it and its content.
fn block(e: &Engine, kind: Kind, n: usize, content: &[u8]) -> *mut u8 {
    let fresh = || e.alloc(n * PAGE, Hint::FullWrite);
    match kind {
        Kind::Anon | Kind::Owned => {
            let p = fresh();
            // SAFETY: p is a fresh block of n * PAGE bytes from e.alloc and content is the
            // caller's text of n * PAGE bytes, in separate memory.
            unsafe { std::ptr::copy_nonoverlapping(content.as_ptr(), p, content.len()) };
            p
        }
        Kind::SoleShared | Kind::SoleDiverged => {
            let (src, dst) = (fresh(), fresh());
            // SAFETY: src and dst are fresh, distinct blocks of n * PAGE bytes from e.alloc and
            // content is n * PAGE bytes; k < n keeps q inside dst; src is freed once and not
            // used after.
            unsafe {
                std::ptr::copy_nonoverlapping(content.as_ptr(), src, content.len());
                e.copy(dst, src, n * PAGE);
                if kind == Kind::SoleDiverged {
                    // Every page written once: each holds its own copy.
                    for k in 0..n {
                        let q = dst.add(k * PAGE);
                        q.write_volatile(q.read_volatile());
                    }
                }
                e.free(src);
            }
            dst
        }
    }
}

struct Run {
    evict_us: f64,
    restore_us: f64,
    resident_before: usize,
    resident_after: usize,
    stored_per_page: f64,
    overhead_per_page: f64,
    metadata_per_page: f64,
    evicted: u64,
}

fn one(kind: Kind, n: usize, content: &[u8], grace: Duration) -> Run {
    let cfg = Config {
        frames: kind != Kind::Anon,
        pin_grace: grace,
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let p = block(&e, kind, n, content);
    let resident_before = resident(p, n);
    let meta_before = e.stats().metadata_bytes;
    let t = Instant::now();
    let r = e.evict(p, n * PAGE);
    let evict_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let resident_after = resident(p, n);
    let s = e.stats();
    let ev = r.evicted.max(1) as f64;
    let t = Instant::now();
    let mut sum = 0u64;
    for k in 0..n {
        // SAFETY: k < n, so p + k * PAGE + 8 lies in the live n-page block p.
        sum = sum.wrapping_add(unsafe { p.add(k * PAGE + 8).read_volatile() } as u64);
    }
    let restore_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    std::hint::black_box(sum);
    assert!(
        // SAFETY: p is the live n-page block; it is only read here.
        unsafe { std::slice::from_raw_parts(p, n * PAGE) } == content,
        "{kind:?}: wrong bytes after restore"
    );
    // SAFETY: p came from e.alloc (via block) and is not used after this.
    unsafe { e.free(p) };
    Run {
        evict_us,
        restore_us,
        resident_before,
        resident_after,
        stored_per_page: s.store.payload as f64 / ev,
        overhead_per_page: s.store.overhead as f64 / ev,
        metadata_per_page: (s.metadata_bytes - meta_before) as f64 / ev,
        evicted: r.evicted,
    }
}

fn maps_in(lo: usize, hi: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            usize::from_str_radix(a, 16).unwrap() < hi && usize::from_str_radix(b, 16).unwrap() > lo
        })
        .count()
}

/// A memfd named "probe" of `len` bytes (its result unchecked, as a probe).
fn memfd(len: usize) -> i32 {
    // SAFETY: the name is a NUL-terminated C string literal; ftruncate takes
    // plain integers and reports a bad descriptor as an error.
    unsafe {
        let fd = libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC);
        libc::ftruncate(fd, len as i64);
        fd
    }
}

/// Closes a descriptor this program opened and no longer uses.
fn close(fd: i32) {
    // SAFETY: every caller passes a descriptor it created itself (memfd,
    // userfaultfd, pipe or socket) and uses it no more; close only ends it.
    unsafe { libc::close(fd) };
}

/// Unmaps a mapping made by `map` that nothing uses any more.
fn unmap(p: *mut u8, len: usize) {
    // SAFETY: every caller passes the whole mapping it got from `map` with
    // its length, after its last access; no reference into it survives.
    unsafe { libc::munmap(p.cast(), len) };
}

fn map(len: usize, fd: i32, shared: bool) -> *mut u8 {
    let flags = match (fd < 0, shared) {
        (true, _) => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        (false, true) => libc::MAP_SHARED,
        (false, false) => libc::MAP_PRIVATE,
    };
    // SAFETY: a fresh mapping at an address the kernel picks; it touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// Mapping counts when a run of 10 pages inside a 64-page mapping is
/// registered MISSING|WP, then the whole mapping WP (as a scan's chunk
/// does), then the run is unregistered.
fn probe_registration() {
    use pagefold_engine::protect::Protector;
    let uffd = Protector::open().expect("userfaultfd");
    let fd = memfd(64 * PAGE);
    println!("| mapping | 64 pages | + run registered MISSING+WP | + whole range WP | run unregistered | all unregistered |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, fd, shared) in [
        ("anonymous", -1, false),
        ("memfd shared", fd, true),
        ("memfd private", fd, false),
    ] {
        let p = map(64 * PAGE, fd, shared);
        let (lo, hi) = (p as usize, p as usize + 64 * PAGE);
        // SAFETY: p maps 64 pages, so page 20 is inside it.
        let run = unsafe { p.add(20 * PAGE) };
        let a = maps_in(lo, hi);
        uffd.register_missing(run, 10 * PAGE).unwrap();
        let b = maps_in(lo, hi);
        uffd.register(p, 64 * PAGE).unwrap();
        let c = maps_in(lo, hi);
        uffd.unregister(run, 10 * PAGE).unwrap();
        let d = maps_in(lo, hi);
        uffd.unregister(p, 64 * PAGE).unwrap();
        let e = maps_in(lo, hi);
        println!("| {name} | {a} | {b} | {c} | {d} | {e} |");
        unmap(p, 64 * PAGE);
    }
    close(fd);
    println!();
}

/// MISSING faults answered by a thread with UFFDIO_COPY of a page kept in
/// memory (no compression): us per page touched in order, read and write.
fn probe_fault_paths(n: usize) {
    use pagefold_engine::protect::{Fault, Protector};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let uffd = Arc::new(Protector::open().expect("userfaultfd"));
    let stop = Arc::new(AtomicBool::new(false));
    let page = [0x5au8; PAGE];
    let server = {
        let (uffd, stop) = (uffd.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut f = [Fault { addr: 0, wp: false }; 16];
            while !stop.load(Ordering::Relaxed) {
                let k = uffd.read_faults(&mut f, 50);
                for x in f[..k].iter().filter(|x| !x.wp) {
                    if uffd.copy(x.addr, &page).is_err() {
                        uffd.wake(x.addr as *const u8, PAGE);
                    }
                }
            }
        })
    };
    let fd = memfd(n * PAGE);
    println!("| MISSING fault + UFFDIO_COPY from another thread | read us/page | write us/page |");
    println!("|---|---:|---:|");
    for (name, fd, shared) in [
        ("anonymous (MADV_DONTNEED)", -1, false),
        ("memfd shared (hole punched)", fd, true),
        ("memfd private (hole)", fd, false),
    ] {
        let mut cost = [0.0; 2];
        for (i, write) in [false, true].into_iter().enumerate() {
            let p = map(n * PAGE, fd, shared);
            uffd.register_missing(p, n * PAGE).unwrap();
            let t = Instant::now();
            for k in 0..n {
                // SAFETY: k < n and p maps n pages (registered MISSING, served by the thread
                // above), so q is inside it.
                unsafe {
                    let q = p.add(k * PAGE);
                    if write {
                        q.write_volatile(1);
                    } else {
                        std::hint::black_box(q.read_volatile());
                    }
                }
            }
            cost[i] = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            uffd.unregister(p, n * PAGE).unwrap();
            unmap(p, n * PAGE);
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: fd is the probe memfd made above; fallocate takes plain integers.
            unsafe { libc::fallocate(fd, punch, 0, (n * PAGE) as i64) };
        }
        println!("| {name} | {:.2} | {:.2} |", cost[0], cost[1]);
    }
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    close(fd);
    println!();
}

/// Why not SIGBUS mode: with UFFD_FEATURE_SIGBUS no thread waits, and the
/// kernel touching a missing page inside a system call gets EFAULT.
fn probe_sigbus_mode() {
    #[repr(C)]
    struct Api {
        api: u64,
        features: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct Register {
        start: u64,
        len: u64,
        mode: u64,
        ioctls: u64,
    }
    const FEATURE_SIGBUS: u64 = 1 << 7;
    let ioc = |nr: u64, size: u64| (3u64 << 30) | (size << 16) | (0xAA << 8) | nr;
    // SAFETY: the userfaultfd system call takes only integer flags.
    let fd =
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) } as i32;
    let mut api = Api {
        api: 0xAA,
        features: FEATURE_SIGBUS,
        ioctls: 0,
    };
    // SAFETY: api is a live, exclusively borrowed #[repr(C)] uffdio_api (24 bytes, the size
    // encoded in the request).
    if fd < 0 || unsafe { libc::ioctl(fd, ioc(0x3F, 24) as _, &mut api) } != 0 {
        println!("SIGBUS mode unavailable\n");
        return;
    }
    let p = map(4 * PAGE, -1, false);
    let mut reg = Register {
        start: p as u64,
        len: 4 * PAGE as u64,
        mode: 1,
        ioctls: 0,
    };
    // SAFETY: reg is a live, exclusively borrowed #[repr(C)] uffdio_register (32 bytes, the
    // size encoded in the request) over the 4 pages of p.
    assert_eq!(unsafe { libc::ioctl(fd, ioc(0x00, 32) as _, &mut reg) }, 0);
    let mut fds = [0i32; 2];
    // SAFETY: fds is a live array of two ints, as pipe writes.
    unsafe { libc::pipe(fds.as_mut_ptr()) };
    let buf = [1u8; PAGE];
    let outcome = |r: isize| {
        if r < 0 {
            format!("{}", std::io::Error::last_os_error())
        } else {
            format!("{r} bytes")
        }
    };
    // SAFETY: buf is a local array of PAGE bytes.
    unsafe { libc::write(fds[1], buf.as_ptr().cast(), PAGE) };
    // SAFETY: p maps 4 pages, so pages 0..3 are inside it; the kernel reports a missing page as
    // EFAULT, which is what this probe measures.
    let read = outcome(unsafe { libc::read(fds[0], p.cast(), PAGE) });
    // SAFETY: page 1 of the 4-page mapping p; a missing page gives EFAULT, which is what is
    // measured.
    let write = outcome(unsafe { libc::write(fds[1], p.add(PAGE).cast(), PAGE) });
    let mut s = [0i32; 2];
    // SAFETY: s is a live array of two ints, as socketpair writes.
    unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, s.as_mut_ptr()) };
    // SAFETY: page 2 of the 4-page mapping p; a missing page gives EFAULT, which is what is
    // measured.
    let send = outcome(unsafe { libc::send(s[0], p.add(2 * PAGE).cast(), PAGE, 0) });
    let mut out = [0u8; PAGE];
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: PAGE,
    };
    let remote = libc::iovec {
        // SAFETY: p maps 4 pages, so page 3 is inside it.
        iov_base: unsafe { p.add(3 * PAGE) }.cast(),
        iov_len: PAGE,
    };
    // SAFETY: local describes the live array out of PAGE bytes; remote is page 3 of p, which
    // the kernel reads (or reports EFAULT).
    let vm = outcome(unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) });
    println!(
        "userfaultfd SIGBUS mode, missing anonymous pages: read(2) into one: {read}; write(2) from one: {write}; \
         send(2) from one: {send}; process_vm_readv from one: {vm}\n"
    );
    for fd in [s[0], s[1], fds[0], fds[1], fd] {
        close(fd);
    }
    unmap(p, 4 * PAGE);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(16_384);
    let runs = args.get(1).copied().unwrap_or(5);
    let content: Vec<u8> = (0..n).flat_map(text_page).collect();
    probe_sigbus_mode();
    probe_registration();
    probe_fault_paths(n);

    // The store's codec alone, for reference.
    let (mut c_ns, mut d_ns, mut bytes) = (0u128, 0u128, 0usize);
    let mut codec = pagefold_tier::compress::Compressor::default();
    let mut back = [0u8; PAGE];
    for page in content.chunks(PAGE).take(4096) {
        let t = Instant::now();
        let obj = codec.compress(page).expect("text compresses").to_vec();
        c_ns += t.elapsed().as_nanos();
        let t = Instant::now();
        codec.decompress(&obj, &mut back).unwrap();
        d_ns += t.elapsed().as_nanos();
        bytes += obj.len();
    }
    let m = n.min(4096) as f64;
    println!(
        "The store's codec (pagefold-tier Compressor) on this content: {:.0} B/page, compress {:.2} us, decompress {:.2} us\n",
        bytes as f64 / m,
        c_ns as f64 / 1e3 / m,
        d_ns as f64 / 1e3 / m
    );
    println!("{n} pages, medians of {runs} runs, us per page");
    println!();
    println!("| kind | evict (1 ms grace/chunk) | evict (no grace) | restore on touch | resident before -> after | stored B/page | store overhead B/page | engine metadata B/page |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|");
    for kind in [
        Kind::Anon,
        Kind::Owned,
        Kind::SoleShared,
        Kind::SoleDiverged,
    ] {
        let with: Vec<Run> = (0..runs)
            .map(|_| one(kind, n, &content, Duration::from_micros(1000)))
            .collect();
        let without: Vec<Run> = (0..runs)
            .map(|_| one(kind, n, &content, Duration::ZERO))
            .collect();
        let all = || with.iter().chain(&without);
        assert!(
            all().all(|r| r.evicted == n as u64),
            "{kind:?}: not every page was evicted"
        );
        let last = &without[0];
        println!(
            "| {kind:?} | {:.2} | {:.2} | {:.2} | {} -> {} | {:.0} | {:.0} | {:.0} |",
            median(with.iter().map(|r| r.evict_us).collect()),
            median(without.iter().map(|r| r.evict_us).collect()),
            median(all().map(|r| r.restore_us).collect()),
            last.resident_before,
            last.resident_after,
            last.stored_per_page,
            last.overhead_per_page,
            last.metadata_per_page,
        );
    }
}
