//! pagefold-preload: the pagefold engine for unmodified programs.
//!
//! Loaded with LD_PRELOAD, this library takes over the malloc family,
//! memcpy/memmove and memset. Blocks of at least `PAGEFOLD_THRESHOLD` bytes (default two
//! pages) come from the engine: page-aligned, so two such blocks that hold
//! objects at the same offset from their start (R's vector data sits 48 bytes
//! in) keep source and destination of a copy at equal page offsets, and the
//! engine turns the whole pages of that copy into copy-on-write views.
//! Everything smaller goes to glibc's allocator (`__libc_malloc` and friends,
//! called directly, so nothing here resolves symbols while allocating).
//!
//! Rules that keep it safe inside any program:
//! - never recurse: the library's own heap (and so the engine's) is glibc's,
//!   through a global allocator that calls `__libc_*` directly; a thread that
//!   is inside the engine, and the engine's own scanner thread, copy plainly;
//! - never fail the program: if the engine cannot start or refuses, glibc
//!   serves the request;
//! - the real memcpy, memmove and memset are resolved once (IFUNCs, so
//!   through dlsym); until then copies use `rep movsb` and memset `rep stosb`;
//! - a large memset to zero writes only the pages that do not read zero
//!   already (the engine's sparse zeroing); every other memset is glibc's.
//!
//! - memory-management calls on engine blocks (madvise, mprotect, mlock)
//!   get the answer private anonymous memory would give;
//! - buffers a program registers for long-lived kernel pins (io_uring fixed
//!   buffers, RDMA memory regions) are taken out of the engine's hands first.
//!
//! Modules: `real` (glibc's functions), `hooks` (malloc family, copies and memset),
//! `placement` (where in its first page a large allocation starts, so that
//! the program's copies line up),
//! `vm` (madvise, mprotect, mlock), `pins` (buffer registrations), `global` (the engine instance,
//! configuration, the exit report), `probe` (statistics and scans on demand,
//! for tests).

// The exported functions are `unsafe extern "C"`: each unsafe operation in
// them still gets its own block and SAFETY argument.
#![deny(unsafe_op_in_unsafe_fn)]

mod fds;
mod global;
mod hooks;
mod pins;
mod placement;
mod probe;
mod real;
mod vm;
