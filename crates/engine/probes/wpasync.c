// Probe for the clock's choice (engine clock.rs, docs/MECHANISMS.md "Tiering policy"):
// can a WP_ASYNC userfaultfd co-register a range the engine's sync-WP/MISSING
// userfaultfd has, and what does keeping a range registered cost a first read
// (the kernel's fault-around is lost)? Run: gcc -O2 -o /tmp/wpasync crates/engine/probes/wpasync.c && /tmp/wpasync
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1<<13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1<<15)
#endif
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <time.h>
#include <fcntl.h>

static int uffd(unsigned long long features) {
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = {.api = UFFD_API, .features = features};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api)) { perror("uffd api"); exit(1); }
    return fd;
}
static int reg(int fd, void *p, size_t len, unsigned long long mode) {
    struct uffdio_register r = {.range = {(unsigned long)p, len}, .mode = mode};
    return ioctl(fd, UFFDIO_REGISTER, &r) ? errno : 0;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

#define PAGES 16384
int main(void) {
    size_t len = (size_t)PAGES * 4096;
    int mfd = memfd_create("probe", 0);
    ftruncate(mfd, len);
    char *w = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    for (size_t i = 0; i < len; i += 4096) w[i] = 1;
    unsigned long long wp = UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED;
    int sync_fd = uffd(wp | UFFD_FEATURE_MISSING_SHMEM);
    int async_fd = uffd(wp | UFFD_FEATURE_WP_ASYNC);
    char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, mfd, 0);
    printf("register sync WP|MISSING: %s\n", strerror(reg(sync_fd, p, len, UFFDIO_REGISTER_MODE_WP | UFFDIO_REGISTER_MODE_MISSING)));
    printf("then register the same range with a WP_ASYNC uffd: %s\n", strerror(reg(async_fd, p, len, UFFDIO_REGISTER_MODE_WP)));
    munmap(p, len);
    double t[2][9];
    for (int run = 0; run < 9; run++) {
        for (int registered = 0; registered < 2; registered++) {
            char *q = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, mfd, 0);
            if (registered && reg(sync_fd, q, len, UFFDIO_REGISTER_MODE_WP)) { perror("reg"); exit(1); }
            volatile char s = 0;
            double t0 = now();
            for (size_t i = 0; i < len; i += 4096) s += q[i];
            t[registered][run] = (now() - t0) / PAGES * 1e6;
            munmap(q, len);
        }
    }
    qsort(t[0], 9, sizeof(double), cmp);
    qsort(t[1], 9, sizeof(double), cmp);
    printf("first read of a memfd MAP_PRIVATE page, median of 9 x %d pages: unregistered %.3f us, registered (WP) %.3f us\n", PAGES, t[0][4], t[1][4]);
    return 0;
}
