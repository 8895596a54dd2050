//! `copies`: pass-by-value. An interpreter that copies a vector on every
//! modification (R's copy-on-modify, a data frame passed to a function that
//! changes a column) makes a full copy of a large array and then changes a
//! few percent of it. Here: an array copied with memcpy into a fresh malloc
//! generation after generation, each copy changed in a few stretches of
//! pages and a few scattered words, the last few generations kept alive
//! and the older ones freed. Plain memory holds every kept generation in
//! full; a virtual copy holds one array plus the changed pages.

use std::collections::VecDeque;

use crate::buffer::Buffer;
use crate::digest::{chain, digest};
use crate::rng::Rng;
use crate::{mib, Params};

/// Stretches of pages changed in each generation (a column rewritten).
const STRETCHES: usize = 4;
/// Share of the pages changed in stretches, per generation.
const STRETCH_SHARE: f64 = 0.02;
/// Scattered single words changed per 1,000 pages (an element assigned).
const SINGLES_PER_1000_PAGES: usize = 3;
/// Generations alive at a time (the newest and its predecessors).
const KEPT: usize = 5;

pub fn run(p: &Params) -> Result<Vec<String>, String> {
    let bytes = p.bytes(64.0, 32.0);
    let generations = p.rounds(48, 24);
    let mut rng = Rng::new(p.seed);
    let mut live = VecDeque::from([Buffer::generated(bytes, &mut rng)?]);
    let mut sums = 0u64;
    let mut changed_pages = 0;
    for g in 0..generations {
        let newest = live.back().ok_or("no array")?;
        let mut next = Buffer::copy_of(newest)?;
        changed_pages += modify(&mut next, g as u64, &mut rng);
        // Work on the new value: a reduction that reads all of it.
        sums = chain(sums, digest(next.words(), g as u64));
        live.push_back(next);
        if live.len() > KEPT {
            live.pop_front();
        }
    }
    let kept_digest = live.iter().fold(0, |h, b| chain(h, digest(b.words(), 1)));
    Ok(vec![
        format!(
            "copies: {generations} generations of a {:.1} MiB array ({} pages), last {KEPT} kept, {changed_pages} pages rewritten in all",
            mib(bytes),
            live[0].pages()
        ),
        format!("copies: sums digest {sums:#018x}"),
        format!("copies: kept generations digest {kept_digest:#018x}"),
    ])
}

/// Changes a few stretches of pages and a few scattered words of `a`;
/// returns how many pages were changed (stretches only, for the summary).
fn modify(a: &mut Buffer, generation: u64, rng: &mut Rng) -> usize {
    let pages = a.pages();
    let stretch = ((pages as f64 * STRETCH_SHARE / STRETCHES as f64) as usize).max(1);
    for _ in 0..STRETCHES {
        let first = rng.below(pages.saturating_sub(stretch).max(1));
        for i in first..(first + stretch).min(pages) {
            for w in a.page_mut(i) {
                *w = w.wrapping_mul(3).wrapping_add(generation);
            }
        }
    }
    let words = a.words_mut();
    for _ in 0..(pages * SINGLES_PER_1000_PAGES / 1000).max(1) {
        let i = rng.below(words.len());
        words[i] ^= generation.wrapping_add(1);
    }
    STRETCHES * stretch.min(pages)
}
