/* madvise, posix_madvise and mlock on large malloc blocks. Prints what the
 * kernel answered and what the memory holds afterwards: with the preload
 * this must be exactly what private anonymous memory (glibc's blocks) gives.
 * With the preload it also checks that the engine really released frames,
 * shared pages by copy, merged, and exempted the blocks it had to. */
#include "common.h"
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

#define N 40 /* pages: above glibc's mmap threshold, so plain blocks are mmapped */

static uint64_t resident(void) { return pf_stat("frames_resident"); }

static void scan_twice(void) { pf_scan(); pf_scan(); } /* volatility check: two sightings */

/* A copy of `src` made by memcpy: virtual with the preload. */
static struct blk copy_of(struct blk *src) {
    struct blk b = blk_new(src->n);
    uint64_t before = pf_stat("pages_shared_by_copy");
    memcpy(b.p, src->p, src->n * PG);
    if (preloaded()) CHECK(pf_stat("pages_shared_by_copy") >= before + src->n);
    return b;
}

static void owned_pages(void) {
    struct blk a = blk_new(16);
    fill(a.p, 16, 1);
    uint64_t r0 = resident(), d0 = pf_stat("discarded");
    printf("dontneed middle (len not a page multiple): %d\n", madvise(a.p + 4 * PG, 3 * PG + 1, MADV_DONTNEED));
    /* Before reading them: a read of a punched frame allocates it again. */
    if (preloaded()) CHECK(resident() + 4 <= r0 && pf_stat("discarded") == d0 + 4);
    CHECK(is_zero(a.p + 4 * PG, 4 * PG));
    CHECK(is_pat(a.p, 4, 1));
    CHECK(a.p[8 * PG] == pat(8, 0, 1) && a.p[16 * PG - 1] == pat(15, PG - 1, 1));
    fill(a.p, 16, 2); /* still a working block */
    CHECK(is_pat(a.p, 16, 2));
    blk_free(&a);
}

static void after_copy(void) {
    struct blk a = blk_new(N);
    fill(a.p, N, 3);
    struct blk b = copy_of(&a);
    b.p[5 * PG] ^= 0xff; /* one page of the copy diverges */
    uint64_t r0 = resident();
    printf("dontneed copy: %d\n", madvise(b.p, N * PG, MADV_DONTNEED));
    CHECK(is_pat(a.p, N, 3));
    printf("dontneed source: %d\n", madvise(a.p, N * PG, MADV_DONTNEED));
    if (preloaded()) CHECK(resident() + N <= r0);
    CHECK(is_zero(b.p, N * PG)); /* the diverged page must not revert to the frame */
    CHECK(is_zero(a.p, N * PG));

    fill(a.p, N, 4);
    struct blk c = copy_of(&a);
    printf("free copy: %d\n", madvise(c.p, N * PG, MADV_FREE));
    /* Private memory may keep or drop MADV_FREE pages; the engine drops them. */
    for (size_t p = 0; p < N; p++)
        CHECK(is_zero(c.p + p * PG, PG) || (!preloaded() && c.p[p * PG + 9] == pat(p, 9, 4)));
    CHECK(is_pat(a.p, N, 4));
    blk_free(&a); blk_free(&b); blk_free(&c);
}

static void after_merge(void) {
    struct blk c = blk_new(N), d = blk_new(N);
    fill(c.p, N, 5);
    fill(d.p, N, 5);
    uint64_t m0 = pf_stat("merged");
    scan_twice();
    /* A background scan may have looked first and found nothing yet (the
     * pages were still being filled): smart scan then looks again at every
     * 2nd, 4th or 8th scan, and every 8th scan looks at all pages. */
    for (int k = 0; k < 8 && preloaded() && pf_stat("merged") < m0 + N; k++) pf_scan();
    if (preloaded()) CHECK(pf_stat("merged") >= m0 + N);
    uint64_t r0 = resident();
    printf("dontneed merged: %d\n", madvise(c.p, N * PG, MADV_DONTNEED));
    CHECK(is_pat(d.p, N, 5));
    printf("dontneed_locked merged partner: %d\n", madvise(d.p, N * PG, MADV_DONTNEED_LOCKED));
    if (preloaded()) CHECK(resident() + N <= r0);
    CHECK(is_zero(c.p, N * PG) && is_zero(d.p, N * PG));
    blk_free(&c); blk_free(&d);
}

static void refused(void) {
    struct blk e = blk_new(N);
    fill(e.p, N, 6);
    struct blk f = copy_of(&e);
    errno = 0;
    int r = madvise(f.p, PG, MADV_REMOVE);
    printf("remove: %d errno %d\n", r, errno);
    errno = 0;
    r = madvise(f.p + 1, PG, MADV_DONTNEED);
    printf("dontneed unaligned: %d errno %d\n", r, errno);
    printf("dontneed len 0: %d\n", madvise(f.p, 0, MADV_DONTNEED));
    errno = 1234;
    printf("posix_madvise dontneed: %d\n", posix_madvise(f.p, N * PG, POSIX_MADV_DONTNEED));
    printf("posix_madvise willneed: %d\n", posix_madvise(f.p, N * PG, POSIX_MADV_WILLNEED));
    printf("posix_madvise unaligned: %d errno %d\n", posix_madvise(f.p + 1, PG, POSIX_MADV_WILLNEED), errno);
    CHECK(is_pat(f.p, N, 6) && is_pat(e.p, N, 6));
    blk_free(&e); blk_free(&f);
}

/* Advice the kernel applies to engine memory as it would to plain memory. */
static void passed_through(void) {
    static const struct { int advice; const char *name; } all[] = {
        {MADV_NORMAL, "normal"}, {MADV_RANDOM, "random"}, {MADV_SEQUENTIAL, "sequential"},
        {MADV_WILLNEED, "willneed"}, {MADV_COLD, "cold"}, {MADV_PAGEOUT, "pageout"},
        {MADV_HUGEPAGE, "hugepage"}, {MADV_NOHUGEPAGE, "nohugepage"}, {MADV_MERGEABLE, "mergeable"},
        {MADV_UNMERGEABLE, "unmergeable"}, {MADV_DODUMP, "dodump"}, {MADV_DOFORK, "dofork"},
        {MADV_KEEPONFORK, "keeponfork"}, {MADV_POPULATE_READ, "populate_read"},
        {MADV_POPULATE_WRITE, "populate_write"},
    };
    struct blk e = blk_new(N);
    fill(e.p, N, 7);
    struct blk f = copy_of(&e);
    uint64_t x0 = pf_stat("exempted");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        errno = 0;
        int r = madvise(f.p, N * PG, all[i].advice);
        printf("%s: %d errno %d\n", all[i].name, r, r ? errno : 0);
        CHECK(is_pat(f.p, N, 7));
    }
    /* Still engine memory: a copy into it is virtual (POPULATE_WRITE made
     * its pages diverge, so copies out of it are plain by design). */
    uint64_t shared = pf_stat("pages_shared_by_copy");
    memcpy(f.p, e.p, N * PG);
    if (preloaded()) CHECK(pf_stat("exempted") == x0 && pf_stat("pages_shared_by_copy") == shared + N);
    CHECK(is_pat(f.p, N, 7));
    blk_free(&e); blk_free(&f);
}

static void on_segv(int sig) { (void)sig; _exit(42); }

/* Exit status of a child that runs `f(arg)` and exits with its result. */
static int in_child(int (*f)(struct blk *), struct blk *arg) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(f(arg));
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int touch(struct blk *b) {
    signal(SIGSEGV, on_segv);
    return *(volatile unsigned char *)b->p == 0 ? 8 : 9; /* no fault: 8 or 9, not 42 */
}

static int wiped(struct blk *b) { return is_zero(b->p, b->n * PG) ? 43 : 10; }

/* Advice kept in the mapping: the engine must not remap it away (copies,
 * merges and fork's freeze all remap). */
static void kept_in_mapping(void) {
    struct blk e = blk_new(N);
    fill(e.p, N, 8);
    uint64_t x0 = pf_stat("exempted");

    struct blk h = copy_of(&e);
    printf("dontfork: %d\n", madvise(h.p, N * PG, MADV_DONTFORK));
    memcpy(h.p, e.p, N * PG); /* would remap h, were it still the engine's */
    scan_twice();
    printf("dontfork flag: %d, child touching it: %d\n", vm_flag(h.p, "dc"), in_child(touch, &h));
    CHECK(is_pat(h.p, N, 8));
    printf("dofork: %d\n", madvise(h.p, N * PG, MADV_DOFORK));

    struct blk w = copy_of(&e);
    printf("wipeonfork: %d\n", madvise(w.p, N * PG, MADV_WIPEONFORK));
    printf("wipeonfork child sees zeros: %d\n", in_child(wiped, &w));
    CHECK(is_pat(w.p, N, 8));

    struct blk dd = copy_of(&e);
    printf("dontdump: %d\n", madvise(dd.p, N * PG, MADV_DONTDUMP));
    memcpy(dd.p, e.p, N * PG);
    scan_twice();
    printf("dontdump flag: %d %d\n", vm_flag(dd.p, "dd"), vm_flag(dd.p + (N - 1) * PG, "dd"));

    struct blk m = copy_of(&e);
    int r = mlock(m.p, N * PG);
    printf("mlock: %d\n", r ? errno : 0);
    memcpy(m.p, e.p, N * PG);
    scan_twice();
    printf("mlock flag: %d\n", r == 0 && vm_flag(m.p, "lo") && vm_flag(m.p + (N - 1) * PG, "lo"));
    CHECK(r != 0 || munlock(m.p, N * PG) == 0);
    CHECK(is_pat(dd.p, N, 8) && is_pat(m.p, N, 8) && is_pat(e.p, N, 8));
    if (preloaded()) CHECK(pf_stat("exempted") >= x0 + 3 + (r == 0));
    blk_free(&e); blk_free(&h); blk_free(&w); blk_free(&dd); blk_free(&m);
}

int main(void) {
    owned_pages();
    after_copy();
    after_merge();
    refused();
    passed_through();
    kept_in_mapping();
    printf("done\n");
    return 0;
}
