/* Prints the engine's statistics as the preload's pagefold_stats_json (found
 * with dlsym) gives them, after a copy the engine makes virtual; prints
 * nothing without the preload. */
#include "common.h"

int main(void) {
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "pagefold_stats_json");
    struct blk a = blk_new(64), b = blk_new(64);
    fill(a.p, 64, 1);
    memcpy(b.p, a.p, 64 * PG);
    CHECK(is_pat(b.p, 64, 1));
    if (stats_json) {
        /* The background scan may change a counter between two calls, so
         * one call into a buffer that is large enough. */
        static char buf[1 << 16];
        size_t n = stats_json(buf, sizeof buf);
        CHECK(n > 0 && n < sizeof buf && strlen(buf) == n);
        CHECK(stats_json(NULL, 0) > 0); /* the length alone */
        printf("%s\n", buf);
    }
    blk_free(&a);
    blk_free(&b);
    return 0;
}
