//! A trace-driven row-buffer model: address trace in, per-bank open row,
//! out come row hits, misses (bank idle) and conflicts (another row open).
//!
//! It shows what bank partitioning does where the machine cannot (a virtual
//! machine whose guest addresses are not the controller's). Two programs run
//! interleaved access by access: one streams through its pages line by line,
//! the other reads lines at random. Their virtual pages are placed on
//! physical pages drawn at random from the whole memory (unpartitioned) or
//! only from pages wholly in the program's bank set (partitioned, as page
//! colouring does). Every access is assumed to miss the caches and the banks
//! keep their row open until another row is needed (open-page policy); there
//! is no request reordering. Latencies are the classic DDR4 ones (row hit
//! tCL, idle bank tRCD + tCL, conflict tRP + tRCD + tCL, at ~14 ns each),
//! used only to turn the counts into a mean access time.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::map::BankMap;
use crate::set::BankSet;

/// Row hit, idle bank and row conflict service times, nanoseconds.
pub const HIT_NS: f64 = 14.0;
pub const IDLE_NS: f64 = 28.0;
pub const CONFLICT_NS: f64 = 42.0;
/// Physical pages the model places programs in (4 GiB).
pub const MEMORY_PAGES: u64 = 1 << 20;
const LINE: u64 = 64;

/// How a program walks its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Line after line, wrapping around.
    Stream,
    /// A random line each time.
    Random,
}

/// One program of the model: its pattern, size and bank set.
#[derive(Clone, Copy, Debug)]
pub struct Program {
    pub pattern: Pattern,
    pub pages: u64,
    /// The banks its pages come from when partitioned.
    pub banks: BankSet,
}

/// What one program's accesses met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub hits: u64,
    pub idle: u64,
    pub conflicts: u64,
}

impl Counts {
    pub fn accesses(&self) -> u64 {
        self.hits + self.idle + self.conflicts
    }

    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.accesses().max(1) as f64
    }

    /// Mean service time of an access, nanoseconds.
    pub fn mean_ns(&self) -> f64 {
        let total = self.hits as f64 * HIT_NS
            + self.idle as f64 * IDLE_NS
            + self.conflicts as f64 * CONFLICT_NS;
        total / self.accesses().max(1) as f64
    }
}

/// Banks x open row.
pub struct RowBuffers {
    open: Vec<Option<u64>>,
    row_shift: u32,
}

impl RowBuffers {
    pub fn new(banks: u32, row_shift: u32) -> RowBuffers {
        RowBuffers {
            open: vec![None; banks as usize],
            row_shift,
        }
    }

    /// One access to physical address `pa` in `bank`.
    pub fn access(&mut self, bank: u32, pa: u64, counts: &mut Counts) {
        let row = pa >> self.row_shift;
        let slot = &mut self.open[bank as usize];
        match *slot {
            Some(r) if r == row => counts.hits += 1,
            Some(_) => counts.conflicts += 1,
            None => counts.idle += 1,
        }
        *slot = Some(row);
    }
}

/// Physical pages for every program: distinct, random, and (partitioned)
/// only pages whose banks lie in the program's set.
fn place(
    map: &BankMap,
    programs: &[Program],
    partitioned: bool,
    rng: &mut StdRng,
) -> Vec<Vec<u64>> {
    let mut used = std::collections::HashSet::new();
    programs
        .iter()
        .map(|p| {
            let mut frames = Vec::with_capacity(p.pages as usize);
            while (frames.len() as u64) < p.pages {
                let pfn = rng.gen_range(0..MEMORY_PAGES);
                if (!partitioned || map.page_fits(pfn, &p.banks)) && used.insert(pfn) {
                    frames.push(pfn);
                }
            }
            frames
        })
        .collect()
}

/// Runs `accesses` accesses of each program, interleaved one by one.
pub fn simulate(
    map: &BankMap,
    row_shift: u32,
    programs: &[Program],
    accesses: u64,
    partitioned: bool,
    seed: u64,
) -> Vec<Counts> {
    let mut rng = StdRng::seed_from_u64(seed);
    let frames = place(map, programs, partitioned, &mut rng);
    let mut rows = RowBuffers::new(map.bank_count(), row_shift);
    let mut counts = vec![Counts::default(); programs.len()];
    let mut cursors = vec![0u64; programs.len()];
    let lines_per_page = crate::PAGE / LINE;
    for _ in 0..accesses {
        for (i, p) in programs.iter().enumerate() {
            let lines = p.pages * lines_per_page;
            let line = match p.pattern {
                Pattern::Stream => {
                    cursors[i] = (cursors[i] + 1) % lines;
                    cursors[i]
                }
                Pattern::Random => rng.gen_range(0..lines.max(1)),
            };
            let pfn = frames[i][(line / lines_per_page) as usize];
            let pa = (pfn << crate::PAGE_SHIFT) | ((line % lines_per_page) * LINE);
            rows.access(map.bank_of(pa), pa, &mut counts[i]);
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> BankMap {
        BankMap::known("coffee-lake-ddr4-1rank").unwrap()
    }

    fn pair() -> [Program; 2] {
        let low = BankSet::parse("0-7", 16).unwrap();
        [
            Program {
                pattern: Pattern::Stream,
                pages: 2048,
                banks: low,
            },
            Program {
                pattern: Pattern::Random,
                pages: 2048,
                banks: low.complement(16),
            },
        ]
    }

    #[test]
    fn partitioning_two_interfering_programs_raises_the_stream_hit_rate() {
        let shared = simulate(&map(), 17, &pair(), 200_000, false, 7);
        let split = simulate(&map(), 17, &pair(), 200_000, true, 7);
        let (before, after) = (shared[0].hit_rate(), split[0].hit_rate());
        assert!(after > before + 0.05, "stream {before:.3} -> {after:.3}");
        assert!(split[0].mean_ns() < shared[0].mean_ns());
        // The random reader's conflicts are its own either way: not worse.
        assert!(split[1].hit_rate() + 0.02 >= shared[1].hit_rate());
    }

    #[test]
    fn a_single_stream_is_unaffected() {
        let one = [pair()[0]];
        let shared = simulate(&map(), 17, &one, 200_000, false, 3);
        let split = simulate(&map(), 17, &one, 200_000, true, 3);
        let diff = (shared[0].hit_rate() - split[0].hit_rate()).abs();
        assert!(diff < 0.01, "{shared:?} vs {split:?}");
        assert!(shared[0].hit_rate() > 0.9);
    }

    #[test]
    fn row_buffers_count_hits_idle_and_conflicts() {
        let mut rb = RowBuffers::new(2, 17);
        let mut c = Counts::default();
        rb.access(0, 0, &mut c);
        rb.access(0, 64, &mut c);
        rb.access(0, 1 << 17, &mut c);
        rb.access(1, 0, &mut c);
        assert_eq!((c.hits, c.idle, c.conflicts), (1, 2, 1));
    }
}
