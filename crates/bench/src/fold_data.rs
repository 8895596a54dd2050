//! The data of the 1 GiB fold (suite `fold`): which content each of its
//! 262,144 pages holds. Half the pages are copies of 1,000 distinct contents,
//! the other half unique, placed at random with a fixed seed. The engine's
//! side (`fold`) and kernel KSM's side (`kernel_ksm`) fill their memory from
//! the same ids, so both fold exactly the same bytes, and the report states
//! the seed.

use pagefold_engine::PAGE;
use rand::seq::SliceRandom;
use rand::{rngs::StdRng, SeedableRng};

/// 1 GiB of pages.
pub const FOLD_PAGES: usize = (1 << 30) / PAGE;
/// Distinct contents among the duplicated half.
pub const DISTINCT: u64 = 1000;
/// Seed of the page placement.
pub const SEED: u64 = 0x5eed_f01d;

/// Content id of every page: the first half cycles through DISTINCT ids, the
/// second half is unique; then shuffled with a fixed seed.
pub fn fold_ids(pages: usize, seed: u64) -> Vec<u64> {
    let duplicates = pages / 2;
    let mut ids: Vec<u64> = (0..pages)
        .map(|i| {
            if i < duplicates {
                i as u64 % DISTINCT
            } else {
                DISTINCT + i as u64
            }
        })
        .collect();
    ids.shuffle(&mut StdRng::seed_from_u64(seed));
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_ids_are_half_duplicates_of_1000_contents_and_seeded() {
        let ids = fold_ids(FOLD_PAGES, SEED);
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), FOLD_PAGES / 2 + DISTINCT as usize);
        assert_eq!(ids, fold_ids(FOLD_PAGES, SEED));
        assert!(
            ids[..1000].iter().any(|&id| id >= DISTINCT)
                && ids[..1000].iter().any(|&id| id < DISTINCT)
        );
    }
}
