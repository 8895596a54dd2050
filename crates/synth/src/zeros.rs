//! `zeros`: memory that is allocated large and stays mostly zero. Tables
//! sized for the worst case (a histogram over a large key space, a hash
//! table, a dense matrix that turns out sparse) are zeroed up front, by
//! calloc or by malloc and memset, and only a few of their pages are ever
//! written; a scratch buffer is filled, used, and cleared with memset for
//! reuse. Plain memory holds every page memset wrote (calloc's untouched
//! pages cost nothing there either); zero-page folding gives those back.
//! The tables are then updated at a small set of hot slots, in batches
//! spread over the hold time (see `pace`), and read in full at the end.

use crate::buffer::{Buffer, WORDS_PER_PAGE};
use crate::digest::{chain, digest};
use crate::pace::Pacer;
use crate::rng::Rng;
use crate::{mib, Params};

/// One page in this many holds hot slots.
const HOT_PAGE_EVERY: usize = 64;
/// Hot slots per hot page.
const SLOTS_PER_HOT_PAGE: usize = 8;
/// Paced batches the update rounds come in.
const BATCHES: usize = 40;

pub fn run(p: &Params) -> Result<Vec<String>, String> {
    let table_bytes = p.bytes(48.0, 32.0);
    let rounds = p.rounds(150_000, 100_000);
    let mut rng = Rng::new(p.seed);
    let mut tables = vec![
        Buffer::calloc(table_bytes)?,
        Buffer::memset_zero(table_bytes)?,
        Buffer::calloc(table_bytes)?,
        Buffer::memset_zero(table_bytes)?,
    ];
    let scratch_digest = scratch_then_clear(&mut tables, table_bytes, &mut rng)?;
    let hot = hot_slots(&tables, &mut rng);
    let pacer = Pacer::new(p.hold(), BATCHES);
    for round in 0..rounds {
        if round % rounds.div_ceil(BATCHES) == 0 {
            pacer.wait_for(round / rounds.div_ceil(BATCHES));
        }
        update(&mut tables, &hot, round as u64, &mut rng);
    }
    let tables_digest = tables.iter().fold(0, |h, t| chain(h, digest(t.words(), 2)));
    let nonzero_pages: usize = tables.iter().map(nonzero_page_count).sum();
    Ok(vec![
        format!(
            "zeros: {} buffers of {:.1} MiB (2 calloc, 2 malloc+memset, 1 filled then cleared), {} hot slots, {rounds} rounds",
            tables.len(),
            mib(table_bytes),
            hot.len()
        ),
        format!("zeros: {nonzero_pages} of {} pages non-zero at the end", tables.iter().map(Buffer::pages).sum::<usize>()),
        format!("zeros: scratch digest {scratch_digest:#018x}, tables digest {tables_digest:#018x}"),
    ])
}

/// A buffer filled with data, digested, then cleared with memset and kept
/// (it joins the tables); returns the digest of its data.
fn scratch_then_clear(
    tables: &mut Vec<Buffer>,
    bytes: usize,
    rng: &mut Rng,
) -> Result<u64, String> {
    let mut scratch = Buffer::generated(bytes, rng)?;
    let d = digest(scratch.words(), 3);
    scratch.clear();
    tables.push(scratch);
    Ok(d)
}

/// (table, word) of every hot slot: a few slots on one page in HOT_PAGE_EVERY.
fn hot_slots(tables: &[Buffer], rng: &mut Rng) -> Vec<(usize, usize)> {
    let mut hot = Vec::new();
    for (t, table) in tables.iter().enumerate() {
        for page in 0..table.pages() {
            if rng.below(HOT_PAGE_EVERY) != 0 {
                continue;
            }
            let words_here = (table.words().len() - page * WORDS_PER_PAGE).min(WORDS_PER_PAGE);
            for _ in 0..SLOTS_PER_HOT_PAGE {
                hot.push((t, page * WORDS_PER_PAGE + rng.below(words_here)));
            }
        }
    }
    hot
}

/// One round of counting: every hot slot once, plus a few random ones again.
fn update(tables: &mut [Buffer], hot: &[(usize, usize)], round: u64, rng: &mut Rng) {
    for &(t, w) in hot {
        let slot = &mut tables[t].words_mut()[w];
        *slot = slot.wrapping_add(round | 1);
    }
    for _ in 0..hot.len() / 8 {
        let (t, w) = hot[rng.below(hot.len().max(1))];
        let slot = &mut tables[t].words_mut()[w];
        *slot = slot.rotate_left(7) ^ round;
    }
}

fn nonzero_page_count(t: &Buffer) -> usize {
    t.words()
        .chunks(WORDS_PER_PAGE)
        .filter(|page| page.iter().any(|&w| w != 0))
        .count()
}
