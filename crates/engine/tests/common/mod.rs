//! Helpers several engine test files share (each test file is its own crate,
//! so not every one uses every helper).
#![allow(dead_code)]

/// A pipe with room for the largest transfer, so one thread can write then read.
pub fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) };
    (fds[0], fds[1])
}

/// A connected pair of Unix stream sockets.
pub fn socketpair() -> (i32, i32) {
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}
