//! Engine configuration: which mechanisms run, the budgets they run under, and
//! fault injection for the tests that force every fallback path.
//!
//! Everything can be set from the environment (`PAGEFOLD_*`), so the preload
//! and the C ABI share one vocabulary with the Rust API.

use crate::fresh::Fresh;
use std::time::Duration;

/// What the engine may do and how much it may spend doing it.
#[derive(Clone, Debug)]
pub struct Config {
    /// Serve allocations from memfd frames. Off: every block is plain anonymous memory.
    pub frames: bool,
    /// Where a fresh block starts when frames are on: always on frames, always
    /// anonymous, or anonymous unless blocks of its size are often copied (fresh.rs).
    pub fresh: crate::fresh::Fresh,
    /// Where a fresh block the caller asked zeroed (`Hint::Zeroed`, calloc)
    /// starts when frames are on. Anonymous unless blocks of its size are
    /// often copied (default): plain memory answers reads of never-written
    /// pages with the kernel's zero page, where a frame would allocate one.
    pub fresh_zeroed: crate::fresh::Fresh,
    /// With `Fresh::Adaptive`, an allocation smaller than this, of a size
    /// class seldom copied from (fresh.rs, `worth_taking`), is not the
    /// engine's: `Engine::take` declines it and the caller's own allocator
    /// serves it, as it would without the engine (glibc reuses its heap
    /// below its largest mmap threshold, 32 MiB). 0 (default): the engine
    /// takes every allocation.
    pub plain_below: usize,
    /// Below `plain_below`, how many allocations of a size class the engine
    /// takes before copy evidence decides (fresh.rs, `worth_taking`).
    pub take_first: u32,
    /// Which mallocs are left to the caller's own allocator when it holds at
    /// least as many bytes freed (`Engine::take_beside_heap`; placement.rs,
    /// `leave_to_heap`): reusing its freed, resident memory faults nothing,
    /// where an engine block faults in every page afresh.
    pub heap_first: HeapFirst,
    /// A copy from anonymous source pages writes them into fresh frames and
    /// maps the destination there, so copies of the copy are virtual. Off by
    /// default: such copies are plain.
    pub copy_through: bool,
    /// Copies into a size class whose copies were mostly written are made
    /// plainly (fresh.rs). Off (default): every eligible copy is virtual.
    pub copy_learn: bool,
    /// With `copy_learn`, a copy into a block below `plain_below` that the
    /// program frees sooner than this after the copy counts against its
    /// class as a written one does (fresh.rs). Zero: lifetime is not judged.
    pub copy_young: Duration,
    /// Turn copies of whole pages into copy-on-write views (mmapcopy).
    pub copy: bool,
    /// Fold all-zero pages during a scan.
    pub zero: bool,
    /// Merge identical pages during a scan.
    pub merge: bool,
    /// Hand a block to kernel KSM when the mapping budget keeps refusing
    /// merges in it (scattered duplicates), if ksmd is running (ksm.rs).
    /// Off by default: ksmd merges a handed block's pages with any other
    /// process's pages of the same content (docs/MECHANISMS.md, threat model).
    pub ksm_handoff: bool,
    /// Most mappings (VMAs) the engine's blocks may use in total; None: half
    /// of what `vm.max_map_count` leaves after the reserve, at least
    /// `VMA_BUDGET_MIN` (see `Config::vma_budget_for`).
    pub vma_budget: Option<usize>,
    /// Mappings always left free for the program below `vm.max_map_count`.
    pub vma_reserve: usize,
    /// Pages write-protected and scanned at a time; bounds how long a writer can stall.
    pub scan_chunk_pages: usize,
    /// Background scan period; `None` scans only on demand.
    pub scan_interval: Option<Duration>,
    /// Fraction of one core the background scanner may use (0 < f <= 1).
    pub scan_cpu_budget: f64,
    /// Scan in proportion to profit (budget.rs): the background scanner may
    /// spend this fraction of the program's own CPU time, plus what the memory
    /// it was handed and the pages it saved earn it, and backs off while
    /// scans find nothing. None: only `scan_cpu_budget` limits it.
    pub scan_share: Option<f64>,
    /// Fold or merge a page only if the previous scan saw the same content
    /// (kernel KSM's volatility check; DE's policy of leaving recently
    /// written pages alone). Off: one scan folds everything it finds, but a
    /// write through a page the kernel pinned long ago can be lost.
    pub volatile_check: bool,
    /// Look less often at pages earlier scans found nothing to do with (as
    /// kernel KSM's smart_scan): at every 2nd, 4th, then 8th scan. Every 8th
    /// scan still looks at every page, so identical pages always meet.
    pub smart_scan: bool,
    /// Look at only one page in 16 of a block in which two scans in a row
    /// found nothing to fold or merge, until a look finds something
    /// (sample.rs).
    pub sample_scan: bool,
    /// Space the looks at a block whose folds and merges the program undoes
    /// soon after (their pages written again): every 2nd, 4th, then 8th
    /// scan, so a page must stay unchanged that much longer to be acted on
    /// (sample.rs).
    pub churn_rest: bool,
    /// A plain copy into an engine block leaves out the source's zero pages
    /// where the destination page reads zero already (copy.rs); needs `zero`.
    pub sparse_copy: bool,
    /// Zeroing a range of an engine block (memset to 0, through
    /// `Engine::zero`) leaves out the whole pages that read zero already
    /// (copy.rs); needs `zero`.
    pub sparse_zero: bool,
    /// Sparse copies and zeroing also into the caller's heap (the program
    /// break's area, heap.rs), where untouched pages read zero; needs `zero`.
    pub sparse_heap: bool,
    /// Look at a chunk's pages before protecting it, and protect it only if
    /// a page may be folded or merged (as kernel KSM reads and hashes pages
    /// without write-protecting them, and protects only the page it merges).
    /// Off: every chunk with a page due is protected for its look.
    pub look_first: bool,
    /// Wait before folding or merging pages of a chunk, for writes through
    /// pages the kernel pinned before the chunk was protected (O_DIRECT),
    /// where the pin guard is off or the kernel lacks it.
    pub pin_grace: Duration,
    /// Take anonymous pages off their addresses with UFFDIO_MOVE, which
    /// refuses pages the kernel may have pinned (detach.rs), and leave
    /// pages of the frames' memfd alone. Off, or on a kernel before 6.8:
    /// the pin grace, which narrows the race with pinned writes but does
    /// not close it.
    pub pin_guard: bool,
    /// Under the pin guard, how long a frame the scan froze from an owned
    /// page waits before it is folded or shared: a write through a pin
    /// taken before the freeze (the page was mapped shared, so no copy was
    /// forced) must land first. Pins held longer than this are not covered.
    /// Zero (default): owned pages are folded and merged at once, behind
    /// the pin grace, as without the guard.
    pub pin_age: Duration,
    /// With a pin age, hold a diverged page write-protected for that age
    /// before folding or merging it (hold.rs), so a write pin taken on it
    /// meanwhile faults and ends the hold. Off: diverged pages wait the age
    /// after diverging and then get the pin grace.
    pub pin_hold: bool,
    /// Freed blocks kept mapped for reuse by same-sized allocations, at most
    /// this many bytes; blocks over a quarter of it are never kept. Off (0)
    /// by default: a library caller expects `free` to give memory back; the
    /// preload turns it on, as glibc's heap keeps freed chunks.
    pub recycle_bytes: usize,
    /// Of that, at most this percentage of the live blocks' bytes (plus
    /// 16 MiB) is kept: freed memory held for reuse stays small beside
    /// what the program holds, so recycling never makes it larger than
    /// plain by much (recycle.rs). 0: the fixed budget alone.
    pub recycle_live_percent: u64,
    /// How long a recycled block waits for reuse before it is given back.
    pub recycle_age: Duration,
    /// An allocation no recycled block fits may be served by smaller
    /// recycled blocks laid side by side (recycle.rs `gather`).
    pub recycle_join: bool,
    /// Freed blocks kept for reuse never raise the process's peak: before
    /// fresh memory is mapped, the oldest are given back until the
    /// process's resident bytes, less them, plus the fresh block are within
    /// the most it ever had resident (recycle.rs `make_room`).
    pub recycle_under_peak: bool,
    /// Allow `Engine::evict` (pages to the page store, restored on touch).
    /// Nothing calls it unless the program or a policy does.
    pub evict: bool,
    /// Evict pages that have no pin test: owned, sole-shared and diverged
    /// pages (mappings of the frames' memfd, which UFFDIO_MOVE cannot move),
    /// and anonymous pages when the pin guard is unavailable; they get the
    /// pin grace (evict.rs). Off: only pages the pin guard tests are evicted,
    /// so a write through a pin taken earlier can never be lost to eviction.
    /// On by default.
    pub evict_untested: bool,
    /// Most memory in bytes the page store may hold (compressed pages, its
    /// slabs' slack, tables and codecs); beyond it pages go to the swap file
    /// if there is one, else stay in memory.
    pub evict_store_bytes: u64,
    /// Tiering (clock.rs): scans classify pages by access (Difference
    /// Engine's C1-C4) and evict cold ones by the policy below: always, only
    /// while memory is short (default, pressure.rs), or never.
    pub tier: Tier,
    /// The memory the program may use, in bytes, besides its cgroup's limit
    /// (`PAGEFOLD_MEMORY`, `pagefold run --memory`); None: the cgroup's alone.
    pub memory_limit: Option<u64>,
    /// With `Tier::Pressure`, memory is short above this percentage of the
    /// limit, until the usage is below `pressure_low` percent (pressure.rs).
    pub pressure_high: u32,
    pub pressure_low: u32,
    /// ... or while the group's PSI `some avg10` is above this (percent).
    pub pressure_psi: f64,
    /// Least time between two clock passes (full scans that classify every
    /// page); the background scanner wakes at least this often with `tier`.
    pub clock_interval: Duration,
    /// Passes without a write or restore after which a page is C4 (cold); 1..=7.
    pub cold_passes: u32,
    /// The policy may store C3 and C4 pages as patches against a similar page.
    pub tier_patch: bool,
    /// The policy may compress C4 pages (send them to the page store).
    pub tier_compress: bool,
    /// Above this engine footprint (resident memory + page store), C3 pages are
    /// compressed too and the store is asked to spill to a lower tier; None: no watermark.
    pub high_water: Option<u64>,
    /// ... until the footprint is below this (defaults to 7/8 of `high_water`).
    pub low_water: Option<u64>,
    /// Swap file below the page store: `<path>.<pid>.<n>` is created on
    /// first use and deleted with the store. None (default): no swap.
    pub swap_file: Option<std::path::PathBuf>,
    /// Largest size of the swap file in bytes.
    pub swap_bytes: u64,
    /// Similarity detection for patching (patching.rs): indices (DE's k,
    /// each of one block) and block size in bytes. DE's HashSimilarityDetector
    /// is (2, 64 B); see docs/MECHANISMS.md "Patching" for why the default differs.
    pub patch_blocks: usize,
    pub patch_block_bytes: usize,
    /// Candidate reference pages the detector remembers at most (its memory
    /// is bounded: beyond this it starts afresh, as DE clears it each cycle).
    pub patch_candidates: usize,
    /// Page colouring (colour.rs): frames of fresh blocks only from physical
    /// pages whose DRAM banks are in this set, under this bank map. None
    /// (default): any page.
    pub banks: Option<pagefold_banks::colour::Colouring>,
    /// Fault injection, for tests.
    pub inject: Inject,
}

/// Forced failures. Each makes the engine take the same fallback a real
/// failure of that resource would.
#[derive(Clone, Debug, Default)]
pub struct Inject {
    /// memfd_create fails: the engine runs on plain anonymous memory.
    pub fail_memfd: bool,
    /// userfaultfd fails: scans skip everything that needs write protection.
    pub fail_uffd: bool,
    /// userfaultfd works for write protection but not MISSING mode: eviction is refused.
    pub fail_uffd_missing: bool,
    /// The userfaultfd system call is refused (EPERM), as for an unprivileged
    /// user while `vm.unprivileged_userfaultfd` is 0: the engine asks /dev/userfaultfd.
    pub fail_uffd_syscall: bool,
    /// /dev/userfaultfd cannot be opened (EACCES), as when its mode keeps the user out.
    pub fail_uffd_device: bool,
    /// The kernel lacks userfaultfd write protection of anonymous and shmem
    /// memory (before Linux 6.1): no write-protected scans.
    pub fail_uffd_wp: bool,
    /// The kernel lacks write protection of never-touched anonymous pages
    /// (before Linux 6.4): no write-protected scans.
    pub fail_uffd_wp_unpopulated: bool,
    /// The kernel lacks UFFDIO_POISON (before Linux 6.6): a lost stored copy ends the process.
    pub fail_uffd_poison: bool,
    /// The kernel lacks UFFDIO_MOVE (before Linux 6.8): no pin guard, the pin grace alone.
    pub fail_uffd_move: bool,
    /// Every engine mmap after this many succeeds fails with ENOMEM.
    pub fail_mmap_after: Option<u64>,
    /// Pretend vm.max_map_count is this value.
    pub max_map_count: Option<usize>,
    /// Every patch fails to decode when restored: the page is poisoned (SIGBUS).
    pub fail_patch: bool,
    /// Page colouring reads every PFN as zero, as without root: colouring
    /// falls back to uncoloured frames.
    pub hide_pfns: bool,
    /// Kernel KSM reads as not running: blocks are never handed to it.
    pub ksm_off: bool,
    /// The kernel refuses MADV_MERGEABLE: a block taken out of the engine's
    /// hands for KSM stays plain anonymous memory, unmerged.
    pub ksm_refuse: bool,
    /// No memory cgroup is readable: the limit is `memory_limit`, else the machine's.
    pub hide_cgroup: bool,
    /// No PSI file is readable: pressure is read from usage alone.
    pub hide_psi: bool,
    /// Pretend the machine has this many bytes of swap free (/proc/meminfo
    /// `SwapFree`): whether the kernel can swap decides how cautious
    /// passes under pressure are (governor.rs).
    pub swap_free: Option<u64>,
    /// Pauses of up to this many microseconds at the points where eviction,
    /// restoring and reconciling race (race.rs).
    pub race_pause_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frames: true,
            fresh: crate::fresh::Fresh::Frames,
            fresh_zeroed: crate::fresh::Fresh::Adaptive,
            plain_below: 0,
            take_first: 4,
            heap_first: HeapFirst::Large,
            copy_through: false,
            copy_learn: false,
            copy_young: Duration::from_millis(1000),
            copy: true,
            zero: true,
            merge: true,
            ksm_handoff: false,
            vma_budget: None,
            vma_reserve: 4_096,
            scan_chunk_pages: 512,
            scan_interval: None,
            scan_cpu_budget: 0.10,
            scan_share: None,
            volatile_check: true,
            smart_scan: true,
            sample_scan: true,
            churn_rest: true,
            sparse_copy: true,
            sparse_zero: true,
            sparse_heap: true,
            look_first: true,
            pin_grace: Duration::from_micros(1000),
            pin_guard: true,
            pin_hold: true,
            pin_age: Duration::ZERO,
            recycle_bytes: 0,
            recycle_live_percent: 12,
            recycle_age: Duration::from_millis(250),
            recycle_join: true,
            recycle_under_peak: true,
            evict: true,
            evict_untested: true,
            evict_store_bytes: u64::MAX,
            tier: Tier::Pressure,
            memory_limit: None,
            pressure_high: 80,
            pressure_low: 70,
            pressure_psi: 1.0,
            clock_interval: Duration::from_millis(500),
            cold_passes: 2,
            tier_patch: true,
            tier_compress: true,
            high_water: None,
            low_water: None,
            swap_file: None,
            swap_bytes: 1 << 30,
            patch_blocks: 8,
            patch_block_bytes: 8,
            patch_candidates: 1 << 14,
            banks: None,
            inject: Inject::default(),
        }
    }
}

/// Which mallocs the caller's heap serves first when it has room
/// (placement.rs, `leave_to_heap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapFirst {
    /// None: the engine takes what `plain_below` and `take_first` give it.
    Off,
    /// Those at `plain_below` and above (the default); below it the first
    /// blocks of a size are still taken to learn what the size yields.
    Large,
    /// Every size, the first blocks of a size too.
    Every,
}

impl HeapFirst {
    /// `PAGEFOLD_HEAP_FIRST`: 0/off/false/no, every/all, anything else large.
    pub fn parse(text: &str) -> HeapFirst {
        match text.trim() {
            "0" | "off" | "false" | "no" => HeapFirst::Off,
            "every" | "all" => HeapFirst::Every,
            _ => HeapFirst::Large,
        }
    }
}

/// When tiering's clock runs (clock.rs, pressure.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Never: no clock passes.
    Off,
    /// Only while memory is short (the default): no passes with room to spare.
    Pressure,
    /// Always, at every clock interval.
    On,
}

impl Tier {
    /// `PAGEFOLD_TIER`: 0/off/false/no, pressure/auto, anything else on.
    pub fn parse(text: &str) -> Tier {
        match text.trim() {
            "0" | "off" | "false" | "no" => Tier::Off,
            "pressure" | "auto" => Tier::Pressure,
            _ => Tier::On,
        }
    }
}

/// The smallest malloc a caller that allocates as malloc does
/// (`Config::malloc_from_env`) offers the engine. Below it glibc's heap
/// reuses memory it has already faulted in, which a fresh engine block
/// cannot; measured on the R and Python suites, 1 MiB keeps 87% of the R
/// suite's saving at 8 KiB for 60% of its cost (docs/RESULTS.md).
pub const MALLOC_THRESHOLD: usize = 1 << 20;

/// The smallest automatic mapping budget (what the engine takes at the
/// kernel's default `vm.max_map_count` of 65,530).
pub const VMA_BUDGET_MIN: usize = 30_000;

impl Config {
    /// The mapping budget under `vm.max_map_count` = `max_map_count`: the
    /// configured one, else half of what the reserve leaves, at least
    /// `VMA_BUDGET_MIN`. Raising `vm.max_map_count` raises it, so scattered
    /// merges can go on (each isolated merged page costs two mappings).
    pub fn vma_budget_for(&self, max_map_count: usize) -> usize {
        self.vma_budget.unwrap_or_else(|| {
            (max_map_count.saturating_sub(self.vma_reserve) / 2).max(VMA_BUDGET_MIN)
        })
    }

    /// Defaults overridden by `PAGEFOLD_*` variables:
    /// `PAGEFOLD_FRAMES`, `PAGEFOLD_FRESH` (frames, anon, adaptive), `PAGEFOLD_PLAIN_BELOW` (bytes), `PAGEFOLD_COPY`, `PAGEFOLD_COPY_THROUGH`, `PAGEFOLD_HEAP_FIRST`, `PAGEFOLD_COPY_LEARN`, `PAGEFOLD_ZERO`, `PAGEFOLD_MERGE`, `PAGEFOLD_KSM`, `PAGEFOLD_VOLATILE_CHECK`, `PAGEFOLD_SMART_SCAN`, `PAGEFOLD_PIN_GUARD`, `PAGEFOLD_PIN_HOLD`, `PAGEFOLD_RECYCLE_JOIN` (0/1),
    /// `PAGEFOLD_VMA_BUDGET`, `PAGEFOLD_VMA_RESERVE`, `PAGEFOLD_SCAN_CHUNK` (pages),
    /// `PAGEFOLD_SCAN_INTERVAL_MS` (0 = on demand only), `PAGEFOLD_SCAN_CPU` (fraction), `PAGEFOLD_SCAN_SHARE` (fraction of the program's CPU; 0 = off),
    /// `PAGEFOLD_PIN_GRACE_US`, `PAGEFOLD_PIN_AGE_MS`, `PAGEFOLD_RECYCLE_MB`, `PAGEFOLD_RECYCLE_MS`, `PAGEFOLD_EVICT`, `PAGEFOLD_EVICT_UNTESTED` (0/1),
    /// `PAGEFOLD_EVICT_STORE_MB`, `PAGEFOLD_SWAP_FILE` (path prefix), `PAGEFOLD_SWAP_MB`;
    /// tiering: `PAGEFOLD_TIER` (0, pressure, 1), `PAGEFOLD_MEMORY` (bytes, K/M/G/T),
    /// `PAGEFOLD_PRESSURE_HIGH`, `PAGEFOLD_PRESSURE_LOW` (percent), `PAGEFOLD_PRESSURE_PSI`,
    /// `PAGEFOLD_TIER_PATCH`, `PAGEFOLD_TIER_COMPRESS` (0/1),
    /// `PAGEFOLD_CLOCK_MS`, `PAGEFOLD_COLD_PASSES`, `PAGEFOLD_HIGH_MB`, `PAGEFOLD_LOW_MB`
    /// (0 = no watermark); patching: `PAGEFOLD_PATCH_BLOCKS`, `PAGEFOLD_PATCH_BLOCK_BYTES`,
    /// `PAGEFOLD_PATCH_CANDIDATES`; page colouring: `PAGEFOLD_BANKS` (a bank set, `0-7,12`)
    /// under `PAGEFOLD_BANK_FUNCTIONS` (a table entry of pagefold-banks or hex masks; default:
    /// the entry assumed for this CPU), an invalid set leaves colouring off; fault injection: `PAGEFOLD_INJECT_FAIL_MEMFD`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD`, `PAGEFOLD_INJECT_FAIL_UFFD_MISSING`, `PAGEFOLD_INJECT_FAIL_UFFD_SYSCALL`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_DEVICE`, `PAGEFOLD_INJECT_FAIL_UFFD_WP`, `PAGEFOLD_INJECT_FAIL_UFFD_WP_UNPOPULATED`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_POISON`, `PAGEFOLD_INJECT_FAIL_UFFD_MOVE`, `PAGEFOLD_INJECT_FAIL_PATCH` (0/1),
    /// `PAGEFOLD_INJECT_MMAP_AFTER`, `PAGEFOLD_INJECT_MAX_MAP_COUNT`, `PAGEFOLD_INJECT_HIDE_PFNS`,
    /// `PAGEFOLD_INJECT_NO_CGROUP`, `PAGEFOLD_INJECT_NO_PSI`, `PAGEFOLD_INJECT_SWAP_FREE_MB`.
    /// Unparsable values keep the default; the preload cannot report errors.
    pub fn from_env() -> Config {
        Config::from_env_over(Config::default())
    }

    /// The configuration for a program whose allocator hands its large
    /// blocks to the engine (the preload under any program; `pagefold
    /// demo`'s interpreter): `from_env`, over these defaults for what the
    /// environment leaves unset.
    /// - Plain memory stays plain: a block starts anonymous unless its size
    ///   class is often copied from (`PAGEFOLD_FRESH=adaptive`), and below
    ///   glibc's largest mmap threshold (32 MiB) a class that is not copied
    ///   from is left to the caller's heap, which reuses freed memory
    ///   without a fault (`PAGEFOLD_PLAIN_BELOW`). The first copy out of
    ///   anonymous memory adopts its source onto frames
    ///   (`PAGEFOLD_COPY_THROUGH`). With tiering always on (`PAGEFOLD_TIER=1`)
    ///   blocks stay on frames, where patches find their reference pages.
    /// - Copies into a size class the program writes over, or frees young,
    ///   are made plainly (`PAGEFOLD_COPY_LEARN`).
    /// - Freed blocks are kept for reuse as glibc's heap keeps freed chunks
    ///   (`PAGEFOLD_RECYCLE_MB`, 256).
    /// - A frame the scan froze from an owned page waits 200 ms before it is
    ///   folded or shared (`PAGEFOLD_PIN_AGE_MS`): any program may read files
    ///   with O_DIRECT into its heap, and a direct read longer than that is a
    ///   stalled disk. Under pressure-driven tiering only pages with a pin
    ///   test leave memory (`PAGEFOLD_EVICT_UNTESTED=0`: anonymous pages,
    ///   through the pin guard); with tiering always on, untested eviction
    ///   behind the pin grace is what lets tiering evict.
    /// - The scanner runs every second (`PAGEFOLD_SCAN_INTERVAL_MS`).
    pub fn malloc_from_env() -> Config {
        let set = |name: &str| std::env::var_os(name).is_some();
        let mut c = Config::from_env_over(Config {
            scan_interval: Some(Duration::from_millis(1000)),
            recycle_bytes: 256 << 20,
            pin_age: Duration::from_millis(200),
            copy_through: true,
            copy_learn: true,
            ..Config::default()
        });
        if c.tier != Tier::On {
            if !set("PAGEFOLD_FRESH") {
                c.fresh = Fresh::Adaptive;
            }
            if !set("PAGEFOLD_EVICT_UNTESTED") {
                c.evict_untested = false;
            }
        }
        if !set("PAGEFOLD_PLAIN_BELOW") && c.fresh == Fresh::Adaptive {
            c.plain_below = 32 << 20;
        }
        c
    }

    /// `base`, with every setting the environment gives replaced.
    fn from_env_over(base: Config) -> Config {
        let mut c = base;
        let flag = |name: &str, v: &mut bool| {
            if let Ok(s) = std::env::var(name) {
                *v = !matches!(s.trim(), "0" | "off" | "false" | "no");
            }
        };
        flag("PAGEFOLD_FRAMES", &mut c.frames);
        flag("PAGEFOLD_COPY", &mut c.copy);
        flag("PAGEFOLD_COPY_THROUGH", &mut c.copy_through);
        if let Ok(s) = std::env::var("PAGEFOLD_HEAP_FIRST") {
            c.heap_first = HeapFirst::parse(&s);
        }
        flag("PAGEFOLD_COPY_LEARN", &mut c.copy_learn);
        if let Some(f) = std::env::var("PAGEFOLD_FRESH")
            .ok()
            .and_then(|s| crate::fresh::Fresh::parse(&s))
        {
            c.fresh = f;
        }
        if let Some(f) = std::env::var("PAGEFOLD_FRESH_ZEROED")
            .ok()
            .and_then(|s| crate::fresh::Fresh::parse(&s))
        {
            c.fresh_zeroed = f;
        }
        flag("PAGEFOLD_ZERO", &mut c.zero);
        flag("PAGEFOLD_MERGE", &mut c.merge);
        flag("PAGEFOLD_KSM", &mut c.ksm_handoff);
        flag("PAGEFOLD_VOLATILE_CHECK", &mut c.volatile_check);
        flag("PAGEFOLD_SMART_SCAN", &mut c.smart_scan);
        flag("PAGEFOLD_SAMPLE_SCAN", &mut c.sample_scan);
        flag("PAGEFOLD_CHURN_REST", &mut c.churn_rest);
        flag("PAGEFOLD_SPARSE_COPY", &mut c.sparse_copy);
        flag("PAGEFOLD_SPARSE_ZERO", &mut c.sparse_zero);
        flag("PAGEFOLD_SPARSE_HEAP", &mut c.sparse_heap);
        flag("PAGEFOLD_LOOK_FIRST", &mut c.look_first);
        flag("PAGEFOLD_PIN_GUARD", &mut c.pin_guard);
        flag("PAGEFOLD_PIN_HOLD", &mut c.pin_hold);
        flag("PAGEFOLD_RECYCLE_JOIN", &mut c.recycle_join);
        flag("PAGEFOLD_RECYCLE_UNDER_PEAK", &mut c.recycle_under_peak);
        flag("PAGEFOLD_EVICT", &mut c.evict);
        flag("PAGEFOLD_EVICT_UNTESTED", &mut c.evict_untested);
        if let Some(t) = std::env::var("PAGEFOLD_TIER").ok().map(|s| Tier::parse(&s)) {
            c.tier = t;
        }
        if let Some(b) = std::env::var("PAGEFOLD_MEMORY")
            .ok()
            .and_then(|s| crate::memlimit::parse_bytes(&s).ok())
        {
            c.memory_limit = Some(b);
        }
        flag("PAGEFOLD_TIER_PATCH", &mut c.tier_patch);
        flag("PAGEFOLD_TIER_COMPRESS", &mut c.tier_compress);
        let num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        if let Some(v) = num("PAGEFOLD_VMA_BUDGET") {
            c.vma_budget = Some(v as usize);
        }
        if let Some(v) = num("PAGEFOLD_VMA_RESERVE") {
            c.vma_reserve = v as usize;
        }
        if let Some(v) = num("PAGEFOLD_SCAN_CHUNK") {
            c.scan_chunk_pages = (v as usize).max(1);
        }
        if let Some(v) = num("PAGEFOLD_SCAN_INTERVAL_MS") {
            c.scan_interval = (v > 0).then(|| Duration::from_millis(v));
        }
        if let Some(v) = num("PAGEFOLD_RECYCLE_MB") {
            c.recycle_bytes = (v as usize) << 20;
        }
        if let Some(v) = num("PAGEFOLD_COPY_YOUNG_MS") {
            c.copy_young = Duration::from_millis(v);
        }
        if let Some(v) = num("PAGEFOLD_PLAIN_BELOW") {
            c.plain_below = v as usize;
        }
        if let Some(v) = num("PAGEFOLD_TAKE_FIRST") {
            c.take_first = v.min(u32::MAX as u64) as u32;
        }
        if let Some(v) = num("PAGEFOLD_RECYCLE_LIVE_PCT") {
            c.recycle_live_percent = v;
        }
        if let Some(v) = num("PAGEFOLD_EVICT_STORE_MB") {
            c.evict_store_bytes = v.saturating_mul(1 << 20);
        }
        if let Some(path) = std::env::var_os("PAGEFOLD_SWAP_FILE").filter(|p| !p.is_empty()) {
            c.swap_file = Some(path.into());
        }
        if let Some(v) = num("PAGEFOLD_SWAP_MB") {
            c.swap_bytes = v.saturating_mul(1 << 20);
        }
        if let Some(v) = num("PAGEFOLD_RECYCLE_MS") {
            c.recycle_age = Duration::from_millis(v);
        }
        if let Some(v) = num("PAGEFOLD_PATCH_BLOCKS") {
            c.patch_blocks = v as usize;
        }
        if let Some(v) = num("PAGEFOLD_PATCH_BLOCK_BYTES") {
            c.patch_block_bytes = v as usize;
        }
        if let Some(v) = num("PAGEFOLD_PATCH_CANDIDATES") {
            c.patch_candidates = v as usize;
        }
        if let Some(v) = num("PAGEFOLD_PIN_GRACE_US") {
            c.pin_grace = Duration::from_micros(v);
        }
        if let Some(v) = num("PAGEFOLD_PIN_AGE_MS") {
            c.pin_age = Duration::from_millis(v);
        }
        if let Some(v) = num("PAGEFOLD_CLOCK_MS") {
            c.clock_interval = Duration::from_millis(v);
        }
        if let Some(v) = num("PAGEFOLD_COLD_PASSES") {
            c.cold_passes = v.clamp(1, crate::seen::MAX_AGE as u64) as u32;
        }
        let mb = |name: &str| num(name).map(|v| (v > 0).then(|| v.saturating_mul(1 << 20)));
        if let Some(v) = mb("PAGEFOLD_HIGH_MB") {
            c.high_water = v;
        }
        if let Some(v) = mb("PAGEFOLD_LOW_MB") {
            c.low_water = v;
        }
        if let Some(v) = num("PAGEFOLD_PRESSURE_HIGH").filter(|v| (1..=100).contains(v)) {
            c.pressure_high = v as u32;
        }
        if let Some(v) = num("PAGEFOLD_PRESSURE_LOW").filter(|v| (1..=100).contains(v)) {
            c.pressure_low = v as u32;
        }
        c.pressure_low = c.pressure_low.min(c.pressure_high);
        if let Some(f) = std::env::var("PAGEFOLD_PRESSURE_PSI")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|f| (0.0..=100.0).contains(f))
        {
            c.pressure_psi = f;
        }
        c.inject = Inject::from_env();
        if let Ok(set) = std::env::var("PAGEFOLD_BANKS") {
            let functions = std::env::var("PAGEFOLD_BANK_FUNCTIONS").ok();
            c.banks = pagefold_banks::colour::Colouring::parse(&set, functions.as_deref()).ok();
        }
        if let Some(f) = std::env::var("PAGEFOLD_SCAN_SHARE")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
        {
            c.scan_share = (f > 0.0 && f <= 1.0).then_some(f);
        }
        if let Some(f) = std::env::var("PAGEFOLD_SCAN_CPU")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
        {
            if f > 0.0 && f <= 1.0 {
                c.scan_cpu_budget = f;
            }
        }
        c
    }
}

impl Inject {
    /// Forced failures from the environment, so that programs run under the
    /// preload (which cannot be given a Config) can be made to take every
    /// fallback path: `PAGEFOLD_INJECT_FAIL_MEMFD=1`, `PAGEFOLD_INJECT_FAIL_UFFD=1`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_MISSING=1`, `PAGEFOLD_INJECT_FAIL_UFFD_SYSCALL=1`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_DEVICE=1`, `PAGEFOLD_INJECT_FAIL_UFFD_WP=1`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_WP_UNPOPULATED=1`, `PAGEFOLD_INJECT_FAIL_UFFD_POISON=1`,
    /// `PAGEFOLD_INJECT_FAIL_UFFD_MOVE=1`, `PAGEFOLD_INJECT_FAIL_PATCH=1`, `PAGEFOLD_INJECT_HIDE_PFNS=1`, `PAGEFOLD_INJECT_KSM_OFF=1`, `PAGEFOLD_INJECT_KSM_REFUSE=1`, `PAGEFOLD_INJECT_MMAP_AFTER=N`, `PAGEFOLD_INJECT_MAX_MAP_COUNT=N`.
    pub fn from_env() -> Inject {
        let num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let on = |name: &str| num(name).is_some_and(|v| v != 0);
        Inject {
            fail_memfd: on("PAGEFOLD_INJECT_FAIL_MEMFD"),
            fail_uffd: on("PAGEFOLD_INJECT_FAIL_UFFD"),
            fail_uffd_missing: on("PAGEFOLD_INJECT_FAIL_UFFD_MISSING"),
            fail_uffd_syscall: on("PAGEFOLD_INJECT_FAIL_UFFD_SYSCALL"),
            fail_uffd_device: on("PAGEFOLD_INJECT_FAIL_UFFD_DEVICE"),
            fail_uffd_wp: on("PAGEFOLD_INJECT_FAIL_UFFD_WP"),
            fail_uffd_wp_unpopulated: on("PAGEFOLD_INJECT_FAIL_UFFD_WP_UNPOPULATED"),
            fail_uffd_poison: on("PAGEFOLD_INJECT_FAIL_UFFD_POISON"),
            fail_uffd_move: on("PAGEFOLD_INJECT_FAIL_UFFD_MOVE"),
            fail_mmap_after: num("PAGEFOLD_INJECT_MMAP_AFTER"),
            max_map_count: num("PAGEFOLD_INJECT_MAX_MAP_COUNT").map(|v| v as usize),
            fail_patch: on("PAGEFOLD_INJECT_FAIL_PATCH"),
            hide_pfns: on("PAGEFOLD_INJECT_HIDE_PFNS"),
            ksm_off: on("PAGEFOLD_INJECT_KSM_OFF"),
            ksm_refuse: on("PAGEFOLD_INJECT_KSM_REFUSE"),
            hide_cgroup: on("PAGEFOLD_INJECT_NO_CGROUP"),
            hide_psi: on("PAGEFOLD_INJECT_NO_PSI"),
            swap_free: num("PAGEFOLD_INJECT_SWAP_FREE_MB").map(|mb| mb << 20),
            race_pause_us: num("PAGEFOLD_INJECT_RACE_US").unwrap_or(0),
        }
    }
    /// What the kernel is made to refuse of userfaultfd (protect.rs).
    pub fn uffd_refusals(&self) -> crate::protect::Refuse {
        crate::protect::Refuse {
            syscall: self.fail_uffd_syscall,
            device: self.fail_uffd_device,
            wp: self.fail_uffd_wp,
            wp_unpopulated: self.fail_uffd_wp_unpopulated,
            missing: self.fail_uffd_missing,
            poison: self.fail_uffd_poison,
            move_pages: self.fail_uffd_move,
        }
    }
}
