//! The colouring loop on real pages of this process: as root every page it
//! keeps has its banks in the set (checked again afterwards through
//! pagemap); without root PFNs read as zero and it reports that.

use pagefold_banks::colour::{colour_run, Colouring, Pages};
use pagefold_banks::pfn::{self, Pagemap};
use pagefold_banks::PAGE;

/// Anonymous pages: filled by writing, given back by MADV_DONTNEED.
struct Anon {
    base: *mut u8,
    map: Pagemap,
}

impl Pages for Anon {
    fn fill(&mut self, which: &[usize], pfns: &mut [u64]) -> bool {
        for (k, &i) in which.iter().enumerate() {
            // SAFETY: page i lies inside the test's mapping.
            unsafe { std::ptr::write_volatile(self.base.add(i * PAGE as usize), 0u8) };
            pfns[k] = self
                .map
                .pfn(self.base as usize + i * PAGE as usize)
                .unwrap_or(0);
        }
        true
    }
    fn give_back(&mut self, i: usize) {
        // SAFETY: page i lies inside the test's mapping; DONTNEED only drops its backing.
        unsafe {
            libc::madvise(
                self.base.add(i * PAGE as usize).cast(),
                PAGE as usize,
                libc::MADV_DONTNEED,
            )
        };
    }
}

fn anon(pages: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping, leaked for the test's duration.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: as above; no huge pages, so each 4 KiB page gets a page of its own.
    unsafe { libc::madvise(p, pages * PAGE as usize, libc::MADV_NOHUGEPAGE) };
    p.cast()
}

#[test]
fn every_kept_page_is_in_the_set_as_root() {
    if !pfn::visible() {
        eprintln!("skipped: pagemap hides PFNs (not root)");
        return;
    }
    let c = Colouring::parse("0-7", Some("coffee-lake-ddr4-1rank")).unwrap();
    let n = 512;
    let mut pages = Anon {
        base: anon(n),
        map: Pagemap::open().unwrap(),
    };
    let out = colour_run(&mut pages, n, &|pfn| c.fits(pfn));
    eprintln!("{out:?}");
    assert!(out.met(), "{out:?}");
    assert_eq!(out.coloured, n as u64);
    assert!(
        out.rejected > 0,
        "half the banks: some pages must be refused"
    );
    for i in 0..n {
        let pfn = pages
            .map
            .pfn(pages.base as usize + i * PAGE as usize)
            .unwrap();
        assert!(c.fits(pfn), "page {i} pfn {pfn:#x}");
    }
}
