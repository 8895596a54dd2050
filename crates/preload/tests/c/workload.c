/* A workload touching every path of the preload: realloc across the
 * threshold in every direction, aligned allocations beyond a page (glibc's),
 * malloc_usable_size, calloc, virtual copies, zero pages and duplicate pages
 * for the scanner. Prints a checksum that must not depend on the preload or
 * on its configuration; the test runs it under each mechanism switched off
 * and each fault injected, and reads the engine's exit report. */
#include "common.h"
#include <malloc.h>
#include <unistd.h>

#define NP 64

static uint64_t total;

static int engine_block(const void *p) {
    return preloaded() && (uintptr_t)p % PG == 0 && pf_stat("frames_active") == 1;
}

static void reallocs(void) {
    unsigned char *p = malloc(100); /* glibc */
    memset(p, 7, 100);
    p = realloc(p, 50000); /* glibc -> engine */
    CHECK(p && p[0] == 7 && p[99] == 7 && malloc_usable_size(p) >= 50000);
    memset(p + 100, 8, 49900);
    p = realloc(p, 300000); /* engine -> engine, growing (a virtual copy) */
    CHECK(p && p[99] == 7 && p[100] == 8 && p[49999] == 8);
    memset(p + 50000, 9, 250000);
    unsigned char *q = realloc(p, 20000); /* shrinking, still large: in place */
    CHECK(q && q[99] == 7 && q[19999] == 8 && malloc_usable_size(q) >= 20000);
    /* In place unless an injected mmap failure made the engine move it. */
    if (engine_block(q) && !getenv("PAGEFOLD_INJECT_MMAP_AFTER")) CHECK(q == p && malloc_usable_size(q) == 5 * PG);
    p = realloc(q, 100); /* engine -> glibc */
    CHECK(p && p[0] == 7 && p[99] == 7 && malloc_usable_size(p) >= 100);
    total += fnv(p, 100);
    CHECK(realloc(p, 0) == NULL);

    /* A large shrink gives its pages back. */
    size_t big = 10 << 20;
    p = realloc(NULL, big);
    for (size_t i = 0; i < big; i += PG) *(uint64_t *)(p + i) = i + 1; /* unique pages: no merging */
    uint64_t r0 = pf_stat("frames_resident");
    q = realloc(p, 100 * PG);
    CHECK(q && *(uint64_t *)(q + 99 * PG) == 99 * PG + 1);
    if (engine_block(q)) CHECK(q == p && pf_stat("frames_resident") + 2000 <= r0);
    total += fnv(q, 100 * PG);
    free(q);

    /* glibc's aligned block (beyond a page) grown into the engine. */
    void *a = NULL;
    CHECK(posix_memalign(&a, 65536, 3000) == 0 && (uintptr_t)a % 65536 == 0);
    memset(a, 5, 3000);
    p = realloc(a, 40000);
    CHECK(p && p[2999] == 5);
    free(p);
}

static void aligned(void) {
    uint64_t blocks = pf_stat("blocks");
    static const size_t aligns[] = {8192, 16384, 65536, 1 << 21};
    void *keep[8];
    int k = 0;
    for (size_t i = 0; i < 4; i++) {
        void *p = NULL;
        CHECK(posix_memalign(&p, aligns[i], 100000) == 0 && (uintptr_t)p % aligns[i] == 0);
        memset(p, (int)i + 1, 100000);
        CHECK(malloc_usable_size(p) >= 100000);
        keep[k++] = p;
        unsigned char *q = aligned_alloc(aligns[i], 2 * aligns[i]);
        CHECK(q && (uintptr_t)q % aligns[i] == 0);
        memset(q, 3, 2 * aligns[i]);
        keep[k++] = q;
    }
    /* Beyond a page: glibc's, never the engine's. */
    if (preloaded()) CHECK(pf_stat("blocks") == blocks);
    for (int i = 0; i < k; i++) {
        total += fnv(keep[i], 1000);
        free(keep[i]);
    }
    void *p = NULL;
    CHECK(posix_memalign(&p, 3, 100000) == EINVAL && posix_memalign(&p, 4096, 100000) == 0);
    CHECK((uintptr_t)p % 4096 == 0);
    free(p);
    unsigned char *m = memalign(4096, 70000), *v = valloc(70000), *pv = pvalloc(5000);
    CHECK(m && v && pv && (uintptr_t)m % 4096 == 0 && (uintptr_t)v % 4096 == 0 && malloc_usable_size(pv) >= 8192);
    free(m); free(v); free(pv);
    CHECK(malloc_usable_size(NULL) == 0);
    errno = 0;
    volatile size_t huge = (size_t)1 << 62; /* calloc must catch the overflow */
    CHECK(calloc(huge, 16) == NULL && errno == ENOMEM);
    unsigned char *z = calloc(NP, PG);
    CHECK(z && is_zero(z, NP * PG));
    free(z);
}

/* Zero pages, duplicate pages and copies, for the scanner and the copier. */
static void mechanisms(void) {
    struct blk z = blk_new(NP), d1 = blk_new(NP), d2 = blk_new(NP), c = blk_new(NP);
    fill(z.p, NP, 11);
    memset(z.p, 0, NP * PG); /* resident zero pages */
    fill(d1.p, NP, 12);
    fill(d2.p, NP, 12); /* identical to d1 */
    memcpy(c.p, d1.p, NP * PG);
    c.p[PG] ^= 1;
    pf_scan();
    sleep_us(3000);
    pf_scan();
    CHECK(is_zero(z.p, NP * PG) && is_pat(d1.p, NP, 12) && is_pat(d2.p, NP, 12));
    CHECK(c.p[PG] == (pat(1, 0, 12) ^ 1));
    c.p[PG] ^= 1;
    CHECK(is_pat(c.p, NP, 12));
    total += fnv(c.p, NP * PG);
    blk_free(&z); blk_free(&d1); blk_free(&d2); blk_free(&c);
}

int main(void) {
    for (int round = 0; round < 3; round++) {
        reallocs();
        aligned();
        mechanisms();
    }
    printf("%llx\n", (unsigned long long)total);
    return 0;
}
