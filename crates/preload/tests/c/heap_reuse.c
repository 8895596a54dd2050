/* A program that frees memory into glibc's heap and then asks for a block
 * larger than glibc's largest mmap threshold: glibc carves it out of the
 * freed heap (memory already resident) instead of mapping it afresh. Prints
 * where the block came from ("heap" or "mapped") and a checksum of what was
 * written through it; with the preload, the engine leaves such a malloc to
 * glibc (`allocs_left_to_heap`), so the output is plain's. */
#include <unistd.h>
#include "common.h"

enum { PIECE = 4096, PIECES = 12288, BIG = 40 << 20 };

int main(void) {
    static char *pieces[PIECES];
    for (int i = 0; i < PIECES; i++) {
        pieces[i] = malloc(PIECE);
        CHECK(pieces[i] != NULL);
        memset(pieces[i], i & 0xff, PIECE);
    }
    /* A live chunk above the pieces keeps glibc from trimming its heap when
     * they are freed: they coalesce into one free chunk of 48 MiB. */
    char *fence = malloc(64);
    CHECK(fence != NULL);
    for (int i = 0; i < PIECES; i++)
        free(pieces[i]);

    unsigned char *big = malloc(BIG);
    CHECK(big != NULL);
    int in_heap = (char *)big + BIG <= (char *)sbrk(0);
    uint64_t sum = 0;
    for (size_t i = 0; i < BIG; i += 512) {
        big[i] = (unsigned char)(i / 512 * 7);
        sum += big[i];
    }
    printf("%s %llu\n", in_heap ? "heap" : "mapped", (unsigned long long)sum);
    free(big);
    free(fence);
    return 0;
}
