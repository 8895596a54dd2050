//! The sharing limit of a helper child before and after it maps memory
//! whose pages repeat one content, hold zeros, or are all different.
//!
//! Tolerances as in footprint.rs: between two readings the helper's own
//! stack, heap and stdio buffers move by a handful of pages, so growth is
//! allowed 1 MiB of noise and shrinkage 256 KiB, far from the 16 MiB each
//! command maps.

mod common;

use common::{is_root, Helper, MIB};
use pagefold_measure::{measure, Footprint, Method, SharingLimit};

#[test]
fn helper_entry() {
    common::run_helper_if_requested();
}

const SLACK_UP: i64 = MIB as i64;
const SLACK_DOWN: i64 = (MIB / 4) as i64;
const PAGES_16M: i64 = (16 * MIB / 4096) as i64;

fn read(helper: &Helper) -> (Footprint, SharingLimit) {
    let fp = measure(helper.pid(), false, true).expect("measuring the helper");
    assert_eq!(fp.method, Method::Pfn, "these tests need root (PFNs)");
    let limit = fp.sharing_limit.clone().expect("a limit with PFNs");
    assert!(limit.limit_bytes <= fp.footprint_bytes);
    (fp, limit)
}

fn about(what: &str, got: i64, expected: i64, unit: i64) {
    assert!(
        got >= expected - SLACK_DOWN / unit && got <= expected + SLACK_UP / unit,
        "{what}: moved by {got}, expected {expected}"
    );
}

fn grew(a: u64, b: u64) -> i64 {
    b as i64 - a as i64
}

#[test]
fn repeated_contents_and_zeros_leave_the_limit_where_it_was() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let (fp0, l0) = read(&helper);

    assert_eq!(helper.send("same_content 16"), "ok");
    let (fp1, l1) = read(&helper);
    about(
        "footprint",
        grew(fp0.footprint_bytes, fp1.footprint_bytes),
        (16 * MIB) as i64,
        1,
    );
    about(
        "anonymous frames",
        grew(l0.anon_frames, l1.anon_frames),
        PAGES_16M,
        4096,
    );
    about("limit", grew(l0.limit_bytes, l1.limit_bytes), 0, 1);

    assert_eq!(helper.send("written_zero 16"), "ok");
    let (fp2, l2) = read(&helper);
    about(
        "footprint",
        grew(fp1.footprint_bytes, fp2.footprint_bytes),
        (16 * MIB) as i64,
        1,
    );
    about(
        "zero frames",
        grew(l1.zero_frames, l2.zero_frames),
        PAGES_16M,
        4096,
    );
    about("limit", grew(l1.limit_bytes, l2.limit_bytes), 0, 1);

    assert_eq!(helper.send("anon 16"), "ok");
    let (fp3, l3) = read(&helper);
    about(
        "footprint",
        grew(fp2.footprint_bytes, fp3.footprint_bytes),
        (16 * MIB) as i64,
        1,
    );
    about(
        "limit",
        grew(l2.limit_bytes, l3.limit_bytes),
        (16 * MIB) as i64,
        1,
    );
    about(
        "contents",
        grew(l2.distinct_contents, l3.distinct_contents),
        PAGES_16M,
        4096,
    );
    helper.finish();
}
