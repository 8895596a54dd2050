//! Identical-page sharing, counted as Difference Engine's Table 1 does:
//! zero pages (all fold onto one zero page), sharable non-zero pages (their
//! content occurs at least twice) and how many distinct contents they have,
//! unique pages, and the pages needed after sharing
//! (unique + distinct sharable + 1 zero page if any).
//!
//! Pages are grouped by their xxh3 hash (a parallel sort of (hash, page)
//! pairs) and every member of a group is byte-compared with the group's
//! representative, so a hash collision splits a group instead of merging
//! different pages. The representative of a content is its first page in
//! walk order; the similarity analysis patches representatives only.
//!
//! With several inputs the same numbers are computed per input (what
//! in-process merging, pagefold's scope, finds) and across inputs (what the
//! kernel's KSM, which merges across processes, would add). When the reader
//! saw physical frame numbers (a live process read as root), pages already
//! on a shared frame (file pages, copy-on-write after fork, KSM) are counted
//! too: that sharing exists already and is not a saving to be had.

use std::collections::HashMap;

use rayon::prelude::*;
use serde::Serialize;

use crate::image::Image;
use crate::progress::Progress;
use crate::scan::Scan;

/// Marks zero pages in [`Sharing::rep`].
pub const ZERO: u32 = u32::MAX;

/// Table 1 counts for one set of pages.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub pages: u64,
    pub zero_pages: u64,
    /// Non-zero pages whose content occurs at least twice.
    pub sharable_pages: u64,
    /// Distinct contents among the sharable pages.
    pub sharable_distinct: u64,
    /// Non-zero pages whose content occurs once.
    pub unique_pages: u64,
    /// unique + sharable_distinct + (1 if any zero page).
    pub after_sharing: u64,
}

impl Counts {
    fn finish(&mut self) {
        self.after_sharing =
            self.unique_pages + self.sharable_distinct + (self.zero_pages > 0) as u64;
    }

    pub fn saved_pct(&self) -> f64 {
        pct(self.pages - self.after_sharing, self.pages)
    }
}

pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// In-process versus cross-process sharing (several inputs).
#[derive(Debug, Clone, Serialize)]
pub struct Cross {
    pub pages: u64,
    /// Sum over inputs of their own pages after sharing (merging inside each
    /// process only, as pagefold does).
    pub after_in_process: u64,
    /// Pages after sharing across all inputs (as kernel KSM merges).
    pub after_cross_process: u64,
    /// What cross-process merging adds: after_in_process - after_cross_process.
    pub cross_adds_pages: u64,
    pub in_process_saved_pct: f64,
    pub cross_process_saved_pct: f64,
}

/// Physical sharing that already exists (frames visible in pagemap).
#[derive(Debug, Clone, Serialize)]
pub struct Frames {
    /// Pages whose frame number was known.
    pub pages_with_frame: u64,
    pub distinct_frames: u64,
    /// Pages on a frame that another page of the inputs maps too.
    pub pages_on_shared_frames: u64,
}

pub struct Sharing {
    /// Representative page of every page's content (itself when it is the
    /// first page with that content); [`ZERO`] for zero pages.
    pub rep: Vec<u32>,
    /// Pages with the same content as a representative (valid at representatives).
    pub group: Vec<u32>,
    pub total: Counts,
    pub per_input: Vec<Counts>,
    pub cross: Option<Cross>,
    pub frames: Option<Frames>,
    /// Pages byte-compared to verify hash groups, and hash collisions found.
    pub verify_compares: u64,
    pub hash_collisions: u64,
    pub seconds: f64,
}

pub fn share(image: &Image, scan: &Scan, progress: &Progress) -> Sharing {
    let start = std::time::Instant::now();
    let n = image.pages();
    let mut pairs: Vec<(u64, u32)> = (0..n)
        .into_par_iter()
        .filter(|&i| !scan.zero[i])
        .map(|i| (scan.hash[i], i as u32))
        .collect();
    pairs.par_sort_unstable();
    // Runs of equal hash with at least two pages.
    let mut runs = Vec::new();
    let mut a = 0;
    while a < pairs.len() {
        let mut b = a + 1;
        while b < pairs.len() && pairs[b].0 == pairs[a].0 {
            b += 1;
        }
        if b - a >= 2 {
            runs.push((a, b));
        }
        a = b;
    }
    let bar = progress.stage("share", runs.len() as u64, false);
    // (page, representative) for every page that is not its own, plus
    // verification counters.
    let (updates, compares, collisions) = runs
        .par_iter()
        .map(|&(a, b)| {
            let mut reps: Vec<u32> = Vec::with_capacity(1);
            let mut upd = Vec::with_capacity(b - a);
            let mut compares = 0u64;
            for &(_, p) in &pairs[a..b] {
                let page = image.page(p as usize);
                let mut found = None;
                for &r in &reps {
                    compares += 1;
                    if image.page(r as usize) == page {
                        found = Some(r);
                        break;
                    }
                }
                match found {
                    Some(r) => upd.push((p, r)),
                    None => reps.push(p),
                }
            }
            bar.inc(1);
            (upd, compares, reps.len() as u64 - 1)
        })
        .fold(
            || (Vec::new(), 0u64, 0u64),
            |mut acc, (u, c, x)| {
                acc.0.extend(u);
                acc.1 += c;
                acc.2 += x;
                acc
            },
        )
        .reduce(
            || (Vec::new(), 0u64, 0u64),
            |mut a, b| {
                a.0.extend(b.0);
                a.1 += b.1;
                a.2 += b.2;
                a
            },
        );
    bar.finish();

    let mut rep: Vec<u32> = (0..n as u32).collect();
    for (i, r) in rep.iter_mut().enumerate() {
        if scan.zero[i] {
            *r = ZERO;
        }
    }
    for &(p, r) in &updates {
        rep[p as usize] = r;
    }
    let mut group = vec![0u32; n];
    for &r in &rep {
        if r != ZERO {
            group[r as usize] += 1;
        }
    }

    let inputs = image.inputs.len().max(1);
    let mut total = Counts::default();
    let mut per_input = vec![Counts::default(); inputs];
    // (representative, input) -> pages, for sharable contents only.
    let mut by_input: HashMap<(u32, u32), u32> = HashMap::new();
    for (i, &r) in rep.iter().enumerate() {
        let inp = image.input_of(i);
        total.pages += 1;
        per_input[inp].pages += 1;
        if r == ZERO {
            total.zero_pages += 1;
            per_input[inp].zero_pages += 1;
        } else if group[r as usize] >= 2 {
            total.sharable_pages += 1;
            if r as usize == i {
                total.sharable_distinct += 1;
            }
            if inputs > 1 {
                *by_input.entry((r, inp as u32)).or_default() += 1;
            }
        } else {
            total.unique_pages += 1;
            per_input[inp].unique_pages += 1;
        }
    }
    total.finish();
    if inputs == 1 {
        per_input[0] = total.clone();
    } else {
        for (&(_, inp), &m) in &by_input {
            let c = &mut per_input[inp as usize];
            if m >= 2 {
                c.sharable_pages += m as u64;
                c.sharable_distinct += 1;
            } else {
                c.unique_pages += 1;
            }
        }
        for c in &mut per_input {
            c.finish();
        }
    }
    let cross = (inputs > 1).then(|| {
        let after_in: u64 = per_input.iter().map(|c| c.after_sharing).sum();
        Cross {
            pages: total.pages,
            after_in_process: after_in,
            after_cross_process: total.after_sharing,
            cross_adds_pages: after_in - total.after_sharing,
            in_process_saved_pct: pct(total.pages - after_in, total.pages),
            cross_process_saved_pct: total.saved_pct(),
        }
    });
    let frames = frames(image);
    Sharing {
        rep,
        group,
        total,
        per_input,
        cross,
        frames,
        verify_compares: compares,
        hash_collisions: collisions,
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn frames(image: &Image) -> Option<Frames> {
    let mut f: Vec<u64> = image.frames.iter().copied().filter(|&x| x != 0).collect();
    if f.is_empty() {
        return None;
    }
    let with = f.len() as u64;
    f.par_sort_unstable();
    let mut distinct = 0;
    let mut shared = 0;
    let mut a = 0;
    while a < f.len() {
        let mut b = a + 1;
        while b < f.len() && f[b] == f[a] {
            b += 1;
        }
        distinct += 1;
        if b - a >= 2 {
            shared += (b - a) as u64;
        }
        a = b;
    }
    Some(Frames {
        pages_with_frame: with,
        distinct_frames: distinct,
        pages_on_shared_frames: shared,
    })
}
