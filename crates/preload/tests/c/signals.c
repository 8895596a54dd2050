/* A program with its own SIGSEGV and SIGBUS handlers, a timer signal whose
 * handler writes into a large block, and a thread that blocks every signal,
 * all while copies and scans happen:
 * - a write barrier as garbage collectors build it: the "heap" (a large
 *   malloc block holding a copy, with duplicate pages the scanner wants to
 *   merge) is made read-only; each first write to a page faults, the SIGSEGV
 *   handler records the page and unprotects it. Every write must fault
 *   exactly once: had the engine remapped the block, the protection would
 *   be gone and writes would slip past the barrier;
 * - the heap made PROT_NONE while scans run: scanning it would kill us;
 * - a deliberate SIGBUS (a file mapping past its end) reaches our handler;
 *   any fault our handlers did not expect ends the program.
 * Output must be the same with and without the preload. */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

#define NB 48
#define ROUNDS 16

static struct blk heap, alarm_blk;
static volatile sig_atomic_t dirty[NB];
static volatile sig_atomic_t faults;
static sigjmp_buf bus_jmp;
static volatile unsigned char *bus_addr;
static volatile uint64_t alarms;

static void die(const char *m) { write(2, m, strlen(m)); _exit(3); }

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr, h = (uintptr_t)heap.p;
    if (a < h || a >= h + NB * PG) die("unexpected SIGSEGV (not the heap)\n");
    size_t pg = (a - h) / PG;
    if (dirty[pg]) die("SIGSEGV twice on one page: the barrier's unprotect did not hold\n");
    dirty[pg] = 1;
    faults++;
    if (mprotect(heap.p + pg * PG, PG, PROT_READ | PROT_WRITE) != 0) die("mprotect in handler\n");
}

static void on_bus(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    if ((volatile unsigned char *)si->si_addr != bus_addr) die("unexpected SIGBUS\n");
    siglongjmp(bus_jmp, 1);
}

/* Writes into a large block from a signal handler, perhaps while the
 * scanner has it write-protected. */
static void on_alarm(int sig) {
    (void)sig;
    uint64_t n = alarms + 1;
    ((volatile uint64_t *)alarm_blk.p)[n % (PG / 8)] = n;
    alarms = n;
}

static void handle(int sig, void (*f)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = f;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(sig, &sa, NULL) == 0);
}

/* Pages repeat every 4: duplicates for the scanner to merge. */
static void fill_dup(unsigned char *p, size_t pages, unsigned seed) {
    for (size_t pg = 0; pg < pages; pg++)
        for (size_t i = 0; i < PG; i++) p[pg * PG + i] = pat(pg % 4, i, seed);
}

static int is_dup(const unsigned char *p, size_t pages, unsigned seed) {
    for (size_t pg = 0; pg < pages; pg++)
        for (size_t i = 0; i < PG; i++) if (p[pg * PG + i] != pat(pg % 4, i, seed)) return 0;
    return 1;
}

static int sigbus_reaches_handler(void) {
    char path[] = "/tmp/pagefold-sigbus-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && ftruncate(fd, PG) == 0);
    unlink(path);
    unsigned char *m = mmap(NULL, 2 * PG, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    bus_addr = m + PG;
    int caught = 0;
    if (sigsetjmp(bus_jmp, 1) == 0) (void)*bus_addr;
    else caught = 1;
    munmap(m, 2 * PG);
    close(fd);
    return caught;
}

/* A thread with every signal blocked copies and writes large blocks the
 * scanner protects now and then: it must wait in the kernel, never need a signal. */
static void *blocked_thread(void *arg) {
    struct blk *src = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uint64_t sum = 0;
    for (int r = 0; r < 60; r++) {
        struct blk d = blk_new(NB);
        memcpy(d.p, src->p, NB * PG);
        d.p[(r % NB) * PG + 5] ^= 0x5a;
        CHECK(d.p[(r % NB) * PG + 5] == (pat(r % NB % 4, 5, 1) ^ 0x5a));
        d.p[(r % NB) * PG + 5] ^= 0x5a;
        CHECK(is_dup(d.p, NB, 1));
        sum += fnv(d.p, NB * PG);
        blk_free(&d);
        sleep_us(300);
    }
    return (void *)(uintptr_t)(sum != 0);
}

/* One round of the write barrier; returns the faults it took. */
static int barrier_round(int r, struct blk *scratch) {
    CHECK(mprotect(heap.p, NB * PG, PROT_READ) == 0);
    memset((void *)dirty, 0, sizeof dirty);
    int before = faults;
    memcpy(scratch->p, heap.p, NB * PG); /* reading a protected heap is fine */
    CHECK(is_dup(scratch->p, NB, 1));
    wait_scans(1);
    int want = 0;
    for (int pg = 0; pg < NB; pg++) {
        if ((pg * 7 + r) % 5) continue;
        volatile unsigned char *b = heap.p + pg * PG + 100;
        *b ^= 0xff; /* faults once */
        *b ^= 0xff; /* does not */
        want++;
        CHECK(dirty[pg]);
    }
    CHECK(faults - before == want);
    CHECK(mprotect(heap.p, NB * PG, PROT_READ | PROT_WRITE) == 0);
    /* Unreachable for a while: no scan may read it. */
    CHECK(mprotect(heap.p, NB * PG, PROT_NONE) == 0);
    wait_scans(2);
    pf_scan();
    CHECK(mprotect(heap.p, NB * PG, PROT_READ | PROT_WRITE) == 0);
    CHECK(is_dup(heap.p, NB, 1));
    return want;
}

int main(void) {
    handle(SIGSEGV, on_segv);
    handle(SIGBUS, on_bus);
    printf("sigbus caught: %d\n", sigbus_reaches_handler());

    struct blk src = blk_new(NB), scratch = blk_new(NB);
    fill_dup(src.p, NB, 1);
    heap = blk_new(NB);
    memcpy(heap.p, src.p, NB * PG); /* a virtual copy with the preload */
    alarm_blk = blk_new(4);

    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 300}, {0, 300}};
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, blocked_thread, &src) == 0);

    uint64_t shared0 = pf_stat("pages_shared_by_copy");
    int total = 0;
    for (int r = 0; r < ROUNDS; r++) {
        total += barrier_round(r, &scratch);
        struct blk c = blk_new(NB); /* copies of the protected-then-released heap */
        memcpy(c.p, heap.p, NB * PG);
        CHECK(is_dup(c.p, NB, 1));
        blk_free(&c);
    }
    void *ok;
    CHECK(pthread_join(t, &ok) == 0 && ok);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    uint64_t n = alarms;
    CHECK(n > 0 && ((volatile uint64_t *)alarm_blk.p)[n % (PG / 8)] == n);
    CHECK(is_dup(src.p, NB, 1));

    if (preloaded()) {
        CHECK(pf_stat("exempted") >= 1); /* the heap, at its first mprotect */
        CHECK(pf_stat("pages_shared_by_copy") > shared0);
        CHECK(pf_stat("scans") >= 3 * ROUNDS);
        /* Without userfaultfd (a fallback the test forces) scans fold nothing. */
        CHECK(pf_stat("merged") + pf_stat("zero_folded") > 0 || pf_stat("protected_scan") == 0);
    }
    printf("barrier faults: %d\n", total);
    printf("done\n");
    return 0;
}
