//! Deduplication schemes: exact counts on page-structured buffers, and what
//! each scheme can and cannot find.

use pagefold_codecs::{dedup, Chunking, CHUNK_REF_BYTES};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

#[test]
fn fixed_counts_distinct_pages() {
    let (n, k) = (5usize, 37usize);
    let pages: Vec<Vec<u8>> = (0..k).map(|i| random(4096, i as u64)).collect();
    let mut order: Vec<usize> = (0..n * k).map(|i| i % k).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(99));
    let data: Vec<u8> = order
        .iter()
        .flat_map(|&i| pages[i].iter().copied())
        .collect();
    let d = dedup(&data, &Chunking::Fixed(4096));
    assert_eq!(d.scheme, "fsp-4k");
    assert_eq!(d.input_bytes, (n * k * 4096) as u64);
    assert_eq!(d.chunks, (n * k) as u64);
    assert_eq!(d.unique_chunks, k as u64);
    assert_eq!(
        d.stored_bytes,
        (k * 4096) as u64 + d.chunks * CHUNK_REF_BYTES
    );
    assert_eq!(d.unique_bytes(), (k * 4096) as u64);
    assert!((d.ratio() - d.stored_bytes as f64 / d.input_bytes as f64).abs() < 1e-12);
    // Sliding block finds the same pages (they are block aligned).
    let s = dedup(&data, &Chunking::SlidingBlock(4096));
    assert_eq!(s.unique_chunks, k as u64);
    assert_eq!(s.chunks, (n * k) as u64);
}

#[test]
fn cdc_finds_shifted_duplicates_fixed_does_not() {
    let r = random(512 << 10, 1);
    let mut data = r.clone();
    data.extend_from_slice(&[1, 2, 3]);
    data.extend_from_slice(&r);
    let fixed = dedup(&data, &Chunking::Fixed(4096));
    let cdc = dedup(&data, &Chunking::cdc(4096));
    assert_eq!(cdc.scheme, "cdc-4k");
    assert!(
        fixed.unique_bytes() as f64 > 0.99 * data.len() as f64,
        "fixed {:?}",
        fixed
    );
    assert!(
        (cdc.unique_bytes() as f64) < 0.55 * data.len() as f64,
        "cdc {:?}",
        cdc
    );
    assert!(cdc.unique_chunks < cdc.chunks);
}

#[test]
fn sliding_block_finds_unaligned_block() {
    let pages: Vec<Vec<u8>> = (0..8).map(|i| random(4096, 100 + i)).collect();
    let mut data: Vec<u8> = pages.concat();
    data.extend_from_slice(&random(100, 7)); // misaligns what follows
    data.extend_from_slice(&pages[3]);
    data.extend_from_slice(&random(5000, 8));
    let fixed = dedup(&data, &Chunking::Fixed(4096));
    assert_eq!(
        fixed.unique_chunks, fixed.chunks,
        "fixed should find nothing"
    );
    let sb = dedup(&data, &Chunking::SlidingBlock(4096));
    assert_eq!(sb.scheme, "sb-4k");
    assert_eq!(sb.chunks - sb.unique_chunks, 1, "{sb:?}");
    assert_eq!(sb.unique_bytes(), data.len() as u64 - 4096);
}

#[test]
fn zeros_collapse() {
    let data = vec![0u8; 1 << 20];
    for s in [
        Chunking::Fixed(4096),
        Chunking::cdc(8192),
        Chunking::SlidingBlock(4096),
    ] {
        let d = dedup(&data, &s);
        assert!(d.unique_chunks <= 2, "{d:?}");
        assert!(d.ratio() < 0.05, "{d:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any buffer, any scheme: dedup restores it exactly (checked inside) and
    /// the counts are consistent.
    #[test]
    fn counts_consistent(
        seed in any::<u64>(),
        len in 0usize..200_000,
        repeat in 1usize..4,
        size in 1usize..9000,
    ) {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let unit: Vec<u8> = (0..len / repeat).map(|_| r.gen_range(0..4u8)).collect();
        let data: Vec<u8> = unit.iter().copied().cycle().take(len).collect();
        for s in [Chunking::Fixed(size), Chunking::cdc(size), Chunking::SlidingBlock(size)] {
            let d = dedup(&data, &s);
            prop_assert_eq!(d.input_bytes, len as u64);
            prop_assert!(d.unique_chunks <= d.chunks);
            prop_assert!(d.unique_bytes() <= d.input_bytes);
            prop_assert_eq!(d.chunks == 0, len == 0);
        }
    }
}
