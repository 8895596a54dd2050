//! Generated raw images of known composition: the analyses must give exact
//! counts (zero, sharable, distinct, unique, after sharing, patched, after
//! patching, merges found by each comparison method, dedup chunks), and the
//! characterisation must match an independent byte count.

mod common;

use common::*;
use pagefold_analyze::delta::Encoder;
use pagefold_analyze::read::{read_file, FileFormat, Filter};
use pagefold_analyze::{analyze, Options, Progress, SimilarityConfig, PAGE};

fn composition() -> Composition {
    Composition {
        zero: 300,
        groups: vec![2, 3, 10, 50],
        unique: 200,
        families: vec![1, 4, 9, 20],
        changed_bytes: 5,
    }
}

fn quick() -> Options {
    Options {
        codecs: false,
        dedup: false,
        ..Options::default()
    }
}

#[test]
fn table1_counts_are_exact() {
    let c = composition();
    let data = build(&c, 1);
    let f = TempPath::write("table1.img", &data);
    let image = read_file(&f.0, FileFormat::Auto, &Filter::default()).unwrap();
    assert_eq!(image.pages(), c.pages());
    let r = analyze(&image, &quick(), &Progress::hidden()).unwrap();
    let b = r.breakdown.as_ref().unwrap();
    assert_eq!(b.counts.pages as usize, c.pages());
    assert_eq!(b.counts.zero_pages as usize, c.zero);
    assert_eq!(
        b.counts.sharable_pages as usize,
        c.groups.iter().sum::<usize>()
    );
    assert_eq!(b.counts.sharable_distinct as usize, c.groups.len());
    assert_eq!(b.counts.unique_pages as usize, c.unique_pages());
    assert_eq!(b.counts.after_sharing as usize, c.after_sharing());
    assert_eq!(b.hash_collisions, 0);

    let p = b.patching.as_ref().unwrap();
    assert_eq!(
        p.patched_pages as usize,
        c.variants(),
        "every variant patched against its reference"
    );
    assert_eq!(p.rejected_pages, 0);
    assert_eq!(p.contents as usize, c.unique_pages() + c.groups.len());
    assert!(
        p.avg_patch_bytes > 0.0 && p.avg_patch_bytes < 200.0,
        "avg patch {}",
        p.avg_patch_bytes
    );
    let after = c.after_sharing() - c.variants() + (p.patch_bytes as usize).div_ceil(PAGE);
    assert_eq!(p.after_patching as usize, after);

    // Comparisons: the hash index finds every duplicate, KSM too (no
    // volatile pages), BMD with one class (a raw image) is KSM.
    let cmp = r.comparisons.as_ref().unwrap();
    let merged = (c.pages() - c.after_sharing()) as u64;
    for m in &cmp.methods {
        assert_eq!(m.cost.pages_merged, merged, "{}", m.name);
        assert_eq!(m.cost.pages as usize, c.pages());
    }
    let ksm = &cmp.methods[0];
    let hash = &cmp.methods[1];
    let bmd = &cmp.methods[2];
    assert_eq!(hash.cost.futile_compares, 0);
    assert_eq!(hash.cost.page_compares, merged);
    assert!(ksm.cost.page_compares > hash.cost.page_compares);
    assert_eq!(bmd.cost.page_compares, ksm.cost.page_compares);
    assert_eq!(ksm.cost.page_compares - ksm.cost.futile_compares, merged);
}

#[test]
fn characterization_matches_independent_count() {
    let c = composition();
    let mut data = build(&c, 2);
    // Add structure: a page of small values and powers of two, and runs.
    let mut p = vec![0u8; PAGE];
    for (i, b) in p.iter_mut().enumerate() {
        *b = match i % 16 {
            0..=3 => 0,
            4..=9 => (i % 9) as u8 + 1,
            10 => 64,
            _ => 200,
        };
    }
    data.extend_from_slice(&p);
    let f = TempPath::write("chars.img", &data);
    let image = read_file(&f.0, FileFormat::Raw, &Filter::default()).unwrap();
    let r = analyze(
        &image,
        &Options {
            sharing: false,
            patching: false,
            comparisons: false,
            ..quick()
        },
        &Progress::hidden(),
    )
    .unwrap();
    let ch = r.characterization.unwrap();

    let mut hist = vec![0u64; 256];
    for &b in &data {
        hist[b as usize] += 1;
    }
    assert_eq!(ch.byte_histogram, hist);
    let mut runs = vec![0u64; PAGE + 1];
    let (mut long, mut long_bytes, mut touching) = (0u64, 0u64, 0u64);
    for page in data.chunks(PAGE) {
        let mut i = 0;
        while i < PAGE {
            if page[i] != 0 {
                i += 1;
                continue;
            }
            let s = i;
            while i < PAGE && page[i] == 0 {
                i += 1;
            }
            let len = i - s;
            runs[len] += 1;
            if len > 32 {
                long += 1;
                long_bytes += len as u64;
                touching += (s == 0 || i == PAGE) as u64;
            }
        }
    }
    let expect: Vec<(u32, u64)> = runs
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(l, &n)| (l as u32, n))
        .collect();
    assert_eq!(ch.zero_run_lengths, expect);
    assert_eq!(ch.long_runs, long);
    let total = data.len() as f64;
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(ch.zero_bytes_pct, 100.0 * hist[0] as f64 / total));
    assert!(close(
        ch.zero_bytes_in_long_runs_pct,
        100.0 * long_bytes as f64 / total
    ));
    assert!(close(
        ch.long_runs_touching_page_boundary_pct,
        100.0 * touching as f64 / long as f64
    ));
    let low: u64 = hist[1..=9].iter().sum();
    assert!(close(ch.low_values_1_9_pct, 100.0 * low as f64 / total));
    let pow: u64 = [1, 2, 4, 8, 16, 32, 64, 128].iter().map(|&v| hist[v]).sum();
    assert!(close(ch.powers_of_two_pct, 100.0 * pow as f64 / total));
    let h: f64 = hist
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| {
            let q = n as f64 / total;
            -q * q.log2()
        })
        .sum();
    assert!(close(ch.entropy_bits_per_byte, h));
}

#[test]
fn similarity_detector_needs_one_matching_block() {
    // Reference, a variant with block 0 changed (still found through index
    // 1), a variant with both blocks changed (not found).
    let cfg = SimilarityConfig::default();
    let offs = cfg.offsets();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(9);
    let r = random_page(&mut rng);
    let mut one = r.clone();
    one[offs[0] + 3] ^= 0xff;
    let mut both = one.clone();
    both[offs[1] + 60] ^= 0xff;
    let mut data = Vec::new();
    for p in [&r, &one, &both] {
        data.extend_from_slice(p);
    }
    let f = TempPath::write("sim.img", &data);
    let image = read_file(&f.0, FileFormat::Raw, &Filter::default()).unwrap();
    let r2 = analyze(&image, &quick(), &Progress::hidden()).unwrap();
    let p = r2.breakdown.unwrap().patching.unwrap();
    assert_eq!(p.patched_pages, 1);
    assert_eq!(p.indexed_pages, 2);

    // With k = 1 (only block 0) the block-0 variant is not found: `one`
    // becomes a reference, and `both` (same block 0 as `one`) patches
    // against it.
    let mut o = quick();
    o.similarity.k = 1;
    let p = analyze(&image, &o, &Progress::hidden())
        .unwrap()
        .breakdown
        .unwrap()
        .patching
        .unwrap();
    assert_eq!((p.patched_pages, p.indexed_pages), (1, 2));
    // A cut-off below any patch size rejects `one` (candidate r) and `both`
    // (candidate `one`, through block 0).
    let mut o = quick();
    o.similarity.cutoff = 4;
    let p = analyze(&image, &o, &Progress::hidden())
        .unwrap()
        .breakdown
        .unwrap()
        .patching
        .unwrap();
    assert_eq!((p.patched_pages, p.rejected_pages), (0, 2));
}

#[test]
fn every_patch_encoder_patches_the_variants() {
    let c = Composition {
        unique: 50,
        families: vec![3, 7],
        changed_bytes: 12,
        ..Composition::default()
    };
    let data = build(&c, 3);
    let f = TempPath::write("enc.img", &data);
    let image = read_file(&f.0, FileFormat::Raw, &Filter::default()).unwrap();
    for enc in [Encoder::ZstdRef, Encoder::XorLz4, Encoder::XorZstd] {
        let mut o = quick();
        o.similarity.encoder = enc;
        let p = analyze(&image, &o, &Progress::hidden())
            .unwrap()
            .breakdown
            .unwrap()
            .patching
            .unwrap();
        assert_eq!(p.patched_pages, 10, "{enc}");
    }
}

#[test]
fn candidates_per_bucket_widen_the_search() {
    // Two families whose references share both similarity blocks: with c=1
    // the second reference replaces the first in the buckets; variants of
    // the first family that come later are then compared with the wrong
    // reference (patch too big), with c=2 they find theirs.
    let cfg = SimilarityConfig::default();
    let offs = cfg.offsets();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(11);
    let a = random_page(&mut rng);
    let mut b = random_page(&mut rng);
    for &o in &offs {
        b[o..o + cfg.block].copy_from_slice(&a[o..o + cfg.block]);
    }
    let va = variant(&mut rng, &a, 3);
    let mut data = Vec::new();
    for p in [&a, &b, &va] {
        data.extend_from_slice(p);
    }
    let f = TempPath::write("cands.img", &data);
    let image = read_file(&f.0, FileFormat::Raw, &Filter::default()).unwrap();
    let mut o = quick();
    o.similarity.cutoff = 1024;
    // c=1: b is a's candidate-twin; b is patched against a? b is random
    // apart from the blocks: its patch is large, so b is indexed and
    // replaces a. va then only sees b.
    let p = analyze(&image, &o, &Progress::hidden())
        .unwrap()
        .breakdown
        .unwrap()
        .patching
        .unwrap();
    assert_eq!((p.patched_pages, p.rejected_pages), (0, 2));
    o.similarity.candidates = 2;
    let p = analyze(&image, &o, &Progress::hidden())
        .unwrap()
        .breakdown
        .unwrap()
        .patching
        .unwrap();
    assert_eq!((p.patched_pages, p.rejected_pages), (1, 1));
}

#[test]
fn cli_json_dedup_codecs_and_plots() {
    let c = Composition {
        zero: 40,
        groups: vec![5, 5],
        unique: 30,
        families: vec![4],
        changed_bytes: 3,
    };
    let data = build(&c, 4);
    let f = TempPath::write("cli.img", &data);
    let dir = TempPath::new("plots");
    let v = json(&[
        &f.s(),
        "--plot",
        &dir.s(),
        "--codec-sample",
        "1",
        "--codec-blocks",
        "4,8",
    ]);
    assert_eq!(v["pages"], c.pages() as u64);
    let b = &v["breakdown"];
    assert_eq!(b["zero_pages"], c.zero as u64);
    assert_eq!(b["sharable_pages"], 10);
    assert_eq!(b["sharable_distinct"], 2);
    assert_eq!(b["unique_pages"], c.unique_pages() as u64);
    assert_eq!(b["after_sharing"], c.after_sharing() as u64);
    assert_eq!(b["patching"]["patched_pages"], 4);
    // FSP-4K keeps one chunk per distinct page (zero page included).
    let fsp = v["dedup"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scheme"] == "fsp-4k")
        .unwrap()
        .clone();
    assert_eq!(fsp["chunks"], c.pages() as u64);
    assert_eq!(fsp["unique_chunks"], c.after_sharing() as u64);
    // Every codec at both block sizes.
    let rows = v["compression"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10 * 2, "{rows:?}");
    assert!(rows
        .iter()
        .all(|r| r["ratio"].as_f64().is_some_and(|x| x > 0.0)));
    for name in [
        "savings.png",
        "zero_runs.png",
        "byte_histogram.png",
        "codecs.png",
    ] {
        let png = std::fs::read(dir.0.join(name)).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
    }
    // Text output names the paper's rows.
    let out = run(&[&f.s(), "-q", "--only", "breakdown"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "zero",
        "sharable (2 distinct)",
        "after sharing",
        "patchable (HashSimilarityDetector(2,1), c=1)",
        "after patching",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

#[test]
fn several_images_split_in_process_and_cross_sharing() {
    // A: 10 zero, page X x3, page Y x1, 5 random. B: 4 zero, X x1, Y x2, 7 random.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(5);
    let x = random_page(&mut rng);
    let y = random_page(&mut rng);
    let mut a = Vec::new();
    a.extend(std::iter::repeat_n(0u8, 10 * PAGE));
    for _ in 0..3 {
        a.extend_from_slice(&x);
    }
    a.extend_from_slice(&y);
    for _ in 0..5 {
        a.extend(random_page(&mut rng));
    }
    let mut b = Vec::new();
    b.extend(std::iter::repeat_n(0u8, 4 * PAGE));
    b.extend_from_slice(&x);
    b.extend_from_slice(&y);
    b.extend_from_slice(&y);
    for _ in 0..7 {
        b.extend(random_page(&mut rng));
    }
    let fa = TempPath::write("a.img", &a);
    let fb = TempPath::write("b.img", &b);
    let v = json(&[&fa.s(), &fb.s(), "--only", "sharing"]);
    let per = v["breakdown"]["per_input"].as_array().unwrap();
    // A: zero 10, sharable 3 (X), distinct 1, unique Y + 5 = 6, after 1+6+1 = 8.
    assert_eq!(per[0]["zero_pages"], 10);
    assert_eq!(per[0]["sharable_pages"], 3);
    assert_eq!(per[0]["unique_pages"], 6);
    assert_eq!(per[0]["after_sharing"], 8);
    // B: zero 4, sharable 2 (Y), unique X + 7 = 8, after 1+8+1 = 10.
    assert_eq!(per[1]["sharable_pages"], 2);
    assert_eq!(per[1]["unique_pages"], 8);
    assert_eq!(per[1]["after_sharing"], 10);
    let cross = &v["breakdown"]["cross"];
    assert_eq!(cross["after_in_process"], 18);
    // Across: zero 1 + X + Y + 12 random = 15.
    assert_eq!(cross["after_cross_process"], 15);
    assert_eq!(cross["cross_adds_pages"], 3);
}

#[test]
fn range_filter_selects_pages() {
    let c = Composition {
        zero: 4,
        unique: 4,
        ..Composition::default()
    };
    let data = build(&c, 6);
    let f = TempPath::write("range.img", &data);
    let v = json(&[
        &f.s(),
        "--only",
        "sharing",
        "--range",
        "0x1000-0x3000",
        "--range",
        "16384-20480",
    ]);
    assert_eq!(v["pages"], 3);
}
