//! Properties of the codecs, patches, store and detector: any page round
//! trips; any reference + page rebuilds exactly with every encoder; corrupt
//! input is an error, never a panic; the store's accounting is exact after
//! any sequence of inserts, removes and compactions.

use pagefold_tier::compress::{CompressConfig, Compressor, ZstdPolicy};
use pagefold_tier::kinds::{page, pair, Kind};
use pagefold_tier::patch::{
    apply, DeltaDecoder, DeltaEncoder, Encoder, Patcher, References, PATCH_CUTOFF,
};
use pagefold_tier::similar::{Detector, SimilarityParams};
use pagefold_tier::store::{Handle, Store, StoreConfig};
use pagefold_tier::PAGE;
use proptest::prelude::*;

/// Pages that exercise the codecs: a base kind, then random edits (runs
/// of a byte, random bytes) at random places.
fn any_page() -> impl Strategy<Value = Vec<u8>> {
    (
        0usize..Kind::ALL.len(),
        any::<u64>(),
        prop::collection::vec(
            (0usize..PAGE, 1usize..300, any::<u8>(), any::<bool>()),
            0..12,
        ),
    )
        .prop_map(|(k, seed, edits)| {
            let mut p = page(Kind::ALL[k], seed);
            for (at, len, b, random) in edits {
                let end = (at + len).min(PAGE);
                for (i, x) in p[at..end].iter_mut().enumerate() {
                    *x = if random {
                        b.wrapping_mul(i as u8 | 1).rotate_left(i as u32)
                    } else {
                        b
                    };
                }
            }
            p
        })
}

fn policies() -> Vec<CompressConfig> {
    [
        ZstdPolicy::Never,
        ZstdPolicy::Numeric,
        ZstdPolicy::Always,
        ZstdPolicy::Only,
    ]
    .into_iter()
    .map(|zstd| CompressConfig {
        zstd,
        ..CompressConfig::default()
    })
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn compression_round_trips(p in any_page()) {
        let mut out = vec![0u8; PAGE];
        for cfg in policies() {
            let mut c = Compressor::new(cfg.clone());
            if let Some(d) = c.compress(&p).map(|d| d.to_vec()) {
                prop_assert!(d.len() <= PAGE - cfg.min_saving);
                c.decompress(&d, &mut out).unwrap();
                prop_assert_eq!(&out, &p);
            }
        }
    }

    #[test]
    fn every_encoder_rebuilds_any_page_from_any_reference(r in any_page(), p in any_page(), similar in any::<bool>()) {
        // Half the cases: p is an edit of r (so patches are small).
        let p = if similar {
            let mut q = r.clone();
            for (i, b) in p.iter().enumerate().step_by(97) { q[i] = *b; }
            q
        } else { p };
        let mut out = vec![0u8; PAGE];
        for enc in Encoder::ALL {
            let mut e = DeltaEncoder::new(enc);
            let patch = e.encode(&p, &r).to_vec();
            let mut d = DeltaDecoder::new();
            d.apply_into(enc, &patch, &r, &mut out).unwrap();
            prop_assert_eq!(&out, &p, "{}", enc);
            if let Some(small) = e.encode_within(&p, &r, 500).map(|x| x.to_vec()) {
                prop_assert!(small.len() <= 500);
                prop_assert_eq!(apply(enc, &small, &r).unwrap(), p.clone());
            }
        }
        let mut pt = Patcher::new();
        if let Some(patch) = pt.make(&p, &r).map(|x| x.to_vec()) {
            prop_assert!(patch.len() <= PATCH_CUTOFF);
            pt.apply(&patch, &r, &mut out).unwrap();
            prop_assert_eq!(&out, &p);
        }
    }

    #[test]
    fn corrupt_patches_and_objects_are_errors_not_panics(
        p in any_page(),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
        junk in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let r = page(Kind::Random, 9);
        let mut out = vec![0u8; PAGE];
        let mut d = DeltaDecoder::new();
        for enc in Encoder::ALL {
            let mut e = DeltaEncoder::new(enc);
            let good = e.encode(&p, &r).to_vec();
            let mut bad = good.clone();
            for (at, x) in &flips {
                if !bad.is_empty() {
                    let i = at % bad.len();
                    bad[i] ^= x | 1;
                }
            }
            let _ = d.apply_into(enc, &bad, &r, &mut out);
            if !good.is_empty() {
                let _ = d.apply_into(enc, &good[..cut % good.len()], &r, &mut out);
            }
            let _ = d.apply_into(enc, &junk, &r, &mut out);
            // Wrong output length is refused.
            prop_assert!(d.apply_into(enc, &good, &r, &mut out[..100]).is_err());
        }
        let mut pt = Patcher::new();
        let _ = pt.apply(&junk, &r, &mut out);
        let mut c = Compressor::default();
        if let Some(good) = c.compress(&p).map(|x| x.to_vec()) {
            let mut bad = good.clone();
            for (at, x) in &flips {
                let i = at % bad.len();
                bad[i] ^= x | 1;
            }
            let _ = c.decompress(&bad, &mut out);
            let _ = c.decompress(&good[..cut % good.len()], &mut out);
        }
        let _ = c.decompress(&junk, &mut out);
    }

    #[test]
    fn store_accounting_is_exact(ops in prop::collection::vec((0u8..10, 1usize..=PAGE, any::<u8>()), 1..400)) {
        let mut s = Store::new(StoreConfig { reserve_bytes: 64 << 20, ..StoreConfig::default() }).unwrap();
        let mut live: Vec<(Handle, usize, u8)> = Vec::new();
        let mut dead: Vec<Handle> = Vec::new();
        for (op, len, b) in ops {
            match op {
                0..=5 => {
                    let h = s.insert(&vec![b; len]).unwrap();
                    live.push((h, len, b));
                }
                6..=8 if !live.is_empty() => {
                    let (h, _, _) = live.swap_remove(len % live.len());
                    s.remove(h).unwrap();
                    dead.push(h);
                }
                _ => {
                    s.compact();
                    if len % 2 == 0 {
                        s.trim();
                    }
                }
            }
            let st = s.stats();
            prop_assert_eq!(s.audit().unwrap(), st);
            prop_assert_eq!(st.objects as usize, live.len());
            prop_assert_eq!(st.payload_bytes, live.iter().map(|x| x.1 as u64).sum::<u64>());
            prop_assert!(st.slot_bytes >= st.payload_bytes && st.slab_bytes >= st.slot_bytes);
            prop_assert_eq!(st.fragmentation_bytes(), st.internal_fragmentation() + st.external_fragmentation());
        }
        for (h, len, b) in &live {
            prop_assert_eq!(s.get(*h).unwrap(), &vec![*b; *len][..]);
        }
        for h in dead {
            prop_assert!(s.get(h).is_err());
            prop_assert!(s.remove(h).is_err());
        }
        for (h, _, _) in live {
            s.remove(h).unwrap();
        }
        let st = s.stats();
        prop_assert_eq!((st.objects, st.payload_bytes, st.slab_bytes, st.slabs), (0, 0, 0, 0));
    }

    #[test]
    fn detector_candidates_are_live_and_inserted_pages_find_themselves(
        ops in prop::collection::vec((any::<bool>(), 0u64..40, 0u64..8), 1..200),
        c in 1usize..4,
    ) {
        let params = SimilarityParams { candidates: c, ..SimilarityParams::default() };
        let mut d = Detector::new(params).unwrap();
        // 8 page contents; ids 0..40 map to them.
        let pages: Vec<Vec<u8>> = (0..8).map(|s| page(Kind::Random, s)).collect();
        let mut model: std::collections::HashMap<u64, u64> = Default::default();
        let mut cands = Vec::new();
        for (insert, id, content) in ops {
            if insert {
                d.insert(id, &pages[content as usize]);
                model.insert(id, content);
                d.candidates(&pages[content as usize], &mut cands);
                prop_assert_eq!(cands.first(), Some(&id), "most recent first");
            } else {
                let was = d.contains(id);
                prop_assert_eq!(d.remove(id), was);
                model.remove(&id);
            }
            for p in &pages {
                d.candidates(p, &mut cands);
                prop_assert!(cands.len() <= 2 * c);
                for id in &cands {
                    prop_assert!(d.contains(*id));
                    prop_assert!(model.contains_key(id), "removed id {} still a candidate", id);
                }
            }
        }
        prop_assert!(d.len() <= model.len());
    }
}

#[test]
fn patches_of_the_generator_kinds_are_small_and_refused_when_unrelated() {
    let mut pt = Patcher::new();
    let mut out = vec![0u8; PAGE];
    for kind in [
        Kind::Identical,
        Kind::Write16,
        Kind::Similar95,
        Kind::Text,
        Kind::Doubles,
        Kind::IntDoubles,
        Kind::Heap,
    ] {
        let (r, p) = pair(kind, 3);
        let patch = pt
            .make(&p, &r)
            .unwrap_or_else(|| panic!("{kind:?} not patched"))
            .to_vec();
        assert!(patch.len() <= PATCH_CUTOFF);
        pt.apply(&patch, &r, &mut out).unwrap();
        assert_eq!(out, p);
    }
    let (r, p) = pair(Kind::Random, 3);
    assert!(pt.make(&p, &r).is_none());
}

#[test]
fn reference_rule_follows_the_patches() {
    // The engine's sequence: patch a page against reference 1 (pin), the
    // reference may not change; the page is rebuilt (unpin), now it may.
    let refs = References::new();
    let mut store = Store::new(StoreConfig {
        reserve_bytes: 16 << 20,
        ..StoreConfig::default()
    })
    .unwrap();
    let mut pt = Patcher::new();
    let (r, p) = pair(Kind::Write16, 1);
    let h = store.insert(pt.make(&p, &r).unwrap()).unwrap();
    refs.pin(1);
    let h2 = store.insert(pt.make(&p, &r).unwrap()).unwrap();
    refs.pin(1);
    assert!(refs.check_change(1).is_err());
    let mut out = vec![0u8; PAGE];
    for h in [h, h2] {
        pt.apply(store.get(h).unwrap(), &r, &mut out).unwrap();
        store.remove(h).unwrap();
        refs.unpin(1).unwrap();
    }
    assert_eq!(out, p);
    assert!(refs.check_change(1).is_ok());
    assert!(refs.unpin(1).is_err());
}

#[test]
fn stores_are_shared_between_threads() {
    // Scanner inserts, fault handler reads and removes: Send + Sync.
    use std::sync::{mpsc, Arc, Mutex};
    let store = Arc::new(Mutex::new(
        Store::new(StoreConfig {
            reserve_bytes: 16 << 20,
            ..StoreConfig::default()
        })
        .unwrap(),
    ));
    let refs = Arc::new(References::new());
    let (tx, rx) = mpsc::channel::<(Handle, Vec<u8>)>();
    let s2 = store.clone();
    let scanner = std::thread::spawn(move || {
        let mut c = Compressor::default();
        for i in 0..500 {
            let p = page(Kind::Text, i);
            let d = c.compress(&p).unwrap().to_vec();
            let h = s2.lock().unwrap().insert(&d).unwrap();
            tx.send((h, p)).unwrap();
        }
    });
    let r2 = refs.clone();
    let handler = std::thread::spawn(move || {
        let mut c = Compressor::default();
        let mut out = vec![0u8; PAGE];
        for (h, p) in rx {
            let mut s = store.lock().unwrap();
            c.decompress(s.get(h).unwrap(), &mut out).unwrap();
            s.remove(h).unwrap();
            assert_eq!(out, p);
            r2.pin(7);
            r2.unpin(7).unwrap();
        }
        store.lock().unwrap().stats()
    });
    scanner.join().unwrap();
    let st = handler.join().unwrap();
    assert_eq!((st.objects, st.slab_bytes), (0, 0));
    assert!(refs.may_change(7));
}

#[test]
fn thread_safety_is_what_the_engine_needs() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    // Shared between the scanner and the fault handler (behind a lock or
    // directly): Send + Sync.
    send::<Store>();
    sync::<Store>();
    sync::<References>();
    send::<Detector>();
    sync::<Detector>();
    send::<pagefold_tier::swap::SwapFile>();
    send::<pagefold_tier::swap::Watermarks>();
    // One per thread: Send.
    send::<Compressor>();
    send::<Patcher>();
    send::<DeltaEncoder>();
    send::<DeltaDecoder>();
}
