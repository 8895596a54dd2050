/* A program that forbids itself system calls the engine relies on, with a
 * seccomp filter installed before its first large allocation (as sandboxes
 * and container runtimes do): `seccomp memfd`, `seccomp uffd` or
 * `seccomp both` make memfd_create, userfaultfd (or both) fail with EPERM.
 * Then it copies, zeroes and duplicates large blocks and checks every byte.
 * Its output must be the same plain and preloaded; the engine reports the
 * fallback it took. */
#include "common.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define PAGES 128

static void forbid(int nr1, int nr2) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr1, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr2, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0);
    CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    int memfd = strcmp(argv[1], "memfd") == 0 || strcmp(argv[1], "both") == 0;
    int uffd = strcmp(argv[1], "uffd") == 0 || strcmp(argv[1], "both") == 0;
    forbid(memfd ? SYS_memfd_create : -1, uffd ? SYS_userfaultfd : -1);
    uint64_t h = 0;
    for (unsigned round = 0; round < 6; round++) {
        struct blk a = blk_new(PAGES), b = blk_new(PAGES), c = blk_new(PAGES), z = blk_new(PAGES);
        fill(a.p, PAGES, round);
        memcpy(b.p, a.p, PAGES * PG);   /* a copy */
        fill(c.p, PAGES, round);        /* a duplicate written separately */
        memset(z.p, 0, PAGES * PG);     /* zero pages */
        pf_scan();
        b.p[PG + 1] ^= 0x40;
        CHECK(is_pat(a.p, PAGES, round) && is_pat(c.p, PAGES, round) && is_zero(z.p, PAGES * PG));
        b.p[PG + 1] ^= 0x40;
        CHECK(is_pat(b.p, PAGES, round));
        h = h * 31 + fnv(b.p, PAGES * PG) + fnv(c.p, PAGES * PG);
        blk_free(&a);
        blk_free(&b);
        blk_free(&c);
        blk_free(&z);
    }
    printf("checksum %016llx\n", (unsigned long long)h);
    return 0;
}
