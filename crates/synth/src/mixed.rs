//! `mixed`: one program with all three patterns at once, as real programs
//! have them: a simulation loads the same lookup table once per component
//! (duplicates), keeps a zero-filled results matrix it writes a row of per
//! step (mostly zero), and passes its state array by value from step to
//! step, changing a slice of it each time (copies).

use std::collections::VecDeque;

use crate::buffer::{Buffer, WORDS_PER_PAGE};
use crate::digest::{chain, digest};
use crate::rng::Rng;
use crate::{mib, Params};

/// Copies of the lookup table, one per component.
const TABLE_COPIES: usize = 4;
/// States kept alive (the current one and its predecessors).
const KEPT: usize = 4;

pub fn run(p: &Params) -> Result<Vec<String>, String> {
    let state_bytes = p.bytes(32.0, 16.0);
    let table_bytes = p.bytes(16.0, 8.0);
    let results_bytes = p.bytes(48.0, 32.0);
    let steps = p.rounds(160, 120);
    let tables = (0..TABLE_COPIES)
        .map(|_| Buffer::generated(table_bytes, &mut Rng::new(p.seed ^ 0x7ab1e)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut results = Buffer::memset_zero(results_bytes)?;
    let mut rng = Rng::new(p.seed);
    let mut states = VecDeque::from([Buffer::generated(state_bytes, &mut rng)?]);
    let mut trace = 0;
    for step in 0..steps {
        let mut next = Buffer::copy_of(states.back().ok_or("no state")?)?;
        let table = &tables[step % TABLE_COPIES];
        advance(&mut next, table, &mut rng);
        let observed = chain(
            digest(next.words(), step as u64),
            digest(table.words(), step as u64),
        );
        record(&mut results, step, observed);
        trace = chain(trace, observed);
        states.push_back(next);
        if states.len() > KEPT {
            states.pop_front();
        }
    }
    let end = states
        .iter()
        .chain(&tables)
        .fold(digest(results.words(), 4), |h, b| {
            chain(h, digest(b.words(), 5))
        });
    Ok(vec![
        format!(
            "mixed: {steps} steps of a {:.1} MiB state ({KEPT} kept), {TABLE_COPIES} copies of a {:.1} MiB table, {:.1} MiB results",
            mib(state_bytes),
            mib(table_bytes),
            mib(results_bytes)
        ),
        format!("mixed: trace digest {trace:#018x}, end digest {end:#018x}"),
    ])
}

/// Rewrites a slice (1/32 of the pages) of the state from table lookups.
fn advance(state: &mut Buffer, table: &Buffer, rng: &mut Rng) {
    let pages = state.pages();
    let slice = (pages / 32).max(1);
    let first = rng.below(pages.saturating_sub(slice).max(1));
    let lookup = table.words();
    for i in first..(first + slice).min(pages) {
        for w in state.page_mut(i) {
            *w = w.wrapping_add(lookup[(*w % lookup.len() as u64) as usize]);
        }
    }
}

/// Writes one row of results: a few words on one page, rows a page apart
/// spread over the whole matrix.
fn record(results: &mut Buffer, step: usize, value: u64) {
    let pages = results.pages();
    let page = (step * 97) % pages;
    let row = &mut results.page_mut(page)[..8.min(WORDS_PER_PAGE)];
    for (i, w) in row.iter_mut().enumerate() {
        *w ^= value.rotate_left(i as u32 * 8);
    }
}
