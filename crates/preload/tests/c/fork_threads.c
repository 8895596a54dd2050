/* fork while threads copy large blocks and the scanner runs. Each child
 * checks it sees the data as of the fork (not the parent's later writes),
 * writes into copied blocks, copies and scans in its own right, and exits
 * with a status the parent checks; the parent checks its blocks are
 * untouched by the child's writes. */
#include "common.h"
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#define NP 40
#define THREADS 3
#define FORKS 8

static struct blk src;
static volatile int stop;

/* Copies of the source, written and checked, over and over. */
static void *copier(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    long rounds = 0;
    while (!stop || rounds < 20) {
        struct blk d = blk_new(NP);
        memcpy(d.p, src.p, NP * PG);
        size_t pg = (rounds * 7 + id) % NP;
        d.p[pg * PG + id] ^= 0xff;
        CHECK(d.p[pg * PG + id] == (unsigned char)~pat(pg, id, 1));
        d.p[pg * PG + id] ^= 0xff;
        CHECK(is_pat(d.p, NP, 1));
        memmove(d.p + PG, d.p, (NP - 1) * PG); /* overlapping: plain */
        CHECK(is_pat(d.p, 1, 1) && memcmp(d.p + PG, src.p, (NP - 1) * PG) == 0);
        blk_free(&d);
        rounds++;
    }
    return NULL;
}

/* In the child: `a` as of the fork, then a life of its own. */
static int child(struct blk *a, unsigned seed) {
    sleep_us(2000); /* the parent writes into `a` meanwhile */
    if (!is_pat(a->p, NP, seed)) return 10;
    if (!is_pat(src.p, NP, 1)) return 11;
    fill(a->p, NP, 99); /* writes into a copy shared with the parent */
    struct blk b = blk_new(NP);
    memcpy(b.p, a->p, NP * PG);
    pf_scan();
    if (!is_pat(b.p, NP, 99) || !is_pat(a->p, NP, 99)) return 12;
    return 42;
}

int main(void) {
    src = blk_new(NP);
    fill(src.p, NP, 1);
    pthread_t t[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, copier, (void *)(uintptr_t)i) == 0);
    int statuses = 0;
    for (unsigned f = 0; f < FORKS; f++) {
        struct blk a = blk_new(NP), base = blk_new(NP);
        fill(base.p, NP, 2 + f);
        memcpy(a.p, base.p, NP * PG); /* a and base share frames */
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) _exit(child(&a, 2 + f));
        a.p[3 * PG] ^= 1; /* the child must not see this */
        int st;
        CHECK(waitpid(pid, &st, 0) == pid);
        CHECK(WIFEXITED(st));
        statuses += WEXITSTATUS(st);
        a.p[3 * PG] ^= 1;
        CHECK(is_pat(a.p, NP, 2 + f) && is_pat(base.p, NP, 2 + f));
        blk_free(&a);
        blk_free(&base);
    }
    stop = 1;
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(is_pat(src.p, NP, 1));
    if (preloaded()) CHECK(pf_stat("pages_shared_by_copy") >= (FORKS + 20 * THREADS) * NP && pf_stat("scans") > 0);
    printf("children: %d\n", statuses);
    return 0;
}
