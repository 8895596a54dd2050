/* A buffer registered with io_uring (fixed buffers: the kernel pins its
 * pages until they are unregistered) and read into with IORING_OP_READ_FIXED
 * after the engine has had time to scan it: every byte the kernel reads
 * into it must be what the program then sees. The buffer starts with zero
 * pages and duplicate pages, the engine's favourite prey; were it to fold or
 * merge them after the registration, the kernel would fill the old, pinned
 * pages and the program would read the folded or merged ones. */
#include "common.h"
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGES 1024
#define CHUNK (64 * PG)

static unsigned char file_byte(size_t off) { return (unsigned char)(off * 2654435761u >> 13); }

int main(void) {
    struct blk b = blk_new(PAGES);
    for (size_t k = 0; k < PAGES; k++) {
        unsigned char *p = b.p + k * PG;
        switch (k % 4) {
        case 0: memset(p, 0, PG); break;                 /* zero page */
        case 1: case 2: memset(p, 1 + k % 8, PG); break; /* duplicates */
        default: for (size_t i = 0; i < PG; i++) p[i] = (unsigned char)(k * 31 + i);
        }
    }
    struct io_uring ring;
    CHECK(io_uring_queue_init(8, &ring, 0) == 0);
    struct iovec iov = { .iov_base = b.p, .iov_len = PAGES * PG };
    CHECK(io_uring_register_buffers(&ring, &iov, 1) == 0);

    /* Scans come and go (and with the preload's pin age, pages wait it). */
    for (int i = 0; i < 25; i++) {
        pf_scan();
        usleep(20000);
    }

    char path[] = "/tmp/pagefold-uring-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    static unsigned char chunk[CHUNK];
    for (size_t off = 0; off < PAGES * PG; off += CHUNK) {
        for (size_t i = 0; i < CHUNK; i++) chunk[i] = file_byte(off + i);
        CHECK(pwrite(fd, chunk, CHUNK, off) == CHUNK);
    }
    for (size_t off = 0; off < PAGES * PG; off += CHUNK) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        CHECK(sqe);
        io_uring_prep_read_fixed(sqe, fd, b.p + off, CHUNK, off, 0);
        CHECK(io_uring_submit(&ring) == 1);
        struct io_uring_cqe *cqe;
        CHECK(io_uring_wait_cqe(&ring, &cqe) == 0);
        CHECK(cqe->res == CHUNK);
        io_uring_cqe_seen(&ring, cqe);
    }
    size_t wrong = 0;
    for (size_t off = 0; off < PAGES * PG; off += PG)
        for (size_t i = 0; i < PG; i++)
            if (b.p[off + i] != file_byte(off + i)) { wrong++; break; }
    printf("pages read with READ_FIXED: %d, pages not as read: %zu\n", PAGES, wrong);
    CHECK(io_uring_unregister_buffers(&ring) == 0);
    io_uring_queue_exit(&ring);
    close(fd);
    blk_free(&b);
    return wrong != 0;
}
