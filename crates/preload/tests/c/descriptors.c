/* A program that works on its descriptors as daemons, shells and test
 * harnesses do, while the engine serves its large blocks and copies:
 *  1. lists the descriptors open below its limit (the engine's must not show);
 *  2. dup2s a file of its own onto every low number (3..63) and uses them;
 *  3. closes everything from 3 up with close_range and closefrom;
 *  4. raises its descriptor limit, then takes the numbers the engine's
 *     descriptors sit on with dup2 (found with raw system calls, which the
 *     preload does not see) — the engine must move out of the way;
 *  5. replaces the engine's descriptors with raw dup3 calls — the engine must
 *     notice, stop, and never write the program's file or lose a byte.
 * stdout must be the same plain and preloaded; with the preload, the program
 * also checks the engine's counters. */
#include "common.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGES 64

static char path[256];

/* A file of the program's own holding a known pattern; returns its descriptor. */
static int own_file(void) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    unsigned char buf[PG];
    fill(buf, 1, 99);
    CHECK(write(fd, buf, PG) == PG);
    return fd;
}

/* The file behind `fd` still holds exactly the pattern own_file wrote. */
static int file_intact(int fd) {
    unsigned char buf[PG + 1];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    return n == PG && is_pat(buf, 1, 99);
}

/* Copies between large blocks and a scan: the engine at work. Returns a
 * checksum and checks every byte. */
static uint64_t engine_work(unsigned seed) {
    struct blk a = blk_new(PAGES), b = blk_new(PAGES), z = blk_new(PAGES);
    fill(a.p, PAGES, seed);
    memcpy(b.p, a.p, PAGES * PG);
    memset(z.p, 0, PAGES * PG);
    pf_scan();
    b.p[100] ^= 1;
    CHECK(is_pat(a.p, PAGES, seed));
    b.p[100] ^= 1;
    CHECK(is_pat(b.p, PAGES, seed));
    CHECK(is_zero(z.p, PAGES * PG));
    uint64_t h = fnv(a.p, PAGES * PG) + 3 * fnv(b.p, PAGES * PG);
    blk_free(&a);
    blk_free(&b);
    blk_free(&z);
    return h;
}

/* Descriptors open below the soft limit, as the program sees them. */
static void list_open(const char *when) {
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
    printf("%s:", when);
    for (int fd = 0; fd < (int)r.rlim_cur; fd++)
        if (fcntl(fd, F_GETFD) >= 0) printf(" %d", fd);
    printf("\n");
}

/* Numbers in [from, to) open according to the kernel itself (raw fcntl,
 * which no preload sees): the engine's, at and above the original limit. */
static int raw_open(int from, int to, int *out, int max) {
    int n = 0;
    for (int fd = from; fd < to && n < max; fd++)
        if (syscall(SYS_fcntl, fd, F_GETFD) >= 0) out[n++] = fd;
    return n;
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/pagefold-descriptors-%d", (int)getpid());
    /* A limit below the hard one, as most systems give (so 4. can raise it);
     * set before the first large allocation starts the engine. */
    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_cur > 1024 && lim.rlim_max > 1024) {
        lim.rlim_cur = 1024;
        CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
    }
    const int soft = (int)lim.rlim_cur;

    /* 1. The engine starts and opens its descriptors; the program sees none. */
    uint64_t h = engine_work(1);
    list_open("open after start");

    /* 2. A file of ours on every low number, used while the engine works. */
    int f = own_file();
    for (int n = 3; n < 64; n++)
        if (n != f) CHECK(dup2(f, n) == n);
    h = h * 31 + engine_work(2);
    for (int n = 3; n < 64; n++) CHECK(file_intact(n));
    for (int n = 3; n < 64; n++) CHECK(close(n) == 0);
    printf("dup2 onto low numbers: file intact\n");

    /* 3. Everything from 3 up closed; the engine keeps working. */
    uint64_t shared0 = pf_stat("pages_shared_by_copy");
    CHECK(close_range(3, ~0U, 0) == 0);
    h = h * 31 + engine_work(3);
    closefrom(3);
    h = h * 31 + engine_work(4);
    if (preloaded()) CHECK(pf_stat("pages_shared_by_copy") > shared0);
    list_open("open after close_range");

    /* 4. The program raises its limit and takes the engine's numbers. */
    int ours[300], taken = 0;
    if (lim.rlim_max > lim.rlim_cur) {
        struct rlimit up = {lim.rlim_max, lim.rlim_max};
        CHECK(setrlimit(RLIMIT_NOFILE, &up) == 0);
        int n = raw_open(soft, soft + 300, ours, 300);
        f = own_file();
        for (int i = 0; i < n; i++) {
            errno = 0;
            CHECK(close(ours[i]) == -1 && errno == EBADF);   /* not the program's */
            CHECK(fcntl(ours[i], F_GETFD) == -1 && errno == EBADF);
            struct stat st;
            CHECK(fstat(ours[i], &st) == -1 && errno == EBADF);
            CHECK(dup2(f, ours[i]) == ours[i]);
            CHECK(file_intact(ours[i]));
            taken++;
        }
        h = h * 31 + engine_work(5);
        for (int i = 0; i < n; i++) CHECK(file_intact(ours[i]) && close(ours[i]) == 0);
        CHECK(file_intact(f));
        close(f);
        if (preloaded()) {
            CHECK(taken > 0);
            CHECK(pf_stat("descriptor_replaced") == 0);
        }
    }
    printf("dup2 onto the engine's numbers: file intact\n");

    /* 5. Raw system calls put the program's file on the engine's numbers. */
    struct blk keep = blk_new(PAGES), copy = blk_new(PAGES);
    fill(keep.p, PAGES, 7);
    memcpy(copy.p, keep.p, PAGES * PG);
    f = own_file();
    /* Anywhere up to the hard limit, or the engine's ceiling above it. */
    int end = (int)(lim.rlim_max > (1 << 20) ? (1 << 20) : lim.rlim_max);
    int n = raw_open(3, (end > (1 << 16) ? end : (1 << 16)) + 600, ours, 300), replaced = 0;
    for (int i = 0; i < n; i++)
        if (ours[i] != f && ours[i] > 2) {
            CHECK(syscall(SYS_dup3, f, ours[i], O_CLOEXEC) == ours[i]);
            replaced++;
        }
    h = h * 31 + engine_work(6);
    h = h * 31 + engine_work(7);
    CHECK(is_pat(keep.p, PAGES, 7) && is_pat(copy.p, PAGES, 7));
    copy.p[5] ^= 1;
    CHECK(is_pat(keep.p, PAGES, 7));
    copy.p[5] ^= 1;
    CHECK(file_intact(f));
    struct stat st;
    CHECK(fstat(f, &st) == 0 && st.st_size == PG);
    if (preloaded()) CHECK(replaced > 0 && pf_stat("descriptor_replaced") == 1);
    blk_free(&keep);
    blk_free(&copy);
    unlink(path);
    printf("raw dup3 onto the engine's numbers: every byte kept\n");
    printf("checksum %016llx\n", (unsigned long long)h);
    return 0;
}
