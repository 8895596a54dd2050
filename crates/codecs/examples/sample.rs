//! Sanity check of every codec and chunking scheme on a synthetic 16 MiB
//! "memory image": pages of text, pages of f64 arrays and zero pages, shuffled
//! at page granularity, with some pages repeated.
//!
//! `cargo run -p pagefold-codecs --release --example sample [MiB]`

use pagefold_codecs::{all_codecs, dedup, measure, Chunking};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map_or(16, |a| a.parse().expect("MiB"));
    let pages = mib * 256;
    let mut r = rand::rngs::StdRng::seed_from_u64(42);
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
        "block",
        "hash",
        "process",
        "virtual",
    ];
    let mut image: Vec<Vec<u8>> = Vec::with_capacity(pages);
    for i in 0..pages {
        let page = match i % 8 {
            // 3/8 text
            0..=2 => {
                let mut p = Vec::with_capacity(4200);
                while p.len() < 4096 {
                    p.extend_from_slice(WORDS[r.gen_range(0..WORDS.len())].as_bytes());
                    p.push(if r.gen_ratio(1, 12) { b'\n' } else { b' ' });
                }
                p.truncate(4096);
                p
            }
            // 3/8 f64 arrays (a smooth signal, plus noise on some pages)
            3..=5 => {
                let (a, f) = (r.gen_range(-100.0..100.0), r.gen_range(0.001..0.1));
                let noisy = r.gen_bool(0.5);
                (0..512)
                    .flat_map(|j| {
                        let x: f64 = a
                            + (j as f64 * f).sin()
                            + if noisy { r.gen_range(0.0..1e-3) } else { 0.0 };
                        x.to_le_bytes()
                    })
                    .collect()
            }
            // 1/4 zero pages
            _ => vec![0u8; 4096],
        };
        image.push(page);
    }
    // Repeat 10% of the pages elsewhere (shared libraries, copied buffers).
    for _ in 0..pages / 10 {
        let (a, b) = (r.gen_range(0..pages), r.gen_range(0..pages));
        image[b] = image[a].clone();
    }
    image.shuffle(&mut r);
    let data: Vec<u8> = image.concat();
    println!(
        "input: {} MiB (3/8 text, 3/8 f64, 1/4 zero pages, 10% pages copied)\n",
        mib
    );

    println!(
        "{:<11} {:>6} {:>8} {:>14} {:>14} {:>10} {:>10}",
        "codec", "block", "ratio", "comp ns/page", "dec ns/page", "comp MB/s", "dec MB/s"
    );
    for block in [4096usize, 8192, 65536] {
        for codec in all_codecs() {
            let m = measure(codec.as_ref(), &data, block);
            println!(
                "{:<11} {:>6} {:>8.4} {:>14.0} {:>14.0} {:>10.1} {:>10.1}",
                m.codec,
                m.block,
                m.ratio(),
                m.compress_ns_per_page(),
                m.decompress_ns_per_page(),
                m.input_bytes as f64 / m.compress_ns as f64 * 1e3,
                m.input_bytes as f64 / m.decompress_ns as f64 * 1e3,
            );
        }
        println!();
    }

    println!(
        "{:<9} {:>8} {:>8} {:>8} {:>15} {:>15}",
        "scheme", "chunks", "unique", "ratio", "dedup ns/page", "restore ns/page"
    );
    for s in [
        Chunking::Fixed(4096),
        Chunking::Fixed(8192),
        Chunking::Fixed(32768),
        Chunking::cdc(4096),
        Chunking::cdc(8192),
        Chunking::SlidingBlock(4096),
    ] {
        let d = dedup(&data, &s);
        println!(
            "{:<9} {:>8} {:>8} {:>8.4} {:>15.0} {:>15.0}",
            d.scheme,
            d.chunks,
            d.unique_chunks,
            d.ratio(),
            d.dedup_ns_per_page(),
            d.restore_ns_per_page()
        );
    }
}
