//! `scattered`: a program that builds a large table once and then sits on
//! it. Half of its pages are copies of a thousand distinct contents (records
//! that repeat: the same default row, the same decoded block), placed at
//! random among unique pages, as a deserialised object graph or a hash table
//! leaves them; no memcpy connects them, so only identical-page merging can
//! share them. The records are page-sized and the table page-aligned
//! (posix_memalign), so equal records are equal pages for any merger, kernel
//! KSM included. The program then stays idle for the hold time, touching
//! nothing, and reads everything once at the end.
//!
//! Two things are measured on it. Merging scattered pages one at a time is
//! what mapping-based merging does worst (each isolated page costs mappings),
//! while kernel KSM works on page tables and is indifferent to placement.
//! And once everything that can be merged is merged, a scanner that keeps
//! looking costs CPU for nothing: an idle program's CPU under the engine
//! should stay close to plain's.

use crate::buffer::{Buffer, PAGE, WORDS_PER_PAGE};
use crate::digest::digest;
use crate::rng::Rng;
use crate::{mib, Params};

/// Distinct contents the duplicate pages are copies of.
pub const DISTINCT: usize = 1000;
/// Idle time without `--hold`: long enough for background scans to settle
/// and then show what they cost when there is nothing left to do.
const DEFAULT_IDLE_S: f64 = 20.0;
const QUICK_IDLE_S: f64 = 6.0;

/// The content id of every page: below `DISTINCT` a duplicate's content,
/// from `DISTINCT` up a unique page's (each used once).
pub fn page_ids(pages: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed ^ 0x5ca7_7e4e_d000_0001);
    let mut next_unique = DISTINCT as u64;
    (0..pages)
        .map(|_| {
            if rng.below(2) == 0 {
                rng.below(DISTINCT) as u64
            } else {
                next_unique += 1;
                next_unique
            }
        })
        .collect()
}

pub fn run(p: &Params) -> Result<Vec<String>, String> {
    let bytes = p.bytes(512.0, 64.0);
    let ids = page_ids(bytes / PAGE, p.seed);
    let mut rng = Rng::new(0);
    let table = Buffer::page_aligned_from(bytes, |i| {
        if i % WORDS_PER_PAGE == 0 {
            let id = ids[i / WORDS_PER_PAGE];
            rng = Rng::new(p.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        rng.next_u64()
    })?;
    let duplicates = ids.iter().filter(|&&id| id < DISTINCT as u64).count();
    let idle = p.hold.unwrap_or(if p.quick {
        QUICK_IDLE_S
    } else {
        DEFAULT_IDLE_S
    });
    std::thread::sleep(std::time::Duration::from_secs_f64(idle));
    Ok(vec![
        format!(
            "scattered: {:.1} MiB, {duplicates} of {} pages copies of {DISTINCT} contents at random places",
            mib(bytes),
            ids.len()
        ),
        format!("scattered: digest {:#018x}", digest(table.words(), 0)),
    ])
}
