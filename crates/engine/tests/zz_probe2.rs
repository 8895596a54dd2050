// raw: memfd MAP_PRIVATE page, unpopulated, uffd-wp protect, pagemap entry
#[test]
fn raw() { unsafe {
    let fd = libc::memfd_create(c"x".as_ptr(), 0);
    libc::ftruncate(fd, 1<<20);
    let buf = [7u8; 4096];
    libc::pwrite(fd, buf.as_ptr().cast(), 4096, 0);
    let p = libc::mmap(std::ptr::null_mut(), 4*4096, libc::PROT_READ|libc::PROT_WRITE, libc::MAP_PRIVATE, fd, 0) as *mut u8;
    let pm = libc::open(c"/proc/self/pagemap".as_ptr(), libc::O_RDONLY);
    let rd = |tag: &str| { let mut e = [0u64;4]; libc::pread(pm, e.as_mut_ptr().cast(), 32, (p as usize/4096*8) as i64); eprintln!("{tag}: {:x?}", e); };
    rd("fresh");
    let _ = std::ptr::read_volatile(p.add(4096));
    rd("page1 read");
    let uffd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC|libc::O_NONBLOCK) as i32;
    let mut api = [0xAAu64, (1<<12)|(1<<13), 0];
    assert_eq!(libc::ioctl(uffd, ((3u64<<30)|(24<<16)|(0xAA<<8)|0x3F) as _, api.as_mut_ptr()), 0);
    let mut reg = [p as u64, 4*4096, 2, 0];
    assert_eq!(libc::ioctl(uffd, ((3u64<<30)|(32<<16)|(0xAA<<8)|0x00) as _, reg.as_mut_ptr()), 0);
    let mut wp = [p as u64, 4*4096, 1];
    assert_eq!(libc::ioctl(uffd, ((3u64<<30)|(24<<16)|(0xAA<<8)|0x06) as _, wp.as_mut_ptr()), 0);
    rd("protected");
    let mut wp = [p as u64, 4*4096, 0];
    assert_eq!(libc::ioctl(uffd, ((3u64<<30)|(24<<16)|(0xAA<<8)|0x06) as _, wp.as_mut_ptr()), 0);
    rd("unprotected");
}}
