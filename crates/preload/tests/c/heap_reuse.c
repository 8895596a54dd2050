/* A program that frees memory into glibc's heap and then asks for a block
 * larger than glibc's largest mmap threshold: glibc carves it out of the
 * freed heap (memory already resident) instead of mapping it afresh. Prints
 * where the block came from ("heap" or "mapped") and a checksum of what was
 * written through it; with the preload, the engine leaves such a malloc to
 * glibc (`allocs_left_to_heap`), so the output is plain's. */
#include <unistd.h>
#include "common.h"

enum { PIECE = 4096, PIECES = 12288, BIG = 40 << 20 };

/* With "fragmented": a heap of 50,000 scattered free chunks, whose count
 * (glibc's mallinfo2 walks every free chunk) takes longer than the preload
 * allows for a 16 KiB block, then two mallocs of 16 KiB one after the other.
 * The first is counted (and left to glibc's heap), the second is not counted
 * and the engine takes it: the test reads allocs_left_to_heap. */
static int fragmented(void) {
    enum { SMALL = 100000, SMALL_BIG = 16 << 10 };
    static char *small[SMALL];
    for (int i = 0; i < SMALL; i++) {
        small[i] = malloc(100 + (i % 7) * 200);
        CHECK(small[i] != NULL);
    }
    for (int i = 0; i < SMALL; i += 2)
        free(small[i]);
    uint64_t sum = 0;
    for (int k = 0; k < 2; k++) {
        unsigned char *b = malloc(SMALL_BIG);
        CHECK(b != NULL);
        for (size_t i = 0; i < SMALL_BIG; i += 64) {
            b[i] = (unsigned char)(i / 64 + k);
            sum += b[i];
        }
        free(b);
    }
    printf("fragmented %llu\n", (unsigned long long)sum);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "fragmented") == 0)
        return fragmented();
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
