/* Memory freed into glibc's heap below a chunk still in use stays resident:
 * free() gives back only the top of a heap. Preloaded, while memory is short
 * the engine has glibc trim its heap (malloc_trim) and those pages go back.
 * The program frees 96 MiB of small chunks below one it keeps and, when
 * preloaded with the argument "drop", waits up to 5 s for its resident
 * memory to drop by 64 MiB (else it waits 1 s); then it allocates the
 * chunks again and checks every byte. It prints the same either way. */
#include "common.h"
#include <unistd.h>

#define N 24000
#define SZ 4000

static long resident_pages(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f);
    long size, res;
    CHECK(fscanf(f, "%ld %ld", &size, &res) == 2);
    fclose(f);
    return res;
}

int main(int argc, char **argv) {
    /* Large enough to start the engine when preloaded. */
    unsigned char *big = malloc(1 << 20);
    CHECK(big);
    memset(big, 7, 1 << 20);
    static unsigned char *chunks[N];
    for (int i = 0; i < N; i++) {
        chunks[i] = malloc(SZ);
        CHECK(chunks[i]);
        memset(chunks[i], i & 0xff, SZ);
    }
    /* Above them all: the heap's top cannot shrink past it. */
    unsigned char *keep = malloc(SZ);
    CHECK(keep);
    memset(keep, 1, SZ);
    for (int i = 0; i < N; i++) free(chunks[i]);

    if (preloaded() && argc > 1 && strcmp(argv[1], "drop") == 0) {
        long before = resident_pages(), dropped = 0;
        for (int t = 0; t < 50 && dropped < 64 * 256; t++) {
            usleep(100000);
            dropped = before - resident_pages();
        }
        CHECK(dropped >= 64 * 256);
        CHECK(pf_stat("clock.reliefs_released") >= 1);
    } else if (preloaded()) {
        sleep(1);
    }

    uint64_t sum = 0;
    for (int i = 0; i < N; i++) {
        chunks[i] = malloc(SZ);
        CHECK(chunks[i]);
        memset(chunks[i], (i * 3) & 0xff, SZ);
    }
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < SZ; k++) CHECK(chunks[i][k] == ((i * 3) & 0xff));
        sum += chunks[i][i % SZ];
        free(chunks[i]);
    }
    for (int k = 0; k < SZ; k++) CHECK(keep[k] == 1);
    for (int k = 0; k < 1 << 20; k++) CHECK(big[k] == 7);
    free(keep);
    free(big);
    printf("heap reused, checksum %llu\n", (unsigned long long)sum);
    return 0;
}
