//! `duplicates`: the same content in several places without a copy between
//! them: a data file loaded once per module, a model deserialised per
//! worker, the same table built by several libraries. Each duplicate is
//! produced independently (generated again from the same seed, word by
//! word), so no memcpy connects them and only identical-page merging can
//! share them; a few buffers of unique content sit beside them. The
//! buffers are then read in full, pass after pass, as queries would, the
//! passes spread over the hold time (see `pace`).

use crate::buffer::Buffer;
use crate::digest::{chain, digest};
use crate::pace::Pacer;
use crate::rng::Rng;
use crate::{mib, Params};

pub fn run(p: &Params) -> Result<Vec<String>, String> {
    let bytes = p.bytes(32.0, 16.0);
    let (copies, unique) = (6, 2);
    let passes = p.rounds(60, 40);
    let mut buffers = Vec::new();
    for _ in 0..copies {
        buffers.push(Buffer::generated(bytes, &mut Rng::new(p.seed))?);
    }
    for u in 0..unique {
        buffers.push(Buffer::generated(
            bytes,
            &mut Rng::new(p.seed ^ (u as u64 + 1).wrapping_mul(0x9e37_79b9)),
        )?);
    }
    let mut answers = 0;
    let pacer = Pacer::new(p.hold(), passes);
    for pass in 0..passes {
        pacer.wait_for(pass);
        for b in &buffers {
            answers = chain(answers, digest(b.words(), pass as u64));
        }
    }
    let first = digest(buffers[0].words(), 0);
    let same = buffers
        .iter()
        .filter(|b| digest(b.words(), 0) == first)
        .count();
    Ok(vec![
        format!(
            "duplicates: {copies} copies and {unique} unique buffers of {:.1} MiB, {passes} passes",
            mib(bytes)
        ),
        format!("duplicates: {same} buffers identical to the first"),
        format!("duplicates: passes digest {answers:#018x}"),
    ])
}
