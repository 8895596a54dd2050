//! Measures the kernel primitives the engine is built from, on this machine,
//! so docs/MECHANISMS.md can say why each was chosen with numbers from one run.
//!
//! Run: `cargo run --release -p pagefold-engine --example mechanisms`
//! Prints a markdown table: medians of 7 runs, cost per page.

use std::time::Instant;

const PAGE: usize = 4096;
const RUNS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median over RUNS of `f()`'s duration, in microseconds per page.
/// `setup` prepares and returns the operation; the operation returns what
/// must be cleaned up, which is dropped outside the timed region.
fn per_page(
    pages: usize,
    mut setup: impl FnMut() -> Box<dyn FnOnce() -> Box<dyn std::any::Any>>,
) -> f64 {
    let v = (0..RUNS)
        .map(|_| {
            let op = setup();
            let t = Instant::now();
            let garbage = op();
            let us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
            drop(garbage);
            us
        })
        .collect();
    median(v)
}

fn memfd(pages: usize) -> i32 {
    // SAFETY: the name is a NUL-terminated C string literal.
    let fd = unsafe { libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is the memfd just created; ftruncate takes plain integers.
    assert_eq!(unsafe { libc::ftruncate(fd, (pages * PAGE) as i64) }, 0);
    fd
}

fn map(addr: *mut u8, pages: usize, fd: i32, shared: bool) -> *mut u8 {
    let mut flags = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    if fd < 0 {
        flags |= libc::MAP_ANONYMOUS;
    }
    if !addr.is_null() {
        flags |= libc::MAP_FIXED;
    }
    // SAFETY: a null addr lets the kernel pick a fresh place; a non-null addr is always a
    // mapping this program made with `map` and still owns, which MAP_FIXED replaces while no
    // reference points into it.
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

fn fill(p: *mut u8, pages: usize) {
    for i in 0..pages {
        // SAFETY: callers pass a read-write mapping from `map` of at least `pages` pages; i <
        // pages keeps the page inside it.
        unsafe { std::ptr::write_bytes(p.add(i * PAGE), (i % 251 + 1) as u8, PAGE) };
    }
}

/// Writes 1 into the first byte of each of `pages` pages at `p`.
fn touch_pages(p: *mut u8, pages: usize) {
    for i in 0..pages {
        // SAFETY: every caller passes a read-write mapping from `map` of at
        // least `pages` pages that stays mapped until its Cleanup drops, and
        // i < pages keeps the byte inside it.
        unsafe { *p.add(i * PAGE) = 1 };
    }
}

struct Cleanup(*mut u8, usize, i32);
impl Drop for Cleanup {
    fn drop(&mut self) {
        // SAFETY: a Cleanup is made once per mapping (from `map`, with its page count) and
        // descriptor (from `memfd`, or -1), after their last use; it is dropped once, so each
        // is released once.
        unsafe {
            libc::munmap(self.0.cast(), self.1 * PAGE);
            if self.2 >= 0 {
                libc::close(self.2);
            }
        }
    }
}

fn main() {
    let n = 16384;
    let mut rows: Vec<(&str, f64, &str)> = Vec::new();

    rows.push((
        "memcpy into fresh anonymous memory",
        per_page(n, || {
            let src = map(std::ptr::null_mut(), n, -1, false);
            fill(src, n);
            Box::new(move || {
                let dst = map(std::ptr::null_mut(), n, -1, false);
                // SAFETY: src and dst are two separate fresh mappings of n pages from `map`.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, n * PAGE) };
                Box::new((Cleanup(dst, n, -1), Cleanup(src, n, -1))) as Box<dyn std::any::Any>
            })
        }),
        "the plain copy we replace",
    ));
    rows.push((
        "freeze: MAP_SHARED -> MAP_PRIVATE in place (written pages)",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            Box::new(move || {
                map(p, n, fd, false);
                Box::new(Cleanup(p, n, fd)) as Box<dyn std::any::Any>
            })
        }),
        "first copy of a freshly written block",
    ));
    rows.push((
        "map a copy: MAP_PRIVATE of frozen frames",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            Box::new(move || {
                let q = map(std::ptr::null_mut(), n, fd, false);
                Box::new((Cleanup(q, n, -1), Cleanup(p, n, fd))) as Box<dyn std::any::Any>
            })
        }),
        "copy of an already-shared block",
    ));
    rows.push((
        "write to a shared page (kernel copy-on-write)",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            let q = map(std::ptr::null_mut(), n, fd, false);
            for i in 0..n {
                // SAFETY: q maps n pages and i < n.
                unsafe { std::ptr::read_volatile(q.add(i * PAGE)) };
            }
            Box::new(move || {
                touch_pages(q, n);
                Box::new((Cleanup(q, n, -1), Cleanup(p, n, fd))) as Box<dyn std::any::Any>
            })
        }),
        "cow break",
    ));
    rows.push((
        "first-touch write fault, anonymous",
        per_page(n, || {
            let p = map(std::ptr::null_mut(), n, -1, false);
            Box::new(move || {
                touch_pages(p, n);
                Box::new(Cleanup(p, n, -1)) as Box<dyn std::any::Any>
            })
        }),
        "reference for the fault paths",
    ));
    rows.push((
        "first-touch write fault, memfd MAP_SHARED",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            Box::new(move || {
                touch_pages(p, n);
                Box::new(Cleanup(p, n, fd)) as Box<dyn std::any::Any>
            })
        }),
        "what a fresh engine block costs per page",
    ));
    rows.push((
        "punch hole (fold zero frames), 512-page runs",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            Box::new(move || {
                for c in 0..n / 512 {
                    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                    // SAFETY: fd is the memfd of n pages made above; fallocate takes plain
                    // integers.
                    unsafe {
                        libc::fallocate(fd, mode, (c * 512 * PAGE) as i64, (512 * PAGE) as i64)
                    };
                }
                Box::new(Cleanup(p, n, fd)) as Box<dyn std::any::Any>
            })
        }),
        "zero folding of owned/shared frames",
    ));
    rows.push((
        "remap one page MAP_FIXED onto another frame",
        per_page(2048, || {
            let fd = memfd(4096);
            let p = map(std::ptr::null_mut(), 4096, fd, true);
            fill(p, 4096);
            Box::new(move || {
                for i in (0..4096).step_by(2) {
                    // SAFETY: p maps 4096 pages and i < 4096.
                    let q = unsafe { p.add(i * PAGE) };
                    // SAFETY: q is page i of the mapping p this closure owns; MAP_FIXED
                    // replaces just that page, and no reference points into it.
                    let r = unsafe {
                        libc::mmap(
                            q.cast(),
                            PAGE,
                            3,
                            libc::MAP_PRIVATE | libc::MAP_FIXED,
                            fd,
                            (4095 * PAGE) as i64,
                        )
                    };
                    assert_ne!(r, libc::MAP_FAILED);
                }
                Box::new(Cleanup(p, 4096, fd)) as Box<dyn std::any::Any>
            })
        }),
        "merging a scattered page (+2 VMAs each)",
    ));
    rows.push((
        "pagemap read (divergence), 512 entries",
        per_page(n, || {
            let p = map(std::ptr::null_mut(), n, -1, false);
            fill(p, n);
            Box::new(move || {
                // SAFETY: the path is a NUL-terminated C string literal.
                let fd = unsafe { libc::open(c"/proc/self/pagemap".as_ptr(), libc::O_RDONLY) };
                let mut buf = vec![0u64; 512];
                for c in 0..n / 512 {
                    let off = ((p as usize / PAGE + c * 512) * 8) as i64;
                    // SAFETY: buf is a live Vec of 512 u64 = 4096 bytes, the length read.
                    unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), 4096, off) };
                }
                // SAFETY: fd is the pagemap descriptor opened above, closed once.
                unsafe { libc::close(fd) };
                Box::new(Cleanup(p, n, -1)) as Box<dyn std::any::Any>
            })
        }),
        "scan step 2",
    ));
    rows.push((
        "mincore, 512 pages",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            Box::new(move || {
                let mut v = vec![0u8; 512];
                for c in 0..n / 512 {
                    // SAFETY: p maps n pages, so chunk c < n / 512 lies inside it; v holds one
                    // byte for each of its 512 pages.
                    unsafe {
                        libc::mincore(p.add(c * 512 * PAGE).cast(), 512 * PAGE, v.as_mut_ptr())
                    };
                }
                Box::new(Cleanup(p, n, fd)) as Box<dyn std::any::Any>
            })
        }),
        "scan step 3",
    ));
    rows.push((
        "xxh3 of a page",
        per_page(n, || {
            let p = map(std::ptr::null_mut(), n, -1, false);
            fill(p, n);
            Box::new(move || {
                let mut acc = 0u64;
                for i in 0..n {
                    // SAFETY: p maps n pages and i < n; the page is only read.
                    acc ^= xxhash_rust::xxh3::xxh3_64(unsafe {
                        std::slice::from_raw_parts(p.add(i * PAGE), PAGE)
                    });
                }
                std::hint::black_box(acc);
                Box::new(Cleanup(p, n, -1)) as Box<dyn std::any::Any>
            })
        }),
        "merge candidate index",
    ));

    rows.push((
        "userfaultfd write-protect + unprotect, 512-page chunks",
        per_page(n, || {
            let fd = memfd(n);
            let p = map(std::ptr::null_mut(), n, fd, true);
            fill(p, n);
            let uffd = pagefold_engine::protect::Protector::open().expect("userfaultfd");
            uffd.register(p, n * PAGE).expect("register");
            Box::new(move || {
                for c in 0..n / 512 {
                    // SAFETY: p maps n pages, so chunk c < n / 512 starts inside it.
                    let q = unsafe { p.add(c * 512 * PAGE) };
                    uffd.protect(q, 512 * PAGE).expect("protect");
                    uffd.unprotect(q, 512 * PAGE).expect("unprotect");
                }
                Box::new((Cleanup(p, n, fd), uffd)) as Box<dyn std::any::Any>
            })
        }),
        "scan steps 1 and 6",
    ));

    println!("| primitive | us/page | used for |");
    println!("|---|---:|---|");
    for (name, us, why) in rows {
        println!("| {name} | {us:.3} | {why} |");
    }
}
