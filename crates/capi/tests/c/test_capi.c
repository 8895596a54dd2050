/*
 * Exercises every function of pagefold.h from C. Run by tests/c_abi.rs;
 * exits 0 when every check passed, 1 (after printing the failed check)
 * otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagefold.h"

#define PAGE 4096
static int checks;

#define CHECK(cond)                                                              \
    do {                                                                         \
        checks++;                                                                \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

/* Fills len bytes with a pattern that differs per seed and per position. */
static void fill(unsigned char *p, size_t len, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static int is_filled(const unsigned char *p, size_t len, unsigned seed) {
    unsigned char *want = malloc(len ? len : 1);
    fill(want, len, seed);
    int ok = memcmp(p, want, len) == 0;
    free(want);
    return ok;
}

static int all_zero(const unsigned char *p, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (p[i]) return 0;
    return 1;
}

static void test_null_handling(void) {
    char buf[16];
    struct pf_stats st;
    pf_scan_report rep;
    int x = 7, y = 9;

    CHECK(pf_config_default(NULL) == -1);
    CHECK(pf_engine_new_with(NULL) == NULL);
    pf_engine_free(NULL);
    errno = 0;
    CHECK(pf_alloc(NULL, PAGE, 0) == NULL);
    CHECK(errno == EINVAL);
    CHECK(pf_free(NULL, &x) == -1);
    CHECK(pf_free(NULL, NULL) == -1);
    CHECK(pf_owns(NULL, &x) == 0);
    CHECK(pf_block_len(NULL, &x) == 0);
    CHECK(pf_scan(NULL, &rep) == -1);
    CHECK(pf_scan(NULL, NULL) == -1);
    CHECK(pf_start_background(NULL, 10) == -1);
    pf_stop_background(NULL);
    CHECK(pf_stats(NULL, &st) == -1);
    CHECK(pf_stats(NULL, NULL) == -1);
    memset(buf, 'x', sizeof buf);
    CHECK(pf_stats_json(NULL, buf, sizeof buf) == 0);
    CHECK(buf[0] == '\0');
    CHECK(pf_stats_json(NULL, NULL, 0) == 0);
    /* pf_copy without an engine is a plain memmove; NULL data does nothing. */
    pf_copy(NULL, &y, &x, sizeof x);
    CHECK(y == 7);
    pf_copy(NULL, NULL, &x, sizeof x);
    pf_copy(NULL, &y, NULL, sizeof x);

    /* A live engine with NULL data pointers. */
    pf_engine *e = pf_engine_new();
    CHECK(e != NULL);
    CHECK(pf_free(e, NULL) == -1);
    CHECK(pf_owns(e, NULL) == 0);
    CHECK(pf_block_len(e, NULL) == 0);
    CHECK(pf_stats(e, NULL) == -1);
    CHECK(pf_scan(e, NULL) == 0);
    CHECK(pf_stats_json(e, NULL, 5) == 0); /* NULL buffer with a capacity */
    pf_copy(e, NULL, &x, sizeof x);
    pf_copy(e, &y, NULL, sizeof x);
    CHECK(pf_start_background(e, 0) == -1);
    CHECK(pf_alloc(e, PAGE, 0x100) == NULL); /* unknown flag */
    pf_engine_free(e);

    /* A freed handle is invalid for good, and a second free is ignored. */
    errno = 0;
    CHECK(pf_alloc(e, PAGE, 0) == NULL);
    CHECK(errno == EINVAL);
    CHECK(pf_stats(e, &st) == -1);
    pf_engine_free(e);
    /* A pointer that never was a handle. */
    CHECK(pf_alloc((pf_engine *)&x, PAGE, 0) == NULL);
    CHECK(pf_scan((pf_engine *)&x, &rep) == -1);
}

static void test_alloc_copy(pf_engine *e) {
    const size_t len = 64 * PAGE;
    struct pf_stats st0, st;
    CHECK(pf_stats(e, &st0) == 0);

    unsigned char *a = pf_alloc(e, len, 0);
    unsigned char *b = pf_alloc(e, len, PF_ALLOC_FULL_WRITE);
    CHECK(a != NULL && b != NULL);
    CHECK(((uintptr_t)a % PAGE) == 0 && ((uintptr_t)b % PAGE) == 0);
    CHECK(all_zero(a, len) && all_zero(b, len));
    CHECK(pf_block_len(e, a) == len);
    CHECK(pf_block_len(e, a + PAGE) == 0); /* not a block start */
    CHECK(pf_owns(e, a) == 1 && pf_owns(e, a + len - 1) == 1);
    CHECK(pf_owns(e, &st) == 0);
    CHECK(pf_free(e, a + PAGE) == -1); /* interior pointer: not freed */
    CHECK(pf_owns(e, a) == 1);

    /* Odd sizes round up to whole pages; 0 gives one page. */
    unsigned char *odd = pf_alloc(e, 3 * PAGE + 1, 0);
    unsigned char *none = pf_alloc(e, 0, 0);
    CHECK(odd && none);
    CHECK(pf_block_len(e, odd) == 4 * PAGE);
    CHECK(pf_block_len(e, none) == PAGE);
    odd[3 * PAGE] = 0xab;
    CHECK(odd[3 * PAGE] == 0xab);

    /* Whole-block copy: the bytes arrive, then both sides diverge independently. */
    fill(a, len, 1);
    pf_copy(e, b, a, len);
    CHECK(is_filled(b, len, 1));
    CHECK(pf_stats(e, &st) == 0);
    if (st.frames_active)
        CHECK(st.pages_shared_by_copy >= st0.pages_shared_by_copy + 64);
    b[5 * PAGE + 17] ^= 0xff;                 /* write after copy, destination */
    CHECK(is_filled(a, len, 1));              /* source unchanged */
    CHECK(b[5 * PAGE + 17] == (unsigned char)(a[5 * PAGE + 17] ^ 0xff));
    a[9 * PAGE] ^= 0x55;                      /* write after copy, source */
    CHECK(b[9 * PAGE] == (unsigned char)(a[9 * PAGE] ^ 0x55));
    b[5 * PAGE + 17] ^= 0xff;
    a[9 * PAGE] ^= 0x55;
    CHECK(is_filled(a, len, 1) && is_filled(b, len, 1));

    /* Copy of a copy, then rewrite the middle source completely. */
    unsigned char *c = pf_alloc(e, len, 0);
    CHECK(c != NULL);
    pf_copy(e, c, b, len);
    fill(b, len, 2);
    CHECK(is_filled(a, len, 1) && is_filled(b, len, 2) && is_filled(c, len, 1));

    /* Partial, unaligned copy (head and tail pages copied plainly). */
    pf_copy(e, c + 100, a + 100, 10 * PAGE + 333);
    CHECK(memcmp(c + 100, a + 100, 10 * PAGE + 333) == 0);
    /* Different page offsets: plain copy. */
    pf_copy(e, c + 1, b, 4 * PAGE);
    CHECK(memcmp(c + 1, b, 4 * PAGE) == 0);

    /* Overlapping copy inside one block: memmove semantics. */
    unsigned char *ref = malloc(len);
    fill(c, len, 3);
    memcpy(ref, c, len);
    memmove(ref + 3 * PAGE, ref, 20 * PAGE);
    pf_copy(e, c + 3 * PAGE, c, 20 * PAGE);
    CHECK(memcmp(c, ref, len) == 0);

    /* Copies to and from memory that is not the engine's. */
    unsigned char *heap = malloc(len);
    pf_copy(e, heap, a, len);
    CHECK(is_filled(heap, len, 1));
    fill(heap, len, 4);
    pf_copy(e, a, heap, len);
    CHECK(is_filled(a, len, 4));
    free(heap);
    free(ref);

    CHECK(pf_free(e, a) == 0);
    CHECK(pf_free(e, a) == -1); /* double free */
    CHECK(pf_owns(e, a) == 0);
    CHECK(pf_free(e, b) == 0);
    CHECK(pf_free(e, c) == 0);
    CHECK(pf_free(e, odd) == 0);
    CHECK(pf_free(e, none) == 0);
    CHECK(pf_stats(e, &st) == 0);
    CHECK(st.blocks == st0.blocks && st.block_bytes == st0.block_bytes);
}

static void test_scan(pf_engine *e) {
    const size_t pages = 128, len = pages * PAGE;
    unsigned char *z = pf_alloc(e, len, PF_ALLOC_FULL_WRITE);
    unsigned char *d1 = pf_alloc(e, len, 0);
    unsigned char *d2 = pf_alloc(e, len, 0);
    CHECK(z && d1 && d2);
    /* Touched then zeroed again: resident all-zero pages. */
    memset(z, 1, len);
    memset(z, 0, len);
    /* Identical content written twice, independently. */
    fill(d1, len, 5);
    fill(d2, len, 5);

    pf_scan_report rep;
    memset(&rep, 0xff, sizeof rep);
    /* The first scan records what it sees; the second folds what did not change. */
    CHECK(pf_scan(e, &rep) == 0);
    CHECK(rep.zero_folded == 0 && rep.merged == 0);
    memset(&rep, 0xff, sizeof rep);
    CHECK(pf_scan(e, &rep) == 0);
    CHECK(rep.pages_scanned <= 1000000);
    struct pf_stats st;
    CHECK(pf_stats(e, &st) == 0);
    CHECK(st.scans >= 1);
    if (st.frames_active && st.protected_scan) {
        CHECK(rep.zero_folded >= pages);
        CHECK(rep.merged >= pages);
        CHECK(st.pages_sharing >= pages);
    }
    /* Everything reads as before, and merged pages diverge independently. */
    CHECK(all_zero(z, len));
    CHECK(is_filled(d1, len, 5) && is_filled(d2, len, 5));
    d1[7 * PAGE + 5] ^= 1;
    CHECK(d2[7 * PAGE + 5] == (unsigned char)(d1[7 * PAGE + 5] ^ 1));
    z[40 * PAGE] = 9;
    CHECK(z[40 * PAGE] == 9 && z[41 * PAGE] == 0 && z[39 * PAGE] == 0);
    d1[7 * PAGE + 5] ^= 1;
    CHECK(is_filled(d1, len, 5) && is_filled(d2, len, 5));

    /* Background scanner: starts, is idempotent, stops; data stays right. */
    CHECK(pf_start_background(e, 5) == 0);
    CHECK(pf_start_background(e, 5) == 0);
    for (int i = 0; i < 20; i++) {
        fill(d2 + (size_t)(i % pages) * PAGE, PAGE, 100 + i);
        CHECK(is_filled(d2 + (size_t)(i % pages) * PAGE, PAGE, 100 + i));
    }
    pf_stop_background(e);
    pf_stop_background(e);

    CHECK(pf_free(e, z) == 0 && pf_free(e, d1) == 0 && pf_free(e, d2) == 0);
}

static void test_stats_json(pf_engine *e) {
    size_t need = pf_stats_json(e, NULL, 0);
    CHECK(need > 10);
    char *buf = malloc(need + 1);
    CHECK(pf_stats_json(e, buf, need + 1) == need);
    CHECK(strlen(buf) == need);
    CHECK(buf[0] == '{' && buf[need - 1] == '}');
    CHECK(strstr(buf, "\"pages_shared_by_copy\"") != NULL);
    CHECK(strstr(buf, "\"fallbacks\"") != NULL);
    CHECK(strstr(buf, "\"schema\":\"pagefold-engine-stats/1\"") != NULL);
    /* Truncated like snprintf: cap-1 bytes and a NUL. */
    char small[8];
    CHECK(pf_stats_json(e, small, sizeof small) == need);
    CHECK(strlen(small) == sizeof small - 1 && memcmp(small, buf, sizeof small - 1) == 0);
    char one[1] = {'x'};
    CHECK(pf_stats_json(e, one, 1) == need && one[0] == '\0');
    free(buf);
}

static void test_config(void) {
    pf_config c;
    memset(&c, 0xee, sizeof c);
    CHECK(pf_config_default(&c) == 0);
    CHECK(c.frames && c.copy && c.zero && c.merge);
    CHECK(c.scan_chunk_pages > 0 && c.vma_budget == 0); /* 0: automatic */
    CHECK(c.scan_cpu_budget > 0.0 && c.scan_cpu_budget <= 1.0);
    CHECK(c.inject_fail_mmap_after < 0 && c.inject_max_map_count == 0);
    CHECK(c.scan_interval_ms == 0);
    CHECK(c.volatile_check == 1 && c.pin_grace_us == 1000);

    /* Without the volatility check one scan folds a resident zero page. */
    pf_config eager = c;
    eager.volatile_check = 0;
    eager.pin_grace_us = 0;
    pf_engine *ee = pf_engine_new_with(&eager);
    CHECK(ee != NULL);
    unsigned char *zp = pf_alloc(ee, 4 * PAGE, PF_ALLOC_FULL_WRITE);
    CHECK(zp != NULL);
    pf_scan_report zr;
    CHECK(pf_scan(ee, &zr) == 0);
    struct pf_stats zst;
    CHECK(pf_stats(ee, &zst) == 0);
    if (zst.frames_active && zst.protected_scan) CHECK(zr.zero_folded == 4);
    CHECK(pf_free(ee, zp) == 0);
    pf_engine_free(ee);

    pf_config bad = c;
    bad.scan_cpu_budget = 1.5;
    errno = 0;
    CHECK(pf_engine_new_with(&bad) == NULL && errno == EINVAL);
    bad = c;
    bad.scan_chunk_pages = 0;
    CHECK(pf_engine_new_with(&bad) == NULL);

    /* No memfd: the engine degrades to plain memory, says so, and still works. */
    pf_config nofd = c;
    nofd.inject_fail_memfd = 1;
    pf_engine *e = pf_engine_new_with(&nofd);
    CHECK(e != NULL);
    struct pf_stats st;
    CHECK(pf_stats(e, &st) == 0);
    CHECK(st.frames_active == 0 && st.fallbacks.memfd == 1);
    test_alloc_copy(e);
    pf_engine_free(e);

    /* Copy switched off: copies are plain. */
    pf_config nocopy = c;
    nocopy.copy = 0;
    e = pf_engine_new_with(&nocopy);
    CHECK(e != NULL);
    unsigned char *a = pf_alloc(e, 8 * PAGE, 0), *b = pf_alloc(e, 8 * PAGE, 0);
    fill(a, 8 * PAGE, 6);
    pf_copy(e, b, a, 8 * PAGE);
    CHECK(is_filled(b, 8 * PAGE, 6));
    CHECK(pf_stats(e, &st) == 0 && st.pages_shared_by_copy == 0);
    pf_free(e, a);
    pf_free(e, b);
    pf_engine_free(e);

    /* A configured background scanner is stopped by pf_engine_free. */
    pf_config bg = c;
    bg.scan_interval_ms = 2;
    e = pf_engine_new_with(&bg);
    CHECK(e != NULL);
    a = pf_alloc(e, 16 * PAGE, 0);
    fill(a, 16 * PAGE, 7);
    CHECK(is_filled(a, 16 * PAGE, 7));
    pf_free(e, a);
    pf_engine_free(e);
}

/* A block not freed before its engine stays readable and writable. */
static void test_block_outlives_engine(void) {
    pf_engine *e = pf_engine_new();
    CHECK(e != NULL);
    unsigned char *a = pf_alloc(e, 16 * PAGE, 0), *b = pf_alloc(e, 16 * PAGE, 0);
    fill(a, 16 * PAGE, 8);
    pf_copy(e, b, a, 16 * PAGE);
    pf_engine_free(e);
    CHECK(is_filled(a, 16 * PAGE, 8) && is_filled(b, 16 * PAGE, 8));
    b[3] ^= 1;
    CHECK(a[3] == (unsigned char)(b[3] ^ 1));
    fill(a, 16 * PAGE, 9);
    CHECK(is_filled(a, 16 * PAGE, 9));
    CHECK(pf_free(e, a) == -1);
}

/* Several threads allocate, copy, write and verify on one engine while the
 * background scanner runs. */
static pf_engine *shared_engine;

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    const size_t len = 32 * PAGE;
    for (unsigned round = 0; round < 20; round++) {
        unsigned seed = id * 1000 + round;
        unsigned char *a = pf_alloc(shared_engine, len, 0);
        unsigned char *b = pf_alloc(shared_engine, len, 0);
        if (!a || !b) return (void *)1;
        fill(a, len, seed);
        pf_copy(shared_engine, b, a, len);
        b[round * PAGE] ^= 0x80;
        if (!is_filled(a, len, seed)) return (void *)2;
        b[round * PAGE] ^= 0x80;
        if (!is_filled(b, len, seed)) return (void *)3;
        if (pf_free(shared_engine, a) || pf_free(shared_engine, b)) return (void *)4;
    }
    return NULL;
}

static void test_threads(void) {
    shared_engine = pf_engine_new();
    CHECK(shared_engine != NULL);
    CHECK(pf_start_background(shared_engine, 1) == 0);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0);
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        if (ret) fprintf(stderr, "worker %d failed: code %d\n", i, (int)(uintptr_t)ret);
        CHECK(ret == NULL);
    }
    pf_stop_background(shared_engine);
    struct pf_stats st;
    CHECK(pf_stats(shared_engine, &st) == 0 && st.blocks == 0);
    pf_engine_free(shared_engine);
}

int main(void) {
    test_null_handling();

    pf_config c;
    CHECK(pf_config_default(&c) == 0);
    pf_engine *e = pf_engine_new_with(&c);
    CHECK(e != NULL);
    struct pf_stats st;
    CHECK(pf_stats(e, &st) == 0);
    printf("engine: frames_active=%d protected_scan=%d\n", st.frames_active, st.protected_scan);
    test_alloc_copy(e);
    test_scan(e);
    test_stats_json(e);
    pf_engine_free(e);

    e = pf_engine_new(); /* from the environment */
    CHECK(e != NULL);
    test_alloc_copy(e);
    pf_engine_free(e);

    test_config();
    test_block_outlives_engine();
    test_threads();
    printf("test_capi: %d checks passed\n", checks);
    return 0;
}
