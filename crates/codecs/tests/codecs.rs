//! Round trips of every codec on fixed and generated inputs, and robustness of
//! every decoder against random, truncated and corrupted input.

use pagefold_codecs::{all_codecs, measure, Codec};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

fn round_trip(codec: &dyn Codec, data: &[u8]) {
    // Compress and decompress append: start from non-empty buffers.
    let mut packed = vec![0xAA; 3];
    codec.compress(data, &mut packed);
    let mut unpacked = vec![0x55; 5];
    codec
        .decompress(&packed[3..], &mut unpacked)
        .unwrap_or_else(|e| panic!("{}: {e} (len {})", codec.name(), data.len()));
    assert_eq!(&unpacked[..5], &[0x55; 5], "{}", codec.name());
    assert!(
        unpacked[5..] == *data,
        "{}: round trip differs (len {})",
        codec.name(),
        data.len()
    );
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng(seed).fill(&mut v[..]);
    v
}

fn text(n: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "memory",
        "page",
        "the",
        "of",
        "deduplication",
        "compression",
        "kernel",
        "frame",
        "and",
        "a",
        "zero",
        "shared",
        "copy",
        "on",
        "write",
        "\n",
        "block",
        "hash",
        ", ",
    ];
    let mut r = rng(seed);
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        v.extend_from_slice(WORDS[r.gen_range(0..WORDS.len())].as_bytes());
        v.push(b' ');
    }
    v.truncate(n);
    v
}

fn f64s(n: usize) -> Vec<u8> {
    (0..n / 8)
        .flat_map(|i| ((i as f64) * 0.25).sin().to_le_bytes())
        .collect()
}

fn fixed_inputs() -> Vec<(&'static str, Vec<u8>)> {
    let mut pages = Vec::new();
    let page = random(4096, 7);
    for i in 0..32 {
        let mut p = page.clone();
        p[i * 13 % 4096] = i as u8;
        pages.extend_from_slice(&p);
    }
    vec![
        ("empty", vec![]),
        ("one byte", vec![42]),
        ("two bytes", vec![0, 255]),
        ("zeros 4k", vec![0; 4096]),
        ("zeros 128k", vec![0; 128 << 10]),
        ("ones 100k", vec![0xff; 100_000]),
        ("random 128k", random(128 << 10, 1)),
        ("text 128k", text(128 << 10, 2)),
        ("f64 128k", f64s(128 << 10)),
        ("repeated pages", pages),
        (
            "all byte values",
            (0..=255u8).cycle().take(70_000).collect(),
        ),
        // Long enough to fill and reset the LZ78/LZW dictionaries.
        ("random 1m", random(1 << 20, 3)),
        ("text 3m", text(3 << 20, 4)),
    ]
}

#[test]
fn fixed_round_trips() {
    for codec in all_codecs() {
        for (what, data) in fixed_inputs() {
            let mut packed = Vec::new();
            codec.compress(&data, &mut packed);
            round_trip(codec.as_ref(), &data);
            if what.starts_with("zeros")
                && codec.name() != "huffman"
                && codec.name() != "arithmetic"
            {
                assert!(
                    packed.len() * 20 < data.len(),
                    "{} {what}: {}",
                    codec.name(),
                    packed.len()
                );
            }
        }
    }
}

#[test]
fn truncated_input_is_an_error() {
    for codec in all_codecs() {
        for (what, data) in fixed_inputs()
            .into_iter()
            .filter(|(_, d)| !d.is_empty() && d.len() <= 200_000)
        {
            let mut packed = Vec::new();
            codec.compress(&data, &mut packed);
            for cut in [0, 1, packed.len() / 2, packed.len() - 1] {
                let mut out = Vec::new();
                assert!(
                    codec.decompress(&packed[..cut], &mut out).is_err(),
                    "{} {what}: truncated to {cut} of {} decoded",
                    codec.name(),
                    packed.len()
                );
            }
        }
    }
}

#[test]
fn measure_blocks() {
    let mut data = text(64 << 10, 9);
    data.extend_from_slice(&vec![0; 64 << 10]);
    data.extend_from_slice(&f64s(64 << 10));
    data.extend_from_slice(&[1, 2, 3]);
    for codec in all_codecs() {
        for block in [0usize, 4096, 8192, 100_000] {
            let m = measure(codec.as_ref(), &data, block);
            assert_eq!(m.input_bytes, data.len() as u64);
            let expect_blocks = if block == 0 {
                1
            } else {
                data.len().div_ceil(block)
            };
            assert_eq!(m.blocks as usize, expect_blocks);
            assert!(
                m.ratio() < 0.8,
                "{} block {block}: ratio {}",
                m.codec,
                m.ratio()
            );
            assert!(m.ns_per_page() > 0.0);
        }
        let m = measure(codec.as_ref(), &[], 4096);
        assert_eq!((m.blocks, m.output_bytes, m.ratio()), (0, 0, 1.0));
    }
}

/// Inputs shaped like memory: zero runs, byte runs, near-identical pages,
/// f64 arrays, text.
fn structured() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0usize..65536).prop_map(|n| vec![0u8; n]),
        prop::collection::vec((any::<u8>(), 1usize..400), 0..300).prop_map(|runs| runs
            .into_iter()
            .flat_map(|(b, n)| std::iter::repeat_n(b, n))
            .collect()),
        (
            prop::collection::vec(any::<u8>(), 1..4096),
            1usize..16,
            prop::collection::vec((any::<usize>(), any::<u8>()), 0..20)
        )
            .prop_map(|(page, copies, edits)| {
                let mut v: Vec<u8> = page
                    .iter()
                    .copied()
                    .cycle()
                    .take(page.len() * copies)
                    .collect();
                for (i, b) in edits {
                    let n = v.len();
                    v[i % n] = b;
                }
                v
            }),
        prop::collection::vec(any::<f64>(), 0..8192)
            .prop_map(|xs| xs.into_iter().flat_map(f64::to_le_bytes).collect()),
        (0usize..8192, -1000.0f64..1000.0, 0.0f64..1.0).prop_map(|(n, a, step)| (0..n)
            .flat_map(|i| (a + step * i as f64).to_le_bytes())
            .collect()),
        (0usize..65536, any::<u64>()).prop_map(|(n, seed)| text(n, seed)),
        (0usize..65536, any::<u64>(), 1u8..8).prop_map(|(n, seed, alphabet)| {
            let mut r = rng(seed);
            (0..n).map(|_| r.gen_range(0..alphabet)).collect()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn arbitrary_round_trip(data in prop::collection::vec(any::<u8>(), 0..65536)) {
        for codec in all_codecs() {
            round_trip(codec.as_ref(), &data);
        }
    }

    #[test]
    fn structured_round_trip(data in structured()) {
        for codec in all_codecs() {
            round_trip(codec.as_ref(), &data);
        }
    }

    #[test]
    fn random_input_never_panics(garbage in prop::collection::vec(any::<u8>(), 0..4096)) {
        for codec in all_codecs() {
            let mut out = Vec::new();
            let _ = codec.decompress(&garbage, &mut out);
        }
    }

    #[test]
    fn corrupted_input_never_panics(
        data in structured(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        for codec in all_codecs() {
            let mut packed = Vec::new();
            codec.compress(&data, &mut packed);
            let mut bad = packed.clone();
            for &(i, b) in &edits {
                let n = bad.len();
                bad[i % n] ^= b | 1;
            }
            let mut out = Vec::new();
            let _ = codec.decompress(&bad, &mut out);
            // Truncation is always detected.
            let cut = cut % packed.len();
            out.clear();
            prop_assert!(codec.decompress(&packed[..cut], &mut out).is_err() || data.is_empty(),
                "{}: truncation to {} of {} decoded", codec.name(), cut, packed.len());
        }
    }
}
