//! One-shot measurements of a helper child before and after it maps memory
//! of a known kind and size.
//!
//! Tolerances: between two measurements the helper only reads one line from
//! stdin and writes one to stdout, so besides the memory a command maps its
//! footprint moves by a few pages of stack, heap and stdio buffers. Growth is
//! allowed 1 MiB of such noise (256 pages, far above the handful seen) and
//! shrinkage 256 KiB; a double-counted or missed region of 16-64 MiB is far
//! outside either. memfd bytes are exact: st_blocks counts exactly the pages
//! written (no shmem huge pages on this kernel's default settings, and the
//! sizes are multiples of 2 MiB anyway).

mod common;

use common::{is_root, Helper, MIB};
use pagefold_measure::{measure_pid, measure_pids, measure_tree, Error, Footprint, Method};

#[test]
fn helper_entry() {
    common::run_helper_if_requested();
}

const SLACK_UP: i64 = MIB as i64;
const SLACK_DOWN: i64 = (MIB / 4) as i64;

fn measure(pid: u32) -> Footprint {
    let fp = measure_pid(pid).expect("measuring the helper");
    assert_eq!(fp.method, Method::Pfn, "these tests need root (PFNs)");
    fp
}

fn delta(after: u64, before: u64) -> i64 {
    after as i64 - before as i64
}

/// `got` is `expected` bytes give or take the documented noise.
fn assert_about(what: &str, got: i64, expected: u64) {
    let expected = expected as i64;
    assert!(
        got >= expected - SLACK_DOWN && got <= expected + SLACK_UP,
        "{what}: grew by {got} bytes ({:.2} MiB), expected {expected} ({:.2} MiB)",
        got as f64 / MIB as f64,
        expected as f64 / MIB as f64,
    );
}

fn distinct_bytes(fp: &Footprint) -> u64 {
    fp.distinct_pages.unwrap() * pagefold_measure::page_size()
}

#[test]
fn anonymous_memory_raises_footprint_by_its_size() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let before = measure(helper.pid());
    assert_eq!(helper.send("anon 64"), "ok");
    let after = measure(helper.pid());
    assert_about(
        "footprint",
        delta(after.footprint_bytes, before.footprint_bytes),
        64 * MIB,
    );
    assert_about(
        "distinct pages",
        delta(distinct_bytes(&after), distinct_bytes(&before)),
        64 * MIB,
    );
    assert_about("rss", delta(after.rss_bytes, before.rss_bytes), 64 * MIB);
    assert_eq!(after.memfd_bytes, before.memfd_bytes);
    helper.finish();
}

#[test]
fn memfd_mapped_twice_counts_once() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let before = measure(helper.pid());
    assert_eq!(helper.send("memfd_shared_twice 32"), "ok");
    let after = measure(helper.pid());
    assert_about(
        "footprint",
        delta(after.footprint_bytes, before.footprint_bytes),
        32 * MIB,
    );
    assert_eq!(after.memfd_bytes - before.memfd_bytes, 32 * MIB);
    // Its pages are counted via the file, not again as mapped frames.
    assert_about(
        "distinct pages",
        delta(distinct_bytes(&after), distinct_bytes(&before)),
        0,
    );
    // RSS counts every mapping: the double counting this crate avoids.
    assert_about("rss", delta(after.rss_bytes, before.rss_bytes), 64 * MIB);
    helper.finish();
}

#[test]
fn written_private_memfd_pages_count_as_anonymous() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let before = measure(helper.pid());
    assert_eq!(helper.send("memfd_private 32 16"), "ok");
    let after = measure(helper.pid());
    // 32 MiB in the memfd, 16 MiB of private copies of written pages; the
    // 16 MiB only read map page-cache pages already in the 32.
    assert_eq!(after.memfd_bytes - before.memfd_bytes, 32 * MIB);
    assert_about(
        "distinct pages",
        delta(distinct_bytes(&after), distinct_bytes(&before)),
        16 * MIB,
    );
    assert_about(
        "footprint",
        delta(after.footprint_bytes, before.footprint_bytes),
        48 * MIB,
    );
    helper.finish();
}

#[test]
fn unmapped_resident_memfd_pages_count_via_blocks() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let before = measure(helper.pid());
    assert_eq!(helper.send("memfd_unmapped 32"), "ok");
    let after = measure(helper.pid());
    assert_eq!(after.memfd_bytes - before.memfd_bytes, 32 * MIB);
    assert_about(
        "footprint",
        delta(after.footprint_bytes, before.footprint_bytes),
        32 * MIB,
    );
    // Invisible to RSS and pagemap: only the open descriptor leads to it.
    assert_about("rss", delta(after.rss_bytes, before.rss_bytes), 0);
    assert_about(
        "distinct pages",
        delta(distinct_bytes(&after), distinct_bytes(&before)),
        0,
    );
    helper.finish();
}

#[test]
fn tree_counts_pages_shared_after_fork_once() {
    if !is_root() {
        return eprintln!("skipped: needs root to read PFNs");
    }
    let mut helper = Helper::spawn();
    let before = measure_tree(helper.pid()).unwrap();
    assert_eq!(before.pids, vec![helper.pid()]);
    let answer = helper.send("fork_shared 32");
    let child: u32 = answer.strip_prefix("ok ").unwrap().parse().unwrap();
    let tree = measure_tree(helper.pid()).unwrap();
    assert_eq!(tree.pids, vec![helper.pid(), child]);
    // The child shares everything with its parent; it only adds the few
    // pages it dirtied after fork (covered by the slack).
    assert_about(
        "tree footprint",
        delta(tree.footprint_bytes, before.footprint_bytes),
        32 * MIB,
    );
    let apart = measure(helper.pid()).footprint_bytes + measure(child).footprint_bytes;
    assert!(
        apart >= tree.footprint_bytes + 32 * MIB,
        "measured apart {apart} should count the shared 32 MiB twice (tree: {})",
        tree.footprint_bytes
    );
    let listed = measure_pids(&[helper.pid(), child]).unwrap();
    assert_about(
        "same set listed",
        delta(listed.footprint_bytes, tree.footprint_bytes),
        0,
    );
    helper.finish();
}

#[test]
fn json_has_the_documented_fields() {
    let helper = Helper::spawn();
    let fp = measure_pid(helper.pid()).unwrap();
    // What `pagefold measure --json` prints.
    let text = pagefold_measure::cli::footprint_json(&fp).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "schema",
        "pids",
        "footprint_bytes",
        "distinct_pages",
        "memfd_bytes",
        "method",
        "rss_bytes",
        "pss_bytes",
        "uss_bytes",
        "swap_bytes",
        "vm_hwm_bytes",
        "ksm",
        "timestamp_ms",
    ] {
        assert!(json.get(key).is_some(), "{key} missing in {json}");
    }
    assert_eq!(json["schema"], "pagefold-measure/1");
    let ksm_file = std::path::Path::new("/proc/self/ksm_stat").exists();
    assert_eq!(fp.ksm.is_some(), ksm_file);
    assert!(fp.vm_hwm_bytes >= fp.rss_bytes / 2 && fp.vm_hwm_bytes > 0);
}

fn unused_pid() -> u32 {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    pid_max + 1 // PIDs stay below pid_max
}

#[test]
fn missing_process_is_no_such_process() {
    let pid = unused_pid();
    assert!(matches!(measure_pid(pid), Err(Error::NoSuchProcess(p)) if p == pid));
    assert!(matches!(measure_tree(pid), Err(Error::NoSuchProcess(p)) if p == pid));
    assert!(matches!(measure_pid(0), Err(Error::NoSuchProcess(0))));
}

#[test]
fn zombie_counts_as_exited() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Not reaped yet: it stays a zombie until wait().
    let is_zombie = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .contains(") Z")
    };
    for _ in 0..1000 {
        if is_zombie() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(is_zombie());
    assert!(matches!(measure_pid(pid), Err(Error::ProcessExited(p)) if p == pid));
    child.wait().unwrap();
    assert!(matches!(measure_pid(pid), Err(Error::NoSuchProcess(p)) if p == pid));
}

#[test]
fn without_root_pss_is_the_labelled_proxy() {
    if !is_root() {
        return eprintln!("skipped: needs root to switch user");
    }
    const NOBODY: u32 = 65534;
    let mut helper = match Helper::spawn_as(Some(NOBODY)) {
        Ok(helper) => helper,
        Err(e) => return eprintln!("skipped: test binary not runnable as nobody: {e}"),
    };
    assert_eq!(helper.send("measure_self"), "method pss-proxy");
    let me = std::process::id();
    assert_eq!(
        helper.send(&format!("measure {me}")),
        format!("error PermissionDenied({me})")
    );
    helper.finish();
}
