//! Throughput of the sharing + zero + similarity breakdown (Table 1 with
//! patching) on an in-memory image of known composition, repeated to show
//! the spread. Not a timed test: run it on a quiet machine.
//!
//!     cargo run --release -p pagefold-analyze --example throughput -- [GIB] [RUNS] [ENCODER]
//!
//! The image: 30% zero pages, 10% copies of 1,000 pages, 20% variants of
//! 5,000 reference pages (8 bytes changed), 40% unique pages (1 KiB random,
//! 3 KiB of small values).

use std::time::Instant;

use pagefold_analyze::delta::Encoder;
use pagefold_analyze::image::{Image, InputInfo};
use pagefold_analyze::{analyze, cpu_seconds, Options, Progress, PAGE};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

fn build(gib: f64) -> Vec<u8> {
    let pages = (gib * (1u64 << 30) as f64) as usize / PAGE;
    let mut rng = Rng(0x1234_5678);
    let mut refs = vec![0u8; 5000 * PAGE];
    rng.fill(&mut refs);
    let mut dups = vec![0u8; 1000 * PAGE];
    rng.fill(&mut dups);
    let mut data = vec![0u8; pages * PAGE];
    for page in data.chunks_mut(PAGE) {
        let r = rng.next() % 100;
        if r < 30 {
            continue; // zero
        } else if r < 40 {
            let i = (rng.next() % 1000) as usize;
            page.copy_from_slice(&dups[i * PAGE..(i + 1) * PAGE]);
        } else if r < 60 {
            let i = (rng.next() % 5000) as usize;
            page.copy_from_slice(&refs[i * PAGE..(i + 1) * PAGE]);
            for _ in 0..8 {
                let at = (rng.next() % PAGE as u64) as usize;
                page[at] = rng.next() as u8;
            }
        } else {
            rng.fill(&mut page[..1024]);
            for b in &mut page[1024..] {
                *b = (rng.next() % 10) as u8;
            }
        }
    }
    data
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let gib: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let encoder = args
        .get(3)
        .and_then(|s| Encoder::parse(s))
        .unwrap_or_default();
    let t = Instant::now();
    let data = build(gib);
    let pages = data.len() / PAGE;
    eprintln!(
        "built {gib} GiB ({pages} pages) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut image = Image::in_memory(data);
    image.inputs.push(InputInfo {
        name: "generated".into(),
        source: "image",
        pages,
        mappings: 1,
        unpopulated_pages: 0,
        vanished_pages: 0,
        partial_bytes: 0,
        read_seconds: 0.0,
        snapshot: None,
    });
    let mut opts = Options {
        characterize: false,
        comparisons: false,
        codecs: false,
        dedup: false,
        ..Options::default()
    };
    opts.similarity.encoder = encoder;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "encoder {encoder}, {} threads, load average before: {}",
        rayon::current_num_threads(),
        load.trim()
    );
    let mut walls = Vec::new();
    for run in 0..runs {
        let c0 = cpu_seconds();
        let r = analyze(&image, &opts, &Progress::hidden()).expect("analysis");
        let cpu = cpu_seconds() - c0;
        let b = r.breakdown.expect("breakdown");
        let p = b.patching.as_ref().expect("patching");
        println!(
            "run {run}: {:.3} s wall, {:.2} GB/s, {:.3} s CPU ({:.2} GB per CPU-second); after sharing {}, patched {}, after patching {}",
            b.seconds,
            b.gb_per_s,
            cpu,
            image.bytes() as f64 / cpu / 1e9,
            b.counts.after_sharing,
            p.patched_pages,
            p.after_patching
        );
        walls.push(b.seconds);
    }
    walls.sort_by(f64::total_cmp);
    let gb = image.bytes() as f64 / 1e9;
    println!(
        "best {:.2} GB/s, median {:.2} GB/s over {runs} runs",
        gb / walls[0],
        gb / walls[walls.len() / 2]
    );
}
