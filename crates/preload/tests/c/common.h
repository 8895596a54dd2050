/* Helpers shared by the preload's test programs. Each program prints to
 * stdout only what must not depend on whether pagefold is preloaded (the
 * test compares plain and preloaded runs), and checks the engine's counters
 * itself when the preload is there (pagefold_stat, found with dlsym). */
#ifndef PAGEFOLD_TEST_COMMON_H
#define PAGEFOLD_TEST_COMMON_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PG 4096

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", \
    __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

/* The preload's statistic `name`, or UINT64_MAX without the preload. */
static __attribute__((unused)) uint64_t pf_stat(const char *name) {
    static uint64_t (*f)(const char *);
    static int looked;
    if (!looked) {
        f = (uint64_t (*)(const char *))dlsym(RTLD_DEFAULT, "pagefold_stat");
        looked = 1;
    }
    return f ? f(name) : UINT64_MAX;
}

/* One scan now; -1 without the preload. */
static __attribute__((unused)) int64_t pf_scan(void) {
    static int64_t (*f)(void);
    static int looked;
    if (!looked) {
        f = (int64_t (*)(void))dlsym(RTLD_DEFAULT, "pagefold_scan");
        looked = 1;
    }
    return f ? f() : -1;
}

/* True if the preload's engine serves this process. */
static __attribute__((unused)) int preloaded(void) { return pf_stat("blocks") != UINT64_MAX; }

/* A block of n whole pages, page-aligned whether malloc aligns or not (the
 * preload's large blocks are page-aligned; glibc's are 16 bytes into a page). */
struct blk { unsigned char *base, *p; size_t n; };

static __attribute__((unused)) struct blk blk_new(size_t n) {
    struct blk b;
    b.base = malloc((n + 1) * PG);
    CHECK(b.base);
    b.p = (unsigned char *)(((uintptr_t)b.base + PG - 1) & ~(uintptr_t)(PG - 1));
    b.n = n;
    return b;
}

static __attribute__((unused)) void blk_free(struct blk *b) { free(b->base); b->base = b->p = NULL; }

/* Byte i of page `page` for pattern `seed`; never zero. */
static __attribute__((unused)) unsigned char pat(size_t page, size_t i, unsigned seed) {
    return (unsigned char)(((i * 31 + page * 7 + seed * 13) ^ (i >> 7)) | 1);
}

static __attribute__((unused)) void fill(unsigned char *p, size_t pages, unsigned seed) {
    for (size_t pg = 0; pg < pages; pg++)
        for (size_t i = 0; i < PG; i++) p[pg * PG + i] = pat(pg, i, seed);
}

static __attribute__((unused)) int is_pat(const unsigned char *p, size_t pages, unsigned seed) {
    for (size_t pg = 0; pg < pages; pg++)
        for (size_t i = 0; i < PG; i++)
            if (p[pg * PG + i] != pat(pg, i, seed)) return 0;
    return 1;
}

static __attribute__((unused)) int is_zero(const unsigned char *p, size_t len) {
    for (size_t i = 0; i < len; i++) if (p[i]) return 0;
    return 1;
}

static __attribute__((unused)) uint64_t fnv(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Sleeps `us` microseconds even if signals interrupt the sleep. */
static __attribute__((unused)) void sleep_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* Lets `n` background scans pass (with the preload; at most 2 s), or
 * sleeps n ms without it. */
static __attribute__((unused)) void wait_scans(uint64_t n) {
    if (!preloaded()) { sleep_us(1000 * n); return; }
    uint64_t s0 = pf_stat("scans");
    for (int i = 0; i < 10000 && pf_stat("scans") < s0 + n; i++) sleep_us(200);
}

/* Whether the mapping holding `addr` has VmFlags `flag` ("dd", "lo", "dc"). */
static __attribute__((unused)) int vm_flag(const void *addr, const char *flag) {
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f);
    char line[512];
    int in = 0, found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2)
            in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            char want[8];
            snprintf(want, sizeof want, " %s", flag);
            for (char *s = line + 8; (s = strstr(s, want)); s++)
                if (s[strlen(want)] == ' ' || s[strlen(want)] == '\n') found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

#endif
