/* Built against an installed pagefold with only pkg-config's flags: a copy
 * of whole pages between two engine blocks becomes a copy-on-write view. */
#include <pagefold.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    pf_engine *e = pf_engine_new();
    size_t len = 64 * 4096;
    unsigned char *a = pf_alloc(e, len, 0), *b = pf_alloc(e, len, 0);
    if (!e || !a || !b) return 1;
    for (size_t i = 0; i < len; i++) a[i] = (unsigned char)(i * 7 + 1);
    pf_copy(e, b, a, len);
    struct pf_stats st;
    if (pf_stats(e, &st) != 0) return 1;
    printf("copy shared: %s, bytes equal: %s\n", st.pages_shared_by_copy == 64 ? "yes" : "no",
           memcmp(a, b, len) == 0 ? "yes" : "no");
    pf_free(e, a);
    pf_free(e, b);
    pf_engine_free(e);
    return 0;
}
