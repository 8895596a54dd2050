/* The kernel reading and writing large blocks inside system calls while the
 * scanner folds and merges them every millisecond: pread/read from a file,
 * readv, write to a pipe and read from it, send and recv on a socket pair.
 * The blocks hold duplicate and zero pages, and each thread pauses between
 * rounds so that scans merge and fold them before the kernel writes into
 * them again. No call may fail (EFAULT) and no byte may be lost. */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define NP 64
#define ROUNDS 30
#define LEN (NP * PG)

static unsigned char want[LEN];

/* Page k: zero if k % 3 == 0, else one of four patterns: folds and merges. */
static void make_content(unsigned char *p) {
    for (size_t k = 0; k < NP; k++)
        for (size_t i = 0; i < PG; i++) p[k * PG + i] = k % 3 ? pat(k % 4, i, 2) : 0;
}

static void same(const unsigned char *p, const char *what) {
    if (memcmp(p, want, LEN) != 0) {
        size_t i = 0;
        while (p[i] == want[i]) i++;
        fprintf(stderr, "%s: byte %zu differs (%d, want %d)\n", what, i, p[i], want[i]);
        exit(1);
    }
}

static void io_all(ssize_t (*f)(int, void *, size_t), int fd, unsigned char *p, size_t n, const char *what) {
    for (size_t done = 0; done < n;) {
        ssize_t r = f(fd, p + done, n - done);
        if (r <= 0) { fprintf(stderr, "%s: %zd errno %d\n", what, r, errno); exit(1); }
        done += r;
    }
}

static ssize_t wr(int fd, void *p, size_t n) { return write(fd, p, n); }
static ssize_t snd(int fd, void *p, size_t n) { return send(fd, p, n, 0); }
static ssize_t rcv(int fd, void *p, size_t n) { return recv(fd, p, n, 0); }

static int file_fd;

static void *file_reader(void *arg) {
    (void)arg;
    struct blk b = blk_new(NP);
    for (int r = 0; r < ROUNDS; r++) {
        if (r % 2) {
            CHECK(pread(file_fd, b.p, LEN, 0) == LEN);
        } else { /* readv in two halves, the second into a virtual copy's pages */
            struct iovec iov[2] = {{b.p, LEN / 2}, {b.p + LEN / 2, LEN / 2}};
            CHECK(preadv(file_fd, iov, 2, 0) == LEN);
        }
        same(b.p, "pread");
        /* A fresh block read into, copied (virtually), and the copy's shared
         * pages written by the kernel again. */
        struct blk f = blk_new(NP), c = blk_new(NP);
        CHECK(read(file_fd, f.p, LEN) == LEN && lseek(file_fd, 0, SEEK_SET) == 0);
        memcpy(c.p, f.p, LEN);
        CHECK(pread(file_fd, c.p, LEN, 0) == LEN);
        same(c.p, "pread into a copy");
        same(f.p, "read");
        blk_free(&c);
        blk_free(&f);
        wait_scans(2); /* b's pages get merged and folded */
    }
    blk_free(&b);
    return NULL;
}

static int pipe_fds[2], sock_fds[2];

/* Writes from a block the scanner works on; the reader reads into another. */
static void *pipe_writer(void *arg) {
    int fd = *(int *)arg;
    struct blk s = blk_new(NP);
    memcpy(s.p, want, LEN);
    for (int r = 0; r < ROUNDS; r++) {
        io_all(fd == pipe_fds[1] ? wr : snd, fd, s.p, LEN, "write/send");
        sleep_us(1500);
    }
    blk_free(&s);
    return NULL;
}

static void *pipe_reader(void *arg) {
    int fd = *(int *)arg;
    struct blk d = blk_new(NP);
    for (int r = 0; r < ROUNDS; r++) {
        memset(d.p, 0x77, LEN);
        io_all(fd == pipe_fds[0] ? read : rcv, fd, d.p, LEN, "read/recv");
        same(d.p, fd == pipe_fds[0] ? "read from a pipe" : "recv");
    }
    blk_free(&d);
    return NULL;
}

int main(void) {
    make_content(want);
    char path[] = "/tmp/pagefold-io-XXXXXX";
    file_fd = mkstemp(path);
    CHECK(file_fd >= 0);
    unlink(path);
    CHECK(write(file_fd, want, LEN) == LEN && lseek(file_fd, 0, SEEK_SET) == 0);
    CHECK(pipe(pipe_fds) == 0 && socketpair(AF_UNIX, SOCK_STREAM, 0, sock_fds) == 0);

    free(malloc(LEN)); /* the engine starts here, not in a race between threads */
    pthread_t t[5];
    CHECK(pthread_create(&t[0], NULL, file_reader, NULL) == 0);
    CHECK(pthread_create(&t[1], NULL, pipe_writer, &pipe_fds[1]) == 0);
    CHECK(pthread_create(&t[2], NULL, pipe_reader, &pipe_fds[0]) == 0);
    CHECK(pthread_create(&t[3], NULL, pipe_writer, &sock_fds[0]) == 0);
    CHECK(pthread_create(&t[4], NULL, pipe_reader, &sock_fds[1]) == 0);
    for (int i = 0; i < 5; i++) CHECK(pthread_join(t[i], NULL) == 0);
    if (preloaded()) {
        CHECK(pf_stat("scans") >= 2 * ROUNDS);
        /* The kernel wrote into merged and folded pages, and into a copy's:
         * a copy of frames shares them, a copy of anonymous memory is
         * written through into frames first and then shares them (fresh
         * blocks start anonymous under PAGEFOLD_FRESH=anon or adaptive). */
        CHECK(pf_stat("merged") >= NP && pf_stat("zero_folded") >= NP / 3);
        CHECK(pf_stat("pages_shared_by_copy") + pf_stat("pages_copied_through") >= NP);
    }
    printf("done %llx\n", (unsigned long long)fnv(want, LEN));
    return 0;
}
