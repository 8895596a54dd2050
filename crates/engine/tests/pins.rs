//! Pages the kernel holds pinned: the pin guard (detach.rs) must leave them
//! where they are, take every other page off, and fall back to the pin grace
//! when turned off; owned pages wait out the pin age when one is set.
//!
//! The pins are real: io_uring registered buffers pin their pages for as
//! long as they stay registered (FOLL_LONGTERM), as RDMA and io_uring
//! programs do.

mod common;

use std::time::Duration;

use pagefold_engine::{Config, Engine, Fresh, Hint};

const PAGE: usize = 4096;
const IORING_REGISTER_BUFFERS: libc::c_uint = 0;
const IORING_UNREGISTER_BUFFERS: libc::c_uint = 1;

/// An io_uring whose registered buffers pin pages until it unregisters them.
struct Ring {
    fd: i32,
    /// `struct io_uring_params` as io_uring_setup filled it in (ring offsets).
    params: [u8; 120],
}

const IORING_OP_READ_FIXED: u8 = 4;
const IORING_ENTER_GETEVENTS: libc::c_uint = 1;
const IORING_OFF_SQES: libc::off_t = 0x1000_0000;

impl Ring {
    fn new() -> Ring {
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup reads and writes one struct io_uring_params (120 bytes), which
        // `params` is, zeroed as the kernel expects.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
        assert!(
            fd >= 0,
            "io_uring_setup: {}",
            std::io::Error::last_os_error()
        );
        Ring {
            fd: fd as i32,
            params,
        }
    }

    /// The u32 at byte `at` of the setup parameters.
    fn param(&self, at: usize) -> usize {
        u32::from_ne_bytes(self.params[at..at + 4].try_into().unwrap()) as usize
    }

    /// Reads `PAGE` bytes of `file` into registered buffer `index` (at
    /// `page`) with IORING_OP_READ_FIXED: the kernel writes them through the
    /// pin it took at registration, not through the page table.
    fn read_fixed(&self, file: i32, page: *mut u8, index: u16) {
        // struct io_uring_params: the SQ ring's offsets from byte 40, the CQ ring's from byte 80.
        let (sq_tail, sq_mask, sq_array) = (self.param(44), self.param(48), self.param(64));
        let (cq_head, cq_tail, cq_mask, cqes) = (
            self.param(80),
            self.param(84),
            self.param(88),
            self.param(100),
        );
        let (sq_entries, cq_entries) = (self.param(0), self.param(4));
        let ring_len = (sq_array + 4 * sq_entries).max(cqes + 16 * cq_entries);
        let map = |len: usize, off: libc::off_t| {
            // SAFETY: maps the ring's own memory (the kernel's offsets), shared, for this call only.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    self.fd,
                    off,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
            p as *mut u8
        };
        let (ring, sqes) = (map(ring_len, 0), map(64 * sq_entries, IORING_OFF_SQES));
        // SAFETY: every offset below is the kernel's, inside the mappings just made; the
        // ring's head and tail are read and written with atomics as the kernel does.
        let res = unsafe {
            let at32 = |off: usize| &*(ring.add(off) as *const std::sync::atomic::AtomicU32);
            let tail = at32(sq_tail).load(std::sync::atomic::Ordering::Acquire);
            let slot = (tail as usize) & (*(ring.add(sq_mask) as *const u32) as usize);
            std::ptr::write_bytes(sqes.add(64 * slot), 0, 64);
            let sqe = sqes.add(64 * slot);
            *sqe = IORING_OP_READ_FIXED;
            *(sqe.add(4) as *mut i32) = file;
            *(sqe.add(16) as *mut u64) = page as u64;
            *(sqe.add(24) as *mut u32) = PAGE as u32;
            *(sqe.add(40) as *mut u16) = index;
            *(ring.add(sq_array + 4 * slot) as *mut u32) = slot as u32;
            at32(sq_tail).store(tail + 1, std::sync::atomic::Ordering::Release);
            let r = libc::syscall(
                libc::SYS_io_uring_enter,
                self.fd,
                1,
                1,
                IORING_ENTER_GETEVENTS,
                std::ptr::null::<u8>(),
                0,
            );
            assert_eq!(r, 1, "io_uring_enter: {}", std::io::Error::last_os_error());
            let head = at32(cq_head).load(std::sync::atomic::Ordering::Acquire);
            assert_ne!(
                head,
                at32(cq_tail).load(std::sync::atomic::Ordering::Acquire)
            );
            let cq_slot = (head as usize) & (*(ring.add(cq_mask) as *const u32) as usize);
            let res = *(ring.add(cqes + 16 * cq_slot + 8) as *const i32);
            at32(cq_head).store(head + 1, std::sync::atomic::Ordering::Release);
            libc::munmap(ring.cast(), ring_len);
            libc::munmap(sqes.cast(), 64 * sq_entries);
            res
        };
        assert_eq!(res, PAGE as i32, "READ_FIXED: {res}");
    }

    /// Pins each page (one registered buffer per page).
    fn pin(&self, pages: &[*mut u8]) {
        let iov: Vec<libc::iovec> = pages
            .iter()
            .map(|&p| libc::iovec {
                iov_base: p.cast(),
                iov_len: PAGE,
            })
            .collect();
        // SAFETY: iov is a live array of iov.len() iovecs naming pages of a live block.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd,
                IORING_REGISTER_BUFFERS,
                iov.as_ptr(),
                iov.len() as libc::c_uint,
            )
        };
        assert_eq!(
            r,
            0,
            "register buffers: {}",
            std::io::Error::last_os_error()
        );
    }

    fn unpin(&self) {
        // SAFETY: unregistering takes no argument buffer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd,
                IORING_UNREGISTER_BUFFERS,
                std::ptr::null::<u8>(),
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "unregister buffers: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the ring's descriptor is ours to close.
        unsafe { libc::close(self.fd) };
    }
}

/// A block of 16 pages: 0..8 zero but touched, 8..16 copies of one content.
fn block(e: &Engine) -> *mut u8 {
    let p = e.alloc(16 * PAGE, Hint::None);
    for k in 0..16 {
        let byte = if k < 8 { 0 } else { 0x5a };
        // SAFETY: page k lies inside the live 16-page block just allocated.
        unsafe { std::ptr::write_bytes(p.add(k * PAGE), byte, PAGE) };
    }
    p
}

fn resident(p: *mut u8, k: usize) -> bool {
    let mut v = [0u8; 1];
    // SAFETY: page k lies inside a live block; mincore writes one byte into v.
    let r = unsafe { libc::mincore(p.add(k * PAGE).cast(), PAGE, v.as_mut_ptr()) };
    assert_eq!(r, 0);
    v[0] & 1 != 0
}

fn content(p: *mut u8, k: usize) -> Vec<u8> {
    // SAFETY: page k lies inside a live block and nothing writes it meanwhile.
    unsafe { std::slice::from_raw_parts(p.add(k * PAGE), PAGE) }.to_vec()
}

fn anon(cfg: Config) -> Config {
    Config {
        fresh: Fresh::Anon,
        ..cfg
    }
}

#[test]
fn pinned_anonymous_pages_stay_and_the_rest_is_taken_off() {
    let e = Engine::new(anon(Config::default()));
    let p = block(&e);
    let ring = Ring::new();
    // SAFETY: pages 0 and 8 lie inside the block.
    ring.pin(&[p, unsafe { p.add(8 * PAGE) }]);
    e.scan();
    let r = e.scan();
    let s = e.stats();
    assert_eq!(
        s.fallbacks.pin_guard, 0,
        "this kernel has UFFDIO_MOVE: {s:?}"
    );
    assert!(
        s.pin_refused >= 2,
        "the pinned pages were not refused: {s:?}"
    );
    // The pinned zero page stays; the other seven are holes.
    assert!(resident(p, 0), "a pinned page was taken off");
    assert_eq!((1..8).filter(|&k| resident(p, k)).count(), 0, "{r:?}");
    assert_eq!(r.zero_folded, 7, "{r:?}");
    // Pages 9..16 share one frame (six saved); page 8 is pinned and left as it was.
    assert_eq!(r.merged, 6, "{r:?}");
    for k in 0..16 {
        let want = if k < 8 { 0 } else { 0x5a };
        assert!(content(p, k).iter().all(|&b| b == want), "page {k}");
    }
    // Unpinned, the two pages go the usual way.
    ring.unpin();
    // Pages looked at and left alone are looked at less often (smart scan).
    let mut done = (0, 0);
    for _ in 0..10 {
        let r = e.scan();
        done = (done.0 + r.zero_folded, done.1 + r.merged);
    }
    // Page 0 folds (and the holes the checks above read fold again); page 8 joins the others.
    assert!(done.0 >= 1 && done.1 == 1, "{done:?} {:?}", e.stats());
    assert_eq!(e.stats().pages_saved_by_sharing, 7);
    assert!(!resident(p, 0));
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

#[test]
fn without_the_guard_the_grace_path_folds_and_merges() {
    let e = Engine::new(anon(Config {
        pin_guard: false,
        ..Config::default()
    }));
    let p = block(&e);
    e.scan();
    let r = e.scan();
    let s = e.stats();
    // Eight copies share one frame: seven pages saved.
    assert_eq!((r.zero_folded, r.merged), (8, 7), "{r:?}");
    assert_eq!((s.pin_refused, s.pin_changed), (0, 0), "{s:?}");
    for k in 0..16 {
        let want = if k < 8 { 0 } else { 0x5a };
        assert!(content(p, k).iter().all(|&b| b == want), "page {k}");
    }
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

#[test]
fn owned_pages_wait_out_the_pin_age_before_they_are_folded_or_shared() {
    let age = Duration::from_millis(300);
    let e = Engine::new(Config {
        fresh: Fresh::Frames,
        pin_age: age,
        ..Config::default()
    });
    let p = block(&e);
    e.scan();
    let r = e.scan();
    // Frozen in place (the copies) or held (the zero pages), nothing folded
    // or shared yet.
    assert_eq!((r.zero_folded, r.merged), (0, 0), "{r:?}");
    let frozen = e.stats();
    assert_eq!(frozen.pin_held, 8, "{frozen:?}");
    std::thread::sleep(age + Duration::from_millis(50));
    let mut done = (0, 0);
    for _ in 0..4 {
        let r = e.scan();
        done = (done.0 + r.zero_folded, done.1 + r.merged);
    }
    // Every zero page folds and the copies share frames.
    assert!(
        done.0 == 8 && done.1 >= 6,
        "after the pin age: {done:?}, {:?} then {:?}",
        frozen,
        e.stats()
    );
    for k in 0..16 {
        let want = if k < 8 { 0 } else { 0x5a };
        assert!(content(p, k).iter().all(|&b| b == want), "page {k}");
    }
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

/// Two 16-page blocks: `src` of one content, `dst` a virtual copy of it
/// whose pages the program then wrote, so they are diverged: 0..8 with
/// zeros, 8..16 with the content they had (the scans merge `src` onto one
/// frame, which they can then share).
fn diverged_pages(e: &Engine) -> (*mut u8, *mut u8) {
    let src = e.alloc(16 * PAGE, Hint::None);
    let dst = e.alloc(16 * PAGE, Hint::None);
    // SAFETY: both blocks are live, 16 pages long and distinct; the copy and
    // the writes stay inside them.
    unsafe {
        std::ptr::write_bytes(src, 0x5a, 16 * PAGE);
        e.copy(dst, src, 16 * PAGE);
        for k in 0..16 {
            let byte = if k < 8 { 0 } else { 0x5a };
            std::ptr::write_bytes(dst.add(k * PAGE), byte, PAGE);
        }
    }
    (src, dst)
}

fn expect_diverged_content(dst: *mut u8) {
    for k in 0..16 {
        let want = if k < 8 { 0 } else { 0x5a };
        assert!(content(dst, k).iter().all(|&b| b == want), "page {k}");
    }
}

/// Writes one page at `page` of this process with process_vm_writev, which
/// pins the page for the call.
fn vm_write(page: *mut u8, data: &[u8]) {
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: PAGE,
    };
    let remote = libc::iovec {
        iov_base: page.cast(),
        iov_len: PAGE,
    };
    // SAFETY: one local and one remote iovec of PAGE bytes each, both live;
    // the remote one is this process's own memory.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    assert_eq!(n, PAGE as isize, "{}", std::io::Error::last_os_error());
}

/// The page's userfaultfd write protection, from /proc/self/pagemap (bit 57).
fn uffd_wp(p: *mut u8) -> bool {
    common::pagemap_entry(p) >> 57 & 1 == 1
}

/// Scans until `done` holds or `tries` scans ran; the sum of what they folded and merged.
fn scan_for(e: &Engine, tries: usize, done: impl Fn(u64, u64) -> bool) -> (u64, u64) {
    let mut sum = (0, 0);
    for _ in 0..tries {
        let r = e.scan();
        sum = (sum.0 + r.zero_folded, sum.1 + r.merged);
        if done(sum.0, sum.1) {
            break;
        }
    }
    sum
}

#[test]
fn diverged_pages_are_held_for_the_pin_age_before_they_fold() {
    let age = Duration::from_millis(300);
    let e = Engine::new(Config {
        pin_age: age,
        ..Config::default()
    });
    let (src, dst) = diverged_pages(&e);
    // Seen, then held: nothing of the diverged pages is folded or merged yet.
    let early = scan_for(&e, 3, |_, _| false);
    let held = e.stats();
    assert_eq!(held.fallbacks.pin_hold, 0, "{held:?}");
    assert!(
        held.pin_held >= 16,
        "the diverged pages were not held: {held:?}"
    );
    // Only the source's pages merged (onto one frame).
    assert_eq!(early, (0, 15), "acted before the pin age: {held:?}");
    expect_diverged_content(dst);
    std::thread::sleep(age + Duration::from_millis(50));
    // After the age the zero pages fold and the copies share a frame.
    let done = scan_for(&e, 4, |z, m| z >= 8 && m >= 7);
    assert!(
        done.0 >= 8 && done.1 >= 8,
        "after the pin age: {done:?} {:?}",
        e.stats()
    );
    expect_diverged_content(dst);
    assert_eq!(e.stats().pin_hold_broken, 0);
    // SAFETY: both blocks were allocated above and are freed once.
    unsafe { assert!(e.free(src) && e.free(dst)) };
}

/// A pin for writing taken on a held page faults first: the hold ends, the
/// write lands, and the page is not folded under it.
#[test]
fn a_write_pin_on_a_held_page_ends_the_hold() {
    let age = Duration::from_millis(200);
    let e = Engine::new(Config {
        pin_age: age,
        ..Config::default()
    });
    let (src, dst) = diverged_pages(&e);
    scan_for(&e, 3, |_, _| false);
    assert!(e.stats().pin_held >= 16, "{:?}", e.stats());
    // SAFETY: page 1 lies inside the live destination block.
    let page1 = unsafe { dst.add(PAGE) };
    assert!(
        uffd_wp(dst) && uffd_wp(page1),
        "held pages are not write-protected"
    );
    // Pins page 0 for writing (io_uring registration, FOLL_WRITE |
    // FOLL_LONGTERM) and writes page 1 through process_vm_writev, which pins
    // it for the call. Both fault on the held pages first.
    let ring = Ring::new();
    ring.pin(&[dst]);
    let data = vec![0x77u8; PAGE];
    vm_write(page1, &data);
    assert_eq!(content(dst, 1), data);
    let broken = e.stats().pin_hold_broken;
    assert!(
        broken >= 2,
        "the pins did not end the holds: {:?}",
        e.stats()
    );
    ring.unpin();
    std::thread::sleep(age + Duration::from_millis(50));
    scan_for(&e, 4, |_, _| false);
    assert_eq!(content(dst, 1), data, "the pinned write was lost");
    assert!(content(dst, 0).iter().all(|&b| b == 0));
    // SAFETY: both blocks were allocated above and are freed once.
    unsafe { assert!(e.free(src) && e.free(dst)) };
}

/// Without a fault thread to end holds (no userfaultfd MISSING mode),
/// diverged pages fall back to the pin grace after the pin age, and say so.
#[test]
fn without_missing_mode_diverged_pages_fall_back_to_the_grace() {
    let age = Duration::from_millis(100);
    let e = Engine::new(Config {
        pin_age: age,
        inject: pagefold_engine::Inject {
            fail_uffd_missing: true,
            ..Default::default()
        },
        ..Config::default()
    });
    let (src, dst) = diverged_pages(&e);
    // The scan that sees the pages diverged starts their age.
    e.scan();
    std::thread::sleep(age + Duration::from_millis(50));
    let done = scan_for(&e, 8, |z, m| z >= 8 && m >= 7);
    let s = e.stats();
    assert_eq!(s.fallbacks.pin_hold, 1, "{s:?}");
    assert_eq!(s.pin_held, 0, "{s:?}");
    assert!(done.0 >= 8 && done.1 >= 8, "{done:?} {s:?}");
    expect_diverged_content(dst);
    // SAFETY: both blocks were allocated above and are freed once.
    unsafe { assert!(e.free(src) && e.free(dst)) };
}

/// An engine with pin age `age` and a block on frames whose zero pages
/// (0..8) two scans have held.
fn held_zero_pages(age: Duration) -> (Engine, *mut u8) {
    let e = Engine::new(Config {
        fresh: Fresh::Frames,
        pin_age: age,
        ..Config::default()
    });
    let p = block(&e);
    scan_for(&e, 2, |_, _| false);
    assert!(e.stats().pin_held >= 8, "{:?}", e.stats());
    (e, p)
}

/// An owned zero page is held, not frozen: a write pin on it ends its hold
/// (and those of the held pages around it), the write lands, and the other
/// zero pages, held again, fold once the age has passed.
#[test]
fn a_write_pin_on_a_held_owned_zero_page_ends_the_hold() {
    let age = Duration::from_millis(200);
    let (e, p) = held_zero_pages(age);
    assert!(uffd_wp(p), "a held owned page is not write-protected");
    let data = vec![0x33u8; PAGE];
    vm_write(p, &data);
    // The write ends the holds of the whole held run around it (pages 0..8).
    assert_eq!(e.stats().pin_hold_broken, 8, "{:?}", e.stats());
    // Held again, the seven zero pages fold one age later.
    scan_for(&e, 2, |_, _| false);
    std::thread::sleep(age + Duration::from_millis(50));
    let done = scan_for(&e, 4, |z, _| z >= 7);
    assert!(done.0 >= 7, "{done:?} {:?}", e.stats());
    assert_eq!(content(p, 0), data, "the pinned write was lost");
    assert_eq!((1..8).filter(|&k| resident(p, k)).count(), 0);
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

/// Cutting a block's tail ends the holds there: were the cut pages still
/// held, a write ending the hold of a page before the cut would end theirs
/// too, and unprotect whatever is mapped there by then (another block's
/// pages, not registered: `unprotect_gaps`).
#[test]
fn shrinking_a_block_ends_the_holds_in_its_cut_tail() {
    let age = Duration::from_millis(200);
    let (e, p) = held_zero_pages(age);
    // Pages 0..8 are held zero pages; the cut takes 4..16.
    assert!(e.shrink(p, 4 * PAGE));
    let data = vec![0x44u8; PAGE];
    vm_write(p, &data);
    let s = e.stats();
    assert_eq!(s.pin_hold_broken, 4, "the cut pages were still held: {s:?}");
    assert_eq!(s.unprotect_gaps, 0, "{s:?}");
    assert_eq!(content(p, 0), data);
    for k in 1..4 {
        assert!(content(p, k).iter().all(|&b| b == 0), "page {k}");
    }
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

/// Eviction of anonymous pages goes through the pin guard too: a pinned
/// page stays in memory, the others leave and come back when touched.
#[test]
fn pinned_anonymous_pages_are_not_evicted() {
    let e = Engine::new(anon(Config::default()));
    let p = e.alloc(16 * PAGE, Hint::None);
    for k in 0..16 {
        // SAFETY: page k lies inside the live 16-page block just allocated.
        unsafe { std::ptr::write_bytes(p.add(k * PAGE), k as u8 + 1, PAGE) };
    }
    let ring = Ring::new();
    // SAFETY: page 3 lies inside the block.
    ring.pin(&[unsafe { p.add(3 * PAGE) }]);
    let r = e.evict(p, 16 * PAGE);
    let s = e.stats();
    assert_eq!(r.evicted, 15, "{r:?} {s:?}");
    assert!(s.pin_refused >= 1, "{s:?}");
    assert!(resident(p, 3), "the pinned page was evicted");
    assert_eq!((0..16).filter(|&k| resident(p, k)).count(), 1);
    for k in 0..16 {
        assert!(content(p, k).iter().all(|&b| b == k as u8 + 1), "page {k}");
    }
    assert_eq!(e.stats().restored, 15);
    ring.unpin();
    // SAFETY: p is the block allocated above, freed once.
    assert!(unsafe { e.free(p) });
}

#[test]
fn a_pinned_source_page_is_not_adopted_by_a_copy() {
    let e = Engine::new(anon(Config {
        copy_through: true,
        ..Config::default()
    }));
    let src = e.alloc(16 * PAGE, Hint::None);
    for k in 0..16 {
        // SAFETY: page k lies inside the live 16-page block just allocated.
        unsafe { std::ptr::write_bytes(src.add(k * PAGE), 0x30 + k as u8, PAGE) };
    }
    let ring = Ring::new();
    // SAFETY: page 5 lies inside the block.
    let pinned = unsafe { src.add(5 * PAGE) };
    ring.pin(&[pinned]);
    let dst = e.alloc(16 * PAGE, Hint::None);
    // SAFETY: two live, distinct 16-page blocks.
    unsafe { e.copy(dst, src, 16 * PAGE) };
    let s = e.stats();
    assert!(s.pin_refused >= 1, "the pinned page was not refused: {s:?}");
    assert_eq!(s.pages_adopted, 15, "{s:?}");
    for k in 0..16 {
        let want = vec![0x30 + k as u8; PAGE];
        assert_eq!(content(dst, k), want, "copy, page {k}");
        assert_eq!(content(src, k), want, "source, page {k}");
    }
    // A write through the pin (as a device or O_DIRECT read would make it)
    // lands in the source, which kept its page, and never in the copy.
    vm_write(pinned, &[0xEE; PAGE]);
    assert_eq!(content(src, 5), vec![0xEE; PAGE]);
    assert_eq!(content(dst, 5), vec![0x35; PAGE]);
    ring.unpin();
    for p in [src, dst] {
        // SAFETY: p is a block allocated above, freed once.
        assert!(unsafe { e.free(p) });
    }
}

/// A memfd holding one page of `byte`, for the kernel to read from.
fn file_of(byte: u8) -> i32 {
    // SAFETY: the name is a NUL-terminated C string literal.
    let fd = unsafe { libc::memfd_create(c"pagefold-pins".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    let page = vec![byte; PAGE];
    // SAFETY: page is a live buffer of PAGE bytes.
    let n = unsafe { libc::write(fd, page.as_ptr().cast(), PAGE) };
    assert_eq!(n, PAGE as isize);
    fd
}

/// Four pages of content `0x10 + k` (distinct, so no scan merges them).
fn written(e: &Engine) -> *mut u8 {
    let p = e.alloc(4 * PAGE, Hint::None);
    for k in 0..4 {
        // SAFETY: page k lies inside the live 4-page block just allocated.
        unsafe { std::ptr::write_bytes(p.add(k * PAGE), 0x10 + k as u8, PAGE) };
    }
    p
}

/// Owned pages: a block on frames, written.
fn owned(e: &Engine) -> *mut u8 {
    written(e)
}

/// Sole-shared pages: the source of a virtual copy whose destination is freed.
fn sole_shared(e: &Engine) -> *mut u8 {
    let src = written(e);
    let dst = e.alloc(4 * PAGE, Hint::None);
    // SAFETY: two live, distinct 4-page blocks; dst is freed once, here.
    unsafe {
        e.copy(dst, src, 4 * PAGE);
        assert!(e.free(dst));
    }
    src
}

/// Diverged pages: a virtual copy, written after its source was freed (the
/// copy's frames then hold nothing anyone needs).
fn diverged(e: &Engine) -> *mut u8 {
    let src = written(e);
    let dst = e.alloc(4 * PAGE, Hint::None);
    // SAFETY: two live, distinct 4-page blocks; src is freed once, here; the
    // writes stay inside dst.
    unsafe {
        e.copy(dst, src, 4 * PAGE);
        assert!(e.free(src));
        for k in 0..4 {
            std::ptr::write_bytes(dst.add(k * PAGE), 0x20 + k as u8, PAGE);
        }
    }
    dst
}

type Kind = fn(&Engine) -> *mut u8;

/// By default (`evict_untested`) each kind's pages are evicted, behind the
/// pin grace: what the forcing tests below keep in memory is evictable.
#[test]
fn owned_sole_shared_and_diverged_pages_are_evicted_by_default() {
    for (name, kind) in [
        ("owned", owned as Kind),
        ("sole-shared", sole_shared),
        ("diverged", diverged),
    ] {
        let e = Engine::new(Config::default());
        let p = kind(&e);
        let want: Vec<Vec<u8>> = (0..4).map(|k| content(p, k)).collect();
        let r = e.evict(p, 4 * PAGE);
        assert_eq!(r.evicted, 4, "{name}: {r:?} {:?}", e.stats());
        assert!((0..4).all(|k| !resident(p, k)), "{name}");
        for (k, w) in want.iter().enumerate() {
            assert_eq!(&content(p, k), w, "{name}: page {k}");
        }
        // SAFETY: p is the block allocated above, freed once.
        assert!(unsafe { e.free(p) });
    }
}

/// With `evict_untested` off, a page of each kind without a pin test stays
/// in memory: pinned (an io_uring registered buffer), it then takes a read
/// through the pin (IORING_OP_READ_FIXED), which the program sees. Evicted
/// under the pin, the read would land in memory nobody maps any more.
#[test]
fn without_untested_eviction_pinned_pages_stay_and_writes_through_the_pin_land() {
    for (name, kind) in [
        ("owned", owned as Kind),
        ("sole-shared", sole_shared),
        ("diverged", diverged),
    ] {
        let e = Engine::new(Config {
            evict_untested: false,
            ..Config::default()
        });
        let p = kind(&e);
        // SAFETY: page 1 lies inside the block.
        let page = unsafe { p.add(PAGE) };
        let ring = Ring::new();
        ring.pin(&[page]);
        let r = e.evict(p, 4 * PAGE);
        assert_eq!((r.evicted, r.untested), (0, 4), "{name}: {r:?}");
        assert!((0..4).all(|k| resident(p, k)), "{name}: a page was evicted");
        let file = file_of(0xC3);
        ring.read_fixed(file, page, 0);
        assert_eq!(
            content(p, 1),
            vec![0xC3; PAGE],
            "{name}: the pinned write was lost"
        );
        ring.unpin();
        // SAFETY: file was opened above and is closed once.
        unsafe { libc::close(file) };
        // SAFETY: p is the block allocated above, freed once.
        assert!(unsafe { e.free(p) });
    }
}

/// With `evict_untested` off, anonymous pages still leave through the pin
/// guard; without the guard (UFFDIO_MOVE refused as on a kernel before 6.8)
/// they have no pin test either, and nothing is evicted.
#[test]
fn without_untested_eviction_anonymous_pages_leave_only_through_the_pin_guard() {
    for (refuse_move, evicted) in [(false, 4), (true, 0)] {
        let e = Engine::new(anon(Config {
            evict_untested: false,
            inject: pagefold_engine::Inject {
                fail_uffd_move: refuse_move,
                ..Default::default()
            },
            ..Config::default()
        }));
        let p = written(&e);
        let r = e.evict(p, 4 * PAGE);
        assert_eq!(r.evicted, evicted, "refused move {refuse_move}: {r:?}");
        assert_eq!(r.untested, 4 - evicted, "{r:?}");
        assert_eq!(e.stats().fallbacks.pin_guard, refuse_move as u64);
        for k in 0..4 {
            assert_eq!(content(p, k), vec![0x10 + k as u8; PAGE], "page {k}");
        }
        // SAFETY: p is the block allocated above, freed once.
        assert!(unsafe { e.free(p) });
    }
}
