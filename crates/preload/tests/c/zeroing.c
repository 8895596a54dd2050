/* memset on large blocks and on fresh pages of the heap (and memcpy into
 * those): whatever the engine leaves out must still read zero, bytes outside
 * the range must keep their values, and the memory must stay ordinary,
 * writable memory. With the preload it also checks that the engine left out
 * the pages that read zero already (never touched) and wrote every page the
 * program had touched. */
#include "common.h"
#include <unistd.h>

#define N 300 /* pages: above the preload's 1 MiB threshold */

static uint64_t left_out(void) { return pf_stat("zero_pages_not_written"); }

/* Whether the engine leaves pages out (the preload, sparse zeroing not switched off). */
static int sparse(void) {
    const char *v = getenv("PAGEFOLD_SPARSE_ZERO");
    return preloaded() && !(v && v[0] == '0');
}

/* A fresh block cleared whole: nothing was touched, every whole page is left out. */
static void fresh_block(void) {
    struct blk a = blk_new(N);
    uint64_t s0 = left_out();
    memset(a.p, 0, N * PG);
    if (sparse()) CHECK(left_out() == s0 + N);
    if (preloaded() && !sparse()) CHECK(left_out() == s0);
    CHECK(is_zero(a.p, N * PG));
    fill(a.p, N, 1); /* still an ordinary block */
    CHECK(is_pat(a.p, N, 1));
    printf("fresh block cleared: ok\n");
    blk_free(&a);
}

/* Pages written before the clear must be written with zeros; bytes just
 * outside the cleared range keep their values. */
static void touched_pages_and_edges(void) {
    struct blk a = blk_new(N + 1);
    fill(a.p, 10, 2);
    fill(a.p + 100 * PG, 1, 3);
    unsigned char tail[200];
    memcpy(tail, a.p + N * PG - 200, 200);
    uint64_t s0 = left_out();
    /* From byte 100 of page 0 to 200 bytes before the end of page N-1:
     * whole pages 1 .. N-2, of which 1..9 and 100 were written. */
    memset(a.p + 100, 0, N * PG - 300);
    if (sparse()) CHECK(left_out() == s0 + (N - 2) - 10);
    CHECK(is_zero(a.p + 100, N * PG - 300));
    for (size_t i = 0; i < 100; i++) CHECK(a.p[i] == pat(0, i, 2));
    CHECK(memcmp(a.p + N * PG - 200, tail, 200) == 0);
    printf("touched pages and edges: ok\n");
    blk_free(&a);
}

/* A block whose every page was written: all of it must be cleared by writing. */
static void written_block(void) {
    struct blk a = blk_new(N + 2);
    fill(a.p, N, 4);
    uint64_t s0 = left_out();
    memset(a.p, 0, N * PG);
    if (preloaded()) CHECK(left_out() == s0);
    CHECK(is_zero(a.p, N * PG));
    printf("written block cleared: ok\n");
    blk_free(&a);
}

/* Other values, small ranges, memory that is not the engine's, and the
 * fortified entry point. */
static void others(void) {
    struct blk a = blk_new(N + 3);
    memset(a.p, 0x5a, N * PG);
    for (size_t i = 0; i < N * PG; i += 997) CHECK(a.p[i] == 0x5a);
    memset(a.p + 5, 0, 1000);
    CHECK(is_zero(a.p + 5, 1000) && a.p[4] == 0x5a && a.p[1005] == 0x5a);
    extern void *__memset_chk(void *, int, size_t, size_t);
    __memset_chk(a.p, 0, N * PG, N * PG);
    CHECK(is_zero(a.p, N * PG));
    unsigned char *small = malloc(64 * PG); /* glibc's, under the threshold */
    CHECK(small);
    memset(small, 0x11, 64 * PG);
    memset(small, 0, 64 * PG);
    CHECK(is_zero(small, 64 * PG));
    free(small);
    unsigned char stack[2 * PG];
    memset(stack, 0x22, sizeof stack);
    memset(stack, 0, sizeof stack);
    CHECK(is_zero(stack, sizeof stack));
    printf("other values and other memory: ok\n");
    blk_free(&a);
}

static uint64_t heap_left(void) { return pf_stat("heap_pages_left_zero"); }

/* Whether the engine leaves out untouched pages of the heap too. */
static int sparse_heap(void) {
    const char *v = getenv("PAGEFOLD_SPARSE_HEAP");
    return sparse() && !(v && v[0] == '0');
}

/* Fresh pages of the program break's area read zero until written: a
 * clear of them and a copy of zero pages into them may leave them out, and
 * must read exactly what memset and memcpy would have written. */
static void heap_pages(void) {
    unsigned char *old = sbrk(0);
    size_t pad = (size_t)(-(uintptr_t)old & (PG - 1));
    CHECK(sbrk(pad + 2 * N * PG) != (void *)-1);
    unsigned char *h = old + pad; /* page-aligned, 2N untouched pages */
    h[5 * PG] = 9;               /* one page touched */
    uint64_t s0 = heap_left();
    memset(h, 0, N * PG);
    if (sparse_heap()) CHECK(heap_left() == s0 + N - 1);
    if (!sparse_heap()) CHECK(heap_left() == s0);
    CHECK(is_zero(h, N * PG));

    /* A source whose pages 0, 3, 6, ... hold a pattern and the rest zeros. */
    struct blk src = blk_new(N + 4);
    for (size_t pg = 0; pg < N; pg++) {
        if (pg % 3 == 0) fill(src.p + pg * PG, 1, (unsigned)pg);
        else memset(src.p + pg * PG, 0, PG);
    }
    unsigned char *d = h + N * PG;
    d[PG + 7] = 1; /* page 1 touched: zero in the source, must be written */
    s0 = heap_left();
    memcpy(d, src.p, N * PG);
    if (sparse_heap()) CHECK(heap_left() == s0 + (N - (N + 2) / 3) - 1);
    CHECK(memcmp(d, src.p, N * PG) == 0);
    printf("heap pages cleared and copied: ok\n");
    blk_free(&src); /* the break stays where it is: glibc may have moved it since */
}

int main(void) {
    fresh_block();
    touched_pages_and_edges();
    written_block();
    others();
    heap_pages();
    return 0;
}
