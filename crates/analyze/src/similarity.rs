//! Patching, as Difference Engine does it: walk the distinct non-zero
//! contents (the sharing representatives) in address order; look each one up
//! in the k indices of the HashSimilarityDetector (each bucket keeps the c
//! most recently indexed pages); patch it against each candidate with a real
//! delta encoder and keep the smallest patch; a patch of at most the cut-off
//! (2 KiB) makes the page *patched*, otherwise — or with no candidate — the
//! page stays whole and is indexed as a possible reference. Patched pages
//! are never references (they are not in memory as pages).
//!
//! The walk is sequential by definition (whether page p is a reference
//! depends on the patches of all pages before it), but the patches are what
//! costs. So the walk goes window by window (4096 contents) and each window
//! is run optimistically: a page whose patch is not yet known is assumed
//! patched and queued; the queued patches are computed in parallel; the
//! window is rolled back (an undo log of index changes) and walked again
//! with the results, until no page is queued. A result is reused only when
//! the page's candidate list is the same, and each round settles at least
//! the first queued page, so the outcome is exactly that of the sequential
//! walk. A window still unsettled after 8 rounds (long chains of rejected
//! pages replacing each other in the same bucket) is finished sequentially.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use rayon::prelude::*;
use serde::Serialize;

use crate::delta::DeltaEncoder;
#[cfg(test)]
use crate::delta::Encoder;
use crate::image::{Image, PAGE};
use crate::progress::Progress;
use crate::scan::{Scan, SimilarityConfig};
use crate::sharing::{pct, Counts, Sharing, ZERO};

/// Keys are already hashes.
#[derive(Default)]
struct Identity(u64);
impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}
type Map = HashMap<u64, u32, BuildHasherDefault<Identity>>;

#[derive(Debug, Clone, Serialize)]
pub struct Patching {
    pub detector: String,
    pub config: SimilarityConfig,
    pub encoder_description: &'static str,
    pub block_offsets: Vec<usize>,
    /// Distinct non-zero contents walked.
    pub contents: u64,
    /// Contents stored as a patch.
    pub patched_pages: u64,
    pub patch_bytes: u64,
    pub avg_patch_bytes: f64,
    /// Contents kept whole and indexed (possible references).
    pub indexed_pages: u64,
    /// Contents that had a candidate but whose best patch was too big.
    pub rejected_pages: u64,
    /// after_sharing - patched + ceil(patch_bytes / 4096).
    pub after_patching: u64,
    pub saved_pct: f64,
    /// Patches encoded (including speculative ones), and the most rounds
    /// any window needed.
    pub patches_encoded: u64,
    pub rounds: u32,
    pub seconds: f64,
}

/// The per-index bucket store: each key owns c consecutive slots of `slab`
/// holding the most recent pages first. Inserts can be logged and undone.
struct Index {
    maps: Vec<Map>,
    slab: Vec<u32>,
    c: usize,
    undo: Vec<Undo>,
    logging: bool,
}

/// One insert into one index, as it can be undone.
struct Undo {
    index: u32,
    key: u64,
    /// The key's bucket was created by this insert.
    created: bool,
    /// The entry pushed out of the bucket's last place.
    evicted: u32,
}

const EMPTY: u32 = u32::MAX;

impl Index {
    fn new(k: usize, c: usize) -> Index {
        Index {
            maps: (0..k).map(|_| Map::default()).collect(),
            slab: Vec::new(),
            c,
            undo: Vec::new(),
            logging: false,
        }
    }

    fn candidates(&self, keys: &[u64], out: &mut Vec<u32>) {
        out.clear();
        for (m, key) in self.maps.iter().zip(keys) {
            if let Some(&slot) = m.get(key) {
                for &p in &self.slab[slot as usize..slot as usize + self.c] {
                    if p != EMPTY && !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }

    fn insert(&mut self, keys: &[u64], page: u32) {
        for (i, (m, key)) in self.maps.iter_mut().zip(keys).enumerate() {
            let mut created = false;
            let slot = *m.entry(*key).or_insert_with(|| {
                created = true;
                let s = self.slab.len() as u32;
                self.slab.extend(std::iter::repeat_n(EMPTY, self.c));
                s
            }) as usize;
            let bucket = &mut self.slab[slot..slot + self.c];
            let evicted = bucket[self.c - 1];
            bucket.copy_within(0..self.c - 1, 1);
            bucket[0] = page;
            if self.logging {
                self.undo.push(Undo {
                    index: i as u32,
                    key: *key,
                    created,
                    evicted,
                });
            }
        }
    }

    /// Starts logging inserts (a window's first round).
    fn mark(&mut self) {
        self.undo.clear();
        self.logging = true;
    }

    /// Undoes every insert since [`Index::mark`], newest first.
    fn rollback(&mut self) {
        while let Some(u) = self.undo.pop() {
            let m = &mut self.maps[u.index as usize];
            let slot = m[&u.key] as usize;
            if u.created {
                m.remove(&u.key);
                // Created buckets are the newest slab slots.
                self.slab.truncate(slot);
            } else {
                let bucket = &mut self.slab[slot..slot + self.c];
                bucket.copy_within(1..self.c, 0);
                bucket[self.c - 1] = u.evicted;
            }
        }
    }

    fn commit(&mut self) {
        self.undo.clear();
        self.logging = false;
    }
}

#[derive(Clone)]
struct Memo {
    cands: Vec<u32>,
    size: u32,
}

fn best_patch(enc: &mut DeltaEncoder, image: &Image, page: u32, cands: &[u32]) -> u32 {
    let p = image.page(page as usize);
    cands
        .iter()
        .map(|&c| enc.patch_size(p, image.page(c as usize)) as u32)
        .min()
        .unwrap_or(u32::MAX)
}

const WINDOW: usize = 4096;
const MAX_ROUNDS: u32 = 8;

pub fn patch(
    image: &Image,
    scan: &Scan,
    sharing: &Sharing,
    cfg: &SimilarityConfig,
    progress: &Progress,
) -> Patching {
    let start = std::time::Instant::now();
    let order: Vec<u32> = (0..image.pages() as u32)
        .filter(|&i| sharing.rep[i as usize] == i && sharing.rep[i as usize] != ZERO)
        .collect();
    let mut memo: Vec<Option<Memo>> = vec![None; order.len()];
    let mut index = Index::new(cfg.k, cfg.candidates);
    let mut cands = Vec::new();
    let mut rounds = 0u32;
    let mut encoded = 0u64;
    let cutoff = cfg.cutoff as u32;
    let bar = progress.stage("patch", order.len() as u64, false);
    let mut seq_enc = DeltaEncoder::new(cfg.encoder);
    let (mut patched, mut bytes, mut indexed, mut rejected) = (0u64, 0u64, 0u64, 0u64);
    for w in (0..order.len()).step_by(WINDOW) {
        let end = (w + WINDOW).min(order.len());
        let mut round = 0;
        loop {
            round += 1;
            rounds = rounds.max(round);
            let sequential = round > MAX_ROUNDS;
            index.mark();
            let mut pending: Vec<(usize, Vec<u32>)> = Vec::new();
            let (mut wp, mut wb, mut wi, mut wr) = (0u64, 0u64, 0u64, 0u64);
            for pos in w..end {
                let p = order[pos];
                let keys = scan.keys_of(p as usize);
                index.candidates(keys, &mut cands);
                if cands.is_empty() {
                    index.insert(keys, p);
                    wi += 1;
                    continue;
                }
                let known = match &memo[pos] {
                    Some(m) if m.cands == cands => Some(m.size),
                    _ if sequential => {
                        let size = best_patch(&mut seq_enc, image, p, &cands);
                        encoded += cands.len() as u64;
                        memo[pos] = Some(Memo {
                            cands: cands.clone(),
                            size,
                        });
                        Some(size)
                    }
                    _ => None,
                };
                match known {
                    Some(size) if size <= cutoff => {
                        wp += 1;
                        wb += size as u64;
                    }
                    Some(_) => {
                        index.insert(keys, p);
                        wi += 1;
                        wr += 1;
                    }
                    None => pending.push((pos, cands.clone())),
                }
            }
            if pending.is_empty() {
                index.commit();
                patched += wp;
                bytes += wb;
                indexed += wi;
                rejected += wr;
                bar.inc((end - w) as u64);
                break;
            }
            index.rollback();
            encoded += pending.iter().map(|(_, c)| c.len() as u64).sum::<u64>();
            let results: Vec<(usize, Memo)> = pending
                .into_par_iter()
                .map_init(
                    || DeltaEncoder::new(cfg.encoder),
                    |enc, (pos, cands)| {
                        let size = best_patch(enc, image, order[pos], &cands);
                        (pos, Memo { cands, size })
                    },
                )
                .collect();
            for (pos, m) in results {
                memo[pos] = Some(m);
            }
        }
        // Results of this window are no longer needed.
        for m in &mut memo[w..end] {
            *m = None;
        }
    }
    bar.finish();
    let after_sharing = sharing.total.after_sharing;
    let after = after_sharing - patched + bytes.div_ceil(PAGE as u64);
    Patching {
        detector: cfg.label(),
        config: cfg.clone(),
        encoder_description: cfg.encoder.describe(),
        block_offsets: cfg.offsets(),
        contents: order.len() as u64,
        patched_pages: patched,
        patch_bytes: bytes,
        avg_patch_bytes: if patched > 0 {
            bytes as f64 / patched as f64
        } else {
            0.0
        },
        indexed_pages: indexed,
        rejected_pages: rejected,
        after_patching: after,
        saved_pct: pct(
            sharing.total.pages - after.min(sharing.total.pages),
            sharing.total.pages,
        ),
        patches_encoded: encoded,
        rounds,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Convenience for reports: Table 1 of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Table1 {
    #[serde(flatten)]
    pub counts: Counts,
    pub sharing_saved_pct: f64,
    pub patching: Option<Patching>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk without speculation: the definition the windowed, parallel
    /// walk must reproduce exactly.
    fn sequential(
        image: &Image,
        scan: &Scan,
        sharing: &Sharing,
        cfg: &SimilarityConfig,
    ) -> (u64, u64, u64, u64) {
        let mut index = Index::new(cfg.k, cfg.candidates);
        let mut enc = DeltaEncoder::new(cfg.encoder);
        let mut cands = Vec::new();
        let (mut patched, mut bytes, mut indexed, mut rejected) = (0, 0, 0, 0);
        for p in 0..image.pages() as u32 {
            if sharing.rep[p as usize] != p {
                continue;
            }
            let keys = scan.keys_of(p as usize);
            index.candidates(keys, &mut cands);
            if cands.is_empty() {
                index.insert(keys, p);
                indexed += 1;
                continue;
            }
            let size = best_patch(&mut enc, image, p, &cands);
            if size <= cfg.cutoff as u32 {
                patched += 1;
                bytes += size as u64;
            } else {
                index.insert(keys, p);
                indexed += 1;
                rejected += 1;
            }
        }
        (patched, bytes, indexed, rejected)
    }

    /// Pages whose similarity blocks are all equal (one bucket for all),
    /// with a random share of their other bytes random: some patch against
    /// the bucket's page, some do not and replace it — long chains.
    fn chain_image(pages: usize, seed: u64) -> Image {
        let mut x = seed;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut data = Vec::with_capacity(pages * PAGE);
        for _ in 0..pages {
            let noisy = (rnd() % 100) as usize; // percent of random bytes
            let mut page = vec![0x11u8; PAGE];
            for b in page.iter_mut() {
                if (rnd() % 100) < noisy as u64 {
                    *b = rnd() as u8;
                }
            }
            for &o in &SimilarityConfig::default().offsets() {
                page[o..o + 64].fill(0);
            }
            data.extend_from_slice(&page);
        }
        let mut img = Image::in_memory(data);
        img.inputs.push(crate::image::InputInfo {
            name: "t".into(),
            source: "image",
            pages,
            mappings: 1,
            unpopulated_pages: 0,
            vanished_pages: 0,
            partial_bytes: 0,
            read_seconds: 0.0,
            snapshot: None,
        });
        img
    }

    #[test]
    fn windowed_parallel_walk_equals_sequential_walk() {
        for (encoder, candidates) in [
            (Encoder::XorLz4, 1),
            (Encoder::ZstdRef, 1),
            (Encoder::XorLz4, 2),
        ] {
            let img = chain_image(3 * WINDOW + 100, 0x9e37_79b9 + candidates as u64);
            let cfg = SimilarityConfig {
                encoder,
                candidates,
                ..SimilarityConfig::default()
            };
            let scan = crate::scan::scan(&img, Some(&cfg), &Progress::hidden());
            let sh = crate::sharing::share(&img, &scan, &Progress::hidden());
            let p = patch(&img, &scan, &sh, &cfg, &Progress::hidden());
            let want = sequential(&img, &scan, &sh, &cfg);
            assert_eq!(
                (
                    p.patched_pages,
                    p.patch_bytes,
                    p.indexed_pages,
                    p.rejected_pages
                ),
                want,
                "{encoder} c={candidates}"
            );
            assert!(
                want.0 > 100 && want.3 > 100,
                "the image makes chains: {want:?}"
            );
        }
    }

    #[test]
    fn rollback_restores_the_index() {
        let mut ix = Index::new(2, 2);
        ix.insert(&[1, 2], 10);
        ix.mark();
        ix.insert(&[1, 3], 11);
        ix.insert(&[1, 2], 12);
        ix.insert(&[4, 2], 13);
        ix.rollback();
        ix.commit();
        let mut c = Vec::new();
        ix.candidates(&[1, 2], &mut c);
        assert_eq!(c, vec![10]);
        ix.candidates(&[4, 3], &mut c);
        assert!(c.is_empty());
        assert_eq!(ix.slab.len(), 4);
    }
}
