//! Live processes the test starts: a forked child holding known memory is
//! read through /proc/PID/{maps,pagemap,mem}; several children together
//! split in-process from cross-process sharing, and their fingerprint
//! samples agree with it; two snapshots classify a child that keeps
//! rewriting some of its pages.

mod common;

use common::*;
use pagefold_analyze::read::live::{self, Stage};
use pagefold_analyze::read::Filter;
use pagefold_analyze::{Error, Progress, PAGE};

#[test]
fn child_memory_counts_are_exact_and_unpopulated_pages_skipped() {
    let c = Composition {
        zero: 25,
        groups: vec![2, 7],
        unique: 30,
        families: vec![2, 6],
        changed_bytes: 6,
    };
    let data = build(&c, 41);
    let child = Child::spawn(&data, 40);
    let v = json(&[
        &child.pid.to_string(),
        "--only",
        "breakdown",
        "--range",
        &child.range(),
    ]);
    assert_eq!(v["inputs"][0]["source"], "pid");
    assert_eq!(
        v["inputs"][0]["unpopulated_pages"], 40,
        "untouched pages are skipped, not read"
    );
    assert_eq!(v["pages"], c.pages() as u64);
    let b = &v["breakdown"];
    assert_eq!(b["zero_pages"], c.zero as u64);
    assert_eq!(b["sharable_pages"], 9);
    assert_eq!(b["sharable_distinct"], 2);
    assert_eq!(b["unique_pages"], c.unique_pages() as u64);
    assert_eq!(b["after_sharing"], c.after_sharing() as u64);
    assert_eq!(b["patching"]["patched_pages"], 8);
}

#[test]
fn whole_child_process_with_every_analysis() {
    let c = Composition {
        zero: 10,
        groups: vec![3],
        unique: 10,
        ..Composition::default()
    };
    let child = Child::spawn(&build(&c, 42), 0);
    let v = json(&[
        &child.pid.to_string(),
        "--codec-sample",
        "0.5",
        "--dedup-sample",
        "4",
    ]);
    assert!(v["pages"].as_u64().unwrap() >= c.pages() as u64);
    for key in [
        "breakdown",
        "characterization",
        "comparisons",
        "compression",
        "dedup",
    ] {
        assert!(v[key].is_object(), "{key} missing");
    }
    // Mapping-kind filters partition the process.
    let all = v["pages"].as_u64().unwrap();
    let mut sum = 0;
    for k in ["anon", "file", "heap", "stack"] {
        let part = json(&[&child.pid.to_string(), "--only", "sharing", "--kind", k]);
        sum += part["pages"].as_u64().unwrap_or(0);
    }
    // [vdso] and other named kernel mappings are kind "other".
    let other = all - sum;
    assert!(other < 16, "kinds cover the process: {sum} of {all}");
}

#[test]
fn several_children_cross_process_sharing() {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(43);
    let shared = random_page(&mut rng);
    let mut a = Vec::new();
    let mut b = Vec::new();
    // A: shared x2, 3 own pages; B: shared x1, 4 own pages, 2 zero pages.
    a.extend_from_slice(&shared);
    a.extend_from_slice(&shared);
    b.extend_from_slice(&shared);
    for _ in 0..3 {
        a.extend(random_page(&mut rng));
    }
    for _ in 0..4 {
        b.extend(random_page(&mut rng));
    }
    b.extend(vec![0u8; 2 * PAGE]);
    let ca = Child::spawn(&a, 0);
    let cb = Child::spawn(&b, 0);
    let v = json(&[
        &ca.pid.to_string(),
        &cb.pid.to_string(),
        "--only",
        "sharing",
        "--range",
        &ca.range(),
        "--range",
        &cb.range(),
    ]);
    // Each child's region has its own address, so each range selects pages
    // of one child only.
    let per = v["breakdown"]["per_input"].as_array().unwrap();
    assert_eq!(per.len(), 2);
    assert_eq!(per[0]["pages"], 5);
    assert_eq!(per[0]["after_sharing"], 4);
    assert_eq!(per[1]["pages"], 7);
    assert_eq!(per[1]["after_sharing"], 6);
    let x = &v["breakdown"]["cross"];
    assert_eq!(x["after_in_process"], 10);
    assert_eq!(x["after_cross_process"], 9);
    assert_eq!(x["cross_adds_pages"], 1);
}

/// With rate 1 every non-zero page is sampled, so the samples of two
/// processes give the exact cross-process count; with rate 8 about one
/// content in eight is sampled, the same contents in both processes.
#[test]
fn fingerprints_of_two_children_sample_the_same_contents() {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(44);
    let common: Vec<Vec<u8>> = (0..400).map(|_| random_page(&mut rng)).collect();
    let mut a: Vec<u8> = common.concat();
    a.extend(common.concat()); // each common page twice in A
    let mut b: Vec<u8> = common.concat();
    for _ in 0..200 {
        a.extend(random_page(&mut rng));
        b.extend(random_page(&mut rng));
    }
    b.extend(vec![0u8; 3 * PAGE]);
    let (ca, cb) = (Child::spawn(&a, 0), Child::spawn(&b, 0));
    let sample = |rate: &str| {
        json(&[
            &ca.pid.to_string(),
            &cb.pid.to_string(),
            "--only",
            "fingerprints",
            "--fingerprints",
            rate,
            "--range",
            &ca.range(),
            "--range",
            &cb.range(),
        ])
    };
    let hashes = |v: &serde_json::Value, i: usize| -> std::collections::HashMap<String, u64> {
        v["fingerprints"]["inputs"][i]["sampled"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e[0].as_str().unwrap().to_string(), e[1].as_u64().unwrap()))
            .collect()
    };
    let all = sample("1");
    assert!(
        all["breakdown"].is_null(),
        "--only fingerprints runs nothing else"
    );
    let (ha, hb) = (hashes(&all, 0), hashes(&all, 1));
    assert_eq!((ha.len(), hb.len()), (600, 600));
    assert_eq!(all["fingerprints"]["inputs"][0]["sampled_pages"], 1000);
    assert_eq!(all["fingerprints"]["inputs"][1]["zero_pages"], 3);
    assert_eq!(ha.keys().filter(|h| hb.contains_key(*h)).count(), 400);
    assert_eq!(ha.values().filter(|&&n| n == 2).count(), 400);
    let some = sample("8");
    let (sa, sb) = (hashes(&some, 0), hashes(&some, 1));
    let common_sampled = sa.keys().filter(|h| sb.contains_key(*h)).count();
    // 400 common contents at one in eight: 50 expected, sd about 6.6.
    assert!((25..=75).contains(&common_sampled), "{common_sampled}");
    for h in sa.keys() {
        assert!(ha.contains_key(h));
        assert_eq!(u64::from_str_radix(h, 16).unwrap() % 8, 0);
    }
}

#[test]
fn two_snapshots_classify_changed_pages() {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(44);
    let mut data = Vec::new();
    for _ in 0..12 {
        data.extend(random_page(&mut rng));
    }
    let dup = random_page(&mut rng);
    for _ in 0..4 {
        data.extend_from_slice(&dup);
    }
    let mut ro = Vec::new();
    for _ in 0..3 {
        ro.extend_from_slice(&dup);
    }
    ro.extend(random_page(&mut rng));
    // The first 5 pages change all the time.
    let child = Child::spawn_full(&data, 0, 5, &ro);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let v = json(&[
        &child.pid.to_string(),
        "--interval",
        "0.3",
        "--only",
        "sharing,comparisons",
        "--range",
        &child.range(),
        "--range",
        &child.ro_range(),
    ]);
    let rows = v["behaviour"].as_array().unwrap();
    let rw = rows.iter().find(|r| r["perms"] == "rw-p").unwrap();
    let r = rows.iter().find(|r| r["perms"] == "r--p").unwrap();
    assert_eq!(
        (rw["changed"].as_u64(), rw["unchanged"].as_u64()),
        (Some(5), Some(11))
    );
    assert_eq!(
        (r["changed"].as_u64(), r["unchanged"].as_u64()),
        (Some(0), Some(4))
    );
    let cmp = &v["comparisons"];
    assert_eq!(cmp["classes_from"], "snapshots");
    assert_eq!(cmp["volatile_pages"], 5);
    let m = |name: &str| {
        cmp["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap()
            .clone()
    };
    // 7 copies of `dup` (4 writable + 3 read-only): 6 merges for the hash
    // index and KSM; BMD keeps the classes apart: 3 + 2 merges.
    assert_eq!(m("hash-index")["pages_merged"], 6);
    assert_eq!(m("ksm")["pages_merged"], 6);
    assert_eq!(m("bmd")["pages_merged"], 5);
    assert!(m("bmd")["page_compares"].as_u64() < m("ksm")["page_compares"].as_u64());
    let classes = cmp["bmd_classes"].as_array().unwrap();
    let names: Vec<&str> = classes
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "changed writable",
            "unchanged read-only",
            "unchanged writable"
        ]
    );
}

#[test]
fn process_exiting_mid_read_is_an_error() {
    let child = Child::spawn(&vec![7u8; 64 * PAGE], 0);
    let pid = child.pid;
    let kill = move |s: Stage| {
        if s == Stage::PagemapRead {
            // SAFETY: kill and waitpid take no pointers (the status pointer is
            // null); `pid` is the child spawned above, reaped here so its
            // memory is surely gone when the reader looks again.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    };
    let e = live::read_pid(
        pid as u32,
        &Filter::default(),
        &Progress::hidden(),
        Some(&kill),
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::ProcessExited(p) if p == pid as u32),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("process {pid} exited while it was being read")
    );
}
