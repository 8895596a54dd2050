/* A program that needs nearly every mapping the kernel allows
 * (vm.max_map_count) after making thousands of large copies: under the
 * engine each copy into the middle of a block splits its mapping, so the
 * engine holds mappings plain memory would not. The program maps single
 * pages (alternating protection, so none merge) until the kernel refuses,
 * prints how many it got, then mprotects, mremaps and unmaps some of them and
 * checks every byte of its copies. Run plainly and preloaded, the counts must
 * be nearly the same: the engine gives its mappings back when the program
 * runs out. */
#include "common.h"
#include <sys/mman.h>

#define COPIES 4000
#define CHUNK (32 * PG)

int main(void) {
    unsigned char *a = malloc(CHUNK), *b = malloc((size_t)COPIES * 2 * CHUNK);
    CHECK(a && b);
    for (size_t i = 0; i < CHUNK; i++) a[i] = (unsigned char)(i * 7 + 3);
    for (int i = 0; i < COPIES; i++) memcpy(b + (size_t)i * 2 * CHUNK, a, CHUNK);
    if (preloaded()) CHECK(pf_stat("pages_shared_by_copy") > 0);

    static void *got[1 << 17];
    long n = 0;
    for (; n < (1 << 17); n++) {
        int prot = (n & 1) ? PROT_READ : PROT_READ | PROT_WRITE;
        got[n] = mmap(NULL, PG, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (got[n] == MAP_FAILED) break;
    }
    CHECK(errno == ENOMEM);
    printf("single-page mappings until ENOMEM: %ld\n", n);

    /* At the limit: give some back, move and change others. */
    for (long i = 0; i + 1 < n && i < 64; i += 2) CHECK(munmap(got[i], PG) == 0);
    for (long i = 64; i + 1 < n && i < 128; i++) CHECK(mremap(got[i], PG, PG, 0) == got[i]);
    for (long i = 1; i < n && i < 64; i += 2) CHECK(mprotect(got[i], PG, PROT_READ | PROT_WRITE) == 0);

    uint64_t sum = 0;
    for (int i = 0; i < COPIES; i++) {
        const unsigned char *c = b + (size_t)i * 2 * CHUNK;
        CHECK(memcmp(c, a, CHUNK) == 0);
        sum += c[i % CHUNK];
    }
    for (long i = 64; i < n; i++) CHECK(munmap(got[i], PG) == 0);
    free(a);
    free(b);
    printf("copies intact, checksum %llu\n", (unsigned long long)sum);
    return 0;
}
