//! The scan: zero folding and identical-page merging.
//!
//! Blocks are walked in chunks of `scan_chunk_pages`, under the engine lock
//! one chunk at a time. For each chunk, its shared pages' divergence is read
//! from pagemap first (in a chunk with no page due, every 8th scan only),
//! then:
//!
//! 0. outside clock passes, look first (`look_unprotected`): read and hash
//!    the pages due a look (step 3's rules) without protecting anything. If
//!    none is zero or has a duplicate (a frame of the stable index, a page
//!    earlier in this scan or in the chunk), record the looks and put the
//!    pages in the unstable index, and leave the chunk: no writer stopped,
//!    nothing registered. Otherwise go on, reading them again under
//!    protection. Most chunks of a program with little to share end here,
//!    and protecting, unprotecting and unregistering a chunk cost more than
//!    reading it (on pandas work, 70% of the scanner's time);
//! 1. register it with userfaultfd and write-protect it, by the protocol
//!    eviction follows too (chunk.rs): writers sleep until step 6;
//! 2. refresh divergence from pagemap (frames of pages that were written
//!    since they were shared lose a reference);
//! 3. ask mincore which pages hold content: a page never touched (or already
//!    folded) is skipped, because reading it would allocate it; and, as kernel
//!    KSM does, skip pages whose content changed since the previous scan, and
//!    pages earlier looks found nothing to do with, but for every 2nd, 4th or
//!    8th scan (idle.rs; a chunk with no page due is not even protected);
//! 4. fold zero pages: an anonymous page is dropped (MADV_DONTNEED, the
//!    kernel zero page serves reads), a frame is punched out, a diverged page
//!    is remapped anonymous;
//! 5. merge: each non-zero page is hashed (xxh3). A hit in the stable index
//!    (frozen frames by hash) is byte-compared and the page remapped onto that
//!    frame. A hit in this scan's unstable index (pages seen earlier) is
//!    protected too, compared, turned into a frozen frame, and both pages map
//!    it. A hash alone never decides: every merge compares all 4096 bytes.
//!    Consecutive pages merging onto consecutive frames are remapped as one run,
//!    and an unstable hit looks ahead: when the following pages equal the
//!    pages following the partner (a block computed twice), the partner's
//!    whole run is protected, compared and frozen at once (partner_run,
//!    promote), so a duplicated block costs a few system calls, not several
//!    per page.
//!    Before steps 4-5 act, a short grace lets writes through pages the kernel
//!    pinned earlier (O_DIRECT) land, and every planned page is checked again;
//! 6. unprotect the chunk (waking writers) and unregister it (a registered
//!    range loses fault-around; ranges remapped in steps 4-5 were registered
//!    as they were made).
//!
//! Evicted pages (evict.rs) are neither folded nor merged (reading one would
//! restore it): before its chunk is registered, pages the fault thread has
//! restored are reconciled, and the rest are skipped; their MISSING
//! registration survives the chunk's (registering adds modes, and step 6
//! unregisters only the pages that are not evicted).
//!
//! With tiering on, a scan at least `clock_interval` after the previous one
//! is a clock pass (clock.rs): step 3 looks at every page, and after step 5
//! the clock classifies the chunk's pages and evicts the cold ones the policy
//! chooses, inside the same protection (evict.rs `evict_pages`). Every scan
//! records each look, so a write any scan sees marks the page for the next pass.
//!
//! While memory is short and the kernel can swap, a scan that is not a clock
//! pass refreshes divergence from pagemap and reads no page
//! (`looks_allowed`): a read marks the page used for the kernel's reclaim.
//! Passes still read every page: they see writes by changed content.
//!
//! Without userfaultfd, steps 4-5 would race with writers and are skipped;
//! step 2 is safe on its own (divergence never reverts). With folding,
//! merging and virtual copies all off, a scan that is not a clock pass walks
//! no block at all: nothing is shared, and nothing could be acted on.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::chunk::{ChunkHolds, ChunkWork, Protected};
use crate::config::Tier;
use crate::frames::FrameId;
use crate::idle;
use crate::index::{page_eq, sample_hash, ContentIndex};
use crate::pass::{Pass, Tiering};
use crate::space::{runs, Page};
use crate::state::{Inner, State};
use crate::stats::ScanReport;
use crate::sys::{self, PAGE};

/// How often a scan reads the divergence of a chunk with no page due.
const DIVERGENCE_EVERY: u64 = 8;

/// Pages seen earlier in this scan, by content: (block base, page index).
type Unstable = ContentIndex<(usize, usize)>;

/// The scan's work on one protected chunk (chunk.rs).
struct ScanChunk<'a> {
    unstable: &'a mut Unstable,
    rep: &'a mut ScanReport,
    pass: Option<&'a mut Pass>,
    /// Whether pages may be read for folds and merges (`looks_allowed`).
    look: bool,
    /// The chunk's pages due a look, as `before` found them.
    due: Vec<usize>,
}

impl ChunkWork for ScanChunk<'_> {
    const HOLDS: ChunkHolds = ChunkHolds::Decide;

    /// Divergence (frames of pages written since they were shared are
    /// released), then the pages due a look: with none, nothing is read and
    /// no writer need be stopped; with `look_first`, neither while none of
    /// them may be folded or merged (`look_unprotected`). A chunk with no
    /// page due has its divergence read every `DIVERGENCE_EVERY`th scan
    /// only: an idle program's shared pages seldom diverge, and reading
    /// pagemap for all of them every scan takes a quarter of its scanner's
    /// time. A clock pass reads it first, for the writes it classifies.
    fn before(&mut self, st: &mut State, base: usize, i: usize, c: usize) -> bool {
        let pass = self.pass.is_some();
        if !self.look {
            // Divergence only: it reads pagemap, not pages, and releases
            // the frames of pages written since they were shared.
            self.rep.diverged_released += st.refresh_divergence(base, i, c);
            self.rep.skipped_pressure += c as u64;
            return false;
        }
        if pass {
            self.rep.diverged_released += st.refresh_divergence(base, i, c);
        }
        self.due = st.due_pages(base, i, c, pass, self.rep);
        if !pass && (!self.due.is_empty() || st.stats.scans.is_multiple_of(DIVERGENCE_EVERY)) {
            self.rep.diverged_released += st.refresh_divergence(base, i, c);
        }
        if self.due.is_empty() {
            return false;
        }
        // A clock pass classifies every page under protection.
        let protect = self.pass.is_some()
            || !st.cfg.look_first
            || st.look_unprotected(base, i, c, &self.due, self.unstable, self.rep);
        if protect {
            self.rep.chunks_protected += 1;
        } else {
            self.rep.chunks_unprotected += 1;
        }
        protect
    }

    fn work(
        &mut self,
        st: &mut State,
        base: usize,
        i: usize,
        c: usize,
        chunk: &Protected,
    ) -> Vec<(usize, Instant)> {
        // Divergence again: a write may have landed between the refresh and the protect.
        self.rep.diverged_released += chunk.diverged_released;
        let due = std::mem::take(&mut self.due);
        st.scan_chunk(
            base,
            i,
            c,
            chunk,
            due,
            self.unstable,
            self.rep,
            self.pass.as_deref_mut(),
        )
    }
}

pub fn scan(inner: &Inner, tier: Tiering) -> ScanReport {
    let (t0, c0) = (Instant::now(), sys::thread_cpu_ns());
    let mut rep = ScanReport::default();
    if crate::fds::lost() {
        return rep;
    }
    let mut unstable = Unstable::default();
    let reading = inner.read_pressure();
    let (bases, mut pass, look) = {
        let mut st = inner.lock();
        st.expire_recycled();
        st.prune_young();
        st.prune_holds();
        st.mappings.mark_due_for_scan();
        st.ksm.begin_scan();
        if st.protector.is_none() {
            st.stats.fallbacks.uffd += 1;
        }
        let pass = st.begin_pass(tier, reading);
        let look = st.looks_allowed(pass.is_some(), reading);
        (
            st.blocks.keys().copied().collect::<Vec<usize>>(),
            pass,
            look,
        )
    };
    let spilled = pass.as_mut().map_or(0, |p| p.spill_now());
    let chunk = inner.cfg.scan_chunk_pages.max(1);
    // With folding, merging and virtual copies all off and no clock pass,
    // no page is shared and nothing would be acted on: no block is walked.
    let cfg = &inner.cfg;
    let idle = !cfg.zero && !cfg.merge && !cfg.copy && pass.is_none();
    let bases = if idle { Vec::new() } else { bases };
    for base in bases {
        let mut i = 0;
        loop {
            let mut st = inner.lock();
            // An exempt block may be PROT_NONE now: never read it.
            let Some(n) = st
                .blocks
                .get(&base)
                .filter(|b| !b.exempt)
                .map(|b| b.pages.len())
            else {
                break;
            };
            if i >= n {
                break;
            }
            let c = chunk.min(n - i);
            let mut work = ScanChunk {
                unstable: &mut unstable,
                rep: &mut rep,
                pass: pass.as_mut(),
                look,
                due: Vec::new(),
            };
            st.in_protected_chunk(base, i, c, &mut work);
            i += c;
        }
        let mut st = inner.lock();
        let st = &mut *st;
        let scan_no = st.stats.scans;
        if let Some(b) = st.blocks.get_mut(&base) {
            let looked_at = pass.is_some() || !st.cfg.churn_rest || b.found.due_in(scan_no);
            let rest = b.found.rest();
            let verdict = b.found.scan_done(b.pages.len(), looked_at);
            if st.cfg.churn_rest && b.found.rest() > rest {
                st.stats.block_rests += 1;
            }
            if let Some(fruitful) = verdict {
                st.class_yields.judged(b.pages.len(), fruitful);
            }
        }
    }
    rep.wall_ns = t0.elapsed().as_nanos() as u64;
    rep.cpu_ns = sys::thread_cpu_ns() - c0;
    let mut st = inner.lock();
    if let Some(p) = pass {
        st.end_pass(p, spilled, &mut rep);
    }
    rep.ksm_handed = st.hand_to_ksm();
    st.stats.scans += 1;
    st.stats.scan_cpu_ns += rep.cpu_ns;
    st.stats.scan_skipped_idle += rep.skipped_idle;
    st.stats.scan_skipped_pressure += rep.skipped_pressure;
    st.stats.scan_chunks_protected += rep.chunks_protected;
    st.stats.scan_chunks_unprotected += rep.chunks_unprotected;
    rep
}

/// The background scanner: scans every `interval` (with tiering always on,
/// at least every clock interval), or earlier when woken
/// (`Engine::request_scan`), but after a scan that took CPU time c it waits
/// at least c * (1/budget - 1), so it averages at most `budget` of one core.
/// With a scan share configured it also keeps to the account in budget.rs:
/// scans only while the program's CPU time, its fresh memory and the pages
/// saved pay for them, and backs off while scans find nothing. With tiering
/// driven by pressure it also looks at memory about every clock interval
/// (pressure.rs); while memory is short it scans at that pace, outside the
/// account and under at least `PRESSURE_CPU` of a core.
pub fn background(weak: Weak<Inner>, interval: Duration, budget: f64, tier: Tiering) {
    // Process signals go to the program's threads, never to the scanner.
    let _ = sys::block_signals();
    let Some(inner) = weak.upgrade() else { return };
    let clock = inner.cfg.clock_interval.max(Duration::from_millis(10));
    let interval = match inner.cfg.tier {
        Tier::On => interval.min(clock),
        _ => interval,
    };
    // A little over the clock interval, so a pass is due when memory is looked at.
    let poll = (inner.cfg.tier == Tier::Pressure).then_some(clock + clock / 16);
    let (share, pin_age) = (inner.cfg.scan_share, inner.cfg.pin_age);
    drop(inner);
    crate::threads::ENGINE_THREAD.with(|t| t.set(true));
    let mut account = share.map(Budget::new);
    let mut earliest = Instant::now();
    let mut next_early: Option<Duration> = None;
    let mut relieved_at: Option<Instant> = None;
    loop {
        let wait = account.as_ref().map_or(interval, |a| a.interval(interval));
        let wait = next_early.take().map_or(wait, |early| wait.min(early));
        let Some((woken, short)) = nap(&weak, Instant::now() + wait, poll) else {
            return;
        };
        if woken {
            if let Some(a) = account.as_mut() {
                a.woken();
            }
        }
        let now = Instant::now();
        if now < earliest {
            std::thread::sleep(earliest - now);
        }
        let Some(inner) = weak.upgrade() else { return };
        if inner.bg_stop.load(Ordering::SeqCst) {
            return;
        }
        relieve(&inner, &mut relieved_at);
        if let Some(a) = account.as_ref().filter(|_| !short) {
            let fresh = inner.lock().stats.fresh_pages;
            if !a.may_scan(sys::process_cpu_ns(), fresh) {
                inner.lock().stats.scans_deferred += 1;
                continue;
            }
        }
        let rep = scan(&inner, tier);
        drop(inner);
        if let Some(a) = account.as_mut() {
            a.record(rep.cpu_ns, rep.merged + rep.zero_folded, rep.volatile > 0);
        }
        let share = if rep.pass && short {
            budget.max(PRESSURE_CPU)
        } else {
            budget
        };
        earliest = Instant::now() + Duration::from_nanos(rep.cpu_ns).mul_f64(1.0 / share - 1.0);
        // Pages frozen for the pin age are folded by the first scan after it.
        next_early = (rep.frozen > 0).then_some(pin_age);
    }
}

/// While memory is short (at the last look, pressure.rs), calls the
/// caller's relief (`Engine::on_memory_short`) if it has one, at most once
/// a clock interval, outside the lock.
fn relieve(inner: &Inner, relieved_at: &mut Option<Instant>) {
    let Some(relief) = inner.relief.get() else {
        return;
    };
    if relieved_at.is_some_and(|t| t.elapsed() < inner.cfg.clock_interval)
        || !inner.lock().clock.pressure
    {
        return;
    }
    *relieved_at = Some(Instant::now());
    let released = relief();
    let mut st = inner.lock();
    st.clock.stats.reliefs += 1;
    st.clock.stats.reliefs_released += released as u64;
}

/// Fraction of a core the background scanner may use while memory is short.
pub const PRESSURE_CPU: f64 = 0.25;

/// Sleeps until `due` or a wake-up; with a pressure poll, looks at memory
/// every `poll` meanwhile and stops early when it is short and a pass is
/// due. Returns (woken, short); None when the engine is gone or stopping.
fn nap(weak: &Weak<Inner>, due: Instant, poll: Option<Duration>) -> Option<(bool, bool)> {
    loop {
        let parked = Instant::now();
        let left = due.saturating_duration_since(parked);
        let nap = poll.map_or(left, |p| left.min(p));
        std::thread::park_timeout(nap);
        let woken = parked.elapsed() < nap;
        let inner = weak.upgrade()?;
        if inner.bg_stop.load(Ordering::SeqCst) {
            return None;
        }
        let short = match poll.and_then(|_| inner.read_pressure()) {
            Some(r) => inner.lock().pressure_pass_due(r),
            None => false,
        };
        if woken || short || Instant::now() >= due {
            return Some((woken, short));
        }
    }
}

impl State {
    /// Whether a scan may read pages to fold and merge them. Not while
    /// memory is short and the kernel can swap, outside clock passes:
    /// reading a page sets its accessed bit, and the kernel's reclaim takes
    /// a page so marked for one in use. A scan that reads every resident
    /// page tells it that the program uses them all, and it swaps out the
    /// pages the program does use: R's lda at half its peak, with the
    /// looks, 1.16-1.31 of plain's wall and more pages swapped in. Kernel
    /// KSM reads pages without marking them; user space cannot.
    fn looks_allowed(&self, pass: bool, reading: Option<crate::pressure::Reading>) -> bool {
        pass || !(self.clock.pressure && reading.is_some_and(|r| r.kernel_swaps()))
    }

    /// The scan's work on protected pages `[i, i+c)` of a block (chunk.rs),
    /// the pages `due` a look; returns the holds that go on.
    #[allow(clippy::too_many_arguments)]
    fn scan_chunk(
        &mut self,
        base: usize,
        i: usize,
        c: usize,
        chunk: &Protected,
        due: Vec<usize>,
        unstable: &mut Unstable,
        rep: &mut ScanReport,
        pass: Option<&mut Pass>,
    ) -> Vec<(usize, Instant)> {
        let (held, protector) = (&chunk.held, &chunk.protector);
        let guard = self.pin_guard();
        let mut keep = Vec::new();
        if let Some(resident) = &chunk.resident {
            let looked = self.looked_pages(base, i, &due, resident);
            // Under the pin guard only pages it can take off safely are candidates.
            let (zero, nonzero): (Vec<usize>, Vec<usize>) = looked
                .iter()
                .filter(|&&k| !guard || self.guarded(base, k))
                .partition(|&&k| sys::is_zero(self.fold_content(base, k)));
            rep.pages_scanned += looked.len() as u64;
            let zero = self.settled(base, zero, true, rep);
            let nonzero = self.settled(base, nonzero, false, rep);
            let mut zero = if self.cfg.zero { zero } else { Vec::new() };
            // Under the guard an owned page is only frozen now (see
            // `guarded`), or if zero held: below.
            let mut to_freeze: Vec<usize> = Vec::new();
            if self.freeze_first() && !self.holds_wanted() {
                self.freeze_owned_zero(base, &mut zero, &mut to_freeze);
            }
            // A merge costs up to two mappings for the page and two for its partner.
            // Without room for that, the duplicates are only counted, for
            // handing the block to KSM when it runs (ksm.rs).
            let mut plan = HashMap::new();
            if self.cfg.merge && self.vma_room(4) {
                plan = self.plan_merges(base, i..i + c, &nonzero, unstable, &mut to_freeze);
            } else if self.cfg.merge && self.ksm.ready() {
                self.count_unmergeable(base, &nonzero, unstable);
            }
            // A diverged page or an owned zero page not yet held for the
            // pin age is only held now (the first one starts the fault
            // thread that ends holds); without holds, the old ways.
            let holdable = |k: &usize| {
                matches!(
                    self.blocks[&base].pages[*k],
                    Page::Diverged(_) | Page::Owned(_)
                )
            };
            let any_holdable = zero.iter().any(holdable) || plan.keys().any(holdable);
            let holds_on = self.holding() || (any_holdable && self.holds_on());
            let to_hold = if holds_on {
                self.unready_held(base, &mut zero, &mut plan, held)
            } else {
                self.drop_young_diverged(base, &mut zero, &mut plan);
                if self.freeze_first() {
                    self.freeze_owned_zero(base, &mut zero, &mut to_freeze);
                }
                Vec::new()
            };
            // Without holds diverged pages have no pin test, nor owned ones
            // with no pin age: the grace is all they get.
            let untested = |k: &usize| match self.blocks[&base].pages[*k] {
                Page::Owned(_) | Page::Diverged(_) => !holds_on,
                _ => false,
            };
            let graced = !guard || zero.iter().any(untested) || plan.keys().any(untested);
            if graced && (!zero.is_empty() || !plan.is_empty()) {
                self.let_pinned_writes_land(base, &mut zero, &mut plan, rep);
            }
            self.fold_zero(base, &mut zero, guard, rep);
            self.apply_merges(base, &plan, guard, rep);
            to_freeze.sort_unstable();
            to_freeze.dedup();
            rep.frozen += to_freeze.len() as u64;
            for (a, b) in crate::space::consecutive(&to_freeze) {
                self.freeze_young(base, a, b - a);
            }
            keep = self.hold_pages(base, &to_hold, held, protector, rep);
            let mut waiting = to_freeze;
            waiting.extend_from_slice(&to_hold);
            waiting.sort_unstable();
            self.record_looks(base, &looked, &zero, &plan, &waiting);
            if let Some(pass) = pass {
                let block = &self.blocks[&base];
                let present: Vec<usize> = due
                    .into_iter()
                    .filter(|&k| {
                        resident[k - i] & 1 != 0
                            && !block.pages[k].is_evicted()
                            && zero.binary_search(&k).is_err()
                            && to_hold.binary_search(&k).is_err()
                    })
                    .collect();
                self.clock_chunk(base, i..i + c, &present, pass);
            }
        }
        keep
    }

    /// The look at the pages `due` of chunk `[i, i+c)` without protecting
    /// it, outside clock passes. Reading a page a writer may be changing is
    /// harmless here: nothing is acted on. If a page may be folded or merged
    /// (`may_act`), or the chunk has holds, or merging is off or out of
    /// mappings, returns true and records nothing: the protected look
    /// (`scan_chunk`) decides, reading every page again. Otherwise records
    /// what that look would have: each page's look (`settled`,
    /// `record_looks`) and the settled pages in the scan's unstable index,
    /// where a later duplicate finds them (and `promote` protects and
    /// compares them before anything is shared); returns false.
    fn look_unprotected(
        &mut self,
        base: usize,
        i: usize,
        c: usize,
        due: &[usize],
        unstable: &mut Unstable,
        rep: &mut ScanReport,
    ) -> bool {
        let addr = self.blocks[&base].page_addr(i);
        if !(self.cfg.merge && self.vma_room(4)) || self.holds.any_within(addr as usize, c * PAGE) {
            return true;
        }
        let mut resident = vec![0u8; c];
        if sys::mincore(addr, c * PAGE, &mut resident).is_err() {
            return true;
        }
        let looked = self.looked_pages(base, i, due, &resident);
        let guard = self.pin_guard();
        let candidates: Vec<usize> = looked
            .iter()
            .copied()
            .filter(|&k| !guard || self.guarded(base, k))
            .collect();
        let mut zero = Vec::new();
        if self.may_act(base, &candidates, unstable, &mut zero) {
            return true;
        }
        rep.pages_scanned += looked.len() as u64;
        // Zero pages here changed since their last look: recorded as zero.
        // may_act read every candidate, none shared, and noted the zero ones.
        let nonzero: Vec<usize> = candidates
            .into_iter()
            .filter(|k| zero.binary_search(k).is_err())
            .collect();
        self.settled(base, zero, true, rep);
        for k in self.settled(base, nonzero, false, rep) {
            let ptr = self.blocks[&base].page_addr(k);
            unstable.insert(ptr, (base, k), |(qb, qi)| self.unstable_content(qb, qi));
        }
        self.record_looks(base, &looked, &[], &HashMap::new(), &[]);
        false
    }

    /// The pages of `due` (in the chunk starting at page `i`) a look reads:
    /// holding content by mincore's `resident`, not evicted (reading one
    /// would restore it), and not shared pages whose frame is indexed.
    fn looked_pages(&self, base: usize, i: usize, due: &[usize], resident: &[u8]) -> Vec<usize> {
        let looked: Vec<usize> = due
            .iter()
            .copied()
            .filter(|&k| resident[k - i] & 1 != 0 && !self.blocks[&base].pages[k].is_evicted())
            .filter(|&k| !self.already_indexed(base, k))
            .collect();
        let zero_mapped = self.mapping_the_zero_page(base, &looked);
        looked
            .into_iter()
            .filter(|k| zero_mapped.binary_search(k).is_err())
            .collect()
    }

    /// Of `pages` (sorted), the anonymous pages folded as zero by their
    /// previous look that the program has only read since (sorted): they
    /// map the kernel's shared zero page, which mincore counts as resident
    /// but which holds no memory of the program's, so there is nothing to
    /// fold again.
    fn mapping_the_zero_page(&self, base: usize, pages: &[usize]) -> Vec<usize> {
        let block = &self.blocks[&base];
        let folded: Vec<usize> = pages
            .iter()
            .copied()
            .filter(|&k| block.pages[k] == Page::Anon && crate::seen::folded_zero(block.seen[k]))
            .collect();
        self.unwritten_since_fold(base, &folded)
    }

    /// Whether one of `pages` (of block `base`) may be folded or merged by
    /// a protected look: it is a shared page whose frame is not indexed yet,
    /// or it looks as at its previous look and is zero or a duplicate (of a
    /// frame in the stable index, of a page earlier in this scan, or of
    /// another page of `pages`). Changes nothing but the indexes' entries
    /// found stale. The pages read before the answer that are zero go to
    /// `zero` (in order): all of `pages` that are zero when it says no.
    fn may_act(
        &mut self,
        base: usize,
        pages: &[usize],
        unstable: &mut Unstable,
        zero_pages: &mut Vec<usize>,
    ) -> bool {
        let mut samples = std::collections::HashSet::with_capacity(pages.len());
        let mut stable = std::mem::take(&mut self.stable);
        let found = pages.iter().any(|&k| {
            let ptr = self.blocks[&base].page_addr(k);
            let own = self.blocks[&base].pages[k];
            if matches!(own, Page::Shared(_)) {
                return true;
            }
            let zero = sys::is_zero(self.fold_content(base, k));
            if zero {
                zero_pages.push(k);
            }
            if !self.looks_as_before(base, k, zero) {
                return false;
            }
            zero || !samples.insert(sample_hash(ptr))
                || stable
                    .find(ptr, |f| self.stable_content(f))
                    .is_some_and(|f| own.frame() != Some(f))
                || unstable
                    .find(ptr, |(qb, qi)| self.unstable_content(qb, qi))
                    .is_some_and(|q| q != (base, k))
        });
        self.stable = stable;
        found
    }

    /// Whether `settled` would keep page `k` (not shared) of block `base`,
    /// without recording the look.
    fn looks_as_before(&self, base: usize, k: usize, zero: bool) -> bool {
        let block = &self.blocks[&base];
        !self.cfg.volatile_check
            || block.seen[k] & crate::seen::LOOK_MASK == look(block.page_addr(k), zero)
    }

    /// Moves the owned pages of `zero` to `to_freeze`: under the guard, an
    /// owned page is frozen before it is folded (see `guarded`).
    fn freeze_owned_zero(&self, base: usize, zero: &mut Vec<usize>, to_freeze: &mut Vec<usize>) {
        let owned = |k: usize| matches!(self.blocks[&base].pages[k], Page::Owned(_));
        to_freeze.extend(zero.iter().copied().filter(|&k| owned(k)));
        zero.retain(|&k| !owned(k));
    }

    /// The pages of `[i, i+c)` this scan looks at (see idle.rs; a clock
    /// pass looks at every page the policy may act on, clock.rs); counts the others.
    fn due_pages(
        &self,
        base: usize,
        i: usize,
        c: usize,
        pass: bool,
        rep: &mut ScanReport,
    ) -> Vec<usize> {
        let block = &self.blocks[&base];
        let (seen, found) = (&block.seen, block.found);
        let scan_no = self.stats.scans;
        // A clock pass classifies every page: it samples nothing, and no block rests.
        if !pass && self.cfg.churn_rest && !found.due_in(scan_no) {
            rep.skipped_idle += c as u64;
            return Vec::new();
        }
        let sampled = |k: usize| pass || !self.cfg.sample_scan || found.due(k);
        let due: Vec<usize> = (i..i + c)
            .filter(|&k| {
                pass && crate::seen::wanted(seen[k])
                    || sampled(k) && (!self.cfg.smart_scan || idle::due(seen[k], scan_no))
            })
            .collect();
        rep.skipped_idle += (c - due.len()) as u64;
        due
    }

    /// Raises the idle level of the pages looked at and left alone; resets
    /// it for those folded, merged or frozen (`zero` and `frozen` sorted). A
    /// planned merge the mapping budget refused leaves its page alone: it
    /// is looked at as seldom as a page with nothing to share, so the
    /// duplicates the budget cannot take cost an idle program little.
    fn record_looks(
        &mut self,
        base: usize,
        looked: &[usize],
        zero: &[usize],
        plan: &HashMap<usize, FrameId>,
        frozen: &[usize],
    ) {
        let Some(block) = self.blocks.get_mut(&base) else {
            return;
        };
        let n = block.seen.len();
        for &k in looked.iter().filter(|&&k| k < n) {
            let merged = plan
                .get(&k)
                .is_some_and(|&f| block.pages[k] == Page::Shared(f));
            let acted =
                merged || zero.binary_search(&k).is_ok() || frozen.binary_search(&k).is_ok();
            block.seen[k] = idle::after_look(block.seen[k], acted);
            block.found.acted(acted as usize);
        }
        block.found.looked(looked.len());
    }

    /// The pages that look as they did to the previous scan; records what
    /// this scan saw, and a change as a write for the clock. Shared pages
    /// need no check: their frame cannot change.
    fn settled(
        &mut self,
        base: usize,
        pages: Vec<usize>,
        zero: bool,
        rep: &mut ScanReport,
    ) -> Vec<usize> {
        let check = self.cfg.volatile_check;
        if !check && self.cfg.tier == Tier::Off {
            return pages;
        }
        // Driven by pressure, passes wait for memory to run short: until then
        // a page's write counts until a later look finds it unchanged, so
        // the first pass under pressure knows which pages are cold.
        let forget_writes = self.cfg.tier == Tier::Pressure && !self.clock.pressure;
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let before = pages.len();
        let mut refilled = 0;
        let mut refolds = Vec::new();
        let kept: Vec<usize> = pages
            .into_iter()
            .filter(|&k| {
                if matches!(block.pages[k], Page::Shared(_)) {
                    return true;
                }
                let look = look(block.page_addr(k), zero);
                let before = block.seen[k];
                let same = before & crate::seen::LOOK_MASK == look;
                refilled += (!zero && crate::seen::folded_zero(before)) as u64;
                if zero && crate::seen::folded_zero(before) {
                    refolds.push(k);
                }
                block.seen[k] = crate::seen::with_look(before, look);
                if !same {
                    block.seen[k] = crate::seen::written(block.seen[k]);
                    block.found.turned_zero(zero as usize);
                } else if forget_writes {
                    block.seen[k] &= !crate::seen::WRITTEN;
                }
                same || !check
            })
            .collect();
        rep.volatile += (before - kept.len()) as u64;
        // A page acted on as zero was folded if it is anonymous or owned
        // and not held (an owned zero page may be held before its fold,
        // hold.rs; shared and diverged ones change kind when folded).
        refolds.retain(|&k| {
            let block = &self.blocks[&base];
            match block.pages[k] {
                Page::Anon => true,
                Page::Owned(_) => !self.is_held(block.page_addr(k) as usize),
                _ => false,
            }
        });
        refolds.sort_unstable();
        let unwritten = self.unwritten_since_fold(base, &refolds);
        let refilled = refilled + (refolds.len() - unwritten.len()) as u64;
        if let Some(block) = self.blocks.get_mut(&base) {
            block.found.undone(refilled as usize);
        }
        self.stats.zero_refilled += refilled;
        // Those only read since their fold hold no memory: nothing to fold.
        kept.into_iter()
            .filter(|k| unwritten.binary_search(k).is_err())
            .collect()
    }

    /// Of the anonymous and owned pages `folded` (sorted), folded as zero by
    /// the previous look and zero again at this one, those that hold no
    /// memory again (sorted). The others were written: the program wrote
    /// zeros into them (a simulation updating an array in place), which
    /// faulted in a page the fold had freed. An anonymous page that is only
    /// read maps the kernel's shared zero page, which pagemap shows as not
    /// exclusively mapped; an owned page a look reads has data in its frame.
    fn unwritten_since_fold(&self, base: usize, folded: &[usize]) -> Vec<usize> {
        let (Some(&first), Some(&last)) = (folded.first(), folded.last()) else {
            return Vec::new();
        };
        let block = &self.blocks[&base];
        let mut entries = vec![0u64; last - first + 1];
        let anon_read = self
            .pagemap
            .as_ref()
            .is_some_and(|pm| pm.read(block.page_addr(first), &mut entries).is_ok());
        let written = |k: usize| match block.pages[k] {
            // Without pagemap, as if written: folded again, as it always may be.
            Page::Anon => !anon_read || entries[k - first] & sys::PM_MMAP_EXCLUSIVE != 0,
            _ => true,
        };
        folded.iter().copied().filter(|&k| !written(k)).collect()
    }

    /// Write protection stops writes through the page table, not writes
    /// through a page the kernel pinned before (O_DIRECT reads in flight,
    /// process_vm_writev). Kernel KSM skips pages with extra references; user
    /// space cannot see those. So before acting, wait `pin_grace` for such
    /// writes to land, then check every planned page again and drop the ones
    /// that changed. This narrows the race to pins older than the grace
    /// whose write lands within microseconds of the check; it does not close it.
    fn let_pinned_writes_land(
        &mut self,
        base: usize,
        zero: &mut Vec<usize>,
        plan: &mut HashMap<usize, FrameId>,
        rep: &mut ScanReport,
    ) {
        if !self.cfg.pin_grace.is_zero() {
            std::thread::sleep(self.cfg.pin_grace);
        }
        let before = zero.len() + plan.len();
        zero.retain(|&k| sys::is_zero(self.fold_content(base, k)));
        plan.retain(|&k, f| {
            let pool = &self.pools[f.pool()];
            page_eq(self.fold_content(base, k), pool.frame_ptr(f.slot()))
        });
        rep.changed_while_planned += (before - zero.len() - plan.len()) as u64;
    }

    /// A page the pin guard can act on. Anonymous pages are taken off with
    /// the pin test. A shared page's frame is immutable (a write through a
    /// pin taken now makes the kernel copy the page first: it diverges), but
    /// a frame the scan froze from an owned page may still receive writes
    /// through pins taken before the freeze, so it waits `pin_age` (young).
    /// An owned page (mapped shared: a pin writes its frame) with something
    /// to fold or merge is frozen in place, which loses no write; it acts as
    /// a shared page once its frame is no longer young. A diverged page's
    /// private copy lives in a file mapping, which cannot be moved: it gets
    /// the pin grace and the rule that a page just diverged is not settled,
    /// and with a pin age it waits that long after diverging (a write pin
    /// that forced the copy is younger than the copy).
    fn guarded(&self, base: usize, k: usize) -> bool {
        match self.blocks[&base].pages[k] {
            Page::Anon | Page::Owned(_) => true,
            // Held first (hold.rs) when holds are asked for.
            Page::Diverged(_) => {
                self.holds_wanted() || !self.young_page(self.blocks[&base].page_addr(k) as usize)
            }
            Page::Shared(f) => !self.young(f),
            Page::Evicted(_) => false,
        }
    }

    /// A shared page whose frame an earlier scan checked: nothing can have changed.
    fn already_indexed(&self, base: usize, k: usize) -> bool {
        match self.blocks[&base].pages[k] {
            Page::Shared(f) => self.pools[f.pool()].is_indexed(f.slot()),
            _ => false,
        }
    }

    /// What a zero fold of page `k` would discard: for a shared page the frame
    /// itself (punching it affects every page mapping it), else the page.
    fn fold_content(&self, base: usize, k: usize) -> *const u8 {
        match self.blocks[&base].pages[k] {
            Page::Shared(f) => self.pools[f.pool()].frame_ptr(f.slot()),
            _ => self.blocks[&base].page_addr(k),
        }
    }

    /// Folds the all-zero pages at indices `zero` (sorted) of a block; drops
    /// from `zero` the pages the pin guard left alone.
    fn fold_zero(&mut self, base: usize, zero: &mut Vec<usize>, guard: bool, rep: &mut ScanReport) {
        let zero_runs = {
            let pages = &self.blocks[&base].pages;
            state_runs(zero, |k| pages[k])
        };
        for (a, b) in zero_runs {
            let page = self.blocks[&base].pages[a];
            let addr = self.blocks[&base].page_addr(a);
            let n = b - a;
            if guard && page == Page::Anon {
                let left = self.fold_anon_zero(base, a, n);
                zero.retain(|k| !left.contains(k));
                rep.zero_folded += (n - left.len()) as u64;
                self.stats.zero_folded += (n - left.len()) as u64;
                continue;
            }
            let folded = match page {
                Page::Anon => sys::madvise(addr, n * PAGE, libc::MADV_DONTNEED).is_ok(),
                Page::Diverged(_) => {
                    let ok = self.remap(base, a, n, None);
                    rep.skipped_vma += !ok as u64;
                    ok
                }
                Page::Owned(f) | Page::Shared(f) => {
                    let pool = &self.pools[f.pool()];
                    !pool.retired && sys::punch(pool.fd, f.slot(), n as u64).is_ok()
                }
                Page::Evicted(_) => false,
            };
            if folded {
                rep.zero_folded += n as u64;
                self.stats.zero_folded += n as u64;
            }
        }
    }

    /// Finds, for the non-zero pages at indices `pages` of a block (all inside
    /// the protected `chunk`), frozen frames with the same content: page -> frame.
    fn plan_merges(
        &mut self,
        base: usize,
        chunk: std::ops::Range<usize>,
        pages: &[usize],
        unstable: &mut Unstable,
        to_freeze: &mut Vec<usize>,
    ) -> HashMap<usize, FrameId> {
        let freeze_first = self.freeze_first();
        let mut plan: HashMap<usize, FrameId> = HashMap::new();
        // Out of `self` while in use, so lookups can read frames and pages.
        let mut stable = std::mem::take(&mut self.stable);
        let mut idx = 0;
        while idx < pages.len() {
            let k = pages[idx];
            idx += 1;
            // A shared page is read through the frame window: a read through
            // the block's own mapping would map the frame there, and a
            // later write to the page would then fault twice (read-only
            // mapping, then copy-on-write) where it faults once.
            let ptr = self.fold_content(base, k);
            let own = self.blocks[&base].pages[k];
            let frame_content = |f: FrameId| self.stable_content(f);
            // Under the guard an owned page with a match is frozen for now.
            let owned = freeze_first && matches!(own, Page::Owned(_));
            if let Some(f) = stable
                .find(ptr, frame_content)
                .filter(|&f| own.frame() != Some(f))
            {
                if owned {
                    to_freeze.push(k);
                } else {
                    plan.insert(k, f);
                }
                continue;
            }
            if let Page::Shared(f) = own {
                // Already a frozen frame: it can serve as the stable copy itself.
                stable.insert(ptr, f, |f| self.stable_content(f));
                self.pools[f.pool()].set_indexed(f.slot());
                continue;
            }
            let page_content = |(qb, qi): (usize, usize)| self.unstable_content(qb, qi);
            match unstable.find(ptr, page_content) {
                Some((qb, qi)) if owned && (qb, qi) != (base, k) => to_freeze.push(k),
                Some((qb, qi)) if (qb, qi) != (base, k) => {
                    // The pages after this one often repeat the pages after
                    // the partner (a block computed twice): promote them as one run.
                    let n = self.partner_run(
                        base,
                        &pages[idx - 1..],
                        (qb, qi),
                        &plan,
                        &mut stable,
                        unstable,
                    );
                    let frames = self.promote(qb, qi, n, base, k, &chunk);
                    if frames[0].is_none() {
                        // The partner cannot serve (pinned, changed): this page
                        // is the next duplicate's partner instead.
                        unstable.replace(ptr, (base, k), |(qb, qi)| self.unstable_content(qb, qi));
                    }
                    // Pages after the first that did not promote go the usual way.
                    let took = 1 + frames[1..].iter().take_while(|f| f.is_some()).count();
                    // The partner's block yielded too: if it was sampled, its
                    // other pages must be looked at for their duplicates here.
                    if frames[0].is_some() {
                        if let Some(b) = self.blocks.get_mut(&qb) {
                            b.found.acted(took);
                        }
                    }
                    for (j, f) in frames.into_iter().enumerate().take(took) {
                        let Some(f) = f else { continue };
                        stable.insert(self.blocks[&base].page_addr(k + j), f, |f| {
                            self.stable_content(f)
                        });
                        plan.insert(k + j, f);
                    }
                    idx += took - 1;
                }
                Some(_) => {}
                None => unstable.insert(ptr, (base, k), page_content),
            }
        }
        self.stable = stable;
        plan
    }

    /// The bytes of a frame that may serve as a merge target: frozen, in use
    /// and resident (reading a punched frame through the window would
    /// allocate it).
    fn stable_content(&self, f: FrameId) -> Option<*const u8> {
        let pool = &self.pools[f.pool()];
        (pool.is_stable(f.slot()) && pool.resident(f.slot())).then(|| pool.frame_ptr(f.slot()))
    }

    /// With no mapping to spare for a merge, counts the pages of block
    /// `base` at indices `pages` that duplicate a page seen earlier in this
    /// scan: merges the budget refuses. Nothing is remapped; only hashes
    /// are taken and compared.
    fn count_unmergeable(&mut self, base: usize, pages: &[usize], unstable: &mut Unstable) {
        let mut found = 0;
        for &k in pages {
            let ptr = self.blocks[&base].page_addr(k);
            let content = |(qb, qi): (usize, usize)| self.unstable_content(qb, qi);
            match unstable.find(ptr, content) {
                Some(q) if q != (base, k) => found += 1,
                Some(_) => {}
                None => unstable.insert(ptr, (base, k), content),
            }
        }
        self.refused_merges(base, found);
    }

    /// The bytes of page `qi` of block `qb`, an unstable index entry: a page
    /// seen earlier in this scan may have been freed, cut off or exempted (and
    /// protected) since, between two chunks.
    fn unstable_content(&self, qb: usize, qi: usize) -> Option<*const u8> {
        self.blocks
            .get(&qb)
            .filter(|b| !b.exempt && qi < b.pages.len() && !b.pages[qi].is_evicted())
            .map(|b| b.page_addr(qi) as *const u8)
    }

    /// How many of `pages` (sorted, from the page that hit its partner
    /// `qi` of block `qb`) run on consecutively with partners `qi + j` of
    /// equal content, resident, on frames, not planned elsewhere and not a
    /// stable hit themselves: at least 1. Each partner must be the unstable
    /// index's own entry for that content, so it passed the volatility check
    /// at its look as the first partner did. Checked again under protection.
    fn partner_run(
        &self,
        base: usize,
        pages: &[usize],
        (qb, qi): (usize, usize),
        plan: &HashMap<usize, FrameId>,
        stable: &mut ContentIndex<FrameId>,
        unstable: &mut Unstable,
    ) -> usize {
        let (k, block) = (pages[0], &self.blocks[&base]);
        let Some(q) = self.blocks.get(&qb).filter(|q| !q.exempt) else {
            return 1;
        };
        // The partner run must end before this run starts (same block: qi < k).
        let limit = if qb == base {
            k.saturating_sub(qi)
        } else {
            usize::MAX
        };
        let mut m = 1;
        while m < pages.len() && m < limit && pages[m] == k + m && qi + m < q.pages.len() {
            m += 1;
        }
        if m == 1 {
            return 1;
        }
        // Reading a partner that holds nothing would allocate it.
        let mut resident = vec![0u8; m];
        if sys::mincore(q.page_addr(qi), m * PAGE, &mut resident).is_err() {
            return 1;
        }
        let mut n = 1;
        while n < m {
            let ours = block.pages[k + n];
            let partner_present = resident[n] & 1 != 0 && !q.pages[qi + n].is_evicted();
            let ours_mergeable = if self.freeze_first() {
                matches!(ours, Page::Anon | Page::Diverged(_))
            } else {
                !matches!(ours, Page::Shared(_) | Page::Evicted(_))
            };
            let planned_elsewhere = qb == base && plan.contains_key(&(qi + n));
            let fits = partner_present
                && ours_mergeable
                && !planned_elsewhere
                && stable
                    .find(block.page_addr(k + n), |f| self.stable_content(f))
                    .is_none()
                && unstable.find(block.page_addr(k + n), |(b, i)| self.unstable_content(b, i))
                    == Some((qb, qi + n));
            if !fits {
                break;
            }
            n += 1;
        }
        n
    }

    /// Turns pages `qi..qi+n` of block `qb` into frozen frames, each if its
    /// content still equals page `k + j` of block `base`. Pages outside the
    /// protected chunk are protected for the comparison, all in one go.
    fn promote(
        &mut self,
        qb: usize,
        qi: usize,
        n: usize,
        base: usize,
        k: usize,
        chunk: &std::ops::Range<usize>,
    ) -> Vec<Option<FrameId>> {
        let none = vec![None; n];
        let Some(q) = self
            .blocks
            .get(&qb)
            .filter(|b| !b.exempt && qi + n <= b.pages.len())
        else {
            return none;
        };
        let qaddr = q.page_addr(qi);
        if qb == base && chunk.contains(&qi) && chunk.contains(&(qi + n - 1)) {
            return self.frames_for(qb, qi, n, base, k);
        }
        if qb == base && qi < chunk.start && qi + n > chunk.start {
            // A run reaching into the chunk from before it: only its part
            // outside is protected and registered here (doing so for the
            // rest would unprotect and unregister part of the chunk under
            // its work); the pages inside go the usual way.
            let mut frames = self.promote(qb, qi, chunk.start - qi, base, k, chunk);
            frames.resize(n, None);
            return frames;
        }
        self.with_registered(qb, qi, n, |st| {
            let Some(protector) = st.protector.clone() else {
                return none;
            };
            st.drop_holds(qaddr as usize, n * PAGE);
            if protector.protect(qaddr, n * PAGE).is_err() {
                let _ = protector.unprotect(qaddr, n * PAGE);
                return none;
            }
            st.refresh_divergence(qb, qi, n);
            let frames = st.frames_for(qb, qi, n, base, k);
            let _ = protector.unprotect(qaddr, n * PAGE);
            frames
        })
    }

    /// Frozen frames holding protected pages `qi..qi+n` of block `qb`, each
    /// of which must equal page `k + j` of block `base` (None where not).
    /// Owned pages are frozen as runs: one remap for consecutive frames.
    fn frames_for(
        &mut self,
        qb: usize,
        qi: usize,
        n: usize,
        base: usize,
        k: usize,
    ) -> Vec<Option<FrameId>> {
        let mut resident = vec![0u8; n];
        if sys::mincore(self.blocks[&qb].page_addr(qi), n * PAGE, &mut resident).is_err() {
            return vec![None; n];
        }
        let ours = |st: &State, j: usize| st.blocks[&base].page_addr(k + j);
        let guard = self.guard_on();
        let equal: Vec<bool> = (0..n)
            .map(|j| {
                let q = &self.blocks[&qb];
                resident[j] & 1 != 0
                    && !q.pages[qi + j].is_evicted()
                    && (!guard || self.guarded(qb, qi + j))
                    && page_eq(q.page_addr(qi + j), ours(self, j))
            })
            .collect();
        let mut j = 0;
        while j < n {
            let end = (j..n).find(|&e| !equal[e]).unwrap_or(n);
            if end > j {
                self.freeze_young(qb, qi + j, end - j);
            }
            j = end + 1;
        }
        // Under the guard only anonymous pages can be taken off safely.
        let anon = |st: &State, j: usize| match st.blocks[&qb].pages[qi + j] {
            Page::Anon => equal[j],
            Page::Diverged(_) => equal[j] && !guard,
            _ => false,
        };
        let wanted: Vec<usize> = (0..n).filter(|&j| anon(self, j)).collect();
        let mut materialized = self.materialize(qb, qi, &wanted);
        (0..n)
            .map(|j| {
                if !equal[j] {
                    return None;
                }
                match self.blocks[&qb].pages[qi + j] {
                    // The frame is what the partner will map: compare that, not the page.
                    Page::Shared(_) if materialized.contains_key(&j) => materialized.remove(&j),
                    // Frozen from an owned page just now: not shared before `pin_age`.
                    Page::Shared(f) if self.young(f) => None,
                    Page::Shared(f) => {
                        page_eq(self.pools[f.pool()].frame_ptr(f.slot()), ours(self, j))
                            .then_some(f)
                    }
                    Page::Anon | Page::Diverged(_) | Page::Owned(_) | Page::Evicted(_) => None,
                }
            })
            .collect()
    }

    /// Copies protected anonymous pages `qi + j` (for each j in `js`, sorted)
    /// of block `qb` into new frames, consecutive pages into consecutive
    /// frames, and maps them there as runs: j -> frame for those that did.
    /// The remap discards the anonymous pages, so a write through a pin taken
    /// before the protection is given one grace (for all pages together) to
    /// land first, and a page is taken only if it did not change meanwhile.
    fn materialize(&mut self, qb: usize, qi: usize, js: &[usize]) -> HashMap<usize, FrameId> {
        let mut out = HashMap::new();
        let Some(pi) = self.current_pool() else {
            return out;
        };
        // Runs of consecutive j, each written into a run of fresh frames.
        let mut written: Vec<(usize, usize, u64)> = Vec::new();
        let fd = self.pools[pi].fd;
        let mut a = 0;
        while a < js.len() {
            let mut b = a + 1;
            while b < js.len() && js[b] == js[b - 1] + 1 {
                b += 1;
            }
            let (j0, len) = (js[a], b - a);
            if let Some(slot) = self.pools[pi].alloc(len as u64) {
                let addr = self.blocks[&qb].page_addr(qi + j0);
                if sys::pwrite_all(fd, addr, len * PAGE, slot * PAGE as u64).is_ok() {
                    written.push((j0, len, slot));
                } else {
                    self.pools[pi].abandon(slot, len as u64);
                }
            }
            a = b;
        }
        if written.is_empty() {
            return out;
        }
        if self.guard_on() {
            for (j0, len, slot) in written {
                self.materialize_guarded(qb, qi + j0, len, FrameId::new(pi, slot), &mut out, j0);
            }
            return out;
        }
        if !self.cfg.pin_grace.is_zero() {
            std::thread::sleep(self.cfg.pin_grace);
        }
        for (j0, len, slot) in written {
            let unchanged: Vec<bool> = (0..len)
                .map(|t| {
                    let addr = self.blocks[&qb].page_addr(qi + j0 + t);
                    page_eq(addr, self.pools[pi].frame_ptr(slot + t as u64))
                })
                .collect();
            let mut t = 0;
            while t < len {
                let end = (t..len)
                    .find(|&e| unchanged[e] != unchanged[t])
                    .unwrap_or(len);
                let (first, cnt) = (slot + t as u64, (end - t) as u64);
                let f = FrameId::new(pi, first);
                if unchanged[t] && self.remap(qb, qi + j0 + t, end - t, Some(f)) {
                    for u in 0..cnt {
                        self.pools[pi].freeze(first + u);
                        out.insert(j0 + t + u as usize, f.offset(u));
                    }
                } else {
                    self.pools[pi].abandon(first, cnt);
                }
                t = end;
            }
        }
        out
    }

    /// Maps anonymous pages `[i, i+len)` of block `qb` onto the fresh frames
    /// `first..` holding copies of them, each page the pin guard takes off
    /// (frozen, recorded in `out` under `j0 + j`); frames of the others go back.
    fn materialize_guarded(
        &mut self,
        qb: usize,
        i: usize,
        len: usize,
        first: FrameId,
        out: &mut HashMap<usize, FrameId>,
        j0: usize,
    ) {
        let pi = first.pool();
        for (p, plen) in self.scratch_pieces(i, len) {
            let f0 = first.offset((p - i) as u64);
            let frame =
                move |st: &State, j: usize| Some(st.pools[pi].frame_ptr(f0.slot() + j as u64));
            let d = self.detach(qb, p, plen, &frame);
            let mut mapped = vec![false; plen];
            for (x, y) in d.taken_runs() {
                if self.remap(qb, p + x, y - x, Some(f0.offset(x as u64))) {
                    mapped[x..y].iter_mut().for_each(|m| *m = true);
                } else {
                    (x..y).for_each(|j| self.reattach(&d, j));
                }
            }
            self.finish_detach(d);
            for (j, m) in mapped.into_iter().enumerate() {
                let f = f0.offset(j as u64);
                if m {
                    self.pools[pi].freeze(f.slot());
                    out.insert(j0 + (p - i) + j, f);
                } else {
                    self.pools[pi].abandon(f.slot(), 1);
                }
            }
        }
    }

    /// Folds the zero anonymous pages `[a, a+n)`: those the pin guard takes
    /// off stay holes, which read as zero; returns the pages left alone.
    fn fold_anon_zero(&mut self, base: usize, a: usize, n: usize) -> Vec<usize> {
        let mut left = Vec::new();
        for (p, len) in self.scratch_pieces(a, n) {
            let d = self.detach(base, p, len, &|_, _| None);
            left.extend((0..len).filter(|&j| !d.taken[j]).map(|j| p + j));
            // Unregistered, the holes are plain untouched anonymous memory;
            // registered again for write protection alone, as the rest of
            // the chunk is, so that unprotecting the chunk reaches past them.
            let addr = self.blocks[&base].page_addr(p);
            self.unregister(addr, len * PAGE);
            if self.scanning {
                self.register(addr, len * PAGE);
            }
            self.finish_detach(d);
        }
        left
    }

    /// Remaps planned pages onto their frames, consecutive ones as runs.
    fn apply_merges(
        &mut self,
        base: usize,
        plan: &HashMap<usize, FrameId>,
        guard: bool,
        rep: &mut ScanReport,
    ) {
        let mut keys: Vec<usize> = plan.keys().copied().collect();
        keys.sort_unstable();
        let Some((&lo, &hi)) = keys.first().zip(keys.last()) else {
            return;
        };
        // Under the guard, anonymous pages go through it in runs of their own.
        let anon = |st: &State, k: usize| guard && st.blocks[&base].pages[k] == Page::Anon;
        let mut all = Vec::new();
        for (a, b) in runs(lo..hi + 1, |k| plan.get(&k).copied()) {
            let mut x = a;
            while x < b {
                let kind = anon(self, x);
                let y = (x..b).find(|&k| anon(self, k) != kind).unwrap_or(b);
                all.push((x, y, kind));
                x = y;
            }
        }
        for (a, b, through_guard) in all {
            let n = b - a;
            if through_guard {
                let (m, unmapped) = self.merge_anon(base, a, n, plan[&a]);
                rep.skipped_vma += unmapped as u64;
                self.refused_merges(base, unmapped);
                rep.merged += m as u64;
                self.stats.merged += m as u64;
                continue;
            }
            if !self.remap(base, a, n, Some(plan[&a])) {
                rep.skipped_vma += n as u64;
                self.refused_merges(base, n);
                continue;
            }
            rep.merged += n as u64;
            self.stats.merged += n as u64;
        }
    }
}

/// Runs `[start, end)` of consecutive indices in a sorted list whose pages
/// have the same state, with consecutive frames: one system call each.
fn state_runs(sorted: &[usize], page: impl Fn(usize) -> Page) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &k in sorted {
        match out.last_mut() {
            Some((_, e)) if *e == k && same_run(page(k - 1), page(k)) => *e += 1,
            _ => out.push((k, k + 1)),
        }
    }
    out
}

fn same_run(a: Page, b: Page) -> bool {
    match (a, b) {
        (Page::Anon, Page::Anon) => true,
        (Page::Owned(x), Page::Owned(y))
        | (Page::Shared(x), Page::Shared(y))
        | (Page::Diverged(x), Page::Diverged(y)) => x.pool() == y.pool() && y.0 == x.0 + 1,
        _ => false,
    }
}

/// What a look at `page` records: 1 marks "zero"; other contents are
/// marked by their sampled hash, never 0 or 1.
fn look(page: *const u8, zero: bool) -> u32 {
    if zero {
        1
    } else {
        (sample_hash(page) as u32 & crate::seen::LOOK_MASK) | 2
    }
}
