//! The swap file against real file systems: a full disk (a small tmpfs
//! mounted for the test, as root; skipped with a message otherwise), real
//! short reads and overwritten slots, O_DIRECT where the file system has
//! it. No page is lost on any error path.

use pagefold_testkit::TmpMount;
use pagefold_tier::kinds::{page, Kind};
use pagefold_tier::swap::{SwapConfig, SwapFile};
use pagefold_tier::{Error, PAGE};

fn full_disk(direct: bool, grow: u32) {
    let Some(m) = TmpMount::new(&format!("tier-full-{direct}-{grow}"), "256k") else {
        return;
    };
    let path = m.path().join("swap");
    let mut cfg = SwapConfig::new(&path);
    cfg.direct = direct;
    cfg.grow_slots = grow;
    let mut s = SwapFile::create(&cfg).unwrap();
    let mut kept = Vec::new();
    let mut err = None;
    for i in 0..1000u64 {
        let p = page(Kind::Random, i);
        match s.swap_out(&p) {
            Ok(slot) => kept.push((slot, p)),
            Err(e) => {
                // The caller still has `p`: nothing was lost.
                err = Some((e, p));
                break;
            }
        }
    }
    let (e, _still_ours) = err.expect("a 256 KiB tmpfs fills up");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(!kept.is_empty() && kept.len() <= 64, "{} pages", kept.len());
    assert_eq!(
        s.stats().slots_used as usize,
        kept.len(),
        "the failed write holds no slot"
    );
    // A batch on the full disk fails whole and holds nothing either.
    let batch: Vec<Vec<u8>> = (0..8u64).map(|i| page(Kind::Heap, i)).collect();
    let refs: Vec<&[u8]> = batch.iter().map(|p| &p[..]).collect();
    assert_eq!(
        s.swap_out_batch(&refs).unwrap_err().raw_os_error(),
        Some(libc::ENOSPC)
    );
    assert_eq!(s.stats().slots_used as usize, kept.len());
    // Everything swapped before the disk filled comes back intact.
    let mut out = vec![0u8; PAGE];
    for (slot, p) in &kept {
        assert_eq!(s.swap_in(*slot, &mut out).unwrap(), PAGE);
        assert_eq!(&out, p);
    }
    // Freeing slots makes room again (within the allocated file).
    let (slot, _) = kept.swap_remove(0);
    s.free(slot).unwrap();
    let p = page(Kind::Text, 1);
    let again = s.swap_out(&p).unwrap();
    assert_eq!(again, slot);
    s.swap_in(again, &mut out).unwrap();
    assert_eq!(out, p);
    drop(s);
    assert!(!path.exists(), "swap file deleted on drop");
}

#[test]
fn full_disk_is_enospc_and_loses_nothing() {
    // Growth by 16 slots: fallocate reports the full disk.
    full_disk(false, 16);
    // Growth by 1 slot.
    full_disk(false, 1);
}

#[test]
fn full_disk_with_o_direct() {
    full_disk(true, 8);
}

#[test]
fn o_direct_round_trip_on_the_temp_dir() {
    let path = std::env::temp_dir().join(format!("pagefold-tier-direct-{}", std::process::id()));
    let mut cfg = SwapConfig::new(&path);
    cfg.direct = true;
    let mut s = SwapFile::create(&cfg).unwrap();
    eprintln!("O_DIRECT honoured: {}", s.is_direct());
    let mut out = vec![0u8; PAGE];
    let objs: Vec<Vec<u8>> = (0..50)
        .map(|i| page(Kind::Text, i)[..(i as usize * 81) % PAGE + 1].to_vec())
        .collect();
    let slots: Vec<_> = objs.iter().map(|o| s.swap_out(o).unwrap()).collect();
    for (o, sl) in objs.iter().zip(&slots) {
        let n = s.swap_in(*sl, &mut out).unwrap();
        assert_eq!(&out[..n], &o[..]);
    }
}

#[test]
fn shrinking_file_system_under_the_swap_is_an_error_not_wrong_data() {
    let path = std::env::temp_dir().join(format!("pagefold-tier-trunc-{}", std::process::id()));
    let mut s = SwapFile::create(&SwapConfig::new(&path)).unwrap();
    let a = s.swap_out(&page(Kind::Text, 1)).unwrap();
    let b = s.swap_out(&page(Kind::Text, 2)).unwrap();
    // Someone truncates the file: a real short read.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(PAGE as u64 + 100).unwrap();
    let mut out = vec![0u8; PAGE];
    assert_eq!(s.swap_in(a, &mut out).unwrap(), PAGE);
    let e = s.swap_in(b, &mut out).unwrap_err();
    assert!(matches!(e, Error::Io(_) | Error::Corrupt(_)), "{e}");
    // The slot is still allocated: the engine keeps track and can report.
    assert_eq!(s.stats().slots_used, 2);
}
