/* Exercises every interposed function with a plain-memory check; prints a
 * checksum that must not depend on whether pagefold is preloaded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static uint64_t sum(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(void) {
    const size_t big = 64 * 4096 + 48, small = 100;
    uint64_t total = 0;
    for (int round = 0; round < 20; round++) {
        /* R-like: data 48 bytes into page-aligned blocks, copies at equal offsets. */
        unsigned char *a = malloc(big), *b = malloc(big);
        CHECK(a && b);
        for (size_t i = 0; i < big; i++) a[i] = (unsigned char)(i * 7 + round);
        memcpy(b + 48, a + 48, big - 48);
        memcpy(b, a, 48);
        CHECK(memcmp(a, b, big) == 0);
        b[5000] ^= 0xff;                          /* the copy diverges */
        CHECK(a[5000] == (unsigned char)(5000 * 7 + round));
        memmove(a + 4096, a, 8192);               /* overlapping move */
        total += sum(a, big) + sum(b, big);

        unsigned char *z = calloc(1, big);
        CHECK(z);
        for (size_t i = 0; i < big; i++) CHECK(z[i] == 0);
        z = realloc(z, 3 * big);                  /* engine -> engine */
        CHECK(z);
        for (size_t i = 0; i < big; i++) CHECK(z[i] == 0);
        memset(z + big, 3, 2 * big);
        unsigned char *s = malloc(small);
        memset(s, 9, small);
        s = realloc(s, big);                      /* glibc -> engine */
        CHECK(s && s[small - 1] == 9);
        s = realloc(s, small);                    /* shrink */
        CHECK(s && s[0] == 9);
        total += sum(z, 3 * big) + sum(s, small);
        CHECK(malloc_usable_size(b) >= big);

        void *al = NULL;
        CHECK(posix_memalign(&al, 4096, big) == 0 && (uintptr_t)al % 4096 == 0);
        void *al2 = aligned_alloc(64, big);
        void *al3 = memalign(8192, big);          /* beyond a page: glibc */
        CHECK(al2 && al3 && (uintptr_t)al3 % 8192 == 0);
        memset(al, 1, big); memset(al2, 2, big); memset(al3, 3, big);
        void *v = valloc(big), *pv = pvalloc(100);
        CHECK(v && pv && (uintptr_t)v % 4096 == 0);
        free(al); free(al2); free(al3); free(v); free(pv);
        free(a); free(b); free(z); free(s);
        free(NULL);
    }
    printf("%llx\n", (unsigned long long)total);
    return 0;
}
