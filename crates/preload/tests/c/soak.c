/* A mixed soak with a shadow check: for SECONDS (argv[1], default 10)
 * THREADS threads (argv[2], default 3) each keep blocks of 1 to 4 MiB, big
 * enough for the engine under its default threshold, and a shadow of every
 * page: which pattern page (or zero) it must hold. They allocate, free, copy
 * whole pages between blocks (virtual copies), write pages (duplicates and
 * zeros, for folding and merging), let the kernel write into them (pread,
 * process_vm_writev) and read from them (write to a pipe), discard pages
 * (MADV_DONTNEED), and check pages against the shadow all along. Thread 0
 * forks now and then: the child checks its copy of thread 0's blocks, writes
 * and checks them again, then execs /bin/true (which loads the preload
 * afresh). A 200 Hz timer signal writes a counter into a block of its own.
 * Any byte that differs from the shadow is a mismatch: reported on stderr,
 * exit 1. stdout says only "soak: ok", so plain and preloaded runs compare. */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXBLK 6
#define LIB_PAGES 64
#define FILE_PAGES 16
#define FILE_SEED 77

/* What a page must hold: pattern page `pg` of `seed`, or zero if seed is 0. */
struct want { uint32_t pg, seed; };

struct sblk { unsigned char *p; size_t n; struct want *w; };

struct worker {
    unsigned id;
    uint64_t rng;
    struct sblk b[MAXBLK];
    uint64_t ops, checks;
};

static struct blk lib;   /* read-only source of copies, pattern seed 5 */
static int file_fd;      /* FILE_PAGES pattern pages of FILE_SEED */
static volatile int stop;
static volatile sig_atomic_t signals;
static struct blk sigblk; /* the signal handler's counter page */

static uint64_t rnd(struct worker *w) {
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static size_t below(struct worker *w, size_t n) { return (size_t)(rnd(w) % n); }

static void set_page(unsigned char *p, struct want w) {
    if (w.seed == 0) memset(p, 0, PG);
    else for (size_t i = 0; i < PG; i++) p[i] = pat(w.pg, i, w.seed);
}

static void mismatch(const char *what, unsigned id, const struct sblk *b, size_t pg, size_t i) {
    fprintf(stderr, "soak: mismatch after %s, thread %u, block %p page %zu byte %zu: %#04x, want %#04x\n",
            what, id, (void *)b->p, pg, i, b->p[pg * PG + i],
            b->w[pg].seed ? pat(b->w[pg].pg, i, b->w[pg].seed) : 0);
    exit(1);
}

static void check_page(struct worker *w, const struct sblk *b, size_t pg, const char *what) {
    const unsigned char *p = b->p + pg * PG;
    struct want x = b->w[pg];
    for (size_t i = 0; i < PG; i++) {
        unsigned char want = x.seed ? pat(x.pg, i, x.seed) : 0;
        if (p[i] != want) mismatch(what, w->id, b, pg, i);
    }
    w->checks++;
}

static void check_block(struct worker *w, const struct sblk *b, const char *what) {
    for (size_t pg = 0; pg < b->n; pg++) check_page(w, b, pg, what);
}

/* Page-aligned memory of n pages from malloc (the preload serves it above
 * its threshold; glibc's mmapped chunks are 16 bytes into a page). */
static void blk_alloc(struct worker *w, struct sblk *b) {
    b->n = 256 + below(w, 768);
    b->p = aligned_alloc(PG, b->n * PG);
    CHECK(b->p);
    b->w = calloc(b->n, sizeof *b->w);
    CHECK(b->w);
    for (size_t pg = 0; pg < b->n; pg++) {
        /* A few contents, many duplicates; a third zero. */
        struct want x = {(uint32_t)below(w, 4), below(w, 3) ? 1 + (uint32_t)below(w, 3) : 0};
        b->w[pg] = x;
        set_page(b->p + pg * PG, x);
    }
}

static void blk_drop(struct sblk *b) {
    free(b->p);
    free(b->w);
    b->p = NULL;
}

static struct sblk *pick(struct worker *w) {
    for (int tries = 0; tries < 2 * MAXBLK; tries++) {
        struct sblk *b = &w->b[below(w, MAXBLK)];
        if (b->p) return b;
    }
    return NULL;
}

/* Copies whole pages from one block (or the library) into another. */
static void op_copy(struct worker *w) {
    struct sblk *d = pick(w), *s = pick(w);
    if (!d) return;
    size_t n = 1 + below(w, 64);
    if (n > d->n) n = d->n;
    size_t dp = below(w, d->n - n + 1);
    if (!s || s == d || below(w, 4) == 0) {
        if (n > LIB_PAGES) n = LIB_PAGES;
        size_t sp = below(w, LIB_PAGES - n + 1);
        memcpy(d->p + dp * PG, lib.p + sp * PG, n * PG);
        for (size_t k = 0; k < n; k++) d->w[dp + k] = (struct want){(uint32_t)(sp + k), 5};
        return;
    }
    if (n > s->n) n = s->n;
    size_t sp = below(w, s->n - n + 1);
    if (dp + n > d->n) return;
    memcpy(d->p + dp * PG, s->p + sp * PG, n * PG);
    memcpy(&d->w[dp], &s->w[sp], n * sizeof *d->w);
}

static void op_write(struct worker *w) {
    struct sblk *b = pick(w);
    if (!b) return;
    size_t pg = below(w, b->n);
    struct want x = {(uint32_t)below(w, 4), below(w, 3) ? 1 + (uint32_t)below(w, 3) : 0};
    b->w[pg] = x;
    set_page(b->p + pg * PG, x);
}

/* The kernel writes into the pages: pread from the pattern file, or
 * process_vm_writev from the library block. */
static void op_kernel_write(struct worker *w) {
    struct sblk *b = pick(w);
    if (!b) return;
    size_t pg = below(w, b->n);
    if (below(w, 2)) {
        size_t fp = below(w, FILE_PAGES);
        CHECK(pread(file_fd, b->p + pg * PG, PG, (off_t)(fp * PG)) == PG);
        b->w[pg] = (struct want){(uint32_t)fp, FILE_SEED};
    } else {
        size_t lp = below(w, LIB_PAGES);
        struct iovec l = {lib.p + lp * PG, PG}, r = {b->p + pg * PG, PG};
        CHECK(process_vm_writev(getpid(), &l, 1, &r, 1, 0) == PG);
        b->w[pg] = (struct want){(uint32_t)lp, 5};
    }
}

/* The kernel reads the pages: through a pipe, checked on the way out. */
static void op_kernel_read(struct worker *w) {
    struct sblk *b = pick(w);
    if (!b) return;
    size_t pg = below(w, b->n);
    int fds[2];
    CHECK(pipe(fds) == 0);
    CHECK(write(fds[1], b->p + pg * PG, PG) == PG);
    unsigned char buf[PG];
    CHECK(read(fds[0], buf, PG) == PG);
    close(fds[0]);
    close(fds[1]);
    struct want x = b->w[pg];
    for (size_t i = 0; i < PG; i++)
        if (buf[i] != (x.seed ? pat(x.pg, i, x.seed) : 0)) {
            fprintf(stderr, "soak: write(2) from thread %u block %p page %zu byte %zu: %#04x\n",
                    w->id, (void *)b->p, pg, i, buf[i]);
            exit(1);
        }
}

static void op_discard(struct worker *w) {
    struct sblk *b = pick(w);
    if (!b) return;
    size_t pg = below(w, b->n), n = 1 + below(w, 8);
    if (pg + n > b->n) n = b->n - pg;
    CHECK(madvise(b->p + pg * PG, n * PG, MADV_DONTNEED) == 0);
    for (size_t k = 0; k < n; k++) b->w[pg + k] = (struct want){0, 0};
}

/* Thread 0: a child checks the blocks as of the fork, writes, checks, execs. */
static void op_fork(struct worker *w) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < MAXBLK; i++)
            if (w->b[i].p) check_block(w, &w->b[i], "fork (child)");
        for (int k = 0; k < 200; k++) op_write(w);
        for (int k = 0; k < 20; k++) op_copy(w);
        for (int i = 0; i < MAXBLK; i++)
            if (w->b[i].p) check_block(w, &w->b[i], "writes in the child");
        execl("/bin/true", "true", (char *)NULL);
        _exit(3);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) CHECK(errno == EINTR);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "soak: child failed (status %#x)\n", st);
        exit(1);
    }
    for (int i = 0; i < MAXBLK; i++)
        if (w->b[i].p) check_block(w, &w->b[i], "fork (parent)");
}

static void *work(void *arg) {
    struct worker *w = arg;
    time_t last_fork = time(NULL);
    while (!stop) {
        struct sblk *slot = &w->b[below(w, MAXBLK)];
        unsigned op = (unsigned)below(w, 100);
        if (!slot->p) blk_alloc(w, slot);
        else if (op < 2) { check_block(w, slot, "before free"); blk_drop(slot); }
        else if (op < 22) op_copy(w);
        else if (op < 52) op_write(w);
        else if (op < 62) op_kernel_write(w);
        else if (op < 72) op_kernel_read(w);
        else if (op < 76) op_discard(w);
        else {
            struct sblk *b = pick(w);
            if (b) check_page(w, b, below(w, b->n), "a while");
        }
        if (w->id == 0 && time(NULL) - last_fork >= 2) {
            op_fork(w);
            last_fork = time(NULL);
        }
        w->ops++;
    }
    for (int i = 0; i < MAXBLK; i++)
        if (w->b[i].p) { check_block(w, &w->b[i], "the end"); blk_drop(&w->b[i]); }
    return NULL;
}

static void on_alarm(int sig) {
    (void)sig;
    signals++;
    uint64_t v = (uint64_t)signals;
    memcpy(sigblk.p + (v % 256) * PG, &v, sizeof v);
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 10;
    int nthreads = argc > 2 ? atoi(argv[2]) : 3;
    CHECK(seconds > 0 && nthreads > 0 && nthreads <= 16);
    lib = blk_new(LIB_PAGES);
    fill(lib.p, LIB_PAGES, 5);
    sigblk = blk_new(256);
    memset(sigblk.p, 0, 256 * PG);
    char path[] = "/tmp/pagefold-soak-XXXXXX";
    file_fd = mkstemp(path);
    CHECK(file_fd >= 0);
    unlink(path);
    unsigned char page[PG];
    for (size_t fp = 0; fp < FILE_PAGES; fp++) {
        for (size_t i = 0; i < PG; i++) page[i] = pat(fp, i, FILE_SEED);
        CHECK(pwrite(file_fd, page, PG, (off_t)(fp * PG)) == PG);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval it = {{0, 5000}, {0, 5000}};
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    struct worker ws[16];
    pthread_t t[16];
    for (int i = 0; i < nthreads; i++) {
        memset(&ws[i], 0, sizeof ws[i]);
        ws[i].id = (unsigned)i;
        ws[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) ^ (uint64_t)time(NULL);
        CHECK(pthread_create(&t[i], NULL, work, &ws[i]) == 0);
    }
    for (int s = 0; s < seconds; s++) sleep_us(1000000);
    stop = 1;
    uint64_t ops = 0, checks = 0;
    for (int i = 0; i < nthreads; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        ops += ws[i].ops;
        checks += ws[i].checks;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    CHECK(setitimer(ITIMER_REAL, &off, NULL) == 0);
    uint64_t last = (uint64_t)signals, got;
    memcpy(&got, sigblk.p + (last % 256) * PG, sizeof got);
    CHECK(got == last);
    CHECK(is_pat(lib.p, LIB_PAGES, 5));
    fprintf(stderr, "soak: %d s, %d threads, %llu operations, %llu page checks, %llu signals, 0 mismatches\n",
            seconds, nthreads, (unsigned long long)ops, (unsigned long long)checks,
            (unsigned long long)last);
    printf("soak: ok\n");
    return 0;
}
