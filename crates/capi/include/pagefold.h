/*
 * pagefold.h - C API of the pagefold engine (libpagefold.so / libpagefold.a).
 *
 * The engine hands out page-aligned blocks whose pages it can share: a copy of
 * whole pages between blocks (pf_copy) becomes a copy-on-write view instead of
 * new memory, and a scan (pf_scan, or a background scanner) folds all-zero
 * pages and merges identical pages, always comparing bytes before a merge.
 * Every byte read is what plain memory would have given. Pages are shared only
 * inside one process.
 *
 * Rules:
 *  - A NULL, freed or foreign pf_engine* is an error, never a crash: functions
 *    return -1 / NULL / 0 and set errno to EINVAL.
 *  - Functions are thread-safe; pf_engine_free may race with other calls.
 *  - The engine never fails because a kernel feature is missing (memfd,
 *    userfaultfd, mappings): it degrades to plain memory and counts it in
 *    pf_stats.fallbacks.
 *  - Link: -lpagefold (shared), or libpagefold.a plus -lpthread -ldl -lm.
 *
 * Written by hand; crates/capi's tests check it against src/lib.rs (every
 * exported function declared, every struct size and offset equal).
 */
#ifndef PAGEFOLD_H
#define PAGEFOLD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque engine handle. */
typedef struct pf_engine pf_engine;

/* pf_alloc flag: every page will be written at once (e.g. the result of a
 * computation); the block is populated now instead of one fault per page. */
#define PF_ALLOC_FULL_WRITE 1

/* Engine configuration. Switches: 0 = off, anything else = on. */
typedef struct pf_config {
    int frames;               /* serve blocks from memfd frames (off: plain memory) */
    int copy;                 /* pf_copy makes copy-on-write views of whole pages */
    int zero;                 /* scans fold all-zero pages */
    int merge;                /* scans merge identical pages */
    size_t vma_budget;        /* most mappings the engine's blocks may use; 0: half of what
                                 vm.max_map_count leaves after the reserve, at least 30000 */
    size_t vma_reserve;       /* mappings left free below vm.max_map_count */
    size_t scan_chunk_pages;  /* pages write-protected per scan step (> 0) */
    uint64_t scan_interval_ms;/* background scan period; 0 = on demand only */
    double scan_cpu_budget;   /* fraction of a core for background scans, (0, 1] */
    /* Fault injection, for tests: force the engine's fallbacks. */
    int inject_fail_memfd;
    int inject_fail_uffd;
    int64_t inject_fail_mmap_after;  /* every mmap after this many fails; < 0 = never */
    uint64_t inject_max_map_count;   /* pretend vm.max_map_count; 0 = the real one */
    int volatile_check;       /* fold/merge only pages the previous scan saw unchanged */
    uint64_t pin_grace_us;    /* wait before acting on a chunk, for writes through pinned pages */
} pf_config;

/* What one scan did. */
typedef struct pf_scan_report {
    uint64_t pages_scanned;
    uint64_t zero_folded;
    uint64_t merged;
    uint64_t diverged_released;
    uint64_t skipped_vma;     /* merges/folds skipped: VMA budget spent */
    uint64_t wall_ns;
    uint64_t cpu_ns;
    uint64_t changed_while_planned; /* planned folds/merges dropped: page changed during the pin grace */
    uint64_t volatile_pages;  /* pages left alone: changed since the previous scan */
} pf_scan_report;

/* Why the engine took a plainer path than it wanted (counts). */
typedef struct pf_fallbacks {
    uint64_t memfd;
    uint64_t mmap;
    uint64_t vma_budget;
    uint64_t uffd;
    uint64_t frames;
} pf_fallbacks;

/* Engine statistics: gauges describe now, totals count since the start.
 * Like POSIX's struct stat and stat(), the type is only `struct pf_stats`
 * (no typedef): the name pf_stats is the function. */
struct pf_stats {
    uint64_t blocks;              /* live blocks */
    uint64_t block_bytes;         /* their total length */
    uint64_t frames_in_use;       /* frames referenced by some page */
    uint64_t frames_resident;     /* frames whose content is in memory */
    uint64_t pages_sharing;       /* pages mapping a frame another page maps too */
    uint64_t pages_shared_by_copy;/* total pages made copy-on-write views by pf_copy */
    uint64_t bytes_copied_plain;  /* total bytes pf_copy copied plainly */
    uint64_t zero_folded;         /* total all-zero pages freed */
    uint64_t merged;              /* total pages merged onto an identical frame */
    uint64_t diverged_released;   /* total frames released after every user diverged */
    uint64_t scans;
    uint64_t scan_cpu_ns;
    pf_fallbacks fallbacks;
    uint64_t vmas_used;           /* mappings the blocks use now */
    uint64_t metadata_bytes;      /* the engine's own bookkeeping */
    int protected_scan;           /* 1: scans can write-protect (userfaultfd) */
    int frames_active;            /* 1: blocks come from memfd frames */
};

/* Fills *out with the defaults (environment ignored). 0, or -1 if out is NULL. */
int pf_config_default(pf_config *out);

/* A new engine configured from PAGEFOLD_* environment variables
 * (PAGEFOLD_FRAMES, _COPY, _ZERO, _MERGE, _VMA_BUDGET, _VMA_RESERVE,
 * _SCAN_CHUNK, _SCAN_INTERVAL_MS, _SCAN_CPU). NULL only on an internal error. */
pf_engine *pf_engine_new(void);

/* A new engine with this configuration; NULL (errno EINVAL) if cfg is NULL or
 * out of range. A nonzero scan_interval_ms starts the background scanner. */
pf_engine *pf_engine_new_with(const pf_config *cfg);

/* Stops the background scanner and releases the engine. NULL or an already
 * freed handle is ignored. Blocks not freed before stay mapped, keep their
 * contents and stay usable, but are leaked: nothing can free or scan them any
 * more, and their memory returns at process exit. Free blocks first. */
void pf_engine_free(pf_engine *e);

/* A zero-filled, page-aligned block of at least len bytes (len 0: one page).
 * flags: 0 or PF_ALLOC_FULL_WRITE. NULL with errno EINVAL (bad handle,
 * unknown flag) or ENOMEM (no memory at all, not even plain). */
void *pf_alloc(pf_engine *e, size_t len, int flags);

/* Frees a block by its start address: 0, or -1 if ptr is not the start of one
 * of this engine's blocks (then nothing happens). */
int pf_free(pf_engine *e, void *ptr);

/* 1 if ptr lies inside one of this engine's blocks, else 0. */
int pf_owns(pf_engine *e, const void *ptr);

/* Length of the block starting at ptr (whole pages), or 0 if none starts there. */
size_t pf_block_len(pf_engine *e, const void *ptr);

/* memmove(dst, src, len), sharing whole pages between engine blocks at equal
 * page offsets copy-on-write. Any memory may be passed; non-engine memory is
 * copied plainly. With a NULL/invalid handle: a plain memmove. With NULL dst or
 * src: nothing happens. */
void pf_copy(pf_engine *e, void *dst, const void *src, size_t len);

/* Folds zero pages and merges identical ones now. 0 (and *out filled unless
 * out is NULL), or -1 on a bad handle. */
int pf_scan(pf_engine *e, pf_scan_report *out);

/* Scans every interval_ms in a background thread, within scan_cpu_budget.
 * 0 (also if already running), or -1 on a bad handle or interval_ms == 0. */
int pf_start_background(pf_engine *e, unsigned interval_ms);

/* Stops the background scanner and waits for it; no-op if none runs. */
void pf_stop_background(pf_engine *e);

/* Fills *out with the statistics: 0, or -1 on a bad handle or NULL out. */
int pf_stats(pf_engine *e, struct pf_stats *out);

/* The statistics as one JSON object, its "schema" field
 * "pagefold-engine-stats/1", like snprintf: writes at most cap bytes
 * including the terminating NUL and returns the full length without the NUL
 * (>= cap: truncated). buf may be NULL if cap is 0. 0 on a bad handle. */
size_t pf_stats_json(pf_engine *e, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* PAGEFOLD_H */
