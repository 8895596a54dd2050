//! `pagefold doctor` and what `pagefold run` gets without root, through the
//! built binaries:
//!
//! - the doctor's report (table and `--json`) names every check;
//! - each kernel feature and permission the engine can miss, forced with its
//!   `PAGEFOLD_INJECT_*` variable: the doctor marks it missing and names what
//!   it takes away, `pagefold run` prints its one-line warning when a
//!   default mechanism goes, and the program prints plain's bytes;
//! - a real unprivileged user (created if missing; the test drops root for
//!   its commands): without access to /dev/userfaultfd it gets plain's
//!   output, virtual copies and the warning; with the device open to its
//!   group it gets zero folding and merging too. /dev/userfaultfd's owner
//!   and mode and `vm.unprivileged_userfaultfd` are put back afterwards,
//!   also when the test fails.
//!
//! The unprivileged test needs root to set the scene; as another user it
//! says so and checks nothing.

#[allow(dead_code)]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The user the unprivileged test runs its commands as.
const USER: &str = "pagefold-test";
const DEVICE: &str = "/dev/userfaultfd";
const SYSCTL: &str = "/proc/sys/vm/unprivileged_userfaultfd";

fn json(text: &[u8]) -> Value {
    serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(text)))
}

fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {doc:#}"))
}

fn works(doc: &Value, mechanism: &str) -> bool {
    doc["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == mechanism)
        .unwrap_or_else(|| panic!("no mechanism {mechanism}: {doc:#}"))["works"]
        .as_bool()
        .unwrap()
}

fn doctor_json(cmd: &mut Command) -> Value {
    let out = cmd.args(["doctor", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out.stdout)
}

/// A small run of the synthetic `mixed` workload (copies, zero pages,
/// duplicates): `hold` seconds is long enough for background scans.
fn workload(bin_dir: &Path, hold: &str) -> Vec<String> {
    let synth = bin_dir.join("pagefold-synth");
    [
        synth.to_str().unwrap(),
        "--quick",
        "--scale",
        "0.25",
        "--hold",
        hold,
        "mixed",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn the_doctor_names_every_check_and_its_json_has_a_schema() {
    let bin = common::pagefold();
    let doc = doctor_json(&mut Command::new(&bin));
    assert_eq!(doc["schema"], "pagefold-doctor/1");
    for name in [
        "kernel",
        "userfaultfd system call",
        "/dev/userfaultfd",
        "userfaultfd, user-mode faults only",
        "userfaultfd WP (anonymous and shmem)",
        "userfaultfd WP_UNPOPULATED",
        "userfaultfd MISSING (shmem)",
        "userfaultfd POISON",
        "userfaultfd MOVE",
        "memfd",
        "pagemap PFNs",
        "transparent huge pages",
        "kernel KSM",
        "memory limit",
        "vm.max_map_count",
    ] {
        let c = check(&doc, name);
        assert!(c["state"].as_str().is_some_and(|s| !s.is_empty()), "{c}");
        if c["ok"] == false && !c["lost"].as_array().unwrap().is_empty() {
            assert!(c["fix"].is_string(), "a missing piece without a fix: {c}");
        }
    }
    let table = Command::new(&bin).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success());
    assert!(
        text.contains("userfaultfd WP_UNPOPULATED") && text.contains("works here:"),
        "{text}"
    );
}

/// KSM delegation is opt-in: `pagefold run --ksm` hands the program
/// `PAGEFOLD_KSM=1`, and the doctor reports the choice.
#[test]
fn run_ksm_opts_the_program_into_ksm_delegation() {
    let bin = common::pagefold();
    let out = Command::new(&bin)
        .args(["run", "--ksm", "--", "/usr/bin/env"])
        .env_remove("PAGEFOLD_KSM")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(env.lines().any(|l| l == "PAGEFOLD_KSM=1"), "{env}");
    let off = doctor_json(Command::new(&bin).env_remove("PAGEFOLD_KSM"));
    assert!(check(&off, "kernel KSM")["state"]
        .as_str()
        .unwrap()
        .contains("delegation off"));
    let on = doctor_json(Command::new(&bin).env("PAGEFOLD_KSM", "1"));
    assert!(check(&on, "kernel KSM")["state"]
        .as_str()
        .unwrap()
        .contains("delegation on"));
}

/// Makes the command's process refuse the userfaultfd system call with
/// EPERM, whatever its flags, as a sandbox's seccomp filter does.
fn deny_userfaultfd(cmd: &mut Command) -> &mut Command {
    let filter = [
        // The system call's number (`struct seccomp_data` starts with it).
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_userfaultfd as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    // SAFETY: the closure runs in the child between fork and exec and makes
    // only the two prctl calls, which allocate nothing; `filter` is moved
    // into it and lives as long as the calls read it.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut _,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const _,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Under a sandbox's filter that refuses the system call, the device, which
/// root may open, is not used to go around it: the doctor says so, and
/// `pagefold run` warns and keeps plain's bytes with copies only.
#[test]
fn a_sandbox_refusing_userfaultfd_is_not_gone_around() {
    let bin = common::pagefold();
    let doc = doctor_json(deny_userfaultfd(&mut Command::new(&bin)));
    let c = check(&doc, "userfaultfd system call");
    assert_eq!(c["ok"], false, "{c}");
    assert!(c["state"].as_str().unwrap().contains("sandbox"), "{c}");
    assert!(c["fix"].as_str().unwrap().contains("seccomp"), "{c}");
    assert_eq!(
        check(&doc, "userfaultfd, user-mode faults only")["ok"],
        false
    );
    assert!(!works(&doc, "zero folding"), "{doc:#}");

    let argv = workload(bin.parent().unwrap(), "0");
    let plain = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    let dir = common::scratch("doctor-seccomp");
    let report = dir.join("report.json");
    let out = deny_userfaultfd(&mut Command::new(&bin))
        .args(["run", "--json", "--report", report.to_str().unwrap(), "--"])
        .args(&argv)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(out.stdout == plain.stdout, "output differs from plain's");
    assert!(stderr.contains("running without zero folding"), "{stderr}");
    let doc = json(&std::fs::read(&report).unwrap());
    let engine = &doc["runs"][0]["engine_total"];
    assert!(
        engine["pages_shared_by_copy"].as_u64().unwrap() > 0,
        "{engine:#}"
    );
    assert_eq!(
        (engine["zero_folded"].as_u64(), engine["merged"].as_u64()),
        (Some(0), Some(0))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A forced refusal: its variables, the check it fails, a mechanism it
/// takes away, and whether `pagefold run` warns of it.
struct Forced {
    vars: &'static [(&'static str, &'static str)],
    failed: &'static str,
    lost: &'static str,
    warns: bool,
}

const fn forced(
    vars: &'static [(&'static str, &'static str)],
    failed: &'static str,
    lost: &'static str,
    warns: bool,
) -> Forced {
    Forced {
        vars,
        failed,
        lost,
        warns,
    }
}

const FORCED: [Forced; 8] = [
    forced(
        &[
            ("PAGEFOLD_INJECT_FAIL_UFFD_SYSCALL", "1"),
            ("PAGEFOLD_INJECT_FAIL_UFFD_DEVICE", "1"),
        ],
        "/dev/userfaultfd",
        "zero folding",
        true,
    ),
    forced(
        &[("PAGEFOLD_INJECT_FAIL_UFFD_WP", "1")],
        "userfaultfd WP (anonymous and shmem)",
        "merging",
        true,
    ),
    forced(
        &[("PAGEFOLD_INJECT_FAIL_UFFD_WP_UNPOPULATED", "1")],
        "userfaultfd WP_UNPOPULATED",
        "zero folding",
        true,
    ),
    forced(
        &[
            ("PAGEFOLD_INJECT_FAIL_UFFD_MISSING", "1"),
            ("PAGEFOLD_TIER", "1"),
        ],
        "userfaultfd MISSING (shmem)",
        "eviction and tiering",
        true,
    ),
    forced(
        &[("PAGEFOLD_INJECT_FAIL_UFFD_POISON", "1")],
        "userfaultfd POISON",
        "poisoned pages for lost stored copies",
        false,
    ),
    forced(
        &[("PAGEFOLD_INJECT_FAIL_UFFD_MOVE", "1")],
        "userfaultfd MOVE",
        "pin guard",
        true,
    ),
    forced(
        &[("PAGEFOLD_INJECT_FAIL_MEMFD", "1")],
        "memfd",
        "virtual copies",
        true,
    ),
    forced(
        &[("PAGEFOLD_INJECT_HIDE_PFNS", "1")],
        "pagemap PFNs",
        "page colouring",
        false,
    ),
];

#[test]
fn each_forced_refusal_is_explained_and_the_program_prints_plains_bytes() {
    let bin = common::pagefold();
    let dir = bin.parent().unwrap();
    let argv = workload(dir, "0");
    let plain = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert!(plain.status.success());
    let clean = doctor_json(&mut Command::new(&bin));
    for Forced {
        vars,
        failed,
        lost,
        warns,
    } in FORCED
    {
        let with = |cmd: &mut Command| {
            for (k, v) in vars {
                cmd.env(k, v);
            }
        };
        let mut cmd = Command::new(&bin);
        with(&mut cmd);
        let doc = doctor_json(&mut cmd);
        let c = check(&doc, failed);
        assert_eq!(c["ok"], false, "{vars:?}: {c}");
        assert!(
            c["lost"].as_array().unwrap().iter().any(|l| l == lost),
            "{vars:?}: {c}"
        );
        assert!(c["fix"].is_string(), "{vars:?}: {c}");
        assert!(!works(&doc, lost), "{vars:?}: {lost} still works");
        assert!(
            works(&clean, lost) || lost == "page colouring",
            "{lost} is missing here anyway"
        );

        let mut cmd = Command::new(&bin);
        with(&mut cmd);
        let out = cmd.args(["run", "--"]).args(&argv).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{vars:?}: {stderr}");
        assert!(
            out.stdout == plain.stdout,
            "{vars:?}: output differs from plain's"
        );
        let warning = stderr
            .lines()
            .find(|l| l.starts_with("pagefold run: running without"));
        assert_eq!(warning.is_some(), warns, "{vars:?}: {stderr}");
        if let Some(w) = warning {
            assert!(
                w.contains(lost) && w.contains(failed) && w.contains("pagefold doctor"),
                "{w}"
            );
        }
    }
}

/// Puts a file's owner, group and mode back when dropped.
struct Restore {
    path: &'static str,
    uid: u32,
    gid: u32,
    mode: u32,
}

impl Restore {
    fn new(path: &'static str) -> Restore {
        let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        Restore {
            path,
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::os::unix::fs::chown(self.path, Some(self.uid), Some(self.gid));
        let _ = std::fs::set_permissions(self.path, std::fs::Permissions::from_mode(self.mode));
    }
}

/// Sets a sysctl for the test and puts the old value back when dropped.
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Sysctl {
        let old = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let guard = Sysctl { path, old };
        std::fs::write(path, value).unwrap_or_else(|e| panic!("{path}: {e}"));
        guard
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.old.trim());
    }
}

/// The test user's uid and gid; the user is created (a system user with a
/// group of its own) if missing.
fn test_user() -> (u32, u32) {
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, USER]).output().unwrap();
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u32>()
                .unwrap()
        })
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .status()
            .expect("useradd (Debian's passwd package)");
        assert!(made.success(), "useradd {USER} failed");
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// The three binaries copied into a directory everyone may read, so the
/// test user can run them wherever the checkout lies; and a directory of
/// the user's own for its files.
fn staged(uid: u32, gid: u32) -> (PathBuf, PathBuf) {
    let bin = common::pagefold();
    let base = common::scratch("doctor-unprivileged");
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bins = base.join("bin");
    std::fs::create_dir(&bins).unwrap();
    for name in ["pagefold", "libpagefold_preload.so", "pagefold-synth"] {
        std::fs::copy(bin.parent().unwrap().join(name), bins.join(name)).unwrap();
    }
    std::fs::set_permissions(&bins, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = base.join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).unwrap();
    (bins, home)
}

/// `pagefold ARGS` as the test user (no supplementary groups, no capabilities).
fn as_user(bins: &Path, home: &Path, uid: u32, gid: u32, args: &[&str]) -> Output {
    Command::new(bins.join("pagefold"))
        .args(args)
        .uid(uid)
        .gid(gid)
        .env("HOME", home)
        .env("TMPDIR", home)
        .current_dir(home)
        .output()
        .unwrap()
}

/// What the user's `pagefold run --compare` gave: its stderr and the
/// pagefold run's engine totals; fails unless outputs matched plain's.
/// The workload's memset zeros are written (`PAGEFOLD_SPARSE_ZERO=0`), so
/// that scans have zero pages to fold: sparse zeroing would leave them
/// untouched, and folding is what the device enables. The engine takes
/// every allocation (`PAGEFOLD_PLAIN_BELOW=0`): at this scale the workload's
/// tables share a size with its array passed by value, whose copies die
/// young, and such a size is left to glibc, where no scan folds anything.
fn compared_run(bins: &Path, home: &Path, uid: u32, gid: u32, argv: &[String]) -> (String, Value) {
    let report = home.join("report.json");
    let mut args = vec![
        "run",
        "--compare",
        "--json",
        "--report",
        report.to_str().unwrap(),
        "--",
        "env",
        "PAGEFOLD_SPARSE_ZERO=0",
        "PAGEFOLD_PLAIN_BELOW=0",
    ];
    args.extend(argv.iter().map(String::as_str));
    let out = as_user(bins, home, uid, gid, &args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{} as {USER}: {stderr}", out.status);
    let doc = json(&std::fs::read(&report).unwrap());
    assert_eq!(doc["outputs_identical"], true, "{doc:#}");
    let runs = doc["runs"].as_array().unwrap();
    let names: Vec<_> = runs.iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(names, ["plain", "pagefold"], "no KSM run without root");
    (stderr, runs[1]["engine_total"].clone())
}

#[test]
fn an_unprivileged_user_gets_copies_without_the_device_and_everything_with_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: setting up the unprivileged user needs root (CI runs as root)");
        return;
    }
    let (uid, gid) = test_user();
    let (bins, home) = staged(uid, gid);
    let argv = workload(&bins, "2");
    let device = Restore::new(DEVICE);
    // The kernel's default: the system call handles kernel faults for privileged users only.
    let sysctl = Sysctl::set(SYSCTL, "0");
    std::os::unix::fs::chown(DEVICE, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(DEVICE, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Without the device: copies only, and the warning.
    let doc = json(&as_user(&bins, &home, uid, gid, &["doctor", "--json"]).stdout);
    assert_eq!(
        check(&doc, "userfaultfd system call")["ok"],
        false,
        "{doc:#}"
    );
    assert_eq!(check(&doc, "/dev/userfaultfd")["ok"], false, "{doc:#}");
    assert!(
        works(&doc, "virtual copies") && !works(&doc, "zero folding"),
        "{doc:#}"
    );
    let (stderr, engine) = compared_run(&bins, &home, uid, gid, &argv);
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("pagefold run: running without"));
    let warning = warning.unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        warning.contains("zero folding") && warning.contains("pagefold doctor"),
        "{warning}"
    );
    assert!(
        engine["pages_shared_by_copy"].as_u64().unwrap() > 0,
        "{engine:#}"
    );
    assert_eq!(
        (engine["zero_folded"].as_u64(), engine["merged"].as_u64()),
        (Some(0), Some(0))
    );
    eprintln!("without /dev/userfaultfd: {}", summary(&engine));

    // The device open to the user's group: zero folding and merging too.
    std::os::unix::fs::chown(DEVICE, Some(0), Some(gid)).unwrap();
    std::fs::set_permissions(DEVICE, std::fs::Permissions::from_mode(0o660)).unwrap();
    let doc = json(&as_user(&bins, &home, uid, gid, &["doctor", "--json"]).stdout);
    assert_eq!(check(&doc, "/dev/userfaultfd")["ok"], true, "{doc:#}");
    assert!(
        works(&doc, "zero folding") && works(&doc, "merging"),
        "{doc:#}"
    );
    let (stderr, engine) = compared_run(&bins, &home, uid, gid, &argv);
    assert!(!stderr.contains("running without"), "{stderr}");
    assert!(
        engine["pages_shared_by_copy"].as_u64().unwrap() > 0,
        "{engine:#}"
    );
    assert!(engine["zero_folded"].as_u64().unwrap() > 0, "{engine:#}");
    assert!(engine["merged"].as_u64().unwrap() > 0, "{engine:#}");
    eprintln!("with /dev/userfaultfd: {}", summary(&engine));

    let original = (device.uid, device.gid, device.mode);
    drop((sysctl, device));
    let m = std::fs::metadata(DEVICE).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        original,
        "{DEVICE} not put back"
    );
    std::fs::remove_dir_all(home.parent().unwrap()).unwrap();
}

fn summary(engine: &Value) -> String {
    format!(
        "{} pages shared by copy, {} zero pages folded, {} merged",
        engine["pages_shared_by_copy"], engine["zero_folded"], engine["merged"]
    )
}
