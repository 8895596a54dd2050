/* A program under a resource limit it set itself, before its first large
 * allocation: `limits nofile N` (RLIMIT_NOFILE soft and hard N) or
 * `limits as MIB` (RLIMIT_AS). It copies and zeroes large blocks, checks
 * every byte, then uses up the limited resource (descriptors until EMFILE,
 * 1 MiB blocks until malloc fails) and prints how far it got. Plain and
 * preloaded runs must print the same: the engine must neither take what the
 * program needs nor fail it where plain memory would not. */
#include "common.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#define PAGES 256

static uint64_t work(unsigned seed) {
    struct blk a = blk_new(PAGES), b = blk_new(PAGES);
    fill(a.p, PAGES, seed);
    memcpy(b.p, a.p, PAGES * PG);
    b.p[7] ^= 1;
    CHECK(is_pat(a.p, PAGES, seed));
    b.p[7] ^= 1;
    CHECK(is_pat(b.p, PAGES, seed));
    uint64_t h = fnv(b.p, PAGES * PG);
    blk_free(&a);
    blk_free(&b);
    return h;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    long n = atol(argv[2]);
    int nofile = strcmp(argv[1], "nofile") == 0;
    struct rlimit r = {(rlim_t)n, (rlim_t)n};
    if (!nofile) r.rlim_cur = r.rlim_max = (rlim_t)n << 20;
    CHECK(setrlimit(nofile ? RLIMIT_NOFILE : RLIMIT_AS, &r) == 0);
    uint64_t h = 0;
    for (unsigned i = 0; i < 8; i++) h = h * 31 + work(i);
    if (nofile) {
        int got = 0;
        while (open("/dev/null", O_RDONLY) >= 0) got++;
        CHECK(errno == EMFILE);
        printf("descriptors opened until EMFILE: %d\n", got);
    } else {
        /* Until malloc fails, at most the limit's worth. */
        static unsigned char *held[1 << 16];
        long mib = 0;
        while (mib < n && (held[mib] = malloc(1 << 20)) != NULL) {
            held[mib][0] = 1;
            mib++;
        }
        CHECK(mib < n && errno == ENOMEM);
        printf("1 MiB blocks allocated until ENOMEM: %ld\n", mib);
        while (mib > 0) free(held[--mib]);
        h = h * 31 + work(99);
    }
    printf("checksum %016llx\n", (unsigned long long)h);
    return 0;
}
